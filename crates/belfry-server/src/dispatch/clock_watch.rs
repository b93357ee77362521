//! Noticing a wall-clock step, so that queue timers need not poll for one.
//!
//! Due times are wall-clock instants, but the dispatcher's timers count monotonic time: a
//! queue whose next task is due in an hour sleeps for an hour. If the wall clock then steps
//! forward (an NTP step, a VM resumed after a pause), that task falls due while the timer
//! still sleeps. Rechecking every queue every second would catch it, at one store call per
//! queue per second, which with thousands of queues is most of the dispatcher's work. Instead
//! the dispatcher compares the two clocks once a second, and when the wall clock has gained
//! on the monotonic one it wakes every queue once.
//!
//! A step backwards needs nothing: timers then fire early, the claim finds nothing due, and
//! the queue's timer is set again from the store's answer.

use std::time::Duration;

use belfry_core::Clock;

/// How often the dispatcher compares the clocks.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Forward drift of the wall clock against the monotonic one that counts as a step. Small
/// enough that a step makes tasks at most this much later than a timer would have; large
/// enough that clock slewing (at most 0.5 ms per second) wakes the queues only every few
/// tens of seconds.
pub const STEP_TOLERANCE_MS: i128 = 10;

/// The wall clock's offset from the monotonic one when every timer was last known right.
pub struct ClockWatch {
    baseline_ms: i128,
}

impl ClockWatch {
    pub fn new(clock: &dyn Clock) -> Self {
        ClockWatch {
            baseline_ms: offset_ms(clock),
        }
    }

    /// How far the wall clock stepped forward since timers were last known right, if by more
    /// than the tolerance; the caller then wakes every queue, and this becomes the baseline.
    pub fn stepped_forward(&mut self, clock: &dyn Clock) -> Option<u64> {
        let now = offset_ms(clock);
        let gained = now - self.baseline_ms;
        if gained > STEP_TOLERANCE_MS {
            self.baseline_ms = now;
            return Some(u64::try_from(gained).unwrap_or(u64::MAX));
        }
        // After a step back, timers fire early (harmless); measure from the new offset, so a
        // later step forward is seen from there.
        self.baseline_ms = self.baseline_ms.min(now);
        None
    }
}

fn offset_ms(clock: &dyn Clock) -> i128 {
    i128::from(clock.wall_ms()) - clock.monotonic().as_millis() as i128
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::ManualClock;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn time_passing_is_not_a_step() {
        let clock = ManualClock::new(10 * HOUR);
        let mut watch = ClockWatch::new(&clock);
        for _ in 0..100 {
            clock.advance(Duration::from_millis(997));
            assert_eq!(watch.stepped_forward(&clock), None);
        }
    }

    #[test]
    fn a_step_forward_is_reported_once() {
        let clock = ManualClock::new(10 * HOUR);
        let mut watch = ClockWatch::new(&clock);
        clock.advance(Duration::from_secs(1));
        clock.set_wall_ms(clock.wall_ms() + HOUR);
        assert_eq!(watch.stepped_forward(&clock), Some(HOUR));
        clock.advance(Duration::from_secs(1));
        assert_eq!(watch.stepped_forward(&clock), None);
    }

    #[test]
    fn a_step_back_is_not_reported_and_a_step_forward_after_it_is() {
        let clock = ManualClock::new(10 * HOUR);
        let mut watch = ClockWatch::new(&clock);
        clock.set_wall_ms(9 * HOUR);
        assert_eq!(watch.stepped_forward(&clock), None);
        // Back to where it was: timers set during the hour behind are now an hour late.
        clock.set_wall_ms(10 * HOUR);
        assert_eq!(watch.stepped_forward(&clock), Some(HOUR));
    }

    #[test]
    fn slow_drift_is_reported_once_it_adds_up() {
        let clock = ManualClock::new(10 * HOUR);
        let mut watch = ClockWatch::new(&clock);
        let mut reported = Vec::new();
        for second in 1..=60u64 {
            clock.advance(Duration::from_secs(1));
            // Half a millisecond a second faster than monotonic time.
            clock.set_wall_ms(10 * HOUR + second * 1_000 + second / 2);
            if let Some(step) = watch.stepped_forward(&clock) {
                reported.push((second, step));
            }
        }
        assert_eq!(reported, [(22, 11), (44, 11)]);
    }
}
