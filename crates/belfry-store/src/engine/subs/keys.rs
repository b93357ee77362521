//! Keys of the subscription tree. Both indexes live in one sorted key space:
//! - by set: `[0][set: u64 BE][epoch: varint][user key]`: a set's members, in `UserId` order,
//!   under the prefix of the set's current epoch;
//! - by user: `[1][user key len: u8][user key][set: u64 BE][epoch: varint]`: a user's sets in
//!   ascending order (the length byte keeps one user's prefix from being another's).
//!
//! The user key is `UserId::encode` (at most 129 bytes). The epoch is the set's incarnation: a
//! dropped set's entries keep their old epoch and are never read again (compaction removes
//! them). Varints are LEB128, which is prefix-free, so `(set, epoch)` prefixes never overlap.

use belfry_core::UserId;

pub(crate) use crate::engine::lsm::{get_varint, put_varint};

pub(crate) const SPACE_BY_SET: u8 = 0;
pub(crate) const SPACE_BY_USER: u8 = 1;

/// Longest key: by user, `1 + 1 + 129 + 8 + 10`.
pub(crate) const KEY_BYTES_MAX: usize = 160;

/// `[0][set][epoch]`: the prefix of a set incarnation's members.
pub(crate) fn set_prefix(out: &mut Vec<u8>, set: u64, epoch: u64) {
    out.push(SPACE_BY_SET);
    out.extend_from_slice(&set.to_be_bytes());
    put_varint(out, epoch);
}

/// `[1][len][user key]`: the prefix of a user's sets.
pub(crate) fn user_prefix(out: &mut Vec<u8>, user_key: &[u8]) {
    out.push(SPACE_BY_USER);
    out.push(user_key.len() as u8);
    out.extend_from_slice(user_key);
}

pub(crate) fn by_user_key(out: &mut Vec<u8>, user_key: &[u8], set: u64, epoch: u64) {
    user_prefix(out, user_key);
    out.extend_from_slice(&set.to_be_bytes());
    put_varint(out, epoch);
}

/// The set and epoch that end a by-user key whose user prefix is `prefix_len` bytes long.
pub(crate) fn split_by_user(key: &[u8], prefix_len: usize) -> Option<(u64, u64)> {
    let rest = key.get(prefix_len..)?;
    let set = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let (epoch, n) = get_varint(&rest[8..])?;
    (8 + n == rest.len()).then_some((set, epoch))
}

/// The set and epoch of a by-set key, and where its user key starts.
pub(crate) fn split_by_set(key: &[u8]) -> Option<(u64, u64, usize)> {
    if key.first() != Some(&SPACE_BY_SET) {
        return None;
    }
    let set = u64::from_be_bytes(key.get(1..9)?.try_into().ok()?);
    let (epoch, n) = get_varint(&key[9..])?;
    Some((set, epoch, 9 + n))
}

/// Encodes users as keys in one buffer: returns the buffer and each key's range, sorted by
/// key with duplicates removed (so a user named twice counts once).
pub(crate) fn sorted_user_keys(users: &[UserId]) -> (Vec<u8>, Vec<(u32, u32)>) {
    let mut buf = Vec::with_capacity(users.len() * 10);
    let mut ranges = Vec::with_capacity(users.len());
    for user in users {
        let start = buf.len() as u32;
        user.encode_into(&mut buf);
        ranges.push((start, buf.len() as u32));
    }
    let key = |r: &(u32, u32)| &buf[r.0 as usize..r.1 as usize];
    ranges.sort_unstable_by(|a, b| key(a).cmp(key(b)));
    ranges.dedup_by(|a, b| key(a) == key(b));
    (buf, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(get_varint(&out), Some((v, out.len())));
        }
        assert_eq!(get_varint(&[0x80]), None);
    }

    #[test]
    fn keys_split_back() {
        let mut key = Vec::new();
        set_prefix(&mut key, 7, 300);
        key.extend_from_slice(b"\x01alice");
        assert_eq!(split_by_set(&key), Some((7, 300, 11)));
        let mut key = Vec::new();
        by_user_key(&mut key, b"\x01bob", 9, 5);
        assert_eq!(split_by_user(&key, 6), Some((9, 5)));
    }
}
