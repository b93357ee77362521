//! The embedded timeline storage engine.
//!
//! Files under the data directory (the format is described in `docs/storage-format.md`):
//! - `wal/<n>.wal`: the write-ahead log. Each store call appends one CRC frame holding all of
//!   its records; concurrent callers share one fsync (group commit).
//! - `q-<uid>/b-<bucket>.seg`: one file per due-time bucket of a queue, the same records
//!   appended without fsync; they are fsync'd at checkpoints, after which the WAL is dropped.
//! - `checkpoint`: per-bucket counts and file lengths, counters and live idempotency keys, so
//!   reopening reads neither far buckets nor the whole history.
//! - `meta`: queues and `*_meta` entries, rewritten whole on each (rare) change.
//!
//! Concurrency: one mutex guards the in-memory state; a second serialises WAL writes and a
//! third fsyncs. A caller applies its change in memory and queues its WAL frame under the
//! state lock, then makes sure the WAL is written to the OS past its frame (whoever takes the
//! write lock writes every queued frame with one `write`), and, if the call must be durable,
//! that it is fsync'd past it (whoever takes the sync lock fsyncs everything written so far).
//! Lock order is sync, write, state, never the reverse. Another caller may observe a change
//! before it is durable (a `get` is not delayed), but any change that builds on it (a claim
//! of a just-put task) has a later WAL frame, so after a crash either both or only the first
//! survive.
//!
//! Delivery state (leases, acks, nacks, extensions, dead letters) does not wait for fsync
//! unless [`EngineOptions::sync_delivery`] is set: its frame is written to the OS before the
//! call returns (so it survives a crash of the process), and it becomes durable with the next
//! fsync, which covers every earlier frame, or by the background flusher within
//! [`EngineOptions::delivery_sync_delay`]. Losing such a record in a machine crash only
//! delivers the task again, which at-least-once delivery allows (see
//! `docs/storage-format.md`, "Durability of delivery state").

pub mod bucket;
mod keys;
pub mod persist;
mod queue;
pub mod record;

use std::collections::{BTreeSet, HashMap, HashSet};

use rustc_hash::{FxHashMap, FxHashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use belfry_core::UnixMs;
use belfry_core::{LatePolicy, LeaseId, LeasedTask, NewTask, QueueName, Task, TaskId, TaskState};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use self::bucket::{bucket_for, bucket_range, split_id, task_id};
use self::keys::KeyHasher;
use self::persist::{BucketMeta, Checkpoint, CheckpointBucket, MetaFile};
pub use self::queue::EngineStats;
use self::queue::{Bucket, Queue, TaskFacts};
use self::record::{PutRecord, Record, WalBatch, WalTarget};
use crate::store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, PutOutcome, QueueCounts, Result, Store, StoreError,
};

/// When appended records are forced to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Every durable change returns only once its records are fsync'd (shared by group
    /// commit). Delivery state (claim, ack, nack, extend, dead letter) returns once written
    /// and is fsync'd within `EngineOptions::delivery_sync_delay`, unless
    /// `EngineOptions::sync_delivery` is set.
    #[default]
    Always,
    /// Calls return once their records are written to the OS; a background thread (or the
    /// next commit) fsyncs them within about this interval, and `flush` at once.
    Interval(Duration),
    /// Records are handed to the OS; fsync only at checkpoints and `flush`.
    Never,
}

/// Tuning knobs of the engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub fsync: FsyncPolicy,
    /// A checkpoint runs once this many bytes were appended to the WAL since the last one.
    /// It bounds replay work at reopen.
    pub checkpoint_wal_bytes: u64,
    /// Buckets are loaded this long before their first task is due, so loading is not on the
    /// critical path of a claim.
    pub lookahead_ms: u64,
    /// At a checkpoint, loaded buckets with nothing due or expiring within this distance of
    /// the latest `now` seen are unloaded (their entries dropped), bounding memory.
    pub unload_distance_ms: u64,
    /// Far buckets (starting beyond `unload_distance_ms`) are loaded only to serve a call on
    /// one of their tasks (get, cancel, ...). Once together they hold more tasks than this,
    /// all but the one just used are unloaded at once rather than at the next checkpoint,
    /// so lookups of far tasks cannot fill memory.
    pub far_loaded_tasks_max: usize,
    /// A bucket's write buffer is written out once it holds this many bytes.
    pub bucket_buffer_bytes: usize,
    /// All write buffers are written out once together they hold this many bytes.
    pub buffers_total_bytes: usize,
    /// Under `FsyncPolicy::Always`, make delivery-state calls (`claim`, `ack`, `nack`,
    /// `extend`, `dead_letter`) wait for their fsync like every other call. Off by default:
    /// they then return once their record is written to the OS, and it is fsync'd by the next
    /// durable call or within `delivery_sync_delay`.
    pub sync_delivery: bool,
    /// Longest time a delivery-state record written without fsync waits before the
    /// background flusher fsyncs it (when no durable call did so first).
    pub delivery_sync_delay: Duration,
    /// Run checkpoints on a thread of the engine's own. Otherwise the call that finds one
    /// due runs it before returning (its caller waits for the bucket files' fsync).
    pub background_checkpoints: bool,
}

/// Default WAL bytes between checkpoints: replaying 32 MiB at reopen takes well under 2 s
/// even on a busy 2-core machine (0.4 s measured for 48 MiB on a quiet one).
pub const CHECKPOINT_WAL_BYTES_DEFAULT: u64 = 32 * 1024 * 1024;
/// Default look-ahead: two near (1-minute) buckets.
pub const LOOKAHEAD_MS_DEFAULT: u64 = 2 * 60 * 1000;
/// Default unload distance: an hour, well beyond the look-ahead so buckets do not flap.
pub const UNLOAD_DISTANCE_MS_DEFAULT: u64 = 60 * 60 * 1000;
const _: () = assert!(LOOKAHEAD_MS_DEFAULT < UNLOAD_DISTANCE_MS_DEFAULT);
/// Default bound on how long delivery state stays unsynced: short enough that a machine crash
/// redelivers only what was acked in the last few tens of milliseconds, long enough that one
/// fsync covers thousands of acks at full speed.
pub const DELIVERY_SYNC_DELAY_DEFAULT: Duration = Duration::from_millis(20);
/// Default cap on tasks of far buckets held loaded: about 150 MB of entries.
pub const FAR_LOADED_TASKS_MAX_DEFAULT: usize = 1_000_000;

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            fsync: FsyncPolicy::Always,
            checkpoint_wal_bytes: CHECKPOINT_WAL_BYTES_DEFAULT,
            lookahead_ms: LOOKAHEAD_MS_DEFAULT,
            unload_distance_ms: UNLOAD_DISTANCE_MS_DEFAULT,
            far_loaded_tasks_max: FAR_LOADED_TASKS_MAX_DEFAULT,
            bucket_buffer_bytes: 256 * 1024,
            buffers_total_bytes: 32 * 1024 * 1024,
            sync_delivery: false,
            delivery_sync_delay: DELIVERY_SYNC_DELAY_DEFAULT,
            background_checkpoints: true,
        }
    }
}

const META_FILE: &str = "meta";
const CHECKPOINT_FILE: &str = "checkpoint";
const WAL_DIR: &str = "wal";
/// Held locked (`flock`) by the engine that has the directory open.
const LOCK_FILE: &str = "LOCK";
/// How long `open` keeps trying to take a held directory lock before it reports `InUse`. A
/// lock can be held briefly by a process that is not using the directory: a child forked by
/// any thread of the owner's process holds a copy of its descriptors (and so the lock) until
/// it execs, even if the owner closes the engine meanwhile. Retrying for a moment tells that
/// apart from a live engine.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(1);
/// Pause between attempts to take the directory lock.
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(10);

fn wal_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(WAL_DIR).join(format!("{number:016x}.wal"))
}

fn parse_wal_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

fn queue_dir(dir: &Path, uid: u64) -> PathBuf {
    dir.join(format!("q-{uid:016x}"))
}

fn parse_queue_dir(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("q-")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { context, source }
}

/// The current WAL file. Guarded by `Wal::writer`.
#[derive(Debug)]
struct WalWriter {
    /// Shared so that an fsync can run without holding the write lock.
    file: Arc<File>,
    number: u64,
}

/// Guarded by `Wal::sync`, which serialises fsyncs and WAL file switches.
#[derive(Debug)]
struct SyncState {
    last_sync: Instant,
}

/// The write-ahead log and how far it is written and fsync'd. Positions are logical: bytes
/// appended by this process (`State::wal_appended`), across WAL files.
#[derive(Debug)]
struct Wal {
    sync: Mutex<SyncState>,
    writer: Mutex<WalWriter>,
    /// WAL bytes handed to the OS (they survive a crash of the process).
    written: AtomicU64,
    /// WAL bytes fsync'd (they survive a crash of the machine).
    synced: AtomicU64,
    /// Writes and fsyncs done: with concurrent callers there are fewer than calls.
    writes: AtomicU64,
    syncs: AtomicU64,
    /// Set when a background fsync failed: after a failed fsync the kernel may have dropped
    /// the dirty pages, so a later successful fsync proves nothing and the engine must stop.
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
}

impl Wal {
    /// fsyncs everything written so far unless that is already done. The caller holds
    /// `sync` (passed in), so no WAL file switch happens meanwhile.
    fn sync_written(&self, sync: &mut SyncState) -> Result<()> {
        let (file, end) = {
            let writer = self.writer.lock();
            (
                Arc::clone(&writer.file),
                self.written.load(Ordering::Acquire),
            )
        };
        if self.synced.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        // Bytes written before `end` are in this file or in older ones, which were fsync'd
        // when the checkpoint switched away from them.
        file.sync_data().map_err(io("fsync the WAL"))?;
        sync.last_sync = Instant::now();
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced.fetch_max(end, Ordering::Release);
        Ok(())
    }

    fn unsynced(&self) -> bool {
        self.synced.load(Ordering::Acquire) < self.written.load(Ordering::Acquire)
    }
}

/// A thread that fsyncs written but unsynced WAL bytes every `period`, so the bound on how
/// long they stay unsynced holds even when no further call arrives: under
/// `FsyncPolicy::Interval`, and for delivery state under `FsyncPolicy::Always`.
#[derive(Debug)]
struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Flusher {
    fn start(wal: Arc<Wal>, period: Duration) -> Flusher {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("belfry-wal-fsync".into())
            .spawn(move || loop {
                {
                    let (stopped, wake) = &*signal;
                    let mut stopped = stopped.lock();
                    if !*stopped {
                        wake.wait_for(&mut stopped, period);
                    }
                    if *stopped {
                        return;
                    }
                }
                if !wal.unsynced() || wal.failed.load(Ordering::Acquire) {
                    continue;
                }
                let mut sync = wal.sync.lock();
                if let Err(error) = wal.sync_written(&mut sync) {
                    tracing::error!(%error, "background WAL fsync failed; the engine stops");
                    *wal.failure.lock() = Some(error.to_string());
                    wal.failed.store(true, Ordering::Release);
                }
            })
            .ok();
        if handle.is_none() {
            tracing::warn!(
                "could not start the WAL fsync thread; unsynced records wait for the next fsync"
            );
        }
        Flusher { stop, handle }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock() = true;
        wake.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Idempotency keys copied into a checkpoint per hold of the state lock.
const CHECKPOINT_KEY_CHUNK: usize = 16 * 1024;

/// About the bytes a lease record takes in a WAL frame (target, framing, fields).
const LEASE_RECORD_BYTES_HINT: usize = 64;

/// Whether a call should see to a checkpoint (see `Engine::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointNeed {
    No,
    Due,
    /// The WAL since the last checkpoint is this many times the threshold: background
    /// checkpoints are not keeping up.
    Overdue,
}

/// WAL growth, in checkpoint thresholds, at which writers stop leaving checkpoints to the
/// checkpoint thread and wait for one themselves.
const CHECKPOINT_OVERDUE_FACTOR: u64 = 2;

/// A thread that runs a checkpoint whenever a call finds one due, so that no caller waits
/// for the bucket files' fsync (`EngineOptions::background_checkpoints`).
#[derive(Debug)]
struct Checkpointer {
    signal: Arc<(Mutex<CheckpointSignal>, Condvar)>,
    handle: Option<thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct CheckpointSignal {
    requested: bool,
    stopped: bool,
}

impl Checkpointer {
    /// `None` if the thread cannot be started: callers then run checkpoints themselves.
    fn start(core: Arc<Core>) -> Option<Checkpointer> {
        let signal = Arc::new((Mutex::new(CheckpointSignal::default()), Condvar::new()));
        let theirs = Arc::clone(&signal);
        let spawned = thread::Builder::new()
            .name("belfry-checkpoint".into())
            .spawn(move || loop {
                {
                    let (flags, wake) = &*theirs;
                    let mut flags = flags.lock();
                    while !flags.requested && !flags.stopped {
                        wake.wait(&mut flags);
                    }
                    if flags.stopped {
                        return;
                    }
                    flags.requested = false;
                }
                let _guard = core.checkpointing.lock();
                // A failure poisons the engine (logged there; every later call reports it).
                let _ = core.checkpoint_guarded();
            });
        match spawned {
            Ok(handle) => Some(Checkpointer {
                signal,
                handle: Some(handle),
            }),
            Err(error) => {
                tracing::warn!(%error, "could not start the checkpoint thread; calls run checkpoints");
                None
            }
        }
    }

    fn request(&self) {
        let (flags, wake) = &*self.signal;
        flags.lock().requested = true;
        wake.notify_one();
    }
}

impl Drop for Checkpointer {
    /// Waits for a checkpoint in progress; one only requested is left to the next open.
    fn drop(&mut self) {
        let (flags, wake) = &*self.signal;
        flags.lock().stopped = true;
        wake.notify_one();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

#[derive(Debug)]
struct State {
    meta: MetaFile,
    /// The idempotency-key hash (its secret is kept in the checkpoint).
    key_hasher: KeyHasher,
    queues: FxHashMap<u64, Queue>,
    next_seq: u64,
    next_lease: u64,
    /// The latest `now` any call passed in: the reference for choosing bucket widths.
    last_now_ms: UnixMs,
    wal_pending: Vec<u8>,
    /// Logical WAL bytes appended so far (this process).
    wal_appended: u64,
    wal_since_checkpoint: u64,
    buffered_bytes: usize,
    poisoned: Option<String>,
    stats: EngineStats,
    /// Checkpoints run so far (they are the only deleters of bucket files).
    checkpoints: u64,
    /// Until a call passes `now`: the earliest due time submitted, used in its place.
    due_reference_ms: Option<UnixMs>,
}

/// The embedded engine. Cheap to share behind an `Arc`; every method may be called from many
/// threads at once.
#[derive(Debug)]
pub struct Engine {
    core: Arc<Core>,
    /// Stopped (joined) when the engine drops, before the final fsync in `Drop`.
    flusher: Option<Flusher>,
    /// Runs checkpoints off the callers' threads (`EngineOptions::background_checkpoints`);
    /// stopped before the flusher.
    checkpointer: Option<Checkpointer>,
    /// Holds the `flock` on `LOCK` while the engine is open; the OS releases it when the
    /// process dies, so a crash never blocks the next open.
    _lock: File,
    /// Set by [`Engine::abandon`]: drop without the final fsync.
    abandoned: bool,
}

/// The part of the engine a checkpoint needs, shared with the checkpoint thread.
#[derive(Debug)]
struct Core {
    dir: PathBuf,
    options: EngineOptions,
    wal: Arc<Wal>,
    state: Mutex<State>,
    checkpointing: Mutex<()>,
}

// The server shares one engine across threads.
const _: fn() = || {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<Engine>();
};

/// What phase A of a checkpoint decided.
#[derive(Debug, Default)]
struct CheckpointPlan {
    checkpoint: Checkpoint,
    /// Buckets `(uid, key, length)` with buffered bytes: written in phase B up to `length`.
    flush: Vec<(u64, u64, u64)>,
    sync_files: Vec<PathBuf>,
    sync_dirs: Vec<PathBuf>,
    /// Finished buckets `(uid, key, length)`, deleted in phase C if still untouched.
    doomed: Vec<(u64, u64, u64)>,
    /// Queues whose idempotency keys phase C copies into the checkpoint.
    key_queues: Vec<u64>,
}

/// One record of a call: where it goes and its bytes' place in the WAL batch.
struct Pending {
    uid: u64,
    key: u64,
    record: Record,
    range: std::ops::Range<usize>,
}

impl State {
    fn check(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(StoreError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    fn uid(&self, name: &QueueName) -> Result<u64> {
        self.meta
            .queues
            .get(name)
            .map(|(uid, _)| *uid)
            .ok_or_else(|| StoreError::QueueNotFound(name.clone()))
    }

    /// The queue, with every bucket relevant at `now_ms` loaded and expired leases ended.
    fn queue_at(
        &mut self,
        name: &QueueName,
        now_ms: UnixMs,
        lookahead_ms: u64,
    ) -> Result<(&mut Queue, &mut EngineStats)> {
        self.last_now_ms = self.last_now_ms.max(now_ms);
        let (queue, stats) = self.queue(name)?;
        queue.load_woken(now_ms.saturating_add(lookahead_ms), stats)?;
        queue.expire_leases(now_ms);
        Ok((queue, stats))
    }

    fn queue(&mut self, name: &QueueName) -> Result<(&mut Queue, &mut EngineStats)> {
        let uid = self.uid(name)?;
        let State { queues, stats, .. } = self;
        let queue = queues
            .get_mut(&uid)
            .ok_or_else(|| StoreError::QueueNotFound(name.clone()))?;
        Ok((queue, stats))
    }

    /// Appends a call's records: to the bucket buffers and the WAL queue, then applies them
    /// to memory. Returns the WAL position the caller must wait for.
    /// `pending` is borrowed so the caller drops it (payloads, strings) after the lock.
    fn commit(
        &mut self,
        batch: WalBatch,
        pending: &[Pending],
        options: &EngineOptions,
    ) -> Result<u64> {
        if pending.is_empty() {
            return Ok(0);
        }
        let frame = batch.finish();
        for p in pending {
            let Some(queue) = self.queues.get_mut(&p.uid) else {
                continue;
            };
            let last_now = self.last_now_ms;
            let dir = &queue.dir;
            let bucket = queue.buckets.entry(p.key).or_insert_with(|| {
                let path = dir.join(bucket::file_name(p.key));
                // A new bucket near now starts loaded (empty), so its tasks are claimable at
                // once without reading back what was just written.
                let near = bucket_range(p.key).is_some_and(|(start, _)| {
                    start <= last_now.saturating_add(options.lookahead_ms)
                });
                Bucket::new(path, 0, BucketMeta::default(), near)
            });
            let bytes = &frame[p.range.clone()];
            let offset = bucket.append(bytes);
            self.buffered_bytes += bytes.len();
            if bucket.buf.len() >= options.bucket_buffer_bytes {
                let written = bucket.flush()?;
                self.buffered_bytes -= written;
            }
            if bucket.entries.is_some() {
                queue.apply(p.key, &p.record, offset, bytes.len() as u32);
            } else if let Record::Put(put) = &p.record {
                queue.update_unloaded_meta(p.key, |meta| meta.add_scheduled(put.due_at_ms));
                if let Some(k) = &put.idempotency_key {
                    let hash = queue.hasher.hash(k);
                    queue.index.keys.insert(hash, task_id(put.seq, p.key));
                }
            } else {
                debug_assert!(false, "state change on an unloaded bucket");
            }
        }
        if self.buffered_bytes >= options.buffers_total_bytes {
            self.flush_buffers()?;
        }
        self.wal_pending.extend_from_slice(&frame);
        self.wal_appended += frame.len() as u64;
        self.wal_since_checkpoint += frame.len() as u64;
        Ok(self.wal_appended)
    }

    /// Unloads far buckets loaded for lookups once they hold more than the configured number
    /// of tasks, except `keep` (the bucket the current call used). A far bucket that holds
    /// something due or expiring soon (a task rescheduled near) stays.
    fn trim_far(&mut self, keep: Option<(u64, u64)>, options: &EngineOptions) {
        let horizon = self.last_now_ms.saturating_add(options.unload_distance_ms);
        let is_far = |key: u64| bucket_range(key).is_none_or(|(start, _)| start > horizon);
        let mut total = 0usize;
        for (uid, queue) in &self.queues {
            for (key, bucket) in &queue.buckets {
                if let Some(entries) = &bucket.entries {
                    if is_far(*key) && keep != Some((*uid, *key)) {
                        total += entries.len();
                    }
                }
            }
        }
        if total <= options.far_loaded_tasks_max {
            return;
        }
        for (uid, queue) in self.queues.iter_mut() {
            let candidates: Vec<u64> = queue
                .buckets
                .iter()
                .filter(|(key, b)| {
                    b.entries.is_some() && is_far(**key) && keep != Some((*uid, **key))
                })
                .map(|(key, _)| *key)
                .collect();
            for key in candidates {
                let wake = queue
                    .buckets
                    .get(&key)
                    .and_then(|b| b.computed_meta().wake_ms());
                if wake.is_none_or(|w| w > horizon) {
                    queue.unload(key);
                }
            }
        }
    }

    fn flush_buffers(&mut self) -> Result<()> {
        for queue in self.queues.values_mut() {
            for bucket in queue.buckets.values_mut() {
                let written = bucket.flush()?;
                self.buffered_bytes -= written;
            }
        }
        Ok(())
    }

    fn poison(&mut self, error: &StoreError) {
        tracing::error!(%error, "storage engine stopped after a fatal error");
        self.poisoned.get_or_insert_with(|| error.to_string());
    }
}

/// Records a change in a batch for one task.
fn push(batch: &mut WalBatch, pending: &mut Vec<Pending>, uid: u64, key: u64, record: Record) {
    let range = batch.push(
        WalTarget {
            queue_uid: uid,
            bucket: key,
        },
        &record,
    );
    pending.push(Pending {
        uid,
        key,
        record,
        range,
    });
}

impl Engine {
    /// Opens (or creates) an engine in `dir`, recovering after a crash: the WAL written since
    /// the last checkpoint is replayed (a torn tail is cut off), far buckets are not read.
    pub fn open(dir: impl AsRef<Path>, options: EngineOptions) -> Result<Engine> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(dir.join(WAL_DIR)).map_err(io("create the data directory"))?;
        let lock = lock_dir(&dir)?;
        let meta = MetaFile::read(&dir.join(META_FILE))?;
        let checkpoint = Checkpoint::read(&dir.join(CHECKPOINT_FILE))?.unwrap_or_default();
        let mut state = State {
            queues: FxHashMap::default(),
            next_seq: checkpoint.next_seq.max(1),
            next_lease: checkpoint.next_lease.max(1),
            last_now_ms: checkpoint.last_now_ms,
            wal_pending: Vec::new(),
            wal_appended: 0,
            wal_since_checkpoint: 0,
            buffered_bytes: 0,
            poisoned: None,
            stats: EngineStats::default(),
            checkpoints: 0,
            due_reference_ms: None,
            meta,
            key_hasher: checkpoint
                .key_secret
                .map_or_else(KeyHasher::random, |(k0, k1)| KeyHasher { k0, k1 }),
        };
        for (name, (uid, _)) in &state.meta.queues {
            let qdir = queue_dir(&dir, *uid);
            fs::create_dir_all(&qdir).map_err(io("create a queue directory"))?;
            state
                .queues
                .insert(*uid, Queue::new(name.clone(), *uid, qdir, state.key_hasher));
        }
        // Directories of deleted queues.
        for entry in fs::read_dir(&dir).map_err(io("list the data directory"))? {
            let entry = entry.map_err(io("list the data directory"))?;
            let name = entry.file_name();
            if let Some(uid) = name.to_str().and_then(parse_queue_dir) {
                if !state.queues.contains_key(&uid) {
                    fs::remove_dir_all(entry.path()).map_err(io("remove a deleted queue"))?;
                }
            }
        }
        // Buckets known to the checkpoint: cut anything written after it (the WAL replay
        // below writes it again); files it does not know were created after it: remove.
        let mut known: HashMap<u64, HashSet<u64>> = HashMap::new();
        for cb in &checkpoint.buckets {
            let Some(queue) = state.queues.get_mut(&cb.queue_uid) else {
                continue;
            };
            let path = queue.bucket_path(cb.key);
            let actual = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == ErrorKind::NotFound => 0,
                Err(source) => {
                    return Err(StoreError::Io {
                        context: "stat a bucket file",
                        source,
                    })
                }
            };
            if actual < cb.file_len {
                return Err(StoreError::Corrupt {
                    location: path.display().to_string(),
                    detail: format!(
                        "bucket file has {actual} bytes, the checkpoint recorded {}",
                        cb.file_len
                    ),
                });
            }
            if actual > cb.file_len {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io("open a bucket file to cut its tail"))?;
                file.set_len(cb.file_len)
                    .map_err(io("cut a bucket file's tail"))?;
            }
            known.entry(cb.queue_uid).or_default().insert(cb.key);
            queue.add_bucket(cb.key, Bucket::new(path, cb.file_len, cb.meta, false));
        }
        for queue in state.queues.values_mut() {
            let known = known.remove(&queue.uid).unwrap_or_default();
            for entry in fs::read_dir(&queue.dir).map_err(io("list a queue directory"))? {
                let entry = entry.map_err(io("list a queue directory"))?;
                let keep = entry
                    .file_name()
                    .to_str()
                    .and_then(bucket::parse_file_name)
                    .is_some_and(|key| known.contains(&key));
                if !keep {
                    fs::remove_file(entry.path()).map_err(io("remove a stale bucket file"))?;
                }
            }
        }
        for &(uid, hash, id) in &checkpoint.keys {
            if let Some(queue) = state.queues.get_mut(&uid) {
                queue.index.keys.insert(hash, id);
            }
        }
        for (uid, key, id) in &checkpoint.legacy_keys {
            if let Some(queue) = state.queues.get_mut(uid) {
                queue.index.keys.insert(state.key_hasher.hash(key), *id);
            }
        }
        let last_wal = replay(&dir, checkpoint.wal_start, &mut state, &options)?;
        let number = last_wal.max(checkpoint.wal_start) + 1;
        let file = create_wal(&dir, number)?;
        let wal = Arc::new(Wal {
            sync: Mutex::new(SyncState {
                last_sync: Instant::now(),
            }),
            writer: Mutex::new(WalWriter {
                file: Arc::new(file),
                number,
            }),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let flush_period = match options.fsync {
            FsyncPolicy::Interval(every) => Some(every),
            FsyncPolicy::Always if !options.sync_delivery => Some(options.delivery_sync_delay),
            FsyncPolicy::Always | FsyncPolicy::Never => None,
        };
        let flusher = flush_period.map(|period| Flusher::start(Arc::clone(&wal), period));
        let background = options.background_checkpoints;
        let core = Arc::new(Core {
            dir,
            options,
            wal,
            state: Mutex::new(state),
            checkpointing: Mutex::new(()),
        });
        core.checkpoint()?;
        let checkpointer = if background {
            Checkpointer::start(Arc::clone(&core))
        } else {
            None
        };
        Ok(Engine {
            core,
            flusher,
            checkpointer,
            _lock: lock,
            abandoned: false,
        })
    }

    /// Closes the engine as a crash of the process would leave it: no checkpoint, no final
    /// fsync of delivery state, write buffers dropped. The directory lock is released, so the
    /// same process can reopen the directory and see what a restart after `kill -9` sees.
    /// For tests; `std::mem::forget` would keep the lock (and the flusher thread) alive.
    pub fn abandon(mut self) {
        self.abandoned = true;
    }

    /// Work counters: how many buckets and records were read so far.
    pub fn stats(&self) -> EngineStats {
        let state = self.core.state.lock();
        let mut stats = state.stats;
        stats.wal_writes = self.core.wal.writes.load(Ordering::Relaxed);
        stats.wal_syncs = self.core.wal.syncs.load(Ordering::Relaxed);
        stats.checkpoints = state.checkpoints;
        stats.buckets_in_memory = 0;
        stats.buckets_total = 0;
        for queue in state.queues.values() {
            stats.buckets_total += queue.buckets.len() as u64;
            stats.buckets_in_memory += queue
                .buckets
                .values()
                .filter(|b| b.entries.is_some())
                .count() as u64;
        }
        stats
    }

    /// Makes sure the WAL is written to the OS up to `ticket`, writing every queued frame
    /// ourselves unless a writer already did (group commit of writes: one `write` for all
    /// frames queued when the writer took the lock).
    fn write_through(&self, ticket: u64) -> Result<()> {
        if self.core.wal.written.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let writer = self.core.wal.writer.lock();
        if self.core.wal.written.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let (bytes, end) = {
            let mut state = self.core.state.lock();
            state.check()?;
            (std::mem::take(&mut state.wal_pending), state.wal_appended)
        };
        if let Err(error) = (&*writer.file)
            .write_all(&bytes)
            .map_err(io("append to the WAL"))
        {
            self.core.state.lock().poison(&error);
            return Err(error);
        }
        self.core.wal.writes.fetch_add(1, Ordering::Relaxed);
        self.core.wal.written.store(end, Ordering::Release);
        Ok(())
    }

    /// Makes sure the WAL is fsync'd up to `ticket` (already written): whoever takes the sync
    /// lock fsyncs everything written so far, and the others find their frames covered.
    fn sync_through(&self, ticket: u64) -> Result<()> {
        if self.core.wal.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let mut sync = self.core.wal.sync.lock();
        if self.core.wal.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let result = self.core.wal.sync_written(&mut sync);
        if let Err(error) = &result {
            self.core.state.lock().poison(error);
        }
        result
    }

    /// Waits until the WAL holds everything up to `ticket` as the fsync policy asks. A
    /// `delivery` call (lease, ack, nack, extend, dead letter) waits only for the write,
    /// unless `sync_delivery` is set.
    fn wait_durable(&self, ticket: u64, delivery: bool) -> Result<()> {
        self.write_through(ticket)?;
        match self.core.options.fsync {
            FsyncPolicy::Always if !delivery || self.core.options.sync_delivery => {
                self.sync_through(ticket)
            }
            FsyncPolicy::Always | FsyncPolicy::Never => Ok(()),
            FsyncPolicy::Interval(every) => {
                // Opportunistic: fsync now if it is overdue and no one else is at it; the
                // background flusher keeps the bound otherwise.
                if let Some(mut sync) = self.core.wal.sync.try_lock() {
                    if sync.last_sync.elapsed() >= every {
                        if let Err(error) = self.core.wal.sync_written(&mut sync) {
                            self.core.state.lock().poison(&error);
                            return Err(error);
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether the WAL grew enough since the last checkpoint for the next one. Read while the
    /// caller still holds the state lock, so `finish` need not take it again.
    fn checkpoint_due(&self, state: &State) -> CheckpointNeed {
        let threshold = self.core.options.checkpoint_wal_bytes;
        if state.wal_since_checkpoint >= threshold.saturating_mul(CHECKPOINT_OVERDUE_FACTOR) {
            CheckpointNeed::Overdue
        } else if state.wal_since_checkpoint >= threshold {
            CheckpointNeed::Due
        } else {
            CheckpointNeed::No
        }
    }

    /// After a mutating call: wait for durability, then see to a checkpoint if one is due:
    /// ask the checkpoint thread for it, or run it here (without a thread, or when writers
    /// have outrun the thread: the caller then waits, which bounds the WAL and so the replay
    /// at reopen).
    fn finish(&self, ticket: u64, delivery: bool, need: CheckpointNeed) -> Result<()> {
        self.wait_durable(ticket, delivery)?;
        match (need, &self.checkpointer) {
            (CheckpointNeed::No, _) => {}
            (CheckpointNeed::Due, Some(checkpointer)) => checkpointer.request(),
            (CheckpointNeed::Due, None) => {
                if let Some(_guard) = self.core.checkpointing.try_lock() {
                    self.core.checkpoint_guarded()?;
                }
            }
            (CheckpointNeed::Overdue, _) => {
                let _guard = self.core.checkpointing.lock();
                // The checkpoint that held the guard may have made this one unnecessary.
                let still = self.core.state.lock().wal_since_checkpoint
                    >= self.core.options.checkpoint_wal_bytes;
                if still {
                    self.core.checkpoint_guarded()?;
                }
            }
        }
        Ok(())
    }

    fn lock_state(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut state = self.core.state.lock();
        if state.poisoned.is_none() && self.core.wal.failed.load(Ordering::Acquire) {
            let reason = self.core.wal.failure.lock().clone().unwrap_or_default();
            state.poisoned = Some(reason);
        }
        state.check()?;
        Ok(state)
    }

    /// Commits a call's records and waits for them to be durable (a `delivery` call: written;
    /// see [`Engine::wait_durable`]).
    fn commit(
        &self,
        mut state: parking_lot::MutexGuard<'_, State>,
        batch: WalBatch,
        pending: Vec<Pending>,
        delivery: bool,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let keep = pending.first().map(|p| (p.uid, p.key));
        let ticket = match state.commit(batch, &pending, &self.core.options) {
            Ok(ticket) => ticket,
            Err(error) => {
                state.poison(&error);
                return Err(error);
            }
        };
        state.trim_far(keep, &self.core.options);
        let checkpoint_due = self.checkpoint_due(&state);
        drop(state);
        drop(pending);
        self.finish(ticket, delivery, checkpoint_due)
    }

    /// Reads and decodes the files of buckets that `now_ms` is about to need without holding
    /// the state lock, so a large load in one queue does not stall calls on other queues. The bytes
    /// up to a bucket's flushed length never change while it exists (files are append-only
    /// and only cut at open), so reading them unlocked is safe; the rest is read under the
    /// lock by the load itself.
    fn preload(&self, queue: &QueueName, now_ms: UnixMs) -> Result<()> {
        // Buckets are deleted (and their keys may be reused) only by checkpoints, and a queue
        // re-created gets a new uid: if either changed meanwhile, the bytes are not used.
        let (targets, epoch) = {
            let mut state = self.lock_state()?;
            let checkpoints = state.checkpoints;
            let (q, _) = state.queue(queue)?;
            let targets = q.woken(now_ms.saturating_add(self.core.options.lookahead_ms));
            (targets, (checkpoints, q.uid))
        };
        if targets.is_empty() {
            return Ok(());
        }
        let mut read = Vec::with_capacity(targets.len());
        for (key, path, len) in targets {
            // Errors are left for the locked load to find and report.
            if let Ok(decoded) = queue::decode_prefix(&path, len) {
                read.push((key, decoded));
            }
        }
        let mut state = self.lock_state()?;
        let checkpoints = state.checkpoints;
        let (q, stats) = state.queue(queue)?;
        if (checkpoints, q.uid) != epoch {
            return Ok(());
        }
        for (key, decoded) in read {
            q.load_from(key, Some(decoded), stats)?;
        }
        Ok(())
    }

    /// The shared path of cancel, reschedule and redrive: find the task (ending a lease that
    /// has run out), require `required`, then durably append the one record `make` builds from
    /// the task's sequence number. A task in another state writes nothing.
    fn change_state(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
        required: TaskState,
        make: impl FnOnce(u64) -> Record,
    ) -> Result<ChangeOutcome> {
        let mut state = self.lock_state()?;
        let Some((uid, key, seq, current)) =
            self.change_target(&mut state, queue, id, Some(now_ms))?
        else {
            return Ok(ChangeOutcome::NotFound);
        };
        if current != required {
            return Ok(ChangeOutcome::WrongState(current));
        }
        let mut batch = WalBatch::new();
        let mut pending = Vec::new();
        push(&mut batch, &mut pending, uid, key, make(seq));
        self.commit(state, batch, pending, false)?;
        Ok(ChangeOutcome::Ok)
    }

    /// The shared path of ack, nack, extend and dead_letter: check the lease, then append the
    /// one record `make` builds from the task's sequence number. A stale lease writes nothing.
    fn change_lease(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
        make: impl FnOnce(u64) -> Record,
    ) -> Result<LeaseOutcome> {
        let mut state = self.lock_state()?;
        let (uid, key, seq) = match self.leased(&mut state, queue, id, lease, now_ms)? {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        let mut batch = WalBatch::new();
        let mut pending = Vec::new();
        push(&mut batch, &mut pending, uid, key, make(seq));
        self.commit(state, batch, pending, true)?;
        Ok(LeaseOutcome::Ok)
    }

    /// Finds a leased task and checks the lease; on success returns its bucket key and seq.
    fn leased(
        &self,
        state: &mut State,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<std::result::Result<(u64, u64, u64), LeaseOutcome>> {
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        Ok(lease_in_force(q, stats, id, lease)?.map(|(key, seq)| (uid, key, seq)))
    }

    /// Finds a task for cancel or reschedule (or redrive), returning its entry's state.
    fn change_target(
        &self,
        state: &mut State,
        queue: &QueueName,
        id: TaskId,
        now_ms: Option<UnixMs>,
    ) -> Result<Option<(u64, u64, u64, TaskState)>> {
        let (q, stats) = match now_ms {
            Some(now) => state.queue_at(queue, now, self.core.options.lookahead_ms)?,
            None => state.queue(queue)?,
        };
        let uid = q.uid;
        let (seq, key) = split_id(id);
        let found = q.entry(seq, key, stats)?.map(|e| e.state);
        Ok(found.map(|s| (uid, key, seq, s)))
    }
}

/// The live task of `q` whose idempotency key is `key`, if any: the key index names the
/// tasks whose key has the same hash, and each candidate's put record says whether its key is
/// this one (far candidates' buckets are loaded; `trim_far` bounds what stays loaded).
fn live_task_with_key(q: &mut Queue, stats: &mut EngineStats, key: &str) -> Result<Option<Task>> {
    let hash = q.hasher.hash(key);
    let candidates: Vec<TaskId> = q.index.keys.candidates(hash).collect();
    for id in candidates {
        let (seq, bucket) = split_id(id);
        if q.entry(seq, bucket, stats)?.is_none() {
            continue;
        }
        if let Some(task) = q.view(seq, bucket)? {
            if task.idempotency_key.as_deref() == Some(key) {
                return Ok(Some(task));
            }
        }
    }
    Ok(None)
}

/// Whether `lease` is the lease in force on task `id` of `q` (whose buckets near now are
/// loaded and expired leases ended): its `(key, seq)`, or the outcome to report.
fn lease_in_force(
    q: &mut Queue,
    stats: &mut EngineStats,
    id: TaskId,
    lease: LeaseId,
) -> Result<std::result::Result<(u64, u64), LeaseOutcome>> {
    let (seq, key) = split_id(id);
    let Some(entry) = q.entry(seq, key, stats)? else {
        return Ok(Err(LeaseOutcome::NotFound));
    };
    if entry.state != TaskState::Leased || entry.lease_id != lease.0 {
        return Ok(Err(LeaseOutcome::LeaseExpired));
    }
    Ok(Ok((key, seq)))
}

/// Takes the data directory's lock, so that two engines (in this process or another) never
/// write the same files. The lock is an OS file lock: it goes away with the process, so a
/// crashed engine never blocks the next open, and the `LOCK` file itself may stay behind.
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("open the data directory's lock file"))?;
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT_MAX => {
                thread::sleep(LOCK_RETRY_PAUSE);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::InUse {
                    dir: dir.display().to_string(),
                    lock: path.display().to_string(),
                })
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(StoreError::Io {
                    context: "lock the data directory",
                    source,
                })
            }
        }
    }
}

impl Core {
    /// Makes the bucket files durable, records where they end, and drops the WAL before that
    /// point. Also unloads far buckets and deletes buckets whose tasks are all finished.
    ///
    /// Three phases, so writers are stopped only for the first one, which does no I/O
    /// that waits for the disk:
    /// A. under all WAL locks and the state lock: write the queued WAL, note every bucket's
    ///    length (written or still buffered), switch to the next WAL file (created and its
    ///    directory fsync'd beforehand); the checkpoint will say "files up to these lengths,
    ///    then the WAL from the new file". Then, holding only the sync lock, fsync the old
    ///    WAL file: calls that need an fsync wait for it (they would anyway), calls that do
    ///    not (leases, acks) go on writing to the new file.
    /// B. write each noted bucket's buffer, taking the state lock one bucket at a time, then
    ///    without locks fsync the bucket files written since the last checkpoint. Writers
    ///    append past the noted lengths meanwhile; those bytes are also in the new WAL.
    /// C. write the checkpoint, delete the old WAL, and (under the state lock) delete the
    ///    finished buckets that received nothing since phase A.
    fn checkpoint(&self) -> Result<()> {
        let _guard = self.checkpointing.lock();
        self.checkpoint_guarded()
    }

    fn checkpoint_guarded(&self) -> Result<()> {
        let result = self.checkpoint_phases();
        if let Err(error) = &result {
            self.state.lock().poison(error);
        }
        result
    }

    fn checkpoint_phases(&self) -> Result<()> {
        // Before phase A: the next WAL file, so that no file creation and directory fsync
        // happen under the locks. Only checkpoints switch files, and they run one at a time.
        let number = self.wal.writer.lock().number + 1;
        let next_file = create_wal(&self.dir, number)?;
        // Phase A.
        let mut sync = self.wal.sync.lock();
        let (plan, old_file, old_end) = {
            let mut writer = self.wal.writer.lock();
            let mut state = self.state.lock();
            state.check()?;
            let pending = std::mem::take(&mut state.wal_pending);
            (&*writer.file)
                .write_all(&pending)
                .map_err(io("append to the WAL"))?;
            self.wal
                .written
                .store(state.wal_appended, Ordering::Release);
            let plan = self.plan_checkpoint(&mut state)?;
            let old_file = std::mem::replace(&mut writer.file, Arc::new(next_file));
            writer.number = number;
            state.wal_since_checkpoint = 0;
            (plan, old_file, state.wal_appended)
        };
        // Still phase A, with only the sync lock held: nobody can fsync the new file (and so
        // mark these bytes synced) before the old one is.
        old_file.sync_data().map_err(io("fsync the WAL"))?;
        sync.last_sync = Instant::now();
        self.wal.syncs.fetch_add(1, Ordering::Relaxed);
        self.wal.synced.fetch_max(old_end, Ordering::Release);
        drop(sync);
        let old_wal = number - 1;
        // Phase B.
        for &(uid, key, len) in &plan.flush {
            let mut state = self.state.lock();
            state.check()?;
            let State {
                queues,
                buffered_bytes,
                ..
            } = &mut *state;
            let Some(bucket) = queues.get_mut(&uid).and_then(|q| q.buckets.get_mut(&key)) else {
                continue; // deleted with its queue
            };
            if bucket.flushed_len < len {
                let written = bucket.flush()?;
                *buffered_bytes -= written;
            }
        }
        for path in &plan.sync_files {
            match File::open(path) {
                Ok(file) => file.sync_all().map_err(io("fsync a bucket file"))?,
                // Deleted meanwhile with its queue: nothing to keep.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StoreError::Io {
                        context: "open a bucket file to fsync it",
                        source,
                    })
                }
            }
        }
        for dir in &plan.sync_dirs {
            match persist::sync_dir(dir) {
                Ok(()) => {}
                Err(_) if !dir.exists() => {}
                Err(error) => return Err(error),
            }
        }
        // Phase C.
        let mut checkpoint = plan.checkpoint;
        checkpoint.wal_start = old_wal + 1;
        self.write_checkpoint(&checkpoint, &plan.key_queues)?;
        for n in old_wal_files(&self.dir)? {
            if n <= old_wal {
                fs::remove_file(wal_path(&self.dir, n)).map_err(io("remove an old WAL file"))?;
            }
        }
        let mut state = self.state.lock();
        state.checkpoints += 1;
        for (uid, key, len) in plan.doomed {
            let Some(queue) = state.queues.get_mut(&uid) else {
                continue;
            };
            let untouched = queue
                .buckets
                .get(&key)
                .is_some_and(|b| b.len() == len && b.computed_meta().is_empty());
            if !untouched {
                // Written to since phase A: it stays. The checkpoint does not list it, so a
                // restart rebuilds it from the WAL alone (its old tasks were all finished).
                continue;
            }
            queue.unload(key);
            if let Some(bucket) = queue.buckets.remove(&key) {
                state.buffered_bytes = state.buffered_bytes.saturating_sub(bucket.buf.len());
                match fs::remove_file(&bucket.path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(StoreError::Io {
                            context: "remove a finished bucket file",
                            source,
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the checkpoint file, streaming the idempotency keys of `key_queues` from the
    /// live index a chunk at a time, taking the state lock per chunk: a queue with millions
    /// of keys neither stalls calls while it is copied nor is copied whole into memory.
    ///
    /// The copy is later than phase A, and that is sound: every key inserted since then has
    /// its put in WAL files that replay reads after this checkpoint (and re-inserts), and
    /// every key released since then has its task's finishing record there too (replay
    /// loads that bucket, which releases it again). A key released before phase A is not
    /// in the index any more, so it cannot be copied.
    fn write_checkpoint(&self, checkpoint: &Checkpoint, key_queues: &[u64]) -> Result<()> {
        let mut writer = persist::FramedWriter::create(&self.dir.join(CHECKPOINT_FILE))?;
        writer.write(&checkpoint.encode_head())?;
        let mut chunk = Vec::new();
        let mut bytes = Vec::new();
        for &uid in key_queues {
            let mut after = None;
            loop {
                chunk.clear();
                {
                    let state = self.state.lock();
                    let Some(queue) = state.queues.get(&uid) else {
                        break; // deleted meanwhile
                    };
                    let pairs = queue.index.keys.chunk_after(after, CHECKPOINT_KEY_CHUNK);
                    chunk.extend(pairs.iter().map(|&(hash, id)| (uid, hash, id)));
                    after = pairs.last().copied();
                }
                if chunk.is_empty() {
                    break;
                }
                bytes.clear();
                persist::encode_key_chunk(&mut bytes, &chunk);
                writer.write(&bytes)?;
            }
        }
        writer.write(&persist::KEY_CHUNKS_END)?;
        writer.finish()
    }

    /// Phase A of a checkpoint, under the state lock: unloads far buckets, picks finished
    /// ones and notes what to write, fsync and record.
    fn plan_checkpoint(&self, state: &mut State) -> Result<CheckpointPlan> {
        let horizon = state
            .last_now_ms
            .saturating_add(self.options.unload_distance_ms);
        let mut plan = CheckpointPlan::default();
        for queue in state.queues.values_mut() {
            let keys: Vec<u64> = queue.buckets.keys().copied().collect();
            let mut any_dirty = false;
            for key in keys {
                let Some(bucket) = queue.buckets.get(&key) else {
                    continue;
                };
                let meta = bucket.computed_meta();
                if meta.is_empty() {
                    plan.doomed.push((queue.uid, key, bucket.len()));
                    continue;
                }
                if bucket.entries.is_some() && meta.wake_ms().is_none_or(|w| w > horizon) {
                    queue.unload(key);
                }
                let Some(bucket) = queue.buckets.get_mut(&key) else {
                    continue;
                };
                if !bucket.buf.is_empty() {
                    plan.flush.push((queue.uid, key, bucket.len()));
                }
                if bucket.dirty && bucket.len() > 0 {
                    plan.sync_files.push(bucket.path.clone());
                    any_dirty = true;
                }
                bucket.dirty = false;
                plan.checkpoint.buckets.push(CheckpointBucket {
                    queue_uid: queue.uid,
                    key,
                    // Buffered bytes count: phase B writes them before the fsync.
                    file_len: bucket.len(),
                    meta: bucket.computed_meta(),
                });
            }
            if any_dirty {
                plan.sync_dirs.push(queue.dir.clone());
            }
            // Keys are copied in phase C, a chunk at a time (see there).
            plan.key_queues.push(queue.uid);
        }
        plan.checkpoint.next_seq = state.next_seq;
        plan.checkpoint.next_lease = state.next_lease;
        plan.checkpoint.last_now_ms = state.last_now_ms;
        plan.checkpoint.key_secret = Some((state.key_hasher.k0, state.key_hasher.k1));
        Ok(plan)
    }
}

impl Drop for Engine {
    /// A clean close makes delivery state written without fsync durable (best effort: an
    /// error here only means those tasks may be delivered again after a machine crash).
    fn drop(&mut self) {
        drop(self.checkpointer.take());
        drop(self.flusher.take());
        if self.abandoned
            || self.core.wal.failed.load(Ordering::Acquire)
            || !self.core.wal.unsynced()
        {
            return;
        }
        if matches!(self.core.options.fsync, FsyncPolicy::Never) {
            return;
        }
        let mut sync = self.core.wal.sync.lock();
        if let Err(error) = self.core.wal.sync_written(&mut sync) {
            tracing::warn!(%error, "final WAL fsync at close failed");
        }
    }
}

fn create_wal(dir: &Path, number: u64) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(wal_path(dir, number))
        .map_err(io("create a WAL file"))?;
    persist::sync_dir(&dir.join(WAL_DIR))?;
    Ok(file)
}

fn old_wal_files(dir: &Path) -> Result<Vec<u64>> {
    let mut numbers = Vec::new();
    for entry in fs::read_dir(dir.join(WAL_DIR)).map_err(io("list the WAL directory"))? {
        let entry = entry.map_err(io("list the WAL directory"))?;
        if let Some(n) = entry.file_name().to_str().and_then(parse_wal_name) {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// Whether a bad frame at the end of the last WAL file is a torn write (cut it) rather than
/// damage to acknowledged data (refuse to open): it runs past the end of the file, or it is
/// the last frame, or everything after its start is zeros (space allocated, never written).
fn is_torn_tail(rest: &[u8], error: &record::DecodeError) -> bool {
    if matches!(error, record::DecodeError::Truncated { .. }) {
        return true;
    }
    if rest.iter().all(|b| *b == 0) {
        return true;
    }
    if rest.len() >= record::FRAME_HEADER_BYTES {
        let declared = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        return record::FRAME_HEADER_BYTES.saturating_add(declared) == rest.len();
    }
    false
}

/// Replays WAL files numbered `start` and later into the bucket files. Returns the highest
/// WAL file number seen.
fn replay(dir: &Path, start: u64, state: &mut State, options: &EngineOptions) -> Result<u64> {
    let numbers = old_wal_files(dir)?;
    let mut last = 0;
    let mut to_load: BTreeSet<(u64, u64)> = BTreeSet::new();
    let count = numbers.len();
    for (i, number) in numbers.into_iter().enumerate() {
        last = last.max(number);
        let path = wal_path(dir, number);
        if number < start {
            fs::remove_file(&path).map_err(io("remove an old WAL file"))?;
            continue;
        }
        let bytes = fs::read(&path).map_err(io("read a WAL file"))?;
        let mut offset = 0;
        while offset < bytes.len() {
            let (entries, len) = match record::decode_wal(&bytes[offset..]) {
                Ok(decoded) => decoded,
                Err(error) => {
                    if i + 1 == count && is_torn_tail(&bytes[offset..], &error) {
                        // The last file ends in a frame that was being written at the crash:
                        // its call never returned, so dropping it loses nothing acknowledged.
                        tracing::warn!(
                            path = %path.display(),
                            offset,
                            %error,
                            "cutting a torn WAL tail"
                        );
                        let file = OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .map_err(io("open a WAL file to cut its tail"))?;
                        file.set_len(offset as u64)
                            .map_err(io("cut a WAL file's tail"))?;
                        break;
                    }
                    return Err(StoreError::Corrupt {
                        location: format!("{} at offset {offset}", path.display()),
                        detail: error.to_string(),
                    });
                }
            };
            for (target, inner) in entries {
                // Payload and headers are not needed here: the frame is copied verbatim.
                let Ok((record, _)) = record::decode_light(inner) else {
                    continue; // decode_wal checked it; unreachable in practice
                };
                state.stats.wal_records_replayed += 1;
                state.next_seq = state.next_seq.max(record.seq().saturating_add(1));
                if let Record::Lease { lease_id, .. } | Record::Extend { lease_id, .. } = &record {
                    state.next_lease = state.next_lease.max(lease_id.saturating_add(1));
                }
                let Some(queue) = state.queues.get_mut(&target.queue_uid) else {
                    continue; // the queue was deleted after this record
                };
                let dir = &queue.dir;
                let bucket = queue.buckets.entry(target.bucket).or_insert_with(|| {
                    let path = dir.join(bucket::file_name(target.bucket));
                    Bucket::new(path, 0, BucketMeta::default(), false)
                });
                bucket.append(inner);
                state.buffered_bytes += inner.len();
                if bucket.buf.len() >= options.bucket_buffer_bytes {
                    let written = bucket.flush()?;
                    state.buffered_bytes -= written;
                }
                match &record {
                    Record::Put(put) => {
                        queue.update_unloaded_meta(target.bucket, |m| {
                            m.add_scheduled(put.due_at_ms)
                        });
                        if let Some(k) = &put.idempotency_key {
                            let hash = queue.hasher.hash(k);
                            queue
                                .index
                                .keys
                                .insert(hash, task_id(put.seq, target.bucket));
                        }
                    }
                    _ => {
                        to_load.insert((target.queue_uid, target.bucket));
                    }
                }
            }
            offset += len;
        }
    }
    // Buckets that saw state changes: their counts are only known by reading them.
    let State { queues, stats, .. } = state;
    for (uid, key) in to_load {
        if let Some(queue) = queues.get_mut(&uid) {
            queue.load(key, stats)?;
        }
    }
    Ok(last)
}

impl Store for Engine {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        let created = match meta.queues.get_mut(queue) {
            Some((_, existing)) => {
                *existing = config;
                false
            }
            None => {
                let uid = meta.next_queue_uid;
                meta.next_queue_uid += 1;
                let qdir = queue_dir(&self.core.dir, uid);
                fs::create_dir_all(&qdir).map_err(io("create a queue directory"))?;
                persist::sync_dir(&self.core.dir)?;
                meta.queues.insert(queue.clone(), (uid, config));
                let hasher = state.key_hasher;
                state
                    .queues
                    .insert(uid, Queue::new(queue.clone(), uid, qdir, hasher));
                true
            }
        };
        meta.write(&self.core.dir.join(META_FILE))?;
        state.meta = meta;
        Ok(created)
    }

    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>> {
        let state = self.lock_state()?;
        Ok(state.meta.queues.get(queue).map(|(_, c)| c.clone()))
    }

    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>> {
        let state = self.lock_state()?;
        Ok(state
            .meta
            .queues
            .iter()
            .map(|(name, (_, config))| (name.clone(), config.clone()))
            .collect())
    }

    fn delete_queue(&self, queue: &QueueName) -> Result<bool> {
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        let Some((uid, _)) = meta.queues.remove(queue) else {
            return Ok(false);
        };
        // The meta file is the truth: once it no longer names the queue, its files and any
        // WAL records for its uid are ignored, so removing the directory may lag.
        meta.write(&self.core.dir.join(META_FILE))?;
        state.meta = meta;
        if let Some(q) = state.queues.remove(&uid) {
            let buffered: usize = q.buckets.values().map(|b| b.buf.len()).sum();
            state.buffered_bytes -= buffered;
            if let Err(error) = fs::remove_dir_all(&q.dir) {
                tracing::warn!(%error, dir = %q.dir.display(), "could not remove a deleted queue's files; they go at the next open");
            }
        }
        Ok(true)
    }

    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        // Sized before taking the lock: the frame is built once, without regrowing.
        let mut batch = WalBatch::with_capacity(
            tasks
                .iter()
                .map(|t| {
                    record::put_size_hint(t.payload.len(), &t.headers, t.idempotency_key.as_deref())
                })
                .sum(),
        );
        let mut state = self.lock_state()?;
        let mut uids = Vec::with_capacity(tasks.len());
        for task in &tasks {
            uids.push(state.uid(&task.queue)?);
        }
        let mut pending = Vec::with_capacity(tasks.len());
        let mut outcomes = Vec::with_capacity(tasks.len());
        // Keys first seen in this batch → the task they created.
        let mut batch_keys: HashMap<(u64, String), Task> = HashMap::new();
        // Bucket widths are relative to now. Before any call has said what time it is, the
        // earliest due time submitted so far stands in for it (tasks are mostly due in the
        // future), rather than the epoch, which would put everything in week buckets.
        let last_now = if state.last_now_ms > 0 {
            state.last_now_ms
        } else {
            let earliest = tasks.iter().map(|t| t.due_at_ms).min().unwrap_or(0);
            let reference = state.due_reference_ms.map_or(earliest, |r| r.min(earliest));
            state.due_reference_ms = Some(reference);
            reference
        };
        for (task, uid) in tasks.into_iter().zip(uids) {
            if let Some(k) = &task.idempotency_key {
                if let Some(first) = batch_keys.get(&(uid, k.clone())) {
                    outcomes.push(PutOutcome::Duplicate(Box::new(first.clone())));
                    continue;
                }
                let (q, stats) = state.queue(&task.queue)?;
                if let Some(found) = live_task_with_key(q, stats, k)? {
                    outcomes.push(PutOutcome::Duplicate(Box::new(found)));
                    continue;
                }
            }
            let seq = state.next_seq;
            state.next_seq += 1;
            let key = bucket_for(task.due_at_ms, last_now);
            let id = task_id(seq, key);
            if let Some(k) = &task.idempotency_key {
                let view = Task {
                    id,
                    queue: task.queue.clone(),
                    due_at_ms: task.due_at_ms,
                    payload: task.payload.clone(),
                    payload_kind: task.payload_kind,
                    headers: task.headers.clone(),
                    priority: task.priority,
                    idempotency_key: Some(k.clone()),
                    late_policy: task.late_policy,
                    state: TaskState::Scheduled,
                    attempts: 0,
                    lease_until_ms: None,
                    dead_reason: None,
                };
                batch_keys.insert((uid, k.clone()), view);
            }
            outcomes.push(PutOutcome::Created {
                id,
                due_at_ms: task.due_at_ms,
            });
            let record = Record::Put(PutRecord {
                seq,
                due_at_ms: task.due_at_ms,
                priority: task.priority,
                payload_kind: task.payload_kind,
                late_policy: task.late_policy,
                idempotency_key: task.idempotency_key,
                headers: task.headers,
                payload: task.payload,
            });
            if let Record::Put(put) = &record {
                record::check_put(put).map_err(StoreError::Invalid)?;
            }
            push(&mut batch, &mut pending, uid, key, record);
        }
        self.commit(state, batch, pending, false)?;
        Ok(outcomes)
    }

    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        let (seq, key) = split_id(id);
        let task = if q.entry(seq, key, stats)?.is_some() {
            q.view(seq, key)?
        } else {
            None
        };
        state.trim_far(Some((uid, key)), &self.core.options);
        Ok(task)
    }

    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        self.preload(queue, now_ms)?;
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let found = live_task_with_key(q, stats, key)?;
        state.trim_far(None, &self.core.options);
        Ok(found)
    }

    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change_state(queue, id, now_ms, TaskState::Scheduled, |seq| {
            Record::Cancel { seq }
        })
    }

    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        self.change_state(queue, id, now_ms, TaskState::Scheduled, |seq| {
            Record::Reschedule { seq, due_at_ms }
        })
    }

    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        self.preload(queue, now_ms)?;
        let mut state = self.lock_state()?;
        let mut next_lease = state.next_lease;
        let (q, _) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        let lease_until_ms = now_ms.saturating_add(visibility_ms);
        let room = max.min(q.index.ready.iter().map(|slot| slot.len()).sum());
        let mut batch = WalBatch::with_capacity(room * LEASE_RECORD_BYTES_HINT);
        let mut pending = Vec::with_capacity(room);
        let mut result = ClaimBatch::default();
        // (seq, key, lease id, due, attempts, put offset, put length): all a leased task's
        // view needs besides its put record, so the entry is looked up once here.
        let mut leased = Vec::with_capacity(room);
        // Due tasks, high priority first, each in due order. They are only read here: their
        // records take them out of the ready index when applied at commit.
        let due = q.index.ready.iter().flat_map(|slot| {
            slot.iter()
                .take_while(move |(due, _, _)| *due <= now_ms)
                .copied()
        });
        for (due, seq, key) in due {
            if leased.len() == max {
                break;
            }
            let Some(entry) = q.loaded_entry(seq, key) else {
                debug_assert!(false, "ready entry missing");
                continue;
            };
            let late_ms = now_ms - due;
            let id = task_id(seq, key);
            let record = match entry.late_policy {
                LatePolicy::Skip { after_ms } if late_ms > after_ms => {
                    result.late_skipped.push(id);
                    Record::Done { seq }
                }
                LatePolicy::Dead { after_ms } if late_ms > after_ms => {
                    result.late_dead.push(id);
                    Record::Dead {
                        seq,
                        reason: format!("late by {late_ms} ms (late policy allows {after_ms} ms)"),
                    }
                }
                _ => {
                    let lease_id = next_lease;
                    next_lease += 1;
                    let attempts = entry.attempts.saturating_add(1);
                    leased.push((
                        seq,
                        key,
                        lease_id,
                        due,
                        attempts,
                        entry.put_offset,
                        entry.put_len,
                    ));
                    Record::Lease {
                        seq,
                        lease_id,
                        until_ms: lease_until_ms,
                        attempts,
                    }
                }
            };
            push(&mut batch, &mut pending, uid, key, record);
        }
        state.next_lease = next_lease;
        if pending.is_empty() {
            return Ok(result);
        }
        let ticket = match state.commit(batch, &pending, &self.core.options) {
            Ok(ticket) => ticket,
            Err(error) => {
                state.poison(&error);
                return Err(error);
            }
        };
        let (q, _) = state.queue(queue)?;
        let spots: Vec<(u64, u64, u32)> = leased
            .iter()
            .map(|&(_, key, _, _, _, offset, len)| (key, offset, len))
            .collect();
        let puts = q.read_puts(&spots)?;
        result.leased.reserve(puts.len());
        for (put, (seq, key, lease_id, due, attempts, _, _)) in puts.into_iter().zip(leased) {
            let facts = TaskFacts {
                due,
                state: TaskState::Leased,
                attempts,
                until: Some(lease_until_ms),
                dead_reason: None,
            };
            result.leased.push(LeasedTask {
                task: q.task(seq, key, put, facts)?,
                lease_id: LeaseId(lease_id),
                lease_until_ms,
            });
        }
        let checkpoint_due = self.checkpoint_due(&state);
        drop(state);
        self.finish(ticket, true, checkpoint_due)?;
        Ok(result)
    }

    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.change_lease(queue, id, lease, now_ms, |seq| Record::Done { seq })
    }

    /// One lock, one WAL frame holding every Done record: replay applies the call's acks
    /// all together or (frame lost or cut) not at all.
    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        if acks.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = WalBatch::with_capacity(acks.len() * LEASE_RECORD_BYTES_HINT);
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        let mut pending = Vec::with_capacity(acks.len());
        let mut outcomes = Vec::with_capacity(acks.len());
        // Records reach memory only at commit, so a task acked earlier in this call still
        // looks leased: remember it, and answer a repeat as a sequential ack would (the
        // task is done, so its lease is no longer in force).
        let mut acked: FxHashSet<(u64, u64)> =
            FxHashSet::with_capacity_and_hasher(acks.len(), Default::default());
        for &(id, lease) in acks {
            let (key, seq) = match lease_in_force(q, stats, id, lease)? {
                Ok(found) => found,
                Err(outcome) => {
                    outcomes.push(outcome);
                    continue;
                }
            };
            if !acked.insert((seq, key)) {
                outcomes.push(LeaseOutcome::LeaseExpired);
                continue;
            }
            push(&mut batch, &mut pending, uid, key, Record::Done { seq });
            outcomes.push(LeaseOutcome::Ok);
        }
        self.commit(state, batch, pending, true)?;
        Ok(outcomes)
    }

    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.change_lease(queue, id, lease, now_ms, |seq| Record::Nack {
            seq,
            due_at_ms: retry_at_ms,
        })
    }

    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.change_lease(queue, id, lease, now_ms, |seq| Record::Extend {
            seq,
            lease_id: lease.0,
            until_ms: lease_until_ms,
        })
    }

    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.change_lease(queue, id, lease, now_ms, |seq| Record::Dead {
            seq,
            reason: record::cut_reason(reason).to_owned(),
        })
    }

    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue(queue)?;
        let with_dead: Vec<u64> = q
            .buckets
            .iter()
            .filter(|(_, b)| b.entries.is_none() && b.meta.dead > 0)
            .map(|(k, _)| *k)
            .collect();
        for key in with_dead {
            q.load(key, stats)?;
        }
        let mut dead: Vec<(TaskId, u64, u64)> = Vec::new();
        for (key, bucket) in &q.buckets {
            if let Some(entries) = &bucket.entries {
                for (seq, entry) in entries {
                    let id = task_id(*seq, *key);
                    if entry.state == TaskState::Dead && after.is_none_or(|a| id > a) {
                        dead.push((id, *seq, *key));
                    }
                }
            }
        }
        dead.sort_unstable();
        dead.truncate(limit);
        let wanted: Vec<(u64, u64)> = dead.iter().map(|&(_, seq, key)| (seq, key)).collect();
        Ok(q.view_many(&wanted)?.into_iter().flatten().collect())
    }

    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        // With `now`, like cancel and reschedule: a lease that has run out is ended first, so
        // the state reported for a task that is not dead is the one `get` would show.
        self.change_state(queue, id, now_ms, TaskState::Dead, |seq| Record::Redrive {
            seq,
            due_at_ms: now_ms,
        })
    }

    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        self.preload(queue, now_ms)?;
        let mut state = self.lock_state()?;
        let (q, _) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let mut counts = QueueCounts::default();
        for set in &q.index.ready {
            counts.pending += set.len() as u64;
            counts.due += set.range(..=(now_ms, u64::MAX, u64::MAX)).count() as u64;
        }
        counts.in_flight = q.index.leases.len() as u64;
        counts.dead = q.index.dead_loaded;
        for bucket in q.buckets.values().filter(|b| b.entries.is_none()) {
            // Unloaded buckets hold nothing due and no expired lease (see queue.rs).
            counts.pending += bucket.meta.scheduled;
            counts.in_flight += bucket.meta.leased;
            counts.dead += bucket.meta.dead;
        }
        Ok(counts)
    }

    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        if step_ms == 0 {
            return Err(StoreError::Invalid(
                "forecast step must be at least 1 ms".into(),
            ));
        }
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue(queue)?;
        let mut bins = vec![0u64; steps];
        let end = from_ms.saturating_add(step_ms.saturating_mul(steps as u64));
        let bin_of = |due: UnixMs| -> Option<usize> {
            if due < from_ms {
                return None;
            }
            let bin = (due - from_ms) / step_ms;
            (bin < steps as u64).then_some(bin as usize)
        };
        // Unloaded buckets: whole counts when all their tasks fall in one bin; otherwise the
        // bucket is read (and unloaded again) to count exactly.
        let unloaded: Vec<(u64, BucketMeta)> = q
            .buckets
            .iter()
            .filter(|(_, b)| b.entries.is_none() && b.meta.scheduled > 0)
            .map(|(k, b)| (*k, b.meta))
            .collect();
        let mut scanned = Vec::new();
        for (key, meta) in unloaded {
            if meta.max_due_ms < from_ms || meta.min_due_ms >= end {
                continue;
            }
            match (bin_of(meta.min_due_ms), bin_of(meta.max_due_ms)) {
                (Some(a), Some(b)) if a == b => bins[a] += meta.scheduled,
                _ => {
                    q.load(key, stats)?;
                    scanned.push(key);
                }
            }
        }
        for set in &q.index.ready {
            for (due, _, _) in set.range((from_ms, 0, 0)..) {
                if let Some(bin) = bin_of(*due) {
                    bins[bin] += 1;
                } else {
                    break;
                }
            }
        }
        for key in scanned {
            q.unload(key);
        }
        Ok(bins)
    }

    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        let mut state = self.lock_state()?;
        let (q, _) = state.queue(queue)?;
        let candidates = [
            q.index.ready[0].first().map(|(due, _, _)| *due),
            q.index.ready[1].first().map(|(due, _, _)| *due),
            q.index.leases.first().map(|(until, _, _)| *until),
            q.wake.first().map(|(wake, _)| *wake),
        ];
        Ok(candidates.into_iter().flatten().min())
    }

    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()> {
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        meta.entries
            .insert((namespace.to_owned(), key.to_owned()), value);
        meta.write(&self.core.dir.join(META_FILE))?;
        state.meta = meta;
        Ok(())
    }

    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        let state = self.lock_state()?;
        Ok(state
            .meta
            .entries
            .get(&(namespace.to_owned(), key.to_owned()))
            .cloned())
    }

    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        let existed = meta
            .entries
            .remove(&(namespace.to_owned(), key.to_owned()))
            .is_some();
        if existed {
            meta.write(&self.core.dir.join(META_FILE))?;
            state.meta = meta;
        }
        Ok(existed)
    }

    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        let state = self.lock_state()?;
        Ok(state
            .meta
            .entries
            .range((namespace.to_owned(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|((_, key), value)| (key.clone(), value.clone()))
            .collect())
    }

    fn flush(&self) -> Result<()> {
        self.core.checkpoint()
    }
}
