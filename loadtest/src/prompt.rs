//! Prompt synthesis: text whose blocks are identical exactly when a trace's block ids are.
//!
//! Each block id maps to a deterministic sequence of `block_tokens` words drawn (seeded by the id)
//! from a pool of words that are ONE token each under the configured tokenizer, with a leading
//! space. Pre-tokenisation splits at those spaces, so the tokens of consecutive words never merge:
//! the content is exactly as many tokens as words, and two prompts share a token prefix exactly as
//! far as their block ids agree. The chat template (or the tokenizer's special tokens for the
//! completions API) adds a fixed overhead, which is taken off the last block so the whole prompt
//! counts `input_length` tokens; [`PromptBuilder::exact_tokens`] measures the real count.
//!
//! Invariants: a builder is immutable after construction; text for a block depends only on the
//! builder's seed and the block id.

use std::sync::Arc;

use kvgate_tokenizer::{ChatMessage, TokenMode, TokenizerError};
use serde::Serialize;

use crate::trace::TraceRequest;

/// Smallest usable word pool; fewer single-token words would make collisions between blocks likely.
const MIN_WORDS: usize = 256;
/// Word pool size: 2048 words per position gives 11 bits per token, so distinct blocks never collide.
const MAX_WORDS: usize = 2048;
/// Highest token id scanned for words.
const MAX_SCAN_ID: u32 = 300_000;

/// Which OpenAI-compatible API the prompts are sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ApiKind {
    /// `POST /v1/chat/completions` with one user message.
    Chat,
    /// `POST /v1/completions` with a plain prompt.
    Completions,
}

impl ApiKind {
    /// URL path below the base URL.
    pub fn path(self) -> &'static str {
        match self {
            ApiKind::Chat => "/v1/chat/completions",
            ApiKind::Completions => "/v1/completions",
        }
    }
}

/// Why prompts cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The tokenizer has too few single-token words.
    #[error("tokenizer offers only {0} single-token words (need at least {MIN_WORDS})")]
    TooFewWords(usize),
    /// The request body could not be serialised.
    #[error("serialising request body: {0}")]
    Body(#[from] serde_json::Error),
}

/// Builds prompt text and request bodies for trace requests.
#[derive(Clone)]
pub struct PromptBuilder {
    /// Tokenizer and chat template the engines use (they decide the real token count).
    mode: TokenMode,
    /// Target API; decides the template overhead.
    api: ApiKind,
    /// Single-token words, each with a leading space.
    words: Arc<Vec<String>>,
    /// Tokens the template/special tokens add around the content.
    overhead: u32,
    /// Tokens per trace block.
    block_tokens: u32,
    /// Mixed into every block's word sequence so different runs can use different text.
    seed: u64,
}

impl std::fmt::Debug for PromptBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptBuilder")
            .field("api", &self.api)
            .field("words", &self.words.len())
            .field("overhead", &self.overhead)
            .field("block_tokens", &self.block_tokens)
            .finish()
    }
}

/// Token-count accuracy of synthesised prompts versus the trace's `input_length`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TokenCountError {
    /// Requests tokenised exactly.
    pub checked: usize,
    /// Mean absolute difference, tokens.
    pub mean_abs: f64,
    /// Largest absolute difference, tokens.
    pub max_abs: u32,
    /// Mean relative difference (|actual − target| / target).
    pub mean_rel: f64,
    /// Template and special-token overhead included in every prompt, tokens.
    pub overhead_tokens: u32,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<[Message<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    max_tokens: u32,
    min_tokens: u32,
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    temperature: f32,
}

impl PromptBuilder {
    /// Scans the tokenizer for single-token words and measures the template overhead.
    pub fn new(
        mode: TokenMode,
        api: ApiKind,
        block_tokens: u32,
        seed: u64,
    ) -> Result<Self, PromptError> {
        let words = single_token_words(&mode);
        if words.len() < MIN_WORDS {
            return Err(PromptError::TooFewWords(words.len()));
        }
        let mut b = PromptBuilder {
            mode,
            api,
            words: Arc::new(words),
            overhead: 0,
            block_tokens: block_tokens.max(1),
            seed,
        };
        // Overhead = real count of a short content minus its word count.
        let probe: String = b.words[..8].concat();
        let n = b.count_text(&probe)?;
        b.overhead = n.saturating_sub(8);
        Ok(b)
    }

    /// Builder over the built-in tokenizer and chat template (what the simulator uses).
    pub fn builtin(api: ApiKind, block_tokens: u32, seed: u64) -> Result<Self, PromptError> {
        Self::new(TokenMode::builtin()?, api, block_tokens, seed)
    }

    /// The target API.
    pub fn api(&self) -> ApiKind {
        self.api
    }

    /// Template and special-token overhead per prompt, tokens.
    pub fn overhead_tokens(&self) -> u32 {
        self.overhead
    }

    /// Number of words in the pool.
    pub fn pool_size(&self) -> usize {
        self.words.len()
    }

    /// Content tokens for a request: `input_length` minus the overhead, at least one.
    pub fn content_tokens(&self, req: &TraceRequest) -> u32 {
        req.input_length.saturating_sub(self.overhead).max(1)
    }

    /// Appends the words of one block (the first `take` of them) to `out`.
    fn push_block(&self, id: u64, take: u32, out: &mut String) {
        let mut state = splitmix(self.seed ^ splitmix(id));
        let n = self.words.len() as u64;
        for _ in 0..take {
            state = splitmix(state);
            // Multiply-shift maps uniformly onto the pool without a modulo bias worth caring about.
            let i = ((u128::from(state) * u128::from(n)) >> 64) as usize;
            out.push_str(&self.words[i]);
        }
    }

    /// `n` words seeded by `id` (the same for the same builder seed and id): exactly `n` tokens,
    /// each word one token with a leading space, lowercase ASCII letters only.
    pub fn words(&self, id: u64, n: u32) -> String {
        let mut out = String::with_capacity(n as usize * 8);
        self.push_block(id, n, &mut out);
        out
    }

    /// The prompt content for a request (the user message, or the completions prompt).
    pub fn text(&self, req: &TraceRequest) -> String {
        let mut remaining = self.content_tokens(req);
        let mut out = String::with_capacity(remaining as usize * 8);
        for &id in &req.hash_ids {
            if remaining == 0 {
                break;
            }
            let take = remaining.min(self.block_tokens);
            self.push_block(id, take, &mut out);
            remaining -= take;
        }
        // A trace line always has enough ids (checked on load); pad defensively with the last id.
        if remaining > 0 {
            let last = req.hash_ids.last().copied().unwrap_or(0);
            self.push_block(last ^ 0x9e37_79b9_7f4a_7c15, remaining, &mut out);
        }
        out
    }

    /// The JSON request body asking for exactly `output_length` tokens, streamed.
    pub fn body(&self, req: &TraceRequest, model: &str) -> Result<Vec<u8>, PromptError> {
        let text = self.text(req);
        let out = req.output_length.max(1);
        let body = Body {
            model,
            messages: match self.api {
                ApiKind::Chat => Some([Message {
                    role: "user",
                    content: &text,
                }]),
                ApiKind::Completions => None,
            },
            prompt: match self.api {
                ApiKind::Chat => None,
                ApiKind::Completions => Some(&text),
            },
            max_tokens: out,
            min_tokens: out,
            ignore_eos: true,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            temperature: 0.0,
        };
        Ok(serde_json::to_vec(&body)?)
    }

    fn count_text(&self, content: &str) -> Result<u32, PromptError> {
        let n = match self.api {
            ApiKind::Chat => self
                .mode
                .chat_tokens(&[ChatMessage::new("user", content)])?
                .len(),
            ApiKind::Completions => self.mode.completion_tokens(content)?.len(),
        };
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Real prompt tokens of a request under the configured tokenizer and template.
    pub fn exact_tokens(&self, req: &TraceRequest) -> Result<u32, PromptError> {
        self.count_text(&self.text(req))
    }

    /// Tokenises up to `max_checked` requests (evenly spread) and compares with `input_length`.
    pub fn measure_error(
        &self,
        requests: &[TraceRequest],
        max_checked: usize,
    ) -> Result<TokenCountError, PromptError> {
        let mut e = TokenCountError {
            overhead_tokens: self.overhead,
            ..Default::default()
        };
        if requests.is_empty() || max_checked == 0 {
            return Ok(e);
        }
        let step = requests.len().div_ceil(max_checked).max(1);
        let (mut sum_abs, mut sum_rel) = (0f64, 0f64);
        for r in requests.iter().step_by(step) {
            let actual = self.exact_tokens(r)?;
            let diff = actual.abs_diff(r.input_length);
            sum_abs += f64::from(diff);
            sum_rel += f64::from(diff) / f64::from(r.input_length.max(1));
            e.max_abs = e.max_abs.max(diff);
            e.checked += 1;
        }
        e.mean_abs = sum_abs / e.checked as f64;
        e.mean_rel = sum_rel / e.checked as f64;
        Ok(e)
    }
}

/// Words of 3–10 lowercase ASCII letters that encode, with a leading space, to exactly one token.
fn single_token_words(mode: &TokenMode) -> Vec<String> {
    let tok = &mode.tokenizer;
    let mut seen = ahash::AHashSet::new();
    let mut words = Vec::with_capacity(MAX_WORDS);
    let mut misses = 0u32;
    for id in 0..MAX_SCAN_ID {
        let Ok(s) = tok.decode(&[id]) else {
            misses += 1;
            // Past the end of the vocabulary every id fails.
            if misses > 1000 {
                break;
            }
            continue;
        };
        misses = 0;
        let w = s.trim();
        if !(3..=10).contains(&w.len()) || !w.bytes().all(|b| b.is_ascii_lowercase()) {
            continue;
        }
        let candidate = format!(" {w}");
        if seen.contains(&candidate) || tok.count(&candidate) != 1 {
            continue;
        }
        seen.insert(candidate.clone());
        words.push(candidate);
        if words.len() >= MAX_WORDS {
            break;
        }
    }
    words
}

/// SplitMix64 finaliser: a fast, well-mixed deterministic hash of a 64-bit value.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn builder(api: ApiKind) -> PromptBuilder {
        static CHAT: OnceLock<PromptBuilder> = OnceLock::new();
        static COMP: OnceLock<PromptBuilder> = OnceLock::new();
        let cell = match api {
            ApiKind::Chat => &CHAT,
            ApiKind::Completions => &COMP,
        };
        cell.get_or_init(|| PromptBuilder::builtin(api, 16, 7).unwrap())
            .clone()
    }

    fn req(ids: &[u64], len: u32) -> TraceRequest {
        TraceRequest {
            timestamp_ms: 0,
            input_length: len,
            output_length: 4,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn pool_is_large_and_single_token() {
        let b = builder(ApiKind::Chat);
        assert!(b.pool_size() >= MIN_WORDS, "{}", b.pool_size());
        let tok = &b.mode.tokenizer;
        for w in b.words.iter().take(200) {
            assert_eq!(tok.count(w), 1, "{w:?}");
        }
    }

    #[test]
    fn identical_ids_identical_text() {
        let b = builder(ApiKind::Chat);
        assert_eq!(b.text(&req(&[1, 2, 3], 48)), b.text(&req(&[1, 2, 3], 48)));
        // Same prefix ids, different tail: texts share exactly the first two blocks.
        let a = b.text(&req(&[1, 2, 3], 48));
        let c = b.text(&req(&[1, 2, 9], 48));
        let words_a: Vec<&str> = a.split(' ').collect();
        let words_c: Vec<&str> = c.split(' ').collect();
        let common = words_a
            .iter()
            .zip(&words_c)
            .take_while(|(x, y)| x == y)
            .count();
        // Leading space gives an empty first element; 32 words come from blocks 1 and 2 minus
        // the chat overhead taken from the end (not the start).
        assert!((33..40).contains(&common), "common prefix {common} words");
    }

    #[test]
    fn different_ids_different_blocks() {
        let b = builder(ApiKind::Completions);
        let x = b.text(&req(&[10], 16));
        let y = b.text(&req(&[11], 16));
        assert_ne!(x, y);
        let mut s = String::new();
        b.push_block(5, 16, &mut s);
        let mut t = String::new();
        b.push_block(6, 16, &mut t);
        assert_ne!(s, t);
        // Same id, different seed: different text.
        let other = PromptBuilder {
            seed: 8,
            ..b.clone()
        };
        let mut u = String::new();
        other.push_block(5, 16, &mut u);
        assert_ne!(s, u);
    }

    #[test]
    fn token_counts_match_input_length() {
        for api in [ApiKind::Chat, ApiKind::Completions] {
            let b = builder(api);
            let reqs: Vec<TraceRequest> = (1..40u64)
                .map(|i| {
                    let len = 20 + (i as u32 * 37) % 300;
                    let ids: Vec<u64> =
                        (0..len.div_ceil(16) as u64).map(|k| k * 1000 + i).collect();
                    req(&ids, len)
                })
                .collect();
            let e = b.measure_error(&reqs, 100).unwrap();
            assert_eq!(e.checked, 39);
            assert_eq!(e.max_abs, 0, "{api:?}: {e:?}");
        }
    }

    #[test]
    fn body_asks_for_exact_output() {
        let b = builder(ApiKind::Chat);
        let body: serde_json::Value =
            serde_json::from_slice(&b.body(&req(&[1, 2], 20), "m").unwrap()).unwrap();
        assert_eq!(body["max_tokens"], 4);
        assert_eq!(body["min_tokens"], 4);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][0]["role"], "user");
        assert!(body.get("prompt").is_none());
        let b = builder(ApiKind::Completions);
        let body: serde_json::Value =
            serde_json::from_slice(&b.body(&req(&[1, 2], 20), "m").unwrap()).unwrap();
        assert!(body["prompt"].is_string());
    }
}
