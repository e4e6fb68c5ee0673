//! `kvgate sim`: run a simulated fleet until Ctrl-C, printing its instances as JSON.

use std::path::PathBuf;

use clap::Args;

use crate::error::SimError;
use crate::fleet::{Fleet, FleetConfig};
use crate::fleet_mix::FleetMix;
use crate::kv_events::EventEncoding;
use crate::server::Flavour;

/// Command-line flags of the simulator. Unset flags keep [`FleetConfig`]'s defaults.
#[derive(Args, Clone, Debug, Default)]
pub struct SimArgs {
    /// JSON file with a full FleetConfig; flags given on the command line override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Number of engines.
    #[arg(long)]
    pub engines: Option<usize>,
    /// First HTTP port (0 = OS-chosen ports).
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Model/GPU class: llama3-8b-h100, llama3-8b-a100-40gb, qwen-32b-h200, llama3-70b-4xh100,
    /// tiny-cpu.
    #[arg(long)]
    pub preset: Option<String>,
    /// Engines of several classes instead of --engines/--preset, in engine order, e.g.
    /// `llama3-8b-h100:4,llama3-8b-a100-40gb:4` (a group without `:COUNT` is one engine).
    #[arg(long, value_name = "PRESET:COUNT,...", conflicts_with_all = ["engines", "preset"])]
    pub fleet: Option<FleetMix>,
    /// Served model name.
    #[arg(long)]
    pub model: Option<String>,
    /// Metric names and error shapes of vllm or sglang.
    #[arg(long, value_enum)]
    pub flavour: Option<Flavour>,
    /// Divides every duration (10 = ten times faster than real).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Do not publish KV events.
    #[arg(long)]
    pub no_kv_events: bool,
    /// KV event encoding.
    #[arg(long, value_enum)]
    pub event_encoding: Option<EventEncoding>,
    /// First KV-event port (replay ports follow after all event ports; 0 = OS-chosen).
    #[arg(long)]
    pub event_base_port: Option<u16>,
    /// vLLM-style event endpoint (e.g. tcp://*:5557; engine i uses port + i).
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// Tokens per KV block.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// GPU KV blocks per engine (overrides the preset's geometry).
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// KV memory per engine in GiB (capacity from the preset's geometry).
    #[arg(long)]
    pub kv_memory_gib: Option<f64>,
    /// CPU offload blocks per engine.
    #[arg(long)]
    pub num_cpu_blocks: Option<u32>,
    /// Maximum running sequences per engine.
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Token budget of one step (chunked prefill).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// Seed of generated text.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Model directory with tokenizer.json (+ chat_template.jinja); default: built-in tokenizer.
    #[arg(long)]
    pub tokenizer_dir: Option<PathBuf>,
    /// Fault: every step this many times slower.
    #[arg(long)]
    pub slow_factor: Option<f64>,
    /// Fault: probability of a 500 per request.
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// Fault: answer every request with a 500.
    #[arg(long)]
    pub always_5xx: bool,
    /// Fault: probability of dropping a connection after the first token.
    #[arg(long)]
    pub drop_rate: Option<f64>,
    /// Fault: publish no KV events.
    #[arg(long)]
    pub stop_events: bool,
}

impl SimArgs {
    /// The fleet configuration these flags describe.
    pub fn to_config(&self) -> Result<FleetConfig, SimError> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)?;
                serde_json::from_str(&text)
                    .map_err(|e| SimError::Config(format!("{}: {e}", path.display())))?
            }
            None => FleetConfig::default(),
        };
        macro_rules! set {
            ($flag:expr, $field:expr) => {
                if let Some(v) = $flag.clone() {
                    $field = v;
                }
            };
        }
        // Flags override the file: --engines or --preset replace a fleet it describes.
        if self.engines.is_some() || self.preset.is_some() {
            c.fleet = None;
        }
        set!(self.engines, c.engines);
        set!(self.base_port, c.base_port);
        set!(self.preset, c.preset);
        if self.fleet.is_some() {
            c.fleet = self.fleet.clone();
        }
        set!(self.model, c.model);
        set!(self.flavour, c.flavour);
        set!(self.time_scale, c.time_scale);
        set!(self.event_encoding, c.event_encoding);
        set!(self.event_base_port, c.event_base_port);
        set!(self.seed, c.seed);
        set!(self.slow_factor, c.faults.slow_factor);
        set!(self.error_rate, c.faults.error_rate);
        set!(self.drop_rate, c.faults.drop_rate);
        if self.no_kv_events {
            c.kv_events = false;
        }
        if self.kv_events_endpoint.is_some() {
            c.kv_events_endpoint = self.kv_events_endpoint.clone();
        }
        if self.tokenizer_dir.is_some() {
            c.tokenizer_dir = self.tokenizer_dir.clone();
        }
        if self.always_5xx {
            c.faults.always_5xx = true;
        }
        if self.stop_events {
            c.faults.stop_events = true;
        }
        let o = &mut c.engine;
        o.block_size = self.block_size.or(o.block_size);
        o.num_gpu_blocks = self.num_gpu_blocks.or(o.num_gpu_blocks);
        o.kv_memory_gib = self.kv_memory_gib.or(o.kv_memory_gib);
        o.num_cpu_blocks = self.num_cpu_blocks.or(o.num_cpu_blocks);
        o.max_num_seqs = self.max_num_seqs.or(o.max_num_seqs);
        o.max_num_batched_tokens = self.max_num_batched_tokens.or(o.max_num_batched_tokens);
        c.validate()?;
        Ok(c)
    }
}

/// Runs the fleet until Ctrl-C. Prints one JSON line: the list of instances.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    let cfg = args.to_config()?;
    let params = cfg.engine_params()?;
    let fleet = Fleet::start(cfg.clone()).await?;
    let instances = fleet.instances();
    let list = serde_json::to_string(&instances).map_err(|e| SimError::Config(e.to_string()))?;
    println!("{list}");
    let gpu_blocks: Vec<u64> = instances.iter().map(|i| i.capacity_blocks).collect();
    tracing::info!(
        engines = cfg.engine_count(),
        fleet = %cfg.describe(),
        block_size = params.block_size,
        gpu_blocks = ?gpu_blocks,
        time_scale = cfg.time_scale,
        "simulated fleet running; Ctrl-C to stop"
    );
    let _ = tokio::signal::ctrl_c().await;
    fleet.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn flags_map_onto_the_config() {
        let cli = Cli::parse_from([
            "x",
            "--engines",
            "3",
            "--preset",
            "tiny-cpu",
            "--time-scale",
            "10",
            "--flavour",
            "sglang",
            "--event-encoding",
            "legacy",
            "--num-gpu-blocks",
            "99",
            "--slow-factor",
            "2",
        ]);
        let c = cli.sim.to_config().unwrap();
        assert_eq!(c.engines, 3);
        assert_eq!(c.flavour, Flavour::Sglang);
        assert_eq!(c.event_encoding, EventEncoding::Legacy);
        assert_eq!(c.engine_params().unwrap().num_gpu_blocks, 99);
        assert_eq!(c.faults.slow_factor, 2.0);
        let bad = Cli::parse_from(["x", "--time-scale", "0"]);
        assert!(bad.sim.to_config().is_err());
    }

    #[test]
    fn fleet_flag_describes_mixed_engines() {
        let cli = Cli::parse_from([
            "x",
            "--fleet",
            "llama3-8b-h100:2,llama3-8b-a100-40gb:2",
            "--num-cpu-blocks",
            "64",
        ]);
        let c = cli.sim.to_config().unwrap();
        assert_eq!(c.engine_count(), 4);
        let p = c.per_engine_params().unwrap();
        assert_eq!(p[1].1.num_gpu_blocks, 24_576);
        assert_eq!(p[3].1.num_gpu_blocks, 8_192);
        assert!(p.iter().all(|(_, p)| p.num_cpu_blocks == 64));
        // Clear messages for bad strings, and no mixing with --engines / --preset.
        let e = Cli::try_parse_from(["x", "--fleet", "llama3-8b-h100:four"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("bad engine count \"four\" for llama3-8b-h100"),
            "{e}"
        );
        let e = Cli::try_parse_from(["x", "--fleet", "gpu:4"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("unknown preset \"gpu\""), "{e}");
        assert!(Cli::try_parse_from(["x", "--fleet", "tiny-cpu:2", "--engines", "2"]).is_err());
        assert!(
            Cli::try_parse_from(["x", "--fleet", "tiny-cpu:2", "--preset", "tiny-cpu"]).is_err()
        );
    }
}
