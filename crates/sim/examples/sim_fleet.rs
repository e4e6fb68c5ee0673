//! Runs a simulated fleet from the command line (the same flags as `kvgate sim`):
//! `cargo run -p kvgate-sim --example sim_fleet -- --engines 4 --time-scale 10`.

use clap::Parser;
use kvgate_sim::{SimArgs, SimError};

#[derive(Parser)]
#[command(about = "kvgate engine simulator fleet")]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[tokio::main]
async fn main() -> Result<(), SimError> {
    kvgate_sim::cli::run(Cli::parse().sim).await
}
