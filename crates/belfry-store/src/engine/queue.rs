//! One queue's in-memory side: its buckets (loaded or not) and the index of loaded tasks.
//!
//! A bucket is either *unloaded* (only its [`BucketMeta`] counts are in memory) or *loaded*
//! (one compact [`Entry`] per task, payloads stay on disk). Invariant: every unloaded bucket
//! with scheduled or leased tasks is in `wake`, keyed by its earliest due time or lease
//! deadline, and the engine loads every bucket whose wake time is within the look-ahead of
//! `now` before answering a call that takes `now`. So an unloaded bucket never holds a due
//! task or an expired lease, and claims only look at the loaded index.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use belfry_core::{LatePolicy, Priority, QueueName, Task, TaskState, UnixMs};

use super::bucket::{file_name, task_id};
use super::keys::{KeyHasher, KeyIndex};
use super::persist::BucketMeta;
use super::points::{PointIndex, Touch};
use super::record::{self, Record};
use crate::store::{Result, StoreError};

/// One task of a loaded bucket: what claims and state changes need, without the payload.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub due_ms: UnixMs,
    pub until_ms: UnixMs,
    pub lease_id: u64,
    /// Where the task's put record is in the bucket file.
    pub put_offset: u64,
    pub put_len: u32,
    pub attempts: u32,
    pub state: TaskState,
    pub priority: Priority,
    pub late_policy: LatePolicy,
    /// The hash of the task's idempotency key (see `engine::keys`), to release it when the
    /// task finishes.
    pub key_hash: Option<u64>,
    pub dead_reason: Option<Box<str>>,
    /// Whether a record after the put changed the task (see `engine::points`: an unloaded
    /// bucket remembers only these).
    pub changed: bool,
}

impl Entry {
    /// A task as its put record left it, at `offset` and `len` in the bucket file.
    pub(super) fn put(
        put: &record::PutRecord,
        offset: u64,
        len: u32,
        key_hash: Option<u64>,
    ) -> Entry {
        Entry {
            due_ms: put.due_at_ms,
            until_ms: 0,
            lease_id: 0,
            put_offset: offset,
            put_len: len,
            attempts: 0,
            state: TaskState::Scheduled,
            priority: put.priority,
            late_policy: put.late_policy,
            key_hash,
            dead_reason: None,
            changed: false,
        }
    }

    /// The task's state after a record that follows its put (`listing::Seen::follow` keeps
    /// a listing's few fields the same way).
    pub(super) fn follow(&mut self, record: &Record) {
        match record {
            Record::Put(_) => {}
            Record::Cancel { .. } => {
                // A discarded dead letter is cancelled too, and keeps no reason.
                self.state = TaskState::Cancelled;
                self.dead_reason = None;
            }
            Record::Reschedule { due_at_ms, .. } | Record::Nack { due_at_ms, .. } => {
                self.state = TaskState::Scheduled;
                self.due_ms = *due_at_ms;
            }
            Record::Lease {
                lease_id,
                until_ms,
                attempts,
                ..
            } => {
                self.state = TaskState::Leased;
                self.lease_id = *lease_id;
                self.until_ms = *until_ms;
                self.attempts = *attempts;
            }
            Record::Done { .. } => self.state = TaskState::Done,
            Record::Skipped { .. } => self.state = TaskState::Skipped,
            Record::Extend {
                lease_id, until_ms, ..
            } => {
                self.state = TaskState::Leased;
                self.lease_id = *lease_id;
                self.until_ms = *until_ms;
            }
            Record::Dead {
                reason, attempts, ..
            } => {
                self.state = TaskState::Dead;
                if let Some(attempts) = attempts {
                    self.attempts = *attempts;
                }
                self.dead_reason = Some(reason.as_str().into());
            }
            Record::Redrive { due_at_ms, .. } => {
                self.state = TaskState::Scheduled;
                self.due_ms = *due_at_ms;
                self.attempts = 0;
                self.dead_reason = None;
            }
        }
    }
}

/// The entries of a loaded bucket, by sequence number: sorted sequence numbers in one array
/// and the entries in another, same order.
///
/// A bucket's records arrive in sequence order (puts are numbered under the engine lock and
/// appended in that order; a load reads the file front to back), so an insert is a push and
/// the arrays stay sorted. Claims and acks visit tasks in due order, which within a due time
/// is sequence order: neighbouring lookups touch neighbouring memory, and a search walks a
/// dense array of `u64`s (8 bytes a task) rather than a hash table of whole entries, which
/// in a large bucket missed the cache on nearly every lookup. When sequence numbers are
/// consecutive, the position is computed and checked without a search.
///
/// The bucket's counts and bounds ([`Entries::meta`]) are computed by a scan and kept until
/// the next change: every change goes through `insert` or `get_mut`, which forget them. A
/// checkpoint asks for every loaded bucket's counts under the engine lock (and an unload
/// asks again), so a bucket that did not change since costs nothing, and one that did is
/// scanned once, not once per question (a 1M-task bucket being drained was scanned three
/// times per checkpoint: 4% of the server's time in a burst, all of it holding the lock).
#[derive(Debug, Default)]
pub(crate) struct Entries {
    seqs: Vec<u64>,
    items: Vec<Entry>,
    meta: std::cell::Cell<Option<BucketMeta>>,
}

impl Entries {
    fn position(&self, seq: u64) -> Result<usize, usize> {
        let first = match self.seqs.first() {
            Some(&first) => first,
            None => return Err(0),
        };
        // Dense numbering: the guess is right.
        if let Some(guess) = seq.checked_sub(first).and_then(|d| usize::try_from(d).ok()) {
            if self.seqs.get(guess) == Some(&seq) {
                return Ok(guess);
            }
        }
        self.seqs.binary_search(&seq)
    }

    pub fn get(&self, seq: &u64) -> Option<&Entry> {
        self.position(*seq).ok().map(|at| &self.items[at])
    }

    pub fn get_mut(&mut self, seq: &u64) -> Option<&mut Entry> {
        self.meta.set(None);
        self.position(*seq).ok().map(|at| &mut self.items[at])
    }

    /// Counts and bounds of the entries (see the type's comment).
    pub fn meta(&self) -> BucketMeta {
        if let Some(meta) = self.meta.get() {
            debug_assert_eq!(meta, self.scan_meta(), "a change did not forget the meta");
            return meta;
        }
        let meta = self.scan_meta();
        self.meta.set(Some(meta));
        meta
    }

    fn scan_meta(&self) -> BucketMeta {
        let mut meta = BucketMeta::default();
        for entry in &self.items {
            match entry.state {
                TaskState::Scheduled => meta.add_scheduled(entry.due_ms),
                TaskState::Leased => meta.add_leased(entry.until_ms),
                TaskState::Dead => meta.dead += 1,
                TaskState::Done | TaskState::Cancelled | TaskState::Skipped => {}
            }
        }
        meta
    }

    pub fn contains_key(&self, seq: &u64) -> bool {
        self.position(*seq).is_ok()
    }

    /// Adds an entry (replacing one with the same sequence number).
    pub fn insert(&mut self, seq: u64, entry: Entry) {
        self.meta.set(None);
        if self.seqs.last().is_none_or(|&last| last < seq) {
            self.seqs.push(seq);
            self.items.push(entry);
            return;
        }
        match self.position(seq) {
            Ok(at) => self.items[at] = entry,
            Err(at) => {
                self.seqs.insert(at, seq);
                self.items.insert(at, entry);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// The entries after sequence number `after` (all if `None`), in sequence order.
    pub fn after(&self, after: Option<u64>) -> impl Iterator<Item = (&u64, &Entry)> {
        let from = after.map_or(0, |seq| self.seqs.partition_point(|&s| s <= seq));
        self.seqs[from..].iter().zip(&self.items[from..])
    }
}

impl<'a> IntoIterator for &'a Entries {
    type Item = (&'a u64, &'a Entry);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, u64>, std::slice::Iter<'a, Entry>>;

    fn into_iter(self) -> Self::IntoIter {
        self.seqs.iter().zip(self.items.iter())
    }
}

#[derive(Debug)]
pub(crate) struct Bucket {
    pub path: PathBuf,
    /// Bytes already written to the file; `buf` holds the rest, not yet written.
    pub flushed_len: u64,
    pub buf: Vec<u8>,
    /// Written since the last fsync.
    pub dirty: bool,
    /// Exact counts while unloaded; a loaded bucket's come from `entries` (computed when
    /// it is unloaded or checkpointed, and kept until it changes).
    pub meta: BucketMeta,
    pub entries: Option<Entries>,
    /// Finds one task's records without loading the bucket (`engine::points`).
    pub points: PointIndex,
    /// Open for reads and appends while the bucket is loaded (see [`Bucket::flush`]).
    file: Option<File>,
    /// Which `Bucket` this is, unique in the process: a bucket deleted and made again under
    /// the same key (a new file) gets a new one. A read of the file made without the engine
    /// lock is valid while the stamp is the same (see `listing.rs`).
    pub stamp: u64,
}

/// The next [`Bucket::stamp`].
static NEXT_BUCKET_STAMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Bucket {
    pub fn new(path: PathBuf, flushed_len: u64, meta: BucketMeta, loaded: bool) -> Bucket {
        Bucket {
            path,
            flushed_len,
            buf: Vec::new(),
            dirty: false,
            meta,
            entries: loaded.then(Entries::default),
            // A new file is indexed from its first record on; an existing one only once read
            // (a restart restores the index the checkpoint kept, if any).
            points: if flushed_len == 0 {
                PointIndex::empty()
            } else {
                PointIndex::unknown()
            },
            file: None,
            stamp: NEXT_BUCKET_STAMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    pub fn len(&self) -> u64 {
        self.flushed_len + self.buf.len() as u64
    }

    /// Appends one frame (to the buffer); returns its offset in the file.
    pub fn append(&mut self, frame: &[u8]) -> u64 {
        let offset = self.len();
        self.buf.extend_from_slice(frame);
        self.dirty = true;
        offset
    }

    /// Writes the buffer to the file (no fsync: the WAL holds these bytes durably).
    pub fn flush(&mut self) -> Result<usize> {
        if self.buf.is_empty() {
            return Ok(0);
        }
        let file = open_bucket_file(&mut self.file, &self.path)?;
        (&*file)
            .write_all(&self.buf)
            .map_err(|source| StoreError::io_at("append to a bucket file", &self.path, source))?;
        let written = self.buf.len();
        self.flushed_len += written as u64;
        // Loaded buckets (near now) keep their file open and their buffer's capacity for the
        // next write; far ones, written to rarely and possibly by the hundred, hold neither
        // a descriptor nor memory (a kept 256 KiB-plus buffer per far bucket was most of the
        // heap after a fill spread over two years).
        if self.entries.is_none() {
            self.file = None;
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Ok(written)
    }

    /// Closes the file if the bucket is unloaded (its reads are rare; see `flush`).
    pub fn release_file(&mut self) {
        if self.entries.is_none() {
            self.file = None;
        }
    }

    /// Gives the write buffer's memory back once it is written. The flushes that cover every
    /// bucket (the global buffer bound, checkpoints) call this, so that thousands of quiet
    /// buckets do not each keep the capacity of their busiest moment (10,000 queues kept
    /// about 16 KiB each); a busy bucket regrows it once and keeps it between its own flushes.
    pub fn release_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        }
    }

    /// The bucket's records from file offset `from` on: the rest of the file (read under
    /// the lock, usually little) and the write buffer, decoded.
    fn decode_rest(&self, from: u64) -> Result<Vec<LoadedRecord>> {
        let mut records = if from < self.flushed_len {
            decode_file(&self.path, from, self.flushed_len)?
        } else {
            Vec::new()
        };
        let mut offset = 0usize;
        while offset < self.buf.len() {
            let at = self.flushed_len + offset as u64;
            let (record, len) = record::decode_light(&self.buf[offset..])
                .map_err(|e| corrupt_at(&self.path, at, e.to_string()))?;
            records.push((record, at, len as u32));
            offset += len;
        }
        Ok(records)
    }

    /// Reads the put records at `spots` (file offset and frame length, sorted by offset), in
    /// that order. Records close together are read with one `pread` into one buffer that
    /// their payloads then share: a claim of a thousand tasks that were put together costs a
    /// few reads and no copy per payload, not a thousand reads.
    fn read_puts(&mut self, spots: &[(u64, u32)]) -> Result<Vec<record::PutRecord>> {
        let mut puts = Vec::with_capacity(spots.len());
        let mut i = 0;
        while i < spots.len() {
            let (start, first_len) = spots[i];
            let in_buf = start >= self.flushed_len;
            let mut end = start + u64::from(first_len);
            let mut j = i + 1;
            while let Some(&(offset, len)) = spots.get(j) {
                let next_end = offset + u64::from(len);
                if (offset >= self.flushed_len) != in_buf
                    || offset > end + READ_GAP_BYTES_MAX
                    || next_end - start > READ_SPAN_BYTES_MAX
                {
                    break;
                }
                end = end.max(next_end);
                j += 1;
            }
            let span = self.read_span(start, end, in_buf)?;
            for &(offset, len) in &spots[i..j] {
                let at = (offset - start) as usize;
                let frame = span.slice(at..at + len as usize);
                let put = record::decode_put_shared(&frame)
                    .map_err(|e| corrupt_at(&self.path, offset, e.to_string()))?;
                puts.push(put);
            }
            i = j;
        }
        Ok(puts)
    }

    /// Bytes `start..end` of the bucket: from the write buffer if `in_buf`, else the file.
    pub(super) fn read_span(&mut self, start: u64, end: u64, in_buf: bool) -> Result<bytes::Bytes> {
        if in_buf {
            let from = (start - self.flushed_len) as usize;
            let to = (end - self.flushed_len) as usize;
            let bytes = self.buf.get(from..to).ok_or_else(|| {
                corrupt_at(&self.path, start, "put record beyond the buffer".into())
            })?;
            return Ok(bytes::Bytes::copy_from_slice(bytes));
        }
        let mut owned = vec![0; (end - start) as usize];
        open_bucket_file(&mut self.file, &self.path)?
            .read_exact_at(&mut owned, start)
            .map_err(|source| {
                StoreError::io_at("read tasks from a bucket file", &self.path, source)
            })?;
        Ok(bytes::Bytes::from(owned))
    }

    /// Counts from the entries of a loaded bucket.
    pub fn computed_meta(&self) -> BucketMeta {
        match &self.entries {
            Some(entries) => entries.meta(),
            None => self.meta,
        }
    }
}

/// What memory knows of a task besides its put record.
pub(crate) struct TaskFacts {
    pub due: UnixMs,
    pub state: TaskState,
    pub attempts: u32,
    pub until: Option<UnixMs>,
    pub dead_reason: Option<String>,
}

/// A bucket's file, opened once for reads and appends (created if missing).
fn open_bucket_file<'a>(slot: &'a mut Option<File>, path: &Path) -> Result<&'a File> {
    if let Some(file) = slot {
        return Ok(file);
    }
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
        .map_err(|source| StoreError::io_at("open a bucket file", path, source))?;
    Ok(slot.insert(file))
}

/// A decoded record with its offset and length in the bucket file.
pub(crate) type LoadedRecord = (Record, u64, u32);

/// The records of a bucket file's first `len` bytes, decoded without payloads and headers
/// (they stay on disk), so decoding a large bucket holds one small record per task.
#[derive(Debug)]
pub(crate) struct Decoded {
    records: Vec<LoadedRecord>,
    len: u64,
}

pub(super) fn corrupt_at(path: &Path, offset: u64, detail: String) -> StoreError {
    StoreError::Corrupt {
        location: format!("{} at offset {offset}", path.display()),
        detail,
    }
}

/// Reads of put records: records at most this far apart share one read (reading a gap costs
/// less than another system call)...
const READ_GAP_BYTES_MAX: u64 = 16 * 1024;
/// ...and one read covers at most this many bytes (a longer record is read alone).
const READ_SPAN_BYTES_MAX: u64 = 1024 * 1024;

/// Size of the read buffer when streaming a bucket file.
const LOAD_READ_BUFFER_BYTES: usize = 1024 * 1024;

/// Decodes bytes `from..to` of a bucket file, streaming, one frame at a time.
fn decode_file(path: &Path, from: u64, to: u64) -> Result<Vec<LoadedRecord>> {
    let file = File::open(path)
        .map_err(|source| StoreError::io_at("open a bucket file to load it", path, source))?;
    let mut reader = BufReader::with_capacity(LOAD_READ_BUFFER_BYTES, file);
    reader
        .seek(SeekFrom::Start(from))
        .map_err(|source| StoreError::io_at("seek in a bucket file", path, source))?;
    let read_error = |source: std::io::Error, at: u64| match source.kind() {
        ErrorKind::UnexpectedEof => corrupt_at(path, at, "file shorter than written".into()),
        _ => StoreError::io_at("read a bucket file", path, source),
    };
    let mut records = Vec::new();
    let mut frame = Vec::new();
    let mut offset = from;
    while offset < to {
        frame.resize(record::FRAME_HEADER_BYTES, 0);
        reader
            .read_exact(&mut frame)
            .map_err(|e| read_error(e, offset))?;
        let body_len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as u64;
        let total = record::FRAME_HEADER_BYTES as u64 + body_len;
        if body_len > record::FRAME_BODY_BYTES_MAX as u64 || offset + total > to {
            return Err(corrupt_at(
                path,
                offset,
                format!("bad frame length {body_len}"),
            ));
        }
        frame.resize(total as usize, 0);
        reader
            .read_exact(&mut frame[record::FRAME_HEADER_BYTES..])
            .map_err(|e| read_error(e, offset))?;
        let (record, _) =
            record::decode_light(&frame).map_err(|e| corrupt_at(path, offset, e.to_string()))?;
        records.push((record, offset, total as u32));
        offset += total;
    }
    Ok(records)
}

/// Decodes a bucket file's first `len` bytes; used without the engine lock (see
/// `Engine::preload`).
pub(crate) fn decode_prefix(path: &Path, len: u64) -> Result<Decoded> {
    Ok(Decoded {
        records: decode_file(path, 0, len)?,
        len,
    })
}

/// Ready key: due time, then submit order (seq), then the bucket to find the entry in.
type ReadyKey = (UnixMs, u64, u64);

#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Scheduled tasks of loaded buckets: `[high, normal]`.
    pub ready: [BTreeSet<ReadyKey>; 2],
    /// Leased tasks of loaded buckets by deadline.
    pub leases: BTreeSet<ReadyKey>,
    /// Dead tasks in loaded buckets.
    pub dead_loaded: u64,
    /// Live idempotency keys, by hash.
    pub keys: KeyIndex,
}

fn priority_slot(priority: Priority) -> usize {
    match priority {
        Priority::High => 0,
        Priority::Normal => 1,
    }
}

impl Index {
    fn insert(&mut self, key: u64, seq: u64, entry: &Entry) {
        match entry.state {
            TaskState::Scheduled => {
                self.ready[priority_slot(entry.priority)].insert((entry.due_ms, seq, key));
            }
            TaskState::Leased => {
                self.leases.insert((entry.until_ms, seq, key));
            }
            TaskState::Dead => self.dead_loaded += 1,
            TaskState::Done | TaskState::Cancelled | TaskState::Skipped => {}
        }
    }

    fn remove(&mut self, key: u64, seq: u64, entry: &Entry) {
        match entry.state {
            TaskState::Scheduled => {
                self.ready[priority_slot(entry.priority)].remove(&(entry.due_ms, seq, key));
            }
            TaskState::Leased => {
                self.leases.remove(&(entry.until_ms, seq, key));
            }
            TaskState::Dead => self.dead_loaded -= 1,
            TaskState::Done | TaskState::Cancelled | TaskState::Skipped => {}
        }
    }
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub name: QueueName,
    pub uid: u64,
    pub dir: PathBuf,
    pub buckets: BTreeMap<u64, Bucket>,
    /// Unloaded buckets with something scheduled or leased, by wake time.
    pub wake: BTreeSet<(UnixMs, u64)>,
    pub index: Index,
    /// The engine's idempotency-key hash.
    pub hasher: KeyHasher,
    /// Leases ended by expiry that no claim has reported yet (`ClaimBatch::leases_expired`).
    /// In memory only, like expiry itself: after a restart a lease that ran out before it
    /// and was not leased again ends (and is counted) again.
    pub leases_expired: u64,
}

/// Counters of work done by loads and replay, for tests and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Bucket loads (reads of a whole bucket file into entries).
    pub buckets_loaded: u64,
    /// Records decoded by bucket loads.
    pub records_loaded: u64,
    /// Records replayed from the WAL at open.
    pub wal_records_replayed: u64,
    /// Group-commit WAL writes and fsyncs so far (each may cover many calls).
    pub wal_writes: u64,
    pub wal_syncs: u64,
    /// Bytes of frames written to the WAL since open (WAL files may be longer: they can hold
    /// zeros prepared ahead, see `EngineOptions::wal_prefill`).
    pub wal_bytes: u64,
    /// Checkpoints run since open (including the one at open).
    pub checkpoints: u64,
    /// Buckets currently loaded, and known in all.
    pub buckets_in_memory: u64,
    pub buckets_total: u64,
    /// Idempotency-key runs on disk, and the entries they hold (stale ones included).
    pub key_runs: u64,
    pub key_run_entries: u64,
}

impl Queue {
    pub fn new(name: QueueName, uid: u64, dir: PathBuf, hasher: KeyHasher) -> Queue {
        Queue {
            name,
            uid,
            dir,
            buckets: BTreeMap::new(),
            wake: BTreeSet::new(),
            index: Index::default(),
            hasher,
            leases_expired: 0,
        }
    }

    pub fn bucket_path(&self, key: u64) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// Adds a bucket known from the checkpoint or created by a write.
    pub fn add_bucket(&mut self, key: u64, bucket: Bucket) {
        if bucket.entries.is_none() {
            if let Some(wake) = bucket.meta.wake_ms() {
                self.wake.insert((wake, key));
            }
        }
        self.buckets.insert(key, bucket);
    }

    /// Changes the counts of an unloaded bucket, keeping `wake` in step.
    pub fn update_unloaded_meta(&mut self, key: u64, change: impl FnOnce(&mut BucketMeta)) {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return;
        };
        debug_assert!(bucket.entries.is_none());
        let before = bucket.meta.wake_ms();
        change(&mut bucket.meta);
        let after = bucket.meta.wake_ms();
        // Most puts land after a bucket's earliest task: the wake time stays.
        if before != after {
            if let Some(wake) = before {
                self.wake.remove(&(wake, key));
            }
            if let Some(wake) = after {
                self.wake.insert((wake, key));
            }
        }
    }

    /// Reads a bucket file into entries.
    pub fn load(&mut self, key: u64, stats: &mut EngineStats) -> Result<()> {
        self.load_from(key, None, stats)
    }

    /// [`Queue::load`] given the first bytes of the file, read without the engine lock.
    pub fn load_from(
        &mut self,
        key: u64,
        prefix: Option<Decoded>,
        stats: &mut EngineStats,
    ) -> Result<()> {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return Ok(());
        };
        if bucket.entries.is_some() {
            return Ok(());
        }
        let (mut records, from) = match prefix {
            Some(prefix) if prefix.len <= bucket.flushed_len => (prefix.records, prefix.len),
            _ => (Vec::new(), 0),
        };
        records.extend(bucket.decode_rest(from)?);
        let wake = bucket.meta.wake_ms();
        bucket.entries = Some(Entries::default());
        // Rebuilt from the records below (puts are noted as they are applied).
        bucket.points.reset();
        if let Some(wake) = wake {
            self.wake.remove(&(wake, key));
        }
        stats.buckets_loaded += 1;
        stats.records_loaded += records.len() as u64;
        for (record, offset, len) in &records {
            self.apply(key, record, *offset, *len);
        }
        Ok(())
    }

    /// Takes finished bucket `key` (every task done, cancelled or skipped) out of the queue,
    /// for deletion. Unlike [`Queue::unload`], it keeps nothing of the tasks: unloading a
    /// drained bucket of a million tasks recorded each one's change in the point index (a
    /// hash map insert each, under the engine lock: 7.5% of the server's time in a burst)
    /// only for the bucket to be deleted. Finished tasks have no place in the index (see
    /// `Index::remove`), so nothing else refers to them.
    pub fn take_finished(&mut self, key: u64) -> Option<Bucket> {
        let bucket = self.buckets.remove(&key)?;
        debug_assert!(
            bucket.computed_meta().is_empty(),
            "a finished bucket holds a live task"
        );
        Some(bucket)
    }

    /// Drops a loaded bucket's entries, keeping exact counts.
    pub fn unload(&mut self, key: u64) {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return;
        };
        let meta = bucket.computed_meta();
        let Some(entries) = bucket.entries.take() else {
            return;
        };
        let tasks = entries.len();
        for (seq, entry) in &entries {
            self.index.remove(key, *seq, entry);
            if entry.changed {
                let touch = Touch {
                    due_ms: entry.due_ms,
                    attempts: entry.attempts,
                    state: entry.state,
                };
                bucket.points.touch(*seq, touch, tasks);
            }
        }
        bucket.meta = meta;
        bucket.file = None;
        if let Some(wake) = meta.wake_ms() {
            self.wake.insert((wake, key));
        }
    }

    /// Applies a record to a loaded bucket and the index. Records for tasks the bucket does
    /// not hold are ignored: they can follow a replay into a bucket deleted meanwhile.
    pub fn apply(&mut self, key: u64, record: &Record, offset: u64, len: u32) {
        let Some(bucket) = self.buckets.get_mut(&key) else {
            debug_assert!(false, "apply to an unknown bucket");
            return;
        };
        let Some(entries) = bucket.entries.as_mut() else {
            debug_assert!(false, "apply to an unloaded bucket");
            return;
        };
        let seq = record.seq();
        if let Record::Put(put) = record {
            if entries.contains_key(&seq) {
                return;
            }
            bucket.points.note_put(seq, offset);
            let key_hash = put.idempotency_key.as_deref().map(|k| self.hasher.hash(k));
            let entry = Entry::put(put, offset, len, key_hash);
            self.index.insert(key, seq, &entry);
            if let Some(hash) = entry.key_hash {
                self.index.keys.insert(hash, task_id(seq, key));
            }
            entries.insert(seq, entry);
            return;
        }
        let Some(entry) = entries.get_mut(&seq) else {
            return;
        };
        self.index.remove(key, seq, entry);
        entry.changed = true;
        entry.follow(record);
        self.index.insert(key, seq, entry);
        // A finished task's key may be reused (the Store contract allows forgetting it).
        if matches!(
            entry.state,
            TaskState::Done | TaskState::Cancelled | TaskState::Skipped
        ) {
            if let Some(hash) = entry.key_hash {
                self.index.keys.remove(hash, task_id(seq, key));
            }
        }
    }

    /// The unloaded buckets that have something due or expiring by `horizon_ms`, with the
    /// file bytes that can be read without the lock: `(key, path, flushed_len)`.
    pub fn woken(&self, horizon_ms: UnixMs) -> Vec<(u64, PathBuf, u64)> {
        self.wake
            .iter()
            .take_while(|(wake, _)| *wake <= horizon_ms)
            .filter_map(|(_, key)| {
                let bucket = self.buckets.get(key)?;
                Some((*key, bucket.path.clone(), bucket.flushed_len))
            })
            .collect()
    }

    /// Loads every bucket that has something due or expiring by `horizon_ms`.
    pub fn load_woken(&mut self, horizon_ms: UnixMs, stats: &mut EngineStats) -> Result<()> {
        while let Some(&(wake, key)) = self.wake.first() {
            if wake > horizon_ms {
                break;
            }
            self.load(key, stats)?;
        }
        Ok(())
    }

    /// Ends every lease whose deadline is at or before `now_ms`: the task is scheduled again
    /// with its due time unchanged. Nothing is written: a lease record plus the clock says it.
    pub fn expire_leases(&mut self, now_ms: UnixMs) {
        while let Some(&(until, seq, key)) = self.index.leases.first() {
            if until > now_ms {
                break;
            }
            self.index.leases.pop_first();
            let Some(entry) = self
                .buckets
                .get_mut(&key)
                .and_then(|b| b.entries.as_mut())
                .and_then(|e| e.get_mut(&seq))
            else {
                debug_assert!(false, "leased entry missing");
                continue;
            };
            debug_assert_eq!(entry.state, TaskState::Leased);
            entry.state = TaskState::Scheduled;
            self.index.insert(key, seq, entry);
            self.leases_expired += 1;
        }
    }

    /// The entry of task `seq` of bucket `key` if that bucket is loaded.
    pub fn loaded_entry(&self, seq: u64, key: u64) -> Option<&Entry> {
        self.buckets
            .get(&key)
            .and_then(|b| b.entries.as_ref())
            .and_then(|e| e.get(&seq))
    }

    /// The entry of a task, loading its bucket if needed. `None` if the bucket or the task
    /// is unknown.
    pub fn entry(&mut self, seq: u64, key: u64, stats: &mut EngineStats) -> Result<Option<&Entry>> {
        match self.buckets.get(&key) {
            None => return Ok(None),
            Some(bucket) if bucket.entries.is_none() => self.load(key, stats)?,
            Some(_) => {}
        }
        Ok(self.loaded_entry(seq, key))
    }

    /// The full task for a loaded entry (reads its put record).
    pub fn view(&mut self, seq: u64, key: u64) -> Result<Option<Task>> {
        Ok(self.view_many(&[(seq, key)])?.pop().flatten())
    }

    /// The full tasks for loaded entries `(seq, key)`, in the order asked (`None` for one not
    /// loaded).
    pub fn view_many(&mut self, wanted: &[(u64, u64)]) -> Result<Vec<Option<Task>>> {
        // (bucket, put offset, put length) of each loaded entry, and where it was asked.
        let mut spots = Vec::with_capacity(wanted.len());
        let mut asked = Vec::with_capacity(wanted.len());
        for (at, &(seq, key)) in wanted.iter().enumerate() {
            let entry = self.loaded_entry(seq, key);
            if let Some(entry) = entry {
                spots.push((key, entry.put_offset, entry.put_len));
                asked.push(at);
            }
        }
        let puts = self.read_puts(&spots)?;
        let mut tasks: Vec<Option<Task>> = (0..wanted.len()).map(|_| None).collect();
        for (put, at) in puts.into_iter().zip(asked) {
            let (seq, key) = wanted[at];
            let Some(entry) = self.loaded_entry(seq, key) else {
                continue;
            };
            let until = (entry.state == TaskState::Leased).then_some(entry.until_ms);
            let dead_reason = entry.dead_reason.as_deref().map(String::from);
            let (due, state, attempts) = (entry.due_ms, entry.state, entry.attempts);
            tasks[at] = Some(self.task(
                seq,
                key,
                put,
                TaskFacts {
                    due,
                    state,
                    attempts,
                    until,
                    dead_reason,
                },
            )?);
        }
        Ok(tasks)
    }

    /// The put records at `(bucket, file offset, frame length)`, in the order asked. They are
    /// read bucket by bucket in file order, so neighbours share reads; each is checked to be
    /// the put record of the task it is asked for by the caller (see [`Queue::task`]).
    pub fn read_puts(&mut self, spots: &[(u64, u64, u32)]) -> Result<Vec<record::PutRecord>> {
        let mut order: Vec<usize> = (0..spots.len()).collect();
        order.sort_unstable_by_key(|&i| (spots[i].0, spots[i].1));
        let mut puts: Vec<Option<record::PutRecord>> = (0..spots.len()).map(|_| None).collect();
        let mut offsets = Vec::new();
        for group in order.chunk_by(|&a, &b| spots[a].0 == spots[b].0) {
            let key = spots[group[0]].0;
            let Some(bucket) = self.buckets.get_mut(&key) else {
                return Err(StoreError::Corrupt {
                    location: format!("bucket {key:#x} of queue {}", self.name),
                    detail: "a task's bucket is not known".into(),
                });
            };
            offsets.clear();
            offsets.extend(group.iter().map(|&i| (spots[i].1, spots[i].2)));
            for (&i, put) in group.iter().zip(bucket.read_puts(&offsets)?) {
                puts[i] = Some(put);
            }
        }
        Ok(puts.into_iter().flatten().collect())
    }

    /// A task from its put record and what memory knows of it. The put record must be the
    /// task's own: a mismatch means the file or the index is damaged.
    pub fn task(
        &self,
        seq: u64,
        key: u64,
        put: record::PutRecord,
        facts: TaskFacts,
    ) -> Result<Task> {
        if put.seq != seq {
            return Err(StoreError::Corrupt {
                location: self.bucket_path(key).display().to_string(),
                detail: format!("the put record read for seq {seq} is for seq {}", put.seq),
            });
        }
        Ok(Task {
            id: task_id(seq, key),
            queue: self.name.clone(),
            due_at_ms: facts.due,
            payload: put.payload,
            payload_kind: put.payload_kind,
            payload_dropped: false,
            headers: put.headers,
            priority: put.priority,
            idempotency_key: put.idempotency_key,
            late_policy: put.late_policy,
            target: put.target,
            state: facts.state,
            attempts: facts.attempts,
            lease_until_ms: facts.until,
            dead_reason: facts.dead_reason,
        })
    }
}
