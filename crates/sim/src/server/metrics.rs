//! Engine metrics: a snapshot refreshed by the engine loop, rendered in Prometheus text format
//! with vLLM's metric names or SGLang's.
//!
//! Invariants: fixed label sets (model name, and cache config values), fixed histogram buckets —
//! nothing here grows with traffic. TTFT is in simulated seconds (wall time × time scale), what a
//! real engine at full speed would report.

use std::fmt::Write;

use crate::model::{EngineLoadView, EngineModel, EngineStats};

/// vLLM's TTFT histogram buckets (seconds).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// A cumulative histogram with fixed buckets.
#[derive(Clone, Debug)]
pub struct Histogram {
    /// Count per bucket (non-cumulative; rendered cumulatively).
    pub counts: [u64; TTFT_BUCKETS.len()],
    /// Observations above the last bucket.
    pub overflow: u64,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; TTFT_BUCKETS.len()],
            overflow: 0,
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Records one value.
    pub fn observe(&mut self, v: f64) {
        match TTFT_BUCKETS.iter().position(|b| v <= *b) {
            Some(i) => self.counts[i] += 1,
            None => self.overflow += 1,
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (b, c) in TTFT_BUCKETS.iter().zip(self.counts.iter()) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// What `/metrics` and the load endpoints show.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Current load.
    pub load: EngineLoadView,
    /// Counters.
    pub stats: EngineStats,
    /// Time to first token.
    pub ttft: Histogram,
    /// Requests that completed.
    pub request_success: u64,
    /// Tokens held in the cache (used blocks × block size), for SGLang's `num_used_tokens`.
    pub used_tokens: u64,
    /// How closely the engine kept to scaled wall time.
    pub clock: ClockLag,
}

/// How the engine's virtual clock kept up with scaled wall time (virtual µs). A step sleeps until
/// the wall clock reaches its end; a late wake-up is paid back by the next sleeps, but what the
/// engine falls behind by more than its lag bound is skipped, and the engine is then slower than
/// its model by that much. Both show a simulated fleet that is short of CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockLag {
    /// Steps run.
    pub steps: u64,
    /// Sum over steps of how late the engine woke after the step's end, virtual µs.
    pub late_us: u64,
    /// Virtual time skipped because the engine fell too far behind, µs.
    pub skipped_us: u64,
}

impl Snapshot {
    /// Refreshes load and counters from the model.
    pub fn update(&mut self, m: &EngineModel) {
        self.load = m.load();
        self.stats = m.stats();
        let cap = u64::from(m.capacity_blocks()) * u64::from(m.params().block_size);
        self.used_tokens = (self.load.kv_usage * cap as f64).round() as u64;
    }

    /// Counters back to zero (engine restart).
    pub fn reset(&mut self) {
        *self = Snapshot::default();
    }

    /// Prefix hit ratio so far (0 when nothing was queried).
    pub fn hit_rate(&self) -> f64 {
        if self.stats.prefix_cache_queries == 0 {
            0.0
        } else {
            self.stats.prefix_cache_hits as f64 / self.stats.prefix_cache_queries as f64
        }
    }
}

/// Static facts rendered with the metrics.
pub struct MetricsInfo<'a> {
    /// Served model name.
    pub model: &'a str,
    /// Tokens per block.
    pub block_size: u32,
    /// GPU blocks.
    pub num_gpu_blocks: u32,
    /// CPU blocks.
    pub num_cpu_blocks: u32,
}

fn line(
    out: &mut String,
    kind: &str,
    name: &str,
    help: &str,
    labels: &str,
    v: impl std::fmt::Display,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{{labels}}} {v}");
}

/// The simulator's own clock counters (both flavours; no real engine has them).
fn render_clock(o: &mut String, c: &ClockLag, labels: &str) {
    line(
        o,
        "counter",
        "kvgate_sim_steps_total",
        "Engine steps run by the simulator.",
        labels,
        c.steps,
    );
    line(
        o,
        "counter",
        "kvgate_sim_step_late_seconds_total",
        "Sum over steps of how late the simulator woke after a step's end, engine-model seconds.",
        labels,
        c.late_us as f64 / 1e6,
    );
    line(
        o,
        "counter",
        "kvgate_sim_clock_skipped_seconds_total",
        "Engine-model time skipped because the simulator fell too far behind scaled wall time.",
        labels,
        c.skipped_us as f64 / 1e6,
    );
}

/// vLLM-flavoured exposition.
pub fn render_vllm(s: &Snapshot, info: &MetricsInfo<'_>) -> String {
    let mut o = String::with_capacity(4096);
    let l = format!("engine=\"0\",model_name=\"{}\"", escape(info.model));
    line(
        &mut o,
        "gauge",
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &l,
        s.load.running,
    );
    line(
        &mut o,
        "gauge",
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &l,
        s.load.waiting,
    );
    line(
        &mut o,
        "gauge",
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        s.load.kv_usage,
    );
    line(
        &mut o,
        "gauge",
        "vllm:gpu_cache_usage_perc",
        "GPU KV-cache usage (older name).",
        &l,
        s.load.kv_usage,
    );
    line(
        &mut o,
        "counter",
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        &l,
        s.stats.prefix_cache_queries,
    );
    line(
        &mut o,
        "counter",
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        &l,
        s.stats.prefix_cache_hits,
    );
    line(
        &mut o,
        "counter",
        "vllm:num_preemptions_total",
        "Cumulative number of preemptions.",
        &l,
        s.stats.preemptions,
    );
    line(
        &mut o,
        "counter",
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        &l,
        s.stats.prompt_tokens,
    );
    line(
        &mut o,
        "counter",
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        &l,
        s.stats.generation_tokens,
    );
    let ls = format!("{l},finished_reason=\"length\"");
    line(
        &mut o,
        "counter",
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        &ls,
        s.request_success,
    );
    let _ = writeln!(
        o,
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds."
    );
    let _ = writeln!(o, "# TYPE vllm:time_to_first_token_seconds histogram");
    s.ttft
        .render(&mut o, "vllm:time_to_first_token_seconds", &l);
    let lc = format!(
        "block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",num_cpu_blocks=\"{}\",num_gpu_blocks=\"{}\"",
        info.block_size, info.num_cpu_blocks, info.num_gpu_blocks
    );
    line(
        &mut o,
        "gauge",
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig.",
        &lc,
        1,
    );
    render_clock(&mut o, &s.clock, &l);
    o
}

/// SGLang-flavoured exposition.
pub fn render_sglang(s: &Snapshot, info: &MetricsInfo<'_>) -> String {
    let mut o = String::with_capacity(4096);
    let l = format!("model_name=\"{}\"", escape(info.model));
    line(
        &mut o,
        "gauge",
        "sglang:num_running_reqs",
        "The number of running requests.",
        &l,
        s.load.running,
    );
    line(
        &mut o,
        "gauge",
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        &l,
        s.load.waiting,
    );
    line(
        &mut o,
        "gauge",
        "sglang:token_usage",
        "The token usage.",
        &l,
        s.load.kv_usage,
    );
    line(
        &mut o,
        "gauge",
        "sglang:num_used_tokens",
        "The number of used tokens.",
        &l,
        s.used_tokens,
    );
    line(
        &mut o,
        "gauge",
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        &l,
        s.hit_rate(),
    );
    line(
        &mut o,
        "counter",
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens.",
        &l,
        s.stats.prefix_cache_hits,
    );
    line(
        &mut o,
        "counter",
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        &l,
        s.stats.prompt_tokens,
    );
    line(
        &mut o,
        "counter",
        "sglang:generation_tokens_total",
        "Number of generation tokens processed.",
        &l,
        s.stats.generation_tokens,
    );
    line(
        &mut o,
        "counter",
        "sglang:num_requests_total",
        "Number of requests processed.",
        &l,
        s.request_success,
    );
    let _ = writeln!(
        o,
        "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds."
    );
    let _ = writeln!(o, "# TYPE sglang:time_to_first_token_seconds histogram");
    s.ttft
        .render(&mut o, "sglang:time_to_first_token_seconds", &l);
    render_clock(&mut o, &s.clock, &l);
    o
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::default();
        h.observe(0.003);
        h.observe(0.3);
        h.observe(5000.0);
        let mut o = String::new();
        h.render(&mut o, "x", "a=\"b\"");
        assert!(o.contains("x_bucket{a=\"b\",le=\"0.005\"} 1"));
        assert!(o.contains("x_bucket{a=\"b\",le=\"0.5\"} 2"));
        assert!(o.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3"));
        assert!(o.contains("x_count{a=\"b\"} 3"));
    }

    #[test]
    fn both_flavours_report_the_clock() {
        let s = Snapshot {
            clock: ClockLag {
                steps: 7,
                late_us: 1_500_000,
                skipped_us: 250_000,
            },
            ..Snapshot::default()
        };
        let info = MetricsInfo {
            model: "m",
            block_size: 16,
            num_gpu_blocks: 1,
            num_cpu_blocks: 0,
        };
        for page in [render_vllm(&s, &info), render_sglang(&s, &info)] {
            assert!(page.contains("kvgate_sim_steps_total{"), "{page}");
            assert!(page.contains("} 7\n"), "{page}");
            assert!(
                page.contains("kvgate_sim_step_late_seconds_total{"),
                "{page}"
            );
            assert!(page.contains("} 1.5\n"), "{page}");
            assert!(
                page.contains("kvgate_sim_clock_skipped_seconds_total{"),
                "{page}"
            );
            assert!(page.contains("} 0.25\n"), "{page}");
        }
    }
}
