//! The baseline: the same payloads published raw with the broker's own client.

use super::*;

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
pub(super) struct RawMessage {
    task_id: String,
    due_at_ms: u64,
    payload: Bytes,
}

pub(super) fn raw_messages(tasks: u64, due_at_ms: u64, payload_bytes: usize) -> Vec<RawMessage> {
    (0..tasks)
        .map(|i| RawMessage {
            task_id: format!("{:032x}", u128::from(i) + 1),
            due_at_ms,
            payload: Bytes::from(payload(i, payload_bytes)),
        })
        .collect()
}

/// Publishes `messages` to `channel` in batches of `batch`, `in_flight` batches at once.
pub(super) async fn publish_raw(
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
    let (started, results) = match broker.kind {
        SinkKind::Redis => publish_redis(broker, channel, &messages, batches, in_flight).await?,
        SinkKind::Nats => publish_nats(broker, channel, &messages, batches, in_flight).await?,
        SinkKind::Kafka => publish_kafka(broker, channel, &messages, batches, in_flight).await?,
    };
    let elapsed_s = started.elapsed().as_secs_f64();
    Ok(tally(results, elapsed_s))
}

/// One batch's outcome: the messages acknowledged, or why it failed.
type BatchResult = Result<u64, String>;

/// XADD pipelines of a batch each, `in_flight` at once; timed from the first one.
async fn publish_redis(
    broker: &Broker,
    channel: &Channel,
    messages: &Arc<Vec<RawMessage>>,
    batches: Vec<std::ops::Range<usize>>,
    in_flight: usize,
) -> anyhow::Result<(Instant, Vec<BatchResult>)> {
    let url = broker.url();
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let started = Instant::now();
    let results: Vec<BatchResult> = futures_util::stream::iter(batches.into_iter().map(|range| {
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
            match tokio::time::timeout(PUBLISH_TIMEOUT, pipe.query_async::<()>(&mut conn)).await {
                Ok(Ok(())) => Ok(range.len() as u64),
                Ok(Err(e)) => Err(format!("XADD pipeline: {e}")),
                Err(_) => Err("XADD pipeline timed out".into()),
            }
        }
    }))
    .buffer_unordered(in_flight)
    .collect()
    .await;
    Ok((started, results))
}

/// JetStream publishes with the sinks' headers; timed from the first one.
async fn publish_nats(
    broker: &Broker,
    channel: &Channel,
    messages: &Arc<Vec<RawMessage>>,
    batches: Vec<std::ops::Range<usize>>,
    in_flight: usize,
) -> anyhow::Result<(Instant, Vec<BatchResult>)> {
    let url = broker.url();
    use async_nats::header::HeaderMap;
    let client = async_nats::connect(url.as_str()).await?;
    let jetstream = async_nats::jetstream::new(client);
    let started = Instant::now();
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
    Ok((started, results))
}

/// Produce requests of a batch each to partition 0, `in_flight` at once; timed from the
/// first one.
async fn publish_kafka(
    broker: &Broker,
    channel: &Channel,
    messages: &Arc<Vec<RawMessage>>,
    batches: Vec<std::ops::Range<usize>>,
    in_flight: usize,
) -> anyhow::Result<(Instant, Vec<BatchResult>)> {
    let url = broker.url();
    use rskafka::client::partition::{Compression, UnknownTopicHandling};
    let client = kafka_client(&url).await?;
    let partition = Arc::new(
        client
            .partition_client(channel.name.clone(), 0, UnknownTopicHandling::Retry)
            .await?,
    );
    super::broker::kafka_nodelay(&url).await;
    let started = Instant::now();
    let results: Vec<BatchResult> = futures_util::stream::iter(batches.into_iter().map(|range| {
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
    .await;
    Ok((started, results))
}

/// The batches' outcomes added up.
fn tally(results: Vec<BatchResult>, elapsed_s: f64) -> Published {
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
    published
}

// ---- the scenario ----
