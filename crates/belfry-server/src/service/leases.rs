//! Pull consumers: long-poll leases, ack (one or a batch), nack and extend.

use std::pin::pin;
use std::time::Duration;

use belfry_core::{LeaseId, LeasedTask, QueueName, TaskId, UnixMs};
use belfry_store::LeaseOutcome;

use super::{Result, Service, ServiceError};
use crate::claim::{claim_once, ClaimFor};
use crate::dispatch::IDLE_RECHECK_MS;
use crate::metrics;
use crate::outcome::{self, Action, AttemptEnd, RetryHint};
use crate::shared::Caller;

/// What happened to a nacked task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackResult {
    Retry {
        due_at_ms: UnixMs,
    },
    /// The task used its last attempt and is now a dead letter.
    Dead,
}

impl Service {
    /// Leases due tasks of a pull queue, waiting up to `wait` for some to become due.
    pub async fn lease(
        &self,
        queue: &QueueName,
        max: usize,
        visibility_ms: u64,
        wait: Duration,
    ) -> Result<Vec<LeasedTask>> {
        let runtime = self.runtime(queue).await?;
        if let Some(spec) = runtime.config().sink() {
            return Err(ServiceError::NotPullQueue(queue.clone(), spec.kind()));
        }
        let deadline = self.clock.monotonic().saturating_add(wait);
        loop {
            let mut notified = pin!(runtime.notified());
            notified.as_mut().enable();
            if self.stopping.is_cancelled() {
                return Ok(Vec::new());
            }
            let claimed = claim_once(
                self,
                &runtime,
                max,
                visibility_ms,
                Caller::Api,
                ClaimFor::Lease,
            )
            .await?;
            if !claimed.leased.is_empty() {
                return Ok(claimed.leased);
            }
            let now = self.clock.monotonic();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let left = deadline - now;
            let recheck = Duration::from_millis(IDLE_RECHECK_MS);
            let sleep = match (claimed.retry_in, claimed.next_due_ms) {
                // The rate or in-flight limit: a token or a slot frees up then.
                (Some(retry_in), _) => retry_in.min(recheck),
                // One millisecond past the gap, so the wall clock has reached the due time
                // when we look again (timers round to milliseconds).
                (None, Some(Some(due))) => {
                    Duration::from_millis(due.saturating_sub(self.now_ms()).saturating_add(1))
                        .min(recheck)
                }
                // Paused, or nothing to deliver: a wake-up (or the recheck) ends the wait.
                (None, _) => recheck,
            }
            .min(left);
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
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let outcome = self
            .delivery(move |s| Ok(s.ack(&name, id, lease, now_ms)?))
            .await?;
        lease_result(id, outcome)?;
        runtime.release(lease);
        metrics::delivered(queue.as_str(), 1);
        Ok(())
    }

    /// Acks many tasks in one store round trip; one result per input, in order.
    pub async fn ack_batch(
        &self,
        queue: &QueueName,
        acks: Vec<(TaskId, LeaseId)>,
    ) -> Result<Vec<Result<()>>> {
        let runtime = self.runtime(queue).await?;
        let now_ms = self.now_ms();
        // One store call for the whole batch: the embedded engine then takes its lock once
        // per 128 acks and writes one WAL frame for each, rather than one of each per task
        // (which capped burst dispatch), and waits for the WAL once. Parallel groups of
        // acks only contended for the engine's locks (A/B at 100k due/s in BENCHMARKS.md:
        // p99 lateness 10-19 ms with one group, 45-395 ms with 256), so the batch stays
        // one call.
        let name = queue.clone();
        let outcomes = self
            .delivery(move |s| {
                let outcomes = s.ack_many(&name, &acks, now_ms)?;
                if outcomes.len() != acks.len() {
                    return Err(ServiceError::Internal(format!(
                        "the store answered {} of {} acks",
                        outcomes.len(),
                        acks.len()
                    )));
                }
                Ok(acks.into_iter().zip(outcomes).collect::<Vec<_>>())
            })
            .await?;
        let mut done = 0;
        let results = outcomes
            .into_iter()
            .map(|((id, lease), outcome)| {
                let result = lease_result(id, outcome);
                if result.is_ok() {
                    runtime.release(lease);
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
        let runtime = self.runtime(queue).await?;
        let retry = runtime.config().retry;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let jitter: f64 = rand::random();
        let end = AttemptEnd::Failed {
            reason: reason.unwrap_or_else(|| "nacked by the consumer".to_owned()),
            hint: delay_ms.map_or(RetryHint::Backoff, |ms| {
                RetryHint::After(Duration::from_millis(ms))
            }),
        };
        let (outcome, result) = self
            .blocking(move |s| {
                let Some(task) = s.get(&name, id, now_ms)? else {
                    return Ok((LeaseOutcome::NotFound, NackResult::Dead));
                };
                let action = outcome::decide(&end, task.attempts, &retry, now_ms, jitter);
                let result = match action {
                    Action::Retry { at_ms } => NackResult::Retry { due_at_ms: at_ms },
                    _ => NackResult::Dead,
                };
                Ok((
                    outcome::apply(s, &name, id, lease, &action, now_ms)?,
                    result,
                ))
            })
            .await?;
        lease_result(id, outcome)?;
        runtime.release(lease);
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
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let until = now_ms.saturating_add(visibility_ms);
        let outcome = self
            .delivery(move |s| Ok(s.extend(&name, id, lease, until, now_ms)?))
            .await?;
        lease_result(id, outcome)?;
        runtime.extended(lease, until);
        Ok(until)
    }
}

pub fn lease_result(id: TaskId, outcome: LeaseOutcome) -> Result<()> {
    match outcome {
        LeaseOutcome::Ok => Ok(()),
        LeaseOutcome::NotFound => Err(ServiceError::TaskNotFound(id)),
        LeaseOutcome::LeaseExpired => Err(ServiceError::LeaseExpired(id)),
    }
}
