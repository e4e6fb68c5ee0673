//! msgpack encoding of KV event batches, byte-compatible with vLLM's publisher.
//!
//! Batch: `[ts: f64, [events...], data_parallel_rank: int|nil]`. Events in one of two encodings
//! (both pinned against golden vectors captured from vLLM's msgspec encoder):
//! - **legacy positional** (vLLM before PR #42892): `["BlockStored", block_hashes, parent|nil,
//!   token_ids, block_size, lora_id|nil, medium, lora_name|nil, extra_keys, group_idx,
//!   kv_cache_spec_kind, sliding_window|nil]`, `["BlockRemoved", block_hashes, medium,
//!   group_idx]`, `["AllBlocksCleared"]`;
//! - **map** (vLLM ≥ 0.26): the same fields keyed by name with `"type"` first; `sliding_window`
//!   (nil) omitted, as vLLM omits default-valued trailing fields.
//!
//! `extra_keys` is one nil per stored block (no LoRA / multimodal / salt keys), as vLLM sends.
//! Integers use msgpack's smallest encoding, like msgspec; hashes are unsigned 64-bit.

use rmp::encode as enc;
use serde::{Deserialize, Serialize};

use crate::model::{KvEvent, Medium};

/// Which event encoding to publish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EventEncoding {
    /// Map-shaped events (`{"type": "BlockStored", ...}`), vLLM ≥ 0.26.
    #[default]
    Map,
    /// Positional arrays with the class name first, older vLLM.
    Legacy,
}

const KV_CACHE_SPEC_KIND: &str = "full_attention";

/// Encodes one batch. Writing into a `Vec` cannot fail, so neither can this.
pub fn encode_batch(
    ts: f64,
    events: &[KvEvent],
    dp_rank: Option<i64>,
    encoding: EventEncoding,
) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64 + events.len() * 64);
    // Writes into a Vec<u8> are infallible; the Results are discarded for that reason.
    let _ = write_batch(&mut buf, ts, events, dp_rank, encoding);
    buf
}

type W = Vec<u8>;
type R = Result<(), EncErr>;

/// Write failure; cannot happen with a `Vec` writer.
struct EncErr;

impl From<std::io::Error> for EncErr {
    fn from(_: std::io::Error) -> Self {
        EncErr
    }
}

impl From<rmp::encode::ValueWriteError<std::io::Error>> for EncErr {
    fn from(_: rmp::encode::ValueWriteError<std::io::Error>) -> Self {
        EncErr
    }
}

fn write_batch(
    w: &mut W,
    ts: f64,
    events: &[KvEvent],
    dp_rank: Option<i64>,
    e: EventEncoding,
) -> R {
    enc::write_array_len(w, 3)?;
    enc::write_f64(w, ts)?;
    enc::write_array_len(w, events.len() as u32)?;
    for ev in events {
        match e {
            EventEncoding::Map => write_map_event(w, ev)?,
            EventEncoding::Legacy => write_legacy_event(w, ev)?,
        }
    }
    match dp_rank {
        Some(r) => {
            enc::write_sint(w, r)?;
        }
        None => enc::write_nil(w)?,
    }
    Ok(())
}

fn write_u64s(w: &mut W, xs: &[u64]) -> R {
    enc::write_array_len(w, xs.len() as u32)?;
    for &x in xs {
        enc::write_uint(w, x)?;
    }
    Ok(())
}

fn write_u32s(w: &mut W, xs: &[u32]) -> R {
    enc::write_array_len(w, xs.len() as u32)?;
    for &x in xs {
        enc::write_uint(w, u64::from(x))?;
    }
    Ok(())
}

fn write_opt_u64(w: &mut W, x: Option<u64>) -> R {
    match x {
        Some(v) => {
            enc::write_uint(w, v)?;
        }
        None => enc::write_nil(w)?,
    }
    Ok(())
}

fn write_nils(w: &mut W, n: usize) -> R {
    enc::write_array_len(w, n as u32)?;
    for _ in 0..n {
        enc::write_nil(w)?;
    }
    Ok(())
}

fn write_medium(w: &mut W, m: Medium) -> R {
    enc::write_str(w, m.as_str())?;
    Ok(())
}

fn write_legacy_event(w: &mut W, ev: &KvEvent) -> R {
    match ev {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
        } => {
            enc::write_array_len(w, 12)?;
            enc::write_str(w, "BlockStored")?;
            write_u64s(w, block_hashes)?;
            write_opt_u64(w, *parent_block_hash)?;
            write_u32s(w, token_ids)?;
            enc::write_uint(w, u64::from(*block_size))?;
            enc::write_nil(w)?; // lora_id
            write_medium(w, *medium)?;
            enc::write_nil(w)?; // lora_name
            write_nils(w, block_hashes.len())?; // extra_keys
            enc::write_uint(w, 0)?; // group_idx
            enc::write_str(w, KV_CACHE_SPEC_KIND)?;
            enc::write_nil(w)?; // sliding_window
        }
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => {
            enc::write_array_len(w, 4)?;
            enc::write_str(w, "BlockRemoved")?;
            write_u64s(w, block_hashes)?;
            write_medium(w, *medium)?;
            enc::write_uint(w, 0)?;
        }
        KvEvent::AllBlocksCleared => {
            enc::write_array_len(w, 1)?;
            enc::write_str(w, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_map_event(w: &mut W, ev: &KvEvent) -> R {
    match ev {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
        } => {
            enc::write_map_len(w, 11)?;
            enc::write_str(w, "type")?;
            enc::write_str(w, "BlockStored")?;
            enc::write_str(w, "block_hashes")?;
            write_u64s(w, block_hashes)?;
            enc::write_str(w, "parent_block_hash")?;
            write_opt_u64(w, *parent_block_hash)?;
            enc::write_str(w, "token_ids")?;
            write_u32s(w, token_ids)?;
            enc::write_str(w, "block_size")?;
            enc::write_uint(w, u64::from(*block_size))?;
            enc::write_str(w, "lora_id")?;
            enc::write_nil(w)?;
            enc::write_str(w, "medium")?;
            write_medium(w, *medium)?;
            enc::write_str(w, "lora_name")?;
            enc::write_nil(w)?;
            enc::write_str(w, "extra_keys")?;
            write_nils(w, block_hashes.len())?;
            enc::write_str(w, "group_idx")?;
            enc::write_uint(w, 0)?;
            enc::write_str(w, "kv_cache_spec_kind")?;
            enc::write_str(w, KV_CACHE_SPEC_KIND)?;
        }
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => {
            enc::write_map_len(w, 4)?;
            enc::write_str(w, "type")?;
            enc::write_str(w, "BlockRemoved")?;
            enc::write_str(w, "block_hashes")?;
            write_u64s(w, block_hashes)?;
            enc::write_str(w, "medium")?;
            write_medium(w, *medium)?;
            enc::write_str(w, "group_idx")?;
            enc::write_uint(w, 0)?;
        }
        KvEvent::AllBlocksCleared => {
            enc::write_map_len(w, 1)?;
            enc::write_str(w, "type")?;
            enc::write_str(w, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors");

    fn golden_events() -> Vec<KvEvent> {
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![3_236_607_068_019_569_386, 2_758_186_210_834_249_151],
                parent_block_hash: None,
                token_ids: (1..=32).collect(),
                block_size: 16,
                medium: Medium::Gpu,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![2_758_186_210_834_249_151],
                medium: Medium::Gpu,
            },
            KvEvent::AllBlocksCleared,
        ]
    }

    #[test]
    fn legacy_matches_golden_bytes() {
        let want = std::fs::read(format!("{VECTORS}/legacy_batch.msgpack")).unwrap();
        let got = encode_batch(
            1_700_000_000.5,
            &golden_events(),
            Some(0),
            EventEncoding::Legacy,
        );
        assert_eq!(got, want);
    }

    #[test]
    fn map_matches_golden_bytes() {
        let want = std::fs::read(format!("{VECTORS}/map_batch.msgpack")).unwrap();
        let got = encode_batch(
            1_700_000_000.5,
            &golden_events(),
            Some(0),
            EventEncoding::Map,
        );
        assert_eq!(got, want);
    }

    #[test]
    fn nil_rank_and_parent() {
        let ev = [KvEvent::BlockStored {
            block_hashes: vec![u64::MAX],
            parent_block_hash: Some(5),
            token_ids: vec![],
            block_size: 32,
            medium: Medium::Cpu,
        }];
        let b = encode_batch(0.0, &ev, None, EventEncoding::Map);
        assert_eq!(*b.last().unwrap(), 0xc0);
        // u64::MAX is a uint64, never a negative int.
        assert!(b
            .windows(9)
            .any(|w| w == [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
        assert!(b.windows(4).any(|w| w == [0xa3, b'C', b'P', b'U']));
    }
}
