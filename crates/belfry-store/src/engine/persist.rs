//! Small files rewritten whole: the meta file (queues) and the checkpoint (which also holds
//! the metadata entries as of its WAL position). Both are one CRC frame, written to a
//! temporary file, fsync'd and renamed, so a reader sees the old or the new version, never a
//! mix.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::Path;

use belfry_core::{QueueName, TaskId, UnixMs};
use bytes::Bytes;

use super::points::PointIndex;
use super::record::{put_str, put_u64, split_frame_limited, Reader};
use crate::store::{Result, StoreError};

const META_MAGIC: &[u8; 8] = b"BLFYMETA";
const CHECKPOINT_MAGIC: &[u8; 8] = b"BLFYCKPT";
const FILE_VERSION: u8 = 1;
/// Meta file format 2 holds queues only; format 1 also held the `*_meta` entries, which now
/// live in the WAL and the checkpoint. Format 1 is still read (its entries are the starting
/// point when the checkpoint has none).
const META_VERSION: u8 = 2;
/// Checkpoint format 2 keeps idempotency keys as keyed hashes (`engine::keys`) and the hash's
/// secret; format 3 adds the metadata entries after the keys; format 4 adds the subscription
/// tree (runs and per-set counters) after them; format 5 adds the point indexes of unloaded
/// buckets (`engine::points`) after that; format 6 adds the list of idempotency-key runs
/// (`engine::keys::runs`) at the end. Formats 1 (full keys) to 5 are still read (before 5
/// their buckets have no point index until loaded; before 6 every key is in the key section).
const CHECKPOINT_VERSION: u8 = 6;
/// The first checkpoint format with the point indexes.
const CHECKPOINT_VERSION_POINTS: u8 = 5;
/// The first checkpoint format with the subscription section.
const CHECKPOINT_VERSION_SUBS: u8 = 4;
/// The first checkpoint format with the metadata entries.
const CHECKPOINT_VERSION_META: u8 = 3;
/// The first checkpoint format with keyed hashes of idempotency keys.
const CHECKPOINT_VERSION_HASHED_KEYS: u8 = 2;

/// Longest meta value or queue config accepted when reading (they are small documents).
const BLOB_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Longest namespace, key or name string accepted when reading.
const NAME_BYTES_MAX: usize = 64 * 1024;

/// Small metadata: `(namespace, key)` → value.
pub type MetaEntries = BTreeMap<(String, String), Bytes>;

#[derive(Debug, Default, Clone)]
pub struct MetaFile {
    pub next_queue_uid: u64,
    /// name → (uid, config)
    pub queues: BTreeMap<QueueName, (u64, Bytes)>,
}

/// What the checkpoint knows about one bucket: exact counts as of the checkpoint.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BucketMeta {
    pub scheduled: u64,
    /// Smallest and largest due time of scheduled tasks (meaningless when none).
    pub min_due_ms: UnixMs,
    pub max_due_ms: UnixMs,
    pub leased: u64,
    /// Earliest lease deadline (meaningless when none leased).
    pub min_until_ms: UnixMs,
    pub dead: u64,
    /// Scheduled tasks due at exactly `min_due_ms` and `max_due_ms`. Never more than there
    /// are (0 when unknown: a bucket from a checkpoint of format 4 or older), so a change
    /// through the point index that could move a bound knows whether it may (`points.rs`).
    pub min_due_count: u64,
    pub max_due_count: u64,
}

impl BucketMeta {
    /// When this bucket next needs attention: its earliest due time or lease deadline.
    pub fn wake_ms(&self) -> Option<UnixMs> {
        let due = (self.scheduled > 0).then_some(self.min_due_ms);
        let lease = (self.leased > 0).then_some(self.min_until_ms);
        match (due, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn add_scheduled(&mut self, due_ms: UnixMs) {
        if self.scheduled == 0 {
            (self.min_due_ms, self.min_due_count) = (due_ms, 1);
            (self.max_due_ms, self.max_due_count) = (due_ms, 1);
        } else {
            let (below, above) = (due_ms < self.min_due_ms, due_ms > self.max_due_ms);
            bound_add(&mut self.min_due_ms, &mut self.min_due_count, due_ms, below);
            bound_add(&mut self.max_due_ms, &mut self.max_due_count, due_ms, above);
        }
        self.scheduled += 1;
    }

    /// Removes a scheduled task due at `due_ms` that is not the last one at a bound (see
    /// [`BucketMeta::is_last_at_bound`]): the bounds stay exact.
    pub fn remove_scheduled(&mut self, due_ms: UnixMs) {
        debug_assert!(self.scheduled > 0 && !self.is_last_at_bound(due_ms));
        self.scheduled = self.scheduled.saturating_sub(1);
        if due_ms == self.min_due_ms {
            self.min_due_count = self.min_due_count.saturating_sub(1);
        }
        if due_ms == self.max_due_ms {
            self.max_due_count = self.max_due_count.saturating_sub(1);
        }
    }

    /// Takes the scheduled count and due bounds a scan of the bucket found (its leases and
    /// dead letters are not scanned: an indexed unloaded bucket has none).
    pub fn set_bounds(&mut self, bounds: &BucketMeta) {
        self.scheduled = bounds.scheduled;
        self.min_due_ms = bounds.min_due_ms;
        self.min_due_count = bounds.min_due_count;
        self.max_due_ms = bounds.max_due_ms;
        self.max_due_count = bounds.max_due_count;
    }

    /// Whether removing a scheduled task due at `due_ms` could leave a bound wrong: it is at
    /// a bound that no other task is known to share. (The last task of all is one: the bucket
    /// then empties, which the loaded path handles.)
    pub fn is_last_at_bound(&self, due_ms: UnixMs) -> bool {
        (due_ms == self.min_due_ms && self.min_due_count <= 1)
            || (due_ms == self.max_due_ms && self.max_due_count <= 1)
    }

    pub fn add_leased(&mut self, until_ms: UnixMs) {
        self.min_until_ms = if self.leased == 0 {
            until_ms
        } else {
            self.min_until_ms.min(until_ms)
        };
        self.leased += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.scheduled == 0 && self.leased == 0 && self.dead == 0
    }
}

#[derive(Debug, Default, Clone)]
pub struct CheckpointBucket {
    pub queue_uid: u64,
    pub key: u64,
    pub file_len: u64,
    pub meta: BucketMeta,
}

#[derive(Debug, Default, Clone)]
pub struct Checkpoint {
    pub next_seq: u64,
    pub next_lease: u64,
    pub last_now_ms: UnixMs,
    /// First WAL file to replay.
    pub wal_start: u64,
    pub buckets: Vec<CheckpointBucket>,
    /// The secret of the idempotency-key hash (`None` in a format-1 checkpoint).
    pub key_secret: Option<(u64, u64)>,
    /// Live idempotency keys: (queue uid, key hash, id).
    pub keys: Vec<(u64, u64, TaskId)>,
    /// Live idempotency keys of a format-1 checkpoint, in full: (queue uid, key, id). Open
    /// hashes them under a new secret.
    pub legacy_keys: Vec<(u64, String, TaskId)>,
    /// The metadata entries as of `wal_start` (`None` before format 3: they were in the meta
    /// file then).
    pub meta_entries: Option<MetaEntries>,
    /// The subscription tree as of `wal_start` (`None` before format 4: no subscriptions).
    pub subs: Option<SubsPersisted>,
    /// Point indexes of buckets unloaded at the checkpoint: (queue uid, bucket key, index).
    /// A bucket not listed has none until it is loaded (format 4 and older list none).
    pub points: Vec<(u64, u64, PointIndex)>,
    /// The idempotency-key runs (`None` before format 6: the key section held every key).
    pub key_runs: Option<KeyRunsPersisted>,
}

/// What a checkpoint records of the idempotency-key runs (`engine::keys::runs`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyRunsPersisted {
    /// The next run file id.
    pub next_run: u64,
    /// Run ids, newest first.
    pub runs: Vec<u64>,
}

/// `[next_run u64][runs u64][run id u64]*`: the key-run section of a format-6 checkpoint.
pub fn encode_key_runs(key_runs: &KeyRunsPersisted) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 8 * key_runs.runs.len());
    put_u64(&mut out, key_runs.next_run);
    put_u64(&mut out, key_runs.runs.len() as u64);
    for id in &key_runs.runs {
        put_u64(&mut out, *id);
    }
    out
}

fn read_key_runs(r: &mut Reader<'_>) -> std::result::Result<KeyRunsPersisted, &'static str> {
    let mut field = || r.u64().map_err(|_| "truncated key-run section");
    let next_run = field()?;
    let runs = field()?;
    if runs > 1 << 20 {
        return Err("implausible key-run count");
    }
    let mut out = KeyRunsPersisted {
        next_run,
        runs: Vec::with_capacity(runs as usize),
    };
    for _ in 0..runs {
        out.runs.push(field()?);
    }
    Ok(out)
}

/// What a checkpoint records of the subscription tree (`engine::subs`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SubsPersisted {
    /// The next set incarnation (epoch) to hand out.
    pub next_epoch: u64,
    /// The next run file id.
    pub next_run: u64,
    /// Run ids, newest first.
    pub runs: Vec<u64>,
    /// `(set, epoch, count)` of every set with members, ascending.
    pub sets: Vec<(u64, u64, u64)>,
}

/// `[next_epoch u64][next_run u64][runs u64][run id u64]*[sets u64][(set, epoch, count) u64*3]*`:
/// the subscription section of a format-4 checkpoint.
pub fn encode_subs(subs: &SubsPersisted) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 8 * subs.runs.len() + 24 * subs.sets.len());
    put_u64(&mut out, subs.next_epoch);
    put_u64(&mut out, subs.next_run);
    put_u64(&mut out, subs.runs.len() as u64);
    for id in &subs.runs {
        put_u64(&mut out, *id);
    }
    put_u64(&mut out, subs.sets.len() as u64);
    for &(set, epoch, count) in &subs.sets {
        for v in [set, epoch, count] {
            put_u64(&mut out, v);
        }
    }
    out
}

fn read_subs(r: &mut Reader<'_>) -> std::result::Result<SubsPersisted, &'static str> {
    let mut field = || r.u64().map_err(|_| "truncated subscription section");
    let next_epoch = field()?;
    let next_run = field()?;
    let runs = field()?;
    let mut subs = SubsPersisted {
        next_epoch,
        next_run,
        ..SubsPersisted::default()
    };
    for _ in 0..runs {
        subs.runs.push(field()?);
    }
    let sets = field()?;
    for _ in 0..sets {
        subs.sets.push((field()?, field()?, field()?));
    }
    Ok(subs)
}

/// Moves a bound to `due` (count 1) if `beyond` it, or counts one more task at it.
fn bound_add(bound: &mut UnixMs, count: &mut u64, due: UnixMs, beyond: bool) {
    if beyond {
        (*bound, *count) = (due, 1);
    } else if due == *bound {
        // Unknown (0) stays unknown: one more than an unknown number is not 1.
        if *count > 0 {
            *count += 1;
        }
    }
}

/// The point-index section of a format-5 checkpoint: a count, then per bucket its queue
/// uid, bucket key and index ([`PointIndex::encode`]).
#[derive(Debug, Default)]
pub struct PointsSection {
    count: u64,
    body: Vec<u8>,
}

impl PointsSection {
    pub fn add(&mut self, uid: u64, key: u64, index: &PointIndex) {
        self.count += 1;
        put_u64(&mut self.body, uid);
        put_u64(&mut self.body, key);
        index.encode(&mut self.body);
    }

    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.body.len());
        put_u64(&mut out, self.count);
        out.extend_from_slice(&self.body);
        out
    }
}

fn read_points(
    r: &mut Reader<'_>,
    buckets: &[CheckpointBucket],
) -> std::result::Result<Vec<(u64, u64, PointIndex)>, &'static str> {
    let lengths: HashMap<(u64, u64), u64> = buckets
        .iter()
        .map(|b| ((b.queue_uid, b.key), b.file_len))
        .collect();
    let count = r.u64().map_err(|_| "truncated point indexes")?;
    if count > buckets.len() as u64 {
        return Err("more point indexes than buckets");
    }
    let mut points = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let uid = r.u64().map_err(|_| "truncated point indexes")?;
        let key = r.u64().map_err(|_| "truncated point indexes")?;
        let file_len = *lengths
            .get(&(uid, key))
            .ok_or("a point index for a bucket the checkpoint does not list")?;
        points.push((uid, key, PointIndex::decode(r, file_len)?));
    }
    Ok(points)
}

/// An I/O error naming the file or directory at `path` (copied only if there is an error).
fn io_err<'a>(
    context: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::io_at(context, path, source)
}

fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        location: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Writes `body` as one frame to `path` atomically (temp file, fsync, rename, fsync dir).
pub fn write_atomic(path: &Path, body: &[u8]) -> Result<()> {
    let mut writer = FramedWriter::create(path)?;
    writer.write(body)?;
    writer.finish()
}

/// Writes one frame to a file atomically, its body in pieces, so a large body (a checkpoint
/// with millions of idempotency keys) is never held whole in memory: a placeholder header,
/// the pieces (their CRC computed on the way), then the real header, fsync, rename, fsync dir.
pub struct FramedWriter {
    file: std::io::BufWriter<File>,
    crc: crc32fast::Hasher,
    len: u64,
    temp: std::path::PathBuf,
    path: std::path::PathBuf,
}

/// Buffer between a framed file's pieces and the disk.
const FRAMED_WRITE_BUFFER_BYTES: usize = 1024 * 1024;

impl FramedWriter {
    pub fn create(path: &Path) -> Result<FramedWriter> {
        let temp = path.with_extension("tmp");
        let file = File::create(&temp).map_err(io_err("create a temporary file", &temp))?;
        let mut file = std::io::BufWriter::with_capacity(FRAMED_WRITE_BUFFER_BYTES, file);
        file.write_all(&[0; 8])
            .map_err(io_err("write a temporary file", &temp))?;
        Ok(FramedWriter {
            file,
            crc: crc32fast::Hasher::new(),
            len: 0,
            temp,
            path: path.to_path_buf(),
        })
    }

    pub fn write(&mut self, piece: &[u8]) -> Result<()> {
        self.crc.update(piece);
        self.len += piece.len() as u64;
        self.file
            .write_all(piece)
            .map_err(io_err("write a temporary file", &self.temp))
    }

    pub fn finish(self) -> Result<()> {
        let len = u32::try_from(self.len).map_err(|_| {
            StoreError::io_at(
                "write a metadata file",
                &self.path,
                std::io::Error::other("body longer than a frame can hold (4 GiB)"),
            )
        })?;
        let file = self
            .file
            .into_inner()
            .map_err(|e| StoreError::io_at("write a temporary file", &self.temp, e.into_error()))?;
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..].copy_from_slice(&self.crc.finalize().to_le_bytes());
        std::os::unix::fs::FileExt::write_all_at(&file, &header, 0)
            .map_err(io_err("write a temporary file", &self.temp))?;
        file.sync_all()
            .map_err(io_err("fsync a temporary file", &self.temp))?;
        drop(file);
        fs::rename(&self.temp, &self.path)
            .map_err(io_err("rename a temporary file into place", &self.path))?;
        if let Some(parent) = self.path.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    }
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync a directory", dir))
}

/// [`read_framed`] for a file with several known versions: the version read and the body.
fn read_framed_versions(
    path: &Path,
    magic: &[u8; 8],
    versions: &[u8],
) -> Result<Option<(u8, Vec<u8>)>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StoreError::io_at("read a metadata file", path, source)),
    };
    let (body, total) = split_frame_limited(&bytes, usize::MAX)
        .map_err(|e| corrupt(path, format!("frame: {e}")))?;
    if total != bytes.len() {
        return Err(corrupt(path, "trailing bytes after the frame"));
    }
    if body.len() < 9 || &body[..8] != magic {
        return Err(corrupt(path, "wrong magic"));
    }
    if !versions.contains(&body[8]) {
        return Err(corrupt(path, format!("unknown version {}", body[8])));
    }
    Ok(Some((body[8], body[9..].to_vec())))
}

fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn read_blob(r: &mut Reader<'_>) -> std::result::Result<Bytes, &'static str> {
    let len = r.u64().map_err(|_| "blob length")? as usize;
    if len > BLOB_BYTES_MAX {
        return Err("blob too long");
    }
    Ok(Bytes::copy_from_slice(r.take(len).map_err(|_| "blob")?))
}

impl MetaFile {
    /// The meta file, and the metadata entries a format-1 file held (`None` for format 2,
    /// whose entries live in the checkpoint and the WAL).
    pub fn read(path: &Path) -> Result<(MetaFile, Option<MetaEntries>)> {
        let versions = [FILE_VERSION, META_VERSION];
        let Some((version, body)) = read_framed_versions(path, META_MAGIC, &versions)? else {
            return Ok((MetaFile::default(), None));
        };
        Self::decode(&body, version).map_err(|detail| corrupt(path, detail))
    }

    fn decode(
        body: &[u8],
        version: u8,
    ) -> std::result::Result<(MetaFile, Option<MetaEntries>), &'static str> {
        let mut r = Reader { bytes: body };
        let mut meta = MetaFile {
            next_queue_uid: r.u64().map_err(|_| "uid")?,
            ..MetaFile::default()
        };
        let queues = r.u64().map_err(|_| "queue count")?;
        for _ in 0..queues {
            let name = r.string(NAME_BYTES_MAX).map_err(|_| "queue name")?;
            let name = QueueName::new(name).map_err(|_| "invalid queue name")?;
            let uid = r.u64().map_err(|_| "queue uid")?;
            let config = read_blob(&mut r)?;
            meta.queues.insert(name, (uid, config));
        }
        let entries = if version == FILE_VERSION {
            Some(read_meta_entries(&mut r)?)
        } else {
            None
        };
        if !r.bytes.is_empty() {
            return Err("trailing bytes");
        }
        Ok((meta, entries))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let mut out = Vec::new();
        out.extend_from_slice(META_MAGIC);
        out.push(META_VERSION);
        put_u64(&mut out, self.next_queue_uid);
        put_u64(&mut out, self.queues.len() as u64);
        for (name, (uid, config)) in &self.queues {
            put_str(&mut out, name.as_str());
            put_u64(&mut out, *uid);
            put_blob(&mut out, config);
        }
        write_atomic(path, &out)
    }
}

/// `[count: u64]` then `(namespace: str, key: str, value: u64 length + bytes)` per entry: the
/// metadata section of a checkpoint (format 3) and of a format-1 meta file.
pub fn encode_meta_entries(entries: &MetaEntries) -> Vec<u8> {
    let bytes: usize = entries
        .iter()
        .map(|((ns, key), value)| 16 + ns.len() + key.len() + value.len())
        .sum();
    let mut out = Vec::with_capacity(8 + bytes);
    put_u64(&mut out, entries.len() as u64);
    for ((namespace, key), value) in entries {
        put_str(&mut out, namespace);
        put_str(&mut out, key);
        put_blob(&mut out, value);
    }
    out
}

fn read_meta_entries(r: &mut Reader<'_>) -> std::result::Result<MetaEntries, &'static str> {
    let count = r.u64().map_err(|_| "entry count")?;
    let mut entries = MetaEntries::new();
    for _ in 0..count {
        let namespace = r.string(NAME_BYTES_MAX).map_err(|_| "namespace")?;
        let key = r.string(NAME_BYTES_MAX).map_err(|_| "key")?;
        let value = read_blob(r)?;
        entries.insert((namespace, key), value);
    }
    Ok(entries)
}

fn task_id_field(r: &mut Reader<'_>) -> std::result::Result<TaskId, &'static str> {
    let high = r.u64().map_err(|_| "truncated checkpoint")?;
    let low = r.u64().map_err(|_| "truncated checkpoint")?;
    Ok(TaskId(((high as u128) << 64) | low as u128))
}

impl Checkpoint {
    pub fn read(path: &Path) -> Result<Option<Checkpoint>> {
        let versions = [
            FILE_VERSION,
            CHECKPOINT_VERSION_HASHED_KEYS,
            CHECKPOINT_VERSION_META,
            CHECKPOINT_VERSION_SUBS,
            CHECKPOINT_VERSION_POINTS,
            CHECKPOINT_VERSION,
        ];
        let Some((version, body)) = read_framed_versions(path, CHECKPOINT_MAGIC, &versions)? else {
            return Ok(None);
        };
        Self::decode(&body, version)
            .map(Some)
            .map_err(|detail| corrupt(path, detail))
    }

    fn decode(body: &[u8], version: u8) -> std::result::Result<Checkpoint, &'static str> {
        let mut r = Reader { bytes: body };
        let u64_field = |r: &mut Reader<'_>| r.u64().map_err(|_| "truncated checkpoint");
        let mut checkpoint = Checkpoint {
            next_seq: u64_field(&mut r)?,
            next_lease: u64_field(&mut r)?,
            last_now_ms: u64_field(&mut r)?,
            wal_start: u64_field(&mut r)?,
            ..Checkpoint::default()
        };
        let buckets = u64_field(&mut r)?;
        for _ in 0..buckets {
            checkpoint.buckets.push(CheckpointBucket {
                queue_uid: u64_field(&mut r)?,
                key: u64_field(&mut r)?,
                file_len: u64_field(&mut r)?,
                meta: BucketMeta {
                    scheduled: u64_field(&mut r)?,
                    min_due_ms: u64_field(&mut r)?,
                    max_due_ms: u64_field(&mut r)?,
                    leased: u64_field(&mut r)?,
                    min_until_ms: u64_field(&mut r)?,
                    dead: u64_field(&mut r)?,
                    min_due_count: 0,
                    max_due_count: 0,
                },
            });
            if version >= CHECKPOINT_VERSION_POINTS {
                let meta = &mut checkpoint.buckets.last_mut().expect("just pushed").meta;
                meta.min_due_count = u64_field(&mut r)?;
                meta.max_due_count = u64_field(&mut r)?;
            }
        }
        if version >= CHECKPOINT_VERSION_HASHED_KEYS {
            checkpoint.key_secret = Some((u64_field(&mut r)?, u64_field(&mut r)?));
            // Chunks of `(uid, hash, id)`, each after its count; a count of 0 ends them.
            loop {
                let count = u64_field(&mut r)?;
                if count == 0 {
                    break;
                }
                for _ in 0..count {
                    let uid = u64_field(&mut r)?;
                    let hash = u64_field(&mut r)?;
                    let id = task_id_field(&mut r)?;
                    checkpoint.keys.push((uid, hash, id));
                }
            }
        } else {
            let keys = u64_field(&mut r)?;
            for _ in 0..keys {
                let uid = u64_field(&mut r)?;
                let key = r.string(NAME_BYTES_MAX).map_err(|_| "key")?;
                let id = task_id_field(&mut r)?;
                checkpoint.legacy_keys.push((uid, key, id));
            }
        }
        if version >= CHECKPOINT_VERSION_META {
            checkpoint.meta_entries = Some(read_meta_entries(&mut r)?);
        }
        if version >= CHECKPOINT_VERSION_SUBS {
            checkpoint.subs = Some(read_subs(&mut r)?);
        }
        if version >= CHECKPOINT_VERSION_POINTS {
            checkpoint.points = read_points(&mut r, &checkpoint.buckets)?;
        }
        if version >= CHECKPOINT_VERSION {
            checkpoint.key_runs = Some(read_key_runs(&mut r)?);
        }
        if !r.bytes.is_empty() {
            return Err("trailing bytes");
        }
        Ok(checkpoint)
    }

    /// Writes the checkpoint with the keys in `self.keys` and the entries in
    /// `self.meta_entries` (none if `None`).
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut writer = FramedWriter::create(path)?;
        writer.write(&self.encode_head())?;
        let mut chunk = Vec::new();
        encode_key_chunk(&mut chunk, &self.keys);
        writer.write(&chunk)?;
        writer.write(&KEY_CHUNKS_END)?;
        let entries = self.meta_entries.clone().unwrap_or_default();
        writer.write(&encode_meta_entries(&entries))?;
        writer.write(&encode_subs(&self.subs.clone().unwrap_or_default()))?;
        let mut points = PointsSection::default();
        for (uid, key, index) in &self.points {
            points.add(*uid, *key, index);
        }
        writer.write(&points.finish())?;
        writer.write(&encode_key_runs(&self.key_runs.clone().unwrap_or_default()))?;
        writer.finish()
    }

    /// Everything before the idempotency keys, which follow as chunks (see
    /// [`encode_key_chunk`]) ended by [`KEY_CHUNKS_END`], and then the metadata entries
    /// ([`encode_meta_entries`]).
    pub fn encode_head(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.buckets.len() * 72);
        out.extend_from_slice(CHECKPOINT_MAGIC);
        out.push(CHECKPOINT_VERSION);
        for v in [
            self.next_seq,
            self.next_lease,
            self.last_now_ms,
            self.wal_start,
        ] {
            put_u64(&mut out, v);
        }
        put_u64(&mut out, self.buckets.len() as u64);
        for b in &self.buckets {
            let m = &b.meta;
            for v in [
                b.queue_uid,
                b.key,
                b.file_len,
                m.scheduled,
                m.min_due_ms,
                m.max_due_ms,
                m.leased,
                m.min_until_ms,
                m.dead,
                m.min_due_count,
                m.max_due_count,
            ] {
                put_u64(&mut out, v);
            }
        }
        // Format 2 always carries a secret; `Engine::open` sets one before any write.
        let (k0, k1) = self.key_secret.unwrap_or_default();
        put_u64(&mut out, k0);
        put_u64(&mut out, k1);
        out
    }
}

/// Ends the key chunks of a checkpoint (a chunk count of zero).
pub const KEY_CHUNKS_END: [u8; 8] = [0; 8];

/// Appends one chunk of idempotency keys `(uid, hash, id)` to `out` (nothing if empty: an
/// empty chunk would end the list).
pub fn encode_key_chunk(out: &mut Vec<u8>, keys: &[(u64, u64, TaskId)]) {
    if keys.is_empty() {
        return;
    }
    out.reserve(8 + keys.len() * 32);
    put_u64(out, keys.len() as u64);
    for (uid, hash, id) in keys {
        put_u64(out, *uid);
        put_u64(out, *hash);
        put_u64(out, (id.0 >> 64) as u64);
        put_u64(out, id.0 as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_keys_round_trip_as_hashes_with_their_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        let written = Checkpoint {
            next_seq: 9,
            wal_start: 3,
            key_secret: Some((11, 12)),
            keys: vec![(1, 0xfeed, TaskId(5 << 64 | 6))],
            ..Checkpoint::default()
        };
        written.write(&path).unwrap();
        let read = Checkpoint::read(&path).unwrap().unwrap();
        assert_eq!(read.key_secret, Some((11, 12)));
        assert_eq!(read.keys, written.keys);
        assert!(read.legacy_keys.is_empty());
        assert_eq!((read.next_seq, read.wal_start), (9, 3));
        assert_eq!(read.meta_entries, Some(MetaEntries::new()));
    }

    #[test]
    fn checkpoint_meta_entries_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        let mut entries = MetaEntries::new();
        entries.insert(("s".into(), "k".into()), Bytes::from_static(b"v"));
        let written = Checkpoint {
            key_secret: Some((1, 2)),
            meta_entries: Some(entries.clone()),
            ..Checkpoint::default()
        };
        written.write(&path).unwrap();
        assert_eq!(
            Checkpoint::read(&path).unwrap().unwrap().meta_entries,
            Some(entries)
        );
    }

    #[test]
    fn a_format_1_meta_file_is_read_with_its_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        let mut entries = MetaEntries::new();
        entries.insert(("s".into(), "k".into()), Bytes::from_static(b"v"));
        let mut body = Vec::new();
        body.extend_from_slice(META_MAGIC);
        body.push(1);
        put_u64(&mut body, 3); // next queue uid
        put_u64(&mut body, 0); // no queues
        body.extend_from_slice(&encode_meta_entries(&entries));
        write_atomic(&path, &body).unwrap();
        let (meta, read) = MetaFile::read(&path).unwrap();
        assert_eq!(meta.next_queue_uid, 3);
        assert_eq!(read, Some(entries));
        // Rewritten, it is format 2: queues only.
        meta.write(&path).unwrap();
        let (meta, read) = MetaFile::read(&path).unwrap();
        assert_eq!((meta.next_queue_uid, read), (3, None));
    }

    #[test]
    fn a_format_1_checkpoint_is_read_with_its_full_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        let mut body = Vec::new();
        body.extend_from_slice(CHECKPOINT_MAGIC);
        body.push(1);
        for v in [9, 4, 1_700_000_000_000, 3, 0] {
            put_u64(&mut body, v); // counters, wal_start, no buckets
        }
        put_u64(&mut body, 1);
        put_u64(&mut body, 7); // queue uid
        put_str(&mut body, "order-42");
        put_u64(&mut body, 5);
        put_u64(&mut body, 6);
        write_atomic(&path, &body).unwrap();
        let read = Checkpoint::read(&path).unwrap().unwrap();
        assert_eq!(read.key_secret, None);
        assert!(read.keys.is_empty());
        assert_eq!(
            read.legacy_keys,
            vec![(7, "order-42".to_string(), TaskId(5 << 64 | 6))]
        );
    }
}
