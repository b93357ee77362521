//! `belfry bench queues`: many webhook queues due together against one queue holding the same
//! tasks, in the same run, delivered to the same loopback webhook receiver.
//!
//! N queues of M tasks each fall due within a short window (default 200 ms); the baseline is
//! one queue with the same N×M due times. For each we report the delivery time (first due →
//! last delivered), lateness, the server's CPU seconds and peak RSS (from /proc of the
//! spawned server), duplicate deliveries (by `Belfry-Task-Id`), lost tasks, and the server's
//! refused claims of its own work (`belfry_dispatch_claim_errors_total` from `/metrics`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde_json::json;

use crate::error::{within, BenchError};
use crate::http::{HttpConn, Target};
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::report::{or_dash, part_of, ratio, thousands, Report, Table};
use crate::servers::WebhookReceiver;
use crate::spawn::ServerUnderTest;
use crate::stats::{format_us, DeliverySummary, DeliveryTracker};
use crate::sys::{cpu_time, rss_bytes, unix_ms, Machine};
use crate::workload::{due_times, payload, Bodies};
use crate::{progress, OutputArgs, ServerArgs, BATCH_TASKS_MAX, CONNECTIONS_MAX};

/// Targets of the issue: many queues cost at most this much more than one queue holding the
/// same tasks (delivery time and server CPU), ...
pub const RATIO_TARGET: f64 = 1.5;
/// ... at most this much more peak RSS, ...
pub const RSS_EXTRA_TARGET_BYTES: u64 = 64 * 1024 * 1024;
/// ... and no refused claims of the server's own work.
pub const CLAIM_ERRORS_METRIC: &str = "belfry_dispatch_claim_errors_total";

/// Most queues one run creates: each is a queue record on the server and a name in the
/// bench; 100,000 keeps a run within minutes.
pub const QUEUES_MAX: usize = 100_000;

/// Most tasks one run submits (the receiver's bookkeeping holds one id per task).
pub const TASKS_MAX: u64 = 10_000_000;

/// How often the run checks whether everything arrived.
const DONE_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueuesBaseline {
    /// One queue holding all N×M tasks, same due times, same receiver.
    SingleQueue,
    /// No baseline.
    None,
}

#[derive(Debug, Clone, clap::Args)]
pub struct QueuesArgs {
    /// Webhook queues (N).
    #[arg(long, default_value_t = 1_000)]
    pub queues: usize,
    /// Tasks per queue (M).
    #[arg(long, default_value_t = 20)]
    pub tasks_per_queue: usize,
    /// All N×M due times lie within this many milliseconds, spread evenly and interleaved
    /// across the queues.
    #[arg(long, default_value_t = 200)]
    pub spread_ms: u64,
    /// The first task is due this long after the queues exist, so that submitting finishes
    /// before firing begins (tasks answered after their due time are reported).
    #[arg(long, default_value_t = 5)]
    pub lead_s: u64,
    /// After the last due time, wait at most this long before counting the rest as lost.
    #[arg(long, default_value_t = 60)]
    pub grace_s: u64,
    /// Connections for creating queues and submitting tasks.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// The baseline measured in the same run.
    #[arg(long, value_enum, default_value_t = QueuesBaseline::SingleQueue)]
    pub baseline: QueuesBaseline,
    /// Prefix of the queue names (default: `bench-q-<ms>`).
    #[arg(long)]
    pub queue_prefix: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl QueuesArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        within("--queues", self.queues, 1, QUEUES_MAX)?;
        if self.tasks_per_queue == 0 {
            return Err(BenchError::invalid(
                "--tasks-per-queue",
                "must be at least 1",
            ));
        }
        if self.total_tasks() > TASKS_MAX {
            return Err(BenchError::invalid(
                "--tasks-per-queue",
                format!("--queues × --tasks-per-queue must be at most {TASKS_MAX}"),
            ));
        }
        crate::workload::validate(
            self.total_tasks(),
            BATCH_TASKS_MAX,
            self.connections,
            self.payload_bytes,
        )?;
        if self.server.baselines_only {
            return Err(BenchError::invalid(
                "--baselines-only",
                "the baseline of queues is belfry itself (one queue); use --baseline none to skip it",
            ));
        }
        Ok(())
    }

    fn total_tasks(&self) -> u64 {
        self.queues as u64 * self.tasks_per_queue as u64
    }
}

/// One shape of the same tasks: `queues` queues of `per_queue` tasks.
#[derive(Debug, Clone, Copy)]
struct Shape {
    queues: usize,
    per_queue: usize,
}

/// Due times and request bodies of one shape. Task `i` belongs to queue `i / per_queue`;
/// the due times are the same set for every shape (N×M times spread over the window), dealt
/// out so that each queue's tasks span the whole window and the queues interleave.
struct Plan {
    due: Arc<Vec<u64>>,
    bodies: Arc<Bodies>,
    paths: Arc<Vec<String>>,
}

fn plan(shape: Shape, names: &[String], first_due_ms: u64, spread_ms: u64, bytes: usize) -> Plan {
    let total = shape.queues as u64 * shape.per_queue as u64;
    let base = due_times(total, first_due_ms, spread_ms);
    let mut due = Vec::with_capacity(base.len());
    for q in 0..shape.queues {
        for k in 0..shape.per_queue {
            due.push(base[k * shape.queues + q]);
        }
    }
    let mut bodies = Vec::new();
    let mut first = Vec::new();
    let mut paths = Vec::new();
    for (q, name) in names.iter().enumerate().take(shape.queues) {
        let start = q * shape.per_queue;
        let mut from = start;
        while from < start + shape.per_queue {
            let to = (from + BATCH_TASKS_MAX).min(start + shape.per_queue);
            let mut body = String::from("{\"tasks\":[");
            for (i, due_ms) in due.iter().enumerate().take(to).skip(from) {
                if i > from {
                    body.push(',');
                }
                body.push_str(&format!(
                    "{{\"payload\":{},\"run_at_ms\":{due_ms}}}",
                    payload(i as u64, bytes)
                ));
            }
            body.push_str("]}");
            bodies.push(Bytes::from(body));
            first.push(from as u64);
            paths.push(format!("/v1/queues/{name}/tasks:batch"));
            from = to;
        }
    }
    Plan {
        due: Arc::new(due),
        bodies: Arc::new(Bodies {
            batch: BATCH_TASKS_MAX,
            bodies,
            first,
            tasks: total,
        }),
        paths: Arc::new(paths),
    }
}

/// What the webhook receiver saw: receipts by payload index (lateness, early, lost), and by
/// `Belfry-Task-Id` (duplicates as the server counts tasks).
struct Inbox {
    tracker: DeliveryTracker,
    by_id: HashMap<Box<str>, u32>,
    without_id: u64,
}

impl Inbox {
    fn new(due: Vec<u64>) -> Self {
        Inbox {
            tracker: DeliveryTracker::new(due),
            by_id: HashMap::new(),
            without_id: 0,
        }
    }

    fn duplicates_by_id(&self) -> u64 {
        self.by_id.values().map(|&n| u64::from(n) - 1).sum()
    }

    /// From the first due time to the last receipt, in ms.
    fn delivery_time_ms(&self, first_due_ms: u64) -> Option<f64> {
        self.tracker
            .last_receipt_us()
            .map(|last| last.saturating_sub(first_due_ms * 1_000) as f64 / 1_000.0)
    }
}

/// One shape's run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VariantOutcome {
    pub label: String,
    pub queues: usize,
    pub tasks_per_queue: usize,
    pub create_s: f64,
    pub create_failures: u64,
    pub submit: IngestOutcome,
    pub delivery: DeliverySummary,
    /// First due time → last receipt, ms (None when nothing arrived).
    pub delivery_time_ms: Option<f64>,
    pub duplicates_by_id: u64,
    pub receipts_without_id: u64,
    /// Server CPU seconds from the end of the submit to the last receipt (or the deadline).
    pub server_cpu_delivery_s: Option<f64>,
    /// Server CPU seconds of the submit.
    pub server_cpu_submit_s: Option<f64>,
    pub rss_idle_bytes: Option<u64>,
    pub rss_end_bytes: Option<u64>,
    pub rss_peak_bytes: Option<u64>,
    /// `belfry_dispatch_claim_errors_total` at the end of the run; None when the server
    /// does not expose it.
    pub claim_errors: Option<u64>,
    /// The server is a fresh process for this shape (peak RSS and CPU are its own).
    pub fresh_server: bool,
}

pub async fn run(args: QueuesArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let machine = Machine::describe();
    let prefix = args
        .queue_prefix
        .clone()
        .unwrap_or_else(|| format!("bench-q-{}", unix_ms()));
    let mut outcomes = Vec::new();
    if args.baseline == QueuesBaseline::SingleQueue {
        let shape = Shape {
            queues: 1,
            per_queue: args.queues * args.tasks_per_queue,
        };
        outcomes.push(run_shape(&args, shape, &format!("{prefix}-one"), "1 queue").await?);
    }
    let shape = Shape {
        queues: args.queues,
        per_queue: args.tasks_per_queue,
    };
    let label = format!("{} queues", thousands(args.queues as f64));
    outcomes.push(run_shape(&args, shape, &format!("{prefix}-many"), &label).await?);
    Ok(build_report(&args, machine, outcomes))
}

async fn run_shape(
    args: &QueuesArgs,
    shape: Shape,
    prefix: &str,
    label: &str,
) -> anyhow::Result<VariantOutcome> {
    // The receiver is on 127.0.0.1: the spawned server must allow private webhook targets
    // (a server at --url must be configured so by its operator).
    let server = ServerUnderTest::connect_or_spawn(
        &args.server,
        &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")],
    )
    .await?;
    let result = run_shape_on(args, shape, prefix, label, &server).await;
    server.stop();
    result
}

async fn run_shape_on(
    args: &QueuesArgs,
    shape: Shape,
    prefix: &str,
    label: &str,
    server: &ServerUnderTest,
) -> anyhow::Result<VariantOutcome> {
    let total = shape.queues as u64 * shape.per_queue as u64;
    let rss_idle = server.pid.and_then(rss_bytes).map(|r| r.0);
    let inbox = Arc::new(Mutex::new(Inbox::new(Vec::new())));
    let bar = progress(&args.output, total, &format!("{label}: deliveries"));
    let receiver = start_receiver(inbox.clone(), bar.clone()).await?;

    let names: Vec<String> = (0..shape.queues).map(|q| format!("{prefix}-{q}")).collect();
    let created = create_shape_queues(args, server, label, &names, &receiver).await;
    if created.ok == 0 {
        receiver.stop().await;
        anyhow::bail!(
            "{label}: no queue could be created: {}",
            created.first_error.unwrap_or_default()
        );
    }

    let first_due_ms = unix_ms() + args.lead_s * 1_000;
    let (plan, deadline) = plan_deliveries(args, shape, &names, first_due_ms, &inbox);

    let cpu_before_submit = server.pid.and_then(|p| cpu_time(&p.to_string()));
    let submit = submit_plan(args, server, label, &plan).await;
    let cpu_after_submit = server.pid.and_then(|p| cpu_time(&p.to_string()));

    // Everything accepted has arrived, or the deadline passed.
    wait_for_deliveries(&inbox, submit.accepted, deadline).await;
    let cpu_end = server.pid.and_then(|p| cpu_time(&p.to_string()));
    let rss = server.pid.and_then(rss_bytes);
    let claim_errors = scrape_counter(&server.target, CLAIM_ERRORS_METRIC).await;
    bar.finish_and_clear();
    receiver.stop().await;

    let inbox = inbox
        .lock()
        .map_err(|_| anyhow::anyhow!("receiver state poisoned"))?;
    Ok(VariantOutcome {
        label: label.to_string(),
        queues: shape.queues,
        tasks_per_queue: shape.per_queue,
        create_s: created.elapsed_s,
        create_failures: created.failed,
        submit,
        delivery: inbox.tracker.summary(),
        delivery_time_ms: inbox.delivery_time_ms(first_due_ms),
        duplicates_by_id: inbox.duplicates_by_id(),
        receipts_without_id: inbox.without_id,
        server_cpu_delivery_s: seconds_between(cpu_after_submit, cpu_end),
        server_cpu_submit_s: seconds_between(cpu_before_submit, cpu_after_submit),
        rss_idle_bytes: rss_idle,
        rss_end_bytes: rss.map(|r| r.0),
        rss_peak_bytes: rss.map(|r| r.1),
        claim_errors,
        fresh_server: server.spawned.is_some(),
    })
}

/// Creates the shape's queues `names`, each delivering to `receiver`.
async fn create_shape_queues(
    args: &QueuesArgs,
    server: &ServerUnderTest,
    label: &str,
    names: &[String],
    receiver: &WebhookReceiver,
) -> Created {
    create_webhook_queues(
        &server.target,
        names,
        &format!("http://{}/hook", receiver.addr),
        args.connections,
        progress(
            &args.output,
            names.len() as u64,
            &format!("{label}: create queues"),
        ),
    )
    .await
}

/// The tasks of `shape` from `first_due_ms` on, with `inbox` expecting them; and the
/// deadline for their deliveries, `--grace-s` after the last due time.
fn plan_deliveries(
    args: &QueuesArgs,
    shape: Shape,
    names: &[String],
    first_due_ms: u64,
    inbox: &Mutex<Inbox>,
) -> (Plan, Instant) {
    let plan = plan(
        shape,
        names,
        first_due_ms,
        args.spread_ms,
        args.payload_bytes,
    );
    if let Ok(mut inbox) = inbox.lock() {
        *inbox = Inbox::new(plan.due.as_ref().clone());
    }
    let last_due_ms = plan.due.iter().copied().max().unwrap_or(first_due_ms);
    let deadline = Instant::now()
        + Duration::from_millis(last_due_ms.saturating_sub(unix_ms()))
        + Duration::from_secs(args.grace_s);
    (plan, deadline)
}

/// The loopback webhook receiver, recording each receipt in `inbox` by payload index and
/// by task id.
async fn start_receiver(
    inbox: Arc<Mutex<Inbox>>,
    bar: indicatif::ProgressBar,
) -> anyhow::Result<WebhookReceiver> {
    let receiver = WebhookReceiver::start(move |body, headers, receipt_us| {
        let index = crate::workload::parse_index(&body).unwrap_or(u64::MAX);
        let id = headers.get("belfry-task-id").and_then(|v| v.to_str().ok());
        if let Ok(mut inbox) = inbox.lock() {
            inbox.tracker.record(index, receipt_us);
            match id {
                Some(id) => *inbox.by_id.entry(id.into()).or_insert(0) += 1,
                None => inbox.without_id += 1,
            }
        }
        bar.inc(1);
    })
    .await?;
    Ok(receiver)
}

/// Submits the plan's tasks, each request to its own queue's path.
async fn submit_plan(
    args: &QueuesArgs,
    server: &ServerUnderTest,
    label: &str,
    plan: &Plan,
) -> IngestOutcome {
    run_ingest(
        IngestJob {
            label: format!("{label}: submit"),
            target: server.target.clone(),
            path: String::new(),
            body_paths: Some(plan.paths.clone()),
            bodies: plan.bodies.clone(),
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: Some(plan.due.clone()),
            server_pid: server.pid,
            keep_ids: None,
        },
        indicatif::ProgressBar::hidden(),
    )
    .await
}

/// Returns once `accepted` tasks (at least one) have arrived, or at `deadline`.
async fn wait_for_deliveries(inbox: &Mutex<Inbox>, accepted: u64, deadline: Instant) {
    while Instant::now() < deadline
        && inbox
            .lock()
            .is_ok_and(|i| i.tracker.delivered() < accepted.max(1))
    {
        tokio::time::sleep(DONE_POLL).await;
    }
}

/// CPU seconds from `a` to `b`, when both were read.
fn seconds_between(a: Option<Duration>, b: Option<Duration>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64()),
        _ => None,
    }
}

/// The outcome of creating queues.
#[derive(Debug, Clone, Default)]
pub struct Created {
    pub ok: u64,
    pub failed: u64,
    pub first_error: Option<String>,
    pub elapsed_s: f64,
}

/// Creates every queue in `names` as a webhook queue to `url` (each to `url/<name>`), over
/// `connections` concurrent connections.
pub async fn create_webhook_queues(
    target: &Target,
    names: &[String],
    url: &str,
    connections: usize,
    bar: indicatif::ProgressBar,
) -> Created {
    let bodies: Vec<(String, Bytes)> = names
        .iter()
        .map(|name| {
            let config = json!({"delivery": {"type": "webhook", "url": format!("{url}/{name}")}});
            (
                format!("/v1/queues/{name}"),
                Bytes::from(config.to_string()),
            )
        })
        .collect();
    send_all(target, Method::PUT, Arc::new(bodies), connections, bar).await
}

/// Sends every `(path, body)` with `method` over `connections` connections; a non-2xx
/// answer is a failure.
pub async fn send_all(
    target: &Target,
    method: Method,
    requests: Arc<Vec<(String, Bytes)>>,
    connections: usize,
    bar: indicatif::ProgressBar,
) -> Created {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let mut workers = Vec::new();
    for _ in 0..connections.clamp(1, CONNECTIONS_MAX) {
        let (target, method, requests, next, ok, failed, first_error, bar) = (
            target.clone(),
            method.clone(),
            requests.clone(),
            next.clone(),
            ok.clone(),
            failed.clone(),
            first_error.clone(),
            bar.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut conn: Option<HttpConn> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, body)) = requests.get(i) else {
                    break;
                };
                if conn.is_none() {
                    conn = HttpConn::connect(&target).await.ok();
                }
                let result = match conn.as_mut() {
                    Some(c) => c.expect_success(method.clone(), path, body.clone()).await,
                    None => Err(BenchError::Server(format!(
                        "cannot connect to {}",
                        target.addr
                    ))),
                };
                match result {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut first) = first_error.lock() {
                            first.get_or_insert_with(|| e.to_string());
                        }
                        conn = None;
                    }
                }
                bar.inc(1);
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    bar.finish_and_clear();
    let first_error = first_error.lock().ok().and_then(|mut e| e.take());
    Created {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        first_error,
        elapsed_s: started.elapsed().as_secs_f64(),
    }
}

/// The sum of every series of counter `name` in the server's `/metrics`, or None when the
/// server does not expose it (or /metrics cannot be read).
pub async fn scrape_counter(target: &Target, name: &str) -> Option<u64> {
    let mut conn = HttpConn::connect(target).await.ok()?;
    let (status, body) = conn
        .request(Method::GET, "/metrics", Bytes::new())
        .await
        .ok()?;
    if !status.is_success() {
        return None;
    }
    counter_value(&String::from_utf8_lossy(&body), name)
}

/// The sum of the samples of `name` in Prometheus text, or None when there is none.
pub fn counter_value(text: &str, name: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name 3` or `name{labels} 3`, not `name_other 3`.
        let value = match rest.chars().next() {
            Some(' ') => rest.trim(),
            Some('{') => rest.rsplit_once('}').map_or("", |(_, v)| v.trim()),
            _ => continue,
        };
        let value = value.split_whitespace().next().unwrap_or("");
        if let Ok(v) = value.parse::<f64>() {
            found = Some(found.unwrap_or(0) + v.max(0.0) as u64);
        }
    }
    found
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "not measured",
    }
}

fn build_report(args: &QueuesArgs, machine: Machine, outcomes: Vec<VariantOutcome>) -> Report {
    let mut table = queues_table(args);
    let mut notes = Vec::new();
    for o in &outcomes {
        variant_row(&mut table, o);
        notes.push(setup_note(args, o));
        notes.extend(variant_notes(args, o));
    }
    let mut tables = vec![table];
    if let [one, many] = &outcomes[..] {
        tables.push(targets_table(one, many));
    } else if let Some(many) = outcomes.last() {
        notes.push(format!(
            "{}: no single-queue baseline in this run (--baseline none); claim errors {}.",
            many.label,
            many.claim_errors.unwrap_or(0)
        ));
    }
    notes.push(
        "delivery time = last receipt − first due time; lateness = receipt − the task's due time, \
         on this machine's clock; server CPU from /proc/PID/stat of the server (delivery: from \
         the end of the submit, which ends before the first due time, to the last receipt)."
            .into(),
    );
    Report {
        scenario: "queues".into(),
        command: crate::command_line(),
        machine,
        tables,
        notes,
        picture: None,
        data: json!({
            "queues": args.queues,
            "tasks_per_queue": args.tasks_per_queue,
            "spread_ms": args.spread_ms,
            "outcomes": outcomes,
        }),
    }
}

/// The empty table of the shapes, titled with the run's size.
fn queues_table(args: &QueuesArgs) -> Table {
    let title = format!(
        "{} webhook queues × {} tasks vs 1 queue × {} tasks, all due within {} ms, one loopback receiver",
        thousands(args.queues as f64),
        thousands(args.tasks_per_queue as f64),
        thousands(args.total_tasks() as f64),
        args.spread_ms
    );
    Table::new(
        title,
        &[
            "system",
            "delivered",
            "delivery time (first due → last delivered)",
            "p50",
            "p99",
            "max",
            "server CPU s, delivery",
            "server CPU s, submit",
            "peak RSS",
            "duplicates (by task id)",
            "lost",
            "claim errors (overloaded)",
            "submitted/s",
        ],
    )
}

fn variant_row(table: &mut Table, o: &VariantOutcome) {
    let d = &o.delivery;
    table.row(vec![
        o.label.clone(),
        part_of(d.delivered, d.expected),
        or_dash(o.delivery_time_ms, |ms| format_us((ms * 1_000.0) as u64)),
        format_us(d.lateness.p50_us),
        format_us(d.lateness.p99_us),
        format_us(d.lateness.max_us),
        or_dash(o.server_cpu_delivery_s, |s| format!("{s:.2}")),
        or_dash(o.server_cpu_submit_s, |s| format!("{s:.2}")),
        or_dash(o.rss_peak_bytes, mib),
        o.duplicates_by_id.to_string(),
        d.lost.to_string(),
        or_dash(o.claim_errors, |n| n.to_string()),
        thousands(o.submit.tasks_per_s),
    ]);
}

/// How one shape was set up: queues created, tasks submitted, RSS before and after.
fn setup_note(args: &QueuesArgs, o: &VariantOutcome) -> String {
    format!(
        "{}: {} queue(s) created in {:.2} s ({} failed); {} tasks submitted in {} requests \
         over {} connections in {:.2} s; RSS idle {} → {} after delivery.",
        o.label,
        thousands(o.queues as f64),
        o.create_s,
        o.create_failures,
        thousands(o.submit.accepted as f64),
        thousands(o.submit.requests as f64),
        args.connections,
        o.submit.elapsed_s,
        or_dash(o.rss_idle_bytes, mib),
        or_dash(o.rss_end_bytes, mib),
    )
}

/// What a reader of one shape's row must not miss: missing metrics, lost, early or
/// duplicate deliveries, a late or failing submit, a server shared with the other shape.
fn variant_notes(args: &QueuesArgs, o: &VariantOutcome) -> Vec<String> {
    let d = &o.delivery;
    let mut notes = Vec::new();
    if o.claim_errors.is_none() {
        notes.push(format!(
            "{}: the server does not expose {CLAIM_ERRORS_METRIC}; counted as 0.",
            o.label
        ));
    }
    if d.lost > 0 {
        notes.push(format!(
            "{}: {} tasks were not received within {} s after the last due time.",
            o.label, d.lost, args.grace_s
        ));
    }
    notes.extend(d.early_note(&o.label));
    if d.duplicates != o.duplicates_by_id {
        notes.push(format!(
            "{}: {} duplicates by payload index, {} by task id.",
            o.label, d.duplicates, o.duplicates_by_id
        ));
    }
    if o.receipts_without_id > 0 || d.unknown > 0 {
        notes.push(format!(
            "{}: {} receipts without a Belfry-Task-Id header, {} with a payload the bench did not send.",
            o.label, o.receipts_without_id, d.unknown
        ));
    }
    if o.submit.answered_after_due > 0 {
        notes.push(format!(
            "{}: {} tasks were acknowledged only after their due time (submit took {:.1} s; \
             raise --lead-s): their lateness includes submit delay.",
            o.label, o.submit.answered_after_due, o.submit.elapsed_s
        ));
    }
    if let Some(e) = &o.submit.first_error {
        notes.push(format!(
            "{}: submit errors ({} tasks): {e}",
            o.label, o.submit.rejected
        ));
    }
    if !o.fresh_server {
        notes.push(format!(
            "{}: measured on a server that also ran the other shape: peak RSS and CPU \
             are not this shape's alone (use --spawn).",
            o.label
        ));
    }
    notes
}

/// Many queues against the single queue, target by target.
fn targets_table(one: &VariantOutcome, many: &VariantOutcome) -> Table {
    let mut t = Table::new(
        format!("targets: {} against {}", many.label, one.label),
        &[
            "measure",
            &many.label,
            &one.label,
            "ratio",
            "target",
            "verdict",
        ],
    );
    let time = |o: &VariantOutcome| o.delivery_time_ms.filter(|_| o.delivery.lost == 0);
    let within = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a <= b * RATIO_TARGET),
        _ => None,
    };
    t.row(vec![
        "delivery time".into(),
        or_dash(many.delivery_time_ms, |ms| format_us((ms * 1_000.0) as u64)),
        or_dash(one.delivery_time_ms, |ms| format_us((ms * 1_000.0) as u64)),
        ratio(
            many.delivery_time_ms.unwrap_or(0.0),
            one.delivery_time_ms.unwrap_or(0.0),
        ),
        format!("≤ {RATIO_TARGET}× (and nothing lost)"),
        if one.delivery.lost > 0 {
            format!(
                "no baseline: the single queue did not deliver {} of its tasks",
                thousands(one.delivery.lost as f64)
            )
        } else {
            verdict(within(time(many), time(one)).or((many.delivery.lost > 0).then_some(false)))
                .into()
        },
    ]);
    t.row(vec![
        "server CPU s, delivery".into(),
        or_dash(many.server_cpu_delivery_s, |s| format!("{s:.2}")),
        or_dash(one.server_cpu_delivery_s, |s| format!("{s:.2}")),
        ratio(
            many.server_cpu_delivery_s.unwrap_or(0.0),
            one.server_cpu_delivery_s.unwrap_or(0.0),
        ),
        format!("≤ {RATIO_TARGET}×"),
        verdict(within(
            many.server_cpu_delivery_s,
            one.server_cpu_delivery_s,
        ))
        .into(),
    ]);
    let extra = match (many.rss_peak_bytes, one.rss_peak_bytes) {
        (Some(m), Some(o)) if many.fresh_server && one.fresh_server => Some(m as i64 - o as i64),
        _ => None,
    };
    t.row(vec![
        "peak RSS".into(),
        or_dash(many.rss_peak_bytes, mib),
        or_dash(one.rss_peak_bytes, mib),
        or_dash(extra, |e| {
            format!("{}{}", if e < 0 { "−" } else { "+" }, mib(e.unsigned_abs()))
        }),
        format!("≤ +{}", mib(RSS_EXTRA_TARGET_BYTES)),
        verdict(extra.map(|e| e <= RSS_EXTRA_TARGET_BYTES as i64)).into(),
    ]);
    t.row(vec![
        "claim errors (overloaded)".into(),
        many.claim_errors.unwrap_or(0).to_string(),
        one.claim_errors.unwrap_or(0).to_string(),
        "-".into(),
        "0".into(),
        verdict(Some(many.claim_errors.unwrap_or(0) == 0)).into(),
    ]);
    t.row(vec![
        "duplicates / lost".into(),
        format!("{} / {}", many.duplicates_by_id, many.delivery.lost),
        format!("{} / {}", one.duplicates_by_id, one.delivery.lost),
        "-".into(),
        "0 / 0".into(),
        verdict(Some(many.duplicates_by_id == 0 && many.delivery.lost == 0)).into(),
    ]);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_series_and_missing_is_none() {
        let text = "# TYPE belfry_dispatch_claim_errors_total counter\n\
                    belfry_dispatch_claim_errors_total 3\n\
                    belfry_dispatch_claim_errors_total_other 100\n\
                    belfry_dispatch_claim_errors_total{queue=\"a b\"} 2\n";
        assert_eq!(counter_value(text, CLAIM_ERRORS_METRIC), Some(5));
        assert_eq!(counter_value("up 1\n", CLAIM_ERRORS_METRIC), None);
    }

    #[test]
    fn every_shape_gets_the_same_due_times_and_queues_interleave() {
        let names: Vec<String> = (0..4).map(|q| format!("q{q}")).collect();
        let many = plan(
            Shape {
                queues: 4,
                per_queue: 3,
            },
            &names,
            1_000,
            120,
            64,
        );
        let one = plan(
            Shape {
                queues: 1,
                per_queue: 12,
            },
            &names,
            1_000,
            120,
            64,
        );
        let mut a = many.due.as_ref().clone();
        let mut b = one.due.as_ref().clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert!(a[0] == 1_000 && a[11] < 1_120);
        // Queue 0 holds tasks 0..3, due at the 1st, 5th and 9th time: it spans the window.
        assert_eq!(&many.due[0..3], &[1_000, 1_040, 1_080]);
        assert_eq!(many.bodies.bodies.len(), 4);
        assert_eq!(many.paths[3], "/v1/queues/q3/tasks:batch");
        let body: serde_json::Value = serde_json::from_slice(&many.bodies.bodies[1]).unwrap();
        assert_eq!(body["tasks"][2]["payload"]["i"], 5);
        assert_eq!(body["tasks"][2]["run_at_ms"], many.due[5]);
        assert_eq!((one.bodies.bodies.len(), one.bodies.tasks_in(0)), (1, 12));
    }

    #[test]
    fn a_queue_of_more_than_a_batch_is_split() {
        let names = vec!["big".to_string()];
        let p = plan(
            Shape {
                queues: 1,
                per_queue: 2_500,
            },
            &names,
            0,
            10,
            32,
        );
        assert_eq!(p.bodies.bodies.len(), 3);
        assert_eq!((p.bodies.tasks_in(0), p.bodies.tasks_in(2)), (1_000, 500));
        assert!(p
            .paths
            .iter()
            .all(|path| path == "/v1/queues/big/tasks:batch"));
    }
}
