//! What the fan-out runner's last full look found, so that a step with nothing to do reads
//! nothing.
//!
//! A full look lists and decodes every reminder and counts each one's subscribers. The
//! runner steps every second, so with 100,000 idle reminders that was 0.12 of a core spent
//! finding that nothing is due. A look that found nothing running and changed nothing is
//! remembered ([`belfry_core::LastLook`]): until a change is announced, its earliest fire
//! time comes, or [`FULL_LOOK_MS`] passes, a step answers from it without touching the store.
//!
//! **What counts as a change.** Creates, patches and deletes through this service announce
//! themselves; so must anything else that writes reminders or fan-outs behind the service's
//! back (the server does it for changes another node announces, `ReminderService::relook`).
//!
//! **The subscriber gauge.** Subscribes and unsubscribes change no fire time, so they do not
//! cost a full look (a steady trickle of subscriptions would make every step one). Their
//! counts are added to the remembered total instead; a full look recounts.

use std::sync::atomic::{AtomicI64, Ordering};

use belfry_core::{LastLook, LookStart, UnixMs};

use crate::fanout::StepReport;

/// A step reads every reminder at least this often even when nothing changed: it recounts
/// the subscribers, and bounds how long a change nobody announced goes unseen. Every write
/// through a single-process store goes through the service, and a shared store's periodic
/// recheck (every 5 s on Redis) voids the look sooner, so this is a backstop, not a delay
/// anyone waits for.
pub const FULL_LOOK_MS: u64 = 300_000;

/// The runner's memory of its last full look.
#[derive(Debug)]
pub(crate) struct Looks {
    last: LastLook<Quiet>,
    /// Subscriptions added minus removed since the last full look began.
    subscribed: AtomicI64,
}

/// A full look that found nothing running and changed nothing.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    next_ms: Option<UnixMs>,
    subscribers: u64,
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

    /// What a step at `now_ms` would find, if the last full look still says it.
    pub(crate) fn quiet_step(&self, now_ms: UnixMs) -> Option<StepReport> {
        let quiet = self.last.recall(now_ms)?;
        if quiet.next_ms.is_some_and(|next| next <= now_ms) {
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

    /// A full look begins.
    pub(crate) fn begin(&self) -> LookStart {
        // The look counts every subscription written before it lists; ones written during it
        // may be counted twice until the next full look, never lost.
        self.subscribed.store(0, Ordering::Relaxed);
        self.last.begin()
    }

    /// The full look that began at `start` ran at `now_ms` and ended with `report` (`None`:
    /// it failed): remembered if it found nothing running and changed nothing.
    pub(crate) fn end(&self, start: LookStart, now_ms: UnixMs, report: Option<&StepReport>) {
        let Some(report) = report else {
            self.last.end(start, now_ms, None);
            return;
        };
        let quiet = report.fanouts_started == 0
            && report.fanouts_finished == 0
            && report.fanouts_running == 0
            && report.chunks_created == 0
            && report.chunks_found == 0
            && !report.again
            && report.errors.is_empty();
        let found = quiet.then_some(Quiet {
            next_ms: report.next_ms,
            subscribers: report.subscribers,
        });
        self.last.end(start, now_ms, found);
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
        let start = looks.begin();
        looks.end(start, 1_000, Some(&idle(Some(5_000), 7)));
        let step = looks.quiet_step(4_999).expect("nothing due before 5,000");
        assert_eq!(step.next_ms, Some(5_000));
        assert_eq!(step.subscribers, 7);
        assert!(looks.quiet_step(5_000).is_none(), "due: a full look");
        looks.changed();
        assert!(looks.quiet_step(4_999).is_none(), "a change: a full look");
        let start = looks.begin();
        looks.end(start, 1_000, Some(&idle(Some(5_000), 7)));
        let start = looks.begin();
        looks.end(start, 1_100, None);
        assert!(
            looks.quiet_step(1_200).is_none(),
            "a failed look forgets the last"
        );
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
            let start = looks.begin();
            looks.end(start, 1_000, Some(&report));
            assert!(looks.quiet_step(1_001).is_none(), "{report:?}");
        }
    }

    #[test]
    fn subscriptions_move_the_gauge_without_a_full_look() {
        let looks = Looks::default();
        looks.subscribed(100);
        let start = looks.begin();
        looks.end(start, 1_000, Some(&idle(None, 100)));
        looks.subscribed(5);
        looks.subscribed(-2);
        assert_eq!(looks.quiet_step(1_001).unwrap().subscribers, 103);
        looks.subscribed(-500);
        assert_eq!(looks.quiet_step(1_002).unwrap().subscribers, 0);
    }
}
