//! `belfry bench reminders`: the reminder targets of issue #13, each beside a baseline
//! measured in the same run.
//!
//! 1. **Bulk subscribe**: N numeric ids as NDJSON bodies through the API, against the same
//!    bodies posted to the trivial HTTP handler (the HTTP stack's rate for those bytes).
//!    Server RSS before and after, and the data dir's size, give the cost per subscription.
//! 2. **Restart** after `kill -9` (spawned servers): time until `/readyz`, and the count.
//! 3. **Fan-out** of those N subscribers to a pull consumer, unthrottled: from the due time
//!    to the last chunk acknowledged, every user received once. Baseline: the same number of
//!    chunk-sized tasks, stored in advance, drained by the same consumer.
//! 4. **Paced fan-out** at `--users-per-second`: the delivered rate against the limit.
//! 5. **Feed reads**: U users each subscribed to 1–K of F reminders, read back at random by
//!    C connections for T seconds, against the trivial handler under the same load.

mod consumer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::http::{HttpConn, Target};
use crate::report::{dash, or_dash, ratio, thousands, Report, Table};
use crate::servers::TrivialServer;
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::{new_histogram, record_clamped, Percentiles};
use crate::sys::{dir_bytes, rss_bytes, unix_ms, CpuMeter, Machine};
use crate::{progress, BaselineArgs, OutputArgs, ServerArgs};
use consumer::{drain_users, Drained};

/// Targets of issue #13.
const FANOUT_TARGET_S_AT_10M: f64 = 20.0;
const RATE_ACCURACY_TARGET: f64 = 0.02;
const BULK_IDS_PER_S_TARGET: f64 = 1_000_000.0;
const FEED_RATIO_TARGET: f64 = 0.70;
const FEED_P999_TARGET_US: u64 = 10_000;
const RSS_TARGET_BYTES_AT_10M: f64 = 64.0 * 1024.0 * 1024.0;
const RESTART_TARGET_MS: f64 = 2_000.0;

/// Pause after the subscribe phase before RSS and disk are read.
const SETTLE: Duration = Duration::from_secs(1);
/// Chunks one lease asks for (a chunk of 5,000 numeric ids is about 50 KB).

#[derive(Debug, Clone, clap::Args)]
pub struct RemindersArgs {
    /// Subscribers of the reminder that is bulk-subscribed, restarted and fanned out.
    #[arg(long, default_value_t = 1_000_000)]
    pub subscribers: u64,
    /// Ids per bulk request.
    #[arg(long, default_value_t = 1_000_000)]
    pub ids_per_request: u64,
    /// Bulk requests in flight at once.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Users per fan-out chunk.
    #[arg(long, default_value_t = 5_000)]
    pub chunk_size: u64,
    /// Subscribers of the paced reminder (0: skip the paced phase).
    #[arg(long, default_value_t = 200_000)]
    pub paced_users: u64,
    /// The paced reminder's users_per_second.
    #[arg(long, default_value_t = 50_000)]
    pub users_per_second: u64,
    /// Users of the feed phase (0: skip it).
    #[arg(long, default_value_t = 100_000)]
    pub feed_users: u64,
    /// Reminders of the feed phase.
    #[arg(long, default_value_t = 1_000)]
    pub feed_reminders: u64,
    /// Each feed user is subscribed to 1 to this many reminders.
    #[arg(long, default_value_t = 50)]
    pub feed_max_per_user: u64,
    /// Seconds of feed reads (and of the baseline's).
    #[arg(long, default_value_t = 10)]
    pub feed_seconds: u64,
    /// Connections reading feeds.
    #[arg(long, default_value_t = 32)]
    pub feed_connections: usize,
    /// Skip the kill -9 and restart (always skipped without --spawn).
    #[arg(long)]
    pub no_restart: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub baselines: BaselineArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct RemindersOutcome {
    pub bulk_ids_per_s: f64,
    pub bulk_baseline_ids_per_s: Option<f64>,
    pub rss_before_bytes: Option<u64>,
    pub rss_after_bytes: Option<u64>,
    /// RSS once the store has merged the subscribe's runs (see `settle`).
    pub rss_settled_bytes: Option<u64>,
    pub disk_bytes: Option<u64>,
    pub count_after_subscribe: Option<u64>,
    pub restart_ready_ms: Option<f64>,
    pub count_after_restart: Option<u64>,
    pub fanout_s: Option<f64>,
    pub fanout_users: u64,
    pub fanout_duplicates: u64,
    pub fanout_baseline_s: Option<f64>,
    pub paced_rate: Option<f64>,
    pub paced_users: u64,
    /// The server's CPU while the paced fan-out was drained, in cores.
    pub paced_server_cores: Option<f64>,
    /// Reminders the server held beside the paced one (the feed's, waiting for tomorrow).
    pub paced_other_reminders: u64,
    pub feed: Option<ReadLoad>,
    pub feed_baseline: Option<ReadLoad>,
    /// The trivial handler answering a feed's bytes (the sample answer) instead of `{}`.
    pub feed_baseline_same_bytes: Option<ReadLoad>,
    pub feed_answer_bytes: u64,
    /// Feed reads while the big fan-out runs again (from its due time to its last ack).
    pub feed_during_fanout: Option<ReadLoad>,
    /// That second fan-out's time, under the feed load.
    pub fanout_under_feed_s: Option<f64>,
    pub feed_subscriptions: u64,
    pub feed_nonempty: u64,
    /// Seconds waited after the feed's load for the store to settle its subscription runs,
    /// and how many run files it had when the reads began (`None`: data directory unknown).
    pub feed_settle_s: f64,
    pub feed_runs: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct ReadLoad {
    pub requests_per_s: f64,
    pub errors: u64,
    pub latency: Percentiles,
}

pub async fn run(args: RemindersArgs) -> anyhow::Result<Report> {
    if args.subscribers == 0 || args.chunk_size == 0 || args.ids_per_request == 0 {
        return Err(
            crate::BenchError::invalid("--subscribers", "counts must be at least 1").into(),
        );
    }
    let machine = Machine::describe();
    let mut server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
    let result = measure(&args, &mut server).await;
    server.stop();
    let outcome = result?;
    Ok(build_report(&args, machine, outcome))
}

async fn measure(
    args: &RemindersArgs,
    server: &mut ServerUnderTest,
) -> anyhow::Result<RemindersOutcome> {
    let run = unix_ms();
    let queue = format!("bench-rem-{run}");
    let target = server.target.clone();
    create_queue(&target, &queue, "{}").await?;
    let mut out = RemindersOutcome::default();

    // 1. Bulk subscribe.
    let big = format!("big-{run}");
    bulk_subscribe(args, server, &queue, &big, &mut out).await?;
    let data_dir = after_subscribe(args, server, &big, &mut out).await;

    // 2. kill -9 and restart.
    if !args.no_restart {
        if let Some(spawned) = server.spawned.as_mut() {
            let ready = spawned.kill9_and_restart().await?;
            out.restart_ready_ms = Some(ready.as_secs_f64() * 1_000.0);
            server.pid = spawned.pid();
            out.count_after_restart = count(&target, &big).await;
        }
    }

    // The feed's data, and its reads on a quiet server.
    let feed_paths = if args.feed_users > 0 {
        Some(feed_phase(args, &target, run, data_dir.as_deref(), &mut out).await?)
    } else {
        None
    };

    // 3. Fan-out on a quiet server, and its baseline.
    let (drained, due) = fan_out(args, &target, &queue, &big, None).await?;
    out.fanout_users = drained.users;
    out.fanout_duplicates = drained.duplicates;
    out.fanout_s = drained
        .last_ack_ms
        .map(|t| t.saturating_sub(due) as f64 / 1_000.0);
    out.fanout_baseline_s = Some(baseline_drain(args, &target, run).await?);
    // The same reminder fired again while feeds are read, from its due time to its last ack.
    if let Some(paths) = feed_paths {
        let (drained, due) = fan_out(args, &target, &queue, &big, Some(paths)).await?;
        out.fanout_under_feed_s = drained
            .last_ack_ms
            .map(|t| t.saturating_sub(due) as f64 / 1_000.0);
        out.feed_during_fanout = drained.feed;
    }

    // 4. Paced fan-out.
    if args.paced_users > 0 {
        out.paced_users = args.paced_users;
        out.paced_other_reminders = if args.feed_users > 0 {
            args.feed_reminders.max(1)
        } else {
            0
        };
        (out.paced_rate, out.paced_server_cores) =
            paced(args, &target, &queue, run, server.pid).await?;
    }

    Ok(out)
}

/// Creates reminder `big` in `queue` and subscribes every subscriber to it, timed; then the
/// same requests against the trivial handler, when that baseline is asked for.
async fn bulk_subscribe(
    args: &RemindersArgs,
    server: &ServerUnderTest,
    queue: &str,
    big: &str,
    out: &mut RemindersOutcome,
) -> anyhow::Result<()> {
    let target = &server.target;
    create_reminder(
        target,
        big,
        queue,
        unix_ms() + 86_400_000,
        args.chunk_size,
        None,
    )
    .await?;
    out.rss_before_bytes = server.pid.and_then(rss_bytes).map(|r| r.0);
    let bodies = ndjson_bodies(0, args.subscribers, args.ids_per_request);
    let path = format!("/v1/reminders/{big}/subscribers");
    let started = Instant::now();
    let bar = progress(&args.output, args.subscribers, "bulk subscribe");
    post_all(target, &path, &bodies, args.connections, &bar).await?;
    bar.finish_and_clear();
    out.bulk_ids_per_s = args.subscribers as f64 / started.elapsed().as_secs_f64();
    if args.baselines.wants(crate::Baseline::Http) {
        let trivial = TrivialServer::start(args.baselines.trivial_threads)?;
        let started = Instant::now();
        post_all(
            &trivial.target(),
            &path,
            &bodies,
            args.connections,
            &indicatif::ProgressBar::hidden(),
        )
        .await?;
        out.bulk_baseline_ids_per_s =
            Some(args.subscribers as f64 / started.elapsed().as_secs_f64());
        trivial.stop();
    }
    drop(bodies);
    Ok(())
}

/// What the subscribe left behind: RSS a moment after it and once its runs are merged, the
/// data dir's size, the count. Returns the server's data dir, when known.
async fn after_subscribe(
    args: &RemindersArgs,
    server: &ServerUnderTest,
    big: &str,
    out: &mut RemindersOutcome,
) -> Option<PathBuf> {
    tokio::time::sleep(SETTLE).await;
    out.rss_after_bytes = server.pid.and_then(rss_bytes).map(|r| r.0);
    // Merges of the subscribe's runs may be running at that moment (their output's bloom
    // filter and index are then in memory beside the inputs'); once more when they are done.
    let data_dir = server.data_dir(args.server.server_data_dir.as_deref());
    if settle(&args.output, data_dir.as_deref()).await.is_some() {
        out.rss_settled_bytes = server.pid.and_then(rss_bytes).map(|r| r.0);
    }
    out.disk_bytes = data_dir
        .as_deref()
        .and_then(|dir| dir_bytes(dir).ok())
        .map(|(length, _)| length);
    out.count_after_subscribe = count(&server.target, big).await;
    data_dir
}

/// The feeds' reminders and subscriptions, in a queue of their own so their chunks never
/// mix with the fan-out's; then, once the store has settled, their reads on a quiet server.
/// Returns the feed paths to read again during the fan-out.
async fn feed_phase(
    args: &RemindersArgs,
    target: &Target,
    run: u64,
    data_dir: Option<&Path>,
    out: &mut RemindersOutcome,
) -> anyhow::Result<Arc<Vec<String>>> {
    let feed_queue = format!("bench-rem-feed-{run}");
    create_queue(target, &feed_queue, "{}").await?;
    let paths = feed_setup(args, target, &feed_queue, run, out).await?;
    if let Some((runs, waited)) = settle(&args.output, data_dir).await {
        out.feed_runs = Some(runs);
        out.feed_settle_s = waited.as_secs_f64();
    }
    feed_measure(args, target, paths.clone(), out).await?;
    Ok(paths)
}

/// Fires reminder `id` a second from now and drains its chunks; with `feed`, reads feeds
/// from the due time until the last chunk is acked. Returns what was drained and the due time.
async fn fan_out(
    args: &RemindersArgs,
    target: &Target,
    queue: &str,
    id: &str,
    feed: Option<Arc<Vec<String>>>,
) -> anyhow::Result<(Drained, u64)> {
    let due = unix_ms() + 1_000;
    let during = feed.map(|paths| {
        let (target, stop) = (target.clone(), Arc::new(AtomicBool::new(false)));
        let flag = stop.clone();
        let conns = args.feed_connections;
        let load = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(due.saturating_sub(unix_ms()))).await;
            read_load(&target, paths, conns, flag).await
        });
        (stop, load)
    });
    // A PATCH of the time fires a one-shot reminder again.
    call(
        target,
        Method::PATCH,
        &format!("/v1/reminders/{id}"),
        json!({"run_at_ms": due}),
    )
    .await?;
    let bar = progress(&args.output, args.subscribers, "fan-out");
    let mut drained = drain_users(
        target,
        queue,
        args.subscribers,
        &bar,
        Duration::from_secs(600),
    )
    .await?;
    bar.finish_and_clear();
    if let Some((stop, load)) = during {
        stop.store(true, Ordering::Relaxed);
        drained.feed = load.await.ok();
    }
    Ok((drained, due))
}

async fn create_reminder(
    target: &Target,
    id: &str,
    queue: &str,
    at_ms: u64,
    chunk_size: u64,
    users_per_second: Option<u64>,
) -> anyhow::Result<()> {
    let mut body = json!({"id": id, "queue": queue, "run_at_ms": at_ms,
                          "content": {"title": "bench"}, "chunk_size": chunk_size});
    if let Some(rate) = users_per_second {
        body["users_per_second"] = rate.into();
    }
    call(target, Method::POST, "/v1/reminders", body).await?;
    Ok(())
}

async fn call(target: &Target, method: Method, path: &str, body: Value) -> anyhow::Result<Value> {
    let mut conn = HttpConn::connect(target).await?;
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let answer = conn.expect_success(method, path, body).await?;
    Ok(serde_json::from_slice(&answer).unwrap_or(Value::Null))
}

async fn count(target: &Target, id: &str) -> Option<u64> {
    let answer = call(
        target,
        Method::GET,
        &format!("/v1/reminders/{id}/subscribers/count"),
        Value::Null,
    )
    .await
    .ok()?;
    answer["subscribers"].as_u64()
}

/// NDJSON bodies of the ids `from..to`, `per_body` ids each.
fn ndjson_bodies(from: u64, to: u64, per_body: u64) -> Vec<Bytes> {
    let mut bodies = Vec::new();
    let mut start = from;
    while start < to {
        let end = to.min(start + per_body);
        let mut text = String::with_capacity(((end - start) * 9) as usize);
        for id in start..end {
            text.push_str(&id.to_string());
            text.push('\n');
        }
        bodies.push(Bytes::from(text));
        start = end;
    }
    bodies
}

/// Posts every body, `connections` at a time; the bar counts lines posted.
async fn post_all(
    target: &Target,
    path: &str,
    bodies: &[Bytes],
    connections: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let bodies: Arc<Vec<Bytes>> = Arc::new(bodies.to_vec());
    let mut workers = Vec::new();
    for _ in 0..connections.max(1) {
        let (next, bodies, target, path, bar) = (
            next.clone(),
            bodies.clone(),
            target.clone(),
            path.to_owned(),
            bar.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut conn = HttpConn::connect(&target).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(body) = bodies.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let lines = body.iter().filter(|b| **b == b'\n').count() as u64;
                conn.expect_success(Method::POST, &path, body.clone())
                    .await?;
                bar.inc(lines);
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// The same number of chunk-sized tasks, stored in advance and due at once, drained by the
/// same consumer: seconds from the last submit to the last ack.
async fn baseline_drain(args: &RemindersArgs, target: &Target, run: u64) -> anyhow::Result<f64> {
    let queue = format!("bench-rem-base-{run}");
    create_queue(target, &queue, "{}").await?;
    let chunks = args.subscribers.div_ceil(args.chunk_size);
    let mut conn = HttpConn::connect(target).await?;
    let path = format!("/v1/queues/{queue}/tasks:batch");
    let chunk_task = |k: u64| {
        let users: Vec<String> = (k * args.chunk_size
            ..args.subscribers.min((k + 1) * args.chunk_size))
            .map(|u| u.to_string())
            .collect();
        json!({"payload": {"reminder_id": "base", "content": {"title": "bench"}, "users": users,
                           "chunk": k, "chunks": chunks, "firing": 0, "last": k + 1 == chunks}})
    };
    // Batches of 20 chunks (about 1 MB of numeric ids).
    let mut k = 0;
    while k < chunks {
        let tasks: Vec<Value> = (k..chunks.min(k + 20)).map(chunk_task).collect();
        k += tasks.len() as u64;
        conn.expect_success(
            Method::POST,
            &path,
            Bytes::from(json!({"tasks": tasks}).to_string()),
        )
        .await?;
    }
    let started = unix_ms();
    let drained = drain_users(
        target,
        &queue,
        args.subscribers,
        &indicatif::ProgressBar::hidden(),
        Duration::from_secs(600),
    )
    .await?;
    Ok(drained
        .last_ack_ms
        .unwrap_or(started)
        .saturating_sub(started) as f64
        / 1_000.0)
}

/// The paced reminder: its own users (ids after the big set's), delivered rate measured from
/// the first chunk's receipt to the last's, over the users after the first chunk; and the
/// server's CPU from its due time to the last chunk (a paced fan-out steps the runner at
/// every chunk, so this is what each step costs beside the other reminders it holds).
async fn paced(
    args: &RemindersArgs,
    target: &Target,
    queue: &str,
    run: u64,
    server_pid: Option<u32>,
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let id = format!("paced-{run}");
    let chunk = (args.users_per_second / 50).clamp(1, args.chunk_size);
    create_reminder(
        target,
        &id,
        queue,
        unix_ms() + 86_400_000,
        chunk,
        Some(args.users_per_second),
    )
    .await?;
    let bodies = ndjson_bodies(0, args.paced_users, args.ids_per_request);
    post_all(
        target,
        &format!("/v1/reminders/{id}/subscribers"),
        &bodies,
        1,
        &indicatif::ProgressBar::hidden(),
    )
    .await?;
    let due = unix_ms() + 1_000;
    call(
        target,
        Method::PATCH,
        &format!("/v1/reminders/{id}"),
        json!({"run_at_ms": due}),
    )
    .await?;
    let bar = progress(&args.output, args.paced_users, "paced fan-out");
    let window = Duration::from_secs(60 + 2 * args.paced_users / args.users_per_second.max(1));
    tokio::time::sleep(Duration::from_millis(due.saturating_sub(unix_ms()))).await;
    let cpu = CpuMeter::start(server_pid);
    let drained = drain_users(target, queue, args.paced_users, &bar, window).await?;
    let cores = cpu.stop().server_cores;
    bar.finish_and_clear();
    let (Some(first), Some(last)) = (drained.chunks.first(), drained.chunks.last()) else {
        return Ok((None, cores));
    };
    let seconds = last.0.saturating_sub(first.0) as f64 / 1_000.0;
    let rate = (seconds > 0.0).then(|| (drained.users - first.1) as f64 / seconds);
    Ok((rate, cores))
}

/// A small deterministic hash (splitmix64) for the feed's subscription pattern.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Creates the feed's reminders and subscriptions; returns the feed paths of its users.
async fn feed_setup(
    args: &RemindersArgs,
    target: &Target,
    queue: &str,
    run: u64,
    out: &mut RemindersOutcome,
) -> anyhow::Result<Arc<Vec<String>>> {
    let reminders = args.feed_reminders.max(1);
    let mut members: Vec<Vec<u64>> = vec![Vec::new(); reminders as usize];
    for user in 0..args.feed_users {
        let k = 1 + mix(user) % args.feed_max_per_user.max(1);
        for j in 0..k {
            members[(mix(user ^ (j << 40)) % reminders) as usize].push(user);
        }
    }
    let now = unix_ms();
    let bar = progress(&args.output, reminders, "feed reminders");
    for (r, users) in members.iter_mut().enumerate() {
        let id = format!("feed-{run}-{r}");
        // Due over the day after the first hour (none fires during the run); one in ten
        // urgent.
        let at = now + 3_600_000 + mix(r as u64) % 82_000_000;
        let mut body = json!({"id": id, "queue": queue, "run_at_ms": at, "content": {"title": format!("event {r}"), "body": "x".repeat(200)}});
        if r % 10 == 0 {
            body["priority"] = "urgent".into();
        }
        call(target, Method::POST, "/v1/reminders", body).await?;
        users.sort_unstable();
        users.dedup();
        out.feed_subscriptions += users.len() as u64;
        let text: String = users.iter().map(|u| format!("u{u}\n")).collect();
        call_raw(
            target,
            &format!("/v1/reminders/{id}/subscribers"),
            Bytes::from(text),
        )
        .await?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(Arc::new(
        (0..args.feed_users)
            .map(|u| format!("/v1/users/u{u}/reminders"))
            .collect(),
    ))
}

/// Most run files of a settled subscription tree, and how long to wait for it.
const SETTLED_RUNS: usize = 2;
const SETTLE_WAIT_MAX: Duration = Duration::from_secs(180);

/// Waits until the embedded store has merged the feed's subscription runs (it does once they
/// have been quiet for `subs_settle_after`, 10 s): feeds are read in a steady state, not
/// while the load's runs are still being merged. Counts the `subs/*.run` files of the data
/// directory; without one (a server not spawned, nor `--server-data-dir`) it does not wait
/// and answers `None`. Answers the run files left and how long it waited.
async fn settle(
    output: &OutputArgs,
    data_dir: Option<&std::path::Path>,
) -> Option<(usize, Duration)> {
    let dir = data_dir?.join("subs");
    let runs = || {
        std::fs::read_dir(&dir).map_or(0, |entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "run"))
                .count()
        })
    };
    let bar = progress(
        output,
        SETTLE_WAIT_MAX.as_secs(),
        "store settling (merging runs)",
    );
    let started = Instant::now();
    while runs() > SETTLED_RUNS && started.elapsed() < SETTLE_WAIT_MAX {
        bar.set_position(started.elapsed().as_secs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bar.finish_and_clear();
    Some((runs(), started.elapsed()))
}

/// Feed reads on a quiet server, then the trivial handler under the same load, answering
/// `{}` and answering a real feed's bytes.
async fn feed_measure(
    args: &RemindersArgs,
    target: &Target,
    paths: Arc<Vec<String>>,
    out: &mut RemindersOutcome,
) -> anyhow::Result<()> {
    // One read to check the answers are real, and to size the second baseline.
    let sample = call(target, Method::GET, &paths[0], Value::Null).await?;
    out.feed_nonempty = sample["reminders"].as_array().map_or(0, |r| r.len() as u64);
    let sample_bytes = Bytes::from(sample.to_string());
    out.feed_answer_bytes = sample_bytes.len() as u64;
    let duration = Duration::from_secs(args.feed_seconds.max(1));
    let conns = args.feed_connections;
    out.feed = Some(read_load(target, paths.clone(), conns, timer(duration)).await);
    if args.baselines.wants(crate::Baseline::Http) {
        let trivial = TrivialServer::start(args.baselines.trivial_threads)?;
        out.feed_baseline =
            Some(read_load(&trivial.target(), paths.clone(), conns, timer(duration)).await);
        trivial.stop();
        let trivial = TrivialServer::start_answering(args.baselines.trivial_threads, sample_bytes)?;
        out.feed_baseline_same_bytes =
            Some(read_load(&trivial.target(), paths, conns, timer(duration)).await);
        trivial.stop();
    }
    Ok(())
}

/// A stop flag that turns true after `duration`.
fn timer(duration: Duration) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(duration).await;
        flag.store(true, Ordering::Relaxed);
    });
    stop
}

async fn call_raw(target: &Target, path: &str, body: Bytes) -> anyhow::Result<()> {
    let mut conn = HttpConn::connect(target).await?;
    conn.expect_success(Method::POST, path, body).await?;
    Ok(())
}

/// Closed-loop GETs of random `paths` over `connections` until `stop` turns true.
async fn read_load(
    target: &Target,
    paths: Arc<Vec<String>>,
    connections: usize,
    stop: Arc<AtomicBool>,
) -> ReadLoad {
    let mut workers = Vec::new();
    for c in 0..connections.max(1) {
        let (target, paths, stop) = (target.clone(), paths.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut errors = 0u64;
            let Ok(mut conn) = HttpConn::connect(&target).await else {
                return (histogram, 1);
            };
            let mut i = mix(c as u64);
            while !stop.load(Ordering::Relaxed) {
                i = mix(i);
                let path = &paths[(i % paths.len() as u64) as usize];
                let started = Instant::now();
                match conn.request(Method::GET, path, Bytes::new()).await {
                    Ok((status, _)) if status.is_success() => {
                        record_clamped(&mut histogram, started.elapsed().as_micros() as u64)
                    }
                    _ => errors += 1,
                }
            }
            (histogram, errors)
        }));
    }
    let started = Instant::now();
    let mut total = new_histogram();
    let mut errors = 0;
    for worker in workers {
        if let Ok((h, e)) = worker.await {
            let _ = total.add(&h);
            errors += e;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    ReadLoad {
        requests_per_s: total.len() as f64 / elapsed,
        errors,
        latency: Percentiles::of(&total),
    }
}

fn build_report(args: &RemindersArgs, machine: Machine, o: RemindersOutcome) -> Report {
    let mut table = Table::new(
        format!(
            "reminders: {} subscribers, chunks of {}",
            thousands(args.subscribers as f64),
            args.chunk_size
        ),
        &["measure", "belfry", "baseline", "ratio", "target"],
    );
    subscribe_rows(&mut table, args, &o);
    fanout_rows(&mut table, args, &o);
    if let Some(feed) = &o.feed {
        feed_rows(&mut table, args, &o, feed);
    }
    let notes = report_notes(args, &o);
    Report {
        scenario: "reminders".into(),
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: serde_json::to_value(&o).unwrap_or(Value::Null),
    }
}

/// The bulk subscribe and what it left behind: memory, disk, counts, the restart.
fn subscribe_rows(table: &mut Table, args: &RemindersArgs, o: &RemindersOutcome) {
    let n = args.subscribers as f64;
    table.row(vec![
        "bulk subscribe, ids/s (baseline: trivial handler, same bodies)".into(),
        thousands(o.bulk_ids_per_s),
        or_dash(o.bulk_baseline_ids_per_s, thousands),
        o.bulk_baseline_ids_per_s
            .map_or_else(dash, |b| ratio(o.bulk_ids_per_s, b)),
        format!("≥ {}", thousands(BULK_IDS_PER_S_TARGET)),
    ]);
    let growth = match (o.rss_before_bytes, o.rss_after_bytes) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64),
        _ => None,
    };
    let settled = match (o.rss_before_bytes, o.rss_settled_bytes) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64),
        _ => None,
    };
    table.row(vec![
        "server RSS growth, 1 s after the subscribe / once its runs are merged".into(),
        format!(
            "{} / {}",
            or_dash(growth, |g| format!("{:.1} MiB", g / 1_048_576.0)),
            or_dash(settled, |g| format!("{:.1} MiB", g / 1_048_576.0))
        ),
        dash(),
        dash(),
        format!(
            "≤ {:.0} MiB with 10M",
            RSS_TARGET_BYTES_AT_10M / 1_048_576.0
        ),
    ]);
    table.row(vec![
        "data dir bytes per subscription".into(),
        or_dash(o.disk_bytes.map(|d| d as f64 / n), |b| format!("{b:.1}")),
        dash(),
        dash(),
        "about 8 + overhead".into(),
    ]);
    table.row(vec![
        "count after subscribe / after kill -9 restart".into(),
        format!(
            "{} / {}",
            o.count_after_subscribe
                .map_or_else(dash, |c| thousands(c as f64)),
            o.count_after_restart
                .map_or_else(dash, |c| thousands(c as f64))
        ),
        dash(),
        dash(),
        thousands(n),
    ]);
    table.row(vec![
        "restart after kill -9 until /readyz".into(),
        or_dash(o.restart_ready_ms, |ms| format!("{ms:.0} ms")),
        dash(),
        dash(),
        format!("≤ {RESTART_TARGET_MS:.0} ms"),
    ]);
}

/// The fan-out to every subscriber, then the paced one when it ran.
fn fanout_rows(table: &mut Table, args: &RemindersArgs, o: &RemindersOutcome) {
    let n = args.subscribers as f64;
    table.row(vec![
        "fan-out: due time to last chunk acked (baseline: same chunks stored in advance)".into(),
        or_dash(o.fanout_s, |s| format!("{s:.2} s")),
        or_dash(o.fanout_baseline_s, |s| format!("{s:.2} s")),
        match (o.fanout_s, o.fanout_baseline_s) {
            (Some(a), Some(b)) => ratio(a, b),
            _ => dash(),
        },
        format!(
            "≤ {:.1} s at this count (20 s at 10M)",
            FANOUT_TARGET_S_AT_10M * n / 10_000_000.0
        ),
    ]);
    table.row(vec![
        "fan-out users received / duplicates".into(),
        format!(
            "{} / {}",
            thousands(o.fanout_users as f64),
            o.fanout_duplicates
        ),
        dash(),
        dash(),
        format!("{} / 0", thousands(n)),
    ]);
    if args.paced_users > 0 {
        table.row(vec![
            format!(
                "paced fan-out of {} users: delivered users/s",
                thousands(o.paced_users as f64)
            ),
            or_dash(o.paced_rate, thousands),
            thousands(args.users_per_second as f64),
            o.paced_rate
                .map_or_else(dash, |r| ratio(r, args.users_per_second as f64)),
            format!("within ±{:.0}%", RATE_ACCURACY_TARGET * 100.0),
        ]);
        table.row(vec![
            format!(
                "paced fan-out: server CPU, cores, with {} other reminders waiting",
                thousands(o.paced_other_reminders as f64)
            ),
            or_dash(o.paced_server_cores, |c| format!("{c:.3}")),
            dash(),
            dash(),
            "(context)".into(),
        ]);
    }
}

/// Feed reads: against the baselines, during the fan-out, and their latency.
fn feed_rows(table: &mut Table, args: &RemindersArgs, o: &RemindersOutcome, feed: &ReadLoad) {
    let base = o.feed_baseline.as_ref();
    table.row(vec![
        format!(
            "feed reads/s ({} users, {} subscriptions over {} reminders; {} connections)",
            thousands(args.feed_users as f64),
            thousands(o.feed_subscriptions as f64),
            thousands(args.feed_reminders as f64),
            args.feed_connections
        ),
        thousands(feed.requests_per_s),
        base.map_or_else(dash, |b| thousands(b.requests_per_s)),
        base.map_or_else(dash, |b| ratio(feed.requests_per_s, b.requests_per_s)),
        format!("≥ {:.2}×", FEED_RATIO_TARGET),
    ]);
    if let Some(same) = &o.feed_baseline_same_bytes {
        table.row(vec![
            format!(
                "feed reads/s against the trivial handler answering the same {} B",
                o.feed_answer_bytes
            ),
            thousands(feed.requests_per_s),
            thousands(same.requests_per_s),
            ratio(feed.requests_per_s, same.requests_per_s),
            "(context)".into(),
        ]);
    }
    if let Some(during) = &o.feed_during_fanout {
        feed_during_fanout_rows(table, args, o, feed, during);
    }
    table.row(vec![
        "feed p99 / p99.9 latency".into(),
        format!(
            "{} / {}",
            crate::stats::format_us(feed.latency.p99_us),
            crate::stats::format_us(feed.latency.p999_us)
        ),
        base.map_or_else(dash, |b| {
            format!(
                "{} / {}",
                crate::stats::format_us(b.latency.p99_us),
                crate::stats::format_us(b.latency.p999_us)
            )
        }),
        dash(),
        format!("p99.9 ≤ {}", crate::stats::format_us(FEED_P999_TARGET_US)),
    ]);
}

/// The fan-out run again while the feeds are read: what each does to the other.
fn feed_during_fanout_rows(
    table: &mut Table,
    args: &RemindersArgs,
    o: &RemindersOutcome,
    feed: &ReadLoad,
    during: &ReadLoad,
) {
    let n = args.subscribers as f64;
    table.row(vec![
        format!("the {} fan-out again, while feeds are read", thousands(n)),
        or_dash(o.fanout_under_feed_s, |s| format!("{s:.2} s")),
        or_dash(o.fanout_s, |s| format!("{s:.2} s quiet")),
        match (o.fanout_under_feed_s, o.fanout_s) {
            (Some(a), Some(b)) => ratio(a, b),
            _ => dash(),
        },
        "(context)".into(),
    ]);
    table.row(vec![
        format!(
            "feed reads/s and p99.9 while the {} fan-out runs",
            thousands(n)
        ),
        format!(
            "{} / {}",
            thousands(during.requests_per_s),
            crate::stats::format_us(during.latency.p999_us)
        ),
        dash(),
        ratio(during.requests_per_s, feed.requests_per_s),
        format!("p99.9 ≤ {}", crate::stats::format_us(FEED_P999_TARGET_US)),
    ]);
}

fn report_notes(args: &RemindersArgs, o: &RemindersOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    if o.fanout_users < args.subscribers || o.fanout_duplicates > 0 {
        notes.push(format!(
            "fan-out incomplete: {} of {} users, {} duplicates",
            o.fanout_users, args.subscribers, o.fanout_duplicates
        ));
    }
    if let Some(feed) = &o.feed {
        if feed.errors > 0 {
            notes.push(format!("{} feed requests failed", feed.errors));
        }
        notes.push(format!(
            "a sample feed answer held {} reminders",
            o.feed_nonempty
        ));
        if let Some(runs) = o.feed_runs {
            notes.push(format!(
                "feeds were read once the store held {runs} subscription run files ({:.0} s after the load)",
                o.feed_settle_s
            ));
        }
    }
    notes
}
