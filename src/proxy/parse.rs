//! Extracts what routing needs from an OpenAI request body, borrowing from the raw bytes.
//!
//! Invariants:
//! - Reads only `model`, `messages` / `prompt` / `input` / `instructions`, `tools`, `stream` and
//!   `cache_salt`; every other field is skipped unparsed and the caller forwards the original bytes,
//!   so unknown fields and formatting survive untouched.
//! - Never allocates a copy of message text unless content arrives as an array of parts.

use crate::error::GatewayError;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The four proxied OpenAI endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/responses`
    Responses,
}

impl Endpoint {
    /// Upstream path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
        }
    }
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
        }
    }
}

/// One chat message as routing sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage<'a> {
    /// `role`.
    pub role: Cow<'a, str>,
    /// Text content (parts joined by newlines).
    pub content: Cow<'a, str>,
}

/// The prompt in the shape the request carried it.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt<'a> {
    /// Chat messages, with `tools` JSON if present.
    Chat {
        /// Messages in order.
        messages: Vec<ChatMessage<'a>>,
        /// Raw `tools` JSON.
        tools: Option<&'a str>,
    },
    /// Plain text (completions, embeddings, responses with a string input).
    Text(Cow<'a, str>),
    /// Pre-tokenized prompt.
    Tokens(Vec<u32>),
}

/// What routing needs from a request.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteInput<'a> {
    /// `model`, if present.
    pub model: Option<Cow<'a, str>>,
    /// `stream: true`.
    pub stream: bool,
    /// `cache_salt`, if present.
    pub cache_salt: Option<Cow<'a, str>>,
    /// The prompt.
    pub prompt: Prompt<'a>,
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    /// Responses API items carry a `type` instead of a role for non-message items.
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WirePart<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// Parses `body` for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RouteInput<'_>, GatewayError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'{') => {}
        Some(_) => {
            // Distinguish "not JSON at all" from "JSON, but not an object".
            return match serde_json::from_slice::<&RawValue>(body) {
                Ok(_) => Err(GatewayError::NotAnObject),
                Err(e) => Err(GatewayError::MalformedJson(e.to_string())),
            };
        }
        None => return Err(GatewayError::MalformedJson("empty body".into())),
    }
    let w: Wire<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            GatewayError::InvalidField {
                field: "body",
                message: e.to_string(),
            }
        } else {
            GatewayError::MalformedJson(e.to_string())
        }
    })?;
    let prompt = match endpoint {
        Endpoint::Chat => {
            let raw = w.messages.ok_or(GatewayError::MissingField("messages"))?;
            Prompt::Chat {
                messages: messages(raw, "messages")?,
                tools: w.tools.map(RawValue::get),
            }
        }
        Endpoint::Completions => {
            let raw = w.prompt.ok_or(GatewayError::MissingField("prompt"))?;
            text_or_tokens(raw, "prompt")?
        }
        Endpoint::Embeddings => {
            let raw = w.input.ok_or(GatewayError::MissingField("input"))?;
            text_or_tokens(raw, "input")?
        }
        Endpoint::Responses => {
            let raw = w.input.ok_or(GatewayError::MissingField("input"))?;
            responses_input(raw, w.instructions, w.tools.map(RawValue::get))?
        }
    };
    Ok(RouteInput {
        model: w.model,
        stream: w.stream.unwrap_or(false),
        cache_salt: w.cache_salt,
        prompt,
    })
}

fn invalid(field: &'static str, message: impl Into<String>) -> GatewayError {
    GatewayError::InvalidField {
        field,
        message: message.into(),
    }
}

/// A JSON string literal: borrowed when it has no escapes, decoded otherwise.
fn json_str<'a>(s: &'a str, field: &'static str) -> Result<Cow<'a, str>, GatewayError> {
    match serde_json::from_str::<&'a str>(s) {
        Ok(b) => Ok(Cow::Borrowed(b)),
        Err(_) => serde_json::from_str::<String>(s)
            .map(Cow::Owned)
            .map_err(|e| invalid(field, e.to_string())),
    }
}

fn messages<'a>(
    raw: &'a RawValue,
    field: &'static str,
) -> Result<Vec<ChatMessage<'a>>, GatewayError> {
    let items: Vec<WireMessage<'a>> = serde_json::from_str(raw.get())
        .map_err(|e| invalid(field, format!("expected an array of messages: {e}")))?;
    if items.is_empty() {
        return Err(invalid(field, "must contain at least one message"));
    }
    items.into_iter().map(|m| message(m, field)).collect()
}

fn message<'a>(m: WireMessage<'a>, field: &'static str) -> Result<ChatMessage<'a>, GatewayError> {
    let role = match (m.role, m.kind) {
        (Some(r), _) => r,
        (None, Some(k)) => k,
        (None, None) => return Err(invalid(field, "a message has no `role`")),
    };
    let content = match m.content {
        None => Cow::Borrowed(""),
        Some(raw) => content_text(raw, field)?,
    };
    Ok(ChatMessage { role, content })
}

/// Message content: a string, null, or an array of parts whose `text` fields are joined.
fn content_text<'a>(raw: &'a RawValue, field: &'static str) -> Result<Cow<'a, str>, GatewayError> {
    let s = raw.get();
    match s.as_bytes().first() {
        Some(b'"') => json_str(s, field),
        Some(b'[') => {
            let parts: Vec<WirePart<'a>> =
                serde_json::from_str(s).map_err(|e| invalid(field, e.to_string()))?;
            let mut out = String::new();
            for p in parts.into_iter().filter_map(|p| p.text) {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&p);
            }
            Ok(Cow::Owned(out))
        }
        Some(b'n') => Ok(Cow::Borrowed("")),
        // Other shapes (objects) still route: their raw JSON is the content.
        _ => Ok(Cow::Borrowed(s)),
    }
}

/// `prompt` / `input`: a string, an array of strings (the first routes), token ids, or an array of
/// token-id arrays (the first routes).
fn text_or_tokens<'a>(raw: &'a RawValue, field: &'static str) -> Result<Prompt<'a>, GatewayError> {
    let s = raw.get();
    match s.as_bytes().first() {
        Some(b'"') => Ok(Prompt::Text(json_str(s, field)?)),
        Some(b'[') => {
            let items: Vec<&'a RawValue> =
                serde_json::from_str(s).map_err(|e| invalid(field, e.to_string()))?;
            let Some(first) = items.first() else {
                return Err(invalid(field, "must not be empty"));
            };
            match first.get().as_bytes().first() {
                Some(b'"') | Some(b'[') => text_or_tokens(first, field),
                _ => {
                    let ids: Vec<u32> = serde_json::from_str(s).map_err(|e| {
                        invalid(
                            field,
                            format!("expected a string, strings or token ids: {e}"),
                        )
                    })?;
                    Ok(Prompt::Tokens(ids))
                }
            }
        }
        _ => Err(invalid(field, "expected a string, strings or token ids")),
    }
}

fn responses_input<'a>(
    raw: &'a RawValue,
    instructions: Option<Cow<'a, str>>,
    tools: Option<&'a str>,
) -> Result<Prompt<'a>, GatewayError> {
    let s = raw.get();
    let mut msgs = Vec::new();
    if let Some(i) = instructions {
        msgs.push(ChatMessage {
            role: Cow::Borrowed("system"),
            content: i,
        });
    }
    match s.as_bytes().first() {
        Some(b'"') => {
            let text = json_str(s, "input")?;
            if msgs.is_empty() && tools.is_none() {
                return Ok(Prompt::Text(text));
            }
            msgs.push(ChatMessage {
                role: Cow::Borrowed("user"),
                content: text,
            });
        }
        Some(b'[') => msgs.extend(messages(raw, "input")?),
        _ => return Err(invalid("input", "expected a string or an array of items")),
    }
    Ok(Prompt::Chat {
        messages: msgs,
        tools,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_borrows_and_ignores_unknown_fields() {
        let body = br#"{"model":"m","x_unknown":{"a":[1,2]},"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let r = parse(Endpoint::Chat, body).unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        assert!(r.stream);
        match r.prompt {
            Prompt::Chat { messages, .. } => {
                assert_eq!(messages[0].role, "user");
                assert!(matches!(messages[0].content, Cow::Borrowed("hi")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn content_parts_are_joined() {
        let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]}]}"#;
        let r = parse(Endpoint::Chat, body).unwrap();
        let Prompt::Chat { messages, .. } = r.prompt else {
            panic!()
        };
        assert_eq!(messages[0].content, "a\nb");
    }

    #[test]
    fn completions_shapes() {
        let p = |b: &'static [u8]| parse(Endpoint::Completions, b).map(|r| r.prompt);
        assert_eq!(p(br#"{"prompt":"x"}"#).unwrap(), Prompt::Text("x".into()));
        assert_eq!(
            p(br#"{"prompt":["y","z"]}"#).unwrap(),
            Prompt::Text("y".into())
        );
        assert_eq!(
            p(br#"{"prompt":[1,2,3]}"#).unwrap(),
            Prompt::Tokens(vec![1, 2, 3])
        );
        assert_eq!(
            p(br#"{"prompt":[[4],[5]]}"#).unwrap(),
            Prompt::Tokens(vec![4])
        );
        assert!(matches!(
            p(br#"{"prompt":5}"#),
            Err(GatewayError::InvalidField { .. })
        ));
        assert!(matches!(
            p(br#"{"prompt":[]}"#),
            Err(GatewayError::InvalidField { .. })
        ));
    }

    #[test]
    fn bad_bodies() {
        assert!(matches!(
            parse(Endpoint::Chat, b"{nope"),
            Err(GatewayError::MalformedJson(_))
        ));
        assert!(matches!(
            parse(Endpoint::Chat, b"[1]"),
            Err(GatewayError::NotAnObject)
        ));
        assert!(matches!(
            parse(Endpoint::Chat, b"  "),
            Err(GatewayError::MalformedJson(_))
        ));
        assert!(matches!(
            parse(Endpoint::Chat, b"{}"),
            Err(GatewayError::MissingField("messages"))
        ));
        assert!(matches!(
            parse(Endpoint::Completions, b"{}"),
            Err(GatewayError::MissingField("prompt"))
        ));
        assert!(matches!(
            parse(Endpoint::Embeddings, b"{}"),
            Err(GatewayError::MissingField("input"))
        ));
        assert!(matches!(
            parse(Endpoint::Chat, br#"{"messages":[]}"#),
            Err(GatewayError::InvalidField { .. })
        ));
        assert!(matches!(
            parse(Endpoint::Chat, br#"{"model":3,"messages":[]}"#),
            Err(GatewayError::InvalidField { .. })
        ));
    }

    #[test]
    fn responses_input_with_instructions_becomes_chat() {
        let r = parse(
            Endpoint::Responses,
            br#"{"input":"q","instructions":"be brief"}"#,
        )
        .unwrap();
        let Prompt::Chat { messages, .. } = r.prompt else {
            panic!()
        };
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].role, "system");
        let r = parse(Endpoint::Responses, br#"{"input":"q"}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Text("q".into()));
    }
}
