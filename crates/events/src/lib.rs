//! # kvgate-events: exact KV placement from engine KV event streams
//!
//! vLLM and SGLang publish every KV block they cache and evict over ZMQ. This crate subscribes to
//! those streams, decodes both engines' encodings and keeps kvgate's
//! [`PlacementIndex`](kvgate_core::index::PlacementIndex) exact, under kvgate's own block hashes.
//!
//! ## Layout
//!
//! - [`msgpack`]: a bounded, panic-free MessagePack reader.
//! - [`decode`]: batches and events (legacy positional arrays and `"type"` maps; u64 / i64 /
//!   32-byte hashes; SGLang's layout) into [`decode::EventBatch`].
//! - [`ingest`]: one stream's state (engine hash → kvgate hash with per-tier copy counts,
//!   sequence tracking) applied to the index. Pure: no I/O, clock passed in.
//! - [`subscriber`]: the tokio tasks: ZMQ SUB (connect or bind, one per data-parallel rank),
//!   bounded hand-off to ingestion, replay over DEALER, reconnect with backoff, silence watchdog.
//! - [`config`]: [`EventsConfig`] (defaults in one place) and per-instance [`EventSource`].
//! - [`metrics`]: metric names and handles.
//!
//! ## Wire format (vLLM, SGLang)
//!
//! Each ZMQ message is `[topic, seq (8-byte big-endian), payload]`; the payload is a msgpack batch
//! `[ts, events, dp_rank]`. Sequence numbers start at 0 per engine process and rise by one per
//! message. Replay: send `["", start_seq]` to the ROUTER replay socket; it answers
//! `["", seq, payload]` per buffered message and ends with seq −1.
//!
//! ## Guarantees
//!
//! A block is credited to an instance only while its stream proves it is there: a gap that replay
//! cannot fill, a restart (sequence going backwards), `AllBlocksCleared`, or a stream silent while
//! the instance serves requests drops the instance's event-sourced entries, and the index is
//! rebuilt from the live stream.

pub mod config;
pub mod decode;
pub mod ingest;
pub mod metrics;
pub mod msgpack;
pub mod replay;
pub mod subscriber;

pub use config::{Direction, EventSource, EventsConfig, EventsConfigError};
pub use decode::{decode_batch, DecodeError, DecodeLimits, Dialect, EventBatch, KvEvent};
pub use ingest::{Now, SeqVerdict, StreamIngest, StreamParams, StreamStatus, WipeReason};
pub use subscriber::{EventsHandle, InstanceEvents};
