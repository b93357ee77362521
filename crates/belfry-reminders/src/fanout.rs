//! The fan-out: at a reminder's fire time, its subscribers are cut into chunks and each
//! chunk becomes one task in the reminder's queue, so it goes through that queue's sink, rate
//! limit, retries and dead letters like any task.
//!
//! **Chunks.** Chunk `k` holds the next `chunk_size` subscribers after the previous chunk's
//! last one (subscribers in [`UserId`] order). A chunk is made when the fan-out reaches it,
//! so an unsubscribe that arrives before then is honoured. Its body is
//! `{"reminder_id","content","users":[…],"chunk","chunks","firing","last"}`: `chunks` is the
//! plan when the fan-out started (subscribers then, over the chunk size) and `last` marks the
//! final chunk, which may differ from the plan when users came or went during the fan-out.
//!
//! **Pace.** Without `users_per_second`, every chunk is due at the firing. With it, chunk
//! `k` is due at `firing + users before k / rate`; chunks are made at most [`LEAD_MS`] before
//! they are due, and the queue delivers each at its due time, never early. The delivered rate
//! is then the configured one, whatever the chunk size. A fan-out that starts or resumes more
//! than [`LEAD_MS`] behind its pace (the server was down, or a one-shot was moved into the
//! past) counts the pace from then (`Fanout::paced_from_ms`): the rate is a promise to the
//! receiver, which a burst of the chunks it is behind on would break.
//!
//! **Crashes.** A step puts a batch of chunks (each with the idempotency key
//! `reminder:{id}:{uid}:{firing}:{chunk}`: the reminder's uid, new at each create, and its
//! count of firings, so no two firings share a key, even at the same instant), then writes
//! the fan-out's cursor. After a crash in between, the next step finds the batch's chunks
//! by key, takes their users as made, and goes on after them: no chunk is made twice and no
//! subscriber is skipped. The server runs a
//! step at start-up before it dispatches, so none of those chunks can have finished (and its
//! key been forgotten) in between.
//!
//! **Several nodes.** A step runs only the reminders whose [`owner_key`] this node owns
//! (`Store::owns`); the others' owners run them.

use std::collections::{BTreeMap, HashMap};

use belfry_core::{NewTask, Priority, UnixMs, UserId, UserPage};
use belfry_store::{MetaChange, PutOutcome, StoreError};
use bytes::Bytes;
use serde::{Serialize, Serializer};

use crate::model::{Reminder, Urgency};
use crate::quiet::{Plan, Recall, Tally};
use crate::record::{decode_fanout, encode_fanout, encode_reminder, uid_key, Fanout};
use crate::record::{FANOUTS_NAMESPACE, REMINDERS_NAMESPACE};
use crate::service::{ReminderError, ReminderService, Result};
use parking_lot::MutexGuard;

/// How long before its due time a paced chunk is made.
pub const LEAD_MS: u64 = 1_000;

/// Most chunks one put carries, and most bytes of chunk bodies.
const CHUNKS_PER_PUT: usize = 16;
const PUT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes per id a chunk's page is first sized for (a 20-digit number is 20; it grows if
/// the ids are longer).
const PAGE_ID_BYTES: usize = 12;

/// Most chunks one step makes for one reminder, so one huge fan-out cannot hold up the
/// others; the step says there is more (`again`).
const CHUNKS_PER_STEP: u32 = 256;

/// The key by which nodes sharing a store split the reminders (`Store::owns`): the node that
/// owns it runs the reminder's fan-out steps. Across a takeover both may run one step; the
/// chunks' idempotency keys ([`chunk_key`]) make each chunk once.
pub fn owner_key(id: &str) -> String {
    format!("reminder:{id}")
}

/// The idempotency key of chunk `chunk` of firing number `firing` (1 for the first) of the
/// reminder `id` whose uid is `uid`.
pub fn chunk_key(id: &str, uid: u64, firing: u64, chunk: u32) -> String {
    format!("reminder:{id}:{uid:016x}:{firing}:{chunk}")
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepReport {
    pub fanouts_started: u64,
    /// The uids of the reminders whose firing started (their next fire time moved).
    pub started: Vec<u64>,
    pub fanouts_finished: u64,
    /// Fan-outs still in progress after the step.
    pub fanouts_running: u64,
    /// Chunks the running fan-outs planned and have not made yet.
    pub chunks_pending: u64,
    /// Subscriptions of all reminders, as the step saw them.
    pub subscribers: u64,
    pub chunks_created: u64,
    pub users_fanned_out: u64,
    /// Chunks found already made (a replay after a crash).
    pub chunks_found: u64,
    /// Chunks made, by queue (to wake those queues).
    pub chunks_by_queue: BTreeMap<String, u64>,
    /// When a step next has work, if ever (a fire time, or a paced chunk's time).
    pub next_ms: Option<UnixMs>,
    /// Work is left that is due now: step again at once.
    pub again: bool,
    /// Reminders that could not be handled: (id, reason). The others still ran.
    pub errors: Vec<(String, String)>,
    /// Fan-outs ended without their chunks because their queue does not exist.
    pub fanouts_dropped: u64,
    /// Writes not made because this node lost the reminder's lease during the step (a pause
    /// past the lease): the new owner goes on with the fan-out.
    pub writes_not_owned: u64,
    /// Those reminders and their queues: (id, queue).
    pub queues_missing: Vec<(String, String)>,
}

impl StepReport {
    fn note_next(&mut self, at: UnixMs) {
        self.next_ms = Some(self.next_ms.map_or(at, |n| n.min(at)));
    }

    /// Counts a fan-out this step leaves running, and the chunks it has still to make.
    fn still_running(&mut self, f: &Fanout) {
        self.fanouts_running += 1;
        self.chunks_pending += u64::from(f.chunks.saturating_sub(f.chunk));
    }
}

#[derive(Serialize)]
struct ChunkBody<'a> {
    reminder_id: &'a str,
    content: &'a serde_json::value::RawValue,
    #[serde(serialize_with = "page_ids")]
    users: &'a UserPage,
    chunk: u32,
    chunks: u32,
    firing: UnixMs,
    last: bool,
}

fn page_ids<S: Serializer>(
    page: &&UserPage,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serializer.collect_seq(page.iter())
}

/// Room for a chunk body: the ids' text, their quotes and commas, and the rest (ids rarely
/// need escapes; the buffer grows if they do).
fn body_capacity(r: &Reminder, content: &str, users: &UserPage) -> usize {
    256 + r.id.as_str().len() + content.len() + users.text_len() + 3 * users.len()
}

/// A chunk ready to put.
struct Made {
    task: NewTask,
    users: u64,
    last_user: UserId,
    last: bool,
}

/// What a step left of one reminder.
enum Left {
    /// Its fan-out goes on.
    Running,
    /// No fan-out running; it fires next then, if ever.
    Idle(Option<UnixMs>),
}

impl ReminderService {
    /// Starts the fan-outs that are due and advances those in progress; a reminder that
    /// cannot be read or handled is reported and the others still run.
    ///
    /// Only a full look reads every reminder (one listing each of the reminders and of the
    /// fan-outs in progress). Until a change is announced, the steps after it read only the
    /// fan-outs it left running and the reminders its timetable says are due, and nothing
    /// when there are none (`quiet.rs`).
    pub fn step(&self, now_ms: UnixMs) -> Result<StepReport> {
        let shared = match self.looks.recall(now_ms) {
            Recall::Quiet(report) => return Ok(report),
            Recall::Focus(plan) => plan,
            Recall::Full => {
                let start = self.looks.begin_full();
                let mut tally = Tally::default();
                let report = self.full_step(now_ms, &mut tally);
                self.looks
                    .end_full(start, now_ms, report.as_ref().ok().map(|r| (r, tally)));
                return report;
            }
        };
        let mut plan = shared.lock();
        let mut tally = Tally::default();
        let report = self.focused_step(&mut plan, now_ms, &mut tally);
        let kept = plan.keep(tally);
        if !kept || !report.as_ref().is_ok_and(|r| r.errors.is_empty()) {
            self.looks.forget();
        }
        let mut report = report?;
        if let Some(next) = plan.next_ms() {
            report.note_next(next);
        }
        Ok(report)
    }

    fn full_step(&self, now_ms: UnixMs, tally: &mut Tally) -> Result<StepReport> {
        let mut report = StepReport::default();
        let mut fanouts: HashMap<String, Bytes> = self
            .store
            .list_meta(FANOUTS_NAMESPACE)?
            .into_iter()
            .collect();
        let listed = self.store.list_meta(REMINDERS_NAMESPACE)?;
        let mut uids = Vec::with_capacity(listed.len());
        for (key, bytes) in listed {
            let reminder = match crate::service::decode(&key, &bytes) {
                Ok(reminder) => reminder,
                Err(e) => {
                    report.errors.push((key, e.to_string()));
                    continue;
                }
            };
            uids.push(reminder.uid);
            // With several nodes on one store, one of them fans each reminder out, writing
            // under the lease seen here ([`FanoutRunner::holds`]).
            let Some(lease) = self.store.ownership(&owner_key(reminder.id.as_str())) else {
                continue;
            };
            let fanout = fanouts.remove(&key);
            let owned = (reminder, lease);
            self.step_tracked(key, owned, fanout, now_ms, &mut report, tally);
        }
        // The gauge, in one call (a networked store's round trip each was most of a look).
        report.subscribers = self
            .store
            .subscriber_counts(&uids)
            .map_or(0, |counts| counts.iter().sum());
        Ok(report)
    }

    /// A step of the fan-outs the last full look left running, of the reminders its
    /// timetable says are due and of those touched since, reading only those.
    fn focused_step(
        &self,
        plan: &mut MutexGuard<'_, Plan>,
        now_ms: UnixMs,
        tally: &mut Tally,
    ) -> Result<StepReport> {
        let mut report = StepReport {
            subscribers: self.looks.subscribers(plan),
            ..StepReport::default()
        };
        for key in self.looks.take_keys(plan, now_ms) {
            // Gone: deleted, which announces itself, or by another node, which a relook does.
            let Some(bytes) = self.store.get_meta(REMINDERS_NAMESPACE, &key)? else {
                continue;
            };
            let reminder = match crate::service::decode(&key, &bytes) {
                Ok(reminder) => reminder,
                Err(e) => {
                    report.errors.push((key, e.to_string()));
                    continue;
                }
            };
            let Some(lease) = self.store.ownership(&owner_key(reminder.id.as_str())) else {
                continue;
            };
            let fanout = self.store.get_meta(FANOUTS_NAMESPACE, &key)?;
            let owned = (reminder, lease);
            self.step_tracked(key, owned, fanout, now_ms, &mut report, tally);
        }
        Ok(report)
    }

    /// Steps one reminder and tallies what it left.
    fn step_tracked(
        &self,
        key: String,
        (reminder, lease): (Reminder, String),
        fanout: Option<Bytes>,
        now_ms: UnixMs,
        report: &mut StepReport,
        tally: &mut Tally,
    ) {
        let id = reminder.id.to_string();
        match self.step_one(reminder, &lease, fanout, now_ms, report) {
            Ok(Left::Running) => tally.running(key),
            Ok(Left::Idle(next)) => {
                if let Some(next) = next {
                    report.note_next(next);
                }
                tally.idle(key, next);
            }
            Err(e) => report.errors.push((id, e.to_string())),
        }
    }

    fn step_one(
        &self,
        mut r: Reminder,
        lease: &str,
        stored: Option<Bytes>,
        now_ms: UnixMs,
        report: &mut StepReport,
    ) -> Result<Left> {
        let mut fanout =
            match stored {
                Some(bytes) => Some(decode_fanout(&bytes).map_err(|e| {
                    crate::service::ReminderError::Corrupt {
                        key: uid_key(r.uid),
                        detail: e.0,
                    }
                })?),
                None => None,
            };
        if fanout.is_none() {
            match r.next_fire_ms {
                Some(at) if at <= now_ms => {
                    fanout = self.start(&mut r, lease, at, now_ms, report)?
                }
                Some(at) => report.note_next(at),
                None => {}
            }
        }
        if let Some(fanout) = fanout {
            match self.advance(&r, lease, fanout, now_ms, report) {
                Ok(true) => return Ok(Left::Running),
                Ok(false) => {}
                Err(ReminderError::Store(StoreError::QueueNotFound(_))) => {
                    if self.holds(&r, lease, report) {
                        self.drop_fanout(&r, report)?
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Left::Idle(r.next_fire_ms))
    }

    /// Starts the firing due at `due_ms`: plans the chunks and moves the reminder to its
    /// next fire time. A recurring reminder that missed fire times fires once for all of
    /// them, as the latest (its chunk bodies' `firing`).
    fn start(
        &self,
        r: &mut Reminder,
        lease: &str,
        due_ms: UnixMs,
        now_ms: UnixMs,
        report: &mut StepReport,
    ) -> Result<Option<Fanout>> {
        let firing_ms = r.def.when.latest_fire(due_ms, now_ms)?;
        let count = self.store.subscriber_count(r.uid)?;
        if !self.holds(r, lease, report) {
            return Ok(None);
        }
        let chunks = count.div_ceil(u64::from(r.def.chunk_size));
        r.next_fire_ms = r.def.when.next_after(now_ms.max(firing_ms))?;
        if r.def.when.is_recurring() {
            if let Some(next) = r.next_fire_ms {
                report.note_next(next);
            }
        } else {
            r.next_fire_ms = None;
        }
        r.firings += 1;
        let key = uid_key(r.uid);
        let mut changes = vec![MetaChange::put(
            REMINDERS_NAMESPACE,
            &key,
            encode_reminder(r),
        )];
        report.fanouts_started += 1;
        report.started.push(r.uid);
        let fanout = (chunks > 0).then(|| Fanout {
            firing_ms,
            chunk: 0,
            chunks: u32::try_from(chunks).unwrap_or(u32::MAX),
            after: None,
            users: 0,
            paced_from_ms: None,
        });
        match &fanout {
            Some(f) => changes.push(MetaChange::put(FANOUTS_NAMESPACE, &key, encode_fanout(f))),
            None => report.fanouts_finished += 1,
        }
        self.store.write_meta(changes)?;
        Ok(fanout)
    }

    /// Makes the chunks that are due (or within the lead of it), in batches: put, then the
    /// cursor. Answers whether the fan-out goes on.
    fn advance(
        &self,
        r: &Reminder,
        lease: &str,
        mut f: Fanout,
        now_ms: UnixMs,
        report: &mut StepReport,
    ) -> Result<bool> {
        let key = uid_key(r.uid);
        let mut made_this_step = 0;
        // Only the first batch after a step begins can have been put already.
        let mut check_existing = true;
        loop {
            if made_this_step >= CHUNKS_PER_STEP {
                report.still_running(&f);
                report.again = true;
                return Ok(true);
            }
            let mut cursor = f.clone();
            let (batch, finished) =
                self.fill_batch(r, &mut cursor, now_ms, check_existing, report)?;
            check_existing = false;
            let progressed = !batch.is_empty() || cursor != f;
            // Every write of the step is made under the lease it began with: a node paused
            // past it stops here, and the new owner's progress stands.
            if !self.holds(r, lease, report) {
                return Ok(true);
            }
            if !batch.is_empty() {
                made_this_step += self.put_batch(r, batch, report)?;
            }
            if finished {
                // Checked again: the puts may have taken long, and a stale delete would end
                // the new owner's fan-out record under it.
                if !self.holds(r, lease, report) {
                    return Ok(true);
                }
                self.store.delete_meta(FANOUTS_NAMESPACE, &key)?;
                report.fanouts_finished += 1;
                return Ok(false);
            }
            if !progressed {
                report.still_running(&f);
                return Ok(true);
            }
            if !self.holds(r, lease, report) {
                return Ok(true);
            }
            self.store
                .put_meta(FANOUTS_NAMESPACE, &key, encode_fanout(&cursor))?;
            f = cursor;
        }
    }

    /// The chunks due from `cursor` on, up to one put's worth, moving `cursor` past each.
    /// With `check_existing`, chunks an interrupted step already put are found and skipped
    /// first. Answers the chunks made and whether the fan-out's last chunk was reached.
    fn fill_batch(
        &self,
        r: &Reminder,
        cursor: &mut Fanout,
        now_ms: UnixMs,
        mut check_existing: bool,
        report: &mut StepReport,
    ) -> Result<(Vec<Made>, bool)> {
        let mut batch: Vec<Made> = Vec::new();
        let mut bytes = 0;
        while batch.len() < CHUNKS_PER_PUT && bytes < PUT_BYTES_MAX {
            let due = self.chunk_due(r, cursor, now_ms);
            if due > now_ms + LEAD_MS {
                report.note_next(due - LEAD_MS);
                break;
            }
            if check_existing {
                if let Some(found) = self.made_before(r, cursor, now_ms)? {
                    report.chunks_found += 1;
                    cursor.chunk += 1;
                    cursor.users += found.users;
                    cursor.after = Some(found.last_user);
                    if found.last {
                        return Ok((batch, true));
                    }
                    continue;
                }
                check_existing = false;
            }
            let Some(made) = self.make_chunk(r, cursor, due)? else {
                return Ok((batch, true));
            };
            bytes += made.task.payload.len();
            cursor.chunk += 1;
            cursor.users += made.users;
            cursor.after = Some(made.last_user.clone());
            let last = made.last;
            batch.push(made);
            if last {
                return Ok((batch, true));
            }
        }
        Ok((batch, false))
    }

    /// Puts a batch of chunks (a chunk put before is a duplicate, counted as found), and
    /// answers how many it held.
    fn put_batch(&self, r: &Reminder, batch: Vec<Made>, report: &mut StepReport) -> Result<u32> {
        let queue = r.def.queue.as_str().to_owned();
        let n = batch.len() as u64;
        let users: Vec<u64> = batch.iter().map(|m| m.users).collect();
        let outcomes = self
            .store
            .put(batch.into_iter().map(|m| m.task).collect())?;
        let mut duplicates = 0;
        for (outcome, users) in outcomes.iter().zip(users) {
            match outcome {
                PutOutcome::Duplicate(_) => duplicates += 1,
                PutOutcome::Created { .. } => report.users_fanned_out += users,
            }
        }
        report.chunks_found += duplicates;
        report.chunks_created += n - duplicates;
        *report.chunks_by_queue.entry(queue).or_default() += n - duplicates;
        Ok(n as u32)
    }

    /// Ends a fan-out whose queue is gone: its chunks cannot exist. Counted and reported
    /// once per step, like a schedule's dropped firings; a recurring reminder fires again at
    /// its next fire time (to nothing, until the queue is back).
    /// Whether this node still owns `r` under `lease`, the lease it took the step up under.
    /// A node paused past its lease (`SIGSTOP`, a VM pause) lost the reminder to another node,
    /// which went on with the fan-out; once the chunks' idempotency keys are forgotten, the
    /// paused node's puts would make those chunks again, and its stale cursor would bring back
    /// a fan-out the new owner had finished. So each write checks first; a refusal is counted.
    fn holds(&self, r: &Reminder, lease: &str, report: &mut StepReport) -> bool {
        let held = self.store.ownership(&owner_key(r.id.as_str())).as_deref() == Some(lease);
        if !held {
            report.writes_not_owned += 1;
        }
        held
    }

    fn drop_fanout(&self, r: &Reminder, report: &mut StepReport) -> Result<()> {
        self.store.delete_meta(FANOUTS_NAMESPACE, &uid_key(r.uid))?;
        report.fanouts_dropped += 1;
        report
            .queues_missing
            .push((r.id.to_string(), r.def.queue.to_string()));
        Ok(())
    }

    /// When the chunk at `cursor` is due: the firing (or where the pace was counted from
    /// since), plus the users before it at the pace. A chunk more than [`LEAD_MS`] behind its
    /// pace is due now, and the pace counts from it: `cursor` keeps that.
    fn chunk_due(&self, r: &Reminder, cursor: &mut Fanout, now_ms: UnixMs) -> UnixMs {
        let Some(rate) = r.def.users_per_second else {
            return cursor.firing_ms;
        };
        let offset = cursor.users * 1000 / u64::from(rate);
        let from = cursor.paced_from_ms.unwrap_or(cursor.firing_ms);
        let due = from.saturating_add(offset);
        if due.saturating_add(LEAD_MS) < now_ms {
            cursor.paced_from_ms = Some(now_ms.saturating_sub(offset));
            return now_ms;
        }
        due
    }

    /// The chunk at `cursor`, if an earlier step put it (and the crash lost its cursor).
    fn made_before(&self, r: &Reminder, cursor: &Fanout, now_ms: UnixMs) -> Result<Option<Made>> {
        let key = chunk_key(r.id.as_str(), r.uid, r.firings, cursor.chunk);
        let Some(task) = self.store.get_by_key(&r.def.queue, &key, now_ms)? else {
            return Ok(None);
        };
        #[derive(serde::Deserialize)]
        struct Users {
            users: Vec<String>,
            last: bool,
        }
        let Ok(body) = serde_json::from_slice::<Users>(&task.payload) else {
            return Ok(None);
        };
        let Some(last_user) = body.users.last().and_then(|u| UserId::new(u).ok()) else {
            return Ok(None);
        };
        Ok(Some(Made {
            task: NewTask::new(r.def.queue.clone(), task.due_at_ms, Bytes::new()),
            users: body.users.len() as u64,
            last_user,
            last: body.last,
        }))
    }

    /// Reads the chunk's users and builds its task; `None` when no subscriber is left.
    fn make_chunk(&self, r: &Reminder, cursor: &Fanout, due_ms: UnixMs) -> Result<Option<Made>> {
        let size = r.def.chunk_size as usize;
        // One more than the chunk holds: whether anyone follows says if this is the last. The
        // page is one buffer, not an allocation per user: a fan-out reads millions of them on
        // a thread that shares the allocator with the request workers.
        let mut users = UserPage::with_capacity(size + 1, (size + 1) * PAGE_ID_BYTES);
        self.store
            .subscriber_page(r.uid, cursor.after.as_ref(), size + 1, &mut users)?;
        let last = users.len() <= size;
        users.truncate(size);
        let Some(last_user) = users.last_id() else {
            return Ok(None);
        };
        let content = serde_json::value::RawValue::from_string(
            String::from_utf8_lossy(&r.def.content).into_owned(),
        )
        .map_err(|e| crate::service::ReminderError::InvalidArgument(e.to_string()))?;
        let body = ChunkBody {
            reminder_id: r.id.as_str(),
            content: &content,
            users: &users,
            chunk: cursor.chunk,
            chunks: cursor.chunks.max(cursor.chunk + 1),
            firing: cursor.firing_ms,
            last,
        };
        let mut payload = Vec::with_capacity(body_capacity(r, content.get(), &users));
        serde_json::to_writer(&mut payload, &body).expect("a chunk body always serialises");
        let mut task = NewTask::new(r.def.queue.clone(), due_ms, payload);
        task.idempotency_key = Some(chunk_key(r.id.as_str(), r.uid, r.firings, cursor.chunk));
        task.priority = match r.def.urgency {
            Urgency::Urgent => Priority::High,
            Urgency::Normal => Priority::Normal,
        };
        Ok(Some(Made {
            task,
            users: users.len() as u64,
            last_user,
            last,
        }))
    }
}
