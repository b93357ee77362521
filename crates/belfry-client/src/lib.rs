//! A small typed client for Belfry's HTTP API v1 (see docs/api.md).
//!
//! ```no_run
//! # async fn demo() -> Result<(), belfry_client::Error> {
//! let client = belfry_client::Client::new("http://127.0.0.1:7070")?;
//! client.put_queue("emails", &belfry_client::QueueSpec::default()).await?;
//! let task = belfry_client::NewTask::json(serde_json::json!({"to": "a@b.c"})).delay_ms(10_000);
//! let created = client.submit("emails", &task).await?;
//! println!("scheduled {} at {}", created.id, created.due_at_ms);
//! # Ok(()) }
//! ```

mod schedules;

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long a request may take, beyond any long-poll `wait_ms` it asks for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an API error.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("request to belfry failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("unexpected answer from belfry (HTTP {status}): {detail}")]
    Unexpected { status: u16, detail: String },
    #[error("invalid server URL {0:?}")]
    BadUrl(String),
}

impl Error {
    /// The API error code, when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use schedules::{FireTime, Forecast, ForecastStep, NextFireTimes, Schedule, ScheduleSpec};

// ---- request and response types ----

#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliverySpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RetrySpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_initial_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_max_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DeliverySpec {
    Pull,
    Webhook {
        url: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Queue {
    pub name: String,
    pub rate_per_s: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub retry: Retry,
    pub delivery: Value,
    pub paused: bool,
    #[serde(default)]
    pub pending: Option<u64>,
    #[serde(default)]
    pub due: Option<u64>,
    #[serde(default)]
    pub in_flight: Option<u64>,
    #[serde(default)]
    pub dead: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Retry {
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
struct QueueList {
    queues: Vec<Queue>,
}

/// A task to submit.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewTask {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// "high" or "normal".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

impl NewTask {
    pub fn json(payload: Value) -> Self {
        NewTask {
            payload: Some(payload),
            ..NewTask::default()
        }
    }

    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = Some(ms);
        self
    }

    pub fn run_at_ms(mut self, ms: u64) -> Self {
        self.run_at_ms = Some(ms);
        self
    }

    pub fn high_priority(mut self) -> Self {
        self.priority = Some("high".into());
        self
    }

    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

/// The answer to a submit: a new task, or with `duplicate` the existing one.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Submitted {
    pub id: String,
    pub queue: String,
    pub due_at_ms: u64,
    pub state: String,
    #[serde(default)]
    pub duplicate: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Task {
    pub id: String,
    pub queue: String,
    pub state: String,
    pub attempts: u32,
    pub due_at_ms: u64,
    pub priority: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub payload: Option<Value>,
    #[serde(default)]
    pub payload_base64: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub lease_until_ms: Option<u64>,
    #[serde(default)]
    pub dead_reason: Option<String>,
    #[serde(default)]
    pub duplicate: bool,
}

/// One entry of a batch submit's results: a task or an error.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum BatchItem {
    Error { error: ApiErrorBody },
    Submitted(Submitted),
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ApiErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Results<T> {
    results: Vec<T>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Leased {
    pub id: String,
    pub queue: String,
    #[serde(default)]
    pub payload: Option<Value>,
    #[serde(default)]
    pub payload_base64: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub attempt: u32,
    pub due_at_ms: u64,
    pub priority: String,
    pub lease_id: String,
    pub lease_until_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
struct LeasedList {
    tasks: Vec<Leased>,
}

/// The state of a task after ack, nack or extend.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct TaskState {
    pub id: String,
    pub state: String,
    #[serde(default)]
    pub due_at_ms: Option<u64>,
    #[serde(default)]
    pub lease_until_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct AckItemResult {
    pub id: String,
    #[serde(default)]
    pub ok: Option<bool>,
    #[serde(default)]
    pub error: Option<ApiErrorBody>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct DeadPage {
    pub tasks: Vec<Task>,
    #[serde(default)]
    pub next_after: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ErrorEnvelope {
    error: ApiErrorBody,
}

// ---- the client ----

/// A client for one belfry server. Cheap to clone (shares the connection pool).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// `base` is the server's URL, e.g. `http://127.0.0.1:7070`.
    pub fn new(base: &str) -> Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::BadUrl(base));
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(Error::Http)?;
        Ok(Client { base, http })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        extra_timeout: Duration,
    ) -> Result<Option<T>> {
        let mut request = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .timeout(REQUEST_TIMEOUT + extra_timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        if status.is_success() {
            if status == StatusCode::NO_CONTENT || bytes.is_empty() {
                return Ok(None);
            }
            return serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::Unexpected {
                    status: status.as_u16(),
                    detail: e.to_string(),
                });
        }
        match serde_json::from_slice::<ErrorEnvelope>(&bytes) {
            Ok(envelope) => Err(Error::Api {
                status: status.as_u16(),
                code: envelope.error.code,
                message: envelope.error.message,
            }),
            Err(_) => Err(Error::Unexpected {
                status: status.as_u16(),
                detail: String::from_utf8_lossy(&bytes).chars().take(512).collect(),
            }),
        }
    }

    async fn expect<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T> {
        self.call(method, path, body, Duration::ZERO)
            .await?
            .ok_or(Error::Unexpected {
                status: 204,
                detail: "expected a JSON body".into(),
            })
    }

    const NO_BODY: Option<&'static Value> = None;

    // ---- queues ----

    pub async fn put_queue(&self, queue: &str, spec: &QueueSpec) -> Result<Queue> {
        self.expect(Method::PUT, &format!("/v1/queues/{queue}"), Some(spec))
            .await
    }

    pub async fn get_queue(&self, queue: &str) -> Result<Queue> {
        self.expect(Method::GET, &format!("/v1/queues/{queue}"), Self::NO_BODY)
            .await
    }

    pub async fn list_queues(&self) -> Result<Vec<Queue>> {
        let list: QueueList = self
            .expect(Method::GET, "/v1/queues", Self::NO_BODY)
            .await?;
        Ok(list.queues)
    }

    pub async fn delete_queue(&self, queue: &str) -> Result<()> {
        self.call::<Value>(
            Method::DELETE,
            &format!("/v1/queues/{queue}"),
            Self::NO_BODY,
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }

    pub async fn pause(&self, queue: &str) -> Result<Queue> {
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/pause"),
            Self::NO_BODY,
        )
        .await
    }

    pub async fn resume(&self, queue: &str) -> Result<Queue> {
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/resume"),
            Self::NO_BODY,
        )
        .await
    }

    // ---- tasks ----

    pub async fn submit(&self, queue: &str, task: &NewTask) -> Result<Submitted> {
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/tasks"),
            Some(task),
        )
        .await
    }

    pub async fn submit_batch(&self, queue: &str, tasks: &[NewTask]) -> Result<Vec<BatchItem>> {
        let body = serde_json::json!({ "tasks": tasks });
        let results: Results<BatchItem> = self
            .expect(
                Method::POST,
                &format!("/v1/queues/{queue}/tasks:batch"),
                Some(&body),
            )
            .await?;
        Ok(results.results)
    }

    pub async fn get_task(&self, queue: &str, id: &str) -> Result<Task> {
        self.expect(
            Method::GET,
            &format!("/v1/queues/{queue}/tasks/{id}"),
            Self::NO_BODY,
        )
        .await
    }

    pub async fn cancel(&self, queue: &str, id: &str) -> Result<()> {
        self.call::<Value>(
            Method::DELETE,
            &format!("/v1/queues/{queue}/tasks/{id}"),
            Self::NO_BODY,
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }

    /// Moves a scheduled task to a new due time, `delay_ms` from now.
    pub async fn reschedule(&self, queue: &str, id: &str, delay_ms: u64) -> Result<Task> {
        let body = serde_json::json!({ "delay_ms": delay_ms });
        self.expect(
            Method::PATCH,
            &format!("/v1/queues/{queue}/tasks/{id}"),
            Some(&body),
        )
        .await
    }

    // ---- pull consumers ----

    pub async fn lease(&self, queue: &str, request: &LeaseRequest) -> Result<Vec<Leased>> {
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        let list: LeasedList = self
            .call(
                Method::POST,
                &format!("/v1/queues/{queue}/lease"),
                Some(request),
                wait,
            )
            .await?
            .ok_or(Error::Unexpected {
                status: 204,
                detail: "expected a JSON body".into(),
            })?;
        Ok(list.tasks)
    }

    pub async fn ack(&self, queue: &str, id: &str, lease_id: &str) -> Result<TaskState> {
        let body = serde_json::json!({ "lease_id": lease_id });
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/tasks/{id}/ack"),
            Some(&body),
        )
        .await
    }

    pub async fn nack(
        &self,
        queue: &str,
        id: &str,
        lease_id: &str,
        delay_ms: Option<u64>,
    ) -> Result<TaskState> {
        let mut body = serde_json::json!({ "lease_id": lease_id });
        if let Some(delay) = delay_ms {
            body["delay_ms"] = delay.into();
        }
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/tasks/{id}/nack"),
            Some(&body),
        )
        .await
    }

    pub async fn extend(
        &self,
        queue: &str,
        id: &str,
        lease_id: &str,
        visibility_ms: u64,
    ) -> Result<TaskState> {
        let body = serde_json::json!({ "lease_id": lease_id, "visibility_ms": visibility_ms });
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/tasks/{id}/extend"),
            Some(&body),
        )
        .await
    }

    /// Acks many tasks: `(task id, lease id)` pairs; one result per pair, in order.
    pub async fn ack_batch(
        &self,
        queue: &str,
        acks: &[(String, String)],
    ) -> Result<Vec<AckItemResult>> {
        let acks: Vec<Value> = acks
            .iter()
            .map(|(id, lease)| serde_json::json!({"id": id, "lease_id": lease}))
            .collect();
        let body = serde_json::json!({ "acks": acks });
        let results: Results<AckItemResult> = self
            .expect(
                Method::POST,
                &format!("/v1/queues/{queue}/ack"),
                Some(&body),
            )
            .await?;
        Ok(results.results)
    }

    // ---- dead letters ----

    pub async fn list_dead(
        &self,
        queue: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<DeadPage> {
        let mut path = format!("/v1/queues/{queue}/dead");
        let mut sep = '?';
        if let Some(after) = after {
            path.push_str(&format!("{sep}after={after}"));
            sep = '&';
        }
        if let Some(limit) = limit {
            path.push_str(&format!("{sep}limit={limit}"));
        }
        self.expect(Method::GET, &path, Self::NO_BODY).await
    }

    pub async fn redrive(&self, queue: &str, id: &str) -> Result<Task> {
        self.expect(
            Method::POST,
            &format!("/v1/queues/{queue}/dead/{id}/redrive"),
            Self::NO_BODY,
        )
        .await
    }

    // ---- operations ----

    /// Whether the server answers `/readyz` with 200.
    pub async fn ready(&self) -> Result<bool> {
        let response = self
            .http
            .get(format!("{}/readyz", self.base))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        Ok(response.status().is_success())
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        let response = self
            .http
            .get(format!("{}/metrics", self.base))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        Ok(response.text().await?)
    }
}
