//! The HTTP webhook sink: POST each due task to a URL.
//!
//! Request: the payload bytes as the body (`application/json` or `application/octet-stream`),
//! the task's own headers, the queue's fixed headers (`delivery.headers`, which replace a task
//! header of the same name; see [`fixed_headers`]), then belfry's headers, which always win:
//! `Belfry-Task-Id`, `Belfry-Queue`, `Belfry-Attempt`, `Belfry-Due-At` (unix ms), and with a
//! secret `Belfry-Timestamp` (unix s), `Belfry-Signature` (`v1=…`) and `Belfry-Signature-V2`
//! (`v2=…`, see [`signature`]).
//! Response: classified by [`crate::retry`].
//!
//! A task with its own target (`Task::target`) goes to that URL instead of the queue's, with
//! the same headers and signature (the queue's fixed headers only when the target has the
//! queue URL's origin); it is checked against the target policy on submit
//! ([`Sink::check_task_target`]) and again when sent. Its outcomes do not change the queue's
//! delivery health, which describes the queue's own URL.

mod fixed_headers;
mod probe;
pub mod signature;
pub mod target;
mod tls;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use belfry_core::limits::HEADERS_MAX;
use belfry_core::log_every::LogEvery;
use belfry_core::{PayloadKind, Task, UnixMs};
use hmac::Hmac;
use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER,
};
use reqwest::Url;
use sha2::Sha256;

use crate::gate::HealthCell;
use crate::retry::{classify_status, classify_transport, TransportFailure};
use crate::{OpenError, Outcome, Sink, SinkError, SinkFuture, SinkHealth, TargetPolicy};
use fixed_headers::FixedHeaders;

/// Header names belfry sets on every webhook request.
pub const HEADER_TASK_ID: &str = "belfry-task-id";
pub const HEADER_QUEUE: &str = "belfry-queue";
pub const HEADER_ATTEMPT: &str = "belfry-attempt";
pub const HEADER_DUE_AT: &str = "belfry-due-at";
pub const HEADER_TIMESTAMP: &str = "belfry-timestamp";
pub const HEADER_SIGNATURE: &str = "belfry-signature";
pub const HEADER_SIGNATURE_V2: &str = "belfry-signature-v2";

/// Shortest and longest per-request timeout. Under 100 ms a healthy receiver across a network
/// could not answer; over 5 minutes a hung receiver would hold a concurrency slot (and delay
/// the queue's other tasks) for too long.
pub const TIMEOUT_MIN: Duration = Duration::from_millis(100);
pub const TIMEOUT_MAX: Duration = Duration::from_secs(5 * 60);
/// Timeout when the queue config names none.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Longest signing secret. Longer keys add no strength to HMAC-SHA256 (they are hashed first).
pub const SECRET_BYTES_MAX: usize = 1024;

/// How much of a failed response's body is kept in the outcome's reason: enough for an error
/// message, small enough for a dead-letter record and a log line.
const RESPONSE_DETAIL_BYTES_MAX: usize = 256;

/// Failure lines of one webhook sink (one queue's target) are logged at most once per period
/// per kind: a receiver that is down fails every task, and a line each would bury the first,
/// useful one under thousands.
pub const FAILURE_LOG_PERIOD: Duration = Duration::from_secs(10);

// Task headers belfry sets or owns (`belfry_core::headers::is_reserved`: `Belfry-*`, hop-by-hop
// and transport headers) are never forwarded: the API refuses them on submit, and a task that
// came another way still cannot forge the task id, attempt or signature a receiver relies on.
// The exception is a schedule's shard headers, which belfry itself puts on firing tasks.

fn forwarded(name: &str) -> bool {
    use belfry_core::schedule::{SHARD_COUNT_HEADER, SHARD_HEADER};
    !belfry_core::headers::is_reserved(name)
        || name.eq_ignore_ascii_case(SHARD_HEADER)
        || name.eq_ignore_ascii_case(SHARD_COUNT_HEADER)
}

/// Where and how to deliver one queue's tasks.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub url: String,
    /// Signing secret; when set, requests carry `Belfry-Timestamp` and `Belfry-Signature`.
    pub secret: Option<String>,
    /// The secret being rotated out: while set (with `secret`), each signature header carries
    /// a second entry under it, so receivers still holding it keep verifying.
    pub previous_secret: Option<String>,
    /// Fixed headers on every request (`delivery.headers`): they replace a task header of the
    /// same name, and go to a task's own target only when it has the queue URL's origin.
    /// Values are credentials: never shown.
    pub headers: BTreeMap<String, String>,
    /// Limit for one whole request: connecting, sending and receiving the answer.
    pub timeout: Duration,
}

impl WebhookConfig {
    pub fn new(url: impl Into<String>) -> Self {
        WebhookConfig {
            url: url.into(),
            secret: None,
            previous_secret: None,
            headers: BTreeMap::new(),
            timeout: TIMEOUT_DEFAULT,
        }
    }
}

/// Never prints the secret or a header value (names only), nor credentials or a query string
/// in the URL (they often carry tokens).
impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redact_url_str(&self.url))
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field(
                "previous_secret",
                &self.previous_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `scheme://host:port/path`, without userinfo, query or fragment: safe for logs.
pub fn redact_url(url: &Url) -> String {
    let mut text = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        text.push_str(&format!(":{port}"));
    }
    text.push_str(url.path());
    if url.query().is_some() {
        text.push_str("?<redacted>");
    }
    text
}

/// [`redact_url`] of a URL given as text; an unparsable URL shows as `<invalid url>`.
pub fn redact_url_text(url: &str) -> String {
    redact_url_str(url)
}

fn redact_url_str(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redact_url(&parsed),
        Err(_) => "<invalid url>".to_owned(),
    }
}

/// Delivers tasks to one queue's webhook.
pub struct WebhookSink {
    url: Url,
    /// `scheme://host:port`: the connection pool this sink's requests share.
    target: String,
    /// The URL as logs may show it.
    url_for_logs: String,
    mac: Option<Hmac<Sha256>>,
    /// The secret being rotated out, keyed (see [`WebhookConfig::previous_secret`]).
    previous_mac: Option<Hmac<Sha256>>,
    /// The queue's fixed headers (see [`fixed_headers`]).
    fixed_headers: FixedHeaders,
    timeout: Duration,
    client: reqwest::Client,
    /// What the last delivery saw of the receiver.
    health: HealthCell,
    /// Throttles for the failure log lines (see [`WebhookSink::log`]).
    retry_log: LogEvery,
    reject_log: LogEvery,
    /// For [`Sink::open`]: the target policy the probe applies, and its answer, found once
    /// (the server asks twice when a queue is put: the dispatcher and the API).
    policy: TargetPolicy,
    opened: tokio::sync::OnceCell<Result<(), OpenError>>,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSink")
            .field("url", &self.url_for_logs)
            .field("signed", &self.mac.is_some())
            .field("headers", &self.fixed_headers)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl WebhookSink {
    /// Checks the configuration and builds the sink.
    ///
    /// `client` should come from [`target::client_for`] with the same `policy` (or
    /// [`target::default_client`] for the default policy): its DNS resolver is what enforces
    /// the policy at connect time for host names. Share one client among all sinks so they
    /// share its connection pool.
    pub fn new(
        config: WebhookConfig,
        policy: TargetPolicy,
        client: reqwest::Client,
    ) -> Result<Self, SinkError> {
        let url = target::validate_webhook_url(&config.url, &policy)?;
        if !(TIMEOUT_MIN..=TIMEOUT_MAX).contains(&config.timeout) {
            return Err(SinkError::InvalidTimeout {
                got: config.timeout,
                min: TIMEOUT_MIN,
                max: TIMEOUT_MAX,
            });
        }
        let mac = keyed_secret(config.secret.as_deref())?;
        let previous_mac = match (&mac, keyed_secret(config.previous_secret.as_deref())?) {
            (None, Some(_)) => return Err(SinkError::PreviousSecretAlone),
            (_, previous) => previous,
        };
        let fixed_headers = FixedHeaders::new(&config.headers)?;
        let target = format!(
            "{}://{}:{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port_or_known_default().unwrap_or(0)
        );
        Ok(WebhookSink {
            target,
            url_for_logs: redact_url(&url),
            url,
            mac,
            previous_mac,
            fixed_headers,
            timeout: config.timeout,
            client,
            health: HealthCell::default(),
            retry_log: LogEvery::new(FAILURE_LOG_PERIOD),
            reject_log: LogEvery::new(FAILURE_LOG_PERIOD),
            policy,
            opened: tokio::sync::OnceCell::new(),
        })
    }

    /// The target as logs may show it (no credentials, no query).
    pub fn target_for_logs(&self) -> &str {
        &self.url_for_logs
    }

    /// The request headers for one attempt; `fixed` adds the queue's fixed headers.
    fn headers(&self, task: &Task, attempt: u32, now_ms: UnixMs, fixed: bool) -> HeaderMap {
        let mut headers = task_headers(task);
        if fixed {
            self.fixed_headers.apply(&mut headers);
        }
        let content_type = match task.payload_kind {
            PayloadKind::Json => "application/json",
            PayloadKind::Binary => "application/octet-stream",
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if task.payload.is_empty() {
            // The client sends no length for an empty body, which HTTP/1.1 allows, but some
            // front ends (Google's, IIS) answer a POST without one 411 Length Required, which
            // is permanent: such a task could never be delivered there.
            headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        self.set_belfry_headers(&mut headers, task, attempt, now_ms);
        headers
    }

    /// Belfry's own headers, which replace anything of the same name.
    fn set_belfry_headers(
        &self,
        headers: &mut HeaderMap,
        task: &Task,
        attempt: u32,
        now_ms: UnixMs,
    ) {
        let mut set = |name: &'static str, value: String| {
            // Ids, numbers and queue names are ASCII by construction, so this cannot fail;
            // a failure would only drop the header, never panic.
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        };
        set(HEADER_TASK_ID, task.id.to_string());
        set(HEADER_QUEUE, task.queue.to_string());
        set(HEADER_ATTEMPT, attempt.to_string());
        set(HEADER_DUE_AT, task.due_at_ms.to_string());
        // A sharded schedule's firing: its `belfry-shard*` headers were skipped with the
        // other reserved names, and are set here from the task, as every sink does.
        if let Some((schedule, fire_ms)) = crate::metadata::firing(task) {
            set(crate::metadata::HEADER_SCHEDULE, schedule.to_owned());
            set(crate::metadata::HEADER_FIRE_TIME, fire_ms.to_owned());
        }
        if let Some((index, count)) = crate::metadata::shard(task) {
            set(crate::metadata::HEADER_SHARD, index.to_owned());
            set(crate::metadata::HEADER_SHARD_COUNT, count.to_owned());
        }
        if let Some(mac) = &self.mac {
            let timestamp = (now_ms / 1000).to_string();
            let task_id = task.id.to_string();
            let mut signed = signature::sign_with(mac, &task_id, &timestamp, &task.payload);
            if let Some(previous) = &self.previous_mac {
                // A second entry in each header, under the secret being rotated out.
                let old = signature::sign_with(previous, &task_id, &timestamp, &task.payload);
                for (value, entry) in [(&mut signed.v1, old.v1), (&mut signed.v2, old.v2)] {
                    value.push(',');
                    value.push_str(&entry);
                }
            }
            set(HEADER_SIGNATURE, signed.v1);
            set(HEADER_SIGNATURE_V2, signed.v2);
            set(HEADER_TIMESTAMP, timestamp);
        }
    }

    async fn deliver_once(&self, task: &Task, attempt: u32, now_ms: UnixMs) -> Outcome {
        // The task's own target, checked again: the policy may have changed since the submit.
        let own = match task.target.as_deref() {
            None => None,
            Some(text) => match target::validate_webhook_url(text, &self.policy) {
                Ok(url) => Some(url),
                Err(e) => {
                    let outcome = Outcome::Reject {
                        reason: format!("the task's target is refused: {e}"),
                    };
                    self.log(task, attempt, &outcome, &redact_url_text(text));
                    return outcome;
                }
            },
        };
        let url = own.as_ref().unwrap_or(&self.url);
        let (outcome, refused_by_policy) = self.send(url, task, attempt, now_ms).await;
        match &own {
            None => {
                match &outcome {
                    // Belfry's own target rule refused it: the receiver never answered.
                    Outcome::Reject { reason } if refused_by_policy => {
                        self.health.record_refused(reason)
                    }
                    _ => self.health.record(&outcome),
                }
                self.log(task, attempt, &outcome, &self.url_for_logs);
            }
            Some(own) => self.log(task, attempt, &outcome, &redact_url(own)),
        }
        outcome
    }

    /// One request to `url`, and what came of it; `true` with it when belfry's own target rule
    /// refused the connection (the receiver never answered).
    async fn send(&self, url: &Url, task: &Task, attempt: u32, now_ms: UnixMs) -> (Outcome, bool) {
        let request = self
            .client
            .post(url.clone())
            .headers(self.headers(
                task,
                attempt,
                now_ms,
                fixed_headers::trusted(&self.url, url),
            ))
            .timeout(self.timeout)
            // `Bytes` clones share the buffer: the payload is not copied.
            .body(task.payload.clone());
        match request.send().await {
            Ok(response) => (self.answered(response, url, now_ms).await, false),
            Err(error) => {
                let failure = transport_failure(&error);
                let detail = if failure == TransportFailure::Timeout {
                    format!("no complete answer within {} ms", self.timeout.as_millis())
                } else {
                    describe(&error)
                };
                let outcome = classify_transport(failure, &detail);
                (outcome, failure == TransportFailure::ForbiddenTarget)
            }
        }
    }

    /// The outcome of a request the receiver answered.
    async fn answered(&self, response: reqwest::Response, url: &Url, now_ms: UnixMs) -> Outcome {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|value| value.as_bytes().to_vec());
        if status.is_success() {
            // Read the (usually empty or tiny) body anyway: a connection whose response was
            // read to the end goes back to the pool for the next task.
            drain_detail(response).await;
            return classify_status(status.as_u16(), None, now_ms, "");
        }
        // A redirect is not followed; where it pointed tells the operator the final URL
        // (often only a trailing slash away). Redacted like the queue's own URL.
        let location = status
            .is_redirection()
            .then(|| {
                response
                    .headers()
                    .get(LOCATION)
                    .map(|l| redacted_location(url, l))
            })
            .flatten();
        // A receiver or gateway that echoes the request's headers in its error must not put
        // the queue's credential in a dead letter's reason or a log line.
        let body = self.fixed_headers.redact(drain_detail(response).await);
        let detail = match location {
            Some(location) if body.is_empty() => format!("Location {location}"),
            Some(location) => format!("Location {location}; {body}"),
            None => body,
        };
        classify_status(status.as_u16(), retry_after.as_deref(), now_ms, &detail)
    }

    /// One line per failure, at most one each [`FAILURE_LOG_PERIOD`] per kind (retryable,
    /// rejected) for this sink, that is this queue and target; a line counts in `held_back`
    /// the failures not logged since the previous one (the metrics count every one).
    fn log(&self, task: &Task, attempt: u32, outcome: &Outcome, target: &str) {
        let queue = &task.queue;
        match outcome {
            Outcome::Delivered => {
                tracing::debug!(%queue, task = %task.id, attempt, %target, "delivered webhook")
            }
            Outcome::Retry { reason, after } => {
                if let Some(held_back) = self.retry_log.check(Instant::now()) {
                    tracing::info!(%queue, task = %task.id, attempt, %target, %reason, ?after, held_back, "webhook failed; retryable (the queue's retry policy decides whether it is tried again)")
                }
            }
            Outcome::Reject { reason } => {
                if let Some(held_back) = self.reject_log.check(Instant::now()) {
                    tracing::warn!(%queue, task = %task.id, attempt, %target, %reason, held_back, "webhook rejected the task")
                }
            }
        }
    }
}

impl Sink for WebhookSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        Box::pin(self.deliver_once(task, attempt, now_ms))
    }

    fn target(&self) -> &str {
        &self.target
    }

    fn check_task_target(&self, target: &str) -> Result<(), SinkError> {
        target::validate_webhook_url(target, &self.policy).map(|_| ())
    }

    /// Resolves the host under the target policy and opens a TCP connection to it (see
    /// [`probe`]); once per sink.
    fn open(&self) -> SinkFuture<'_, Result<(), OpenError>> {
        Box::pin(async move {
            self.opened
                .get_or_init(|| async {
                    let outcome = probe::probe(&self.url, &self.policy).await;
                    let what = format!("webhook {}", self.url_for_logs);
                    self.health.record_probe(outcome, &what)
                })
                .await
                .clone()
        })
    }

    fn health(&self) -> SinkHealth {
        self.health.get()
    }
}

/// A task's own headers that may be forwarded (see [`forwarded`]).
fn task_headers(task: &Task) -> HeaderMap {
    // The API bounds a task's headers on submit; the bound is repeated here so a task from
    // any other path cannot make a request arbitrarily large.
    let mut headers = HeaderMap::with_capacity(task.headers.len().min(HEADERS_MAX) + 7);
    for (name, value) in task.headers.iter().take(HEADERS_MAX) {
        if !forwarded(name) {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        match (
            HeaderName::from_bytes(lower.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            // `append`, so repeated names in the task all arrive.
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            // The API validates headers on submit; one that still does not fit HTTP is
            // dropped rather than failing the whole delivery. The value is not logged: it
            // may be a credential.
            _ => {
                tracing::debug!(task = %task.id, header = %lower.escape_debug(), "skip a task header that is not valid HTTP")
            }
        }
    }
    headers
}

/// A signing secret, checked and keyed; `None` for none.
fn keyed_secret(secret: Option<&str>) -> Result<Option<Hmac<Sha256>>, SinkError> {
    match secret {
        None => Ok(None),
        Some(secret) if secret.is_empty() || secret.len() > SECRET_BYTES_MAX => {
            Err(SinkError::InvalidSecret {
                len: secret.len(),
                max: SECRET_BYTES_MAX,
            })
        }
        Some(secret) => Ok(Some(signature::keyed(secret.as_bytes()))),
    }
}

/// A `Location` header as logs may show it, resolved against the URL that answered.
fn redacted_location(url: &Url, location: &HeaderValue) -> String {
    match location.to_str().ok().map(|text| url.join(text)) {
        Some(Ok(url)) => redact_url(&url),
        _ => "<invalid url>".to_owned(),
    }
}

/// Reads at most [`RESPONSE_DETAIL_BYTES_MAX`] of the body and returns it as printable text.
/// The per-request timeout still applies to this read.
async fn drain_detail(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < RESPONSE_DETAIL_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = RESPONSE_DETAIL_BYTES_MAX - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    printable(&body)
}

/// Lossy UTF-8 with control characters replaced, so a receiver cannot inject lines into logs.
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// What kind of failure a client error is. The forbidden-target check is found by walking the
/// error's sources down to our resolver's error.
fn transport_failure(error: &reqwest::Error) -> TransportFailure {
    if find_sink_error(error).is_some_and(|e| {
        matches!(
            e,
            SinkError::ForbiddenAddress { .. } | SinkError::ForbiddenTarget { .. }
        )
    }) {
        TransportFailure::ForbiddenTarget
    } else if error.is_timeout() {
        TransportFailure::Timeout
    } else if error.is_builder() {
        TransportFailure::InvalidRequest
    } else {
        TransportFailure::Connection
    }
}

fn find_sink_error(error: &reqwest::Error) -> Option<&SinkError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(found) = current.downcast_ref::<SinkError>() {
            return Some(found);
        }
        source = current.source();
    }
    None
}

/// The error and its causes on one line, without the URL (it may hold credentials).
fn describe(error: &reqwest::Error) -> String {
    if let Some(sink_error) = find_sink_error(error) {
        return sink_error.to_string();
    }
    if let Some(advice) = tls::certificate_advice(error) {
        return advice;
    }
    let mut text = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    // Our own words for the top level: reqwest's message would include the URL, and the
    // causes below it do not.
    let top = match error {
        e if e.is_timeout() => "operation timed out",
        e if e.is_connect() => "could not connect",
        e if e.is_request() => "could not send the request",
        e if e.is_body() => "could not read the response",
        _ => "request failed",
    };
    text.push_str(top);
    let mut depth = 0;
    while let Some(current) = source {
        // A bounded chain: error sources are finite, but be defensive about long ones.
        if depth >= 8 {
            break;
        }
        let piece = current.to_string();
        if !text.ends_with(&piece) {
            text.push_str(": ");
            text.push_str(&piece);
        }
        source = current.source();
        depth += 1;
    }
    printable(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::{QueueName, TaskId, TaskState};
    use bytes::Bytes;

    #[test]
    fn redacted_urls_keep_only_what_logs_need() {
        let check = |url: &str, expected: &str| {
            let parsed = Url::parse(url).expect("test URLs parse");
            assert_eq!(redact_url(&parsed), expected, "{url}");
        };
        check("https://example.com/hook", "https://example.com/hook");
        check("http://example.com:8080/a/b", "http://example.com:8080/a/b");
        check(
            "https://user:pw@example.com/hook?token=abc#frag",
            "https://example.com/hook?<redacted>",
        );
        check("http://[::1]:9/x", "http://[::1]:9/x");
        assert_eq!(redact_url_str("not a url"), "<invalid url>");
    }

    #[test]
    fn config_debug_hides_secrets() {
        let config = WebhookConfig {
            url: "https://user:pw-in-url@example.com/hook?token=tok-in-query".into(),
            secret: Some("signing-secret".into()),
            previous_secret: None,
            headers: [("X-Api-Key".to_owned(), "key-in-header".to_owned())].into(),
            timeout: TIMEOUT_DEFAULT,
        };
        let text = format!("{config:?}");
        for secret in [
            "pw-in-url",
            "tok-in-query",
            "signing-secret",
            "key-in-header",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("<redacted>")
                && text.contains("example.com")
                && text.contains("X-Api-Key"),
            "{text}"
        );
        let sink = WebhookSink::new(config, TargetPolicy::default(), reqwest::Client::new())
            .expect("valid config");
        let text = format!("{sink:?}");
        assert!(
            text.contains("x-api-key") && !text.contains("key-in-header"),
            "{text}"
        );
    }

    #[test]
    fn printable_text_cannot_break_log_lines() {
        let check = |input: &[u8], expected: &str| assert_eq!(printable(input), expected);
        check(b"plain", "plain");
        check(b" line\r\nbreak\t", "line  break");
        check(b"\x1b[31mred", "[31mred");
        check(&[0xff, b'a'], "\u{fffd}a");
    }

    fn task(headers: &[(&str, &str)]) -> Task {
        Task {
            id: TaskId(1),
            queue: QueueName::new("q").expect("valid queue name"),
            due_at_ms: 5_000,
            payload: Bytes::from_static(b"{}"),
            payload_kind: PayloadKind::Json,
            payload_dropped: false,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            priority: Default::default(),
            idempotency_key: None,
            late_policy: Default::default(),
            target: None,
            state: TaskState::Leased,
            attempts: 1,
            lease_until_ms: None,
            dead_reason: None,
        }
    }

    #[test]
    fn task_headers_never_override_belfry_or_transport_headers() {
        let sink = WebhookSink::new(
            WebhookConfig {
                secret: Some("s".into()),
                ..WebhookConfig::new("https://example.com/hook")
            },
            TargetPolicy::default(),
            reqwest::Client::new(),
        )
        .expect("valid config");
        let mut given: Vec<(String, String)> = belfry_core::headers::RESERVED_NAMES
            .iter()
            .map(|name| (name.to_uppercase(), "forged".to_owned()))
            .collect();
        for name in [
            HEADER_TASK_ID,
            HEADER_QUEUE,
            HEADER_ATTEMPT,
            HEADER_DUE_AT,
            HEADER_TIMESTAMP,
            HEADER_SIGNATURE,
            HEADER_SIGNATURE_V2,
            "Belfry-Other",
        ] {
            given.push((name.to_owned(), "forged".to_owned()));
        }
        given.push(("X-Kept".to_owned(), "kept".to_owned()));
        let given: Vec<(&str, &str)> = given
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let headers = sink.headers(&task(&given), 2, 7_999, true);

        for (name, value) in &headers {
            assert_ne!(value, "forged", "{name} was taken from the task");
        }
        assert_eq!(headers["x-kept"], "kept");
        assert_eq!(headers[HEADER_ATTEMPT], "2");
        assert_eq!(headers[HEADER_DUE_AT], "5000");
        assert_eq!(headers[HEADER_TIMESTAMP], "7");
        let signed = signature::sign(b"s", &TaskId(1).to_string(), "7", b"{}");
        assert_eq!(headers[HEADER_SIGNATURE], signed.v1);
        assert_eq!(headers[HEADER_SIGNATURE_V2], signed.v2);
        assert_eq!(headers[CONTENT_TYPE], "application/json");
        assert_eq!(headers.len(), 9, "{headers:?}");
    }

    #[test]
    fn headers_beyond_the_limit_are_dropped() {
        let sink = WebhookSink::new(
            WebhookConfig::new("https://example.com/hook"),
            TargetPolicy::default(),
            reqwest::Client::new(),
        )
        .expect("valid config");
        let names: Vec<String> = (0..HEADERS_MAX + 10).map(|i| format!("x-h{i}")).collect();
        let given: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        let headers = sink.headers(&task(&given), 1, 0, true);
        // Belfry's own four headers and Content-Type, plus the first HEADERS_MAX task headers.
        assert_eq!(headers.len(), HEADERS_MAX + 5);
        assert!(headers.contains_key(format!("x-h{}", HEADERS_MAX - 1).as_str()));
        assert!(!headers.contains_key(format!("x-h{HEADERS_MAX}").as_str()));
    }
}
