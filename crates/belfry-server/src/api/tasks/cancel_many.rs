//! `POST /v1/queues/{queue}/tasks:cancel`: cancel up to 1,000 scheduled tasks in one call,
//! named by id or by idempotency key.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::super::error::{ApiError, ErrorCode};
use super::super::extract::{task_ids, JsonBody, QueuePath};
use super::super::AppState;
use crate::service::{CancelPick, CANCEL_MANY_MAX};

/// The tasks to cancel: `ids` or `keys`, exactly one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelManyBody {
    pub ids: Option<Vec<String>>,
    pub keys: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
pub struct CancelManyAnswer {
    pub cancelled: usize,
    /// Tasks named that were not scheduled, each with its state (and the key it was named by).
    pub not_scheduled: Vec<NotScheduledEntry>,
    /// Ids or keys the queue does not have.
    pub not_found: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct NotScheduledEntry {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub state: &'static str,
}

pub async fn cancel_many(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<CancelManyBody>,
) -> Result<Json<CancelManyAnswer>, ApiError> {
    let done = service.cancel_many(&queue, pick(body)?).await?;
    Ok(Json(CancelManyAnswer {
        cancelled: done.cancelled,
        not_scheduled: done
            .not_scheduled
            .into_iter()
            .map(|(id, key, state)| NotScheduledEntry {
                id: id.to_string(),
                key,
                state: state.as_str(),
            })
            .collect(),
        not_found: done.not_found,
    }))
}

/// The tasks a body names: 1 to 1,000 ids or keys.
fn pick(body: CancelManyBody) -> Result<CancelPick, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidRequest, message);
    match (body.ids, body.keys) {
        (Some(ids), None) => Ok(CancelPick::Ids(task_ids(&ids, CANCEL_MANY_MAX)?)),
        (None, Some(keys)) => {
            if keys.is_empty() || keys.len() > CANCEL_MANY_MAX {
                return Err(invalid(format!(
                    "keys must name between 1 and {CANCEL_MANY_MAX} tasks, got {}",
                    keys.len()
                )));
            }
            for (i, key) in keys.iter().enumerate() {
                if key.is_empty() || key.len() > belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX {
                    return Err(invalid(format!(
                        "keys[{i}]: an idempotency key is 1 to {} bytes",
                        belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX
                    )));
                }
            }
            Ok(CancelPick::Keys(keys))
        }
        (Some(_), Some(_)) => Err(invalid("give ids or keys, not both".to_owned())),
        (None, None) => Err(invalid(
            "give either ids (task ids) or keys (idempotency keys) of the tasks to cancel, \
             1 to 1000 of them"
                .to_owned(),
        )),
    }
}
