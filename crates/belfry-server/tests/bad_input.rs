//! Bad input through API v1: each malformed body, unknown queue, out-of-range value or
//! undeliverable header gets a 4xx with a stable code and a message that says what to fix,
//! and nothing valid is lost. On the in-memory store and on the embedded engine.

#[macro_use]
mod common;

use common::{code, TestServer};
use serde_json::{json, Value};

both_stores!(a_body_of_the_wrong_shape_names_the_field);
async fn a_body_of_the_wrong_shape_names_the_field(s: TestServer) {
    s.queue("q", json!({})).await;
    let cases = [
        (
            "PUT",
            "/v1/queues/q",
            json!({"retry": {"max_attempts": "five"}}),
            "retry.max_attempts",
        ),
        (
            "POST",
            "/v1/queues/q/tasks",
            json!({"payload": 1, "delay_ms": "soon"}),
            "delay_ms",
        ),
        (
            "POST",
            "/v1/queues/q/tasks:batch",
            json!({"tasks": [{"payload": 1}, {"payload": 2, "priority": 7}]}),
            "priority",
        ),
        ("POST", "/v1/queues/q/lease", json!({"max": -1}), "max"),
    ];
    for (method, path, body, field) in cases {
        let (status, answer) = s.call(method, path, body.clone()).await;
        let message = answer["error"]["message"].as_str().unwrap_or("");
        let code = answer["error"]["code"].as_str().unwrap_or("");
        // The batch reports a bad task in its own result, with the same message.
        let message = if path.ends_with(":batch") {
            answer["results"][1]["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        } else {
            assert_eq!((status, code), (400, "invalid_request"), "{body}: {answer}");
            message.to_owned()
        };
        assert!(
            message.contains(field),
            "{body}: {message:?} does not name {field}"
        );
    }
}

both_stores!(task_headers_that_cannot_be_delivered_are_refused);
async fn task_headers_that_cannot_be_delivered_are_refused(s: TestServer) {
    s.queue("q", json!({})).await;
    for (headers, hint) in [
        (json!({"Belfry-Task-Id": "forged"}), "Belfry-Task-Id"),
        (json!({"host": "evil.example"}), "host"),
        (json!({"Content-Length": "1"}), "Content-Length"),
        (
            json!({"x-note": "line\r\nInjected: 1"}),
            "control character",
        ),
        (json!({"two words": "v"}), "two words"),
    ] {
        let (status, answer) = s
            .call(
                "POST",
                "/v1/queues/q/tasks",
                json!({"payload": 1, "headers": headers}),
            )
            .await;
        assert_eq!(status, 400, "{headers}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(hint),
            "{message:?} does not mention {hint}"
        );
    }
    let q = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    assert_eq!(q["pending"], 0, "a refused task was stored");
    s.submit("q", json!({"payload": 1, "headers": {"X-Trace": "t1"}}))
        .await;
}

both_stores!(deeply_nested_payloads_are_refused_not_crashing);
async fn deeply_nested_payloads_are_refused_not_crashing(s: TestServer) {
    s.queue("q", json!({})).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "r", "queue": "q", "delay_ms": 3_600_000}),
        201,
    )
    .await;
    // The same bound for a task's payload, a schedule's and a reminder's content: 128 levels
    // are fine (brackets inside strings do not count); more are refused, however many,
    // without harm to the server.
    let routes = [
        ("POST", "/v1/queues/q/tasks", "payload", ""),
        (
            "POST",
            "/v1/schedules",
            "payload",
            r#""queue": "q", "every_ms": 60000, "#,
        ),
        (
            "POST",
            "/v1/reminders",
            "content",
            r#""queue": "q", "delay_ms": 60000, "#,
        ),
        ("PATCH", "/v1/reminders/r", "content", ""),
    ];
    for (method, path, field, rest) in routes {
        let fine = format!(
            "{{{rest}\"{field}\": {}\"[[[{{\"{}}}",
            "[".repeat(128),
            "]".repeat(128)
        );
        let (status, answer) = s.raw(method, path, Some(fine)).await;
        assert!(status == 200 || status == 201, "{path}: {answer}");
        for depth in [129, 30_000] {
            let deep = format!(
                "{{{rest}\"{field}\": {}1{}}}",
                "[".repeat(depth),
                "]".repeat(depth)
            );
            let (status, answer) = s.raw(method, path, Some(deep)).await;
            assert_eq!(status, 400, "{path} depth {depth}: {answer}");
            assert_eq!(code(&answer), "invalid_payload", "{path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or("");
            assert!(
                message.starts_with(field) && message.contains("recursion limit"),
                "{path} depth {depth}: {message}"
            );
        }
    }
    // The server is still there.
    let (status, _) = s.call("GET", "/healthz", Value::Null).await;
    assert_eq!(status, 200);
}

both_stores!(bad_input_gets_stable_codes);
async fn bad_input_gets_stable_codes(s: TestServer) {
    s.queue("q", json!({})).await;
    s.queue(
        "hook",
        json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/x"}, "paused": true}),
    )
    .await;
    let big = "x".repeat(2000);
    let huge = "y".repeat(70 * 1024);
    let long_name = format!("/v1/queues/{}", "n".repeat(129));
    let queue = "/v1/queues/q";
    let tasks = "/v1/queues/q/tasks";
    let ack = "/v1/queues/q/tasks/0000000000000000000000000000abcd/ack";
    let b = |body: &str| Some(body.to_owned());
    #[rustfmt::skip]
    let cases: Vec<(u16, &str, &str, &str, Option<String>)> = vec![
        (400, "malformed_json", "POST", tasks, b("{\"payload\":")),
        (400, "invalid_request", "POST", tasks, b("[1,2]")),
        // An array is not taken for an object, field by field in order.
        (400, "invalid_request", "POST", tasks, b(r#"[{"a":1},null,5000,null,null,null,null,null,null,null,null]"#)),
        (400, "invalid_request", "POST", "/v1/queues/q/tasks:batch", b("[{}]")),
        (400, "invalid_request", "PUT", queue, b(r#""pull""#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"delay_ms":"5"}"#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"delay_ms":1.5}"#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"dleay_ms":5}"#)),
        (400, "conflicting_due_time", "POST", tasks, b(r#"{"delay_ms":5,"run_at":"2026-01-01T00:00:00Z"}"#)),
        (400, "invalid_due_time", "POST", tasks, b(r#"{"delay_ms":-1}"#)),
        (400, "invalid_due_time", "POST", tasks, b(r#"{"run_at":"next tuesday"}"#)),
        (400, "invalid_due_time", "POST", tasks, b(r#"{"run_at":"2026-06-01T00:00:00+25:00"}"#)),
        (400, "beyond_horizon", "POST", tasks, b(r#"{"run_at":"2099-01-01T00:00:00Z"}"#)),
        // Valid RFC 3339, past the last instant the time library represents.
        (400, "beyond_horizon", "POST", tasks, b(r#"{"run_at":"9999-12-31T23:59:59Z"}"#)),
        (400, "beyond_horizon", "POST", tasks, b(r#"{"run_at":"9999-12-31T10:00:00+05:00"}"#)),
        (413, "payload_too_large", "POST", tasks, Some(format!(r#"{{"payload":"{big}"}}"#))),
        (413, "payload_too_large", "POST", tasks, Some(format!(r#"{{"payload":"{huge}"}}"#))),
        // A task's own target is for webhook queues; q is a pull queue.
        (400, "target_not_supported", "POST", tasks, b(r#"{"target":"https://example.com/x"}"#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"target":5}"#)),
        (400, "invalid_payload", "POST", tasks, b(r#"{"payload":1,"payload_base64":"AA=="}"#)),
        (400, "invalid_payload", "POST", tasks, b(r#"{"payload_base64":"***"}"#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"priority":"urgent"}"#)),
        // A URL path cannot name "." or "..": the task could never be read by its key.
        (400, "invalid_request", "POST", tasks, b(r#"{"idempotency_key":".."}"#)),
        // Belfry's own keys: such a task would take a firing's or a chunk's place.
        (400, "invalid_request", "POST", tasks, b(r#"{"idempotency_key":"schedule:nightly:1767225600000:0"}"#)),
        (400, "invalid_request", "POST", tasks, b(r#"{"idempotency_key":"reminder:r:1:1:0"}"#)),
        (400, "invalid_schedule_id", "POST", "/v1/schedules", b(r#"{"id":"..","queue":"q","every_ms":60000}"#)),
        (404, "queue_not_found", "POST", "/v1/queues/nope/tasks", b("{}")),
        (400, "invalid_queue_name", "POST", "/v1/queues/bad%20name/tasks", b("{}")),
        (400, "invalid_queue_name", "PUT", &long_name, None),
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"rate_per_s":-1}"#)),
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"retry":{"max_attempts":0}}"#)),
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"retry":{"backoff_initial_ms":1000,"backoff_max_ms":18446744073709551615}}"#)),
        (400, "invalid_request", "PUT", queue, b(r#"{"delivery":{"type":"carrier-pigeon"}}"#)),
        (400, "webhook_target_refused", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"not a url"}}"#)),
        // Both timeout bounds are the queue config's, with its code (the sink refused 50 ms
        // on its own, as if the URL were bad).
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","timeout_ms":50}}"#)),
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","timeout_ms":300001}}"#)),
        // A secret being rotated out needs the new one beside it.
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","previous_secret":"old"}}"#)),
        // A fixed header belfry sets itself, or one name twice in two cases.
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","headers":{"Host":"h"}}}"#)),
        (400, "invalid_queue_config", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","headers":{"X-A":"1","x-a":"2"}}}"#)),
        (400, "invalid_request", "PUT", queue, b(r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","headers":["X-A: 1"]}}"#)),
        (400, "invalid_request", "PUT", queue, b(r#"{"burst":"lots"}"#)),
        (400, "invalid_task_id", "GET", "/v1/queues/q/tasks/xyz", None),
        (404, "task_not_found", "GET", "/v1/queues/q/tasks/0000000000000000000000000000abcd", None),
        (400, "invalid_lease_id", "POST", ack, b(r#"{"lease_id":"abc"}"#)),
        (404, "task_not_found", "POST", ack, b(r#"{"lease_id":"7"}"#)),
        (400, "invalid_request", "POST", ack, b("{}")),
        (400, "invalid_request", "POST", "/v1/queues/q/lease", b(r#"{"max":0}"#)),
        (400, "invalid_request", "POST", "/v1/queues/q/lease", b(r#"{"max":1001}"#)),
        (400, "invalid_request", "POST", "/v1/queues/q/lease", b(r#"{"wait_ms":30001}"#)),
        (400, "invalid_request", "POST", "/v1/queues/q/lease", b(r#"{"visibility_ms":1}"#)),
        (409, "not_pull_queue", "POST", "/v1/queues/hook/lease", None),
        (404, "queue_not_found", "POST", "/v1/queues/nope/lease", None),
        (400, "invalid_request", "GET", "/v1/queues/q/dead?limit=0", None),
        (400, "invalid_task_id", "GET", "/v1/queues/q/dead?after=zz", None),
        (404, "route_not_found", "GET", "/v1/nothing", None),
        (405, "method_not_allowed", "PATCH", "/v1/queues", None),
    ];
    for (status, expected, method, path, body) in cases {
        let (got, answer) = s.raw(method, path, body.clone()).await;
        assert_eq!(
            (got, code(&answer)),
            (status, expected),
            "{method} {path} {body:?}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "{method} {path}: no message");
    }
    // A body declared over the limit is told both numbers.
    let (got, answer) = s
        .raw("POST", tasks, Some(format!(r#"{{"payload":"{huge}"}}"#)))
        .await;
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert_eq!(got, 413, "{answer}");
    assert!(
        message.contains(&format!("{}", huge.len() + 14)) && message.contains("65536"),
        "{message}"
    );
    // A body that is JSON but not an object is told so, and so is a delivery given as text.
    for (method, path, body, hint) in [
        ("POST", tasks, "[{}]", "must be a JSON object"),
        (
            "PUT",
            queue,
            r#"{"delivery":"pull"}"#,
            r#"{"type": "pull"}"#,
        ),
        // A field inside the delivery of the wrong type is named, down to the header.
        (
            "PUT",
            queue,
            r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","headers":{"Authorization":5}}}"#,
            "delivery: headers.Authorization: invalid type: integer `5`, expected a string",
        ),
        (
            "PUT",
            queue,
            r#"{"delivery":{"type":"webhook","url":"http://127.0.0.1:9/","timeout_ms":"5s"}}"#,
            "delivery: timeout_ms: invalid type",
        ),
    ] {
        let (status, answer) = s.raw(method, path, b(body)).await;
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message.contains(hint), "{body}: {answer}");
    }
    // The unknown-queue message says how to create it.
    let (_, answer) = s.call("POST", "/v1/queues/nope/tasks", json!({})).await;
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("PUT /v1/queues/nope"),
        "{answer}"
    );
    // Nothing valid was lost along the way, and the server still answers.
    assert_eq!(
        s.ok("GET", "/v1/queues/q", Value::Null, 200).await["pending"],
        0
    );
    s.ok("GET", "/healthz", Value::Null, 200).await;
}

both_stores!(a_bad_query_string_names_the_parameter_in_words);
async fn a_bad_query_string_names_the_parameter_in_words(s: TestServer) {
    s.queue("q", json!({})).await;
    for (path, expected) in [
        (
            "/v1/users/u1/reminders?within_ms=-1",
            "bad query string (within_ms, limit): within_ms: expected a whole number",
        ),
        (
            "/v1/queues?limit=ten",
            "bad query string (after=<queue name>&limit=<n>): limit: expected a whole number",
        ),
        (
            "/v1/queues/q/forecast?step=1",
            "bad query string (horizon_ms=<ms>&step_ms=<ms>): step: unknown field `step`, expected `horizon_ms` or `step_ms`",
        ),
    ] {
        let (status, answer) = s.call("GET", path, Value::Null).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(code(&answer), "invalid_request", "{path}: {answer}");
        assert_eq!(answer["error"]["message"], expected, "{path}");
    }
}

/// Bytes that are not UTF-8 are a JSON syntax error (`malformed_json`), not a field of the
/// wrong shape; a body whose chunked framing is broken is `malformed_http`, with a message
/// that says what to send (it was "Failed to buffer the request body: error reading a body
/// from connection").
#[tokio::test]
async fn bodies_that_are_not_utf8_or_badly_framed_say_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start().await;
    s.queue("q", json!({})).await;
    let answer = s
        .http
        .post(format!("{}/v1/queues/q/tasks", s.base))
        .header("content-type", "application/json")
        .body(b"{\"payload\": \"\xff\"}".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(code(&body), "malformed_json", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("UTF-8"));

    let addr = s.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          transfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("malformed_http"), "{text}");
    assert!(text.contains("chunked encoding"), "{text}");
    assert_eq!(
        s.ok("GET", "/v1/queues/q", Value::Null, 200).await["pending"],
        0
    );
}

/// An HTTP/1.1 request without a `Host`, or with two, is refused (RFC 9112 §3.2): the
/// cross-origin checks read it, and a proxy in front may read a missing or second one
/// differently.
#[tokio::test]
async fn a_request_without_one_host_header_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start().await;
    s.queue("q", json!({})).await;
    let addr = s.base.trim_start_matches("http://");
    for head in [
        "POST /v1/queues/q/tasks HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        "POST /v1/queues/q/tasks HTTP/1.1\r\nhost: 127.0.0.1\r\nhost: evil.example\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{}",
    ] {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        let _ = conn.read_to_end(&mut response).await;
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(
            text.contains("malformed_http") && text.contains("Host"),
            "{text}"
        );
    }
    assert_eq!(
        s.ok("GET", "/v1/queues/q", Value::Null, 200).await["pending"],
        0
    );
}
