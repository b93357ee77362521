//! The JSON shapes of API v1, and their conversion to and from domain types.

use belfry_core::{LatePolicy, QueueName};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorCode};
use crate::queues::{Delivery, QueueConfig};
use crate::service::QueuePatch;

mod dead;
mod leases;
mod tasks;

pub use dead::*;
pub use leases::*;
pub use tasks::*;

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
        if kind == "webhook" {
            // Parsed without its tag, so that a field of the wrong type is named (the tagged
            // enum's parse buffers the object and loses the path); the path already names
            // `delivery`.
            let mut fields = value;
            if let Some(object) = fields.as_object_mut() {
                object.remove("type");
            }
            return serde_path_to_error::deserialize::<_, belfry_sinks::WebhookSpec>(fields)
                .map(|spec| DeliveryBody::Push(belfry_sinks::SinkSpec::Webhook(spec)))
                .map_err(|e| {
                    let path = e.path().to_string();
                    let inner = e.into_inner();
                    match path.as_str() {
                        "" | "." => D::Error::custom(inner),
                        _ => D::Error::custom(format!("{path}: {inner}")),
                    }
                });
        }
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
    /// The due time of the oldest due task not handed out yet: present while `due` is not 0
    /// (now − this is what `belfry_queue_oldest_due_age_seconds` shows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_due_ms: Option<u64>,
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
/// takes one: a webhook; `headers_set` names a webhook's fixed headers, without values), nor
/// credentials or query strings in URLs.
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
        /// Only while a webhook's secret is rotated: `true`.
        #[serde(skip_serializing_if = "Option::is_none")]
        previous_secret_set: Option<bool>,
        /// A webhook's fixed headers (`delivery.headers`): their names only, the values are
        /// write-only like the secret. Absent when it has none.
        #[serde(skip_serializing_if = "Option::is_none")]
        headers_set: Option<Vec<String>>,
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
                    previous_secret_set: spec.rotating_secret().then_some(true),
                    headers_set: spec.header_names(),
                },
            },
            paused: config.paused,
            late_policy,
            late_after_ms,
            pending: counts.map(|c| c.pending),
            due: counts.map(|c| c.due),
            oldest_due_ms: counts.and_then(|c| c.oldest_due_ms),
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

// ---- shared by queues, tasks and schedules ----

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
