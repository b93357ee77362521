//! Task ids do not repeat across stores: a new data directory (or memory store) does not count
//! from 1 again, or a consumer deduplicating on ids (JetStream's `Nats-Msg-Id`, a receiver's
//! table of processed ids) would drop its tasks as repeats of another store's. Within a store
//! they keep growing across reopens.

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_store::{Engine, EngineOptions, MemoryStore, PutOutcome, Store};
use bytes::Bytes;

fn first_ids(store: &dyn Store, n: usize) -> Vec<TaskId> {
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    let tasks = (0..n)
        .map(|_| NewTask::new(queue.clone(), 1_000, "{}"))
        .collect();
    store
        .put(tasks)
        .unwrap()
        .into_iter()
        .map(|outcome| match outcome {
            PutOutcome::Created { id, .. } => id,
            other => panic!("expected a new task, got {other:?}"),
        })
        .collect()
}

#[test]
fn new_data_directories_do_not_repeat_ids_and_a_reopen_keeps_counting() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open =
        |dir: &tempfile::TempDir| Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let first_a = first_ids(&open(&a), 3);
    let first_b = first_ids(&open(&b), 3);
    assert!(
        first_a.iter().all(|id| !first_b.contains(id)),
        "{first_a:?} and {first_b:?}"
    );
    // Reopened, the same directory goes on from where it was.
    let again = first_ids(&open(&a), 1);
    assert!(
        again[0].0 >> 64 > first_a[2].0 >> 64,
        "{again:?} after {first_a:?}"
    );
}

#[test]
fn a_set_first_sequence_number_gives_reproducible_ids() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions {
        first_seq: Some(1),
        ..EngineOptions::default()
    };
    let ids = first_ids(&Engine::open(dir.path(), options).unwrap(), 2);
    assert_eq!(ids.iter().map(|id| id.0 >> 64).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn new_memory_stores_do_not_repeat_ids() {
    let first_a = first_ids(&MemoryStore::new(), 3);
    let first_b = first_ids(&MemoryStore::new(), 3);
    assert!(
        first_a.iter().all(|id| !first_b.contains(id)),
        "{first_a:?} and {first_b:?}"
    );
}
