//! Slow clients and floods against the real `kvgate` binary, a child process fronting two
//! in-process mock engines: while a well-behaved client makes sequential requests, (a) clients
//! trickle request heads a byte at a time, (b) slow readers of long streams read a byte now and
//! then, (c) many keep-alive connections sit idle after one request, and (d) connections open
//! and close at once. Every offender must be closed by its limit (within a slack), the good client
//! must get only 200s, quickly, and the gateway's peak RSS must stay under the bound computed from
//! its config (docs/limits.md, "Flood and memory").
//!
//! `full_size` (ignored; `loadtest/flood.sh` runs it in release) is the same scenario with
//! 10,000 idle connections and longer limits, printing its figures.

#[path = "flood/cap.rs"]
mod cap;
#[path = "flood/child.rs"]
mod child;
#[path = "flood/clients.rs"]
mod clients;
mod common;
#[path = "flood/scenario.rs"]
mod scenario;

use scenario::{percentile, Report, Size};
use std::time::Duration;

/// Descriptors the scenario needs besides one per idle connection, in this process (a slow
/// reader's stream also holds the mock's end of its upstream connection) and in the gateway.
fn other_descriptors(tricklers: usize, slow_readers: usize) -> usize {
    tricklers + 2 * slow_readers + 512
}

/// The scenario's idle connections: `want`, or fewer when the descriptor limit is lower.
fn idle_for(nofile: u64, want: usize, tricklers: usize, slow_readers: usize) -> usize {
    let room = (nofile as usize).saturating_sub(other_descriptors(tricklers, slow_readers));
    want.min(room)
}

/// The checks every run must pass.
fn check(r: &Report) {
    let s = &r.size;
    let non200: Vec<_> = r
        .alone
        .iter()
        .chain(&r.flooded)
        .filter(|(c, _)| *c != 200)
        .collect();
    assert!(non200.is_empty(), "good client got {non200:?}");
    assert!(
        r.flooded.len() >= 10,
        "good client made {} requests",
        r.flooded.len()
    );
    let p99 = percentile(&r.flooded, 99);
    assert!(p99 < GOOD_P99, "good client's p99 {p99:?} during the flood");
    for (name, k, n) in [
        ("tricklers", &r.tricklers, s.tricklers),
        ("slow readers", &r.slow_readers, s.slow_readers),
        ("idle", &r.idle, s.idle),
    ] {
        assert_eq!(k.opened, n, "{name}: {k:?}");
        assert_eq!(k.closed_in_time, n, "{name}: {k:?}");
    }
    assert_eq!(
        r.streams_dropped, s.slow_readers,
        "upstream streams not cancelled"
    );
    assert_eq!(r.flood_connected, s.flood);
    assert_eq!(r.sockets_end, 0, "client connections left open");
    let by = |reason: &str| {
        r.closed
            .iter()
            .find(|(n, _)| n == reason)
            .map_or(0, |(_, v)| *v as usize)
    };
    assert_eq!(by("header_timeout"), s.tricklers, "{:?}", r.closed);
    assert_eq!(by("write_timeout"), s.slow_readers, "{:?}", r.closed);
    assert!(by("idle_timeout") >= s.idle, "{:?}", r.closed);
    assert_eq!(by("over_capacity"), 0, "{:?}", r.closed);
    assert!(
        r.end.hwm <= r.bound,
        "peak RSS {} MiB over the bound {} MiB = {}",
        r.end.hwm >> 20,
        r.bound >> 20,
        r.bound_terms
    );
}

/// The good client's p99 latency during the flood, on a loaded 2-core machine (where the flood
/// clients, the mocks and the gateway share the cores; unloaded it is a few ms).
const GOOD_P99: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_and_floods_against_the_binary() {
    let nofile = child::raise_nofile();
    let (tricklers, slow_readers) = (200, 40);
    let size = Size {
        idle: idle_for(nofile, 1000, tricklers, slow_readers),
        tricklers,
        slow_readers,
        flood: 2000,
        baseline: 200,
        header_ms: 500,
        write_ms: 500,
        idle_ms: 2000,
        tick: Duration::from_millis(50),
        slack: Duration::from_secs(4),
    };
    assert!(size.idle >= 100, "descriptor limit {nofile} too low");
    let r = scenario::run(size).await;
    r.print();
    check(&r);
}

/// The full-size run: `KVGATE_FLOOD_IDLE` idle connections (10,000), the other kinds scaled
/// alike. `loadtest/flood.sh` runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long; run by loadtest/flood.sh"]
async fn full_size() {
    let nofile = child::raise_nofile();
    let var = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (tricklers, slow_readers) = (
        var("KVGATE_FLOOD_TRICKLERS", 1000),
        var("KVGATE_FLOOD_SLOW", 200),
    );
    let want = var("KVGATE_FLOOD_IDLE", 10_000);
    let idle = idle_for(nofile, want, tricklers, slow_readers);
    assert_eq!(
        idle, want,
        "descriptor limit {nofile} too low for {want} idle connections"
    );
    let size = Size {
        idle,
        tricklers,
        slow_readers,
        flood: var("KVGATE_FLOOD_CONNECTS", 20_000),
        baseline: 2000,
        header_ms: 2000,
        write_ms: 2000,
        idle_ms: var("KVGATE_FLOOD_IDLE_MS", 20_000) as u64,
        tick: Duration::from_millis(100),
        slack: Duration::from_secs(5),
    };
    let r = scenario::run(size).await;
    r.print();
    check(&r);
}
/// A connection's task is what each of 10,000 idle connections costs beside its head buffer:
/// the rarely taken paths (hand-off to hyper, refusals) must not be inlined into it.
#[tokio::test]
async fn a_connection_task_is_small() {
    let bytes = scenario::task_bytes().await;
    assert!(bytes <= 4096, "a connection's task is {bytes} bytes");
}

/// At the connection cap, filled with idle connections, while connect-and-close churn runs:
/// legitimate clients opening a new connection per request are all served (idle ones evicted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_flood_at_the_cap_does_not_lock_out_new_clients() {
    child::raise_nofile();
    let r = cap::run(cap::CapSize {
        cap: 500,
        churn: 2000,
        requests: 400,
        clients: 4,
    })
    .await;
    r.print();
    r.check();
}

/// The same at full size (`KVGATE_FLOOD_CAP` places, 10,000; `KVGATE_FLOOD_CONNECTS` churn).
/// `loadtest/flood.sh --at-cap` runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long; run by loadtest/flood.sh --at-cap"]
async fn full_size_at_the_cap() {
    let nofile = child::raise_nofile();
    let var = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let cap = var("KVGATE_FLOOD_CAP", 10_000);
    assert!(
        nofile as usize > cap + 1024,
        "descriptor limit {nofile} too low for a cap of {cap}"
    );
    let r = cap::run(cap::CapSize {
        cap,
        churn: var("KVGATE_FLOOD_CONNECTS", 20_000),
        requests: var("KVGATE_FLOOD_REQUESTS", 5_000),
        clients: 8,
    })
    .await;
    r.print();
    r.check();
}
