//! The comparison orchestrator: fresh fleets, in-process kvgate, failing external routers.

use std::time::Duration;

use kvgate_core::policy::PolicyName;
use kvgate_loadtest::compare::{self, CompareConfig, ContenderSpec};
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder};
use kvgate_loadtest::replay::{Arrivals, ReplayConfig};
use kvgate_loadtest::trace::{Trace, TraceRequest};
use kvgate_sim::FleetConfig;

fn trace() -> Trace {
    let reqs = (0..12u64)
        .map(|i| TraceRequest {
            timestamp_ms: i * 100,
            input_length: 3 * 64 + 10,
            output_length: 3,
            hash_ids: vec![0, 1 + i % 3, 10 + i % 3, 100 + i],
        })
        .collect();
    Trace::from_requests(reqs, 64).unwrap()
}

/// A contender's summary; a contender that failed fails the test with its error.
fn summary(r: &compare::ContenderResult) -> &kvgate_loadtest::report::summary::RunSummary {
    r.summary
        .as_ref()
        .unwrap_or_else(|| panic!("{}: {:?}", r.name, r.error))
}

fn config(contenders: Vec<ContenderSpec>) -> CompareConfig {
    let fleet = FleetConfig {
        engines: 2,
        time_scale: 20.0,
        ..FleetConfig::default()
    };
    CompareConfig {
        replay: ReplayConfig {
            arrivals: Arrivals::Trace { speed_up: 1.0 },
            request_timeout: Duration::from_secs(15),
            drain_timeout: Duration::from_secs(15),
            max_duration: Some(Duration::from_secs(10)),
            progress: false,
            ..ReplayConfig::new("", fleet.model.clone())
        },
        fleet,
        contenders,
        kvgate_base: kvgate::config::Config::default(),
        python: "python3".into(),
        ready_timeout: Duration::from_secs(15),
        sample_interval: Duration::from_millis(200),
        log_dir: std::env::temp_dir().join(format!("kvgate-lt-compare-{}", std::process::id())),
        keep_records: true,
        model_time: true,
        ttft_slo_s: None,
        warm_up_run: 0,
        rounds: 1,
    }
}

/// With several rounds every contender runs once per round, each round starting with the next
/// contender, and the summary over rounds has one row per contender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_rotate_the_order_and_are_summarised_per_contender() {
    let b = PromptBuilder::builtin(ApiKind::Chat, 64, 1).unwrap();
    let mut cfg = config(vec![
        ContenderSpec::kvgate(PolicyName::RoundRobin),
        ContenderSpec::kvgate(PolicyName::ConsistentHash),
    ]);
    cfg.rounds = 2;
    cfg.replay.max_requests = Some(4);
    let results = compare::run(&trace(), &b, &cfg).await;
    let order: Vec<(String, Option<usize>)> =
        results.iter().map(|r| (r.name.clone(), r.round)).collect();
    let rr = "kvgate:round_robin".to_string();
    let ch = "kvgate:consistent_hash".to_string();
    assert_eq!(
        order,
        [
            (rr.clone(), Some(1)),
            (ch.clone(), Some(1)),
            (ch.clone(), Some(2)),
            (rr.clone(), Some(2))
        ]
    );
    assert_eq!(results[2].label(), format!("{ch} (round 2)"));
    for r in &results {
        assert_eq!(summary(r).ok, 4, "{}", r.label());
    }
    let rows = kvgate_loadtest::report::rounds::over_rounds(&results);
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [rr.as_str(), ch.as_str()]);
    for row in &rows {
        assert_eq!((row.runs, row.failed, row.errors), (2, 0, 0), "{row:?}");
        let t = row.ttft_mean.expect("TTFT");
        assert!(t.min > 0.0 && t.min <= t.mean && t.mean <= t.max, "{row:?}");
    }
    let _ = std::fs::remove_dir_all(&cfg.log_dir);
}

/// The warm-up replays the trace's first requests through round robin on a fleet of its own,
/// within the run's own request limit, and is skipped when set to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warm_up_replays_the_first_requests_unmeasured() {
    let b = PromptBuilder::builtin(ApiKind::Chat, 64, 1).unwrap();
    let mut cfg = config(vec![ContenderSpec::kvgate(PolicyName::RoundRobin)]);
    assert!(compare::warm_up(&trace(), &b, &cfg).await.is_none());
    cfg.warm_up_run = 5;
    let w = compare::warm_up(&trace(), &b, &cfg)
        .await
        .expect("a warm-up");
    assert_eq!((w.requests, w.ok, w.error.as_deref()), (5, 5, None));
    assert!(w.wall_s > 0.0);
    // Never more than the comparison itself replays.
    cfg.replay.max_requests = Some(3);
    let w = compare::warm_up(&trace(), &b, &cfg)
        .await
        .expect("a warm-up");
    assert_eq!((w.requests, w.ok, w.error.as_deref()), (3, 3, None));
    let _ = std::fs::remove_dir_all(&cfg.log_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_contender_runs_on_a_fresh_fleet() {
    let cfg = config(vec![
        ContenderSpec::kvgate(PolicyName::RoundRobin),
        ContenderSpec::External {
            name: "exits".into(),
            command: "sh -c 'exit 3'".into(),
            version_command: Some("echo 9.9".into()),
        },
        ContenderSpec::kvgate(PolicyName::ConsistentHash),
    ]);
    let b = PromptBuilder::builtin(ApiKind::Chat, 64, 1).unwrap();
    let results = compare::run(&trace(), &b, &cfg).await;
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r.round.is_none()), "one round");
    let failed = &results[1];
    assert!(
        failed.error.as_deref().unwrap_or("").contains("exited"),
        "{:?}",
        failed.error
    );
    for r in [&results[0], &results[2]] {
        let s = summary(r);
        assert_eq!((s.sent, s.ok, s.error_total), (12, 12, 0), "{}", r.name);
        let f = r.fleet.as_ref().unwrap();
        // Cold caches: the engines saw exactly this contender's 12 requests.
        assert_eq!(
            f.requests_per_engine.iter().sum::<f64>(),
            12.0,
            "{}",
            r.name
        );
        assert_eq!(r.ttft_sorted.len(), 12);
        assert_eq!(r.records.len(), 12);
        // The engines time the first token from the request's arrival there, so the client's
        // TTFT (the same model seconds) is at least theirs, and not without the path to them.
        let at_engines = f.engine_ttft_mean_s.expect("engine TTFT");
        assert!(
            at_engines > 0.0 && at_engines < s.ttft.mean,
            "{}: {at_engines} against {}",
            r.name,
            s.ttft.mean
        );
        assert!(!r.series.is_empty());
    }
    // Round robin splits evenly; consistent hashing on shared prefixes hits more.
    let rr = results[0].summary.as_ref().unwrap();
    assert!(
        rr.instance_share.values().all(|&v| (v - 0.5).abs() < 1e-9),
        "{rr:?}"
    );
    let ch = results[2].summary.as_ref().unwrap();
    assert!(
        ch.hit_ratio.unwrap() >= rr.hit_ratio.unwrap(),
        "{ch:?} vs {rr:?}"
    );
    let _ = std::fs::remove_dir_all(&cfg.log_dir);
}

/// A fleet of two engine classes: each engine runs its own preset, the gateway is told each
/// one's capacity, and the results name every engine's class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_is_started_with_each_engines_class() {
    let mut cfg = config(vec![ContenderSpec::kvgate(PolicyName::RoundRobin)]);
    cfg.fleet.fleet = Some(
        "llama3-8b-h100:1,llama3-8b-a100-40gb:1"
            .parse()
            .expect("fleet string"),
    );
    cfg.fleet.engine.num_cpu_blocks = Some(512);
    let b = PromptBuilder::builtin(ApiKind::Chat, 64, 1).unwrap();
    let results = compare::run(&trace(), &b, &cfg).await;
    let r = &results[0];
    let s = summary(r);
    assert_eq!((s.sent, s.ok, s.error_total), (12, 12, 0));
    assert_eq!(r.engine_presets, ["llama3-8b-h100", "llama3-8b-a100-40gb"]);
    assert_eq!(r.engines.len(), 2);
    assert!(
        s.instance_share.values().all(|&v| (v - 0.5).abs() < 1e-9),
        "{s:?}"
    );
    let _ = std::fs::remove_dir_all(&cfg.log_dir);
}

/// `kvgate*3`: three gateway replicas gossiping on loopback, each request sent to one of them;
/// the follow-up turns of the trace are counted whichever replica routed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_traffic_and_follow_ups_are_counted() {
    let spec = ContenderSpec::parse("kvgate*3").expect("replicas contender");
    let cfg = config(vec![spec]);
    let b = PromptBuilder::builtin(ApiKind::Chat, 64, 1).unwrap();
    let results = compare::run(&trace(), &b, &cfg).await;
    let r = &results[0];
    let s = summary(r);
    assert_eq!((s.sent, s.ok, s.error_total), (12, 12, 0));
    let mut used: Vec<u32> = r.records.iter().filter_map(|x| x.replica).collect();
    used.sort_unstable();
    used.dedup();
    assert_eq!(used, [0, 1, 2], "every replica took requests");
    // Request i + 3 continues request i's first three blocks of four.
    let f = s.follow_ups.expect("follow-ups");
    assert_eq!(f.requests, 9, "{f:?}");
    assert!(f.same_instance <= f.requests);
    let _ = std::fs::remove_dir_all(&cfg.log_dir);
}
