//! The pure engine model: a vLLM-like prefix cache and continuous-batching scheduler in virtual
//! time (microseconds, passed in by the caller). No tokio, no I/O, deterministic.

pub mod block_pool;
pub mod engine;
pub mod events;
pub mod params;
pub(crate) mod scheduler;
pub mod timing;

#[cfg(test)]
mod scheduler_tests;

pub use engine::{EngineLoadView, EngineModel, EngineStats, SimRequest, StepOutcome};
pub use events::{KvEvent, Medium};
pub use params::{preset, EngineParams, ModelGeometry, Preset, PRESET_NAMES};
pub use timing::TimingParams;
