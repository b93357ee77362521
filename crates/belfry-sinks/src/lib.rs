//! Where due tasks are delivered.
//!
//! A [`Sink`] takes one due task and reports an [`Outcome`]: delivered, retry later, or reject
//! (dead-letter at once). The dispatcher owns everything around that — leases, attempts,
//! backoff, dead letters — so every sink shares one retry and dead-letter path. Which status or
//! failure counts as transient is decided in one place, [`retry`].
//!
//! The HTTP [`WebhookSink`] signs requests with HMAC-SHA256 ([`sign`]) and refuses private,
//! loopback and other internal targets unless [`TargetPolicy::allow_private`] is set, both when
//! a queue is configured ([`validate_webhook_url`]) and at every connection (a DNS resolver that
//! filters addresses, so DNS rebinding cannot sneak past the first check).
//!
//! The Redis Streams sink (`redis_stream`, feature `redis-streams`, on by default) appends to a
//! stream instead. [`testing::ScriptedSink`] records deliveries and answers from a script or
//! seeded faults, for dispatcher tests and the simulation.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use belfry_core::{Task, UnixMs};

mod error;
#[cfg(feature = "redis-streams")]
pub mod redis_stream;
pub mod retry;
pub mod testing;
pub mod webhook;

pub use error::SinkError;
pub use webhook::signature::{sign, verify_signature};
pub use webhook::target::{
    check_webhook_target, client_for, default_client, non_public_range, try_client_for,
    validate_webhook_url, TargetPolicy,
};
pub use webhook::{WebhookConfig, WebhookSink};

#[cfg(feature = "redis-streams")]
pub use redis_stream::{RedisStreamConfig, RedisStreamSink};

/// What became of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The target accepted the task (HTTP 2xx). The dispatcher acks it.
    Delivered,
    /// A transient failure (HTTP 429 or 5xx, a timeout, a connection error). The dispatcher
    /// tries again after its backoff, or after `after` when the target asked for longer
    /// (`Retry-After`, already capped by [`retry::RETRY_AFTER_MAX`]).
    Retry {
        after: Option<Duration>,
        reason: String,
    },
    /// A permanent failure (another 4xx, a redirect, a forbidden target, a bad configuration):
    /// trying again cannot help, so the task goes to the dead letters at once.
    Reject { reason: String },
}

impl Outcome {
    /// A short label for metrics and logs: `delivered`, `retry` or `reject`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Retry { .. } => "retry",
            Outcome::Reject { .. } => "reject",
        }
    }
}

/// A destination for due tasks.
///
/// `attempt` is the 1-based number of this delivery (the receiver gets it to deduplicate);
/// `now_ms` is the dispatcher's wall clock, used for signature timestamps and to turn an
/// HTTP-date `Retry-After` into a delay, so time stays injected.
///
/// Cancellation: dropping the future abandons the attempt; the task stays leased in the store
/// and is delivered again when the lease expires (at-least-once), so callers need not drive it
/// to completion during shutdown.
pub trait Sink: Send + Sync + 'static {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;
}
