//! Schedules in the server: the `/v1/schedules` routes and the runner that turns due firings
//! into tasks.
//!
//! Start-up order matters for exactly-once firings (see `belfry_schedule`): a tick interrupted
//! by a crash is replayed by the next tick, and the store recognises the tasks it already has by
//! their idempotency keys, but only while those tasks are unfinished. So one tick runs before
//! the server dispatches anything or serves the API:
//!
//! ```ignore
//! let schedules = Schedules::new(&config, store.clone(), clock.clone());
//! schedules.tick_at_startup().await?;
//! let handle = Server::builder(config, store).clock(clock).merge(schedules.routes()).start().await?;
//! schedules.spawn_runner(&handle);
//! ```
//!
//! The runner then ticks whenever the earliest fire time comes, at least every
//! `RUNNER_RECHECK_MS` (schedules written by other nodes are not announced), and at once
//! when this node creates, replaces or resumes a schedule.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use belfry_core::Clock;
use belfry_schedule::{ScheduleService, ScheduleServiceError, TickReport};
use belfry_store::Store;
use metrics::counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::service::Service;
use crate::ServerHandle;

/// The runner looks at the schedules at least this often even when nothing is due: schedules
/// created through other nodes, and wall-clock steps, are noticed within this time.
pub const RUNNER_RECHECK_MS: u64 = 1_000;

/// The shortest pause between ticks, so a schedule whose next fire time is somehow not in the
/// future (a clock that does not move) cannot make the runner spin.
pub const RUNNER_TICK_GAP_MS_MIN: u64 = 1;

/// Firings created by schedules, by queue (each firing is `shard_count` tasks).
pub const SCHEDULE_FIRINGS: &str = "belfry_schedule_firings_total";
/// Tasks created by schedules (all queues).
pub const SCHEDULE_TASKS_CREATED: &str = "belfry_schedule_tasks_created_total";
/// Due fire times dropped by a misfire policy or because the queue was gone.
pub const SCHEDULE_FIRINGS_DROPPED: &str = "belfry_schedule_firings_dropped_total";
/// Ticks that failed (a store error); the next tick redoes their work.
pub const SCHEDULE_TICK_ERRORS: &str = "belfry_schedule_tick_errors_total";

/// What the schedule routes and the runner share.
pub struct SchedulesState {
    pub(crate) service: ScheduleService,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) payload_bytes_max: usize,
    request_bytes_max: usize,
    wake: Notify,
    /// The running server, once `spawn_runner` attached it: API calls go through its
    /// store-call admission.
    server: OnceLock<Arc<Service>>,
}

impl SchedulesState {
    pub(crate) fn server(&self) -> Option<&Arc<Service>> {
        self.server.get()
    }

    /// Makes the runner tick now (a stored permit if it is busy, so no wake is lost).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }
}

/// Schedules for one server: cheap to clone.
#[derive(Clone)]
pub struct Schedules {
    state: Arc<SchedulesState>,
}

impl Schedules {
    /// `store` and `clock` must be the ones the server is built with.
    pub fn new(config: &ServerConfig, store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        Schedules {
            state: Arc::new(SchedulesState {
                service: ScheduleService::new(store.clone()),
                store,
                clock,
                payload_bytes_max: config.payload_bytes_max,
                request_bytes_max: config.request_bytes_max,
                wake: Notify::new(),
                server: OnceLock::new(),
            }),
        }
    }

    /// The schedule service, for embedders and tests.
    pub fn service(&self) -> &ScheduleService {
        &self.state.service
    }

    /// The routes to pass to `ServerBuilder::merge`.
    pub fn routes(&self) -> Router {
        crate::api::schedules::router(self.state.clone(), self.state.request_bytes_max)
    }

    /// Runs one tick. Call it before `ServerBuilder::start`: it replays a tick a crash may have
    /// interrupted while no firing task can have been delivered and finished yet.
    pub async fn tick_at_startup(&self) -> Result<TickReport, ScheduleServiceError> {
        let report = tick(&self.state).await?;
        if report.tasks_duplicate > 0 {
            tracing::info!(
                tasks = report.tasks_duplicate,
                "schedules: an interrupted tick was replayed; its tasks already existed"
            );
        }
        Ok(report)
    }

    /// Makes the runner tick now: tests call this after moving a `ManualClock`.
    pub fn wake(&self) {
        self.state.wake();
    }

    /// Starts the runner, and puts the schedule routes under the server's store-call
    /// admission. The runner stops when the server starts shutting down, and the server waits
    /// for its last tick before flushing the store. Call it once, right after `start`.
    pub fn spawn_runner(&self, server: &ServerHandle) {
        let service = server.service().clone();
        if self.state.server.set(service.clone()).is_err() {
            tracing::warn!(
                "schedules: spawn_runner called twice; the second runner is not started"
            );
            return;
        }
        let runner = Runner {
            state: self.state.clone(),
            stop: service.stopping.clone(),
            service,
        };
        // Tracked with the dispatchers: shutdown waits for them before `Store::flush`.
        let tracker = runner.service.dispatchers.clone();
        tracker.spawn(runner.run());
    }
}

struct Runner {
    state: Arc<SchedulesState>,
    service: Arc<Service>,
    stop: CancellationToken,
}

impl Runner {
    async fn run(self) {
        tracing::debug!("schedule runner started");
        while !self.stop.is_cancelled() {
            let wait_ms = match tick(&self.state).await {
                Ok(report) => {
                    self.publish(&report);
                    let now_ms = self.state.clock.wall_ms();
                    report
                        .next_tick_ms
                        .map_or(RUNNER_RECHECK_MS, |next| next.saturating_sub(now_ms))
                        .clamp(RUNNER_TICK_GAP_MS_MIN, RUNNER_RECHECK_MS)
                }
                Err(error) => {
                    counter!(SCHEDULE_TICK_ERRORS).increment(1);
                    tracing::warn!(%error, "fire due schedules; retrying");
                    RUNNER_RECHECK_MS
                }
            };
            // Never cancel a tick half-way (it would only be redone, but the shutdown flush
            // should see its writes): the select is on the pause only.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                _ = self.state.wake.notified() => {}
                _ = self.stop.cancelled() => {}
            }
        }
        tracing::debug!("schedule runner stopped");
    }

    /// Metrics, logs, and wake-ups for the queues that got tasks.
    fn publish(&self, report: &TickReport) {
        for (queue, firings) in &report.firings_by_queue {
            counter!(SCHEDULE_FIRINGS, "queue" => queue.clone()).increment(*firings);
            let runtime = belfry_core::QueueName::new(queue.as_str())
                .ok()
                .and_then(|name| self.service.queues.get(&name));
            if let Some(runtime) = runtime {
                // The new tasks may be due now: long-polls and dispatchers look again.
                runtime.wake();
            }
        }
        if report.tasks_created > 0 {
            counter!(SCHEDULE_TASKS_CREATED).increment(report.tasks_created);
        }
        if report.firings_dropped > 0 {
            counter!(SCHEDULE_FIRINGS_DROPPED).increment(report.firings_dropped);
        }
        for (schedule, reason) in &report.errors {
            tracing::warn!(%schedule, %reason, "fire schedule");
        }
        if report.firings > 0 {
            tracing::debug!(
                firings = report.firings,
                tasks = report.tasks_created,
                misfired = report.schedules_misfired,
                dropped = report.firings_dropped,
                "schedules fired"
            );
        }
    }
}

/// One tick at the clock's current time, on the blocking pool (it is store calls).
async fn tick(state: &Arc<SchedulesState>) -> Result<TickReport, ScheduleServiceError> {
    let state = state.clone();
    let now_ms = state.clock.wall_ms();
    tokio::task::spawn_blocking(move || state.service.tick(now_ms))
        .await
        .unwrap_or_else(|e| {
            Err(ScheduleServiceError::Store(belfry_store::StoreError::Io {
                context: "run a schedule tick on the blocking pool",
                source: std::io::Error::other(e.to_string()),
            }))
        })
}
