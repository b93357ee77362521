//! Due-time buckets and task ids.
//!
//! A bucket is a time range of one queue, `[start, start + width)`, holding the tasks whose due
//! time fell in it when they were submitted. Width grows with distance from now (minutes near,
//! then hours, days and weeks), so a few hundred files cover years and the buckets due soon are
//! small enough to load whole. A bucket key packs the width tier (top 8 bits) and the start in
//! minutes since the epoch (low 56 bits).
//!
//! A task id is `seq << 64 | bucket key`: `seq` is a store-wide counter (so ids sort in submit
//! order) and the bucket key says which file holds the task, so no in-memory id index is needed.

use belfry_core::{TaskId, UnixMs};

pub const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Bucket widths by tier.
pub const TIER_WIDTH_MS: [u64; 4] = [MINUTE_MS, HOUR_MS, DAY_MS, 7 * DAY_MS];

/// A task due within `TIER_DISTANCE_MS[i]` of now goes to a bucket of tier `i`; beyond the
/// last distance, to the widest tier. About 60 + 47 + 58 + 100 buckets cover two years.
pub const TIER_DISTANCE_MS: [u64; 3] = [HOUR_MS, 2 * DAY_MS, 60 * DAY_MS];

const START_BITS: u32 = 56;
const START_MASK: u64 = (1 << START_BITS) - 1;

const _: () = assert!(TIER_WIDTH_MS.len() == TIER_DISTANCE_MS.len() + 1);
// Every width is a whole number of minutes, so bucket starts are exact in minutes.
const _: () = assert!(
    TIER_WIDTH_MS[3].is_multiple_of(MINUTE_MS) && TIER_WIDTH_MS[2].is_multiple_of(MINUTE_MS)
);

/// The bucket a task due at `due_ms` goes to, when now is `now_ms`.
pub fn bucket_for(due_ms: UnixMs, now_ms: UnixMs) -> u64 {
    let distance = due_ms.saturating_sub(now_ms);
    let tier = TIER_DISTANCE_MS
        .iter()
        .position(|limit| distance <= *limit)
        .unwrap_or(TIER_DISTANCE_MS.len());
    let width = TIER_WIDTH_MS[tier];
    let start_minutes = (due_ms / width) * (width / MINUTE_MS);
    ((tier as u64) << START_BITS) | (start_minutes & START_MASK)
}

/// Start of a bucket in ms, and its width; `None` for a key no writer makes.
pub fn bucket_range(key: u64) -> Option<(UnixMs, u64)> {
    let tier = (key >> START_BITS) as usize;
    let width = *TIER_WIDTH_MS.get(tier)?;
    let start = (key & START_MASK).checked_mul(MINUTE_MS)?;
    Some((start, width))
}

pub fn task_id(seq: u64, bucket: u64) -> TaskId {
    TaskId(((seq as u128) << 64) | bucket as u128)
}

/// `(seq, bucket key)` of an id.
pub fn split_id(id: TaskId) -> (u64, u64) {
    ((id.0 >> 64) as u64, id.0 as u64)
}

/// File name of a bucket inside its queue's directory.
pub fn file_name(key: u64) -> String {
    format!("b-{key:016x}.seg")
}

/// The bucket key of a file name made by [`file_name`].
pub fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("b-")?.strip_suffix(".seg")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_with_distance_and_contain_the_due_time() {
        let now = 1_700_000_000_000;
        let mut last_width = 0;
        for distance in [0, 59 * MINUTE_MS, 3 * HOUR_MS, 10 * DAY_MS, 400 * DAY_MS] {
            let due = now + distance;
            let key = bucket_for(due, now);
            let (start, width) = bucket_range(key).unwrap();
            assert!(start <= due && due < start + width, "{distance}");
            assert!(width >= last_width);
            last_width = width;
            assert_eq!(parse_file_name(&file_name(key)), Some(key));
        }
        // Late tasks go to small buckets.
        assert_eq!(bucket_range(bucket_for(5, now)).unwrap().1, MINUTE_MS);
    }

    #[test]
    fn ids_carry_seq_and_bucket() {
        let id = task_id(42, 0x0300_0000_0000_1234);
        assert_eq!(split_id(id), (42, 0x0300_0000_0000_1234));
        assert!(task_id(1, u64::MAX) < task_id(2, 0));
    }
}
