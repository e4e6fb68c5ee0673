//! [`Tokenizer`]: one interface over the built-in `cl100k_base` BPE and Hugging Face
//! `tokenizer.json` files.
//!
//! The built-in tokenizer is [`crate::cl100k`]: the ids of `tiktoken-rs`'s `cl100k_base`
//! (`encode_with_special_tokens`), without its backtracking regex.
//!
//! Invariants: a `Tokenizer` is immutable after construction and shared through an `Arc`, so clones
//! are cheap and it can be used from any thread. `count(text)` equals
//! `encode(text, false).len()` whenever encoding succeeds.

use std::path::Path;
use std::sync::Arc;

use crate::cl100k::Cl100k;
use crate::TokenizerError;

/// A text ↔ token-id codec.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    /// Shown in logs and `/admin` pages.
    name: String,
    /// The id a completion prompt starts with when special tokens are added.
    bos: Option<u32>,
    /// Where encoding provably splits (see [`crate::cache`] for the rule per family).
    split_rule: SplitRule,
}

/// How [`Tokenizer::safe_splits`] finds offsets that encoding cannot merge across.
enum SplitRule {
    /// cl100k_base: after `<|end|>\n` followed by `<`.
    EndMarker,
    /// Hugging Face: after every added token, matched leftmost-longest like the added vocabulary.
    AddedTokens(aho_corasick::AhoCorasick),
    /// No rule holds: always encode whole.
    None,
}

enum Backend {
    /// Shared by every built-in tokenizer of the process.
    Cl100k(&'static Cl100k),
    Hf(Box<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &self.inner.name)
            .field("bos", &self.inner.bos)
            .finish()
    }
}

impl Tokenizer {
    /// The built-in tokenizer: OpenAI's `cl100k_base` BPE, compiled into the binary. It has no
    /// BOS token, so encoding with or without special tokens gives the same ids. The
    /// vocabulary is loaded once per process (the first call takes tens of milliseconds).
    pub fn builtin() -> Result<Self, TokenizerError> {
        Ok(Self {
            inner: Arc::new(Inner {
                backend: Backend::Cl100k(Cl100k::get()?),
                name: "cl100k_base".to_owned(),
                bos: None,
                split_rule: SplitRule::EndMarker,
            }),
        })
    }

    /// Loads a Hugging Face `tokenizer.json`. The BOS id is taken from the post-processor's
    /// template (the special token it prepends to a single sequence), if there is one.
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Self, TokenizerError> {
        Self::from_tokenizer_json_named(bytes, "tokenizer.json")
    }

    /// Loads a Hugging Face `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_tokenizer_json_named(&bytes, &path.display().to_string())
    }

    fn from_tokenizer_json_named(bytes: &[u8], name: &str) -> Result<Self, TokenizerError> {
        let tokenizer = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| TokenizerError::Load(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| TokenizerError::Load(e.to_string()))?;
        let bos = post_processor_bos(&json);
        let split_rule = hf_split_rule(&json);
        Ok(Self {
            inner: Arc::new(Inner {
                backend: Backend::Hf(Box::new(tokenizer)),
                name: name.to_owned(),
                bos,
                split_rule,
            }),
        })
    }

    /// Encodes `text`. With `add_special_tokens`, the tokenizer's post-processor runs (for most
    /// models: a BOS id first). Special-token strings inside `text` are encoded as their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner.backend {
            // cl100k_base has no post-processor: special tokens are never added.
            Backend::Cl100k(cl) => Ok(cl.encode(text)),
            Backend::Hf(tok) => tok
                .encode_fast(text, add_special_tokens)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
        }
    }

    /// Decodes ids back to text, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match &self.inner.backend {
            Backend::Cl100k(cl) => {
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    let token = cl
                        .token_bytes(id)
                        .ok_or_else(|| TokenizerError::Decode(format!("unknown token id {id}")))?;
                    bytes.extend_from_slice(token);
                }
                String::from_utf8(bytes).map_err(|e| TokenizerError::Decode(e.to_string()))
            }
            Backend::Hf(tok) => tok
                .decode(ids, false)
                .map_err(|e| TokenizerError::Decode(e.to_string())),
        }
    }

    /// Number of tokens in `text` without special tokens. If the tokenizer fails on the text
    /// (possible only for Hugging Face tokenizers with unusual configurations), an estimate of one
    /// token per four bytes is returned instead, since a count is only used for sizing.
    pub fn count(&self, text: &str) -> usize {
        match &self.inner.backend {
            Backend::Cl100k(cl) => cl.count(text),
            Backend::Hf(_) => self
                .encode(text, false)
                .map(|ids| ids.len())
                .unwrap_or_else(|_| text.len().div_ceil(4)),
        }
    }

    /// The BOS id added in front of a sequence with special tokens, if any.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos
    }

    /// The id of a token string (vocabulary or special token), if it exists.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.inner.backend {
            Backend::Cl100k(cl) => {
                let ids = cl.encode(token);
                match ids.as_slice() {
                    [id] => Some(*id),
                    _ => None,
                }
            }
            Backend::Hf(tok) => tok.token_to_id(token),
        }
    }

    /// Ascending byte offsets inside `text` (never 0 or `text.len()`) where
    /// `encode(text, false) == encode(&text[..p], false) ++ encode(&text[p..], false)` holds, or
    /// `None` when this tokenizer has no such rule (see [`crate::cache`]).
    pub fn safe_splits(&self, text: &str) -> Option<Vec<usize>> {
        const MARKER: &str = "<|end|>\n";
        let mut out = Vec::new();
        match &self.inner.split_rule {
            SplitRule::None => return None,
            SplitRule::EndMarker => {
                for (i, _) in text.match_indices(MARKER) {
                    let p = i + MARKER.len();
                    if text.as_bytes().get(p) == Some(&b'<') {
                        out.push(p);
                    }
                }
            }
            SplitRule::AddedTokens(ac) => {
                for m in ac.find_iter(text) {
                    if m.end() < text.len() {
                        out.push(m.end());
                    }
                }
            }
        }
        Some(out)
    }

    /// A short name: `cl100k_base`, or where the `tokenizer.json` came from.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

/// The split rule of a `tokenizer.json`: added-token splits when nothing else in the pipeline can
/// make a piece depend on its neighbours (the conditions in [`crate::cache`]), else none.
fn hf_split_rule(json: &serde_json::Value) -> SplitRule {
    let absent = |key: &str| json.get(key).is_none_or(serde_json::Value::is_null);
    let pre_ok = match json.get("pre_tokenizer") {
        None | Some(serde_json::Value::Null) => true,
        Some(p) => p.get("type").and_then(|t| t.as_str()) == Some("ByteLevel"),
    };
    if !(absent("normalizer") && absent("truncation") && absent("padding") && pre_ok) {
        return SplitRule::None;
    }
    let Some(added) = json.get("added_tokens").and_then(|a| a.as_array()) else {
        return SplitRule::None;
    };
    let mut patterns = Vec::with_capacity(added.len());
    for t in added {
        let flag = |k: &str| t.get(k).and_then(|v| v.as_bool()).unwrap_or(true);
        let content = t.get("content").and_then(|c| c.as_str()).unwrap_or("");
        if content.is_empty()
            || flag("normalized")
            || flag("lstrip")
            || flag("rstrip")
            || flag("single_word")
        {
            return SplitRule::None;
        }
        patterns.push(content.to_owned());
    }
    if patterns.is_empty() {
        return SplitRule::None;
    }
    aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build(&patterns)
        .map_or(SplitRule::None, SplitRule::AddedTokens)
}

/// The id of the special token a `TemplateProcessing` post-processor puts before a single
/// sequence (also inside a `Sequence` of processors).
fn post_processor_bos(json: &serde_json::Value) -> Option<u32> {
    fn from_processor(pp: &serde_json::Value) -> Option<u32> {
        match pp.get("type")?.as_str()? {
            "TemplateProcessing" => {
                let first = pp.get("single")?.as_array()?.first()?;
                let name = first.get("SpecialToken")?.get("id")?.as_str()?;
                let ids = pp
                    .get("special_tokens")?
                    .get(name)?
                    .get("ids")?
                    .as_array()?;
                let id = ids.first()?.as_u64()?;
                u32::try_from(id).ok()
            }
            "Sequence" => pp
                .get("processors")?
                .as_array()?
                .iter()
                .find_map(from_processor),
            _ => None,
        }
    }
    from_processor(json.get("post_processor")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_round_trip() {
        let tok = Tokenizer::builtin().unwrap();
        let text = "Hello, world! Ünïcödé and emoji 🚀, code: fn main() { println!(\"x\"); }";
        let ids = tok.encode(text, true).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(tok.count(text), ids.len());
        assert_eq!(tok.encode(text, false).unwrap(), ids);
        assert_eq!(tok.bos_token_id(), None);
        assert_eq!(tok.name(), "cl100k_base");
        // A known cl100k_base encoding.
        assert_eq!(tok.encode("hello world", false).unwrap(), vec![15339, 1917]);
        assert_eq!(tok.token_to_id("<|endoftext|>"), Some(100257));
    }

    #[test]
    fn builtin_unknown_id_is_an_error() {
        let tok = Tokenizer::builtin().unwrap();
        assert!(matches!(
            tok.decode(&[u32::MAX]),
            Err(TokenizerError::Decode(_))
        ));
    }

    #[test]
    fn bad_tokenizer_json_is_an_error() {
        assert!(matches!(
            Tokenizer::from_tokenizer_json(b"{not json"),
            Err(TokenizerError::Load(_))
        ));
        assert!(matches!(
            Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")),
            Err(TokenizerError::Io { .. })
        ));
    }

    #[test]
    fn tokenizer_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }
}
