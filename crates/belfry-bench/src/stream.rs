//! `belfry bench stream`: tasks delivered through a stream sink (Redis Streams, NATS
//! JetStream, Kafka) to a broker this run starts on a free loopback port, read back by a real
//! consumer of that broker (XREAD, an ordered JetStream consumer, a Kafka fetch loop). Then,
//! on the same broker, the baseline: the broker's own raw publish rate (pipelined XADD, async
//! JetStream publishes with many acks outstanding, rskafka produce requests — the client the
//! sink uses), read back by the same consumer.
//!
//! Measured: delivered tasks/s (the burst, `--window-s 0`: from the due time to the
//! consumer's last receipt; the baseline: from the first publish to the last receipt), firing
//! lateness = the consumer's receipt − the task's due time, never early, lost, duplicates, and
//! that the entry's due-time metadata (`due_at_ms` field, `belfry-due-at` header) matches
//! the due time the bench submitted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::report::{ratio, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::{format_us, DeliverySummary, DeliveryTracker};
use crate::sys::{free_port, unix_ms, unix_us, CpuMeter, CpuUse, Machine};
use crate::workload::{due_times, parse_index, payload, validate, Bodies};
use crate::{OutputArgs, ServerArgs};

/// Issue #11: a burst through a stream sink reaches at least this share of the broker's raw
/// publish rate measured in the same run.
const BURST_SHARE_OF_RAW_TARGET: f64 = 0.5;

/// Issue #11: firing lateness p99 through a stream sink at 10k due/s.
const LATENESS_P99_US_TARGET: u64 = 20_000;

/// How long a broker this run started may take to answer.
const BROKER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between readiness probes of a starting broker.
const BROKER_READY_POLL: Duration = Duration::from_millis(25);

/// Longest wait of one consumer read when nothing is there: short, so the loop notices its
/// deadline, long enough not to spin.
const CONSUMER_POLL_MS: u64 = 100;

/// Entries one XREAD returns at most: large enough that reading never limits a burst.
const REDIS_READ_COUNT_MAX: usize = 10_000;

/// Bytes one Kafka fetch returns at most (the broker may send less).
const KAFKA_FETCH_BYTES_MAX: i32 = 8 * 1024 * 1024;

/// Longest `--kafka-fetch-wait-ms`: a fetch wait beyond it would only hide receipts longer.
const KAFKA_FETCH_WAIT_MS_MAX: u64 = 1_000;

/// After everything arrived, keep reading this long to catch duplicates.
const DUPLICATE_WATCH: Duration = Duration::from_millis(500);

/// Limit for one baseline publish batch (including its acknowledgements).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Records per baseline publish batch at most: the stream sinks' own batch limit.
const PUBLISH_BATCH_MAX: usize = 256;

/// Baseline publish batches in flight at most.
const PUBLISH_IN_FLIGHT_MAX: usize = 256;

/// The connection name the spawned server declares for the broker.
const CONNECTION: &str = "bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Redis Streams (`redis_stream`) on a redis-server.
    Redis,
    /// NATS JetStream (`nats`) on a nats-server -js.
    Nats,
    /// Kafka (`kafka`) on the Tansu Kafka-protocol broker.
    Kafka,
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::Redis => "redis",
            SinkKind::Nats => "nats",
            SinkKind::Kafka => "kafka",
        }
    }

    fn title(self) -> &'static str {
        match self {
            SinkKind::Redis => "Redis Streams",
            SinkKind::Nats => "NATS JetStream",
            SinkKind::Kafka => "Kafka (Tansu)",
        }
    }

    fn raw_label(self) -> &'static str {
        match self {
            SinkKind::Redis => "raw pipelined XADD",
            SinkKind::Nats => "raw async JetStream publish",
            SinkKind::Kafka => "raw rskafka produce",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct StreamArgs {
    /// The stream sink (and broker) to measure.
    #[arg(long, value_enum)]
    pub sink: SinkKind,
    /// Tasks to schedule.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: u64,
    /// Spread the due times evenly over this many seconds (0 = all due at once: a burst,
    /// which measures the delivery rate against the raw publish baseline).
    #[arg(long, default_value_t = 20)]
    pub window_s: u64,
    /// The first task is due this long after the queue exists, so that submitting finishes
    /// before firing begins.
    #[arg(long, default_value_t = 5)]
    pub lead_s: u64,
    /// Tasks per submit request.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Submit connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// After the last due time, wait at most this long before counting the rest as lost.
    #[arg(long, default_value_t = 30)]
    pub grace_s: u64,
    /// Records per baseline publish batch (the sinks send batches of up to 256).
    #[arg(long, default_value_t = 256)]
    pub publish_batch: usize,
    /// Baseline publish batches in flight at once.
    #[arg(long, default_value_t = 16)]
    pub publish_in_flight: usize,
    /// Longest wait of one Kafka fetch when nothing is new. Tansu answers a waiting fetch
    /// only when the wait ends, not when a record arrives, so the wait adds up to itself to
    /// the measured lateness. With 2 ms waits at 10k due/s, Tansu spent ~0.8 core on fetches
    /// and the consumer stopped seeing records after about half of them (the server had them
    /// all acknowledged), so the default trades ≤ 20 ms of lateness for a consumer that works.
    #[arg(long, default_value_t = 20)]
    pub kafka_fetch_wait_ms: u64,
    /// Skip the raw publish baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// The broker binary (default: redis-server / nats-server on PATH; for Kafka $TANSU_BIN,
    /// else `tansu` on PATH — `scripts/kafka.sh install` prints TANSU_BIN).
    #[arg(long)]
    pub broker_bin: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl StreamArgs {
    pub fn validate(&self) -> Result<(), crate::BenchError> {
        use crate::BenchError;
        validate(self.tasks, self.batch, self.connections, self.payload_bytes)?;
        if self.tasks > u64::from(u32::MAX) {
            return Err(BenchError::invalid("--tasks", "at most 4294967295"));
        }
        if self.publish_batch == 0 || self.publish_batch > PUBLISH_BATCH_MAX {
            return Err(BenchError::invalid(
                "--publish-batch",
                format!("must be 1..={PUBLISH_BATCH_MAX}"),
            ));
        }
        if self.publish_in_flight == 0 || self.publish_in_flight > PUBLISH_IN_FLIGHT_MAX {
            return Err(BenchError::invalid(
                "--publish-in-flight",
                format!("must be 1..={PUBLISH_IN_FLIGHT_MAX}"),
            ));
        }
        if self.kafka_fetch_wait_ms > KAFKA_FETCH_WAIT_MS_MAX {
            return Err(BenchError::invalid(
                "--kafka-fetch-wait-ms",
                format!("must be at most {KAFKA_FETCH_WAIT_MS_MAX}"),
            ));
        }
        if !self.server.spawn {
            return Err(BenchError::invalid(
                "--spawn",
                "required: the server must declare the broker this run starts",
            ));
        }
        Ok(())
    }
}

// ---- the broker ----

/// A broker process this run started on a free loopback port; killed by its own child
/// handle (exactly this process) on drop.
pub struct Broker {
    pub kind: SinkKind,
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

/// The binary for `kind`: the flag, else (Kafka) `$TANSU_BIN`, else the usual name on PATH.
/// Fails with an install hint when it does not run.
pub fn broker_bin(kind: SinkKind, flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match (flag, kind) {
        (Some(path), _) => path.to_path_buf(),
        (None, SinkKind::Redis) => PathBuf::from("redis-server"),
        (None, SinkKind::Nats) => PathBuf::from("nats-server"),
        (None, SinkKind::Kafka) => std::env::var_os("TANSU_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("tansu")),
    };
    let runs = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        let hint = match kind {
            SinkKind::Redis => "apt-get install redis-server (scripts/redis.sh start installs it)",
            SinkKind::Nats => "apt-get install nats-server (scripts/nats.sh install)",
            SinkKind::Kafka => {
                "run `scripts/kafka.sh install` and set TANSU_BIN to the path it prints"
            }
        };
        bail!(
            "the {} broker {} is missing or does not run: {hint}",
            kind.name(),
            bin.display()
        );
    }
    Ok(bin)
}

impl Broker {
    pub async fn start(kind: SinkKind, flag: Option<&Path>) -> anyhow::Result<Broker> {
        let bin = broker_bin(kind, flag)?;
        let dir = tempfile::Builder::new()
            .prefix("belfry-bench-broker-")
            .tempdir()
            .context("create the broker's temp dir")?;
        let port = free_port().context("find a free port")?;
        let port_text = port.to_string();
        let mut command = Command::new(&bin);
        match kind {
            // Append-only with fsync every second: the usual production setting, as in
            // scripts/redis.sh.
            SinkKind::Redis => command
                .args(["--bind", "127.0.0.1", "--port", &port_text])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                ])
                .args(["--daemonize", "no", "--dir"])
                .arg(dir.path()),
            SinkKind::Nats => command
                .args(["-a", "127.0.0.1", "-p", &port_text, "-js", "-sd"])
                .arg(dir.path()),
            // Memory storage: the only engine the packaged Tansu has (scripts/kafka.sh).
            SinkKind::Kafka => {
                let listener = format!("tcp://127.0.0.1:{port}");
                command
                    .arg("broker")
                    .args(["--listener-url", &listener])
                    .args(["--advertised-listener-url", &listener])
                    .args(["--storage-engine", "memory://tansu/"])
                    .args(["--cluster-id", &format!("belfry-bench-{port}")])
            }
        };
        let log = std::fs::File::create(dir.path().join("broker.log"))
            .context("create the broker log")?;
        let log_err = log.try_clone().context("open the broker log")?;
        let child = command
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut broker = Broker {
            kind,
            port,
            child: Some(child),
            _dir: dir,
        };
        broker.wait_ready().await?;
        Ok(broker)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    bail!("the {} broker exited with {status}", self.kind.name());
                }
            }
            if self.answers().await {
                return Ok(());
            }
            if started.elapsed() > BROKER_READY_TIMEOUT {
                bail!(
                    "the {} broker did not answer within {BROKER_READY_TIMEOUT:?}",
                    self.kind.name()
                );
            }
            tokio::time::sleep(BROKER_READY_POLL).await;
        }
    }

    async fn answers(&self) -> bool {
        match self.kind {
            SinkKind::Redis => async {
                let client = redis::Client::open(self.url()).ok()?;
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .ok()
            }
            .await
            .is_some(),
            // Ready once JetStream answers, not only the client port.
            SinkKind::Nats => async {
                let client = async_nats::connect(self.url()).await.ok()?;
                let reply = client.request("$JS.API.INFO", "".into()).await.ok()?;
                reply.payload.starts_with(b"{").then_some(())
            }
            .await
            .is_some(),
            SinkKind::Kafka => async {
                let client = kafka_client(&self.url()).await.ok()?;
                client.list_topics().await.ok()
            }
            .await
            .is_some(),
        }
    }

    /// The address as the server's connection config and the clients want it.
    pub fn url(&self) -> String {
        match self.kind {
            SinkKind::Redis => format!("redis://127.0.0.1:{}/0", self.port),
            SinkKind::Nats => format!("nats://127.0.0.1:{}", self.port),
            SinkKind::Kafka => format!("127.0.0.1:{}", self.port),
        }
    }

    /// `BELFRY_CONNECTIONS__BENCH__*` for the spawned server.
    fn server_env(&self) -> Vec<(String, String)> {
        let prefix = format!("BELFRY_CONNECTIONS__{}", CONNECTION.to_ascii_uppercase());
        let address_key = match self.kind {
            SinkKind::Kafka => "BROKERS",
            _ => "URL",
        };
        vec![
            (format!("{prefix}__TYPE"), self.kind.name().to_string()),
            (format!("{prefix}__{address_key}"), self.url()),
        ]
    }

    /// Creates what the stream sinks need to exist: a JetStream stream capturing the subject,
    /// a Kafka topic of one partition. Redis creates the stream on the first XADD.
    pub async fn prepare(&self, channel: &Channel) -> anyhow::Result<()> {
        match self.kind {
            SinkKind::Redis => Ok(()),
            SinkKind::Nats => {
                let client = async_nats::connect(self.url()).await?;
                async_nats::jetstream::new(client)
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: channel.nats_stream.clone(),
                        subjects: vec![channel.name.clone()],
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("create JetStream stream: {e}"))?;
                Ok(())
            }
            SinkKind::Kafka => {
                let client = kafka_client(&self.url()).await?;
                client
                    .controller_client()?
                    .create_topic(&channel.name, 1, 1, 5_000)
                    .await
                    .context("create the topic")?;
                let started = Instant::now();
                while !client
                    .list_topics()
                    .await
                    .is_ok_and(|t| t.iter().any(|t| t.name == channel.name))
                {
                    if started.elapsed() > BROKER_READY_TIMEOUT {
                        bail!("topic {} not in the metadata", channel.name);
                    }
                    tokio::time::sleep(BROKER_READY_POLL).await;
                }
                Ok(())
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL to exactly the child this run spawned; its data is a temp dir.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn kafka_client(broker: &str) -> anyhow::Result<rskafka::client::Client> {
    Ok(
        rskafka::client::ClientBuilder::new(vec![broker.to_string()])
            .build()
            .await?,
    )
}

/// Where one phase's messages go: a Redis stream key, a NATS subject (in its own JetStream
/// stream), or a Kafka topic — all spelled `name`.
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    nats_stream: String,
}

impl Channel {
    pub fn new(kind: SinkKind, phase: &str) -> Channel {
        let name = match kind {
            SinkKind::Nats => format!("bench.{phase}"),
            _ => format!("bench-{phase}"),
        };
        Channel {
            name,
            nats_stream: format!("BENCH_{}", phase.to_ascii_uppercase()),
        }
    }

    /// The queue's `delivery` object for this channel.
    fn delivery(&self, kind: SinkKind) -> serde_json::Value {
        match kind {
            SinkKind::Redis => serde_json::json!(
                {"type": "redis_stream", "connection": CONNECTION, "stream": self.name}),
            SinkKind::Nats => {
                serde_json::json!({"type": "nats", "connection": CONNECTION, "subject": self.name})
            }
            SinkKind::Kafka => {
                serde_json::json!({"type": "kafka", "connection": CONNECTION, "topic": self.name})
            }
        }
    }
}

// ---- the consumer ----

/// What a consumer saw: the tracker of receipts and how the metadata compared.
#[derive(Debug)]
pub struct Consumed {
    pub tracker: DeliveryTracker,
    /// Messages whose due-time metadata differed from the due time submitted (or was absent).
    pub due_mismatches: u64,
    /// Messages whose payload did not name a task of this run.
    pub unreadable: u64,
    pub read_errors: u64,
    pub first_read_error: Option<String>,
}

impl Consumed {
    fn take(&mut self, payload: &[u8], due_meta: Option<&[u8]>, due: &[u64], receipt_us: u64) {
        let Some(index) = parse_index(payload) else {
            self.unreadable += 1;
            return;
        };
        let expected = usize::try_from(index).ok().and_then(|i| due.get(i));
        let meta = due_meta
            .and_then(|m| std::str::from_utf8(m).ok())
            .and_then(|m| m.parse::<u64>().ok());
        if expected.is_none() || meta != expected.copied() {
            self.due_mismatches += 1;
        }
        self.tracker.record(index, receipt_us);
    }

    fn error(&mut self, text: String) {
        self.read_errors += 1;
        if self.first_read_error.is_none() {
            self.first_read_error = Some(text);
        }
    }
}

/// Reads `channel` from its start until every task in `due` arrived (and
/// [`DUPLICATE_WATCH`] after) or until `deadline`.
pub async fn consume(
    broker_url: String,
    kind: SinkKind,
    channel: Channel,
    due: Arc<Vec<u64>>,
    deadline: Instant,
    kafka_fetch_wait_ms: i32,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Consumed {
    let mut consumed = Consumed {
        tracker: DeliveryTracker::new(due.as_ref().clone()),
        due_mismatches: 0,
        unreadable: 0,
        read_errors: 0,
        first_read_error: None,
    };
    let result = match kind {
        SinkKind::Redis => {
            consume_redis(&broker_url, &channel, &due, deadline, ready, &mut consumed).await
        }
        SinkKind::Nats => {
            consume_nats(&broker_url, &channel, &due, deadline, ready, &mut consumed).await
        }
        SinkKind::Kafka => {
            consume_kafka(
                &broker_url,
                &channel,
                &due,
                (deadline, kafka_fetch_wait_ms),
                ready,
                &mut consumed,
            )
            .await
        }
    };
    if let Err(error) = result {
        consumed.error(format!("{error:#}"));
    }
    consumed
}

/// Whether a consumer loop should stop: past the deadline, or everything arrived and the
/// duplicate watch is over.
struct Stop {
    deadline: Instant,
    all_since: Option<Instant>,
}

impl Stop {
    fn now(&mut self, consumed: &Consumed) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return true;
        }
        if consumed.tracker.all_delivered() {
            let since = *self.all_since.get_or_insert(now);
            return now.duration_since(since) >= DUPLICATE_WATCH;
        }
        false
    }
}

type XreadReply = Option<Vec<(String, Vec<(String, Vec<(String, Vec<u8>)>)>)>>;

async fn consume_redis(
    url: &str,
    channel: &Channel,
    due: &[u64],
    deadline: Instant,
    ready: tokio::sync::oneshot::Sender<()>,
    consumed: &mut Consumed,
) -> anyhow::Result<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _ = ready.send(());
    let mut last_id = "0-0".to_string();
    let mut stop = Stop {
        deadline,
        all_since: None,
    };
    while !stop.now(consumed) {
        let reply: Result<XreadReply, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(REDIS_READ_COUNT_MAX)
            .arg("BLOCK")
            .arg(CONSUMER_POLL_MS)
            .arg("STREAMS")
            .arg(&channel.name)
            .arg(&last_id)
            .query_async(&mut conn)
            .await;
        let receipt_us = unix_us();
        match reply {
            Ok(Some(streams)) => {
                for (_, entries) in streams {
                    for (id, fields) in entries {
                        let field = |name: &str| {
                            fields
                                .iter()
                                .find(|(n, _)| n == name)
                                .map(|(_, v)| v.as_slice())
                        };
                        consumed.take(
                            field("payload").unwrap_or_default(),
                            field("due_at_ms"),
                            due,
                            receipt_us,
                        );
                        last_id = id;
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                consumed.error(format!("XREAD: {error}"));
                tokio::time::sleep(Duration::from_millis(CONSUMER_POLL_MS)).await;
            }
        }
    }
    Ok(())
}

async fn consume_nats(
    url: &str,
    channel: &Channel,
    due: &[u64],
    deadline: Instant,
    ready: tokio::sync::oneshot::Sender<()>,
    consumed: &mut Consumed,
) -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::pull::OrderedConfig;
    let client = async_nats::connect(url).await?;
    let jetstream = async_nats::jetstream::new(client);
    let stream = jetstream
        .get_stream(&channel.nats_stream)
        .await
        .map_err(|e| anyhow::anyhow!("get stream {}: {e}", channel.nats_stream))?;
    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .map_err(|e| anyhow::anyhow!("create an ordered consumer: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("consume: {e}"))?;
    let _ = ready.send(());
    let mut stop = Stop {
        deadline,
        all_since: None,
    };
    while !stop.now(consumed) {
        match tokio::time::timeout(Duration::from_millis(CONSUMER_POLL_MS), messages.next()).await {
            Err(_) => {}
            Ok(None) => bail!("the JetStream consumer ended"),
            Ok(Some(Err(error))) => consumed.error(format!("JetStream consumer: {error}")),
            Ok(Some(Ok(message))) => {
                let receipt_us = unix_us();
                let meta = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("belfry-due-at"))
                    .map(|v| v.as_str().as_bytes().to_vec());
                consumed.take(&message.payload, meta.as_deref(), due, receipt_us);
            }
        }
    }
    Ok(())
}

async fn consume_kafka(
    broker: &str,
    channel: &Channel,
    due: &[u64],
    (deadline, fetch_wait_ms): (Instant, i32),
    ready: tokio::sync::oneshot::Sender<()>,
    consumed: &mut Consumed,
) -> anyhow::Result<()> {
    use rskafka::client::partition::UnknownTopicHandling;
    let client = kafka_client(broker).await?;
    let partition = client
        .partition_client(channel.name.clone(), 0, UnknownTopicHandling::Retry)
        .await?;
    let _ = ready.send(());
    let mut offset = 0i64;
    let mut stop = Stop {
        deadline,
        all_since: None,
    };
    while !stop.now(consumed) {
        let fetched = partition
            .fetch_records(offset, 1..KAFKA_FETCH_BYTES_MAX, fetch_wait_ms)
            .await;
        let receipt_us = unix_us();
        match fetched {
            Ok((records, _high_watermark)) => {
                for record in records {
                    offset = offset.max(record.offset + 1);
                    let value = record.record.value.as_deref().unwrap_or_default();
                    let meta = record.record.headers.get("belfry-due-at");
                    consumed.take(value, meta.map(Vec::as_slice), due, receipt_us);
                }
            }
            Err(error) => {
                consumed.error(format!("fetch at offset {offset}: {error}"));
                tokio::time::sleep(Duration::from_millis(CONSUMER_POLL_MS)).await;
            }
        }
    }
    Ok(())
}

// ---- the raw publish baseline ----

/// The baseline's publisher side.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Published {
    pub acknowledged: u64,
    pub failed_batches: u64,
    pub first_error: Option<String>,
    /// First publish to the last acknowledgement.
    pub elapsed_s: f64,
}

/// One message as the sinks write it: the same payload and the same metadata (names and
/// sizes), so the broker does the same work per message.
struct RawMessage {
    task_id: String,
    due_at_ms: u64,
    payload: Bytes,
}

fn raw_messages(tasks: u64, due_at_ms: u64, payload_bytes: usize) -> Vec<RawMessage> {
    (0..tasks)
        .map(|i| RawMessage {
            task_id: format!("{:032x}", u128::from(i) + 1),
            due_at_ms,
            payload: Bytes::from(payload(i, payload_bytes)),
        })
        .collect()
}

/// Publishes `messages` to `channel` in batches of `batch`, `in_flight` batches at once.
async fn publish_raw(
    broker: &Broker,
    channel: &Channel,
    messages: Vec<RawMessage>,
    batch: usize,
    in_flight: usize,
) -> anyhow::Result<Published> {
    let messages = Arc::new(messages);
    let batches: Vec<std::ops::Range<usize>> = (0..messages.len())
        .step_by(batch)
        .map(|s| s..(s + batch).min(messages.len()))
        .collect();
    let url = broker.url();
    let started;
    let results: Vec<Result<u64, String>> = match broker.kind {
        SinkKind::Redis => {
            let conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            started = Instant::now();
            futures_util::stream::iter(batches.into_iter().map(|range| {
                let (mut conn, messages, key) = (conn.clone(), messages.clone(), &channel.name);
                async move {
                    let mut pipe = redis::pipe();
                    for m in &messages[range.clone()] {
                        pipe.cmd("XADD")
                            .arg(key)
                            .arg("*")
                            .arg("id")
                            .arg(&m.task_id)
                            .arg("queue")
                            .arg("bench-stream")
                            .arg("attempt")
                            .arg(1)
                            .arg("due_at_ms")
                            .arg(m.due_at_ms)
                            .arg("kind")
                            .arg("json")
                            .arg("payload")
                            .arg(m.payload.as_ref())
                            .ignore();
                    }
                    match tokio::time::timeout(PUBLISH_TIMEOUT, pipe.query_async::<()>(&mut conn))
                        .await
                    {
                        Ok(Ok(())) => Ok(range.len() as u64),
                        Ok(Err(e)) => Err(format!("XADD pipeline: {e}")),
                        Err(_) => Err("XADD pipeline timed out".into()),
                    }
                }
            }))
            .buffer_unordered(in_flight)
            .collect()
            .await
        }
        SinkKind::Nats => {
            use async_nats::header::HeaderMap;
            let client = async_nats::connect(url.as_str()).await?;
            let jetstream = async_nats::jetstream::new(client);
            started = Instant::now();
            // Publishes are written in order on the one connection; the acks of up to
            // `in_flight` batches are outstanding at once.
            let mut outstanding = FuturesUnordered::new();
            let mut results = Vec::with_capacity(batches.len());
            for range in batches {
                let mut acks = Vec::with_capacity(range.len());
                let mut failed = None;
                for m in &messages[range.clone()] {
                    let mut headers = HeaderMap::new();
                    headers.insert("Nats-Msg-Id", m.task_id.as_str());
                    headers.insert("belfry-task-id", m.task_id.as_str());
                    headers.insert("belfry-queue", "bench-stream");
                    headers.insert("belfry-attempt", "1");
                    headers.insert("belfry-due-at", m.due_at_ms.to_string().as_str());
                    headers.insert("content-type", "application/json");
                    match jetstream
                        .publish_with_headers(channel.name.clone(), headers, m.payload.clone())
                        .await
                    {
                        Ok(ack) => acks.push(ack),
                        Err(e) => failed = Some(format!("publish: {e}")),
                    }
                }
                outstanding.push(async move {
                    if let Some(error) = failed {
                        return Err(error);
                    }
                    let all = futures_util::future::join_all(
                        acks.into_iter().map(std::future::IntoFuture::into_future),
                    );
                    match tokio::time::timeout(PUBLISH_TIMEOUT, all).await {
                        Err(_) => Err("PubAcks timed out".to_string()),
                        Ok(acks) => match acks.into_iter().find_map(Result::err) {
                            Some(e) => Err(format!("PubAck: {e}")),
                            None => Ok(range.len() as u64),
                        },
                    }
                });
                while outstanding.len() >= in_flight {
                    if let Some(result) = outstanding.next().await {
                        results.push(result);
                    }
                }
            }
            while let Some(result) = outstanding.next().await {
                results.push(result);
            }
            results
        }
        SinkKind::Kafka => {
            use rskafka::client::partition::{Compression, UnknownTopicHandling};
            let client = kafka_client(&url).await?;
            let partition = Arc::new(
                client
                    .partition_client(channel.name.clone(), 0, UnknownTopicHandling::Retry)
                    .await?,
            );
            started = Instant::now();
            futures_util::stream::iter(batches.into_iter().map(|range| {
                let (partition, messages) = (partition.clone(), messages.clone());
                async move {
                    let now = rskafka::chrono::DateTime::from_timestamp_millis(unix_ms() as i64)
                        .unwrap_or_default();
                    let records = messages[range.clone()]
                        .iter()
                        .map(|m| rskafka::record::Record {
                            key: None,
                            value: Some(m.payload.to_vec()),
                            headers: [
                                ("belfry-task-id", m.task_id.clone().into_bytes()),
                                ("belfry-queue", b"bench-stream".to_vec()),
                                ("belfry-attempt", b"1".to_vec()),
                                ("belfry-due-at", m.due_at_ms.to_string().into_bytes()),
                                ("content-type", b"application/json".to_vec()),
                            ]
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                            timestamp: now,
                        })
                        .collect();
                    let produce = partition.produce(records, Compression::NoCompression);
                    match tokio::time::timeout(PUBLISH_TIMEOUT, produce).await {
                        Ok(Ok(_offsets)) => Ok(range.len() as u64),
                        Ok(Err(e)) => Err(format!("produce: {e}")),
                        Err(_) => Err("produce timed out".into()),
                    }
                }
            }))
            .buffer_unordered(in_flight)
            .collect()
            .await
        }
    };
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut published = Published {
        acknowledged: 0,
        failed_batches: 0,
        first_error: None,
        elapsed_s,
    };
    for result in results {
        match result {
            Ok(n) => published.acknowledged += n,
            Err(e) => {
                published.failed_batches += 1;
                published.first_error.get_or_insert(e);
            }
        }
    }
    Ok(published)
}

// ---- the scenario ----

/// One measured phase: belfry through the sink, or the raw publish baseline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseOutcome {
    pub label: String,
    pub delivery: DeliverySummary,
    /// Distinct tasks received per second, from the start (the first due time; the first
    /// publish) to the last receipt.
    pub delivered_per_s: f64,
    pub due_mismatches: u64,
    pub unreadable: u64,
    pub read_errors: u64,
    pub first_read_error: Option<String>,
    pub cpu: CpuUse,
    /// Wall time over which `cpu` was measured (the start to the end of the consumer's
    /// duplicate watch).
    pub cpu_wall_s: f64,
}

impl PhaseOutcome {
    fn from(
        label: String,
        consumed: Consumed,
        start_us: u64,
        cpu: CpuUse,
        cpu_wall_s: f64,
    ) -> Self {
        let delivery = consumed.tracker.summary();
        let span_us = consumed
            .tracker
            .last_receipt_us()
            .map_or(0, |last| last.saturating_sub(start_us));
        let delivered_per_s = if span_us == 0 {
            0.0
        } else {
            delivery.delivered as f64 / (span_us as f64 / 1e6)
        };
        PhaseOutcome {
            label,
            delivery,
            delivered_per_s,
            due_mismatches: consumed.due_mismatches,
            unreadable: consumed.unreadable,
            read_errors: consumed.read_errors,
            first_read_error: consumed.first_read_error,
            cpu,
            cpu_wall_s,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamOutcome {
    pub sink: SinkKind,
    pub belfry: PhaseOutcome,
    pub submit: IngestOutcome,
    pub raw: Option<(PhaseOutcome, Published)>,
    /// The broker's CPU seconds while belfry delivered (same span as the server's).
    pub broker_cpu_s: Option<f64>,
    /// The queue's counts at the end of belfry's phase.
    pub queue_state: String,
}

fn broker_cpu(broker: &Broker) -> Option<Duration> {
    broker
        .pid()
        .and_then(|pid| crate::sys::cpu_time(&pid.to_string()))
}

/// The queue's counts as the server reports them (`GET /v1/queues/{queue}`), or the error.
async fn queue_state(target: &crate::http::Target, queue: &str) -> String {
    let answer = async {
        let mut conn = crate::http::HttpConn::connect(target).await?;
        let (_, body) = conn
            .request(
                http::Method::GET,
                &format!("/v1/queues/{queue}"),
                Bytes::new(),
            )
            .await?;
        Ok::<_, crate::BenchError>(body)
    }
    .await;
    match answer {
        Err(e) => format!("not read: {e}"),
        Ok(body) => match serde_json::from_slice::<serde_json::Value>(&body) {
            Err(_) => String::from_utf8_lossy(&body).chars().take(200).collect(),
            Ok(v) => ["pending", "due", "in_flight", "dead", "delivery_health"]
                .iter()
                .map(|k| format!("{k} {}", v.get(*k).unwrap_or(&serde_json::Value::Null)))
                .collect::<Vec<_>>()
                .join(", "),
        },
    }
}

pub async fn run(args: StreamArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let machine = Machine::describe();
    let kind = args.sink;
    let broker = Broker::start(kind, args.broker_bin.as_deref()).await?;
    eprintln!(
        "stream: {} broker on 127.0.0.1:{} (pid {})",
        kind.name(),
        broker.port,
        broker.pid().unwrap_or(0)
    );
    let belfry_channel = Channel::new(kind, "belfry");
    broker.prepare(&belfry_channel).await?;

    let env = broker.server_env();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = ServerUnderTest::connect_or_spawn(&args.server, &env_refs).await?;
    let queue = "bench-stream";
    let body = serde_json::json!({ "delivery": belfry_channel.delivery(kind) }).to_string();
    create_queue(&server.target, queue, &body).await?;

    let first_due_ms = unix_ms() + args.lead_s * 1_000;
    let due = Arc::new(due_times(args.tasks, first_due_ms, args.window_s * 1_000));
    let last_due_ms = due.last().copied().unwrap_or(first_due_ms);
    let deadline = Instant::now()
        + Duration::from_millis(last_due_ms.saturating_sub(unix_ms()))
        + Duration::from_secs(args.grace_s);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let consumer = tokio::spawn(consume(
        broker.url(),
        kind,
        belfry_channel.clone(),
        due.clone(),
        deadline,
        args.kafka_fetch_wait_ms as i32,
        ready_tx,
    ));
    ready_rx.await.context("the consumer did not start")?;
    let bodies = Arc::new(Bodies::build(&due, args.batch, args.payload_bytes));
    let submit = run_ingest(
        IngestJob {
            label: "belfry submit".into(),
            target: server.target.clone(),
            path: format!("/v1/queues/{queue}/tasks:batch"),
            body_paths: None,
            bodies,
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: Some(due.clone()),
            server_pid: server.pid,
        },
        indicatif::ProgressBar::hidden(),
    )
    .await;
    // Server CPU from the first due time: the lead before it is idle time.
    tokio::time::sleep(Duration::from_millis(
        first_due_ms.saturating_sub(unix_ms()),
    ))
    .await;
    let meter = CpuMeter::start(server.pid);
    let broker_cpu_start = broker_cpu(&broker);
    let metered = Instant::now();
    let consumed = consumer.await.context("the consumer panicked")?;
    let cpu = meter.stop();
    let cpu_wall_s = metered.elapsed().as_secs_f64();
    let broker_cpu_s = broker_cpu(&broker)
        .zip(broker_cpu_start)
        .map(|(end, start)| end.saturating_sub(start).as_secs_f64());
    // What the server still holds explains tasks the consumer never saw.
    let queue_state = queue_state(&server.target, queue).await;
    server.stop();
    let belfry = PhaseOutcome::from(
        format!("belfry → {}", kind.title()),
        consumed,
        first_due_ms * 1_000,
        cpu,
        cpu_wall_s,
    );

    let raw = if args.no_baseline {
        None
    } else {
        let channel = Channel::new(kind, "raw");
        broker.prepare(&channel).await?;
        let now_ms = unix_ms();
        let raw_due = Arc::new(vec![now_ms; args.tasks as usize]);
        let messages = raw_messages(args.tasks, now_ms, args.payload_bytes);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let consumer = tokio::spawn(consume(
            broker.url(),
            kind,
            channel.clone(),
            raw_due,
            Instant::now() + Duration::from_secs(args.grace_s.max(1) * 2),
            args.kafka_fetch_wait_ms as i32,
            ready_tx,
        ));
        ready_rx.await.context("the consumer did not start")?;
        let meter = CpuMeter::start(broker.pid());
        let metered = Instant::now();
        let start_us = unix_us();
        let published = publish_raw(
            &broker,
            &channel,
            messages,
            args.publish_batch,
            args.publish_in_flight,
        )
        .await?;
        let consumed = consumer.await.context("the consumer panicked")?;
        let cpu = meter.stop();
        Some((
            PhaseOutcome::from(
                kind.raw_label().to_string(),
                consumed,
                start_us,
                cpu,
                metered.elapsed().as_secs_f64(),
            ),
            published,
        ))
    };
    drop(broker);

    let outcome = StreamOutcome {
        sink: kind,
        belfry,
        submit,
        raw,
        broker_cpu_s,
        queue_state,
    };
    Ok(report(&args, machine, outcome))
}

fn report(args: &StreamArgs, machine: Machine, outcome: StreamOutcome) -> Report {
    let burst = args.window_s == 0;
    let title = if burst {
        format!(
            "{}: {} tasks all due at once, read back by a consumer",
            outcome.sink.title(),
            thousands(args.tasks as f64)
        )
    } else {
        format!(
            "{}: {} tasks due over {} s ({} due/s), read back by a consumer",
            outcome.sink.title(),
            thousands(args.tasks as f64),
            args.window_s,
            thousands(args.tasks as f64 / args.window_s as f64)
        )
    };
    let mut table = Table::new(
        title,
        &[
            "system",
            "delivered",
            "delivered/s",
            "÷ raw publish",
            "p50",
            "p99",
            "p99.9",
            "max",
            "early",
            "lost",
            "duplicates",
            "due-time metadata wrong",
        ],
    );
    let raw_rate = outcome.raw.as_ref().map(|(p, _)| p.delivered_per_s);
    let phases = std::iter::once(&outcome.belfry).chain(outcome.raw.as_ref().map(|(p, _)| p));
    for phase in phases {
        let d = &phase.delivery;
        let is_raw = !std::ptr::eq(phase, &outcome.belfry);
        let lateness = |v: u64| {
            if is_raw {
                "-".to_string()
            } else {
                format_us(v)
            }
        };
        table.row(vec![
            phase.label.clone(),
            format!(
                "{}/{}",
                thousands(d.delivered as f64),
                thousands(d.expected as f64)
            ),
            thousands(phase.delivered_per_s),
            raw_rate.map_or("-".into(), |r| ratio(phase.delivered_per_s, r)),
            lateness(d.lateness.p50_us),
            lateness(d.lateness.p99_us),
            lateness(d.lateness.p999_us),
            lateness(d.lateness.max_us),
            d.early.to_string(),
            d.lost.to_string(),
            d.duplicates.to_string(),
            if is_raw {
                "-".into()
            } else {
                phase.due_mismatches.to_string()
            },
        ]);
    }

    let mut notes = Vec::new();
    let b = &outcome.belfry;
    let s = &outcome.submit;
    notes.push(format!(
        "submit: {} tasks in {} requests over {} connections in {:.2} s ({} failed requests, {} rejected); {} answered after their due time.",
        thousands(s.accepted as f64),
        thousands(s.requests as f64),
        args.connections,
        s.elapsed_s,
        s.failed_requests,
        s.rejected,
        s.answered_after_due
    ));
    notes.push(format!(
        "belfry: from the first due time to the end of the consumer ({:.2} s, including {} ms of watching for duplicates) the server used {} CPU s, the broker {}, the bench (consumer) {:.2}; the queue then showed {}.",
        b.cpu_wall_s,
        DUPLICATE_WATCH.as_millis(),
        b.cpu
            .server_cores
            .map_or("?".into(), |c| format!("{:.2}", c * b.cpu_wall_s)),
        outcome
            .broker_cpu_s
            .map_or("?".into(), |c| format!("{c:.2}")),
        b.cpu.client_cores * b.cpu_wall_s,
        outcome.queue_state
    ));
    for phase in std::iter::once(b).chain(outcome.raw.as_ref().map(|(p, _)| p)) {
        if phase.read_errors > 0 || phase.unreadable > 0 {
            notes.push(format!(
                "{}: {} consumer read errors (first: {}), {} unreadable messages.",
                phase.label,
                phase.read_errors,
                phase.first_read_error.as_deref().unwrap_or("-"),
                phase.unreadable
            ));
        }
    }
    if let Some((raw, published)) = &outcome.raw {
        notes.push(format!(
            "{}: {} messages with the sink's metadata in batches of {}, {} batches in flight; {} acknowledged in {:.2} s ({} tasks/s by acknowledgement), {} failed batches{}; the broker used {} CPU s, the bench {:.2}, until the consumer's end.",
            raw.label,
            thousands(args.tasks as f64),
            args.publish_batch,
            args.publish_in_flight,
            thousands(published.acknowledged as f64),
            published.elapsed_s,
            thousands(published.acknowledged as f64 / published.elapsed_s.max(1e-9)),
            published.failed_batches,
            published
                .first_error
                .as_deref()
                .map_or(String::new(), |e| format!(" (first: {e})")),
            raw.cpu
                .server_cores
                .map_or("?".into(), |c| format!("{:.2}", c * raw.cpu_wall_s)),
            raw.cpu.client_cores * raw.cpu_wall_s
        ));
        if burst {
            let share = b.delivered_per_s / raw.delivered_per_s.max(1e-9);
            notes.push(format!(
                "target (issue #11) burst ≥ {:.0}% of the raw publish rate: {} ({:.0}%).",
                BURST_SHARE_OF_RAW_TARGET * 100.0,
                if share >= BURST_SHARE_OF_RAW_TARGET && b.delivery.lost == 0 {
                    "met"
                } else {
                    "MISSED"
                },
                share * 100.0
            ));
        }
    }
    if !burst {
        let p99 = b.delivery.lateness.p99_us;
        notes.push(format!(
            "target (issue #11) lateness p99 ≤ {} at 10k due/s (this run: {} due/s), never early: p99 {} ({}), early {} ({}).",
            format_us(LATENESS_P99_US_TARGET),
            thousands(args.tasks as f64 / args.window_s as f64),
            if p99 <= LATENESS_P99_US_TARGET && b.delivery.lost == 0 { "met" } else { "MISSED" },
            format_us(p99),
            b.delivery.early,
            if b.delivery.early == 0 { "met" } else { "MISSED" }
        ));
    }
    notes.push(
        "delivered/s = distinct tasks received ÷ (last receipt − first due time; for the raw publish, − the first publish); lateness = the consumer's receipt − the task's due time, on this machine's clock; due-time metadata wrong = entries whose due_at_ms field / belfry-due-at header differs from the submitted due time. The broker was started by the run on a free loopback port and stopped by its pid.".into(),
    );

    Report {
        scenario: format!(
            "stream-{}{}",
            outcome.sink.name(),
            if burst { "-burst" } else { "" }
        ),
        command: crate::command_line(),
        machine,
        tables: vec![table],
        notes,
        picture: None,
        data: serde_json::to_value(&outcome).unwrap_or(serde_json::Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishes a few thousand messages with the raw baseline to a real broker started for
    /// the test and reads them back with the bench's consumer: everything arrives once, the
    /// due-time metadata round-trips. A missing broker binary fails the test with a hint.
    async fn round_trip(kind: SinkKind) {
        let broker = Broker::start(kind, None)
            .await
            .unwrap_or_else(|e| panic!("{e:#} (scripts/test.sh installs the brokers)"));
        let channel = Channel::new(kind, "test");
        broker.prepare(&channel).await.expect("prepare the channel");
        let tasks = 3_000u64;
        let now_ms = unix_ms();
        let due = Arc::new(vec![now_ms; tasks as usize]);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let consumer = tokio::spawn(consume(
            broker.url(),
            kind,
            channel.clone(),
            due,
            Instant::now() + Duration::from_secs(20),
            2,
            ready_tx,
        ));
        ready_rx.await.expect("consumer ready");
        let published = publish_raw(&broker, &channel, raw_messages(tasks, now_ms, 64), 256, 4)
            .await
            .expect("publish");
        assert_eq!(
            (published.acknowledged, published.failed_batches),
            (tasks, 0)
        );
        let consumed = consumer.await.expect("consumer");
        let summary = consumed.tracker.summary();
        assert_eq!(
            (summary.delivered, summary.duplicates, summary.early),
            (tasks, 0, 0),
            "{:?}",
            consumed.first_read_error
        );
        assert_eq!((consumed.due_mismatches, consumed.unreadable), (0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_raw_publish_round_trips() {
        round_trip(SinkKind::Redis).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nats_raw_publish_round_trips() {
        round_trip(SinkKind::Nats).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kafka_raw_publish_round_trips() {
        round_trip(SinkKind::Kafka).await;
    }

    #[test]
    fn metadata_mismatch_and_unknown_payloads_are_counted() {
        let due = vec![100, 200];
        let mut consumed = Consumed {
            tracker: DeliveryTracker::new(due.clone()),
            due_mismatches: 0,
            unreadable: 0,
            read_errors: 0,
            first_read_error: None,
        };
        consumed.take(payload(0, 40).as_bytes(), Some(b"100"), &due, 150_000);
        consumed.take(payload(1, 40).as_bytes(), Some(b"199"), &due, 250_000);
        consumed.take(payload(1, 40).as_bytes(), None, &due, 260_000);
        consumed.take(b"garbage", Some(b"1"), &due, 1);
        assert_eq!((consumed.due_mismatches, consumed.unreadable), (2, 1));
        let s = consumed.tracker.summary();
        assert_eq!((s.delivered, s.duplicates, s.early), (2, 1, 0));
    }

    #[test]
    fn stream_requires_spawn_and_bounded_publishing() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: StreamArgs,
        }
        let parse = |extra: &[&str]| {
            let mut all = vec!["stream", "--sink", "redis"];
            all.extend_from_slice(extra);
            Cli::try_parse_from(all).expect("parses").args
        };
        assert!(parse(&["--spawn"]).validate().is_ok());
        let err = parse(&[]).validate().unwrap_err().to_string();
        assert!(err.contains("--spawn"), "{err}");
        let err = parse(&["--spawn", "--publish-batch", "257"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--publish-batch"), "{err}");
    }
}
