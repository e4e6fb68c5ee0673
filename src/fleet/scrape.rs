//! Parsing engine-reported load from an instance's Prometheus `/metrics` text.
//!
//! Invariants:
//! - Pure parsing: the background task ([`super::tasks`]) fetches, this only reads text.
//! - Series of one metric with several label sets (data-parallel ranks, several models) are
//!   summed for counts and maxed for utilisation. Unknown metrics are ignored.

use crate::config::Flavour;

/// What a scrape yielded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scraped {
    /// Requests running in the batch.
    pub running: u32,
    /// Requests queued.
    pub waiting: u32,
    /// KV cache utilisation 0..1.
    pub kv_usage: f32,
    /// KV cache capacity in blocks (vLLM `cache_config_info{num_gpu_blocks}`).
    pub capacity_blocks: Option<u64>,
    /// True when at least one load metric was present.
    pub found: bool,
}

struct Names {
    running: &'static [&'static str],
    waiting: &'static [&'static str],
    usage: &'static [&'static str],
}

const VLLM: Names = Names {
    running: &["vllm:num_requests_running"],
    waiting: &["vllm:num_requests_waiting"],
    usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
};

const SGLANG: Names = Names {
    running: &["sglang:num_running_reqs"],
    waiting: &["sglang:num_queue_reqs"],
    usage: &["sglang:token_usage"],
};

/// Splits a sample line into (name, labels, value).
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let (labels, rest) = if let Some(stripped) = rest.strip_prefix('{') {
        let end = stripped.rfind('}')?;
        (&stripped[..end], &stripped[end + 1..])
    } else {
        ("", rest)
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

/// Value of label `key` in a label list like `a="1",b="x"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let k = rest[..eq].trim().trim_start_matches(',').trim();
        let after = rest[eq + 1..].strip_prefix('"')?;
        let end = after.find('"')?;
        if k == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

/// Parses `/metrics` text for `flavour`.
pub fn parse_metrics(text: &str, flavour: Flavour) -> Scraped {
    let names = match flavour {
        Flavour::Vllm => &VLLM,
        Flavour::Sglang => &SGLANG,
    };
    let mut s = Scraped::default();
    let (mut running, mut waiting, mut usage) = (0.0f64, 0.0f64, 0.0f64);
    for line in text.lines() {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        if names.running.contains(&name) {
            running += value;
            s.found = true;
        } else if names.waiting.contains(&name) {
            waiting += value;
            s.found = true;
        } else if names.usage.contains(&name) {
            usage = usage.max(value);
            s.found = true;
        } else if name == "vllm:cache_config_info" {
            if let Some(n) = label(labels, "num_gpu_blocks").and_then(|v| v.parse::<u64>().ok()) {
                if n > 0 {
                    s.capacity_blocks = Some(n);
                }
            }
        }
    }
    s.running = running.clamp(0.0, u32::MAX as f64) as u32;
    s.waiting = waiting.clamp(0.0, u32::MAX as f64) as u32;
    s.kv_usage = usage.clamp(0.0, 1.0) as f32;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_metrics() {
        let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
vllm:num_requests_waiting{model_name=\"m\"} 7\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n\
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4096\",prefix=\"a,b\"} 1.0\n";
        let s = parse_metrics(text, Flavour::Vllm);
        assert_eq!((s.running, s.waiting), (5, 7));
        assert!((s.kv_usage - 0.25).abs() < 1e-6);
        assert_eq!(s.capacity_blocks, Some(4096));
        assert!(s.found);
    }

    #[test]
    fn sglang_metrics_and_garbage() {
        let text = "sglang:num_running_reqs 4\nsglang:num_queue_reqs{tp_rank=\"0\"} 1\nsglang:token_usage 0.5\nnot a metric line {\n";
        let s = parse_metrics(text, Flavour::Sglang);
        assert_eq!((s.running, s.waiting), (4, 1));
        assert!(s.found);
        assert!(!parse_metrics("garbage", Flavour::Vllm).found);
    }
}
