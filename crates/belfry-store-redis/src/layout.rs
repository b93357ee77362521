//! The namespace's layout (its partition count and subscriber-set shard count), recorded in
//! Redis by the first node and checked by every node that starts: nodes that placed keys by
//! different counts would each look for a task's idempotency key in another partition, and
//! de-duplicate nothing between them.
//!
//! Running nodes record it again at every fallback sweep. A Redis that lost its data (a
//! restart without persistence, a flush) loses the record too, and a node started then with
//! other counts would otherwise be taken in beside the running ones.

use std::sync::atomic::{AtomicBool, Ordering};

use belfry_store::StoreError;

use crate::conn::Result;
use crate::store::{RedisOptions, RedisStore, SUBSCRIBER_SHARDS_CLUSTER, SUBSCRIBER_SHARDS_MAX};
use crate::target::RedisTarget;

/// Set once a running node found the recorded layout unlike its own (said once).
static MISMATCH_SAID: AtomicBool = AtomicBool::new(false);

impl RedisStore {
    /// Records the namespace's layout at first use and checks it since: the partition count
    /// must match; the subscriber-set shard count must match when given. Returns the shard
    /// count.
    pub(crate) fn check_layout(&self, options: &RedisOptions) -> Result<u16> {
        let settings = self.keys.settings();
        let shards_default = match self.target {
            RedisTarget::Cluster(_) => SUBSCRIBER_SHARDS_CLUSTER,
            RedisTarget::Single(_) => 1,
        };
        let shards_wanted = options.subscriber_shards.unwrap_or(shards_default);
        let (partitions, shards) = self.record_layout(options.partitions, shards_wanted)?;
        let namespace = &options.namespace;
        let target = &self.target;
        if partitions != Some(options.partitions) {
            return Err(StoreError::Invalid(format!(
                "namespace {namespace:?} in {target} was made with {} partitions, not {}: start \
                 with the same partition count (or another namespace)",
                partitions.map_or("an unknown number of".to_owned(), |p| p.to_string()),
                options.partitions
            )));
        }
        let stored = shards
            .as_deref()
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|n| (1..=SUBSCRIBER_SHARDS_MAX).contains(n))
            .ok_or_else(|| StoreError::Corrupt {
                location: format!("redis settings {settings}"),
                detail: format!("subscriber_shards is {shards:?}, not a number from 1 to {SUBSCRIBER_SHARDS_MAX}"),
            })?;
        match options.subscriber_shards {
            Some(wanted) if wanted != stored => Err(StoreError::Invalid(format!(
                "namespace {namespace:?} in {target} was made with {stored} subscriber-set \
                 shards, not {wanted}: start with the same number (or another namespace)"
            ))),
            _ => Ok(stored),
        }
    }

    /// Records `partitions` and `shards` as the namespace's layout where it has none (`HSETNX`),
    /// and reads the layout it has: (partitions, subscriber shards as stored).
    fn record_layout(&self, partitions: u16, shards: u16) -> Result<(Option<u16>, Option<String>)> {
        let settings = self.keys.settings();
        self.pool.with("record the store's layout", |c| {
            for (field, value) in [("partitions", partitions), ("subscriber_shards", shards)] {
                redis::cmd("HSETNX")
                    .arg(&settings)
                    .arg(field)
                    .arg(value)
                    .query::<i64>(c.as_dyn())?;
            }
            redis::cmd("HMGET")
                .arg(&settings)
                .arg("partitions")
                .arg("subscriber_shards")
                .query(c.as_dyn())
        })
    }

    /// Records this node's layout again if the record is gone, and says (once, as an error)
    /// if another node recorded a different one meanwhile. Failures to reach Redis are the
    /// sweep's to report.
    pub(crate) fn reassert_layout(&self) {
        let ours = (self.keys.partitions, self.keys.subscriber_shards);
        let Ok((partitions, shards)) = self.record_layout(ours.0, ours.1) else {
            return;
        };
        let shards = shards.and_then(|s| s.parse::<u16>().ok());
        if (partitions, shards) != (Some(ours.0), Some(ours.1))
            && !MISMATCH_SAID.swap(true, Ordering::Relaxed)
        {
            let shown =
                |n: Option<u16>| n.map_or("an unreadable number of".into(), |n| n.to_string());
            tracing::error!(
                "the store's layout in {} is {} partitions and {} subscriber-set shards, and \
                 this node runs with {} and {}: a node started with other counts after Redis \
                 lost its data; stop it, or every node, and start them all with the same counts \
                 (idempotency keys do not de-duplicate across nodes that place keys differently)",
                self.target,
                shown(partitions),
                shown(shards),
                ours.0,
                ours.1
            );
        }
    }
}
