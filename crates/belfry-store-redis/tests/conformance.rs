//! The conformance scenarios (`belfry_store::conformance`) on Redis: one `redis-server` and a
//! 3-master Redis Cluster, each started once for this test binary. Every scenario gets its own
//! namespace, so they run in parallel on one server. A restart is a new `RedisStore` on the
//! same namespace (after a flush, or, for a crash, without one).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use belfry_store::conformance::Harness;
use belfry_store::Store;
use belfry_store_redis::testing::{RedisCluster, RedisServer};
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

/// A store on a namespace no other scenario of this binary uses.
struct Redis {
    target: RedisTarget,
    options: RedisOptions,
    store: Option<RedisStore>,
}

impl Redis {
    fn new(target: RedisTarget, partitions: u16, subscriber_shards: Option<u16>) -> Redis {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let options = RedisOptions {
            namespace: format!("conf{}", NEXT.fetch_add(1, Ordering::Relaxed)),
            partitions,
            subscriber_shards,
            // Puts place by the scenarios' clock (instants near 0), so every task due past
            // `far_after_ms` goes through a far-future bucket.
            placement_now_ms: Some(0),
            ..RedisOptions::default()
        };
        let store = Some(connect(&target, &options));
        Redis {
            target,
            options,
            store,
        }
    }
}

fn connect(target: &RedisTarget, options: &RedisOptions) -> RedisStore {
    RedisStore::connect(target, options.clone())
        .unwrap_or_else(|e| panic!("connect to {target}: {e}"))
}

impl Harness for Redis {
    fn store(&self) -> &dyn Store {
        self.store.as_ref().unwrap()
    }

    fn reopen(&mut self, clean: bool) {
        let store = self.store.take().unwrap();
        if clean {
            store.flush().unwrap();
        }
        drop(store);
        self.store = Some(connect(&self.target, &self.options));
    }

    fn crash(&mut self) {
        drop(self.store.take());
        self.store = Some(connect(&self.target, &self.options));
    }
}

/// One Redis's defaults: 256 partitions, unsharded subscriber sets.
fn on_single(scenario: fn(&mut dyn Harness)) {
    scenario(&mut Redis::new(server().target(), 256, None));
}

/// Few partitions, and subscriber sets cut in 16 shards as on a cluster.
fn on_single_16_partitions_16_set_shards(scenario: fn(&mut dyn Harness)) {
    scenario(&mut Redis::new(server().target(), 16, Some(16)));
}

/// A cluster's defaults: 256 partitions, 16 shards per subscriber set.
fn on_cluster(scenario: fn(&mut dyn Harness)) {
    scenario(&mut Redis::new(cluster().target(), 256, None));
}

mod single {
    belfry_store::conformance_tests!(super::on_single);
}

mod single_16_partitions_16_set_shards {
    belfry_store::conformance_tests!(super::on_single_16_partitions_16_set_shards);
}

mod cluster {
    belfry_store::conformance_tests!(super::on_cluster);
}
