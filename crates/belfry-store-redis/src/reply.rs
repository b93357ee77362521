//! Reading Redis replies and records into belfry's types: every unexpected shape is a typed
//! error (`StoreError::Corrupt`), never a panic.

use belfry_core::{QueueName, Task, TaskId, TaskState, UnixMs};
use belfry_store::StoreError;
use bytes::Bytes;
use redis::Value;

use crate::conn::Result;
use crate::keys::seq_of;
use crate::record::{self, Record};

pub(crate) fn corrupt(location: &str, detail: String) -> StoreError {
    StoreError::Corrupt {
        location: location.to_owned(),
        detail,
    }
}

/// One reply per command sent, else a corrupt-reply error naming both counts: zipping a
/// short list with what was sent would drop the rest's answers without a word.
pub(crate) fn one_reply_each(location: &str, replies: usize, sent: usize) -> Result<()> {
    if replies == sent {
        return Ok(());
    }
    Err(corrupt(
        location,
        format!("{replies} replies to {sent} commands"),
    ))
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record> {
    record::decode(&Bytes::copy_from_slice(bytes))
        .map_err(|detail| corrupt("redis task record", detail))
}

/// A record as the task it describes at `now_ms`: a lease that has ended reads as scheduled.
pub(crate) fn to_task(
    r: Record,
    id: TaskId,
    queue: &QueueName,
    dead_reason: Option<String>,
    now_ms: UnixMs,
    just_leased: bool,
) -> Task {
    let mut state = r.state;
    let mut lease_until = (state == TaskState::Leased).then_some(r.lease_until_ms);
    if state == TaskState::Leased && !just_leased && r.lease_until_ms <= now_ms {
        state = TaskState::Scheduled;
        lease_until = None;
    }
    Task {
        id,
        queue: queue.clone(),
        due_at_ms: r.due_at_ms,
        payload: r.payload,
        payload_kind: r.payload_kind,
        // A finished record is kept without its payload (`finish` in `lua/prelude.lua`).
        payload_dropped: matches!(
            r.state,
            TaskState::Done | TaskState::Cancelled | TaskState::Skipped
        ),
        headers: r.headers,
        priority: r.priority,
        idempotency_key: r.idempotency_key,
        late_policy: r.late_policy,
        target: r.target,
        state,
        attempts: r.attempts,
        lease_until_ms: lease_until,
        dead_reason: if state == TaskState::Dead {
            dead_reason
        } else {
            None
        },
    }
}

pub(crate) fn as_array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

pub(crate) fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Double(d) => Some(*d as i64),
        _ => None,
    }
}

pub(crate) fn as_seq(v: &Value) -> Option<u64> {
    seq_of(as_bytes(v)?)
}
