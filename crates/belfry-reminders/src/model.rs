//! What a reminder is: its id, the definition a client submits, and the stored reminder.

use std::fmt;
use std::str::FromStr;

use belfry_core::schedule::{ScheduleError, Trigger};
use belfry_core::{QueueName, UnixMs};
use bytes::Bytes;

/// Longest reminder id. Ids appear in chunk idempotency keys
/// (`reminder:{id}:{uid}:{firing}:{chunk}`), which the store limits to 256 bytes.
pub const REMINDER_ID_LEN_MAX: usize = 128;
const _: () = assert!(
    9 + REMINDER_ID_LEN_MAX + 1 + 16 + 1 + 20 + 1 + 10
        <= belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX
);

/// Users per fan-out chunk: the default, and the bounds. A chunk is one delivery; 50,000 ids
/// of 128 bytes is a body of a few MiB, the most a push gateway should be sent at once.
pub const CHUNK_SIZE_DEFAULT: u32 = 5_000;
pub const CHUNK_SIZE_MAX: u32 = 50_000;

/// Largest `content`: it is copied into every chunk's body and every feed answer.
pub const CONTENT_BYTES_MAX: usize = 64 * 1024;

/// Highest `users_per_second` (a fan-out of 10M users at this rate takes 10 s).
pub const USERS_PER_SECOND_MAX: u32 = 1_000_000;

/// A reminder id: 1 to 128 characters of `[A-Za-z0-9_.-]`, chosen by the client or generated.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReminderId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reminder ids are 1 to {REMINDER_ID_LEN_MAX} characters of A-Z, a-z, 0-9, '_', '.' and '-', not \".\" or \"..\"; got {got:?}")]
pub struct InvalidReminderId {
    pub got: String,
}

impl ReminderId {
    pub fn new(id: impl Into<String>) -> Result<ReminderId, InvalidReminderId> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= REMINDER_ID_LEN_MAX
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            && !belfry_core::limits::is_dot_segment(&id);
        if valid {
            Ok(ReminderId(id))
        } else {
            Err(InvalidReminderId {
                got: id.chars().take(REMINDER_ID_LEN_MAX + 8).collect(),
            })
        }
    }

    /// A fresh random id (32 hex digits).
    pub fn generate() -> ReminderId {
        ReminderId(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ReminderId {
    type Err = InvalidReminderId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReminderId::new(s)
    }
}

impl fmt::Display for ReminderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ReminderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReminderId({:?})", self.0)
    }
}

/// When a reminder fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// Once, at this time.
    At(UnixMs),
    /// At every fire time of a cron expression in an IANA time zone.
    Cron {
        expression: String,
        timezone: String,
    },
}

impl When {
    /// The first fire time strictly after `after_ms`, or `None` if there is none.
    pub fn next_after(&self, after_ms: UnixMs) -> Result<Option<UnixMs>, InvalidReminder> {
        match self {
            When::At(at) => Ok((*at > after_ms).then_some(*at)),
            When::Cron {
                expression,
                timezone,
            } => Ok(Trigger::cron(expression, timezone)?.next_after(after_ms)),
        }
    }

    /// The latest fire time in `[at_ms, now_ms]`, `at_ms` being one: a recurring reminder
    /// that missed several fire times fires once, for the latest (as a schedule's
    /// `fire_once` does). It looks back from `now_ms` over growing windows, so a long outage
    /// of a per-second cron costs a few thousand steps, not one per missed second.
    pub fn latest_fire(&self, at_ms: UnixMs, now_ms: UnixMs) -> Result<UnixMs, InvalidReminder> {
        let When::Cron {
            expression,
            timezone,
        } = self
        else {
            return Ok(at_ms);
        };
        let trigger = Trigger::cron(expression, timezone)?;
        let mut window_ms: u64 = 60_000;
        loop {
            let from = now_ms.saturating_sub(window_ms).max(at_ms);
            let mut latest = None;
            let mut t = from.saturating_sub(1);
            while let Some(next) = trigger.next_after(t).filter(|&n| n <= now_ms) {
                latest = Some(next);
                t = next;
            }
            match latest {
                Some(latest) => return Ok(latest.max(at_ms)),
                None if from == at_ms => return Ok(at_ms),
                None => window_ms = window_ms.saturating_mul(4),
            }
        }
    }

    pub fn is_recurring(&self) -> bool {
        matches!(self, When::Cron { .. })
    }
}

/// How a reminder ranks in a feed and in its queue: urgent reminders always make a feed's
/// cut, and their chunks are claimed before normal tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Urgency {
    Urgent,
    #[default]
    Normal,
}

impl Urgency {
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::Urgent => "urgent",
            Urgency::Normal => "normal",
        }
    }

    pub fn parse(text: &str) -> Option<Urgency> {
        match text {
            "urgent" => Some(Urgency::Urgent),
            "normal" => Some(Urgency::Normal),
            _ => None,
        }
    }
}

/// A reminder as a client defines it (the body of `POST /v1/reminders`, minus the id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReminderDef {
    pub queue: QueueName,
    pub when: When,
    /// A JSON document, delivered in every chunk and shown in feeds.
    pub content: Bytes,
    pub urgency: Urgency,
    pub chunk_size: u32,
    /// Fan-out pace in users per second (`None`: as fast as the queue takes it).
    pub users_per_second: Option<u32>,
}

impl ReminderDef {
    pub fn at(queue: QueueName, at_ms: UnixMs, content: Bytes) -> ReminderDef {
        ReminderDef {
            queue,
            when: When::At(at_ms),
            content,
            urgency: Urgency::Normal,
            chunk_size: CHUNK_SIZE_DEFAULT,
            users_per_second: None,
        }
    }

    /// Checks everything but the queue's existence.
    pub fn validate(&self) -> Result<(), InvalidReminder> {
        if self.content.len() > CONTENT_BYTES_MAX {
            return Err(InvalidReminder::ContentTooLarge {
                got: self.content.len(),
            });
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&self.content).is_err() {
            return Err(InvalidReminder::ContentNotJson);
        }
        if !(1..=CHUNK_SIZE_MAX).contains(&self.chunk_size) {
            return Err(InvalidReminder::ChunkSize {
                got: self.chunk_size,
            });
        }
        if let Some(rate) = self.users_per_second {
            if !(1..=USERS_PER_SECOND_MAX).contains(&rate) {
                return Err(InvalidReminder::UsersPerSecond { got: rate });
            }
        }
        if let When::Cron {
            expression,
            timezone,
        } = &self.when
        {
            Trigger::cron(expression, timezone)?;
        }
        Ok(())
    }
}

/// A definition that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReminder {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("content is {got} bytes, more than the {CONTENT_BYTES_MAX} allowed")]
    ContentTooLarge { got: usize },
    #[error("content must be a JSON document")]
    ContentNotJson,
    #[error("chunk_size must be 1 to {CHUNK_SIZE_MAX}, got {got}")]
    ChunkSize { got: u32 },
    #[error("users_per_second must be 1 to {USERS_PER_SECOND_MAX}, got {got}")]
    UsersPerSecond { got: u32 },
}

/// A stored reminder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reminder {
    pub id: ReminderId,
    /// The reminder's subscriber set in the store: random, never reused, so a deleted
    /// reminder's set can be dropped lazily while a new one with the same id starts empty.
    pub uid: u64,
    pub def: ReminderDef,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    /// The next firing, or `None` once a one-shot reminder has fired (or a cron has no
    /// more fire times).
    pub next_fire_ms: Option<UnixMs>,
    /// Firings started so far.
    pub firings: u64,
}

impl Reminder {
    /// A one-shot reminder that has fired takes no more subscribers.
    pub fn has_fired_for_good(&self) -> bool {
        self.next_fire_ms.is_none()
    }
}
