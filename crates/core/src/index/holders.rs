//! Compact per-block holder lists: which instances hold one block, from which source, in which tier.
//!
//! Invariants:
//! - An [`Entry`] is 16 bytes; a [`Holders`] value is 16 bytes (one entry inline, or a boxed
//!   vector when two or more instances hold the block), so the common single-holder block costs
//!   one 24-byte map slot in total.
//! - Entries are sorted by instance id, so prefix matching merges them with its running set.
//! - A `Holders::Many` always has at least two entries; an empty list is removed from the map.

use crate::{Millis, Source, Tier};

/// One (block, instance) placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Predictions: absolute expiry in the caller's ms. Events: `u64::MAX` (never expire).
    pub expires: Millis,
    /// The instance id.
    pub instance: u32,
    /// Copies per tier, 5 bits each: GPU in bits 0–4, CPU in 5–9, disk in 10–14.
    pub copies: u16,
    /// Where the knowledge came from.
    pub source: Source,
    /// CLOCK reference bit: set on insert and refresh, cleared by the eviction hand.
    pub referenced: bool,
}

const COPY_BITS: u16 = 5;
const COPY_MAX: u16 = (1 << COPY_BITS) - 1;

impl Entry {
    /// A prediction (counted as one GPU copy).
    pub fn predicted(instance: u32, source: Source, expires: Millis) -> Self {
        Self {
            expires,
            instance,
            copies: 1,
            source,
            referenced: true,
        }
    }
    /// An event-sourced entry with one copy in `tier`.
    pub fn stored(instance: u32, tier: Tier) -> Self {
        let mut e = Self {
            expires: Millis::MAX,
            instance,
            copies: 0,
            source: Source::Event,
            referenced: true,
        };
        e.add_copy(tier);
        e
    }
    /// True when it counts for matching at `now`.
    pub fn live(&self, now: Millis) -> bool {
        self.source == Source::Event || self.expires > now
    }
    /// True when predicting it again locally, to expire no later than `fresh_from` + what was
    /// refreshed since, would change nothing but that margin: the CLOCK bit is already set and
    /// the entry is engine-reported (never expires) or a local prediction expiring at or after
    /// `fresh_from`. Nothing is fresh at `Millis::MAX`.
    pub fn fresh(&self, fresh_from: Millis) -> bool {
        fresh_from != Millis::MAX
            && self.referenced
            && (self.source == Source::Event
                || (self.source == Source::Local && self.expires >= fresh_from))
    }
    /// Copies held in `tier`.
    pub fn copies_in(&self, tier: Tier) -> u16 {
        (self.copies >> (COPY_BITS * tier as u16)) & COPY_MAX
    }
    /// Adds one copy in `tier` (saturating at 31).
    pub fn add_copy(&mut self, tier: Tier) {
        if self.copies_in(tier) < COPY_MAX {
            self.copies += 1 << (COPY_BITS * tier as u16);
        }
    }
    /// Removes one copy from `tier`, or from the best tier holding one if `tier` holds none.
    /// Returns true when no copy is left.
    pub fn remove_copy(&mut self, tier: Tier) -> bool {
        let t = if self.copies_in(tier) > 0 {
            Some(tier)
        } else {
            Tier::ALL.into_iter().find(|t| self.copies_in(*t) > 0)
        };
        if let Some(t) = t {
            self.copies -= 1 << (COPY_BITS * t as u16);
        }
        self.copies == 0
    }
    /// The most valuable tier holding a copy.
    pub fn best_tier(&self) -> Tier {
        Tier::ALL
            .into_iter()
            .find(|t| self.copies_in(*t) > 0)
            .unwrap_or(Tier::Gpu)
    }
}

/// The holders of one block, sorted by instance.
#[derive(Clone, Debug)]
pub(crate) enum Holders {
    /// Exactly one holder, inline.
    One(Entry),
    /// Two or more holders. Boxed on purpose: a thin pointer keeps `Holders` at 16 bytes
    /// (a bare `Vec` would make every map slot 8 bytes larger for the common one-holder case).
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Entry>>),
}

impl Holders {
    /// All entries, sorted by instance.
    pub fn as_slice(&self) -> &[Entry] {
        match self {
            Holders::One(e) => std::slice::from_ref(e),
            Holders::Many(v) => v,
        }
    }
    /// The entry of `instance`, mutable.
    pub fn get_mut(&mut self, instance: u32) -> Option<&mut Entry> {
        match self {
            Holders::One(e) if e.instance == instance => Some(e),
            Holders::One(_) => None,
            Holders::Many(v) => match v.binary_search_by_key(&instance, |e| e.instance) {
                Ok(i) => v.get_mut(i),
                Err(_) => None,
            },
        }
    }
    /// Inserts an entry for an instance not yet present.
    pub fn insert(&mut self, e: Entry) {
        match self {
            Holders::One(old) => {
                let old = *old;
                let v = if old.instance < e.instance {
                    vec![old, e]
                } else {
                    vec![e, old]
                };
                *self = Holders::Many(Box::new(v));
            }
            Holders::Many(v) => {
                let i = v
                    .binary_search_by_key(&e.instance, |x| x.instance)
                    .unwrap_or_else(|i| i);
                v.insert(i, e);
            }
        }
    }
    /// Removes the entries for which `drop` is true; returns them through `removed`.
    /// Returns false when no entry is left (the caller removes the map slot).
    pub fn retain(
        &mut self,
        mut drop: impl FnMut(&Entry) -> bool,
        removed: &mut impl FnMut(Entry),
    ) -> bool {
        match self {
            Holders::One(e) => {
                if drop(e) {
                    removed(*e);
                    return false;
                }
                true
            }
            Holders::Many(v) => {
                v.retain(|e| {
                    let d = drop(e);
                    if d {
                        removed(*e);
                    }
                    !d
                });
                match v.len() {
                    0 => false,
                    1 => {
                        *self = Holders::One(v[0]);
                        true
                    }
                    _ => {
                        if v.capacity() > 2 * v.len() + 4 {
                            v.shrink_to_fit();
                        }
                        true
                    }
                }
            }
        }
    }
    /// Heap bytes held outside the map slot.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Holders::One(_) => 0,
            Holders::Many(v) => {
                std::mem::size_of::<Vec<Entry>>() + v.capacity() * std::mem::size_of::<Entry>()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        assert_eq!(std::mem::size_of::<Holders>(), 16);
    }

    #[test]
    fn copies_per_tier() {
        let mut e = Entry::stored(1, Tier::Cpu);
        e.add_copy(Tier::Gpu);
        assert_eq!(e.best_tier(), Tier::Gpu);
        assert!(!e.remove_copy(Tier::Gpu));
        assert_eq!(e.best_tier(), Tier::Cpu);
        // A removal naming a tier without copies still removes one copy.
        assert!(e.remove_copy(Tier::Disk));
    }

    #[test]
    fn sorted_insert_and_collapse() {
        let mut h = Holders::One(Entry::stored(5, Tier::Gpu));
        h.insert(Entry::stored(2, Tier::Gpu));
        h.insert(Entry::stored(9, Tier::Gpu));
        let ids: Vec<u32> = h.as_slice().iter().map(|e| e.instance).collect();
        assert_eq!(ids, vec![2, 5, 9]);
        let mut gone = Vec::new();
        assert!(h.retain(|e| e.instance != 5, &mut |e| gone.push(e.instance)));
        assert!(matches!(h, Holders::One(e) if e.instance == 5));
        assert_eq!(gone, vec![2, 9]);
    }
}
