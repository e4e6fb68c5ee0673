//! kvgate-loadtest: replays request traces against OpenAI-compatible endpoints and compares routers.
//!
//! # Layout
//! - [`trace`]: the Mooncake JSONL trace format (parse, write, slice, speed up, stats).
//! - [`synth`]: seeded synthetic workloads (system prompt, chat, agent, RAG, long prompts, mix) in
//!   that format.
//! - [`prompt`]: prompt text whose blocks are identical exactly when the trace's ids are.
//! - [`replay`]: open-loop streaming replay with per-request measurements.
//! - [`fleet_metrics`]: the engines' own counters (hit ratio, request counts, load over time).
//! - [`stats`]: exact percentiles, means, shares, buckets.
//! - [`compare`]: one trace against several routers, each on a fresh simulated fleet (kvgate as one
//!   gateway or as N replicas gossiping in-process).
//! - [`report`]: JSON results, self-contained HTML report, terminal table, follow-up turns, and
//!   a live run checked against offline draws of the same slice (`mirror`).
//! - [`sizing`]: cache capacity vs working set, fleet-LRU / infinite-cache / TTFT-floor references.
//! - [`offline`]: the offline simulator (routing core + engine model in virtual time).
//! - [`gateway_sizing`]: the gateway's own CPU and memory per 100 req/s against a running kvgate
//!   (`loadtest/sizing.sh`).
pub mod compare;
pub mod fleet_metrics;
pub mod gateway_sizing;
pub mod offline;
pub mod prompt;
pub mod replay;
pub mod report;
pub mod sizing;
pub mod stats;
pub mod synth;
pub mod trace;
