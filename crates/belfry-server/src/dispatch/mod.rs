//! Push delivery for every push queue, by one shared dispatcher.
//!
//! One loop per queue did not scale with the number of queues: a thousand webhook queues were
//! a thousand loops, each with its own in-flight budget, together opening tens of thousands
//! of connections to one receiver and crowding the API out of its store-call admission. Here
//! one dispatcher serves all push queues:
//!
//! - **Finding due work.** Each push queue has a slot: *idle* (with a timer at its next due
//!   time, or a recheck), *ready* (in a round-robin line), *claiming*, or *waiting* for
//!   budget. A wake-up (tasks put, nacked or redriven, a lease released, a resume) makes an
//!   idle queue ready at once; a timer makes it ready when its next task falls due. An idle
//!   queue costs nothing until then: timers are not polled, and a wall-clock step, which
//!   moves due times against them, is noticed once for all queues (`clock_watch.rs`).
//! - **Fairness.** A queue gets at most [`CLAIM_QUANTUM`] tasks per turn, then goes to the
//!   back of the line if it has more, so one queue with a million due tasks cannot hold up a
//!   hundred small ones.
//! - **Budgets.** A global cap on tasks in flight (`dispatch_in_flight_max`) bounds memory,
//!   and a per-target cap on delivery calls in flight (`dispatch_per_target_max`, per webhook
//!   host or broker connection) bounds connections: the HTTP client keeps as many idle
//!   connections per host, so they are reused, not churned. Tasks are claimed only when budget
//!   is free, so a lease never ticks away while its delivery waits for a connection. Each
//!   queue's own rate limit and in-flight cap apply on top.
//! - **Admission.** Claims and outcome writes are the server's own work: they go through the
//!   internal store-call admission, never refused and never competing with API clients.
//! - **Outcomes.** A delivery asks [`crate::outcome::decide`] what to do and hands the
//!   action to one `writer::OutcomeWriter`, which coalesces acks of all queues into
//!   `ack_many` calls. The task's budget is held until its outcome is recorded.
//!
//! Cancellation safety: a claimed task is never dropped by a `select!`; deliveries run to
//! completion (shutdown waits for them up to its grace period, then their leases expire and
//! the tasks are delivered again).

mod clock_watch;
mod delivery;
mod slots;
mod writer;

use std::sync::{Arc, Weak};
use std::time::Duration;

use belfry_core::QueueName;
use belfry_sinks::{Sink, SinkError, SinkFactory};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::claim::{claim_once, ClaimFor};
use crate::metrics;
use crate::queues::QueueRuntime;
use crate::shared::{Caller, Shared};
use slots::{Slots, TurnEnd};
pub(crate) use writer::OutcomeWriter;

/// Tasks one queue may claim per turn. Small enough that a hundred queues each get a turn
/// quickly while one queue has a huge backlog; large enough that a busy queue's claims are
/// worth their store call, and that a stream queue's turn fills one publish of its sink's
/// largest batch (256 for Redis Streams, NATS and Kafka). At 128, a Kafka burst went out in
/// produce requests of 128 records, and the broker's cost per request held it to 0.51× of
/// its raw publish rate (0.60–0.70× at 256).
pub const CLAIM_QUANTUM: usize = 256;

/// Claims running at once (each is one store call). More overlap hand-offs to the blocking
/// pool; the store serialises claims anyway, so more would only queue there.
pub const CLAIMS_IN_FLIGHT_MAX: usize = 4;

/// A push lease lasts the sink's timeout plus this margin, so a lease never expires while
/// its delivery may still succeed (which would deliver the task twice).
pub const LEASE_MARGIN_MS: u64 = 10_000;

/// How long a queue held back by its rate limit or in-flight cap waits at most before it is
/// looked at again (a pull long-poll rechecks as often).
pub const IDLE_RECHECK_MS: u64 = 1_000;

/// A queue is looked at again at least this often, whatever its next due time. Everything
/// that gives it work wakes it, and a wall-clock step wakes every queue; this only bounds the
/// damage of a wake-up that was never sent. Each recheck is a store call, so it is rare:
/// with ten thousand queues, a one-second recheck was most of the dispatcher's work.
pub const EMPTY_RECHECK_MS: u64 = 10_000;

/// Pause after a failed claim before the queue is tried again, so a broken store is not
/// hammered.
const ERROR_PAUSE_MS: u64 = 500;

/// Every queue's claims fail together while the store is unreachable: one line per period.
static CLAIM_ERRORS: crate::log_every::LogEvery =
    crate::log_every::LogEvery::new(Duration::from_secs(10));

/// How a push queue is delivered: its sink and what the dispatcher derives from it.
pub(crate) struct Push {
    pub sink: Arc<dyn Sink>,
    /// The sink's type, for metrics.
    pub kind: &'static str,
    pub visibility_ms: u64,
    pub batch_max: usize,
    /// Delivery calls in flight to this sink's target (shared by every queue on that target).
    pub target: Arc<Semaphore>,
    /// This sink's deliveries: closed and awaited before the sink is closed.
    pub deliveries: TaskTracker,
}

/// What the dispatcher has done, for tests and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Claim turns taken (one store call each, when budget allowed one).
    pub turns: u64,
    /// Claims that failed (a store error). The server's own claims are never refused by API
    /// admission, so under load this stays 0.
    pub claim_errors: u64,
    /// The latest wall-clock time a finished claim looked at the store with: a test that moved
    /// a manual clock waits for this to reach the new time before it asserts that nothing was
    /// delivered, so the assertion observes a dispatcher that looked, not one that never ran.
    pub looked_at_ms: u64,
}

pub(crate) struct Dispatcher {
    shared: Arc<Shared>,
    turns: std::sync::atomic::AtomicU64,
    claim_errors: std::sync::atomic::AtomicU64,
    looked_at_ms: std::sync::atomic::AtomicU64,
    sinks: Arc<dyn SinkFactory>,
    slots: Mutex<Slots>,
    /// Push queues whose stored sink this server's configuration refuses (a private target
    /// when private targets are no longer allowed): why, for their `delivery_health`. They
    /// deliver nothing until reconfigured.
    refused: Mutex<std::collections::HashMap<QueueName, String>>,
    /// Wakes the loop: a queue became ready, budget was released, or shutdown.
    notify: Notify,
    /// Tasks in flight, all queues together.
    budget: Arc<Semaphore>,
    claims: Arc<Semaphore>,
    per_target_max: usize,
    writer: OutcomeWriter,
    /// The loop, claims, and the closing of sinks whose deliveries are draining.
    tasks: TaskTracker,
}

impl Dispatcher {
    /// Makes the dispatcher and, with it, the server's shared parts: the queue set's wake-up
    /// hook must reach the dispatcher, which holds the shared parts.
    pub fn new(
        sinks: Arc<dyn SinkFactory>,
        make_shared: impl FnOnce(crate::queues::WakeHook) -> Shared,
    ) -> Arc<Dispatcher> {
        Arc::new_cyclic(|weak: &Weak<Dispatcher>| {
            let weak = weak.clone();
            let hook: crate::queues::WakeHook = Arc::new(move |name: &QueueName| {
                if let Some(dispatcher) = weak.upgrade() {
                    dispatcher.mark(name);
                }
            });
            let shared = Arc::new(make_shared(hook));
            let in_flight_max = shared.config.dispatch_in_flight_max;
            let per_target_max = shared.config.dispatch_per_target_max;
            Dispatcher {
                writer: OutcomeWriter::start(&shared),
                shared,
                turns: Default::default(),
                claim_errors: Default::default(),
                looked_at_ms: Default::default(),
                sinks,
                slots: Mutex::new(Slots::default()),
                refused: Mutex::new(Default::default()),
                notify: Notify::new(),
                budget: Arc::new(Semaphore::new(in_flight_max)),
                claims: Arc::new(Semaphore::new(CLAIMS_IN_FLIGHT_MAX)),
                per_target_max,
                tasks: TaskTracker::new(),
            }
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Checks a push spec by building its sink (nothing connects).
    pub fn check(&self, queue: &QueueName, spec: &belfry_sinks::SinkSpec) -> Result<(), SinkError> {
        self.sinks.build(queue, spec).map(|_| ())
    }

    /// Starts delivering `runtime`'s queue with the sink its configuration names, replacing
    /// the sink it had. Deliveries already started finish with the sink they began with.
    /// Returns the new sink (`None` for a pull queue), whose `open` the caller may await to
    /// report an unreachable target; the sink is opened in the background either way.
    pub fn attach(&self, runtime: &Arc<QueueRuntime>) -> Result<Option<Arc<dyn Sink>>, SinkError> {
        let config = runtime.config();
        let Some(spec) = config.sink() else {
            self.detach(&runtime.name);
            return Ok(None);
        };
        let sink = match self.sinks.build(&runtime.name, spec) {
            Ok(sink) => sink,
            Err(e) => {
                // Not the old sink either: its target is no longer the configuration's.
                self.detach(&runtime.name);
                self.refused
                    .lock()
                    .insert(runtime.name.clone(), e.to_string());
                return Err(e);
            }
        };
        self.refused.lock().remove(&runtime.name);
        let visibility_ms = u64::try_from(spec.timeout().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(LEASE_MARGIN_MS);
        let batch_max = sink.batch_max().clamp(1, CLAIM_QUANTUM);
        let push = {
            let mut slots = self.slots.lock();
            let target = slots.target(sink.target(), self.per_target_max);
            let push = Arc::new(Push {
                kind: spec.kind(),
                sink,
                visibility_ms,
                batch_max,
                target,
                deliveries: TaskTracker::new(),
            });
            if let Some(old) = slots.attach(runtime.name.clone(), push.clone()) {
                self.retire(old);
            }
            push
        };
        let sink = push.sink.clone();
        self.open(push);
        runtime.set_pushed(true);
        self.mark(&runtime.name);
        Ok(Some(sink))
    }

    /// What the queue's sink last saw of its target (`None`: not a push queue), or why it has
    /// no sink.
    pub fn health(&self, queue: &QueueName) -> Option<belfry_sinks::SinkHealth> {
        if let Some(push) = self.slots.lock().push(queue) {
            return Some(push.sink.health());
        }
        let refused = self.refused.lock().get(queue).cloned()?;
        Some(belfry_sinks::SinkHealth::Unreachable(format!(
            "not delivering: this server's configuration refuses the target ({refused}); \
             change the queue's delivery or the configuration"
        )))
    }

    /// The sink delivering `queue` now (`None`: a pull queue, or one whose sink this server's
    /// configuration refused).
    pub fn sink(&self, queue: &QueueName) -> Option<Arc<dyn Sink>> {
        self.slots.lock().push(queue).map(|push| push.sink.clone())
    }

    /// Stops delivering the queue (deleted, or now a pull queue).
    pub fn detach(&self, queue: &QueueName) {
        self.refused.lock().remove(queue);
        if let Some(runtime) = self.shared.queues.get(queue) {
            runtime.set_pushed(false);
        }
        let old = self.slots.lock().detach(queue);
        if let Some(old) = old {
            self.retire(old);
        }
    }

    /// Connects the sink ahead of its first delivery; a failure is only reported.
    fn open(&self, push: Arc<Push>) {
        self.tasks.spawn(async move {
            match push.sink.open().await {
                Ok(()) => {}
                Err(belfry_sinks::OpenError::Unreachable(reason)) => {
                    tracing::warn!(sink = push.kind, target = push.sink.target(), %reason, "the sink's target is not reachable yet; deliveries will be retried");
                }
                Err(belfry_sinks::OpenError::Refused(reason)) => {
                    tracing::warn!(sink = push.kind, target = push.sink.target(), %reason, "the sink's target refused the connection; its tasks will be dead-lettered until the target or the connection config is fixed");
                }
            }
        });
    }

    /// Closes a sink once its deliveries in flight are done.
    fn retire(&self, push: Arc<Push>) {
        push.deliveries.close();
        self.tasks.spawn(async move {
            push.deliveries.wait().await;
            push.sink.close().await;
        });
    }

    /// A push queue may have work now.
    pub fn mark(&self, queue: &QueueName) {
        if self.slots.lock().mark(queue) {
            self.notify.notify_one();
        }
    }

    /// Budget came back (a delivery finished): queues waiting for it get another turn.
    fn released(&self) {
        if self.slots.lock().release_waiting() {
            self.notify.notify_one();
        }
    }

    pub fn start(self: &Arc<Self>) {
        self.tasks.spawn(self.clone().run());
    }

    async fn run(self: Arc<Self>) {
        tracing::debug!("dispatcher started");
        let stopping = self.shared.stopping.clone();
        let mut clock_watch = clock_watch::ClockWatch::new(&*self.shared.clock);
        let mut clock_check = Instant::now() + clock_watch::CHECK_EVERY;
        loop {
            let notified = self.notify.notified();
            if stopping.is_cancelled() {
                break;
            }
            let now = Instant::now();
            if now >= clock_check {
                clock_check = now + clock_watch::CHECK_EVERY;
                if let Some(step_ms) = clock_watch.stepped_forward(&*self.shared.clock) {
                    tracing::info!(
                        step_ms,
                        "the wall clock stepped forward; looking at every queue"
                    );
                    self.shared.queues.wake_all();
                }
            }
            let next = self.slots.lock().next(now);
            match next {
                Ok((queue, push)) => {
                    let permit = tokio::select! {
                        permit = self.claims.clone().acquire_owned() => permit,
                        _ = stopping.cancelled() => break,
                    };
                    let Ok(permit) = permit else { break };
                    let me = self.clone();
                    self.tasks.spawn(async move {
                        let mut end = me.turn(&queue, &push).await;
                        drop(permit);
                        let mut slots = me.slots.lock();
                        // Budget released since the failed take found no queue waiting (this
                        // one was not yet): look again rather than wait for the next release.
                        // Checked under the lock that `released` takes, so none is missed.
                        if end == TurnEnd::WaitBudget
                            && me.budget.available_permits() > 0
                            && push.target.available_permits() > 0
                        {
                            end = TurnEnd::Again;
                        }
                        if slots.finish(&queue, end, Instant::now()) {
                            drop(slots);
                            me.notify.notify_one();
                        }
                    });
                }
                Err(wake_at) => {
                    let wake_at = wake_at.map_or(clock_check, |at| at.min(clock_check));
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(wake_at) => {}
                        _ = stopping.cancelled() => break,
                    }
                }
            }
        }
        tracing::debug!("dispatcher stopped claiming");
    }

    /// One turn of one queue: claim what its policy and the budgets allow, start the
    /// deliveries, and say when the queue should be looked at again.
    async fn turn(self: &Arc<Self>, queue: &QueueName, push: &Arc<Push>) -> TurnEnd {
        let Some(runtime) = self.shared.queues.get(queue) else {
            return TurnEnd::Gone;
        };
        let Some((tasks, calls)) = self.take_budget(push) else {
            return TurnEnd::WaitBudget;
        };
        let want = tasks.num_permits();
        let looked_at_ms = self.shared.now_ms();
        let claimed = claim_once(
            &self.shared,
            &runtime,
            want,
            push.visibility_ms,
            Caller::Internal,
            ClaimFor::Push,
        )
        .await;
        self.turns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.looked_at_ms
            .fetch_max(looked_at_ms, std::sync::atomic::Ordering::Relaxed);
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(error) => {
                self.claim_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::dispatch_claim_error();
                if let Some(held_back) = CLAIM_ERRORS.check(std::time::Instant::now()) {
                    tracing::warn!(%queue, %error, held_back, "claim due tasks for push delivery (`held_back`: failed claims of any queue not logged since the last line)");
                }
                drop((tasks, calls));
                self.released();
                return TurnEnd::After(Duration::from_millis(ERROR_PAUSE_MS));
            }
        };
        let end = next_look(&claimed, self.shared.now_ms());
        if claimed.leased.is_empty() {
            drop((tasks, calls));
        } else {
            self.start_deliveries(&runtime, push, claimed.leased, tasks, calls);
        }
        // Budget the claim did not use went back: queues waiting for it may go.
        self.released();
        end
    }

    /// Takes up to a quantum of global budget and the target calls to deliver it, or `None`
    /// when either is exhausted.
    fn take_budget(&self, push: &Push) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let calls_free = push.target.available_permits();
        let want = CLAIM_QUANTUM
            .min(self.budget.available_permits())
            .min(calls_free.saturating_mul(push.batch_max));
        if want == 0 {
            return None;
        }
        let tasks = self
            .budget
            .clone()
            .try_acquire_many_owned(want as u32)
            .ok()?;
        let calls = push
            .target
            .clone()
            .try_acquire_many_owned(want.div_ceil(push.batch_max) as u32)
            .ok()?;
        Some((tasks, calls))
    }

    /// Forgets every queue and waits for deliveries in flight (until `deadline`), then for
    /// sinks to close.
    pub async fn drain(&self, deadline: Instant) -> bool {
        let all = self.slots.lock().detach_all();
        for push in all {
            self.retire(push);
        }
        self.tasks.close();
        tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_ok()
    }

    pub fn stats(&self) -> DispatchStats {
        use std::sync::atomic::Ordering::Relaxed;
        DispatchStats {
            turns: self.turns.load(Relaxed),
            claim_errors: self.claim_errors.load(Relaxed),
            looked_at_ms: self.looked_at_ms.load(Relaxed),
        }
    }

    /// Tasks in flight in push deliveries.
    pub fn in_flight(&self) -> usize {
        self.shared
            .config
            .dispatch_in_flight_max
            .saturating_sub(self.budget.available_permits())
    }
}

/// When the queue should be looked at again, from what its claim got.
fn next_look(claimed: &crate::claim::Claimed, now_ms: belfry_core::UnixMs) -> TurnEnd {
    if claimed.granted == 0 {
        return match claimed.retry_in {
            // Rate or in-flight limit: a token or a slot frees up then.
            Some(retry_in) => TurnEnd::After(retry_in.min(Duration::from_millis(IDLE_RECHECK_MS))),
            // Paused: a resume wakes it.
            None => TurnEnd::After(Duration::from_millis(EMPTY_RECHECK_MS)),
        };
    }
    match claimed.next_due_ms {
        // It got all it asked for: more may be due now.
        None => TurnEnd::Again,
        Some(None) => TurnEnd::After(Duration::from_millis(EMPTY_RECHECK_MS)),
        // One millisecond past the gap, so the wall clock has reached the due time when we
        // look again (timers round to milliseconds).
        Some(Some(due)) => TurnEnd::After(Duration::from_millis(
            due.saturating_sub(now_ms)
                .saturating_add(1)
                .min(EMPTY_RECHECK_MS),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::Claimed;

    fn claimed(granted: usize, next_due_ms: Option<Option<u64>>) -> Claimed {
        Claimed {
            leased: Vec::new(),
            retry_in: None,
            granted,
            next_due_ms,
        }
    }

    fn after(ms: u64) -> TurnEnd {
        TurnEnd::After(Duration::from_millis(ms))
    }

    #[test]
    fn a_queue_sleeps_until_its_next_due_time_not_a_fixed_poll() {
        let now = 1_000_000;
        // Due in 5 s: one look just past it, not five one-second polls.
        assert_eq!(
            next_look(&claimed(128, Some(Some(now + 5_000))), now),
            after(5_001)
        );
        // Due in an hour: the rare recheck that bounds a lost wake-up.
        assert_eq!(
            next_look(&claimed(128, Some(Some(now + 3_600_000))), now),
            after(EMPTY_RECHECK_MS)
        );
        // Due already (a task nacked meanwhile): just after now.
        assert_eq!(next_look(&claimed(128, Some(Some(now - 5))), now), after(1));
        assert_eq!(
            next_look(&claimed(128, Some(None)), now),
            after(EMPTY_RECHECK_MS)
        );
        // It got all it asked for: more may be due.
        assert_eq!(next_look(&claimed(128, None), now), TurnEnd::Again);
    }

    #[test]
    fn a_queue_held_back_by_its_limits_looks_again_when_they_allow() {
        let mut limited = claimed(0, None);
        limited.retry_in = Some(Duration::from_millis(40));
        assert_eq!(next_look(&limited, 0), after(40));
        limited.retry_in = Some(Duration::from_secs(30));
        assert_eq!(next_look(&limited, 0), after(IDLE_RECHECK_MS));
        // Paused: a resume wakes it.
        assert_eq!(next_look(&claimed(0, None), 0), after(EMPTY_RECHECK_MS));
    }
}
