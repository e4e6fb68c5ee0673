//! Reference KV-event batch decoding over an `rmpv` tree, from `kvgate_events::decode`'s
//! contract (its `//!` doc and the field layouts it names), and the comparison the target runs.

use kvgate_events::decode::{fold, BlockRemoved, BlockStored, MAX_EXTRA_KEYS};
use kvgate_events::{Dialect, EventBatch, KvEvent};
use rmpv::Value;

/// The contract says "not a batch" (or a field out of range).
#[derive(Debug, PartialEq)]
pub struct Reject;

type R<T> = Result<T, Reject>;

fn f64_of(v: &Value) -> R<f64> {
    match v {
        Value::F32(f) => Ok(f64::from(*f)),
        Value::F64(f) => Ok(*f),
        Value::Integer(i) => Ok(match i.as_u64() {
            Some(u) => u as f64,
            None => i.as_i64().ok_or(Reject)? as f64,
        }),
        _ => Err(Reject),
    }
}

/// An integer's 64-bit pattern.
fn bits(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => i.as_u64().or(i.as_i64().map(|x| x as u64)),
        _ => None,
    }
}

fn str_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// nil → None; an unsigned integer within u32; anything else rejects.
fn opt_u32(v: &Value) -> R<Option<u32>> {
    match v {
        Value::Nil => Ok(None),
        Value::Integer(i) => match i.as_u64() {
            Some(u) => u32::try_from(u).map(Some).map_err(|_| Reject),
            None => Err(Reject),
        },
        _ => Err(Reject),
    }
}

/// A u32, or None for anything else.
fn opt_u32_or_skip(v: &Value) -> Option<u32> {
    match v {
        Value::Integer(i) => i.as_u64().and_then(|u| u32::try_from(u).ok()),
        _ => None,
    }
}

fn hash(v: &Value, d: Dialect) -> R<u64> {
    match v {
        Value::Integer(_) => bits(v).ok_or(Reject),
        Value::Binary(b) => Ok(fold(b, d)),
        Value::String(s) => Ok(fold(s.as_bytes(), d)),
        _ => Err(Reject),
    }
}

fn hashes(v: &Value, d: Dialect) -> R<Vec<u64>> {
    match v {
        Value::Array(a) => a.iter().map(|h| hash(h, d)).collect(),
        _ => Err(Reject),
    }
}

fn opt_hash(v: &Value, d: Dialect) -> R<Option<u64>> {
    match v {
        Value::Nil => Ok(None),
        v => hash(v, d).map(Some),
    }
}

fn tokens(v: &Value) -> R<Vec<u32>> {
    let Value::Array(a) = v else {
        return Err(Reject);
    };
    a.iter()
        .map(|t| match t {
            Value::Integer(i) => i.as_u64().and_then(|u| u32::try_from(u).ok()).ok_or(Reject),
            _ => Err(Reject),
        })
        .collect()
}

fn extra_key(v: &Value, e: &mut BlockStored) {
    match v {
        Value::String(_) if e.extra_key_strings.len() < MAX_EXTRA_KEYS => {
            e.extra_key_strings.push(str_of(v).unwrap_or_default())
        }
        Value::Nil => {}
        _ => e.extra_keys_opaque = true,
    }
}

fn extra_keys(v: &Value, e: &mut BlockStored) {
    match v {
        Value::Nil => {}
        Value::Array(blocks) => {
            for b in blocks {
                match b {
                    Value::Nil => {}
                    Value::Array(keys) => keys.iter().for_each(|k| extra_key(k, e)),
                    k => extra_key(k, e),
                }
            }
        }
        _ => e.extra_keys_opaque = true,
    }
}

fn positional(a: &[Value], d: Dialect) -> R<Option<KvEvent>> {
    let Some(tag) = a.first().and_then(str_of) else {
        return Ok(None);
    };
    let f = &a[1..];
    Ok(match tag.as_str() {
        "BlockStored" => {
            let mut e = BlockStored::default();
            for (i, v) in f.iter().enumerate() {
                match i {
                    0 => e.block_hashes = hashes(v, d)?,
                    1 => e.parent = opt_hash(v, d)?,
                    2 => e.token_ids = tokens(v)?,
                    3 => e.block_size = opt_u32(v)?.unwrap_or(0),
                    4 => e.lora_id = bits(v).map(|b| b as i64),
                    5 => e.medium = str_of(v),
                    6 => e.lora_name = str_of(v),
                    7 => extra_keys(v, &mut e),
                    8 => e.group_idx = opt_u32_or_skip(v),
                    9 => e.kv_cache_spec_kind = str_of(v),
                    _ => {}
                }
            }
            Some(KvEvent::BlockStored(e))
        }
        "BlockRemoved" => {
            let mut e = BlockRemoved::default();
            for (i, v) in f.iter().enumerate() {
                match i {
                    0 => e.block_hashes = hashes(v, d)?,
                    1 => e.medium = str_of(v),
                    2 => e.group_idx = opt_u32_or_skip(v),
                    _ => {}
                }
            }
            Some(KvEvent::BlockRemoved(e))
        }
        "AllBlocksCleared" => Some(KvEvent::AllBlocksCleared),
        _ => None,
    })
}

fn map_event(m: &[(Value, Value)], d: Dialect) -> R<Option<KvEvent>> {
    let mut tag = None;
    let mut s = BlockStored::default();
    let mut removed_medium = None;
    let mut group_idx = None;
    let mut have_hashes = false;
    for (k, v) in m {
        let key = str_of(k).unwrap_or_default();
        match key.as_str() {
            "type" | "event_type" => tag = str_of(v),
            "block_hashes" => {
                s.block_hashes = hashes(v, d)?;
                have_hashes = true;
            }
            "parent_block_hash" => s.parent = opt_hash(v, d)?,
            "token_ids" => s.token_ids = tokens(v)?,
            "block_size" | "page_size" => s.block_size = opt_u32(v)?.unwrap_or(0),
            "lora_id" => s.lora_id = bits(v).map(|b| b as i64),
            "medium" => {
                removed_medium = str_of(v);
                s.medium = removed_medium.clone();
            }
            "lora_name" => s.lora_name = str_of(v),
            "group_idx" => group_idx = opt_u32_or_skip(v),
            "kv_cache_spec_kind" => s.kv_cache_spec_kind = str_of(v),
            "extra_keys" => extra_keys(v, &mut s),
            _ => {}
        }
    }
    s.group_idx = group_idx;
    Ok(match tag.as_deref() {
        Some("BlockStored") if !have_hashes => return Err(Reject),
        Some("BlockStored") => Some(KvEvent::BlockStored(s)),
        Some("BlockRemoved") => Some(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: s.block_hashes,
            medium: removed_medium,
            group_idx,
        })),
        Some("AllBlocksCleared") => Some(KvEvent::AllBlocksCleared),
        _ => None,
    })
}

fn events(v: &Value, d: Dialect, b: &mut EventBatch) -> R<()> {
    let Value::Array(a) = v else {
        return Err(Reject);
    };
    for e in a {
        let e = match e {
            Value::Array(f) => positional(f, d)?,
            Value::Map(m) => map_event(m, d)?,
            _ => None,
        };
        match e {
            Some(e) => b.events.push(e),
            None => b.unknown_events += 1,
        }
    }
    Ok(())
}

/// What `decode_batch` must give for the payload `v` (one whole msgpack value).
pub fn batch(v: &Value, d: Dialect) -> R<EventBatch> {
    let mut b = EventBatch::default();
    match v {
        Value::Array(a) => {
            if a.len() < 2 {
                return Err(Reject);
            }
            b.ts = f64_of(&a[0])?;
            events(&a[1], d, &mut b)?;
            if let Some(r) = a.get(2) {
                b.dp_rank = opt_u32(r)?;
            }
        }
        Value::Map(m) => {
            let mut saw = false;
            for (k, v) in m {
                match str_of(k).unwrap_or_default().as_str() {
                    "ts" => b.ts = f64_of(v)?,
                    "events" => {
                        events(v, d, &mut b)?;
                        saw = true;
                    }
                    "data_parallel_rank" | "dp_rank" | "attn_dp_rank" => b.dp_rank = opt_u32(v)?,
                    _ => {}
                }
            }
            if !saw {
                return Err(Reject);
            }
        }
        _ => return Err(Reject),
    }
    Ok(b)
}

/// Deepest array/map nesting in `v` (a scalar is 0).
pub fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Map(m) => {
            1 + m
                .iter()
                .map(|(k, v)| depth(k).max(depth(v)))
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}
