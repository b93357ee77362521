//! Store events through a real Redis: a subscriber change on one store (node) reaches another
//! store on the same namespace as one `SubscriptionsChanged` event per call, naming its users,
//! or "every user" for a bulk change or a dropped set; the periodic look at everything is a
//! `Recheck`, and a `Resync` comes only when the listener (re)connects.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::UserId;
use belfry_store::{MetaEvent, Store, StoreEvent};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};

fn store(server: &RedisServer) -> RedisStore {
    let options = RedisOptions {
        namespace: "events".into(),
        partitions: 8,
        ..RedisOptions::default()
    };
    RedisStore::connect(&server.target(), options).expect("connect")
}

fn users(names: &[&str]) -> Vec<UserId> {
    names.iter().map(|n| UserId::new(n).unwrap()).collect()
}

/// The first event within 5 s that `pick` takes, skipping the others.
fn next_of<T>(
    events: &mpsc::Receiver<StoreEvent>,
    what: &str,
    pick: impl Fn(StoreEvent) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(event) => {
                if let Some(picked) = pick(event) {
                    return picked;
                }
            }
            Err(e) => panic!("no {what} within 5 s: {e}"),
        }
    }
}

/// The next subscriptions event, skipping the others (resyncs, wakes).
fn next_subscriptions(events: &mpsc::Receiver<StoreEvent>) -> Option<Vec<UserId>> {
    next_of(events, "subscriptions event", |event| match event {
        StoreEvent::SubscriptionsChanged(users) => Some(users),
        _ => None,
    })
}

/// Two nodes (stores) on `server`, and the events the second hears, once it listens (its
/// listener says Resync then: only from then on is a publish heard).
fn two_nodes_listening(
    server: &RedisServer,
) -> (RedisStore, RedisStore, mpsc::Receiver<StoreEvent>) {
    let (a, b) = (store(server), store(server));
    let (tx, events) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    b.subscribe_events(Arc::new(move |event| {
        let _ = tx.lock().unwrap().send(event);
    }))
    .unwrap();
    assert_eq!(next_sweep(&events), StoreEvent::Resync, "listening");
    (a, b, events)
}

#[test]
fn subscriber_changes_reach_the_other_node_as_one_event_per_call() {
    let server = RedisServer::start();
    let (a, _b, events) = two_nodes_listening(&server);

    assert_eq!(a.subscribe(7, &users(&["bob", "ann", "bob"])).unwrap(), 2);
    assert_eq!(next_subscriptions(&events), Some(users(&["ann", "bob"])));
    assert_eq!(a.unsubscribe(7, &users(&["bob", "cy"])).unwrap(), 1);
    assert_eq!(next_subscriptions(&events), Some(users(&["bob", "cy"])));
    // No change, no event: the next one heard is the bulk subscribe's, which names nobody.
    assert_eq!(a.subscribe(7, &users(&["ann"])).unwrap(), 0);
    let many: Vec<UserId> = (0..10_000)
        .map(|i| UserId::new(format!("user-{i}")).unwrap())
        .collect();
    assert_eq!(a.subscribe(8, &many).unwrap(), 10_000);
    assert_eq!(
        next_subscriptions(&events),
        None,
        "a bulk change: every user"
    );
    assert_eq!(a.drop_set(7).unwrap(), 1);
    assert_eq!(
        next_subscriptions(&events),
        None,
        "a dropped set: every user"
    );
}

/// The next resync or recheck, skipping the other events.
fn next_sweep(events: &mpsc::Receiver<StoreEvent>) -> StoreEvent {
    next_of(events, "resync or recheck", |event| match event {
        StoreEvent::Resync | StoreEvent::Recheck => Some(event),
        _ => None,
    })
}

/// While the listener stays connected, the periodic look at everything is a `Recheck`
/// (nothing missed, caches stay); a `Resync` (events missed) comes only when it connects,
/// first or again after its connection was cut.
#[test]
fn a_recheck_while_connected_and_a_resync_after_a_reconnect() {
    let server = RedisServer::start();
    let options = RedisOptions {
        namespace: "events".into(),
        partitions: 8,
        resync_every: Duration::from_millis(50),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).expect("connect");
    let (tx, events) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    store
        .subscribe_events(Arc::new(move |event| {
            let _ = tx.lock().unwrap().send(event);
        }))
        .unwrap();
    assert_eq!(next_sweep(&events), StoreEvent::Resync, "on connecting");
    for _ in 0..3 {
        assert_eq!(next_sweep(&events), StoreEvent::Recheck, "while connected");
    }
    let mut con = server.connection();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut con)
        .unwrap();
    assert_eq!(killed, 1, "the listener's connection");
    let deadline = Instant::now() + Duration::from_secs(5);
    while next_sweep(&events) != StoreEvent::Resync {
        assert!(Instant::now() < deadline, "no resync after the reconnect");
    }
}

/// Every metadata write counts, per namespace, on the store every node shares: a node that
/// missed the announcement can tell from the counts that something changed, and that nothing
/// did. A delete of nothing counts too, and is announced like any write.
#[test]
fn metadata_writes_are_counted_per_namespace_for_every_node() {
    use belfry_store::MetaChange;
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let versions = |s: &RedisStore| {
        s.meta_versions(&["schedules", "reminders"])
            .unwrap()
            .expect("a shared store counts")
    };
    assert_eq!(versions(&b), [0, 0]);
    a.put_meta("schedules", "s1", "x".into()).unwrap();
    assert_eq!(versions(&b), [1, 0]);
    a.write_meta(vec![
        MetaChange::put("schedules", "s2", "y".into()),
        MetaChange::put("schedules", "s3", "z".into()),
        MetaChange::put("reminders", "r1", "w".into()),
    ])
    .unwrap();
    assert_eq!(versions(&b), [2, 1], "one write, each namespace once");
    assert!(a.delete_meta("schedules", "s1").unwrap());
    assert!(!a.delete_meta("schedules", "s1").unwrap(), "already gone");
    assert_eq!(versions(&b), [4, 1]);
    assert_eq!(versions(&a), versions(&b));
    assert_eq!(
        b.list_meta("schedules").unwrap().len(),
        2,
        "the counts are not a namespace's entries"
    );
    assert_eq!(b.meta_versions(&[]).unwrap(), Some(vec![]));
}

/// The next metadata event, skipping the others.
fn next_meta(events: &mpsc::Receiver<StoreEvent>) -> MetaEvent {
    next_of(events, "metadata event", |event| match event {
        StoreEvent::MetaChanged(meta) => Some(meta),
        _ => None,
    })
}

/// A metadata write reaches the other node as one event per namespace, naming the keys it
/// wrote and the namespace's write count after it, so that a node re-reads only those keys
/// and can tell, from the counts, whether it missed an announcement. A delete of nothing is
/// counted and announced alike.
#[test]
fn a_metadata_write_announces_its_keys_and_count() {
    use belfry_store::MetaChange;
    let server = RedisServer::start();
    let (a, b, events) = two_nodes_listening(&server);
    let event = |namespace: &str, keys: &[&str], version| MetaEvent {
        namespace: namespace.into(),
        keys: Some(keys.iter().map(|k| k.to_string()).collect()),
        version: Some(version),
    };
    a.write_meta(vec![
        MetaChange::put("reminders", "00000000000000a1", "x".into()),
        MetaChange::put("reminder_ids", "standup", "a1".into()),
        MetaChange::put("reminders", "00000000000000b2", "y".into()),
    ])
    .unwrap();
    let mut heard = [next_meta(&events), next_meta(&events)];
    heard.sort_by(|x, y| x.namespace.cmp(&y.namespace));
    assert_eq!(
        heard,
        [
            event("reminder_ids", &["standup"], 1),
            event("reminders", &["00000000000000a1", "00000000000000b2"], 1),
        ]
    );
    a.put_meta("reminders", "00000000000000a1", "z".into())
        .unwrap();
    assert_eq!(
        next_meta(&events),
        event("reminders", &["00000000000000a1"], 2)
    );
    assert!(!a.delete_meta("reminders", "gone").unwrap());
    assert_eq!(next_meta(&events), event("reminders", &["gone"], 3));
    assert_eq!(b.meta_versions(&["reminders"]).unwrap(), Some(vec![3]));
}
