//! Lease, ack, nack and extend shapes, and dead-letter listings.

use belfry_core::UnixMs;
use serde::{Deserialize, Serialize};

use super::invalid;
use crate::api::error::{ApiError, ErrorCode};
#[cfg(test)]
use {
    super::{priority_str, PayloadView},
    crate::api::error::ErrorBody,
    belfry_core::LeasedTask,
    std::collections::BTreeMap,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    pub max: Option<u64>,
    pub visibility_ms: Option<u64>,
    pub wait_ms: Option<u64>,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct LeasedView {
    pub id: String,
    pub queue: String,
    #[serde(flatten)]
    pub payload: PayloadView,
    pub headers: BTreeMap<String, String>,
    pub attempt: u32,
    pub due_at_ms: UnixMs,
    pub priority: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub lease_id: String,
    pub lease_until_ms: UnixMs,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
impl LeasedView {
    pub fn new(leased: &LeasedTask) -> Self {
        let task = &leased.task;
        LeasedView {
            id: task.id.to_string(),
            queue: task.queue.to_string(),
            payload: PayloadView::new(task.payload_kind, &task.payload),
            headers: task.headers.iter().cloned().collect(),
            attempt: task.attempts,
            due_at_ms: task.due_at_ms,
            priority: priority_str(task.priority),
            target: task.target.clone(),
            lease_id: leased.lease_id.0.to_string(),
            lease_until_ms: leased.lease_until_ms,
        }
    }
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct LeasedList {
    pub tasks: Vec<LeasedView>,
}

/// A lease id: a string of digits (numbers are accepted too). The text is parsed while the
/// body is read, so a valid id costs no allocation (batch acks carry up to 1,000 of them); a
/// text that is not one is kept for the error message, which reports it per ack.
#[derive(Debug)]
pub enum LeaseIdBody {
    Valid(u64),
    Invalid(String),
}

/// What serde said when the untagged enum this type replaced matched neither a string nor a
/// number; kept so error messages did not change.
const LEASE_ID_MISMATCH: &str = "data did not match any variant of untagged enum LeaseIdBody";

impl<'de> Deserialize<'de> for LeaseIdBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = LeaseIdBody;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a lease id: a string of digits or a number")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<LeaseIdBody, E> {
                Ok(match text.parse() {
                    Ok(n) => LeaseIdBody::Valid(n),
                    Err(_) => LeaseIdBody::Invalid(text.chars().take(64).collect()),
                })
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<LeaseIdBody, E> {
                Ok(LeaseIdBody::Valid(n))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<LeaseIdBody, E> {
                u64::try_from(n)
                    .map(LeaseIdBody::Valid)
                    .map_err(|_| E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<LeaseIdBody, E> {
                Err(E::custom(LEASE_ID_MISMATCH))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                _: A,
            ) -> Result<LeaseIdBody, A::Error> {
                Err(serde::de::Error::custom(LEASE_ID_MISMATCH))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                _: A,
            ) -> Result<LeaseIdBody, A::Error> {
                Err(serde::de::Error::custom(LEASE_ID_MISMATCH))
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

impl LeaseIdBody {
    pub fn parse(&self) -> Result<belfry_core::LeaseId, ApiError> {
        match self {
            LeaseIdBody::Valid(n) => Ok(belfry_core::LeaseId(*n)),
            LeaseIdBody::Invalid(text) => Err(invalid(
                ErrorCode::InvalidLeaseId,
                format!("lease_id is the string of digits a lease call returned, got {text:?}"),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    pub lease_id: LeaseIdBody,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NackBody {
    pub lease_id: LeaseIdBody,
    pub delay_ms: Option<i64>,
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    pub lease_id: LeaseIdBody,
    pub visibility_ms: Option<u64>,
}

/// A batch ack, borrowing its task ids from the request body (no string is copied unless it
/// has escapes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAckBody<'a> {
    #[serde(borrow)]
    pub acks: Vec<BatchAckItem<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAckItem<'a> {
    #[serde(borrow)]
    pub id: std::borrow::Cow<'a, str>,
    pub lease_id: LeaseIdBody,
}

#[derive(Debug, Serialize)]
pub struct TaskStateView {
    pub id: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at_ms: Option<UnixMs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<UnixMs>,
}

/// Test-only: the serde shape `wire.rs` writes by hand, kept as the reference its tests compare
/// against byte for byte.
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct AckResult {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}
