//! Reminders in the server: the runner that fans reminders out at their time, and the feed's
//! caches. The routes are `api::reminders`; the builder composes both.
//!
//! Start-up order matters as for schedules: a fan-out step interrupted by a crash is
//! replayed by the next step, which finds the chunks already made by their idempotency keys,
//! but only while those chunks are unfinished. So the builder runs one step before the server
//! dispatches anything.
//!
//! The feed (`GET /v1/users/{user}/reminders`) follows the LINE seed's lessons: it ranks on
//! the per-user index and compact entries before it reads contents; contents come from a
//! bounded, short-lived cache ([`REMINDER_CACHE_TTL`]) that a `PATCH` or `DELETE` on this
//! node, a firing, or a change another node announces through the shared store, invalidates
//! at once; and when the server is overloaded (no store-call
//! slot within the API's wait) it answers from memory alone, urgent reminders only, says so
//! (`Belfry-Feed: degraded`) and counts it, instead of timing out.
//!
//! A feed the caches cannot answer reads the store on the request's own worker when the
//! store says such reads are quick (`Store::reads_are_quick`: the embedded engine), not
//! through tokio's blocking pool: the two thread wake-ups of that hand-off cost the server
//! more CPU than the read itself. When reads turn slow on average (the disk, not the page
//! cache, or a long-held lock: [`INLINE_READ_SLOW`]) they go to the pool until they are fast
//! again.
//!
//! The fan-out's steps run on a thread of their own at a lower CPU priority ([`FANOUT_NICE`]):
//! making millions of chunks is seconds of CPU with seconds of slack, while a feed read that
//! waits for a core behind it is late at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{UnixMs, UserId};
use belfry_reminders::feed::{self, FeedEntry};
use belfry_reminders::{Reminder, ReminderError, ReminderService, StepReport};
use metrics::{counter, gauge};
use quick_cache::sync::Cache;
use std::time::Instant;

use crate::low_priority::LowPriorityThread;
use crate::runner_plan::RunnerWake;
use crate::shared::{Caller, ServiceError, Shared};

/// The runner steps at least this often: wall-clock steps are noticed within this time.
/// A step reads the reminders only if something changed or is due, or
/// `belfry_reminders::FULL_LOOK_MS` passed; reminders created through other nodes are
/// announced by the store (`crate::follow`), and its periodic recheck bounds a lost
/// announcement.
pub const RUNNER_RECHECK_MS: u64 = 1_000;

/// How long a cached reminder, and a cached list of a user's subscriptions, are used before
/// they are read again. Writes through this server invalidate them at once, and so do writes
/// through another server when the shared store announces them (`crate::follow`); these bound
/// how stale a write through another server can look when it does not.
pub const REMINDER_CACHE_TTL: Duration = Duration::from_secs(5);
pub const USER_CACHE_TTL: Duration = Duration::from_secs(30);
/// Most reminders, and most users' subscription lists, held in the feed's caches.
pub const REMINDER_CACHE_MAX: usize = 100_000;
pub const USER_CACHE_MAX: usize = 200_000;
/// Feed store reads that take this long on average stall the other requests of their worker:
/// they go to the blocking pool until the average is under it again. Reads from the page
/// cache take tens of microseconds.
pub const INLINE_READ_SLOW: Duration = Duration::from_millis(1);
/// One read counts at most this much in the average (a stall of seconds would otherwise keep
/// reads off the workers long after it).
const INLINE_READ_SAMPLE_MAX_US: u64 = 50_000;

/// The nice value of the thread that runs fan-out steps (request threads run at 0). On a
/// machine with spare cores it changes nothing; on a busy one the fan-out gets about a tenth
/// of the CPU the request threads want and the rest when they are idle. Measured on 2 cores
/// with feeds read from 32 connections during a 10M fan-out: feeds 6.3–7.1k/s → 10.9–12.4k/s,
/// their p99.9 21–26 → 13–17 ms, the fan-out 5.5–6.9 → 8.5–11.7 s (BENCHMARKS.md, #13).
/// Nice 19 starved it: one run took 60 s, with feed p99.9 at 121 ms.
pub const FANOUT_NICE: i32 = 10;

pub const REMINDER_FANOUTS_STARTED: &str = "belfry_reminder_fanouts_started_total";
pub const REMINDER_FANOUTS_RUNNING: &str = "belfry_reminder_fanouts_running";
pub const REMINDER_CHUNKS_CREATED: &str = "belfry_reminder_chunks_created_total";
/// Chunks the running fan-outs planned and have not made yet (paced fan-outs make them as
/// they come due). Chunks made and not yet delivered are the queue's own pending tasks.
pub const REMINDER_CHUNKS_PENDING: &str = "belfry_reminder_chunks_pending";
pub const REMINDER_USERS_FANNED_OUT: &str = "belfry_reminder_users_fanned_out_total";
pub const REMINDER_STEP_ERRORS: &str = "belfry_reminder_step_errors_total";
/// Fan-outs dropped because their reminder's queue does not exist.
pub const REMINDER_FANOUTS_DROPPED: &str = "belfry_reminder_fanouts_dropped_total";
pub const REMINDER_SUBSCRIBERS: &str = "belfry_reminder_subscribers";
pub const FEED_REQUESTS: &str = "belfry_feed_requests_total";
pub const FEED_CACHE_HITS: &str = "belfry_feed_cache_hits_total";
pub const FEED_CACHE_MISSES: &str = "belfry_feed_cache_misses_total";
/// Times the feed's store reads became slow on average and moved off the workers.
pub const FEED_INLINE_READS_PAUSED: &str = "belfry_feed_inline_reads_paused_total";

/// What the reminder routes and the runner share.
pub struct RemindersState {
    pub(crate) service: ReminderService,
    pub(crate) shared: Arc<Shared>,
    /// Wakes the runner: a reminder written through this node wakes it only if it is due
    /// before the planned step (each step reads every reminder).
    runner: RunnerWake,
    /// uid → reminder, for the feed. Entries older than [`REMINDER_CACHE_TTL`] count as
    /// missing.
    reminders: Cache<u64, Arc<FeedReminder>>,
    /// user → the uids of their subscriptions, for the feed, with when they were read.
    users: Cache<UserId, Arc<UserSubscriptions>>,
    /// Whether the feed reads the store on its worker now.
    inline_reads: InlineReads,
    /// Where the fan-out's steps run.
    steps: LowPriorityThread,
    /// Reminders whose missing queue the log has named.
    warned_missing: crate::missing_queue::MissingQueueWarnings,
}

/// Whether a store read runs on the caller's worker: only if the store says its reads are
/// quick, and while the reads' moving average (over about the last 16, wherever they ran)
/// stays under [`INLINE_READ_SLOW`]. One cold read does not move it much; a page cache that
/// no longer holds the files does, and reads then go to the pool until they are fast again.
struct InlineReads {
    quick_store: bool,
    average_us: AtomicU64,
}

impl InlineReads {
    fn new(quick_store: bool) -> Self {
        InlineReads {
            quick_store,
            average_us: AtomicU64::new(0),
        }
    }

    fn allowed(&self) -> bool {
        self.quick_store && self.average_us.load(Ordering::Relaxed) < slow_us()
    }

    /// Adds a read's duration to the average. Returns whether that made reads slow (they
    /// were not before). Concurrent updates may lose one another's samples: an average of
    /// the others is as good.
    fn took(&self, read: Duration) -> bool {
        let sample = (read.as_micros() as u64).min(INLINE_READ_SAMPLE_MAX_US);
        let before = self.average_us.load(Ordering::Relaxed);
        let after = before - before / 16 + sample / 16;
        self.average_us.store(after, Ordering::Relaxed);
        before < slow_us() && after >= slow_us()
    }
}

fn slow_us() -> u64 {
    INLINE_READ_SLOW.as_micros() as u64
}

/// A reminder as the feed holds it: what it ranks on, and a slot for its rendered item and
/// that item's hash, which the API fills once (the service layer knows no JSON) and every
/// answer reuses.
pub struct FeedReminder {
    pub reminder: Reminder,
    pub entry: Option<FeedEntry>,
    pub rendered: std::sync::OnceLock<(Box<str>, u64)>,
    read_at: Instant,
}

impl FeedReminder {
    fn new(reminder: Reminder, read_at: Instant) -> Self {
        FeedReminder {
            entry: FeedEntry::of(&reminder),
            reminder,
            rendered: std::sync::OnceLock::new(),
            read_at,
        }
    }
}

/// A user's subscriptions as the feed caches them.
struct UserSubscriptions {
    uids: Vec<u64>,
    read_at: Instant,
}

/// One feed answer.
pub struct Feed {
    pub reminders: Vec<Arc<FeedReminder>>,
    /// Answered from memory alone (urgent reminders only) because the store was saturated.
    pub degraded: bool,
}

impl RemindersState {
    /// Makes the runner step now (a stored permit if it is busy, so no wake is lost).
    pub(crate) fn wake(&self) {
        self.runner.wake();
    }

    /// Tells the runner that a reminder written through this node is next due at `next_ms`
    /// (`None`: it will not fire again). The runner steps early only if that is before its
    /// planned step, so creating thousands of reminders due later costs no extra step.
    pub(crate) fn reminder_written(&self, next_ms: Option<UnixMs>) {
        self.runner.written(next_ms);
    }

    /// Forgets what the feed cached of a reminder (after a change on this node).
    pub(crate) fn forget_reminder(&self, uid: u64) {
        self.reminders.remove(&uid);
    }

    /// The cached reminder, unless it is older than its time to live.
    fn cached_reminder(&self, uid: u64, now: Instant) -> Option<Arc<FeedReminder>> {
        self.reminders
            .get(&uid)
            .filter(|r| now.duration_since(r.read_at) < REMINDER_CACHE_TTL)
    }

    /// The user's cached subscriptions, unless older than their time to live.
    fn cached_user(&self, user: &UserId, now: Instant) -> Option<Arc<UserSubscriptions>> {
        self.users
            .get(user)
            .filter(|u| now.duration_since(u.read_at) < USER_CACHE_TTL)
    }

    /// Forgets the cached subscription lists of `users` (after their subscriptions changed).
    pub(crate) fn forget_users<'a>(&self, users: impl IntoIterator<Item = &'a UserId>) {
        if self.users.is_empty() {
            return;
        }
        for user in users {
            self.users.remove(user);
        }
    }

    /// `user`'s reminders due within `within_ms`, urgent first then by due time, at most
    /// `limit`. When the user's subscriptions and their reminders are all cached the answer
    /// is built here, without a store call; otherwise the store is read through the API
    /// admission, and if that is saturated the answer is built from the caches alone.
    pub(crate) async fn feed(
        self: &Arc<Self>,
        user: UserId,
        within_ms: u64,
        limit: usize,
    ) -> Result<Feed, ServiceError> {
        let now_ms = self.shared.now_ms();
        if let Some(reminders) = self.feed_from_cache(&user, now_ms, within_ms, limit) {
            return Ok(Feed {
                reminders,
                degraded: false,
            });
        }
        // After an API store-call slot (a saturated store answers `Overloaded`, and the feed
        // degrades), on this worker while reads are quick, else on the blocking pool.
        let state = self.clone();
        let for_call = user.clone();
        let read = self
            .shared
            .delivery(Caller::Api, self.inline_reads.allowed(), move |_| {
                state.timed_read(&for_call, now_ms, within_ms, limit)
            })
            .await;
        match read {
            Ok(reminders) => Ok(Feed {
                reminders,
                degraded: false,
            }),
            Err(ServiceError::Overloaded) => Ok(Feed {
                reminders: self.feed_from_memory(&user, now_ms, within_ms, limit),
                degraded: true,
            }),
            Err(other) => Err(other),
        }
    }

    /// [`Self::feed_from_store`], its duration added to the reads' average.
    fn timed_read(
        &self,
        user: &UserId,
        now_ms: UnixMs,
        within_ms: u64,
        limit: usize,
    ) -> Result<Vec<Arc<FeedReminder>>, ServiceError> {
        let started = Instant::now();
        let read = self.feed_from_store(user, now_ms, within_ms, limit);
        if self.inline_reads.took(started.elapsed()) {
            counter!(FEED_INLINE_READS_PAUSED).increment(1);
        }
        read.map_err(service_error)
    }

    /// The whole answer from the caches, or `None` if anything it needs is not cached.
    fn feed_from_cache(
        &self,
        user: &UserId,
        now_ms: UnixMs,
        within_ms: u64,
        limit: usize,
    ) -> Option<Vec<Arc<FeedReminder>>> {
        let now = Instant::now();
        let user = self.cached_user(user, now)?;
        let mut known = Vec::with_capacity(user.uids.len());
        for &uid in &user.uids {
            known.push(self.cached_reminder(uid, now)?);
        }
        counter!(FEED_CACHE_HITS).increment(known.len() as u64 + 1);
        Some(pick(known, now_ms, within_ms, limit, false))
    }

    fn feed_from_store(
        &self,
        user: &UserId,
        now_ms: UnixMs,
        within_ms: u64,
        limit: usize,
    ) -> Result<Vec<Arc<FeedReminder>>, ReminderError> {
        let now = Instant::now();
        let subscriptions = match self.cached_user(user, now) {
            Some(subscriptions) => subscriptions,
            None => {
                counter!(FEED_CACHE_MISSES).increment(1);
                let read = Arc::new(UserSubscriptions {
                    uids: self.service.user_reminder_uids(user)?,
                    read_at: now,
                });
                self.users.insert(user.clone(), read.clone());
                read
            }
        };
        // What is cached, then one batched read of the rest.
        let mut known: Vec<Arc<FeedReminder>> = Vec::with_capacity(subscriptions.uids.len());
        let mut missing = Vec::new();
        for &uid in &subscriptions.uids {
            match self.cached_reminder(uid, now) {
                Some(r) => known.push(r),
                None => missing.push(uid),
            }
        }
        counter!(FEED_CACHE_HITS).increment(known.len() as u64);
        counter!(FEED_CACHE_MISSES).increment(missing.len() as u64);
        for reminder in self.service.by_uids(&missing)? {
            let cached = Arc::new(FeedReminder::new(reminder, now));
            self.reminders.insert(cached.reminder.uid, cached.clone());
            known.push(cached);
        }
        Ok(pick(known, now_ms, within_ms, limit, false))
    }

    fn feed_from_memory(
        &self,
        user: &UserId,
        now_ms: UnixMs,
        within_ms: u64,
        limit: usize,
    ) -> Vec<Arc<FeedReminder>> {
        // Stale entries are better than none here: the store cannot be asked.
        let Some(user) = self.users.get(user) else {
            return Vec::new();
        };
        let known = user
            .uids
            .iter()
            .filter_map(|uid| self.reminders.get(uid))
            .collect();
        pick(known, now_ms, within_ms, limit, true)
    }
}

/// Ranks on compact entries, keeping each chosen reminder with its entry (a user may have
/// thousands: no lookup per chosen one).
fn pick(
    reminders: Vec<Arc<FeedReminder>>,
    now_ms: UnixMs,
    within_ms: u64,
    limit: usize,
    urgent_only: bool,
) -> Vec<Arc<FeedReminder>> {
    let candidates: Vec<(FeedEntry, Arc<FeedReminder>)> = reminders
        .into_iter()
        .filter_map(|r| Some((r.entry?, r)))
        .filter(|(e, _)| e.urgent || !urgent_only)
        .collect();
    feed::select_by(candidates, |(e, _)| *e, now_ms, within_ms, limit)
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

pub(crate) fn service_error(e: ReminderError) -> ServiceError {
    match e {
        ReminderError::Store(store) => ServiceError::from(store),
        other => ServiceError::Invalid(other.to_string()),
    }
}

/// Reminders in the server: built by the builder, which runs `Reminders::step_at_startup`
/// before dispatching and spawns the runner.
#[derive(Clone)]
pub struct Reminders {
    state: Arc<RemindersState>,
}

impl Reminders {
    /// Fails only if the fan-out's thread cannot be started.
    pub(crate) fn new(shared: Arc<Shared>) -> std::io::Result<Self> {
        Ok(Reminders {
            state: Arc::new(RemindersState {
                service: ReminderService::new(shared.store.clone()),
                runner: RunnerWake::new(0, 1, RUNNER_RECHECK_MS),
                reminders: Cache::new(REMINDER_CACHE_MAX),
                users: Cache::new(USER_CACHE_MAX),
                inline_reads: InlineReads::new(shared.store.reads_are_quick()),
                steps: LowPriorityThread::start("belfry-fanout", FANOUT_NICE)?,
                warned_missing: Default::default(),
                shared,
            }),
        })
    }

    pub(crate) fn state(&self) -> Arc<RemindersState> {
        self.state.clone()
    }

    /// The reminder service, for embedders and tests.
    pub fn service(&self) -> &ReminderService {
        &self.state.service
    }

    /// Makes the runner step now: tests call this after moving a `ManualClock`.
    pub fn wake(&self) {
        self.state.wake();
    }

    /// Reminders or fan-outs changed on a node that shares the store: the runner's next step
    /// reads them all rather than answering from its last look.
    pub(crate) fn relook(&self) {
        self.state.service.relook();
    }

    /// These reminders (by their metadata keys, `uid_key`) were written on a node that shares
    /// the store (this one too): the feed forgets them, and the runner's next step reads
    /// them again instead of every reminder.
    pub(crate) fn touched(&self, keys: HashSet<String>) {
        for key in &keys {
            if let Some(uid) = belfry_reminders::parse_uid_key(key) {
                self.state.forget_reminder(uid);
            }
        }
        self.state.service.touched(keys);
    }

    /// Forgets the cached subscription lists of `users`, or of every user (`None`): their
    /// subscriptions changed on a node that shares the store (see `crate::follow`).
    pub(crate) fn forget_subscriptions(&self, users: Option<&HashSet<UserId>>) {
        match users {
            Some(users) => self.state.forget_users(users),
            None => self.state.users.clear(),
        }
    }

    /// Empties the feed's caches: reminders or subscriptions changed on another node that
    /// shares the store (see `crate::follow`), and the next feed reads them again.
    pub(crate) fn forget_cached(&self) {
        self.state.reminders.clear();
        self.state.users.clear();
    }

    pub(crate) async fn step_at_startup(&self) -> Result<StepReport, ServiceError> {
        let report = step(&self.state).await?;
        if report.chunks_found > 0 {
            tracing::info!(
                chunks = report.chunks_found,
                "reminders: an interrupted fan-out was resumed; its last chunks already existed"
            );
        }
        publish(&self.state, &report);
        Ok(report)
    }

    /// The runner; it stops when the server starts shutting down, after its current step.
    pub(crate) fn runner(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let state = self.state.clone();
        async move {
            let stop = state.shared.stopping.clone();
            while !stop.is_cancelled() {
                state.runner.begin_look();
                let next_ms = match step(&state).await {
                    Ok(report) => {
                        publish(&state, &report);
                        if report.again {
                            continue;
                        }
                        report.next_ms
                    }
                    Err(error) => {
                        counter!(REMINDER_STEP_ERRORS).increment(1);
                        tracing::warn!(%error, "fan out due reminders; retrying");
                        None
                    }
                };
                let now_ms = state.shared.now_ms();
                let wait_ms = state.runner.end_look(next_ms, now_ms);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                    _ = state.runner.notified() => {}
                    _ = stop.cancelled() => {}
                }
            }
        }
    }
}

/// One step on the fan-out's thread, after an internal store-call slot.
async fn step(state: &Arc<RemindersState>) -> Result<StepReport, ServiceError> {
    let now_ms = state.shared.now_ms();
    let permit = state.shared.calls.admit(Caller::Internal).await?;
    let for_step = state.clone();
    state
        .steps
        .run(move || {
            let _permit = permit;
            for_step.service.step(now_ms).map_err(service_error)
        })
        .await?
}

/// Metrics, logs, cache invalidation, and wake-ups for the queues that got chunks.
fn publish(state: &RemindersState, report: &StepReport) {
    for uid in &report.started {
        state.forget_reminder(*uid);
    }
    for (queue, chunks) in &report.chunks_by_queue {
        crate::metrics::submitted(queue, *chunks as usize);
        let runtime = belfry_core::QueueName::new(queue.as_str())
            .ok()
            .and_then(|name| state.shared.queues.get(&name));
        if let Some(runtime) = runtime {
            runtime.wake();
        }
    }
    counter!(REMINDER_FANOUTS_STARTED).increment(report.fanouts_started);
    counter!(REMINDER_CHUNKS_CREATED).increment(report.chunks_created);
    counter!(REMINDER_USERS_FANNED_OUT).increment(report.users_fanned_out);
    gauge!(REMINDER_FANOUTS_RUNNING).set(report.fanouts_running as f64);
    gauge!(REMINDER_CHUNKS_PENDING).set(report.chunks_pending as f64);
    gauge!(REMINDER_SUBSCRIBERS).set(report.subscribers as f64);
    for (reminder, reason) in &report.errors {
        tracing::warn!(%reminder, %reason, "fan out reminder");
    }
    if report.writes_not_owned > 0 {
        tracing::info!(writes = report.writes_not_owned, "this node lost reminders to another during a step (a pause past its leases?); their fan-outs are left to the new owner");
    }
    if report.fanouts_dropped > 0 {
        counter!(REMINDER_FANOUTS_DROPPED).increment(report.fanouts_dropped);
    }
    let exists = |queue: &str| crate::missing_queue::queue_exists(&state.shared, queue);
    for (reminder, queue) in state.warned_missing.fresh(&report.queues_missing, exists) {
        tracing::warn!(%reminder, %queue, "the reminder's queue does not exist; its firings are dropped until the queue is created again (said once per reminder; see belfry_reminder_fanouts_dropped_total)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_micros(40);

    #[test]
    fn reads_of_a_store_that_is_not_quick_never_run_on_the_worker() {
        let reads = InlineReads::new(false);
        for _ in 0..100 {
            reads.took(FAST);
        }
        assert!(!reads.allowed());
    }

    #[test]
    fn one_cold_read_keeps_reads_on_the_worker() {
        let reads = InlineReads::new(true);
        assert!(reads.allowed());
        for _ in 0..50 {
            reads.took(FAST);
        }
        assert!(!reads.took(Duration::from_millis(10)));
        assert!(reads.allowed());
    }

    /// Slow reads (a page cache that lost the files) move reads to the pool, once; they come
    /// back when reads are fast again, which reads on the pool show too.
    #[test]
    fn slow_reads_move_reads_off_the_worker_until_they_are_fast_again() {
        let reads = InlineReads::new(true);
        let slow = Duration::from_millis(3);
        let switched: usize = (0..40).map(|_| usize::from(reads.took(slow))).sum();
        assert_eq!(switched, 1, "the switch is counted once");
        assert!(!reads.allowed());
        let mut fast_reads = 0;
        while !reads.allowed() {
            reads.took(FAST);
            fast_reads += 1;
            assert!(
                fast_reads < 100,
                "fast reads did not bring the average down"
            );
        }
        assert!(
            fast_reads > 1,
            "one fast read does not undo a run of slow ones"
        );
    }

    /// A stall of seconds counts as at most 50 ms, so that reads return to the workers
    /// after a few dozen fast ones rather than thousands.
    #[test]
    fn a_long_stall_counts_as_a_bounded_sample() {
        let reads = InlineReads::new(true);
        reads.took(Duration::from_secs(30));
        assert!(!reads.allowed());
        let mut fast_reads = 0;
        while !reads.allowed() {
            reads.took(FAST);
            fast_reads += 1;
        }
        assert!(fast_reads < 40, "{fast_reads} fast reads to recover");
    }
}
