//! A Redis Cluster whose nodes require a password. The store's claims and lease changes of a
//! batch go to the masters over connections of its own (see `each.rs`), to addresses the
//! cluster reports: those connections must log in as the seeds did, or every batch across
//! partitions fails with `NOAUTH`.

use belfry_core::{LeaseId, NewTask, QueueName, TaskId, TaskState};
use belfry_store::{LeaseOutcome, Store};
use belfry_store_redis::testing::RedisCluster;
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget};
use bytes::Bytes;

const PASSWORD: &str = "s3cret-cluster";
const TASKS: u64 = 48;
const NOW: u64 = 10_000;

fn options() -> RedisOptions {
    RedisOptions {
        namespace: "auth".into(),
        partitions: 16,
        ..RedisOptions::default()
    }
}

#[test]
fn a_cluster_with_a_password_serves_batches_across_its_masters() {
    let cluster = RedisCluster::start_with_password(3, 0, PASSWORD);
    let url = cluster.url();
    assert!(
        url.starts_with(&format!("redis-cluster://:{PASSWORD}@")),
        "{url}"
    );
    // As an operator writes it: credentials once, before the first node.
    let target = RedisTarget::parse(&url).unwrap();
    assert!(!target.to_string().contains(PASSWORD), "{target}");
    let store = RedisStore::connect(&target, options()).unwrap();
    // The health check logs in to each master on a socket of its own.
    assert_eq!(store.health(), belfry_store::StoreHealth::Healthy);
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    // Keyed tasks spread over the 16 partitions, so the batches span all three masters.
    let tasks = (0..TASKS)
        .map(|i| {
            let mut task = NewTask::new(queue.clone(), 1_000 + i, "{}");
            task.idempotency_key = Some(format!("k{i}"));
            task
        })
        .collect();
    store.put(tasks).unwrap();

    let leased = store
        .claim(&queue, NOW, TASKS as usize, 60_000)
        .unwrap()
        .leased;
    assert_eq!(leased.len(), TASKS as usize, "claimed across the masters");
    let acks: Vec<(TaskId, LeaseId)> = leased.iter().map(|l| (l.task.id, l.lease_id)).collect();
    let outcomes = store.ack_many(&queue, &acks, NOW + 1).unwrap();
    assert!(
        outcomes.iter().all(|o| *o == LeaseOutcome::Ok),
        "{outcomes:?}"
    );
    for (id, _) in &acks {
        let task = store.get(&queue, *id, NOW + 1).unwrap();
        assert_eq!(task.map(|t| t.state), Some(TaskState::Done), "{id:?}");
    }
}

#[test]
fn a_wrong_password_is_a_clear_error() {
    let cluster = RedisCluster::start_with_password(3, 0, PASSWORD);
    let wrong = cluster.url().replace(PASSWORD, "not-it");
    let target = RedisTarget::parse(&wrong).unwrap();
    let Err(error) = RedisStore::connect(&target, options()) else {
        panic!("a wrong password is refused");
    };
    let error = error.to_string();
    assert!(
        error.to_lowercase().contains("auth") || error.contains("WRONGPASS"),
        "{error}"
    );
    assert!(
        !error.contains("not-it"),
        "the password is not echoed: {error}"
    );
}
