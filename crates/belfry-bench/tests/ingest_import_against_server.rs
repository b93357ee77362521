//! `belfry bench ingest --via both` against a real belfry server (the server crate in this
//! process, with the in-memory store): the batch submit's and the import's counts are checked
//! against the server's own, and an import the server stops part way fails the run with the
//! server's error instead of reporting a rate. No timing assertions.

mod common;

use belfry_bench::BenchCommand;
use belfry_server::ServerConfig;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

const TASKS: u64 = 2_500;

fn ingest_args(url: &str, queue: &str, via: &str) -> belfry_bench::ingest::IngestArgs {
    let tasks = TASKS.to_string();
    let cli = Cli::try_parse_from([
        "bench",
        "ingest",
        "--url",
        url,
        "--queue",
        queue,
        "--tasks",
        &tasks,
        "--batch",
        "100",
        "--via",
        via,
        // 1,100 lines: a request of two full server batches and a part one, and a short
        // last request.
        "--import-lines",
        "1100",
        "--connections",
        "2",
        "--baseline",
        "none",
        "--no-progress",
    ])
    .unwrap();
    let BenchCommand::Ingest(args) = cli.command else {
        panic!("not ingest")
    };
    *args
}

#[test]
fn both_paths_store_every_task_and_the_import_is_quoted_against_the_batch() {
    let runtime = common::runtime();
    let handle = common::start_server(&runtime, ServerConfig::default());
    let url = format!("http://{}", handle.local_addr());
    let report = runtime
        .block_on(belfry_bench::ingest::run(ingest_args(&url, "both", "both")))
        .unwrap();
    let (batch, import) = (&report.data["belfry"], &report.data["belfry_import"]);
    assert_eq!(batch["accepted"], TASKS, "{batch}");
    assert_eq!(import["accepted"], TASKS, "{import}");
    assert_eq!(import["rejected"], 0);
    // 2,500 lines in requests of 1,100: three imports.
    assert_eq!(import["requests"], 3);
    assert!(report.data["import_over_batch"].as_f64().unwrap() > 0.0);
    // One server, one queue: it holds both runs' tasks.
    let queue = runtime.block_on(common::queue_on_server(handle.local_addr(), "both"));
    assert_eq!(queue["pending"], 2 * TASKS, "{queue}");
    let text = report.render_text();
    assert!(text.contains("belfry, tasks:import") && text.contains("tasks:import ÷ tasks:batch"));
}

#[test]
fn an_import_stopped_part_way_fails_the_run_with_the_servers_error() {
    let runtime = common::runtime();
    // Less than a request of 1,100 lines (about 270 kB): the server refuses it as too large
    // from its declared length.
    let config = ServerConfig {
        import_body_bytes_max: 100_000,
        ..ServerConfig::default()
    };
    let handle = common::start_server(&runtime, config);
    let url = format!("http://{}", handle.local_addr());
    let err = runtime
        .block_on(belfry_bench::ingest::run(ingest_args(
            &url, "cut", "import",
        )))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("belfry, tasks:import") && err.contains("payload_too_large"),
        "{err}"
    );
}
