//! The standard error JSON for requests hyper cannot parse.
//!
//! A garbage request line, a malformed header or an oversized head never reaches the router:
//! hyper answers it itself (400, 414 or 431) with an empty body and closes the connection,
//! and it has no hook to change that answer. Every other 4xx of the API carries
//! `{"error": {"code", "message"}}`, and clients are written against that. So the socket
//! wrapper recognises hyper's automatic answer among the bytes written, and writes the
//! standard body in its place.
//!
//! Recognising it is safe because the router never answers 400, 414 or 431 with an empty
//! body: every error the API writes has the JSON body. hyper writes its automatic answer as
//! one head, in one write call, with `content-length: 0`.

use crate::api::{ApiError, ErrorCode};

/// The status line prefix of each answer hyper writes by itself, and what it means.
const AUTOMATIC: &[(&[u8], ErrorCode, &str)] = &[
    (
        b"HTTP/1.1 400 ",
        ErrorCode::MalformedHttp,
        "the request line or headers are not valid HTTP/1.1: send `METHOD /path HTTP/1.1`, \
         then one `Name: value` line per header, then an empty line",
    ),
    (
        b"HTTP/1.1 414 ",
        ErrorCode::UriTooLong,
        "the request's path and query are longer than the server reads: shorten them",
    ),
    (
        b"HTTP/1.1 431 ",
        ErrorCode::HeadersTooLarge,
        "the request's headers are larger than the server reads: send fewer or shorter headers",
    ),
];

/// If `written` is hyper's automatic answer to an unparsable request, the answer to write
/// instead: the same status, the standard error body, and `connection: close` (hyper closes
/// the connection after it either way).
pub(super) fn replacement(written: &[u8]) -> Option<Vec<u8>> {
    let (prefix, code, message) = AUTOMATIC
        .iter()
        .find(|(prefix, _, _)| written.starts_with(prefix))?;
    if !written.ends_with(b"\r\n\r\n") || !has_empty_body(written) {
        return None;
    }
    let status_line = &prefix[..prefix.len() - 1];
    let body = ApiError::new(*code, *message).to_json_bytes();
    let mut answer = Vec::with_capacity(160 + body.len());
    answer.extend_from_slice(status_line);
    answer.extend_from_slice(b" ");
    answer.extend_from_slice(
        code.status()
            .canonical_reason()
            .unwrap_or("Error")
            .as_bytes(),
    );
    answer.extend_from_slice(b"\r\ncontent-type: application/json\r\nconnection: close\r\n");
    answer.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    answer.extend_from_slice(&body);
    Some(answer)
}

/// Whether the head declares an empty body.
fn has_empty_body(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n').any(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.eq_ignore_ascii_case(b"content-length: 0")
    })
}

/// A write in progress of a replaced answer: hyper is told its own bytes were written only
/// once all of the replacement has gone out.
pub(super) struct Rewrite {
    pub bytes: Vec<u8>,
    pub written: usize,
    /// How many of hyper's bytes the replacement stands for.
    pub stands_for: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_automatic_answers_are_replaced_with_the_standard_body() {
        for (status, code) in [
            ("400 Bad Request", "malformed_http"),
            ("414 URI Too Long", "uri_too_long"),
            ("431 Request Header Fields Too Large", "headers_too_large"),
        ] {
            let automatic =
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 10:00:00 GMT\r\n\r\n");
            let answer = replacement(automatic.as_bytes()).expect("replaced");
            let text = String::from_utf8(answer).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.starts_with(&format!("HTTP/1.1 {status}\r\n")),
                "{head}"
            );
            assert!(
                head.contains(&format!("content-length: {}", body.len())),
                "{head}"
            );
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(json["error"]["code"], code);
            assert!(json["error"]["message"].as_str().unwrap().len() > 20);
        }
    }

    #[test]
    fn the_routers_own_answers_are_left_alone() {
        // A 400 with a body (every error the API writes), a success, and a head split over
        // two writes are not hyper's automatic answer.
        for written in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 57\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 01\r\n\r\n",
        ] {
            assert!(replacement(written).is_none(), "{}", String::from_utf8_lossy(written));
        }
    }
}
