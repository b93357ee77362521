//! A repeated failure logged at a bounded rate.
//!
//! While the store is unreachable every delivery outcome and every claim fails the same way,
//! and while a webhook receiver is down every delivery to it does: one line per task would
//! bury the first, useful line under thousands of copies and cost a write each. A [`LogEvery`] lets the first occurrence through, then at most one per period,
//! and tells each line it lets through how many it held back since the last, so the log still
//! says how often it happened (the metrics count every one).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lets one occurrence in each `period` be logged. One per call site (usually a `static`), or
/// one per thing that fails on its own (a webhook sink has its own, so one queue's failing
/// receiver does not silence another's). The caller passes the time: this crate reads no
/// clock.
#[derive(Debug)]
pub struct LogEvery {
    period: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last_logged: Option<Instant>,
    held_back: u64,
}

impl LogEvery {
    pub const fn new(period: Duration) -> LogEvery {
        LogEvery {
            period,
            state: Mutex::new(State {
                last_logged: None,
                held_back: 0,
            }),
        }
    }

    /// Whether the occurrence at `now` is to be logged: `Some(n)` with the occurrences held
    /// back since the last one logged, or `None` to stay quiet.
    pub fn check(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means another thread panicked while counting: keep counting.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due = state
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.period);
        if due {
            state.last_logged = Some(now);
            Some(std::mem::take(&mut state.held_back))
        } else {
            state.held_back += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_occurrence_is_logged_then_one_per_period_with_the_count_held_back() {
        let every = LogEvery::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(every.check(t0), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(every.check(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(every.check(t0 + Duration::from_secs(10)), Some(3));
        assert_eq!(every.check(t0 + Duration::from_secs(11)), None);
        // A quiet spell: the next occurrence is logged at once, with what was held back.
        assert_eq!(every.check(t0 + Duration::from_secs(60)), Some(1));
        assert_eq!(every.check(t0 + Duration::from_secs(60)), None);
    }

    #[test]
    fn an_instant_before_the_last_logged_one_is_held_back_not_a_panic() {
        let every = LogEvery::new(Duration::from_secs(1));
        let t0 = Instant::now() + Duration::from_secs(5);
        assert_eq!(every.check(t0), Some(0));
        assert_eq!(every.check(t0 - Duration::from_secs(3)), None);
        assert_eq!(every.check(t0 + Duration::from_secs(1)), Some(1));
    }
}
