//! Where the log ends in a WAL file at open, and whether what lies there is the engine's own
//! (zeros prepared ahead, a frame torn by a crash) or damage to acknowledged frames.
//!
//! Only the engine's own leftovers may be dropped: a crash leaves at most the zeros the
//! prefiller prepared ([`PREPARED_ZEROS_MAX`]) and one torn frame, the last thing written.
//! Anything else at the end of a file (a longer run of zeros, a "torn" frame that is really a
//! whole frame with a damaged length field, with more frames after it) may hide acknowledged
//! changes, so the open is refused with `Corrupt`, naming the file, the offset and what the
//! operator can do, rather than cut silently.

use std::path::Path;

use super::prefill::PREPARED_ZEROS_MAX;
use super::record::{self, DecodeError, FRAME_HEADER_BYTES};
use crate::store::{Result, StoreError};

/// Whether a bad frame at the end of the log (the last non-empty WAL file) looks like a torn
/// write rather than damage: it runs past the end of the file, or only zeros follow the end
/// its header declares (it is the file's last frame, or space prepared ahead follows it, or a
/// write cut short inside its header left a shorter declared length with zeros after it).
/// [`check_torn`] then looks for signs that it is damage after all.
pub(super) fn is_torn_tail(rest: &[u8], error: &DecodeError) -> bool {
    if matches!(error, DecodeError::Truncated { .. }) {
        return true;
    }
    if rest.iter().all(|b| *b == 0) {
        return true;
    }
    if rest.len() >= FRAME_HEADER_BYTES {
        let end = FRAME_HEADER_BYTES.saturating_add(declared_len(rest));
        return rest
            .get(end..)
            .is_some_and(|after| after.iter().all(|b| *b == 0));
    }
    false
}

fn declared_len(frame: &[u8]) -> usize {
    u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize
}

/// The log of the WAL file at `path` ends at `offset` of its `bytes` (a frame header of
/// zeros there): only zeros may follow, and no more of them than the prefiller prepares.
/// Frames are written in order with no gap, so a byte after the zeros is damage; and a
/// longer run of zeros than any prepared is frames zeroed on disk (a failing disk, an
/// unwritten extent), whose acknowledged changes would otherwise vanish without a word.
pub(super) fn check_log_end(path: &Path, bytes: &[u8], offset: usize) -> Result<()> {
    if let Some(at) = bytes[offset..].iter().position(|b| *b != 0) {
        return Err(corrupt(
            path,
            offset + at,
            format!("bytes written after the end of the log (zeros from offset {offset})"),
        ));
    }
    check_zero_run(path, offset, bytes.len() - offset, offset)
}

/// A run of `zeros` zero bytes from `offset` to the end of the file at `path`, after the
/// log: refused if the prefiller cannot have left it. `cut_at`: where the log's valid part
/// ends, for the operator's way out.
fn check_zero_run(path: &Path, offset: usize, zeros: usize, cut_at: usize) -> Result<()> {
    if zeros as u64 <= PREPARED_ZEROS_MAX {
        return Ok(());
    }
    Err(corrupt(
        path,
        offset,
        format!(
            "{zeros} bytes of zeros from here to the end of the file, more than the engine \
             prepares ahead of its log ({PREPARED_ZEROS_MAX} at most): frames written there \
             were zeroed on disk, and the acknowledged changes in them are lost. {}",
            what_to_do(path, cut_at)
        ),
    ))
}

/// Refuses a bad frame that [`is_torn_tail`] let through if it shows signs of damage rather
/// than of a write cut short by a crash: more zeros after its declared end than the
/// prefiller prepares, or (its length field damaged) a whole frame hidden behind the length
/// it declares ([`whole_frame_inside`]). `rest`: the file's bytes from the frame (at
/// `offset`) on.
pub(super) fn check_torn(path: &Path, rest: &[u8], offset: usize) -> Result<()> {
    if rest.len() >= FRAME_HEADER_BYTES {
        let end = FRAME_HEADER_BYTES.saturating_add(declared_len(rest));
        if end <= rest.len() {
            check_zero_run(path, offset + end, rest.len() - end, offset)?;
        }
    }
    match whole_frame_inside(rest) {
        None => Ok(()),
        Some(found) => Err(corrupt(
            path,
            offset,
            format!(
                "the frame here declares {} bytes, but {found}: its length field is \
                 damaged (a torn write leaves no whole frame behind it), and the frames \
                 after it may hold acknowledged changes. {}",
                declared_len(rest),
                what_to_do(path, offset)
            ),
        )),
    }
}

/// Signs that the bad frame at the front of `rest` is whole, with a damaged length field,
/// rather than cut short by a crash: its records are walked one by one (each one's own
/// checksum checked, whatever length the frame declares), and at each record boundary
/// - the frame's checksum matching the records so far means the frame ends there;
/// - a valid, non-empty frame starting there means a later frame was written after it.
///
/// A torn frame shows neither: its checksum covers records never written, and nothing was
/// written after it. Only record boundaries are tried, never positions inside a record, so a
/// task's payload that happens to hold the bytes of a frame is never taken for one. Costs one
/// pass over the records.
fn whole_frame_inside(rest: &[u8]) -> Option<String> {
    if rest.len() < FRAME_HEADER_BYTES {
        return None;
    }
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    let mut body = crc32fast::Hasher::new();
    let mut at = FRAME_HEADER_BYTES;
    loop {
        if at > FRAME_HEADER_BYTES {
            let records = at - FRAME_HEADER_BYTES;
            if body.clone().finalize() == crc {
                return Some(format!("its checksum matches its first {records} bytes"));
            }
            if let Ok((entries, _)) = record::decode_wal(&rest[at..]) {
                if !entries.is_empty() {
                    return Some(format!("a whole frame follows its first {records} bytes"));
                }
            }
        }
        let (_, len) = record::decode_wal_entry(&rest[at..]).ok()?;
        body.update(&rest[at..at + len]);
        at += len;
    }
}

/// The operator's choices, for a damaged WAL file: a backup, or cutting the file by hand to
/// keep what comes before the damage.
fn what_to_do(path: &Path, cut_at: usize) -> String {
    format!(
        "Restore the data directory from a backup; or, to start with what comes before the \
         damage and lose every change written after it, cut the file at offset {cut_at} \
         (`truncate -s {cut_at} {}`) and start belfry again",
        path.display()
    )
}

fn corrupt(path: &Path, offset: usize, detail: String) -> StoreError {
    StoreError::Corrupt {
        location: format!("{} at offset {offset}", path.display()),
        detail,
    }
}
