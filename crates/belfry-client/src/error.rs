//! The client's errors, and the server's stable error codes as a type to match on.

/// Declares `ErrorCode` with one variant per stable code of docs/api.md, and its text.
macro_rules! error_codes {
    ($($variant:ident => $text:literal,)*) => {
        /// A stable API error code (docs/api.md). Codes this client does not know yet (a newer
        /// server) arrive as `Other` with their text.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $($variant,)*
            Other(String),
        }

        impl ErrorCode {
            /// The code as the server writes it, e.g. `"queue_not_found"`.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                    ErrorCode::Other(text) => text,
                }
            }

            pub fn parse(text: &str) -> Self {
                match text {
                    $($text => ErrorCode::$variant,)*
                    other => ErrorCode::Other(other.to_owned()),
                }
            }
        }
    };
}

error_codes! {
    MalformedJson => "malformed_json",
    MalformedHttp => "malformed_http",
    HeadersTooLarge => "headers_too_large",
    UriTooLong => "uri_too_long",
    InvalidRequest => "invalid_request",
    InvalidQueueName => "invalid_queue_name",
    InvalidTaskId => "invalid_task_id",
    InvalidLeaseId => "invalid_lease_id",
    ConflictingDueTime => "conflicting_due_time",
    InvalidDueTime => "invalid_due_time",
    BeyondHorizon => "beyond_horizon",
    InvalidPayload => "invalid_payload",
    BatchTooLarge => "batch_too_large",
    InvalidQueueConfig => "invalid_queue_config",
    WebhookTargetRefused => "webhook_target_refused",
    InvalidDelivery => "invalid_delivery",
    TargetNotSupported => "target_not_supported",
    PayloadTooLarge => "payload_too_large",
    QueueNotFound => "queue_not_found",
    TaskNotFound => "task_not_found",
    RouteNotFound => "route_not_found",
    MethodNotAllowed => "method_not_allowed",
    LeaseExpired => "lease_expired",
    TaskNotScheduled => "task_not_scheduled",
    TaskNotDead => "task_not_dead",
    NotPullQueue => "not_pull_queue",
    ShuttingDown => "shutting_down",
    Overloaded => "overloaded",
    TooManyConnections => "too_many_connections",
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
    CrossOriginRefused => "cross_origin_refused",
    RateLimited => "rate_limited",
    TokenNotFound => "token_not_found",
    TokenExists => "token_exists",
    LastAdminToken => "last_admin_token",
    StoreUnavailable => "store_unavailable",
    InsufficientStorage => "insufficient_storage",
    InternalError => "internal_error",
    InvalidScheduleId => "invalid_schedule_id",
    InvalidSchedule => "invalid_schedule",
    ScheduleNotFound => "schedule_not_found",
    ScheduleExists => "schedule_exists",
    ScheduleCorrupt => "schedule_corrupt",
    InvalidReminderId => "invalid_reminder_id",
    InvalidReminder => "invalid_reminder",
    ReminderNotFound => "reminder_not_found",
    ReminderExists => "reminder_exists",
    ReminderFired => "reminder_fired",
    ReminderCorrupt => "reminder_corrupt",
    InvalidUserId => "invalid_user_id",
    UserNotFound => "user_not_found",
    BodyIncomplete => "body_incomplete",
    RequestTimeout => "request_timeout",
}

impl ErrorCode {
    /// Whether the same call may succeed if sent again later: the server is busy
    /// (`overloaded`, `too_many_connections`), the token is over its rate (`rate_limited`), the
    /// store cannot serve for now (`store_unavailable`; but see [`Error::is_transient`]: without
    /// `Retry-After` it is the storage engine stopped for good), the disk is short of space
    /// (`insufficient_storage`), or the server is stopping (`shutting_down`: another node, or
    /// this one restarted, serves the retry).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ErrorCode::Overloaded
                | ErrorCode::TooManyConnections
                | ErrorCode::RateLimited
                | ErrorCode::StoreUnavailable
                | ErrorCode::InsufficientStorage
                | ErrorCode::ShuttingDown
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an API error: match on `code`.
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
        /// The answer's `Retry-After` (whole seconds): the server's word that the same call
        /// may succeed after this long.
        retry_after: Option<std::time::Duration>,
    },
    /// A retried call whose outcome cannot be told: an earlier attempt may have taken effect
    /// (its answer was lost, or the store could not say), and a later one was answered as a
    /// repeat of a call that took effect is: an ack or nack refused with `lease_expired` (or
    /// `task_not_found`, the task finished and forgotten), a `DELETE` with a not-found,
    /// `task_not_scheduled` or `task_not_dead`. That answer may be this call's own earlier
    /// attempt having worked, or something else having happened in between (the lease ran
    /// out and another consumer took the task; another client deleted it): the client cannot
    /// tell which, so it reports neither success nor that failure. Only from a client with
    /// retries ([`crate::Client::with_retries`]).
    #[error("outcome unknown after {attempts} attempts: an earlier attempt may have taken effect ({earlier}), and the last was answered as its repeat would be ({answer})")]
    OutcomeUnknown {
        attempts: u32,
        /// The failure after which the call may have taken effect.
        earlier: Box<Error>,
        /// The last attempt's answer.
        answer: Box<Error>,
    },
    /// A bulk (un)subscribe body the server did not read to its end (cut off, broken off,
    /// too large): `answer` counts what it applied before `answer.stopped_at_line`.
    #[error("{code}: {message} (HTTP {status}; applied before line {line}: {changed} changed, {unchanged} unchanged, {refused} refused)",
        line = answer.stopped_at_line.unwrap_or(0), changed = answer.changed,
        unchanged = answer.unchanged, refused = answer.refused)]
    BulkIncomplete {
        status: u16,
        code: ErrorCode,
        message: String,
        answer: Box<crate::BulkAnswer>,
    },
    /// A task import the server stopped part way (cut off, broken off, too large, a batch the
    /// store refused): `answer` counts what it applied before `answer.stopped_at_line`, the
    /// line to resume from.
    #[error("{code}: {message} (HTTP {status}; applied before line {line}: {created} created, {duplicates} duplicates, {refused} refused)",
        line = answer.stopped_at_line.unwrap_or(0), created = answer.created,
        duplicates = answer.duplicates, refused = answer.refused)]
    ImportIncomplete {
        status: u16,
        code: ErrorCode,
        message: String,
        answer: Box<crate::ImportAnswer>,
    },
    /// No connection to the server could be made (nothing listens there, or a wrong host).
    #[error("cannot reach belfry at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The request failed after connecting: a timeout, a reset, a broken body.
    #[error("request to belfry failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("unexpected answer from belfry (HTTP {status}): {detail}")]
    Unexpected { status: u16, detail: String },
    #[error("invalid server URL {0:?}: give http://HOST:PORT or https://HOST:PORT, without /v1 (each call adds it), a query or a fragment")]
    BadUrl(String),
    /// A name in the call's path is empty, `.` or `..`, which a URL cannot carry.
    #[error("{0:?} is not a name belfry takes (a URL path cannot carry it): no queue, key, user, schedule, reminder or token is empty, \".\" or \"..\"")]
    DotName(String),
    /// The CA file given for an `https://` server holds no usable certificate.
    #[error("CA certificates: {0}")]
    BadCa(String),
}

impl Error {
    /// The API error code, when the server sent one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Error::Api { code, .. }
            | Error::BulkIncomplete { code, .. }
            | Error::ImportIncomplete { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the same call may succeed if sent again later: an API error whose code
    /// [`ErrorCode::is_transient`] (`store_unavailable` only with `Retry-After`: without one the
    /// storage engine stopped after a fatal error and refuses everything until restarted), no
    /// connection ([`Error::Unreachable`]), or a connection that failed or timed out after
    /// the request was sent ([`Error::Http`]). Whether it is *safe* to send again is another
    /// question: see [`Error::may_have_taken_effect`].
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api {
                code, retry_after, ..
            } => {
                code.is_transient()
                    && (*code != ErrorCode::StoreUnavailable || retry_after.is_some())
            }
            Error::Unreachable { .. } => true,
            Error::Http(e) => !(e.is_builder() || e.is_redirect() || e.is_status()),
            _ => false,
        }
    }

    /// Whether the call that failed so may still have taken effect: its answer was lost (the
    /// connection broke or timed out after the request was sent), or the store did not answer
    /// in time (`store_unavailable`: "may or may not have been applied"). Refusals before any
    /// work (`overloaded`, `rate_limited`, `too_many_connections`, `insufficient_storage`, no
    /// connection) did not.
    pub fn may_have_taken_effect(&self) -> bool {
        match self {
            Error::Api { code, .. } => *code == ErrorCode::StoreUnavailable,
            Error::Http(_) => true,
            _ => false,
        }
    }

    /// The server's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
