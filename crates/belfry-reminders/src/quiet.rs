//! What the fan-out runner's last full look found, so that a step with nothing to do reads
//! nothing.
//!
//! A full look lists and decodes every reminder and counts each one's subscribers. The
//! runner steps every second, so with 10,000 idle reminders that was 0.04–0.06 of a core
//! spent finding that nothing is due, and it grows with the number of reminders. A look
//! that found nothing running and changed nothing is remembered as [`Quiet`]: until a change
//! is announced, its earliest fire time comes, or [`FULL_LOOK_MS`] passes, a step answers from
//! it without touching the store.
//!
//! **What counts as a change.** Creates, patches and deletes through this service announce
//! themselves ([`Looks::changed`]); so must anything else that writes reminders or fan-outs
//! behind the service's back (the server does it for changes another node announces, see
//! `ReminderService::relook`). A change is a counter bumped *after* its write, and a look
//! records the counter *before* it lists: a write that the listing may have missed leaves the
//! counter ahead of the look's, and the next step looks again.
//!
//! **The subscriber gauge.** Subscribes and unsubscribes change no fire time, so they do not
//! cost a full look (a steady trickle of subscriptions would make every step one). Their
//! counts are added to the remembered total instead; a full look recounts.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use belfry_core::UnixMs;
use parking_lot::Mutex;

use crate::fanout::StepReport;

/// A step reads every reminder at least this often even when nothing changed: it recounts
/// the subscribers, and bounds what a change nobody announced can go unseen.
pub const FULL_LOOK_MS: u64 = 30_000;

/// The runner's memory of its last full look.
#[derive(Debug, Default)]
pub(crate) struct Looks {
    /// Bumped after every write that can change what a look finds.
    changes: AtomicU64,
    /// Subscriptions added minus removed since the last full look began.
    subscribed: AtomicI64,
    quiet: Mutex<Option<Quiet>>,
}

/// A full look that found nothing running and changed nothing.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    /// [`Looks::changes`] when the look began.
    changes: u64,
    looked_ms: UnixMs,
    next_ms: Option<UnixMs>,
    subscribers: u64,
}

impl Looks {
    /// Something a look reads was written: the next step looks again.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// `delta` subscriptions were added (or, negative, removed).
    pub(crate) fn subscribed(&self, delta: i64) {
        self.subscribed.fetch_add(delta, Ordering::Relaxed);
    }

    /// What a step at `now_ms` would find, if the last full look still says it.
    pub(crate) fn quiet_step(&self, now_ms: UnixMs) -> Option<StepReport> {
        let quiet = (*self.quiet.lock())?;
        let current = quiet.changes == self.changes.load(Ordering::SeqCst);
        // A clock that stepped back also looks again.
        let recent = now_ms >= quiet.looked_ms && now_ms - quiet.looked_ms < FULL_LOOK_MS;
        let nothing_due = quiet.next_ms.is_none_or(|next| now_ms < next);
        if !(current && recent && nothing_due) {
            return None;
        }
        let subscribers = (quiet.subscribers as i64)
            .saturating_add(self.subscribed.load(Ordering::Relaxed))
            .max(0) as u64;
        Some(StepReport {
            subscribers,
            next_ms: quiet.next_ms,
            ..StepReport::default()
        })
    }

    /// A full look begins: what it must hand to [`Looks::end`].
    pub(crate) fn begin(&self) -> u64 {
        // The look counts every subscription written before it lists; ones written during it
        // may be counted twice until the next full look, never lost.
        self.subscribed.store(0, Ordering::Relaxed);
        self.changes.load(Ordering::SeqCst)
    }

    /// A full look that began at `began` (from [`Looks::begin`]) and ran at `now_ms` ended
    /// with `report`: remembered if it found nothing running and changed nothing.
    pub(crate) fn end(&self, began: u64, now_ms: UnixMs, report: &StepReport) {
        let quiet = report.fanouts_started == 0
            && report.fanouts_finished == 0
            && report.fanouts_running == 0
            && report.chunks_created == 0
            && report.chunks_found == 0
            && !report.again
            && report.errors.is_empty();
        *self.quiet.lock() = quiet.then_some(Quiet {
            changes: began,
            looked_ms: now_ms,
            next_ms: report.next_ms,
            subscribers: report.subscribers,
        });
    }
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

    #[test]
    fn a_quiet_look_answers_until_its_next_fire_time() {
        let looks = Looks::default();
        assert!(looks.quiet_step(1_000).is_none(), "no look yet");
        let began = looks.begin();
        looks.end(began, 1_000, &idle(Some(5_000), 7));
        let step = looks.quiet_step(4_999).expect("nothing due before 5,000");
        assert_eq!(step.next_ms, Some(5_000));
        assert_eq!(step.subscribers, 7);
        assert!(looks.quiet_step(5_000).is_none(), "due: a full look");
    }

    #[test]
    fn with_nothing_ever_due_a_full_look_still_comes_every_full_look_ms() {
        let looks = Looks::default();
        let began = looks.begin();
        looks.end(began, 1_000, &idle(None, 0));
        assert!(looks.quiet_step(1_000 + FULL_LOOK_MS - 1).is_some());
        assert!(looks.quiet_step(1_000 + FULL_LOOK_MS).is_none());
        assert!(looks.quiet_step(999).is_none(), "the clock stepped back");
    }

    /// A change announced after the look began (the listing may have missed it) voids the
    /// look; one announced before the look began was seen by it.
    #[test]
    fn a_change_during_or_after_a_look_voids_it() {
        let looks = Looks::default();
        looks.changed();
        let began = looks.begin();
        looks.end(began, 1_000, &idle(None, 0));
        assert!(looks.quiet_step(1_001).is_some(), "seen by the look");

        let began = looks.begin();
        looks.changed();
        looks.end(began, 2_000, &idle(None, 0));
        assert!(looks.quiet_step(2_001).is_none(), "written while listing");

        let began = looks.begin();
        looks.end(began, 3_000, &idle(None, 0));
        looks.changed();
        assert!(looks.quiet_step(3_001).is_none(), "written after");
    }

    #[test]
    fn a_look_that_did_anything_is_not_remembered() {
        let looks = Looks::default();
        for report in [
            StepReport {
                fanouts_started: 1,
                ..idle(Some(9_000), 0)
            },
            StepReport {
                fanouts_running: 1,
                ..idle(None, 0)
            },
            StepReport {
                again: true,
                ..idle(None, 0)
            },
            StepReport {
                chunks_found: 1,
                ..idle(None, 0)
            },
            StepReport {
                errors: vec![("r".into(), "corrupt".into())],
                ..idle(None, 0)
            },
        ] {
            let began = looks.begin();
            looks.end(began, 1_000, &report);
            assert!(looks.quiet_step(1_001).is_none(), "{report:?}");
        }
    }

    #[test]
    fn subscriptions_move_the_gauge_without_a_full_look() {
        let looks = Looks::default();
        looks.subscribed(100);
        let began = looks.begin();
        looks.end(began, 1_000, &idle(None, 100));
        looks.subscribed(5);
        looks.subscribed(-2);
        assert_eq!(looks.quiet_step(1_001).unwrap().subscribers, 103);
        looks.subscribed(-500);
        assert_eq!(looks.quiet_step(1_002).unwrap().subscribers, 0);
    }
}
