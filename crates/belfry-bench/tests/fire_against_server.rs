//! `belfry bench fire` against a real belfry server (the server crate in this process, on its
//! own runtime, with the in-memory store) whose keep-alive timeout is shorter than the run's
//! lead: every ack connection the bench opened at the start has been closed by the server when
//! the first batch is acked. The bench must replace such a connection instead of losing the
//! batch (which would leave those tasks leased until their visibility timeout). Its counts are
//! checked against the server's own. No timing assertions.

mod common;

use belfry_bench::BenchCommand;
use belfry_server::ServerConfig;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

const TASKS: u64 = 400;
const QUEUE: &str = "fire-idle-acks";
/// The server's keep-alive timeout; the run's lead (1 s) is several times longer.
const IDLE_TIMEOUT_MS: u64 = 200;

fn fire_args(url: &str) -> belfry_bench::fire::FireArgs {
    let tasks = TASKS.to_string();
    let cli = Cli::try_parse_from([
        "bench",
        "fire",
        "--url",
        url,
        "--queue",
        QUEUE,
        "--tasks",
        &tasks,
        "--window-s",
        "0",
        "--lead-s",
        "1",
        "--batch",
        "100",
        "--connections",
        "2",
        "--consumers",
        "2",
        "--ack-connections",
        "3",
        "--lease-max",
        "50",
        "--wait-ms",
        "100",
        "--visibility-ms",
        "60000",
        "--grace-s",
        "20",
        "--baseline",
        "none",
        "--no-progress",
    ])
    .unwrap();
    let BenchCommand::Fire(args) = cli.command else {
        panic!("not fire")
    };
    *args
}

#[test]
fn acks_on_connections_the_server_closed_while_idle_are_not_lost() {
    let runtime = common::runtime();
    let config = ServerConfig {
        http_idle_timeout_ms: IDLE_TIMEOUT_MS,
        ..ServerConfig::default()
    };
    let handle = common::start_server(&runtime, config);
    let addr = handle.local_addr();
    let report = runtime
        .block_on(belfry_bench::fire::run(fire_args(&format!(
            "http://{addr}"
        ))))
        .unwrap();
    let o = &report.data["outcomes"][0];
    assert_eq!(o["delivery"]["delivered"], TASKS, "{o}");
    assert_eq!(o["delivery"]["duplicates"], 0, "{o}");
    let consumers = &o["consumers"];
    assert_eq!(consumers["ack_failures"], 0, "{consumers}");
    // The mechanism ran: batch acks were sent (each lease of up to 50 gets one).
    let ack_calls = consumers["ack_calls"].as_u64().unwrap();
    assert!(ack_calls >= TASKS / 50, "{consumers}");
    // The server agrees: nothing is still leased (an ack lost with its connection would
    // leave its tasks in flight for the visibility timeout) and nothing is left.
    let queue = runtime.block_on(common::queue_on_server(addr, QUEUE));
    assert_eq!(queue["in_flight"], 0, "{queue}");
    assert_eq!(queue["pending"], 0, "{queue}");
    runtime.block_on(handle.stop()).expect("clean stop");
}
