//! A fixed-capacity LRU set of block hashes, for the reference caches.
//!
//! Invariants:
//! - Holds at most `capacity` keys; inserting into a full set evicts the least recently used key.
//! - Every operation is O(1): a hash map from key to slot plus an intrusive doubly linked list over
//!   a slot vector allocated once.
//! - Keys are block hashes (already uniformly distributed), so the map hashes them by identity.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for keys that are already uniform 64-bit hashes: uses the value itself.
#[derive(Default, Clone, Copy)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are expected; fold anything else so the hasher stays total.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Build-hasher for maps keyed by block hashes.
pub type IdentityBuild = BuildHasherDefault<IdentityHasher>;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    key: u64,
    prev: u32,
    next: u32,
}

/// LRU set of `u64` keys.
pub struct LruSet {
    map: HashMap<u64, u32, IdentityBuild>,
    nodes: Vec<Node>,
    /// Most recently used.
    head: u32,
    /// Least recently used (next to evict).
    tail: u32,
    capacity: usize,
}

impl LruSet {
    /// An empty set holding at most `capacity` keys (capped at `u32::MAX - 1`).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min((u32::MAX - 1) as usize);
        Self {
            map: HashMap::with_capacity_and_hasher(capacity.min(1 << 24), IdentityBuild::default()),
            nodes: Vec::with_capacity(capacity.min(1 << 24)),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// True when `key` is present (does not change recency).
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Marks `key` most recently used, inserting it (and evicting the LRU key) when absent.
    pub fn touch(&mut self, key: u64) {
        if self.capacity == 0 {
            return;
        }
        if let Some(&slot) = self.map.get(&key) {
            self.unlink(slot);
            self.push_front(slot);
            return;
        }
        let slot = if self.map.len() >= self.capacity {
            let victim = self.tail;
            self.unlink(victim);
            let old = self.nodes[victim as usize].key;
            self.map.remove(&old);
            self.nodes[victim as usize].key = key;
            victim
        } else {
            self.nodes.push(Node {
                key,
                prev: NIL,
                next: NIL,
            });
            (self.nodes.len() - 1) as u32
        };
        self.map.insert(key, slot);
        self.push_front(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let Node { prev, next, .. } = self.nodes[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, slot: u32) {
        self.nodes[slot as usize].prev = NIL;
        self.nodes[slot as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = slot;
        }
        self.head = slot;
        if self.tail == NIL {
            self.tail = slot;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = LruSet::new(3);
        for k in [1, 2, 3] {
            l.touch(k);
        }
        l.touch(1);
        l.touch(4);
        assert!(l.contains(1) && l.contains(3) && l.contains(4));
        assert!(!l.contains(2));
        assert_eq!(l.len(), 3);
        l.touch(5);
        assert!(!l.contains(3));
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let mut l = LruSet::new(0);
        l.touch(1);
        assert!(l.is_empty());
    }

    #[test]
    fn capacity_one() {
        let mut l = LruSet::new(1);
        l.touch(1);
        l.touch(1);
        l.touch(2);
        assert!(l.contains(2) && !l.contains(1));
        assert_eq!(l.len(), 1);
    }
}
