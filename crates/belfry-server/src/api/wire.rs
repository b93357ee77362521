//! Hand-written JSON for the hot responses (lease, batch ack, submits).
//!
//! These bodies are written straight into one pre-sized buffer instead of going through serde's
//! DTOs: building a `LeasedView` per task (a `String` for the id, the queue, the lease id and a
//! copy of the payload, a `BTreeMap` for the headers) and then serializing it cost about twice
//! what the engine's claim of the same task costs, and that work shares the node's two cores
//! with dispatch. The bytes are the same as the serde shapes in `dto/` produce (field order,
//! escaping, number format): the tests below compare the two for many kinds of task.

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use belfry_core::{LeasedTask, PayloadKind, Priority, QueueName, TaskId, UnixMs};
use serde_json::value::RawValue;

use super::error::ErrorBody;

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Bytes of one leased task's JSON besides its payload, queue name and headers, rounded up:
/// the field names, a 32-digit id, four numbers and punctuation come to about 190.
const LEASED_TASK_FIXED_BYTES: usize = 224;

/// Bytes of one `{"id": …, "ok": true}` batch-ack result.
const ACK_RESULT_BYTES: usize = 56;

/// Bytes of one `Created` result besides the queue name.
const CREATED_FIXED_BYTES: usize = 96;

/// A finished JSON body as a response, with the content type `axum::Json` sets.
pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A task id's text form (32 lowercase hex digits, as `TaskId`'s `Display`), without going
/// through `core::fmt`.
pub fn hex_id(id: TaskId) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (pair, byte) in out.chunks_exact_mut(2).zip(id.to_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A task id from text: the same texts as `TaskId::from_str` accepts (exactly 32 hex digits,
/// either case), `None` otherwise so the caller can produce that parser's error.
pub fn parse_hex_id(text: &str) -> Option<TaskId> {
    let bytes = text.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut value: u128 = 0;
    for &b in bytes {
        value = (value << 4) | u128::from(hex_value(b)?);
    }
    Some(TaskId::from_u128(value))
}

/// "00" to "99": two digits per division when writing numbers (due times and lease ids have
/// 13 to 20 digits, and a lease answer writes four numbers per task).
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `value` in decimal, as serde_json writes integers.
pub fn push_u64(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    while value >= 100 {
        let pair = (value % 100) as usize * 2;
        value /= 100;
        start -= 2;
        digits[start..start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if value >= 10 {
        let pair = value as usize * 2;
        start -= 2;
        digits[start..start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        start -= 1;
        digits[start] = b'0' + value as u8;
    }
    out.extend_from_slice(&digits[start..]);
}

/// A JSON string: quoted and escaped as serde_json escapes (only `"`, `\` and control
/// characters). Strings that need no escaping (ids, queue names) are copied as they are.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    if text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        // Rare (header values, error messages): serde_json's own escaper. Writing to a Vec
        // cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    } else {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }
}

fn push_id(out: &mut Vec<u8>, id: TaskId) {
    out.push(b'"');
    out.extend_from_slice(&hex_id(id));
    out.push(b'"');
}

fn priority_str(p: Priority) -> &'static str {
    match p {
        Priority::High => "high",
        Priority::Normal => "normal",
    }
}

/// The payload fields of a task, as `PayloadView` shows them: JSON payloads as the producer's
/// text (`"payload":…`), bytes, or stored text that is not JSON, as `"payload_base64":"…"`.
pub fn push_payload(out: &mut Vec<u8>, kind: PayloadKind, bytes: &[u8]) {
    if kind == PayloadKind::Json {
        // Checked without copying: a borrowed RawValue is the same check (and the same
        // whitespace trimming) as the owned one `PayloadView` makes.
        let raw = std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| serde_json::from_str::<&RawValue>(text).ok());
        if let Some(raw) = raw {
            out.extend_from_slice(b"\"payload\":");
            out.extend_from_slice(raw.get().as_bytes());
            return;
        }
    }
    out.extend_from_slice(b"\"payload_base64\":\"");
    let start = out.len();
    out.resize(
        start + base64::encoded_len(bytes.len(), true).unwrap_or(0),
        0,
    );
    let written = BASE64.encode_slice(bytes, &mut out[start..]).unwrap_or(0);
    out.truncate(start + written);
    out.push(b'"');
}

/// Headers as a JSON object in key order, a repeated name keeping its last value (what the
/// `BTreeMap` of the views does).
pub fn push_headers(out: &mut Vec<u8>, headers: &[(String, String)]) {
    if headers.is_empty() {
        out.extend_from_slice(b"{}");
        return;
    }
    let map: BTreeMap<&str, &str> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    out.push(b'{');
    for (i, (name, value)) in map.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, name);
        out.push(b':');
        push_str(out, value);
    }
    out.push(b'}');
}

/// The answer to a lease call: `{"tasks":[…]}`, each task as docs/api.md shows it.
pub fn leased_list(tasks: &[LeasedTask]) -> Vec<u8> {
    let size: usize = tasks
        .iter()
        .map(|t| {
            LEASED_TASK_FIXED_BYTES
                + t.task.payload.len()
                + t.task.queue.as_str().len()
                + t.task.target.as_ref().map_or(0, |t| t.len() + 12)
                + t.task
                    .headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 6)
                    .sum::<usize>()
        })
        .sum();
    let mut out = Vec::with_capacity(16 + size);
    // A lease answers from one queue: its name is escaped once, not once per task.
    let mut queue: Option<(&QueueName, Vec<u8>)> = None;
    out.extend_from_slice(b"{\"tasks\":[");
    for (i, leased) in tasks.iter().enumerate() {
        let task = &leased.task;
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        push_id(&mut out, task.id);
        out.extend_from_slice(b",\"queue\":");
        match &queue {
            Some((name, json)) if *name == &task.queue => out.extend_from_slice(json),
            _ => {
                let mut json = Vec::with_capacity(task.queue.as_str().len() + 2);
                push_str(&mut json, task.queue.as_str());
                out.extend_from_slice(&json);
                queue = Some((&task.queue, json));
            }
        }
        out.push(b',');
        push_payload(&mut out, task.payload_kind, &task.payload);
        out.extend_from_slice(b",\"headers\":");
        push_headers(&mut out, &task.headers);
        out.extend_from_slice(b",\"attempt\":");
        push_u64(&mut out, u64::from(task.attempts));
        out.extend_from_slice(b",\"due_at_ms\":");
        push_u64(&mut out, task.due_at_ms);
        out.extend_from_slice(b",\"priority\":\"");
        out.extend_from_slice(priority_str(task.priority).as_bytes());
        out.push(b'"');
        if let Some(target) = &task.target {
            out.extend_from_slice(b",\"target\":");
            push_str(&mut out, target);
        }
        out.extend_from_slice(b",\"lease_id\":\"");
        push_u64(&mut out, leased.lease_id.0);
        out.extend_from_slice(b"\",\"lease_until_ms\":");
        push_u64(&mut out, leased.lease_until_ms);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// One entry of a batch answer that is an error: `{"error":{…}}`, with the `id` first when
/// the entry has one.
fn push_error_entry(out: &mut Vec<u8>, id: Option<&str>, error: &ErrorBody) {
    out.push(b'{');
    if let Some(id) = id {
        out.extend_from_slice(b"\"id\":");
        push_str(out, id);
        out.push(b',');
    }
    out.extend_from_slice(b"\"error\":");
    let _ = serde_json::to_writer(&mut *out, error);
    out.push(b'}');
}

/// The result of one ack of a batch.
pub enum AckEntry {
    Done(TaskId),
    /// `id` is the text the caller sent (cut to 64 characters) or the parsed id's text.
    Failed {
        id: String,
        error: ErrorBody,
    },
}

/// `{"results":[…]}` of a batch ack, one entry per ack in order.
pub fn ack_results(entries: &[AckEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + entries.len() * ACK_RESULT_BYTES);
    out.extend_from_slice(b"{\"results\":[");
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match entry {
            AckEntry::Done(id) => {
                out.extend_from_slice(b"{\"id\":");
                push_id(&mut out, *id);
                out.extend_from_slice(b",\"ok\":true}");
            }
            AckEntry::Failed { id, error } => push_error_entry(&mut out, Some(id), error),
        }
    }
    out.extend_from_slice(b"]}");
    out
}

/// `Created` (a task accepted by a submit): `{"id","queue","due_at_ms","state":"scheduled"}`.
/// `Created` with the queue name already written as a JSON string.
fn push_created(out: &mut Vec<u8>, id: TaskId, queue_json: &[u8], due_at_ms: UnixMs) {
    out.extend_from_slice(b"{\"id\":");
    push_id(out, id);
    out.extend_from_slice(b",\"queue\":");
    out.extend_from_slice(queue_json);
    out.extend_from_slice(b",\"due_at_ms\":");
    push_u64(out, due_at_ms);
    out.extend_from_slice(b",\"state\":\"scheduled\"}");
}

/// A single submit's `Created` body.
pub fn created(id: TaskId, queue: &QueueName, due_at_ms: UnixMs) -> Vec<u8> {
    let mut out = Vec::with_capacity(CREATED_FIXED_BYTES + queue.as_str().len());
    out.extend_from_slice(b"{\"id\":");
    push_id(&mut out, id);
    out.extend_from_slice(b",\"queue\":");
    push_str(&mut out, queue.as_str());
    out.extend_from_slice(b",\"due_at_ms\":");
    push_u64(&mut out, due_at_ms);
    out.extend_from_slice(b",\"state\":\"scheduled\"}");
    out
}

/// The result of one task of a batch submit.
pub enum SubmitEntry<T> {
    Created {
        id: TaskId,
        due_at_ms: UnixMs,
    },
    /// Any other entry (a duplicate's task view), written by serde.
    Other(T),
    Error(ErrorBody),
}

/// `{"results":[…]}` of a batch submit, one entry per task in order.
pub fn submit_results<T: serde::Serialize>(
    queue: &QueueName,
    entries: &[SubmitEntry<T>],
) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + entries.len() * (CREATED_FIXED_BYTES + queue.as_str().len()));
    let mut queue_json = Vec::with_capacity(queue.as_str().len() + 2);
    push_str(&mut queue_json, queue.as_str());
    out.extend_from_slice(b"{\"results\":[");
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match entry {
            SubmitEntry::Created { id, due_at_ms } => {
                push_created(&mut out, *id, &queue_json, *due_at_ms)
            }
            SubmitEntry::Other(view) => {
                let _ = serde_json::to_writer(&mut out, view);
            }
            SubmitEntry::Error(error) => push_error_entry(&mut out, None, error),
        }
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::dto::{
        AckResult, BatchResult, BatchResults, Created, LeasedList, LeasedView, TaskView,
    };
    use crate::api::error::ErrorCode;
    use crate::api::ApiError;
    use belfry_core::{LatePolicy, LeaseId, Task, TaskState};
    use bytes::Bytes;

    fn task(id: u128, payload: &[u8], kind: PayloadKind, headers: &[(&str, &str)]) -> Task {
        Task {
            id: TaskId::from_u128(id),
            queue: QueueName::new("mail.q-1_x").unwrap(),
            due_at_ms: 1_767_225_610_000,
            payload: Bytes::copy_from_slice(payload),
            payload_kind: kind,
            payload_dropped: false,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            priority: if id % 2 == 0 {
                Priority::High
            } else {
                Priority::Normal
            },
            idempotency_key: None,
            late_policy: LatePolicy::Fire,
            target: None,
            state: TaskState::Leased,
            attempts: (id % 7) as u32,
            lease_until_ms: Some(u64::MAX),
            dead_reason: None,
        }
    }

    fn cases() -> Vec<LeasedTask> {
        let json = PayloadKind::Json;
        let bin = PayloadKind::Binary;
        let tasks = [
            task(0, b"null", json, &[]),
            task(u128::MAX, br#"{"i":7,"pad":"xxxx"}"#, json, &[]),
            task(0x0123_4567_89ab_cdef, b"  [1, 2 ,3]\n", json, &[]),
            task(42, "\"ünïcode \\\" \\u0001\"".as_bytes(), json, &[]),
            task(43, b"not json", json, &[("b", "2"), ("a", "1")]),
            task(44, &[0, 159, 146, 150, 255], json, &[("x", "y")]),
            task(45, &[0, 1, 2, 3, 4, 5, 6], bin, &[]),
            task(46, b"", bin, &[("k", "v\"q\\\n\u{1}é"), ("k", "last")]),
            task(47, b"{}", json, &[("ctrl\t", "\u{7f}\u{1f}")]),
        ];
        let mut tasks = tasks;
        // The queue name is cached per answer: a task of another queue must still show its own.
        tasks[6].queue = QueueName::new("other").unwrap();
        // A task's own target is shown whole (escaped) where it has one.
        tasks[2].target = Some("https://h.example.com/a?t=\"x\"&u=\u{1}".into());
        tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| LeasedTask {
                task,
                lease_id: LeaseId(if i == 0 { 0 } else { u64::MAX - i as u64 }),
                lease_until_ms: i as u64 * 1_000_003,
            })
            .collect()
    }

    #[test]
    fn lease_answer_is_byte_for_byte_the_serde_shape() {
        let leased = cases();
        for n in [0, 1, leased.len()] {
            let expected = serde_json::to_vec(&LeasedList {
                tasks: leased[..n].iter().map(LeasedView::new).collect(),
            })
            .unwrap();
            let got = leased_list(&leased[..n]);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn ids_and_numbers_match_display() {
        for value in [
            0,
            1,
            0xf,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let id = TaskId::from_u128(value);
            assert_eq!(hex_id(id).as_slice(), id.to_string().as_bytes());
            assert_eq!(parse_hex_id(&id.to_string()), Some(id));
            assert_eq!(parse_hex_id(&id.to_string().to_uppercase()), Some(id));
        }
        for bad in [
            "",
            "0",
            "g0000000000000000000000000000000",
            "+0000000000000000000000000000000",
            "000000000000000000000000000000000",
        ] {
            assert_eq!(parse_hex_id(bad), None, "{bad:?}");
            assert!(bad.parse::<TaskId>().is_err());
        }
        let mut values = vec![0, 9, 10, 11, 99, 100, 101, 999, 1_000, 12_345, u64::MAX];
        values.extend((0..64).map(|shift| 1u64 << shift));
        values.extend((1..20).map(|exp| 10u64.pow(exp) - 1));
        for value in values {
            let mut out = Vec::new();
            push_u64(&mut out, value);
            assert_eq!(out, value.to_string().as_bytes());
        }
    }

    #[test]
    fn strings_escape_as_serde_does() {
        let all: String = (0u8..0x80).map(char::from).collect();
        for text in [
            "",
            "plain",
            "q\"uote",
            "back\\slash",
            "é ü 😀",
            all.as_str(),
        ] {
            let mut out = Vec::new();
            push_str(&mut out, text);
            assert_eq!(out, serde_json::to_vec(text).unwrap());
        }
    }

    #[test]
    fn ack_and_submit_results_are_the_serde_shape() {
        let queue = QueueName::new("q").unwrap();
        let error = || ApiError::new(ErrorCode::LeaseExpired, "stale \"lease\"").body();
        let entries = vec![
            AckEntry::Done(TaskId::from_u128(5)),
            AckEntry::Failed {
                id: "nope".into(),
                error: error(),
            },
        ];
        let expected = serde_json::to_vec(&BatchResults {
            results: vec![
                AckResult {
                    id: TaskId::from_u128(5).to_string(),
                    ok: Some(true),
                    error: None,
                },
                AckResult {
                    id: "nope".into(),
                    ok: None,
                    error: Some(error()),
                },
            ],
        })
        .unwrap();
        assert_eq!(ack_results(&entries), expected);

        let duplicate = task(9, b"[1]", PayloadKind::Json, &[]);
        let entries = vec![
            SubmitEntry::Created {
                id: TaskId::from_u128(77),
                due_at_ms: 123,
            },
            SubmitEntry::Other(TaskView::duplicate(&duplicate)),
            SubmitEntry::Error(error()),
        ];
        let expected = serde_json::to_vec(&BatchResults {
            results: vec![
                BatchResult::Created(Created::new(TaskId::from_u128(77), &queue, 123)),
                BatchResult::Duplicate(Box::new(TaskView::duplicate(&duplicate))),
                BatchResult::Error { error: error() },
            ],
        })
        .unwrap();
        assert_eq!(submit_results(&queue, &entries), expected);
        assert_eq!(
            created(TaskId::from_u128(1), &queue, 9),
            serde_json::to_vec(&Created::new(TaskId::from_u128(1), &queue, 9)).unwrap()
        );
    }
}
