//! The server's operations, between the API (which knows HTTP and JSON) and the `Store` (which
//! knows bytes on disk). Dispatch policy lives here: pause, rate, in-flight caps, retries.
//!
//! Store calls may block on fsync, so every one runs on tokio's blocking pool, never on an
//! async worker.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{
    Clock, LatePolicy, LeaseId, LeasedTask, NewTask, QueueName, RetryPolicy, Task, TaskId,
    TaskState, UnixMs,
};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, PutOutcome, QueueCounts, Store, StoreError,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ServerConfig;
use crate::metrics;
use crate::queues::{Delivery, InvalidQueueConfig, QueueConfig, QueueRuntime, Queues};

/// A long-poll or idle dispatcher looks at its queue at least this often even without a
/// wake-up: a safety net for a lost notification or a wall-clock step.
pub const IDLE_RECHECK_MS: u64 = 1_000;

/// Dead letters listed per page at most.
pub const DEAD_PAGE_MAX: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("task {0} does not exist in this queue")]
    TaskNotFound(TaskId),
    #[error("the lease on task {0} expired or was replaced; lease the task again")]
    LeaseExpired(TaskId),
    #[error("task {id} is {}, only scheduled tasks can be changed or cancelled", state.as_str())]
    NotScheduled { id: TaskId, state: TaskState },
    #[error("task {id} is {}, only dead tasks can be redriven", state.as_str())]
    NotDead { id: TaskId, state: TaskState },
    #[error("queue {0} delivers by webhook; leases are only for pull queues")]
    NotPullQueue(QueueName),
    #[error("invalid queue configuration: {0}")]
    InvalidQueueConfig(#[from] InvalidQueueConfig),
    #[error("webhook target refused: {0}")]
    WebhookRefused(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the server is overloaded (too many storage calls in flight); retry shortly")]
    Overloaded,
    #[error("{0}")]
    Invalid(String),
    #[error("storage failed: {0}")]
    Store(StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::QueueNotFound(q) => ServiceError::QueueNotFound(q),
            StoreError::Invalid(m) => ServiceError::Invalid(m),
            other => ServiceError::Store(other),
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// A change to a queue's configuration: `None` keeps the current value (or the default, for a
/// new queue).
#[derive(Debug, Clone, Default)]
pub struct QueuePatch {
    pub rate_per_s: Option<f64>,
    pub burst: Option<u32>,
    pub max_in_flight: Option<u32>,
    pub max_attempts: Option<u32>,
    pub backoff_initial_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
    pub delivery: Option<Delivery>,
    pub paused: Option<bool>,
    pub late_policy: Option<LatePolicy>,
}

impl QueuePatch {
    fn apply(self, base: &QueueConfig) -> QueueConfig {
        QueueConfig {
            rate_per_s: self.rate_per_s.unwrap_or(base.rate_per_s),
            burst: self.burst.unwrap_or(base.burst),
            max_in_flight: self.max_in_flight.unwrap_or(base.max_in_flight),
            retry: RetryPolicy {
                max_attempts: self.max_attempts.unwrap_or(base.retry.max_attempts),
                backoff_initial_ms: self
                    .backoff_initial_ms
                    .unwrap_or(base.retry.backoff_initial_ms),
                backoff_max_ms: self.backoff_max_ms.unwrap_or(base.retry.backoff_max_ms),
            },
            delivery: self.delivery.unwrap_or_else(|| base.delivery.clone()),
            paused: self.paused.unwrap_or(base.paused),
            late_policy: self.late_policy.unwrap_or(base.late_policy),
        }
    }
}

/// What happened to a nacked task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackResult {
    Retry {
        due_at_ms: UnixMs,
    },
    /// The task used its last attempt and is now a dead letter.
    Dead,
}

pub struct Service {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: ServerConfig,
    pub queues: Queues,
    /// Serialises queue creation, update and deletion.
    admin: tokio::sync::Mutex<()>,
    /// Cancelled when shutdown begins: long-polls return, dispatchers stop claiming.
    pub stopping: CancellationToken,
    /// Deliveries in flight (webhook calls and their ack/nack), drained on shutdown.
    pub deliveries: TaskTracker,
    /// Dispatcher loops.
    pub dispatchers: TaskTracker,
    ready: AtomicBool,
    /// Single submits, coalesced into shared store calls.
    submits: crate::coalesce::Coalescer,
    /// Admission for store calls (`store_calls_in_flight_max`).
    store_calls: tokio::sync::Semaphore,
    /// The HTTP client every webhook sink shares (one connection pool per server).
    webhook_client: reqwest::Client,
}

impl Service {
    pub fn new(config: ServerConfig, store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Result<Self> {
        let policy = belfry_sinks::TargetPolicy {
            allow_private: config.allow_private_targets,
        };
        let webhook_client = belfry_sinks::try_client_for(&policy)
            .map_err(|e| ServiceError::Internal(format!("build the webhook HTTP client: {e}")))?;
        let store_calls = tokio::sync::Semaphore::new(config.store_calls_in_flight_max);
        let submits = crate::coalesce::Coalescer::start(&store)
            .map_err(|e| ServiceError::Internal(format!("start the submit writer thread: {e}")))?;
        Ok(Service {
            submits,
            store,
            clock,
            config,
            queues: Queues::default(),
            admin: tokio::sync::Mutex::new(()),
            stopping: CancellationToken::new(),
            deliveries: TaskTracker::new(),
            dispatchers: TaskTracker::new(),
            ready: AtomicBool::new(false),
            store_calls,
            webhook_client,
        })
    }

    pub fn now_ms(&self) -> UnixMs {
        self.clock.wall_ms()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.stopping.is_cancelled()
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    pub fn webhook_client(&self) -> &reqwest::Client {
        &self.webhook_client
    }

    /// Waits for a store-call slot, up to `store_admission_wait_ms`.
    async fn admit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        // A free slot is taken without arming a timer: that is the common case, and a timer
        // per store call (registered and cancelled on every request) was measurable.
        match self.store_calls.try_acquire() {
            Ok(permit) => return Ok(permit),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(ServiceError::ShuttingDown),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        let wait = Duration::from_millis(self.config.store_admission_wait_ms);
        match tokio::time::timeout(wait, self.store_calls.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_closed)) => Err(ServiceError::ShuttingDown),
            Err(_elapsed) => Err(ServiceError::Overloaded),
        }
    }

    /// Runs a store call on the blocking pool.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T> + Send + 'static,
    {
        let _permit = self.admit().await?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| ServiceError::Internal(format!("store call did not finish: {e}")))?
    }

    pub fn runtime(&self, queue: &QueueName) -> Result<Arc<QueueRuntime>> {
        self.queues
            .get(queue)
            .ok_or_else(|| ServiceError::QueueNotFound(queue.clone()))
    }

    // ---- queues ----

    /// Loads every stored queue. Called once at start-up, before the API serves.
    pub async fn load_queues(self: &Arc<Self>) -> Result<()> {
        let stored = self.blocking(|s| Ok(s.list_queues()?)).await?;
        for (name, bytes) in stored {
            let config = QueueConfig::decode(&bytes).map_err(|e| {
                ServiceError::Internal(format!(
                    "decode the stored configuration of queue {name}: {e}"
                ))
            })?;
            let runtime = Arc::new(QueueRuntime::new(name, config, self.clock.monotonic()));
            self.queues.insert(runtime.clone());
            // A stored webhook the current configuration refuses (say, private targets are no
            // longer allowed) must not stop the server: the queue keeps its tasks, undelivered,
            // until it is reconfigured.
            if let Err(e) = self.reconcile_dispatcher(&runtime) {
                tracing::error!(queue = %runtime.name, error = %e, "start the webhook dispatcher; the queue will not deliver until it is reconfigured");
            }
        }
        Ok(())
    }

    /// Creates a queue or changes its configuration. Returns the new configuration and whether
    /// the queue was created.
    pub async fn put_queue(
        self: &Arc<Self>,
        queue: QueueName,
        patch: QueuePatch,
    ) -> Result<(QueueConfig, bool)> {
        let _admin = self.admin.lock().await;
        let existing = self.queues.get(&queue);
        let base = existing
            .as_ref()
            .map(|r| (*r.config()).clone())
            .unwrap_or_default();
        let config = patch.apply(&base);
        config.validate()?;
        // Building the sink checks the URL against the SSRF policy, the timeout and the secret.
        self.webhook_sink(&config)?;
        let encoded = config.encode();
        let name = queue.clone();
        self.blocking(move |s| Ok(s.put_queue(&name, encoded)?))
            .await?;
        let created = existing.is_none();
        let runtime = match existing {
            Some(runtime) => {
                runtime.set_config(config.clone());
                runtime
            }
            None => {
                let runtime = Arc::new(QueueRuntime::new(
                    queue,
                    config.clone(),
                    self.clock.monotonic(),
                ));
                self.queues.insert(runtime.clone());
                runtime
            }
        };
        // The dispatcher is rebuilt on every change so it never delivers with an old URL or
        // secret; deliveries already started finish with the configuration they began with.
        self.stop_dispatcher(&runtime);
        self.reconcile_dispatcher(&runtime)?;
        Ok((config, created))
    }

    /// The sink for a webhook queue (`None` for pull queues).
    pub fn webhook_sink(&self, config: &QueueConfig) -> Result<Option<belfry_sinks::WebhookSink>> {
        let Delivery::Webhook {
            url,
            secret,
            timeout_ms,
        } = &config.delivery
        else {
            return Ok(None);
        };
        let policy = belfry_sinks::TargetPolicy {
            allow_private: self.config.allow_private_targets,
        };
        let webhook = belfry_sinks::WebhookConfig {
            url: url.clone(),
            secret: secret.clone(),
            timeout: Duration::from_millis(*timeout_ms),
        };
        belfry_sinks::WebhookSink::new(webhook, policy, self.webhook_client.clone())
            .map(Some)
            .map_err(|e| ServiceError::WebhookRefused(e.to_string()))
    }

    fn stop_dispatcher(&self, runtime: &QueueRuntime) {
        if let Some(token) = runtime.dispatcher.lock().take() {
            token.cancel();
        }
    }

    fn reconcile_dispatcher(self: &Arc<Self>, runtime: &Arc<QueueRuntime>) -> Result<()> {
        let config = runtime.config();
        let Some(sink) = self.webhook_sink(&config)? else {
            return Ok(());
        };
        let visibility_ms = match config.delivery {
            Delivery::Webhook { timeout_ms, .. } => timeout_ms,
            Delivery::Pull => 0,
        }
        .saturating_add(crate::dispatcher::LEASE_MARGIN_MS);
        let mut slot = runtime.dispatcher.lock();
        if slot.is_none() {
            let token = self.stopping.child_token();
            let dispatcher = crate::dispatcher::Dispatcher {
                service: self.clone(),
                runtime: runtime.clone(),
                sink: Arc::new(sink),
                visibility_ms,
                stop: token.clone(),
            };
            self.dispatchers.spawn(dispatcher.run());
            *slot = Some(token);
        }
        Ok(())
    }

    pub async fn set_paused(
        self: &Arc<Self>,
        queue: QueueName,
        paused: bool,
    ) -> Result<QueueConfig> {
        self.runtime(&queue)?;
        let patch = QueuePatch {
            paused: Some(paused),
            ..QueuePatch::default()
        };
        let (config, created) = self.put_queue(queue.clone(), patch).await?;
        if created {
            // Deleted and recreated in between: undo, as pausing never creates a queue.
            self.delete_queue(queue.clone()).await?;
            return Err(ServiceError::QueueNotFound(queue));
        }
        Ok(config)
    }

    pub async fn queue_counts(&self, queue: &QueueName) -> Result<QueueCounts> {
        let name = queue.clone();
        let now_ms = self.now_ms();
        self.blocking(move |s| Ok(s.counts(&name, now_ms)?)).await
    }

    pub async fn delete_queue(&self, queue: QueueName) -> Result<bool> {
        let _admin = self.admin.lock().await;
        let runtime = self.queues.remove(&queue);
        if let Some(runtime) = &runtime {
            self.stop_dispatcher(runtime);
            runtime.wake();
        }
        let existed = self.blocking(move |s| Ok(s.delete_queue(&queue)?)).await?;
        Ok(existed || runtime.is_some())
    }

    // ---- tasks ----

    pub async fn submit(&self, queue: &QueueName, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let runtime = self.runtime(queue)?;
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = if tasks.len() == 1 {
            // One task per request: share the store call with concurrent submits. Each waiting
            // submit holds a store-call slot, so admission still bounds the queue.
            let _permit = self.admit().await?;
            self.submits.put(tasks).await?
        } else {
            self.blocking(move |s| Ok(s.put(tasks)?)).await?
        };
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, PutOutcome::Created { .. }))
            .count();
        metrics::submitted(queue.as_str(), created);
        if created > 0 {
            runtime.wake();
        }
        Ok(outcomes)
    }

    pub async fn get_task(&self, queue: &QueueName, id: TaskId) -> Result<Task> {
        self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        self.blocking(move |s| Ok(s.get(&name, id, now_ms)?))
            .await?
            .ok_or(ServiceError::TaskNotFound(id))
    }

    pub async fn cancel(&self, queue: &QueueName, id: TaskId) -> Result<()> {
        self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let outcome = self
            .blocking(move |s| Ok(s.cancel(&name, id, now_ms)?))
            .await?;
        change_result(id, outcome)
    }

    pub async fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
    ) -> Result<Task> {
        let runtime = self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (outcome, task) = self
            .blocking(move |s| {
                let outcome = s.reschedule(&name, id, due_at_ms, now_ms)?;
                let task = s.get(&name, id, now_ms)?;
                Ok((outcome, task))
            })
            .await?;
        change_result(id, outcome)?;
        runtime.wake();
        task.ok_or(ServiceError::TaskNotFound(id))
    }

    // ---- delivery ----

    /// Claims what the queue's policy allows right now, up to `max`. Returns the leased tasks,
    /// or when none, how long the rate or in-flight limit asks to wait (if that is the reason).
    pub async fn claim_once(
        &self,
        runtime: &QueueRuntime,
        max: usize,
        visibility_ms: u64,
    ) -> Result<(Vec<LeasedTask>, Option<Duration>)> {
        let now_ms = self.now_ms();
        let admission = runtime.admit(
            max,
            self.clock.monotonic(),
            now_ms,
            self.config.webhook_in_flight_default,
        );
        if admission.granted == 0 {
            return Ok((Vec::new(), admission.retry_in));
        }
        let granted = admission.granted;
        let name = runtime.name.clone();
        let retry = runtime.config().retry;
        let claimed = self
            .blocking(move |s| {
                let batch = s.claim(&name, now_ms, granted, visibility_ms)?;
                // A task that keeps timing out (its consumer crashes on it) would otherwise be
                // leased forever: past its last attempt it becomes a dead letter instead.
                let mut exhausted = Vec::new();
                let mut leased = Vec::with_capacity(batch.leased.len());
                for task in batch.leased {
                    if retry.allows_another(task.task.attempts.saturating_sub(1)) {
                        leased.push(task);
                    } else {
                        let reason = format!(
                            "no acknowledgement after {} attempts (retry.max_attempts is {})",
                            task.task.attempts - 1,
                            retry.max_attempts
                        );
                        s.dead_letter(&name, task.task.id, task.lease_id, &reason, now_ms)?;
                        exhausted.push(task.task.id);
                    }
                }
                Ok((
                    ClaimBatch {
                        leased,
                        late_skipped: batch.late_skipped,
                        late_dead: batch.late_dead,
                    },
                    exhausted.len(),
                ))
            })
            .await;
        let (batch, exhausted) = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                runtime.settle(granted, &[], self.config.webhook_in_flight_default);
                return Err(e);
            }
        };
        let leases: Vec<(TaskId, UnixMs)> = batch
            .leased
            .iter()
            .map(|t| (t.task.id, t.lease_until_ms))
            .collect();
        runtime.settle(granted, &leases, self.config.webhook_in_flight_default);
        let queue = runtime.name.as_str();
        if !batch.late_skipped.is_empty() {
            metrics::skipped_late(queue, batch.late_skipped.len());
        }
        if !batch.late_dead.is_empty() || exhausted > 0 {
            metrics::dead_lettered(queue, batch.late_dead.len() + exhausted);
        }
        if !batch.leased.is_empty() {
            metrics::dispatched(queue, batch.leased.len());
            metrics::lateness(
                queue,
                batch.leased.iter().map(|task| {
                    // The store's promise, checked: nothing is handed out before it is due.
                    debug_assert!(task.task.due_at_ms <= now_ms, "claimed a task before due");
                    now_ms.saturating_sub(task.task.due_at_ms)
                }),
            );
        }
        Ok((batch.leased, None))
    }

    /// How long an idle loop may sleep before `queue` could have work: until its next due time
    /// or lease expiry, at most `cap`.
    pub async fn idle_for(&self, queue: &QueueName, cap: Duration) -> Result<Duration> {
        let name = queue.clone();
        let next = self.blocking(move |s| Ok(s.next_due_ms(&name)?)).await?;
        let cap = cap.min(Duration::from_millis(IDLE_RECHECK_MS));
        Ok(match next {
            // One millisecond more than the gap, so the wall clock has reached the due time
            // when we look again (tokio's timer rounds to milliseconds).
            Some(due) => cap.min(Duration::from_millis(
                due.saturating_sub(self.now_ms()).saturating_add(1),
            )),
            None => cap,
        })
    }

    /// Leases due tasks of a pull queue, waiting up to `wait` for some to become due.
    pub async fn lease(
        &self,
        queue: &QueueName,
        max: usize,
        visibility_ms: u64,
        wait: Duration,
    ) -> Result<Vec<LeasedTask>> {
        let runtime = self.runtime(queue)?;
        if runtime.config().is_webhook() {
            return Err(ServiceError::NotPullQueue(queue.clone()));
        }
        let deadline = self.clock.monotonic().saturating_add(wait);
        loop {
            let mut notified = pin!(runtime.notified());
            notified.as_mut().enable();
            if self.stopping.is_cancelled() {
                return Ok(Vec::new());
            }
            let (tasks, retry_in) = self.claim_once(&runtime, max, visibility_ms).await?;
            let retry_in = retry_in.map(|r| r.min(Duration::from_millis(IDLE_RECHECK_MS)));
            if !tasks.is_empty() {
                return Ok(tasks);
            }
            let now = self.clock.monotonic();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let left = deadline - now;
            let sleep = match retry_in {
                Some(retry_in) => retry_in.min(left),
                None if runtime.config().paused => left.min(Duration::from_millis(IDLE_RECHECK_MS)),
                None => self.idle_for(queue, left).await?,
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = self.stopping.cancelled() => {}
            }
            // A deleted queue ends the poll with queue_not_found.
            if self.queues.get(queue).is_none() {
                return Err(ServiceError::QueueNotFound(queue.clone()));
            }
        }
    }

    pub async fn ack(&self, queue: &QueueName, id: TaskId, lease: LeaseId) -> Result<()> {
        let runtime = self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let outcome = self
            .blocking(move |s| Ok(s.ack(&name, id, lease, now_ms)?))
            .await?;
        lease_result(id, outcome)?;
        runtime.release(id);
        metrics::delivered(queue.as_str(), 1);
        Ok(())
    }

    /// Acks many tasks in one store round trip; one result per input, in order.
    pub async fn ack_batch(
        &self,
        queue: &QueueName,
        acks: Vec<(TaskId, LeaseId)>,
    ) -> Result<Vec<Result<()>>> {
        let runtime = self.runtime(queue)?;
        let now_ms = self.now_ms();
        // One store call for the whole batch: the embedded engine then takes its lock once
        // and writes one WAL frame, rather than one of each per task (which capped burst
        // dispatch). Parallel groups of acks only contended for the engine's locks (A/B at
        // 100k due/s in BENCHMARKS.md: p99 lateness 10-19 ms with one group, 45-395 ms with
        // 256), so the batch stays one call.
        let name = queue.clone();
        let outcomes = self
            .blocking(move |s| {
                let outcomes = s.ack_many(&name, &acks, now_ms)?;
                if outcomes.len() != acks.len() {
                    return Err(ServiceError::Internal(format!(
                        "the store answered {} of {} acks",
                        outcomes.len(),
                        acks.len()
                    )));
                }
                Ok(acks
                    .into_iter()
                    .map(|(id, _)| id)
                    .zip(outcomes)
                    .collect::<Vec<_>>())
            })
            .await?;
        let mut done = 0;
        let results = outcomes
            .into_iter()
            .map(|(id, outcome)| {
                let result = lease_result(id, outcome);
                if result.is_ok() {
                    runtime.release(id);
                    done += 1;
                }
                result
            })
            .collect();
        metrics::delivered(queue.as_str(), done);
        Ok(results)
    }

    /// Gives a leased task back: due again after `delay_ms` (or the queue's backoff), or a dead
    /// letter when it has used its last attempt.
    pub async fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        delay_ms: Option<u64>,
        reason: Option<String>,
    ) -> Result<NackResult> {
        let runtime = self.runtime(queue)?;
        let retry = runtime.config().retry;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let jitter: f64 = rand::random();
        let (outcome, result) = self
            .blocking(move |s| {
                let Some(task) = s.get(&name, id, now_ms)? else {
                    return Ok((LeaseOutcome::NotFound, NackResult::Dead));
                };
                if !retry.allows_another(task.attempts) {
                    let reason = reason.unwrap_or_else(|| {
                        format!("nacked on its last attempt ({})", task.attempts)
                    });
                    let outcome = s.dead_letter(&name, id, lease, &reason, now_ms)?;
                    return Ok((outcome, NackResult::Dead));
                }
                let delay = match delay_ms {
                    Some(ms) => ms,
                    None => retry.backoff(task.attempts, jitter, None).as_millis() as u64,
                };
                let due_at_ms = now_ms.saturating_add(delay);
                let outcome = s.nack(&name, id, lease, due_at_ms, now_ms)?;
                Ok((outcome, NackResult::Retry { due_at_ms }))
            })
            .await?;
        lease_result(id, outcome)?;
        runtime.release(id);
        match result {
            NackResult::Retry { .. } => {
                metrics::retried(queue.as_str());
                runtime.wake();
            }
            NackResult::Dead => metrics::dead_lettered(queue.as_str(), 1),
        }
        Ok(result)
    }

    /// Moves a lease's deadline to `visibility_ms` from now. Returns the new deadline.
    pub async fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        visibility_ms: u64,
    ) -> Result<UnixMs> {
        let runtime = self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let until = now_ms.saturating_add(visibility_ms);
        let outcome = self
            .blocking(move |s| Ok(s.extend(&name, id, lease, until, now_ms)?))
            .await?;
        lease_result(id, outcome)?;
        runtime.extended(id, until);
        Ok(until)
    }

    // ---- dead letters ----

    pub async fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        self.runtime(queue)?;
        let name = queue.clone();
        let limit = limit.min(DEAD_PAGE_MAX);
        self.blocking(move |s| Ok(s.list_dead(&name, after, limit)?))
            .await
    }

    pub async fn redrive(&self, queue: &QueueName, id: TaskId) -> Result<Task> {
        let runtime = self.runtime(queue)?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (outcome, task) = self
            .blocking(move |s| {
                let outcome = s.redrive(&name, id, now_ms)?;
                Ok((outcome, s.get(&name, id, now_ms)?))
            })
            .await?;
        match outcome {
            ChangeOutcome::Ok => {}
            ChangeOutcome::NotFound => return Err(ServiceError::TaskNotFound(id)),
            ChangeOutcome::WrongState(state) => return Err(ServiceError::NotDead { id, state }),
        }
        runtime.wake();
        task.ok_or(ServiceError::TaskNotFound(id))
    }

    /// Refreshes per-queue gauges until shutdown.
    pub async fn refresh_gauges(self: Arc<Self>) {
        let period = Duration::from_millis(self.config.metrics_refresh_ms);
        loop {
            for runtime in self.queues.all() {
                match self.queue_counts(&runtime.name).await {
                    Ok(counts) => metrics::queue_counts(runtime.name.as_str(), &counts),
                    Err(ServiceError::QueueNotFound(_)) => {}
                    Err(e) => {
                        tracing::warn!(queue = %runtime.name, error = %e, "refresh queue gauges")
                    }
                }
            }
            if let Some(handle) = metrics::handle() {
                handle.run_upkeep();
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }
}

fn change_result(id: TaskId, outcome: ChangeOutcome) -> Result<()> {
    match outcome {
        ChangeOutcome::Ok => Ok(()),
        ChangeOutcome::NotFound => Err(ServiceError::TaskNotFound(id)),
        ChangeOutcome::WrongState(state) => Err(ServiceError::NotScheduled { id, state }),
    }
}

pub fn lease_result(id: TaskId, outcome: LeaseOutcome) -> Result<()> {
    match outcome {
        LeaseOutcome::Ok => Ok(()),
        LeaseOutcome::NotFound => Err(ServiceError::TaskNotFound(id)),
        LeaseOutcome::LeaseExpired => Err(ServiceError::LeaseExpired(id)),
    }
}
