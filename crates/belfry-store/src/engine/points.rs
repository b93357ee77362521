//! Point operations on unloaded buckets: finding one task's put record and state without
//! loading the bucket.
//!
//! A far bucket (a day or a week of tasks) can hold millions of tasks. Loading it whole to
//! answer a `get`, `cancel` or `reschedule` of one of them took seconds and one entry of
//! memory per task, yet that is the everyday traffic of a delay service (most order-timeout
//! tasks are cancelled long before they are due). So every bucket keeps a [`PointIndex`]:
//!
//! - **samples**: `(seq, file offset)` of a put record every [`SAMPLE_EVERY_BYTES`] of file.
//!   Puts reach a bucket file in sequence order (they are numbered and appended under the
//!   engine lock, and recovery cuts a file back to its checkpointed length before replaying
//!   into it), so the put of `seq` lies between the last sample at or below `seq` and the
//!   next one: one read of a few tens of KiB finds it. About 16 bytes of memory per 32 KiB of
//!   bucket file.
//! - **touched**: the state of every task that changed after its put while the bucket was
//!   unloaded, or that had changed when the bucket was unloaded. A task not in it is as its
//!   put record says: scheduled at the put's due time, never attempted. The common change, a
//!   cancel of a task as it was put, is kept apart as a compressed bitmap of seqs (a few
//!   bytes per cancel, where a full entry takes about 30).
//!
//! The index is *complete* when both hold for the whole file; only then is it used. A bucket
//! unloaded with a leased or dead-lettered task, or with more changed tasks than
//! [`touched_max`] allows, is not complete (such buckets are rare far from now), and neither
//! is a bucket restored from a checkpoint written before the index existed: point operations
//! on those load the bucket, as before. Loading rebuilds the samples from the file.
//!
//! Checkpoints keep the index of every unloaded bucket whose index is complete (format 5), so
//! a restart does not lose it.

use std::collections::HashMap;

use belfry_core::{Task, TaskState, UnixMs};
use roaring::RoaringTreemap;

use super::bucket::task_id;
use super::persist::BucketMeta;
use super::queue::{corrupt_at, Bucket, EngineStats, Queue, TaskFacts};
use super::record::{self, put_u64, DecodeError, PutRecord, Reader, Record};
use crate::store::Result;

/// A put is sampled once the file has grown this much since the last sample: a point lookup
/// reads about this much, and memory holds 16 bytes per this much of bucket file.
pub const SAMPLE_EVERY_BYTES: u64 = 32 * 1024;

/// Bytes read at a time while scanning for a put record.
pub const SCAN_CHUNK_BYTES: u64 = 64 * 1024;

/// Scans for due bounds an unloaded bucket gets before a change at a bound loads it instead:
/// random changes hit a bound rarely, but a sweep through a bucket in due order hits it every
/// time, and a load makes the rest of such a sweep cheap.
pub const BOUND_SCANS_MAX: u32 = 4;

/// Bytes read at a time while a whole bucket file is scanned for its due bounds.
pub const BOUNDS_CHUNK_BYTES: u64 = 1024 * 1024;

/// What an unloaded bucket knows of a task that changed after its put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    pub due_ms: UnixMs,
    pub attempts: u32,
    pub state: TaskState,
}

impl Touch {
    /// Whether an unloaded bucket's index can hold this state: leases and dead letters need
    /// more than a `Touch` keeps (a deadline, a reason), so their buckets are loaded instead.
    pub fn can_hold(state: TaskState) -> bool {
        !matches!(state, TaskState::Leased | TaskState::Dead)
    }
}

/// Full change entries (about 30 bytes each) an unloaded bucket of `tasks` tasks keeps in its
/// index at most; beyond, the index is given up and point operations load the bucket (about
/// 100 bytes a task), which then costs less. Half the tasks, and never fewer than 4,096.
/// Cancels of tasks as they were put do not count: they are bits in a bitmap.
pub fn touched_max(tasks: usize) -> usize {
    (tasks / 2).max(4_096)
}

/// One bucket's point index (see the module docs).
#[derive(Debug, Clone)]
pub struct PointIndex {
    /// `(seq, offset)` of sampled put records, increasing in both.
    samples: Vec<(u64, u64)>,
    /// The largest seq put in the bucket (0 when none).
    max_put_seq: u64,
    /// States of changed tasks, while the bucket is unloaded...
    touched: HashMap<u64, Touch>,
    /// ...but tasks cancelled as they were put (due and attempts as in the put) only here.
    cancelled: RoaringTreemap,
    /// Whether samples and `touched` describe the whole file.
    complete: bool,
    /// Scans for due bounds since the bucket was last loaded (see [`BOUND_SCANS_MAX`]).
    bound_scans: u32,
}

impl PointIndex {
    /// The index of a bucket created empty: complete.
    pub fn empty() -> PointIndex {
        PointIndex {
            samples: Vec::new(),
            max_put_seq: 0,
            touched: HashMap::new(),
            cancelled: RoaringTreemap::new(),
            complete: true,
            bound_scans: 0,
        }
    }

    /// The index of a bucket whose file was never indexed (an older checkpoint): not
    /// complete until the bucket is loaded.
    pub fn unknown() -> PointIndex {
        PointIndex {
            complete: false,
            ..PointIndex::empty()
        }
    }

    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Notes a put record of `seq` written at `offset`. A put that does not continue the
    /// sequence (never expected; see the module docs) makes the index incomplete rather than
    /// wrong.
    pub fn note_put(&mut self, seq: u64, offset: u64) {
        if !self.complete {
            return;
        }
        if self.samples.is_empty() {
            self.samples.push((seq, offset));
        } else if seq <= self.max_put_seq {
            self.complete = false;
        } else if let Some(&(_, last)) = self.samples.last() {
            if offset >= last + SAMPLE_EVERY_BYTES {
                self.samples.push((seq, offset));
            }
        }
        self.max_put_seq = self.max_put_seq.max(seq);
    }

    /// Forgets everything, before a load rebuilds the samples from the file (complete).
    pub fn reset(&mut self) {
        *self = PointIndex::empty();
    }

    /// Records a changed task of an unloaded bucket; a state the index cannot hold, or one
    /// change too many, makes it incomplete (and frees what it held).
    pub fn touch(&mut self, seq: u64, touch: Touch, tasks: usize) {
        if !self.complete {
            return;
        }
        if !Touch::can_hold(touch.state) || self.is_full(tasks) {
            self.give_up();
            return;
        }
        self.touched.insert(seq, touch);
    }

    /// Records the cancel of a task of an unloaded bucket that was as its put said.
    pub fn cancel_as_put(&mut self, seq: u64) {
        if self.complete {
            self.cancelled.insert(seq);
        }
    }

    fn is_full(&self, tasks: usize) -> bool {
        self.touched.len() >= touched_max(tasks)
    }

    /// Tasks with a recorded change.
    pub fn changed_len(&self) -> usize {
        self.touched.len() + self.cancelled.len() as usize
    }

    /// The recorded change of `seq`, if any.
    pub fn touched(&self, seq: u64) -> Option<Touched> {
        if let Some(touch) = self.touched.get(&seq) {
            return Some(Touched::Full(*touch));
        }
        self.cancelled
            .contains(seq)
            .then_some(Touched::CancelledAsPut)
    }

    /// Marks the index incomplete and frees it: point operations load the bucket.
    fn give_up(&mut self) {
        self.touched = HashMap::new();
        self.cancelled = RoaringTreemap::new();
        self.samples = Vec::new();
        self.complete = false;
    }

    /// Where to start reading for the put of `seq`: the offset of the last sample at or
    /// below it. `None` when the bucket cannot hold `seq` (before its first put, after its
    /// last).
    pub fn scan_start(&self, seq: u64) -> Option<u64> {
        if seq > self.max_put_seq {
            return None;
        }
        let at = self.samples.partition_point(|&(s, _)| s <= seq);
        at.checked_sub(1).map(|i| self.samples[i].1)
    }

    /// Where a listing of the bucket's puts from seq `first` on starts reading: the last
    /// sample at or below `first`, else the file's start. `None` when the bucket holds no put
    /// from `first` on.
    pub fn list_start(&self, first: u64) -> Option<u64> {
        if first > self.max_put_seq {
            return None;
        }
        Some(self.scan_start(first).unwrap_or(0))
    }

    /// Appends the index to a checkpoint section (see `docs/storage-format.md`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(self.complete);
        put_u64(out, self.max_put_seq);
        put_u64(out, self.samples.len() as u64);
        for &(seq, offset) in &self.samples {
            put_u64(out, seq);
            put_u64(out, offset);
        }
        put_u64(out, self.touched.len() as u64);
        // In the map's order: a reader needs none, and sorting a million changes would hold
        // the checkpoint's lock longer.
        for (&seq, touch) in &self.touched {
            put_u64(out, seq);
            put_u64(out, touch.due_ms);
            out.extend_from_slice(&touch.attempts.to_le_bytes());
            out.push(state_code(touch.state));
        }
        put_u64(out, self.cancelled.len());
        for seq in &self.cancelled {
            put_u64(out, seq);
        }
    }

    /// Reads an index written by [`PointIndex::encode`] for a bucket file of `file_len`
    /// bytes, checking what a damaged checkpoint could get wrong.
    pub(crate) fn decode(r: &mut Reader<'_>, file_len: u64) -> Result<PointIndex, &'static str> {
        let field = |r: &mut Reader<'_>| r.u64().map_err(|_| "truncated point index");
        let max_put_seq = field(r)?;
        let samples = field(r)?;
        // Each sample takes 16 bytes of the checkpoint: a count beyond what is left is damage.
        if samples > (r.bytes.len() / 16) as u64 {
            return Err("point index sample count past the end");
        }
        let mut index = PointIndex {
            max_put_seq,
            ..PointIndex::empty()
        };
        index.samples.reserve_exact(samples as usize);
        for _ in 0..samples {
            let seq = field(r)?;
            let offset = field(r)?;
            let increasing = index
                .samples
                .last()
                .is_none_or(|&(s, o)| seq > s && offset > o);
            if !increasing || offset >= file_len || seq > max_put_seq {
                return Err("point index samples out of order or past the file");
            }
            index.samples.push((seq, offset));
        }
        let touched = field(r)?;
        if touched > (r.bytes.len() / 21) as u64 {
            return Err("point index change count past the end");
        }
        index.touched.reserve(touched as usize);
        for _ in 0..touched {
            let seq = field(r)?;
            let due_ms = field(r)?;
            let attempts = r.u32().map_err(|_| "truncated point index")?;
            let state = r
                .u8()
                .ok()
                .and_then(state_from_code)
                .ok_or("point index change with an unknown state")?;
            index.touched.insert(
                seq,
                Touch {
                    due_ms,
                    attempts,
                    state,
                },
            );
        }
        let cancelled = field(r)?;
        if cancelled > (r.bytes.len() / 8) as u64 {
            return Err("point index cancel count past the end");
        }
        let mut last = None;
        for _ in 0..cancelled {
            let seq = field(r)?;
            if last.is_some_and(|l| seq <= l) || seq > max_put_seq {
                return Err("point index cancels out of order or past the last put");
            }
            last = Some(seq);
            index.cancelled.insert(seq);
        }
        Ok(index)
    }
}

fn state_code(state: TaskState) -> u8 {
    match state {
        TaskState::Scheduled => 0,
        TaskState::Done => 2,
        TaskState::Cancelled => 4,
        TaskState::Skipped => 5,
        // Never held (see `Touch::can_hold`); written as an unknown code, refused on read.
        TaskState::Leased | TaskState::Dead => u8::MAX,
    }
}

fn state_from_code(code: u8) -> Option<TaskState> {
    match code {
        0 => Some(TaskState::Scheduled),
        2 => Some(TaskState::Done),
        4 => Some(TaskState::Cancelled),
        5 => Some(TaskState::Skipped),
        _ => None,
    }
}

/// Where walking whole frames of a stretch of bucket bytes stopped.
pub enum Walk {
    /// The visitor stopped at the frame at `at`, `len` bytes long.
    Stopped { at: usize, len: usize },
    /// The bytes ended first; walking goes on at `consumed` (a frame may straddle it: it
    /// needs at least `needed` bytes from there).
    More { consumed: usize, needed: usize },
}

/// Decodes the whole frames of `bytes` (without payloads) until `stop` says so.
pub fn walk(
    bytes: &[u8],
    stop: &mut impl FnMut(&Record) -> bool,
) -> std::result::Result<Walk, (usize, DecodeError)> {
    let mut at = 0;
    while at < bytes.len() {
        let (record, len) = match record::decode_light(&bytes[at..]) {
            Ok(decoded) => decoded,
            Err(DecodeError::Truncated { needed, .. }) => {
                return Ok(Walk::More {
                    consumed: at,
                    needed,
                })
            }
            Err(error) => return Err((at, error)),
        };
        if stop(&record) {
            return Ok(Walk::Stopped { at, len });
        }
        at += len;
    }
    Ok(Walk::More {
        consumed: at,
        needed: 0,
    })
}

/// A recorded change of a task (see [`PointIndex::touched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    Full(Touch),
    /// Cancelled as it was put: due and attempts are the put's.
    CancelledAsPut,
}

/// A task found through the point index: its put record and its state.
pub struct PointFound {
    pub put: PutRecord,
    pub put_offset: u64,
    pub touched: Option<Touched>,
}

impl PointFound {
    /// The task's state, due time and attempts: its recorded change, or its put's.
    pub fn now(&self) -> Touch {
        let as_put = |state| Touch {
            due_ms: self.put.due_at_ms,
            attempts: 0,
            state,
        };
        match self.touched {
            Some(Touched::Full(touch)) => touch,
            Some(Touched::CancelledAsPut) => as_put(TaskState::Cancelled),
            None => as_put(TaskState::Scheduled),
        }
    }
}

/// What a change through the point index needs to apply to memory: the task as it was.
#[derive(Debug, Clone, Copy)]
pub struct Prior {
    pub touch: Touch,
    /// Whether the task was as its put said (no change recorded).
    pub as_put: bool,
    /// The bucket's due bounds after the change, when it moves a bound no other task is
    /// known to share (`Queue::holds_due_bound`; found by `Bucket::scan_bounds`).
    pub bounds: Option<BucketMeta>,
    /// The hash of the task's idempotency key, released when the change finishes the task.
    pub key_hash: Option<u64>,
}

impl Bucket {
    /// The put record of `seq` and its file offset, found by scanning from the sample before
    /// it (see the module docs). `None` if the bucket has no put of `seq`. Only meaningful
    /// while the index is complete.
    pub fn find_put(&mut self, seq: u64) -> Result<Option<(u64, PutRecord)>> {
        let Some(start) = self.points.scan_start(seq) else {
            return Ok(None);
        };
        let mut hit = false;
        let mut stop = |record: &Record| match record {
            Record::Put(put) if put.seq >= seq => {
                hit = put.seq == seq;
                true
            }
            _ => false,
        };
        let Some((offset, frame)) = self.walk_from(start, SCAN_CHUNK_BYTES, &mut stop)? else {
            return Ok(None);
        };
        if !hit {
            return Ok(None); // a later task's put came first
        }
        let put = record::decode_put_shared(&frame)
            .map_err(|e| corrupt_at(&self.path, offset, e.to_string()))?;
        Ok(Some((offset, put)))
    }

    /// The due bounds of the scheduled tasks of this unloaded bucket if task `skip` were not
    /// scheduled and a task due at `add` were: one pass over the file, `chunk` bytes at a
    /// time, reading each put's due time and the index's changes. Nothing per task is kept,
    /// so memory stays flat whatever the bucket's size.
    pub fn scan_bounds(&mut self, skip: u64, add: Option<UnixMs>) -> Result<BucketMeta> {
        self.points.bound_scans += 1;
        let points = std::mem::replace(&mut self.points, PointIndex::unknown());
        let mut bounds = BucketMeta::default();
        let mut visit = |record: &Record| {
            if let Record::Put(put) = record {
                let due = match points.touched(put.seq) {
                    _ if put.seq == skip => None,
                    None => Some(put.due_at_ms),
                    Some(Touched::Full(t)) => (t.state == TaskState::Scheduled).then_some(t.due_ms),
                    Some(Touched::CancelledAsPut) => None,
                };
                if let Some(due) = due {
                    bounds.add_scheduled(due);
                }
            }
            false
        };
        let walked = self.walk_from(0, BOUNDS_CHUNK_BYTES, &mut visit);
        self.points = points;
        walked?;
        if let Some(due) = add {
            bounds.add_scheduled(due);
        }
        Ok(bounds)
    }

    /// Walks the bucket's frames from offset `start`, `chunk` bytes at a time, until `stop`
    /// says so: the offset and bytes of that frame, or `None` at the end.
    fn walk_from(
        &mut self,
        mut at: u64,
        chunk: u64,
        stop: &mut impl FnMut(&Record) -> bool,
    ) -> Result<Option<(u64, bytes::Bytes)>> {
        let mut want = chunk;
        loop {
            // The write buffer holds whole frames, so the file part ends on a frame boundary.
            let in_buf = at >= self.flushed_len;
            let limit = if in_buf { self.len() } else { self.flushed_len };
            if at >= limit {
                return Ok(None);
            }
            let end = limit.min(at.saturating_add(want));
            let bytes = self.read_span(at, end, in_buf)?;
            let walked = walk(&bytes, stop)
                .map_err(|(off, e)| corrupt_at(&self.path, at + off as u64, e.to_string()))?;
            match walked {
                Walk::Stopped { at: off, len } => {
                    return Ok(Some((at + off as u64, bytes.slice(off..off + len))));
                }
                Walk::More {
                    consumed: 0,
                    needed,
                } => {
                    if end == limit {
                        let detail = format!("frame of {needed} bytes runs past the data");
                        return Err(corrupt_at(&self.path, at, detail));
                    }
                    // One frame longer than a chunk: read it whole.
                    want = want.max(needed as u64);
                }
                Walk::More { consumed, .. } => {
                    at += consumed as u64;
                    want = chunk;
                }
            }
        }
    }
}

impl Queue {
    /// Whether calls on one task of bucket `key` go through its point index: the bucket is
    /// unloaded and its index complete.
    pub fn can_point(&self, key: u64) -> bool {
        self.buckets
            .get(&key)
            .is_some_and(|b| b.entries.is_none() && b.points.is_complete())
    }

    /// Task `seq` of unloaded bucket `key`, through the point index (see [`Queue::can_point`]).
    pub fn point(&mut self, seq: u64, key: u64) -> Result<Option<PointFound>> {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return Ok(None);
        };
        let found = bucket.find_put(seq);
        // Unloaded buckets hold no descriptor (thousands of far buckets could each keep one).
        bucket.release_file();
        let Some((put_offset, put)) = found? else {
            return Ok(None);
        };
        let touched = bucket.points.touched(seq);
        Ok(Some(PointFound {
            put,
            put_offset,
            touched,
        }))
    }

    /// The whole task `seq` of unloaded bucket `key`, through the point index.
    pub fn point_task(&mut self, seq: u64, key: u64) -> Result<Option<Task>> {
        let Some(found) = self.point(seq, key)? else {
            return Ok(None);
        };
        let now = found.now();
        let facts = TaskFacts {
            due: now.due_ms,
            state: now.state,
            attempts: now.attempts,
            until: None,
            dead_reason: None,
        };
        self.task(seq, key, found.put, facts).map(Some)
    }

    /// Whether `touch`, a task of unloaded bucket `key`, is the last one known scheduled at
    /// the bucket's earliest or latest due time, which its counts keep exact: changing it
    /// needs the other tasks' due times ([`Bucket::scan_bounds`]).
    pub fn holds_due_bound(&self, key: u64, touch: Touch) -> bool {
        let Some(bucket) = self.buckets.get(&key) else {
            return false;
        };
        touch.state == TaskState::Scheduled && bucket.meta.is_last_at_bound(touch.due_ms)
    }

    /// The whole task `seq` of bucket `key`: through the point index if the bucket is
    /// unloaded and indexed, else from its entry (loading the bucket if needed).
    pub fn find_task(
        &mut self,
        seq: u64,
        key: u64,
        stats: &mut EngineStats,
    ) -> Result<Option<Task>> {
        if self.can_point(key) {
            self.point_task(seq, key)
        } else if self.entry(seq, key, stats)?.is_some() {
            self.view(seq, key)
        } else {
            Ok(None)
        }
    }

    /// Whether a change at a due bound of unloaded bucket `key` may scan for the new bounds
    /// rather than load the bucket ([`BOUND_SCANS_MAX`]).
    pub fn may_scan_bounds(&self, key: u64) -> bool {
        self.buckets
            .get(&key)
            .is_some_and(|b| b.points.bound_scans < BOUND_SCANS_MAX)
    }

    /// [`Bucket::scan_bounds`] of bucket `key`.
    pub fn scan_bounds(&mut self, key: u64, skip: u64, add: Option<UnixMs>) -> Result<BucketMeta> {
        match self.buckets.get_mut(&key) {
            Some(bucket) => bucket.scan_bounds(skip, add),
            None => Ok(BucketMeta::default()),
        }
    }

    /// What a change of task `seq` found through the point index needs to know of it.
    pub fn prior(&self, found: &PointFound) -> Prior {
        Prior {
            touch: found.now(),
            as_put: found.touched.is_none(),
            bounds: None,
            key_hash: found
                .put
                .idempotency_key
                .as_deref()
                .map(|k| self.hasher.hash(k)),
        }
    }

    /// Applies a cancel or a reschedule of a scheduled task to an unloaded bucket whose index
    /// found it: its recorded change, the bucket's counts (and wake time), and the release of
    /// a cancelled task's idempotency key. Any other record is not expected here. The counts
    /// stay exact: a task that is the last at the bucket's earliest or latest due time comes
    /// with the bucket's new bounds (`prior.bounds`).
    pub fn apply_unloaded(&mut self, key: u64, record: &Record, prior: Prior) {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return;
        };
        // The bucket's tasks: scheduled ones and those that changed (finished ones included).
        let tasks = bucket.meta.scheduled as usize + bucket.points.changed_len();
        let seq = record.seq();
        match *record {
            Record::Cancel { .. } => {
                if prior.as_put {
                    bucket.points.cancel_as_put(seq);
                } else {
                    let touch = Touch {
                        state: TaskState::Cancelled,
                        ..prior.touch
                    };
                    bucket.points.touch(seq, touch, tasks);
                }
                self.update_unloaded_meta(key, |m| match prior.bounds {
                    Some(bounds) => m.set_bounds(&bounds),
                    None => m.remove_scheduled(prior.touch.due_ms),
                });
                if let Some(hash) = prior.key_hash {
                    self.index.keys.remove(hash, task_id(seq, key));
                }
            }
            Record::Reschedule { due_at_ms, .. } => {
                let touch = Touch {
                    due_ms: due_at_ms,
                    ..prior.touch
                };
                bucket.points.touch(seq, touch, tasks);
                // The earliest due time may move the bucket's wake-up.
                self.update_unloaded_meta(key, |m| match prior.bounds {
                    Some(bounds) => m.set_bounds(&bounds),
                    None => {
                        m.remove_scheduled(prior.touch.due_ms);
                        m.add_scheduled(due_at_ms);
                    }
                });
            }
            _ => debug_assert!(false, "only cancels and reschedules go through the index"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_sparse_and_find_the_stretch_of_a_seq() {
        let mut index = PointIndex::empty();
        // Puts of 1 KiB each, seqs 10, 12, 14, ...
        for i in 0..200u64 {
            index.note_put(10 + 2 * i, i * 1024);
        }
        assert!(index.is_complete());
        // One sample per 32 KiB of file.
        assert_eq!(index.samples.len(), 7);
        assert_eq!(index.scan_start(9), None, "before the first put");
        assert_eq!(index.scan_start(10), Some(0));
        assert_eq!(index.scan_start(10 + 2 * 32), Some(32 * 1024));
        assert_eq!(index.scan_start(10 + 2 * 32 - 1), Some(0));
        assert_eq!(index.scan_start(10 + 2 * 199), Some(192 * 1024));
        assert_eq!(
            index.scan_start(10 + 2 * 199 + 1),
            None,
            "after the last put"
        );
    }

    #[test]
    fn an_out_of_order_put_makes_the_index_incomplete() {
        let mut index = PointIndex::empty();
        index.note_put(5, 0);
        index.note_put(4, 100);
        assert!(!index.is_complete());
    }

    #[test]
    fn states_it_cannot_hold_or_too_many_changes_give_the_index_up() {
        let touch = |state| Touch {
            due_ms: 1,
            attempts: 0,
            state,
        };
        let mut index = PointIndex::empty();
        index.touch(1, touch(TaskState::Cancelled), 10);
        assert_eq!(
            index.touched(1),
            Some(Touched::Full(touch(TaskState::Cancelled)))
        );
        index.cancel_as_put(3);
        assert_eq!(index.touched(3), Some(Touched::CancelledAsPut));
        index.touch(2, touch(TaskState::Dead), 10);
        assert!(!index.is_complete());
        assert_eq!(index.touched(1), None, "an incomplete index holds nothing");
        assert_eq!(index.touched(3), None);

        let mut index = PointIndex::empty();
        // Cancels as put are bits: any number of them is kept.
        for seq in 1_000_000..1_100_000 {
            index.cancel_as_put(seq);
        }
        for seq in 0..touched_max(100) as u64 {
            index.touch(seq, touch(TaskState::Cancelled), 100);
        }
        assert!(index.is_complete());
        index.touch(u64::MAX, touch(TaskState::Cancelled), 100);
        assert!(!index.is_complete());
    }

    #[test]
    fn the_checkpoint_form_round_trips_and_damage_is_refused() {
        let mut index = PointIndex::empty();
        for i in 0..100u64 {
            index.note_put(i + 1, i * 1000);
        }
        for (seq, state) in [(3, TaskState::Cancelled), (7, TaskState::Scheduled)] {
            let touch = Touch {
                due_ms: 99,
                attempts: 0,
                state,
            };
            index.touch(seq, touch, 100);
        }
        for seq in [4, 50, 99] {
            index.cancel_as_put(seq);
        }
        let mut bytes = Vec::new();
        index.encode(&mut bytes);
        let back = PointIndex::decode(&mut Reader { bytes: &bytes }, 100_000).unwrap();
        assert_eq!(back.samples, index.samples);
        assert_eq!(back.max_put_seq, 100);
        assert_eq!(back.touched, index.touched);
        assert_eq!(back.cancelled, index.cancelled);
        assert!(back.is_complete());
        // A sample past the end of the file is damage.
        assert!(PointIndex::decode(&mut Reader { bytes: &bytes }, 1000).is_err());
        // So is a cut.
        let cut = &bytes[..bytes.len() - 3];
        assert!(PointIndex::decode(&mut Reader { bytes: cut }, 100_000).is_err());
        // And an unknown state code.
        // The last change's state byte comes right before the cancels (count and 3 seqs).
        let mut bad = bytes.clone();
        let state_at = bad.len() - 8 * 4 - 1;
        assert!(matches!(bad[state_at], 0 | 4));
        bad[state_at] = 9;
        assert!(PointIndex::decode(&mut Reader { bytes: &bad }, 100_000).is_err());
        // And cancels out of order.
        let mut bad = bytes.clone();
        let last = bad.len() - 8;
        bad[last..].copy_from_slice(&4u64.to_le_bytes());
        assert!(PointIndex::decode(&mut Reader { bytes: &bad }, 100_000).is_err());
    }
}
