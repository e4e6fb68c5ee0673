//! Distribution summaries (mean and nearest-rank percentiles) of latency samples.
//!
//! Invariants: empty inputs summarise to all zeros (never NaN); percentiles use the nearest-rank
//! definition, so every reported percentile is an observed sample.

use serde::{Deserialize, Serialize};

/// Mean and percentiles of a set of samples, in the samples' unit (seconds throughout the simulator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Dist {
    /// Summarises `samples` (sorted in place).
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let mean = samples.iter().sum::<f64>() / n as f64;
        Self {
            count: n,
            mean,
            p50: percentile_sorted(samples, 0.50),
            p90: percentile_sorted(samples, 0.90),
            p99: percentile_sorted(samples, 0.99),
            max: samples[n - 1],
        }
    }
}

/// Nearest-rank percentile `q` (0..=1) of sorted samples; 0 for an empty slice.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let d = Dist::of(&mut v);
        assert_eq!(d.count, 100);
        assert_eq!(d.p50, 50.0);
        assert_eq!(d.p90, 90.0);
        assert_eq!(d.p99, 99.0);
        assert_eq!(d.max, 100.0);
        assert!((d.mean - 50.5).abs() < 1e-9);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Dist::of(&mut []), Dist::default());
        assert_eq!(percentile_sorted(&[], 0.5), 0.0);
        assert_eq!(percentile_sorted(&[3.0], 0.99), 3.0);
    }
}
