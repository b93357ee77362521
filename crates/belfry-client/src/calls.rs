//! The typed methods for queues, tasks, pull consumers and dead letters: each builds a
//! `Request` and parses the answer.

use crate::model::{
    AckItemResult, BatchItem, CancelManyAnswer, CancelSelection, DeadBulkAnswer, DeadPage,
    DeadSelection, LeaseRequest, Leased, LeasedList, NewTask, Purged, Queue, QueueList, QueueSpec,
    Results, Submitted, Task, TaskPage, TaskState,
};
use crate::request::{DueTime, Nack, Request};
use crate::{Client, Result};

impl Client {
    // ---- queues ----

    /// Creates the queue, or changes the settings given.
    pub async fn put_queue(&self, queue: &str, spec: &QueueSpec) -> Result<Queue> {
        self.expect(Request::put_queue(queue, spec)).await
    }

    pub async fn get_queue(&self, queue: &str) -> Result<Queue> {
        self.expect(Request::get_queue(queue)).await
    }

    /// Every queue, sorted by name (following the server's pages).
    pub async fn list_queues(&self) -> Result<Vec<Queue>> {
        let mut list: QueueList = self.expect(Request::list_queues()).await?;
        let mut queues = std::mem::take(&mut list.queues);
        while let Some(after) = list.next_after.take() {
            list = self.expect(Request::list_queues_after(&after)).await?;
            queues.append(&mut list.queues);
        }
        Ok(queues)
    }

    /// Deletes the queue and every task in it.
    pub async fn delete_queue(&self, queue: &str) -> Result<()> {
        self.expect_empty(Request::delete_queue(queue)).await
    }

    /// Drops every task of the queue — scheduled, leased and dead — and keeps the queue and
    /// its settings; answers what it held just before.
    pub async fn purge_queue(&self, queue: &str) -> Result<Purged> {
        #[derive(serde::Deserialize)]
        struct Answer {
            purged: Purged,
        }
        let answer: Answer = self.expect(Request::purge_queue(queue)).await?;
        Ok(answer.purged)
    }

    /// Stops delivery; tasks are still accepted.
    pub async fn pause(&self, queue: &str) -> Result<Queue> {
        self.expect(Request::pause_queue(queue)).await
    }

    pub async fn resume(&self, queue: &str) -> Result<Queue> {
        self.expect(Request::resume_queue(queue)).await
    }

    // ---- tasks ----

    pub async fn submit(&self, queue: &str, task: &NewTask) -> Result<Submitted> {
        self.expect(Request::submit(queue, task)).await
    }

    /// One result per task, in order; one bad task does not fail the others.
    pub async fn submit_batch(&self, queue: &str, tasks: &[NewTask]) -> Result<Vec<BatchItem>> {
        let results: Results<BatchItem> = self.expect(Request::submit_batch(queue, tasks)).await?;
        Ok(results.results)
    }

    pub async fn get_task(&self, queue: &str, id: &str) -> Result<Task> {
        self.expect(Request::get_task(queue, id)).await
    }

    /// Cancels a scheduled task (`task_not_scheduled` once leased or finished).
    pub async fn cancel(&self, queue: &str, id: &str) -> Result<()> {
        self.expect_empty(Request::cancel(queue, id)).await
    }

    /// Moves a scheduled task to a new due time, atomically.
    pub async fn reschedule(&self, queue: &str, id: &str, due: &DueTime) -> Result<Task> {
        self.expect(Request::reschedule(queue, id, due)).await
    }

    /// The task submitted with this idempotency key.
    pub async fn get_task_by_key(&self, queue: &str, key: &str) -> Result<Task> {
        self.expect(Request::get_task_by_key(queue, key)).await
    }

    pub async fn cancel_by_key(&self, queue: &str, key: &str) -> Result<()> {
        self.expect_empty(Request::cancel_by_key(queue, key)).await
    }

    pub async fn reschedule_by_key(&self, queue: &str, key: &str, due: &DueTime) -> Result<Task> {
        self.expect(Request::reschedule_by_key(queue, key, due))
            .await
    }

    // ---- pull consumers ----

    /// Leases up to `max` due tasks; may long-poll `wait_ms` when none is due.
    pub async fn lease(&self, queue: &str, request: &LeaseRequest) -> Result<Vec<Leased>> {
        let list: LeasedList = self.expect(Request::lease(queue, request)).await?;
        Ok(list.tasks)
    }

    pub async fn ack(&self, queue: &str, id: &str, lease_id: &str) -> Result<TaskState> {
        self.expect(Request::ack(queue, id, lease_id)).await
    }

    /// Gives the task back: due again after `nack.delay_ms` (or the queue's backoff), or a
    /// dead letter when it has used its last attempt.
    pub async fn nack(
        &self,
        queue: &str,
        id: &str,
        lease_id: &str,
        nack: &Nack,
    ) -> Result<TaskState> {
        self.expect(Request::nack(queue, id, lease_id, nack)).await
    }

    /// Holds the lease `visibility_ms` from now.
    pub async fn extend(
        &self,
        queue: &str,
        id: &str,
        lease_id: &str,
        visibility_ms: u64,
    ) -> Result<TaskState> {
        self.expect(Request::extend(queue, id, lease_id, visibility_ms))
            .await
    }

    /// Acks many tasks: `(task id, lease id)` pairs; one result per pair, in order.
    pub async fn ack_batch(
        &self,
        queue: &str,
        acks: &[(String, String)],
    ) -> Result<Vec<AckItemResult>> {
        let results: Results<AckItemResult> = self.expect(Request::ack_batch(queue, acks)).await?;
        Ok(results.results)
    }

    /// A page of the queue's live tasks (scheduled and leased), with their payloads, after
    /// the task `after` (a previous page's `next_after`). Each task's own target is shown
    /// without credentials or query string.
    pub async fn list_tasks(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<TaskPage> {
        self.expect(Request::list_tasks(queue, after, limit)).await
    }

    /// As [`Client::list_tasks`], with each task's own target whole: what an export needs
    /// to submit the tasks again as they were.
    pub async fn list_tasks_for_export(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<TaskPage> {
        self.expect(Request::list_tasks_for_export(queue, after, limit))
            .await
    }

    /// Cancels up to 1,000 scheduled tasks in one call. Tasks that are not scheduled, or not
    /// in the queue, are reported in the answer, not as errors.
    pub async fn cancel_many(
        &self,
        queue: &str,
        which: &CancelSelection,
    ) -> Result<CancelManyAnswer> {
        self.expect(Request::cancel_many(queue, which)).await
    }

    // ---- dead letters ----

    pub async fn list_dead(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<DeadPage> {
        self.expect(Request::list_dead(queue, after, limit)).await
    }

    /// Schedules a dead letter again, due now, with its attempts reset.
    pub async fn redrive(&self, queue: &str, id: &str) -> Result<Task> {
        self.expect(Request::redrive(queue, id)).await
    }

    /// Deletes a dead letter: it is finished as cancelled, its idempotency key freed.
    pub async fn delete_dead(&self, queue: &str, id: &str) -> Result<()> {
        self.expect_empty(Request::delete_dead(queue, id)).await
    }

    /// Redrives up to 1,000 dead letters in one call. Tasks that are not dead letters, or not
    /// in the queue, are reported in the answer, not as errors; `dead_left` says how many
    /// remain, so `DeadSelection::First(1000)` repeated until it reads 0 redrives them all.
    pub async fn redrive_dead_many(
        &self,
        queue: &str,
        which: &DeadSelection,
    ) -> Result<DeadBulkAnswer> {
        self.expect(Request::redrive_dead_many(queue, which)).await
    }

    /// Deletes up to 1,000 dead letters in one call (as [`Client::redrive_dead_many`]).
    pub async fn delete_dead_many(
        &self,
        queue: &str,
        which: &DeadSelection,
    ) -> Result<DeadBulkAnswer> {
        self.expect(Request::delete_dead_many(queue, which)).await
    }
}
