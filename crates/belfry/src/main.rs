//! The `belfry` binary: parses the command line, sets up logging and configuration, and hands
//! over to the server or the API client.

mod auth_config;
mod cli;
mod commands;
mod config;
mod env_check;
mod resolve;
mod schedule_cmd;
mod serve;
mod show;
mod store_config;
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
                eprintln!("error: {}", commands::causes(&e));
                std::process::ExitCode::FAILURE
            }
        };
    }
    // Before any thread exists: the allocator's arenas are created by the first threads.
    tune_malloc();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if commands::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) if commands::is_answer_no(&e) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", commands::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Keeps the server's memory from tracking its past throughput (glibc only).
///
/// Under load the server allocates large short-lived buffers (a 1,000-task request body and
/// its WAL frame are ~250 KiB each) on many threads, and glibc gives threads up to 8 arenas
/// per core, each keeping the memory it once held. Measured with `malloc_stats()` after
/// filling 10M far-future tasks: 15 arenas held 54 MB of which 1.3 MB was in use, and RSS
/// grew from 37 MiB (1M filled) to 50 MiB (10M) although the live heap did not. One arena
/// per core bounds that retention: 2M filled, RSS 26-27 MiB instead of 47 MiB, at the same
/// server CPU per task (A/B, two rounds). A fixed 128 KiB mmap threshold would bring it to
/// 16 MiB but cost 40% more server CPU per task (every large buffer freshly mapped and
/// faulted in), so the threshold stays glibc's. `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` in
/// the environment win: glibc has applied them already, and then this does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_malloc() {
    let tuned_by_environment = ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    if tuned_by_environment {
        return;
    }
    let arenas = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: mallopt only sets an allocator parameter; it is called before this process
    // starts any other thread, and a rejected value (return 0) leaves glibc's default.
    let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    if set == 0 {
        eprintln!("warning: glibc rejected M_ARENA_MAX={arenas}; using its default");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}
