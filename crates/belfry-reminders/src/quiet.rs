//! What the fan-out runner's last full look found, so that a step reads only the reminders
//! that can have work.
//!
//! A full look lists and decodes every reminder and counts each one's subscribers. The
//! runner steps every second, at every fire time, and at every chunk of a paced fan-out (50
//! times a second at 50,000 users/s in chunks of 1,000). With 10,000 other reminders waiting,
//! a paced fan-out whose every step was a full look cost 0.72 of a core.
//!
//! A full look that raised no error is remembered ([`belfry_core::LastLook`]) as a [`Plan`]:
//! a [`Timetable`] of the reminders it left idle, at their next fire times, and the keys of
//! the fan-outs it left running. Until a change is announced, a fire time the timetable had
//! no room for comes, or [`FULL_LOOK_MS`] passes, a step reads only the running fan-outs and
//! the reminders the timetable says are due (a *focused* step), and nothing at all when there
//! are none (a *quiet* step). A focused step keeps the plan up to date: a fan-out that
//! finishes leaves the running set, and each reminder it stepped goes back into the timetable
//! at its next fire time.
//!
//! **What counts as a change.** Creates, patches and deletes through this service name the
//! reminder they wrote (below); anything else that writes reminders or fan-outs behind the
//! service's back must announce itself too (the server does it for changes another node
//! announces: `ReminderService::touched` with their keys, `ReminderService::relook` without).
//! The runner's own writes (a firing that moves a reminder's fire time, a fan-out's cursor)
//! need no announcement: the step that made them accounts for them.
//!
//! **Changes that name their keys.** A create, patch or delete names its reminder, and so do a
//! shared store's announcements (`ReminderService::touched`): another node's create or patch,
//! and every firing start, which moves a reminder's next fire time. Those keys wait in a
//! short list that the next step reads along with what is due, instead of voiding the look;
//! a full look that begins after they were written reads them anyway, so it empties the list.
//! With 100,000 reminders firing over the day's seconds on Redis, each firing had made every
//! node read all of them again.
//!
//! **The subscriber gauge.** Subscribes and unsubscribes change no fire time, so they do not
//! cost a full look (a steady trickle of subscriptions would make every step one). Their
//! counts are added to the remembered total instead; a full look recounts.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use belfry_core::{LastLook, LookStart, Timetable, UnixMs};
use parking_lot::{Mutex, MutexGuard};

use crate::fanout::StepReport;

/// A step reads every reminder at least this often even when nothing changed: it recounts
/// the subscribers, and bounds how long a change nobody announced goes unseen. Every write
/// through a single-process store goes through the service, and a shared store's periodic
/// recheck (every 5 s on Redis) voids the look sooner, so this is a backstop, not a delay
/// anyone waits for.
pub const FULL_LOOK_MS: u64 = 300_000;

/// Most running fan-outs a plan holds; with more, every step is a full look (each running
/// fan-out is then a large share of what a full look reads anyway).
const RUNNING_MAX: usize = 256;

/// The runner's memory of its last full look.
#[derive(Debug)]
pub(crate) struct Looks {
    last: LastLook<Arc<Mutex<Plan>>>,
    /// Subscriptions added minus removed since the last full look began.
    subscribed: AtomicI64,
    /// Reminders a timetable holds at most.
    timetable_max: usize,
}

/// What the last full look found, as the steps since have kept it.
#[derive(Debug)]
pub(crate) struct Plan {
    /// This node's reminders with no fan-out running, at their next fire times.
    timetable: Timetable,
    /// The reminder keys (`uid_key`) of this node's fan-outs still running.
    running: Vec<String>,
    /// Subscriptions the full look counted.
    subscribers: u64,
}

impl Plan {
    /// Takes out the keys a step at `now_ms` reads: the running fan-outs, then the reminders
    /// due. Each goes back with [`Plan::keep`].
    pub(crate) fn take_due(&mut self, now_ms: UnixMs) -> Vec<String> {
        let mut keys = std::mem::take(&mut self.running);
        keys.extend(
            self.timetable
                .take_due(now_ms)
                .into_iter()
                .map(String::from),
        );
        keys
    }

    /// Puts back what a step left of the reminders it read; answers whether the plan can
    /// still be kept (not too many fan-outs running).
    pub(crate) fn keep(&mut self, tally: Tally) -> bool {
        self.running = tally.running;
        for (next_ms, key) in tally.idle {
            self.timetable.put(key.into_boxed_str(), next_ms);
        }
        self.running.len() <= RUNNING_MAX
    }

    /// When a step next has work among the idle reminders, if ever.
    pub(crate) fn next_ms(&self) -> Option<UnixMs> {
        self.timetable.next_ms()
    }
}

/// What the last full look lets a step at some time do.
#[derive(Debug)]
pub(crate) enum Recall {
    /// Nothing is running or due: the step's whole answer.
    Quiet(StepReport),
    /// Step only the running fan-outs and the reminders due (the plan's [`Plan::take_due`]).
    Focus(Arc<Mutex<Plan>>),
    /// Look at every reminder.
    Full,
}

/// What one step saw of the reminders it stepped, for the plan.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// The reminders with no fan-out running that will fire again: (next fire time, key).
    idle: Vec<(UnixMs, String)>,
    running: Vec<String>,
}

impl Tally {
    /// The reminder at `key` has no fan-out running and fires next at `next_ms`, if ever.
    pub(crate) fn idle(&mut self, key: String, next_ms: Option<UnixMs>) {
        if let Some(next_ms) = next_ms {
            self.idle.push((next_ms, key));
        }
    }

    /// The reminder at `key` still has a fan-out running after the step.
    pub(crate) fn running(&mut self, key: String) {
        self.running.push(key);
    }
}

impl Looks {
    pub(crate) fn with_timetable_max(timetable_max: usize) -> Self {
        Looks {
            last: LastLook::new(FULL_LOOK_MS),
            subscribed: AtomicI64::new(0),
            timetable_max: timetable_max.max(1),
        }
    }

    /// The reminders at `keys` were written (through the service, or announced by another
    /// node): the next step reads them again (a full look, if too many wait).
    pub(crate) fn touch(&self, keys: impl IntoIterator<Item = String>) {
        self.last.touch(keys);
    }

    /// The keys a focused step at `now_ms` reads: the plan's ([`Plan::take_due`]), then
    /// those touched since, each once.
    pub(crate) fn take_keys(&self, plan: &mut Plan, now_ms: UnixMs) -> Vec<String> {
        let mut keys = plan.take_due(now_ms);
        self.last.take_touched(&mut keys);
        keys
    }

    /// Something a look reads was written: the next step looks again.
    pub(crate) fn changed(&self) {
        self.last.changed();
    }

    /// `delta` subscriptions were added (or, negative, removed).
    pub(crate) fn subscribed(&self, delta: i64) {
        self.subscribed.fetch_add(delta, Ordering::Relaxed);
    }

    /// What a step at `now_ms` may do.
    pub(crate) fn recall(&self, now_ms: UnixMs) -> Recall {
        let Some(shared) = self.last.recall(now_ms) else {
            return Recall::Full;
        };
        let plan = shared.lock();
        if !plan.timetable.covers(now_ms) {
            return Recall::Full;
        }
        if plan.running.is_empty() && !plan.timetable.has_due(now_ms) && !self.last.has_touched() {
            return Recall::Quiet(StepReport {
                subscribers: self.subscribers(&plan),
                next_ms: plan.next_ms(),
                ..StepReport::default()
            });
        }
        drop(plan);
        Recall::Focus(shared)
    }

    /// The subscriptions now, by the last full look's count and the changes since.
    pub(crate) fn subscribers(&self, plan: &MutexGuard<'_, Plan>) -> u64 {
        (plan.subscribers as i64)
            .saturating_add(self.subscribed.load(Ordering::Relaxed))
            .max(0) as u64
    }

    /// A full look begins.
    pub(crate) fn begin_full(&self) -> LookStart {
        // The look counts every subscription written before it lists; ones written during it
        // may be counted twice until the next full look, never lost.
        self.subscribed.store(0, Ordering::Relaxed);
        // The look reads every reminder after this, the touched ones too (`LastLook::begin`).
        self.last.begin()
    }

    /// The full look that began at `start` ran at `now_ms` and ended with `report` and
    /// `tally` (`None`: it failed). Remembered unless it raised an error or left too many
    /// fan-outs running.
    pub(crate) fn end_full(
        &self,
        start: LookStart,
        now_ms: UnixMs,
        ended: Option<(&StepReport, Tally)>,
    ) {
        let plan = ended.and_then(|(report, tally)| {
            if !report.errors.is_empty() || tally.running.len() > RUNNING_MAX {
                return None;
            }
            let idle = tally
                .idle
                .into_iter()
                .map(|(at, key)| (at, key.into_boxed_str()))
                .collect();
            Some(Arc::new(Mutex::new(Plan {
                timetable: Timetable::new(self.timetable_max, idle),
                running: tally.running,
                subscribers: report.subscribers,
            })))
        });
        self.last.end(start, now_ms, plan);
    }

    /// Drops the plan: the next step is a full look (after a focused step failed, raised an
    /// error, or left too many fan-outs running).
    pub(crate) fn forget(&self) {
        self.last.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(subscribers: u64) -> StepReport {
        StepReport {
            subscribers,
            ..StepReport::default()
        }
    }

    fn tally(idle: &[(UnixMs, &str)], running: &[&str]) -> Tally {
        Tally {
            idle: idle.iter().map(|&(at, k)| (at, k.to_string())).collect(),
            running: running.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn full(looks: &Looks, now_ms: UnixMs, report: &StepReport, t: Tally) {
        let start = looks.begin_full();
        looks.end_full(start, now_ms, Some((report, t)));
    }

    fn focus(looks: &Looks, now_ms: UnixMs) -> Arc<Mutex<Plan>> {
        match looks.recall(now_ms) {
            Recall::Focus(plan) => plan,
            other => panic!("at {now_ms}: {other:?}"),
        }
    }

    #[test]
    fn a_quiet_look_answers_until_its_next_fire_time() {
        let looks = Looks::with_timetable_max(belfry_core::TIMETABLE_MAX);
        assert!(matches!(looks.recall(1_000), Recall::Full), "no look yet");
        full(&looks, 1_000, &idle(7), tally(&[(5_000, "a")], &[]));
        let Recall::Quiet(step) = looks.recall(4_999) else {
            panic!("nothing due before 5,000");
        };
        assert_eq!(step.next_ms, Some(5_000));
        assert_eq!(step.subscribers, 7);
        let due = focus(&looks, 5_000).lock().take_due(5_000);
        assert_eq!(due, ["a"], "due: read only that one");
        looks.changed();
        assert!(matches!(looks.recall(4_999), Recall::Full), "a change");
        full(&looks, 1_000, &idle(7), tally(&[(5_000, "a")], &[]));
        let start = looks.begin_full();
        looks.end_full(start, 1_100, None);
        assert!(
            matches!(looks.recall(1_200), Recall::Full),
            "a failed look forgets the last"
        );
    }

    #[test]
    fn a_look_with_errors_or_too_many_fan_outs_is_not_remembered() {
        let looks = Looks::with_timetable_max(belfry_core::TIMETABLE_MAX);
        let errors = StepReport {
            errors: vec![("r".into(), "corrupt".into())],
            ..idle(0)
        };
        full(&looks, 1_000, &errors, tally(&[(9_000, "a")], &[]));
        assert!(matches!(looks.recall(1_001), Recall::Full));
        let many: Vec<String> = (0..=RUNNING_MAX).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        full(&looks, 1_000, &idle(0), tally(&[], &many));
        assert!(matches!(looks.recall(1_001), Recall::Full));
    }

    /// Running fan-outs make the next steps focused on them; the one that finishes goes back
    /// into the timetable at its next fire time; the plan ages from the full look.
    #[test]
    fn running_fan_outs_are_stepped_alone_until_they_finish() {
        let looks = Looks::with_timetable_max(belfry_core::TIMETABLE_MAX);
        full(
            &looks,
            1_000,
            &idle(3),
            tally(&[(60_000, "c")], &["a", "b"]),
        );
        let plan = focus(&looks, 1_500);
        let keys = plan.lock().take_due(1_500);
        assert_eq!(keys, ["a", "b"]);
        // "a" finished and fires again at 30,000; "b" goes on.
        assert!(plan.lock().keep(tally(&[(30_000, "a")], &["b"])));
        let keys = focus(&looks, 2_000).lock().take_due(2_000);
        assert_eq!(keys, ["b"]);
        assert!(plan.lock().keep(tally(&[], &[])));
        let Recall::Quiet(step) = looks.recall(2_500) else {
            panic!("nothing running, nothing due");
        };
        assert_eq!(step.next_ms, Some(30_000));
        assert_eq!(step.subscribers, 3, "kept from the full look");
        assert_eq!(focus(&looks, 30_000).lock().take_due(30_000), ["a"]);
        assert!(
            matches!(looks.recall(1_000 + FULL_LOOK_MS), Recall::Full),
            "aged from the full look, not from the focused steps"
        );
    }

    /// A timetable with no room for every reminder answers until the first one it left out
    /// is due; a plan left with too many fan-outs running is not kept.
    #[test]
    fn a_left_out_fire_time_or_too_many_fan_outs_make_a_full_look() {
        let looks = Looks::with_timetable_max(2);
        full(
            &looks,
            1_000,
            &idle(0),
            tally(&[(5_000, "a"), (6_000, "b"), (7_000, "c")], &[]),
        );
        assert!(matches!(looks.recall(6_999), Recall::Focus(_)));
        assert!(matches!(looks.recall(7_000), Recall::Full), "c left out");

        let plan = focus(&looks, 5_000);
        plan.lock().take_due(5_000);
        let many: Vec<String> = (0..=RUNNING_MAX).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(!plan.lock().keep(tally(&[], &many)));
    }

    /// Keys another node wrote are read by the next step, each once, beside what is due,
    /// without a full look; a full look reads those touched before it began, not those
    /// touched while it ran; too many touched make the next step a full look.
    #[test]
    fn touched_keys_are_read_by_the_next_step_not_by_a_full_look() {
        let looks = Looks::with_timetable_max(belfry_core::TIMETABLE_MAX);
        full(&looks, 1_000, &idle(0), tally(&[(9_000, "a")], &[]));
        assert!(matches!(looks.recall(1_001), Recall::Quiet(_)));
        looks.touch(["b".to_string(), "b".to_string()]);
        let plan = focus(&looks, 1_002);
        assert_eq!(looks.take_keys(&mut plan.lock(), 1_002), ["b"]);
        assert!(matches!(looks.recall(1_003), Recall::Quiet(_)), "read once");

        looks.touch(["a".to_string(), "c".to_string()]);
        let plan = focus(&looks, 9_000);
        assert_eq!(looks.take_keys(&mut plan.lock(), 9_000), ["a", "c"]);

        looks.touch(["before".to_string()]);
        let start = looks.begin_full();
        looks.touch(["during".to_string()]);
        looks.end_full(start, 9_100, Some((&idle(0), tally(&[], &[]))));
        let plan = focus(&looks, 9_101);
        assert_eq!(looks.take_keys(&mut plan.lock(), 9_101), ["during"]);

        looks.touch((0..=belfry_core::TOUCHED_MAX).map(|i| i.to_string()));
        assert!(matches!(looks.recall(9_102), Recall::Full), "too many");
    }

    #[test]
    fn subscriptions_move_the_gauge_without_a_full_look() {
        let looks = Looks::with_timetable_max(belfry_core::TIMETABLE_MAX);
        looks.subscribed(100);
        full(&looks, 1_000, &idle(100), tally(&[], &[]));
        looks.subscribed(5);
        looks.subscribed(-2);
        let Recall::Quiet(step) = looks.recall(1_001) else {
            panic!("quiet");
        };
        assert_eq!(step.subscribers, 103);
        looks.subscribed(-500);
        let Recall::Quiet(step) = looks.recall(1_002) else {
            panic!("quiet");
        };
        assert_eq!(step.subscribers, 0);
    }
}
