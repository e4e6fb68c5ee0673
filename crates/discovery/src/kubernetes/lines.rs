//! [`LineBuffer`]: splits a watch stream's bytes into newline-delimited event lines (sans-I/O).
//!
//! Invariant: no line, complete or still arriving, grows past `max` bytes; a longer one is an
//! error rather than unbounded memory.

/// A line longer than the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a watch event line exceeds {max} bytes")]
pub struct LineTooLong {
    /// The limit.
    pub max: usize,
}

/// Bytes received but not yet ending in a newline.
#[derive(Debug, Default)]
pub struct LineBuffer {
    partial: Vec<u8>,
    max: usize,
}

impl LineBuffer {
    /// Lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            partial: Vec::new(),
            max,
        }
    }

    /// Feeds `chunk`; returns the complete, non-blank lines it finished (without the newline).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, LineTooLong> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(i) = memchr_newline(rest) {
            let (head, tail) = rest.split_at(i);
            if self.partial.len() + head.len() > self.max {
                return Err(LineTooLong { max: self.max });
            }
            self.partial.extend_from_slice(head);
            let line = std::mem::take(&mut self.partial);
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                lines.push(line);
            }
            rest = &tail[1..];
        }
        if self.partial.len() + rest.len() > self.max {
            return Err(LineTooLong { max: self.max });
        }
        self.partial.extend_from_slice(rest);
        Ok(lines)
    }

    /// Whether bytes of an unfinished line are held (a stream that ends here lost an event).
    pub fn has_partial(&self) -> bool {
        self.partial.iter().any(|b| !b.is_ascii_whitespace())
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_and_blank_lines_skipped() {
        let mut b = LineBuffer::new(8);
        assert_eq!(b.push(b"ab").unwrap(), Vec::<Vec<u8>>::new());
        assert!(b.has_partial());
        assert_eq!(
            b.push(b"c\n\n  \nde\nf").unwrap(),
            vec![b"abc".to_vec(), b"de".to_vec()]
        );
        assert_eq!(b.push(b"\n").unwrap(), vec![b"f".to_vec()]);
        assert!(!b.has_partial());
    }

    #[test]
    fn a_long_line_is_an_error_whether_finished_or_not() {
        assert_eq!(
            LineBuffer::new(3).push(b"abcd\n"),
            Err(LineTooLong { max: 3 })
        );
        let mut b = LineBuffer::new(3);
        b.push(b"ab").unwrap();
        assert_eq!(b.push(b"cd"), Err(LineTooLong { max: 3 }));
    }
}
