//! Queue endpoints.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::dto::{QueueBody, QueueList, QueueView};
use super::error::ApiError;
use super::extract::{JsonBody, QueuePath};
use super::AppState;

pub async fn put(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    JsonBody(body): JsonBody<QueueBody>,
) -> Result<Response, ApiError> {
    let (config, created, unreachable) =
        service.put_queue(queue.clone(), body.into_patch()?).await?;
    let counts = service.queue_counts(&queue).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut view = QueueView::new(&queue, &config, Some(counts));
    view.health = health(&service, &queue);
    if let Some(reason) = unreachable {
        view.warnings.push(format!(
            "the delivery target is not reachable yet ({reason}); the queue is created and deliveries will be retried"
        ));
    }
    Ok((status, Json(view)).into_response())
}

pub async fn get(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
) -> Result<Json<QueueView>, ApiError> {
    let runtime = service.runtime(&queue)?;
    let counts = service.queue_counts(&queue).await?;
    let mut view = QueueView::new(&queue, &runtime.config(), Some(counts));
    view.health = health(&service, &queue);
    Ok(Json(view))
}

/// A push queue's sink health as the API shows it.
fn health(service: &AppState, queue: &belfry_core::QueueName) -> Option<String> {
    use belfry_sinks::SinkHealth;
    service.dispatcher.health(queue).map(|health| match health {
        SinkHealth::Unknown => "unknown".to_owned(),
        SinkHealth::Reachable => "reachable".to_owned(),
        SinkHealth::Unreachable(reason) => format!("unreachable: {reason}"),
    })
}

pub async fn list(State(service): State<AppState>) -> Result<Json<QueueList>, ApiError> {
    let mut queues = Vec::new();
    for runtime in service.queues.all() {
        let counts = match service.queue_counts(&runtime.name).await {
            Ok(counts) => Some(counts),
            // Deleted while we listed: leave it out.
            Err(crate::service::ServiceError::QueueNotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        queues.push(QueueView::new(&runtime.name, &runtime.config(), counts));
    }
    Ok(Json(QueueList { queues }))
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
