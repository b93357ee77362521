//! A set's members a page at a time (what fan-out reads), merged outside the subs lock.
//!
//! Under the lock: the set's epoch, a copy of each memtable slab's entries from the page's
//! start (at most [`slab_cap`] of them), and the run list. The runs are merged without it,
//! so a fan-out reading pages of thousands of members does not hold up the feed's reads or
//! subscribes meanwhile. A slab with more entries than the cap bounds how far the copies are
//! complete; a page that would pass that bound is read again by the merge under the lock.

use belfry_core::{UserId, UserPage};

use super::keys::set_prefix;
use super::memtable::{Slab, SlabSource};
use super::{bad_user_key, decode_user, Subs};
use crate::engine::lsm::merge::{Merge, RunCursor, Source};
use crate::engine::Engine;
use crate::store::Result;

/// Where a page's members go: a list of ids (the API's pages), or one buffer of them (the
/// fan-out's, no allocation per member).
pub(in crate::engine) trait Members {
    fn clear(&mut self);
    fn count(&self) -> usize;
    /// Adds the member a by-set key (past its set's prefix) names.
    fn push_key(&mut self, key: &[u8]) -> Result<()>;
}

impl Members for Vec<UserId> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn push_key(&mut self, key: &[u8]) -> Result<()> {
        self.push(decode_user(key, "a by-set key")?);
        Ok(())
    }
}

impl Members for UserPage {
    fn clear(&mut self) {
        UserPage::clear(self);
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn push_key(&mut self, key: &[u8]) -> Result<()> {
        if UserPage::push_key(self, key) {
            Ok(())
        } else {
            Err(bad_user_key(key, "a by-set key"))
        }
    }
}

/// Most entries copied from one memtable slab for a page of `limit` (tombstones count).
fn slab_cap(limit: usize) -> usize {
    limit.saturating_mul(2).saturating_add(1)
}

/// Where a page starts: the set incarnation's prefix, and the key to read from.
fn page_start(set: u64, epoch: u64, after: Option<&UserId>) -> (Vec<u8>, Vec<u8>) {
    let mut prefix = Vec::new();
    set_prefix(&mut prefix, set, epoch);
    let mut from = prefix.clone();
    if let Some(after) = after {
        after.encode_into(&mut from);
    }
    (prefix, from)
}

/// Adds up to `limit` live members from `merge` (keys from `from` on) to `out`: `false` if
/// the page would need keys past `bound`, beyond which the sources are not complete (`out`
/// then holds part of the page).
fn take_page(
    merge: &mut Merge<'_>,
    prefix: &[u8],
    from: &[u8],
    skip_from: bool,
    limit: usize,
    bound: Option<&[u8]>,
    out: &mut impl Members,
) -> Result<bool> {
    let mut key = Vec::new();
    while out.count() < limit {
        // Past the bound, or at the end while a source was cut short, the sources may lack
        // entries a page needs.
        let Some(live) = merge.next(&mut key)? else {
            return Ok(bound.is_none());
        };
        if bound.is_some_and(|b| key.as_slice() > b) {
            return Ok(false);
        }
        if !key.starts_with(prefix) {
            break;
        }
        if live && !(skip_from && key == from) {
            out.push_key(&key[prefix.len()..])?;
        }
    }
    Ok(true)
}

impl Subs {
    /// The page by merging every source under the lock: the fallback when a memtable slab
    /// holds more of the set than the copies took.
    fn members_merged(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
        out: &mut impl Members,
    ) -> Result<()> {
        out.clear();
        let Some(info) = self.sets.get(&set).copied() else {
            return Ok(());
        };
        let (prefix, from) = page_start(set, info.epoch, after);
        let mut merge = self.view().merge(&from)?;
        take_page(
            &mut merge,
            &prefix,
            &from,
            after.is_some(),
            limit,
            None,
            out,
        )?;
        Ok(())
    }
}

impl Engine {
    /// Up to `limit` members of `set` after `after`, into `out` (cleared first).
    pub(in crate::engine) fn subs_members(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
        out: &mut impl Members,
    ) -> Result<()> {
        out.clear();
        let cap = slab_cap(limit);
        let (prefix, from, slabs, bound, runs) = {
            let subs = self.lock_subs()?;
            let Some(info) = subs.sets.get(&set).copied() else {
                return Ok(());
            };
            let (prefix, from) = page_start(set, info.epoch, after);
            let mut slabs = Vec::new();
            // The smallest last key copied from a slab that held more.
            let mut bound: Option<Vec<u8>> = None;
            for slab in subs.slabs() {
                let mut copy = Slab::with_capacity(0, 0);
                let whole = slab.scan_prefix(&from, &prefix, cap, |k, live| copy.push(k, live));
                if !whole && copy.len() > 0 {
                    let last = copy.get(copy.len() - 1).0;
                    if bound.as_deref().is_none_or(|b| last < b) {
                        bound = Some(last.to_vec());
                    }
                }
                slabs.push(copy);
            }
            (prefix, from, slabs, bound, subs.runs.clone())
        };
        let mut sources: Vec<Box<dyn Source + '_>> = Vec::with_capacity(slabs.len() + runs.len());
        for slab in &slabs {
            sources.push(Box::new(SlabSource::new(slab, &from)));
        }
        for run in &runs {
            sources.push(Box::new(RunCursor::new(run, &from)?));
        }
        let mut merge = Merge::new(sources);
        let bound = bound.as_deref();
        if take_page(
            &mut merge,
            &prefix,
            &from,
            after.is_some(),
            limit,
            bound,
            out,
        )? {
            Ok(())
        } else {
            self.lock_subs()?.members_merged(set, after, limit, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::{UserId, UserPage};

    use crate::engine::{Engine, EngineOptions};
    use crate::store::Store;

    fn user(i: usize) -> UserId {
        UserId::new(format!("u{i:03}")).unwrap()
    }

    /// A page whose first entries are all tombstones in the memtable: the copies taken under
    /// the lock (a few per slab) end before the first live member, and the page is read again
    /// by the merge under the lock. Pages still cover every member once, in order.
    #[test]
    fn a_page_behind_many_tombstones_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let options = EngineOptions {
            background_checkpoints: false,
            ..EngineOptions::default()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        let all: Vec<UserId> = (0..100).map(user).collect();
        assert_eq!(engine.subscribe(7, &all).unwrap(), 100);
        assert_eq!(engine.unsubscribe(7, &all[..50]).unwrap(), 50);
        assert_eq!(
            engine.subscribers(7, None, 3).unwrap(),
            vec![user(50), user(51), user(52)]
        );
        let mut seen = Vec::new();
        let mut after: Option<UserId> = None;
        let mut buffer = UserPage::default();
        loop {
            let page = engine.subscribers(7, after.as_ref(), 4).unwrap();
            // The same page into one buffer, through the same fallback.
            engine
                .subscriber_page(7, after.as_ref(), 4, &mut buffer)
                .unwrap();
            assert_eq!(
                buffer.iter().collect::<Vec<_>>(),
                page.iter().map(UserId::as_str).collect::<Vec<_>>()
            );
            seen.extend(page.iter().cloned());
            if page.len() < 4 {
                break;
            }
            after = page.last().cloned();
        }
        assert_eq!(seen, all[50..].to_vec());
        // Written to a run, the same pages come from it.
        engine.flush().unwrap();
        assert_eq!(
            engine.subscribers(7, Some(&user(97)), 10).unwrap(),
            vec![user(98), user(99)]
        );
    }
}
