//! The simulated server's store: the embedded engine on a real directory, one server
//! generation at a time, with injected latency, and every call reported to the model.
//!
//! Calls run one at a time under one lock, and the model is told of each call's answer before
//! the lock is released, so it sees the calls in the order they took effect. A crash takes the
//! engine out (`Engine::abandon`: no final fsync, no checkpoint, as after `kill -9`); the
//! dead generation's calls then fail, and the next generation reopens the directory.
//!
//! Latency: a store call cannot move tokio's paused clock (a blocking call holds auto-advance
//! back), so an injected delay moves the wall clock forward instead, after the call — the
//! caller gets its answer later than the `now_ms` it passed, which is what a slow store does
//! to leases and due times.

use std::sync::Arc;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId};
use belfry_store::{
    ChangeOutcome, ClaimBatch, Engine, LeaseOutcome, MetaChange, PutOutcome, QueueCounts, Result,
    Store, StoreError,
};
use bytes::Bytes;
use parking_lot::Mutex;

use super::clock::SimClock;
use super::model::{Change, LeaseCall, Model};
use super::rng::hash;

/// What every generation's store shares: the model, the clock and the latency plan.
pub struct Shared {
    pub model: Mutex<Model>,
    pub clock: SimClock,
    pub seed: u64,
    /// Store calls delayed, per thousand.
    pub store_latency_per_mille: u64,
    /// Longest injected store delay, in milliseconds.
    pub store_latency_max_ms: u64,
}

/// One server generation's store.
pub struct SimStore {
    engine: Mutex<Option<Engine>>,
    shared: Arc<Shared>,
}

impl SimStore {
    pub fn new(engine: Engine, shared: Arc<Shared>) -> Arc<SimStore> {
        Arc::new(SimStore {
            engine: Mutex::new(Some(engine)),
            shared,
        })
    }

    /// The process dies: no call in flight (they hold the lock), none from now on.
    pub fn kill(&self) -> Option<Engine> {
        self.engine.lock().take()
    }

    /// Runs a call on the engine; `report` tells the model its answer (under the same lock).
    fn call<T>(
        &self,
        what: u64,
        key: u64,
        run: impl FnOnce(&Engine) -> Result<T>,
        report: impl FnOnce(&mut Model, &T),
    ) -> Result<T> {
        let engine = self.engine.lock();
        let Some(engine) = engine.as_ref() else {
            return Err(StoreError::Closed);
        };
        let answer = run(engine)?;
        let mut model = self.shared.model.lock();
        report(&mut model, &answer);
        let calm = model.calm;
        drop(model);
        if !calm {
            let roll = hash(&[self.shared.seed, 2, what, key]);
            if roll % 1_000 < self.shared.store_latency_per_mille {
                let delay = (roll >> 16) % (self.shared.store_latency_max_ms + 1);
                self.shared.clock.step(delay as i64);
            }
        }
        Ok(answer)
    }

    fn plain<T>(&self, what: u64, run: impl FnOnce(&Engine) -> Result<T>) -> Result<T> {
        self.call(what, 0, run, |_, _| {})
    }
}

fn id_key(id: TaskId) -> u64 {
    (id.0 as u64) ^ ((id.0 >> 64) as u64)
}

impl Store for SimStore {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        self.plain(1, |e| e.put_queue(queue, config))
    }
    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>> {
        self.plain(2, |e| e.get_queue(queue))
    }
    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>> {
        self.plain(3, |e| e.list_queues())
    }
    fn delete_queue(&self, queue: &QueueName) -> Result<bool> {
        self.plain(4, |e| e.delete_queue(queue))
    }
    /// Not driven by the simulation (its model has no purge).
    fn purge_queue(&self, queue: &QueueName) -> Result<bool> {
        self.plain(35, |e| e.purge_queue(queue))
    }
    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let key = tasks.first().map_or(0, |t| t.due_at_ms);
        let asked = tasks.clone();
        self.call(
            5,
            key,
            |e| e.put(tasks),
            |m, outcomes| m.on_put(&asked, outcomes),
        )
    }
    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        self.call(
            6,
            id_key(id) ^ now_ms,
            |e| e.get(queue, id, now_ms),
            |m, task| m.on_get(queue, id, now_ms, task.as_ref()),
        )
    }
    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        self.call(
            7,
            now_ms,
            |e| e.get_by_key(queue, key, now_ms),
            |m, _| m.observe(queue, now_ms),
        )
    }
    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.call(
            8,
            id_key(id) ^ now_ms,
            |e| e.cancel(queue, id, now_ms),
            |m, outcome| m.on_change(queue, id, now_ms, Change::Cancel, *outcome),
        )
    }
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        let change = Change::Reschedule { due_at_ms };
        self.call(
            26,
            id_key(id) ^ now_ms,
            |e| e.reschedule(queue, id, due_at_ms, now_ms),
            |m, outcome| m.on_change(queue, id, now_ms, change, *outcome),
        )
    }
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        let key = now_ms ^ (max as u64) << 48 ^ queue.as_str().len() as u64;
        self.call(
            9,
            key,
            |e| e.claim(queue, now_ms, max, visibility_ms),
            |m, batch| {
                let clock_ms = self.shared.clock.now_ms();
                m.on_claim(queue, (now_ms, clock_ms), max, visibility_ms, batch)
            },
        )
    }
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        self.call(
            10,
            id_key(id) ^ now_ms,
            |e| e.ack(queue, id, lease, now_ms),
            |m, outcome| m.on_lease_call(queue, id, lease, now_ms, LeaseCall::Ack, *outcome),
        )
    }
    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        let key = acks.first().map_or(0, |(id, _)| id_key(*id)) ^ now_ms;
        self.call(
            11,
            key,
            |e| e.ack_many(queue, acks, now_ms),
            |m, outcomes| {
                for (&(id, lease), outcome) in acks.iter().zip(outcomes) {
                    m.on_lease_call(queue, id, lease, now_ms, LeaseCall::Ack, *outcome);
                }
            },
        )
    }
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let call = LeaseCall::Nack { at_ms: retry_at_ms };
        self.call(
            12,
            id_key(id) ^ now_ms,
            |e| e.nack(queue, id, lease, retry_at_ms, now_ms),
            |m, outcome| m.on_lease_call(queue, id, lease, now_ms, call, *outcome),
        )
    }
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let call = LeaseCall::Extend {
            until_ms: lease_until_ms,
        };
        self.call(
            13,
            id_key(id) ^ now_ms,
            |e| e.extend(queue, id, lease, lease_until_ms, now_ms),
            |m, outcome| m.on_lease_call(queue, id, lease, now_ms, call, *outcome),
        )
    }
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let call = LeaseCall::Dead { reason };
        self.call(
            14,
            id_key(id) ^ now_ms,
            |e| e.dead_letter(queue, id, lease, reason, now_ms),
            |m, outcome| m.on_lease_call(queue, id, lease, now_ms, call, *outcome),
        )
    }
    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let call = LeaseCall::DeadUntried { reason };
        self.call(
            33,
            id_key(id) ^ now_ms,
            |e| e.dead_letter_untried(queue, id, lease, reason, now_ms),
            |m, outcome| m.on_lease_call(queue, id, lease, now_ms, call, *outcome),
        )
    }
    /// Not driven by the simulation (its model lists no live tasks).
    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        self.plain(36, |e| e.list_tasks(queue, after, limit, now_ms))
    }
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        self.plain(15, |e| e.list_dead(queue, after, limit))
    }
    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.call(
            16,
            id_key(id) ^ now_ms,
            |e| e.redrive(queue, id, now_ms),
            |m, outcome| m.on_change(queue, id, now_ms, Change::Redrive, *outcome),
        )
    }
    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.call(
            34,
            id_key(id) ^ now_ms,
            |e| e.discard_dead(queue, id, now_ms),
            |m, outcome| m.on_change(queue, id, now_ms, Change::Discard, *outcome),
        )
    }
    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        self.call(
            17,
            now_ms,
            |e| e.counts(queue, now_ms),
            |m, _| m.observe(queue, now_ms),
        )
    }
    fn forecast(
        &self,
        queue: &QueueName,
        from: UnixMs,
        step: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        self.plain(18, |e| e.forecast(queue, from, step, steps))
    }
    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        self.call(
            19,
            0,
            |e| e.next_due_ms(queue),
            |m, got| m.on_next_due(queue, *got),
        )
    }
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()> {
        self.plain(20, |e| e.put_meta(namespace, key, value))
    }
    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        self.plain(21, |e| e.get_meta(namespace, key))
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        self.plain(22, |e| e.delete_meta(namespace, key))
    }
    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        self.plain(23, |e| e.list_meta(namespace))
    }
    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()> {
        self.plain(24, |e| e.write_meta(changes))
    }
    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.plain(26, |e| e.subscribe(set, users))
    }
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.plain(27, |e| e.unsubscribe(set, users))
    }
    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool> {
        self.plain(28, |e| e.is_subscribed(set, user))
    }
    fn subscriber_count(&self, set: u64) -> Result<u64> {
        self.plain(29, |e| e.subscriber_count(set))
    }
    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>> {
        self.plain(30, |e| e.subscribers(set, after, limit))
    }
    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        self.plain(31, |e| e.user_sets(user, limit))
    }
    fn drop_set(&self, set: u64) -> Result<u64> {
        self.plain(32, |e| e.drop_set(set))
    }
    fn flush(&self) -> Result<()> {
        self.plain(25, |e| e.flush())
    }
}
