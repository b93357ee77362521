//! Transient or permanent: the one place that decides whether a failed delivery is retried or
//! dead-lettered, for every sink.
//!
//! The backoff itself (exponential, capped, jittered) lives in `belfry_core::RetryPolicy`; this
//! module only says *whether* to retry and *how long the target asked us to wait*.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use belfry_core::UnixMs;

use crate::Outcome;

/// Longest wait a `Retry-After` may impose (1 hour). A receiver that asks for a day (or sends a
/// date years ahead by mistake) would otherwise park the task far beyond its retry policy;
/// past this cap the queue's own backoff and attempt limit take over.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60 * 60);

/// Longest `Retry-After` header value we try to parse. An IMF-fixdate is 29 bytes; anything
/// much longer is garbage and is ignored without parsing.
const RETRY_AFTER_LEN_MAX: usize = 64;

/// Longest reason kept in an [`Outcome`]. Reasons end up in dead-letter records and log lines,
/// so they are bounded whatever a receiver or an error chain produces.
pub const REASON_LEN_MAX: usize = 1024;

/// Cuts `reason` to at most [`REASON_LEN_MAX`] bytes, on a character boundary.
fn bounded(mut reason: String) -> String {
    if reason.len() > REASON_LEN_MAX {
        let mut end = REASON_LEN_MAX;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}

/// Parses a `Retry-After` header value (RFC 9110 §10.2.3): either a number of seconds or an
/// HTTP-date, which is turned into a delay from `now_ms`. A date in the past means "now"
/// (zero). The result is capped at [`RETRY_AFTER_MAX`]. Anything unparsable is `None`, and the
/// queue's own backoff applies.
pub fn parse_retry_after(value: &[u8], now_ms: UnixMs) -> Option<Duration> {
    if value.len() > RETRY_AFTER_LEN_MAX {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // All digits but too large for u64 is still "a very long time": cap it.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(RETRY_AFTER_MAX));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    let now = UNIX_EPOCH + Duration::from_millis(now_ms);
    let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(RETRY_AFTER_MAX))
}

/// Formats a wall-clock instant as an HTTP-date (for tests and for receivers' convenience).
pub fn format_http_date(at_ms: UnixMs) -> String {
    httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms))
}

/// Whether an HTTP status means "try again later".
///
/// 429 and every 5xx are transient by contract. 408 (Request Timeout) is too: the receiver
/// gave up waiting for our request, which is the same failure as our own timeout.
pub fn is_transient_status(status: u16) -> bool {
    status == 429 || status == 408 || (500..=599).contains(&status)
}

/// The outcome for an HTTP response status. `retry_after` is the raw `Retry-After` header,
/// honoured only for transient statuses. `detail` (may be empty) is appended to the reason so
/// a dead letter says what the receiver answered.
///
/// 3xx is a rejection: redirects are never followed (a redirect could point at an internal
/// address the target check never saw), so the queue must name the final URL.
pub fn classify_status(
    status: u16,
    retry_after: Option<&[u8]>,
    now_ms: UnixMs,
    detail: &str,
) -> Outcome {
    let mut reason = format!("HTTP {status}");
    if let Some(text) = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        reason.push(' ');
        reason.push_str(text);
    }
    if (300..=399).contains(&status) {
        reason.push_str(" (redirects are not followed; configure the final URL)");
    }
    if !detail.is_empty() {
        reason.push_str(": ");
        reason.push_str(detail);
    }
    let reason = bounded(reason);
    if (200..=299).contains(&status) {
        Outcome::Delivered
    } else if is_transient_status(status) {
        let after = retry_after.and_then(|value| parse_retry_after(value, now_ms));
        Outcome::Retry { after, reason }
    } else {
        Outcome::Reject { reason }
    }
}

/// A delivery that failed before any response arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// The per-request timeout expired (connecting, sending or waiting for the answer).
    Timeout,
    /// The connection could not be made or broke (refused, reset, DNS failure, TLS error).
    Connection,
    /// The target resolved to an address the target policy forbids (possible DNS rebinding).
    ForbiddenTarget,
    /// The request could not even be built from the task (a bug or a bad configuration).
    InvalidRequest,
}

/// The outcome for a delivery that got no response.
pub fn classify_transport(failure: TransportFailure, detail: &str) -> Outcome {
    let reason = |what: &str| {
        bounded(if detail.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {detail}")
        })
    };
    match failure {
        TransportFailure::Timeout => Outcome::Retry {
            after: None,
            reason: reason("timed out"),
        },
        TransportFailure::Connection => Outcome::Retry {
            after: None,
            reason: reason("connection failed"),
        },
        // Delivering to an internal address is exactly what the policy forbids; retrying would
        // only give a rebinding attacker more chances.
        TransportFailure::ForbiddenTarget => Outcome::Reject {
            reason: reason("forbidden target"),
        },
        TransportFailure::InvalidRequest => Outcome::Reject {
            reason: reason("invalid request"),
        },
    }
}

/// Redis error codes after which retrying a stream append cannot help: the key holds another
/// type, or the credentials or ACLs refuse us. Everything else a Redis server answers (`ERR max
/// number of clients reached`, `LOADING`, `OOM`, `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `READONLY` during a failover...) can pass, so it is retried, and the queue's
/// attempt limit still ends a hopeless case.
const REDIS_PERMANENT_CODES: &[&str] = &["WRONGTYPE", "NOAUTH", "WRONGPASS", "NOPERM"];

/// The outcome for an error reply (or handshake failure) from Redis, by its error code (the
/// first word of the reply), `authentication` when the handshake itself was refused.
pub fn classify_redis_error(code: Option<&str>, authentication: bool, detail: &str) -> Outcome {
    let permanent = authentication || code.is_some_and(|c| REDIS_PERMANENT_CODES.contains(&c));
    let reason = bounded(match code {
        Some(code) => format!("redis error {code}: {detail}"),
        None => format!("redis error: {detail}"),
    });
    if permanent {
        Outcome::Reject { reason }
    } else {
        Outcome::Retry {
            after: None,
            reason,
        }
    }
}

/// How a NATS JetStream publish failed, as the NATS sink saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsFailure {
    /// No connection could be made, or it broke while the publish was in flight.
    Connection,
    /// No PubAck within the limit (a slow or stopped server, or a reconnect in progress).
    Timeout,
    /// The server refused our credentials.
    Authorization,
    /// No stream captures the subject ("no responders"). Retried: a stream being created,
    /// or JetStream starting after a server restart, answers so too, and a dead letter at the
    /// first attempt emptied a queue into its dead letters during a restart (nats.go's own
    /// publish retries it as well). A subject no stream will ever capture runs out of
    /// attempts.
    NoStream,
    /// The message is larger than the server's `max_payload`; the server would close the
    /// connection rather than take it.
    TooLarge,
    /// The stream answered with a JetStream API error code.
    Api(u64),
    /// The publish could not be built (an invalid subject or header).
    InvalidRequest,
}

/// JetStream API error codes after which publishing the same message again cannot succeed
/// (nats-server's `errors.json`): 10054 the message exceeds the stream's maximum message size
/// (`JSStreamMessageExceedsMaximumErr`), 10060 expected stream does not match
/// (`JSStreamNotMatchErr`), 10070 and 10071 a failed expected-last-id or -sequence check
/// (`JSStreamWrongLastMsgIDErrF`, `JSStreamWrongLastSequenceErrF`), 10109 the stream is sealed
/// (`JSStreamSealedErr`, "invalid operation on sealed stream": a sealed stream never takes a
/// message again). Every other API error (insufficient resources, store failures, leader
/// elections) can pass and is retried.
const NATS_PERMANENT_API_CODES: &[u64] = &[10054, 10060, 10070, 10071, 10109];

/// The outcome for a failed JetStream publish.
pub fn classify_nats_failure(failure: NatsFailure, detail: &str) -> Outcome {
    let reason = |what: &str| {
        bounded(if detail.is_empty() {
            format!("nats: {what}")
        } else {
            format!("nats: {what}: {detail}")
        })
    };
    match failure {
        NatsFailure::Connection => classify_transport(TransportFailure::Connection, detail),
        NatsFailure::Timeout => classify_transport(TransportFailure::Timeout, detail),
        NatsFailure::Authorization => Outcome::Reject {
            reason: reason("authorization refused"),
        },
        NatsFailure::NoStream => Outcome::Retry {
            after: None,
            reason: reason("no JetStream stream captures the subject (yet)"),
        },
        NatsFailure::TooLarge => Outcome::Reject {
            reason: reason("message too large"),
        },
        NatsFailure::Api(code) if NATS_PERMANENT_API_CODES.contains(&code) => Outcome::Reject {
            reason: reason(&format!("JetStream error {code}")),
        },
        NatsFailure::Api(code) => Outcome::Retry {
            after: None,
            reason: reason(&format!("JetStream error {code}")),
        },
        NatsFailure::InvalidRequest => classify_transport(TransportFailure::InvalidRequest, detail),
    }
}

/// Kafka protocol errors (by rskafka's name for them) after which producing the same record
/// again cannot help: the topic is invalid, the record or batch is too large
/// or invalid, authorization or SASL authentication failed, the broker refuses the request's
/// shape. Everything else (not the leader, not enough replicas, request timed out, network
/// errors, throttling) is transient in Kafka's own terms and retried.
/// A topic not (yet) in the metadata, `UnknownTopicOrPartition`, is retried, as Kafka's own
/// producers do: a topic being created, or a partition whose leader is moving, answers so.
const KAFKA_PERMANENT_ERRORS: &[&str] = &[
    "InvalidTopicException",
    "MessageTooLarge",
    "RecordListTooLarge",
    "InvalidRecord",
    "InvalidRequiredAcks",
    "TopicAuthorizationFailed",
    "ClusterAuthorizationFailed",
    "SaslAuthenticationFailed",
    "UnsupportedSaslMechanism",
    "IllegalSaslState",
    "UnsupportedVersion",
    "UnsupportedForMessageFormat",
    "PolicyViolation",
];

/// How a Kafka produce failed, as the Kafka sink saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaFailure<'a> {
    /// No broker could be reached, or the connection broke mid-request.
    Connection,
    /// No acknowledgement within the limit.
    Timeout,
    /// The broker answered with this protocol error (rskafka's name for it).
    Broker(&'a str),
    /// SASL authentication was refused.
    Authentication,
    /// The topic is not in the cluster's metadata (yet: retried, see above).
    UnknownTopic,
    /// The record could not be built (a key the spec cannot take, for instance).
    InvalidRequest,
}

/// The outcome for a failed Kafka produce.
pub fn classify_kafka_failure(failure: KafkaFailure<'_>, detail: &str) -> Outcome {
    let reason = |what: &str| {
        bounded(if detail.is_empty() {
            format!("kafka: {what}")
        } else {
            format!("kafka: {what}: {detail}")
        })
    };
    match failure {
        KafkaFailure::Connection => classify_transport(TransportFailure::Connection, detail),
        KafkaFailure::Timeout => classify_transport(TransportFailure::Timeout, detail),
        KafkaFailure::Authentication => Outcome::Reject {
            reason: reason("authentication refused"),
        },
        KafkaFailure::UnknownTopic => Outcome::Retry {
            after: None,
            reason: reason("unknown topic (not in the cluster's metadata yet)"),
        },
        KafkaFailure::Broker(name) if KAFKA_PERMANENT_ERRORS.contains(&name) => Outcome::Reject {
            reason: reason(&format!("broker error {name}")),
        },
        KafkaFailure::Broker(name) => Outcome::Retry {
            after: None,
            reason: reason(&format!("broker error {name}")),
        },
        KafkaFailure::InvalidRequest => {
            classify_transport(TransportFailure::InvalidRequest, detail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2015-10-21T07:28:00Z, the instant in RFC 9110's example date.
    const RFC_EXAMPLE_MS: UnixMs = 1_445_412_480_000;

    #[test]
    fn retry_after_values() {
        let check = |input: &str, now_ms: UnixMs, expected: Option<u64>| {
            assert_eq!(
                parse_retry_after(input.as_bytes(), now_ms),
                expected.map(Duration::from_millis),
                "Retry-After {input:?} at {now_ms}"
            );
        };
        // Seconds.
        check("0", 0, Some(0));
        check("7", 0, Some(7_000));
        check(" 120 ", 0, Some(120_000));
        check("3600", 0, Some(3_600_000));
        check("3601", 0, Some(3_600_000));
        check("99999999999999999999999", 0, Some(3_600_000));
        // Not a number of seconds nor a date.
        check("", 0, None);
        check("   ", 0, None);
        check("-5", 0, None);
        check("1.5", 0, None);
        check("+5", 0, None);
        check("soon", 0, None);
        check("5 seconds", 0, None);
        check(&"9".repeat(65), 0, None);
        // HTTP-date in its three forms, 90 s after "now".
        let now = RFC_EXAMPLE_MS - 90_000;
        check("Wed, 21 Oct 2015 07:28:00 GMT", now, Some(90_000));
        check("Wednesday, 21-Oct-15 07:28:00 GMT", now, Some(90_000));
        check("Wed Oct 21 07:28:00 2015", now, Some(90_000));
        // A date in the past means now; a date far ahead is capped.
        check(
            "Wed, 21 Oct 2015 07:28:00 GMT",
            RFC_EXAMPLE_MS + 5_000,
            Some(0),
        );
        check("Wed, 21 Oct 2015 07:28:00 GMT", RFC_EXAMPLE_MS, Some(0));
        check("Wed, 21 Oct 2015 07:28:00 GMT", 0, Some(3_600_000));
        // Sub-second "now": the date is whole seconds, the wait is exact to the millisecond.
        check(
            "Wed, 21 Oct 2015 07:28:00 GMT",
            RFC_EXAMPLE_MS - 1_500,
            Some(1_500),
        );
        // Broken dates.
        check("Wed, 32 Oct 2015 07:28:00 GMT", 0, None);
        check("Wed, 21 Oct 2015 07:28:00", 0, None);
    }

    proptest::proptest! {
        #[test]
        fn retry_after_is_bounded_for_any_bytes(value: Vec<u8>, now_ms in 0u64..4_102_444_800_000) {
            if let Some(wait) = parse_retry_after(&value, now_ms) {
                proptest::prop_assert!(wait <= RETRY_AFTER_MAX);
            }
        }

        #[test]
        fn retry_after_seconds_round_trip(seconds in 0u64..10_000_000) {
            let expected = Duration::from_secs(seconds).min(RETRY_AFTER_MAX);
            proptest::prop_assert_eq!(
                parse_retry_after(seconds.to_string().as_bytes(), 0),
                Some(expected)
            );
        }

        /// A date `ahead_s` seconds after a whole-second "now" waits exactly that long (capped).
        #[test]
        fn retry_after_dates_round_trip(now_s in 0u64..4_000_000_000, ahead_s in 0u64..10_000) {
            let now_ms = now_s * 1000;
            let date = format_http_date(now_ms + ahead_s * 1000);
            proptest::prop_assert_eq!(
                parse_retry_after(date.as_bytes(), now_ms),
                Some(Duration::from_secs(ahead_s).min(RETRY_AFTER_MAX))
            );
        }

        /// Every status maps to exactly the outcome the contract names.
        #[test]
        fn every_status_follows_the_contract(status in 0u16..1000) {
            let expected = match status {
                200..=299 => Expected::Delivered,
                408 | 429 | 500..=599 => Expected::Retry(None),
                _ => Expected::Reject,
            };
            proptest::prop_assert_eq!(project(&classify_status(status, None, 0, "")), expected);
        }
    }

    #[test]
    fn retry_after_rejects_non_utf8() {
        assert_eq!(parse_retry_after(&[0xff, b'5'], 0), None);
    }

    #[test]
    fn formats_http_dates_that_parse_back() {
        assert_eq!(
            format_http_date(RFC_EXAMPLE_MS),
            "Wed, 21 Oct 2015 07:28:00 GMT"
        );
        let now = RFC_EXAMPLE_MS - 30_000;
        assert_eq!(
            parse_retry_after(format_http_date(RFC_EXAMPLE_MS).as_bytes(), now),
            Some(Duration::from_secs(30))
        );
    }

    /// What a status should map to, without the free-text reason.
    #[derive(Debug, PartialEq, Eq)]
    enum Expected {
        Delivered,
        Retry(Option<u64>),
        Reject,
    }

    fn project(outcome: &Outcome) -> Expected {
        match outcome {
            Outcome::Delivered => Expected::Delivered,
            Outcome::Retry { after, .. } => Expected::Retry(after.map(|d| d.as_secs())),
            Outcome::Reject { .. } => Expected::Reject,
        }
    }

    #[test]
    fn status_classification() {
        let check = |status: u16, retry_after: Option<&str>, expected: Expected| {
            let outcome = classify_status(status, retry_after.map(str::as_bytes), 0, "");
            assert_eq!(
                project(&outcome),
                expected,
                "status {status} Retry-After {retry_after:?}: {outcome:?}"
            );
        };
        use Expected::*;
        check(200, None, Delivered);
        check(201, None, Delivered);
        check(202, None, Delivered);
        check(204, None, Delivered);
        check(299, None, Delivered);
        check(200, Some("30"), Delivered);
        check(429, None, Retry(None));
        check(429, Some("30"), Retry(Some(30)));
        check(429, Some("garbage"), Retry(None));
        check(429, Some("86400"), Retry(Some(3600)));
        check(500, None, Retry(None));
        check(502, None, Retry(None));
        check(503, Some("5"), Retry(Some(5)));
        check(504, None, Retry(None));
        check(599, None, Retry(None));
        check(408, None, Retry(None));
        check(400, None, Reject);
        check(401, None, Reject);
        check(403, None, Reject);
        check(404, Some("30"), Reject);
        check(410, None, Reject);
        check(413, None, Reject);
        check(422, None, Reject);
        check(499, None, Reject);
        check(301, None, Reject);
        check(302, Some("5"), Reject);
        check(307, None, Reject);
        check(308, None, Reject);
        check(100, None, Reject);
        check(600, None, Reject);
    }

    #[test]
    fn reasons_name_the_status_and_the_detail() {
        let check = |status: u16, detail: &str, expected: &str| {
            let reason = match classify_status(status, None, 0, detail) {
                Outcome::Delivered => String::new(),
                Outcome::Retry { reason, .. } | Outcome::Reject { reason } => reason,
            };
            assert_eq!(reason, expected);
        };
        check(404, "", "HTTP 404 Not Found");
        check(
            503,
            "down for maintenance",
            "HTTP 503 Service Unavailable: down for maintenance",
        );
        check(
            302,
            "",
            "HTTP 302 Found (redirects are not followed; configure the final URL)",
        );
        check(599, "x", "HTTP 599: x");
    }

    #[test]
    fn reasons_are_bounded_on_a_character_boundary() {
        let long = "é".repeat(REASON_LEN_MAX);
        for outcome in [
            classify_status(500, None, 0, &long),
            classify_status(404, None, 0, &long),
            classify_transport(TransportFailure::Connection, &long),
        ] {
            let (Outcome::Retry { reason, .. } | Outcome::Reject { reason }) = outcome else {
                panic!("not a failure");
            };
            assert!(reason.len() <= REASON_LEN_MAX && reason.len() > REASON_LEN_MAX - 4);
            assert!(reason.ends_with('é'), "{reason}");
        }
    }

    #[test]
    fn redis_error_classification() {
        let check = |code: Option<&str>, authentication: bool, expected: Expected| {
            let outcome = classify_redis_error(code, authentication, "detail");
            assert_eq!(project(&outcome), expected, "{code:?} {authentication}");
        };
        check(Some("WRONGTYPE"), false, Expected::Reject);
        check(Some("NOAUTH"), false, Expected::Reject);
        check(Some("WRONGPASS"), false, Expected::Reject);
        check(Some("NOPERM"), false, Expected::Reject);
        check(None, true, Expected::Reject);
        check(Some("ERR"), false, Expected::Retry(None));
        check(Some("OOM"), false, Expected::Retry(None));
        check(Some("LOADING"), false, Expected::Retry(None));
        check(Some("BUSY"), false, Expected::Retry(None));
        check(Some("READONLY"), false, Expected::Retry(None));
        check(Some("CLUSTERDOWN"), false, Expected::Retry(None));
        check(Some("wrongtype"), false, Expected::Retry(None));
        check(None, false, Expected::Retry(None));
        assert_eq!(
            classify_redis_error(Some("OOM"), false, "over maxmemory"),
            Outcome::Retry {
                after: None,
                reason: "redis error OOM: over maxmemory".into()
            }
        );
    }

    #[test]
    fn transport_classification() {
        let check = |failure: TransportFailure, expected: Expected| {
            assert_eq!(
                project(&classify_transport(failure, "detail")),
                expected,
                "{failure:?}"
            );
        };
        check(TransportFailure::Timeout, Expected::Retry(None));
        check(TransportFailure::Connection, Expected::Retry(None));
        check(TransportFailure::ForbiddenTarget, Expected::Reject);
        check(TransportFailure::InvalidRequest, Expected::Reject);
        assert_eq!(
            classify_transport(TransportFailure::Timeout, ""),
            Outcome::Retry {
                after: None,
                reason: "timed out".into()
            }
        );
    }

    #[test]
    fn nats_failure_classification() {
        let check = |failure: NatsFailure, expected: Expected| {
            assert_eq!(
                project(&classify_nats_failure(failure, "d")),
                expected,
                "{failure:?}"
            );
        };
        check(NatsFailure::Connection, Expected::Retry(None));
        check(NatsFailure::Timeout, Expected::Retry(None));
        check(NatsFailure::Authorization, Expected::Reject);
        check(NatsFailure::NoStream, Expected::Retry(None));
        check(NatsFailure::TooLarge, Expected::Reject);
        check(NatsFailure::Api(10054), Expected::Reject);
        check(NatsFailure::Api(10023), Expected::Retry(None));
        check(NatsFailure::InvalidRequest, Expected::Reject);
    }

    #[test]
    fn kafka_failure_classification() {
        let check = |failure: KafkaFailure<'_>, expected: Expected| {
            assert_eq!(
                project(&classify_kafka_failure(failure, "d")),
                expected,
                "{failure:?}"
            );
        };
        check(KafkaFailure::Connection, Expected::Retry(None));
        check(KafkaFailure::Timeout, Expected::Retry(None));
        check(KafkaFailure::Authentication, Expected::Reject);
        check(KafkaFailure::UnknownTopic, Expected::Retry(None));
        check(KafkaFailure::Broker("MessageTooLarge"), Expected::Reject);
        check(
            KafkaFailure::Broker("UnknownTopicOrPartition"),
            Expected::Retry(None),
        );
        check(
            KafkaFailure::Broker("NotLeaderOrFollower"),
            Expected::Retry(None),
        );
        check(
            KafkaFailure::Broker("NotEnoughReplicas"),
            Expected::Retry(None),
        );
        check(
            KafkaFailure::Broker("RequestTimedOut"),
            Expected::Retry(None),
        );
        check(KafkaFailure::InvalidRequest, Expected::Reject);
    }
}
