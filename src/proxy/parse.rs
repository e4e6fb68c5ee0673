//! Extracts what routing needs from an OpenAI request body, borrowing from the raw bytes.
//!
//! Invariants:
//! - Reads only `model`, `messages` / `prompt` / `input` / `instructions`, `tools`, `stream`,
//!   `cache_salt` and the output bound (`max_tokens`, `max_completion_tokens`,
//!   `max_output_tokens`) and vLLM's `priority`; every other field is validated and skipped by [`super::json::Reader`], and the
//!   caller forwards the original bytes, so unknown fields and formatting survive untouched.
//! - Never allocates a copy of message text unless it has escapes or arrives as several parts.
//! - A `null` field reads as absent; a field given twice, or with the wrong type, is an
//!   [`GatewayError::InvalidField`] naming it; broken JSON is [`GatewayError::MalformedJson`].

use super::json::{Kind, Reader};
use crate::error::GatewayError;
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
    /// The output bound: `max_tokens`, `max_completion_tokens` or (Responses API)
    /// `max_output_tokens`, whichever is smallest, when a non-negative integer. Anything else is
    /// left for the engine to judge (it is forwarded unchanged either way).
    pub max_tokens: Option<u32>,
    /// vLLM's `priority` (lower is more urgent), when an integer; anything else is left for the
    /// engine to judge.
    pub priority: Option<i64>,
    /// The prompt.
    pub prompt: Prompt<'a>,
}

/// A top-level field routing reads.
#[derive(Clone, Copy)]
enum Key {
    Model,
    Messages,
    Prompt,
    Input,
    Instructions,
    Tools,
    Stream,
    CacheSalt,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    Priority,
}

impl Key {
    fn of(name: &str) -> Option<Key> {
        Some(match name {
            "model" => Key::Model,
            "messages" => Key::Messages,
            "prompt" => Key::Prompt,
            "input" => Key::Input,
            "instructions" => Key::Instructions,
            "tools" => Key::Tools,
            "stream" => Key::Stream,
            "cache_salt" => Key::CacheSalt,
            "max_tokens" => Key::MaxTokens,
            "max_completion_tokens" => Key::MaxCompletionTokens,
            "max_output_tokens" => Key::MaxOutputTokens,
            "priority" => Key::Priority,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Key::Model => "model",
            Key::Messages => "messages",
            Key::Prompt => "prompt",
            Key::Input => "input",
            Key::Instructions => "instructions",
            Key::Tools => "tools",
            Key::Stream => "stream",
            Key::CacheSalt => "cache_salt",
            Key::MaxTokens => "max_tokens",
            Key::MaxCompletionTokens => "max_completion_tokens",
            Key::MaxOutputTokens => "max_output_tokens",
            Key::Priority => "priority",
        }
    }
}

/// The top-level fields as read (`null` reads as absent), before the endpoint picks its prompt.
#[derive(Default)]
struct Fields<'a> {
    model: Option<Cow<'a, str>>,
    messages: Option<Vec<Message<'a>>>,
    prompt: Option<Value<'a>>,
    input: Option<Value<'a>>,
    instructions: Option<Cow<'a, str>>,
    tools: Option<&'a str>,
    stream: Option<bool>,
    cache_salt: Option<Cow<'a, str>>,
    max_tokens: Option<u32>,
    priority: Option<i64>,
}

/// A chat message or Responses API item as read.
struct Message<'a> {
    role: Option<Cow<'a, str>>,
    /// Responses API items carry a `type` instead of a role for non-message items.
    kind: Option<Cow<'a, str>>,
    content: Cow<'a, str>,
}

/// `prompt` / `input`: a string, strings, token ids, token-id arrays, or (Responses API) message
/// items. Batches route by their first element.
enum Value<'a> {
    Text(Cow<'a, str>),
    Tokens(Vec<u32>),
    Items(Vec<Message<'a>>),
}

/// A value of the wrong kind for `field`. The value is skipped first, so a malformed one
/// (`fals`, `1.`) is reported as malformed JSON rather than as a wrong type.
fn wrong(r: &mut Reader<'_>, field: &'static str, expected: &str, found: Kind) -> GatewayError {
    if let Err(e) = r.skip_value() {
        return e.into();
    }
    invalid(
        field,
        format!("expected {expected}, found {}", found.describe()),
    )
}

fn once<T>(slot: &mut Option<T>, field: &'static str) -> Result<(), GatewayError> {
    if slot.is_some() {
        return Err(invalid(field, "appears more than once"));
    }
    Ok(())
}

fn string<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Cow<'a, str>, GatewayError> {
    match r.expect_value()? {
        Kind::String => Ok(r.string()?),
        k => Err(wrong(r, field, "a string", k)),
    }
}

fn fields<'a>(r: &mut Reader<'a>) -> Result<Fields<'a>, GatewayError> {
    let mut f = Fields::default();
    let mut seen = 0u16;
    r.begin_object()?;
    let mut first = true;
    while let Some(name) = r.next_key(&mut first)? {
        let Some(key) = Key::of(&name) else {
            r.skip_value()?;
            continue;
        };
        let field = key.name();
        let bit = 1u16 << key as u16;
        if seen & bit != 0 {
            return Err(invalid(field, "appears more than once"));
        }
        seen |= bit;
        if r.take_null()? {
            continue;
        }
        match key {
            Key::Model => f.model = Some(string(r, field)?),
            Key::Messages => f.messages = Some(messages(r, field)?),
            Key::Prompt => f.prompt = Some(value(r, field)?),
            Key::Input => f.input = Some(value(r, field)?),
            Key::Instructions => f.instructions = Some(string(r, field)?),
            Key::Tools => f.tools = Some(r.raw()?),
            Key::Stream => match r.expect_value()? {
                Kind::Bool => f.stream = r.literal()?,
                k => return Err(wrong(r, field, "a boolean", k)),
            },
            Key::CacheSalt => f.cache_salt = Some(string(r, field)?),
            Key::MaxTokens | Key::MaxCompletionTokens | Key::MaxOutputTokens => {
                if let Some(n) = integer::<u32>(r)? {
                    f.max_tokens = Some(f.max_tokens.map_or(n, |m| m.min(n)));
                }
            }
            Key::Priority => f.priority = integer(r)?,
        }
    }
    Ok(f)
}

/// An integer that fits `T` (an output bound: `u32`, so non-negative; a priority: `i64`), else
/// `None` (skipped, not rejected: the engine decides what it accepts). Malformed JSON is still an
/// error.
fn integer<T: std::str::FromStr>(r: &mut Reader<'_>) -> Result<Option<T>, GatewayError> {
    match r.expect_value()? {
        Kind::Number => {
            let (digits, integer) = r.number()?;
            // `-0` is read as a float by serde_json (so by engines built on it): not an integer.
            Ok(if integer && digits != "-0" {
                digits.parse().ok()
            } else {
                None
            })
        }
        _ => {
            r.skip_value()?;
            Ok(None)
        }
    }
}

fn messages<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Vec<Message<'a>>, GatewayError> {
    match r.expect_value()? {
        Kind::Array => {}
        k => return Err(wrong(r, field, "an array of messages", k)),
    }
    r.begin_array()?;
    items(r, &mut true, Vec::new(), |r| message_item(r, field))
}

/// Reads the rest of the current array with `item`, after `out`.
fn items<'a, T>(
    r: &mut Reader<'a>,
    first: &mut bool,
    mut out: Vec<T>,
    mut item: impl FnMut(&mut Reader<'a>) -> Result<T, GatewayError>,
) -> Result<Vec<T>, GatewayError> {
    while r.next_item(first)? {
        out.push(item(r)?);
    }
    Ok(out)
}

fn message_item<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Message<'a>, GatewayError> {
    match r.expect_value()? {
        Kind::Object => {}
        k => return Err(wrong(r, field, "message objects", k)),
    }
    let (mut role, mut kind, mut content) = (None, None, None);
    r.begin_object()?;
    let mut first = true;
    while let Some(name) = r.next_key(&mut first)? {
        let slot = match &*name {
            "role" => &mut role,
            "type" => &mut kind,
            "content" => {
                once(&mut content, field)?;
                content = Some(text(r, field)?);
                continue;
            }
            _ => {
                r.skip_value()?;
                continue;
            }
        };
        once(slot, field)?;
        *slot = Some(if r.take_null()? {
            None
        } else {
            Some(string(r, field)?)
        });
    }
    Ok(Message {
        role: role.flatten(),
        kind: kind.flatten(),
        content: content.unwrap_or(Cow::Borrowed("")),
    })
}

/// Message content: a string (borrowed when unescaped), an array of parts whose texts are joined
/// by newlines, or anything else (null, objects, numbers) as empty.
fn text<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Cow<'a, str>, GatewayError> {
    match r.expect_value()? {
        Kind::String => Ok(r.string()?),
        Kind::Array => {
            r.begin_array()?;
            let mut joined: Option<Cow<'a, str>> = None;
            let mut first = true;
            while r.next_item(&mut first)? {
                let Some(t) = part(r, field)? else { continue };
                joined = Some(match joined {
                    None => t,
                    Some(prev) => {
                        let mut s = prev.into_owned();
                        s.push('\n');
                        s.push_str(&t);
                        Cow::Owned(s)
                    }
                });
            }
            Ok(joined.unwrap_or(Cow::Borrowed("")))
        }
        _ => {
            r.skip_value()?;
            Ok(Cow::Borrowed(""))
        }
    }
}

/// One element of a content-part array: a part object's `text`, or a bare string.
fn part<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Option<Cow<'a, str>>, GatewayError> {
    match r.expect_value()? {
        Kind::String => Ok(Some(r.string()?)),
        Kind::Object => {
            let mut found: Option<Option<Cow<'a, str>>> = None;
            r.begin_object()?;
            let mut first = true;
            while let Some(name) = r.next_key(&mut first)? {
                if name != "text" {
                    r.skip_value()?;
                    continue;
                }
                once(&mut found, field)?;
                found = Some(if r.take_null()? {
                    None
                } else {
                    Some(text(r, field)?)
                });
            }
            Ok(found.flatten())
        }
        Kind::Array | Kind::Null => {
            r.skip_value()?;
            Ok(None)
        }
        k => Err(wrong(r, field, "content parts", k)),
    }
}

fn value<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<Value<'a>, GatewayError> {
    match r.expect_value()? {
        Kind::String => return Ok(Value::Text(r.string()?)),
        Kind::Array => {}
        k => return Err(wrong(r, field, "a string or an array", k)),
    }
    r.begin_array()?;
    let mut first = true;
    if !r.next_item(&mut first)? {
        return Err(invalid(field, "must not be empty"));
    }
    match r.expect_value()? {
        Kind::String => {
            let t = r.string()?;
            r.skip_items(&mut first)?;
            Ok(Value::Text(t))
        }
        Kind::Number => {
            let head = vec![token(r, field)?];
            Ok(Value::Tokens(items(r, &mut first, head, |r| {
                token(r, field)
            })?))
        }
        Kind::Array => {
            r.begin_array()?;
            let ids = items(r, &mut true, Vec::new(), |r| token(r, field))?;
            r.skip_items(&mut first)?;
            Ok(Value::Tokens(ids))
        }
        Kind::Object => {
            let head = vec![message_item(r, field)?];
            Ok(Value::Items(items(r, &mut first, head, |r| {
                message_item(r, field)
            })?))
        }
        k => Err(wrong(r, field, "strings, token ids or message items", k)),
    }
}

fn token(r: &mut Reader<'_>, field: &'static str) -> Result<u32, GatewayError> {
    match r.expect_value()? {
        Kind::Number => {}
        k => return Err(wrong(r, field, "token ids", k)),
    }
    let (digits, integer) = r.number()?;
    if !integer || digits.starts_with('-') {
        return Err(invalid(field, "token ids must be non-negative integers"));
    }
    digits
        .parse()
        .map_err(|_| invalid(field, "token id out of range"))
}

/// Body length from which UTF-8 is validated with vector instructions (`benches/parse.rs`: they
/// slowed a 150-byte body by a third and sped a 32 KiB one up by a sixth).
const SIMD_UTF8_FROM: usize = 1024;

/// Parses `body` for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RouteInput<'_>, GatewayError> {
    // Long bodies are validated vectorized; short ones by the standard library, which finishes
    // them before the vector code has set up. The standard library also places an error.
    let valid = if body.len() >= SIMD_UTF8_FROM {
        simdutf8::basic::from_utf8(body).ok()
    } else {
        std::str::from_utf8(body).ok()
    };
    let text = valid.ok_or_else(|| {
        let at = std::str::from_utf8(body)
            .err()
            .map_or(0, |e| e.valid_up_to());
        GatewayError::MalformedJson(format!("body is not UTF-8 (invalid byte at {at})"))
    })?;
    let mut r = Reader::new(text);
    match r.peek() {
        Some(Kind::Object) => {}
        _ if r.at_end() => return Err(GatewayError::MalformedJson("empty body".into())),
        _ => {
            // Distinguish "not JSON at all" from "JSON, but not an object".
            r.skip_value()?;
            r.finish()?;
            return Err(GatewayError::NotAnObject);
        }
    }
    let w = fields(&mut r)?;
    r.finish()?;
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
                tools: w.tools,
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
            w.tools,
        )?,
    };
    Ok(RouteInput {
        model: w.model,
        stream: w.stream.unwrap_or(false),
        cache_salt: w.cache_salt,
        max_tokens: w.max_tokens,
        priority: w.priority,
        prompt,
    })
}

fn invalid(field: &'static str, message: impl Into<String>) -> GatewayError {
    GatewayError::InvalidField {
        field,
        message: message.into(),
    }
}

fn message<'a>(m: Message<'a>, field: &'static str) -> Result<ChatMessage<'a>, GatewayError> {
    let role = match (m.role, m.kind) {
        (Some(r), _) => r,
        (None, Some(k)) => k,
        (None, None) => return Err(invalid(field, "a message has no `role`")),
    };
    Ok(ChatMessage {
        role,
        content: m.content,
    })
}

fn text_or_tokens<'a>(v: Value<'a>, field: &'static str) -> Result<Prompt<'a>, GatewayError> {
    match v {
        Value::Text(t) => Ok(Prompt::Text(t)),
        Value::Tokens(ids) => Ok(Prompt::Tokens(ids)),
        Value::Items(_) => Err(invalid(field, "expected a string, strings or token ids")),
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
        Value::Tokens(_) => return Err(invalid("input", "expected a string or an array of items")),
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
    fn output_bounds_are_read_leniently() {
        let cases: [(&[u8], Option<u32>); 7] = [
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":64}"#, Some(64)),
            (
                br#"{"max_completion_tokens":100,"max_tokens":30,"messages":[{"role":"user","content":"x"}]}"#,
                Some(30),
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"64"}"#, None),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#, None),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#, None),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999}"#, None),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":null}"#, None),
        ];
        for (body, want) in cases {
            let r = parse(Endpoint::Chat, body).expect("valid");
            assert_eq!(r.max_tokens, want, "{}", String::from_utf8_lossy(body));
        }
        let r = parse(
            Endpoint::Responses,
            br#"{"input":"x","max_output_tokens":7}"#,
        )
        .expect("valid");
        assert_eq!(r.max_tokens, Some(7));
        // Malformed JSON inside the field is still malformed.
        assert!(parse(Endpoint::Chat, br#"{"messages":[],"max_tokens":1e}"#).is_err());
        assert!(parse(
            Endpoint::Chat,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_tokens":2}"#
        )
        .is_err());
    }

    #[test]
    fn priority_is_read_leniently() {
        let cases: [(&[u8], Option<i64>); 6] = [
            (br#"{"prompt":"x","priority":-3}"#, Some(-3)),
            (br#"{"prompt":"x","priority":0}"#, Some(0)),
            (br#"{"prompt":"x","priority":"high"}"#, None),
            (br#"{"prompt":"x","priority":1.5}"#, None),
            (br#"{"prompt":"x","priority":-0}"#, None),
            (br#"{"prompt":"x"}"#, None),
        ];
        for (body, want) in cases {
            let r = parse(Endpoint::Completions, body).expect("valid");
            assert_eq!(r.priority, want, "{}", String::from_utf8_lossy(body));
        }
        assert!(parse(Endpoint::Completions, br#"{"prompt":"x","priority":1e}"#).is_err());
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
    fn escaped_text_is_unescaped_and_keys_match_after_unescaping() {
        let body = br#"{"mod\u0065l":"m","messages":[{"role":"user","content":"a\"b\\c\u00e9\ud83d\ude00"}]}"#;
        let r = parse(Endpoint::Chat, body).unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        let Prompt::Chat { messages, .. } = r.prompt else {
            panic!()
        };
        assert_eq!(messages[0].content, "a\"b\\c\u{e9}\u{1f600}");
    }

    #[test]
    fn nulls_read_as_absent() {
        let body = br#"{"model":null,"stream":null,"tools":null,"messages":[{"role":"user","content":null}]}"#;
        let r = parse(Endpoint::Chat, body).unwrap();
        assert_eq!(r.model, None);
        assert!(!r.stream);
        let Prompt::Chat { messages, tools } = r.prompt else {
            panic!()
        };
        assert_eq!((messages[0].content.as_ref(), tools), ("", None));
        assert!(matches!(
            parse(Endpoint::Chat, br#"{"messages":null}"#),
            Err(GatewayError::MissingField("messages"))
        ));
    }

    #[test]
    fn tools_are_forwarded_raw() {
        let body =
            br#"{"messages":[{"role":"user","content":"x"}],"tools": [ {"type":"function"} ] }"#;
        let Prompt::Chat { tools, .. } = parse(Endpoint::Chat, body).unwrap().prompt else {
            panic!()
        };
        assert_eq!(tools, Some(r#"[ {"type":"function"} ]"#));
    }

    #[test]
    fn wrong_types_and_repeats_name_the_field() {
        use Endpoint::{Chat, Completions, Embeddings};
        let cases: [(Endpoint, &[u8], &str); 14] = [
            (Chat, br#"{"model":3}"#, "model"),
            (Chat, br#"{"stream":"yes"}"#, "stream"),
            (Chat, br#"{"messages":{}}"#, "messages"),
            (Chat, br#"{"messages":["hi"]}"#, "messages"),
            (
                Chat,
                br#"{"messages":[{"role":1,"content":"x"}]}"#,
                "messages",
            ),
            (
                Chat,
                br#"{"messages":[{"role":"u","content":[3]}]}"#,
                "messages",
            ),
            (Chat, br#"{"model":"a","model":"b"}"#, "model"),
            (
                Chat,
                br#"{"messages":[{"role":"a","role":"b"}]}"#,
                "messages",
            ),
            (Completions, br#"{"prompt":[1,-2]}"#, "prompt"),
            (Completions, br#"{"prompt":[1.5]}"#, "prompt"),
            (Completions, br#"{"prompt":[4294967296]}"#, "prompt"),
            (Completions, br#"{"prompt":[true]}"#, "prompt"),
            (Completions, br#"{"prompt":[]}"#, "prompt"),
            (Embeddings, br#"{"input":{}}"#, "input"),
        ];
        for (endpoint, body, expected) in cases {
            match parse(endpoint, body) {
                Err(GatewayError::InvalidField { field, .. }) => assert_eq!(field, expected),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn broken_json_is_malformed_even_after_the_fields_routing_reads() {
        for body in [
            &br#"{"messages":[{"role":"user","content":"x"}]"#[..],
            br#"{"messages":[{"role":"user","content":"x"}]} x"#,
            br#"{"messages":[{"role":"user","content":"x"}],"extra":[1,}"#,
            br#"{"messages":[{"role":"user","content":"tab	inside"}]}"#,
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
            br#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
            br#"[1,"#,
            br#"{"model":fals,"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"stream":tru,"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"messages":-[{"role":"user","content":"x"}]}"#,
        ] {
            assert!(
                matches!(
                    parse(Endpoint::Chat, body),
                    Err(GatewayError::MalformedJson(_))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn bodies_that_are_not_utf8_name_the_first_bad_byte() {
        let short = r#"{"messages":[{"role":"user","content":"héllo wörld, a longer text to cross vector widths: 0123456789abcdef0123456789abcdef"}]}"#;
        // Past SIMD_UTF8_FROM, so validated the other way.
        let long = short.replace("héllo", &"héllo wörld ".repeat(100));
        for valid in [short, long.as_str()] {
            bad_bytes_are_placed(valid);
        }
    }

    fn bad_bytes_are_placed(valid: &str) {
        assert!(parse(Endpoint::Chat, valid.as_bytes()).is_ok());
        // A stray continuation byte, a truncated sequence and an overlong encoding, at every
        // offset inside the content.
        let start = valid.find("héllo").unwrap();
        for bad in [&[0x80u8][..], &[0xe2, 0x82], &[0xc0, 0xaf]] {
            for at in start..valid.len() - 4 {
                if !valid.is_char_boundary(at) {
                    continue;
                }
                let mut body = valid.as_bytes()[..at].to_vec();
                body.extend_from_slice(bad);
                body.extend_from_slice(&valid.as_bytes()[at..]);
                match parse(Endpoint::Chat, &body) {
                    Err(GatewayError::MalformedJson(m)) => {
                        assert_eq!(m, format!("body is not UTF-8 (invalid byte at {at})"))
                    }
                    other => panic!("{at}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn batches_route_by_their_first_element() {
        let p = |b: &'static [u8]| parse(Endpoint::Completions, b).map(|r| r.prompt);
        assert_eq!(
            p(br#"{"prompt":["a",{"any":[1]},3]}"#).unwrap(),
            Prompt::Text("a".into())
        );
        assert_eq!(
            p(br#"{"prompt":[[1,2],"anything"]}"#).unwrap(),
            Prompt::Tokens(vec![1, 2])
        );
        let r = parse(
            Endpoint::Responses,
            br#"{"input":[{"role":"user","content":"q"},{"type":"function_call_output","output":"r"}]}"#,
        )
        .unwrap();
        let Prompt::Chat { messages, .. } = r.prompt else {
            panic!()
        };
        assert_eq!(messages[1].role, "function_call_output");
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
