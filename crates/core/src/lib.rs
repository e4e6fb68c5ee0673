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
//!   engine-reported load snapshots, per-instance prefill-rate / decode-interference estimation
//!   ([`load::RateEstimator`]) from time to first token, decode step models
//!   ([`load::DecodeEstimator`]) from inter-token timing, and expected output lengths.
//! - [`policy`]: the [`policy::Policy`] trait, kvgate's cost-based default policy and the comparison
//!   policies (round robin, random, least load, power of two, consistent hash, SGLang cache-aware,
//!   Dynamo cost, llm-d weighted); [`policy::PolicyConfig`] holds every policy default and
//!   [`policy::build_policy`] builds the configured one.
//!
//! - [`admission`]: the bounded per-pool wait queue the gateway holds requests in while a pool
//!   is saturated: strict priority classes, token-fair share between tenants within a class,
//!   entry / token / wait bounds, shedding of lower classes first, and the drain rate behind a
//!   rejection's `Retry-After`.
//! - [`ratelimit`]: per-tenant request and token buckets on virtual time in a bounded map, and
//!   the ledger that turns peers' cumulative usage reports into charges.
//! - [`router`]: the one decision sequence, [`router::Router::route`], that the gateway and the
//!   offline simulator both call, and the learning that follows a dispatch (first token, end of
//!   the decode).
//!
//! A routing decision is: hash the prompt ([`hash`]), then [`router::Router::route`]:
//! [`index::PlacementIndex::match_prefix`], one [`policy::Candidate`] per offered instance from
//! the match, the [`load::LoadTracker`], the [`load::RateEstimator`] and the
//! [`load::DecodeEstimator`], [`policy::Policy::decide`], then the choice recorded with
//! [`index::PlacementIndex::predict`], [`policy::Policy::on_routed`] and
//! [`load::LoadTracker::dispatch_sized`].
//!
//! ## Invariants
//!
//! - Nothing here blocks on I/O or sleeps; locks are held only for bounded in-memory work.
//! - Every structure that grows with traffic has a configured bound.
//! - Block hashes that leave the process come only from [`hash`] (never from `ahash`, which is
//!   randomized per process and used for in-memory maps only).

pub mod admission;
pub mod hash;
pub mod index;
pub mod load;
pub mod policy;
pub mod ratelimit;
pub mod router;
mod types;

pub use types::{BlockHash, InstanceId, Millis, Source, Tier};
