//! Claiming: which partitions a claim visits (the queue's hint says which have due work;
//! a dispatch claim keeps only those this node owns, and passes each one's fencing token),
//! and the hint kept true as claims and puts move a partition's earliest work.

use belfry_core::{LeasedTask, QueueName, UnixMs};
use belfry_store::ClaimBatch;
use redis::Value;

use crate::conn::{map_error, unexpected, Conn, Result};
use crate::keys::task_id;
use crate::reply::{as_array, as_bytes, as_i64, as_seq, decode, to_task};
use crate::scripts;
use crate::store::{Part, RedisStore};

/// Partitions a pipelined claim looks at first; each further window is four times larger.
const FIRST_WINDOW: usize = 4;

/// One claim's time and size.
#[derive(Clone, Copy)]
pub(crate) struct Want {
    pub now_ms: UnixMs,
    pub max: usize,
    pub visibility_ms: u64,
}

/// A partition a claim may visit: due by the queue's hint, owned by this node (the fence,
/// when ownership is on), and the hint's version of it before the claim.
pub(crate) struct Candidate {
    pub p: u16,
    pub fence: Option<String>,
    pub version: Vec<u8>,
}

/// What a claim learned of a partition's earliest work (-1: none), for its hint entry.
pub(crate) struct Settle {
    pub p: u16,
    pub version: Vec<u8>,
    pub earliest: i64,
}

/// A hint update that a Redis at its `maxmemory` refused is not an error of the call that
/// made it: the claim, ack or nack before it has happened (its tasks leased, acked or due
/// again), and failing the call would lose that (a claim's leased tasks would wait out their
/// lease undelivered, again at every claim, so a full Redis could never drain). A hint only
/// says where to look: a claim's settle refused leaves the visited partitions due in it, so
/// the next claim looks there again; a lowering refused (a nack's retry time) is made by the
/// sweep once memory is freed.
fn hint_left_for_memory(update: Result<()>) -> Result<()> {
    match update {
        Err(belfry_store::StoreError::Full { detail }) => {
            tracing::debug!(%detail, "hint update left for lack of memory in redis");
            Ok(())
        }
        other => other,
    }
}

/// What a claim in one partition found.
enum PartClaim {
    Done,
    /// The fence no longer holds: another node took the partition over.
    Fenced,
}

impl RedisStore {
    pub(crate) fn hint_lower(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        p: u16,
        at: i64,
    ) -> Result<()> {
        if at < 0 {
            return Ok(());
        }
        let keys = self.keys.hint_keys(uid);
        let args = self.hint_args(queue, p, at);
        let lowered = self.script(c, &scripts::HINT, &keys, &args, "update a queue's hint");
        hint_left_for_memory(lowered.map(drop))
    }

    /// The hint script's arguments: partition `p` of `queue` has work at `at`, and the
    /// queue's wake message if that lowers its hint.
    pub(crate) fn hint_args(&self, queue: &QueueName, p: u16, at: i64) -> Vec<Vec<u8>> {
        vec![
            at.to_string().into_bytes(),
            p.to_string().into_bytes(),
            self.keys.events().into_bytes(),
            crate::events::wake_message(queue),
        ]
    }

    /// Sets partition `p`'s hint to `earliest` (the truth [`Self::next_due_in`] just read),
    /// then looks at the partition again and lowers it if a put landed meanwhile (its own
    /// hint update may have come before ours), so a wake-up is never lost to the race.
    /// Claims settle through the hint's versions instead (`settle_hints`).
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

    pub(crate) fn earliest(&self, c: &mut Conn, part: &Part) -> Result<i64> {
        let v = self.script(
            c,
            &scripts::READ,
            &part.keys,
            &[b"earliest".to_vec()],
            "read a partition",
        )?;
        as_i64(&v).ok_or_else(|| unexpected("earliest", &v))
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

    /// Claims due tasks of `queue`: in every partition with due work, or (`owned_only`) in
    /// those whose lease this node holds, each claim fenced by the lease's token.
    pub(crate) fn claim_in(
        &self,
        queue: &QueueName,
        want: Want,
        owned_only: bool,
    ) -> Result<ClaimBatch> {
        let mut batch = ClaimBatch::default();
        let ownership = if owned_only {
            self.ownership.as_deref()
        } else {
            None
        };
        self.with_queue(queue, |this, c, uid| {
            if want.max == 0 {
                return Ok(());
            }
            let candidates: Vec<Candidate> = this
                .hint_due(c, uid, want.now_ms)?
                .into_iter()
                .filter_map(|(p, version)| {
                    let fence = match ownership {
                        None => None,
                        Some(own) => Some(own.fence_of(p)?),
                    };
                    Some(Candidate { p, fence, version })
                })
                .collect();
            if candidates.is_empty() {
                return Ok(());
            }
            // Start at a rotating place, so no partition is always last.
            let start = this.next_rotation() % candidates.len();
            let rotated: Vec<&Candidate> = (0..candidates.len())
                .map(|k| &candidates[(start + k) % candidates.len()])
                .collect();
            let mut settle = Vec::new();
            let claimed =
                this.claim_candidates(c, queue, uid, &rotated, want, &mut batch, &mut settle);
            // Whatever the claim did is settled, even when it failed part-way.
            let settled = this.settle_hints(c, uid, &settle);
            claimed?;
            settled
        })?;
        // Claim order across partitions: high priority first, then due time, then id.
        batch
            .leased
            .sort_by_key(|t| (t.task.priority, t.task.due_at_ms, t.task.id));
        Ok(batch)
    }

    /// Claims across `rotated`, and adds what each visited partition's hint entry should
    /// become to `settle`. Pipelined in windows of growing size (a claim that the first
    /// partitions fill costs a few calls, one spread thin over many partitions a few round
    /// trips more); one partition at a time when there is only one, or when a node lacked the
    /// scripts (this once).
    #[allow(clippy::too_many_arguments)] // one claim: the queue, where, what, and its results
    fn claim_candidates(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        rotated: &[&Candidate],
        want: Want,
        batch: &mut ClaimBatch,
        settle: &mut Vec<Settle>,
    ) -> Result<()> {
        let left = |batch: &ClaimBatch| want.max.saturating_sub(batch.leased.len());
        if rotated.len() > 1 {
            let (mut from, mut window) = (0, FIRST_WINDOW);
            while from < rotated.len() && left(batch) > 0 {
                let to = (from + window).min(rotated.len());
                let want = Want {
                    max: left(batch),
                    ..want
                };
                if !self.claim_across(c, queue, uid, &rotated[from..to], want, batch, settle)? {
                    break;
                }
                from = to;
                window *= 4;
            }
            if from >= rotated.len() || left(batch) == 0 {
                return Ok(());
            }
        }
        for cand in rotated {
            if left(batch) == 0 {
                break;
            }
            let want = Want {
                max: left(batch),
                ..want
            };
            if let PartClaim::Fenced = self.claim_part(c, queue, uid, cand, want, batch, settle)? {
                tracing::debug!(%queue, partition = cand.p, "claim refused: the partition has a new owner");
            }
        }
        Ok(())
    }

    /// The partitions whose hint entry is due by `now`, each with its version (see
    /// `lua/hint_claim.lua`).
    fn hint_due(&self, c: &mut Conn, uid: u64, now: UnixMs) -> Result<Vec<(u16, Vec<u8>)>> {
        let keys = self.keys.hint_keys(uid);
        let args = [b"due".to_vec(), now.to_string().into_bytes()];
        let v = self.script(c, &scripts::HINT_CLAIM, &keys, &args, "read a queue's hint")?;
        let bad = || unexpected("hint due", &v);
        let items = as_array(&v).ok_or_else(bad)?;
        items
            .chunks(2)
            .map(|pair| match pair {
                [p, version] => {
                    let p = as_i64(p).and_then(|p| u16::try_from(p).ok());
                    let version = as_bytes(version).map(<[u8]>::to_vec);
                    p.zip(version).ok_or_else(bad)
                }
                _ => Err(bad()),
            })
            .collect()
    }

    /// Sets the hint entry of every partition a claim visited to what it found, where no
    /// lowering came between (see `lua/hint_claim.lua`): one call, whatever the count.
    fn settle_hints(&self, c: &mut Conn, uid: u64, settle: &[Settle]) -> Result<()> {
        if settle.is_empty() {
            return Ok(());
        }
        let keys = self.keys.hint_keys(uid);
        let mut args = Vec::with_capacity(1 + settle.len() * 3);
        args.push(b"settle".to_vec());
        for s in settle {
            args.push(s.p.to_string().into_bytes());
            args.push(s.version.clone());
            args.push(s.earliest.to_string().into_bytes());
        }
        let settled = self.script(
            c,
            &scripts::HINT_CLAIM,
            &keys,
            &args,
            "update a queue's hint",
        );
        hint_left_for_memory(settled.map(drop))
    }

    #[allow(clippy::too_many_arguments)] // one partition's claim: the queue, where, what, and its results
    fn claim_part(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        cand: &Candidate,
        want: Want,
        batch: &mut ClaimBatch,
        settle: &mut Vec<Settle>,
    ) -> Result<PartClaim> {
        let fence = cand.fence.as_deref();
        let args = [
            want.now_ms.to_string().into_bytes(),
            want.max.to_string().into_bytes(),
            want.visibility_ms.to_string().into_bytes(),
            self.retention_ms.to_string().into_bytes(),
            fence.unwrap_or_default().as_bytes().to_vec(),
        ];
        let mut keys = self.part(cand.p, uid).keys;
        if fence.is_some() {
            keys.push(self.keys.owner(cand.p).into_bytes());
        }
        let v = self.script(c, &scripts::CLAIM, &keys, &args, "claim due tasks")?;
        match self.take_claimed(&v, queue, uid, cand.p, want.now_ms, batch)? {
            None => Ok(PartClaim::Fenced),
            Some(earliest) => {
                settle.push(Settle {
                    p: cand.p,
                    version: cand.version.clone(),
                    earliest,
                });
                Ok(PartClaim::Done)
            }
        }
    }

    /// Reads one claim script's reply into `batch`: the partition's earliest work after it,
    /// or `None` when the fence no longer held (another node owns the partition now).
    pub(crate) fn take_claimed(
        &self,
        v: &Value,
        queue: &QueueName,
        uid: u64,
        p: u16,
        now_ms: UnixMs,
        batch: &mut ClaimBatch,
    ) -> Result<Option<i64>> {
        let bad = || unexpected("claim", v);
        let items = as_array(v).ok_or_else(bad)?;
        if let [refused] = items {
            return match as_i64(refused) {
                Some(-1) => {
                    crate::ownership::fence_refused_by_redis();
                    Ok(None)
                }
                _ => Err(bad()),
            };
        }
        let [leased, skipped, dead, earliest, expired] = items else {
            return Err(bad());
        };
        batch.leases_expired += as_i64(expired).ok_or_else(bad)?.max(0) as u64;
        for pair in as_array(leased).ok_or_else(bad)?.chunks(2) {
            let [seq, rec] = pair else {
                return Err(bad());
            };
            let seq = as_seq(seq).ok_or_else(bad)?;
            let record = decode(as_bytes(rec).ok_or_else(bad)?)?;
            let lease_until_ms = record.lease_until_ms;
            let lease_id = crate::keys::lease_id(p, record.lease_id);
            let task = to_task(record, task_id(uid, p, seq), queue, None, now_ms, true);
            batch.leased.push(LeasedTask {
                task,
                lease_id,
                lease_until_ms,
            });
        }
        for seq in as_array(skipped).ok_or_else(bad)? {
            batch
                .late_skipped
                .push(task_id(uid, p, as_seq(seq).ok_or_else(bad)?));
        }
        for seq in as_array(dead).ok_or_else(bad)? {
            batch
                .late_dead
                .push(task_id(uid, p, as_seq(seq).ok_or_else(bad)?));
        }
        Ok(Some(as_i64(earliest).ok_or_else(bad)?))
    }

    /// The earliest instant a claim could return something: over every partition, or
    /// (`owned_only`) over those this node owns.
    pub(crate) fn next_due_in(
        &self,
        queue: &QueueName,
        owned_only: bool,
    ) -> Result<Option<UnixMs>> {
        let ownership = if owned_only {
            self.ownership.as_deref()
        } else {
            None
        };
        self.with_queue(queue, |this, c, uid| {
            // The hint may be early (work taken by a call that does not settle it): check the
            // first partition's truth and settle until the first entry is true.
            for _ in 0..16 {
                let first = match ownership {
                    None => this.hint_first(c, uid)?,
                    Some(own) => this
                        .hint_all(c, uid)?
                        .into_iter()
                        .find(|(p, _)| own.is_owned(*p)),
                };
                let Some((p, at)) = first else {
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

    /// The whole hint, earliest first (at most one entry per partition).
    fn hint_all(&self, c: &mut Conn, uid: u64) -> Result<Vec<(u16, i64)>> {
        let v: Vec<(u16, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys.hint(uid))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(c.as_dyn())
            .map_err(|e| map_error(e, "read a queue's hint"))?;
        Ok(v.into_iter().map(|(p, at)| (p, at as i64)).collect())
    }

    /// The fallback sweep: for every queue, every partition this node owns (all of them
    /// without ownership) has its earliest work written into the queue's hint again, so work
    /// whose hint update a crash lost (between a put's script and its hint) is found. At most
    /// once per [`SWEEP_EVERY`]; it costs one script call per queue and partition.
    pub(crate) fn sweep_hints(&self) -> Result<()> {
        {
            let mut last = self.last_sweep.lock();
            if last.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return Ok(());
            }
            *last = Some(std::time::Instant::now());
        }
        let [registry, _] = self.keys.registry();
        let queues: Vec<(String, Vec<u8>)> = self.pool.with("list queues", |c| {
            redis::cmd("HGETALL").arg(&registry).query(c.as_dyn())
        })?;
        let ownership = self.ownership.as_deref();
        let mut out = Ok(());
        self.pool.with("sweep the hints", |c| {
            out = (|| {
                for (name, raw) in &queues {
                    let (Ok(queue), Some(uid)) = (
                        QueueName::new(name),
                        raw.get(..8).and_then(crate::keys::seq_of),
                    ) else {
                        continue;
                    };
                    let owned: Vec<u16> = (0..self.keys.partitions)
                        .filter(|&p| ownership.is_none_or(|own| own.is_owned(p)))
                        .collect();
                    // One pipeline reads every owned partition's earliest work, one more
                    // lowers the hint where it is later (and wakes the nodes if so).
                    let reads = owned
                        .iter()
                        .map(|&p| {
                            crate::claim_many::evalsha(
                                &scripts::READ,
                                &self.part(p, uid).keys,
                                &[b"earliest".to_vec()],
                            )
                        })
                        .collect();
                    let earliest = match crate::conn::pipeline(c, reads) {
                        Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                            self.load_scripts(c)?;
                            return Ok(());
                        }
                        other => other.map_err(|e| map_error(e, "sweep the hints"))?,
                    };
                    let hint = self.keys.hint_keys(uid);
                    let lowers: Vec<redis::Cmd> = owned
                        .iter()
                        .zip(&earliest)
                        .filter_map(|(&p, at)| {
                            let at = as_i64(at).filter(|&at| at >= 0)?;
                            let args = [
                                at.to_string().into_bytes(),
                                p.to_string().into_bytes(),
                                self.keys.events().into_bytes(),
                                crate::events::wake_message(&queue),
                            ];
                            Some(crate::claim_many::evalsha(&scripts::HINT, &hint, &args))
                        })
                        .collect();
                    // Lowering a hint twice is lowering it once: after a NOSCRIPT (a node
                    // lost the scripts since the reads), all of them go again.
                    match crate::conn::pipeline(c, lowers.clone()) {
                        Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                            self.load_scripts(c)?;
                            crate::conn::pipeline(c, lowers)
                        }
                        other => other,
                    }
                    .map_err(|e| map_error(e, "sweep the hints"))?;
                }
                Ok(())
            })();
            Ok(())
        })?;
        out
    }
}

/// How often the fallback sweep runs at most (resyncs come more often; see `resync_every`).
pub(crate) const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
