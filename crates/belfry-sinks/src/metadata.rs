//! What every sink tells a consumer besides the payload: one list of names, so a consumer can
//! move from webhooks to a stream and keep its deduplication and shard logic.
//!
//! HTTP and Kafka/NATS headers use the `belfry-*` names below; Redis stream fields use the
//! short names documented in `docs/sinks/redis_stream.md`. A task's own headers follow, except
//! names starting with `belfry-` (a producer must not forge the task id or attempt a consumer
//! deduplicates on); the shard headers a schedule adds are carried as metadata instead.

use belfry_core::limits::HEADERS_MAX;
use belfry_core::schedule::{FIRE_TIME_HEADER, SCHEDULE_HEADER, SHARD_COUNT_HEADER, SHARD_HEADER};
use belfry_core::{PayloadKind, Task};

pub const HEADER_TASK_ID: &str = "belfry-task-id";
pub const HEADER_QUEUE: &str = "belfry-queue";
pub const HEADER_ATTEMPT: &str = "belfry-attempt";
pub const HEADER_DUE_AT: &str = "belfry-due-at";
pub const HEADER_SHARD: &str = "belfry-shard";
pub const HEADER_SHARD_COUNT: &str = "belfry-shard-count";
pub const HEADER_SCHEDULE: &str = "belfry-schedule";
pub const HEADER_FIRE_TIME: &str = "belfry-fire-time";
pub const HEADER_CONTENT_TYPE: &str = "content-type";

/// Task header names starting with this are the server's (never forwarded as the task's own).
pub const RESERVED_HEADER_PREFIX: &str = "belfry-";

/// `application/json` or `application/octet-stream`, as a webhook's `Content-Type`.
pub fn content_type(kind: PayloadKind) -> &'static str {
    match kind {
        PayloadKind::Json => "application/json",
        PayloadKind::Binary => "application/octet-stream",
    }
}

/// The value of the task's header `wanted` (any case).
fn find<'a>(task: &'a Task, wanted: &str) -> Option<&'a str> {
    task.headers
        .iter()
        .take(HEADERS_MAX)
        .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
        .map(|(_, value)| value.as_str())
}

/// The shard index and count a schedule's firing carries, when the task has them.
pub fn shard(task: &Task) -> Option<(&str, &str)> {
    Some((find(task, SHARD_HEADER)?, find(task, SHARD_COUNT_HEADER)?))
}

/// The schedule id and fire time (unix ms) a schedule's firing carries, when the task is one.
pub fn firing(task: &Task) -> Option<(&str, &str)> {
    Some((find(task, SCHEDULE_HEADER)?, find(task, FIRE_TIME_HEADER)?))
}

/// The metadata of one attempt as `(name, value)` pairs with the `belfry-*` names, in a fixed
/// order: task id, queue, attempt, due time, content type, then the shard when there is one.
pub fn headers(task: &Task, attempt: u32) -> Vec<(&'static str, String)> {
    let mut out = vec![
        (HEADER_TASK_ID, task.id.to_string()),
        (HEADER_QUEUE, task.queue.as_str().to_owned()),
        (HEADER_ATTEMPT, attempt.to_string()),
        (HEADER_DUE_AT, task.due_at_ms.to_string()),
        (
            HEADER_CONTENT_TYPE,
            content_type(task.payload_kind).to_owned(),
        ),
    ];
    if let Some((schedule, fire_ms)) = firing(task) {
        out.push((HEADER_SCHEDULE, schedule.to_owned()));
        out.push((HEADER_FIRE_TIME, fire_ms.to_owned()));
    }
    if let Some((index, count)) = shard(task) {
        out.push((HEADER_SHARD, index.to_owned()));
        out.push((HEADER_SHARD_COUNT, count.to_owned()));
    }
    out
}

/// The task's own headers that are forwarded (bounded by `HEADERS_MAX`, reserved names and
/// names `skip` refuses left out), in the task's order.
pub fn own_headers<'a>(
    task: &'a Task,
    skip: impl Fn(&str) -> bool + 'a,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    task.headers
        .iter()
        .take(HEADERS_MAX)
        .filter(move |(name, _)| {
            let reserved = name
                .get(..RESERVED_HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX));
            !reserved && !skip(name)
        })
        .map(|(name, value)| (name.as_str(), value.as_str()))
}
