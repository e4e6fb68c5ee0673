//! Tokenizers and chat templates for kvgate's *token mode*.
//!
//! In token mode a prompt's block hashes are computed over the exact token ids an engine will
//! cache, so they can be matched against the engine's own KV events. This crate turns requests into
//! those ids the way vLLM does:
//!
//! - **chat** (`/v1/chat/completions`): render the chat template with the generation prompt, then
//!   tokenize the result *without* adding special tokens ([`TokenMode::chat_tokens`]);
//! - **completions** (`/v1/completions`): tokenize the prompt *with* special tokens, so a BOS
//!   token comes first when the tokenizer defines one ([`TokenMode::completion_tokens`]).
//!
//! # Layout
//!
//! - [`Tokenizer`]: the built-in `cl100k_base` BPE (no files needed) or any Hugging Face
//!   `tokenizer.json`. Cheap to clone, `Send + Sync`.
//! - [`cl100k`]: the built-in encoder, tiktoken's `cl100k_base` ids without its backtracking
//!   regex (public so the tests and the fuzz target can compare its pieces and ids).
//! - [`ChatTemplate`]: the built-in template (below) or a Jinja chat template as shipped with
//!   Hugging Face models (`chat_template.jinja`, or the `chat_template` field of
//!   `tokenizer_config.json`), rendered with the same whitespace rules as `transformers`.
//! - [`ChatMessage`]: a role and a flattened text content ([`ChatMessage::from_openai`] flattens
//!   OpenAI content-part arrays).
//! - [`TokenCache`]: token ids of chat-prompt prefixes, reused when a conversation grows (the
//!   split rule per tokenizer family is in [`cache`]).
//! - [`TokenMode`]: a tokenizer and a template together; [`TokenMode::from_model_dir`] loads a
//!   model directory.
//!
//! # The built-in chat template
//!
//! Used by the simulator and the gateway when no model template is configured. For messages
//! `m_1..m_n` it renders, with no leading or trailing whitespace added:
//!
//! ```text
//! <|tools|>\n{tools as compact JSON}<|end|>\n      (only when tools are given)
//! <|{role}|>\n{content}<|end|>\n                    (once per message, in order)
//! <|assistant|>\n                                   (only with add_generation_prompt)
//! ```
//!
//! So `[system: "Be brief.", user: "Hi"]` with the generation prompt renders as
//! `"<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"`. Every message ends with
//! the same marker, so a conversation's rendering is a prefix of the rendering of any continuation
//! of it (a property prefix caching relies on).

pub mod cache;
pub mod cl100k;
mod error;
mod message;
mod template;
mod token_mode;
mod tokenizer;

pub use cache::{CacheStats, TokenCache};
pub use error::TokenizerError;
pub use message::ChatMessage;
pub use template::ChatTemplate;
pub use token_mode::TokenMode;
pub use tokenizer::Tokenizer;
