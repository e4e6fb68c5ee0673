//! A validating JSON reader that pulls a few fields out of a request body without building a
//! document: strings are borrowed from the body, everything not read is skipped.
//!
//! Invariants:
//! - Input is a `&str`, so the body's UTF-8 is validated once, up front, and every string slice
//!   handed out starts and ends at an ASCII delimiter (a char boundary).
//! - Accepts exactly RFC 8259 JSON. A skipped value is validated as strictly as a read one
//!   (number grammar, escapes, no raw control characters in strings), with one exception kept
//!   from serde_json: an unpaired `\uD800`-style surrogate is an error only in a string that is
//!   read, since a skipped one never becomes a Rust string.
//! - A string without escapes is borrowed; only a string with escapes allocates.
//! - Nesting deeper than [`MAX_DEPTH`] is an error, so the recursion in [`Reader::skip_value`]
//!   is bounded.
//! - Errors carry the byte offset where reading stopped.

mod special;

use std::borrow::Cow;

/// Deepest nesting of arrays and objects accepted (serde_json's limit).
pub const MAX_DEPTH: u32 = 128;

/// Eight-byte words of a string scanned before switching to a vector search.
const SHORT_WORDS: usize = 4;

/// Malformed JSON, with the byte offset where it was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at}")]
pub struct SyntaxError {
    /// What was wrong.
    pub what: &'static str,
    /// Byte offset in the body.
    pub at: usize,
}

/// The kind of the next value, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `{`
    Object,
    /// `[`
    Array,
    /// `"`
    String,
    /// `-` or a digit
    Number,
    /// `true` / `false`
    Bool,
    /// `null`
    Null,
}

impl Kind {
    /// For error messages: "found {}".
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// A cursor over one JSON text.
pub struct Reader<'a> {
    src: &'a str,
    pos: usize,
    depth: u32,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `src`.
    pub fn new(src: &'a str) -> Self {
        Reader {
            src,
            pos: 0,
            depth: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    fn byte(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn fail<T>(&self, what: &'static str) -> Result<T, SyntaxError> {
        Err(SyntaxError { what, at: self.pos })
    }

    fn slice(&self, start: usize, end: usize) -> Result<&'a str, SyntaxError> {
        // Never fails: both ends sit at ASCII delimiters of valid UTF-8.
        self.src.get(start..end).ok_or(SyntaxError {
            what: "string cut inside a character",
            at: start,
        })
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.byte() {
            self.pos += 1;
        }
    }

    /// The kind of the next value (after whitespace), or `None` at the end of input or at a byte
    /// that starts no value.
    pub fn peek(&mut self) -> Option<Kind> {
        self.skip_ws();
        Some(match self.byte()? {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b'-' | b'0'..=b'9' => Kind::Number,
            b't' | b'f' => Kind::Bool,
            b'n' => Kind::Null,
            _ => return None,
        })
    }

    /// The kind of the next value, which must be there.
    pub fn expect_value(&mut self) -> Result<Kind, SyntaxError> {
        match self.peek() {
            Some(k) => Ok(k),
            None if self.pos >= self.src.len() => self.fail("unexpected end of input"),
            None => self.fail("expected a value"),
        }
    }

    /// Only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos >= self.src.len()
    }

    /// Fails unless only whitespace is left.
    pub fn finish(&mut self) -> Result<(), SyntaxError> {
        if self.at_end() {
            Ok(())
        } else {
            self.fail("trailing characters")
        }
    }

    fn open(&mut self, bracket: u8, what: &'static str) -> Result<(), SyntaxError> {
        self.skip_ws();
        if self.byte() != Some(bracket) {
            return self.fail(what);
        }
        if self.depth >= MAX_DEPTH {
            return self.fail("nesting too deep");
        }
        self.depth += 1;
        self.pos += 1;
        Ok(())
    }

    fn close(&mut self) {
        self.depth -= 1;
        self.pos += 1;
    }

    /// Enters an object; then call [`Reader::next_key`] until it returns `None`.
    pub fn begin_object(&mut self) -> Result<(), SyntaxError> {
        self.open(b'{', "expected `{`")
    }

    /// Enters an array; then call [`Reader::next_item`] until it returns `false`.
    pub fn begin_array(&mut self) -> Result<(), SyntaxError> {
        self.open(b'[', "expected `[`")
    }

    /// Moves to the next key's opening quote; `false` once the object is closed. `first` starts
    /// `true` for each object and is cleared here.
    fn advance_key(&mut self, first: &mut bool) -> Result<bool, SyntaxError> {
        self.skip_ws();
        if std::mem::take(first) {
            if self.byte() == Some(b'}') {
                self.close();
                return Ok(false);
            }
        } else {
            match self.byte() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b'}') => {
                    self.close();
                    return Ok(false);
                }
                _ => return self.fail("expected `,` or `}`"),
            }
        }
        if self.byte() != Some(b'"') {
            return self.fail("expected a string key");
        }
        Ok(true)
    }

    fn colon(&mut self) -> Result<(), SyntaxError> {
        self.skip_ws();
        if self.byte() != Some(b':') {
            return self.fail("expected `:`");
        }
        self.pos += 1;
        Ok(())
    }

    /// The next key of the current object, leaving the reader at its value (which the caller
    /// must read or skip); `None` once the object is closed.
    pub fn next_key(&mut self, first: &mut bool) -> Result<Option<Cow<'a, str>>, SyntaxError> {
        if !self.advance_key(first)? {
            return Ok(None);
        }
        let key = self.string()?;
        self.colon()?;
        Ok(Some(key))
    }

    /// Whether the current array has another element, leaving the reader at it (which the caller
    /// must read or skip). `first` starts `true` for each array and is cleared here.
    pub fn next_item(&mut self, first: &mut bool) -> Result<bool, SyntaxError> {
        self.skip_ws();
        if std::mem::take(first) {
            if self.byte() == Some(b']') {
                self.close();
                return Ok(false);
            }
            return Ok(true);
        }
        match self.byte() {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(b']') => {
                self.close();
                Ok(false)
            }
            _ => self.fail("expected `,` or `]`"),
        }
    }

    /// Skips the rest of the current array.
    pub fn skip_items(&mut self, first: &mut bool) -> Result<(), SyntaxError> {
        while self.next_item(first)? {
            self.skip_value()?;
        }
        Ok(())
    }

    /// Offset of the next `"` or `\` from the cursor, checking that no raw control character
    /// comes before it.
    fn scan_plain(&self) -> Result<usize, SyntaxError> {
        let rest = &self.bytes()[self.pos..];
        // Keys, roles and short contents end within a few words: eight bytes at a time finds
        // their end before a vector search would have been set up.
        let mut words = rest.chunks_exact(8).take(SHORT_WORDS);
        let mut at = 0;
        for w in words.by_ref() {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            if let Some(i) = special::in_word(u64::from_le_bytes(word)) {
                return self.plain_end(at + i);
            }
            at += 8;
        }
        if at < SHORT_WORDS * 8 {
            // Fewer than eight bytes were left: the body ends within this string.
            for (i, &b) in rest[at..].iter().enumerate() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    return self.plain_end(at + i);
                }
            }
            return Err(SyntaxError {
                what: "unterminated string",
                at: self.src.len(),
            });
        }
        match special::find(&rest[at..]) {
            Some(i) => self.plain_end(at + i),
            None => Err(SyntaxError {
                what: "unterminated string",
                at: self.src.len(),
            }),
        }
    }

    /// The string's plain run ends `i` bytes past the reader, at a quote, a backslash or a
    /// control character (an error).
    fn plain_end(&self, i: usize) -> Result<usize, SyntaxError> {
        if self.bytes()[self.pos + i] < 0x20 {
            return Err(SyntaxError {
                what: "control character in string",
                at: self.pos + i,
            });
        }
        Ok(self.pos + i)
    }

    fn hex4(&self, at: usize) -> Result<u32, SyntaxError> {
        let digits = self.bytes().get(at..at + 4).ok_or(SyntaxError {
            what: "unterminated string",
            at: self.src.len(),
        })?;
        digits.iter().try_fold(0u32, |acc, &b| {
            let d = (b as char).to_digit(16).ok_or(SyntaxError {
                what: "invalid \\u escape",
                at,
            })?;
            Ok(acc * 16 + d)
        })
    }

    /// Reads the escape at the cursor (a `\`), appending what it stands for to `out` when given.
    fn escape(&mut self, out: Option<&mut String>) -> Result<(), SyntaxError> {
        let Some(&c) = self.bytes().get(self.pos + 1) else {
            return Err(SyntaxError {
                what: "unterminated string",
                at: self.src.len(),
            });
        };
        let ch = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(out),
            _ => return self.fail("invalid escape"),
        };
        self.pos += 2;
        if let Some(out) = out {
            out.push(ch);
        }
        Ok(())
    }

    fn unicode_escape(&mut self, out: Option<&mut String>) -> Result<(), SyntaxError> {
        let unit = self.hex4(self.pos + 2)?;
        self.pos += 6;
        let Some(out) = out else {
            // Skipped strings only need well-formed hex digits.
            return Ok(());
        };
        let code = match unit {
            0xD800..=0xDBFF => {
                if self.bytes().get(self.pos..self.pos + 2) != Some(b"\\u") {
                    return self.fail("unpaired surrogate in \\u escape");
                }
                let low = self.hex4(self.pos + 2)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return self.fail("unpaired surrogate in \\u escape");
                }
                self.pos += 6;
                0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return self.fail("unpaired surrogate in \\u escape"),
            _ => unit,
        };
        match char::from_u32(code) {
            Some(ch) => {
                out.push(ch);
                Ok(())
            }
            None => self.fail("invalid \\u escape"),
        }
    }

    /// Reads a string (the cursor must be at its opening quote, after whitespace): borrowed when
    /// it has no escapes.
    pub fn string(&mut self) -> Result<Cow<'a, str>, SyntaxError> {
        self.skip_ws();
        if self.byte() != Some(b'"') {
            return self.fail("expected a string");
        }
        self.pos += 1;
        let start = self.pos;
        // Most keys and short values close within their first eight bytes.
        if let Some(&word) = self.bytes()[start..].first_chunk::<8>() {
            if let Some(i) = special::in_word(u64::from_le_bytes(word)) {
                if word[i] == b'"' {
                    self.pos = start + i + 1;
                    return Ok(Cow::Borrowed(self.slice(start, start + i)?));
                }
            }
        }
        let end = self.scan_plain()?;
        if self.bytes()[end] == b'"' {
            self.pos = end + 1;
            return Ok(Cow::Borrowed(self.slice(start, end)?));
        }
        let mut out = String::with_capacity(end - start + 16);
        out.push_str(self.slice(start, end)?);
        self.pos = end;
        loop {
            self.escape(Some(&mut out))?;
            let seg = self.pos;
            let end = self.scan_plain()?;
            out.push_str(self.slice(seg, end)?);
            self.pos = end;
            if self.bytes()[end] == b'"' {
                self.pos += 1;
                return Ok(Cow::Owned(out));
            }
        }
    }

    fn skip_string(&mut self) -> Result<(), SyntaxError> {
        self.pos += 1;
        loop {
            self.pos = self.scan_plain()?;
            if self.bytes()[self.pos] == b'"' {
                self.pos += 1;
                return Ok(());
            }
            self.escape(None)?;
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.byte() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// Reads a number; returns its text and whether it is an integer (no fraction or exponent).
    pub fn number(&mut self) -> Result<(&'a str, bool), SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        if self.byte() == Some(b'-') {
            self.pos += 1;
        }
        match self.byte() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.fail("invalid number"),
        }
        let mut integer = true;
        if self.byte() == Some(b'.') {
            integer = false;
            self.pos += 1;
            if self.digits() == 0 {
                return self.fail("invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.byte() {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.byte() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.fail("invalid number");
            }
        }
        Ok((self.slice(start, self.pos)?, integer))
    }

    /// Reads `true`, `false` (as `Some`) or `null` (as `None`).
    pub fn literal(&mut self) -> Result<Option<bool>, SyntaxError> {
        self.skip_ws();
        let rest = &self.bytes()[self.pos..];
        let (value, len) = if rest.starts_with(b"true") {
            (Some(true), 4)
        } else if rest.starts_with(b"false") {
            (Some(false), 5)
        } else if rest.starts_with(b"null") {
            (None, 4)
        } else {
            return self.fail("invalid literal");
        };
        self.pos += len;
        Ok(value)
    }

    /// Consumes a `null` if one is next.
    pub fn take_null(&mut self) -> Result<bool, SyntaxError> {
        if self.peek() == Some(Kind::Null) {
            self.literal()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Skips one value, validating it.
    pub fn skip_value(&mut self) -> Result<(), SyntaxError> {
        match self.expect_value()? {
            Kind::String => self.skip_string(),
            Kind::Number => self.number().map(drop),
            Kind::Bool | Kind::Null => self.literal().map(drop),
            Kind::Object => {
                self.begin_object()?;
                let mut first = true;
                while self.advance_key(&mut first)? {
                    self.skip_string()?;
                    self.colon()?;
                    self.skip_value()?;
                }
                Ok(())
            }
            Kind::Array => {
                self.begin_array()?;
                self.skip_items(&mut true)
            }
        }
    }

    /// Skips one value and returns its exact text.
    pub fn raw(&mut self) -> Result<&'a str, SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        self.skip_value()?;
        self.slice(start, self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn valid(text: &str) -> bool {
        let mut r = Reader::new(text);
        r.skip_value().and_then(|()| r.finish()).is_ok()
    }

    fn serde_valid(text: &str) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
    }

    #[test]
    fn accepts_and_rejects_like_serde_json() {
        let cases = [
            "{}",
            "[]",
            " {\"a\" : [1, -2.5e+3, 0, true, false, null, \"x\\n\\u00e9\"] } ",
            "{\"a\":{\"b\":{\"c\":[[],[{}]]}}}",
            "\"\\ud83d\\ude00\"",
            "\"\\ud800\"",
            "-0",
            "0.5E-1",
            "",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "[1,]",
            "[,1]",
            "01",
            "1.",
            "-",
            ".5",
            "1e",
            "tru",
            "nul",
            "\"abc",
            "\"a\\x\"",
            "\"a\\u12g4\"",
            "\"tab\there\"",
            "{\"a\":1}}",
            "[1 2]",
            "{'a':1}",
            "{\"a\" 1}",
            "\u{feff}{}",
            "\"ok\" x",
        ];
        for c in cases {
            assert_eq!(valid(c), serde_valid(c), "{c:?}");
        }
    }

    #[test]
    fn mutated_documents_agree_with_serde_json() {
        let seeds = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi \"there\" \\ \u00e9"}],"stream":true,"n":-1.5e3,"x":null}"#,
            r#"{"prompt":[1,2,3],"input":[[4,5],[6]],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#,
            r#"[{"a":[true,false,null,0,-0.0,12e-7]},"\ud83d\ude00",{}]"#,
        ];
        let alphabet = b"{}[]:,\"\\ -+.0123456789eEtrufalsn\t\nabu";
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut disagreements = Vec::new();
        for i in 0..20_000 {
            let mut doc = seeds[i % seeds.len()].as_bytes().to_vec();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..=doc.len());
                let b = alphabet[rng.gen_range(0..alphabet.len())];
                match rng.gen_range(0..3) {
                    0 => doc.insert(at, b),
                    1 if at < doc.len() => {
                        doc.remove(at);
                    }
                    _ if at < doc.len() => doc[at] = b,
                    _ => doc.push(b),
                }
            }
            let Ok(text) = String::from_utf8(doc) else {
                continue;
            };
            if valid(&text) != serde_valid(&text) {
                disagreements.push(text);
            }
        }
        assert!(
            disagreements.is_empty(),
            "{:?}",
            &disagreements[..disagreements.len().min(5)]
        );
    }

    #[test]
    fn first_special_finds_the_lowest_match_in_a_word() {
        let specials = [b'"', b'\\', 0x00, 0x1f, b'\n'];
        let plain = [b'a', b' ', 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff];
        for &fill in &plain {
            assert_eq!(special::in_word(u64::from_le_bytes([fill; 8])), None);
            for at in 0..8 {
                for &sp in &specials {
                    let mut word = [fill; 8];
                    word[at] = sp;
                    // Anything above the first match, special or not, leaves the answer alone.
                    for above in at + 1..8 {
                        word[above] = specials[above % specials.len()];
                    }
                    assert_eq!(
                        special::in_word(u64::from_le_bytes(word)),
                        Some(at),
                        "{word:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn strings_borrow_unless_escaped() {
        let mut r = Reader::new(r#"["plain", "esc\"aped\u00e9\ud83d\ude00\n"]"#);
        r.begin_array().unwrap();
        let mut first = true;
        assert!(r.next_item(&mut first).unwrap());
        assert!(matches!(r.string().unwrap(), Cow::Borrowed("plain")));
        assert!(r.next_item(&mut first).unwrap());
        let s = r.string().unwrap();
        assert!(matches!(s, Cow::Owned(_)));
        assert_eq!(s, "esc\"aped\u{e9}\u{1f600}\n");
        assert!(!r.next_item(&mut first).unwrap());
        r.finish().unwrap();
    }

    #[test]
    fn read_strings_agree_with_serde_json_around_word_edges() {
        // Every length across the first words, with an escape, a raw control character or a
        // quote-like byte at every position, followed by more of the document or by nothing.
        for len in 0..20 {
            for at in 0..=len {
                for special in ["", "\\n", "\\\"", "\u{1}", "\\u00e9", "é"] {
                    for tail in ["", ",1]", "   "] {
                        let body: String = (0..len)
                            .map(|i| if i == at { special } else { "a" })
                            .collect();
                        let text = format!("\"{body}\"{tail}");
                        let ours = Reader::new(&text).string().map(|s| s.into_owned());
                        let theirs = serde_json::Deserializer::from_str(&text)
                            .into_iter::<String>()
                            .next()
                            .map(|r| r.ok())
                            .unwrap_or(None);
                        assert_eq!(ours.ok(), theirs, "{text:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn read_strings_reject_unpaired_surrogates() {
        for text in [r#""\ud800""#, r#""\ude00x""#, r#""\ud800\u0041""#] {
            assert_eq!(
                Reader::new(text).string().unwrap_err().what,
                "unpaired surrogate in \\u escape"
            );
        }
    }

    #[test]
    fn errors_name_the_offset() {
        let e = Reader::new("\"a\u{1}b\"").string().unwrap_err();
        assert_eq!((e.what, e.at), ("control character in string", 2));
        let mut r = Reader::new("[1,]");
        let e = r.skip_value().unwrap_err();
        assert_eq!((e.what, e.at), ("expected a value", 3));
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(valid(&ok));
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let mut r = Reader::new(&deep);
        assert_eq!(r.skip_value().unwrap_err().what, "nesting too deep");
    }

    #[test]
    fn raw_values_are_exact() {
        let mut r = Reader::new(r#"{"t": [ {"a" : 1} ] , "u":2}"#);
        r.begin_object().unwrap();
        let mut first = true;
        assert_eq!(r.next_key(&mut first).unwrap().as_deref(), Some("t"));
        assert_eq!(r.raw().unwrap(), r#"[ {"a" : 1} ]"#);
        assert_eq!(r.next_key(&mut first).unwrap().as_deref(), Some("u"));
        assert_eq!(r.number().unwrap(), ("2", true));
        assert_eq!(r.next_key(&mut first).unwrap(), None);
    }
}
