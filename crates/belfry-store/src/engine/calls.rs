//! The paths store calls share: taking the state lock, committing a call's records and
//! waiting for them to be durable, reading bucket files ahead of a call, and finding the task
//! (and the lease in force) a call is about.

use std::sync::atomic::Ordering;

use belfry_core::{LeaseId, QueueName, Task, TaskId, TaskState, UnixMs};

use super::bucket::split_id;
use super::keys::runs::KeyRuns;
use super::points::Prior;
use super::queue::{self, EngineStats, Queue};
use super::record::{Record, WalBatch};
use super::{push, Engine, Pending, State};
use rustc_hash::FxHashSet;

use crate::store::{ChangeOutcome, DeadAction, LeaseOutcome, Result};

/// About the bytes a lease record takes in a WAL frame (target, framing, fields).
pub(super) const LEASE_RECORD_BYTES_HINT: usize = 64;

/// Most records a call that may touch many tasks (a claim, an ack batch) builds under one
/// hold of the state lock. Every queue's calls share that lock, so a claim of 1,000 tasks
/// held it for 0.4-1 ms, and a one-task lease of another queue that came in meanwhile
/// waited that long (issue #10: 10,000 firings a second drained by `max: 1000` leases
/// showed in an unrelated queue's lease p99). Such a call commits each chunk of records and
/// lets a waiting call in before the next ([`Engine::let_others_in`]); it still waits for
/// the WAL once, for its last chunk. Each chunk is its own WAL frame, so a crash keeps or
/// loses a call's chunks separately: each task's record stands alone, so this is what the
/// same calls made one after another would leave.
pub(super) const LOCK_CHUNK_RECORDS: usize = 128;

impl Engine {
    pub(super) fn lock_state(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut state = self.core.state.lock();
        self.check_state(&mut state)?;
        Ok(state)
    }

    /// Refuses calls once the engine is poisoned, or a background WAL fsync failed.
    fn check_state(&self, state: &mut State) -> Result<()> {
        if state.poisoned.is_none() && self.core.wal.failed.load(Ordering::Acquire) {
            let reason = self.core.wal.failure.lock().clone().unwrap_or_default();
            state.poisoned = Some(reason);
        }
        state.check()
    }

    /// Between two chunks of a call: hands the state lock to a call waiting for it, if
    /// any, and takes it back after (see [`LOCK_CHUNK_RECORDS`]). What the call read before
    /// may have changed meanwhile; only its committed chunks are certain.
    pub(super) fn let_others_in(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
    ) -> Result<()> {
        parking_lot::MutexGuard::bump(state);
        self.check_state(state)
    }

    /// Commits a call's records and waits for them to be durable (a `delivery` call: written;
    /// see [`Engine::wait_durable`]).
    pub(super) fn commit(
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
        let ticket = state.commit(batch, &pending, &self.core.options)?;
        state.trim_far(keep, &self.core.options);
        let checkpoint_due = self.checkpoint_due(&state);
        drop(state);
        drop(pending);
        self.finish(ticket, delivery, checkpoint_due)
    }

    /// Commits one chunk of a call that lets others in between its chunks: applies the
    /// records and queues their frame for the WAL. Returns its ticket (`None`: nothing to
    /// write); the call then waits once, with [`Engine::finish_chunks`], for its last ticket.
    pub(super) fn commit_chunk(
        &self,
        state: &mut State,
        batch: WalBatch,
        pending: Vec<Pending>,
    ) -> Result<Option<u64>> {
        if pending.is_empty() {
            return Ok(None);
        }
        let keep = pending.first().map(|p| (p.uid, p.key));
        let ticket = state.commit(batch, &pending, &self.core.options)?;
        state.trim_far(keep, &self.core.options);
        Ok(Some(ticket))
    }

    /// Ends a call that committed in chunks: waits once, for its last chunk's ticket (`None`:
    /// it wrote nothing), as [`Engine::commit`] does for a call of one frame.
    pub(super) fn finish_chunks(
        &self,
        state: parking_lot::MutexGuard<'_, State>,
        last_ticket: Option<u64>,
        delivery: bool,
    ) -> Result<()> {
        let Some(ticket) = last_ticket else {
            return Ok(());
        };
        let checkpoint_due = self.checkpoint_due(&state);
        drop(state);
        self.finish(ticket, delivery, checkpoint_due)
    }

    /// Reads and decodes the files of buckets that `now_ms` is about to need without holding
    /// the state lock, so a large load in one queue does not stall calls on other queues. The bytes
    /// up to a bucket's flushed length never change while it exists (files are append-only
    /// and only cut at open), so reading them unlocked is safe; the rest is read under the
    /// lock by the load itself.
    pub(super) fn preload(&self, queue: &QueueName, now_ms: UnixMs) -> Result<()> {
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
    pub(super) fn change_state(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
        required: TaskState,
        make: impl FnOnce(u64) -> Record,
    ) -> Result<ChangeOutcome> {
        let mut state = self.lock_state()?;
        let (outcome, ticket) = self.stage_change(&mut state, queue, id, now_ms, required, make)?;
        self.finish_chunks(state, ticket, false)?;
        Ok(outcome)
    }

    /// Cancels many scheduled tasks of one queue (`Store::cancel_many`). Each cancel is
    /// applied as the single call applies it, one after another (a far bucket's bounds are
    /// then found over the cancels before it), with one hold of the lock per
    /// [`LOCK_CHUNK_RECORDS`] tasks and one wait at the end for all of them to be durable.
    pub(super) fn cancel_chunks(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        let mut state = self.lock_state()?;
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut last_ticket = None;
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 && i % LOCK_CHUNK_RECORDS == 0 {
                self.let_others_in(&mut state)?;
            }
            let cancel = |seq| Record::Cancel { seq };
            let (outcome, ticket) =
                self.stage_change(&mut state, queue, id, now_ms, TaskState::Scheduled, cancel)?;
            outcomes.push(outcome);
            last_ticket = ticket.or(last_ticket);
        }
        self.finish_chunks(state, last_ticket, false)?;
        Ok(outcomes)
    }

    /// [`Engine::change_state`] without the wait: applies the change and queues its frame
    /// for the WAL. Returns the outcome and the frame's ticket (`None`: nothing written).
    fn stage_change(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
        required: TaskState,
        make: impl FnOnce(u64) -> Record,
    ) -> Result<(ChangeOutcome, Option<u64>)> {
        let Some(target) = self.change_target(state, queue, id, Some(now_ms))? else {
            return Ok((ChangeOutcome::NotFound, None));
        };
        if target.state != required {
            return Ok((ChangeOutcome::WrongState(target.state), None));
        }
        let mut batch = WalBatch::new();
        let mut pending = Vec::new();
        let record = make(target.seq);
        let mut prior = target.prior;
        if let Some(prior) = prior.as_mut() {
            // Changing the last task at the bucket's earliest or latest due time: which task
            // is next is only known by reading the others (see `change_target`).
            let (q, _) = state.queue(queue)?;
            if q.holds_due_bound(target.key, prior.touch) {
                let add = match record {
                    Record::Reschedule { due_at_ms, .. } => Some(due_at_ms),
                    _ => None,
                };
                prior.bounds = Some(q.scan_bounds(target.key, target.seq, add)?);
            }
        }
        push(&mut batch, &mut pending, target.uid, target.key, record);
        if let Some(last) = pending.last_mut() {
            last.prior = prior;
        }
        let ticket = self.commit_chunk(state, batch, pending)?;
        Ok((ChangeOutcome::Ok, ticket))
    }

    /// Redrives or discards many dead letters of one queue (`Store::settle_dead`): one hold of
    /// the lock and one WAL frame per chunk of [`LOCK_CHUNK_RECORDS`], then one wait for the
    /// last chunk to be durable.
    pub(super) fn settle_dead_chunks(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        action: DeadAction,
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        let mut state = self.lock_state()?;
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut last_ticket = None;
        let settled_state = match action {
            DeadAction::Redrive => TaskState::Scheduled,
            DeadAction::Discard => TaskState::Cancelled,
        };
        for (i, chunk) in ids.chunks(LOCK_CHUNK_RECORDS).enumerate() {
            if i > 0 {
                self.let_others_in(&mut state)?;
            }
            let mut batch = WalBatch::new();
            let mut pending = Vec::with_capacity(chunk.len());
            // Records reach memory only at commit, so a task settled earlier in this chunk
            // still looks dead: answer a repeat as the single calls would.
            let mut settled = FxHashSet::default();
            for &id in chunk {
                let Some(target) = self.change_target(&mut state, queue, id, Some(now_ms))? else {
                    outcomes.push(ChangeOutcome::NotFound);
                    continue;
                };
                if target.state != TaskState::Dead {
                    outcomes.push(ChangeOutcome::WrongState(target.state));
                    continue;
                }
                if !settled.insert((target.seq, target.key)) {
                    outcomes.push(ChangeOutcome::WrongState(settled_state));
                    continue;
                }
                // A point index never holds a dead task (`Touch::can_hold`), so a dead one was
                // found in its loaded bucket.
                debug_assert!(target.prior.is_none());
                let seq = target.seq;
                let record = match action {
                    DeadAction::Redrive => Record::Redrive {
                        seq,
                        due_at_ms: now_ms,
                    },
                    DeadAction::Discard => Record::Cancel { seq },
                };
                push(&mut batch, &mut pending, target.uid, target.key, record);
                outcomes.push(ChangeOutcome::Ok);
            }
            last_ticket = self
                .commit_chunk(&mut state, batch, pending)?
                .or(last_ticket);
        }
        self.finish_chunks(state, last_ticket, false)?;
        Ok(outcomes)
    }

    /// The shared path of ack, nack, extend and dead_letter: check the lease, then append the
    /// one record `make` builds from the task's sequence number. A stale lease writes nothing.
    pub(super) fn change_lease(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
        make: impl FnOnce(u64, u32) -> Record,
    ) -> Result<LeaseOutcome> {
        let mut state = self.lock_state()?;
        let (uid, key, seq, attempts) = match self.leased(&mut state, queue, id, lease, now_ms)? {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        let mut batch = WalBatch::new();
        let mut pending = Vec::new();
        push(&mut batch, &mut pending, uid, key, make(seq, attempts));
        self.commit(state, batch, pending, true)?;
        Ok(LeaseOutcome::Ok)
    }

    /// Ends a lease in the dead letters; `untried`: the claim that took the lease found the
    /// task out of attempts, so its attempt is taken back (the record carries the count).
    pub(super) fn bury(
        &self,
        queue: &QueueName,
        (id, lease): (TaskId, LeaseId),
        reason: &str,
        now_ms: UnixMs,
        untried: bool,
    ) -> Result<LeaseOutcome> {
        self.change_lease(queue, id, lease, now_ms, |seq, attempts| Record::Dead {
            seq,
            reason: super::record::cut_reason(reason).to_owned(),
            attempts: untried.then(|| attempts.saturating_sub(1)),
        })
    }

    /// Finds a leased task and checks the lease; on success returns its queue's uid, its bucket
    /// key, seq and attempts.
    pub(super) fn leased(
        &self,
        state: &mut State,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<std::result::Result<(u64, u64, u64, u32), LeaseOutcome>> {
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        Ok(lease_in_force(q, stats, id, lease)?
            .map(|(key, seq, attempts)| (uid, key, seq, attempts)))
    }

    /// Finds a task for cancel or reschedule (or redrive), with its state: through its
    /// bucket's point index if the bucket is unloaded (then with what the change needs to
    /// apply without loading it), else from its loaded entry.
    pub(super) fn change_target(
        &self,
        state: &mut State,
        queue: &QueueName,
        id: TaskId,
        now_ms: Option<UnixMs>,
    ) -> Result<Option<ChangeTarget>> {
        let (q, stats) = match now_ms {
            Some(now) => state.queue_at(queue, now, self.core.options.lookahead_ms)?,
            None => state.queue(queue)?,
        };
        let uid = q.uid;
        let (seq, key) = split_id(id);
        if q.can_point(key) {
            let Some(found) = q.point(seq, key)? else {
                return Ok(None);
            };
            let prior = q.prior(&found);
            // Changing the last task at the bucket's earliest or latest due time needs the
            // other tasks' due times: read once without keeping them (`scan_bounds`), a few
            // times at most; past that (a sweep through a bucket in due order) the bucket is
            // loaded, so the next such changes are cheap.
            let at_bound = q.holds_due_bound(key, prior.touch);
            if !at_bound || q.may_scan_bounds(key) {
                return Ok(Some(ChangeTarget {
                    uid,
                    key,
                    seq,
                    state: prior.touch.state,
                    prior: Some(prior),
                }));
            }
        }
        let found = q.entry(seq, key, stats)?.map(|e| e.state);
        Ok(found.map(|state| ChangeTarget {
            uid,
            key,
            seq,
            state,
            prior: None,
        }))
    }
}

/// A task found for a change by [`Engine::change_target`].
pub(super) struct ChangeTarget {
    pub uid: u64,
    pub key: u64,
    pub seq: u64,
    pub state: TaskState,
    /// Set when the task was found through its unloaded bucket's point index.
    pub prior: Option<Prior>,
}

/// The live task of `q` whose idempotency key is `key`, if any: the memtable and the runs
/// name the tasks whose key has the same hash, and each candidate's put record says whether
/// its key is this one and the task whether it still holds it (read through the point index
/// of an unloaded bucket; other far candidates' buckets are loaded, and `trim_far` bounds
/// what stays loaded). Runs keep the entries of finished tasks, so a candidate may be gone.
pub(super) fn live_task_with_key(
    q: &mut Queue,
    stats: &mut EngineStats,
    runs: &KeyRuns,
    key: &str,
) -> Result<Option<Task>> {
    let hash = q.hasher.hash(key);
    let mut candidates: Vec<TaskId> = Vec::new();
    q.index.keys.candidates(hash, &mut candidates);
    runs.candidates(q.uid, hash, &mut candidates)?;
    candidates.sort_unstable();
    candidates.dedup();
    for id in candidates {
        let (seq, bucket) = split_id(id);
        if !q.buckets.contains_key(&bucket) {
            continue; // deleted once all its tasks finished
        }
        if let Some(task) = q.find_task(seq, bucket, stats)? {
            if task.idempotency_key.as_deref() == Some(key) && holds_key(task.state) {
                return Ok(Some(task));
            }
        }
    }
    Ok(None)
}

/// Whether a task in `state` still holds its idempotency key: finished tasks release it (the
/// `Store` contract lets their key be reused); dead-lettered ones keep it, since they may be
/// redriven.
fn holds_key(state: TaskState) -> bool {
    !matches!(
        state,
        TaskState::Done | TaskState::Cancelled | TaskState::Skipped
    )
}

/// Whether `lease` is the lease in force on task `id` of `q` (whose buckets near now are
/// loaded and expired leases ended): its `(key, seq)`, or the outcome to report.
pub(super) fn lease_in_force(
    q: &mut Queue,
    stats: &mut EngineStats,
    id: TaskId,
    lease: LeaseId,
) -> Result<std::result::Result<(u64, u64, u32), LeaseOutcome>> {
    let (seq, key) = split_id(id);
    let Some(entry) = q.entry(seq, key, stats)? else {
        return Ok(Err(LeaseOutcome::NotFound));
    };
    if entry.state != TaskState::Leased || entry.lease_id != lease.0 {
        return Ok(Err(LeaseOutcome::LeaseExpired));
    }
    Ok(Ok((key, seq, entry.attempts)))
}
