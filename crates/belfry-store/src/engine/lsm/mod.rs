//! Sorted run files and what reads them: the storage under both log-structured trees of the
//! engine, the subscription tree (`subs/`) and the idempotency-key index (`keys/`).
//!
//! - `run.rs`: the immutable run file (prefix-compressed blocks, a block index, a bloom filter
//!   over each key's filtered part) and its writer;
//! - `bloom.rs`: the blocked bloom filter;
//! - `merge.rs`: merged ordered reads over sorted sources, newest first.
//!
//! The trees own their memtables, what a checkpoint records of them, and their merge policy.

pub(crate) mod bloom;
pub(crate) mod merge;
pub(crate) mod run;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use self::merge::Merge;
use self::run::{parse_run_name, run_name, Run, RunKind, RunWriter};
use crate::engine::io_at;
use crate::engine::sweep::sweep;
use crate::store::{Result, StoreError};

pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint from the front of `bytes`: the value and its length.
pub(crate) fn get_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// More runs than this and the checkpoint merges them all, whatever their sizes.
const RUNS_MAX: usize = 24;

/// How many of the newest runs to merge (0: none). Size-tiered: the newest runs are merged
/// once at least `min_runs` of them together outweigh each next older one they take in, so
/// every entry is rewritten about log2(total / memtable) times; more than [`RUNS_MAX`] runs
/// are merged whole.
pub(crate) fn pick(runs: &[Arc<Run>], min_runs: usize) -> usize {
    let min_runs = min_runs.max(2);
    if runs.len() > RUNS_MAX {
        return runs.len();
    }
    if runs.len() < min_runs {
        return 0;
    }
    let mut total = runs[0].entries;
    let mut k = 1;
    while k < runs.len() && runs[k].entries <= total {
        total += runs[k].entries;
        k += 1;
    }
    if k >= min_runs {
        k
    } else {
        0
    }
}

/// Hands the allocator's free memory back to the system after merges. A merge holds its
/// output's bloom filter and index (megabytes per million subscriptions) beside its inputs'
/// until it swaps them, and glibc keeps what they freed in its arenas: 10M subscriptions
/// measured 47-73 MiB of RSS growth from run to run, depending on which merges had run.
/// Merges are seconds apart at most, so the trim's cost (milliseconds) does not count.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim only returns free memory of glibc's heaps to the system; it takes
    // the allocator's own locks and touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Opens the runs a checkpoint lists in `dir` (footers, indexes and bloom filters only) and
/// removes every other run file there: runs written by a checkpoint that did not finish, or
/// merged away by one that did. Other names are left alone (`engine/sweep.rs`).
pub(crate) fn open_listed_runs(dir: &Path, kind: RunKind, listed: &[u64]) -> Result<Vec<Arc<Run>>> {
    fs::create_dir_all(dir).map_err(io_at("create a runs directory", dir))?;
    let mut runs = Vec::with_capacity(listed.len());
    for &id in listed {
        runs.push(Arc::new(Run::open(&dir.join(run_name(id)), id, kind)?));
    }
    sweep(
        dir,
        |name| parse_run_name(name).is_some(),
        |name| parse_run_name(name).is_some_and(|id| listed.contains(&id)),
        "run files the checkpoint does not list (written by a checkpoint that did not \
         finish, or merged away by one that did)",
    )?;
    Ok(runs)
}

/// Writes a merge's entries to the new run `id` of `kind` in `dir`, through `keep`: for each
/// entry and its liveness it answers the liveness to write, or `None` to drop the entry.
/// `filtered_hint` sizes the run's bloom filter. A run left with no entry is removed
/// (`None`). The caller syncs `dir`.
pub(crate) fn write_merged(
    dir: &Path,
    id: u64,
    kind: RunKind,
    filtered_hint: usize,
    mut merged: Merge<'_>,
    mut keep: impl FnMut(&[u8], bool) -> Result<Option<bool>>,
) -> Result<Option<Run>> {
    let mut writer = RunWriter::create(dir, id, kind, filtered_hint)?;
    let mut entry = Vec::new();
    let mut written = 0u64;
    while let Some(live) = merged.next(&mut entry)? {
        if let Some(live) = keep(&entry, live)? {
            writer.add(&entry, live)?;
            written += 1;
        }
    }
    let run = writer.finish()?;
    if written == 0 {
        fs::remove_file(&run.path).map_err(io_at("remove an empty run file", &run.path))?;
        return Ok(None);
    }
    Ok(Some(run))
}

/// Bytes a merge of `inputs` writes at most: its output is never larger than its inputs
/// together (it drops entries, never adds any).
pub(crate) fn merge_output_bound(inputs: &[Arc<Run>]) -> u64 {
    inputs.iter().map(|r| r.file_bytes).sum()
}

/// After a merge into run `id` of `dir` failed: if the disk filled up meanwhile (another
/// program wrote faster than the free-space check foresaw), removes the partial output and
/// answers `true`: the merge changed nothing else, so it is postponed rather than fatal.
/// Any other error is left to stop the engine.
pub(crate) fn postpone_full_merge(dir: &Path, id: u64, error: &StoreError) -> bool {
    let full = matches!(error, StoreError::Io { source, .. }
        if source.raw_os_error() == Some(libc::ENOSPC));
    if full {
        let path = dir.join(run_name(id));
        if let Err(e) = fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(error = %e, path = %path.display(), "remove a merge's partial output; the next open removes it");
            }
        }
        tracing::warn!(%error, path = %path.display(), "a merge of sorted runs ran out of disk space; postponed (its inputs are untouched)");
    }
    full
}
