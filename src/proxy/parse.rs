//! Extracts what routing needs from an OpenAI request body, borrowing from the raw bytes.
//!
//! Invariants:
//! - Reads only `model`, `messages` / `prompt` / `input` / `instructions`, `tools`, `stream` and
//!   `cache_salt`; every other field is skipped unparsed and the caller forwards the original bytes,
//!   so unknown fields and formatting survive untouched.
//! - Never allocates a copy of message text unless content arrives as an array of parts.

use crate::error::GatewayError;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::marker::PhantomData;

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
    /// The endpoint served at `path`, if any.
    pub fn for_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            "/v1/responses" => Some(Endpoint::Responses),
            _ => None,
        }
    }
    /// Upstream path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
        }
    }
    /// Index in [`crate::metrics::ROUTES`].
    pub fn index(self) -> usize {
        match self {
            Endpoint::Chat => 0,
            Endpoint::Completions => 1,
            Endpoint::Embeddings => 2,
            Endpoint::Responses => 3,
        }
    }
    /// Metric label.
    pub fn label(self) -> &'static str {
        crate::metrics::ROUTES[self.index()]
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
    messages: Option<Vec<WireMessage<'a>>>,
    #[serde(borrow, default)]
    prompt: Option<Value<'a>>,
    #[serde(borrow, default)]
    input: Option<Value<'a>>,
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
    content: Option<Text<'a>>,
    /// Responses API items carry a `type` instead of a role for non-message items.
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WirePart<'a> {
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
}

/// Message content in one pass: a string (borrowed when unescaped), an array of parts whose
/// `text` fields are joined by newlines, or anything else (null, objects) as empty.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor(PhantomData))
    }
}

struct TextVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
    type Value = Text<'a>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string or an array of content parts")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed("")))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut first: Option<Cow<'a, str>> = None;
        let mut joined = String::new();
        while let Some(part) = seq.next_element::<PartOrText<'a>>()? {
            let Some(t) = part.0 else { continue };
            match first.take() {
                None if joined.is_empty() => first = Some(t),
                None => {
                    joined.push('\n');
                    joined.push_str(&t);
                }
                Some(f) => {
                    joined.push_str(&f);
                    joined.push('\n');
                    joined.push_str(&t);
                }
            }
        }
        Ok(Text(match first {
            Some(f) => f,
            None => Cow::Owned(joined),
        }))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map
            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Text(Cow::Borrowed("")))
    }
}

/// One element of a content-part array: a part object's `text`, or a bare string.
struct PartOrText<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for PartOrText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = PartOrText<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a content part")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(PartOrText(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PartOrText(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let p = WirePart::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(PartOrText(p.text.map(|t| t.0)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(PartOrText(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(PartOrText(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// `prompt` / `input` in one pass: a string, strings, token ids, token-id arrays, or (Responses
/// API) message items. Batches route by their first element.
enum Value<'a> {
    Text(Cow<'a, str>),
    Tokens(Vec<u32>),
    Items(Vec<WireMessage<'a>>),
    Empty,
}

enum Item<'a> {
    Str(Cow<'a, str>),
    Int(u32),
    Seq(Vec<u32>),
    Msg(WireMessage<'a>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Item<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, a token id, a token-id array or a message item")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Item::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Item::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                u32::try_from(v)
                    .map(Item::Int)
                    .map_err(|_| E::custom("token id out of range"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<u32>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Item::Seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                WireMessage::deserialize(de::value::MapAccessDeserializer::new(map)).map(Item::Msg)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Value<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Value<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, strings, token ids or message items")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Value::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Value::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Value::Empty)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let Some(first) = seq.next_element::<Item<'a>>()? else {
                    return Err(de::Error::custom("must not be empty"));
                };
                let out = match first {
                    Item::Str(s) => Value::Text(s),
                    Item::Seq(ids) => Value::Tokens(ids),
                    Item::Int(id) => {
                        let mut ids = vec![id];
                        while let Some(next) = seq.next_element::<u32>()? {
                            ids.push(next);
                        }
                        return Ok(Value::Tokens(ids));
                    }
                    Item::Msg(m) => {
                        let mut items = vec![m];
                        while let Some(next) = seq.next_element::<WireMessage<'a>>()? {
                            items.push(next);
                        }
                        return Ok(Value::Items(items));
                    }
                };
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Parses `body` for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RouteInput<'_>, GatewayError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            // Distinguish "not JSON at all" from "JSON, but not an object".
            return match serde_json::from_slice::<de::IgnoredAny>(body) {
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
            let msgs = w.messages.ok_or(GatewayError::MissingField("messages"))?;
            if msgs.is_empty() {
                return Err(invalid("messages", "must contain at least one message"));
            }
            Prompt::Chat {
                messages: msgs
                    .into_iter()
                    .map(|m| message(m, "messages"))
                    .collect::<Result<_, _>>()?,
                tools: w.tools.map(RawValue::get),
            }
        }
        Endpoint::Completions => text_or_tokens(
            w.prompt.ok_or(GatewayError::MissingField("prompt"))?,
            "prompt",
        )?,
        Endpoint::Embeddings => {
            text_or_tokens(w.input.ok_or(GatewayError::MissingField("input"))?, "input")?
        }
        Endpoint::Responses => responses_input(
            w.input.ok_or(GatewayError::MissingField("input"))?,
            w.instructions,
            w.tools.map(RawValue::get),
        )?,
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

fn message<'a>(m: WireMessage<'a>, field: &'static str) -> Result<ChatMessage<'a>, GatewayError> {
    let role = match (m.role, m.kind) {
        (Some(r), _) => r,
        (None, Some(k)) => k,
        (None, None) => return Err(invalid(field, "a message has no `role`")),
    };
    Ok(ChatMessage {
        role,
        content: m.content.map(|t| t.0).unwrap_or(Cow::Borrowed("")),
    })
}

fn text_or_tokens<'a>(v: Value<'a>, field: &'static str) -> Result<Prompt<'a>, GatewayError> {
    match v {
        Value::Text(t) => Ok(Prompt::Text(t)),
        Value::Tokens(ids) => Ok(Prompt::Tokens(ids)),
        Value::Items(_) | Value::Empty => {
            Err(invalid(field, "expected a string, strings or token ids"))
        }
    }
}

fn responses_input<'a>(
    v: Value<'a>,
    instructions: Option<Cow<'a, str>>,
    tools: Option<&'a str>,
) -> Result<Prompt<'a>, GatewayError> {
    let mut msgs = Vec::new();
    if let Some(i) = instructions {
        msgs.push(ChatMessage {
            role: Cow::Borrowed("system"),
            content: i,
        });
    }
    match v {
        Value::Text(text) => {
            if msgs.is_empty() && tools.is_none() {
                return Ok(Prompt::Text(text));
            }
            msgs.push(ChatMessage {
                role: Cow::Borrowed("user"),
                content: text,
            });
        }
        Value::Items(items) => {
            for m in items {
                msgs.push(message(m, "input")?);
            }
        }
        Value::Tokens(_) | Value::Empty => {
            return Err(invalid("input", "expected a string or an array of items"))
        }
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
