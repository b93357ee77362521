//! What a queue's lag is made of: the due time of its oldest waiting task (in `counts`).

use belfry_core::Priority;
use bytes::Bytes;

use super::{put1, q, task, Harness};

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
