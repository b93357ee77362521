//! The simulated push target: every delivery is checked by the model, then answered after a
//! virtual delay with an outcome chosen by the seed, the task and the attempt (so the answer
//! does not depend on the order deliveries happen to run in).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{QueueName, Task, UnixMs};
use belfry_server::dispatch::LEASE_MARGIN_MS;
use belfry_sinks::{Outcome, Sink, SinkError, SinkFactory, SinkFuture, SinkSpec};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::model::QueueSpec;
use super::rng::hash;
use super::store::Shared;

/// How often each fault happens, per thousand deliveries (chosen per seed).
#[derive(Debug, Clone, Copy)]
pub struct SinkFaults {
    /// A transient failure with a `Retry-After`.
    pub retry: u64,
    /// A permanent refusal.
    pub reject: u64,
    /// No answer within the sink's timeout: a transient failure after the timeout.
    pub slow: u64,
    /// A call that outlives the lease (a sink that ignores its own timeout, a paused
    /// process), then succeeds: the task is delivered again meanwhile.
    pub stall: u64,
}

/// The dispatcher's budgets (`dispatch.in_flight_max`, `dispatch.per_target_max`).
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    pub total: usize,
    pub per_target: usize,
}

/// Delivery calls in flight in one server generation: in all, per target, per queue.
#[derive(Default)]
struct InFlight {
    total: usize,
    per_target: HashMap<String, usize>,
    per_queue: HashMap<QueueName, usize>,
}

/// The sinks of one server generation: a crash ends their calls in flight.
pub struct SimSinks {
    shared: Arc<Shared>,
    faults: SinkFaults,
    budgets: Budgets,
    in_flight: Arc<Mutex<InFlight>>,
    crashed: CancellationToken,
}

impl SimSinks {
    pub fn new(
        shared: Arc<Shared>,
        faults: SinkFaults,
        budgets: Budgets,
        crashed: CancellationToken,
    ) -> SimSinks {
        SimSinks {
            shared,
            faults,
            budgets,
            in_flight: Arc::default(),
            crashed,
        }
    }
}

impl SinkFactory for SimSinks {
    fn build(&self, queue: &QueueName, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(SimSink {
            shared: self.shared.clone(),
            faults: self.faults,
            budgets: self.budgets,
            in_flight: self.in_flight.clone(),
            crashed: self.crashed.clone(),
            // Queues on one target share the dispatcher's per-target budget.
            target: format!("sim:{}", queue.as_str().split('-').next().unwrap_or("")),
            timeout_ms: spec.timeout().as_millis() as u64,
        }))
    }
}

struct SimSink {
    shared: Arc<Shared>,
    faults: SinkFaults,
    budgets: Budgets,
    in_flight: Arc<Mutex<InFlight>>,
    crashed: CancellationToken,
    target: String,
    timeout_ms: u64,
}

/// One delivery call counted in flight until it ends (or its future is dropped).
struct Call<'a> {
    sink: &'a SimSink,
    queue: QueueName,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let mut counts = self.sink.in_flight.lock();
        counts.total -= 1;
        *counts
            .per_target
            .entry(self.sink.target.clone())
            .or_default() -= 1;
        *counts.per_queue.entry(self.queue.clone()).or_default() -= 1;
    }
}

impl SimSink {
    /// Counts a call in flight; the dispatcher's budgets and the queue's `max_in_flight`
    /// must bound how many run at once.
    fn start_call(&self, spec: &QueueSpec) -> Call<'_> {
        let mut counts = self.in_flight.lock();
        counts.total += 1;
        let total = counts.total;
        let target = *counts
            .per_target
            .entry(self.target.clone())
            .and_modify(|n| *n += 1)
            .or_insert(1);
        let queue = *counts
            .per_queue
            .entry(spec.name.clone())
            .and_modify(|n| *n += 1)
            .or_insert(1);
        drop(counts);
        let mut problems = Vec::new();
        if total > self.budgets.total {
            problems.push(format!(
                "{total} deliveries in flight, dispatch.in_flight_max is {}",
                self.budgets.total
            ));
        }
        if target > self.budgets.per_target {
            problems.push(format!(
                "{target} calls in flight to {}, dispatch.per_target_max is {}",
                self.target, self.budgets.per_target
            ));
        }
        if spec.max_in_flight > 0 && queue > spec.max_in_flight as usize {
            problems.push(format!(
                "{queue} deliveries in flight from {}, its max_in_flight is {}",
                spec.name, spec.max_in_flight
            ));
        }
        if !problems.is_empty() {
            let mut model = self.shared.model.lock();
            for problem in problems {
                model.violation(problem);
            }
        }
        Call {
            sink: self,
            queue: spec.name.clone(),
        }
    }

    /// How long the call takes and what it answers.
    fn plan(&self, task: &Task, attempt: u32, spec: &QueueSpec, calm: bool) -> (u64, Outcome) {
        let id = task.id.0;
        let roll = hash(&[
            self.shared.seed,
            1,
            id as u64,
            (id >> 64) as u64,
            u64::from(attempt),
        ]);
        let quick = (roll >> 20) % self.timeout_ms.min(300);
        if calm {
            return (quick, Outcome::Delivered);
        }
        let f = self.faults;
        let dice = roll % 1_000;
        if dice < f.retry {
            let outcome = Outcome::Retry {
                after: Some(retry_after(spec, attempt, roll >> 32)),
                reason: "injected 503".into(),
            };
            (quick, outcome)
        } else if dice < f.retry + f.reject {
            let outcome = Outcome::Reject {
                reason: format!("injected 4{:02}", (roll >> 40) % 100),
            };
            (quick, outcome)
        } else if dice < f.retry + f.reject + f.slow {
            let outcome = Outcome::Retry {
                after: Some(retry_after(spec, attempt, roll >> 32)),
                reason: "injected timeout".into(),
            };
            (self.timeout_ms, outcome)
        } else if dice < f.retry + f.reject + f.slow + f.stall {
            let past_lease = self.timeout_ms + LEASE_MARGIN_MS + 1 + (roll >> 24) % 5_000;
            (past_lease, Outcome::Delivered)
        } else {
            (quick, Outcome::Delivered)
        }
    }
}

/// A `Retry-After` at least the queue's undithered backoff for this attempt and at most its
/// ceiling, so the server's retry time is exactly now + this (the backoff's random jitter,
/// drawn by the server, never decides it) and a run replays.
fn retry_after(spec: &QueueSpec, attempt: u32, roll: u64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(32);
    let raw = spec
        .backoff_initial_ms
        .saturating_mul(1u64 << exponent)
        .min(spec.backoff_max_ms);
    Duration::from_millis(raw + roll % (spec.backoff_max_ms - raw + 1))
}

impl Sink for SimSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Outcome> {
        Box::pin(async move {
            let (spec, calm) = {
                let mut model = self.shared.model.lock();
                (model.on_delivery(task, attempt, now_ms), model.calm)
            };
            let Some(spec) = spec else {
                return Outcome::Reject {
                    reason: "unknown task".into(),
                };
            };
            let _call = self.start_call(&spec);
            let (delay_ms, outcome) = self.plan(task, attempt, &spec, calm);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                // The process is gone: nobody hears the answer.
                _ = self.crashed.cancelled() => {
                    return Outcome::Retry { after: None, reason: "crashed".into() };
                }
            }
            let now_ms = self.shared.clock.now_ms();
            self.shared
                .model
                .lock()
                .on_answer(task.id, attempt, &outcome, now_ms);
            outcome
        })
    }

    fn target(&self) -> &str {
        &self.target
    }
}
