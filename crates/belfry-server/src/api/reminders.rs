//! Reminder endpoints (`/v1/reminders...`) and the user feed (`/v1/users/{user}/reminders`),
//! over `belfry_reminders::ReminderService` and the server's `RemindersState`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use belfry_core::schedule::{canonical_zone_name, format_utc};
use belfry_core::{UnixMs, UserId};
use belfry_reminders::feed::{
    FEED_LIMIT_DEFAULT, FEED_LIMIT_MAX, FEED_WITHIN_MS_DEFAULT, FEED_WITHIN_MS_MAX,
};
use belfry_reminders::{
    Reminder, ReminderDef, ReminderError, ReminderId, ReminderPatch, Urgency, When,
    CHUNK_SIZE_DEFAULT, LIST_LIMIT_MAX,
};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::error::{ApiError, ErrorCode};
use super::extract::{page_limit, page_query, queue_name, JsonBody};
use crate::reminders::{Feed, RemindersState};
use crate::shared::Caller;

mod bulk_apply;
mod users;

use bulk_apply::{bulk_subscribe, bulk_unsubscribe};

type AppState = Arc<RemindersState>;

/// Subscribers one page lists at most, and by default.
const SUBSCRIBERS_PAGE_MAX: usize = 10_000;
const SUBSCRIBERS_PAGE_DEFAULT: usize = 1_000;
/// How long an app may use a feed answer before it revalidates (with its `ETag`).
const FEED_MAX_AGE_S: u64 = 30;

/// Bodies read whole are bounded by the server's request limit (`api::finish`).
pub fn router(state: AppState) -> Router {
    let bulk = Router::new()
        .route("/v1/reminders/{id}/subscribers", post(bulk_subscribe))
        .route(
            "/v1/reminders/{id}/subscribers:delete",
            post(bulk_unsubscribe),
        )
        // Streamed and bounded by `subscribers_body_bytes_max`, not the request limit.
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .route("/v1/reminders", post(create).get(list))
        .route(
            "/v1/reminders/{id}",
            get(get_one).patch(patch).delete(delete),
        )
        .route("/v1/reminders/{id}/subscribers", get(subscribers))
        .route("/v1/reminders/{id}/subscribers/count", get(count))
        .route(
            "/v1/reminders/{id}/subscribers/{user}",
            put(subscribe_one)
                .get(is_subscribed)
                .delete(unsubscribe_one),
        )
        .route("/v1/users/{user}/reminders", get(feed))
        .route(
            "/v1/users/{user}/subscriptions",
            get(users::subscriptions).delete(users::unsubscribe_everywhere),
        )
        .merge(bulk)
        .with_state(state)
}

// ---- errors ----

impl From<ReminderError> for ApiError {
    fn from(e: ReminderError) -> Self {
        let message = e.to_string();
        let code = match e {
            ReminderError::InvalidId(_) => ErrorCode::InvalidReminderId,
            ReminderError::Invalid(_) => ErrorCode::InvalidReminder,
            ReminderError::InvalidArgument(_) => ErrorCode::InvalidReminder,
            ReminderError::QueueNotFound(queue) => {
                return ApiError::new(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist; create it with PUT /v1/queues/{queue}"),
                )
            }
            ReminderError::NotFound(_) => ErrorCode::ReminderNotFound,
            ReminderError::AlreadyExists(_) => ErrorCode::ReminderExists,
            ReminderError::AlreadyFired(_) => ErrorCode::ReminderFired,
            ReminderError::Corrupt { .. } => ErrorCode::ReminderCorrupt,
            // A store failure maps as it does for every other route (507, 503, 500, ...).
            ReminderError::Store(store) => return crate::shared::ServiceError::from(store).into(),
        };
        ApiError::new(code, message)
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidReminder, message)
}

/// Runs reminder-service calls on the blocking pool through the API admission.
async fn blocking<T, F>(state: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&RemindersState) -> Result<T, ReminderError> + Send + 'static,
{
    let task_state = state.clone();
    let call = move |_: &dyn belfry_store::Store| Ok(f(&task_state));
    let outcome = state.shared.blocking(Caller::Api, call).await?;
    outcome.map_err(ApiError::from)
}

// ---- paths ----

/// The path's named segments, decoded. A segment whose percent-encoding is not UTF-8 is
/// refused; when it is the user id, as a bad user id.
async fn path_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<Vec<(String, String)>, ApiError> {
    match Path::<Vec<(String, String)>>::from_request_parts(parts, state).await {
        Ok(Path(params)) => Ok(params),
        Err(e) => {
            let code = if e.to_string().contains("`user`") {
                ErrorCode::InvalidUserId
            } else {
                ErrorCode::InvalidRequest
            };
            Err(ApiError::new(code, format!("bad path: {e}")))
        }
    }
}

pub struct ReminderPath(pub ReminderId);

impl<S: Send + Sync> FromRequestParts<S> for ReminderPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let params = path_params(parts, state).await?;
        let id = params
            .iter()
            .find(|(name, _)| name == "id")
            .map(|(_, value)| value.as_str())
            .unwrap_or_default();
        Ok(ReminderPath(reminder_id(id)?))
    }
}

pub struct UserPath(pub UserId);

impl<S: Send + Sync> FromRequestParts<S> for UserPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let params = path_params(parts, state).await?;
        let user = params
            .iter()
            .find(|(name, _)| name == "user")
            .map(|(_, value)| value.as_str())
            .unwrap_or_default();
        Ok(UserPath(user_id(user)?))
    }
}

fn reminder_id(text: &str) -> Result<ReminderId, ApiError> {
    ReminderId::new(text).map_err(|e| ReminderError::from(e).into())
}

fn user_id(text: &str) -> Result<UserId, ApiError> {
    UserId::new(text).map_err(|e| ApiError::new(ErrorCode::InvalidUserId, e.to_string()))
}

// ---- requests ----

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PriorityBody {
    Urgent,
    Normal,
}

impl From<PriorityBody> for Urgency {
    fn from(p: PriorityBody) -> Urgency {
        match p {
            PriorityBody::Urgent => Urgency::Urgent,
            PriorityBody::Normal => Urgency::Normal,
        }
    }
}

/// The time fields, shared by create and patch: exactly one of `run_at`, `run_at_ms`,
/// `delay_ms` or `cron` (with an optional `timezone`, UTC by default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeBody {
    pub run_at: Option<String>,
    pub run_at_ms: Option<i64>,
    /// Signed, so a negative delay is refused by name rather than as a JSON type error.
    pub delay_ms: Option<i64>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
}

impl TimeBody {
    fn is_empty(&self) -> bool {
        self.run_at.is_none()
            && self.run_at_ms.is_none()
            && self.delay_ms.is_none()
            && self.cron.is_none()
            && self.timezone.is_none()
    }

    /// The time given; a one-shot time past the year 9999 (which `run_at` cannot name
    /// either) is refused. A `cron` without `timezone` is in `default_zone`: `UTC` for a new
    /// reminder, `""` for a PATCH (the reminder's own zone, `ReminderPatch`).
    fn when(self, now_ms: UnixMs, default_zone: &str) -> Result<When, ApiError> {
        let when = self.given(now_ms, default_zone)?;
        if let When::At(at) = when {
            if at > jiff::Timestamp::MAX.as_millisecond().unsigned_abs() {
                return Err(invalid(format!(
                    "the reminder would fire at {at} ms, after {}, the latest time belfry \
                     takes",
                    super::extract::LATEST_TIME
                )));
            }
        }
        Ok(when)
    }

    fn given(self, now_ms: UnixMs, default_zone: &str) -> Result<When, ApiError> {
        let given = [
            self.run_at.is_some(),
            self.run_at_ms.is_some(),
            self.delay_ms.is_some(),
            self.cron.is_some(),
        ];
        match given.iter().filter(|g| **g).count() {
            0 if self.timezone.is_some() => {
                return Err(invalid(
                    "a time zone is changed with its cron expression: send both, \
                     {\"cron\": \"0 20 * * *\", \"timezone\": \"Asia/Tokyo\"}",
                ))
            }
            0 => {
                return Err(invalid(
                    "give the time: run_at, run_at_ms, delay_ms, or cron (with timezone)",
                ))
            }
            1 => {}
            _ => {
                return Err(invalid(
                    "give one of run_at, run_at_ms, delay_ms and cron, not several",
                ))
            }
        }
        if self.timezone.is_some() && self.cron.is_none() {
            return Err(invalid("timezone applies to cron only"));
        }
        if let Some(expression) = self.cron {
            return Ok(When::Cron {
                expression,
                timezone: self
                    .timezone
                    .map_or_else(|| default_zone.into(), |tz| canonical_zone_name(&tz)),
            });
        }
        if let Some(delay) = self.delay_ms {
            let delay = u64::try_from(delay)
                .map_err(|_| invalid(format!("delay_ms must not be negative, got {delay}")))?;
            return Ok(When::At(now_ms.saturating_add(delay)));
        }
        if let Some(at) = self.run_at_ms {
            let at = u64::try_from(at)
                .map_err(|_| invalid(format!("run_at_ms must not be before 1970, got {at}")))?;
            return Ok(When::At(at));
        }
        let text = self.run_at.unwrap_or_default();
        let at = super::extract::rfc3339_ms(&text).map_err(|e| invalid(format!("run_at {e}")))?;
        let at = at.ok_or_else(|| {
            invalid(format!(
                "run_at {text:?} is after {}, the latest time belfry takes",
                super::extract::LATEST_TIME
            ))
        })?;
        u64::try_from(at)
            .map(When::At)
            .map_err(|_| invalid("run_at must not be before 1970"))
    }
}

/// The body of `POST /v1/reminders`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    pub id: Option<String>,
    pub queue: String,
    #[serde(flatten)]
    pub time: TimeBody,
    pub content: Option<Box<RawValue>>,
    pub priority: Option<PriorityBody>,
    pub chunk_size: Option<u32>,
    pub users_per_second: Option<u32>,
}

/// The body of `PATCH /v1/reminders/{id}`: what changes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchBody {
    #[serde(flatten)]
    pub time: TimeBody,
    /// `null` is a content like any other (a reminder created without one has it): only a
    /// missing field leaves the content as it is.
    #[serde(default, deserialize_with = "present")]
    pub content: Option<Box<RawValue>>,
    pub priority: Option<PriorityBody>,
}

/// A field that is present, whatever its value, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// A reminder's content as given, bounded in depth like a task's payload (it is delivered
/// inside every chunk body and feed answer).
fn content_bytes(content: Option<Box<RawValue>>) -> Result<Option<Bytes>, ApiError> {
    let Some(raw) = content else { return Ok(None) };
    super::payload::check_nesting("content", raw.get())?;
    Ok(Some(Bytes::from(String::from(Box::<str>::from(raw)))))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub queue: Option<String>,
    pub after: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribersQuery {
    pub after: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedQuery {
    pub within_ms: Option<u64>,
    pub limit: Option<usize>,
}

// ---- responses ----

#[derive(Debug, Serialize)]
pub struct ReminderView {
    pub id: String,
    pub queue: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// `null` once a one-shot reminder has fired.
    pub next_fire_ms: Option<u64>,
    pub next_fire_at: Option<String>,
    pub content: Box<RawValue>,
    pub priority: &'static str,
    pub chunk_size: u32,
    pub users_per_second: Option<u32>,
    pub firings: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribers: Option<u64>,
    /// The fan-out in progress (`GET` of one reminder, and the list): `null` when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fanout: Option<Option<FanoutView>>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Present (and true) when the reminder's queue does not exist: its firings are dropped
    /// until the queue is made again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub queue_missing: bool,
}

fn raw(content: &Bytes) -> Box<RawValue> {
    RawValue::from_string(String::from_utf8_lossy(content).into_owned())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"))
}

impl ReminderView {
    fn of(r: &Reminder, subscribers: Option<u64>) -> ReminderView {
        let (run_at_ms, cron, timezone) = match &r.def.when {
            When::At(at) => (Some(*at), None, None),
            When::Cron {
                expression,
                timezone,
            } => (None, Some(expression.clone()), Some(timezone.clone())),
        };
        ReminderView {
            id: r.id.to_string(),
            queue: r.def.queue.to_string(),
            run_at_ms,
            cron,
            timezone,
            next_fire_ms: r.next_fire_ms,
            next_fire_at: r.next_fire_ms.and_then(format_utc),
            content: raw(&r.def.content),
            priority: r.def.urgency.as_str(),
            chunk_size: r.def.chunk_size,
            users_per_second: r.def.users_per_second,
            firings: r.firings,
            subscribers,
            fanout: None,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            queue_missing: false,
        }
    }
}

/// A fan-out in progress: its firing, the chunks made of those planned, and their users.
#[derive(Debug, Serialize)]
pub struct FanoutView {
    pub firing_ms: u64,
    /// Chunks made so far.
    pub chunk: u32,
    /// Chunks planned when it started.
    pub chunks: u32,
    /// Users in the chunks made so far.
    pub users: u64,
}

impl From<belfry_reminders::Fanout> for FanoutView {
    fn from(f: belfry_reminders::Fanout) -> Self {
        FanoutView {
            firing_ms: f.firing_ms,
            chunk: f.chunk,
            chunks: f.chunks,
            users: f.users,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ReminderList {
    pub reminders: Vec<ReminderView>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

// ---- handlers ----

async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    let now_ms = state.shared.now_ms();
    let id = body.id.as_deref().map(reminder_id).transpose()?;
    let def = ReminderDef {
        queue: queue_name(&body.queue)?,
        when: body.time.when(now_ms, "UTC")?,
        content: content_bytes(body.content)?.unwrap_or_else(|| Bytes::from_static(b"null")),
        urgency: body.priority.map(Urgency::from).unwrap_or_default(),
        chunk_size: body.chunk_size.unwrap_or(CHUNK_SIZE_DEFAULT),
        users_per_second: body.users_per_second,
    };
    let reminder = blocking(&state, move |s| s.service.create(id, def, now_ms)).await?;
    state.reminder_written(reminder.next_fire_ms);
    let view = ReminderView::of(&reminder, Some(0));
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn get_one(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
) -> Result<Json<ReminderView>, ApiError> {
    let (reminder, count, fanout) = blocking(&state, move |s| {
        let reminder = s.service.get(&id)?;
        let count = s.service.count_of_uid(reminder.uid)?;
        let fanout = s.service.fanout_of(reminder.uid)?;
        Ok((reminder, count, fanout))
    })
    .await?;
    let mut view = ReminderView::of(&reminder, Some(count));
    view.fanout = Some(fanout.map(FanoutView::from));
    view.queue_missing = state.shared.queues.get(&reminder.def.queue).is_none();
    Ok(Json(view))
}

async fn patch(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    JsonBody(body): JsonBody<PatchBody>,
) -> Result<Json<ReminderView>, ApiError> {
    let now_ms = state.shared.now_ms();
    let when = if body.time.is_empty() {
        None
    } else {
        Some(body.time.when(now_ms, "")?)
    };
    let change = ReminderPatch {
        content: content_bytes(body.content)?,
        when,
        urgency: body.priority.map(Urgency::from),
    };
    let reminder = blocking(&state, move |s| s.service.patch(&id, change, now_ms)).await?;
    state.forget_reminder(reminder.uid);
    state.reminder_written(reminder.next_fire_ms);
    Ok(Json(ReminderView::of(&reminder, None)))
}

async fn delete(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
) -> Result<StatusCode, ApiError> {
    let uid = blocking(&state, move |s| s.service.delete(&id)).await?;
    state.forget_reminder(uid);
    Ok(StatusCode::NO_CONTENT)
}

async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ReminderList>, ApiError> {
    let q = page_query(query, "queue, after, limit")?;
    let limit = page_limit(q.limit, LIST_LIMIT_MAX, LIST_LIMIT_MAX)?;
    let queue = q.queue.as_deref().map(queue_name).transpose()?;
    let after = q.after.as_deref().map(reminder_id).transpose()?;
    // Each reminder's subscriber count and fan-out come with the page (two batched store
    // calls), so a page of them is one request, not one per reminder.
    let (page, progress) = blocking(&state, move |s| {
        let page = s.service.list(queue.as_ref(), after.as_ref(), limit)?;
        let uids: Vec<u64> = page.iter().map(|r| r.uid).collect();
        let progress = s.service.progress_of(&uids)?;
        Ok((page, progress))
    })
    .await?;
    let next_after = (page.len() == limit)
        .then(|| page.last().map(|r| r.id.to_string()))
        .flatten();
    let reminders = page
        .iter()
        .zip(progress)
        .map(|(r, (count, fanout))| {
            let mut view = ReminderView::of(r, Some(count));
            view.fanout = Some(fanout.map(FanoutView::from));
            view.queue_missing = state.shared.queues.get(&r.def.queue).is_none();
            view
        })
        .collect();
    Ok(Json(ReminderList {
        reminders,
        next_after,
    }))
}

async fn subscribe_one(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    UserPath(user): UserPath,
) -> Result<Response, ApiError> {
    let users = vec![user];
    let (added, users) = blocking(&state, move |s| {
        let added = s.service.subscribe(&id, &users)?;
        Ok((added, users))
    })
    .await?;
    state.forget_users(&users);
    let status = if added == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(serde_json::json!({ "subscribed": true, "new": added == 1 })),
    )
        .into_response())
}

async fn is_subscribed(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    UserPath(user): UserPath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let shown = user.to_string();
    let member = blocking(&state, move |s| s.service.is_subscribed(&id, &user)).await?;
    if !member {
        return Err(not_subscribed(&shown));
    }
    Ok(Json(serde_json::json!({ "subscribed": true })))
}

fn not_subscribed(user: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UserNotFound,
        format!("user {user:?} is not subscribed to this reminder"),
    )
}

async fn unsubscribe_one(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    UserPath(user): UserPath,
) -> Result<StatusCode, ApiError> {
    let shown = user.to_string();
    let users = vec![user];
    let (removed, users) = blocking(&state, move |s| {
        let removed = s.service.unsubscribe(&id, &users)?;
        Ok((removed, users))
    })
    .await?;
    state.forget_users(&users);
    if removed == 0 {
        return Err(not_subscribed(&shown));
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn count(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let count = blocking(&state, move |s| s.service.count(&id)).await?;
    Ok(Json(serde_json::json!({ "subscribers": count })))
}

async fn subscribers(
    State(state): State<AppState>,
    ReminderPath(id): ReminderPath,
    query: Result<Query<SubscribersQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let q = page_query(query, "after, limit")?;
    let limit = page_limit(q.limit, SUBSCRIBERS_PAGE_DEFAULT, SUBSCRIBERS_PAGE_MAX)?;
    let after = q.after.as_deref().map(user_id).transpose()?;
    let page = blocking(&state, move |s| {
        s.service.subscribers(&id, after.as_ref(), limit)
    })
    .await?;
    let next_after = (page.len() == limit)
        .then(|| page.last().map(|u| u.to_string()))
        .flatten();
    let users: Vec<&str> = page.iter().map(UserId::as_str).collect();
    let mut body = serde_json::json!({ "users": users });
    if let Some(next) = next_after {
        body["next_after"] = next.into();
    }
    Ok(Json(body))
}

#[derive(Debug, Serialize)]
struct FeedItem<'a> {
    id: &'a str,
    queue: &'a str,
    due_at_ms: u64,
    due_at: String,
    priority: &'static str,
    content: Box<RawValue>,
}

/// A reminder's feed item as JSON, and its hash (for the ETag), once per cached reminder.
fn render_item(r: &Reminder) -> (Box<str>, u64) {
    use std::hash::{Hash, Hasher};
    let text = render_json(r);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    (text, hasher.finish())
}

fn render_json(r: &Reminder) -> Box<str> {
    let due = r.next_fire_ms.unwrap_or_default();
    let item = FeedItem {
        id: r.id.as_str(),
        queue: r.def.queue.as_str(),
        due_at_ms: due,
        due_at: format_utc(due).unwrap_or_default(),
        priority: r.def.urgency.as_str(),
        content: raw(&r.def.content),
    };
    serde_json::to_string(&item)
        .unwrap_or_else(|_| "null".into())
        .into_boxed_str()
}

/// The feed's body: `{"user", "reminders": [items], "degraded"}`, from rendered items.
fn feed_body(user: &UserId, feed: &Feed) -> String {
    let user = serde_json::to_string(user.as_str()).unwrap_or_else(|_| "\"\"".into());
    let mut body = String::with_capacity(64 + feed.reminders.len() * 320);
    body.push_str("{\"user\":");
    body.push_str(&user);
    body.push_str(",\"reminders\":[");
    for (i, r) in feed.reminders.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&r.rendered.get_or_init(|| render_item(&r.reminder)).0);
    }
    body.push_str("],\"degraded\":");
    body.push_str(if feed.degraded { "true}" } else { "false}" });
    body
}

/// The answer's version: the hashes of its items (each computed once per cached reminder),
/// and whether it is degraded. A matching `If-None-Match` then costs no body.
fn feed_etag(feed: &Feed) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    feed.degraded.hash(&mut hasher);
    for r in &feed.reminders {
        r.rendered
            .get_or_init(|| render_item(&r.reminder))
            .1
            .hash(&mut hasher);
    }
    format!("\"{:016x}{:04x}\"", hasher.finish(), feed.reminders.len())
}

async fn feed(
    State(state): State<AppState>,
    UserPath(user): UserPath,
    headers: HeaderMap,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page_query(query, "within_ms, limit")?;
    let limit = page_limit(q.limit, FEED_LIMIT_DEFAULT, FEED_LIMIT_MAX)?;
    let within_ms = q.within_ms.unwrap_or(FEED_WITHIN_MS_DEFAULT);
    if within_ms == 0 || within_ms > FEED_WITHIN_MS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "within_ms must be between 1 and {FEED_WITHIN_MS_MAX} (31 days), got {within_ms}"
            ),
        ));
    }
    let feed = state.feed(user.clone(), within_ms, limit).await?;
    let etag = feed_etag(&feed);
    let max_age = if feed.degraded { 5 } else { FEED_MAX_AGE_S };
    let cache = HeaderValue::from_str(&format!("private, max-age={max_age}")).expect("ascii");
    let etag_value = HeaderValue::from_str(&etag).expect("hex is ascii");
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            // `*` matches any current answer (RFC 9110, 13.1.2), and the feed always has one.
            v.trim() == "*"
                || v.split(',')
                    .any(|t| t.trim().trim_start_matches("W/") == etag)
        });
    // One outcome a request: a degraded answer counts as degraded, 304 or not.
    crate::metrics::feed_request(match (feed.degraded, matches) {
        (true, _) => "degraded",
        (false, true) => "not_modified",
        (false, false) => "ok",
    });
    let mut response = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = Response::new(Body::from(feed_body(&user, &feed)));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, etag_value);
    h.insert(header::CACHE_CONTROL, cache);
    if feed.degraded {
        h.insert("belfry-feed", HeaderValue::from_static("degraded"));
    }
    Ok(response)
}
