//! What the schedule service tests share: the instants, the queue, a service over the
//! reference store, and a store that fails cursor writes on demand.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId};
use belfry_schedule::{ScheduleId, ScheduleService, CURSORS_NAMESPACE};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MemoryStore, PutOutcome, QueueCounts, Store,
    StoreError,
};
use bytes::Bytes;

/// 2026-11-22T00:00:00Z, a Sunday.
pub const T0: UnixMs = 1_795_305_600_000;
pub const SECOND: u64 = 1_000;
pub const MINUTE: u64 = 60 * SECOND;
pub const HOUR: u64 = 60 * MINUTE;
pub const DAY: u64 = 24 * HOUR;

pub fn queue() -> QueueName {
    QueueName::new("jobs").unwrap()
}

pub fn id(text: &str) -> ScheduleId {
    ScheduleId::new(text).unwrap()
}

pub fn setup() -> (Arc<MemoryStore>, ScheduleService) {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    (store, service)
}

/// Due times of the scheduled tasks in the queue, via claiming everything due by `until`.
pub fn claim_all(store: &MemoryStore, until: UnixMs) -> Vec<Task> {
    let batch = store.claim(&queue(), until, 100_000, 60_000).unwrap();
    batch.leased.into_iter().map(|leased| leased.task).collect()
}

pub fn due_times(store: &MemoryStore, until: UnixMs) -> Vec<UnixMs> {
    claim_all(store, until)
        .into_iter()
        .map(|t| t.due_at_ms)
        .collect()
}

/// Delegates to a `MemoryStore`, but fails the next `failures` cursor writes, as if the
/// process died right after the tasks were put.
pub struct CrashingStore {
    pub inner: MemoryStore,
    pub failures: AtomicU32,
}

impl Store for CrashingStore {
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> belfry_store::Result<()> {
        if namespace == CURSORS_NAMESPACE
            && self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(StoreError::Io {
                context: "persist the schedule cursor",
                source: std::io::Error::other("simulated crash"),
            });
        }
        self.inner.put_meta(namespace, key, value)
    }

    fn put_queue(&self, queue: &QueueName, config: Bytes) -> belfry_store::Result<bool> {
        self.inner.put_queue(queue, config)
    }
    fn get_queue(&self, queue: &QueueName) -> belfry_store::Result<Option<Bytes>> {
        self.inner.get_queue(queue)
    }
    fn list_queues(&self) -> belfry_store::Result<Vec<(QueueName, Bytes)>> {
        self.inner.list_queues()
    }
    fn delete_queue(&self, queue: &QueueName) -> belfry_store::Result<bool> {
        self.inner.delete_queue(queue)
    }
    fn put(&self, tasks: Vec<NewTask>) -> belfry_store::Result<Vec<PutOutcome>> {
        self.inner.put(tasks)
    }
    fn get(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<Option<Task>> {
        self.inner.get(queue, id, now_ms)
    }
    fn get_by_key(
        &self,
        queue: &QueueName,
        key: &str,
        now_ms: UnixMs,
    ) -> belfry_store::Result<Option<Task>> {
        self.inner.get_by_key(queue, key, now_ms)
    }
    fn cancel(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.cancel(queue, id, now_ms)
    }
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.reschedule(queue, id, due_at_ms, now_ms)
    }
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> belfry_store::Result<ClaimBatch> {
        self.inner.claim(queue, now_ms, max, visibility_ms)
    }
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.ack(queue, id, lease, now_ms)
    }
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.nack(queue, id, lease, retry_at_ms, now_ms)
    }
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.extend(queue, id, lease, lease_until_ms, now_ms)
    }
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.dead_letter(queue, id, lease, reason, now_ms)
    }
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> belfry_store::Result<Vec<Task>> {
        self.inner.list_dead(queue, after, limit)
    }
    fn redrive(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.redrive(queue, id, now_ms)
    }
    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> belfry_store::Result<QueueCounts> {
        self.inner.counts(queue, now_ms)
    }
    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> belfry_store::Result<Vec<u64>> {
        self.inner.forecast(queue, from_ms, step_ms, steps)
    }
    fn next_due_ms(&self, queue: &QueueName) -> belfry_store::Result<Option<UnixMs>> {
        self.inner.next_due_ms(queue)
    }
    fn get_meta(&self, namespace: &str, key: &str) -> belfry_store::Result<Option<Bytes>> {
        self.inner.get_meta(namespace, key)
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> belfry_store::Result<bool> {
        self.inner.delete_meta(namespace, key)
    }
    fn list_meta(&self, namespace: &str) -> belfry_store::Result<Vec<(String, Bytes)>> {
        self.inner.list_meta(namespace)
    }
    fn subscribe(&self, set: u64, users: &[UserId]) -> belfry_store::Result<u64> {
        self.inner.subscribe(set, users)
    }
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> belfry_store::Result<u64> {
        self.inner.unsubscribe(set, users)
    }
    fn is_subscribed(&self, set: u64, user: &UserId) -> belfry_store::Result<bool> {
        self.inner.is_subscribed(set, user)
    }
    fn subscriber_count(&self, set: u64) -> belfry_store::Result<u64> {
        self.inner.subscriber_count(set)
    }
    fn subscribers(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
    ) -> belfry_store::Result<Vec<UserId>> {
        self.inner.subscribers(set, after, limit)
    }
    fn user_sets(&self, user: &UserId, limit: usize) -> belfry_store::Result<Vec<u64>> {
        self.inner.user_sets(user, limit)
    }
    fn drop_set(&self, set: u64) -> belfry_store::Result<u64> {
        self.inner.drop_set(set)
    }
    fn flush(&self) -> belfry_store::Result<()> {
        self.inner.flush()
    }
}
