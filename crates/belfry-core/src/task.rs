//! Tasks: what a producer submits, what the store keeps, what a consumer leases.

use bytes::Bytes;

use crate::clock::UnixMs;
use crate::id::TaskId;
use crate::queue::QueueName;

/// Dispatch priority. Among tasks that are due, `High` ones are delivered first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    High,
    #[default]
    Normal,
}

/// How the payload bytes should be presented to consumers: as JSON, or as opaque bytes
/// (base64 in JSON APIs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PayloadKind {
    #[default]
    Json,
    Binary,
}

/// What to do with a task found late (after an outage) by more than `after_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LatePolicy {
    /// Deliver it anyway, however late.
    #[default]
    Fire,
    /// Drop it (it becomes `Skipped`, never delivered).
    Skip { after_ms: u64 },
    /// Move it to the dead letters.
    Dead { after_ms: u64 },
}

/// One header: name and value, both UTF-8.
pub type Header = (String, String);

/// A task as submitted, before the store gives it an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub queue: QueueName,
    pub due_at_ms: UnixMs,
    pub payload: Bytes,
    pub payload_kind: PayloadKind,
    pub headers: Vec<Header>,
    pub priority: Priority,
    pub idempotency_key: Option<String>,
    pub late_policy: LatePolicy,
    /// Where a push sink delivers this task instead of its queue's target: a webhook URL
    /// (checked against the server's target policy on submit and again at connect time).
    /// `None`: the queue's.
    pub target: Option<String>,
}

impl NewTask {
    /// A task with an empty JSON payload, normal priority and no extras: a starting point for
    /// tests and builders.
    pub fn new(queue: QueueName, due_at_ms: UnixMs, payload: impl Into<Bytes>) -> Self {
        NewTask {
            queue,
            due_at_ms,
            payload: payload.into(),
            payload_kind: PayloadKind::Json,
            headers: Vec::new(),
            priority: Priority::Normal,
            idempotency_key: None,
            late_policy: LatePolicy::Fire,
            target: None,
        }
    }
}

/// Where a task is in its life.
///
/// ```text
///  Scheduled ──claim──▶ Leased ──ack──▶ Done
///     ▲  │ │              │ │
///     │  │ └─cancel─▶ Cancelled
///     │  └─found too late (late policy skip)─▶ Skipped
///     └──nack / lease expiry──┘ └─dead_letter─▶ Dead ──redrive──▶ Scheduled
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    Scheduled,
    Leased,
    Done,
    Dead,
    Cancelled,
    /// Finished without delivery: a claim found it later than its late policy allows.
    Skipped,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Leased => "leased",
            TaskState::Done => "done",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
            TaskState::Skipped => "skipped",
        }
    }

    /// Done, dead, cancelled and skipped tasks are finished: no further delivery happens
    /// unless a dead task is redriven.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskState::Done | TaskState::Dead | TaskState::Cancelled | TaskState::Skipped
        )
    }
}

/// Identifies one lease of one task. A new claim of the same task gets a new lease id, so a
/// consumer whose lease expired cannot ack a later delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// A stored task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub id: TaskId,
    pub queue: QueueName,
    /// When it is (next) due. For a leased task: when it was due before it was claimed.
    pub due_at_ms: UnixMs,
    pub payload: Bytes,
    pub payload_kind: PayloadKind,
    /// The store no longer holds the payload (`payload` is then empty and means nothing): a
    /// store may drop a finished task's payload and keep the rest of it readable for a while
    /// (Redis does). Shown without payload, never as an empty one.
    pub payload_dropped: bool,
    pub headers: Vec<Header>,
    pub priority: Priority,
    pub idempotency_key: Option<String>,
    pub late_policy: LatePolicy,
    /// The task's own delivery target, overriding its queue's (see [`NewTask::target`]).
    pub target: Option<String>,
    pub state: TaskState,
    /// Deliveries started so far (a claim counts one).
    pub attempts: u32,
    /// For a leased task, until when the lease holds.
    pub lease_until_ms: Option<UnixMs>,
    /// Why the task is dead, when it is.
    pub dead_reason: Option<String>,
}

/// A task handed to a consumer by a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedTask {
    pub task: Task,
    pub lease_id: LeaseId,
    pub lease_until_ms: UnixMs,
}
