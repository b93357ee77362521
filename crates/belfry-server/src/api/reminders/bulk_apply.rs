//! Bulk subscribe and unsubscribe (`POST /v1/reminders/{id}/subscribers` and
//! `…/subscribers:delete`): the body is parsed as it streams in (`api::bulk`) and its users
//! applied `BULK_BATCH` at a time, each batch durable before the next is read.
//!
//! The answer's promise is exact: when it says `complete: false`, everything before
//! `stopped_at_line` was applied and nothing from it on was, so a client resends the body
//! from that item. A cut or oversized body stops at the item it cuts; a batch the store
//! refused stops at that batch's first item, and the items read after it are not applied
//! (nor their refused lines counted: the resent body reports them).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use belfry_core::UserId;
use belfry_reminders::{ReminderError, ReminderId};
use serde::Serialize;

use super::{blocking, AppState, ReminderPath};
use crate::api::bulk::{BulkParser, Item};
use crate::api::bulk_read::{declared_over, read_and_apply, BulkApply};
use crate::api::error::{ApiError, ErrorCode};

/// Ids one store call of a bulk request takes.
const BULK_BATCH: usize = 10_000;
/// Bad items a bulk answer lists (all are counted).
const BULK_ERRORS_LISTED: usize = 100;

#[derive(Debug, Serialize)]
struct BulkError {
    line: u64,
    message: String,
}

/// The answer of a bulk subscribe or unsubscribe.
#[derive(Debug, Default, Serialize)]
struct BulkAnswer {
    /// Subscribe: ids that were not subscribed before. Unsubscribe: ids that were.
    changed: u64,
    /// Subscribe: ids already subscribed (or listed twice). Unsubscribe: ids that were not.
    unchanged: u64,
    /// Items that are not user ids (each in `errors`, the first hundred).
    refused: u64,
    errors: Vec<BulkError>,
    /// Whether the whole body was read and applied. If not, everything before
    /// `stopped_at_line` was applied, and nothing from it on.
    complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped_at_line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<crate::api::error::ErrorBody>,
}

pub(super) async fn bulk_subscribe(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    bulk(state, id, headers, body, true).await
}

pub(super) async fn bulk_unsubscribe(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    bulk(state, id, headers, body, false).await
}

async fn bulk(
    state: AppState,
    id: ReminderId,
    headers: HeaderMap,
    body: Body,
    subscribe: bool,
) -> Response {
    let max = state.shared.config.subscribers_body_bytes_max;
    if declared_over(&headers, max) {
        return too_large(max).into_response();
    }
    // The reminder must exist (and take subscribers) before anything is read.
    let check = id.clone();
    let checked = blocking(&state, move |s| {
        let reminder = s.service.get(&check)?;
        if subscribe && reminder.has_fired_for_good() {
            return Err(ReminderError::AlreadyFired(check));
        }
        Ok(())
    })
    .await;
    if let Err(e) = checked {
        return e.into_response();
    }
    let mut bulk = Bulk {
        state: &state,
        id: &id,
        subscribe,
        parser: BulkParser::default(),
        items: Vec::new(),
        answer: BulkAnswer::default(),
        pending: Pending::default(),
    };
    let stop = read_and_apply(&mut bulk, body, max, too_large).await;
    let mut answer = bulk.answer;
    answer.complete = stop.is_none();
    let status = match &stop {
        None => StatusCode::OK,
        Some((e, line)) => {
            answer.stopped_at_line = Some(*line);
            e.code.status()
        }
    };
    answer.error = stop.map(|(e, _)| e.body());
    (status, Json(answer)).into_response()
}

/// The items read since the last batch was applied.
#[derive(Default)]
struct Pending {
    users: Vec<UserId>,
    /// The number of the first of them (a user or a refused item), once one came.
    first_line: Option<u64>,
    /// The refused items among them, and how many of the answer's listed errors they are.
    refused: u64,
    listed: usize,
}

/// One bulk request being applied.
struct Bulk<'a> {
    state: &'a AppState,
    id: &'a ReminderId,
    subscribe: bool,
    parser: BulkParser,
    /// Items parsed and not yet counted into `pending`.
    items: Vec<Item>,
    answer: BulkAnswer,
    pending: Pending,
}

impl BulkApply for Bulk<'_> {
    fn feed(&mut self, bytes: &[u8]) {
        self.parser.feed(bytes, &mut self.items);
    }

    fn finish(&mut self) -> Result<(), ApiError> {
        self.parser
            .finish(&mut self.items)
            .map_err(|message| ApiError::new(ErrorCode::BodyIncomplete, message))
    }

    fn line(&self) -> u64 {
        self.parser.line()
    }

    async fn take(&mut self) -> Result<(), (ApiError, u64)> {
        self.take_items().await
    }

    async fn flush(&mut self) -> Result<(), (ApiError, u64)> {
        if self.pending.users.is_empty() {
            return Ok(());
        }
        self.apply().await
    }
}

impl Bulk<'_> {
    /// Counts `items` into the pending batch, applying it whenever it holds `BULK_BATCH`
    /// users. A batch refused stops it all, at the batch's first item, unapplied from there.
    async fn take_items(&mut self) -> Result<(), (ApiError, u64)> {
        let items = std::mem::take(&mut self.items);
        for item in items {
            match item {
                Item::User(user, line) => {
                    self.pending.first_line.get_or_insert(line);
                    self.pending.users.push(user);
                }
                Item::Bad { line, message } => {
                    self.pending.first_line.get_or_insert(line);
                    self.pending.refused += 1;
                    self.answer.refused += 1;
                    if self.answer.errors.len() < BULK_ERRORS_LISTED {
                        self.answer.errors.push(BulkError { line, message });
                        self.pending.listed += 1;
                    }
                }
            }
            if self.pending.users.len() >= BULK_BATCH {
                self.apply().await?;
            }
        }
        Ok(())
    }

    /// Applies the pending users; when the store refuses them, takes back what the answer
    /// counted of the pending items.
    async fn apply(&mut self) -> Result<(), (ApiError, u64)> {
        let pending = std::mem::take(&mut self.pending);
        let total = pending.users.len() as u64;
        let (id, subscribe) = (self.id.clone(), self.subscribe);
        let users = pending.users;
        let changed = blocking(self.state, move |s| {
            let changed = if subscribe {
                s.service.subscribe(&id, &users)?
            } else {
                s.service.unsubscribe(&id, &users)?
            };
            s.forget_users(&users);
            Ok(changed)
        })
        .await;
        match changed {
            Ok(changed) => {
                self.answer.changed += changed;
                self.answer.unchanged += total - changed;
                Ok(())
            }
            Err(e) => {
                self.answer.refused -= pending.refused;
                let listed = self.answer.errors.len() - pending.listed;
                self.answer.errors.truncate(listed);
                Err((e, pending.first_line.unwrap_or(1)))
            }
        }
    }
}

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the body is larger than limits.subscribers_body_max ({max} bytes); split it into several requests"),
    )
}
