//! Subscriber sets, stored as a small log-structured merge tree (see
//! `docs/storage-format.md`, "Subscriber sets").
//!
//! - Every change is one WAL frame of kind-12 records holding only effective changes (users
//!   that became, or stopped being, members), group-committed and fsync'd like a put.
//! - Changes go to a memtable (`BTreeMap` of keys, see `keys.rs`), both indexes at once. A
//!   checkpoint freezes it at the WAL switch and writes it to an immutable sorted run file
//!   (`run.rs`); a memtable past `EngineOptions::subs_memtable_bytes` asks for a checkpoint.
//!   The checkpoint lists the runs, the per-set counters and the epoch counter, so open reads
//!   only run footers, indexes and bloom filters, then replays the WAL since.
//! - After a checkpoint, runs are merged (size-tiered, `tree.rs`), dropping tombstones at the
//!   bottom and entries of dropped sets; the next checkpoint lists the merged run.
//! - Each set with members has an epoch (its incarnation) and an exact member count in
//!   memory. `drop_set` forgets the set: its entries stay on disk under the old epoch, are
//!   never read again, and compaction removes them; a later subscribe starts a new epoch.
//!
//! Locks: `Core::subs` guards all of it; a call holds it from its membership check to
//! applying its change (so counts are exact), taking the state lock only to queue its WAL
//! frame. Order: metadata, subs, sync, write, state. The feed's read of a user's sets
//! (`by_user.rs`) and fan-out's pages of a set (`pages.rs`) read the runs outside the lock.

mod by_user;
pub(crate) mod keys;
mod memtable;
mod pages;
pub(crate) mod record;
mod tree;
mod view;

use std::path::PathBuf;
use std::sync::Arc;

use belfry_core::UserId;
use parking_lot::MutexGuard;
use rustc_hash::FxHashMap;

use self::keys::{by_user_key, set_prefix, sorted_user_keys};
use self::memtable::{Memtable, Slab};
use self::record::{Op, SubsRecord, USERS_PER_RECORD_MAX};
pub(crate) use self::tree::{open_runs, SubsPlan};
use self::view::View;
use super::checkpoint::CheckpointNeed;
use super::record::WalBatch;
use super::space::Use;
use super::Engine;
use crate::engine::lsm::run::{BlockScan, Run};
pub use crate::engine::persist::SubsPersisted;
use crate::store::{Result, StoreError};

/// Directory of the run files, under the data directory.
pub(crate) const SUBS_DIR: &str = "subs";

/// A set with members: its incarnation and how many it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SetInfo {
    pub(crate) epoch: u64,
    pub(crate) count: u64,
}

/// The subscription tree (guarded by `Core::subs`).
#[derive(Debug)]
pub(crate) struct Subs {
    pub(crate) dir: PathBuf,
    mem: Memtable,
    /// The memtable a checkpoint is writing to a run (still read until it is listed).
    frozen: Option<Arc<Memtable>>,
    /// Newest first.
    runs: Vec<Arc<Run>>,
    /// Run files a merge replaced: deleted by the next checkpoint, which lists the merged
    /// run instead (until then the last checkpoint lists these).
    retired: Vec<PathBuf>,
    sets: FxHashMap<u64, SetInfo>,
    next_epoch: u64,
    next_run: u64,
    /// Records applied since open: the checkpoint thread's idle check reads it.
    pub(crate) changes: u64,
}

impl Subs {
    pub(crate) fn new(dir: PathBuf, runs: Vec<Arc<Run>>, persisted: &SubsPersisted) -> Subs {
        Subs {
            dir,
            mem: Memtable::default(),
            frozen: None,
            runs,
            retired: Vec::new(),
            sets: persisted
                .sets
                .iter()
                .map(|&(set, epoch, count)| (set, SetInfo { epoch, count }))
                .collect(),
            next_epoch: persisted.next_epoch.max(1),
            next_run: persisted.next_run,
            changes: 0,
        }
    }

    fn view(&self) -> View<'_> {
        let mut mems = vec![&self.mem];
        mems.extend(self.frozen.as_deref());
        View {
            mems,
            runs: &self.runs,
        }
    }

    /// Every memtable slab, newest first: the active memtable's, then the frozen one's
    /// (still read until its run is listed).
    fn slabs(&self) -> impl Iterator<Item = &Slab> {
        std::iter::once(&self.mem)
            .chain(self.frozen.as_deref())
            .flat_map(|mem| &mem.slabs)
    }

    /// Bytes the memtable takes (about).
    pub(crate) fn mem_bytes(&self) -> usize {
        self.mem.bytes
    }

    /// Applies one record (a call's change, or one replayed from the WAL).
    pub(crate) fn apply(&mut self, rec: &SubsRecord<'_>) {
        let SubsRecord { op, set, epoch, .. } = *rec;
        self.changes += 1;
        if op == Op::Drop {
            self.sets.remove(&set);
            return;
        }
        self.next_epoch = self.next_epoch.max(epoch.saturating_add(1));
        let info = self.sets.entry(set).or_insert(SetInfo { epoch, count: 0 });
        if info.epoch != epoch {
            *info = SetInfo { epoch, count: 0 };
        }
        let n = rec.users.len() as u64;
        let live = op == Op::Add;
        if live {
            info.count += n;
        } else {
            info.count = info.count.saturating_sub(n);
            if info.count == 0 {
                self.sets.remove(&set);
            }
        }
        // By-set keys sort before by-user keys: one slab holds both, each part sorted.
        let mut key = Vec::with_capacity(keys::KEY_BYTES_MAX);
        set_prefix(&mut key, set, epoch);
        let prefix = key.len();
        let user_bytes: usize = rec.users.iter().map(|u| u.len()).sum();
        let n = rec.users.len();
        // Room for both parts in the first, which the second is appended to.
        let mut by_set = Slab::with_capacity(2 * n, 2 * (user_bytes + n * prefix) + 2 * n);
        let mut by_user = Slab::with_capacity(n, user_bytes + n * (prefix + 2));
        for user in &rec.users {
            key.truncate(prefix);
            key.extend_from_slice(user);
            by_set.push_unsorted(&key, live);
        }
        for user in &rec.users {
            key.clear();
            by_user_key(&mut key, user, set, epoch);
            by_user.push_unsorted(&key, live);
        }
        let mut slab = Slab::from_unsorted(by_set);
        slab.append(Slab::from_unsorted(by_user));
        self.mem.add(slab);
    }

    /// Which of the sorted user keys (`buf`, `ranges`) are members of the set incarnation
    /// whose prefix is `prefix`.
    fn members_of(&self, prefix: &[u8], buf: &[u8], ranges: &[(u32, u32)]) -> Result<Vec<bool>> {
        let mut view = self.view();
        let mut cache: Vec<BlockScan> = Vec::new();
        cache.resize_with(self.runs.len(), Default::default);
        // Memtables holding nothing in the batch's key range are not looked up per key (a
        // bulk subscribe of fresh ids walks past them).
        if let (Some(&(fs, fe)), Some(&(ls, le))) = (ranges.first(), ranges.last()) {
            let mut first = prefix.to_vec();
            first.extend_from_slice(&buf[fs as usize..fe as usize]);
            let mut last = prefix.to_vec();
            last.extend_from_slice(&buf[ls as usize..le as usize]);
            view.mems.retain(|mem| mem.holds_between(&first, &last));
            // Likewise runs, and runs holding the whole range need no check per key.
            for (run, scan) in self.runs.iter().zip(&mut cache) {
                scan.overlap = run.filtered_overlap(&first, &last);
            }
        }
        let mut key = prefix.to_vec();
        let mut out = Vec::with_capacity(ranges.len());
        for &(s, e) in ranges {
            key.truncate(prefix.len());
            key.extend_from_slice(&buf[s as usize..e as usize]);
            out.push(view.get(&key, &mut cache)? == Some(true));
        }
        Ok(out)
    }
}

/// The WAL frame of a call: one record per `USERS_PER_RECORD_MAX` users.
fn subs_frame(op: Op, set: u64, epoch: u64, users: &[&[u8]]) -> Vec<u8> {
    let bytes: usize = users.iter().map(|u| u.len() + 1).sum();
    let mut batch = WalBatch::with_capacity(64 + bytes);
    if users.is_empty() {
        batch.push_subs(|out| record::encode(out, op, set, epoch, std::iter::empty()));
    }
    for chunk in users.chunks(USERS_PER_RECORD_MAX) {
        batch.push_subs(|out| record::encode(out, op, set, epoch, chunk.iter().copied()));
    }
    batch.finish()
}

fn decode_user(key: &[u8], what: &str) -> Result<UserId> {
    UserId::decode(key).ok_or_else(|| bad_user_key(key, what))
}

fn bad_user_key(key: &[u8], what: &str) -> StoreError {
    StoreError::Corrupt {
        location: "subscription tree".into(),
        detail: format!("{what} holds an invalid user key {key:?}"),
    }
}

impl Engine {
    pub(super) fn subs_subscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.subs_change(set, users, Op::Add)
    }

    pub(super) fn subs_unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64> {
        self.subs_change(set, users, Op::Remove)
    }

    /// Adds or removes users: checks membership (sorted, so lookups walk the runs in order),
    /// logs the effective changes, applies them, then waits for the fsync.
    fn subs_change(&self, set: u64, users: &[UserId], op: Op) -> Result<u64> {
        let (buf, ranges) = sorted_user_keys(users);
        if op == Op::Add && !ranges.is_empty() {
            // The WAL now, a run at the next checkpoint, and a copy while runs merge.
            self.core
                .space
                .admit(3 * (buf.len() + 2 * ranges.len()) as u64, Use::Growth)?;
        }
        let subs = self.lock_subs()?;
        let current = subs.sets.get(&set).copied();
        let (epoch, members) = match current {
            // A new set (or incarnation) has no members: nothing to look up.
            None if op == Op::Add => (subs.next_epoch, vec![false; ranges.len()]),
            None => return Ok(0),
            Some(info) => {
                let mut prefix = Vec::new();
                set_prefix(&mut prefix, set, info.epoch);
                (info.epoch, subs.members_of(&prefix, &buf, &ranges)?)
            }
        };
        let want = op == Op::Remove;
        let changed: Vec<&[u8]> = ranges
            .iter()
            .zip(&members)
            .filter(|(_, &m)| m == want)
            .map(|(&(s, e), _)| &buf[s as usize..e as usize])
            .collect();
        if changed.is_empty() {
            return Ok(0);
        }
        let frame = subs_frame(op, set, epoch, &changed);
        let n = changed.len() as u64;
        let rec = SubsRecord {
            op,
            set,
            epoch,
            users: changed,
        };
        self.commit_subs(subs, &frame, &rec)?;
        Ok(n)
    }

    pub(super) fn subs_drop(&self, set: u64) -> Result<u64> {
        let subs = self.lock_subs()?;
        let Some(info) = subs.sets.get(&set).copied() else {
            return Ok(0);
        };
        let frame = subs_frame(Op::Drop, set, 0, &[]);
        let rec = SubsRecord {
            op: Op::Drop,
            set,
            epoch: 0,
            users: Vec::new(),
        };
        self.commit_subs(subs, &frame, &rec)?;
        Ok(info.count)
    }

    pub(super) fn subs_contains(&self, set: u64, user: &UserId) -> Result<bool> {
        let subs = self.lock_subs()?;
        let Some(info) = subs.sets.get(&set) else {
            return Ok(false);
        };
        let mut key = Vec::new();
        set_prefix(&mut key, set, info.epoch);
        user.encode_into(&mut key);
        let mut cache = Vec::new();
        cache.resize_with(subs.runs.len(), Default::default);
        Ok(subs.view().get(&key, &mut cache)? == Some(true))
    }

    pub(super) fn subs_count(&self, set: u64) -> Result<u64> {
        let subs = self.lock_subs()?;
        Ok(subs.sets.get(&set).map_or(0, |info| info.count))
    }

    fn lock_subs(&self) -> Result<MutexGuard<'_, Subs>> {
        let subs = self.core.subs.lock();
        self.check_open()?;
        Ok(subs)
    }

    /// Queues the frame (holding the state lock for just that), applies the change, releases
    /// the subs lock and waits for the fsync, like `commit_meta`: memory and the WAL see a
    /// set's changes in the same order, and a checkpoint (which takes the subs lock before
    /// the WAL switch) freezes exactly the changes of the frames before the switch.
    fn commit_subs(
        &self,
        mut subs: MutexGuard<'_, Subs>,
        frame: &[u8],
        rec: &SubsRecord<'_>,
    ) -> Result<()> {
        let (ticket, need) = {
            let mut state = self.lock_state()?;
            let ticket = state.enqueue(frame);
            (ticket, self.checkpoint_due(&state))
        };
        subs.apply(rec);
        let need = need.max(self.memtable_need(subs.mem_bytes()));
        drop(subs);
        self.finish(ticket, false, need)
    }

    /// Whether the memtable asks for a checkpoint (which writes it to a run).
    pub(super) fn memtable_need(&self, bytes: usize) -> CheckpointNeed {
        let limit = self.core.options.subs_memtable_bytes;
        if bytes >= limit.saturating_mul(super::checkpoint::CHECKPOINT_OVERDUE_FACTOR as usize) {
            CheckpointNeed::Overdue
        } else if bytes >= limit {
            CheckpointNeed::Due
        } else {
            CheckpointNeed::No
        }
    }
}
