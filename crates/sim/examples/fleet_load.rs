//! Measures the simulator's own cost: starts `sim_fleet` as a child process (16 engines at
//! time-scale 10 by default), drives a bounded synthetic load against it from this process, and
//! reports the child's CPU time per simulated request (from /proc, so the load generator's CPU
//! is not counted), its peak memory, and the engines' own counters.
//!
//! `cargo build --release -p kvgate-sim --examples && target/release/examples/fleet_load`

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

#[derive(Parser)]
struct Args {
    /// Engines in the fleet.
    #[arg(long, default_value_t = 16)]
    engines: usize,
    /// Time scale of the fleet.
    #[arg(long, default_value_t = 10.0)]
    time_scale: f64,
    /// Requests to send.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Arrival rate (requests per wall-clock second).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Shared-prefix groups.
    #[arg(long, default_value_t = 64)]
    groups: usize,
    /// Words of each group's shared prefix (~1 token per word).
    #[arg(long, default_value_t = 1200)]
    prefix_words: usize,
    /// Words of each request's own suffix.
    #[arg(long, default_value_t = 400)]
    suffix_words: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 64)]
    output: u32,
    /// KV memory per engine in GiB (small forces evictions).
    #[arg(long, default_value_t = 4.0)]
    kv_memory_gib: f64,
}

fn proc_cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" of the command name: utime is the 12th, stime the 13th.
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ is 100 on Linux
}

fn proc_mem_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let exe = std::env::current_exe().expect("current exe");
    let sim = exe.with_file_name("sim_fleet");
    let mut child = tokio::process::Command::new(&sim)
        .args([
            "--engines",
            &a.engines.to_string(),
            "--time-scale",
            &a.time_scale.to_string(),
        ])
        .args([
            "--preset",
            "llama3-8b-h100",
            "--kv-memory-gib",
            &a.kv_memory_gib.to_string(),
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sim_fleet (build it with --examples)");
    let pid = child.id().expect("child pid");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines
        .next_line()
        .await
        .expect("read")
        .expect("instance list");
    let instances: Vec<Value> = serde_json::from_str(&first).expect("instances json");
    let urls: Vec<String> = instances
        .iter()
        .map(|i| i["url"].as_str().unwrap_or_default().to_string())
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut rng = SmallRng::seed_from_u64(7);
    let prefixes: Vec<String> = (0..a.groups)
        .map(|g| {
            (0..a.prefix_words)
                .map(|w| format!("g{g}w{} ", w % 97))
                .collect()
        })
        .collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("client");
    let sem = Arc::new(Semaphore::new(2048));
    let cpu0 = proc_cpu_secs(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(a.requests);
    let gap = Duration::from_secs_f64(1.0 / a.rate);
    for i in 0..a.requests {
        let g = rng.gen_range(0..a.groups);
        let suffix: String = (0..a.suffix_words).map(|w| format!("r{i}x{w} ")).collect();
        let body = json!({"messages": [{"role": "system", "content": prefixes[g]}, {"role": "user", "content": suffix}],
                          "max_tokens": a.output, "stream": true, "stream_options": {"include_usage": true}});
        let url = format!("{}/v1/chat/completions", urls[i % urls.len()]);
        let c = client.clone();
        let permit = sem.clone().acquire_owned().await.expect("semaphore");
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            match c.post(url).json(&body).send().await {
                Ok(r) if r.status().is_success() => r
                    .text()
                    .await
                    .map(|t| t.contains("[DONE]"))
                    .unwrap_or(false),
                _ => false,
            }
        }));
        let next = t0 + gap * (i as u32 + 1);
        tokio::time::sleep_until(next.into()).await;
    }
    let mut ok = 0usize;
    for t in tasks {
        if t.await.unwrap_or(false) {
            ok += 1;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = proc_cpu_secs(pid) - cpu0;
    let (mut q, mut h, mut busy, mut evict) = (0u64, 0u64, 0u64, 0u64);
    for u in &urls {
        if let Ok(r) = client.get(format!("{u}/admin/stats")).send().await {
            if let Ok(v) = r.json::<Value>().await {
                q += v["stats"]["prefix_cache_queries"].as_u64().unwrap_or(0);
                h += v["stats"]["prefix_cache_hits"].as_u64().unwrap_or(0);
                busy += v["stats"]["busy_us"].as_u64().unwrap_or(0);
                evict += v["stats"]["evictions"].as_u64().unwrap_or(0);
            }
        }
    }
    let util = busy as f64 / 1e6 / (wall * a.time_scale * a.engines as f64);
    println!(
        "{}",
        json!({
            "engines": a.engines, "time_scale": a.time_scale, "requests": a.requests, "ok": ok,
            "wall_s": wall, "sim_cpu_s": cpu, "sim_cores": cpu / wall,
            "sim_cpu_ms_per_request": cpu * 1000.0 / a.requests as f64,
            "sim_rss_kib": proc_mem_kib(pid, "VmRSS:"), "sim_peak_rss_kib": proc_mem_kib(pid, "VmHWM:"),
            "hit_ratio": if q > 0 { h as f64 / q as f64 } else { 0.0 }, "evictions": evict,
            "mean_engine_utilisation": util,
        })
    );
    let _ = child.kill().await;
}
