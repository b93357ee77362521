//! The idempotency keys of all queues on disk: sorted run files (`keys/<id>.run`, the format
//! of `engine::lsm::run`), so that memory holds about 1.5 bytes per key (a bloom filter and a
//! block index) rather than the memtable's ~40.
//!
//! - Each queue's memtable ([`super::KeyIndex`]) takes the keys put since the last
//!   checkpoint. Phase A of a checkpoint freezes every memtable; phase B writes the frozen
//!   ones into one run (still read until it is in place); the checkpoint lists the runs.
//! - An entry is `[queue uid: u64 BE][key hash: u64 BE][seq][bucket]`, the last two as
//!   [`put_ordered`] numbers, so that byte order is the memtable's order. The bloom filter
//!   holds the first 16 bytes: a lookup of a key nobody used reads no block of a run (about
//!   1% of them read one).
//! - A task that finishes leaves its entry in the runs: entries only name candidates, and a
//!   lookup confirms each one by reading the task (its key and that it is not finished), as
//!   it always did for hash collisions. So runs take no tombstones.
//! - Runs are merged size-tiered after checkpoints (`engine::lsm::pick`); a merge leaves out
//!   the entries of deleted queues and of deleted buckets (whose tasks all finished), and the
//!   next checkpoint lists the merged run and deletes its inputs.
//!
//! Locks: the runs belong to the engine state (its lock guards them); a checkpoint writes a
//! run and a merge reads and writes them without it, taking it only to install the result.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use belfry_core::TaskId;
use rustc_hash::FxHashSet;

use crate::engine::bucket::{split_id, task_id};
use crate::engine::lsm::bloom::BloomHash;
use crate::engine::lsm::merge::{Merge, RunCursor, Source};
use crate::engine::lsm::run::{Run, RunKind, RunWriter, KEYS_FILTERED_BYTES};
use crate::engine::lsm::{self, open_listed_runs, pick};
use crate::engine::persist::{sync_dir, KeyRunsPersisted};
use crate::store::{Result, StoreError};

/// Directory of the key runs, under the data directory.
pub(crate) const KEYS_DIR: &str = "keys";

/// Longest entry: 16 bytes of prefix and two numbers of at most 9 bytes.
const ENTRY_BYTES_MAX: usize = KEYS_FILTERED_BYTES + 18;

/// Appends `value` so that byte order is numeric order: its length in bytes, then its
/// big-endian bytes without leading zeros (`0` is the single byte `0`).
pub(crate) fn put_ordered(out: &mut Vec<u8>, value: u64) {
    let len = 8 - value.leading_zeros() as usize / 8;
    out.push(len as u8);
    out.extend_from_slice(&value.to_be_bytes()[8 - len..]);
}

/// A number written by [`put_ordered`] at the front of `bytes`, and the bytes it took.
fn get_ordered(bytes: &[u8]) -> Option<(u64, usize)> {
    let len = *bytes.first()? as usize;
    if len > 8 {
        return None;
    }
    let digits = bytes.get(1..1 + len)?;
    let value = digits.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
    Some((value, 1 + len))
}

/// The 16-byte prefix of queue `uid`'s entries under key hash `hash`.
fn prefix(uid: u64, hash: u64) -> [u8; KEYS_FILTERED_BYTES] {
    let mut out = [0; KEYS_FILTERED_BYTES];
    out[..8].copy_from_slice(&uid.to_be_bytes());
    out[8..].copy_from_slice(&hash.to_be_bytes());
    out
}

/// The entry of task `id` of queue `uid`, under its key's hash.
pub(crate) fn encode_entry(out: &mut Vec<u8>, uid: u64, hash: u64, id: TaskId) {
    let (seq, bucket) = split_id(id);
    out.clear();
    out.extend_from_slice(&prefix(uid, hash));
    put_ordered(out, seq);
    put_ordered(out, bucket);
}

/// `(uid, hash, id)` of an entry; `None` if it is malformed.
pub(crate) fn decode_entry(entry: &[u8]) -> Option<(u64, u64, TaskId)> {
    let head = entry.get(..KEYS_FILTERED_BYTES)?;
    let uid = u64::from_be_bytes(head[..8].try_into().ok()?);
    let hash = u64::from_be_bytes(head[8..].try_into().ok()?);
    let rest = &entry[KEYS_FILTERED_BYTES..];
    let (seq, n) = get_ordered(rest)?;
    let (bucket, m) = get_ordered(&rest[n..])?;
    (n + m == rest.len()).then_some((uid, hash, task_id(seq, bucket)))
}

fn malformed(run: &Run, entry: &[u8]) -> StoreError {
    StoreError::Corrupt {
        location: run.path.display().to_string(),
        detail: format!("malformed idempotency-key entry {entry:?}"),
    }
}

/// The runs of idempotency keys, newest first (in the engine state).
#[derive(Debug)]
pub(crate) struct KeyRuns {
    pub(crate) dir: PathBuf,
    pub(crate) runs: Vec<Arc<Run>>,
    /// Run files a merge replaced: deleted by the next checkpoint, which lists the merged
    /// run instead.
    pub(crate) retired: Vec<PathBuf>,
    pub(crate) next_run: u64,
}

impl KeyRuns {
    /// Opens the runs the checkpoint lists and removes the other files of `keys/`.
    pub(crate) fn open(data_dir: &Path, persisted: &KeyRunsPersisted) -> Result<KeyRuns> {
        let dir = data_dir.join(KEYS_DIR);
        let runs = open_listed_runs(&dir, RunKind::Keys, &persisted.runs)?;
        Ok(KeyRuns {
            dir,
            runs,
            retired: Vec::new(),
            next_run: persisted.next_run,
        })
    }

    /// What a checkpoint lists (as of now).
    pub(crate) fn persisted(&self) -> KeyRunsPersisted {
        KeyRunsPersisted {
            next_run: self.next_run,
            runs: self.runs.iter().map(|r| r.id).collect(),
        }
    }

    /// Adds to `out` the tasks of queue `uid` whose key has hash `hash`, from every run.
    pub(crate) fn candidates(&self, uid: u64, hash: u64, out: &mut Vec<TaskId>) -> Result<()> {
        if self.runs.is_empty() {
            return Ok(());
        }
        let prefix = prefix(uid, hash);
        let bloom = BloomHash::of(&prefix);
        let mut frame = Vec::new();
        for run in &self.runs {
            if !run.bloom_may_hold(&bloom) {
                continue;
            }
            let mut bad = None;
            run.scan_prefix(
                &prefix,
                &mut frame,
                usize::MAX,
                |entry, _| match decode_entry(entry) {
                    Some((_, _, id)) => out.push(id),
                    None => bad = Some(entry.to_vec()),
                },
            )?;
            if let Some(entry) = bad {
                return Err(malformed(run, &entry));
            }
        }
        Ok(())
    }

    /// Total entries in the runs (stale ones included).
    pub(crate) fn entries(&self) -> u64 {
        self.runs.iter().map(|r| r.entries).sum()
    }
}

/// Writes run `id` in `dir` from the frozen memtables `(uid, pairs)` (ascending uid, pairs
/// as the memtable orders them: `(hash, seq, bucket)`). `None` (and no file) if they hold
/// nothing. The caller fsyncs the directory before listing the run.
pub(crate) fn write_frozen(
    dir: &Path,
    id: u64,
    frozen: &[(u64, Arc<super::Frozen>)],
) -> Result<Option<Run>> {
    let total: usize = frozen.iter().map(|(_, f)| f.len()).sum();
    if total == 0 {
        return Ok(None);
    }
    let mut writer = RunWriter::create(dir, id, RunKind::Keys, total)?;
    let mut entry = Vec::with_capacity(ENTRY_BYTES_MAX);
    for (uid, pairs) in frozen {
        for (hash, id) in pairs.iter() {
            encode_entry(&mut entry, *uid, hash, id);
            writer.add(&entry, true)?;
        }
    }
    Ok(Some(writer.finish()?))
}

/// What a merge of key runs needs from the state, taken under its lock.
pub(crate) struct MergePlan {
    pub(crate) inputs: Vec<Arc<Run>>,
    pub(crate) id: u64,
    /// Buckets `(queue uid, bucket key)` that exist: an entry naming any other is stale
    /// (its bucket was deleted once all its tasks finished, or its queue was deleted).
    pub(crate) live: FxHashSet<(u64, u64)>,
}

impl KeyRuns {
    /// The runs the size-tiered policy would merge now, or `None`.
    pub(crate) fn plan_merge(
        &mut self,
        min_runs: usize,
        buckets: impl Iterator<Item = (u64, u64)>,
    ) -> Option<MergePlan> {
        let k = pick(&self.runs, min_runs);
        if k == 0 {
            return None;
        }
        let id = self.next_run;
        self.next_run += 1;
        Some(MergePlan {
            inputs: self.runs[..k].to_vec(),
            id,
            live: buckets.collect(),
        })
    }

    /// Puts the merged run (`None`: nothing was left) where its inputs were, and retires
    /// their files.
    pub(crate) fn install(&mut self, plan: &MergePlan, out: Option<Run>) -> Result<()> {
        // Checkpoints only add runs in front and merges run one at a time, so the inputs
        // are still next to each other.
        let at = self
            .runs
            .iter()
            .position(|r| Arc::ptr_eq(r, &plan.inputs[0]))
            .ok_or_else(|| StoreError::Corrupt {
                location: self.dir.display().to_string(),
                detail: "a key run being merged left the index".into(),
            })?;
        self.runs
            .splice(at..at + plan.inputs.len(), out.map(Arc::new));
        self.retired
            .extend(plan.inputs.iter().map(|r| r.path.clone()));
        Ok(())
    }
}

/// Merges the plan's inputs into run `plan.id` in `dir`, leaving out stale entries. Runs
/// without the state lock.
pub(crate) fn merge(dir: &Path, plan: &MergePlan) -> Result<Option<Run>> {
    let filtered: usize = plan.inputs.iter().map(|r| r.filtered_keys_hint()).sum();
    let mut sources: Vec<Box<dyn Source + '_>> = Vec::with_capacity(plan.inputs.len());
    for run in &plan.inputs {
        sources.push(Box::new(RunCursor::new(run, &[])?));
    }
    let out = lsm::write_merged(
        dir,
        plan.id,
        RunKind::Keys,
        filtered,
        Merge::new(sources),
        |entry, _| {
            let (uid, _, id) = decode_entry(entry).ok_or_else(|| StoreError::Corrupt {
                location: dir.display().to_string(),
                detail: format!("malformed idempotency-key entry {entry:?}"),
            })?;
            Ok(plan.live.contains(&(uid, split_id(id).1)).then_some(true))
        },
    )?;
    sync_dir(dir)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_numbers_sort_as_their_values() {
        let values = [
            0u64,
            1,
            255,
            256,
            65_535,
            65_536,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ];
        let mut encoded = Vec::new();
        for &v in &values {
            let mut out = Vec::new();
            put_ordered(&mut out, v);
            assert_eq!(get_ordered(&out), Some((v, out.len())));
            encoded.push(out);
        }
        assert!(encoded.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(get_ordered(&[9, 0, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(get_ordered(&[3, 1, 2]), None);
        assert_eq!(get_ordered(&[]), None);
    }

    #[test]
    fn entries_round_trip_and_sort_like_the_memtable() {
        let mut pairs = Vec::new();
        for uid in [1u64, 7, u64::MAX] {
            for hash in [0u64, 5, 1 << 63, u64::MAX] {
                for (seq, bucket) in [(0u64, 0u64), (1, 2), (300, 1 << 33), (u64::MAX, 9)] {
                    pairs.push((uid, hash, task_id(seq, bucket)));
                }
            }
        }
        let mut entries = Vec::new();
        for &(uid, hash, id) in &pairs {
            let mut e = Vec::new();
            encode_entry(&mut e, uid, hash, id);
            assert_eq!(decode_entry(&e), Some((uid, hash, id)));
            assert!(e.len() <= ENTRY_BYTES_MAX);
            entries.push(e);
        }
        // The memtable's order: (uid, hash, seq, bucket).
        let mut by_value: Vec<usize> = (0..pairs.len()).collect();
        by_value.sort_by_key(|&i| {
            let (uid, hash, id) = pairs[i];
            let (seq, bucket) = split_id(id);
            (uid, hash, seq, bucket)
        });
        let mut by_bytes: Vec<usize> = (0..pairs.len()).collect();
        by_bytes.sort_by(|&a, &b| entries[a].cmp(&entries[b]));
        assert_eq!(by_value, by_bytes);
        let mut damaged = entries[5].clone();
        damaged.push(0);
        assert_eq!(decode_entry(&damaged), None);
        assert_eq!(decode_entry(&entries[5][..10]), None);
    }
}
