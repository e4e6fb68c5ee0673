//! Gateway sizing: the CPU and memory kvgate itself needs per 100 req/s, by prompt length, kind
//! of traffic, hash mode, index size and serving threads (`loadtest/sizing.sh` runs it).
//!
//! The driver ([`drive::run`]) talks to one running gateway in front of cheap static backends:
//! it fills the placement index through real requests (unique prompts, so every block is a new
//! entry) until the gateway's own `kvgate_index_entries` gauge reports the target, measures the
//! gateway's idle CPU with that index, then for each cell (a prompt length and a kind) sends
//! requests open loop at a fixed rate for a bounded time and reads the gateway's CPU seconds and
//! memory from `/proc` around the window. The figures are CPU *time*, which other load on a
//! shared machine moves far less than it moves latency or throughput.
//!
//! Invariants:
//! - a cell's CPU figure is the gateway process's `utime + stime` over its measured window (from
//!   the first request sent to the last answer received), which covers its background work too;
//!   [`CellRecord::cores_per_100`] scales the per-request part to 100 req/s and adds the idle
//!   part once, so it is the measured cores when the cell ran at 100 req/s;
//! - every request of a window counts: an answer other than 2xx, or none, is an error;
//! - a cell's rate is the asked rate unless a short closed-loop pilot shows the gateway would
//!   need more than the budget of cores at it (the machine must not saturate, or queueing, not
//!   the gateway, is measured); then the rate is lowered and the record says so.
//!
//! # Layout
//! - [`bodies`]: unique prompts, multi-turn conversations and index-fill bodies.
//! - [`drive`]: the fill, the pilot and the open-loop windows against one gateway.
//! - [`procfs`]: CPU ticks and resident memory from `/proc`.
//! - [`table`]: the records as Markdown, CSV and JSON.

pub mod bodies;
pub mod drive;
pub mod procfs;
pub mod table;

use serde::{Deserialize, Serialize};

/// How the gateway under test hashes prompts (decides the fill bodies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum HashKind {
    /// Token mode: the fill sends token ids (hashed as they are, no tokenization).
    Token,
    /// Text mode: the fill sends text.
    Text,
}

impl HashKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            HashKind::Token => "token",
            HashKind::Text => "text",
        }
    }
}

/// Kind of traffic in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Every prompt new: nothing cached, every block a new index entry.
    Unique,
    /// Conversations growing by an answer and a new user message per request.
    #[value(name = "multi")]
    #[serde(rename = "multi")]
    MultiTurn,
}

impl Kind {
    /// Short name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Unique => "unique",
            Kind::MultiTurn => "multi",
        }
    }
}

/// One measured cell: a gateway configuration, a prompt length and a kind of traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Hash mode of the gateway.
    pub mode: HashKind,
    /// `server.threads` of the gateway.
    pub threads: usize,
    /// Index size the fill aimed at (also the gateway's `routing.index.max_entries`).
    pub index_target: u64,
    /// `kvgate_index_entries` after the fill.
    pub index_after_fill: u64,
    /// `kvgate_index_entries` after the cell's window.
    pub index_after_cell: u64,
    /// Gateway RSS after the fill, MiB.
    pub rss_after_fill_mib: f64,
    /// Gateway cores used with the filled index and no traffic.
    pub idle_cores: f64,
    /// Mean prompt length asked, content tokens.
    pub tokens: u32,
    /// Kind of traffic.
    pub kind: Kind,
    /// Requests per second of the window.
    pub rate: f64,
    /// The rate asked for (higher than `rate` when the pilot lowered it).
    pub rate_asked: f64,
    /// Requests sent in the window.
    pub requests: u64,
    /// Requests that got no 2xx answer.
    pub errors: u64,
    /// The first error seen, if any.
    pub first_error: Option<String>,
    /// Window length, from the first request sent to the last answer, seconds.
    pub wall_s: f64,
    /// Gateway CPU seconds over the window.
    pub cpu_s: f64,
    /// Backend CPU seconds over the window.
    pub backend_cpu_s: f64,
    /// Driver CPU seconds over the window.
    pub driver_cpu_s: f64,
    /// Gateway cores needed for 100 req/s of this cell (see the module invariants).
    pub cores_per_100: f64,
    /// Gateway CPU per request, ms (window CPU over requests, background included).
    pub cpu_ms_per_request: f64,
    /// Client-side latency through the gateway to the static backend, ms.
    pub p50_ms: f64,
    /// 99th percentile of the same, ms.
    pub p99_ms: f64,
    /// Mean request body, KiB.
    pub body_kib: f64,
    /// Exact prompt tokens of the window's first request (built-in tokenizer and template).
    pub first_prompt_tokens: u32,
    /// Gateway RSS after the window, MiB.
    pub rss_mib: f64,
    /// Gateway peak RSS so far (`VmHWM`), MiB.
    pub hwm_mib: f64,
    /// Token mode: the token cache's hit share of prompt segments over the window.
    pub token_cache_hit_ratio: Option<f64>,
    /// Latest time behind schedule the driver sent a request, ms (open loop held when small).
    pub max_send_lag_ms: f64,
}

impl CellRecord {
    /// Cores for 100 req/s from a window: per-request CPU above idle, scaled to 100 req/s, plus
    /// the idle cores once. Equals the measured cores for a window at 100 req/s.
    pub fn scale_to_100(cpu_s: f64, wall_s: f64, requests: u64, idle_cores: f64) -> f64 {
        if requests == 0 {
            return 0.0;
        }
        let busy = (cpu_s - idle_cores * wall_s).max(0.0);
        busy / requests as f64 * 100.0 + idle_cores
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_is_the_measurement_at_100_per_second() {
        // 10 s at 100 req/s using 0.4 cores, 0.1 of them idle work.
        let c = CellRecord::scale_to_100(4.0, 10.0, 1000, 0.1);
        assert!((c - 0.4).abs() < 1e-12, "{c}");
        // The same per-request work at 10 req/s: 0.03 busy cores there, 0.3 at 100 req/s.
        let c = CellRecord::scale_to_100(0.3 + 1.0, 10.0, 100, 0.1);
        assert!((c - 0.4).abs() < 1e-12, "{c}");
        assert_eq!(CellRecord::scale_to_100(1.0, 1.0, 0, 0.0), 0.0);
    }
}
