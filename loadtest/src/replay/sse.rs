//! Incremental Server-Sent Events parsing of OpenAI streaming responses.
//!
//! Bytes arrive in arbitrary chunks; the parser buffers at most [`MAX_LINE`] bytes of an
//! unfinished line and yields each complete `data:` payload. Only the fields a load tester
//! needs are decoded from a payload (content presence and usage), borrowing where possible.

use std::borrow::Cow;

use serde::Deserialize;

/// Longest accepted SSE line; a longer one means a broken or hostile stream.
pub const MAX_LINE: usize = 16 << 20;

/// Splits a byte stream into `data:` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current unfinished line.
    buf: Vec<u8>,
}

/// The line limit was exceeded.
#[derive(Debug, thiserror::Error)]
#[error("SSE line longer than {MAX_LINE} bytes")]
pub struct LineTooLong;

impl SseParser {
    /// Feeds bytes, calling `on_data` with each complete `data:` payload (trimmed).
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<(), LineTooLong> {
        while let Some(pos) = bytes.iter().position(|&b| b == b'\n') {
            let (head, rest) = bytes.split_at(pos);
            bytes = &rest[1..];
            if self.buf.is_empty() {
                handle_line(head, &mut on_data);
            } else {
                self.buf.extend_from_slice(head);
                let line = std::mem::take(&mut self.buf);
                handle_line(&line, &mut on_data);
                self.buf = line;
                self.buf.clear();
            }
        }
        if self.buf.len() + bytes.len() > MAX_LINE {
            return Err(LineTooLong);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }
}

fn handle_line(line: &[u8], on_data: &mut impl FnMut(&[u8])) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Some(rest) = line.strip_prefix(b"data:") {
        on_data(rest.trim_ascii());
    }
}

/// The parts of a streamed chunk the load tester reads.
#[derive(Debug, Deserialize)]
pub struct Chunk<'a> {
    /// Choices in this chunk.
    #[serde(default, borrow)]
    pub choices: Vec<Choice<'a>>,
    /// Token usage (sent once, with `stream_options.include_usage`).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// An error object sent in-stream.
    #[serde(default)]
    pub error: Option<serde::de::IgnoredAny>,
}

/// One choice of a chunk.
#[derive(Debug, Deserialize)]
pub struct Choice<'a> {
    /// Chat delta.
    #[serde(default, borrow)]
    pub delta: Option<Delta<'a>>,
    /// Completions text.
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
}

/// Chat delta fields that carry generated tokens.
#[derive(Debug, Deserialize)]
pub struct Delta<'a> {
    /// Generated content.
    #[serde(default, borrow)]
    pub content: Option<Cow<'a, str>>,
    /// Reasoning content (some servers stream it separately).
    #[serde(default, borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
}

/// Usage block.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Usage {
    /// Prompt tokens the server counted.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: Option<u32>,
    /// Cached-token details.
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PromptDetails {
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

impl Chunk<'_> {
    /// True when the chunk carries generated text.
    pub fn has_token(&self) -> bool {
        self.choices.iter().any(|c| {
            c.text.as_deref().is_some_and(|t| !t.is_empty())
                || c.delta.as_ref().is_some_and(|d| {
                    d.content.as_deref().is_some_and(|t| !t.is_empty())
                        || d.reasoning_content
                            .as_deref()
                            .is_some_and(|t| !t.is_empty())
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_across_chunks() {
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for part in [
            &b"data: {\"a\""[..],
            b":1}\r\n\r\ndata: [DO",
            b"NE]\n\n: comment\n",
        ] {
            p.feed(part, |d| got.push(String::from_utf8_lossy(d).into_owned()))
                .unwrap();
        }
        assert_eq!(got, vec!["{\"a\":1}", "[DONE]"]);
    }

    #[test]
    fn line_limit() {
        let mut p = SseParser::default();
        let big = vec![b'x'; MAX_LINE + 1];
        assert!(p.feed(&big, |_| {}).is_err());
    }

    #[test]
    fn chunk_fields() {
        let c: Chunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        )
        .unwrap();
        assert!(!c.has_token());
        let c: Chunk =
            serde_json::from_str(r#"{"choices":[{"delta":{"content":" hi\n"}}]}"#).unwrap();
        assert!(c.has_token());
        let c: Chunk = serde_json::from_str(r#"{"choices":[{"text":"x"}]}"#).unwrap();
        assert!(c.has_token());
        let c: Chunk = serde_json::from_str(
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        )
        .unwrap();
        let u = c.usage.unwrap();
        assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, Some(4));
        assert_eq!(u.completion_tokens, Some(2));
    }
}
