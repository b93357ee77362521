//! Schedule endpoints (`/v1/schedules...`) and the queue forecast
//! (`/v1/queues/{queue}/forecast`), over `belfry_schedule::ScheduleService`.
//!
//! Like the rest of `api`, this module is the only one that knows the JSON shapes; the
//! service knows nothing of HTTP. Payload, headers, priority and late policy use the same
//! shapes as tasks (`dto/tasks.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use belfry_core::schedule::{
    canonical_zone_name, format_in_zone, format_utc, TimeZone, Trigger, PREVIEW_MAX,
};
use belfry_core::{LatePolicy, Priority, QueueName, UnixMs};
use belfry_schedule::{
    FireTime, MisfirePolicy, NewSchedule, Schedule, ScheduleDef, ScheduleId, ScheduleServiceError,
    TriggerDef, FORECAST_STEPS_MAX,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::dto::{late_policy_from, LateBody, LatePolicyName, PayloadView, PriorityBody};
use super::error::{ApiError, ErrorCode};
use super::extract::{page_limit, page_query, queue_name, rfc3339_ms, JsonBody, QueuePath};
use super::payload::payload_from;
use crate::schedules::SchedulesState;
use crate::shared::Caller;

/// Largest schedule payload: a schedule is metadata, held in memory and copied into every
/// checkpoint (a reminder's content has the same bound).
pub const SCHEDULE_PAYLOAD_BYTES_MAX: usize = 64 * 1024;

type AppState = Arc<SchedulesState>;

/// Fire times `next` returns when the caller does not say.
pub const NEXT_DEFAULT: usize = 10;

/// The most fire times one `next` call returns (the service's preview limit).
pub const NEXT_MAX: usize = PREVIEW_MAX;

/// Forecast window when the caller does not say: the next hour, minute by minute.
pub const FORECAST_HORIZON_MS_DEFAULT: u64 = 3_600_000;
pub const FORECAST_STEP_MS_DEFAULT: u64 = 60_000;

/// The smallest forecast step: fire times have one-second resolution, so finer steps only
/// make the answer longer.
pub const FORECAST_STEP_MS_MIN: u64 = 1_000;

/// The longest forecast horizon (31 days): far enough to pre-scale for a month, short enough
/// that counting a per-second schedule's firings stays cheap.
pub const FORECAST_HORIZON_MS_MAX: u64 = 31 * 24 * 3_600_000;

/// Most steps in one forecast answer (a week in minutes is 10,080): each step is a JSON object,
/// so this bounds the answer to about a megabyte.
pub const FORECAST_STEPS_API_MAX: usize = 20_000;
const _: () = assert!(FORECAST_STEPS_API_MAX <= FORECAST_STEPS_MAX);

/// The schedule routes, served beside API v1 (merge them with `ServerBuilder::merge`). Their
/// bodies are bounded by the server's request limit (`api::finish`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/schedules", post(create).get(list))
        .route(
            "/v1/schedules/{id}",
            get(get_one).put(replace).delete(delete),
        )
        .route("/v1/schedules/{id}/pause", post(pause))
        .route("/v1/schedules/{id}/resume", post(resume))
        .route("/v1/schedules/{id}/run", post(run))
        .route("/v1/schedules/{id}/next", get(next))
        .route("/v1/queues/{queue}/forecast", get(forecast))
        .with_state(state)
}

// ---- errors ----

impl From<ScheduleServiceError> for ApiError {
    fn from(e: ScheduleServiceError) -> Self {
        let code = match &e {
            ScheduleServiceError::InvalidId(_) => ErrorCode::InvalidScheduleId,
            ScheduleServiceError::Invalid(_) => ErrorCode::InvalidSchedule,
            // Only the forecast passes arguments the service can refuse, and the handler checks
            // them first: this is the generic bad-request code.
            ScheduleServiceError::InvalidArgument(_) => ErrorCode::InvalidRequest,
            ScheduleServiceError::QueueNotFound(queue) => {
                return ApiError::new(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist; create it with PUT /v1/queues/{queue}"),
                )
            }
            ScheduleServiceError::NotFound(_) => ErrorCode::ScheduleNotFound,
            ScheduleServiceError::AlreadyExists(_) => ErrorCode::ScheduleExists,
            ScheduleServiceError::Corrupt { .. } => ErrorCode::ScheduleCorrupt,
            ScheduleServiceError::Store(store) if store.is_transient() => {
                return ApiError::transient_store(store)
            }
            ScheduleServiceError::Store(
                belfry_store::StoreError::Poisoned(_)
                | belfry_store::StoreError::Closed
                | belfry_store::StoreError::AccessDenied { .. },
            ) => ErrorCode::StoreUnavailable,
            ScheduleServiceError::Store(
                belfry_store::StoreError::DiskFull { .. } | belfry_store::StoreError::Full { .. },
            ) => ErrorCode::InsufficientStorage,
            ScheduleServiceError::Store(belfry_store::StoreError::QueueNotFound(queue)) => {
                return ApiError::new(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist"),
                )
            }
            ScheduleServiceError::Store(_) => ErrorCode::InternalError,
        };
        ApiError::new(code, e.to_string())
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidSchedule, message)
}

/// Runs schedule-service calls on the blocking pool (they are store calls), through the
/// server's store-call admission like every other endpoint (503 `overloaded` when saturated).
async fn blocking<T, F>(state: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&SchedulesState) -> Result<T, ScheduleServiceError> + Send + 'static,
{
    let task_state = state.clone();
    let call = move |_: &dyn belfry_store::Store| Ok(f(&task_state));
    let outcome = state.shared.blocking(Caller::Api, call).await?;
    outcome.map_err(ApiError::from)
}

// ---- requests ----

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MisfireBody {
    Skip,
    FireOnce,
    CatchUp,
}

/// The body of `POST /v1/schedules` and `PUT /v1/schedules/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    pub id: Option<String>,
    pub queue: String,
    pub cron: Option<String>,
    pub timezone: Option<String>,
    pub every_ms: Option<u64>,
    pub start_at: Option<String>,
    pub start_at_ms: Option<u64>,
    pub end_at: Option<String>,
    pub end_at_ms: Option<u64>,
    pub payload: Option<Box<RawValue>>,
    pub payload_base64: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub priority: Option<PriorityBody>,
    /// The same forms as a task's: `late_policy` + `late_after_ms`, or `late`
    /// (`{"policy": "skip", "after_ms": 60000}`).
    pub late: Option<LateBody>,
    pub late_policy: Option<LatePolicyName>,
    pub late_after_ms: Option<u64>,
    pub shard_count: Option<u32>,
    pub misfire: Option<MisfireBody>,
    pub paused: Option<bool>,
    /// Webhook queues only: the URL the firings' tasks go to instead of the queue's.
    pub target: Option<String>,
}

/// An instant given as RFC 3339 text or as unix milliseconds (at most one of the two).
fn instant(name: &str, text: Option<&str>, ms: Option<u64>) -> Result<Option<UnixMs>, ApiError> {
    match (text, ms) {
        (Some(_), Some(_)) => Err(invalid(format!(
            "give {name} (RFC 3339) or {name}_ms (unix ms), not both"
        ))),
        (None, Some(ms)) if ms > jiff::Timestamp::MAX.as_millisecond().unsigned_abs() => {
            Err(invalid(format!(
                "{name}_ms {ms} is after {}, the latest time belfry takes",
                super::extract::LATEST_TIME
            )))
        }
        (None, ms) => Ok(ms),
        (Some(text), None) => {
            let at = rfc3339_ms(text).map_err(|e| invalid(format!("{name} {e}")))?;
            let at = at.ok_or_else(|| {
                invalid(format!(
                    "{name} {text:?} is after {}, the latest time belfry takes",
                    super::extract::LATEST_TIME
                ))
            })?;
            u64::try_from(at)
                .map(Some)
                .map_err(|_| invalid(format!("{name} must not be before 1970, got {text:?}")))
        }
    }
}

impl ScheduleBody {
    /// The client-chosen id (unchecked text) and the definition.
    fn into_def(self, payload_bytes_max: usize) -> Result<(Option<String>, ScheduleDef), ApiError> {
        let queue = queue_name(&self.queue)?;
        let trigger = match (self.cron, self.every_ms) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "give either cron (with an optional timezone) or every_ms, not both",
                ))
            }
            (None, None) => {
                return Err(invalid(
                    "give cron (5 or 6 fields, or an alias such as @hourly) or every_ms",
                ))
            }
            (Some(expression), None) => TriggerDef::Cron {
                expression,
                timezone: self
                    .timezone
                    .map_or_else(|| "UTC".to_owned(), |tz| canonical_zone_name(&tz)),
            },
            (None, Some(every_ms)) => {
                if self.timezone.is_some() {
                    return Err(invalid(
                        "timezone applies to cron schedules only; every_ms counts real time",
                    ));
                }
                TriggerDef::Every { every_ms }
            }
        };
        let start_at_ms = instant("start_at", self.start_at.as_deref(), self.start_at_ms)?;
        let end_at_ms = instant("end_at", self.end_at.as_deref(), self.end_at_ms)?;
        // A schedule is metadata, held in memory and copied into every checkpoint: its payload
        // is bounded like a reminder's content, below the task limit.
        let (payload, payload_kind) = payload_from(
            self.payload.as_deref(),
            self.payload_base64.as_deref(),
            payload_bytes_max.min(SCHEDULE_PAYLOAD_BYTES_MAX),
        )?;
        let def = ScheduleDef {
            queue,
            trigger,
            start_at_ms,
            end_at_ms,
            payload,
            payload_kind,
            // Header limits are checked by the service (two names are reserved for shards).
            headers: self.headers.unwrap_or_default().into_iter().collect(),
            priority: match self.priority {
                Some(PriorityBody::High) => Priority::High,
                Some(PriorityBody::Normal) | None => Priority::Normal,
            },
            late_policy: late_policy_from(self.late, self.late_policy, self.late_after_ms)?
                .unwrap_or_default(),
            shard_count: self.shard_count.unwrap_or(1),
            misfire: match self.misfire {
                Some(MisfireBody::Skip) => MisfirePolicy::Skip,
                Some(MisfireBody::CatchUp) => MisfirePolicy::CatchUp,
                Some(MisfireBody::FireOnce) | None => MisfirePolicy::FireOnce,
            },
            paused: self.paused.unwrap_or(false),
            target: self.target,
        };
        Ok((self.id, def))
    }
}

/// A schedule's target, checked as a task's is, from the queue's configuration rather than
/// its attached sink (the schedule routes have no dispatcher): the queue must deliver by
/// webhook, and the URL pass the server's target policy. A missing queue is left to the
/// service, which answers `queue_not_found`. The webhook checks the URL again when it sends
/// each firing.
fn check_target(state: &SchedulesState, def: &ScheduleDef) -> Result<(), ApiError> {
    let Some(target) = &def.target else {
        return Ok(());
    };
    if let Some(runtime) = state.shared.queues.get(&def.queue) {
        let queue = &def.queue;
        match runtime.config().sink().map(|spec| spec.kind()) {
            Some("webhook") => {}
            None => {
                return Err(ApiError::new(
                    ErrorCode::TargetNotSupported,
                    format!("queue {queue} is a pull queue: its consumers lease the firings, so a target means nothing there; targets are for webhook queues"),
                ))
            }
            Some(kind) => {
                return Err(ApiError::new(
                    ErrorCode::TargetNotSupported,
                    format!("queue {queue} delivers to a {kind} stream, every task to the queue's own; targets are for webhook queues"),
                ))
            }
        }
    }
    let policy = belfry_sinks::TargetPolicy {
        allow_private: state.shared.config.allow_private_targets,
    };
    belfry_sinks::webhook::target::validate_webhook_url(target, &policy)
        .map(|_| ())
        .map_err(|e| ApiError::new(ErrorCode::WebhookTargetRefused, format!("target: {e}")))
}

fn schedule_id(text: &str) -> Result<ScheduleId, ApiError> {
    ScheduleId::new(text).map_err(|e| ScheduleServiceError::from(e).into())
}

/// `{id}` from the path, validated.
pub struct SchedulePath(pub ScheduleId);

impl<S: Send + Sync> FromRequestParts<S> for SchedulePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("bad path: {e}")))?;
        Ok(SchedulePath(schedule_id(&id)?))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextQuery {
    pub n: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForecastQuery {
    pub horizon_ms: Option<u64>,
    pub step_ms: Option<u64>,
}

// ---- responses ----

#[derive(Debug, Serialize)]
#[serde(tag = "policy", rename_all = "lowercase")]
pub enum LateView {
    Fire,
    Skip { after_ms: u64 },
    Dead { after_ms: u64 },
}

#[derive(Debug, Serialize)]
pub struct ScheduleView {
    pub id: String,
    pub queue: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at_ms: Option<UnixMs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at_ms: Option<UnixMs>,
    #[serde(flatten)]
    pub payload: PayloadView,
    pub headers: BTreeMap<String, String>,
    pub priority: &'static str,
    pub late: LateView,
    pub shard_count: u32,
    pub misfire: &'static str,
    pub paused: bool,
    /// The firings' own target, without credentials or query string (as a queue's URL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    /// The next firing not yet created (absent when paused or finished). It may be slightly
    /// in the past when the runner is about to create it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_fire_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_fire_at_ms: Option<UnixMs>,
    /// `next_fire_at` in the schedule's zone (RFC 9557, e.g.
    /// `2026-03-08T03:00:00-04:00[America/New_York]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_fire_local: Option<String>,
    /// Present (and true) when the schedule's queue no longer exists: its firings are dropped
    /// until the queue is created again or the schedule is pointed at another.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub queue_missing: bool,
}

fn local_time(schedule: &Schedule, at_ms: UnixMs) -> Option<String> {
    match schedule.spec.trigger() {
        Trigger::Cron(cron) => cron.format_local(at_ms),
        Trigger::Every(_) => format_in_zone(&TimeZone::UTC, at_ms),
    }
}

impl ScheduleView {
    /// The schedule as the API shows it; `state` tells whether its queue still exists.
    pub fn new(schedule: &Schedule, state: &SchedulesState) -> Self {
        let def = &schedule.def;
        let (cron, timezone, every_ms) = match &def.trigger {
            TriggerDef::Cron {
                expression,
                timezone,
            } => (Some(expression.clone()), Some(timezone.clone()), None),
            TriggerDef::Every { every_ms } => (None, None, Some(*every_ms)),
        };
        let next = schedule.next_fire_ms();
        ScheduleView {
            id: schedule.id.to_string(),
            queue: def.queue.to_string(),
            cron,
            timezone,
            every_ms,
            start_at: def.start_at_ms.and_then(format_utc),
            start_at_ms: def.start_at_ms,
            end_at: def.end_at_ms.and_then(format_utc),
            end_at_ms: def.end_at_ms,
            payload: PayloadView::new(def.payload_kind, &def.payload),
            headers: def.headers.iter().cloned().collect(),
            priority: match def.priority {
                Priority::High => "high",
                Priority::Normal => "normal",
            },
            late: match def.late_policy {
                LatePolicy::Fire => LateView::Fire,
                LatePolicy::Skip { after_ms } => LateView::Skip { after_ms },
                LatePolicy::Dead { after_ms } => LateView::Dead { after_ms },
            },
            shard_count: def.shard_count,
            misfire: def.misfire.as_str(),
            paused: def.paused,
            target: def
                .target
                .as_deref()
                .map(belfry_sinks::webhook::redact_url_text),
            created_at_ms: schedule.created_at_ms,
            updated_at_ms: schedule.updated_at_ms,
            next_fire_at: next.and_then(format_utc),
            next_fire_at_ms: next,
            next_fire_local: next.and_then(|at| local_time(schedule, at)),
            queue_missing: state.shared.queues.get(&def.queue).is_none(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
    /// With `limit`: pass as `after` to read the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct FireTimeView {
    /// RFC 3339 in UTC.
    pub at: String,
    pub at_ms: UnixMs,
    /// RFC 9557 in the schedule's zone.
    pub local: String,
}

impl From<FireTime> for FireTimeView {
    fn from(t: FireTime) -> Self {
        FireTimeView {
            at: t.utc,
            at_ms: t.at_ms,
            local: t.local,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct NextView {
    pub id: String,
    pub timezone: String,
    pub fire_times: Vec<FireTimeView>,
}

#[derive(Debug, Serialize)]
pub struct ForecastStep {
    pub start_ms: UnixMs,
    /// Tasks already stored, due in this step.
    pub tasks: u64,
    /// Tasks that schedules will create in this step (firings times shards).
    pub firings: u64,
    pub total: u64,
}

#[derive(Debug, Serialize)]
pub struct ForecastView {
    pub queue: String,
    pub from_ms: UnixMs,
    pub step_ms: u64,
    pub horizon_ms: u64,
    pub steps: Vec<ForecastStep>,
    /// Set when the schedules' firings were counted only up to here (the forecast's budget,
    /// `FORECAST_FIRINGS_TOTAL_MAX`): later steps leave some firings out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firings_counted_until_ms: Option<UnixMs>,
}

// ---- handlers ----

pub async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ScheduleBody>,
) -> Result<Response, ApiError> {
    let (id, def) = body.into_def(state.payload_bytes_max)?;
    let id = id.as_deref().map(schedule_id).transpose()?;
    check_target(&state, &def)?;
    let now_ms = state.shared.now_ms();
    let schedule = state.create(NewSchedule { id, def, now_ms }).await??;
    state.schedule_written(schedule.next_fire_ms());
    Ok((
        StatusCode::CREATED,
        Json(ScheduleView::new(&schedule, &state)),
    )
        .into_response())
}

/// `GET /v1/schedules?queue=Q&after=ID&limit=N`: the schedules (of queue `Q` only, when
/// given), every one or, with `limit`, a page of them after `after`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub queue: Option<String>,
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// The most schedules a page lists (`limit`), as for the other lists.
const LIST_PAGE_MAX: usize = 1_000;

pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ScheduleList>, ApiError> {
    let q = page_query(q, "queue=<queue name>&after=<schedule id>&limit=<n>")?;
    let queue = q.queue.as_deref().map(queue_name).transpose()?;
    let after = q.after.as_deref().map(schedule_id).transpose()?;
    // No `limit`: every schedule, as before paging existed (the CLI and scripts read them all).
    let limit = match q.limit {
        Some(limit) => Some(page_limit(Some(limit), LIST_PAGE_MAX, LIST_PAGE_MAX)?),
        None => None,
    };
    let schedules = blocking(&state, |s| s.service.list()).await?;
    let page: Vec<ScheduleView> = schedules
        .iter()
        .filter(|schedule| queue.as_ref().is_none_or(|q| schedule.def.queue == *q))
        .filter(|schedule| after.as_ref().is_none_or(|after| schedule.id > *after))
        .take(limit.unwrap_or(usize::MAX))
        .map(|schedule| ScheduleView::new(schedule, &state))
        .collect();
    let next_after = limit
        .filter(|limit| page.len() == *limit)
        .and_then(|_| page.last().map(|view| view.id.clone()));
    Ok(Json(ScheduleList {
        schedules: page,
        next_after,
    }))
}

pub async fn get_one(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
) -> Result<Json<ScheduleView>, ApiError> {
    let found = blocking(&state, {
        let id = id.clone();
        move |s| s.service.get(&id)
    })
    .await?;
    let schedule = found.ok_or_else(|| ApiError::from(ScheduleServiceError::NotFound(id)))?;
    Ok(Json(ScheduleView::new(&schedule, &state)))
}

pub async fn replace(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
    JsonBody(body): JsonBody<ScheduleBody>,
) -> Result<Json<ScheduleView>, ApiError> {
    let (body_id, def) = body.into_def(state.payload_bytes_max)?;
    check_target(&state, &def)?;
    if let Some(body_id) = body_id {
        if body_id != id.as_str() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "the body's id {body_id:?} differs from the path's {id}; ids cannot change"
                ),
            ));
        }
    }
    let now_ms = state.shared.now_ms();
    let schedule = blocking(&state, move |s| s.service.replace(&id, def, now_ms)).await?;
    state.schedule_written(schedule.next_fire_ms());
    Ok(Json(ScheduleView::new(&schedule, &state)))
}

pub async fn delete(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
) -> Result<StatusCode, ApiError> {
    let existed = blocking(&state, {
        let id = id.clone();
        move |s| s.service.delete(&id)
    })
    .await?;
    if existed {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ScheduleServiceError::NotFound(id).into())
    }
}

pub async fn pause(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
) -> Result<Json<ScheduleView>, ApiError> {
    let now_ms = state.shared.now_ms();
    let schedule = blocking(&state, move |s| s.service.pause(&id, now_ms)).await?;
    Ok(Json(ScheduleView::new(&schedule, &state)))
}

pub async fn resume(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
) -> Result<Json<ScheduleView>, ApiError> {
    let now_ms = state.shared.now_ms();
    let schedule = blocking(&state, move |s| s.service.resume(&id, now_ms)).await?;
    state.schedule_written(schedule.next_fire_ms());
    Ok(Json(ScheduleView::new(&schedule, &state)))
}

/// `POST /v1/schedules/{id}/run`: fires the schedule once now, outside its timetable.
pub async fn run(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
) -> Result<(StatusCode, Json<RunView>), ApiError> {
    let now_ms = state.shared.now_ms();
    let (schedule, outcomes) = blocking(&state, move |s| s.service.run_now(&id, now_ms)).await?;
    let queue = schedule.def.queue.clone();
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, belfry_store::PutOutcome::Created { .. }))
        .count();
    if created > 0 {
        crate::metrics::submitted(queue.as_str(), created);
        if let Some(runtime) = state.shared.queues.get(&queue) {
            runtime.wake();
        }
    }
    tracing::info!(schedule = %schedule.id, %queue, tasks = outcomes.len(), "schedule run by hand");
    let tasks = outcomes
        .iter()
        .map(|o| RunTask {
            id: o.id().to_string(),
            duplicate: matches!(o, belfry_store::PutOutcome::Duplicate(_)),
        })
        .collect();
    let view = RunView {
        schedule: schedule.id.to_string(),
        queue: queue.to_string(),
        fired_at_ms: now_ms,
        tasks,
    };
    Ok((StatusCode::CREATED, Json(view)))
}

/// The answer of a run by hand: the tasks it made, one per shard.
#[derive(Debug, Serialize)]
pub struct RunView {
    pub schedule: String,
    pub queue: String,
    pub fired_at_ms: UnixMs,
    pub tasks: Vec<RunTask>,
}

#[derive(Debug, Serialize)]
pub struct RunTask {
    pub id: String,
    /// A run of the same millisecond made it already.
    pub duplicate: bool,
}

pub async fn next(
    State(state): State<AppState>,
    SchedulePath(id): SchedulePath,
    q: Result<Query<NextQuery>, QueryRejection>,
) -> Result<Json<NextView>, ApiError> {
    let q = page_query(q, "n=<count>")?;
    let n = q.n.unwrap_or(NEXT_DEFAULT);
    if n == 0 || n > NEXT_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("n must be between 1 and {NEXT_MAX}, got {n}"),
        ));
    }
    let now_ms = state.shared.now_ms();
    let (schedule, times) = blocking(&state, move |s| {
        let times = s.service.next(&id, now_ms, n)?;
        // `next` found the schedule, so a missing one here was deleted in between.
        let schedule = s
            .service
            .get(&id)?
            .ok_or_else(|| ScheduleServiceError::NotFound(id.clone()))?;
        Ok((schedule, times))
    })
    .await?;
    let timezone = match &schedule.def.trigger {
        TriggerDef::Cron { timezone, .. } => timezone.clone(),
        TriggerDef::Every { .. } => "UTC".to_owned(),
    };
    Ok(Json(NextView {
        id: schedule.id.to_string(),
        timezone,
        fire_times: times.into_iter().map(FireTimeView::from).collect(),
    }))
}

pub async fn forecast(
    State(state): State<AppState>,
    QueuePath(queue): QueuePath,
    q: Result<Query<ForecastQuery>, QueryRejection>,
) -> Result<Json<ForecastView>, ApiError> {
    let q = page_query(q, "horizon_ms=<ms>&step_ms=<ms>")?;
    let horizon_ms = q.horizon_ms.unwrap_or(FORECAST_HORIZON_MS_DEFAULT);
    let step_ms = q.step_ms.unwrap_or(FORECAST_STEP_MS_DEFAULT);
    let steps = forecast_steps(horizon_ms, step_ms)?;
    let from_ms = state.shared.now_ms();
    let name = queue.clone();
    let (tasks, firings) = blocking(&state, move |s| {
        forecast_counts(s, &name, from_ms, step_ms, steps)
    })
    .await?;
    let steps = tasks
        .iter()
        .zip(&firings.counts)
        .enumerate()
        .map(|(i, (&tasks, &firings))| ForecastStep {
            start_ms: from_ms.saturating_add(step_ms.saturating_mul(i as u64)),
            tasks,
            firings,
            total: tasks.saturating_add(firings),
        })
        .collect();
    Ok(Json(ForecastView {
        queue: queue.to_string(),
        from_ms,
        step_ms,
        horizon_ms,
        steps,
        firings_counted_until_ms: firings.cut_at_ms,
    }))
}

/// The number of steps for a forecast, within the documented bounds.
fn forecast_steps(horizon_ms: u64, step_ms: u64) -> Result<usize, ApiError> {
    let bad = |message: String| ApiError::new(ErrorCode::InvalidRequest, message);
    if step_ms < FORECAST_STEP_MS_MIN {
        return Err(bad(format!(
            "step_ms must be at least {FORECAST_STEP_MS_MIN}, got {step_ms}"
        )));
    }
    if horizon_ms == 0 || horizon_ms > FORECAST_HORIZON_MS_MAX {
        return Err(bad(format!(
            "horizon_ms must be between 1 and {FORECAST_HORIZON_MS_MAX}, got {horizon_ms}"
        )));
    }
    let steps = horizon_ms.div_ceil(step_ms);
    match usize::try_from(steps) {
        Ok(steps) if steps <= FORECAST_STEPS_API_MAX => Ok(steps),
        _ => Err(bad(format!(
            "horizon_ms / step_ms is {steps} steps, more than the {FORECAST_STEPS_API_MAX} allowed; use a larger step_ms"
        ))),
    }
}

/// Stored tasks and future firings per step.
fn forecast_counts(
    s: &SchedulesState,
    queue: &QueueName,
    from_ms: UnixMs,
    step_ms: u64,
    steps: usize,
) -> Result<(Vec<u64>, belfry_schedule::FiringsForecast), ScheduleServiceError> {
    if s.shared.store.get_queue(queue)?.is_none() {
        return Err(ScheduleServiceError::QueueNotFound(queue.clone()));
    }
    let tasks = s.shared.store.forecast(queue, from_ms, step_ms, steps)?;
    let firings = s.service.forecast_firings(queue, from_ms, step_ms, steps)?;
    Ok((tasks, firings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_errors_keep_their_codes() {
        let id = ScheduleId::new("s").unwrap();
        let queue = QueueName::new("q").unwrap();
        let cases = vec![
            ScheduleServiceError::from(ScheduleId::new("").unwrap_err()),
            ScheduleServiceError::Invalid(belfry_schedule::InvalidSchedule::Headers("x".into())),
            ScheduleServiceError::QueueNotFound(queue),
            ScheduleServiceError::NotFound(id.clone()),
            ScheduleServiceError::AlreadyExists(id),
            ScheduleServiceError::Corrupt {
                id: "s".into(),
                detail: "x".into(),
            },
        ];
        for e in cases {
            let code = e.code();
            assert_eq!(ApiError::from(e).code.as_str(), code);
        }
    }

    #[test]
    fn forecast_bounds() {
        assert_eq!(forecast_steps(3_600_000, 60_000).ok(), Some(60));
        assert_eq!(forecast_steps(3_600_001, 60_000).ok(), Some(61));
        assert!(forecast_steps(3_600_000, 999).is_err());
        assert!(forecast_steps(0, 60_000).is_err());
        assert!(forecast_steps(FORECAST_HORIZON_MS_MAX + 1, 3_600_000).is_err());
        let too_many = (FORECAST_STEPS_API_MAX as u64 + 1) * 1_000;
        assert!(forecast_steps(too_many, 1_000).is_err());
        assert!(forecast_steps(FORECAST_STEPS_API_MAX as u64 * 1_000, 1_000).is_ok());
    }

    fn def(json: &str) -> Result<ScheduleDef, ErrorCode> {
        let body: ScheduleBody =
            serde_json::from_str(json).map_err(|_| ErrorCode::InvalidRequest)?;
        body.into_def(100).map(|(_, def)| def).map_err(|e| e.code)
    }

    #[test]
    fn check_bodies() {
        let cron = def(r#"{"queue": "q", "cron": "0 9 * * *"}"#).unwrap();
        assert_eq!(
            cron.trigger,
            TriggerDef::Cron {
                expression: "0 9 * * *".into(),
                timezone: "UTC".into()
            }
        );
        assert_eq!(&cron.payload[..], b"null");
        assert_eq!(cron.shard_count, 1);
        assert_eq!(cron.misfire, MisfirePolicy::FireOnce);
        let every = def(
            r#"{"queue": "q", "every_ms": 5000, "start_at": "1970-01-01T00:00:02Z",
                "end_at_ms": 9000, "misfire": "catch_up",
                "late_policy": "skip", "late_after_ms": 7}"#,
        )
        .unwrap();
        assert_eq!(every.start_at_ms, Some(2_000));
        assert_eq!(every.end_at_ms, Some(9_000));
        assert_eq!(every.misfire, MisfirePolicy::CatchUp);
        assert_eq!(every.late_policy, LatePolicy::Skip { after_ms: 7 });
        let cases = [
            (r#"{"queue": "q"}"#, ErrorCode::InvalidSchedule),
            (
                r#"{"queue": "q", "cron": "* * * * *", "every_ms": 1000}"#,
                ErrorCode::InvalidSchedule,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "timezone": "UTC"}"#,
                ErrorCode::InvalidSchedule,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "start_at": "soon"}"#,
                ErrorCode::InvalidSchedule,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "start_at": "1970-01-01T00:00:02Z", "start_at_ms": 1}"#,
                ErrorCode::InvalidSchedule,
            ),
            (
                r#"{"queue": "no/pe", "every_ms": 1000}"#,
                ErrorCode::InvalidQueueName,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "payload": 1, "payload_base64": ""}"#,
                ErrorCode::InvalidPayload,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "payload_base64": "!!"}"#,
                ErrorCode::InvalidPayload,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "payload": "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"}"#,
                ErrorCode::PayloadTooLarge,
            ),
            (
                r#"{"queue": "q", "every_ms": 1000, "misfire": "later"}"#,
                ErrorCode::InvalidRequest,
            ),
        ];
        for (json, code) in cases {
            assert_eq!(def(json).err(), Some(code), "{json}");
        }
    }
}
