//! Listing a queue's live tasks in pages: every scheduled or leased task once, with all it
//! was put with; nothing finished or dead; the same after a crash; a walk that goes on after
//! the task it stopped at is gone.

use std::collections::{BTreeMap, BTreeSet};

use belfry_core::{LatePolicy, Priority, Task, TaskId, TaskState};
use bytes::Bytes;

use super::{created, q, task, Harness};
use crate::{ChangeOutcome, LeaseOutcome, StoreError};

const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// Walks the queue's live tasks `page` at a time, checking that no task comes twice and
/// that no page is longer than asked.
fn walk(h: &dyn Harness, queue: &str, page: usize, now: u64) -> BTreeMap<TaskId, Task> {
    let mut seen = BTreeMap::new();
    let mut after = None;
    loop {
        let tasks = h.store().list_tasks(&q(queue), after, page, now).unwrap();
        assert!(tasks.len() <= page, "a page of {} for {page}", tasks.len());
        for t in &tasks {
            assert_eq!(t.queue, q(queue));
            assert!(seen.insert(t.id, t.clone()).is_none(), "{} twice", t.id);
        }
        if tasks.len() < page {
            return seen;
        }
        after = tasks.last().map(|t| t.id);
    }
}

/// Due times from the near past to a year ahead, so that a store that files tasks by due
/// time (the engine's buckets of a minute, an hour, a day, a week) holds them in several
/// places of each kind.
fn spread_due(i: u64) -> u64 {
    match i % 5 {
        0 => 1_000 + i,
        1 => 30 * 60_000 + i * 1_000,
        2 => 5 * HOUR + i * 60_000,
        3 => 20 * DAY + i * HOUR,
        _ => 300 * DAY + i * DAY,
    }
}

pub fn live_tasks_listed_once(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put_queue(&q("b"), Bytes::new()).unwrap();
    assert!(matches!(
        s.list_tasks(&q("missing"), None, 10, 0),
        Err(StoreError::QueueNotFound(_))
    ));
    assert!(s.list_tasks(&q("a"), None, 10, 0).unwrap().is_empty());

    let mut full = task("a", 40 * DAY, "{\"full\":true}");
    full.idempotency_key = Some("order-7".into());
    full.headers = vec![("X-Trace".to_owned(), "t-1".to_owned())];
    full.priority = Priority::High;
    full.late_policy = LatePolicy::Dead { after_ms: 5_000 };
    full.target = Some("https://hooks.example/a?sig=1".into());
    let mut batch = vec![
        task("a", 10, "acked"),
        task("a", 11, "leased"),
        task("a", 12, "dead"),
        task("a", 3 * HOUR, "cancelled"),
        full.clone(),
    ];
    batch.extend((0..40).map(|i| task("a", spread_due(i), &format!("spread-{i}"))));
    let ids: Vec<TaskId> = s.put(batch).unwrap().iter().map(created).collect();
    let other = super::put1(h, task("b", 10, "other queue"));
    let s = h.store();

    // Finish some: one acked, one dead-lettered, one cancelled; one stays leased.
    let leased = s.claim(&q("a"), 12, 3, 10 * DAY).unwrap().leased;
    let lease = |id| leased.iter().find(|l| l.task.id == id).unwrap().lease_id;
    assert_eq!(leased.len(), 3);
    let ack = s.ack(&q("a"), ids[0], lease(ids[0]), 13).unwrap();
    assert_eq!(ack, LeaseOutcome::Ok);
    let dead = s.dead_letter(&q("a"), ids[2], lease(ids[2]), "boom", 13);
    assert_eq!(dead.unwrap(), LeaseOutcome::Ok);
    assert_eq!(s.cancel(&q("a"), ids[3], 13).unwrap(), ChangeOutcome::Ok);
    let live: BTreeSet<TaskId> = ids
        .iter()
        .copied()
        .filter(|id| ![ids[0], ids[2], ids[3]].contains(id))
        .collect();

    let check = |h: &dyn Harness, page: usize, now: u64, lease_over: bool| {
        let seen = walk(h, "a", page, now);
        assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), live);
        assert!(!seen.contains_key(&other));
        let leased = &seen[&ids[1]];
        if lease_over {
            assert_eq!(leased.state, TaskState::Scheduled);
        } else {
            assert_eq!(leased.state, TaskState::Leased);
            assert_eq!(leased.lease_until_ms, Some(12 + 10 * DAY));
        }
        assert_eq!(leased.attempts, 1);
        assert_eq!(&leased.payload[..], b"leased");
        let f = &seen[&ids[4]];
        assert_eq!(f.state, TaskState::Scheduled);
        assert_eq!(f.due_at_ms, full.due_at_ms);
        assert_eq!(f.payload, full.payload);
        assert_eq!(f.idempotency_key, full.idempotency_key);
        assert_eq!(f.headers, full.headers);
        assert_eq!(f.priority, Priority::High);
        assert_eq!(f.late_policy, full.late_policy);
        assert_eq!(f.target, full.target);
        for i in 0..40 {
            let t = &seen[&ids[5 + i]];
            assert_eq!(t.due_at_ms, spread_due(i as u64), "spread-{i}");
            assert_eq!(t.payload, format!("spread-{i}").into_bytes());
        }
    };
    for page in [1, 3, 7, 100] {
        check(h, page, 20, false);
    }
    h.crash();
    check(h, 4, 20, false);
    h.reopen(true);
    check(h, 6, 20, false);
    // Past the lease's end, the leased task is listed as scheduled (due again).
    check(h, 5, 13 + 10 * DAY, true);

    // A walk goes on after the task it stopped at, even once that task is gone.
    let now = 14 + 10 * DAY;
    let s = h.store();
    let first = s.list_tasks(&q("a"), None, 10, now).unwrap();
    let stop = first.last().unwrap().id;
    assert_eq!(s.cancel(&q("a"), stop, now).unwrap(), ChangeOutcome::Ok);
    let mut rest = walk_from(h, "a", stop, now);
    rest.extend(first.iter().map(|t| t.id));
    assert_eq!(rest, live);
}

/// The ids of a walk that starts after `after`, eight at a time.
fn walk_from(h: &dyn Harness, queue: &str, after: TaskId, now: u64) -> BTreeSet<TaskId> {
    let mut seen = BTreeSet::new();
    let mut after = Some(after);
    loop {
        let tasks = h.store().list_tasks(&q(queue), after, 8, now).unwrap();
        seen.extend(tasks.iter().map(|t| t.id));
        if tasks.len() < 8 {
            return seen;
        }
        after = tasks.last().map(|t| t.id);
    }
}

/// Thousands of tasks over many due times, some of them claimed and finished: a walk of
/// pages of 1,000 lists each live task once, before and after a crash.
pub fn live_tasks_listed_in_thousands(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let mut ids = BTreeSet::new();
    for chunk in 0..5u64 {
        let batch = (0..600).map(|i| {
            let n = chunk * 600 + i;
            task("a", spread_due(n) + n % 7, &format!("t{n}"))
        });
        ids.extend(s.put(batch.collect()).unwrap().iter().map(created));
    }
    let leased = s.claim(&q("a"), 5_000, 500, 60_000).unwrap().leased;
    assert_eq!(leased.len(), 500);
    for l in leased.iter().step_by(2) {
        let ack = s.ack(&q("a"), l.task.id, l.lease_id, 5_001).unwrap();
        assert_eq!(ack, LeaseOutcome::Ok);
        ids.remove(&l.task.id);
    }
    let listed = |h: &dyn Harness| walk(h, "a", 1_000, 5_002);
    assert_eq!(listed(h).keys().copied().collect::<BTreeSet<_>>(), ids);
    h.crash();
    let after_crash = listed(h);
    assert_eq!(after_crash.keys().copied().collect::<BTreeSet<_>>(), ids);
    let leased_left = after_crash
        .values()
        .filter(|t| t.state == TaskState::Leased)
        .count();
    assert_eq!(leased_left, leased.len() - leased.len().div_ceil(2));
}
