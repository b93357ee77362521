//! What a queue's lag is made of: the due time of its oldest waiting task (in `counts`), and
//! leases that ran out (in `ClaimBatch::leases_expired`), each reported by one claim.

use belfry_core::{Priority, TaskId};
use bytes::Bytes;

use super::{created, put1, q, task, Harness};
use crate::{ChangeOutcome, LeaseOutcome};

/// `counts(queue, now).oldest_due_ms`, checked against `due` (set exactly when something is).
fn oldest(h: &dyn Harness, queue: &str, now: u64) -> Option<u64> {
    let counts = h.store().counts(&q(queue), now).unwrap();
    assert_eq!(counts.oldest_due_ms.is_some(), counts.due > 0, "{counts:?}");
    counts.oldest_due_ms
}

pub fn oldest_due_in_counts(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    s.put_queue(&q("far"), Bytes::new()).unwrap();
    assert_eq!(oldest(h, "a", 1_000), None);
    let mut high = task("a", 2_000, "high");
    high.priority = Priority::High;
    let day = 24 * 3_600_000;
    let s = h.store();
    s.put(vec![
        task("a", 1_500, "normal"),
        high,
        task("a", 3_000, "later"),
        task("a", 30 * day, "far"),
    ])
    .unwrap();
    // Only a far task (on Redis it waits in a bucket that no claim has promoted).
    put1(h, task("far", 30 * day, "alone"));
    assert_eq!(oldest(h, "a", 1_000), None);
    // The earliest due, whatever its priority (not the one a claim takes first).
    assert_eq!(oldest(h, "a", 2_500), Some(1_500));
    h.reopen(false);
    assert_eq!(oldest(h, "a", 2_500), Some(1_500));
    // Leased tasks wait no longer; the high one's lease ends at 3_500.
    let taken = h.store().claim(&q("a"), 2_500, 1, 1_000).unwrap().leased;
    assert_eq!(taken[0].task.due_at_ms, 2_000);
    assert_eq!(oldest(h, "a", 2_600), Some(1_500));
    let taken = h.store().claim(&q("a"), 2_600, 1, 100_000).unwrap().leased;
    assert_eq!(taken[0].task.due_at_ms, 1_500);
    assert_eq!(oldest(h, "a", 2_700), None);
    assert_eq!(oldest(h, "a", 3_200), Some(3_000));
    // A lease that ran out waits again since its original due time.
    assert_eq!(oldest(h, "a", 3_600), Some(2_000));
    h.reopen(true);
    assert_eq!(oldest(h, "a", 3_700), Some(2_000));
    assert_eq!(oldest(h, "far", 30 * day - 1), None);
    assert_eq!(oldest(h, "far", 30 * day + 5_000), Some(30 * day));
    // By then the normal task's lease (to 102_600) has run out too.
    assert_eq!(oldest(h, "a", 30 * day + 5_000), Some(1_500));
}

pub fn expired_leases_reported_once(h: &mut dyn Harness) {
    let s = h.store();
    s.put_queue(&q("a"), Bytes::new()).unwrap();
    // One put: on Redis the four share a partition, so the cancel below ends the leases.
    let ids: Vec<TaskId> = s
        .put(vec![
            task("a", 10, "x"),
            task("a", 10, "y"),
            task("a", 10, "z"),
            task("a", 1_000_000_000, "later"),
        ])
        .unwrap()
        .iter()
        .map(created)
        .collect();
    let later = ids[3];
    let first = s.claim(&q("a"), 10, 10, 100).unwrap();
    assert_eq!((first.leased.len(), first.leases_expired), (3, 0));
    // Acked in time: not expired.
    let acked = &first.leased[0];
    let outcome = s.ack(&q("a"), acked.task.id, acked.lease_id, 50).unwrap();
    assert_eq!(outcome, LeaseOutcome::Ok);
    assert_eq!(s.claim(&q("a"), 109, 10, 100).unwrap().leases_expired, 0);
    // Calls other than claims that end leases (counts, a late ack, a cancel) leave the
    // report to the next claim.
    assert_eq!(s.counts(&q("a"), 200).unwrap().due, 2);
    let late = &first.leased[1];
    let outcome = s.ack(&q("a"), late.task.id, late.lease_id, 200).unwrap();
    assert_eq!(outcome, LeaseOutcome::LeaseExpired);
    assert_eq!(s.cancel(&q("a"), later, 200).unwrap(), ChangeOutcome::Ok);
    let again = s.claim(&q("a"), 200, 10, 10_000).unwrap();
    assert_eq!((again.leased.len(), again.leases_expired), (2, 2));
    // Reported once, and not again after a restart.
    assert_eq!(s.claim(&q("a"), 300, 10, 10_000).unwrap().leases_expired, 0);
    h.reopen(false);
    let s = h.store();
    assert_eq!(s.claim(&q("a"), 400, 10, 10_000).unwrap().leases_expired, 0);
    // The new leases run out at 10_200: reads on the way count nothing twice.
    s.get(&q("a"), ids[1], 20_000).unwrap();
    assert_eq!(s.counts(&q("a"), 20_000).unwrap().due, 2);
    let third = s.claim(&q("a"), 20_000, 10, 10_000).unwrap();
    assert_eq!((third.leased.len(), third.leases_expired), (2, 2));
    assert_eq!(
        s.claim(&q("a"), 20_001, 10, 10_000).unwrap().leases_expired,
        0
    );
}
