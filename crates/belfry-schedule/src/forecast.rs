//! The queue forecast's share from schedules: how many tasks the active schedules will create
//! in each window ahead, counted from their cursors without creating anything.

use belfry_core::{QueueName, UnixMs};

use crate::service::{Result, ScheduleService, ScheduleServiceError};

/// Most steps one forecast may ask for (a week in minutes is 10,080).
pub const FORECAST_STEPS_MAX: usize = 100_000;

/// Most firings one forecast counts over all its queue's schedules (a few hundred ms of CPU):
/// any caller with the `read` scope may ask for one, and 500 per-second schedules over the
/// longest horizon were 1.3 billion steps (seconds of CPU, past the store call's deadline).
pub const FORECAST_FIRINGS_TOTAL_MAX: usize = 2_000_000;

/// The firings counted per step, and where the count was cut: firings before `cut_at_ms` are
/// all counted, later ones are not (`None`: none was left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiringsForecast {
    pub counts: Vec<u64>,
    pub cut_at_ms: Option<UnixMs>,
}

impl ScheduleService {
    /// How many tasks the queue's active schedules will create in each of `steps` windows
    /// `[from + i*step, from + (i+1)*step)`, counting firings not yet created (after each
    /// schedule's cursor) times their shard count. For the queue forecast, added to the
    /// store's count of tasks that already exist.
    ///
    /// Firings are counted in time order across the schedules, at most
    /// [`FORECAST_FIRINGS_TOTAL_MAX`] of them: when the budget runs out, every step before the
    /// cut is exact for every schedule, and the answer says where it was cut.
    pub fn forecast_firings(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<FiringsForecast> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
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
        let end_ms = from_ms.saturating_add(step_ms.saturating_mul(steps as u64));
        let mut specs = Vec::new();
        // Each active schedule's next firing after its cursor, earliest first.
        let mut next = BinaryHeap::new();
        for entry in self.scan()?.into_iter().filter_map(|(_, entry)| entry.ok()) {
            let (stored, spec) = (&entry.parsed.stored, &entry.parsed.spec);
            if stored.def.paused || &stored.def.queue != queue {
                continue;
            }
            let cursor = entry.cursor_ms.max(from_ms.saturating_sub(1));
            if let Some(at) = spec.next_after(cursor) {
                next.push(Reverse((at, specs.len())));
                specs.push(spec.clone());
            }
        }
        let mut counts = vec![0u64; steps];
        let mut budget = FORECAST_FIRINGS_TOTAL_MAX;
        while let Some(Reverse((at, index))) = next.pop() {
            if at >= end_ms {
                // The earliest firing left is past the horizon: so are all the others.
                break;
            }
            if budget == 0 {
                return Ok(FiringsForecast {
                    counts,
                    cut_at_ms: Some(at),
                });
            }
            budget -= 1;
            let spec = &specs[index];
            let step = (at.saturating_sub(from_ms) / step_ms) as usize;
            counts[step] += u64::from(spec.shard_count());
            if let Some(after) = spec.next_after(at) {
                next.push(Reverse((after, index)));
            }
        }
        Ok(FiringsForecast {
            counts,
            cut_at_ms: None,
        })
    }
}
