//! Subscriber sets. A set's members are cut into `subscriber_shards` shards by a stable hash
//! of the encoded user id (`keys::shard_of`); each shard is a sorted set with a hash tag of
//! its own (`Keys::set_shard`: score 0, members the encoded user ids, which sort as `UserId`s
//! do), so a set of millions spreads its memory and its reads over the cluster's masters. A
//! page of members merges per-shard `ZRANGE … BYLEX` pages (`subs_page.rs`); a count sums the
//! shards' `ZCARD`s. Each user's sets sit in a small sorted set of their own
//! (`{ns/u<p>}:<user>`, members 8-byte set numbers). A user's shard and index entry are
//! written by one pipeline but in different slots: a crash between may leave a user's index
//! naming a set they are not in (or no longer in after `drop_set`), so `user_sets` checks
//! each set it returns against the set's shard of that user and removes stale entries. The
//! reverse (a member missing from its user's index) can follow a crash mid-subscribe;
//! subscribing again repairs it.

use belfry_core::UserId;
use belfry_store::StoreError;
use redis::Value;

use crate::conn::{pipeline, unexpected, Pool, Result};
use crate::keys::{shard_of, Keys};
use crate::reply::as_i64;

/// Members per pipeline: bounds the size of one request and of one reply.
const CHUNK: usize = 10_000;

fn set_bytes(set: u64) -> [u8; 8] {
    set.to_be_bytes()
}

fn change(pool: &Pool, keys: &Keys, set: u64, users: &[UserId], add: bool) -> Result<u64> {
    let shards = keys.set_shards(set);
    let mut changed = 0u64;
    // Each user once, in id order: (encoded id, the user's index key).
    let mut unique: Vec<(Vec<u8>, Vec<u8>)> =
        users.iter().map(|u| (u.encode(), keys.user(u))).collect();
    unique.sort();
    unique.dedup();
    for chunk in unique.chunks(CHUNK) {
        // One ZADD or ZREM per shard the chunk touches, then one per user's index.
        let mut by_shard: Vec<Option<redis::Cmd>> = shards.iter().map(|_| None).collect();
        for (user, _) in chunk {
            let k = usize::from(shard_of(user, keys.subscriber_shards));
            let c = by_shard[k].get_or_insert_with(|| {
                let mut c = redis::cmd(if add { "ZADD" } else { "ZREM" });
                c.arg(&shards[k]);
                c
            });
            if add {
                c.arg(0);
            }
            c.arg(user.as_slice());
        }
        let mut cmds: Vec<redis::Cmd> = by_shard.into_iter().flatten().collect();
        let member_cmds = cmds.len();
        cmds.reserve(chunk.len());
        // The set's shards come first (a node applies its commands in order), but masters
        // apply theirs independently: a crash may leave either half, which the module docs
        // say how to repair.
        for (_, user_key) in chunk {
            let mut c = redis::cmd(if add { "ZADD" } else { "ZREM" });
            c.arg(user_key.as_slice());
            if add {
                c.arg(0);
            }
            c.arg(&set_bytes(set)[..]);
            cmds.push(c);
        }
        let replies = pool.with("change a subscriber set", |c| pipeline(c, cmds))?;
        changed += sum_counts(&replies, member_cmds, "change a subscriber set")?;
    }
    Ok(changed)
}

pub(crate) fn subscribe(pool: &Pool, keys: &Keys, set: u64, users: &[UserId]) -> Result<u64> {
    change(pool, keys, set, users, true)
}

pub(crate) fn unsubscribe(pool: &Pool, keys: &Keys, set: u64, users: &[UserId]) -> Result<u64> {
    change(pool, keys, set, users, false)
}

pub(crate) fn is_subscribed(pool: &Pool, keys: &Keys, set: u64, user: &UserId) -> Result<bool> {
    let member = user.encode();
    let key = keys.member_shard(set, &member);
    let score: Option<f64> = pool.with("read a subscriber set", |c| {
        redis::cmd("ZSCORE").arg(&key).arg(member).query(c.as_dyn())
    })?;
    Ok(score.is_some())
}

/// Sums the first `n` replies (counts) of `replies`.
fn sum_counts(replies: &[Value], n: usize, context: &str) -> Result<u64> {
    let counts = replies.get(..n).unwrap_or_default();
    if counts.len() < n {
        return Err(unexpected(context, &Value::Array(replies.to_vec())));
    }
    counts.iter().try_fold(0u64, |sum, reply| {
        as_i64(reply)
            .filter(|n| *n >= 0)
            .map(|n| sum + n as u64)
            .ok_or_else(|| unexpected(context, reply))
    })
}

pub(crate) fn count(pool: &Pool, keys: &Keys, set: u64) -> Result<u64> {
    let cmds: Vec<redis::Cmd> = keys
        .set_shards(set)
        .iter()
        .map(|key| {
            let mut c = redis::cmd("ZCARD");
            c.arg(key);
            c
        })
        .collect();
    let n = cmds.len();
    let replies = pool.with("count a subscriber set", |c| pipeline(c, cmds))?;
    sum_counts(&replies, n, "count a subscriber set")
}

/// Sets counted per pipeline by [`counts`].
const COUNT_SETS_PER_CALL: usize = 256;

/// The member counts of `sets`, in order: one pipeline of every shard's `ZCARD` per
/// [`COUNT_SETS_PER_CALL`] sets.
pub(crate) fn counts(pool: &Pool, keys: &Keys, sets: &[u64]) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(sets.len());
    for chunk in sets.chunks(COUNT_SETS_PER_CALL) {
        let shards: Vec<Vec<String>> = chunk.iter().map(|set| keys.set_shards(*set)).collect();
        let cmds: Vec<redis::Cmd> = shards
            .iter()
            .flatten()
            .map(|key| {
                let mut c = redis::cmd("ZCARD");
                c.arg(key);
                c
            })
            .collect();
        let replies = pool.with("count subscriber sets", |c| pipeline(c, cmds))?;
        let mut at = 0;
        for set_shards in &shards {
            let n = set_shards.len();
            let rest = replies.get(at..).unwrap_or_default();
            out.push(sum_counts(rest, n, "count subscriber sets")?);
            at += n;
        }
    }
    Ok(out)
}

pub(crate) fn members(
    pool: &Pool,
    keys: &Keys,
    set: u64,
    after: Option<&UserId>,
    limit: usize,
) -> Result<Vec<UserId>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let shards = keys.set_shards(set);
    let after = after.map(UserId::encode);
    let raw = crate::subs_page::page(shards.len(), after.as_deref(), limit, |reads| {
        read_shards(pool, &shards, reads)
    })?;
    raw.iter()
        .map(|m| {
            UserId::decode(m).ok_or_else(|| StoreError::Corrupt {
                location: format!("redis subscriber set {set}"),
                detail: "a member that is not an encoded user id".into(),
            })
        })
        .collect()
}

/// One round of a page's reads: one `ZRANGE … BYLEX LIMIT` per read, in one pipeline (which
/// a cluster sends to each master at once).
fn read_shards(
    pool: &Pool,
    shards: &[String],
    reads: &[crate::subs_page::Read],
) -> Result<Vec<Vec<Vec<u8>>>> {
    let cmds: Vec<redis::Cmd> = reads
        .iter()
        .map(|r| {
            let from = match &r.after {
                Some(after) => [&b"("[..], after].concat(),
                None => b"-".to_vec(),
            };
            let mut c = redis::cmd("ZRANGE");
            c.arg(&shards[r.shard])
                .arg(from)
                .arg("+")
                .arg("BYLEX")
                .arg("LIMIT")
                .arg(0)
                .arg(r.count.min(i64::MAX as usize));
            c
        })
        .collect();
    let replies = pool.with("read a subscriber set", |c| pipeline(c, cmds))?;
    if replies.len() != reads.len() {
        return Err(unexpected("read a subscriber set", &Value::Array(replies)));
    }
    // Owned: the members move out of the reply rather than being copied.
    replies
        .into_iter()
        .map(|reply| match reply {
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::BulkString(member) => Ok(member),
                    other => Err(unexpected("read a subscriber set", &other)),
                })
                .collect(),
            other => Err(unexpected("read a subscriber set", &other)),
        })
        .collect()
}

pub(crate) fn user_sets(pool: &Pool, keys: &Keys, user: &UserId, limit: usize) -> Result<Vec<u64>> {
    let user_key = keys.user(user);
    let member = user.encode();
    let mut out = Vec::new();
    let mut from = b"-".to_vec();
    while out.len() < limit {
        let want = (limit - out.len()).max(16);
        let raw: Vec<Vec<u8>> = pool.with("read a user's sets", |c| {
            redis::cmd("ZRANGE")
                .arg(user_key.as_slice())
                .arg(from.as_slice())
                .arg("+")
                .arg("BYLEX")
                .arg("LIMIT")
                .arg(0)
                .arg(want)
                .query(c.as_dyn())
        })?;
        if raw.is_empty() {
            break;
        }
        let sets: Vec<u64> = raw
            .iter()
            .map(|m| {
                <[u8; 8]>::try_from(m.as_slice())
                    .map(u64::from_be_bytes)
                    .map_err(|_| StoreError::Corrupt {
                        location: "redis user index".into(),
                        detail: "a member that is not a set number".into(),
                    })
            })
            .collect::<Result<_>>()?;
        let checks = sets
            .iter()
            .map(|&set| {
                let mut c = redis::cmd("ZSCORE");
                c.arg(keys.member_shard(set, &member))
                    .arg(member.as_slice());
                c
            })
            .collect();
        let found = pool.with("check a user's sets", |c| pipeline(c, checks))?;
        let mut stale = Vec::new();
        for (set, reply) in sets.iter().zip(&found) {
            if matches!(reply, Value::Nil) {
                stale.push(*set);
            } else if out.len() < limit {
                out.push(*set);
            }
        }
        if !stale.is_empty() {
            let mut c = redis::cmd("ZREM");
            c.arg(user_key.as_slice());
            for set in &stale {
                c.arg(&set_bytes(*set)[..]);
            }
            // Repair only; the answer does not depend on it.
            let _ = pool.with("clean a user's index", |con| pipeline(con, vec![c]));
        }
        let last = raw.last().cloned().unwrap_or_default();
        from = b"(".to_vec();
        from.extend_from_slice(&last);
        if raw.len() < want {
            break;
        }
    }
    Ok(out)
}

pub(crate) fn drop_set(pool: &Pool, keys: &Keys, set: u64) -> Result<u64> {
    let shards = keys.set_shards(set);
    let mut cmds = Vec::with_capacity(2 * shards.len());
    for key in &shards {
        let mut c = redis::cmd("ZCARD");
        c.arg(key);
        cmds.push(c);
    }
    for key in &shards {
        let mut c = redis::cmd("UNLINK");
        c.arg(key);
        cmds.push(c);
    }
    // A shard's ZCARD and UNLINK name one key, so one node answers them in that order.
    let replies = pool.with("drop a subscriber set", |c| pipeline(c, cmds))?;
    sum_counts(&replies, shards.len(), "drop set")
}
