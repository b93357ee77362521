//! The schedule runner's memory between full ticks: a tick answers from its last look, reads
//! only the due schedules from the timetable, and reads touched ones alone, until a change
//! it cannot name, a schedule left out of the timetable or a failure makes it a full tick.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use belfry_core::{Task, UnixMs};
use belfry_schedule::{firing_key, ScheduleDef, ScheduleService};
use belfry_store::{MemoryStore, Store};
use bytes::Bytes;
use common::*;

/// A tick with nothing due answers from the last tick that found nothing due: it sees every
/// write through its own service at once, a write through another service over the same store
/// (another node) only after `relook` or `FULL_TICK_MS`.
#[test]
fn an_idle_tick_answers_from_its_last_look_until_a_change_is_announced() {
    let (store, service) = setup();
    let other_node = ScheduleService::new(store.clone());
    service
        .create(Some(id("daily")), ScheduleDef::every(queue(), HOUR), T0)
        .unwrap();
    assert_eq!(service.tick(T0 + 1).unwrap().next_tick_ms, Some(T0 + HOUR));

    // Through this service: seen by the next tick, whichever write it is.
    service
        .create(Some(id("often")), ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    assert_eq!(
        service.tick(T0 + 2).unwrap().next_tick_ms,
        Some(T0 + MINUTE)
    );
    service.pause(&id("often"), T0 + 3).unwrap();
    assert_eq!(service.tick(T0 + 4).unwrap().next_tick_ms, Some(T0 + HOUR));
    service.resume(&id("often"), T0 + 5).unwrap();
    assert_eq!(
        service.tick(T0 + 6).unwrap().next_tick_ms,
        Some(T0 + MINUTE)
    );
    service.delete(&id("often")).unwrap();
    assert_eq!(service.tick(T0 + 7).unwrap().next_tick_ms, Some(T0 + HOUR));

    // Through another node: unseen until the change is announced.
    other_node
        .create(
            Some(id("theirs")),
            ScheduleDef::every(queue(), 10 * MINUTE),
            T0,
        )
        .unwrap();
    assert_eq!(service.tick(T0 + 8).unwrap().next_tick_ms, Some(T0 + HOUR));
    service.relook();
    let seen = T0 + 10 * MINUTE;
    assert_eq!(service.tick(T0 + 9).unwrap().next_tick_ms, Some(seen));

    // Nobody announces the next one: the periodic full tick finds it.
    other_node.delete(&id("theirs")).unwrap();
    let full_tick = T0 + 9 + belfry_schedule::FULL_TICK_MS;
    assert_eq!(
        service.tick(full_tick - 1).unwrap().next_tick_ms,
        Some(seen)
    );
    assert_eq!(
        service.tick(full_tick).unwrap().next_tick_ms,
        Some(T0 + HOUR)
    );

    // The look never holds back a firing: at the fire time the tick reads and fires.
    let fired = service.tick(T0 + HOUR).unwrap();
    assert_eq!(fired.tasks_created, 1);
    assert_eq!(fired.next_tick_ms, Some(T0 + 2 * HOUR));
}

// ---- ticks between full looks read only the schedules that are due ----

/// The tasks due by `until` that no earlier call took (leased for a year, so they stay taken).
fn take_new(store: &dyn Store, until: UnixMs) -> Vec<Task> {
    let batch = store.claim(&queue(), until, 100_000, 365 * DAY).unwrap();
    batch.leased.into_iter().map(|leased| leased.task).collect()
}

/// Daily schedules at `minutes` past T0's midnight (`M 0 * * *`, UTC).
fn create_dailies(service: &ScheduleService, minutes: &[u64]) {
    for &m in minutes {
        let cron = format!("{m} 0 * * *");
        service
            .create(
                Some(id(&format!("daily-{m}"))),
                ScheduleDef::cron(queue(), &cron, "UTC"),
                T0,
            )
            .unwrap();
    }
}

/// After a full tick, the ticks at the next fire times fire exactly the due schedules and
/// read no others. A schedule another node wrote and nobody announced shows which kind of
/// tick ran: a full tick would fire it, a tick from the timetable does not see it.
#[test]
fn ticks_after_a_full_one_fire_only_the_due_schedules_from_the_timetable() {
    let (store, service) = setup();
    let other_node = ScheduleService::new(store.clone());
    create_dailies(&service, &[1, 2, 3]);
    let first = service.tick(T0 + 1).unwrap();
    assert_eq!(first.next_tick_ms, Some(T0 + MINUTE));

    // Unannounced, and due at the same minute as daily-1.
    other_node
        .create(
            Some(id("theirs")),
            ScheduleDef::cron(queue(), "1 0 * * *", "UTC"),
            T0,
        )
        .unwrap();

    for m in 1..=3 {
        let at = T0 + m * MINUTE;
        let report = service.tick(at).unwrap();
        assert_eq!(
            (report.schedules_due, report.tasks_created),
            (1, 1),
            "minute {m}: only daily-{m}"
        );
        let next = if m < 3 {
            at + MINUTE
        } else {
            T0 + DAY + MINUTE
        };
        assert_eq!(report.next_tick_ms, Some(next), "minute {m}");
        let fired: Vec<_> = take_new(store.as_ref(), at)
            .into_iter()
            .map(|t| t.idempotency_key.unwrap())
            .collect();
        assert_eq!(fired, [firing_key(&id(&format!("daily-{m}")), at, 0)]);
        // The same minute again: nothing more.
        assert_eq!(service.tick(at + 500).unwrap().tasks_created, 0);
    }

    // Once announced, the next tick reads everything and catches up on the one it missed.
    service.relook();
    let caught_up = service.tick(T0 + 3 * MINUTE + SECOND).unwrap();
    assert_eq!(caught_up.tasks_created, 1);
    let fired = take_new(store.as_ref(), T0 + 3 * MINUTE + SECOND);
    assert_eq!(fired.len(), 1);
    assert_eq!(
        fired[0].idempotency_key.as_deref(),
        Some(firing_key(&id("theirs"), T0 + MINUTE, 0).as_str())
    );
}

/// A write another node names (`touched`) is read by the next tick alone: a schedule made
/// there fires, one moved earlier fires at its new time, a deleted one no longer fires, and
/// one nobody announced (which only a full tick reads) stays unseen. This service's own
/// writes touch their schedule the same way.
#[test]
fn touched_schedules_are_read_alone_by_the_next_tick() {
    let (store, service) = setup();
    let other_node = ScheduleService::new(store.clone());
    create_dailies(&service, &[1, 2, 3]);
    service.tick(T0 + 1).unwrap();
    let at_minute = |m: u64| ScheduleDef::cron(queue(), &format!("{m} 0 * * *"), "UTC");
    for made in ["theirs", "unannounced"] {
        other_node.create(Some(id(made)), at_minute(1), T0).unwrap();
    }
    other_node
        .replace(&id("daily-2"), at_minute(1), T0 + 2)
        .unwrap();
    assert!(other_node.delete(&id("daily-3")).unwrap());
    service.touched(["theirs", "daily-2", "daily-3"].map(String::from));

    let keys_fired = |at: UnixMs| {
        let mut keys: Vec<String> = take_new(store.as_ref(), at)
            .into_iter()
            .map(|t| t.idempotency_key.unwrap())
            .collect();
        keys.sort();
        keys
    };
    let minute_1 = T0 + MINUTE;
    assert_eq!(service.tick(minute_1).unwrap().schedules_due, 3);
    let expected: Vec<String> = ["daily-1", "daily-2", "theirs"]
        .map(|s| firing_key(&id(s), minute_1, 0))
        .into();
    assert_eq!(keys_fired(minute_1), expected, "not the unannounced one");
    for m in [2, 3] {
        let report = service.tick(T0 + m * MINUTE).unwrap();
        assert_eq!(report.tasks_created, 0, "minute {m}: moved and deleted");
    }

    // Written through this service: touched too, so still no full tick.
    let now = T0 + 3 * MINUTE + 1;
    service.create(Some(id("mine")), at_minute(4), now).unwrap();
    assert_eq!(
        service.tick(now).unwrap().next_tick_ms,
        Some(T0 + 4 * MINUTE)
    );
    assert_eq!(service.tick(T0 + 4 * MINUTE).unwrap().tasks_created, 1);
    assert_eq!(
        keys_fired(T0 + 4 * MINUTE),
        [firing_key(&id("mine"), T0 + 4 * MINUTE, 0)]
    );
}

/// A timetable smaller than the number of schedules keeps the earliest; the tick that reaches
/// the first one left out reads everything again, so every schedule still fires on time,
/// once.
#[test]
fn schedules_past_a_full_timetable_still_fire_on_time_once() {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::with_timetable_max(store.clone(), 2);
    let minutes = [1, 2, 3, 4, 5, 6, 7];
    create_dailies(&service, &minutes);
    assert_eq!(
        service.tick(T0 + 1).unwrap().next_tick_ms,
        Some(T0 + MINUTE)
    );
    for m in minutes {
        let at = T0 + m * MINUTE;
        // A tick just before: nothing due, and it knows when the next one is.
        let before = service.tick(at - 1).unwrap();
        assert_eq!((before.tasks_created, before.next_tick_ms), (0, Some(at)));
        let report = service.tick(at).unwrap();
        assert_eq!(report.tasks_created, 1, "minute {m}");
        let fired: Vec<_> = take_new(store.as_ref(), at)
            .into_iter()
            .map(|t| t.due_at_ms)
            .collect();
        assert_eq!(fired, [at], "minute {m}");
    }
    assert_eq!(
        service.tick(T0 + 8 * MINUTE).unwrap().next_tick_ms,
        Some(T0 + DAY + MINUTE)
    );
}

/// A tick from the timetable that fails (the store refuses the firings) remembers nothing:
/// the next tick is a full one and fires what the failed one could not.
#[test]
fn a_failed_tick_from_the_timetable_leaves_the_next_tick_a_full_one() {
    let store = Arc::new(CrashingStore {
        inner: MemoryStore::new(),
        failures: AtomicU32::new(0),
    });
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    create_dailies(&service, &[1]);
    service.tick(T0 + 1).unwrap();

    // The cursor write after the firing fails: the tick reports the error.
    store.failures.store(1, Ordering::SeqCst);
    assert!(service.tick(T0 + MINUTE).is_err());
    // An unannounced schedule due at the same minute: only a full tick finds it.
    ScheduleService::new(store.clone())
        .create(
            Some(id("theirs")),
            ScheduleDef::cron(queue(), "1 0 * * *", "UTC"),
            T0,
        )
        .unwrap();
    let retried = service.tick(T0 + MINUTE + SECOND).unwrap();
    assert_eq!(
        (retried.tasks_created, retried.tasks_duplicate),
        (1, 1),
        "theirs is new; daily-1's firing was stored before the failed cursor write"
    );
}
