//! Stable cross-replica names of instances.
//!
//! Each gateway process numbers its instances densely ([`InstanceId`]), and two replicas may number
//! the same engine differently. On the wire an instance is therefore named by its *key*: XXH3-64
//! (fixed seed) of its configured name or URL, identical in every replica that configures the same
//! name.
//!
//! Invariants:
//! - `key_of(id)` and `id_of_key(key)` are inverse for every registered pair.
//! - Re-registering an id under a new name drops the old key; lookups never return a stale pair.

use ahash::AHashMap;
use kvgate_core::InstanceId;
use parking_lot::RwLock;
use std::sync::Arc;

/// Seed of [`instance_key`]; part of the wire format, never change it.
const INSTANCE_KEY_SEED: u64 = 0x6b76_6761_7465_0001;

/// The wire key of an instance named `name` (its configured name or URL).
pub fn instance_key(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), INSTANCE_KEY_SEED)
}

#[derive(Default)]
struct Inner {
    by_key: AHashMap<u64, InstanceId>,
    by_id: AHashMap<InstanceId, (u64, String)>,
}

/// Mapping between this process's [`InstanceId`]s and the stable names shared with peers.
/// Cheap to clone (shared); the gateway updates it when discovery adds or removes instances.
#[derive(Clone, Default)]
pub struct InstanceDirectory {
    inner: Arc<RwLock<Inner>>,
}

impl std::fmt::Debug for InstanceDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceDirectory")
            .field("instances", &self.inner.read().by_id.len())
            .finish()
    }
}

impl InstanceDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// A directory of `(id, name)` pairs.
    pub fn from_pairs<S: AsRef<str>>(pairs: impl IntoIterator<Item = (InstanceId, S)>) -> Self {
        let d = Self::new();
        for (id, name) in pairs {
            d.insert(id, name.as_ref());
        }
        d
    }

    /// Registers (or renames) `id` as `name`.
    pub fn insert(&self, id: InstanceId, name: &str) {
        let key = instance_key(name);
        let mut g = self.inner.write();
        if let Some((old_key, _)) = g.by_id.insert(id, (key, name.to_string())) {
            if old_key != key {
                g.by_key.remove(&old_key);
            }
        }
        if let Some(prev) = g.by_key.insert(key, id) {
            if prev != id {
                g.by_id.remove(&prev);
            }
        }
    }

    /// Forgets `id`.
    pub fn remove(&self, id: InstanceId) {
        let mut g = self.inner.write();
        if let Some((key, _)) = g.by_id.remove(&id) {
            g.by_key.remove(&key);
        }
    }

    /// The wire key of `id`, if registered.
    pub fn key_of(&self, id: InstanceId) -> Option<u64> {
        self.inner.read().by_id.get(&id).map(|(k, _)| *k)
    }

    /// The local id of the instance with wire key `key`, if this replica knows it.
    pub fn id_of_key(&self, key: u64) -> Option<InstanceId> {
        self.inner.read().by_key.get(&key).copied()
    }

    /// The name `id` was registered under.
    pub fn name_of(&self, id: InstanceId) -> Option<String> {
        self.inner.read().by_id.get(&id).map(|(_, n)| n.clone())
    }

    /// Every registered id, sorted.
    pub fn ids(&self) -> Vec<InstanceId> {
        let mut v: Vec<InstanceId> = self.inner.read().by_id.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Number of registered instances.
    pub fn len(&self) -> usize {
        self.inner.read().by_id.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_inverse() {
        // Pinned: the key is part of the wire format.
        assert_eq!(instance_key("a"), instance_key("a"));
        assert_ne!(instance_key("a"), instance_key("b"));
        let d = InstanceDirectory::from_pairs([
            (InstanceId(0), "http://a"),
            (InstanceId(1), "http://b"),
        ]);
        let ka = d.key_of(InstanceId(0)).unwrap();
        assert_eq!(ka, instance_key("http://a"));
        assert_eq!(d.id_of_key(ka), Some(InstanceId(0)));
        assert_eq!(d.ids(), vec![InstanceId(0), InstanceId(1)]);
    }

    #[test]
    fn rename_and_remove_leave_no_stale_pairs() {
        let d = InstanceDirectory::from_pairs([(InstanceId(0), "x")]);
        d.insert(InstanceId(0), "y");
        assert_eq!(d.id_of_key(instance_key("x")), None);
        assert_eq!(d.id_of_key(instance_key("y")), Some(InstanceId(0)));
        // Another id taking the same name evicts the first.
        d.insert(InstanceId(1), "y");
        assert_eq!(d.key_of(InstanceId(0)), None);
        d.remove(InstanceId(1));
        assert!(d.is_empty());
    }
}
