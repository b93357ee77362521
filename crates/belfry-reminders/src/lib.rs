//! Belfry's reminders: a reminder is content due at a time (once, or on a cron schedule) for
//! a set of subscribers. At the time its subscribers are cut into chunks, each one task in
//! the reminder's queue (`fanout`); any time, a user can ask what is coming up for them
//! (`feed`), list or end all their subscriptions (`users`). Subscriber sets live in the store (`Store::subscribe` and friends); reminders and
//! fan-out cursors in its metadata (`record`).
//!
//! The HTTP API, the runner that calls [`ReminderService::step`] and the feed's cache live in
//! the server.

mod fanout;
pub mod feed;
mod model;
mod quiet;
mod record;
mod service;
mod users;

pub use fanout::{chunk_key, owner_key, StepReport, LEAD_MS};
pub use model::{
    InvalidReminder, InvalidReminderId, Reminder, ReminderDef, ReminderId, Urgency, When,
    CHUNK_SIZE_DEFAULT, CHUNK_SIZE_MAX, CONTENT_BYTES_MAX, REMINDER_ID_LEN_MAX,
    USERS_PER_SECOND_MAX,
};
pub use quiet::FULL_LOOK_MS;
pub use record::{parse_uid_key, Fanout, FANOUTS_NAMESPACE, IDS_NAMESPACE, REMINDERS_NAMESPACE};
pub use service::{ReminderError, ReminderPatch, ReminderService, Result, LIST_LIMIT_MAX};
pub use users::Subscriptions;
