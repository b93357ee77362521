//! A store that wraps another to inject slowness and failures, and a sink factory whose
//! sinks record every delivery: for dispatcher and schedule tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId};
use belfry_sinks::{Outcome, Sink, SinkError, SinkFactory, SinkFuture, SinkSpec};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MetaChange, PutOutcome, QueueCounts, Store, StoreError,
};
use bytes::Bytes;
use parking_lot::Mutex;

/// Wraps a store: `counts` can be made slow (to hold API admission slots), and `write_meta`
/// can be made to fail a number of times (a crash between a tick's puts and its cursors).
/// It notes how many tasks each `put` held.
pub struct FaultyStore {
    pub inner: Arc<dyn Store>,
    pub counts_delay_ms: AtomicU64,
    pub write_meta_failures: AtomicUsize,
    pub puts: Mutex<Vec<usize>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            counts_delay_ms: AtomicU64::new(0),
            write_meta_failures: AtomicUsize::new(0),
            puts: Mutex::new(Vec::new()),
        })
    }
}

impl Store for FaultyStore {
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
        self.puts.lock().push(tasks.len());
        self.inner.put(tasks)
    }
    fn get(&self, q: &QueueName, id: TaskId, now: UnixMs) -> belfry_store::Result<Option<Task>> {
        self.inner.get(q, id, now)
    }
    fn get_by_key(
        &self,
        q: &QueueName,
        key: &str,
        now: UnixMs,
    ) -> belfry_store::Result<Option<Task>> {
        self.inner.get_by_key(q, key, now)
    }
    fn cancel(
        &self,
        q: &QueueName,
        id: TaskId,
        now: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.cancel(q, id, now)
    }
    fn reschedule(
        &self,
        q: &QueueName,
        id: TaskId,
        due: UnixMs,
        now: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.reschedule(q, id, due, now)
    }
    fn claim(
        &self,
        q: &QueueName,
        now: UnixMs,
        max: usize,
        vis: u64,
    ) -> belfry_store::Result<ClaimBatch> {
        self.inner.claim(q, now, max, vis)
    }
    fn ack(
        &self,
        q: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.ack(q, id, lease, now)
    }
    fn ack_many(
        &self,
        q: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now: UnixMs,
    ) -> belfry_store::Result<Vec<LeaseOutcome>> {
        self.inner.ack_many(q, acks, now)
    }
    fn nack(
        &self,
        q: &QueueName,
        id: TaskId,
        lease: LeaseId,
        at: UnixMs,
        now: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.nack(q, id, lease, at, now)
    }
    fn extend(
        &self,
        q: &QueueName,
        id: TaskId,
        lease: LeaseId,
        until: UnixMs,
        now: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.extend(q, id, lease, until, now)
    }
    fn dead_letter(
        &self,
        q: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.dead_letter(q, id, lease, reason, now)
    }
    fn list_dead(
        &self,
        q: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> belfry_store::Result<Vec<Task>> {
        self.inner.list_dead(q, after, limit)
    }
    fn redrive(
        &self,
        q: &QueueName,
        id: TaskId,
        now: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.redrive(q, id, now)
    }
    fn counts(&self, q: &QueueName, now: UnixMs) -> belfry_store::Result<QueueCounts> {
        let delay = self.counts_delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        self.inner.counts(q, now)
    }
    fn forecast(
        &self,
        q: &QueueName,
        from: UnixMs,
        step: u64,
        steps: usize,
    ) -> belfry_store::Result<Vec<u64>> {
        self.inner.forecast(q, from, step, steps)
    }
    fn next_due_ms(&self, q: &QueueName) -> belfry_store::Result<Option<UnixMs>> {
        self.inner.next_due_ms(q)
    }
    fn put_meta(&self, ns: &str, key: &str, value: Bytes) -> belfry_store::Result<()> {
        self.inner.put_meta(ns, key, value)
    }
    fn get_meta(&self, ns: &str, key: &str) -> belfry_store::Result<Option<Bytes>> {
        self.inner.get_meta(ns, key)
    }
    fn delete_meta(&self, ns: &str, key: &str) -> belfry_store::Result<bool> {
        self.inner.delete_meta(ns, key)
    }
    fn list_meta(&self, ns: &str) -> belfry_store::Result<Vec<(String, Bytes)>> {
        self.inner.list_meta(ns)
    }
    fn write_meta(&self, changes: Vec<MetaChange>) -> belfry_store::Result<()> {
        let fail = self
            .write_meta_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(StoreError::Io {
                context: "write metadata (injected failure)",
                source: std::io::Error::other("injected"),
            });
        }
        self.inner.write_meta(changes)
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

/// One delivery a [`RecordingSink`] saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub queue: String,
    pub task: TaskId,
    pub attempt: u32,
    pub due_at_ms: UnixMs,
    /// The dispatcher's (manual) wall clock at delivery.
    pub now_ms: UnixMs,
}

/// Delivers everything, after an optional real-time delay, and records each delivery in the
/// order the sink was called.
#[derive(Default)]
pub struct RecordingSink {
    pub seen: Mutex<Vec<Seen>>,
    pub delay_ms: AtomicU64,
}

impl RecordingSink {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().len()
    }
}

/// The one shared sink of a [`RecordingSinks`] factory, as each queue's sink.
struct QueueSink(Arc<RecordingSink>);

impl Sink for QueueSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Outcome> {
        Box::pin(async move {
            self.0.seen.lock().push(Seen {
                queue: task.queue.to_string(),
                task: task.id,
                attempt,
                due_at_ms: task.due_at_ms,
                now_ms,
            });
            let delay = self.0.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            Outcome::Delivered
        })
    }

    fn target(&self) -> &str {
        "recording"
    }
}

/// A factory that gives every push queue (whatever its spec) a sink recording into one
/// shared [`RecordingSink`].
pub struct RecordingSinks(pub Arc<RecordingSink>);

impl SinkFactory for RecordingSinks {
    fn build(&self, _queue: &QueueName, _spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(QueueSink(self.0.clone())))
    }
}
