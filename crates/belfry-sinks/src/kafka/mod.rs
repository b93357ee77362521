//! The Kafka sink: produce each due task as one record, counted delivered once the partition
//! leader acknowledges it with `acks=all` (every in-sync replica has it). rskafka always
//! produces with `acks=-1`.
//!
//! Record: value = the task's payload, unchanged; key from the spec (`task_id`, `header:NAME`
//! or none); timestamp = the dispatcher's clock at delivery; headers = the `belfry-*` metadata
//! (see [`crate::metadata`]) and the task's own headers (one value per name: Kafka clients
//! read headers as a list, rskafka writes a map, so a repeated name keeps its last value).
//!
//! Partitioning: a keyed record goes where Kafka's default partitioner would put it
//! (murmur2 of the key modulo the partition count), so consumers of other producers agree; an
//! unkeyed batch goes to one partition, chosen round-robin per batch, which keeps the batch in
//! due order for a consumer of that partition. A batch is one produce request per partition,
//! all sent at once. The partition list is read again every [`METADATA_MAX_AGE`] (and after a
//! failed produce), so added partitions are used as by Kafka's own producers.
//!
//! The topic must exist: this sink never creates topics (their partition count and retention
//! are the operator's choice). An unknown topic is retried, as Kafka's own producers do (a
//! topic being created answers so too), and a task dead-letters once its attempts run out.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{Task, UnixMs};
use futures_util::future::join_all;
use rskafka::chrono::DateTime;
use rskafka::client::error::Error as KafkaError;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rskafka::BackoffConfig;

pub mod nodelay;
pub mod tls;

use crate::connections::KafkaSaslMechanism;
use crate::gate::{Gate, HealthCell};
use crate::link::SharedLink;
use crate::metadata;
use crate::retry::{classify_kafka_failure, KafkaFailure};
use crate::{Attempt, Outcome, Sink, SinkError, SinkFuture, SinkHealth};

/// Longest topic name Kafka accepts.
pub const TOPIC_LEN_MAX: usize = 249;
/// Longest `key` spec (`header:` and a header name). Header names are short; this only stops
/// a spec from carrying a blob.
pub const KEY_SPEC_LEN_MAX: usize = 128;
/// Shortest and longest limit for one produce (connecting and metadata included).
pub const TIMEOUT_MIN: Duration = Duration::from_millis(10);
pub const TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Limit when the spec names none: `acks=all` waits for the slowest in-sync replica.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Most records in one batch (one produce request per partition).
pub const BATCH_MAX: usize = 256;
/// Largest response the client reads. Produce answers are tiny; metadata for a large cluster
/// is the biggest answer we ask for. A broker sending a larger length prefix (or garbage that
/// reads as one) is cut off instead of making us allocate it.
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// First wait between the client's own retries inside one produce (leader moves, metadata
/// refresh); their budget is a share of the produce's timeout (see `client_deadline`).
const CLIENT_BACKOFF_MIN: Duration = Duration::from_millis(20);
const CLIENT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// The share of the delivery's limit the client may spend sleeping between its own retries.
const CLIENT_BUDGET_SHARE: f64 = 0.25;
/// How long the topic's partition list is trusted before it is read again, as Kafka's own
/// producers do (`metadata.max.age.ms`, 5 minutes): after partitions are added, keyed records
/// follow the new count (where every other producer puts them) and unkeyed ones use the new
/// partitions within this long. A produce that fails reads it again at once.
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// Where a record's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaKey {
    /// No key: the batch goes to one partition, round-robin.
    None,
    /// The task id (32 hex digits): a task's redeliveries land on the same partition.
    TaskId,
    /// The value of this task header (no key when the task lacks it).
    Header(String),
}

impl KafkaKey {
    /// Parses the spec's `key`: `"task_id"`, `"header:NAME"` or absent.
    pub fn parse(spec: Option<&str>) -> Result<KafkaKey, String> {
        let Some(spec) = spec else {
            return Ok(KafkaKey::None);
        };
        if spec.len() > KEY_SPEC_LEN_MAX {
            return Err(format!(
                "is {} bytes long; the limit is {KEY_SPEC_LEN_MAX}",
                spec.len()
            ));
        }
        if spec == "task_id" {
            return Ok(KafkaKey::TaskId);
        }
        match spec.strip_prefix("header:") {
            Some(name)
                if !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':') =>
            {
                Ok(KafkaKey::Header(name.to_owned()))
            }
            _ => Err(format!(
                "expected \"task_id\", \"header:NAME\" or null, got {spec:?}"
            )),
        }
    }

    fn of(&self, task: &Task) -> Option<Vec<u8>> {
        match self {
            KafkaKey::None => None,
            KafkaKey::TaskId => Some(task.id.to_string().into_bytes()),
            KafkaKey::Header(wanted) => task
                .headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
                .map(|(_, value)| value.as_bytes().to_vec()),
        }
    }
}

/// Checks a topic name as Kafka does: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.len() > TOPIC_LEN_MAX {
        return Err(format!("must be 1 to {TOPIC_LEN_MAX} characters long"));
    }
    if topic == "." || topic == ".." {
        return Err("must not be \".\" or \"..\"".to_owned());
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err("may contain only letters, digits, '.', '_' and '-'".to_owned());
    }
    Ok(())
}

/// Where and how to produce one queue's tasks.
#[derive(Clone)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// SASL credentials, proved with `sasl_mechanism`.
    pub username: Option<String>,
    pub password: Option<String>,
    pub sasl_mechanism: KafkaSaslMechanism,
    /// TLS to every broker (see [`tls::client_config`]); `None` is plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub topic: String,
    pub key: KafkaKey,
    pub timeout: Duration,
    /// How long the partition list is trusted ([`METADATA_MAX_AGE`] by default).
    pub metadata_max_age: Duration,
    /// What [`Sink::target`] reports: the connection's name.
    pub target: String,
}

impl KafkaConfig {
    pub fn new(brokers: Vec<String>, topic: impl Into<String>) -> Self {
        KafkaConfig {
            target: brokers.join(","),
            brokers,
            username: None,
            password: None,
            sasl_mechanism: KafkaSaslMechanism::Plain,
            tls: None,
            topic: topic.into(),
            key: KafkaKey::None,
            timeout: TIMEOUT_DEFAULT,
            metadata_max_age: METADATA_MAX_AGE,
        }
    }
}

/// Never prints the password.
impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("tls", &self.tls.is_some())
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("timeout", &self.timeout)
            .field("metadata_max_age", &self.metadata_max_age)
            .field("target", &self.target)
            .finish()
    }
}

/// The client's own retry budget: well inside the delivery's limit, so that when the client
/// gives up (it retries a refused login until its budget is spent) its last error, such as the
/// refusal, decides the outcome instead of the delivery's bare timeout.
///
/// rskafka (0.6) counts only the sleeps between attempts against this budget, not the
/// attempts themselves: each refused login is a fresh connection and SASL exchange, about
/// 20 of them fit in a budget of 8 s, and on a loaded machine they took the rest of a 10 s
/// limit. A quarter of the limit leaves three quarters for the attempts, and a refused login
/// becomes a dead letter in about that quarter instead of most of the limit.
fn client_deadline(timeout: Duration) -> Duration {
    timeout.mul_f64(CLIENT_BUDGET_SHARE)
}

/// A connected client and one producer per partition of the topic.
#[derive(Clone)]
struct Link {
    client: Arc<Client>,
    /// The topic's partition ids as last read, sorted; one producer each, in that order.
    ids: Arc<Vec<i32>>,
    partitions: Arc<Vec<PartitionClient>>,
    /// When the partition list is to be read again; shared by the clones, so one delivery
    /// reads it while the others go on.
    refresh_at: Arc<std::sync::Mutex<Instant>>,
}

impl Link {
    /// Whether the partition list is due to be read again; if so, the next time is set
    /// `max_age` from now, so only the caller that was told yes reads it.
    fn take_refresh(&self, max_age: Duration) -> bool {
        let now = Instant::now();
        let mut at = self
            .refresh_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now < *at {
            return false;
        }
        *at = now + max_age;
        true
    }
}

/// Produces one queue's tasks to a Kafka topic.
pub struct KafkaSink {
    config: KafkaConfig,
    link: SharedLink<Link>,
    /// The partition for the next unkeyed batch.
    next_partition: AtomicUsize,
    gate: Gate,
    health: HealthCell,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("config", &self.config)
            .finish()
    }
}

impl KafkaSink {
    /// Checks the configuration; does not connect.
    pub fn new(config: KafkaConfig) -> Result<Self, SinkError> {
        validate_topic(&config.topic).map_err(|reason| SinkError::InvalidDelivery {
            field: "topic",
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
        if config.brokers.is_empty() {
            return Err(SinkError::InvalidDelivery {
                field: "connection",
                reason: "the connection lists no brokers".to_owned(),
            });
        }
        Ok(KafkaSink {
            config,
            link: SharedLink::default(),
            next_partition: AtomicUsize::new(0),
            gate: Gate::default(),
            health: HealthCell::default(),
        })
    }

    /// The shared connection (made if there is none); reconnected when the topic's partition
    /// list, read again once it is older than `metadata_max_age`, has changed.
    async fn link(&self) -> Result<Link, Outcome> {
        let link = self.link.get_or_connect(|| self.connect()).await?;
        if !link.take_refresh(self.config.metadata_max_age) {
            return Ok(link);
        }
        match self.partition_ids(&link.client).await {
            Ok(ids) if ids == *link.ids => Ok(link),
            Ok(ids) => {
                tracing::info!(target = %self.config.target, topic = %self.config.topic, before = link.ids.len(), after = ids.len(), "the topic's partitions changed; reconnecting to produce to them");
                self.link.forget();
                self.link.get_or_connect(|| self.connect()).await
            }
            // The produce finds out whether the broker or the topic is gone.
            Err(_) => Ok(link),
        }
    }

    /// The topic's partition ids, sorted, from fresh metadata.
    async fn partition_ids(&self, client: &Client) -> Result<Vec<i32>, Outcome> {
        let topic = &self.config.topic;
        let topics = client.list_topics().await.map_err(|e| kafka_outcome(&e))?;
        let Some(found) = topics.into_iter().find(|t| &t.name == topic) else {
            return Err(classify_kafka_failure(
                KafkaFailure::UnknownTopic,
                &format!("{topic:?} is not in the cluster's metadata"),
            ));
        };
        let mut ids = found.partitions.into_iter().collect::<Vec<i32>>();
        ids.sort_unstable();
        if ids.is_empty() {
            return Err(classify_kafka_failure(
                KafkaFailure::Broker("LeaderNotAvailable"),
                "the topic has no partitions yet",
            ));
        }
        Ok(ids)
    }

    async fn connect(&self) -> Result<Link, Outcome> {
        let config = &self.config;
        let mut builder = ClientBuilder::new(config.brokers.clone())
            .client_id("belfry")
            .max_message_size(RESPONSE_BYTES_MAX)
            .backoff_config(BackoffConfig {
                init_backoff: CLIENT_BACKOFF_MIN,
                max_backoff: CLIENT_BACKOFF_MAX,
                base: 2.0,
                deadline: Some(client_deadline(config.timeout)),
            });
        if let (Some(user), Some(password)) = (&config.username, &config.password) {
            let credentials = Credentials::new(user.clone(), password.clone());
            builder = builder.sasl_config(match config.sasl_mechanism {
                KafkaSaslMechanism::Plain => SaslConfig::Plain(credentials),
                KafkaSaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
                KafkaSaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
            });
        }
        if let Some(tls) = &config.tls {
            builder = builder.tls_config(Arc::clone(tls));
        }
        let client: Client = builder.build().await.map_err(|e| kafka_outcome(&e))?;
        let ids = self.partition_ids(&client).await?;
        let mut partitions = Vec::with_capacity(ids.len());
        for &id in &ids {
            let partition = client
                .partition_client(config.topic.clone(), id, UnknownTopicHandling::Error)
                .await
                .map_err(|e| kafka_outcome(&e))?;
            partitions.push(partition);
        }
        // The partition clients hold their leaders' connections by now.
        let peers = nodelay::broker_addrs(&config.brokers).await;
        let set = nodelay::set_on_connections_to(&peers);
        tracing::debug!(target = %config.target, set, "TCP_NODELAY on broker connections");
        Ok(Link {
            client: Arc::new(client),
            ids: Arc::new(ids),
            partitions: Arc::new(partitions),
            refresh_at: Arc::new(std::sync::Mutex::new(
                Instant::now() + config.metadata_max_age,
            )),
        })
    }

    fn record(&self, task: &Task, attempt: u32, now_ms: UnixMs) -> Record {
        let mut headers = BTreeMap::new();
        for (name, value) in metadata::own_headers(task, |_| false) {
            headers.insert(name.to_owned(), value.as_bytes().to_vec());
        }
        for (name, value) in metadata::headers(task, attempt) {
            headers.insert(name.to_owned(), value.into_bytes());
        }
        let timestamp = i64::try_from(now_ms)
            .ok()
            .and_then(DateTime::from_timestamp_millis)
            .unwrap_or_default();
        Record {
            key: self.config.key.of(task),
            value: Some(task.payload.to_vec()),
            headers,
            timestamp,
        }
    }

    async fn produce_all(&self, batch: &[Attempt<'_>], now_ms: UnixMs) -> Vec<Outcome> {
        let link = match self.link().await {
            Ok(link) => link,
            Err(outcome) => return vec![outcome; batch.len()],
        };
        let count = link.partitions.len();
        let sticky = self.next_partition.fetch_add(1, Ordering::Relaxed) % count;
        // Partition → (batch positions, records), each in due order.
        let mut groups: BTreeMap<usize, (Vec<usize>, Vec<Record>)> = BTreeMap::new();
        for (position, item) in batch.iter().enumerate() {
            let record = self.record(item.task, item.attempt, now_ms);
            let partition = match &record.key {
                Some(key) => partition_for_key(key, count),
                None => sticky,
            };
            let group = groups.entry(partition).or_default();
            group.0.push(position);
            group.1.push(record);
        }
        let results = join_all(groups.into_iter().map(|(partition, (positions, records))| {
            let client = &link.partitions[partition];
            async move {
                let result = client.produce(records, Compression::NoCompression).await;
                (positions, result)
            }
        }))
        .await;
        let mut outcomes = vec![Outcome::Delivered; batch.len()];
        let mut broken = false;
        for (positions, result) in results {
            let outcome = match result {
                Ok(offsets) if offsets.len() == positions.len() => continue,
                Ok(offsets) => classify_kafka_failure(
                    KafkaFailure::Connection,
                    &format!(
                        "the broker acknowledged {} of {} records",
                        offsets.len(),
                        positions.len()
                    ),
                ),
                Err(error) => {
                    broken |= !matches!(error, KafkaError::ServerError { .. });
                    kafka_outcome(&error)
                }
            };
            for position in positions {
                outcomes[position] = outcome.clone();
            }
        }
        if broken || outcomes.iter().any(|o| matches!(o, Outcome::Reject { .. })) {
            // Reconnect and re-read the metadata next time: the broker set or the topic
            // (deleted, re-created, repartitioned) may have changed.
            self.link.forget();
        }
        outcomes
    }

    async fn deliver_all(&self, batch: &[Attempt<'_>], now_ms: UnixMs) -> Vec<Outcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let outcomes = match self.gate.enter().await {
            Err(closed) => vec![closed; batch.len()],
            Ok(_open) => {
                let limit = self.config.timeout;
                match tokio::time::timeout(limit, self.produce_all(batch, now_ms)).await {
                    Ok(outcomes) => outcomes,
                    Err(_) => {
                        self.link.forget();
                        vec![
                            classify_kafka_failure(
                                KafkaFailure::Timeout,
                                &format!("no acknowledgement within {} ms", limit.as_millis()),
                            );
                            batch.len()
                        ]
                    }
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
                    tracing::info!(task = %item.task.id, attempt = item.attempt, target = %self.config.target, %reason, "kafka produce failed; retryable (the queue's retry policy decides whether it is tried again)")
                }
                Outcome::Reject { reason } => {
                    tracing::warn!(task = %item.task.id, attempt = item.attempt, target = %self.config.target, %reason, "kafka produce rejected")
                }
            }
        }
        outcomes
    }
}

/// The outcome for an rskafka error.
fn kafka_outcome(error: &KafkaError) -> Outcome {
    let detail = error.to_string();
    match error {
        KafkaError::ServerError { protocol_error, .. } => {
            let name = format!("{protocol_error:?}");
            classify_kafka_failure(KafkaFailure::Broker(&name), &detail)
        }
        KafkaError::Timeout => classify_kafka_failure(KafkaFailure::Timeout, &detail),
        KafkaError::Connection(rskafka::ConnectionError::SaslFailed(_)) => {
            classify_kafka_failure(KafkaFailure::Authentication, &detail)
        }
        // rskafka retries a failed login until the deadline and then reports the last error
        // only as text inside its retry error.
        KafkaError::Connection(_) if is_login_refusal(&detail) => {
            classify_kafka_failure(KafkaFailure::Authentication, &detail)
        }
        // Connection refused or reset, a response that does not parse, retries exhausted.
        _ => classify_kafka_failure(KafkaFailure::Connection, &detail),
    }
}

/// Whether rskafka's error text (0.6) says the broker refused the login: it answered the SASL
/// exchange with an error code, the SCRAM exchange failed, or the mechanism is not offered.
/// A connection lost during the exchange (`Sasl handshake failed: Request error: ...`) is not
/// a refusal: it is retried like any lost connection.
fn is_login_refusal(detail: &str) -> bool {
    const REFUSALS: [&str; 4] = [
        "Sasl handshake failed: API error",
        "Sasl handshake failed: Sasl session error",
        "Sasl handshake failed: unsupported sasl mechanism",
        "Sasl handshake failed: Invalid sasl mechanism",
    ];
    REFUSALS.iter().any(|refusal| detail.contains(refusal))
}

/// Kafka's default partitioner for a keyed record: murmur2 of the key, sign bit cleared,
/// modulo the partition count.
pub fn partition_for_key(key: &[u8], partitions: usize) -> usize {
    let positive = (murmur2(key) & 0x7fff_ffff) as usize;
    positive % partitions.max(1)
}

/// MurmurHash2 (32-bit) with Kafka's seed, as its Java client computes it.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Kafka hashes the length as a Java int: lengths beyond 2^31 wrap the same way.
    let mut h = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

impl Sink for KafkaSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Outcome> {
        Box::pin(async move {
            let batch = [Attempt { task, attempt }];
            crate::gate::only(self.deliver_all(&batch, now_ms).await)
        })
    }

    fn batch_max(&self) -> usize {
        BATCH_MAX
    }

    fn deliver_batch<'a>(
        &'a self,
        batch: &'a [Attempt<'a>],
        now_ms: UnixMs,
    ) -> SinkFuture<'a, Vec<Outcome>> {
        Box::pin(self.deliver_all(batch, now_ms))
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
                Err(_) => classify_kafka_failure(KafkaFailure::Timeout, "connecting"),
            };
            let what = format!("kafka connection {}", self.config.target);
            self.health.record_open(outcome, &what)
        })
    }

    fn health(&self) -> SinkHealth {
        self.health.get()
    }

    fn close(&self) -> SinkFuture<'_, ()> {
        Box::pin(async move {
            if self.gate.close().await {
                // Every produce was acknowledged or failed (the gate waited): nothing is
                // buffered client-side, so dropping the connections loses nothing.
                self.link.forget();
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_refusals_are_told_from_lost_connections() {
        let retry = "all retries failed: Retry exceeded deadline. Source: ";
        for refused in [
            "Sasl handshake failed: API error: SaslAuthenticationFailed",
            "Sasl handshake failed: Sasl session error: authentication failed",
            "Sasl handshake failed: unsupported sasl mechanism",
        ] {
            assert!(is_login_refusal(&format!("{retry}{refused}")), "{refused}");
        }
        for lost in [
            "Sasl handshake failed: Request error: Connection is poisoned: early eof",
            "Connection is poisoned: Cannot read framed message: early eof",
        ] {
            assert!(!is_login_refusal(&format!("{retry}{lost}")), "{lost}");
        }
    }

    #[test]
    fn murmur2_matches_kafka() {
        // Vectors from Kafka's own partitioner tests (as signed Java ints).
        let check = |input: &str, expected: i32| {
            assert_eq!(murmur2(input.as_bytes()) as i32, expected, "{input}");
        };
        check("21", -973_932_308);
        check("foobar", -790_332_482);
        check("a-little-bit-long-string", -985_981_536);
        check("a-little-bit-longer-string", -1_486_304_829);
        check(
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        );
        check("abc", 479_470_107);
    }

    #[test]
    fn key_specs() {
        assert_eq!(KafkaKey::parse(None), Ok(KafkaKey::None));
        assert_eq!(KafkaKey::parse(Some("task_id")), Ok(KafkaKey::TaskId));
        assert_eq!(
            KafkaKey::parse(Some("header:tenant")),
            Ok(KafkaKey::Header("tenant".into()))
        );
        for bad in [
            "",
            "header:",
            "id",
            "header:a b",
            &"x".repeat(KEY_SPEC_LEN_MAX + 1),
        ] {
            assert!(KafkaKey::parse(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topic_names() {
        assert!(validate_topic("orders.eu-1_x").is_ok());
        for bad in ["", ".", "..", "a b", "ä", &"t".repeat(TOPIC_LEN_MAX + 1)] {
            assert!(validate_topic(bad).is_err(), "{bad:?}");
        }
    }
}
