//! The API's request and answer bodies, as the client sends and reads them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// The late policy of tasks that name none: "fire", "skip" or "dead" (the last two with
    /// `late_after_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_after_ms: Option<u64>,
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

/// A queue's `delivery`. Its `Debug` shows neither secret nor a header value.
#[derive(Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DeliverySpec {
    Pull,
    Webhook {
        url: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        /// The secret being rotated out: requests are signed under it too while it is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        previous_secret: Option<String>,
        /// Fixed headers on every request (e.g. `Authorization` for an API gateway in front
        /// of the receiver), replacing a task header of the same name; write-only like the
        /// secret (a queue shows their names as `headers_set`). Sent to a task's own target
        /// only when it has the queue URL's origin.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// XADD to a stream of a `redis` connection the server declares.
    RedisStream {
        connection: String,
        stream: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        maxlen: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// JetStream publish to a subject of a `nats` connection the server declares.
    Nats {
        connection: String,
        subject: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Produce to a topic of a `kafka` connection the server declares; `key` is `"task_id"`,
    /// `"header:NAME"` or absent.
    Kafka {
        connection: String,
        topic: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
}

impl std::fmt::Debug for DeliverySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |secret: &Option<String>| secret.as_ref().map(|_| "<redacted>");
        match self {
            DeliverySpec::Pull => f.write_str("Pull"),
            DeliverySpec::Webhook {
                url,
                secret,
                previous_secret,
                headers,
                timeout_ms,
            } => f
                .debug_struct("Webhook")
                .field("url", url)
                .field("secret", &hidden(secret))
                .field("previous_secret", &hidden(previous_secret))
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .field("timeout_ms", timeout_ms)
                .finish(),
            DeliverySpec::RedisStream {
                connection,
                stream,
                maxlen,
                timeout_ms,
            } => f
                .debug_struct("RedisStream")
                .field("connection", connection)
                .field("stream", stream)
                .field("maxlen", maxlen)
                .field("timeout_ms", timeout_ms)
                .finish(),
            DeliverySpec::Nats {
                connection,
                subject,
                timeout_ms,
            } => f
                .debug_struct("Nats")
                .field("connection", connection)
                .field("subject", subject)
                .field("timeout_ms", timeout_ms)
                .finish(),
            DeliverySpec::Kafka {
                connection,
                topic,
                key,
                timeout_ms,
            } => f
                .debug_struct("Kafka")
                .field("connection", connection)
                .field("topic", topic)
                .field("key", key)
                .field("timeout_ms", timeout_ms)
                .finish(),
        }
    }
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
    /// "fire", "skip" or "dead", for tasks that name none.
    #[serde(default)]
    pub late_policy: Option<String>,
    #[serde(default)]
    pub late_after_ms: Option<u64>,
    #[serde(default)]
    pub pending: Option<u64>,
    #[serde(default)]
    pub due: Option<u64>,
    /// The due time of the oldest due task not handed out yet (while `due` is not 0).
    #[serde(default)]
    pub oldest_due_ms: Option<u64>,
    #[serde(default)]
    pub in_flight: Option<u64>,
    #[serde(default)]
    pub dead: Option<u64>,
    /// Push queues: what the last delivery saw of the target (`reachable`, `unreachable:
    /// …`, `refused: …`, `unknown`).
    #[serde(default)]
    pub delivery_health: Option<String>,
    /// What the server wants the caller of a create or update to know, e.g. that the
    /// delivery target did not answer or refused the connection. Only in a `PUT`'s answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Retry {
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct QueueList {
    pub queues: Vec<Queue>,
    /// The name to pass as `after` for the next page; absent on the last page.
    #[serde(default)]
    pub next_after: Option<String>,
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
    /// "fire", "skip" or "dead" (the last two with `late_after_ms`); the queue's when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_after_ms: Option<u64>,
    /// Webhook queues only: the URL this task is POSTed to instead of the queue's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
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

    /// Delivers this task to `url` instead of its (webhook) queue's URL.
    pub fn target(mut self, url: impl Into<String>) -> Self {
        self.target = Some(url.into());
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
    /// The late policy the task was stored with (its own or its queue's).
    #[serde(default)]
    pub late_policy: Option<String>,
    #[serde(default)]
    pub late_after_ms: Option<u64>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub payload: Option<Value>,
    #[serde(default)]
    pub payload_base64: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The task's own target, without credentials or query string.
    #[serde(default)]
    pub target: Option<String>,
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
pub struct Results<T> {
    pub results: Vec<T>,
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
    /// The task's own target, whole: only on a task submitted to a webhook queue that has
    /// since become a pull queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub lease_id: String,
    pub lease_until_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LeasedList {
    pub tasks: Vec<Leased>,
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

/// A page of tasks (live tasks or dead letters), and where the next page starts.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Pass as `after` for the next page; `None` on the last page.
    #[serde(default)]
    pub next_after: Option<String>,
}

/// A page of dead letters.
pub type DeadPage = TaskPage;

/// What a queue held when it was purged.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub struct Purged {
    pub pending: u64,
    pub in_flight: u64,
    pub dead: u64,
}

/// The dead letters a bulk call acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadSelection {
    /// These task ids (1 to 1,000).
    Ids(Vec<String>),
    /// The first this many (1 to 1,000) in id order.
    First(usize),
}

impl DeadSelection {
    pub(crate) fn body(&self) -> serde_json::Value {
        match self {
            DeadSelection::Ids(ids) => serde_json::json!({ "ids": ids }),
            DeadSelection::First(n) => serde_json::json!({ "limit": n }),
        }
    }
}

/// What a bulk redrive or delete of dead letters did.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct DeadBulkAnswer {
    /// Redriven (`dead:redrive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redriven: Option<u64>,
    /// Deleted (`dead:delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
    /// Tasks named that are not dead letters, with their state.
    #[serde(default)]
    pub not_dead: Vec<NotDead>,
    /// Tasks named that the queue does not have.
    #[serde(default)]
    pub not_found: Vec<String>,
    /// Dead letters left in the queue after the call.
    pub dead_left: u64,
}

impl DeadBulkAnswer {
    /// Dead letters redriven or deleted, whichever the call did.
    pub fn done(&self) -> u64 {
        self.redriven.or(self.deleted).unwrap_or(0)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct NotDead {
    pub id: String,
    pub state: String,
}

/// The tasks a bulk cancel names (1 to 1,000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelSelection {
    /// Task ids.
    Ids(Vec<String>),
    /// Idempotency keys: each names the live task that holds it.
    Keys(Vec<String>),
}

impl CancelSelection {
    pub(crate) fn body(&self) -> serde_json::Value {
        match self {
            CancelSelection::Ids(ids) => serde_json::json!({ "ids": ids }),
            CancelSelection::Keys(keys) => serde_json::json!({ "keys": keys }),
        }
    }
}

/// What a bulk cancel did.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct CancelManyAnswer {
    pub cancelled: u64,
    /// Tasks named that were not scheduled (leased, finished, dead, or named twice).
    #[serde(default)]
    pub not_scheduled: Vec<NotScheduled>,
    /// Ids or keys the queue does not have.
    #[serde(default)]
    pub not_found: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct NotScheduled {
    pub id: String,
    /// The key the task was named by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub state: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorEnvelope {
    pub(crate) error: ApiErrorBody,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook(headers: &[(&str, &str)]) -> DeliverySpec {
        DeliverySpec::Webhook {
            url: "https://example.com/h".into(),
            secret: Some("s3cret".into()),
            previous_secret: None,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            timeout_ms: None,
        }
    }

    #[test]
    fn webhook_headers_are_sent_as_an_object_and_left_out_when_none() {
        let spec = webhook(&[("X-Env", "prod"), ("Authorization", "Bearer abc")]);
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({"type": "webhook", "url": "https://example.com/h",
                "secret": "s3cret", "headers": {"Authorization": "Bearer abc", "X-Env": "prod"}})
        );
        let none = serde_json::to_value(webhook(&[])).unwrap();
        assert!(none.get("headers").is_none(), "{none}");
    }

    #[test]
    fn debug_shows_no_secret_and_no_header_value() {
        let shown = format!("{:?}", webhook(&[("Authorization", "Bearer abc")]));
        assert!(
            !shown.contains("s3cret") && !shown.contains("Bearer abc"),
            "{shown}"
        );
        assert!(
            shown.contains("Authorization") && shown.contains("example.com"),
            "{shown}"
        );
    }
}
