//! A minimal, allocation-free MessagePack reader over a byte slice.
//!
//! Invariants: every read checks the remaining length first, so truncated or garbage input yields
//! [`MsgError`] and never panics; declared lengths are never trusted for allocation (callers cap
//! them with [`Reader::remaining`]); skipping nested values is depth-bounded.

/// What went wrong while reading MessagePack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// The input ended inside a value.
    #[error("truncated msgpack at byte {0}")]
    Truncated(usize),
    /// A value of another type was found.
    #[error("expected {expected} at byte {at}, found marker 0x{marker:02x}")]
    Type {
        /// What the decoder wanted.
        expected: &'static str,
        /// Offset of the value.
        at: usize,
        /// The marker byte found.
        marker: u8,
    },
    /// Nesting deeper than the decoder allows.
    #[error("msgpack nested deeper than {0}")]
    TooDeep(usize),
    /// The reserved marker 0xc1.
    #[error("invalid msgpack marker 0xc1 at byte {0}")]
    Invalid(usize),
}

/// An integer as encoded: msgpack distinguishes unsigned and negative integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// A non-negative integer (any width).
    U(u64),
    /// A negative integer.
    I(i64),
}

impl Int {
    /// The two's-complement bits as `u64` (a negative `i64` keeps its bit pattern).
    pub fn bits(self) -> u64 {
        match self {
            Int::U(u) => u,
            Int::I(i) => i as u64,
        }
    }
}

/// The broad kind of the next value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool,
    /// Any integer.
    Int,
    /// float32 / float64.
    Float,
    /// A string.
    Str,
    /// Binary data.
    Bin,
    /// An array.
    Array,
    /// A map.
    Map,
    /// An extension type.
    Ext,
}

/// A cursor over a MessagePack byte slice.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Current offset.
    pub fn pos(&self) -> usize {
        self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgError> {
        if self.remaining() < n {
            return Err(MsgError::Truncated(self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, MsgError> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], MsgError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn peek(&self) -> Result<u8, MsgError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(MsgError::Truncated(self.buf.len()))
    }

    fn type_err(&self, expected: &'static str, marker: u8) -> MsgError {
        MsgError::Type {
            expected,
            at: self.pos,
            marker,
        }
    }

    /// The kind of the next value, without consuming it.
    pub fn kind(&self) -> Result<Kind, MsgError> {
        let m = self.peek()?;
        Ok(match m {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xca | 0xcb => Kind::Float,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            0xc1 => return Err(MsgError::Invalid(self.pos)),
        })
    }

    /// Consumes a `nil` if one is next; returns whether it did.
    pub fn try_nil(&mut self) -> Result<bool, MsgError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads an integer of any width.
    pub fn int(&mut self) -> Result<Int, MsgError> {
        let m = self.peek()?;
        let v = match m {
            0x00..=0x7f => {
                self.pos += 1;
                Int::U(u64::from(m))
            }
            0xe0..=0xff => {
                self.pos += 1;
                Int::I(i64::from(m as i8))
            }
            0xcc..=0xd3 => {
                self.pos += 1;
                match m {
                    0xcc => Int::U(u64::from(self.byte()?)),
                    0xcd => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
                    0xce => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
                    0xcf => Int::U(u64::from_be_bytes(self.be()?)),
                    0xd0 => signed(i64::from(self.byte()? as i8)),
                    0xd1 => signed(i64::from(i16::from_be_bytes(self.be()?))),
                    0xd2 => signed(i64::from(i32::from_be_bytes(self.be()?))),
                    _ => signed(i64::from_be_bytes(self.be()?)),
                }
            }
            _ => return Err(self.type_err("integer", m)),
        };
        Ok(v)
    }

    /// Reads a number (float or integer) as `f64`.
    pub fn f64(&mut self) -> Result<f64, MsgError> {
        let m = self.peek()?;
        match m {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.be()?)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            _ => match self.int() {
                Ok(Int::U(u)) => Ok(u as f64),
                Ok(Int::I(i)) => Ok(i as f64),
                Err(_) => Err(self.type_err("number", m)),
            },
        }
    }

    /// Reads a string's bytes (not validated as UTF-8).
    pub fn str_bytes(&mut self) -> Result<&'a [u8], MsgError> {
        let m = self.peek()?;
        let len = match m {
            0xa0..=0xbf => {
                self.pos += 1;
                usize::from(m & 0x1f)
            }
            0xd9 => {
                self.pos += 1;
                usize::from(self.byte()?)
            }
            0xda => {
                self.pos += 1;
                usize::from(u16::from_be_bytes(self.be()?))
            }
            0xdb => {
                self.pos += 1;
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => return Err(self.type_err("string", m)),
        };
        self.take(len)
    }

    /// Reads a UTF-8 string; invalid UTF-8 is replaced, not rejected.
    pub fn string(&mut self) -> Result<std::borrow::Cow<'a, str>, MsgError> {
        Ok(String::from_utf8_lossy(self.str_bytes()?))
    }

    /// Reads binary data.
    pub fn bin(&mut self) -> Result<&'a [u8], MsgError> {
        let m = self.peek()?;
        let len = match m {
            0xc4 => {
                self.pos += 1;
                usize::from(self.byte()?)
            }
            0xc5 => {
                self.pos += 1;
                usize::from(u16::from_be_bytes(self.be()?))
            }
            0xc6 => {
                self.pos += 1;
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => return Err(self.type_err("binary", m)),
        };
        self.take(len)
    }

    /// Reads an array header; returns the declared element count.
    pub fn array_len(&mut self) -> Result<usize, MsgError> {
        let m = self.peek()?;
        let len = match m {
            0x90..=0x9f => {
                self.pos += 1;
                usize::from(m & 0x0f)
            }
            0xdc => {
                self.pos += 1;
                usize::from(u16::from_be_bytes(self.be()?))
            }
            0xdd => {
                self.pos += 1;
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => return Err(self.type_err("array", m)),
        };
        // Every element takes at least one byte: a longer declaration is a truncated input.
        if len > self.remaining() {
            return Err(MsgError::Truncated(self.buf.len()));
        }
        Ok(len)
    }

    /// Reads a map header; returns the declared pair count.
    pub fn map_len(&mut self) -> Result<usize, MsgError> {
        let m = self.peek()?;
        let len = match m {
            0x80..=0x8f => {
                self.pos += 1;
                usize::from(m & 0x0f)
            }
            0xde => {
                self.pos += 1;
                usize::from(u16::from_be_bytes(self.be()?))
            }
            0xdf => {
                self.pos += 1;
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => return Err(self.type_err("map", m)),
        };
        if len.saturating_mul(2) > self.remaining() {
            return Err(MsgError::Truncated(self.buf.len()));
        }
        Ok(len)
    }

    /// Skips one value of any type, nested at most `max_depth` levels.
    pub fn skip(&mut self, max_depth: usize) -> Result<(), MsgError> {
        // An explicit stack of "values still to skip" keeps this iterative.
        let mut pending: Vec<usize> = vec![1];
        while let Some(top) = pending.last_mut() {
            if *top == 0 {
                pending.pop();
                continue;
            }
            *top -= 1;
            match self.kind()? {
                Kind::Nil | Kind::Bool => self.pos += 1,
                Kind::Int => {
                    self.int()?;
                }
                Kind::Float => {
                    self.f64()?;
                }
                Kind::Str => {
                    self.str_bytes()?;
                }
                Kind::Bin => {
                    self.bin()?;
                }
                Kind::Ext => self.skip_ext()?,
                Kind::Array | Kind::Map => {
                    let n = if self.kind()? == Kind::Array {
                        self.array_len()?
                    } else {
                        self.map_len()? * 2
                    };
                    if pending.len() > max_depth {
                        return Err(MsgError::TooDeep(max_depth));
                    }
                    pending.push(n);
                }
            }
        }
        Ok(())
    }

    fn skip_ext(&mut self) -> Result<(), MsgError> {
        let m = self.byte()?;
        let len = match m {
            0xd4 => 1,
            0xd5 => 2,
            0xd6 => 4,
            0xd7 => 8,
            0xd8 => 16,
            0xc7 => usize::from(self.byte()?),
            0xc8 => usize::from(u16::from_be_bytes(self.be()?)),
            _ => u32::from_be_bytes(self.be()?) as usize,
        };
        // One type byte, then the data.
        self.take(1 + len)?;
        Ok(())
    }
}

fn signed(i: i64) -> Int {
    if i >= 0 {
        Int::U(i as u64)
    } else {
        Int::I(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_of_every_width() {
        let cases: &[(&[u8], Int)] = &[
            (&[0x05], Int::U(5)),
            (&[0xff], Int::I(-1)),
            (&[0xcc, 0xff], Int::U(255)),
            (&[0xcd, 0x01, 0x00], Int::U(256)),
            (&[0xce, 0, 1, 0, 0], Int::U(65536)),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Int::U(u64::MAX),
            ),
            (&[0xd0, 0x80], Int::I(-128)),
            (&[0xd1, 0xff, 0x00], Int::I(-256)),
            (&[0xd2, 0xff, 0xff, 0xff, 0xff], Int::I(-1)),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], Int::I(i64::MIN)),
            (&[0xd3, 0, 0, 0, 0, 0, 0, 0, 7], Int::U(7)),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).int().unwrap(), *want, "{bytes:x?}");
        }
        assert_eq!(Int::I(-1).bits(), u64::MAX);
    }

    #[test]
    fn truncation_and_type_errors_do_not_panic() {
        for bytes in [
            &[0xcf, 0x00][..],
            &[0xdc, 0x00],
            &[0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0xa5, b'a'],
            &[0xc6, 0, 0, 0, 9, 1],
            &[],
        ] {
            let mut r = Reader::new(bytes);
            assert!(r.skip(8).is_err(), "{bytes:x?}");
        }
        assert!(matches!(
            Reader::new(&[0xa1, b'x']).int(),
            Err(MsgError::Type { .. })
        ));
        assert!(matches!(
            Reader::new(&[0xc1]).skip(4),
            Err(MsgError::Invalid(0))
        ));
    }

    #[test]
    fn skip_is_depth_bounded() {
        let deep = vec![0x91u8; 100];
        assert!(matches!(
            Reader::new(&deep).skip(16),
            Err(MsgError::TooDeep(16))
        ));
        // [1, {"a": [nil, true]}, 2.5f32, ext8]
        let v = [
            0x94, 0x01, 0x81, 0xa1, b'a', 0x92, 0xc0, 0xc3, 0xca, 0x40, 0x20, 0, 0, 0xd4, 1, 9,
        ];
        let mut r = Reader::new(&v);
        r.skip(4).unwrap();
        assert_eq!(r.remaining(), 0);
    }
}
