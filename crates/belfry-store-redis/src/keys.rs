//! Key names. Every key carries a hash tag, so each script touches one slot:
//!
//! | key | what |
//! |---|---|
//! | `{ns/p}:uid:h` … `:c` | one queue's tasks in partition `p` (see `lua/prelude.lua`) |
//! | `{ns/p}:uid:b:<minute>` | the far-future bucket of one due minute: a LIST of sequences |
//! | `{ns/p}:own` | the partition's owner lease: `node/token`, with an expiry |
//! | `{ns/p}:fence` | the partition's fencing-token counter |
//! | `{ns/q}:nodes` | live nodes: node id -> heartbeat expiry, ms of Redis `TIME` (`ownership.rs`) |
//! | `{ns/q}:queues`, `{ns/q}:uid`, `{ns/q}:cfg` | queue registry, queue uid counter, settings |
//! | `{ns/h<uid>}` | a queue's hint: partition -> earliest instant a claim there returns work |
//! | `{ns/i<uid>}`, `:w`, `:n` | a queue's in-flight leases and reservations by deadline, the callers waiting for room, the places reservations hold (`lua/inflight.lua`) |
//! | `{ns/m}:<namespace>` | small metadata, one hash per namespace |
//! | `{ns/s<set>}` | a subscriber set's members (ZSET, score 0, by encoded user id) |
//! | `{ns/u<p>}:<user>` | a user's sets (ZSET, score 0, by 8-byte set number) |

use belfry_core::{LeaseId, TaskId, UserId};

/// Task keys of one queue in one partition, in the order the task scripts take them.
pub(crate) const TASK_KEY_SUFFIXES: [&str; 11] =
    ["h", "n", "l", "t", "k", "x", "r", "f", "s", "b", "c"];

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    ns: String,
    pub(crate) partitions: u16,
}

impl Keys {
    pub(crate) fn new(ns: &str, partitions: u16) -> Keys {
        Keys {
            ns: ns.to_owned(),
            partitions,
        }
    }

    pub(crate) fn tag(&self, p: u16) -> String {
        format!("{{{}/{p}}}", self.ns)
    }

    pub(crate) fn task_keys(&self, p: u16, uid: u64) -> Vec<Vec<u8>> {
        let tag = self.tag(p);
        TASK_KEY_SUFFIXES
            .iter()
            .map(|s| format!("{tag}:{uid}:{s}").into_bytes())
            .collect()
    }

    /// The far-future bucket lists of partition `p` named by `buckets` (the members of the
    /// bucket index `{ns/p}:uid:b`).
    pub(crate) fn bucket_lists(&self, p: u16, uid: u64, buckets: &[String]) -> Vec<Vec<u8>> {
        let tag = self.tag(p);
        buckets
            .iter()
            .map(|b| format!("{tag}:{uid}:b:{b}").into_bytes())
            .collect()
    }

    pub(crate) fn owner(&self, p: u16) -> String {
        format!("{}:own", self.tag(p))
    }

    pub(crate) fn fence(&self, p: u16) -> String {
        format!("{}:fence", self.tag(p))
    }

    pub(crate) fn registry(&self) -> [String; 2] {
        [
            format!("{{{}/q}}:queues", self.ns),
            format!("{{{}/q}}:uid", self.ns),
        ]
    }

    pub(crate) fn settings(&self) -> String {
        format!("{{{}/q}}:cfg", self.ns)
    }

    pub(crate) fn hint(&self, uid: u64) -> String {
        format!("{{{}/h{uid}}}", self.ns)
    }

    pub(crate) fn rate(&self, uid: u64) -> String {
        format!("{{{}/r{uid}}}", self.ns)
    }

    /// The queue's shared in-flight leases and reservations, the callers waiting for room, and
    /// the places reservations hold beyond their one member (`lua/inflight.lua`).
    pub(crate) fn in_flight(&self, uid: u64) -> [String; 3] {
        let set = format!("{{{}/i{uid}}}", self.ns);
        let starved = format!("{set}:w");
        let extra = format!("{set}:n");
        [set, starved, extra]
    }

    pub(crate) fn meta(&self, namespace: &str) -> String {
        format!("{{{}/m}}:{namespace}", self.ns)
    }

    /// The pub/sub channel of the namespace's [`belfry_store::StoreEvent`]s.
    pub(crate) fn events(&self) -> String {
        format!("belfry:{}:events", self.ns)
    }

    pub(crate) fn set(&self, set: u64) -> String {
        format!("{{{}/s{set}}}", self.ns)
    }

    pub(crate) fn user(&self, user: &UserId) -> Vec<u8> {
        let encoded = user.encode();
        let p = crate::partition_of(&encoded, self.partitions);
        let mut key = format!("{{{}/u{p}}}:", self.ns).into_bytes();
        key.extend_from_slice(&encoded);
        key
    }
}

/// A task id: the queue's uid (32 bits), 16 unused bits (zero), the partition (16 bits) and
/// the sequence within the partition (64 bits), so ids sort by partition, then submit order.
pub(crate) fn task_id(uid: u64, p: u16, seq: u64) -> TaskId {
    TaskId(((uid as u128) << 96) | ((p as u128) << 64) | seq as u128)
}

/// The partition and 8-byte sequence of `id`, if it belongs to queue `uid` in a store of
/// `partitions` partitions.
pub(crate) fn split_id(id: TaskId, uid: u64, partitions: u16) -> Option<(u16, [u8; 8])> {
    let raw = id.0;
    let unused = (raw >> 80) & 0xffff;
    let p = ((raw >> 64) & 0xffff) as u16;
    if (raw >> 96) as u64 != uid || unused != 0 || p >= partitions {
        return None;
    }
    Some((p, (raw as u64).to_be_bytes()))
}

pub(crate) fn seq_of(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// A lease id as callers see it: the partition in the top 16 bits, the partition's counter
/// (which the scripts compare) below, so lease ids differ across partitions as they do
/// across tasks of one partition.
pub(crate) fn lease_id(p: u16, counter: u64) -> LeaseId {
    LeaseId((u64::from(p) << 48) | (counter & LEASE_COUNTER_MASK))
}

/// The counter a script compares for a lease id given for a task in partition `p`; 0 (which
/// no lease has) when the id names another partition, so the lease reads as expired.
pub(crate) fn lease_counter(lease: LeaseId, p: u16) -> u64 {
    if lease.0 >> 48 == u64::from(p) {
        lease.0 & LEASE_COUNTER_MASK
    } else {
        0
    }
}

const LEASE_COUNTER_MASK: u64 = (1 << 48) - 1;
