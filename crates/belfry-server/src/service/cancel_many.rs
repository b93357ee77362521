//! Cancelling many scheduled tasks of a queue in one call, named by id or by idempotency key.

use belfry_core::{QueueName, TaskId, TaskState};
use belfry_store::ChangeOutcome;

use super::{Result, Service};

/// Tasks a bulk cancel names, at most [`CANCEL_MANY_MAX`].
#[derive(Debug, Clone)]
pub enum CancelPick {
    Ids(Vec<TaskId>),
    /// Idempotency keys: each names the live task that holds it.
    Keys(Vec<String>),
}

/// Most tasks one bulk cancel names.
pub const CANCEL_MANY_MAX: usize = 1_000;

/// What a bulk cancel did, each task named in the order given.
#[derive(Debug, Clone, Default)]
pub struct CancelledMany {
    /// Tasks cancelled.
    pub cancelled: usize,
    /// Tasks named that were not scheduled (leased, finished, dead, or named twice), with the
    /// key they were named by, if any.
    pub not_scheduled: Vec<(TaskId, Option<String>, TaskState)>,
    /// Ids (or keys) this queue does not have, or no longer remembers.
    pub not_found: Vec<String>,
}

impl Service {
    /// Cancels the tasks `pick` names in one store call (the keys looked up first, in one more).
    pub async fn cancel_many(&self, queue: &QueueName, pick: CancelPick) -> Result<CancelledMany> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        self.blocking(move |s| {
            let mut done = CancelledMany::default();
            let named: Vec<(TaskId, Option<String>)> = match pick {
                CancelPick::Ids(ids) => ids.into_iter().map(|id| (id, None)).collect(),
                CancelPick::Keys(keys) => {
                    let mut found = Vec::with_capacity(keys.len());
                    for key in keys {
                        match s.get_by_key(&name, &key, now_ms)? {
                            Some(task) => found.push((task.id, Some(key))),
                            None => done.not_found.push(key),
                        }
                    }
                    found
                }
            };
            let ids: Vec<TaskId> = named.iter().map(|(id, _)| *id).collect();
            let outcomes = s.cancel_many(&name, &ids, now_ms)?;
            for ((id, key), outcome) in named.into_iter().zip(outcomes) {
                match outcome {
                    ChangeOutcome::Ok => done.cancelled += 1,
                    ChangeOutcome::WrongState(state) => done.not_scheduled.push((id, key, state)),
                    ChangeOutcome::NotFound => {
                        done.not_found.push(key.unwrap_or_else(|| id.to_string()))
                    }
                }
            }
            Ok(done)
        })
        .await
    }
}
