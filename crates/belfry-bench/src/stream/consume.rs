//! Reading the broker back: one consumer per sink kind, recording every receipt.

use super::*;

/// Where one phase's messages go: a Redis stream key, a NATS subject (in its own JetStream
/// stream), or a Kafka topic — all spelled `name`.
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    pub(super) nats_stream: String,
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
    pub(super) fn delivery(&self, kind: SinkKind) -> serde_json::Value {
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
    pub(super) fn take(
        &mut self,
        payload: &[u8],
        due_meta: Option<&[u8]>,
        due: &[u64],
        receipt_us: u64,
    ) {
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
/// `DUPLICATE_WATCH` after) or until `deadline`.
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
    super::broker::kafka_nodelay(broker).await;
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
