//! A task's record in Redis: a small fixed header the Lua scripts read and rewrite (state,
//! flags, attempts, due time; a leased task's lease after it), then the parts only Rust reads.
//! Layout (big-endian):
//!
//! ```text
//! 0 version u8 | 1 state u8 | 2 flags u8 | 3 attempts u32 | 7 due ms u64
//! [state leased: 15 lease deadline ms u64 | 23 lease id u64]
//! [state bucketed (6, scheduled in a far-future bucket): 15 bucket's first minute u32]
//! [flags & EXTRAS: extras len u32 | extras] | payload
//! extras: [late kind != fire: late after ms u64] | key len u16, key
//!         | header count u16, (name len u16, name, value len u32, value)*
//!         | [a target: target len u16, target]
//! flags: bit 0 normal priority, bit 1 binary payload, bits 2-3 late kind, bit 4 EXTRAS
//! ```
//! A task without idempotency key, headers or late policy costs 15 bytes beyond its payload
//! in a ready set, 19 in a far-future bucket. Finished records are cut after the extras (the payload dropped). Times and
//! lease ids stay below 2^53 (Lua numbers are doubles). The target is last in the extras so
//! that the scripts, which read the key, and records written before targets existed, are
//! unchanged.

use belfry_core::{LatePolicy, NewTask, PayloadKind, Priority, TaskState, UnixMs};
use bytes::Bytes;

const VERSION: u8 = 2;
/// The fixed header's length (a leased task's lease follows it).
const HDR_LEN: usize = 15;
const NORMAL: u8 = 1;
const BINARY: u8 = 2;
const EXTRAS: u8 = 16;
/// The state code of a scheduled task waiting in a far-future bucket.
const BUCKETED: u8 = 6;

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
    pub target: Option<String>,
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

/// A state code as callers see it: 6 is a scheduled task waiting in a far-future bucket
/// (`lua/prelude.lua`), which is scheduled like any other.
pub(crate) fn state_of(code: i64) -> Option<TaskState> {
    Some(match code {
        0 | 6 => TaskState::Scheduled,
        1 => TaskState::Leased,
        2 => TaskState::Done,
        3 => TaskState::Dead,
        4 => TaskState::Cancelled,
        5 => TaskState::Skipped,
        _ => return None,
    })
}

fn late_parts(policy: LatePolicy) -> (u8, u64) {
    match policy {
        LatePolicy::Fire => (0, 0),
        LatePolicy::Skip { after_ms } => (1, after_ms),
        LatePolicy::Dead { after_ms } => (2, after_ms),
    }
}

/// A new task's record: scheduled, no attempts yet, no lease.
pub(crate) fn encode(task: &NewTask) -> Vec<u8> {
    let (late_kind, late_after) = late_parts(task.late_policy);
    let mut extras = Vec::new();
    let key = task.idempotency_key.as_deref().unwrap_or("");
    if late_kind != 0 || !key.is_empty() || !task.headers.is_empty() || task.target.is_some() {
        if late_kind != 0 {
            extras.extend_from_slice(&late_after.to_be_bytes());
        }
        extras.extend_from_slice(&(key.len() as u16).to_be_bytes());
        extras.extend_from_slice(key.as_bytes());
        extras.extend_from_slice(&(task.headers.len() as u16).to_be_bytes());
        for (name, value) in &task.headers {
            extras.extend_from_slice(&(name.len() as u16).to_be_bytes());
            extras.extend_from_slice(name.as_bytes());
            extras.extend_from_slice(&(value.len() as u32).to_be_bytes());
            extras.extend_from_slice(value.as_bytes());
        }
        if let Some(target) = &task.target {
            extras.extend_from_slice(&(target.len() as u16).to_be_bytes());
            extras.extend_from_slice(target.as_bytes());
        }
    }
    let mut flags = late_kind << 2;
    if task.priority == Priority::Normal {
        flags |= NORMAL;
    }
    if task.payload_kind == PayloadKind::Binary {
        flags |= BINARY;
    }
    if !extras.is_empty() {
        flags |= EXTRAS;
    }
    let mut out = Vec::with_capacity(HDR_LEN + 4 + extras.len() + task.payload.len());
    out.push(VERSION);
    out.push(state_code(TaskState::Scheduled));
    out.push(flags);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&task.due_at_ms.to_be_bytes());
    if !extras.is_empty() {
        out.extend_from_slice(&(extras.len() as u32).to_be_bytes());
        out.extend_from_slice(&extras);
    }
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
    let code = r.u8()?;
    let state = state_of(code as i64).ok_or("unknown state")?;
    let flags = r.u8()?;
    if flags >> 5 != 0 {
        return Err(format!("unknown record flags {flags:#04x}"));
    }
    let attempts = r.u32()?;
    let due_at_ms = r.u64()?;
    let (lease_until_ms, lease_id) = if state == TaskState::Leased {
        (r.u64()?, r.u64()?)
    } else {
        (0, 0)
    };
    if code == BUCKETED {
        r.u32()?; // the bucket it waits in: the scripts' business
    }
    let late_kind = (flags >> 2) & 3;
    let mut late_after = 0;
    let mut key = String::new();
    let mut headers = Vec::new();
    let mut target = None;
    if flags & EXTRAS != 0 {
        let len = r.u32()? as usize;
        let end = r.at.checked_add(len).filter(|&e| e <= bytes.len());
        let end = end.ok_or_else(|| format!("extras of {len} bytes past the record's end"))?;
        if late_kind != 0 {
            late_after = r.u64()?;
        }
        let key_len = r.u16()? as usize;
        key = r.text(key_len)?;
        let count = r.u16()?;
        headers.reserve(count as usize);
        for _ in 0..count {
            let n = r.u16()? as usize;
            let name = r.text(n)?;
            let n = r.u32()? as usize;
            headers.push((name, r.text(n)?));
        }
        if r.at < end {
            let n = r.u16()? as usize;
            target = Some(r.text(n)?);
        }
        if r.at != end {
            return Err(format!("extras end at {end} but their fields at {}", r.at));
        }
    }
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
    Ok(Record {
        state,
        priority: if flags & NORMAL != 0 {
            Priority::Normal
        } else {
            Priority::High
        },
        payload_kind: if flags & BINARY != 0 {
            PayloadKind::Binary
        } else {
            PayloadKind::Json
        },
        attempts,
        due_at_ms,
        lease_until_ms,
        lease_id,
        late_policy,
        idempotency_key: (!key.is_empty()).then_some(key),
        headers,
        target,
        payload: bytes.slice(r.at..),
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
        assert_eq!(record.target, None);
        for cut in 0..bytes.len() {
            let _ = decode(&bytes.slice(..cut));
        }
        let mut bad = bytes.to_vec();
        bad[1] = 9;
        assert!(decode(&Bytes::from(bad)).is_err());
    }

    #[test]
    fn a_plain_task_costs_fifteen_bytes_and_a_lease_reads_back() {
        let task = NewTask::new(
            QueueName::new("q").unwrap(),
            1_700_000_000_123,
            vec![7u8; 200],
        );
        let bytes = encode(&task);
        assert_eq!(bytes.len(), HDR_LEN + 200);
        // The scripts lease it: state 1, then the deadline and lease id after the header.
        let mut leased = bytes.clone();
        leased[1] = 1;
        leased[3..7].copy_from_slice(&3u32.to_be_bytes());
        let mut tail = 1_700_000_030_000u64.to_be_bytes().to_vec();
        tail.extend_from_slice(&42u64.to_be_bytes());
        leased.splice(HDR_LEN..HDR_LEN, tail);
        let record = decode(&Bytes::from(leased)).unwrap();
        assert_eq!(record.state, TaskState::Leased);
        assert_eq!(
            (record.attempts, record.lease_until_ms, record.lease_id),
            (3, 1_700_000_030_000, 42)
        );
        assert_eq!(&record.payload[..], &[7u8; 200][..]);
        // A bucketed task (code 6) reads as scheduled.
        let mut bucketed = bytes;
        bucketed[1] = 6;
        assert_eq!(
            decode(&Bytes::from(bucketed)).unwrap().state,
            TaskState::Scheduled
        );
    }

    #[test]
    fn a_target_follows_the_headers_and_needs_no_other_extra() {
        let mut task = NewTask::new(QueueName::new("q").unwrap(), 5, "{}");
        task.target = Some("https://hooks.example.com/a?b=c".into());
        let bytes = Bytes::from(encode(&task));
        let record = decode(&bytes).unwrap();
        assert_eq!(record.target, task.target);
        assert_eq!(record.idempotency_key, None);
        assert!(record.headers.is_empty());
        assert_eq!(&record.payload[..], b"{}");
        // After a key and headers too.
        task.idempotency_key = Some("k".into());
        task.headers = vec![("x".into(), "y".into())];
        let record = decode(&Bytes::from(encode(&task))).unwrap();
        assert_eq!(
            (record.target, record.idempotency_key),
            (task.target.clone(), Some("k".into()))
        );
        // A target cut short inside the extras is an error, not a shorter target.
        let mut bytes = encode(&task);
        let extras_len_at = HDR_LEN;
        let len = u32::from_be_bytes(bytes[extras_len_at..extras_len_at + 4].try_into().unwrap());
        bytes[extras_len_at..extras_len_at + 4].copy_from_slice(&(len - 3).to_be_bytes());
        assert!(decode(&Bytes::from(bytes)).is_err());
    }
}
