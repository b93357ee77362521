//! The schedule service over the reference store, with time passed in by hand.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId};
use belfry_schedule::{
    firing_key, MisfirePolicy, NewSchedule, ScheduleDef, ScheduleId, ScheduleService,
    ScheduleServiceError, TickReport, TriggerDef, CURSORS_NAMESPACE, SCHEDULES_NAMESPACE,
    SHARD_COUNT_HEADER, SHARD_HEADER,
};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MemoryStore, PutOutcome, QueueCounts, Store,
    StoreError,
};
use bytes::Bytes;

/// 2026-11-22T00:00:00Z, a Sunday.
const T0: UnixMs = 1_795_305_600_000;
const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

fn queue() -> QueueName {
    QueueName::new("jobs").unwrap()
}

fn id(text: &str) -> ScheduleId {
    ScheduleId::new(text).unwrap()
}

fn setup() -> (Arc<MemoryStore>, ScheduleService) {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    (store, service)
}

/// Due times of the scheduled tasks in the queue, via claiming everything due by `until`.
fn claim_all(store: &MemoryStore, until: UnixMs) -> Vec<Task> {
    let batch = store.claim(&queue(), until, 100_000, 60_000).unwrap();
    batch.leased.into_iter().map(|leased| leased.task).collect()
}

fn due_times(store: &MemoryStore, until: UnixMs) -> Vec<UnixMs> {
    claim_all(store, until)
        .into_iter()
        .map(|t| t.due_at_ms)
        .collect()
}

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
    assert!(task.headers.is_empty());

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
                (SHARD_HEADER.to_string(), shard.to_string()),
                (SHARD_COUNT_HEADER.to_string(), "3".to_string()),
            ]
        );
    }
    assert_eq!(tasks.len(), 3);
    assert_eq!(
        service
            .forecast_firings(&queue(), T0 + MINUTE, MINUTE, 3)
            .unwrap(),
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
        service.forecast_firings(&other, T0, MINUTE, 2).unwrap(),
        vec![0, 0]
    );
    // Steps of 30 minutes from T0: the interval fires 180 times per step, but 179 in the
    // first (T0 itself is not after the creation time); the hourly one at T0+1h (5 shards).
    assert_eq!(
        service
            .forecast_firings(&queue(), T0, 30 * MINUTE, 3)
            .unwrap(),
        vec![179, 180, 180 + 5]
    );
    assert!(service.forecast_firings(&queue(), T0, 0, 3).is_err());
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

/// Delegates to a `MemoryStore`, but fails the next `failures` cursor writes, as if the
/// process died right after the tasks were put.
struct CrashingStore {
    inner: MemoryStore,
    failures: AtomicU32,
}

impl Store for CrashingStore {
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> belfry_store::Result<()> {
        if namespace == CURSORS_NAMESPACE
            && self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(StoreError::Io {
                context: "persist the schedule cursor",
                source: std::io::Error::other("simulated crash"),
            });
        }
        self.inner.put_meta(namespace, key, value)
    }

    fn put_queue(&self, queue: &QueueName, config: Bytes) -> belfry_store::Result<bool> {
        self.inner.put_queue(queue, config)
    }
    fn get_queue(&self, queue: &QueueName) -> belfry_store::Result<Option<Bytes>> {
        self.inner.get_queue(queue)
    }
    fn list_queues(&self) -> belfry_store::Result<Vec<(QueueName, Bytes)>> {
        self.inner.list_queues()
    }
    fn delete_queue(&self, queue: &QueueName) -> belfry_store::Result<bool> {
        self.inner.delete_queue(queue)
    }
    fn put(&self, tasks: Vec<NewTask>) -> belfry_store::Result<Vec<PutOutcome>> {
        self.inner.put(tasks)
    }
    fn get(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<Option<Task>> {
        self.inner.get(queue, id, now_ms)
    }
    fn get_by_key(
        &self,
        queue: &QueueName,
        key: &str,
        now_ms: UnixMs,
    ) -> belfry_store::Result<Option<Task>> {
        self.inner.get_by_key(queue, key, now_ms)
    }
    fn cancel(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.cancel(queue, id, now_ms)
    }
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.reschedule(queue, id, due_at_ms, now_ms)
    }
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> belfry_store::Result<ClaimBatch> {
        self.inner.claim(queue, now_ms, max, visibility_ms)
    }
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.ack(queue, id, lease, now_ms)
    }
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.nack(queue, id, lease, retry_at_ms, now_ms)
    }
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.extend(queue, id, lease, lease_until_ms, now_ms)
    }
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.inner.dead_letter(queue, id, lease, reason, now_ms)
    }
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> belfry_store::Result<Vec<Task>> {
        self.inner.list_dead(queue, after, limit)
    }
    fn redrive(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<ChangeOutcome> {
        self.inner.redrive(queue, id, now_ms)
    }
    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> belfry_store::Result<QueueCounts> {
        self.inner.counts(queue, now_ms)
    }
    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> belfry_store::Result<Vec<u64>> {
        self.inner.forecast(queue, from_ms, step_ms, steps)
    }
    fn next_due_ms(&self, queue: &QueueName) -> belfry_store::Result<Option<UnixMs>> {
        self.inner.next_due_ms(queue)
    }
    fn get_meta(&self, namespace: &str, key: &str) -> belfry_store::Result<Option<Bytes>> {
        self.inner.get_meta(namespace, key)
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> belfry_store::Result<bool> {
        self.inner.delete_meta(namespace, key)
    }
    fn list_meta(&self, namespace: &str) -> belfry_store::Result<Vec<(String, Bytes)>> {
        self.inner.list_meta(namespace)
    }
    fn subscribe(&self, set: u64, users: &[UserId]) -> belfry_store::Result<u64> {
        self.inner.subscribe(set, users)
    }
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> belfry_store::Result<u64> {
        self.inner.unsubscribe(set, users)
    }
    fn is_subscribed(&self, set: u64, user: &UserId) -> belfry_store::Result<bool> {
        self.inner.is_subscribed(set, user)
    }
    fn subscriber_count(&self, set: u64) -> belfry_store::Result<u64> {
        self.inner.subscriber_count(set)
    }
    fn subscribers(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
    ) -> belfry_store::Result<Vec<UserId>> {
        self.inner.subscribers(set, after, limit)
    }
    fn user_sets(&self, user: &UserId, limit: usize) -> belfry_store::Result<Vec<u64>> {
        self.inner.user_sets(user, limit)
    }
    fn drop_set(&self, set: u64) -> belfry_store::Result<u64> {
        self.inner.drop_set(set)
    }
    fn flush(&self) -> belfry_store::Result<()> {
        self.inner.flush()
    }
}

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
