//! The Redis Streams sink: append each due task to a stream with `XADD`.
//!
//! Entry fields: `id` (32 hex digits), `queue`, `attempt`, `due_at_ms`, `kind` (`json` or
//! `binary`), `payload` (the raw bytes), `shard` and `shard_count` for a sharded schedule's
//! firing, and one `header:<name>` field per task header (`belfry-*` names excepted).
//! Consumers read with `XREAD`/`XREADGROUP` and deduplicate on `id` (delivery is
//! at-least-once: a timeout after Redis appended the entry means it is appended again).
//!
//! A batch is one pipeline of `XADD`s in due order: one round trip, one outcome for all (the
//! same stream on one connection either takes them all or fails them all alike).
//!
//! The stream can be trimmed on every append (`MAXLEN ~ n`), so a stream nobody reads cannot
//! grow without bound. Which Redis errors are retried lives in [`crate::retry`]. The target is
//! guarded like a webhook's: the host is checked when configured and every address is checked
//! again each time the sink (re)connects.
//!
//! TLS: a `rediss://` URL or [`RedisStreamConfig::tls`] connects over TLS (rustls), checking
//! the server's certificate against the system's roots plus any [`RedisStreamConfig::tls_ca_file`].

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use belfry_core::limits::HEADERS_MAX;
use belfry_core::{PayloadKind, Task, UnixMs};
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use reqwest::Url;

use crate::gate::{Gate, HealthCell};
use crate::link::SharedLink;
use crate::metadata;
use crate::retry::{classify_redis_error, classify_transport, TransportFailure};
use crate::webhook::redact_url;
use crate::webhook::target::{host_ip, is_local_name, non_public_range, resolve_allowed};
use crate::{Attempt, Outcome, Sink, SinkError, SinkFuture, SinkHealth, TargetPolicy};

/// Placeholder in the stream key replaced by the task's queue name.
pub const QUEUE_PLACEHOLDER: &str = "{queue}";
/// Longest stream key (before the placeholder is replaced). Keys are stored once per stream
/// but sent with every append.
pub const STREAM_KEY_LEN_MAX: usize = 512;
/// Shortest and longest limit for one append, connecting included. Redis answers an `XADD`
/// in well under a millisecond; the upper bound keeps a stuck server from holding a
/// concurrency slot for long.
pub const TIMEOUT_MIN: Duration = Duration::from_millis(10);
pub const TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Limit when the config names none.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Longest Redis URL accepted, as for webhooks.
const REDIS_URL_LEN_MAX: usize = 2048;
/// Most appends in one pipeline. Enough to amortise the round trip (Redis answers a pipeline
/// of 256 small `XADD`s in about a millisecond); small enough that one batch's reply stays
/// small and a timeout fails few tasks at once.
pub const BATCH_MAX: usize = 256;

/// Where and how to append one queue's tasks.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisStreamConfig {
    /// `redis://[user:password@]host[:port][/db]` (`rediss://` for TLS), or
    /// `unix:///path/to/redis.sock`.
    pub url: String,
    /// The stream key; `{queue}` is replaced by the queue name.
    pub stream: String,
    /// Trim the stream to about this many entries on each append (`MAXLEN ~`); `None` keeps
    /// every entry until consumers delete them.
    pub max_len: Option<u64>,
    /// Limit for one append, connecting included.
    pub timeout: Duration,
    /// ACL user and password, applied over any in the URL (from the connection's config).
    pub username: Option<String>,
    pub password: Option<String>,
    /// Connect over TLS even when the URL says `redis://`.
    pub tls: bool,
    /// A PEM file of CA certificates trusted in addition to the system's roots (TLS only).
    pub tls_ca_file: Option<PathBuf>,
    /// The name reported by [`Sink::target`] (the connection's name); the redacted URL when
    /// `None`.
    pub target: Option<String>,
}

impl RedisStreamConfig {
    pub fn new(url: impl Into<String>, stream: impl Into<String>) -> Self {
        RedisStreamConfig {
            url: url.into(),
            stream: stream.into(),
            max_len: None,
            timeout: TIMEOUT_DEFAULT,
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            target: None,
        }
    }
}

/// Never prints the password in the URL.
impl fmt::Debug for RedisStreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamConfig")
            .field("url", &redact(&self.url))
            .field("stream", &self.stream)
            .field("max_len", &self.max_len)
            .field("timeout", &self.timeout)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redact_url(&parsed),
        Err(_) => "<invalid url>".to_owned(),
    }
}

/// Appends tasks to one Redis stream.
pub struct RedisStreamSink {
    /// Holds the password, if any: never printed.
    info: ConnectionInfo,
    /// Over TLS with a CA file: the PEM of every root to trust (the system's and the file's).
    tls_roots: Option<Vec<u8>>,
    url_for_logs: String,
    target: String,
    policy: TargetPolicy,
    gate: Gate,
    health: HealthCell,
    stream: String,
    stream_has_queue: bool,
    max_len: Option<u64>,
    timeout: Duration,
    /// One multiplexed connection (it pipelines concurrent appends), made on first use and
    /// replaced after a connection-level error.
    connection: SharedLink<MultiplexedConnection>,
}

impl fmt::Debug for RedisStreamSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamSink")
            .field("url", &self.url_for_logs)
            .field("stream", &self.stream)
            .field("max_len", &self.max_len)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a connection attempt failed, already classified.
struct ConnectFailure(Outcome);

impl RedisStreamSink {
    /// Checks the configuration; does not connect (the first delivery does).
    pub fn new(config: RedisStreamConfig, policy: TargetPolicy) -> Result<Self, SinkError> {
        if config.url.len() > REDIS_URL_LEN_MAX {
            return Err(SinkError::UrlTooLong {
                len: config.url.len(),
                max: REDIS_URL_LEN_MAX,
            });
        }
        if config.stream.is_empty() || config.stream.len() > STREAM_KEY_LEN_MAX {
            return Err(SinkError::InvalidStreamKey {
                len: config.stream.len(),
                max: STREAM_KEY_LEN_MAX,
            });
        }
        if config.max_len == Some(0) {
            // `XADD MAXLEN ~ 0` removes the entry it just appended: every task would count
            // delivered while no consumer ever sees one.
            return Err(SinkError::InvalidDelivery {
                field: "maxlen",
                reason: "at least 1; leave it out for no trimming".to_owned(),
            });
        }
        if !(TIMEOUT_MIN..=TIMEOUT_MAX).contains(&config.timeout) {
            return Err(SinkError::InvalidRedisTimeout {
                got: config.timeout,
                min: TIMEOUT_MIN,
                max: TIMEOUT_MAX,
            });
        }
        let mut info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(|error| SinkError::InvalidRedisUrl {
                reason: error.to_string(),
            })?;
        if config.username.is_some() {
            info.redis.username = config.username.clone();
        }
        if config.password.is_some() {
            info.redis.password = config.password.clone();
        }
        let tls_roots = tls_setup(&mut info, &config)?;
        let url_for_logs = redact(&config.url);
        check_address(&info.addr, &policy)?;
        Ok(RedisStreamSink {
            info,
            tls_roots,
            target: config.target.unwrap_or_else(|| url_for_logs.clone()),
            url_for_logs,
            policy,
            gate: Gate::default(),
            health: HealthCell::default(),
            stream_has_queue: config.stream.contains(QUEUE_PLACEHOLDER),
            stream: config.stream,
            max_len: config.max_len,
            timeout: config.timeout,
            connection: SharedLink::default(),
        })
    }

    fn stream_key(&self, task: &Task) -> String {
        if self.stream_has_queue {
            self.stream.replace(QUEUE_PLACEHOLDER, task.queue.as_str())
        } else {
            self.stream.clone()
        }
    }

    /// The cached connection, or a new one.
    async fn connection(&self) -> Result<MultiplexedConnection, ConnectFailure> {
        self.connection.get_or_connect(|| self.connect()).await
    }

    async fn connect(&self) -> Result<MultiplexedConnection, ConnectFailure> {
        let mut info = self.info.clone();
        // Resolve here and connect to a checked address, so a name that now resolves to a
        // forbidden address (DNS rebinding) is refused at connect time too. Over TLS the name
        // stays (the certificate is checked against it); the addresses are still checked.
        if let ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } =
            &info.addr
        {
            if !self.policy.allow_private && host_ip(host).is_none() {
                let addrs = resolve_allowed(host, &self.policy)
                    .await
                    .map_err(|error| ConnectFailure(connect_error_outcome(&error)))?;
                if let (Some(addr), ConnectionAddr::Tcp(..)) = (addrs.first(), &info.addr) {
                    info.addr = ConnectionAddr::Tcp(addr.ip().to_string(), *port);
                }
            }
        }
        let client = match &self.tls_roots {
            Some(roots) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(roots.clone()),
                },
            ),
            None => redis::Client::open(info),
        };
        let client = client.map_err(|error| {
            ConnectFailure(classify_transport(
                TransportFailure::InvalidRequest,
                &error.to_string(),
            ))
        })?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|error| ConnectFailure(redis_outcome(&error)))
    }

    /// One `XADD` for `task`.
    fn command(&self, task: &Task, attempt: u32) -> redis::Cmd {
        let mut command = redis::cmd("XADD");
        command.arg(self.stream_key(task));
        if let Some(max_len) = self.max_len {
            // "~": trim whole radix-tree nodes only, which keeps the append O(1).
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command
            .arg("*")
            .arg("id")
            .arg(task.id.to_string())
            .arg("queue")
            .arg(task.queue.as_str())
            .arg("attempt")
            .arg(attempt)
            .arg("due_at_ms")
            .arg(task.due_at_ms)
            .arg("kind")
            .arg(match task.payload_kind {
                PayloadKind::Json => "json",
                PayloadKind::Binary => "binary",
            })
            .arg("payload")
            .arg(&task.payload[..]);
        if let Some((schedule, fire_ms)) = metadata::firing(task) {
            command
                .arg("schedule")
                .arg(schedule)
                .arg("fire_time")
                .arg(fire_ms);
        }
        if let Some((index, count)) = metadata::shard(task) {
            command
                .arg("shard")
                .arg(index)
                .arg("shard_count")
                .arg(count);
        }
        for (name, value) in metadata::own_headers(task, |_| false).take(HEADERS_MAX) {
            command.arg(format!("header:{name}")).arg(value);
        }
        command
    }

    /// Appends every task of `batch` in one pipeline; one outcome for the whole batch.
    ///
    /// A connection that died while idle (Redis restarted, failed over, or closed it) is only
    /// found dead when used: on an I/O error the pipeline goes out once more on a new
    /// connection, within this attempt, so a restart costs no task an attempt. Should the
    /// first send have reached Redis before the connection broke, its entries are appended
    /// twice; delivery is at-least-once and consumers deduplicate on `id`.
    async fn append(&self, batch: &[Attempt<'_>]) -> Outcome {
        let mut pipeline = redis::pipe();
        for item in batch {
            pipeline.add_command(self.command(item.task, item.attempt));
        }
        let result = match self.send(&pipeline, batch.len()).await {
            Err(error) if error.is_io_error() && !error.is_timeout() => {
                tracing::debug!(target = %self.target, %error, "the redis connection broke; sending the batch again on a new one");
                self.send(&pipeline, batch.len()).await
            }
            other => other,
        };
        result.unwrap_or_else(|error| redis_outcome(&error))
    }

    /// Sends the pipeline of `count` appends over the shared connection (made if there is
    /// none); the outcome, or the error of a connection that failed while sending.
    async fn send(
        &self,
        pipeline: &redis::Pipeline,
        count: usize,
    ) -> Result<Outcome, redis::RedisError> {
        let mut connection = match self.connection().await {
            Ok(connection) => connection,
            Err(ConnectFailure(outcome)) => return Ok(outcome),
        };
        let replies = pipeline
            .query_async::<Vec<redis::Value>>(&mut connection)
            .await
            .inspect_err(|error| {
                if error.is_unrecoverable_error() || error.is_io_error() {
                    // The connection is broken; the next send makes a new one.
                    self.connection.forget();
                }
            })?;
        Ok(if replies.len() == count {
            Outcome::Delivered
        } else {
            classify_transport(
                TransportFailure::Connection,
                &format!(
                    "redis answered {} replies to {count} appends",
                    replies.len()
                ),
            )
        })
    }

    async fn deliver_all(&self, batch: &[Attempt<'_>]) -> Vec<Outcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let outcome = match self.gate.enter().await {
            Err(closed) => closed,
            Ok(_open) => match tokio::time::timeout(self.timeout, self.append(batch)).await {
                Ok(outcome) => outcome,
                Err(_) => classify_transport(
                    TransportFailure::Timeout,
                    &format!("no answer within {} ms", self.timeout.as_millis()),
                ),
            },
        };
        self.health.record(&outcome);
        match &outcome {
            Outcome::Delivered => {
                tracing::debug!(tasks = batch.len(), target = %self.target, "appended to redis stream")
            }
            Outcome::Retry { reason, .. } => {
                tracing::info!(tasks = batch.len(), target = %self.target, %reason, "redis stream append failed; retryable (the queue's retry policy decides whether it is tried again)")
            }
            Outcome::Reject { reason } => {
                tracing::warn!(tasks = batch.len(), target = %self.target, %reason, "redis stream append rejected")
            }
        }
        vec![outcome; batch.len()]
    }
}

impl Sink for RedisStreamSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        _now_ms: UnixMs,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
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
        &self.target
    }

    fn open(&self) -> SinkFuture<'_, Result<(), crate::OpenError>> {
        Box::pin(async move {
            let outcome = match tokio::time::timeout(self.timeout, self.connection()).await {
                Ok(Ok(_)) => Outcome::Delivered,
                Ok(Err(ConnectFailure(outcome))) => outcome,
                Err(_) => classify_transport(TransportFailure::Timeout, "connecting"),
            };
            let what = format!("redis connection {} ({})", self.target, self.url_for_logs);
            self.health.record_open(outcome, &what)
        })
    }

    fn health(&self) -> SinkHealth {
        self.health.get()
    }

    fn close(&self) -> SinkFuture<'_, ()> {
        Box::pin(async move {
            if self.gate.close().await {
                self.connection.forget();
            }
        })
    }
}

/// Turns `info` into a TLS address when `config.tls` asks for it, and reads the CA file: the
/// PEM of the roots to trust when there is one.
fn tls_setup(
    info: &mut ConnectionInfo,
    config: &RedisStreamConfig,
) -> Result<Option<Vec<u8>>, SinkError> {
    let invalid = |reason: &str| SinkError::InvalidTls {
        reason: reason.to_owned(),
    };
    if config.tls {
        info.addr = match &info.addr {
            ConnectionAddr::Tcp(host, port) => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            ConnectionAddr::Unix(_) => {
                return Err(invalid(
                    "TLS does not apply to a Unix socket; use a rediss:// URL",
                ))
            }
            tls @ ConnectionAddr::TcpTls { .. } => tls.clone(),
        };
    }
    match &info.addr {
        ConnectionAddr::TcpTls { insecure: true, .. } => Err(invalid(
            "the URL's #insecure turns off the server certificate's host name check; belfry always checks it (trust a private CA with tls.ca_file instead)",
        )),
        ConnectionAddr::TcpTls { .. } => match &config.tls_ca_file {
            Some(path) => {
                let certs = crate::trust::read_ca_file(path).map_err(|reason| invalid(&reason))?;
                Ok(Some(crate::trust::system_roots_and(&certs)))
            }
            None => Ok(None),
        },
        _ if config.tls_ca_file.is_some() => Err(invalid(
            "a CA file needs TLS: use a rediss:// URL or set tls.enabled = true",
        )),
        _ => Ok(None),
    }
}

/// Static check of a Redis address under `policy`: IP literals and `localhost` names are
/// judged now; other names when connecting. A Unix socket is local by definition.
fn check_address(addr: &ConnectionAddr, policy: &TargetPolicy) -> Result<(), SinkError> {
    if policy.allow_private {
        return Ok(());
    }
    let host = match addr {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host,
        ConnectionAddr::Unix(_) => {
            return Err(SinkError::ForbiddenTarget {
                host: "a Unix socket".to_owned(),
                range: "a local socket",
            })
        }
    };
    let refusal = match host_ip(host) {
        Some(ip) => non_public_range(ip),
        None if is_local_name(host) => Some("a name that always resolves to loopback (localhost)"),
        None => None,
    };
    match refusal {
        Some(range) => Err(SinkError::ForbiddenTarget {
            host: host.clone(),
            range,
        }),
        None => Ok(()),
    }
}

fn connect_error_outcome(error: &SinkError) -> Outcome {
    match error {
        SinkError::ForbiddenAddress { .. } | SinkError::ForbiddenTarget { .. } => {
            classify_transport(TransportFailure::ForbiddenTarget, &error.to_string())
        }
        _ => classify_transport(TransportFailure::Connection, &error.to_string()),
    }
}

/// The outcome for any error from the Redis client.
fn redis_outcome(error: &redis::RedisError) -> Outcome {
    let detail = error.to_string();
    if error.is_timeout() {
        classify_transport(TransportFailure::Timeout, &detail)
    } else if error.is_io_error() {
        classify_transport(TransportFailure::Connection, &detail)
    } else if error.kind() == redis::ErrorKind::InvalidClientConfig {
        classify_transport(TransportFailure::InvalidRequest, &detail)
    } else {
        let authentication = error.kind() == redis::ErrorKind::AuthenticationFailed;
        classify_redis_error(error.code(), authentication, &detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks() {
        let check = |config: RedisStreamConfig, policy: TargetPolicy, needle: Option<&str>| {
            let got = RedisStreamSink::new(config.clone(), policy);
            match (got, needle) {
                (Ok(_), None) => {}
                (Err(error), Some(needle)) => {
                    assert!(error.to_string().contains(needle), "{config:?}: {error}")
                }
                (got, _) => panic!("{config:?}: got {got:?}, expected {needle:?}"),
            }
        };
        let public = TargetPolicy::default();
        let private = TargetPolicy::ALLOW_PRIVATE;
        let base = RedisStreamConfig::new("redis://redis.example.com:6379/0", "belfry:{queue}");
        check(base.clone(), public, None);
        check(
            RedisStreamConfig::new("redis://127.0.0.1:6379", "s"),
            public,
            Some("loopback"),
        );
        check(
            RedisStreamConfig::new("redis://127.0.0.1:6379", "s"),
            private,
            None,
        );
        check(
            RedisStreamConfig::new("redis://localhost", "s"),
            public,
            Some("localhost"),
        );
        check(
            RedisStreamConfig::new("redis://10.1.2.3", "s"),
            public,
            Some("private"),
        );
        check(
            RedisStreamConfig::new("unix:///run/redis.sock", "s"),
            public,
            Some("local socket"),
        );
        check(
            RedisStreamConfig::new("http://example.com", "s"),
            public,
            Some("redis url is not usable"),
        );
        check(
            RedisStreamConfig::new("redis://example.com", ""),
            public,
            Some("stream key must be 1 to 512"),
        );
        check(
            RedisStreamConfig::new("rediss://redis.example.com:6380/0", "s"),
            public,
            None,
        );
        check(
            RedisStreamConfig::new("rediss://redis.example.com/#insecure", "s"),
            public,
            Some("always checks it"),
        );
        check(
            RedisStreamConfig {
                tls: true,
                ..RedisStreamConfig::new("unix:///run/redis.sock", "s")
            },
            private,
            Some("Unix socket"),
        );
        check(
            RedisStreamConfig {
                tls_ca_file: Some("/nonexistent/ca.pem".into()),
                ..base.clone()
            },
            public,
            Some("a CA file needs TLS"),
        );
        check(
            RedisStreamConfig {
                tls: true,
                tls_ca_file: Some("/nonexistent/ca.pem".into()),
                ..base.clone()
            },
            public,
            Some("cannot read /nonexistent/ca.pem"),
        );
        check(
            RedisStreamConfig {
                timeout: Duration::ZERO,
                ..base.clone()
            },
            public,
            Some("timeout must be between"),
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let config = RedisStreamConfig::new("redis://user:hunter2@redis.example.com/0", "s");
        let sink = RedisStreamSink::new(config.clone(), TargetPolicy::default()).expect("valid");
        for text in [format!("{config:?}"), format!("{sink:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(text.contains("redis.example.com"), "{text}");
        }
    }
}
