//! The Redis sorted-set baseline against a real redis-server on a free loopback port (the
//! sinks' broker harness, included by path): what it stores on submit, that nothing is
//! claimed before it is due, that concurrent claimers take each due task exactly once, that
//! a claim removes what it took, and that the counts it reports match Redis. A missing
//! redis-server fails the test with an install hint.

#[allow(dead_code)]
#[path = "../../belfry-sinks/tests/conformance/servers.rs"]
mod servers;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_bench::redis_queue::{self, Consume, QueueKeys, Submit};
use belfry_bench::stats::DeliveryTracker;
use belfry_bench::sys::unix_ms;
use belfry_bench::workload::{parse_index, payload};
use redis::AsyncCommands;
use servers::RedisServer;

const PAYLOAD_BYTES: usize = 64;

async fn submit(url: &str, keys: &QueueKeys, due: &[u64], batch: usize) -> u64 {
    let outcome = redis_queue::ingest(
        Submit {
            url,
            pid: None,
            keys,
            batch,
            connections: 3,
            payload_bytes: PAYLOAD_BYTES,
        },
        due,
        indicatif::ProgressBar::hidden(),
        "redis",
    )
    .await
    .expect("submit to redis");
    assert_eq!(outcome.rejected, 0, "{:?}", outcome.first_error);
    assert_eq!(outcome.requests, due.len().div_ceil(batch) as u64);
    outcome.accepted
}

async fn sizes(server: &RedisServer, keys: &QueueKeys) -> (u64, u64) {
    let mut conn = server.connection().await;
    let due: u64 = conn.zcard(&keys.due).await.unwrap();
    let payloads: u64 = conn.hlen(&keys.payloads).await.unwrap();
    (due, payloads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_store_each_task_with_its_due_time_and_payload() {
    let server = RedisServer::start().await;
    let keys = QueueKeys::new("stored");
    let due: Vec<u64> = (0..250).map(|i| 1_000_000 + i * 7).collect();
    assert_eq!(submit(&server.url(), &keys, &due, 40).await, 250);
    assert_eq!(sizes(&server, &keys).await, (250, 250));
    let mut conn = server.connection().await;
    for i in [0u64, 1, 39, 40, 123, 249] {
        let score: Option<f64> = conn.zscore(&keys.due, i).await.unwrap();
        assert_eq!(score, Some(due[i as usize] as f64), "task {i}");
        let stored: Vec<u8> = conn.hget(&keys.payloads, i).await.unwrap();
        assert_eq!(stored, payload(i, PAYLOAD_BYTES).into_bytes(), "task {i}");
    }
    redis_queue::delete_queue(&server.url(), &keys)
        .await
        .unwrap();
    assert_eq!(sizes(&server, &keys).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_takes_only_due_tasks_earliest_first_and_removes_them() {
    let server = RedisServer::start().await;
    let keys = QueueKeys::new("due-only");
    let now = unix_ms();
    // Tasks 0..10 due in the past (latest first, to check the order), 10..20 an hour ahead.
    let due: Vec<u64> = (0..20)
        .map(|i| {
            if i < 10 {
                now - 1_000 - i * 10
            } else {
                now + 3_600_000
            }
        })
        .collect();
    submit(&server.url(), &keys, &due, 7).await;
    let script = redis_queue::claim_script();
    let mut conn = redis_queue::connect(&server.url()).await.unwrap();

    let first = redis_queue::claim(&mut conn, &script, &keys, now, 4)
        .await
        .unwrap();
    let indices: Vec<u64> = first
        .iter()
        .map(|p| parse_index(p.as_deref().expect("payload present")).unwrap())
        .collect();
    assert_eq!(indices, vec![9, 8, 7, 6], "at most max, earliest due first");
    assert_eq!(
        sizes(&server, &keys).await,
        (16, 16),
        "claimed ones removed"
    );

    let rest = redis_queue::claim(&mut conn, &script, &keys, now, 1_000)
        .await
        .unwrap();
    assert_eq!(
        rest.len(),
        6,
        "the other due tasks, and nothing not yet due"
    );
    let none = redis_queue::claim(&mut conn, &script, &keys, now, 1_000)
        .await
        .unwrap();
    assert!(none.is_empty());
    assert_eq!(sizes(&server, &keys).await, (10, 10));
    // Once their time comes, the rest are claimable too.
    let later = redis_queue::claim(&mut conn, &script, &keys, now + 3_600_000, 1_000)
        .await
        .unwrap();
    assert_eq!(later.len(), 10);
    assert_eq!(sizes(&server, &keys).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_take_each_due_task_exactly_once() {
    const TASKS: u64 = 3_000;
    const CLAIMERS: usize = 6;
    let server = RedisServer::start().await;
    let keys = QueueKeys::new("exactly-once");
    let now = unix_ms();
    let due: Vec<u64> = (0..TASKS).map(|i| now - 60_000 + i % 1_000).collect();
    submit(&server.url(), &keys, &due, 100).await;
    let mut claimers = Vec::new();
    for _ in 0..CLAIMERS {
        let (url, keys) = (server.url(), keys.clone());
        claimers.push(tokio::spawn(async move {
            let script = redis_queue::claim_script();
            let mut conn = redis_queue::connect(&url).await.unwrap();
            let mut taken = Vec::new();
            loop {
                let batch = redis_queue::claim(&mut conn, &script, &keys, now, 17)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return taken;
                }
                for p in batch {
                    taken.push(parse_index(&p.expect("payload present")).unwrap());
                }
            }
        }));
    }
    let mut seen = HashSet::new();
    let mut claimed = 0;
    for claimer in claimers {
        for index in claimer.await.unwrap() {
            claimed += 1;
            assert!(seen.insert(index), "task {index} claimed twice");
        }
    }
    assert_eq!(claimed, TASKS);
    assert_eq!(seen, (0..TASKS).collect::<HashSet<_>>());
    assert_eq!(sizes(&server, &keys).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_counts_what_redis_delivered_never_early_never_twice() {
    const TASKS: u64 = 1_200;
    let server = RedisServer::start().await;
    let keys = QueueKeys::new("consume");
    let now = unix_ms();
    // The first half is due at once, the second 400–800 ms from now.
    let due: Vec<u64> = (0..TASKS)
        .map(|i| {
            if i < TASKS / 2 {
                now - 10
            } else {
                now + 400 + (i - TASKS / 2) * 400 / (TASKS / 2)
            }
        })
        .collect();
    submit(&server.url(), &keys, &due, 50).await;
    let tracker = Arc::new(Mutex::new(DeliveryTracker::new(due.clone())));
    let started = Instant::now();
    redis_queue::consume(
        Consume {
            url: server.url(),
            keys: keys.clone(),
            consumers: 4,
            max: 64,
            poll_interval: Duration::from_millis(2),
            deadline: Instant::now() + Duration::from_secs(20),
        },
        tracker.clone(),
        indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap();
    let summary = tracker.lock().unwrap().summary();
    assert_eq!(summary.delivered, TASKS, "{summary:?}");
    assert_eq!((summary.lost, summary.duplicates), (0, 0), "{summary:?}");
    assert_eq!((summary.early, summary.unknown), (0, 0), "{summary:?}");
    // The consumer stopped once all had arrived, which needs the latest due time passed.
    assert!(unix_ms() >= due[TASKS as usize - 1]);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(sizes(&server, &keys).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_claims_nothing_before_it_is_due() {
    let server = RedisServer::start().await;
    let keys = QueueKeys::new("not-yet");
    let due: Vec<u64> = (0..100).map(|_| unix_ms() + 3_600_000).collect();
    submit(&server.url(), &keys, &due, 30).await;
    let tracker = Arc::new(Mutex::new(DeliveryTracker::new(due.clone())));
    redis_queue::consume(
        Consume {
            url: server.url(),
            keys: keys.clone(),
            consumers: 2,
            max: 100,
            poll_interval: Duration::from_millis(5),
            // Runs until this deadline, polling all along.
            deadline: Instant::now() + Duration::from_millis(300),
        },
        tracker.clone(),
        indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap();
    let summary = tracker.lock().unwrap().summary();
    assert_eq!((summary.delivered, summary.early), (0, 0), "{summary:?}");
    assert_eq!(sizes(&server, &keys).await, (100, 100));
}
