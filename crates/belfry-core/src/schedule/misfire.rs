//! Which firings are due at a tick, and what happens to the ones missed during downtime.
//!
//! A schedule keeps a **cursor**: the last fire time it has handled (fired or deliberately
//! dropped). At a tick at `now`, the due fire times are those in `(cursor, now]`. A due fire
//! time `t` is **missed** when it is more than [`MISFIRE_THRESHOLD_MS`] old (`t < now -
//! threshold`); a tick that is merely a little late is not a misfire. When none of the due
//! times is missed, all of them fire (there is usually one). When some are missed, the policy
//! decides, for the whole due set:
//!
//! - `Skip`: the missed ones are dropped; due times within the threshold still fire.
//! - `FireOnce`: exactly one firing, for the latest due time (its task is due in the past, so
//!   it is delivered at once).
//! - `CatchUp`: every due time fires, at most [`CATCH_UP_MAX`] of them: the latest ones, since
//!   after a very long outage the recent periods matter most; older ones are dropped.
//!
//! In every case the new cursor is the latest due time, so nothing due is considered twice.

use std::collections::VecDeque;

use super::{ScheduleSpec, INTERVAL_MS_MIN};
use crate::clock::UnixMs;

/// How late a due firing may be before it counts as missed (60 s, Quartz's default): enough
/// to absorb a slow tick or a quick restart, short enough that a real outage is noticed.
pub const MISFIRE_THRESHOLD_MS: u64 = 60_000;

/// Most firings one tick creates for one schedule, and so the most a `CatchUp` replays.
pub const CATCH_UP_MAX: usize = 1_000;

// Firings at least INTERVAL_MS_MIN apart within the threshold all fit in one tick, so a tick
// that is not a misfire never drops anything.
const _: () = assert!(((MISFIRE_THRESHOLD_MS / INTERVAL_MS_MIN) as usize) < CATCH_UP_MAX);

/// What to do with firings missed during downtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MisfirePolicy {
    Skip,
    #[default]
    FireOnce,
    CatchUp,
}

impl MisfirePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MisfirePolicy::Skip => "skip",
            MisfirePolicy::FireOnce => "fire_once",
            MisfirePolicy::CatchUp => "catch_up",
        }
    }

    pub fn parse(text: &str) -> Option<MisfirePolicy> {
        match text {
            "skip" => Some(MisfirePolicy::Skip),
            "fire_once" => Some(MisfirePolicy::FireOnce),
            "catch_up" => Some(MisfirePolicy::CatchUp),
            _ => None,
        }
    }
}

/// The decision of one tick for one schedule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Due {
    /// Fire times to create firings for now, ascending.
    pub fire_times: Vec<UnixMs>,
    /// The new cursor: the latest due time, or the old cursor when nothing was due.
    pub cursor_ms: UnixMs,
    /// Whether some due time was missed (older than the threshold).
    pub misfired: bool,
    /// Due times not fired. When more than [`CATCH_UP_MAX`] were due this is a lower bound:
    /// counting a long outage of a per-second schedule exactly would cost too much.
    pub dropped: u64,
}

impl ScheduleSpec {
    /// Which firings are due at `now_ms`, given that everything up to `cursor_ms` was handled.
    pub fn due(&self, cursor_ms: UnixMs, now_ms: UnixMs) -> Due {
        self.due_until(cursor_ms, now_ms, now_ms)
    }

    /// [`ScheduleSpec::due`] for a tick at `now_ms` that also takes the fire times up to
    /// `until_ms` (at or after `now_ms`), so that their tasks are stored before they are due.
    /// Whether a fire time was missed is still judged against `now_ms`.
    pub fn due_until(&self, cursor_ms: UnixMs, now_ms: UnixMs, until_ms: UnixMs) -> Due {
        let until_ms = until_ms.max(now_ms);
        let nothing = Due {
            cursor_ms,
            ..Due::default()
        };
        let first = match self.next_after(cursor_ms) {
            Some(first) if first <= until_ms => first,
            _ => return nothing,
        };
        let threshold = now_ms.saturating_sub(MISFIRE_THRESHOLD_MS);
        let misfired = first < threshold;
        let (recent, total) = self.latest_due(cursor_ms, until_ms, CATCH_UP_MAX);
        let Some(&latest) = recent.last() else {
            return nothing;
        };
        let fire_times: Vec<UnixMs> = if !misfired {
            recent
        } else {
            match self.misfire() {
                MisfirePolicy::Skip => recent.into_iter().filter(|&t| t >= threshold).collect(),
                MisfirePolicy::FireOnce => vec![latest],
                MisfirePolicy::CatchUp => recent,
            }
        };
        Due {
            dropped: total.saturating_sub(fire_times.len() as u64),
            fire_times,
            cursor_ms: latest,
            misfired,
        }
    }

    /// The latest `keep` fire times in `(cursor_ms, now_ms]`, ascending, and how many fire
    /// times were seen (all of them, unless more than `keep` exist).
    ///
    /// It looks back from `now` over growing windows instead of walking forward from the
    /// cursor, so that a year-long outage of a per-second schedule costs a few thousand steps,
    /// not thirty million.
    fn latest_due(&self, cursor_ms: UnixMs, now_ms: UnixMs, keep: usize) -> (Vec<UnixMs>, u64) {
        let mut window_ms = MISFIRE_THRESHOLD_MS.saturating_mul(2);
        loop {
            let from = cursor_ms.max(now_ms.saturating_sub(window_ms));
            let mut recent = VecDeque::with_capacity(keep.min(64));
            let mut seen = 0u64;
            let mut at = from;
            while let Some(next) = self.next_after(at).filter(|&t| t <= now_ms) {
                if recent.len() == keep {
                    recent.pop_front();
                }
                recent.push_back(next);
                seen += 1;
                at = next;
            }
            if from == cursor_ms || recent.len() == keep {
                return (recent.into(), seen);
            }
            window_ms = window_ms.saturating_mul(4);
        }
    }
}
