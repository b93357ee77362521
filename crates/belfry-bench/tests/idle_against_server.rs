//! `belfry bench idle` against a real belfry server (the server crate in this process, with the
//! in-memory store): the schedules and reminders it counts as created are the ones the server
//! lists, and a run against a server it did not start deletes them again. No CPU figures are
//! checked: without the server's PID there are none, and the report says so with "-".

mod common;

use belfry_bench::BenchCommand;
use belfry_server::ServerConfig;
use clap::Parser;
use http::Method;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

const SCHEDULES: u64 = 70;
const REMINDERS: u64 = 45;

fn idle_args(url: &str, prefix: &str) -> belfry_bench::idle::IdleArgs {
    let (schedules, reminders) = (SCHEDULES.to_string(), REMINDERS.to_string());
    let cli = Cli::try_parse_from([
        "bench",
        "idle",
        "--url",
        url,
        "--schedules",
        &schedules,
        "--reminders",
        &reminders,
        "--idle-s",
        "1",
        "--settle-s",
        "0",
        "--connections",
        "3",
        "--prefix",
        prefix,
        "--no-progress",
    ])
    .unwrap();
    let BenchCommand::Idle(args) = cli.command else {
        panic!("not idle")
    };
    *args
}

/// How many records of `kind` (`schedules` or `reminders`) named with `prefix` the server lists.
async fn listed(addr: std::net::SocketAddr, kind: &str, prefix: &str) -> usize {
    let target = belfry_bench::http::Target::from_addr(addr);
    let mut conn = belfry_bench::http::HttpConn::connect(&target)
        .await
        .unwrap();
    let path = match kind {
        "reminders" => format!("/v1/reminders?queue={prefix}-q&limit=1000"),
        _ => "/v1/schedules".to_string(),
    };
    let body = conn
        .expect_success(Method::GET, &path, bytes::Bytes::new())
        .await
        .unwrap();
    let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let items = page[kind]
        .as_array()
        .unwrap_or_else(|| panic!("{kind}: {page}"));
    items
        .iter()
        .filter(|item| {
            item["id"]
                .as_str()
                .is_some_and(|id| id.starts_with(&format!("{prefix}-")))
        })
        .count()
}

#[test]
fn what_idle_creates_the_server_holds_and_a_url_run_deletes_it_again() {
    let runtime = common::runtime();
    let handle = common::start_server(&runtime, ServerConfig::default());
    let addr = handle.local_addr();
    let url = format!("http://{addr}");
    let prefix = "idle-test";

    let report = runtime
        .block_on(belfry_bench::idle::run(idle_args(&url, prefix)))
        .expect("the scenario runs");
    let data = &report.data;
    assert_eq!(data["schedules"]["accepted"], SCHEDULES, "{data}");
    assert_eq!(data["reminders"]["accepted"], REMINDERS, "{data}");
    // Each delete answered 2xx, so each record existed until the end of the run.
    assert_eq!(data["deleted"], SCHEDULES + REMINDERS, "{data}");
    // A server at --url: no PID, so no CPU figure, shown as "-" rather than a made-up 0.
    assert!(data["empty_cores"].is_null() && data["stored_cores"].is_null());
    assert_eq!(report.tables[0].rows[1][1], "-");

    runtime.block_on(async {
        assert_eq!(listed(addr, "schedules", prefix).await, 0);
        assert_eq!(listed(addr, "reminders", prefix).await, 0);
    });
}
