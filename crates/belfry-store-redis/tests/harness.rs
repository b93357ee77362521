//! The throwaway Redis harness (`belfry_store_redis::testing`) does what failure tests rely on:
//! a paused server answers nothing until resumed, a stopped one refuses connections, and a
//! killed cluster master is replaced by its replica.

use std::time::Duration;

use belfry_store_redis::testing::{RedisCluster, RedisServer};

fn ping(url: &str) -> redis::RedisResult<String> {
    let limit = Duration::from_millis(500);
    let mut con = redis::Client::open(url)?.get_connection_with_timeout(limit)?;
    con.set_read_timeout(Some(limit))?;
    redis::cmd("PING").query(&mut con)
}

/// One SET on a fresh connection.
fn set(url: &str, key: &str, value: &str) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .exec(&mut con)
        .unwrap();
}

fn get(url: &str, key: &str) -> Option<String> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("GET").arg(key).query(&mut con).unwrap()
}

#[test]
fn server_keeps_fsynced_writes_across_a_kill() {
    let mut server = RedisServer::start_with("always");
    set(&server.url(), "k", "v");
    let old = server.pid();
    server.kill();
    assert!(ping(&server.url()).is_err(), "a killed server answered");
    server.restart();
    assert_ne!(server.pid(), old);
    assert_eq!(get(&server.url(), "k").as_deref(), Some("v"));
}

#[test]
fn server_pause_resume_stop() {
    let mut server = RedisServer::start();
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(ping(&server.url()).unwrap(), "PONG");
    server.pause();
    let error = ping(&server.url()).unwrap_err();
    assert!(error.is_timeout(), "a paused server answered: {error}");
    server.resume();
    assert_eq!(ping(&server.url()).unwrap(), "PONG");
    let pid = server.pid();
    server.stop();
    assert!(ping(&server.url()).is_err(), "a stopped server answered");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "redis-server {pid} still exists after stop"
    );
}

#[test]
fn cluster_fails_over_a_killed_master() {
    let cluster = RedisCluster::start(3, 1);
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    assert_eq!(nodes.iter().filter(|n| n.is_master).count(), 3);
    assert!(cluster.url().starts_with("redis-cluster://127.0.0.1:"));
    let victim = nodes.iter().find(|n| n.is_master).unwrap().port;
    cluster.kill(victim);
    cluster
        .wait_healthy(Duration::from_secs(30))
        .expect("the replica takes over");
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 5);
    assert!(nodes.iter().all(|n| n.port != victim));
    assert_eq!(nodes.iter().filter(|n| n.is_master).count(), 3);
}
