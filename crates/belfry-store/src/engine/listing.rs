//! `Store::list_tasks` on the engine: a queue's live tasks (scheduled or leased) in pages, in
//! home-bucket order, then sequence order, without loading a bucket to list it.
//!
//! A walk may pass far buckets of millions of tasks. Loading one (an entry per task) to list
//! a page of it broke the engine's bound on memory, so a page costs memory for its own
//! tasks and a bounded window, whatever the size of the buckets it passes:
//!
//! - **Loaded buckets** are listed from their entries, under the state lock, as other reads
//!   do; their put records are read with `pread`s ([`Queue::view_many`]).
//! - **Unloaded buckets** whose counts hold nothing scheduled or leased are skipped unread.
//! - **Unloaded buckets with a complete point index** ([`Mode::Index`]): the puts after the
//!   walk's position are read from the file, from the index sample at or before it, a window
//!   of them at a time; each one's state is what the index's changed tasks say, else as put
//!   (scheduled, never attempted). Only the window's `(seq, offset, due)` are kept, and the
//!   read stops once the window is full.
//! - **Unloaded buckets without one** ([`Mode::Fold`]: a leased or dead task when it was
//!   unloaded, too many changes, an older checkpoint): the file is the only record of the
//!   tasks' states, so it is read from its start to its end, applying each record, but only
//!   to the tasks of a window: the first puts after the walk's position, at most
//!   `max(limit, WINDOW_MIN)` of them. A task in the window that finishes for good (done,
//!   cancelled, skipped) is dropped to make room for the next put; once the window is full of
//!   tasks that may still be live (or dead, which a redrive can undo), later puts are left
//!   for another pass that starts at the first of them. Every record of a task follows its
//!   put, and puts reach a file in sequence order, so a pass sees every record of its
//!   window's tasks, and the next pass needs nothing before its first put.
//!
//! The file is read without the state lock: its bytes up to the flushed length noted under
//! the lock never change while the bucket exists (files are append-only, cut only at open),
//! and [`Bucket::stamp`] says whether it still is the same bucket when the lock is taken
//! again. The rest (bytes flushed since, and the write buffer) is read under the lock, after
//! a catch-up read without it when more than [`LOCKED_TAIL_BYTES_MAX`] was flushed
//! meanwhile. A bucket that was loaded, deleted, or (for [`Mode::Index`]) lost its index
//! meanwhile is looked at again from the walk's position. The page's put records are read
//! under the lock, as a claim reads its tasks.
//!
//! A lease whose deadline is at or before `now` is listed as scheduled, as a loaded bucket's
//! would be after `State::queue_at` ends it (an unloaded bucket never holds one: its wake time
//! loads it first, but nothing here relies on that).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use belfry_core::{QueueName, Task, TaskId, TaskState, UnixMs};
use bytes::Bytes;
use parking_lot::MutexGuard;

use super::bucket::split_id;
use super::points::Touched;
use super::queue::{corrupt_at, Bucket, Queue, TaskFacts};
use super::record::{self, DecodeError, PutRecord, Record};
use super::{Engine, State};
use crate::store::{Result, StoreError};

/// Tasks a window of [`Mode::Fold`] may hold (if `limit` is smaller), and a window of
/// [`Mode::Index`] may grow to: about 1 MiB of [`Seen`]s (about 60 bytes each in the map).
pub(super) const WINDOW_MIN: usize = 16_384;

/// Bytes read at a time from a bucket with a complete index (a page usually needs a few
/// tens of KiB), and from one without (read to its end).
const INDEX_CHUNK_BYTES: u64 = 64 * 1024;
const FOLD_CHUNK_BYTES: u64 = 1024 * 1024;

/// Bytes flushed to a bucket file while it was read without the lock that are still read
/// under it; beyond, they are read without it first.
const LOCKED_TAIL_BYTES_MAX: u64 = 1024 * 1024;

/// Where a walk is: the tasks still to list are in buckets from `key` on, and in bucket `key`
/// only those after seq `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    key: u64,
    after: Option<u64>,
}

impl Cursor {
    fn start(after: Option<TaskId>) -> Cursor {
        match after.map(split_id) {
            Some((seq, key)) => Cursor {
                key,
                after: Some(seq),
            },
            None => Cursor {
                key: 0,
                after: None,
            },
        }
    }

    /// The start of the bucket after `key` (`None` after the last possible key).
    fn past(key: u64) -> Option<Cursor> {
        Some(Cursor {
            key: key.checked_add(1)?,
            after: None,
        })
    }
}

/// How a scan learns the states of an unloaded bucket's tasks (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// From the point index: the file gives the puts only.
    Index,
    /// From the file's records.
    Fold,
}

/// A task of a scan's window: where its put is, and (in [`Mode::Fold`]) its state so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    pub put_offset: u64,
    pub put_len: u32,
    pub due_ms: UnixMs,
    pub until_ms: UnixMs,
    pub attempts: u32,
    pub state: TaskState,
}

impl Seen {
    fn put(put: &PutRecord, offset: u64, len: u32) -> Seen {
        Seen {
            put_offset: offset,
            put_len: len,
            due_ms: put.due_at_ms,
            until_ms: 0,
            attempts: 0,
            state: TaskState::Scheduled,
        }
    }

    /// The state after a record that follows the put, as `Entry::follow` has it.
    pub(super) fn follow(&mut self, record: &Record) {
        match *record {
            Record::Put(_) => {}
            Record::Cancel { .. } => self.state = TaskState::Cancelled,
            Record::Reschedule { due_at_ms, .. } | Record::Nack { due_at_ms, .. } => {
                self.state = TaskState::Scheduled;
                self.due_ms = due_at_ms;
            }
            Record::Lease {
                until_ms, attempts, ..
            } => {
                self.state = TaskState::Leased;
                self.until_ms = until_ms;
                self.attempts = attempts;
            }
            Record::Extend { until_ms, .. } => {
                self.state = TaskState::Leased;
                self.until_ms = until_ms;
            }
            Record::Done { .. } => self.state = TaskState::Done,
            Record::Skipped { .. } => self.state = TaskState::Skipped,
            Record::Dead { attempts, .. } => {
                self.state = TaskState::Dead;
                if let Some(attempts) = attempts {
                    self.attempts = attempts;
                }
            }
            Record::Redrive { due_at_ms, .. } => {
                self.state = TaskState::Scheduled;
                self.due_ms = due_at_ms;
                self.attempts = 0;
            }
        }
    }

    /// Finished for good: no record brings the task back (a dead letter can be redriven).
    fn is_final(&self) -> bool {
        matches!(
            self.state,
            TaskState::Done | TaskState::Cancelled | TaskState::Skipped
        )
    }
}

/// One window of a bucket's tasks, filled from its file's frames in order.
#[derive(Debug)]
pub(super) struct Scan {
    mode: Mode,
    /// Tasks up to this seq are not the scan's.
    after: Option<u64>,
    /// Most tasks the window holds.
    cap: usize,
    window: BTreeMap<u64, Seen>,
    /// Seqs of the window that finished for good (some may be listed twice): dropped first
    /// when the window is full.
    finished: Vec<u64>,
    /// The last put seen: puts come in sequence order, so one at or below it is a repeat
    /// (replay may append again what a file holds).
    last_put: Option<u64>,
    /// The last seq taken into the window.
    window_end: Option<u64>,
    /// The offset of the first put that did not fit: the window is closed, and the next one
    /// starts there.
    beyond: Option<u64>,
    /// The next byte of the file to read.
    pub offset: u64,
}

impl Scan {
    pub(super) fn new(mode: Mode, after: Option<u64>, cap: usize, offset: u64) -> Scan {
        Scan {
            mode,
            after,
            cap: cap.max(1),
            window: BTreeMap::new(),
            finished: Vec::new(),
            last_put: None,
            window_end: None,
            beyond: None,
            offset,
        }
    }

    /// Whether reading on would change nothing: an index scan's window is full.
    pub(super) fn stopped(&self) -> bool {
        self.mode == Mode::Index && self.beyond.is_some()
    }

    /// Takes the whole frames at the start of `bytes`, which start at [`Scan::offset`], and
    /// moves the offset past them. Returns the bytes that a frame cut off at the end of
    /// `bytes` needs from its start (0 if none), or where and why a frame is not valid.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> std::result::Result<usize, (u64, DecodeError)> {
        let mut at = 0;
        let mut needed = 0;
        while at < bytes.len() && !self.stopped() {
            let offset = self.offset + at as u64;
            match record::decode_light(&bytes[at..]) {
                Ok((record, len)) => {
                    self.take(&record, offset, len as u32);
                    at += len;
                }
                Err(DecodeError::Truncated { needed: n, .. }) => {
                    needed = n;
                    break;
                }
                Err(error) => return Err((offset, error)),
            }
        }
        self.offset += at as u64;
        Ok(needed)
    }

    fn take(&mut self, record: &Record, offset: u64, len: u32) {
        let seq = record.seq();
        if self.after.is_some_and(|after| seq <= after) {
            return;
        }
        match record {
            Record::Put(put) => self.take_put(put, offset, len),
            other if self.mode == Mode::Fold => {
                if let Some(seen) = self.window.get_mut(&seq) {
                    seen.follow(other);
                    if seen.is_final() {
                        self.finished.push(seq);
                    }
                }
            }
            _ => {}
        }
    }

    fn take_put(&mut self, put: &PutRecord, offset: u64, len: u32) {
        if self.last_put.is_some_and(|last| put.seq <= last) {
            return;
        }
        self.last_put = Some(put.seq);
        if self.beyond.is_some() {
            return;
        }
        if self.window.len() >= self.cap && !self.drop_finished() {
            self.beyond = Some(offset);
            return;
        }
        self.window.insert(put.seq, Seen::put(put, offset, len));
        self.window_end = Some(put.seq);
    }

    /// Drops one task of the window that finished for good; false if there is none.
    fn drop_finished(&mut self) -> bool {
        while let Some(seq) = self.finished.pop() {
            if self.window.get(&seq).is_some_and(Seen::is_final) {
                self.window.remove(&seq);
                return true;
            }
        }
        false
    }

    /// The window's live tasks, in sequence order, with their states: from `touched` (the
    /// bucket's point index) in [`Mode::Index`], from the records read in [`Mode::Fold`]. A
    /// lease that ended by `now_ms` is listed as scheduled.
    pub(super) fn live(
        &self,
        touched: impl Fn(u64) -> Option<Touched>,
        now_ms: UnixMs,
    ) -> Vec<(u64, Seen)> {
        let mut live = Vec::new();
        for (&seq, &seen) in &self.window {
            let mut seen = seen;
            if self.mode == Mode::Index {
                match touched(seq) {
                    None => {}
                    Some(Touched::CancelledAsPut) => continue,
                    Some(Touched::Full(touch)) => {
                        seen.state = touch.state;
                        seen.due_ms = touch.due_ms;
                        seen.attempts = touch.attempts;
                    }
                }
            }
            if seen.state == TaskState::Leased && seen.until_ms <= now_ms {
                seen.state = TaskState::Scheduled;
            }
            if matches!(seen.state, TaskState::Scheduled | TaskState::Leased) {
                live.push((seq, seen));
            }
        }
        live
    }

    /// Whether the bucket holds puts after this window's (one did not fit in it).
    fn more(&self) -> bool {
        self.beyond.is_some()
    }

    /// The next window, from the first put that did not fit in this one, for `need` more
    /// tasks when this one held `live` live tasks. An index scan's window is sized by the
    /// share of live tasks seen (a quarter more), between `need` and `max(need, WINDOW_MIN)`.
    pub(super) fn next_window(&mut self, need: usize, live: usize) {
        let Some(start) = self.beyond else {
            return;
        };
        let cap = match self.mode {
            Mode::Index => {
                let puts = need.saturating_mul(self.cap) / live.max(1);
                puts.saturating_add(puts / 4)
                    .clamp(need, need.max(WINDOW_MIN))
            }
            Mode::Fold => need.max(WINDOW_MIN),
        };
        *self = Scan::new(self.mode, self.window_end, cap, start);
    }
}

/// Feeds the bytes from [`Scan::offset`] to `end` to `scan`, `chunk` at a time (or one frame,
/// if longer), read by `read(from, to)`, until the scan stops.
fn drive(
    scan: &mut Scan,
    end: u64,
    chunk: u64,
    path: &Path,
    mut read: impl FnMut(u64, u64) -> Result<Bytes>,
) -> Result<()> {
    let mut want = chunk;
    while scan.offset < end && !scan.stopped() {
        let from = scan.offset;
        let to = end.min(from.saturating_add(want));
        let bytes = read(from, to)?;
        let needed = scan
            .feed(&bytes)
            .map_err(|(at, e)| corrupt_at(path, at, e.to_string()))?;
        if scan.offset == from && !scan.stopped() {
            if to == end {
                let detail = format!("frame of {needed} bytes runs past the data");
                return Err(corrupt_at(path, from, detail));
            }
            // One frame longer than a chunk: read it whole.
            want = want.max(needed as u64);
        } else {
            want = chunk;
        }
    }
    Ok(())
}

/// The reading of one unloaded bucket for a page (see the module docs).
#[derive(Debug)]
struct Job {
    uid: u64,
    key: u64,
    stamp: u64,
    path: PathBuf,
    /// The file bytes that may be read without the lock: its flushed length when noted.
    end: u64,
    scan: Scan,
}

impl Job {
    /// The reading of unloaded bucket `key` from `at` for a page that needs `need` more
    /// tasks; `None` when it holds no put after `at`.
    fn plan(uid: u64, key: u64, bucket: &Bucket, at: Cursor, need: usize) -> Option<Job> {
        let first = match at.after {
            Some(seq) => seq.checked_add(1)?,
            None => 0,
        };
        let scan = if bucket.points.is_complete() {
            let start = bucket.points.list_start(first)?;
            Scan::new(Mode::Index, at.after, need, start)
        } else {
            Scan::new(Mode::Fold, at.after, need.max(WINDOW_MIN), 0)
        };
        Some(Job {
            uid,
            key,
            stamp: bucket.stamp,
            path: bucket.path.clone(),
            end: bucket.flushed_len,
            scan,
        })
    }

    fn chunk(&self) -> u64 {
        match self.scan.mode {
            Mode::Index => INDEX_CHUNK_BYTES,
            Mode::Fold => FOLD_CHUNK_BYTES,
        }
    }

    /// Where the walk is in this bucket: a look at it again starts here.
    fn cursor(&self) -> Cursor {
        Cursor {
            key: self.key,
            after: self.scan.after,
        }
    }

    /// Reads the file up to `end`, without the lock.
    fn read_unlocked(&mut self) -> Result<()> {
        if self.scan.offset >= self.end || self.scan.stopped() {
            return Ok(());
        }
        let path = &self.path;
        let file = File::open(path)
            .map_err(|source| StoreError::io_at("open a bucket file to list it", path, source))?;
        let read = |from: u64, to: u64| {
            let mut bytes = vec![0; (to - from) as usize];
            file.read_exact_at(&mut bytes, from)
                .map_err(|source| match source.kind() {
                    ErrorKind::UnexpectedEof => {
                        corrupt_at(path, from, "file shorter than written".into())
                    }
                    _ => StoreError::io_at("read a bucket file to list it", path, source),
                })?;
            Ok(Bytes::from(bytes))
        };
        let chunk = self.chunk();
        drive(&mut self.scan, self.end, chunk, path, read)
    }

    /// The bucket this job reads, if it still may: the same bucket (not deleted and made
    /// again), unloaded, and with a complete index if the scan relies on it.
    fn bucket<'q>(&self, q: &'q mut Queue) -> Option<&'q mut Bucket> {
        if q.uid != self.uid {
            return None;
        }
        let bucket = q.buckets.get_mut(&self.key)?;
        let same = bucket.stamp == self.stamp && bucket.entries.is_none();
        let usable = self.scan.mode == Mode::Fold || bucket.points.is_complete();
        (same && usable).then_some(bucket)
    }

    /// Reads the rest of the bucket, under the lock: its file past what was read, then its
    /// write buffer.
    fn read_locked(&mut self, bucket: &mut Bucket) -> Result<()> {
        let (flushed, len, chunk) = (bucket.flushed_len, bucket.len(), self.chunk());
        let path = bucket.path.clone();
        let from_file = drive(&mut self.scan, flushed, chunk, &path, |from, to| {
            bucket.read_span(from, to, false)
        });
        let read = from_file.and_then(|()| {
            drive(&mut self.scan, len, chunk, &path, |from, to| {
                bucket.read_span(from, to, true)
            })
        });
        // Unloaded buckets hold no descriptor (thousands of far buckets could each keep one).
        bucket.release_file();
        read
    }

    /// The window's live tasks, at most `need`, with their put records (read with `pread`s).
    fn list(&self, q: &mut Queue, need: usize, now_ms: UnixMs) -> Result<Vec<Task>> {
        let Some(bucket) = q.buckets.get(&self.key) else {
            return Ok(Vec::new());
        };
        let mut live = self.scan.live(|seq| bucket.points.touched(seq), now_ms);
        live.truncate(need);
        let spots: Vec<(u64, u64, u32)> = live
            .iter()
            .map(|(_, seen)| (self.key, seen.put_offset, seen.put_len))
            .collect();
        let puts = q.read_puts(&spots);
        if let Some(bucket) = q.buckets.get_mut(&self.key) {
            bucket.release_file();
        }
        let mut tasks = Vec::with_capacity(live.len());
        for ((seq, seen), put) in live.into_iter().zip(puts?) {
            let facts = TaskFacts {
                due: seen.due_ms,
                state: seen.state,
                attempts: seen.attempts,
                until: (seen.state == TaskState::Leased).then_some(seen.until_ms),
                dead_reason: None,
            };
            tasks.push(q.task(seq, self.key, put, facts)?);
        }
        Ok(tasks)
    }
}

/// What a stretch of buckets listed under the lock stopped at.
enum Stop {
    /// The page is full, or the queue has no bucket left.
    Done,
    /// An unloaded bucket to read.
    Read(Job),
}

/// Lists, under the lock, the tasks of loaded buckets from `cursor` on and skips unloaded
/// buckets with nothing live, until the page holds `limit` tasks or an unloaded bucket must
/// be read. Moves `cursor` past what it listed.
fn stretch(
    q: &mut Queue,
    cursor: &mut Option<Cursor>,
    limit: usize,
    now_ms: UnixMs,
    out: &mut Vec<Task>,
) -> Result<Stop> {
    let mut wanted = Vec::new();
    let mut stop = Stop::Done;
    while let Some(at) = *cursor {
        let need = limit - out.len() - wanted.len();
        if need == 0 {
            break;
        }
        let Some((&key, bucket)) = q.buckets.range(at.key..).next() else {
            *cursor = None;
            break;
        };
        let after = if key == at.key { at.after } else { None };
        *cursor = Cursor::past(key);
        if let Some(entries) = &bucket.entries {
            let live = entries
                .after(after)
                .filter(|(_, e)| matches!(e.state, TaskState::Scheduled | TaskState::Leased));
            wanted.extend(live.take(need).map(|(seq, _)| (*seq, key)));
        } else if bucket.meta.scheduled > 0 || bucket.meta.leased > 0 {
            let at = Cursor { key, after };
            if let Some(job) = Job::plan(q.uid, key, bucket, at, need) {
                *cursor = Some(at);
                stop = Stop::Read(job);
                break;
            }
        }
    }
    let tasks = q.view_many(&wanted)?;
    out.extend(tasks.into_iter().flatten().map(|t| lease_ended(t, now_ms)));
    Ok(stop)
}

/// A task as of `now_ms`: a lease whose deadline has passed is over.
fn lease_ended(mut task: Task, now_ms: UnixMs) -> Task {
    if task.state == TaskState::Leased && task.lease_until_ms.is_none_or(|u| u <= now_ms) {
        task.state = TaskState::Scheduled;
        task.lease_until_ms = None;
    }
    task
}

impl Engine {
    /// `Store::list_tasks` (see the module docs).
    pub(super) fn list_live(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>> {
        self.preload(queue, now_ms)?;
        let mut out = Vec::new();
        let mut cursor = Some(Cursor::start(after));
        let mut state = self.lock_state()?;
        state.queue_at(queue, now_ms, self.core.options.lookahead_ms)?;
        while out.len() < limit {
            let (q, _) = state.queue(queue)?;
            match stretch(q, &mut cursor, limit, now_ms, &mut out)? {
                Stop::Done => break,
                Stop::Read(job) => {
                    drop(state);
                    (state, cursor) = self.read_bucket(queue, job, limit, now_ms, &mut out)?;
                }
            }
        }
        Ok(out)
    }

    /// Lists what a page still needs of the unloaded bucket `job` reads, window by window,
    /// reading its file without the lock (called without it). Returns the lock, and where the
    /// walk goes on.
    fn read_bucket(
        &self,
        queue: &QueueName,
        mut job: Job,
        limit: usize,
        now_ms: UnixMs,
        out: &mut Vec<Task>,
    ) -> Result<(MutexGuard<'_, State>, Option<Cursor>)> {
        loop {
            let read = job.read_unlocked();
            let mut state = self.lock_state()?;
            let (q, _) = state.queue(queue)?;
            let Some(bucket) = job.bucket(q) else {
                // Loaded, deleted or without its index meanwhile: look at it again.
                return Ok((state, Some(job.cursor())));
            };
            read?;
            if bucket.flushed_len > job.scan.offset.saturating_add(LOCKED_TAIL_BYTES_MAX)
                && !job.scan.stopped()
            {
                job.end = bucket.flushed_len;
                drop(state);
                continue;
            }
            job.read_locked(bucket)?;
            let listed = job.list(q, limit - out.len(), now_ms)?;
            let live = listed.len();
            out.extend(listed);
            if out.len() >= limit {
                return Ok((state, None));
            }
            if !job.scan.more() {
                return Ok((state, Cursor::past(job.key)));
            }
            job.scan.next_window(limit - out.len(), live);
            job.end = q.buckets.get(&job.key).map_or(0, |b| b.flushed_len);
            drop(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::points::Touch;
    use crate::engine::queue::Entry;
    use belfry_core::{LatePolicy, PayloadKind, Priority};

    fn put(seq: u64, due_at_ms: UnixMs) -> Record {
        Record::Put(PutRecord {
            seq,
            due_at_ms,
            priority: Priority::Normal,
            payload_kind: PayloadKind::Binary,
            late_policy: LatePolicy::Fire,
            idempotency_key: None,
            target: None,
            headers: Vec::new(),
            payload: Bytes::from(vec![b'x'; seq as usize % 50]),
        })
    }

    fn lease(seq: u64, until_ms: UnixMs) -> Record {
        Record::Lease {
            seq,
            lease_id: 1,
            until_ms,
            attempts: 1,
        }
    }

    /// A bucket file of `records`, and each record's offset.
    fn file(records: &[Record]) -> (Vec<u8>, Vec<u64>) {
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for record in records {
            offsets.push(bytes.len() as u64);
            record::encode(&mut bytes, record);
        }
        (bytes, offsets)
    }

    /// Feeds `bytes` from the scan's offset on, `chunk` bytes at a time.
    fn run(scan: &mut Scan, bytes: &[u8], chunk: u64) {
        let read =
            |from: u64, to: u64| Ok(Bytes::copy_from_slice(&bytes[from as usize..to as usize]));
        drive(scan, bytes.len() as u64, chunk, Path::new("b"), read).unwrap();
    }

    fn live(scan: &Scan, now_ms: UnixMs) -> Vec<(u64, TaskState, UnixMs, u32)> {
        scan.live(|_| None, now_ms)
            .into_iter()
            .map(|(seq, s)| (seq, s.state, s.due_ms, s.attempts))
            .collect()
    }

    #[test]
    fn a_scan_follows_records_as_a_loaded_entry_does() {
        let put = match put(7, 100) {
            Record::Put(put) => put,
            _ => unreachable!(),
        };
        for record in record::tests::samples() {
            let mut entry = Entry::put(&put, 3, 4, None);
            let mut seen = Seen::put(&put, 3, 4);
            entry.follow(&record);
            seen.follow(&record);
            let entry = (entry.state, entry.due_ms, entry.attempts, entry.until_ms);
            let seen = (seen.state, seen.due_ms, seen.attempts, seen.until_ms);
            assert_eq!(entry, seen, "{record:?}");
        }
    }

    #[test]
    fn a_fold_window_drops_finished_tasks_and_closes_when_full_of_live_ones() {
        let records = [
            put(1, 10),
            put(2, 20),
            put(3, 30),
            Record::Done { seq: 1 },
            put(4, 40), // takes the place of 1
            put(5, 50), // does not fit: 2, 3 and 4 may still be live
            Record::Cancel { seq: 2 },
            lease(3, 100),
            put(4, 40), // a repeat: ignored
            put(6, 60),
            Record::Dead {
                seq: 6,
                reason: "r".into(),
                attempts: None,
            },
            Record::Nack {
                seq: 4,
                due_at_ms: 44,
            },
            lease(5, 190),
        ];
        let (bytes, offsets) = file(&records);
        for chunk in [1, 7, 64, 1 << 20] {
            let mut scan = Scan::new(Mode::Fold, None, 3, 0);
            run(&mut scan, &bytes, chunk);
            assert_eq!(scan.offset, bytes.len() as u64);
            assert_eq!(
                live(&scan, 99),
                vec![
                    (3, TaskState::Leased, 30, 1),
                    (4, TaskState::Scheduled, 44, 0)
                ]
            );
            // The lease ran out by 100: listed as scheduled.
            assert_eq!(live(&scan, 100)[0], (3, TaskState::Scheduled, 30, 1));
            assert!(scan.more());
            assert_eq!(scan.beyond, Some(offsets[5]));
            // The next window starts at the put that did not fit.
            scan.next_window(2, 2);
            assert_eq!((scan.after, scan.offset), (Some(4), offsets[5]));
            run(&mut scan, &bytes, chunk);
            assert_eq!(live(&scan, 99), vec![(5, TaskState::Leased, 50, 1)]);
            assert!(!scan.more());
        }
    }

    #[test]
    fn an_index_window_stops_once_full_and_takes_states_from_the_index() {
        let records = [
            put(1, 10),
            Record::Cancel { seq: 1 },
            put(2, 20),
            put(3, 30),
            put(4, 40),
            put(5, 50),
        ];
        let (bytes, offsets) = file(&records);
        // Starting before the walk's position, as from an index sample.
        let mut scan = Scan::new(Mode::Index, Some(1), 2, 0);
        run(&mut scan, &bytes, 5);
        assert!(scan.stopped());
        assert_eq!(scan.beyond, Some(offsets[4]));
        let touched = |seq| match seq {
            2 => Some(Touched::CancelledAsPut),
            3 => Some(Touched::Full(Touch {
                due_ms: 33,
                attempts: 2,
                state: TaskState::Scheduled,
            })),
            _ => None,
        };
        let live: Vec<_> = scan
            .live(touched, 0)
            .into_iter()
            .map(|(s, t)| (s, t.due_ms))
            .collect();
        assert_eq!(live, vec![(3, 33)]);
        scan.next_window(5, 1);
        assert_eq!(
            scan.cap, 12,
            "sized by the share of live tasks, and a quarter more"
        );
        run(&mut scan, &bytes, 5);
        assert!(!scan.more());
        assert_eq!(scan.live(|_| None, 0).len(), 2);
        // The put records are where the scan says.
        for (seq, seen) in scan.live(|_| None, 0) {
            let at = seen.put_offset as usize;
            let (record, len) = record::decode(&bytes[at..]).unwrap();
            assert_eq!((record.seq(), len as u32), (seq, seen.put_len));
        }
    }

    /// A file read made for a bucket that was deleted (all its tasks cancelled) and made
    /// again under the same key before the lock was taken back is not used.
    #[test]
    fn a_read_of_a_bucket_deleted_and_made_again_meanwhile_is_not_used() {
        use crate::engine::{EngineOptions, FsyncPolicy};
        use crate::Store;
        const NOW: u64 = 1_700_000_000_000;
        let due = NOW + 20 * 24 * 3_600_000;
        let dir = tempfile::tempdir().unwrap();
        let options = EngineOptions {
            fsync: FsyncPolicy::Never,
            ..EngineOptions::default()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        let queue = QueueName::new("q").unwrap();
        engine.put_queue(&queue, Bytes::new()).unwrap();
        engine.counts(&queue, NOW).unwrap();
        let put = |n: usize| -> Vec<TaskId> {
            let tasks = (0..n)
                .map(|i| belfry_core::NewTask::new(queue.clone(), due + i as u64, "t"))
                .collect();
            let outcomes = engine.put(tasks).unwrap();
            let id = |outcome: &crate::PutOutcome| match outcome {
                crate::PutOutcome::Created { id, .. } => *id,
                other => panic!("unexpected {other:?}"),
            };
            outcomes.iter().map(id).collect()
        };
        let old = put(3);
        engine.flush().unwrap();
        let key = split_id(old[0]).1;
        let mut job = {
            let mut state = engine.core.state.lock();
            let (q, _) = state.queue(&queue).unwrap();
            assert!(q.buckets[&key].entries.is_none());
            let at = Cursor { key, after: None };
            Job::plan(q.uid, key, &q.buckets[&key], at, 10).unwrap()
        };
        for id in &old {
            engine.cancel(&queue, *id, NOW).unwrap();
        }
        engine.flush().unwrap();
        let new = put(2);
        assert_eq!(split_id(new[0]).1, key, "the same bucket key again");
        engine.flush().unwrap();
        // The new file is shorter than the old one was: the read fails, and would have been
        // reported as damage had the bucket been taken for the one it was planned on.
        let read = job.read_unlocked();
        assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
        {
            let mut state = engine.core.state.lock();
            let (q, _) = state.queue(&queue).unwrap();
            assert!(job.bucket(q).is_none(), "a new bucket under the old key");
        }
        let listed = engine.list_tasks(&queue, None, 10, NOW).unwrap();
        assert_eq!(listed.iter().map(|t| t.id).collect::<Vec<_>>(), new);
    }

    #[test]
    fn a_damaged_or_cut_frame_is_refused_with_its_offset() {
        let (mut bytes, offsets) = file(&[put(1, 10), put(2, 20)]);
        let mut scan = Scan::new(Mode::Fold, None, 4, 0);
        let cut = &bytes[..bytes.len() - 1];
        let read =
            |from: u64, to: u64| Ok(Bytes::copy_from_slice(&cut[from as usize..to as usize]));
        let error = drive(&mut scan, cut.len() as u64, 8, Path::new("b"), read).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&format!("offset {}", offsets[1])),
            "{error}"
        );
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let mut scan = Scan::new(Mode::Fold, None, 4, 0);
        let read =
            |from: u64, to: u64| Ok(Bytes::copy_from_slice(&bytes[from as usize..to as usize]));
        let error = drive(&mut scan, bytes.len() as u64, 8, Path::new("b"), read).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&format!("offset {}", offsets[1])),
            "{error}"
        );
    }
}
