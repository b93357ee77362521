//! Dead-letter endpoints: list, redrive or delete one, and redrive or delete many.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use belfry_core::TaskId;
use belfry_store::DeadAction;

use super::dto::{DeadBulkAnswer, DeadBulkBody, NotDeadEntry, TaskPage, TaskPageQuery, TaskView};
use super::error::{ApiError, ErrorCode};
use super::extract::{
    page_limit, page_query, task_id, task_ids, JsonBody, QueuePath, TaskPath, PAGE_QUERY_FORM,
};
use super::AppState;
use crate::service::{DeadPick, DEAD_PAGE_MAX};

/// Dead letters per page when the caller does not say.
const DEAD_PAGE_DEFAULT: usize = 100;

pub async fn list_dead(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    query: Result<Query<TaskPageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    let query = page_query(query, PAGE_QUERY_FORM)?;
    let after = query.after.as_deref().map(task_id).transpose()?;
    let limit = page_limit(query.limit, DEAD_PAGE_DEFAULT, DEAD_PAGE_MAX)?;
    let (tasks, more) = service.list_dead(&queue, after, limit).await?;
    Ok(Json(TaskPage::new(&tasks, more, &query)))
}

pub async fn redrive(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
) -> Result<Json<TaskView>, ApiError> {
    let task = service.redrive(&queue, id).await?;
    Ok(Json(TaskView::new(&task)))
}

/// `DELETE /v1/queues/{queue}/dead/{id}`: the dead letter is finished as cancelled.
pub async fn delete(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
) -> Result<StatusCode, ApiError> {
    service.delete_dead(&queue, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{queue}/dead:redrive`.
pub async fn redrive_many(
    state: State<AppState>,
    path: QueuePath,
    body: JsonBody<DeadBulkBody>,
) -> Result<Json<DeadBulkAnswer>, ApiError> {
    settle(state, path, body, DeadAction::Redrive).await
}

/// `POST /v1/queues/{queue}/dead:delete`.
pub async fn delete_many(
    state: State<AppState>,
    path: QueuePath,
    body: JsonBody<DeadBulkBody>,
) -> Result<Json<DeadBulkAnswer>, ApiError> {
    settle(state, path, body, DeadAction::Discard).await
}

async fn settle(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<DeadBulkBody>,
    action: DeadAction,
) -> Result<Json<DeadBulkAnswer>, ApiError> {
    let pick = pick(body)?;
    let settled = service.settle_dead(&queue, pick, action).await?;
    let done = Some(settled.done);
    let (redriven, deleted) = match action {
        DeadAction::Redrive => (done, None),
        DeadAction::Discard => (None, done),
    };
    Ok(Json(DeadBulkAnswer {
        redriven,
        deleted,
        not_dead: settled
            .not_dead
            .iter()
            .map(|(id, state)| NotDeadEntry {
                id: id.to_string(),
                state: state.as_str(),
            })
            .collect(),
        not_found: settled.not_found.iter().map(TaskId::to_string).collect(),
        dead_left: settled.dead_left,
    }))
}

/// The dead letters a bulk body names: `ids` (1 to 1,000 task ids) or `limit` (the first 1 to
/// 1,000 in id order), exactly one of them.
fn pick(body: DeadBulkBody) -> Result<DeadPick, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidRequest, message);
    match (body.ids, body.limit) {
        (Some(ids), None) => Ok(DeadPick::Ids(task_ids(&ids, DEAD_PAGE_MAX)?)),
        (None, Some(limit)) => Ok(DeadPick::First(page_limit(
            Some(limit),
            DEAD_PAGE_MAX,
            DEAD_PAGE_MAX,
        )?)),
        (Some(_), Some(_)) => Err(invalid(
            "give ids or limit, not both: ids names the dead letters (at most 1000), limit \
             takes the first 1 to 1000 in id order"
                .to_owned(),
        )),
        (None, None) => Err(invalid(
            "give either ids (the task ids of the dead letters, at most 1000) or limit (the \
             first 1 to 1000 dead letters in id order)"
                .to_owned(),
        )),
    }
}
