//! The tick: turning due firings into tasks, cheaply when nothing is due (see the crate's
//! service module for the design: exactly-once firings, the timetable, ownership).

use std::collections::BTreeMap;
use std::sync::Arc;

use belfry_core::limits::BATCH_TASKS_MAX;
use belfry_core::{NewTask, Timetable, UnixMs};
use belfry_store::{MetaChange, PutOutcome, StoreError};
use parking_lot::Mutex;

use crate::firings::{self, Firing, Firings, Lease};
use crate::record::{encode_cursor, CURSORS_NAMESPACE};
use crate::service::{firing_task, Entry, Result, ScheduleService, FIRING_PUT_TASKS, READ_KEYS};

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
    /// Tasks stored by this tick, by queue name (submitted to that queue, for its metrics).
    pub tasks_by_queue: BTreeMap<String, u64>,
    /// Tasks the store already had (a replay after a crash between put and cursor persist).
    pub tasks_duplicate: u64,
    /// Firings not stored because this node lost their schedule's lease between deciding to
    /// fire and writing (a pause past the lease): their new owner fires them.
    pub firings_not_owned: u64,
    /// Schedules whose due set included missed fire times.
    pub schedules_misfired: usize,
    /// Due fire times dropped by the misfire policy or because the queue no longer exists.
    pub firings_dropped: u64,
    /// Schedules that could not be handled: (schedule id, reason). The others still ran.
    pub errors: Vec<(String, String)>,
    /// Schedules whose queue no longer exists: (schedule id, queue). Their firings were
    /// dropped (counted in `firings_dropped`).
    pub queues_missing: Vec<(String, String)>,
    /// The earliest future fire time among the active schedules after this tick (what
    /// `next_tick_ms` would answer, without a second scan), or `None` if none will fire.
    pub next_tick_ms: Option<UnixMs>,
}

impl TickReport {
    /// Nothing went wrong that the next tick should look at afresh: no unreadable schedule
    /// and no schedule whose queue is gone.
    pub(crate) fn clean(&self) -> bool {
        self.errors.is_empty() && self.queues_missing.is_empty()
    }

    pub(crate) fn note_next(&mut self, next: UnixMs) {
        self.next_tick_ms = Some(self.next_tick_ms.map_or(next, |n| n.min(next)));
    }
}

impl ScheduleService {
    /// Creates the firings due at `now_ms` for every active schedule and advances their
    /// cursors. A schedule that fails (unreadable) is reported and skipped; a storage error
    /// ends the tick (nothing is lost: the next tick redoes the unfinished schedules).
    pub fn tick(&self, now_ms: UnixMs) -> Result<TickReport> {
        self.tick_until(now_ms, now_ms)
    }

    /// [`ScheduleService::tick`] that also creates the firings due up to `until_ms` (at or
    /// after `now_ms`): their tasks are due at their fire times, so they are delivered no
    /// earlier, but they are stored before then instead of from that moment on. Misfires
    /// are judged against `now_ms`. The report's `next_tick_ms` is the next fire time after
    /// `until_ms`.
    ///
    /// A tick after a full one reads only the schedules its timetable says are due by
    /// `until_ms` (none while nothing is), until a write is announced, `until_ms` reaches a
    /// schedule the timetable had no room for, or [`FULL_TICK_MS`] passes.
    pub fn tick_until(&self, now_ms: UnixMs, until_ms: UnixMs) -> Result<TickReport> {
        let until_ms = until_ms.max(now_ms);
        if let Some(timetable) = self.last_look.recall(now_ms) {
            let mut timetable = timetable.lock();
            if timetable.covers(until_ms) {
                if !timetable.has_due(until_ms) && !self.last_look.has_touched() {
                    return Ok(TickReport {
                        next_tick_ms: timetable.next_ms(),
                        ..TickReport::default()
                    });
                }
                return self.due_tick(&mut timetable, now_ms, until_ms);
            }
        }
        let start = self.last_look.begin();
        let mut next_times = Vec::new();
        let report = match self.full_tick(now_ms, until_ms, &mut next_times) {
            Ok(report) => report,
            Err(error) => {
                self.last_look.end(start, now_ms, None);
                return Err(error);
            }
        };
        let timetable = report
            .clean()
            .then(|| Arc::new(Mutex::new(Timetable::new(self.timetable_max, next_times))));
        self.last_look.end(start, now_ms, timetable);
        Ok(report)
    }

    /// Reads every schedule and fires the due ones; `next_times` gets each active schedule's
    /// next fire time after this tick, for the timetable.
    fn full_tick(
        &self,
        now_ms: UnixMs,
        until_ms: UnixMs,
        next_times: &mut Vec<(UnixMs, Box<str>)>,
    ) -> Result<TickReport> {
        let mut report = TickReport::default();
        let mut firings = Firings::default();
        for (key, entry) in self.scan()? {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    report.errors.push((key, error.to_string()));
                    continue;
                }
            };
            let window = (now_ms, until_ms);
            if let Some(next) = self.tick_entry(&entry, window, &mut firings, &mut report)? {
                next_times.push((next, key.into_boxed_str()));
            }
        }
        self.finish_tick(firings, &mut report)?;
        Ok(report)
    }

    /// Fires the schedules of `timetable` due by `until_ms` and those touched since the look,
    /// reading only those, and puts each back at its next fire time. A failed or unclean
    /// tick voids the timetable (the next tick is a full one).
    fn due_tick(
        &self,
        timetable: &mut Timetable,
        now_ms: UnixMs,
        until_ms: UnixMs,
    ) -> Result<TickReport> {
        let mut report = TickReport::default();
        let mut firings = Firings::default();
        let mut next_times = Vec::new();
        let due = timetable.take_due(until_ms);
        let mut keys: Vec<&str> = due.iter().map(|k| &**k).collect();
        let mut touched = Vec::new();
        self.last_look.take_touched(&mut touched);
        if !touched.is_empty() {
            // Out of the timetable until read again (a deleted or paused one stays out), and
            // read once if it is also due.
            let mut seen: std::collections::HashSet<&str> = keys.iter().copied().collect();
            for key in &touched {
                timetable.forget(key);
                if seen.insert(key) {
                    keys.push(key);
                }
            }
        }
        let ticked = (|| {
            for chunk in keys.chunks(READ_KEYS) {
                for (key, entry) in chunk.iter().zip(self.read_entries(chunk)?) {
                    let entry = match entry {
                        Ok(Some(entry)) => entry,
                        // Deleted (by another node, which announces it): nothing to fire.
                        Ok(None) => continue,
                        Err(error) => {
                            report.errors.push((key.to_string(), error.to_string()));
                            continue;
                        }
                    };
                    let window = (now_ms, until_ms);
                    if let Some(next) =
                        self.tick_entry(&entry, window, &mut firings, &mut report)?
                    {
                        next_times.push((Box::<str>::from(*key), next));
                    }
                }
            }
            self.finish_tick(firings, &mut report)
        })();
        for (key, next) in next_times {
            timetable.put(key, next);
        }
        if ticked.is_err() || !report.clean() {
            self.last_look.forget();
        }
        ticked?;
        report.next_tick_ms = timetable.next_ms();
        Ok(report)
    }

    /// What a tick does with one schedule: nothing if another node owns it, or it is paused
    /// or finished; otherwise it gathers the firings due by the window's end into `firings`.
    /// Returns the schedule's next fire time after this tick (`None`: it will not fire, or
    /// is not this node's).
    fn tick_entry(
        &self,
        entry: &Entry,
        (now_ms, until_ms): (UnixMs, UnixMs),
        firings: &mut Firings,
        report: &mut TickReport,
    ) -> Result<Option<UnixMs>> {
        // With several nodes on one store, one of them fires each schedule; its writes are
        // made under the lease seen here (`firings.rs`).
        let Some(lease) = self.store.ownership(entry.parsed.owner_key()) else {
            return Ok(None);
        };
        let Some(next) = entry.next_fire_ms() else {
            return Ok(None);
        };
        if next > until_ms {
            report.note_next(next);
            return Ok(Some(next));
        }
        let (stored, spec) = (&entry.parsed.stored, &entry.parsed.spec);
        let due = spec.due_until(entry.cursor_ms, now_ms, until_ms);
        if due.cursor_ms == entry.cursor_ms {
            return Ok(Some(next));
        }
        report.schedules_due += 1;
        report.schedules_misfired += usize::from(due.misfired);
        report.firings_dropped += due.dropped;
        let lease: Lease = lease.into();
        for &fire_ms in &due.fire_times {
            firings.add(&entry.parsed, fire_ms, &lease);
            if firings.tasks >= BATCH_TASKS_MAX {
                self.put_firings(firings, report)?;
            }
        }
        firings.cursors.push((
            entry.parsed.clone(),
            lease,
            MetaChange::put(
                CURSORS_NAMESPACE,
                stored.id.as_str(),
                encode_cursor(due.cursor_ms),
            ),
        ));
        let after = spec.next_after(due.cursor_ms);
        if let Some(after) = after {
            report.note_next(after);
        }
        Ok(after)
    }

    /// Puts what is left of a tick's firings, then writes their cursors.
    fn finish_tick(&self, mut firings: Firings, report: &mut TickReport) -> Result<()> {
        self.put_firings(&mut firings, report)?;
        // Only once every firing is stored: a crash before this replays them as duplicates.
        let cursors = firings.owned_cursors(&*self.store);
        if !cursors.is_empty() {
            self.store.write_meta(cursors)?;
        }
        Ok(())
    }

    /// Puts the firings gathered so far, in batches of at most [`FIRING_PUT_TASKS`] tasks
    /// (the shards of one firing always together). Firings into a queue that no longer exists are
    /// dropped and reported, and the rest are put without them.
    fn put_firings(&self, firings: &mut Firings, report: &mut TickReport) -> Result<()> {
        firings.tasks = 0;
        let mut batch: Vec<Firing> = Vec::new();
        let mut batch_len = 0;
        for firing in std::mem::take(&mut firings.due) {
            let shards = firing.0.spec.shard_count() as usize;
            if batch_len + shards > FIRING_PUT_TASKS {
                self.put_batch(std::mem::take(&mut batch), report)?;
                batch_len = 0;
            }
            batch_len += shards;
            batch.push(firing);
        }
        self.put_batch(batch, report)
    }

    /// Puts the tasks of `batch`'s firings in one call, built for it: a retry without the
    /// firings of a queue that is gone builds them again rather than keeping a copy.
    fn put_batch(&self, mut batch: Vec<Firing>, report: &mut TickReport) -> Result<()> {
        while !batch.is_empty() {
            let tasks: Vec<NewTask> = batch
                .iter()
                .flat_map(|(parsed, fire_ms, _)| {
                    let shards = parsed.spec.shard_count() as usize;
                    (0..shards).map(move |shard| firing_task(parsed, *fire_ms, shard))
                })
                .collect();
            // Checked once the tasks are built, right before the put (`firings.rs`); the
            // firings of a schedule this node lost are dropped and the rest built again.
            let lost = firings::keep_owned(&*self.store, &mut batch);
            if lost > 0 {
                report.firings_not_owned += lost as u64;
                continue;
            }
            match self.store.put(tasks) {
                Ok(outcomes) => {
                    // The outcomes come in the tasks' order: each firing's shards in turn.
                    let mut outcomes = outcomes.into_iter();
                    for (parsed, _, _) in &batch {
                        let shards = parsed.spec.shard_count() as usize;
                        let created = outcomes
                            .by_ref()
                            .take(shards)
                            .filter(|o| matches!(o, PutOutcome::Created { .. }))
                            .count() as u64;
                        report.tasks_created += created;
                        report.tasks_duplicate += shards as u64 - created;
                        if created > 0 {
                            let queue = parsed.stored.def.queue.as_str();
                            *report.tasks_by_queue.entry(queue.to_owned()).or_default() += created;
                        }
                    }
                    for (parsed, _, _) in &batch {
                        report.firings += 1;
                        let queue = parsed.stored.def.queue.as_str();
                        match report.firings_by_queue.get_mut(queue) {
                            Some(count) => *count += 1,
                            None => {
                                report.firings_by_queue.insert(queue.to_owned(), 1);
                            }
                        }
                    }
                    return Ok(());
                }
                Err(StoreError::QueueNotFound(queue)) => {
                    // The queue was deleted under its schedules: their firings cannot exist.
                    // Drop them (rather than retry on every tick) and put the others.
                    batch.retain(|(parsed, _, _)| {
                        let gone = parsed.stored.def.queue == queue;
                        if gone {
                            report.firings_dropped += 1;
                            let entry = (parsed.stored.id.to_string(), queue.to_string());
                            if !report.queues_missing.contains(&entry) {
                                report.queues_missing.push(entry);
                            }
                        }
                        !gone
                    });
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// The earliest instant at which `tick` would create a firing, or `None` if no active
    /// schedule will ever fire again. It may be in the past (a tick is due now). Not every
    /// store announces schedules created by other nodes (`Store::subscribe_events`), and an
    /// announcement may be missed, so a runner should also wake up periodically (e.g. every
    /// second).
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
}
