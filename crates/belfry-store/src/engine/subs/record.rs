//! The WAL record of subscription changes (kind 12, WAL only, like kind 10).
//!
//! Inner frame body: `[version][kind = 12][op: u8][set: u64][epoch: u64][count: u32]`, then
//! per user `[key len: u8][user key]`. `op` is 1 (add: these users became members of the set
//! incarnation `epoch`), 2 (remove: they stopped being members) or 3 (drop: the set was
//! emptied; no users, epoch 0). A record holds only effective changes (users that were not,
//! or were, members), so replay applies it without reading anything. A call's records share
//! one WAL frame and survive a crash together or not at all.

use belfry_core::limits::USER_ID_LEN_MAX;

use crate::engine::record::{split_frame, DecodeError, Reader, FRAME_HEADER_BYTES, RECORD_VERSION};

pub(crate) const KIND_SUBS: u8 = 12;
/// The queue uid of a WAL entry holding a subscription record (queue uids count up from 0;
/// `u64::MAX` is the metadata target).
pub(crate) const SUBS_TARGET_UID: u64 = u64::MAX - 1;
/// Users per record: keeps a record far below the frame limit (129-byte keys: 13 MiB).
pub(crate) const USERS_PER_RECORD_MAX: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add = 1,
    Remove = 2,
    Drop = 3,
}

/// One decoded subscription record; user keys borrow the WAL bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SubsRecord<'a> {
    pub(crate) op: Op,
    pub(crate) set: u64,
    pub(crate) epoch: u64,
    pub(crate) users: Vec<&'a [u8]>,
}

/// Appends one record (one inner frame) to `out`.
pub(crate) fn encode<'k>(
    out: &mut Vec<u8>,
    op: Op,
    set: u64,
    epoch: u64,
    users: impl ExactSizeIterator<Item = &'k [u8]>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(RECORD_VERSION);
    out.push(KIND_SUBS);
    out.push(op as u8);
    out.extend_from_slice(&set.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(users.len() as u32).to_le_bytes());
    for key in users {
        out.push(key.len() as u8);
        out.extend_from_slice(key);
    }
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the first frame of `bytes` as a subscription record, and the frame's length.
pub(crate) fn decode(bytes: &[u8]) -> Result<(SubsRecord<'_>, usize), DecodeError> {
    let (body, total) = split_frame(bytes)?;
    let mut r = Reader { bytes: body };
    let version = r.u8()?;
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = r.u8()?;
    if kind != KIND_SUBS {
        return Err(DecodeError::Kind(kind));
    }
    let op = match r.u8()? {
        1 => Op::Add,
        2 => Op::Remove,
        3 => Op::Drop,
        _ => return Err(DecodeError::Malformed("subscription op")),
    };
    let set = r.u64()?;
    let epoch = r.u64()?;
    let count = r.u32()? as usize;
    // Each user takes at least two bytes, so a corrupt count cannot over-allocate.
    let mut users = Vec::with_capacity(count.min(r.bytes.len() / 2));
    for _ in 0..count {
        let len = r.u8()? as usize;
        if len == 0 || len > USER_ID_LEN_MAX + 1 {
            return Err(DecodeError::Malformed("user key length"));
        }
        users.push(r.take(len)?);
    }
    if !r.bytes.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes in record"));
    }
    Ok((
        SubsRecord {
            op,
            set,
            epoch,
            users,
        },
        total,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_detect_damage() {
        let users: Vec<&[u8]> = vec![b"\x00\x00\x00\x00\x00\x00\x00\x00\x07", b"\x01alice"];
        let mut bytes = Vec::new();
        encode(&mut bytes, Op::Add, 9, 3, users.iter().copied());
        let (record, len) = decode(&bytes).unwrap();
        assert_eq!(len, bytes.len());
        assert_eq!(
            record,
            SubsRecord {
                op: Op::Add,
                set: 9,
                epoch: 3,
                users
            }
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert!(decode(&damaged).is_err(), "flip at {i} accepted");
        }
    }
}
