//! Tasks: submit (single submits coalesced), read, cancel and reschedule.

use belfry_core::{NewTask, QueueName, Task, TaskId, UnixMs};
use belfry_store::{ChangeOutcome, PutOutcome};

use super::{Result, Service, ServiceError};
use crate::metrics;
use crate::shared::Caller;

impl Service {
    pub async fn submit(&self, queue: &QueueName, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let runtime = self.runtime(queue).await?;
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = if tasks.len() == 1 {
            // One task per request: share the store call with concurrent submits. Each waiting
            // submit holds a store-call slot, so admission still bounds the queue.
            let _permit = self.calls.admit(Caller::Api).await?;
            self.submits.put(tasks, self.calls.api_deadline()).await?
        } else {
            self.blocking(move |s| Ok(s.put(tasks)?)).await?
        };
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, PutOutcome::Created { .. }))
            .count();
        metrics::submitted(queue.as_str(), created);
        if created > 0 {
            runtime.wake();
        }
        Ok(outcomes)
    }

    /// A page of the queue's live tasks (scheduled or leased), after the task `after`, in the
    /// store's listing order (see `Store::list_tasks`), and whether more may follow (a page
    /// ends early once its payloads reach [`super::PAGE_PAYLOAD_BYTES_MAX`]).
    pub async fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<(Vec<Task>, bool)> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let limit = limit.min(super::TASK_PAGE_MAX);
        self.blocking(move |s| {
            super::pages::read_page(limit, after, |after, n| {
                Ok(s.list_tasks(&name, after, n, now_ms)?)
            })
        })
        .await
    }

    pub async fn get_task(&self, queue: &QueueName, id: TaskId) -> Result<Task> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        self.blocking(move |s| Ok(s.get(&name, id, now_ms)?))
            .await?
            .ok_or(ServiceError::TaskNotFound(id))
    }

    /// The task submitted with idempotency key `key` (keys are unique for a task's whole
    /// life in its queue).
    pub async fn task_by_key(&self, queue: &QueueName, key: &str) -> Result<Task> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let owned = key.to_owned();
        self.blocking(move |s| Ok(s.get_by_key(&name, &owned, now_ms)?))
            .await?
            .ok_or_else(|| ServiceError::KeyNotFound(key.to_owned()))
    }

    pub async fn cancel(&self, queue: &QueueName, id: TaskId) -> Result<()> {
        self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let outcome = self
            .blocking(move |s| Ok(s.cancel(&name, id, now_ms)?))
            .await?;
        change_result(id, outcome)
    }

    pub async fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
    ) -> Result<Task> {
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (outcome, task) = self
            .blocking(move |s| {
                let outcome = s.reschedule(&name, id, due_at_ms, now_ms)?;
                let task = s.get(&name, id, now_ms)?;
                Ok((outcome, task))
            })
            .await?;
        change_result(id, outcome)?;
        runtime.wake();
        task.ok_or(ServiceError::TaskNotFound(id))
    }
}

fn change_result(id: TaskId, outcome: ChangeOutcome) -> Result<()> {
    match outcome {
        ChangeOutcome::Ok => Ok(()),
        ChangeOutcome::NotFound => Err(ServiceError::TaskNotFound(id)),
        ChangeOutcome::WrongState(state) => Err(ServiceError::NotScheduled { id, state }),
    }
}
