//! Queue endpoints.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::dto::{QueueBody, QueueList, QueueListQuery, QueueView};
use super::error::ApiError;
use super::extract::{page_limit, page_query, JsonBody, QueuePath};
use super::AppState;

pub async fn put(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<QueueBody>,
) -> Result<Response, ApiError> {
    let (config, created, not_open) = service.put_queue(queue.clone(), body.into_patch()?).await?;
    let counts = service.queue_counts(&queue).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut view = QueueView::new(&queue, &config, Some(counts));
    view.health = health(&service, &queue);
    if let Some(error) = not_open {
        view.warnings.push(open_warning(&error));
    }
    Ok((status, Json(view)).into_response())
}

pub async fn get(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<Json<QueueView>, ApiError> {
    let runtime = service.runtime(&queue).await?;
    let counts = service.queue_counts(&queue).await?;
    let mut view = QueueView::new(&queue, &runtime.config(), Some(counts));
    view.health = health(&service, &queue);
    Ok(Json(view))
}

/// The warning for a sink whose target did not answer or refused when the queue was put.
fn open_warning(error: &belfry_sinks::OpenError) -> String {
    use belfry_sinks::OpenError;
    match error {
        OpenError::Unreachable(reason) => format!(
            "the delivery target is not reachable yet ({reason}); the queue is saved and deliveries will be retried"
        ),
        OpenError::Refused(reason) => format!(
            "the delivery target refused the connection ({reason}); the queue is saved, but its tasks will be dead-lettered at their first attempt until the target or the server's connection config is fixed"
        ),
    }
}

/// A push queue's sink health as the API shows it.
fn health(service: &AppState, queue: &belfry_core::QueueName) -> Option<String> {
    use belfry_sinks::SinkHealth;
    service.dispatcher.health(queue).map(|health| match health {
        SinkHealth::Unknown => "unknown".to_owned(),
        SinkHealth::Reachable => "reachable".to_owned(),
        SinkHealth::Unreachable(reason) => format!("unreachable: {reason}"),
        SinkHealth::Refused(reason) => format!("refused: {reason}"),
    })
}

/// Queues one `GET /v1/queues` answers at most, and by default: each costs a store call for
/// its counts, so a server with ten thousand queues answers in pages.
pub const QUEUE_PAGE_MAX: usize = 1_000;

pub async fn list(
    State(service): State<AppState>,
    query: Result<Query<QueueListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<QueueList>, ApiError> {
    let query = page_query(query, "after=<queue name>&limit=<n>")?;
    let limit = page_limit(query.limit, QUEUE_PAGE_MAX, QUEUE_PAGE_MAX)?;
    let mut queues = Vec::new();
    let mut more = false;
    let after = query.after.unwrap_or_default();
    // Sorted by name: the page is the `limit` names after `after`.
    for runtime in service
        .queues
        .all()
        .into_iter()
        .filter(|r| r.name.as_str() > after.as_str())
    {
        if queues.len() == limit {
            more = true;
            break;
        }
        let counts = match service.queue_counts(&runtime.name).await {
            Ok(counts) => Some(counts),
            // Deleted while we listed: leave it out.
            Err(crate::service::ServiceError::QueueNotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        queues.push(QueueView::new(&runtime.name, &runtime.config(), counts));
    }
    let next_after = if more {
        queues.last().map(|q| q.name.clone())
    } else {
        None
    };
    Ok(Json(QueueList { queues, next_after }))
}

pub async fn delete(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<StatusCode, ApiError> {
    if service.delete_queue(queue.clone()).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(crate::service::ServiceError::QueueNotFound(queue).into())
    }
}

/// `POST /v1/queues/{queue}/purge`: every task goes, the queue and its settings stay.
pub async fn purge(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let counts = service.purge_queue(&queue).await?;
    Ok(Json(serde_json::json!({
        "purged": {
            "pending": counts.pending,
            "in_flight": counts.in_flight,
            "dead": counts.dead,
        }
    })))
}

pub async fn pause(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<Json<QueueView>, ApiError> {
    set_paused(service, queue, true).await
}

pub async fn resume(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<Json<QueueView>, ApiError> {
    set_paused(service, queue, false).await
}

async fn set_paused(
    service: AppState,
    queue: belfry_core::QueueName,
    paused: bool,
) -> Result<Json<QueueView>, ApiError> {
    let config = service.set_paused(queue.clone(), paused).await?;
    let counts = service.queue_counts(&queue).await?;
    Ok(Json(QueueView::new(&queue, &config, Some(counts))))
}
