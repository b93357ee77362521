//! Checkpoints: make bucket files durable, record where they end (and the counts, keys and
//! counters a reopen needs), and drop the WAL before that point. They run on the engine's own
//! thread (`Checkpointer`) or, when writers outrun it, on a caller's.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::keys::runs;
use super::keys::Frozen;
use super::lsm::{merge_output_bound, postpone_full_merge, release_free_memory};
use super::persist::{self, Checkpoint, CheckpointBucket};
use super::wal::{create_wal, old_wal_files, wal_path};
use super::{io, io_at, Core, Engine, State, CHECKPOINT_FILE};
use crate::store::{Result, StoreError};

/// Idempotency keys copied into a checkpoint per hold of the state lock.
const CHECKPOINT_KEY_CHUNK: usize = 16 * 1024;

/// Whether a call should see to a checkpoint (see `Engine::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum CheckpointNeed {
    No,
    Due,
    /// The WAL since the last checkpoint is this many times the threshold: background
    /// checkpoints are not keeping up.
    Overdue,
}

/// WAL growth, in checkpoint thresholds, at which writers stop leaving checkpoints to the
/// checkpoint thread and wait for one themselves.
pub(super) const CHECKPOINT_OVERDUE_FACTOR: u64 = 2;
/// While free space is below the reserve, a checkpoint is due after this fraction of the
/// usual WAL bytes: each one deletes the WAL before it (and finished buckets), which is how
/// space comes back while deliveries write into the reserve.
pub(super) const LOW_SPACE_CHECKPOINT_DIVISOR: u64 = 8;
/// ...but not sooner than after this many WAL bytes, so that a slow trickle of acks does not
/// run a checkpoint for each.
pub(super) const LOW_SPACE_CHECKPOINT_WAL_BYTES_MIN: u64 = 64 * 1024;

/// A thread that runs a checkpoint whenever a call finds one due, so that no caller waits
/// for the bucket files' fsync (`EngineOptions::background_checkpoints`).
#[derive(Debug)]
pub(super) struct Checkpointer {
    pub(super) signal: Arc<(Mutex<CheckpointSignal>, Condvar)>,
    pub(super) handle: Option<thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
pub(super) struct CheckpointSignal {
    pub(super) requested: bool,
    pub(super) stopped: bool,
}

impl Checkpointer {
    /// `None` if the thread cannot be started: callers then run checkpoints themselves.
    pub(super) fn start(core: Arc<Core>) -> Option<Checkpointer> {
        let signal = Arc::new((Mutex::new(CheckpointSignal::default()), Condvar::new()));
        let theirs = Arc::clone(&signal);
        let spawned = thread::Builder::new()
            .name("belfry-checkpoint".into())
            .spawn(move || checkpoint_thread(&core, &theirs));
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

    pub(super) fn request(&self) {
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

/// The checkpoint thread: a checkpoint when asked (then the merges it made due), and, every
/// `subs_settle_after`, a look at whether the subscription tree has been quiet since the last
/// look, merging its runs into one if so. What merges make is listed by the next checkpoint,
/// so they ask for one.
fn checkpoint_thread(core: &Core, signal: &(Mutex<CheckpointSignal>, Condvar)) {
    let (flags, wake) = signal;
    let settle = core.options.subs_settle_after;
    let mut last_look = Instant::now();
    // The tree's change count at the last look (none yet).
    let mut changes_seen = u64::MAX;
    loop {
        let requested = {
            let mut flags = flags.lock();
            if !flags.requested && !flags.stopped {
                match settle {
                    Some(quiet) => {
                        let left = quiet.saturating_sub(last_look.elapsed());
                        wake.wait_for(&mut flags, left);
                    }
                    None => wake.wait(&mut flags),
                }
            }
            if flags.stopped {
                return;
            }
            std::mem::take(&mut flags.requested)
        };
        if requested {
            {
                let _guard = core.checkpointing.lock();
                // A failure poisons the engine (logged there; every later call reports it).
                let _ = core.checkpoint_guarded();
            }
            // Merges run after the checkpoint, without its guard.
            if let Ok(true) = core.subs_compact() {
                flags.lock().requested = true;
            }
            if let Ok(true) = core.keys_compact() {
                flags.lock().requested = true;
            }
        }
        if settle.is_some_and(|quiet| last_look.elapsed() >= quiet) {
            last_look = Instant::now();
            if let Ok(true) = core.subs_settle(&mut changes_seen) {
                flags.lock().requested = true;
            }
        }
    }
}

/// What phase A of a checkpoint decided.
#[derive(Debug, Default)]
pub(super) struct CheckpointPlan {
    pub(super) checkpoint: Checkpoint,
    /// Buckets `(uid, key, length)` with buffered bytes: written in phase B up to `length`.
    pub(super) flush: Vec<(u64, u64, u64)>,
    pub(super) sync_files: Vec<PathBuf>,
    pub(super) sync_dirs: Vec<PathBuf>,
    /// Finished buckets `(uid, key, length)`, deleted in phase C if still untouched.
    pub(super) doomed: Vec<(u64, u64, u64)>,
    /// Queues whose idempotency keys phase C copies into the checkpoint.
    pub(super) key_queues: Vec<u64>,
    /// The metadata entries as of the WAL switch, encoded for the checkpoint.
    pub(super) meta_entries: Vec<u8>,
    /// The subscription memtable frozen at the WAL switch, and the counters then.
    pub(super) subs: super::subs::SubsPlan,
    /// The point indexes of the unloaded buckets, as of the WAL switch.
    pub(super) points: persist::PointsSection,
    /// The key memtables frozen at the WAL switch `(queue uid, pairs)`, ascending uid:
    /// written to one run in phase B.
    pub(super) keys_frozen: Vec<(u64, Arc<Frozen>)>,
    /// The key runs as of phase B, and the files merges replaced (deleted in phase C).
    pub(super) key_runs: persist::KeyRunsPersisted,
    pub(super) key_runs_obsolete: Vec<PathBuf>,
}

impl Engine {
    /// Whether the WAL grew enough since the last checkpoint for the next one. Read while the
    /// caller still holds the state lock, so `finish` need not take it again.
    pub(super) fn checkpoint_due(&self, state: &State) -> CheckpointNeed {
        let threshold = self.core.checkpoint_wal_threshold();
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
    pub(super) fn finish(&self, ticket: u64, delivery: bool, need: CheckpointNeed) -> Result<()> {
        self.wait_durable(ticket, delivery)?;
        match (need, &self.checkpointer) {
            (CheckpointNeed::No, _) => {}
            (CheckpointNeed::Due, Some(checkpointer)) => checkpointer.request(),
            (CheckpointNeed::Due, None) => {
                let Some(guard) = self.core.checkpointing.try_lock() else {
                    return Ok(());
                };
                self.core.checkpoint_guarded()?;
                drop(guard);
                self.core.compact_then_list()?;
            }
            (CheckpointNeed::Overdue, checkpointer) => {
                {
                    let _guard = self.core.checkpointing.lock();
                    // The checkpoint that held the guard may have made this one unnecessary.
                    let still = self.core.state.lock().wal_since_checkpoint
                        >= self.core.checkpoint_wal_threshold()
                        || self.core.subs.lock().mem_bytes()
                            >= self.core.options.subs_memtable_bytes;
                    if !still {
                        return Ok(());
                    }
                    self.core.checkpoint_guarded()?;
                }
                // The runs this checkpoint wrote may be due to merge: the thread does that
                // after a checkpoint of its own, or this caller does without one.
                match checkpointer {
                    Some(checkpointer) => checkpointer.request(),
                    None => self.core.compact_then_list()?,
                }
            }
        }
        Ok(())
    }
}

impl Core {
    /// WAL bytes after which a checkpoint is due: `checkpoint_wal_bytes`, but at most half the
    /// reserve in force (on a small filesystem the reserve is an eighth of it, and the WAL a
    /// checkpoint deletes must fit in the reserve with its copy in bucket files), and much
    /// sooner while free space is below the reserve.
    pub(super) fn checkpoint_wal_threshold(&self) -> u64 {
        let configured = self.options.checkpoint_wal_bytes;
        let mut threshold = match self.space.reserve_in_force() {
            0 => configured,
            reserve => configured.min(reserve / 2),
        };
        if self.space.is_low() {
            threshold = (threshold / LOW_SPACE_CHECKPOINT_DIVISOR)
                .max(LOW_SPACE_CHECKPOINT_WAL_BYTES_MIN)
                .min(threshold);
        }
        threshold
    }

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
    pub(super) fn checkpoint(&self) -> Result<()> {
        let _guard = self.checkpointing.lock();
        self.checkpoint_guarded()
    }

    /// A checkpoint, then the merges of subscription runs it made due, listed by one more
    /// checkpoint (which also deletes the merged runs): what `Store::flush` waits for.
    pub(super) fn checkpoint_and_compact(&self) -> Result<()> {
        self.checkpoint()?;
        self.compact_then_list()
    }

    /// Merges runs the policy picks, then, if it merged any, a checkpoint that lists them.
    fn compact_then_list(&self) -> Result<()> {
        let subs = self.subs_compact()?;
        if self.keys_compact()? || subs {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Phase B for the idempotency keys: writes the frozen memtables to one run, puts it in
    /// front of the others (reads move from the frozen pairs to it at once), and notes the
    /// runs the checkpoint lists and the merged-away files it deletes.
    fn keys_write_run(&self, plan: &mut CheckpointPlan) -> Result<()> {
        let frozen = std::mem::take(&mut plan.keys_frozen);
        if !frozen.is_empty() {
            let (dir, id) = {
                let mut state = self.state.lock();
                state.key_runs.next_run += 1;
                (state.key_runs.dir.clone(), state.key_runs.next_run - 1)
            };
            let run = runs::write_frozen(&dir, id, &frozen)?;
            persist::sync_dir(&dir)?;
            let mut state = self.state.lock();
            if let Some(run) = run {
                self.space.wrote(run.file_bytes);
                state.key_runs.runs.insert(0, Arc::new(run));
            }
            for (uid, _) in &frozen {
                if let Some(queue) = state.queues.get_mut(uid) {
                    queue.index.keys.thaw();
                }
            }
        }
        let mut state = self.state.lock();
        plan.key_runs = state.key_runs.persisted();
        plan.key_runs_obsolete = std::mem::take(&mut state.key_runs.retired);
        Ok(())
    }

    /// Merges key runs while the size-tiered policy picks some, leaving out the entries of
    /// deleted buckets and queues; returns whether it merged any. Like `subs_compact`: after
    /// a checkpoint, holding `compacting`, the state lock only to pick and to swap.
    pub(super) fn keys_compact(&self) -> Result<bool> {
        let _guard = self.compacting.lock();
        let mut merged = false;
        loop {
            let (plan, dir) = {
                let mut state = self.state.lock();
                state.check()?;
                let State {
                    queues, key_runs, ..
                } = &mut *state;
                let buckets = queues
                    .values()
                    .flat_map(|q| q.buckets.keys().map(move |&key| (q.uid, key)));
                match key_runs.plan_merge(self.options.key_compaction_min_runs, buckets) {
                    Some(plan) => (plan, key_runs.dir.clone()),
                    None => break,
                }
            };
            // Written beside its inputs until the next checkpoint: it needs room for a copy.
            let output = merge_output_bound(&plan.inputs);
            if !self
                .space
                .room_for_merge(output, "a merge of idempotency-key runs")
            {
                break;
            }
            let out = match runs::merge(&dir, &plan) {
                Ok(out) => out,
                Err(error) if postpone_full_merge(&dir, plan.id, &error) => break,
                Err(error) => return Err(self.state.lock().poison(&error)),
            };
            let mut state = self.state.lock();
            if let Some(run) = &out {
                self.space.wrote(run.file_bytes);
            }
            state.key_runs.install(&plan, out)?;
            merged = true;
        }
        if merged {
            release_free_memory();
        }
        Ok(merged)
    }

    pub(super) fn checkpoint_guarded(&self) -> Result<()> {
        let result = self.checkpoint_phases();
        if let Err(error) = &result {
            // The checkpoint's own error goes to its caller (`flush`, a test fault point).
            let _ = self.state.lock().poison(error);
        }
        result
    }

    pub(super) fn checkpoint_phases(&self) -> Result<()> {
        let (mut plan, old_wal) = self.switch_wal()?;
        self.write_buckets(&plan)?;
        self.subs_write_runs(&mut plan.subs)?;
        self.keys_write_run(&mut plan)?;
        let mut checkpoint = plan.checkpoint;
        checkpoint.wal_start = old_wal + 1;
        let subs = persist::encode_subs(&plan.subs.persisted);
        let points = std::mem::take(&mut plan.points).finish();
        let key_runs = persist::encode_key_runs(&plan.key_runs);
        let tail: [&[u8]; 4] = [&plan.meta_entries, &subs, &points, &key_runs];
        self.write_checkpoint(&checkpoint, &plan.key_queues, &tail)?;
        for n in old_wal_files(&self.dir)? {
            if n <= old_wal {
                let path = wal_path(&self.dir, n);
                fs::remove_file(&path).map_err(io_at("remove an old WAL file", &path))?;
            }
        }
        for path in plan.subs.obsolete.iter().chain(&plan.key_runs_obsolete) {
            match fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StoreError::io_at("remove a merged run file", path, source))
                }
            }
        }
        self.delete_finished(plan.doomed)
    }

    /// Phase A: write the queued WAL bytes, plan the checkpoint and switch WAL files under
    /// the WAL locks and the state lock, then fsync the old file holding only the sync lock.
    /// Returns the plan and the old file's number.
    fn switch_wal(&self) -> Result<(CheckpointPlan, u64)> {
        // Before phase A: the next WAL file, so that no file creation and directory fsync
        // happen under the locks. Only checkpoints switch files, and they run one at a time.
        let number = self.wal.writer.lock().number + 1;
        let next_file = create_wal(&self.dir, number)?;
        #[cfg(test)]
        if fault::crash_after_next_wal_created(&wal_path(&self.dir, number - 1)) {
            return Err(StoreError::Io {
                context: "checkpoint (stopped by a test fault point)",
                path: None,
                source: std::io::Error::other("simulated crash"),
            });
        }
        // The metadata lock first (see `meta.rs`): no metadata frame is queued between the
        // copy and the switch, so the copy holds exactly the changes of WAL files up to the
        // old one. Metadata calls wait meanwhile; task calls do not.
        let meta = self.meta.lock();
        let meta_entries = persist::encode_meta_entries(&meta);
        // Then the subs lock, for the same reason: the frozen memtable holds exactly the
        // subscription changes of WAL files up to the old one.
        let mut subs = self.subs.lock();
        let mut sync = self.wal.sync.lock();
        let (mut plan, old_file, old_end) = {
            let mut writer = self.wal.writer.lock();
            let mut state = self.state.lock();
            state.check()?;
            let pending = std::mem::take(&mut state.wal_pending);
            writer.append(&pending).map_err(io("append to the WAL"))?;
            self.wal
                .written
                .store(state.wal_appended, Ordering::Release);
            let mut plan = self.plan_checkpoint(&mut state)?;
            plan.subs = subs.freeze();
            let old_file = writer.switch(next_file, number);
            state.wal_since_checkpoint = 0;
            (plan, old_file, state.wal_appended)
        };
        drop(subs);
        drop(meta);
        plan.meta_entries = meta_entries;
        // Still phase A, with only the sync lock held: nobody can fsync the new file (and so
        // mark these bytes synced) before the old one is.
        old_file.sync_data().map_err(io("fsync the WAL"))?;
        sync.last_sync = Instant::now();
        self.wal.syncs.fetch_add(1, Ordering::Relaxed);
        self.wal.synced.fetch_max(old_end, Ordering::Release);
        Ok((plan, number - 1))
    }

    /// Phase B: write the noted buckets' buffers, taking the state lock one bucket at a
    /// time, then fsync the bucket files (and their directories) without locks.
    fn write_buckets(&self, plan: &CheckpointPlan) -> Result<()> {
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
            bucket.release_buffer();
        }
        for path in &plan.sync_files {
            match File::open(path) {
                Ok(file) => file
                    .sync_all()
                    .map_err(io_at("fsync a bucket file", path))?,
                // Deleted meanwhile with its queue: nothing to keep.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StoreError::io_at(
                        "open a bucket file to fsync it",
                        path,
                        source,
                    ))
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
        Ok(())
    }

    /// End of phase C, under the state lock: deletes the finished buckets that received
    /// nothing since phase A.
    fn delete_finished(&self, doomed: Vec<(u64, u64, u64)>) -> Result<()> {
        let mut state = self.state.lock();
        // The deleted buckets' memory (a drained bucket can hold a million entries) is freed
        // after the lock is released.
        let mut removed = Vec::new();
        state.checkpoints += 1;
        for (uid, key, len) in doomed {
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
            if let Some(bucket) = queue.take_finished(key) {
                state.buffered_bytes = state.buffered_bytes.saturating_sub(bucket.buf.len());
                let path = bucket.path.clone();
                removed.push(bucket);
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(StoreError::io_at(
                            "remove a finished bucket file",
                            &path,
                            source,
                        ))
                    }
                }
            }
        }
        drop(state);
        drop(removed);
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
    ///
    /// The metadata entries and the subscription section follow the keys (`tail`: copied in
    /// phase A under their locks, exactly as of the WAL switch; the runs as of phase B).
    pub(super) fn write_checkpoint(
        &self,
        checkpoint: &Checkpoint,
        key_queues: &[u64],
        tail: &[&[u8]],
    ) -> Result<()> {
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
        for piece in tail {
            writer.write(piece)?;
        }
        writer.finish()
    }

    /// Phase A of a checkpoint, under the state lock: unloads far buckets, picks finished
    /// ones and notes what to write, fsync and record.
    pub(super) fn plan_checkpoint(&self, state: &mut State) -> Result<CheckpointPlan> {
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
                // A loaded bucket's index is rebuilt when a restart loads it again.
                if bucket.entries.is_none() && bucket.points.is_complete() {
                    plan.points.add(queue.uid, key, &bucket.points);
                }
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
            // The keys put since the last checkpoint go to a run in phase B; those put from
            // now on are copied in phase C, a chunk at a time (see there).
            if let Some(frozen) = queue.index.keys.freeze() {
                plan.keys_frozen.push((queue.uid, frozen));
            }
            plan.key_queues.push(queue.uid);
        }
        plan.keys_frozen.sort_unstable_by_key(|(uid, _)| *uid);
        plan.checkpoint.next_seq = state.next_seq;
        plan.checkpoint.next_lease = state.next_lease;
        plan.checkpoint.last_now_ms = state.last_now_ms;
        plan.checkpoint.key_secret = Some((state.key_hasher.k0, state.key_hasher.k1));
        Ok(plan)
    }
}

/// Test-only fault points of the checkpoint: they put the files in the state a crash of the
/// process at that point leaves, then stop the checkpoint there.
#[cfg(test)]
pub(super) mod fault {
    use std::cell::RefCell;
    use std::path::Path;

    /// Runs with the path of the current WAL file.
    type Hook = Box<dyn FnOnce(&Path)>;

    thread_local! {
        static AFTER_NEXT_WAL_CREATED: RefCell<Option<Hook>> = RefCell::new(None);
    }

    /// The next checkpoint on this thread runs `hook` once the next WAL file exists (before
    /// the locks and the switch), then stops as if the process died there.
    pub(in crate::engine) fn arm_after_next_wal_created(hook: impl FnOnce(&Path) + 'static) {
        AFTER_NEXT_WAL_CREATED.with(|slot| *slot.borrow_mut() = Some(Box::new(hook)));
    }

    /// Whether an armed hook ran (the checkpoint must then stop).
    pub(super) fn crash_after_next_wal_created(current: &Path) -> bool {
        match AFTER_NEXT_WAL_CREATED.with(|slot| slot.borrow_mut().take()) {
            Some(hook) => {
                hook(current);
                true
            }
            None => false,
        }
    }
}
