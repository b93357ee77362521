//! Finished tasks (done, cancelled, skipped) are kept for `finished_retention_ms`, with their
//! idempotency keys, then forgotten: a put after the retention gets a new task for the same
//! key, and reads no longer show the old one, even on a partition that nothing claims or
//! changes (only far-future keyed tasks), where nothing else would forget it.
//!
//! Time is explicit: a put's now is the store's `placement_now_ms`, so "before" and "after"
//! the retention are two stores on one namespace with two placement instants.

use belfry_core::{LatePolicy, NewTask, QueueName, TaskId, TaskState};
use belfry_store::{ChangeOutcome, LeaseOutcome, PutOutcome, Store};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

const RETENTION_MS: u64 = 1_000;
/// When the tasks finish.
const FINISH: u64 = 10_000;
/// A day after the finish: far-future tasks, placed in buckets that no claim reaches.
const FAR: u64 = FINISH + 86_400_000;

fn store_at(server: &RedisServer, namespace: &str, put_now_ms: u64) -> RedisStore {
    let options = RedisOptions {
        namespace: namespace.into(),
        partitions: 4,
        finished_retention_ms: RETENTION_MS,
        placement_now_ms: Some(put_now_ms),
        ..RedisOptions::default()
    };
    RedisStore::connect(&server.target(), options).unwrap()
}

fn keyed(queue: &QueueName, key: &str, due_at_ms: u64) -> NewTask {
    let mut task = NewTask::new(queue.clone(), due_at_ms, "{\"n\":1}");
    task.idempotency_key = Some(key.into());
    task
}

fn put_one(store: &RedisStore, task: NewTask) -> PutOutcome {
    store.put(vec![task]).unwrap().pop().unwrap()
}

fn created(outcome: &PutOutcome) -> TaskId {
    match outcome {
        PutOutcome::Created { id, .. } => *id,
        other => panic!("expected a new task, got {other:?}"),
    }
}

/// Three keyed tasks finished at `FINISH`: "cancelled" (a far task cancelled), "done" (leased
/// and acked) and "skipped" (found later than its late policy allows). Returns their ids.
fn finish_three(store: &RedisStore, queue: &QueueName) -> [TaskId; 3] {
    let cancelled = created(&put_one(store, keyed(queue, "cancelled", FAR)));
    assert_eq!(
        store.cancel(queue, cancelled, FINISH).unwrap(),
        ChangeOutcome::Ok
    );
    let done = created(&put_one(store, keyed(queue, "done", FINISH - 100)));
    let mut late = keyed(queue, "skipped", FINISH - 5_000);
    late.late_policy = LatePolicy::Skip { after_ms: 1_000 };
    let skipped = created(&put_one(store, late));
    let batch = store.claim(queue, FINISH, 10, 30_000).unwrap();
    assert_eq!(batch.late_skipped, [skipped]);
    let [leased] = &batch.leased[..] else {
        panic!("one task leased: {:?}", batch.leased);
    };
    assert_eq!(leased.task.id, done);
    let acked = store.ack(queue, done, leased.lease_id, FINISH).unwrap();
    assert_eq!(acked, LeaseOutcome::Ok);
    [cancelled, done, skipped]
}

#[test]
fn a_finished_task_keeps_its_key_for_the_retention_then_frees_it() {
    let server = RedisServer::start();
    let queue = QueueName::new("q").unwrap();
    let during = store_at(&server, "ret", FINISH + RETENTION_MS - 1);
    during.put_queue(&queue, Bytes::new()).unwrap();
    let ids = finish_three(&during, &queue);
    let states = [TaskState::Cancelled, TaskState::Done, TaskState::Skipped];

    // Within the retention: the key still names the finished task, as redis.md says.
    let last_ms = FINISH + RETENTION_MS - 1;
    for ((key, id), state) in ["cancelled", "done", "skipped"].iter().zip(ids).zip(states) {
        match put_one(&during, keyed(&queue, key, FAR)) {
            PutOutcome::Duplicate(task) => assert_eq!((task.id, task.state), (id, state)),
            other => panic!("{key}: a duplicate within the retention, got {other:?}"),
        }
        let by_key = during.get_by_key(&queue, key, last_ms).unwrap();
        assert_eq!(by_key.map(|t| (t.id, t.state)), Some((id, state)), "{key}");
        let by_id = during.get(&queue, id, last_ms).unwrap();
        assert_eq!(by_id.map(|t| t.state), Some(state), "{key}");
        // From the retention on, reads show nothing, whether or not it was forgotten yet.
        let after_ms = FINISH + RETENTION_MS;
        assert_eq!(during.get_by_key(&queue, key, after_ms).unwrap(), None);
        assert_eq!(during.get(&queue, id, after_ms).unwrap(), None, "{key}");
    }

    // Later (nothing claimed the partitions since): the same key submits a new task.
    let later_ms = FINISH + 60 * RETENTION_MS;
    let later = store_at(&server, "ret", later_ms);
    for (key, old) in ["cancelled", "done", "skipped"].iter().zip(ids) {
        let new = created(&put_one(&later, keyed(&queue, key, FAR)));
        assert_ne!(new, old, "{key}");
        let by_key = later.get_by_key(&queue, key, later_ms).unwrap().unwrap();
        assert_eq!((by_key.id, by_key.state), (new, TaskState::Scheduled));
        // The old record is forgotten, not only hidden: a read at an instant within its
        // retention finds nothing either.
        assert_eq!(later.get(&queue, old, FINISH).unwrap(), None, "{key}");
    }
}

/// A put forgets the finished tasks of its partition whose retention has passed, whatever
/// their keys: a partition written to but never claimed does not keep them.
#[test]
fn a_put_forgets_finished_tasks_past_the_retention() {
    let server = RedisServer::start();
    let queue = QueueName::new("q").unwrap();
    let options = |put_now_ms| RedisOptions {
        namespace: "forget".into(),
        partitions: 1,
        finished_retention_ms: RETENTION_MS,
        placement_now_ms: Some(put_now_ms),
        ..RedisOptions::default()
    };
    let early = RedisStore::connect(&server.target(), options(FINISH)).unwrap();
    early.put_queue(&queue, Bytes::new()).unwrap();
    let old = created(&put_one(&early, keyed(&queue, "a", FAR)));
    assert_eq!(
        early.cancel(&queue, old, FINISH).unwrap(),
        ChangeOutcome::Ok
    );
    assert!(early.get(&queue, old, FINISH).unwrap().is_some());

    let late = RedisStore::connect(&server.target(), options(FINISH + RETENTION_MS)).unwrap();
    created(&put_one(&late, keyed(&queue, "b", FAR)));
    // Read at the finish instant, when it would still show: it is gone from Redis.
    assert_eq!(late.get(&queue, old, FINISH).unwrap(), None);
    assert_eq!(late.get_by_key(&queue, "a", FINISH).unwrap(), None);
}

/// A finished task's record keeps no payload on Redis: the task says its payload was dropped
/// (the API then leaves the field out), where a live or dead one carries it.
#[test]
fn a_finished_task_says_its_payload_was_dropped() {
    let server = RedisServer::start();
    let queue = QueueName::new("q").unwrap();
    let store = store_at(&server, "dropped", FINISH);
    store.put_queue(&queue, Bytes::new()).unwrap();
    let id = created(&put_one(&store, keyed(&queue, "a", FAR)));
    let live = store.get(&queue, id, FINISH).unwrap().unwrap();
    assert!(!live.payload_dropped);
    assert_eq!(&live.payload[..], b"{\"n\":1}");
    assert_eq!(store.cancel(&queue, id, FINISH).unwrap(), ChangeOutcome::Ok);
    let finished = store.get(&queue, id, FINISH).unwrap().unwrap();
    assert_eq!(finished.state, TaskState::Cancelled);
    assert!(finished.payload_dropped, "{finished:?}");
    // The same through the key, and as a duplicate within the retention.
    assert!(
        store
            .get_by_key(&queue, "a", FINISH)
            .unwrap()
            .unwrap()
            .payload_dropped
    );
    match put_one(&store, keyed(&queue, "a", FAR)) {
        PutOutcome::Duplicate(task) => assert!(task.payload_dropped),
        other => panic!("a duplicate within the retention, got {other:?}"),
    }
}
