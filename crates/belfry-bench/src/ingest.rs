//! `belfry bench ingest`: submit throughput and request latency, against the raw fsync'd
//! append of the same bytes, the trivial HTTP handler answering the same requests, and
//! Redis ZADD + HSET pipelines of the same batch size. With `--via import` the same tasks go
//! through the streamed NDJSON import instead, and with `--via both` through the batch submit
//! and then the import, so the import's rate is quoted as a share of the batch submit's from
//! the same run.

use std::sync::Arc;

use serde_json::json;

use crate::error::BenchError;
use crate::load::{raw_append, run_ingest, Answers, IngestJob, IngestOutcome, RawAppend};
use crate::redis_queue::{self, QueueKeys, RedisServer};
use crate::report::{ratio, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::format_us;
use crate::sys::{unix_ms, Machine};
use crate::workload::{due_times, validate, Bodies, NDJSON_LINE_OVERHEAD_BYTES};
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

/// The label of belfry's run through the batch submit (or the single-task one); the other
/// rows' last column divides its rate by theirs.
const BELFRY_LABEL: &str = "belfry";

/// The label of belfry's run through the streamed import.
const IMPORT_LABEL: &str = "belfry, tasks:import";

/// Tasks per import request by default. A bulk loader cuts its file into requests of about
/// this size, a few connections each sending theirs in sequence, rather than one request per
/// connection: an import that stops (`complete: false`, a lost connection) is resent from its
/// `stopped_at_line`, so a bounded request bounds what the loader keeps to resend and what a
/// failure costs, and each answer is a checkpoint. 20,000 lines of 200 B payloads are about
/// 5 MB, 20 of the server's 1,000-task batches, so the cost of a request is spread thin.
const IMPORT_LINES_DEFAULT: usize = 20_000;

/// The server's default bound on one import's body (`limits.import_body_max`): a longer body
/// would be refused with 413, so the bench refuses --import-lines that would make one.
const IMPORT_BODY_BYTES_MAX: usize = 1024 * 1024 * 1024;

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

/// Which of belfry's submit endpoints a run measures (`--via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// The single-task submit (`--batch 1`) or the batch submit (`tasks:batch`).
    Batch,
    /// The streamed NDJSON import (`tasks:import`), --import-lines tasks per request.
    Import,
    /// The batch submit, then the import, each on a fresh server of the same config with
    /// --spawn: the import's rate as a share of the batch submit's, from one run.
    Both,
}

impl Via {
    fn batch(self) -> bool {
        matches!(self, Via::Batch | Via::Both)
    }

    fn import(self) -> bool {
        matches!(self, Via::Import | Via::Both)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct IngestArgs {
    /// Tasks to submit.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: u64,
    /// Tasks per request: 1 uses the single-task endpoint, 2..=1000 the batch endpoint (and
    /// the baselines send the same requests, whatever --via is).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Which endpoint belfry's run submits through: `batch` (the single-task or batch submit,
    /// by --batch), `import` (the streamed NDJSON import), or `both`, one after the other.
    #[arg(long, value_enum, default_value_t = Via::Batch)]
    pub via: Via,
    /// With --via import or both: tasks per import request (one NDJSON line each); the
    /// connections take the requests in turn, each sending its own in sequence.
    #[arg(long, default_value_t = IMPORT_LINES_DEFAULT)]
    pub import_lines: usize,
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
    /// token (`BELFRY_ADMIN_TOKEN`), every request carrying it: what authentication costs
    /// (through the batch submit: not with --via import).
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
    validate_via(&args)?;
    let machine = Machine::describe();
    let due = due_times(
        args.tasks,
        unix_ms() + args.due_in_s * 1_000,
        args.due_window_s * 1_000,
    );
    let bodies = Arc::new(Bodies::build(&due, args.batch, args.payload_bytes));
    let import_bodies = args
        .via
        .import()
        .then(|| Arc::new(Bodies::ndjson(&due, args.import_lines, args.payload_bytes)));
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
        import_bodies: import_bodies.as_ref(),
    };

    let mut measured = if args.server.baselines_only {
        Measured::default()
    } else {
        load.belfry_runs().await?
    };
    if args.baselines.wants(Baseline::Http) {
        measured.trivial = Some(load.trivial().await?);
    }
    if args.baselines.wants(Baseline::Fsync) {
        measured.fsync = Some(load.raw_append().await?);
    }
    if args.baselines.wants(Baseline::Redis) {
        measured.redis = Some(redis_ingest(&args, &due).await?);
    }
    let import_bodies = import_bodies.as_deref();
    Ok(build_report(
        &args,
        machine,
        &bodies,
        import_bodies,
        measured,
    ))
}

/// The import's arguments, checked against the rest of the run's. --import-lines is not
/// looked at without the import, so a batch-only command means what it always did.
fn validate_via(args: &IngestArgs) -> Result<(), BenchError> {
    if !args.via.import() {
        return Ok(());
    }
    if args.import_lines == 0 {
        return Err(BenchError::invalid("--import-lines", "must be at least 1"));
    }
    let line_max = args.payload_bytes + NDJSON_LINE_OVERHEAD_BYTES;
    if args.import_lines.saturating_mul(line_max) > IMPORT_BODY_BYTES_MAX {
        return Err(BenchError::invalid(
            "--import-lines",
            format!(
                "{} lines of up to {line_max} B could pass the server's default import body limit of {} MiB (limits.import_body_max): at most {} lines with --payload-bytes {}",
                args.import_lines,
                IMPORT_BODY_BYTES_MAX >> 20,
                IMPORT_BODY_BYTES_MAX / line_max,
                args.payload_bytes
            ),
        ));
    }
    if args.via == Via::Both && args.batch < 2 {
        return Err(BenchError::invalid(
            "--batch",
            "--via both compares the import with the batch submit (tasks:batch): give --batch 2..=1000, e.g. 1000",
        ));
    }
    if args.via == Via::Import && args.with_token {
        return Err(BenchError::invalid(
            "--with-token",
            "measures the batch submit with a token: use it with --via batch or both",
        ));
    }
    Ok(())
}

/// An import run that did not store every task it sent (a request answered `complete:
/// false` or an error status, a refused line, a lost connection) measured no import of the
/// whole load: the run fails with the first error instead of reporting a rate. `--via both`
/// holds its batch run to the same, as a share of a partial run would mean nothing.
fn stored_all(o: &IngestOutcome, tasks: u64) -> anyhow::Result<()> {
    if o.accepted == tasks && o.rejected == 0 && o.failed_requests == 0 {
        return Ok(());
    }
    anyhow::bail!(
        "{}: {} of {} tasks stored ({} not, {} of {} requests failed); first error: {}",
        o.label,
        o.accepted,
        tasks,
        o.rejected,
        o.failed_requests,
        o.requests,
        o.first_error.as_deref().unwrap_or("none recorded")
    )
}

/// One of belfry's runs: which endpoint, which bodies, how its answers read.
struct Leg<'a> {
    label: &'static str,
    path: String,
    bodies: &'a Arc<Bodies>,
    answers: Answers,
    progress: &'static str,
}

/// The same requests, sent to each system in turn.
struct IngestLoad<'a> {
    args: &'a IngestArgs,
    queue: &'a str,
    path: &'a str,
    bodies: &'a Arc<Bodies>,
    /// The same tasks as NDJSON, with --via import or both.
    import_bodies: Option<&'a Arc<Bodies>>,
}

impl<'a> IngestLoad<'a> {
    fn batch_leg(&self) -> Leg<'a> {
        Leg {
            label: BELFRY_LABEL,
            path: self.path.to_string(),
            bodies: self.bodies,
            answers: Answers::Belfry,
            progress: "belfry ingest",
        }
    }

    fn import_leg(&self) -> Option<Leg<'a>> {
        Some(Leg {
            label: IMPORT_LABEL,
            path: format!("/v1/queues/{}/tasks:import", self.queue),
            bodies: self.import_bodies?,
            answers: Answers::Import,
            progress: "belfry tasks:import",
        })
    }

    fn job(&self, leg: &Leg, label: &str, server: &ServerUnderTest) -> IngestJob {
        IngestJob {
            label: label.into(),
            target: server.target.clone(),
            path: leg.path.clone(),
            body_paths: None,
            bodies: leg.bodies.clone(),
            connections: self.args.connections,
            answers: leg.answers,
            due_at_ms: None,
            server_pid: server.pid,
            keep_ids: None,
        }
    }

    /// Belfry's runs as --via asks: the batch submit first (and with a token), then the
    /// import, each on a server of its own when spawned, so neither's data weighs on the
    /// other's.
    async fn belfry_runs(&self) -> anyhow::Result<Measured> {
        let mut m = Measured::default();
        if self.args.via.batch() {
            let (outcome, written) = self.belfry(&self.batch_leg()).await?;
            if self.args.via == Via::Both {
                stored_all(&outcome, self.args.tasks)?;
            }
            m.belfry = Some(outcome);
            m.belfry_written = written;
            if self.args.with_token {
                m.with_token = Some(self.belfry_with_token().await?);
            }
        }
        if let Some(leg) = self.import_leg() {
            let (outcome, written) = self.belfry(&leg).await?;
            stored_all(&outcome, self.args.tasks)?;
            m.import = Some(outcome);
            m.import_written = written;
        }
        Ok(m)
    }

    /// One of belfry's runs, and the bytes its server wrote to storage meanwhile (known with
    /// a pid).
    async fn belfry(&self, leg: &Leg<'_>) -> anyhow::Result<(IngestOutcome, Option<u64>)> {
        let args = self.args;
        let server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
        create_queue(&server.target, self.queue, "{}").await?;
        let written_before = server.pid.and_then(crate::sys::storage_write_bytes);
        let outcome = run_ingest(
            self.job(leg, leg.label, &server),
            progress(&args.output, args.tasks, leg.progress),
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
            self.job(&self.batch_leg(), WITH_TOKEN_LABEL, &server),
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
#[derive(Default)]
struct Measured {
    belfry: Option<IngestOutcome>,
    /// Bytes the server wrote to storage during its run (known for a server with a pid).
    belfry_written: Option<u64>,
    /// Belfry's run through the import, and what its server wrote.
    import: Option<IngestOutcome>,
    import_written: Option<u64>,
    with_token: Option<IngestOutcome>,
    trivial: Option<IngestOutcome>,
    fsync: Option<RawAppend>,
    redis: Option<IngestOutcome>,
}

impl Measured {
    /// The run the other rows are divided by: the batch submit's, or the import's alone.
    fn reference(&self) -> Option<&IngestOutcome> {
        self.belfry.as_ref().or(self.import.as_ref())
    }
}

fn build_report(
    args: &IngestArgs,
    machine: Machine,
    bodies: &Bodies,
    import_bodies: Option<&Bodies>,
    m: Measured,
) -> Report {
    let mut table = ingest_table(args);
    let reference = m.reference();
    let mut notes = Vec::new();
    for o in [&m.belfry, &m.import, &m.with_token, &m.trivial, &m.redis]
        .into_iter()
        .flatten()
    {
        system_row(&mut table, o, reference);
        notes.extend(system_notes(o));
    }
    if let (Some(b), Some(t)) = (&m.belfry, &m.with_token) {
        notes.push(auth_cost_note(b, t));
    }
    if let (Some(b), Some(i)) = (&m.belfry, &m.import) {
        notes.push(import_share_note(b, i, args.server.spawn));
    }
    if let Some(f) = &m.fsync {
        fsync_row(&mut table, f, reference.map_or(0.0, |r| r.tasks_per_s));
        notes.push(fsync_note(f));
    }
    if let (Some(written), Some(b)) = (m.belfry_written, &m.belfry) {
        notes.push(written_note(b, written, bodies, m.fsync.as_ref()));
    }
    if let (Some(written), Some(i), Some(import_bodies)) =
        (m.import_written, &m.import, import_bodies)
    {
        notes.push(written_note(i, written, import_bodies, m.fsync.as_ref()));
    }
    if let Some(b) = &m.belfry {
        notes.extend(target_notes(args, b, m.trivial.as_ref(), m.fsync.as_ref()));
    }
    if m.redis.is_some() {
        notes.push(
            "Redis runs with appendfsync everysec (not fsync per acknowledgement, unlike belfry)."
                .into(),
        );
    }
    Report {
        scenario: scenario(args),
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: report_data(args, bodies, import_bodies, &m),
    }
}

/// The default section name: what was measured.
fn scenario(args: &IngestArgs) -> String {
    match args.via {
        Via::Batch if args.batch == 1 => "ingest-single".into(),
        Via::Batch => "ingest-batch".into(),
        Via::Import => "ingest-import".into(),
        Via::Both => "ingest-import-vs-batch".into(),
    }
}

/// The raw numbers for scripts.
fn report_data(
    args: &IngestArgs,
    bodies: &Bodies,
    import_bodies: Option<&Bodies>,
    m: &Measured,
) -> serde_json::Value {
    let import_over_batch = match (&m.belfry, &m.import) {
        (Some(b), Some(i)) if b.tasks_per_s > 0.0 => Some(i.tasks_per_s / b.tasks_per_s),
        _ => None,
    };
    json!({
        "tasks": args.tasks,
        "batch": args.batch,
        "via": format!("{:?}", args.via).to_lowercase(),
        "import_lines": args.via.import().then_some(args.import_lines),
        "connections": args.connections,
        "payload_bytes": args.payload_bytes,
        "request_bytes_total": bodies.total_bytes(),
        "import_request_bytes_total": import_bodies.map(Bodies::total_bytes),
        "belfry": m.belfry,
        "belfry_storage_write_bytes": m.belfry_written,
        "belfry_import": m.import,
        "belfry_import_storage_write_bytes": m.import_written,
        "import_over_batch": import_over_batch,
        "trivial_http": m.trivial,
        "raw_fsync_append": m.fsync,
        "redis": m.redis,
    })
}

/// The requests of the run, as the table's title names them.
fn shape(args: &IngestArgs) -> String {
    let batch = if args.batch == 1 {
        "one task per request".to_string()
    } else {
        format!("batches of {}", args.batch)
    };
    let import = format!(
        "tasks:import of {} lines per request",
        thousands(args.import_lines as f64)
    );
    let baselines = [Baseline::Fsync, Baseline::Http, Baseline::Redis]
        .into_iter()
        .any(|b| args.baselines.wants(b));
    match args.via {
        Via::Batch => batch,
        // The baselines still send the batch submit's requests.
        Via::Import if baselines => format!("{import} (baselines: {batch})"),
        Via::Import => import,
        Via::Both => format!("{batch}, then {import}"),
    }
}

/// The empty table, titled with the run's shape.
fn ingest_table(args: &IngestArgs) -> Table {
    Table::new(
        format!(
            "ingest: {} tasks of {} B, {}, {} connections",
            thousands(args.tasks as f64),
            args.payload_bytes,
            shape(args),
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

/// One measured system's row; the last column divides `reference`'s rate by this one's.
fn system_row(table: &mut Table, o: &IngestOutcome, reference: Option<&IngestOutcome>) {
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
        match reference {
            Some(r) if r.label == o.label => "1.00×".into(),
            Some(r) => ratio(r.tasks_per_s, o.tasks_per_s),
            None => ratio(0.0, o.tasks_per_s),
        },
    ]);
}

/// The import's rate as a share of the batch submit's, both from this run, and the server's
/// CPU per task in each: what streaming costs or saves beside the batch requests.
fn import_share_note(batch: &IngestOutcome, import: &IngestOutcome, spawned: bool) -> String {
    let cpu_per_task = |o: &IngestOutcome| {
        o.cpu
            .server_cores
            .map(|cores| cores * o.elapsed_s / (o.accepted.max(1) as f64) * 1e6)
    };
    let cpu = match (cpu_per_task(batch), cpu_per_task(import)) {
        (Some(b), Some(i)) => format!("; server CPU {i:.2} vs {b:.2} µs per task"),
        _ => String::new(),
    };
    format!(
        "tasks:import ÷ tasks:batch: {} ({} vs {} tasks/s{cpu}; {}, the batch submit first, in this run).",
        ratio(import.tasks_per_s, batch.tasks_per_s),
        thousands(import.tasks_per_s),
        thousands(batch.tasks_per_s),
        if spawned {
            "two fresh servers of the same config, one after the other"
        } else {
            "the same server, one after the other"
        },
    )
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
fn written_note(
    o: &IngestOutcome,
    written: u64,
    bodies: &Bodies,
    raw: Option<&RawAppend>,
) -> String {
    let per_task = |bytes: u64, tasks: u64| bytes as f64 / tasks.max(1) as f64;
    let belfry = per_task(written, o.accepted);
    let request = per_task(bodies.total_bytes(), bodies.tasks);
    let mut note = format!(
        "{}: the server wrote {belfry:.0} B per task to storage during its run, {:.2}× the request bytes ({request:.0} B per task)",
        o.label,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: IngestArgs,
    }

    fn args(extra: &[&str]) -> IngestArgs {
        Cli::try_parse_from(std::iter::once("ingest").chain(extra.iter().copied()))
            .unwrap()
            .args
    }

    fn outcome(label: &str, accepted: u64, tasks_per_s: f64) -> IngestOutcome {
        IngestOutcome {
            label: label.into(),
            requests: 10,
            accepted,
            rejected: 0,
            failed_requests: 0,
            first_error: None,
            elapsed_s: 1.0,
            tasks_per_s,
            requests_per_s: 10.0,
            latency: Default::default(),
            cpu: Default::default(),
            answered_after_due: 0,
        }
    }

    #[test]
    fn via_defaults_to_the_batch_submit_and_ignores_the_import_lines_then() {
        let a = args(&[]);
        assert_eq!((a.via, a.import_lines), (Via::Batch, IMPORT_LINES_DEFAULT));
        assert_eq!(scenario(&a), "ingest-single");
        assert!(validate_via(&args(&["--import-lines", "0"])).is_ok());
        let both = args(&["--via", "both", "--batch", "1000"]);
        assert!(validate_via(&both).is_ok());
        assert_eq!(scenario(&both), "ingest-import-vs-batch");
        assert_eq!(scenario(&args(&["--via", "import"])), "ingest-import");
        assert!(Cli::try_parse_from(["ingest", "--via", "stream"]).is_err());
    }

    #[test]
    fn import_arguments_are_refused_with_the_flag_named() {
        for (flags, named) in [
            (
                &["--via", "import", "--import-lines", "0"][..],
                "--import-lines",
            ),
            // 5,000 lines of 1 MiB payloads pass the server's 1 GiB import body limit.
            (
                &[
                    "--via",
                    "import",
                    "--import-lines",
                    "5000",
                    "--payload-bytes",
                    "1048576",
                ][..],
                "at most 1023 lines",
            ),
            (&["--via", "both"][..], "--batch"),
            (&["--via", "import", "--with-token"][..], "--with-token"),
        ] {
            let err = validate_via(&args(flags)).unwrap_err().to_string();
            assert!(err.contains(named), "{flags:?}: {err}");
        }
        assert!(validate_via(&args(&["--via", "both", "--batch", "2", "--with-token"])).is_ok());
    }

    #[test]
    fn a_run_that_stored_part_of_the_tasks_fails_with_its_first_error() {
        assert!(stored_all(&outcome(IMPORT_LABEL, 100, 1.0), 100).is_ok());
        let mut partial = outcome(IMPORT_LABEL, 40, 1.0);
        partial.rejected = 60;
        partial.first_error = Some("HTTP 507: {\"complete\":false}".into());
        let err = stored_all(&partial, 100).unwrap_err().to_string();
        assert!(
            err.contains("40 of 100 tasks stored") && err.contains("HTTP 507"),
            "{err}"
        );
        // A missing count is as bad as a rejected one.
        assert!(stored_all(&outcome(IMPORT_LABEL, 99, 1.0), 100).is_err());
    }

    #[test]
    fn the_import_is_quoted_as_a_share_of_the_batch_submit() {
        let note = import_share_note(
            &outcome(BELFRY_LABEL, 100, 800_000.0),
            &outcome(IMPORT_LABEL, 100, 600_000.0),
            true,
        );
        assert!(
            note.starts_with("tasks:import ÷ tasks:batch: 0.75× (600,000 vs 800,000 tasks/s;"),
            "{note}"
        );
        assert!(note.contains("two fresh servers"));
        let both = args(&["--via", "both", "--batch", "1000", "--import-lines", "5000"]);
        assert!(shape(&both).contains("batches of 1000, then tasks:import of 5,000 lines"));
    }

    #[test]
    fn rows_divide_the_batch_run_or_else_the_import_run() {
        let (batch, import) = (
            outcome(BELFRY_LABEL, 1, 900.0),
            outcome(IMPORT_LABEL, 1, 600.0),
        );
        let last = |reference: Option<&IngestOutcome>, o: &IngestOutcome| {
            let mut t = ingest_table(&args(&[]));
            system_row(&mut t, o, reference);
            t.rows[0].last().cloned().unwrap()
        };
        assert_eq!(last(Some(&batch), &import), "1.50×");
        assert_eq!(last(Some(&batch), &batch), "1.00×");
        // --via import: the import is the reference.
        let only_import = Measured {
            import: Some(import.clone()),
            ..Measured::default()
        };
        assert_eq!(last(only_import.reference(), &import), "1.00×");
    }
}
