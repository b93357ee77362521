//! Stand-alone entry point of the load generator, for runs before it is wired into the
//! `belfry` binary as `belfry bench`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "belfry-bench",
    about = "Load generator for a belfry server, with baselines"
)]
struct Cli {
    #[command(subcommand)]
    command: belfry_bench::BenchCommand,
}

fn main() -> anyhow::Result<()> {
    belfry_bench::run(Cli::parse().command)
}
