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
//! The stream sinks publish to a broker the operator declared in the server config
//! ([`Connections`]): Redis Streams (`redis_stream`, feature `redis-streams`), NATS JetStream
//! (`nats`, feature `nats`) and Kafka (`kafka`, feature `kafka`), all on by default. They
//! deliver many tasks per round trip ([`Sink::deliver_batch`]) and name the same metadata
//! ([`metadata`]). [`testing::ScriptedSink`] records deliveries and answers from a script or
//! seeded faults, for dispatcher tests and the simulation.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use belfry_core::{Task, UnixMs};

pub mod connections;
mod error;
pub mod factory;
mod gate;
#[cfg(feature = "kafka")]
pub mod kafka;
mod link;
pub mod metadata;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis-streams")]
pub mod redis_stream;
pub mod retry;
pub mod testing;
pub mod trust;
pub mod webhook;

pub use connections::{
    ConnectionKind, ConnectionSpec, Connections, KafkaSaslMechanism, TlsOptions,
};
pub use error::SinkError;
pub use factory::{
    KafkaSpec, NatsSpec, RedisStreamSpec, SinkFactory, SinkSpec, StandardSinks, WebhookSpec,
};
pub use webhook::signature::{sign, verify_signature, verify_signature_v2, Signatures};
pub use webhook::target::{
    check_webhook_target, client_for, default_client, non_public_range, try_client_for,
    validate_webhook_url, TargetPolicy,
};
pub use webhook::{WebhookConfig, WebhookSink};

#[cfg(feature = "kafka")]
pub use kafka::{KafkaConfig, KafkaKey, KafkaSink};
#[cfg(feature = "nats")]
pub use nats::{NatsConfig, NatsSink};
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

/// One task handed to a sink, with the 1-based number of this delivery attempt.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub task: &'a Task,
    pub attempt: u32,
}

/// What a sink knows of its target's health, for `/readyz`-style reporting and create-time
/// warnings. Never a reason to refuse a queue: a broker may come up after the queue is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkHealth {
    /// Nothing tried yet.
    Unknown,
    /// The last connection attempt or delivery reached the target.
    Reachable,
    /// The last attempt failed, and why (no credentials in it).
    Unreachable(String),
    /// Connecting was refused for good (unknown topic, credentials refused), and why: every
    /// delivery is dead-lettered at its first attempt until the target or the server's
    /// connection config changes. Cleared by the next delivery that gets through.
    Refused(String),
}

/// Why [`Sink::open`] could not ready the sink; both carry a reason naming the connection
/// (no credentials in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// No answer, or a failure that can pass (a refused or lost connection, a timeout):
    /// deliveries retry, and succeed once the target is up.
    Unreachable(String),
    /// The target answered with a refusal that retrying cannot change (an unknown topic,
    /// refused credentials): deliveries are dead-lettered at their first attempt.
    Refused(String),
}

impl OpenError {
    /// The reason, whichever kind.
    pub fn reason(&self) -> &str {
        match self {
            OpenError::Unreachable(reason) | OpenError::Refused(reason) => reason,
        }
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// A boxed future, as the object-safe [`Sink`] methods return.
pub type SinkFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A destination for due tasks.
///
/// `attempt` is the 1-based number of this delivery (the receiver gets it to deduplicate);
/// `now_ms` is the dispatcher's wall clock, used for signature timestamps and to turn an
/// HTTP-date `Retry-After` into a delay, so time stays injected.
///
/// Cancellation: dropping the future abandons the attempt; the task stays leased in the store
/// and is delivered again when the lease expires (at-least-once), so callers need not drive it
/// to completion during shutdown.
///
/// The dispatcher owns what happens after an [`Outcome`] (ack, retry with backoff, dead
/// letter); a sink only reports. A new sink is one folder: its spec (a variant of
/// [`SinkSpec`]), its `Sink` impl, and one arm in [`StandardSinks::build`].
pub trait Sink: Send + Sync + 'static {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Outcome>;

    /// Most tasks the dispatcher hands to one [`Sink::deliver_batch`] call. `1` (the
    /// default) means one `deliver` per task, each its own concurrent delivery: right for
    /// HTTP, where every request is independent. Stream sinks publish many per round trip.
    fn batch_max(&self) -> usize {
        1
    }

    /// Delivers tasks of one queue, given in due order; answers one outcome per task, in the
    /// same order. The default delivers them one after another (keeping their order).
    fn deliver_batch<'a>(
        &'a self,
        batch: &'a [Attempt<'a>],
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let mut outcomes = Vec::with_capacity(batch.len());
            for item in batch {
                outcomes.push(self.deliver(item.task, item.attempt, now_ms).await);
            }
            outcomes
        })
    }

    /// The key of the connection pool this sink delivers through (a webhook's
    /// `scheme://host:port`, a broker connection's name). The dispatcher caps deliveries in
    /// flight per target, so queues sharing a target share its connections fairly. Never
    /// contains credentials.
    fn target(&self) -> &str;

    /// Checks a task's own target ([`Task::target`]) when the task is submitted, so a target
    /// this sink could never deliver to is refused then rather than dead-lettered later. A
    /// sink that delivers only to its queue's target (the default) refuses every one.
    fn check_task_target(&self, target: &str) -> Result<(), SinkError> {
        let _ = target;
        Err(SinkError::TaskTargetNotSupported)
    }

    /// Connects (or checks the target) ahead of the first delivery. An error is reported to
    /// whoever configured the queue, saying whether deliveries will retry or be dead-lettered;
    /// it does not stop the queue.
    fn open(&self) -> SinkFuture<'_, Result<(), OpenError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// What the sink last saw of its target.
    fn health(&self) -> SinkHealth {
        SinkHealth::Unknown
    }

    /// Lets go of connections once the dispatcher stops using the sink (the queue was
    /// reconfigured or deleted, or the server stops). Deliveries still running finish first.
    fn close(&self) -> SinkFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}
