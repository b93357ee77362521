//! Task endpoints: submit (one, a batch, or a streamed import), get, cancel, reschedule.

mod cancel_many;
mod import;

pub use cancel_many::cancel_many;
pub use import::import;

use std::sync::OnceLock;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use belfry_core::limits::BATCH_TASKS_MAX;
use belfry_core::{NewTask, QueueName, UnixMs};
use belfry_store::PutOutcome;

use super::dto::{
    BatchBody, BatchTasks, DueBody, TaskBody, TaskLimits, TaskPage, TaskPageQuery, TaskTargets,
    TaskView,
};
use super::error::{ApiError, ErrorCode};
use super::extract::{page_limit, page_query, parse_json, task_id, JsonBody, JsonBytes, KeyPath};
use super::extract::{QueuePath, TaskPath, PAGE_QUERY_FORM};
use super::wire::{self, SubmitEntry};
use super::AppState;
use crate::service::TASK_PAGE_MAX;

/// What a submitted task is checked against in one queue: the queue's name, the server's
/// limits, the queue's defaults and what checks a task's own target. Every submit path (one
/// task, a batch, an import) turns a `TaskBody` into a `NewTask` through [`Intake::task`]
/// alone, so a field added to the body is taken, and checked, the same way by all of them.
pub(super) struct Intake {
    queue: QueueName,
    limits: TaskLimits,
    service: AppState,
    /// Whether the queue delivers by push (pull queues take no target).
    pushed: bool,
    /// What checks a task's own target: looked up with the first task that has one, so the
    /// common submit does not touch the dispatcher's state.
    targets: OnceLock<TaskTargets>,
}

impl Intake {
    /// The queue's intake. An unknown queue is reported here, before any complaint about a
    /// task itself (and before an import reads its body).
    pub(super) async fn of(service: &AppState, queue: &QueueName) -> Result<Self, ApiError> {
        let runtime = service.runtime(queue).await?;
        let config = runtime.config();
        Ok(Intake {
            queue: queue.clone(),
            limits: TaskLimits {
                payload_bytes_max: service.config.payload_bytes_max,
                horizon_ms: service.config.horizon_ms,
                late_default: config.late_policy,
            },
            service: service.clone(),
            pushed: config.sink().is_some(),
            targets: OnceLock::new(),
        })
    }

    /// What checks a task's own target in this queue: its attached sink, or why none can.
    fn targets(&self) -> &TaskTargets {
        self.targets.get_or_init(|| {
            let queue = &self.queue;
            match (self.pushed, self.service.dispatcher.sink(queue)) {
                (_, Some(sink)) => TaskTargets::Sink(sink),
                (false, None) => TaskTargets::Refused(format!(
                    "queue {queue} is a pull queue: its consumers lease the tasks, so a task's target means nothing there; targets are for webhook queues"
                )),
                (true, None) => TaskTargets::Refused(format!(
                    "queue {queue}'s delivery is not running on this server (see its delivery_health), so a task's target cannot be checked"
                )),
            }
        })
    }

    pub(super) fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// One task of a submit, as the store takes it, due times resolved against `now_ms`.
    pub(super) fn task(&self, body: TaskBody<'_>, now_ms: UnixMs) -> Result<NewTask, ApiError> {
        if let Some(target) = &body.target {
            self.targets().check(target)?;
        }
        body.into_new_task(&self.queue, now_ms, self.limits)
    }
}

pub async fn submit(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    let body: TaskBody = parse_json(&bytes)?;
    let intake = Intake::of(&service, &queue).await?;
    let task = intake.task(body, service.now_ms())?;
    let outcome = service
        .submit(&queue, vec![task])
        .await?
        .pop()
        .ok_or_else(|| ApiError::new(ErrorCode::InternalError, "the store returned no outcome"))?;
    Ok(match outcome {
        PutOutcome::Created { id, due_at_ms } => {
            wire::json_response(StatusCode::CREATED, wire::created(id, &queue, due_at_ms))
        }
        PutOutcome::Duplicate(task) => {
            (StatusCode::OK, Json(TaskView::duplicate(&task))).into_response()
        }
    })
}

pub async fn submit_batch(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    // One pass when every task parses (see `BatchTasks`); otherwise each task on its own, so
    // one bad task fails alone and its error is the one it always was.
    let tasks: Vec<Result<TaskBody, ApiError>> = match parse_json::<BatchTasks>(&bytes) {
        Ok(batch) => batch.tasks.into_iter().map(Ok).collect(),
        Err(_) => parse_json::<BatchBody>(&bytes)?
            .tasks
            .into_iter()
            .map(|raw| parse_json::<TaskBody>(raw.get().as_bytes()))
            .collect(),
    };
    service.runtime(&queue).await?;
    if tasks.len() > BATCH_TASKS_MAX {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch holds at most {BATCH_TASKS_MAX} tasks, got {}; split it",
                tasks.len()
            ),
        ));
    }
    let now_ms = service.now_ms();
    let intake = Intake::of(&service, &queue).await?;
    let mut entries: Vec<Option<SubmitEntry<TaskView>>> = Vec::with_capacity(tasks.len());
    let mut valid = Vec::with_capacity(tasks.len());
    for task in tasks {
        let parsed = task.and_then(|task| intake.task(task, now_ms));
        match parsed {
            Ok(task) => {
                valid.push(task);
                entries.push(None);
            }
            Err(e) => entries.push(Some(SubmitEntry::Error(e.body()))),
        }
    }
    let mut outcomes = service.submit(&queue, valid).await?.into_iter();
    let entries = entries
        .into_iter()
        .map(|slot| match slot {
            Some(error) => Ok(error),
            None => match outcomes.next() {
                Some(PutOutcome::Created { id, due_at_ms }) => {
                    Ok(SubmitEntry::Created { id, due_at_ms })
                }
                Some(PutOutcome::Duplicate(task)) => {
                    Ok(SubmitEntry::Other(TaskView::duplicate(&task)))
                }
                None => Err(ApiError::new(
                    ErrorCode::InternalError,
                    "the store returned fewer outcomes than tasks",
                )),
            },
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(wire::json_response(
        StatusCode::OK,
        wire::submit_results(&queue, &entries),
    ))
}

/// Live tasks per page when the caller does not say.
const TASK_PAGE_DEFAULT: usize = 100;

/// `GET /v1/queues/{queue}/tasks`: a page of the queue's scheduled and leased tasks.
pub async fn list(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    query: Result<Query<TaskPageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    let query = page_query(query, PAGE_QUERY_FORM)?;
    let after = query.after.as_deref().map(task_id).transpose()?;
    let limit = page_limit(query.limit, TASK_PAGE_DEFAULT, TASK_PAGE_MAX)?;
    let (tasks, more) = service.list_tasks(&queue, after, limit).await?;
    Ok(Json(TaskPage::new(&tasks, more, &query)))
}

pub async fn get(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
) -> Result<Json<TaskView>, ApiError> {
    let task = service.get_task(&queue, id).await?;
    Ok(Json(TaskView::new(&task)))
}

pub async fn cancel(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
) -> Result<StatusCode, ApiError> {
    service.cancel(&queue, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn reschedule(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
    JsonBody(body): JsonBody<DueBody>,
) -> Result<Json<TaskView>, ApiError> {
    let due = new_due_time(&service, &queue, &body).await?;
    let task = service.reschedule(&queue, id, due).await?;
    Ok(Json(TaskView::new(&task)))
}

async fn new_due_time(
    service: &AppState,
    queue: &QueueName,
    body: &DueBody,
) -> Result<belfry_core::UnixMs, ApiError> {
    service.runtime(queue).await?;
    body.resolve(service.now_ms(), service.config.horizon_ms)?
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidDueTime,
                "give the new due time as one of delay_ms, run_at or run_at_ms",
            )
        })
}

/// `GET /v1/queues/{queue}/keys/{key}`: the task submitted with this idempotency key.
pub async fn get_by_key(
    State(service): State<AppState>,
    KeyPath(queue, key): KeyPath,
) -> Result<Json<TaskView>, ApiError> {
    let task = service.task_by_key(&queue, &key).await?;
    Ok(Json(TaskView::new(&task)))
}

/// `DELETE /v1/queues/{queue}/keys/{key}`: cancels it.
pub async fn cancel_by_key(
    State(service): State<AppState>,
    KeyPath(queue, key): KeyPath,
) -> Result<StatusCode, ApiError> {
    let task = service.task_by_key(&queue, &key).await?;
    service.cancel(&queue, task.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PATCH /v1/queues/{queue}/keys/{key}`: moves its due time ("push this order's
/// close-if-unpaid back by 10 minutes", for a caller that only remembers its own key).
pub async fn reschedule_by_key(
    State(service): State<AppState>,
    KeyPath(queue, key): KeyPath,
    JsonBody(body): JsonBody<DueBody>,
) -> Result<Json<TaskView>, ApiError> {
    let due = new_due_time(&service, &queue, &body).await?;
    let task = service.task_by_key(&queue, &key).await?;
    let task = service.reschedule(&queue, task.id, due).await?;
    Ok(Json(TaskView::new(&task)))
}
