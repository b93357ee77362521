//! A webhook queue's fixed headers (`delivery.headers`): a credential for an API gateway in
//! front of the receiver (`Authorization: Bearer …`, `X-Api-Key`) and markers such as
//! `X-Env`, set by the queue's operator and added to every attempt.
//!
//! - They replace a task header of the same name (names compared without regard to case):
//!   the operator's configuration is authoritative, a producer cannot override the
//!   credential the gateway checks.
//! - They go to the queue's own URL, and to a task's own `target` only when it has the same
//!   origin (scheme, host and port) as the queue's URL. A task's target is chosen by whoever
//!   may submit to the queue (a `produce:` token), not by the queue's operator; sending the
//!   queue's credential to any URL a producer names would hand it to that producer. Browsers
//!   and HTTP clients drop `Authorization` on a redirect to another origin for the same reason.
//! - They are not signed: the signatures cover the body, the timestamp and the task id only.
//! - Their values are never shown: not by the API (names only), not in `Debug`, not in logs;
//!   each value is marked sensitive on the request as well.

use std::collections::BTreeMap;
use std::fmt;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Url;

use crate::SinkError;

/// The fixed headers, checked and ready to put on a request.
#[derive(Clone, Default)]
pub(super) struct FixedHeaders(Vec<(HeaderName, HeaderValue)>);

impl FixedHeaders {
    /// Checks `given` with the rule the API applies ([`belfry_core::headers::check_queue_headers`])
    /// and parses it; the error names `delivery.headers` and the header, never a value.
    pub(super) fn new(given: &BTreeMap<String, String>) -> Result<Self, SinkError> {
        let invalid = |reason: String| SinkError::InvalidDelivery {
            field: "headers",
            reason,
        };
        belfry_core::headers::check_queue_headers(
            given.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        )
        .map_err(invalid)?;
        let mut parsed = Vec::with_capacity(given.len());
        for (name, value) in given {
            // The check above accepts only what HTTP can carry; these cannot fail after it,
            // and would be refused (never dropped) if they did.
            let header_name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| invalid(format!("header {name:?} is not a valid HTTP name")))?;
            let mut header_value = HeaderValue::from_str(value)
                .map_err(|_| invalid(format!("header {name:?}: the value is not valid HTTP")))?;
            header_value.set_sensitive(true);
            parsed.push((header_name, header_value));
        }
        Ok(FixedHeaders(parsed))
    }

    /// Puts them on a request's headers, replacing every value of a task header of the same
    /// name.
    pub(super) fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.0 {
            headers.insert(name.clone(), value.clone());
        }
    }
}

impl FixedHeaders {
    /// `text` (what a receiver answered) with every fixed header's value replaced by
    /// `<redacted>`: a receiver or gateway that echoes the request's headers in an error must
    /// not put the queue's credential into a dead letter's reason or a log line. Values
    /// shorter than 4 bytes are left: they are no secret, and would blot out common words.
    pub(super) fn redact(&self, mut text: String) -> String {
        for (_, value) in &self.0 {
            let Ok(value) = value.to_str() else {
                continue;
            };
            if value.len() >= REDACT_LEN_MIN && text.contains(value) {
                text = text.replace(value, "<redacted>");
            }
        }
        text
    }
}

/// Fixed header values shorter than this are not redacted from answers (see
/// [`FixedHeaders::redact`]).
const REDACT_LEN_MIN: usize = 4;

/// Whether a request to `url` gets the queue's fixed headers: the queue's own URL, or a
/// task's target of the same origin as it.
pub(super) fn trusted(queue_url: &Url, url: &Url) -> bool {
    url.origin() == queue_url.origin()
}

/// Names only: the values are credentials.
impl fmt::Debug for FixedHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name.as_str()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn they_replace_task_headers_of_the_same_name_in_any_case() {
        let fixed = FixedHeaders::new(&given(&[
            ("Authorization", "Bearer queue"),
            ("X-Env", "prod"),
        ]))
        .expect("valid headers");
        let mut headers = HeaderMap::new();
        headers.append("authorization", HeaderValue::from_static("Bearer task"));
        headers.append("x-env", HeaderValue::from_static("dev"));
        headers.append("x-env", HeaderValue::from_static("test"));
        headers.append("x-trace", HeaderValue::from_static("t1"));
        fixed.apply(&mut headers);
        let all = |name: &str| -> Vec<&str> {
            let values = headers.get_all(name).iter();
            values.map(|v| v.to_str().expect("ascii")).collect()
        };
        assert_eq!(all("authorization"), ["Bearer queue"]);
        assert_eq!(all("x-env"), ["prod"]);
        assert_eq!(all("x-trace"), ["t1"]);
        assert!(headers["authorization"].is_sensitive());
    }

    #[test]
    fn refused_headers_name_the_field_and_the_header_and_never_a_value() {
        for (bad, named) in [
            (given(&[("Host", "secret-1")]), "Host"),
            (
                given(&[("Belfry-Signature", "secret-1")]),
                "Belfry-Signature",
            ),
            (given(&[("X-A", "secret-1\r\nX-B: 1")]), "X-A"),
            (
                given(&[("X-Env", "secret-1"), ("x-env", "secret-1")]),
                "x-env",
            ),
        ] {
            let error = FixedHeaders::new(&bad).expect_err("refused").to_string();
            assert!(error.starts_with("delivery.headers: "), "{error}");
            assert!(
                error.contains(named) && !error.contains("secret-1"),
                "{error}"
            );
        }
    }

    #[test]
    fn their_values_are_redacted_from_an_answer() {
        let fixed = FixedHeaders::new(&given(&[
            ("Authorization", "Bearer s3cr3t-token"),
            ("X-Env", "eu"),
        ]))
        .expect("valid");
        let echoed = "bad request; you sent: authorization=Bearer s3cr3t-token; x-env=eu".into();
        assert_eq!(
            fixed.redact(echoed),
            "bad request; you sent: authorization=<redacted>; x-env=eu"
        );
    }

    #[test]
    fn debug_shows_names_only() {
        let fixed = FixedHeaders::new(&given(&[("X-Api-Key", "key-value-1")])).expect("valid");
        let shown = format!("{fixed:?}");
        assert!(
            shown.contains("x-api-key") && !shown.contains("key-value-1"),
            "{shown}"
        );
    }

    #[test]
    fn only_the_queue_urls_origin_is_trusted() {
        let queue = Url::parse("https://api.example.com/hooks/a?k=1").expect("url");
        let check = |url: &str, expected: bool| {
            let url = Url::parse(url).expect("url");
            assert_eq!(trusted(&queue, &url), expected, "{url}");
        };
        check("https://api.example.com/hooks/a?k=1", true);
        check("https://api.example.com/other/path", true);
        check("https://api.example.com:443/x", true);
        check("https://API.example.com/x", true);
        check("http://api.example.com/x", false);
        check("https://api.example.com:8443/x", false);
        check("https://evil.example.com/x", false);
        check("https://api.example.com.evil.example/x", false);
    }
}
