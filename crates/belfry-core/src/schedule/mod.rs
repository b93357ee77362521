//! Schedules: when a recurring job fires. Pure computation, no I/O, no clock reads: every
//! function takes the instants it needs.
//!
//! - [`cron`]: cron expressions (5 or 6 fields, aliases) matched against civil time.
//! - [`zoned`]: a cron expression in an IANA time zone, with the DST rule.
//! - [`Interval`]: fixed intervals from an anchor.
//! - [`ScheduleSpec`]: a trigger with bounds, shards and a misfire policy; [`ScheduleSpec::due`]
//!   decides which firings a tick creates after the last one handled.
//!
//! See docs/schedules.md for the user-facing rules.

pub mod cron;
mod cron_days;
mod misfire;
pub mod zoned;

pub use cron::{Civil, CronError, CronExpr, CronField, FieldProblem, CRON_EXPRESSION_LEN_MAX};
/// Re-exported so callers can name zones without depending on jiff themselves.
pub use jiff::tz::TimeZone;
pub use misfire::{Due, MisfirePolicy, CATCH_UP_MAX, MISFIRE_THRESHOLD_MS};
pub use zoned::{
    canonical_zone_name, format_in_zone, format_utc, time_zone, CronSchedule, UnknownTimeZone,
};

use crate::clock::UnixMs;

/// Shortest fixed interval (1 s): cron has one-second resolution too, and a shorter period
/// would turn one schedule into a firehose of tasks better submitted directly.
pub const INTERVAL_MS_MIN: u64 = 1_000;

/// Longest fixed interval (10 years), the same as the default task horizon.
pub const INTERVAL_MS_MAX: u64 = crate::limits::HORIZON_MS_DEFAULT;

/// Most shards one firing may fan out to. Each firing creates one task per shard, so this
/// bounds the tasks one firing puts into a queue (ElasticJob-style sharding uses tens).
pub const SHARD_COUNT_MAX: u32 = 1_000;

/// Most fire times one preview returns.
pub const PREVIEW_MAX: usize = 1_000;

/// Header carrying the shard index (0-based) on each task of a sharded firing.
pub const SHARD_HEADER: &str = "Belfry-Shard";
/// Header carrying the shard count on each task of a sharded firing.
pub const SHARD_COUNT_HEADER: &str = "Belfry-Shard-Count";
/// Headers on every task of a firing: the schedule's id and the firing's fire time (unix ms),
/// which stays the firing's after a retry moves the task's due time.
pub const SCHEDULE_HEADER: &str = "Belfry-Schedule";
pub const FIRE_TIME_HEADER: &str = "Belfry-Fire-Time";

const _: () = assert!(INTERVAL_MS_MIN <= INTERVAL_MS_MAX);
// A shard count fits the store's batch, so one firing's tasks can be put all or none.
const _: () = assert!(SHARD_COUNT_MAX as usize <= crate::limits::BATCH_TASKS_MAX);

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("invalid cron expression: {0}")]
    Cron(#[from] CronError),
    #[error(transparent)]
    UnknownTimeZone(#[from] UnknownTimeZone),
    #[error("every_ms must be at least {INTERVAL_MS_MIN} ms, got {got}")]
    IntervalTooShort { got: u64 },
    #[error("every_ms must be at most {INTERVAL_MS_MAX} ms, got {got}")]
    IntervalTooLong { got: u64 },
    #[error("end_at ({end_at_ms}) is before start_at ({start_at_ms})")]
    EndBeforeStart {
        start_at_ms: UnixMs,
        end_at_ms: UnixMs,
    },
    #[error("shard_count must be 1 to {SHARD_COUNT_MAX}, got {got}")]
    ShardCount { got: u32 },
}

/// Fires every `every_ms` milliseconds at `anchor_ms + k * every_ms` for k = 0, 1, 2…
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    every_ms: u64,
    anchor_ms: UnixMs,
}

impl Interval {
    pub fn new(every_ms: u64, anchor_ms: UnixMs) -> Result<Interval, ScheduleError> {
        if every_ms < INTERVAL_MS_MIN {
            return Err(ScheduleError::IntervalTooShort { got: every_ms });
        }
        if every_ms > INTERVAL_MS_MAX {
            return Err(ScheduleError::IntervalTooLong { got: every_ms });
        }
        Ok(Interval {
            every_ms,
            anchor_ms,
        })
    }

    pub fn every_ms(&self) -> u64 {
        self.every_ms
    }

    pub fn anchor_ms(&self) -> UnixMs {
        self.anchor_ms
    }

    pub fn next_after(&self, after_ms: UnixMs) -> Option<UnixMs> {
        if after_ms < self.anchor_ms {
            return Some(self.anchor_ms);
        }
        let periods = (after_ms - self.anchor_ms) / self.every_ms + 1;
        periods
            .checked_mul(self.every_ms)?
            .checked_add(self.anchor_ms)
    }
}

/// What makes a schedule fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Cron(CronSchedule),
    Every(Interval),
}

impl Trigger {
    /// Parses a cron expression and looks up its zone.
    pub fn cron(expression: &str, zone_name: &str) -> Result<Trigger, ScheduleError> {
        let expr = CronExpr::parse(expression)?;
        Ok(Trigger::Cron(CronSchedule::new(expr, zone_name)?))
    }

    pub fn every(every_ms: u64, anchor_ms: UnixMs) -> Result<Trigger, ScheduleError> {
        Ok(Trigger::Every(Interval::new(every_ms, anchor_ms)?))
    }

    /// The first firing strictly after `after_ms`, ignoring bounds.
    pub fn next_after(&self, after_ms: UnixMs) -> Option<UnixMs> {
        match self {
            Trigger::Cron(cron) => cron.next_after(after_ms),
            Trigger::Every(interval) => interval.next_after(after_ms),
        }
    }
}

/// A validated schedule: trigger, bounds, shards and misfire policy.
///
/// Bounds are inclusive: the schedule fires at the trigger's times t with
/// `start_at_ms <= t <= end_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    trigger: Trigger,
    start_at_ms: Option<UnixMs>,
    end_at_ms: Option<UnixMs>,
    shard_count: u32,
    misfire: MisfirePolicy,
}

impl ScheduleSpec {
    pub fn new(
        trigger: Trigger,
        start_at_ms: Option<UnixMs>,
        end_at_ms: Option<UnixMs>,
        shard_count: u32,
        misfire: MisfirePolicy,
    ) -> Result<ScheduleSpec, ScheduleError> {
        if let (Some(start_at_ms), Some(end_at_ms)) = (start_at_ms, end_at_ms) {
            if end_at_ms < start_at_ms {
                return Err(ScheduleError::EndBeforeStart {
                    start_at_ms,
                    end_at_ms,
                });
            }
        }
        if !(1..=SHARD_COUNT_MAX).contains(&shard_count) {
            return Err(ScheduleError::ShardCount { got: shard_count });
        }
        Ok(ScheduleSpec {
            trigger,
            start_at_ms,
            end_at_ms,
            shard_count,
            misfire,
        })
    }

    pub fn trigger(&self) -> &Trigger {
        &self.trigger
    }
    pub fn start_at_ms(&self) -> Option<UnixMs> {
        self.start_at_ms
    }
    pub fn end_at_ms(&self) -> Option<UnixMs> {
        self.end_at_ms
    }
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }
    pub fn misfire(&self) -> MisfirePolicy {
        self.misfire
    }

    /// The first firing strictly after `after_ms` within the bounds, or `None` if the schedule
    /// never fires again.
    pub fn next_after(&self, after_ms: UnixMs) -> Option<UnixMs> {
        // Start the search just before start_at so that start_at itself can fire.
        let from = match self.start_at_ms {
            Some(start) if start > 0 && after_ms < start => start - 1,
            _ => after_ms,
        };
        let next = self.trigger.next_after(from)?;
        debug_assert!(next > after_ms);
        match self.end_at_ms {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// Up to `n` (at most [`PREVIEW_MAX`]) next firings strictly after `after_ms`.
    pub fn preview(&self, after_ms: UnixMs, n: usize) -> Vec<UnixMs> {
        let mut out = Vec::with_capacity(n.min(PREVIEW_MAX));
        let mut cursor = after_ms;
        while out.len() < n.min(PREVIEW_MAX) {
            let Some(next) = self.next_after(cursor) else {
                break;
            };
            out.push(next);
            cursor = next;
        }
        out
    }
}

#[cfg(test)]
mod tests;
