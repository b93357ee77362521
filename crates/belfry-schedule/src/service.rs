//! The schedule service: CRUD over stored schedules, and `tick`, which turns due firings into
//! tasks.
//!
//! The service holds no schedule state in memory: every call reads the store, so several
//! service instances over one store (stateless nodes) see the same schedules. It remembers
//! only when the schedules its last full tick read fire next (the [`Timetable`], kept in a
//! [`LastLook`]). Until [`ScheduleService::relook`] (which a server calls when another node
//! announces a change it cannot name) voids it, or [`FULL_TICK_MS`] passes, a tick reads
//! only the schedules the timetable says are due and those written since: a write through
//! the service, or one another node announces by id ([`ScheduleService::touched`]), touches
//! its schedule instead of voiding the timetable, so creating or changing schedules does not
//! make every node read all of them again. With nothing due or written a tick reads nothing:
//! idle schedules cost nothing a second whatever their number. Time is always passed in
//! (`now_ms`); the service never reads a clock.
//!
//! Exactly-once firings: `tick` first puts the firings' tasks, each with the idempotency key
//! `schedule:{id}:{fire_ms}:{shard}`, and only then persists the schedules' cursors. A crash
//! in between makes the next tick recompute the same fire times, and the store answers
//! `Duplicate` for the tasks it already has. A store may forget the key of a finished task,
//! so the server must run one `tick` at start-up before it dispatches or serves the API: then
//! no firing task can have finished between the crash and the replay.
//!
//! Cost: a tick puts the firings of all due schedules together, in batches of up to
//! [`FIRING_PUT_TASKS`] tasks (one durable write each), and writes all their cursors in one
//! `Store::write_meta`, one small record per cursor. Ten thousand per-second schedules are
//! then about eighty puts and one metadata write a second, not twenty thousand durable
//! writes.
//!
//! Several nodes: a tick fires only the schedules whose [`owner_key`] this node owns
//! (`Store::owns`); the others' owners fire them.
//!
//! Concurrency: the tick takes no lock. A cursor is its own record, and a schedule's
//! effective cursor is never below its `not_before_ms`, so a tick racing a replace or a resume
//! cannot fire the old definition's past; a tick racing a pause may fire that schedule once
//! more, as if the pause had come just after. API writes of one schedule are serialised by a
//! lock striped by id, so writes of different schedules go to the store together and share
//! its group commit.

use std::collections::HashMap;
use std::sync::Arc;

use belfry_core::schedule::{
    format_in_zone, format_utc, ScheduleSpec, TimeZone, Trigger, FIRE_TIME_HEADER, PREVIEW_MAX,
    SCHEDULE_HEADER, SHARD_COUNT_HEADER, SHARD_HEADER,
};
use belfry_core::{LastLook, NewTask, QueueName, Timetable, UnixMs, TIMETABLE_MAX};
use belfry_store::{MetaChange, PutOutcome, Store, StoreError};
use bytes::Bytes;
use parking_lot::Mutex;

use crate::model::{
    FireTime, InvalidSchedule, InvalidScheduleId, Schedule, ScheduleDef, ScheduleId,
};
use crate::record::{
    decode_cursor, decode_schedule, encode_schedule, StoredSchedule, CURSORS_NAMESPACE,
    SCHEDULES_NAMESPACE,
};

/// Most tasks a tick puts in one store call (the shards of one firing always go together,
/// so a firing of more shards is one call of its own). A put holds the embedded engine's
/// lock, which every queue's calls share, while it checks the idempotency keys and builds its
/// records: 1.3-3.1 ms for 1,000 firings on a 2-core machine, long enough to show in another
/// queue's lease p99 (issue #10). At this size a put holds it a few hundred microseconds
/// (`belfry-store/tests/engine_lock_perf.rs`: one-task claims of another queue beside puts
/// of 1,000 keyed tasks, p99.9 1.6 ms; beside puts of 128, 433 µs). The tick then makes
/// about 8 durable writes per 1,000 firings instead of 1, well within `schedules.lead`.
pub const FIRING_PUT_TASKS: usize = 128;

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
    #[error("storage failed: {0}")]
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

/// A tick reads every schedule at least this often even when nothing changed and nothing is
/// due: it bounds how long a change nobody announced goes unseen. Every write through a
/// single-process store goes through the service, and a shared store's periodic recheck
/// (every 5 s on Redis) voids the look sooner, so this is a backstop.
pub const FULL_TICK_MS: u64 = 300_000;

/// Touches the schedules it names in the last look when dropped: after the write it guards,
/// whether the write succeeded, failed or returned early. The next tick reads them again,
/// alone, instead of every schedule.
struct Touch<'a>(&'a LastLook<Arc<Mutex<Timetable>>>, Vec<String>);

impl Drop for Touch<'_> {
    fn drop(&mut self) {
        self.0.touch(std::mem::take(&mut self.1));
    }
}

/// Schedules a tick reads with one call of each of `Store::get_meta_many` at most.
pub(crate) const READ_KEYS: usize = 1_024;

/// Stripes of the write lock: enough that concurrent API writes of different schedules
/// rarely share one.
const WRITE_LOCK_STRIPES: usize = 64;

/// The write-lock stripe of `id`.
fn stripe(id: &ScheduleId) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(id.as_str(), &mut hasher);
    (std::hash::Hasher::finish(&hasher) % WRITE_LOCK_STRIPES as u64) as usize
}

/// One schedule to create: its id (`None`: generate one), definition and creation time.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub id: Option<ScheduleId>,
    pub def: ScheduleDef,
    pub now_ms: UnixMs,
}

/// The metadata a new schedule writes: its document, and the removal of any cursor a deleted
/// schedule of the same id left. (That cursor is at most its deletion time, before now, so
/// max(cursor, not_before) would ignore it, but it goes in the same write.)
fn creation_changes(schedule: &Schedule) -> [MetaChange; 2] {
    let bytes = encode_schedule(&StoredSchedule::from_schedule(schedule));
    [
        MetaChange::delete(CURSORS_NAMESPACE, schedule.id.as_str()),
        MetaChange::put(SCHEDULES_NAMESPACE, schedule.id.as_str(), bytes),
    ]
}

pub struct ScheduleService {
    pub(crate) store: Arc<dyn Store>,
    /// Serialise read-modify-write sequences of one schedule in this process (create's
    /// existence check, replace, pause/resume), striped by id. Other processes write other
    /// documents (see record.rs), so a process-local lock is enough.
    write_locks: Vec<Mutex<()>>,
    /// Parsed documents by id, with the bytes they came from: a scan re-parses only the
    /// documents that changed. Holds only ids seen by the last scan.
    parsed: Mutex<HashMap<String, (Bytes, Arc<Parsed>)>>,
    /// The timetable the last full tick left, while nothing says it may be out of date.
    pub(crate) last_look: LastLook<Arc<Mutex<Timetable>>>,
    /// Schedules a timetable holds at most.
    pub(crate) timetable_max: usize,
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
            write_locks: (0..WRITE_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            parsed: Mutex::new(HashMap::new()),
            last_look: LastLook::new(FULL_TICK_MS),
            timetable_max: TIMETABLE_MAX,
        }
    }

    /// A service whose timetable holds at most `timetable_max` schedules (at least 1), for
    /// tests of what happens past it.
    pub fn with_timetable_max(store: Arc<dyn Store>, timetable_max: usize) -> ScheduleService {
        ScheduleService {
            timetable_max: timetable_max.max(1),
            ..ScheduleService::new(store)
        }
    }

    /// Schedules or cursors were written other than through this service (another node
    /// announced a change, or an embedder wrote the store): the next tick reads them all.
    pub fn relook(&self) {
        self.last_look.changed();
    }

    /// The schedules at `keys` (their ids) were written other than through this service
    /// (another node announced which): the next tick reads those again, along with the due
    /// ones, instead of every schedule. Too many waiting make it a full tick.
    pub fn touched(&self, keys: impl IntoIterator<Item = String>) {
        self.last_look.touch(keys);
    }

    /// Creates a schedule under `id`, or a generated id. Nothing fires for fire times at or
    /// before `now_ms`.
    pub fn create(
        &self,
        id: Option<ScheduleId>,
        def: ScheduleDef,
        now_ms: UnixMs,
    ) -> Result<Schedule> {
        let mut answers = self.create_many(vec![NewSchedule { id, def, now_ms }]);
        answers.pop().unwrap_or_else(|| {
            Err(ScheduleServiceError::InvalidArgument(
                "create_many gave no answer".into(),
            ))
        })
    }

    /// Creates several schedules with one metadata write (one share of one fsync), each with
    /// its own answer, in order: one that is invalid, names a missing queue or an id that
    /// exists (or that an earlier one in `new` takes) fails alone. What a server uses to
    /// coalesce concurrent creates.
    pub fn create_many(&self, new: Vec<NewSchedule>) -> Vec<Result<Schedule>> {
        let mut answers: Vec<Option<Result<Schedule>>> = Vec::with_capacity(new.len());
        let mut valid = Vec::with_capacity(new.len());
        for (at, one) in new.into_iter().enumerate() {
            match self.prepare(one) {
                Ok(schedule) => {
                    answers.push(None);
                    valid.push((at, schedule));
                }
                Err(error) => answers.push(Some(Err(error))),
            }
        }
        // Every stripe this batch writes, taken in ascending order (so two batches cannot
        // deadlock), held from the existence checks to the write.
        let stripes: std::collections::BTreeSet<usize> =
            valid.iter().map(|(_, s)| stripe(&s.id)).collect();
        let _guards: Vec<_> = stripes
            .iter()
            .map(|&i| self.write_locks[i].lock())
            .collect();
        let mut ids = std::collections::HashSet::with_capacity(valid.len());
        let mut changes = Vec::with_capacity(2 * valid.len());
        let mut writing = Vec::with_capacity(valid.len());
        for (at, schedule) in valid {
            let taken = match self
                .store
                .get_meta(SCHEDULES_NAMESPACE, schedule.id.as_str())
            {
                Ok(found) => found.is_some() || !ids.insert(schedule.id.clone()),
                Err(error) => {
                    answers[at] = Some(Err(error.into()));
                    continue;
                }
            };
            if taken {
                answers[at] = Some(Err(ScheduleServiceError::AlreadyExists(schedule.id)));
                continue;
            }
            changes.extend(creation_changes(&schedule));
            writing.push((at, schedule));
        }
        if !writing.is_empty() {
            // Touched after the write, whatever its outcome (see `LastLook`).
            let ids = writing.iter().map(|(_, s)| s.id.to_string()).collect();
            let _touch = Touch(&self.last_look, ids);
            match self.store.write_meta(changes) {
                Ok(()) => {
                    for (at, schedule) in writing {
                        answers[at] = Some(Ok(schedule));
                    }
                }
                // The write is all or none; each create then tries alone for its own answer
                // (the error, a disk full say, is usually the same for all).
                Err(_) => {
                    for (at, schedule) in writing {
                        let written = self.store.write_meta(creation_changes(&schedule).into());
                        answers[at] = Some(written.map(|()| schedule).map_err(Into::into));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(ScheduleServiceError::InvalidArgument(
                        "a create was left unanswered".into(),
                    ))
                })
            })
            .collect()
    }

    /// Validates one create and builds its schedule (with a generated id if it has none).
    fn prepare(&self, new: NewSchedule) -> Result<Schedule> {
        let NewSchedule { id, def, now_ms } = new;
        let spec = def.to_spec(now_ms)?;
        self.check_queue(&def.queue)?;
        Ok(Schedule {
            id: id.unwrap_or_else(ScheduleId::generate),
            def,
            spec,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            not_before_ms: now_ms,
            cursor_ms: now_ms,
        })
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

    /// The stored schedules at `keys` with their effective cursors, in order (`None`: there
    /// is none under that key; an error: it is unreadable), read with one batch call per
    /// namespace. A store error fails them all.
    pub(crate) fn read_entries(&self, keys: &[&str]) -> Result<Vec<Result<Option<Entry>>>> {
        let documents = self.store.get_meta_many(SCHEDULES_NAMESPACE, keys)?;
        let cursors = self.store.get_meta_many(CURSORS_NAMESPACE, keys)?;
        Ok(keys
            .iter()
            .zip(documents.into_iter().zip(cursors))
            .map(|(key, (document, cursor))| {
                let Some(bytes) = document else {
                    return Ok(None);
                };
                let parsed = self.parse_cached(key, &bytes)?;
                let cursor_ms = effective_cursor(key, &parsed, cursor.as_deref())?;
                Ok(Some(Entry { parsed, cursor_ms }))
            })
            .collect())
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
        let _guard = self.lock(id);
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
        let _guard = self.lock(id);
        let existed = self
            .store
            .get_meta(SCHEDULES_NAMESPACE, id.as_str())?
            .is_some();
        let _touch = Touch(&self.last_look, vec![id.to_string()]);
        self.store.write_meta(vec![
            MetaChange::delete(SCHEDULES_NAMESPACE, id.as_str()),
            MetaChange::delete(CURSORS_NAMESPACE, id.as_str()),
        ])?;
        Ok(existed)
    }

    /// Fires the schedule once now, outside its timetable (a "run now"): its tasks, one per
    /// shard, are due at `now_ms` and carry the firing headers, with the idempotency key
    /// [`run_key`], so a repeat within the same millisecond is the same run. A paused or
    /// finished schedule runs too; its cursor and next fire time do not move. Answers the
    /// schedule and the put's outcomes, one per shard.
    pub fn run_now(&self, id: &ScheduleId, now_ms: UnixMs) -> Result<(Schedule, Vec<PutOutcome>)> {
        let Some(bytes) = self.store.get_meta(SCHEDULES_NAMESPACE, id.as_str())? else {
            return Err(ScheduleServiceError::NotFound(id.clone()));
        };
        let parsed = self.parse_cached(id.as_str(), &bytes)?;
        let tasks = (0..parsed.spec.shard_count() as usize)
            .map(|shard| NewTask {
                idempotency_key: Some(run_key(id, now_ms, shard)),
                ..firing_task(&parsed, now_ms, shard)
            })
            .collect();
        let outcomes = self.store.put(tasks).map_err(|error| match error {
            StoreError::QueueNotFound(queue) => ScheduleServiceError::QueueNotFound(queue),
            other => other.into(),
        })?;
        let cursor = self.store.get_meta(CURSORS_NAMESPACE, id.as_str())?;
        let cursor_ms = effective_cursor(id.as_str(), &parsed, cursor.as_deref())?;
        Ok((parsed.to_schedule(cursor_ms), outcomes))
    }

    /// Stops firing. Idempotent.
    pub fn pause(&self, id: &ScheduleId, now_ms: UnixMs) -> Result<Schedule> {
        let _guard = self.lock(id);
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
        let _guard = self.lock(id);
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

    fn lock(&self, id: &ScheduleId) -> parking_lot::MutexGuard<'_, ()> {
        self.write_locks[stripe(id)].lock()
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
        let _touch = Touch(&self.last_look, vec![schedule.id.to_string()]);
        self.store
            .put_meta(SCHEDULES_NAMESPACE, schedule.id.as_str(), bytes)?;
        Ok(())
    }

    /// Every stored schedule with its effective cursor, or why it cannot be read.
    pub(crate) fn scan(&self) -> Result<Vec<(String, Result<Entry>)>> {
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

/// One firing a tick gathered: a schedule and one of its fire times. Its shards' tasks are
/// built when it is put.
/// A decoded schedule document and the spec built from it.
pub(crate) struct Parsed {
    pub(crate) stored: StoredSchedule,
    pub(crate) spec: ScheduleSpec,
    /// [`owner_key`] of the schedule, made once.
    owner_key: String,
}

impl Parsed {
    pub(crate) fn owner_key(&self) -> &str {
        &self.owner_key
    }

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
pub(crate) struct Entry {
    pub(crate) parsed: Arc<Parsed>,
    pub(crate) cursor_ms: UnixMs,
}

impl Entry {
    pub(crate) fn next_fire_ms(&self) -> Option<UnixMs> {
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
    let owner_key = owner_key(&stored.id);
    Ok(Parsed {
        stored,
        spec,
        owner_key,
    })
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
pub(crate) fn firing_task(parsed: &Parsed, fire_ms: UnixMs, shard: usize) -> NewTask {
    let def = &parsed.stored.def;
    let shards = parsed.spec.shard_count();
    let mut headers = def.headers.clone();
    headers.push((SCHEDULE_HEADER.to_string(), parsed.stored.id.to_string()));
    headers.push((FIRE_TIME_HEADER.to_string(), fire_ms.to_string()));
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
        idempotency_key: Some(firing_key(&parsed.stored.id, fire_ms, shard)),
        late_policy: def.late_policy,
        target: def.target.clone(),
    }
}

/// The key by which nodes sharing a store split the schedules (`Store::owns`): the node that
/// owns it fires the schedule. Across a takeover both may fire one firing; its tasks'
/// idempotency keys ([`firing_key`]) make that one firing.
pub fn owner_key(id: &ScheduleId) -> String {
    format!("schedule:{id}")
}

/// The idempotency key of one shard of one firing.
pub fn firing_key(id: &ScheduleId, fire_ms: UnixMs, shard: usize) -> String {
    format!("schedule:{id}:{fire_ms}:{shard}")
}

/// The idempotency key of one shard of a run outside the timetable
/// ([`ScheduleService::run_now`]): never the key of a firing of the timetable.
pub fn run_key(id: &ScheduleId, at_ms: UnixMs, shard: usize) -> String {
    format!("schedule:{id}:run:{at_ms}:{shard}")
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
