//! The tasks a run submits: payloads that carry their own index (so a receipt identifies
//! its task without any lookup), due times spread evenly over a window, and request bodies
//! built before the clock starts so the client does no JSON work while measuring.

use bytes::Bytes;
use serde::Deserialize;

use crate::error::{within, BenchError};

/// Smallest payload: room for the index object `{"i":<20 digits>,"p":""}`.
pub const PAYLOAD_BYTES_MIN: usize = 32;

/// Largest payload the bench generates; the server's default limit is 1 MiB.
pub const PAYLOAD_BYTES_MAX: usize = 1024 * 1024;

/// Most bytes an NDJSON line holds besides its payload: `{"payload":,"run_at_ms":}`, a
/// due time of up to 20 digits and the newline, rounded up.
pub const NDJSON_LINE_OVERHEAD_BYTES: usize = 64;

/// Due times for `count` tasks spread evenly over `[start_ms, start_ms + window_ms)`, in
/// order, so task `i` is due no earlier than task `i - 1`.
pub fn due_times(count: u64, start_ms: u64, window_ms: u64) -> Vec<u64> {
    (0..count)
        .map(|i| {
            start_ms + (u128::from(i) * u128::from(window_ms) / u128::from(count.max(1))) as u64
        })
        .collect()
}

/// A JSON payload of exactly `bytes` bytes (or the minimum it needs) naming task `index`.
pub fn payload(index: u64, bytes: usize) -> String {
    let head = format!("{{\"i\":{index},\"p\":\"");
    let pad = bytes.saturating_sub(head.len() + 2);
    let mut s = String::with_capacity(head.len() + pad + 2);
    s.push_str(&head);
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str("\"}");
    s
}

#[derive(Deserialize)]
struct IndexOnly {
    i: u64,
}

/// The index of a payload made by [`payload`].
pub fn parse_index(payload: &[u8]) -> Option<u64> {
    serde_json::from_slice::<IndexOnly>(payload)
        .ok()
        .map(|p| p.i)
}

/// One task in the API's submit shape.
pub fn task_json(index: u64, due_at_ms: u64, payload_bytes: usize) -> String {
    format!(
        "{{\"payload\":{},\"run_at_ms\":{due_at_ms}}}",
        payload(index, payload_bytes)
    )
}

/// Request bodies for all tasks: one task per body when `batch == 1` (the single-task
/// endpoint), otherwise `{"tasks":[...]}` with up to `batch` tasks each; or, built by
/// [`Bodies::ndjson`], the streamed import's NDJSON with up to `batch` lines each.
#[derive(Debug)]
pub struct Bodies {
    /// Tasks per body (the last may hold fewer).
    pub batch: usize,
    pub bodies: Vec<Bytes>,
    /// Index of the first task of each body; body `b` holds tasks `first[b]..first[b+1]`.
    pub first: Vec<u64>,
    pub tasks: u64,
}

impl Bodies {
    pub fn build(due_at_ms: &[u64], batch: usize, payload_bytes: usize) -> Self {
        Bodies::from_tasks(due_at_ms, batch, |index, due| {
            task_json(index, due, payload_bytes)
        })
    }

    /// Request bodies of `batch` tasks each (one bare task object when `batch` is 1), the
    /// JSON of each task written by `task(index in due_at_ms, due time)`.
    pub fn from_tasks(
        due_at_ms: &[u64],
        batch: usize,
        mut task: impl FnMut(u64, u64) -> String,
    ) -> Self {
        let batch = batch.max(1);
        let mut bodies = Vec::with_capacity(due_at_ms.len().div_ceil(batch));
        let mut first = Vec::with_capacity(bodies.capacity());
        for (chunk_number, chunk) in due_at_ms.chunks(batch).enumerate() {
            let start = (chunk_number * batch) as u64;
            first.push(start);
            if batch == 1 {
                bodies.push(Bytes::from(task(start, chunk[0])));
                continue;
            }
            let mut body = String::new();
            body.push_str("{\"tasks\":[");
            for (offset, &due) in chunk.iter().enumerate() {
                if offset > 0 {
                    body.push(',');
                }
                body.push_str(&task(start + offset as u64, due));
            }
            body.push_str("]}");
            bodies.push(Bytes::from(body));
        }
        Bodies {
            batch,
            bodies,
            first,
            tasks: due_at_ms.len() as u64,
        }
    }

    /// Bodies for the streamed import (`tasks:import`): up to `lines` tasks each, one task
    /// object a line in the single submit's shape, every line ending in `\n` (the last too,
    /// as a file written line by line would).
    pub fn ndjson(due_at_ms: &[u64], lines: usize, payload_bytes: usize) -> Self {
        let lines = lines.max(1);
        let mut bodies = Vec::with_capacity(due_at_ms.len().div_ceil(lines));
        let mut first = Vec::with_capacity(bodies.capacity());
        for (chunk_number, chunk) in due_at_ms.chunks(lines).enumerate() {
            let start = (chunk_number * lines) as u64;
            first.push(start);
            let mut body =
                String::with_capacity(chunk.len() * (payload_bytes + NDJSON_LINE_OVERHEAD_BYTES));
            for (offset, &due) in chunk.iter().enumerate() {
                body.push_str(&task_json(start + offset as u64, due, payload_bytes));
                body.push('\n');
            }
            bodies.push(Bytes::from(body));
        }
        Bodies {
            batch: lines,
            bodies,
            first,
            tasks: due_at_ms.len() as u64,
        }
    }

    /// Tasks in body `b`.
    pub fn tasks_in(&self, b: usize) -> u64 {
        let end = self.first.get(b + 1).copied().unwrap_or(self.tasks);
        end - self.first[b]
    }

    pub fn total_bytes(&self) -> u64 {
        self.bodies.iter().map(|b| b.len() as u64).sum()
    }
}

/// Checks the shape arguments shared by every scenario.
pub fn validate(
    tasks: u64,
    batch: usize,
    connections: usize,
    payload_bytes: usize,
) -> Result<(), BenchError> {
    if tasks == 0 {
        return Err(BenchError::invalid("--tasks", "must be at least 1"));
    }
    if batch == 0 || batch > crate::BATCH_TASKS_MAX {
        return Err(BenchError::invalid(
            "--batch",
            format!(
                "must be 1..={} (1 = one task per request)",
                crate::BATCH_TASKS_MAX
            ),
        ));
    }
    within("--connections", connections, 1, crate::CONNECTIONS_MAX)?;
    if !(PAYLOAD_BYTES_MIN..=PAYLOAD_BYTES_MAX).contains(&payload_bytes) {
        return Err(BenchError::invalid(
            "--payload-bytes",
            format!("must be {PAYLOAD_BYTES_MIN}..={PAYLOAD_BYTES_MAX}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_have_the_asked_size_and_round_trip_their_index() {
        for index in [0, 7, 123_456, u64::MAX] {
            let p = payload(index, 200);
            assert_eq!(p.len(), 200);
            assert_eq!(parse_index(p.as_bytes()), Some(index));
        }
        assert_eq!(parse_index(b"not json"), None);
    }

    #[test]
    fn due_times_are_sorted_and_inside_the_window() {
        let due = due_times(1_000, 10_000, 20_000);
        assert_eq!(due.len(), 1_000);
        assert_eq!(due[0], 10_000);
        assert!(due.windows(2).all(|w| w[0] <= w[1]));
        assert!(*due.last().unwrap() < 30_000);
    }

    #[test]
    fn bodies_split_into_batches() {
        let due = due_times(2_500, 1, 1);
        let b = Bodies::build(&due, 1_000, 64);
        assert_eq!(b.bodies.len(), 3);
        assert_eq!((b.tasks_in(0), b.tasks_in(2)), (1_000, 500));
        let v: serde_json::Value = serde_json::from_slice(&b.bodies[2]).unwrap();
        let tasks = v["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 500);
        assert_eq!(tasks[0]["payload"]["i"], 2_000);
        let single = Bodies::build(&due[..2], 1, 64);
        let v: serde_json::Value = serde_json::from_slice(&single.bodies[1]).unwrap();
        assert_eq!(v["payload"]["i"], 1);
        assert_eq!(v["run_at_ms"], 1);
    }

    #[test]
    fn ndjson_bodies_hold_one_task_a_line_in_the_single_submit_shape() {
        let due = due_times(5, 100, 50);
        let b = Bodies::ndjson(&due, 2, 64);
        assert_eq!((b.bodies.len(), b.batch, b.tasks), (3, 2, 5));
        assert_eq!((b.tasks_in(0), b.tasks_in(2)), (2, 1));
        assert_eq!(b.first, [0, 2, 4]);
        let text = std::str::from_utf8(&b.bodies[1]).unwrap();
        // Every line ends in a newline, the last too, and holds no other.
        assert!(text.ends_with('\n'));
        let lines: Vec<&str> = text.split_terminator('\n').collect();
        assert_eq!(lines.len(), 2);
        for (offset, line) in lines.iter().enumerate() {
            let index = 2 + offset as u64;
            assert_eq!(*line, task_json(index, due[index as usize], 64));
            assert!(line.len() <= 64 + NDJSON_LINE_OVERHEAD_BYTES);
        }
        // The same tasks, byte for byte, as the batch bodies carry.
        let batch = Bodies::build(&due, 5, 64);
        let v: serde_json::Value = serde_json::from_slice(&batch.bodies[0]).unwrap();
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["tasks"][2], line);
        // More lines than tasks: one body of all of them.
        assert_eq!(Bodies::ndjson(&due, 1_000, 64).bodies.len(), 1);
    }

    #[test]
    fn arguments_are_validated() {
        assert!(validate(1, 1, 1, 200).is_ok());
        assert!(validate(0, 1, 1, 200).is_err());
        assert!(validate(1, 0, 1, 200).is_err());
        assert!(validate(1, 1_001, 1, 200).is_err());
        assert!(validate(1, 1, 0, 200).is_err());
        assert!(validate(1, 1, 100_000, 200).is_err());
        assert!(validate(1, 1, 1, 8).is_err());
        assert!(validate(1, 1, 1, PAYLOAD_BYTES_MAX + 1).is_err());
    }
}
