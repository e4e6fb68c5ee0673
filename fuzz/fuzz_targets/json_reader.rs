//! The validating JSON reader (`kvgate::proxy::json::Reader`) accepts exactly what serde_json
//! accepts when it skips a value (RFC 8259), and reads a string as serde_json does.
#![no_main]

use kvgate::proxy::json::Reader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let mut r = Reader::new(text);
    let ours = r.skip_value().and_then(|()| r.finish());
    let theirs = serde_json::from_str::<serde::de::IgnoredAny>(text);
    assert_eq!(
        ours.is_ok(),
        theirs.is_ok(),
        "{text:?}: {ours:?} vs {theirs:?}"
    );
    // The raw text of a value is that value's exact bytes.
    let mut r = Reader::new(text);
    if let Ok(raw) = r.raw() {
        let mut again = Reader::new(raw);
        assert!(
            again.skip_value().and_then(|()| again.finish()).is_ok(),
            "{raw:?}"
        );
    }
    // A string read (escapes decoded, surrogates paired) is serde_json's string.
    let mut r = Reader::new(text);
    let ours = r.string().map(|s| s.into_owned());
    let whole = r.at_end();
    match serde_json::from_str::<String>(text) {
        Ok(theirs) => assert_eq!(ours, Ok(theirs), "{text:?}"),
        Err(e) => assert!(ours.is_err() || !whole, "{text:?}: serde_json says {e}"),
    }
});
