//! Retry policy: how many attempts, and capped exponential backoff with jitter.

use std::time::Duration;

use crate::limits::{RETRY_ATTEMPTS_MAX, RETRY_BACKOFF_MS_MAX};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total delivery attempts, the first included. 1 means no retry.
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            backoff_initial_ms: 1_000,
            backoff_max_ms: 10 * 60 * 1_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRetryPolicy {
    #[error("retry.max_attempts must be between 1 and {RETRY_ATTEMPTS_MAX}, got {0}")]
    Attempts(u32),
    #[error("retry.backoff_initial_ms ({initial}) must not exceed retry.backoff_max_ms ({max})")]
    Order { initial: u64, max: u64 },
    #[error("retry.backoff_max_ms must be at most {RETRY_BACKOFF_MS_MAX} (30 days), got {0}")]
    TooLong(u64),
}

impl RetryPolicy {
    pub fn validate(&self) -> Result<(), InvalidRetryPolicy> {
        if self.max_attempts == 0 || self.max_attempts > RETRY_ATTEMPTS_MAX {
            return Err(InvalidRetryPolicy::Attempts(self.max_attempts));
        }
        if self.backoff_initial_ms > self.backoff_max_ms {
            return Err(InvalidRetryPolicy::Order {
                initial: self.backoff_initial_ms,
                max: self.backoff_max_ms,
            });
        }
        if self.backoff_max_ms > RETRY_BACKOFF_MS_MAX {
            return Err(InvalidRetryPolicy::TooLong(self.backoff_max_ms));
        }
        Ok(())
    }

    /// Whether a task that has made `attempts` deliveries may be tried again.
    pub fn allows_another(&self, attempts: u32) -> bool {
        attempts < self.max_attempts
    }

    /// The delay before the next attempt after `attempts` failed ones (attempts >= 1).
    ///
    /// Exponential (initial × 2^(attempts−1)), capped at `backoff_max_ms`, then "equal jitter":
    /// the result lies in [half, full] of that value, so retries of many tasks that failed
    /// together spread out but never come back sooner than half the backoff. `jitter` is a
    /// uniform random number in [0, 1) supplied by the caller, so this stays deterministic.
    /// A server's `Retry-After` wins when it asks for longer. Nothing is longer than
    /// [`RETRY_BACKOFF_MS_MAX`], whatever a policy stored before that bound says.
    pub fn backoff(&self, attempts: u32, jitter: f64, retry_after: Option<Duration>) -> Duration {
        let exponent = attempts.saturating_sub(1).min(63);
        let cap_ms = self.backoff_max_ms.min(RETRY_BACKOFF_MS_MAX);
        let raw = self
            .backoff_initial_ms
            .saturating_mul(1u64.checked_shl(exponent).unwrap_or(u64::MAX))
            .min(cap_ms);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let half = raw / 2;
        let ms = half + ((raw - half) as f64 * jitter) as u64;
        let backoff = Duration::from_millis(ms);
        match retry_after {
            Some(asked) if asked > backoff => asked.min(Duration::from_millis(cap_ms.max(ms))),
            _ => backoff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
        }
    }

    #[test]
    fn grows_then_caps() {
        let p = policy();
        let full: Vec<u64> = (1..=6)
            .map(|a| p.backoff(a, 0.999_999, None).as_millis() as u64)
            .collect();
        assert_eq!(full, vec![99, 199, 399, 799, 999, 999]);
        let low: Vec<u64> = (1..=6)
            .map(|a| p.backoff(a, 0.0, None).as_millis() as u64)
            .collect();
        assert_eq!(low, vec![50, 100, 200, 400, 500, 500]);
    }

    #[test]
    fn retry_after_wins_when_longer_but_stays_capped() {
        let p = policy();
        assert_eq!(
            p.backoff(1, 0.0, Some(Duration::from_millis(700))),
            Duration::from_millis(700)
        );
        assert_eq!(
            p.backoff(1, 0.0, Some(Duration::from_secs(3600))),
            Duration::from_millis(1_000)
        );
        assert_eq!(
            p.backoff(4, 0.0, Some(Duration::from_millis(10))),
            Duration::from_millis(400)
        );
    }

    #[test]
    fn attempts_and_validation() {
        let p = policy();
        assert!(p.allows_another(4));
        assert!(!p.allows_another(5));
        assert!(p.validate().is_ok());
        assert!(RetryPolicy {
            max_attempts: 0,
            ..p
        }
        .validate()
        .is_err());
        assert!(RetryPolicy {
            backoff_initial_ms: 2_000,
            ..p
        }
        .validate()
        .is_err());
        // Retries are never parked past a month: they would wait for good without a word.
        let month = RetryPolicy {
            backoff_initial_ms: 1_000,
            backoff_max_ms: RETRY_BACKOFF_MS_MAX,
            ..p
        };
        assert!(month.validate().is_ok());
        let past = RetryPolicy {
            backoff_max_ms: RETRY_BACKOFF_MS_MAX + 1,
            ..month
        };
        assert_eq!(
            past.validate(),
            Err(InvalidRetryPolicy::TooLong(RETRY_BACKOFF_MS_MAX + 1))
        );
        // A policy stored before the bound is held to it.
        let stored = RetryPolicy {
            backoff_initial_ms: u64::MAX,
            backoff_max_ms: u64::MAX,
            ..p
        };
        let longest = Duration::from_millis(RETRY_BACKOFF_MS_MAX);
        assert_eq!(stored.backoff(1, 1.0, None), longest);
        assert_eq!(stored.backoff(1, 0.0, Some(Duration::MAX)), longest);
    }

    proptest! {
        #[test]
        fn backoff_is_within_half_and_full(attempts in 1u32..200, jitter in 0.0f64..1.0, init in 0u64..10_000, extra in 0u64..1_000_000) {
            let p = RetryPolicy { max_attempts: 1_000, backoff_initial_ms: init, backoff_max_ms: init + extra };
            let d = p.backoff(attempts, jitter, None).as_millis() as u64;
            prop_assert!(d <= p.backoff_max_ms);
            let raw = init.saturating_mul(1u64.checked_shl(attempts - 1).unwrap_or(u64::MAX)).min(p.backoff_max_ms);
            prop_assert!(d >= raw / 2);
        }
    }
}
