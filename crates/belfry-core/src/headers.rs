//! The one rule for the headers a producer attaches to a task (directly, or through a
//! schedule or a reminder): what is accepted is exactly what can be delivered.
//!
//! Before, a task accepted `Belfry-Task-Id`, `Host` or a value with a line break with `201`,
//! and the webhook sink then dropped it silently; schedules refused the same headers. Now the
//! API refuses them up front, with a message that says which header and why, and the sinks
//! drop nothing a producer could have sent.

use crate::limits::{
    HEADERS_MAX, HEADER_NAME_LEN_MAX, HEADER_VALUE_LEN_MAX, QUEUE_HEADERS_BYTES_MAX,
    QUEUE_HEADERS_MAX,
};

/// Names a producer may not set: hop-by-hop headers (RFC 9110 §7.6.1), headers the HTTP
/// client owns (`host`, `content-length`), `content-type` (set from the payload kind) and
/// `expect`. Compared without regard to case.
pub const RESERVED_NAMES: &[&str] = &[
    "connection",
    "content-length",
    "content-type",
    "expect",
    "host",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Names starting with this (any case) are belfry's own: task id, attempt, signature, shard.
pub const RESERVED_PREFIX: &str = "belfry-";

/// Whether belfry sets or strips this header itself.
pub fn is_reserved(name: &str) -> bool {
    let lower_prefix = name
        .get(..RESERVED_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX));
    lower_prefix || RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// Checks one header; the error says what to change.
pub fn check(name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > HEADER_NAME_LEN_MAX {
        return Err(format!("header names are 1 to {HEADER_NAME_LEN_MAX} bytes"));
    }
    if let Some(bad) = name.chars().find(|&c| !is_token_char(c)) {
        return Err(format!(
            "header name {:?} contains {bad:?}; names are letters, digits and !#$%&'*+-.^_`|~",
            printable(name)
        ));
    }
    if is_reserved(name) {
        return Err(format!(
            "header {name:?} is set by belfry itself (Belfry-* names, and hop-by-hop or transport headers such as Host and Content-Length); use another name"
        ));
    }
    if value.len() > HEADER_VALUE_LEN_MAX {
        return Err(format!(
            "header {name:?}: values are at most {HEADER_VALUE_LEN_MAX} bytes"
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!(
            "header {name:?}: the value contains a control character (such as CR or LF), which no HTTP request can carry"
        ));
    }
    Ok(())
}

/// Checks a task's headers: at most [`HEADERS_MAX`], each by [`check`].
pub fn check_all<'a>(
    headers: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), String> {
    if headers.len() > HEADERS_MAX {
        return Err(format!(
            "at most {HEADERS_MAX} headers, got {}",
            headers.len()
        ));
    }
    for (name, value) in headers {
        check(name, value)?;
    }
    Ok(())
}

/// Checks a webhook queue's fixed headers (`delivery.headers`): each by [`check`], at most
/// [`QUEUE_HEADERS_MAX`] of them and [`QUEUE_HEADERS_BYTES_MAX`] of names and values in all,
/// and no name twice in any case (`X-Env` and `x-env` are one HTTP header, and the request
/// could carry only one of the two values). The error names the header, never its value: a
/// queue's header values are credentials.
pub fn check_queue_headers<'a>(
    headers: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), String> {
    if headers.len() > QUEUE_HEADERS_MAX {
        return Err(format!(
            "at most {QUEUE_HEADERS_MAX} headers, got {}",
            headers.len()
        ));
    }
    let mut seen: Vec<&str> = Vec::with_capacity(headers.len());
    let mut bytes = 0usize;
    for (name, value) in headers {
        check(name, value)?;
        if let Some(first) = seen.iter().find(|n| n.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "header {name:?} is given twice (also as {first:?}): header names are case-insensitive, give each once"
            ));
        }
        seen.push(name);
        bytes += name.len() + value.len();
        if bytes > QUEUE_HEADERS_BYTES_MAX {
            return Err(format!(
                "header {name:?}: names and values are at most {QUEUE_HEADERS_BYTES_MAX} bytes in all"
            ));
        }
    }
    Ok(())
}

/// RFC 9110 `tchar`.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A name as an error message may show it: control characters escaped, at most 64 chars.
fn printable(name: &str) -> String {
    name.chars().take(64).flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_can_be_delivered_is_accepted_and_nothing_else() {
        let ok = |n: &str, v: &str| check(n, v).is_ok();
        assert!(ok("x-trace", "t1"));
        assert!(ok("X-Custom_Header.v2", "a value\twith a tab, ünïcode"));
        assert!(ok("x", ""));
        // Belfry's own, any case; transport and hop-by-hop headers.
        for name in [
            "Belfry-Task-Id",
            "belfry-shard",
            "BELFRY-anything",
            "Host",
            "content-length",
            "Transfer-Encoding",
            "connection",
        ] {
            assert!(!ok(name, "v"), "{name} accepted");
        }
        // Names that are not HTTP tokens; values no request can carry.
        for name in ["", "two words", "colon:", "line\nbreak", "é"] {
            assert!(!ok(name, "v"), "{name:?} accepted");
        }
        for value in ["a\r\nInjected: 1", "nul\0", "bell\u{7}"] {
            assert!(!ok("x", value), "{value:?} accepted");
        }
        assert!(!ok(&"n".repeat(HEADER_NAME_LEN_MAX + 1), "v"));
        assert!(!ok("x", &"v".repeat(HEADER_VALUE_LEN_MAX + 1)));
        assert!(check("Host", "v").unwrap_err().contains("Host"));
    }

    #[test]
    fn queue_headers_are_checked_like_task_headers_and_once_per_name() {
        let check = |given: &[(&str, &str)]| check_queue_headers(given.iter().copied());
        assert!(check(&[("Authorization", "Bearer abc"), ("X-Env", "prod")]).is_ok());
        assert!(check(&[]).is_ok());
        // The shared rule, the header named in the message and its value never.
        let reserved = check(&[("X-Env", "prod"), ("Belfry-Queue", "forged-value")]);
        let reserved = reserved.unwrap_err();
        assert!(reserved.contains("Belfry-Queue"), "{reserved}");
        assert!(!reserved.contains("forged-value"), "{reserved}");
        assert!(check(&[("Host", "h")]).is_err());
        assert!(check(&[("X-A", "line\r\nInjected: 1")]).is_err());
        // One name in two cases is one header given twice.
        let twice = check(&[("X-Env", "prod"), ("x-env", "dev")]).unwrap_err();
        assert!(
            twice.contains("x-env") && twice.contains("X-Env"),
            "{twice}"
        );
        // The count and the total size.
        let names: Vec<String> = (0..=QUEUE_HEADERS_MAX).map(|i| format!("x-h{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert!(check(&many).unwrap_err().contains("at most 32 headers"));
        assert!(check(&many[..QUEUE_HEADERS_MAX]).is_ok());
        // Two of 4,095 bytes (name and value) fit in 8 KiB, a third does not.
        let big = "v".repeat(HEADER_VALUE_LEN_MAX - 4);
        let two_big = check(&[("x-a", &big), ("x-b", &big)]);
        assert!(two_big.is_ok(), "{two_big:?}");
        let three_big = check(&[("x-a", &big), ("x-b", &big), ("x-c", &big)]).unwrap_err();
        assert!(
            three_big.contains("x-c") && three_big.contains("8192"),
            "{three_big}"
        );
    }

    #[test]
    fn too_many_headers_are_refused() {
        let names: Vec<String> = (0..=HEADERS_MAX).map(|i| format!("h{i}")).collect();
        let many = names.iter().map(|n| (n.as_str(), "v"));
        assert!(check_all(many).is_err());
        let fine = names[..HEADERS_MAX].iter().map(|n| (n.as_str(), "v"));
        assert!(check_all(fine).is_ok());
    }
}
