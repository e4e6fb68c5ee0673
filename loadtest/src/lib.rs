//! kvgate-loadtest: replays request traces against OpenAI-compatible endpoints and compares routers.
//!
//! # Layout
//! - [`trace`]: the Mooncake JSONL trace format (parse, write, slice, speed up, stats).
//! - [`offline`]: the offline simulator (routing core + engine model in virtual time).
pub mod compare;
pub mod fleet_metrics;
pub mod offline;
pub mod prompt;
pub mod replay;
pub mod report;
pub mod sizing;
pub mod stats;
pub mod synth;
pub mod trace;
