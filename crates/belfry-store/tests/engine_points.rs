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
        // A bucket loaded and unloaded again (a forecast across its tasks does both) keeps
        // its changes in the index it rebuilds.
        let last_first = engine.cancel(&queue(), ids[0], NOW).unwrap();
        assert_eq!(last_first, ChangeOutcome::Ok);
        assert_eq!(
            engine.forecast(&queue(), FAR, 1, 4).unwrap(),
            vec![0, 0, 1, 1]
        );
        assert_eq!(loads(&engine), 1);
        check_all_but_first(&engine, &ids);
        assert_eq!(loads(&engine), 1);
        let again = engine.cancel(&queue(), ids[0], NOW).unwrap();
        assert_eq!(again, ChangeOutcome::WrongState(TaskState::Cancelled));
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
fn changing_the_task_at_a_due_bound_keeps_next_due_and_forecasts_exact_without_a_load() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR));
    let before = loads(&engine);
    // The earliest task: the next one is found by reading the bucket, not loading it.
    assert_eq!(
        engine.cancel(&queue(), ids[0], NOW).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR + 1));
    // The latest one moved later, then the (new) earliest moved later: bounds follow.
    let last = TASKS - 1;
    let later = engine
        .reschedule(&queue(), ids[last], FAR + 9_000, NOW)
        .unwrap();
    assert_eq!(later, ChangeOutcome::Ok);
    let later = engine
        .reschedule(&queue(), ids[1], FAR + 5_000, NOW)
        .unwrap();
    assert_eq!(later, ChangeOutcome::Ok);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR + 2));
    // Another one moved earlier than all: it becomes the earliest.
    let earlier = engine.reschedule(&queue(), ids[100], FAR - 7, NOW).unwrap();
    assert_eq!(earlier, ChangeOutcome::Ok);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR - 7));
    assert_eq!(loads(&engine), before, "{:?}", engine.stats());
    // A forecast bin holding the bucket's whole span counts it from its exact bounds.
    let bins = engine.forecast(&queue(), FAR - 10, 10_000, 1).unwrap();
    assert_eq!(bins, vec![TASKS as u64 - 1]);
    assert_eq!(loads(&engine), before);
    // The bounds and their counts survive a restart (checkpoint format 5).
    engine.flush().unwrap();
    drop(engine);
    let engine = open(dir.path());
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR - 7));
    let earliest = engine.cancel(&queue(), ids[100], NOW).unwrap();
    assert_eq!(earliest, ChangeOutcome::Ok);
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR + 2));
    assert_eq!(loads(&engine), 0, "{:?}", engine.stats());
}

#[test]
fn tasks_sharing_the_earliest_due_time_are_cancelled_without_a_load() {
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
    assert_eq!(
        engine.cancel(&queue(), shared[4], NOW).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(engine.next_due_ms(&queue()).unwrap(), Some(FAR));
    assert_eq!(
        loads(&engine),
        before,
        "the bounds were read, not the tasks kept"
    );
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

#[test]
fn a_sweep_in_due_order_scans_a_few_times_then_loads_the_bucket_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine);
    let before = loads(&engine);
    // Each cancel takes the earliest task: the first few read the bucket for the next bound,
    // then it is loaded once and the rest of the sweep needs nothing more.
    for (i, id) in ids.iter().enumerate().take(20) {
        assert_eq!(
            engine.cancel(&queue(), *id, NOW).unwrap(),
            ChangeOutcome::Ok
        );
        assert_eq!(
            engine.next_due_ms(&queue()).unwrap(),
            Some(FAR + i as u64 + 1)
        );
    }
    assert_eq!(loads(&engine), before + 1, "{:?}", engine.stats());
}
