//! Finds `"completion_tokens": N` in a response's bytes as they pass, for the token rate limit.
//!
//! Invariants:
//! - Nothing is buffered: a byte-at-a-time state machine carried across frames, so a split
//!   anywhere gives the same answer.
//! - The last complete occurrence wins (a stream's usage chunk comes last); a number too large
//!   for `u64` saturates.

/// The scanner.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompletionTokens {
    at: At,
    /// The digits of the occurrence being read.
    value: u64,
    /// The last complete occurrence.
    found: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum At {
    /// Matched this many bytes of the key.
    #[default]
    Key0,
    Key(u8),
    /// Just after the key's closing quote, which may also open the next key.
    Closed,
    /// After the key and whitespace: waiting for `:`.
    Colon,
    /// After `:`: waiting for the first digit.
    Value,
    /// In the digits.
    Digits,
}

const KEY: &[u8] = b"\"completion_tokens\"";

impl CompletionTokens {
    /// Scans the next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.at = match self.at {
                At::Key0 => self.key_byte(0, b),
                At::Key(m) => self.key_byte(usize::from(m), b),
                At::Closed => match b {
                    b':' => At::Value,
                    b' ' | b'\t' | b'\r' | b'\n' => At::Colon,
                    // The quote just read is the key's first byte as well as its last.
                    _ => self.key_byte(1, b),
                },
                At::Colon => match b {
                    b':' => At::Value,
                    b' ' | b'\t' | b'\r' | b'\n' => At::Colon,
                    _ => self.key_byte(0, b),
                },
                At::Value => match b {
                    b'0'..=b'9' => {
                        self.value = u64::from(b - b'0');
                        At::Digits
                    }
                    b' ' | b'\t' | b'\r' | b'\n' => At::Value,
                    _ => self.key_byte(0, b),
                },
                At::Digits => match b {
                    b'0'..=b'9' => {
                        self.value = self
                            .value
                            .saturating_mul(10)
                            .saturating_add(u64::from(b - b'0'));
                        At::Digits
                    }
                    _ => {
                        self.found = Some(self.value);
                        self.key_byte(0, b)
                    }
                },
            };
        }
    }

    fn key_byte(&self, matched: usize, b: u8) -> At {
        if b == KEY[matched] {
            if matched + 1 == KEY.len() {
                At::Closed
            } else {
                At::Key(matched as u8 + 1)
            }
        } else if b == KEY[0] {
            At::Key(1)
        } else {
            At::Key0
        }
    }

    /// The count, once an occurrence ended.
    pub fn found(&self) -> Option<u64> {
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_across_any_split_and_last_wins() {
        let body = br#"{"usage":{"prompt_tokens":12,"completion_tokens" : 34,"total_tokens":46}}
data: {"usage":{"completion_tokens":56}}"#;
        for split in 0..body.len() {
            let mut s = CompletionTokens::default();
            s.feed(&body[..split]);
            s.feed(&body[split..]);
            assert_eq!(s.found(), Some(56), "split at {split}");
        }
        let mut none = CompletionTokens::default();
        none.feed(br#"{"completion_tokens":"x","completion_tokens_details":{}}"#);
        assert_eq!(none.found(), None);
        // A key whose opening quote closes the previous one (not JSON, but the key is there).
        let mut overlapping = CompletionTokens::default();
        overlapping.feed(br#""completion_tokens"completion_tokens" : 34,"#);
        assert_eq!(overlapping.found(), Some(34));
        let mut huge = CompletionTokens::default();
        huge.feed(br#""completion_tokens":99999999999999999999999}"#);
        assert_eq!(huge.found(), Some(u64::MAX));
    }
}
