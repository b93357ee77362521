//! The in-flight cap shared by every node on one Redis (`Store::reserve_in_flight`): two store
//! handles on one server stand for two belfry nodes.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use belfry_core::{LeaseId, LeasedTask, NewTask, QueueName, UnixMs};
use belfry_store::{InFlightRoom, LeaseOutcome, Store};
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};

const CAP: u64 = 5;
const VISIBILITY_MS: u64 = 30_000;
const NOW: UnixMs = 1_000_000;

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Two handles ("nodes") on a namespace of their own, with a queue of `tasks` due tasks.
fn two_nodes(tasks: usize) -> (RedisStore, RedisStore, QueueName) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let options = RedisOptions {
        namespace: format!("inflight{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        partitions: 16,
        ..RedisOptions::default()
    };
    let connect = || RedisStore::connect(&server().target(), options.clone()).unwrap();
    let (a, b) = (connect(), connect());
    let queue = QueueName::new("capped").unwrap();
    a.put_queue(&queue, bytes::Bytes::from_static(b"{}"))
        .unwrap();
    let new: Vec<NewTask> = (0..tasks)
        .map(|i| NewTask::new(queue.clone(), NOW - 10, format!("{{\"i\":{i}}}")))
        .collect();
    a.put(new).unwrap();
    (a, b, queue)
}

fn reserve(s: &RedisStore, q: &QueueName, want: u64, now: UnixMs) -> InFlightRoom {
    s.reserve_in_flight(q, want, CAP, now, now + VISIBILITY_MS)
        .unwrap()
        .expect("redis keeps a shared count")
}

/// Reserves, claims what was granted and settles: the leases taken.
fn claim(s: &RedisStore, q: &QueueName, want: u64, now: UnixMs) -> Vec<LeasedTask> {
    let room = reserve(s, q, want, now);
    let batch = s
        .claim(q, now, room.granted as usize, VISIBILITY_MS)
        .unwrap();
    let leases: Vec<(LeaseId, UnixMs)> = batch
        .leased
        .iter()
        .map(|t| (t.lease_id, t.lease_until_ms))
        .collect();
    s.settle_in_flight(q, &room, &leases, now).unwrap();
    batch.leased
}

#[test]
fn two_nodes_share_one_cap_and_acks_free_room() {
    let (a, b, q) = two_nodes(20);
    let on_a = claim(&a, &q, 3, NOW);
    assert_eq!(on_a.len(), 3);
    let on_b = claim(&b, &q, 10, NOW);
    assert_eq!(on_b.len(), 2, "b gets only what a left of the cap of 5");
    let full = reserve(&a, &q, 1, NOW);
    assert_eq!(full.granted, 0);
    assert_eq!(full.earliest_until_ms, Some(NOW + VISIBILITY_MS));
    a.settle_in_flight(&q, &full, &[], NOW).unwrap();

    // A lease a took, acked through b (a consumer behind a load balancer), frees its room.
    let t = &on_a[0];
    assert_eq!(
        b.ack_many(&q, &[(t.task.id, t.lease_id)], NOW + 1).unwrap(),
        vec![LeaseOutcome::Ok]
    );
    assert_eq!(claim(&a, &q, 10, NOW + 1).len(), 1);
    // So do a nack and a dead letter, each freeing one.
    let t = &on_b[0];
    assert_eq!(
        a.nack(&q, t.task.id, t.lease_id, NOW + 60_000, NOW + 2)
            .unwrap(),
        LeaseOutcome::Ok
    );
    let t = &on_b[1];
    assert_eq!(
        b.dead_letter(&q, t.task.id, t.lease_id, "test", NOW + 2)
            .unwrap(),
        LeaseOutcome::Ok
    );
    assert_eq!(claim(&b, &q, 10, NOW + 3).len(), 2);
    assert_eq!(reserve(&b, &q, 10, NOW + 3).granted, 0);
}

#[test]
fn unused_room_and_expired_leases_free_room() {
    let (a, b, q) = two_nodes(2);
    // a asks for 5 but only 2 tasks are due: the other 3 are free again once settled.
    assert_eq!(claim(&a, &q, 5, NOW).len(), 2);
    assert_eq!(reserve(&b, &q, 10, NOW).granted, 3);
    // A node that reserved and died before settling holds its room until its deadline;
    // leases that nobody acks (a crashed node's) hold theirs until theirs.
    let deadline = NOW + VISIBILITY_MS;
    assert_eq!(reserve(&b, &q, 10, deadline - 1).granted, 0);
    assert_eq!(reserve(&b, &q, 10, deadline).granted, CAP);
}

#[test]
fn an_extended_lease_keeps_its_room() {
    let (a, b, q) = two_nodes(5);
    let leased = claim(&a, &q, 5, NOW);
    assert_eq!(leased.len(), 5);
    let later = NOW + 3 * VISIBILITY_MS;
    let t = &leased[0];
    assert_eq!(
        a.extend(&q, t.task.id, t.lease_id, later, NOW + 1).unwrap(),
        LeaseOutcome::Ok
    );
    // At the old deadline, an extension comes too late: refused, and its room is not
    // brought back (nothing has pruned the set yet).
    let after = NOW + VISIBILITY_MS;
    let expired = &leased[1];
    assert_eq!(
        b.extend(&q, expired.task.id, expired.lease_id, later, after)
            .unwrap(),
        LeaseOutcome::LeaseExpired
    );
    // The four others expired; the extended one still holds its room, until its new deadline.
    assert_eq!(reserve(&b, &q, 1, after).granted, 1);
    assert_eq!(reserve(&b, &q, 10, after).granted, CAP - 2);
    assert_eq!(reserve(&b, &q, 10, later).granted, CAP);
}

#[test]
fn a_smaller_cap_grants_nothing_until_leases_end() {
    let (a, b, q) = two_nodes(5);
    let leased = claim(&a, &q, 5, NOW);
    assert_eq!(leased.len(), 5);
    let small = |s: &RedisStore, now| s.reserve_in_flight(&q, 10, 2, now, now + 1).unwrap();
    assert_eq!(small(&b, NOW).unwrap().granted, 0);
    let acks: Vec<_> = leased.iter().map(|t| (t.task.id, t.lease_id)).collect();
    a.ack_many(&q, &acks[..3], NOW + 1).unwrap();
    assert_eq!(small(&b, NOW + 2).unwrap().granted, 0, "2 held, cap 2");
    a.ack_many(&q, &acks[3..], NOW + 3).unwrap();
    assert_eq!(small(&b, NOW + 4).unwrap().granted, 2);
}

#[test]
fn a_deleted_queue_takes_its_room_along() {
    let (a, b, q) = two_nodes(5);
    assert_eq!(claim(&a, &q, 5, NOW).len(), 5);
    assert!(a.delete_queue(&q).unwrap());
    assert!(b.reserve_in_flight(&q, 1, CAP, NOW, NOW + 1).is_err());
    b.put_queue(&q, bytes::Bytes::from_static(b"{}")).unwrap();
    assert_eq!(reserve(&b, &q, 10, NOW).granted, CAP);
}

/// Two nodes claiming and acking as fast as they can: the leases they hold together, as
/// each counts them between its settle and its ack, never pass the cap.
#[test]
fn concurrent_nodes_never_hold_more_than_the_cap() {
    let (a, b, q) = two_nodes(400);
    let held = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for node in [&a, &b] {
            let (q, held, most, delivered) = (&q, &held, &most, &delivered);
            scope.spawn(move || {
                while delivered.load(Ordering::SeqCst) < 400 {
                    let leased = claim(node, q, 3, NOW);
                    let n = leased.len();
                    let now_held = held.fetch_add(n, Ordering::SeqCst) + n;
                    most.fetch_max(now_held, Ordering::SeqCst);
                    // Hold the leases a moment, as a delivery would.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    held.fetch_sub(n, Ordering::SeqCst);
                    let acks: Vec<_> = leased.iter().map(|t| (t.task.id, t.lease_id)).collect();
                    node.ack_many(q, &acks, NOW).unwrap();
                    delivered.fetch_add(n, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(delivered.load(Ordering::SeqCst), 400);
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= CAP as usize,
        "held {most} leases at once, cap {CAP}"
    );
    assert!(
        most > 3,
        "the two nodes never overlapped ({most}): the test shows nothing"
    );
}

/// The node that frees room asks again first (its delivery just ended); a node that found no
/// room gets the next place all the same, rather than waiting until the first runs dry.
#[test]
fn a_node_that_found_no_room_gets_the_next_place() {
    let (a, b, q) = two_nodes(10);
    let held = claim(&a, &q, 5, NOW);
    assert_eq!(held.len(), 5);
    assert_eq!(reserve(&b, &q, 3, NOW).granted, 0, "b now waits");
    let t = &held[0];
    a.ack_many(&q, &[(t.task.id, t.lease_id)], NOW + 1).unwrap();
    assert_eq!(reserve(&a, &q, 3, NOW + 2).granted, 0, "the place is b's");
    let room = reserve(&b, &q, 3, NOW + 3);
    assert_eq!(room.granted, 1);
    b.settle_in_flight(&q, &room, &[], NOW + 3).unwrap();
    // b no longer waits: the freed place goes to whoever asks.
    assert_eq!(reserve(&a, &q, 3, NOW + 4).granted, 1);
}
