//! The clock the simulated server is given.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{Clock, UnixMs};
use tokio::time::Instant;

/// Wall time is tokio's (paused, virtual) time plus an offset; monotonic time is tokio's
/// alone. So the server's timers, the sinks' latency and the wall clock move together when
/// virtual time advances, and a step (NTP, a VM migration) or a slow store call moves only
/// the wall clock, as it would in production.
#[derive(Clone)]
pub struct SimClock {
    inner: Arc<Inner>,
}

struct Inner {
    origin: Instant,
    offset_ms: AtomicI64,
}

impl SimClock {
    /// A clock reading `wall_ms` now. Call inside the (paused) runtime.
    pub fn new(wall_ms: UnixMs) -> Self {
        SimClock {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                offset_ms: AtomicI64::new(wall_ms as i64),
            }),
        }
    }

    /// Moves the wall clock by `by_ms` (either way); monotonic time does not move.
    pub fn step(&self, by_ms: i64) {
        self.inner.offset_ms.fetch_add(by_ms, Ordering::SeqCst);
    }

    pub fn now_ms(&self) -> UnixMs {
        self.wall_ms()
    }
}

impl Clock for SimClock {
    fn wall_ms(&self) -> UnixMs {
        let elapsed = self.monotonic().as_millis() as i64;
        // The simulation starts in 2026 and steps by hours: never below the epoch.
        (self.inner.offset_ms.load(Ordering::SeqCst) + elapsed).max(0) as UnixMs
    }

    fn monotonic(&self) -> Duration {
        Instant::now().saturating_duration_since(self.inner.origin)
    }
}
