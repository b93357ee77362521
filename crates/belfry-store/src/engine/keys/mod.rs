//! The index of live idempotency keys: per queue, a memtable of the keys put since the last
//! checkpoint (this file), and for all queues the runs on disk (`runs.rs`) that checkpoints
//! write the memtables into.
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

pub(crate) mod runs;

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

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

/// The memtable of one queue's keys: `(hash, task id)` pairs put since the last checkpoint.
/// Two keys with the same hash are both kept; lookups return every task under a hash. The id
/// is stored as two `u64` halves (seq, bucket): a `u128` would align each element to 16
/// bytes (32 with the hash instead of 24).
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    pairs: BTreeSet<(u64, u64, u64)>,
    /// The pairs a checkpoint froze and is writing to a run: still read until the run is in
    /// place.
    frozen: Option<Arc<Frozen>>,
}

/// A frozen memtable.
#[derive(Debug, Default)]
pub(crate) struct Frozen {
    pairs: BTreeSet<(u64, u64, u64)>,
}

impl Frozen {
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// `(hash, id)` in the memtable's order: hash, then seq, then bucket.
    pub fn iter(&self) -> impl Iterator<Item = (u64, TaskId)> + '_ {
        self.pairs
            .iter()
            .map(|&(hash, high, low)| (hash, whole(high, low)))
    }
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

    /// Adds to `out` the memtable's tasks whose key has this hash (the frozen pairs too).
    pub fn candidates(&self, hash: u64, out: &mut Vec<TaskId>) {
        let range = (hash, 0, 0)..=(hash, u64::MAX, u64::MAX);
        let frozen = self.frozen.as_deref().map(|f| &f.pairs);
        for pairs in std::iter::once(&self.pairs).chain(frozen) {
            out.extend(
                pairs
                    .range(range.clone())
                    .map(|&(_, high, low)| whole(high, low)),
            );
        }
    }

    /// Phase A of a checkpoint: moves the pairs out, to be written to a run (`None` if there
    /// are none). They stay readable until [`KeyIndex::thaw`].
    pub fn freeze(&mut self) -> Option<Arc<Frozen>> {
        if self.pairs.is_empty() {
            return None;
        }
        let frozen = Arc::new(Frozen {
            pairs: std::mem::take(&mut self.pairs),
        });
        self.frozen = Some(Arc::clone(&frozen));
        Some(frozen)
    }

    /// The run holding the frozen pairs is in place: stop reading them here.
    pub fn thaw(&mut self) {
        self.frozen = None;
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
        let mut under_7 = Vec::new();
        index.candidates(7, &mut under_7);
        under_7.sort();
        assert_eq!(under_7, vec![TaskId(1), TaskId(2), TaskId(u128::MAX)]);
        index.remove(7, TaskId(1));
        index.remove(7, TaskId(u128::MAX));
        let under = |index: &KeyIndex, hash| {
            let mut out = Vec::new();
            index.candidates(hash, &mut out);
            out
        };
        assert_eq!(under(&index, 7), vec![TaskId(2)]);
        // Removing a pair that is not there (another task's id) changes nothing.
        index.remove(8, TaskId(99));
        assert_eq!(under(&index, 8), vec![TaskId(3)]);
        assert_eq!(index.len(), 3);
        assert!(under(&index, u64::MAX).is_empty());
        // Frozen pairs are still candidates; a removal does not reach them, and pairs put
        // after the freeze join them.
        let frozen = index.freeze().unwrap();
        assert_eq!(frozen.len(), 3);
        assert_eq!(index.len(), 0);
        index.remove(7, TaskId(2));
        index.insert(7, TaskId(9));
        let mut under_7 = under(&index, 7);
        under_7.sort();
        assert_eq!(under_7, vec![TaskId(2), TaskId(9)]);
        index.thaw();
        assert_eq!(under(&index, 7), vec![TaskId(9)]);
        assert!(index.freeze().is_some() && KeyIndex::default().freeze().is_none());
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
