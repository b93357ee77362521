//! What the fan-out runner's last full look found, so that a step reads only what can have
//! work.
//!
//! A full look lists and decodes every reminder and counts each one's subscribers. The
//! runner steps every second, and at every chunk of a paced fan-out (50 times a second at
//! 50,000 users/s in chunks of 1,000), so with 10,000 waiting reminders a paced fan-out cost
//! 0.72 of a core, nearly all of it finding again that the other reminders are not due.
//!
//! A full look that raised no error is remembered ([`belfry_core::LastLook`]) as
//! [`Found`]: the earliest fire time of the reminders it left idle, and the keys of the
//! fan-outs it left running. Until a change is announced, that fire time comes, or
//! [`FULL_LOOK_MS`] passes, a step reads only those running fan-outs' reminders and cursors
//! (a *focused* step), or nothing at all when none is running (a *quiet* step). A focused
//! step keeps the memory up to date: a fan-out that finishes leaves the running set, and its
//! reminder's next fire time joins the earliest.
//!
//! **What counts as a change.** Creates, patches and deletes through this service announce
//! themselves; so must anything else that writes reminders or fan-outs behind the service's
//! back (the server does it for changes another node announces, `ReminderService::relook`).
//! The runner's own writes (a firing that moves a reminder's fire time, a fan-out's cursor)
//! need no announcement: the step that made them accounts for them.
//!
//! **The subscriber gauge.** Subscribes and unsubscribes change no fire time, so they do not
//! cost a full look (a steady trickle of subscriptions would make every step one). Their
//! counts are added to the remembered total instead; a full look recounts.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use belfry_core::{LastLook, LookStart, UnixMs};

use crate::fanout::StepReport;

/// A step reads every reminder at least this often even when nothing changed: it recounts
/// the subscribers, and bounds how long a change nobody announced goes unseen. Every write
/// through a single-process store goes through the service, and a shared store's periodic
/// recheck (every 5 s on Redis) voids the look sooner, so this is a backstop, not a delay
/// anyone waits for.
pub const FULL_LOOK_MS: u64 = 300_000;

/// Most running fan-outs a look remembers; with more, every step is a full look (each
/// running fan-out is then a large share of what a full look reads anyway).
const RUNNING_MAX: usize = 256;

/// The runner's memory of its last full look.
#[derive(Debug)]
pub(crate) struct Looks {
    last: LastLook<Found>,
    /// Subscriptions added minus removed since the last full look began.
    subscribed: AtomicI64,
}

/// What the last full look found, as the steps since have kept it.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The earliest fire time of the reminders with no fan-out running.
    next_ms: Option<UnixMs>,
    subscribers: u64,
    /// The reminder keys (`uid_key`) of this node's fan-outs still running.
    running: Arc<[String]>,
    /// When the full look ran: its memory ages from then, however many steps kept it.
    looked_ms: UnixMs,
}

impl Found {
    pub(crate) fn running(&self) -> &[String] {
        &self.running
    }

    pub(crate) fn next_ms(&self) -> Option<UnixMs> {
        self.next_ms
    }
}

/// What the last full look lets a step at some time do.
#[derive(Debug)]
pub(crate) enum Recall {
    /// Nothing is running or due: the step's whole answer.
    Quiet(StepReport),
    /// Fan-outs are running and no idle reminder is due: step only those.
    Focus(Found),
    /// Look at every reminder.
    Full,
}

/// What one step saw of the reminders it stepped, for the memory.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    next_ms: Option<UnixMs>,
    running: Vec<String>,
}

impl Tally {
    /// A stepped reminder has no fan-out running and fires next at `next_ms`.
    pub(crate) fn idle(&mut self, next_ms: Option<UnixMs>) {
        self.next_ms = earliest(self.next_ms, next_ms);
    }

    /// The reminder at `key` still has a fan-out running after the step.
    pub(crate) fn running(&mut self, key: String) {
        self.running.push(key);
    }
}

fn earliest(a: Option<UnixMs>, b: Option<UnixMs>) -> Option<UnixMs> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Default for Looks {
    fn default() -> Self {
        Looks {
            last: LastLook::new(FULL_LOOK_MS),
            subscribed: AtomicI64::new(0),
        }
    }
}

impl Looks {
    /// Something a look reads was written: the next step looks again.
    pub(crate) fn changed(&self) {
        self.last.changed();
    }

    /// `delta` subscriptions were added (or, negative, removed).
    pub(crate) fn subscribed(&self, delta: i64) {
        self.subscribed.fetch_add(delta, Ordering::Relaxed);
    }

    /// What a step at `now_ms` may do. The returned start is taken before the memory is
    /// read, so a change announced in between voids what a focused step leaves.
    pub(crate) fn recall(&self, now_ms: UnixMs) -> (LookStart, Recall) {
        let start = self.last.begin();
        let Some(found) = self.last.recall(now_ms) else {
            return (start, Recall::Full);
        };
        if found.next_ms.is_some_and(|next| next <= now_ms) {
            return (start, Recall::Full);
        }
        if !found.running.is_empty() {
            return (start, Recall::Focus(found));
        }
        let report = StepReport {
            subscribers: self.subscribers(&found),
            next_ms: found.next_ms,
            ..StepReport::default()
        };
        (start, Recall::Quiet(report))
    }

    /// The subscriptions now, by the last full look's count and the changes since.
    pub(crate) fn subscribers(&self, found: &Found) -> u64 {
        (found.subscribers as i64)
            .saturating_add(self.subscribed.load(Ordering::Relaxed))
            .max(0) as u64
    }

    /// A full look begins.
    pub(crate) fn begin_full(&self) -> LookStart {
        // The look counts every subscription written before it lists; ones written during it
        // may be counted twice until the next full look, never lost.
        self.subscribed.store(0, Ordering::Relaxed);
        self.last.begin()
    }

    /// The full look that began at `start` ran at `now_ms` and ended with `report` and
    /// `tally` (`None`: it failed). Remembered unless it raised an error.
    pub(crate) fn end_full(
        &self,
        start: LookStart,
        now_ms: UnixMs,
        ended: Option<(&StepReport, Tally)>,
    ) {
        let found = ended.and_then(|(report, tally)| {
            remembered(report, tally).map(|(next_ms, running)| Found {
                next_ms,
                subscribers: report.subscribers,
                running,
                looked_ms: now_ms,
            })
        });
        self.last.end(start, now_ms, found);
    }

    /// The focused step that began at `start` from `found` ended with `report` and `tally`
    /// (`None`: it failed). The memory keeps its age; a fan-out that finished leaves the
    /// running set and its reminder's next fire time joins the earliest.
    pub(crate) fn end_focus(
        &self,
        start: LookStart,
        found: &Found,
        ended: Option<(&StepReport, Tally)>,
    ) {
        let kept = ended.and_then(|(report, tally)| {
            remembered(report, tally).map(|(next_ms, running)| Found {
                next_ms: earliest(found.next_ms, next_ms),
                subscribers: found.subscribers,
                running,
                looked_ms: found.looked_ms,
            })
        });
        self.last.end(start, found.looked_ms, kept);
    }
}

/// What a step that ended with `report` leaves to remember: nothing after an error (the
/// next step looks at everything again) or with too many fan-outs running.
fn remembered(report: &StepReport, tally: Tally) -> Option<(Option<UnixMs>, Arc<[String]>)> {
    (report.errors.is_empty() && tally.running.len() <= RUNNING_MAX)
        .then(|| (tally.next_ms, tally.running.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(next_ms: Option<UnixMs>, subscribers: u64) -> StepReport {
        StepReport {
            next_ms,
            subscribers,
            ..StepReport::default()
        }
    }

    fn tally(next_ms: Option<UnixMs>, running: &[&str]) -> Tally {
        Tally {
            next_ms,
            running: running.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn full(looks: &Looks, now_ms: UnixMs, report: &StepReport, t: Tally) {
        let start = looks.begin_full();
        looks.end_full(start, now_ms, Some((report, t)));
    }

    #[test]
    fn a_quiet_look_answers_until_its_next_fire_time() {
        let looks = Looks::default();
        assert!(matches!(looks.recall(1_000).1, Recall::Full), "no look yet");
        full(&looks, 1_000, &idle(None, 7), tally(Some(5_000), &[]));
        let Recall::Quiet(step) = looks.recall(4_999).1 else {
            panic!("nothing due before 5,000");
        };
        assert_eq!(step.next_ms, Some(5_000));
        assert_eq!(step.subscribers, 7);
        assert!(matches!(looks.recall(5_000).1, Recall::Full), "due");
        looks.changed();
        assert!(matches!(looks.recall(4_999).1, Recall::Full), "a change");
        full(&looks, 1_000, &idle(None, 7), tally(Some(5_000), &[]));
        let start = looks.begin_full();
        looks.end_full(start, 1_100, None);
        assert!(
            matches!(looks.recall(1_200).1, Recall::Full),
            "a failed look forgets the last"
        );
    }

    #[test]
    fn a_look_with_errors_or_too_many_fan_outs_is_not_remembered() {
        let looks = Looks::default();
        let errors = StepReport {
            errors: vec![("r".into(), "corrupt".into())],
            ..idle(None, 0)
        };
        full(&looks, 1_000, &errors, tally(Some(9_000), &[]));
        assert!(matches!(looks.recall(1_001).1, Recall::Full));
        let many: Vec<String> = (0..=RUNNING_MAX).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        full(&looks, 1_000, &idle(None, 0), tally(Some(9_000), &many));
        assert!(matches!(looks.recall(1_001).1, Recall::Full));
    }

    /// Running fan-outs make the next steps focused on them; the one that finishes leaves
    /// the set and brings its next fire time; the memory ages from the full look.
    #[test]
    fn running_fan_outs_are_stepped_alone_until_they_finish() {
        let looks = Looks::default();
        full(
            &looks,
            1_000,
            &idle(None, 3),
            tally(Some(60_000), &["a", "b"]),
        );
        let (start, Recall::Focus(found)) = looks.recall(1_500) else {
            panic!("two fan-outs running");
        };
        assert_eq!(found.running(), ["a", "b"]);
        // "a" finished and fires again at 30,000; "b" goes on.
        looks.end_focus(
            start,
            &found,
            Some((&idle(None, 0), tally(Some(30_000), &["b"]))),
        );
        let (start, Recall::Focus(found)) = looks.recall(2_000) else {
            panic!("one fan-out running");
        };
        assert_eq!(found.running(), ["b"]);
        looks.end_focus(start, &found, Some((&idle(None, 0), tally(None, &[]))));
        let Recall::Quiet(step) = looks.recall(2_500).1 else {
            panic!("nothing running, nothing due");
        };
        assert_eq!(step.next_ms, Some(30_000));
        assert_eq!(step.subscribers, 3, "kept from the full look");
        assert!(matches!(looks.recall(30_000).1, Recall::Full));
        assert!(
            matches!(looks.recall(1_000 + FULL_LOOK_MS).1, Recall::Full),
            "aged from the full look, not from the focused steps"
        );
    }

    /// A change announced after a focused step began voids what it leaves, even though it
    /// read only its fan-outs.
    #[test]
    fn a_change_during_a_focused_step_voids_it() {
        let looks = Looks::default();
        full(&looks, 1_000, &idle(None, 0), tally(None, &["a"]));
        let (start, Recall::Focus(found)) = looks.recall(1_100) else {
            panic!("a fan-out running");
        };
        looks.changed();
        looks.end_focus(start, &found, Some((&idle(None, 0), tally(None, &["a"]))));
        assert!(matches!(looks.recall(1_200).1, Recall::Full));
    }

    #[test]
    fn subscriptions_move_the_gauge_without_a_full_look() {
        let looks = Looks::default();
        looks.subscribed(100);
        full(&looks, 1_000, &idle(None, 100), tally(None, &[]));
        looks.subscribed(5);
        looks.subscribed(-2);
        let Recall::Quiet(step) = looks.recall(1_001).1 else {
            panic!("quiet");
        };
        assert_eq!(step.subscribers, 103);
        looks.subscribed(-500);
        let Recall::Quiet(step) = looks.recall(1_002).1 else {
            panic!("quiet");
        };
        assert_eq!(step.subscribers, 0);
    }
}
