//! Retries of passing failures, for the calls that are safe to repeat.
//!
//! A call is sent again when it failed for a passing reason ([`Error::is_transient`]: `503
//! overloaded`, `503 store_unavailable` with `Retry-After`, `429 rate_limited`, `507
//! insufficient_storage`, `503 too_many_connections`, `503 shutting_down`, no connection, a
//! connection broken or timed out) and a repeat cannot do it twice
//! ([`crate::Request::is_safe_to_repeat`]). The wait before each repeat is the server's
//! `Retry-After` when it sent one, else an exponential backoff with jitter; both capped by
//! [`RetryPolicy::max_backoff`].

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use tokio::time::Instant;

use crate::request::{Repeat, Request};
use crate::{Answer, Client, Error, ErrorCode, Result};

/// How a [`Client`] retries a call that failed for a passing reason.
///
/// Retries are off by default ([`Client::new`]); [`Client::with_retries`] turns them on. Off,
/// because a retry changes what an answer means: after a call whose answer was lost, the
/// repeat of an ack may be refused as a stale lease although the first attempt worked (see
/// [`Error::OutcomeUnknown`]), a keyed submit may come back as its own `duplicate`, and a
/// command line tool or a test wants the server's first answer at once rather than seconds
/// later. Code that runs unattended (a producer in a service, a [`crate::Worker`]) should turn
/// them on: `RetryPolicy::default()` suits most.
///
/// Which calls are repeated: reads, `PUT`s (a queue's settings are set, not added to),
/// `DELETE`s, leases, acks, nacks, extends, pausing and resuming a queue, and submits (single or
/// batch) whose every task has an idempotency key. Never a submit without a key (a lost answer
/// would store the task twice), nor another `POST` that creates or changes something each
/// time, nor a streamed body (a task import, a bulk subscribe): it is read once and cannot be
/// sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included: 1 sends each call once.
    pub max_attempts: u32,
    /// The wait after the first failure without `Retry-After`; doubled after each further
    /// one (with jitter: each wait is drawn between half and all of it).
    pub initial_backoff: Duration,
    /// The longest wait between two attempts, `Retry-After` included: a server asking for more
    /// (a `507`'s 10 s, a slow token's minute) is asked again sooner.
    pub max_backoff: Duration,
    /// No attempt starts later than this after the first: a wait that would end past it is not
    /// begun, and the last failure is returned at once.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, backoff from 100 ms up to 10 s (a `507`'s `Retry-After` fits), within 30 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            max_elapsed: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failures`-th failure (1 for the first), told `Retry-After` or not.
    pub(crate) fn wait(&self, failures: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            // What the server asked, and up to a tenth more: clients refused together (a
            // burst) do not all come back in the same millisecond.
            Some(asked) => asked + asked.mul_f64(0.1 * rand::random::<f64>()),
            None => backoff(self.initial_backoff, failures, self.max_backoff),
        }
        .min(self.max_backoff)
    }
}

/// An exponential backoff with "equal jitter": `initial` doubled for each failure after the
/// first, capped at `max`, and drawn between half and all of it (so retries spread out, and
/// never come at once).
pub(crate) fn backoff(initial: Duration, failures: u32, max: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    let full = initial.saturating_mul(1 << doublings).min(max);
    full / 2 + (full / 2).mul_f64(rand::random::<f64>())
}

/// The `Retry-After` of an answer, in whole seconds (the server sends no HTTP date).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?;
    text.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Whether `answer`, to a later attempt of a call of kind `repeat`, is what a repeat of an
/// attempt that took effect would get.
fn answers_as_a_repeat(repeat: Repeat, answer: &Error) -> bool {
    let Error::Api { code, .. } = answer else {
        return false;
    };
    match repeat {
        Repeat::Lease => matches!(code, ErrorCode::LeaseExpired | ErrorCode::TaskNotFound),
        Repeat::Gone => {
            code.as_str().ends_with("_not_found")
                || matches!(code, ErrorCode::TaskNotScheduled | ErrorCode::TaskNotDead)
        }
        Repeat::Same | Repeat::Never => false,
    }
}

/// Sends `request` as `policy` says: again while it fails for a passing reason, is safe to
/// repeat, and the budget allows.
pub(crate) async fn send(
    client: &Client,
    policy: &RetryPolicy,
    request: &Request,
) -> Result<Answer> {
    let started = Instant::now();
    let mut attempts = 0;
    // The first failure after which the call may have taken effect.
    let mut earlier: Option<Error> = None;
    loop {
        attempts += 1;
        let error = match client.send_once(request).await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        if let Some(first) = earlier.take() {
            if answers_as_a_repeat(request.repeat, &error) {
                return Err(Error::OutcomeUnknown {
                    attempts,
                    earlier: Box::new(first),
                    answer: Box::new(error),
                });
            }
            earlier = Some(first);
        }
        if request.repeat == Repeat::Never
            || !error.is_transient()
            || attempts >= policy.max_attempts
        {
            return Err(error);
        }
        let wait = policy.wait(attempts, error.retry_after());
        if started.elapsed() + wait > policy.max_elapsed {
            return Err(error);
        }
        if earlier.is_none() && error.may_have_taken_effect() {
            earlier = Some(error);
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let initial = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for _ in 0..100 {
            let first = backoff(initial, 1, max);
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let third = backoff(initial, 3, max);
            assert!((200..=400).contains(&third.as_millis()), "{third:?}");
            let late = backoff(initial, 40, max);
            assert!((500..=1_000).contains(&late.as_millis()), "{late:?}");
        }
    }

    #[test]
    fn retry_after_is_waited_for_up_to_the_cap() {
        let policy = RetryPolicy {
            max_backoff: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(10),
            ..RetryPolicy::default()
        };
        for _ in 0..100 {
            let wait = policy.wait(1, Some(Duration::from_secs(2)));
            assert!(
                (2_000..=2_200).contains(&wait.as_millis()),
                "never sooner than asked, at most a tenth later: {wait:?}"
            );
            let capped = policy.wait(1, Some(Duration::from_secs(60)));
            assert_eq!(capped, Duration::from_secs(5));
        }
    }

    #[test]
    fn retry_after_reads_whole_seconds_only() {
        let read = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, value.parse().unwrap());
            retry_after(&headers)
        };
        assert_eq!(read("1"), Some(Duration::from_secs(1)));
        assert_eq!(read(" 10 "), Some(Duration::from_secs(10)));
        assert_eq!(read("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn only_stale_leases_and_missing_things_read_as_repeats() {
        let api = |code: ErrorCode| Error::Api {
            status: 409,
            code,
            message: String::new(),
            retry_after: None,
        };
        assert!(answers_as_a_repeat(
            Repeat::Lease,
            &api(ErrorCode::LeaseExpired)
        ));
        assert!(answers_as_a_repeat(
            Repeat::Lease,
            &api(ErrorCode::TaskNotFound)
        ));
        assert!(!answers_as_a_repeat(
            Repeat::Lease,
            &api(ErrorCode::QueueNotFound)
        ));
        assert!(answers_as_a_repeat(
            Repeat::Gone,
            &api(ErrorCode::QueueNotFound)
        ));
        assert!(answers_as_a_repeat(
            Repeat::Gone,
            &api(ErrorCode::TaskNotScheduled)
        ));
        assert!(!answers_as_a_repeat(
            Repeat::Gone,
            &api(ErrorCode::Forbidden)
        ));
        assert!(!answers_as_a_repeat(
            Repeat::Same,
            &api(ErrorCode::LeaseExpired)
        ));
    }
}
