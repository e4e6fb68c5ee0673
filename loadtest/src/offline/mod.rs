//! The offline simulator: kvgate's routing core and the engine model driven in virtual time.
//!
//! No HTTP and no wall clock: a trace is replayed through a fleet of
//! [`kvgate_sim::model::EngineModel`]s, with every routing decision made by the same
//! [`kvgate_core`] code the gateway runs (placement index fed by predictions and/or engine KV
//! events, router-tracked load, the configured policy). A run is a pure function of the workload,
//! the fleet, the policy configuration and a seed, so it is reproducible and fast enough for CI.
//!
//! # Layout
//!
//! - [`workload`]: trace → arrivals in virtual µs and engine block chains.
//! - [`router`]: the gateway's routing side (index, load, policy) in virtual time.
//! - [`engine_loop`]: the discrete-event loop (arrivals, engine steps) and per-run figures, and
//!   [`FleetSpec`]: one parameter set per engine, so a fleet may mix engine classes.
//! - [`bounds`] / [`floor`]: references no router can beat — infinite-cache and fleet-LRU hit
//!   ratios, the no-queue TTFT floor.
//! - [`runner`]: several policies (and the references) on fresh fleets, in parallel.
//! - [`utilisation`]: the speed-up at which round robin keeps the fleet at a target utilisation.
//! - [`policies`]: policy names and `--set` overrides of the policy configuration.
//! - [`cli`]: the `offline` subcommand and its summary table.
//!
//! # Invariants
//!
//! - Results come from the engines' own counters and per-request virtual timestamps.
//! - Every contender starts on a fresh fleet with cold caches.
//! - Everything is bounded by the workload's size.

pub mod bounds;
pub mod cli;
pub mod engine_loop;
mod error;
pub mod floor;
pub mod instances;
pub mod lru;
pub mod policies;
pub mod records;
pub mod result;
pub mod router;
pub mod runner;
pub mod summary;
pub mod utilisation;
pub mod workload;

pub use bounds::{infinite_cache_hit, lru_cache_hit, HitRatio};
pub use cli::{run_cli, OfflineArgs, OfflineReport};
pub use engine_loop::{simulate, EngineSpec, FleetSpec};
pub use error::OfflineError;
pub use floor::{floor_per_request, floors_fastest, Floors, RequestFloor};
pub use result::{ClassResult, InstanceResult, PolicyResult, References, TimelinePoint};
pub use router::{IndexMode, RouterSettings};
pub use runner::{references, run_policies, run_policy, run_with_references, OfflineConfig};
pub use utilisation::{find_speed_up, SpeedUpFit};
pub use workload::{OfflineRequest, Workload};
