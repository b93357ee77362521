//! The NATS JetStream sink: publish each due task to a subject and count it delivered once the
//! stream that captures the subject answers with its PubAck (the message is stored).
//!
//! The message body is the task's payload, unchanged. Headers: `Nats-Msg-Id` is the task id,
//! so the stream's duplicate window drops a redelivery the first publish already stored; then
//! the `belfry-*` metadata (see [`crate::metadata`]) and the task's own headers (names starting
//! with `belfry-` or `Nats-` left out: the latter would steer the server, e.g. an expected
//! stream or sequence).
//!
//! A batch is published asynchronously: every message is written to the connection in due
//! order, then the acks are awaited together, so a batch costs about one round trip. The
//! server stores messages of one connection in the order they were written.
//!
//! The sink connects on first use (or [`Sink::open`]), then the client reconnects by itself
//! when the server goes away; publishes meanwhile time out and are retried by the dispatcher.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::header::{HeaderMap, HeaderName, HeaderValue};
use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::{ConnectErrorKind, ServerAddr};
use belfry_core::{Task, UnixMs};
use bytes::Bytes;
use futures_util::future::join_all;

use crate::gate::{Gate, HealthCell};
use crate::link::SharedLink;
use crate::metadata;
use crate::retry::{classify_nats_failure, NatsFailure};
use crate::{Attempt, Outcome, Sink, SinkError, SinkFuture, SinkHealth};

/// Longest subject. NATS has no hard limit, but subjects travel with every message and are
/// matched against every stream's filters; 256 bytes is far beyond any sane hierarchy.
pub const SUBJECT_LEN_MAX: usize = 256;
/// Shortest and longest limit for one publish (connecting included).
pub const TIMEOUT_MIN: Duration = Duration::from_millis(10);
pub const TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Limit when the spec names none: a PubAck on a healthy server takes well under a
/// millisecond; a file-backed stream with a slow disk, a few.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Most messages in one batch, all in flight at once awaiting their acks.
pub const BATCH_MAX: usize = 256;
/// Acks one sink waits for at once: as many as the dispatcher keeps in flight by default
/// (`dispatch.in_flight_max`), bounded so a stuck server cannot pile up unbounded state.
/// Batches take their share of it whole before they publish (see `NatsSink::window`).
pub const ACKS_IN_FLIGHT_MAX: usize = 16 * BATCH_MAX;
/// Longest wait between two reconnect attempts after the server went away. Short, since a
/// NATS server restarts in well under a second and every publish meanwhile is a retry.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(2);
/// Bytes of framing a message's header block adds besides the names and values
/// (`NATS/1.0\r\n`, the final `\r\n`), for the size check against `max_payload`.
const HEADER_BLOCK_OVERHEAD: usize = 12;

/// Where and how to publish one queue's tasks.
#[derive(Clone)]
pub struct NatsConfig {
    /// `nats://host:port`, several separated by commas.
    pub servers: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub tls: bool,
    pub tls_ca_file: Option<PathBuf>,
    pub subject: String,
    pub timeout: Duration,
    /// What [`Sink::target`] reports: the connection's name.
    pub target: String,
}

impl NatsConfig {
    pub fn new(servers: impl Into<String>, subject: impl Into<String>) -> Self {
        let servers = servers.into();
        NatsConfig {
            target: servers.clone(),
            servers,
            username: None,
            password: None,
            token: None,
            tls: false,
            tls_ca_file: None,
            subject: subject.into(),
            timeout: TIMEOUT_DEFAULT,
        }
    }
}

/// Never prints the password or the token.
impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("target", &self.target)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Subject prefixes the server owns, and what lives there. A publish to one of them is not a
/// message a stream stores but a request to the server: a task on
/// `$JS.API.STREAM.DELETE.<name>` deletes that stream. `$KV.` and `$O.` are not here: the
/// key-value and object stores are streams that capture them, and publishing to them is how
/// one writes to those stores.
pub const RESERVED_SUBJECT_PREFIXES: &[(&str, &str)] = &[
    (
        "$JS.",
        "the JetStream API, acks, flow control and advisories",
    ),
    ("$SYS.", "the server's system account"),
    ("_INBOX.", "reply subjects of requests"),
];

/// Checks a subject: tokens separated by `.`, none empty, no wildcards or whitespace, and not
/// in a namespace the server owns ([`RESERVED_SUBJECT_PREFIXES`]).
pub fn validate_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() || subject.len() > SUBJECT_LEN_MAX {
        return Err(format!("must be 1 to {SUBJECT_LEN_MAX} bytes long"));
    }
    if subject.split('.').any(str::is_empty) {
        return Err("has an empty token (leading, trailing or double '.')".to_owned());
    }
    if subject
        .bytes()
        .any(|b| b == b'*' || b == b'>' || b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(
            "must not contain wildcards ('*', '>'), spaces or control characters".to_owned(),
        );
    }
    if let Some((prefix, what)) = RESERVED_SUBJECT_PREFIXES
        .iter()
        .find(|(prefix, _)| subject.starts_with(prefix))
    {
        return Err(format!(
            "{subject:?} is in the {prefix:?} namespace, reserved for {what}: a publish there is a \
             request to the NATS server (it could delete or purge a stream), not a message a \
             stream stores; use a subject of your own that a stream captures"
        ));
    }
    Ok(())
}

/// A live connection and its JetStream context.
#[derive(Clone)]
struct Link {
    client: async_nats::Client,
    jetstream: jetstream::Context,
}

/// Publishes one queue's tasks to a JetStream subject.
pub struct NatsSink {
    config: NatsConfig,
    /// The servers, without the credentials a URL may carry: the client logs each address it
    /// tries at debug level, password and all.
    servers: Vec<ServerAddr>,
    /// Credentials given in the URL (`nats://user:password@…`, or `nats://token@…`), sent
    /// through the connect options instead.
    url_credentials: Option<(String, Option<String>)>,
    link: SharedLink<Link>,
    /// Room for acks awaited, [`ACKS_IN_FLIGHT_MAX`] in all, taken by a batch for all its
    /// messages before it writes the first. The client has the same bound, but it frees a
    /// message's room only once its ack is awaited, and a batch awaits its acks after writing
    /// all its messages: batches that each got part of the client's room waited for each
    /// other until they timed out (8,192 messages in 32 batches: 7,936 timed out).
    window: tokio::sync::Semaphore,
    gate: Gate,
    health: HealthCell,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("config", &self.config)
            .finish()
    }
}

impl NatsSink {
    /// Checks the configuration; does not connect.
    pub fn new(config: NatsConfig) -> Result<Self, SinkError> {
        validate_subject(&config.subject).map_err(|reason| SinkError::InvalidDelivery {
            field: "subject",
            reason,
        })?;
        if !(TIMEOUT_MIN..=TIMEOUT_MAX).contains(&config.timeout) {
            return Err(SinkError::InvalidDelivery {
                field: "timeout_ms",
                reason: format!(
                    "must be between {} and {} ms",
                    TIMEOUT_MIN.as_millis(),
                    TIMEOUT_MAX.as_millis()
                ),
            });
        }
        let parse = |text: &str| {
            text.parse::<ServerAddr>()
                .map_err(|error| SinkError::InvalidDelivery {
                    field: "connection",
                    reason: format!("the connection's url is not a NATS server list ({error})"),
                })
        };
        let mut servers = Vec::new();
        let mut url_credentials = None;
        for part in config.servers.split(',') {
            let addr = parse(part.trim())?;
            if let Some(user) = addr.username() {
                url_credentials
                    .get_or_insert_with(|| (user.to_owned(), addr.password().map(str::to_owned)));
            }
            servers.push(parse(&crate::connections::strip_userinfo(part.trim()))?);
        }
        Ok(NatsSink {
            config,
            servers,
            url_credentials,
            link: SharedLink::default(),
            window: tokio::sync::Semaphore::new(ACKS_IN_FLIGHT_MAX),
            gate: Gate::default(),
            health: HealthCell::default(),
        })
    }

    async fn link(&self) -> Result<Link, Outcome> {
        self.link.get_or_connect(|| self.connect()).await
    }

    async fn connect(&self) -> Result<Link, Outcome> {
        let config = &self.config;
        let mut options = async_nats::ConnectOptions::new()
            .name("belfry")
            .connection_timeout(config.timeout)
            .request_timeout(Some(config.timeout))
            // Publish only to the servers the operator declared, not to ones a server gossips.
            .ignore_discovered_servers()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                let exponent = u32::try_from(attempts.min(10)).unwrap_or(10);
                Duration::from_millis(50u64 << exponent).min(RECONNECT_DELAY_MAX)
            });
        if let (Some(user), Some(password)) = (&config.username, &config.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &config.token {
            options = options.token(token.clone());
        }
        if config.username.is_none() && config.token.is_none() {
            match &self.url_credentials {
                Some((user, Some(password))) => {
                    options = options.user_and_password(user.clone(), password.clone())
                }
                Some((token, None)) => options = options.token(token.clone()),
                None => {}
            }
        }
        if config.tls {
            options = options.require_tls(true);
        }
        if let Some(ca_file) = &config.tls_ca_file {
            options = options.add_root_certificates(ca_file.clone());
        }
        let client = options
            .connect(self.servers.clone())
            .await
            .map_err(|error| {
                let failure = match error.kind() {
                    ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                        NatsFailure::Authorization
                    }
                    ConnectErrorKind::ServerParse => NatsFailure::InvalidRequest,
                    ConnectErrorKind::TimedOut => NatsFailure::Timeout,
                    _ => NatsFailure::Connection,
                };
                classify_nats_failure(failure, &error.to_string())
            })?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.timeout)
            .max_ack_inflight(ACKS_IN_FLIGHT_MAX)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(Link { client, jetstream })
    }

    /// The message headers for one attempt, or the outcome when a task header cannot be
    /// carried by NATS.
    fn headers(&self, task: &Task, attempt: u32) -> Result<HeaderMap, Outcome> {
        let mut headers = HeaderMap::new();
        let mut put = |name: &str, value: &str| -> Result<(), Outcome> {
            let name = name.parse::<HeaderName>();
            let value = value.parse::<HeaderValue>();
            match (name, value) {
                (Ok(name), Ok(value)) => {
                    headers.append(name, value);
                    Ok(())
                }
                _ => Err(classify_nats_failure(
                    NatsFailure::InvalidRequest,
                    "a task header is not a valid NATS header",
                )),
            }
        };
        let is_nats = |name: &str| {
            name.get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
        };
        for (name, value) in metadata::own_headers(task, is_nats) {
            if value.contains(['\r', '\n']) {
                return Err(classify_nats_failure(
                    NatsFailure::InvalidRequest,
                    "a task header value contains a line break",
                ));
            }
            put(name, value)?;
        }
        for (name, value) in metadata::headers(task, attempt) {
            put(name, &value)?;
        }
        put("Nats-Msg-Id", &task.id.to_string())?;
        Ok(headers)
    }

    fn header_bytes(headers: &HeaderMap) -> usize {
        HEADER_BLOCK_OVERHEAD
            + headers
                .iter()
                .map(|(name, values)| {
                    values
                        .iter()
                        .map(|v| AsRef::<str>::as_ref(name).len() + v.as_str().len() + 4)
                        .sum::<usize>()
                })
                .sum::<usize>()
    }

    async fn publish_all(&self, batch: &[Attempt<'_>]) -> Vec<Outcome> {
        let link = match self.link().await {
            Ok(link) => link,
            Err(outcome) => return vec![outcome; batch.len()],
        };
        let room = batch.len().clamp(1, ACKS_IN_FLIGHT_MAX) as u32;
        let Ok(_room) = self.window.acquire_many(room).await else {
            // Never closed; were it, the batch would be tried again.
            let outcome = classify_nats_failure(NatsFailure::Connection, "the sink is closed");
            return vec![outcome; batch.len()];
        };
        let max_payload = link.client.server_info().max_payload;
        // Written in due order; the acks are awaited together below.
        let mut pending = Vec::with_capacity(batch.len());
        for item in batch {
            let headers = match self.headers(item.task, item.attempt) {
                Ok(headers) => headers,
                Err(outcome) => {
                    pending.push(Err(outcome));
                    continue;
                }
            };
            let size = item.task.payload.len() + Self::header_bytes(&headers);
            if max_payload > 0 && size > max_payload {
                pending.push(Err(classify_nats_failure(
                    NatsFailure::TooLarge,
                    &format!("{size} bytes; the server's max_payload is {max_payload} bytes"),
                )));
                continue;
            }
            let message = jetstream::message::PublishMessage::build()
                .payload(Bytes::clone(&item.task.payload))
                .headers(headers);
            match link
                .jetstream
                .send_publish(self.config.subject.clone(), message)
                .await
            {
                Ok(ack) => pending.push(Ok((ack, item))),
                Err(error) => pending.push(Err(publish_outcome(&error))),
            }
        }
        join_all(pending.into_iter().map(|entry| async move {
            match entry {
                Err(outcome) => outcome,
                Ok((ack, item)) => match ack.await {
                    Ok(ack) => {
                        if ack.duplicate && item.attempt <= 1 {
                            // On a retry this is our own earlier publish; on a first attempt
                            // the stream holds another message with this task's id.
                            tracing::warn!(task = %item.task.id, stream = %ack.stream, "JetStream took the first publish of this task as a duplicate of a message it holds with the same Nats-Msg-Id (another producer using belfry's ids?); the task counts as delivered");
                        }
                        Outcome::Delivered
                    }
                    Err(error) => publish_outcome(&error),
                },
            }
        }))
        .await
    }

    async fn deliver_all(&self, batch: &[Attempt<'_>]) -> Vec<Outcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let outcomes = match self.gate.enter().await {
            Err(closed) => vec![closed; batch.len()],
            Ok(_open) => {
                // The publish and ack timeouts bound each step; this bounds the whole batch
                // (a connect that hangs, a full outgoing buffer).
                let limit = self.config.timeout * 2;
                match tokio::time::timeout(limit, self.publish_all(batch)).await {
                    Ok(outcomes) => outcomes,
                    Err(_) => vec![
                        classify_nats_failure(
                            NatsFailure::Timeout,
                            &format!("no PubAck within {} ms", limit.as_millis()),
                        );
                        batch.len()
                    ],
                }
            }
        };
        if let Some(last) = outcomes.last() {
            self.health.record(last);
        }
        for (item, outcome) in batch.iter().zip(&outcomes) {
            match outcome {
                Outcome::Delivered => {}
                Outcome::Retry { reason, .. } => {
                    tracing::info!(task = %item.task.id, attempt = item.attempt, target = %self.config.target, %reason, "nats publish failed; retryable (the queue's retry policy decides whether it is tried again)")
                }
                Outcome::Reject { reason } => {
                    tracing::warn!(task = %item.task.id, attempt = item.attempt, target = %self.config.target, %reason, "nats publish rejected")
                }
            }
        }
        outcomes
    }
}

/// The outcome for a JetStream publish error.
fn publish_outcome(error: &jetstream::context::PublishError) -> Outcome {
    let detail = error.to_string();
    let failure = match error.kind() {
        PublishErrorKind::StreamNotFound => NatsFailure::NoStream,
        PublishErrorKind::TimedOut => NatsFailure::Timeout,
        PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => NatsFailure::Connection,
        PublishErrorKind::WrongLastMessageId => NatsFailure::Api(10070),
        PublishErrorKind::WrongLastSequence => NatsFailure::Api(10071),
        _ => match std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
        {
            Some(api) => NatsFailure::Api(api.error_code().0),
            // An ack that is not JSON, a closed channel: the broker misbehaved or went away.
            None => NatsFailure::Connection,
        },
    };
    classify_nats_failure(failure, &detail)
}

impl Sink for NatsSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        _now_ms: UnixMs,
    ) -> SinkFuture<'a, Outcome> {
        Box::pin(async move {
            let batch = [Attempt { task, attempt }];
            crate::gate::only(self.deliver_all(&batch).await)
        })
    }

    fn batch_max(&self) -> usize {
        BATCH_MAX
    }

    fn deliver_batch<'a>(
        &'a self,
        batch: &'a [Attempt<'a>],
        _now_ms: UnixMs,
    ) -> SinkFuture<'a, Vec<Outcome>> {
        Box::pin(self.deliver_all(batch))
    }

    fn target(&self) -> &str {
        &self.config.target
    }

    fn open(&self) -> SinkFuture<'_, Result<(), crate::OpenError>> {
        Box::pin(async move {
            let result = tokio::time::timeout(self.config.timeout, self.link()).await;
            let outcome = match result {
                Ok(Ok(_)) => Outcome::Delivered,
                Ok(Err(outcome)) => outcome,
                Err(_) => classify_nats_failure(NatsFailure::Timeout, "connecting"),
            };
            let what = format!("nats connection {}", self.config.target);
            self.health.record_open(outcome, &what)
        })
    }

    fn health(&self) -> SinkHealth {
        self.health.get()
    }

    fn close(&self) -> SinkFuture<'_, ()> {
        Box::pin(async move {
            if self.gate.close().await {
                let link = self.link.forget();
                if let Some(link) = link {
                    // Everything published was acked (the gate waited); flushing only pushes
                    // out what the client still buffers before the connection is dropped.
                    let _ = tokio::time::timeout(self.config.timeout, link.client.flush()).await;
                }
            }
        })
    }
}
