//! The benchmark workload: task `seq` has a due time and a payload that depend only on `seq`.
//!
//! Payload layout (all little-endian): `tag: u64`, filler bytes derived from the tag, then a
//! CRC-32 of everything before it. A reader can therefore tell a complete, correct payload from
//! a torn or corrupted one, and knows which task it belongs to.

use belfry_core::UnixMs;

/// Bytes of a payload that are not filler: the 8-byte tag and the 4-byte checksum.
pub const PAYLOAD_OVERHEAD_BYTES: usize = 12;

/// Smallest payload the workload can produce: the tag and the checksum with no filler.
pub const PAYLOAD_BYTES_MIN: usize = PAYLOAD_OVERHEAD_BYTES;

/// A fixed base for due times (2027-01-15), so runs are reproducible and every due time is a
/// plausible wall-clock instant.
pub const DUE_BASE_MS: UnixMs = 1_800_000_000_000;

/// One day, the unit the CLI uses for spreads and horizons.
pub const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Bytes a minimal record of one task occupies in the raw append baseline, beyond its payload:
/// due time (8), id (16), payload length (4) and a CRC-32 (4). "Raw task bytes" in every ratio
/// means `RAW_RECORD_OVERHEAD_BYTES + payload`.
pub const RAW_RECORD_OVERHEAD_BYTES: usize = 8 + 16 + 4 + 4;

/// SplitMix64: a tiny, well-mixed, seedable generator. Used for due times, payload filler and
/// the crash tests' kill points, so everything replays from a seed.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A seeded pseudo-random stream for tests and kill points.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }

    /// Uniform-enough value in `low..high` (`high > low`); the modulo bias is irrelevant here.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(high > low);
        low + self.next_u64() % (high - low)
    }
}

/// The shape of a run: how many tasks, how big, how they are due, how they are committed.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub tasks: u64,
    pub payload_bytes: usize,
    /// Tasks per durable commit.
    pub batch: usize,
    /// Earliest due time.
    pub due_from_ms: UnixMs,
    /// Due times are spread uniformly over `due_from_ms .. due_from_ms + due_spread_ms`.
    pub due_spread_ms: u64,
}

impl Workload {
    /// Due time of task `seq`: pseudo-random within the spread, so ingest order is not due order
    /// (as in a real delay queue, where tasks arrive with all kinds of delays).
    pub fn due_ms(&self, seq: u64) -> UnixMs {
        self.due_from_ms + splitmix64(seq ^ 0xD0E5_EED5) % self.due_spread_ms.max(1)
    }

    /// An instant after every due time of the workload: claiming at it finds everything due.
    pub fn all_due_ms(&self) -> UnixMs {
        self.due_from_ms + self.due_spread_ms + 1
    }

    /// Bytes of one task as the raw baseline writes it.
    pub fn raw_record_bytes(&self) -> u64 {
        (RAW_RECORD_OVERHEAD_BYTES + self.payload_bytes) as u64
    }

    pub fn raw_total_bytes(&self) -> u64 {
        self.raw_record_bytes() * self.tasks
    }
}

/// Writes the payload of the task tagged `tag` into `out` (cleared first), `len` bytes long
/// (at least [`PAYLOAD_BYTES_MIN`]).
pub fn fill_payload(tag: u64, len: usize, out: &mut Vec<u8>) {
    let len = len.max(PAYLOAD_BYTES_MIN);
    out.clear();
    out.extend_from_slice(&tag.to_le_bytes());
    let filler = len - PAYLOAD_OVERHEAD_BYTES;
    let mut state = splitmix64(tag);
    while out.len() < 8 + filler {
        let word = state.to_le_bytes();
        let take = word.len().min(8 + filler - out.len());
        out.extend_from_slice(&word[..take]);
        state = splitmix64(state);
    }
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len(), len);
}

/// The payload of `tag` as a fresh vector.
pub fn payload(tag: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.max(PAYLOAD_BYTES_MIN));
    fill_payload(tag, len, &mut out);
    out
}

/// Why a payload is not one the workload wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("payload of {0} bytes is shorter than the minimum {PAYLOAD_BYTES_MIN}")]
    TooShort(usize),
    #[error("payload checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("payload of tag {tag} has the wrong filler")]
    Filler { tag: u64 },
}

/// Checks a payload end to end and returns its tag. The checksum catches torn and flipped
/// bytes; the filler comparison catches a payload glued to the wrong task.
pub fn verify_payload(bytes: &[u8]) -> Result<u64, PayloadError> {
    if bytes.len() < PAYLOAD_BYTES_MIN {
        return Err(PayloadError::TooShort(bytes.len()));
    }
    let (body, crc_bytes) = bytes.split_at(bytes.len() - 4);
    let mut stored = [0u8; 4];
    stored.copy_from_slice(crc_bytes);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(PayloadError::Checksum { stored, computed });
    }
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&body[..8]);
    let tag = u64::from_le_bytes(tag);
    if payload(tag, bytes.len()) != bytes {
        return Err(PayloadError::Filler { tag });
    }
    Ok(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_verify_and_carry_their_tag() {
        for (tag, len) in [(0, 12), (1, 13), (42, 200), (u64::MAX, 1000)] {
            let p = payload(tag, len);
            assert_eq!(p.len(), len);
            assert_eq!(verify_payload(&p), Ok(tag));
        }
    }

    #[test]
    fn damaged_payloads_are_refused() {
        let good = payload(7, 64);
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(verify_payload(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(verify_payload(&good[..good.len() - 1]).is_err());
        assert_eq!(verify_payload(&good[..5]), Err(PayloadError::TooShort(5)));
        // A valid payload of another tag is still a valid payload: callers compare tags.
        assert_eq!(verify_payload(&payload(8, 64)), Ok(8));
    }

    #[test]
    fn due_times_stay_in_the_spread() {
        let w = Workload {
            tasks: 1000,
            payload_bytes: 200,
            batch: 100,
            due_from_ms: DUE_BASE_MS,
            due_spread_ms: 30 * DAY_MS,
        };
        for seq in 0..1000 {
            let due = w.due_ms(seq);
            assert!(due >= w.due_from_ms && due < w.all_due_ms());
        }
    }
}
