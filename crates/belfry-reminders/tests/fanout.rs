//! The fan-out and the subscriber API of the reminder service, on the in-memory store, with
//! time passed in (no clock, no sleeps).

use std::collections::BTreeSet;
use std::sync::Arc;

use belfry_core::{QueueName, UserId};
use belfry_reminders::{
    ReminderDef, ReminderError, ReminderId, ReminderPatch, ReminderService, When, FANOUTS_NAMESPACE,
};
use belfry_store::{MemoryStore, Store};
use bytes::Bytes;
use serde_json::Value;

const VIS: u64 = 60_000;

fn setup() -> (Arc<MemoryStore>, ReminderService) {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&q(), Bytes::from("{}")).unwrap();
    (store.clone(), ReminderService::new(store))
}

fn q() -> QueueName {
    QueueName::new("push").unwrap()
}

fn ids(range: std::ops::Range<u64>) -> Vec<UserId> {
    range.map(|i| UserId::new(i.to_string()).unwrap()).collect()
}

fn def(at: u64, chunk_size: u32, rate: Option<u32>) -> ReminderDef {
    let mut def = ReminderDef::at(q(), at, Bytes::from(r#"{"title":"kick-off"}"#));
    def.chunk_size = chunk_size;
    def.users_per_second = rate;
    def
}

/// Claims every task due by `now` and returns their bodies (acked).
fn take(store: &MemoryStore, now: u64) -> Vec<Value> {
    let batch = store.claim(&q(), now, 10_000, VIS).unwrap();
    batch
        .leased
        .iter()
        .map(|t| {
            store.ack(&q(), t.task.id, t.lease_id, now).unwrap();
            serde_json::from_slice(&t.task.payload).unwrap()
        })
        .collect()
}

fn users_of(bodies: &[Value]) -> Vec<String> {
    bodies
        .iter()
        .flat_map(|b| {
            b["users"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_str().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn a_due_reminder_fans_out_in_chunks_once() {
    let (store, service) = setup();
    let id = ReminderId::new("match").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 3, None), 0)
        .unwrap();
    assert_eq!(service.subscribe(&id, &ids(0..10)).unwrap(), 10);
    assert_eq!(
        service.subscribe(&id, &ids(5..11)).unwrap(),
        1,
        "subscribing twice is once"
    );

    let early = service.step(999).unwrap();
    assert_eq!(early.chunks_created, 0);
    assert_eq!(early.next_ms, Some(1_000));
    assert!(take(&store, 999).is_empty());

    let report = service.step(1_000).unwrap();
    assert_eq!((report.fanouts_started, report.fanouts_finished), (1, 1));
    assert_eq!((report.chunks_created, report.users_fanned_out), (4, 11));
    let bodies = take(&store, 1_000);
    assert_eq!(bodies.len(), 4);
    for (k, body) in bodies.iter().enumerate() {
        assert_eq!(body["reminder_id"], "match");
        assert_eq!(body["content"]["title"], "kick-off");
        assert_eq!(body["chunk"], k as u64);
        assert_eq!(body["chunks"], 4);
        assert_eq!(body["firing"], 1_000);
        assert_eq!(body["last"], k == 3);
    }
    let want: Vec<String> = (0..11).map(|i| i.to_string()).collect();
    assert_eq!(users_of(&bodies), want);

    // A one-shot reminder fires once, and then takes no subscribers.
    assert_eq!(service.step(5_000).unwrap().chunks_created, 0);
    assert!(matches!(
        service.subscribe(&id, &ids(20..21)),
        Err(ReminderError::AlreadyFired(_))
    ));
    assert!(service.get(&id).unwrap().next_fire_ms.is_none());
}

#[test]
fn paced_chunks_are_due_at_the_rate_and_unsubscribes_before_them_count() {
    let (store, service) = setup();
    let id = ReminderId::new("paced").unwrap();
    // 100 users, 10 a chunk, 50 users/s: chunk k is due at 1000 + 200k.
    service
        .create(Some(id.clone()), def(1_000, 10, Some(50)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..100)).unwrap();

    let first = service.step(1_000).unwrap();
    assert_eq!(
        first.chunks_created, 6,
        "chunks due within the lead: 1000..=2000"
    );
    assert_eq!(first.next_ms, Some(2_200 - belfry_reminders::LEAD_MS));
    let mut bodies = take(&store, 1_000);
    assert_eq!(bodies.len(), 1, "never early: only chunk 0 is due");
    // Chunk 8 holds users 80..90; it is not made yet, so this unsubscribe counts.
    assert_eq!(service.unsubscribe(&id, &ids(85..86)).unwrap(), 1);
    let mut now = 1_000;
    while now <= 4_000 {
        service.step(now).unwrap();
        for body in take(&store, now) {
            let k = body["chunk"].as_u64().unwrap();
            // Delivered at its due time: users before it over the rate.
            assert_eq!(now, 1_000 + 200 * k, "chunk {k}");
            bodies.push(body);
        }
        now += 100;
    }
    let got = users_of(&bodies);
    assert_eq!(got.len(), 99);
    assert!(!got.contains(&"85".to_owned()));
    assert_eq!(bodies.last().unwrap()["last"], true);
    assert!(
        store.list_meta(FANOUTS_NAMESPACE).unwrap().is_empty(),
        "fan-out finished"
    );
}

#[test]
fn a_lost_cursor_write_neither_resends_nor_skips() {
    let (store, service) = setup();
    let id = ReminderId::new("crash").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, Some(100)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..300)).unwrap();
    service.step(1_000).unwrap();
    let (key, saved) = store.list_meta(FANOUTS_NAMESPACE).unwrap().remove(0);
    service.step(1_500).unwrap();
    // The crash: the chunks of the second step are in the queue, their cursor is not.
    store.put_meta(FANOUTS_NAMESPACE, &key, saved).unwrap();
    let replay = service.step(1_500).unwrap();
    assert!(replay.chunks_found > 0);
    assert_eq!(replay.chunks_created, 0);

    let mut bodies = Vec::new();
    for now in (1_000..=5_000).step_by(100) {
        service.step(now).unwrap();
        bodies.extend(take(&store, now));
    }
    let users = users_of(&bodies);
    let unique: BTreeSet<&String> = users.iter().collect();
    assert_eq!(users.len(), 300, "no chunk twice");
    assert_eq!(unique.len(), 300, "no subscriber skipped");
}

#[test]
fn a_cron_reminder_fans_out_at_each_firing_to_its_subscribers_then() {
    let (store, service) = setup();
    let id = ReminderId::new("daily").unwrap();
    let mut d = def(0, 100, None);
    d.when = When::Cron {
        expression: "0 20 * * *".into(),
        timezone: "UTC".into(),
    };
    let day = 86_400_000;
    let eight_pm = 20 * 3_600_000;
    let r = service.create(Some(id.clone()), d, 0).unwrap();
    assert_eq!(r.next_fire_ms, Some(eight_pm));
    service.subscribe(&id, &ids(0..2)).unwrap();
    service.step(eight_pm).unwrap();
    assert_eq!(users_of(&take(&store, eight_pm)), vec!["0", "1"]);
    service.unsubscribe(&id, &ids(0..1)).unwrap();
    service.subscribe(&id, &ids(7..8)).unwrap();
    assert_eq!(service.step(day).unwrap().next_ms, Some(day + eight_pm));
    service.step(day + eight_pm).unwrap();
    assert_eq!(users_of(&take(&store, day + eight_pm)), vec!["1", "7"]);
    assert_eq!(service.get(&id).unwrap().firings, 2);
}

#[test]
fn deleting_a_reminder_stops_its_fan_out_and_drops_its_subscribers() {
    let (store, service) = setup();
    let id = ReminderId::new("gone").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, Some(10)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..100)).unwrap();
    service.step(1_000).unwrap();
    service.delete(&id).unwrap();
    assert!(matches!(service.get(&id), Err(ReminderError::NotFound(_))));
    assert_eq!(service.step(100_000).unwrap().chunks_created, 0);
    assert!(store.list_meta(FANOUTS_NAMESPACE).unwrap().is_empty());
    // A new reminder with the same id starts with no subscribers.
    service
        .create(Some(id.clone()), def(1_000, 10, None), 0)
        .unwrap();
    assert_eq!(service.count(&id).unwrap(), 0);
}

#[test]
fn bad_definitions_are_refused_with_their_reason() {
    let (_store, service) = setup();
    let bad = |d: ReminderDef| service.create(None, d, 0).unwrap_err().code();
    assert_eq!(bad(def(1, 0, None)), "invalid_reminder");
    assert_eq!(bad(def(1, 50_001, None)), "invalid_reminder");
    assert_eq!(bad(def(1, 10, Some(0))), "invalid_reminder");
    let mut d = def(1, 10, None);
    d.content = Bytes::from("not json");
    assert_eq!(bad(d), "invalid_reminder");
    let mut d = def(1, 10, None);
    d.when = When::Cron {
        expression: "61 * * * *".into(),
        timezone: "UTC".into(),
    };
    assert_eq!(bad(d), "invalid_reminder");
    let mut d = def(1, 10, None);
    d.queue = QueueName::new("nope").unwrap();
    assert_eq!(bad(d), "queue_not_found");
    let id = ReminderId::new("twice").unwrap();
    service
        .create(Some(id.clone()), def(1, 10, None), 0)
        .unwrap();
    assert_eq!(
        service
            .create(Some(id), def(1, 10, None), 0)
            .unwrap_err()
            .code(),
        "reminder_exists"
    );
}

/// A step with nothing due answers from the last full look: it sees every write made through
/// its own service at once, a write made through another service over the same store (another
/// node) only after `relook` or `FULL_LOOK_MS`, and moves the subscriber count without a look.
#[test]
fn an_idle_step_answers_from_its_last_look_until_a_change_is_announced() {
    let (store, service) = setup();
    let other_node = ReminderService::new(store.clone());
    // Every fire time lies beyond the first full look, so only a change can make a step look.
    let base = 2 * belfry_reminders::FULL_LOOK_MS;
    let a = ReminderId::new("a").unwrap();
    service
        .create(Some(a.clone()), def(base + 100_000, 10, None), 0)
        .unwrap();
    assert_eq!(service.step(1_000).unwrap().next_ms, Some(base + 100_000));

    // Through this service: seen by the next step.
    let b = ReminderId::new("b").unwrap();
    service
        .create(Some(b.clone()), def(base + 80_000, 10, None), 1_000)
        .unwrap();
    assert_eq!(service.step(1_001).unwrap().next_ms, Some(base + 80_000));
    let patch = belfry_reminders::ReminderPatch {
        when: Some(When::At(base + 70_000)),
        ..Default::default()
    };
    service.patch(&b, patch, 1_002).unwrap();
    assert_eq!(service.step(1_003).unwrap().next_ms, Some(base + 70_000));

    // Subscriptions move the count without a look.
    service.subscribe(&a, &ids(0..5)).unwrap();
    service.unsubscribe(&a, &ids(0..2)).unwrap();
    assert_eq!(service.step(1_004).unwrap().subscribers, 3);

    // Through another node: unseen until the change is announced.
    let c = ReminderId::new("c").unwrap();
    other_node
        .create(Some(c.clone()), def(base + 50_000, 10, None), 1_005)
        .unwrap();
    assert_eq!(service.step(1_006).unwrap().next_ms, Some(base + 70_000));
    service.relook();
    assert_eq!(service.step(1_007).unwrap().next_ms, Some(base + 50_000));

    // Nobody announces the next one: the periodic full look finds it.
    other_node.delete(&c).unwrap();
    let full_look = 1_007 + belfry_reminders::FULL_LOOK_MS;
    assert_eq!(
        service.step(full_look - 1).unwrap().next_ms,
        Some(base + 50_000)
    );
    assert_eq!(
        service.step(full_look).unwrap().next_ms,
        Some(base + 70_000)
    );

    // A delete through this service: the next step no longer counts its subscribers.
    service.delete(&a).unwrap();
    let after_delete = service.step(full_look + 1).unwrap();
    assert_eq!(after_delete.subscribers, 0);
    assert_eq!(after_delete.next_ms, Some(base + 70_000));
}

fn reminder_ids(bodies: &[Value]) -> BTreeSet<String> {
    bodies
        .iter()
        .map(|b| b["reminder_id"].as_str().unwrap().to_owned())
        .collect()
}

/// While a paced fan-out runs, the steps between full looks read only it: a reminder another
/// node wrote without announcing it is not fired by them (a full look would), but is after
/// `relook`; one written through this service is fired at its time; the fan-out itself
/// delivers every user once.
#[test]
fn a_step_during_a_fan_out_reads_only_the_running_fan_outs() {
    let (store, service) = setup();
    let other_node = ReminderService::new(store.clone());
    let paced = ReminderId::new("paced").unwrap();
    // 100 users, 10 a chunk, 50 users/s: chunks due 1,000 to 2,800.
    service
        .create(Some(paced.clone()), def(1_000, 10, Some(50)), 0)
        .unwrap();
    service.subscribe(&paced, &ids(0..100)).unwrap();
    let first = service.step(1_000).unwrap();
    assert_eq!(first.fanouts_running, 1);
    let mut bodies = take(&store, 1_000);

    let unseen = ReminderId::new("unseen").unwrap();
    other_node
        .create(Some(unseen.clone()), def(1_100, 10, None), 1_050)
        .unwrap();
    other_node.subscribe(&unseen, &ids(0..3)).unwrap();
    let focused = service.step(1_200).unwrap();
    assert_eq!(focused.fanouts_started, 0, "not read: {focused:?}");
    assert_eq!(focused.fanouts_running, 1);
    bodies.extend(take(&store, 1_200));
    assert!(!reminder_ids(&bodies).contains("unseen"));

    service.relook();
    let full = service.step(1_300).unwrap();
    assert_eq!(full.fanouts_started, 1);
    bodies.extend(take(&store, 1_300));
    assert!(reminder_ids(&bodies).contains("unseen"));

    let announced = ReminderId::new("announced").unwrap();
    service
        .create(Some(announced.clone()), def(1_500, 10, None), 1_300)
        .unwrap();
    service.subscribe(&announced, &ids(5..6)).unwrap();
    for now in (1_400..=4_000).step_by(100) {
        let report = service.step(now).unwrap();
        if now == 1_500 {
            assert_eq!(report.fanouts_started, 1, "fired at its time");
        }
        bodies.extend(take(&store, now));
    }
    let of = |id: &str| -> Vec<Value> {
        bodies
            .iter()
            .filter(|b| b["reminder_id"] == id)
            .cloned()
            .collect()
    };
    assert_eq!(users_of(&of("announced")), vec!["5"]);
    let users = users_of(&of("paced"));
    let unique: BTreeSet<&String> = users.iter().collect();
    assert_eq!((users.len(), unique.len()), (100, 100));
    assert!(store.list_meta(FANOUTS_NAMESPACE).unwrap().is_empty());
}

/// A recurring reminder whose fan-out finishes in a step between full looks is due again at
/// its next fire time: the steps after it answer with that time and the firing starts then.
#[test]
fn a_fan_out_that_finishes_between_full_looks_fires_again_at_its_next_time() {
    let (store, service) = setup();
    let id = ReminderId::new("minutely").unwrap();
    let mut d = def(0, 10, Some(10));
    d.when = When::Cron {
        expression: "* * * * *".into(),
        timezone: "UTC".into(),
    };
    service.create(Some(id.clone()), d, 0).unwrap();
    service.subscribe(&id, &ids(0..30)).unwrap();
    // Chunks due at 60,000, 61,000 and 62,000: made over several steps.
    let mut now = 60_000;
    assert_eq!(service.step(now).unwrap().fanouts_started, 1);
    let mut finished = 0;
    while now < 63_000 {
        now += 250;
        finished += service.step(now).unwrap().fanouts_finished;
        take(&store, now);
    }
    assert_eq!(finished, 1);
    let quiet = service.step(119_999).unwrap();
    assert_eq!(quiet.next_ms, Some(120_000));
    assert_eq!(quiet.fanouts_started, 0);
    assert_eq!(service.step(120_000).unwrap().fanouts_started, 1);
    assert_eq!(service.get(&id).unwrap().firings, 2);
}

/// A step at an idle reminder's fire time reads only the reminders the last full look's
/// timetable says are due: one another node wrote without announcing it is not fired with
/// them, but is after `relook`.
#[test]
fn a_step_from_the_timetable_reads_only_the_due_reminders() {
    let (store, service) = setup();
    let other_node = ReminderService::new(store.clone());
    for (id, at, user) in [("a", 5_000, 1), ("b", 9_000, 2)] {
        let id = ReminderId::new(id).unwrap();
        service
            .create(Some(id.clone()), def(at, 10, None), 0)
            .unwrap();
        service.subscribe(&id, &ids(user..user + 1)).unwrap();
    }
    assert_eq!(service.step(1_000).unwrap().next_ms, Some(5_000));
    let c = ReminderId::new("c").unwrap();
    other_node
        .create(Some(c.clone()), def(5_000, 10, None), 1_000)
        .unwrap();
    other_node.subscribe(&c, &ids(3..4)).unwrap();

    let step = service.step(5_000).unwrap();
    assert_eq!(step.fanouts_started, 1);
    assert_eq!(step.next_ms, Some(9_000));
    assert_eq!(
        reminder_ids(&take(&store, 5_000)),
        BTreeSet::from(["a".into()])
    );
    service.relook();
    assert_eq!(service.step(5_001).unwrap().fanouts_started, 1);
    assert_eq!(
        reminder_ids(&take(&store, 5_001)),
        BTreeSet::from(["c".into()])
    );
}

/// A create, patch or delete through the service makes the next step read that reminder, not
/// every reminder: one another node wrote unannounced stays unseen until `relook`. A delete
/// takes its subscribers off the gauge.
#[test]
fn writes_through_the_service_are_read_alone_by_the_next_step() {
    let (store, service) = setup();
    let other_node = ReminderService::new(store.clone());
    let old = ReminderId::new("old").unwrap();
    service
        .create(Some(old.clone()), def(50_000, 10, None), 0)
        .unwrap();
    service.subscribe(&old, &ids(0..4)).unwrap();
    assert_eq!(service.step(1_000).unwrap().subscribers, 4, "a full look");
    let unseen = ReminderId::new("unseen").unwrap();
    other_node
        .create(Some(unseen.clone()), def(5_000, 10, None), 1_000)
        .unwrap();
    other_node.subscribe(&unseen, &ids(0..1)).unwrap();

    let created = ReminderId::new("created").unwrap();
    service
        .create(Some(created.clone()), def(9_000, 10, None), 1_000)
        .unwrap();
    service.subscribe(&created, &ids(1..2)).unwrap();
    let patch = ReminderPatch {
        when: Some(When::At(5_000)),
        ..ReminderPatch::default()
    };
    service.patch(&created, patch, 1_000).unwrap();
    service.delete(&old).unwrap();
    let step = service.step(5_000).unwrap();
    assert_eq!(step.fanouts_started, 1, "{step:?}");
    assert_eq!(
        reminder_ids(&take(&store, 5_000)),
        BTreeSet::from(["created".into()]),
        "patched to 5,000; the unannounced one not read"
    );
    assert_eq!(step.subscribers, 1, "4 + 1 - 4: the delete's dropped set");
    service.relook();
    assert_eq!(service.step(5_001).unwrap().fanouts_started, 1);
    assert_eq!(
        reminder_ids(&take(&store, 5_001)),
        BTreeSet::from(["unseen".into()])
    );
}

/// With a timetable of two, seven reminders (one of them recurring) each fire once per fire
/// time, at the first step at or after it.
#[test]
fn reminders_beyond_the_timetable_still_fire_on_time_and_once() {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&q(), Bytes::from("{}")).unwrap();
    let service = ReminderService::with_timetable_max(store.clone(), 2);
    let mut expected = Vec::new();
    for i in 0..6u64 {
        let id = ReminderId::new(format!("r{i}")).unwrap();
        let at = 10_000 + 7_000 * i;
        service
            .create(Some(id.clone()), def(at, 10, None), 0)
            .unwrap();
        service.subscribe(&id, &ids(i..i + 1)).unwrap();
        expected.push((format!("r{i}"), at));
    }
    let minutely = ReminderId::new("minutely").unwrap();
    let mut d = def(0, 10, None);
    d.when = When::Cron {
        expression: "* * * * *".into(),
        timezone: "UTC".into(),
    };
    service.create(Some(minutely.clone()), d, 0).unwrap();
    service.subscribe(&minutely, &ids(9..10)).unwrap();
    expected.extend([
        ("minutely".to_owned(), 60_000),
        ("minutely".into(), 120_000),
    ]);

    let mut fired = Vec::new();
    for now in (0..=150_000).step_by(500) {
        service.step(now).unwrap();
        for body in take(&store, now) {
            let firing = body["firing"].as_u64().unwrap();
            assert!(now - firing < 500, "{body} taken at {now}");
            fired.push((body["reminder_id"].as_str().unwrap().to_owned(), firing));
        }
    }
    fired.sort();
    expected.sort();
    assert_eq!(fired, expected);
}

/// Steps and takes every 100 ms over `from..=to`; answers each body with when it was taken.
fn drain_paced(
    store: &MemoryStore,
    service: &ReminderService,
    from: u64,
    to: u64,
) -> Vec<(u64, Value)> {
    let mut got = Vec::new();
    for now in (from..=to).step_by(100) {
        service.step(now).unwrap();
        got.extend(take(store, now).into_iter().map(|body| (now, body)));
    }
    got
}

/// A paced fan-out that starts a minute after its firing (the server was down, or the time
/// was moved into the past) keeps its pace from then: chunk `k` is due `200k` ms after the
/// start, not all at once.
#[test]
fn a_paced_fan_out_that_starts_late_keeps_its_pace_from_then() {
    let (store, service) = setup();
    let id = ReminderId::new("late").unwrap();
    // 100 users, 10 a chunk, 50 users/s: a chunk every 200 ms.
    service
        .create(Some(id.clone()), def(1_000, 10, Some(50)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..100)).unwrap();
    let start = 61_000;
    let got = drain_paced(&store, &service, start, start + 3_000);
    assert_eq!(got.len(), 10);
    for (taken, body) in &got {
        let k = body["chunk"].as_u64().unwrap();
        assert_eq!(*taken, start + 200 * k, "chunk {k}");
        assert_eq!(body["firing"], 1_000, "the firing is still the fire time");
    }
}

/// A paced fan-out interrupted for half a minute (the server was down) goes on at its pace
/// from the restart: the chunks it fell behind on are not sent in a burst.
#[test]
fn a_paced_fan_out_resumed_after_a_pause_keeps_its_pace() {
    let (store, service) = setup();
    let id = ReminderId::new("paused").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, Some(50)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..100)).unwrap();
    // Up to 1,400 the chunks due by 2,400 (the lead) are made: 0..=7.
    let before = drain_paced(&store, &service, 1_000, 1_400);
    assert_eq!(before.len(), 3, "chunks 0, 1 and 2 delivered on time");
    // Down from 1,400 to 31,000: chunks 3..=7 were made already and are due at once on the
    // restart (they are in the queue); 8 and 9 keep the pace from the restart.
    let after = drain_paced(&store, &service, 31_000, 33_000);
    let at: Vec<(u64, u64)> = after
        .iter()
        .map(|(t, b)| (b["chunk"].as_u64().unwrap(), *t))
        .collect();
    assert_eq!(
        at,
        [
            (3, 31_000),
            (4, 31_000),
            (5, 31_000),
            (6, 31_000),
            (7, 31_000),
            (8, 31_000),
            (9, 31_200)
        ]
    );
    let users = users_of(
        &before
            .into_iter()
            .chain(after)
            .map(|(_, b)| b)
            .collect::<Vec<_>>(),
    );
    assert_eq!(users.len(), 100);
}

const HOUR: u64 = 3_600_000;

/// A reminder made at 0 that fires at the top of every hour (UTC), to `users`.
fn hourly(
    service: &ReminderService,
    name: &str,
    chunk_size: u32,
    users: std::ops::Range<u64>,
) -> ReminderId {
    let id = ReminderId::new(name).unwrap();
    let mut d = def(0, chunk_size, None);
    d.when = When::Cron {
        expression: "0 * * * *".into(),
        timezone: "UTC".into(),
    };
    service.create(Some(id.clone()), d, 0).unwrap();
    service.subscribe(&id, &ids(users)).unwrap();
    id
}

/// A recurring reminder that missed several fire times fires once, for the latest of them.
#[test]
fn a_recurring_reminder_that_missed_fire_times_fires_once_for_the_latest() {
    let (store, service) = setup();
    let id = hourly(&service, "hourly", 100, 0..2);
    // Down from before 1:00 until 5:30: 1:00 to 5:00 were missed.
    let report = service.step(5 * HOUR + HOUR / 2).unwrap();
    assert_eq!(report.fanouts_started, 1);
    let bodies = take(&store, 5 * HOUR + HOUR / 2);
    assert_eq!(bodies.len(), 1);
    assert_eq!(bodies[0]["firing"], 5 * HOUR, "the latest missed fire time");
    assert_eq!(service.get(&id).unwrap().next_fire_ms, Some(6 * HOUR));
}

/// Two firings at the same instant — a fired one-shot re-armed at its old time, or deleted and
/// made again with the same id — make their own chunks: the second's content and users are
/// not lost to the first's idempotency keys.
#[test]
fn firings_at_the_same_instant_make_their_own_chunks() {
    let (store, service) = setup();
    let id = ReminderId::new("again").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, None), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..2)).unwrap();
    service.step(1_000).unwrap();
    // The first chunk waits in the queue; the content is fixed and the time given again.
    let patch = ReminderPatch {
        content: Some(Bytes::from(r#"{"title":"fixed"}"#)),
        when: Some(When::At(1_000)),
        urgency: None,
    };
    service.patch(&id, patch, 1_100).unwrap();
    let report = service.step(1_100).unwrap();
    assert_eq!((report.chunks_created, report.users_fanned_out), (1, 2));
    let bodies = take(&store, 1_100);
    let titles: Vec<&str> = bodies
        .iter()
        .map(|b| b["content"]["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["kick-off", "fixed"]);

    // Deleted, then made again under the same id for other users, at the same time.
    service.step(1_200).unwrap();
    service.delete(&id).unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, None), 1_200)
        .unwrap();
    service.subscribe(&id, &ids(7..9)).unwrap();
    service.step(1_300).unwrap();
    assert_eq!(users_of(&take(&store, 1_300)), ["7", "8"]);
}

/// A reminder whose queue was deleted drops its fan-out (counted, named once in the report)
/// instead of failing every step, and a recurring one fires again once the queue is back.
#[test]
fn a_fan_out_whose_queue_is_gone_is_dropped() {
    let (store, service) = setup();
    let id = hourly(&service, "orphan", 10, 0..3);
    store.delete_queue(&q()).unwrap();
    let report = service.step(HOUR).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.fanouts_dropped, 1);
    assert_eq!(report.queues_missing, [("orphan".into(), "push".into())]);
    assert_eq!(report.users_fanned_out, 0);
    assert!(store.list_meta(FANOUTS_NAMESPACE).unwrap().is_empty());
    assert_eq!(service.get(&id).unwrap().next_fire_ms, Some(2 * HOUR));
    // Back: the next firing goes out, and the dropped one is not sent late.
    store.put_queue(&q(), Bytes::from("{}")).unwrap();
    let report = service.step(2 * HOUR).unwrap();
    assert_eq!((report.fanouts_dropped, report.chunks_created), (0, 1));
    let bodies = take(&store, 2 * HOUR);
    assert_eq!(bodies.len(), 1);
    assert_eq!(bodies[0]["firing"], 2 * HOUR);
}

/// A `MemoryStore` answered as one node of several: every key is owned, under a lease that
/// moves (another node took it over) right after the next `checks` ownership checks.
struct MovingLease {
    inner: MemoryStore,
    checks: std::sync::atomic::AtomicU32,
    moves: std::sync::atomic::AtomicU32,
}

impl MovingLease {
    fn move_after(&self, checks: u32) {
        self.checks
            .store(checks, std::sync::atomic::Ordering::SeqCst);
    }
}

impl belfry_store::ForwardingStore for MovingLease {
    fn wrapped(&self) -> &dyn Store {
        &self.inner
    }

    fn ownership(&self, _key: &str) -> Option<String> {
        use std::sync::atomic::Ordering::SeqCst;
        let lease = format!("lease-{}", self.moves.load(SeqCst));
        if self
            .checks
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            == Ok(1)
        {
            self.moves.fetch_add(1, SeqCst);
        }
        Some(lease)
    }
}

/// A node that loses a reminder's lease during a step (paused past it) writes nothing more:
/// not the firing's start, not a chunk, not a cursor over the new owner's progress. Without
/// the check, once the chunks' keys were forgotten, its puts made them again and its stale
/// cursor brought back a fan-out the new owner had finished.
#[test]
fn writes_under_a_lease_that_moved_are_not_made() {
    let store = Arc::new(MovingLease {
        inner: MemoryStore::new(),
        checks: Default::default(),
        moves: Default::default(),
    });
    store.put_queue(&q(), Bytes::from("{}")).unwrap();
    let service = ReminderService::new(store.clone());
    let id = ReminderId::new("moved").unwrap();
    service
        .create(Some(id.clone()), def(1_000, 10, Some(100)), 0)
        .unwrap();
    service.subscribe(&id, &ids(0..300)).unwrap();

    // The step decides to start the firing, then the lease moves: nothing is written.
    store.move_after(1);
    let stale = service.step(1_000).unwrap();
    assert_eq!((stale.writes_not_owned, stale.chunks_created), (1, 0));
    assert_eq!(service.get(&id).unwrap().firings, 0);

    let mut bodies = Vec::new();
    for now in (1_000..=5_000).step_by(100) {
        if now == 2_000 {
            // Mid fan-out: the step decides, then loses the lease before its chunks.
            store.move_after(1);
            let stale = service.step(now).unwrap();
            assert_eq!((stale.writes_not_owned, stale.chunks_created), (1, 0));
        }
        service.step(now).unwrap();
        bodies.extend(take(&store.inner, now));
    }
    let users = users_of(&bodies);
    let unique: BTreeSet<&String> = users.iter().collect();
    assert_eq!((users.len(), unique.len()), (300, 300), "each user once");
    assert_eq!(service.get(&id).unwrap().firings, 1);
}
