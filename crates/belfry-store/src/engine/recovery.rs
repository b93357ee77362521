//! Opening a data directory: take its lock, read `meta` and `checkpoint`, cut bucket files
//! back to their checkpointed lengths and replay the WAL written since (cutting a torn tail).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use belfry_core::TaskState;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::bucket::{self, task_id};
use super::checkpoint::Checkpointer;
use super::keys::runs::KeyRuns;
use super::keys::KeyHasher;
use super::meta;
use super::owner;
use super::persist::{BucketMeta, Checkpoint, MetaEntries, MetaFile};
use super::points::PointIndex;
use super::prefill::Prefiller;
use super::queue::{Bucket, EngineStats, Queue};
use super::record::{self, Record, WalTarget};
use super::space::FreeSpace;
use super::subs::{self, Subs};
use super::sweep;
use super::wal::{create_wal, old_wal_files, wal_path, Flusher, Wal};
use super::wal_tail;
use super::{
    io_at, parse_queue_dir, queue_dir, Core, Engine, EngineOptions, FsyncPolicy, State,
    CHECKPOINT_FILE, META_FILE, WAL_DIR,
};
use crate::store::{Result, StoreError};

/// Held locked (`flock`) by the engine that has the directory open.
pub(super) const LOCK_FILE: &str = "LOCK";
/// How long `open` keeps trying to take a held directory lock before it reports `InUse`. A
/// lock can be held briefly by a process that is not using the directory: a child forked by
/// any thread of the owner's process holds a copy of its descriptors (and so the lock) until
/// it execs, even if the owner closes the engine meanwhile. Retrying for a moment tells that
/// apart from a live engine.
pub(super) const LOCK_WAIT_MAX: Duration = Duration::from_secs(1);
/// Pause between attempts to take the directory lock.
pub(super) const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(10);

impl Engine {
    /// Opens (or creates) an engine in `dir`, recovering after a crash: the WAL written since
    /// the last checkpoint is replayed (a torn tail is cut off), far buckets are not read.
    /// `Engine::open` explains a failure for want of disk space.
    pub(super) fn open_recovering(dir: &Path, options: EngineOptions) -> Result<Engine> {
        let dir = dir.to_path_buf();
        owner::check(&dir)?;
        fs::create_dir_all(&dir).map_err(io_at("create the data directory", &dir))?;
        owner::mark(&dir)?;
        let wal_dir = dir.join(WAL_DIR);
        fs::create_dir_all(&wal_dir).map_err(io_at("create the WAL directory", &wal_dir))?;
        let lock = lock_dir(&dir)?;
        refuse_partial(&dir)?;
        let (meta, legacy_entries) = MetaFile::read(&dir.join(META_FILE))?;
        let found = Checkpoint::read(&dir.join(CHECKPOINT_FILE))?;
        // No checkpoint and (`refuse_partial`) no other engine file: a new directory.
        let new_dir = found.is_none();
        let mut checkpoint = found.unwrap_or_default();
        // A format-3 checkpoint holds the entries; before that, the meta file did.
        let mut entries = checkpoint
            .meta_entries
            .take()
            .or(legacy_entries)
            .unwrap_or_default();
        let subs_persisted = checkpoint.subs.take().unwrap_or_default();
        let runs = subs::open_runs(&dir, &subs_persisted)?;
        let mut subs = Subs::new(dir.join(subs::SUBS_DIR), runs, &subs_persisted);
        let poisoned = Arc::new(AtomicBool::new(false));
        let key_runs = KeyRuns::open(&dir, &checkpoint.key_runs.take().unwrap_or_default())?;
        let mut state = State::from_checkpoint(meta, &checkpoint, key_runs, Arc::clone(&poisoned));
        if new_dir {
            state.next_seq = options.first_seq.unwrap_or_else(super::random_first_seq);
        }
        restore_queues(&dir, &mut state)?;
        restore_buckets(&checkpoint, &mut state)?;
        restore_points(std::mem::take(&mut checkpoint.points), &mut state);
        restore_keys(&checkpoint, &mut state);
        let last_wal = replay(
            &dir,
            checkpoint.wal_start,
            &mut state,
            &mut entries,
            &mut subs,
            &options,
        )?;
        let number = last_wal.max(checkpoint.wal_start) + 1;
        let wal = Arc::new(Wal::new(create_wal(&dir, number)?, number));
        let flush_period = match options.fsync {
            FsyncPolicy::Interval(every) => Some(every),
            FsyncPolicy::Always if !options.sync_delivery => Some(options.delivery_sync_delay),
            FsyncPolicy::Always | FsyncPolicy::Never => None,
        };
        let flusher = flush_period.map(|period| Flusher::start(Arc::clone(&wal), period));
        let background = options.background_checkpoints;
        let space = FreeSpace::new(&dir, options.free_space_reserve_bytes);
        let core = Arc::new(Core {
            dir,
            options,
            wal,
            state: Mutex::new(state),
            meta: Mutex::new(entries),
            subs: Mutex::new(subs),
            poisoned,
            checkpointing: Mutex::new(()),
            compacting: Mutex::new(()),
            #[cfg(test)]
            merge_gate: Mutex::new(()),
            space,
        });
        core.checkpoint()?;
        let prefill = core.options.wal_prefill && matches!(core.options.fsync, FsyncPolicy::Always);
        let prefiller = prefill.then(|| Prefiller::start(Arc::clone(&core)));
        let checkpointer = if background {
            Checkpointer::start(Arc::clone(&core))
        } else {
            None
        };
        Ok(Engine {
            core,
            flusher,
            prefiller,
            checkpointer,
            _lock: lock,
            abandoned: false,
        })
    }
}

impl State {
    /// The state a reopen starts from, before any file is looked at: counters and the key
    /// hash from the checkpoint, queues from the meta file.
    fn from_checkpoint(
        meta: MetaFile,
        checkpoint: &Checkpoint,
        key_runs: KeyRuns,
        poisoned_flag: Arc<AtomicBool>,
    ) -> State {
        State {
            key_runs,
            queues: FxHashMap::default(),
            next_seq: checkpoint.next_seq.max(1),
            next_lease: checkpoint.next_lease.max(1),
            last_now_ms: checkpoint.last_now_ms,
            wal_pending: Vec::new(),
            wal_appended: 0,
            wal_since_checkpoint: 0,
            buffered_bytes: 0,
            poisoned: None,
            poisoned_flag,
            stats: EngineStats::default(),
            checkpoints: 0,
            due_reference_ms: None,
            far_grew: true,
            far_seen_loads: 0,
            meta,
            key_hasher: checkpoint
                .key_secret
                .map_or_else(KeyHasher::random, |(k0, k1)| KeyHasher { k0, k1 }),
        }
    }
}

/// Creates the directory of every queue the meta file lists and removes those of deleted
/// queues.
/// Refuses a directory that has held an engine but lost its `meta` or `checkpoint` file
/// (deleted by hand, a partial restore). Read as new, it would start empty and then remove
/// every queue's files and every run as not listed: every acknowledged task gone without a
/// word. `meta` is written once a queue is made, so it may be missing only while there is
/// no queue directory; the checkpoint is written by every open, so it may be missing only
/// from a directory with no other engine file (a first open cut before its checkpoint).
fn refuse_partial(dir: &Path) -> Result<()> {
    let (missing, found) = if !dir.join(CHECKPOINT_FILE).exists() {
        let found = if dir.join(META_FILE).exists() {
            Some("its meta file".to_owned())
        } else {
            engine_files(dir)?
        };
        (CHECKPOINT_FILE, found)
    } else if !dir.join(META_FILE).exists() {
        (META_FILE, queue_dir_in(dir)?)
    } else {
        return Ok(());
    };
    let Some(found) = found else {
        return Ok(());
    };
    Err(StoreError::Corrupt {
        location: dir.join(missing).display().to_string(),
        detail: format!(
            "missing, while the data directory holds {found}: restore the whole directory from \
             a backup (started without it, the engine would read it as empty and remove the rest)"
        ),
    })
}

fn list_dir(sub: &Path) -> Result<Vec<fs::DirEntry>> {
    match fs::read_dir(sub) {
        Ok(entries) => entries
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(io_at("list a directory", sub)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_at("list a directory", sub)(e)),
    }
}

/// A queue directory in `dir`, named as the error says it.
fn queue_dir_in(dir: &Path) -> Result<Option<String>> {
    for entry in list_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if parse_queue_dir(&name).is_some() {
            return Ok(Some(format!("the queue directory {name}")));
        }
    }
    Ok(None)
}

/// The first engine file found in `dir` besides `meta` and `checkpoint`: a queue directory, a
/// WAL file with records, a subscription or key run.
fn engine_files(dir: &Path) -> Result<Option<String>> {
    if let Some(found) = queue_dir_in(dir)? {
        return Ok(Some(found));
    }
    for entry in list_dir(&dir.join(WAL_DIR))? {
        if entry.metadata().is_ok_and(|m| m.len() > 0) {
            let name = entry.file_name().to_string_lossy().into_owned();
            return Ok(Some(format!("the WAL file {WAL_DIR}/{name}")));
        }
    }
    for sub in [subs::SUBS_DIR, super::keys::runs::KEYS_DIR] {
        if let Some(entry) = list_dir(&dir.join(sub))?.first() {
            let name = entry.file_name().to_string_lossy().into_owned();
            return Ok(Some(format!("the run {sub}/{name}")));
        }
    }
    Ok(None)
}

fn restore_queues(dir: &Path, state: &mut State) -> Result<()> {
    for (name, (uid, _)) in &state.meta.queues {
        let qdir = queue_dir(dir, *uid);
        fs::create_dir_all(&qdir).map_err(io_at("create a queue directory", &qdir))?;
        state
            .queues
            .insert(*uid, Queue::new(name.clone(), *uid, qdir, state.key_hasher));
    }
    for entry in fs::read_dir(dir).map_err(io_at("list the data directory", dir))? {
        let entry = entry.map_err(io_at("list the data directory", dir))?;
        let name = entry.file_name();
        let Some(uid) = name.to_str().and_then(parse_queue_dir) else {
            continue;
        };
        if state.queues.contains_key(&uid) {
            continue;
        }
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            sweep::remove_queue_dir(&path, |n| bucket::parse_file_name(n).is_some())?;
        } else {
            tracing::warn!(path = %path.display(), "leaving a file named like a queue directory");
        }
    }
    Ok(())
}

/// Buckets known to the checkpoint: cut anything written after it (the WAL replay writes it
/// again); bucket files it does not know were created after it: remove them (other names are
/// left alone, `sweep.rs`).
fn restore_buckets(checkpoint: &Checkpoint, state: &mut State) -> Result<()> {
    let mut known: HashMap<u64, HashSet<u64>> = HashMap::new();
    for cb in &checkpoint.buckets {
        let Some(queue) = state.queues.get_mut(&cb.queue_uid) else {
            continue;
        };
        let path = queue.bucket_path(cb.key);
        cut_to_checkpoint(&path, cb.file_len)?;
        known.entry(cb.queue_uid).or_default().insert(cb.key);
        queue.add_bucket(cb.key, Bucket::new(path, cb.file_len, cb.meta, false));
    }
    for queue in state.queues.values_mut() {
        let known = known.remove(&queue.uid).unwrap_or_default();
        sweep::sweep(
            &queue.dir,
            |name| bucket::parse_file_name(name).is_some(),
            |name| bucket::parse_file_name(name).is_some_and(|key| known.contains(&key)),
            "bucket files the checkpoint does not list (written after it: the WAL replay \
             writes them again)",
        )?;
    }
    Ok(())
}

/// Applies a replayed cancel or reschedule to an unloaded bucket through its point index, as
/// the call did: a storm of far cancels before a crash then costs no bucket loads at open.
/// `false` when the index cannot take it (the bucket is then loaded once replay ends).
fn replay_through_index(queue: &mut Queue, key: u64, record: &Record) -> Result<bool> {
    if !queue.can_point(key) {
        return Ok(false);
    }
    let Some(found) = queue.point(record.seq(), key)? else {
        return Ok(false);
    };
    let prior = queue.prior(&found);
    if prior.touch.state != TaskState::Scheduled || queue.holds_due_bound(key, prior.touch) {
        return Ok(false);
    }
    queue.apply_unloaded(key, record, prior);
    Ok(true)
}

/// The point indexes the checkpoint kept for its unloaded buckets (the others have none until
/// they are loaded).
fn restore_points(points: Vec<(u64, u64, PointIndex)>, state: &mut State) {
    for (uid, key, index) in points {
        let bucket = state
            .queues
            .get_mut(&uid)
            .and_then(|q| q.buckets.get_mut(&key));
        if let Some(bucket) = bucket {
            bucket.points = index;
        }
    }
}

/// Cuts a bucket file back to the length the checkpoint recorded; a shorter file lost bytes
/// the checkpoint made durable: `Corrupt`.
fn cut_to_checkpoint(path: &Path, file_len: u64) -> Result<()> {
    let actual = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(source) => return Err(StoreError::io_at("stat a bucket file", path, source)),
    };
    if actual < file_len {
        return Err(StoreError::Corrupt {
            location: path.display().to_string(),
            detail: format!("bucket file has {actual} bytes, the checkpoint recorded {file_len}"),
        });
    }
    if actual > file_len {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_at("open a bucket file to cut its tail", path))?;
        file.set_len(file_len)
            .map_err(io_at("cut a bucket file's tail", path))?;
    }
    Ok(())
}

/// The idempotency keys the checkpoint's key section holds (format 1: in full, hashed now):
/// since format 6, those put after its WAL switch; before, all of them. The next checkpoint
/// writes them to a run.
fn restore_keys(checkpoint: &Checkpoint, state: &mut State) {
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
}

/// Takes the data directory's lock, so that two engines (in this process or another) never
/// write the same files. The lock is an OS file lock: it goes away with the process, so a
/// crashed engine never blocks the next open, and the `LOCK` file itself may stay behind.
pub(super) fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_at("open the data directory's lock file", &path))?;
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
                return Err(StoreError::io_at("lock the data directory", &path, source))
            }
        }
    }
}

/// Whether the WAL file at `path` holds any frame (or part of one): its first bytes are not
/// zeros. A file created ahead of use, or holding only prepared zeros, does not.
fn holds_frames(path: &Path) -> Result<bool> {
    let mut head = [0u8; record::FRAME_HEADER_BYTES];
    let file = File::open(path).map_err(io_at("read a WAL file", path))?;
    let read = std::os::unix::fs::FileExt::read_at(&file, &mut head, 0)
        .map_err(io_at("read a WAL file", path))?;
    Ok(!record::is_log_end(&head[..read]))
}

/// Replays WAL files numbered `start` and later into the bucket files. Returns the highest
/// WAL file number seen.
pub(super) fn replay(
    dir: &Path,
    start: u64,
    state: &mut State,
    meta: &mut MetaEntries,
    subs: &mut Subs,
    options: &EngineOptions,
) -> Result<u64> {
    let numbers = old_wal_files(dir)?;
    check_wal_run(dir, start, &numbers)?;
    let last = numbers.last().copied().unwrap_or(0);
    let mut to_load: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut live = Vec::with_capacity(numbers.len());
    for number in numbers {
        let path = wal_path(dir, number);
        if number < start {
            // Replayed into the checkpoint, which stopped before it removed them.
            fs::remove_file(&path).map_err(io_at("remove an old WAL file", &path))?;
            tracing::info!(path = %path.display(), "removed a WAL file the checkpoint holds");
        } else {
            let written = holds_frames(&path)?;
            live.push((path, written));
        }
    }
    // The log ends where its last non-empty file ends. Empty files after it were created
    // ahead of use (by a checkpoint that had not switched to them yet, or by an open) and
    // never written: a frame torn at the end of that file is the log's torn tail, even if
    // it is not the last file (see `docs/storage-format.md`, "Recovery"). A file that holds
    // only zeros (space prepared ahead, `prefill.rs`) is empty too.
    let tail = live.iter().rposition(|(_, written)| *written);
    for (i, (path, _)) in live.iter().enumerate() {
        let mut replay = Replay {
            state: &mut *state,
            meta: &mut *meta,
            subs: &mut *subs,
            options,
            to_load: &mut to_load,
        };
        replay.file(path, Some(i) == tail)?;
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

/// The checkpoint's log starts at WAL file `start`, which a checkpoint creates (and makes its
/// directory entry durable) before it names it; the files after it follow one by one. A file
/// missing from that run was lost (deleted, a partial restore), and its acknowledged records
/// with it: `Corrupt`, rather than a replay that silently skips them. `start` is 0 only
/// before any checkpoint.
fn check_wal_run(dir: &Path, start: u64, numbers: &[u64]) -> Result<()> {
    if start == 0 {
        return Ok(());
    }
    let mut expected = start;
    for &number in numbers.iter().filter(|&&n| n >= start) {
        if number != expected {
            break;
        }
        expected += 1;
    }
    let last = numbers.last().copied().unwrap_or(0);
    if expected > last && expected > start {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        location: wal_path(dir, expected).display().to_string(),
        detail: format!(
            "missing: the checkpoint's log starts at WAL file {start} and runs to {}, one file \
             after another; restore the whole data directory from a backup",
            last.max(start)
        ),
    })
}

/// Where replayed records go: bucket records to their buckets (and the buckets to load
/// afterwards), metadata records to the metadata entries.
struct Replay<'a> {
    state: &'a mut State,
    meta: &'a mut MetaEntries,
    subs: &'a mut Subs,
    options: &'a EngineOptions,
    to_load: &'a mut BTreeSet<(u64, u64)>,
}

impl Replay<'_> {
    /// Replays one WAL file, frame by frame. A bad frame is cut as a torn tail if the file
    /// ends the log (`is_tail`: no later file holds a byte) and [`wal_tail::is_torn_tail`] says so;
    /// otherwise it is `Corrupt`.
    fn file(&mut self, path: &Path, is_tail: bool) -> Result<()> {
        let bytes = fs::read(path).map_err(io_at("read a WAL file", path))?;
        let mut offset = 0;
        while offset < bytes.len() {
            if record::is_log_end(&bytes[offset..]) {
                // Space prepared ahead and never written: the log ends here in this file,
                // unless what follows shows damage.
                return wal_tail::check_log_end(path, &bytes, offset);
            }
            let (entries, len) = match record::decode_wal(&bytes[offset..]) {
                Ok(decoded) => decoded,
                Err(error) if is_tail && wal_tail::is_torn_tail(&bytes[offset..], &error) => {
                    // The log ends in a frame that was being written at the crash: its call
                    // never returned (a call returns only once its whole frame is written),
                    // and nothing was written after it, so dropping it loses nothing
                    // acknowledged. Unless it shows signs of damage instead.
                    wal_tail::check_torn(path, &bytes[offset..], offset)?;
                    tracing::warn!(path = %path.display(), offset, %error, "cutting a torn WAL tail");
                    let file = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(io_at("open a WAL file to cut its tail", path))?;
                    file.set_len(offset as u64)
                        .map_err(io_at("cut a WAL file's tail", path))?;
                    return Ok(());
                }
                Err(error) => {
                    return Err(StoreError::Corrupt {
                        location: format!("{} at offset {offset}", path.display()),
                        detail: error.to_string(),
                    })
                }
            };
            for (target, inner) in entries {
                if target.queue_uid == record::META_TARGET_UID {
                    self.meta_record(inner);
                } else if target.queue_uid == subs::record::SUBS_TARGET_UID {
                    self.subs_record(inner);
                } else {
                    self.bucket_record(target, inner)?;
                }
            }
            offset += len;
        }
        Ok(())
    }

    /// Applies a metadata record's changes in order (each carries the resulting value, so
    /// applying one again, on a checkpoint that already holds it, changes nothing).
    fn meta_record(&mut self, inner: &[u8]) {
        let Ok((changes, _)) = record::decode_meta(inner) else {
            return; // decode_wal checked it; unreachable in practice
        };
        self.state.stats.wal_records_replayed += changes.len() as u64;
        meta::apply(self.meta, changes);
    }

    /// Applies a subscription record: it holds effective changes only, so nothing is read.
    fn subs_record(&mut self, inner: &[u8]) {
        let Ok((rec, _)) = subs::record::decode(inner) else {
            return; // decode_wal checked it; unreachable in practice
        };
        self.state.stats.wal_records_replayed += 1;
        self.subs.apply(&rec);
    }

    /// Appends one replayed bucket record to its bucket and counts it (a put), or notes the
    /// bucket for loading (any other record: counts are only known by reading it).
    fn bucket_record(&mut self, target: WalTarget, inner: &[u8]) -> Result<()> {
        // Payload and headers are not needed here: the frame is copied verbatim.
        let Ok((record, _)) = record::decode_light(inner) else {
            return Ok(()); // decode_wal checked it; unreachable in practice
        };
        let state = &mut *self.state;
        state.stats.wal_records_replayed += 1;
        state.next_seq = state.next_seq.max(record.seq().saturating_add(1));
        if let Record::Lease { lease_id, .. } | Record::Extend { lease_id, .. } = &record {
            state.next_lease = state.next_lease.max(lease_id.saturating_add(1));
        }
        let Some(queue) = state.queues.get_mut(&target.queue_uid) else {
            return Ok(()); // the queue was deleted after this record
        };
        let dir = &queue.dir;
        let bucket = queue.buckets.entry(target.bucket).or_insert_with(|| {
            let path = dir.join(bucket::file_name(target.bucket));
            Bucket::new(path, 0, BucketMeta::default(), false)
        });
        let offset = bucket.append(inner);
        state.buffered_bytes += inner.len();
        if bucket.buf.len() >= self.options.bucket_buffer_bytes {
            let written = bucket.flush()?;
            state.buffered_bytes -= written;
        }
        match &record {
            Record::Put(put) => {
                bucket.points.note_put(put.seq, offset);
                queue.update_unloaded_meta(target.bucket, |m| m.add_scheduled(put.due_at_ms));
                if let Some(k) = &put.idempotency_key {
                    let hash = queue.hasher.hash(k);
                    queue
                        .index
                        .keys
                        .insert(hash, task_id(put.seq, target.bucket));
                }
            }
            Record::Cancel { .. } | Record::Reschedule { .. }
                if !self.to_load.contains(&(target.queue_uid, target.bucket))
                    && replay_through_index(queue, target.bucket, &record)? => {}
            _ => {
                self.to_load.insert((target.queue_uid, target.bucket));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::{NewTask, QueueName};
    use bytes::Bytes;

    use super::*;
    use std::path::PathBuf;

    use crate::engine::checkpoint::fault;
    use crate::engine::record::{PutRecord, WalBatch};
    use crate::engine::wal::parse_wal_name;
    use crate::store::{PutOutcome, Store};

    const NOW: u64 = 1_700_000_000_000;

    fn options() -> EngineOptions {
        EngineOptions {
            background_checkpoints: false,
            ..EngineOptions::default()
        }
    }

    fn queue() -> QueueName {
        QueueName::new("q").unwrap()
    }

    /// A WAL frame of one put of 50 tasks, about the size of the crash writer's batches
    /// (6,308 bytes in the failure this reproduces).
    fn put_frame(uid: u64) -> Vec<u8> {
        let mut batch = WalBatch::new();
        for seq in 1_000..1_050 {
            let put = Record::Put(PutRecord {
                seq,
                due_at_ms: NOW,
                priority: belfry_core::Priority::Normal,
                payload_kind: belfry_core::PayloadKind::Binary,
                late_policy: belfry_core::LatePolicy::Fire,
                idempotency_key: None,
                target: None,
                headers: Vec::new(),
                payload: Bytes::from(vec![7u8; 64]),
            });
            let target = record::WalTarget {
                queue_uid: uid,
                bucket: super::super::bucket::bucket_for(NOW, NOW),
            };
            batch.push(target, &put);
        }
        batch.finish()
    }

    /// Writes `bytes` where the log ends in the WAL file at `path`, as the writer would: the
    /// file may go on with zeros prepared ahead.
    fn append(path: &Path, bytes: &[u8]) {
        let end = record::wal_log_len(&fs::read(path).unwrap());
        let file = OpenOptions::new().write(true).open(path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, bytes, end as u64).unwrap();
    }

    /// Acknowledged puts and a cursor, then the engine is left as a crash leaves it while the
    /// checkpoint thread has created the next WAL file and a writer is in the middle of
    /// appending a frame to the current one: the fatal signal cut that `write` short (Linux
    /// may end a multi-page `write` early when a fatal signal arrives), so the current file
    /// ends in a torn frame and is no longer the last file. Returns the acknowledged ids.
    fn crash_mid_write_after_the_next_wal_exists(dir: &Path) -> Vec<belfry_core::TaskId> {
        let engine = Engine::open(dir, options()).unwrap();
        engine.put_queue(&queue(), Bytes::new()).unwrap();
        let tasks = (0..10)
            .map(|i| NewTask::new(queue(), NOW + i, Bytes::from(format!("task-{i}"))))
            .collect();
        let ids = engine
            .put(tasks)
            .unwrap()
            .iter()
            .map(PutOutcome::id)
            .collect();
        engine
            .put_meta("sched", "cursor", Bytes::from_static(b"12345678"))
            .unwrap();
        let frame = put_frame(0);
        fault::arm_after_next_wal_created(move |current| append(current, &frame[..1_800]));
        assert!(engine.flush().is_err(), "the fault point did not fire");
        engine.abandon();
        ids
    }

    #[test]
    fn a_torn_frame_before_a_pre_created_empty_wal_file_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let ids = crash_mid_write_after_the_next_wal_exists(dir.path());
        let engine = Engine::open(dir.path(), options()).unwrap();
        for id in ids {
            assert!(
                engine.get(&queue(), id, NOW).unwrap().is_some(),
                "{id} lost"
            );
        }
        assert_eq!(
            engine.get_meta("sched", "cursor").unwrap(),
            Some(Bytes::from_static(b"12345678"))
        );
        let counts = engine.counts(&queue(), NOW + 100).unwrap();
        assert_eq!(counts.pending, 10, "the torn frame's tasks appeared");
    }

    #[test]
    fn a_torn_frame_followed_by_written_frames_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        crash_mid_write_after_the_next_wal_exists(dir.path());
        // Something written after the torn frame: it may have been acknowledged, so the torn
        // frame is damage, not a torn tail, and nothing may be silently dropped.
        let last = old_wal_files(dir.path()).unwrap().pop().unwrap();
        append(&wal_path(dir.path(), last), &put_frame(0));
        match Engine::open(dir.path(), options()) {
            Err(StoreError::Corrupt { location, detail }) => {
                assert!(location.contains(".wal at offset"), "{location}");
                // Truncated when the file ends in the torn frame; a checksum mismatch when
                // zeros prepared ahead follow it.
                assert!(
                    detail.contains("truncated") || detail.contains("checksum"),
                    "{detail}"
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    /// `count` acknowledged puts, one call each, then the engine is left as `kill -9` leaves
    /// it. No prefill thread, so the test decides where zeros are. Returns the tail WAL file
    /// and the ids.
    fn acknowledged_puts(dir: &Path, count: u64) -> (PathBuf, Vec<belfry_core::TaskId>) {
        let options = EngineOptions {
            wal_prefill: false,
            ..options()
        };
        let engine = Engine::open(dir, options).unwrap();
        engine.put_queue(&queue(), Bytes::new()).unwrap();
        let ids = (0..count)
            .map(|i| {
                let task = NewTask::new(queue(), NOW + i, Bytes::from(format!("task-{i}")));
                engine.put(vec![task]).unwrap()[0].id()
            })
            .collect();
        engine.abandon();
        let last = old_wal_files(dir).unwrap().pop().unwrap();
        (wal_path(dir, last), ids)
    }

    fn pending(dir: &Path) -> Result<u64> {
        let engine = Engine::open(dir, options())?;
        Ok(engine.counts(&queue(), NOW).unwrap().pending)
    }

    fn extend_with_zeros(path: &Path, bytes: u64) {
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.set_len(file.metadata().unwrap().len() + bytes)
            .unwrap();
    }

    #[test]
    fn zeros_prepared_after_the_log_end_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tail, ids) = acknowledged_puts(dir.path(), 20);
        extend_with_zeros(&tail, 1 << 20);
        assert_eq!(pending(dir.path()).unwrap(), ids.len() as u64);
    }

    #[test]
    fn a_frame_torn_inside_prepared_zeros_is_cut() {
        // A write cut short: the first part of a frame, then the zeros it never overwrote.
        // So is one cut inside its header (a shorter length declared, then zeros).
        for torn_len in [1_800, 2] {
            let dir = tempfile::tempdir().unwrap();
            let (tail, ids) = acknowledged_puts(dir.path(), 20);
            extend_with_zeros(&tail, 1 << 20);
            append(&tail, &put_frame(0)[..torn_len]);
            assert_eq!(pending(dir.path()).unwrap(), ids.len() as u64, "{torn_len}");
        }
    }

    #[test]
    fn bytes_after_the_zeros_that_end_the_log_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (tail, _) = acknowledged_puts(dir.path(), 20);
        extend_with_zeros(&tail, 64 * 1024);
        let mut file = OpenOptions::new().append(true).open(&tail).unwrap();
        std::io::Write::write_all(&mut file, &put_frame(0)).unwrap();
        match pending(dir.path()) {
            Err(StoreError::Corrupt { location, detail }) => {
                assert!(location.contains(".wal at offset"), "{location}");
                assert!(detail.contains("after the end of the log"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_file_whose_log_ends_in_zeros_before_a_later_file_replays_whole() {
        // Switched away from with zeros prepared but unused: the next file holds the rest.
        let dir = tempfile::tempdir().unwrap();
        let (tail, ids) = acknowledged_puts(dir.path(), 20);
        extend_with_zeros(&tail, 64 * 1024);
        let next = wal_path(dir.path(), wal_number(&tail) + 1);
        fs::write(&next, put_frame(0)).unwrap();
        extend_with_zeros(&next, 64 * 1024);
        assert_eq!(pending(dir.path()).unwrap(), ids.len() as u64 + 50);
    }

    /// With the prefill thread on, small commits get zeros prepared ahead of the log (the
    /// file grows past it), and a crash then loses nothing acknowledged.
    #[test]
    fn small_commits_get_space_prepared_ahead_and_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), options()).unwrap();
        engine.put_queue(&queue(), Bytes::new()).unwrap();
        let tail = wal_path(
            dir.path(),
            old_wal_files(dir.path()).unwrap().pop().unwrap(),
        );
        let mut ids = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let i = ids.len() as u64;
            let task = NewTask::new(queue(), NOW + i, Bytes::from(format!("task-{i}")));
            ids.push(engine.put(vec![task]).unwrap()[0].id());
            let log = record::wal_log_len(&fs::read(&tail).unwrap()) as u64;
            if fs::metadata(&tail).unwrap().len() > log {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no zeros prepared after {i} puts"
            );
        }
        // More puts land in the prepared space.
        for i in 0..100 {
            let task = NewTask::new(queue(), NOW, Bytes::from(format!("more-{i}")));
            ids.push(engine.put(vec![task]).unwrap()[0].id());
        }
        engine.abandon();
        let engine = Engine::open(dir.path(), options()).unwrap();
        for id in &ids {
            assert!(
                engine.get(&queue(), *id, NOW).unwrap().is_some(),
                "{id} lost"
            );
        }
    }

    fn wal_number(path: &Path) -> u64 {
        parse_wal_name(path.file_name().unwrap().to_str().unwrap()).unwrap()
    }
}
