//! Subscriber sets: a set's members in one sorted set (`{ns/s<set>}`, score 0, members the
//! encoded user ids, which sort as `UserId`s do, so pages are `ZRANGE … BYLEX`), and each
//! user's sets in a small sorted set of their own (`{ns/u<p>}:<user>`, members 8-byte set
//! numbers). The two are written by one pipeline but in different slots: a crash between may
//! leave a user's index naming a set they are not in (or no longer in after `drop_set`), so
//! `user_sets` checks each set it returns against the set itself and removes stale entries.
//! The reverse (a member missing from its user's index) can follow a crash mid-subscribe;
//! subscribing again repairs it.

use belfry_core::UserId;
use belfry_store::StoreError;
use redis::Value;

use crate::conn::{pipeline, unexpected, Pool, Result};
use crate::keys::Keys;
use crate::reply::as_i64;

/// Members per pipeline: bounds the size of one request and of one reply.
const CHUNK: usize = 10_000;

fn set_bytes(set: u64) -> [u8; 8] {
    set.to_be_bytes()
}

fn change(pool: &Pool, keys: &Keys, set: u64, users: &[UserId], add: bool) -> Result<u64> {
    let set_key = keys.set(set);
    let mut changed = 0u64;
    // Each user once, in id order: (encoded id, the user's index key).
    let mut unique: Vec<(Vec<u8>, Vec<u8>)> =
        users.iter().map(|u| (u.encode(), keys.user(u))).collect();
    unique.sort();
    unique.dedup();
    for chunk in unique.chunks(CHUNK) {
        let mut cmds = Vec::with_capacity(chunk.len() + 1);
        let mut members = if add {
            let mut c = redis::cmd("ZADD");
            c.arg(&set_key);
            c
        } else {
            let mut c = redis::cmd("ZREM");
            c.arg(&set_key);
            c
        };
        for (user, _) in chunk {
            if add {
                members.arg(0);
            }
            members.arg(user.as_slice());
        }
        cmds.push(members);
        // A subscribe writes the set first, then the index; an unsubscribe the index is left
        // to `user_sets` to clean when the set no longer has the user.
        if add {
            for (_, user_key) in chunk {
                let mut c = redis::cmd("ZADD");
                c.arg(user_key.as_slice()).arg(0).arg(&set_bytes(set)[..]);
                cmds.push(c);
            }
        } else {
            for (_, user_key) in chunk {
                let mut c = redis::cmd("ZREM");
                c.arg(user_key.as_slice()).arg(&set_bytes(set)[..]);
                cmds.push(c);
            }
        }
        let replies = pool.with("change a subscriber set", |c| pipeline(c, cmds))?;
        let first = replies.first().and_then(as_i64);
        changed +=
            first.ok_or_else(|| unexpected("subscribe", &Value::Array(replies.clone())))? as u64;
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
    let key = keys.set(set);
    let score: Option<f64> = pool.with("read a subscriber set", |c| {
        redis::cmd("ZSCORE")
            .arg(&key)
            .arg(user.encode())
            .query(c.as_dyn())
    })?;
    Ok(score.is_some())
}

pub(crate) fn count(pool: &Pool, keys: &Keys, set: u64) -> Result<u64> {
    let key = keys.set(set);
    let n: u64 = pool.with("count a subscriber set", |c| {
        redis::cmd("ZCARD").arg(&key).query(c.as_dyn())
    })?;
    Ok(n)
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
    let key = keys.set(set);
    let from = match after {
        Some(user) => {
            let mut from = b"(".to_vec();
            from.extend_from_slice(&user.encode());
            from
        }
        None => b"-".to_vec(),
    };
    let raw: Vec<Vec<u8>> = pool.with("read a subscriber set", |c| {
        redis::cmd("ZRANGE")
            .arg(&key)
            .arg(from.as_slice())
            .arg("+")
            .arg("BYLEX")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query(c.as_dyn())
    })?;
    raw.iter()
        .map(|m| {
            UserId::decode(m).ok_or_else(|| StoreError::Corrupt {
                location: format!("redis subscriber set {key}"),
                detail: "a member that is not an encoded user id".into(),
            })
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
                c.arg(keys.set(set)).arg(member.as_slice());
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
    let key = keys.set(set);
    let mut card = redis::cmd("ZCARD");
    card.arg(&key);
    let mut unlink = redis::cmd("UNLINK");
    unlink.arg(&key);
    // Both commands name one key, so one node answers them in order.
    let replies = pool.with("drop a subscriber set", |c| pipeline(c, vec![card, unlink]))?;
    replies
        .first()
        .and_then(as_i64)
        .map(|n| n as u64)
        .ok_or_else(|| unexpected("drop set", &Value::Array(replies.clone())))
}
