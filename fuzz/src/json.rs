//! Reference routing-field extraction over a `serde_json` tree, from `kvgate::proxy::parse`'s
//! contract, and the comparison the JSON targets run.
//!
//! The tree keeps objects as ordered lists of pairs so that repeated keys (an error for the fields
//! routing reads) stay visible; numbers keep serde_json's three kinds (unsigned, negative,
//! float — integers beyond `u64` arrive as floats).

use kvgate::error::GatewayError;
use kvgate::proxy::parse::{parse, Endpoint, Prompt, RouteInput};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON value, objects in document order with repeats kept.
#[derive(Clone, Debug, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    U(u64),
    I(i64),
    F(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<J, E> {
                Ok(J::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<J, E> {
                Ok(J::U(n))
            }
            fn visit_i64<E>(self, n: i64) -> Result<J, E> {
                Ok(if n >= 0 { J::U(n as u64) } else { J::I(n) })
            }
            fn visit_f64<E>(self, n: f64) -> Result<J, E> {
                Ok(J::F(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<J, E> {
                Ok(J::Str(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<J, E> {
                Ok(J::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(kv) = a.next_entry::<String, J>()? {
                    v.push(kv);
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// The prompt, owned.
#[derive(Clone, Debug, PartialEq)]
pub enum RPrompt {
    Chat {
        messages: Vec<(String, String)>,
        tools: Option<J>,
    },
    Text(String),
    Tokens(Vec<u32>),
}

/// What routing reads, owned.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub model: Option<String>,
    pub stream: bool,
    pub cache_salt: Option<String>,
    pub max_tokens: Option<u32>,
    pub priority: Option<i64>,
    pub prompt: RPrompt,
}

/// An error as far as the contract fixes it: its kind and the field it names.
#[derive(Clone, Debug, PartialEq)]
pub enum RErr {
    Malformed,
    NotAnObject,
    Missing(&'static str),
    Invalid(&'static str),
}

struct Msg {
    role: Option<String>,
    kind: Option<String>,
    content: String,
}

enum Val {
    Text(String),
    Tokens(Vec<u32>),
    Items(Vec<Msg>),
}

const FIELDS: [&str; 12] = [
    "model",
    "messages",
    "prompt",
    "input",
    "instructions",
    "tools",
    "stream",
    "cache_salt",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "priority",
];

fn string(v: &J, field: &'static str) -> Result<String, RErr> {
    match v {
        J::Str(s) => Ok(s.clone()),
        _ => Err(RErr::Invalid(field)),
    }
}

fn message_item(v: &J, field: &'static str) -> Result<Msg, RErr> {
    let J::Obj(pairs) = v else {
        return Err(RErr::Invalid(field));
    };
    let (mut role, mut kind, mut content) = (None, None, None);
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "role" => &mut role,
            "type" => &mut kind,
            "content" => {
                if content.is_some() {
                    return Err(RErr::Invalid(field));
                }
                content = Some(text(v, field)?);
                continue;
            }
            _ => continue,
        };
        if slot.is_some() {
            return Err(RErr::Invalid(field));
        }
        *slot = Some(match v {
            J::Null => None,
            v => Some(string(v, field)?),
        });
    }
    Ok(Msg {
        role: role.flatten(),
        kind: kind.flatten(),
        content: content.unwrap_or_default(),
    })
}

fn text(v: &J, field: &'static str) -> Result<String, RErr> {
    match v {
        J::Str(s) => Ok(s.clone()),
        J::Arr(items) => {
            let mut parts = Vec::new();
            for item in items {
                if let Some(t) = part(item, field)? {
                    parts.push(t);
                }
            }
            Ok(parts.join("\n"))
        }
        _ => Ok(String::new()),
    }
}

fn part(v: &J, field: &'static str) -> Result<Option<String>, RErr> {
    match v {
        J::Str(s) => Ok(Some(s.clone())),
        J::Obj(pairs) => {
            let mut found: Option<Option<String>> = None;
            for (k, v) in pairs {
                if k != "text" {
                    continue;
                }
                if found.is_some() {
                    return Err(RErr::Invalid(field));
                }
                found = Some(match v {
                    J::Null => None,
                    v => Some(text(v, field)?),
                });
            }
            Ok(found.flatten())
        }
        J::Arr(_) | J::Null => Ok(None),
        _ => Err(RErr::Invalid(field)),
    }
}

fn token(v: &J, field: &'static str) -> Result<u32, RErr> {
    match v {
        J::U(n) => u32::try_from(*n).map_err(|_| RErr::Invalid(field)),
        _ => Err(RErr::Invalid(field)),
    }
}

fn value(v: &J, field: &'static str) -> Result<Val, RErr> {
    let items = match v {
        J::Str(s) => return Ok(Val::Text(s.clone())),
        J::Arr(items) => items,
        _ => return Err(RErr::Invalid(field)),
    };
    let Some(first) = items.first() else {
        return Err(RErr::Invalid(field));
    };
    match first {
        J::Str(s) => Ok(Val::Text(s.clone())),
        J::U(_) | J::I(_) | J::F(_) => items
            .iter()
            .map(|t| token(t, field))
            .collect::<Result<_, _>>()
            .map(Val::Tokens),
        J::Arr(ids) => ids
            .iter()
            .map(|t| token(t, field))
            .collect::<Result<_, _>>()
            .map(Val::Tokens),
        J::Obj(_) => items
            .iter()
            .map(|m| message_item(m, field))
            .collect::<Result<_, _>>()
            .map(Val::Items),
        _ => Err(RErr::Invalid(field)),
    }
}

fn message(m: Msg, field: &'static str) -> Result<(String, String), RErr> {
    let role = m.role.or(m.kind).ok_or(RErr::Invalid(field))?;
    Ok((role, m.content))
}

/// What `parse(endpoint, doc)` must give, by the contract.
pub fn route(endpoint: Endpoint, doc: &J) -> Result<Route, RErr> {
    let J::Obj(pairs) = doc else {
        return Err(RErr::NotAnObject);
    };
    let mut seen = [false; FIELDS.len()];
    let (mut model, mut messages, mut prompt, mut input) = (None, None, None, None);
    let (mut instructions, mut tools, mut stream, mut salt) = (None, None, None, None);
    let mut max_tokens: Option<u32> = None;
    let mut priority: Option<i64> = None;
    for (k, v) in pairs {
        let Some(i) = FIELDS.iter().position(|f| f == k) else {
            continue;
        };
        let field = FIELDS[i];
        if std::mem::replace(&mut seen[i], true) {
            return Err(RErr::Invalid(field));
        }
        if *v == J::Null {
            continue;
        }
        match field {
            "model" => model = Some(string(v, field)?),
            "instructions" => instructions = Some(string(v, field)?),
            "cache_salt" => salt = Some(string(v, field)?),
            "messages" => {
                let J::Arr(items) = v else {
                    return Err(RErr::Invalid(field));
                };
                messages = Some(
                    items
                        .iter()
                        .map(|m| message_item(m, field))
                        .collect::<Result<Vec<_>, _>>()?,
                );
            }
            "prompt" => prompt = Some(value(v, field)?),
            "input" => input = Some(value(v, field)?),
            "tools" => tools = Some(v.clone()),
            "stream" => match v {
                J::Bool(b) => stream = Some(*b),
                _ => return Err(RErr::Invalid(field)),
            },
            // An integer that fits i64, else skipped (the engine decides).
            "priority" => {
                priority = match v {
                    J::U(n) => i64::try_from(*n).ok(),
                    J::I(n) => Some(*n),
                    _ => None,
                }
            }
            _ => {
                if let J::U(n) = v {
                    if let Ok(n) = u32::try_from(*n) {
                        max_tokens = Some(max_tokens.map_or(n, |m| m.min(n)));
                    }
                }
            }
        }
    }
    let text_or_tokens = |v: Val, field: &'static str| match v {
        Val::Text(t) => Ok(RPrompt::Text(t)),
        Val::Tokens(t) => Ok(RPrompt::Tokens(t)),
        Val::Items(_) => Err(RErr::Invalid(field)),
    };
    let prompt = match endpoint {
        Endpoint::Chat => {
            let msgs = messages.ok_or(RErr::Missing("messages"))?;
            if msgs.is_empty() {
                return Err(RErr::Invalid("messages"));
            }
            RPrompt::Chat {
                messages: msgs
                    .into_iter()
                    .map(|m| message(m, "messages"))
                    .collect::<Result<_, _>>()?,
                tools,
            }
        }
        Endpoint::Completions => text_or_tokens(prompt.ok_or(RErr::Missing("prompt"))?, "prompt")?,
        Endpoint::Embeddings => text_or_tokens(input.ok_or(RErr::Missing("input"))?, "input")?,
        Endpoint::Responses => {
            let v = input.ok_or(RErr::Missing("input"))?;
            let mut msgs = Vec::new();
            if let Some(i) = instructions {
                msgs.push(("system".to_owned(), i));
            }
            match v {
                Val::Text(t) if msgs.is_empty() && tools.is_none() => RPrompt::Text(t),
                Val::Text(t) => {
                    msgs.push(("user".to_owned(), t));
                    RPrompt::Chat {
                        messages: msgs,
                        tools,
                    }
                }
                Val::Items(items) => {
                    for m in items {
                        msgs.push(message(m, "input")?);
                    }
                    RPrompt::Chat {
                        messages: msgs,
                        tools,
                    }
                }
                Val::Tokens(_) => return Err(RErr::Invalid("input")),
            }
        }
    };
    Ok(Route {
        model,
        stream: stream.unwrap_or(false),
        cache_salt: salt,
        max_tokens,
        priority,
        prompt,
    })
}

/// kvgate's answer in the reference's terms.
pub fn ours(r: Result<RouteInput<'_>, GatewayError>) -> Result<Route, RErr> {
    let r = r.map_err(|e| match e {
        GatewayError::MalformedJson(_) => RErr::Malformed,
        GatewayError::NotAnObject => RErr::NotAnObject,
        GatewayError::MissingField(f) => RErr::Missing(f),
        GatewayError::InvalidField { field, .. } => RErr::Invalid(field),
        other => panic!("parse returned an error outside its contract: {other:?}"),
    })?;
    let prompt = match r.prompt {
        Prompt::Chat { messages, tools } => RPrompt::Chat {
            messages: messages
                .into_iter()
                .map(|m| (m.role.into_owned(), m.content.into_owned()))
                .collect(),
            tools: tools.map(|t| {
                serde_json::from_str::<J>(t).unwrap_or_else(|e| {
                    // Raw `tools` is skipped, so it may hold what serde_json skips but will not
                    // build (a lone surrogate); then the whole document did not build either
                    // and this value is never compared.
                    let skips = serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok();
                    assert!(skips, "raw `tools` {t:?} is not JSON: {e}");
                    J::Null
                })
            }),
        },
        Prompt::Text(t) => RPrompt::Text(t.into_owned()),
        Prompt::Tokens(t) => RPrompt::Tokens(t),
    };
    Ok(Route {
        model: r.model.map(|m| m.into_owned()),
        stream: r.stream,
        cache_salt: r.cache_salt.map(|m| m.into_owned()),
        max_tokens: r.max_tokens,
        priority: r.priority,
        prompt,
    })
}

/// The endpoint a fuzz input's selector byte names.
pub fn endpoint(b: u8) -> Endpoint {
    match b % 4 {
        0 => Endpoint::Chat,
        1 => Endpoint::Completions,
        2 => Endpoint::Embeddings,
        _ => Endpoint::Responses,
    }
}

/// Runs `parse(endpoint, body)` and checks it against serde_json and the reference.
pub fn check_route(endpoint: Endpoint, body: &[u8]) {
    let got = ours(parse(endpoint, body));
    let Ok(text) = std::str::from_utf8(body) else {
        assert_eq!(got, Err(RErr::Malformed), "non-UTF-8 body accepted");
        return;
    };
    let skips = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
    match serde_json::from_str::<J>(text) {
        Ok(doc) => {
            let want = route(endpoint, &doc);
            assert_eq!(got, want, "{endpoint:?} {text:?}");
        }
        // Valid JSON whose tree serde_json will not build: an unpaired `\uD800` surrogate (an
        // error in kvgate too wherever the string is read, not where it is skipped) or a number
        // beyond f64 (skipped or read as a non-integer by kvgate). Anything but a panic goes.
        Err(_) if skips => {}
        Err(e) => {
            // Not JSON: an error, and one found before the whole document was validated
            // (`NotAnObject` and `MissingField` come only after).
            assert!(
                matches!(got, Err(RErr::Malformed | RErr::Invalid(_))),
                "serde_json rejects ({e}) but parse gave {got:?}: {text:?}"
            );
        }
    }
}
