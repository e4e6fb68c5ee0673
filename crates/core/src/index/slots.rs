//! Per-instance bookkeeping of the index: entry counts, capacity and the CLOCK ring.
//!
//! Invariants:
//! - Slots are allocated lazily in chunks and never move, so they are reached without a lock.
//! - Instance ids at or above [`MAX_INSTANCES`] have no slot; the index ignores them.
//! - The ring lists hashes the instance gained, oldest first. It may hold stale hashes (entries
//!   since removed or expired) and duplicates; it is compacted once it exceeds 1.5 × the live
//!   count plus a constant, so it stays O(entries).

use crate::BlockHash;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Instance ids the index accepts: `0..MAX_INSTANCES`.
pub const MAX_INSTANCES: usize = 1 << 16;
const CHUNK: usize = 256;

/// One instance's bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Live (block, instance) entries.
    pub count: AtomicUsize,
    /// Capacity in entries; 0 means "use the configured default".
    pub capacity: AtomicUsize,
    /// CLOCK ring of hashes this instance gained.
    pub ring: Mutex<VecDeque<BlockHash>>,
}

impl Slot {
    pub fn dec(&self) {
        // Never below zero even if bookkeeping races with a clear.
        let _ = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(1))
            });
    }
}

/// Lazily allocated, never-moving slots for every accepted instance id.
#[derive(Debug)]
pub(crate) struct Slots {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// One past the highest id ever given a slot.
    high: AtomicUsize,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            chunks: (0..MAX_INSTANCES / CHUNK)
                .map(|_| OnceLock::new())
                .collect(),
            high: AtomicUsize::new(0),
        }
    }
}

impl Slots {
    /// The slot of `id`, allocating its chunk on first use; `None` for ids out of range.
    pub fn get_or_create(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        let chunk = self.chunks.get(id / CHUNK)?;
        let slots = chunk.get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect());
        self.high.fetch_max(id + 1, Ordering::Relaxed);
        slots.get(id % CHUNK)
    }
    /// The slot of `id` if it exists.
    pub fn get(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        self.chunks.get(id / CHUNK)?.get()?.get(id % CHUNK)
    }
    /// One past the highest id with a slot.
    pub fn high(&self) -> usize {
        self.high.load(Ordering::Relaxed)
    }
    /// Heap bytes of the allocated chunks and rings.
    pub fn heap_bytes(&self) -> usize {
        let mut total = self.chunks.len() * std::mem::size_of::<OnceLock<Box<[Slot]>>>();
        for c in self.chunks.iter().filter_map(OnceLock::get) {
            total += c.len() * std::mem::size_of::<Slot>();
            total += c
                .iter()
                .map(|s| s.ring.lock().capacity() * 8)
                .sum::<usize>();
        }
        total
    }
}
