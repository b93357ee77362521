//! Sinks from queue configuration: the [`SinkSpec`] a queue's `delivery` names, and the
//! [`SinkFactory`] the server is built with, which turns a spec into a running [`Sink`].
//!
//! The spec is the delivery configuration's own shape (serde, tagged by `type`), so the API,
//! the stored queue record and the sink agree on one definition. Tests inject their own
//! factory (a scripted sink for every spec); the binary uses [`StandardSinks`].
//!
//! Adding a sink: a folder with its spec struct and its `Sink`, one variant here, one arm in
//! [`StandardSinks::build`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::QueueName;
use serde::{Deserialize, Serialize};

use crate::connections::{ConnectionKind, ConnectionSpec, Connections};
use crate::webhook::{self, WebhookConfig, WebhookSink};
use crate::{Sink, SinkError, TargetPolicy};

/// Where a push queue's due tasks go: the queue's `delivery` object minus `"type": "pull"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkSpec {
    /// POST each task to a URL.
    Webhook(WebhookSpec),
    /// `XADD` each task to a Redis stream of a declared `redis` connection.
    RedisStream(RedisStreamSpec),
    /// Publish each task to a NATS JetStream subject of a declared `nats` connection.
    Nats(NatsSpec),
    /// Produce each task to a Kafka topic of a declared `kafka` connection.
    Kafka(KafkaSpec),
}

impl SinkSpec {
    /// The spec's `type`, as in the API and in metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkSpec::Webhook(_) => "webhook",
            SinkSpec::RedisStream(_) => "redis_stream",
            SinkSpec::Nats(_) => "nats",
            SinkSpec::Kafka(_) => "kafka",
        }
    }

    /// The spec as it may be shown (API answers, console, logs): secrets removed and URLs
    /// without credentials or query strings.
    pub fn redacted(&self) -> SinkSpec {
        match self {
            SinkSpec::Webhook(spec) => SinkSpec::Webhook(WebhookSpec {
                url: webhook::redact_url_text(&spec.url),
                secret: None,
                previous_secret: None,
                headers: BTreeMap::new(),
                timeout_ms: spec.timeout_ms,
            }),
            // Stream specs name a connection; its credentials live in the server config.
            other => other.clone(),
        }
    }

    /// Whether the spec holds a secret that [`SinkSpec::redacted`] leaves out; `None` for a
    /// sink that takes none (a stream spec names a connection, whose credentials live in the
    /// server's config), so that nothing shows it as missing.
    pub fn secret_set(&self) -> Option<bool> {
        match self {
            SinkSpec::Webhook(spec) => Some(spec.secret.is_some()),
            SinkSpec::RedisStream(_) | SinkSpec::Nats(_) | SinkSpec::Kafka(_) => None,
        }
    }

    /// Whether a webhook's secret is being rotated: it signs with a previous secret too.
    pub fn rotating_secret(&self) -> bool {
        matches!(self, SinkSpec::Webhook(spec) if spec.previous_secret.is_some())
    }

    /// The names of a webhook's fixed headers (`delivery.headers`), whose values
    /// [`SinkSpec::redacted`] leaves out; `None` when it has none, or for a stream spec.
    pub fn header_names(&self) -> Option<Vec<String>> {
        match self {
            SinkSpec::Webhook(spec) if !spec.headers.is_empty() => {
                Some(spec.headers.keys().cloned().collect())
            }
            _ => None,
        }
    }

    /// How long one delivery may take at most (the dispatcher's lease covers it).
    pub fn timeout(&self) -> Duration {
        match self {
            SinkSpec::Webhook(spec) => Duration::from_millis(spec.timeout_ms),
            SinkSpec::RedisStream(spec) => Duration::from_millis(spec.timeout_ms),
            // The NATS sink waits for the publish, then for the PubAck, each up to the limit.
            SinkSpec::Nats(spec) => Duration::from_millis(spec.timeout_ms).saturating_mul(2),
            SinkSpec::Kafka(spec) => Duration::from_millis(spec.timeout_ms),
        }
    }

    /// The connection a stream spec names (`None` for a webhook).
    pub fn connection(&self) -> Option<&str> {
        match self {
            SinkSpec::Webhook(_) => None,
            SinkSpec::RedisStream(spec) => Some(&spec.connection),
            SinkSpec::Nats(spec) => Some(&spec.connection),
            SinkSpec::Kafka(spec) => Some(&spec.connection),
        }
    }
}

/// `{"type": "redis_stream", "connection": "main", "stream": "belfry:{queue}", "maxlen": 100000}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStreamSpec {
    pub connection: String,
    /// The stream key; `{queue}` is replaced by the queue name.
    pub stream: String,
    /// Trim to about this many entries on every append (`MAXLEN ~`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxlen: Option<u64>,
    #[serde(default = "redis_timeout_ms_default")]
    pub timeout_ms: u64,
}

/// `{"type": "nats", "connection": "events", "subject": "tasks.orders"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSpec {
    pub connection: String,
    pub subject: String,
    #[serde(default = "nats_timeout_ms_default")]
    pub timeout_ms: u64,
}

/// `{"type": "kafka", "connection": "main", "topic": "tasks", "key": "task_id"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSpec {
    pub connection: String,
    pub topic: String,
    /// `"task_id"`, `"header:NAME"` or absent/null (no key).
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default = "kafka_timeout_ms_default")]
    pub timeout_ms: u64,
}

/// Default limits of the stream sinks, in the spec's unit. Written out (not taken from the
/// sink modules) so a build without a sink's feature still reads and shows its specs.
const REDIS_TIMEOUT_MS_DEFAULT: u64 = 5_000;
const NATS_TIMEOUT_MS_DEFAULT: u64 = 5_000;
const KAFKA_TIMEOUT_MS_DEFAULT: u64 = 10_000;

fn redis_timeout_ms_default() -> u64 {
    REDIS_TIMEOUT_MS_DEFAULT
}
fn nats_timeout_ms_default() -> u64 {
    NATS_TIMEOUT_MS_DEFAULT
}
fn kafka_timeout_ms_default() -> u64 {
    KAFKA_TIMEOUT_MS_DEFAULT
}

impl RedisStreamSpec {
    pub fn new(connection: impl Into<String>, stream: impl Into<String>) -> Self {
        RedisStreamSpec {
            connection: connection.into(),
            stream: stream.into(),
            maxlen: None,
            timeout_ms: REDIS_TIMEOUT_MS_DEFAULT,
        }
    }
}

impl NatsSpec {
    pub fn new(connection: impl Into<String>, subject: impl Into<String>) -> Self {
        NatsSpec {
            connection: connection.into(),
            subject: subject.into(),
            timeout_ms: NATS_TIMEOUT_MS_DEFAULT,
        }
    }
}

impl KafkaSpec {
    pub fn new(connection: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSpec {
            connection: connection.into(),
            topic: topic.into(),
            key: None,
            timeout_ms: KAFKA_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// `{"type": "webhook", "url": "...", "secret": "...", "headers": {"Authorization": "..."},
/// "timeout_ms": 10000}`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The secret being rotated out: signed with too (a second `v2` entry) while set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_secret: Option<String>,
    /// Fixed headers on every request, replacing a task header of the same name; sent to a
    /// task's own target only when it has the queue URL's origin. Write-only, like `secret`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "webhook_timeout_ms_default")]
    pub timeout_ms: u64,
}

fn webhook_timeout_ms_default() -> u64 {
    webhook::TIMEOUT_DEFAULT.as_millis() as u64
}

impl WebhookSpec {
    pub fn new(url: impl Into<String>) -> Self {
        WebhookSpec {
            url: url.into(),
            secret: None,
            previous_secret: None,
            headers: BTreeMap::new(),
            timeout_ms: webhook_timeout_ms_default(),
        }
    }
}

/// Never prints the secrets, a header value (names only) or the URL's credentials.
impl std::fmt::Debug for WebhookSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSpec")
            .field("url", &webhook::redact_url_text(&self.url))
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field(
                "previous_secret",
                &self.previous_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// Builds sinks from specs. `build` validates without connecting, so the server calls it when
/// a queue is created (a bad spec is a 400) and again whenever the queue's dispatch starts.
pub trait SinkFactory: Send + Sync + 'static {
    fn build(&self, queue: &QueueName, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError>;
}

/// The production factory: webhooks through one shared HTTP client (one connection pool per
/// target host), guarded by the server's target policy; stream sinks through the broker
/// connections the operator declared.
pub struct StandardSinks {
    policy: TargetPolicy,
    webhook_client: reqwest::Client,
    connections: Connections,
}

impl StandardSinks {
    /// `idle_per_target` is how many idle connections the HTTP client keeps per host: the
    /// dispatcher's per-target in-flight cap, so connections are reused rather than churned.
    /// `connections` are the server config's `[connections.NAME]` entries
    /// ([`Connections::empty`] for webhooks only).
    pub fn new(
        policy: TargetPolicy,
        idle_per_target: usize,
        connections: Connections,
    ) -> Result<Self, SinkError> {
        Self::with_webhook_ca(policy, idle_per_target, connections, None)
    }

    /// [`StandardSinks::new`], with webhooks trusting the CA certificates in `ca_file` (the
    /// server config's `[webhooks] ca_file`) next to the built-in and the system's roots. A
    /// missing or malformed file is an error naming the key.
    pub fn with_webhook_ca(
        policy: TargetPolicy,
        idle_per_target: usize,
        connections: Connections,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, SinkError> {
        let extra_roots = match ca_file {
            None => Vec::new(),
            Some(path) => {
                crate::trust::read_ca_file(path).map_err(|reason| SinkError::InvalidTls {
                    reason: format!("webhooks.ca_file: {reason}"),
                })?
            }
        };
        let webhook_client =
            webhook::target::try_client_trusting(&policy, idle_per_target, &extra_roots)?;
        Ok(StandardSinks {
            policy,
            webhook_client,
            connections,
        })
    }

    /// The declared connections.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// The connection `name`, which must be of `kind`.
    fn connection(&self, name: &str, kind: ConnectionKind) -> Result<&ConnectionSpec, SinkError> {
        let invalid = |reason: String| SinkError::InvalidDelivery {
            field: "connection",
            reason,
        };
        if name.is_empty() {
            return Err(invalid(
                "required: the name of a [connections.NAME] entry of the server config".to_owned(),
            ));
        }
        let shown: String = name
            .chars()
            .take(crate::connections::CONNECTION_NAME_LEN_MAX)
            .collect();
        let spec = self.connections.get(name).ok_or_else(|| {
            invalid(format!(
                "no connection {shown:?} is declared in the server config ([connections.{shown}])"
            ))
        })?;
        if spec.kind != kind {
            return Err(invalid(format!(
                "connection {shown:?} is a {} connection; this delivery needs a {kind} one",
                spec.kind
            )));
        }
        Ok(spec)
    }
}

/// A stream spec's `timeout_ms` as a duration (range checks are the sink's).
fn spec_timeout(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms)
}

/// Names a feature this build left out.
#[allow(dead_code)]
fn not_built(sink: &str, feature: &str) -> SinkError {
    SinkError::InvalidDelivery {
        field: "type",
        reason: format!("this belfry was built without the {sink} sink (cargo feature {feature})"),
    }
}

impl SinkFactory for StandardSinks {
    fn build(&self, _queue: &QueueName, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        match spec {
            SinkSpec::Webhook(spec) => {
                let config = WebhookConfig {
                    url: spec.url.clone(),
                    secret: spec.secret.clone(),
                    previous_secret: spec.previous_secret.clone(),
                    headers: spec.headers.clone(),
                    timeout: Duration::from_millis(spec.timeout_ms),
                };
                let sink = WebhookSink::new(config, self.policy, self.webhook_client.clone())?;
                Ok(Arc::new(sink))
            }
            SinkSpec::RedisStream(spec) => {
                let connection = self.connection(&spec.connection, ConnectionKind::Redis)?;
                self.build_redis(spec, connection)
            }
            SinkSpec::Nats(spec) => {
                let connection = self.connection(&spec.connection, ConnectionKind::Nats)?;
                self.build_nats(spec, connection)
            }
            SinkSpec::Kafka(spec) => {
                let connection = self.connection(&spec.connection, ConnectionKind::Kafka)?;
                self.build_kafka(spec, connection)
            }
        }
    }
}

impl StandardSinks {
    #[cfg(feature = "redis-streams")]
    fn build_redis(
        &self,
        spec: &RedisStreamSpec,
        connection: &ConnectionSpec,
    ) -> Result<Arc<dyn Sink>, SinkError> {
        use crate::redis_stream::{RedisStreamConfig, RedisStreamSink};
        let config = RedisStreamConfig {
            url: connection.url.clone().unwrap_or_default(),
            stream: spec.stream.clone(),
            max_len: spec.maxlen,
            timeout: spec_timeout(spec.timeout_ms),
            username: connection.username.clone(),
            password: connection.password.clone(),
            tls: connection.tls.enabled,
            tls_ca_file: connection.tls.ca_file.clone(),
            target: Some(spec.connection.clone()),
        };
        // The operator declared this broker in the server config, so the target policy (which
        // guards URLs that arrive through the API) does not apply.
        let sink =
            RedisStreamSink::new(config, TargetPolicy::ALLOW_PRIVATE).map_err(
                |error| match error {
                    SinkError::InvalidStreamKey { .. } => SinkError::InvalidDelivery {
                        field: "stream",
                        reason: error.to_string(),
                    },
                    SinkError::InvalidRedisTimeout { .. } => SinkError::InvalidDelivery {
                        field: "timeout_ms",
                        reason: error.to_string(),
                    },
                    SinkError::InvalidDelivery { .. } => error,
                    other => SinkError::InvalidDelivery {
                        field: "connection",
                        reason: other.to_string(),
                    },
                },
            )?;
        Ok(Arc::new(sink))
    }

    #[cfg(not(feature = "redis-streams"))]
    fn build_redis(
        &self,
        _: &RedisStreamSpec,
        _: &ConnectionSpec,
    ) -> Result<Arc<dyn Sink>, SinkError> {
        Err(not_built("redis_stream", "redis-streams"))
    }

    #[cfg(feature = "nats")]
    fn build_nats(
        &self,
        spec: &NatsSpec,
        connection: &ConnectionSpec,
    ) -> Result<Arc<dyn Sink>, SinkError> {
        use crate::nats::{NatsConfig, NatsSink};
        let config = NatsConfig {
            servers: connection.url.clone().unwrap_or_default(),
            username: connection.username.clone(),
            password: connection.password.clone(),
            token: connection.token.clone(),
            tls: connection.tls.enabled,
            tls_ca_file: connection.tls.ca_file.clone(),
            subject: spec.subject.clone(),
            timeout: spec_timeout(spec.timeout_ms),
            target: spec.connection.clone(),
        };
        Ok(Arc::new(NatsSink::new(config)?))
    }

    #[cfg(not(feature = "nats"))]
    fn build_nats(&self, _: &NatsSpec, _: &ConnectionSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Err(not_built("nats", "nats"))
    }

    #[cfg(feature = "kafka")]
    fn build_kafka(
        &self,
        spec: &KafkaSpec,
        connection: &ConnectionSpec,
    ) -> Result<Arc<dyn Sink>, SinkError> {
        use crate::kafka::{KafkaConfig, KafkaKey, KafkaSink};
        let key =
            KafkaKey::parse(spec.key.as_deref()).map_err(|reason| SinkError::InvalidDelivery {
                field: "key",
                reason,
            })?;
        // Validated with the connection at start; read again here, so a CA file changed since
        // is an error for this queue, never a panic.
        let tls = if connection.tls.enabled {
            let config = crate::kafka::tls::client_config(connection.tls.ca_file.as_deref())
                .map_err(|reason| SinkError::InvalidDelivery {
                    field: "connection",
                    reason: format!("tls.ca_file: {reason}"),
                })?;
            Some(config)
        } else {
            None
        };
        let config = KafkaConfig {
            brokers: connection.brokers.clone(),
            username: connection.username.clone(),
            password: connection.password.clone(),
            sasl_mechanism: connection.kafka_sasl_mechanism(),
            tls,
            topic: spec.topic.clone(),
            key,
            timeout: spec_timeout(spec.timeout_ms),
            metadata_max_age: crate::kafka::METADATA_MAX_AGE,
            target: spec.connection.clone(),
        };
        Ok(Arc::new(KafkaSink::new(config)?))
    }

    #[cfg(not(feature = "kafka"))]
    fn build_kafka(&self, _: &KafkaSpec, _: &ConnectionSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Err(not_built("kafka", "kafka"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_spec_reads_the_delivery_object_and_defaults_the_timeout() {
        let spec: SinkSpec =
            serde_json_lite(r#"{"type":"webhook","url":"https://example.com/h"}"#).unwrap();
        assert_eq!(
            spec,
            SinkSpec::Webhook(WebhookSpec::new("https://example.com/h"))
        );
        assert_eq!(spec.timeout(), webhook::TIMEOUT_DEFAULT);
        assert!(
            serde_json_lite(r#"{"type":"webhook","url":"https://x","colour":1}"#).is_err(),
            "unknown fields are refused"
        );
        let with_headers =
            r#"{"type":"webhook","url":"https://x","headers":{"Authorization":"Bearer a"}}"#;
        let SinkSpec::Webhook(spec) = serde_json_lite(with_headers).unwrap() else {
            panic!("a webhook spec");
        };
        assert_eq!(spec.headers["Authorization"], "Bearer a");
        assert!(serde_json_lite(r#"{"type":"carrier_pigeon"}"#).is_err());
    }

    #[test]
    fn redacted_drops_secrets_and_url_credentials() {
        let spec = SinkSpec::Webhook(WebhookSpec {
            url: "https://user:pw@example.com/h?token=t".into(),
            secret: Some("s3cret".into()),
            previous_secret: None,
            headers: [
                ("X-Env".to_owned(), "prod".to_owned()),
                ("Authorization".to_owned(), "Bearer hdr-value".to_owned()),
            ]
            .into(),
            timeout_ms: 500,
        });
        assert_eq!(spec.secret_set(), Some(true));
        assert_eq!(
            spec.header_names(),
            Some(vec!["Authorization".to_owned(), "X-Env".to_owned()])
        );
        let shown = spec.redacted();
        let SinkSpec::Webhook(shown) = shown else {
            panic!("redacted changed the type");
        };
        assert_eq!(shown.secret, None);
        assert!(shown.headers.is_empty(), "{:?}", shown.headers.keys());
        assert!(!shown.url.contains("pw") && !shown.url.contains("token=t"));
        let debug = format!("{spec:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("hdr-value"),
            "{debug}"
        );
        assert!(debug.contains("Authorization"), "{debug}");
        assert_eq!(
            SinkSpec::Webhook(WebhookSpec::new("https://x")).header_names(),
            None
        );
    }

    fn factory() -> StandardSinks {
        let connections = Connections::empty()
            .with(
                "main",
                ConnectionSpec::url(ConnectionKind::Redis, "redis://127.0.0.1:6379"),
            )
            .with(
                "events",
                ConnectionSpec::url(ConnectionKind::Nats, "nats://127.0.0.1:4222"),
            )
            .with("log", ConnectionSpec::kafka(["127.0.0.1:9092"]));
        StandardSinks::new(TargetPolicy::default(), 4, connections).expect("factory")
    }

    #[test]
    fn stream_specs_read_the_delivery_object() {
        let check = |text: &str, expected: SinkSpec| {
            assert_eq!(serde_json_lite(text).expect(text), expected, "{text}");
        };
        check(
            r#"{"type":"redis_stream","connection":"main","stream":"s","maxlen":10}"#,
            SinkSpec::RedisStream(RedisStreamSpec {
                maxlen: Some(10),
                ..RedisStreamSpec::new("main", "s")
            }),
        );
        check(
            r#"{"type":"nats","connection":"events","subject":"a.b"}"#,
            SinkSpec::Nats(NatsSpec::new("events", "a.b")),
        );
        check(
            r#"{"type":"kafka","connection":"log","topic":"t","key":null}"#,
            SinkSpec::Kafka(KafkaSpec::new("log", "t")),
        );
        for bad in [
            r#"{"type":"nats","connection":"events","subject":"a","stream":"x"}"#,
            r#"{"type":"kafka","connection":"log"}"#,
            r#"{"type":"redis_stream","stream":"s"}"#,
        ] {
            assert!(serde_json_lite(bad).is_err(), "{bad}");
        }
    }

    /// Build validates without connecting: nothing listens on these ports and it still works,
    /// while bad specs name their field.
    #[test]
    fn build_checks_stream_specs_and_names_the_field() {
        let factory = factory();
        let queue = QueueName::new("q").expect("queue name");
        let check = |spec: SinkSpec, expected: Result<&str, &str>| match (
            factory.build(&queue, &spec),
            expected,
        ) {
            (Ok(sink), Ok(target)) => assert_eq!(sink.target(), target),
            (Err(error), Err(needle)) => {
                assert!(error.to_string().contains(needle), "{spec:?}: {error}")
            }
            (Ok(_), Err(needle)) => panic!("{spec:?}: built, expected {needle}"),
            (Err(error), Ok(_)) => panic!("{spec:?}: {error}"),
        };
        check(
            SinkSpec::RedisStream(RedisStreamSpec::new("main", "s")),
            Ok("main"),
        );
        check(SinkSpec::Nats(NatsSpec::new("events", "a.b")), Ok("events"));
        check(SinkSpec::Kafka(KafkaSpec::new("log", "t")), Ok("log"));
        check(
            SinkSpec::Nats(NatsSpec::new("x", "a")),
            Err(
                r#"delivery.connection: no connection "x" is declared in the server config ([connections.x])"#,
            ),
        );
        check(
            SinkSpec::Nats(NatsSpec::new("main", "a")),
            Err("delivery.connection: connection \"main\" is a redis connection; this delivery needs a nats one"),
        );
        check(
            SinkSpec::Nats(NatsSpec::new("events", "")),
            Err("delivery.subject:"),
        );
        check(
            SinkSpec::Nats(NatsSpec::new("events", "a.*")),
            Err("delivery.subject:"),
        );
        check(
            SinkSpec::Kafka(KafkaSpec::new("log", "")),
            Err("delivery.topic:"),
        );
        check(
            SinkSpec::Kafka(KafkaSpec {
                key: Some("header:".to_owned() + &"k".repeat(200)),
                ..KafkaSpec::new("log", "t")
            }),
            Err("delivery.key:"),
        );
        check(
            SinkSpec::Kafka(KafkaSpec {
                key: Some("partition".into()),
                ..KafkaSpec::new("log", "t")
            }),
            Err("delivery.key:"),
        );
        check(
            SinkSpec::RedisStream(RedisStreamSpec::new("main", "")),
            Err("delivery.stream:"),
        );
        check(
            SinkSpec::RedisStream(RedisStreamSpec {
                timeout_ms: 0,
                ..RedisStreamSpec::new("main", "s")
            }),
            Err("delivery.timeout_ms:"),
        );
    }

    fn serde_json_lite(text: &str) -> Result<SinkSpec, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}
