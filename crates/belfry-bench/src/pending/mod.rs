//! `belfry bench pending`: fill N far-future tasks and report what they cost at rest — disk
//! bytes per task in the server's data dir, server RSS — then `kill -9` the (spawned)
//! server, restart it on the same data, time until `/readyz` answers 200, and check that
//! every acknowledged task is still pending. Redis holds the same tasks as the baseline
//! (memory per pending task in RAM).
//!
//! With `--point-ops N`, the bench then gets, cancels and reschedules single filled tasks by
//! id on the restarted server ([`point_ops`]): first touches of far buckets.
//!
//! The server's RSS is sampled throughout the fill, so the report can tell memory that
//! grows with the pending count (the slope over the second half of the fill, which the brief
//! bounds) from memory that a server needs once it is busy (the step at the start).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::json;

use crate::http::{HttpConn, Target};
use crate::load::{run_ingest, Answers, IdSample, IngestJob, IngestOutcome};
use crate::redis_queue::{self, QueueKeys, RedisServer};
use crate::report::Report;
use crate::reservoir::Reservoir;
use crate::spawn::{create_queue, ServerUnderTest};
use crate::sys::{dir_bytes, rss_bytes, unix_ms, Machine};
use crate::workload::{due_times, validate, Bodies};
use crate::{progress, Baseline, BaselineArgs, OutputArgs, ServerArgs};

pub mod point_ops;
mod report;

use report::build_report;

/// Brief target: disk use at most this multiple of the raw task bytes.
const DISK_RATIO_TARGET: f64 = 1.5;
/// Brief target: serving again this soon after `kill -9` (stated for 100M pending).
const RESTART_TARGET: Duration = Duration::from_secs(2);
/// Brief target: RSS for 100M pending tasks.
const RSS_BYTES_TARGET_AT_100M: u64 = 512 * 1024 * 1024;

/// Raw bytes of one task beyond its payload: the due time (8 bytes), and its idempotency key
/// when it has one ([`mean_key_bytes`]). Ids, queue names and framing are the store's
/// overhead, which is what the disk ratio is meant to expose.
const RAW_TASK_OVERHEAD_BYTES: u64 = 8;

/// The mean length of the keys `pending-{run}-{index}` of `tasks` tasks, `run` being a
/// 13-digit Unix time in ms: the key is the caller's data, so it counts as raw task bytes.
fn mean_key_bytes(tasks: u64) -> u64 {
    let digits: u64 = (0..20u32)
        .map(|d| {
            // Indices with d + 1 digits among 0..tasks.
            let low = if d == 0 { 0 } else { 10u64.pow(d) };
            let high = 10u64.saturating_pow(d + 1).min(tasks);
            high.saturating_sub(low) * u64::from(d + 1)
        })
        .sum();
    let prefix = "pending-".len() as u64 + 13 + 1;
    prefix + digits.div_ceil(tasks.max(1))
}

/// Pause after the fill before measuring disk and memory, so background flushes that
/// follow an acknowledged write are counted.
const SETTLE: Duration = Duration::from_secs(1);

/// How often the server's RSS is sampled during the fill: a 1M fill (a few seconds) still
/// gets tens of samples, a 100M fill a few thousand.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The pending count the brief's memory target is stated for.
const TARGET_PENDING: u64 = 100_000_000;

/// Growth per pending task is fitted over the fill from this share of the tasks on: the
/// first part holds the one-off step of a server going from idle to busy (threads, buffers,
/// allocator arenas), which is not a cost per pending task.
const GROWTH_FIT_FROM: f64 = 0.5;

/// Tasks whose request bodies the load generator builds at a time: ~500 MB of 200-byte
/// tasks. The fill goes chunk by chunk, so 100M pending needs no 25 GB of prebuilt requests.
const FILL_CHUNK_TASKS: u64 = 2_000_000;

/// Fill levels at which the report shows the sampled RSS.
const RSS_REPORT_FRACTIONS: [f64; 4] = [0.25, 0.5, 0.75, 1.0];

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
    /// The first task is due this many days from now.
    #[arg(long, default_value_t = 365)]
    pub due_in_days: u64,
    /// Due times are spread evenly over this many days (the engine's buckets widen with
    /// distance: 1 day far away is one or two buckets, 730 days a few hundred). 0 gives every
    /// task the same due time: all of them in one far bucket (with --point-ops, the first
    /// touches of one bucket of --tasks tasks).
    #[arg(long, default_value_t = 1)]
    pub spread_days: u64,
    /// Give every task an idempotency key (`pending-<run>-<index>`): a store that keeps live
    /// keys in memory shows it here as growth per pending task.
    #[arg(long)]
    pub idempotency_keys: bool,
    /// Skip the kill -9 and restart (always skipped without --spawn).
    #[arg(long)]
    pub no_restart: bool,
    /// After the fill and the restart, get, cancel (each on N distinct random filled tasks)
    /// and reschedule (N/10 more) single tasks by id, and report each phase's latency, rate,
    /// errors and server RSS; one lone get first, certainly a first touch. 0: off. Needs
    /// --tasks ≥ 2.1 × N + 1.
    #[arg(long, default_value_t = 0)]
    pub point_ops: u64,
    /// Connections of the --point-ops phases.
    #[arg(long, default_value_t = 4)]
    pub point_connections: usize,
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
    /// Server RSS during the fill, by tasks answered so far (the last one after the fill).
    pub rss_samples: Vec<RssSample>,
    /// Gets, cancels and reschedules by id after the restart (`--point-ops`).
    pub point_ops: Option<point_ops::PointOpsOutcome>,
}

/// The server's RSS when `tasks` tasks of the fill had been answered.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RssSample {
    pub tasks: u64,
    pub rss_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct RedisPendingOutcome {
    pub submit: Option<IngestOutcome>,
    pub used_memory_delta_bytes: u64,
    pub rss_bytes: Option<u64>,
}

pub async fn run(args: PendingArgs) -> anyhow::Result<Report> {
    validate(args.tasks, args.batch, args.connections, args.payload_bytes)?;
    point_ops::validate(args.point_ops, args.point_connections, args.tasks)?;
    let machine = Machine::describe();
    let plan = FillPlan {
        start_ms: unix_ms() + args.due_in_days.saturating_mul(86_400_000),
        window_ms: args.spread_days.saturating_mul(86_400_000),
        key_run: args.idempotency_keys.then(|| unix_ms().to_string()),
    };
    let belfry = if args.server.baselines_only {
        None
    } else {
        let mut server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
        let result = pending_belfry(&args, &mut server, &plan).await;
        server.stop();
        Some(result?)
    };
    let redis = if args.baselines.wants(Baseline::Redis) {
        let due = due_times(args.tasks, plan.start_ms, plan.window_ms);
        Some(pending_redis(&args, &due).await?)
    } else {
        None
    };
    Ok(build_report(&args, machine, belfry, redis))
}

/// What the fill submits: due times spread evenly over `[start_ms, start_ms + window_ms)`
/// in task order (as [`due_times`]), keys `pending-{key_run}-{index}` when asked for.
struct FillPlan {
    start_ms: u64,
    window_ms: u64,
    key_run: Option<String>,
}

impl FillPlan {
    /// Request bodies for tasks `from..to` of `tasks`.
    fn bodies(&self, args: &PendingArgs, from: u64, to: u64) -> Bodies {
        let due = due_range(args.tasks, self.start_ms, self.window_ms, from, to);
        match &self.key_run {
            Some(run) => bodies_with_keys(&due, args.batch, args.payload_bytes, run, from),
            None => Bodies::build(&due, args.batch, args.payload_bytes),
        }
    }
}

/// Due times of tasks `from..to` out of `count` spread as [`due_times`] spreads them all.
pub fn due_range(count: u64, start_ms: u64, window_ms: u64, from: u64, to: u64) -> Vec<u64> {
    (from..to.min(count))
        .map(|i| {
            start_ms + (u128::from(i) * u128::from(window_ms) / u128::from(count.max(1))) as u64
        })
        .collect()
}

/// One outcome for a fill submitted in chunks: counts and times add up; CPU is averaged over
/// the chunks' time; latency percentiles are the worst chunk's (an upper bound: histograms of
/// chunks are not kept).
pub fn merge_outcomes(parts: Vec<IngestOutcome>) -> Option<IngestOutcome> {
    let mut parts = parts.into_iter();
    let mut total = parts.next()?;
    let mut client_cpu_s = total.cpu.client_cores * total.elapsed_s;
    let mut server_cpu_s = total.cpu.server_cores.map(|c| c * total.elapsed_s);
    for p in parts {
        total.requests += p.requests;
        total.accepted += p.accepted;
        total.rejected += p.rejected;
        total.failed_requests += p.failed_requests;
        total.answered_after_due += p.answered_after_due;
        total.first_error = total.first_error.or(p.first_error);
        total.elapsed_s += p.elapsed_s;
        client_cpu_s += p.cpu.client_cores * p.elapsed_s;
        server_cpu_s = match (server_cpu_s, p.cpu.server_cores) {
            (Some(s), Some(c)) => Some(s + c * p.elapsed_s),
            _ => None,
        };
        let (a, b) = (&mut total.latency, p.latency);
        a.count += b.count;
        a.p50_us = a.p50_us.max(b.p50_us);
        a.p90_us = a.p90_us.max(b.p90_us);
        a.p99_us = a.p99_us.max(b.p99_us);
        a.p999_us = a.p999_us.max(b.p999_us);
        a.max_us = a.max_us.max(b.max_us);
    }
    let elapsed = total.elapsed_s.max(1e-9);
    total.tasks_per_s = total.accepted as f64 / elapsed;
    total.requests_per_s = total.requests as f64 / elapsed;
    total.cpu.client_cores = client_cpu_s / elapsed;
    total.cpu.server_cores = server_cpu_s.map(|s| s / elapsed);
    Some(total)
}

async fn pending_belfry(
    args: &PendingArgs,
    server: &mut ServerUnderTest,
    plan: &FillPlan,
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
    // Filled ids to pick the point ops from: a bounded uniform sample, not every id.
    let id_sample: Option<IdSample> = (args.point_ops > 0).then(|| {
        let capacity = point_ops::sample_capacity(args.point_ops);
        Arc::new(Mutex::new(Reservoir::new(capacity, unix_ms())))
    });
    let (submit, rss_samples) = fill(args, server, plan, &queue, &id_sample).await?;
    out.rss_samples = rss_samples;
    let accepted = submit.accepted;
    out.submit = Some(submit);
    measure_at_rest(args, server, &queue, accepted, &mut out).await;
    if let Some(spawned) = server.spawned.as_mut().filter(|_| !args.no_restart) {
        let ready = spawned.kill9_and_restart().await?;
        out.restart_ready_ms = Some(ready.as_secs_f64() * 1_000.0);
        server.pid = spawned.pid();
        out.pending_after_restart = pending_count(&server.target, &queue).await;
        out.rss_after_restart_bytes = server.pid.and_then(rss_bytes).map(|r| r.0);
    }
    if let Some(sample) = id_sample {
        let after_restart = out.restart_ready_ms.is_some();
        out.point_ops =
            Some(run_point_ops(args, server, &queue, plan, &sample, after_restart).await);
    }
    Ok(out)
}

/// The fill, chunk by chunk, with the server's RSS sampled throughout (when its pid is
/// known): the merged submit outcome and the samples.
async fn fill(
    args: &PendingArgs,
    server: &ServerUnderTest,
    plan: &FillPlan,
    queue: &str,
    id_sample: &Option<IdSample>,
) -> anyhow::Result<(IngestOutcome, Vec<RssSample>)> {
    // The bar of the chunk being submitted; each starts where the last one ended, so its
    // position counts the tasks answered over the whole fill.
    let answered = Arc::new(Mutex::new(ProgressBar::hidden()));
    let (stop_sampling, sampler) = match server.pid {
        Some(pid) => {
            let (stop, stopped) = tokio::sync::oneshot::channel();
            (
                Some(stop),
                Some(tokio::spawn(sample_rss(pid, answered.clone(), stopped))),
            )
        }
        None => (None, None),
    };
    let mut parts = Vec::new();
    let mut from = 0;
    while from < args.tasks {
        let to = args.tasks.min(from + FILL_CHUNK_TASKS);
        let bodies = Arc::new(plan.bodies(args, from, to));
        let bar = progress(&args.output, args.tasks, "belfry fill");
        bar.set_position(from);
        if let Ok(mut current) = answered.lock() {
            *current = bar.clone();
        }
        parts.push(
            run_ingest(
                IngestJob {
                    label: "belfry".into(),
                    target: server.target.clone(),
                    // `--batch 1` bodies are single tasks, for the single-task endpoint.
                    path: if args.batch == 1 {
                        format!("/v1/queues/{queue}/tasks")
                    } else {
                        format!("/v1/queues/{queue}/tasks:batch")
                    },
                    body_paths: None,
                    bodies,
                    connections: args.connections,
                    answers: Answers::Belfry,
                    due_at_ms: None,
                    server_pid: server.pid,
                    keep_ids: id_sample.clone(),
                },
                bar,
            )
            .await,
        );
        from = to;
    }
    let submit = merge_outcomes(parts).ok_or_else(|| anyhow::anyhow!("nothing to fill"))?;
    if let Some(stop) = stop_sampling {
        let _ = stop.send(());
    }
    let rss_samples = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    Ok((submit, rss_samples))
}

/// What the filled server holds once it has settled: the pending count it reports, its RSS
/// (the last sample, at `accepted` tasks), and its data dir's size.
async fn measure_at_rest(
    args: &PendingArgs,
    server: &ServerUnderTest,
    queue: &str,
    accepted: u64,
    out: &mut PendingOutcome,
) {
    tokio::time::sleep(SETTLE).await;
    out.pending_reported = pending_count(&server.target, queue).await;
    if let Some((rss, peak)) = server.pid.and_then(rss_bytes) {
        out.rss_filled_bytes = Some(rss);
        out.rss_peak_bytes = Some(peak);
        out.rss_samples.push(RssSample {
            tasks: accepted,
            rss_bytes: rss,
        });
    }
    if let Some(dir) = server.data_dir(args.server.server_data_dir.as_deref()) {
        if let Ok((length, allocated)) = dir_bytes(&dir) {
            out.disk_length_bytes = Some(length);
            out.disk_allocated_bytes = Some(allocated);
        }
    }
}

/// The `--point-ops` phases on the ids the fill sampled.
async fn run_point_ops(
    args: &PendingArgs,
    server: &ServerUnderTest,
    queue: &str,
    fill: &FillPlan,
    sample: &IdSample,
    after_restart: bool,
) -> point_ops::PointOpsOutcome {
    // The fill's workers are done; take the sample out from under its lock.
    let ids = std::mem::replace(
        &mut *sample.lock().unwrap_or_else(|p| p.into_inner()),
        Reservoir::new(0, 0),
    );
    let plan = point_ops::PointOpsPlan {
        target: &server.target,
        queue,
        pid: server.pid,
        connections: args.point_connections,
        point_ops: args.point_ops,
        // Past the fill's window, so the task moves to another far bucket.
        reschedule_to_ms: fill.start_ms + fill.window_ms + point_ops::RESCHEDULE_PAST_WINDOW_MS,
        after_restart,
    };
    point_ops::run(plan, ids.into_shuffled()).await
}

/// Samples the RSS of process `pid` every [`RSS_SAMPLE_INTERVAL`] against the tasks the
/// fill has answered so far (the progress bar counts them, drawn or hidden), until `stop`.
async fn sample_rss(
    pid: u32,
    answered: Arc<Mutex<ProgressBar>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<RssSample> {
    let mut samples = Vec::new();
    let mut every = tokio::time::interval(RSS_SAMPLE_INTERVAL);
    loop {
        tokio::select! {
            _ = &mut stop => return samples,
            _ = every.tick() => {
                let Ok(tasks) = answered.lock().map(|bar| bar.position()) else {
                    return samples;
                };
                if let Some((rss, _)) = rss_bytes(pid) {
                    samples.push(RssSample { tasks, rss_bytes: rss });
                }
            }
        }
    }
}

/// The first sample taken once `fraction` of `tasks` had been answered.
pub fn rss_at_fraction(samples: &[RssSample], tasks: u64, fraction: f64) -> Option<RssSample> {
    let level = (tasks as f64 * fraction).ceil() as u64;
    samples.iter().copied().find(|s| s.tasks >= level)
}

/// RSS growth in bytes per task answered: the least-squares slope of RSS over tasks, fitted
/// to the samples taken from `from_tasks` tasks on. None without two distinct task counts
/// there (a fill too short to sample).
pub fn growth_per_task(samples: &[RssSample], from_tasks: u64) -> Option<f64> {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.tasks >= from_tasks)
        .map(|s| (s.tasks as f64, s.rss_bytes as f64))
        .collect();
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    // sxx is 0 with fewer than two distinct task counts (and NaN with no points).
    (sxx > 0.0).then(|| sxy / sxx)
}

/// RSS at `to_tasks` pending, going on from `rss_bytes` at `from_tasks` with `per_task`
/// bytes per extra task (a shrinking fit is not extrapolated below the measured RSS).
pub fn extrapolate_rss(rss_bytes: u64, from_tasks: u64, per_task: f64, to_tasks: u64) -> f64 {
    let extra = to_tasks.saturating_sub(from_tasks) as f64;
    rss_bytes as f64 + per_task.max(0.0) * extra
}

/// Batch request bodies like [`Bodies::build`], each task with the idempotency key
/// `pending-{run}-{index}` (unique per run, so a second run on the same queue adds tasks),
/// the first task being number `first_index` of the fill.
pub fn bodies_with_keys(
    due_at_ms: &[u64],
    batch: usize,
    payload_bytes: usize,
    run: &str,
    first_index: u64,
) -> Bodies {
    Bodies::from_tasks(due_at_ms, batch, |offset, due| {
        let index = first_index + offset;
        let payload: serde_json::Value =
            serde_json::from_str(&crate::workload::payload(index, payload_bytes))
                .unwrap_or(serde_json::Value::Null);
        json!({
            "payload": payload,
            "run_at_ms": due,
            "idempotency_key": format!("pending-{run}-{index}"),
        })
        .to_string()
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_key_length_counts_each_index_digits() {
        // "pending-" + 13 digits + "-" = 22 bytes, then 0..10 have one digit each.
        assert_eq!(mean_key_bytes(10), 23);
        // 0..100: 10 of one digit, 90 of two: 190 / 100, rounded up.
        assert_eq!(mean_key_bytes(100), 24);
        assert_eq!(mean_key_bytes(3_000_000), 22 + 7);
    }

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

    fn samples(points: &[(u64, u64)]) -> Vec<RssSample> {
        points
            .iter()
            .map(|&(tasks, rss_bytes)| RssSample { tasks, rss_bytes })
            .collect()
    }

    #[test]
    fn growth_is_the_slope_over_the_fitted_part_only() {
        // A step from idle to busy in the first half, then 3 B per task.
        let s = samples(&[
            (0, 10_000_000),
            (100, 30_000_000),
            (500, 30_001_500),
            (700, 30_002_100),
            (1_000, 30_003_000),
        ]);
        let slope = growth_per_task(&s, 500).unwrap();
        assert!((slope - 3.0).abs() < 1e-9, "{slope}");
        // Fitted from the start, the step dominates.
        assert!(growth_per_task(&s, 0).unwrap() > 1_000.0);
        // Flat memory is zero growth, noise around it averages out.
        let flat = samples(&[(500, 20), (600, 30), (700, 20), (800, 30)]);
        assert!(growth_per_task(&flat, 500).unwrap().abs() < 0.05);
    }

    #[test]
    fn growth_needs_two_distinct_task_counts() {
        assert_eq!(growth_per_task(&[], 0), None);
        assert_eq!(growth_per_task(&samples(&[(5, 1), (5, 9)]), 0), None);
        assert_eq!(growth_per_task(&samples(&[(1, 1), (9, 9)]), 5), None);
    }

    #[test]
    fn rss_at_a_fill_level_is_the_first_sample_past_it() {
        let s = samples(&[(0, 1), (240, 2), (260, 3), (1_000, 4)]);
        assert_eq!(
            rss_at_fraction(&s, 1_000, 0.25).map(|s| s.rss_bytes),
            Some(3)
        );
        assert_eq!(
            rss_at_fraction(&s, 1_000, 1.0).map(|s| s.rss_bytes),
            Some(4)
        );
        assert_eq!(rss_at_fraction(&s[..2], 1_000, 0.5), None);
    }

    #[test]
    fn keyed_bodies_give_each_task_its_own_key() {
        let due = crate::workload::due_times(5, 100, 10);
        let b = bodies_with_keys(&due, 2, 64, "r1", 0);
        assert_eq!(b.bodies.len(), 3);
        assert_eq!((b.tasks_in(0), b.tasks_in(2)), (2, 1));
        let v: serde_json::Value = serde_json::from_slice(&b.bodies[1]).unwrap();
        assert_eq!(v["tasks"][1]["idempotency_key"], "pending-r1-3");
        assert_eq!(v["tasks"][1]["payload"]["i"], 3);
        assert_eq!(v["tasks"][1]["run_at_ms"], due[3]);
        let single = bodies_with_keys(&due, 1, 64, "r1", 0);
        let v: serde_json::Value = serde_json::from_slice(&single.bodies[4]).unwrap();
        assert_eq!(v["idempotency_key"], "pending-r1-4");
        // A later chunk numbers its keys from where it starts in the fill.
        let later = bodies_with_keys(&due[3..], 2, 64, "r1", 3);
        let v: serde_json::Value = serde_json::from_slice(&later.bodies[0]).unwrap();
        assert_eq!(v["tasks"][0]["idempotency_key"], "pending-r1-3");
    }

    #[test]
    fn chunks_of_due_times_join_into_the_whole_spread() {
        let whole = due_times(1_003, 5_000, 86_400_000);
        let mut joined = Vec::new();
        for from in (0..1_003).step_by(100) {
            joined.extend(due_range(1_003, 5_000, 86_400_000, from, from + 100));
        }
        assert_eq!(joined, whole);
        assert!(due_range(10, 0, 10, 8, 50).len() == 2);
    }

    fn outcome(accepted: u64, elapsed_s: f64, server_cores: f64, p99_us: u64) -> IngestOutcome {
        IngestOutcome {
            label: "belfry".into(),
            requests: accepted / 10,
            accepted,
            rejected: 1,
            failed_requests: 0,
            first_error: None,
            elapsed_s,
            tasks_per_s: accepted as f64 / elapsed_s,
            requests_per_s: 0.0,
            latency: crate::stats::Percentiles {
                count: accepted / 10,
                p99_us,
                ..Default::default()
            },
            cpu: crate::sys::CpuUse {
                client_cores: 0.5,
                server_cores: Some(server_cores),
            },
            answered_after_due: 0,
        }
    }

    #[test]
    fn chunk_outcomes_add_up() {
        assert!(merge_outcomes(Vec::new()).is_none());
        let mut second = outcome(300, 3.0, 0.5, 70);
        second.first_error = Some("later".into());
        let m = merge_outcomes(vec![outcome(100, 1.0, 1.0, 90), second]).unwrap();
        assert_eq!((m.accepted, m.rejected, m.requests), (400, 2, 40));
        assert_eq!(m.elapsed_s, 4.0);
        assert_eq!(m.tasks_per_s, 100.0);
        assert_eq!(m.requests_per_s, 10.0);
        // 1 core for 1 s and 0.5 for 3 s: 2.5 CPU-seconds over 4 s.
        assert_eq!(m.cpu.server_cores, Some(0.625));
        assert_eq!(m.cpu.client_cores, 0.5);
        assert_eq!((m.latency.count, m.latency.p99_us), (40, 90));
        assert_eq!(m.first_error.as_deref(), Some("later"));
    }

    #[test]
    fn extrapolation_adds_growth_for_the_missing_tasks_only() {
        assert_eq!(extrapolate_rss(1_000, 10, 2.0, 110), 1_200.0);
        assert_eq!(extrapolate_rss(1_000, 10, -5.0, 110), 1_000.0);
        assert_eq!(extrapolate_rss(1_000, 200, 2.0, 110), 1_000.0);
    }
}
