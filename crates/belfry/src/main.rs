//! The `belfry` binary: parses the command line, sets up logging and configuration, and hands
//! over to the server or the API client.

mod cli;
mod commands;
mod config;
mod schedule_cmd;
mod serve;
mod units;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    // The load generator sizes and owns its runtimes (client and baseline servers apart), so it
    // runs outside the one built below.
    if let cli::Command::Bench { command } = cli.command {
        return match belfry_bench::run(command) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
