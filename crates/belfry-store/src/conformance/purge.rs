//! Purging a queue: every task goes — scheduled, leased, dead — and the queue stays, with
//! its configuration, across a crash.

use belfry_core::TaskId;
use bytes::Bytes;

use super::{created, payloads, put1, q, task, Harness};
use crate::{LeaseOutcome, PutOutcome, QueueCounts};

pub fn queue_purge_drops_every_task_and_keeps_the_queue(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::from_static(b"cfg-a")).unwrap();
    s.put_queue(&q("b"), Bytes::new()).unwrap();
    let mut keyed = task("a", 10, "keyed");
    keyed.idempotency_key = Some("k1".into());
    let ids: Vec<TaskId> = s
        .put(vec![
            keyed.clone(),
            task("a", 10, "leased"),
            task("a", 10, "dead"),
            task("a", 10_000_000_000, "far"),
        ])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let other = put1(h, task("b", 10, "other"));
    let s = h.store();
    let leased = s.claim(&q("a"), 20, 3, 1_000_000).unwrap().leased;
    assert_eq!(leased.len(), 3);
    let (dead, lease) = (leased[2].task.id, leased[2].lease_id);
    assert_eq!(
        s.dead_letter(&q("a"), dead, lease, "boom", 21).unwrap(),
        LeaseOutcome::Ok
    );

    assert!(s.purge_queue(&q("a")).unwrap());
    assert!(!s.purge_queue(&q("missing")).unwrap());
    assert_eq!(s.counts(&q("a"), 30).unwrap(), QueueCounts::default());
    for id in &ids {
        assert!(s.get(&q("a"), *id, 30).unwrap().is_none(), "{id}");
    }
    assert!(s.list_dead(&q("a"), None, 10).unwrap().is_empty());
    // A lease taken before the purge holds nothing.
    let (id, lease) = (leased[0].task.id, leased[0].lease_id);
    assert_eq!(
        s.ack(&q("a"), id, lease, 31).unwrap(),
        LeaseOutcome::NotFound
    );
    // The queue and its configuration stay; the purged task's key is free.
    assert_eq!(
        s.get_queue(&q("a")).unwrap().as_deref(),
        Some(&b"cfg-a"[..])
    );
    let again = match &s.put(vec![keyed]).unwrap()[0] {
        PutOutcome::Created { id, .. } => *id,
        other => panic!("the key of a purged task is free: {other:?}"),
    };
    assert!(!ids.contains(&again));
    // Another queue is untouched.
    assert_eq!(s.get(&q("b"), other, 30).unwrap().unwrap().id, other);

    h.crash();
    let s = h.store();
    assert_eq!(s.counts(&q("a"), 40).unwrap().pending, 1);
    assert_eq!(s.counts(&q("b"), 40).unwrap().pending, 1);
    assert!(s.get(&q("a"), ids[3], 40).unwrap().is_none());
    assert_eq!(payloads(h, "a", 20_000_000_000, 10), ["keyed"]);
}
