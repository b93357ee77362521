//! The API's one error type. Every error response is
//! `{"error": {"code": "<stable_snake_case>", "message": "<what to fix>"}}`, and the mapping
//! from code to HTTP status lives here and nowhere else. Codes are never reused.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::service::ServiceError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The body is not JSON.
    MalformedJson,
    /// The request line or headers are not HTTP/1.1 (answered by the listener, before routing).
    MalformedHttp,
    /// The request's headers are larger than the server reads.
    HeadersTooLarge,
    /// The request target (path and query) is longer than the server reads.
    UriTooLong,
    /// The request's head did not arrive within `http.header_read_timeout`, or its body
    /// stalled or arrived too slowly (`http.body_read_timeout`): answered, then the
    /// connection is closed.
    RequestTimeout,
    /// The JSON has a wrong type, an unknown or missing field, or a value out of range.
    InvalidRequest,
    InvalidQueueName,
    InvalidTaskId,
    InvalidLeaseId,
    /// More than one of `delay_ms`, `run_at`, `run_at_ms`.
    ConflictingDueTime,
    /// A negative delay, an unparsable `run_at`, a negative `run_at_ms`.
    InvalidDueTime,
    /// Due further in the future than the configured horizon.
    BeyondHorizon,
    /// Both `payload` and `payload_base64`, or bad base64.
    InvalidPayload,
    PayloadTooLarge,
    BatchTooLarge,
    InvalidQueueConfig,
    WebhookTargetRefused,
    /// A push delivery (other than a webhook) its sink refuses: an unknown connection, a
    /// missing or invalid field.
    InvalidDelivery,
    /// A task names its own target, and its queue does not deliver by webhook.
    TargetNotSupported,
    /// No bearer token, or one this server does not know (`401`, with `WWW-Authenticate`).
    Unauthorized,
    /// A known token without the scope the request needs; the message names it.
    Forbidden,
    /// A web browser's write for a page of another site, or (on an open loopback server) a
    /// request addressed to a host name that is not this machine's (`api/origin.rs`).
    CrossOriginRefused,
    /// The token made more requests than its `rate_per_s` allows: retry after `Retry-After`.
    RateLimited,
    /// `DELETE /v1/tokens/{name}` of a name no token has.
    TokenNotFound,
    /// A token of that name exists (or, on revoke, it comes from the config file).
    TokenExists,
    /// A revoke that would leave no admin token: nobody could manage tokens any more, and
    /// with no token left at all the API would be open to anyone.
    LastAdminToken,
    QueueNotFound,
    TaskNotFound,
    RouteNotFound,
    MethodNotAllowed,
    LeaseExpired,
    TaskNotScheduled,
    TaskNotDead,
    NotPullQueue,
    ShuttingDown,
    /// Too many requests at once: retry after the `Retry-After` seconds.
    Overloaded,
    /// The client's address holds its most connections at once
    /// (`http.connections_per_client_max`): answered by the listener, before reading the
    /// request, then the connection is closed.
    TooManyConnections,
    StoreUnavailable,
    /// The data directory's filesystem is below the engine's free-space reserve: changes that
    /// grow the data are refused; reads and deliveries go on.
    InsufficientStorage,
    InternalError,
    // Schedules: the codes of `belfry_schedule::ScheduleServiceError::code`.
    InvalidScheduleId,
    InvalidSchedule,
    ScheduleNotFound,
    ScheduleExists,
    ScheduleCorrupt,
    // Reminders: the codes of `belfry_reminders::ReminderError::code`, and the user ids.
    InvalidReminderId,
    InvalidReminder,
    ReminderNotFound,
    ReminderExists,
    /// Subscribing to a one-shot reminder that has already fired.
    ReminderFired,
    ReminderCorrupt,
    /// A user id that is empty, too long, or has control characters.
    InvalidUserId,
    /// The user is not subscribed to the reminder.
    UserNotFound,
    /// A streamed body that ended early or broke off; what came before was applied.
    BodyIncomplete,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::MalformedHttp => "malformed_http",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidQueueName => "invalid_queue_name",
            ErrorCode::InvalidTaskId => "invalid_task_id",
            ErrorCode::InvalidLeaseId => "invalid_lease_id",
            ErrorCode::ConflictingDueTime => "conflicting_due_time",
            ErrorCode::InvalidDueTime => "invalid_due_time",
            ErrorCode::BeyondHorizon => "beyond_horizon",
            ErrorCode::InvalidPayload => "invalid_payload",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::InvalidQueueConfig => "invalid_queue_config",
            ErrorCode::WebhookTargetRefused => "webhook_target_refused",
            ErrorCode::InvalidDelivery => "invalid_delivery",
            ErrorCode::TargetNotSupported => "target_not_supported",
            ErrorCode::QueueNotFound => "queue_not_found",
            ErrorCode::TaskNotFound => "task_not_found",
            ErrorCode::RouteNotFound => "route_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::LeaseExpired => "lease_expired",
            ErrorCode::TaskNotScheduled => "task_not_scheduled",
            ErrorCode::TaskNotDead => "task_not_dead",
            ErrorCode::NotPullQueue => "not_pull_queue",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::CrossOriginRefused => "cross_origin_refused",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TokenNotFound => "token_not_found",
            ErrorCode::TokenExists => "token_exists",
            ErrorCode::LastAdminToken => "last_admin_token",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::InvalidScheduleId => "invalid_schedule_id",
            ErrorCode::InvalidSchedule => "invalid_schedule",
            ErrorCode::ScheduleNotFound => "schedule_not_found",
            ErrorCode::ScheduleExists => "schedule_exists",
            ErrorCode::ScheduleCorrupt => "schedule_corrupt",
            ErrorCode::InvalidReminderId => "invalid_reminder_id",
            ErrorCode::InvalidReminder => "invalid_reminder",
            ErrorCode::ReminderNotFound => "reminder_not_found",
            ErrorCode::ReminderExists => "reminder_exists",
            ErrorCode::ReminderFired => "reminder_fired",
            ErrorCode::ReminderCorrupt => "reminder_corrupt",
            ErrorCode::InvalidUserId => "invalid_user_id",
            ErrorCode::UserNotFound => "user_not_found",
            ErrorCode::BodyIncomplete => "body_incomplete",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::MalformedJson
            | ErrorCode::MalformedHttp
            | ErrorCode::InvalidRequest
            | ErrorCode::InvalidQueueName
            | ErrorCode::InvalidTaskId
            | ErrorCode::InvalidLeaseId
            | ErrorCode::ConflictingDueTime
            | ErrorCode::InvalidDueTime
            | ErrorCode::BeyondHorizon
            | ErrorCode::InvalidPayload
            | ErrorCode::BatchTooLarge
            | ErrorCode::InvalidQueueConfig
            | ErrorCode::WebhookTargetRefused
            | ErrorCode::InvalidDelivery
            | ErrorCode::TargetNotSupported
            | ErrorCode::InvalidScheduleId
            | ErrorCode::InvalidSchedule
            | ErrorCode::InvalidReminderId
            | ErrorCode::InvalidReminder
            | ErrorCode::InvalidUserId
            | ErrorCode::BodyIncomplete => StatusCode::BAD_REQUEST,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::QueueNotFound
            | ErrorCode::TaskNotFound
            | ErrorCode::RouteNotFound
            | ErrorCode::ScheduleNotFound
            | ErrorCode::ReminderNotFound
            | ErrorCode::UserNotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden | ErrorCode::CrossOriginRefused => StatusCode::FORBIDDEN,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TokenNotFound => StatusCode::NOT_FOUND,
            ErrorCode::TokenExists | ErrorCode::LastAdminToken => StatusCode::CONFLICT,
            ErrorCode::LeaseExpired
            | ErrorCode::TaskNotScheduled
            | ErrorCode::TaskNotDead
            | ErrorCode::NotPullQueue
            | ErrorCode::ScheduleExists
            | ErrorCode::ReminderExists
            | ErrorCode::ReminderFired => StatusCode::CONFLICT,
            ErrorCode::ShuttingDown
            | ErrorCode::Overloaded
            | ErrorCode::TooManyConnections
            | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            // 507, not 503 with `Retry-After`: the condition ends when space is freed (by an
            // operator, or by the queues draining), which no fixed delay predicts.
            ErrorCode::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
            ErrorCode::InternalError | ErrorCode::ScheduleCorrupt | ErrorCode::ReminderCorrupt => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

/// `Retry-After` of a transient refusal, in seconds: long enough for a burst to drain or a
/// Redis failover to finish its first attempt, short enough to stay responsive.
pub const RETRY_AFTER_S: u32 = 1;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for the `Retry-After` header: set when the same request may succeed later.
    pub retry_after_s: Option<u32>,
}

/// `Retry-After` of a `507 insufficient_storage`: a full store changes on the scale of
/// checkpoints and operators, not of milliseconds.
const INSUFFICIENT_STORAGE_RETRY_AFTER_S: u32 = 10;

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let retry_after_s = match code {
            ErrorCode::Overloaded | ErrorCode::TooManyConnections => Some(RETRY_AFTER_S),
            // A full store frees space as deliveries and checkpoints go on, or once an operator
            // frees some: a client (a consumer's lease above all) should wait, not spin.
            ErrorCode::InsufficientStorage => Some(INSUFFICIENT_STORAGE_RETRY_AFTER_S),
            _ => None,
        };
        ApiError {
            code,
            message: message.into(),
            retry_after_s,
        }
    }

    /// The same error, answered with `Retry-After: seconds`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// The answer to a store error that may pass (a Redis timeout or failover):
    /// `503 store_unavailable` with `Retry-After`, never a 500.
    pub fn transient_store(error: &belfry_store::StoreError) -> Self {
        ApiError::new(ErrorCode::StoreUnavailable, error.to_string()).retry_after(RETRY_AFTER_S)
    }

    /// The whole standard error body, `{"error": {"code", "message"}}`, as bytes: for
    /// answers written below the router (the listener's answer to a malformed request).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&Envelope { error: self.body() })
            .expect("an error body always serialises")
    }

    /// The `{"code", "message"}` object, for batch results that embed errors.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code.as_str(),
            message: self.message.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Envelope {
    error: ErrorBody,
}

/// At most one line per code in each 10 s (the first at once) for the refusals a condition
/// of the whole server answers to every request alike (an overload, a full disk, a store out
/// of reach): a line for each would add to the overload and fill the disk the log may be on.
/// The metrics and `/readyz` say the rest. Other server errors (`None`) are logged each.
fn log_limit(code: ErrorCode) -> Option<&'static crate::log_every::LogEvery> {
    use crate::log_every::LogEvery;
    const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);
    static OVERLOADED: LogEvery = LogEvery::new(PERIOD);
    static STORE_UNAVAILABLE: LogEvery = LogEvery::new(PERIOD);
    static INSUFFICIENT_STORAGE: LogEvery = LogEvery::new(PERIOD);
    match code {
        ErrorCode::Overloaded => Some(&OVERLOADED),
        ErrorCode::StoreUnavailable => Some(&STORE_UNAVAILABLE),
        ErrorCode::InsufficientStorage => Some(&INSUFFICIENT_STORAGE),
        _ => None,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.code == ErrorCode::ShuttingDown {
            // The answer a draining server owes its load balancer's readiness polls: the
            // shutdown itself is logged once, not every poll.
            tracing::debug!(message = %self.message, "refused while shutting down");
        } else if self.code.status().is_server_error() {
            let now = std::time::Instant::now();
            let logged = log_limit(self.code).map_or(Some(0), |limit| limit.check(now));
            if let Some(held_back) = logged {
                if self.retry_after_s.is_some() {
                    // Passing conditions (overload, a store that does not answer for now): the
                    // client is told to retry; not an error of this server.
                    tracing::warn!(code = self.code.as_str(), message = %self.message, held_back, "request refused for now (`held_back`: refusals with this code not logged since the last line)");
                } else {
                    tracing::error!(code = self.code.as_str(), message = %self.message, held_back, "request failed (`held_back`: failures with this code not logged since the last line)");
                }
            }
        }
        let status = self.code.status();
        let mut response = (status, axum::Json(Envelope { error: self.body() })).into_response();
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if self.code == ErrorCode::RequestTimeout {
            // The rest of a slow body is not waited for: the connection ends here.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if self.code == ErrorCode::Unauthorized {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"belfry\""),
            );
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let code = match &e {
            ServiceError::QueueNotFound(queue) => {
                return ApiError::new(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist; create it with PUT /v1/queues/{queue}"),
                )
            }
            ServiceError::TaskNotFound(_) | ServiceError::KeyNotFound(_) => ErrorCode::TaskNotFound,
            ServiceError::LeaseExpired(_) => ErrorCode::LeaseExpired,
            ServiceError::NotScheduled { .. } => ErrorCode::TaskNotScheduled,
            ServiceError::NotDead { .. } => ErrorCode::TaskNotDead,
            ServiceError::NotPullQueue(..) => ErrorCode::NotPullQueue,
            ServiceError::InvalidQueueConfig(_) => ErrorCode::InvalidQueueConfig,
            ServiceError::DeliveryRefused {
                sink: "webhook", ..
            } => ErrorCode::WebhookTargetRefused,
            ServiceError::DeliveryRefused { .. } => ErrorCode::InvalidDelivery,
            ServiceError::ShuttingDown => ErrorCode::ShuttingDown,
            ServiceError::Overloaded => ErrorCode::Overloaded,
            ServiceError::Invalid(_) => ErrorCode::InvalidRequest,
            ServiceError::Store(store) if store.is_transient() => {
                return ApiError::transient_store(store)
            }
            ServiceError::Store(
                belfry_store::StoreError::Poisoned(_)
                | belfry_store::StoreError::Closed
                | belfry_store::StoreError::AccessDenied { .. },
            ) => ErrorCode::StoreUnavailable,
            ServiceError::Store(
                belfry_store::StoreError::DiskFull { .. } | belfry_store::StoreError::Full { .. },
            ) => ErrorCode::InsufficientStorage,
            ServiceError::Store(_) | ServiceError::Internal(_) => ErrorCode::InternalError,
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        let code = match e.classify() {
            Category::Syntax | Category::Eof => ErrorCode::MalformedJson,
            Category::Data => ErrorCode::InvalidRequest,
            Category::Io => ErrorCode::InternalError,
        };
        let prefix = match code {
            ErrorCode::MalformedJson => "the body is not valid JSON",
            _ => "the body does not match the expected shape",
        };
        ApiError::new(code, format!("{prefix}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code (a new one goes here too), unique, in docs/api.md's table with its status,
    /// and in docs/openapi.json's `ErrorBody.code` enum.
    #[test]
    fn a_full_store_says_when_to_retry() {
        let full = ApiError::new(ErrorCode::InsufficientStorage, "full");
        assert_eq!(full.retry_after_s, Some(INSUFFICIENT_STORAGE_RETRY_AFTER_S));
        let response = full.into_response();
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "10");
    }

    #[test]
    fn codes_are_unique_and_documented() {
        let all = [
            ErrorCode::MalformedJson,
            ErrorCode::MalformedHttp,
            ErrorCode::HeadersTooLarge,
            ErrorCode::UriTooLong,
            ErrorCode::RequestTimeout,
            ErrorCode::InvalidRequest,
            ErrorCode::InvalidQueueName,
            ErrorCode::InvalidTaskId,
            ErrorCode::InvalidLeaseId,
            ErrorCode::ConflictingDueTime,
            ErrorCode::InvalidDueTime,
            ErrorCode::BeyondHorizon,
            ErrorCode::InvalidPayload,
            ErrorCode::PayloadTooLarge,
            ErrorCode::BatchTooLarge,
            ErrorCode::InvalidQueueConfig,
            ErrorCode::WebhookTargetRefused,
            ErrorCode::InvalidDelivery,
            ErrorCode::TargetNotSupported,
            ErrorCode::QueueNotFound,
            ErrorCode::TaskNotFound,
            ErrorCode::RouteNotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::LeaseExpired,
            ErrorCode::TaskNotScheduled,
            ErrorCode::TaskNotDead,
            ErrorCode::NotPullQueue,
            ErrorCode::ShuttingDown,
            ErrorCode::Overloaded,
            ErrorCode::TooManyConnections,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::CrossOriginRefused,
            ErrorCode::RateLimited,
            ErrorCode::TokenNotFound,
            ErrorCode::TokenExists,
            ErrorCode::LastAdminToken,
            ErrorCode::StoreUnavailable,
            ErrorCode::InsufficientStorage,
            ErrorCode::InternalError,
            ErrorCode::InvalidScheduleId,
            ErrorCode::InvalidSchedule,
            ErrorCode::ScheduleNotFound,
            ErrorCode::ScheduleExists,
            ErrorCode::ScheduleCorrupt,
            ErrorCode::InvalidReminderId,
            ErrorCode::InvalidReminder,
            ErrorCode::ReminderNotFound,
            ErrorCode::ReminderExists,
            ErrorCode::ReminderFired,
            ErrorCode::ReminderCorrupt,
            ErrorCode::InvalidUserId,
            ErrorCode::UserNotFound,
            ErrorCode::BodyIncomplete,
        ];
        let names: std::collections::HashSet<_> = all.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), all.len());
        let reference = include_str!("../../../../docs/api.md");
        let openapi: serde_json::Value =
            serde_json::from_str(include_str!("../../../../docs/openapi.json")).unwrap();
        let enumerated =
            &openapi["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"];
        for code in all {
            let row = format!("| `{}` | {} |", code.as_str(), code.status().as_u16());
            assert!(reference.contains(&row), "docs/api.md lacks the row {row}");
            let listed = enumerated
                .as_array()
                .is_some_and(|codes| codes.iter().any(|c| c == code.as_str()));
            assert!(
                listed,
                "docs/openapi.json's ErrorBody.code lacks {}",
                code.as_str()
            );
        }
    }
}
