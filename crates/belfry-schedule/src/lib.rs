//! Belfry's schedules as a service: cron and interval schedules stored in a [`Store`]'s
//! metadata, and a `tick` that turns their due firings into ordinary tasks in their queue.
//!
//! The schedule math (cron parsing, time zones, DST, misfires) is in
//! `belfry_core::schedule`; this crate adds persistence, ids and firing creation. The HTTP
//! API and the runner loop that calls [`ScheduleService::tick`] live in the server.
//!
//! [`Store`]: belfry_store::Store

mod firings;
mod forecast;
mod model;
mod record;
mod service;
mod tick;

pub use belfry_core::TIMETABLE_MAX;
pub use forecast::{FiringsForecast, FORECAST_FIRINGS_TOTAL_MAX, FORECAST_STEPS_MAX};
pub use model::{
    FireTime, InvalidSchedule, InvalidScheduleId, Schedule, ScheduleDef, ScheduleId, TriggerDef,
    SCHEDULE_HEADERS_MAX, SCHEDULE_ID_LEN_MAX,
};
pub use record::{CURSORS_NAMESPACE, SCHEDULES_NAMESPACE};
pub use service::{
    firing_key, owner_key, run_key, NewSchedule, Result, ScheduleService, ScheduleServiceError,
    FIRING_PUT_TASKS, FULL_TICK_MS,
};
pub use tick::TickReport;

// The schedule vocabulary callers need, so they do not have to reach into belfry-core.
pub use belfry_core::schedule::{
    MisfirePolicy, ScheduleSpec, CATCH_UP_MAX, FIRE_TIME_HEADER, INTERVAL_MS_MIN,
    MISFIRE_THRESHOLD_MS, SCHEDULE_HEADER, SHARD_COUNT_HEADER, SHARD_COUNT_MAX, SHARD_HEADER,
};
