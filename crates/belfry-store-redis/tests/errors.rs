//! Redis's own refusals are told apart from replies belfry cannot read: a Redis at its
//! `maxmemory` is a full store (the API's `507`, as a full disk is for the embedded engine),
//! refused credentials say so, and neither is "corrupt data".

use belfry_core::{NewTask, QueueName};
use belfry_store::{LeaseOutcome, Store, StoreError};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget};
use bytes::Bytes;

const NOW: u64 = 10_000;

fn options(namespace: &str) -> RedisOptions {
    RedisOptions {
        namespace: namespace.into(),
        partitions: 4,
        placement_now_ms: Some(NOW),
        ..RedisOptions::default()
    }
}

fn config_set(server: &RedisServer, name: &str, value: &str) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .exec(&mut server.connection())
        .unwrap();
}

#[test]
fn a_redis_at_maxmemory_refuses_changes_as_a_full_store() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.target(), options("oom")).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    store
        .put(vec![NewTask::new(queue.clone(), NOW - 1, "{}")])
        .unwrap();

    config_set(&server, "maxmemory", "1");
    let refused = store.put(vec![NewTask::new(queue.clone(), NOW, "{}")]);
    let Err(StoreError::Full { detail }) = refused else {
        panic!("a put into a Redis at maxmemory: {refused:?}");
    };
    assert!(detail.contains("maxmemory"), "{detail}");
    let other = QueueName::new("other").unwrap();
    let refused = store.put_queue(&other, Bytes::new());
    assert!(
        matches!(refused, Err(StoreError::Full { .. })),
        "{refused:?}"
    );
    // Reads go on.
    assert_eq!(store.counts(&queue, NOW).unwrap().pending, 1);

    config_set(&server, "maxmemory", "0");
    store
        .put(vec![NewTask::new(queue.clone(), NOW, "{}")])
        .unwrap();
    assert_eq!(store.counts(&queue, NOW).unwrap().pending, 2);
}

#[test]
fn refused_credentials_say_so_at_connect_and_later() {
    let server = RedisServer::start();
    // A store whose every call connects afresh, made before the password is set.
    let fresh = RedisOptions {
        pool_idle_max: 0,
        ..options("auth")
    };
    let store = RedisStore::connect(&server.target(), fresh).unwrap();
    config_set(&server, "requirepass", "right-one");

    // A rotated password: calls get NOAUTH.
    let refused = store.get_queue(&QueueName::new("q").unwrap());
    let Err(StoreError::AccessDenied { detail }) = refused else {
        panic!("a call without the new password: {refused:?}");
    };
    assert!(
        detail.starts_with("redis refused the credentials"),
        "{detail}"
    );
    assert!(detail.contains("NOAUTH"), "{detail}");

    // A wrong password at connect.
    let wrong = RedisTarget::parse(&format!("redis://:wrong-one@127.0.0.1:{}", server.port()));
    let refused = RedisStore::connect(&wrong.unwrap(), options("auth"));
    let Err(StoreError::AccessDenied { detail }) = refused else {
        panic!("a wrong password: {refused:?}");
    };
    assert!(
        detail.starts_with("redis refused the credentials"),
        "{detail}"
    );
    assert!(
        !detail.contains("wrong-one"),
        "the password is not shown: {detail}"
    );

    // No password at connect.
    let refused = RedisStore::connect(&server.target(), options("auth"));
    let Err(error @ StoreError::AccessDenied { .. }) = refused else {
        panic!("no password: {refused:?}");
    };
    assert!(error.to_string().contains("NOAUTH"), "{error}");
}

/// A cluster URL naming one Redis is a mistake that waiting does not fix: refused for good,
/// saying to use `redis://`, not "retry shortly".
#[test]
fn a_cluster_url_naming_one_redis_is_refused_for_good() {
    let server = RedisServer::start();
    let url = format!("redis-cluster://127.0.0.1:{}", server.port());
    let refused = RedisStore::connect(&RedisTarget::parse(&url).unwrap(), options("one"));
    let Err(StoreError::Invalid(why)) = refused else {
        panic!("a cluster URL naming one Redis: {refused:?}");
    };
    assert!(
        why.contains("is not a cluster (cluster support disabled)"),
        "{why}"
    );
    assert!(
        why.contains(&format!("use redis://127.0.0.1:{}", server.port())),
        "{why}"
    );
}

/// A full Redis still delivers: deliveries are what free its memory (an ack deletes the
/// task), so claims, acks, nacks and dead letters go on, and only the hint updates behind
/// them (which Redis refuses) are left for later.
#[test]
fn a_redis_at_maxmemory_goes_on_delivering() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.target(), options("oom-deliver")).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    let due = || NewTask::new(queue.clone(), NOW - 1, "{}");
    store.put(vec![due(), due(), due(), due()]).unwrap();

    config_set(&server, "maxmemory", "1");
    let batch = store
        .claim(&queue, NOW, 3, 30_000)
        .expect("a claim at maxmemory");
    let [acked, nacked, buried] = &batch.leased[..] else {
        panic!("3 tasks leased: {:?}", batch.leased);
    };
    let ack = store.ack(&queue, acked.task.id, acked.lease_id, NOW);
    assert_eq!(ack.unwrap(), LeaseOutcome::Ok);
    let nack = store.nack(&queue, nacked.task.id, nacked.lease_id, NOW + 10, NOW);
    assert_eq!(nack.unwrap(), LeaseOutcome::Ok);
    let dead = store.dead_letter(&queue, buried.task.id, buried.lease_id, "gone", NOW);
    assert_eq!(dead.unwrap(), LeaseOutcome::Ok);
    // The fourth task, and the nacked one at its retry time.
    let later = store.claim(&queue, NOW + 20, 10, 30_000).unwrap();
    let mut ids: Vec<_> = later.leased.iter().map(|t| t.task.id).collect();
    ids.sort();
    assert_eq!(ids.len(), 2, "{:?}", later.leased);
    assert!(ids.contains(&nacked.task.id));
    let counts = store.counts(&queue, NOW + 20).unwrap();
    assert_eq!((counts.in_flight, counts.dead), (2, 1), "{counts:?}");
    // Submits are still refused until memory is freed.
    assert!(matches!(
        store.put(vec![due()]),
        Err(StoreError::Full { .. })
    ));
    config_set(&server, "maxmemory", "0");
    store.put(vec![due()]).unwrap();
}

/// A Redis that accepts connections and never answers (stopped, or a network that drops its
/// packets) is said to be one, not "Resource temporarily unavailable (os error 11)".
#[test]
fn a_redis_that_never_answers_is_said_to_be_silent() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = RedisTarget::parse(&format!("redis://{}", silent.local_addr().unwrap())).unwrap();
    let quick = RedisOptions {
        timeouts: belfry_store_redis::Timeouts {
            connect: std::time::Duration::from_millis(300),
            command: std::time::Duration::from_millis(300),
        },
        ..options("silent")
    };
    let refused = RedisStore::connect(&target, quick);
    let Err(StoreError::Unavailable { detail }) = refused else {
        panic!("a silent redis: {refused:?}");
    };
    assert!(detail.contains("did not answer within"), "{detail}");
    drop(silent);
}
