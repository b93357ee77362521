//! The free-space reserve: changes that grow the data are refused (`StoreError::DiskFull`)
//! before they touch memory or the WAL once the data directory's filesystem has less free
//! space than the reserve, so a full disk never surfaces as a failed write in the middle of a
//! call (which the engine can only answer by stopping, see `State::poison`).
//!
//! The reserve is spent in layers ([`Use`]), so that nothing the engine writes by itself
//! reaches the end of the disk:
//! - delivery state that can repeat without end (claims, nacks, extensions) goes on into the
//!   reserve down to the *delivery floor*, a quarter of it: the queues drain, and a consumer
//!   that leases without acking cannot spend the rest;
//! - changes that end something (acks, cancels, dead letters) go on down to an eighth of it:
//!   each task ends once, so they are bounded by what was leased or scheduled;
//! - the last eighth is the checkpoint's: it writes the buffered bucket bytes and the
//!   checkpoint file, then deletes the old WAL and finished buckets, which frees space.
//!
//! While free space is below the reserve, checkpoints come sooner (`low_space`, see
//! `Engine::checkpoint_due`), so the WAL they delete stays small. Merges of sorted runs (which
//! write a copy of their inputs before deleting them) start only if their output fits above
//! the whole reserve (`room_for_merge`), and are postponed otherwise.
//!
//! Free space is read with `statvfs`, at most every `FREE_SPACE_RECHECK_INTERVAL` while it is
//! well above the reserve; in between, the bytes the engine wrote since the last reading are
//! subtracted from it, and a call that the estimate would put below the reserve reads it
//! again at once. So a burst cannot run far past a stale reading, and a refusal is always
//! based on a fresh one (space freed by an operator is seen by the next call).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::{Result, StoreError};

/// Longest time a free-space reading is trusted while free space is well above the reserve:
/// short enough that a disk filled by another process is noticed within a few hundred puts
/// at full speed, long enough that `statvfs` costs nothing measurable.
pub(super) const FREE_SPACE_RECHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes written since the last reading after which it is re-read whatever its age.
pub(super) const FREE_SPACE_RECHECK_BYTES: u64 = 4 * 1024 * 1024;
/// On a filesystem smaller than eight times the configured reserve, the reserve is an eighth
/// of the filesystem instead (see `EngineOptions::free_space_reserve_bytes`).
pub(super) const FREE_SPACE_RESERVE_FRACTION: u64 = 8;
/// Claims, nacks and extensions stop once free space falls below this fraction of the reserve
/// (the delivery floor): what is left is for acks and cancels, then checkpoints.
pub(super) const DELIVERY_FLOOR_FRACTION: u64 = 4;
/// Acks, cancels and dead letters stop below this fraction of the reserve: the rest is the
/// checkpoint's (buffered bucket bytes and the checkpoint file), the one writer that frees
/// space.
pub(super) const ENDING_FLOOR_FRACTION: u64 = 8;
const _: () = assert!(DELIVERY_FLOOR_FRACTION < ENDING_FLOOR_FRACTION);

/// How far into the reserve a change may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// Grows the data (puts, reschedules, redrives, queue and metadata puts, subscribes):
    /// leaves the whole reserve free.
    Growth,
    /// Delivery state that can repeat without end (claims, nacks, extensions): down to the
    /// delivery floor.
    Delivery,
    /// Ends a task (acks, cancels, dead letters): down to the last eighth of the reserve.
    Ending,
}

impl Use {
    /// The free space this use must leave, under `reserve_bytes`.
    fn floor(self, reserve_bytes: u64) -> u64 {
        match self {
            Use::Growth => reserve_bytes,
            Use::Delivery => reserve_bytes / DELIVERY_FLOOR_FRACTION,
            Use::Ending => reserve_bytes / ENDING_FLOOR_FRACTION,
        }
    }
}

/// A free-space reading of the data directory's filesystem.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    /// Bytes available to unprivileged writers (`f_bavail`): the conservative figure.
    free_bytes: u64,
    total_bytes: u64,
    /// `FreeSpace::written` when this reading was taken.
    written_at: u64,
}

/// The free-space reserve of one data directory.
#[derive(Debug)]
pub(super) struct FreeSpace {
    dir: PathBuf,
    reserve_bytes_max: u64,
    /// Bytes the engine wrote to the data directory (WAL and bucket files) since it opened.
    written: AtomicU64,
    reading: Mutex<Option<Reading>>,
    /// Set once `statvfs` failed (logged once): the reserve is then not enforced.
    unreadable: AtomicBool,
    /// The size of the change refused last, `0` once one was admitted after it: health
    /// reports low space while a change that size would still be refused.
    refused_bytes: AtomicU64,
    /// Whether the last estimate was below the reserve: checkpoints then come sooner.
    low: AtomicBool,
    /// The reserve in force at the last reading (`0` before the first or when unreadable).
    reserve_in_force: AtomicU64,
    /// Whether a postponed merge was logged since the last merge that had room (one line
    /// per episode, not one per checkpoint).
    merge_postponed: AtomicBool,
}

impl FreeSpace {
    pub(super) fn new(dir: &Path, reserve_bytes_max: u64) -> FreeSpace {
        FreeSpace {
            dir: dir.to_path_buf(),
            reserve_bytes_max,
            written: AtomicU64::new(0),
            reading: Mutex::new(None),
            unreadable: AtomicBool::new(false),
            refused_bytes: AtomicU64::new(0),
            low: AtomicBool::new(false),
            reserve_in_force: AtomicU64::new(0),
            merge_postponed: AtomicBool::new(false),
        }
    }

    /// Counts bytes written to the data directory since the last reading.
    pub(super) fn wrote(&self, bytes: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The reserve in force on a filesystem of `total_bytes`.
    pub(super) fn reserve_bytes(&self, total_bytes: u64) -> u64 {
        self.reserve_bytes_max
            .min(total_bytes / FREE_SPACE_RESERVE_FRACTION)
    }

    /// `Ok` if a change of kind `usage` that writes about `incoming` bytes leaves at least
    /// its floor free (the whole reserve for growth); `DiskFull` otherwise (based on a fresh
    /// reading).
    pub(super) fn admit(&self, incoming: u64, usage: Use) -> Result<()> {
        if self.reserve_bytes_max == 0 {
            return Ok(());
        }
        let floor_of = |reserve| usage.floor(reserve);
        let Some((free_bytes, reserve_bytes)) = self.current(incoming, floor_of) else {
            return Ok(());
        };
        let floor_bytes = floor_of(reserve_bytes);
        let refused = free_bytes.saturating_sub(incoming) < floor_bytes;
        if usage == Use::Growth {
            let refused_bytes = if refused { incoming.max(1) } else { 0 };
            self.refused_bytes.store(refused_bytes, Ordering::Relaxed);
        }
        if refused {
            return Err(StoreError::DiskFull {
                free_bytes,
                needed_bytes: incoming,
                floor_bytes,
                reserve_bytes,
            });
        }
        Ok(())
    }

    /// Whether a merge that writes about `output` bytes (its inputs stay until the next
    /// checkpoint) leaves the whole reserve free. Logs the first postponement of an episode;
    /// merges are tried again after later checkpoints.
    pub(super) fn room_for_merge(&self, output: u64, what: &str) -> bool {
        if self.reserve_bytes_max == 0 {
            return true;
        }
        let room = match self.current(output, |reserve| reserve) {
            None => true,
            Some((free_bytes, reserve_bytes)) => {
                let room = free_bytes.saturating_sub(output) >= reserve_bytes;
                if !room && !self.merge_postponed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        free_bytes,
                        output_bytes = output,
                        reserve_bytes,
                        dir = %self.dir.display(),
                        "{what} postponed: its output would not leave the free-space reserve; \
                         it runs once there is room (reads look at more runs meanwhile)"
                    );
                }
                room
            }
        };
        if room && self.merge_postponed.swap(false, Ordering::Relaxed) {
            tracing::info!(dir = %self.dir.display(), "merges of sorted runs have room again");
        }
        room
    }

    /// Whether free space was below the reserve at the last estimate.
    pub(super) fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// The reserve in force at the last reading (`0`: none yet, or the reserve is off).
    pub(super) fn reserve_in_force(&self) -> u64 {
        self.reserve_in_force.load(Ordering::Relaxed)
    }

    /// Whether `incoming` bytes that no change asked for (zeros prepared ahead in the WAL)
    /// may be written: free space stays above twice the reserve after them, so they stop
    /// well before the reserve that admitted changes and checkpoints rely on. Records no
    /// refusal (health is about changes). Counts them as written when it says yes.
    pub(super) fn room_for_extra(&self, incoming: u64) -> bool {
        let room = match self.current(incoming, |reserve| reserve.saturating_mul(2)) {
            None => true,
            Some((free_bytes, reserve_bytes)) => {
                free_bytes.saturating_sub(incoming) >= reserve_bytes.saturating_mul(2)
            }
        };
        if room {
            self.wrote(incoming);
        }
        room
    }

    /// When free space is below the reserve, or too close to it for the change refused
    /// last: `(free, reserve, size of that change)`, for health reports.
    pub(super) fn low(&self) -> Option<(u64, u64, u64)> {
        if self.reserve_bytes_max == 0 {
            return None;
        }
        let refused = self.refused_bytes.load(Ordering::Relaxed);
        let (free_bytes, reserve_bytes) = self.current(refused, |reserve| reserve)?;
        (free_bytes.saturating_sub(refused) < reserve_bytes).then_some((
            free_bytes,
            reserve_bytes,
            refused,
        ))
    }

    /// Estimated free bytes and the reserve, re-reading when the reading is old, much has
    /// been written since, or the estimate would leave less than `floor_of(reserve)` after
    /// `incoming`. `None` if free space cannot be read.
    fn current(&self, incoming: u64, floor_of: impl Fn(u64) -> u64) -> Option<(u64, u64)> {
        let mut reading = self.reading.lock();
        let written = self.written.load(Ordering::Relaxed);
        let estimate = reading.map(|r| {
            let since = written.saturating_sub(r.written_at);
            let fresh =
                r.at.elapsed() < FREE_SPACE_RECHECK_INTERVAL && since < FREE_SPACE_RECHECK_BYTES;
            let free = r.free_bytes.saturating_sub(since);
            (fresh, free, self.reserve_bytes(r.total_bytes))
        });
        match estimate {
            Some((true, free, reserve)) if free.saturating_sub(incoming) >= floor_of(reserve) => {
                self.low.store(free < reserve, Ordering::Relaxed);
                return Some((free, reserve));
            }
            _ => {}
        }
        match statvfs(&self.dir) {
            Ok((free_bytes, total_bytes)) => {
                *reading = Some(Reading {
                    at: Instant::now(),
                    free_bytes,
                    total_bytes,
                    written_at: written,
                });
                let reserve = self.reserve_bytes(total_bytes);
                self.low.store(free_bytes < reserve, Ordering::Relaxed);
                self.reserve_in_force.store(reserve, Ordering::Relaxed);
                Some((free_bytes, reserve))
            }
            Err(error) => {
                if !self.unreadable.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %error,
                        dir = %self.dir.display(),
                        "cannot read the data directory's free space; the free-space reserve is not enforced"
                    );
                }
                None
            }
        }
    }
}

/// Free bytes of the filesystem holding `dir` (or its nearest existing ancestor, for a data
/// directory not created yet); `None` if unreadable.
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    dir.ancestors()
        .find(|d| d.exists())
        .and_then(|d| statvfs(d).ok())
        .map(|(free, _)| free)
}

/// `error` from opening `dir`, turned into [`StoreError::NoSpaceToOpen`] if the disk was
/// full: how much recovery needs (the WAL it copies into bucket files, and a checkpoint; both
/// are still on disk, since the old WAL goes only once the new checkpoint is written) and
/// how much was free when the open began (`free_before`).
pub(super) fn explain_open_failure(
    dir: &Path,
    free_before: Option<u64>,
    error: StoreError,
) -> StoreError {
    let source = match error {
        StoreError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => source,
        other => return other,
    };
    let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let wal_bytes: u64 = std::fs::read_dir(dir.join(super::WAL_DIR))
        .map(|entries| entries.flatten().map(|e| size(&e.path())).sum())
        .unwrap_or(0);
    let checkpoint_bytes = size(&dir.join(super::CHECKPOINT_FILE));
    StoreError::NoSpaceToOpen {
        dir: dir.display().to_string(),
        free_bytes: free_before.or_else(|| free_bytes(dir)).unwrap_or(0),
        needed_bytes: wal_bytes + checkpoint_bytes,
        wal_bytes,
        checkpoint_bytes,
        source,
    }
}

/// `(available bytes, total bytes)` of the filesystem holding `dir`. The one `unsafe` of the
/// crate: std has no `statvfs`, and this is the whole of its use.
#[allow(unsafe_code)]
fn statvfs(dir: &Path) -> std::io::Result<(u64, u64)> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the data directory's path holds a NUL byte"))?;
    // SAFETY: `statvfs` is a plain C struct of integers, for which all zeroes is valid.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stats` a properly sized, writable
    // `statvfs` that the call fills in; nothing is read from it unless the call succeeded.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fragment = stats.f_frsize as u64;
    Ok((
        (stats.f_bavail as u64).saturating_mul(fragment),
        (stats.f_blocks as u64).saturating_mul(fragment),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_an_eighth_of_a_small_filesystem() {
        let space = FreeSpace::new(Path::new("/"), 64 << 20);
        assert_eq!(space.reserve_bytes(8 << 20), 1 << 20);
        assert_eq!(space.reserve_bytes(1 << 40), 64 << 20);
    }

    #[test]
    fn a_zero_reserve_admits_everything() {
        let space = FreeSpace::new(Path::new("/nonexistent"), 0);
        assert!(space.admit(u64::MAX, Use::Growth).is_ok());
        assert_eq!(space.low(), None);
    }

    #[test]
    fn a_change_larger_than_the_free_space_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let space = FreeSpace::new(dir.path(), 1);
        assert!(space.admit(0, Use::Growth).is_ok());
        match space.admit(u64::MAX, Use::Growth) {
            Err(StoreError::DiskFull {
                reserve_bytes,
                floor_bytes,
                needed_bytes,
                ..
            }) => {
                assert_eq!(reserve_bytes, 1);
                assert_eq!(floor_bytes, 1);
                assert_eq!(needed_bytes, u64::MAX);
            }
            other => panic!("expected DiskFull, got {other:?}"),
        }
    }

    #[test]
    fn deliveries_go_deeper_into_the_reserve_than_growth_and_endings_deeper_still() {
        let reserve = 64 << 20;
        assert_eq!(Use::Growth.floor(reserve), reserve);
        assert_eq!(Use::Delivery.floor(reserve), 16 << 20);
        assert_eq!(Use::Ending.floor(reserve), 8 << 20);
    }
}
