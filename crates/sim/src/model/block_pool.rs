//! A vLLM-like paged KV block pool with a prefix cache.
//!
//! Model (after vLLM v1's `BlockPool` / `FreeKVCacheBlockQueue`):
//! - `capacity` physical blocks of `block_size` tokens. A block is either *in use* (`ref_cnt > 0`,
//!   pinned by running requests) or *free* (in the free queue, a doubly linked list).
//! - A full prompt block, once computed, is *cached*: its hash maps to the physical block. A cached
//!   block stays cached after its requests finish (it sits in the free queue) until its space is
//!   needed.
//! - Allocation takes free blocks that hold no cached hash first (never-used blocks, partial
//!   tails, decode blocks), and only then the head of the cached free queue, which is *evicted*
//!   (`BlockRemoved`). This order is what a real vLLM 0.32 shows (see docs/simulator.md: with 48
//!   blocks it evicted exactly as many blocks as this rule predicts).
//! - Requests free their blocks in reverse order (tail first), so the end of a prompt is evicted
//!   before its beginning, exactly like vLLM.
//! - A prefix hit on a free cached block removes it from the free queue (it is pinned again).
//! - Optional CPU tier: an evicted GPU block moves to a bounded LRU of host blocks (`medium` CPU);
//!   a prompt may continue its prefix hit there, paying a transfer.
//! - When two requests compute the same block concurrently, only the first copy is registered
//!   (vLLM would register both and later announce two removals); the second stays anonymous.
//!
//! Memory: see [`memory_per_block_bytes`] — per physical block a fixed slot, a hash-map entry and
//! a free-list entry (~80 bytes), plus `4 × block_size` bytes of token ids when requests carry
//! them (for KV events). Everything is sized by `capacity` (GPU) and `cpu_capacity` (CPU), so
//! memory is bounded: a 24,576-block engine needs ~2 MiB without token ids, ~4 MiB with them.

use ahash::AHashMap;
use std::collections::VecDeque;

use super::events::{KvEvent, Medium};

const NIL: u32 = u32::MAX;

/// Upper estimate of the simulator's memory per GPU block, in bytes: the slot, the hash-map entry
/// (16-byte bucket + control byte at a 7/8 load factor), a free-list entry, and — `with_tokens` —
/// the block's token ids plus the allocation header.
pub fn memory_per_block_bytes(block_size: u32, with_tokens: bool) -> usize {
    let map = (std::mem::size_of::<(u64, u32)>() + 1) * 8 / 7 + 1;
    let base = std::mem::size_of::<Slot>()
        + std::mem::size_of::<Option<Box<[u32]>>>()
        + map
        + std::mem::size_of::<u32>();
    if with_tokens {
        base + 4 * block_size as usize + 16
    } else {
        base
    }
}

/// One physical block slot: the fields every allocation, hit and free touches, packed into 32
/// bytes (two slots per cache line); token ids live beside, in [`BlockPool::tokens`].
#[derive(Clone, Debug)]
struct Slot {
    /// Engine hash when cached.
    hash: u64,
    /// Parent hash in the chain (for CPU offload events), when `has_parent`.
    parent: u64,
    /// Running requests holding this block.
    ref_cnt: u32,
    /// Free-queue links; `NIL` when not in the queue.
    prev: u32,
    next: u32,
    /// Whether `hash` is registered in the cache map.
    cached: bool,
    /// Whether `parent` is set (`false` at the chain start).
    has_parent: bool,
    in_free: bool,
    /// Whether the slot's entry in [`BlockPool::tokens`] is set.
    has_tokens: bool,
}

impl Slot {
    const EMPTY: Slot = Slot {
        hash: 0,
        parent: 0,
        ref_cnt: 0,
        prev: NIL,
        next: NIL,
        cached: false,
        has_parent: false,
        in_free: false,
        has_tokens: false,
    };

    fn set_parent(&mut self, parent: Option<u64>) {
        self.has_parent = parent.is_some();
        self.parent = parent.unwrap_or(0);
    }

    fn take_parent(&mut self) -> Option<u64> {
        let p = self.has_parent.then_some(self.parent);
        self.has_parent = false;
        p
    }
}

/// A host-memory (CPU offload) copy of a block.
#[derive(Clone, Debug)]
struct CpuEntry {
    parent: Option<u64>,
    tokens: Option<Box<[u32]>>,
    /// LRU stamp: larger = more recently used.
    stamp: u64,
}

/// Result of a prefix lookup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Physical GPU blocks that hit, in chain order.
    pub gpu_blocks: Vec<u32>,
    /// Number of further blocks found in the CPU tier (to be loaded into new GPU blocks).
    pub cpu_blocks: usize,
}

/// The pool. See the module doc for the model.
#[derive(Debug)]
pub struct BlockPool {
    block_size: u32,
    slots: Vec<Slot>,
    /// Token ids per slot (only when the request supplied them), for offload events.
    tokens: Vec<Option<Box<[u32]>>>,
    /// Cached free queue head / tail (head = next to be evicted).
    head: u32,
    tail: u32,
    /// Free blocks holding no cached hash (reused before any cached block).
    uncached_free: Vec<u32>,
    num_free: u32,
    map: AHashMap<u64, u32>,
    cpu_capacity: usize,
    cpu: AHashMap<u64, CpuEntry>,
    /// LRU order of the CPU tier: (stamp, hash); stale entries skipped lazily.
    cpu_order: VecDeque<(u64, u64)>,
    cpu_stamp: u64,
    events: VecDeque<KvEvent>,
    max_events: usize,
    events_dropped: u64,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `capacity` GPU blocks and `cpu_capacity` CPU blocks; the event buffer keeps at
    /// most `max_events` events (the oldest are dropped and counted beyond that).
    pub fn new(capacity: u32, block_size: u32, cpu_capacity: usize, max_events: usize) -> Self {
        let mut pool = BlockPool {
            block_size: block_size.max(1),
            slots: vec![Slot::EMPTY; capacity as usize],
            tokens: (0..capacity).map(|_| None).collect(),
            head: NIL,
            tail: NIL,
            uncached_free: Vec::with_capacity(capacity as usize),
            num_free: 0,
            map: AHashMap::with_capacity(capacity as usize),
            cpu_capacity,
            cpu: AHashMap::new(),
            cpu_order: VecDeque::new(),
            cpu_stamp: 0,
            events: VecDeque::new(),
            max_events: max_events.max(1),
            events_dropped: 0,
            evictions: 0,
        };
        // Reversed so that `pop` hands out block 0 first.
        for id in (0..capacity).rev() {
            pool.push_free(id);
        }
        pool
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Total GPU blocks.
    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Blocks in the free queue (evictable cached ones included).
    pub fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Fraction of blocks pinned by running requests (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.slots.is_empty() {
            return 0.0;
        }
        1.0 - f64::from(self.num_free) / self.slots.len() as f64
    }

    /// Blocks currently registered in the GPU prefix cache.
    pub fn num_cached(&self) -> usize {
        self.map.len()
    }

    /// Blocks currently in the CPU tier.
    pub fn num_cpu_cached(&self) -> usize {
        self.cpu.len()
    }

    /// Whether `hash` is cached on the GPU.
    pub fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Whether `hash` is cached in the CPU tier.
    pub fn contains_cpu(&self, hash: u64) -> bool {
        self.cpu.contains_key(&hash)
    }

    /// Hashes cached on the GPU (unordered).
    pub fn cached_hashes(&self) -> Vec<u64> {
        self.map.keys().copied().collect()
    }

    /// GPU evictions so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Events dropped because the buffer was full.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    /// Longest cached prefix of `hashes`, at most `max_blocks` long: GPU first, then CPU.
    pub fn lookup(&self, hashes: &[u64], max_blocks: usize) -> PrefixHit {
        let mut hit = PrefixHit::default();
        let limit = hashes.len().min(max_blocks);
        let mut i = 0;
        while i < limit {
            match self.map.get(&hashes[i]) {
                Some(&id) => hit.gpu_blocks.push(id),
                None => break,
            }
            i += 1;
        }
        while i < limit && self.cpu.contains_key(&hashes[i]) {
            hit.cpu_blocks += 1;
            i += 1;
        }
        hit
    }

    /// Free blocks available to a request that would first pin `hit` (hit blocks leaving the free
    /// queue no longer count).
    pub fn available_after_touch(&self, hit: &[u32]) -> u32 {
        let touched_free = hit
            .iter()
            .filter(|&&id| self.slots[id as usize].in_free)
            .count() as u32;
        self.num_free.saturating_sub(touched_free)
    }

    /// Pins hit blocks (removes them from the free queue when unreferenced).
    pub fn touch(&mut self, hit: &[u32]) {
        for &id in hit {
            if self.slots[id as usize].in_free {
                self.unlink(id);
            }
            self.slots[id as usize].ref_cnt += 1;
        }
    }

    /// Takes `n` free blocks: uncached ones first, then the cached free queue's head (evicting).
    /// `None` (and nothing taken) when fewer than `n` are free.
    pub fn allocate(&mut self, n: u32) -> Option<Vec<u32>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let id = match self.uncached_free.pop() {
                Some(id) => {
                    self.slots[id as usize].in_free = false;
                    self.num_free -= 1;
                    id
                }
                None => {
                    let id = self.head;
                    self.unlink(id);
                    self.evict_slot(id);
                    id
                }
            };
            self.slots[id as usize].ref_cnt = 1;
            out.push(id);
        }
        Some(out)
    }

    /// Releases a request's blocks, given in the request's order; they return to the free queue
    /// tail-first, as vLLM does.
    pub fn free(&mut self, blocks: &[u32]) {
        for &id in blocks.iter().rev() {
            let slot = &mut self.slots[id as usize];
            slot.ref_cnt = slot.ref_cnt.saturating_sub(1);
            if slot.ref_cnt == 0 && !slot.in_free {
                if !slot.cached && slot.has_tokens {
                    slot.has_tokens = false;
                    self.tokens[id as usize] = None;
                }
                self.push_free(id);
            }
        }
    }

    /// Registers computed full blocks as cached. `blocks[i]` holds the block with `hashes[i]`;
    /// `parent` is the hash before `hashes[0]`. Emits one `BlockStored` for the blocks that were
    /// actually registered (the first run of new ones; duplicates stay anonymous).
    pub fn cache_blocks(
        &mut self,
        blocks: &[u32],
        hashes: &[u64],
        parent: Option<u64>,
        tokens: Option<&[u32]>,
    ) {
        let bs = self.block_size as usize;
        let mut stored: Vec<u64> = Vec::new();
        let mut stored_tokens: Vec<u32> = Vec::new();
        let mut first_parent = parent;
        let mut prev = parent;
        for (i, (&id, &hash)) in blocks.iter().zip(hashes).enumerate() {
            let block_tokens = tokens.and_then(|t| t.get(i * bs..(i + 1) * bs));
            let vacant = match self.map.entry(hash) {
                std::collections::hash_map::Entry::Occupied(_) => None,
                std::collections::hash_map::Entry::Vacant(v) => Some(v),
            };
            let Some(vacant) = vacant else {
                // A concurrent copy: flush what we have so the event's chain stays contiguous.
                if !stored.is_empty() {
                    self.push_event(KvEvent::BlockStored {
                        block_hashes: std::mem::take(&mut stored),
                        parent_block_hash: first_parent,
                        token_ids: std::mem::take(&mut stored_tokens),
                        block_size: self.block_size,
                        medium: Medium::Gpu,
                    });
                }
                prev = Some(hash);
                first_parent = prev;
                continue;
            };
            vacant.insert(id);
            let slot = &mut self.slots[id as usize];
            slot.hash = hash;
            slot.set_parent(prev);
            slot.cached = true;
            if block_tokens.is_some() || slot.has_tokens {
                slot.has_tokens = block_tokens.is_some();
                self.tokens[id as usize] = block_tokens.map(|t| t.to_vec().into_boxed_slice());
            }
            if stored.is_empty() {
                first_parent = prev;
            }
            stored.push(hash);
            if let Some(t) = block_tokens {
                stored_tokens.extend_from_slice(t);
            }
            prev = Some(hash);
        }
        if !stored.is_empty() {
            self.push_event(KvEvent::BlockStored {
                block_hashes: stored,
                parent_block_hash: first_parent,
                token_ids: stored_tokens,
                block_size: self.block_size,
                medium: Medium::Gpu,
            });
        }
    }

    /// Marks a CPU-tier hit as recently used.
    pub fn touch_cpu(&mut self, hashes: &[u64]) {
        for h in hashes {
            self.cpu_stamp += 1;
            let stamp = self.cpu_stamp;
            if let Some(e) = self.cpu.get_mut(h) {
                e.stamp = stamp;
                self.cpu_order.push_back((stamp, *h));
            }
        }
        self.compact_cpu_order();
    }

    /// Drops every cached hash (GPU and CPU). Fails (returns false) while blocks are pinned, as
    /// vLLM's `reset_prefix_cache` does. Emits `AllBlocksCleared` when `announce`.
    pub fn reset(&mut self, announce: bool) -> bool {
        if self.num_free != self.capacity() {
            return false;
        }
        for slot in &mut self.slots {
            slot.cached = false;
            slot.has_tokens = false;
            slot.has_parent = false;
            slot.in_free = false;
            slot.prev = NIL;
            slot.next = NIL;
        }
        for t in &mut self.tokens {
            *t = None;
        }
        self.head = NIL;
        self.tail = NIL;
        self.uncached_free.clear();
        self.num_free = 0;
        for id in (0..self.capacity()).rev() {
            self.push_free(id);
        }
        self.map.clear();
        self.cpu.clear();
        self.cpu_order.clear();
        if announce {
            self.push_event(KvEvent::AllBlocksCleared);
        }
        true
    }

    /// Takes the buffered events.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.drain(..).collect()
    }

    /// Discards the buffered events (an engine restart loses them).
    pub fn clear_events(&mut self) {
        self.events.clear();
    }

    fn push_event(&mut self, ev: KvEvent) {
        if self.events.len() >= self.max_events {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        self.events.push_back(ev);
    }

    /// Uncaches a slot about to be reused, offloading it to the CPU tier when there is one.
    fn evict_slot(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        if !slot.cached {
            return;
        }
        slot.cached = false;
        let hash = slot.hash;
        let parent = slot.take_parent();
        let tokens = if slot.has_tokens {
            slot.has_tokens = false;
            self.tokens[id as usize].take()
        } else {
            None
        };
        // A cached slot is the one registered under its hash (duplicates stay uncached); one
        // probe removes it, and a mismatch (never expected) puts the other owner back.
        if let Some(owner) = self.map.remove(&hash) {
            if owner != id {
                self.map.insert(hash, owner);
            }
        }
        self.evictions += 1;
        self.push_event(KvEvent::BlockRemoved {
            block_hashes: vec![hash],
            medium: Medium::Gpu,
        });
        if self.cpu_capacity > 0 && !self.cpu.contains_key(&hash) {
            while self.cpu.len() >= self.cpu_capacity {
                self.evict_cpu_lru();
            }
            self.cpu_stamp += 1;
            let token_ids = tokens.as_deref().map(<[u32]>::to_vec).unwrap_or_default();
            self.cpu.insert(
                hash,
                CpuEntry {
                    parent,
                    tokens,
                    stamp: self.cpu_stamp,
                },
            );
            self.cpu_order.push_back((self.cpu_stamp, hash));
            self.push_event(KvEvent::BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: parent,
                token_ids,
                block_size: self.block_size,
                medium: Medium::Cpu,
            });
        }
    }

    fn evict_cpu_lru(&mut self) {
        while let Some((stamp, hash)) = self.cpu_order.pop_front() {
            if self.cpu.get(&hash).map(|e| e.stamp) == Some(stamp) {
                self.cpu.remove(&hash);
                self.push_event(KvEvent::BlockRemoved {
                    block_hashes: vec![hash],
                    medium: Medium::Cpu,
                });
                return;
            }
        }
        // Order list exhausted with entries left: cannot happen (every entry has a live stamp);
        // clear defensively so the caller's loop terminates.
        self.cpu.clear();
    }

    /// Keeps the lazy LRU list bounded to a small multiple of the live entries.
    fn compact_cpu_order(&mut self) {
        if self.cpu_order.len() > 4 * self.cpu.len() + 64 {
            let cpu = &self.cpu;
            self.cpu_order
                .retain(|(stamp, h)| cpu.get(h).map(|e| e.stamp) == Some(*stamp));
        }
    }

    /// Parent and tokens of a CPU-tier block (for reloading it into the GPU).
    pub fn cpu_entry(&self, hash: u64) -> Option<(Option<u64>, Option<&[u32]>)> {
        self.cpu.get(&hash).map(|e| (e.parent, e.tokens.as_deref()))
    }

    fn push_free(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        if !slot.cached {
            slot.in_free = true;
            self.uncached_free.push(id);
            self.num_free += 1;
            return;
        }
        slot.prev = self.tail;
        slot.next = NIL;
        slot.in_free = true;
        if self.tail != NIL {
            self.slots[self.tail as usize].next = id;
        } else {
            self.head = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next) = {
            let s = &self.slots[id as usize];
            (s.prev, s.next)
        };
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
        let s = &mut self.slots[id as usize];
        s.prev = NIL;
        s.next = NIL;
        s.in_free = false;
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(ev: &[KvEvent]) -> Vec<u64> {
        ev.iter()
            .filter_map(|e| match e {
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium: Medium::Gpu,
                } => Some(block_hashes[0]),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn hits_after_caching_and_free() {
        let mut p = BlockPool::new(8, 4, 0, 100);
        let b = p.allocate(3).unwrap();
        p.cache_blocks(&b[..2], &[10, 11], None, None);
        assert_eq!(p.lookup(&[10, 11, 12], 3).gpu_blocks, b[..2].to_vec());
        p.free(&b);
        // Still cached after the request finished (LRU free pool).
        assert_eq!(p.lookup(&[10, 11], 2).gpu_blocks.len(), 2);
        assert_eq!(p.num_free(), 8);
        // The cap limits the hit.
        assert_eq!(p.lookup(&[10, 11], 1).gpu_blocks.len(), 1);
        let ev = p.drain_events();
        assert_eq!(
            ev,
            vec![KvEvent::BlockStored {
                block_hashes: vec![10, 11],
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 4,
                medium: Medium::Gpu
            }]
        );
    }

    #[test]
    fn pinned_blocks_are_never_evicted() {
        let mut p = BlockPool::new(4, 4, 0, 100);
        let a = p.allocate(2).unwrap();
        p.cache_blocks(&a, &[1, 2], None, None);
        // Two free blocks left; asking for three must fail without taking anything.
        assert!(p.allocate(3).is_none());
        assert_eq!(p.num_free(), 2);
        let b = p.allocate(2).unwrap();
        assert!(p.contains(1) && p.contains(2));
        assert!((p.usage() - 1.0).abs() < 1e-9);
        p.free(&b);
        p.free(&a);
        assert_eq!(p.usage(), 0.0);
    }

    #[test]
    fn lru_evicts_oldest_freed_first_and_tail_first() {
        let mut p = BlockPool::new(4, 4, 0, 100);
        let a = p.allocate(2).unwrap();
        p.cache_blocks(&a, &[1, 2], None, None);
        p.free(&a);
        let b = p.allocate(2).unwrap();
        p.cache_blocks(&b, &[3, 4], None, None);
        p.free(&b);
        p.drain_events();
        // Free queue now: [2, 1, 4, 3] (requests free tail first; a freed before b).
        let c = p.allocate(3).unwrap();
        assert_eq!(removed(&p.drain_events()), vec![2, 1, 4]);
        assert!(p.contains(3) && !p.contains(1));
        p.free(&c);
    }

    #[test]
    fn uncached_free_blocks_are_reused_before_evicting() {
        let mut p = BlockPool::new(4, 4, 0, 100);
        let a = p.allocate(2).unwrap();
        p.cache_blocks(&a[..1], &[1], None, None); // a[1] stays a partial, uncached block
        p.free(&a);
        let b = p.allocate(1).unwrap();
        p.free(&b); // freed after a's cached block, still reused first
        let c = p.allocate(3).unwrap();
        assert!(p
            .drain_events()
            .iter()
            .all(|e| !matches!(e, KvEvent::BlockRemoved { .. })));
        assert!(p.contains(1));
        let d = p.allocate(1).unwrap();
        assert_eq!(removed(&p.drain_events()), vec![1]);
        p.free(&c);
        p.free(&d);
    }

    #[test]
    fn hit_on_free_block_pins_it() {
        let mut p = BlockPool::new(3, 4, 0, 100);
        let a = p.allocate(2).unwrap();
        p.cache_blocks(&a, &[1, 2], None, None);
        p.free(&a);
        let hit = p.lookup(&[1, 2], 2);
        assert_eq!(p.available_after_touch(&hit.gpu_blocks), 1);
        p.touch(&hit.gpu_blocks);
        assert_eq!(p.num_free(), 1);
        assert!(p.allocate(2).is_none());
        let c = p.allocate(1).unwrap();
        assert!(removed(&p.drain_events()).is_empty());
        p.free(&c);
        p.free(&hit.gpu_blocks);
    }

    #[test]
    fn cpu_tier_takes_evicted_blocks() {
        let mut p = BlockPool::new(2, 4, 1, 100);
        let a = p.allocate(2).unwrap();
        let toks: Vec<u32> = (0..8).collect();
        p.cache_blocks(&a, &[1, 2], None, Some(&toks));
        p.free(&a);
        p.drain_events();
        let b = p.allocate(1).unwrap(); // evicts 2 (tail first) → CPU
        let ev = p.drain_events();
        assert_eq!(
            ev[1],
            KvEvent::BlockStored {
                block_hashes: vec![2],
                parent_block_hash: Some(1),
                token_ids: (4..8).collect(),
                block_size: 4,
                medium: Medium::Cpu
            }
        );
        let hit = p.lookup(&[1, 2], 2);
        assert_eq!((hit.gpu_blocks.len(), hit.cpu_blocks), (1, 1));
        let c = p.allocate(1).unwrap(); // evicts 1 → CPU, which pushes 2 out (capacity 1)
        let ev = p.drain_events();
        assert!(ev.contains(&KvEvent::BlockRemoved {
            block_hashes: vec![2],
            medium: Medium::Cpu
        }));
        assert!(p.contains_cpu(1) && !p.contains_cpu(2));
        p.free(&b);
        p.free(&c);
    }

    #[test]
    fn reset_refuses_while_pinned() {
        let mut p = BlockPool::new(2, 4, 0, 100);
        let a = p.allocate(1).unwrap();
        p.cache_blocks(&a, &[7], None, None);
        assert!(!p.reset(true));
        p.free(&a);
        assert!(p.reset(true));
        assert!(!p.contains(7));
        assert_eq!(p.drain_events().last(), Some(&KvEvent::AllBlocksCleared));
    }

    #[test]
    fn memory_per_block_is_small() {
        let plain = memory_per_block_bytes(16, false);
        let with = memory_per_block_bytes(16, true);
        assert!(plain <= 96, "{plain}");
        assert!(with <= 180, "{with}");
    }

    #[test]
    fn event_buffer_is_bounded() {
        let mut p = BlockPool::new(1, 1, 0, 2);
        for h in 0..5u64 {
            let a = p.allocate(1).unwrap();
            p.cache_blocks(&a, &[h], None, None);
            p.free(&a);
        }
        assert_eq!(p.drain_events().len(), 2);
        assert!(p.events_dropped() > 0);
    }
}
