//! A queue's dispatch policy, and its persisted form.
//!
//! The store keeps a queue's configuration as opaque bytes. They are a versioned JSON record
//! defined here (not the API's DTO), so the HTTP contract and the on-disk format can change
//! independently.

use belfry_core::{LatePolicy, RetryPolicy};
use belfry_sinks::{SinkSpec, WebhookSpec};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Highest rate a queue may ask for; above it, "unlimited" (0) is the honest setting.
pub const RATE_PER_S_MAX: f64 = 10_000_000.0;
/// Lowest non-zero rate: one task every ~17 minutes. Slower rates would make the wait for the
/// next token longer than any timer we want to hold.
pub const RATE_PER_S_MIN: f64 = 0.001;
/// Largest token bucket.
pub const BURST_MAX: u32 = 10_000_000;
/// Largest concurrency limit.
pub const MAX_IN_FLIGHT_MAX: u32 = 1_000_000;
/// Webhook timeout bounds (the sink's own, so a queue config the server takes is one the sink
/// takes) and default.
pub const WEBHOOK_TIMEOUT_MS_MIN: u64 = belfry_sinks::webhook::TIMEOUT_MIN.as_millis() as u64;
pub const WEBHOOK_TIMEOUT_MS_MAX: u64 = belfry_sinks::webhook::TIMEOUT_MAX.as_millis() as u64;
pub const WEBHOOK_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest webhook URL and secret.
pub const WEBHOOK_URL_LEN_MAX: usize = 2048;
pub const WEBHOOK_SECRET_LEN_MAX: usize = 1024;

const _: () = assert!(WEBHOOK_TIMEOUT_MS_MIN <= WEBHOOK_TIMEOUT_MS_DEFAULT);
const _: () = assert!(WEBHOOK_TIMEOUT_MS_DEFAULT <= WEBHOOK_TIMEOUT_MS_MAX);

/// How a queue's due tasks leave the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Consumers lease tasks over the API.
    Pull,
    /// The dispatcher delivers each task through a sink (a webhook, a stream, ...).
    Push(SinkSpec),
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Tasks per second handed out (leases and webhook calls together); 0 means unlimited.
    pub rate_per_s: f64,
    /// Token bucket size; 0 means one second's worth of `rate_per_s` (at least 1).
    pub burst: u32,
    /// Leased tasks at once; 0 means unlimited for pull queues and the server default for
    /// push queues.
    pub max_in_flight: u32,
    pub retry: RetryPolicy,
    pub delivery: Delivery,
    /// A paused queue accepts tasks and delivers none.
    pub paused: bool,
    /// The late policy of tasks submitted without one.
    pub late_policy: LatePolicy,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            rate_per_s: 0.0,
            burst: 0,
            max_in_flight: 0,
            retry: RetryPolicy::default(),
            delivery: Delivery::Pull,
            paused: false,
            late_policy: LatePolicy::Fire,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidQueueConfig {
    pub field: &'static str,
    pub problem: String,
}

impl QueueConfig {
    pub fn validate(&self) -> Result<(), InvalidQueueConfig> {
        let fail = |field, problem: String| Err(InvalidQueueConfig { field, problem });
        let rate_ok =
            self.rate_per_s == 0.0 || (RATE_PER_S_MIN..=RATE_PER_S_MAX).contains(&self.rate_per_s);
        if !rate_ok {
            return fail(
                "rate_per_s",
                format!(
                    "must be 0 (unlimited) or between {RATE_PER_S_MIN} and {RATE_PER_S_MAX}, got {}",
                    self.rate_per_s
                ),
            );
        }
        if self.burst > BURST_MAX {
            return fail(
                "burst",
                format!("must be at most {BURST_MAX}, got {}", self.burst),
            );
        }
        if self.max_in_flight > MAX_IN_FLIGHT_MAX {
            return fail(
                "max_in_flight",
                format!(
                    "must be at most {MAX_IN_FLIGHT_MAX} (0 = unlimited), got {}",
                    self.max_in_flight
                ),
            );
        }
        if let Err(e) = self.retry.validate() {
            return fail("retry", e.to_string());
        }
        if let Delivery::Push(SinkSpec::Webhook(spec)) = &self.delivery {
            validate_webhook(spec)?;
        }
        Ok(())
    }

    /// The token bucket's size.
    pub fn effective_burst(&self) -> f64 {
        if self.burst > 0 {
            f64::from(self.burst)
        } else {
            self.rate_per_s.ceil().max(1.0)
        }
    }

    pub fn is_push(&self) -> bool {
        matches!(self.delivery, Delivery::Push(_))
    }

    /// The sink spec of a push queue.
    pub fn sink(&self) -> Option<&SinkSpec> {
        match &self.delivery {
            Delivery::Pull => None,
            Delivery::Push(spec) => Some(spec),
        }
    }

    pub fn encode(&self) -> Bytes {
        let record = Record::from(self);
        // Serialising plain numbers, strings and bools cannot fail.
        Bytes::from(serde_json::to_vec(&record).expect("queue record serialises"))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut record: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if !(RECORD_VERSION_WEBHOOK_ONLY..=RECORD_VERSION).contains(&record.v) {
            return Err(format!("unknown queue record version {}", record.v));
        }
        let late_policy = match record.late.take() {
            None => LatePolicy::Fire,
            Some(late) => match late.policy.as_str() {
                "skip" => LatePolicy::Skip {
                    after_ms: late.after_ms,
                },
                "dead" => LatePolicy::Dead {
                    after_ms: late.after_ms,
                },
                other => return Err(format!("unknown late policy {other:?} in queue record")),
            },
        };
        Ok(QueueConfig {
            late_policy,
            ..record.into()
        })
    }
}

/// A webhook delivery's fields; the error names the field (`delivery.headers` and the header,
/// never a value).
fn validate_webhook(spec: &WebhookSpec) -> Result<(), InvalidQueueConfig> {
    let fail = |field, problem: String| Err(InvalidQueueConfig { field, problem });
    let WebhookSpec {
        url,
        secret,
        previous_secret,
        headers,
        timeout_ms,
    } = spec;
    if url.is_empty() || url.len() > WEBHOOK_URL_LEN_MAX {
        return fail(
            "delivery.url",
            format!("must be 1 to {WEBHOOK_URL_LEN_MAX} characters"),
        );
    }
    if secret
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.len() > WEBHOOK_SECRET_LEN_MAX)
    {
        return fail(
            "delivery.secret",
            format!("must be 1 to {WEBHOOK_SECRET_LEN_MAX} characters when set"),
        );
    }
    if previous_secret
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.len() > WEBHOOK_SECRET_LEN_MAX)
    {
        return fail(
            "delivery.previous_secret",
            format!("must be 1 to {WEBHOOK_SECRET_LEN_MAX} characters when set"),
        );
    }
    if previous_secret.is_some() && secret.is_none() {
        return fail(
            "delivery.previous_secret",
            "is the secret being rotated out: give the new one as delivery.secret beside it"
                .to_owned(),
        );
    }
    // The rule of task and schedule headers, with the queue's own limits and no name twice.
    belfry_core::headers::check_queue_headers(
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    )
    .or_else(|problem| fail("delivery.headers", problem))?;
    if !(WEBHOOK_TIMEOUT_MS_MIN..=WEBHOOK_TIMEOUT_MS_MAX).contains(timeout_ms) {
        return fail(
            "delivery.timeout_ms",
            format!(
                "must be between {WEBHOOK_TIMEOUT_MS_MIN} and {WEBHOOK_TIMEOUT_MS_MAX}, got {timeout_ms}"
            ),
        );
    }
    Ok(())
}

/// Version 2 stores a push queue's sink spec in `delivery`. Version 1 knew only webhooks, in
/// `webhook`; it is still read. A binary that knows only version 1 refuses version 2 rather
/// than read a stream queue as a pull queue.
const RECORD_VERSION: u32 = 2;
const RECORD_VERSION_WEBHOOK_ONLY: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Record {
    v: u32,
    rate_per_s: f64,
    burst: u32,
    max_in_flight: u32,
    max_attempts: u32,
    backoff_initial_ms: u64,
    backoff_max_ms: u64,
    paused: bool,
    /// Version 1 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    webhook: Option<WebhookRecord>,
    /// Version 2: a push queue's sink spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery: Option<SinkSpec>,
    /// Added after version 1 shipped; absent means `fire`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    late: Option<LateRecord>,
}

#[derive(Serialize, Deserialize)]
struct LateRecord {
    /// "skip" or "dead".
    policy: String,
    after_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct WebhookRecord {
    url: String,
    secret: Option<String>,
    timeout_ms: u64,
}

impl From<&QueueConfig> for Record {
    fn from(c: &QueueConfig) -> Self {
        Record {
            v: RECORD_VERSION,
            rate_per_s: c.rate_per_s,
            burst: c.burst,
            max_in_flight: c.max_in_flight,
            max_attempts: c.retry.max_attempts,
            backoff_initial_ms: c.retry.backoff_initial_ms,
            backoff_max_ms: c.retry.backoff_max_ms,
            paused: c.paused,
            webhook: None,
            delivery: c.sink().cloned(),
            late: match c.late_policy {
                LatePolicy::Fire => None,
                LatePolicy::Skip { after_ms } => Some(LateRecord {
                    policy: "skip".into(),
                    after_ms,
                }),
                LatePolicy::Dead { after_ms } => Some(LateRecord {
                    policy: "dead".into(),
                    after_ms,
                }),
            },
        }
    }
}

impl From<Record> for QueueConfig {
    fn from(r: Record) -> Self {
        QueueConfig {
            rate_per_s: r.rate_per_s,
            burst: r.burst,
            max_in_flight: r.max_in_flight,
            retry: RetryPolicy {
                max_attempts: r.max_attempts,
                backoff_initial_ms: r.backoff_initial_ms,
                backoff_max_ms: r.backoff_max_ms,
            },
            delivery: match (r.delivery, r.webhook) {
                (Some(spec), _) => Delivery::Push(spec),
                (None, Some(w)) => Delivery::Push(SinkSpec::Webhook(WebhookSpec {
                    url: w.url,
                    secret: w.secret,
                    previous_secret: None,
                    headers: Default::default(),
                    timeout_ms: w.timeout_ms,
                })),
                (None, None) => Delivery::Pull,
            },
            paused: r.paused,
            // Set by `decode`, which can refuse an unknown policy.
            late_policy: LatePolicy::Fire,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let config = QueueConfig {
            rate_per_s: 2.5,
            burst: 7,
            max_in_flight: 3,
            retry: RetryPolicy {
                max_attempts: 4,
                backoff_initial_ms: 10,
                backoff_max_ms: 100,
            },
            delivery: Delivery::Push(SinkSpec::Webhook(WebhookSpec {
                url: "http://example.invalid/x".into(),
                secret: Some("s".into()),
                previous_secret: None,
                headers: [("Authorization".to_owned(), "Bearer b".to_owned())].into(),
                timeout_ms: 500,
            })),
            paused: true,
            late_policy: LatePolicy::Dead { after_ms: 9 },
        };
        assert_eq!(QueueConfig::decode(&config.encode()).unwrap(), config);
        assert!(QueueConfig::decode(b"{").is_err());
        // Records written before late policies existed read as `fire`; a policy this build
        // does not know is refused, not guessed.
        let old = br#"{"v":1,"rate_per_s":0.0,"burst":0,"max_in_flight":0,"max_attempts":1,"backoff_initial_ms":1,"backoff_max_ms":1,"paused":false,"webhook":null}"#;
        assert_eq!(
            QueueConfig::decode(old).unwrap().late_policy,
            LatePolicy::Fire
        );
        // A version 1 webhook record reads as a push queue with a webhook sink.
        let v1 = br#"{"v":1,"rate_per_s":0.0,"burst":0,"max_in_flight":0,"max_attempts":1,"backoff_initial_ms":1,"backoff_max_ms":1,"paused":false,"webhook":{"url":"http://h/x","secret":null,"timeout_ms":700}}"#;
        assert_eq!(
            QueueConfig::decode(v1).unwrap().delivery,
            Delivery::Push(SinkSpec::Webhook(WebhookSpec {
                url: "http://h/x".into(),
                secret: None,
                previous_secret: None,
                headers: Default::default(),
                timeout_ms: 700
            }))
        );
        assert!(QueueConfig::decode(br#"{"v":3}"#).is_err());
        let unknown = br#"{"v":1,"rate_per_s":0.0,"burst":0,"max_in_flight":0,"max_attempts":1,"backoff_initial_ms":1,"backoff_max_ms":1,"paused":false,"webhook":null,"late":{"policy":"maybe","after_ms":1}}"#;
        assert!(QueueConfig::decode(unknown).is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let check = |config: QueueConfig, field: Option<&str>| {
            assert_eq!(config.validate().err().map(|e| e.field), field);
        };
        check(QueueConfig::default(), None);
        check(
            QueueConfig {
                rate_per_s: -1.0,
                ..QueueConfig::default()
            },
            Some("rate_per_s"),
        );
        check(
            QueueConfig {
                rate_per_s: f64::NAN,
                ..QueueConfig::default()
            },
            Some("rate_per_s"),
        );
        check(
            QueueConfig {
                delivery: Delivery::Push(SinkSpec::Webhook(WebhookSpec {
                    url: "http://x".into(),
                    secret: None,
                    previous_secret: None,
                    headers: Default::default(),
                    timeout_ms: 0,
                })),
                ..QueueConfig::default()
            },
            Some("delivery.timeout_ms"),
        );
        let headers = |pairs: &[(&str, &str)]| QueueConfig {
            delivery: Delivery::Push(SinkSpec::Webhook(WebhookSpec {
                headers: pairs
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
                ..WebhookSpec::new("http://x")
            })),
            ..QueueConfig::default()
        };
        check(headers(&[("Authorization", "Bearer a")]), None);
        check(
            headers(&[("Content-Type", "text/plain")]),
            Some("delivery.headers"),
        );
        check(
            headers(&[("X-Env", "a"), ("x-env", "b")]),
            Some("delivery.headers"),
        );
    }

    #[test]
    fn burst_defaults_to_one_second_of_rate() {
        let c = |rate, burst| QueueConfig {
            rate_per_s: rate,
            burst,
            ..QueueConfig::default()
        };
        assert_eq!(c(5.0, 0).effective_burst(), 5.0);
        assert_eq!(c(0.5, 0).effective_burst(), 1.0);
        assert_eq!(c(5.0, 2).effective_burst(), 2.0);
    }
}
