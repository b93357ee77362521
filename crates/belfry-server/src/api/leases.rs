//! Pull consumer endpoints: lease, ack (one or a batch), nack, extend.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use belfry_core::limits::{
    BATCH_TASKS_MAX, LEASE_TASKS_MAX, LEASE_VISIBILITY_MS_DEFAULT, LEASE_VISIBILITY_MS_MAX,
    LEASE_VISIBILITY_MS_MIN, LEASE_WAIT_MS_MAX,
};

use axum::http::StatusCode;
use axum::response::Response;

use super::dto::{AckBody, BatchAckBody, ExtendBody, LeaseBody, NackBody, TaskStateView};
use super::error::{ApiError, ErrorCode};
use super::extract::{parse_json, task_id, JsonBody, JsonBytes, QueuePath, TaskPath};
use super::wire::{self, AckEntry};
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
) -> Result<Response, ApiError> {
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
    Ok(wire::json_response(
        StatusCode::OK,
        wire::leased_list(&tasks),
    ))
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
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    let body: BatchAckBody = parse_json(&bytes)?;
    if body.acks.len() > BATCH_TASKS_MAX {
        return Err(ApiError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch holds at most {BATCH_TASKS_MAX} acks, got {}",
                body.acks.len()
            ),
        ));
    }
    // One entry per ack, in order: errors found here are final; the others are filled in
    // from the store's outcomes below.
    let mut entries: Vec<Option<AckEntry>> = Vec::with_capacity(body.acks.len());
    let mut valid = Vec::with_capacity(body.acks.len());
    for item in &body.acks {
        let id = match wire::parse_hex_id(&item.id) {
            Some(id) => Ok(id),
            None => task_id(&item.id),
        };
        match id.and_then(|id| Ok((id, item.lease_id.parse()?))) {
            Ok(pair) => {
                valid.push(pair);
                entries.push(None);
            }
            Err(e) => entries.push(Some(AckEntry::Failed {
                id: item.id.chars().take(64).collect(),
                error: e.body(),
            })),
        }
    }
    let ids: Vec<_> = valid.iter().map(|(id, _)| *id).collect();
    let mut outcomes = service.ack_batch(&queue, valid).await?.into_iter().zip(ids);
    let entries: Vec<AckEntry> = entries
        .into_iter()
        .map(|slot| match slot {
            Some(error) => error,
            None => match outcomes.next() {
                Some((Ok(()), id)) => AckEntry::Done(id),
                Some((Err(e), id)) => AckEntry::Failed {
                    id: id.to_string(),
                    error: ApiError::from(e).body(),
                },
                None => AckEntry::Failed {
                    id: String::new(),
                    error: ApiError::new(ErrorCode::InternalError, "missing ack outcome").body(),
                },
            },
        })
        .collect();
    Ok(wire::json_response(
        StatusCode::OK,
        wire::ack_results(&entries),
    ))
}
