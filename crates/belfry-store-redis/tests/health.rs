//! `/readyz`'s store check (`Store::health`) is bounded by the command timeout: a Redis, or
//! one master of a cluster, that stops answering (`SIGSTOP`) makes it fail within about that
//! timeout (one try, no client retries), saying which master did not answer in time rather
//! than a raw socket error; once it answers again the store is healthy again.

use std::time::{Duration, Instant};

use belfry_store::{Store, StoreHealth};
use belfry_store_redis::testing::{RedisCluster, RedisServer};
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget, Timeouts};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// The timeout plus room for a loaded test machine, and less than two tries: the cluster
/// client's three tries (and its reconnects) took three timeouts and more.
const BOUND: Duration = Duration::from_millis(1_900);

fn store(target: &RedisTarget, namespace: &str) -> RedisStore {
    let options = RedisOptions {
        namespace: namespace.into(),
        partitions: 16,
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            command: COMMAND_TIMEOUT,
        },
        ..RedisOptions::default()
    };
    RedisStore::connect(target, options).unwrap()
}

/// The store's health, and how long it took to answer.
fn timed_health(store: &RedisStore) -> (StoreHealth, Duration) {
    let started = Instant::now();
    let health = store.health();
    (health, started.elapsed())
}

/// The reason of an unhealthy answer that came within [`BOUND`] and names `port`.
fn refused_in_time(store: &RedisStore, port: u16) -> String {
    let (health, took) = timed_health(store);
    let StoreHealth::Unavailable(why) = health else {
        panic!("a silent master is unhealthy, got {health:?}");
    };
    assert!(
        took < BOUND,
        "answered within the command timeout: {took:?} ({why})"
    );
    assert!(
        why.contains(&format!("127.0.0.1:{port}")) && why.contains("did not answer"),
        "{why}"
    );
    assert!(!why.contains("os error"), "{why}");
    eprintln!("unhealthy after {took:?}: {why}");
    why
}

#[test]
fn a_paused_redis_is_unhealthy_within_the_command_timeout() {
    let server = RedisServer::start();
    let store = store(&server.target(), "health");
    assert_eq!(store.health(), StoreHealth::Healthy);
    server.pause();
    let why = refused_in_time(&store, server.port());
    server.resume();
    assert_eq!(store.health(), StoreHealth::Healthy, "after: {why}");
}

#[test]
fn a_paused_cluster_master_is_unhealthy_within_the_command_timeout() {
    let cluster = RedisCluster::start(3, 0);
    let store = store(&cluster.target(), "health");
    assert_eq!(store.health(), StoreHealth::Healthy);
    let master = cluster.nodes().into_iter().find(|n| n.is_master).unwrap();
    cluster.pause(master.port);
    // Twice: the second check must not wait out the first's stalled connections either.
    for _ in 0..2 {
        refused_in_time(&store, master.port);
    }
    cluster.resume(master.port);
    assert_eq!(store.health(), StoreHealth::Healthy);
}
