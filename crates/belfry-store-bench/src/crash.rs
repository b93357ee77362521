//! The protocol between the crash tests and the `crash-writer` subcommand: the queue, the due
//! times, the clock values and the acknowledgement log lines.
//!
//! The writer prints one line per acknowledged operation, only after the store returned `Ok`:
//!
//! ```text
//! READY                      the engine is open and the queue exists
//! P <tag> <id>               put of the task tagged <tag> is durable; the store named it <id>
//! L <tag> <id>               the claimer leased that task and is about to ack it (so it may
//!                            be done even if no A line follows)
//! A <tag> <id>               ack of that task is durable
//! M <value>                  `write_meta` setting every one of the `META_KEYS` cursors to
//!                            <value> (a tag, see `meta_value`) is durable
//! BAD <text>                 the writer saw wrong data (the test fails)
//! ```

use belfry_core::{TaskId, UnixMs};

use crate::workload::{splitmix64, DUE_BASE_MS};

pub const QUEUE: &str = "crash";

/// The metadata namespace of the writer's cursors, and how many cursors each `write_meta`
/// sets (all to the same value, so a reader can tell a torn batch).
pub const META_NAMESPACE: &str = "crash-cursors";
pub const META_KEYS: u64 = 16;

/// The key of cursor `i`.
pub fn meta_key(i: u64) -> String {
    format!("cursor-{i:04}")
}

/// Due times spread over twice this span from `DUE_BASE_MS`; the writer's claimer runs at
/// `CLAIM_NOW_MS`, the middle, so about half the tasks are due for it.
pub const DUE_SPAN_MS: u64 = 60_000;

pub const CLAIM_NOW_MS: UnixMs = DUE_BASE_MS + DUE_SPAN_MS;

/// Lease visibility the writer's claimer uses.
pub const VISIBILITY_MS: u64 = 60_000;

/// The checker's clock: past every due time and every lease the writer took.
pub const CHECK_NOW_MS: UnixMs = DUE_BASE_MS + 100 * DUE_SPAN_MS;

const _: () = assert!(CLAIM_NOW_MS + VISIBILITY_MS < CHECK_NOW_MS);
const _: () = assert!(DUE_BASE_MS + 2 * DUE_SPAN_MS < CHECK_NOW_MS);

/// Bits of a tag below the round: writer thread and sequence number.
pub const ROUND_SHIFT: u32 = 40;
const WRITER_SHIFT: u32 = 32;

/// Tag of task `seq` of writer thread `writer` in round `round`: unique over a whole test.
pub fn tag(round: u64, writer: u64, seq: u64) -> u64 {
    debug_assert!(writer < 1 << (ROUND_SHIFT - WRITER_SHIFT));
    debug_assert!(seq < 1 << WRITER_SHIFT);
    (round << ROUND_SHIFT) | (writer << WRITER_SHIFT) | seq
}

pub fn round_of(tag: u64) -> u64 {
    tag >> ROUND_SHIFT
}

pub fn due_ms(tag: u64) -> UnixMs {
    DUE_BASE_MS + splitmix64(tag) % (2 * DUE_SPAN_MS)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckLine {
    Ready,
    Put { tag: u64, id: TaskId },
    Leased { tag: u64, id: TaskId },
    Acked { tag: u64, id: TaskId },
    Meta { value: u64 },
    Bad(String),
}

impl AckLine {
    pub fn render(&self) -> String {
        match self {
            AckLine::Ready => "READY\n".into(),
            AckLine::Put { tag, id } => format!("P {tag} {id}\n"),
            AckLine::Leased { tag, id } => format!("L {tag} {id}\n"),
            AckLine::Acked { tag, id } => format!("A {tag} {id}\n"),
            AckLine::Meta { value } => format!("M {value}\n"),
            AckLine::Bad(text) => format!("BAD {}\n", text.replace('\n', " ")),
        }
    }

    /// Parses one line (without its newline). `None` for anything else, e.g. a torn last line.
    pub fn parse(line: &str) -> Option<AckLine> {
        if line == "READY" {
            return Some(AckLine::Ready);
        }
        if let Some(text) = line.strip_prefix("BAD ") {
            return Some(AckLine::Bad(text.to_string()));
        }
        if let Some(value) = line.strip_prefix("M ") {
            return value.parse().ok().map(|value| AckLine::Meta { value });
        }
        let mut parts = line.split(' ');
        let kind = parts.next()?;
        let tag = parts.next()?.parse().ok()?;
        let id = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        match kind {
            "P" => Some(AckLine::Put { tag, id }),
            "L" => Some(AckLine::Leased { tag, id }),
            "A" => Some(AckLine::Acked { tag, id }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        for line in [
            AckLine::Ready,
            AckLine::Put {
                tag: tag(3, 2, 99),
                id: TaskId(12345),
            },
            AckLine::Leased {
                tag: 6,
                id: TaskId(1),
            },
            AckLine::Acked {
                tag: 7,
                id: TaskId(u128::MAX),
            },
            AckLine::Meta {
                value: tag(3, 7, 12),
            },
            AckLine::Bad("payload of tag 5 is torn".into()),
        ] {
            let text = line.render();
            assert_eq!(AckLine::parse(text.trim_end_matches('\n')), Some(line));
        }
        assert_eq!(AckLine::parse("P 12 00ab"), None, "a torn id is not an ack");
        assert_eq!(round_of(tag(3, 2, 99)), 3);
    }
}
