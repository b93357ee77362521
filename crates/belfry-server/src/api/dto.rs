//! The JSON shapes of API v1, and their conversion to and from domain types.

use std::collections::BTreeMap;

use base64::Engine as _;
use belfry_core::{LatePolicy, NewTask, PayloadKind, Priority, QueueName, Task, UnixMs};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::error::{ApiError, ErrorCode};
use super::extract::rfc3339_ms;
use super::payload::payload_from;
use crate::queues::{Delivery, QueueConfig};
use crate::service::QueuePatch;
#[cfg(test)]
use {super::error::ErrorBody, belfry_core::LeasedTask, belfry_core::TaskId};

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn invalid(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError::new(code, message)
}

// ---- queues ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueBody {
    pub rate_per_s: Option<f64>,
    pub burst: Option<u32>,
    pub max_in_flight: Option<u32>,
    pub retry: Option<RetryBody>,
    pub delivery: Option<DeliveryBody>,
    pub paused: Option<bool>,
    /// The late policy of tasks that name none (default `fire`), in either of the forms
    /// tasks and schedules accept: `late_policy` (with `late_after_ms`), or `late`.
    pub late_policy: Option<LatePolicyName>,
    pub late_after_ms: Option<u64>,
    pub late: Option<LateBody>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    pub max_attempts: Option<u32>,
    pub backoff_initial_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
}

/// A queue's `delivery`: `{"type": "pull"}`, or a push sink's spec (`belfry_sinks::SinkSpec`,
/// tagged by `type`: `webhook`, and the stream sinks the server is built with).
#[derive(Debug)]
pub enum DeliveryBody {
    Pull,
    Push(belfry_sinks::SinkSpec),
    /// A stream delivery whose fields do not fit (missing, unknown or of the wrong type), and
    /// why: refused as `invalid_delivery`, like its other refusals (an unknown connection, an
    /// empty subject), not as a body-shape error.
    Invalid(String),
}

/// A stream delivery's spec from its object (`type` is `kind`), or why it does not fit,
/// naming the field.
fn stream_spec(
    kind: &str,
    mut value: serde_json::Value,
) -> Option<Result<belfry_sinks::SinkSpec, String>> {
    use belfry_sinks::SinkSpec;
    fn fields<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
        serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            if path.is_empty() || path == "." {
                format!("delivery: {inner}")
            } else {
                format!("delivery.{path}: {inner}")
            }
        })
    }
    if let Some(object) = value.as_object_mut() {
        object.remove("type");
    }
    Some(match kind {
        "redis_stream" => fields(value).map(SinkSpec::RedisStream),
        "nats" => fields(value).map(SinkSpec::Nats),
        "kafka" => fields(value).map(SinkSpec::Kafka),
        _ => return None,
    })
}

impl<'de> Deserialize<'de> for DeliveryBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let value = serde_json::Value::deserialize(deserializer)?;
        if !value.is_object() {
            return Err(D::Error::custom(format!(
                "must be an object with a \"type\": {{\"type\": \"pull\"}}, or a push \
                 sink's such as {{\"type\": \"webhook\", \"url\": ...}}; got {value}"
            )));
        }
        let is_pull = value.get("type").and_then(|t| t.as_str()) == Some("pull");
        if is_pull {
            return match value.as_object().map(|o| o.len()) {
                Some(1) => Ok(DeliveryBody::Pull),
                _ => Err(D::Error::custom(
                    "a pull delivery takes no fields besides \"type\"",
                )),
            };
        }
        let kind = value
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_default();
        if let Some(spec) = stream_spec(kind, value.clone()) {
            return Ok(spec.map_or_else(DeliveryBody::Invalid, DeliveryBody::Push));
        }
        // The path already names `delivery`.
        belfry_sinks::SinkSpec::deserialize(value)
            .map(DeliveryBody::Push)
            .map_err(|e| D::Error::custom(format!("{e} (or \"pull\" for a pull queue)")))
    }
}

impl QueueBody {
    pub fn into_patch(self) -> Result<QueuePatch, ApiError> {
        if let Some(DeliveryBody::Invalid(message)) = self.delivery {
            return Err(invalid(ErrorCode::InvalidDelivery, message));
        }
        let retry = self.retry.unwrap_or_default();
        let late_policy = late_policy_from(self.late, self.late_policy, self.late_after_ms)?;
        Ok(QueuePatch {
            rate_per_s: self.rate_per_s,
            burst: self.burst,
            max_in_flight: self.max_in_flight,
            max_attempts: retry.max_attempts,
            backoff_initial_ms: retry.backoff_initial_ms,
            backoff_max_ms: retry.backoff_max_ms,
            delivery: self.delivery.and_then(|d| match d {
                DeliveryBody::Pull => Some(Delivery::Pull),
                DeliveryBody::Push(spec) => Some(Delivery::Push(spec)),
                DeliveryBody::Invalid(_) => None,
            }),
            paused: self.paused,
            late_policy,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct QueueView {
    pub name: String,
    pub rate_per_s: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub retry: RetryView,
    pub delivery: DeliveryView,
    pub paused: bool,
    pub late_policy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead: Option<u64>,
    /// A push queue's delivery target as its sink last saw it: `reachable`, `unknown`, or
    /// `unreachable: <why>` (no credentials).
    #[serde(rename = "delivery_health", skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// Things the caller should know that did not stop the request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct RetryView {
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

/// Secrets are never echoed back (`secret_set` says whether there is one, for a sink that
/// takes one: a webhook), nor credentials or query strings in URLs.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum DeliveryView {
    Pull {
        #[serde(rename = "type")]
        kind: &'static str,
    },
    Push {
        #[serde(flatten)]
        spec: belfry_sinks::SinkSpec,
        #[serde(skip_serializing_if = "Option::is_none")]
        secret_set: Option<bool>,
    },
}

impl QueueView {
    pub fn new(
        name: &QueueName,
        config: &QueueConfig,
        counts: Option<belfry_store::QueueCounts>,
    ) -> Self {
        let (late_policy, late_after_ms) = late_policy_view(config.late_policy);
        QueueView {
            name: name.to_string(),
            rate_per_s: config.rate_per_s,
            burst: config.effective_burst() as u32,
            max_in_flight: config.max_in_flight,
            retry: RetryView {
                max_attempts: config.retry.max_attempts,
                backoff_initial_ms: config.retry.backoff_initial_ms,
                backoff_max_ms: config.retry.backoff_max_ms,
            },
            delivery: match &config.delivery {
                Delivery::Pull => DeliveryView::Pull { kind: "pull" },
                Delivery::Push(spec) => DeliveryView::Push {
                    spec: spec.redacted(),
                    secret_set: spec.secret_set(),
                },
            },
            paused: config.paused,
            late_policy,
            late_after_ms,
            pending: counts.map(|c| c.pending),
            due: counts.map(|c| c.due),
            in_flight: counts.map(|c| c.in_flight),
            dead: counts.map(|c| c.dead),
            health: None,
            warnings: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct QueueList {
    pub queues: Vec<QueueView>,
    /// Pass as `after` to read the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `GET /v1/queues?after=<name>&limit=<n>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueListQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
}

// ---- tasks ----

/// Limits that apply to submitted tasks (from the server configuration).
#[derive(Debug, Clone, Copy)]
pub struct TaskLimits {
    pub payload_bytes_max: usize,
    pub horizon_ms: u64,
    /// The queue's late policy, for tasks that name none.
    pub late_default: LatePolicy,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriorityBody {
    High,
    Normal,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(tag = "policy", rename_all = "lowercase", deny_unknown_fields)]
pub enum LateBody {
    Fire,
    Skip { after_ms: u64 },
    Dead { after_ms: u64 },
}

impl From<LateBody> for LatePolicy {
    fn from(body: LateBody) -> Self {
        match body {
            LateBody::Fire => LatePolicy::Fire,
            LateBody::Skip { after_ms } => LatePolicy::Skip { after_ms },
            LateBody::Dead { after_ms } => LatePolicy::Dead { after_ms },
        }
    }
}

/// `late_policy`: what to do with a task found later than `late_after_ms` (after an outage).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatePolicyName {
    Fire,
    Skip,
    Dead,
}

/// A late policy given in its flat form (`late_policy` + `late_after_ms`) or its object form
/// (`late`), at most one of them. `None` when neither is given.
pub fn late_policy_from(
    late: Option<LateBody>,
    name: Option<LatePolicyName>,
    after_ms: Option<u64>,
) -> Result<Option<LatePolicy>, ApiError> {
    let bad = |message: &str| Err(invalid(ErrorCode::InvalidRequest, message.to_owned()));
    match (late, name, after_ms) {
        (None, None, None) => Ok(None),
        (Some(body), None, None) => Ok(Some(body.into())),
        (Some(_), _, _) => bad("give the late policy as late_policy (with late_after_ms) or as late, not both"),
        (None, None, Some(_)) => bad("late_after_ms needs late_policy \"skip\" or \"dead\""),
        (None, Some(LatePolicyName::Fire), None) => Ok(Some(LatePolicy::Fire)),
        (None, Some(LatePolicyName::Fire), Some(_)) => {
            bad("late_after_ms applies only to late_policy \"skip\" or \"dead\"; \"fire\" delivers however late")
        }
        (None, Some(LatePolicyName::Skip), Some(after_ms)) => Ok(Some(LatePolicy::Skip { after_ms })),
        (None, Some(LatePolicyName::Dead), Some(after_ms)) => Ok(Some(LatePolicy::Dead { after_ms })),
        (None, Some(_), None) => bad(
            "late_policy \"skip\" and \"dead\" need late_after_ms: how late (in ms) a task may be and still be delivered",
        ),
    }
}

/// The flat form of a late policy, for views.
pub fn late_policy_view(policy: LatePolicy) -> (&'static str, Option<u64>) {
    match policy {
        LatePolicy::Fire => ("fire", None),
        LatePolicy::Skip { after_ms } => ("skip", Some(after_ms)),
        LatePolicy::Dead { after_ms } => ("dead", Some(after_ms)),
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
                    super::extract::LATEST_TIME
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
}

impl TaskBody<'_> {
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
            super::extract::check_idempotency_key(key)
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<UnixMs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
}

fn priority_str(p: Priority) -> &'static str {
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

// ---- leases ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    pub max: Option<u64>,
    pub visibility_ms: Option<u64>,
    pub wait_ms: Option<u64>,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct LeasedView {
    pub id: String,
    pub queue: String,
    #[serde(flatten)]
    pub payload: PayloadView,
    pub headers: BTreeMap<String, String>,
    pub attempt: u32,
    pub due_at_ms: UnixMs,
    pub priority: &'static str,
    pub lease_id: String,
    pub lease_until_ms: UnixMs,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
impl LeasedView {
    pub fn new(leased: &LeasedTask) -> Self {
        let task = &leased.task;
        LeasedView {
            id: task.id.to_string(),
            queue: task.queue.to_string(),
            payload: PayloadView::new(task.payload_kind, &task.payload),
            headers: task.headers.iter().cloned().collect(),
            attempt: task.attempts,
            due_at_ms: task.due_at_ms,
            priority: priority_str(task.priority),
            lease_id: leased.lease_id.0.to_string(),
            lease_until_ms: leased.lease_until_ms,
        }
    }
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct LeasedList {
    pub tasks: Vec<LeasedView>,
}

/// A lease id: a string of digits (numbers are accepted too). The text is parsed while the
/// body is read, so a valid id costs no allocation (batch acks carry up to 1,000 of them); a
/// text that is not one is kept for the error message, which reports it per ack.
#[derive(Debug)]
pub enum LeaseIdBody {
    Valid(u64),
    Invalid(String),
}

/// What serde said when the untagged enum this type replaced matched neither a string nor a
/// number; kept so error messages did not change.
const LEASE_ID_MISMATCH: &str = "data did not match any variant of untagged enum LeaseIdBody";

impl<'de> Deserialize<'de> for LeaseIdBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = LeaseIdBody;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a lease id: a string of digits or a number")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<LeaseIdBody, E> {
                Ok(match text.parse() {
                    Ok(n) => LeaseIdBody::Valid(n),
                    Err(_) => LeaseIdBody::Invalid(text.chars().take(64).collect()),
                })
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<LeaseIdBody, E> {
                Ok(LeaseIdBody::Valid(n))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<LeaseIdBody, E> {
                u64::try_from(n)
                    .map(LeaseIdBody::Valid)
                    .map_err(|_| E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                _: A,
            ) -> Result<LeaseIdBody, A::Error> {
                Err(serde::de::Error::custom(LEASE_ID_MISMATCH))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                _: A,
            ) -> Result<LeaseIdBody, A::Error> {
                Err(serde::de::Error::custom(LEASE_ID_MISMATCH))
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

impl LeaseIdBody {
    pub fn parse(&self) -> Result<belfry_core::LeaseId, ApiError> {
        match self {
            LeaseIdBody::Valid(n) => Ok(belfry_core::LeaseId(*n)),
            LeaseIdBody::Invalid(text) => Err(invalid(
                ErrorCode::InvalidLeaseId,
                format!("lease_id is the string of digits a lease call returned, got {text:?}"),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    pub lease_id: LeaseIdBody,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NackBody {
    pub lease_id: LeaseIdBody,
    pub delay_ms: Option<i64>,
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    pub lease_id: LeaseIdBody,
    pub visibility_ms: Option<u64>,
}

/// A batch ack, borrowing its task ids from the request body (no string is copied unless it
/// has escapes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAckBody<'a> {
    #[serde(borrow)]
    pub acks: Vec<BatchAckItem<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAckItem<'a> {
    #[serde(borrow)]
    pub id: std::borrow::Cow<'a, str>,
    pub lease_id: LeaseIdBody,
}

#[derive(Debug, Serialize)]
pub struct TaskStateView {
    pub id: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at_ms: Option<UnixMs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<UnixMs>,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct AckResult {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

// ---- dead letters ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
    /// `false`: the tasks without `payload` / `payload_base64`, for a listing of ids and
    /// reasons (a page of 1,000 payloads at the size limit is about a gigabyte).
    pub payload: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct DeadList {
    pub tasks: Vec<TaskView>,
    /// Pass as `after` to read the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
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
