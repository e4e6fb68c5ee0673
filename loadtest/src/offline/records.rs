//! Per-request records of an offline run, in the live replay's format
//! ([`crate::replay::record::RequestRecord`]), so the same analysis reads both and a request can
//! be followed from the simulator to the live run of the same workload.
//!
//! Invariants: one record per request that was routed and ended (finished or refused), in
//! workload order; a request still running when a time-bounded run stopped has none (as a live
//! request cancelled at the drain has none). Times are virtual seconds from the first arrival;
//! the simulator sends on schedule, so `sent_at_s == scheduled_at_s`. `instance` is the engine's
//! index in fleet order.

use super::workload::OfflineRequest;
use crate::replay::record::{Outcome, RequestRecord};

/// What the simulation loop knows of each request, by workload index.
pub struct RequestTimes<'a> {
    /// The requests, in arrival order.
    pub reqs: &'a [OfflineRequest],
    /// The engine each was routed to (`u32::MAX`: never routed).
    pub placed: &'a [u32],
    /// Whether its engine refused it.
    pub rejected: &'a [bool],
    /// Its time to first token, virtual µs.
    pub ttft_us: &'a [Option<u64>],
    /// When it ended (finished or refused), virtual µs.
    pub done_us: &'a [Option<u64>],
    /// Prompt tokens its engine served from cache.
    pub cached: &'a [u32],
}

/// Status a refused request is recorded with: the engine had no room for it (queue full, or a
/// prompt beyond its context), which a live engine answers with a 503 or a 400 the simulator does
/// not tell apart.
pub const REFUSED_STATUS: u16 = 503;

/// The records of every request that ended.
pub fn request_records(t: &RequestTimes<'_>) -> Vec<RequestRecord> {
    let first = t.reqs.first().map_or(0, |r| r.arrival_us);
    let secs = |us: u64| us as f64 / 1e6;
    let mut out = Vec::with_capacity(t.reqs.len());
    for (i, r) in t.reqs.iter().enumerate() {
        let (Some(&placed), Some(&Some(done))) = (t.placed.get(i), t.done_us.get(i)) else {
            continue;
        };
        if placed == u32::MAX {
            continue;
        }
        let refused = t.rejected.get(i).copied().unwrap_or(false);
        let ttft = t.ttft_us.get(i).copied().flatten().filter(|_| !refused);
        let e2e = done.saturating_sub(r.arrival_us);
        let at = secs(r.arrival_us.saturating_sub(first));
        out.push(RequestRecord {
            index: i,
            scheduled_at_s: at,
            sent_at_s: at,
            input_length: r.prompt_tokens,
            output_length: r.output_tokens,
            ttft_s: ttft.map(secs),
            e2e_s: (!refused).then(|| secs(e2e)),
            itl_mean_s: ttft
                .filter(|_| r.output_tokens > 1)
                .map(|f| secs(e2e.saturating_sub(f)) / f64::from(r.output_tokens - 1)),
            itl_max_s: None,
            prompt_tokens: Some(r.prompt_tokens),
            completion_tokens: if refused { 0 } else { r.output_tokens },
            cached_tokens: (!refused).then(|| t.cached.get(i).copied().unwrap_or(0)),
            instance: Some(placed.to_string()),
            predicted_ttft_s: None,
            replica: None,
            tenant: None,
            reject_reason: None,
            outcome: if refused {
                Outcome::Rejected {
                    status: REFUSED_STATUS,
                }
            } else {
                Outcome::Ok
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(arrival_us: u64, output_tokens: u32) -> OfflineRequest {
        OfflineRequest {
            arrival_us,
            prompt_tokens: 100,
            output_tokens,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn finished_refused_and_unfinished_requests_are_recorded_as_the_replay_records_them() {
        let reqs = [
            req(1_000_000, 11),
            req(2_000_000, 1),
            req(3_000_000, 5),
            req(4_000_000, 5),
        ];
        let times = RequestTimes {
            reqs: &reqs,
            placed: &[2, 0, 1, u32::MAX],
            rejected: &[false, true, false, false],
            ttft_us: &[Some(500_000), None, Some(100_000), None],
            done_us: &[Some(2_500_000), Some(2_000_000), None, None],
            cached: &[64, 0, 0, 0],
        };
        let r = request_records(&times);
        // The third is still running and the fourth never routed: no records.
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].index, r[0].instance.as_deref()), (0, Some("2")));
        assert_eq!((r[0].scheduled_at_s, r[0].sent_at_s), (0.0, 0.0));
        assert_eq!((r[0].ttft_s, r[0].e2e_s), (Some(0.5), Some(1.5)));
        // Ten gaps after the first token over one second.
        assert!((r[0].itl_mean_s.unwrap_or(0.0) - 0.1).abs() < 1e-12);
        assert_eq!((r[0].cached_tokens, r[0].completion_tokens), (Some(64), 11));
        assert_eq!(r[0].outcome, Outcome::Ok);
        assert_eq!(r[1].scheduled_at_s, 1.0);
        assert_eq!(
            (r[1].ttft_s, r[1].e2e_s, r[1].completion_tokens),
            (None, None, 0)
        );
        assert_eq!(
            r[1].outcome,
            Outcome::Rejected {
                status: REFUSED_STATUS
            }
        );
    }
}
