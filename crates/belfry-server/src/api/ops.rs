//! Health, readiness, metrics, and our answers for unknown routes.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use belfry_store::StoreHealth;

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
/// shutdown begins (through the drain delay, while everything else is still served);
/// `503 store_unavailable`, with the store's reason and what to do, once the store stopped
/// after a fatal error (a failed fsync), or while a networked store cannot be reached. A store short of disk space is still ready (reads and
/// deliveries are served) and says so in `storage`.
pub async fn readyz(State(service): State<AppState>) -> Response {
    if service.is_draining() {
        return ApiError::new(
            ErrorCode::ShuttingDown,
            "the server is shutting down: finishing work in flight, taking no new work soon",
        )
        .into_response();
    }
    // `statvfs` and, on a stopped store, its lock: off the async workers.
    let store = service.store.clone();
    let health = tokio::task::spawn_blocking(move || store.health())
        .await
        .unwrap_or_else(|e| StoreHealth::Poisoned(format!("the health check did not finish: {e}")));
    match health {
        StoreHealth::Poisoned(reason) => {
            return ApiError::new(ErrorCode::StoreUnavailable, reason).into_response();
        }
        // A node that cannot reach a shared store is taken out of rotation until it can.
        StoreHealth::Unavailable(reason) => {
            return ApiError::new(
                ErrorCode::StoreUnavailable,
                format!("the store cannot be reached just now ({reason}); this node is ready again once it can"),
            )
            .into_response();
        }
        _ => {}
    }
    if !service.is_ready() {
        return ApiError::new(ErrorCode::ShuttingDown, "the server is starting").into_response();
    }
    let body = match health {
        StoreHealth::LowDiskSpace {
            free_bytes,
            reserve_bytes,
            refused_bytes,
        } => serde_json::json!({
            "status": "ready",
            "storage": "low_disk_space",
            "message": low_disk_space_message(free_bytes, reserve_bytes, refused_bytes),
        }),
        _ => serde_json::json!({"status": "ready"}),
    };
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// What `/readyz` says about a disk short of space: where free space stands against the
/// reserve (the free figure can be above it when the change refused last was what did not
/// fit), and what is refused at that depth (`docs/storage-format.md`, "Disk faults").
fn low_disk_space_message(free_bytes: u64, reserve_bytes: u64, refused_bytes: u64) -> String {
    let standing = if free_bytes < reserve_bytes {
        format!("{free_bytes} bytes free, below the free-space reserve of {reserve_bytes}")
    } else {
        format!(
            "{free_bytes} bytes free, too close to the free-space reserve of {reserve_bytes} \
             for the last refused change ({refused_bytes} bytes)"
        )
    };
    let refused = if free_bytes < reserve_bytes / 4 {
        "submits and other changes that grow the data answer 507 insufficient_storage, and so \
         do leases, nacks and extensions near the end of the reserve"
    } else {
        "submits and other changes that grow the data answer 507 insufficient_storage"
    };
    format!("{standing}: {refused} until disk space is freed; reads and acks go on")
}

pub async fn metrics(State(service): State<AppState>) -> Response {
    crate::metrics::connections(&service.connections);
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

/// The API description this server was built with (`docs/openapi.json`, embedded).
pub const OPENAPI_JSON: &str = include_str!("../../../../docs/openapi.json");

pub async fn openapi() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON,
    )
}

#[cfg(test)]
mod tests {
    use super::low_disk_space_message;

    #[test]
    fn low_disk_space_says_which_side_of_the_reserve_free_space_is() {
        let at = low_disk_space_message(2_621_440, 2_621_440, 4_096);
        assert!(
            at.starts_with("2621440 bytes free, too close to the free-space reserve of 2621440 for the last refused change (4096 bytes)"),
            "{at}"
        );
        let below = low_disk_space_message(2_000_000, 2_621_440, 0);
        assert!(
            below.starts_with("2000000 bytes free, below the free-space reserve of 2621440"),
            "{below}"
        );
        assert!(!below.contains("leases"), "{below}");
        let deep = low_disk_space_message(100_000, 2_621_440, 0);
        assert!(deep.contains("leases, nacks and extensions"), "{deep}");
    }
}
