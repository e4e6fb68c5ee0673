//! Reference HTTP/1.1 body decoder (RFC 9112 §7.1) over a whole input at once, with the bounds and
//! leniencies `kvgate::client::body` documents: a chunk-size line (size, then optional `;`
//! extensions, blanks around the size allowed) of at most `max_line` bytes before its CRLF, at
//! most 15 hex digits; trailer lines are skipped, at most `max_trailers` bytes in all.

/// How decoding the whole input ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The body ended; this many input bytes belonged to it.
    End(usize),
    /// The input stopped inside the body.
    Incomplete,
    /// The body is malformed.
    Error,
}

/// Decodes a chunked body at the start of `input`: the data it carries, and how it ended.
pub fn chunked(input: &[u8], max_line: usize, max_trailers: usize) -> (Vec<u8>, Outcome) {
    let mut data = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &input[pos..];
        let Some(end) = crlf(rest) else {
            // A CRLF could still start at `max_line` if the last byte is its CR.
            let o = if rest.len() > max_line + 1 {
                Outcome::Error
            } else {
                Outcome::Incomplete
            };
            return (data, o);
        };
        if end > max_line {
            return (data, Outcome::Error);
        }
        let line = &rest[..end];
        let size_part = match line.iter().position(|&b| b == b';') {
            Some(i) => &line[..i],
            None => line,
        };
        let Some(size) = hex(size_part.trim_ascii()) else {
            return (data, Outcome::Error);
        };
        pos += end + 2;
        if size == 0 {
            let mut seen = 0usize;
            loop {
                let rest = &input[pos..];
                let room = max_trailers.saturating_sub(seen);
                let Some(end) = crlf(rest) else {
                    let o = if rest.len() > room + 1 {
                        Outcome::Error
                    } else {
                        Outcome::Incomplete
                    };
                    return (data, o);
                };
                if end > room {
                    return (data, Outcome::Error);
                }
                pos += end + 2;
                if end == 0 {
                    return (data, Outcome::End(pos));
                }
                seen += end + 2;
            }
        }
        let avail = (input.len() - pos) as u64;
        if avail < size {
            data.extend_from_slice(&input[pos..]);
            return (data, Outcome::Incomplete);
        }
        let size = size as usize;
        data.extend_from_slice(&input[pos..pos + size]);
        pos += size;
        match input.get(pos..pos + 2) {
            None => return (data, Outcome::Incomplete),
            Some(b"\r\n") => pos += 2,
            Some(_) => return (data, Outcome::Error),
        }
    }
}

fn crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 15 {
        return None;
    }
    let mut n = 0u64;
    for &d in digits {
        n = n * 16 + u64::from((d as char).to_digit(16)?);
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes() {
        let (d, o) = chunked(b"3\r\nabc\r\n1;x=y\r\nd\r\n0\r\nT: 1\r\n\r\nNEXT", 100, 100);
        assert_eq!((d.as_slice(), o), (&b"abcd"[..], Outcome::End(34)));
        assert_eq!(chunked(b"3\r\nab", 100, 100).1, Outcome::Incomplete);
        assert_eq!(chunked(b"3\r\nabcX\r\n", 100, 100).1, Outcome::Error);
    }
}
