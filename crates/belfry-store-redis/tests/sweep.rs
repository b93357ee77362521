//! The fallback sweep: work whose wake-up index (the queue's hint) a crash lost between a
//! put's script and its hint update is found again by the next sweep, not stranded.

use belfry_core::{NewTask, QueueName};
use belfry_store::Store;
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

#[test]
fn a_lost_hint_is_rebuilt_by_the_sweep() {
    let server = RedisServer::start();
    let (store, queue) = store_with_queue(&server);
    let tasks = (0..5)
        .map(|i| NewTask::new(queue.clone(), 1_000 + i, "{}"))
        .collect();
    store.put(tasks).unwrap();
    // The crash: the hint never heard of these tasks.
    let mut con = server.connection();
    // The hint itself (`{ns/h<uid>}`), not its versions (`{ns/h<uid>}:v`).
    let hints: Vec<String> = redis::cmd("KEYS")
        .arg("{sweep/h*}")
        .query(&mut con)
        .unwrap();
    assert_eq!(hints.len(), 1, "{hints:?}");
    redis::cmd("DEL").arg(&hints[0]).exec(&mut con).unwrap();
    assert!(store
        .claim(&queue, 2_000, 10, 1_000)
        .unwrap()
        .leased
        .is_empty());
    assert_eq!(store.next_due_ms(&queue).unwrap(), None);
    store.sweep().unwrap();
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(1_000));
    assert_eq!(
        store.claim(&queue, 2_000, 10, 1_000).unwrap().leased.len(),
        5
    );
}

/// A Redis that lost the hint script (flushed, then given the read script alone, so the
/// sweep's reads pass and its hint updates meet NOSCRIPT): the sweep loads the scripts and
/// updates the hints all the same, instead of failing as a corrupt reply.
#[test]
fn the_sweep_survives_a_redis_that_lost_the_hint_script() {
    let server = RedisServer::start();
    let (store, queue) = store_with_queue(&server);
    store
        .put(vec![NewTask::new(queue.clone(), 1_000, "{}")])
        .unwrap();
    let mut con = server.connection();
    let hints: Vec<String> = redis::cmd("KEYS")
        .arg("{sweep/h*}")
        .query(&mut con)
        .unwrap();
    redis::cmd("DEL").arg(&hints[0]).exec(&mut con).unwrap();
    redis::cmd("SCRIPT").arg("FLUSH").exec(&mut con).unwrap();
    let read = concat!(
        include_str!("../src/lua/prelude.lua"),
        include_str!("../src/lua/read.lua")
    );
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(read)
        .query(&mut con)
        .unwrap();
    store.sweep().unwrap();
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(1_000));
}

/// A store on `server` (8 partitions) holding queue "q".
fn store_with_queue(server: &RedisServer) -> (RedisStore, QueueName) {
    let options = RedisOptions {
        namespace: "sweep".into(),
        partitions: 8,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    (store, queue)
}
