//! The narrow view of the placement index that gossip needs.
//!
//! Invariant: gossip writes only `Source::Peer` predictions, clears only `Source::Peer` entries and
//! reads only `Source::Local` predictions (this replica's own decisions), so it can never disturb
//! event-sourced entries, which every replica ingests from the engines itself.

use kvgate_core::index::PlacementIndex;
use kvgate_core::{BlockHash, InstanceId, Millis, Source};

/// What gossip does to an index. Implemented by [`PlacementIndex`]; a trait so the protocol can be
/// exercised against any store.
pub trait PlacementStore: Send + Sync + 'static {
    /// A peer predicted that `instance` holds `hashes` for `ttl_ms` from `now`.
    fn predict_peer(&self, instance: InstanceId, hashes: &[BlockHash], ttl_ms: u64, now: Millis);
    /// Takes back peer-sourced predictions that `instance` holds `hashes`.
    fn retract_peer(&self, instance: InstanceId, hashes: &[BlockHash]);
    /// Drops every peer-sourced entry of `instance`.
    fn clear_peer(&self, instance: InstanceId);
    /// Visits this replica's own live predictions as (instance, hash, expires_at).
    fn for_each_local(&self, now: Millis, visit: &mut dyn FnMut(InstanceId, BlockHash, Millis));
}

impl PlacementStore for PlacementIndex {
    fn predict_peer(&self, instance: InstanceId, hashes: &[BlockHash], ttl_ms: u64, now: Millis) {
        self.predict(instance, hashes, Source::Peer, ttl_ms, now);
    }
    fn retract_peer(&self, instance: InstanceId, hashes: &[BlockHash]) {
        self.retract(instance, hashes, Source::Peer);
    }
    fn clear_peer(&self, instance: InstanceId) {
        self.clear_instance(instance, &[Source::Peer]);
    }
    fn for_each_local(&self, now: Millis, visit: &mut dyn FnMut(InstanceId, BlockHash, Millis)) {
        self.for_each_prediction(Source::Local, now, visit);
    }
}
