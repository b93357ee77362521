//! Claiming due tasks of one queue under its policy: the one path by which tasks leave the
//! store, for pull leases and push dispatch alike.
//!
//! A claim takes what the queue's rate limit and in-flight cap allow, leases that many due
//! tasks, and sends a task whose previous lease expired on its last attempt to the dead
//! letters (through [`crate::outcome::decide`]) instead of handing it out again.

use std::time::Duration;

use belfry_core::{LeaseId, LeasedTask, UnixMs};

use crate::metrics;
use crate::outcome::{self, Action, AttemptEnd};
use crate::queues::QueueRuntime;
use crate::shared::{Caller, Result, Shared};

/// What one claim got.
#[derive(Debug, Default)]
pub struct Claimed {
    pub leased: Vec<LeasedTask>,
    /// When nothing was granted: how long the rate or in-flight limit asks to wait.
    pub retry_in: Option<Duration>,
    /// How many tasks the policy granted (the claim asked the store for this many).
    pub granted: usize,
    /// When the store had fewer due tasks than granted: the earliest instant it could have
    /// more (`Store::next_due_ms`, read in the same store call), `None` if it holds nothing.
    pub next_due_ms: Option<Option<UnixMs>>,
}

/// Who claims, which decides which part of the queue the claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimFor {
    /// A pull lease: any due task (the lease itself is the exclusivity), through
    /// `Store::claim` and `Store::next_due_ms`.
    Lease,
    /// The push dispatcher: only the part of the queue this node owns, through
    /// `Store::claim_owned` and `Store::next_due_owned_ms`, so that with several nodes on
    /// one store each due task is dispatched by one node.
    Push,
}

/// Claims up to `max` due tasks of `runtime`'s queue, leased for `visibility_ms`.
pub async fn claim_once(
    shared: &Shared,
    runtime: &QueueRuntime,
    max: usize,
    visibility_ms: u64,
    caller: Caller,
    claim_for: ClaimFor,
) -> Result<Claimed> {
    let now_ms = shared.now_ms();
    let in_flight_default = shared.config.webhook_in_flight_default;
    let admission = runtime.admit(max, shared.clock.monotonic(), now_ms, in_flight_default);
    if admission.granted == 0 {
        return Ok(Claimed {
            retry_in: admission.retry_in,
            ..Claimed::default()
        });
    }
    let granted = admission.granted;
    let name = runtime.name.clone();
    let config = runtime.config();
    let retry = config.retry;
    let rate = (config.rate_per_s > 0.0).then(|| (config.rate_per_s, config.effective_burst()));
    let claimed = shared
        .blocking(caller, move |s| {
            // With several nodes on one store, the queue's rate is theirs together: the
            // store's shared bucket grants what this node's own bucket allowed, or less.
            let allowed = match rate {
                Some((per_s, burst)) => s
                    .take_rate_tokens(&name, granted as u64, per_s, burst)?
                    .map_or(granted, |n| (n as usize).min(granted)),
                None => granted,
            };
            if allowed == 0 {
                return Ok(None);
            }
            let batch = match claim_for {
                ClaimFor::Lease => s.claim(&name, now_ms, allowed, visibility_ms)?,
                ClaimFor::Push => s.claim_owned(&name, now_ms, allowed, visibility_ms)?,
            };
            let mut leased = Vec::with_capacity(batch.leased.len());
            let mut exhausted = 0;
            for task in batch.leased {
                let action = outcome::decide(
                    &AttemptEnd::LeaseExpired,
                    task.task.attempts,
                    &retry,
                    now_ms,
                    0.0,
                );
                match action {
                    Action::Proceed => leased.push(task),
                    other => {
                        outcome::apply(s, &name, task.task.id, task.lease_id, &other, now_ms)?;
                        exhausted += 1;
                    }
                }
            }
            if let Some((per_s, burst)) = rate {
                give_back_tokens(s, &name, allowed - leased.len().min(allowed), per_s, burst);
            }
            let next_due_ms = if leased.len() + exhausted < allowed {
                Some(match claim_for {
                    ClaimFor::Lease => s.next_due_ms(&name)?,
                    ClaimFor::Push => s.next_due_owned_ms(&name)?,
                })
            } else {
                None
            };
            let finished = (batch.late_skipped.len(), batch.late_dead.len() + exhausted);
            Ok(Some((leased, finished, next_due_ms)))
        })
        .await;
    let (leased, (skipped, dead), next_due_ms) = match claimed {
        Ok(Some(claimed)) => claimed,
        Ok(None) => {
            // The shared bucket is empty: other nodes took this second's tokens.
            runtime.settle(granted, &[], in_flight_default);
            let per_s = rate.map_or(1.0, |(per_s, _)| per_s);
            return Ok(Claimed {
                retry_in: Some(Duration::from_secs_f64(1.0 / per_s).max(Duration::from_millis(1))),
                ..Claimed::default()
            });
        }
        Err(e) => {
            runtime.settle(granted, &[], in_flight_default);
            return Err(e);
        }
    };
    let leases: Vec<(LeaseId, UnixMs)> = leased
        .iter()
        .map(|t| (t.lease_id, t.lease_until_ms))
        .collect();
    runtime.settle(granted, &leases, in_flight_default);
    record_metrics(runtime.name.as_str(), &leased, skipped, dead, now_ms);
    Ok(Claimed {
        leased,
        retry_in: None,
        granted,
        next_due_ms,
    })
}

/// Returns tokens of the shared bucket a claim did not use. A failure only leaves the bucket
/// emptier for a moment (it refills at the queue's rate), so it does not fail the claim,
/// whose tasks are already leased.
fn give_back_tokens(
    s: &dyn belfry_store::Store,
    queue: &belfry_core::QueueName,
    unused: usize,
    per_s: f64,
    burst: f64,
) {
    if unused == 0 {
        return;
    }
    if let Err(error) = s.return_rate_tokens(queue, unused as u64, per_s, burst) {
        tracing::debug!(%queue, %error, "return unused rate tokens");
    }
}

fn record_metrics(queue: &str, leased: &[LeasedTask], skipped: usize, dead: usize, now_ms: UnixMs) {
    if skipped > 0 {
        metrics::skipped_late(queue, skipped);
    }
    if dead > 0 {
        metrics::dead_lettered(queue, dead);
    }
    if !leased.is_empty() {
        metrics::dispatched(queue, leased.len());
        metrics::lateness(
            queue,
            leased.iter().map(|task| {
                // The store's promise, checked: nothing is handed out before it is due.
                debug_assert!(task.task.due_at_ms <= now_ms, "claimed a task before due");
                now_ms.saturating_sub(task.task.due_at_ms)
            }),
        );
    }
}
