//! The in-memory reference store: obviously correct rather than fast, nothing durable.
//!
//! It is the model the embedded engine is checked against, and a store for tests of the layers
//! above. Finished tasks are kept forever.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use belfry_core::{
    LatePolicy, LeaseId, LeasedTask, NewTask, Priority, QueueName, Task, TaskId, TaskState, UnixMs,
    UserId,
};
use bytes::Bytes;
use parking_lot::Mutex;

use crate::store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MetaChange, PutOutcome, QueueCounts, Result, Store,
    StoreError,
};

#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    queues: BTreeMap<QueueName, QueueState>,
    meta: BTreeMap<(String, String), Bytes>,
    /// Subscriptions twice over: by set, and by user.
    by_set: BTreeSet<(u64, UserId)>,
    by_user: BTreeSet<(UserId, u64)>,
    next_id: u128,
    next_lease: u64,
}

/// The order in which scheduled tasks are claimed: due time, then submit order (ids grow).
type ReadyKey = (UnixMs, TaskId);

#[derive(Debug, Default)]
struct QueueState {
    config: Bytes,
    tasks: HashMap<TaskId, Stored>,
    by_key: HashMap<String, TaskId>,
    ready_high: BTreeSet<ReadyKey>,
    ready_normal: BTreeSet<ReadyKey>,
    /// Leased tasks by lease deadline.
    leases: BTreeSet<(UnixMs, TaskId)>,
    /// Leases ended by expiry that no claim has reported yet (`ClaimBatch::leases_expired`).
    leases_expired: u64,
}

#[derive(Debug, Clone)]
struct Stored {
    task: Task,
    lease: Option<LeaseId>,
}

impl QueueState {
    fn ready_set(&mut self, priority: Priority) -> &mut BTreeSet<ReadyKey> {
        match priority {
            Priority::High => &mut self.ready_high,
            Priority::Normal => &mut self.ready_normal,
        }
    }

    fn make_ready(&mut self, id: TaskId) {
        let (due, priority) = {
            let stored = &self.tasks[&id];
            (stored.task.due_at_ms, stored.task.priority)
        };
        self.ready_set(priority).insert((due, id));
    }

    fn unready(&mut self, id: TaskId) {
        let (due, priority) = {
            let stored = &self.tasks[&id];
            (stored.task.due_at_ms, stored.task.priority)
        };
        self.ready_set(priority).remove(&(due, id));
    }

    /// Ends every lease whose deadline is at or before `now_ms`: those tasks are scheduled again.
    fn expire_leases(&mut self, now_ms: UnixMs) {
        while let Some(&(until, id)) = self.leases.first() {
            if until > now_ms {
                break;
            }
            self.leases.pop_first();
            let stored = self.tasks.get_mut(&id).expect("leased task exists");
            debug_assert_eq!(stored.task.state, TaskState::Leased);
            stored.task.state = TaskState::Scheduled;
            stored.task.lease_until_ms = None;
            stored.lease = None;
            self.make_ready(id);
            self.leases_expired += 1;
        }
    }

    /// Finds a task leased under `lease` and ends that lease; the caller sets the new state.
    fn take_lease(&mut self, id: TaskId, lease: LeaseId, now_ms: UnixMs) -> LeaseOutcome {
        self.expire_leases(now_ms);
        let Some(stored) = self.tasks.get_mut(&id) else {
            return LeaseOutcome::NotFound;
        };
        if stored.task.state != TaskState::Leased || stored.lease != Some(lease) {
            return LeaseOutcome::LeaseExpired;
        }
        let until = stored
            .task
            .lease_until_ms
            .take()
            .expect("leased task has a deadline");
        stored.lease = None;
        self.leases.remove(&(until, id));
        LeaseOutcome::Ok
    }

    fn view(&self, id: TaskId) -> Option<Task> {
        self.tasks.get(&id).map(|stored| stored.task.clone())
    }
}

impl Inner {
    fn queue(&mut self, queue: &QueueName) -> Result<&mut QueueState> {
        self.queues
            .get_mut(queue)
            .ok_or_else(|| StoreError::QueueNotFound(queue.clone()))
    }
}

impl MemoryStore {
    /// Redrive and discard of dead task `id`: ends the leases that ran out first (so a task
    /// whose lease ran out is reported as scheduled, not leased, as cancel does), lets
    /// `change` make the task what it becomes, and makes it claimable if that is scheduled.
    fn settle_one(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
        change: impl FnOnce(&mut Task),
    ) -> Result<ChangeOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let Some(stored) = queue.tasks.get_mut(&id) else {
            return Ok(ChangeOutcome::NotFound);
        };
        if stored.task.state != TaskState::Dead {
            return Ok(ChangeOutcome::WrongState(stored.task.state));
        }
        stored.task.dead_reason = None;
        change(&mut stored.task);
        if stored.task.state == TaskState::Scheduled {
            queue.make_ready(id);
        }
        Ok(ChangeOutcome::Ok)
    }

    /// An empty store whose task ids start at a random number (see
    /// `EngineOptions::first_seq`: ids must not repeat across stores, nor across restarts of
    /// a server on this one). `MemoryStore::default()` counts from 0.
    pub fn new() -> Self {
        let store = Self::default();
        store.inner.lock().next_id = u128::from(crate::engine::random_first_seq());
        store
    }

    /// Ends a lease in the dead letters, taking back `untried` attempts (1 when the claim that
    /// took the lease found the task out of attempts).
    fn bury(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
        untried: u32,
    ) -> Result<LeaseOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let outcome = queue.take_lease(id, lease, now_ms);
        if outcome == LeaseOutcome::Ok {
            let stored = queue.tasks.get_mut(&id).expect("exists");
            stored.task.state = TaskState::Dead;
            stored.task.dead_reason = Some(reason.to_owned());
            stored.task.attempts = stored.task.attempts.saturating_sub(untried);
        }
        Ok(outcome)
    }
}

impl Store for MemoryStore {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        let mut inner = self.inner.lock();
        match inner.queues.get_mut(queue) {
            Some(state) => {
                state.config = config;
                Ok(false)
            }
            None => {
                let state = QueueState {
                    config,
                    ..QueueState::default()
                };
                inner.queues.insert(queue.clone(), state);
                Ok(true)
            }
        }
    }

    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>> {
        Ok(self
            .inner
            .lock()
            .queues
            .get(queue)
            .map(|q| q.config.clone()))
    }

    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>> {
        let inner = self.inner.lock();
        Ok(inner
            .queues
            .iter()
            .map(|(name, q)| (name.clone(), q.config.clone()))
            .collect())
    }

    fn delete_queue(&self, queue: &QueueName) -> Result<bool> {
        Ok(self.inner.lock().queues.remove(queue).is_some())
    }

    fn purge_queue(&self, queue: &QueueName) -> Result<bool> {
        let mut inner = self.inner.lock();
        let Some(state) = inner.queues.get_mut(queue) else {
            return Ok(false);
        };
        *state = QueueState {
            config: std::mem::take(&mut state.config),
            ..QueueState::default()
        };
        Ok(true)
    }

    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let mut inner = self.inner.lock();
        if let Some(missing) = tasks.iter().find(|t| !inner.queues.contains_key(&t.queue)) {
            return Err(StoreError::QueueNotFound(missing.queue.clone()));
        }
        let mut outcomes = Vec::with_capacity(tasks.len());
        for new in tasks {
            let id = TaskId(inner.next_id);
            let queue = inner.queue(&new.queue)?;
            if let Some(key) = &new.idempotency_key {
                if let Some(existing) = queue.by_key.get(key) {
                    let task = queue.view(*existing).expect("keyed task exists");
                    outcomes.push(PutOutcome::Duplicate(Box::new(task)));
                    continue;
                }
                queue.by_key.insert(key.clone(), id);
            }
            let due_at_ms = new.due_at_ms;
            let task = Task {
                id,
                queue: new.queue,
                due_at_ms,
                payload: new.payload,
                payload_kind: new.payload_kind,
                payload_dropped: false,
                headers: new.headers,
                priority: new.priority,
                idempotency_key: new.idempotency_key,
                late_policy: new.late_policy,
                target: new.target,
                state: TaskState::Scheduled,
                attempts: 0,
                lease_until_ms: None,
                dead_reason: None,
            };
            queue.tasks.insert(id, Stored { task, lease: None });
            queue.make_ready(id);
            inner.next_id += 1;
            outcomes.push(PutOutcome::Created { id, due_at_ms });
        }
        Ok(outcomes)
    }

    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        Ok(queue.view(id))
    }

    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        Ok(queue.by_key.get(key).and_then(|id| queue.view(*id)))
    }

    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let mut live: Vec<&Task> = queue
            .tasks
            .values()
            .map(|s| &s.task)
            .filter(|t| matches!(t.state, TaskState::Scheduled | TaskState::Leased))
            .filter(|t| after.is_none_or(|a| t.id > a))
            .collect();
        live.sort_by_key(|t| t.id);
        Ok(live.into_iter().take(limit).cloned().collect())
    }

    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let Some(stored) = queue.tasks.get(&id) else {
            return Ok(ChangeOutcome::NotFound);
        };
        if stored.task.state != TaskState::Scheduled {
            return Ok(ChangeOutcome::WrongState(stored.task.state));
        }
        queue.unready(id);
        queue.tasks.get_mut(&id).expect("exists").task.state = TaskState::Cancelled;
        Ok(ChangeOutcome::Ok)
    }

    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let Some(stored) = queue.tasks.get(&id) else {
            return Ok(ChangeOutcome::NotFound);
        };
        if stored.task.state != TaskState::Scheduled {
            return Ok(ChangeOutcome::WrongState(stored.task.state));
        }
        queue.unready(id);
        queue.tasks.get_mut(&id).expect("exists").task.due_at_ms = due_at_ms;
        queue.make_ready(id);
        Ok(ChangeOutcome::Ok)
    }

    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        let mut inner = self.inner.lock();
        let first_lease = inner.next_lease;
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let mut batch = ClaimBatch {
            leases_expired: std::mem::take(&mut queue.leases_expired),
            ..ClaimBatch::default()
        };
        let mut next_lease = first_lease;
        let lease_until_ms = now_ms.saturating_add(visibility_ms);
        while batch.leased.len() < max {
            let next = [Priority::High, Priority::Normal]
                .into_iter()
                .find_map(|p| {
                    let set = queue.ready_set(p);
                    set.first()
                        .copied()
                        .filter(|(due, _)| *due <= now_ms)
                        .map(|key| (p, key))
                });
            let Some((priority, key)) = next else { break };
            queue.ready_set(priority).remove(&key);
            let (due, id) = key;
            let stored = queue.tasks.get_mut(&id).expect("ready task exists");
            let late_ms = now_ms - due;
            match stored.task.late_policy {
                LatePolicy::Skip { after_ms } if late_ms > after_ms => {
                    stored.task.state = TaskState::Skipped;
                    batch.late_skipped.push(id);
                    continue;
                }
                LatePolicy::Dead { after_ms } if late_ms > after_ms => {
                    stored.task.state = TaskState::Dead;
                    stored.task.dead_reason = Some(format!(
                        "late by {late_ms} ms (late policy allows {after_ms} ms)"
                    ));
                    batch.late_dead.push(id);
                    continue;
                }
                _ => {}
            }
            let lease_id = LeaseId(next_lease);
            next_lease += 1;
            stored.task.state = TaskState::Leased;
            stored.task.attempts += 1;
            stored.task.lease_until_ms = Some(lease_until_ms);
            stored.lease = Some(lease_id);
            queue.leases.insert((lease_until_ms, id));
            batch.leased.push(LeasedTask {
                task: stored.task.clone(),
                lease_id,
                lease_until_ms,
            });
        }
        inner.next_lease = next_lease;
        Ok(batch)
    }

    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let outcome = queue.take_lease(id, lease, now_ms);
        if outcome == LeaseOutcome::Ok {
            queue.tasks.get_mut(&id).expect("exists").task.state = TaskState::Done;
        }
        Ok(outcome)
    }

    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let outcome = queue.take_lease(id, lease, now_ms);
        if outcome == LeaseOutcome::Ok {
            let stored = queue.tasks.get_mut(&id).expect("exists");
            stored.task.state = TaskState::Scheduled;
            stored.task.due_at_ms = retry_at_ms;
            queue.make_ready(id);
        }
        Ok(outcome)
    }

    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let outcome = queue.take_lease(id, lease, now_ms);
        if outcome == LeaseOutcome::Ok {
            let stored = queue.tasks.get_mut(&id).expect("exists");
            stored.task.lease_until_ms = Some(lease_until_ms);
            stored.lease = Some(lease);
            queue.leases.insert((lease_until_ms, id));
        }
        Ok(outcome)
    }

    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.bury(queue, id, lease, reason, now_ms, 0)
    }

    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.bury(queue, id, lease, reason, now_ms, 1)
    }

    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let mut dead: Vec<Task> = queue
            .tasks
            .values()
            .filter(|s| s.task.state == TaskState::Dead && after.is_none_or(|a| s.task.id > a))
            .map(|s| s.task.clone())
            .collect();
        dead.sort_by_key(|t| t.id);
        dead.truncate(limit);
        Ok(dead)
    }

    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.settle_one(queue, id, now_ms, |task| {
            task.state = TaskState::Scheduled;
            task.attempts = 0;
            task.due_at_ms = now_ms;
        })
    }

    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.settle_one(queue, id, now_ms, |task| task.state = TaskState::Cancelled)
    }

    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        queue.expire_leases(now_ms);
        let mut counts = QueueCounts::default();
        for stored in queue.tasks.values() {
            match stored.task.state {
                TaskState::Scheduled => {
                    counts.pending += 1;
                    if stored.task.due_at_ms <= now_ms {
                        counts.due += 1;
                    }
                }
                TaskState::Leased => counts.in_flight += 1,
                TaskState::Dead => counts.dead += 1,
                TaskState::Done | TaskState::Cancelled | TaskState::Skipped => {}
            }
        }
        // The ready sets hold every scheduled task (expired leases were put back above).
        counts.oldest_due_ms = [&queue.ready_high, &queue.ready_normal]
            .into_iter()
            .filter_map(|set| set.first().map(|(due, _)| *due))
            .filter(|due| *due <= now_ms)
            .min();
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
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let mut bins = vec![0u64; steps];
        for (due, _) in queue.ready_high.iter().chain(queue.ready_normal.iter()) {
            if *due >= from_ms {
                let bin = ((due - from_ms) / step_ms) as usize;
                if bin < steps {
                    bins[bin] += 1;
                }
            }
        }
        Ok(bins)
    }

    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        let mut inner = self.inner.lock();
        let queue = inner.queue(queue)?;
        let candidates = [
            queue.ready_high.first().map(|(due, _)| *due),
            queue.ready_normal.first().map(|(due, _)| *due),
            queue.leases.first().map(|(until, _)| *until),
        ];
        Ok(candidates.into_iter().flatten().min())
    }

    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()> {
        self.inner
            .lock()
            .meta
            .insert((namespace.to_owned(), key.to_owned()), value);
        Ok(())
    }

    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        Ok(self
            .inner
            .lock()
            .meta
            .get(&(namespace.to_owned(), key.to_owned()))
            .cloned())
    }

    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        Ok(self
            .inner
            .lock()
            .meta
            .remove(&(namespace.to_owned(), key.to_owned()))
            .is_some())
    }

    /// Under one hold of the lock: no other call sees some of the changes without the rest.
    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()> {
        let mut inner = self.inner.lock();
        for change in changes {
            let key = (change.namespace, change.key);
            match change.value {
                Some(value) => {
                    inner.meta.insert(key, value);
                }
                None => {
                    inner.meta.remove(&key);
                }
            }
        }
        Ok(())
    }

    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        let inner = self.inner.lock();
        Ok(inner
            .meta
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|((_, key), value)| (key.clone(), value.clone()))
            .collect())
    }

    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        let mut inner = self.inner.lock();
        let mut added = 0;
        for user in users {
            if inner.by_set.insert((set, user.clone())) {
                inner.by_user.insert((user.clone(), set));
                added += 1;
            }
        }
        Ok(added)
    }

    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        let mut inner = self.inner.lock();
        let mut removed = 0;
        for user in users {
            if inner.by_set.remove(&(set, user.clone())) {
                inner.by_user.remove(&(user.clone(), set));
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool> {
        Ok(self.inner.lock().by_set.contains(&(set, user.clone())))
    }

    fn subscriber_count(&self, set: u64) -> Result<u64> {
        let inner = self.inner.lock();
        Ok(inner.by_set.iter().filter(|(s, _)| *s == set).count() as u64)
    }

    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>> {
        let inner = self.inner.lock();
        Ok(inner
            .by_set
            .iter()
            .filter(|(s, user)| *s == set && after.is_none_or(|after| user > after))
            .take(limit)
            .map(|(_, user)| user.clone())
            .collect())
    }

    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        let inner = self.inner.lock();
        Ok(inner
            .by_user
            .iter()
            .filter(|(u, _)| u == user)
            .take(limit)
            .map(|(_, set)| *set)
            .collect())
    }

    fn drop_set(&self, set: u64) -> Result<u64> {
        let mut inner = self.inner.lock();
        let members: Vec<UserId> = inner
            .by_set
            .iter()
            .filter(|(s, _)| *s == set)
            .map(|(_, user)| user.clone())
            .collect();
        for user in &members {
            inner.by_set.remove(&(set, user.clone()));
            inner.by_user.remove(&(user.clone(), set));
        }
        Ok(members.len() as u64)
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
