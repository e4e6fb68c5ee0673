//! Follow-up turns of a replayed trace: requests whose prompt continues an earlier request's,
//! and whether the router sent them where that earlier request ran.
//!
//! A trace's `hash_ids` name prefix blocks (an id at position `k` stands for the whole prefix up
//! to `k`), so the earlier request a prompt continues is the latest one sent before it that held
//! its deepest known block. A request counts as a follow-up when that shared prefix is at least
//! [`MIN_SHARED_BLOCKS`] blocks and at least half of its own prompt: a shared system prompt alone
//! does not make a follow-up, a conversation's previous turn does.
//!
//! This is what "the next turn lands on the previous turn's instance" means for a router, and it
//! is the like-for-like comparison of one gateway against several replicas: their hit ratios mix
//! in first turns, whose number differs from run to run.
//!
//! Invariants: memory is one map entry per distinct block id of the slice; only requests that
//! completed with a known instance take part, as earlier requests or as follow-ups.

use std::collections::HashMap;

use serde::Serialize;

use crate::replay::{Outcome, RequestRecord};
use crate::trace::TraceRequest;

/// Fewest shared blocks that make a follow-up.
pub const MIN_SHARED_BLOCKS: usize = 2;

/// How a router treated follow-up turns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FollowUps {
    /// Follow-up requests (completed, instance known, continuing a completed earlier one).
    pub requests: usize,
    /// Of those, sent to the instance that served the request they continue.
    pub same_instance: usize,
    /// Their prompt tokens served from cache, over their prompt tokens (when reported).
    pub hit_ratio: Option<f64>,
}

impl FollowUps {
    /// `same_instance / requests` (0 without follow-ups).
    pub fn same_instance_fraction(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.same_instance as f64 / self.requests as f64
        }
    }
}

/// Follow-ups among `records` (any order; `index` into `requests`), in send order.
pub fn follow_ups(requests: &[TraceRequest], records: &[RequestRecord]) -> Option<FollowUps> {
    let mut done: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok) && r.instance.is_some())
        .filter(|r| r.index < requests.len())
        .collect();
    if done.is_empty() {
        return None;
    }
    done.sort_by(|a, b| {
        a.sent_at_s
            .total_cmp(&b.sent_at_s)
            .then(a.index.cmp(&b.index))
    });
    // Block id → the latest request (position in `done`) that held it.
    let mut holder: HashMap<u64, usize> = HashMap::new();
    let (mut n, mut same, mut cached, mut prompt) = (0usize, 0usize, 0u64, 0u64);
    for (pos, rec) in done.iter().enumerate() {
        let ids = &requests[rec.index].hash_ids;
        let deepest = ids
            .iter()
            .enumerate()
            .rev()
            .find_map(|(k, id)| holder.get(id).map(|&p| (k + 1, p)));
        if let Some((shared, earlier)) = deepest {
            if shared >= MIN_SHARED_BLOCKS && 2 * shared >= ids.len() {
                n += 1;
                same += usize::from(done[earlier].instance == rec.instance);
                if let (Some(c), Some(p)) = (rec.cached_tokens, rec.prompt_tokens) {
                    cached += u64::from(c);
                    prompt += u64::from(p);
                }
            }
        }
        for id in ids {
            holder.insert(*id, pos);
        }
    }
    Some(FollowUps {
        requests: n,
        same_instance: same,
        hit_ratio: (prompt > 0).then(|| cached as f64 / prompt as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp_ms: 0,
            input_length: 64 * ids.len() as u32,
            output_length: 1,
            hash_ids: ids.to_vec(),
        }
    }

    fn rec(index: usize, sent: f64, inst: &str, cached: u32) -> RequestRecord {
        RequestRecord {
            index,
            scheduled_at_s: sent,
            sent_at_s: sent,
            input_length: 256,
            output_length: 1,
            ttft_s: Some(0.1),
            e2e_s: Some(0.2),
            itl_mean_s: None,
            itl_max_s: None,
            prompt_tokens: Some(256),
            completion_tokens: 1,
            cached_tokens: Some(cached),
            instance: Some(inst.to_string()),
            replica: None,
            predicted_ttft_s: None,
            tenant: None,
            reject_reason: None,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn a_turn_continuing_the_previous_one_is_a_follow_up() {
        let trace = [
            req(&[1, 2, 3]),       // first turn of conversation A
            req(&[9, 20, 21]),     // unrelated but for its first block
            req(&[1, 2, 3, 4]),    // A's second turn: continues request 0
            req(&[9, 30, 31, 32]), // shares one block with request 1: not a follow-up
            req(&[1, 2, 3, 4, 5]), // A's third turn: continues request 2
        ];
        let records = [
            rec(4, 4.0, "b", 200),
            rec(0, 0.0, "a", 0),
            rec(1, 1.0, "b", 0),
            rec(2, 2.0, "a", 192),
            rec(3, 3.0, "a", 0),
        ];
        let f = follow_ups(&trace, &records).unwrap();
        // Requests 2 (on a, like 0) and 4 (on b, unlike 2).
        assert_eq!((f.requests, f.same_instance), (2, 1));
        assert!((f.hit_ratio.unwrap() - (392.0 / 512.0)).abs() < 1e-9);
        assert!((f.same_instance_fraction() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn failed_requests_take_no_part() {
        let trace = [req(&[1, 2]), req(&[1, 2, 3])];
        let mut first = rec(0, 0.0, "a", 0);
        first.outcome = Outcome::Error {
            class: crate::replay::ErrorClass::Other,
        };
        let f = follow_ups(&trace, &[first, rec(1, 1.0, "a", 0)]).unwrap();
        assert_eq!(f.requests, 0);
        assert!(follow_ups(&trace, &[]).is_none());
    }
}
