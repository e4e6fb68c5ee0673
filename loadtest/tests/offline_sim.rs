//! The offline simulator end to end on a small slice of the Mooncake conversation trace:
//! determinism, consistency of the figures with the references, and the CLI's JSON report.

use std::path::PathBuf;

use kvgate_loadtest::offline::cli::{gateway_router_settings, RatesMode};
use kvgate_loadtest::offline::router::nominal_rates;
use kvgate_loadtest::offline::{
    references, run_cli, run_policies, FleetSpec, IndexMode, OfflineArgs, OfflineConfig,
    OfflineReport, Workload,
};
use kvgate_loadtest::trace::{TieSpread, Trace};
use kvgate_sim::model::EngineParams;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
        .join(name)
}

/// 150 requests of the conversation trace, 4 engines with little cache, a fast speed-up.
fn setup(seed: u64, index: IndexMode) -> (Workload, OfflineConfig) {
    let trace = Trace::load(data("conversation_slice.jsonl"))
        .expect("trace")
        .slice(Some(150), None);
    let params = EngineParams {
        num_gpu_blocks: 8000,
        ..Default::default()
    };
    let w = Workload::from_trace(&trace, params.block_size, 2.0).expect("workload");
    let rates = nominal_rates(&params, 8192);
    let fleet = FleetSpec::uniform(4, params);
    let mut router = gateway_router_settings(&fleet, index, None, 1000);
    router.rates = rates;
    let cfg = OfflineConfig {
        router,
        fleet,
        policy: Default::default(),
        seed,
        jobs: 2,
    };
    (w, cfg)
}

fn strip_wall(
    mut rs: Vec<kvgate_loadtest::offline::PolicyResult>,
) -> Vec<kvgate_loadtest::offline::PolicyResult> {
    for r in &mut rs {
        r.wall_ms = 0.0;
    }
    rs
}

#[test]
fn same_seed_same_results() {
    let names: Vec<String> = ["kvgate", "sglang_cache_aware"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (w, cfg) = setup(5, IndexMode::Both);
    let a = strip_wall(run_policies(&w, &cfg, &names).expect("run a"));
    let b = strip_wall(run_policies(&w, &cfg, &names).expect("run b"));
    assert_eq!(a, b);
    assert!(a.iter().all(|r| r.completed == r.requests), "{a:#?}");
}

#[test]
fn figures_respect_the_references() {
    let (w, cfg) = setup(1, IndexMode::Both);
    let refs = references(&w, &cfg.fleet, true).expect("references");
    let names: Vec<String> = ["kvgate", "round_robin", "dynamo_cost"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rs = run_policies(&w, &cfg, &names).expect("run");
    assert!(refs.infinite_hit_ratio > 0.0);
    assert!(refs.fleet_lru_hit_ratio <= refs.infinite_hit_ratio + 1e-12);
    for r in &rs {
        // No placement hits more than one infinite cache; nobody beats the no-queue floor.
        assert!(
            r.hit_ratio <= refs.infinite_hit_ratio + 1e-9,
            "{}: {}",
            r.policy,
            r.hit_ratio
        );
        assert!(
            r.ttft_s.p50 >= refs.ttft_floor_s.p50 * 0.999,
            "{}",
            r.policy
        );
        assert!(
            r.ttft_s.mean >= refs.ttft_floor_s.mean * 0.999,
            "{}",
            r.policy
        );
        assert!(
            r.ttft_s.p99 >= refs.ttft_floor_s.p99 * 0.999,
            "{}",
            r.policy
        );
        for (got, floor) in [
            (r.e2e_s.p50, refs.e2e_floor_s.p50),
            (r.e2e_s.mean, refs.e2e_floor_s.mean),
            (r.e2e_s.p99, refs.e2e_floor_s.p99),
        ] {
            assert!(
                got >= floor * 0.999,
                "{}: E2E {got} under the floor {floor}",
                r.policy
            );
        }
        let share: f64 = r.instance_share.iter().sum();
        assert!((share - 1.0).abs() < 1e-9);
        assert!(
            r.utilisation > 0.0 && r.utilisation <= 1.05,
            "{}",
            r.utilisation
        );
        assert!(r.busy > 0.0 && r.busy <= 1.0);
        assert!(r.e2e_s.mean >= r.ttft_s.mean);
    }
}

#[test]
fn every_index_mode_runs() {
    for mode in [IndexMode::Predicted, IndexMode::Events] {
        let (w, cfg) = setup(3, mode);
        let rs = run_policies(&w, &cfg, &["kvgate".to_string()]).expect("run");
        assert_eq!(rs[0].completed, rs[0].requests, "{mode:?}");
        assert!(rs[0].hit_ratio > 0.0, "{mode:?}");
    }
}

/// An index fed by the engines' KV events alone knows only what has reached it: with events
/// arriving after the whole replay the router matches nothing; with them at each step's end it
/// matches the conversation's earlier turns.
#[test]
fn late_kv_events_leave_an_event_fed_index_behind() {
    let names = ["kvgate".to_string()];
    let (w, cfg) = setup(3, IndexMode::Events);
    let on_time = run_policies(&w, &cfg, &names).expect("run")[0].clone();
    let (w, mut late) = setup(3, IndexMode::Events);
    late.router.event_lag_ms = 3_600_000;
    let never = run_policies(&w, &late, &names).expect("run")[0].clone();
    assert!(on_time.router_matched_ratio > 0.01, "{on_time:#?}");
    assert_eq!(never.router_matched_ratio, 0.0, "{never:#?}");
    assert_eq!(never.completed, never.requests);
    // A lag shorter than the gaps between turns changes little of what is matched.
    late.router.event_lag_ms = 5;
    let short = run_policies(&w, &late, &names).expect("run")[0].clone();
    assert!(
        short.router_matched_ratio > on_time.router_matched_ratio * 0.8,
        "{} against {}",
        short.router_matched_ratio,
        on_time.router_matched_ratio
    );
}

/// `compare`'s warm-up request moves a round-robin rotation by one place; the offline
/// simulator's warm-up does the same, and nothing else about the run.
#[test]
fn a_warm_up_request_moves_round_robin_by_one_place() {
    let names = ["round_robin".to_string()];
    let instances = |warm_up: u32| {
        let (w, mut cfg) = setup(3, IndexMode::Both);
        cfg.router.warm_up_requests = warm_up;
        let r = run_policies(&w, &cfg, &names).expect("run")[0].clone();
        assert_eq!(r.completed, r.requests);
        let mut by_index: Vec<(usize, usize)> = r
            .records
            .iter()
            .filter_map(|rec| Some((rec.index, rec.instance.as_deref()?.parse().ok()?)))
            .collect();
        by_index.sort_unstable();
        by_index.into_iter().map(|(_, e)| e).collect::<Vec<usize>>()
    };
    let cold = instances(0);
    let warm = instances(1);
    assert_eq!(cold.len(), 150);
    assert_eq!(&cold[..5], &[0, 1, 2, 3, 0]);
    assert_eq!(warm.len(), cold.len());
    assert!(warm.iter().zip(&cold).all(|(w, c)| *w == (c + 1) % 4));
}

/// The CLI's arguments for a small run of the recorded conversation slice: 80 requests on 3
/// engines, kvgate against round robin, the report and per-request records written out.
fn small_cli_args(out: &std::path::Path, records: &std::path::Path) -> OfflineArgs {
    OfflineArgs {
        trace: Some(data("conversation_slice.jsonl")),
        synth: None,
        synth_seed: 1,
        trace_block_tokens: 512,
        skip_requests: 0,
        max_requests: Some(80),
        engines: 3,
        preset: "llama3-8b-h100".into(),
        fleet: None,
        capacity_blocks: Some(6000),
        cpu_blocks: Some(2000),
        speed_up: Some(2.0),
        target_utilisation: None,
        policies: "kvgate,round_robin".into(),
        seed: 9,
        index: IndexMode::Both,
        overrides: vec![],
        predicted_ttl_ms: None,
        scrape_interval_ms: 1000,
        event_lag_ms: 0,
        warm_up_requests: 0,
        shuffle_simultaneous: false,
        ingest_us_per_ktoken: 0.0,
        ingest_jitter_us: 0,
        spread_ties: None,
        rates: RatesMode::Nominal,
        index_capacity_factor: 2.0,
        expire_interval_ms: 60_000,
        no_floor: false,
        instances: false,
        jobs: Some(2),
        json: Some(out.to_path_buf()),
        records: Some(records.to_path_buf()),
    }
}

#[test]
fn cli_writes_a_json_report() {
    let dir = std::env::temp_dir().join(format!("kvgate-offline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let out = dir.join("report.json");
    let records = dir.join("records.jsonl");
    let args = small_cli_args(&out, &records);
    let report = run_cli(args).expect("cli run");
    let parsed: OfflineReport =
        serde_json::from_slice(&std::fs::read(&out).expect("read report")).expect("parse report");
    assert_eq!(parsed.results.len(), 2);
    assert_eq!(parsed.params.requests, 80);
    assert_eq!(parsed.params.engine.num_cpu_blocks, 2000);
    assert_eq!(parsed.results[0].policy, "kvgate");
    assert_eq!(parsed.results[1].hit_ratio, report.results[1].hit_ratio);
    assert!(parsed.references.ttft_floor_s.count > 0);
    assert_eq!(
        parsed.references.e2e_floor_s.count,
        parsed.references.ttft_floor_s.count
    );
    assert!(parsed.references.e2e_floor_s.mean > parsed.references.ttft_floor_s.mean);
    // One record per request and policy, in the live replay's format, agreeing with the summary.
    let text = std::fs::read_to_string(&records).expect("read records");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("record line"))
        .collect();
    for (i, r) in report.results.iter().enumerate() {
        let mine: Vec<_> = lines
            .iter()
            .filter(|l| l["policy"] == r.policy.as_str())
            .collect();
        assert_eq!(mine.len(), r.completed + r.rejected, "{}", r.policy);
        let ttfts: Vec<f64> = mine.iter().filter_map(|l| l["ttft_s"].as_f64()).collect();
        let mean = ttfts.iter().sum::<f64>() / ttfts.len() as f64;
        assert!(
            (mean - r.ttft_s.mean).abs() < 1e-9,
            "{} {mean} {}",
            r.policy,
            r.ttft_s.mean
        );
        let served: Vec<usize> = mine
            .iter()
            .filter_map(|l| l["instance"].as_str()?.parse().ok())
            .collect();
        assert_eq!(served.len(), mine.len());
        let on_first = served.iter().filter(|&&e| e == 0).count() as f64 / served.len() as f64;
        assert!((on_first - report.results[i].instance_share[0]).abs() < 1e-9);
        assert!(mine.iter().all(|l| l["outcome"]["kind"] == "ok"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for one test's report and records: (directory, report path, records path).
fn scratch(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("kvgate-offline-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let (out, records) = (dir.join("report.json"), dir.join("records.jsonl"));
    (dir, out, records)
}

#[test]
fn a_later_window_of_the_trace_replays_from_time_zero() {
    let (dir, out, records) = scratch("skip");
    let whole = Trace::load_with(data("conversation_slice.jsonl"), 512).expect("trace");
    let first_left = &whole.requests[200];
    assert!(
        first_left.timestamp_ms > 0,
        "the window must start later than the trace"
    );
    let args = OfflineArgs {
        skip_requests: 200,
        max_requests: Some(60),
        policies: "round_robin".into(),
        ..small_cli_args(&out, &records)
    };
    let report = run_cli(args.clone()).expect("cli run");
    assert_eq!(report.params.requests, 60);
    let text = std::fs::read_to_string(&records).expect("read records");
    let first: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a record")).expect("record line");
    // The window's first request is sent at once, and it is request 200 of the file.
    assert_eq!(first["index"], 0);
    assert_eq!(first["scheduled_at_s"].as_f64(), Some(0.0));
    assert_eq!(
        first["input_length"].as_u64(),
        Some(u64::from(first_left.input_length))
    );
    let past_the_end = OfflineArgs {
        skip_requests: 300,
        ..args
    };
    let e = run_cli(past_the_end).expect_err("nothing left to replay");
    assert!(e.to_string().contains("no requests"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--spread-ties`: the slice's requests no longer arrive in groups on its ~3 s clock, each stays
/// inside its own tick (at the replay's speed-up), and the report says the ties were spread.
#[test]
fn spread_ties_send_each_tick_s_requests_apart_within_it() {
    let (dir, out, records) = scratch("spread");
    let whole = Trace::load_with(data("conversation_slice.jsonl"), 512).expect("trace");
    let args = OfflineArgs {
        policies: "round_robin".into(),
        spread_ties: Some(TieSpread::Uniform),
        ..small_cli_args(&out, &records)
    };
    let report = run_cli(args).expect("cli run");
    assert_eq!(report.params.spread_ties, Some(TieSpread::Uniform));
    let text = std::fs::read_to_string(&records).expect("read records");
    let mut sent: Vec<(usize, f64)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("record line"))
        .map(|l| {
            let i = l["index"].as_u64().expect("index") as usize;
            (i, l["scheduled_at_s"].as_f64().expect("scheduled"))
        })
        .collect();
    sent.sort_by_key(|&(i, _)| i);
    assert_eq!(sent.len(), 80);
    let ticks = |ts: &mut dyn Iterator<Item = f64>| {
        let mut v: Vec<u64> = ts.map(|s| (s * 1e6) as u64).collect();
        v.dedup();
        v.len()
    };
    let trace_ticks = ticks(&mut whole.requests[..80].iter().map(|r| r.timestamp_ms as f64));
    let sent_ticks = ticks(&mut sent.iter().map(|&(_, s)| s));
    assert!(
        sent_ticks > 2 * trace_ticks,
        "{sent_ticks} send times for {trace_ticks} ticks"
    );
    // Sent exactly as the trace spread with `--synth-seed` (times from the first arrival, at
    // speed-up 2), which keeps each request inside its tick.
    let spread = whole.spread_ties(TieSpread::Uniform, 1);
    let start = spread.requests[0].timestamp_ms;
    for (i, s) in sent {
        let want = (spread.requests[i].timestamp_ms - start) as f64 / 2000.0;
        assert!(
            (s - want).abs() < 1e-6,
            "request {i} sent at {s}, spread to {want}"
        );
        let (t, spread_t) = (
            whole.requests[i].timestamp_ms,
            spread.requests[i].timestamp_ms,
        );
        let next = whole.requests[i..]
            .iter()
            .map(|r| r.timestamp_ms)
            .find(|&x| x > t);
        assert!(
            spread_t >= t && next.is_none_or(|n| spread_t < n),
            "request {i}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn requests_are_decided_after_their_ingest_time_in_that_order() {
    let (dir, out, records) = scratch("ingest");
    // 20 ms per 1,000 prompt tokens: long prompts are decided after short ones sent just after.
    let per_ktoken = 20_000.0;
    let args = OfflineArgs {
        policies: "round_robin".into(),
        ingest_us_per_ktoken: per_ktoken,
        ..small_cli_args(&out, &records)
    };
    let engines = args.engines;
    let report = run_cli(args).expect("cli run");
    assert_eq!(report.params.ingest_us_per_ktoken, per_ktoken);
    let text = std::fs::read_to_string(&records).expect("read records");
    let mut reqs: Vec<(usize, u64, usize, f64)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("record line"))
        .map(|l| {
            let tokens = l["prompt_tokens"].as_u64().expect("prompt tokens");
            let at_us = (l["scheduled_at_s"].as_f64().expect("scheduled") * 1e6).round() as u64;
            let decided = at_us + (tokens as f64 * per_ktoken / 1000.0) as u64;
            let instance: usize = l["instance"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("instance");
            let ttft = l["ttft_s"].as_f64().expect("ttft");
            // Its time to first token counts from its arrival, the ingest included.
            assert!(ttft * 1e6 >= (decided - at_us) as f64, "{l}");
            (
                l["index"].as_u64().expect("index") as usize,
                decided,
                instance,
                ttft,
            )
        })
        .collect();
    assert_eq!(reqs.len(), 80);
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let args = OfflineArgs {
            ingest_us_per_ktoken: bad,
            ..small_cli_args(&out, &records)
        };
        assert!(run_cli(args).is_err(), "{bad} accepted");
    }
    // The rotation took them in the order of their decision times, not of their arrivals.
    reqs.sort_by_key(|&(i, decided, _, _)| (decided, i));
    let reordered = reqs.windows(2).filter(|w| w[0].0 > w[1].0).count();
    assert!(reordered > 0, "the ingest time moved no request");
    for (rank, &(i, _, instance, _)) in reqs.iter().enumerate() {
        assert_eq!(instance, rank % engines, "request {i}, decided {rank}th");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_overrides_and_policies_are_errors() {
    use kvgate_loadtest::offline::policies::{apply_overrides, resolve_policies};
    assert!(resolve_policies("kvgate,nope").is_err());
    assert!(resolve_policies("").is_err());
    assert!(resolve_policies("all").expect("all").len() >= 8);
    assert!(apply_overrides(&["nosuchsection.x=1".into()]).is_err());
    assert!(apply_overrides(&["novalue".into()]).is_err());
}
