//! [`TokenMode`]: the token ids an engine caches for a request, computed the way vLLM does.
//!
//! Chat: render with the generation prompt, then encode *without* special tokens (the template
//! places any BOS itself). Completions: encode the prompt *with* special tokens (BOS first).

use std::path::Path;
use std::sync::Arc;

use crate::{CacheStats, ChatMessage, ChatTemplate, TokenCache, Tokenizer, TokenizerError};

/// A tokenizer with the chat template that goes with it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TokenMode {
    /// Encodes rendered chats and completion prompts.
    pub tokenizer: Tokenizer,
    /// Renders chat messages into prompt text.
    pub template: ChatTemplate,
    /// Token ids of chat-prompt prefixes, shared by all clones; `None` encodes every prompt whole.
    cache: Option<Arc<TokenCache>>,
}

impl TokenMode {
    /// Pairs a tokenizer with a template.
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate) -> Self {
        Self {
            tokenizer,
            template,
            cache: None,
        }
    }

    /// The same, with a prefix cache of `capacity_bytes` for chat prompts (0: no cache).
    pub fn with_cache(mut self, capacity_bytes: u64) -> Self {
        self.cache = (capacity_bytes > 0).then(|| Arc::new(TokenCache::new(capacity_bytes)));
        self
    }

    /// The prefix cache's counters, if there is a cache.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.cache.as_ref().map(|c| c.stats())
    }

    /// The built-in tokenizer and the built-in template.
    pub fn builtin() -> Result<Self, TokenizerError> {
        Ok(Self::new(Tokenizer::builtin()?, ChatTemplate::builtin()))
    }

    /// Loads a Hugging Face model directory: `tokenizer.json` (required), the chat template from
    /// `chat_template.jinja` or else the `chat_template` string of `tokenizer_config.json` (else
    /// the built-in template), and `bos_token` / `eos_token` from `tokenizer_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| TokenizerError::Load(format!("{}: {e}", config_path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(source) => {
                return Err(TokenizerError::Io {
                    path: config_path,
                    source,
                })
            }
        };
        let bos = special_token(&config, "bos_token");
        let eos = special_token(&config, "eos_token");
        let jinja_path = dir.join("chat_template.jinja");
        let source = match std::fs::read_to_string(&jinja_path) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => config
                .get("chat_template")
                .and_then(|t| t.as_str())
                .map(str::to_owned),
            Err(source) => {
                return Err(TokenizerError::Io {
                    path: jinja_path,
                    source,
                })
            }
        };
        let template = match source {
            Some(src) => ChatTemplate::from_jinja(&src, bos, eos)?,
            None => ChatTemplate::builtin(),
        };
        Ok(Self::new(tokenizer, template))
    }

    /// Token ids of a chat request (with the generation prompt; no special tokens added).
    pub fn chat_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokenizerError> {
        self.chat_tokens_with_tools(messages, None)
    }

    /// Token ids of a chat request that declares `tools`.
    pub fn chat_tokens_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.template.render(messages, true, tools)?;
        self.encode_chat_text(&text)
    }

    /// Token ids of rendered chat text: through the prefix cache where the tokenizer's split
    /// rule holds, else whole. Both give the same ids (see [`crate::cache`]).
    pub fn encode_chat_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if let Some(cache) = &self.cache {
            if let Some(splits) = self.tokenizer.safe_splits(text) {
                return cache.encode(text, &splits, |s| self.tokenizer.encode(s, false));
            }
        }
        self.tokenizer.encode(text, false)
    }

    /// Token ids of a completion prompt (special tokens added: BOS first when defined).
    pub fn completion_tokens(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer.encode(prompt, true)
    }
}

/// A special token from `tokenizer_config.json`: a string or `{"content": "..."}`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    let v = config.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(|c| c.as_str()))
        .map(str::to_owned)
}
