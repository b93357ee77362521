//! What one big subscriber set costs on a throwaway 3-master Redis Cluster: subscribing
//! `users` ids (in calls of 10,000, as the bulk API applies them), then paging every member
//! as a reminder's fan-out does (pages of 5,001 members, advancing by 5,000), then counting
//! and dropping the set. Prints the wall time of each step and how the set's members sit on
//! the masters (keys and `used_memory` per master). Each round runs once per subscriber-set
//! shard count asked for (default `1,16`: one sorted set per set, as before sharding, and the
//! cluster default), alternating, each in its own namespace.
//!
//! `cargo run --release -p belfry-store-redis --example subs_cost [users] [rounds] [shards,…]`

use std::time::{Duration, Instant};

use belfry_core::UserId;
use belfry_store::Store;
use belfry_store_redis::testing::RedisCluster;
use belfry_store_redis::{RedisOptions, RedisStore};

const CALL: usize = 10_000;
const CHUNK: usize = 5_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let users: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let shard_counts: Vec<u16> = args
        .next()
        .unwrap_or_else(|| "1,16".into())
        .split(',')
        .map(|k| k.parse().expect("shard counts: numbers, comma-separated"))
        .collect();
    let cluster = RedisCluster::start(3, 0);
    let stores: Vec<RedisStore> = shard_counts
        .iter()
        .map(|&k| {
            let options = RedisOptions {
                namespace: format!("subs{k}"),
                subscriber_shards: Some(k),
                ..RedisOptions::default()
            };
            RedisStore::connect(&cluster.target(), options).expect("connect")
        })
        .collect();
    // Numeric and textual ids, as real subscriber lists mix them.
    let ids: Vec<UserId> = (0..users)
        .map(|i| {
            if i % 2 == 0 {
                UserId::new((i as u64 * 7_919).to_string()).unwrap()
            } else {
                UserId::new(format!("user-{i:08}")).unwrap()
            }
        })
        .collect();
    for round in 0..rounds {
        for (k, store) in shard_counts.iter().zip(&stores) {
            one_round(&cluster, store, &ids, round, *k);
        }
    }
}

fn one_round(cluster: &RedisCluster, store: &RedisStore, ids: &[UserId], round: usize, k: u16) {
    let users = ids.len();
    {
        let set = 1_000 + round as u64;
        let started = Instant::now();
        let mut added = 0;
        for call in ids.chunks(CALL) {
            added += store.subscribe(set, call).expect("subscribe");
        }
        let subscribe = started.elapsed();
        assert_eq!(added, users as u64);
        let spread = per_master(cluster);
        let started = Instant::now();
        let paged = page_all(store, set);
        let page = started.elapsed();
        assert_eq!(paged, users, "paged {paged} of {users}");
        let started = Instant::now();
        let count = store.subscriber_count(set).expect("count");
        let counted = started.elapsed();
        assert_eq!(count, users as u64);
        let started = Instant::now();
        assert_eq!(store.drop_set(set).expect("drop"), users as u64);
        let dropped = started.elapsed();
        println!(
            "round {round}, {k} shards: subscribe {users} in calls of {CALL}: {:.2} s ({:.0}/s); \
             page all in chunks of {CHUNK}: {:.2} s ({:.0}/s); count {:.2} ms; drop {:.1} ms",
            secs(subscribe),
            users as f64 / secs(subscribe),
            secs(page),
            users as f64 / secs(page),
            secs(counted) * 1e3,
            secs(dropped) * 1e3,
        );
        println!("  per master (keys, used_memory MB): {spread:?}");
    }
}

/// Pages every member of `set` the way fan-out does, checking the order: how many.
fn page_all(store: &RedisStore, set: u64) -> usize {
    let mut after: Option<UserId> = None;
    let mut seen = 0;
    loop {
        let mut page = store
            .subscribers(set, after.as_ref(), CHUNK + 1)
            .expect("page");
        let more = page.len() > CHUNK;
        page.truncate(CHUNK);
        if let (Some(prev), Some(first)) = (&after, page.first()) {
            assert!(prev < first, "pages out of order");
        }
        assert!(page.windows(2).all(|w| w[0] < w[1]), "a page out of order");
        seen += page.len();
        after = page.last().cloned();
        if !more {
            return seen;
        }
    }
}

fn per_master(cluster: &RedisCluster) -> Vec<(u64, f64)> {
    cluster
        .nodes()
        .iter()
        .filter(|n| n.is_master)
        .map(|n| {
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", n.port))
                .and_then(|c| c.get_connection())
                .expect("a connection for INFO");
            let keys: u64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query(&mut con)
                .expect("INFO");
            let used = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            (keys, (used / 1e6 * 10.0).round() / 10.0)
        })
        .collect()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
