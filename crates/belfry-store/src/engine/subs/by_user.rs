//! A user's sets (the feed's read): gathered from every source outside the subs lock.
//!
//! The lock is held twice, briefly: to copy the memtables' entries under the user's prefix
//! and take the list of runs (shared, immutable files), then to check the sets' epochs. The
//! runs are read between, so lookups of different users run in parallel, and beside writers
//! and checkpoints: a checkpoint that merges runs meanwhile replaces them in the tree, while
//! this read keeps the ones it took (an unlinked file stays readable while open).
//!
//! A user has a handful of entries per source, so they are gathered whole and sorted (the
//! newest source's version of each key wins) instead of merged by cursors. A source holding
//! more than [`source_cap`] of them falls back to the merge under the lock, which stops at
//! `limit` whatever the sources hold.

use std::sync::Arc;

use belfry_core::UserId;

use super::keys::{split_by_user, user_prefix};
use super::Subs;
use crate::engine::lsm::run::Run;
use crate::engine::Engine;
use crate::store::{Result, StoreError};

/// Most entries one source may give a gathered read of `limit` sets before the read falls
/// back to the merge (tombstones and dead epochs count, so some slack above `limit`).
fn source_cap(limit: usize) -> usize {
    limit.saturating_mul(2).max(2)
}

/// Entries gathered from several sources, each with its source's rank (0: the newest).
#[derive(Debug, Default)]
struct Gathered {
    keys: Vec<u8>,
    entries: Vec<(u32, u32, u32, bool)>,
}

impl Gathered {
    fn push(&mut self, key: &[u8], live: bool, rank: u32) {
        let start = self.keys.len() as u32;
        self.keys.extend_from_slice(key);
        self.entries
            .push((start, self.keys.len() as u32, rank, live));
    }

    fn key(&self, entry: &(u32, u32, u32, bool)) -> &[u8] {
        &self.keys[entry.0 as usize..entry.1 as usize]
    }

    /// The keys whose newest version is live, in key order.
    fn newest_live(&mut self) -> Vec<&[u8]> {
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_unstable_by(|a, b| self.key(a).cmp(self.key(b)).then(a.2.cmp(&b.2)));
        entries.dedup_by(|later, first| self.key(later) == self.key(first));
        self.entries = entries;
        self.entries
            .iter()
            .filter(|e| e.3)
            .map(|e| self.key(e))
            .collect()
    }
}

fn malformed(key: &[u8]) -> StoreError {
    StoreError::Corrupt {
        location: "subscription tree".into(),
        detail: format!("malformed by-user key {key:?}"),
    }
}

impl Subs {
    /// The memtables' entries under `prefix` into `found` (ranks from 0) and the runs, or
    /// `None` if a memtable holds more than `cap` of them.
    fn gather_memtables(
        &self,
        prefix: &[u8],
        cap: usize,
        found: &mut Gathered,
    ) -> Option<(Vec<Arc<Run>>, u32)> {
        let mut rank = 0u32;
        for slab in self.slabs() {
            if !slab.scan_prefix(prefix, prefix, cap, |key, live| found.push(key, live, rank)) {
                return None;
            }
            rank += 1;
        }
        Some((self.runs.clone(), rank))
    }

    /// The first `limit` sets of the user whose prefix is `prefix`, from `keys` (by-user
    /// keys in order, each live in its newest version): those of the set's current epoch.
    fn current_sets<'k>(
        &self,
        prefix: &[u8],
        keys: impl IntoIterator<Item = &'k [u8]>,
        limit: usize,
    ) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for key in keys {
            if out.len() == limit {
                break;
            }
            let (set, epoch) = split_by_user(key, prefix.len()).ok_or_else(|| malformed(key))?;
            if self.sets.get(&set).is_some_and(|i| i.epoch == epoch) {
                out.push(set);
            }
        }
        Ok(out)
    }

    /// The user's sets by merging every source from `prefix` on, under the lock: the
    /// fallback for a user with many entries in one source.
    fn user_sets_merged(&self, prefix: &[u8], limit: usize) -> Result<Vec<u64>> {
        let mut merge = self.view().merge(prefix)?;
        let mut out = Vec::new();
        let mut key = Vec::new();
        while out.len() < limit {
            let Some(live) = merge.next(&mut key)? else {
                break;
            };
            if !key.starts_with(prefix) {
                break;
            }
            if live {
                out.extend(self.current_sets(prefix, [key.as_slice()], 1)?);
            }
        }
        Ok(out)
    }
}

impl Engine {
    pub(in crate::engine) fn subs_of_user(&self, user: &UserId, limit: usize) -> Result<Vec<u64>> {
        let mut prefix = Vec::new();
        user_prefix(&mut prefix, &user.encode());
        let cap = source_cap(limit);
        let mut found = Gathered::default();
        let (runs, first_rank) = {
            let subs = self.lock_subs()?;
            match subs.gather_memtables(&prefix, cap, &mut found) {
                Some(taken) => taken,
                None => return subs.user_sets_merged(&prefix, limit),
            }
        };
        let mut frame = Vec::new();
        for (rank, run) in (first_rank..).zip(&runs) {
            let whole = run.scan_prefix(&prefix, &mut frame, cap, |key, live| {
                found.push(key, live, rank)
            })?;
            if !whole {
                return self.lock_subs()?.user_sets_merged(&prefix, limit);
            }
        }
        let keys = found.newest_live();
        self.lock_subs()?.current_sets(&prefix, keys, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_version_of_each_key_wins_and_tombstones_hide_it() {
        let mut found = Gathered::default();
        // rank 0 is the newest source
        found.push(b"b", false, 0);
        found.push(b"a", true, 1);
        found.push(b"b", true, 1);
        found.push(b"c", true, 2);
        found.push(b"c", false, 1);
        found.push(b"d", true, 2);
        assert_eq!(found.newest_live(), vec![&b"a"[..], &b"d"[..]]);
    }
}
