//! Idempotency keys on disk: checkpoints move each queue's key memtable into runs
//! (`engine/keys/runs.rs`), and a key keeps naming its live task through runs, merges,
//! restarts and crashes, while a finished task's key can be used again even though its entry
//! stays in a run. `stats()` shows the runs and their entries.

use belfry_core::{NewTask, QueueName, TaskId, TaskState};
use belfry_store::{ChangeOutcome, Engine, EngineOptions, FsyncPolicy, PutOutcome, Store};
use bytes::Bytes;

#[path = "support/damage.rs"]
mod damage;

const NOW: u64 = 1_700_000_000_000;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

fn options() -> EngineOptions {
    EngineOptions {
        fsync: FsyncPolicy::Never,
        // Merge as soon as two runs qualify, so a few checkpoints exercise merges.
        key_compaction_min_runs: 2,
        ..EngineOptions::default()
    }
}

fn queue(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn open(dir: &std::path::Path) -> Engine {
    let engine = Engine::open(dir, options()).unwrap();
    for name in ["orders", "mail"] {
        engine.put_queue(&queue(name), Bytes::new()).unwrap();
    }
    engine.counts(&queue("orders"), NOW).unwrap();
    engine
}

fn keyed(q: &str, key: &str, due: u64) -> NewTask {
    let mut task = NewTask::new(queue(q), due, Bytes::from(format!("payload of {key}")));
    task.idempotency_key = Some(key.to_string());
    task
}

/// Puts keys `from..to` of queue `q` (`order-{i}`), due `due(i)`, in calls of 500; returns
/// the ids, all of them new.
fn put_new(
    engine: &Engine,
    q: &str,
    range: std::ops::Range<usize>,
    due: impl Fn(usize) -> u64,
) -> Vec<TaskId> {
    let mut ids = Vec::new();
    let all: Vec<usize> = range.collect();
    for chunk in all.chunks(500) {
        let tasks = chunk
            .iter()
            .map(|&i| keyed(q, &format!("order-{i}"), due(i)))
            .collect();
        for outcome in engine.put(tasks).unwrap() {
            match outcome {
                PutOutcome::Created { id, .. } => ids.push(id),
                other => panic!("key {} was not new: {other:?}", ids.len()),
            }
        }
    }
    ids
}

/// The id a put of key `order-{i}` answers with, and whether it was a duplicate.
fn put_again(engine: &Engine, q: &str, i: usize, due: u64) -> (TaskId, bool) {
    let outcome = engine
        .put(vec![keyed(q, &format!("order-{i}"), due)])
        .unwrap()
        .remove(0);
    match outcome {
        PutOutcome::Created { id, .. } => (id, false),
        PutOutcome::Duplicate(task) => (task.id, true),
    }
}

fn far(i: usize) -> u64 {
    NOW + 30 * DAY_MS + i as u64
}

#[test]
fn checkpointed_keys_move_to_runs_and_still_find_their_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = put_new(&engine, "orders", 0..3_000, far);
    assert_eq!(engine.stats().key_runs, 0, "no checkpoint yet");
    engine.flush().unwrap();
    let stats = engine.stats();
    assert_eq!((stats.key_runs, stats.key_run_entries), (1, 3_000));
    // Every key is a duplicate of its task, in runs only; new keys and the same keys in
    // another queue are not.
    for i in (0..3_000).step_by(7) {
        assert_eq!(
            put_again(&engine, "orders", i, far(i)),
            (ids[i], true),
            "key {i}"
        );
        let by_key = engine.get_by_key(&queue("orders"), &format!("order-{i}"), NOW);
        assert_eq!(by_key.unwrap().map(|t| t.id), Some(ids[i]));
    }
    let (_, duplicate) = put_again(&engine, "orders", 3_000, far(3_000));
    assert!(!duplicate);
    let (_, duplicate) = put_again(&engine, "mail", 5, far(5));
    assert!(!duplicate, "keys are per queue");
    assert_eq!(
        engine.stats().buckets_loaded,
        0,
        "found through the point index"
    );
    // A clean close checkpoints: the two new keys go to a second run, listed with the first.
    drop(engine);
    let engine = open(dir.path());
    let stats = engine.stats();
    assert_eq!((stats.key_runs, stats.key_run_entries), (2, 3_002));
    for i in (0..3_000).step_by(11) {
        assert_eq!(
            put_again(&engine, "orders", i, far(i)),
            (ids[i], true),
            "key {i}"
        );
    }
}

#[test]
fn a_finished_task_frees_its_key_though_its_entry_stays_in_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    // Near tasks (due within the hour) to lease and ack; far ones to cancel.
    let near = put_new(&engine, "orders", 0..200, |i| NOW + 1_000 + i as u64);
    let far_ids = put_new(&engine, "orders", 200..400, far);
    engine.flush().unwrap();
    assert_eq!(engine.stats().key_run_entries, 400);
    let batch = engine
        .claim(&queue("orders"), NOW + HOUR_MS, 100, 60_000)
        .unwrap();
    assert_eq!(batch.leased.len(), 100);
    for leased in &batch.leased {
        let outcome = engine
            .ack(
                &queue("orders"),
                leased.task.id,
                leased.lease_id,
                NOW + HOUR_MS,
            )
            .unwrap();
        assert_eq!(outcome, belfry_store::LeaseOutcome::Ok);
    }
    for id in far_ids.iter().step_by(2) {
        assert_eq!(
            engine.cancel(&queue("orders"), *id, NOW).unwrap(),
            ChangeOutcome::Ok
        );
    }
    let acked: std::collections::HashSet<TaskId> = batch.leased.iter().map(|l| l.task.id).collect();
    for (i, id) in near.iter().enumerate() {
        let (got, duplicate) = put_again(&engine, "orders", i, NOW + DAY_MS);
        if acked.contains(id) {
            assert!(!duplicate && got != *id, "acked key {i} is free again");
        } else {
            assert_eq!((got, duplicate), (*id, true), "leased key {i} is held");
        }
    }
    for (n, id) in far_ids.iter().enumerate() {
        let i = 200 + n;
        let (got, duplicate) = put_again(&engine, "orders", i, far(i));
        if n % 2 == 0 {
            assert!(!duplicate && got != *id, "cancelled key {i} is free again");
            // The new task now holds the key, in the memtable beside the stale run entry.
            assert_eq!(put_again(&engine, "orders", i, far(i)), (got, true));
        } else {
            assert_eq!((got, duplicate), (*id, true), "key {i}");
        }
    }
}

#[test]
fn merges_keep_live_keys_and_drop_the_entries_of_deleted_buckets_and_queues() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    // Four checkpoints of keys: two days' buckets of "orders" and some of "mail".
    let day_one = put_new(&engine, "orders", 0..1_000, |i| NOW + DAY_MS + i as u64);
    engine.flush().unwrap();
    let day_two = put_new(&engine, "orders", 1_000..2_000, |i| {
        NOW + 2 * DAY_MS + i as u64
    });
    engine.flush().unwrap();
    put_new(&engine, "mail", 0..500, far);
    engine.flush().unwrap();
    let stats = engine.stats();
    assert!(stats.key_runs < 3, "merged: {} runs", stats.key_runs);
    assert_eq!(stats.key_run_entries, 2_500);
    // Day one's tasks all cancelled: its bucket goes at the next checkpoint, and a merge
    // after that leaves out its entries; deleting "mail" does the same for its entries.
    for id in &day_one {
        assert_eq!(
            engine.cancel(&queue("orders"), *id, NOW).unwrap(),
            ChangeOutcome::Ok
        );
    }
    assert!(engine.delete_queue(&queue("mail")).unwrap());
    engine.flush().unwrap();
    // Runs of 500 and 2,000 entries; 2,000 new keys make the size-tiered policy merge all
    // three, which leaves out mail's 500 entries and day one's 1,000.
    assert_eq!(engine.stats().key_run_entries, 2_500);
    put_new(&engine, "orders", 5_000..7_000, far);
    engine.flush().unwrap();
    let stats = engine.stats();
    assert_eq!(
        (stats.key_runs, stats.key_run_entries),
        (1, 3_000),
        "{stats:?}"
    );
    for (n, id) in day_two.iter().enumerate().step_by(13) {
        let i = 1_000 + n;
        let due = NOW + 2 * DAY_MS + i as u64;
        assert_eq!(put_again(&engine, "orders", i, due), (*id, true), "key {i}");
    }
    let (_, duplicate) = put_again(&engine, "orders", 3, NOW + DAY_MS);
    assert!(!duplicate, "day one's keys are free");
    drop(engine);
    let engine = open(dir.path());
    let names: Vec<String> = std::fs::read_dir(dir.path().join("keys"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names.len() as u64,
        engine.stats().key_runs,
        "merged-away files are deleted: {names:?}"
    );
}

#[test]
fn after_a_crash_keys_come_back_from_runs_and_the_wal_and_stray_runs_go() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let in_run = put_new(&engine, "orders", 0..1_000, far);
    engine.flush().unwrap();
    let in_wal = put_new(&engine, "orders", 1_000..1_500, far);
    engine.abandon();
    // A run a checkpoint wrote but never listed (it died first).
    let stray = dir.path().join("keys").join("00000000000000ff.run");
    std::fs::write(&stray, b"half a run").unwrap();
    let engine = open(dir.path());
    assert!(!stray.exists(), "an unlisted run is removed at open");
    for (i, id) in in_run.iter().chain(&in_wal).enumerate().step_by(9) {
        assert_eq!(
            put_again(&engine, "orders", i, far(i)),
            (*id, true),
            "key {i}"
        );
    }
    // The replayed keys go to a run at the next checkpoint.
    engine.flush().unwrap();
    let stats = engine.stats();
    assert!(stats.key_run_entries >= 1_500, "{stats:?}");
    let task = engine
        .get(&queue("orders"), in_wal[3], NOW)
        .unwrap()
        .unwrap();
    assert_eq!(task.state, TaskState::Scheduled);
}

#[test]
fn a_damaged_run_is_a_clear_error_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    put_new(&engine, "orders", 0..100, far);
    engine.flush().unwrap();
    drop(engine);
    let run = std::fs::read_dir(dir.path().join("keys"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&run).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // the footer's checksum
    std::fs::write(&run, bytes).unwrap();
    let error = Engine::open(dir.path(), options()).unwrap_err().to_string();
    assert!(error.contains(&run.display().to_string()), "{error}");
    assert!(error.contains("checksum"), "{error}");
}

/// A zeroed block of a key run is `Corrupt` naming the run, for a put of one of its keys and
/// for a lookup by key: never read as "no such key", which would let a second task in under
/// the key of a live one.
#[test]
fn a_zeroed_key_run_block_refuses_puts_of_its_keys_rather_than_duplicate_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = put_new(&engine, "orders", 0..3_000, far);
    engine.flush().unwrap();
    drop(engine);
    let run = std::fs::read_dir(dir.path().join("keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "run"))
        .expect("a key run");
    let (offset, len) = damage::run_block(&run, 2);
    damage::zero(&run, offset, len);
    let engine = open(dir.path());
    let wanted = format!(
        "{} at offset {offset}",
        run.file_name().unwrap().to_str().unwrap()
    );
    let mut refused = 0;
    for (i, id) in ids.iter().enumerate() {
        match engine.put(vec![keyed("orders", &format!("order-{i}"), far(i))]) {
            Ok(mut outcome) => match outcome.remove(0) {
                PutOutcome::Duplicate(task) => assert_eq!(task.id, *id, "key {i}"),
                created => panic!("key {i} let a second task in: {created:?}"),
            },
            Err(error) => {
                assert!(error.to_string().contains(&wanted), "{error}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no put read the zeroed block");
    let by_key =
        (0..3_000).map(|i| engine.get_by_key(&queue("orders"), &format!("order-{i}"), NOW));
    assert!(by_key.into_iter().any(|r| r.is_err()));
}

/// The bucket files of queue `q`'s directory (`q-<uid>/b-<key>.seg`).
fn bucket_files(dir: &std::path::Path) -> Vec<String> {
    let mut files = Vec::new();
    for queue_dir in std::fs::read_dir(dir).unwrap() {
        let queue_dir = queue_dir.unwrap().path();
        if !queue_dir.is_dir()
            || !queue_dir
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("q-")
        {
            continue;
        }
        for file in std::fs::read_dir(&queue_dir).unwrap() {
            files.push(file.unwrap().file_name().into_string().unwrap());
        }
    }
    files.sort();
    files
}

#[test]
fn a_discarded_dead_letter_frees_its_key_and_its_bucket_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = put_new(&engine, "orders", 0..3, |i| NOW + i as u64);
    let batch = engine
        .claim(&queue("orders"), NOW + 10, 10, 60_000)
        .unwrap();
    for leased in &batch.leased {
        let outcome = engine.dead_letter(
            &queue("orders"),
            leased.task.id,
            leased.lease_id,
            "gone",
            NOW + 20,
        );
        assert_eq!(outcome.unwrap(), belfry_store::LeaseOutcome::Ok);
    }
    engine.flush().unwrap();
    let dead_bucket = bucket_files(dir.path());
    assert_eq!(dead_bucket.len(), 1, "{dead_bucket:?}");
    // A dead letter keeps its key (it may be redriven) and its bucket.
    assert_eq!(put_again(&engine, "orders", 0, far(0)), (ids[0], true));
    let outcomes = engine
        .settle_dead(
            &queue("orders"),
            &ids[..2],
            belfry_store::DeadAction::Discard,
            NOW + 30,
        )
        .unwrap();
    assert_eq!(outcomes, [ChangeOutcome::Ok, ChangeOutcome::Ok]);
    let (again, duplicate) = put_again(&engine, "orders", 0, far(0));
    assert!(
        !duplicate && again != ids[0],
        "a discarded dead letter's key is free"
    );
    engine.flush().unwrap();
    assert!(
        bucket_files(dir.path()).contains(&dead_bucket[0]),
        "one dead letter is left"
    );
    assert_eq!(
        engine
            .discard_dead(&queue("orders"), ids[2], NOW + 40)
            .unwrap(),
        ChangeOutcome::Ok
    );
    engine.flush().unwrap();
    let left = bucket_files(dir.path());
    assert!(
        !left.contains(&dead_bucket[0]),
        "the finished bucket is deleted: {left:?}"
    );
    // And after a restart, each task reads as cancelled, the new one as scheduled.
    drop(engine);
    let engine = open(dir.path());
    for id in &ids {
        let task = engine.get(&queue("orders"), *id, NOW + 50).unwrap();
        assert!(task.is_none_or(|t| t.state == TaskState::Cancelled), "{id}");
    }
    let task = engine
        .get(&queue("orders"), again, NOW + 50)
        .unwrap()
        .unwrap();
    assert_eq!(task.state, TaskState::Scheduled);
}

#[test]
fn a_purged_queue_frees_its_keys_and_its_files_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = put_new(&engine, "orders", 0..300, far);
    engine.flush().unwrap();
    assert!(!bucket_files(dir.path()).is_empty());
    assert!(engine.purge_queue(&queue("orders")).unwrap());
    assert!(
        bucket_files(dir.path()).is_empty(),
        "the old incarnation's files are gone"
    );
    let (again, duplicate) = put_again(&engine, "orders", 7, far(7));
    assert!(!duplicate && again != ids[7], "a purged task's key is free");
    // After a restart, only the new task is there.
    drop(engine);
    let engine = open(dir.path());
    assert_eq!(engine.counts(&queue("orders"), NOW).unwrap().pending, 1);
    assert_eq!(put_again(&engine, "orders", 7, far(7)), (again, true));
    assert!(!put_again(&engine, "orders", 8, far(8)).1);
}
