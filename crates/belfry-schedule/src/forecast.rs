//! The queue forecast's share from schedules: how many tasks the active schedules will create
//! in each window ahead, counted from their cursors without creating anything.

use belfry_core::{QueueName, UnixMs};

use crate::service::{Result, ScheduleService, ScheduleServiceError};

/// Most steps one forecast may ask for (a week in minutes is 10,080).
pub const FORECAST_STEPS_MAX: usize = 100_000;

/// Most firings of one schedule a forecast counts; a per-second schedule over a day is 86,400.
/// Beyond it the forecast undercounts that schedule rather than spend unbounded time.
pub const FORECAST_FIRINGS_MAX: usize = 200_000;

/// Most firings one forecast counts over all its queue's schedules (a few hundred ms of CPU):
/// any caller with the `read` scope may ask for one, and 500 per-second schedules over the
/// longest horizon were 1.3 billion steps (seconds of CPU, past the store call's deadline).
pub const FORECAST_FIRINGS_TOTAL_MAX: usize = 2_000_000;

impl ScheduleService {
    /// How many tasks the queue's active schedules will create in each of `steps` windows
    /// `[from + i*step, from + (i+1)*step)`, counting firings not yet created (after each
    /// schedule's cursor) times their shard count. For the queue forecast, added to the
    /// store's count of tasks that already exist.
    pub fn forecast_firings(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        if step_ms == 0 {
            return Err(ScheduleServiceError::InvalidArgument(
                "step_ms must be at least 1".into(),
            ));
        }
        if steps > FORECAST_STEPS_MAX {
            return Err(ScheduleServiceError::InvalidArgument(format!(
                "at most {FORECAST_STEPS_MAX} steps"
            )));
        }
        let mut counts = vec![0u64; steps];
        let mut budget = FORECAST_FIRINGS_TOTAL_MAX;
        for entry in self.scan()?.into_iter().filter_map(|(_, entry)| entry.ok()) {
            if budget == 0 {
                break;
            }
            let (stored, spec) = (&entry.parsed.stored, &entry.parsed.spec);
            if stored.def.paused || &stored.def.queue != queue {
                continue;
            }
            let shards = u64::from(spec.shard_count());
            let mut cursor = entry.cursor_ms.max(from_ms.saturating_sub(1));
            for _ in 0..FORECAST_FIRINGS_MAX.min(budget) {
                budget -= 1;
                let Some(next) = spec.next_after(cursor) else {
                    break;
                };
                let index = (next.saturating_sub(from_ms)) / step_ms;
                let Some(slot) = usize::try_from(index).ok().and_then(|i| counts.get_mut(i)) else {
                    break;
                };
                *slot += shards;
                cursor = next;
            }
        }
        Ok(counts)
    }
}
