//! One delivery call: a task (or a batch, for sinks that publish many per round trip) handed
//! to its sink, each outcome decided by [`crate::outcome::decide`] and recorded by the
//! writer. The budget the claim took is held until then, and given back when this ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{LeaseId, LeasedTask, TaskId};
use belfry_sinks::{Attempt, Outcome};
use belfry_store::LeaseOutcome;
use tokio::sync::OwnedSemaphorePermit;

use super::{Dispatcher, Push};
use crate::log_every::LogEvery;
use crate::metrics;
use crate::outcome::{decide, Action, AttemptEnd};
use crate::queues::QueueRuntime;

/// Outcome writes fail task by task while the store is unreachable: one line per period.
static OUTCOME_WRITE_ERRORS: LogEvery = LogEvery::new(Duration::from_secs(10));
/// Dead letters made by push delivery: one line per ten seconds, not per task (a receiver
/// that refuses everything would write one per task; `belfry_tasks_dead_lettered_total`
/// counts them all).
static DEAD_LETTERS: LogEvery = LogEvery::new(Duration::from_secs(10));

/// Budget a delivery holds (only to give it back when it ends): its tasks' share of the
/// global cap and one call to its target. A delivery to a task's own target holds no call to
/// the queue's target: it does not go there, and a slow target of the producer's choosing
/// must not hold the calls other queues on the queue's host need. It is still bounded by its
/// queue's in-flight limit and the global cap.
pub(super) struct Budget {
    _tasks: OwnedSemaphorePermit,
    _call: Option<OwnedSemaphorePermit>,
}

impl Dispatcher {
    /// Starts deliveries for claimed tasks, in calls of the sink's batch size, each with its
    /// share of `tasks` and one of `calls`. Budget not needed (the claim got fewer tasks) is
    /// given back at once.
    pub(super) fn start_deliveries(
        self: &Arc<Dispatcher>,
        runtime: &Arc<QueueRuntime>,
        push: &Arc<Push>,
        leased: Vec<LeasedTask>,
        mut tasks: OwnedSemaphorePermit,
        mut calls: OwnedSemaphorePermit,
    ) {
        let mut leased = leased.into_iter().peekable();
        while leased.peek().is_some() {
            let batch: Vec<LeasedTask> = leased.by_ref().take(push.batch_max).collect();
            let (Some(task_share), Some(call)) = (tasks.split(batch.len()), calls.split(1)) else {
                // The claim never leases more than the budget it was given.
                debug_assert!(false, "claimed more tasks than the budget taken");
                // Not delivered: their slots go back (their leases expire, they come again).
                for task in batch.into_iter().chain(leased) {
                    runtime.release(task.lease_id);
                }
                break;
            };
            let own_target = batch.iter().all(|leased| leased.task.target.is_some());
            let budget = Budget {
                _tasks: task_share,
                _call: (!own_target).then_some(call),
            };
            let job = DeliveryJob {
                dispatcher: self.clone(),
                runtime: runtime.clone(),
                push: push.clone(),
            };
            push.deliveries.spawn(job.run(batch, budget));
        }
        drop((tasks, calls));
    }
}

/// A delivery's in-flight slots, by lease (not by task: a task whose lease ran out may be in
/// a newer delivery already), released when the delivery ends or its task unwinds.
struct Slots {
    runtime: Arc<QueueRuntime>,
    leases: Vec<LeaseId>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        for lease in &self.leases {
            self.runtime.release(*lease);
        }
    }
}

struct DeliveryJob {
    dispatcher: Arc<Dispatcher>,
    runtime: Arc<QueueRuntime>,
    push: Arc<Push>,
}

/// What the writer will answer for one task's outcome: the write's result, once made.
type Answer = tokio::sync::oneshot::Receiver<Result<LeaseOutcome, String>>;

impl DeliveryJob {
    async fn run(self, batch: Vec<LeasedTask>, budget: Budget) {
        // The queue's in-flight slots are held until this delivery ends, however it ends.
        let slots = Slots {
            runtime: self.runtime.clone(),
            leases: batch.iter().map(|t| t.lease_id).collect(),
        };
        // A task whose lease ran out before its delivery starts (the process was paused or
        // starved between claim and call) is not sent: it is due again, and the claim that
        // takes it, perhaps another node's, delivers it. Sending it here too would deliver it
        // twice at once.
        let now_ms = self.dispatcher.shared.now_ms();
        let before = batch.len();
        let batch: Vec<LeasedTask> = batch
            .into_iter()
            .filter(|t| t.lease_until_ms > now_ms)
            .collect();
        if batch.len() < before {
            tracing::info!(queue = %self.runtime.name, tasks = before - batch.len(), "deliveries not started: their leases ran out after the claim (a pause?); the tasks are due again");
        }
        let started = Instant::now();
        let outcomes = self.deliver(&batch).await;
        let seconds = started.elapsed().as_secs_f64();
        let answers = self.record(&batch, outcomes, seconds).await;
        let retried = self.settle(answers).await;
        drop(slots);
        drop(budget);
        self.dispatcher.released();
        if retried {
            // A retry may be due sooner than the queue's current timer.
            self.runtime.wake();
        }
    }

    /// Hands the batch to the sink: one call, one outcome per task (a batch for sinks that
    /// publish many per round trip).
    async fn deliver(&self, batch: &[LeasedTask]) -> Vec<Outcome> {
        let now_ms = self.dispatcher.shared.now_ms();
        if let [one] = batch {
            return vec![
                self.push
                    .sink
                    .deliver(&one.task, one.task.attempts, now_ms)
                    .await,
            ];
        }
        let attempts: Vec<Attempt<'_>> = batch
            .iter()
            .map(|t| Attempt {
                task: &t.task,
                attempt: t.task.attempts,
            })
            .collect();
        self.push.sink.deliver_batch(&attempts, now_ms).await
    }

    /// Decides what becomes of each task from its outcome (a missing outcome is a retry) and
    /// queues the decision with the outcome writer.
    async fn record(
        &self,
        batch: &[LeasedTask],
        outcomes: Vec<Outcome>,
        seconds: f64,
    ) -> Vec<(TaskId, Action, Answer)> {
        let queue = &self.runtime.name;
        let retry = self.runtime.config().retry;
        let now_ms = self.dispatcher.shared.now_ms();
        let mut answers = Vec::with_capacity(batch.len());
        let mut outcomes = outcomes.into_iter();
        for leased in batch {
            let outcome = outcomes.next().unwrap_or_else(|| Outcome::Retry {
                after: None,
                reason: format!(
                    "the sink answered fewer outcomes than the {} tasks it was given",
                    batch.len()
                ),
            });
            metrics::sink_duration(queue.as_str(), self.push.kind, outcome.label(), seconds);
            let attempt = leased.task.attempts;
            let action = decide(
                &AttemptEnd::from_sink(outcome),
                attempt,
                &retry,
                now_ms,
                rand::random(),
            );
            if let Action::Retry { at_ms } = &action {
                tracing::debug!(%queue, task = %leased.task.id, attempt, retry_in_ms = at_ms.saturating_sub(now_ms), "delivery failed; will retry");
            }
            let answer = self
                .dispatcher
                .writer
                .record(
                    queue.clone(),
                    leased.task.id,
                    leased.lease_id,
                    action.clone(),
                )
                .await;
            answers.push((leased.task.id, action, answer));
        }
        answers
    }

    /// Waits for each outcome's write and counts what it did; true if a task was retried.
    async fn settle(&self, answers: Vec<(TaskId, Action, Answer)>) -> bool {
        let queue = &self.runtime.name;
        let mut retried = false;
        for (id, action, answer) in answers {
            let result = answer
                .await
                .unwrap_or_else(|_| Err("the outcome writer stopped".into()));
            match result {
                Ok(LeaseOutcome::Ok) => match action {
                    Action::Ack => metrics::delivered(queue.as_str(), 1),
                    Action::Retry { .. } => {
                        metrics::retried(queue.as_str());
                        retried = true;
                    }
                    Action::Dead { reason } | Action::DeadUntried { reason } => {
                        if let Some(held_back) = DEAD_LETTERS.check(Instant::now()) {
                            tracing::warn!(%queue, task = %id, %reason, held_back, "delivery gave up; the task is a dead letter (`held_back`: dead letters of any queue not logged since the last line)");
                        }
                        metrics::dead_lettered(queue.as_str(), 1)
                    }
                    Action::Proceed => {}
                },
                Ok(LeaseOutcome::LeaseExpired) => {
                    // The lease ran out while we delivered: the task is due again and will be
                    // delivered again, as at-least-once allows.
                    tracing::warn!(%queue, task = %id, "lease ended during delivery; the task will be delivered again");
                }
                Ok(LeaseOutcome::NotFound) => {
                    // The task, or its whole queue, was deleted while we delivered.
                    tracing::info!(%queue, task = %id, "the task was deleted during its delivery (with its queue?); nothing to record");
                }
                Err(error) => {
                    metrics::outcome_write_error();
                    if let Some(held_back) = OUTCOME_WRITE_ERRORS.check(Instant::now()) {
                        tracing::error!(%queue, task = %id, %error, held_back, "record the delivery outcome; the task will be delivered again when its lease expires (`held_back`: failures not logged since the last line)");
                    }
                }
            }
        }
        retried
    }
}
