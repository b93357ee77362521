//! The write-ahead log: the current WAL file, group commit (one `write` and one `fsync`
//! shared by every caller waiting at the time) and the background flusher that bounds how
//! long written bytes stay unsynced.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{io, persist, Engine, FsyncPolicy, WAL_DIR};
use crate::store::Result;

pub(super) fn wal_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(WAL_DIR).join(format!("{number:016x}.wal"))
}

pub(super) fn parse_wal_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// The current WAL file. Guarded by `Wal::writer`.
#[derive(Debug)]
pub(super) struct WalWriter {
    /// Shared so that an fsync can run without holding the write lock.
    pub(super) file: Arc<File>,
    pub(super) number: u64,
}

/// Guarded by `Wal::sync`, which serialises fsyncs and WAL file switches.
#[derive(Debug)]
pub(super) struct SyncState {
    pub(super) last_sync: Instant,
}

/// The write-ahead log and how far it is written and fsync'd. Positions are logical: bytes
/// appended by this process (`State::wal_appended`), across WAL files.
#[derive(Debug)]
pub(super) struct Wal {
    pub(super) sync: Mutex<SyncState>,
    pub(super) writer: Mutex<WalWriter>,
    /// WAL bytes handed to the OS (they survive a crash of the process).
    pub(super) written: AtomicU64,
    /// WAL bytes fsync'd (they survive a crash of the machine).
    pub(super) synced: AtomicU64,
    /// Writes and fsyncs done: with concurrent callers there are fewer than calls.
    pub(super) writes: AtomicU64,
    pub(super) syncs: AtomicU64,
    /// Set when a background fsync failed: after a failed fsync the kernel may have dropped
    /// the dirty pages, so a later successful fsync proves nothing and the engine must stop.
    pub(super) failed: AtomicBool,
    pub(super) failure: Mutex<Option<String>>,
}

impl Wal {
    /// A WAL that appends to `file`, WAL file number `number`, nothing written yet.
    pub(super) fn new(file: File, number: u64) -> Wal {
        Wal {
            sync: Mutex::new(SyncState {
                last_sync: Instant::now(),
            }),
            writer: Mutex::new(WalWriter {
                file: Arc::new(file),
                number,
            }),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        }
    }

    /// fsyncs everything written so far unless that is already done. The caller holds
    /// `sync` (passed in), so no WAL file switch happens meanwhile.
    pub(super) fn sync_written(&self, sync: &mut SyncState) -> Result<()> {
        let (file, end) = {
            let writer = self.writer.lock();
            (
                Arc::clone(&writer.file),
                self.written.load(Ordering::Acquire),
            )
        };
        if self.synced.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        // Bytes written before `end` are in this file or in older ones, which were fsync'd
        // when the checkpoint switched away from them.
        file.sync_data().map_err(io("fsync the WAL"))?;
        sync.last_sync = Instant::now();
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced.fetch_max(end, Ordering::Release);
        Ok(())
    }

    pub(super) fn unsynced(&self) -> bool {
        self.synced.load(Ordering::Acquire) < self.written.load(Ordering::Acquire)
    }
}

/// A thread that fsyncs written but unsynced WAL bytes every `period`, so the bound on how
/// long they stay unsynced holds even when no further call arrives: under
/// `FsyncPolicy::Interval`, and for delivery state under `FsyncPolicy::Always`.
#[derive(Debug)]
pub(super) struct Flusher {
    pub(super) stop: Arc<(Mutex<bool>, Condvar)>,
    pub(super) handle: Option<thread::JoinHandle<()>>,
}

impl Flusher {
    pub(super) fn start(wal: Arc<Wal>, period: Duration) -> Flusher {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("belfry-wal-fsync".into())
            .spawn(move || loop {
                {
                    let (stopped, wake) = &*signal;
                    let mut stopped = stopped.lock();
                    if !*stopped {
                        wake.wait_for(&mut stopped, period);
                    }
                    if *stopped {
                        return;
                    }
                }
                if !wal.unsynced() || wal.failed.load(Ordering::Acquire) {
                    continue;
                }
                let mut sync = wal.sync.lock();
                if let Err(error) = wal.sync_written(&mut sync) {
                    tracing::error!(%error, "background WAL fsync failed; the engine stops");
                    *wal.failure.lock() = Some(error.to_string());
                    wal.failed.store(true, Ordering::Release);
                }
            })
            .ok();
        if handle.is_none() {
            tracing::warn!(
                "could not start the WAL fsync thread; unsynced records wait for the next fsync"
            );
        }
        Flusher { stop, handle }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock() = true;
        wake.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Engine {
    /// Makes sure the WAL is written to the OS up to `ticket`, writing every queued frame
    /// ourselves unless a writer already did (group commit of writes: one `write` for all
    /// frames queued when the writer took the lock).
    pub(super) fn write_through(&self, ticket: u64) -> Result<()> {
        if self.core.wal.written.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let writer = self.core.wal.writer.lock();
        if self.core.wal.written.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let (bytes, end) = {
            let mut state = self.core.state.lock();
            state.check()?;
            (std::mem::take(&mut state.wal_pending), state.wal_appended)
        };
        if let Err(error) = (&*writer.file)
            .write_all(&bytes)
            .map_err(io("append to the WAL"))
        {
            self.core.state.lock().poison(&error);
            return Err(error);
        }
        self.core.wal.writes.fetch_add(1, Ordering::Relaxed);
        self.core.wal.written.store(end, Ordering::Release);
        Ok(())
    }

    /// Makes sure the WAL is fsync'd up to `ticket` (already written): whoever takes the sync
    /// lock fsyncs everything written so far, and the others find their frames covered.
    pub(super) fn sync_through(&self, ticket: u64) -> Result<()> {
        if self.core.wal.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let mut sync = self.core.wal.sync.lock();
        if self.core.wal.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let result = self.core.wal.sync_written(&mut sync);
        if let Err(error) = &result {
            self.core.state.lock().poison(error);
        }
        result
    }

    /// Waits until the WAL holds everything up to `ticket` as the fsync policy asks. A
    /// `delivery` call (lease, ack, nack, extend, dead letter) waits only for the write,
    /// unless `sync_delivery` is set.
    pub(super) fn wait_durable(&self, ticket: u64, delivery: bool) -> Result<()> {
        self.write_through(ticket)?;
        match self.core.options.fsync {
            FsyncPolicy::Always if !delivery || self.core.options.sync_delivery => {
                self.sync_through(ticket)
            }
            FsyncPolicy::Always | FsyncPolicy::Never => Ok(()),
            FsyncPolicy::Interval(every) => {
                // Opportunistic: fsync now if it is overdue and no one else is at it; the
                // background flusher keeps the bound otherwise.
                if let Some(mut sync) = self.core.wal.sync.try_lock() {
                    if sync.last_sync.elapsed() >= every {
                        if let Err(error) = self.core.wal.sync_written(&mut sync) {
                            self.core.state.lock().poison(&error);
                            return Err(error);
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

pub(super) fn create_wal(dir: &Path, number: u64) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(wal_path(dir, number))
        .map_err(io("create a WAL file"))?;
    persist::sync_dir(&dir.join(WAL_DIR))?;
    Ok(file)
}

pub(super) fn old_wal_files(dir: &Path) -> Result<Vec<u64>> {
    let mut numbers = Vec::new();
    for entry in fs::read_dir(dir.join(WAL_DIR)).map_err(io("list the WAL directory"))? {
        let entry = entry.map_err(io("list the WAL directory"))?;
        if let Some(n) = entry.file_name().to_str().and_then(parse_wal_name) {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}
