//! The one place that decides what becomes of a delivery attempt.
//!
//! "Delivered → ack; transient failure → retry with the queue's backoff; permanent failure or
//! out of attempts → dead letter" used to be written three times (pull nack, push delivery,
//! leases that expired past the last attempt). Every path now describes how the attempt ended
//! as an [`AttemptEnd`] and applies what [`decide`] answers. The function is pure: the
//! jitter and the clock are arguments, so one table test covers every case.

use std::time::Duration;

use belfry_core::{LeaseId, QueueName, RetryPolicy, TaskId, UnixMs};
use belfry_sinks::Outcome;
use belfry_store::{LeaseOutcome, Store, StoreError};

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The consumer or sink took the task.
    Delivered,
    /// A transient failure: worth trying again, when attempts remain.
    Failed { reason: String, hint: RetryHint },
    /// A permanent failure: trying again cannot help.
    Rejected { reason: String },
    /// The task was claimed again because its previous lease expired without an answer
    /// (the consumer crashed, or a delivery outlived its lease). `attempts` counts the new
    /// attempt too.
    LeaseExpired,
}

/// When a failed attempt asks to be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    /// The queue's exponential backoff with jitter.
    Backoff,
    /// The backoff, but no sooner than this (an HTTP `Retry-After`, already capped by the sink).
    NotBefore(Duration),
    /// Exactly this delay (a pull consumer's `nack` with `delay_ms`).
    After(Duration),
}

/// What to do with the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Finish it (`Store::ack`).
    Ack,
    /// Due again at `at_ms` (`Store::nack`).
    Retry { at_ms: UnixMs },
    /// Move it to the dead letters with this reason (`Store::dead_letter`).
    Dead { reason: String },
    /// Move it to the dead letters without counting the attempt of the claim that found it
    /// out of attempts (`Store::dead_letter_untried`): that attempt was never made.
    DeadUntried { reason: String },
    /// Go on with the current attempt (a re-claim that still has attempts left).
    Proceed,
}

/// Decides the fate of a task whose attempt number `attempts` (1-based, counting this attempt)
/// ended as `end`, under `policy`. `jitter` is in `[0, 1]`.
pub fn decide(
    end: &AttemptEnd,
    attempts: u32,
    policy: &RetryPolicy,
    now_ms: UnixMs,
    jitter: f64,
) -> Action {
    match end {
        AttemptEnd::Delivered => Action::Ack,
        AttemptEnd::Rejected { reason } => Action::Dead {
            reason: reason.clone(),
        },
        AttemptEnd::Failed { reason, hint } => {
            if !policy.allows_another(attempts) {
                return Action::Dead {
                    reason: format!(
                        "gave up after {attempts} attempt{}: {reason}",
                        if attempts == 1 { "" } else { "s" }
                    ),
                };
            }
            let delay = match *hint {
                RetryHint::Backoff => policy.backoff(attempts, jitter, None),
                RetryHint::NotBefore(at_least) => policy.backoff(attempts, jitter, Some(at_least)),
                RetryHint::After(exactly) => exactly,
            };
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            Action::Retry {
                at_ms: now_ms.saturating_add(delay_ms),
            }
        }
        AttemptEnd::LeaseExpired => {
            // The attempt before this one got no answer; this one may only go ahead if the
            // policy allows it.
            let before = attempts.saturating_sub(1);
            if policy.allows_another(before) {
                Action::Proceed
            } else {
                Action::DeadUntried {
                    reason: format!(
                        "no acknowledgement after {before} attempt{} (retry.max_attempts is {})",
                        if before == 1 { "" } else { "s" },
                        policy.max_attempts
                    ),
                }
            }
        }
    }
}

impl AttemptEnd {
    /// A sink's answer, as an attempt end.
    pub fn from_sink(outcome: Outcome) -> AttemptEnd {
        match outcome {
            Outcome::Delivered => AttemptEnd::Delivered,
            Outcome::Retry { after, reason } => AttemptEnd::Failed {
                reason,
                hint: after.map_or(RetryHint::Backoff, RetryHint::NotBefore),
            },
            Outcome::Reject { reason } => AttemptEnd::Rejected { reason },
        }
    }
}

/// Applies `action` to a leased task in the store. `Proceed` changes nothing.
pub fn apply(
    store: &dyn Store,
    queue: &QueueName,
    id: TaskId,
    lease: LeaseId,
    action: &Action,
    now_ms: UnixMs,
) -> Result<LeaseOutcome, StoreError> {
    match action {
        Action::Ack => store.ack(queue, id, lease, now_ms),
        Action::Retry { at_ms } => store.nack(queue, id, lease, *at_ms, now_ms),
        Action::Dead { reason } => store.dead_letter(queue, id, lease, reason, now_ms),
        Action::DeadUntried { reason } => {
            store.dead_letter_untried(queue, id, lease, reason, now_ms)
        }
        Action::Proceed => Ok(LeaseOutcome::Ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: UnixMs = 1_000_000;

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            backoff_initial_ms: 1_000,
            backoff_max_ms: 8_000,
        }
    }

    fn failed(hint: RetryHint) -> AttemptEnd {
        AttemptEnd::Failed {
            reason: "HTTP 503".into(),
            hint,
        }
    }

    fn retry_in(ms: u64) -> Action {
        Action::Retry { at_ms: NOW + ms }
    }

    fn dead(reason: &str) -> Action {
        Action::Dead {
            reason: reason.into(),
        }
    }

    fn untried(reason: &str) -> Action {
        Action::DeadUntried {
            reason: reason.into(),
        }
    }

    /// Every (attempt end, attempts used, policy) → action, in one table. Jitter 0 makes the
    /// backoff its lower half: 500 ms after the first attempt, 1 s after the second, ...
    #[test]
    fn every_outcome_attempt_and_policy() {
        let rejected = AttemptEnd::Rejected {
            reason: "HTTP 404".into(),
        };
        let table: Vec<(AttemptEnd, u32, u32, Action)> = vec![
            // Delivered is acked whatever the attempt count.
            (AttemptEnd::Delivered, 1, 3, Action::Ack),
            (AttemptEnd::Delivered, 3, 3, Action::Ack),
            // Transient with attempts left: the queue's backoff.
            (failed(RetryHint::Backoff), 1, 3, retry_in(500)),
            (failed(RetryHint::Backoff), 2, 3, retry_in(1_000)),
            // Retry-After longer than the backoff wins; shorter does not.
            (
                failed(RetryHint::NotBefore(Duration::from_secs(5))),
                1,
                3,
                retry_in(5_000),
            ),
            (
                failed(RetryHint::NotBefore(Duration::from_millis(10))),
                1,
                3,
                retry_in(500),
            ),
            // A pull consumer's explicit delay is taken as given.
            (
                failed(RetryHint::After(Duration::from_millis(42))),
                1,
                3,
                retry_in(42),
            ),
            (failed(RetryHint::After(Duration::ZERO)), 2, 3, retry_in(0)),
            // Transient on the last attempt: dead, with the count and the last reason.
            (
                failed(RetryHint::Backoff),
                3,
                3,
                dead("gave up after 3 attempts: HTTP 503"),
            ),
            (
                failed(RetryHint::After(Duration::from_millis(1))),
                1,
                1,
                dead("gave up after 1 attempt: HTTP 503"),
            ),
            // Permanent: dead at once, even with attempts left.
            (rejected.clone(), 1, 3, dead("HTTP 404")),
            (rejected, 3, 3, dead("HTTP 404")),
            // A re-claim after an expired lease proceeds while attempts remain ...
            (AttemptEnd::LeaseExpired, 2, 3, Action::Proceed),
            (AttemptEnd::LeaseExpired, 3, 3, Action::Proceed),
            // ... and is dead once the expired attempt was the last one.
            (
                AttemptEnd::LeaseExpired,
                4,
                3,
                untried("no acknowledgement after 3 attempts (retry.max_attempts is 3)"),
            ),
            (
                AttemptEnd::LeaseExpired,
                2,
                1,
                untried("no acknowledgement after 1 attempt (retry.max_attempts is 1)"),
            ),
        ];
        for (end, attempts, max_attempts, expected) in table {
            let got = decide(&end, attempts, &policy(max_attempts), NOW, 0.0);
            assert_eq!(
                got, expected,
                "{end:?} on attempt {attempts} of {max_attempts}"
            );
        }
    }

    #[test]
    fn sink_outcomes_map_onto_attempt_ends() {
        assert_eq!(
            AttemptEnd::from_sink(Outcome::Delivered),
            AttemptEnd::Delivered
        );
        assert_eq!(
            AttemptEnd::from_sink(Outcome::Retry {
                after: Some(Duration::from_secs(2)),
                reason: "r".into()
            }),
            AttemptEnd::Failed {
                reason: "r".into(),
                hint: RetryHint::NotBefore(Duration::from_secs(2))
            }
        );
        assert_eq!(
            AttemptEnd::from_sink(Outcome::Retry {
                after: None,
                reason: "r".into()
            }),
            failed_with("r", RetryHint::Backoff)
        );
        assert_eq!(
            AttemptEnd::from_sink(Outcome::Reject { reason: "x".into() }),
            AttemptEnd::Rejected { reason: "x".into() }
        );
    }

    fn failed_with(reason: &str, hint: RetryHint) -> AttemptEnd {
        AttemptEnd::Failed {
            reason: reason.into(),
            hint,
        }
    }
}
