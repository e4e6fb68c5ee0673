//! Fair queueing between tenants by tokens, within one priority class.
//!
//! Each tenant has a virtual token counter: the tokens of its entries served so far. [`FairQueue::pop`]
//! serves the head of the backlogged tenant with the smallest counter (ties: the oldest head) and
//! adds its cost, divided by the tenant's weight, to that tenant's counter. A tenant that becomes backlogged has its counter raised
//! to the smallest counter among the backlogged tenants (or, if none is, to the counter the last
//! served entry started from), so a tenant that was idle, or is new, gets no credit for that time.
//! This is start-time fair queueing with tokens as the service unit (the "virtual token counter"
//! of Sheng et al., *Fairness in Serving Large Language Models*, OSDI '24).
//!
//! Invariants:
//! - Entries of one tenant leave in the order they arrived (FIFO within a tenant).
//! - Two tenants backlogged over a run of pops with equal counters at its start are served token
//!   totals that, divided by their weights, differ by at most the largest single entry's
//!   cost ÷ weight (plus one for rounding), after every pop.
//! - `ready` holds exactly one key per backlogged tenant: `(counter, head id, tenant)`.
//! - Idle tenants' counters are kept only while they could still matter (above the virtual
//!   time), and at most [`MAX_IDLE_TENANTS`] of them.

use super::queue::Queued;
use super::{EntryId, TenantId};
use ahash::AHashMap;
use std::collections::{BTreeSet, VecDeque};

/// Bound on remembered idle tenants (beyond it they are forgotten, which can give each of them a
/// credit of at most the cost of the entries they were last served).
pub const MAX_IDLE_TENANTS: usize = 4096;

#[derive(Debug)]
struct Tenant<T> {
    /// Tokens served (virtual: raised when the tenant becomes backlogged).
    counter: u64,
    entries: VecDeque<Queued<T>>,
}

/// One priority class's entries, by tenant.
#[derive(Debug)]
pub struct FairQueue<T> {
    tenants: AHashMap<TenantId, Tenant<T>>,
    /// Backlogged tenants by `(counter, head entry id, tenant)`: the first is served next.
    ready: BTreeSet<(u64, EntryId, TenantId)>,
    /// The counter the last served entry started from; no backlogged counter is below it.
    vtime: u64,
    len: usize,
    tokens: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            tenants: AHashMap::new(),
            ready: BTreeSet::new(),
            vtime: 0,
            len: 0,
            tokens: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Entries queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens queued.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Tenants with queued entries.
    pub fn backlogged(&self) -> usize {
        self.ready.len()
    }

    /// The virtual time: the counter the last served entry started from.
    pub fn vtime(&self) -> u64 {
        self.vtime
    }

    /// `tenant`'s counter, if remembered.
    pub fn counter(&self, tenant: TenantId) -> Option<u64> {
        self.tenants.get(&tenant).map(|t| t.counter)
    }

    /// Queues `e` behind its tenant's earlier entries.
    pub fn push(&mut self, e: Queued<T>) {
        let floor = self.ready.first().map_or(self.vtime, |k| k.0);
        let (id, tenant, cost) = (e.id, e.tenant, e.cost);
        let t = self.tenants.entry(tenant).or_insert_with(|| Tenant {
            counter: 0,
            entries: VecDeque::new(),
        });
        if t.entries.is_empty() {
            t.counter = t.counter.max(floor);
            self.ready.insert((t.counter, id, tenant));
        }
        t.entries.push_back(e);
        self.len += 1;
        self.tokens += cost;
    }

    /// Serves the next entry: the head of the least-served backlogged tenant.
    pub fn pop(&mut self) -> Option<Queued<T>> {
        let (counter, _, tenant) = self.ready.pop_first()?;
        let t = self.tenants.get_mut(&tenant)?;
        let e = t.entries.pop_front()?;
        self.vtime = self.vtime.max(counter);
        t.counter = counter.saturating_add(e.cost.div_ceil(u64::from(e.weight.max(1))));
        if let Some(next) = t.entries.front() {
            self.ready.insert((t.counter, next.id, tenant));
        }
        self.len -= 1;
        self.tokens -= e.cost;
        self.prune();
        Some(e)
    }

    /// Removes entry `id` of `tenant` without serving it (its tenant is not charged).
    pub fn remove(&mut self, tenant: TenantId, id: EntryId) -> Option<Queued<T>> {
        let t = self.tenants.get_mut(&tenant)?;
        let at = t.entries.iter().position(|e| e.id == id)?;
        let head = t.entries.front().map(|e| e.id);
        let e = t.entries.remove(at)?;
        if head == Some(id) {
            self.ready.remove(&(t.counter, id, tenant));
            if let Some(next) = t.entries.front() {
                self.ready.insert((t.counter, next.id, tenant));
            }
        }
        self.len -= 1;
        self.tokens -= e.cost;
        Some(e)
    }

    /// The oldest entry of each backlogged tenant: where waits are longest.
    pub fn heads(&self) -> impl Iterator<Item = &Queued<T>> + '_ {
        self.ready
            .iter()
            .filter_map(|&(_, _, tenant)| self.tenants.get(&tenant).and_then(|t| t.entries.front()))
    }

    /// The entry queued last (the largest id), if any.
    pub fn newest(&self) -> Option<&Queued<T>> {
        self.ready
            .iter()
            .filter_map(|&(_, _, tenant)| self.tenants.get(&tenant).and_then(|t| t.entries.back()))
            .max_by_key(|e| e.id)
    }

    /// Forgets idle tenants that no longer matter: those at or below the virtual time (they would
    /// be raised to at least it anyway), then, past [`MAX_IDLE_TENANTS`], all idle ones.
    fn prune(&mut self) {
        let idle = self.tenants.len() - self.ready.len();
        if idle <= MAX_IDLE_TENANTS.min(2 * self.len + 64) {
            return;
        }
        let vtime = self.vtime;
        self.tenants
            .retain(|_, t| !t.entries.is_empty() || t.counter > vtime);
        if self.tenants.len() - self.ready.len() > MAX_IDLE_TENANTS {
            self.tenants.retain(|_, t| !t.entries.is_empty());
        }
    }

    /// Remembered tenants, idle ones included.
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Priority;

    fn entry(id: u64, tenant: u64, cost: u64) -> Queued<()> {
        Queued {
            id: EntryId(id),
            priority: Priority::Standard,
            tenant: TenantId(tenant),
            cost,
            weight: 1,
            enqueued_at: 0,
            payload: (),
        }
    }

    #[test]
    fn a_heavier_tenant_is_served_in_proportion_to_its_weight() {
        // Tenant 1 weighs 3, tenant 2 weighs 1, equal request sizes: 3 of every 4 pops are 1's.
        let mut q = FairQueue::default();
        for i in 0..400 {
            let mut e = entry(i, 1 + (i % 2), 90);
            if e.tenant == TenantId(1) {
                e.weight = 3;
            }
            q.push(e);
        }
        let mut served = [0u64; 3];
        for n in 1..=200 {
            let e = q.pop().unwrap();
            served[e.tenant.0 as usize] += e.cost;
            // Served tokens ÷ weight stay within one request's charge of each other.
            let (a, b) = (served[1] / 3, served[2]);
            assert!(a.abs_diff(b) <= 90, "after {n} pops: {served:?}");
        }
        assert_eq!(served[1] + served[2], 200 * 90);
        assert!(
            (served[1] as f64 / served[2] as f64 - 3.0).abs() < 0.1,
            "{served:?}"
        );
    }

    #[test]
    fn tokens_not_requests_are_shared() {
        // Tenant 1 sends big requests, tenant 2 small ones: 2 gets ~10 served per 1's one.
        let mut q = FairQueue::default();
        let mut id = 0;
        for _ in 0..20 {
            q.push(entry(id, 1, 1000));
            id += 1;
        }
        for _ in 0..200 {
            q.push(entry(id, 2, 100));
            id += 1;
        }
        let mut served = [0u64; 3];
        for _ in 0..110 {
            let e = q.pop().unwrap();
            served[e.tenant.0 as usize] += e.cost;
        }
        assert!(served[1].abs_diff(served[2]) <= 1000, "{served:?}");
    }

    #[test]
    fn an_idle_tenant_gets_no_burst_credit() {
        let mut q = FairQueue::default();
        for i in 0..100 {
            q.push(entry(i, 1, 10));
        }
        for _ in 0..50 {
            q.pop();
        }
        // Tenant 2 arrives after 500 tokens of tenant 1's service: it starts level, not 500 ahead.
        for i in 100..200 {
            q.push(entry(i, 2, 10));
        }
        let mut run = 0;
        let mut longest = 0;
        for _ in 0..60 {
            if q.pop().unwrap().tenant == TenantId(2) {
                run += 1;
                longest = longest.max(run);
            } else {
                run = 0;
            }
        }
        assert!(longest <= 2, "tenant 2 was served {longest} in a row");
    }

    #[test]
    fn removing_a_head_keeps_the_tenant_ready() {
        let mut q = FairQueue::default();
        q.push(entry(0, 1, 5));
        q.push(entry(1, 1, 5));
        q.push(entry(2, 2, 5));
        assert!(q.remove(TenantId(1), EntryId(0)).is_some());
        assert_eq!(q.len(), 2);
        assert_eq!(q.tokens(), 10);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|e| e.id.0).collect();
        assert_eq!(order, vec![1, 2]);
        assert!(q.remove(TenantId(1), EntryId(9)).is_none());
    }

    #[test]
    fn idle_tenants_are_forgotten_within_the_bound() {
        let mut q = FairQueue::default();
        for i in 0..(3 * MAX_IDLE_TENANTS as u64) {
            q.push(entry(i, i, 1));
            q.pop();
        }
        assert!(q.tenants() <= MAX_IDLE_TENANTS + 1, "{}", q.tenants());
    }
}
