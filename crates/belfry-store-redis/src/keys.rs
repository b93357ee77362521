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
//! | `{ns/m}#versions` | hash: each metadata namespace's write count (by its key), for rechecks |
//! | `{ns/s<set>/<k>.<n>}` | shard `k` of a subscriber set: its members whose encoded id hashes to `k` (ZSET, score 0, by encoded user id); `n` places the shard's slot (`Keys::set_shard`) |
//! | `{ns/u<p>}:<user>` | a user's sets (ZSET, score 0, by 8-byte set number) |

use belfry_core::{LeaseId, TaskId, UserId};

/// Task keys of one queue in one partition, in the order the task scripts take them.
pub(crate) const TASK_KEY_SUFFIXES: [&str; 11] =
    ["h", "n", "l", "t", "k", "x", "r", "f", "s", "b", "c"];

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    ns: String,
    pub(crate) partitions: u16,
    /// Shards per subscriber set (`subs.rs`).
    pub(crate) subscriber_shards: u16,
}

impl Keys {
    /// Keys of a store of `partitions` partitions, with unsharded subscriber sets until
    /// [`Keys::set_subscriber_shards`].
    pub(crate) fn new(ns: &str, partitions: u16) -> Keys {
        Keys {
            ns: ns.to_owned(),
            partitions,
            subscriber_shards: 1,
        }
    }

    pub(crate) fn set_subscriber_shards(&mut self, shards: u16) {
        self.subscriber_shards = shards.max(1);
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

    /// The hint and, in its slot, how many times each partition's entry was lowered (or a
    /// lowering tried): `lua/hint.lua` counts, `lua/hint_claim.lua` compares.
    pub(crate) fn hint_keys(&self, uid: u64) -> [Vec<u8>; 2] {
        let hint = self.hint(uid);
        let versions = format!("{hint}:v");
        [hint.into_bytes(), versions.into_bytes()]
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

    /// The HASH of the metadata namespaces' write counts, by their [`Keys::meta`] key, in
    /// the same slot (no `:`, so no namespace's key can be it).
    pub(crate) fn meta_versions(&self) -> String {
        format!("{{{}/m}}#versions", self.ns)
    }

    /// The pub/sub channel of the namespace's [`belfry_store::StoreEvent`]s.
    pub(crate) fn events(&self) -> String {
        format!("belfry:{}:events", self.ns)
    }

    /// Shard `k` of subscriber set `set`: `{ns/s<set>/<k>.<n>}`, with `n` the smallest number
    /// that puts the key in the `k`-th of `subscriber_shards` equal ranges of the 16384 slots
    /// (0 if none of the first few thousand does). A cluster made by `redis-cli --cluster
    /// create` gives each master one run of slots, so the shards of every set spread evenly
    /// over the masters rather than by chance (with 16 shards over 3 masters, chance alone puts
    /// 7 or more on one master three times in four).
    pub(crate) fn set_shard(&self, set: u64, k: u16) -> String {
        let shards = u32::from(self.subscriber_shards);
        let k32 = u32::from(k);
        let slots = k32 * 16384 / shards..(k32 + 1) * 16384 / shards;
        let base = format!("{}/s{set}/{k}.", self.ns);
        // The tag's CRC (its slot) is the base's, carried on over the digits of `n`.
        let mut prefix = crc16::State::<crc16::XMODEM>::new();
        prefix.update(base.as_bytes());
        let mut digits = [0u8; 10];
        let n = (0..64 * shards)
            .find(|n| {
                let mut crc = prefix;
                crc.update(decimal(*n, &mut digits));
                slots.contains(&u32::from(crc.get() % 16384))
            })
            .unwrap_or(0);
        format!("{{{base}{n}}}")
    }

    /// Every shard of subscriber set `set`, shard 0 first.
    pub(crate) fn set_shards(&self, set: u64) -> Vec<String> {
        (0..self.subscriber_shards)
            .map(|k| self.set_shard(set, k))
            .collect()
    }

    /// The shard of `set` that holds the user encoded as `user`.
    pub(crate) fn member_shard(&self, set: u64, user: &[u8]) -> String {
        self.set_shard(set, shard_of(user, self.subscriber_shards))
    }

    pub(crate) fn user(&self, user: &UserId) -> Vec<u8> {
        let encoded = user.encode();
        let p = crate::partition_of(&encoded, self.partitions);
        let mut key = format!("{{{}/u{p}}}:", self.ns).into_bytes();
        key.extend_from_slice(&encoded);
        key
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The subscriber-set shard of an encoded user id: stable across processes and versions,
/// since members are placed by it, and independent of the user's partition
/// ([`crate::partition_of`]), which hashes with other keys.
pub(crate) fn shard_of(user: &[u8], shards: u16) -> u16 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x7375_6273, 0x7368_6172_6473);
    h.write(user);
    (h.finish() % u64::from(shards.max(1))) as u16
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

/// Where a listing in id order resumes for queue `uid`, after the task `after` (the last of
/// the previous page, which need not exist any more): the partition to read first and the
/// sequence there to read after (none: from that partition's start); none when `after` is
/// past every id of the queue. An id of an earlier incarnation starts from the beginning.
pub(crate) fn listing_start(after: Option<TaskId>, uid: u64) -> Option<(u16, Option<u64>)> {
    let Some(id) = after else {
        return Some((0, None));
    };
    let id_uid = (id.0 >> 96) as u64;
    if id_uid < uid {
        return Some((0, None));
    }
    // A later incarnation's id, or one with unused bits set: past every id of this queue.
    if id_uid > uid || (id.0 >> 80) & 0xffff != 0 {
        return None;
    }
    Some((((id.0 >> 64) & 0xffff) as u16, Some(id.0 as u64)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::key_slot;

    #[test]
    fn a_listing_resumes_after_its_cursor() {
        let id = task_id(7, 3, 42);
        assert_eq!(listing_start(None, 7), Some((0, None)));
        assert_eq!(listing_start(Some(id), 7), Some((3, Some(42))));
        // An earlier incarnation's id starts over; a later one's is past this queue.
        assert_eq!(listing_start(Some(id), 8), Some((0, None)));
        assert_eq!(listing_start(Some(id), 6), None);
        assert_eq!(listing_start(Some(TaskId(id.0 | 1 << 80)), 7), None);
    }

    #[test]
    fn each_subscriber_shard_lands_in_its_run_of_slots() {
        for shards in [1u16, 3, 16, 64] {
            let mut keys = Keys::new("belfry", 256);
            keys.set_subscriber_shards(shards);
            for set in [0u64, 7, 123_456_789, u64::MAX] {
                let all = keys.set_shards(set);
                assert_eq!(all.len(), usize::from(shards));
                for (k, key) in all.iter().enumerate() {
                    let slot = usize::from(key_slot(key.as_bytes()));
                    let lo = k * 16384 / usize::from(shards);
                    let hi = (k + 1) * 16384 / usize::from(shards);
                    assert!(
                        (lo..hi).contains(&slot),
                        "{key}: slot {slot} not in {lo}..{hi}"
                    );
                    assert!(key.starts_with(&format!("{{belfry/s{set}/{k}.")), "{key}");
                    // The same name every time: members are placed by it.
                    assert_eq!(keys.set_shard(set, k as u16), *key);
                }
            }
        }
    }

    #[test]
    fn sixteen_shards_put_four_to_six_on_each_of_three_masters() {
        // The slot runs `redis-cli --cluster create` gives three masters.
        let masters = [0..5461, 5461..10923, 10923..16384];
        let mut keys = Keys::new("prod", 256);
        keys.set_subscriber_shards(16);
        for set in 0..2_000u64 {
            let mut per_master = [0; 3];
            for key in keys.set_shards(set) {
                let slot = key_slot(key.as_bytes());
                let m = masters.iter().position(|r| r.contains(&slot)).unwrap();
                per_master[m] += 1;
            }
            assert!(
                per_master.iter().all(|n| (4..=6).contains(n)),
                "set {set}: {per_master:?}"
            );
        }
    }

    #[test]
    fn users_spread_evenly_and_stably_over_shards() {
        let mut per_shard = [0usize; 16];
        for i in 0..16_000u32 {
            let user = UserId::new(format!("user-{i}")).unwrap().encode();
            let k = shard_of(&user, 16);
            assert_eq!(shard_of(&user, 16), k);
            assert_eq!(shard_of(&user, 1), 0);
            per_shard[usize::from(k)] += 1;
        }
        // 1,000 expected per shard; a binomial's standard deviation is about 31.
        assert!(
            per_shard.iter().all(|n| (850..1150).contains(n)),
            "{per_shard:?}"
        );
        // Pinned: a change to the hash would strand every member of every existing store.
        let pinned: Vec<u16> = ["1", "alice", "user-42"]
            .iter()
            .map(|u| shard_of(&UserId::new(*u).unwrap().encode(), 16))
            .collect();
        assert_eq!(pinned, PINNED);
    }

    const PINNED: [u16; 3] = [4, 4, 12];
}
