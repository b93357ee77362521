//! One API call as a value: method, path and body. Every typed method of `Client` builds one
//! and parses the answer; `Client::send` sends one and hands back the answer's bytes as
//! received, for callers that want the server's JSON itself (the CLI's `--json`).

use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde_json::Value;

use crate::model::{CancelSelection, DeadSelection, LeaseRequest, NewTask, QueueSpec};

/// A new due time for a scheduled task: exactly one of the API's three forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DueTime {
    /// Due this many milliseconds from now (on the server's clock).
    DelayMs(u64),
    /// Due at this RFC 3339 time, parsed by the server.
    At(String),
    /// Due at this unix time in milliseconds.
    AtMs(u64),
}

impl DueTime {
    fn body(&self) -> Value {
        match self {
            DueTime::DelayMs(ms) => serde_json::json!({ "delay_ms": ms }),
            DueTime::At(text) => serde_json::json!({ "run_at": text }),
            DueTime::AtMs(ms) => serde_json::json!({ "run_at_ms": ms }),
        }
    }
}

/// What a nack may say besides the lease: when to retry and why it failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nack {
    /// Retry after this long; the queue's backoff when `None`.
    pub delay_ms: Option<u64>,
    /// Kept with the task (the server keeps the first 1,024 characters).
    pub reason: Option<String>,
}

/// Whether a call may be sent again after a failure, and how a repeat of one that took
/// effect is answered (see `crate::retry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Never sent twice: a repeat could do it twice (a submit without a key, a create), or
    /// its body cannot be sent again (a streamed one).
    Never,
    /// A repeat does nothing more, and is answered as the first call was, or as a duplicate
    /// (reads, `PUT`, a lease, an extend, a submit with an idempotency key).
    Same,
    /// An ack or a nack: a repeat of one that took effect is refused with `lease_expired`, or
    /// `task_not_found` once the finished task is forgotten.
    Lease,
    /// A `DELETE`: a repeat of one that took effect finds nothing to delete.
    Gone,
}

impl Repeat {
    /// What a call of `method` is, before any route says more.
    fn of(method: &Method) -> Self {
        match *method {
            Method::GET | Method::HEAD | Method::PUT => Repeat::Same,
            Method::DELETE => Repeat::Gone,
            _ => Repeat::Never,
        }
    }
}

/// One API call, ready to send with `Client::send`.
#[derive(Debug, Clone)]
pub struct Request {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body: Option<Value>,
    /// A long poll's wait, added to the request timeout.
    pub(crate) wait: Duration,
    /// Extra request headers, such as `If-None-Match`.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// Whether a client with retries may send it again.
    pub(crate) repeat: Repeat,
}

/// Percent-encodes one path segment: everything but RFC 3986's unreserved characters, so a
/// key such as `order/42?x` stays one segment.
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A submit of `tasks` may be repeated when each has an idempotency key: a repeat then
/// answers the tasks the first stored as duplicates, and stores nothing twice.
fn keyed(tasks: &[NewTask]) -> Repeat {
    if !tasks.is_empty() && tasks.iter().all(|t| t.idempotency_key.is_some()) {
        Repeat::Same
    } else {
        Repeat::Never
    }
}

fn to_body(value: &impl Serialize) -> Value {
    // Our request types are plain structs with string keys: serialising them cannot fail.
    serde_json::to_value(value).expect("request bodies serialise to JSON")
}

impl Request {
    pub(crate) fn new(method: Method, path: String) -> Self {
        Request {
            repeat: Repeat::of(&method),
            method,
            path,
            body: None,
            wait: Duration::ZERO,
            headers: Vec::new(),
        }
    }

    fn repeat(mut self, repeat: Repeat) -> Self {
        self.repeat = repeat;
        self
    }

    /// Whether a client with retries ([`crate::Client::with_retries`]) sends this call again
    /// after a passing failure: reads, `PUT`s, `DELETE`s, leases, acks, nacks, extends,
    /// pausing and resuming a queue, and submits whose every task has an idempotency key.
    pub fn is_safe_to_repeat(&self) -> bool {
        self.repeat != Repeat::Never
    }

    pub(crate) fn with_header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub(crate) fn with_body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    /// The path, for messages (`/v1/queues/mail/tasks`).
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn method(&self) -> &str {
        self.method.as_str()
    }

    fn queue_path(queue: &str, rest: &str) -> String {
        format!("/v1/queues/{}{rest}", segment(queue))
    }

    fn task_path(queue: &str, id: &str, rest: &str) -> String {
        Self::queue_path(queue, &format!("/tasks/{}{rest}", segment(id)))
    }

    fn key_path(queue: &str, key: &str) -> String {
        Self::queue_path(queue, &format!("/keys/{}", segment(key)))
    }

    // ---- queues ----

    pub fn put_queue(queue: &str, spec: &QueueSpec) -> Self {
        Self::new(Method::PUT, Self::queue_path(queue, "")).with_body(to_body(spec))
    }

    pub fn get_queue(queue: &str) -> Self {
        Self::new(Method::GET, Self::queue_path(queue, ""))
    }

    /// `POST /v1/tokens`: a new token named `name` with `scopes` (the answer holds it once).
    pub fn create_token(name: &str, scopes: &[String], rate_per_s: Option<f64>) -> Self {
        let mut body = serde_json::json!({"name": name, "scopes": scopes});
        if let Some(rate) = rate_per_s {
            body["rate_per_s"] = serde_json::json!(rate);
        }
        Self::new(Method::POST, "/v1/tokens".to_owned()).with_body(body)
    }

    pub fn list_tokens() -> Self {
        Self::new(Method::GET, "/v1/tokens".to_owned())
    }

    pub fn revoke_token(name: &str) -> Self {
        Self::new(Method::DELETE, format!("/v1/tokens/{}", segment(name)))
    }

    /// The first page of queues (up to the server's page size, 1,000), sorted by name.
    pub fn list_queues() -> Self {
        Self::new(Method::GET, "/v1/queues".to_owned())
    }

    /// The page of queues named after `after`.
    pub fn list_queues_after(after: &str) -> Self {
        Self::new(Method::GET, format!("/v1/queues?after={}", segment(after)))
    }

    pub fn delete_queue(queue: &str) -> Self {
        Self::new(Method::DELETE, Self::queue_path(queue, ""))
    }

    /// Drops every task of the queue; the queue and its settings stay.
    pub fn purge_queue(queue: &str) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/purge"))
    }

    /// Pausing (and resuming) sets the queue's state: a repeat changes nothing more.
    pub fn pause_queue(queue: &str) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/pause")).repeat(Repeat::Same)
    }

    pub fn resume_queue(queue: &str) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/resume")).repeat(Repeat::Same)
    }

    // ---- tasks ----

    /// Safe to repeat only with an idempotency key: a repeat of a keyless submit whose
    /// answer was lost would store the task twice.
    pub fn submit(queue: &str, task: &NewTask) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/tasks"))
            .with_body(to_body(task))
            .repeat(keyed(std::slice::from_ref(task)))
    }

    /// Safe to repeat only when every task has an idempotency key.
    pub fn submit_batch(queue: &str, tasks: &[NewTask]) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/tasks:batch"))
            .with_body(serde_json::json!({ "tasks": tasks }))
            .repeat(keyed(tasks))
    }

    /// The import route, without its body (`Client::import_tasks` streams one).
    pub(crate) fn import_tasks(queue: &str) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/tasks:import"))
    }

    pub fn get_task(queue: &str, id: &str) -> Self {
        Self::new(Method::GET, Self::task_path(queue, id, ""))
    }

    pub fn cancel(queue: &str, id: &str) -> Self {
        Self::new(Method::DELETE, Self::task_path(queue, id, ""))
    }

    pub fn reschedule(queue: &str, id: &str, due: &DueTime) -> Self {
        Self::new(Method::PATCH, Self::task_path(queue, id, "")).with_body(due.body())
    }

    /// The task submitted with this idempotency key. A key of `.` or `..` cannot be named in a
    /// URL path (it is a dot segment); use the task id for those.
    pub fn get_task_by_key(queue: &str, key: &str) -> Self {
        Self::new(Method::GET, Self::key_path(queue, key))
    }

    pub fn cancel_by_key(queue: &str, key: &str) -> Self {
        Self::new(Method::DELETE, Self::key_path(queue, key))
    }

    pub fn reschedule_by_key(queue: &str, key: &str, due: &DueTime) -> Self {
        Self::new(Method::PATCH, Self::key_path(queue, key)).with_body(due.body())
    }

    // ---- pull consumers ----

    pub fn lease(queue: &str, request: &LeaseRequest) -> Self {
        // A lease whose answer was lost leaves its tasks leased until their visibility ends
        // (then they are delivered again, as at-least-once delivery does anyway): a repeat
        // takes other tasks, and loses none.
        let mut call = Self::new(Method::POST, Self::queue_path(queue, "/lease"))
            .with_body(to_body(request))
            .repeat(Repeat::Same);
        call.wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        call
    }

    pub fn ack(queue: &str, id: &str, lease_id: &str) -> Self {
        Self::new(Method::POST, Self::task_path(queue, id, "/ack"))
            .with_body(serde_json::json!({ "lease_id": lease_id }))
            .repeat(Repeat::Lease)
    }

    pub fn nack(queue: &str, id: &str, lease_id: &str, nack: &Nack) -> Self {
        let mut body = serde_json::json!({ "lease_id": lease_id });
        if let Some(delay) = nack.delay_ms {
            body["delay_ms"] = delay.into();
        }
        if let Some(reason) = &nack.reason {
            body["reason"] = reason.as_str().into();
        }
        Self::new(Method::POST, Self::task_path(queue, id, "/nack"))
            .with_body(body)
            .repeat(Repeat::Lease)
    }

    /// A repeat of an extend that took effect holds the same lease, and extends it again.
    pub fn extend(queue: &str, id: &str, lease_id: &str, visibility_ms: u64) -> Self {
        Self::new(Method::POST, Self::task_path(queue, id, "/extend"))
            .with_body(serde_json::json!({ "lease_id": lease_id, "visibility_ms": visibility_ms }))
            .repeat(Repeat::Same)
    }

    /// Acks many tasks: `(task id, lease id)` pairs.
    pub fn ack_batch(queue: &str, acks: &[(String, String)]) -> Self {
        let acks: Vec<Value> = acks
            .iter()
            .map(|(id, lease)| serde_json::json!({ "id": id, "lease_id": lease }))
            .collect();
        // Repeated, acks that took effect the first time answer `lease_expired` (or
        // `task_not_found`) in their own results, not as the call's error.
        Self::new(Method::POST, Self::queue_path(queue, "/ack"))
            .with_body(serde_json::json!({ "acks": acks }))
            .repeat(Repeat::Same)
    }

    // ---- dead letters ----

    pub fn list_dead(queue: &str, after: Option<&str>, limit: Option<usize>) -> Self {
        Self::task_page(queue, "/dead", after, limit, &[])
    }

    /// A page of dead letters without their payloads: ids, reasons and attempts, a small
    /// answer however large the payloads are.
    pub fn list_dead_without_payloads(
        queue: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Self {
        Self::task_page(queue, "/dead", after, limit, &["payload=false"])
    }

    /// A page of the queue's live tasks (scheduled and leased).
    pub fn list_tasks(queue: &str, after: Option<&str>, limit: Option<usize>) -> Self {
        Self::task_page(queue, "/tasks", after, limit, &[])
    }

    /// A page of the queue's live tasks with each task's own target whole (credentials and
    /// query string included), to submit them again elsewhere.
    pub fn list_tasks_for_export(queue: &str, after: Option<&str>, limit: Option<usize>) -> Self {
        Self::task_page(queue, "/tasks", after, limit, &["full_target=true"])
    }

    fn task_page(
        queue: &str,
        listing: &str,
        after: Option<&str>,
        limit: Option<usize>,
        extra: &[&str],
    ) -> Self {
        let mut query: Vec<String> = extra.iter().map(|q| (*q).to_owned()).collect();
        if let Some(after) = after {
            query.push(format!("after={}", segment(after)));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let mut path = Self::queue_path(queue, listing);
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        Self::new(Method::GET, path)
    }

    pub fn redrive(queue: &str, id: &str) -> Self {
        let path = Self::queue_path(queue, &format!("/dead/{}/redrive", segment(id)));
        Self::new(Method::POST, path)
    }

    /// Deletes a dead letter (it is finished as cancelled).
    pub fn delete_dead(queue: &str, id: &str) -> Self {
        let path = Self::queue_path(queue, &format!("/dead/{}", segment(id)));
        Self::new(Method::DELETE, path)
    }

    /// Redrives up to 1,000 dead letters: those named, or the first ones in id order.
    pub fn redrive_dead_many(queue: &str, which: &DeadSelection) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/dead:redrive")).with_body(which.body())
    }

    /// Cancels up to 1,000 scheduled tasks, named by id or by idempotency key.
    pub fn cancel_many(queue: &str, which: &CancelSelection) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/tasks:cancel")).with_body(which.body())
    }

    /// Deletes up to 1,000 dead letters: those named, or the first ones in id order.
    pub fn delete_dead_many(queue: &str, which: &DeadSelection) -> Self {
        Self::new(Method::POST, Self::queue_path(queue, "/dead:delete")).with_body(which.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_keep_unreserved_and_encode_the_rest() {
        let check = |text: &str, expected: &str| assert_eq!(segment(text), expected, "{text}");
        check("close-order-42", "close-order-42");
        check("a.b_c~d", "a.b_c~d");
        check("order/42", "order%2F42");
        check("a b?c#d%", "a%20b%3Fc%23d%25");
        check("é", "%C3%A9");
    }

    #[test]
    fn due_times_are_one_field_each() {
        assert_eq!(
            DueTime::DelayMs(5).body(),
            serde_json::json!({"delay_ms": 5})
        );
        assert_eq!(
            DueTime::At("2026-01-01T00:00:00Z".into()).body(),
            serde_json::json!({"run_at": "2026-01-01T00:00:00Z"})
        );
        assert_eq!(DueTime::AtMs(7).body(), serde_json::json!({"run_at_ms": 7}));
    }
}
