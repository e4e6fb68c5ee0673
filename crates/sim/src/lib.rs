//! kvgate-sim: a vLLM/SGLang-like engine simulator.
//!
//! # Layout
//!
//! - [`model`]: the pure engine — prefix cache ([`model::block_pool`]), continuous-batching
//!   scheduler and step-time model, [`EngineModel`] — in virtual time, no I/O.
//! - [`hashing`]: the engine's own block hash (opaque to the gateway, like vLLM's).
//! - [`kv_events`]: vLLM-compatible msgpack encoding and the ZMQ PUB / replay ROUTER publisher.
//! - [`server`]: one engine's HTTP surface (OpenAI, vLLM and SGLang endpoints, metrics, faults)
//!   around the task that drives the model in scaled real time.
//! - [`fleet`]: N engines in one process ([`FleetConfig`] holds every default).
//! - [`fleet_mix`]: fleets of several engine classes (`PRESET:COUNT,...`).
//! - [`cli`]: `kvgate sim` flags ([`SimArgs`]) and [`cli::run`].

pub mod cli;
pub mod error;
pub mod fleet;
pub mod fleet_mix;
pub mod hashing;
pub mod kv_events;
pub mod model;
pub mod server;

pub use cli::SimArgs;
pub use error::SimError;
pub use fleet::{EngineOverrides, Fleet, FleetConfig, SimInstanceInfo};
pub use fleet_mix::{FleetGroup, FleetMix, FleetMixError};
pub use kv_events::EventEncoding;
pub use model::{
    EngineLoadView, EngineModel, EngineParams, EngineStats, KvEvent, Medium, SimRequest,
    StepOutcome, TimingParams,
};
pub use server::Flavour;
