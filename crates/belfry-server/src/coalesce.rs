//! Single-task submits, coalesced: while one `Store::put` is running, submits that arrive
//! wait and then go to the store together in the next call.
//!
//! A durable store fsyncs once per call, and every call is a hand-off to a blocking thread and
//! back. With one task per HTTP request, those costs (not JSON or HTTP) dominated: coalescing
//! turns N concurrent submits into one call. A submit alone is not delayed: it finds the
//! writer idle and goes at once.
//!
//! The writer is a dedicated OS thread blocked on the channel, not a runtime task that hands
//! each batch to `spawn_blocking`: a submit then costs one hand-off to the writer instead of
//! three (to the writer task, to a blocking thread, back to the task), which is most of a
//! submit's latency when few connections wait on durable commits.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};

use belfry_core::NewTask;
use belfry_store::{PutOutcome, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Submits waiting for the writer at most; beyond it, submitters wait for room (backpressure,
/// not memory growth).
pub const QUEUED_SUBMITS_MAX: usize = 4_096;

/// Tasks in one coalesced `Store::put` at most: a batch request's worth.
pub const COALESCED_TASKS_MAX: usize = belfry_core::limits::BATCH_TASKS_MAX;

type Reply = oneshot::Sender<Result<Vec<PutOutcome>, StoreError>>;

struct Pending {
    tasks: Vec<NewTask>,
    reply: Reply,
}

/// A batch at least this large means the server is busy (many submits arrived during one
/// put): the writer then lets the runtime's threads run before it puts, so that the submits
/// they are about to send join this put instead of needing their own fsync.
const BUSY_BATCH_TASKS: usize = 16;
const _: () = assert!(BUSY_BATCH_TASKS < COALESCED_TASKS_MAX);

/// The sending side; the writer thread ends when this is dropped.
pub struct Coalescer {
    tx: mpsc::Sender<Pending>,
}

impl Coalescer {
    /// Starts the writer thread. It holds the store weakly, so the store closes (and frees
    /// its directory) as soon as the server lets go of it.
    pub fn start(store: &Arc<dyn Store>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel(QUEUED_SUBMITS_MAX);
        let store = Arc::downgrade(store);
        std::thread::Builder::new()
            .name("belfry-submits".into())
            .spawn(move || write_loop(store, rx))?;
        Ok(Coalescer { tx })
    }

    /// Puts `tasks` (one submit's worth), possibly together with other submits.
    pub async fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { tasks, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Runs on the writer thread (outside any runtime, as `blocking_recv` requires) until every
/// sender is gone.
fn write_loop(store: Weak<dyn Store>, mut rx: mpsc::Receiver<Pending>) {
    while let Some(first) = rx.blocking_recv() {
        let mut count = first.tasks.len();
        let mut batch = vec![first];
        loop {
            while count < COALESCED_TASKS_MAX {
                match rx.try_recv() {
                    Ok(next) => {
                        count += next.tasks.len();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            // A small batch goes at once: its submitters wait on this fsync's latency. A
            // large one means the runtime's threads are saturated; giving them the CPU lets
            // the submits they are parsing join this put (measured without it, at 256
            // connections: twice the context switches and a tenth less throughput).
            if !(BUSY_BATCH_TASKS..COALESCED_TASKS_MAX).contains(&count) {
                break;
            }
            std::thread::yield_now();
            if rx.is_empty() {
                break;
            }
        }
        let Some(store) = store.upgrade() else {
            for pending in batch {
                let _ = pending.reply.send(Err(StoreError::Closed));
            }
            continue;
        };
        // A panicking put must not end the thread, or every later submit would fail. Its
        // submitters' replies are dropped with the batch, so they answer `Closed`.
        if catch_unwind(AssertUnwindSafe(|| write(&*store, batch))).is_err() {
            tracing::error!("coalesced put did not finish: it panicked");
        }
    }
}

fn write(store: &dyn Store, batch: Vec<Pending>) {
    if batch.len() == 1 {
        let mut batch = batch;
        if let Some(one) = batch.pop() {
            let _ = one.reply.send(store.put(one.tasks));
        }
        return;
    }
    let sizes: Vec<usize> = batch.iter().map(|p| p.tasks.len()).collect();
    let mut replies = Vec::with_capacity(batch.len());
    let mut tasks = Vec::with_capacity(sizes.iter().sum());
    for pending in batch {
        tasks.extend(pending.tasks.iter().cloned());
        replies.push((pending.tasks, pending.reply));
    }
    match store.put(tasks) {
        Ok(outcomes) if outcomes.len() == sizes.iter().sum::<usize>() => {
            let mut outcomes = outcomes.into_iter();
            for ((_, reply), size) in replies.into_iter().zip(sizes) {
                let _ = reply.send(Ok(outcomes.by_ref().take(size).collect()));
            }
        }
        // A put is all or none: when the combined one failed (say, one submit's queue was
        // deleted meanwhile), each submit is tried on its own so it gets its own answer.
        _ => {
            for (tasks, reply) in replies {
                let _ = reply.send(store.put(tasks));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::QueueName;
    use belfry_store::MemoryStore;

    /// Submits to a queue that does not exist fail on their own, whether or not they were
    /// coalesced with submits to one that does (a combined put fails as a whole, so the
    /// writer must then put each submit alone): every other submit is stored, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_submit_fails_alone_and_the_others_are_stored_once() {
        let present = QueueName::new("present").unwrap();
        let missing = QueueName::new("missing").unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        store.put_queue(&present, bytes::Bytes::new()).unwrap();
        let coalescer = Arc::new(Coalescer::start(&store).unwrap());
        let submits: Vec<_> = (0..200u64)
            .map(|i| {
                let queue = if i % 4 == 3 { &missing } else { &present };
                let task = NewTask::new(queue.clone(), 1_000 + i, format!("{i}"));
                let coalescer = Arc::clone(&coalescer);
                tokio::spawn(async move { (i, coalescer.put(vec![task]).await) })
            })
            .collect();
        let mut ids = std::collections::HashSet::new();
        for submit in submits {
            let (i, answer) = submit.await.unwrap();
            if i % 4 == 3 {
                assert!(
                    matches!(&answer, Err(StoreError::QueueNotFound(q)) if *q == missing),
                    "submit {i}: {answer:?}"
                );
            } else {
                let outcomes = answer.unwrap();
                assert_eq!(outcomes.len(), 1, "submit {i}");
                let PutOutcome::Created { id, due_at_ms } = &outcomes[0] else {
                    panic!("submit {i}: {outcomes:?}");
                };
                assert_eq!(*due_at_ms, 1_000 + i, "submit {i} got another's outcome");
                assert!(ids.insert(*id), "submit {i}: id {id:?} given twice");
            }
        }
        assert_eq!(ids.len(), 150);
        assert_eq!(store.counts(&present, 0).unwrap().pending, 150);
    }
}
