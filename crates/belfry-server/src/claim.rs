//! Claiming due tasks of one queue under its policy: the one path by which tasks leave the
//! store, for pull leases and push dispatch alike.
//!
//! A claim takes what the queue's rate limit and in-flight cap allow (this node's own, and on
//! a store several nodes share, the store's shared ones too), leases that many due tasks, and
//! sends a task whose previous lease expired on its last attempt to the dead letters (through
//! [`crate::outcome::decide`]) instead of handing it out again.

use std::time::Duration;

use belfry_core::{LeaseId, LeasedTask, QueueName, RetryPolicy, UnixMs};
use belfry_store::Store;

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
    let config = runtime.config();
    let plan = Plan {
        name: runtime.name.clone(),
        granted,
        now_ms,
        visibility_ms,
        claim_for,
        retry: config.retry,
        rate: (config.rate_per_s > 0.0).then(|| (config.rate_per_s, config.effective_burst())),
        // Only a cap the queue sets is shared across nodes: a push queue without one is held
        // to `webhooks.in_flight_default` per node, by this node's own count, so its claims
        // make no extra store calls (two per claim, measured as the bulk of a 10k due/s
        // p99 across 3 nodes).
        cap: (config.max_in_flight > 0).then_some(config.max_in_flight as usize),
    };
    let quick = shared.store.claim_is_quick(&runtime.name, now_ms);
    let claimed = shared.delivery(caller, quick, move |s| plan.run(s)).await;
    let (leased, ended, next_due_ms) = match claimed {
        Ok(StoreClaim::Claimed(claimed)) => claimed,
        Ok(StoreClaim::Limited(retry_in)) => {
            // The shared limits are spent: other nodes took this second's tokens, or hold
            // the queue's in-flight room.
            runtime.settle(granted, &[], in_flight_default);
            return Ok(Claimed {
                retry_in: Some(retry_in),
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
    record_metrics(runtime.name.as_str(), &leased, &ended, now_ms);
    Ok(Claimed {
        leased,
        retry_in: None,
        granted,
        next_due_ms,
    })
}

/// How many store claims one claim makes at most when the tasks it got were out of attempts
/// (each such task goes to the dead letters, and the claim asks again for the rest): a
/// bound on the call's length when a crash left many such tasks, which later claims finish.
const EXHAUSTED_REPLACE_ROUNDS: usize = 4;

/// How often a claim held back by another node's share of the in-flight cap looks again at
/// most. A release that frees room after such a claim wakes every node (through the store's
/// events); this only bounds the wait when that wake-up is lost.
pub const SHARED_CAP_RECHECK: Duration = Duration::from_millis(100);

/// One claim's store side, run on a blocking thread.
struct Plan {
    name: QueueName,
    /// What this node's own limits granted.
    granted: usize,
    now_ms: UnixMs,
    visibility_ms: u64,
    claim_for: ClaimFor,
    retry: RetryPolicy,
    /// The queue's rate and burst, when it has a rate limit.
    rate: Option<(f64, f64)>,
    /// The queue's in-flight cap, when it has one.
    cap: Option<usize>,
}

/// What a claim ended besides the leases it took.
#[derive(Debug, Default)]
struct Ended {
    /// Tasks finished as skipped, or sent to the dead letters, by their late policy or for
    /// being out of attempts.
    skipped: usize,
    dead: usize,
    /// Leases that ran out, as the store reported them (each once).
    leases_expired: u64,
}

/// Leased tasks, what the claim ended, and the next due instant.
type Taken = (Vec<LeasedTask>, Ended, Option<Option<UnixMs>>);

enum StoreClaim {
    Claimed(Taken),
    /// A limit shared with other nodes granted nothing: look again after this long.
    Limited(Duration),
}

impl Plan {
    fn run(self, s: &dyn Store) -> Result<StoreClaim> {
        let name = &self.name;
        // With several nodes on one store, the queue's rate and in-flight cap are theirs
        // together: the store's shared count grants what this node's own allowed, or less.
        let took = match self.rate {
            Some((per_s, burst)) => s
                .take_rate_tokens(name, self.granted as u64, per_s, burst)?
                .map_or(self.granted, |n| (n as usize).min(self.granted)),
            None => self.granted,
        };
        if took == 0 {
            let per_s = self.rate.map_or(1.0, |(per_s, _)| per_s);
            let wait = Duration::from_secs_f64(1.0 / per_s).max(Duration::from_millis(1));
            return Ok(StoreClaim::Limited(wait));
        }
        let until_ms = self.now_ms.saturating_add(self.visibility_ms);
        let room = match self.cap {
            Some(cap) => s.reserve_in_flight(name, took as u64, cap as u64, self.now_ms, until_ms),
            None => Ok(None),
        };
        let room = match room {
            Ok(room) => room,
            Err(e) => {
                self.give_back_tokens(s, took);
                return Err(e.into());
            }
        };
        let allowed = room
            .as_ref()
            .map_or(took, |r| (r.granted as usize).min(took));
        if allowed == 0 {
            self.give_back_tokens(s, took);
            let free_at = room.and_then(|r| r.earliest_until_ms);
            let wait = free_at.map_or(SHARED_CAP_RECHECK, |at| {
                Duration::from_millis(at.saturating_sub(self.now_ms))
            });
            return Ok(StoreClaim::Limited(
                wait.clamp(Duration::from_millis(1), SHARED_CAP_RECHECK),
            ));
        }
        let taken = self.claim(s, allowed);
        if let Some(room) = &room {
            // The leases taken replace the reservation. If this fails, the reservation holds
            // its room until the leases' deadline, as the leases would have.
            let leases: Vec<(LeaseId, UnixMs)> = match &taken {
                Ok((leased, _, _)) => leased
                    .iter()
                    .map(|t| (t.lease_id, t.lease_until_ms))
                    .collect(),
                Err(_) => Vec::new(),
            };
            if let Err(error) = s.settle_in_flight(name, room, &leases, self.now_ms) {
                tracing::debug!(queue = %name, %error, "settle shared in-flight room");
            }
        }
        let used = taken.as_ref().map_or(0, |(leased, _, _)| leased.len());
        self.give_back_tokens(s, took - used.min(took));
        taken.map(StoreClaim::Claimed)
    }

    /// Leases up to `allowed` tasks; a task whose previous lease expired on its last attempt
    /// goes to the dead letters instead, and the claim takes another due task in its place
    /// (a consumer asking for one task must not get none while others are due).
    fn claim(&self, s: &dyn Store, allowed: usize) -> Result<Taken> {
        let (name, now_ms) = (&self.name, self.now_ms);
        let mut leased = Vec::with_capacity(allowed);
        let mut ended = Ended::default();
        let mut rounds = 0;
        let store_had_fewer = loop {
            let want = allowed - leased.len();
            let batch = match self.claim_for {
                ClaimFor::Lease => s.claim(name, now_ms, want, self.visibility_ms)?,
                ClaimFor::Push => s.claim_owned(name, now_ms, want, self.visibility_ms)?,
            };
            ended.skipped += batch.late_skipped.len();
            ended.dead += batch.late_dead.len();
            ended.leases_expired += batch.leases_expired;
            let got = batch.leased.len();
            let exhausted = self.leave_exhausted(s, batch.leased, &mut leased)?;
            ended.dead += exhausted;
            rounds += 1;
            if got < want {
                break true;
            }
            if exhausted == 0 || leased.len() >= allowed || rounds >= EXHAUSTED_REPLACE_ROUNDS {
                break false;
            }
        };
        let next_due_ms = if store_had_fewer {
            Some(match self.claim_for {
                ClaimFor::Lease => s.next_due_ms(name)?,
                ClaimFor::Push => s.next_due_owned_ms(name)?,
            })
        } else {
            None
        };
        Ok((leased, ended, next_due_ms))
    }

    /// Moves the claimed tasks that may go ahead into `leased` and sends those out of
    /// attempts to the dead letters; answers how many went there.
    fn leave_exhausted(
        &self,
        s: &dyn Store,
        claimed: Vec<LeasedTask>,
        leased: &mut Vec<LeasedTask>,
    ) -> Result<usize> {
        let mut exhausted = 0;
        for task in claimed {
            let action = outcome::decide(
                &AttemptEnd::LeaseExpired,
                task.task.attempts,
                &self.retry,
                self.now_ms,
                0.0,
            );
            match action {
                Action::Proceed => leased.push(task),
                other => {
                    outcome::apply(
                        s,
                        &self.name,
                        task.task.id,
                        task.lease_id,
                        &other,
                        self.now_ms,
                    )?;
                    exhausted += 1;
                }
            }
        }
        Ok(exhausted)
    }

    fn give_back_tokens(&self, s: &dyn Store, unused: usize) {
        if let Some((per_s, burst)) = self.rate {
            give_back_tokens(s, &self.name, unused, per_s, burst);
        }
    }
}

/// Returns tokens of the shared bucket a claim did not use. A failure only leaves the bucket
/// emptier for a moment (it refills at the queue's rate), so it does not fail the claim,
/// whose tasks are already leased.
fn give_back_tokens(s: &dyn Store, queue: &QueueName, unused: usize, per_s: f64, burst: f64) {
    if unused == 0 {
        return;
    }
    if let Err(error) = s.return_rate_tokens(queue, unused as u64, per_s, burst) {
        tracing::debug!(%queue, %error, "return unused rate tokens");
    }
}

fn record_metrics(queue: &str, leased: &[LeasedTask], ended: &Ended, now_ms: UnixMs) {
    if ended.skipped > 0 {
        metrics::skipped_late(queue, ended.skipped);
    }
    if ended.dead > 0 {
        metrics::dead_lettered(queue, ended.dead);
    }
    if ended.leases_expired > 0 {
        metrics::leases_expired(queue, ended.leases_expired);
    }
    if !leased.is_empty() {
        metrics::dispatched(queue, leased.len());
        // Lateness is the first attempt's: a task leased again after its lease expired keeps
        // its due time, so its lateness would be the whole lease (a consumer's crash, not the
        // scheduler's delay).
        metrics::lateness(
            queue,
            leased
                .iter()
                .filter(|task| task.task.attempts <= 1)
                .map(|task| {
                    // The store's promise, checked: nothing is handed out before it is due.
                    debug_assert!(task.task.due_at_ms <= now_ms, "claimed a task before due");
                    now_ms.saturating_sub(task.task.due_at_ms)
                }),
        );
    }
}
