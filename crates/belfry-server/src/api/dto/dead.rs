//! The JSON shapes of the dead-letter routes.

use serde::{Deserialize, Serialize};

/// `POST /v1/queues/{queue}/dead:redrive` and `dead:delete`: the dead letters named, or the
/// first `limit` of them in id order (exactly one of the two).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadBulkBody {
    pub ids: Option<Vec<String>>,
    pub limit: Option<usize>,
}

/// The answer of a bulk dead-letter call.
#[derive(Debug, Serialize)]
pub struct DeadBulkAnswer {
    /// Dead letters redriven (`dead:redrive`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redriven: Option<usize>,
    /// Dead letters deleted (`dead:delete`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<usize>,
    /// Tasks named that are not dead letters, each with its state.
    pub not_dead: Vec<NotDeadEntry>,
    /// Tasks named that this queue does not have.
    pub not_found: Vec<String>,
    /// Dead letters left in the queue after the call.
    pub dead_left: u64,
}

#[derive(Debug, Serialize)]
pub struct NotDeadEntry {
    pub id: String,
    pub state: &'static str,
}
