//! `RedisStore`: the `Store` contract over the scripts in `lua/`.

use std::sync::atomic::{AtomicU32, Ordering};

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MetaChange, MetaEvent, PutOutcome, QueueCounts, Store,
    StoreError,
};
use bytes::Bytes;
use redis::Value;

use crate::claim::Want;
use crate::conn::{check_cluster_slots, wait_replicas};
use crate::conn::{map_error, pipeline, run_script, unexpected, Conn, Pool, Result, Timeouts};
use crate::keys::{seq_of, Keys};
use crate::ownership::{Ownership, OwnershipOptions};
use crate::reply::{as_array, as_i64, corrupt};
use crate::scripts::{self, Lua};
use crate::target::RedisTarget;
use std::sync::Arc;

/// How a [`RedisStore`] connects and lays out its keys.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key (inside the hash tags), so several belfry deployments (or tests)
    /// can share one Redis. Letters, digits, `_` and `-`.
    pub namespace: String,
    /// Partitions per queue: the unit of placement and of shard ownership. Fixed when the
    /// namespace is first used; a store opened with another number is refused.
    pub partitions: u16,
    /// Shards per reminder subscriber set, 1 to [`SUBSCRIBER_SHARDS_MAX`]: each shard is a
    /// sorted set in its own slot, so a big set spreads over the cluster's masters. `None`
    /// takes [`SUBSCRIBER_SHARDS_CLUSTER`] on a cluster and 1 on one Redis. Fixed when the
    /// namespace is first used: a store given another number is refused; one given none
    /// takes the namespace's.
    pub subscriber_shards: Option<u16>,
    pub timeouts: Timeouts,
    /// How long a finished task (done, cancelled, skipped) stays readable, and its
    /// idempotency key taken, after it finishes. Its payload is dropped at once. Each
    /// finished task costs about 200 bytes of Redis memory for this long.
    pub finished_retention_ms: u64,
    /// Connections kept open between calls.
    pub pool_idle_max: usize,
    /// How often a node looks at every queue again even without events (the sweep that
    /// catches a wake-up lost with a pub/sub message).
    pub resync_every: std::time::Duration,
    /// This node's id among the nodes sharing the store. With one, the store takes part in
    /// shard ownership: `claim_owned` and `owns` answer for the partitions it holds. Without,
    /// it behaves as the only node.
    pub node_id: Option<String>,
    pub ownership: OwnershipOptions,
    /// Replicas that must hold a durable change (a put, cancel, reschedule, redrive, queue or
    /// metadata change) before it is acknowledged (Redis `WAIT`); 0 acknowledges once the
    /// master applied it. With 1 and `appendfsync always`, a master's failover loses nothing
    /// acknowledged. A change not replicated in `replica_ack_timeout` fails as unavailable.
    pub replica_acks: u32,
    pub replica_ack_timeout: std::time::Duration,
    /// A task put or rescheduled due this far ahead or more waits in a far-future bucket (a
    /// few bytes per task) rather than in a ready sorted set (~100 bytes); the partition's
    /// claims move each bucket into the ready sets shortly before it starts
    /// (`lua/prelude.lua`). 0 keeps every task in the ready sets; otherwise at least
    /// [`FAR_AFTER_MS_MIN`].
    pub far_after_ms: u64,
    /// Tests only: a put's now, instead of this node's clock: where `far_after_ms` is measured
    /// from and what the finished-task retention is counted to (the conformance scenarios
    /// run at instants near 0).
    pub placement_now_ms: Option<UnixMs>,
}

/// Subscriber-set shards on a cluster unless configured: enough to spread a set evenly over
/// up to 16 masters (each shard owns a 1/16 run of the slots, `keys.rs`), few enough that a
/// page or a count of a small set stays one pipeline of 16 short commands.
pub const SUBSCRIBER_SHARDS_CLUSTER: u16 = 16;
/// The most subscriber-set shards: every page of a set reads from each shard.
pub const SUBSCRIBER_SHARDS_MAX: u16 = 64;

/// Metadata keys one `HMGET` of [`Store::get_meta_many`] asks for at most: a tick's due
/// schedules are read in batches of this many, so no single reply grows without bound.
pub const META_READ_KEYS: usize = 1_000;

/// The smallest `far_after_ms` (other than 0): a minute-wide bucket's minute and its 10 s
/// promotion lead, so a bucket is never already due for promotion when a task lands in it.
pub const FAR_AFTER_MS_MIN: u64 = 70_000;

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            namespace: "belfry".into(),
            partitions: 256,
            subscriber_shards: None,
            timeouts: Timeouts::default(),
            finished_retention_ms: 60_000,
            pool_idle_max: 64,
            resync_every: std::time::Duration::from_secs(5),
            node_id: None,
            ownership: OwnershipOptions::default(),
            replica_acks: 0,
            replica_ack_timeout: std::time::Duration::from_secs(1),
            far_after_ms: 120_000,
            placement_now_ms: None,
        }
    }
}

pub struct RedisStore {
    pub(crate) pool: Pool,
    pub(crate) keys: Keys,
    pub(crate) target: RedisTarget,
    pub(crate) retention_ms: u64,
    /// `RedisOptions::far_after_ms` and `placement_now_ms`.
    pub(crate) far_after_ms: u64,
    pub(crate) placement_now_ms: Option<UnixMs>,
    /// Rotates the partition of tasks without an idempotency key, and the partition a claim
    /// starts at.
    rotate: AtomicU32,
    timeouts: Timeouts,
    /// `/readyz`'s check: a `PING` to every master within the command timeout.
    health: crate::health::Health,
    resync_every: std::time::Duration,
    listener: parking_lot::Mutex<Option<crate::events::Listener>>,
    pub(crate) ownership: Option<Arc<Ownership>>,
    /// Replicas to wait for after a durable change, and for how long.
    replica_acks: Option<(u32, std::time::Duration)>,
    /// When the fallback sweep last ran.
    pub(crate) last_sweep: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Names this handle among those waiting for in-flight room (`inflight.rs`).
    pub(crate) waiter: u64,
}

impl Drop for RedisStore {
    /// Hands this node's shards to the others at once, rather than after their leases expire.
    fn drop(&mut self) {
        if let Some(own) = &self.ownership {
            own.stop();
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target.to_string())
            .field("partitions", &self.keys.partitions)
            .finish()
    }
}

/// A partition's part of one queue: where the task scripts run.
pub(crate) struct Part {
    pub(crate) p: u16,
    pub(crate) keys: Vec<Vec<u8>>,
}

impl RedisStore {
    /// Connects and checks what a server needs before it takes traffic: Redis answers, a
    /// cluster serves all 16384 slots, and the namespace's partition count matches.
    pub fn connect(target: &RedisTarget, options: RedisOptions) -> Result<RedisStore> {
        if options.namespace.is_empty()
            || !options
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(StoreError::Invalid(format!(
                "redis namespace {:?}: use letters, digits, '_' and '-'",
                options.namespace
            )));
        }
        if options.partitions == 0 {
            return Err(StoreError::Invalid("partitions must be at least 1".into()));
        }
        if options
            .subscriber_shards
            .is_some_and(|k| !(1..=SUBSCRIBER_SHARDS_MAX).contains(&k))
        {
            return Err(StoreError::Invalid(format!(
                "subscriber_shards must be from 1 to {SUBSCRIBER_SHARDS_MAX}"
            )));
        }
        if options.far_after_ms != 0 && options.far_after_ms < FAR_AFTER_MS_MIN {
            return Err(StoreError::Invalid(format!(
                "far_after_ms {}: use 0 (no far-future buckets) or at least {FAR_AFTER_MS_MIN}",
                options.far_after_ms
            )));
        }
        let masters = match target {
            RedisTarget::Cluster(nodes) => check_cluster_slots(nodes, options.timeouts)?,
            RedisTarget::Single(_) => Vec::new(),
        };
        let pool = Pool::open(target, options.timeouts, options.pool_idle_max)?;
        let keys = Keys::new(&options.namespace, options.partitions);
        let mut store = RedisStore {
            pool,
            keys,
            target: target.clone(),
            retention_ms: options.finished_retention_ms,
            far_after_ms: options.far_after_ms,
            placement_now_ms: options.placement_now_ms,
            rotate: AtomicU32::new(rand_seed()),
            timeouts: options.timeouts,
            health: crate::health::Health::new(target, &masters, options.timeouts.command),
            resync_every: options.resync_every,
            listener: parking_lot::Mutex::new(None),
            ownership: None,
            replica_acks: (options.replica_acks > 0)
                .then_some((options.replica_acks, options.replica_ack_timeout)),
            last_sweep: parking_lot::Mutex::new(None),
            waiter: crate::inflight::next_token(),
        };
        let shards = store.check_layout(&options)?;
        store.keys.set_subscriber_shards(shards);
        // Pipelines run scripts by SHA only: every master gets them now.
        let loaded = store
            .pool
            .with("load the scripts", |c| Ok(store.load_scripts(c)));
        loaded??;
        if let Some(node_id) = &options.node_id {
            store.ownership = Some(Ownership::start(
                target,
                &options.namespace,
                options.partitions,
                node_id,
                options.ownership,
            )?);
        }
        Ok(store)
    }

    /// This node's shard ownership, when it has a node id.
    pub fn ownership(&self) -> Option<&Arc<Ownership>> {
        self.ownership.as_ref()
    }

    /// Waits until the configured replicas hold this connection's writes on the node of
    /// `key` (nothing when no replica acknowledgement is asked for).
    pub(crate) fn replicate(&self, c: &mut Conn, key: &[u8]) -> Result<()> {
        let acks = self
            .replica_wait(c, key)
            .map_err(|e| map_error(e, "wait for replicas"))?;
        self.check_replicas(acks)
    }

    /// Whether each write waits for replicas (`WAIT`) before it is acknowledged.
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replica_acks.is_some()
    }

    /// `WAIT` for the configured replicas, inside a pooled call: how many acknowledged.
    fn replica_wait(&self, c: &mut Conn, key: &[u8]) -> redis::RedisResult<Option<i64>> {
        match self.replica_acks {
            None => Ok(None),
            Some((want, timeout)) => wait_replicas(c, key, want, timeout).map(Some),
        }
    }

    fn check_replicas(&self, got: Option<i64>) -> Result<()> {
        let (Some(got), Some((want, timeout))) = (got, self.replica_acks) else {
            return Ok(());
        };
        if got < i64::from(want) {
            return Err(StoreError::Unavailable {
                detail: format!(
                    "the change reached {got} of {want} replicas within {timeout:?}, so a \
                     failover now could lose it; retrying it (with its idempotency key) is safe"
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn next_rotation(&self) -> usize {
        self.rotate.fetch_add(1, Ordering::Relaxed) as usize
    }

    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    pub fn partitions(&self) -> u16 {
        self.keys.partitions
    }

    pub(crate) fn part(&self, p: u16, uid: u64) -> Part {
        Part {
            p,
            keys: self.keys.task_keys(p, uid),
        }
    }

    /// Runs the queue registry's script (`lua/queue.lua`) with `args`, then waits for the
    /// replicas a durable change needs.
    fn registry_call(&self, what: &'static str, args: &[Vec<u8>]) -> Result<Value> {
        let keys: Vec<Vec<u8>> = self
            .keys
            .registry()
            .iter()
            .map(|k| k.clone().into_bytes())
            .collect();
        let (v, acks) = self.pool.with(what, |c| {
            let v = run_script(c.as_dyn(), &scripts::QUEUE, &keys, args)?;
            Ok((v, self.replica_wait(c, &keys[0])?))
        })?;
        self.check_replicas(acks)?;
        Ok(v)
    }

    /// Removes the keys of a queue incarnation the registry no longer names (a deleted queue,
    /// or the tasks of a purged one). Each partition's far-future bucket lists are named in its
    /// bucket index (key 10).
    fn remove_queue_keys(&self, uid: u64) -> Result<()> {
        let reads = (0..self.keys.partitions)
            .map(|p| {
                let mut cmd = redis::cmd("ZRANGE");
                cmd.arg(&self.part(p, uid).keys[9]).arg(0).arg(-1);
                cmd
            })
            .collect();
        let buckets = self
            .pool
            .with("read a queue's buckets", |c| pipeline(c, reads))?;
        let mut cmds = Vec::with_capacity(self.keys.partitions as usize + 2);
        for (p, listed) in (0..self.keys.partitions).zip(&buckets) {
            let listed: Vec<String> =
                redis::from_redis_value(listed).map_err(|_| unexpected("bucket index", listed))?;
            let mut cmd = redis::cmd("UNLINK");
            cmd.arg(self.keys.task_keys(p, uid));
            cmd.arg(self.keys.bucket_lists(p, uid, &listed));
            cmds.push(cmd);
        }
        let [room, starved, extra] = self.keys.in_flight(uid);
        let [hint, versions] = self.keys.hint_keys(uid);
        for key in [
            hint,
            versions,
            self.keys.rate(uid).into_bytes(),
            room.into_bytes(),
            starved.into_bytes(),
            extra.into_bytes(),
        ] {
            let mut cmd = redis::cmd("UNLINK");
            cmd.arg(key);
            cmds.push(cmd);
        }
        self.pool
            .with("delete a queue's tasks", |c| pipeline(c, cmds))?;
        Ok(())
    }

    pub(crate) fn uid(&self, c: &mut Conn, queue: &QueueName) -> Result<u64> {
        let [registry, _] = self.keys.registry();
        let raw: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&registry)
            .arg(queue.as_str())
            .query(c.as_dyn())
            .map_err(|e| map_error(e, "read the queue registry"))?;
        match raw {
            Some(raw) if raw.len() >= 8 => Ok(seq_of(&raw[..8]).unwrap_or_default()),
            Some(_) => Err(corrupt(
                "queue registry",
                format!("entry of {queue} too short"),
            )),
            None => Err(StoreError::QueueNotFound(queue.clone())),
        }
    }

    /// Runs `f` with a connection and the queue's uid.
    pub(crate) fn with_queue<T>(
        &self,
        queue: &QueueName,
        f: impl FnOnce(&Self, &mut Conn, u64) -> Result<T>,
    ) -> Result<T> {
        let mut out = None;
        let outcome = self.pool.with("call redis", |c| {
            out = Some(self.uid(c, queue).and_then(|uid| f(self, c, uid)));
            Ok(())
        });
        outcome?;
        out.unwrap_or(Err(StoreError::Closed))
    }

    pub(crate) fn script(
        &self,
        c: &mut Conn,
        lua: &Lua,
        keys: &[Vec<u8>],
        args: &[Vec<u8>],
        what: &'static str,
    ) -> Result<Value> {
        run_script(c.as_dyn(), lua, keys, args).map_err(|e| map_error(e, what))
    }

    pub(crate) fn rate_op(
        &self,
        queue: &QueueName,
        op: &str,
        count: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<u64> {
        if rate_per_s <= 0.0 {
            return Ok(count);
        }
        self.with_queue(queue, |this, c, uid| {
            let keys = [this.keys.rate(uid).into_bytes()];
            let args = [
                op.as_bytes().to_vec(),
                count.to_string().into_bytes(),
                rate_per_s.to_string().into_bytes(),
                burst.max(1.0).to_string().into_bytes(),
            ];
            let v = this.script(c, &scripts::RATE, &keys, &args, "take rate tokens")?;
            as_i64(&v)
                .map(|n| n.max(0) as u64)
                .ok_or_else(|| unexpected("rate", &v))
        })
    }

    /// Tells every node that these users' subscriptions changed, when any did: one message
    /// for the whole call, naming the users or, for a bulk change, saying "every user".
    fn subscriptions_changed(&self, changed: u64, users: &[UserId]) {
        if changed == 0 {
            return;
        }
        if let Some(message) = crate::events::users_message(users) {
            self.publish(message);
        }
    }

    /// Writes metadata in one script call (one slot) and announces each namespace written,
    /// with the keys it wrote and its write count after them. Answers how many changes took
    /// effect. Every call counts one write per namespace and announces it, a delete of a
    /// missing key too, so that a node that heard every announcement has heard every count.
    fn run_meta(&self, changes: Vec<MetaChange>) -> Result<u64> {
        if changes.is_empty() {
            return Ok(0);
        }
        // Per namespace: its index in KEYS and the keys written.
        let mut written: Vec<(String, Vec<String>)> = Vec::new();
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(changes.len() * 4);
        for change in changes {
            let index = match written.iter().position(|(ns, _)| *ns == change.namespace) {
                Some(i) => i,
                None => {
                    written.push((change.namespace.clone(), Vec::new()));
                    written.len() - 1
                }
            };
            args.push((index + 1).to_string().into_bytes());
            args.push(change.key.as_bytes().to_vec());
            written[index].1.push(change.key);
            match change.value {
                Some(value) => {
                    args.push(b"p".to_vec());
                    args.push(value.to_vec());
                }
                None => {
                    args.push(b"d".to_vec());
                    args.push(Vec::new());
                }
            }
        }
        let mut keys: Vec<Vec<u8>> = written
            .iter()
            .map(|(ns, _)| self.keys.meta(ns).into_bytes())
            .collect();
        keys.push(self.keys.meta_versions().into_bytes());
        let (reply, acks) = self.pool.with("write metadata", |c| {
            let reply = run_script(c.as_dyn(), &scripts::META, &keys, &args)?;
            Ok((reply, self.replica_wait(c, &keys[0])?))
        })?;
        self.check_replicas(acks)?;
        let counts: Option<Vec<i64>> =
            as_array(&reply).and_then(|items| items.iter().map(as_i64).collect());
        let counts = counts
            .filter(|c| c.len() == written.len() + 1)
            .ok_or_else(|| unexpected("write metadata", &reply))?;
        for ((namespace, keys), version) in written.into_iter().zip(&counts[1..]) {
            self.publish(crate::events::meta_message(&MetaEvent {
                namespace,
                keys: Some(keys),
                version: u64::try_from(*version).ok().filter(|v| *v > 0),
            }));
        }
        Ok(u64::try_from(counts[0]).unwrap_or(0))
    }

    /// Tells every node (this one too) about a change; a lost message is caught by the
    /// periodic resync, so a failure here fails nothing.
    fn publish(&self, message: Vec<u8>) {
        let channel = self.keys.events();
        let sent = self.pool.with("publish a store event", |c| {
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(message)
                .query::<i64>(c.as_dyn())
        });
        if let Err(error) = sent {
            tracing::debug!(%error, "store event not published; the next resync catches up");
        }
    }
}

fn rand_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

impl Store for RedisStore {
    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        self.put_tasks(tasks)
    }

    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        let want = Want {
            now_ms,
            max,
            visibility_ms,
        };
        self.claim_in(queue, want, false)
    }

    fn claim_owned(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        let want = Want {
            now_ms,
            max,
            visibility_ms,
        };
        self.claim_in(queue, want, true)
    }

    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        self.next_due_in(queue, false)
    }

    fn next_due_owned_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        self.next_due_in(queue, true)
    }

    fn health(&self) -> belfry_store::StoreHealth {
        match self.health.check() {
            Ok(()) => belfry_store::StoreHealth::Healthy,
            Err(why) => belfry_store::StoreHealth::Unavailable(why),
        }
    }

    fn sweep(&self) -> Result<()> {
        self.reassert_layout();
        self.sweep_hints()
    }

    fn ownership(&self, key: &str) -> Option<String> {
        match &self.ownership {
            None => Some(String::new()),
            Some(own) => own.lease(crate::partition_of(key.as_bytes(), self.keys.partitions)),
        }
    }

    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        self.list_dead_tasks(queue, after, limit)
    }

    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        self.list_live_tasks(queue, after, limit, now_ms)
    }

    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        self.count_tasks(queue, now_ms)
    }

    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        self.forecast_tasks(queue, from_ms, step_ms, steps)
    }

    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        // Task ids hold the uid in 32 bits: the counter starts below 2^31, leaving 2^31 queues.
        let first_uid = rand::random::<u32>() >> 1;
        let args = [
            b"put".to_vec(),
            queue.as_str().as_bytes().to_vec(),
            config.to_vec(),
            first_uid.to_string().into_bytes(),
        ];
        let v = self.registry_call("create a queue", &args)?;
        self.publish(crate::events::queue_message(queue));
        Ok(as_i64(&v) == Some(1))
    }

    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>> {
        let [registry, _] = self.keys.registry();
        let raw: Option<Vec<u8>> = self.pool.with("read a queue", |c| {
            redis::cmd("HGET")
                .arg(&registry)
                .arg(queue.as_str())
                .query(c.as_dyn())
        })?;
        Ok(raw.map(|raw| Bytes::copy_from_slice(raw.get(8..).unwrap_or_default())))
    }

    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>> {
        let [registry, _] = self.keys.registry();
        let all: Vec<(String, Vec<u8>)> = self.pool.with("list queues", |c| {
            redis::cmd("HGETALL").arg(&registry).query(c.as_dyn())
        })?;
        let mut out = Vec::with_capacity(all.len());
        for (name, raw) in all {
            let queue =
                QueueName::new(&name).map_err(|e| corrupt("queue registry", e.to_string()))?;
            out.push((
                queue,
                Bytes::copy_from_slice(raw.get(8..).unwrap_or_default()),
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn delete_queue(&self, queue: &QueueName) -> Result<bool> {
        let args = [b"delete".to_vec(), queue.as_str().as_bytes().to_vec()];
        let v = self.registry_call("delete a queue", &args)?;
        let uid = as_i64(&v).ok_or_else(|| unexpected("delete queue", &v))?;
        if uid == 0 {
            return Ok(false);
        }
        let uid = uid as u64;
        self.publish(crate::events::queue_message(queue));
        self.remove_queue_keys(uid)?;
        Ok(true)
    }

    fn purge_queue(&self, queue: &QueueName) -> Result<bool> {
        let args = [b"purge".to_vec(), queue.as_str().as_bytes().to_vec()];
        let v = self.registry_call("purge a queue", &args)?;
        let uid = as_i64(&v).ok_or_else(|| unexpected("purge queue", &v))?;
        if uid == 0 {
            return Ok(false);
        }
        self.publish(crate::events::queue_message(queue));
        self.remove_queue_keys(uid as u64)?;
        Ok(true)
    }

    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        self.get_task(queue, id, now_ms)
    }

    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        self.get_task_by_key(queue, key, now_ms)
    }

    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change(queue, id, "cancel", 0, now_ms)
    }

    fn cancel_many(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        self.cancel_tasks(queue, ids, now_ms)
    }

    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        self.change(queue, id, "reschedule", due_at_ms, now_ms)
    }

    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        Ok(self.lease_op(queue, &[(id, lease, Vec::new())], "ack", now_ms)?[0])
    }

    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        let items: Vec<(TaskId, LeaseId, Vec<u8>)> = acks
            .iter()
            .map(|&(id, lease)| (id, lease, Vec::new()))
            .collect();
        self.lease_op(queue, &items, "ack", now_ms)
    }

    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        Ok(self.lease_op(
            queue,
            &[(id, lease, retry_at_ms.to_string().into_bytes())],
            "nack",
            now_ms,
        )?[0])
    }

    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        Ok(self.lease_op(
            queue,
            &[(id, lease, lease_until_ms.to_string().into_bytes())],
            "extend",
            now_ms,
        )?[0])
    }

    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let item = [(id, lease, reason.as_bytes().to_vec())];
        Ok(self.lease_op(queue, &item, "dead", now_ms)?[0])
    }

    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        let item = [(id, lease, reason.as_bytes().to_vec())];
        Ok(self.lease_op(queue, &item, "dead_untried", now_ms)?[0])
    }

    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change(queue, id, "redrive", 0, now_ms)
    }

    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change(queue, id, "discard", 0, now_ms)
    }

    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()> {
        self.write_meta(vec![MetaChange::put(namespace, key, value)])
    }

    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        let hash = self.keys.meta(namespace);
        let v: Option<Vec<u8>> = self.pool.with("read metadata", |c| {
            redis::cmd("HGET").arg(&hash).arg(key).query(c.as_dyn())
        })?;
        Ok(v.map(Bytes::from))
    }

    /// `HMGET`s of up to `META_READ_KEYS` keys: one round trip per batch.
    fn get_meta_many(&self, namespace: &str, keys: &[&str]) -> Result<Vec<Option<Bytes>>> {
        let hash = self.keys.meta(namespace);
        let mut found = Vec::with_capacity(keys.len());
        for batch in keys.chunks(META_READ_KEYS) {
            let values: Vec<Option<Vec<u8>>> = self.pool.with("read metadata", |c| {
                redis::cmd("HMGET").arg(&hash).arg(batch).query(c.as_dyn())
            })?;
            if values.len() != batch.len() {
                return Err(corrupt(
                    "HMGET of metadata",
                    format!(
                        "{} keys asked, {} values answered",
                        batch.len(),
                        values.len()
                    ),
                ));
            }
            found.extend(values.into_iter().map(|v| v.map(Bytes::from)));
        }
        Ok(found)
    }

    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        Ok(self.run_meta(vec![MetaChange::delete(namespace, key)])? > 0)
    }

    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        let hash = self.keys.meta(namespace);
        let all: Vec<(String, Vec<u8>)> = self.pool.with("list metadata", |c| {
            redis::cmd("HGETALL").arg(&hash).query(c.as_dyn())
        })?;
        let mut out: Vec<(String, Bytes)> =
            all.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()> {
        self.run_meta(changes).map(|_| ())
    }

    fn meta_versions(&self, namespaces: &[&str]) -> Result<Option<Vec<u64>>> {
        if namespaces.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let versions = self.keys.meta_versions();
        let fields: Vec<String> = namespaces.iter().map(|ns| self.keys.meta(ns)).collect();
        let counts: Vec<Option<u64>> = self.pool.with("read metadata versions", |c| {
            redis::cmd("HMGET")
                .arg(&versions)
                .arg(&fields)
                .query(c.as_dyn())
        })?;
        Ok(Some(counts.into_iter().map(|n| n.unwrap_or(0)).collect()))
    }

    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        let changed = crate::subs::subscribe(&self.pool, &self.keys, set, users)?;
        self.subscriptions_changed(changed, users);
        Ok(changed)
    }

    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        let changed = crate::subs::unsubscribe(&self.pool, &self.keys, set, users)?;
        self.subscriptions_changed(changed, users);
        Ok(changed)
    }

    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool> {
        crate::subs::is_subscribed(&self.pool, &self.keys, set, user)
    }

    fn subscriber_count(&self, set: u64) -> Result<u64> {
        crate::subs::count(&self.pool, &self.keys, set)
    }

    fn subscriber_counts(&self, sets: &[u64]) -> Result<Vec<u64>> {
        crate::subs::counts(&self.pool, &self.keys, sets)
    }

    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>> {
        crate::subs::members(&self.pool, &self.keys, set, after, limit)
    }

    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        crate::subs::user_sets(&self.pool, &self.keys, user, limit)
    }

    fn drop_set(&self, set: u64) -> Result<u64> {
        let dropped = crate::subs::drop_set(&self.pool, &self.keys, set)?;
        if dropped > 0 {
            // Its members are not listed: every node forgets every cached list.
            self.publish(crate::events::every_user_message());
        }
        Ok(dropped)
    }

    fn take_rate_tokens(
        &self,
        queue: &QueueName,
        want: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<Option<u64>> {
        self.rate_op(queue, "take", want, rate_per_s, burst)
            .map(Some)
    }

    fn return_rate_tokens(
        &self,
        queue: &QueueName,
        count: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<()> {
        if count > 0 {
            self.rate_op(queue, "return", count, rate_per_s, burst)?;
        }
        Ok(())
    }

    fn reserve_in_flight(
        &self,
        queue: &QueueName,
        want: u64,
        cap: u64,
        now_ms: UnixMs,
        until_ms: UnixMs,
    ) -> Result<Option<belfry_store::InFlightRoom>> {
        self.reserve_room(queue, want, cap, now_ms, until_ms)
            .map(Some)
    }

    fn settle_in_flight(
        &self,
        queue: &QueueName,
        room: &belfry_store::InFlightRoom,
        leases: &[(LeaseId, UnixMs)],
        now_ms: UnixMs,
    ) -> Result<()> {
        self.settle_room(queue, room, leases, now_ms)
    }

    fn shared_by_nodes(&self) -> bool {
        true
    }

    fn subscribe_events(&self, sink: belfry_store::EventSink) -> Result<()> {
        let listener = crate::events::listen(
            &self.target,
            self.keys.events(),
            sink,
            self.resync_every,
            self.timeouts,
            self.ownership.clone(),
        )
        .map_err(|source| StoreError::Io {
            context: "start the store-event thread",
            path: None,
            source,
        })?;
        *self.listener.lock() = Some(listener);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        // Durability is Redis's own (its append-only file and replicas); nothing is buffered
        // here.
        Ok(())
    }
}
