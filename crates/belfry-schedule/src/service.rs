//! The schedule service: CRUD over stored schedules, and `tick`, which turns due firings into
//! tasks.
//!
//! The service holds no schedule state in memory: every call reads the store, so several
//! service instances over one store (stateless nodes) see the same schedules. Time is always
//! passed in (`now_ms`); the service never reads a clock.
//!
//! Exactly-once firings: `tick` first puts a firing's tasks, each with the idempotency key
//! `schedule:{id}:{fire_ms}:{shard}`, and only then persists the schedule's cursor. A crash in
//! between makes the next tick recompute the same fire times, and the store answers
//! `Duplicate` for the tasks it already has. A store may forget the key of a finished task,
//! so the server must run one `tick` at start-up before it dispatches or serves the API: then
//! no firing task can have finished between the crash and the replay.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use belfry_core::limits::BATCH_TASKS_MAX;
use belfry_core::schedule::{
    format_in_zone, format_utc, ScheduleSpec, TimeZone, Trigger, PREVIEW_MAX, SHARD_COUNT_HEADER,
    SHARD_HEADER,
};
use belfry_core::{NewTask, QueueName, UnixMs};
use belfry_store::{PutOutcome, Store, StoreError};
use bytes::Bytes;
use parking_lot::Mutex;

use crate::model::{
    FireTime, InvalidSchedule, InvalidScheduleId, Schedule, ScheduleDef, ScheduleId,
};
use crate::record::{
    decode_cursor, decode_schedule, encode_cursor, encode_schedule, StoredSchedule,
    CURSORS_NAMESPACE, SCHEDULES_NAMESPACE,
};

/// Most steps one forecast may ask for (a week in minutes is 10,080).
pub const FORECAST_STEPS_MAX: usize = 100_000;

/// Most firings of one schedule a forecast counts; a per-second schedule over a day is 86,400.
/// Beyond it the forecast undercounts that schedule rather than spend unbounded time.
pub const FORECAST_FIRINGS_MAX: usize = 200_000;

pub type Result<T, E = ScheduleServiceError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ScheduleServiceError {
    #[error(transparent)]
    InvalidId(#[from] InvalidScheduleId),
    #[error("invalid schedule: {0}")]
    Invalid(#[from] InvalidSchedule),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("schedule {0} does not exist")]
    NotFound(ScheduleId),
    #[error("schedule {0} already exists")]
    AlreadyExists(ScheduleId),
    #[error("stored schedule {id:?} is unreadable: {detail}")]
    Corrupt { id: String, detail: String },
    #[error("storage error: {0}")]
    Store(#[from] StoreError),
}

impl ScheduleServiceError {
    /// A stable machine-readable code for API errors. Never reused for another meaning.
    pub fn code(&self) -> &'static str {
        match self {
            ScheduleServiceError::InvalidId(_) => "invalid_schedule_id",
            ScheduleServiceError::Invalid(_) => "invalid_schedule",
            ScheduleServiceError::InvalidArgument(_) => "invalid_argument",
            ScheduleServiceError::QueueNotFound(_) => "queue_not_found",
            ScheduleServiceError::NotFound(_) => "schedule_not_found",
            ScheduleServiceError::AlreadyExists(_) => "schedule_exists",
            ScheduleServiceError::Corrupt { .. } => "schedule_corrupt",
            ScheduleServiceError::Store(_) => "storage_error",
        }
    }
}

/// What one tick did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Schedules that had something due.
    pub schedules_due: usize,
    /// Fire times that became firings.
    pub firings: u64,
    /// Tasks stored by this tick.
    pub tasks_created: u64,
    /// Firings by queue name (for per-queue metrics, and to wake only those queues).
    pub firings_by_queue: BTreeMap<String, u64>,
    /// Tasks the store already had (a replay after a crash between put and cursor persist).
    pub tasks_duplicate: u64,
    /// Schedules whose due set included missed fire times.
    pub schedules_misfired: usize,
    /// Due fire times dropped by the misfire policy or because the queue no longer exists.
    pub firings_dropped: u64,
    /// Schedules that could not be handled: (schedule id, reason). The others still ran.
    pub errors: Vec<(String, String)>,
    /// The earliest future fire time among the active schedules after this tick (what
    /// `next_tick_ms` would answer, without a second scan), or `None` if none will fire.
    pub next_tick_ms: Option<UnixMs>,
}

impl TickReport {
    fn note_next(&mut self, next: UnixMs) {
        self.next_tick_ms = Some(self.next_tick_ms.map_or(next, |n| n.min(next)));
    }
}

pub struct ScheduleService {
    store: Arc<dyn Store>,
    /// Serializes read-modify-write sequences of this process (create's existence check, a
    /// tick's re-read before firing, pause/resume). Other processes write other documents
    /// (see record.rs), so a process-local lock is enough.
    write_lock: Mutex<()>,
    /// Parsed documents by id, with the bytes they came from: a scan re-parses only the
    /// documents that changed. Holds only ids seen by the last scan.
    parsed: Mutex<HashMap<String, (Bytes, Arc<Parsed>)>>,
}

impl std::fmt::Debug for ScheduleService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduleService").finish_non_exhaustive()
    }
}

impl ScheduleService {
    pub fn new(store: Arc<dyn Store>) -> ScheduleService {
        ScheduleService {
            store,
            write_lock: Mutex::new(()),
            parsed: Mutex::new(HashMap::new()),
        }
    }

    /// Creates a schedule under `id`, or a generated id. Nothing fires for fire times at or
    /// before `now_ms`.
    pub fn create(
        &self,
        id: Option<ScheduleId>,
        def: ScheduleDef,
        now_ms: UnixMs,
    ) -> Result<Schedule> {
        let spec = def.to_spec(now_ms)?;
        self.check_queue(&def.queue)?;
        let _guard = self.write_lock.lock();
        let id = match id {
            Some(id) => {
                if self
                    .store
                    .get_meta(SCHEDULES_NAMESPACE, id.as_str())?
                    .is_some()
                {
                    return Err(ScheduleServiceError::AlreadyExists(id));
                }
                id
            }
            None => ScheduleId::generate(),
        };
        let schedule = Schedule {
            id,
            def,
            spec,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            not_before_ms: now_ms,
            cursor_ms: now_ms,
        };
        // A cursor left by a deleted schedule of the same id is at most its deletion time,
        // which is before now: max(cursor, not_before) ignores it, but remove it anyway.
        self.store
            .delete_meta(CURSORS_NAMESPACE, schedule.id.as_str())?;
        self.write(&schedule)?;
        Ok(schedule)
    }

    pub fn get(&self, id: &ScheduleId) -> Result<Option<Schedule>> {
        let Some(bytes) = self.store.get_meta(SCHEDULES_NAMESPACE, id.as_str())? else {
            return Ok(None);
        };
        let cursor = self.store.get_meta(CURSORS_NAMESPACE, id.as_str())?;
        let parsed = self.parse_cached(id.as_str(), &bytes)?;
        let cursor_ms = effective_cursor(id.as_str(), &parsed, cursor.as_deref())?;
        Ok(Some(parsed.to_schedule(cursor_ms)))
    }

    /// All readable schedules, in id order. An unreadable one is left out with a warning
    /// (and reported by every tick), so one bad record does not hide all the others.
    pub fn list(&self) -> Result<Vec<Schedule>> {
        let mut schedules = Vec::new();
        for (key, entry) in self.scan()? {
            match entry {
                Ok(entry) => schedules.push(entry.parsed.to_schedule(entry.cursor_ms)),
                Err(error) => {
                    tracing::warn!(schedule = %key, %error, "list schedules: skipping an unreadable one")
                }
            }
        }
        schedules.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(schedules)
    }

    /// Replaces the definition. The schedule starts afresh from `now_ms`: fire times of the old
    /// definition that were not yet handled are not fired.
    pub fn replace(&self, id: &ScheduleId, def: ScheduleDef, now_ms: UnixMs) -> Result<Schedule> {
        let _guard = self.write_lock.lock();
        let old = self.require(id)?;
        let spec = def.to_spec(old.created_at_ms)?;
        self.check_queue(&def.queue)?;
        let not_before_ms = old.not_before_ms.max(now_ms);
        let schedule = Schedule {
            def,
            spec,
            updated_at_ms: now_ms,
            not_before_ms,
            cursor_ms: old.cursor_ms.max(not_before_ms),
            ..old
        };
        self.write(&schedule)?;
        Ok(schedule)
    }

    /// Deletes the schedule. Tasks of past firings stay in their queue.
    pub fn delete(&self, id: &ScheduleId) -> Result<bool> {
        let _guard = self.write_lock.lock();
        let existed = self.store.delete_meta(SCHEDULES_NAMESPACE, id.as_str())?;
        self.store.delete_meta(CURSORS_NAMESPACE, id.as_str())?;
        Ok(existed)
    }

    /// Stops firing. Idempotent.
    pub fn pause(&self, id: &ScheduleId, now_ms: UnixMs) -> Result<Schedule> {
        let _guard = self.write_lock.lock();
        let mut schedule = self.require(id)?;
        if !schedule.def.paused {
            schedule.def.paused = true;
            schedule.updated_at_ms = now_ms;
            self.write(&schedule)?;
        }
        Ok(schedule)
    }

    /// Fires again from `now_ms` on; the paused period is not replayed. Idempotent.
    pub fn resume(&self, id: &ScheduleId, now_ms: UnixMs) -> Result<Schedule> {
        let _guard = self.write_lock.lock();
        let mut schedule = self.require(id)?;
        if schedule.def.paused {
            schedule.def.paused = false;
            schedule.updated_at_ms = now_ms;
            schedule.not_before_ms = schedule.not_before_ms.max(now_ms);
            schedule.cursor_ms = schedule.cursor_ms.max(schedule.not_before_ms);
            self.write(&schedule)?;
        }
        Ok(schedule)
    }

    /// The next `n` (at most `PREVIEW_MAX`) fire times after `after_ms` and after everything
    /// already handled, whether or not the schedule is paused.
    pub fn next(&self, id: &ScheduleId, after_ms: UnixMs, n: usize) -> Result<Vec<FireTime>> {
        let schedule = self.require(id)?;
        let from = after_ms.max(schedule.cursor_ms);
        let times = schedule.spec.preview(from, n.min(PREVIEW_MAX));
        Ok(times
            .into_iter()
            .map(|at_ms| fire_time(&schedule.spec, at_ms))
            .collect())
    }

    /// Creates the firings due at `now_ms` for every active schedule and advances their
    /// cursors. A schedule that fails (unreadable) is reported and skipped; a storage error
    /// ends the tick (nothing is lost: the next tick redoes the unfinished schedules).
    pub fn tick(&self, now_ms: UnixMs) -> Result<TickReport> {
        let mut report = TickReport::default();
        for (key, entry) in self.scan()? {
            // A cheap first look without the lock; the decision is remade under it.
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    report.errors.push((key, error.to_string()));
                    continue;
                }
            };
            match entry.next_fire_ms() {
                None => continue,
                Some(next) if next > now_ms => {
                    report.note_next(next);
                    continue;
                }
                Some(_) => {}
            }
            let _guard = self.write_lock.lock();
            let Some(schedule) = self.get(&entry.parsed.stored.id)? else {
                continue;
            };
            if schedule.def.paused {
                continue;
            }
            let cursor_ms = self.fire(&schedule, now_ms, &mut report)?;
            if let Some(next) = schedule.spec.next_after(cursor_ms) {
                report.note_next(next);
            }
        }
        Ok(report)
    }

    /// Puts the due firings of one schedule, then persists its cursor. Returns the new cursor.
    fn fire(&self, schedule: &Schedule, now_ms: UnixMs, report: &mut TickReport) -> Result<UnixMs> {
        let due = schedule.spec.due(schedule.cursor_ms, now_ms);
        if due.cursor_ms == schedule.cursor_ms {
            return Ok(due.cursor_ms);
        }
        report.schedules_due += 1;
        report.schedules_misfired += usize::from(due.misfired);
        report.firings_dropped += due.dropped;
        let shards = schedule.spec.shard_count() as usize;
        let mut batch: Vec<NewTask> = Vec::new();
        for (index, &fire_ms) in due.fire_times.iter().enumerate() {
            for shard in 0..shards {
                batch.push(firing_task(schedule, fire_ms, shard));
            }
            let last = index + 1 == due.fire_times.len();
            // Shards of one firing never exceed a batch (SHARD_COUNT_MAX <= BATCH_TASKS_MAX).
            if last || batch.len() + shards > BATCH_TASKS_MAX {
                let firings = (batch.len() / shards) as u64;
                match self.store.put(std::mem::take(&mut batch)) {
                    Ok(outcomes) => {
                        report.firings += firings;
                        *report
                            .firings_by_queue
                            .entry(schedule.def.queue.to_string())
                            .or_default() += firings;
                        for outcome in outcomes {
                            match outcome {
                                PutOutcome::Created { .. } => report.tasks_created += 1,
                                PutOutcome::Duplicate(_) => report.tasks_duplicate += 1,
                            }
                        }
                    }
                    Err(StoreError::QueueNotFound(queue)) => {
                        // The queue was deleted under the schedule: these firings cannot
                        // exist. Drop them and move on, rather than retry on every tick.
                        report.firings_dropped += firings;
                        report.errors.push((
                            schedule.id.to_string(),
                            format!("queue {queue} does not exist; firings dropped"),
                        ));
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
        debug_assert!(batch.is_empty());
        self.store.put_meta(
            CURSORS_NAMESPACE,
            schedule.id.as_str(),
            encode_cursor(due.cursor_ms),
        )?;
        Ok(due.cursor_ms)
    }

    /// The earliest instant at which `tick` would create a firing, or `None` if no active
    /// schedule will ever fire again. It may be in the past (a tick is due now). Schedules
    /// created by other nodes are not announced, so a runner should also wake up
    /// periodically (e.g. every second).
    pub fn next_tick_ms(&self) -> Result<Option<UnixMs>> {
        let mut earliest: Option<UnixMs> = None;
        // An unreadable schedule cannot fire; tick reports it.
        for entry in self.scan()?.into_iter().filter_map(|(_, entry)| entry.ok()) {
            if let Some(next) = entry.next_fire_ms() {
                earliest = Some(earliest.map_or(next, |e| e.min(next)));
            }
        }
        Ok(earliest)
    }

    /// How many tasks the queue's active schedules will create in each of `steps` windows
    /// `[from + i*step, from + (i+1)*step)`, counting firings not yet created (after each
    /// schedule's cursor) times their shard count. For the queue forecast, added to the
    /// store's count of tasks that already exist.
    pub fn forecast_firings(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        if step_ms == 0 {
            return Err(ScheduleServiceError::InvalidArgument(
                "step_ms must be at least 1".into(),
            ));
        }
        if steps > FORECAST_STEPS_MAX {
            return Err(ScheduleServiceError::InvalidArgument(format!(
                "at most {FORECAST_STEPS_MAX} steps"
            )));
        }
        let mut counts = vec![0u64; steps];
        for entry in self.scan()?.into_iter().filter_map(|(_, entry)| entry.ok()) {
            let (stored, spec) = (&entry.parsed.stored, &entry.parsed.spec);
            if stored.def.paused || &stored.def.queue != queue {
                continue;
            }
            let shards = u64::from(spec.shard_count());
            let mut cursor = entry.cursor_ms.max(from_ms.saturating_sub(1));
            for _ in 0..FORECAST_FIRINGS_MAX {
                let Some(next) = spec.next_after(cursor) else {
                    break;
                };
                let index = (next.saturating_sub(from_ms)) / step_ms;
                let Some(slot) = usize::try_from(index).ok().and_then(|i| counts.get_mut(i)) else {
                    break;
                };
                *slot += shards;
                cursor = next;
            }
        }
        Ok(counts)
    }

    fn require(&self, id: &ScheduleId) -> Result<Schedule> {
        self.get(id)?
            .ok_or_else(|| ScheduleServiceError::NotFound(id.clone()))
    }

    fn check_queue(&self, queue: &QueueName) -> Result<()> {
        match self.store.get_queue(queue)? {
            Some(_) => Ok(()),
            None => Err(ScheduleServiceError::QueueNotFound(queue.clone())),
        }
    }

    fn write(&self, schedule: &Schedule) -> Result<()> {
        let bytes = encode_schedule(&StoredSchedule::from_schedule(schedule));
        self.store
            .put_meta(SCHEDULES_NAMESPACE, schedule.id.as_str(), bytes)?;
        Ok(())
    }

    /// Every stored schedule with its effective cursor, or why it cannot be read.
    fn scan(&self) -> Result<Vec<(String, Result<Entry>)>> {
        let cursors = self.cursors()?;
        let listing = self.store.list_meta(SCHEDULES_NAMESPACE)?;
        let mut cache = self.parsed.lock();
        let mut fresh = HashMap::with_capacity(listing.len());
        let mut entries = Vec::with_capacity(listing.len());
        for (key, bytes) in listing {
            let parsed = match cache.remove(&key) {
                Some((cached, parsed)) if cached == bytes => Ok(parsed),
                _ => parse(&key, &bytes).map(Arc::new),
            };
            let entry = parsed.and_then(|parsed| {
                fresh.insert(key.clone(), (bytes, parsed.clone()));
                let cursor_ms = effective_cursor(&key, &parsed, cursors.get(&key).map(|b| &b[..]))?;
                Ok(Entry { parsed, cursor_ms })
            });
            entries.push((key, entry));
        }
        *cache = fresh;
        Ok(entries)
    }

    /// Parses one document, reusing the cached parse when the bytes are unchanged.
    fn parse_cached(&self, key: &str, bytes: &Bytes) -> Result<Arc<Parsed>> {
        if let Some((cached, parsed)) = self.parsed.lock().get(key) {
            if cached == bytes {
                return Ok(parsed.clone());
            }
        }
        let parsed = Arc::new(parse(key, bytes)?);
        self.parsed
            .lock()
            .insert(key.to_string(), (bytes.clone(), parsed.clone()));
        Ok(parsed)
    }

    fn cursors(&self) -> Result<HashMap<String, Bytes>> {
        Ok(self
            .store
            .list_meta(CURSORS_NAMESPACE)?
            .into_iter()
            .collect())
    }
}

/// A decoded schedule document and the spec built from it.
struct Parsed {
    stored: StoredSchedule,
    spec: ScheduleSpec,
}

impl Parsed {
    fn to_schedule(&self, cursor_ms: UnixMs) -> Schedule {
        let stored = &self.stored;
        Schedule {
            id: stored.id.clone(),
            def: stored.def.clone(),
            spec: self.spec.clone(),
            created_at_ms: stored.created_at_ms,
            updated_at_ms: stored.updated_at_ms,
            not_before_ms: stored.not_before_ms,
            cursor_ms,
        }
    }
}

/// One schedule seen by a scan: its parsed document and its effective cursor.
struct Entry {
    parsed: Arc<Parsed>,
    cursor_ms: UnixMs,
}

impl Entry {
    fn next_fire_ms(&self) -> Option<UnixMs> {
        if self.parsed.stored.def.paused {
            return None;
        }
        self.parsed.spec.next_after(self.cursor_ms)
    }
}

fn parse(key: &str, bytes: &[u8]) -> Result<Parsed> {
    let corrupt = |detail: String| ScheduleServiceError::Corrupt {
        id: key.to_string(),
        detail,
    };
    let stored = decode_schedule(bytes).map_err(|e| corrupt(e.to_string()))?;
    if stored.id.as_str() != key {
        return Err(corrupt(format!("stored under another id {:?}", stored.id)));
    }
    let spec = stored
        .def
        .to_spec(stored.created_at_ms)
        .map_err(|e| corrupt(e.to_string()))?;
    Ok(Parsed { stored, spec })
}

/// The stored cursor, never below the schedule's `not_before_ms` (a cursor left behind by a
/// deleted schedule of the same id, or one from before a resume, is thereby ignored).
fn effective_cursor(key: &str, parsed: &Parsed, cursor: Option<&[u8]>) -> Result<UnixMs> {
    let not_before_ms = parsed.stored.not_before_ms;
    match cursor {
        Some(bytes) => decode_cursor(bytes)
            .map(|cursor_ms| cursor_ms.max(not_before_ms))
            .map_err(|e| ScheduleServiceError::Corrupt {
                id: key.to_string(),
                detail: format!("cursor: {e}"),
            }),
        None => Ok(not_before_ms),
    }
}

/// The task of one shard of one firing.
fn firing_task(schedule: &Schedule, fire_ms: UnixMs, shard: usize) -> NewTask {
    let def = &schedule.def;
    let shards = schedule.spec.shard_count();
    let mut headers = def.headers.clone();
    if shards > 1 {
        headers.push((SHARD_HEADER.to_string(), shard.to_string()));
        headers.push((SHARD_COUNT_HEADER.to_string(), shards.to_string()));
    }
    NewTask {
        queue: def.queue.clone(),
        due_at_ms: fire_ms,
        payload: def.payload.clone(),
        payload_kind: def.payload_kind,
        headers,
        priority: def.priority,
        idempotency_key: Some(firing_key(&schedule.id, fire_ms, shard)),
        late_policy: def.late_policy,
    }
}

/// The idempotency key of one shard of one firing.
pub fn firing_key(id: &ScheduleId, fire_ms: UnixMs, shard: usize) -> String {
    format!("schedule:{id}:{fire_ms}:{shard}")
}

fn fire_time(spec: &ScheduleSpec, at_ms: UnixMs) -> FireTime {
    let local = match spec.trigger() {
        Trigger::Cron(cron) => cron.format_local(at_ms),
        Trigger::Every(_) => format_in_zone(&TimeZone::UTC, at_ms),
    };
    FireTime {
        at_ms,
        utc: format_utc(at_ms).unwrap_or_default(),
        local: local.unwrap_or_default(),
    }
}
