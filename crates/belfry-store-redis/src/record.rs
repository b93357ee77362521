//! A task's record in Redis: a fixed header the Lua scripts read and rewrite (state,
//! attempts, due time, lease), then the parts only Rust reads. Layout (big-endian):
//!
//! ```text
//! 0 version u8 | 1 state u8 | 2 priority u8 | 3 payload kind u8 | 4 attempts u32
//! 8 due ms u64 | 16 lease deadline ms u64 | 24 lease id u64 | 32 late kind u8
//! 33 late after ms u64 | 41 payload offset u32 | 45 key len u16, key
//! | header count u16, (name len u16, name, value len u32, value)* | payload
//! ```
//! Finished records are cut at the payload offset. Times and lease ids stay below 2^53 (Lua
//! numbers are doubles).

use belfry_core::{LatePolicy, NewTask, PayloadKind, Priority, TaskState, UnixMs};
use bytes::Bytes;

const VERSION: u8 = 1;
pub(crate) const HDR_LEN: usize = 45;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub state: TaskState,
    pub priority: Priority,
    pub payload_kind: PayloadKind,
    pub attempts: u32,
    pub due_at_ms: UnixMs,
    pub lease_until_ms: UnixMs,
    pub lease_id: u64,
    pub late_policy: LatePolicy,
    pub idempotency_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub payload: Bytes,
}

pub(crate) fn state_code(state: TaskState) -> u8 {
    match state {
        TaskState::Scheduled => 0,
        TaskState::Leased => 1,
        TaskState::Done => 2,
        TaskState::Dead => 3,
        TaskState::Cancelled => 4,
        TaskState::Skipped => 5,
    }
}

pub(crate) fn state_of(code: i64) -> Option<TaskState> {
    Some(match code {
        0 => TaskState::Scheduled,
        1 => TaskState::Leased,
        2 => TaskState::Done,
        3 => TaskState::Dead,
        4 => TaskState::Cancelled,
        5 => TaskState::Skipped,
        _ => return None,
    })
}

pub(crate) fn encode(task: &NewTask) -> Vec<u8> {
    let key = task.idempotency_key.as_deref().unwrap_or("");
    let headers_len: usize = task
        .headers
        .iter()
        .map(|(n, v)| 6 + n.len() + v.len())
        .sum();
    let mut out = Vec::with_capacity(HDR_LEN + 4 + key.len() + headers_len + task.payload.len());
    out.push(VERSION);
    out.push(state_code(TaskState::Scheduled));
    out.push(match task.priority {
        Priority::High => 0,
        Priority::Normal => 1,
    });
    out.push(match task.payload_kind {
        PayloadKind::Json => 0,
        PayloadKind::Binary => 1,
    });
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&task.due_at_ms.to_be_bytes());
    out.extend_from_slice(&0u64.to_be_bytes());
    out.extend_from_slice(&0u64.to_be_bytes());
    let (late_kind, late_after) = match task.late_policy {
        LatePolicy::Fire => (0u8, 0u64),
        LatePolicy::Skip { after_ms } => (1, after_ms),
        LatePolicy::Dead { after_ms } => (2, after_ms),
    };
    out.push(late_kind);
    out.extend_from_slice(&late_after.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // the payload offset, set below
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(task.headers.len() as u16).to_be_bytes());
    for (name, value) in &task.headers {
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    let payload_off = out.len() as u32;
    out[41..45].copy_from_slice(&payload_off.to_be_bytes());
    out.extend_from_slice(&task.payload);
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("record cut short at byte {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn text(&mut self, n: usize) -> Result<String, String> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "text is not UTF-8".to_owned())
    }
}

/// Reads a record; an error says what is wrong with it (never a panic).
pub(crate) fn decode(bytes: &Bytes) -> Result<Record, String> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!("record version {version}, expected {VERSION}"));
    }
    let state = state_of(r.u8()? as i64).ok_or("unknown state")?;
    let priority = match r.u8()? {
        0 => Priority::High,
        1 => Priority::Normal,
        other => return Err(format!("unknown priority {other}")),
    };
    let payload_kind = match r.u8()? {
        0 => PayloadKind::Json,
        1 => PayloadKind::Binary,
        other => return Err(format!("unknown payload kind {other}")),
    };
    let attempts = r.u32()?;
    let due_at_ms = r.u64()?;
    let lease_until_ms = r.u64()?;
    let lease_id = r.u64()?;
    let late_kind = r.u8()?;
    let late_after = r.u64()?;
    let late_policy = match late_kind {
        0 => LatePolicy::Fire,
        1 => LatePolicy::Skip {
            after_ms: late_after,
        },
        2 => LatePolicy::Dead {
            after_ms: late_after,
        },
        other => return Err(format!("unknown late policy {other}")),
    };
    let payload_off = r.u32()? as usize;
    let key_len = r.u16()? as usize;
    let key = r.text(key_len)?;
    let count = r.u16()?;
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n = r.u16()? as usize;
        let name = r.text(n)?;
        let n = r.u32()? as usize;
        headers.push((name, r.text(n)?));
    }
    if r.at != payload_off.min(bytes.len()) && r.at != payload_off {
        return Err(format!(
            "payload offset {payload_off} but the headers end at {}",
            r.at
        ));
    }
    let payload = if payload_off <= bytes.len() {
        bytes.slice(payload_off..)
    } else {
        return Err(format!(
            "payload offset {payload_off} past the record's end"
        ));
    };
    Ok(Record {
        state,
        priority,
        payload_kind,
        attempts,
        due_at_ms,
        lease_until_ms,
        lease_id,
        late_policy,
        idempotency_key: (!key.is_empty()).then_some(key),
        headers,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::QueueName;

    #[test]
    fn round_trips_and_refuses_damage_without_panicking() {
        let mut task = NewTask::new(QueueName::new("q").unwrap(), 1_700_000_000_123, "{\"a\":1}");
        task.idempotency_key = Some("order-7".into());
        task.headers = vec![("x-a".into(), "b".into())];
        task.priority = Priority::High;
        task.late_policy = LatePolicy::Dead { after_ms: 60_000 };
        let bytes = Bytes::from(encode(&task));
        let record = decode(&bytes).unwrap();
        assert_eq!(record.due_at_ms, task.due_at_ms);
        assert_eq!(record.idempotency_key.as_deref(), Some("order-7"));
        assert_eq!(record.headers, task.headers);
        assert_eq!(record.priority, Priority::High);
        assert_eq!(record.late_policy, task.late_policy);
        assert_eq!(&record.payload[..], b"{\"a\":1}");
        assert_eq!(record.state, TaskState::Scheduled);
        for cut in 0..bytes.len() {
            let _ = decode(&bytes.slice(..cut));
        }
        let mut bad = bytes.to_vec();
        bad[1] = 9;
        assert!(decode(&Bytes::from(bad)).is_err());
    }
}
