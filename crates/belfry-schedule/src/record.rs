//! The persisted form of schedules and cursors: small versioned JSON documents in the store's
//! metadata.
//!
//! A schedule lives under namespace [`SCHEDULES_NAMESPACE`], its cursor under
//! [`CURSORS_NAMESPACE`], both keyed by the schedule id. They are separate documents on
//! purpose: API calls write only the schedule, ticks write only the cursor, so neither can
//! overwrite the other's change even when they run on different nodes.
//!
//! Version 1 schedule document:
//!
//! ```json
//! {"v":1,"id":"nightly","queue":"reports",
//!  "cron":"0 2 * * *","timezone":"Europe/Berlin",      (or "every_ms":60000)
//!  "start_at_ms":null,"end_at_ms":null,
//!  "payload_base64":"e30=","payload_kind":"json","headers":[["k","v"]],
//!  "priority":"normal","late_policy":"fire","late_after_ms":null,
//!  "target":"https://…",                                (only when the schedule has one)
//!  "shard_count":1,"misfire":"fire_once","paused":false,
//!  "created_at_ms":…,"updated_at_ms":…,"not_before_ms":…}
//! ```
//!
//! Version 1 cursor document: `{"v":1,"cursor_ms":…}`.

use base64::Engine;
use belfry_core::schedule::MisfirePolicy;
use belfry_core::{LatePolicy, PayloadKind, Priority, QueueName, UnixMs};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::model::{Schedule, ScheduleDef, ScheduleId, TriggerDef};

pub const SCHEDULES_NAMESPACE: &str = "schedules";
pub const CURSORS_NAMESPACE: &str = "schedule_cursors";

/// The version written today. Readers refuse other versions rather than guess.
const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleV1 {
    v: u32,
    id: String,
    queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    every_ms: Option<u64>,
    start_at_ms: Option<u64>,
    end_at_ms: Option<u64>,
    payload_base64: String,
    payload_kind: String,
    headers: Vec<(String, String)>,
    priority: String,
    late_policy: String,
    late_after_ms: Option<u64>,
    /// Absent in records written before schedules had targets, and when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    shard_count: u32,
    misfire: String,
    paused: bool,
    created_at_ms: u64,
    updated_at_ms: u64,
    not_before_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CursorV1 {
    v: u32,
    cursor_ms: u64,
}

/// The stored fields of a schedule (everything but the cursor, which is stored apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredSchedule {
    pub id: ScheduleId,
    pub def: ScheduleDef,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    pub not_before_ms: UnixMs,
}

impl StoredSchedule {
    pub fn from_schedule(schedule: &Schedule) -> StoredSchedule {
        StoredSchedule {
            id: schedule.id.clone(),
            def: schedule.def.clone(),
            created_at_ms: schedule.created_at_ms,
            updated_at_ms: schedule.updated_at_ms,
            not_before_ms: schedule.not_before_ms,
        }
    }
}

pub(crate) fn encode_schedule(stored: &StoredSchedule) -> Bytes {
    let def = &stored.def;
    let (cron, timezone, every_ms) = match &def.trigger {
        TriggerDef::Cron {
            expression,
            timezone,
        } => (Some(expression.clone()), Some(timezone.clone()), None),
        TriggerDef::Every { every_ms } => (None, None, Some(*every_ms)),
    };
    let (late_policy, late_after_ms) = match def.late_policy {
        LatePolicy::Fire => ("fire", None),
        LatePolicy::Skip { after_ms } => ("skip", Some(after_ms)),
        LatePolicy::Dead { after_ms } => ("dead", Some(after_ms)),
    };
    let record = ScheduleV1 {
        v: VERSION,
        id: stored.id.as_str().to_string(),
        queue: def.queue.as_str().to_string(),
        cron,
        timezone,
        every_ms,
        start_at_ms: def.start_at_ms,
        end_at_ms: def.end_at_ms,
        payload_base64: base64::engine::general_purpose::STANDARD.encode(&def.payload),
        payload_kind: match def.payload_kind {
            PayloadKind::Json => "json",
            PayloadKind::Binary => "binary",
        }
        .to_string(),
        headers: def.headers.clone(),
        priority: match def.priority {
            Priority::High => "high",
            Priority::Normal => "normal",
        }
        .to_string(),
        late_policy: late_policy.to_string(),
        late_after_ms,
        target: def.target.clone(),
        shard_count: def.shard_count,
        misfire: def.misfire.as_str().to_string(),
        paused: def.paused,
        created_at_ms: stored.created_at_ms,
        updated_at_ms: stored.updated_at_ms,
        not_before_ms: stored.not_before_ms,
    };
    // Serializing plain strings and numbers cannot fail.
    let bytes = Bytes::from(serde_json::to_vec(&record).expect("schedule record serializes"));
    debug_assert_eq!(
        decode_schedule(&bytes).ok().as_ref(),
        Some(stored),
        "a schedule record decodes to what was encoded"
    );
    bytes
}

pub(crate) fn decode_schedule(bytes: &[u8]) -> Result<StoredSchedule, DecodeError> {
    let bad = |detail: String| DecodeError(detail);
    let version: Versioned = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if version.v != VERSION {
        return Err(bad(format!(
            "unsupported schedule record version {}",
            version.v
        )));
    }
    let r: ScheduleV1 = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let trigger = match (r.cron, r.timezone, r.every_ms) {
        (Some(expression), Some(timezone), None) => TriggerDef::Cron {
            expression,
            timezone,
        },
        (None, None, Some(every_ms)) => TriggerDef::Every { every_ms },
        _ => {
            return Err(bad(
                "a schedule has either cron and timezone, or every_ms".into()
            ))
        }
    };
    let payload = base64::engine::general_purpose::STANDARD
        .decode(&r.payload_base64)
        .map_err(|e| bad(format!("payload: {e}")))?;
    let def = ScheduleDef {
        queue: QueueName::new(r.queue).map_err(|e| bad(e.to_string()))?,
        trigger,
        start_at_ms: r.start_at_ms,
        end_at_ms: r.end_at_ms,
        payload: Bytes::from(payload),
        payload_kind: match r.payload_kind.as_str() {
            "json" => PayloadKind::Json,
            "binary" => PayloadKind::Binary,
            other => return Err(bad(format!("unknown payload kind {other:?}"))),
        },
        headers: r.headers,
        priority: match r.priority.as_str() {
            "high" => Priority::High,
            "normal" => Priority::Normal,
            other => return Err(bad(format!("unknown priority {other:?}"))),
        },
        late_policy: match (r.late_policy.as_str(), r.late_after_ms) {
            ("fire", None) => LatePolicy::Fire,
            ("skip", Some(after_ms)) => LatePolicy::Skip { after_ms },
            ("dead", Some(after_ms)) => LatePolicy::Dead { after_ms },
            (other, _) => return Err(bad(format!("bad late policy {other:?}"))),
        },
        target: r.target,
        shard_count: r.shard_count,
        misfire: MisfirePolicy::parse(&r.misfire)
            .ok_or_else(|| bad(format!("unknown misfire policy {:?}", r.misfire)))?,
        paused: r.paused,
    };
    Ok(StoredSchedule {
        id: ScheduleId::new(r.id).map_err(|e| bad(e.to_string()))?,
        def,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        not_before_ms: r.not_before_ms,
    })
}

#[derive(Deserialize)]
struct Versioned {
    v: u32,
}

/// How every cursor this version writes begins; [`CURSOR_END`] follows its number.
const CURSOR_START: &[u8] = br#"{"v":1,"cursor_ms":"#;
const CURSOR_END: u8 = b'}';

/// The cursor document, written by hand: a tick writes one per schedule due, and this is the
/// JSON `CursorV1` serializes to (a test holds them equal).
pub(crate) fn encode_cursor(cursor_ms: UnixMs) -> Bytes {
    let mut out = Vec::with_capacity(CURSOR_START.len() + 21);
    out.extend_from_slice(CURSOR_START);
    out.extend_from_slice(cursor_ms.to_string().as_bytes());
    out.push(CURSOR_END);
    Bytes::from(out)
}

/// The cursor of a document in exactly the form [`encode_cursor`] writes, read without a JSON
/// parser (a tick reads one per schedule due); `None` for any other form.
fn decode_written_cursor(bytes: &[u8]) -> Option<UnixMs> {
    let digits = bytes
        .strip_prefix(CURSOR_START)?
        .strip_suffix(&[CURSOR_END])?;
    if digits.is_empty() || digits.len() > 20 || (digits.len() > 1 && digits[0] == b'0') {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let digit = u64::from(d.checked_sub(b'0').filter(|d| *d <= 9)?);
        n.checked_mul(10)?.checked_add(digit)
    })
}

pub(crate) fn decode_cursor(bytes: &[u8]) -> Result<UnixMs, DecodeError> {
    if let Some(cursor_ms) = decode_written_cursor(bytes) {
        return Ok(cursor_ms);
    }
    let version: Versioned =
        serde_json::from_slice(bytes).map_err(|e| DecodeError(e.to_string()))?;
    if version.v != VERSION {
        return Err(DecodeError(format!(
            "unsupported cursor record version {}",
            version.v
        )));
    }
    let record: CursorV1 = serde_json::from_slice(bytes).map_err(|e| DecodeError(e.to_string()))?;
    Ok(record.cursor_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(def: ScheduleDef) -> StoredSchedule {
        StoredSchedule {
            id: ScheduleId::new("nightly-report").unwrap(),
            def,
            created_at_ms: 1_000,
            updated_at_ms: 2_000,
            not_before_ms: 3_000,
        }
    }

    #[test]
    fn version_one_documents_round_trip() {
        let queue = QueueName::new("reports").unwrap();
        let mut def = ScheduleDef::cron(queue.clone(), "0 2 * * *", "Europe/Berlin");
        def.payload = Bytes::from_static(b"{\"x\":1}");
        def.headers = vec![("a".into(), "b".into())];
        def.late_policy = LatePolicy::Dead { after_ms: 5 };
        def.priority = Priority::High;
        def.shard_count = 4;
        def.misfire = MisfirePolicy::CatchUp;
        def.start_at_ms = Some(7);
        def.target = Some("https://hooks.example.com/nightly?k=v".into());
        for def in [def, ScheduleDef::every(queue, 60_000)] {
            let record = stored(def);
            let bytes = encode_schedule(&record);
            assert_eq!(decode_schedule(&bytes).unwrap(), record);
        }
        assert_eq!(decode_cursor(&encode_cursor(42)).unwrap(), 42);
        assert_eq!(&encode_cursor(42)[..], br#"{"v":1,"cursor_ms":42}"#);
    }

    /// A record written before schedules had targets reads as one without, and one without
    /// a target is written without the field (so it reads back on an older node too).
    #[test]
    fn a_record_without_a_target_is_the_one_written_before_targets() {
        let record = stored(ScheduleDef::every(QueueName::new("q").unwrap(), 1_000));
        let text = String::from_utf8(encode_schedule(&record).to_vec()).unwrap();
        assert!(!text.contains("target"), "{text}");
        assert_eq!(decode_schedule(text.as_bytes()).unwrap().def.target, None);
    }

    #[test]
    fn refuses_other_versions_and_garbage() {
        let record = stored(ScheduleDef::every(QueueName::new("q").unwrap(), 1_000));
        let text = String::from_utf8(encode_schedule(&record).to_vec()).unwrap();
        let v2 = text.replacen("\"v\":1", "\"v\":2", 1);
        assert_eq!(
            decode_schedule(v2.as_bytes()).unwrap_err().to_string(),
            "unsupported schedule record version 2"
        );
        let both = text.replacen(
            "\"every_ms\":1000",
            "\"every_ms\":1000,\"cron\":\"* * * * *\"",
            1,
        );
        assert!(decode_schedule(both.as_bytes()).is_err());
        assert!(decode_schedule(b"").is_err());
        assert!(decode_schedule(b"{\"v\":1}").is_err());
        assert!(decode_cursor(b"{\"v\":9,\"cursor_ms\":1}").is_err());
        assert!(decode_cursor(b"[1]").is_err());
    }

    /// The cursor read without a JSON parser agrees with the JSON one: the same bytes for
    /// every cursor, and the same answer for any other form (which the parser then reads).
    #[test]
    fn a_cursor_written_by_hand_is_the_json_one() {
        for text in [
            r#"{"cursor_ms":5,"v":1}"#,
            r#"{ "v": 1, "cursor_ms": 5 }"#,
            r#"{"v":1,"cursor_ms":5.0}"#,
            r#"{"v":1,"cursor_ms":007}"#,
            r#"{"v":1,"cursor_ms":18446744073709551616}"#,
            r#"{"v":1,"cursor_ms":-1}"#,
            r#"{"v":1,"cursor_ms":}"#,
            r#"{"v":1,"cursor_ms":"5"}"#,
        ] {
            let by_parser = serde_json::from_slice::<CursorV1>(text.as_bytes())
                .ok()
                .map(|c| c.cursor_ms);
            let read = decode_cursor(text.as_bytes()).ok();
            assert_eq!(read, by_parser, "{text}");
            assert_eq!(decode_written_cursor(text.as_bytes()), None, "{text}");
        }
        assert_eq!(decode_cursor(br#"{"cursor_ms":5,"v":1}"#).unwrap(), 5);
    }

    proptest! {
        #[test]
        fn cursors_match_their_json(cursor_ms in any::<u64>()) {
            let json = serde_json::to_vec(&CursorV1 { v: VERSION, cursor_ms }).unwrap();
            prop_assert_eq!(&encode_cursor(cursor_ms)[..], &json[..]);
            prop_assert_eq!(decode_written_cursor(&json), Some(cursor_ms));
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_schedule(&bytes);
            let _ = decode_cursor(&bytes);
        }
    }
}
