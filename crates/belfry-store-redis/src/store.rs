//! `RedisStore`: the `Store` contract over the scripts in `lua/`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use belfry_core::{
    LeaseId, LeasedTask, NewTask, QueueName, Task, TaskId, TaskState, UnixMs, UserId,
};
use belfry_store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, MetaChange, PutOutcome, QueueCounts, Store, StoreError,
};
use bytes::Bytes;
use redis::Value;

use crate::conn::{map_error, pipeline, run_script, unexpected, Conn, Pool, Result, Timeouts};
use crate::keys::{seq_of, split_id, task_id, Keys};
use crate::record::{self, Record};
use crate::scripts::{self, Lua};
use crate::target::RedisTarget;

/// How a [`RedisStore`] connects and lays out its keys.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key (inside the hash tags), so several belfry deployments (or tests)
    /// can share one Redis. Letters, digits, `_` and `-`.
    pub namespace: String,
    /// Partitions per queue: the unit of placement and of shard ownership. Fixed when the
    /// namespace is first used; a store opened with another number is refused.
    pub partitions: u16,
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
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            namespace: "belfry".into(),
            partitions: 256,
            timeouts: Timeouts::default(),
            finished_retention_ms: 60_000,
            pool_idle_max: 64,
            resync_every: std::time::Duration::from_secs(5),
        }
    }
}

pub struct RedisStore {
    pool: Pool,
    keys: Keys,
    target: RedisTarget,
    retention_ms: u64,
    /// Rotates the partition of tasks without an idempotency key, and the partition a claim
    /// starts at.
    rotate: AtomicU32,
    timeouts: Timeouts,
    resync_every: std::time::Duration,
    listener: parking_lot::Mutex<Option<crate::events::Listener>>,
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
struct Part {
    p: u16,
    keys: Vec<Vec<u8>>,
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
        if let RedisTarget::Cluster(nodes) = target {
            check_cluster_slots(nodes, options.timeouts)?;
        }
        let pool = Pool::open(target, options.timeouts, options.pool_idle_max)?;
        let keys = Keys::new(&options.namespace, options.partitions);
        let store = RedisStore {
            pool,
            keys,
            target: target.clone(),
            retention_ms: options.finished_retention_ms,
            rotate: AtomicU32::new(rand_seed()),
            timeouts: options.timeouts,
            resync_every: options.resync_every,
            listener: parking_lot::Mutex::new(None),
        };
        let settings = store.keys.settings();
        let partitions: Option<u16> = store.pool.with("read the store's settings", |c| {
            redis::cmd("HSETNX")
                .arg(&settings)
                .arg("partitions")
                .arg(options.partitions)
                .query::<i64>(c.as_dyn())?;
            redis::cmd("HGET")
                .arg(&settings)
                .arg("partitions")
                .query(c.as_dyn())
        })?;
        if partitions != Some(options.partitions) {
            return Err(StoreError::Invalid(format!(
                "namespace {:?} in {target} was made with {} partitions, not {}: start with \
                 the same partition count (or another namespace)",
                options.namespace,
                partitions.map_or("an unknown number of".to_owned(), |p| p.to_string()),
                options.partitions
            )));
        }
        Ok(store)
    }

    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    pub fn partitions(&self) -> u16 {
        self.keys.partitions
    }

    fn part(&self, p: u16, uid: u64) -> Part {
        Part {
            p,
            keys: self.keys.task_keys(p, uid),
        }
    }

    fn uid(&self, c: &mut Conn, queue: &QueueName) -> Result<u64> {
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
    fn with_queue<T>(
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

    fn script(
        &self,
        c: &mut Conn,
        lua: &Lua,
        keys: &[Vec<u8>],
        args: &[Vec<u8>],
        what: &'static str,
    ) -> Result<Value> {
        run_script(c.as_dyn(), lua, keys, args).map_err(|e| map_error(e, what))
    }

    fn hint_lower(&self, c: &mut Conn, queue: &QueueName, uid: u64, p: u16, at: i64) -> Result<()> {
        if at < 0 {
            return Ok(());
        }
        let keys = [self.keys.hint(uid).into_bytes()];
        let args = [
            at.to_string().into_bytes(),
            p.to_string().into_bytes(),
            self.keys.events().into_bytes(),
            crate::events::wake_message(queue),
        ];
        self.script(c, &scripts::HINT, &keys, &args, "update a queue's hint")?;
        Ok(())
    }

    /// Sets partition `p`'s hint to `earliest` after a claim, then looks at the partition
    /// again and lowers it if a put landed meanwhile (its own hint update may have come
    /// before ours), so a wake-up is never lost to the race.
    fn hint_settle(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        part: &Part,
        earliest: i64,
    ) -> Result<()> {
        let hint = self.keys.hint(uid);
        let set = if earliest < 0 {
            redis::cmd("ZREM")
                .arg(&hint)
                .arg(part.p)
                .query::<i64>(c.as_dyn())
        } else {
            redis::cmd("ZADD")
                .arg(&hint)
                .arg(earliest)
                .arg(part.p)
                .query::<i64>(c.as_dyn())
        };
        set.map_err(|e| map_error(e, "update a queue's hint"))?;
        let again = self.earliest(c, part)?;
        if again >= 0 && (earliest < 0 || again < earliest) {
            self.hint_lower(c, queue, uid, part.p, again)?;
        }
        Ok(())
    }

    fn earliest(&self, c: &mut Conn, part: &Part) -> Result<i64> {
        let v = self.script(
            c,
            &scripts::READ,
            &part.keys,
            &[b"earliest".to_vec()],
            "read a partition",
        )?;
        as_i64(&v).ok_or_else(|| unexpected("earliest", &v))
    }

    fn claim_part(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        part: &Part,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
        batch: &mut ClaimBatch,
    ) -> Result<()> {
        let args = [
            now_ms.to_string().into_bytes(),
            max.to_string().into_bytes(),
            visibility_ms.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
            Vec::new(),
        ];
        let v = self.script(c, &scripts::CLAIM, &part.keys, &args, "claim due tasks")?;
        let bad = || unexpected("claim", &v);
        let items = as_array(&v).ok_or_else(bad)?;
        let [leased, skipped, dead, earliest] = items else {
            return Err(bad());
        };
        let leased = as_array(leased).ok_or_else(bad)?;
        for pair in leased.chunks(2) {
            let [seq, rec] = pair else { return Err(bad()) };
            let seq = as_seq(seq).ok_or_else(bad)?;
            let record = decode(as_bytes(rec).ok_or_else(bad)?)?;
            let id = task_id(uid, part.p, seq);
            let lease_until_ms = record.lease_until_ms;
            let lease_id = LeaseId(record.lease_id);
            let task = to_task(record, id, queue, None, now_ms, true);
            batch.leased.push(LeasedTask {
                task,
                lease_id,
                lease_until_ms,
            });
        }
        for seq in as_array(skipped).ok_or_else(bad)? {
            batch
                .late_skipped
                .push(task_id(uid, part.p, as_seq(seq).ok_or_else(bad)?));
        }
        for seq in as_array(dead).ok_or_else(bad)? {
            batch
                .late_dead
                .push(task_id(uid, part.p, as_seq(seq).ok_or_else(bad)?));
        }
        let earliest = as_i64(earliest).ok_or_else(bad)?;
        self.hint_settle(c, queue, uid, part, earliest)
    }

    fn lease_op(
        &self,
        queue: &QueueName,
        items: &[(TaskId, LeaseId, Vec<u8>)],
        op: &str,
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        self.with_queue(queue, |this, c, uid| {
            let mut outcomes = vec![LeaseOutcome::NotFound; items.len()];
            let mut by_part: HashMap<u16, Vec<(usize, [u8; 8])>> = HashMap::new();
            for (i, (id, _, _)) in items.iter().enumerate() {
                if let Some((p, seq)) = split_id(*id, uid, this.keys.partitions) {
                    by_part.entry(p).or_default().push((i, seq));
                }
            }
            for (p, members) in by_part {
                let part = this.part(p, uid);
                let mut args = vec![
                    now_ms.to_string().into_bytes(),
                    this.retention_ms.to_string().into_bytes(),
                    op.as_bytes().to_vec(),
                ];
                for (i, seq) in &members {
                    args.push(seq.to_vec());
                    args.push(items[*i].1 .0.to_string().into_bytes());
                    args.push(items[*i].2.clone());
                }
                let v = this.script(c, &scripts::LEASE, &part.keys, &args, "change a lease")?;
                let bad = || unexpected("lease", &v);
                let codes = as_array(&v).ok_or_else(bad)?;
                if codes.len() != members.len() + 1 {
                    return Err(bad());
                }
                for ((i, _), code) in members.iter().zip(codes) {
                    outcomes[*i] = match as_i64(code) {
                        Some(0) => LeaseOutcome::Ok,
                        Some(1) => LeaseOutcome::NotFound,
                        Some(2) => LeaseOutcome::LeaseExpired,
                        _ => return Err(bad()),
                    };
                }
                if op != "ack" {
                    let earliest = as_i64(&codes[members.len()]).ok_or_else(bad)?;
                    this.hint_lower(c, queue, uid, p, earliest)?;
                }
            }
            Ok(outcomes)
        })
    }

    fn change(
        &self,
        queue: &QueueName,
        id: TaskId,
        op: &str,
        value: u64,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        self.with_queue(queue, |this, c, uid| {
            let Some((p, seq)) = split_id(id, uid, this.keys.partitions) else {
                return Ok(ChangeOutcome::NotFound);
            };
            let part = this.part(p, uid);
            let args = [
                now_ms.to_string().into_bytes(),
                this.retention_ms.to_string().into_bytes(),
                op.as_bytes().to_vec(),
                seq.to_vec(),
                value.to_string().into_bytes(),
            ];
            let v = this.script(c, &scripts::CHANGE, &part.keys, &args, "change a task")?;
            let bad = || unexpected("change", &v);
            let items = as_array(&v).ok_or_else(bad)?;
            let [code, state, earliest] = items else {
                return Err(bad());
            };
            let outcome = match as_i64(code) {
                Some(0) => ChangeOutcome::Ok,
                Some(1) => ChangeOutcome::NotFound,
                Some(3) => ChangeOutcome::WrongState(
                    as_i64(state).and_then(record::state_of).ok_or_else(bad)?,
                ),
                _ => return Err(bad()),
            };
            if outcome == ChangeOutcome::Ok {
                this.hint_lower(c, queue, uid, p, as_i64(earliest).ok_or_else(bad)?)?;
            }
            Ok(outcome)
        })
    }

    fn rate_op(
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

    fn read(&self, c: &mut Conn, part: &Part, args: &[Vec<u8>]) -> Result<Value> {
        self.script(c, &scripts::READ, &part.keys, args, "read tasks")
    }

    fn read_task(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        p: u16,
        v: &[Value],
        now_ms: UnixMs,
    ) -> Result<Task> {
        let bad = || corrupt("redis reply (read a task)", "unexpected shape".into());
        let [seq, rec, reason] = v else {
            return Err(bad());
        };
        let _ = c;
        let seq = as_seq(seq).ok_or_else(bad)?;
        let record = decode(as_bytes(rec).ok_or_else(bad)?)?;
        let reason = as_bytes(reason)
            .filter(|r| !r.is_empty())
            .map(|r| String::from_utf8_lossy(r).into_owned());
        Ok(to_task(
            record,
            task_id(uid, p, seq),
            queue,
            reason,
            now_ms,
            false,
        ))
    }

    fn hint_first(&self, c: &mut Conn, uid: u64) -> Result<Option<(u16, i64)>> {
        let v: Vec<(u16, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys.hint(uid))
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query(c.as_dyn())
            .map_err(|e| map_error(e, "read a queue's hint"))?;
        Ok(v.first().map(|&(p, at)| (p, at as i64)))
    }
}

fn rand_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

fn corrupt(location: &str, detail: String) -> StoreError {
    StoreError::Corrupt {
        location: location.to_owned(),
        detail,
    }
}

fn decode(bytes: &[u8]) -> Result<Record> {
    record::decode(&Bytes::copy_from_slice(bytes))
        .map_err(|detail| corrupt("redis task record", detail))
}

/// A record as the task it describes at `now_ms`: a lease that has ended reads as scheduled.
fn to_task(
    r: Record,
    id: TaskId,
    queue: &QueueName,
    dead_reason: Option<String>,
    now_ms: UnixMs,
    just_leased: bool,
) -> Task {
    let mut state = r.state;
    let mut lease_until = (state == TaskState::Leased).then_some(r.lease_until_ms);
    if state == TaskState::Leased && !just_leased && r.lease_until_ms <= now_ms {
        state = TaskState::Scheduled;
        lease_until = None;
    }
    Task {
        id,
        queue: queue.clone(),
        due_at_ms: r.due_at_ms,
        payload: r.payload,
        payload_kind: r.payload_kind,
        headers: r.headers,
        priority: r.priority,
        idempotency_key: r.idempotency_key,
        late_policy: r.late_policy,
        state,
        attempts: r.attempts,
        lease_until_ms: lease_until,
        dead_reason: if state == TaskState::Dead {
            dead_reason
        } else {
            None
        },
    }
}

pub(crate) fn as_array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

pub(crate) fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Double(d) => Some(*d as i64),
        _ => None,
    }
}

fn as_seq(v: &Value) -> Option<u64> {
    seq_of(as_bytes(v)?)
}

/// Checks, on a seed node, that the cluster serves every slot, so a misconfigured cluster
/// fails at start-up with the slots it lacks instead of failing calls later.
fn check_cluster_slots(nodes: &[String], timeouts: Timeouts) -> Result<()> {
    let mut last_error = None;
    for node in nodes {
        let attempt = (|| -> redis::RedisResult<Vec<Value>> {
            let client = redis::Client::open(node.as_str())?;
            let mut con = client.get_connection_with_timeout(timeouts.connect)?;
            con.set_read_timeout(Some(timeouts.command))?;
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)
        })();
        match attempt {
            Ok(ranges) => {
                let mut covered = vec![false; 16384];
                for range in &ranges {
                    let Some(items) = as_array(range) else {
                        continue;
                    };
                    let (Some(lo), Some(hi)) = (
                        items.first().and_then(as_i64),
                        items.get(1).and_then(as_i64),
                    ) else {
                        continue;
                    };
                    for slot in lo.max(0)..=hi.min(16383) {
                        covered[slot as usize] = true;
                    }
                }
                let missing = missing_ranges(&covered);
                if missing.is_empty() {
                    return Ok(());
                }
                return Err(StoreError::Invalid(format!(
                    "the redis cluster at {node} does not serve slots {missing}: every one of the 16384 \
                     slots needs a master (see `redis-cli --cluster check {}`)",
                    node.trim_start_matches("redis://")
                )));
            }
            Err(e) => last_error = Some(format!("{node}: {e}")),
        }
    }
    Err(StoreError::Unavailable {
        detail: format!(
            "no seed node of the redis cluster answered CLUSTER SLOTS ({})",
            last_error.unwrap_or_default()
        ),
    })
}

fn missing_ranges(covered: &[bool]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < covered.len() {
        if covered[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < covered.len() && !covered[i] {
            i += 1;
        }
        out.push(if i - 1 == start {
            start.to_string()
        } else {
            format!("{start}-{}", i - 1)
        });
    }
    out.join(",")
}

impl Store for RedisStore {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        let keys: Vec<Vec<u8>> = self
            .keys
            .registry()
            .iter()
            .map(|k| k.clone().into_bytes())
            .collect();
        let args = [
            b"put".to_vec(),
            queue.as_str().as_bytes().to_vec(),
            config.to_vec(),
        ];
        let v = self.pool.with("create a queue", |c| {
            run_script(c.as_dyn(), &scripts::QUEUE, &keys, &args)
        })?;
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
        let keys: Vec<Vec<u8>> = self
            .keys
            .registry()
            .iter()
            .map(|k| k.clone().into_bytes())
            .collect();
        let args = [b"delete".to_vec(), queue.as_str().as_bytes().to_vec()];
        let v = self.pool.with("delete a queue", |c| {
            run_script(c.as_dyn(), &scripts::QUEUE, &keys, &args)
        })?;
        let uid = as_i64(&v).ok_or_else(|| unexpected("delete queue", &v))?;
        if uid == 0 {
            return Ok(false);
        }
        let uid = uid as u64;
        self.publish(crate::events::queue_message(queue));
        // The queue is gone from the registry: nothing finds these keys any more; remove them.
        let mut cmds = Vec::with_capacity(self.keys.partitions as usize + 2);
        for p in 0..self.keys.partitions {
            let mut cmd = redis::cmd("UNLINK");
            cmd.arg(self.keys.task_keys(p, uid));
            cmds.push(cmd);
        }
        for key in [self.keys.hint(uid), self.keys.rate(uid)] {
            let mut cmd = redis::cmd("UNLINK");
            cmd.arg(key);
            cmds.push(cmd);
        }
        self.pool
            .with("delete a queue's tasks", |c| pipeline(c, cmds))?;
        Ok(true)
    }

    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; tasks.len()];
        // Group by queue, then partition, keeping input order within each group.
        let mut by_queue: Vec<(QueueName, Vec<usize>)> = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            match by_queue.iter_mut().find(|(q, _)| *q == task.queue) {
                Some((_, list)) => list.push(i),
                None => by_queue.push((task.queue.clone(), vec![i])),
            }
        }
        for (queue, indexes) in by_queue {
            let rotating = (self.rotate.fetch_add(1, Ordering::Relaxed)
                % u32::from(self.keys.partitions)) as u16;
            self.with_queue(&queue, |this, c, uid| {
                let mut by_part: Vec<(u16, Vec<usize>)> = Vec::new();
                for &i in &indexes {
                    let p = match &tasks[i].idempotency_key {
                        Some(key) => crate::partition_of(key.as_bytes(), this.keys.partitions),
                        None => rotating,
                    };
                    match by_part.iter_mut().find(|(q, _)| *q == p) {
                        Some((_, list)) => list.push(i),
                        None => by_part.push((p, vec![i])),
                    }
                }
                for (p, members) in by_part {
                    let part = this.part(p, uid);
                    let mut args = vec![
                        b"0".to_vec(),
                        b"0".to_vec(),
                        members.len().to_string().into_bytes(),
                    ];
                    for &i in &members {
                        let task = &tasks[i];
                        args.push(task.due_at_ms.to_string().into_bytes());
                        args.push(match task.priority {
                            belfry_core::Priority::High => b"0".to_vec(),
                            belfry_core::Priority::Normal => b"1".to_vec(),
                        });
                        args.push(
                            task.idempotency_key
                                .clone()
                                .unwrap_or_default()
                                .into_bytes(),
                        );
                        args.push(record::encode(task));
                    }
                    let v = this.script(c, &scripts::PUT, &part.keys, &args, "store tasks")?;
                    let bad = || unexpected("put", &v);
                    let items = as_array(&v).ok_or_else(bad)?;
                    if items.len() != members.len() + 1 {
                        return Err(bad());
                    }
                    for (&i, item) in members.iter().zip(items) {
                        let fields = as_array(item).ok_or_else(bad)?;
                        outcomes[i] = Some(match fields {
                            [created, seq] if as_i64(created) == Some(1) => PutOutcome::Created {
                                id: task_id(uid, p, as_seq(seq).ok_or_else(bad)?),
                                due_at_ms: tasks[i].due_at_ms,
                            },
                            [_, seq, rec, reason] => {
                                let v = [seq.clone(), rec.clone(), reason.clone()];
                                PutOutcome::Duplicate(Box::new(
                                    this.read_task(c, &queue, uid, p, &v, 0)?,
                                ))
                            }
                            _ => return Err(bad()),
                        });
                    }
                    let first = as_i64(&items[members.len()]).ok_or_else(bad)?;
                    this.hint_lower(c, &queue, uid, p, first)?;
                }
                Ok(())
            })?;
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every task has an outcome"))
            .collect())
    }

    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let Some((p, seq)) = split_id(id, uid, this.keys.partitions) else {
                return Ok(None);
            };
            let part = this.part(p, uid);
            let v = this.read(c, &part, &[b"get".to_vec(), seq.to_vec()])?;
            let items = as_array(&v).ok_or_else(|| unexpected("get", &v))?;
            match items {
                [] => Ok(None),
                [rec, reason] => {
                    let v = [Value::BulkString(seq.to_vec()), rec.clone(), reason.clone()];
                    this.read_task(c, queue, uid, p, &v, now_ms).map(Some)
                }
                _ => Err(unexpected("get", &v)),
            }
        })
    }

    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let p = crate::partition_of(key.as_bytes(), this.keys.partitions);
            let part = this.part(p, uid);
            let v = this.read(c, &part, &[b"key".to_vec(), key.as_bytes().to_vec()])?;
            let items = as_array(&v).ok_or_else(|| unexpected("get by key", &v))?;
            if items.is_empty() {
                return Ok(None);
            }
            this.read_task(c, queue, uid, p, items, now_ms).map(Some)
        })
    }

    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change(queue, id, "cancel", 0, now_ms)
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

    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        let mut batch = ClaimBatch::default();
        if max == 0 {
            // Still a queue check, as every call is.
            self.with_queue(queue, |_, _, _| Ok(()))?;
            return Ok(batch);
        }
        self.with_queue(queue, |this, c, uid| {
            let due: Vec<u16> = redis::cmd("ZRANGE")
                .arg(this.keys.hint(uid))
                .arg("-inf")
                .arg(now_ms)
                .arg("BYSCORE")
                .query(c.as_dyn())
                .map_err(|e| map_error(e, "read a queue's hint"))?;
            if due.is_empty() {
                return Ok(());
            }
            // Start at a rotating place, so no partition is always last.
            let start = this.rotate.fetch_add(1, Ordering::Relaxed) as usize % due.len();
            for k in 0..due.len() {
                let left = max.saturating_sub(batch.leased.len());
                if left == 0 {
                    break;
                }
                let part = this.part(due[(start + k) % due.len()], uid);
                this.claim_part(
                    c,
                    queue,
                    uid,
                    &part,
                    now_ms,
                    left,
                    visibility_ms,
                    &mut batch,
                )?;
            }
            Ok(())
        })?;
        // Claim order across partitions: high priority first, then due time, then id.
        batch
            .leased
            .sort_by_key(|t| (t.task.priority, t.task.due_at_ms, t.task.id));
        Ok(batch)
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
        Ok(self.lease_op(
            queue,
            &[(id, lease, reason.as_bytes().to_vec())],
            "dead",
            now_ms,
        )?[0])
    }

    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let mut out = Vec::new();
            let (first_p, mut after_seq) = match after {
                None => (0, None),
                Some(id) if (id.0 >> 96) as u64 > uid => return Ok(out),
                Some(id) if ((id.0 >> 96) as u64) < uid => (0, None),
                Some(id) => {
                    let p = ((id.0 >> 64) & 0xffff) as u16;
                    let seq = (id.0 as u64).to_be_bytes();
                    if (id.0 >> 80) & 0xffff != 0 {
                        // Past every id of this queue's partitions with zero unused bits.
                        return Ok(out);
                    }
                    (p, Some(seq))
                }
            };
            for p in first_p..this.keys.partitions {
                if out.len() >= limit {
                    break;
                }
                let part = this.part(p, uid);
                let args = [
                    b"dead".to_vec(),
                    after_seq.take().map(|s| s.to_vec()).unwrap_or_default(),
                    (limit - out.len()).to_string().into_bytes(),
                ];
                let v = this.read(c, &part, &args)?;
                let items = as_array(&v).ok_or_else(|| unexpected("list dead", &v))?;
                for triple in items.chunks(3) {
                    out.push(this.read_task(c, queue, uid, p, triple, 0)?);
                }
            }
            Ok(out)
        })
    }

    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        self.change(queue, id, "redrive", 0, now_ms)
    }

    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        self.with_queue(queue, |this, c, uid| {
            let mut counts = QueueCounts::default();
            for p in 0..this.keys.partitions {
                let part = this.part(p, uid);
                let v = this.read(
                    c,
                    &part,
                    &[b"counts".to_vec(), now_ms.to_string().into_bytes()],
                )?;
                let items = as_array(&v).ok_or_else(|| unexpected("counts", &v))?;
                let n: Vec<u64> = items
                    .iter()
                    .filter_map(as_i64)
                    .map(|n| n.max(0) as u64)
                    .collect();
                let [pending, due, in_flight, dead] = n[..] else {
                    return Err(unexpected("counts", &v));
                };
                counts.pending += pending;
                counts.due += due;
                counts.in_flight += in_flight;
                counts.dead += dead;
            }
            Ok(counts)
        })
    }

    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        if step_ms == 0 {
            return Err(StoreError::Invalid("forecast step must be positive".into()));
        }
        self.with_queue(queue, |this, c, uid| {
            let mut out = vec![0u64; steps];
            if steps == 0 {
                return Ok(out);
            }
            for p in 0..this.keys.partitions {
                let part = this.part(p, uid);
                let args = [
                    b"forecast".to_vec(),
                    from_ms.to_string().into_bytes(),
                    step_ms.to_string().into_bytes(),
                    steps.to_string().into_bytes(),
                ];
                let v = this.read(c, &part, &args)?;
                let items = as_array(&v).ok_or_else(|| unexpected("forecast", &v))?;
                if items.len() != steps {
                    return Err(unexpected("forecast", &v));
                }
                for (slot, n) in out.iter_mut().zip(items) {
                    *slot += as_i64(n).unwrap_or(0).max(0) as u64;
                }
            }
            Ok(out)
        })
    }

    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        self.with_queue(queue, |this, c, uid| {
            // The hint may be early (work taken by a call that does not settle it): check the
            // first partition's truth and settle until the first entry is true.
            for _ in 0..16 {
                let Some((p, at)) = this.hint_first(c, uid)? else {
                    return Ok(None);
                };
                let part = this.part(p, uid);
                let truth = this.earliest(c, &part)?;
                if truth == at {
                    return Ok(Some(at.max(0) as u64));
                }
                this.hint_settle(c, queue, uid, &part, truth)?;
            }
            Ok(this.hint_first(c, uid)?.map(|(_, at)| at.max(0) as u64))
        })
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

    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        let hash = self.keys.meta(namespace);
        let n: i64 = self.pool.with("delete metadata", |c| {
            redis::cmd("HDEL").arg(&hash).arg(key).query(c.as_dyn())
        })?;
        if n > 0 {
            self.publish(crate::events::meta_message(namespace));
        }
        Ok(n > 0)
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
        if changes.is_empty() {
            return Ok(());
        }
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(changes.len() * 4);
        let mut namespaces: Vec<String> = Vec::new();
        for change in changes {
            if !namespaces.contains(&change.namespace) {
                namespaces.push(change.namespace.clone());
            }
            let key = self.keys.meta(&change.namespace).into_bytes();
            let index = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    keys.push(key);
                    keys.len() - 1
                }
            };
            args.push((index + 1).to_string().into_bytes());
            args.push(change.key.into_bytes());
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
        self.pool.with("write metadata", |c| {
            run_script(c.as_dyn(), &scripts::META, &keys, &args)
        })?;
        for namespace in namespaces {
            self.publish(crate::events::meta_message(&namespace));
        }
        Ok(())
    }

    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        crate::subs::subscribe(&self.pool, &self.keys, set, users)
    }

    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        crate::subs::unsubscribe(&self.pool, &self.keys, set, users)
    }

    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool> {
        crate::subs::is_subscribed(&self.pool, &self.keys, set, user)
    }

    fn subscriber_count(&self, set: u64) -> Result<u64> {
        crate::subs::count(&self.pool, &self.keys, set)
    }

    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>> {
        crate::subs::members(&self.pool, &self.keys, set, after, limit)
    }

    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        crate::subs::user_sets(&self.pool, &self.keys, user, limit)
    }

    fn drop_set(&self, set: u64) -> Result<u64> {
        crate::subs::drop_set(&self.pool, &self.keys, set)
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

    fn subscribe_events(&self, sink: belfry_store::EventSink) -> Result<()> {
        let listener = crate::events::listen(
            &self.target,
            self.keys.events(),
            sink,
            self.resync_every,
            self.timeouts,
        )
        .map_err(|source| StoreError::Io {
            context: "start the store-event thread",
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
