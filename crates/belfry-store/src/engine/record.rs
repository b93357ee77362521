//! Records and their framing.
//!
//! Every record on disk is a frame: `[body_len: u32 LE][crc32(body): u32 LE][body]`. A bucket
//! body is `[version][kind][fields]`; a WAL body is `[queue uid: u64][bucket key: u64]` followed
//! by one whole bucket frame, so replay copies the inner frame into its bucket file verbatim.
//! All integers are little-endian. Decoding never panics and never allocates more than the
//! frame's declared (and bounded) length.

use belfry_core::limits::{HEADERS_MAX, HEADER_NAME_LEN_MAX, HEADER_VALUE_LEN_MAX, TARGET_LEN_MAX};
use belfry_core::{Header, LatePolicy, PayloadKind, Priority, UnixMs};
use bytes::Bytes;

use crate::store::MetaChange;

/// Format version written in every bucket record; a reader refuses versions it does not know.
pub const RECORD_VERSION: u8 = 1;

/// Bytes of the frame header: body length and CRC.
pub const FRAME_HEADER_BYTES: usize = 8;

/// Largest frame body accepted. Payloads are limited to 1 MiB by default; this bound is far
/// above any valid record and keeps a corrupt length field from causing a huge allocation.
pub const FRAME_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Longest dead-letter reason stored; longer reasons are cut (they are for humans).
pub const DEAD_REASON_BYTES_MAX: usize = 4096;

const KIND_PUT: u8 = 1;
const KIND_CANCEL: u8 = 2;
const KIND_RESCHEDULE: u8 = 3;
const KIND_LEASE: u8 = 4;
const KIND_DONE: u8 = 5;
const KIND_NACK: u8 = 6;
const KIND_EXTEND: u8 = 7;
const KIND_DEAD: u8 = 8;
const KIND_REDRIVE: u8 = 9;
/// A metadata record (WAL only, see [`encode_meta`]): never in a bucket file.
const KIND_META: u8 = 10;
const KIND_SKIPPED: u8 = 11;
// Kind 12 is the subscriber-set record (`subs/record.rs`).
const KIND_DEAD_UNTRIED: u8 = 13;

/// Bits of a put record's optional-strings byte: an idempotency key follows, then a target.
const PUT_HAS_KEY: u8 = 1;
const PUT_HAS_TARGET: u8 = 2;

/// A new task as stored in its bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRecord {
    pub seq: u64,
    pub due_at_ms: UnixMs,
    pub priority: Priority,
    pub payload_kind: PayloadKind,
    pub late_policy: LatePolicy,
    pub idempotency_key: Option<String>,
    /// The task's own delivery target (`NewTask::target`).
    pub target: Option<String>,
    pub headers: Vec<Header>,
    pub payload: Bytes,
}

/// One record of a bucket file. Every state change carries the resulting state in full (not a
/// delta), so applying a record twice gives the same result as applying it once: replay after
/// a crash may re-append records a bucket file already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Put(PutRecord),
    /// Scheduled → Cancelled.
    Cancel {
        seq: u64,
    },
    /// Scheduled, with a new due time.
    Reschedule {
        seq: u64,
        due_at_ms: UnixMs,
    },
    /// Leased under `lease_id` until `until_ms`, after `attempts` deliveries started.
    Lease {
        seq: u64,
        lease_id: u64,
        until_ms: UnixMs,
        attempts: u32,
    },
    /// Finished: acked (or, before kind 11 existed, skipped by its late policy).
    Done {
        seq: u64,
    },
    /// Finished without delivery: found later than its late policy allows.
    Skipped {
        seq: u64,
    },
    /// Scheduled again after a failed attempt.
    Nack {
        seq: u64,
        due_at_ms: UnixMs,
    },
    /// Lease deadline moved.
    Extend {
        seq: u64,
        lease_id: u64,
        until_ms: UnixMs,
    },
    /// Dead letter. `attempts`, when given, replaces the task's count: the lease it ends was
    /// never tried (the claim that took the task found it out of attempts), so that claim's
    /// attempt is taken back. The record carries the resulting count, not a delta, so that
    /// replaying it twice is harmless.
    Dead {
        seq: u64,
        reason: String,
        attempts: Option<u32>,
    },
    /// Scheduled again from the dead letters, attempts reset.
    Redrive {
        seq: u64,
        due_at_ms: UnixMs,
    },
}

impl Record {
    pub fn seq(&self) -> u64 {
        match self {
            Record::Put(put) => put.seq,
            Record::Cancel { seq }
            | Record::Reschedule { seq, .. }
            | Record::Lease { seq, .. }
            | Record::Done { seq }
            | Record::Skipped { seq }
            | Record::Nack { seq, .. }
            | Record::Extend { seq, .. }
            | Record::Dead { seq, .. }
            | Record::Redrive { seq, .. } => *seq,
        }
    }
}

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes end before the frame does: a torn write at the tail of a file.
    #[error("truncated frame: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("frame length {0} exceeds the limit")]
    TooLong(usize),
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed record: {0}")]
    Malformed(&'static str),
    #[error("unknown record version {0}")]
    Version(u8),
    #[error("unknown record kind {0}")]
    Kind(u8),
}

/// Splits the first frame off `bytes`: returns its body and the frame's total length.
pub fn split_frame(bytes: &[u8]) -> Result<(&[u8], usize), DecodeError> {
    split_frame_limited(bytes, FRAME_BODY_BYTES_MAX)
}

/// [`split_frame`] with an explicit body limit. Nothing is allocated: the body is a slice of
/// `bytes`, so a corrupt length can only make the frame look truncated or too long.
pub fn split_frame_limited(bytes: &[u8], max: usize) -> Result<(&[u8], usize), DecodeError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(DecodeError::Truncated {
            needed: FRAME_HEADER_BYTES,
            available: bytes.len(),
        });
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len > max {
        return Err(DecodeError::TooLong(len));
    }
    let total = FRAME_HEADER_BYTES + len;
    if bytes.len() < total {
        return Err(DecodeError::Truncated {
            needed: total,
            available: bytes.len(),
        });
    }
    let body = &bytes[FRAME_HEADER_BYTES..total];
    if crc32fast::hash(body) != crc {
        return Err(DecodeError::Checksum);
    }
    Ok((body, total))
}

/// Whether a WAL file's log ends where `rest` starts: it starts with a frame header of zeros
/// (or is shorter than one and all zeros), space prepared ahead and never written. A written
/// frame's header never is: its body holds at least one record, so its length is not zero.
pub fn is_log_end(rest: &[u8]) -> bool {
    rest.iter().take(FRAME_HEADER_BYTES).all(|b| *b == 0)
}

/// Where the log ends in one WAL file's `bytes`: after the last whole frame before
/// [`is_log_end`] or the end of the file. Frames are not checked; for tools and tests that
/// cut or damage a log where it ends.
pub fn wal_log_len(bytes: &[u8]) -> usize {
    let mut end = 0;
    while !is_log_end(&bytes[end..]) {
        let header = &bytes[end..];
        if header.len() < FRAME_HEADER_BYTES {
            break;
        }
        let declared = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let next = end + FRAME_HEADER_BYTES + declared;
        if next > bytes.len() {
            break;
        }
        end = next;
    }
    end
}

/// Appends `body` to `out` as one frame.
pub fn write_frame(out: &mut Vec<u8>, body: &[u8]) {
    write_frame_header(out, body);
    out.extend_from_slice(body);
}

/// Appends the header of `body`'s frame (length and CRC) to `out`; the body follows it.
pub fn write_frame_header(out: &mut Vec<u8>, body: &[u8]) {
    debug_assert!(body.len() <= FRAME_BODY_BYTES_MAX);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
}

/// Decodes the first bucket frame of `bytes`: the record and the frame's total length.
/// This is the decoder the fuzz target exercises.
pub fn decode(bytes: &[u8]) -> Result<(Record, usize), DecodeError> {
    let (body, total) = split_frame(bytes)?;
    let record = decode_body(body, Keep::Full)?;
    Ok((record, total))
}

/// What a decode keeps of a put record's payload and headers.
#[derive(Clone, Copy)]
enum Keep<'a> {
    /// Everything, the payload copied into its own buffer.
    Full,
    /// Everything, the payload a shared slice of this buffer (which holds the frame).
    Shared(&'a Bytes),
    /// Neither payload nor headers (both are checked, then left on disk): what a bucket
    /// load keeps in memory.
    Light,
}

/// [`decode`] for a bucket load: a put record comes back without its payload and headers,
/// so decoding a large bucket allocates neither.
pub fn decode_light(bytes: &[u8]) -> Result<(Record, usize), DecodeError> {
    let (body, total) = split_frame(bytes)?;
    let record = decode_body(body, Keep::Light)?;
    Ok((record, total))
}

/// Decodes the first frame of `frame`, which must be a put record, with its payload a
/// slice of `frame`'s buffer rather than a copy: reads of many tasks share one buffer.
pub fn decode_put_shared(frame: &Bytes) -> Result<PutRecord, DecodeError> {
    let (body, _) = split_frame(frame)?;
    match decode_body(body, Keep::Shared(frame))? {
        Record::Put(put) => Ok(put),
        _ => Err(DecodeError::Malformed("expected a put record")),
    }
}

/// A WAL entry: which bucket of which queue incarnation a bucket frame belongs to, or (queue
/// uid [`META_TARGET_UID`], bucket 0) a metadata record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalTarget {
    pub queue_uid: u64,
    pub bucket: u64,
}

/// Builds one WAL frame: the records of one store call (or of one chunk of a claim or an
/// ack batch, `calls::LOCK_CHUNK_RECORDS`), committed all or none. The body is a
/// sequence of `[queue uid: u64][bucket key: u64][bucket frame]`; the outer checksum makes
/// the whole call's records survive a crash together or not at all.
#[derive(Debug, Default)]
pub struct WalBatch {
    bytes: Vec<u8>,
}

impl WalBatch {
    pub fn new() -> Self {
        WalBatch::with_capacity(0)
    }

    /// A batch with room for about `bytes` of records, so a large call's frame is built
    /// without regrowing (and recopying) its buffer.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut buffer = Vec::with_capacity(FRAME_HEADER_BYTES + bytes);
        buffer.resize(FRAME_HEADER_BYTES, 0);
        WalBatch { bytes: buffer }
    }

    /// Adds one record; returns the offset of its bucket frame inside the batch, which is
    /// where a caller copies it from into the bucket file.
    pub fn push(&mut self, target: WalTarget, record: &Record) -> std::ops::Range<usize> {
        self.bytes
            .extend_from_slice(&target.queue_uid.to_le_bytes());
        self.bytes.extend_from_slice(&target.bucket.to_le_bytes());
        let start = self.bytes.len();
        encode(&mut self.bytes, record);
        start..self.bytes.len()
    }

    /// Adds one metadata record holding `changes` (checked by [`check_meta`]), under the
    /// target [`META_TARGET_UID`].
    pub fn push_meta(&mut self, changes: &[MetaChange]) {
        self.bytes.extend_from_slice(&META_TARGET_UID.to_le_bytes());
        self.bytes.extend_from_slice(&0u64.to_le_bytes());
        encode_meta(&mut self.bytes, changes);
    }

    /// Adds one subscription record (kind 12), written by `encode`, under the target
    /// `SUBS_TARGET_UID`.
    pub(crate) fn push_subs(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        self.bytes
            .extend_from_slice(&super::subs::record::SUBS_TARGET_UID.to_le_bytes());
        self.bytes.extend_from_slice(&0u64.to_le_bytes());
        encode(&mut self.bytes);
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.len() == FRAME_HEADER_BYTES
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Seals the frame header and returns the frame's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        let body_len = (self.bytes.len() - FRAME_HEADER_BYTES) as u32;
        let crc = crc32fast::hash(&self.bytes[FRAME_HEADER_BYTES..]);
        self.bytes[..4].copy_from_slice(&body_len.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        self.bytes
    }
}

/// The entries of one WAL frame: target and inner bucket frame.
pub type WalEntries<'a> = Vec<(WalTarget, &'a [u8])>;

/// Decodes the first WAL frame of `bytes`: its entries (target and inner bucket frame, each
/// inner frame checked) and the frame's total length.
pub fn decode_wal(bytes: &[u8]) -> Result<(WalEntries<'_>, usize), DecodeError> {
    let (body, total) = split_frame_limited(bytes, WAL_FRAME_BODY_BYTES_MAX)?;
    let mut entries = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (target, len) = decode_wal_entry(rest).map_err(|e| match e {
            DecodeError::Truncated { .. } => DecodeError::Malformed("inner frame truncated"),
            other => other,
        })?;
        entries.push((target, &rest[WAL_TARGET_BYTES..len]));
        rest = &rest[len..];
    }
    Ok((entries, total))
}

/// Bytes of a WAL entry's target (queue uid and bucket key), before its inner frame.
pub const WAL_TARGET_BYTES: usize = 16;

/// Decodes the WAL entry at the front of `bytes` (one entry of a WAL frame's body, not a
/// frame): its target and its length, target included. The inner frame is checked (its
/// checksum and its record), so a run of entries that decode is records the engine wrote.
pub fn decode_wal_entry(bytes: &[u8]) -> Result<(WalTarget, usize), DecodeError> {
    let mut reader = Reader { bytes };
    let queue_uid = reader.u64()?;
    let bucket = reader.u64()?;
    let inner = reader.bytes;
    let inner_len = if queue_uid == META_TARGET_UID {
        decode_meta(inner).map(|(_, len)| len)
    } else if queue_uid == super::subs::record::SUBS_TARGET_UID {
        super::subs::record::decode(inner).map(|(_, len)| len)
    } else {
        decode_light(inner).map(|(_, len)| len)
    }?;
    Ok((
        WalTarget { queue_uid, bucket },
        WAL_TARGET_BYTES + inner_len,
    ))
}

/// Largest WAL frame body: one store call's records. A batch of 1,000 tasks of 1 MiB fits.
pub const WAL_FRAME_BODY_BYTES_MAX: usize = u32::MAX as usize;

/// Checks that a task fits the record format's limits, so that everything written can be
/// read back. The API enforces tighter limits; this guards the disk format itself.
pub fn check_put(put: &PutRecord) -> Result<(), String> {
    if put.headers.len() > HEADERS_MAX {
        return Err(format!("more than {HEADERS_MAX} headers"));
    }
    for (name, value) in &put.headers {
        if name.len() > HEADER_NAME_LEN_MAX || value.len() > HEADER_VALUE_LEN_MAX {
            return Err(format!(
                "a header name is limited to {HEADER_NAME_LEN_MAX} bytes and a value to {HEADER_VALUE_LEN_MAX}"
            ));
        }
    }
    if put
        .idempotency_key
        .as_ref()
        .is_some_and(|k| k.len() > KEY_BYTES_MAX)
    {
        return Err(format!("idempotency key longer than {KEY_BYTES_MAX} bytes"));
    }
    if put
        .target
        .as_ref()
        .is_some_and(|t| t.len() > TARGET_LEN_MAX)
    {
        return Err(format!("target longer than {TARGET_LEN_MAX} bytes"));
    }
    // Header bytes plus payload must fit one frame, with room for the fixed fields.
    let header_bytes: usize = put.headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum();
    let key_bytes = put.idempotency_key.as_ref().map_or(0, |k| k.len() + 4);
    let target_bytes = put.target.as_ref().map_or(0, |t| t.len() + 4);
    if put.payload.len() + header_bytes + key_bytes + target_bytes + PUT_FIXED_BYTES
        > FRAME_BODY_BYTES_MAX
    {
        return Err(format!(
            "task larger than the {FRAME_BODY_BYTES_MAX}-byte record limit"
        ));
    }
    Ok(())
}

/// Bytes of a put record besides strings and payload (generous).
const PUT_FIXED_BYTES: usize = 64;

/// About how many bytes a put of this task adds to a WAL frame (WAL target, framing, fields,
/// strings, payload): enough to size the frame's buffer once.
pub fn put_size_hint(task: &belfry_core::NewTask) -> usize {
    let strings: usize = task
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + 8)
        .sum();
    let optional = [task.idempotency_key.as_deref(), task.target.as_deref()]
        .iter()
        .flatten()
        .map(|text| text.len() + 4)
        .sum::<usize>();
    16 + FRAME_HEADER_BYTES + PUT_FIXED_BYTES + task.payload.len() + strings + optional
}

/// Cuts a dead-letter reason to what a record stores, on a character boundary.
pub fn cut_reason(reason: &str) -> &str {
    let mut cut = reason.len().min(DEAD_REASON_BYTES_MAX);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    &reason[..cut]
}

/// Appends `record` to `out` as one bucket frame.
pub fn encode(out: &mut Vec<u8>, record: &Record) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(RECORD_VERSION);
    match record {
        Record::Put(put) => encode_put(out, put),
        Record::Cancel { seq } => {
            out.push(KIND_CANCEL);
            put_u64(out, *seq);
        }
        Record::Reschedule { seq, due_at_ms } => {
            out.push(KIND_RESCHEDULE);
            put_u64(out, *seq);
            put_u64(out, *due_at_ms);
        }
        Record::Lease {
            seq,
            lease_id,
            until_ms,
            attempts,
        } => {
            out.push(KIND_LEASE);
            put_u64(out, *seq);
            put_u64(out, *lease_id);
            put_u64(out, *until_ms);
            out.extend_from_slice(&attempts.to_le_bytes());
        }
        Record::Done { seq } => {
            out.push(KIND_DONE);
            put_u64(out, *seq);
        }
        Record::Skipped { seq } => {
            out.push(KIND_SKIPPED);
            put_u64(out, *seq);
        }
        Record::Nack { seq, due_at_ms } => {
            out.push(KIND_NACK);
            put_u64(out, *seq);
            put_u64(out, *due_at_ms);
        }
        Record::Extend {
            seq,
            lease_id,
            until_ms,
        } => {
            out.push(KIND_EXTEND);
            put_u64(out, *seq);
            put_u64(out, *lease_id);
            put_u64(out, *until_ms);
        }
        Record::Dead {
            seq,
            reason,
            attempts,
        } => {
            out.push(if attempts.is_some() {
                KIND_DEAD_UNTRIED
            } else {
                KIND_DEAD
            });
            put_u64(out, *seq);
            if let Some(attempts) = attempts {
                out.extend_from_slice(&attempts.to_le_bytes());
            }
            put_str(out, cut_reason(reason));
        }
        Record::Redrive { seq, due_at_ms } => {
            out.push(KIND_REDRIVE);
            put_u64(out, *seq);
            put_u64(out, *due_at_ms);
        }
    }
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The body of a put frame, after the version byte.
fn encode_put(out: &mut Vec<u8>, put: &PutRecord) {
    out.push(KIND_PUT);
    put_u64(out, put.seq);
    put_u64(out, put.due_at_ms);
    out.push(match put.priority {
        Priority::High => 0,
        Priority::Normal => 1,
    });
    out.push(match put.payload_kind {
        PayloadKind::Json => 0,
        PayloadKind::Binary => 1,
    });
    let (tag, after) = match put.late_policy {
        LatePolicy::Fire => (0, 0),
        LatePolicy::Skip { after_ms } => (1, after_ms),
        LatePolicy::Dead { after_ms } => (2, after_ms),
    };
    out.push(tag);
    put_u64(out, after);
    // Which optional strings follow, in this order. Records written before targets existed
    // have only the key bit, so they read the same.
    let mut optional = 0;
    if put.idempotency_key.is_some() {
        optional |= PUT_HAS_KEY;
    }
    if put.target.is_some() {
        optional |= PUT_HAS_TARGET;
    }
    out.push(optional);
    for text in [&put.idempotency_key, &put.target].into_iter().flatten() {
        put_str(out, text);
    }
    out.extend_from_slice(&(put.headers.len() as u32).to_le_bytes());
    for (name, value) in &put.headers {
        put_str(out, name);
        put_str(out, value);
    }
    out.extend_from_slice(&(put.payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&put.payload);
}

/// The queue uid of a WAL entry that holds a metadata record rather than a bucket record.
/// Queue uids count up from 0 (`MetaFile::next_queue_uid`), so no queue ever has it.
pub const META_TARGET_UID: u64 = u64::MAX;

/// Longest metadata namespace or key a record may hold (the meta file's reader uses the same
/// bound).
pub const META_NAME_BYTES_MAX: usize = 64 * 1024;

/// Bytes a metadata change takes besides its strings and value: two string lengths and the
/// put/delete flag (a put adds the value's length, 4 bytes, and the value).
const META_CHANGE_FIXED_BYTES: usize = 4 + 4 + 1;

/// The bytes `changes` take as a metadata frame, to size a WAL frame once and to refuse a
/// batch that cannot fit a frame before anything is written.
pub fn meta_size_hint(changes: &[MetaChange]) -> usize {
    let body: usize = changes
        .iter()
        .map(|c| {
            META_CHANGE_FIXED_BYTES
                + c.namespace.len()
                + c.key.len()
                + c.value.as_ref().map_or(0, |v| 4 + v.len())
        })
        .sum();
    FRAME_HEADER_BYTES + 2 + 4 + body
}

/// Checks that `changes` fit the metadata record's limits, so that everything written can be
/// read back.
pub fn check_meta(changes: &[MetaChange]) -> Result<(), String> {
    for change in changes {
        if change.namespace.len() > META_NAME_BYTES_MAX || change.key.len() > META_NAME_BYTES_MAX {
            return Err(format!(
                "a metadata namespace or key is limited to {META_NAME_BYTES_MAX} bytes"
            ));
        }
    }
    if changes.len() > u32::MAX as usize
        || meta_size_hint(changes) - FRAME_HEADER_BYTES > FRAME_BODY_BYTES_MAX
    {
        return Err(format!(
            "metadata changes larger than the {FRAME_BODY_BYTES_MAX}-byte record limit"
        ));
    }
    Ok(())
}

/// Appends `changes` to `out` as one metadata frame: `[version][kind = 10][count: u32]`, then
/// per change `[namespace: str][key: str][flag: u8 (0 delete, 1 put)]` and, for a put,
/// `[value len: u32][value]`. The caller has checked them ([`check_meta`]).
pub fn encode_meta(out: &mut Vec<u8>, changes: &[MetaChange]) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(RECORD_VERSION);
    out.push(KIND_META);
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for change in changes {
        put_str(out, &change.namespace);
        put_str(out, &change.key);
        match &change.value {
            None => out.push(0),
            Some(value) => {
                out.push(1);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
        }
    }
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the first frame of `bytes` as a metadata record: its changes, in order, and the
/// frame's total length. Never allocates more than the frame holds.
pub fn decode_meta(bytes: &[u8]) -> Result<(Vec<MetaChange>, usize), DecodeError> {
    let (body, total) = split_frame(bytes)?;
    let mut r = Reader { bytes: body };
    let version = r.u8()?;
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = r.u8()?;
    if kind != KIND_META {
        return Err(DecodeError::Kind(kind));
    }
    let count = r.u32()? as usize;
    // Each change takes at least its fixed bytes, so a corrupt count cannot over-allocate.
    let mut changes = Vec::with_capacity(count.min(r.bytes.len() / META_CHANGE_FIXED_BYTES));
    for _ in 0..count {
        let namespace = r.string(META_NAME_BYTES_MAX)?;
        let key = r.string(META_NAME_BYTES_MAX)?;
        let value = match r.u8()? {
            0 => None,
            1 => {
                let len = r.u32()? as usize;
                Some(Bytes::copy_from_slice(r.take(len)?))
            }
            _ => return Err(DecodeError::Malformed("metadata flag")),
        };
        changes.push(MetaChange {
            namespace,
            key,
            value,
        });
    }
    if !r.bytes.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes in record"));
    }
    Ok((changes, total))
}

pub(crate) fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_str(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value.as_bytes());
}

pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Malformed(
                "field runs past the end of the record",
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(b);
        Ok(u64::from_le_bytes(array))
    }

    pub(crate) fn string(&mut self, max: usize) -> Result<String, DecodeError> {
        self.str(max).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the record.
    pub(crate) fn str(&mut self, max: usize) -> Result<&'a str, DecodeError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(DecodeError::Malformed("string longer than its limit"));
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::Malformed("string not UTF-8"))
    }
}

/// Longest idempotency key a record may hold (the API enforces a tighter limit).
pub const KEY_BYTES_MAX: usize = 64 * 1024;

/// A put frame's fields after its kind byte; `keep` says how much of the headers and the
/// payload to keep.
fn decode_put(r: &mut Reader<'_>, keep: Keep<'_>) -> Result<PutRecord, DecodeError> {
    let seq = r.u64()?;
    let due_at_ms = r.u64()?;
    let priority = match r.u8()? {
        0 => Priority::High,
        1 => Priority::Normal,
        _ => return Err(DecodeError::Malformed("priority")),
    };
    let payload_kind = match r.u8()? {
        0 => PayloadKind::Json,
        1 => PayloadKind::Binary,
        _ => return Err(DecodeError::Malformed("payload kind")),
    };
    let tag = r.u8()?;
    let after_ms = r.u64()?;
    let late_policy = match tag {
        0 if after_ms == 0 => LatePolicy::Fire,
        1 => LatePolicy::Skip { after_ms },
        2 => LatePolicy::Dead { after_ms },
        _ => return Err(DecodeError::Malformed("late policy")),
    };
    let optional = r.u8()?;
    if optional & !(PUT_HAS_KEY | PUT_HAS_TARGET) != 0 {
        return Err(DecodeError::Malformed("key flag"));
    }
    let idempotency_key = match optional & PUT_HAS_KEY {
        0 => None,
        _ => Some(r.string(KEY_BYTES_MAX)?),
    };
    let light = matches!(keep, Keep::Light);
    let target = match optional & PUT_HAS_TARGET {
        0 => None,
        // Checked, and left on disk by a bucket load like the headers.
        _ if light => r.str(TARGET_LEN_MAX).map(|_| None)?,
        _ => Some(r.string(TARGET_LEN_MAX)?),
    };
    let header_count = r.u32()? as usize;
    if header_count > HEADERS_MAX {
        return Err(DecodeError::Malformed("too many headers"));
    }
    let mut headers = Vec::with_capacity(if light { 0 } else { header_count });
    for _ in 0..header_count {
        let name = r.str(HEADER_NAME_LEN_MAX)?;
        let value = r.str(HEADER_VALUE_LEN_MAX)?;
        if !light {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    let payload_len = r.u32()? as usize;
    let payload = r.take(payload_len)?;
    let payload = match keep {
        Keep::Full => Bytes::copy_from_slice(payload),
        Keep::Shared(frame) => frame.slice_ref(payload),
        Keep::Light => Bytes::new(),
    };
    Ok(PutRecord {
        seq,
        due_at_ms,
        priority,
        payload_kind,
        late_policy,
        idempotency_key,
        target,
        headers,
        payload,
    })
}

fn decode_body(body: &[u8], keep: Keep<'_>) -> Result<Record, DecodeError> {
    let mut r = Reader { bytes: body };
    let version = r.u8()?;
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = r.u8()?;
    let record = match kind {
        KIND_PUT => Record::Put(decode_put(&mut r, keep)?),
        KIND_CANCEL => Record::Cancel { seq: r.u64()? },
        KIND_RESCHEDULE => Record::Reschedule {
            seq: r.u64()?,
            due_at_ms: r.u64()?,
        },
        KIND_LEASE => Record::Lease {
            seq: r.u64()?,
            lease_id: r.u64()?,
            until_ms: r.u64()?,
            attempts: r.u32()?,
        },
        KIND_DONE => Record::Done { seq: r.u64()? },
        KIND_SKIPPED => Record::Skipped { seq: r.u64()? },
        KIND_NACK => Record::Nack {
            seq: r.u64()?,
            due_at_ms: r.u64()?,
        },
        KIND_EXTEND => Record::Extend {
            seq: r.u64()?,
            lease_id: r.u64()?,
            until_ms: r.u64()?,
        },
        KIND_DEAD => Record::Dead {
            seq: r.u64()?,
            reason: r.string(DEAD_REASON_BYTES_MAX)?,
            attempts: None,
        },
        KIND_DEAD_UNTRIED => Record::Dead {
            seq: r.u64()?,
            attempts: Some(r.u32()?),
            reason: r.string(DEAD_REASON_BYTES_MAX)?,
        },
        KIND_REDRIVE => Record::Redrive {
            seq: r.u64()?,
            due_at_ms: r.u64()?,
        },
        other => return Err(DecodeError::Kind(other)),
    };
    if !r.bytes.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes in record"));
    }
    Ok(record)
}

#[cfg(test)]
#[path = "record_tests.rs"]
pub(crate) mod tests;
