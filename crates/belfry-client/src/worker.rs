//! A consumer loop for a pull queue: lease, run a handler per task, ack or nack.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::model::{LeaseRequest, Leased};
use crate::request::Nack;
use crate::retry::RetryPolicy;
use crate::{Client, Result};

/// The server's largest lease (`max`).
const LEASE_TASKS_MAX: usize = 1_000;

/// An empty lease answered sooner than half of this (or of the poll's wait) is followed by a
/// backoff, not by another lease at once.
const QUICK: Duration = Duration::from_millis(200);

/// How the worker waits after a lease that failed for a passing reason (the server's
/// `Retry-After` when it sent one), however many times: a worker outlives a server restart.
const LEASE_BACKOFF: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    initial_backoff: Duration::from_millis(100),
    max_backoff: Duration::from_secs(10),
    max_elapsed: Duration::MAX,
};

/// A handler's failure: the task is nacked with `reason`, and is due again after
/// [`TaskError::retry_in`] (the queue's backoff when not set), or becomes a dead letter,
/// keeping the reason, when that was its last attempt.
///
/// Any error converts into one with `?` (its text, and its sources', is the reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    reason: String,
    retry_in: Option<Duration>,
}

impl TaskError {
    pub fn new(reason: impl std::fmt::Display) -> Self {
        TaskError {
            reason: reason.to_string(),
            retry_in: None,
        }
    }

    /// Asks for the task to be due again this long from now, rather than after the queue's
    /// backoff (`Duration::ZERO`: at once).
    pub fn retry_in(mut self, delay: Duration) -> Self {
        self.retry_in = Some(delay);
        self
    }

    /// The reason sent with the nack (the server keeps its first 1,024 characters).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl<E: std::error::Error> From<E> for TaskError {
    fn from(error: E) -> Self {
        let mut reason = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            reason.push_str(": ");
            reason.push_str(&cause.to_string());
            source = cause.source();
        }
        TaskError::new(reason)
    }
}

/// What a [`Worker::run`] did, task by task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Handled, and acked.
    pub acked: u64,
    /// Failed (the handler answered an error or panicked), and nacked.
    pub nacked: u64,
    /// Given back by nack at shutdown, their handlers still running at the end of the grace.
    pub given_back: u64,
    /// Of those nacked or given back, the ones that had used their last attempt and became
    /// dead letters.
    pub dead_lettered: u64,
    /// Tasks whose ack or nack the server did not confirm: the lease had run out (a handler
    /// slower than its visibility while extensions failed), the call failed, or its outcome
    /// is unknown ([`crate::Error::OutcomeUnknown`]). Unless an attempt took effect after all, the
    /// server delivers them again once their leases end.
    pub unsettled: u64,
}

/// How one task ended, for the report.
enum Settled {
    Acked,
    Nacked { dead: bool },
    GivenBack { dead: bool },
    Unsettled,
}

impl WorkerReport {
    fn count(&mut self, settled: std::result::Result<Settled, JoinError>) {
        match settled {
            Ok(Settled::Acked) => self.acked += 1,
            Ok(Settled::Nacked { dead }) => {
                self.nacked += 1;
                self.dead_lettered += u64::from(dead);
            }
            Ok(Settled::GivenBack { dead }) => {
                self.given_back += 1;
                self.dead_lettered += u64::from(dead);
            }
            Ok(Settled::Unsettled) | Err(_) => self.unsettled += 1,
        }
    }
}

/// A consumer of one pull queue: it long-polls leases, runs a handler for each task (at most
/// [`Worker::concurrency`] at once), acks the task when the handler answers `Ok`, nacks it
/// when it answers a [`TaskError`] (or panics), and extends the lease of a handler still
/// running at half its visibility, again and again, so a slow task is not delivered twice.
///
/// Give it a client with retries ([`Client::with_retries`]) so that an ack or nack outlives a
/// passing failure; leases the worker retries itself, for as long as it runs.
///
/// Delivery is at least once: a task whose ack is lost, or whose lease runs out, is delivered
/// again; make handlers idempotent, or deduplicate on [`Leased::id`].
///
/// ```no_run
/// # async fn demo(client: belfry_client::Client) -> Result<(), belfry_client::Error> {
/// use std::time::Duration;
/// use belfry_client::{Leased, RetryPolicy, TaskError, Worker};
/// let client = client.with_retries(RetryPolicy::default());
/// let stop = tokio_util::sync::CancellationToken::new();
/// let worker = Worker::new(client, "emails").concurrency(16);
/// let report = worker
///     .run(
///         |task: Leased| async move {
///             let to = task.payload.as_ref().and_then(|p| p["to"].as_str());
///             match to {
///                 Some(_address) => Ok(()), // send the email here
///                 None => Err(TaskError::new("no address").retry_in(Duration::from_secs(60))),
///             }
///         },
///         stop.cancelled_owned(),
///     )
///     .await?;
/// println!("{} acked, {} nacked", report.acked, report.nacked);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Worker {
    client: Client,
    queue: String,
    concurrency: usize,
    visibility: Duration,
    poll_wait: Duration,
    shutdown_grace: Duration,
}

impl Worker {
    /// A worker of `queue`: one task at a time, 30 s leases, 20 s long polls, 30 s of grace at
    /// shutdown.
    pub fn new(client: Client, queue: impl Into<String>) -> Self {
        Worker {
            client,
            queue: queue.into(),
            concurrency: 1,
            visibility: Duration::from_secs(30),
            poll_wait: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    /// Handlers running at once (at least 1). The worker leases no more tasks than it has
    /// free places: none waits leased while others run.
    pub fn concurrency(mut self, handlers: usize) -> Self {
        self.concurrency = handlers.max(1);
        self
    }

    /// How long each lease holds (the server takes 100 ms to 12 h); a handler still running
    /// at half of it has its lease extended by as much.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        self.visibility = visibility;
        self
    }

    /// How long a lease waits for a task when none is due (the server takes up to 30 s). An
    /// empty answer that comes sooner than half of it (or than 100 ms) is followed by a pause
    /// that grows while they go on, up to 10 s: with no wait at all, the worker polls slowly.
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    /// How long, once shutdown is asked, handlers still running may take to finish; those
    /// still running then are dropped, and their tasks given back by nack, due at once.
    /// `Duration::ZERO` gives back at once, `Duration::MAX` waits for every handler. A task
    /// given back has used an attempt (as a lease that ran out would have): on its last one,
    /// it becomes a dead letter.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Runs until `shutdown` completes (a `CancellationToken::cancelled_owned()`, a
    /// `tokio::signal::ctrl_c()`), then leases nothing more, lets running handlers finish
    /// within the grace ([`Worker::shutdown_grace`]) and gives the others back.
    ///
    /// A lease in flight at shutdown is abandoned: tasks the server leased to it (if any) are
    /// delivered again when their visibility ends. A lease that fails for a passing reason is
    /// tried again after a backoff; one that cannot succeed (the queue does not exist, is not
    /// a pull queue, the token lacks `consume`) ends the run with that error, once running
    /// handlers are done as at shutdown.
    pub async fn run<H, F>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerReport>
    where
        H: Fn(Leased) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), TaskError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let give_back = CancellationToken::new();
        let mut running = JoinSet::new();
        let mut report = WorkerReport::default();
        let ended = self
            .lease_until(shutdown, &mut running, &mut report, |task| {
                let handler = handler.clone();
                self.settle(task, move |task| handler(task), give_back.clone())
            })
            .await;
        self.drain(&mut running, &give_back, &mut report).await;
        ended.map(|()| report)
    }

    /// Leases and starts tasks until `shutdown` completes or a lease cannot succeed.
    async fn lease_until<S>(
        &self,
        shutdown: impl Future<Output = ()>,
        running: &mut JoinSet<Settled>,
        report: &mut WorkerReport,
        start: impl Fn(Leased) -> S,
    ) -> Result<()>
    where
        S: Future<Output = Settled> + Send + 'static,
    {
        let mut shutdown = pin!(shutdown);
        let mut failures = 0;
        loop {
            while let Some(done) = running.try_join_next() {
                report.count(done);
            }
            let free = self.concurrency.saturating_sub(running.len());
            if free == 0 {
                tokio::select! {
                    biased;
                    () = &mut shutdown => return Ok(()),
                    Some(done) = running.join_next() => report.count(done),
                }
                continue;
            }
            let asked = Instant::now();
            let request = LeaseRequest {
                max: Some(free.min(LEASE_TASKS_MAX) as u32),
                visibility_ms: Some(millis(self.visibility)),
                wait_ms: Some(millis(self.poll_wait)),
            };
            let leased = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                leased = self.client.lease(&self.queue, &request) => leased,
            };
            let pause = match leased {
                Ok(tasks)
                    if tasks.is_empty() && asked.elapsed() < self.poll_wait.max(QUICK) / 2 =>
                {
                    // Empty well before the wait (a server draining for shutdown answers so at
                    // once), or with no wait: asking again at once would spin.
                    failures += 1;
                    LEASE_BACKOFF.wait(failures, None)
                }
                Ok(tasks) => {
                    failures = 0;
                    for task in tasks {
                        running.spawn(start(task));
                    }
                    continue;
                }
                Err(e) if e.is_transient() => {
                    failures += 1;
                    LEASE_BACKOFF.wait(failures, e.retry_after())
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Waits for the running handlers; past the grace, has the rest given back.
    async fn drain(
        &self,
        running: &mut JoinSet<Settled>,
        give_back: &CancellationToken,
        report: &mut WorkerReport,
    ) {
        let mut grace = pin!(tokio::time::sleep(self.shutdown_grace));
        loop {
            tokio::select! {
                done = running.join_next() => match done {
                    Some(done) => report.count(done),
                    None => return,
                },
                () = &mut grace, if !give_back.is_cancelled() => give_back.cancel(),
            }
        }
    }

    /// Runs the handler for `task` (as a task of its own, so extending its lease never holds
    /// it up), then acks or nacks it.
    fn settle<F>(
        &self,
        task: Leased,
        handler: impl FnOnce(Leased) -> F,
        give_back: CancellationToken,
    ) -> impl Future<Output = Settled> + Send + 'static
    where
        F: Future<Output = std::result::Result<(), TaskError>> + Send + 'static,
    {
        let lease = Lease {
            client: self.client.clone(),
            queue: self.queue.clone(),
            id: task.id.clone(),
            lease_id: task.lease_id.clone(),
            visibility: self.visibility,
        };
        let work = AbortOnDropHandle::new(tokio::spawn(handler(task)));
        async move {
            match lease.hold(work, &give_back).await {
                Some(Ok(Ok(()))) => lease.ack().await,
                Some(Ok(Err(failure))) => lease.nack(failure).await,
                Some(Err(broke)) => lease.nack(TaskError::new(panic_text(broke))).await,
                None => {
                    let back = TaskError::new(
                        "given back: the worker shut down before its handler finished",
                    )
                    .retry_in(Duration::ZERO);
                    match lease.nack(back).await {
                        Settled::Nacked { dead } => Settled::GivenBack { dead },
                        other => other,
                    }
                }
            }
        }
    }
}

/// One leased task, as its settling needs it.
struct Lease {
    client: Client,
    queue: String,
    id: String,
    lease_id: String,
    visibility: Duration,
}

impl Lease {
    /// Waits for `work`, extending the lease at each half of its visibility; `None` when given
    /// back first (the handler is then dropped).
    async fn hold<T>(
        &self,
        work: AbortOnDropHandle<T>,
        give_back: &CancellationToken,
    ) -> Option<std::result::Result<T, JoinError>> {
        let mut work = pin!(work);
        let mut next = Instant::now() + self.visibility / 2;
        let mut held = true;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return Some(done),
                () = give_back.cancelled() => return None,
                () = tokio::time::sleep_until(next), if held => {
                    let extended = self
                        .client
                        .extend(&self.queue, &self.id, &self.lease_id, millis(self.visibility))
                        .await;
                    match extended {
                        Ok(_) => next = Instant::now() + self.visibility / 2,
                        // Half the lease is left at the first try: try again at its quarters.
                        Err(e) if e.is_transient() => next = Instant::now() + self.visibility / 8,
                        // The lease is gone (it ran out, the task was taken or deleted): the
                        // handler finishes, and its ack will say so.
                        Err(_) => held = false,
                    }
                }
            }
        }
    }

    async fn ack(&self) -> Settled {
        match self.client.ack(&self.queue, &self.id, &self.lease_id).await {
            Ok(_) => Settled::Acked,
            Err(_) => Settled::Unsettled,
        }
    }

    async fn nack(&self, failure: TaskError) -> Settled {
        let nack = Nack {
            delay_ms: failure.retry_in.map(millis),
            reason: Some(failure.reason),
        };
        match self
            .client
            .nack(&self.queue, &self.id, &self.lease_id, &nack)
            .await
        {
            Ok(state) => Settled::Nacked {
                dead: state.state == "dead",
            },
            Err(_) => Settled::Unsettled,
        }
    }
}

/// What a handler that panicked said, as a nack's reason.
fn panic_text(broke: JoinError) -> String {
    if !broke.is_panic() {
        return "the handler was cancelled".to_owned();
    }
    let payload = broke.into_panic();
    let said = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("the handler panicked: {said}")
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
