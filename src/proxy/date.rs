//! The `date` header value of answers, formatted at most once per second per thread.
//!
//! Invariant: the value is the IMF-fixdate of the current wall-clock second, as hyper writes it.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
const LEN: usize = 29;

struct Cached {
    second: u64,
    text: [u8; LEN],
}

thread_local! {
    static CACHED: RefCell<Cached> = const {
        RefCell::new(Cached { second: u64::MAX, text: [0; LEN] })
    };
}

/// Calls `f` with the current `date` value.
pub fn with_now<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.second != second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == LEN {
                c.text.copy_from_slice(text.as_bytes());
                c.second = second;
            }
        }
        f(&c.text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_an_imf_fixdate_of_now() {
        let text = with_now(|d| String::from_utf8(d.to_vec()).unwrap());
        let parsed = httpdate::parse_http_date(&text).unwrap();
        let skew = SystemTime::now().duration_since(parsed).unwrap_or_default();
        assert!(skew.as_secs() <= 2, "{text}");
        assert!(text.ends_with(" GMT"));
    }
}
