//! Errors in a sink's configuration. Delivery failures are not errors: they are
//! [`crate::Outcome`]s.

use std::net::IpAddr;
use std::time::Duration;

/// Why a sink cannot be built from its configuration. Every message says what to change.
///
/// Messages never contain a URL's credentials or query string, nor the signing secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    #[error("webhook url is not a valid absolute URL ({reason}); expected something like https://example.com/hooks/belfry")]
    InvalidUrl { reason: String },

    #[error("webhook url is {len} bytes long; the limit is {max} bytes")]
    UrlTooLong { len: usize, max: usize },

    #[error("webhook url scheme {scheme:?} is not supported; use http:// or https://")]
    UnsupportedScheme { scheme: String },

    #[error("webhook url has no host; expected something like https://example.com/hooks/belfry")]
    MissingHost,

    #[error("webhook target {host} is {range}; belfry refuses private, loopback and other internal targets to prevent server-side request forgery. Use a public address, or set webhooks.allow_private_targets = true in the server configuration if this target is intended")]
    ForbiddenTarget { host: String, range: &'static str },

    #[error("webhook target {host} resolves to {addr}, which is {range}; belfry refuses private, loopback and other internal targets to prevent server-side request forgery. Use a public address, or set webhooks.allow_private_targets = true in the server configuration if this target is intended")]
    ForbiddenAddress {
        host: String,
        addr: IpAddr,
        range: &'static str,
    },

    #[error("webhook host {host} could not be resolved ({reason}); check the host name")]
    Unresolvable { host: String, reason: String },

    #[error("webhook timeout must be between {min:?} and {max:?}, got {got:?}")]
    InvalidTimeout {
        got: Duration,
        min: Duration,
        max: Duration,
    },

    #[error("webhook secret must be 1 to {max} bytes long, got {len} bytes")]
    InvalidSecret { len: usize, max: usize },

    #[error("the HTTP client for webhooks could not be built ({reason}); this points at a broken TLS setup on this machine")]
    HttpClient { reason: String },

    #[error(
        "redis url is not usable ({reason}); expected something like redis://127.0.0.1:6379/0"
    )]
    InvalidRedisUrl { reason: String },

    #[error("TLS settings are not usable: {reason}")]
    InvalidTls { reason: String },

    #[error("redis stream key must be 1 to {max} bytes long, got {len} bytes (it may contain {{queue}}, replaced by the queue name)")]
    InvalidStreamKey { len: usize, max: usize },

    #[error("redis stream timeout must be between {min:?} and {max:?}, got {got:?}")]
    InvalidRedisTimeout {
        got: Duration,
        min: Duration,
        max: Duration,
    },

    /// A field of a queue's `delivery` object is missing, invalid or names something the
    /// server does not have. `field` is the path inside `delivery` (`connection`, `topic`).
    #[error("delivery.{field}: {reason}")]
    InvalidDelivery { field: &'static str, reason: String },

    #[error("webhook previous_secret is for rotating a secret: it needs a secret (the new one) beside it")]
    PreviousSecretAlone,

    /// A task names its own target, and this sink delivers only to its queue's.
    #[error("this sink delivers every task to its queue's target; only webhook queues take a task's own target")]
    TaskTargetNotSupported,
}
