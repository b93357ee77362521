//! Schedules (`/v1/schedules`) and the queue forecast.
//!
//! ```no_run
//! # async fn demo() -> Result<(), belfry_client::Error> {
//! let client = belfry_client::Client::new("http://127.0.0.1:7070")?;
//! let spec = belfry_client::ScheduleSpec::cron("reports", "30 2 * * *")
//!     .timezone("Europe/Paris")
//!     .id("nightly");
//! let schedule = client.create_schedule(&spec).await?;
//! println!("next at {:?}", schedule.next_fire_at);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::request::{segment, Request};
use crate::{Client, Result};

/// A schedule to create or to replace one with.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScheduleSpec {
    /// Chosen by the client (1 to 128 of `[A-Za-z0-9_.-]`); generated when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub queue: String,
    /// 5 or 6 fields (seconds first), or an alias such as `@hourly`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// IANA zone of `cron` (UTC by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// "high" or "normal".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// A task's late policy, e.g. `{"policy": "skip", "after_ms": 60000}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_count: Option<u32>,
    /// "skip", "fire_once" (default) or "catch_up".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misfire: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Webhook queues only: the URL the firings go to instead of the queue's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl ScheduleSpec {
    pub fn cron(queue: impl Into<String>, expression: impl Into<String>) -> Self {
        ScheduleSpec {
            queue: queue.into(),
            cron: Some(expression.into()),
            ..ScheduleSpec::default()
        }
    }

    pub fn every_ms(queue: impl Into<String>, every_ms: u64) -> Self {
        ScheduleSpec {
            queue: queue.into(),
            every_ms: Some(every_ms),
            ..ScheduleSpec::default()
        }
    }

    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    pub fn timezone(mut self, zone: impl Into<String>) -> Self {
        self.timezone = Some(zone.into());
        self
    }

    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }

    pub fn shard_count(mut self, shards: u32) -> Self {
        self.shard_count = Some(shards);
        self
    }

    pub fn misfire(mut self, policy: impl Into<String>) -> Self {
        self.misfire = Some(policy.into());
        self
    }
}

/// A stored schedule, as the server shows it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Schedule {
    pub id: String,
    pub queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub priority: String,
    #[serde(default)]
    pub late: Value,
    pub shard_count: u32,
    pub misfire: String,
    pub paused: bool,
    /// The firings' own target, without credentials or query string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// The next firing not yet created: absent when paused or finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_local: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ScheduleList {
    pub schedules: Vec<Schedule>,
}

/// One upcoming fire time.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct FireTime {
    /// RFC 3339 in UTC.
    pub at: String,
    pub at_ms: u64,
    /// RFC 9557 in the schedule's zone.
    pub local: String,
}

/// What a run by hand made: one task per shard.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ScheduleRun {
    pub schedule: String,
    pub queue: String,
    pub fired_at_ms: u64,
    pub tasks: Vec<RunTask>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct RunTask {
    pub id: String,
    /// A run in the same millisecond made it already.
    pub duplicate: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct NextFireTimes {
    pub id: String,
    pub timezone: String,
    pub fire_times: Vec<FireTime>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ForecastStep {
    pub start_ms: u64,
    /// Tasks already stored, due in this step.
    pub tasks: u64,
    /// Tasks schedules will create in this step.
    pub firings: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Forecast {
    pub queue: String,
    pub from_ms: u64,
    pub step_ms: u64,
    pub horizon_ms: u64,
    pub steps: Vec<ForecastStep>,
}

impl Request {
    pub fn create_schedule(spec: &ScheduleSpec) -> Self {
        Self::new(Method::POST, "/v1/schedules".to_owned()).with_body(body(spec))
    }

    pub fn list_schedules() -> Self {
        Self::new(Method::GET, "/v1/schedules".to_owned())
    }

    pub fn get_schedule(id: &str) -> Self {
        Self::new(Method::GET, schedule_path(id, ""))
    }

    pub fn replace_schedule(id: &str, spec: &ScheduleSpec) -> Self {
        Self::new(Method::PUT, schedule_path(id, "")).with_body(body(spec))
    }

    pub fn delete_schedule(id: &str) -> Self {
        Self::new(Method::DELETE, schedule_path(id, ""))
    }

    pub fn pause_schedule(id: &str) -> Self {
        Self::new(Method::POST, schedule_path(id, "/pause"))
    }

    pub fn resume_schedule(id: &str) -> Self {
        Self::new(Method::POST, schedule_path(id, "/resume"))
    }

    /// Fires the schedule once now, outside its timetable.
    pub fn run_schedule(id: &str) -> Self {
        Self::new(Method::POST, schedule_path(id, "/run"))
    }

    pub fn next_fire_times(id: &str, n: Option<usize>) -> Self {
        let query = n.map(|n| format!("?n={n}")).unwrap_or_default();
        Self::new(Method::GET, schedule_path(id, &format!("/next{query}")))
    }

    pub fn forecast(queue: &str, horizon_ms: Option<u64>, step_ms: Option<u64>) -> Self {
        let mut query = Vec::new();
        if let Some(horizon) = horizon_ms {
            query.push(format!("horizon_ms={horizon}"));
        }
        if let Some(step) = step_ms {
            query.push(format!("step_ms={step}"));
        }
        let mut path = format!("/v1/queues/{}/forecast", segment(queue));
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        Self::new(Method::GET, path)
    }
}

fn schedule_path(id: &str, rest: &str) -> String {
    format!("/v1/schedules/{}{rest}", segment(id))
}

fn body(spec: &ScheduleSpec) -> Value {
    // A plain struct with string keys: serialising it cannot fail.
    serde_json::to_value(spec).expect("a schedule spec serialises to JSON")
}

impl Client {
    pub async fn create_schedule(&self, spec: &ScheduleSpec) -> Result<Schedule> {
        self.expect(Request::create_schedule(spec)).await
    }

    pub async fn list_schedules(&self) -> Result<Vec<Schedule>> {
        let list: ScheduleList = self.expect(Request::list_schedules()).await?;
        Ok(list.schedules)
    }

    pub async fn get_schedule(&self, id: &str) -> Result<Schedule> {
        self.expect(Request::get_schedule(id)).await
    }

    /// Replaces the schedule's definition; it fires afresh from now.
    pub async fn replace_schedule(&self, id: &str, spec: &ScheduleSpec) -> Result<Schedule> {
        self.expect(Request::replace_schedule(id, spec)).await
    }

    /// Deletes the schedule; tasks of past firings stay in their queue.
    pub async fn delete_schedule(&self, id: &str) -> Result<()> {
        self.expect_empty(Request::delete_schedule(id)).await
    }

    pub async fn pause_schedule(&self, id: &str) -> Result<Schedule> {
        self.expect(Request::pause_schedule(id)).await
    }

    /// Fires again from now on; the paused period is not replayed.
    pub async fn resume_schedule(&self, id: &str) -> Result<Schedule> {
        self.expect(Request::resume_schedule(id)).await
    }

    /// Fires the schedule once now, outside its timetable (paused or not): one task per
    /// shard, due now; its next fire time does not move.
    pub async fn run_schedule(&self, id: &str) -> Result<ScheduleRun> {
        self.expect(Request::run_schedule(id)).await
    }

    /// The next `n` fire times (the server's default, 10, when `None`).
    pub async fn next_fire_times(&self, id: &str, n: Option<usize>) -> Result<NextFireTimes> {
        self.expect(Request::next_fire_times(id, n)).await
    }

    /// Tasks falling due per step from now: stored ones and future schedule firings.
    pub async fn forecast(
        &self,
        queue: &str,
        horizon_ms: Option<u64>,
        step_ms: Option<u64>,
    ) -> Result<Forecast> {
        self.expect(Request::forecast(queue, horizon_ms, step_ms))
            .await
    }
}
