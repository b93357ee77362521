//! The claim script's batches: a claim larger than one batch (500 tasks per call inside the
//! script) takes exactly what it asked for, in due order, and leaves the rest due.

use belfry_core::{NewTask, QueueName};
use belfry_store::Store;
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

#[test]
fn a_claim_of_more_than_one_batch_takes_exactly_what_it_asks() {
    let server = RedisServer::start();
    let options = RedisOptions {
        namespace: "claim".into(),
        partitions: 1,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    let tasks = (0..1_200)
        .map(|i| NewTask::new(queue.clone(), 1_000 + i, "{}"))
        .collect();
    store.put(tasks).unwrap();
    let first = store.claim(&queue, 3_000, 1_100, 60_000).unwrap().leased;
    assert_eq!(first.len(), 1_100);
    let dues: Vec<u64> = first.iter().map(|t| t.task.due_at_ms).collect();
    assert_eq!(dues, (1_000..2_100).collect::<Vec<u64>>());
    // Every lease is its own.
    let mut leases: Vec<_> = first.iter().map(|t| t.lease_id).collect();
    leases.sort();
    leases.dedup();
    assert_eq!(leases.len(), 1_100);
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(2_100));
    let rest = store.claim(&queue, 3_000, 1_100, 60_000).unwrap().leased;
    assert_eq!(rest.len(), 100);
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(63_000));
}
