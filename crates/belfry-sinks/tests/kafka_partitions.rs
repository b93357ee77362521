//! The Kafka sink follows a change of its topic's partition count, against a real Tansu broker
//! on loopback (the conformance suite's harness): keyed records go where Kafka's default
//! partitioner puts them for the count the topic has now, not the one read at connect.
#![cfg(feature = "kafka")]

#[allow(dead_code)]
#[path = "conformance/servers.rs"]
mod servers;

use std::time::Duration;

use belfry_core::TaskId;
use belfry_sinks::kafka::partition_for_key;
use belfry_sinks::testing::wait_until;
use belfry_sinks::{Attempt, KafkaConfig, KafkaKey, KafkaSink, Outcome, Sink};
use bytes::Bytes;
use servers::KafkaServer;

const TOPIC: &str = "parts";

fn task(n: u128) -> belfry_core::Task {
    belfry_sinks::testing::leased_task(
        TaskId(0x9a27_0000_0000_0000_0000_0000_0000_0000 + n),
        "parts",
        1_700_000_000_000,
        Bytes::from_static(b"{}"),
    )
}

/// Every (partition, key) the topic holds.
async fn records(server: &KafkaServer, partitions: i32) -> Vec<(i32, Vec<u8>)> {
    let client = server.client().await;
    let mut out = Vec::new();
    for partition in 0..partitions {
        let reader = client
            .partition_client(
                TOPIC,
                partition,
                rskafka::client::partition::UnknownTopicHandling::Retry,
            )
            .await
            .expect("partition client");
        let (fetched, _) = reader
            .fetch_records(0, 1..10_000_000, 500)
            .await
            .expect("fetch");
        for record in fetched {
            out.push((partition, record.record.key.unwrap_or_default()));
        }
    }
    out
}

/// Deletes the topic and creates it again with `partitions` (Tansu cannot add partitions to
/// a topic; to a producer that keeps its connection, a re-created topic looks the same).
async fn recreate(server: &KafkaServer, partitions: i32) {
    let client = server.client().await;
    client
        .controller_client()
        .expect("controller client")
        .delete_topic(TOPIC, 5_000)
        .await
        .expect("delete topic");
    wait_until("the topic gone from the metadata", || {
        let client = &client;
        async move {
            client
                .list_topics()
                .await
                .is_ok_and(|topics| topics.iter().all(|t| t.name != TOPIC))
        }
    })
    .await;
    server.create_topic(TOPIC, partitions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_follow_added_partitions() {
    let server = KafkaServer::start().await;
    server.create_topic(TOPIC, 1).await;
    let mut config = KafkaConfig::new(vec![server.broker()], TOPIC);
    config.key = KafkaKey::TaskId;
    // Read the partition list before every batch, so no test waits for it to age.
    config.metadata_max_age = Duration::ZERO;
    let sink = KafkaSink::new(config).expect("valid config");
    // Connected, with the topic's one partition.
    assert_eq!(sink.deliver(&task(0), 1, 0).await, Outcome::Delivered);

    recreate(&server, 4).await;
    let tasks: Vec<_> = (1..=40).map(task).collect();
    let batch: Vec<_> = tasks
        .iter()
        .map(|task| Attempt { task, attempt: 1 })
        .collect();
    let outcomes = sink.deliver_batch(&batch, 0).await;
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Delivered),
        "{outcomes:?}"
    );

    let stored = records(&server, 4).await;
    assert_eq!(stored.len(), 40, "{stored:?}");
    for (partition, key) in &stored {
        assert_eq!(
            *partition as usize,
            partition_for_key(key, 4),
            "key {} is in partition {partition}, not where Kafka's partitioner puts it for 4 partitions",
            String::from_utf8_lossy(key)
        );
    }
    let used: std::collections::BTreeSet<_> = stored.iter().map(|(p, _)| *p).collect();
    assert!(used.len() > 1, "all in {used:?}");
}
