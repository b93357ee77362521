//! The `Store` trait on the engine: each call validates under the state lock, builds its WAL
//! frame, and commits it through the shared paths of `calls.rs`.

use std::collections::HashMap;
use std::fs;

use belfry_core::{LatePolicy, LeaseId, LeasedTask, NewTask, QueueName, Task, TaskId, TaskState};
use belfry_core::{UnixMs, UserId, UserPage};
use bytes::Bytes;
use rustc_hash::FxHashSet;

use super::bucket::{bucket_for, split_id, task_id};
use super::calls::{
    lease_in_force, live_task_with_key, LEASE_RECORD_BYTES_HINT, LOCK_CHUNK_RECORDS,
};
use super::persist::{self, BucketMeta};
use super::queue::{Queue, TaskFacts};
use super::record::{self, PutRecord, Record, WalBatch};
use super::space::Use;
use super::{io, push, queue_dir, Engine, EngineOptions, State, META_FILE};
use crate::store::{
    ChangeOutcome, ClaimBatch, DeadAction, LeaseOutcome, MetaChange, PutOutcome, QueueCounts,
    Result, Store, StoreError, StoreHealth,
};

impl Store for Engine {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        self.core
            .space
            .admit(QUEUE_CHANGE_BYTES_HINT + config.len() as u64, Use::Growth)?;
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        let created = match meta.queues.get_mut(queue) {
            Some((_, existing)) => {
                *existing = config;
                false
            }
            None => {
                self.add_incarnation(&mut state, &mut meta, queue, config)?;
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
        drop_incarnation(&mut state, uid);
        Ok(true)
    }

    fn purge_queue(&self, queue: &QueueName) -> Result<bool> {
        let mut state = self.lock_state()?;
        let mut meta = state.meta.clone();
        let Some((old_uid, config)) = meta.queues.get(queue).cloned() else {
            return Ok(false);
        };
        // A new incarnation with the same configuration, named in one write of the meta file:
        // the old uid's files, WAL records and idempotency keys are ignored from then on, as
        // a deleted queue's are (see `delete_queue`).
        self.add_incarnation(&mut state, &mut meta, queue, config)?;
        meta.write(&self.core.dir.join(META_FILE))?;
        state.meta = meta;
        drop_incarnation(&mut state, old_uid);
        Ok(true)
    }

    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        // Sized before taking the lock: the frame is built once, without regrowing.
        let size: usize = tasks.iter().map(record::put_size_hint).sum();
        // Refused before anything changes when it would eat into the free-space reserve. The
        // records go to the WAL and, later, to their bucket files: twice the bytes.
        self.core.space.admit(2 * size as u64, Use::Growth)?;
        let mut batch = WalBatch::with_capacity(size);
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
                let (q, stats, runs) = state.queue_with_keys(&task.queue)?;
                if let Some(found) = live_task_with_key(q, stats, runs, k)? {
                    outcomes.push(PutOutcome::Duplicate(Box::new(found)));
                    continue;
                }
            }
            let seq = state.next_seq;
            state.next_seq += 1;
            let key = bucket_for(task.due_at_ms, last_now);
            let id = task_id(seq, key);
            if let Some(k) = &task.idempotency_key {
                batch_keys.insert((uid, k.clone()), scheduled_view(&task, id));
            }
            outcomes.push(PutOutcome::Created {
                id,
                due_at_ms: task.due_at_ms,
            });
            let put = put_record(seq, task);
            record::check_put(&put).map_err(StoreError::Invalid)?;
            push(&mut batch, &mut pending, uid, key, Record::Put(put));
        }
        self.commit(state, batch, pending, false)?;
        Ok(outcomes)
    }

    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        let mut state = self.lock_state()?;
        let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let uid = q.uid;
        let (seq, key) = split_id(id);
        let task = q.find_task(seq, key, stats)?;
        state.trim_far(Some((uid, key)), &self.core.options);
        Ok(task)
    }

    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        // Reads unloaded buckets without loading them (`listing.rs`).
        self.list_live(queue, after, limit, now_ms)
    }

    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        self.preload(queue, now_ms)?;
        let mut state = self.lock_state()?;
        state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        let (q, stats, runs) = state.queue_with_keys(queue)?;
        let found = live_task_with_key(q, stats, runs, key)?;
        state.trim_far(None, &self.core.options);
        Ok(found)
    }

    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Ending)?;
        self.change_state(queue, id, now_ms, TaskState::Scheduled, |seq| {
            Record::Cancel { seq }
        })
    }

    fn cancel_many(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = STATE_CHANGE_BYTES_HINT * ids.len() as u64;
        self.core.space.admit(bytes, Use::Ending)?;
        self.cancel_chunks(queue, ids, now_ms)
    }

    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        // Repeatable without end, so it grows the data: it respects the reserve.
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Growth)?;
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
        // Repeatable without end (a consumer that leases and never acks), so it stops at the
        // delivery floor, before the part of the reserve that acks and checkpoints need.
        let records = max.min(CLAIM_ADMIT_RECORDS_MAX) as u64;
        let bytes = 2 * records * LEASE_RECORD_BYTES_HINT as u64;
        self.core.space.admit(bytes, Use::Delivery)?;
        self.preload(queue, now_ms)?;
        let mut state = self.lock_state()?;
        let mut result = ClaimBatch::default();
        let mut last_ticket = None;
        loop {
            let want = max - result.leased.len();
            let options = &self.core.options;
            let times = (now_ms, visibility_ms);
            let chunk = claim_chunk(&mut state, queue, times, want, options, &mut result)?;
            let Some((ticket, more)) = chunk else {
                break;
            };
            last_ticket = Some(ticket);
            if !more || result.leased.len() >= max {
                break;
            }
            self.let_others_in(&mut state)?;
        }
        self.finish_chunks(state, last_ticket, true)?;
        Ok(result)
    }

    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Ending)?;
        self.change_lease(queue, id, lease, now_ms, |seq, _| Record::Done { seq })
    }

    /// The acks go in chunks of `LOCK_CHUNK_RECORDS`, each one WAL frame under one hold
    /// of the lock: replay applies a chunk's acks together or (frame lost or cut) not at all.
    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        if acks.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = acks.len() as u64 * STATE_CHANGE_BYTES_HINT;
        self.core.space.admit(bytes, Use::Ending)?;
        let mut state = self.lock_state()?;
        let mut outcomes = Vec::with_capacity(acks.len());
        // Records reach memory only at commit, so a task acked earlier in this chunk still
        // looks leased: remember it, and answer a repeat as a sequential ack would (the
        // task is done, so its lease is no longer in force).
        let mut acked: FxHashSet<(u64, u64)> =
            FxHashSet::with_capacity_and_hasher(acks.len(), Default::default());
        let mut last_ticket = None;
        for (i, chunk) in acks.chunks(LOCK_CHUNK_RECORDS).enumerate() {
            if i > 0 {
                self.let_others_in(&mut state)?;
            }
            let mut batch = WalBatch::with_capacity(chunk.len() * LEASE_RECORD_BYTES_HINT);
            let (q, stats) = state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
            let uid = q.uid;
            let mut pending = Vec::with_capacity(chunk.len());
            for &(id, lease) in chunk {
                let (key, seq, _) = match lease_in_force(q, stats, id, lease)? {
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
            last_ticket = self
                .commit_chunk(&mut state, batch, pending)?
                .or(last_ticket);
        }
        self.finish_chunks(state, last_ticket, true)?;
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
        // A nacked task is claimed again: repeatable without end, like a claim.
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Delivery)?;
        self.change_lease(queue, id, lease, now_ms, |seq, _| Record::Nack {
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
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Delivery)?;
        self.change_lease(queue, id, lease, now_ms, |seq, _| Record::Extend {
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
        self.core.space.admit(DEAD_RECORD_BYTES_HINT, Use::Ending)?;
        self.bury(queue, (id, lease), reason, now_ms, false)
    }

    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.core.space.admit(DEAD_RECORD_BYTES_HINT, Use::Ending)?;
        self.bury(queue, (id, lease), reason, now_ms, true)
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
        // A redriven task is delivered (and written) again: it respects the reserve.
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Growth)?;
        // With `now`, like cancel and reschedule: a lease that has run out is ended first, so
        // the state reported for a task that is not dead is the one `get` would show.
        self.change_state(queue, id, now_ms, TaskState::Dead, |seq| Record::Redrive {
            seq,
            due_at_ms: now_ms,
        })
    }

    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        // Ends a task, like an ack: bounded by what was dead-lettered.
        self.core
            .space
            .admit(STATE_CHANGE_BYTES_HINT, Use::Ending)?;
        self.change_state(queue, id, now_ms, TaskState::Dead, |seq| Record::Cancel {
            seq,
        })
    }

    fn settle_dead(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        action: DeadAction,
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let space = match action {
            DeadAction::Redrive => Use::Growth,
            DeadAction::Discard => Use::Ending,
        };
        let bytes = ids.len() as u64 * STATE_CHANGE_BYTES_HINT;
        self.core.space.admit(bytes, space)?;
        self.settle_dead_chunks(queue, ids, action, now_ms)
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
        // Unloaded buckets hold nothing due, so the ready index's first is the earliest.
        counts.oldest_due_ms = q
            .index
            .ready
            .iter()
            .filter_map(|set| set.first().map(|(due, _, _)| *due))
            .filter(|due| *due <= now_ms)
            .min();
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
        self.meta_write(vec![MetaChange::put(namespace, key, value)])
    }

    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        self.meta_get(namespace, key)
    }

    fn get_meta_many(&self, namespace: &str, keys: &[&str]) -> Result<Vec<Option<Bytes>>> {
        self.meta_get_many(namespace, keys)
    }

    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        self.meta_delete(namespace, key)
    }

    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        self.meta_list(namespace)
    }

    /// One WAL frame holding every change: after a crash all of them or none took effect.
    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()> {
        self.meta_write(changes)
    }

    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.subs_subscribe(set, users)
    }
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.subs_unsubscribe(set, users)
    }
    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool> {
        self.subs_contains(set, user)
    }
    fn subscriber_count(&self, set: u64) -> Result<u64> {
        self.subs_count(set)
    }
    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>> {
        let mut users = Vec::new();
        self.subs_members(set, after, limit, &mut users)?;
        Ok(users)
    }
    fn subscriber_page(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
        page: &mut UserPage,
    ) -> Result<()> {
        self.subs_members(set, after, limit, page)
    }
    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        self.subs_of_user(user, limit)
    }
    fn drop_set(&self, set: u64) -> Result<u64> {
        self.subs_drop(set)
    }
    fn flush(&self) -> Result<()> {
        self.core.checkpoint_and_compact()
    }

    /// Delivery records are written to the OS and fsync'd later in groups, unless
    /// `sync_delivery` makes each call wait for its fsync.
    fn delivery_is_quick(&self) -> bool {
        !self.core.options.sync_delivery
    }

    /// Also no bucket to load first: none of the queue's unloaded buckets has anything due or
    /// expiring within the lookahead (a claim a moment later may still find one that just
    /// came near: near buckets are minute-wide, so that load is small).
    fn claim_is_quick(&self, queue: &QueueName, now_ms: UnixMs) -> bool {
        if self.core.options.sync_delivery {
            return false;
        }
        let horizon = now_ms.saturating_add(self.core.options.lookahead_ms);
        let Ok(mut state) = self.lock_state() else {
            return false;
        };
        state
            .queue(queue)
            .is_ok_and(|(q, _)| q.woken(horizon).is_empty())
    }

    /// Metadata is in memory; a user's sets are one block read from each subscription run
    /// (a handful once merged), from files a recent read or write has most likely cached.
    fn reads_are_quick(&self) -> bool {
        true
    }

    fn health(&self) -> StoreHealth {
        Engine::health(self)
    }
}

/// Bytes a queue change may write, besides its config: the queue's directory and the
/// rewritten `meta` file (the reserve check only needs the order of magnitude).
const QUEUE_CHANGE_BYTES_HINT: u64 = 16 * 1024;
/// Bytes a reschedule or redrive writes: one small record, in the WAL and its bucket file.
const STATE_CHANGE_BYTES_HINT: u64 = 2 * LEASE_RECORD_BYTES_HINT as u64;
/// Bytes a dead letter writes: its record carries a reason (cut to a bound) besides.
const DEAD_RECORD_BYTES_HINT: u64 =
    STATE_CHANGE_BYTES_HINT + 2 * record::DEAD_REASON_BYTES_MAX as u64;
/// A claim is admitted for at most this many records: the check is an estimate against a
/// floor of megabytes, and a `max` in the millions must not refuse a claim that finds a few.
const CLAIM_ADMIT_RECORDS_MAX: usize = 4 * 1024;

/// A task a claim leased: `(seq, bucket key, lease id, due, attempts, put offset, put
/// length)`, all its view needs besides its put record.
type Claimed = (u64, u64, u64, UnixMs, u32, u64, u32);

/// One hold of the state lock in a claim: leases up to `want` of the queue's due tasks
/// (high priority first, each in due order), looking at most [`LOCK_CHUNK_RECORDS`] of
/// them, and commits their records. Tasks found later than their late policy allows get a
/// Skipped or Dead record instead, and do not count towards `want`. Returns the chunk's WAL
/// ticket, and whether more due tasks may be left; `None` if it wrote nothing.
fn claim_chunk(
    state: &mut State,
    queue: &QueueName,
    (now_ms, visibility_ms): (UnixMs, u64),
    want: usize,
    options: &EngineOptions,
    result: &mut ClaimBatch,
) -> Result<Option<(u64, bool)>> {
    let mut next_lease = state.next_lease;
    let (q, _) = state.queue_at(queue, now_ms, options.lookahead_ms)?;
    result.leases_expired += std::mem::take(&mut q.leases_expired);
    let uid = q.uid;
    let lease_until_ms = now_ms.saturating_add(visibility_ms);
    let ready: usize = q.index.ready.iter().map(|slot| slot.len()).sum();
    let room = want.min(LOCK_CHUNK_RECORDS).min(ready);
    let mut batch = WalBatch::with_capacity(room * LEASE_RECORD_BYTES_HINT);
    let mut pending = Vec::with_capacity(room);
    // (seq, key, lease id, due, attempts, put offset, put length): all a leased task's
    // view needs besides its put record, so the entry is looked up once here.
    let mut leased: Vec<Claimed> = Vec::with_capacity(room);
    // Due tasks, high priority first, each in due order. They are only read here: their
    // records take them out of the ready index when applied at commit.
    let due = q.index.ready.iter().flat_map(|slot| {
        slot.iter()
            .take_while(move |(due, _, _)| *due <= now_ms)
            .copied()
    });
    let mut more = false;
    for (due, seq, key) in due {
        if leased.len() == want {
            break;
        }
        if pending.len() == LOCK_CHUNK_RECORDS {
            more = true;
            break;
        }
        let Some(entry) = q.loaded_entry(seq, key) else {
            debug_assert!(false, "ready entry missing");
            continue;
        };
        if let Some(record) = late_record(entry.late_policy, seq, now_ms - due) {
            let late = match record {
                Record::Skipped { .. } => &mut result.late_skipped,
                _ => &mut result.late_dead,
            };
            late.push(task_id(seq, key));
            push(&mut batch, &mut pending, uid, key, record);
            continue;
        }
        let lease_id = next_lease;
        next_lease += 1;
        let attempts = entry.attempts.saturating_add(1);
        let (offset, len) = (entry.put_offset, entry.put_len);
        leased.push((seq, key, lease_id, due, attempts, offset, len));
        let record = Record::Lease {
            seq,
            lease_id,
            until_ms: lease_until_ms,
            attempts,
        };
        push(&mut batch, &mut pending, uid, key, record);
    }
    state.next_lease = next_lease;
    if pending.is_empty() {
        return Ok(None);
    }
    let ticket = state.commit(batch, &pending, options)?;
    let (q, _) = state.queue(queue)?;
    result
        .leased
        .extend(leased_tasks(q, leased, lease_until_ms)?);
    Ok(Some((ticket, more)))
}

/// The views of the tasks a claim leased, their put records read bucket by bucket in file
/// order.
fn leased_tasks(
    q: &mut Queue,
    leased: Vec<Claimed>,
    lease_until_ms: UnixMs,
) -> Result<Vec<LeasedTask>> {
    let spots: Vec<(u64, u64, u32)> = leased
        .iter()
        .map(|&(_, key, _, _, _, offset, len)| (key, offset, len))
        .collect();
    let puts = q.read_puts(&spots)?;
    let mut tasks = Vec::with_capacity(puts.len());
    for (put, (seq, key, lease_id, due, attempts, _, _)) in puts.into_iter().zip(leased) {
        let facts = TaskFacts {
            due,
            state: TaskState::Leased,
            attempts,
            until: Some(lease_until_ms),
            dead_reason: None,
        };
        tasks.push(LeasedTask {
            task: q.task(seq, key, put, facts)?,
            lease_id: LeaseId(lease_id),
            lease_until_ms,
        });
    }
    Ok(tasks)
}

/// How a task just put looks (what a later duplicate in the same batch reports).
fn scheduled_view(task: &NewTask, id: TaskId) -> Task {
    Task {
        id,
        queue: task.queue.clone(),
        due_at_ms: task.due_at_ms,
        payload: task.payload.clone(),
        payload_kind: task.payload_kind,
        payload_dropped: false,
        headers: task.headers.clone(),
        priority: task.priority,
        idempotency_key: task.idempotency_key.clone(),
        late_policy: task.late_policy,
        target: task.target.clone(),
        state: TaskState::Scheduled,
        attempts: 0,
        lease_until_ms: None,
        dead_reason: None,
    }
}

impl Engine {
    /// A new incarnation of queue `name` (a new uid, its directory, its in-memory side), named
    /// in `meta` for the caller to write: what creating a queue and purging one both make.
    fn add_incarnation(
        &self,
        state: &mut State,
        meta: &mut persist::MetaFile,
        name: &QueueName,
        config: Bytes,
    ) -> Result<()> {
        let uid = meta.next_queue_uid;
        meta.next_queue_uid += 1;
        let qdir = queue_dir(&self.core.dir, uid);
        fs::create_dir_all(&qdir).map_err(io("create a queue directory"))?;
        persist::sync_dir(&self.core.dir)?;
        meta.queues.insert(name.clone(), (uid, config));
        let hasher = state.key_hasher;
        state
            .queues
            .insert(uid, Queue::new(name.clone(), uid, qdir, hasher));
        Ok(())
    }
}

/// Forgets incarnation `uid` of a queue, which the meta file no longer names (deleted, or
/// purged), and removes its files. The meta file is the truth: once it no longer names the
/// uid, its files and WAL records are ignored, so a removal that fails waits for the next
/// open.
fn drop_incarnation(state: &mut State, uid: u64) {
    if let Some(q) = state.queues.remove(&uid) {
        let buffered: usize = q.buckets.values().map(|b| b.buf.len()).sum();
        state.buffered_bytes -= buffered;
        if let Err(error) = fs::remove_dir_all(&q.dir) {
            tracing::warn!(%error, dir = %q.dir.display(), "could not remove the files of a deleted or purged queue; they go at the next open");
        }
    }
}

fn put_record(seq: u64, task: NewTask) -> PutRecord {
    PutRecord {
        seq,
        due_at_ms: task.due_at_ms,
        priority: task.priority,
        payload_kind: task.payload_kind,
        late_policy: task.late_policy,
        idempotency_key: task.idempotency_key,
        target: task.target,
        headers: task.headers,
        payload: task.payload,
    }
}

/// What a claim does instead of leasing a task found `late_ms` after its due time, if its
/// late policy says so: finish it undelivered (`Skipped`) or dead-letter it.
fn late_record(policy: LatePolicy, seq: u64, late_ms: u64) -> Option<Record> {
    match policy {
        LatePolicy::Skip { after_ms } if late_ms > after_ms => Some(Record::Skipped { seq }),
        LatePolicy::Dead { after_ms } if late_ms > after_ms => Some(Record::Dead {
            seq,
            reason: format!("late by {late_ms} ms (late policy allows {after_ms} ms)"),
            attempts: None,
        }),
        _ => None,
    }
}
