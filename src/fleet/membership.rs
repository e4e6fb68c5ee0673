//! Membership changes: a discovered pool reconciled against the endpoint set its source
//! published, and drained instances freed. The caller (the gateway's live-fleet task) starts and
//! stops what lives beside an instance (KV events, gossip naming) and drops what was learned
//! about a freed one.
//!
//! Invariants:
//! - An endpoint is keyed by `(name, url)`: a pod re-created with a new IP is a new instance with
//!   an empty cache; the same key listed again while its instance still drains revives it (a
//!   readiness flap keeps the cache it had).
//! - An endpoint labelled with a model (`kvgate.dev/model`, `llm-d.ai/model`) that is not its
//!   pool's model ([`names_model`]) is not the pool's: it is never an instance of it, and an
//!   instance whose pod is relabelled to another model drains. Several pools may therefore
//!   follow one Service, each taking the pods labelled with its model. Unlabelled endpoints are
//!   the pool's.
//! - Role and data-parallel size are read from the endpoint when its instance is added; a label
//!   changed on a running pod takes effect when the pod is re-created.
//! - A discovered pool never has more than its `max_instances` serving; endpoints beyond the
//!   bound, with a bad URL or name, or named like a serving instance of another pool, are left
//!   out and reported in [`Change::refused`], never half-added.
//! - A slot is freed only after its pool's drain grace has passed since removal *and* nothing
//!   dispatched to it is still in flight, so an answer still under way can never be accounted to
//!   the slot's next instance.

use super::{Fleet, FleetView, Instance};
use crate::config::{Flavour, InstanceConfig, PoolConfig};
use kvgate_core::InstanceId;
use kvgate_discovery::Endpoint;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a reconciliation changed.
#[derive(Default)]
pub struct Change {
    /// New instances, serving now.
    pub added: Vec<Arc<Instance>>,
    /// Draining instances listed again, serving again.
    pub revived: Vec<Arc<Instance>>,
    /// Instances no longer listed, draining from now.
    pub removed: Vec<Arc<Instance>>,
    /// Endpoints left out, with why.
    pub refused: Vec<(String, String)>,
    /// Endpoints labelled for another model than the pool's: `(name, model)`. Not the pool's;
    /// normal when several pools follow one Service.
    pub other_model: Vec<(String, String)>,
}

impl Change {
    /// True when the membership did not change.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.revived.is_empty() && self.removed.is_empty()
    }
}

/// An endpoint as an instance configuration.
fn instance_config(ep: &Endpoint) -> InstanceConfig {
    InstanceConfig {
        name: Some(ep.name.clone()),
        url: ep.url.clone(),
        kv_events: ep.kv_events.clone(),
        kv_replay: ep.kv_replay.clone(),
        kv_topic: None,
        capacity_blocks: None,
    }
}

/// Whether `labelled`, the model a pod names, is `model`: the same name, or, since a label
/// value cannot hold `/` (`Qwen/Qwen3-0.6B` is labelled `Qwen3-0.6B` or `qwen-qwen3-0-6b`), the
/// same once both are normalised (lower case, every run of characters other than ASCII letters
/// and digits one `-`), compared with the whole model name or with its part after the last `/`.
pub fn names_model(model: &str, labelled: &str) -> bool {
    if model == labelled {
        return true;
    }
    let label = normalise(labelled);
    if label.is_empty() {
        return false;
    }
    label == normalise(model)
        || model
            .rsplit_once('/')
            .is_some_and(|(_, last)| label == normalise(last))
}

fn normalise(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The engine family an endpoint reports, else the pool's.
fn flavour_of(ep: &Endpoint, pool: &PoolConfig) -> Flavour {
    match ep.flavour.as_deref() {
        Some("sglang") => Flavour::Sglang,
        Some("vllm") => Flavour::Vllm,
        _ => pool.flavour,
    }
}

impl Fleet {
    /// Makes `pool`'s serving instances the `endpoints` its source lists now, at `now_ms`.
    pub fn reconcile(&self, pool: usize, endpoints: &[Endpoint], now_ms: u64) -> Change {
        let _edit = self.edit.lock();
        let Some(pc) = self.pools.get(pool).map(|p| &p.config) else {
            return Change::default();
        };
        let cur = self.view.load_full();
        let mut slots = cur.slots.clone();
        let mut change = Change::default();
        let (endpoints, others): (Vec<&Endpoint>, Vec<&Endpoint>) = endpoints
            .iter()
            .partition(|e| e.model.as_deref().is_none_or(|m| names_model(&pc.model, m)));
        change.other_model = others
            .into_iter()
            .map(|e| (e.name.clone(), e.model.clone().unwrap_or_default()))
            .collect();
        let listed = |i: &Instance| endpoints.iter().any(|e| e.key() == i.key());
        for inst in cur.instances().filter(|i| i.pool == pool) {
            if inst.is_removed() {
                continue;
            }
            if !listed(inst) {
                inst.mark_removed(now_ms);
                change.removed.push(inst.clone());
            }
        }
        let bound = pc
            .max_instances
            .unwrap_or(PoolConfig::DEFAULT_MAX_INSTANCES);
        let mut serving = cur
            .instances()
            .filter(|i| i.pool == pool && !i.is_removed())
            .count();
        for ep in endpoints {
            let present = slots
                .iter()
                .flatten()
                .find(|i| i.pool == pool && i.key() == ep.key());
            if let Some(inst) = present {
                if inst.is_removed() {
                    if serving >= bound {
                        change.refused.push((
                            ep.name.clone(),
                            format!("pool is at max_instances = {bound}"),
                        ));
                        continue;
                    }
                    inst.mark_serving();
                    serving += 1;
                    change.revived.push(inst.clone());
                }
                continue;
            }
            if serving >= bound {
                change.refused.push((
                    ep.name.clone(),
                    format!("pool is at max_instances = {bound}"),
                ));
                continue;
            }
            let clash = slots
                .iter()
                .flatten()
                .any(|i| !i.is_removed() && i.pool != pool && i.name == ep.name);
            if clash {
                change.refused.push((
                    ep.name.clone(),
                    "an instance of another pool has this name".into(),
                ));
                continue;
            }
            let Some(slot) = free_slot(&slots, self.capacity) else {
                change.refused.push((
                    ep.name.clone(),
                    format!("all {} instance slots are in use", self.capacity),
                ));
                continue;
            };
            let uid = self.next_uid.fetch_add(1, Ordering::Relaxed);
            let id = InstanceId(slot as u32);
            match Instance::new(
                id,
                uid,
                pool,
                &pc.model,
                flavour_of(ep, pc),
                instance_config(ep),
            ) {
                Ok(mut inst) => {
                    inst.role.clone_from(&ep.role);
                    inst.dp_size = ep.dp_size;
                    let inst = Arc::new(inst);
                    if slot == slots.len() {
                        slots.push(Some(inst.clone()));
                    } else {
                        slots[slot] = Some(inst.clone());
                    }
                    serving += 1;
                    self.retired.revive(&inst.name);
                    change.added.push(inst);
                }
                Err(e) => change.refused.push((ep.name.clone(), e.to_string())),
            }
        }
        if !change.is_empty() {
            self.publish(&cur, slots);
        }
        change
    }

    /// Frees the slots of instances that finished draining at `now_ms`: removed at least their
    /// pool's drain grace ago and not `busy` (nothing of theirs in flight). Returns them, so
    /// that what was learned about them can be dropped.
    pub fn sweep(&self, now_ms: u64, busy: impl Fn(&Instance) -> bool) -> Vec<Arc<Instance>> {
        let _edit = self.edit.lock();
        let cur = self.view.load_full();
        let mut slots = cur.slots.clone();
        let mut freed = Vec::new();
        for slot in slots.iter_mut() {
            let Some(inst) = slot else { continue };
            let Some(at) = inst.removed_at() else {
                continue;
            };
            let grace = self.pools[inst.pool].config.discovery.drain_grace_ms;
            if now_ms.saturating_sub(at) >= grace && !busy(inst) {
                freed.extend(slot.take());
            }
        }
        if !freed.is_empty() {
            while matches!(slots.last(), Some(None)) {
                slots.pop();
            }
            for gone in &freed {
                if !slots.iter().flatten().any(|i| i.name == gone.name) {
                    self.retired.retire(&gone.name);
                }
            }
            self.publish(&cur, slots);
        }
        freed
    }

    /// Swaps in the view of `slots`, one version after `cur`.
    fn publish(&self, cur: &FleetView, slots: Vec<Option<Arc<Instance>>>) {
        let mut members = vec![Vec::new(); self.pools.len()];
        for inst in slots.iter().flatten().filter(|i| !i.is_removed()) {
            members[inst.pool].push(inst.id);
        }
        self.view.store(Arc::new(FleetView {
            version: cur.version + 1,
            slots,
            members,
        }));
    }
}

/// The lowest free slot, or a new one while below `capacity`.
fn free_slot(slots: &[Option<Arc<Instance>>], capacity: usize) -> Option<usize> {
    slots
        .iter()
        .position(Option::is_none)
        .or_else(|| (slots.len() < capacity).then_some(slots.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use kvgate_discovery::SourceKind;

    fn fleet(max: usize, grace_ms: u64) -> Fleet {
        let mut cfg = Config::default();
        let mut pool = PoolConfig::serving("m", vec![]);
        pool.discovery.source = SourceKind::Dns;
        pool.discovery.drain_grace_ms = grace_ms;
        pool.max_instances = Some(max);
        cfg.pools = vec![pool];
        Fleet::new(&cfg).unwrap()
    }

    fn ep(name: &str, port: u16) -> Endpoint {
        Endpoint::new(name, format!("http://10.0.0.1:{port}"))
    }

    fn names(f: &Fleet) -> Vec<String> {
        let v = f.view();
        v.members(0)
            .iter()
            .map(|&id| v.instance(id).unwrap().name.clone())
            .collect()
    }

    #[test]
    fn adds_removes_and_frees_after_the_grace() {
        let f = fleet(8, 1_000);
        let c = f.reconcile(0, &[ep("a", 1), ep("b", 2)], 0);
        assert_eq!(c.added.len(), 2);
        assert_eq!(names(&f), ["a", "b"]);
        let b_id = c.added[1].id;
        let c = f.reconcile(0, &[ep("a", 1)], 100);
        assert_eq!(c.removed.len(), 1);
        assert_eq!(names(&f), ["a"]);
        // Draining: still present for its in-flight requests.
        assert!(f.instance(b_id).is_some_and(|i| i.is_removed()));
        assert!(f.sweep(1_099, |_| false).is_empty(), "grace not over");
        assert!(f.sweep(1_100, |_| true).is_empty(), "still busy");
        let freed = f.sweep(1_100, |_| false);
        assert_eq!(freed.len(), 1);
        assert!(f.instance(b_id).is_none());
        // The freed slot is reused by the next new instance, which is a new instance.
        let c = f.reconcile(0, &[ep("a", 1), ep("c", 3)], 2_000);
        assert_eq!(c.added[0].id, b_id);
        assert_ne!(c.added[0].uid, freed[0].uid);
    }

    #[test]
    fn a_new_ip_is_a_new_instance_and_a_flap_revives() {
        let f = fleet(8, 1_000);
        let a = f.reconcile(0, &[ep("a", 1)], 0).added[0].clone();
        // Same pod name, new address: the old one drains, a new one serves.
        let c = f.reconcile(0, &[ep("a", 9)], 10);
        assert_eq!((c.added.len(), c.removed.len()), (1, 1));
        assert_ne!(c.added[0].id, a.id);
        // Listed again while draining: it serves again, its slot and state kept.
        let c = f.reconcile(0, &[ep("a", 9), ep("a", 1)], 20);
        assert_eq!(c.revived.len(), 1);
        assert!(Arc::ptr_eq(&c.revived[0], &a));
        assert!(!a.is_removed());
        assert_eq!(f.view().members(0).len(), 2);
    }

    #[test]
    fn bounds_and_bad_endpoints_are_refused_whole() {
        let f = fleet(2, 0);
        let c = f.reconcile(0, &[ep("a", 1), ep("b", 2), ep("c", 3)], 0);
        assert_eq!(c.added.len(), 2);
        assert_eq!(c.refused.len(), 1);
        let c = f.reconcile(0, &[ep("a", 1), Endpoint::new("bad", "ftp://x:1")], 1);
        assert_eq!(c.removed.len(), 1);
        assert_eq!(c.refused.len(), 1);
        assert_eq!(names(&f), ["a"]);
        // Slots: 2 × max_instances, so draining instances fit beside their successors.
        assert_eq!(f.capacity(), 4);
    }

    #[test]
    fn a_model_label_names_the_pool_exactly_or_in_label_form() {
        assert!(names_model("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"));
        assert!(names_model("Qwen/Qwen3-0.6B", "Qwen3-0.6B"));
        assert!(names_model("Qwen/Qwen3-0.6B", "qwen-qwen3-0-6b"));
        assert!(names_model("llama", "Llama"));
        assert!(!names_model("Qwen/Qwen3-0.6B", "Qwen3-8B"));
        assert!(!names_model("Qwen/Qwen3-0.6B", "qwen"));
        assert!(!names_model("Qwen/Qwen3-0.6B", "--"));
        assert!(!names_model("m", "other"));
    }

    #[test]
    fn endpoints_of_another_model_are_not_the_pools_and_labels_are_kept() {
        let f = fleet(8, 0);
        let mut a = ep("a", 1);
        a.model = Some("M".into());
        a.role = Some("prefill".into());
        a.dp_size = Some(4);
        let mut b = ep("b", 2);
        b.model = Some("other".into());
        let c = f.reconcile(0, &[a.clone(), b.clone(), ep("c", 3)], 0);
        assert_eq!(names(&f), ["a", "c"]);
        assert_eq!(c.other_model, [("b".to_string(), "other".to_string())]);
        assert!(c.refused.is_empty());
        let inst = &c.added[0];
        assert_eq!(
            (inst.name.as_str(), inst.role.as_deref(), inst.dp_size),
            ("a", Some("prefill"), Some(4))
        );
        assert_eq!(
            (c.added[1].role.as_deref(), c.added[1].dp_size),
            (None, None)
        );
        // a relabelled to another model: it leaves the pool (drains) like a removed endpoint.
        a.model = Some("other".into());
        let c = f.reconcile(0, &[a, b, ep("c", 3)], 1);
        assert_eq!(c.removed.len(), 1);
        assert_eq!(names(&f), ["c"]);
    }

    #[test]
    fn versions_increase_only_on_change() {
        let f = fleet(4, 0);
        let v0 = f.view().version;
        f.reconcile(0, &[ep("a", 1)], 0);
        let v1 = f.view().version;
        assert!(v1 > v0);
        f.reconcile(0, &[ep("a", 1)], 1);
        assert_eq!(f.view().version, v1);
    }
}
