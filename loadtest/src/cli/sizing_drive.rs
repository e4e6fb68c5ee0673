//! `sizing-drive` and `sizing-report`: the gateway sizing table (`loadtest/sizing.sh`).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kvgate_loadtest::gateway_sizing::drive::{self, DriveConfig};
use kvgate_loadtest::gateway_sizing::{table, CellRecord, HashKind, Kind};

/// Flags of `sizing-drive`.
#[derive(Debug, Args)]
pub struct DriveArgs {
    /// Gateway base URL.
    #[arg(long)]
    pub url: String,
    /// Gateway process id (its CPU time and memory are read from /proc).
    #[arg(long)]
    pub pid: u32,
    /// Backend process ids, comma-separated (their CPU is reported beside the gateway's).
    #[arg(long, value_delimiter = ',')]
    pub backend_pids: Vec<u32>,
    /// Hash mode the gateway runs (decides the fill's bodies).
    #[arg(long, value_enum)]
    pub mode: HashKind,
    /// The gateway's server.threads (recorded with each cell).
    #[arg(long)]
    pub threads: usize,
    /// Placement index entries to fill to before measuring (0: none).
    #[arg(long, default_value_t = 1_000_000)]
    pub index_entries: u64,
    /// Longest the fill may take, seconds.
    #[arg(long, default_value_t = 300.0)]
    pub fill_timeout_s: f64,
    /// No-traffic time measured after the fill, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub idle_s: f64,
    /// Mean prompt lengths, content tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,8192,32768,102400")]
    pub lengths: Vec<u32>,
    /// Kinds of traffic, comma-separated: unique, multi.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "unique,multi"
    )]
    pub kinds: Vec<Kind>,
    /// Requests per second of each window.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Gateway cores a cell may use; a cell that would need more at --rate runs slower.
    #[arg(long, default_value_t = 0.8)]
    pub budget_cores: f64,
    /// Unmeasured seconds at the cell's rate before its window.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// Measured seconds per cell.
    #[arg(long, default_value_t = 6.0)]
    pub duration_s: f64,
    /// Conversations at once in multi-turn cells.
    #[arg(long, default_value_t = 64)]
    pub conversations: usize,
    /// Model name sent.
    #[arg(long, default_value = "m")]
    pub model: String,
    /// max_tokens sent.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Seed of the prompt text.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// JSON-lines file the cells are appended to.
    #[arg(long)]
    pub out: PathBuf,
}

fn secs(s: f64, flag: &str) -> anyhow::Result<Duration> {
    anyhow::ensure!(s.is_finite() && s >= 0.0, "--{flag} must be >= 0, got {s}");
    Ok(Duration::from_secs_f64(s))
}

pub async fn drive(a: DriveArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.rate.is_finite() && a.rate > 0.0,
        "--rate must be > 0, got {}",
        a.rate
    );
    anyhow::ensure!(
        a.budget_cores.is_finite() && a.budget_cores > 0.0,
        "--budget-cores must be > 0"
    );
    anyhow::ensure!(a.lengths.iter().all(|&l| l > 0), "--lengths must be > 0");
    let cfg = DriveConfig {
        url: a.url.trim_end_matches('/').to_string(),
        pid: a.pid,
        backend_pids: a.backend_pids,
        mode: a.mode,
        threads: a.threads,
        index_entries: a.index_entries,
        fill_timeout: secs(a.fill_timeout_s, "fill-timeout-s")?,
        idle: secs(a.idle_s, "idle-s")?,
        lengths: a.lengths,
        kinds: a.kinds,
        rate: a.rate,
        budget_cores: a.budget_cores,
        warmup: secs(a.warmup_s, "warmup-s")?,
        duration: secs(a.duration_s, "duration-s")?,
        conversations: a.conversations.max(1),
        model: a.model,
        max_tokens: a.max_tokens,
        seed: a.seed,
    };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.out)
        .with_context(|| format!("{}", a.out.display()))?;
    let mut write_err = None;
    drive::run(&cfg, |c| {
        eprintln!(
            "  {} {} idx {} thr {}: {:.0} req/s, {} requests, {} errors, {:.3} cores/100 req/s, \
             {:.3} ms CPU/req, p50 {:.2} ms p99 {:.2} ms, RSS {:.0} MiB",
            c.mode.as_str(),
            format_args!("{} {}", table::tokens_label(c.tokens), c.kind.as_str()),
            table::count_label(c.index_target),
            c.threads,
            c.rate,
            c.requests,
            c.errors,
            c.cores_per_100,
            c.cpu_ms_per_request,
            c.p50_ms,
            c.p99_ms,
            c.rss_mib
        );
        let line = serde_json::to_string(c).map_err(anyhow::Error::from);
        if let Err(e) = line.and_then(|l| writeln!(out, "{l}").map_err(anyhow::Error::from)) {
            write_err.get_or_insert(e);
        }
    })
    .await?;
    match write_err {
        Some(e) => Err(e.context(format!("writing {}", a.out.display()))),
        None => Ok(()),
    }
}

/// Flags of `sizing-report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// JSON-lines file of cells written by sizing-drive.
    #[arg(long)]
    pub cells: PathBuf,
    /// Directory for summary.md, cells.md, cells.csv and cells.json.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Goal: the 100K-token multi-turn token-mode cells under this many cores at 100 req/s.
    #[arg(long, default_value_t = 0.5)]
    pub goal_cores: f64,
}

pub fn report(a: ReportArgs) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&a.cells).with_context(|| format!("{}", a.cells.display()))?;
    let cells: Vec<CellRecord> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{} line {}", a.cells.display(), i + 1))
        })
        .collect::<anyhow::Result<_>>()?;
    std::fs::create_dir_all(&a.out_dir).with_context(|| format!("{}", a.out_dir.display()))?;
    let mut summary = table::summary_markdown(&cells);
    let mut goal = String::new();
    for th in [1usize, 2] {
        for c in table::find(&cells, HashKind::Token, Kind::MultiTurn, 102_400, th) {
            let met = c.errors == 0 && c.rate >= 100.0 && c.cores_per_100 < a.goal_cores;
            goal.push_str(&format!(
                "- 100K multi-turn, token mode, index {}, {} thread(s): {:.0} req/s, {:.3} cores \
                 ({:.2} ms CPU per request), {} errors: {}\n",
                table::count_label(c.index_target),
                c.threads,
                c.rate,
                c.cores_per_100,
                c.cpu_ms_per_request,
                c.errors,
                if met {
                    format!("under {} cores, met", a.goal_cores)
                } else {
                    format!("not under {} cores at 100 req/s, not met", a.goal_cores)
                }
            ));
        }
    }
    if !goal.is_empty() {
        summary.push('\n');
        summary.push_str(&goal);
    }
    let write = |name: &str, body: &str| {
        let p = a.out_dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("{}", p.display()))
    };
    write("summary.md", &summary)?;
    write("cells.md", &table::cells_markdown(&cells))?;
    write("cells.csv", &table::cells_csv(&cells))?;
    write("cells.json", &serde_json::to_string_pretty(&cells)?)?;
    println!("{summary}");
    Ok(())
}
