//! The submit engine shared by every scenario: C workers, each with its own keep-alive
//! connection, take prebuilt request bodies from one counter and send them in sequence.
//! Also the raw fsync'd append baseline, which writes the same bodies to a file.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http::Method;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::http::{HttpConn, Target};
use crate::reservoir::Reservoir;
use crate::stats::{new_histogram, record_clamped, Percentiles};
use crate::sys::{CpuMeter, CpuUse};
use crate::workload::Bodies;

/// How long the raw append baseline runs at most: with one task per fsync it would
/// otherwise take minutes for what a few seconds already measure.
pub const RAW_APPEND_DURATION_MAX: Duration = Duration::from_secs(10);

/// Longest error text kept for the report.
const ERROR_TEXT_MAX: usize = 300;

/// How the answers are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    /// Belfry's API: single submits answer 2xx; batches list one result per task, each a
    /// task or an `error` object.
    Belfry,
    /// Any 2xx accepts every task of the request (the trivial handler).
    AnySuccess,
    /// Belfry's streamed import (`tasks:import`, NDJSON bodies): one answer of counts per
    /// request, `{"created", "duplicates", "refused", "errors", "complete"}`.
    Import,
}

impl Answers {
    /// Headers every request carries besides the defaults: the import's bodies are NDJSON,
    /// and a real loader says so.
    fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Answers::Import => &[("content-type", "application/x-ndjson")],
            Answers::Belfry | Answers::AnySuccess => &[],
        }
    }
}

/// The outcome of one submit phase.
#[derive(Debug, Clone, Serialize)]
pub struct IngestOutcome {
    pub label: String,
    pub requests: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub failed_requests: u64,
    pub first_error: Option<String>,
    pub elapsed_s: f64,
    pub tasks_per_s: f64,
    pub requests_per_s: f64,
    pub latency: Percentiles,
    pub cpu: CpuUse,
    /// Tasks whose submit was answered only after their due time (fire scenario): their
    /// lateness includes submit delay, not only dispatch delay.
    pub answered_after_due: u64,
}

/// A sample of the ids of accepted tasks, shared by the workers of a submit phase.
pub type IdSample = Arc<Mutex<Reservoir<String>>>;

#[derive(Deserialize)]
struct BatchResponse<'a> {
    #[serde(borrow)]
    results: Vec<BatchItem<'a>>,
}

#[derive(Deserialize)]
struct BatchItem<'a> {
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
    /// Borrowed from the response (ids need no unescaping), so reading it costs no
    /// allocation when the phase keeps no ids.
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
}

/// The counts of an import's answer (its `errors` list is read from the raw text when
/// reported).
#[derive(Deserialize)]
struct ImportAnswer {
    created: u64,
    duplicates: u64,
    complete: bool,
    #[serde(default)]
    stopped_at_line: Option<u64>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// The id of a single-task submit's answer.
#[derive(Deserialize)]
struct SingleAnswer<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
}

/// Offers the ids of the accepted tasks of one answer to `sample`.
fn keep_ids<'a>(sample: &IdSample, ids: impl Iterator<Item = &'a str>) {
    // A poisoned lock only means another worker panicked; its sample is still a sample.
    let mut sample = sample.lock().unwrap_or_else(|p| p.into_inner());
    for id in ids {
        sample.offer_with(|| id.to_string());
    }
}

#[derive(Default)]
struct Tally {
    requests: u64,
    accepted: u64,
    rejected: u64,
    failed_requests: u64,
    first_error: Option<String>,
    answered_after_due: u64,
}

impl Tally {
    fn error(&mut self, text: String) {
        if self.first_error.is_none() {
            self.first_error = Some(text.chars().take(ERROR_TEXT_MAX).collect());
        }
    }

    /// Counts a 2xx answer `body` to a request of `tasks` tasks, as `judge` reads it.
    fn answered(&mut self, judge: &Judge, body: &[u8], tasks: u64, single: bool) {
        let rejected = match judge.rejected(body, tasks, single) {
            Ok(rejected) => rejected,
            Err(e) => {
                self.error(e);
                tasks
            }
        };
        if rejected > 0 {
            let request = if judge.answers == Answers::Import {
                "import"
            } else {
                "batch"
            };
            self.error(format!(
                "{request} had rejected tasks: {}",
                String::from_utf8_lossy(body)
            ));
        }
        self.rejected += rejected;
        self.accepted += tasks - rejected;
    }
}

/// Everything a submit phase needs.
pub struct IngestJob {
    pub label: String,
    pub target: Target,
    pub path: String,
    /// Path of each body when they differ (one queue per body); `path` is used otherwise.
    pub body_paths: Option<Arc<Vec<String>>>,
    pub bodies: Arc<Bodies>,
    pub connections: usize,
    pub answers: Answers,
    /// Due times by task index, to count tasks answered after they were due.
    pub due_at_ms: Option<Arc<Vec<u64>>>,
    pub server_pid: Option<u32>,
    /// Where to keep a sample of the accepted tasks' ids (belfry answers only).
    pub keep_ids: Option<IdSample>,
}

pub async fn run_ingest(job: IngestJob, progress: ProgressBar) -> IngestOutcome {
    let next = Arc::new(AtomicUsize::new(0));
    let path: Arc<str> = job.path.into();
    let meter = CpuMeter::start(job.server_pid);
    let started = Instant::now();
    let mut workers = Vec::with_capacity(job.connections);
    for _ in 0..job.connections {
        let (target, path, body_paths, bodies, next, due, progress) = (
            job.target.clone(),
            path.clone(),
            job.body_paths.clone(),
            job.bodies.clone(),
            next.clone(),
            job.due_at_ms.clone(),
            progress.clone(),
        );
        let judge = Judge {
            answers: job.answers,
            keep_ids: job.keep_ids.clone(),
        };
        workers.push(tokio::spawn(async move {
            let paths = BodyPaths {
                all: path,
                each: body_paths,
            };
            worker(target, paths, bodies, next, due, judge, progress).await
        }));
    }
    let mut tally = Tally::default();
    let mut latency = new_histogram();
    for w in workers {
        match w.await {
            Ok((t, h)) => {
                tally.requests += t.requests;
                tally.accepted += t.accepted;
                tally.rejected += t.rejected;
                tally.failed_requests += t.failed_requests;
                tally.answered_after_due += t.answered_after_due;
                if tally.first_error.is_none() {
                    tally.first_error = t.first_error;
                }
                let _ = latency.add(&h);
            }
            Err(e) => tally.error(format!("worker panicked: {e}")),
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let cpu = meter.stop();
    progress.finish_and_clear();
    IngestOutcome {
        label: job.label,
        requests: tally.requests,
        accepted: tally.accepted,
        rejected: tally.rejected,
        failed_requests: tally.failed_requests,
        first_error: tally.first_error,
        elapsed_s: elapsed,
        tasks_per_s: tally.accepted as f64 / elapsed,
        requests_per_s: tally.requests as f64 / elapsed,
        latency: Percentiles::of(&latency),
        cpu,
        answered_after_due: tally.answered_after_due,
    }
}

/// How a worker reads answers: which API, and where accepted ids go.
struct Judge {
    answers: Answers,
    keep_ids: Option<IdSample>,
}

impl Judge {
    /// Tasks of a 2xx answer `body` to a request of `tasks` tasks that were rejected, or
    /// the text of what was wrong with the answer (then all of them were).
    fn rejected(&self, body: &[u8], tasks: u64, single: bool) -> Result<u64, String> {
        match self.answers {
            Answers::AnySuccess => Ok(0),
            Answers::Import => import_rejected(body, tasks),
            Answers::Belfry if single => {
                if let Some(sample) = &self.keep_ids {
                    match serde_json::from_slice::<SingleAnswer>(body) {
                        Ok(answer) => keep_ids(sample, std::iter::once(answer.id.as_ref())),
                        Err(e) => return Err(format!("submit answer has no \"id\": {e}")),
                    }
                }
                Ok(0)
            }
            Answers::Belfry => {
                let r = serde_json::from_slice::<BatchResponse>(body)
                    .map_err(|e| format!("batch answer is not {{\"results\": [...]}}: {e}"))?;
                let errors = r.results.iter().filter(|i| i.error.is_some()).count() as u64;
                if let Some(sample) = &self.keep_ids {
                    let accepted = r.results.iter().filter(|i| i.error.is_none());
                    keep_ids(sample, accepted.filter_map(|i| i.id.as_deref()));
                }
                // Missing results count as rejected: the server must answer one result
                // per task.
                Ok(errors + tasks.saturating_sub(r.results.len() as u64))
            }
        }
    }
}

/// Tasks of an import of `tasks` lines that were not stored, from its answer `body`; or the
/// text of why the whole request counts as failed: an answer that is not the import's, counts
/// more tasks than were sent, or says `complete: false` (the server stopped reading; what it
/// stored before `stopped_at_line` stands, but a bulk load that stopped part way is no
/// measure of the import's rate, so the run must see an error, not a smaller count).
fn import_rejected(body: &[u8], tasks: u64) -> Result<u64, String> {
    let a = serde_json::from_slice::<ImportAnswer>(body).map_err(|e| {
        format!("import answer is not {{\"created\", \"duplicates\", \"complete\", ...}}: {e}")
    })?;
    if !a.complete {
        let line = a.stopped_at_line.map_or("?".to_string(), |l| l.to_string());
        let error = a
            .error
            .map_or("no error given".to_string(), |e| e.to_string());
        return Err(format!(
            "import stopped at line {line} of {tasks} (complete: false, {} created): {error}",
            a.created
        ));
    }
    let stored = a.created.saturating_add(a.duplicates);
    if stored > tasks {
        return Err(format!(
            "import answer counts {stored} tasks stored of {tasks} lines sent"
        ));
    }
    // Refused lines, and lines the answer does not count at all, were not stored.
    Ok(tasks - stored)
}

/// Where each body goes: one path for all, or one per body.
struct BodyPaths {
    all: Arc<str>,
    each: Option<Arc<Vec<String>>>,
}

impl BodyPaths {
    fn of(&self, b: usize) -> &str {
        self.each
            .as_ref()
            .and_then(|each| each.get(b))
            .map_or(&self.all, |p| p.as_str())
    }
}

async fn worker(
    target: Target,
    paths: BodyPaths,
    bodies: Arc<Bodies>,
    next: Arc<AtomicUsize>,
    due: Option<Arc<Vec<u64>>>,
    judge: Judge,
    progress: ProgressBar,
) -> (Tally, Histogram<u64>) {
    let mut tally = Tally::default();
    let mut latency = new_histogram();
    let mut conn = match HttpConn::connect(&target).await {
        Ok(c) => Some(c),
        Err(e) => {
            tally.error(e.to_string());
            None
        }
    };
    loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= bodies.bodies.len() {
            break;
        }
        let tasks = bodies.tasks_in(b);
        if conn.is_none() {
            // One reconnect attempt per request after a failure: a dead server fails fast
            // instead of spinning, and a restarted connection recovers.
            conn = HttpConn::connect(&target).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            tally.requests += 1;
            tally.failed_requests += 1;
            tally.rejected += tasks;
            progress.inc(tasks);
            continue;
        };
        let sent = Instant::now();
        let result = c
            .request_with_headers(
                Method::POST,
                paths.of(b),
                bodies.bodies[b].clone(),
                judge.answers.headers(),
            )
            .await;
        record_clamped(&mut latency, sent.elapsed().as_micros() as u64);
        tally.requests += 1;
        match result {
            Ok((status, body)) if status.is_success() => {
                tally.answered(&judge, &body, tasks, bodies.batch == 1);
            }
            Ok((status, body)) => {
                tally.rejected += tasks;
                tally.error(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
            }
            Err(e) => {
                tally.failed_requests += 1;
                tally.rejected += tasks;
                tally.error(e.to_string());
                conn = None;
            }
        }
        if let Some(due) = &due {
            let now_ms = crate::sys::unix_ms();
            let first = bodies.first[b] as usize;
            let end = first + tasks as usize;
            if let Some(slice) = due.get(first..end) {
                tally.answered_after_due += slice.partition_point(|&d| d < now_ms) as u64;
            }
        }
        progress.inc(tasks);
    }
    (tally, latency)
}

/// The raw append baseline's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct RawAppend {
    pub bodies: u64,
    pub tasks: u64,
    pub bytes: u64,
    pub elapsed_s: f64,
    pub tasks_per_s: f64,
    pub bytes_per_s: f64,
    /// True when [`RAW_APPEND_DURATION_MAX`] ended it before all bodies were written.
    pub truncated: bool,
}

/// Appends the request bodies in order to a new file in `dir`, with one `fdatasync` after
/// each — the disk's limit for acknowledging each request durably, with no group commit.
pub fn raw_append(
    dir: &Path,
    bodies: &Bodies,
    progress: &ProgressBar,
) -> Result<RawAppend, BenchError> {
    use std::io::Write;
    let file_path = dir.join("raw-append.bin");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&file_path)
        .map_err(|e| BenchError::io("create", &file_path, e))?;
    let started = Instant::now();
    let (mut written, mut tasks, mut bytes) = (0u64, 0u64, 0u64);
    let mut truncated = false;
    for (b, body) in bodies.bodies.iter().enumerate() {
        if started.elapsed() >= RAW_APPEND_DURATION_MAX {
            truncated = true;
            break;
        }
        file.write_all(body)
            .map_err(|e| BenchError::io("append to", &file_path, e))?;
        file.sync_data()
            .map_err(|e| BenchError::io("fdatasync", &file_path, e))?;
        written += 1;
        tasks += bodies.tasks_in(b);
        bytes += body.len() as u64;
        progress.inc(bodies.tasks_in(b));
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    drop(file);
    let _ = std::fs::remove_file(&file_path);
    progress.finish_and_clear();
    Ok(RawAppend {
        bodies: written,
        tasks,
        bytes,
        elapsed_s: elapsed,
        tasks_per_s: tasks as f64 / elapsed,
        bytes_per_s: bytes as f64 / elapsed,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::due_times;

    fn judge(keep: bool) -> (Judge, IdSample) {
        let sample: IdSample = Arc::new(Mutex::new(Reservoir::new(10, 1)));
        let judge = Judge {
            answers: Answers::Belfry,
            keep_ids: keep.then(|| sample.clone()),
        };
        (judge, sample)
    }

    fn kept(sample: &IdSample) -> Vec<String> {
        let r = std::mem::replace(&mut *sample.lock().unwrap(), Reservoir::new(0, 0));
        let mut ids = r.into_shuffled();
        ids.sort();
        ids
    }

    #[test]
    fn accepted_ids_of_batch_answers_are_kept_and_rejected_ones_not() {
        let (j, sample) = judge(true);
        let body = br#"{"results":[{"id":"a1","queue":"q","due_at_ms":5,"state":"scheduled"},
            {"error":{"code":"invalid_due_time","message":"x"}},
            {"id":"a3","state":"scheduled","duplicate":true}]}"#;
        assert_eq!(j.rejected(body, 3, false), Ok(1));
        // A missing result is rejected too.
        assert_eq!(j.rejected(br#"{"results":[{"id":"b1"}]}"#, 2, false), Ok(1));
        assert_eq!(kept(&sample), ["a1", "a3", "b1"]);
        assert!(j.rejected(b"[]", 2, false).is_err());
    }

    #[test]
    fn single_answers_give_their_id_only_when_asked() {
        let (j, sample) = judge(true);
        assert_eq!(
            j.rejected(br#"{"id":"s1","state":"scheduled"}"#, 1, true),
            Ok(0)
        );
        assert!(j.rejected(b"{}", 1, true).is_err());
        assert_eq!(kept(&sample), ["s1"]);
        // Without a sample, single answers are not read at all.
        let (j, sample) = judge(false);
        assert_eq!(j.rejected(b"{}", 1, true), Ok(0));
        assert_eq!(j.rejected(br#"{"results":[{"id":"x"}]}"#, 1, false), Ok(0));
        assert!(kept(&sample).is_empty());
    }

    #[test]
    fn import_answers_count_what_was_not_stored_and_fail_when_incomplete() {
        let j = Judge {
            answers: Answers::Import,
            keep_ids: None,
        };
        let complete = br#"{"created":9,"duplicates":1,"refused":0,"errors":[],"complete":true}"#;
        assert_eq!(j.rejected(complete, 10, false), Ok(0));
        let refused = br#"{"created":7,"duplicates":0,"refused":3,"errors":[{"line":2,"error":{"code":"invalid_due_time","message":"x"}}],"complete":true}"#;
        assert_eq!(j.rejected(refused, 10, false), Ok(3));
        // A single line is still an import answer, not a single submit's.
        assert_eq!(
            j.rejected(
                br#"{"created":1,"duplicates":0,"refused":0,"errors":[],"complete":true}"#,
                1,
                true
            ),
            Ok(0)
        );
        let stopped = br#"{"created":4000,"duplicates":0,"refused":0,"errors":[],"complete":false,"stopped_at_line":4001,"error":{"code":"insufficient_storage","message":"disk full"}}"#;
        let err = j.rejected(stopped, 10_000, false).unwrap_err();
        assert!(
            err.contains("line 4001")
                && err.contains("insufficient_storage")
                && err.contains("4000 created"),
            "{err}"
        );
        assert!(j
            .rejected(
                br#"{"created":11,"duplicates":0,"complete":true}"#,
                10,
                false
            )
            .is_err());
        assert!(j.rejected(br#"{"results":[]}"#, 10, false).is_err());
    }

    #[test]
    fn only_import_requests_say_they_are_ndjson() {
        assert_eq!(
            Answers::Import.headers(),
            [("content-type", "application/x-ndjson")]
        );
        assert!(Answers::Belfry.headers().is_empty() && Answers::AnySuccess.headers().is_empty());
    }

    #[test]
    fn raw_append_writes_every_body_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = Bodies::build(&due_times(50, 1, 1), 10, 64);
        let r = raw_append(dir.path(), &bodies, &ProgressBar::hidden()).unwrap();
        assert_eq!((r.bodies, r.tasks, r.bytes), (5, 50, bodies.total_bytes()));
        assert!(!r.truncated);
        assert!(!dir.path().join("raw-append.bin").exists());
    }
}
