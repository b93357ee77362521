//! The free-space reserve: changes that grow the data are refused (`StoreError::DiskFull`)
//! before they touch memory or the WAL once the data directory's filesystem has less free
//! space than the reserve, so a full disk never surfaces as a failed write in the middle of a
//! call (which the engine can only answer by stopping, see `State::poison`). Delivery state
//! (claims, acks, nacks) and changes that end things (cancel, deleting a queue or metadata)
//! still write into the reserve: they are small, and they let the queues drain, after which a
//! checkpoint deletes finished bucket files and old WAL files, which frees space again.
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

    /// `Ok` if a change that writes about `incoming` bytes leaves at least the reserve free;
    /// `DiskFull` otherwise (based on a fresh reading).
    pub(super) fn admit(&self, incoming: u64) -> Result<()> {
        if self.reserve_bytes_max == 0 {
            return Ok(());
        }
        let Some((free_bytes, reserve_bytes)) = self.current(incoming) else {
            return Ok(());
        };
        if free_bytes.saturating_sub(incoming) < reserve_bytes {
            self.refused_bytes.store(incoming.max(1), Ordering::Relaxed);
            return Err(StoreError::DiskFull {
                free_bytes,
                reserve_bytes,
            });
        }
        self.refused_bytes.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `incoming` bytes that no change asked for (zeros prepared ahead in the WAL)
    /// may be written: free space stays above twice the reserve after them, so they stop
    /// well before the reserve that admitted changes and checkpoints rely on. Records no
    /// refusal (health is about changes). Counts them as written when it says yes.
    pub(super) fn room_for_extra(&self, incoming: u64) -> bool {
        let room = match self.current(incoming) {
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

    /// `(free, reserve)` when free space is below the reserve, or too close to it for the
    /// change refused last, for health reports.
    pub(super) fn low(&self) -> Option<(u64, u64)> {
        if self.reserve_bytes_max == 0 {
            return None;
        }
        let refused = self.refused_bytes.load(Ordering::Relaxed);
        let (free_bytes, reserve_bytes) = self.current(refused)?;
        (free_bytes.saturating_sub(refused) < reserve_bytes).then_some((free_bytes, reserve_bytes))
    }

    /// Estimated free bytes and the reserve, re-reading when the reading is old, much has
    /// been written since, or the estimate would refuse `incoming`. `None` if free space
    /// cannot be read.
    fn current(&self, incoming: u64) -> Option<(u64, u64)> {
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
            Some((true, free, reserve)) if free.saturating_sub(incoming) >= reserve => {
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
                Some((free_bytes, self.reserve_bytes(total_bytes)))
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
        assert!(space.admit(u64::MAX).is_ok());
        assert_eq!(space.low(), None);
    }

    #[test]
    fn a_change_larger_than_the_free_space_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let space = FreeSpace::new(dir.path(), 1);
        assert!(space.admit(0).is_ok());
        match space.admit(u64::MAX) {
            Err(StoreError::DiskFull { reserve_bytes, .. }) => assert_eq!(reserve_bytes, 1),
            other => panic!("expected DiskFull, got {other:?}"),
        }
    }
}
