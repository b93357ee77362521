//! Store events through a real Redis: a subscriber change on one store (node) reaches another
//! store on the same namespace as one `SubscriptionsChanged` event per call, naming its users,
//! or "every user" for a bulk change or a dropped set.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::UserId;
use belfry_store::{Store, StoreEvent};
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

/// The next subscriptions event, skipping the others (resyncs, wakes), within 5 s.
fn next_subscriptions(events: &mpsc::Receiver<StoreEvent>) -> Option<Vec<UserId>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(StoreEvent::SubscriptionsChanged(users)) => return users,
            Ok(_) => {}
            Err(e) => panic!("no subscriptions event within 5 s: {e}"),
        }
    }
}

#[test]
fn subscriber_changes_reach_the_other_node_as_one_event_per_call() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let (tx, events) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    b.subscribe_events(Arc::new(move |event| {
        let _ = tx.lock().unwrap().send(event);
    }))
    .unwrap();
    // The listener says Resync once it listens: only then is a publish heard.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let StoreEvent::Resync = events.recv_timeout(left).expect("the listener starts") {
            break;
        }
    }

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
