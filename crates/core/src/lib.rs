//! # kvgate-core: the pure routing core
//!
//! Everything the gateway needs to decide *where* a request goes, and nothing that performs I/O:
//! no sockets, no files, no async runtime, no wall clock. Time is passed in by the caller as
//! [`Millis`] (monotonic milliseconds), so the same code decides in production, in unit tests with a
//! fake clock, in criterion benchmarks and in the offline trace simulator running in virtual time.
//!
//! ## Layout
//!
//! - [`hash`]: block hashing. Chained XXH3-64 with a fixed seed over fixed-size blocks of canonical
//!   prompt bytes (text mode) or token ids (token mode); model, LoRA and `cache_salt` mixed into the
//!   chain's root so different namespaces never share a block. Hashes are stable across processes
//!   and builds (golden tests pin them).
//! - [`index`]: the KV placement index: block hash → instances holding it, with source (engine event,
//!   own routing decision, peer decision), tier (GPU / CPU / disk) and recency. Sharded
//!   `RwLock<HashMap>`s of 16-byte holder lists; per-instance CLOCK eviction (predictions first),
//!   TTL, a global entry cap; prefix matching in shard-grouped batches.
//! - [`load`]: router-tracked load (in-flight, outstanding prefill, decoding) with RAII guards,
//!   engine-reported load snapshots, and per-instance prefill-rate / decode-interference
//!   estimation ([`load::RateEstimator`]).
//! - [`policy`]: the [`policy::Policy`] trait, kvgate's cost-based default policy and the comparison
//!   policies (round robin, random, least load, power of two, consistent hash, SGLang cache-aware,
//!   Dynamo cost, llm-d weighted); [`policy::PolicyConfig`] holds every policy default and
//!   [`policy::build_policy`] builds the configured one.
//!
//! A routing decision is: hash the prompt ([`hash`]), [`index::PlacementIndex::match_prefix`],
//! build one [`policy::Candidate`] per healthy instance from the match, [`load::LoadTracker`] and
//! [`load::RateEstimator`], call [`policy::Policy::decide`], then record the choice with
//! [`index::PlacementIndex::predict`], [`policy::Policy::on_routed`] and
//! [`load::LoadTracker::dispatch`].
//!
//! ## Invariants
//!
//! - Nothing here blocks on I/O or sleeps; locks are held only for bounded in-memory work.
//! - Every structure that grows with traffic has a configured bound.
//! - Block hashes that leave the process come only from [`hash`] (never from `ahash`, which is
//!   randomized per process and used for in-memory maps only).

pub mod hash;
pub mod index;
pub mod load;
pub mod policy;
mod types;

pub use types::{BlockHash, InstanceId, Millis, Source, Tier};
