//! `kvgate-loadtest`: trace replay, synthetic workloads, router comparisons, sizing, offline
//! simulation. Parses flags and dispatches; the work lives in the library.

mod cli;

use clap::Parser;

// The simulators (offline and the in-process fleets) make many small short-lived allocations per
// engine step and per KV event; mimalloc is markedly faster at them than the system allocator.
#[global_allocator]
static GLOBAL: kvgate::alloc::MiMalloc = kvgate::alloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::run(args)
}
