//! kvgate-sim: a vLLM/SGLang-like engine simulator.
//!
//! # Layout
//!
//! - [`model`]: the pure engine — prefix cache ([`model::block_pool`]), continuous-batching
//!   scheduler and step-time model, [`EngineModel`] — in virtual time, no I/O.
//! - [`hashing`]: the engine's own block hash (opaque to the gateway, like vLLM's).

pub mod error;
pub mod hashing;
pub mod model;

pub use error::SimError;
pub use model::{
    EngineLoadView, EngineModel, EngineParams, EngineStats, KvEvent, Medium, SimRequest,
    StepOutcome, TimingParams,
};
