//! Settling dead letters: discarding one, and redriving or discarding many in one call,
//! across a crash.

use belfry_core::{TaskId, TaskState};

use super::{created, q, task, Harness};
use crate::{ChangeOutcome, DeadAction, LeaseOutcome};

/// Puts `n` tasks into `queue` due at 10 and dead-letters each at its first attempt.
fn dead_tasks(h: &dyn Harness, queue: &str, n: usize) -> Vec<TaskId> {
    let s = h.store();
    let tasks = (0..n).map(|i| task(queue, 10, &format!("{queue}{i}")));
    let ids: Vec<TaskId> = s
        .put(tasks.collect())
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let leased = s.claim(&q(queue), 10, n, 1_000).unwrap().leased;
    assert_eq!(leased.len(), n);
    for l in &leased {
        let outcome = s.dead_letter(&q(queue), l.task.id, l.lease_id, "boom", 20);
        assert_eq!(outcome.unwrap(), LeaseOutcome::Ok);
    }
    ids
}

fn state_of(h: &dyn Harness, id: TaskId, now: u64) -> (TaskState, Option<String>) {
    let t = h.store().get(&q("a"), id, now).unwrap().unwrap();
    (t.state, t.dead_reason)
}

pub fn dead_letters_settled(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), bytes::Bytes::new()).unwrap();
    s.put_queue(&q("b"), bytes::Bytes::new()).unwrap();
    let ids = dead_tasks(h, "a", 4);
    let elsewhere = dead_tasks(h, "b", 1)[0];
    let scheduled = super::put1(h, task("a", 5_000, "later"));
    let s = h.store();

    // One discarded: it is finished as cancelled, without its reason, and listed no more.
    let discard = |id| s.discard_dead(&q("a"), id, 30).unwrap();
    assert_eq!(discard(ids[0]), ChangeOutcome::Ok);
    assert_eq!(
        discard(ids[0]),
        ChangeOutcome::WrongState(TaskState::Cancelled)
    );
    assert_eq!(
        discard(scheduled),
        ChangeOutcome::WrongState(TaskState::Scheduled)
    );
    assert_eq!(discard(elsewhere), ChangeOutcome::NotFound);
    assert_eq!(state_of(h, ids[0], 31), (TaskState::Cancelled, None));
    assert_eq!(s.counts(&q("a"), 31).unwrap().dead, 3);

    // Many at once: the outcomes are those of the single calls in order, repeats included.
    let redrive = [ids[1], ids[1], ids[2], scheduled, elsewhere, ids[0]];
    assert_eq!(
        s.settle_dead(&q("a"), &redrive, DeadAction::Redrive, 40)
            .unwrap(),
        [
            ChangeOutcome::Ok,
            ChangeOutcome::WrongState(TaskState::Scheduled),
            ChangeOutcome::Ok,
            ChangeOutcome::WrongState(TaskState::Scheduled),
            ChangeOutcome::NotFound,
            ChangeOutcome::WrongState(TaskState::Cancelled),
        ]
    );
    assert_eq!(
        s.settle_dead(&q("a"), &[ids[3], ids[3], ids[1]], DeadAction::Discard, 50)
            .unwrap(),
        [
            ChangeOutcome::Ok,
            ChangeOutcome::WrongState(TaskState::Cancelled),
            ChangeOutcome::WrongState(TaskState::Scheduled),
        ]
    );
    assert!(s
        .settle_dead(&q("a"), &[], DeadAction::Discard, 50)
        .unwrap()
        .is_empty());
    // The other queue's dead letter is untouched.
    assert_eq!(s.list_dead(&q("b"), None, 10).unwrap()[0].id, elsewhere);

    // A crash keeps every settled change: they were acknowledged durable.
    h.crash();
    let s = h.store();
    assert!(s.list_dead(&q("a"), None, 10).unwrap().is_empty());
    assert_eq!(s.counts(&q("a"), 60).unwrap().dead, 0);
    for (id, state) in [
        (ids[0], TaskState::Cancelled),
        (ids[1], TaskState::Scheduled),
        (ids[2], TaskState::Scheduled),
        (ids[3], TaskState::Cancelled),
    ] {
        assert_eq!(state_of(h, id, 60), (state, None), "{id}");
    }
    let redriven = h.store().get(&q("a"), ids[1], 60).unwrap().unwrap();
    assert_eq!((redriven.attempts, redriven.due_at_ms), (0, 40));
    let mut again = super::payloads(h, "a", 60, 10);
    again.sort();
    assert_eq!(again, ["a1", "a2"]);
}

/// More dead letters than one chunk of the engine's lock (128), settled in one call each
/// way, then a crash: every outcome is right and every change survives.
pub fn dead_letters_settled_in_hundreds(h: &mut dyn Harness) {
    h.store().put_queue(&q("a"), bytes::Bytes::new()).unwrap();
    let ids = dead_tasks(h, "a", 300);
    let (redrive, discard) = ids.split_at(170);
    let s = h.store();
    let all_ok = |outcomes: Vec<ChangeOutcome>| outcomes.iter().all(|o| *o == ChangeOutcome::Ok);
    assert!(all_ok(
        s.settle_dead(&q("a"), redrive, DeadAction::Redrive, 30)
            .unwrap()
    ));
    // The discards name every task: the redriven ones answer that they are scheduled.
    let outcomes = s
        .settle_dead(&q("a"), &ids, DeadAction::Discard, 40)
        .unwrap();
    assert!(outcomes[..170]
        .iter()
        .all(|o| *o == ChangeOutcome::WrongState(TaskState::Scheduled)));
    assert!(all_ok(outcomes[170..].to_vec()));
    h.crash();
    let s = h.store();
    assert!(s.list_dead(&q("a"), None, 1_000).unwrap().is_empty());
    for id in discard {
        assert_eq!(state_of(h, *id, 50).0, TaskState::Cancelled, "{id}");
    }
    let leased = s.claim(&q("a"), 50, 1_000, 1_000).unwrap().leased;
    let mut got: Vec<TaskId> = leased.iter().map(|l| l.task.id).collect();
    got.sort();
    assert_eq!(got, redrive);
}
