//! Chat messages as a template sees them: a role and one text content.
//!
//! OpenAI requests may carry `content` as a string, `null`, or an array of content parts; only text
//! parts reach the template, joined with `"\n"` as vLLM does for string-format templates.

use serde::{Deserialize, Serialize};

/// One chat message with its content already flattened to text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text (text parts joined with `"\n"`).
    pub content: String,
}

impl ChatMessage {
    /// A message from a role and a text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// Builds a message from one element of an OpenAI `messages` array. Returns `None` when the
    /// element is not an object with a string `role`. Missing or `null` content becomes `""`.
    pub fn from_openai(message: &serde_json::Value) -> Option<Self> {
        let role = message.get("role")?.as_str()?;
        let content = message
            .get("content")
            .map(flatten_content)
            .unwrap_or_default();
        Some(Self::new(role, content))
    }

    /// Builds all messages of an OpenAI `messages` array; `None` if it is not an array or any
    /// element is malformed.
    pub fn from_openai_list(messages: &serde_json::Value) -> Option<Vec<Self>> {
        messages.as_array()?.iter().map(Self::from_openai).collect()
    }
}

/// Flattens an OpenAI `content` value: a string as is; an array of parts as its text parts
/// (`{"type": "text", "text": ...}` or bare strings) joined with `"\n"`; anything else as `""`.
pub fn flatten_content(content: &serde_json::Value) -> String {
    match content {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|part| match part {
                    serde_json::Value::String(s) => Some(s.as_str()),
                    serde_json::Value::Object(map) => {
                        let is_text = map
                            .get("type")
                            .and_then(|t| t.as_str())
                            .is_none_or(|t| t == "text" || t == "input_text");
                        if is_text {
                            map.get("text").and_then(|t| t.as_str())
                        } else {
                            None
                        }
                    }
                    _ => None,
                })
                .collect();
            texts.join("\n")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattens_strings_parts_and_null() {
        let m = ChatMessage::from_openai(&json!({"role": "user", "content": "hi"})).unwrap();
        assert_eq!(m, ChatMessage::new("user", "hi"));
        let m = ChatMessage::from_openai(&json!({"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"}
        ]}))
        .unwrap();
        assert_eq!(m.content, "a\nb");
        let m = ChatMessage::from_openai(&json!({"role": "assistant", "content": null})).unwrap();
        assert_eq!(m.content, "");
        assert!(ChatMessage::from_openai(&json!({"content": "x"})).is_none());
        assert!(ChatMessage::from_openai_list(&json!({"role": "user"})).is_none());
        let list =
            ChatMessage::from_openai_list(&json!([{"role": "user", "content": "x"}])).unwrap();
        assert_eq!(list.len(), 1);
    }
}
