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
//!
//! By job: this file holds the arguments, the run and its outcome; `broker.rs` starts the
//! broker and connects to it, `consume.rs` reads it back, `raw.rs` publishes the baseline,
//! `report.rs` writes the report.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::error::within;
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::report::{ratio, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::{format_us, DeliverySummary, DeliveryTracker};
use crate::sys::{free_port, unix_ms, unix_us, CpuMeter, CpuUse, Machine};
use crate::workload::{due_times, parse_index, payload, validate, Bodies};
use crate::{OutputArgs, ServerArgs};

mod broker;
mod consume;
mod raw;
mod report;

use broker::kafka_client;
pub use broker::{broker_bin, Broker};
pub use consume::{consume, Channel, Consumed};
pub use raw::Published;
use raw::{publish_raw, raw_messages};

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
    /// the measured lateness. With 2 ms waits at 10k due/s (before the consumer set
    /// TCP_NODELAY), Tansu spent ~0.8 core on fetches and the consumer stopped seeing records
    /// after about half of them; with 5 ms waits it spent 0.6 core and every record arrived.
    /// The default trades ≤ 10 ms of lateness for a consumer that costs the broker less
    /// (20 ms waits put the 10k due/s p99 at 16–24 ms, 10 ms waits at 16 ms).
    #[arg(long, default_value_t = 10)]
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
        within("--publish-batch", self.publish_batch, 1, PUBLISH_BATCH_MAX)?;
        within(
            "--publish-in-flight",
            self.publish_in_flight,
            1,
            PUBLISH_IN_FLIGHT_MAX,
        )?;
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
    let belfry = belfry_phase(&args, &broker).await?;
    let raw = if args.no_baseline {
        None
    } else {
        Some(raw_phase(&args, &broker).await?)
    };
    drop(broker);

    let outcome = StreamOutcome {
        sink: kind,
        belfry: belfry.phase,
        submit: belfry.submit,
        raw,
        broker_cpu_s: belfry.broker_cpu_s,
        queue_state: belfry.queue_state,
    };
    Ok(report::report(&args, machine, outcome))
}

/// What belfry's phase measured, beside the delivery itself.
struct BelfryPhase {
    phase: PhaseOutcome,
    submit: IngestOutcome,
    broker_cpu_s: Option<f64>,
    queue_state: String,
}

/// Belfry's phase: a server delivering into the broker, the tasks submitted ahead of their
/// due times, the consumer reading them back; CPU is measured from the first due time.
async fn belfry_phase(args: &StreamArgs, broker: &Broker) -> anyhow::Result<BelfryPhase> {
    let kind = args.sink;
    let belfry_channel = Channel::new(kind, "belfry");
    broker.prepare(&belfry_channel).await?;
    let queue = "bench-stream";
    let server = start_server(args, broker, &belfry_channel, queue).await?;

    let first_due_ms = unix_ms() + args.lead_s * 1_000;
    let due = Arc::new(due_times(args.tasks, first_due_ms, args.window_s * 1_000));
    let last_due_ms = due.last().copied().unwrap_or(first_due_ms);
    let deadline = Instant::now()
        + Duration::from_millis(last_due_ms.saturating_sub(unix_ms()))
        + Duration::from_secs(args.grace_s);
    let consumer = start_consumer(args, broker, &belfry_channel, due.clone(), deadline).await?;
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
            keep_ids: None,
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
    let broker_cpu_start = broker_cpu(broker);
    let metered = Instant::now();
    let consumed = consumer.await.context("the consumer panicked")?;
    let cpu = meter.stop();
    let cpu_wall_s = metered.elapsed().as_secs_f64();
    let broker_cpu_s = broker_cpu(broker)
        .zip(broker_cpu_start)
        .map(|(end, start)| end.saturating_sub(start).as_secs_f64());
    // What the server still holds explains tasks the consumer never saw.
    let queue_state = queue_state(&server.target, queue).await;
    server.stop();
    let phase = PhaseOutcome::from(
        format!("belfry → {}", kind.title()),
        consumed,
        first_due_ms * 1_000,
        cpu,
        cpu_wall_s,
    );
    Ok(BelfryPhase {
        phase,
        submit,
        broker_cpu_s,
        queue_state,
    })
}

/// The server under test, configured to reach the broker, with `queue` delivering into
/// `channel`.
async fn start_server(
    args: &StreamArgs,
    broker: &Broker,
    channel: &Channel,
    queue: &str,
) -> anyhow::Result<ServerUnderTest> {
    let env = broker.server_env();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = ServerUnderTest::connect_or_spawn(&args.server, &env_refs).await?;
    let body = serde_json::json!({ "delivery": channel.delivery(args.sink) }).to_string();
    create_queue(&server.target, queue, &body).await?;
    Ok(server)
}

/// Starts a consumer of `channel` expecting `due`, reading until `deadline`, and waits
/// until it is ready to read.
async fn start_consumer(
    args: &StreamArgs,
    broker: &Broker,
    channel: &Channel,
    due: Arc<Vec<u64>>,
    deadline: Instant,
) -> anyhow::Result<tokio::task::JoinHandle<Consumed>> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let consumer = tokio::spawn(consume(
        broker.url(),
        args.sink,
        channel.clone(),
        due,
        deadline,
        args.kafka_fetch_wait_ms as i32,
        ready_tx,
    ));
    ready_rx.await.context("the consumer did not start")?;
    Ok(consumer)
}

/// The baseline: the same number of messages published straight to the broker, read back
/// by the same consumer; CPU is the broker's, from the first publish.
async fn raw_phase(
    args: &StreamArgs,
    broker: &Broker,
) -> anyhow::Result<(PhaseOutcome, Published)> {
    let kind = args.sink;
    let channel = Channel::new(kind, "raw");
    broker.prepare(&channel).await?;
    let now_ms = unix_ms();
    let raw_due = Arc::new(vec![now_ms; args.tasks as usize]);
    let messages = raw_messages(args.tasks, now_ms, args.payload_bytes);
    let deadline = Instant::now() + Duration::from_secs(args.grace_s.max(1) * 2);
    let consumer = start_consumer(args, broker, &channel, raw_due, deadline).await?;
    let meter = CpuMeter::start(broker.pid());
    let metered = Instant::now();
    let start_us = unix_us();
    let published = publish_raw(
        broker,
        &channel,
        messages,
        args.publish_batch,
        args.publish_in_flight,
    )
    .await?;
    let consumed = consumer.await.context("the consumer panicked")?;
    let cpu = meter.stop();
    Ok((
        PhaseOutcome::from(
            kind.raw_label().to_string(),
            consumed,
            start_us,
            cpu,
            metered.elapsed().as_secs_f64(),
        ),
        published,
    ))
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
