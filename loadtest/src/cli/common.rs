//! Flags shared by several subcommands: where the workload comes from, prompts, output.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder, TokenCountError};
use kvgate_loadtest::replay::TenantMix;
use kvgate_loadtest::report::Report;
use kvgate_loadtest::synth::Workload;
use kvgate_loadtest::trace::{TieSpread, Trace};
use kvgate_tokenizer::TokenMode;

/// The workload: a trace file or a synthetic generator.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long, conflicts_with = "synth")]
    pub trace: Option<PathBuf>,
    /// Synthetic workload instead of a trace: system-prompt, chat, agent, rag, long, mix.
    #[arg(long)]
    pub synth: Option<String>,
    /// Seed of the synthetic workload and of the prompt text.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per trace block (the `hash_ids` granularity; 512 for Mooncake traces).
    #[arg(long, default_value_t = 512)]
    pub block_tokens: u32,
    /// Leave out the first N requests; the rest start at time 0 (a later window of a trace).
    #[arg(long, default_value_t = 0)]
    pub skip_requests: usize,
    /// Use only the first N requests (after --skip-requests).
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Use only requests within this many seconds of trace time from the first.
    #[arg(long)]
    pub trace_window_s: Option<f64>,
    /// Spread requests that share a timestamp over the interval to the next distinct timestamp,
    /// in trace order, instead of sending each group at one instant (Mooncake traces keep a
    /// coarse clock: ~3 s ticks in the conversation trace): at uniform offsets drawn from --seed
    /// (`uniform`, the default when the flag is given bare) or at equal intervals (`even`).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "uniform", value_name = "HOW")]
    pub spread_ties: Option<TieSpread>,
}

impl WorkloadArgs {
    /// Loads (or generates) and slices the workload.
    pub fn load(&self) -> anyhow::Result<Trace> {
        let trace = match (&self.trace, &self.synth) {
            (Some(p), _) => Trace::load_with(p, self.block_tokens)
                .with_context(|| format!("loading {}", p.display()))?,
            (None, Some(kind)) => synth_workload(kind)?.generate(self.seed, self.block_tokens)?,
            (None, None) => bail!("give --trace FILE or --synth KIND"),
        };
        let window = match self.trace_window_s {
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => bail!("--trace-window-s must be > 0, got {s}"),
            None => None,
        };
        // Before slicing: a tick's interval is read from the next timestamp in the whole trace.
        let trace = match self.spread_ties {
            Some(how) => trace.spread_ties(how, self.seed),
            None => trace,
        };
        let t = trace
            .skip(self.skip_requests)
            .slice(self.max_requests, window);
        if t.requests.is_empty() {
            bail!(
                "the workload has no requests (after --skip-requests {})",
                self.skip_requests
            );
        }
        Ok(t)
    }
}

/// A named synthetic workload with default parameters.
pub fn synth_workload(kind: &str) -> anyhow::Result<Workload> {
    Ok(Workload::named(kind)?)
}

/// Who sends the requests, and the latency objective they are judged by.
#[derive(Debug, Clone, Args)]
pub struct TenantArgs {
    /// Split the requests between tenants by weight, `NAME:WEIGHT,...` (e.g. `heavy:10,light:1`),
    /// each request carrying its tenant in `--tenant-header`; the report gives each tenant's figures.
    #[arg(long)]
    pub tenants: Option<String>,
    /// With --tenants: send only this tenant's requests (at the same times as in the full mix).
    #[arg(long, requires = "tenants")]
    pub only_tenant: Option<String>,
    /// Header naming the tenant (default: kvgate's `admission.tenant_header`).
    #[arg(long)]
    pub tenant_header: Option<String>,
    /// Time-to-first-token objective for goodput, seconds (in the reported time unit).
    #[arg(long)]
    pub ttft_slo_s: Option<f64>,
}

impl TenantArgs {
    /// The tenant mix, if any, drawn with `seed`.
    pub fn mix(&self, seed: u64) -> anyhow::Result<Option<TenantMix>> {
        let Some(spec) = &self.tenants else {
            return Ok(None);
        };
        let header = self
            .tenant_header
            .clone()
            .unwrap_or_else(|| kvgate::config::AdmissionConfig::default().tenant_header);
        Ok(Some(TenantMix::parse(
            spec,
            header,
            self.only_tenant.clone(),
            seed,
        )?))
    }

    /// The goodput objective, checked.
    pub fn slo(&self) -> anyhow::Result<Option<f64>> {
        match self.ttft_slo_s {
            Some(s) if !(s.is_finite() && s > 0.0) => bail!("--ttft-slo-s must be > 0, got {s}"),
            s => Ok(s),
        }
    }
}

/// Prompt synthesis flags.
#[derive(Debug, Clone, Args)]
pub struct PromptArgs {
    /// API to call.
    #[arg(long, value_enum, default_value = "chat")]
    pub api: ApiKind,
    /// Model directory with tokenizer.json (and chat template) the engines use; default: built-in.
    #[arg(long)]
    pub tokenizer_dir: Option<PathBuf>,
    /// Requests tokenised exactly to measure the prompt-length error.
    #[arg(long, default_value_t = 200)]
    pub verify_tokens: usize,
}

impl PromptArgs {
    /// The prompt builder and its measured token-count error on `trace`.
    pub fn builder(
        &self,
        trace: &Trace,
        seed: u64,
    ) -> anyhow::Result<(PromptBuilder, TokenCountError)> {
        let mode = match &self.tokenizer_dir {
            Some(d) => TokenMode::from_model_dir(d)
                .with_context(|| format!("tokenizer {}", d.display()))?,
            None => TokenMode::builtin().context("built-in tokenizer")?,
        };
        let b = PromptBuilder::new(mode, self.api, trace.block_tokens, seed)?;
        let e = b.measure_error(&trace.requests, self.verify_tokens)?;
        eprintln!(
            "prompts: {} single-token words, template overhead {} tokens; token count vs input_length \
             over {} requests: mean |error| {:.2}, max {}",
            b.pool_size(),
            e.overhead_tokens,
            e.checked,
            e.mean_abs,
            e.max_abs
        );
        Ok((b, e))
    }
}

/// Output flags.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Directory for results.json, report.html and router logs.
    #[arg(long, default_value = "loadtest-results")]
    pub out: PathBuf,
}

impl OutputArgs {
    /// Writes the JSON and HTML files and prints where they are.
    pub fn write(&self, report: &Report) -> anyhow::Result<()> {
        let json = self.out.join("results.json");
        let html = self.out.join("report.html");
        report.write_json(&json)?;
        report.write_html(&html)?;
        eprintln!("results: {}\nreport:  {}", json.display(), html.display());
        Ok(())
    }
}

/// The process's command line, as run.
pub fn command_line() -> Vec<String> {
    std::env::args().collect()
}
