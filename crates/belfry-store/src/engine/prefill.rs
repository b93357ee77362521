//! WAL space prepared ahead of the writer: a thread that keeps zeros, written and fsync'd,
//! just beyond where the log ends in the current WAL file.
//!
//! Why: an `fdatasync` after a write that grows a file must also write the file's metadata
//! (its size, the newly allocated blocks), a second and third device write after the data
//! itself. After a write into space already allocated and durable it writes only the data.
//! With one task per request, durable commits are small and many, so that difference is most
//! of their latency: on the development VM 290–300 µs per append+fdatasync against 200–210 µs
//! for the same write over durable zeros (`BENCHMARKS.md`, "WAL space prepared ahead").
//!
//! Zeros cost a write of their own, so the prefiller only prepares space while commits are
//! small: when the WAL has averaged at most [`SMALL_COMMIT_BYTES`] per fsync since it last
//! decided. Batched ingest (hundreds of KB per fsync) gains little from it and would pay the
//! extra write at its full rate, so it is left to append.
//!
//! Disk space: zeros are written only while free space stays above twice the free-space
//! reserve (`space.rs`), so they never take room that admitted changes or a checkpoint need.
//!
//! Safety: the prefiller writes zeros only at `WalWriter::zeroed` or beyond, under the writer
//! lock, and frames are written at `WalWriter::pos <= zeroed` under the same lock, so zeros
//! never land on a frame. Recovery reads a zero frame header as the end of a file's log
//! (`recovery.rs`). Its fsync is of the same open file as the writer's, so a failure there
//! may have dropped frames' pages too: like the flusher's, it stops the engine.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use super::Core;

/// Zeros kept ahead of the log's end at most.
pub(super) const LEAD: u64 = 1024 * 1024;
/// The most zeros that can lie beyond the log's end in a WAL file: a fill stops once `LEAD`
/// lie ahead, after a piece that may take it up to a piece past that. Recovery reads a
/// longer run of zeros after the last frame as damage (`wal_tail.rs`).
pub(super) const PREPARED_ZEROS_MAX: u64 = LEAD + PIECE as u64;
/// A write that leaves fewer zeros than this ahead asks for more.
pub(super) const LOW_WATER: u64 = LEAD / 2;
/// Zeros written per hold of the writer lock: short enough that a writer waiting for the lock
/// waits for one piece (tens of µs), long enough that a fill takes few holds.
const PIECE: usize = 64 * 1024;
/// Commits averaging more bytes than this per fsync are left to append (see above).
pub(super) const SMALL_COMMIT_BYTES: u64 = 64 * 1024;
/// After declining, the prefiller is not asked again before the log grows by this much.
const DECLINED_SPACING: u64 = LEAD;

/// The prefiller thread; stopped (joined) when dropped.
#[derive(Debug)]
pub(super) struct Prefiller {
    core: Arc<Core>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Prefiller {
    pub(super) fn start(core: Arc<Core>) -> Prefiller {
        let thread_core = Arc::clone(&core);
        let handle = thread::Builder::new()
            .name("belfry-wal-prefill".into())
            .spawn(move || run(&thread_core))
            .ok();
        if handle.is_none() {
            tracing::warn!("could not start the WAL prefill thread; the WAL grows by appending");
        }
        Prefiller { core, handle }
    }
}

impl Drop for Prefiller {
    fn drop(&mut self) {
        self.core.wal.writer.lock().closing = true;
        self.core.wal.prefill_wake.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The WAL's counters when the prefiller last decided, to judge the commits since.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    written: u64,
    syncs: u64,
}

impl Seen {
    fn now(wal: &super::wal::Wal) -> Seen {
        Seen {
            written: wal.written.load(Ordering::Acquire),
            syncs: wal.syncs.load(Ordering::Relaxed),
        }
    }

    /// Whether the commits between `self` and `later` were small on average.
    fn small_commits_until(self, later: Seen) -> bool {
        let syncs = later.syncs.saturating_sub(self.syncs);
        let written = later.written.saturating_sub(self.written);
        syncs > 0 && written / syncs <= SMALL_COMMIT_BYTES
    }
}

fn run(core: &Core) {
    let wal = &core.wal;
    let zeros = vec![0u8; PIECE];
    let mut seen = Seen::default();
    loop {
        {
            let mut writer = wal.writer.lock();
            while !writer.prefill_asked && !writer.closing {
                wal.prefill_wake.wait(&mut writer);
            }
            if writer.closing {
                return;
            }
            writer.prefill_asked = false;
            let now = Seen::now(wal);
            let worth_it = seen.small_commits_until(now);
            seen = now;
            if !worth_it {
                writer.ask_from = writer.pos + DECLINED_SPACING;
                continue;
            }
        }
        let Some(file) = fill(core, &zeros) else {
            continue;
        };
        if wal.failed.load(Ordering::Acquire) {
            continue;
        }
        if let Err(source) = file.sync_data() {
            wal.stop_after_background_fsync(&crate::store::StoreError::Io {
                context: "fsync zeros prepared in the WAL",
                path: None,
                source,
            });
        }
    }
}

/// Writes zeros beyond the log's end, a piece per hold of the writer lock, until `LEAD` of
/// them lie ahead. Returns the file written, if anything was.
fn fill(core: &Core, zeros: &[u8]) -> Option<Arc<std::fs::File>> {
    let mut written_to: Option<Arc<std::fs::File>> = None;
    loop {
        let mut writer = core.wal.writer.lock();
        if writer.closing || writer.zeroed - writer.pos >= LEAD {
            return written_to;
        }
        // A checkpoint switched files since the last piece: the old file's zeros go unused
        // (it is deleted once checkpointed); the new file is filled by a later request.
        if written_to
            .as_ref()
            .is_some_and(|file| !Arc::ptr_eq(file, &writer.file))
        {
            return written_to;
        }
        // Zeros are the first writes to stop as the disk fills: never into the reserve.
        if !core.space.room_for_extra(zeros.len() as u64) {
            writer.ask_from = writer.pos + DECLINED_SPACING;
            return written_to;
        }
        let at = writer.zeroed;
        if let Err(error) = std::os::unix::fs::FileExt::write_all_at(&*writer.file, zeros, at) {
            // Nothing relies on zeros (a full disk, say): the writer appends instead.
            tracing::debug!(%error, "could not prepare WAL space; the WAL grows by appending");
            writer.ask_from = writer.pos + DECLINED_SPACING;
            return written_to;
        }
        writer.zeroed = at + zeros.len() as u64;
        written_to.get_or_insert_with(|| Arc::clone(&writer.file));
    }
}
