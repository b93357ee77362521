//! A token bucket per queue, driven by the injected monotonic clock.

use std::time::Duration;

#[derive(Debug)]
pub struct TokenBucket {
    tokens: f64,
    /// Monotonic instant of the last refill.
    last: Duration,
}

impl TokenBucket {
    /// A full bucket: a new queue may hand out its whole burst at once.
    pub fn new(burst: f64, now: Duration) -> Self {
        TokenBucket {
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, rate_per_s: f64, burst: f64, now: Duration) {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * rate_per_s).min(burst);
    }

    /// Takes up to `want` whole tokens and returns how many it took. `rate_per_s == 0` means
    /// unlimited.
    pub fn take(&mut self, rate_per_s: f64, burst: f64, now: Duration, want: usize) -> usize {
        if rate_per_s <= 0.0 {
            return want;
        }
        self.refill(rate_per_s, burst, now);
        let granted = (self.tokens.floor().max(0.0) as usize).min(want);
        self.tokens -= granted as f64;
        granted
    }

    /// Gives back tokens taken but not used (a claim found fewer due tasks than granted).
    pub fn refund(&mut self, rate_per_s: f64, burst: f64, count: usize) {
        if rate_per_s > 0.0 {
            self.tokens = (self.tokens + count as f64).min(burst);
        }
    }

    /// How long until one whole token is available (zero if one already is).
    pub fn time_to_token(&self, rate_per_s: f64) -> Duration {
        if rate_per_s <= 0.0 || self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        // Saturates rather than panics on an absurd rate; callers cap their sleeps anyway.
        Duration::try_from_secs_f64((1.0 - self.tokens) / rate_per_s).unwrap_or(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_burst_then_rate() {
        let ms = Duration::from_millis;
        let mut b = TokenBucket::new(5.0, ms(0));
        assert_eq!(b.take(5.0, 5.0, ms(0), 100), 5);
        assert_eq!(b.take(5.0, 5.0, ms(0), 100), 0);
        assert_eq!(b.time_to_token(5.0), ms(200));
        assert_eq!(b.take(5.0, 5.0, ms(199), 100), 0);
        assert_eq!(b.take(5.0, 5.0, ms(200), 100), 1);
        // A long pause refills only up to the burst.
        assert_eq!(b.take(5.0, 5.0, ms(60_000), 100), 5);
        b.refund(5.0, 5.0, 3);
        assert_eq!(b.take(5.0, 5.0, ms(60_000), 2), 2);
        assert_eq!(b.take(0.0, 5.0, ms(60_000), 1000), 1000);
    }
}
