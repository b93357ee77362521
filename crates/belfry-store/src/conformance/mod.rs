//! One set of scenarios every [`Store`] runs: the in-memory reference, the embedded engine
//! and the Redis backends. A backend's test binary implements [`Harness`] (how to reach its
//! store and how to restart it) and runs each of [`scenarios`] as its own test (the
//! [`conformance_tests!`](crate::conformance_tests) macro writes them). Most scenarios
//! restart the store halfway, so durability is checked by the same expectations.
//!
//! Behind the `conformance` feature: test code, never in a release build.

use std::collections::BTreeSet;

use belfry_core::{
    LatePolicy, LeaseId, NewTask, PayloadKind, Priority, QueueName, TaskId, TaskState,
};
use bytes::Bytes;

mod cancel_many;
mod dead;
mod lag;
mod listing;
mod purge;
mod subscriptions;

pub use cancel_many::{cancel_many_empties_far_buckets, cancel_many_matches_single_cancels};
pub use dead::{dead_letters_settled, dead_letters_settled_in_hundreds};
pub use lag::{expired_leases_reported_once, oldest_due_in_counts};
pub use listing::{live_tasks_listed_in_thousands, live_tasks_listed_once};
pub use purge::queue_purge_drops_every_task_and_keeps_the_queue;
pub use subscriptions::{subscriptions_basics, subscriptions_many};

use crate::{ChangeOutcome, LeaseOutcome, MetaChange, PutOutcome, QueueCounts, Store, StoreError};

/// A store under test, and a way to restart it.
pub trait Harness {
    fn store(&self) -> &dyn Store;
    /// Restarts the store (a no-op for stores without durability). `clean` asks for a flush
    /// first; otherwise the engine recovers from its WAL.
    fn reopen(&mut self, clean: bool);
    /// Restarts the store as a crash of the process would (`Engine::abandon`: no flush, no
    /// final fsync, write buffers dropped); a no-op for stores without durability.
    fn crash(&mut self);
}

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn task(queue: &str, due: u64, payload: &str) -> NewTask {
    NewTask::new(q(queue), due, Bytes::from(payload.to_owned()))
}

fn created(outcome: &PutOutcome) -> TaskId {
    match outcome {
        PutOutcome::Created { id, .. } => *id,
        PutOutcome::Duplicate(t) => panic!("unexpected duplicate of {:?}", t.id),
    }
}

fn put1(h: &dyn Harness, t: NewTask) -> TaskId {
    created(&h.store().put(vec![t]).unwrap()[0])
}

fn payloads(h: &dyn Harness, queue: &str, now: u64, max: usize) -> Vec<String> {
    h.store()
        .claim(&q(queue), now, max, 100_000_000)
        .unwrap()
        .leased
        .into_iter()
        .map(|l| String::from_utf8(l.task.payload.to_vec()).unwrap())
        .collect()
}

pub fn queues_and_meta(h: &mut dyn Harness) {
    let s = h.store();
    assert!(s.put_queue(&q("a"), Bytes::from_static(b"cfg1")).unwrap());
    assert!(!s.put_queue(&q("a"), Bytes::from_static(b"cfg2")).unwrap());
    assert!(s.put_queue(&q("b"), Bytes::new()).unwrap());
    assert!(matches!(
        s.put(vec![task("missing", 1, "x")]),
        Err(StoreError::QueueNotFound(_))
    ));
    assert!(matches!(
        s.claim(&q("missing"), 1, 1, 1),
        Err(StoreError::QueueNotFound(_))
    ));
    s.put_meta("sched", "k1", Bytes::from_static(b"v1"))
        .unwrap();
    s.put_meta("sched", "k2", Bytes::from_static(b"v2"))
        .unwrap();
    s.put_meta("other", "k1", Bytes::from_static(b"o")).unwrap();
    assert!(s.delete_meta("sched", "k2").unwrap());
    assert!(!s.delete_meta("sched", "k2").unwrap());
    h.reopen(false);
    let s = h.store();
    assert_eq!(
        s.get_queue(&q("a")).unwrap(),
        Some(Bytes::from_static(b"cfg2"))
    );
    let names: Vec<String> = s
        .list_queues()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        s.get_meta("sched", "k1").unwrap(),
        Some(Bytes::from_static(b"v1"))
    );
    assert_eq!(s.get_meta("sched", "k2").unwrap(), None);
    assert_eq!(
        s.list_meta("sched").unwrap(),
        vec![("k1".to_owned(), Bytes::from_static(b"v1"))]
    );
    assert!(s.delete_queue(&q("a")).unwrap());
    assert!(!s.delete_queue(&q("a")).unwrap());
    assert_eq!(s.get_queue(&q("a")).unwrap(), None);
}

pub fn put_get_round_trip(h: &mut dyn Harness) {
    h.store().put_queue(&q("a"), Bytes::new()).unwrap();
    let mut t = task("a", 5_000, "{\"n\":1}");
    t.headers = vec![("h".into(), "v".into())];
    t.priority = Priority::High;
    t.payload_kind = PayloadKind::Binary;
    t.late_policy = LatePolicy::Skip { after_ms: 9 };
    t.idempotency_key = Some("key".into());
    let id = put1(h, t.clone());
    h.reopen(false);
    let got = h.store().get(&q("a"), id, 1_000).unwrap().unwrap();
    assert_eq!(got.id, id);
    assert_eq!(got.payload, t.payload);
    assert_eq!(got.headers, t.headers);
    assert_eq!(got.priority, Priority::High);
    assert_eq!(got.payload_kind, PayloadKind::Binary);
    assert_eq!(got.late_policy, t.late_policy);
    assert_eq!(got.idempotency_key.as_deref(), Some("key"));
    assert_eq!(got.state, TaskState::Scheduled);
    assert_eq!(got.attempts, 0);
    assert_eq!(got.due_at_ms, 5_000);
    let by_key = h.store().get_by_key(&q("a"), "key", 1_000).unwrap();
    assert_eq!(by_key.map(|t| t.id), Some(id));
    assert!(h
        .store()
        .get(&q("a"), TaskId(id.0 ^ (1 << 100)), 1_000)
        .unwrap()
        .is_none());
    assert!(h.store().get_by_key(&q("a"), "nope", 1).unwrap().is_none());
}

/// A task's own target is stored with it: read back by get, by a claim after a crash, and
/// from the dead letters; tasks without one have none.
pub fn task_targets(h: &mut dyn Harness) {
    h.store().put_queue(&q("a"), Bytes::new()).unwrap();
    let target = "https://hooks.example.com/orders/42?sig=abc".to_owned();
    let mut with = task("a", 10, "with");
    with.target = Some(target.clone());
    let mut keyed = task("a", 10, "keyed");
    keyed.target = Some("http://example.com/".to_owned());
    keyed.idempotency_key = Some("k".into());
    keyed.headers = vec![("h".into(), "v".into())];
    let outcomes = h
        .store()
        .put(vec![with, task("a", 10, "without"), keyed])
        .unwrap();
    let ids: Vec<TaskId> = outcomes.iter().map(created).collect();
    h.crash();
    let s = h.store();
    let got = s.get(&q("a"), ids[0], 1).unwrap().unwrap();
    assert_eq!(got.target.as_deref(), Some(target.as_str()));
    let leased = s.claim(&q("a"), 10, 10, 1_000).unwrap().leased;
    // Tasks due at the same ms may come in any order (a partitioned store's do).
    let mut seen: Vec<(&[u8], Option<&str>)> = leased
        .iter()
        .map(|l| (&l.task.payload[..], l.task.target.as_deref()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (&b"keyed"[..], Some("http://example.com/")),
            (&b"with"[..], Some(target.as_str())),
            (&b"without"[..], None),
        ]
    );
    let first = leased.iter().find(|l| l.task.id == ids[0]).unwrap();
    s.dead_letter(&q("a"), first.task.id, first.lease_id, "gone", 20)
        .unwrap();
    h.reopen(false);
    let dead = h.store().list_dead(&q("a"), None, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].target.as_deref(), Some(target.as_str()));
    let by_key = h.store().get_by_key(&q("a"), "k", 30).unwrap().unwrap();
    assert_eq!(by_key.target.as_deref(), Some("http://example.com/"));
}

pub fn claim_order(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put(vec![
        task("a", 3_000, "n3"),
        task("a", 1_000, "n1a"),
        task("a", 1_000, "n1b"),
        task("a", 2_000, "n2"),
        task("a", 9_000, "late"),
    ])
    .unwrap();
    let mut high = task("a", 2_500, "h25");
    high.priority = Priority::High;
    s.put(vec![high]).unwrap();
    h.reopen(false);
    // Never early.
    assert!(payloads(h, "a", 999, 10).is_empty());
    assert_eq!(payloads(h, "a", 1_500, 1), ["n1a"]);
    h.reopen(true);
    assert_eq!(payloads(h, "a", 3_000, 10), ["h25", "n1b", "n2", "n3"]);
    assert!(payloads(h, "a", 8_999, 10).is_empty());
    assert_eq!(payloads(h, "a", 100_000, 10), ["late"]);
}

pub fn lease_lifecycle(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let id = put1(h, task("a", 1_000, "x"));
    let batch = h.store().claim(&q("a"), 1_000, 10, 500).unwrap();
    assert_eq!(batch.leased.len(), 1);
    let first = batch.leased[0].clone();
    assert_eq!(first.task.id, id);
    assert_eq!(first.task.attempts, 1);
    assert_eq!(first.task.state, TaskState::Leased);
    assert_eq!(first.lease_until_ms, 1_500);
    h.reopen(false);
    let s = h.store();
    assert_eq!(s.next_due_ms(&q("a")).unwrap(), Some(1_500));
    assert_eq!(
        s.counts(&q("a"), 1_200).unwrap(),
        QueueCounts {
            pending: 0,
            due: 0,
            in_flight: 1,
            dead: 0,
            oldest_due_ms: None,
        }
    );
    // Extend moves the deadline.
    assert_eq!(
        s.extend(&q("a"), id, first.lease_id, 2_000, 1_400).unwrap(),
        LeaseOutcome::Ok
    );
    assert!(s.claim(&q("a"), 1_900, 10, 500).unwrap().leased.is_empty());
    // The lease expires: the task is due again, the old lease refused.
    let again = s.claim(&q("a"), 2_000, 10, 500).unwrap();
    assert_eq!(again.leased.len(), 1);
    let second = again.leased[0].clone();
    assert_eq!(second.task.attempts, 2);
    assert_ne!(second.lease_id, first.lease_id);
    assert_eq!(
        s.ack(&q("a"), id, first.lease_id, 2_001).unwrap(),
        LeaseOutcome::LeaseExpired
    );
    // Nack schedules a retry.
    assert_eq!(
        s.nack(&q("a"), id, second.lease_id, 5_000, 2_100).unwrap(),
        LeaseOutcome::Ok
    );
    h.reopen(false);
    let s = h.store();
    let t = s.get(&q("a"), id, 2_200).unwrap().unwrap();
    assert_eq!(
        (t.state, t.due_at_ms, t.attempts),
        (TaskState::Scheduled, 5_000, 2)
    );
    assert!(s.claim(&q("a"), 4_999, 10, 500).unwrap().leased.is_empty());
    let third = s.claim(&q("a"), 5_000, 10, 500).unwrap().leased[0].clone();
    assert_eq!(
        s.ack(&q("a"), id, third.lease_id, 5_001).unwrap(),
        LeaseOutcome::Ok
    );
    assert_eq!(
        s.ack(&q("a"), id, third.lease_id, 5_002).unwrap(),
        LeaseOutcome::LeaseExpired
    );
    assert_eq!(
        s.ack(&q("a"), TaskId(12345), third.lease_id, 5_002)
            .unwrap(),
        LeaseOutcome::NotFound
    );
    // Done tasks may be forgotten; if still known they are done.
    if let Some(t) = s.get(&q("a"), id, 5_003).unwrap() {
        assert_eq!(t.state, TaskState::Done);
    }
    assert_eq!(s.next_due_ms(&q("a")).unwrap(), None);
}

pub fn dead_letters(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let ids: Vec<TaskId> = s
        .put(vec![
            task("a", 10, "d1"),
            task("a", 10, "d2"),
            task("a", 10, "d3"),
        ])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let batch = s.claim(&q("a"), 10, 10, 1_000).unwrap();
    for leased in &batch.leased[..2] {
        assert_eq!(
            s.dead_letter(&q("a"), leased.task.id, leased.lease_id, "boom", 20)
                .unwrap(),
            LeaseOutcome::Ok
        );
    }
    // The third's lease expires unanswered; the claim that takes it again (its second
    // attempt) finds it out of attempts and dead-letters it without counting that attempt.
    let again = s.claim(&q("a"), 1_011, 10, 1_000).unwrap();
    assert_eq!(again.leased.len(), 1);
    let third = &again.leased[0];
    assert_eq!((third.task.id, third.task.attempts), (ids[2], 2));
    assert_eq!(
        s.dead_letter_untried(&q("a"), ids[2], third.lease_id, "no answer", 1_012)
            .unwrap(),
        LeaseOutcome::Ok
    );
    h.reopen(false);
    let s = h.store();
    let dead = s.list_dead(&q("a"), None, 10).unwrap();
    assert_eq!(dead.iter().map(|t| t.id).collect::<Vec<_>>(), ids);
    let seen: Vec<(TaskState, u32, Option<&str>)> = dead
        .iter()
        .map(|t| (t.state, t.attempts, t.dead_reason.as_deref()))
        .collect();
    let dead_state = TaskState::Dead;
    assert_eq!(
        seen,
        [
            (dead_state, 1, Some("boom")),
            (dead_state, 1, Some("boom")),
            (dead_state, 1, Some("no answer")),
        ]
    );
    let page = s.list_dead(&q("a"), Some(ids[0]), 1).unwrap();
    assert_eq!(page.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[1]]);
    assert_eq!(s.counts(&q("a"), 2_030).unwrap().dead, 3);
    assert_eq!(
        s.redrive(&q("a"), ids[1], 2_040).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(
        s.redrive(&q("a"), ids[1], 2_040).unwrap(),
        ChangeOutcome::WrongState(TaskState::Scheduled)
    );
    h.reopen(true);
    let s = h.store();
    let t = s.get(&q("a"), ids[1], 2_041).unwrap().unwrap();
    assert_eq!(
        (t.state, t.attempts, t.due_at_ms, t.dead_reason),
        (TaskState::Scheduled, 0, 2_040, None)
    );
    assert_eq!(s.list_dead(&q("a"), None, 10).unwrap().len(), 2);
    assert_eq!(payloads(h, "a", 2_041, 10), ["d2"]);
}

pub fn late_policies(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let mut skip = task("a", 100, "skip");
    skip.late_policy = LatePolicy::Skip { after_ms: 50 };
    let mut dead = task("a", 100, "dead");
    dead.late_policy = LatePolicy::Dead { after_ms: 50 };
    let mut fine = task("a", 100, "fine");
    fine.late_policy = LatePolicy::Skip { after_ms: 500 };
    let ids: Vec<TaskId> = s
        .put(vec![skip, dead, fine])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let batch = s.claim(&q("a"), 200, 10, 1_000).unwrap();
    assert_eq!(batch.late_skipped, [ids[0]]);
    assert_eq!(batch.late_dead, [ids[1]]);
    assert_eq!(batch.leased.len(), 1);
    assert_eq!(batch.leased[0].task.id, ids[2]);
    // Skipped has its own state, so a caller can tell it from a delivered task.
    let skipped = s.get(&q("a"), ids[0], 201).unwrap().map(|t| t.state);
    assert_eq!(skipped, Some(TaskState::Skipped));
    h.reopen(false);
    let t = h.store().get(&q("a"), ids[1], 201).unwrap().unwrap();
    assert_eq!(t.state, TaskState::Dead);
    assert!(t.dead_reason.unwrap().contains("late"));
    // A finished task may be forgotten, but is never remembered as anything else.
    let skipped = h
        .store()
        .get(&q("a"), ids[0], 201)
        .unwrap()
        .map(|t| t.state);
    assert!(
        matches!(skipped, None | Some(TaskState::Skipped)),
        "{skipped:?}"
    );
}

pub fn cancel_and_reschedule(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let far = 400 * 24 * 3_600_000;
    let ids: Vec<TaskId> = s
        .put(vec![
            task("a", 1_000, "c"),
            task("a", 2_000, "r"),
            task("a", far, "far"),
        ])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    assert_eq!(s.cancel(&q("a"), ids[0], 10).unwrap(), ChangeOutcome::Ok);
    assert_eq!(
        s.cancel(&q("a"), ids[0], 10).unwrap(),
        ChangeOutcome::WrongState(TaskState::Cancelled)
    );
    assert_eq!(
        s.cancel(&q("a"), TaskId(ids[0].0 + (1 << 80)), 10).unwrap(),
        ChangeOutcome::NotFound
    );
    assert_eq!(
        s.reschedule(&q("a"), ids[1], 500, 10).unwrap(),
        ChangeOutcome::Ok
    );
    // A far task brought near, and a near one sent far.
    assert_eq!(
        s.reschedule(&q("a"), ids[2], 700, 10).unwrap(),
        ChangeOutcome::Ok
    );
    h.reopen(false);
    assert_eq!(h.store().next_due_ms(&q("a")).unwrap(), Some(500));
    assert_eq!(payloads(h, "a", 600, 10), ["r"]);
    h.reopen(true);
    assert_eq!(payloads(h, "a", 3_000, 10), ["far"]);
    let s = h.store();
    assert_eq!(
        s.reschedule(&q("a"), ids[2], 9_000, 3_001).unwrap(),
        ChangeOutcome::WrongState(TaskState::Leased)
    );
}

pub fn idempotency(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put_queue(&q("b"), Bytes::new()).unwrap();
    let keyed = |queue: &str, payload: &str| {
        let mut t = task(queue, 1_000, payload);
        t.idempotency_key = Some("k".into());
        t
    };
    let out = s
        .put(vec![
            keyed("a", "first"),
            keyed("a", "second"),
            keyed("b", "other"),
        ])
        .unwrap();
    let first = created(&out[0]);
    match &out[1] {
        PutOutcome::Duplicate(t) => {
            assert_eq!(t.id, first);
            assert_eq!(&t.payload[..], b"first");
        }
        other => panic!("{other:?}"),
    }
    created(&out[2]);
    h.reopen(false);
    let out = h.store().put(vec![keyed("a", "third")]).unwrap();
    assert_eq!(out[0].id(), first);
    assert!(matches!(out[0], PutOutcome::Duplicate(_)));
    h.reopen(true);
    let out = h.store().put(vec![keyed("a", "fourth")]).unwrap();
    assert_eq!(out[0].id(), first);
    assert_eq!(payloads(h, "a", 1_000, 10), ["first"]);
}

pub fn counts_forecast_next_due(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put_queue(&q("empty"), Bytes::new()).unwrap();
    assert_eq!(s.next_due_ms(&q("empty")).unwrap(), None);
    let hour = 3_600_000;
    let mut tasks = Vec::new();
    for i in 0..10u64 {
        tasks.push(task("a", 1_000 + i * 1_000, "near"));
    }
    for i in 0..5u64 {
        tasks.push(task("a", 30 * 24 * hour + i * hour, "far"));
    }
    s.put(tasks).unwrap();
    h.reopen(false);
    let s = h.store();
    assert_eq!(
        s.counts(&q("a"), 5_000).unwrap(),
        QueueCounts {
            pending: 15,
            due: 5,
            in_flight: 0,
            dead: 0,
            oldest_due_ms: Some(1_000),
        }
    );
    assert_eq!(s.next_due_ms(&q("a")).unwrap(), Some(1_000));
    assert_eq!(s.forecast(&q("a"), 0, 5_000, 3).unwrap(), vec![4, 5, 1]);
    assert_eq!(
        s.forecast(&q("a"), 30 * 24 * hour, 2 * hour, 3).unwrap(),
        vec![2, 2, 1]
    );
    assert!(matches!(
        s.forecast(&q("a"), 0, 0, 3),
        Err(StoreError::Invalid(_))
    ));
    h.reopen(true);
    let s = h.store();
    s.claim(&q("a"), 10_000, 100, 1_000).unwrap();
    assert_eq!(s.next_due_ms(&q("a")).unwrap(), Some(11_000));
    assert_eq!(
        s.counts(&q("a"), 10_000).unwrap(),
        QueueCounts {
            pending: 5,
            due: 0,
            in_flight: 10,
            dead: 0,
            oldest_due_ms: None,
        }
    );
    // Once the leases expire the earliest far task is next... after the re-deliveries.
    let counts = s.counts(&q("a"), 11_000).unwrap();
    // ...each at its original due time.
    assert_eq!((counts.due, counts.oldest_due_ms), (10, Some(1_000)));
}

pub fn queue_delete_removes_tasks(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put(vec![task("a", 10, "x"), task("a", 10_000_000_000, "y")])
        .unwrap();
    assert!(s.delete_queue(&q("a")).unwrap());
    h.reopen(false);
    let s = h.store();
    assert!(s.put_queue(&q("a"), Bytes::new()).unwrap());
    assert_eq!(s.counts(&q("a"), 20).unwrap(), QueueCounts::default());
    assert!(payloads(h, "a", 20_000_000_000, 10).is_empty());
}

pub fn queues_are_isolated(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("busy"), Bytes::new()).unwrap();
    s.put_queue(&q("quiet"), Bytes::new()).unwrap();
    let backlog: Vec<NewTask> = (0..500).map(|i| task("busy", i, "b")).collect();
    s.put(backlog).unwrap();
    put1(h, task("quiet", 100, "q"));
    assert_eq!(payloads(h, "quiet", 1_000, 10), ["q"]);
    assert_eq!(h.store().counts(&q("busy"), 1_000).unwrap().due, 500);
}

pub fn clock_jumps_never_fire_early_nor_lose_tasks(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    let day = 24 * 3_600_000;
    s.put(vec![
        task("a", 10 * day, "t1"),
        task("a", 10 * day + 1, "t2"),
    ])
    .unwrap();
    // The clock jumps far ahead (buckets load, leases are taken)...
    let batch = s.claim(&q("a"), 10 * day, 1, 1_000).unwrap();
    assert_eq!(batch.leased.len(), 1);
    h.reopen(false);
    // ...then back by days: nothing is due, nothing is lost.
    let s = h.store();
    assert!(s.claim(&q("a"), day, 10, 1_000).unwrap().leased.is_empty());
    let counts = s.counts(&q("a"), day).unwrap();
    assert_eq!((counts.pending, counts.due, counts.in_flight), (1, 0, 1));
    h.reopen(true);
    // Forward again: the other task, then the first once its lease has expired.
    assert_eq!(payloads(h, "a", 10 * day + 1, 10), ["t2"]);
    assert_eq!(payloads(h, "a", 10 * day + 1_000, 10), ["t1"]);
}

/// A batch ack answers each pair as `ack` would, called for each in order: valid, stale
/// lease, unknown id, and a task named twice (done after its first ack) in one batch.
pub fn ack_many_matches_sequential_acks(h: &mut dyn Harness) {
    const NOW: u64 = 1_000;
    let mut answers = Vec::new();
    let mut tasks = Vec::new();
    for (name, batched) in [("seq", false), ("many", true)] {
        let s = h.store();
        s.put_queue(&q(name), Bytes::new()).unwrap();
        let ids: Vec<TaskId> = (0..4)
            .map(|i| put1(h, task(name, NOW, &format!("t{i}"))))
            .collect();
        let s = h.store();
        let mut leased = s.claim(&q(name), NOW, 10, 100_000).unwrap().leased;
        // In put order (ids need not grow with it: a partitioned store numbers each
        // partition on its own).
        leased.sort_by_key(|l| ids.iter().position(|id| *id == l.task.id));
        assert_eq!(leased.len(), 4);
        let lease = |i: usize| leased[i].lease_id;
        assert_eq!(leased.iter().map(|l| l.task.id).collect::<Vec<_>>(), ids);
        let acks = [
            (ids[0], lease(0)),
            (ids[1], lease(2)), // another task's lease: stale for this one
            (TaskId(12345), lease(0)),
            (ids[0], lease(0)), // again: done by the first
            (ids[2], lease(2)),
        ];
        let outcomes = if batched {
            s.ack_many(&q(name), &acks, NOW + 1).unwrap()
        } else {
            acks.iter()
                .map(|&(id, l)| s.ack(&q(name), id, l, NOW + 1).unwrap())
                .collect()
        };
        answers.push(outcomes);
        tasks.push(ids);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[1],
        [
            LeaseOutcome::Ok,
            LeaseOutcome::LeaseExpired,
            LeaseOutcome::NotFound,
            LeaseOutcome::LeaseExpired,
            LeaseOutcome::Ok,
        ]
    );
    assert!(h
        .store()
        .ack_many(&q("many"), &[], NOW + 1)
        .unwrap()
        .is_empty());
    let check = |h: &dyn Harness| {
        for (name, ids) in [("seq", &tasks[0]), ("many", &tasks[1])] {
            for (i, id) in ids.iter().enumerate() {
                let state = h
                    .store()
                    .get(&q(name), *id, NOW + 2)
                    .unwrap()
                    .map(|t| t.state);
                if i == 0 || i == 2 {
                    // Done tasks may be forgotten; if still known they are done.
                    assert!(matches!(state, None | Some(TaskState::Done)), "{name} {i}");
                } else {
                    assert_eq!(state, Some(TaskState::Leased), "{name} {i}");
                }
            }
        }
    };
    check(h);
    // A crash of the process keeps the batch's acks, all of them (written before it returned).
    h.crash();
    check(h);
    h.reopen(false);
    check(h);
}

/// Claims and ack batches of hundreds of tasks, more than the embedded engine does under
/// one hold of its lock (it works in chunks of 128 records): a claim still takes the due
/// tasks high priority first and then by due time, never one twice nor one not yet due; the
/// late ones are skipped without counting towards `max`; an ack batch with repeats answers
/// as sequential acks would; and what it acked stays acked after a crash of the process.
pub fn claims_and_ack_batches_of_hundreds(h: &mut dyn Harness) {
    const NOW: u64 = 100_000;
    let s = h.store();
    s.put_queue(&q("big"), Bytes::new()).unwrap();
    let mut tasks = Vec::new();
    let mut expected = Vec::new();
    let mut late = BTreeSet::new();
    for i in 0..150u64 {
        let mut t = task("big", NOW - 500 + i, &format!("h{i:04}"));
        t.priority = Priority::High;
        tasks.push(t);
        expected.push(format!("h{i:04}"));
    }
    for i in 0..600u64 {
        // All due by NOW, at least 401 ms before it; every seventh may be 10 ms late.
        let mut t = task("big", NOW - 1_000 + i, &format!("n{i:04}"));
        if i % 7 == 3 {
            t.late_policy = LatePolicy::Skip { after_ms: 10 };
            late.insert(format!("n{i:04}"));
        } else {
            expected.push(format!("n{i:04}"));
        }
        tasks.push(t);
    }
    for i in 0..100u64 {
        tasks.push(task("big", NOW + 10_000 + i, &format!("f{i:04}")));
    }
    let ids: Vec<TaskId> = s.put(tasks).unwrap().iter().map(created).collect();
    let payload_of = |id: TaskId| -> String {
        let i = ids.iter().position(|x| *x == id).unwrap();
        match i {
            0..150 => format!("h{i:04}"),
            150..750 => format!("n{:04}", i - 150),
            _ => format!("f{:04}", i - 750),
        }
    };
    let first = s.claim(&q("big"), NOW, 300, 100_000_000).unwrap();
    assert_eq!(first.leased.len(), 300);
    let second = s.claim(&q("big"), NOW, 1_000, 100_000_000).unwrap();
    assert!(s
        .claim(&q("big"), NOW, 1_000, 100_000_000)
        .unwrap()
        .leased
        .is_empty());
    let leased: Vec<_> = first.leased.iter().chain(&second.leased).collect();
    let got: Vec<String> = leased.iter().map(|l| payload_of(l.task.id)).collect();
    assert_eq!(got, expected);
    let skipped: BTreeSet<String> = first
        .late_skipped
        .iter()
        .chain(&second.late_skipped)
        .map(|id| payload_of(*id))
        .collect();
    assert_eq!(skipped, late);
    assert_eq!(
        first.late_skipped.len() + second.late_skipped.len(),
        late.len()
    );

    // Every lease, then the first 50 again: done by then.
    let mut acks: Vec<(TaskId, LeaseId)> = leased.iter().map(|l| (l.task.id, l.lease_id)).collect();
    acks.extend_from_within(..50);
    let outcomes = h.store().ack_many(&q("big"), &acks, NOW + 1).unwrap();
    let mut want = vec![LeaseOutcome::Ok; leased.len()];
    want.extend([LeaseOutcome::LeaseExpired; 50]);
    assert_eq!(outcomes, want);

    h.crash();
    let counts = h.store().counts(&q("big"), NOW + 2).unwrap();
    assert_eq!((counts.due, counts.in_flight, counts.dead), (0, 0, 0));
    let future: Vec<String> = (0..100).map(|i| format!("f{i:04}")).collect();
    assert_eq!(payloads(h, "big", NOW + 20_000, 1_000), future);
}

fn b(text: &str) -> Bytes {
    Bytes::from(text.to_owned())
}

fn sched(h: &dyn Harness) -> Vec<(String, Bytes)> {
    h.store().list_meta("sched").unwrap()
}

/// `write_meta` applies its changes in order (a put then a delete of one key leaves no key; a
/// later put wins), and what it wrote survives clean and unclean restarts, before and after a
/// checkpoint.
pub fn write_meta_in_order_and_durable(h: &mut dyn Harness) {
    h.store().write_meta(Vec::new()).unwrap();
    h.store()
        .write_meta(vec![
            MetaChange::put("sched", "a", b("1")),
            MetaChange::put("sched", "b", b("2")),
            MetaChange::delete("sched", "a"),
            MetaChange::put("sched", "c", b("3")),
            MetaChange::put("sched", "b", b("22")),
            MetaChange::put("other", "a", b("o")),
            MetaChange::delete("sched", "never-there"),
        ])
        .unwrap();
    let expected = vec![("b".to_owned(), b("22")), ("c".to_owned(), b("3"))];
    assert_eq!(sched(h), expected);
    h.crash();
    assert_eq!(sched(h), expected);
    h.reopen(false);
    assert_eq!(sched(h), expected);
    assert_eq!(h.store().get_meta("other", "a").unwrap(), Some(b("o")));
    // After a checkpoint (clean reopen), changes on top of it, then a crash.
    h.reopen(true);
    h.store()
        .write_meta(vec![
            MetaChange::delete("sched", "b"),
            MetaChange::put("sched", "d", b("4")),
        ])
        .unwrap();
    h.store().put_meta("sched", "c", b("33")).unwrap();
    assert!(h.store().delete_meta("other", "a").unwrap());
    h.crash();
    assert_eq!(
        sched(h),
        vec![("c".to_owned(), b("33")), ("d".to_owned(), b("4"))]
    );
    assert_eq!(h.store().list_meta("other").unwrap(), Vec::new());
    h.reopen(true);
    assert_eq!(
        sched(h),
        vec![("c".to_owned(), b("33")), ("d".to_owned(), b("4"))]
    );
}

/// `get_meta_many` answers each key as `get_meta` would, in the order asked: missing keys,
/// a key asked twice, another namespace's key, and more keys than one batch of a networked
/// store's reads.
pub fn get_meta_many_answers_in_order(h: &mut dyn Harness) {
    let keys: Vec<String> = (0..2_500).map(|i| format!("s{i:05}")).collect();
    let changes = keys
        .iter()
        .map(|k| MetaChange::put("sched", k, b(&format!("v-{k}"))));
    h.store().write_meta(changes.collect()).unwrap();
    h.store().put_meta("other", "only-there", b("o")).unwrap();
    assert_eq!(h.store().get_meta_many("sched", &[]).unwrap(), Vec::new());
    // Backwards, with gaps, a repeat and keys that are not there (or are elsewhere).
    let mut asked: Vec<&str> = keys.iter().rev().step_by(2).map(String::as_str).collect();
    asked.extend(["s00001", "absent", "only-there", "s00001", "s02499"]);
    let expected: Vec<Option<Bytes>> = asked
        .iter()
        .map(|k| h.store().get_meta("sched", k).unwrap())
        .collect();
    assert_eq!(expected.iter().filter(|v| v.is_none()).count(), 2);
    assert_eq!(h.store().get_meta_many("sched", &asked).unwrap(), expected);
    h.reopen(false);
    assert_eq!(h.store().get_meta_many("sched", &asked).unwrap(), expected);
}

/// No reader ever sees part of a `write_meta`: a writer moves two cursors together, a reader
/// checks they always agree. The writer goes on until the reader has looked many times while
/// it was writing, so a store that applies the changes one call at a time fails.
pub fn write_meta_is_seen_whole(h: &mut dyn Harness) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const READS_MIN: u64 = 5_000;
    const WRITES_MAX: u64 = 1_000_000;
    let pair = |n: u64| {
        vec![
            MetaChange::put("sched", "left", Bytes::from(n.to_string())),
            MetaChange::put("sched", "right", Bytes::from(n.to_string())),
        ]
    };
    h.store().write_meta(pair(0)).unwrap();
    let store = h.store();
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let last = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut n = 0;
            while n < 50 || (reads.load(Ordering::Relaxed) < READS_MIN && n < WRITES_MAX) {
                n += 1;
                store.write_meta(pair(n)).unwrap();
            }
            done.store(true, Ordering::Release);
            n
        });
        while !done.load(Ordering::Acquire) {
            let seen = store.list_meta("sched").unwrap();
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0].1, seen[1].1, "saw half of a write_meta: {seen:?}");
            reads.fetch_add(1, Ordering::Relaxed);
        }
        writer.join().unwrap()
    });
    h.crash();
    let last = Bytes::from(last.to_string());
    assert_eq!(
        sched(h),
        vec![
            ("left".to_owned(), last.clone()),
            ("right".to_owned(), last)
        ]
    );
}

/// One scenario: it runs against the store of the harness it is given, and panics on a
/// divergence from the contract.
pub type Scenario = fn(&mut dyn Harness);

/// Every scenario by name, for a harness that runs them itself (and for the check that a
/// backend's test binary runs them all).
pub fn scenarios() -> Vec<(&'static str, Scenario)> {
    crate::__conformance_scenario_names!(__conformance_named {})
}

/// The scenarios' names, in order: the one list, handed to `$callback!` after `$prefix`, from
/// which both [`scenarios`] and [`conformance_tests!`](crate::conformance_tests) are made.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenario_names {
    ($callback:ident { $($prefix:tt)* }) => {
        $crate::$callback! { $($prefix)*
        queues_and_meta,
        write_meta_in_order_and_durable,
        get_meta_many_answers_in_order,
        write_meta_is_seen_whole,
        ack_many_matches_sequential_acks,
        claims_and_ack_batches_of_hundreds,
        put_get_round_trip,
        task_targets,
        claim_order,
        lease_lifecycle,
        dead_letters,
        dead_letters_settled,
        dead_letters_settled_in_hundreds,
        late_policies,
        cancel_and_reschedule,
        cancel_many_matches_single_cancels,
        cancel_many_empties_far_buckets,
        live_tasks_listed_once,
        live_tasks_listed_in_thousands,
        idempotency,
        counts_forecast_next_due,
        oldest_due_in_counts,
        expired_leases_reported_once,
        queue_delete_removes_tasks,
        queue_purge_drops_every_task_and_keeps_the_queue,
        queues_are_isolated,
        clock_jumps_never_fire_early_nor_lose_tasks,
        subscriptions_basics,
        subscriptions_many,
        }
    };
}

/// `(name, scenario)` pairs from the scenarios' names (for [`scenarios`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_named {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $crate::conformance::$name as $crate::conformance::Scenario)),*]
    };
}

/// Writes one `#[test]` per scenario, each `fn NAME() { run(NAME) }` where `run` is a path to
/// a `fn(fn(&mut dyn Harness))` that builds a fresh harness and calls the scenario with it,
/// plus a test that the list is complete. Use it inside a module per backend:
///
/// ```ignore
/// mod memory {
///     belfry_store::conformance_tests!(super::run_on_memory);
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($run:path) => {
        $crate::__conformance_scenario_names!(conformance_tests { @tests $run; });
    };
    (@tests $run:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $run($crate::conformance::$name);
            }
        )*
        #[test]
        fn every_scenario_is_run() {
            let run: Vec<&str> = vec![$(stringify!($name)),*];
            let all: Vec<&str> = $crate::conformance::scenarios()
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            assert_eq!(run, all);
        }
    };
}
