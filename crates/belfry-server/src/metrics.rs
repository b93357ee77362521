//! Prometheus metrics: names in one place, the process-wide recorder, and the loop that
//! refreshes per-queue gauges.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;

use axum::http::Method;
use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const TASKS_SUBMITTED: &str = "belfry_tasks_submitted_total";
/// Tasks handed to a consumer (a lease or a webhook call started).
pub const TASKS_DISPATCHED: &str = "belfry_tasks_dispatched_total";
/// Tasks finished by a consumer: acked, or a 2xx from a webhook.
pub const TASKS_DELIVERED: &str = "belfry_tasks_delivered_total";
pub const TASKS_RETRIED: &str = "belfry_tasks_retried_total";
pub const TASKS_DEAD_LETTERED: &str = "belfry_tasks_dead_lettered_total";
/// Tasks dropped by a `skip` late policy.
pub const TASKS_SKIPPED_LATE: &str = "belfry_tasks_skipped_late_total";
pub const TASKS_PENDING: &str = "belfry_tasks_pending";
pub const TASKS_DUE: &str = "belfry_tasks_due";
pub const TASKS_IN_FLIGHT: &str = "belfry_tasks_in_flight";
pub const TASKS_DEAD: &str = "belfry_tasks_dead";
/// How long the queue's oldest due, undelivered task has waited: now − its due time.
pub const QUEUE_OLDEST_DUE_AGE: &str = "belfry_queue_oldest_due_age_seconds";
/// Leases (pull leases and push deliveries' leases) that ran out without an ack, a nack,
/// an extension or a dead letter.
pub const LEASES_EXPIRED: &str = "belfry_leases_expired_total";
/// Delivery start minus due time, in seconds.
pub const FIRING_LATENESS: &str = "belfry_firing_lateness_seconds";
pub const HTTP_REQUEST_DURATION: &str = "belfry_http_request_duration_seconds";
/// The dispatcher's claims that failed (store errors); never API admission refusals.
pub const DISPATCH_CLAIM_ERRORS: &str = "belfry_dispatch_claim_errors_total";
/// Delivery outcomes (ack, retry, dead letter) the store did not take (store errors).
pub const OUTCOME_WRITE_ERRORS: &str = "belfry_outcome_write_errors_total";
/// One delivery call to a sink (a webhook request, a stream publish), by queue, sink type and
/// outcome (`delivered`, `retry`, `reject`): its count is deliveries by outcome class.
pub const SINK_DURATION: &str = "belfry_sink_duration_seconds";

/// HTTP connections open now, and counters of the listener's decisions: accepted, closed
/// for idling past their timeout, refused for their client address's cap.
pub const HTTP_CONNECTIONS_OPEN: &str = "belfry_http_connections_open";
pub const HTTP_CONNECTIONS_ACCEPTED: &str = "belfry_http_connections_accepted_total";
pub const HTTP_CONNECTIONS_CLOSED_IDLE: &str = "belfry_http_connections_closed_idle_total";
pub const HTTP_CONNECTIONS_REFUSED: &str = "belfry_http_connections_refused_total";
/// Connections closed at the cap to make room for a lighter client's, and connections
/// accepted at the cap that wait for a place now.
pub const HTTP_CONNECTIONS_EVICTED: &str = "belfry_http_connections_evicted_total";
pub const HTTP_CONNECTIONS_WAITING: &str = "belfry_http_connections_waiting";
/// When the listener's TLS certificate stops being valid, in Unix seconds (HTTPS only).
pub const TLS_CERT_NOT_AFTER: &str = "belfry_tls_cert_not_after_timestamp_seconds";

/// Lateness buckets: from 1 ms (the precision we promise) to minutes (after an outage).
const LATENESS_BUCKETS_S: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const LATENCY_BUCKETS_S: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder once (several servers in one test process share it) and
/// returns the handle that renders it, or `None` when another recorder was installed first.
pub fn handle() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(FIRING_LATENESS.into()), LATENESS_BUCKETS_S)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(HTTP_REQUEST_DURATION.into()),
                        LATENCY_BUCKETS_S,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(SINK_DURATION.into()),
                        LATENCY_BUCKETS_S,
                    )
                });
            match builder {
                Ok(builder) => {
                    let recorder = builder.build_recorder();
                    let handle = recorder.handle();
                    match metrics::set_global_recorder(recorder) {
                        Ok(()) => Some(handle),
                        Err(e) => {
                            tracing::warn!(error = %e, "install the metrics recorder: another one is installed; /metrics will be empty");
                            None
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "configure metric buckets");
                    None
                }
            }
        })
        .clone()
}

/// Handles each worker thread keeps per metric at most (label sets are few: routes × methods ×
/// statuses, or queues). Past it the thread's cache is emptied and refills, so a flood of
/// distinct labels costs lookups, not memory.
const CACHED_HANDLES_MAX: usize = 512;

thread_local! {
    /// `belfry_tasks_submitted_total` per queue.
    static SUBMITTED: RefCell<HashMap<Box<str>, Counter>> = RefCell::new(HashMap::new());
    /// `belfry_http_request_duration_seconds` per route, then per (method, status).
    static REQUESTS: RefCell<RequestHistograms> = RefCell::new(RequestHistograms::default());
}

#[derive(Default)]
struct RequestHistograms {
    by_route: HashMap<Box<str>, Vec<(&'static str, u16, Histogram)>>,
    len: usize,
}

/// Whether the process-wide recorder is settled. Handles registered before it is installed
/// are no-ops, so they are cached only after: `handle()` has then run, and whichever
/// recorder it found or installed stays for the life of the process.
fn recorder_settled() -> bool {
    HANDLE.get().is_some()
}

/// Counted on every submit: the handle is looked up once per queue and thread, not built
/// from an owned label (an allocation, a key hash and a registry lookup) per request.
pub fn submitted(queue: &str, n: usize) {
    if !recorder_settled() {
        counter!(TASKS_SUBMITTED, "queue" => queue.to_owned()).increment(n as u64);
        return;
    }
    SUBMITTED.with_borrow_mut(|cache| {
        if let Some(counter) = cache.get(queue) {
            counter.increment(n as u64);
            return;
        }
        if cache.len() >= CACHED_HANDLES_MAX {
            cache.clear();
        }
        let counter = counter!(TASKS_SUBMITTED, "queue" => queue.to_owned());
        counter.increment(n as u64);
        cache.insert(queue.into(), counter);
    });
}

pub fn dispatched(queue: &str, n: usize) {
    counter!(TASKS_DISPATCHED, "queue" => queue.to_owned()).increment(n as u64);
}

pub fn delivered(queue: &str, n: usize) {
    counter!(TASKS_DELIVERED, "queue" => queue.to_owned()).increment(n as u64);
}

pub fn retried(queue: &str) {
    counter!(TASKS_RETRIED, "queue" => queue.to_owned()).increment(1);
}

pub fn dead_lettered(queue: &str, n: usize) {
    counter!(TASKS_DEAD_LETTERED, "queue" => queue.to_owned()).increment(n as u64);
}

pub fn skipped_late(queue: &str, n: usize) {
    counter!(TASKS_SKIPPED_LATE, "queue" => queue.to_owned()).increment(n as u64);
}

pub fn leases_expired(queue: &str, n: u64) {
    counter!(LEASES_EXPIRED, "queue" => queue.to_owned()).increment(n);
}

/// Records how late each of a batch of deliveries started, in one histogram lookup.
pub fn lateness(queue: &str, late_ms: impl Iterator<Item = u64>) {
    let histogram = histogram!(FIRING_LATENESS, "queue" => queue.to_owned());
    for ms in late_ms {
        histogram.record(ms as f64 / 1000.0);
    }
}

pub fn sink_duration(queue: &str, sink: &'static str, outcome: &'static str, seconds: f64) {
    histogram!(SINK_DURATION, "queue" => queue.to_owned(), "sink" => sink, "outcome" => outcome)
        .record(seconds);
}

/// Recorded for every request: the handle comes from the thread's cache, so a request
/// builds no label strings (three allocations, a key hash and a registry lookup, about 2k
/// instructions of a single-task submit's ~45k before).
pub fn http_request(method: &Method, route: &str, status: u16, seconds: f64) {
    let method = method_label(method);
    if !recorder_settled() {
        request_histogram(method, route, status).record(seconds);
        return;
    }
    REQUESTS.with_borrow_mut(|cache| {
        if let Some(found) = cache.by_route.get(route).and_then(|handles| {
            handles
                .iter()
                .find(|(m, s, _)| *s == status && *m == method)
        }) {
            found.2.record(seconds);
            return;
        }
        if cache.len >= CACHED_HANDLES_MAX {
            cache.by_route.clear();
            cache.len = 0;
        }
        let histogram = request_histogram(method, route, status);
        histogram.record(seconds);
        cache
            .by_route
            .entry(route.into())
            .or_default()
            .push((method, status, histogram));
        cache.len += 1;
    });
}

/// The `method` label: one of the methods HTTP defines, or `other`. A client may send any
/// token as its method (and is answered 405 or 401), so taking it as written would let
/// anyone add series without bound.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("other", |known| known.as_str())
}

fn request_histogram(method: &'static str, route: &str, status: u16) -> Histogram {
    histogram!(
        HTTP_REQUEST_DURATION,
        "method" => method,
        "route" => route.to_owned(),
        "status" => status.to_string()
    )
}

/// Sets a queue's gauges from its counts taken at `now_ms`.
pub fn queue_counts(queue: &str, counts: &belfry_store::QueueCounts, now_ms: u64) {
    gauge!(TASKS_PENDING, "queue" => queue.to_owned()).set(counts.pending as f64);
    gauge!(TASKS_DUE, "queue" => queue.to_owned()).set(counts.due as f64);
    gauge!(TASKS_IN_FLIGHT, "queue" => queue.to_owned()).set(counts.in_flight as f64);
    gauge!(TASKS_DEAD, "queue" => queue.to_owned()).set(counts.dead as f64);
    let age_ms = counts
        .oldest_due_ms
        .map_or(0, |due| now_ms.saturating_sub(due));
    gauge!(QUEUE_OLDEST_DUE_AGE, "queue" => queue.to_owned()).set(age_ms as f64 / 1000.0);
}

/// Shows every counter whose labels are known in advance at 0 from the start, so that a
/// query or an alert on one (`rate(belfry_schedule_tick_errors_total[5m]) > 0`) finds the
/// series before its first event rather than nothing. Counters per queue appear with
/// their queue's first event.
pub fn register_at_zero() {
    use crate::reminders::{
        FEED_CACHE_HITS, FEED_CACHE_MISSES, FEED_INLINE_READS_PAUSED, FEED_REQUESTS,
        REMINDER_CHUNKS_CREATED, REMINDER_FANOUTS_DROPPED, REMINDER_FANOUTS_STARTED,
        REMINDER_STEP_ERRORS, REMINDER_USERS_FANNED_OUT,
    };
    use crate::schedules::{
        SCHEDULE_FIRINGS_DROPPED, SCHEDULE_MISFIRES, SCHEDULE_TASKS_CREATED, SCHEDULE_TICK_ERRORS,
    };
    for name in [
        DISPATCH_CLAIM_ERRORS,
        OUTCOME_WRITE_ERRORS,
        SCHEDULE_TASKS_CREATED,
        SCHEDULE_FIRINGS_DROPPED,
        SCHEDULE_MISFIRES,
        SCHEDULE_TICK_ERRORS,
        REMINDER_FANOUTS_STARTED,
        REMINDER_CHUNKS_CREATED,
        REMINDER_USERS_FANNED_OUT,
        REMINDER_STEP_ERRORS,
        REMINDER_FANOUTS_DROPPED,
        FEED_CACHE_HITS,
        FEED_CACHE_MISSES,
        FEED_INLINE_READS_PAUSED,
    ] {
        counter!(name).increment(0);
    }
    for outcome in ["ok", "not_modified", "degraded"] {
        counter!(FEED_REQUESTS, "outcome" => outcome).increment(0);
    }
}

pub fn dispatch_claim_error() {
    counter!(DISPATCH_CLAIM_ERRORS).increment(1);
}

/// A delivery's outcome (ack, retry, dead letter) that could not be written: the task comes
/// again when its lease expires.
pub fn outcome_write_error() {
    counter!(OUTCOME_WRITE_ERRORS).increment(1);
}

/// One feed request, by outcome: `ok`, `not_modified` (a matching `If-None-Match`), or
/// `degraded` (answered from memory while the store was saturated).
pub fn feed_request(outcome: &'static str) {
    metrics::counter!(crate::reminders::FEED_REQUESTS, "outcome" => outcome).increment(1);
}

/// Copies the listener's connection counts into the metrics, just before they are rendered
/// (the listener keeps plain atomics: its accept loop pays no recorder lookup).
pub fn connections(stats: &crate::listener::ConnectionStats) {
    use std::sync::atomic::Ordering::Relaxed;
    gauge!(HTTP_CONNECTIONS_OPEN).set(stats.open.load(Relaxed) as f64);
    counter!(HTTP_CONNECTIONS_ACCEPTED).absolute(stats.accepted.load(Relaxed));
    counter!(HTTP_CONNECTIONS_CLOSED_IDLE).absolute(stats.closed_idle.load(Relaxed));
    counter!(HTTP_CONNECTIONS_REFUSED, "reason" => "per_client_cap")
        .absolute(stats.refused_per_client.load(Relaxed));
    counter!(HTTP_CONNECTIONS_EVICTED).absolute(stats.evicted.load(Relaxed));
    gauge!(HTTP_CONNECTIONS_WAITING).set(stats.waiting.load(Relaxed) as f64);
}
