//! The persisted form of reminders and their fan-outs: small versioned JSON documents in the
//! store's metadata.
//!
//! - [`REMINDERS_NAMESPACE`], keyed by the reminder's uid (16 hex digits): the reminder.
//!   The feed reads reminders by uid (the per-user index holds uids), so that is the key.
//! - [`IDS_NAMESPACE`], keyed by the reminder id: the uid, for the API's lookups by id.
//! - [`FANOUTS_NAMESPACE`], keyed by uid: the fan-out in progress, if any, with its cursor.
//!
//! Version 1 reminder document:
//!
//! ```json
//! {"v":1,"id":"match-42","uid":"9f…","queue":"push",
//!  "at_ms":…  (or "cron":"0 20 * * *","timezone":"Europe/Paris"),
//!  "content":"{\"title\":\"Kick-off\"}","urgency":"urgent","chunk_size":5000,
//!  "users_per_second":null,"created_at_ms":…,"updated_at_ms":…,
//!  "next_fire_ms":…,"firings":0}
//! ```
//!
//! Version 1 fan-out document:
//! `{"v":1,"firing_ms":…,"chunk":3,"chunks":10,"after":"12345","users":15000}`: the firing's
//! time, the next chunk to make, the chunks planned when it started, the last user of the
//! chunks made so far, and how many users they hold; and `"paced_from_ms"` once a paced
//! fan-out fell behind its pace and counts it from then (absent before, and in documents
//! written before the field existed).

use belfry_core::{QueueName, UnixMs, UserId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::model::{Reminder, ReminderDef, ReminderId, Urgency, When};

pub const REMINDERS_NAMESPACE: &str = "reminders";
pub const IDS_NAMESPACE: &str = "reminder_ids";
pub const FANOUTS_NAMESPACE: &str = "reminder_fanouts";

const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// The metadata key of a uid.
pub fn uid_key(uid: u64) -> String {
    format!("{uid:016x}")
}

pub fn parse_uid_key(key: &str) -> Option<u64> {
    (key.len() == 16)
        .then(|| u64::from_str_radix(key, 16).ok())
        .flatten()
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReminderV1 {
    v: u32,
    id: String,
    uid: String,
    queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timezone: Option<String>,
    content: String,
    urgency: String,
    chunk_size: u32,
    users_per_second: Option<u32>,
    created_at_ms: u64,
    updated_at_ms: u64,
    next_fire_ms: Option<u64>,
    firings: u64,
}

pub fn encode_reminder(r: &Reminder) -> Bytes {
    let (at_ms, cron, timezone) = match &r.def.when {
        When::At(at) => (Some(*at), None, None),
        When::Cron {
            expression,
            timezone,
        } => (None, Some(expression.clone()), Some(timezone.clone())),
    };
    let doc = ReminderV1 {
        v: VERSION,
        id: r.id.as_str().to_owned(),
        uid: uid_key(r.uid),
        queue: r.def.queue.as_str().to_owned(),
        at_ms,
        cron,
        timezone,
        content: String::from_utf8_lossy(&r.def.content).into_owned(),
        urgency: r.def.urgency.as_str().to_owned(),
        chunk_size: r.def.chunk_size,
        users_per_second: r.def.users_per_second,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        next_fire_ms: r.next_fire_ms,
        firings: r.firings,
    };
    Bytes::from(serde_json::to_vec(&doc).expect("a reminder document always serialises"))
}

pub fn decode_reminder(bytes: &[u8]) -> Result<Reminder, DecodeError> {
    let doc: ReminderV1 =
        serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("not a reminder: {e}")))?;
    if doc.v != VERSION {
        return Err(DecodeError(format!("unknown reminder version {}", doc.v)));
    }
    let bad = |what: &str| DecodeError(format!("bad {what}"));
    let when = match (doc.at_ms, doc.cron, doc.timezone) {
        (Some(at), None, None) => When::At(at),
        (None, Some(expression), Some(timezone)) => When::Cron {
            expression,
            timezone,
        },
        _ => return Err(bad("time (one of at_ms, or cron with timezone)")),
    };
    Ok(Reminder {
        id: ReminderId::new(doc.id).map_err(|_| bad("id"))?,
        uid: parse_uid_key(&doc.uid).ok_or_else(|| bad("uid"))?,
        def: ReminderDef {
            queue: QueueName::new(&doc.queue).map_err(|_| bad("queue"))?,
            when,
            content: Bytes::from(doc.content),
            urgency: Urgency::parse(&doc.urgency).ok_or_else(|| bad("urgency"))?,
            chunk_size: doc.chunk_size,
            users_per_second: doc.users_per_second,
        },
        created_at_ms: doc.created_at_ms,
        updated_at_ms: doc.updated_at_ms,
        next_fire_ms: doc.next_fire_ms,
        firings: doc.firings,
    })
}

/// A fan-out in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fanout {
    pub firing_ms: UnixMs,
    /// The next chunk to make (0-based).
    pub chunk: u32,
    /// Chunks planned when the fan-out started (subscribers then, over the chunk size).
    pub chunks: u32,
    /// The last user of the chunks made so far.
    pub after: Option<UserId>,
    /// Users in the chunks made so far.
    pub users: u64,
    /// With `users_per_second`: the instant the pace counts from, when not the firing (a
    /// fan-out that started or resumed late keeps its pace from then rather than sending the
    /// chunks it is behind on at once).
    pub paced_from_ms: Option<UnixMs>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FanoutV1 {
    v: u32,
    firing_ms: u64,
    chunk: u32,
    chunks: u32,
    after: Option<String>,
    users: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paced_from_ms: Option<u64>,
}

pub fn encode_fanout(f: &Fanout) -> Bytes {
    let doc = FanoutV1 {
        v: VERSION,
        firing_ms: f.firing_ms,
        chunk: f.chunk,
        chunks: f.chunks,
        after: f.after.as_ref().map(|u| u.as_str().to_owned()),
        users: f.users,
        paced_from_ms: f.paced_from_ms,
    };
    Bytes::from(serde_json::to_vec(&doc).expect("a fan-out document always serialises"))
}

pub fn decode_fanout(bytes: &[u8]) -> Result<Fanout, DecodeError> {
    let doc: FanoutV1 =
        serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("not a fan-out: {e}")))?;
    if doc.v != VERSION {
        return Err(DecodeError(format!("unknown fan-out version {}", doc.v)));
    }
    let after = match doc.after {
        Some(user) => Some(UserId::new(user).map_err(|e| DecodeError(e.to_string()))?),
        None => None,
    };
    Ok(Fanout {
        firing_ms: doc.firing_ms,
        chunk: doc.chunk,
        chunks: doc.chunks,
        after,
        users: doc.users,
        paced_from_ms: doc.paced_from_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reminders_and_fanouts_round_trip() {
        let mut def = ReminderDef::at(QueueName::new("push").unwrap(), 5, Bytes::from("{}"));
        def.urgency = Urgency::Urgent;
        let mut r = Reminder {
            id: ReminderId::new("match-42").unwrap(),
            uid: 0xfeed,
            def,
            created_at_ms: 1,
            updated_at_ms: 2,
            next_fire_ms: Some(5),
            firings: 0,
        };
        assert_eq!(decode_reminder(&encode_reminder(&r)).unwrap(), r);
        r.def.when = When::Cron {
            expression: "0 20 * * *".into(),
            timezone: "Europe/Paris".into(),
        };
        r.def.users_per_second = Some(1000);
        assert_eq!(decode_reminder(&encode_reminder(&r)).unwrap(), r);
        let f = Fanout {
            firing_ms: 9,
            chunk: 3,
            chunks: 10,
            after: Some(UserId::new("u1").unwrap()),
            users: 15,
            paced_from_ms: None,
        };
        assert_eq!(decode_fanout(&encode_fanout(&f)).unwrap(), f);
        // A record written before the field existed reads as pacing from the firing.
        let older = br#"{"v":1,"firing_ms":9,"chunk":3,"chunks":10,"after":"u1","users":15}"#;
        assert_eq!(decode_fanout(older).unwrap(), f);
        let paced = Fanout {
            paced_from_ms: Some(12),
            ..f
        };
        assert_eq!(decode_fanout(&encode_fanout(&paced)).unwrap(), paced);
        assert!(decode_reminder(b"{\"v\":2}").is_err());
        assert_eq!(parse_uid_key(&uid_key(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_uid_key("xyz"), None);
    }
}
