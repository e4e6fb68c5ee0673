//! Reference SSE event count, from `kvgate::proxy::body::Events`' contract: each event starts
//! with `data:` at the start of a line, and `data: [DONE]` is not an event.
//!
//! Precisely, over the whole stream at once: for every line start (offset 0, or just after a
//! `\n`) followed by `data:`, let `s` be what follows `data:` to the end of the stream, less one
//! leading space. The line is an event once a byte of `s` shows it is not `[DONE]`: `s` is not
//! empty, does not start with `[DONE]`, and is not a proper prefix of `[DONE]` (a stream that
//! stops there has not said yet).

/// Events in the whole of `stream`.
pub fn count(stream: &[u8]) -> u32 {
    const DONE: &[u8] = b"[DONE]";
    let mut n = 0u32;
    for start in 0..stream.len() {
        if start > 0 && stream[start - 1] != b'\n' {
            continue;
        }
        let Some(rest) = stream[start..].strip_prefix(b"data:") else {
            continue;
        };
        let s = rest.strip_prefix(b" ").unwrap_or(rest);
        let undecided = s.len() < DONE.len() && DONE.starts_with(s);
        if !undecided && !s.starts_with(DONE) {
            n = n.saturating_add(1);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_like_the_contract() {
        assert_eq!(super::count(b"data: a\n\ndata: [DONE]\n\n"), 1);
        assert_eq!(super::count(b"data:"), 0);
        assert_eq!(super::count(b"data:\n"), 1);
        assert_eq!(super::count(b"data: [DO"), 0);
        assert_eq!(super::count(b"data: [DOX"), 1);
        assert_eq!(super::count(b"xdata: a\ndata:  [DONE]"), 1);
    }
}
