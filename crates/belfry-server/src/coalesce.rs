//! Coalesced writes: while one store call is running, requests that arrive wait and then go
//! to the store together in the next call.
//!
//! A durable store fsyncs once per call, and every call is a hand-off to a blocking thread and
//! back. With one task (or one schedule) per HTTP request, those costs, not JSON or HTTP,
//! dominated: coalescing turns N concurrent requests into one call. A request alone is not
//! delayed: it finds the writer idle and goes at once.
//!
//! The writer is a dedicated OS thread blocked on the channel, not a runtime task that hands
//! each batch to `spawn_blocking`: a request then costs one hand-off to the writer instead of
//! three (to the writer task, to a blocking thread, back to the task), which is most of its
//! latency when few connections wait on durable commits.
//!
//! [`Coalescer`] is the batching; what a batch does is the caller's: [`Submits`] puts tasks,
//! and the schedule routes create schedules (`crate::schedules`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::time::Duration;

use belfry_core::NewTask;
use belfry_store::{PutOutcome, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Requests waiting for the writer at most; beyond it, callers wait for room (backpressure,
/// not memory growth).
pub const QUEUED_REQUESTS_MAX: usize = 4_096;

/// Tasks in one coalesced `Store::put` at most: a batch request's worth.
pub const COALESCED_TASKS_MAX: usize = belfry_core::limits::BATCH_TASKS_MAX;

/// A batch at least this large means the server is busy (many requests arrived during one
/// call): the writer then lets the runtime's threads run before it writes, so that the
/// requests they are about to send join this call instead of needing their own fsync.
const BUSY_BATCH: usize = 16;
const _: () = assert!(BUSY_BATCH < COALESCED_TASKS_MAX);

/// One request and where its answer goes. Dropping the reply answers "the writer is gone".
pub struct Pending<R, A> {
    pub request: R,
    pub reply: oneshot::Sender<A>,
}

/// The sending side of one writer thread; the thread ends when this is dropped.
pub struct Coalescer<R, A> {
    tx: mpsc::Sender<Pending<R, A>>,
}

impl<R: Send + 'static, A: Send + 'static> Coalescer<R, A> {
    /// Starts the writer thread `name`. A batch holds requests of total `weight` up to
    /// `max_weight` (one request may exceed it alone); `write` answers every request of a
    /// batch (or drops its reply). A panicking `write` does not end the thread.
    pub fn start(
        name: &str,
        max_weight: usize,
        weight: fn(&R) -> usize,
        write: impl FnMut(Vec<Pending<R, A>>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel(QUEUED_REQUESTS_MAX);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || write_loop(rx, max_weight, weight, write))?;
        Ok(Coalescer { tx })
    }

    /// A coalescer without a writer: every call answers `None`. For a part whose writer
    /// could not start, which reports that error instead.
    pub fn closed() -> Self {
        let (tx, _) = mpsc::channel(1);
        Coalescer { tx }
    }

    /// Sends `request` to the writer and waits for its answer, at most `deadline`.
    ///
    /// Past the deadline the request is abandoned: if the writer has not taken it yet it never
    /// will (a batch leaves out requests whose caller is gone), so it is not written; if the
    /// writer is already writing it, that write completes without anyone to tell.
    pub async fn call(&self, request: R, deadline: Duration) -> Result<A, CallFailed> {
        let (reply, answer) = oneshot::channel();
        let sent_and_answered = async {
            self.tx
                .send(Pending { request, reply })
                .await
                .map_err(|_| CallFailed::WriterGone)?;
            answer.await.map_err(|_| CallFailed::WriterGone)
        };
        tokio::time::timeout(deadline, sent_and_answered)
            .await
            .unwrap_or(Err(CallFailed::DeadlinePassed(deadline)))
    }
}

/// Why a [`Coalescer::call`] has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailed {
    /// The writer thread is gone (the server is stopping, or it never started).
    WriterGone,
    /// The writer did not answer in time (the store is stalled).
    DeadlinePassed(Duration),
}

impl CallFailed {
    /// The store error a caller reports for it.
    pub fn into_store_error(self) -> StoreError {
        match self {
            CallFailed::WriterGone => StoreError::Closed,
            CallFailed::DeadlinePassed(deadline) => crate::shared::deadline_passed(deadline),
        }
    }
}

/// Runs on the writer thread (outside any runtime, as `blocking_recv` requires) until every
/// sender is gone.
fn write_loop<R, A>(
    mut rx: mpsc::Receiver<Pending<R, A>>,
    max_weight: usize,
    weight: fn(&R) -> usize,
    mut write: impl FnMut(Vec<Pending<R, A>>),
) {
    while let Some(first) = rx.blocking_recv() {
        let mut total = weight(&first.request);
        let mut batch = vec![first];
        loop {
            while total < max_weight {
                match rx.try_recv() {
                    Ok(next) => {
                        total += weight(&next.request);
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            // A small batch goes at once: its callers wait on this fsync's latency. A large
            // one means the runtime's threads are saturated; giving them the CPU lets the
            // requests they are parsing join this call (measured without it, at 256
            // connections: twice the context switches and a tenth less throughput).
            if !(BUSY_BATCH..max_weight).contains(&total) {
                break;
            }
            std::thread::yield_now();
            if rx.is_empty() {
                break;
            }
        }
        // Requests whose caller stopped waiting (its deadline passed while an earlier, stalled
        // write held the thread; or its client went away) are never written: no one was told
        // they were, and no one will be.
        batch.retain(|pending| !pending.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        // A panicking write must not end the thread, or every later request would fail. Its
        // callers' replies are dropped with the batch, so they hear that the writer is gone.
        if catch_unwind(AssertUnwindSafe(|| write(batch))).is_err() {
            tracing::error!("a coalesced write did not finish: it panicked");
        }
    }
}

/// Single-task submits, coalesced into shared `Store::put` calls.
pub struct Submits {
    writer: Coalescer<Vec<NewTask>, Result<Vec<PutOutcome>, StoreError>>,
}

impl Submits {
    /// Starts the writer thread. It holds the store weakly, so the store closes (and frees
    /// its directory) as soon as the server lets go of it.
    pub fn start(store: &Arc<dyn Store>) -> std::io::Result<Self> {
        let store = Arc::downgrade(store);
        let writer = Coalescer::start(
            "belfry-submits",
            COALESCED_TASKS_MAX,
            Vec::len,
            move |batch| put_batch(&store, batch),
        )?;
        Ok(Submits { writer })
    }

    /// Puts `tasks` (one submit's worth), possibly together with other submits, waiting at
    /// most `deadline` (then `Unavailable`).
    pub async fn put(
        &self,
        tasks: Vec<NewTask>,
        deadline: Duration,
    ) -> Result<Vec<PutOutcome>, StoreError> {
        self.writer
            .call(tasks, deadline)
            .await
            .map_err(CallFailed::into_store_error)?
    }
}

type PendingPut = Pending<Vec<NewTask>, Result<Vec<PutOutcome>, StoreError>>;

fn put_batch(store: &Weak<dyn Store>, batch: Vec<PendingPut>) {
    let Some(store) = store.upgrade() else {
        for pending in batch {
            let _ = pending.reply.send(Err(StoreError::Closed));
        }
        return;
    };
    if batch.len() == 1 {
        let mut batch = batch;
        if let Some(one) = batch.pop() {
            let _ = one.reply.send(store.put(one.request));
        }
        return;
    }
    let sizes: Vec<usize> = batch.iter().map(|p| p.request.len()).collect();
    let mut replies = Vec::with_capacity(batch.len());
    let mut tasks = Vec::with_capacity(sizes.iter().sum());
    for pending in batch {
        tasks.extend(pending.request.iter().cloned());
        replies.push((pending.request, pending.reply));
    }
    match store.put(tasks) {
        Ok(outcomes) if outcomes.len() == sizes.iter().sum::<usize>() => {
            let mut outcomes = outcomes.into_iter();
            for ((_, reply), size) in replies.into_iter().zip(sizes) {
                let _ = reply.send(Ok(outcomes.by_ref().take(size).collect()));
            }
        }
        // A store that could not be reached, or is full (a Redis master at its maxmemory),
        // may have stored part of the combined put (a networked store is atomic per slot,
        // not per call): trying each submit again could store some twice, so each gets the
        // error, which says a retry (with idempotency keys) is safe.
        Err(StoreError::Unavailable { detail }) => {
            for (_, reply) in replies {
                let detail = detail.clone();
                let _ = reply.send(Err(StoreError::Unavailable { detail }));
            }
        }
        Err(StoreError::Full { detail }) => {
            for (_, reply) in replies {
                let detail = detail.clone();
                let _ = reply.send(Err(StoreError::Full { detail }));
            }
        }
        // Otherwise a put is all or none: when the combined one failed (say, one submit's
        // queue was deleted meanwhile), each submit is tried on its own so it gets its own
        // answer.
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
        let coalescer = Arc::new(Submits::start(&store).unwrap());
        let submits: Vec<_> = (0..200u64)
            .map(|i| {
                let queue = if i % 4 == 3 { &missing } else { &present };
                let task = NewTask::new(queue.clone(), 1_000 + i, format!("{i}"));
                let coalescer = Arc::clone(&coalescer);
                tokio::spawn(async move {
                    (i, coalescer.put(vec![task], Duration::from_secs(60)).await)
                })
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

    /// While a write stalls, callers behind it get `DeadlinePassed` at their deadline, and
    /// their requests are never written once the writer moves on: nobody was told they were.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_past_their_deadline_are_answered_and_their_requests_never_written() {
        let written = Arc::new(std::sync::Mutex::new(Vec::<Vec<u32>>::new()));
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let coalescer = {
            let written = Arc::clone(&written);
            let mut first = Some((started_tx, released));
            Coalescer::start(
                "test-writer",
                100,
                |_| 1,
                move |batch: Vec<Pending<u32, u32>>| {
                    written
                        .lock()
                        .unwrap()
                        .push(batch.iter().map(|p| p.request).collect());
                    if let Some((started_tx, released)) = first.take() {
                        started_tx.send(()).unwrap();
                        released.recv().unwrap();
                    }
                    for pending in batch {
                        let _ = pending.reply.send(pending.request * 10);
                    }
                },
            )
            .unwrap()
        };
        let coalescer = Arc::new(coalescer);
        let stalled = {
            let coalescer = Arc::clone(&coalescer);
            tokio::spawn(async move { coalescer.call(1, Duration::from_secs(60)).await })
        };
        started.recv().await.unwrap();
        let short = Duration::from_millis(50);
        let (two, three) = tokio::join!(coalescer.call(2, short), coalescer.call(3, short));
        assert_eq!(two, Err(CallFailed::DeadlinePassed(short)));
        assert_eq!(three, Err(CallFailed::DeadlinePassed(short)));
        release.send(()).unwrap();
        assert_eq!(stalled.await.unwrap(), Ok(10));
        assert_eq!(coalescer.call(4, Duration::from_secs(60)).await, Ok(40));
        assert_eq!(*written.lock().unwrap(), vec![vec![1], vec![4]]);
        assert!(matches!(
            CallFailed::DeadlinePassed(short).into_store_error(),
            StoreError::Unavailable { .. }
        ));
    }
}
