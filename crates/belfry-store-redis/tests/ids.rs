//! Task ids do not repeat across namespaces, nor after a Redis is emptied: a namespace's queue
//! uids (which ids carry) start at a random number, not at 1.

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_store::{PutOutcome, Store};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

fn first_id(server: &RedisServer, namespace: &str) -> TaskId {
    let options = RedisOptions {
        namespace: namespace.into(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    match store
        .put(vec![NewTask::new(queue, 1_000, "{}")])
        .unwrap()
        .pop()
    {
        Some(PutOutcome::Created { id, .. }) => id,
        other => panic!("expected a new task, got {other:?}"),
    }
}

#[test]
fn namespaces_do_not_repeat_task_ids() {
    let server = RedisServer::start();
    let (a, b) = (first_id(&server, "ids-a"), first_id(&server, "ids-b"));
    assert_ne!(a.0 >> 96, b.0 >> 96, "{a} and {b} carry the same queue uid");
}
