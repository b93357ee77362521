//! The open/closed state a stream sink shares between its deliveries and `close`.
//!
//! Deliveries hold a read guard for their whole run; `close` takes the write guard, which
//! waits for every delivery in flight to finish (tokio's lock is fair, so deliveries that start
//! after `close` began wait behind it instead of starving it) and then marks the sink closed.
//! A delivery that finds the sink closed answers `Retry`: the task stays leased and goes out
//! again through whatever sink the dispatcher uses next.

use tokio::sync::{RwLock, RwLockReadGuard};

use crate::{OpenError, Outcome};

#[derive(Debug, Default)]
pub(crate) struct Gate {
    closed: RwLock<bool>,
}

/// Proof that the sink was open when a delivery started; it stays open until this is dropped.
pub(crate) struct Open<'a>(#[allow(dead_code)] RwLockReadGuard<'a, bool>);

impl Gate {
    /// Enters the gate, or the outcome for a closed sink.
    pub(crate) async fn enter(&self) -> Result<Open<'_>, Outcome> {
        let guard = self.closed.read().await;
        if *guard {
            return Err(Outcome::Retry {
                after: None,
                reason:
                    "the sink was closed (the queue was reconfigured or the server is stopping)"
                        .to_owned(),
            });
        }
        Ok(Open(guard))
    }

    /// Waits for deliveries in flight, then closes. Returns whether this call closed it.
    pub(crate) async fn close(&self) -> bool {
        let mut closed = self.closed.write().await;
        let was_open = !*closed;
        *closed = true;
        was_open
    }
}

/// What a sink last saw of its target, updated after every delivery and `open`.
#[derive(Debug)]
pub(crate) struct HealthCell(std::sync::Mutex<crate::SinkHealth>);

impl Default for HealthCell {
    fn default() -> Self {
        HealthCell(std::sync::Mutex::new(crate::SinkHealth::Unknown))
    }
}

impl HealthCell {
    pub(crate) fn get(&self) -> crate::SinkHealth {
        self.lock().clone()
    }

    /// Records what a delivery's outcome says about reachability: delivered or refused means
    /// the target answered; a retry means it may not have. (A refusal that belfry made
    /// without asking the target goes through [`HealthCell::record_refused`] instead.) A refusal leaves a refused
    /// connection shown as refused: only a delivery that gets through clears it.
    pub(crate) fn record(&self, outcome: &Outcome) {
        let mut health = self.lock();
        *health = match outcome {
            Outcome::Delivered => crate::SinkHealth::Reachable,
            Outcome::Reject { .. } if matches!(*health, crate::SinkHealth::Refused(_)) => return,
            Outcome::Reject { .. } => crate::SinkHealth::Reachable,
            Outcome::Retry { reason, .. } => crate::SinkHealth::Unreachable(reason.clone()),
        };
    }

    /// Records a refusal that belfry made itself before reaching the target (a webhook host
    /// resolving to an address the target policy forbids): the target never answered, so it
    /// is not shown as reachable; every delivery is dead-lettered alike until the target or
    /// the configuration changes.
    pub(crate) fn record_refused(&self, reason: &str) {
        *self.lock() = crate::SinkHealth::Refused(reason.to_owned());
    }

    /// Records the outcome of an `open` (a connection attempt) and answers as `Sink::open`
    /// does: `Ok` when the target answered, else why not, naming `what` (e.g. "kafka
    /// connection main"). A rejection there refuses the connection itself (credentials, an
    /// unknown topic), so every delivery would be rejected alike: shown as refused.
    pub(crate) fn record_open(&self, outcome: Outcome, what: &str) -> Result<(), OpenError> {
        let (health, answer) = open_answer(outcome, what);
        *self.lock() = health;
        answer
    }

    /// [`HealthCell::record_open`] for a probe that runs beside the first deliveries (a
    /// webhook's): what a delivery saw is more than a probe sees, so the probe's outcome is
    /// shown only while nothing else has been.
    pub(crate) fn record_probe(&self, outcome: Outcome, what: &str) -> Result<(), OpenError> {
        let (health, answer) = open_answer(outcome, what);
        let mut current = self.lock();
        if *current == crate::SinkHealth::Unknown {
            *current = health;
        }
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::SinkHealth> {
        // Only ever replaced whole: a poisoned lock holds a complete value.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The health an `open`'s outcome shows, and `Sink::open`'s answer.
fn open_answer(outcome: Outcome, what: &str) -> (crate::SinkHealth, Result<(), OpenError>) {
    match outcome {
        Outcome::Delivered => (crate::SinkHealth::Reachable, Ok(())),
        Outcome::Retry { reason, .. } => {
            let error = OpenError::Unreachable(format!("{what} is not reachable yet: {reason}"));
            (crate::SinkHealth::Unreachable(reason), Err(error))
        }
        Outcome::Reject { reason } => {
            let error = OpenError::Refused(format!("{what} was refused: {reason}"));
            (crate::SinkHealth::Refused(reason), Err(error))
        }
    }
}

/// The one outcome of a batch of one (a sink that delivers in batches, asked for one task).
pub(crate) fn only(mut outcomes: Vec<Outcome>) -> Outcome {
    outcomes.pop().unwrap_or(Outcome::Retry {
        after: None,
        reason: "the sink gave no outcome".to_owned(),
    })
}
