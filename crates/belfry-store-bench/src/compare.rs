//! Runs one engine through one phase of the workload, in a child process of its own, and
//! reports what it measured.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use belfry_core::{NewTask, PayloadKind, QueueName, UnixMs};
use belfry_store::{LeaseOutcome, Store};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use belfry_store_bench::probe;
use belfry_store_bench::workload::{fill_payload, verify_payload, Workload};

use crate::engines::{self, EngineKind, EngineSpec};
use crate::CompareArgs;

/// A child prints exactly one line starting with this, followed by its result as JSON.
pub const RESULT_PREFIX: &str = "BENCH-RESULT ";

/// The queue every Store engine run uses.
pub const QUEUE: &str = "bench";

/// Visibility of drain leases: long enough that nothing expires during a run.
const DRAIN_VISIBILITY_MS: u64 = 10 * 60 * 1000;

/// Every this many drained tasks, the payload is verified in full (tag, filler, checksum).
/// Verifying all of them would measure the checksum code rather than the engine; the rest get
/// a length check.
const DRAIN_VERIFY_EVERY: u64 = 1024;

/// Tasks drained with `sync_delivery` on (one fsync per ack) before the main drain.
const DURABLE_ACK_SAMPLE: u64 = 2_000;

/// Read buffer of the raw baseline's sequential scan.
const RAW_READ_BUFFER_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    /// Ingest, close, reopen, drain everything.
    Compare,
    /// Ingest into a fresh directory and exit without closing (as if killed).
    PendingFill,
    /// Reopen a filled directory and answer a first claim.
    PendingReopen,
}

/// What one engine measured. Every `Option` is `None` where the engine or the platform has no
/// such number.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EngineResult {
    pub engine: String,
    pub tasks: u64,
    pub ingest_secs: Option<f64>,
    pub ingest_write_bytes: Option<u64>,
    pub disk_after_ingest_bytes: Option<u64>,
    pub reopen_secs: Option<f64>,
    /// From the start of reopen to the answer of the first claim (nothing due yet).
    pub first_claim_secs: Option<f64>,
    pub drained: u64,
    pub drain_secs: Option<f64>,
    pub drain_write_bytes: Option<u64>,
    /// The first tasks drained with `sync_delivery` on: each ack waits for its own fsync.
    pub durable_ack_drained: u64,
    pub durable_ack_drain_secs: Option<f64>,
    pub disk_after_drain_bytes: Option<u64>,
    /// Drained tasks whose due time was earlier than the one drained before them.
    pub order_violations: u64,
    /// Drained payloads that failed verification.
    pub verify_failures: u64,
    pub rss_after_ingest_bytes: Option<u64>,
    pub rss_after_reopen_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    /// What the engine did at reopen, in its own words (belfry's work counters).
    pub reopen_work: Option<String>,
    /// Records the engine read at reopen (WAL replay plus bucket loads), from its counters.
    #[serde(default)]
    pub reopen_records_read: Option<u64>,
    /// Runs this result is the median of (by ingest rate), and the range of rates they saw.
    #[serde(default)]
    pub repetitions: usize,
    #[serde(default)]
    pub ingest_range: Option<(f64, f64)>,
    #[serde(default)]
    pub drain_range: Option<(f64, f64)>,
    /// Median over repetitions of this engine's ingest rate divided by raw's in the same
    /// repetition.
    #[serde(default)]
    pub ingest_vs_raw_paired: Option<f64>,
}

impl EngineResult {
    pub fn ingest_rate(&self) -> Option<f64> {
        rate(self.tasks, self.ingest_secs)
    }

    /// Drain rate of the main drain (default options: acks written to the OS, fsync'd in
    /// groups; one flush at the end).
    pub fn drain_rate(&self) -> Option<f64> {
        rate(self.drained - self.durable_ack_drained, self.drain_secs)
    }

    pub fn durable_ack_drain_rate(&self) -> Option<f64> {
        rate(self.durable_ack_drained, self.durable_ack_drain_secs)
    }
}

fn rate(count: u64, secs: Option<f64>) -> Option<f64> {
    secs.filter(|s| *s > 0.0).map(|s| count as f64 / s)
}

/// Runs every engine named in `args`, each in its own child process and fresh directory.
pub fn run(args: &CompareArgs, workload: &Workload) -> anyhow::Result<Vec<EngineResult>> {
    let parent = BenchDir::new(args.dir.as_deref())?;
    let specs = args
        .engines
        .iter()
        .map(|name| EngineSpec::parse(name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Repetitions go round the engines (raw, belfry, fjall, raw, ...) rather than repeating
    // one engine back to back, so a burst of load from other processes on a shared machine
    // does not fall on one engine only.
    let mut runs: Vec<Vec<EngineResult>> = vec![Vec::new(); specs.len()];
    for repetition in 0..args.repeat.max(1) {
        for (index, &spec) in specs.iter().enumerate() {
            let kind = spec.kind;
            let dir = parent.path().join(kind.name());
            eprintln!(
                "running {} on {} tasks in {} (repetition {})",
                spec.label(),
                workload.tasks,
                dir.display(),
                repetition + 1
            );
            let mut workload_args = args.workload.clone();
            if let Some(writers) = spec.writers {
                workload_args.writers = writers;
            }
            let mut result = spawn_child(kind, &dir, Phase::Compare, workload, &workload_args)?;
            result.engine = spec.label();
            remove_dir_if_exists(&dir)?;
            runs[index].push(result);
        }
    }
    // Paired ratios: each engine's ingest rate over raw's in the same repetition (run
    // moments apart), whose median is steadier than a ratio of medians when the machine's
    // load drifts.
    let raw_runs: Option<Vec<Option<f64>>> = specs
        .iter()
        .position(|spec| spec.kind == EngineKind::Raw)
        .map(|index| runs[index].iter().map(EngineResult::ingest_rate).collect());
    let mut results = Vec::new();
    for engine_runs in runs {
        let paired = raw_runs.as_ref().and_then(|raw| {
            let mut ratios: Vec<f64> = engine_runs
                .iter()
                .zip(raw)
                .filter_map(|(run, raw)| Some(run.ingest_rate()? / raw.filter(|r| *r > 0.0)?))
                .collect();
            ratios.sort_by(f64::total_cmp);
            ratios.get(ratios.len() / 2).copied()
        });
        if let Some(mut result) = median_run(engine_runs) {
            result.ingest_vs_raw_paired = paired;
            results.push(result);
        }
    }
    Ok(results)
}

/// The run with the median ingest rate, carrying the range of ingest and drain rates seen.
fn median_run(mut runs: Vec<EngineResult>) -> Option<EngineResult> {
    let rates =
        |f: fn(&EngineResult) -> Option<f64>, runs: &[EngineResult]| -> Option<(f64, f64)> {
            let values: Vec<f64> = runs.iter().filter_map(f).collect();
            let min = values.iter().copied().reduce(f64::min)?;
            let max = values.iter().copied().reduce(f64::max)?;
            Some((min, max))
        };
    let ingest_range = rates(EngineResult::ingest_rate, &runs);
    let drain_range = rates(EngineResult::drain_rate, &runs);
    let repetitions = runs.len();
    runs.sort_by(|a, b| {
        let (a, b) = (
            a.ingest_rate().unwrap_or(0.0),
            b.ingest_rate().unwrap_or(0.0),
        );
        a.total_cmp(&b)
    });
    let mut median = runs.swap_remove(repetitions / 2);
    median.repetitions = repetitions;
    median.ingest_range = ingest_range;
    median.drain_range = drain_range;
    Some(median)
}

/// The parent directory of a run: the one given, or a fresh one under the system's temp dir
/// (removed at the end).
pub struct BenchDir {
    path: std::path::PathBuf,
    remove: bool,
}

impl BenchDir {
    pub fn new(given: Option<&Path>) -> anyhow::Result<Self> {
        let (path, remove) = match given {
            Some(path) => (path.to_path_buf(), false),
            None => {
                let nanos = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let name = format!("belfry-store-bench-{}-{nanos}", std::process::id());
                (std::env::temp_dir().join(name), true)
            }
        };
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(BenchDir { path, remove })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

pub fn remove_dir_if_exists(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("remove {}", dir.display())),
    }
}

/// Runs `phase` of `kind` in a child process and returns what it printed.
pub fn spawn_child(
    kind: EngineKind,
    dir: &Path,
    phase: Phase,
    workload: &Workload,
    workload_args: &crate::WorkloadArgs,
) -> anyhow::Result<EngineResult> {
    let exe = std::env::current_exe().context("find the benchmark's own executable")?;
    let phase_name = match phase {
        Phase::Compare => "compare",
        Phase::PendingFill => "pending-fill",
        Phase::PendingReopen => "pending-reopen",
    };
    let mut child = Command::new(exe)
        .arg("child")
        .args(["--engine", kind.name(), "--phase", phase_name])
        .arg("--dir")
        .arg(dir)
        .args(["--tasks", &workload.tasks.to_string()])
        .args(["--due-from-ms", &workload.due_from_ms.to_string()])
        .args(workload_args.to_args())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("start a benchmark child process")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut result = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("read the child's output")?;
        match line.strip_prefix(RESULT_PREFIX) {
            Some(json) => result = Some(serde_json::from_str::<EngineResult>(json)?),
            None => println!("{line}"),
        }
    }
    let status = child.wait().context("wait for the child")?;
    ensure!(
        status.success(),
        "{} {phase_name} child failed: {status}",
        kind.name()
    );
    result.with_context(|| format!("{} {phase_name} child printed no result", kind.name()))
}

/// The body of a child process.
pub fn child(
    kind: EngineKind,
    dir: &Path,
    phase: Phase,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<EngineResult> {
    if phase != Phase::PendingReopen {
        remove_dir_if_exists(dir)?;
    }
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut result = match kind {
        EngineKind::Raw => raw(dir, phase, workload)?,
        EngineKind::Fjall => fjall_engine(dir, phase, workload, writers)?,
        EngineKind::Belfry | EngineKind::Memory => store(kind, dir, phase, workload, writers)?,
    };
    result.engine = kind.name().to_string();
    result.tasks = workload.tasks;
    result.peak_rss_bytes = probe::peak_rss_bytes();
    Ok(result)
}

/// Calls `commit(first_seq, count)` for every batch of the workload from `writers` threads
/// (writer `w` takes batches `w`, `w + writers`, ...), and returns the elapsed seconds.
fn ingest<F>(workload: &Workload, writers: usize, commit: F) -> anyhow::Result<f64>
where
    F: Fn(u64, u64) -> anyhow::Result<()> + Sync,
{
    let batch = workload.batch as u64;
    let batches = workload.tasks.div_ceil(batch);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers as u64)
            .map(|writer| {
                let commit = &commit;
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut index = writer;
                    while index < batches {
                        let first = index * batch;
                        let count = batch.min(workload.tasks - first);
                        commit(first, count)?;
                        index += writers as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        for handle in handles {
            match handle.join() {
                Ok(outcome) => outcome?,
                Err(_) => bail!("an ingest thread panicked"),
            }
        }
        Ok(())
    })?;
    Ok(started.elapsed().as_secs_f64())
}

fn write_bytes_since(before: Option<u64>) -> Option<u64> {
    Some(probe::write_bytes()?.saturating_sub(before?))
}

fn disk(dir: &Path) -> anyhow::Result<Option<u64>> {
    Ok(Some(
        probe::disk_usage_bytes(dir).with_context(|| format!("measure {}", dir.display()))?,
    ))
}

/// Checks a drained task: due order, and (sampled) payload. Counts problems in `result`.
struct DrainCheck {
    last_due_ms: UnixMs,
    payload_bytes: usize,
    seen: u64,
}

impl DrainCheck {
    fn new(payload_bytes: usize) -> Self {
        DrainCheck {
            last_due_ms: 0,
            payload_bytes,
            seen: 0,
        }
    }

    fn check(&mut self, due_ms: UnixMs, payload: &[u8], result: &mut EngineResult) {
        if due_ms < self.last_due_ms {
            result.order_violations += 1;
        }
        self.last_due_ms = due_ms;
        let verified = if self.seen.is_multiple_of(DRAIN_VERIFY_EVERY) {
            verify_payload(payload).is_ok()
        } else {
            payload.len() == self.payload_bytes
        };
        if !verified {
            result.verify_failures += 1;
        }
        self.seen += 1;
    }
}

// ---- raw append ----

/// The raw record: due (8, LE), id (16, LE), payload length (4, LE), payload, CRC-32 of all
/// of that (4, LE). `RAW_RECORD_OVERHEAD_BYTES` is the sum of the fixed fields.
fn raw_record(due_ms: UnixMs, id: u128, payload: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&due_ms.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn raw(dir: &Path, phase: Phase, workload: &Workload) -> anyhow::Result<EngineResult> {
    ensure!(
        phase == Phase::Compare,
        "raw append only runs in the comparison"
    );
    let path = dir.join("raw.log");
    let mut result = EngineResult::default();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let before = probe::write_bytes();
    let mut buffer = Vec::with_capacity(workload.batch * workload.raw_record_bytes() as usize);
    let mut payload = Vec::with_capacity(workload.payload_bytes);
    let started = Instant::now();
    let mut seq = 0;
    while seq < workload.tasks {
        buffer.clear();
        let end = (seq + workload.batch as u64).min(workload.tasks);
        for s in seq..end {
            fill_payload(s, workload.payload_bytes, &mut payload);
            raw_record(workload.due_ms(s), u128::from(s), &payload, &mut buffer);
        }
        file.write_all(&buffer).context("append raw records")?;
        file.sync_data().context("fsync raw records")?;
        seq = end;
    }
    result.ingest_secs = Some(started.elapsed().as_secs_f64());
    result.ingest_write_bytes = write_bytes_since(before);
    result.disk_after_ingest_bytes = disk(dir)?;
    result.rss_after_ingest_bytes = probe::rss_bytes();
    drop(file);

    // "Drain" for raw is a sequential scan that decodes and checks every record: the cost of
    // reading the bytes back, with no ordering and nothing deleted.
    let before = probe::write_bytes();
    let started = Instant::now();
    let file = File::open(&path).with_context(|| format!("open {}", path.display()))?;
    let mut reader = BufReader::with_capacity(RAW_READ_BUFFER_BYTES, file);
    let mut record = vec![0u8; workload.raw_record_bytes() as usize];
    let mut check = DrainCheck::new(workload.payload_bytes);
    for _ in 0..workload.tasks {
        reader.read_exact(&mut record).context("read raw records")?;
        let (body, crc) = record.split_at(record.len() - 4);
        let crc_ok = crc32fast::hash(body).to_le_bytes() == crc;
        let mut due = [0u8; 8];
        due.copy_from_slice(&body[..8]);
        if !crc_ok {
            result.verify_failures += 1;
        }
        // The raw log is in ingest order, so due order is not checked; payloads are.
        check.last_due_ms = 0;
        check.check(u64::from_le_bytes(due), &body[28..], &mut result);
        result.drained += 1;
    }
    result.drain_secs = Some(started.elapsed().as_secs_f64());
    result.drain_write_bytes = write_bytes_since(before);
    Ok(result)
}

// ---- fjall ----

fn fjall_key(due_ms: UnixMs, seq: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&due_ms.to_be_bytes());
    key[8..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn fjall_open(dir: &Path) -> anyhow::Result<(fjall::Database, fjall::Keyspace)> {
    let db = fjall::Database::builder(dir)
        .open()
        .context("open fjall database")?;
    let tasks = db
        .keyspace("tasks", fjall::KeyspaceCreateOptions::default)
        .context("open fjall keyspace")?;
    Ok((db, tasks))
}

fn fjall_engine(
    dir: &Path,
    phase: Phase,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<EngineResult> {
    let mut result = EngineResult::default();
    if phase == Phase::PendingReopen {
        let started = Instant::now();
        let (db, tasks) = fjall_open(dir)?;
        result.reopen_secs = Some(started.elapsed().as_secs_f64());
        let first = tasks
            .first_key_value()
            .map(|guard| guard.key())
            .transpose()?;
        result.first_claim_secs = Some(started.elapsed().as_secs_f64());
        ensure!(first.is_some(), "fjall lost the pending tasks");
        result.rss_after_reopen_bytes = probe::rss_bytes();
        std::mem::forget((db, tasks));
        return Ok(result);
    }

    let (db, tasks) = fjall_open(dir)?;
    let before = probe::write_bytes();
    result.ingest_secs = Some(fjall_ingest(&db, &tasks, workload, writers)?);
    result.ingest_write_bytes = write_bytes_since(before);
    result.rss_after_ingest_bytes = probe::rss_bytes();
    if phase == Phase::PendingFill {
        result.disk_after_ingest_bytes = disk(dir)?;
        std::mem::forget((db, tasks));
        return Ok(result);
    }
    drop(tasks);
    db.persist(fjall::PersistMode::SyncAll)
        .context("persist fjall")?;
    drop(db);
    // Bytes written count until the engine is closed, so work deferred past the last commit
    // (memtable flushes, index files) is not left out.
    result.ingest_write_bytes = write_bytes_since(before);
    result.disk_after_ingest_bytes = disk(dir)?;

    let started = Instant::now();
    let (db, tasks) = fjall_open(dir)?;
    result.reopen_secs = Some(started.elapsed().as_secs_f64());
    result.rss_after_reopen_bytes = probe::rss_bytes();

    let before = probe::write_bytes();
    let started = Instant::now();
    fjall_drain(&db, &tasks, workload, &mut result)?;
    result.drain_secs = Some(started.elapsed().as_secs_f64());
    db.persist(fjall::PersistMode::SyncAll)
        .context("persist fjall")?;
    result.drain_write_bytes = write_bytes_since(before);
    drop(tasks);
    drop(db);
    result.disk_after_drain_bytes = disk(dir)?;
    Ok(result)
}

/// Inserts the workload's tasks in durable batches from `writers` threads; returns the
/// seconds it took.
fn fjall_ingest(
    db: &fjall::Database,
    tasks: &fjall::Keyspace,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<f64> {
    ingest(workload, writers, |first, count| {
        let mut batch = db.batch().durability(Some(fjall::PersistMode::SyncData));
        let mut payload = Vec::with_capacity(workload.payload_bytes);
        for seq in first..first + count {
            fill_payload(seq, workload.payload_bytes, &mut payload);
            batch.insert(
                tasks,
                fjall_key(workload.due_ms(seq), seq),
                payload.as_slice(),
            );
        }
        batch.commit().context("commit a fjall batch")?;
        Ok(())
    })
}

/// Drains in due order: scans from a cursor (the last key taken), so the scan does not wade
/// through the tombstones of everything already drained, and deletes each batch.
fn fjall_drain(
    db: &fjall::Database,
    tasks: &fjall::Keyspace,
    workload: &Workload,
    result: &mut EngineResult,
) -> anyhow::Result<()> {
    let mut check = DrainCheck::new(workload.payload_bytes);
    let mut cursor: Option<[u8; 16]> = None;
    loop {
        let range = match cursor {
            Some(key) => tasks.range((
                std::ops::Bound::Excluded(key.to_vec()),
                std::ops::Bound::Unbounded,
            )),
            None => tasks.range::<Vec<u8>, _>(..),
        };
        let mut batch = db.batch();
        let mut taken = 0;
        for guard in range.take(workload.batch) {
            let (key, value) = guard.into_inner().context("scan fjall")?;
            let mut due = [0u8; 8];
            due.copy_from_slice(&key[..8]);
            check.check(u64::from_be_bytes(due), &value, result);
            let mut last = [0u8; 16];
            last.copy_from_slice(&key[..16]);
            cursor = Some(last);
            batch.remove(tasks, key);
            taken += 1;
        }
        if taken == 0 {
            return Ok(());
        }
        batch.commit().context("commit a fjall delete batch")?;
        result.drained += taken;
    }
}

// ---- Store engines (belfry, memory) ----

fn queue() -> QueueName {
    QueueName::new(QUEUE).expect("the bench queue name is valid")
}

fn store(
    kind: EngineKind,
    dir: &Path,
    phase: Phase,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<EngineResult> {
    let mut result = EngineResult::default();
    let queue = queue();
    if phase == Phase::PendingReopen {
        store_reopen(kind, dir, workload, &queue, &mut result)?;
        return Ok(result);
    }

    let engine = engines::open_store(kind, dir, false)?;
    engine.put_queue(&queue, Bytes::new())?;
    let before = probe::write_bytes();
    result.ingest_secs = Some(store_ingest(engine.as_ref(), &queue, workload, writers)?);
    result.ingest_write_bytes = write_bytes_since(before);
    result.rss_after_ingest_bytes = probe::rss_bytes();
    if phase == Phase::PendingFill {
        result.disk_after_ingest_bytes = disk(dir)?;
        std::mem::forget(engine);
        return Ok(result);
    }
    engine.flush()?;
    // Count what the engine writes up to its flush, so deferred work is not left out.
    result.ingest_write_bytes = write_bytes_since(before);
    result.disk_after_ingest_bytes = disk(dir)?;

    let now_ms = workload.all_due_ms();
    let mut check = DrainCheck::new(workload.payload_bytes);
    let engine = if kind == EngineKind::Memory {
        // Nothing to reopen: the reference store keeps nothing on disk.
        engine
    } else {
        drop(engine);
        store_durable_ack_sample(kind, dir, workload, &queue, &mut check, &mut result)?;
        engines::open_store(kind, dir, false)?
    };
    if result.rss_after_reopen_bytes.is_none() {
        result.rss_after_reopen_bytes = probe::rss_bytes();
    }

    let before = probe::write_bytes();
    let started = Instant::now();
    if writers <= 1 {
        result.drained += drain(
            engine.as_ref(),
            &queue,
            now_ms,
            workload.batch,
            u64::MAX,
            &mut check,
            &mut result,
        )?;
    } else {
        let parts = drain_in_parallel(engine.as_ref(), &queue, now_ms, workload, writers)?;
        for part in parts {
            result.drained += part.drained;
            result.order_violations += part.order_violations;
            result.verify_failures += part.verify_failures;
        }
    }
    engine.flush()?;
    result.drain_secs = Some(started.elapsed().as_secs_f64());
    result.drain_write_bytes = write_bytes_since(before);
    drop(engine);
    if kind != EngineKind::Memory {
        result.disk_after_drain_bytes = disk(dir)?;
    }
    Ok(result)
}

/// The `PendingReopen` phase: reopens a filled directory and answers a first claim, which
/// must find nothing due (the tasks are far out) and the tasks still pending.
fn store_reopen(
    kind: EngineKind,
    dir: &Path,
    workload: &Workload,
    queue: &QueueName,
    result: &mut EngineResult,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let engine: Box<dyn Store> = if kind == EngineKind::Belfry {
        let engine = engines::open_belfry_engine(dir, false)?;
        result.reopen_secs = Some(started.elapsed().as_secs_f64());
        let stats = engine.stats();
        result.reopen_records_read = Some(stats.wal_records_replayed + stats.records_loaded);
        result.reopen_work = Some(format!(
            "{} WAL records replayed, {} bucket records read, {} of {} buckets in memory",
            stats.wal_records_replayed,
            stats.records_loaded,
            stats.buckets_in_memory,
            stats.buckets_total
        ));
        Box::new(engine)
    } else {
        let engine = engines::open_store(kind, dir, false)?;
        result.reopen_secs = Some(started.elapsed().as_secs_f64());
        engine
    };
    // "Serving again": the first claim answers (nothing is due yet, the tasks are far out).
    let now_ms = wall_ms();
    let batch = engine.claim(queue, now_ms, workload.batch, DRAIN_VISIBILITY_MS)?;
    result.first_claim_secs = Some(started.elapsed().as_secs_f64());
    ensure!(
        batch.leased.is_empty(),
        "a far-future task was claimed early"
    );
    ensure!(
        engine.next_due_ms(queue)?.is_some(),
        "the engine lost the pending tasks"
    );
    result.rss_after_reopen_bytes = probe::rss_bytes();
    std::mem::forget(engine);
    Ok(())
}

/// Puts the workload's tasks in batches from `writers` threads; returns the seconds it took.
fn store_ingest(
    engine: &dyn Store,
    queue: &QueueName,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<f64> {
    ingest(workload, writers, |first, count| {
        let mut batch = Vec::with_capacity(count as usize);
        for seq in first..first + count {
            let mut task = NewTask::new(
                queue.clone(),
                workload.due_ms(seq),
                Bytes::from(belfry_store_bench::workload::payload(
                    seq,
                    workload.payload_bytes,
                )),
            );
            task.payload_kind = PayloadKind::Binary;
            batch.push(task);
        }
        let outcomes = engine.put(batch)?;
        ensure!(
            outcomes.len() == count as usize,
            "put returned {} outcomes",
            outcomes.len()
        );
        Ok(())
    })
}

/// Reopens the engine with `sync_delivery` on and drains a short sample, where every ack
/// waits for its own fsync (one thread, so no group commit helps): what a single consumer
/// acking one task at a time gets when acks must be durable on return.
fn store_durable_ack_sample(
    kind: EngineKind,
    dir: &Path,
    workload: &Workload,
    queue: &QueueName,
    check: &mut DrainCheck,
    result: &mut EngineResult,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let engine = engines::open_store(kind, dir, true)?;
    result.reopen_secs = Some(started.elapsed().as_secs_f64());
    result.rss_after_reopen_bytes = probe::rss_bytes();
    let started = Instant::now();
    let drained = drain(
        engine.as_ref(),
        queue,
        workload.all_due_ms(),
        workload.batch,
        DURABLE_ACK_SAMPLE,
        check,
        result,
    )?;
    result.durable_ack_drained = drained;
    result.drained = drained;
    result.durable_ack_drain_secs = Some(started.elapsed().as_secs_f64());
    Ok(())
}

/// As many consumers as writers, each claiming and acking in a loop. Claims take the earliest
/// due tasks, so each consumer still sees due times in order. Returns each consumer's counts.
fn drain_in_parallel(
    engine: &dyn Store,
    queue: &QueueName,
    now_ms: UnixMs,
    workload: &Workload,
    writers: usize,
) -> anyhow::Result<Vec<EngineResult>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|_| {
                scope.spawn(move || -> anyhow::Result<EngineResult> {
                    let mut part = EngineResult::default();
                    let mut check = DrainCheck::new(workload.payload_bytes);
                    part.drained = drain(
                        engine,
                        queue,
                        now_ms,
                        workload.batch,
                        u64::MAX,
                        &mut check,
                        &mut part,
                    )?;
                    Ok(part)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle.join() {
                Ok(part) => part,
                Err(_) => bail!("a drain thread panicked"),
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })
}

/// Claims and acks (one thread) until nothing is due or `limit` tasks are drained; returns
/// how many were drained.
fn drain(
    engine: &dyn Store,
    queue: &QueueName,
    now_ms: UnixMs,
    batch: usize,
    limit: u64,
    check: &mut DrainCheck,
    result: &mut EngineResult,
) -> anyhow::Result<u64> {
    let mut drained = 0;
    while drained < limit {
        let max = batch.min(usize::try_from(limit - drained).unwrap_or(usize::MAX));
        let claimed = engine.claim(queue, now_ms, max, DRAIN_VISIBILITY_MS)?;
        if claimed.leased.is_empty() {
            break;
        }
        for leased in &claimed.leased {
            check.check(leased.task.due_at_ms, &leased.task.payload, result);
            let outcome = engine.ack(queue, leased.task.id, leased.lease_id, now_ms)?;
            ensure!(
                outcome == LeaseOutcome::Ok,
                "ack of a fresh lease said {outcome:?}"
            );
        }
        drained += claimed.leased.len() as u64;
    }
    Ok(drained)
}

pub fn wall_ms() -> UnixMs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as UnixMs
}
