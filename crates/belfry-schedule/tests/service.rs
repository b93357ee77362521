//! The schedule service over the reference store, with time passed in by hand.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use belfry_core::{QueueName, UnixMs};
use belfry_schedule::{
    firing_key, MisfirePolicy, NewSchedule, ScheduleDef, ScheduleId, ScheduleService,
    ScheduleServiceError, TickReport, TriggerDef, CURSORS_NAMESPACE, FIRE_TIME_HEADER,
    SCHEDULES_NAMESPACE, SCHEDULE_HEADER, SHARD_COUNT_HEADER, SHARD_HEADER,
};
use belfry_store::{MemoryStore, Store};
use bytes::Bytes;

use common::*;

#[test]
fn crud_round_trip() {
    let (_store, service) = setup();
    let mut def = ScheduleDef::cron(queue(), "0 9 * * MON-FRI", "Europe/Berlin");
    def.payload = Bytes::from_static(b"{\"report\":\"daily\"}");
    def.headers = vec![("X-Team".into(), "billing".into())];
    let created = service.create(Some(id("daily")), def.clone(), T0).unwrap();
    assert_eq!(created.id, id("daily"));
    assert_eq!(created.cursor_ms, T0);
    assert_eq!(service.get(&id("daily")).unwrap().as_ref(), Some(&created));

    let generated = service
        .create(None, ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    assert_eq!(generated.id.as_str().len(), 32);
    let ids: Vec<String> = service
        .list()
        .unwrap()
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    let mut expected = vec!["daily".to_string(), generated.id.to_string()];
    expected.sort();
    assert_eq!(ids, expected);

    // Monday 2026-11-23 09:00 in Berlin is 08:00 UTC.
    let next = service.next(&id("daily"), T0, 2).unwrap();
    assert_eq!(next[0].at_ms, T0 + DAY + 8 * HOUR);
    assert_eq!(next[0].utc, "2026-11-23T08:00:00Z");
    assert_eq!(next[0].local, "2026-11-23T09:00:00+01:00[Europe/Berlin]");
    assert_eq!(next[1].at_ms, T0 + 2 * DAY + 8 * HOUR);

    let mut replaced_def = def;
    replaced_def.trigger = belfry_schedule::TriggerDef::Cron {
        expression: "30 7 * * *".into(),
        timezone: "UTC".into(),
    };
    let replaced = service
        .replace(&id("daily"), replaced_def, T0 + HOUR)
        .unwrap();
    assert_eq!(replaced.created_at_ms, T0);
    assert_eq!(replaced.updated_at_ms, T0 + HOUR);
    assert_eq!(replaced.next_fire_ms(), Some(T0 + 7 * HOUR + 30 * MINUTE));

    assert!(service.delete(&id("daily")).unwrap());
    assert!(!service.delete(&id("daily")).unwrap());
    assert_eq!(service.get(&id("daily")).unwrap(), None);
    assert!(matches!(
        service.pause(&id("daily"), T0),
        Err(ScheduleServiceError::NotFound(_))
    ));
}

#[test]
fn bad_input_is_refused_and_nothing_is_stored() {
    let (store, service) = setup();
    let check = |def: ScheduleDef, id: Option<ScheduleId>, code: &str, message: &str| {
        let error = service.create(id, def, T0).unwrap_err();
        assert_eq!(error.code(), code, "{error}");
        assert_eq!(error.to_string(), message);
    };
    check(
        ScheduleDef::cron(queue(), "0 0 32 * *", "UTC"),
        None,
        "invalid_schedule",
        r#"invalid schedule: invalid cron expression: field 3 (day of month) "32": value out of range 1-31"#,
    );
    check(
        ScheduleDef::cron(queue(), "@daily", "Mars/Base"),
        None,
        "invalid_schedule",
        r#"invalid schedule: unknown time zone "Mars/Base": expected an IANA name such as "Europe/Berlin" or "UTC""#,
    );
    check(
        ScheduleDef::every(queue(), 10),
        None,
        "invalid_schedule",
        "invalid schedule: every_ms must be at least 1000 ms, got 10",
    );
    let mut bounds = ScheduleDef::every(queue(), SECOND);
    bounds.start_at_ms = Some(T0 + 10);
    bounds.end_at_ms = Some(T0);
    check(
        bounds,
        None,
        "invalid_schedule",
        &format!(
            "invalid schedule: end_at ({T0}) is before start_at ({})",
            T0 + 10
        ),
    );
    let mut shards = ScheduleDef::every(queue(), SECOND);
    shards.shard_count = 0;
    check(
        shards,
        None,
        "invalid_schedule",
        "invalid schedule: shard_count must be 1 to 1000, got 0",
    );
    let mut reserved = ScheduleDef::every(queue(), SECOND);
    reserved.headers = vec![("belfry-shard".into(), "1".into())];
    check(
        reserved,
        None,
        "invalid_schedule",
        r#"invalid schedule: invalid headers: header "belfry-shard" is set by belfry itself (Belfry-* names, and hop-by-hop or transport headers such as Host and Content-Length); use another name"#,
    );
    check(
        ScheduleDef::every(QueueName::new("nope").unwrap(), SECOND),
        None,
        "queue_not_found",
        "queue nope does not exist",
    );
    assert!(store.list_meta(SCHEDULES_NAMESPACE).unwrap().is_empty());

    service
        .create(Some(id("x")), ScheduleDef::every(queue(), SECOND), T0)
        .unwrap();
    check(
        ScheduleDef::every(queue(), MINUTE),
        Some(id("x")),
        "schedule_exists",
        "schedule x already exists",
    );
    assert!(ScheduleId::new("a/b").is_err());
    assert!(ScheduleId::new("").is_err());
    assert!(ScheduleId::new("x".repeat(129)).is_err());
}

#[test]
fn tick_creates_each_firing_once_with_its_key() {
    let (store, service) = setup();
    let mut def = ScheduleDef::every(queue(), 10 * SECOND);
    def.payload = Bytes::from_static(b"{}");
    service.create(Some(id("ten")), def, T0).unwrap();
    assert_eq!(service.next_tick_ms().unwrap(), Some(T0 + 10 * SECOND));

    let quiet = service.tick(T0 + 9_999).unwrap();
    assert_eq!(
        quiet,
        TickReport {
            next_tick_ms: Some(T0 + 10 * SECOND),
            ..TickReport::default()
        }
    );

    let report = service.tick(T0 + 10 * SECOND).unwrap();
    assert_eq!(report.firings, 1);
    assert_eq!(report.tasks_created, 1);
    assert_eq!(report.next_tick_ms, Some(T0 + 20 * SECOND));
    assert_eq!(service.next_tick_ms().unwrap(), Some(T0 + 20 * SECOND));
    // Ticking again at the same instant creates nothing.
    assert_eq!(
        service.tick(T0 + 10 * SECOND).unwrap(),
        TickReport {
            next_tick_ms: Some(T0 + 20 * SECOND),
            ..TickReport::default()
        }
    );

    let key = firing_key(&id("ten"), T0 + 10 * SECOND, 0);
    assert_eq!(key, format!("schedule:ten:{}:0", T0 + 10 * SECOND));
    let task = store
        .get_by_key(&queue(), &key, T0 + 10 * SECOND)
        .unwrap()
        .expect("the firing's task exists");
    assert_eq!(task.due_at_ms, T0 + 10 * SECOND);
    assert_eq!(&task.payload[..], b"{}");
    // The firing says which schedule and fire time it is, whatever its due time becomes.
    assert_eq!(
        task.headers,
        vec![
            (SCHEDULE_HEADER.to_string(), "ten".to_string()),
            (FIRE_TIME_HEADER.to_string(), (T0 + 10 * SECOND).to_string()),
        ]
    );

    // A slightly late tick (within the misfire threshold) still creates every firing.
    let report = service.tick(T0 + 45 * SECOND).unwrap();
    assert_eq!(report.firings, 3);
    assert_eq!(report.schedules_misfired, 0);
    assert_eq!(
        due_times(&store, T0 + HOUR),
        [10, 20, 30, 40].map(|s| T0 + s * SECOND)
    );
}

#[test]
fn misfire_policies_after_downtime() {
    // (policy, expected firings' due times after 10 minutes of downtime)
    let cases: [(MisfirePolicy, Vec<UnixMs>); 3] = [
        // Only the times at most 60 s old: 9:00 to 10:00 after the start.
        (
            MisfirePolicy::Skip,
            (0..7).map(|i| T0 + 9 * MINUTE + i * 10 * SECOND).collect(),
        ),
        (MisfirePolicy::FireOnce, vec![T0 + 10 * MINUTE]),
        (
            MisfirePolicy::CatchUp,
            (1..=60).map(|i| T0 + i * 10 * SECOND).collect(),
        ),
    ];
    for (policy, expected) in cases {
        let (store, service) = setup();
        let mut def = ScheduleDef::every(queue(), 10 * SECOND);
        def.misfire = policy;
        service.create(Some(id("s")), def, T0).unwrap();
        let report = service.tick(T0 + 10 * MINUTE).unwrap();
        assert_eq!(report.schedules_misfired, 1, "{policy:?}");
        assert_eq!(report.tasks_created, expected.len() as u64, "{policy:?}");
        assert_eq!(
            report.firings_dropped,
            60 - expected.len() as u64,
            "{policy:?}"
        );
        assert_eq!(due_times(&store, T0 + DAY), expected, "{policy:?}");
        // Afterwards the schedule runs on normally.
        assert_eq!(
            service.next_tick_ms().unwrap(),
            Some(T0 + 10 * MINUTE + 10 * SECOND)
        );
    }
}

#[test]
fn sharded_firings_carry_shard_headers() {
    let (store, service) = setup();
    let mut def = ScheduleDef::cron(queue(), "0 * * * * *", "UTC");
    def.shard_count = 3;
    def.headers = vec![("X-Job".into(), "reindex".into())];
    service.create(Some(id("sharded")), def, T0).unwrap();
    let report = service.tick(T0 + MINUTE).unwrap();
    assert_eq!(report.firings, 1);
    assert_eq!(report.tasks_created, 3);
    let mut tasks = claim_all(&store, T0 + MINUTE);
    tasks.sort_by_key(|t| t.idempotency_key.clone());
    for (shard, task) in tasks.iter().enumerate() {
        assert_eq!(task.due_at_ms, T0 + MINUTE);
        assert_eq!(
            task.idempotency_key.as_deref(),
            Some(firing_key(&id("sharded"), T0 + MINUTE, shard).as_str())
        );
        assert_eq!(
            task.headers,
            vec![
                ("X-Job".to_string(), "reindex".to_string()),
                (SCHEDULE_HEADER.to_string(), "sharded".to_string()),
                (FIRE_TIME_HEADER.to_string(), (T0 + MINUTE).to_string()),
                (SHARD_HEADER.to_string(), shard.to_string()),
                (SHARD_COUNT_HEADER.to_string(), "3".to_string()),
            ]
        );
    }
    assert_eq!(tasks.len(), 3);
    assert_eq!(
        service
            .forecast_firings(&queue(), T0 + MINUTE, MINUTE, 3)
            .unwrap()
            .counts,
        // The firing at T0+1min already exists as tasks; the next ones do not.
        vec![0, 3, 3]
    );
}

#[test]
fn pause_and_resume_do_not_replay_the_paused_period() {
    let (store, service) = setup();
    let mut def = ScheduleDef::every(queue(), MINUTE);
    def.misfire = MisfirePolicy::CatchUp;
    service.create(Some(id("p")), def, T0).unwrap();
    let paused = service.pause(&id("p"), T0 + 30 * SECOND).unwrap();
    assert!(paused.def.paused);
    assert_eq!(paused.next_fire_ms(), None);
    assert_eq!(service.next_tick_ms().unwrap(), None);
    assert_eq!(service.tick(T0 + HOUR).unwrap(), TickReport::default());
    // Pausing twice is harmless.
    assert_eq!(
        service.pause(&id("p"), T0 + HOUR).unwrap().updated_at_ms,
        T0 + 30 * SECOND
    );

    let resumed = service.resume(&id("p"), T0 + HOUR + 30 * SECOND).unwrap();
    assert!(!resumed.def.paused);
    assert_eq!(resumed.next_fire_ms(), Some(T0 + 61 * MINUTE));
    let report = service.tick(T0 + 61 * MINUTE).unwrap();
    assert_eq!(report.tasks_created, 1);
    assert_eq!(report.schedules_misfired, 0);
    assert_eq!(due_times(&store, T0 + DAY), vec![T0 + 61 * MINUTE]);
}

#[test]
fn end_at_stops_firing() {
    let (store, service) = setup();
    let mut def = ScheduleDef::every(queue(), MINUTE);
    def.end_at_ms = Some(T0 + 3 * MINUTE);
    service.create(Some(id("e")), def, T0).unwrap();
    service.tick(T0 + 2 * MINUTE).unwrap();
    service.tick(T0 + 3 * MINUTE).unwrap();
    assert_eq!(service.next_tick_ms().unwrap(), None);
    assert_eq!(service.tick(T0 + DAY).unwrap(), TickReport::default());
    assert_eq!(
        due_times(&store, T0 + 2 * DAY),
        [1, 2, 3].map(|m| T0 + m * MINUTE)
    );
    assert!(service.next(&id("e"), T0, 10).unwrap().is_empty());
}

#[test]
fn a_new_service_over_the_same_store_continues() {
    let (store, service) = setup();
    service
        .create(Some(id("r")), ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    service.tick(T0 + MINUTE).unwrap();
    drop(service);
    let restarted = ScheduleService::new(store.clone());
    assert_eq!(restarted.next_tick_ms().unwrap(), Some(T0 + 2 * MINUTE));
    let report = restarted.tick(T0 + 2 * MINUTE).unwrap();
    assert_eq!((report.tasks_created, report.tasks_duplicate), (1, 0));
}

#[test]
fn corrupt_records_are_reported_not_fatal() {
    let (store, service) = setup();
    service
        .create(Some(id("good")), ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    store
        .put_meta(SCHEDULES_NAMESPACE, "bad", Bytes::from_static(b"{\"v\":7}"))
        .unwrap();
    let report = service.tick(T0 + MINUTE).unwrap();
    assert_eq!(report.tasks_created, 1);
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.errors[0].0, "bad");
    assert!(report.errors[0]
        .1
        .contains("unsupported schedule record version 7"));
    assert!(matches!(
        service.get(&id("bad")),
        Err(ScheduleServiceError::Corrupt { .. })
    ));
    let listed: Vec<ScheduleId> = service.list().unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, vec![id("good")]);
}

#[test]
fn a_deleted_queue_drops_firings_instead_of_retrying_forever() {
    let (store, service) = setup();
    service
        .create(Some(id("orphan")), ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    store.delete_queue(&queue()).unwrap();
    let report = service.tick(T0 + MINUTE).unwrap();
    assert_eq!(report.firings_dropped, 1);
    assert!(report.errors.is_empty());
    assert_eq!(
        report.queues_missing,
        vec![("orphan".to_owned(), queue().to_string())]
    );
    assert_eq!(service.next_tick_ms().unwrap(), Some(T0 + 2 * MINUTE));
}

#[test]
fn forecast_counts_future_firings_per_step() {
    let (_store, service) = setup();
    service
        .create(Some(id("a")), ScheduleDef::every(queue(), 10 * SECOND), T0)
        .unwrap();
    let mut hourly = ScheduleDef::cron(queue(), "@hourly", "UTC");
    hourly.shard_count = 5;
    service.create(Some(id("b")), hourly, T0).unwrap();
    let mut paused = ScheduleDef::every(queue(), SECOND);
    paused.paused = true;
    service.create(Some(id("c")), paused, T0).unwrap();
    let other = QueueName::new("other").unwrap();
    assert_eq!(
        service
            .forecast_firings(&other, T0, MINUTE, 2)
            .unwrap()
            .counts,
        vec![0, 0]
    );
    // Steps of 30 minutes from T0: the interval fires 180 times per step, but 179 in the
    // first (T0 itself is not after the creation time); the hourly one at T0+1h (5 shards).
    assert_eq!(
        service
            .forecast_firings(&queue(), T0, 30 * MINUTE, 3)
            .unwrap()
            .counts,
        vec![179, 180, 180 + 5]
    );
    assert!(service.forecast_firings(&queue(), T0, 0, 3).is_err());
}

/// A forecast counts at most `FORECAST_FIRINGS_TOTAL_MAX` firings over all schedules, so its
/// cost is bounded whatever the schedules (any reader may ask for one). It counts them in time
/// order, so the steps before the cut are exact for every schedule, and it says where it cut.
#[test]
fn a_forecast_counts_a_bounded_number_of_firings_in_time_order() {
    let (_store, service) = setup();
    for i in 0..12 {
        service
            .create(
                Some(id(&format!("s{i}"))),
                ScheduleDef::every(queue(), SECOND),
                T0,
            )
            .unwrap();
    }
    // Two days in hours: 12 schedules × 172,800 firings, more than the budget.
    let forecast = service
        .forecast_firings(&queue(), T0, 60 * MINUTE, 48)
        .unwrap();
    let budget = belfry_schedule::FORECAST_FIRINGS_TOTAL_MAX as u64;
    assert_eq!(forecast.counts.iter().sum::<u64>(), budget);
    let cut = forecast
        .cut_at_ms
        .expect("the forecast says where it was cut");
    let cut_step = ((cut - T0) / (60 * MINUTE)) as usize;
    // Every hour before the cut is whole for all twelve (the first lacks T0 itself).
    assert_eq!(forecast.counts[0], 12 * 3_599);
    assert!(forecast.counts[1..cut_step]
        .iter()
        .all(|&n| n == 12 * 3_600));
    assert!(forecast.counts[cut_step + 1..].iter().all(|&n| n == 0));
    // A forecast within the budget is not cut.
    let short = service.forecast_firings(&queue(), T0, MINUTE, 60).unwrap();
    assert_eq!(short.cut_at_ms, None);
}

/// Creates batched into one call each get their own answer, in order: the valid ones are
/// stored; an invalid one, one naming a missing queue, one whose id exists, and the second of
/// two with the same id fail alone.
#[test]
fn create_many_answers_each_create_alone() {
    let (_store, service) = setup();
    service
        .create(Some(id("taken")), ScheduleDef::every(queue(), MINUTE), T0)
        .unwrap();
    let every = |q: QueueName| ScheduleDef::every(q, MINUTE);
    let new = |id_: Option<&str>, def: ScheduleDef| NewSchedule {
        id: id_.map(id),
        def,
        now_ms: T0 + SECOND,
    };
    let answers = service.create_many(vec![
        new(Some("a"), every(queue())),
        new(Some("bad"), ScheduleDef::cron(queue(), "61 * * * *", "UTC")),
        new(Some("lost"), every(QueueName::new("missing").unwrap())),
        new(Some("taken"), every(queue())),
        new(Some("twice"), every(queue())),
        new(Some("twice"), ScheduleDef::every(queue(), HOUR)),
        new(None, every(queue())),
    ]);
    assert_eq!(answers.len(), 7);
    assert_eq!(answers[0].as_ref().unwrap().id, id("a"));
    assert!(
        matches!(answers[1], Err(ScheduleServiceError::Invalid(_))),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Err(ScheduleServiceError::QueueNotFound(q)) if q.as_str() == "missing"),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(&answers[3], Err(ScheduleServiceError::AlreadyExists(i)) if *i == id("taken")),
        "{:?}",
        answers[3]
    );
    assert_eq!(answers[4].as_ref().unwrap().id, id("twice"));
    assert!(
        matches!(&answers[5], Err(ScheduleServiceError::AlreadyExists(i)) if *i == id("twice")),
        "{:?}",
        answers[5]
    );
    let generated = answers[6].as_ref().unwrap().id.clone();
    // The first "twice" won: its definition (every minute) is the stored one.
    let twice = service.get(&id("twice")).unwrap().unwrap();
    assert_eq!(twice.def.trigger, TriggerDef::Every { every_ms: MINUTE });
    assert_eq!(twice.created_at_ms, T0 + SECOND);
    let mut stored: Vec<String> = service
        .list()
        .unwrap()
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    stored.sort();
    let mut expected = vec![
        "a".to_string(),
        "taken".into(),
        "twice".into(),
        generated.to_string(),
    ];
    expected.sort();
    assert_eq!(stored, expected);
}

// ---- a crash between putting the firing's tasks and persisting the cursor ----

#[test]
fn a_crash_between_put_and_cursor_persist_creates_no_second_firing() {
    for policy in [
        MisfirePolicy::Skip,
        MisfirePolicy::FireOnce,
        MisfirePolicy::CatchUp,
    ] {
        let store = Arc::new(CrashingStore {
            inner: MemoryStore::new(),
            failures: AtomicU32::new(0),
        });
        store.put_queue(&queue(), Bytes::new()).unwrap();
        let service = ScheduleService::new(store.clone());
        let mut def = ScheduleDef::cron(queue(), "*/10 * * * * *", "UTC");
        def.shard_count = 2;
        def.misfire = policy;
        service.create(Some(id("c")), def, T0).unwrap();

        // The tick puts the tasks of 10 s and 20 s, then "crashes" writing the cursor.
        store.failures.store(1, Ordering::SeqCst);
        let error = service.tick(T0 + 25 * SECOND).unwrap_err();
        assert_eq!(error.code(), "storage_error");
        assert_eq!(store.inner.counts(&queue(), T0).unwrap().pending, 4);

        // A restarted service ticks again, a little later: the same firings are recomputed
        // and the store already has them.
        let restarted = ScheduleService::new(store.clone());
        let report = restarted.tick(T0 + 31 * SECOND).unwrap();
        assert_eq!(report.tasks_duplicate, 4, "{policy:?}");
        assert_eq!(report.tasks_created, 2, "{policy:?}");
        let tasks = store
            .inner
            .claim(&queue(), T0 + HOUR, 1_000, MINUTE)
            .unwrap()
            .leased;
        let mut keys: Vec<String> = tasks
            .iter()
            .filter_map(|t| t.task.idempotency_key.clone())
            .collect();
        keys.sort();
        let mut expected: Vec<String> = [10, 20, 30]
            .iter()
            .flat_map(|s| (0..2).map(move |shard| firing_key(&id("c"), T0 + s * SECOND, shard)))
            .collect();
        expected.sort();
        assert_eq!(keys, expected, "{policy:?}");
    }
}

#[test]
fn a_crash_after_a_long_outage_replays_the_same_fire_once_firing() {
    let store = Arc::new(CrashingStore {
        inner: MemoryStore::new(),
        failures: AtomicU32::new(1),
    });
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    service
        .create(
            Some(id("daily")),
            ScheduleDef::cron(queue(), "0 6 * * *", "UTC"),
            T0,
        )
        .unwrap();
    // Down for three days; the tick that fires once crashes before saving its cursor.
    assert!(service.tick(T0 + 3 * DAY + HOUR * 7).is_err());
    let report = service.tick(T0 + 3 * DAY + HOUR * 7 + 5 * SECOND).unwrap();
    assert_eq!((report.tasks_created, report.tasks_duplicate), (0, 1));
    assert_eq!(
        store.inner.counts(&queue(), T0 + 4 * DAY).unwrap().pending,
        1
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Ticks at random times, some of which "crash" before saving the cursor: with `catch_up`
    /// (and gaps short enough not to hit the catch-up cap), the queue ends up with exactly one
    /// task per fire time and shard.
    #[test]
    fn ticks_with_crashes_create_every_firing_exactly_once(
        steps in proptest::collection::vec((1u64..600_000, proptest::bool::ANY), 1..25),
        shards in 1u32..4,
    ) {
        let store = Arc::new(CrashingStore {
            inner: MemoryStore::new(),
            failures: AtomicU32::new(0),
        });
        store.put_queue(&queue(), Bytes::new()).unwrap();
        let service = ScheduleService::new(store.clone());
        let mut def = ScheduleDef::cron(queue(), "*/10 * * * * *", "America/New_York");
        def.shard_count = shards;
        def.misfire = MisfirePolicy::CatchUp;
        service.create(Some(id("sim")), def, T0).unwrap();
        let mut now = T0;
        for (gap, crash) in steps {
            now += gap;
            store.failures.store(u32::from(crash), Ordering::SeqCst);
            let _ = service.tick(now);
        }
        store.failures.store(0, Ordering::SeqCst);
        service.tick(now).unwrap();

        let mut keys: Vec<String> = store
            .inner
            .claim(&queue(), now, 1_000_000, MINUTE)
            .unwrap()
            .leased
            .into_iter()
            .filter_map(|leased| leased.task.idempotency_key)
            .collect();
        keys.sort();
        let mut expected: Vec<String> = (1..=(now - T0) / (10 * SECOND))
            .flat_map(|i| {
                (0..shards as usize).map(move |shard| firing_key(&id("sim"), T0 + i * 10 * SECOND, shard))
            })
            .collect();
        expected.sort();
        proptest::prop_assert_eq!(keys, expected);
    }
}

// ---- a node that lost a schedule's lease between deciding to fire and writing ----

/// A node decides to fire under its lease, then (paused past it) loses the schedule to another
/// node. Its writes are dropped: no task, no cursor over the new owner's. Without the check,
/// once the firings' keys were forgotten, its put made a second task per fire time and its
/// stale cursor rolled the new owner's back.
#[test]
fn writes_under_a_lease_that_moved_are_dropped() {
    // The lease moves right after the tick's first check (the decision to fire).
    let store = Arc::new(MovingLeaseStore::new(1));
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let stale = ScheduleService::new(store.clone());
    let mut def = ScheduleDef::cron(queue(), "*/10 * * * * *", "UTC");
    def.misfire = MisfirePolicy::CatchUp;
    stale.create(Some(id("c")), def, T0).unwrap();
    let report = stale.tick(T0 + 25 * SECOND).unwrap();
    assert_eq!((report.firings, report.firings_not_owned), (0, 2));
    assert_eq!(store.inner.counts(&queue(), T0).unwrap().pending, 0);
    assert_eq!(store.inner.get_meta(CURSORS_NAMESPACE, "c").unwrap(), None);

    // The owner now (its lease holds) fires each fire time once.
    let owner = ScheduleService::new(store.clone());
    let report = owner.tick(T0 + 25 * SECOND).unwrap();
    assert_eq!((report.tasks_created, report.firings_not_owned), (2, 0));
    assert_eq!(
        due_times(&store.inner, T0 + HOUR),
        [T0 + 10 * SECOND, T0 + 20 * SECOND]
    );
}
