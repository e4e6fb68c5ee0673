//! Decoding of vLLM and SGLang KV event batches (msgpack) into typed events.
//!
//! Accepted shapes (see the crate docs for the wire format):
//! - batch: `[ts, events, dp_rank]`, `[ts, events]`, or a map with `ts` and `events`
//!   (`data_parallel_rank` / `dp_rank` / `attn_dp_rank` optional);
//! - events: positional arrays with the class name first (vLLM before #42892, SGLang), or maps with
//!   a `"type"` tag (vLLM ≥ 0.26, newer SGLang); trailing or unknown fields are ignored, missing
//!   optional ones take their defaults; unknown event types are counted and skipped;
//! - hashes: unsigned or signed integers (kept as their 64-bit pattern) or raw bytes, folded to 64
//!   bits per [`Dialect`].
//!
//! Invariants: never panics on any input; a payload is exactly one batch (trailing bytes are an
//! error, as for the engines' own msgpack decoders); payloads over [`DecodeLimits::max_payload_bytes`] are
//! rejected before parsing; no allocation exceeds what the payload's length can justify; event
//! and list lengths beyond the limits are errors naming the limit.

use crate::msgpack::{Int, Kind, MsgError, Reader};

/// A 64-bit engine block hash, as folded from the wire.
pub type EngineHash = u64;

/// Which engine produced a stream; decides how byte-string hashes fold to 64 bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// vLLM: the *last* 8 bytes, big-endian.
    #[default]
    Vllm,
    /// SGLang: the *first* 8 bytes, big-endian (its integer ids are signed).
    Sglang,
}

/// Size limits applied while decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest accepted payload.
    pub max_payload_bytes: usize,
    /// Most events in one batch.
    pub max_events: usize,
    /// Most block hashes in one event.
    pub max_hashes: usize,
    /// Most token ids in one event.
    pub max_tokens: usize,
    /// Deepest nesting of skipped (unknown) values.
    pub max_depth: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 16 << 20,
            max_events: 1 << 16,
            max_hashes: 1 << 16,
            max_tokens: 1 << 22,
            max_depth: 32,
        }
    }
}

/// Why a payload was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The payload exceeds the configured size.
    #[error("payload of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Payload size.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// Malformed msgpack.
    #[error(transparent)]
    Msgpack(#[from] MsgError),
    /// Valid msgpack that is not a KV event batch.
    #[error("not a KV event batch: {0}")]
    Shape(String),
    /// A list longer than the configured limit.
    #[error("{what} has {len} entries, limit {limit}")]
    TooLong {
        /// Which list.
        what: &'static str,
        /// Its declared length.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

/// One decoded batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventBatch {
    /// Engine wall-clock time of the batch, seconds since the Unix epoch.
    pub ts: f64,
    /// The known events, in order.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank, when the engine sent one.
    pub dp_rank: Option<u32>,
    /// Events of unknown type that were skipped.
    pub unknown_events: usize,
}

/// One KV cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Full blocks were stored.
    BlockStored(BlockStored),
    /// Blocks were evicted (one copy each).
    BlockRemoved(BlockRemoved),
    /// The whole cache was cleared.
    AllBlocksCleared,
}

impl KvEvent {
    /// Stable event type name, for metrics labels.
    pub fn type_name(&self) -> &'static str {
        match self {
            KvEvent::BlockStored(_) => "block_stored",
            KvEvent::BlockRemoved(_) => "block_removed",
            KvEvent::AllBlocksCleared => "all_blocks_cleared",
        }
    }
}

/// A `BlockStored` event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in chain order.
    pub block_hashes: Vec<EngineHash>,
    /// The block before `block_hashes[0]`; `None` when the chain starts at token 0.
    pub parent: Option<EngineHash>,
    /// The tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block (SGLang: page size).
    pub block_size: u32,
    /// Numeric LoRA id, if any.
    pub lora_id: Option<i64>,
    /// Storage medium (`"GPU"`, `"CPU"`, ...); `None` = GPU.
    pub medium: Option<String>,
    /// LoRA adapter name, if any.
    pub lora_name: Option<String>,
    /// KV cache group (hybrid models), if sent.
    pub group_idx: Option<u32>,
    /// `"full_attention"`, `"sliding_window"`, ... if sent.
    pub kv_cache_spec_kind: Option<String>,
    /// String keys found in `extra_keys` (vLLM mixes LoRA names, `cache_salt`, multimodal
    /// identifiers into its block hashes through them), at most [`MAX_EXTRA_KEYS`].
    pub extra_key_strings: Vec<String>,
    /// True when `extra_keys` held anything else (or more than [`MAX_EXTRA_KEYS`] strings): the
    /// engine's chain then depends on inputs kvgate cannot see.
    pub extra_keys_opaque: bool,
}

/// Most `extra_keys` strings kept per event.
pub const MAX_EXTRA_KEYS: usize = 64;

/// A `BlockRemoved` event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine hashes of the removed blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Storage medium; `None` = GPU.
    pub medium: Option<String>,
    /// KV cache group, if sent.
    pub group_idx: Option<u32>,
}

/// Decodes one payload (the third ZMQ frame).
pub fn decode_batch(
    payload: &[u8],
    dialect: Dialect,
    limits: &DecodeLimits,
) -> Result<EventBatch, DecodeError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(DecodeError::TooLarge {
            size: payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    let mut d = Decoder {
        r: Reader::new(payload),
        dialect,
        limits,
    };
    let batch = d.batch()?;
    // A payload is one batch: bytes after it mean the framing is not what this decoder thinks.
    if d.r.remaining() != 0 {
        return Err(shape(format!(
            "{} trailing bytes after the batch",
            d.r.remaining()
        )));
    }
    Ok(batch)
}

struct Decoder<'a, 'l> {
    r: Reader<'a>,
    dialect: Dialect,
    limits: &'l DecodeLimits,
}

fn shape(msg: impl Into<String>) -> DecodeError {
    DecodeError::Shape(msg.into())
}

impl Decoder<'_, '_> {
    fn skip(&mut self) -> Result<(), DecodeError> {
        Ok(self.r.skip(self.limits.max_depth)?)
    }

    fn batch(&mut self) -> Result<EventBatch, DecodeError> {
        let mut batch = EventBatch::default();
        match self.r.kind()? {
            Kind::Array => {
                let n = self.r.array_len()?;
                if n < 2 {
                    return Err(shape(format!("batch array has {n} elements")));
                }
                batch.ts = self.r.f64()?;
                self.events(&mut batch)?;
                if n >= 3 {
                    batch.dp_rank = self.opt_u32()?;
                }
                for _ in 3..n {
                    self.skip()?;
                }
            }
            Kind::Map => {
                let n = self.r.map_len()?;
                let mut saw_events = false;
                for _ in 0..n {
                    let key = self.key()?;
                    match key.as_str() {
                        "ts" => batch.ts = self.r.f64()?,
                        "events" => {
                            self.events(&mut batch)?;
                            saw_events = true;
                        }
                        "data_parallel_rank" | "dp_rank" | "attn_dp_rank" => {
                            batch.dp_rank = self.opt_u32()?
                        }
                        _ => self.skip()?,
                    }
                }
                if !saw_events {
                    return Err(shape("batch map without `events`"));
                }
            }
            _ => return Err(shape("batch is neither an array nor a map")),
        }
        Ok(batch)
    }

    /// A map key; a non-string key is skipped and read as `""`, so its value is skipped too.
    fn key(&mut self) -> Result<String, DecodeError> {
        if self.r.kind()? != Kind::Str {
            self.skip()?;
            return Ok(String::new());
        }
        Ok(self.r.string()?.into_owned())
    }

    fn events(&mut self, batch: &mut EventBatch) -> Result<(), DecodeError> {
        let n = self.r.array_len()?;
        if n > self.limits.max_events {
            return Err(DecodeError::TooLong {
                what: "batch events",
                len: n,
                limit: self.limits.max_events,
            });
        }
        batch.events.reserve(n);
        for _ in 0..n {
            match self.event()? {
                Some(e) => batch.events.push(e),
                None => batch.unknown_events += 1,
            }
        }
        Ok(())
    }

    /// One event; `None` for an unknown type (already skipped).
    fn event(&mut self) -> Result<Option<KvEvent>, DecodeError> {
        match self.r.kind()? {
            Kind::Array => self.positional_event(),
            Kind::Map => self.map_event(),
            _ => {
                self.skip()?;
                Ok(None)
            }
        }
    }

    fn positional_event(&mut self) -> Result<Option<KvEvent>, DecodeError> {
        let n = self.r.array_len()?;
        if n == 0 {
            return Ok(None);
        }
        if self.r.kind()? != Kind::Str {
            for _ in 0..n {
                self.skip()?;
            }
            return Ok(None);
        }
        let tag = self.r.string()?.into_owned();
        let mut fields = n - 1;
        let event = match tag.as_str() {
            "BlockStored" => {
                let mut e = BlockStored::default();
                // [block_hashes, parent, token_ids, block_size, lora_id, medium,
                //  lora_name | metadata map, extra_keys, group_idx, kv_cache_spec_kind, ...]
                for i in 0..fields {
                    match i {
                        0 => e.block_hashes = self.hashes()?,
                        1 => e.parent = self.opt_hash()?,
                        2 => e.token_ids = self.tokens()?,
                        3 => e.block_size = self.opt_u32()?.unwrap_or(0),
                        4 => e.lora_id = self.opt_i64()?,
                        5 => e.medium = self.opt_string_or_skip()?,
                        6 => e.lora_name = self.opt_string_or_skip()?,
                        7 => self.extra_keys(&mut e)?,
                        8 => e.group_idx = self.opt_u32_or_skip()?,
                        9 => e.kv_cache_spec_kind = self.opt_string_or_skip()?,
                        _ => self.skip()?,
                    }
                }
                fields = 0;
                Some(KvEvent::BlockStored(e))
            }
            "BlockRemoved" => {
                let mut e = BlockRemoved::default();
                for i in 0..fields {
                    match i {
                        0 => e.block_hashes = self.hashes()?,
                        1 => e.medium = self.opt_string_or_skip()?,
                        2 => e.group_idx = self.opt_u32_or_skip()?,
                        _ => self.skip()?,
                    }
                }
                fields = 0;
                Some(KvEvent::BlockRemoved(e))
            }
            "AllBlocksCleared" => Some(KvEvent::AllBlocksCleared),
            _ => None,
        };
        for _ in 0..fields {
            self.skip()?;
        }
        Ok(event)
    }

    fn map_event(&mut self) -> Result<Option<KvEvent>, DecodeError> {
        let n = self.r.map_len()?;
        let mut tag: Option<String> = None;
        let mut stored = BlockStored::default();
        let mut removed_medium = None;
        let mut group_idx = None;
        let mut have_hashes = false;
        for _ in 0..n {
            let key = self.key()?;
            match key.as_str() {
                "type" | "event_type" => tag = self.opt_string_or_skip()?,
                "block_hashes" => {
                    stored.block_hashes = self.hashes()?;
                    have_hashes = true;
                }
                "parent_block_hash" => stored.parent = self.opt_hash()?,
                "token_ids" => stored.token_ids = self.tokens()?,
                "block_size" | "page_size" => stored.block_size = self.opt_u32()?.unwrap_or(0),
                "lora_id" => stored.lora_id = self.opt_i64()?,
                "medium" => {
                    removed_medium = self.opt_string_or_skip()?;
                    stored.medium.clone_from(&removed_medium);
                }
                "lora_name" => stored.lora_name = self.opt_string_or_skip()?,
                "group_idx" => group_idx = self.opt_u32_or_skip()?,
                "kv_cache_spec_kind" => stored.kv_cache_spec_kind = self.opt_string_or_skip()?,
                "extra_keys" => self.extra_keys(&mut stored)?,
                _ => self.skip()?,
            }
        }
        stored.group_idx = group_idx;
        Ok(match tag.as_deref() {
            Some("BlockStored") => {
                if !have_hashes {
                    return Err(shape("BlockStored without block_hashes"));
                }
                Some(KvEvent::BlockStored(stored))
            }
            Some("BlockRemoved") => Some(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: stored.block_hashes,
                medium: removed_medium,
                group_idx,
            })),
            Some("AllBlocksCleared") => Some(KvEvent::AllBlocksCleared),
            _ => None,
        })
    }

    /// `extra_keys`: nil, or one entry per block, each nil, a string, or a list of keys.
    fn extra_keys(&mut self, e: &mut BlockStored) -> Result<(), DecodeError> {
        if self.r.try_nil()? {
            return Ok(());
        }
        if self.r.kind()? != Kind::Array {
            self.skip()?;
            e.extra_keys_opaque = true;
            return Ok(());
        }
        let blocks = self.r.array_len()?;
        for _ in 0..blocks {
            match self.r.kind()? {
                Kind::Nil => self.skip()?,
                Kind::Array => {
                    let keys = self.r.array_len()?;
                    for _ in 0..keys {
                        self.extra_key(e)?;
                    }
                }
                _ => self.extra_key(e)?,
            }
        }
        Ok(())
    }

    fn extra_key(&mut self, e: &mut BlockStored) -> Result<(), DecodeError> {
        if self.r.kind()? == Kind::Str && e.extra_key_strings.len() < MAX_EXTRA_KEYS {
            let s = self.r.string()?.into_owned();
            e.extra_key_strings.push(s);
        } else if !self.r.try_nil()? {
            self.skip()?;
            e.extra_keys_opaque = true;
        }
        Ok(())
    }

    fn hash(&mut self) -> Result<EngineHash, DecodeError> {
        match self.r.kind()? {
            Kind::Int => Ok(self.r.int()?.bits()),
            Kind::Bin => Ok(fold(self.r.bin()?, self.dialect)),
            Kind::Str => Ok(fold(self.r.str_bytes()?, self.dialect)),
            _ => Err(shape(format!(
                "block hash at byte {} is not an integer or bytes",
                self.r.pos()
            ))),
        }
    }

    fn opt_hash(&mut self) -> Result<Option<EngineHash>, DecodeError> {
        if self.r.try_nil()? {
            return Ok(None);
        }
        self.hash().map(Some)
    }

    fn hashes(&mut self) -> Result<Vec<EngineHash>, DecodeError> {
        let n = self.r.array_len()?;
        if n > self.limits.max_hashes {
            return Err(DecodeError::TooLong {
                what: "block_hashes",
                len: n,
                limit: self.limits.max_hashes,
            });
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.hash()?);
        }
        Ok(v)
    }

    fn tokens(&mut self) -> Result<Vec<u32>, DecodeError> {
        let n = self.r.array_len()?;
        if n > self.limits.max_tokens {
            return Err(DecodeError::TooLong {
                what: "token_ids",
                len: n,
                limit: self.limits.max_tokens,
            });
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            match self.r.int()? {
                Int::U(u) if u <= u64::from(u32::MAX) => v.push(u as u32),
                _ => return Err(shape("token id out of range")),
            }
        }
        Ok(v)
    }

    fn opt_u32(&mut self) -> Result<Option<u32>, DecodeError> {
        if self.r.try_nil()? {
            return Ok(None);
        }
        match self.r.int()? {
            Int::U(u) => u32::try_from(u)
                .map(Some)
                .map_err(|_| shape("integer out of range")),
            Int::I(_) => Err(shape("negative integer where a count was expected")),
        }
    }

    /// A non-negative integer, or `None` for nil or a value of another type (skipped).
    fn opt_u32_or_skip(&mut self) -> Result<Option<u32>, DecodeError> {
        if self.r.kind()? == Kind::Int {
            return match self.r.int()? {
                Int::U(u) => Ok(u32::try_from(u).ok()),
                Int::I(_) => Ok(None),
            };
        }
        self.skip()?;
        Ok(None)
    }

    fn opt_i64(&mut self) -> Result<Option<i64>, DecodeError> {
        if self.r.kind()? == Kind::Int {
            return Ok(Some(self.r.int()?.bits() as i64));
        }
        self.skip()?;
        Ok(None)
    }

    /// A string, or `None` for nil or a value of another type (skipped): positions shared by
    /// different engines' layouts (e.g. SGLang's metadata map) decode by shape.
    fn opt_string_or_skip(&mut self) -> Result<Option<String>, DecodeError> {
        if self.r.kind()? == Kind::Str {
            return Ok(Some(self.r.string()?.into_owned()));
        }
        self.skip()?;
        Ok(None)
    }
}

/// Folds a byte-string hash to 64 bits: vLLM keeps the last 8 bytes, SGLang the first 8
/// (big-endian). Shorter strings are zero-extended on the left.
pub fn fold(bytes: &[u8], dialect: Dialect) -> EngineHash {
    let window = if bytes.len() <= 8 {
        bytes
    } else {
        match dialect {
            Dialect::Vllm => &bytes[bytes.len() - 8..],
            Dialect::Sglang => &bytes[..8],
        }
    };
    window
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
