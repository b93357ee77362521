//! Claims on Redis: the claim script's batches (500 tasks per call inside the script) take
//! exactly what a claim asks for; and the queue's hint after a claim, which a claim sets to
//! what it found only if no lowering (a put, a retry, a reschedule) came between its read of
//! the hint and its settle, so a wake-up is never lost to that race.

use belfry_core::{NewTask, QueueName};
use belfry_store::Store;
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;
use redis::Script;

/// A store on `server` with `partitions` partitions, holding queue "q".
fn store_with_queue(
    server: &RedisServer,
    namespace: &str,
    partitions: u16,
) -> (RedisStore, QueueName) {
    let options = RedisOptions {
        namespace: namespace.into(),
        partitions,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    (store, queue)
}

#[test]
fn a_claim_of_more_than_one_batch_takes_exactly_what_it_asks() {
    let server = RedisServer::start();
    let (store, queue) = store_with_queue(&server, "claim", 1);
    let tasks = (0..1_200)
        .map(|i| NewTask::new(queue.clone(), 1_000 + i, "{}"))
        .collect();
    store.put(tasks).unwrap();
    let first = store.claim(&queue, 3_000, 1_100, 60_000).unwrap().leased;
    assert_eq!(first.len(), 1_100);
    let dues: Vec<u64> = first.iter().map(|t| t.task.due_at_ms).collect();
    assert_eq!(dues, (1_000..2_100).collect::<Vec<u64>>());
    // Every lease is its own.
    let mut leases: Vec<_> = first.iter().map(|t| t.lease_id).collect();
    leases.sort();
    leases.dedup();
    assert_eq!(leases.len(), 1_100);
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(2_100));
    let rest = store.claim(&queue, 3_000, 1_100, 60_000).unwrap().leased;
    assert_eq!(rest.len(), 100);
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(63_000));
}

const HINT: &str = "{t/h1}";
const VERSIONS: &str = "{t/h1}:v";

fn hint_claim() -> Script {
    Script::new(include_str!("../src/lua/hint_claim.lua"))
}

/// A put's (or retry's) lowering of partition `p`'s entry to `at`, with no wake-up message.
fn lower(con: &mut redis::Connection, p: u16, at: i64) -> i64 {
    Script::new(include_str!("../src/lua/hint.lua"))
        .key(HINT)
        .key(VERSIONS)
        .arg(at)
        .arg(p)
        .arg("")
        .arg("")
        .invoke(con)
        .unwrap()
}

fn due(con: &mut redis::Connection, now: i64) -> Vec<(u16, String)> {
    hint_claim()
        .key(HINT)
        .key(VERSIONS)
        .arg("due")
        .arg(now)
        .invoke(con)
        .unwrap()
}

/// Settles `(partition, version read, earliest)`; answers how many entries were set.
fn settle(con: &mut redis::Connection, entries: &[(u16, &str, i64)]) -> i64 {
    let script = hint_claim();
    let mut call = script.key(HINT);
    call.key(VERSIONS).arg("settle");
    for (p, version, at) in entries {
        call.arg(*p).arg(*version).arg(*at);
    }
    call.invoke(con).unwrap()
}

fn entry(con: &mut redis::Connection, p: u16) -> Option<i64> {
    redis::cmd("ZSCORE").arg(HINT).arg(p).query(con).unwrap()
}

#[test]
fn a_lowering_between_a_claims_read_and_its_settle_is_kept() {
    let server = RedisServer::start();
    let mut con = server.connection();
    lower(&mut con, 3, 100);
    lower(&mut con, 5, 120);
    lower(&mut con, 7, 9_000);
    // The claim reads the due partitions and their versions (each lowered once so far).
    assert_eq!(
        due(&mut con, 200),
        vec![(3, "1".to_owned()), (5, "1".to_owned())]
    );
    // A put lands in partition 3 (due 150) after the claim's script looked there: its
    // lowering changes nothing (100 is earlier) but counts.
    assert_eq!(lower(&mut con, 3, 150), 0);
    // The claim emptied both partitions: 5 is settled, 3 is not (its entry stays early).
    assert_eq!(settle(&mut con, &[(3, "1", -1), (5, "1", -1)]), 1);
    assert_eq!(entry(&mut con, 3), Some(100));
    assert_eq!(entry(&mut con, 5), None);
    // The next claim finds the put and settles 3 to what is left there.
    assert_eq!(due(&mut con, 200), vec![(3, "2".to_owned())]);
    assert_eq!(settle(&mut con, &[(3, "2", 4_000)]), 1);
    assert_eq!(entry(&mut con, 3), Some(4_000));
    assert_eq!(entry(&mut con, 7), Some(9_000));
}

#[test]
fn a_claim_across_partitions_leaves_the_hint_true() {
    let server = RedisServer::start();
    let (store, queue) = store_with_queue(&server, "hint", 16);
    // 40 tasks due at 1 000 (spread over the partitions), 10 due at 5 000.
    let tasks = (0..50)
        .map(|i| NewTask::new(queue.clone(), if i < 40 { 1_000 } else { 5_000 }, "{}"))
        .collect();
    store.put(tasks).unwrap();
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(1_000));
    // Three claims of 15 take the 40 due ones; the hint then says 5 000 (the leases end
    // later), and a claim at 5 000 takes the other 10.
    let mut taken = 0;
    for _ in 0..3 {
        taken += store.claim(&queue, 2_000, 15, 60_000).unwrap().leased.len();
    }
    assert_eq!(taken, 40);
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(5_000));
    assert_eq!(
        store.claim(&queue, 5_000, 50, 60_000).unwrap().leased.len(),
        10
    );
    assert_eq!(store.next_due_ms(&queue).unwrap(), Some(62_000));
}
