//! Summary statistics over measured samples: exact percentiles, means, shares, time buckets.
//!
//! Percentiles use the nearest-rank method on the sorted samples (no interpolation, no sketch),
//! so every reported percentile is a latency some request actually saw. Empty inputs give `None`
//! or zero rather than NaN.

use std::collections::BTreeMap;

use serde::Serialize;

/// Distribution summary of one latency metric, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
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

impl Summary {
    /// Summarises samples (NaN samples are dropped).
    pub fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        Summary {
            count: v.len(),
            mean: mean(&v),
            p50: percentile_sorted(&v, 50.0).unwrap_or(0.0),
            p90: percentile_sorted(&v, 90.0).unwrap_or(0.0),
            p99: percentile_sorted(&v, 99.0).unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Nearest-rank percentile `p` (0–100) of ascending `sorted` samples; `None` when empty.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Arithmetic mean; 0 when empty.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// `a / b`, or 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// Fraction of the total per key, keys sorted.
pub fn shares(counts: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    let total: u64 = counts.values().sum();
    counts
        .iter()
        .map(|(k, &v)| (k.clone(), ratio(v as f64, total as f64)))
        .collect()
}

/// Coefficient of variation (std dev / mean) of per-instance counts: 0 means perfectly even.
pub fn imbalance(counts: &[f64]) -> f64 {
    if counts.is_empty() {
        return 0.0;
    }
    let m = mean(counts);
    let var = counts.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / counts.len() as f64;
    ratio(var.sqrt(), m)
}

/// Sums `(time_s, value)` points into fixed-width buckets; bucket `i` covers `[i·w, (i+1)·w)`.
/// Returns `(bucket start, sum, count)` for every bucket up to the last non-empty one.
pub fn buckets(points: &[(f64, f64)], width_s: f64, max_buckets: usize) -> Vec<(f64, f64, u64)> {
    if points.is_empty() || width_s <= 0.0 || max_buckets == 0 {
        return Vec::new();
    }
    let last = points.iter().map(|p| p.0).fold(0.0f64, f64::max);
    let n = (((last / width_s).floor() as usize) + 1).min(max_buckets);
    let mut out: Vec<(f64, f64, u64)> = (0..n).map(|i| (i as f64 * width_s, 0.0, 0)).collect();
    for &(t, v) in points {
        let i = ((t.max(0.0) / width_s).floor() as usize).min(n - 1);
        out[i].1 += v;
        out[i].2 += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 50.0), Some(50.0));
        assert_eq!(percentile_sorted(&v, 99.0), Some(99.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(100.0));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(percentile_sorted(&[], 50.0), None);
        let s = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!(s.count, 3);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.p99, 3.0);
        assert!((s.mean - 2.0).abs() < 1e-12);
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    #[test]
    fn shares_and_ratios() {
        let mut c = BTreeMap::new();
        c.insert("a".to_string(), 3);
        c.insert("b".to_string(), 1);
        let s = shares(&c);
        assert_eq!(s["a"], 0.75);
        assert_eq!(ratio(1.0, 0.0), 0.0);
        assert_eq!(imbalance(&[2.0, 2.0]), 0.0);
        assert!((imbalance(&[0.0, 2.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn bucketing() {
        let b = buckets(&[(0.1, 1.0), (0.9, 2.0), (2.5, 4.0)], 1.0, 100);
        assert_eq!(b, vec![(0.0, 3.0, 2), (1.0, 0.0, 0), (2.0, 4.0, 1)]);
        // Overflow lands in the last bucket rather than growing without bound.
        let b = buckets(&[(0.0, 1.0), (50.0, 1.0)], 1.0, 3);
        assert_eq!(b.len(), 3);
        assert_eq!(b[2].2, 1);
    }
}
