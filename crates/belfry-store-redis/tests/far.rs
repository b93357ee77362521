//! Far-future tasks: a task due `far_after_ms` or more ahead waits in a bucket and is moved
//! into the ready sets by a claim shortly before the bucket starts (10 s for a minute-wide
//! bucket). These
//! tests watch the buckets themselves (their keys in Redis) as well as what callers see, and
//! measure what a waiting task costs in Redis memory.

use belfry_core::{LatePolicy, NewTask, QueueName, TaskId, TaskState};
use belfry_store::{ChangeOutcome, PutOutcome, QueueCounts, Store};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

/// A minute's first ms (minute 1 mod 10: the buckets used below are a minute wide and
/// promoted 10 s ahead, as minutes not a multiple of 10 are).
const BASE: u64 = 28_333_331 * 60_000;
const MINUTE: u64 = 60_000;
const LEAD: u64 = 10_000;

fn store(server: &RedisServer, namespace: &str, place_now: Option<u64>) -> RedisStore {
    let options = RedisOptions {
        namespace: namespace.into(),
        partitions: 4,
        placement_now_ms: place_now,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    store.put_queue(&q(), Bytes::new()).unwrap();
    store
}

fn q() -> QueueName {
    QueueName::new("q").unwrap()
}

fn created(outcome: &PutOutcome) -> TaskId {
    match outcome {
        PutOutcome::Created { id, .. } => *id,
        other => panic!("expected a new task, got {other:?}"),
    }
}

fn put(store: &RedisStore, dues: &[u64]) -> Vec<TaskId> {
    let tasks = dues.iter().map(|&d| NewTask::new(q(), d, "{}")).collect();
    store.put(tasks).unwrap().iter().map(created).collect()
}

fn redis(server: &RedisServer) -> redis::Connection {
    server.connection()
}

/// Keys of namespace `ns` matching `pattern` (after the namespace's tag opening).
fn keys(con: &mut redis::Connection, ns: &str, pattern: &str) -> Vec<String> {
    let mut found: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{ns}/{pattern}"))
        .query(con)
        .unwrap();
    found.sort();
    found
}

fn claim(store: &RedisStore, now: u64) -> Vec<TaskId> {
    let batch = store.claim(&q(), now, 100, 60_000).unwrap();
    let mut ids: Vec<TaskId> = batch.leased.iter().map(|t| t.task.id).collect();
    ids.sort();
    ids
}

/// Claims at `now` and acks what it took at once, so no lease comes back later.
fn claim_ack(store: &RedisStore, now: u64) -> Vec<TaskId> {
    let batch = store.claim(&q(), now, 100, 60_000).unwrap();
    let acks: Vec<(TaskId, belfry_core::LeaseId)> = batch
        .leased
        .iter()
        .map(|t| (t.task.id, t.lease_id))
        .collect();
    store.ack_many(&q(), &acks, now).unwrap();
    let mut ids: Vec<TaskId> = acks.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    ids
}

#[test]
fn a_far_task_waits_in_a_bucket_and_fires_on_time_never_early() {
    let server = RedisServer::start();
    let store = store(&server, "far1", Some(BASE));
    let mut con = redis(&server);
    let bucket = BASE + 5 * MINUTE;
    let due = bucket + 30_000;
    let ids = put(&store, &[due, due + 1, due + 59_000]);
    // Two buckets (minutes 5 and 6); no ready set holds anything.
    assert_eq!(keys(&mut con, "far1", "*:b:*").len(), 2);
    assert!(keys(&mut con, "far1", "*:h").is_empty());
    assert!(keys(&mut con, "far1", "*:n").is_empty());
    let counts = store.counts(&q(), BASE).unwrap();
    assert_eq!((counts.pending, counts.due), (3, 0));
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(bucket - LEAD));
    let by_minute = store.forecast(&q(), BASE, MINUTE, 8).unwrap();
    assert_eq!(by_minute, vec![0, 0, 0, 0, 0, 2, 1, 0]);
    // Steps across the buckets' edges: the tasks are read one by one.
    let by_7s = store.forecast(&q(), due - 3_500, 7_000, 10).unwrap();
    assert_eq!(by_7s, vec![2, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(
        store.get(&q(), ids[0], BASE).unwrap().unwrap().state,
        TaskState::Scheduled
    );

    // A ms before the lead: nothing moves.
    assert!(claim(&store, bucket - LEAD - 1).is_empty());
    assert_eq!(keys(&mut con, "far1", "*:b:*").len(), 2);
    // At the lead: the first bucket is promoted, nothing is due yet.
    assert!(claim(&store, bucket - LEAD).is_empty());
    assert_eq!(keys(&mut con, "far1", "*:b:*").len(), 1);
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(due));
    assert!(claim(&store, due - 1).is_empty(), "never early");
    assert_eq!(claim(&store, due), vec![ids[0]]);
    assert_eq!(claim(&store, due + 1), vec![ids[1]]);
    // The second bucket, never promoted ahead (no claim at its lead): the claim at its due
    // time promotes it first, so the task is not late.
    assert!(claim(&store, due + 58_999).is_empty());
    assert_eq!(claim(&store, due + 59_000), vec![ids[2]]);
    assert!(keys(&mut con, "far1", "*:b:*").is_empty());
    let counts = store.counts(&q(), due + 59_000).unwrap();
    assert_eq!((counts.pending, counts.in_flight), (0, 3));
}

#[test]
fn later_tasks_share_wider_buckets_and_still_fire_on_time() {
    let server = RedisServer::start();
    let store = store(&server, "far7", Some(BASE));
    let mut con = redis(&server);
    let hour = 60 * MINUTE;
    // Due in 3 h (10-minute buckets, promoted a minute ahead) and in 2 days (hour-wide
    // buckets, promoted 5 minutes ahead).
    let soon = BASE + 3 * hour + MINUTE + 5;
    let later = BASE + 48 * hour + 31 * MINUTE;
    let ids = put(
        &store,
        &[soon, soon + 2 * MINUTE, later, later + 10 * MINUTE],
    );
    assert_eq!(keys(&mut con, "far7", "*:b:*").len(), 2);
    let ten = soon / (10 * MINUTE) * (10 * MINUTE);
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(ten - MINUTE));
    let by_hour = store.forecast(&q(), BASE, hour, 50).unwrap();
    assert_eq!(by_hour.iter().sum::<u64>(), 4);
    assert_eq!(by_hour[((later - BASE) / hour) as usize], 2);
    assert!(claim_ack(&store, ten - MINUTE - 1).is_empty());
    assert_eq!(keys(&mut con, "far7", "*:b:*").len(), 2);
    assert!(claim_ack(&store, ten - MINUTE).is_empty());
    assert_eq!(keys(&mut con, "far7", "*:b:*").len(), 1);
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(soon));
    assert!(claim_ack(&store, soon - 1).is_empty(), "never early");
    assert_eq!(claim_ack(&store, soon + 2 * MINUTE), ids[..2].to_vec());
    let whole = later / hour * hour;
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(whole - 5 * MINUTE));
    assert!(claim_ack(&store, whole - 5 * MINUTE).is_empty());
    assert!(claim_ack(&store, later - 1).is_empty(), "never early");
    assert_eq!(claim_ack(&store, later), vec![ids[2]]);
    assert_eq!(claim_ack(&store, later + 10 * MINUTE), vec![ids[3]]);
    assert!(keys(&mut con, "far7", "*:b:*").is_empty());
}

#[test]
fn lagging_promotion_still_counts_due_tasks_and_claims_them_at_once() {
    let server = RedisServer::start();
    let store = store(&server, "far2", Some(BASE));
    let due = BASE + 10 * MINUTE;
    let ids = put(&store, &[due, due + 5]);
    // No claim ran since: an hour later both are due, still in their bucket.
    let late = due + 3_600_000;
    let counts = store.counts(&q(), late).unwrap();
    assert_eq!((counts.pending, counts.due), (2, 2));
    assert_eq!(claim(&store, late), ids);
}

#[test]
fn a_big_bucket_is_promoted_over_several_claims_each_task_once() {
    let server = RedisServer::start();
    let store = store(&server, "far8", Some(BASE));
    let mut con = redis(&server);
    let due = BASE + 9 * MINUTE;
    // One put call: one partition, one bucket of 4,500 tasks (a claim promotes 2,000).
    let ids = put(&store, &vec![due; 4_500]);
    let mut seen = std::collections::BTreeSet::new();
    let mut calls = 0;
    loop {
        let batch = store.claim(&q(), due, 10_000, 600_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        calls += 1;
        for t in &batch.leased {
            assert!(seen.insert(t.task.id), "{:?} leased twice", t.task.id);
        }
        let counts = store.counts(&q(), due).unwrap();
        assert_eq!(counts.pending + counts.in_flight, 4_500);
        assert_eq!(counts.in_flight, seen.len() as u64);
    }
    assert!(calls >= 3, "{calls} claims");
    assert_eq!(seen.len(), ids.len());
    assert!(keys(&mut con, "far8", "*:b:*").is_empty());
}

#[test]
fn cancel_and_reschedule_of_bucketed_tasks() {
    let server = RedisServer::start();
    let store = store(&server, "far3", Some(BASE));
    let mut con = redis(&server);
    let x = BASE + 20 * MINUTE;
    let y = BASE + 40 * MINUTE;
    let ids = put(&store, &[x + 1_000, x + 2_000, x + 3_000]);
    let [a, b, c] = ids[..] else { unreachable!() };
    assert_eq!(store.cancel(&q(), a, BASE).unwrap(), ChangeOutcome::Ok);
    assert_eq!(
        store.get(&q(), a, BASE).unwrap().unwrap().state,
        TaskState::Cancelled
    );
    // b moves to minute 40 and back to minute 20 (two entries in minute 20's list now).
    assert_eq!(
        store.reschedule(&q(), b, y + 500, BASE).unwrap(),
        ChangeOutcome::Ok
    );
    assert_eq!(store.forecast(&q(), x, 20 * MINUTE, 2).unwrap(), vec![1, 1]);
    assert_eq!(
        store.reschedule(&q(), b, x + 4_000, BASE).unwrap(),
        ChangeOutcome::Ok
    );
    // c comes near (due within far_after_ms of the reschedule's now): a ready set.
    let near = x - 30_000;
    assert_eq!(
        store.reschedule(&q(), c, near, near - 60_000).unwrap(),
        ChangeOutcome::Ok
    );
    let counts = store.counts(&q(), BASE).unwrap();
    assert_eq!(counts.pending, 2);
    assert_eq!(
        store.forecast(&q(), x - MINUTE, MINUTE, 2).unwrap(),
        vec![1, 1]
    );
    // Minute 40 counts no task any more: gone, list and all.
    assert_eq!(keys(&mut con, "far3", "*:b:*").len(), 1);
    assert_eq!(claim(&store, near), vec![c]);
    // Promotion reads b's two entries and a's stale one: b is leased once, a never.
    assert_eq!(claim(&store, x + 10_000), vec![b]);
    assert!(keys(&mut con, "far3", "*:b:*").is_empty());
    assert_eq!(store.get(&q(), b, x).unwrap().unwrap().attempts, 1);
    // What is left to wake up for: c's lease ending.
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(near + 60_000));

    // Cancelling every task of a bucket drops the bucket: nothing left to wake up for.
    let last = put(&store, &[y + 30_000]);
    assert_eq!(keys(&mut con, "far3", "*:b:*").len(), 1);
    assert_eq!(
        store.cancel(&q(), last[0], BASE).unwrap(),
        ChangeOutcome::Ok
    );
    assert!(keys(&mut con, "far3", "*:b:*").is_empty());
    assert_eq!(store.counts(&q(), BASE).unwrap().pending, 0);
}

#[test]
fn a_bucketed_task_keeps_its_key_headers_and_late_policy() {
    let server = RedisServer::start();
    let store = store(&server, "far4", Some(BASE));
    let due = BASE + 3 * MINUTE;
    let mut task = NewTask::new(q(), due, "{\"order\":7}");
    task.idempotency_key = Some("order-7".into());
    task.headers = vec![("x-trace".into(), "abc".into())];
    task.late_policy = LatePolicy::Skip { after_ms: 1_000 };
    let id = created(&store.put(vec![task.clone()]).unwrap()[0]);
    match &store.put(vec![task]).unwrap()[0] {
        PutOutcome::Duplicate(existing) => {
            assert_eq!(existing.id, id);
            assert_eq!(existing.state, TaskState::Scheduled);
            assert_eq!(
                existing.headers,
                vec![("x-trace".to_owned(), "abc".to_owned())]
            );
            assert_eq!(&existing.payload[..], b"{\"order\":7}");
        }
        other => panic!("expected the duplicate, got {other:?}"),
    }
    // Claimed 5 s late with a 1 s allowance: skipped, its key still taken.
    let batch = store.claim(&q(), due + 5_000, 10, 60_000).unwrap();
    assert!(batch.leased.is_empty());
    assert_eq!(batch.late_skipped, vec![id]);
    let got = store.get(&q(), id, due + 5_000).unwrap().unwrap();
    assert_eq!(got.state, TaskState::Skipped);
    assert_eq!(got.idempotency_key.as_deref(), Some("order-7"));
}

#[test]
fn a_lost_hint_of_a_bucket_is_rebuilt_by_the_sweep() {
    let server = RedisServer::start();
    let store = store(&server, "far5", Some(BASE));
    let mut con = redis(&server);
    let bucket = BASE + 7 * MINUTE;
    let ids = put(&store, &[bucket + 100]);
    // The crash between the put's script and its hint update.
    // The hint itself, not its versions (`{ns/h<uid>}:v`).
    let hints = keys(&mut con, "far5", "h*}");
    assert_eq!(hints.len(), 1, "{hints:?}");
    redis::cmd("DEL").arg(&hints[0]).exec(&mut con).unwrap();
    assert_eq!(store.next_due_ms(&q()).unwrap(), None);
    store.sweep().unwrap();
    assert_eq!(store.next_due_ms(&q()).unwrap(), Some(bucket - LEAD));
    assert_eq!(claim(&store, bucket + 100), ids);
}

#[test]
fn deleting_a_queue_removes_its_buckets() {
    let server = RedisServer::start();
    let store = store(&server, "far6", Some(BASE));
    let mut con = redis(&server);
    put(
        &store,
        &[BASE + 5 * MINUTE, BASE + 50 * MINUTE, BASE + 500 * MINUTE],
    );
    assert_eq!(keys(&mut con, "far6", "*:b:*").len(), 3);
    assert!(store.delete_queue(&q()).unwrap());
    assert!(keys(&mut con, "far6", "*:1:*").is_empty());
}

fn used_memory(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Bytes of Redis memory per task, beyond a 200-byte payload, for `n` tasks due from a day
/// ahead on, `apart_ms` from one another, put with `far_after_ms` in batches of 1,000 (each
/// batch in one of 256 partitions).
fn bytes_per_task(server: &RedisServer, far_after_ms: u64, n: usize, apart_ms: u64) -> f64 {
    let mut con = redis(server);
    redis::cmd("FLUSHALL").exec(&mut con).unwrap();
    let options = RedisOptions {
        namespace: "mem".into(),
        far_after_ms,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).unwrap();
    store.put_queue(&q(), Bytes::new()).unwrap();
    let payload = Bytes::from(format!("\"{}\"", "x".repeat(198)));
    let due = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 86_400_000;
    let before = used_memory(&mut con);
    for chunk in 0..n / 1_000 {
        let tasks = (0..1_000)
            .map(|i| {
                let at = due + (chunk * 1_000 + i) as u64 * apart_ms;
                NewTask::new(q(), at, payload.clone())
            })
            .collect();
        store.put(tasks).unwrap();
    }
    let after = used_memory(&mut con);
    assert_eq!(
        store.counts(&q(), 0).unwrap(),
        QueueCounts {
            pending: n as u64,
            ..Default::default()
        }
    );
    (after - before) as f64 / n as f64 - 200.0
}

/// The target of issue #14: a pending task due far ahead costs at most 100 bytes of Redis
/// memory beyond its payload (used_memory, default Redis settings), whether many tasks share
/// a minute or they are spread thin over days.
#[test]
fn a_far_task_costs_at_most_100_bytes_beyond_its_payload() {
    let server = RedisServer::start();
    let n = 200_000;
    let ready = bytes_per_task(&server, 0, n, 1);
    let dense = bytes_per_task(&server, 120_000, n, 1);
    // One task every 1.3 s over three days: a partition gets one every 5 minutes.
    let sparse = bytes_per_task(&server, 120_000, n, 1_300);
    eprintln!(
        "bytes per pending task beyond a 200-byte payload ({n} tasks): ready sets {ready:.1}, \
         far-future buckets {dense:.1} (due within 200 s), {sparse:.1} (spread over 3 days)"
    );
    assert!(
        dense <= 100.0,
        "{dense:.1} bytes per task beyond the payload"
    );
    assert!(
        sparse <= 100.0,
        "{sparse:.1} bytes per task beyond the payload (sparse)"
    );
    assert!(
        dense < ready - 50.0,
        "buckets {dense:.1} vs ready sets {ready:.1}"
    );
}
