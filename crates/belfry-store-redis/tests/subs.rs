//! Sharded subscriber sets on real Redis: a big set on a 3-master cluster has members on
//! every master (counted on each master itself), pages through every member exactly once in
//! order, counts, unsubscribes and drops across its shards; a reminder fans out to every
//! member once, in order; and a namespace keeps the shard count it was made with.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use belfry_core::UserId;
use belfry_store::{Store, StoreError};
use belfry_store_redis::testing::{RedisCluster, RedisServer};
use belfry_store_redis::{RedisOptions, RedisStore, SUBSCRIBER_SHARDS_CLUSTER};

const SET: u64 = 77;

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

/// Numeric and textual ids mixed, as subscriber lists are.
fn users(n: usize) -> Vec<UserId> {
    (0..n)
        .map(|i| match i % 3 {
            0 => UserId::new((i as u64 * 104_729).to_string()).unwrap(),
            1 => UserId::new(format!("user-{i}")).unwrap(),
            _ => UserId::new(format!("u{}", i * 31)).unwrap(),
        })
        .collect()
}

/// On each master: (port, how many members of `SET` it holds, in how many keys).
fn members_per_master(cluster: &RedisCluster, namespace: &str) -> BTreeMap<u16, (u64, usize)> {
    let pattern = format!("{{{namespace}/s{SET}/*");
    let mut out = BTreeMap::new();
    for node in cluster.nodes().iter().filter(|n| n.is_master) {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", node.port))
            .and_then(|c| c.get_connection())
            .expect("connect to a master");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut con)
            .expect("KEYS");
        let mut members = 0u64;
        for key in &keys {
            let n: u64 = redis::cmd("ZCARD").arg(key).query(&mut con).expect("ZCARD");
            members += n;
        }
        out.insert(node.port, (members, keys.len()));
    }
    out
}

fn page_all(store: &RedisStore, limit: usize) -> Vec<UserId> {
    let mut all = Vec::new();
    loop {
        let page = store.subscribers(SET, all.last(), limit).expect("page");
        assert!(page.len() <= limit);
        let done = page.len() < limit;
        all.extend(page);
        if done {
            return all;
        }
    }
}

#[test]
fn a_big_set_spreads_over_every_master_and_pages_in_order() {
    let cluster = cluster();
    let namespace = "bigset";
    let options = RedisOptions {
        namespace: namespace.into(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&cluster.target(), options).expect("connect");
    let n = 20_000;
    let all = users(n);
    assert_eq!(store.subscribe(SET, &all).unwrap(), n as u64);
    // Again, and listed twice: nothing new.
    assert_eq!(store.subscribe(SET, &all[..100]).unwrap(), 0);

    let spread = members_per_master(cluster, namespace);
    assert_eq!(spread.len(), 3, "{spread:?}");
    let total: u64 = spread.values().map(|(m, _)| m).sum();
    let keys: usize = spread.values().map(|(_, k)| k).sum();
    assert_eq!(total, n as u64, "{spread:?}");
    assert_eq!(keys, usize::from(SUBSCRIBER_SHARDS_CLUSTER), "{spread:?}");
    // Each shard sits in its own sixteenth of the slots and each master serves a third of
    // them, so each master holds 4 to 6 shards: 25% to 38% of the members, give or take
    // the hash (a shard holds 1,250 ± 35).
    for (port, (members, _)) in &spread {
        let share = *members as f64 / n as f64;
        assert!(
            (0.22..0.41).contains(&share),
            "master {port} holds {members} of {n}: {spread:?}"
        );
    }

    let mut want = all.clone();
    want.sort();
    assert_eq!(store.subscriber_count(SET).unwrap(), n as u64);
    for limit in [5_001, 997, 1] {
        if limit == 1 {
            // Paging one by one costs a round trip per member: check the first stretch.
            let mut got: Vec<UserId> = Vec::new();
            for _ in 0..300 {
                got.extend(store.subscribers(SET, got.last(), 1).unwrap());
            }
            assert_eq!(got, want[..300], "limit 1");
            continue;
        }
        let got = page_all(&store, limit);
        assert_eq!(got.len(), n, "limit {limit}");
        assert!(
            got == want,
            "limit {limit}: pages differ from the sorted members"
        );
    }
    // Starting after any member, including one that is not subscribed.
    let from = &want[12_345];
    assert_eq!(
        store.subscribers(SET, Some(from), 3).unwrap(),
        want[12_346..12_349]
    );
    let stranger = UserId::new("not-a-member").unwrap();
    let after_stranger: Vec<UserId> = want
        .iter()
        .filter(|u| **u > stranger)
        .take(5)
        .cloned()
        .collect();
    assert_eq!(
        store.subscribers(SET, Some(&stranger), 5).unwrap(),
        after_stranger
    );

    for user in [&want[0], &want[9_999], &want[n - 1]] {
        assert!(store.is_subscribed(SET, user).unwrap(), "{user}");
        assert_eq!(store.user_sets(user, 10).unwrap(), vec![SET], "{user}");
    }
    assert!(!store.is_subscribed(SET, &stranger).unwrap());

    // Every third member leaves (listing some twice and a stranger).
    let mut leaving: Vec<UserId> = want.iter().step_by(3).cloned().collect();
    let left = leaving.len() as u64;
    leaving.extend(want.iter().step_by(3).take(10).cloned());
    leaving.push(stranger.clone());
    assert_eq!(store.unsubscribe(SET, &leaving).unwrap(), left);
    let staying: Vec<UserId> = want
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, u)| u.clone())
        .collect();
    assert_eq!(store.subscriber_count(SET).unwrap(), staying.len() as u64);
    assert_eq!(page_all(&store, 4_000), staying);
    assert!(!store.is_subscribed(SET, &want[0]).unwrap());
    assert!(store.user_sets(&want[0], 10).unwrap().is_empty());

    assert_eq!(store.drop_set(SET).unwrap(), staying.len() as u64);
    assert_eq!(store.subscriber_count(SET).unwrap(), 0);
    assert!(store.subscribers(SET, None, 10).unwrap().is_empty());
    let gone = members_per_master(cluster, namespace);
    assert!(gone.values().all(|(m, k)| *m == 0 && *k == 0), "{gone:?}");
    assert!(store.user_sets(&want[1], 10).unwrap().is_empty());
}

#[test]
fn a_reminder_fans_out_to_every_member_of_a_sharded_set_once_in_order() {
    use belfry_core::QueueName;
    use belfry_reminders::{ReminderDef, ReminderId, ReminderService};

    let options = RedisOptions {
        namespace: "fanout".into(),
        ..RedisOptions::default()
    };
    let store = Arc::new(RedisStore::connect(&cluster().target(), options).expect("connect"));
    let queue = QueueName::new("push").unwrap();
    store.put_queue(&queue, bytes::Bytes::from("{}")).unwrap();
    let service = ReminderService::new(store.clone());
    let id = ReminderId::new("kickoff").unwrap();
    let mut def = ReminderDef::at(queue.clone(), 1_000, bytes::Bytes::from("{}"));
    def.chunk_size = 2_000;
    service.create(Some(id.clone()), def, 0).unwrap();
    let all = users(9_001);
    for call in all.chunks(1_000) {
        service.subscribe(&id, call).unwrap();
    }

    let mut chunks = 0;
    for _ in 0..20 {
        let report = service.step(1_000).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        chunks += report.chunks_created;
        if report.fanouts_running == 0 && report.fanouts_finished > 0 {
            break;
        }
    }
    assert_eq!(chunks, 5, "9,001 users in chunks of 2,000");
    // Every chunk's task, in chunk order.
    let mut bodies = Vec::new();
    loop {
        let batch = store.claim(&queue, 1_000, 100, 60_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        for t in &batch.leased {
            let body: serde_json::Value = serde_json::from_slice(&t.task.payload).unwrap();
            bodies.push(body);
        }
    }
    bodies.sort_by_key(|b| b["chunk"].as_u64());
    assert_eq!(bodies.len(), 5);
    let fanned: Vec<UserId> = bodies
        .iter()
        .flat_map(|b| b["users"].as_array().unwrap().clone())
        .map(|u| UserId::new(u.as_str().unwrap()).unwrap())
        .collect();
    let mut want = all;
    want.sort();
    assert!(
        fanned == want,
        "the fan-out's users differ from the sorted members"
    );
}

#[test]
fn a_namespace_keeps_its_subscriber_shard_count() {
    let server = RedisServer::start();
    let options = |shards: Option<u16>| RedisOptions {
        namespace: "layout".into(),
        partitions: 8,
        subscriber_shards: shards,
        ..RedisOptions::default()
    };
    let first = RedisStore::connect(&server.target(), options(Some(4))).expect("connect");
    let all = users(500);
    first.subscribe(SET, &all).unwrap();
    drop(first);

    let err = RedisStore::connect(&server.target(), options(Some(8))).unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(m) if m.contains("4 subscriber-set shards, not 8")),
        "{err}"
    );
    // Given none, a store takes the namespace's count and finds every member.
    let second = RedisStore::connect(&server.target(), options(None)).expect("reconnect");
    assert_eq!(second.subscriber_count(SET).unwrap(), 500);
    let mut want = all.clone();
    want.sort();
    assert_eq!(second.subscribers(SET, None, 1_000).unwrap(), want);
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{layout/s{SET}/*"))
        .query(&mut con)
        .unwrap();
    assert_eq!(keys.len(), 4, "{keys:?}");

    for bad in [0, 65] {
        let err = RedisStore::connect(&server.target(), options(Some(bad))).unwrap_err();
        assert!(err.to_string().contains("subscriber_shards"), "{err}");
    }
}

/// Counting many sharded sets at once (a reminder runner's full look) answers what counting
/// each alone does, in order, across pipelines of many sets.
#[test]
fn many_sets_are_counted_at_once_as_one_by_one() {
    let options = RedisOptions {
        namespace: "counts".into(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&cluster().target(), options).expect("connect");
    let people = users(12);
    let sets: Vec<u64> = (1_000..1_600).collect();
    for (i, set) in sets.iter().enumerate() {
        store.subscribe(*set, &people[..i % 13]).unwrap();
    }
    let mut asked = sets.clone();
    asked.reverse();
    asked.push(5); // never subscribed to
    let one_by_one: Vec<u64> = asked
        .iter()
        .map(|set| store.subscriber_count(*set).unwrap())
        .collect();
    assert_eq!(store.subscriber_counts(&asked).unwrap(), one_by_one);
    assert_eq!(
        one_by_one.iter().sum::<u64>(),
        (0..600).map(|i| i % 13).sum::<u64>()
    );
}

/// A Redis that lost its data (restarted without persistence, flushed) lost the layout's
/// record too: a running node records it again at its next sweep, so a node started then with
/// another partition count is still refused, rather than taken in beside it (each would look
/// for idempotency keys in other partitions, and de-duplicate nothing between them).
#[test]
fn a_running_node_records_the_layout_again_after_redis_lost_it() {
    let server = RedisServer::start();
    let options = |partitions: u16| RedisOptions {
        namespace: "relayout".into(),
        partitions,
        ..RedisOptions::default()
    };
    let running = RedisStore::connect(&server.target(), options(8)).expect("connect");
    redis::cmd("FLUSHALL")
        .exec(&mut server.connection())
        .unwrap();
    running.sweep().unwrap();
    let err = RedisStore::connect(&server.target(), options(16)).unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(m) if m.contains("8 partitions, not 16")),
        "{err}"
    );
    assert!(RedisStore::connect(&server.target(), options(8)).is_ok());
}
