//! `synth`, `trace-stats`, `size`: offline helpers around traces; `mirror`: a live run against
//! offline draws.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kvgate_loadtest::sizing::{self, FleetShape};
use kvgate_loadtest::synth::Workload;
use kvgate_sim::{EngineOverrides, FleetConfig, FleetMix};

use super::common::{synth_workload, WorkloadArgs};

/// Flags of `synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Workload: system-prompt, chat, agent, rag, long, mix.
    #[arg(long, default_value = "mix")]
    pub workload: String,
    /// JSON file with the workload and its parameters (overrides --workload), e.g.
    /// `{"kind":"chat","conversations":100,"turns":8}`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per block.
    #[arg(long, default_value_t = 512)]
    pub block_tokens: u32,
    /// Output JSONL file.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let w: Workload = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?
        }
        None => synth_workload(&a.workload)?,
    };
    let t = w.generate(a.seed, a.block_tokens)?;
    t.save(&a.out)?;
    let s = t.stats();
    eprintln!(
        "wrote {} requests over {:.0} s to {} (infinite-cache hit bound {:.1} % of tokens)",
        s.requests,
        s.duration_s,
        a.out.display(),
        s.infinite_hit_ratio_tokens * 100.0
    );
    Ok(())
}

/// Flags of `trace-stats`.
#[derive(Debug, Args)]
pub struct TraceStatsArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

pub fn trace_stats(a: TraceStatsArgs) -> anyhow::Result<()> {
    let t = a.workload.load()?;
    println!("{}", serde_json::to_string_pretty(&t.stats())?);
    let ws = sizing::working_set(&t);
    println!("{}", serde_json::to_string_pretty(&ws)?);
    Ok(())
}

/// Flags of `size`.
#[derive(Debug, Args)]
pub struct SizeArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Engines.
    #[arg(long, default_value_t = 8)]
    pub engines: usize,
    /// Engine model/GPU class (simulator preset).
    #[arg(long, default_value = "llama3-8b-h100")]
    pub preset: String,
    /// Engines of several classes instead of --engines/--preset, in instance order, e.g.
    /// `llama3-8b-h100:4,llama3-8b-a100-40gb:4`.
    #[arg(long, value_name = "PRESET:COUNT,...", conflicts_with_all = ["engines", "preset"])]
    pub fleet: Option<FleetMix>,
    /// GPU KV memory per engine, GiB (each class's capacity from its own geometry).
    #[arg(long)]
    pub kv_memory_gib: Option<f64>,
    /// GPU KV blocks per engine (overrides memory).
    #[arg(long)]
    pub gpu_blocks: Option<u32>,
    /// CPU-offload blocks per engine.
    #[arg(long)]
    pub cpu_blocks: Option<u32>,
    /// Also compute the no-queue TTFT and E2E floors (engine model; slower).
    #[arg(long)]
    pub floor: bool,
}

pub fn size(a: SizeArgs) -> anyhow::Result<()> {
    let t = a.workload.load()?;
    let shape = FleetShape::from_config(&FleetConfig {
        engines: a.engines,
        preset: a.preset.clone(),
        fleet: a.fleet.clone(),
        engine: EngineOverrides {
            kv_memory_gib: a.kv_memory_gib,
            num_gpu_blocks: a.gpu_blocks,
            num_cpu_blocks: a.cpu_blocks,
            ..Default::default()
        },
        ..FleetConfig::default()
    })?;
    let r = sizing::size(&t, &shape, a.floor)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    let gib = |tokens: u64, bytes_per_token: u64| {
        tokens as f64 * bytes_per_token as f64 / f64::from(1u32 << 30)
    };
    let per_engine = r
        .classes
        .iter()
        .map(|c| {
            format!(
                "{} × {}: {:.2} M tokens of KV per engine ({:.1} GiB)",
                c.engines,
                c.preset,
                c.engine_capacity_tokens as f64 / 1e6,
                gib(c.engine_capacity_tokens, c.bytes_per_token)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    eprintln!(
        "\n{per_engine}; fleet {:.1} M; working set {:.1} M tokens.\n\
         hit ratio: one engine-sized LRU {:.1} %, fleet-sized LRU {:.1} %, infinite cache {:.1} %.\n\
         suggestion: {} GPU blocks per engine ({:.2} M tokens, {:.1} GiB) → fleet-sized LRU {:.1} %{}",
        r.fleet_capacity_tokens as f64 / 1e6,
        r.working_set.distinct_tokens as f64 / 1e6,
        r.single_engine_lru_hit_ratio * 100.0,
        r.fleet_lru_hit_ratio * 100.0,
        r.infinite_hit_ratio * 100.0,
        r.suggestion.gpu_blocks,
        r.suggestion.gpu_tokens as f64 / 1e6,
        r.suggestion.kv_memory_gib,
        r.suggestion.fleet_lru_hit_ratio * 100.0,
        if r.one_engine_holds_working_set {
            "\nwarning: one engine holds the whole working set; routing for cache hits hardly matters"
        } else {
            ""
        }
    );
    if let (Some(t), Some(e)) = (&r.ttft_floor_s, &r.e2e_floor_s) {
        eprintln!(
            "no-queue floors (each request alone on an idle engine with the infinite cache's hit): TTFT mean {:.3} s p99 {:.3} s, E2E mean {:.3} s p99 {:.3} s",
            t.mean, t.p99, e.mean, e.p99
        );
    }
    Ok(())
}

/// Flags of `mirror`.
#[derive(Debug, Args)]
pub struct MirrorArgs {
    /// `results.json` of a live `compare` run.
    #[arg(long)]
    pub live: PathBuf,
    /// JSON reports of `offline` runs of the same slice (`--json`), one per draw (e.g. with
    /// `--warm-up-requests 1 --shuffle-simultaneous` and several `--seed`s); repeatable.
    #[arg(long, required = true)]
    pub offline: Vec<PathBuf>,
    /// Relative margin around the draws' range for mean TTFT and E2E.
    #[arg(long, default_value_t = kvgate_loadtest::report::mirror::Tolerance::default().relative)]
    pub tolerance: f64,
    /// Margin around the draws' range for the hit ratio, points.
    #[arg(long, default_value_t = kvgate_loadtest::report::mirror::Tolerance::default().hit_points)]
    pub hit_points: f64,
}

pub fn mirror(a: MirrorArgs) -> anyhow::Result<()> {
    use kvgate_loadtest::report::mirror;
    let read = |p: &PathBuf| -> anyhow::Result<Vec<u8>> {
        std::fs::read(p).with_context(|| format!("reading {}", p.display()))
    };
    let live: serde_json::Value = serde_json::from_slice(&read(&a.live)?)
        .with_context(|| format!("parsing {}", a.live.display()))?;
    let offline = a
        .offline
        .iter()
        .map(|p| {
            serde_json::from_slice(&read(p)?).with_context(|| format!("parsing {}", p.display()))
        })
        .collect::<anyhow::Result<Vec<kvgate_loadtest::offline::OfflineReport>>>()?;
    anyhow::ensure!(
        a.tolerance.is_finite()
            && a.tolerance >= 0.0
            && a.hit_points.is_finite()
            && a.hit_points >= 0.0,
        "--tolerance and --hit-points must be finite and not negative"
    );
    let tol = mirror::Tolerance {
        relative: a.tolerance,
        hit_points: a.hit_points,
    };
    let rows = mirror::compare(&live, &offline, tol)?;
    print!("{}", mirror::markdown(&rows));
    Ok(())
}
