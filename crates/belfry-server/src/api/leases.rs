//! Pull consumer endpoints: lease, ack (one or a batch), nack, extend.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use belfry_core::limits::{
    BATCH_TASKS_MAX, LEASE_TASKS_MAX, LEASE_VISIBILITY_MS_DEFAULT, LEASE_VISIBILITY_MS_MAX,
    LEASE_VISIBILITY_MS_MIN, LEASE_WAIT_MS_MAX,
};

use super::dto::{
    AckBody, AckResult, BatchAckBody, BatchResults, ExtendBody, LeaseBody, LeasedList, LeasedView,
    NackBody, TaskStateView,
};
use super::error::{ApiError, ErrorCode};
use super::extract::{task_id, JsonBody, QueuePath, TaskPath};
use super::AppState;
use crate::service::NackResult;

fn out_of_range(field: &str, min: u64, max: u64, got: u64) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("{field} must be between {min} and {max}, got {got}"),
    )
}

fn visibility(value: Option<u64>) -> Result<u64, ApiError> {
    let v = value.unwrap_or(LEASE_VISIBILITY_MS_DEFAULT);
    if !(LEASE_VISIBILITY_MS_MIN..=LEASE_VISIBILITY_MS_MAX).contains(&v) {
        return Err(out_of_range(
            "visibility_ms",
            LEASE_VISIBILITY_MS_MIN,
            LEASE_VISIBILITY_MS_MAX,
            v,
        ));
    }
    Ok(v)
}

pub async fn lease(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Result<Json<LeasedList>, ApiError> {
    let max = body.max.unwrap_or(1);
    if !(1..=LEASE_TASKS_MAX as u64).contains(&max) {
        return Err(out_of_range("max", 1, LEASE_TASKS_MAX as u64, max));
    }
    let visibility_ms = visibility(body.visibility_ms)?;
    let wait_ms = body.wait_ms.unwrap_or(0);
    if wait_ms > LEASE_WAIT_MS_MAX {
        return Err(out_of_range("wait_ms", 0, LEASE_WAIT_MS_MAX, wait_ms));
    }
    let tasks = service
        .lease(
            &queue,
            max as usize,
            visibility_ms,
            Duration::from_millis(wait_ms),
        )
        .await?;
    Ok(Json(LeasedList {
        tasks: tasks.iter().map(LeasedView::new).collect(),
    }))
}

pub async fn ack(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
    JsonBody(body): JsonBody<AckBody>,
) -> Result<Json<TaskStateView>, ApiError> {
    let lease = body.lease_id.parse()?;
    service.ack(&queue, id, lease).await?;
    Ok(Json(TaskStateView {
        id: id.to_string(),
        state: "done",
        due_at_ms: None,
        lease_until_ms: None,
    }))
}

pub async fn nack(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
    JsonBody(body): JsonBody<NackBody>,
) -> Result<Json<TaskStateView>, ApiError> {
    let lease = body.lease_id.parse()?;
    let delay_ms = body
        .delay_ms
        .map(|d| {
            u64::try_from(d).map_err(|_| {
                ApiError::new(
                    ErrorCode::InvalidDueTime,
                    format!("delay_ms must not be negative, got {d}"),
                )
            })
        })
        .transpose()?;
    if let Some(delay) = delay_ms {
        if delay > service.config.horizon_ms {
            return Err(ApiError::new(
                ErrorCode::BeyondHorizon,
                format!(
                    "delay_ms {delay} is beyond the server's horizon of {} ms",
                    service.config.horizon_ms
                ),
            ));
        }
    }
    let reason = body.reason.map(|r| r.chars().take(1024).collect());
    let result = service.nack(&queue, id, lease, delay_ms, reason).await?;
    Ok(Json(match result {
        NackResult::Retry { due_at_ms } => TaskStateView {
            id: id.to_string(),
            state: "scheduled",
            due_at_ms: Some(due_at_ms),
            lease_until_ms: None,
        },
        NackResult::Dead => TaskStateView {
            id: id.to_string(),
            state: "dead",
            due_at_ms: None,
            lease_until_ms: None,
        },
    }))
}

pub async fn extend(
    State(service): State<AppState>,
    TaskPath(queue, id): TaskPath,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<Json<TaskStateView>, ApiError> {
    let lease = body.lease_id.parse()?;
    let visibility_ms = visibility(body.visibility_ms)?;
    let until = service.extend(&queue, id, lease, visibility_ms).await?;
    Ok(Json(TaskStateView {
        id: id.to_string(),
        state: "leased",
        due_at_ms: None,
        lease_until_ms: Some(until),
    }))
}

pub async fn ack_batch(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<BatchAckBody>,
) -> Result<Json<BatchResults<AckResult>>, ApiError> {
    if body.acks.len() > BATCH_TASKS_MAX {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch holds at most {BATCH_TASKS_MAX} acks, got {}",
                body.acks.len()
            ),
        ));
    }
    let mut results: Vec<Option<AckResult>> = Vec::with_capacity(body.acks.len());
    let mut valid = Vec::with_capacity(body.acks.len());
    for item in &body.acks {
        match task_id(&item.id).and_then(|id| Ok((id, item.lease_id.parse()?))) {
            Ok(pair) => {
                valid.push(pair);
                results.push(None);
            }
            Err(e) => results.push(Some(AckResult {
                id: item.id.chars().take(64).collect(),
                ok: None,
                error: Some(e.body()),
            })),
        }
    }
    let ids: Vec<_> = valid.iter().map(|(id, _)| *id).collect();
    let mut outcomes = service.ack_batch(&queue, valid).await?.into_iter().zip(ids);
    let results = results
        .into_iter()
        .map(|slot| match slot {
            Some(error) => error,
            None => match outcomes.next() {
                Some((Ok(()), id)) => AckResult {
                    id: id.to_string(),
                    ok: Some(true),
                    error: None,
                },
                Some((Err(e), id)) => AckResult {
                    id: id.to_string(),
                    ok: None,
                    error: Some(ApiError::from(e).body()),
                },
                None => AckResult {
                    id: String::new(),
                    ok: None,
                    error: Some(
                        ApiError::new(ErrorCode::InternalError, "missing ack outcome").body(),
                    ),
                },
            },
        })
        .collect();
    Ok(Json(BatchResults { results }))
}
