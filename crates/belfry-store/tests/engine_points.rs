//! Point operations on far tasks (get, cancel, reschedule, and the idempotency-key check of a
//! put) read one stretch of their bucket file, never the whole bucket: `stats()` counts every
//! bucket load. Their answers stay exact across checkpoints, clean restarts and crashes.

use belfry_core::{NewTask, QueueName, TaskId, TaskState};
use belfry_store::{ChangeOutcome, Engine, EngineOptions, FsyncPolicy, PutOutcome, Store};
use bytes::Bytes;

const DAY_MS: u64 = 24 * 3_600_000;
const NOW: u64 = 1_700_000_000_000;
/// Due 30 days out: one day-wide bucket holds them all.
const FAR: u64 = NOW + 30 * DAY_MS;
/// Enough 300-byte payloads for the bucket file to span many index samples (one per 32 KiB).
const TASKS: usize = 3_000;

fn options() -> EngineOptions {
    EngineOptions {
        fsync: FsyncPolicy::Never,
        ..EngineOptions::default()
    }
}

fn queue() -> QueueName {
    QueueName::new("orders").unwrap()
}

fn payload(i: usize) -> Bytes {
    Bytes::from(format!("{i:06}-{}", "x".repeat(293)))
}

/// Opens an engine in `dir` and tells it the time, so far tasks go to wide buckets.
fn open(dir: &std::path::Path) -> Engine {
    let engine = Engine::open(dir, options()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    engine.counts(&queue(), NOW).unwrap();
    engine
}

/// Puts `TASKS` far tasks (every third with an idempotency key), a thousand per call.
fn fill(engine: &Engine) -> Vec<TaskId> {
    let mut ids = Vec::with_capacity(TASKS);
    for start in (0..TASKS).step_by(1_000) {
        let tasks = (start..(start + 1_000).min(TASKS))
            .map(|i| {
                let mut task = NewTask::new(queue(), FAR + i as u64, payload(i));
                if i % 3 == 0 {
                    task.idempotency_key = Some(format!("order-{i}"));
                }
                task
            })
            .collect();
        for outcome in engine.put(tasks).unwrap() {
            match outcome {
                PutOutcome::Created { id, .. } => ids.push(id),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    ids
}

fn loads(engine: &Engine) -> u64 {
    engine.stats().buckets_loaded
}

/// Cancels every 7th task of `range` and moves every 11th (not cancelled) a day later; the
/// first and the last task (the bucket's earliest and latest due times) stay as they are.
fn change_some(engine: &Engine, ids: &[TaskId], range: std::ops::Range<usize>) {
    for (i, id) in ids.iter().enumerate().take(range.end).skip(range.start) {
        if cancelled(i) {
            assert_eq!(
                engine.cancel(&queue(), *id, NOW).unwrap(),
                ChangeOutcome::Ok
            );
        } else if moved(i) {
            let due = FAR + DAY_MS / 2 + i as u64;
            let outcome = engine.reschedule(&queue(), *id, due, NOW).unwrap();
            assert_eq!(outcome, ChangeOutcome::Ok);
        }
    }
}

fn cancelled(i: usize) -> bool {
    i % 7 == 1
}

fn moved(i: usize) -> bool {
    i % 11 == 5 && !cancelled(i)
}

/// Every task reads back as `change_some` left it, payload included.
fn check_all(engine: &Engine, ids: &[TaskId]) {
    check_from(engine, ids, 0);
}

fn check_all_but_first(engine: &Engine, ids: &[TaskId]) {
    check_from(engine, ids, 1);
}

fn check_from(engine: &Engine, ids: &[TaskId], start: usize) {
    for (i, id) in ids.iter().enumerate().skip(start) {
        let task = engine.get(&queue(), *id, NOW).unwrap().expect("task");
        assert_eq!(task.payload, payload(i), "task {i}");
        let (state, due) = if cancelled(i) {
            (TaskState::Cancelled, FAR + i as u64)
        } else if moved(i) {
            (TaskState::Scheduled, FAR + DAY_MS / 2 + i as u64)
        } else {
            (TaskState::Scheduled, FAR + i as u64)
        };
        assert_eq!((task.state, task.due_at_ms), (state, due), "task {i}");
        assert_eq!(task.attempts, 0);
    }
}

#[test]
fn get_cancel_and_reschedule_of_far_tasks_load_no_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    let before = loads(&engine);

    change_some(&engine, &ids, 0..TASKS);
    check_all(&engine, &ids);
    // A cancelled task cannot be cancelled again or moved; the answer names its state.
    let gone = ids[8];
    let again = engine.cancel(&queue(), gone, NOW).unwrap();
    assert_eq!(again, ChangeOutcome::WrongState(TaskState::Cancelled));
    let back = engine.reschedule(&queue(), gone, FAR, NOW).unwrap();
    assert_eq!(back, ChangeOutcome::WrongState(TaskState::Cancelled));
    // Ids the bucket does not hold: before its first task and after its last.
    let (first, last) = (ids[0].0, ids[TASKS - 1].0);
    for seq_delta in [-1i128 << 64, 1 << 64] {
        let base = if seq_delta < 0 { first } else { last };
        let id = TaskId((base as i128 + seq_delta) as u128);
        assert_eq!(engine.get(&queue(), id, NOW).unwrap(), None);
        let outcome = engine.cancel(&queue(), id, NOW).unwrap();
        assert_eq!(outcome, ChangeOutcome::NotFound);
    }
    assert_eq!(loads(&engine), before, "{:?}", engine.stats());

    // The pending count follows the cancels, still without a load.
    let cancelled_count = (0..TASKS).filter(|&i| cancelled(i)).count() as u64;
    let counts = engine.counts(&queue(), NOW).unwrap();
    assert_eq!(counts.pending, TASKS as u64 - cancelled_count);
    assert_eq!(loads(&engine), before);
}

#[test]
fn idempotency_keys_are_checked_and_released_without_a_load() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    let before = loads(&engine);
    // A live keyed task: the same key is a duplicate, answered with the task.
    let mut again = NewTask::new(queue(), FAR, "other");
    again.idempotency_key = Some("order-3".into());
    match engine.put(vec![again.clone()]).unwrap().remove(0) {
        PutOutcome::Duplicate(task) => assert_eq!(task.id, ids[3]),
        other => panic!("expected a duplicate, got {other:?}"),
    }
    let found = engine.get_by_key(&queue(), "order-3", NOW).unwrap();
    assert_eq!(found.map(|t| t.id), Some(ids[3]));
    // Cancelled, its key is free again.
    assert_eq!(
        engine.cancel(&queue(), ids[3], NOW).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(engine.get_by_key(&queue(), "order-3", NOW).unwrap(), None);
    match engine.put(vec![again]).unwrap().remove(0) {
        PutOutcome::Created { id, .. } => assert_ne!(id, ids[3]),
        other => panic!("expected a new task, got {other:?}"),
    }
    assert_eq!(loads(&engine), before, "{:?}", engine.stats());
}

#[test]
fn the_index_survives_checkpoints_clean_restarts_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let ids = {
        let engine = open(dir.path());
        let ids = fill(&engine);
        change_some(&engine, &ids, 0..TASKS / 2);
        engine.flush().unwrap(); // a checkpoint: the index goes into it
        change_some(&engine, &ids, TASKS / 2..TASKS);
        ids
        // Dropped without a checkpoint: the second half's changes are only in the WAL.
    };
    {
        // The replayed cancels and reschedules go through the index too.
        let engine = open(dir.path());
        assert_eq!(loads(&engine), 0, "{:?}", engine.stats());
        assert!(engine.stats().wal_records_replayed > 0);
        check_all(&engine, &ids);
        // A loaded bucket keeps its index as well: load it (a change of the task at the
        // bucket's earliest due time), change more, and checkpoint (which unloads it).
        let last_first = engine.cancel(&queue(), ids[0], NOW).unwrap();
        assert_eq!(last_first, ChangeOutcome::Ok);
        assert_eq!(loads(&engine), 1);
        assert_eq!(
            engine.cancel(&queue(), ids[0], NOW).unwrap(),
            ChangeOutcome::WrongState(TaskState::Cancelled)
        );
        engine.flush().unwrap();
        let restored = engine.reschedule(&queue(), ids[0], FAR, NOW).unwrap();
        assert_eq!(restored, ChangeOutcome::WrongState(TaskState::Cancelled));
    }
    let engine = open(dir.path());
    let before = loads(&engine);
    let first = engine.get(&queue(), ids[0], NOW).unwrap().unwrap();
    assert_eq!(first.state, TaskState::Cancelled);
    check_all_but_first(&engine, &ids);
    assert_eq!(loads(&engine), before, "{:?}", engine.stats());
    assert_eq!(engine.stats().records_loaded, 0);
}

#[test]
fn changing_the_task_at_a_due_bound_loads_the_bucket_and_keeps_next_due_exact() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR));
    let before = loads(&engine);
    assert_eq!(
        engine.cancel(&queue(), ids[0], NOW).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(
        loads(&engine),
        before + 1,
        "the earliest task's cancel reads the bucket"
    );
    engine.flush().unwrap(); // unloaded again, with its index
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR + 1));
    // Moving the (new) earliest task later also loads; moving another one earlier than it
    // does not, and makes it the earliest.
    let later = engine
        .reschedule(&queue(), ids[1], FAR + 5_000, NOW)
        .unwrap();
    assert_eq!(later, ChangeOutcome::Ok);
    engine.flush().unwrap();
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR + 2));
    let before = loads(&engine);
    let earlier = engine.reschedule(&queue(), ids[100], FAR - 7, NOW).unwrap();
    assert_eq!(earlier, ChangeOutcome::Ok);
    assert_eq!(loads(&engine), before);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR - 7));
}

#[test]
fn tasks_sharing_the_earliest_due_time_are_cancelled_without_a_load_until_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    let first = FAR - 1_000;
    let mut shared = Vec::new();
    for outcome in engine
        .put(
            (0..5)
                .map(|i| NewTask::new(queue(), first, payload(i)))
                .collect(),
        )
        .unwrap()
    {
        let PutOutcome::Created { id, .. } = outcome else {
            panic!("{outcome:?}")
        };
        shared.push(id);
    }
    let before = loads(&engine);
    for id in &shared[..4] {
        assert_eq!(
            engine.cancel(&queue(), *id, NOW).unwrap(),
            ChangeOutcome::Ok
        );
        assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(first));
    }
    assert_eq!(loads(&engine), before, "four of five at the bound: no load");
    assert_eq!(
        engine.cancel(&queue(), shared[4], NOW).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(
        loads(&engine),
        before + 1,
        "the last one at the bound reads the bucket"
    );
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR));
    assert_eq!(
        engine
            .get(&queue(), ids[0], NOW)
            .unwrap()
            .unwrap()
            .due_at_ms,
        FAR
    );
}

#[test]
fn a_far_task_moved_near_is_claimed_on_time_and_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    let due = NOW + 5_000;
    let outcome = engine.reschedule(&queue(), ids[42], due, NOW).unwrap();
    assert_eq!(outcome, ChangeOutcome::Ok);
    assert!(engine
        .claim(&queue(), due - 1, 10, 1_000)
        .unwrap()
        .leased
        .is_empty());
    let batch = engine.claim(&queue(), due, 10, 1_000).unwrap();
    let claimed: Vec<TaskId> = batch.leased.iter().map(|l| l.task.id).collect();
    assert_eq!(claimed, vec![ids[42]]);
    assert_eq!(batch.leased[0].task.payload, payload(42));
    // Its bucket was loaded to claim it; the rest of the bucket is still intact.
    let task = engine.get(&queue(), ids[43], due).unwrap().unwrap();
    assert_eq!(
        (task.state, task.due_at_ms),
        (TaskState::Scheduled, FAR + 43)
    );
}

#[test]
fn a_fully_cancelled_far_bucket_is_deleted_at_the_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    for id in &ids {
        assert_eq!(
            engine.cancel(&queue(), *id, NOW).unwrap(),
            ChangeOutcome::Ok
        );
    }
    assert_eq!(engine.counts(&queue(), NOW).unwrap().pending, 0);
    engine.flush().unwrap();
    assert_eq!(engine.stats().buckets_total, 0, "{:?}", engine.stats());
    assert_eq!(engine.get(&queue(), ids[0], NOW).unwrap(), None);
}
