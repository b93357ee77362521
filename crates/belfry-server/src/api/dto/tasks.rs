//! Task shapes: submit (one or a batch), views, due times.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use belfry_core::{LatePolicy, NewTask, PayloadKind, Priority, QueueName, Task, UnixMs};
use belfry_sinks::webhook::redact_url_text;
use belfry_sinks::{Sink, SinkError};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::super::error::{ApiError, ErrorCode};
use super::super::payload::payload_from;
use super::{invalid, late_policy_from, late_policy_view, LateBody, LatePolicyName, PriorityBody};
use crate::api::extract::rfc3339_ms;
#[cfg(test)]
use {crate::api::error::ErrorBody, belfry_core::TaskId};

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Limits that apply to submitted tasks (from the server configuration).
#[derive(Debug, Clone, Copy)]
pub struct TaskLimits {
    pub payload_bytes_max: usize,
    pub horizon_ms: u64,
    /// The queue's late policy, for tasks that name none.
    pub late_default: LatePolicy,
}

/// Whether the queue takes tasks with their own target, and what checks one (the submit's
/// intake checks a task's `target` with it before the rest of the task is converted).
pub enum TaskTargets {
    /// The queue's push sink, which checks a target against what it can deliver to.
    Sink(Arc<dyn Sink>),
    /// Why the queue takes none (a pull queue, or a push queue without a running sink).
    Refused(String),
}

impl TaskTargets {
    /// Checks `target` as the task's own delivery target.
    pub fn check(&self, target: &str) -> Result<(), ApiError> {
        let sink = match self {
            TaskTargets::Refused(why) => {
                return Err(invalid(ErrorCode::TargetNotSupported, why.clone()))
            }
            TaskTargets::Sink(sink) => sink,
        };
        match sink.check_task_target(target) {
            Ok(()) => Ok(()),
            Err(e @ SinkError::TaskTargetNotSupported) => Err(invalid(
                ErrorCode::TargetNotSupported,
                format!("target: {e}"),
            )),
            Err(e) => Err(invalid(
                ErrorCode::WebhookTargetRefused,
                format!("target: {e}"),
            )),
        }
    }
}

/// When a task is due: at most one of the three.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DueBody {
    pub delay_ms: Option<i64>,
    pub run_at: Option<String>,
    pub run_at_ms: Option<i64>,
}

impl DueBody {
    /// The due time in unix ms, `None` when no field is set. A time in the past is due now,
    /// and stored as now: the lateness a delivery reports, and a late policy, then count from
    /// when the task was accepted, not from a moment before it existed.
    pub fn resolve(&self, now_ms: UnixMs, horizon_ms: u64) -> Result<Option<UnixMs>, ApiError> {
        let set = [
            self.delay_ms.is_some(),
            self.run_at.is_some(),
            self.run_at_ms.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        if set > 1 {
            return Err(invalid(
                ErrorCode::ConflictingDueTime,
                "give at most one of delay_ms, run_at and run_at_ms",
            ));
        }
        let due = if let Some(delay) = self.delay_ms {
            let delay = u64::try_from(delay).map_err(|_| {
                invalid(
                    ErrorCode::InvalidDueTime,
                    format!("delay_ms must not be negative, got {delay}"),
                )
            })?;
            now_ms.saturating_add(delay)
        } else if let Some(text) = &self.run_at {
            let at = rfc3339_ms(text)
                .map_err(|e| invalid(ErrorCode::InvalidDueTime, format!("run_at {e}")))?;
            // Times before 1970 are simply in the past: due now. One past the last instant
            // belfry represents is past any horizon.
            at.map_or(u64::MAX, |ms| u64::try_from(ms).unwrap_or(0))
        } else if let Some(at) = self.run_at_ms {
            u64::try_from(at).map_err(|_| {
                invalid(
                    ErrorCode::InvalidDueTime,
                    format!("run_at_ms is unix milliseconds and must not be negative, got {at}"),
                )
            })?
        } else {
            return Ok(None);
        };
        let limit = now_ms.saturating_add(horizon_ms);
        if due > limit {
            let when = if due == u64::MAX {
                format!(
                    "after {}, the latest time belfry takes",
                    crate::api::extract::LATEST_TIME
                )
            } else {
                format!("at {due} ms")
            };
            return Err(invalid(
                ErrorCode::BeyondHorizon,
                format!(
                    "the task would be due {when}, beyond the server's horizon of {horizon_ms} ms from now (until {limit})"
                ),
            ));
        }
        Ok(Some(due.max(now_ms)))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskBody<'a> {
    /// The producer's JSON text, borrowed from the request body and copied once, into the
    /// task's payload.
    #[serde(borrow)]
    pub payload: Option<&'a RawValue>,
    pub payload_base64: Option<String>,
    pub delay_ms: Option<i64>,
    pub run_at: Option<String>,
    pub run_at_ms: Option<i64>,
    pub idempotency_key: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub priority: Option<PriorityBody>,
    pub late: Option<LateBody>,
    pub late_policy: Option<LatePolicyName>,
    pub late_after_ms: Option<u64>,
    pub target: Option<String>,
}

impl TaskBody<'_> {
    /// The task, its fields checked; a `target` is taken as it is (the intake checked it
    /// against the queue's sink).
    pub fn into_new_task(
        self,
        queue: &QueueName,
        now_ms: UnixMs,
        limits: TaskLimits,
    ) -> Result<NewTask, ApiError> {
        let due = DueBody {
            delay_ms: self.delay_ms,
            run_at: self.run_at,
            run_at_ms: self.run_at_ms,
        };
        let due_at_ms = due.resolve(now_ms, limits.horizon_ms)?.unwrap_or(now_ms);
        let (payload, kind) = payload_from(
            self.payload,
            self.payload_base64.as_deref(),
            limits.payload_bytes_max,
        )?;
        let headers = self.headers.unwrap_or_default();
        belfry_core::headers::check_all(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .map_err(|problem| invalid(ErrorCode::InvalidRequest, format!("headers: {problem}")))?;
        if let Some(key) = &self.idempotency_key {
            crate::api::extract::check_idempotency_key(key)
                .map_err(|why| invalid(ErrorCode::InvalidRequest, why))?;
        }
        Ok(NewTask {
            queue: queue.clone(),
            due_at_ms,
            payload,
            payload_kind: kind,
            headers: headers.into_iter().collect(),
            priority: match self.priority {
                Some(PriorityBody::High) => Priority::High,
                Some(PriorityBody::Normal) | None => Priority::Normal,
            },
            idempotency_key: self.idempotency_key,
            late_policy: late_policy_from(self.late, self.late_policy, self.late_after_ms)?
                .unwrap_or(limits.late_default),
            target: self.target,
        })
    }
}

/// A batch read in one pass, every task parsed as it is read: the common case, where every
/// task is valid. Any error (one bad task fails the whole pass) sends the body to `BatchBody`,
/// which reports each task's own error; the cost of reading the body twice is then paid only
/// by bad batches.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchTasks<'a> {
    #[serde(borrow)]
    pub tasks: Vec<TaskBody<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody<'a> {
    /// Each task is parsed on its own so one bad task fails alone; the raw texts borrow from
    /// the request body rather than being copied out of it first.
    #[serde(borrow)]
    pub tasks: Vec<&'a RawValue>,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct Created {
    pub id: String,
    pub queue: String,
    pub due_at_ms: UnixMs,
    pub state: &'static str,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
impl Created {
    pub fn new(id: TaskId, queue: &QueueName, due_at_ms: UnixMs) -> Self {
        Created {
            id: id.to_string(),
            queue: queue.to_string(),
            due_at_ms,
            state: "scheduled",
        }
    }
}

/// The query of a listing of tasks: `GET /v1/queues/{queue}/tasks` (live tasks) and
/// `GET /v1/queues/{queue}/dead` (dead letters).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskPageQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
    /// `false`: the tasks without `payload` / `payload_base64`, for a listing of ids and
    /// reasons (a page of 1,000 payloads at the size limit is about a gigabyte).
    pub payload: Option<bool>,
    /// `true`: each task's own `target` whole, credentials and query string included, as a
    /// lease shows it (for an export that must put the tasks back as they were).
    pub full_target: Option<bool>,
}

/// A page of tasks, and where the next one starts.
#[derive(Debug, Serialize)]
pub struct TaskPage {
    pub tasks: Vec<TaskView>,
    /// Pass as `after` to read the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

impl TaskPage {
    /// The page of `tasks`, shown as `query` asks; `more`: tasks may follow it (a page ends
    /// early once its payloads are large, so a short page is not always the last).
    pub fn new(tasks: &[Task], more: bool, query: &TaskPageQuery) -> Self {
        let next_after = match more {
            true => tasks.last().map(|t| t.id.to_string()),
            false => None,
        };
        let payload = query.payload != Some(false);
        let tasks = tasks
            .iter()
            .map(|task| {
                let mut view = TaskView::shown(task, payload);
                if query.full_target == Some(true) {
                    view.target.clone_from(&task.target);
                }
                view
            })
            .collect();
        TaskPage { tasks, next_after }
    }
}

/// A payload as JSON: the producer's JSON as is, or bytes in base64.
#[derive(Debug, Serialize)]
pub struct PayloadView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
}

impl PayloadView {
    /// Neither field: the store dropped the payload (a finished task on Redis), which an
    /// empty `payload_base64` would misstate as an empty payload.
    pub fn dropped() -> Self {
        PayloadView {
            payload: None,
            payload_base64: None,
        }
    }

    pub fn new(kind: PayloadKind, bytes: &Bytes) -> Self {
        let json = match kind {
            PayloadKind::Json => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| RawValue::from_string(text.to_owned()).ok()),
            PayloadKind::Binary => None,
        };
        match json {
            Some(json) => PayloadView {
                payload: Some(json),
                payload_base64: None,
            },
            // Stored bytes that are not JSON (a store bug, or an old format) are still shown.
            None => PayloadView {
                payload: None,
                payload_base64: Some(BASE64.encode(bytes)),
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TaskView {
    pub id: String,
    pub queue: String,
    pub state: &'static str,
    pub attempts: u32,
    pub due_at_ms: UnixMs,
    pub priority: &'static str,
    /// `fire`, `skip` or `dead`, with `late_after_ms` for the last two.
    pub late_policy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_after_ms: Option<u64>,
    pub headers: BTreeMap<String, String>,
    #[serde(flatten)]
    pub payload: PayloadView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The task's own target, shown as a queue's webhook URL is: without credentials or
    /// query string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<UnixMs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
}

pub(super) fn priority_str(p: Priority) -> &'static str {
    match p {
        Priority::High => "high",
        Priority::Normal => "normal",
    }
}

impl TaskView {
    pub fn new(task: &Task) -> Self {
        Self::shown(task, true)
    }

    /// The task, with its payload only when `payload` (a dead-letter listing may leave it
    /// out: it is neither copied nor encoded then).
    pub fn shown(task: &Task, payload: bool) -> Self {
        let (late_policy, late_after_ms) = late_policy_view(task.late_policy);
        TaskView {
            id: task.id.to_string(),
            queue: task.queue.to_string(),
            state: task.state.as_str(),
            attempts: task.attempts,
            due_at_ms: task.due_at_ms,
            priority: priority_str(task.priority),
            late_policy,
            late_after_ms,
            headers: task.headers.iter().cloned().collect(),
            payload: if task.payload_dropped || !payload {
                PayloadView::dropped()
            } else {
                PayloadView::new(task.payload_kind, &task.payload)
            },
            idempotency_key: task.idempotency_key.clone(),
            target: task.target.as_deref().map(redact_url_text),
            lease_until_ms: task.lease_until_ms,
            dead_reason: task.dead_reason.clone(),
            duplicate: None,
        }
    }

    pub fn duplicate(task: &Task) -> Self {
        TaskView {
            duplicate: Some(true),
            ..TaskView::new(task)
        }
    }
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
/// One entry of a batch submit's results.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum BatchResult {
    Created(Created),
    Duplicate(Box<TaskView>),
    Error { error: ErrorBody },
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct BatchResults<T> {
    pub results: Vec<T>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(json: &str) -> Result<Option<UnixMs>, ErrorCode> {
        let body: DueBody = serde_json::from_str(json).unwrap();
        body.resolve(1_000, 10_000).map_err(|e| e.code)
    }

    #[test]
    fn check_due_times() {
        assert_eq!(due("{}"), Ok(None));
        assert_eq!(due(r#"{"delay_ms": 5}"#), Ok(Some(1_005)));
        // In the past: due now (1,000 here), not at 7.
        assert_eq!(due(r#"{"run_at_ms": 7}"#), Ok(Some(1_000)));
        assert_eq!(due(r#"{"run_at_ms": 1001}"#), Ok(Some(1_001)));
        assert_eq!(
            due(r#"{"run_at": "1960-01-01T00:00:00Z"}"#),
            Ok(Some(1_000))
        );
        assert_eq!(
            due(r#"{"run_at": "1970-01-01T00:00:02Z"}"#),
            Ok(Some(2_000))
        );
        assert_eq!(due(r#"{"delay_ms": -1}"#), Err(ErrorCode::InvalidDueTime));
        assert_eq!(due(r#"{"run_at_ms": -1}"#), Err(ErrorCode::InvalidDueTime));
        assert_eq!(
            due(r#"{"run_at": "tomorrow"}"#),
            Err(ErrorCode::InvalidDueTime)
        );
        assert_eq!(
            due(r#"{"delay_ms": 1, "run_at_ms": 1}"#),
            Err(ErrorCode::ConflictingDueTime)
        );
        assert_eq!(due(r#"{"delay_ms": 10001}"#), Err(ErrorCode::BeyondHorizon));
        assert_eq!(due(r#"{"delay_ms": 10000}"#), Ok(Some(11_000)));
        // Past the last instant belfry represents: said in words, not as u64::MAX ms.
        let body: DueBody = serde_json::from_str(r#"{"run_at": "9999-12-31T23:59:59Z"}"#).unwrap();
        let error = body.resolve(1_000, 10_000).unwrap_err();
        assert!(
            error.message.contains("due after 9999-12-30T22:00:00Z"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_batch_read_in_one_pass_reads_as_task_by_task() {
        let body = r#"{"tasks": [
            {"payload": {"a": [1, 2]}, "delay_ms": 5},
            {"payload": null, "payload_base64": "AAE="},
            {"payload": "es\"caped\u00e9", "headers": {"b": "2", "a": "\n"}},
            {"payload":   [ ] , "run_at": "2030-01-01T00:00:00Z", "priority": "high"},
            {"idempotency_key": "k\u0000", "late_policy": "skip", "late_after_ms": 3},
            {"late": {"policy": "dead", "after_ms": 9}, "run_at_ms": 1},
            {}
        ]}"#;
        let fast: BatchTasks = serde_json::from_str(body).unwrap();
        let slow: BatchBody = serde_json::from_str(body).unwrap();
        let slow: Vec<TaskBody> = slow
            .tasks
            .iter()
            .map(|raw| serde_json::from_str(raw.get()).unwrap())
            .collect();
        assert_eq!(format!("{:?}", fast.tasks), format!("{slow:?}"));
        // One bad task fails the one-pass read (the handler then reads task by task).
        let bad = r#"{"tasks": [{"payload": 1}, {"delay_ms": "soon"}]}"#;
        assert!(serde_json::from_str::<BatchTasks>(bad).is_err());
        assert!(serde_json::from_str::<BatchBody>(bad).is_ok());
    }

    #[test]
    fn json_payload_is_kept_verbatim() {
        let body: TaskBody = serde_json::from_str(r#"{"payload": {"a": [1, 2]}}"#).unwrap();
        let limits = TaskLimits {
            payload_bytes_max: 100,
            horizon_ms: 100,
            late_default: LatePolicy::Fire,
        };
        let task = body
            .into_new_task(&QueueName::new("q").unwrap(), 5, limits)
            .unwrap();
        assert_eq!(&task.payload[..], br#"{"a": [1, 2]}"#);
        assert_eq!(task.due_at_ms, 5);
    }

    /// A payload the store dropped (a finished task on Redis) is left out, where an empty
    /// payload of bytes is shown as one.
    #[test]
    fn a_dropped_payload_is_left_out_not_shown_empty() {
        let mut task = Task {
            id: belfry_core::TaskId::from_u128(7),
            queue: QueueName::new("q").unwrap(),
            due_at_ms: 5,
            payload: Bytes::new(),
            payload_kind: PayloadKind::Binary,
            payload_dropped: false,
            headers: Vec::new(),
            priority: Priority::Normal,
            idempotency_key: Some("k".into()),
            late_policy: LatePolicy::Fire,
            target: None,
            state: belfry_core::TaskState::Done,
            attempts: 1,
            lease_until_ms: None,
            dead_reason: None,
        };
        let shown = serde_json::to_value(TaskView::new(&task)).unwrap();
        assert_eq!(shown["payload_base64"], "", "{shown}");
        task.payload_dropped = true;
        for view in [TaskView::new(&task), TaskView::duplicate(&task)] {
            let shown = serde_json::to_value(view).unwrap();
            assert!(shown.get("payload").is_none(), "{shown}");
            assert!(shown.get("payload_base64").is_none(), "{shown}");
            assert_eq!(shown["state"], "done", "{shown}");
        }
    }
}
