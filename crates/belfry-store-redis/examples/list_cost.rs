//! What listing a big partition's live tasks (`Store::list_tasks`) costs on a throwaway Redis:
//! one partition holding `tasks` live tasks (200-byte payloads; three in four due days ahead,
//! in far-future buckets, the rest due within the minute, in a ready set), walked `page` at a
//! time twice:
//!
//! - **dense**: the tasks hold every sequence the partition gave out, so each page probes
//!   about `page` sequences;
//! - **gap**: the partition's counter is moved on by three times `tasks` (as a long history of
//!   tasks since forgotten would leave it) and `page` more tasks are put, so the page that
//!   reaches the gap probes `tasks` sequences, then reads the partition once (below).
//!
//! Prints each walk's wall time and its slowest page's, its script calls, and Redis's time in
//! them (mean and slowest, from `SLOWLOG`): the slowest call is how long a page can hold
//! Redis. With at most 8,192 tasks the gap's page scans the partition in one call; with
//! more, it passes over the record hash in steps.
//!
//! `cargo run --release -p belfry-store-redis --example list_cost [tasks] [page]`

use std::time::Instant;

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_store::Store;
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

const DAY: u64 = 86_400_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let page: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let server = RedisServer::start();
    let options = RedisOptions {
        namespace: "list".into(),
        partitions: 1,
        placement_now_ms: Some(0),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).expect("connect");
    let q = QueueName::new("q").unwrap();
    store.put_queue(&q, Bytes::new()).unwrap();
    let mut conn = server.connection();

    let started = Instant::now();
    put(&store, &q, 0..tasks);
    println!(
        "put {tasks} tasks in {:.1} s; used_memory {} MB",
        started.elapsed().as_secs_f64(),
        used_memory(&mut conn) >> 20
    );
    walk(&store, &q, &mut conn, page, "dense", tasks);

    let counters: Vec<String> = redis::cmd("KEYS")
        .arg("{list/0}:*:s")
        .query(&mut conn)
        .unwrap();
    let _: u64 = redis::cmd("INCRBY")
        .arg(&counters[0])
        .arg(3 * tasks)
        .query(&mut conn)
        .unwrap();
    put(&store, &q, tasks..tasks + page);
    walk(&store, &q, &mut conn, page, "gap", tasks + page);
}

fn put(store: &RedisStore, q: &QueueName, range: std::ops::Range<usize>) {
    let payload = format!("{{\"pad\":\"{}\"}}", "x".repeat(188));
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(1_000) {
        let batch = chunk
            .iter()
            .map(|&i| {
                let due = if i % 4 == 0 {
                    30_000
                } else {
                    DAY + (i as u64 * 7_919) % (3 * DAY)
                };
                NewTask::new(q.clone(), due, payload.clone())
            })
            .collect();
        store.put(batch).unwrap();
    }
}

fn walk(
    store: &RedisStore,
    q: &QueueName,
    conn: &mut redis::Connection,
    page: usize,
    what: &str,
    expected: usize,
) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .arg("slowlog-max-len")
        .arg(1_000_000)
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(conn).unwrap();
    let started = Instant::now();
    let mut after: Option<TaskId> = None;
    let mut seen = 0;
    let mut slowest_page = std::time::Duration::ZERO;
    loop {
        let asked = Instant::now();
        let tasks = store.list_tasks(q, after, page, 60_000).unwrap();
        slowest_page = slowest_page.max(asked.elapsed());
        seen += tasks.len();
        if tasks.len() < page {
            break;
        }
        after = tasks.last().map(|t| t.id);
    }
    let wall = started.elapsed();
    assert_eq!(seen, expected, "{what}: listed");
    // Each entry: id, time, microseconds, the command and its arguments, ...
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(conn)
        .unwrap();
    let mut calls = Vec::new();
    for entry in &log {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(cmd))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        if matches!(cmd.first(), Some(redis::Value::BulkString(c)) if c.eq_ignore_ascii_case(b"evalsha"))
        {
            calls.push(*us);
        }
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(10_000)
        .query(conn)
        .unwrap();
    let total: i64 = calls.iter().sum();
    println!(
        "{what}: {seen} tasks in pages of {page}: {:.2} s wall (slowest page {:.3} s), \
         {} script calls, Redis {:.2} s in them (mean {} µs, slowest {} µs)",
        wall.as_secs_f64(),
        slowest_page.as_secs_f64(),
        calls.len(),
        total as f64 / 1e6,
        total / calls.len().max(1) as i64,
        calls.iter().max().unwrap_or(&0)
    );
}

fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
