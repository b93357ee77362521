//! The `# HELP` text of every metric the server shows, so that a Prometheus user reading
//! `/metrics` (or a dashboard tool listing metrics) learns what each one counts without the
//! docs. One table, next to nothing else: a new metric gets its line here
//! (`tests/metrics.rs` checks that every series on `/metrics` has its help).

use crate::metrics::*;
use crate::reminders::{
    FEED_CACHE_HITS, FEED_CACHE_MISSES, FEED_INLINE_READS_PAUSED, FEED_REQUESTS,
    REMINDER_CHUNKS_CREATED, REMINDER_CHUNKS_PENDING, REMINDER_FANOUTS_DROPPED,
    REMINDER_FANOUTS_RUNNING, REMINDER_FANOUTS_STARTED, REMINDER_STEP_ERRORS, REMINDER_SUBSCRIBERS,
    REMINDER_USERS_FANNED_OUT,
};
use crate::schedules::{
    SCHEDULE_FIRINGS, SCHEDULE_FIRINGS_DROPPED, SCHEDULE_MISFIRES, SCHEDULE_TASKS_CREATED,
    SCHEDULE_TICK_ERRORS,
};

/// What kind of series a metric is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

const HELP: &[(&str, Kind, &str)] = &[
    (TASKS_SUBMITTED, Counter, "Tasks stored, by queue: submits, schedule firings' tasks and reminder chunks (duplicates not counted)."),
    (TASKS_DISPATCHED, Counter, "Deliveries started, by queue: tasks leased to pull consumers or handed to a push sink."),
    (TASKS_DELIVERED, Counter, "Tasks delivered, by queue: acked by a pull consumer or accepted by a push sink."),
    (TASKS_RETRIED, Counter, "Failed attempts scheduled for a retry, by queue."),
    (TASKS_DEAD_LETTERED, Counter, "Tasks moved to the dead letters, by queue."),
    (TASKS_SKIPPED_LATE, Counter, "Tasks finished undelivered because they were found later than their late policy allows, by queue."),
    (TASKS_PENDING, Gauge, "Scheduled tasks, due or not, by queue (refreshed every metrics.refresh; a deleted queue reads 0)."),
    (TASKS_DUE, Gauge, "Scheduled tasks whose due time has passed, by queue."),
    (TASKS_IN_FLIGHT, Gauge, "Tasks leased or in delivery, by queue."),
    (TASKS_DEAD, Gauge, "Dead letters, by queue."),
    (QUEUE_OLDEST_DUE_AGE, Gauge, "Seconds the queue's oldest due, undelivered task has waited since its due time (0 when none is due), by queue; rises while a queue is paused, unconsumed or its sink stalls (refreshed every metrics.refresh)."),
    (LEASES_EXPIRED, Counter, "Leases that ran out without an ack, nack, extension or dead letter (a consumer crashed or overran its visibility timeout), by queue; counted by the next claim of the queue."),
    (FIRING_LATENESS, Histogram, "Seconds from a task's due time to the start of its first delivery, by queue."),
    (HTTP_REQUEST_DURATION, Histogram, "Seconds to answer an HTTP request, by method (or other), route and status."),
    (DISPATCH_CLAIM_ERRORS, Counter, "Push dispatch claims that failed with a store error."),
    (OUTCOME_WRITE_ERRORS, Counter, "Delivery outcomes (ack, retry, dead letter) the store did not take; those tasks come again when their leases end."),
    (SINK_DURATION, Histogram, "Seconds of one delivery call to a push sink, by queue, sink type and outcome (delivered, retry, reject)."),
    (HTTP_CONNECTIONS_OPEN, Gauge, "HTTP connections open now."),
    (HTTP_CONNECTIONS_WAITING, Gauge, "Connections accepted at the cap that wait for a place."),
    (TLS_CERT_NOT_AFTER, Gauge, "When the listener's TLS certificate expires, in Unix seconds: alert well before time() reaches it (HTTPS only)."),
    (HTTP_CONNECTIONS_ACCEPTED, Counter, "HTTP connections accepted."),
    (HTTP_CONNECTIONS_CLOSED_IDLE, Counter, "Connections closed for being silent, half-sent or idle past their timeout."),
    (HTTP_CONNECTIONS_EVICTED, Counter, "Connections closed at the cap to make room for a lighter client's."),
    (HTTP_CONNECTIONS_REFUSED, Counter, "Connections refused, by reason (per_client_cap: the address holds its most)."),
    (SCHEDULE_FIRINGS, Counter, "Schedule firings stored, by queue."),
    (SCHEDULE_TASKS_CREATED, Counter, "Tasks created by schedule firings (a sharded firing makes several)."),
    (SCHEDULE_FIRINGS_DROPPED, Counter, "Due fire times not fired: dropped by a misfire policy, or their queue does not exist."),
    (SCHEDULE_MISFIRES, Counter, "Schedule ticks that found missed fire times (the server was down or behind)."),
    (SCHEDULE_TICK_ERRORS, Counter, "Schedule ticks that failed (a store error); the next tick tries again."),
    (REMINDER_SUBSCRIBERS, Gauge, "Subscriptions of all reminders."),
    (REMINDER_FANOUTS_STARTED, Counter, "Reminder firings whose fan-out started."),
    (REMINDER_FANOUTS_RUNNING, Gauge, "Reminder fan-outs in progress."),
    (REMINDER_FANOUTS_DROPPED, Counter, "Reminder fan-outs dropped because their queue does not exist (counted as started too)."),
    (REMINDER_CHUNKS_CREATED, Counter, "Fan-out chunks stored as tasks."),
    (REMINDER_CHUNKS_PENDING, Gauge, "Fan-out chunks planned and not made yet (a paced fan-out makes them at its rate)."),
    (REMINDER_USERS_FANNED_OUT, Counter, "Subscribers put into fan-out chunks."),
    (REMINDER_STEP_ERRORS, Counter, "Reminder runner steps that failed for a reminder (a store error); the next step tries again."),
    (FEED_REQUESTS, Counter, "User feed requests, by outcome: ok, not_modified (304) or degraded (answered from memory under overload)."),
    (FEED_CACHE_HITS, Counter, "Feed reads answered from the reminder content cache."),
    (FEED_CACHE_MISSES, Counter, "Feed reads that had to read reminder contents from the store."),
    (FEED_INLINE_READS_PAUSED, Counter, "Times the feed stopped reading the store on request workers because reads had turned slow."),
];

/// Gives every metric its help text. Call once the recorder is installed (descriptions sent
/// to no recorder are lost).
pub fn describe() {
    for &(name, kind, help) in HELP {
        match kind {
            Counter => metrics::describe_counter!(name, help),
            Gauge => metrics::describe_gauge!(name, help),
            Histogram => metrics::describe_histogram!(name, help),
        }
    }
}
