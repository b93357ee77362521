//! Health, readiness, metrics, and our answers for unknown routes.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};
use super::AppState;

pub async fn healthz() -> Response {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({"status": "ok"})),
    )
        .into_response()
}

/// Ready once the store is open and the queues are loaded; `503 shutting_down` from the moment
/// shutdown begins (through the drain delay, while everything else is still served).
pub async fn readyz(State(service): State<AppState>) -> Response {
    if service.is_ready() {
        (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ready"})),
        )
            .into_response()
    } else if service.is_draining() {
        ApiError::new(
            ErrorCode::ShuttingDown,
            "the server is shutting down: finishing work in flight, taking no new work soon",
        )
        .into_response()
    } else {
        ApiError::new(ErrorCode::ShuttingDown, "the server is starting").into_response()
    }
}

pub async fn metrics() -> Response {
    let text = crate::metrics::handle()
        .map(|h| h.render())
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

pub async fn route_not_found() -> ApiError {
    ApiError::new(
        ErrorCode::RouteNotFound,
        "no such endpoint; see docs/api.md for the API v1 routes",
    )
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this endpoint does not support this HTTP method; see docs/api.md",
    )
}
