//! Engine killed under load: each engine is a `kvgate sim --engines 1` child process, and one is
//! SIGKILLed mid-load (a real kill: the kernel closes its sockets, in-flight requests see their
//! connection close with no answer, new connections are refused).
//!
//! Invariant: every child is killed and reaped when its guard drops, on success and on panic.

use crate::common::*;
use crate::harness::{self, Load, Outcome, Report};
use kvgate_sim::fleet::SimInstanceInfo;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A simulated engine in a child process; killed and reaped on drop.
struct Engine {
    child: Child,
    info: SimInstanceInfo,
}

impl Engine {
    /// Starts `kvgate sim --engines 1` and reads the instance list it prints; the instance is
    /// renamed `name` (every such process calls its engine `sim-0`).
    async fn spawn(name: &str) -> Engine {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["sim", "--engines", "1", "--no-kv-events", "--time-scale"])
            .arg(harness::TIME_SCALE.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvgate sim");
        let stdout = child.stdout.take().expect("piped stdout");
        // Guard first, so a failed read still kills the child.
        let mut engine = Engine {
            child,
            info: SimInstanceInfo {
                name: String::new(),
                url: String::new(),
                model: String::new(),
                block_size: 0,
                kv_events_endpoint: None,
                replay_endpoint: None,
                capacity_blocks: 0,
                preset: String::new(),
            },
        };
        let line = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                let _ = std::io::BufReader::new(stdout).read_line(&mut line);
                line
            }),
        )
        .await
        .expect("kvgate sim printed no instances within 20 s")
        .expect("reader");
        let mut infos: Vec<SimInstanceInfo> =
            serde_json::from_str(line.trim()).expect("instance list JSON");
        assert_eq!(infos.len(), 1, "{line}");
        engine.info = infos.remove(0);
        engine.info.name = name.to_string();
        engine
    }

    /// SIGKILL, then reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two engines (each its own process) behind one gateway; 120 non-streaming requests, 6 at a
/// time; after 30 completed, new requests are held back until everything outstanding has been
/// dispatched, the engine with the most requests in flight is SIGKILLed, and the load resumes.
/// `pooled`: whether the gateway keeps idle keep-alive connections. Without them each request is
/// on a fresh connection, so a request in flight sees the close itself; with them, a request
/// written on a parked connection the kill closed is first sent again on a fresh connection to
/// the same engine (refused: a connect failure). Returns the report, the killed engine's name and
/// its in-flight count at the kill.
async fn kill_under_load(idempotent: bool, pooled: bool) -> (Report, String, u32) {
    let engines = vec![Engine::spawn("e0").await, Engine::spawn("e1").await];
    let infos: Vec<SimInstanceInfo> = engines.iter().map(|e| e.info.clone()).collect();
    let mut cfg = harness::config(&infos);
    cfg.upstream.idempotent_requests = idempotent;
    if !pooled {
        cfg.upstream.pool_max_idle_per_host = 0;
    }
    let gw = Gateway::start(cfg).await;
    harness::all_usable(&gw).await;
    let engines = Arc::new(parking_lot::Mutex::new(engines));
    let victim = Arc::new(parking_lot::Mutex::new((String::new(), 0u32)));
    let model = infos[0].model.clone();
    let url = gw.url("/v1/chat/completions");
    let load = Load {
        requests: 120,
        concurrency: 6,
        fault_after: 30,
        request: Box::new(move |i| (url.clone(), harness::chat(&model, i, 200, false))),
        failover: false,
    };
    let (gw_ref, engines_f, victim_f) = (&gw, engines.clone(), victim.clone());
    let report = harness::run(
        load,
        Box::new(move |progress| {
            Box::pin(async move {
                let fleet = &gw_ref.state.fleet;
                let load = gw_ref.state.routing.load();
                let in_flight = |id| load.snapshot(id).in_flight;
                // Everything outstanding reached an engine: none of it can still be routed to
                // the victim after the kill.
                let dispatched = eventually(5, || {
                    let total: u32 = fleet.view().instances().map(|i| in_flight(i.id)).sum();
                    total as usize >= progress.outstanding()
                })
                .await;
                assert!(dispatched, "outstanding requests never dispatched");
                let view = fleet.snapshot();
                let (idx, inst) = view
                    .instances()
                    .enumerate()
                    .max_by_key(|(_, i)| in_flight(i.id))
                    .expect("instances");
                let n = in_flight(inst.id);
                engines_f.lock()[idx].kill();
                *victim_f.lock() = (inst.name.clone(), n);
            })
        }),
    )
    .await;
    drop(gw);
    drop(engines);
    let (name, n) = victim.lock().clone();
    (report, name, n)
}

/// With `upstream.idempotent_requests = true` and no keep-alive pool: no request is lost — those
/// in flight on the killed engine (connection closed before any answer byte) and those routed to
/// it before its ejection (connect refused) are all retried on the healthy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_engine_loses_nothing_when_requests_are_idempotent() {
    let t = Instant::now();
    let (report, victim, in_flight) = kill_under_load(true, false).await;
    harness::summary("kill/idempotent", t, &report);
    eprintln!("  killed {victim} with {in_flight} in flight");
    assert!(in_flight >= 1, "nothing was in flight on the killed engine");
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {} requests: {:?}", lost.len(), lost);
    let after: Vec<&Outcome> = report.after().collect();
    assert!(!after.is_empty());
    assert_eq!(Report::served_by(&after, &victim), 0);
}

/// With the default (`idempotent_requests = false`): the only failures are requests that were in
/// flight on the killed engine at the kill — at most its in-flight count, each started before the
/// kill, each a 502 `upstream_protocol_error` (OpenAI error body) — and none of the requests
/// started after the kill fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_engine_fails_only_its_in_flight_requests_by_default() {
    let t = Instant::now();
    let (report, victim, in_flight) = kill_under_load(false, true).await;
    harness::summary("kill/default", t, &report);
    eprintln!("  killed {victim} with {in_flight} in flight");
    assert!(in_flight >= 1, "nothing was in flight on the killed engine");
    let lost = report.lost();
    assert!(
        lost.len() <= in_flight as usize,
        "{} failures, {in_flight} were in flight on {victim}: {lost:?}",
        lost.len()
    );
    for o in &lost {
        assert!(
            !o.after_fault,
            "a request started after the kill failed: {o:?}"
        );
        assert_eq!(o.status, 502, "{o:?}");
        assert_eq!(
            o.code().as_deref(),
            Some("upstream_protocol_error"),
            "{o:?}"
        );
    }
    let after: Vec<&Outcome> = report.after().collect();
    assert!(after.iter().all(|o| o.ok()));
    assert_eq!(Report::served_by(&after, &victim), 0);
}
