//! The embedded timeline storage engine.
//!
//! Files under the data directory (the format is described in `docs/storage-format.md`):
//! - `wal/<n>.wal`: the write-ahead log. Each store call appends one CRC frame holding all of
//!   its records; concurrent callers share one fsync (group commit).
//! - `q-<uid>/b-<bucket>.seg`: one file per due-time bucket of a queue, the same records
//!   appended without fsync; they are fsync'd at checkpoints, after which the WAL is dropped.
//! - `checkpoint`: per-bucket counts and file lengths, counters, live idempotency keys and the
//!   `*_meta` entries, so reopening reads neither far buckets nor the whole history.
//! - `meta`: queues, rewritten whole on each (rare) queue change. Metadata changes are WAL
//!   records (one per call, see `meta.rs`), compacted into the checkpoint.
//! - `subs/<id>.run`: immutable sorted runs of subscriber sets (both indexes), written and
//!   merged by checkpoints, which list them; changes are WAL records until then (`subs/`).
//!
//! Concurrency: one mutex guards the in-memory state of tasks and queues; a second serialises
//! WAL writes and a third fsyncs; a fourth guards the metadata entries (see `meta.rs`). A
//! caller applies its change in memory and queues its WAL frame under the state lock, then
//! makes sure the WAL is written to the OS past its frame (whoever takes the write lock writes
//! every queued frame with one `write`), and, if the call must be durable, that it is fsync'd
//! past it (whoever takes the sync lock fsyncs everything written so far). Lock order is
//! metadata, sync, write, state, never the reverse. Another caller may observe a change before
//! it is durable (a `get` is not delayed), but any change that builds on it (a claim of a
//! just-put task) has a later WAL frame, so after a crash either both or only the first
//! survive.
//!
//! Delivery state (leases, acks, nacks, extensions, dead letters) does not wait for fsync
//! unless [`EngineOptions::sync_delivery`] is set: its frame is written to the OS before the
//! call returns (so it survives a crash of the process), and it becomes durable with the next
//! fsync, which covers every earlier frame, or by the background flusher within
//! [`EngineOptions::delivery_sync_delay`]. Losing such a record in a machine crash only
//! delivers the task again, which at-least-once delivery allows (see
//! `docs/storage-format.md`, "Durability of delivery state").
//!
//! The module, by job: this file holds the options, the shared state (`State`, `Core`) and how
//! a call's records reach memory and the WAL queue (`State::commit`); `wal.rs` the WAL, group
//! commit and the background flusher; `prefill.rs` the zeros kept ahead of the WAL's end so
//! that small commits' fsyncs write no file metadata; `checkpoint.rs` checkpoints and their thread;
//! `recovery.rs` opening a directory and replaying the WAL (`owner.rs` refuses a directory
//! that is not belfry's before anything is written to it); `calls.rs` the paths store calls
//! share (commit and wait, preload, finding a task or its lease); `meta.rs` small metadata
//! under its own lock; `subs/` subscriber sets (a small LSM tree) under theirs; `points.rs`
//! finds one task of an unloaded bucket (get, cancel, reschedule) without loading it; `store_impl.rs` the `Store` trait. `queue.rs`, `bucket.rs`, `keys.rs`, `record.rs` and `persist.rs` are the in-memory
//! index, bucket keys, the idempotency-key hash, the record format and the whole-file
//! documents.

pub mod bucket;
mod calls;
mod checkpoint;
mod keys;
mod listing;
mod lsm;
mod meta;
mod owner;
pub mod persist;
pub mod points;
mod prefill;
mod queue;
pub mod record;
mod recovery;
mod space;
mod store_impl;
mod subs;
mod sweep;
mod wal;
mod wal_tail;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{QueueName, UnixMs};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use self::bucket::{bucket_range, task_id};
use self::checkpoint::Checkpointer;
use self::keys::runs::KeyRuns;
use self::keys::KeyHasher;
use self::persist::{BucketMeta, MetaEntries, MetaFile};
pub use self::queue::EngineStats;
use self::queue::{Bucket, Queue};
use self::record::{Record, WalBatch, WalTarget};
use self::space::FreeSpace;
use self::wal::{Flusher, Wal};
use crate::store::{Result, StoreError};

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
    /// Free space kept on the data directory's filesystem for delivery state and checkpoints:
    /// changes that grow the data (put, reschedule, redrive, queue and metadata puts,
    /// subscribes) are refused with `StoreError::DiskFull` once less than this is free, before
    /// they touch anything; claims, nacks and extensions once less than a quarter of it is,
    /// acks and cancels below an eighth (`space.rs`). On a filesystem smaller than eight times
    /// this, the reserve is an eighth of the filesystem. `0` turns the reserve off (a full
    /// disk then stops the engine).
    pub free_space_reserve_bytes: u64,
    /// The subscription memtable is written to a run file (by a checkpoint it asks for) once
    /// its entries take about this many bytes of memory; writers wait for that checkpoint
    /// once it holds twice this. It bounds the memory subscriptions take, whatever their
    /// number.
    pub subs_memtable_bytes: usize,
    /// Checkpoints merge the newest subscription runs once at least this many of them
    /// together outweigh each older run they take in (size-tiered: see `subs/tree.rs`).
    pub subs_compaction_min_runs: usize,
    /// Likewise for the idempotency-key runs (`keys/runs.rs`).
    pub key_compaction_min_runs: usize,
    /// Once the subscription tree has seen no change for this long, the checkpoint thread
    /// merges all its runs into one, so that a user's sets (the feed's read) are one block
    /// read instead of one per run. `None`: never (size-tiered merges only).
    pub subs_settle_after: Option<Duration>,
    /// Under `FsyncPolicy::Always`, keep durable zeros just beyond the WAL's end while commits
    /// are small, so that their fsyncs write only data (`prefill.rs`). On by default.
    pub wal_prefill: bool,
    /// The first task sequence number of a new data directory. `None` (the default) draws it
    /// at random, so that task ids do not repeat across stores: a fresh directory counting
    /// from 1 again would give its tasks the ids of another's, and whatever deduplicates on
    /// ids (JetStream's `Nats-Msg-Id`, a receiver's processed-id table) would drop them as
    /// repeats. Tests that need reproducible ids set it.
    pub first_seq: Option<u64>,
}

/// A random first sequence number: below 2^61, so that counting up from it never wraps.
pub(crate) fn random_first_seq() -> u64 {
    (rand::random::<u64>() >> 3).max(1)
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
/// Default free-space reserve: room for a checkpoint's worth of WAL written by deliveries
/// alone (acks and leases go on when puts are refused) and its copy into bucket files, so the
/// checkpoint that frees space by deleting old WAL and finished buckets can still run.
pub const FREE_SPACE_RESERVE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
const _: () = assert!(FREE_SPACE_RESERVE_BYTES_DEFAULT >= 2 * CHECKPOINT_WAL_BYTES_DEFAULT);
/// Default subscription memtable bound: about 85,000 subscriptions of numeric ids (both
/// indexes, about 50 bytes each in memory), written out in a few tens of milliseconds. With
/// it, 10M subscriptions grew RSS by 49 MiB (62 MiB at peak, merges included).
pub const SUBS_MEMTABLE_BYTES_DEFAULT: usize = 4 * 1024 * 1024;
/// Default number of subscription runs merged at once.
pub const SUBS_COMPACTION_MIN_RUNS_DEFAULT: usize = 4;
/// Default quiet time before the subscription runs are merged into one: long enough that a
/// bulk load in progress is not merged run by run, short enough that reads after it soon
/// look at one run.
pub const SUBS_SETTLE_AFTER_DEFAULT: Duration = Duration::from_secs(10);
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
            free_space_reserve_bytes: FREE_SPACE_RESERVE_BYTES_DEFAULT,
            subs_memtable_bytes: SUBS_MEMTABLE_BYTES_DEFAULT,
            subs_compaction_min_runs: SUBS_COMPACTION_MIN_RUNS_DEFAULT,
            key_compaction_min_runs: SUBS_COMPACTION_MIN_RUNS_DEFAULT,
            subs_settle_after: Some(SUBS_SETTLE_AFTER_DEFAULT),
            wal_prefill: true,
            first_seq: None,
        }
    }
}

const META_FILE: &str = "meta";
const CHECKPOINT_FILE: &str = "checkpoint";
const WAL_DIR: &str = "wal";
fn queue_dir(dir: &Path, uid: u64) -> PathBuf {
    dir.join(format!("q-{uid:016x}"))
}

fn parse_queue_dir(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("q-")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// An I/O error with no one path to name (the WAL writer's open file, say).
fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io {
        context,
        path: None,
        source,
    }
}

/// An I/O error naming the file or directory at `path` (copied only if there is an error).
fn io_at<'a>(
    context: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::io_at(context, path, source)
}

#[derive(Debug)]
struct State {
    meta: MetaFile,
    /// The idempotency-key hash (its secret is kept in the checkpoint).
    key_hasher: KeyHasher,
    /// The idempotency keys on disk, of all queues (each queue's memtable is in its index).
    key_runs: KeyRuns,
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
    /// Set with `poisoned`, so that calls that do not take the state lock (metadata reads)
    /// can see it. Shared with `Core::poisoned`.
    poisoned_flag: Arc<AtomicBool>,
    stats: EngineStats,
    /// Checkpoints run so far (they are the only deleters of bucket files).
    checkpoints: u64,
    /// Until a call passes `now`: the earliest due time submitted, used in its place.
    due_reference_ms: Option<UnixMs>,
    /// What `trim_far` needs to look again: whether a put has gone into a loaded far bucket
    /// since it last looked, and the bucket-load count it last looked at. Far buckets grow
    /// loaded only by a load or such a put, so a call with neither (a claim, an ack) skips
    /// the scan, which visits every loaded bucket of every queue.
    far_grew: bool,
    far_seen_loads: u64,
}

/// The embedded engine. Cheap to share behind an `Arc`; every method may be called from many
/// threads at once.
#[derive(Debug)]
pub struct Engine {
    core: Arc<Core>,
    /// Stopped (joined) when the engine drops, before the final fsync in `Drop`.
    flusher: Option<Flusher>,
    /// Stopped first when the engine drops: it writes to the WAL file.
    prefiller: Option<prefill::Prefiller>,
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
    /// Small metadata (`*_meta`), under its own lock so that metadata calls never hold the
    /// state lock longer than it takes to queue their WAL frame (see `meta.rs`). Lock order:
    /// meta before state (and before the WAL locks, in a checkpoint).
    meta: Mutex<MetaEntries>,
    /// Subscriber sets (see `subs/mod.rs`). Lock order: meta, subs, then the WAL locks and
    /// state.
    subs: Mutex<subs::Subs>,
    /// Whether the engine stopped after a fatal error (`State::poisoned` says why).
    poisoned: Arc<AtomicBool>,
    checkpointing: Mutex<()>,
    /// Held while subscription runs merge (`subs/tree.rs`), which happens after a
    /// checkpoint, not inside it: writers waiting for a checkpoint never wait for a merge.
    compacting: Mutex<()>,
    /// Tests hold it to keep merges waiting just before they write.
    #[cfg(test)]
    merge_gate: Mutex<()>,
    /// The free-space reserve (`EngineOptions::free_space_reserve_bytes`).
    space: FreeSpace,
}

// The server shares one engine across threads.
const _: fn() = || {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<Engine>();
};

/// One record of a call: where it goes and its bytes' place in the WAL batch.
struct Pending {
    uid: u64,
    key: u64,
    record: Record,
    range: std::ops::Range<usize>,
    /// For a change found through an unloaded bucket's point index: the task as it was, so
    /// that the change applies without loading the bucket.
    prior: Option<points::Prior>,
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
        let (queue, stats, _) = self.queue_with_keys(name)?;
        Ok((queue, stats))
    }

    /// [`State::queue`], and the key runs (to look a key up).
    fn queue_with_keys(
        &mut self,
        name: &QueueName,
    ) -> Result<(&mut Queue, &mut EngineStats, &KeyRuns)> {
        let uid = self.uid(name)?;
        let State {
            queues,
            stats,
            key_runs,
            ..
        } = self;
        let queue = queues
            .get_mut(&uid)
            .ok_or_else(|| StoreError::QueueNotFound(name.clone()))?;
        Ok((queue, stats, key_runs))
    }

    /// Appends a call's records: to the bucket buffers and the WAL queue, then applies them
    /// to memory. Returns the WAL position the caller must wait for. A failure (a bucket
    /// buffer that could not be written) poisons the engine: memory may hold part of the call.
    /// `pending` is borrowed so the caller drops it (payloads, strings) after the lock.
    fn commit(
        &mut self,
        batch: WalBatch,
        pending: &[Pending],
        options: &EngineOptions,
    ) -> Result<u64> {
        self.append_and_apply(batch, pending, options)
            .map_err(|error| self.poison(&error))
    }

    fn append_and_apply(
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
                if matches!(p.record, Record::Put(_)) {
                    let horizon = last_now.saturating_add(options.unload_distance_ms);
                    let far = bucket_range(p.key).is_none_or(|(start, _)| start > horizon);
                    self.far_grew |= far;
                }
                queue.apply(p.key, &p.record, offset, bytes.len() as u32);
            } else if let Record::Put(put) = &p.record {
                bucket.points.note_put(put.seq, offset);
                queue.update_unloaded_meta(p.key, |meta| meta.add_scheduled(put.due_at_ms));
                if let Some(k) = &put.idempotency_key {
                    let hash = queue.hasher.hash(k);
                    queue.index.keys.insert(hash, task_id(put.seq, p.key));
                }
            } else if let Some(prior) = p.prior {
                queue.apply_unloaded(p.key, &p.record, prior);
            } else {
                debug_assert!(false, "state change on an unloaded bucket");
            }
        }
        if self.buffered_bytes >= options.buffers_total_bytes {
            self.flush_buffers()?;
        }
        Ok(self.enqueue(&frame))
    }

    /// Queues a WAL frame for the next write; returns the WAL position the caller must wait
    /// for. Frames reach the WAL in the order they are queued.
    fn enqueue(&mut self, frame: &[u8]) -> u64 {
        // Recovery reads a zero frame header as the end of a file's log (`record::is_log_end`).
        debug_assert!(
            frame.len() > record::FRAME_HEADER_BYTES,
            "an empty WAL frame"
        );
        self.wal_pending.extend_from_slice(frame);
        self.wal_appended += frame.len() as u64;
        self.wal_since_checkpoint += frame.len() as u64;
        self.wal_appended
    }

    /// Unloads far buckets loaded for lookups once they hold more than the configured number
    /// of tasks, except `keep` (the bucket the current call used). A far bucket that holds
    /// something due or expiring soon (a task rescheduled near) stays.
    fn trim_far(&mut self, keep: Option<(u64, u64)>, options: &EngineOptions) {
        if !self.far_grew && self.far_seen_loads == self.stats.buckets_loaded {
            return;
        }
        // Whatever this pass leaves loaded (`keep`, a far bucket due soon) is at most one
        // bucket beyond the bound until the next load or far put, which looks again.
        self.far_grew = false;
        self.far_seen_loads = self.stats.buckets_loaded;
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
                bucket.release_buffer();
            }
        }
        Ok(())
    }

    /// Stops the engine after `error` (logged once, with what to do about it). Returns the
    /// error the failing call reports: `Poisoned`, with the reason every later call reports
    /// too, so its caller learns at once that the engine stopped (and why).
    fn poison(&mut self, error: &StoreError) -> StoreError {
        let advice = poison_advice(error);
        if self.poisoned.is_none() {
            tracing::error!(%error, advice, "storage engine stopped after a fatal error: it acknowledges nothing further");
        }
        let reason = self
            .poisoned
            .get_or_insert_with(|| format!("{error}. {advice}"))
            .clone();
        self.poisoned_flag.store(true, Ordering::Release);
        StoreError::Poisoned(reason)
    }
}

/// What an operator should do about the error that stopped the engine: logged with it, and
/// part of the reason every later call (and `/readyz`) reports.
pub(super) fn poison_advice(error: &StoreError) -> &'static str {
    match error {
        StoreError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
            "The disk filled up past the free-space reserve during a write (another program \
             filled it, or storage.free_space_reserve is too small for storage.\
             checkpoint_wal_bytes): free disk space, then restart belfry; belfry recovers \
             every acknowledged change from its write-ahead log at the next start (it needs \
             room to copy that log into bucket files: it says how much if there is not)"
        }
        StoreError::Io { context, .. } if context.contains("fsync") => {
            "An fsync failed: the kernel may have dropped written data it could not store, so \
             the engine stopped rather than acknowledge anything further (a later fsync could \
             wrongly succeed). Check the disk and the kernel log (dmesg), then restart belfry; \
             belfry recovers every acknowledged change from its write-ahead log at the next \
             start"
        }
        // A restart cannot help with these two, so the advice does not offer one.
        StoreError::Io { source, .. } if is_permission(source) => {
            "belfry may not write a file or directory of its data directory (named above): \
             let the user belfry runs as read and write everything in the data directory, \
             on a filesystem mounted read-write, then start belfry again; belfry recovers \
             every acknowledged change from its write-ahead log"
        }
        StoreError::Corrupt { .. } => {
            "A file of the data directory is damaged (named above), and a restart does not \
             repair it: restore the data directory from a backup (docs/operations.md, \"A data \
             directory that will not open\")"
        }
        _ => {
            "Restart belfry; belfry recovers every acknowledged change from its write-ahead \
             log at the next start. If this repeats, the error above names the file"
        }
    }
}

/// Whether an I/O error is the system refusing access (file modes, a read-only mount).
fn is_permission(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
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
        prior: None,
    });
}

impl Engine {
    /// Opens (or creates) an engine in `dir`, recovering after a crash (`recovery.rs`): the
    /// WAL written since the last checkpoint is replayed (a torn tail is cut off), far buckets
    /// are not read. Recovery copies that WAL into bucket files and writes a checkpoint before
    /// it deletes the WAL; if the disk has no room for that, the error says how much it needs
    /// ([`StoreError::NoSpaceToOpen`]) rather than only that a write failed.
    pub fn open(dir: impl AsRef<Path>, options: EngineOptions) -> Result<Engine> {
        let dir = dir.as_ref();
        let free_before = space::free_bytes(dir);
        Engine::open_recovering(dir, options)
            .map_err(|error| space::explain_open_failure(dir, free_before, error))
    }

    /// Closes the engine as a crash of the process would leave it: no checkpoint, no final
    /// fsync of delivery state, write buffers dropped. The directory lock is released, so the
    /// same process can reopen the directory and see what a restart after `kill -9` sees.
    /// For tests; `std::mem::forget` would keep the lock (and the flusher thread) alive.
    pub fn abandon(mut self) {
        self.abandoned = true;
    }

    /// Whether the engine takes writes: poisoned (and why), short of free space, or healthy.
    pub fn health(&self) -> crate::store::StoreHealth {
        use crate::store::StoreHealth;
        let stopped = self.core.poisoned.load(Ordering::Acquire)
            || self.core.wal.failed.load(Ordering::Acquire);
        if stopped {
            if let Err(error) = self.lock_state() {
                return StoreHealth::Poisoned(match error {
                    StoreError::Poisoned(reason) => reason,
                    other => other.to_string(),
                });
            }
        }
        match self.core.space.low() {
            Some((free_bytes, reserve_bytes, refused_bytes)) => StoreHealth::LowDiskSpace {
                free_bytes,
                reserve_bytes,
                refused_bytes,
            },
            None => StoreHealth::Healthy,
        }
    }

    /// Test fault point: the next fsync of the WAL fails with `EIO`, as a failing disk's
    /// would. The engine must then stop (poison) and acknowledge nothing further.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn fail_next_fsync(&self) {
        self.core.wal.fail_next_sync.store(true, Ordering::Release);
    }

    /// Work counters: how many buckets and records were read so far.
    pub fn stats(&self) -> EngineStats {
        let state = self.core.state.lock();
        let mut stats = state.stats;
        stats.wal_writes = self.core.wal.writes.load(Ordering::Relaxed);
        stats.wal_syncs = self.core.wal.syncs.load(Ordering::Relaxed);
        stats.wal_bytes = self.core.wal.written.load(Ordering::Acquire);
        stats.checkpoints = state.checkpoints;
        stats.buckets_in_memory = 0;
        stats.buckets_total = 0;
        stats.key_runs = state.key_runs.runs.len() as u64;
        stats.key_run_entries = state.key_runs.entries();
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
}

impl Drop for Engine {
    /// A clean close makes delivery state written without fsync durable (best effort: an
    /// error here only means those tasks may be delivered again after a machine crash).
    fn drop(&mut self) {
        drop(self.prefiller.take());
        drop(self.checkpointer.take());
        drop(self.flusher.take());
        if self.abandoned
            || self.core.wal.failed.load(Ordering::Acquire)
            || self.core.poisoned.load(Ordering::Acquire)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The advice logged when the engine stops (at open too) fits the error: a permission
    /// problem or a damaged file is not fixed by a restart, so their advice offers none, and an
    /// I/O error names its file.
    #[test]
    fn the_advice_fits_the_error_and_io_errors_name_their_file() {
        let path = Path::new("/data/checkpoint.tmp");
        for errno in [libc::EACCES, libc::EROFS] {
            let error = StoreError::io_at(
                "create a temporary file",
                path,
                std::io::Error::from_raw_os_error(errno),
            );
            assert!(
                error.to_string().starts_with(
                    "I/O error while trying to create a temporary file (/data/checkpoint.tmp): "
                ),
                "{error}"
            );
            let advice = poison_advice(&error);
            assert!(!advice.contains("Restart belfry"), "{advice}");
            assert!(advice.contains("read and write"), "{advice}");
        }
        let corrupt = StoreError::Corrupt {
            location: "/data/keys/0000000000000009.run at offset 4096".into(),
            detail: "block".into(),
        };
        assert!(poison_advice(&corrupt).contains("backup"));
        let other = StoreError::io_at("read a WAL file", path, std::io::Error::other("EIO"));
        assert!(poison_advice(&other).contains("Restart belfry"));
    }
}
