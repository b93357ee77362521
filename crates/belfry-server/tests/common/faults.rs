//! A store that wraps another to inject slowness and failures, and a sink factory whose
//! sinks record every delivery: for dispatcher and schedule tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{NewTask, QueueName, Task, TaskId, UnixMs};
use belfry_sinks::{Outcome, Sink, SinkError, SinkFactory, SinkFuture, SinkSpec};
use belfry_store::{MetaChange, PutOutcome, QueueCounts, Store, StoreError};
use parking_lot::Mutex;

/// Wraps a store: `counts` can be made slow (to hold API admission slots), `write_meta`
/// can be made to fail a number of times (a crash between a tick's puts and its cursors),
/// and the puts from the `puts_refused_from`-th on (0-based) refused as a full disk. It notes
/// how many tasks each `put` held.
pub struct FaultyStore {
    pub inner: Arc<dyn Store>,
    pub counts_delay_ms: AtomicU64,
    pub write_meta_failures: AtomicUsize,
    pub puts_refused_from: AtomicUsize,
    pub puts: Mutex<Vec<usize>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            counts_delay_ms: AtomicU64::new(0),
            write_meta_failures: AtomicUsize::new(0),
            puts_refused_from: AtomicUsize::new(usize::MAX),
            puts: Mutex::new(Vec::new()),
        })
    }
}

impl belfry_store::ForwardingStore for FaultyStore {
    fn wrapped(&self) -> &dyn Store {
        &*self.inner
    }
    fn put(&self, tasks: Vec<NewTask>) -> belfry_store::Result<Vec<PutOutcome>> {
        let mut puts = self.puts.lock();
        if puts.len() >= self.puts_refused_from.load(Ordering::SeqCst) {
            return Err(StoreError::DiskFull {
                free_bytes: 0,
                needed_bytes: 1,
                floor_bytes: 1,
                reserve_bytes: 1,
            });
        }
        puts.push(tasks.len());
        drop(puts);
        self.inner.put(tasks)
    }
    fn counts(&self, q: &QueueName, now: UnixMs) -> belfry_store::Result<QueueCounts> {
        let delay = self.counts_delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        self.inner.counts(q, now)
    }
    fn write_meta(&self, changes: Vec<MetaChange>) -> belfry_store::Result<()> {
        let fail = self
            .write_meta_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(StoreError::Io {
                context: "write metadata (injected failure)",
                path: None,
                source: std::io::Error::other("injected"),
            });
        }
        self.inner.write_meta(changes)
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
