//! Ingestion without sockets: re-hashing, copies, tiers, groups, block-size mismatch, bounds,
//! and the sequence logic (gap → replay, uncovered gap → wipe, restart → wipe) with an in-memory
//! replay source.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use kvgate_core::hash::{token_chain, Namespace};
use kvgate_core::index::{PlacementIndex, PrefixMatches};
use kvgate_core::InstanceId;
use kvgate_events::metrics::StreamMetrics;
use kvgate_events::replay::{ReplayError, Replayer};
use kvgate_events::subscriber::{handle_message, ClockFn, Message};
use kvgate_events::{Now, StreamIngest, WipeReason};

const I: InstanceId = InstanceId(1);

fn now() -> Now {
    Now {
        mono_ms: 1,
        unix_s: 1_700_000_000.0,
    }
}

fn apply(s: &mut StreamIngest, seq: u64, events: &[Ev]) {
    s.apply_payload(seq, &batch(events), now()).unwrap();
}

#[test]
fn chains_continue_from_the_parent_and_copies_are_counted() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(100, 12);
    apply(&mut s, 0, &[stored(&[11, 12], None, &t[..8])]);
    assert_eq!(credited(&idx, I, &t), 2);
    apply(&mut s, 1, &[stored(&[13], Some(12), &t[8..])]);
    assert_eq!(credited(&idx, I, &t), 3);
    assert_eq!(s.kv_hash_of(13), Some(chain(&t)[2]));
    // A second physical copy of block 13 needs two removals.
    apply(&mut s, 2, &[stored(&[13], Some(12), &t[8..])]);
    apply(&mut s, 3, &[removed(&[13])]);
    assert_eq!(credited(&idx, I, &t), 3);
    apply(&mut s, 4, &[removed(&[13])]);
    assert_eq!(credited(&idx, I, &t), 2);
    // Removing a block that was never stored is harmless.
    apply(&mut s, 5, &[removed(&[999, 13])]);
    assert_eq!(credited(&idx, I, &t), 2);
    assert_eq!(s.status().blocks_removed, 2);
}

#[test]
fn medium_sets_the_tier() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(0, 8);
    let ev = Ev::Stored {
        hashes: vec![1, 2],
        parent: None,
        tokens: t.clone(),
        block_size: BS,
        medium: "CPU",
        kind: "full_attention",
    };
    apply(&mut s, 0, &[ev]);
    let mut out = PrefixMatches::default();
    idx.match_prefix(&chain(&t), 1, &mut out);
    let m = out.get(I);
    assert_eq!((m.gpu, m.cpu, m.disk), (0, 2, 0));
    // Removing the GPU copy of a CPU-only block changes nothing.
    apply(&mut s, 1, &[removed(&[1, 2])]);
    assert_eq!(credited(&idx, I, &t), 2);
    let cpu_removal = Ev::Removed {
        hashes: vec![2],
        medium: "CPU",
    };
    apply(&mut s, 2, &[cpu_removal]);
    assert_eq!(credited(&idx, I, &t), 1);
}

#[test]
fn other_attention_groups_are_ignored() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(0, 4);
    let ev = Ev::Stored {
        hashes: vec![1],
        parent: None,
        tokens: t.clone(),
        block_size: BS,
        medium: "GPU",
        kind: "sliding_window",
    };
    apply(&mut s, 0, &[ev]);
    assert_eq!(credited(&idx, I, &t), 0);
    assert_eq!(s.status().ignored_events, 1);
}

#[test]
fn block_size_mismatch_is_flagged_not_matched() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(0, 16);
    let ev = Ev::Stored {
        hashes: vec![1, 2],
        parent: None,
        tokens: t.clone(),
        block_size: 8,
        medium: "GPU",
        kind: "full_attention",
    };
    apply(&mut s, 0, &[ev]);
    assert_eq!(s.status().block_size_mismatch, Some(8));
    assert_eq!(idx.instance_entries(I), 0);
    apply(&mut s, 1, &[stored(&[3], None, &t[..4])]);
    assert_eq!(s.status().block_size_mismatch, None);
    assert_eq!(credited(&idx, I, &t), 1);
}

#[test]
fn unknown_parents_and_bad_token_counts_are_skipped() {
    let idx = index();
    let mut s = stream(&idx, I);
    apply(&mut s, 0, &[stored(&[5, 6], Some(4), &toks(0, 8))]);
    assert_eq!(s.status().orphan_blocks, 2);
    apply(&mut s, 1, &[stored(&[7], None, &toks(0, 3))]);
    assert_eq!(s.status().ignored_events, 1);
    assert_eq!(idx.instance_entries(I), 0);
}

#[test]
fn tracking_is_bounded() {
    let idx = index();
    let mut p = params(I, true);
    p.max_tracked_blocks = 2;
    let mut s = StreamIngest::new(p, idx.clone(), StreamMetrics::new("t"));
    let t = toks(0, 12);
    apply(&mut s, 0, &[stored(&[1, 2, 3], None, &t)]);
    assert_eq!(s.status().untracked_blocks, 1);
    assert_eq!(credited(&idx, I, &t), 2);
    assert_eq!(idx.instance_entries(I), 2);
}

#[test]
fn lora_blocks_live_in_the_adapter_namespace() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(0, 4);
    let toks64: Vec<u64> = t.iter().map(|&x| u64::from(x)).collect();
    let payload = W::default()
        .arr(3)
        .f(1.0)
        .arr(1)
        .map(6)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .list(&[1])
        .s("token_ids")
        .list(&toks64)
        .s("block_size")
        .u(u64::from(BS))
        .s("lora_id")
        .u(7)
        .s("lora_name")
        .s("adapter")
        .u(0)
        .0;
    s.apply_payload(0, &payload, now()).unwrap();
    assert_eq!(credited(&idx, I, &t), 0);
    let lora_chain = token_chain(
        &Namespace {
            model: MODEL,
            lora: Some("adapter"),
            cache_salt: None,
        },
        &t,
        BS as usize,
    );
    let mut out = PrefixMatches::default();
    idx.match_prefix(&lora_chain, 1, &mut out);
    assert_eq!(out.get(I).total(), 1);
}

#[test]
fn wiping_one_of_several_streams_keeps_the_others() {
    let idx = index();
    let mut a = StreamIngest::new(params(I, false), idx.clone(), StreamMetrics::new("a"));
    let mut b = StreamIngest::new(params(I, false), idx.clone(), StreamMetrics::new("b"));
    let ta = toks(0, 4);
    let tb = toks(50, 4);
    apply(&mut a, 0, &[stored(&[1], None, &ta)]);
    apply(&mut b, 0, &[stored(&[2], None, &tb)]);
    // Both ranks hold a copy of one shared block.
    apply(&mut b, 1, &[stored(&[1], None, &ta)]);
    a.wipe(WipeReason::Restart);
    assert_eq!(credited(&idx, I, &ta), 1, "rank b still holds its copy");
    assert_eq!(credited(&idx, I, &tb), 1);
    b.wipe(WipeReason::Restart);
    assert_eq!(idx.instance_entries(I), 0);
}

/// An engine's replay buffer: every message published, from `first` on.
struct Buffer {
    frames: Vec<(u64, Bytes)>,
    fail: bool,
    calls: Vec<u64>,
}

impl Replayer for Buffer {
    async fn replay(&mut self, from: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        self.calls.push(from);
        if self.fail {
            return Err(ReplayError::Timeout);
        }
        Ok(self
            .frames
            .iter()
            .filter(|(s, _)| *s >= from)
            .cloned()
            .collect())
    }
}

fn clock() -> ClockFn {
    Arc::new(|| 5)
}

/// Five messages: each stores one block of a growing chain, the third also removes block 0.
fn engine_stream() -> (Vec<u32>, Vec<(u64, Bytes)>) {
    let t = toks(0, 20);
    let mut frames = Vec::new();
    for i in 0..5u64 {
        let parent = (i > 0).then_some(i);
        let lo = i as usize * 4;
        let mut evs = vec![stored(&[i + 1], parent, &t[lo..lo + 4])];
        if i == 2 {
            evs.push(removed(&[1]));
        }
        frames.push((i, Bytes::from(batch(&evs))));
    }
    (t, frames)
}

async fn deliver(s: &mut StreamIngest, r: Option<&mut Buffer>, frame: &(u64, Bytes)) {
    let msg = Message {
        seq: frame.0,
        payload: Some(frame.1.clone()),
    };
    handle_message(s, r, msg, &clock()).await;
}

#[tokio::test]
async fn gap_is_filled_by_replay() {
    let (t, frames) = engine_stream();
    let idx = index();
    let mut s = stream(&idx, I);
    let mut buf = Buffer {
        frames: frames.clone(),
        fail: false,
        calls: vec![],
    };
    deliver(&mut s, Some(&mut buf), &frames[0]).await;
    deliver(&mut s, Some(&mut buf), &frames[1]).await;
    // Messages 2 and 3 are lost.
    deliver(&mut s, Some(&mut buf), &frames[4]).await;
    assert_eq!(buf.calls, vec![2]);
    assert_eq!(s.status().gaps, 1);
    assert_eq!(s.status().replays_covered, 1);
    assert_eq!(s.status().wipes, 0);
    // Block 0 was removed in the lost message 2; blocks 1..=4 are held.
    assert_eq!(credited(&idx, I, &t), 0);
    assert_eq!(idx.instance_entries(I), 4);
    assert_eq!(s.check_seq(5), kvgate_events::SeqVerdict::Next);
}

#[tokio::test]
async fn uncovered_gap_wipes_then_rebuilds_from_what_is_known() {
    let (_t, frames) = engine_stream();
    let idx = index();
    let mut s = stream(&idx, I);
    // The engine's buffer has already lost message 2.
    let mut buf = Buffer {
        frames: frames[3..].to_vec(),
        fail: false,
        calls: vec![],
    };
    deliver(&mut s, Some(&mut buf), &frames[0]).await;
    deliver(&mut s, Some(&mut buf), &frames[1]).await;
    assert_eq!(idx.instance_entries(I), 2);
    deliver(&mut s, Some(&mut buf), &frames[4]).await;
    assert_eq!(s.status().replays_failed, 1);
    assert_eq!(s.status().last_wipe, Some(WipeReason::Gap));
    // Everything before the gap is gone; messages 3 and 4 extend chains whose parents were
    // dropped, so nothing can be re-hashed: the index holds nothing it cannot prove.
    assert_eq!(idx.instance_entries(I), 0);
    assert_eq!(s.status().orphan_blocks, 2);
}

#[tokio::test]
async fn gap_without_replay_or_with_failing_replay_wipes() {
    let (_t, frames) = engine_stream();
    for fail in [None, Some(true)] {
        let idx = index();
        let mut s = stream(&idx, I);
        let mut buf = Buffer {
            frames: frames.clone(),
            fail: true,
            calls: vec![],
        };
        if fail.is_some() {
            deliver(&mut s, Some(&mut buf), &frames[0]).await;
            deliver(&mut s, Some(&mut buf), &frames[2]).await;
        } else {
            deliver(&mut s, None, &frames[0]).await;
            deliver(&mut s, None, &frames[2]).await;
        }
        assert_eq!(s.status().last_wipe, Some(WipeReason::Gap));
        assert_eq!(idx.instance_entries(I), 0);
    }
}

#[tokio::test]
async fn restart_wipes_at_once() {
    let (t, frames) = engine_stream();
    let idx = index();
    let mut s = stream(&idx, I);
    for f in &frames[..2] {
        deliver(&mut s, None::<&mut Buffer>, f).await;
    }
    assert_eq!(credited(&idx, I, &t), 2);
    // The engine restarts: seq 0 again, same hashes, but its cache is empty. Its first message
    // stores an unrelated block.
    let other = toks(900, 4);
    let restart = (0u64, Bytes::from(batch(&[stored(&[77], None, &other)])));
    deliver(&mut s, None::<&mut Buffer>, &restart).await;
    assert_eq!(s.status().restarts, 1);
    assert_eq!(s.status().last_wipe, Some(WipeReason::Restart));
    assert_eq!(credited(&idx, I, &t), 0);
    assert_eq!(credited(&idx, I, &other), 1);
}

#[tokio::test]
async fn joining_mid_stream_catches_up_from_the_replay_buffer() {
    let (t, frames) = engine_stream();
    let idx = index();
    let mut s = stream(&idx, I);
    let mut buf = Buffer {
        frames: frames.clone(),
        fail: false,
        calls: vec![],
    };
    deliver(&mut s, Some(&mut buf), &frames[3]).await;
    assert_eq!(buf.calls, vec![0]);
    assert_eq!(s.status().wipes, 0);
    // Messages 0..=3 store blocks 0..=3 and remove block 0.
    assert_eq!(idx.instance_entries(I), 3);
    assert_eq!(s.kv_hash_of(4), Some(chain(&t)[3]));
    assert_eq!(
        credited(&idx, I, &t[4..]),
        0,
        "chains are rooted at token 0"
    );
}

#[tokio::test]
async fn skipped_payloads_advance_the_sequence() {
    let (_t, frames) = engine_stream();
    let idx = index();
    let mut s = stream(&idx, I);
    deliver(&mut s, None::<&mut Buffer>, &frames[0]).await;
    handle_message(
        &mut s,
        None::<&mut Buffer>,
        Message {
            seq: 1,
            payload: None,
        },
        &clock(),
    )
    .await;
    handle_message(
        &mut s,
        None::<&mut Buffer>,
        Message {
            seq: 2,
            payload: Some(Bytes::from_static(b"\xc1garbage")),
        },
        &clock(),
    )
    .await;
    assert_eq!(s.status().gaps, 0);
    assert_eq!(s.status().decode_errors, 2);
    assert_eq!(idx.instance_entries(I), 1);
}

/// A map-encoded `BlockStored` of one block (engine hash `hash`) with `extra_keys`
/// `[[keys...]]` and a LoRA name.
fn with_extra_keys(hash: u64, tokens: &[u32], lora: Option<&str>, keys: &[&str]) -> Vec<u8> {
    let toks64: Vec<u64> = tokens.iter().map(|&x| u64::from(x)).collect();
    let mut w = W::default()
        .arr(3)
        .f(1.0)
        .arr(1)
        .map(6)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .list(&[hash])
        .s("token_ids")
        .list(&toks64)
        .s("block_size")
        .u(u64::from(BS))
        .s("lora_name");
    w = match lora {
        Some(l) => w.s(l),
        None => w.nil(),
    };
    w = w.s("extra_keys").arr(1).arr(keys.len());
    for k in keys {
        w = w.s(k);
    }
    w.u(0).0
}

/// Blocks `tokens` credits on `I` when hashed under `lora` and `salt`.
fn credited_salted(
    idx: &PlacementIndex,
    lora: Option<&str>,
    salt: Option<&str>,
    tokens: &[u32],
) -> u32 {
    let chain = token_chain(
        &Namespace {
            model: MODEL,
            lora,
            cache_salt: salt,
        },
        tokens,
        BS as usize,
    );
    let mut out = PrefixMatches::default();
    idx.match_prefix(&chain, 1, &mut out);
    out.get(I).total()
}

#[test]
fn salted_blocks_are_credited_only_under_their_salt() {
    let idx = index();
    let mut s = stream(&idx, I);
    let t = toks(0, 4);
    s.apply_payload(0, &with_extra_keys(1, &t, None, &["salt-1"]), now())
        .unwrap();
    assert_eq!(credited(&idx, I, &t), 0, "credited to unsalted prompts");
    assert_eq!(credited_salted(&idx, None, Some("salt-2"), &t), 0);
    assert_eq!(credited_salted(&idx, None, Some("salt-1"), &t), 1);
    assert_eq!(s.status().ignored_events, 0);
    // vLLM also lists the LoRA name among the extra keys, before the salt.
    let u = toks(40, 4);
    s.apply_payload(
        1,
        &with_extra_keys(2, &u, Some("ad"), &["ad", "salt-1"]),
        now(),
    )
    .unwrap();
    assert_eq!(credited_salted(&idx, Some("ad"), Some("salt-1"), &u), 1);
    assert_eq!(credited_salted(&idx, Some("ad"), None, &u), 0);
    s.apply_payload(2, &with_extra_keys(3, &u, Some("ad"), &["ad"]), now())
        .unwrap();
    assert_eq!(credited_salted(&idx, Some("ad"), None, &u), 1);
    // Two different strings besides the LoRA name: not reproducible, skipped.
    let v = toks(80, 4);
    s.apply_payload(3, &with_extra_keys(4, &v, None, &["x", "y"]), now())
        .unwrap();
    assert_eq!(s.status().ignored_events, 1);
    assert_eq!(idx.instance_entries(I), 3);
}
