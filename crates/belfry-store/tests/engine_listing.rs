//! Listing a queue's live tasks (`Store::list_tasks`) reads unloaded buckets without loading
//! them: a walk over a large far bucket leaves it unloaded (`stats()` counts every load and
//! every loaded bucket), whether the bucket's point index is complete (its changed tasks are
//! in memory) or not (its states come from the bucket's records).

use std::collections::{BTreeMap, BTreeSet};

use belfry_core::{NewTask, QueueName, Task, TaskId, TaskState};
use belfry_store::{ChangeOutcome, Engine, EngineOptions, FsyncPolicy, LeaseOutcome, Store};
use bytes::Bytes;

const DAY_MS: u64 = 24 * 3_600_000;
const NOW: u64 = 1_700_000_000_000;

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
    Bytes::from(format!("{i:06}-{}", "x".repeat(90)))
}

/// Opens an engine in `dir` and tells it the time, so far tasks go to wide buckets.
fn open(dir: &std::path::Path) -> Engine {
    let engine = Engine::open(dir, options()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    engine.counts(&queue(), NOW).unwrap();
    engine
}

/// Puts `count` tasks due at `due + i`, a thousand per call.
fn fill(engine: &Engine, count: usize, due: u64) -> Vec<TaskId> {
    let mut ids = Vec::with_capacity(count);
    for start in (0..count).step_by(1_000) {
        let tasks = (start..(start + 1_000).min(count))
            .map(|i| NewTask::new(queue(), due + i as u64, payload(i)))
            .collect();
        for outcome in engine.put(tasks).unwrap() {
            match outcome {
                belfry_store::PutOutcome::Created { id, .. } => ids.push(id),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    ids
}

/// Walks the queue's live tasks `page` at a time; no task twice, no page longer than asked.
fn walk(engine: &Engine, page: usize, now: u64) -> BTreeMap<TaskId, Task> {
    let mut seen = BTreeMap::new();
    let mut after = None;
    loop {
        let tasks = engine.list_tasks(&queue(), after, page, now).unwrap();
        assert!(tasks.len() <= page, "a page of {} for {page}", tasks.len());
        for task in &tasks {
            assert!(
                seen.insert(task.id, task.clone()).is_none(),
                "{} twice",
                task.id
            );
        }
        if tasks.len() < page {
            return seen;
        }
        after = tasks.last().map(|t| t.id);
    }
}

/// (loads so far, buckets loaded now)
fn loads(engine: &Engine) -> (u64, u64) {
    let stats = engine.stats();
    (stats.buckets_loaded, stats.buckets_in_memory)
}

fn cancelled(i: usize) -> bool {
    i % 7 == 1
}

fn moved(i: usize) -> bool {
    i % 11 == 5 && !cancelled(i)
}

/// Cancels every 7th task and moves every 11th (not cancelled) half a day later; the first
/// and the last (the bucket's due bounds) stay as they are.
fn change_some(engine: &Engine, ids: &[TaskId], far: u64) {
    for (i, id) in ids.iter().enumerate() {
        let outcome = if cancelled(i) {
            engine.cancel(&queue(), *id, NOW).unwrap()
        } else if moved(i) {
            let due = far + DAY_MS / 2 + i as u64;
            engine.reschedule(&queue(), *id, due, NOW).unwrap()
        } else {
            continue;
        };
        assert_eq!(outcome, ChangeOutcome::Ok);
    }
}

/// 50,000 tasks due in 59 days (one day-wide bucket), unloaded by a restart; cancels and
/// reschedules made while it is unloaded (through its point index) show in the listing.
#[test]
fn a_walk_over_a_large_unloaded_bucket_lists_every_task_once_and_leaves_it_unloaded() {
    const TASKS: usize = 50_000;
    let far = NOW + 59 * DAY_MS;
    let dir = tempfile::tempdir().unwrap();
    let ids = {
        let engine = open(dir.path());
        let ids = fill(&engine, TASKS, far);
        engine.flush().unwrap();
        ids
    };
    let engine = open(dir.path());
    assert_eq!(loads(&engine), (0, 0), "{:?}", engine.stats());
    change_some(&engine, &ids, far);
    assert_eq!(loads(&engine), (0, 0), "changes went through the index");

    let check = |engine: &Engine, page: usize| {
        let seen = walk(engine, page, NOW);
        let live: BTreeSet<TaskId> = (0..TASKS)
            .filter(|&i| !cancelled(i))
            .map(|i| ids[i])
            .collect();
        assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), live);
        for (i, id) in ids.iter().enumerate().filter(|&(i, _)| !cancelled(i)) {
            let task = &seen[id];
            let due = if moved(i) {
                far + DAY_MS / 2 + i as u64
            } else {
                far + i as u64
            };
            assert_eq!(
                (task.state, task.due_at_ms),
                (TaskState::Scheduled, due),
                "{i}"
            );
            assert_eq!(task.payload, payload(i), "{i}");
            assert_eq!(task.attempts, 0);
        }
        assert_eq!(loads(engine), (0, 0), "{:?}", engine.stats());
    };
    check(&engine, 1_000);
    check(&engine, 4_999);
    // A walk that starts in the middle of the bucket lists the rest, in order.
    let rest = engine
        .list_tasks(&queue(), Some(ids[TASKS / 2]), 100, NOW)
        .unwrap();
    let expected: Vec<TaskId> = (TASKS / 2 + 1..TASKS)
        .filter(|&i| !cancelled(i))
        .take(100)
        .map(|i| ids[i])
        .collect();
    assert_eq!(rest.iter().map(|t| t.id).collect::<Vec<_>>(), expected);

    // After a crash, the changes are replayed from the WAL: still listed without a load.
    engine.abandon();
    let engine = open(dir.path());
    let before = loads(&engine);
    assert_eq!(before.1, 0, "{:?}", engine.stats());
    check(&engine, 2_500);
}

/// Tasks of the bucket [`dead_letter_bucket`] changes: dead-lettered, leased (until 90 days
/// after `NEAR`), nacked (due `far + 5`, one attempt), cancelled, moved a day later.
const DEAD: usize = 10;
const LEASED: usize = 20;
const NACKED: usize = 30;
const GONE: [usize; 2] = [40, 41];
const LATER: usize = 50;
const NEAR: u64 = NOW + 1_000;

/// Puts `tasks` due at `far + i` into one bucket of a new engine in `dir`, changes some of
/// them while the bucket is loaded (see [`DEAD`]), and closes the engine cleanly: its
/// checkpoint unloads the bucket, which holds a dead letter, so its index is given up.
fn dead_letter_bucket(dir: &std::path::Path, tasks: usize, far: u64) -> Vec<TaskId> {
    let engine = open(dir);
    let ids = fill(&engine, tasks, far);
    for i in [DEAD, LEASED, NACKED] {
        let outcome = engine.reschedule(&queue(), ids[i], NEAR, NOW).unwrap();
        assert_eq!(outcome, ChangeOutcome::Ok);
    }
    let claim = |visibility: u64| {
        let batch = engine.claim(&queue(), NEAR, 1, visibility).unwrap();
        let leased = batch.leased.into_iter().next().unwrap();
        (leased.task.id, leased.lease_id)
    };
    let (id, lease) = claim(60_000);
    assert_eq!(id, ids[DEAD]);
    let outcome = engine.dead_letter(&queue(), id, lease, "boom", NEAR);
    assert_eq!(outcome.unwrap(), LeaseOutcome::Ok);
    let (id, _) = claim(90 * DAY_MS);
    assert_eq!(id, ids[LEASED]);
    let (id, lease) = claim(60_000);
    assert_eq!(id, ids[NACKED]);
    let outcome = engine.nack(&queue(), id, lease, far + 5, NEAR);
    assert_eq!(outcome.unwrap(), LeaseOutcome::Ok);
    for i in GONE {
        let outcome = engine.cancel(&queue(), ids[i], NEAR).unwrap();
        assert_eq!(outcome, ChangeOutcome::Ok);
    }
    let outcome = engine.reschedule(&queue(), ids[LATER], far + DAY_MS, NEAR);
    assert_eq!(outcome.unwrap(), ChangeOutcome::Ok);
    engine.flush().unwrap();
    ids
}

/// A far bucket that holds a dead letter has no complete point index once unloaded: its
/// listing reads the states from its records (a lease in force, a nack's attempts, cancels
/// and a reschedule made while it was loaded), still without loading it.
#[test]
fn a_bucket_without_a_complete_index_is_listed_from_its_records() {
    const TASKS: usize = 3_000;
    let far = NOW + 30 * DAY_MS;
    let dir = tempfile::tempdir().unwrap();
    let ids = dead_letter_bucket(dir.path(), TASKS, far);
    let engine = open(dir.path());
    assert_eq!(loads(&engine), (0, 0), "{:?}", engine.stats());

    for page in [7, 1_000] {
        let seen = walk(&engine, page, NEAR + 1_000);
        let live: BTreeSet<TaskId> = (0..TASKS)
            .filter(|i| *i != DEAD && !GONE.contains(i))
            .map(|i| ids[i])
            .collect();
        assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), live);
        for (i, id) in ids.iter().enumerate() {
            let Some(task) = seen.get(id) else { continue };
            assert_eq!(task.payload, payload(i), "{i}");
            let expected = match i {
                LEASED => (TaskState::Leased, NEAR, 1, Some(NEAR + 90 * DAY_MS)),
                NACKED => (TaskState::Scheduled, far + 5, 1, None),
                LATER => (TaskState::Scheduled, far + DAY_MS, 0, None),
                _ => (TaskState::Scheduled, far + i as u64, 0, None),
            };
            let got = (
                task.state,
                task.due_at_ms,
                task.attempts,
                task.lease_until_ms,
            );
            assert_eq!(got, expected, "{i}");
        }
        assert_eq!(loads(&engine), (0, 0), "{:?}", engine.stats());
    }
    // The bucket had no complete index: reading one of its tasks loads it.
    let task = engine.get(&queue(), ids[0], NEAR + 1_000).unwrap().unwrap();
    assert_eq!(task.due_at_ms, far);
    assert_eq!(loads(&engine).0, 1, "{:?}", engine.stats());
}

/// Walks while another thread cancels, puts and checkpoints: every task that stays live
/// throughout is listed exactly once by each walk.
#[test]
fn walks_during_changes_list_every_task_that_stays_live_once() {
    const TASKS: usize = 6_000;
    let far = NOW + 20 * DAY_MS;
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let ids = fill(&engine, TASKS, far);
    engine.flush().unwrap();
    // Even tasks stay; odd ones are cancelled while the walks run.
    let stay: BTreeSet<TaskId> = ids.iter().step_by(2).copied().collect();
    std::thread::scope(|s| {
        let changer = s.spawn(|| {
            for (n, id) in ids.iter().skip(1).step_by(2).enumerate() {
                assert_eq!(
                    engine.cancel(&queue(), *id, NOW).unwrap(),
                    ChangeOutcome::Ok
                );
                if n % 100 == 0 {
                    fill(&engine, 10, far + DAY_MS * (n as u64 % 40));
                    engine.flush().unwrap();
                }
            }
        });
        while !changer.is_finished() {
            let seen = walk(&engine, 257, NOW);
            let ids: BTreeSet<TaskId> = seen.keys().copied().collect();
            assert!(
                ids.is_superset(&stay),
                "missing {:?}",
                stay.difference(&ids).next()
            );
        }
        changer.join().unwrap();
    });
    let seen = walk(&engine, 1_000, NOW);
    assert_eq!(seen.len(), TASKS / 2 + 10 * TASKS.div_ceil(2).div_ceil(100));
}
