//! When a runner that scans all of its records (the schedule runner, the reminder runner)
//! looks at them next, and whether a write made through this node must wake it early.
//!
//! Each look is a scan of every record, so a wake per write made the runners scan back to
//! back while records were created in bulk: 10,000 reminders created one by one meant about
//! 50 million reminder reads. With a plan, a write wakes the runner only if its record is
//! due before the planned look; the others are found by that look.

use belfry_core::UnixMs;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// A runner's wake-up: the plan and the notification together, so that every runner wakes
/// by the same rule.
#[derive(Debug)]
pub(crate) struct RunnerWake {
    notify: Notify,
    plan: parking_lot::Mutex<RunnerPlan>,
}

impl RunnerWake {
    pub(crate) fn new(lead_ms: u64, gap_min_ms: u64, recheck_ms: u64) -> Self {
        RunnerWake {
            notify: Notify::new(),
            plan: parking_lot::Mutex::new(RunnerPlan::new(lead_ms, gap_min_ms, recheck_ms)),
        }
    }

    /// Makes the runner look now (a stored permit if it is busy, so no wake is lost).
    pub(crate) fn wake(&self) {
        self.notify.notify_one();
    }

    /// A record written through this node is next due at `due_ms` (`None`: never again):
    /// wakes the runner only if that is before its planned look.
    pub(crate) fn written(&self, due_ms: Option<UnixMs>) {
        let Some(due_ms) = due_ms else {
            return;
        };
        let wake = self.plan.lock().written(due_ms);
        if wake {
            self.wake();
        }
    }

    pub(crate) fn begin_look(&self) {
        self.plan.lock().begin_look();
    }

    /// See [`RunnerPlan::end_look`].
    pub(crate) fn end_look(&self, due_ms: Option<UnixMs>, now_ms: UnixMs) -> u64 {
        self.plan.lock().end_look(due_ms, now_ms)
    }

    /// Completes when the runner is woken.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

/// When the runner will look next, and what was written while it looked. Times given to it
/// are due times; it looks `lead_ms` before them.
#[derive(Debug)]
pub(crate) struct RunnerPlan {
    /// How long before a due time its look runs.
    lead_ms: u64,
    /// The shortest pause between looks, so a record that is somehow never in the future (a
    /// clock that does not move) cannot make the runner spin.
    gap_min_ms: u64,
    /// The longest pause: what other nodes write is noticed within it.
    recheck_ms: u64,
    /// A look is running (between its store reads and the runner's next plan).
    looking: bool,
    /// The earliest due time of the records written during the running look.
    written_during_look: UnixMs,
    /// The planned time of the next look: writes of records due later need no wake.
    next_look_ms: UnixMs,
}

impl RunnerPlan {
    pub(crate) fn new(lead_ms: u64, gap_min_ms: u64, recheck_ms: u64) -> Self {
        RunnerPlan {
            lead_ms,
            gap_min_ms,
            recheck_ms,
            looking: false,
            written_during_look: UnixMs::MAX,
            // Until the first plan, every write wakes the runner.
            next_look_ms: UnixMs::MAX,
        }
    }

    /// A record due at `due_ms` was written: whether the runner must wake.
    pub(crate) fn written(&mut self, due_ms: UnixMs) -> bool {
        let look_ms = due_ms.saturating_sub(self.lead_ms);
        if self.looking {
            // The running look may have read the store before this write: the runner takes
            // this time into its plan when the look ends.
            self.written_during_look = self.written_during_look.min(look_ms);
            false
        } else if look_ms < self.next_look_ms {
            self.next_look_ms = look_ms;
            true
        } else {
            false
        }
    }

    pub(crate) fn begin_look(&mut self) {
        self.looking = true;
        self.written_during_look = UnixMs::MAX;
    }

    /// Ends a look whose earliest due time is `due_ms` (`None`: nothing is due, or the look
    /// failed), counting records written during the look: how long to sleep.
    pub(crate) fn end_look(&mut self, due_ms: Option<UnixMs>, now_ms: UnixMs) -> u64 {
        let look_ms = due_ms
            .unwrap_or(UnixMs::MAX)
            .saturating_sub(self.lead_ms)
            .min(self.written_during_look);
        let wait_ms = look_ms
            .saturating_sub(now_ms)
            .clamp(self.gap_min_ms, self.recheck_ms);
        self.looking = false;
        self.written_during_look = UnixMs::MAX;
        self.next_look_ms = now_ms.saturating_add(wait_ms);
        wait_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP_MIN: u64 = 1;
    const RECHECK: u64 = 1_000;

    /// Writes of records due with the others (after the planned look) wake nothing; one due
    /// earlier wakes the runner once; one written during a look is not lost.
    #[test]
    fn the_runner_wakes_only_for_records_due_before_its_plan() {
        let mut plan = RunnerPlan::new(0, GAP_MIN, RECHECK);
        assert!(plan.written(5_000), "before any plan, every write wakes");
        plan.begin_look();
        assert_eq!(plan.end_look(Some(10_000), 9_400), 600);
        for _ in 0..1_000 {
            assert!(!plan.written(10_000), "a record due with the planned look");
        }
        assert!(!plan.written(11_000));
        assert!(plan.written(9_700), "due before the planned look");
        assert!(!plan.written(9_800), "the plan already moved to 9,700");

        // Written while a look runs: no wake, but the next plan counts it.
        plan.begin_look();
        assert!(!plan.written(10_200));
        assert_eq!(plan.end_look(Some(11_000), 10_000), 200);
        // Nothing due (or a failed look): the recheck.
        plan.begin_look();
        assert_eq!(plan.end_look(None, 10_200), RECHECK);
        // Already due: the shortest gap, never a spin.
        plan.begin_look();
        assert_eq!(plan.end_look(Some(10_000), 10_300), GAP_MIN);
    }

    /// With a lead, the runner looks that long before a due time, and a write wakes it only
    /// if its look would be due before the planned one.
    #[test]
    fn with_a_lead_the_runner_looks_that_long_before_the_due_time() {
        let mut plan = RunnerPlan::new(500, GAP_MIN, RECHECK);
        plan.begin_look();
        assert_eq!(plan.end_look(Some(10_000), 9_000), 500, "looks at 9,500");
        assert!(!plan.written(10_000), "its look is the planned one");
        assert!(plan.written(9_900), "its look (9,400) is earlier");
        plan.begin_look();
        assert_eq!(
            plan.end_look(Some(10_000), 9_800),
            GAP_MIN,
            "inside the lead: at once"
        );
    }
}
