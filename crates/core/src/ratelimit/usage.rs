//! What peers report they used: cumulative counters in, deltas out.
//!
//! Each replica tells the others its cumulative usage per tenant (requests and tokens since it
//! started). Cumulative counters make the report idempotent: a lost report is made good by the
//! next, a duplicate or reordered one charges nothing twice. This ledger keeps the last totals
//! seen per (peer, tenant) and turns each report into what is new since then.
//!
//! Invariants:
//! - At most `max_peers` peers and [`MAX_TENANTS_PER_PEER`] tenants per peer are remembered; a
//!   new peer beyond the bound replaces the one heard from least recently (a replica that
//!   restarted or left), and tenants beyond theirs are ignored (and so charge nothing).
//! - Totals only grow: a report below the last one seen is a reordered, older datagram and
//!   charges nothing (a restarted peer comes back under a new id, with a fresh entry).

use super::TenantKey;
use ahash::AHashMap;

/// Tenants remembered per peer.
pub const MAX_TENANTS_PER_PEER: usize = 8_192;

/// When a peer was last heard, and its last totals per tenant.
type Peer = (crate::Millis, AHashMap<TenantKey, (u64, u64)>);

/// Last totals seen from each peer.
#[derive(Debug, Default)]
pub struct PeerLedger {
    max_peers: usize,
    /// Per peer: when last heard, and its last totals per tenant.
    peers: AHashMap<u64, Peer>,
}

impl PeerLedger {
    /// A ledger of at most `max_peers` peers.
    pub fn new(max_peers: usize) -> PeerLedger {
        PeerLedger {
            max_peers,
            peers: AHashMap::new(),
        }
    }

    /// `peer` reports cumulative `(tenant, requests, tokens)` at `now`: returns what each
    /// tenant used there since the previous report.
    pub fn observe(
        &mut self,
        peer: u64,
        report: &[(TenantKey, u64, u64)],
        now: crate::Millis,
    ) -> Vec<(TenantKey, u64, u64)> {
        if !self.peers.contains_key(&peer) && self.peers.len() >= self.max_peers.max(1) {
            let oldest = self.peers.iter().min_by_key(|(_, p)| p.0).map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.peers.remove(&k);
            }
        }
        let entry = self.peers.entry(peer).or_default();
        entry.0 = now;
        let seen = &mut entry.1;
        let mut out = Vec::with_capacity(report.len());
        for &(tenant, requests, tokens) in report {
            if !seen.contains_key(&tenant) && seen.len() >= MAX_TENANTS_PER_PEER {
                continue;
            }
            let last = seen.entry(tenant).or_insert((0, 0));
            let (dr, dt) = (
                requests.saturating_sub(last.0),
                tokens.saturating_sub(last.1),
            );
            *last = (last.0.max(requests), last.1.max(tokens));
            if dr > 0 || dt > 0 {
                out.push((tenant, dr, dt));
            }
        }
        out
    }

    /// Forgets a peer (it left the cluster; a restart comes back under a new id).
    pub fn forget(&mut self, peer: u64) {
        self.peers.remove(&peer);
    }

    /// Peers remembered.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether no peer is remembered.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_idempotent_and_late_reports_charge_nothing() {
        let mut l = PeerLedger::new(2);
        assert_eq!(l.observe(1, &[(7, 3, 30)], 0), vec![(7, 3, 30)]);
        assert!(l.observe(1, &[(7, 3, 30)], 1).is_empty(), "duplicate");
        assert_eq!(l.observe(1, &[(7, 5, 35)], 2), vec![(7, 2, 5)]);
        assert!(l.observe(1, &[(7, 4, 31)], 3).is_empty(), "reordered");
        assert_eq!(l.observe(1, &[(7, 6, 35)], 4), vec![(7, 1, 0)]);
        l.observe(2, &[(7, 1, 1)], 1);
        // Over the bound: peer 2, heard least recently, makes room.
        assert_eq!(l.observe(3, &[(7, 1, 1)], 5), vec![(7, 1, 1)]);
        assert_eq!(l.len(), 2);
        assert!(l.observe(1, &[(7, 6, 35)], 6).is_empty(), "peer 1 kept");
        l.forget(3);
        assert_eq!(l.len(), 1);
    }
}
