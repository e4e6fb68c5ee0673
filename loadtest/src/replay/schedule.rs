//! Arrival scheduling: when each request is sent, relative to the start of the replay.
//!
//! Open loop: arrival times never depend on responses. Trace mode keeps the trace's own
//! timestamps (relative to its first request) divided by a speed-up factor; Poisson mode draws
//! exponential gaps at a fixed rate from a seeded generator, so a schedule is reproducible.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::trace::TraceRequest;

/// How arrivals are timed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// The trace's timestamps divided by `speed_up`.
    Trace {
        /// Replay speed factor (2.0 = twice as fast).
        speed_up: f64,
    },
    /// Poisson arrivals at `rate` requests/s, seeded.
    Poisson {
        /// Mean arrival rate, requests per second.
        rate: f64,
        /// Generator seed.
        seed: u64,
    },
}

/// Why a schedule cannot be made.
#[derive(Debug, thiserror::Error)]
#[error("invalid arrival parameter: {0}")]
pub struct ScheduleError(String);

/// Send offsets from the replay start, one per request, non-decreasing.
pub fn schedule(
    requests: &[TraceRequest],
    arrivals: Arrivals,
) -> Result<Vec<Duration>, ScheduleError> {
    match arrivals {
        Arrivals::Trace { speed_up } => {
            if !(speed_up.is_finite() && speed_up > 0.0) {
                return Err(ScheduleError(format!(
                    "speed-up must be > 0, got {speed_up}"
                )));
            }
            let t0 = requests.first().map_or(0, |r| r.timestamp_ms);
            Ok(requests
                .iter()
                .map(|r| {
                    let ms = r.timestamp_ms.saturating_sub(t0) as f64 / speed_up;
                    Duration::from_secs_f64(ms / 1000.0)
                })
                .collect())
        }
        Arrivals::Poisson { rate, seed } => {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(ScheduleError(format!("rate must be > 0, got {rate}")));
            }
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut t = 0.0f64;
            Ok(requests
                .iter()
                .enumerate()
                .map(|(i, _)| {
                    if i > 0 {
                        // Inverse-CDF sample of Exp(rate); 1 - u avoids ln(0).
                        let u: f64 = rng.gen();
                        t += -(1.0 - u).ln() / rate;
                    }
                    Duration::from_secs_f64(t)
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reqs(ts: &[u64]) -> Vec<TraceRequest> {
        ts.iter()
            .map(|&t| TraceRequest {
                timestamp_ms: t,
                input_length: 1,
                output_length: 1,
                hash_ids: vec![0],
            })
            .collect()
    }

    #[test]
    fn trace_timestamps_scaled() {
        let s = schedule(
            &reqs(&[1000, 1000, 3000, 9000]),
            Arrivals::Trace { speed_up: 2.0 },
        )
        .unwrap();
        assert_eq!(
            s,
            vec![
                Duration::ZERO,
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(4)
            ]
        );
        assert!(schedule(&reqs(&[0]), Arrivals::Trace { speed_up: 0.0 }).is_err());
    }

    #[test]
    fn poisson_mean_rate_and_seed() {
        let r = reqs(&vec![0; 20_000]);
        let a = schedule(
            &r,
            Arrivals::Poisson {
                rate: 50.0,
                seed: 3,
            },
        )
        .unwrap();
        let b = schedule(
            &r,
            Arrivals::Poisson {
                rate: 50.0,
                seed: 3,
            },
        )
        .unwrap();
        let c = schedule(
            &r,
            Arrivals::Poisson {
                rate: 50.0,
                seed: 4,
            },
        )
        .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let rate = (a.len() - 1) as f64 / a.last().unwrap().as_secs_f64();
        // 20k exponential gaps: the relative standard error of the mean is ~0.7 %.
        assert!((rate - 50.0).abs() < 2.5, "rate {rate}");
        assert!(schedule(
            &r,
            Arrivals::Poisson {
                rate: -1.0,
                seed: 0
            }
        )
        .is_err());
    }
}
