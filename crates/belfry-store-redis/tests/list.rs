//! Listing live tasks on Redis (`Store::list_tasks`) where the read script's two ways of
//! reading a partition both come into play (`src/list.rs`): partitions holding more live tasks
//! than a scan takes at once, whose sequences have long runs given to finished tasks and to
//! leases (which a page probes through, then scans past), and bucket lists with stale
//! entries (cancelled and rescheduled far tasks) that a scan must skip or read once. The
//! conformance scenarios hold only a few tasks per partition, which are always scanned.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use belfry_core::{NewTask, Priority, QueueName, Task, TaskId, TaskState};
use belfry_store::{ChangeOutcome, LeaseOutcome, PutOutcome, Store};
use belfry_store_redis::testing::{RedisCluster, RedisServer};
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget};
use bytes::Bytes;

const DAY: u64 = 86_400_000;

fn store(target: &RedisTarget, namespace: &str, partitions: u16) -> RedisStore {
    let options = RedisOptions {
        namespace: namespace.into(),
        partitions,
        // Puts place by the tests' clock, so tasks due a day on wait in far-future buckets.
        placement_now_ms: Some(0),
        ..RedisOptions::default()
    };
    RedisStore::connect(target, options).unwrap()
}

/// A 3-master cluster, started once for the tests that run on one.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

fn put(store: &RedisStore, tasks: impl IntoIterator<Item = NewTask>) -> Vec<TaskId> {
    let outcomes = store.put(tasks.into_iter().collect()).unwrap();
    outcomes
        .iter()
        .map(|o| match o {
            PutOutcome::Created { id, .. } => *id,
            other => panic!("expected a new task, got {other:?}"),
        })
        .collect()
}

fn task(queue: &QueueName, due_at_ms: u64, n: usize) -> NewTask {
    NewTask::new(queue.clone(), due_at_ms, format!("{{\"n\":{n}}}"))
}

/// Every live task, `page` at a time: ids strictly increasing, no page longer than asked.
fn walk(store: &RedisStore, queue: &QueueName, page: usize, now: u64) -> BTreeMap<TaskId, Task> {
    let mut seen = BTreeMap::new();
    let mut after = None;
    loop {
        let tasks = store.list_tasks(queue, after, page, now).unwrap();
        assert!(tasks.len() <= page, "a page of {} for {page}", tasks.len());
        for t in &tasks {
            assert!(after.is_none_or(|a| t.id > a), "{} out of order", t.id);
            assert!(seen.insert(t.id, t.clone()).is_none(), "{} twice", t.id);
            after = Some(t.id);
        }
        if tasks.len() < page {
            return seen;
        }
    }
}

/// Claims every task due by `now` (`count` of them, in as many claims as it takes) and acks
/// all but every `keep`-th, which stay leased until `now + 1_000`. Answers the ids left leased.
fn claim_and_ack(
    store: &RedisStore,
    queue: &QueueName,
    now: u64,
    count: usize,
    keep: usize,
) -> Vec<TaskId> {
    let mut leased = Vec::new();
    while leased.len() < count {
        let batch = store
            .claim(queue, now, count - leased.len(), 1_000)
            .unwrap();
        assert!(
            !batch.leased.is_empty(),
            "{} of {count} claimed",
            leased.len()
        );
        leased.extend(batch.leased);
    }
    assert_eq!(leased.len(), count);
    let mut kept = Vec::new();
    for (i, l) in leased.iter().enumerate() {
        if i % keep == keep - 1 {
            kept.push(l.task.id);
            continue;
        }
        let ack = store.ack(queue, l.task.id, l.lease_id, now).unwrap();
        assert_eq!(ack, LeaseOutcome::Ok);
    }
    kept
}

/// One partition laid out so that a walk probes, turns to scanning, and probes again:
///
/// - sequences 1-1,700: tasks due at once, claimed (lease ids 2,001-3,700) and acked but for
///   every 34th, left leased: 50 live tasks among 1,700 sequences;
/// - 1,701-2,000: 300 tasks due in a minute (ready set);
/// - 3,701-4,100: 400 far tasks (buckets) and high-priority ones, some cancelled or
///   rescheduled (to another bucket, or near: a ready set), leaving stale bucket entries;
/// - then 1,500 more claimed and acked: a run of 3,000 sequences with nothing live at the end.
#[test]
fn a_big_partition_lists_every_live_task_once_in_order() {
    a_big_partition(&store(&RedisServer::start().target(), "list1", 1));
}

#[test]
fn a_big_partition_lists_every_live_task_once_in_order_on_a_cluster() {
    a_big_partition(&store(&cluster().target(), "list1", 1));
}

fn a_big_partition(s: &RedisStore) {
    let q = QueueName::new("q").unwrap();
    s.put_queue(&q, Bytes::new()).unwrap();
    let mut live: BTreeMap<TaskId, (u64, Priority)> = BTreeMap::new();

    let first = put(
        s,
        (0..2_000).map(|i| task(&q, if i < 1_700 { 10 } else { 60_000 }, i)),
    );
    let leased = claim_and_ack(s, &q, 20, 1_700, 34);
    assert_eq!(leased.len(), 50);
    for (i, id) in first.iter().enumerate() {
        if i >= 1_700 || leased.contains(id) {
            live.insert(*id, (if i < 1_700 { 10 } else { 60_000 }, Priority::Normal));
        }
    }

    let far = |i: usize| {
        let mut t = task(&q, DAY + i as u64 * 60_000, 2_000 + i);
        if i % 4 == 3 {
            t.due_at_ms = 90_000;
            t.priority = Priority::High;
        }
        t
    };
    let second = put(s, (0..400).map(far));
    for (i, id) in second.iter().enumerate() {
        let t = far(i);
        live.insert(*id, (t.due_at_ms, t.priority));
    }
    // Far ones (i % 4 != 3): cancel some, move some to another bucket and some near.
    for (i, id) in second.iter().enumerate().filter(|(i, _)| i % 4 != 3) {
        let (changed, due) = match i % 10 {
            0 => (s.cancel(&q, *id, 30).unwrap(), None),
            1 => (s.reschedule(&q, *id, 3 * DAY, 30).unwrap(), Some(3 * DAY)),
            2 => (s.reschedule(&q, *id, 100_000, 30).unwrap(), Some(100_000)),
            _ => continue,
        };
        assert_eq!(changed, ChangeOutcome::Ok);
        match due {
            None => live.remove(id),
            Some(due) => live.insert(*id, (due, Priority::Normal)),
        };
    }
    put(s, (0..1_500).map(|i| task(&q, 25, 3_000 + i)));
    assert!(claim_and_ack(s, &q, 30, 1_500, usize::MAX).is_empty());
    assert!(live.len() > 600, "{} live", live.len());

    for page in [1, 7, 100, 256, 1_000, 5_000] {
        let seen = walk(s, &q, page, 500);
        assert!(seen.keys().eq(live.keys()), "page {page}");
        for (id, t) in &seen {
            let (due, priority) = live[id];
            assert_eq!((t.due_at_ms, t.priority), (due, priority), "{id}");
            if leased.contains(id) {
                assert_eq!(t.state, TaskState::Leased);
                assert_eq!(t.lease_until_ms, Some(1_020));
            } else {
                assert_eq!(t.state, TaskState::Scheduled, "{id}");
            }
            assert!(t.payload.starts_with(b"{\"n\":"));
        }
    }
    // Past their deadline the leases read as ended: scheduled again.
    let seen = walk(s, &q, 64, 1_020);
    assert!(seen.keys().eq(live.keys()));
    assert!(seen.values().all(|t| t.state == TaskState::Scheduled));
    assert!(seen.values().all(|t| t.lease_until_ms.is_none()));
}

/// Several partitions of a thousand tasks or so, each probed: a walk goes through them in
/// partition order, and one that resumes after a task gone since still lists the rest.
#[test]
fn partitions_list_one_after_another() {
    partitions_in_turn(&store(&RedisServer::start().target(), "list3", 3));
}

#[test]
fn partitions_list_one_after_another_on_a_cluster() {
    // Partitions 0, 1 and 2 of namespace `list3` hash to slots of three different masters.
    partitions_in_turn(&store(&cluster().target(), "list3", 3));
}

fn partitions_in_turn(s: &RedisStore) {
    let q = QueueName::new("q").unwrap();
    s.put_queue(&q, Bytes::new()).unwrap();
    let mut live = Vec::new();
    let mut due_now = 0;
    for call in 0..9 {
        // Each put call lands in one partition, the next call in the next.
        let due = |i: usize| if i % 3 == 0 { 10 } else { DAY + i as u64 };
        let ids = put(s, (0..400).map(|i| task(&q, due(i), call * 400 + i)));
        due_now += ids
            .iter()
            .enumerate()
            .filter(|(i, _)| due(*i) == 10)
            .count();
        live.extend(
            ids.iter()
                .enumerate()
                .filter(|(i, _)| due(*i) > 10)
                .map(|(_, id)| *id),
        );
    }
    live.extend(claim_and_ack(s, &q, 20, due_now, 5));
    live.sort();
    let mut partitions: Vec<u128> = live.iter().map(|id| (id.0 >> 64) & 0xffff).collect();
    partitions.dedup();
    assert_eq!(partitions, [0, 1, 2]);

    for page in [3, 250, 999, 10_000] {
        let seen = walk(s, &q, page, 500);
        assert!(seen.keys().eq(live.iter()), "page {page}");
    }
    // Resume after a task cancelled since: the walk goes on after it.
    let stop = live[live.len() / 2];
    assert_eq!(s.cancel(&q, stop, 30).unwrap(), ChangeOutcome::Ok);
    let rest: Vec<TaskId> = s
        .list_tasks(&q, Some(stop), 10_000, 500)
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(rest, live[live.len() / 2 + 1..]);
}

/// A partition too big to scan in one call (more than 8,192 live tasks) whose sequences have
/// a run longer than its record count with nothing live (the counter moved on, as sequences
/// given to tasks since forgotten leave it): the page that reaches the run probes it, then
/// passes over the record hash in steps instead of scanning.
#[test]
fn a_partition_too_big_to_scan_is_passed_over() {
    let server = RedisServer::start();
    let s = store(&server.target(), "list-big", 1);
    passed_over(&s, vec![server.connection()]);
}

#[test]
fn a_partition_too_big_to_scan_is_passed_over_on_a_cluster() {
    let s = store(&cluster().target(), "list-big", 1);
    let masters = cluster().nodes().into_iter().filter(|n| n.is_master);
    let conns = masters
        .map(|n| {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}", n.port)).unwrap();
            client.get_connection().unwrap()
        })
        .collect();
    passed_over(&s, conns);
}

/// `conns`: connections to every master, to move the partition's counter on where it is.
fn passed_over(s: &RedisStore, conns: Vec<redis::Connection>) {
    let q = QueueName::new("q").unwrap();
    s.put_queue(&q, Bytes::new()).unwrap();
    let due = |i: usize| if i % 4 == 0 { 60_000 } else { DAY + i as u64 };
    let mut live = Vec::new();
    for call in 0..10 {
        live.extend(put(
            s,
            (0..1_000).map(|i| task(&q, due(i), call * 1_000 + i)),
        ));
    }
    let mut moved = 0;
    for mut conn in conns {
        let counters: Vec<String> = redis::cmd("KEYS")
            .arg("{list-big/0}:*:s")
            .query(&mut conn)
            .unwrap();
        for counter in counters {
            let _: u64 = redis::cmd("INCRBY")
                .arg(counter)
                .arg(100_000)
                .query(&mut conn)
                .unwrap();
            moved += 1;
        }
    }
    assert_eq!(moved, 1, "one counter moved on");
    live.extend(put(s, (0..500).map(|i| task(&q, due(i), 40_000 + i))));
    // Some die: cancelled among the first tasks, and at the start of those after the run.
    let cancelled: Vec<TaskId> = live
        .iter()
        .step_by(97)
        .chain(&live[10_000..10_010])
        .copied()
        .collect();
    for id in &cancelled {
        assert_eq!(s.cancel(&q, *id, 30).unwrap(), ChangeOutcome::Ok);
    }
    live.retain(|id| !cancelled.contains(id));

    for page in [700, 20_000] {
        let seen = walk(s, &q, page, 500);
        assert!(seen.keys().eq(live.iter()), "page {page}");
    }
}
