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

/// Claims up to `max` due tasks of `runtime`'s queue, leased for `visibility_ms`.
pub async fn claim_once(
    shared: &Shared,
    runtime: &QueueRuntime,
    max: usize,
    visibility_ms: u64,
    caller: Caller,
) -> Result<Claimed> {
    let now_ms = shared.now_ms();
    let request = match ClaimRequest::admit(shared, runtime, max, visibility_ms, now_ms) {
        Ok(request) => request,
        Err(held_back) => return Ok(held_back),
    };
    let granted = request.granted;
    let name = runtime.name.clone();
    let found = shared
        .blocking(caller, move |s| {
            Ok(claim_in_store(s, &name, &request, now_ms))
        })
        .await
        .and_then(|found| found);
    settle(shared, runtime, granted, found, now_ms)
}

/// Claims for several queues in one store call (one blocking-pool hand-off and one admission
/// slot instead of one each): the dispatcher's turn when many queues are ready at once. Each
/// queue's claim succeeds or fails on its own. `want` is each queue's (runtime, max,
/// visibility); answers come back in the same order.
pub async fn claim_many(
    shared: &Shared,
    want: &[(std::sync::Arc<QueueRuntime>, usize, u64)],
) -> Vec<Result<Claimed>> {
    let now_ms = shared.now_ms();
    let mut answers: Vec<Option<Result<Claimed>>> = Vec::with_capacity(want.len());
    let mut requests = Vec::new();
    for (index, (runtime, max, visibility_ms)) in want.iter().enumerate() {
        match ClaimRequest::admit(shared, runtime, *max, *visibility_ms, now_ms) {
            Ok(request) => {
                requests.push((index, runtime.name.clone(), request));
                answers.push(None);
            }
            Err(held_back) => answers.push(Some(Ok(held_back))),
        }
    }
    if requests.is_empty() {
        return answers.into_iter().flatten().collect();
    }
    let grants: Vec<(usize, usize)> = requests
        .iter()
        .map(|(index, _, request)| (*index, request.granted))
        .collect();
    let found = shared
        .blocking(Caller::Internal, move |s| {
            Ok(requests
                .iter()
                .map(|(_, name, request)| claim_in_store(s, name, request, now_ms))
                .collect::<Vec<_>>())
        })
        .await;
    match found {
        Ok(found) => {
            for ((index, granted), found) in grants.into_iter().zip(found) {
                answers[index] = Some(settle(shared, &want[index].0, granted, found, now_ms));
            }
        }
        Err(error) => {
            let message = error.to_string();
            for (index, granted) in grants {
                let failed = Err(crate::shared::ServiceError::Internal(message.clone()));
                answers[index] = Some(settle(shared, &want[index].0, granted, failed, now_ms));
            }
        }
    }
    answers
        .into_iter()
        .map(|answer| answer.expect("every queue answered"))
        .collect()
}

/// What the queue's policy granted one claim, taken before the store call.
struct ClaimRequest {
    granted: usize,
    visibility_ms: u64,
    retry: belfry_core::RetryPolicy,
}

impl ClaimRequest {
    /// Takes what the rate limit and in-flight cap allow; `Err` is the answer when they
    /// allow nothing (with how long to wait), so no store call is made.
    fn admit(
        shared: &Shared,
        runtime: &QueueRuntime,
        max: usize,
        visibility_ms: u64,
        now_ms: UnixMs,
    ) -> std::result::Result<ClaimRequest, Claimed> {
        let in_flight_default = shared.config.webhook_in_flight_default;
        let admission = runtime.admit(max, shared.clock.monotonic(), now_ms, in_flight_default);
        if admission.granted == 0 {
            return Err(Claimed {
                retry_in: admission.retry_in,
                ..Claimed::default()
            });
        }
        Ok(ClaimRequest {
            granted: admission.granted,
            visibility_ms,
            retry: runtime.config().retry,
        })
    }
}

/// What the store handed out for one claim: the leases, how many tasks it finished instead
/// (skipped late; dead late or out of attempts), and the next due time when it had fewer
/// than granted.
type Found = (Vec<LeasedTask>, (usize, usize), Option<Option<UnixMs>>);

/// The store side of one claim (on the blocking pool).
fn claim_in_store(
    s: &dyn belfry_store::Store,
    name: &belfry_core::QueueName,
    request: &ClaimRequest,
    now_ms: UnixMs,
) -> Result<Found> {
    let granted = request.granted;
    let batch = s.claim(name, now_ms, granted, request.visibility_ms)?;
    let mut leased = Vec::with_capacity(batch.leased.len());
    let mut exhausted = 0;
    for task in batch.leased {
        let action = outcome::decide(
            &AttemptEnd::LeaseExpired,
            task.task.attempts,
            &request.retry,
            now_ms,
            0.0,
        );
        match action {
            Action::Proceed => leased.push(task),
            other => {
                outcome::apply(s, name, task.task.id, task.lease_id, &other, now_ms)?;
                exhausted += 1;
            }
        }
    }
    let next_due_ms = if leased.len() + exhausted < granted {
        Some(s.next_due_ms(name)?)
    } else {
        None
    };
    let finished = (batch.late_skipped.len(), batch.late_dead.len() + exhausted);
    Ok((leased, finished, next_due_ms))
}

/// Gives back what the claim did not use of its grant, notes the leases against the
/// in-flight cap, and records the metrics.
fn settle(
    shared: &Shared,
    runtime: &QueueRuntime,
    granted: usize,
    found: Result<Found>,
    now_ms: UnixMs,
) -> Result<Claimed> {
    let in_flight_default = shared.config.webhook_in_flight_default;
    let (leased, (skipped, dead), next_due_ms) = match found {
        Ok(found) => found,
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
