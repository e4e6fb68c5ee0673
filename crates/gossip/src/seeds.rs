//! Seed discovery: static `host:port` seeds and a DNS name resolving to every replica (a Kubernetes
//! headless Service), re-resolved periodically; addresses that are not yet members are announced to.
//!
//! Invariant: resolution failures are logged and retried on the next round, never fatal (DNS for
//! a headless Service is empty until the first pod is ready).

use crate::membership::MembershipInput;
use crate::node::Inner;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// While alone, seeds are retried this often (bounded by `seed_interval_ms`): a restarted replica
/// that missed its first announce joins, and starts catching up, within a fraction of a second.
const ALONE_RETRY_MS: u64 = 250;

pub(crate) async fn run(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let names: Vec<String> = inner
        .cfg
        .seeds
        .iter()
        .chain(inner.cfg.dns_seed.iter())
        .cloned()
        .collect();
    if names.is_empty() {
        return;
    }
    loop {
        let mut addrs: HashSet<SocketAddr> = HashSet::new();
        for n in &names {
            match tokio::net::lookup_host(n.as_str()).await {
                Ok(it) => addrs.extend(it),
                Err(e) => tracing::debug!(seed = %n, error = %e, "gossip: seed does not resolve"),
            }
        }
        let live: HashSet<SocketAddr> = inner.live_dests().into_iter().map(|(_, a)| a).collect();
        for a in addrs {
            if a != inner.addr && !live.contains(&a) {
                let _ = inner.membership_tx.try_send(MembershipInput::Announce(a));
            }
        }
        let wait = if live.is_empty() {
            ALONE_RETRY_MS.min(inner.cfg.seed_interval_ms)
        } else {
            inner.cfg.seed_interval_ms
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
            _ = shutdown.changed() => break,
        }
    }
}
