//! `belfry bench pending --point-ops` against a real belfry server (the server crate in this
//! process, on its own runtime, with the in-memory store): the bench's counts are checked
//! against the server's own. A cancel the bench counts but the server did not apply, or two
//! phases on the same task, shows up as a wrong pending count, an error (a reschedule of a
//! cancelled task answers 409) or a read-back mismatch. No timing assertions.

mod common;

use belfry_bench::BenchCommand;
use belfry_server::ServerConfig;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

const TASKS: u64 = 3_000;
const POINT_OPS: u64 = 1_000;

fn pending_args(url: &str, queue: &str, point_ops: u64) -> belfry_bench::pending::PendingArgs {
    let (tasks, point_ops) = (TASKS.to_string(), point_ops.to_string());
    let cli = Cli::try_parse_from([
        "bench",
        "pending",
        "--url",
        url,
        "--tasks",
        &tasks,
        "--batch",
        "250",
        "--spread-days",
        "0",
        "--point-ops",
        &point_ops,
        "--point-connections",
        "3",
        "--baseline",
        "none",
        "--queue",
        queue,
        "--no-progress",
    ])
    .unwrap();
    let BenchCommand::Pending(args) = cli.command else {
        panic!("not pending")
    };
    *args
}

#[test]
fn point_ops_touch_distinct_filled_tasks_and_the_server_agrees() {
    let runtime = common::runtime();
    let handle = common::start_server(&runtime, ServerConfig::default());
    let addr = handle.local_addr();
    let url = format!("http://{addr}");
    let queue = "point-ops";

    // More point ops than the fill can give distinct tasks: refused before anything runs.
    let refused = runtime
        .block_on(belfry_bench::pending::run(pending_args(
            &url, "refused", 1_500,
        )))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("--point-ops"), "{refused}");

    let report = runtime
        .block_on(belfry_bench::pending::run(pending_args(
            &url, queue, POINT_OPS,
        )))
        .expect("the scenario runs");
    let ops = &report.data["belfry"]["point_ops"];
    assert_eq!(ops["sampled_ids"], TASKS, "{ops}");
    // No --spawn: no restart, and the report says these are not first touches.
    assert_eq!(ops["after_restart"], false);
    assert!(report.notes.iter().any(|n| n.contains("not first touches")));
    let phases = ops["phases"].as_array().unwrap();
    let expected = [
        ("first_get", 1),
        ("get", POINT_OPS),
        ("cancel", POINT_OPS),
        ("reschedule", 100),
    ];
    assert_eq!(phases.len(), expected.len());
    for (phase, (op, count)) in phases.iter().zip(expected) {
        assert_eq!(phase["op"], op, "{phase}");
        assert_eq!(phase["ops"], count, "{phase}");
        assert_eq!(phase["errors"], 0, "{phase}");
        assert_eq!(phase["latency"]["count"], count, "{phase}");
    }
    let v = &ops["verification"];
    assert_eq!(v["cancelled_checked"], 100, "{v}");
    assert_eq!(v["rescheduled_checked"], 100, "{v}");
    assert_eq!(v["mismatches"], 0, "{v}");

    // The server holds every filled task but the cancelled ones (a reschedule keeps its
    // task pending).
    let pending = runtime.block_on(common::queue_on_server(addr, queue))["pending"].clone();
    assert_eq!(pending, TASKS - POINT_OPS);

    // The tables carry the phases beside the fill.
    let text = report.render_text();
    assert!(text.contains("cancels/s by id"), "{text}");
    assert!(text.contains("read-back mismatches"), "{text}");
    runtime.block_on(handle.stop()).expect("clean stop");
}
