//! `belfry bench pending --point-ops N`: get, cancel and reschedule single far tasks by id,
//! black-box over HTTP, after the fill and the `kill -9` restart (so the server has loaded
//! none of the far buckets and every phase starts on first touches).
//!
//! First one `GET` alone: the first request after the restart, so certainly the first touch
//! of its bucket (which ops of a phase are first touches is not knowable from outside). Then
//! three phases on disjoint, randomly chosen filled tasks: N `GET`s, N `DELETE`s (cancel),
//! N/10 `PATCH`es (reschedule to a due time past the fill's window, still far). Each phase
//! reports its rate, latency percentiles, non-2xx answers and the server's RSS before and
//! after. Then a sample of the cancelled and rescheduled tasks is read back to check the
//! change took.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::http::{HttpConn, Target};
use crate::report::{thousands, Table};
use crate::stats::{format_us, new_histogram, record_clamped, Percentiles};
use crate::sys::rss_bytes;

/// Issue #16 target: p99 of the first touch (get or cancel) of a task in a far bucket.
pub const FIRST_TOUCH_P99_TARGET_US: u64 = 5_000;
/// Issue #16 target: RSS growth over the cancels...
pub const CANCEL_RSS_GROWTH_TARGET_BYTES: u64 = 64 * 1024 * 1024;
/// ...stated for this many cancels across 100M pending.
pub const CANCEL_RSS_GROWTH_TARGET_CANCELS: u64 = 1_000_000;

/// Ids the fill samples at least, so a small `--point-ops` still picks from a wide spread of
/// the fill (100k ids of ~30 bytes: a few MB).
pub const ID_SAMPLE_MIN: usize = 100_000;
/// Most point ops a run may ask for: the sample holds 2.1 ids per op (~600 MB at this count).
pub const POINT_OPS_MAX: u64 = 10_000_000;
/// Cancelled and rescheduled tasks read back after their phase.
pub const VERIFY_SAMPLE: usize = 100;
/// A reschedule moves its task this far past the end of the fill's window: still far in the
/// future, and in another bucket than the fill's.
pub const RESCHEDULE_PAST_WINDOW_MS: u64 = 7 * 86_400_000;

/// Longest error text kept for the report.
const ERROR_TEXT_MAX: usize = 300;

/// Reschedules run for `point_ops` gets and cancels: a tenth, at least one.
pub fn reschedules_for(point_ops: u64) -> u64 {
    (point_ops / 10).max(1)
}

/// Distinct tasks `point_ops` needs: the lone first get, and every phase on tasks of its own.
pub fn tasks_needed(point_ops: u64) -> u64 {
    point_ops
        .saturating_mul(2)
        .saturating_add(reschedules_for(point_ops))
        .saturating_add(1)
}

/// How many filled ids to keep for `point_ops` (0: none, the fill keeps no ids).
pub fn sample_capacity(point_ops: u64) -> usize {
    if point_ops == 0 {
        return 0;
    }
    usize::try_from(tasks_needed(point_ops))
        .unwrap_or(usize::MAX)
        .max(ID_SAMPLE_MIN)
}

/// Checks the point-op flags against each other and the fill, naming the flag at fault.
pub fn validate(point_ops: u64, point_connections: usize, tasks: u64) -> Result<(), BenchError> {
    if point_ops == 0 {
        return Ok(());
    }
    if point_ops > POINT_OPS_MAX {
        return Err(BenchError::invalid(
            "--point-ops",
            format!("at most {POINT_OPS_MAX}, got {point_ops}"),
        ));
    }
    if point_connections == 0 {
        return Err(BenchError::invalid(
            "--point-connections",
            "must be at least 1",
        ));
    }
    let needed = tasks_needed(point_ops);
    if needed > tasks {
        return Err(BenchError::invalid(
            "--point-ops",
            format!(
                "{point_ops} point ops touch {needed} distinct tasks (1 + {point_ops} gets, \
                 {point_ops} cancels, {} reschedules), more than --tasks {tasks} fills",
                reschedules_for(point_ops)
            ),
        ));
    }
    Ok(())
}

/// The ids each phase works on: disjoint, in the (random) order of the sample.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PhaseIds {
    /// The lone first get after the restart.
    pub first_get: Vec<String>,
    pub get: Vec<String>,
    pub cancel: Vec<String>,
    pub reschedule: Vec<String>,
}

/// Splits a shuffled sample into the phases' ids: one first get, `point_ops` gets, then
/// `point_ops` cancels, then the reschedules. A short sample (tasks rejected by the fill)
/// shortens the later phases first.
pub fn split_ids(ids: Vec<String>, point_ops: u64) -> PhaseIds {
    let n = usize::try_from(point_ops).unwrap_or(usize::MAX);
    let r = usize::try_from(reschedules_for(point_ops)).unwrap_or(usize::MAX);
    let mut ids = ids.into_iter();
    let mut take = |count: usize| ids.by_ref().take(count).collect::<Vec<_>>();
    PhaseIds {
        first_get: take(1),
        get: take(n),
        cancel: take(n),
        reschedule: take(r),
    }
}

/// One kind of point operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PointOp {
    /// The lone get that is the first request after the restart.
    #[serde(rename = "first_get")]
    FirstGet,
    Get,
    Cancel,
    Reschedule,
}

impl PointOp {
    fn method(self) -> Method {
        match self {
            PointOp::FirstGet | PointOp::Get => Method::GET,
            PointOp::Cancel => Method::DELETE,
            PointOp::Reschedule => Method::PATCH,
        }
    }

    fn label(self) -> &'static str {
        match self {
            PointOp::FirstGet => "first get (alone)",
            PointOp::Get => "get",
            PointOp::Cancel => "cancel",
            PointOp::Reschedule => "reschedule",
        }
    }
}

/// What one phase measured. Latency is of 2xx answers only, so fast errors cannot flatter
/// it; `errors` counts the rest (non-2xx and failed requests).
#[derive(Debug, Clone, Serialize)]
pub struct PhaseOutcome {
    pub op: PointOp,
    pub ops: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed_s: f64,
    pub ops_per_s: f64,
    pub latency: Percentiles,
    pub rss_before_bytes: Option<u64>,
    pub rss_after_bytes: Option<u64>,
}

impl PhaseOutcome {
    /// RSS after the phase minus before (0 when it shrank), when the pid is known.
    pub fn rss_growth_bytes(&self) -> Option<u64> {
        Some(self.rss_after_bytes?.saturating_sub(self.rss_before_bytes?))
    }
}

/// The read-back after the cancel and reschedule phases.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Verification {
    pub cancelled_checked: u64,
    /// Cancelled tasks that answered 404: the API may forget finished tasks, so these are
    /// not mismatches, but they are counted to show it happened.
    pub cancelled_forgotten: u64,
    pub rescheduled_checked: u64,
    pub mismatches: u64,
    pub first_mismatch: Option<String>,
}

/// Everything `--point-ops` measured.
#[derive(Debug, Clone, Serialize)]
pub struct PointOpsOutcome {
    /// Filled ids the sample held to pick from.
    pub sampled_ids: u64,
    /// Whether the server was restarted (`kill -9`) between the fill and the point ops, so
    /// the phases start with nothing loaded.
    pub after_restart: bool,
    pub reschedule_to_ms: u64,
    pub phases: Vec<PhaseOutcome>,
    pub verification: Verification,
}

impl PointOpsOutcome {
    pub fn phase(&self, op: PointOp) -> Option<&PhaseOutcome> {
        self.phases.iter().find(|p| p.op == op)
    }
}

/// Where and how the point ops run.
pub struct PointOpsPlan<'a> {
    pub target: &'a Target,
    pub queue: &'a str,
    pub pid: Option<u32>,
    pub connections: usize,
    pub point_ops: u64,
    pub reschedule_to_ms: u64,
    pub after_restart: bool,
}

/// Runs the three phases on `ids` (a shuffled sample of the filled tasks), then the
/// read-back.
pub async fn run(plan: PointOpsPlan<'_>, ids: Vec<String>) -> PointOpsOutcome {
    let sampled_ids = ids.len() as u64;
    let ids = split_ids(ids, plan.point_ops);
    let reschedule_body = Bytes::from(format!("{{\"run_at_ms\":{}}}", plan.reschedule_to_ms));
    let mut phases = Vec::new();
    for (op, phase_ids, body) in [
        (PointOp::FirstGet, &ids.first_get, Bytes::new()),
        (PointOp::Get, &ids.get, Bytes::new()),
        (PointOp::Cancel, &ids.cancel, Bytes::new()),
        (PointOp::Reschedule, &ids.reschedule, reschedule_body),
    ] {
        phases.push(run_phase(&plan, op, Arc::new(phase_ids.clone()), body).await);
    }
    let verification = verify(&plan, &ids).await;
    PointOpsOutcome {
        sampled_ids,
        after_restart: plan.after_restart,
        reschedule_to_ms: plan.reschedule_to_ms,
        phases,
        verification,
    }
}

fn task_path(queue: &str, id: &str) -> String {
    format!("/v1/queues/{queue}/tasks/{id}")
}

fn clip(text: String) -> String {
    text.chars().take(ERROR_TEXT_MAX).collect()
}

/// One phase: `connections` workers, each on its own keep-alive connection, take the next
/// id from one counter until none is left.
async fn run_phase(
    plan: &PointOpsPlan<'_>,
    op: PointOp,
    ids: Arc<Vec<String>>,
    body: Bytes,
) -> PhaseOutcome {
    let rss_before_bytes = plan.pid.and_then(rss_bytes).map(|r| r.0);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..plan.connections.max(1) {
        let (target, queue) = (plan.target.clone(), plan.queue.to_string());
        let (ids, next, body) = (ids.clone(), next.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            let mut latency = new_histogram();
            let (mut errors, mut first_error) = (0u64, None::<String>);
            let mut conn = None;
            while let Some(id) = ids.get(next.fetch_add(1, Ordering::Relaxed)) {
                if conn.is_none() {
                    conn = HttpConn::connect(&target).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    errors += 1;
                    first_error.get_or_insert_with(|| format!("connect to {}", target.addr));
                    continue;
                };
                let sent = Instant::now();
                let path = task_path(&queue, id);
                match c.request(op.method(), &path, body.clone()).await {
                    Ok((status, _)) if status.is_success() => {
                        record_clamped(&mut latency, sent.elapsed().as_micros() as u64)
                    }
                    Ok((status, answer)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| {
                            clip(format!(
                                "{} {path}: HTTP {status}: {}",
                                op.method(),
                                String::from_utf8_lossy(&answer)
                            ))
                        });
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| clip(e.to_string()));
                        conn = None;
                    }
                }
            }
            (latency, errors, first_error)
        }));
    }
    let mut latency = new_histogram();
    let (mut errors, mut first_error) = (0, None);
    for worker in workers {
        match worker.await {
            Ok((h, e, first)) => {
                let _ = latency.add(&h);
                errors += e;
                first_error = first_error.or(first);
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("worker panicked: {e}"));
            }
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64().max(1e-9);
    PhaseOutcome {
        op,
        ops: ids.len() as u64,
        errors,
        first_error,
        elapsed_s,
        ops_per_s: ids.len() as f64 / elapsed_s,
        latency: Percentiles::of(&latency),
        rss_before_bytes,
        rss_after_bytes: plan.pid.and_then(rss_bytes).map(|r| r.0),
    }
}

/// How one read-back turned out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Ok,
    /// 404 for a finished task, which the API may forget.
    Forgotten,
    Mismatch(String),
}

#[derive(Deserialize)]
struct TaskState {
    state: String,
    due_at_ms: u64,
}

fn read_task(status: StatusCode, body: &[u8]) -> Result<TaskState, String> {
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(body)));
    }
    serde_json::from_slice(body).map_err(|e| format!("task answer without state/due_at_ms: {e}"))
}

/// A cancelled task must read back as `cancelled` (or be forgotten).
pub fn check_cancelled(status: StatusCode, body: &[u8]) -> Check {
    if status == StatusCode::NOT_FOUND {
        return Check::Forgotten;
    }
    match read_task(status, body) {
        Ok(t) if t.state == "cancelled" => Check::Ok,
        Ok(t) => Check::Mismatch(format!("cancelled task reads as {:?}", t.state)),
        Err(e) => Check::Mismatch(e),
    }
}

/// A rescheduled task must read back scheduled at its new due time.
pub fn check_rescheduled(status: StatusCode, body: &[u8], due_at_ms: u64) -> Check {
    match read_task(status, body) {
        Ok(t) if t.state == "scheduled" && t.due_at_ms == due_at_ms => Check::Ok,
        Ok(t) => Check::Mismatch(format!(
            "rescheduled task reads as {:?} due at {} (expected scheduled at {due_at_ms})",
            t.state, t.due_at_ms
        )),
        Err(e) => Check::Mismatch(e),
    }
}

/// Reads back up to [`VERIFY_SAMPLE`] cancelled and rescheduled tasks.
async fn verify(plan: &PointOpsPlan<'_>, ids: &PhaseIds) -> Verification {
    let mut v = Verification::default();
    let mut conn = HttpConn::connect(plan.target).await.ok();
    let cancelled = ids.cancel.iter().take(VERIFY_SAMPLE).map(|id| (id, None));
    let rescheduled = ids.reschedule.iter().take(VERIFY_SAMPLE);
    let all = cancelled.chain(rescheduled.map(|id| (id, Some(plan.reschedule_to_ms))));
    for (id, due) in all {
        let path = task_path(plan.queue, id);
        let check = match conn.as_mut() {
            None => Check::Mismatch(format!("connect to {}", plan.target.addr)),
            Some(c) => match c.request(Method::GET, &path, Bytes::new()).await {
                Ok((status, body)) => match due {
                    None => check_cancelled(status, &body),
                    Some(due) => check_rescheduled(status, &body, due),
                },
                Err(e) => Check::Mismatch(e.to_string()),
            },
        };
        match due {
            None => v.cancelled_checked += 1,
            Some(_) => v.rescheduled_checked += 1,
        }
        match check {
            Check::Ok => {}
            Check::Forgotten => v.cancelled_forgotten += 1,
            Check::Mismatch(why) => {
                v.mismatches += 1;
                v.first_mismatch
                    .get_or_insert_with(|| clip(format!("{path}: {why}")));
            }
        }
    }
    v
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// met / missed for a number against its bound, "not measured" without one.
fn verdict(value: Option<u64>, bound: u64) -> &'static str {
    match value {
        None => "not measured",
        Some(v) if v <= bound => "met",
        Some(_) => "missed",
    }
}

/// The p99 of a phase, None when no op of it succeeded.
fn p99(phase: Option<&PhaseOutcome>) -> Option<u64> {
    phase
        .filter(|p| p.latency.count > 0)
        .map(|p| p.latency.p99_us)
}

/// The point-op table: one row per phase, then the read-back, with the issue's targets.
pub fn table(o: &PointOpsOutcome, pending: u64) -> Table {
    let dash = || "-".to_string();
    let mut table = Table::new(
        format!(
            "point ops on far tasks by id ({} pending, {}; {} ids sampled)",
            thousands(pending as f64),
            if o.after_restart {
                "after kill -9 and restart: first touches"
            } else {
                "no restart: buckets may be loaded"
            },
            thousands(o.sampled_ids as f64)
        ),
        &[
            "phase",
            "ops",
            "ops/s",
            "p50",
            "p99",
            "p99.9",
            "max",
            "errors",
            "server RSS before → after",
            "target",
        ],
    );
    for p in &o.phases {
        let timed = p.latency.count > 0;
        let us = |v: u64| if timed { format_us(v) } else { dash() };
        table.row(vec![
            p.op.label().into(),
            thousands(p.ops as f64),
            thousands(p.ops_per_s),
            us(p.latency.p50_us),
            us(p.latency.p99_us),
            us(p.latency.p999_us),
            us(p.latency.max_us),
            thousands(p.errors as f64),
            match (p.rss_before_bytes, p.rss_after_bytes) {
                (Some(b), Some(a)) => format!("{} → {}", mib(b), mib(a)),
                _ => dash(),
            },
            match p.op {
                PointOp::FirstGet => format!("≤ {}", format_us(FIRST_TOUCH_P99_TARGET_US)),
                PointOp::Get => format!("p99 ≤ {}", format_us(FIRST_TOUCH_P99_TARGET_US)),
                PointOp::Cancel => format!(
                    "p99 ≤ {}; RSS growth ≤ {} (for {} cancels)",
                    format_us(FIRST_TOUCH_P99_TARGET_US),
                    mib(CANCEL_RSS_GROWTH_TARGET_BYTES),
                    thousands(CANCEL_RSS_GROWTH_TARGET_CANCELS as f64)
                ),
                PointOp::Reschedule => dash(),
            },
        ]);
    }
    let v = &o.verification;
    let mut read_back = vec![dash(); 10];
    read_back[0] = "read-back mismatches".into();
    read_back[1] = thousands((v.cancelled_checked + v.rescheduled_checked) as f64);
    read_back[7] = thousands(v.mismatches as f64);
    read_back[9] = "0".into();
    table.row(read_back);
    table
}

/// The notes that judge the targets, and what else a reader must know to trust the table.
pub fn notes(o: &PointOpsOutcome, pending: u64, fill_tasks_per_s: Option<f64>) -> Vec<String> {
    let mut notes = Vec::new();
    let (get, cancel) = (o.phase(PointOp::Get), o.phase(PointOp::Cancel));
    let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), format_us);
    // One op: its p99 is its time.
    let first = p99(o.phase(PointOp::FirstGet));
    notes.push(format!(
        "first touch get/cancel p99 ≤ {}: get {} ({}), cancel {} ({}); the first get after \
         the restart, alone (certainly the first touch of its bucket): {} ({}).",
        format_us(FIRST_TOUCH_P99_TARGET_US),
        show(p99(get)),
        verdict(p99(get), FIRST_TOUCH_P99_TARGET_US),
        show(p99(cancel)),
        verdict(p99(cancel), FIRST_TOUCH_P99_TARGET_US),
        show(first),
        verdict(first, FIRST_TOUCH_P99_TARGET_US),
    ));
    let growth = cancel.and_then(PhaseOutcome::rss_growth_bytes);
    notes.push(format!(
        "RSS growth over the cancel phase ≤ {} (stated for {} cancels across 100M pending; \
         this run: {} cancels across {} pending): {} ({}).",
        mib(CANCEL_RSS_GROWTH_TARGET_BYTES),
        thousands(CANCEL_RSS_GROWTH_TARGET_CANCELS as f64),
        thousands(cancel.map_or(0, |c| c.ops) as f64),
        thousands(pending as f64),
        growth.map_or_else(|| "-".to_string(), mib),
        verdict(growth, CANCEL_RSS_GROWTH_TARGET_BYTES),
    ));
    if let (Some(c), Some(fill)) = (cancel, fill_tasks_per_s) {
        notes.push(format!(
            "cancel throughput {} ops/s beside submit throughput {} tasks/s (the fill's).",
            thousands(c.ops_per_s),
            thousands(fill)
        ));
    }
    let v = &o.verification;
    notes.push(format!(
        "read-back: {} cancelled tasks ({} forgotten: 404, which the API allows for finished \
         tasks) and {} rescheduled tasks checked: {} mismatches (must be 0){}.",
        v.cancelled_checked,
        v.cancelled_forgotten,
        v.rescheduled_checked,
        v.mismatches,
        v.first_mismatch
            .as_ref()
            .map_or_else(String::new, |m| format!("; first: {m}"))
    ));
    notes.push(
        "a far bucket a server loads whole is paid for by the first op that touches it: with \
         one bucket (--spread-days 0) that is the first get alone, and the p99 of the phases \
         after it shows the cost of a task in an already loaded bucket."
            .into(),
    );
    for p in o.phases.iter().filter(|p| p.errors > 0) {
        notes.push(format!(
            "{}: {} of {} ops failed; first: {}",
            p.op.label(),
            thousands(p.errors as f64),
            thousands(p.ops as f64),
            p.first_error.as_deref().unwrap_or("-")
        ));
    }
    if !o.after_restart {
        notes.push(
            "no kill -9 and restart before the point ops (--no-restart, or no --spawn): the \
             server may hold the far buckets already, so these are not first touches."
                .into(),
        );
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("id{i}")).collect()
    }

    #[test]
    fn phases_get_disjoint_ids_in_sample_order() {
        let p = split_ids(ids(1_000), 100);
        assert_eq!(p.first_get, ids(1));
        assert_eq!(p.get, ids(101)[1..].to_vec());
        assert_eq!(p.cancel, ids(201)[101..].to_vec());
        assert_eq!(p.reschedule, ids(211)[201..].to_vec());
        // Tiny runs still reschedule one task.
        let p = split_ids(ids(10), 3);
        assert_eq!((p.get.len(), p.cancel.len(), p.reschedule.len()), (3, 3, 1));
    }

    #[test]
    fn a_short_sample_shortens_the_later_phases() {
        let p = split_ids(ids(151), 100);
        assert_eq!(
            (p.get.len(), p.cancel.len(), p.reschedule.len()),
            (100, 50, 0)
        );
        let p = split_ids(ids(206), 100);
        assert_eq!(
            (p.get.len(), p.cancel.len(), p.reschedule.len()),
            (100, 100, 5)
        );
        assert_eq!(split_ids(Vec::new(), 5), PhaseIds::default());
    }

    #[test]
    fn the_sample_holds_every_phase_and_never_less_than_the_minimum() {
        assert_eq!(sample_capacity(0), 0);
        assert_eq!(sample_capacity(10), ID_SAMPLE_MIN);
        assert_eq!(sample_capacity(1_000_000), 2_100_001);
        assert_eq!(tasks_needed(5), 12);
        assert_eq!(reschedules_for(25), 2);
    }

    fn invalid_flag(r: Result<(), BenchError>) -> &'static str {
        match r {
            Err(BenchError::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn flags_are_checked_against_the_fill() {
        assert!(validate(0, 0, 0).is_ok());
        assert!(validate(1_000, 4, 2_101).is_ok());
        assert_eq!(invalid_flag(validate(1_000, 4, 2_100)), "--point-ops");
        assert_eq!(
            invalid_flag(validate(1_000, 0, 1_000_000)),
            "--point-connections"
        );
        assert_eq!(
            invalid_flag(validate(POINT_OPS_MAX + 1, 4, u64::MAX)),
            "--point-ops"
        );
        let message = validate(100, 4, 50).unwrap_err().to_string();
        assert!(message.contains("--tasks 50"), "{message}");
    }

    #[test]
    fn read_backs_are_judged() {
        let ok = StatusCode::OK;
        let cancelled = br#"{"id":"a","state":"cancelled","due_at_ms":5}"#;
        let scheduled = br#"{"id":"a","state":"scheduled","due_at_ms":9}"#;
        assert_eq!(check_cancelled(ok, cancelled), Check::Ok);
        assert_eq!(
            check_cancelled(StatusCode::NOT_FOUND, b"{}"),
            Check::Forgotten
        );
        assert!(matches!(check_cancelled(ok, scheduled), Check::Mismatch(_)));
        assert!(matches!(
            check_cancelled(StatusCode::INTERNAL_SERVER_ERROR, b"boom"),
            Check::Mismatch(_)
        ));
        assert_eq!(check_rescheduled(ok, scheduled, 9), Check::Ok);
        assert!(matches!(
            check_rescheduled(ok, scheduled, 8),
            Check::Mismatch(_)
        ));
        assert!(matches!(
            check_rescheduled(ok, cancelled, 5),
            Check::Mismatch(_)
        ));
        // A rescheduled task must not be forgotten.
        assert!(matches!(
            check_rescheduled(StatusCode::NOT_FOUND, b"{}", 9),
            Check::Mismatch(_)
        ));
        assert!(matches!(
            check_rescheduled(ok, b"not json", 9),
            Check::Mismatch(_)
        ));
    }

    fn phase(op: PointOp, p99_us: u64, rss: (u64, u64), errors: u64) -> PhaseOutcome {
        PhaseOutcome {
            op,
            ops: 1_000,
            errors,
            first_error: (errors > 0).then(|| "HTTP 409".into()),
            elapsed_s: 2.0,
            ops_per_s: 500.0,
            latency: Percentiles {
                count: 1_000 - errors,
                p50_us: 100,
                p99_us,
                max_us: p99_us,
                ..Default::default()
            },
            rss_before_bytes: Some(rss.0),
            rss_after_bytes: Some(rss.1),
        }
    }

    fn outcome(get_p99: u64, cancel_p99: u64, cancel_rss: (u64, u64)) -> PointOpsOutcome {
        PointOpsOutcome {
            sampled_ids: 100_000,
            after_restart: true,
            reschedule_to_ms: 0,
            phases: vec![
                phase(PointOp::FirstGet, 90_000, (5, 10), 0),
                phase(PointOp::Get, get_p99, (10, 20), 0),
                phase(PointOp::Cancel, cancel_p99, cancel_rss, 3),
                phase(PointOp::Reschedule, 1, (0, 0), 0),
            ],
            verification: Verification {
                cancelled_checked: 100,
                rescheduled_checked: 100,
                ..Default::default()
            },
        }
    }

    #[test]
    fn notes_judge_the_targets_from_the_numbers() {
        let mib64 = CANCEL_RSS_GROWTH_TARGET_BYTES;
        let good = notes(&outcome(4_000, 5_000, (mib64, 2 * mib64)), 1_000, Some(9e5));
        assert!(
            good[0].contains("get 4.0 ms (met), cancel 5.0 ms (met)"),
            "{}",
            good[0]
        );
        // The lone first get is judged on its own time.
        assert!(
            good[0].ends_with("bucket): 90.0 ms (missed)."),
            "{}",
            good[0]
        );
        assert!(good[1].ends_with("64.0 MiB (met)."), "{}", good[1]);
        assert!(
            good[2].contains("500 ops/s") && good[2].contains("900,000"),
            "{}",
            good[2]
        );
        assert!(good[3].contains("0 mismatches"), "{}", good[3]);
        assert!(good
            .iter()
            .any(|n| n.starts_with("cancel: 3 of 1,000 ops failed")));
        let bad = notes(&outcome(5_001, 2_000_000, (0, mib64 + 1)), 1_000, None);
        assert!(
            bad[0].contains("(missed), cancel 2.00 s (missed)"),
            "{}",
            bad[0]
        );
        assert!(bad[1].ends_with("(missed)."), "{}", bad[1]);
        assert!(!bad.iter().any(|n| n.contains("beside submit")));
    }

    #[test]
    fn unmeasured_targets_are_not_called_met() {
        let mut o = outcome(1, 1, (0, 0));
        o.phases[1].latency.count = 0;
        o.phases[2].rss_after_bytes = None;
        o.after_restart = false;
        let n = notes(&o, 10, None);
        assert!(n[0].contains("get - (not measured)"), "{}", n[0]);
        assert!(n[1].ends_with("- (not measured)."), "{}", n[1]);
        assert!(n.last().is_some_and(|l| l.contains("not first touches")));
    }

    #[test]
    fn the_table_has_a_row_per_phase_and_the_read_back() {
        let mut o = outcome(4_000, 6_000, (0, 1024 * 1024));
        o.verification.mismatches = 2;
        let t = table(&o, 5_000);
        assert_eq!(t.rows.len(), 5);
        assert_eq!(t.rows[0][0], "first get (alone)");
        assert_eq!(t.rows[1][0], "get");
        assert_eq!(t.rows[2][4], "6.0 ms");
        assert_eq!(t.rows[2][7], "3");
        assert_eq!(t.rows[2][8], "0.0 MiB → 1.0 MiB");
        assert_eq!(t.rows[4][0], "read-back mismatches");
        assert_eq!((t.rows[4][1].as_str(), t.rows[4][7].as_str()), ("200", "2"));
        assert!(t.title.contains("first touches"));
    }
}
