//! [`FleetView`]: one immutable version of the fleet's membership, swapped in whole.
//!
//! Invariants:
//! - A view never changes once published; readers load the current one lock-free
//!   ([`super::Fleet::view`]) and see a consistent set of pools and instances.
//! - `members(pool)` lists only serving instances, sorted by id; draining instances stay in
//!   `instance(id)` (their in-flight requests still need them) until their slot is freed.

use super::Instance;
use kvgate_core::InstanceId;
use std::sync::Arc;

/// The fleet's membership at one version.
#[derive(Default)]
pub struct FleetView {
    /// Increases with every change.
    pub version: u64,
    /// Present instances (serving or draining) by id slot.
    pub(super) slots: Vec<Option<Arc<Instance>>>,
    /// Per pool, its serving instances.
    pub(super) members: Vec<Vec<InstanceId>>,
}

impl FleetView {
    /// The instance in slot `id`, serving or draining.
    pub fn instance(&self, id: InstanceId) -> Option<&Arc<Instance>> {
        self.slots.get(id.index()).and_then(Option::as_ref)
    }

    /// Every present instance (serving and draining), by id.
    pub fn instances(&self) -> impl Iterator<Item = &Arc<Instance>> + '_ {
        self.slots.iter().flatten()
    }

    /// Every serving instance, by id.
    pub fn serving(&self) -> impl Iterator<Item = &Arc<Instance>> + '_ {
        self.instances().filter(|i| !i.is_removed())
    }

    /// The serving instances of `pool`, sorted by id.
    pub fn members(&self, pool: usize) -> &[InstanceId] {
        self.members.get(pool).map_or(&[], Vec::as_slice)
    }

    /// One past the highest id slot in use.
    pub fn id_bound(&self) -> usize {
        self.slots.len()
    }
}
