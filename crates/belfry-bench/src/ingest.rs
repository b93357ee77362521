//! `belfry bench ingest`: submit throughput and request latency, against the raw fsync'd
//! append of the same bytes, the trivial HTTP handler answering the same requests, and
//! Redis ZADD + HSET pipelines of the same batch size.

use std::sync::Arc;

use serde_json::json;

use crate::load::{raw_append, run_ingest, Answers, IngestJob, IngestOutcome, RawAppend};
use crate::redis_queue::{self, QueueKeys, RedisServer};
use crate::report::{ratio, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::format_us;
use crate::sys::{unix_ms, Machine};
use crate::workload::{due_times, validate, Bodies};
use crate::{progress, Baseline, BaselineArgs, OutputArgs, ServerArgs};

/// Target from the brief: durable batched ingest.
const BATCHED_TASKS_PER_S_TARGET: f64 = 1_000_000.0;
/// Target from the issue: batched ingest at least this share of raw fsync'd append.
const BATCHED_SHARE_OF_FSYNC_TARGET: f64 = 0.7;
/// Target from the brief: single-task ingest at least this share of the trivial handler.
const SINGLE_SHARE_OF_TRIVIAL_TARGET: f64 = 0.7;

/// Target of the console/auth issue: requests carrying a token cost at most this share of
/// single-task ingest throughput.
const AUTH_COST_TARGET: f64 = 0.10;

/// The label of the run with a token (`--with-token`).
const WITH_TOKEN_LABEL: &str = "belfry, bearer token";

/// The server's admin-token variable (`belfry serve`).
const ADMIN_TOKEN_ENV: &str = "BELFRY_ADMIN_TOKEN";

/// Throughput and server CPU per request with a token against without.
fn auth_cost_note(without: &IngestOutcome, with: &IngestOutcome) -> String {
    let cost = 1.0 - with.tasks_per_s / without.tasks_per_s.max(1e-9);
    let cpu_per_request = |o: &IngestOutcome| {
        o.cpu
            .server_cores
            .map(|cores| cores * o.elapsed_s / (o.requests.max(1) as f64) * 1e6)
    };
    let cpu = match (cpu_per_request(without), cpu_per_request(with)) {
        (Some(a), Some(b)) => format!("; server CPU {b:.1} vs {a:.1} µs per request"),
        _ => String::new(),
    };
    format!(
        "target: a bearer token costs ≤ {:.0}% of ingest throughput: {} ({} vs {} tasks/s, {:+.1}%{cpu}; two servers, one after the other, in this run).",
        AUTH_COST_TARGET * 100.0,
        if cost <= AUTH_COST_TARGET { "met" } else { "missed" },
        thousands(with.tasks_per_s),
        thousands(without.tasks_per_s),
        -cost * 100.0,
    )
}

#[derive(Debug, Clone, clap::Args)]
pub struct IngestArgs {
    /// Tasks to submit.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: u64,
    /// Tasks per request: 1 uses the single-task endpoint, 2..=1000 the batch endpoint.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Concurrent connections (each sends its requests in sequence).
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Payload size in bytes (a JSON object carrying the task's index, padded).
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// The first task is due this many seconds from now...
    #[arg(long, default_value_t = 3_600)]
    pub due_in_s: u64,
    /// ...and the rest are spread evenly over this many seconds after it.
    #[arg(long, default_value_t = 3_600)]
    pub due_window_s: u64,
    /// Queue to create and submit to (default: a fresh `bench-ingest-<ms>`).
    #[arg(long)]
    pub queue: Option<String>,
    /// With --spawn: also run the same ingest against a second server that requires a bearer
    /// token (`BELFRY_ADMIN_TOKEN`), every request carrying it: what authentication costs.
    #[arg(long)]
    pub with_token: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub baselines: BaselineArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn run(args: IngestArgs) -> anyhow::Result<Report> {
    validate(args.tasks, args.batch, args.connections, args.payload_bytes)?;
    let machine = Machine::describe();
    let due = due_times(
        args.tasks,
        unix_ms() + args.due_in_s * 1_000,
        args.due_window_s * 1_000,
    );
    let bodies = Arc::new(Bodies::build(&due, args.batch, args.payload_bytes));
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-ingest-{}", unix_ms()));
    let path = if args.batch == 1 {
        format!("/v1/queues/{queue}/tasks")
    } else {
        format!("/v1/queues/{queue}/tasks:batch")
    };
    let load = IngestLoad {
        args: &args,
        queue: &queue,
        path: &path,
        bodies: &bodies,
    };

    let mut belfry = None;
    let mut belfry_written = None;
    let mut with_token = None;
    if !args.server.baselines_only {
        let (outcome, written) = load.belfry().await?;
        belfry_written = written;
        belfry = Some(outcome);
        if args.with_token {
            with_token = Some(load.belfry_with_token().await?);
        }
    }

    let trivial = if args.baselines.wants(Baseline::Http) {
        Some(load.trivial().await?)
    } else {
        None
    };

    let fsync = if args.baselines.wants(Baseline::Fsync) {
        Some(load.raw_append().await?)
    } else {
        None
    };

    let redis = if args.baselines.wants(Baseline::Redis) {
        Some(redis_ingest(&args, &due).await?)
    } else {
        None
    };

    Ok(build_report(
        &args,
        machine,
        &bodies,
        Measured {
            belfry,
            belfry_written,
            with_token,
            trivial,
            fsync,
            redis,
        },
    ))
}

/// The same requests, sent to each system in turn.
struct IngestLoad<'a> {
    args: &'a IngestArgs,
    queue: &'a str,
    path: &'a str,
    bodies: &'a Arc<Bodies>,
}

impl IngestLoad<'_> {
    fn job(&self, label: &str, server: &ServerUnderTest) -> IngestJob {
        IngestJob {
            label: label.into(),
            target: server.target.clone(),
            path: self.path.to_string(),
            body_paths: None,
            bodies: self.bodies.clone(),
            connections: self.args.connections,
            answers: Answers::Belfry,
            due_at_ms: None,
            server_pid: server.pid,
            keep_ids: None,
        }
    }

    /// Belfry's run, and the bytes its server wrote to storage meanwhile (known with a pid).
    async fn belfry(&self) -> anyhow::Result<(IngestOutcome, Option<u64>)> {
        let args = self.args;
        let server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
        create_queue(&server.target, self.queue, "{}").await?;
        let written_before = server.pid.and_then(crate::sys::storage_write_bytes);
        let outcome = run_ingest(
            self.job("belfry", &server),
            progress(&args.output, args.tasks, "belfry ingest"),
        )
        .await;
        let written = server
            .pid
            .and_then(crate::sys::storage_write_bytes)
            .zip(written_before)
            .map(|(after, before)| after.saturating_sub(before));
        server.stop();
        Ok((outcome, written))
    }

    /// Belfry's run against a server that requires a bearer token, every request carrying it.
    async fn belfry_with_token(&self) -> anyhow::Result<IngestOutcome> {
        let args = self.args;
        // A bench token on loopback: it need not be secret, only as long as a real one.
        let token = format!("bfy_bench_{:032x}_{:08x}", unix_ms(), std::process::id());
        let mut server =
            ServerUnderTest::connect_or_spawn(&args.server, &[(ADMIN_TOKEN_ENV, token.as_str())])
                .await?;
        // It must really require the token, or the comparison measures nothing.
        let mut bare = crate::http::HttpConn::connect(&server.target).await?;
        let (status, _) = bare
            .request(http::Method::GET, "/v1/queues", bytes::Bytes::new())
            .await?;
        anyhow::ensure!(
            status == http::StatusCode::UNAUTHORIZED,
            "the server started with {ADMIN_TOKEN_ENV} answered {status} to a request without a token, not 401"
        );
        server.target.token = Some(token);
        create_queue(&server.target, self.queue, "{}").await?;
        let outcome = run_ingest(
            self.job(WITH_TOKEN_LABEL, &server),
            progress(&args.output, args.tasks, "belfry ingest, with a token"),
        )
        .await;
        server.stop();
        Ok(outcome)
    }

    /// The same requests against the trivial HTTP handler.
    async fn trivial(&self) -> anyhow::Result<IngestOutcome> {
        let args = self.args;
        let server = crate::servers::TrivialServer::start(args.baselines.trivial_threads)?;
        let outcome = run_ingest(
            IngestJob {
                label: "trivial HTTP handler".into(),
                target: server.target(),
                path: self.path.to_string(),
                body_paths: None,
                bodies: self.bodies.clone(),
                connections: args.connections,
                answers: Answers::AnySuccess,
                due_at_ms: None,
                server_pid: None,
                keep_ids: None,
            },
            progress(&args.output, args.tasks, "trivial handler"),
        )
        .await;
        server.stop();
        Ok(outcome)
    }

    /// The same request bodies appended to a file, one fdatasync each, on the server's disk.
    async fn raw_append(&self) -> anyhow::Result<RawAppend> {
        let dir = match &self.fsync_dir() {
            Some(d) => tempfile::tempdir_in(d)?,
            None => tempfile::tempdir()?,
        };
        let bar = progress(&self.args.output, self.args.tasks, "raw fsync append");
        let bodies = self.bodies.clone();
        let path = dir.path().to_path_buf();
        let result =
            tokio::task::spawn_blocking(move || raw_append(&path, &bodies, &bar)).await??;
        Ok(result)
    }

    /// On the server's disk: a spawned server lives under --spawn-dir (or the system temp
    /// dir, when that is not given); a server at --url beside its --server-data-dir.
    fn fsync_dir(&self) -> Option<std::path::PathBuf> {
        let server = &self.args.server;
        if !server.baselines_only && !server.spawn {
            if let Some(dir) = server.server_data_dir.as_deref().and_then(|d| d.parent()) {
                return Some(dir.to_path_buf());
            }
        }
        server.spawn_dir.clone()
    }
}

async fn redis_ingest(args: &IngestArgs, due: &[u64]) -> anyhow::Result<IngestOutcome> {
    let server = RedisServer::start(&args.baselines)?;
    let keys = QueueKeys::new(&format!("bench-ingest-{}", unix_ms()));
    let result = redis_queue::ingest(
        redis_queue::Submit {
            url: &server.url,
            pid: server.pid,
            keys: &keys,
            batch: args.batch,
            connections: args.connections,
            payload_bytes: args.payload_bytes,
        },
        due,
        progress(&args.output, args.tasks, "redis ZADD+HSET"),
        "Redis ZADD+HSET (seeds' design)",
    )
    .await;
    let _ = redis_queue::delete_queue(&server.url, &keys).await;
    server.stop();
    Ok(result?)
}

/// What one run measured (each `None` when not asked for).
struct Measured {
    belfry: Option<IngestOutcome>,
    /// Bytes the server wrote to storage during its run (known for a server with a pid).
    belfry_written: Option<u64>,
    with_token: Option<IngestOutcome>,
    trivial: Option<IngestOutcome>,
    fsync: Option<RawAppend>,
    redis: Option<IngestOutcome>,
}

fn build_report(args: &IngestArgs, machine: Machine, bodies: &Bodies, m: Measured) -> Report {
    let Measured {
        belfry,
        belfry_written,
        with_token,
        trivial,
        fsync,
        redis,
    } = m;
    let mut table = ingest_table(args);
    let belfry_rate = belfry.as_ref().map_or(0.0, |b| b.tasks_per_s);
    let mut notes = Vec::new();
    for o in [&belfry, &with_token, &trivial, &redis]
        .into_iter()
        .flatten()
    {
        system_row(&mut table, o, belfry_rate);
        notes.extend(system_notes(o));
    }
    if let (Some(b), Some(t)) = (&belfry, &with_token) {
        notes.push(auth_cost_note(b, t));
    }
    if let Some(f) = &fsync {
        fsync_row(&mut table, f, belfry_rate);
        notes.push(fsync_note(f));
    }
    if let (Some(written), Some(b)) = (belfry_written, &belfry) {
        notes.push(written_note(written, b.accepted, bodies, fsync.as_ref()));
    }
    if let Some(b) = &belfry {
        notes.extend(target_notes(args, b, trivial.as_ref(), fsync.as_ref()));
    }
    if redis.is_some() {
        notes.push(
            "Redis runs with appendfsync everysec (not fsync per acknowledgement, unlike belfry)."
                .into(),
        );
    }
    Report {
        scenario: if args.batch == 1 {
            "ingest-single".into()
        } else {
            "ingest-batch".into()
        },
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: json!({
            "tasks": args.tasks,
            "batch": args.batch,
            "connections": args.connections,
            "payload_bytes": args.payload_bytes,
            "request_bytes_total": bodies.total_bytes(),
            "belfry": belfry,
            "belfry_storage_write_bytes": belfry_written,
            "trivial_http": trivial,
            "raw_fsync_append": fsync,
            "redis": redis,
        }),
    }
}

/// The empty table, titled with the run's shape.
fn ingest_table(args: &IngestArgs) -> Table {
    let mode = if args.batch == 1 {
        "one task per request".to_string()
    } else {
        format!("batches of {}", args.batch)
    };
    Table::new(
        format!(
            "ingest: {} tasks of {} B, {mode}, {} connections",
            thousands(args.tasks as f64),
            args.payload_bytes,
            args.connections
        ),
        &[
            "system",
            "tasks/s",
            "requests/s",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "errors",
            "client CPU",
            "belfry ÷ this",
        ],
    )
}

/// One measured system's row; `belfry_rate` is what the last column compares to.
fn system_row(table: &mut Table, o: &IngestOutcome, belfry_rate: f64) {
    table.row(vec![
        o.label.clone(),
        thousands(o.tasks_per_s),
        thousands(o.requests_per_s),
        format_us(o.latency.p50_us),
        format_us(o.latency.p90_us),
        format_us(o.latency.p99_us),
        format_us(o.latency.p999_us),
        format_us(o.latency.max_us),
        (o.rejected + o.failed_requests).to_string(),
        format!("{:.2} cores", o.cpu.client_cores),
        if o.label == "belfry" {
            "1.00×".into()
        } else {
            ratio(belfry_rate, o.tasks_per_s)
        },
    ]);
}

/// A saturated load generator, rejected tasks and the server's CPU, for one system.
fn system_notes(o: &IngestOutcome) -> Vec<String> {
    let mut notes = Vec::new();
    if o.cpu.client_saturated() {
        notes.push(format!(
            "{}: the load generator used {:.2} cores (≥ {:.0}% of one): it may have limited this number.",
            o.label,
            o.cpu.client_cores,
            crate::sys::CLIENT_SATURATION_CORES * 100.0
        ));
    }
    if let Some(e) = &o.first_error {
        notes.push(format!(
            "{}: {} rejected tasks; first error: {e}",
            o.label, o.rejected
        ));
    }
    if let Some(server) = o.cpu.server_cores {
        notes.push(format!("{}: the server used {server:.2} cores.", o.label));
    }
    notes
}

fn fsync_row(table: &mut Table, f: &RawAppend, belfry_rate: f64) {
    table.row(vec![
        "raw fsync'd append, same bytes".into(),
        thousands(f.tasks_per_s),
        thousands(f.bodies as f64 / f.elapsed_s),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "0".into(),
        "-".into(),
        ratio(belfry_rate, f.tasks_per_s),
    ]);
}

fn fsync_note(f: &RawAppend) -> String {
    format!(
        "raw append: {} request bodies ({:.1} MB/s), one fdatasync each{}.",
        thousands(f.bodies as f64),
        f.bytes_per_s / 1e6,
        if f.truncated {
            format!(", stopped after {:?}", crate::load::RAW_APPEND_DURATION_MAX)
        } else {
            String::new()
        }
    )
}

/// Belfry's rate against the brief's targets: absolute and against the raw append when
/// batched, against the trivial handler when one task per request.
fn target_notes(
    args: &IngestArgs,
    b: &IngestOutcome,
    trivial: Option<&IngestOutcome>,
    fsync: Option<&RawAppend>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if args.batch > 1 {
        let met = b.tasks_per_s >= BATCHED_TASKS_PER_S_TARGET;
        notes.push(format!(
            "target ≥ {} tasks/s batched: {} ({} tasks/s).",
            thousands(BATCHED_TASKS_PER_S_TARGET),
            if met { "met" } else { "missed" },
            thousands(b.tasks_per_s)
        ));
        if let Some(f) = fsync {
            let share = b.tasks_per_s / f.tasks_per_s.max(1e-9);
            notes.push(format!(
                "target ≥ {:.0}% of raw fsync'd append: {} ({:.0}%).",
                BATCHED_SHARE_OF_FSYNC_TARGET * 100.0,
                if share >= BATCHED_SHARE_OF_FSYNC_TARGET {
                    "met"
                } else {
                    "missed"
                },
                share * 100.0
            ));
        }
    } else if let Some(t) = trivial {
        let share = b.requests_per_s / t.requests_per_s.max(1e-9);
        notes.push(format!(
            "target ≥ {:.0}% of the trivial handler's requests/s: {} ({:.0}%).",
            SINGLE_SHARE_OF_TRIVIAL_TARGET * 100.0,
            if share >= SINGLE_SHARE_OF_TRIVIAL_TARGET {
                "met"
            } else {
                "missed"
            },
            share * 100.0
        ));
    }
    notes
}

/// What the server wrote to storage per task (its WAL, and the task files the tasks also go
/// to), beside the request bytes and what the raw append wrote: on a disk that is the limit,
/// the ratio of the two bounds belfry's share of the raw rate.
fn written_note(written: u64, tasks: u64, bodies: &Bodies, raw: Option<&RawAppend>) -> String {
    let per_task = |bytes: u64, tasks: u64| bytes as f64 / tasks.max(1) as f64;
    let belfry = per_task(written, tasks);
    let request = per_task(bodies.total_bytes(), bodies.tasks);
    let mut note = format!(
        "belfry: the server wrote {belfry:.0} B per task to storage during its run, {:.2}× the request bytes ({request:.0} B per task)",
        belfry / request.max(1e-9)
    );
    if let Some(raw) = raw {
        let raw = per_task(raw.bytes, raw.tasks);
        note.push_str(&format!(
            "; the raw append writes {raw:.0} B per task, so a disk-bound belfry reaches at most {:.0}% of its rate",
            100.0 * raw / belfry.max(1e-9)
        ));
    }
    note.push('.');
    note
}
