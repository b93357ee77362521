//! Time, injected. Wall time decides when a task is due; monotonic time measures timeouts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, on the server's wall clock.
pub type UnixMs = u64;

/// The source of time for everything that schedules.
///
/// `wall_ms` is used for due times and lease deadlines (they must survive a restart, so they
/// are wall-clock instants). `monotonic` is used for durations measured inside one process.
pub trait Clock: Send + Sync + 'static {
    fn wall_ms(&self) -> UnixMs;
    fn monotonic(&self) -> Duration;
}

/// The real clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> UnixMs {
        // A clock before 1970 is treated as the epoch: nothing becomes due early because of it.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug, Default)]
struct ManualInner {
    wall_ms: AtomicU64,
    monotonic_ns: AtomicU64,
}

impl ManualClock {
    pub fn new(wall_ms: UnixMs) -> Self {
        let clock = ManualClock::default();
        clock.inner.wall_ms.store(wall_ms, Ordering::SeqCst);
        clock
    }

    /// Moves both clocks forward.
    pub fn advance(&self, by: Duration) {
        self.inner
            .wall_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.inner
            .monotonic_ns
            .fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the wall clock only (models an NTP step, forwards or backwards). Monotonic time
    /// does not move.
    pub fn set_wall_ms(&self, wall_ms: UnixMs) {
        self.inner.wall_ms.store(wall_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> UnixMs {
        self.inner.wall_ms.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.inner.monotonic_ns.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_wall_jump_leaves_monotonic_alone() {
        let clock = ManualClock::new(1_000);
        clock.advance(Duration::from_millis(5));
        assert_eq!(clock.wall_ms(), 1_005);
        assert_eq!(clock.monotonic(), Duration::from_millis(5));
        clock.set_wall_ms(10);
        assert_eq!(clock.wall_ms(), 10);
        assert_eq!(clock.monotonic(), Duration::from_millis(5));
    }

    #[test]
    fn clones_share_time() {
        let a = ManualClock::new(0);
        let b = a.clone();
        a.advance(Duration::from_secs(1));
        assert_eq!(b.wall_ms(), 1_000);
    }
}
