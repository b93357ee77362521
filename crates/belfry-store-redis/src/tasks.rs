//! Task calls other than claims: puts, lease changes (ack, nack, extend, dead letter),
//! changes (cancel, reschedule, redrive) and reads, each one script per partition.

use std::collections::HashMap;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs};
use belfry_store::{ChangeOutcome, LeaseOutcome, PutOutcome, QueueCounts, StoreError};
use redis::Value;

use crate::claim_many::evalsha;
use crate::conn::{map_error, pipeline, unexpected, Conn, Result};
use crate::each::{pipeline_each, ScriptCall};
use crate::keys::{listing_start, split_id, task_id};
use crate::record;
use crate::reply::{as_array, as_bytes, as_i64, as_seq, corrupt, decode, one_reply_each, to_task};
use crate::scripts;
use crate::store::{Part, RedisStore};

/// The tasks of one partition in a lease call: their index in the call, and their sequence.
type Members = Vec<(usize, [u8; 8])>;

impl RedisStore {
    pub(crate) fn lease_op(
        &self,
        queue: &QueueName,
        items: &[(TaskId, LeaseId, Vec<u8>)],
        op: &str,
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        self.with_queue(queue, |this, c, uid| {
            let mut outcomes = vec![LeaseOutcome::NotFound; items.len()];
            let mut by_part: HashMap<u16, Members> = HashMap::new();
            for (i, (id, _, _)) in items.iter().enumerate() {
                if let Some((p, seq)) = split_id(*id, uid, this.keys.partitions) {
                    by_part.entry(p).or_default().push((i, seq));
                }
            }
            let by_part: Vec<(u16, Members)> = by_part.into_iter().collect();
            let calls: Vec<(Part, Vec<Vec<u8>>)> = by_part
                .iter()
                .map(|(p, members)| {
                    let args = this.lease_args(*p, members, items, op, now_ms);
                    (this.part(*p, uid), args)
                })
                .collect();
            // The leases' shared in-flight room goes in the same pipeline (`inflight.rs`).
            let room = this.room_cmd(queue, uid, op, items, now_ms);
            let replies = this.send_lease_calls(c, queue, &calls, room)?;
            one_reply_each("redis reply (lease)", replies.len(), calls.len())?;
            for ((p, members), v) in by_part.iter().zip(&replies) {
                let bad = || unexpected("lease", v);
                let codes = as_array(v).ok_or_else(bad)?;
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
                    this.hint_lower(c, queue, uid, *p, earliest)?;
                }
            }
            Ok(outcomes)
        })
    }

    /// The lease script's arguments for the tasks of partition `p` in a lease call: the
    /// time, the retention and the operation, then each task's sequence, lease counter and
    /// operation argument.
    fn lease_args(
        &self,
        p: u16,
        members: &Members,
        items: &[(TaskId, LeaseId, Vec<u8>)],
        op: &str,
        now_ms: UnixMs,
    ) -> Vec<Vec<u8>> {
        let mut args = vec![
            now_ms.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
            op.as_bytes().to_vec(),
        ];
        for (i, seq) in members {
            args.push(seq.to_vec());
            let counter = crate::keys::lease_counter(items[*i].1, p);
            args.push(counter.to_string().into_bytes());
            args.push(items[*i].2.clone());
        }
        args
    }

    /// Runs the lease script of each partition in `calls`, and the in-flight room's command
    /// when there is one, answering the scripts' replies in order. Several calls go in one
    /// pipeline, each reply read on its own (`each.rs`), so a node that lost the scripts
    /// costs a second run of its calls only.
    fn send_lease_calls(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        calls: &[(Part, Vec<Vec<u8>>)],
        room: Option<redis::Cmd>,
    ) -> Result<Vec<Value>> {
        match (calls, room) {
            ([], _) => Ok(Vec::new()),
            ([(part, args)], None) => Ok(vec![self.script(
                c,
                &scripts::LEASE,
                &part.keys,
                args,
                "change a lease",
            )?]),
            (_, room) => {
                let with_room = room.is_some();
                let cmds: Vec<redis::Cmd> = calls
                    .iter()
                    .map(|(part, args)| evalsha(&scripts::LEASE, &part.keys, args))
                    .chain(room)
                    .collect();
                let mut replies =
                    pipeline_each(c, &cmds).map_err(|e| map_error(e, "change leases"))?;
                if with_room {
                    if let Some(Err(error)) = replies.pop() {
                        // The leases changed all the same; their room comes back at their
                        // deadlines, as for a lease that nobody ends.
                        tracing::warn!(%error, %queue, "release in-flight room");
                    }
                }
                let each: Vec<ScriptCall<'_>> = calls
                    .iter()
                    .map(|(part, args)| (part.keys.as_slice(), args.as_slice()))
                    .collect();
                self.rerun_missing(c, &scripts::LEASE, replies, &each, "change a lease")
            }
        }
    }

    pub(crate) fn change(
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
            let args = this.change_args(op, &seq, value, now_ms);
            let v = this.script(c, &scripts::CHANGE, &part.keys, &args, "change a task")?;
            let (outcome, earliest) = change_reply(&v)?;
            if outcome == ChangeOutcome::Ok {
                this.replicate(c, &part.keys[0])?;
                this.hint_lower(c, queue, uid, p, earliest)?;
            }
            Ok(outcome)
        })
    }

    /// The change script's arguments for task `seq`: `op` (`cancel`, `reschedule`, …) with
    /// `value` (a new due time, or 0).
    pub(crate) fn change_args(
        &self,
        op: &str,
        seq: &[u8],
        value: u64,
        now_ms: UnixMs,
    ) -> Vec<Vec<u8>> {
        vec![
            now_ms.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
            op.as_bytes().to_vec(),
            seq.to_vec(),
            value.to_string().into_bytes(),
            self.far_after_ms.to_string().into_bytes(),
        ]
    }

    pub(crate) fn read(&self, c: &mut Conn, part: &Part, args: &[Vec<u8>]) -> Result<Value> {
        self.script(c, &scripts::READ, &part.keys, args, "read tasks")
    }

    pub(crate) fn read_task(
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
        let reason = as_bytes(reason)
            .filter(|r| !r.is_empty())
            .map(|r| String::from_utf8_lossy(r).into_owned());
        task_of(queue, uid, p, seq, rec, reason, now_ms)
    }

    pub(crate) fn put_tasks(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; tasks.len()];
        // Group by queue, then partition, keeping input order within each group.
        let by_queue = group_in_order(0..tasks.len(), |i| &tasks[i].queue);
        // Every queue is checked before anything is written, so a missing queue fails the
        // call with nothing stored (one queue is checked by the write itself).
        if by_queue.len() > 1 {
            self.check_queues(by_queue.iter().map(|(queue, _)| *queue))?;
        }
        let place_now = self.placement_now_ms.unwrap_or_else(wall_clock_ms);
        for (queue, indexes) in by_queue {
            let rotating = (self.next_rotation() % usize::from(self.keys.partitions)) as u16;
            self.with_queue(queue, |this, c, uid| {
                let by_part = group_in_order(indexes.iter().copied(), |i| {
                    match &tasks[i].idempotency_key {
                        Some(key) => crate::partition_of(key.as_bytes(), this.keys.partitions),
                        None => rotating,
                    }
                });
                let calls: Vec<(Part, Vec<Vec<u8>>)> = by_part
                    .iter()
                    .map(|(p, members)| {
                        let args = this.put_args(&tasks, members, place_now);
                        (this.part(*p, uid), args)
                    })
                    .collect();
                let replies = this.put_calls(c, &calls)?;
                one_reply_each("redis reply (put)", replies.len(), calls.len())?;
                let mut earliest = Vec::with_capacity(by_part.len());
                for ((p, members), v) in by_part.iter().zip(&replies) {
                    let bad = || unexpected("put", v);
                    let items = as_array(v).ok_or_else(bad)?;
                    if items.len() != members.len() + 1 {
                        return Err(bad());
                    }
                    for (&i, item) in members.iter().zip(items) {
                        let fields = as_array(item).ok_or_else(bad)?;
                        outcomes[i] = Some(match fields {
                            [created, seq] if as_i64(created) == Some(1) => PutOutcome::Created {
                                id: task_id(uid, *p, as_seq(seq).ok_or_else(bad)?),
                                due_at_ms: tasks[i].due_at_ms,
                            },
                            [_, seq, rec, reason] => {
                                let v = [seq.clone(), rec.clone(), reason.clone()];
                                PutOutcome::Duplicate(Box::new(
                                    this.read_task(c, queue, uid, *p, &v, place_now)?,
                                ))
                            }
                            _ => return Err(bad()),
                        });
                    }
                    earliest.push((*p, as_i64(&items[members.len()]).ok_or_else(bad)?));
                }
                this.hints_lower(c, queue, uid, &earliest)?;
                Ok(())
            })?;
        }
        // Every task got its outcome above (each partition's reply was checked to hold one
        // per member); a hole would be a reply this code misread, answered as corrupt.
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| corrupt("redis reply (put)", "a task lost".into())))
            .collect()
    }

    /// Checks that every queue exists, in one pooled connection.
    fn check_queues<'q>(&self, queues: impl Iterator<Item = &'q QueueName>) -> Result<()> {
        let mut checked = Ok(());
        self.pool.with("check queues", |c| {
            checked = queues
                .into_iter()
                .try_for_each(|queue| self.uid(c, queue).map(drop));
            Ok(())
        })?;
        checked
    }

    /// Runs the put script of each partition in `calls`, answering their replies in order.
    /// Several partitions (a batch of tasks with idempotency keys, which place each task by
    /// its key) go in one pipeline, each reply read on its own (`each.rs`): one round trip
    /// for the batch, not one per partition. With replicas to wait for, each write is waited
    /// for on the connection that made it, one partition at a time.
    fn put_calls(&self, c: &mut Conn, calls: &[(Part, Vec<Vec<u8>>)]) -> Result<Vec<Value>> {
        const WHAT: &str = "store tasks";
        if calls.len() == 1 || self.waits_for_replicas() {
            return calls
                .iter()
                .map(|(part, args)| {
                    let v = self.script(c, &scripts::PUT, &part.keys, args, WHAT)?;
                    self.replicate(c, &part.keys[0])?;
                    Ok(v)
                })
                .collect();
        }
        let each: Vec<ScriptCall<'_>> = calls
            .iter()
            .map(|(part, args)| (part.keys.as_slice(), args.as_slice()))
            .collect();
        self.scripts_pipelined(c, &scripts::PUT, &each, WHAT)
    }

    /// [`RedisStore::hint_lower`] for each `(partition, earliest)` a put left, in one pipeline
    /// when there are several (the queue's hint keys share one slot).
    pub(crate) fn hints_lower(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        at: &[(u16, i64)],
    ) -> Result<()> {
        let at: Vec<(u16, i64)> = at.iter().copied().filter(|(_, at)| *at >= 0).collect();
        if let [(p, at)] = at[..] {
            return self.hint_lower(c, queue, uid, p, at);
        }
        if at.is_empty() {
            return Ok(());
        }
        let keys = self.keys.hint_keys(uid);
        let calls: Vec<Vec<Vec<u8>>> = at
            .iter()
            .map(|&(p, at)| self.hint_args(queue, p, at))
            .collect();
        let each: Vec<ScriptCall<'_>> = calls
            .iter()
            .map(|args| (keys.as_slice(), args.as_slice()))
            .collect();
        self.scripts_pipelined(c, &scripts::HINT, &each, "update a queue's hint")?;
        Ok(())
    }

    pub(crate) fn list_dead_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let mut out = Vec::new();
            let Some((first_p, mut after_seq)) = listing_start(after, uid) else {
                return Ok(out);
            };
            for p in first_p..this.keys.partitions {
                if out.len() >= limit {
                    break;
                }
                let part = this.part(p, uid);
                let args = [
                    b"dead".to_vec(),
                    after_seq
                        .take()
                        .map(|s| s.to_be_bytes().to_vec())
                        .unwrap_or_default(),
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

    pub(crate) fn count_tasks(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        self.with_queue(queue, |this, c, uid| {
            let mut counts = QueueCounts::default();
            let args = [b"counts".to_vec(), now_ms.to_string().into_bytes()];
            for v in this.read_every_partition(c, uid, &args)? {
                let items = as_array(&v).ok_or_else(|| unexpected("counts", &v))?;
                let n: Vec<i64> = items.iter().filter_map(as_i64).collect();
                let [pending, due, in_flight, dead, oldest] = n[..] else {
                    return Err(unexpected("counts", &v));
                };
                counts.pending += pending.max(0) as u64;
                counts.due += due.max(0) as u64;
                counts.in_flight += in_flight.max(0) as u64;
                counts.dead += dead.max(0) as u64;
                // -1: nothing due in this partition.
                if let Ok(oldest) = u64::try_from(oldest) {
                    counts.oldest_due_ms =
                        Some(counts.oldest_due_ms.map_or(oldest, |o| o.min(oldest)));
                }
            }
            Ok(counts)
        })
    }

    pub(crate) fn forecast_tasks(
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
            let args = [
                b"forecast".to_vec(),
                from_ms.to_string().into_bytes(),
                step_ms.to_string().into_bytes(),
                steps.to_string().into_bytes(),
            ];
            for v in this.read_every_partition(c, uid, &args)? {
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

    /// The read script with `args` on every partition of a queue, in one pipeline (once more,
    /// after loading the scripts, if a node lacked them).
    fn read_every_partition(&self, c: &mut Conn, uid: u64, args: &[Vec<u8>]) -> Result<Vec<Value>> {
        let cmds = || {
            (0..self.keys.partitions)
                .map(|p| evalsha(&scripts::READ, &self.part(p, uid).keys, args))
                .collect::<Vec<_>>()
        };
        match pipeline(c, cmds()) {
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                self.load_scripts(c)?;
                pipeline(c, cmds()).map_err(|e| map_error(e, "read every partition"))
            }
            other => other.map_err(|e| map_error(e, "read every partition")),
        }
    }
}

/// This node's clock, in ms since the Unix epoch (0 if it reads before the epoch).
fn wall_clock_ms() -> UnixMs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as UnixMs)
}

impl RedisStore {
    /// The put script's arguments for the tasks of `tasks` at `members`. `place_now` (this
    /// node's clock) is the script's now, by which it forgets tasks finished the retention
    /// ago and frees their keys, and where it places tasks (with `far_after_ms`).
    fn put_args(&self, tasks: &[NewTask], members: &[usize], place_now: UnixMs) -> Vec<Vec<u8>> {
        let mut args = vec![
            place_now.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
            place_now.to_string().into_bytes(),
            self.far_after_ms.to_string().into_bytes(),
            members.len().to_string().into_bytes(),
        ];
        for &i in members {
            args.extend(task_args(&tasks[i]));
        }
        args
    }

    /// A task by id, or none: unknown, or finished the retention or more before `now_ms`
    /// (forgotten or not yet).
    pub(crate) fn get_task(
        &self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
    ) -> Result<Option<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let Some((p, seq)) = split_id(id, uid, this.keys.partitions) else {
                return Ok(None);
            };
            let v = this.read_one(c, &this.part(p, uid), b"get", &seq, now_ms)?;
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

    /// The task an idempotency key names, as [`RedisStore::get_task`] reads one.
    pub(crate) fn get_task_by_key(
        &self,
        queue: &QueueName,
        key: &str,
        now_ms: UnixMs,
    ) -> Result<Option<Task>> {
        self.with_queue(queue, |this, c, uid| {
            let p = crate::partition_of(key.as_bytes(), this.keys.partitions);
            let v = this.read_one(c, &this.part(p, uid), b"key", key.as_bytes(), now_ms)?;
            let items = as_array(&v).ok_or_else(|| unexpected("get by key", &v))?;
            if items.is_empty() {
                return Ok(None);
            }
            this.read_task(c, queue, uid, p, items, now_ms).map(Some)
        })
    }

    /// The read script's op `op` ('get' a sequence, 'key' an idempotency key) on one task,
    /// with the now and the retention it hides finished tasks by.
    fn read_one(
        &self,
        c: &mut Conn,
        part: &Part,
        op: &[u8],
        what: &[u8],
        now_ms: UnixMs,
    ) -> Result<Value> {
        let args = [
            op.to_vec(),
            what.to_vec(),
            now_ms.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
        ];
        self.read(c, part, &args)
    }
}

/// The task a script's reply names by its 8-byte sequence and record, as it is at `now_ms`
/// (a lease that has ended reads as scheduled: `to_task`).
pub(crate) fn task_of(
    queue: &QueueName,
    uid: u64,
    p: u16,
    seq: &Value,
    rec: &Value,
    dead_reason: Option<String>,
    now_ms: UnixMs,
) -> Result<Task> {
    let bad = || corrupt("redis reply (read a task)", "unexpected shape".into());
    let seq = as_seq(seq).ok_or_else(bad)?;
    let record = decode(as_bytes(rec).ok_or_else(bad)?)?;
    Ok(to_task(
        record,
        task_id(uid, p, seq),
        queue,
        dead_reason,
        now_ms,
        false,
    ))
}

/// One task's four arguments to the put script: due, priority, idempotency key, record.
fn task_args(task: &NewTask) -> [Vec<u8>; 4] {
    [
        task.due_at_ms.to_string().into_bytes(),
        match task.priority {
            belfry_core::Priority::High => b"0".to_vec(),
            belfry_core::Priority::Normal => b"1".to_vec(),
        },
        task.idempotency_key
            .clone()
            .unwrap_or_default()
            .into_bytes(),
        record::encode(task),
    ]
}

/// `indexes` grouped by `key`, groups in order of first appearance and indexes in input order
/// within each (a batch names few queues and partitions, so a linear search finds a group).
fn group_in_order<K: PartialEq>(
    indexes: impl Iterator<Item = usize>,
    key: impl Fn(usize) -> K,
) -> Vec<(K, Vec<usize>)> {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    for i in indexes {
        let k = key(i);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, list)) => list.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
}

/// What the change script answered: the outcome, and the partition's earliest work after it
/// (-1: none), for its hint.
pub(crate) fn change_reply(v: &Value) -> Result<(ChangeOutcome, i64)> {
    let bad = || unexpected("change", v);
    let items = as_array(v).ok_or_else(bad)?;
    let [code, state, earliest] = items else {
        return Err(bad());
    };
    let outcome = match as_i64(code) {
        Some(0) => ChangeOutcome::Ok,
        Some(1) => ChangeOutcome::NotFound,
        Some(3) => {
            ChangeOutcome::WrongState(as_i64(state).and_then(record::state_of).ok_or_else(bad)?)
        }
        _ => return Err(bad()),
    };
    let earliest = match outcome {
        ChangeOutcome::Ok => as_i64(earliest).ok_or_else(bad)?,
        _ => -1,
    };
    Ok((outcome, earliest))
}
