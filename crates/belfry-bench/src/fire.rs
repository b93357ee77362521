//! `belfry bench fire`: schedule N tasks due over a short window, consume them (pull
//! leasing with batch acks, or a built-in webhook receiver), and measure delivered tasks/s
//! and firing lateness = receipt time − due time. Early deliveries, losses and duplicates
//! are counted. The Redis sorted-set queue is driven the same way as the baseline.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde::Deserialize;
use serde_json::json;

use crate::error::{within, BenchError};
use crate::http::{HttpConn, Target};
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::plot::{lateness_cdf_svg, Series};
use crate::redis_queue::{self, QueueKeys, RedisServer};
use crate::report::{part_of, thousands, Report, Table};
use crate::servers::WebhookReceiver;
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::{cdf_points_ms, format_us, DeliverySummary, DeliveryTracker};
use crate::sys::{unix_ms, unix_us, CpuMeter, CpuUse, Machine};
use crate::workload::{due_times, validate, Bodies};
use crate::{progress, Baseline, BaselineArgs, OutputArgs, ServerArgs};

/// Ack requests a consumer may have queued for its ackers before it waits: bounds memory
/// (at most 64 bodies of ≤ 1000 acks, ~5 MiB per consumer) and lets acks that fall far
/// behind push back on leasing, as they would for a real consumer.
const ACK_QUEUE_MAX: usize = 64;

/// The server's defaults the webhook run relies on (`webhooks.in_flight_default`,
/// `dispatch.per_target_max`), for the report.
const WEBHOOK_IN_FLIGHT_DEFAULT: u32 = 256;
const DISPATCH_PER_TARGET_DEFAULT: u32 = 64;

/// Brief targets for lateness (at 100k due/s).
const LATENESS_P99_US_TARGET: u64 = 10_000;
const LATENESS_P999_US_TARGET: u64 = 50_000;
/// Brief target for dispatch to pull consumers (burst: all due at once).
const DISPATCH_TASKS_PER_S_TARGET: f64 = 500_000.0;

/// How often the webhook mode checks whether everything arrived.
const WEBHOOK_DONE_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, clap::Args)]
pub struct FireArgs {
    /// Tasks to schedule.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: u64,
    /// Spread the due times evenly over this many seconds (0 = all due at once: a burst,
    /// which measures the drain rate).
    #[arg(long, default_value_t = 20)]
    pub window_s: u64,
    /// The first task is due this long after the run starts, so that submitting finishes
    /// before firing begins (tasks answered after their due time are reported).
    #[arg(long, default_value_t = 5)]
    pub lead_s: u64,
    /// Tasks per submit request.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Submit connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Pull consumers (each with its own lease connection and ack connection).
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// Ack connections per pull consumer (batch acks are sent concurrently on them). Acks
    /// wait for the server's fsync; too few connections would let ack latency, not the
    /// server's dispatch, limit how fast the bench leases.
    #[arg(long, default_value_t = 16)]
    pub ack_connections: usize,
    /// Tasks per lease call (1..=1000); also the Redis claim script's limit.
    #[arg(long, default_value_t = 1_000)]
    pub lease_max: usize,
    /// Long-poll of a lease call when nothing is due.
    #[arg(long, default_value_t = 1_000)]
    pub wait_ms: u64,
    /// Visibility timeout of leases.
    #[arg(long, default_value_t = 30_000)]
    pub visibility_ms: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// After the last due time, wait at most this long for stragglers before counting
    /// the rest as lost.
    #[arg(long, default_value_t = 10)]
    pub grace_s: u64,
    /// Deliver through a webhook queue to a built-in receiver on 127.0.0.1 instead of
    /// pull leasing. (The server must allow loopback webhook targets.)
    #[arg(long)]
    pub webhook: bool,
    /// Cores of other load: this many processes spin on the CPU for the whole run, as other
    /// work on the box would. The same for belfry and its baselines.
    #[arg(long, default_value_t = 0)]
    pub other_load: usize,
    /// Poll interval of the Redis baseline's consumers when nothing is due.
    #[arg(long, default_value_t = 1)]
    pub redis_poll_ms: u64,
    /// Write the lateness CDF of every measured system to this SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Queue to create and use (default: a fresh `bench-fire-<ms>`).
    #[arg(long)]
    pub queue: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub baselines: BaselineArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl FireArgs {
    pub fn validate(&self) -> Result<(), crate::BenchError> {
        use crate::BenchError;
        validate(self.tasks, self.batch, self.connections, self.payload_bytes)?;
        within("--consumers", self.consumers, 1, crate::CONNECTIONS_MAX)?;
        within(
            "--ack-connections",
            self.ack_connections,
            1,
            crate::CONNECTIONS_MAX,
        )?;
        within("--lease-max", self.lease_max, 1, crate::LEASE_TASKS_MAX)?;
        if self.wait_ms > crate::LEASE_WAIT_MS_MAX {
            return Err(BenchError::invalid(
                "--wait-ms",
                format!("must be at most {}", crate::LEASE_WAIT_MS_MAX),
            ));
        }
        if self.tasks > u64::from(u32::MAX) {
            return Err(BenchError::invalid(
                "--tasks",
                "at most 4294967295 for fire",
            ));
        }
        Ok(())
    }
}

/// What the pull consumers saw, for explaining a slow run: how many lease calls, how full,
/// and how long lease and ack calls took on average.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub lease_calls: AtomicU64,
    pub lease_empty: AtomicU64,
    pub lease_errors: AtomicU64,
    pub leased_tasks: AtomicU64,
    pub lease_us_total: AtomicU64,
    pub ack_calls: AtomicU64,
    pub ack_failures: AtomicU64,
    pub ack_us_total: AtomicU64,
}

/// [`ConsumerStats`] at the end of a run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ConsumerSummary {
    pub lease_calls: u64,
    pub lease_empty: u64,
    pub lease_errors: u64,
    pub tasks_per_lease_mean: f64,
    pub lease_ms_mean: f64,
    pub ack_calls: u64,
    pub ack_failures: u64,
    pub ack_ms_mean: f64,
}

impl ConsumerStats {
    /// One lease call, answered or not, that took `took`.
    fn record_lease_call(&self, took: Duration) {
        self.lease_calls.fetch_add(1, Ordering::Relaxed);
        self.lease_us_total
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// One batch ack that took `took`, and whether it succeeded.
    fn record_ack(&self, took: Duration, ok: bool) {
        self.ack_calls.fetch_add(1, Ordering::Relaxed);
        self.ack_us_total
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if !ok {
            self.ack_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn summary(&self) -> ConsumerSummary {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let per = |total: u64, n: u64| if n == 0 { 0.0 } else { total as f64 / n as f64 };
        ConsumerSummary {
            lease_calls: get(&self.lease_calls),
            lease_empty: get(&self.lease_empty),
            lease_errors: get(&self.lease_errors),
            tasks_per_lease_mean: per(get(&self.leased_tasks), get(&self.lease_calls)),
            lease_ms_mean: per(get(&self.lease_us_total), get(&self.lease_calls)) / 1_000.0,
            ack_calls: get(&self.ack_calls),
            ack_failures: get(&self.ack_failures),
            ack_ms_mean: per(get(&self.ack_us_total), get(&self.ack_calls)) / 1_000.0,
        }
    }
}

/// One system's fire run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FireOutcome {
    pub label: String,
    pub delivery: DeliverySummary,
    /// Distinct tasks delivered per second of receipts (first to last).
    pub delivered_per_s: f64,
    pub submit: IngestOutcome,
    pub consume_cpu: CpuUse,
    /// Pull consumers' call statistics (None for webhook and Redis runs).
    pub consumers: Option<ConsumerSummary>,
    /// Connections the webhook receiver accepted (webhook runs only).
    pub receiver_connections: Option<u64>,
    #[serde(skip)]
    pub cdf: Vec<(f64, f64)>,
}

pub async fn run(args: FireArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let machine = Machine::describe();
    // Described before the load starts, so the load average shown is the machine's own.
    let _busy = crate::sys::BusyLoad::start(args.other_load);
    let mut outcomes = Vec::new();
    if !args.server.baselines_only {
        // A webhook to the built-in receiver on 127.0.0.1 needs the SSRF guard's loopback
        // allowance; a server at --url must be configured so by its operator.
        let env: &[(&str, &str)] = if args.webhook {
            &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")]
        } else {
            &[]
        };
        let server = ServerUnderTest::connect_or_spawn(&args.server, env).await?;
        let result = fire_belfry(&args, &server).await;
        server.stop();
        outcomes.push(result?);
    }
    if args.baselines.wants(Baseline::Redis) {
        outcomes.push(fire_redis(&args).await?);
    }
    let picture = match &args.svg {
        Some(path) if !outcomes.is_empty() => {
            let series: Vec<Series> = outcomes
                .iter()
                .map(|o| Series {
                    label: o.label.clone(),
                    points: o.cdf.clone(),
                })
                .collect();
            lateness_cdf_svg(path, &title(&args), &series)?;
            Some(path.display().to_string())
        }
        _ => None,
    };
    Ok(build_report(&args, machine, outcomes, picture))
}

fn title(args: &FireArgs) -> String {
    if args.window_s == 0 {
        format!(
            "firing lateness: {} tasks all due at once",
            thousands(args.tasks as f64)
        )
    } else {
        format!(
            "firing lateness: {} tasks due over {} s ({} due/s)",
            thousands(args.tasks as f64),
            args.window_s,
            thousands(args.tasks as f64 / args.window_s as f64)
        )
    }
}

fn plan(args: &FireArgs) -> (Arc<Vec<u64>>, Arc<Bodies>, Instant) {
    let start_ms = unix_ms() + args.lead_s * 1_000;
    let due = due_times(args.tasks, start_ms, args.window_s * 1_000);
    let bodies = Bodies::build(&due, args.batch, args.payload_bytes);
    let deadline = Instant::now() + Duration::from_secs(args.lead_s + args.window_s + args.grace_s);
    (Arc::new(due), Arc::new(bodies), deadline)
}

/// A lease answer, read borrowing from the response body: the consumer shares the node's
/// cores with the server under test, so it copies no strings and builds no `Value` trees.
#[derive(Deserialize)]
struct LeaseResponse<'a> {
    #[serde(borrow)]
    tasks: Vec<LeasedTask<'a>>,
}

#[derive(Deserialize)]
struct LeasedTask<'a> {
    #[serde(borrow)]
    id: Echo<'a>,
    #[serde(borrow)]
    lease_id: Echo<'a>,
    #[serde(default)]
    payload: Option<PayloadIndex>,
}

/// An id the consumer sends back as it got it: a string (borrowed from the answer when it has
/// no escapes) or a number. Read with a visitor rather than as a `serde_json::Value` or an
/// untagged enum, both of which allocate per task.
pub(crate) enum Echo<'a> {
    Text(Cow<'a, str>),
    Number(u64),
}

impl<'de: 'a, 'a> Deserialize<'de> for Echo<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = Echo<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a non-negative integer")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Echo<'a>, E> {
                Ok(Echo::Text(Cow::Borrowed(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Echo<'a>, E> {
                Ok(Echo::Text(Cow::Owned(v.to_owned())))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Echo<'a>, E> {
                Ok(Echo::Number(v))
            }
        }

        deserializer.deserialize_any(Visitor(std::marker::PhantomData))
    }
}

impl serde::Serialize for Echo<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Echo::Text(text) => serializer.serialize_str(text),
            Echo::Number(n) => serializer.serialize_u64(*n),
        }
    }
}

/// One entry of a batch ack (`{"acks": [...]}`).
#[derive(serde::Serialize)]
pub(crate) struct AckItem<'a> {
    pub(crate) id: &'a Echo<'a>,
    pub(crate) lease_id: &'a Echo<'a>,
}

#[derive(serde::Serialize)]
pub(crate) struct AckBatch<'a> {
    pub(crate) acks: Vec<AckItem<'a>>,
}

impl<'a> AckBatch<'a> {
    /// The batch-ack body of leased tasks' `(id, lease_id)` pairs, echoed as leased.
    pub(crate) fn json(pairs: impl Iterator<Item = (&'a Echo<'a>, &'a Echo<'a>)>) -> Option<Bytes> {
        let acks = pairs
            .map(|(id, lease_id)| AckItem { id, lease_id })
            .collect();
        serde_json::to_vec(&AckBatch { acks }).ok().map(Bytes::from)
    }
}

#[derive(Deserialize)]
struct PayloadIndex {
    i: u64,
}

async fn fire_belfry(args: &FireArgs, server: &ServerUnderTest) -> anyhow::Result<FireOutcome> {
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-fire-{}", unix_ms()));
    let (due, bodies, deadline) = plan(args);
    let tracker = Arc::new(Mutex::new(DeliveryTracker::new(due.as_ref().clone())));
    let bar = progress(&args.output, args.tasks, "belfry deliveries");
    let done = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ConsumerStats::default());

    let receiver = create_fire_queue(args, server, &queue, &tracker, &bar).await?;

    let meter = CpuMeter::start(server.pid);
    let mut consumers = Vec::new();
    if !args.webhook {
        for _ in 0..args.consumers {
            consumers.push(tokio::spawn(pull_consumer(
                server.target.clone(),
                queue.clone(),
                args.clone(),
                tracker.clone(),
                done.clone(),
                stats.clone(),
                deadline,
                bar.clone(),
            )));
        }
    }
    let submit = run_ingest(
        IngestJob {
            label: "belfry submit".into(),
            target: server.target.clone(),
            path: format!("/v1/queues/{queue}/tasks:batch"),
            body_paths: None,
            bodies,
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: Some(due.clone()),
            server_pid: server.pid,
            keep_ids: None,
        },
        indicatif::ProgressBar::hidden(),
    )
    .await;
    let mut receiver_connections = None;
    if let Some(receiver) = receiver {
        receiver_connections = Some(drain_webhooks(receiver, &tracker, deadline).await);
    }
    for c in consumers {
        let _ = c.await;
    }
    let consume_cpu = meter.stop();
    bar.finish_and_clear();
    let label = belfry_label(args.webhook);
    let t = tracker
        .lock()
        .map_err(|_| anyhow::anyhow!("tracker lock poisoned"))?;
    Ok(FireOutcome {
        receiver_connections,
        ..outcome(
            label,
            &t,
            submit,
            consume_cpu,
            (!args.webhook).then(|| stats.summary()),
        )
    })
}

/// Creates the run's queue: delivering to a loopback webhook receiver that records each
/// receipt in `tracker` (returned), or a pull queue.
async fn create_fire_queue(
    args: &FireArgs,
    server: &ServerUnderTest,
    queue: &str,
    tracker: &Arc<Mutex<DeliveryTracker>>,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Option<WebhookReceiver>> {
    if args.webhook {
        let (tracker, bar) = (tracker.clone(), bar.clone());
        let receiver = WebhookReceiver::start(move |body, _headers, receipt_us| {
            if let Some(index) = crate::workload::parse_index(&body) {
                if let Ok(mut t) = tracker.lock() {
                    t.record(index, receipt_us);
                }
            }
            bar.inc(1);
        })
        .await?;
        let config = json!({"delivery": {"type": "webhook", "url": format!("http://{}/hook", receiver.addr)}});
        create_queue(&server.target, queue, &config.to_string()).await?;
        Ok(Some(receiver))
    } else {
        create_queue(&server.target, queue, "{}").await?;
        Ok(None)
    }
}

/// Waits until every task has arrived at `receiver` or `deadline` passed, then stops it;
/// returns the connections it accepted.
async fn drain_webhooks(
    receiver: WebhookReceiver,
    tracker: &Mutex<DeliveryTracker>,
    deadline: Instant,
) -> u64 {
    while Instant::now() < deadline && !tracker.lock().is_ok_and(|t| t.all_delivered()) {
        tokio::time::sleep(WEBHOOK_DONE_POLL).await;
    }
    let connections = receiver.connections();
    receiver.stop().await;
    connections
}

/// Belfry's row label for its delivery mode.
fn belfry_label(webhook: bool) -> &'static str {
    if webhook {
        "belfry (webhook)"
    } else {
        "belfry (pull lease + batch ack)"
    }
}

fn outcome(
    label: &str,
    tracker: &DeliveryTracker,
    submit: IngestOutcome,
    consume_cpu: CpuUse,
    consumers: Option<ConsumerSummary>,
) -> FireOutcome {
    let delivery = tracker.summary();
    let span_s = (delivery.receipt_span_us as f64 / 1e6).max(1e-6);
    FireOutcome {
        label: label.to_string(),
        delivered_per_s: delivery.delivered as f64 / span_s,
        delivery,
        submit,
        consume_cpu,
        consumers,
        receiver_connections: None,
        cdf: cdf_points_ms(tracker.lateness_histogram()),
    }
}

#[allow(clippy::too_many_arguments)] // one consumer's whole context, passed once at spawn
async fn pull_consumer(
    target: Target,
    queue: String,
    args: FireArgs,
    tracker: Arc<Mutex<DeliveryTracker>>,
    done: Arc<AtomicBool>,
    stats: Arc<ConsumerStats>,
    deadline: Instant,
    bar: indicatif::ProgressBar,
) {
    let lease_path = format!("/v1/queues/{queue}/lease");
    let ack_path = format!("/v1/queues/{queue}/ack");
    // Long-polls never outlast the run by more than one wait.
    let lease_body = Bytes::from(
        json!({"max": args.lease_max, "wait_ms": args.wait_ms, "visibility_ms": args.visibility_ms})
            .to_string(),
    );
    let (ack_tx, ack_rx) = tokio::sync::mpsc::channel::<Bytes>(ACK_QUEUE_MAX);
    // Several ack connections per consumer, so a slow ack (an fsync on the server) does
    // not hold back the next lease: real consumers ack concurrently too.
    let ackers = spawn_ackers(&args, &target, &stats, &ack_path, ack_rx);
    let mut conn: Option<HttpConn> = None;
    while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
        if conn.is_none() {
            conn = HttpConn::connect(&target).await.ok();
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let sent = Instant::now();
        let response = c
            .request(Method::POST, &lease_path, lease_body.clone())
            .await;
        let receipt_us = unix_us();
        stats.record_lease_call(sent.elapsed());
        let body = match response {
            Ok((status, body)) if status.is_success() => body,
            Ok(_) => {
                stats.lease_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) => {
                stats.lease_errors.fetch_add(1, Ordering::Relaxed);
                conn = None;
                continue;
            }
        };
        let Ok(leased) = serde_json::from_slice::<LeaseResponse>(&body) else {
            stats.lease_errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if leased.tasks.is_empty() {
            stats.lease_empty.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Some(ack) = record_leased(&leased.tasks, receipt_us, &tracker, &stats, &done, &bar)
        else {
            break;
        };
        if ack_tx.send(ack).await.is_err() {
            break;
        }
    }
    drop(ack_tx);
    for acker in ackers {
        let _ = acker.await;
    }
}

/// `--ack-connections` tasks sending the batch acks from `ack_rx`, each on its own
/// connection, until the channel closes.
fn spawn_ackers(
    args: &FireArgs,
    target: &Target,
    stats: &Arc<ConsumerStats>,
    ack_path: &str,
    ack_rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let ack_rx = Arc::new(tokio::sync::Mutex::new(ack_rx));
    let mut ackers = Vec::with_capacity(args.ack_connections);
    for _ in 0..args.ack_connections {
        let (target, stats, ack_rx, ack_path) = (
            target.clone(),
            stats.clone(),
            ack_rx.clone(),
            ack_path.to_string(),
        );
        ackers.push(tokio::spawn(async move {
            let mut conn = HttpConn::connect(&target).await.ok();
            loop {
                let next = ack_rx.lock().await.recv().await;
                let Some(body) = next else { break };
                let sent = Instant::now();
                let ok = send_ack(&target, &mut conn, &ack_path, body).await;
                stats.record_ack(sent.elapsed(), ok);
                if !ok {
                    conn = None;
                }
            }
        }));
    }
    ackers
}

/// Counts the leased `tasks` in `stats` and records them as received at `receipt_us`
/// (setting `done` once every task has arrived); returns the body of their batch ack, or
/// `None` when the tracker is poisoned or the ack cannot be written, which ends the consumer.
fn record_leased(
    tasks: &[LeasedTask<'_>],
    receipt_us: u64,
    tracker: &Mutex<DeliveryTracker>,
    stats: &ConsumerStats,
    done: &AtomicBool,
    bar: &indicatif::ProgressBar,
) -> Option<Bytes> {
    stats
        .leased_tasks
        .fetch_add(tasks.len() as u64, Ordering::Relaxed);
    let mut acks = Vec::with_capacity(tasks.len());
    {
        let Ok(mut t) = tracker.lock() else {
            return None;
        };
        for task in tasks {
            match &task.payload {
                Some(p) => {
                    t.record(p.i, receipt_us);
                }
                None => {
                    // Not one of ours (or not JSON): record as unknown.
                    t.record(u64::MAX, receipt_us);
                }
            }
            acks.push(AckItem {
                id: &task.id,
                lease_id: &task.lease_id,
            });
        }
        if t.all_delivered() {
            done.store(true, Ordering::Relaxed);
        }
    }
    bar.inc(tasks.len() as u64);
    let ack = serde_json::to_vec(&AckBatch { acks }).ok()?;
    Some(Bytes::from(ack))
}

/// Sends one batch ack on `conn`, as a real client's pool would: a connection the server
/// closed while it sat idle (its keep-alive timeout is shorter than a long `--lead-s`) is
/// replaced before the send, and one that fails in transport is replaced and the ack sent
/// once more (acking twice is harmless: the second answers per task that it is done).
/// Without this, every ack connection's first batch was lost after a lead over 5 s, and
/// those tasks came back when their leases expired.
async fn send_ack(target: &Target, conn: &mut Option<HttpConn>, path: &str, body: Bytes) -> bool {
    for _ in 0..2 {
        if conn.as_ref().is_none_or(HttpConn::is_closed) {
            *conn = HttpConn::connect(target).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            return false;
        };
        match c.expect_success(Method::POST, path, body.clone()).await {
            Ok(_) => return true,
            Err(BenchError::Status { .. }) => return false,
            Err(_) => *conn = None,
        }
    }
    false
}

async fn fire_redis(args: &FireArgs) -> anyhow::Result<FireOutcome> {
    let server = RedisServer::start(&args.baselines)?;
    let result = fire_redis_on(args, &server).await;
    server.stop();
    result
}

async fn fire_redis_on(args: &FireArgs, server: &RedisServer) -> anyhow::Result<FireOutcome> {
    let keys = QueueKeys::new(&format!("bench-fire-{}", unix_ms()));
    let (due, _bodies, deadline) = plan(args);
    let tracker = Arc::new(Mutex::new(DeliveryTracker::new(due.as_ref().clone())));
    let bar = progress(&args.output, args.tasks, "redis deliveries");
    let meter = CpuMeter::start(server.pid);
    let consume = redis_queue::Consume {
        url: server.url.clone(),
        keys: keys.clone(),
        consumers: args.consumers,
        max: args.lease_max,
        poll_interval: Duration::from_millis(args.redis_poll_ms),
        deadline,
    };
    let consumer = tokio::spawn(redis_queue::consume(consume, tracker.clone(), bar.clone()));
    let submit = redis_queue::ingest(
        redis_queue::Submit {
            url: &server.url,
            pid: server.pid,
            keys: &keys,
            batch: args.batch,
            connections: args.connections,
            payload_bytes: args.payload_bytes,
        },
        &due,
        indicatif::ProgressBar::hidden(),
        "redis submit",
    )
    .await?;
    consumer.await??;
    let consume_cpu = meter.stop();
    let _ = redis_queue::delete_queue(&server.url, &keys).await;
    let t = tracker
        .lock()
        .map_err(|_| anyhow::anyhow!("tracker lock poisoned"))?;
    Ok(outcome(
        "Redis ZSET + Lua claim (seeds' design)",
        &t,
        submit,
        consume_cpu,
        None,
    ))
}

fn build_report(
    args: &FireArgs,
    machine: Machine,
    outcomes: Vec<FireOutcome>,
    picture: Option<String>,
) -> Report {
    let mut table = Table::new(
        title(args),
        &[
            "system",
            "delivered",
            "delivered/s",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "early",
            "undelivered",
            "duplicates",
            "submitted/s",
        ],
    );
    let mut notes = Vec::new();
    if args.other_load > 0 {
        notes.push(format!(
            "other load: {} process(es) spinning on the CPU for the whole run (--other-load), as other work on the box would; the load average shown is from before they started.",
            args.other_load
        ));
    }
    for o in &outcomes {
        outcome_row(&mut table, o);
        notes.extend(delivery_notes(args, o));
        notes.extend(cost_notes(o));
    }
    if let Some(b) = outcomes.first().filter(|o| o.label.starts_with("belfry")) {
        notes.extend(target_notes(args, b));
    }
    Report {
        scenario: match (args.webhook, args.window_s == 0) {
            (false, false) => "fire".into(),
            (true, false) => "fire-webhook".into(),
            (false, true) => "fire-burst".into(),
            (true, true) => "fire-webhook-burst".into(),
        },
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture,
        data: json!({
            "tasks": args.tasks,
            "window_s": args.window_s,
            "batch": args.batch,
            "consumers": args.consumers,
            "lease_max": args.lease_max,
            "outcomes": outcomes,
        }),
    }
}

fn outcome_row(table: &mut Table, o: &FireOutcome) {
    let d = &o.delivery;
    table.row(vec![
        o.label.clone(),
        part_of(d.delivered, d.expected),
        thousands(o.delivered_per_s),
        format_us(d.lateness.p50_us),
        format_us(d.lateness.p90_us),
        format_us(d.lateness.p99_us),
        format_us(d.lateness.p999_us),
        format_us(d.lateness.max_us),
        d.early.to_string(),
        d.lost.to_string(),
        d.duplicates.to_string(),
        thousands(o.submit.tasks_per_s),
    ]);
}

/// What went wrong in one system's run: undelivered or early tasks, a late or failing submit.
fn delivery_notes(args: &FireArgs, o: &FireOutcome) -> Vec<String> {
    let d = &o.delivery;
    let mut notes = Vec::new();
    if d.lost > 0 {
        notes.push(format!(
            "{}: {} tasks were not received within {} s after the last due time (the run's \
             end); they may still be pending in the server, so this is lateness beyond the \
             run, not proven loss.",
            o.label, d.lost, args.grace_s
        ));
    }
    notes.extend(d.early_note(&o.label));
    if o.submit.answered_after_due > 0 {
        notes.push(format!(
            "{}: {} tasks were acknowledged by the submit only after their due time (submit \
             took {:.1} s; raise --lead-s): their lateness includes submit delay.",
            o.label, o.submit.answered_after_due, o.submit.elapsed_s
        ));
    }
    if let Some(e) = &o.submit.first_error {
        notes.push(format!(
            "{}: submit errors ({}): {e}",
            o.label, o.submit.rejected
        ));
    }
    notes
}

/// What one system's delivery cost: lease and ack calls, receiver connections, CPU.
fn cost_notes(o: &FireOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(c) = &o.consumers {
        notes.push(format!(
            "{}: {} lease calls ({} empty, {} failed), {:.1} tasks and {:.1} ms each on \
             average; {} batch acks ({} failed), {:.1} ms each.",
            o.label,
            c.lease_calls,
            c.lease_empty,
            c.lease_errors,
            c.tasks_per_lease_mean,
            c.lease_ms_mean,
            c.ack_calls,
            c.ack_failures,
            c.ack_ms_mean
        ));
    }
    if let Some(connections) = o.receiver_connections {
        notes.push(format!(
            "{}: the receiver accepted {} connections for {} deliveries (a queue created with nothing but its URL: in-flight cap {}, at most {} per target host by default).",
            o.label,
            thousands(connections as f64),
            thousands(o.delivery.delivered as f64),
            WEBHOOK_IN_FLIGHT_DEFAULT,
            DISPATCH_PER_TARGET_DEFAULT
        ));
    }
    let cpu = &o.consume_cpu;
    notes.push(format!(
        "{}: during the run the load generator used {:.2} cores{}{}.",
        o.label,
        cpu.client_cores,
        cpu.server_cores
            .map(|s| format!(", the server {s:.2} cores"))
            .unwrap_or_default(),
        if cpu.client_saturated() {
            " — it saturated a core and may have limited the result"
        } else {
            ""
        }
    ));
    notes
}

/// Belfry's lateness (and, for a pull burst, dispatch rate) against the brief's targets.
fn target_notes(args: &FireArgs, b: &FireOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    let l = &b.delivery.lateness;
    let rate = if args.window_s == 0 {
        "a burst".to_string()
    } else {
        format!(
            "{} due/s",
            thousands(args.tasks as f64 / args.window_s as f64)
        )
    };
    notes.push(format!(
        "targets (brief, at 100k due/s; this run: {rate}): p99 ≤ {} {}, p99.9 ≤ {} {}, never early {}.",
        format_us(LATENESS_P99_US_TARGET),
        met(l.p99_us <= LATENESS_P99_US_TARGET),
        format_us(LATENESS_P999_US_TARGET),
        met(l.p999_us <= LATENESS_P999_US_TARGET),
        met(b.delivery.early == 0)
    ));
    if args.window_s == 0 && !args.webhook {
        notes.push(format!(
            "target pull dispatch ≥ {} tasks/s: {} ({} tasks/s).",
            thousands(DISPATCH_TASKS_PER_S_TARGET),
            met(b.delivered_per_s >= DISPATCH_TASKS_PER_S_TARGET),
            thousands(b.delivered_per_s)
        ));
    }
    notes
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}
