//! A master that lost the scripts (restarted, flushed, or a promoted replica) in the middle of
//! a batch: the batch's other calls ran, and must be reported as they went. Before, the whole
//! pipeline failed on the first `NOSCRIPT` and every call ran again, so an ack that had
//! succeeded found its lease gone and was reported as a failure.

use std::collections::BTreeSet;

use belfry_core::{LeaseId, NewTask, QueueName, TaskId, TaskState};
use belfry_store::{LeaseOutcome, PutOutcome, Store};
use belfry_store_redis::testing::RedisCluster;
use belfry_store_redis::{RedisOptions, RedisStore};
use bytes::Bytes;

const NAMESPACE: &str = "noscript";
const TASKS: u64 = 48;
const NOW: u64 = 10_000;

fn connection(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The partitions whose task records `port` holds.
fn partitions_on(port: u16) -> BTreeSet<u16> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{NAMESPACE}/*}}:*:t"))
        .query(&mut connection(port))
        .unwrap();
    keys.iter()
        .filter_map(|k| {
            k.strip_prefix(&format!("{{{NAMESPACE}/"))?
                .split('}')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

fn partition_of(id: TaskId) -> u16 {
    ((id.0 >> 64) & 0xffff) as u16
}

/// A queue of [`TASKS`] due tasks spread over 16 partitions on a 3-master cluster.
fn cluster_with_tasks() -> (RedisCluster, RedisStore, QueueName) {
    let cluster = RedisCluster::start(3, 0);
    let options = RedisOptions {
        namespace: NAMESPACE.into(),
        partitions: 16,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&cluster.target(), options).unwrap();
    let queue = QueueName::new("q").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    // Keyed tasks: each key decides its partition, so the batch spreads over them.
    let tasks = (0..TASKS)
        .map(|i| {
            let mut task = NewTask::new(queue.clone(), 1_000 + i, "{}");
            task.idempotency_key = Some(format!("k{i}"));
            task
        })
        .collect();
    store.put(tasks).unwrap();
    (cluster, store, queue)
}

/// A master holding some of `partitions`, while another master holds others.
fn a_master_with_some_of(cluster: &RedisCluster, partitions: &BTreeSet<u16>) -> u16 {
    let holding: Vec<(u16, usize)> = cluster
        .nodes()
        .iter()
        .filter(|n| n.is_master)
        .map(|n| {
            (
                n.port,
                partitions_on(n.port).intersection(partitions).count(),
            )
        })
        .filter(|&(_, held)| held > 0)
        .collect();
    assert!(
        holding.len() >= 2,
        "the batch spans one master only ({holding:?}): nothing to test"
    );
    holding[1].0
}

#[test]
fn a_batch_ack_across_masters_reports_every_ack_when_one_master_lost_the_scripts() {
    let (cluster, store, queue) = cluster_with_tasks();
    let leased = store
        .claim(&queue, NOW, TASKS as usize, 60_000)
        .unwrap()
        .leased;
    assert_eq!(leased.len(), TASKS as usize);
    let partitions: BTreeSet<u16> = leased.iter().map(|l| partition_of(l.task.id)).collect();
    let flushed = a_master_with_some_of(&cluster, &partitions);
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut connection(flushed))
        .unwrap();

    let acks: Vec<(TaskId, LeaseId)> = leased.iter().map(|l| (l.task.id, l.lease_id)).collect();
    let outcomes = store.ack_many(&queue, &acks, NOW + 1).unwrap();
    let failed: Vec<_> = outcomes
        .iter()
        .zip(&acks)
        .filter(|(o, _)| **o != LeaseOutcome::Ok)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} acks misreported, as {:?}",
        failed.len(),
        acks.len(),
        failed.first()
    );
    for (id, _) in &acks {
        let task = store.get(&queue, *id, NOW + 1).unwrap();
        assert_eq!(task.map(|t| t.state), Some(TaskState::Done), "{id:?}");
    }
    let counts = store.counts(&queue, NOW + 1).unwrap();
    assert_eq!((counts.pending, counts.in_flight), (0, 0), "{counts:?}");
}

/// A claim across partitions whose count step (the read script) finds every master ready and
/// whose claim step meets a master without the claim script: the tasks claimed on the other
/// masters are returned, and the flushed master's run again, none left leased to nobody.
#[test]
fn a_claim_across_masters_returns_every_task_when_one_master_lost_the_claim_script() {
    let (cluster, store, queue) = cluster_with_tasks();
    let all: BTreeSet<u16> = (0..16).collect();
    let flushed = a_master_with_some_of(&cluster, &all);
    let mut con = connection(flushed);
    redis::cmd("SCRIPT").arg("FLUSH").exec(&mut con).unwrap();
    // The read script alone, as the store builds it, so the claim's first step passes there.
    let lua = concat!(
        include_str!("../src/lua/prelude.lua"),
        include_str!("../src/lua/read.lua")
    );
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query(&mut con)
        .unwrap();

    let leased = store
        .claim(&queue, NOW, TASKS as usize, 60_000)
        .unwrap()
        .leased;
    assert_eq!(leased.len(), TASKS as usize, "every due task in one claim");
    let counts = store.counts(&queue, NOW).unwrap();
    assert_eq!((counts.due, counts.in_flight), (0, TASKS), "{counts:?}");
}

/// A batch of keyed tasks spreads over the partitions, and its put scripts go in one
/// pipeline: when a master lost the put script, only its partitions' calls run again. Every
/// new task is stored once, every repeated key answers as a duplicate, and a claim finds
/// them all (the queue's hints were lowered for every partition put).
#[test]
fn a_keyed_batch_put_across_masters_stores_each_task_once_when_one_master_lost_the_scripts() {
    let (cluster, store, queue) = cluster_with_tasks();
    let all: BTreeSet<u16> = (0..16).collect();
    let flushed = a_master_with_some_of(&cluster, &all);
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut connection(flushed))
        .unwrap();

    // The keys of the first batch again, and as many new ones.
    let tasks: Vec<NewTask> = (0..2 * TASKS)
        .map(|i| {
            let mut task = NewTask::new(queue.clone(), 1_000 + i, "{}");
            task.idempotency_key = Some(format!("k{i}"));
            task
        })
        .collect();
    let outcomes = store.put(tasks).unwrap();
    for (i, outcome) in outcomes.iter().enumerate() {
        let repeated = (i as u64) < TASKS;
        assert_eq!(
            matches!(outcome, PutOutcome::Duplicate(_)),
            repeated,
            "task {i}: {outcome:?}"
        );
    }
    let counts = store.counts(&queue, NOW).unwrap();
    assert_eq!(counts.due, 2 * TASKS, "{counts:?}");
    let leased = store
        .claim(&queue, NOW, 4 * TASKS as usize, 60_000)
        .unwrap();
    assert_eq!(leased.leased.len() as u64, 2 * TASKS);
}
