//! Command-line interface: one subcommand per task.

mod common;
mod compare;
mod replay;
mod sizing_drive;
mod tools;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Load tester for LLM routers: replays traces, compares routers on fresh simulated fleets.
#[derive(Debug, Parser)]
#[command(name = "kvgate-loadtest", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace (or synthetic workload) against one OpenAI-compatible endpoint.
    Replay(replay::ReplayArgs),
    /// Run the same trace against several routers, each on a fresh simulated fleet.
    Compare(compare::CompareArgs),
    /// Generate a synthetic workload in the trace format.
    Synth(tools::SynthArgs),
    /// Summarise a trace (rate, lengths, working set, infinite-cache bound).
    TraceStats(tools::TraceStatsArgs),
    /// Size a simulated fleet against a trace (capacity vs working set, hit-ratio references).
    Size(tools::SizeArgs),
    /// Offline simulation: routing core + engine model in virtual time, no HTTP.
    Offline(kvgate_loadtest::offline::OfflineArgs),
    /// A live `compare` run against offline draws of the same slice: is every figure where the
    /// simulator says it should be?
    Mirror(tools::MirrorArgs),
    /// Gateway sizing against one running kvgate: fill its index, then measure its CPU and
    /// memory per prompt length and kind of traffic at a fixed rate (loadtest/sizing.sh).
    SizingDrive(sizing_drive::DriveArgs),
    /// Tables (Markdown, CSV, JSON) from sizing-drive's cells.
    SizingReport(sizing_drive::ReportArgs),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(a) => runtime()?.block_on(replay::run(a)),
        Command::Compare(a) => runtime()?.block_on(compare::run(a)),
        Command::Synth(a) => tools::synth(a),
        Command::TraceStats(a) => tools::trace_stats(a),
        Command::Size(a) => tools::size(a),
        Command::Offline(a) => {
            // run_cli prints its own summary table and writes the JSON report.
            kvgate_loadtest::offline::run_cli(a).context("offline simulation")?;
            Ok(())
        }
        Command::Mirror(a) => tools::mirror(a),
        Command::SizingDrive(a) => runtime()?.block_on(sizing_drive::drive(a)),
        Command::SizingReport(a) => sizing_drive::report(a),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
