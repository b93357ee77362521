//! A claim across many partitions in a few round trips instead of several per partition.
//!
//! With 256 partitions a queue's due work is spread over dozens of them, and claiming them one
//! after another (script, hint update, re-read) made firing lateness grow with the number of
//! partitions. Here every step is one pipeline (in a cluster, one round trip per master):
//!
//! 1. how many tasks each candidate partition has due (and, where none, its earliest work);
//! 2. the claim's size shared out over them in rotation order, and one claim script each;
//! 3. (`claim.rs`, once for all windows) the hint entry of every partition visited set to
//!    what its script (or step 1) found, unless a lowering came in between: the versions
//!    `lua/hint_claim.lua` describes, read with the hint before step 1.
//!
//! Scripts run by `EVALSHA` only: a node that does not have them (new, restarted, promoted)
//! answers `NOSCRIPT` in step 1, which changes nothing; the scripts are then loaded on every
//! master and the caller claims one partition at a time this once. Step 2 reads each
//! reply on its own (`each.rs`): a node that lost the scripts after step 1 answers `NOSCRIPT`
//! for its own calls only, and only those run again, so no claimed task is dropped.

use belfry_core::QueueName;
use belfry_store::ClaimBatch;
use redis::{ErrorKind, Value};

use crate::claim::{Candidate, Settle, Want};
use crate::conn::{map_error, pipeline, unexpected, Conn, Result};
use crate::each::{pipeline_each, ScriptCall};
use crate::reply::{as_array, as_i64};
use crate::scripts::{self, Lua};
use crate::store::{Part, RedisStore};

/// An `EVALSHA` of `lua`, for a pipeline.
pub(crate) fn evalsha(lua: &Lua, keys: &[Vec<u8>], args: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&lua.sha).arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// A claim call's keys and arguments.
type OwnedCall = (Vec<Vec<u8>>, Vec<Vec<u8>>);

impl RedisStore {
    /// Claims across `candidates` in rotation order, and adds what each visited partition's
    /// hint entry should become to `settle`. `Ok(false)`: a node lacked the scripts and
    /// nothing changed; the caller claims one partition at a time.
    #[allow(clippy::too_many_arguments)] // one window's claim: the queue, where, what, and its results
    pub(crate) fn claim_across(
        &self,
        c: &mut Conn,
        queue: &QueueName,
        uid: u64,
        candidates: &[&Candidate],
        want: Want,
        batch: &mut ClaimBatch,
        settle: &mut Vec<Settle>,
    ) -> Result<bool> {
        let parts: Vec<Part> = candidates
            .iter()
            .map(|cand| self.part(cand.p, uid))
            .collect();
        let settle_to = |i: usize, earliest: i64| Settle {
            p: candidates[i].p,
            version: candidates[i].version.clone(),
            earliest,
        };
        let now = want.now_ms.to_string().into_bytes();
        let counts = parts
            .iter()
            .map(|part| evalsha(&scripts::READ, &part.keys, &[b"due".to_vec(), now.clone()]))
            .collect();
        let counts = match pipeline(c, counts) {
            Ok(replies) => replies,
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                self.load_scripts(c)?;
                return Ok(false);
            }
            Err(e) => return Err(map_error(e, "count due tasks")),
        };
        let claims = plan_claims(&counts, want.max, |i, earliest| {
            settle.push(settle_to(i, earliest))
        })?;
        let calls = self.claim_calls(&parts, candidates, &claims, &want, &now);
        let cmds: Vec<redis::Cmd> = calls
            .iter()
            .map(|(keys, args)| evalsha(&scripts::CLAIM, keys, args))
            .collect();
        // Each reply on its own: a node that lost the scripts since step 1 answers NOSCRIPT
        // for its claims only, which then run again; the others' tasks are leased already.
        let replies = pipeline_each(c, &cmds).map_err(|e| map_error(e, "claim due tasks"))?;
        let each: Vec<ScriptCall<'_>> = calls
            .iter()
            .map(|(keys, args)| (keys.as_slice(), args.as_slice()))
            .collect();
        let replies = self.rerun_missing(c, &scripts::CLAIM, replies, &each, "claim due tasks")?;
        for (&(i, _), reply) in claims.iter().zip(&replies) {
            if let Some(earliest) =
                self.take_claimed(reply, queue, uid, parts[i].p, want.now_ms, batch)?
            {
                settle.push(settle_to(i, earliest));
            }
        }
        Ok(true)
    }

    /// Each planned claim's keys and arguments: the partition's keys (and its owner key when
    /// the claim is fenced), then now, how many, the visibility, the retention and the fence.
    fn claim_calls(
        &self,
        parts: &[Part],
        candidates: &[&Candidate],
        claims: &[(usize, usize)],
        want: &Want,
        now: &[u8],
    ) -> Vec<OwnedCall> {
        claims
            .iter()
            .map(|&(i, take)| {
                let fence = candidates[i].fence.as_deref();
                let mut keys = parts[i].keys.clone();
                if fence.is_some() {
                    keys.push(self.keys.owner(parts[i].p).into_bytes());
                }
                let args = vec![
                    now.to_vec(),
                    take.to_string().into_bytes(),
                    want.visibility_ms.to_string().into_bytes(),
                    self.retention_ms.to_string().into_bytes(),
                    fence.unwrap_or_default().as_bytes().to_vec(),
                ];
                (keys, args)
            })
            .collect()
    }

    /// Loads every script on every master, so pipelined `EVALSHA`s find them.
    pub(crate) fn load_scripts(&self, c: &mut Conn) -> Result<()> {
        for lua in scripts::all() {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(lua.source);
            let loaded: redis::RedisResult<Value> = match c {
                Conn::Single(con) => cmd.query(con),
                Conn::Cluster(con) => {
                    use redis::cluster_routing::{
                        MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                    };
                    let routing = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    ));
                    con.con.route_command(&cmd, routing)
                }
            };
            loaded.map_err(|e| map_error(e, "load the scripts"))?;
        }
        Ok(())
    }
}

/// From each partition's `[due, earliest]` count, in rotation order, how many to claim where:
/// `(index, take)` until `max` is reached. A partition with nothing due had a stale hint, and
/// `stale(index, earliest)` sets it right.
fn plan_claims(
    counts: &[Value],
    max: usize,
    mut stale: impl FnMut(usize, i64),
) -> Result<Vec<(usize, usize)>> {
    let mut claims = Vec::new();
    let mut left = max;
    for (i, reply) in counts.iter().enumerate() {
        let bad = || unexpected("count due", reply);
        let [due, earliest] = as_array(reply).ok_or_else(bad)? else {
            return Err(bad());
        };
        let due = as_i64(due).ok_or_else(bad)?.max(0) as usize;
        if due == 0 {
            // A stale hint (the work went another way): set it right.
            stale(i, as_i64(earliest).ok_or_else(bad)?);
        } else if left > 0 {
            let take = due.min(left);
            claims.push((i, take));
            left -= take;
        }
    }
    Ok(claims)
}
