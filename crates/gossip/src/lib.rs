//! # kvgate-gossip: gateway replicas that behave like one router
//!
//! Several kvgate replicas behind one Service share three things so that any of them routes a
//! request as a single gateway would:
//!
//! 1. **predicted placements**: each replica's routing decisions (instance, the new block hashes,
//!    time), applied by peers to their [`PlacementIndex`](kvgate_core::index::PlacementIndex) as
//!    `Source::Peer` predictions with a TTL;
//! 2. **in-flight load**: each replica's router-tracked [`RouterLoad`](kvgate_core::load::RouterLoad)
//!    per instance, summed over live peers by [`Gossip::peer_load`] (the decoding requests'
//!    sizes only from peers with `share_load_sizes`; others' are taken at those peers' mean, or,
//!    when no peer sends them, marked unknown (`PeerLoad::sizes_known`) for the router to
//!    estimate);
//! 3. **health observations** of instances, merged by [`Gossip::peer_health`].
//!
//! Engine-event-sourced entries are never gossiped: every replica subscribes to the engines itself.
//!
//! ## Layout
//!
//! - [`config`]: [`GossipConfig`], the one place of its defaults.
//! - [`membership`]: SWIM membership and failure detection with the `foca` crate (no I/O core),
//!   driven by one task; seeds from static addresses or a DNS name (`seeds` module).
//! - `flush` / `recv` / `snapshot`: the data plane: batched deltas out, authenticated datagrams
//!   in, snapshots for joiners; `retracted`: recent retractions, so a decision resent behind the
//!   retraction that took it back stays taken back.
//! - [`wire`]: the encrypted envelope (ChaCha20-Poly1305, cluster id, replay window) and the compact
//!   binary payloads.
//! - [`transport`]: datagram I/O behind a trait (UDP, plus a partition switch for tests).
//! - [`directory`]: stable instance names across replicas; [`store`]: the index view gossip uses.
//! - [`status`]: `/admin/cluster`; [`metrics`]: metric names.
//!
//! ## Design
//!
//! Membership rides on foca's SWIM datagrams (≤ 1,400 bytes, a few per second per member). The
//! data plane is separate, because the per-key, one-datagram-per-round model of gossip libraries
//! is far too small for a block index: every `flush_interval_ms` (25 ms) a replica packs the
//! decisions recorded since the last flush into delta batches of at most `max_message_bytes`
//! (60 KiB) and sends each batch **directly to every live member** over the same UDP socket. Each
//! replica is the only source of its own decisions, so nothing is relayed and nothing is
//! reconciled: a receiver just calls `predict(instance, hashes, Source::Peer, ttl, now)`. With
//! `push_on_change` (the default) a change of the replica's load (a dispatch, a first token, a
//! completion: [`Gossip::publish_load_change`]) also pushes its load and pending decisions at
//! once, at most once per `push_gap_ms`, so peers deciding a moment later see it.
//!
//! Loss is repaired at three levels: batches carry a per-sender sequence number and a receiver
//! that sees a gap asks for a resend from the sender's bounded log (`log_max_bytes`); a gap older
//! than the log, a join, a restart or a healed partition fetches a **snapshot** of the peer's own
//! live predictions (`for_each_prediction(Source::Local)`), paced at `snapshot_bytes_per_s`; and
//! whatever is still missed expires by TTL or is re-learned from the engines' KV events.
//!
//! A replica declared dead (SWIM) or replaced by a restart stops counting at once: its load and
//! health shares are dropped, and with `forget_dead_peer_placements` (the default) its placements
//! too: every peer-sourced prediction and unmaterialized checkpoint is cleared and the live peers'
//! are re-fetched (neither the index nor the checkpoint store attributes entries to a particular
//! peer), at the cost of a full snapshot between every pair of survivors. Turned off, its
//! placements stay until their TTL, which is also safe: the requests it routed did reach the
//! engines, whose caches still hold those blocks. Shares of a peer that goes silent expire after
//! `peer_ttl_ms`.
//!
//! Instances are named on the wire by [`instance_key`] (XXH3-64 of the configured name or URL),
//! not by the per-process [`InstanceId`](kvgate_core::InstanceId).
//!
//! ## Security
//!
//! Every datagram, membership included, is encrypted and authenticated with ChaCha20-Poly1305
//! under a key derived from the shared secret (or one of `previous_secrets`, for rotation), with
//! the cluster id and the clear header as associated data; size-bounded; checked against a
//! timestamp window (`max_clock_skew_ms`) and a per-sender 64-counter replay window; and decoded
//! by total decoders that cannot be made to over-allocate. Anything else is dropped and counted in
//! `kvgate_gossip_rejected_total{reason}`.
//!
//! ## Bandwidth and state bounds
//!
//! Block hashes are uniformly random 64-bit values, so 8 bytes per hash is the floor; everything
//! around them is varints. Only the blocks the index did not already hold on the chosen instance
//! are shared, and by default only as **checkpoints** ([`checkpoints`]): because hashes are
//! chained, one hash names its whole prefix, so sending every 16th new block's hash (plus the
//! last) lets a receiver rebuild the prefix when a prompt containing it arrives. A decision costs
//! about `15 + 8·c` bytes for `c` hashes sent (`c ≈ n/16 + 1` for `n` new blocks, or `c = n` with
//! `checkpoint_stride = 1`), plus a 66-byte envelope per ≤ 60 KiB batch. With `R` decisions/s per
//! replica and `N` replicas each replica sends and receives about `(N − 1) · R · (15 + 8c)`
//! bytes/s of placements, plus load shares and membership (a few KB/s): linear in the new-block
//! rate and in the replica count, independent of the index size. For ~8K-token prompts of 512
//! 16-token blocks at 250 decisions/s and 4 replicas: ≈ 200 KB/s per replica when every block is
//! new (3.1 MB/s sending every hash), ≈ 67 KB/s for multi-turn chat with ~130 new blocks per
//! decision (0.8 MB/s sending every hash). `docs/gossip.md` has the measured figures.
//!
//! State is bounded independently of traffic: the pending queue by `max_pending_hashes` (oldest
//! dropped and counted), the resend log by `log_max_bytes`, remembered retractions by 16,384
//! blocks, the peer table by 1,024 authenticated
//! senders, the replay table by 4,096 senders, per-peer shares by the directory's instances, the
//! membership channel by 1,024 packets, and snapshots in flight by 2; received predictions live in
//! the index, under the index's own bounds.

pub mod checkpoints;
pub mod config;
pub mod directory;
mod flush;
mod gossip;
pub mod membership;
pub mod metrics;
mod node;
mod recv;
mod retracted;
mod seeds;
mod snapshot;
pub mod status;
pub mod store;
#[cfg(test)]
mod testkit;
pub mod transport;
pub mod wire;

pub use config::{GossipConfig, ENV_SECRET};
pub use directory::{instance_key, InstanceDirectory};
pub use gossip::{Gossip, GossipError};
pub use node::{Clock, UsageSink};
pub use status::{ClusterStatus, MemberStatus};
pub use store::PlacementStore;
