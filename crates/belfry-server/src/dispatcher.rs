//! Push delivery: one dispatcher task per webhook queue.
//!
//! Each queue has its own loop, its own rate limiter and in-flight cap, so a slow webhook on
//! one queue never delays another. The loop sleeps until the queue's next due time or a
//! wake-up, claims what the policy allows (leasing durably before delivering), and starts each
//! delivery as its own task. A delivery acks only after the sink confirms; a failure is nacked
//! with backoff or dead-lettered. Deliveries are never cancelled mid-flight: on shutdown the
//! loop stops claiming and the server waits for deliveries up to its grace period.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{LeaseId, LeasedTask, QueueName, TaskId};
use belfry_sinks::{Outcome, Sink};
use belfry_store::LeaseOutcome;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::metrics;
use crate::queues::QueueRuntime;
use crate::service::{Service, ServiceError, IDLE_RECHECK_MS};

/// A webhook lease lasts the sink timeout plus this margin, so a lease never expires while
/// its delivery may still succeed (which would deliver the task twice).
pub const LEASE_MARGIN_MS: u64 = 10_000;

/// Tasks claimed per store call by a dispatcher.
pub const CLAIM_BATCH_MAX: usize = 256;

/// Pause after a failed store call before trying again, so a broken store is not hammered.
const ERROR_PAUSE_MS: u64 = 500;

pub(crate) struct Dispatcher {
    pub service: Arc<Service>,
    pub runtime: Arc<QueueRuntime>,
    pub sink: Arc<dyn Sink>,
    pub visibility_ms: u64,
    pub stop: CancellationToken,
}

/// Acks of delivered webhooks waiting for the ack writer at most; beyond it, deliveries wait.
const ACKS_QUEUED_MAX: usize = 4_096;

/// Acks in one store call at most.
const ACK_BATCH_MAX: usize = 1_000;

type AckReply = oneshot::Sender<Result<LeaseOutcome, String>>;

/// Acks of one queue's delivered webhooks, coalesced: while one `ack_many` runs, the acks
/// that arrive wait and go to the store together in the next. At 10k deliveries/s an ack per
/// call cost a blocking-pool hand-off, the engine lock and a WAL write each; an ack alone
/// is not delayed (it finds the writer idle and goes at once).
struct AckBatcher {
    tx: mpsc::Sender<(TaskId, LeaseId, AckReply)>,
}

impl AckBatcher {
    /// Starts the writer; it ends when the dispatcher and its deliveries have dropped this.
    fn start(service: Arc<Service>, queue: QueueName) -> AckBatcher {
        let (tx, rx) = mpsc::channel(ACKS_QUEUED_MAX);
        tokio::spawn(ack_loop(service, queue, rx));
        AckBatcher { tx }
    }

    async fn ack(&self, id: TaskId, lease: LeaseId) -> Result<LeaseOutcome, String> {
        let (reply, answer) = oneshot::channel();
        let gone = || "the ack writer stopped".to_string();
        self.tx.send((id, lease, reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn ack_loop(
    service: Arc<Service>,
    queue: QueueName,
    mut rx: mpsc::Receiver<(TaskId, LeaseId, AckReply)>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < ACK_BATCH_MAX {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let acks: Vec<(TaskId, LeaseId)> =
            batch.iter().map(|(id, lease, _)| (*id, *lease)).collect();
        let now_ms = service.now_ms();
        let name = queue.clone();
        let result = service
            .blocking(move |s| Ok(s.ack_many(&name, &acks, now_ms)?))
            .await;
        match result {
            Ok(outcomes) if outcomes.len() == batch.len() => {
                for ((_, _, reply), outcome) in batch.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Ok(outcomes) => {
                let error = format!(
                    "the store answered {} of {} acks",
                    outcomes.len(),
                    batch.len()
                );
                for (_, _, reply) in batch {
                    let _ = reply.send(Err(error.clone()));
                }
            }
            Err(e) => {
                let error = e.to_string();
                for (_, _, reply) in batch {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

impl Dispatcher {
    pub async fn run(self) {
        let queue = self.runtime.name.clone();
        let acks = Arc::new(AckBatcher::start(self.service.clone(), queue.clone()));
        tracing::debug!(%queue, "webhook dispatcher started");
        loop {
            let mut notified = pin!(self.runtime.notified());
            notified.as_mut().enable();
            if self.stop.is_cancelled() {
                break;
            }
            let sleep = match self
                .service
                .claim_once(&self.runtime, CLAIM_BATCH_MAX, self.visibility_ms)
                .await
            {
                Ok((tasks, _)) if !tasks.is_empty() => {
                    for task in tasks {
                        let delivery = Delivery {
                            service: self.service.clone(),
                            runtime: self.runtime.clone(),
                            sink: self.sink.clone(),
                            acks: acks.clone(),
                        };
                        self.service.deliveries.spawn(delivery.run(task));
                    }
                    // More may be due already: look again at once.
                    continue;
                }
                Ok((_, Some(retry_in))) => retry_in.min(Duration::from_millis(IDLE_RECHECK_MS)),
                Ok((_, None)) if self.runtime.config().paused => {
                    Duration::from_millis(IDLE_RECHECK_MS)
                }
                Ok((_, None)) => match self.service.idle_for(&queue, Duration::MAX).await {
                    Ok(sleep) => sleep,
                    Err(e) => {
                        tracing::warn!(%queue, error = %e, "find the next due time");
                        Duration::from_millis(ERROR_PAUSE_MS)
                    }
                },
                Err(e) => {
                    tracing::warn!(%queue, error = %e, "claim due tasks for webhook delivery");
                    Duration::from_millis(ERROR_PAUSE_MS)
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = self.stop.cancelled() => break,
            }
        }
        tracing::debug!(%queue, "webhook dispatcher stopped");
    }
}

struct Delivery {
    service: Arc<Service>,
    runtime: Arc<QueueRuntime>,
    sink: Arc<dyn Sink>,
    acks: Arc<AckBatcher>,
}

impl Delivery {
    async fn run(self, leased: LeasedTask) {
        let queue = self.runtime.name.clone();
        let id = leased.task.id;
        let lease = leased.lease_id;
        let attempt = leased.task.attempts;
        let started = Instant::now();
        let outcome = self
            .sink
            .deliver(&leased.task, attempt, self.service.now_ms())
            .await;
        metrics::webhook_duration(
            queue.as_str(),
            outcome.label(),
            started.elapsed().as_secs_f64(),
        );
        let retry = self.runtime.config().retry;
        let now_ms = self.service.now_ms();
        let jitter: f64 = rand::random();
        let name = queue.clone();
        let (result, what) = match outcome {
            Outcome::Delivered => (
                self.acks
                    .ack(id, lease)
                    .await
                    .map_err(ServiceError::Internal),
                Finish::Delivered,
            ),
            Outcome::Retry { after, reason } if retry.allows_another(attempt) => {
                let delay = retry.backoff(attempt, jitter, after);
                let retry_at = now_ms.saturating_add(delay.as_millis() as u64);
                tracing::debug!(%queue, task = %id, attempt, %reason, retry_in_ms = delay.as_millis() as u64, "webhook delivery failed; will retry");
                (
                    self.service
                        .blocking(move |s| Ok(s.nack(&name, id, lease, retry_at, now_ms)?))
                        .await,
                    Finish::Retried,
                )
            }
            Outcome::Retry { reason, .. } => {
                let reason = format!("gave up after {attempt} attempts: {reason}");
                (
                    self.service
                        .blocking(move |s| Ok(s.dead_letter(&name, id, lease, &reason, now_ms)?))
                        .await,
                    Finish::Dead,
                )
            }
            Outcome::Reject { reason } => (
                self.service
                    .blocking(move |s| Ok(s.dead_letter(&name, id, lease, &reason, now_ms)?))
                    .await,
                Finish::Dead,
            ),
        };
        match result {
            Ok(LeaseOutcome::Ok) => match what {
                Finish::Delivered => metrics::delivered(queue.as_str(), 1),
                Finish::Retried => metrics::retried(queue.as_str()),
                Finish::Dead => metrics::dead_lettered(queue.as_str(), 1),
            },
            Ok(LeaseOutcome::LeaseExpired | LeaseOutcome::NotFound) => {
                // The lease ran out (or the queue was deleted) while we delivered: the task is
                // due again and will be delivered again, which at-least-once allows.
                tracing::warn!(%queue, task = %id, "lease ended during webhook delivery; the task will be delivered again");
            }
            Err(e) => {
                tracing::error!(%queue, task = %id, error = %e, "record the webhook delivery outcome; the task will be delivered again when its lease expires");
            }
        }
        self.runtime.release(id);
        // A nack may have made the task due sooner than the dispatcher's current sleep.
        self.runtime.wake();
    }
}

enum Finish {
    Delivered,
    Retried,
    Dead,
}
