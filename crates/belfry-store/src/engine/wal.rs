//! The write-ahead log: the current WAL file, group commit (one `write` and one `fsync`
//! shared by every caller waiting at the time) and the background flusher that bounds how
//! long written bytes stay unsynced.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{io, io_at, persist, Engine, FsyncPolicy, WAL_DIR};
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

/// The current WAL file, where the log ends in it, and how far ahead of that end it holds
/// zeros (see `prefill.rs`). Guarded by `Wal::writer`, which the prefiller also takes for
/// each piece it writes, so frames and zeros never overlap.
#[derive(Debug)]
pub(super) struct WalWriter {
    /// Shared so that an fsync can run without holding the write lock.
    pub(super) file: Arc<File>,
    pub(super) number: u64,
    /// Where the next frame goes in `file`: the bytes written to it so far.
    pub(super) pos: u64,
    /// `file` holds frames or zeros up to here (`>= pos`): writes below it overwrite space
    /// that is already allocated, whose fsync need not touch the file's metadata.
    pub(super) zeroed: u64,
    /// The prefiller is asked for more zeros once a write leaves fewer than
    /// `prefill::LOW_WATER` of them, and `pos` has reached this (it sets it further on when
    /// it declines, so a writer it turned down does not ask at every write).
    pub(super) ask_from: u64,
    /// Set by a writer, cleared by the prefiller when it takes the request.
    pub(super) prefill_asked: bool,
    /// Set when the engine closes: the prefiller stops.
    pub(super) closing: bool,
}

impl WalWriter {
    fn new(file: File, number: u64) -> WalWriter {
        WalWriter {
            file: Arc::new(file),
            number,
            pos: 0,
            zeroed: 0,
            ask_from: 0,
            prefill_asked: false,
            closing: false,
        }
    }

    /// Writes `bytes` where the log ends in the current file. Returns whether the prefiller
    /// should be woken (more zeros wanted ahead).
    pub(super) fn append(&mut self, bytes: &[u8]) -> std::io::Result<bool> {
        self.file.write_all_at(bytes, self.pos)?;
        self.pos += bytes.len() as u64;
        self.zeroed = self.zeroed.max(self.pos);
        let wanted = !self.prefill_asked
            && self.pos >= self.ask_from
            && self.zeroed - self.pos < super::prefill::LOW_WATER;
        self.prefill_asked |= wanted;
        Ok(wanted)
    }

    /// Makes `file` (new, empty) the current WAL file; returns the previous one.
    pub(super) fn switch(&mut self, file: File, number: u64) -> Arc<File> {
        let closing = self.closing;
        let old = std::mem::replace(self, WalWriter::new(file, number));
        self.closing = closing;
        old.file
    }
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
    /// Wakes the prefiller (used with `writer`).
    pub(super) prefill_wake: Condvar,
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
    /// Test fault point: the next WAL fsync fails with `EIO` (see `Engine::fail_next_fsync`).
    #[cfg(any(test, feature = "fault-injection"))]
    pub(super) fail_next_sync: AtomicBool,
}

impl Wal {
    /// A WAL that writes to `file` (new, empty), WAL file number `number`.
    pub(super) fn new(file: File, number: u64) -> Wal {
        Wal {
            sync: Mutex::new(SyncState {
                last_sync: Instant::now(),
            }),
            writer: Mutex::new(WalWriter::new(file, number)),
            prefill_wake: Condvar::new(),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            #[cfg(any(test, feature = "fault-injection"))]
            fail_next_sync: AtomicBool::new(false),
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
        #[cfg(any(test, feature = "fault-injection"))]
        if self.fail_next_sync.swap(false, Ordering::AcqRel) {
            return Err(crate::store::StoreError::Io {
                context: "fsync the WAL",
                path: None,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        // Bytes written before `end` are in this file or in older ones, which were fsync'd
        // when the checkpoint switched away from them.
        file.sync_data().map_err(io("fsync the WAL"))?;
        sync.last_sync = Instant::now();
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced.fetch_max(end, Ordering::Release);
        Ok(())
    }

    /// A background thread's fsync of the WAL file failed (the flusher's, the prefiller's):
    /// the kernel may have dropped written pages, so the engine stops and every later call
    /// answers why.
    pub(super) fn stop_after_background_fsync(&self, error: &crate::store::StoreError) {
        let advice = super::poison_advice(error);
        tracing::error!(%error, advice, "background WAL fsync failed; the engine stops");
        *self.failure.lock() = Some(format!("{error}. {advice}"));
        self.failed.store(true, Ordering::Release);
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
                    wal.stop_after_background_fsync(&error);
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
        let mut writer = self.core.wal.writer.lock();
        if self.core.wal.written.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let (bytes, end) = {
            let mut state = self.core.state.lock();
            state.check()?;
            (std::mem::take(&mut state.wal_pending), state.wal_appended)
        };
        match writer.append(&bytes).map_err(io("append to the WAL")) {
            Ok(true) => {
                self.core.wal.prefill_wake.notify_one();
            }
            Ok(false) => {}
            Err(error) => return Err(self.core.state.lock().poison(&error)),
        };
        self.core.wal.writes.fetch_add(1, Ordering::Relaxed);
        self.core.wal.written.store(end, Ordering::Release);
        // Each byte goes to the WAL now and to its bucket file later.
        self.core.space.wrote(2 * bytes.len() as u64);
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
        // Another call's fsync may have failed since this frame was written: then a later
        // fsync proves nothing (the kernel may have dropped the pages), so this call must not
        // be acknowledged either.
        self.check_open()?;
        self.core
            .wal
            .sync_written(&mut sync)
            .map_err(|error| self.core.state.lock().poison(&error))
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
                            return Err(self.core.state.lock().poison(&error));
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Creates WAL file `number`, empty. Frames are written by position (`WalWriter::append`),
/// not in append mode: the file may hold zeros beyond the log's end.
pub(super) fn create_wal(dir: &Path, number: u64) -> Result<File> {
    // It exists already only if a checkpoint created it and stopped before switching to it:
    // then it is empty. Not truncated: were that ever wrong, recovery would refuse the bytes
    // left after the new frames rather than lose them silently.
    let path = wal_path(dir, number);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_at("create a WAL file", &path))?;
    persist::sync_dir(&dir.join(WAL_DIR))?;
    Ok(file)
}

pub(super) fn old_wal_files(dir: &Path) -> Result<Vec<u64>> {
    let mut numbers = Vec::new();
    let wal_dir = dir.join(WAL_DIR);
    for entry in fs::read_dir(&wal_dir).map_err(io_at("list the WAL directory", &wal_dir))? {
        let entry = entry.map_err(io_at("list the WAL directory", &wal_dir))?;
        if let Some(n) = entry.file_name().to_str().and_then(parse_wal_name) {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

#[cfg(test)]
mod tests {
    use belfry_core::{NewTask, QueueName, TaskId, TaskState};

    use crate::store::{Store, StoreError, StoreHealth};
    use crate::{Engine, EngineOptions};

    const NOW: u64 = 1_767_225_600_000;

    fn put(engine: &Engine, queue: &QueueName, n: u64) -> crate::store::Result<TaskId> {
        let task = NewTask::new(queue.clone(), NOW + 60_000 + n, format!("{n}"));
        Ok(engine.put(vec![task])?[0].id())
    }

    /// Every acknowledged task of `acknowledged` is in the directory after a reopen.
    fn assert_kept(dir: &std::path::Path, queue: &QueueName, acknowledged: &[TaskId]) {
        let engine = Engine::open(dir, EngineOptions::default()).expect("the engine reopens");
        for id in acknowledged {
            let task = engine.get(queue, *id, NOW).unwrap();
            assert_eq!(task.map(|t| t.state), Some(TaskState::Scheduled), "{id}");
        }
    }

    /// A failed fsync of a put stops the engine: that put fails, every later call answers
    /// `Poisoned` with a reason that says what to do, and `health` reports it; after a
    /// restart, every put acknowledged before is there.
    #[test]
    fn a_failed_fsync_poisons_the_engine_and_loses_nothing_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let queue = QueueName::new("q").unwrap();
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        engine.put_queue(&queue, bytes::Bytes::new()).unwrap();
        let acknowledged: Vec<TaskId> = (0..50).map(|n| put(&engine, &queue, n).unwrap()).collect();

        engine.fail_next_fsync();
        // The put whose fsync failed learns it stopped the engine, and why.
        for n in 50..53 {
            match put(&engine, &queue, n) {
                Err(StoreError::Poisoned(reason)) => {
                    assert!(reason.contains("fsync the WAL"), "{reason}");
                    assert!(reason.contains("restart belfry"), "{reason}");
                }
                other => panic!("expected Poisoned, got {other:?}"),
            }
        }
        assert!(matches!(
            engine.get(&queue, acknowledged[0], NOW),
            Err(StoreError::Poisoned(_))
        ));
        assert!(matches!(
            engine.claim(&queue, NOW + 120_000, 10, 1_000),
            Err(StoreError::Poisoned(_))
        ));
        assert!(matches!(engine.health(), StoreHealth::Poisoned(r) if r.contains("dmesg")));
        drop(engine);
        assert_kept(dir.path(), &queue, &acknowledged);
    }

    /// The background flusher's fsync (of delivery state written without one) failing stops
    /// the engine as well: the next call, whatever it is, answers `Poisoned`.
    #[test]
    fn a_failed_background_fsync_poisons_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let queue = QueueName::new("q").unwrap();
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        engine.put_queue(&queue, bytes::Bytes::new()).unwrap();
        let acknowledged: Vec<TaskId> = (0..10).map(|n| put(&engine, &queue, n).unwrap()).collect();
        engine.fail_next_fsync();
        // A claim writes its leases without an fsync; the flusher fsyncs them within 20 ms.
        let claimed = engine.claim(&queue, NOW + 120_000, 1, 60_000).unwrap();
        assert_eq!(claimed.leased.len(), 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !matches!(engine.health(), StoreHealth::Poisoned(_)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the flusher never failed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(matches!(
            engine.counts(&queue, NOW),
            Err(StoreError::Poisoned(r)) if r.contains("fsync")
        ));
        drop(engine);
        // The claimed task may come back leased (its lease record was written): still there.
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        for id in &acknowledged {
            assert!(engine.get(&queue, *id, NOW).unwrap().is_some(), "{id}");
        }
    }
}
