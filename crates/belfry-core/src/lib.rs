//! Belfry's domain vocabulary, shared by every other crate.
//!
//! This crate performs no I/O and never reads a clock by itself: time arrives through the
//! [`Clock`] trait so that tests can drive it.

pub mod clock;
pub mod headers;
pub mod id;
pub mod limits;
pub mod log_every;
pub mod look;
pub mod queue;
pub mod retry;
pub mod schedule;
pub mod task;
pub mod timetable;
pub mod user;

pub use clock::{Clock, ManualClock, SystemClock, UnixMs};
pub use id::{ParseTaskIdError, TaskId};
pub use look::{LastLook, LookStart, TOUCHED_MAX};
pub use queue::{InvalidQueueName, QueueName};
pub use retry::RetryPolicy;
pub use task::{
    Header, LatePolicy, LeaseId, LeasedTask, NewTask, PayloadKind, Priority, Task, TaskState,
};
pub use timetable::{Timetable, TIMETABLE_MAX};
pub use user::{InvalidUserId, UserId, UserPage};
