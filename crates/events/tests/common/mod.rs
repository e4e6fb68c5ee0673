//! Shared helpers for the integration tests: a msgpack writer for vLLM-shaped batches, an index,
//! and a stream.
#![allow(dead_code)]

use std::sync::Arc;

use kvgate_core::hash::{token_chain, Namespace};
use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::InstanceId;
use kvgate_events::decode::{DecodeLimits, Dialect};
use kvgate_events::metrics::StreamMetrics;
use kvgate_events::{StreamIngest, StreamParams};

pub const MODEL: &str = "m";
pub const BS: u32 = 4;

/// A msgpack writer.
#[derive(Default, Clone)]
pub struct W(pub Vec<u8>);

impl W {
    pub fn arr(mut self, n: usize) -> Self {
        self.0.push(0xdd);
        self.0.extend_from_slice(&(n as u32).to_be_bytes());
        self
    }
    pub fn map(mut self, n: usize) -> Self {
        self.0.push(0xdf);
        self.0.extend_from_slice(&(n as u32).to_be_bytes());
        self
    }
    pub fn u(mut self, v: u64) -> Self {
        self.0.push(0xcf);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn f(mut self, v: f64) -> Self {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn s(mut self, v: &str) -> Self {
        self.0.push(0xdb);
        self.0.extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    pub fn nil(mut self) -> Self {
        self.0.push(0xc0);
        self
    }
    pub fn opt(self, v: Option<u64>) -> Self {
        match v {
            Some(v) => self.u(v),
            None => self.nil(),
        }
    }
    pub fn list(self, v: &[u64]) -> Self {
        let mut w = self.arr(v.len());
        for &x in v {
            w = w.u(x);
        }
        w
    }
}

/// One event for [`batch`].
#[derive(Clone, Debug)]
pub enum Ev {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u32,
        medium: &'static str,
        kind: &'static str,
    },
    Removed {
        hashes: Vec<u64>,
        medium: &'static str,
    },
    Cleared,
}

/// A `BlockStored` of `tokens` in blocks of [`BS`] with engine hashes `hashes`.
pub fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> Ev {
    Ev::Stored {
        hashes: hashes.to_vec(),
        parent,
        tokens: tokens.to_vec(),
        block_size: BS,
        medium: "GPU",
        kind: "full_attention",
    }
}

pub fn removed(hashes: &[u64]) -> Ev {
    Ev::Removed {
        hashes: hashes.to_vec(),
        medium: "GPU",
    }
}

/// A vLLM ≥ 0.26 batch (map events) `[ts, events, 0]`.
pub fn batch(events: &[Ev]) -> Vec<u8> {
    let mut w = W::default().arr(3).f(1_700_000_000.0).arr(events.len());
    for e in events {
        w = match e {
            Ev::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                medium,
                kind,
            } => {
                let toks: Vec<u64> = tokens.iter().map(|&t| u64::from(t)).collect();
                w.map(8)
                    .s("type")
                    .s("BlockStored")
                    .s("block_hashes")
                    .list(hashes)
                    .s("parent_block_hash")
                    .opt(*parent)
                    .s("token_ids")
                    .list(&toks)
                    .s("block_size")
                    .u(u64::from(*block_size))
                    .s("medium")
                    .s(medium)
                    .s("group_idx")
                    .u(0)
                    .s("kv_cache_spec_kind")
                    .s(kind)
            }
            Ev::Removed { hashes, medium } => w
                .map(3)
                .s("type")
                .s("BlockRemoved")
                .s("block_hashes")
                .list(hashes)
                .s("medium")
                .s(medium),
            Ev::Cleared => w.map(1).s("type").s("AllBlocksCleared"),
        };
    }
    w.u(0).0
}

pub fn index() -> Arc<PlacementIndex> {
    Arc::new(PlacementIndex::new(IndexConfig {
        shards: 8,
        max_entries: 1 << 20,
        default_instance_capacity: 1 << 18,
    }))
}

pub fn params(instance: InstanceId, sole_stream: bool) -> StreamParams {
    StreamParams {
        instance,
        name: Arc::from(format!("inst{}", instance.0).as_str()),
        dp_rank: 0,
        model: MODEL.into(),
        block_size: BS,
        dialect: Dialect::Vllm,
        max_tracked_blocks: 1 << 16,
        limits: DecodeLimits::default(),
        sole_stream,
    }
}

pub fn stream(index: &Arc<PlacementIndex>, instance: InstanceId) -> StreamIngest {
    StreamIngest::new(
        params(instance, true),
        index.clone(),
        StreamMetrics::new("test"),
    )
}

/// kvgate's chain of `tokens` in the test namespace.
pub fn chain(tokens: &[u32]) -> Vec<u64> {
    token_chain(
        &Namespace {
            model: MODEL,
            lora: None,
            cache_salt: None,
        },
        tokens,
        BS as usize,
    )
}

/// Leading blocks of `tokens` the index credits to `instance`.
pub fn credited(index: &PlacementIndex, instance: InstanceId, tokens: &[u32]) -> u32 {
    let mut out = PrefixMatches::default();
    index.match_prefix(&chain(tokens), 1, &mut out);
    out.get(instance).total()
}

/// `n` tokens starting at `start`.
pub fn toks(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// Leading blocks of `tokens` credited to `instance` under `model` with block size `bs`.
pub fn credited_in(
    index: &PlacementIndex,
    instance: InstanceId,
    model: &str,
    bs: u32,
    tokens: &[u32],
) -> u32 {
    let ns = Namespace {
        model,
        lora: None,
        cache_salt: None,
    };
    let mut out = PrefixMatches::default();
    index.match_prefix(&token_chain(&ns, tokens, bs as usize), 1, &mut out);
    out.get(instance).total()
}
