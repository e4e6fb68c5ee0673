//! Parsing of completion requests into what the engine needs.
//!
//! Invariants: every field is validated with a clear 400 on bad input; prompts are tokenized the
//! way vLLM does (chat: rendered template, no special tokens added; completions: special tokens
//! added, or token ids taken as given).

use kvgate_tokenizer::{ChatMessage, TokenMode};
use serde_json::Value;

/// Which endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A parsed request.
#[derive(Debug)]
pub struct Parsed {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Output tokens to produce.
    pub output_tokens: u32,
    /// Stream as SSE.
    pub stream: bool,
    /// Add a usage chunk at the end of the stream.
    pub include_usage: bool,
    /// `cache_salt`, if any.
    pub cache_salt: Option<String>,
    /// Model name to echo.
    pub model: Option<String>,
}

fn uint_field(body: &Value, key: &str) -> Result<Option<u32>, String> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a non-negative integer")),
    }
}

/// Token ids of the prompt part of a request.
pub fn prompt_tokens(kind: Kind, body: &Value, tm: &TokenMode) -> Result<Vec<u32>, String> {
    match kind {
        Kind::Chat => {
            let msgs = body.get("messages").ok_or("`messages` is required")?;
            if !msgs.is_array() || msgs.as_array().is_some_and(|a| a.is_empty()) {
                return Err("`messages` must be a non-empty array".into());
            }
            let messages: Vec<ChatMessage> = ChatMessage::from_openai_list(msgs)
                .ok_or("`messages` entries need a `role` and a `content`")?;
            let tools = body.get("tools").filter(|t| !t.is_null());
            tm.chat_tokens_with_tools(&messages, tools)
                .map_err(|e| format!("cannot render or tokenize the chat: {e}"))
        }
        Kind::Completion => match body.get("prompt") {
            Some(Value::String(s)) => tm
                .completion_tokens(s)
                .map_err(|e| format!("cannot tokenize the prompt: {e}")),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                let s = a[0].as_str().unwrap_or_default();
                tm.completion_tokens(s)
                    .map_err(|e| format!("cannot tokenize the prompt: {e}"))
            }
            Some(Value::Array(a)) if a.iter().all(|x| x.is_u64()) && !a.is_empty() => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| "token id out of range".to_string())
                })
                .collect(),
            Some(_) => {
                Err("`prompt` must be a string, a one-string array or an array of token ids".into())
            }
            None => Err("`prompt` is required".into()),
        },
    }
}

/// Parses and validates a request body.
pub fn parse(
    kind: Kind,
    body: &Value,
    tm: &TokenMode,
    default_max_tokens: u32,
    max_model_len: u32,
) -> Result<Parsed, String> {
    if !body.is_object() {
        return Err("the request body must be a JSON object".into());
    }
    let max_tokens = match uint_field(body, "max_completion_tokens")? {
        Some(v) => Some(v),
        None => uint_field(body, "max_tokens")?,
    };
    if max_tokens == Some(0) {
        return Err("`max_tokens` must be at least 1".into());
    }
    let min_tokens = uint_field(body, "min_tokens")?.unwrap_or(0);
    let output_tokens = max_tokens
        .unwrap_or(default_max_tokens)
        .max(min_tokens)
        .max(1);
    let tokens = prompt_tokens(kind, body, tm)?;
    if tokens.is_empty() {
        return Err("the prompt is empty".into());
    }
    let total = tokens.len() as u64 + u64::from(output_tokens);
    if total > u64::from(max_model_len) {
        return Err(format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens ({} in the messages, {output_tokens} in the completion).",
            tokens.len()
        ));
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("`stream` must be a boolean".into()),
    };
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cache_salt = match body.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`cache_salt` must be a string".into()),
    };
    let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
    Ok(Parsed {
        tokens,
        output_tokens,
        stream,
        include_usage,
        cache_salt,
        model,
    })
}
