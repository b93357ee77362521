//! Schedules in the server: the `/v1/schedules` routes and the runner that turns due firings
//! into tasks. The server builder composes both; nothing outside wires them.
//!
//! Start-up order matters for exactly-once firings (see `belfry_schedule`): a tick interrupted
//! by a crash is replayed by the next tick, and the store recognises the tasks it already has by
//! their idempotency keys, but only while those tasks are unfinished. So the builder runs one
//! tick before the server dispatches anything or serves the API.
//!
//! The runner then ticks whenever the earliest fire time comes, at least every
//! `RUNNER_RECHECK_MS` (a store shared by several nodes announces their writes and ownership
//! changes, which wake the runner through `crate::follow`; the recheck bounds a missed
//! announcement), and fires only the schedules this node owns (`Store::owns`), and early when
//! this node creates, replaces or resumes a schedule that fires before the planned tick
//! (`crate::runner_plan`). Between full ticks a tick reads only the schedules that are due
//! (the service's timetable), none while nothing is, until a change is announced or
//! `belfry_schedule::FULL_TICK_MS` passes, so idle schedules cost nothing a second. Its store calls go through the server's internal admission
//! (never refused); the routes' through the API admission.

use std::sync::{Arc, Weak};
use std::time::Duration;

use belfry_core::UnixMs;
use belfry_schedule::{NewSchedule, Schedule, ScheduleService, ScheduleServiceError, TickReport};
use metrics::counter;

use crate::coalesce::{Coalescer, Pending};
use crate::runner_plan::RunnerWake;
use crate::shared::{Caller, ServiceError, Shared};

/// The runner ticks at least this often even when nothing is due: wall-clock steps are
/// noticed within this time. A tick reads every schedule only if something changed or
/// `belfry_schedule::FULL_TICK_MS` passed, and otherwise only the due ones; schedules created through other nodes are
/// announced by the store (`crate::follow`), and its periodic recheck bounds a lost
/// announcement.
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
/// Schedules found with missed fire times (after downtime), handled by their misfire policy.
pub const SCHEDULE_MISFIRES: &str = "belfry_schedule_misfires_total";
/// Ticks that failed (a store error); the next tick redoes their work.
pub const SCHEDULE_TICK_ERRORS: &str = "belfry_schedule_tick_errors_total";

/// How long before its fire time a firing's tasks are stored, by default (the config key
/// `schedules.lead`). A tick's work (scanning the schedules, storing their firings, writing
/// their cursors: about 100 ms for 10,000 per-second schedules on a 2-core machine) then
/// happens before the fire time instead of after it, and the tasks, due at the fire time,
/// are delivered from that moment, never earlier. The price: a schedule paused, changed or
/// deleted less than this before a firing does not stop that firing.
pub const SCHEDULE_LEAD_MS_DEFAULT: u64 = 500;

/// Schedule creates that go to the store together (one metadata write) at most.
pub const COALESCED_CREATES_MAX: usize = 512;

type CreateAnswer = Result<Schedule, ScheduleServiceError>;

/// What the schedule routes and the runner share.
pub struct SchedulesState {
    pub(crate) service: ScheduleService,
    /// Creates, coalesced: concurrent `POST /v1/schedules` share one metadata write, as
    /// single-task submits share one put.
    creates: Coalescer<NewSchedule, CreateAnswer>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) payload_bytes_max: usize,
    runner: RunnerWake,
    /// Schedules already reported as firing into a missing queue.
    warned_missing: crate::missing_queue::MissingQueueWarnings,
}

impl SchedulesState {
    /// Creates a schedule, possibly in one store call with other creates. Takes an API
    /// store-call slot while it waits, so admission still bounds the waiting creates.
    pub(crate) async fn create(&self, new: NewSchedule) -> Result<CreateAnswer, ServiceError> {
        let _permit = self.shared.calls.admit(Caller::Api).await?;
        Ok(self
            .creates
            .call(new, self.shared.calls.api_deadline())
            .await
            .unwrap_or_else(|failed| Err(ScheduleServiceError::Store(failed.into_store_error()))))
    }

    /// Makes the runner tick now (a stored permit if it is busy, so no wake is lost).
    pub(crate) fn wake(&self) {
        self.runner.wake();
    }

    /// Tells the runner that a schedule written through this node next fires at `next_ms`
    /// (`None`: paused or finished). It ticks early only if that is before its planned tick,
    /// so creating thousands of schedules that fire with the others costs no extra tick (a
    /// wake per create once made the runner scan every schedule back to back).
    pub(crate) fn schedule_written(&self, next_ms: Option<UnixMs>) {
        self.runner.written(next_ms);
    }
}

/// Schedules for one server: cheap to clone.
#[derive(Clone)]
pub struct Schedules {
    state: Arc<SchedulesState>,
}

impl Schedules {
    pub(crate) fn new(shared: Arc<Shared>) -> std::io::Result<Self> {
        let mut started = Ok(());
        let state = Arc::new_cyclic(|state: &Weak<SchedulesState>| {
            let state = state.clone();
            // The writer holds the state weakly: it ends with the server.
            let creates = Coalescer::start(
                "belfry-schedule-creates",
                COALESCED_CREATES_MAX,
                |_| 1,
                move |batch| create_batch(&state, batch),
            );
            let creates = creates.unwrap_or_else(|error| {
                started = Err(error);
                Coalescer::closed()
            });
            SchedulesState {
                service: ScheduleService::new(shared.store.clone()),
                creates,
                payload_bytes_max: shared.config.payload_bytes_max,
                runner: RunnerWake::new(
                    shared.config.schedule_lead_ms,
                    RUNNER_TICK_GAP_MS_MIN,
                    RUNNER_RECHECK_MS,
                ),
                shared,
                warned_missing: Default::default(),
            }
        });
        started.map(|()| Schedules { state })
    }

    /// The schedule service, for embedders and tests.
    pub fn service(&self) -> &ScheduleService {
        &self.state.service
    }

    /// What the schedule routes serve from (the builder hands it to `api::schedules`).
    pub(crate) fn state(&self) -> Arc<SchedulesState> {
        self.state.clone()
    }

    /// Runs one tick. The builder calls it before the server dispatches or serves: it replays
    /// a tick a crash may have interrupted while no firing task can have finished yet.
    pub(crate) async fn tick_at_startup(&self) -> Result<TickReport, ScheduleServiceError> {
        let report = tick(&self.state).await?;
        if report.tasks_duplicate > 0 {
            tracing::info!(
                tasks = report.tasks_duplicate,
                "schedules: an interrupted tick was replayed; its tasks already existed"
            );
        }
        publish(&self.state, &report);
        Ok(report)
    }

    /// Schedules changed on a node that shares the store: the runner's next tick reads them
    /// all rather than answering from its last look.
    pub(crate) fn relook(&self) {
        self.state.service.relook();
    }

    /// The schedules at `keys` changed on a node that shares the store: the runner's next
    /// tick reads those again, not every schedule.
    pub(crate) fn touched(&self, keys: impl IntoIterator<Item = String>) {
        self.state.service.touched(keys);
    }

    /// Makes the runner tick now: tests call this after moving a `ManualClock`.
    pub fn wake(&self) {
        self.state.wake();
    }

    /// The runner; it stops when the server starts shutting down, after its current tick.
    pub(crate) fn runner(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        Runner {
            state: self.state.clone(),
        }
        .run()
    }
}

/// Runs on the create writer's thread: one `create_many` for the batch, each answer to its
/// caller.
fn create_batch(state: &Weak<SchedulesState>, batch: Vec<Pending<NewSchedule, CreateAnswer>>) {
    let Some(state) = state.upgrade() else {
        return; // The replies drop: the callers hear that the server is gone.
    };
    let (new, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|p| (p.request, p.reply)).unzip();
    for (answer, reply) in state.service.create_many(new).into_iter().zip(replies) {
        let _ = reply.send(answer);
    }
}

struct Runner {
    state: Arc<SchedulesState>,
}

impl Runner {
    async fn run(self) {
        tracing::debug!("schedule runner started");
        let stop = self.state.shared.stopping.clone();
        while !stop.is_cancelled() {
            self.begin_tick();
            let ticked = tick(&self.state).await;
            let next_ms = match &ticked {
                Ok(report) => {
                    publish(&self.state, report);
                    report.next_tick_ms
                }
                Err(error) => {
                    counter!(SCHEDULE_TICK_ERRORS).increment(1);
                    tracing::warn!(%error, "fire due schedules; retrying");
                    None
                }
            };
            let wait_ms = self.plan_next(next_ms);
            // Never cancel a tick half-way (it would only be redone, but the shutdown flush
            // should see its writes): the select is on the pause only.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                _ = self.state.runner.notified() => {}
                _ = stop.cancelled() => {}
            }
        }
        tracing::debug!("schedule runner stopped");
    }

    fn begin_tick(&self) {
        self.state.runner.begin_look();
    }

    fn plan_next(&self, next_ms: Option<UnixMs>) -> u64 {
        let now_ms = self.state.shared.now_ms();
        self.state.runner.end_look(next_ms, now_ms)
    }
}

/// Metrics, logs, and wake-ups for the queues that got tasks.
fn publish(state: &SchedulesState, report: &TickReport) {
    for (queue, firings) in &report.firings_by_queue {
        counter!(SCHEDULE_FIRINGS, "queue" => queue.clone()).increment(*firings);
        let runtime = belfry_core::QueueName::new(queue.as_str())
            .ok()
            .and_then(|name| state.shared.queues.get(&name));
        if let Some(runtime) = runtime {
            // The new tasks may be due now: long-polls and the dispatcher look again.
            runtime.wake();
        }
    }
    if report.tasks_created > 0 {
        counter!(SCHEDULE_TASKS_CREATED).increment(report.tasks_created);
    }
    for (queue, tasks) in &report.tasks_by_queue {
        crate::metrics::submitted(queue, *tasks as usize);
    }
    if report.firings_dropped > 0 {
        counter!(SCHEDULE_FIRINGS_DROPPED).increment(report.firings_dropped);
    }
    if report.firings_not_owned > 0 {
        tracing::info!(firings = report.firings_not_owned, "this node lost schedules to another during a tick (a pause past its leases?); their firings are left to the new owner");
    }
    if report.schedules_misfired > 0 {
        counter!(SCHEDULE_MISFIRES).increment(report.schedules_misfired as u64);
    }
    for (schedule, reason) in &report.errors {
        tracing::warn!(%schedule, %reason, "fire schedule");
    }
    let exists = |queue: &str| crate::missing_queue::queue_exists(&state.shared, queue);
    for (schedule, queue) in state.warned_missing.fresh(&report.queues_missing, exists) {
        tracing::warn!(%schedule, %queue, "the schedule's queue does not exist; its firings are dropped until the queue is created again (said once per schedule; see belfry_schedule_firings_dropped_total)");
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

/// One tick at the clock's current time, on the blocking pool (it is store calls), through
/// the internal admission.
async fn tick(state: &Arc<SchedulesState>) -> Result<TickReport, ScheduleServiceError> {
    let now_ms = state.shared.now_ms();
    let until_ms = now_ms.saturating_add(state.shared.config.schedule_lead_ms);
    let for_tick = state.clone();
    let ticked = state
        .shared
        .blocking(Caller::Internal, move |_| {
            Ok(for_tick.service.tick_until(now_ms, until_ms))
        })
        .await;
    ticked.unwrap_or_else(|e| {
        Err(ScheduleServiceError::Store(belfry_store::StoreError::Io {
            context: "run a schedule tick on the blocking pool",
            path: None,
            source: std::io::Error::other(e.to_string()),
        }))
    })
}
