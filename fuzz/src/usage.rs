//! Reference `completion_tokens` counts, from `kvgate::proxy::usage::CompletionTokens`' contract:
//! the last complete `"completion_tokens": N` in the bytes, `N` saturated at `u64::MAX`.
//!
//! Two references, independent of the scanner's state machine:
//! - [`scan`] over the whole input at once, with the contract's exact byte grammar;
//! - [`via_serde`] over the tree serde_json builds of a JSON document: the value of the last
//!   `completion_tokens` member in document order, where the tree alone decides it.

/// The key, quotes included, as it must appear in the bytes.
pub const KEY: &[u8] = b"\"completion_tokens\"";

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits a fuzz input into its frame lengths and its payload: the first byte says how many
/// of the following bytes are frame lengths (each one byte; see [`crate::splits::pieces`]),
/// the rest is the payload. A seed is `\0` followed by the payload.
pub fn input(data: &[u8]) -> (&[u8], &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return (&[], &[]);
    };
    rest.split_at(usize::from(n).min(rest.len()))
}

/// Over the whole of `data`: every occurrence of [`KEY`], followed by JSON whitespace, `:`, JSON
/// whitespace and one or more ASCII digits that some byte (any non-digit) follows, is a
/// complete occurrence; the last one's digits, as a number saturated at `u64::MAX`.
pub fn scan(data: &[u8]) -> Option<u64> {
    let mut found = None;
    for start in 0..data.len() {
        if !data[start..].starts_with(KEY) {
            continue;
        }
        let mut i = start + KEY.len();
        while i < data.len() && is_ws(data[i]) {
            i += 1;
        }
        if data.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        while i < data.len() && is_ws(data[i]) {
            i += 1;
        }
        let digits = data[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        // Ended: a byte follows the digits.
        if digits > 0 && i + digits < data.len() {
            found = Some(number(&data[i..i + digits]));
        }
    }
    found
}

/// ASCII digits as a number, `u64::MAX` when larger.
fn number(digits: &[u8]) -> u64 {
    let mut v: u128 = 0;
    for d in digits {
        v = v * 10 + u128::from(d - b'0');
        if v > u128::from(u64::MAX) {
            return u64::MAX;
        }
    }
    v as u64
}

/// An object key as serde_json delivered it.
#[derive(Debug)]
enum Key {
    /// Borrowed from the input: it was written without escapes, so these are its bytes.
    Raw(String),
    /// Decoded from escapes: how it was written is not known.
    Escaped(String),
}

/// A number as serde_json reads it.
#[derive(Debug)]
enum Num {
    /// A non-negative integer within `u64`.
    U(u64),
    /// Written with a leading `-`: an integer below 0, or a float with its sign bit set
    /// (`-0` included, which serde_json reads as `-0.0`).
    Neg,
    /// A non-negative float: a fraction, an exponent, or an integer beyond `u64`.
    F,
}

#[derive(Debug)]
enum T {
    Num(Num),
    /// Null, a boolean or a string.
    Leaf,
    Arr(Vec<T>),
    Obj(Vec<(Key, T)>),
}

mod de {
    use super::{Key, Num, T};
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a key")
                }
                fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key, E> {
                    Ok(Key::Raw(s.to_owned()))
                }
                fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                    Ok(Key::Escaped(s.to_owned()))
                }
                fn visit_string<E>(self, s: String) -> Result<Key, E> {
                    Ok(Key::Escaped(s))
                }
            }
            d.deserialize_str(V)
        }
    }

    impl<'de> Deserialize<'de> for T {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = T;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("JSON")
                }
                fn visit_unit<E>(self) -> Result<T, E> {
                    Ok(T::Leaf)
                }
                fn visit_bool<E>(self, _: bool) -> Result<T, E> {
                    Ok(T::Leaf)
                }
                fn visit_u64<E>(self, n: u64) -> Result<T, E> {
                    Ok(T::Num(Num::U(n)))
                }
                // serde_json reads every number written without `-` as u64 or f64.
                fn visit_i64<E>(self, _: i64) -> Result<T, E> {
                    Ok(T::Num(Num::Neg))
                }
                fn visit_f64<E>(self, n: f64) -> Result<T, E> {
                    Ok(T::Num(if n.is_sign_negative() {
                        Num::Neg
                    } else {
                        Num::F
                    }))
                }
                fn visit_str<E>(self, _: &str) -> Result<T, E> {
                    Ok(T::Leaf)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
                    let mut v = Vec::new();
                    while let Some(x) = a.next_element()? {
                        v.push(x);
                    }
                    Ok(T::Arr(v))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
                    let mut v = Vec::new();
                    while let Some(kv) = a.next_entry::<Key, T>()? {
                        v.push(kv);
                    }
                    Ok(T::Obj(v))
                }
            }
            d.deserialize_any(V)
        }
    }
}

/// Why the tree cannot decide.
struct Undecided;

/// The scanner's answer for `data` read as one JSON document by serde_json, from its tree:
/// `None` when serde_json does not read it, or when the answer depends on how something was
/// written rather than on the tree (the last `completion_tokens` member with a non-negative
/// float value, whose integer digits the scanner takes; an escaped key ending in
/// `"completion_tokens`, which the scanner matches when that quote was written `\"`).
///
/// In valid JSON a string followed by `:` is an object key, so the scanner's occurrences are
/// exactly the members named `completion_tokens` written without escapes; a member whose value
/// is not a non-negative integer does not end an occurrence, and leaves the last one standing.
pub fn via_serde(data: &[u8]) -> Option<Option<u64>> {
    let tree: T = serde_json::from_slice(data).ok()?;
    let mut found = None;
    walk(&tree, &mut found).ok()?;
    Some(found)
}

fn walk(t: &T, found: &mut Option<u64>) -> Result<(), Undecided> {
    match t {
        T::Num(_) | T::Leaf => {}
        T::Arr(v) => {
            for x in v {
                walk(x, found)?;
            }
        }
        T::Obj(members) => {
            for (k, v) in members {
                let named = match k {
                    Key::Raw(k) => k.as_bytes() == &KEY[1..KEY.len() - 1],
                    Key::Escaped(k) if k.ends_with("\"completion_tokens") => return Err(Undecided),
                    Key::Escaped(_) => false,
                };
                if named {
                    match v {
                        T::Num(Num::U(n)) => *found = Some(*n),
                        T::Num(Num::F) => return Err(Undecided),
                        _ => {}
                    }
                }
                walk(v, found)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_agree_on_the_contract_examples() {
        let usage = br#"{"usage":{"prompt_tokens":12,"completion_tokens" : 34,"total_tokens":46}}"#;
        assert_eq!(scan(usage), Some(34));
        assert_eq!(via_serde(usage), Some(Some(34)));
        let later = br#"{"a":{"completion_tokens":6},"completion_tokens":5}"#;
        assert_eq!(scan(later), Some(5));
        assert_eq!(via_serde(later), Some(Some(5)));
        let none = br#"{"completion_tokens":"x","completion_tokens_details":{}}"#;
        assert_eq!(scan(none), None);
        assert_eq!(via_serde(none), Some(None));
        let escaped = br#"{"completion\u005ftokens":3}"#;
        assert_eq!(scan(escaped), None);
        assert_eq!(via_serde(escaped), Some(None));
        assert_eq!(via_serde(br#"{"x\"completion_tokens":3}"#), None);
        assert_eq!(via_serde(br#"{"completion_tokens":1.5}"#), None);
        assert_eq!(via_serde(br#"{"completion_tokens":-0}"#), Some(None));
        assert_eq!(
            scan(br#""completion_tokens":99999999999999999999999}"#),
            Some(u64::MAX)
        );
        // Not ended: the digits run to the end of the input.
        assert_eq!(scan(br#""completion_tokens":7"#), None);
        assert_eq!(input(b"\x02\x05\x07abc"), (&b"\x05\x07"[..], &b"abc"[..]));
        assert_eq!(input(b"\x09ab"), (&b"ab"[..], &b""[..]));
    }
}
