//! What a schedule is, as the service sees it: its id, the definition a client submits, and
//! the stored schedule with its bookkeeping.

use std::fmt;
use std::str::FromStr;

use belfry_core::limits::{HEADERS_MAX, PAYLOAD_BYTES_MAX_DEFAULT, TARGET_LEN_MAX};
use belfry_core::schedule::{MisfirePolicy, ScheduleError, ScheduleSpec, Trigger};
use belfry_core::{Header, LatePolicy, PayloadKind, Priority, QueueName, UnixMs};
use bytes::Bytes;

/// Longest schedule id. Ids appear in idempotency keys (`schedule:{id}:{fire_ms}:{shard}`),
/// which the store limits to 256 bytes: 128 leaves room for the rest.
pub const SCHEDULE_ID_LEN_MAX: usize = 128;

/// Headers a schedule may carry itself: two are reserved for the shard headers.
pub const SCHEDULE_HEADERS_MAX: usize = HEADERS_MAX - 2;

// "schedule:" + id + ":" + 20-digit fire time + ":" + 4-digit shard fits an idempotency key.
const _: () = assert!(
    9 + SCHEDULE_ID_LEN_MAX + 1 + 20 + 1 + 4 <= belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX
);

/// A schedule id: 1 to 128 characters of `[A-Za-z0-9_.-]`, chosen by the client or generated.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScheduleId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule ids are 1 to {SCHEDULE_ID_LEN_MAX} characters of A-Z, a-z, 0-9, '_', '.' and '-', not \".\" or \"..\"; got {got:?}")]
pub struct InvalidScheduleId {
    pub got: String,
}

impl ScheduleId {
    pub fn new(id: impl Into<String>) -> Result<ScheduleId, InvalidScheduleId> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= SCHEDULE_ID_LEN_MAX
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            && !belfry_core::limits::is_dot_segment(&id);
        if valid {
            Ok(ScheduleId(id))
        } else {
            Err(InvalidScheduleId {
                got: id.chars().take(SCHEDULE_ID_LEN_MAX + 8).collect(),
            })
        }
    }

    /// A fresh random id (32 hex digits).
    pub fn generate() -> ScheduleId {
        ScheduleId(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ScheduleId {
    type Err = InvalidScheduleId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScheduleId::new(s)
    }
}

impl fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ScheduleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScheduleId({:?})", self.0)
    }
}

/// When a schedule fires, as submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerDef {
    /// A cron expression (5 or 6 fields, or an alias) in an IANA time zone.
    Cron {
        expression: String,
        timezone: String,
    },
    /// Every `every_ms`, anchored at `start_at_ms` or else at the creation time.
    Every { every_ms: u64 },
}

/// A schedule as a client defines it (the body of `POST /v1/schedules`, minus the id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleDef {
    pub queue: QueueName,
    pub trigger: TriggerDef,
    pub start_at_ms: Option<UnixMs>,
    pub end_at_ms: Option<UnixMs>,
    pub payload: Bytes,
    pub payload_kind: PayloadKind,
    pub headers: Vec<Header>,
    pub priority: Priority,
    pub late_policy: LatePolicy,
    /// The firings' own delivery target (`NewTask::target`): a webhook URL their tasks go to
    /// instead of the queue's. The API checks it; this crate only bounds its length.
    pub target: Option<String>,
    /// Tasks per firing, 1 to `SHARD_COUNT_MAX`.
    pub shard_count: u32,
    pub misfire: MisfirePolicy,
    pub paused: bool,
}

impl ScheduleDef {
    /// A cron schedule with defaults: empty JSON payload, one shard, `fire_once`, active.
    pub fn cron(queue: QueueName, expression: &str, timezone: &str) -> ScheduleDef {
        ScheduleDef::with_trigger(
            queue,
            TriggerDef::Cron {
                expression: expression.to_string(),
                timezone: timezone.to_string(),
            },
        )
    }

    /// An interval schedule with the same defaults.
    pub fn every(queue: QueueName, every_ms: u64) -> ScheduleDef {
        ScheduleDef::with_trigger(queue, TriggerDef::Every { every_ms })
    }

    fn with_trigger(queue: QueueName, trigger: TriggerDef) -> ScheduleDef {
        ScheduleDef {
            queue,
            trigger,
            start_at_ms: None,
            end_at_ms: None,
            payload: Bytes::new(),
            payload_kind: PayloadKind::Json,
            headers: Vec::new(),
            priority: Priority::Normal,
            late_policy: LatePolicy::Fire,
            target: None,
            shard_count: 1,
            misfire: MisfirePolicy::default(),
            paused: false,
        }
    }

    /// Validates everything but the queue's existence and builds the spec. `created_at_ms`
    /// anchors an interval that has no `start_at_ms`.
    pub fn to_spec(&self, created_at_ms: UnixMs) -> Result<ScheduleSpec, InvalidSchedule> {
        if self.payload.len() > PAYLOAD_BYTES_MAX_DEFAULT {
            return Err(InvalidSchedule::PayloadTooLarge {
                got: self.payload.len(),
            });
        }
        self.check_headers()?;
        if let Some(target) = &self.target {
            if target.len() > TARGET_LEN_MAX {
                return Err(InvalidSchedule::TargetTooLong { got: target.len() });
            }
        }
        let trigger = match &self.trigger {
            TriggerDef::Cron {
                expression,
                timezone,
            } => Trigger::cron(expression, timezone)?,
            TriggerDef::Every { every_ms } => {
                Trigger::every(*every_ms, self.start_at_ms.unwrap_or(created_at_ms))?
            }
        };
        Ok(ScheduleSpec::new(
            trigger,
            self.start_at_ms,
            self.end_at_ms,
            self.shard_count,
            self.misfire,
        )?)
    }

    fn check_headers(&self) -> Result<(), InvalidSchedule> {
        if self.headers.len() > SCHEDULE_HEADERS_MAX {
            return Err(InvalidSchedule::Headers(format!(
                "at most {SCHEDULE_HEADERS_MAX} headers, got {}",
                self.headers.len()
            )));
        }
        for (name, value) in &self.headers {
            belfry_core::headers::check(name, value).map_err(InvalidSchedule::Headers)?;
        }
        Ok(())
    }
}

/// A definition that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSchedule {
    #[error(transparent)]
    Spec(#[from] ScheduleError),
    #[error("payload is {got} bytes, more than the {PAYLOAD_BYTES_MAX_DEFAULT} allowed")]
    PayloadTooLarge { got: usize },
    #[error("invalid headers: {0}")]
    Headers(String),
    #[error("target is {got} bytes long, more than the {TARGET_LEN_MAX} allowed")]
    TargetTooLong { got: usize },
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: ScheduleId,
    pub def: ScheduleDef,
    /// The validated rule built from `def`.
    pub spec: ScheduleSpec,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    /// No fire time at or before this instant ever fires: the creation time, or the last
    /// resume or replace (a paused period is not replayed as misfires).
    pub not_before_ms: UnixMs,
    /// The last fire time handled (fired or dropped by the misfire policy), never below
    /// `not_before_ms`.
    pub cursor_ms: UnixMs,
}

impl Schedule {
    /// The next fire time, or `None` when paused or finished.
    pub fn next_fire_ms(&self) -> Option<UnixMs> {
        if self.def.paused {
            return None;
        }
        self.spec.next_after(self.cursor_ms)
    }
}

/// One upcoming fire time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireTime {
    pub at_ms: UnixMs,
    /// RFC 3339 in UTC, e.g. `2026-03-08T07:00:00Z`.
    pub utc: String,
    /// RFC 9557 in the schedule's zone (UTC for intervals), e.g.
    /// `2026-03-08T03:00:00-04:00[America/New_York]`.
    pub local: String,
}
