//! The memtable: each call's entries as one sorted slab (keys in one buffer), newest first.
//! Slabs are merged size-tiered as they accumulate, so a lookup visits a few slabs and a
//! bulk call costs a sort and a copy, not a tree insert and an allocation per key.

use crate::engine::lsm::merge::{Merge, Source};
use crate::store::Result;

/// Memory an entry takes besides its key (its end offset and flag).
pub(crate) const ENTRY_OVERHEAD_BYTES: usize = 5;
/// Slabs kept before the newest are merged whatever their sizes.
const SLABS_MAX: usize = 12;

/// Sorted, unique keys with their flags (live or tombstone).
#[derive(Debug, Default)]
pub(crate) struct Slab {
    keys: Vec<u8>,
    ends: Vec<u32>,
    live: Vec<bool>,
}

impl Slab {
    /// An empty slab with room for `entries` entries of `key_bytes` bytes in all.
    pub(crate) fn with_capacity(entries: usize, key_bytes: usize) -> Slab {
        Slab {
            keys: Vec::with_capacity(key_bytes),
            ends: Vec::with_capacity(entries),
            live: Vec::with_capacity(entries),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn get(&self, i: usize) -> (&[u8], bool) {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        (&self.keys[start..self.ends[i] as usize], self.live[i])
    }

    /// The first entry whose key is `>= key`.
    pub(crate) fn seek(&self, key: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid).0 < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn lookup(&self, key: &[u8]) -> Option<bool> {
        let i = self.seek(key);
        (i < self.len() && self.get(i).0 == key).then(|| self.get(i).1)
    }

    /// Calls `f` with each entry from `from` on whose key starts with `prefix` (which `from`
    /// starts with), in key order, stopping after `cap`: returns whether it saw them all.
    pub(crate) fn scan_prefix(
        &self,
        from: &[u8],
        prefix: &[u8],
        cap: usize,
        mut f: impl FnMut(&[u8], bool),
    ) -> bool {
        let mut i = self.seek(from);
        let mut taken = 0;
        while i < self.len() {
            let (key, live) = self.get(i);
            if !key.starts_with(prefix) {
                return true;
            }
            if taken == cap {
                return false;
            }
            f(key, live);
            taken += 1;
            i += 1;
        }
        true
    }

    /// Appends an entry; keys must come in ascending order.
    pub(crate) fn push(&mut self, key: &[u8], live: bool) {
        debug_assert!(self.len() == 0 || self.get(self.len() - 1).0 < key);
        self.keys.extend_from_slice(key);
        self.ends.push(self.keys.len() as u32);
        self.live.push(live);
    }

    /// Appends an entry in any order (see [`Slab::from_unsorted`]).
    pub(crate) fn push_unsorted(&mut self, key: &[u8], live: bool) {
        self.keys.extend_from_slice(key);
        self.ends.push(self.keys.len() as u32);
        self.live.push(live);
    }

    /// Appends a slab whose keys all sort after this one's.
    pub(crate) fn append(&mut self, other: Slab) {
        self.keys.reserve_exact(other.keys.len());
        self.ends.reserve_exact(other.len());
        self.live.reserve_exact(other.len());
        let base = self.keys.len() as u32;
        self.keys.extend_from_slice(&other.keys);
        self.ends.extend(other.ends.iter().map(|e| e + base));
        self.live.extend(other.live);
    }

    /// A slab of `entries` pushed in any order (each key once), sorted.
    pub(crate) fn from_unsorted(entries: Slab) -> Slab {
        let sorted = (1..entries.len()).all(|i| entries.get(i - 1).0 < entries.get(i).0);
        if sorted {
            return entries;
        }
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_unstable_by(|&a, &b| entries.get(a).0.cmp(entries.get(b).0));
        let mut out = Slab::with_capacity(entries.len(), entries.keys.len());
        for i in order {
            let (key, live) = entries.get(i);
            out.push(key, live);
        }
        out
    }

    fn bytes(&self) -> usize {
        self.keys.len() + self.len() * ENTRY_OVERHEAD_BYTES
    }
}

/// A slab read from a key on.
pub(crate) struct SlabSource<'a> {
    slab: &'a Slab,
    pos: usize,
}

impl<'a> SlabSource<'a> {
    pub(crate) fn new(slab: &'a Slab, from: &[u8]) -> SlabSource<'a> {
        SlabSource {
            slab,
            pos: slab.seek(from),
        }
    }
}

impl Source for SlabSource<'_> {
    fn peek(&self) -> Option<(&[u8], bool)> {
        (self.pos < self.slab.len()).then(|| self.slab.get(self.pos))
    }
    fn advance(&mut self) -> Result<()> {
        self.pos += 1;
        Ok(())
    }
}

#[derive(Debug, Default)]
pub(crate) struct Memtable {
    /// Newest first.
    pub(crate) slabs: Vec<Slab>,
    pub(crate) bytes: usize,
}

impl Memtable {
    pub(crate) fn is_empty(&self) -> bool {
        self.slabs.is_empty()
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<bool> {
        self.slabs.iter().find_map(|s| s.lookup(key))
    }

    /// Whether any slab holds a key in `first..=last`.
    pub(crate) fn holds_between(&self, first: &[u8], last: &[u8]) -> bool {
        self.slabs.iter().any(|s| {
            let i = s.seek(first);
            i < s.len() && s.get(i).0 <= last
        })
    }

    /// Entries whose key is below `bound`, counted over slabs (an upper bound of the keys).
    pub(crate) fn count_below(&self, bound: &[u8]) -> usize {
        self.slabs.iter().map(|s| s.seek(bound)).sum()
    }

    /// Adds a call's slab as the newest, then merges the newest slabs while they together
    /// outweigh the next older one (or there are too many).
    pub(crate) fn add(&mut self, slab: Slab) {
        if slab.len() == 0 {
            return;
        }
        self.bytes += slab.bytes();
        self.slabs.insert(0, slab);
        loop {
            let mut total = self.slabs[0].len();
            let mut k = 1;
            while k < self.slabs.len() && self.slabs[k].len() <= total {
                total += self.slabs[k].len();
                k += 1;
            }
            if self.slabs.len() > SLABS_MAX {
                k = self.slabs.len();
            }
            if k < 2 {
                return;
            }
            self.merge_newest(k);
        }
    }

    fn merge_newest(&mut self, k: usize) {
        let inputs: Vec<Slab> = self.slabs.drain(..k).collect();
        let sources: Vec<Box<dyn Source + '_>> = inputs
            .iter()
            .map(|s| Box::new(SlabSource::new(s, &[])) as Box<dyn Source + '_>)
            .collect();
        let mut merge = Merge::new(sources);
        // Sized for all inputs (the output is at most that): no regrowth, no slack.
        let mut out = Slab::with_capacity(
            inputs.iter().map(Slab::len).sum(),
            inputs.iter().map(|s| s.keys.len()).sum(),
        );
        let mut key = Vec::new();
        // Slab sources never fail.
        while let Ok(Some(live)) = merge.next(&mut key) {
            out.push(&key, live);
        }
        self.bytes -= inputs.iter().map(Slab::bytes).sum::<usize>();
        self.bytes += out.bytes();
        self.slabs.insert(0, out);
    }
}
