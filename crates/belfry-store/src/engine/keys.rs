//! The index of live idempotency keys.
//!
//! Keys can be long (up to the API's limit) and a queue may hold many millions of keyed
//! tasks, so memory holds a 64-bit keyed hash of each key, not the key: one `(hash, task id)`
//! pair, about 35 bytes with the tree's overhead, whatever the key's length. A hash only
//! names candidates; the key itself is in the task's put record, and callers confirm a
//! candidate by reading it (only on a hash match, so an insert of a new key reads nothing).
//!
//! The hash is SipHash-1-3 under a 128-bit secret chosen at random when the data directory is
//! created and kept in the checkpoint: clients cannot choose keys that collide on purpose, and
//! the hashes in a checkpoint stay valid across restarts and Rust versions.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};

use belfry_core::TaskId;
use siphasher::sip::SipHasher13;

/// The secret key of the idempotency-key hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHasher {
    pub k0: u64,
    pub k1: u64,
}

impl KeyHasher {
    /// A new random secret, from the operating system's randomness (which `RandomState`
    /// draws on), so no further dependency is needed.
    pub fn random() -> KeyHasher {
        let draw = |salt: u64| std::collections::hash_map::RandomState::new().hash_one(salt);
        KeyHasher {
            k0: draw(0x6b30),
            k1: draw(0x6b31),
        }
    }

    pub fn hash(&self, key: &str) -> u64 {
        let mut hasher = SipHasher13::new_with_keys(self.k0, self.k1);
        hasher.write(key.as_bytes());
        hasher.finish()
    }
}

/// Live keys of one queue: `(hash, task id)` pairs. Two keys with the same hash are both
/// kept; lookups return every task under a hash. The id is stored as two `u64` halves: a
/// `u128` would align each element to 16 bytes (32 with the hash instead of 24).
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    pairs: BTreeSet<(u64, u64, u64)>,
}

fn halves(id: TaskId) -> (u64, u64) {
    ((id.0 >> 64) as u64, id.0 as u64)
}

fn whole(high: u64, low: u64) -> TaskId {
    TaskId((u128::from(high) << 64) | u128::from(low))
}

impl KeyIndex {
    pub fn insert(&mut self, hash: u64, id: TaskId) {
        let (high, low) = halves(id);
        self.pairs.insert((hash, high, low));
    }

    pub fn remove(&mut self, hash: u64, id: TaskId) {
        let (high, low) = halves(id);
        self.pairs.remove(&(hash, high, low));
    }

    /// The tasks whose key has this hash: the key asked for is at most one of them.
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = TaskId> + '_ {
        self.pairs
            .range((hash, 0, 0)..=(hash, u64::MAX, u64::MAX))
            .map(|&(_, high, low)| whole(high, low))
    }

    /// Up to `max` pairs in order, starting after `after` (from the first if `None`): lets a
    /// checkpoint copy the index a chunk at a time, releasing the engine lock in between.
    pub fn chunk_after(&self, after: Option<(u64, TaskId)>, max: usize) -> Vec<(u64, TaskId)> {
        use std::ops::Bound;
        let start = match after {
            Some((hash, id)) => {
                let (high, low) = halves(id);
                Bound::Excluded((hash, high, low))
            }
            None => Bound::Unbounded,
        };
        self.pairs
            .range((start, Bound::Unbounded))
            .take(max)
            .map(|&(hash, high, low)| (hash, whole(high, low)))
            .collect()
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, TaskId)> + '_ {
        self.pairs
            .iter()
            .map(|&(hash, high, low)| (hash, whole(high, low)))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pairs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colliding_hashes_keep_every_task() {
        let mut index = KeyIndex::default();
        index.insert(7, TaskId(1));
        index.insert(7, TaskId(2));
        index.insert(8, TaskId(3));
        index.insert(6, TaskId(4));
        index.insert(7, TaskId(u128::MAX));
        let mut under_7: Vec<_> = index.candidates(7).collect();
        under_7.sort();
        assert_eq!(under_7, vec![TaskId(1), TaskId(2), TaskId(u128::MAX)]);
        index.remove(7, TaskId(1));
        index.remove(7, TaskId(u128::MAX));
        assert_eq!(index.candidates(7).collect::<Vec<_>>(), vec![TaskId(2)]);
        // Removing a pair that is not there (another task's id) changes nothing.
        index.remove(8, TaskId(99));
        assert_eq!(index.candidates(8).collect::<Vec<_>>(), vec![TaskId(3)]);
        assert_eq!(index.len(), 3);
        assert_eq!(index.candidates(u64::MAX).count(), 0);
    }

    /// SipHash-1-3 of the bytes of "belfry" under the all-zero key (checked against an
    /// independent implementation of the reference algorithm).
    const KNOWN_ANSWER: u64 = 0xca90_6f52_9939_0b98;

    #[test]
    fn chunks_cover_the_index_once_in_order() {
        let mut index = KeyIndex::default();
        for i in 0..10u64 {
            index.insert(i % 3, TaskId(u128::from(i) << 64 | 7));
        }
        let mut copied = Vec::new();
        let mut after = None;
        loop {
            let chunk = index.chunk_after(after, 4);
            let Some(&last) = chunk.last() else { break };
            after = Some(last);
            copied.extend(chunk);
        }
        assert_eq!(copied, index.iter().collect::<Vec<_>>());
        assert_eq!(copied.len(), 10);
    }

    #[test]
    fn the_hash_depends_on_the_secret_and_is_stable_for_it() {
        let a = KeyHasher { k0: 1, k1: 2 };
        let b = KeyHasher { k0: 1, k1: 3 };
        assert_eq!(a.hash("order-1"), a.hash("order-1"));
        assert_ne!(a.hash("order-1"), a.hash("order-2"));
        assert_ne!(a.hash("order-1"), b.hash("order-1"));
        // SipHash-1-3 is specified: this value must never change, or checkpoints written
        // before the change would name the wrong tasks.
        assert_eq!(
            KeyHasher { k0: 0, k1: 0 }.hash("belfry"),
            KNOWN_ANSWER,
            "{:#x}",
            KeyHasher { k0: 0, k1: 0 }.hash("belfry")
        );
        assert_ne!(KeyHasher::random(), KeyHasher::random());
    }
}
