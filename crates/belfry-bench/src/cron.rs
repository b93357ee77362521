//! `belfry bench cron`: S schedules firing every second into a pull queue that a consumer
//! drains, measured against plain task submits and against the same server without them.
//!
//! In one run on one server: (1) lease latency of an unrelated pull queue (a probe submits a
//! due task and leases it with `wait_ms: 0`) with no schedules; (2) single-task submit rate
//! over C connections; (3) schedule creation rate over the same C connections (the
//! schedules start firing as they are created, as they would in production); (4) a firing
//! window of F seconds: firing lateness (receipt − `due_at_ms`), firings per second, duplicate
//! firings, server CPU per wall second, and the same lease probe again under the cron load.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Method;
use serde::Deserialize;
use serde_json::json;

use crate::error::{within, BenchError};
use crate::fire::{AckBatch, Echo};
use crate::http::{HttpConn, Target};
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::report::{part_of, ratio, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::{format_us, new_histogram, record_clamped, Percentiles};
use crate::sys::{cpu_time, on_own_thread, unix_ms, unix_us, Machine};
use crate::workload::{due_times, Bodies};
use crate::{progress, OutputArgs, ServerArgs, CONNECTIONS_MAX};

/// Target of the issue: the probe's lease p99 under the cron load at most this many times
/// its p99 without it.
pub const PROBE_RATIO_TARGET: f64 = 1.5;

/// Most schedules one run creates.
pub const SCHEDULES_MAX: u64 = 1_000_000;

/// Most probe rounds (each is a submit, a lease and an ack).
pub const PROBES_MAX: usize = 100_000;

/// Longest firing window.
pub const FIRE_S_MAX: u64 = 3_600;

/// Firings due in the last seconds of the window may still be arriving when it ends: the
/// consumers go on this long after it.
const DRAIN_AFTER_WINDOW: Duration = Duration::from_secs(3);

/// The first second after creation is not measured: firings created while the last
/// schedules were being created are not the steady state.
const WARMUP: Duration = Duration::from_secs(1);

/// Long-poll of the cron consumers' lease calls.
const CONSUMER_WAIT_MS: u64 = 500;

#[derive(Debug, Clone, clap::Args)]
pub struct CronArgs {
    /// Schedules to create, each firing every second (`* * * * * *`).
    #[arg(long, default_value_t = 10_000)]
    pub schedules: u64,
    /// Connections for creating schedules and for the single-task submit baseline.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Seconds of firing measured after the schedules exist.
    #[arg(long, default_value_t = 10)]
    pub fire_s: u64,
    /// Lease probe rounds, without and with the cron load. They are spread over the same
    /// 80% of the window whatever their number, so more cost no time; with 1,000, the p99 is
    /// the 10th-worst sample, not the 3rd (300, the default until 2026-11-28).
    #[arg(long, default_value_t = 1_000)]
    pub probes: usize,
    /// Pull consumers of the cron queue (each leases up to 1,000 and acks them in one call).
    #[arg(long, default_value_t = 2)]
    pub consumers: usize,
    /// Prefix of the queue and schedule names (default: `bench-cron-<ms>`).
    #[arg(long)]
    pub prefix: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl CronArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        within("--schedules", self.schedules, 1, SCHEDULES_MAX)?;
        within("--connections", self.connections, 1, CONNECTIONS_MAX)?;
        within("--fire-s", self.fire_s, 2, FIRE_S_MAX)?;
        within("--probes", self.probes, 1, PROBES_MAX)?;
        within("--consumers", self.consumers, 1, CONNECTIONS_MAX)?;
        if self.server.baselines_only {
            return Err(BenchError::invalid(
                "--baselines-only",
                "the baselines of cron are belfry itself",
            ));
        }
        Ok(())
    }
}

/// The lease probe's outcome.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProbeOutcome {
    pub rounds: usize,
    /// Lease calls that returned the probe task.
    pub leased: u64,
    /// Lease calls that returned nothing (the task submitted just before was not yet due or
    /// not yet visible).
    pub empty: u64,
    pub failed: u64,
    pub lease: Percentiles,
    /// Each timed lease: the millisecond of the wall-clock second it ended in (the schedules
    /// fire at 0), and how long it took in µs.
    #[serde(skip)]
    pub samples: Vec<(u16, u64)>,
}

impl ProbeOutcome {
    /// How many leases took longer than `over_us`, by tenth of the second they ended in.
    fn slow_by_tenth(&self, over_us: u64) -> [usize; 10] {
        let mut tenths = [0; 10];
        for &(ms, us) in &self.samples {
            if us > over_us {
                tenths[usize::from(ms / 100).min(9)] += 1;
            }
        }
        tenths
    }
}

/// What the cron consumers saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FiringOutcome {
    pub window_start_ms: u64,
    pub window_s: u64,
    /// Firings due in the window, received.
    pub received: u64,
    /// Schedules × whole seconds in the window.
    pub expected: u64,
    /// The same schedule and due time received again.
    pub duplicates: u64,
    /// Fewest and most firings received for one due second of the window.
    pub per_second_min: u64,
    pub per_second_max: u64,
    pub lateness: Percentiles,
    /// Server CPU seconds per wall second over the window.
    pub server_cores: Option<f64>,
    pub lease_errors: u64,
    pub ack_failures: u64,
    /// All firings received during the run (creation included).
    pub received_total: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CronOutcome {
    pub schedules: u64,
    pub connections: usize,
    pub probe_idle: ProbeOutcome,
    pub submit: IngestOutcome,
    pub create: IngestOutcome,
    pub firing: FiringOutcome,
    pub probe_loaded: ProbeOutcome,
    pub deleted: Option<u64>,
}

pub async fn run(args: CronArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let machine = Machine::describe();
    let server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
    let result = run_on(&args, &server).await;
    server.stop();
    Ok(build_report(&args, machine, result?))
}

async fn run_on(args: &CronArgs, server: &ServerUnderTest) -> anyhow::Result<CronOutcome> {
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("bench-cron-{}", unix_ms()));
    let (cron_q, probe_q, submit_q) = create_queues(&server.target, &prefix).await?;
    let target = &server.target;

    // Probe rounds spread over most of the window (the same pace without the load).
    let pace = Duration::from_millis(args.fire_s * 1_000 * 8 / 10) / args.probes as u32;
    let probe_idle = probe(
        target,
        &probe_q,
        args.probes,
        pace,
        progress(
            &args.output,
            args.probes as u64,
            "lease probe, no schedules",
        ),
    )
    .await;

    // Single-task submits, far in the future so they never fire during the run.
    let far = unix_ms() + 24 * 3_600 * 1_000;
    let due = due_times(args.schedules, far, 1_000);
    let submit = submit_single_tasks(args, server, &submit_q, &due).await;

    let consumed = Arc::new(Mutex::new(Consumed::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let consumers = spawn_consumers(args, target, &cron_q, &consumed, &stop);

    let schedule_ids: Vec<String> = (0..args.schedules)
        .map(|i| format!("{prefix}-{i}"))
        .collect();
    let create = create_schedules(args, server, &cron_q, &schedule_ids, &due).await;

    let window = fire_window(args, server, &probe_q, pace, &consumed).await;
    tokio::time::sleep(DRAIN_AFTER_WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        let _ = c.await;
    }

    // A server at --url keeps its schedules otherwise; a spawned one is stopped anyway.
    let deleted = server
        .clean_up(
            schedule_ids.iter().map(|id| format!("/v1/schedules/{id}")),
            args.connections,
            progress(&args.output, args.schedules, "delete schedules"),
        )
        .await;

    let c = consumed
        .lock()
        .map_err(|_| anyhow::anyhow!("consumer state poisoned"))?;
    let created = create.accepted;
    let firing = c.firing(window.start_ms, args.fire_s, created, window.server_cores);
    Ok(CronOutcome {
        schedules: args.schedules,
        connections: args.connections,
        probe_idle,
        submit,
        create,
        firing,
        probe_loaded: window.probe_loaded,
        deleted,
    })
}

/// The run's three queues: the firings', the probe's and the single-task submits'.
async fn create_queues(target: &Target, prefix: &str) -> anyhow::Result<(String, String, String)> {
    let (cron_q, probe_q, submit_q) = (
        format!("{prefix}-fire"),
        format!("{prefix}-probe"),
        format!("{prefix}-submit"),
    );
    for q in [&cron_q, &probe_q, &submit_q] {
        create_queue(target, q, "{}").await?;
    }
    Ok((cron_q, probe_q, submit_q))
}

/// One single-task submit per schedule, into `submit_q`, due at `due`: the rate schedule
/// creation is compared with.
async fn submit_single_tasks(
    args: &CronArgs,
    server: &ServerUnderTest,
    submit_q: &str,
    due: &[u64],
) -> IngestOutcome {
    run_ingest(
        IngestJob {
            label: "single-task submit".into(),
            target: server.target.clone(),
            path: format!("/v1/queues/{submit_q}/tasks"),
            body_paths: None,
            bodies: Arc::new(Bodies::build(due, 1, 64)),
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: None,
            server_pid: server.pid,
            keep_ids: None,
        },
        progress(&args.output, args.schedules, "single-task submit"),
    )
    .await
}

/// `--consumers` tasks leasing the firings from `cron_q` into `consumed` until `stop`.
fn spawn_consumers(
    args: &CronArgs,
    target: &Target,
    cron_q: &str,
    consumed: &Arc<Mutex<Consumed>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut consumers = Vec::new();
    for _ in 0..args.consumers {
        consumers.push(tokio::spawn(consume(
            target.clone(),
            cron_q.to_string(),
            consumed.clone(),
            stop.clone(),
        )));
    }
    consumers
}

/// Creates one every-second schedule per id in `schedule_ids`, firing into `cron_q`.
async fn create_schedules(
    args: &CronArgs,
    server: &ServerUnderTest,
    cron_q: &str,
    schedule_ids: &[String],
    due: &[u64],
) -> IngestOutcome {
    let bodies = Bodies::from_tasks(due, 1, |i, _| {
        json!({
            "id": schedule_ids[i as usize],
            "queue": cron_q,
            "cron": "* * * * * *",
            "timezone": "UTC",
            "payload": {"i": i},
        })
        .to_string()
    });
    run_ingest(
        IngestJob {
            label: "schedule create".into(),
            target: server.target.clone(),
            path: "/v1/schedules".into(),
            body_paths: None,
            bodies: Arc::new(bodies),
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: None,
            server_pid: server.pid,
            keep_ids: None,
        },
        progress(&args.output, args.schedules, "schedule create"),
    )
    .await
}

/// What the measured window saw besides the firings themselves.
struct FiringWindow {
    start_ms: u64,
    /// The lease probe run inside the window.
    probe_loaded: ProbeOutcome,
    /// The server's CPU over the window, in cores.
    server_cores: Option<f64>,
}

/// The measured window: whole seconds from the first after the warm-up, with the lease
/// probe running over its first 80% and the server's CPU measured over all of it.
async fn fire_window(
    args: &CronArgs,
    server: &ServerUnderTest,
    probe_q: &str,
    pace: Duration,
    consumed: &Mutex<Consumed>,
) -> FiringWindow {
    tokio::time::sleep(WARMUP).await;
    let window_start_ms = unix_ms().div_ceil(1_000) * 1_000;
    let window_end_ms = window_start_ms + args.fire_s * 1_000;
    if let Ok(mut c) = consumed.lock() {
        c.window = Some((window_start_ms, window_end_ms));
    }
    sleep_until_ms(window_start_ms).await;
    let cpu_start = server.pid.and_then(|p| cpu_time(&p.to_string()));
    let wall_start = Instant::now();
    let bar = progress(&args.output, args.fire_s, "firing window (s)");
    let ticker = {
        let bar = bar.clone();
        tokio::spawn(async move {
            while unix_ms() < window_end_ms {
                tokio::time::sleep(Duration::from_millis(250)).await;
                bar.set_position(unix_ms().saturating_sub(window_start_ms) / 1_000);
            }
        })
    };
    // The probe runs inside the window, over its first 80%.
    let probe_loaded = probe(
        &server.target,
        probe_q,
        args.probes,
        pace,
        indicatif::ProgressBar::hidden(),
    )
    .await;
    sleep_until_ms(window_end_ms).await;
    let cpu_end = server.pid.and_then(|p| cpu_time(&p.to_string()));
    let wall = wall_start.elapsed().as_secs_f64().max(1e-9);
    let _ = ticker.await;
    bar.finish_and_clear();
    let server_cores = match (cpu_start, cpu_end) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64() / wall),
        _ => None,
    };
    FiringWindow {
        start_ms: window_start_ms,
        probe_loaded,
        server_cores,
    }
}

async fn sleep_until_ms(at_ms: u64) {
    let now = unix_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

#[derive(Deserialize)]
struct LeaseAnswer<'a> {
    #[serde(borrow)]
    tasks: Vec<Leased<'a>>,
}

#[derive(Deserialize)]
struct Leased<'a> {
    #[serde(borrow)]
    id: Echo<'a>,
    #[serde(borrow)]
    lease_id: Echo<'a>,
    #[serde(default)]
    due_at_ms: u64,
    #[serde(default)]
    payload: Option<Index>,
}

#[derive(Deserialize)]
struct Index {
    i: u64,
}

/// Firings the consumers received.
struct Consumed {
    /// The measured window [start, end) of due times, once known.
    window: Option<(u64, u64)>,
    lateness: Histogram<u64>,
    /// (schedule index, due ms) of the window's firings.
    seen: HashSet<(u64, u64)>,
    per_second: HashMap<u64, u64>,
    duplicates: u64,
    received_total: u64,
    lease_errors: u64,
    ack_failures: u64,
}

impl Default for Consumed {
    fn default() -> Self {
        Consumed {
            window: None,
            lateness: new_histogram(),
            seen: HashSet::new(),
            per_second: HashMap::new(),
            duplicates: 0,
            received_total: 0,
            lease_errors: 0,
            ack_failures: 0,
        }
    }
}

impl Consumed {
    /// Records one firing of schedule `index`, due at `due_ms`, received at `receipt_us`.
    fn record(&mut self, index: u64, due_ms: u64, receipt_us: u64) {
        self.received_total += 1;
        let Some((start, end)) = self.window else {
            return;
        };
        if due_ms < start || due_ms >= end {
            return;
        }
        if !self.seen.insert((index, due_ms)) {
            self.duplicates += 1;
            return;
        }
        *self.per_second.entry(due_ms / 1_000).or_insert(0) += 1;
        record_clamped(
            &mut self.lateness,
            receipt_us.saturating_sub(due_ms * 1_000),
        );
    }

    fn firing(
        &self,
        window_start_ms: u64,
        window_s: u64,
        schedules: u64,
        server_cores: Option<f64>,
    ) -> FiringOutcome {
        let first_second = window_start_ms / 1_000;
        let counts: Vec<u64> = (first_second..first_second + window_s)
            .map(|s| self.per_second.get(&s).copied().unwrap_or(0))
            .collect();
        FiringOutcome {
            window_start_ms,
            window_s,
            received: self.seen.len() as u64,
            expected: schedules * window_s,
            duplicates: self.duplicates,
            per_second_min: counts.iter().copied().min().unwrap_or(0),
            per_second_max: counts.iter().copied().max().unwrap_or(0),
            lateness: Percentiles::of(&self.lateness),
            server_cores,
            lease_errors: self.lease_errors,
            ack_failures: self.ack_failures,
            received_total: self.received_total,
        }
    }
}

/// Leases up to 1,000 firings at a time and acks them in one call, until `stop`.
async fn consume(
    target: Target,
    queue: String,
    consumed: Arc<Mutex<Consumed>>,
    stop: Arc<AtomicBool>,
) {
    let lease_path = format!("/v1/queues/{queue}/lease");
    let ack_path = format!("/v1/queues/{queue}/ack");
    let lease_body = Bytes::from(
        json!({"max": crate::LEASE_TASKS_MAX, "wait_ms": CONSUMER_WAIT_MS, "visibility_ms": 60_000})
            .to_string(),
    );
    let mut lease_conn: Option<HttpConn> = None;
    let mut ack_conn: Option<HttpConn> = None;
    let note = |f: fn(&mut Consumed)| {
        if let Ok(mut c) = consumed.lock() {
            f(&mut c);
        }
    };
    while !stop.load(Ordering::Relaxed) {
        if lease_conn.is_none() {
            lease_conn = HttpConn::connect(&target).await.ok();
        }
        let Some(conn) = lease_conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let answer = conn
            .request(Method::POST, &lease_path, lease_body.clone())
            .await;
        let receipt_us = unix_us();
        let body = match answer {
            Ok((status, body)) if status.is_success() => body,
            Ok(_) => {
                note(|c| c.lease_errors += 1);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) => {
                note(|c| c.lease_errors += 1);
                lease_conn = None;
                continue;
            }
        };
        let Ok(leased) = serde_json::from_slice::<LeaseAnswer>(&body) else {
            note(|c| c.lease_errors += 1);
            continue;
        };
        if leased.tasks.is_empty() {
            continue;
        }
        if let Ok(mut c) = consumed.lock() {
            for t in &leased.tasks {
                let index = t.payload.as_ref().map_or(u64::MAX, |p| p.i);
                c.record(index, t.due_at_ms, receipt_us);
            }
        }
        let Some(ack) = AckBatch::json(leased.tasks.iter().map(|t| (&t.id, &t.lease_id))) else {
            continue;
        };
        if ack_conn.is_none() {
            ack_conn = HttpConn::connect(&target).await.ok();
        }
        let acked = match ack_conn.as_mut() {
            Some(c) => c.expect_success(Method::POST, &ack_path, ack).await.is_ok(),
            None => false,
        };
        if !acked {
            note(|c| c.ack_failures += 1);
            ack_conn = None;
        }
    }
}

/// `rounds` times: submit a task due now to `queue`, then time one lease call
/// (`max: 1, wait_ms: 0`) and ack what it got.
/// Rounds start `pace` apart, so that under the cron load they sample every part of the
/// firing second, not only its first moments.
/// Runs the probe on a thread and runtime of its own: its latency is the server's answer
/// time, not the wait for a client worker that the cron queue's consumers keep busy
/// parsing their batches.
async fn probe(
    target: &Target,
    queue: &str,
    rounds: usize,
    pace: Duration,
    bar: indicatif::ProgressBar,
) -> ProbeOutcome {
    let (target, queue) = (target.clone(), queue.to_owned());
    let rounds_on_thread =
        move || async move { probe_rounds(&target, &queue, rounds, pace, bar).await };
    on_own_thread("bench-probe", rounds_on_thread)
        .await
        .unwrap_or(ProbeOutcome {
            rounds,
            failed: rounds as u64,
            ..ProbeOutcome::default()
        })
}

async fn probe_rounds(
    target: &Target,
    queue: &str,
    rounds: usize,
    pace: Duration,
    bar: indicatif::ProgressBar,
) -> ProbeOutcome {
    let mut out = ProbeOutcome {
        rounds,
        ..ProbeOutcome::default()
    };
    let mut latency = new_histogram();
    let submit_path = format!("/v1/queues/{queue}/tasks");
    let lease_path = format!("/v1/queues/{queue}/lease");
    let lease_body = Bytes::from_static(b"{\"max\":1,\"wait_ms\":0,\"visibility_ms\":30000}");
    let mut conn: Option<HttpConn> = None;
    let started = Instant::now();
    for round in 0..rounds {
        let at = started + pace * round as u32;
        tokio::time::sleep_until(at.into()).await;
        bar.inc(1);
        if conn.is_none() {
            conn = HttpConn::connect(target).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            out.failed += 1;
            continue;
        };
        let task = Bytes::from(format!("{{\"payload\":{{\"i\":{round}}}}}"));
        if c.expect_success(Method::POST, &submit_path, task)
            .await
            .is_err()
        {
            out.failed += 1;
            conn = None;
            continue;
        }
        let sent = Instant::now();
        let answer = c
            .request(Method::POST, &lease_path, lease_body.clone())
            .await;
        let took = sent.elapsed();
        out.samples
            .push(((unix_ms() % 1_000) as u16, took.as_micros() as u64));
        let body = match answer {
            Ok((status, body)) if status.is_success() => body,
            _ => {
                out.failed += 1;
                conn = None;
                continue;
            }
        };
        record_clamped(&mut latency, took.as_micros() as u64);
        let Ok(leased) = serde_json::from_slice::<LeaseAnswer>(&body) else {
            out.failed += 1;
            continue;
        };
        let Some(task) = leased.tasks.first() else {
            out.empty += 1;
            continue;
        };
        out.leased += 1;
        let ack = json!({"lease_id": task.lease_id}).to_string();
        let id = match &task.id {
            Echo::Text(t) => t.to_string(),
            Echo::Number(n) => n.to_string(),
        };
        let path = format!("/v1/queues/{queue}/tasks/{id}/ack");
        if c.expect_success(Method::POST, &path, Bytes::from(ack))
            .await
            .is_err()
        {
            out.failed += 1;
            conn = None;
        }
    }
    bar.finish_and_clear();
    out.lease = Percentiles::of(&latency);
    out
}

fn build_report(args: &CronArgs, machine: Machine, o: CronOutcome) -> Report {
    let tables = vec![rates_table(&o), firing_table(&o), probes_table(args, &o)];
    let mut notes = probe_notes(&o);
    notes.extend(run_notes(&o));
    Report {
        scenario: "cron".into(),
        command: crate::command_line(),
        machine,
        tables,
        notes,
        picture: None,
        data: serde_json::to_value(&o).unwrap_or(serde_json::Value::Null),
    }
}

/// Creating schedules against submitting single tasks, request by request.
fn rates_table(o: &CronOutcome) -> Table {
    let mut rates = Table::new(
        format!(
            "creating {} per-second schedules against submitting {} single tasks, {} connections each",
            thousands(o.schedules as f64),
            thousands(o.schedules as f64),
            o.connections
        ),
        &["request", "accepted", "per second", "p50", "p99", "max", "server cores", "÷ single-task submit"],
    );
    for (name, r) in [
        ("POST /v1/schedules (cron `* * * * * *`)", &o.create),
        ("POST /v1/queues/{q}/tasks (one task)", &o.submit),
    ] {
        rates.row(vec![
            name.to_string(),
            part_of(r.accepted, o.schedules),
            thousands(r.tasks_per_s),
            format_us(r.latency.p50_us),
            format_us(r.latency.p99_us),
            format_us(r.latency.max_us),
            r.cpu.server_cores.map_or("-".into(), |c| format!("{c:.2}")),
            ratio(r.tasks_per_s, o.submit.tasks_per_s),
        ]);
    }
    rates
}

/// The firings received in the measured window.
fn firing_table(o: &CronOutcome) -> Table {
    let f = &o.firing;
    let mut firing = Table::new(
        format!(
            "firing: {} schedules every second, {} s measured into one pull queue",
            thousands(o.create.accepted as f64),
            f.window_s
        ),
        &[
            "firings received/expected",
            "per due second (min–max)",
            "duplicates",
            "lateness p50",
            "p99",
            "p99.9",
            "max",
            "server CPU s per s",
        ],
    );
    firing.row(vec![
        part_of(f.received, f.expected),
        format!(
            "{}–{}",
            thousands(f.per_second_min as f64),
            thousands(f.per_second_max as f64)
        ),
        f.duplicates.to_string(),
        format_us(f.lateness.p50_us),
        format_us(f.lateness.p99_us),
        format_us(f.lateness.p999_us),
        format_us(f.lateness.max_us),
        f.server_cores.map_or("-".into(), |c| format!("{c:.2}")),
    ]);
    firing
}

/// The unrelated queue's lease latency, without schedules and under their load.
fn probes_table(args: &CronArgs, o: &CronOutcome) -> Table {
    let mut probes = Table::new(
        format!(
            "lease latency of an unrelated pull queue ({} rounds of submit + lease max 1, wait_ms 0)",
            args.probes
        ),
        &["", "leased/empty/failed", "p50", "p90", "p99", "max"],
    );
    for (name, p) in [
        ("no schedules", &o.probe_idle),
        ("under the cron load", &o.probe_loaded),
    ] {
        probes.row(vec![
            name.into(),
            format!("{}/{}/{}", p.leased, p.empty, p.failed),
            format_us(p.lease.p50_us),
            format_us(p.lease.p90_us),
            format_us(p.lease.p99_us),
            format_us(p.lease.max_us),
        ]);
    }
    probes
}

/// The probe's target, and when in the second the slow leases ended.
fn probe_notes(o: &CronOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    let (idle, loaded) = (o.probe_idle.lease.p99_us, o.probe_loaded.lease.p99_us);
    notes.push(format!(
        "target lease p99 under the cron load ≤ {PROBE_RATIO_TARGET}× without it: {} ({} vs {}, {}).",
        if idle > 0 && loaded as f64 <= idle as f64 * PROBE_RATIO_TARGET { "met" } else { "MISSED" },
        format_us(loaded),
        format_us(idle),
        ratio(loaded as f64, idle as f64)
    ));
    let over = (idle as f64 * PROBE_RATIO_TARGET) as u64;
    let tenths = o.probe_loaded.slow_by_tenth(over);
    notes.push(format!(
        "leases under the cron load slower than {} (the target), by tenth of the second they \
         ended in (the firings are due at 0 ms; the schedule runner stores the next ones \
         `schedules.lead` before, 500 ms by default): {}.",
        format_us(over),
        tenths
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{}–{} ms: {n}", i * 100, i * 100 + 99))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    notes
}

/// The creation rate, missing firings, errors, clean-up, and how lateness is measured.
fn run_notes(o: &CronOutcome) -> Vec<String> {
    let f = &o.firing;
    let mut notes = Vec::new();
    notes.push(format!(
        "schedule creation ran at {} of the single-task submit rate ({} vs {} per second); the \
         schedules fire while the later ones are being created, as in production.",
        ratio(o.create.tasks_per_s, o.submit.tasks_per_s),
        thousands(o.create.tasks_per_s),
        thousands(o.submit.tasks_per_s)
    ));
    if f.received < f.expected {
        notes.push(format!(
            "{} firings due in the window were not received within {} s after it.",
            thousands((f.expected - f.received) as f64),
            DRAIN_AFTER_WINDOW.as_secs()
        ));
    }
    for (name, r) in [
        ("schedule create", &o.create),
        ("single-task submit", &o.submit),
    ] {
        if let Some(e) = &r.first_error {
            notes.push(format!("{name}: {} refused: {e}", r.rejected));
        }
    }
    if f.lease_errors > 0 || f.ack_failures > 0 {
        notes.push(format!(
            "cron consumers: {} failed lease calls, {} failed batch acks.",
            f.lease_errors, f.ack_failures
        ));
    }
    if let Some(n) = o.deleted {
        notes.push(format!("{n} schedules deleted at the end."));
    }
    notes.push(
        "lateness = the consumer's receipt of a firing − its due_at_ms (the fire time), on this \
         machine's clock, includes the lease long-poll's hand-off; the window starts at the \
         first whole second 1 s after the last schedule was created."
            .into(),
    );
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_window_counts_and_repeats_are_duplicates() {
        let mut c = Consumed::default();
        c.record(0, 5_000, 5_000_100); // before the window is known
        c.window = Some((10_000, 12_000));
        c.record(0, 9_000, 9_000_100); // before the window
        c.record(0, 10_000, 10_002_000);
        c.record(1, 10_000, 10_004_000);
        c.record(1, 10_000, 10_005_000); // again
        c.record(0, 11_000, 11_001_000);
        c.record(0, 12_000, 12_000_500); // after the window
        let f = c.firing(10_000, 2, 2, None);
        assert_eq!((f.received, f.expected, f.duplicates), (3, 4, 1));
        assert_eq!((f.per_second_min, f.per_second_max), (1, 2));
        assert_eq!(f.lateness.count, 3);
        // 3 significant digits: 4,000 µs is reported within its bucket.
        assert!(
            (4_000..=4_004).contains(&f.lateness.max_us),
            "{:?}",
            f.lateness
        );
        assert_eq!(f.received_total, 7);
    }
}
