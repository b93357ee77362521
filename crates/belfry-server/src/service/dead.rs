//! Dead letters: list them, and redrive or delete one or many.

use belfry_core::{QueueName, Task, TaskId, TaskState};
use belfry_store::{ChangeOutcome, DeadAction};

use super::{Result, Service, ServiceError, DEAD_PAGE_MAX};

/// The dead letters a bulk call acts on.
#[derive(Debug, Clone)]
pub enum DeadPick {
    /// These tasks, in this order (at most [`DEAD_PAGE_MAX`]).
    Ids(Vec<TaskId>),
    /// The first `n` dead letters in id order (at most [`DEAD_PAGE_MAX`]).
    First(usize),
}

/// What a bulk call did.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    /// Dead letters redriven or deleted.
    pub done: usize,
    /// Tasks named that were not dead letters, with their state.
    pub not_dead: Vec<(TaskId, TaskState)>,
    /// Tasks named that this queue does not have (or no longer remembers).
    pub not_found: Vec<TaskId>,
    /// Dead letters left in the queue after the call.
    pub dead_left: u64,
}

impl Service {
    pub async fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<(Vec<Task>, bool)> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let limit = limit.min(DEAD_PAGE_MAX);
        self.blocking(move |s| {
            super::pages::read_page(limit, after, |after, n| Ok(s.list_dead(&name, after, n)?))
        })
        .await
    }

    pub async fn redrive(&self, queue: &QueueName, id: TaskId) -> Result<Task> {
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (outcome, task) = self
            .blocking(move |s| {
                let outcome = s.redrive(&name, id, now_ms)?;
                Ok((outcome, s.get(&name, id, now_ms)?))
            })
            .await?;
        dead_result(id, outcome, DeadAction::Redrive)?;
        runtime.wake();
        task.ok_or(ServiceError::TaskNotFound(id))
    }

    /// Deletes one dead letter: it is finished as cancelled.
    pub async fn delete_dead(&self, queue: &QueueName, id: TaskId) -> Result<()> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let outcome = self
            .blocking(move |s| Ok(s.discard_dead(&name, id, now_ms)?))
            .await?;
        dead_result(id, outcome, DeadAction::Discard)?;
        tracing::info!(queue = %queue, task = %id, "dead letter deleted");
        Ok(())
    }

    /// Redrives or deletes many dead letters of `queue` in one store call.
    pub async fn settle_dead(
        &self,
        queue: &QueueName,
        pick: DeadPick,
        action: DeadAction,
    ) -> Result<Settled> {
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (ids, outcomes, dead_left) = self
            .blocking(move |s| {
                let ids: Vec<TaskId> = match pick {
                    DeadPick::Ids(ids) => ids,
                    DeadPick::First(n) => s
                        .list_dead(&name, None, n.min(DEAD_PAGE_MAX))?
                        .iter()
                        .map(|t| t.id)
                        .collect(),
                };
                let outcomes = s.settle_dead(&name, &ids, action, now_ms)?;
                let dead_left = s.counts(&name, now_ms)?.dead;
                Ok((ids, outcomes, dead_left))
            })
            .await?;
        let mut settled = Settled {
            dead_left,
            ..Settled::default()
        };
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            match outcome {
                ChangeOutcome::Ok => settled.done += 1,
                ChangeOutcome::NotFound => settled.not_found.push(id),
                ChangeOutcome::WrongState(state) => settled.not_dead.push((id, state)),
            }
        }
        if settled.done > 0 {
            if action == DeadAction::Redrive {
                runtime.wake();
            }
            let verb = match action {
                DeadAction::Redrive => "redriven",
                DeadAction::Discard => "deleted",
            };
            tracing::info!(queue = %queue, count = settled.done, dead_left, "dead letters {verb}");
        }
        Ok(settled)
    }
}

fn dead_result(id: TaskId, outcome: ChangeOutcome, action: DeadAction) -> Result<()> {
    match outcome {
        ChangeOutcome::Ok => Ok(()),
        ChangeOutcome::NotFound => Err(ServiceError::TaskNotFound(id)),
        ChangeOutcome::WrongState(state) => Err(ServiceError::NotDead { id, state, action }),
    }
}
