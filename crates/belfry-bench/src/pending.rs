//! `belfry bench pending`: fill N far-future tasks and report what they cost at rest — disk
//! bytes per task in the server's data dir, server RSS — then `kill -9` the (spawned)
//! server, restart it on the same data, time until `/readyz` answers 200, and check that
//! every acknowledged task is still pending. Redis holds the same tasks as the baseline
//! (memory per pending task in RAM).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde::Serialize;
use serde_json::json;

use crate::http::{HttpConn, Target};
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::redis_queue::{self, QueueKeys, RedisServer};
use crate::report::{thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::sys::{dir_bytes, rss_bytes, unix_ms, Machine};
use crate::workload::{due_times, validate, Bodies};
use crate::{progress, Baseline, BaselineArgs, OutputArgs, ServerArgs};

/// Brief target: disk use at most this multiple of the raw task bytes.
const DISK_RATIO_TARGET: f64 = 1.5;
/// Brief target: serving again this soon after `kill -9` (stated for 100M pending).
const RESTART_TARGET: Duration = Duration::from_secs(2);
/// Brief target: RSS for 100M pending tasks.
const RSS_BYTES_TARGET_AT_100M: u64 = 512 * 1024 * 1024;

/// Raw bytes of one task beyond its payload: the due time (8 bytes). Ids, queue names and
/// framing are the store's overhead, which is what the disk ratio is meant to expose.
const RAW_TASK_OVERHEAD_BYTES: u64 = 8;

/// Pause after the fill before measuring disk and memory, so background flushes that
/// follow an acknowledged write are counted.
const SETTLE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, clap::Args)]
pub struct PendingArgs {
    /// Far-future tasks to fill.
    #[arg(long, default_value_t = 1_000_000)]
    pub tasks: u64,
    /// Tasks per submit request.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Submit connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Tasks are due this many days from now (spread over one day).
    #[arg(long, default_value_t = 365)]
    pub due_in_days: u64,
    /// Skip the kill -9 and restart (always skipped without --spawn).
    #[arg(long)]
    pub no_restart: bool,
    /// Queue to create and fill (default: a fresh `bench-pending-<ms>`).
    #[arg(long)]
    pub queue: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub baselines: BaselineArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct PendingOutcome {
    pub submit: Option<IngestOutcome>,
    pub pending_reported: Option<u64>,
    pub disk_length_bytes: Option<u64>,
    pub disk_allocated_bytes: Option<u64>,
    pub rss_idle_bytes: Option<u64>,
    pub rss_filled_bytes: Option<u64>,
    pub rss_peak_bytes: Option<u64>,
    pub restart_ready_ms: Option<f64>,
    pub pending_after_restart: Option<u64>,
    pub rss_after_restart_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct RedisPendingOutcome {
    pub submit: Option<IngestOutcome>,
    pub used_memory_delta_bytes: u64,
    pub rss_bytes: Option<u64>,
}

pub async fn run(args: PendingArgs) -> anyhow::Result<Report> {
    validate(args.tasks, args.batch, args.connections, args.payload_bytes)?;
    let machine = Machine::describe();
    let due = due_times(
        args.tasks,
        unix_ms() + args.due_in_days * 86_400_000,
        86_400_000,
    );
    let bodies = Arc::new(Bodies::build(&due, args.batch, args.payload_bytes));
    let belfry = if args.server.baselines_only {
        None
    } else {
        let mut server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
        let result = pending_belfry(&args, &mut server, bodies).await;
        server.stop();
        Some(result?)
    };
    let redis = if args.baselines.wants(Baseline::Redis) {
        Some(pending_redis(&args, &due).await?)
    } else {
        None
    };
    Ok(build_report(&args, machine, belfry, redis))
}

async fn pending_belfry(
    args: &PendingArgs,
    server: &mut ServerUnderTest,
    bodies: Arc<Bodies>,
) -> anyhow::Result<PendingOutcome> {
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-pending-{}", unix_ms()));
    let mut out = PendingOutcome {
        rss_idle_bytes: server.pid.and_then(rss_bytes).map(|r| r.0),
        ..Default::default()
    };
    create_queue(&server.target, &queue, "{}").await?;
    let submit = run_ingest(
        IngestJob {
            label: "belfry".into(),
            target: server.target.clone(),
            path: format!("/v1/queues/{queue}/tasks:batch"),
            bodies,
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: None,
            server_pid: server.pid,
        },
        progress(&args.output, args.tasks, "belfry fill"),
    )
    .await;
    out.submit = Some(submit);
    tokio::time::sleep(SETTLE).await;
    out.pending_reported = pending_count(&server.target, &queue).await;
    if let Some((rss, peak)) = server.pid.and_then(rss_bytes) {
        out.rss_filled_bytes = Some(rss);
        out.rss_peak_bytes = Some(peak);
    }
    if let Some(dir) = server.data_dir(args.server.server_data_dir.as_deref()) {
        if let Ok((length, allocated)) = dir_bytes(&dir) {
            out.disk_length_bytes = Some(length);
            out.disk_allocated_bytes = Some(allocated);
        }
    }
    if args.no_restart {
        return Ok(out);
    }
    if let Some(spawned) = server.spawned.as_mut() {
        let ready = spawned.kill9_and_restart().await?;
        out.restart_ready_ms = Some(ready.as_secs_f64() * 1_000.0);
        server.pid = spawned.pid();
        out.pending_after_restart = pending_count(&server.target, &queue).await;
        out.rss_after_restart_bytes = server.pid.and_then(rss_bytes).map(|r| r.0);
    }
    Ok(out)
}

/// The queue's `pending` count from `GET /v1/queues/{queue}`, wherever the object puts it.
async fn pending_count(target: &Target, queue: &str) -> Option<u64> {
    let mut conn = HttpConn::connect(target).await.ok()?;
    let body = conn
        .expect_success(Method::GET, &format!("/v1/queues/{queue}"), Bytes::new())
        .await
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
    find_u64(&value, "pending")
}

/// The first number under `key` anywhere in `value` (depth first).
pub fn find_u64(value: &serde_json::Value, key: &str) -> Option<u64> {
    match value {
        serde_json::Value::Object(map) => map
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .or_else(|| map.values().find_map(|v| find_u64(v, key))),
        serde_json::Value::Array(items) => items.iter().find_map(|v| find_u64(v, key)),
        _ => None,
    }
}

async fn pending_redis(args: &PendingArgs, due: &[u64]) -> anyhow::Result<RedisPendingOutcome> {
    let server = RedisServer::start(&args.baselines)?;
    let keys = QueueKeys::new(&format!("bench-pending-{}", unix_ms()));
    let result = async {
        let before = redis_queue::used_memory(&server.url).await?;
        let submit = redis_queue::ingest(
            redis_queue::Submit {
                url: &server.url,
                pid: server.pid,
                keys: &keys,
                batch: args.batch,
                connections: args.connections,
                payload_bytes: args.payload_bytes,
            },
            due,
            progress(&args.output, args.tasks, "redis fill"),
            "Redis ZSET + HASH",
        )
        .await?;
        let after = redis_queue::used_memory(&server.url).await?;
        Ok::<_, crate::BenchError>(RedisPendingOutcome {
            submit: Some(submit),
            used_memory_delta_bytes: after.saturating_sub(before),
            rss_bytes: server.pid.and_then(rss_bytes).map(|r| r.0),
        })
    }
    .await;
    let _ = redis_queue::delete_queue(&server.url, &keys).await;
    server.stop();
    Ok(result?)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn build_report(
    args: &PendingArgs,
    machine: Machine,
    belfry: Option<PendingOutcome>,
    redis: Option<RedisPendingOutcome>,
) -> Report {
    let n = args.tasks as f64;
    let raw_per_task = args.payload_bytes as u64 + RAW_TASK_OVERHEAD_BYTES;
    let dash = || "-".to_string();
    let mut table = Table::new(
        format!(
            "pending: {} far-future tasks of {} B (raw {} B/task)",
            thousands(n),
            args.payload_bytes,
            raw_per_task
        ),
        &[
            "measure",
            "belfry",
            "Redis ZSET + HASH (seeds' design)",
            "target",
        ],
    );
    let b = belfry.clone().unwrap_or_default();
    let r = redis.clone().unwrap_or_default();
    let rate =
        |o: &Option<IngestOutcome>| o.as_ref().map_or_else(dash, |s| thousands(s.tasks_per_s));
    table.row(vec![
        "fill tasks/s".into(),
        rate(&b.submit),
        rate(&r.submit),
        dash(),
    ]);
    table.row(vec![
        "pending reported by the server".into(),
        b.pending_reported
            .map_or_else(dash, |p| thousands(p as f64)),
        dash(),
        thousands(n),
    ]);
    table.row(vec![
        "disk bytes/task (allocated; file length)".into(),
        match (b.disk_allocated_bytes, b.disk_length_bytes) {
            (Some(a), Some(l)) => format!(
                "{:.0} B; {:.0} B ({:.2}× raw)",
                a as f64 / n,
                l as f64 / n,
                a as f64 / n / raw_per_task as f64
            ),
            _ => dash(),
        },
        "in RAM only (AOF not measured)".into(),
        format!(
            "≤ {DISK_RATIO_TARGET}× raw = {:.0} B",
            DISK_RATIO_TARGET * raw_per_task as f64
        ),
    ]);
    table.row(vec![
        "server RSS idle → filled (peak)".into(),
        match (b.rss_idle_bytes, b.rss_filled_bytes, b.rss_peak_bytes) {
            (Some(i), Some(f), Some(p)) => format!("{} → {} ({})", mib(i), mib(f), mib(p)),
            _ => dash(),
        },
        r.rss_bytes.map_or_else(dash, mib),
        format!("≤ {} at 100M, flat in N", mib(RSS_BYTES_TARGET_AT_100M)),
    ]);
    table.row(vec![
        "memory bytes/task".into(),
        match (b.rss_idle_bytes, b.rss_filled_bytes) {
            (Some(i), Some(f)) => format!("{:.1} B (RSS growth)", f.saturating_sub(i) as f64 / n),
            _ => dash(),
        },
        if redis.is_some() {
            format!(
                "{:.1} B (used_memory growth)",
                r.used_memory_delta_bytes as f64 / n
            )
        } else {
            dash()
        },
        format!("≤ {:.1} B", RSS_BYTES_TARGET_AT_100M as f64 / 1e8),
    ]);
    table.row(vec![
        "kill -9 → /readyz 200".into(),
        b.restart_ready_ms
            .map_or_else(dash, |ms| format!("{ms:.0} ms")),
        dash(),
        format!("≤ {} s at 100M", RESTART_TARGET.as_secs()),
    ]);
    table.row(vec![
        "pending after restart".into(),
        b.pending_after_restart
            .map_or_else(dash, |p| thousands(p as f64)),
        dash(),
        "all acknowledged".into(),
    ]);
    table.row(vec![
        "RSS after restart".into(),
        b.rss_after_restart_bytes.map_or_else(dash, mib),
        dash(),
        dash(),
    ]);
    let mut notes = Vec::new();
    if let Some(s) = &b.submit {
        if let Some(e) = &s.first_error {
            notes.push(format!(
                "belfry fill: {} rejected tasks; first error: {e}",
                s.rejected
            ));
        }
        if let (Some(after), true) = (b.pending_after_restart, b.restart_ready_ms.is_some()) {
            let lost = s.accepted.saturating_sub(after);
            notes.push(format!(
                "after kill -9 and restart: {} of {} acknowledged tasks pending ({} lost).",
                thousands(after as f64),
                thousands(s.accepted as f64),
                lost
            ));
        }
    }
    if let Some(a) = b.disk_allocated_bytes {
        let ratio = a as f64 / n / raw_per_task as f64;
        notes.push(format!(
            "disk target ≤ {DISK_RATIO_TARGET}× raw task bytes: {} ({ratio:.2}×).",
            if ratio <= DISK_RATIO_TARGET {
                "met"
            } else {
                "missed"
            }
        ));
    }
    if let Some(ms) = b.restart_ready_ms {
        notes.push(format!(
            "restart target ≤ {} s (stated for 100M pending; this run: {}): {} ({ms:.0} ms).",
            RESTART_TARGET.as_secs(),
            thousands(n),
            if ms <= RESTART_TARGET.as_secs_f64() * 1_000.0 {
                "met"
            } else {
                "missed"
            }
        ));
    }
    if belfry
        .as_ref()
        .is_some_and(|b| b.rss_filled_bytes.is_none())
    {
        notes.push("no server RSS: pass --spawn, or --server-pid for a server at --url.".into());
    }
    Report {
        scenario: "pending".into(),
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: json!({
            "tasks": args.tasks,
            "payload_bytes": args.payload_bytes,
            "raw_bytes_per_task": raw_per_task,
            "belfry": belfry,
            "redis": redis,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_is_found_wherever_the_queue_object_puts_it() {
        assert_eq!(find_u64(&json!({"pending": 5}), "pending"), Some(5));
        assert_eq!(
            find_u64(
                &json!({"name": "q", "counts": {"due": 1, "pending": 7}}),
                "pending"
            ),
            Some(7)
        );
        assert_eq!(find_u64(&json!({"pending": "x"}), "pending"), None);
        assert_eq!(find_u64(&json!([1, 2]), "pending"), None);
    }
}
