//! The bounded wait queue of one pool.
//!
//! Invariants:
//! - Never more than `max_entries` entries nor `max_tokens` queued tokens: an arrival that does not
//!   fit is rejected ([`RejectReason::QueueFull`]) unless evicting entries of strictly lower
//!   priority (lowest class first, newest first) makes room, in which case those are evicted
//!   ([`RejectReason::Shed`]) and nothing of its own class or above is ever evicted.
//! - [`WaitQueue::pop`] serves strictly by priority class; within a class, by tenant fair share
//!   ([`super::fair`]).
//! - [`WaitQueue::expire`] removes every entry that has waited `max_wait_ms` or more.

use super::fair::FairQueue;
use super::{EntryId, Priority, RejectReason, TenantId};
use crate::Millis;
use ahash::AHashMap;

/// A queue's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Entries at most.
    pub max_entries: usize,
    /// Queued tokens (sum of costs) at most.
    pub max_tokens: u64,
    /// Longest wait, ms; older entries are expired.
    pub max_wait_ms: Millis,
}

/// One waiting request.
#[derive(Debug)]
pub struct Queued<T> {
    /// Its id (increasing in arrival order).
    pub id: EntryId,
    /// Its class.
    pub priority: Priority,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its cost in tokens (prompt plus expected output).
    pub cost: u64,
    /// Its tenant's weight (at least 1): the tenant's counter grows by `cost / weight`.
    pub weight: u32,
    /// When it was queued.
    pub enqueued_at: Millis,
    /// The caller's handle on the waiter.
    pub payload: T,
}

/// An accepted arrival.
#[derive(Debug)]
pub struct Pushed<T> {
    /// Its id.
    pub id: EntryId,
    /// Entries evicted to make room ([`RejectReason::Shed`]).
    pub evicted: Vec<Queued<T>>,
}

/// A refused arrival, its payload handed back.
#[derive(Debug)]
pub struct Rejected<T> {
    /// Why.
    pub reason: RejectReason,
    /// The payload it came with.
    pub payload: T,
}

/// What is queued, per class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Entries.
    pub entries: usize,
    /// Tokens.
    pub tokens: u64,
    /// Tenants with entries.
    pub tenants: usize,
    /// Enqueue time of the oldest entry.
    pub oldest_at: Option<Millis>,
}

/// A bounded, prioritized, tenant-fair wait queue.
#[derive(Debug)]
pub struct WaitQueue<T> {
    limits: QueueLimits,
    classes: [FairQueue<T>; 3],
    /// Where each entry is, for removal by id.
    at: AHashMap<EntryId, (Priority, TenantId)>,
    next_id: u64,
}

impl<T> WaitQueue<T> {
    /// An empty queue with `limits`.
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            classes: Default::default(),
            at: AHashMap::new(),
            next_id: 0,
        }
    }

    /// Its bounds.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Entries queued.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Tokens queued.
    pub fn tokens(&self) -> u64 {
        self.classes.iter().map(FairQueue::tokens).sum()
    }

    /// Tokens queued in `priority` and the classes above it: what is served before a new
    /// arrival of that class.
    pub fn tokens_ahead_of(&self, priority: Priority) -> u64 {
        self.classes[..=priority.index()]
            .iter()
            .map(FairQueue::tokens)
            .sum()
    }

    /// What is queued in `priority`.
    pub fn stats(&self, priority: Priority) -> QueueStats {
        let c = &self.classes[priority.index()];
        QueueStats {
            entries: c.len(),
            tokens: c.tokens(),
            tenants: c.backlogged(),
            oldest_at: c.heads().map(|e| e.enqueued_at).min(),
        }
    }

    /// Queues a request of `cost` tokens from a tenant of weight 1 (see [`Self::push_weighted`]).
    pub fn push(
        &mut self,
        priority: Priority,
        tenant: TenantId,
        cost: u64,
        now: Millis,
        payload: T,
    ) -> Result<Pushed<T>, Rejected<T>> {
        self.push_weighted(priority, (tenant, 1), cost, now, payload)
    }

    /// Queues a request of `cost` tokens from `tenant` with its weight (a tenant of weight w is
    /// served w times the tokens of a tenant of weight 1 while both are backlogged), evicting
    /// lower-priority entries if that is the only way it fits; refused (payload back) when it
    /// cannot fit.
    pub fn push_weighted(
        &mut self,
        priority: Priority,
        (tenant, weight): (TenantId, u32),
        cost: u64,
        now: Millis,
        payload: T,
    ) -> Result<Pushed<T>, Rejected<T>> {
        let full = |payload| {
            Err(Rejected {
                reason: RejectReason::QueueFull,
                payload,
            })
        };
        if cost > self.limits.max_tokens || self.limits.max_entries == 0 {
            return full(payload);
        }
        let need_entries = (self.len() + 1).saturating_sub(self.limits.max_entries);
        let need_tokens = (self.tokens() + cost).saturating_sub(self.limits.max_tokens);
        let mut evicted = Vec::new();
        if need_entries > 0 || need_tokens > 0 {
            let lower = &self.classes[priority.index() + 1..];
            let (lower_len, lower_tokens) = lower
                .iter()
                .fold((0, 0), |(n, t), c| (n + c.len(), t + c.tokens()));
            if lower_len < need_entries || lower_tokens < need_tokens {
                return full(payload);
            }
            let (mut freed_entries, mut freed_tokens) = (0, 0);
            while freed_entries < need_entries || freed_tokens < need_tokens {
                let Some(victim) = self.evict_below(priority) else {
                    break;
                };
                freed_entries += 1;
                freed_tokens += victim.cost;
                evicted.push(victim);
            }
        }
        let id = EntryId(self.next_id);
        self.next_id += 1;
        self.classes[priority.index()].push(Queued {
            id,
            priority,
            tenant,
            cost,
            weight: weight.max(1),
            enqueued_at: now,
            payload,
        });
        self.at.insert(id, (priority, tenant));
        Ok(Pushed { id, evicted })
    }

    /// The newest entry of the lowest non-empty class below `priority`, removed.
    fn evict_below(&mut self, priority: Priority) -> Option<Queued<T>> {
        let class = (priority.index() + 1..self.classes.len())
            .rev()
            .find(|&c| !self.classes[c].is_empty())?;
        let (tenant, id) = self.classes[class].newest().map(|e| (e.tenant, e.id))?;
        self.at.remove(&id);
        self.classes[class].remove(tenant, id)
    }

    /// Serves the next entry: the most urgent class first, fair between tenants within it.
    pub fn pop(&mut self) -> Option<Queued<T>> {
        let e = self.classes.iter_mut().find_map(FairQueue::pop)?;
        self.at.remove(&e.id);
        Some(e)
    }

    /// Removes entry `id` (its waiter gave up), if still queued.
    pub fn remove(&mut self, id: EntryId) -> Option<Queued<T>> {
        let (priority, tenant) = self.at.remove(&id)?;
        self.classes[priority.index()].remove(tenant, id)
    }

    /// Removes and returns every entry that has waited `max_wait_ms` or more at `now`.
    pub fn expire(&mut self, now: Millis) -> Vec<Queued<T>> {
        let max_wait = self.limits.max_wait_ms;
        let mut out = Vec::new();
        for c in &mut self.classes {
            loop {
                // A tenant's entries are in arrival order, so only heads can be the oldest.
                let old: Vec<(TenantId, EntryId)> = c
                    .heads()
                    .filter(|e| now.saturating_sub(e.enqueued_at) >= max_wait)
                    .map(|e| (e.tenant, e.id))
                    .collect();
                if old.is_empty() {
                    break;
                }
                for (tenant, id) in old {
                    if let Some(e) = c.remove(tenant, id) {
                        self.at.remove(&id);
                        out.push(e);
                    }
                }
            }
        }
        out
    }

    /// When the oldest entry will have waited `max_wait_ms`, if anything waits.
    pub fn next_expiry(&self) -> Option<Millis> {
        self.classes
            .iter()
            .flat_map(|c| c.heads().map(|e| e.enqueued_at))
            .min()
            .map(|t| t.saturating_add(self.limits.max_wait_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(entries: usize, tokens: u64) -> QueueLimits {
        QueueLimits {
            max_entries: entries,
            max_tokens: tokens,
            max_wait_ms: 1_000,
        }
    }

    fn push(q: &mut WaitQueue<u32>, p: Priority, tenant: u64, cost: u64, tag: u32) -> bool {
        q.push(p, TenantId(tenant), cost, 0, tag).is_ok()
    }

    #[test]
    fn higher_classes_are_served_first() {
        let mut q = WaitQueue::new(limits(10, 1_000));
        push(&mut q, Priority::Sheddable, 1, 1, 0);
        push(&mut q, Priority::Standard, 1, 1, 1);
        push(&mut q, Priority::Critical, 2, 1, 2);
        push(&mut q, Priority::Standard, 2, 1, 3);
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|e| e.payload).collect();
        assert_eq!(order, vec![2, 1, 3, 0]);
    }

    #[test]
    fn a_full_queue_sheds_the_newest_sheddable_for_a_higher_arrival() {
        let mut q = WaitQueue::new(limits(3, 1_000));
        push(&mut q, Priority::Sheddable, 1, 1, 0);
        push(&mut q, Priority::Sheddable, 2, 1, 1);
        push(&mut q, Priority::Standard, 1, 1, 2);
        // Same class: no room, nothing evicted.
        let r = q
            .push(Priority::Sheddable, TenantId(3), 1, 0, 9)
            .unwrap_err();
        assert_eq!((r.reason, r.payload), (RejectReason::QueueFull, 9));
        let p = q.push(Priority::Standard, TenantId(3), 1, 0, 3).unwrap();
        assert_eq!(p.evicted.len(), 1);
        assert_eq!(p.evicted[0].payload, 1, "the newest sheddable goes");
        let p = q.push(Priority::Critical, TenantId(3), 1, 0, 4).unwrap();
        assert_eq!(p.evicted[0].payload, 0);
        // Now only standard and critical are left: a critical arrival evicts a standard one.
        let p = q.push(Priority::Critical, TenantId(3), 1, 0, 5).unwrap();
        assert_eq!(p.evicted[0].payload, 3);
        assert_eq!(q.len(), 3);
        // A standard arrival cannot evict critical or standard entries.
        assert!(!push(&mut q, Priority::Standard, 9, 1, 6));
    }

    #[test]
    fn token_bound_evicts_as_many_as_needed_or_none() {
        let mut q = WaitQueue::new(limits(100, 100));
        push(&mut q, Priority::Sheddable, 1, 30, 0);
        push(&mut q, Priority::Sheddable, 1, 30, 1);
        push(&mut q, Priority::Standard, 1, 30, 2);
        // 90 queued; 70 more needs 60 freed: both sheddable entries go.
        let p = q.push(Priority::Critical, TenantId(2), 70, 0, 3).unwrap();
        assert_eq!(p.evicted.len(), 2);
        assert_eq!(q.tokens(), 100);
        // Too big to ever fit, and a standard arrival that lower classes cannot make room for.
        assert!(!push(&mut q, Priority::Critical, 2, 101, 4));
        assert!(!push(&mut q, Priority::Standard, 2, 1, 5));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn entries_expire_after_the_wait_bound() {
        let mut q = WaitQueue::new(limits(10, 1_000));
        q.push(Priority::Standard, TenantId(1), 1, 0, 0).unwrap();
        q.push(Priority::Standard, TenantId(1), 1, 500, 1).unwrap();
        q.push(Priority::Critical, TenantId(2), 1, 200, 2).unwrap();
        assert_eq!(q.next_expiry(), Some(1_000));
        assert!(q.expire(999).is_empty());
        let gone: Vec<u32> = q.expire(1_200).into_iter().map(|e| e.payload).collect();
        assert_eq!(gone.len(), 2);
        assert!(gone.contains(&0) && gone.contains(&2));
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_expiry(), Some(1_500));
    }

    #[test]
    fn removal_by_id() {
        let mut q = WaitQueue::new(limits(10, 1_000));
        let a = q.push(Priority::Standard, TenantId(1), 5, 0, 0).unwrap().id;
        q.push(Priority::Standard, TenantId(1), 5, 0, 1).unwrap();
        assert_eq!(q.remove(a).map(|e| e.payload), Some(0));
        assert!(q.remove(a).is_none());
        assert_eq!((q.len(), q.tokens()), (1, 5));
        assert_eq!(q.stats(Priority::Standard).entries, 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push { class: u8, tenant: u8, cost: u16 },
        Pop,
        Expire,
        Remove(u8),
        Tick(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..3, 0u8..5, 1u16..500).prop_map(|(class, tenant, cost)| Op::Push { class, tenant, cost }),
            2 => Just(Op::Pop),
            1 => Just(Op::Expire),
            1 => any::<u8>().prop_map(Op::Remove),
            1 => (0u16..400).prop_map(Op::Tick),
        ]
    }

    proptest! {
        /// Bounds hold after every operation; every entry leaves exactly once; pops are in class
        /// order among what is queued, FIFO within a tenant and class.
        #[test]
        fn bounds_priority_and_fifo_hold(ops in proptest::collection::vec(op(), 1..300)) {
            let lim = QueueLimits { max_entries: 12, max_tokens: 2_000, max_wait_ms: 1_000 };
            let mut q: WaitQueue<u64> = WaitQueue::new(lim);
            let mut now: Millis = 0;
            let mut live: Vec<(u64, Priority, TenantId, EntryId)> = Vec::new();
            let mut left = std::collections::HashSet::new();
            let mut tag = 0u64;
            for op in ops {
                match op {
                    Op::Push { class, tenant, cost } => {
                        let p = Priority::ALL[class as usize];
                        tag += 1;
                        match q.push(p, TenantId(tenant.into()), cost.into(), now, tag) {
                            Ok(pushed) => {
                                for e in pushed.evicted {
                                    prop_assert!(e.priority > p, "evicted its own class or above");
                                    prop_assert!(left.insert(e.payload));
                                    live.retain(|l| l.0 != e.payload);
                                }
                                live.push((tag, p, TenantId(tenant.into()), pushed.id));
                            }
                            Err(r) => prop_assert_eq!(r.payload, tag),
                        }
                    }
                    Op::Pop => {
                        if let Some(e) = q.pop() {
                            let best = live.iter().map(|l| l.1).min().unwrap();
                            prop_assert_eq!(e.priority, best);
                            // FIFO: no older live entry of the same tenant and class.
                            let older = live.iter().any(|l| l.1 == e.priority && l.2 == e.tenant && l.0 < e.payload);
                            prop_assert!(!older);
                            prop_assert!(left.insert(e.payload));
                            live.retain(|l| l.0 != e.payload);
                        } else {
                            prop_assert!(live.is_empty());
                        }
                    }
                    Op::Expire => {
                        for e in q.expire(now) {
                            prop_assert!(now - e.enqueued_at >= lim.max_wait_ms);
                            prop_assert!(left.insert(e.payload));
                            live.retain(|l| l.0 != e.payload);
                        }
                        prop_assert!(q.next_expiry().is_none_or(|t| t > now));
                    }
                    Op::Remove(k) => {
                        if !live.is_empty() {
                            let (tag, _, _, id) = live[k as usize % live.len()];
                            prop_assert_eq!(q.remove(id).map(|e| e.payload), Some(tag));
                            prop_assert!(left.insert(tag));
                            live.retain(|l| l.0 != tag);
                            prop_assert!(q.remove(id).is_none());
                        }
                    }
                    Op::Tick(ms) => now += Millis::from(ms),
                }
                prop_assert!(q.len() <= lim.max_entries);
                prop_assert!(q.tokens() <= lim.max_tokens);
                prop_assert_eq!(q.len(), live.len());
            }
        }

        /// Two tenants kept backlogged with equal weights: after every pop their served token
        /// totals differ by at most the largest single cost; neither waits behind more than two
        /// largest costs of the other's service between two of its own.
        #[test]
        fn backlogged_tenants_share_tokens_fairly(
            costs_a in proptest::collection::vec(1u64..1_000, 40..80),
            costs_b in proptest::collection::vec(1u64..1_000, 40..80),
            pops in 10usize..70,
        ) {
            let lim = QueueLimits { max_entries: 1_000, max_tokens: u64::MAX, max_wait_ms: u64::MAX };
            let mut q: WaitQueue<()> = WaitQueue::new(lim);
            let max_cost = costs_a.iter().chain(&costs_b).copied().max().unwrap();
            for (i, c) in costs_a.iter().enumerate() {
                q.push(Priority::Standard, TenantId(1), *c, 0, ()).unwrap();
                if let Some(b) = costs_b.get(i) {
                    q.push(Priority::Standard, TenantId(2), *b, 0, ()).unwrap();
                }
            }
            for b in costs_b.iter().skip(costs_a.len()) {
                q.push(Priority::Standard, TenantId(2), *b, 0, ()).unwrap();
            }
            let pops = pops.min(costs_a.len().min(costs_b.len()));
            let (mut a, mut b) = (0u64, 0u64);
            let (mut since_a, mut since_b) = (0u64, 0u64);
            for _ in 0..pops {
                let e = q.pop().unwrap();
                if e.tenant == TenantId(1) { a += e.cost; since_b += e.cost; since_a = 0; }
                else { b += e.cost; since_a += e.cost; since_b = 0; }
                prop_assert!(a.abs_diff(b) <= max_cost, "a {} b {} max {}", a, b, max_cost);
                prop_assert!(since_a <= 2 * max_cost && since_b <= 2 * max_cost);
            }
        }
    }
}
