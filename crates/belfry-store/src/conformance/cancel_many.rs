//! Cancelling many tasks in one call: the outcomes of the single calls in order, durable, and
//! a far time bucket emptied by it leaves the queue's counts and next due time right.

use belfry_core::{TaskId, TaskState};
use bytes::Bytes;

use super::{created, q, task, Harness};
use crate::{ChangeOutcome, LeaseOutcome};

const DAY: u64 = 24 * 3_600_000;

pub fn cancel_many_matches_single_cancels(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put_queue(&q("b"), Bytes::new()).unwrap();
    let mut keyed = task("a", 50 * DAY, "keyed");
    keyed.idempotency_key = Some("k1".into());
    let ids: Vec<TaskId> = s
        .put(vec![
            task("a", 10, "leased"),
            task("a", 11, "dead"),
            task("a", 5_000, "near"),
            keyed,
            task("a", 50 * DAY, "far"),
        ])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let elsewhere = created(&s.put(vec![task("b", 5_000, "b")]).unwrap()[0]);
    let leased = s.claim(&q("a"), 20, 2, 1_000_000).unwrap().leased;
    assert_eq!(leased.len(), 2);
    let dead = leased.iter().find(|l| l.task.id == ids[1]).unwrap();
    let outcome = s.dead_letter(&q("a"), dead.task.id, dead.lease_id, "boom", 21);
    assert_eq!(outcome.unwrap(), LeaseOutcome::Ok);

    let asked = [ids[2], ids[0], ids[3], ids[2], ids[1], elsewhere, ids[4]];
    assert_eq!(
        s.cancel_many(&q("a"), &asked, 30).unwrap(),
        vec![
            ChangeOutcome::Ok,
            ChangeOutcome::WrongState(TaskState::Leased),
            ChangeOutcome::Ok,
            ChangeOutcome::WrongState(TaskState::Cancelled),
            ChangeOutcome::WrongState(TaskState::Dead),
            ChangeOutcome::NotFound,
            ChangeOutcome::Ok,
        ]
    );
    assert!(s.cancel_many(&q("a"), &[], 31).unwrap().is_empty());
    h.crash();
    let s = h.store();
    for id in [ids[2], ids[3], ids[4]] {
        let state = s.get(&q("a"), id, 40).unwrap().map(|t| t.state);
        assert!(
            matches!(state, None | Some(TaskState::Cancelled)),
            "{id}: {state:?}"
        );
    }
    let counts = s.counts(&q("a"), 40).unwrap();
    assert_eq!((counts.pending, counts.in_flight, counts.dead), (0, 1, 1));
    // The other queue's task is untouched.
    let b = s.get(&q("b"), elsewhere, 40).unwrap().unwrap();
    assert_eq!(b.state, TaskState::Scheduled);
}

/// Hundreds of far tasks over a few due times, all but the latest cancelled in one call:
/// what is left is counted, and due when it should be.
pub fn cancel_many_empties_far_buckets(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    // Put one at a time so an engine's bucket is unloaded (far) when most of them arrive.
    let mut ids = Vec::new();
    for i in 0..600u64 {
        let due = 40 * DAY + (i % 3) * 60_000;
        ids.push(created(
            &s.put(vec![task("a", due, &format!("t{i}"))]).unwrap()[0],
        ));
    }
    h.reopen(true);
    let s = h.store();
    let (last, rest): (Vec<_>, Vec<_>) = ids
        .iter()
        .enumerate()
        .partition(|(i, _)| *i == 599 || *i == 596);
    let rest: Vec<TaskId> = rest.into_iter().map(|(_, id)| *id).collect();
    let outcomes = s.cancel_many(&q("a"), &rest, 100).unwrap();
    assert!(outcomes.iter().all(|o| *o == ChangeOutcome::Ok));
    for reopened in [false, true] {
        if reopened {
            h.crash();
        }
        let s = h.store();
        assert_eq!(s.counts(&q("a"), 100).unwrap().pending, 2, "{reopened}");
        // Tasks 596 and 599 are left, both due at 40 days + 2 minutes: the next due time is
        // no later (a store may answer earlier, as a hint it keeps), and nothing is early.
        let next = s.next_due_ms(&q("a")).unwrap();
        assert!(
            next.is_some_and(|at| at <= 40 * DAY + 2 * 60_000),
            "{next:?}"
        );
        let early = s
            .claim(&q("a"), 40 * DAY + 2 * 60_000 - 1, 10, 1_000)
            .unwrap();
        assert!(early.leased.is_empty(), "{reopened}");
    }
    let mut left: Vec<TaskId> = last.iter().map(|(_, id)| **id).collect();
    left.sort();
    let claimed = h
        .store()
        .claim(&q("a"), 41 * DAY, 10, 1_000)
        .unwrap()
        .leased;
    let mut got: Vec<TaskId> = claimed.iter().map(|l| l.task.id).collect();
    got.sort();
    assert_eq!(got, left);
}
