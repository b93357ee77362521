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
//!
//! Every typed method builds a [`Request`] and parses the answer. [`Client::send`] sends a
//! `Request` and returns the answer's bytes as the server wrote them, for callers that pass the
//! server's JSON on (the CLI's `--json`). API errors carry a typed [`ErrorCode`]:
//!
//! ```no_run
//! # async fn demo(client: belfry_client::Client) -> Result<(), belfry_client::Error> {
//! use belfry_client::{Error, ErrorCode};
//! match client.get_queue("emails").await {
//!     Err(Error::Api { code: ErrorCode::QueueNotFound, .. }) => println!("no such queue"),
//!     other => println!("{:?}", other?),
//! }
//! # Ok(()) }
//! ```
//!
//! # Retries
//!
//! Off by default: every call is sent once, and a passing refusal (`503 overloaded`, `429
//! rate_limited`, …) comes back as an error at once. [`Client::with_retries`] sends the calls
//! that are safe to repeat again, waiting what the server's `Retry-After` asks (capped by
//! [`RetryPolicy::max_backoff`]) or an exponential backoff with jitter, within
//! [`RetryPolicy::max_elapsed`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), belfry_client::Error> {
//! use belfry_client::{Client, NewTask, RetryPolicy};
//! let client = Client::new("http://127.0.0.1:7070")?.with_retries(RetryPolicy::default());
//! // Repeated if need be: the key makes a repeat answer the task the first attempt stored.
//! let task = NewTask::json(serde_json::json!({"order": 42})).idempotency_key("close-order-42");
//! client.submit("orders", &task).await?;
//! // Never repeated: without a key, a repeat after a lost answer would store a second task.
//! client.submit("orders", &NewTask::json(serde_json::json!({"order": 43}))).await?;
//! # Ok(()) }
//! ```
//!
//! Which failures: those [`Error::is_transient`] says may pass (`503 overloaded`, `503
//! store_unavailable` with `Retry-After`, `429 rate_limited`, `507 insufficient_storage`, `503
//! too_many_connections`, `503 shutting_down`, no connection, a connection broken or timed
//! out). Which calls: reads, `PUT`s, `DELETE`s, leases, acks, nacks, extends, pausing and
//! resuming a queue, submits whose every task has an idempotency key
//! ([`Request::is_safe_to_repeat`]). Never a submit without a key, another `POST` that creates
//! or changes something each time, or a streamed body (a task import, a bulk subscribe),
//! which cannot be sent twice.
//!
//! A repeat may meet the effect of the attempt before it, when that attempt's answer was lost
//! ([`Error::may_have_taken_effect`]): a keyed submit then answers its own task, with
//! `duplicate: true`; an ack or nack is refused with `409 lease_expired` (the lease it names
//! ended when the first attempt settled the task), or `404 task_not_found` once the finished
//! task is forgotten; a `DELETE` finds nothing to delete. The client cannot tell that refusal
//! from a lease that ran out, or a thing another client deleted, so it answers neither
//! success nor that error but [`Error::OutcomeUnknown`], which carries both. A batch ack's
//! repeat reports such acks in its per-task results, as `lease_expired`.
//!
//! Off by default, rather than on with a small budget, because of this: turned on, an answer
//! can mean something else than the server's first one, and callers should know that they
//! asked for it. The CLI, which answers a person at once, leaves them off. Code that runs
//! unattended should turn them on.
//!
//! # Workers
//!
//! [`Worker`] consumes a pull queue: it long-polls leases, runs an async handler per task (a
//! bounded number at once), acks on `Ok`, nacks on `Err` with the error's text as the reason
//! (and the delay the handler asks for), extends the lease of a handler still running at half
//! its visibility, and stops on a signal, letting running handlers finish within a grace and
//! giving the rest back. See its example.

mod calls;
mod error;
mod import;
mod model;
mod reminders;
mod request;
mod retry;
mod schedules;
mod worker;

use std::time::Duration;

use serde::de::DeserializeOwned;

pub use error::{Error, ErrorCode};
pub use import::{ImportAnswer, ImportLineError};
pub use model::{
    AckItemResult, ApiErrorBody, BatchItem, CancelManyAnswer, CancelSelection, DeadBulkAnswer,
    DeadPage, DeadSelection, DeliverySpec, LeaseRequest, Leased, LeasedList, NewTask, NotDead,
    NotScheduled, Purged, Queue, QueueList, QueueSpec, Results, Retry, RetrySpec, Submitted, Task,
    TaskPage, TaskState,
};
pub use reminders::{
    BulkAnswer, BulkBody, BulkLineError, Feed, FeedItem, FeedQuery, Priority, Reminder,
    ReminderList, ReminderPatch, ReminderSpec, SubscriberCount, SubscriberPage, UserSubscriptions,
};
pub use request::{DueTime, Nack, Request};
pub use retry::RetryPolicy;
pub use schedules::{
    FireTime, Forecast, ForecastStep, NextFireTimes, RunTask, Schedule, ScheduleList, ScheduleRun,
    ScheduleSpec,
};
pub use worker::{TaskError, Worker, WorkerReport};

/// How long a request may take, beyond any long-poll `wait_ms` it asks for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of a non-JSON error body an error message quotes.
const ERROR_DETAIL_CHARS_MAX: usize = 512;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A successful answer, as received: the status and the body's exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Empty for `204 No Content`.
    pub body: Vec<u8>,
}

impl Answer {
    /// Parses the body as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        if self.body.is_empty() {
            return Err(Error::Unexpected {
                status: self.status,
                detail: "expected a JSON body, got none".into(),
            });
        }
        serde_json::from_slice(&self.body).map_err(|e| Error::Unexpected {
            status: self.status,
            detail: e.to_string(),
        })
    }
}

/// A client for one belfry server. Cheap to clone (shares the connection pool).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer` on every call, when set.
    token: Option<String>,
    /// How transient failures are retried; `None`: not at all.
    retries: Option<RetryPolicy>,
}

impl Client {
    /// `base` is the server's URL, e.g. `http://127.0.0.1:7070`.
    pub fn new(given: &str) -> Result<Self> {
        let base = given.trim_end_matches('/').to_owned();
        // A path is kept (a proxy may serve belfry under one), but every route starts with
        // /v1 itself: a base ending in /v1 would ask for /v1/v1/… and get route_not_found.
        // A query or a fragment would end up after the routes' paths, which then all read
        // as the base's path.
        let fits = (base.starts_with("http://") || base.starts_with("https://"))
            && !base.ends_with("/v1")
            && reqwest::Url::parse(&base).is_ok_and(|url| {
                url.has_host() && url.query().is_none() && url.fragment().is_none()
            });
        if !fits {
            return Err(Error::BadUrl(given.to_owned()));
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(Error::Http)?;
        Ok(Client {
            base,
            http,
            token: None,
            retries: None,
        })
    }

    /// Trusts the CA certificates in `pem` (PEM, one or more) for an `https://` server whose
    /// certificate the system does not trust: a self-signed or private-CA one.
    pub fn with_ca_pem(mut self, pem: &[u8]) -> Result<Self> {
        let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(Error::Http)?;
        if certificates.is_empty() {
            return Err(Error::BadCa("no PEM certificate in it".into()));
        }
        let mut builder = reqwest::Client::builder().no_proxy();
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
        self.http = builder.build().map_err(Error::Http)?;
        Ok(self)
    }

    /// Sends `token` as `Authorization: Bearer <token>` on every call (servers with
    /// `[[auth.tokens]]` configured refuse calls without one).
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Retries the calls that are safe to repeat when they fail for a passing reason, as
    /// `policy` says: see [`RetryPolicy`] for which calls and failures, and how long it waits.
    /// Off by default.
    pub fn with_retries(mut self, policy: RetryPolicy) -> Self {
        self.retries = Some(policy);
        self
    }

    /// The retry policy, if retries are on.
    pub fn retries(&self) -> Option<&RetryPolicy> {
        self.retries.as_ref()
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one call (and, with [`Client::with_retries`], repeats it while it fails for a
    /// passing reason and is safe to repeat). A 2xx answer comes back as received; an error
    /// answer becomes `Error::Api` with the server's code and message.
    pub async fn send(&self, request: &Request) -> Result<Answer> {
        match &self.retries {
            Some(policy) => retry::send(self, policy, request).await,
            None => self.send_once(request).await,
        }
    }

    /// Sends one call once.
    pub(crate) async fn send_once(&self, request: &Request) -> Result<Answer> {
        let response = self
            .call(request, None, Some(REQUEST_TIMEOUT + request.wait))
            .await?;
        let status = response.status().as_u16();
        let retry_after = retry::retry_after(response.headers());
        let body = response.bytes().await?.to_vec();
        if (200..300).contains(&status) {
            return Ok(Answer { status, body });
        }
        Err(api_error(status, &body, retry_after))
    }

    /// Sends one call and hands back the response, whatever its status. `body` replaces the
    /// request's JSON body (a streamed one); `timeout` bounds the whole exchange.
    pub(crate) async fn call(
        &self,
        request: &Request,
        body: Option<reqwest::Body>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response> {
        // A name "." or ".." would be resolved away by the URL ("/v1/users/../reminders" is
        // "/v1/reminders") and the call would reach another route: no name is either.
        let path = request.path.split('?').next().unwrap_or_default();
        // An empty name ("/v1/queues//tasks") would reach another route, or none.
        if let Some(dots) = path
            .split('/')
            .skip(1)
            .find(|s| matches!(*s, "" | "." | ".."))
        {
            return Err(Error::DotName(dots.to_owned()));
        }
        let mut builder = self.http.request(
            request.method.clone(),
            format!("{}{}", self.base, request.path),
        );
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(token) = &self.token {
            builder = builder.bearer_auth(token);
        }
        for (name, value) in &request.headers {
            builder = builder.header(*name, value);
        }
        match (body, &request.body) {
            (Some(body), _) => builder = builder.body(body),
            (None, Some(json)) => builder = builder.json(json),
            (None, None) => {}
        }
        builder.send().await.map_err(|e| self.transport(e))
    }

    fn transport(&self, error: reqwest::Error) -> Error {
        if error.is_connect() {
            Error::Unreachable {
                url: self.base.clone(),
                source: error,
            }
        } else {
            Error::Http(error)
        }
    }

    /// Sends a call whose answer is a JSON body.
    pub(crate) async fn expect<T: DeserializeOwned>(&self, request: Request) -> Result<T> {
        self.send(&request).await?.json()
    }

    /// Sends a call whose answer is `204 No Content`.
    pub(crate) async fn expect_empty(&self, request: Request) -> Result<()> {
        self.send(&request).await.map(|_| ())
    }

    /// Whether the server answers `/readyz` with 200.
    pub async fn ready(&self) -> Result<bool> {
        let response = self
            .http
            .get(format!("{}/readyz", self.base))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        Ok(response.status().is_success())
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        let response = self
            .http
            .get(format!("{}/metrics", self.base))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        Ok(response.text().await?)
    }
}

/// An error answer: the API's `{"error": {"code", "message"}}`, or what came instead.
fn api_error(status: u16, body: &[u8], retry_after: Option<Duration>) -> Error {
    match serde_json::from_slice::<model::ErrorEnvelope>(body) {
        Ok(envelope) => Error::Api {
            status,
            code: ErrorCode::parse(&envelope.error.code),
            message: envelope.error.message,
            retry_after,
        },
        Err(_) => Error::Unexpected {
            status,
            detail: String::from_utf8_lossy(body)
                .chars()
                .take(ERROR_DETAIL_CHARS_MAX)
                .collect(),
        },
    }
}
