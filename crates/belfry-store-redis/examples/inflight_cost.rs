//! What the shared in-flight cap costs on the drain path: claims and `ack_many` of one queue
//! without a cap, and of one with a cap (reserve, claim, settle, ack), on the same throwaway
//! `redis-server`, in alternating rounds of the same run.
//!
//! Reports tasks/s (wall clock, which a busy machine makes noisy) and the Redis server's CPU
//! time per task (`INFO cpu`, user + system).
//!
//! `cargo run --release -p belfry-store-redis --example inflight_cost [batch] [tasks] [rounds]`

use std::time::{Duration, Instant};

use belfry_core::{LeaseId, NewTask, QueueName, UnixMs};
use belfry_store::Store;
use belfry_store_redis::testing::RedisServer;
use belfry_store_redis::{RedisOptions, RedisStore};

const NOW: UnixMs = 1_000_000;
const VISIBILITY_MS: u64 = 30_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let batch: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let server = RedisServer::start();
    let options = RedisOptions {
        namespace: "cost".into(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.target(), options).expect("connect");
    let mut took = [Duration::ZERO; 2];
    let mut redis_us = [0u64; 2];
    let mut stats = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("a connection for INFO");
    for round in 0..rounds {
        // Alternate which goes first, so neither always meets a warmer server.
        for k in 0..2 {
            let capped = (round + k) % 2 == 1;
            let queue = QueueName::new(format!("q{round}{k}")).unwrap();
            store
                .put_queue(&queue, bytes::Bytes::from_static(b"{}"))
                .unwrap();
            for chunk in (0..tasks).collect::<Vec<_>>().chunks(1_000) {
                let new = chunk
                    .iter()
                    .map(|i| NewTask::new(queue.clone(), NOW - 1, format!("{{\"i\":{i}}}")))
                    .collect();
                store.put(new).unwrap();
            }
            let used = redis_usec(&mut stats);
            let started = Instant::now();
            let drained = drain(&store, &queue, batch, capped);
            took[usize::from(capped)] += started.elapsed();
            redis_us[usize::from(capped)] += redis_usec(&mut stats) - used;
            assert_eq!(drained, tasks, "drained {drained} of {tasks}");
            store.delete_queue(&queue).unwrap();
        }
    }
    let all = (tasks * rounds) as f64;
    let rate = |d: Duration| all / d.as_secs_f64();
    let (free, capped) = (rate(took[0]), rate(took[1]));
    let per_task = |us: u64| us as f64 / all;
    let (free_us, capped_us) = (per_task(redis_us[0]), per_task(redis_us[1]));
    println!(
        "drain, claim+ack_many of {batch}, {tasks} tasks x {rounds} rounds each: \
         no cap {free:.0} tasks/s, shared cap {capped:.0} tasks/s, ratio {:.2}; \
         redis cpu per task {free_us:.2} us vs {capped_us:.2} us, ratio {:.2}",
        capped / free,
        free_us / capped_us
    );
}

/// Claims and acks until the queue is empty; returns how many tasks it delivered.
fn drain(store: &RedisStore, queue: &QueueName, batch: usize, capped: bool) -> usize {
    let mut drained = 0;
    loop {
        let room = if capped {
            let room = store
                .reserve_in_flight(queue, batch as u64, 1_000_000, NOW, NOW + VISIBILITY_MS)
                .unwrap()
                .expect("a shared count");
            assert_eq!(room.granted, batch as u64);
            Some(room)
        } else {
            None
        };
        let claimed = store.claim(queue, NOW, batch, VISIBILITY_MS).unwrap();
        if let Some(room) = &room {
            let leases: Vec<(LeaseId, UnixMs)> = claimed
                .leased
                .iter()
                .map(|t| (t.lease_id, t.lease_until_ms))
                .collect();
            store.settle_in_flight(queue, room, &leases, NOW).unwrap();
        }
        if claimed.leased.is_empty() {
            return drained;
        }
        let acks: Vec<_> = claimed
            .leased
            .iter()
            .map(|t| (t.task.id, t.lease_id))
            .collect();
        store.ack_many(queue, &acks, NOW).unwrap();
        drained += acks.len();
    }
}

/// The Redis server's CPU time so far (user + system), in microseconds (`INFO cpu`).
fn redis_usec(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    let seconds: f64 = info
        .lines()
        .filter(|line| line.starts_with("used_cpu_sys:") || line.starts_with("used_cpu_user:"))
        .filter_map(|line| line.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    (seconds * 1e6) as u64
}
