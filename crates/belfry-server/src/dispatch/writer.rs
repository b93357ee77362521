//! Delivery outcomes of every push queue, written to the store by one writer.
//!
//! At 10k deliveries per second, a store call per outcome cost a blocking-pool hand-off, the
//! engine's lock and a WAL write each. The writer takes whatever outcomes are waiting (up to
//! [`OUTCOMES_PER_CALL_MAX`]), acks each queue's share in one `ack_many`, applies the rarer
//! retries and dead letters one by one, all in one store call, and answers each delivery. An
//! outcome alone is not delayed: it finds the writer idle and goes at once.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use belfry_core::{LeaseId, QueueName, TaskId};
use belfry_store::{LeaseOutcome, Store};
use tokio::sync::{mpsc, oneshot};

use crate::outcome::{self, Action};
use crate::shared::{Caller, Shared};

/// Outcomes waiting for the writer at most; beyond it, deliveries wait (backpressure, not
/// memory growth).
pub const OUTCOMES_QUEUED_MAX: usize = 8_192;

/// Outcomes in one store call at most.
pub const OUTCOMES_PER_CALL_MAX: usize = 2_048;

type Reply = oneshot::Sender<Result<LeaseOutcome, String>>;

struct Entry {
    queue: QueueName,
    id: TaskId,
    lease: LeaseId,
    action: Action,
    reply: Reply,
}

pub(crate) struct OutcomeWriter {
    tx: mpsc::Sender<Entry>,
}

impl OutcomeWriter {
    /// Starts the writer; it ends when this is dropped and the queued outcomes are written.
    /// It holds the shared parts weakly, so a stopped server lets go of its store at once.
    pub fn start(shared: &Arc<Shared>) -> OutcomeWriter {
        let (tx, rx) = mpsc::channel(OUTCOMES_QUEUED_MAX);
        tokio::spawn(write_loop(Arc::downgrade(shared), rx));
        OutcomeWriter { tx }
    }

    /// Queues an outcome; the answer says whether the lease was still current.
    pub async fn record(
        &self,
        queue: QueueName,
        id: TaskId,
        lease: LeaseId,
        action: Action,
    ) -> oneshot::Receiver<Result<LeaseOutcome, String>> {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            queue,
            id,
            lease,
            action,
            reply,
        };
        if let Err(mpsc::error::SendError(entry)) = self.tx.send(entry).await {
            let _ = entry.reply.send(Err("the outcome writer stopped".into()));
        }
        answer
    }
}

async fn write_loop(shared: Weak<Shared>, mut rx: mpsc::Receiver<Entry>) {
    while let Some(first) = rx.recv().await {
        // Outcomes only come from a live dispatcher, which holds the shared parts.
        let Some(shared) = shared.upgrade() else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < OUTCOMES_PER_CALL_MAX {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (work, replies): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|e| ((e.queue, e.id, e.lease, e.action), e.reply))
            .unzip();
        let now_ms = shared.now_ms();
        let written = shared
            .blocking(Caller::Internal, move |store| {
                Ok(write(store, &work, now_ms))
            })
            .await;
        match written {
            Ok(results) => {
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
            Err(error) => {
                let error = error.to_string();
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Writes a batch of outcomes: one `ack_many` per queue, the rest one by one. One result per
/// input, in order; a failed call fails only the outcomes it carried.
fn write(
    store: &dyn Store,
    work: &[(QueueName, TaskId, LeaseId, Action)],
    now_ms: belfry_core::UnixMs,
) -> Vec<Result<LeaseOutcome, String>> {
    let mut results: Vec<Option<Result<LeaseOutcome, String>>> = vec![None; work.len()];
    let mut acks: HashMap<&QueueName, Vec<usize>> = HashMap::new();
    for (index, (queue, id, lease, action)) in work.iter().enumerate() {
        if *action == Action::Ack {
            acks.entry(queue).or_default().push(index);
        } else {
            results[index] = Some(
                outcome::apply(store, queue, *id, *lease, action, now_ms)
                    .map_err(|e| e.to_string()),
            );
        }
    }
    for (queue, indexes) in acks {
        let pairs: Vec<(TaskId, LeaseId)> =
            indexes.iter().map(|&i| (work[i].1, work[i].2)).collect();
        match store.ack_many(queue, &pairs, now_ms) {
            Ok(outcomes) if outcomes.len() == indexes.len() => {
                for (&i, outcome) in indexes.iter().zip(outcomes) {
                    results[i] = Some(Ok(outcome));
                }
            }
            Ok(outcomes) => {
                let error = format!(
                    "the store answered {} of {} acks",
                    outcomes.len(),
                    indexes.len()
                );
                for &i in &indexes {
                    results[i] = Some(Err(error.clone()));
                }
            }
            Err(error) => {
                let error = error.to_string();
                for &i in &indexes {
                    results[i] = Some(Err(error.clone()));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("outcome not written".into())))
        .collect()
}
