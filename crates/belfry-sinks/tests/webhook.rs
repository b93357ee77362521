//! The webhook sink against a real HTTP receiver (axum) on 127.0.0.1, started by each test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes as BodyBytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use belfry_core::{PayloadKind, QueueName, Task, TaskId, TaskState, UnixMs};
use belfry_sinks::retry::format_http_date;
use belfry_sinks::{
    client_for, default_client, sign, verify_signature, verify_signature_v2, Outcome, Sink,
    SinkError, SinkHealth, TargetPolicy, WebhookConfig, WebhookSink,
};
use bytes::Bytes;

/// The dispatcher's "now" in these tests: 2023-11-14T22:13:20Z.
const NOW_MS: UnixMs = 1_700_000_000_123;
const SECRET: &str = "whsec_integration";

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    mode: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Receiver {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("receiver lock").clone()
    }
}

/// Answers according to the last path segment, after recording the request.
async fn receive(
    State(receiver): State<Receiver>,
    Path(mode): Path<String>,
    headers: HeaderMap,
    body: BodyBytes,
) -> Response {
    receiver.seen.lock().expect("receiver lock").push(Seen {
        mode: mode.clone(),
        headers: headers.clone(),
        body: body.clone(),
    });
    match mode.as_str() {
        "ok" => StatusCode::OK.into_response(),
        "accepted" => StatusCode::ACCEPTED.into_response(),
        // Checks the signature the way a receiver would, refusing a bad one with 401.
        "signed" => {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let timestamp = header("belfry-timestamp");
            let signature = header("belfry-signature");
            let signature_v2 = header("belfry-signature-v2");
            let task_id = header("belfry-task-id");
            if verify_signature(SECRET.as_bytes(), &timestamp, &body, &signature)
                && verify_signature_v2(
                    SECRET.as_bytes(),
                    &task_id,
                    &timestamp,
                    &body,
                    &signature_v2,
                )
            {
                StatusCode::NO_CONTENT.into_response()
            } else {
                (StatusCode::UNAUTHORIZED, "bad signature").into_response()
            }
        }
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "boom\nsecond line").into_response(),
        "busy" => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "7")],
            "slow down",
        )
            .into_response(),
        "busy-date" => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", format_http_date(NOW_MS - 123 + 120_000))],
        )
            .into_response(),
        "busy-forever" => {
            (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "999999")]).into_response()
        }
        "missing" => (StatusCode::NOT_FOUND, "no such hook").into_response(),
        "gone" => StatusCode::GONE.into_response(),
        "redirect" => (StatusCode::FOUND, [("location", "/hook/ok")]).into_response(),
        // A Location with credentials and a token, and a body: shown redacted, body after.
        "moved" => (
            StatusCode::MOVED_PERMANENTLY,
            [("location", "https://u:pw@new.example/hook/?token=sekrit")],
            "moved",
        )
            .into_response(),
        "huge-error" => (StatusCode::BAD_REQUEST, "x".repeat(1 << 20)).into_response(),
        "slow" => {
            // Longer than any sink timeout in these tests; the test never waits for it.
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::OK.into_response()
        }
        _ => StatusCode::IM_A_TEAPOT.into_response(),
    }
}

/// Starts a receiver on an ephemeral loopback port.
async fn start_receiver() -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/hook/{mode}", post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("receiver address");
    tokio::spawn(async move {
        // Ends with the test's runtime.
        let _ = axum::serve(listener, app).await;
    });
    (receiver, addr)
}

fn task(payload: &'static [u8], kind: PayloadKind, headers: &[(&str, &str)]) -> Task {
    Task {
        id: TaskId(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
        queue: QueueName::new("orders.eu-1").expect("valid queue name"),
        due_at_ms: NOW_MS - 5_000,
        payload: Bytes::from_static(payload),
        payload_kind: kind,
        payload_dropped: false,
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        priority: Default::default(),
        idempotency_key: None,
        late_policy: Default::default(),
        target: None,
        state: TaskState::Leased,
        attempts: 3,
        lease_until_ms: Some(NOW_MS + 30_000),
        dead_reason: None,
    }
}

/// A sink that may deliver to loopback, as every test receiver lives there.
fn sink(addr: SocketAddr, mode: &str, secret: Option<&str>, timeout: Duration) -> WebhookSink {
    let policy = TargetPolicy::ALLOW_PRIVATE;
    WebhookSink::new(
        WebhookConfig {
            url: format!("http://{addr}/hook/{mode}"),
            secret: secret.map(str::to_owned),
            previous_secret: None,
            headers: Default::default(),
            timeout,
        },
        policy,
        client_for(&policy),
    )
    .expect("valid sink config")
}

fn header<'a>(seen: &'a Seen, name: &str) -> Vec<&'a str> {
    seen.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii header"))
        .collect()
}

#[tokio::test]
async fn delivers_json_with_belfry_headers_and_a_valid_signature() {
    let (receiver, addr) = start_receiver().await;
    let sink = sink(addr, "signed", Some(SECRET), Duration::from_secs(10));
    let task = task(
        br#"{"order":42}"#,
        PayloadKind::Json,
        &[
            ("X-Custom", "one"),
            ("x-custom", "two"),
            ("Authorization", "Bearer t0ken"),
            // Each of these would clash with belfry's or the client's own headers.
            ("Belfry-Attempt", "99"),
            ("belfry-signature", "v1=forged"),
            ("Belfry-Anything", "reserved prefix"),
            // A schedule's shard headers, which belfry itself puts on firing tasks, go out.
            ("Belfry-Shard", "2"),
            ("Belfry-Shard-Count", "4"),
            ("Host", "evil.example"),
            ("Content-Length", "1"),
            ("Content-Type", "text/plain"),
            ("Connection", "close"),
            ("Transfer-Encoding", "chunked"),
            // Not valid HTTP: skipped, the delivery still happens.
            ("bad header", "x"),
            ("X-Bad-Value", "line\nbreak"),
        ],
    );

    let outcome = sink.deliver(&task, 4, NOW_MS).await;
    assert_eq!(outcome, Outcome::Delivered);

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.mode, "signed");
    assert_eq!(&request.body[..], br#"{"order":42}"#);
    assert_eq!(
        header(request, "belfry-task-id"),
        ["0123456789abcdef0011223344556677"]
    );
    assert_eq!(header(request, "belfry-queue"), ["orders.eu-1"]);
    assert_eq!(header(request, "belfry-attempt"), ["4"]);
    assert_eq!(
        header(request, "belfry-due-at"),
        [(NOW_MS - 5_000).to_string()]
    );
    assert_eq!(header(request, "belfry-timestamp"), ["1700000000"]);
    let expected_signature = sign(
        SECRET.as_bytes(),
        "0123456789abcdef0011223344556677",
        "1700000000",
        br#"{"order":42}"#,
    );
    assert_eq!(
        header(request, "belfry-signature"),
        [expected_signature.v1.as_str()]
    );
    assert_eq!(
        header(request, "belfry-signature-v2"),
        [expected_signature.v2.as_str()]
    );
    // v2 also covers the task id: the same request under another id does not verify.
    let signed = |id: &str| {
        verify_signature_v2(
            SECRET.as_bytes(),
            id,
            "1700000000",
            br#"{"order":42}"#,
            &expected_signature.v2,
        )
    };
    assert!(signed("0123456789abcdef0011223344556677"));
    assert!(!signed("ffffffffffffffffffffffffffffffff"));
    assert!(header(request, "belfry-anything").is_empty());
    assert_eq!(header(request, "belfry-shard"), ["2"]);
    assert_eq!(header(request, "belfry-shard-count"), ["4"]);
    assert_eq!(header(request, "content-type"), ["application/json"]);
    assert_eq!(header(request, "content-length"), ["12"]);
    assert_eq!(header(request, "host"), [addr.to_string()]);
    assert!(header(request, "transfer-encoding").is_empty());
    assert_eq!(header(request, "x-custom"), ["one", "two"]);
    assert_eq!(header(request, "authorization"), ["Bearer t0ken"]);
    assert!(header(request, "x-bad-value").is_empty());
    assert!(header(request, "user-agent")[0].starts_with("belfry/"));
}

#[tokio::test]
async fn binary_payload_without_secret_is_unsigned_octet_stream() {
    let (receiver, addr) = start_receiver().await;
    let sink = sink(addr, "accepted", None, Duration::from_secs(10));
    let task = task(&[0, 159, 146, 150, 255], PayloadKind::Binary, &[]);

    assert_eq!(sink.deliver(&task, 1, NOW_MS).await, Outcome::Delivered);

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(&seen[0].body[..], &[0, 159, 146, 150, 255]);
    assert_eq!(
        header(&seen[0], "content-type"),
        ["application/octet-stream"]
    );
    assert!(header(&seen[0], "belfry-signature").is_empty());
    assert!(header(&seen[0], "belfry-timestamp").is_empty());
    assert_eq!(header(&seen[0], "belfry-attempt"), ["1"]);
}

#[tokio::test]
async fn wrong_secret_is_refused_by_the_receiver_and_rejected() {
    let (receiver, addr) = start_receiver().await;
    let sink = sink(
        addr,
        "signed",
        Some("not-the-secret"),
        Duration::from_secs(10),
    );
    let outcome = sink
        .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
        .await;
    match outcome {
        Outcome::Reject { reason } => {
            assert_eq!(reason, "HTTP 401 Unauthorized: bad signature")
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn statuses_map_to_outcomes() {
    let (receiver, addr) = start_receiver().await;
    let task = task(b"{}", PayloadKind::Json, &[]);
    let check = |mode: &'static str, expected: Outcome| {
        let sink = sink(addr, mode, None, Duration::from_secs(10));
        let task = task.clone();
        async move {
            let outcome = sink.deliver(&task, 2, NOW_MS).await;
            assert_eq!(outcome, expected, "mode {mode}");
        }
    };
    check(
        "fail",
        Outcome::Retry {
            after: None,
            reason: "HTTP 500 Internal Server Error: boom second line".into(),
        },
    )
    .await;
    check(
        "busy",
        Outcome::Retry {
            after: Some(Duration::from_secs(7)),
            reason: "HTTP 429 Too Many Requests: slow down".into(),
        },
    )
    .await;
    // An HTTP-date two minutes after the dispatcher's now (the date has whole seconds).
    check(
        "busy-date",
        Outcome::Retry {
            after: Some(Duration::from_millis(120_000 - 123)),
            reason: "HTTP 503 Service Unavailable".into(),
        },
    )
    .await;
    check(
        "busy-forever",
        Outcome::Retry {
            after: Some(belfry_sinks::retry::RETRY_AFTER_MAX),
            reason: "HTTP 503 Service Unavailable".into(),
        },
    )
    .await;
    check(
        "missing",
        Outcome::Reject {
            reason: "HTTP 404 Not Found: no such hook".into(),
        },
    )
    .await;
    check(
        "gone",
        Outcome::Reject {
            reason: "HTTP 410 Gone".into(),
        },
    )
    .await;
    // The reason says where the redirect pointed, resolved against the URL.
    check(
        "redirect",
        Outcome::Reject {
            reason: format!(
                "HTTP 302 Found (redirects are not followed; configure the final URL): \
                 Location http://{addr}/hook/ok"
            ),
        },
    )
    .await;

    check(
        "moved",
        Outcome::Reject {
            reason: "HTTP 301 Moved Permanently (redirects are not followed; configure the \
                     final URL): Location https://new.example/hook/?<redacted>; moved"
                .into(),
        },
    )
    .await;

    // The redirect was not followed: /hook/ok never saw a request.
    let modes: Vec<String> = receiver.seen().into_iter().map(|s| s.mode).collect();
    assert_eq!(
        modes,
        [
            "fail",
            "busy",
            "busy-date",
            "busy-forever",
            "missing",
            "gone",
            "redirect",
            "moved"
        ]
    );
}

#[tokio::test]
async fn a_huge_error_body_is_cut_short_in_the_reason() {
    let (_receiver, addr) = start_receiver().await;
    let sink = sink(addr, "huge-error", None, Duration::from_secs(10));
    let outcome = sink
        .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
        .await;
    match outcome {
        Outcome::Reject { reason } => {
            assert!(reason.starts_with("HTTP 400 Bad Request: xxx"), "{reason}");
            assert!(reason.len() < 400, "reason is {} bytes", reason.len());
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn a_receiver_slower_than_the_timeout_is_retried() {
    let (receiver, addr) = start_receiver().await;
    let sink = sink(addr, "slow", None, Duration::from_millis(300));
    let outcome = sink
        .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
        .await;
    match outcome {
        Outcome::Retry {
            after: None,
            reason,
        } => {
            assert_eq!(reason, "timed out: no complete answer within 300 ms")
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    // The request did arrive: the timeout hit while waiting for the answer.
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn a_closed_port_is_retried_and_the_reason_hides_credentials() {
    // Bind then drop a listener, so the port is (almost certainly) closed.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let policy = TargetPolicy::ALLOW_PRIVATE;
    let sink = WebhookSink::new(
        WebhookConfig {
            url: format!("http://user:hunter2@{addr}/hook?token=sekrit"),
            secret: Some("signing-secret-value".into()),
            previous_secret: None,
            headers: Default::default(),
            timeout: Duration::from_secs(10),
        },
        policy,
        client_for(&policy),
    )
    .expect("valid sink config");
    let outcome = sink
        .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
        .await;
    let reason = match outcome {
        Outcome::Retry {
            after: None,
            reason,
        } => reason,
        other => panic!("expected a retry, got {other:?}"),
    };
    assert!(reason.starts_with("connection failed"), "{reason}");
    let debug = format!("{sink:?}");
    for text in [&reason, &debug] {
        for secret in ["hunter2", "sekrit", "signing-secret-value"] {
            assert!(!text.contains(secret), "{secret:?} leaked into {text:?}");
        }
    }
}

#[tokio::test]
async fn default_policy_refuses_loopback_at_configuration() {
    let (_receiver, addr) = start_receiver().await;
    let check = |url: String| {
        let error = WebhookSink::new(
            WebhookConfig::new(url.clone()),
            TargetPolicy::default(),
            default_client(),
        )
        .expect_err("loopback must be refused");
        assert!(
            matches!(error, SinkError::ForbiddenTarget { .. }),
            "{url}: {error}"
        );
        assert!(error.to_string().contains("loopback"), "{error}");
    };
    check(format!("http://{addr}/hook/ok"));
    check(format!("http://localhost:{}/hook/ok", addr.port()));
    check(format!("http://[::1]:{}/hook/ok", addr.port()));
    check(format!("http://[::ffff:127.0.0.1]:{}/hook/ok", addr.port()));
}

/// Models DNS rebinding: a host name that passed the check when the queue was configured now
/// resolves to loopback. The sink's client (built for the default policy) refuses to connect,
/// the task is rejected, and the receiver never sees a request.
#[tokio::test]
async fn default_client_refuses_a_name_resolving_to_loopback_at_connect_time() {
    let (receiver, addr) = start_receiver().await;
    let sink = WebhookSink::new(
        WebhookConfig::new(format!("http://localhost:{}/hook/ok", addr.port())),
        // Configuration passes (as it would have for a public name)...
        TargetPolicy::ALLOW_PRIVATE,
        // ...but the connection goes through the guarded resolver.
        default_client(),
    )
    .expect("valid sink config");
    let outcome = sink
        .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
        .await;
    let reason = match outcome {
        Outcome::Reject { reason } => reason,
        other => panic!("expected a rejection, got {other:?}"),
    };
    assert!(reason.starts_with("forbidden target"), "{reason}");
    assert!(reason.contains("loopback"), "{reason}");
    assert!(receiver.seen().is_empty());
    // The receiver never answered: belfry's own rule refused it, and health says so.
    assert_eq!(sink.health(), SinkHealth::Refused(reason));

    // The same name with a client that allows private targets is delivered: the refusal
    // above came from the policy, not from a broken receiver.
    let policy = TargetPolicy::ALLOW_PRIVATE;
    let allowed = WebhookSink::new(
        WebhookConfig::new(format!("http://localhost:{}/hook/ok", addr.port())),
        policy,
        client_for(&policy),
    )
    .expect("valid sink config");
    assert_eq!(
        allowed
            .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
            .await,
        Outcome::Delivered
    );
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn config_errors_say_what_to_fix() {
    let policy = TargetPolicy::ALLOW_PRIVATE;
    let check = |config: WebhookConfig, needle: &str| {
        let error = WebhookSink::new(config, policy, client_for(&policy))
            .expect_err("config must be refused");
        assert!(error.to_string().contains(needle), "{error}");
    };
    let base = WebhookConfig::new("http://127.0.0.1:9/hook");
    check(
        WebhookConfig {
            timeout: Duration::ZERO,
            ..base.clone()
        },
        "timeout must be between",
    );
    check(
        WebhookConfig {
            timeout: Duration::from_secs(3600),
            ..base.clone()
        },
        "timeout must be between",
    );
    check(
        WebhookConfig {
            secret: Some(String::new()),
            ..base.clone()
        },
        "secret must be 1 to",
    );
    check(
        WebhookConfig::new("ftp://example.com/"),
        "use http:// or https://",
    );
    check(WebhookConfig::new("not a url"), "not a valid absolute URL");
}

/// A raw TCP "receiver" that reads the request head, then answers `reply` (possibly nothing)
/// and closes the connection.
async fn start_raw_receiver(reply: &'static [u8]) -> SocketAddr {
    start_recording_raw_receiver(reply).await.0
}

/// [`start_raw_receiver`] that also keeps each request head, as the bytes arrived.
async fn start_recording_raw_receiver(
    reply: &'static [u8],
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the raw receiver");
    let addr = listener.local_addr().expect("raw receiver address");
    let heads = Arc::new(Mutex::new(Vec::new()));
    let recorded = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = vec![0u8; 64 * 1024];
            let mut seen = Vec::new();
            // Read until the end of the request head, so the client has sent its request.
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                }
            }
            let head = String::from_utf8_lossy(&seen).into_owned();
            recorded.lock().expect("heads lock").push(head);
            let _ = stream.write_all(reply).await;
            // Dropping the stream closes the connection.
        }
    });
    (addr, heads)
}

/// Some front ends answer a body-less POST without a length 411, which dead-letters the task:
/// an empty payload goes out with `Content-Length: 0`, once, and no chunked framing.
#[tokio::test]
async fn an_empty_payload_is_sent_with_content_length_zero() {
    let (addr, heads) =
        start_recording_raw_receiver(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
    let sink = sink(addr, "ok", None, Duration::from_secs(10));
    for payload in [&b""[..], b"{}"] {
        let mut task = task(b"", PayloadKind::Binary, &[]);
        task.payload = Bytes::copy_from_slice(payload);
        assert_eq!(sink.deliver(&task, 1, NOW_MS).await, Outcome::Delivered);
    }
    let heads = heads.lock().expect("heads lock").clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for (head, length) in heads.iter().zip(["0", "2"]) {
        let lower = head.to_ascii_lowercase();
        let lengths: Vec<&str> = lower
            .lines()
            .filter_map(|line| line.strip_prefix("content-length:"))
            .map(str::trim)
            .collect();
        assert_eq!(lengths, [length], "{head}");
        assert!(!lower.contains("transfer-encoding"), "{head}");
    }
}

#[tokio::test]
async fn a_connection_closed_without_an_answer_or_with_garbage_is_retried() {
    for reply in [
        &b""[..],
        b"this is not HTTP\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ] {
        let addr = start_raw_receiver(reply).await;
        let sink = sink(addr, "ok", None, Duration::from_secs(10));
        let outcome = sink
            .deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
            .await;
        match outcome {
            Outcome::Retry {
                after: None,
                reason,
            } => {
                assert!(reason.starts_with("connection failed"), "{reason}")
            }
            other => panic!("reply {reply:?}: expected a retry, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_success_whose_body_is_cut_off_still_counts_as_delivered() {
    // The status line and headers arrived: the receiver accepted the task, even if the body
    // then broke off.
    let addr = start_raw_receiver(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial").await;
    let sink = sink(addr, "ok", None, Duration::from_secs(10));
    assert_eq!(
        sink.deliver(&task(b"{}", PayloadKind::Json, &[]), 1, NOW_MS)
            .await,
        Outcome::Delivered
    );
}

/// A log sink for one test: a `tracing` subscriber writes here.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A receiver that is down fails every task: each queue's sink logs one line per period,
/// naming its queue, and counts the lines it held back.
#[tokio::test]
async fn failure_lines_name_the_queue_and_are_throttled_per_sink() {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    // This test's runtime runs on this thread, deliveries included.
    let _guard = tracing::subscriber::set_default(subscriber);
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let first = sink(addr, "ok", None, Duration::from_secs(10));
    let second = sink(addr, "ok", None, Duration::from_secs(10));
    let mut other_task = task(b"{}", PayloadKind::Json, &[]);
    other_task.queue = QueueName::new("refunds").expect("valid queue name");
    for attempt in 1..=5 {
        let outcome = first
            .deliver(&task(b"{}", PayloadKind::Json, &[]), attempt, NOW_MS)
            .await;
        assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    }
    second.deliver(&other_task, 1, NOW_MS).await;

    let text = String::from_utf8(log.0.lock().expect("log lock").clone()).expect("UTF-8 log");
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("webhook failed"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("queue=orders.eu-1") && lines[0].contains("held_back=0"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("queue=refunds"), "{}", lines[1]);
}

/// A task's own target takes the request, signed with the queue's secret; the queue's URL
/// sees nothing, and the queue's health (which describes its own URL) is unchanged.
#[tokio::test]
async fn a_task_with_its_own_target_is_sent_there_signed() {
    let (queue_receiver, queue_addr) = start_receiver().await;
    let (other_receiver, other_addr) = start_receiver().await;
    let sink = sink(queue_addr, "ok", Some(SECRET), Duration::from_secs(10));
    let target = format!("http://{other_addr}/hook/signed");
    sink.check_task_target(&target).expect("a valid target");
    let mut own = task(br#"{"order":7}"#, PayloadKind::Json, &[("X-A", "b")]);
    own.target = Some(target);

    let outcome = sink.deliver(&own, 1, NOW_MS).await;

    assert_eq!(outcome, Outcome::Delivered);
    assert!(queue_receiver.seen().is_empty());
    let seen = other_receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, Bytes::from_static(br#"{"order":7}"#));
    assert_eq!(header(&seen[0], "x-a"), ["b"]);
    assert_eq!(sink.health(), SinkHealth::Unknown);
    // Without a target the same sink goes on delivering to the queue's URL.
    let plain = task(b"{}", PayloadKind::Json, &[]);
    assert_eq!(sink.deliver(&plain, 1, NOW_MS).await, Outcome::Delivered);
    assert_eq!(queue_receiver.seen().len(), 1);
    assert_eq!(sink.health(), SinkHealth::Reachable);
}

/// Under the default policy a task's target is checked like a queue's URL: on submit, and
/// again when it is due (a task stored before the policy changed), when it is rejected
/// without any connection.
#[tokio::test]
async fn a_task_target_the_policy_forbids_is_refused_and_never_connected() {
    let (receiver, addr) = start_receiver().await;
    let sink = WebhookSink::new(
        WebhookConfig::new("https://example.com/hook"),
        TargetPolicy::default(),
        default_client(),
    )
    .expect("a public queue URL");
    let forbidden = format!("http://{addr}/hook/ok");
    let refused = |target: &str| sink.check_task_target(target).expect_err(target);
    assert!(matches!(
        refused(&forbidden),
        SinkError::ForbiddenTarget { .. }
    ));
    assert!(matches!(
        refused("ftp://example.com/x"),
        SinkError::UnsupportedScheme { .. }
    ));
    assert!(matches!(refused("not a url"), SinkError::InvalidUrl { .. }));
    let mut own = task(b"{}", PayloadKind::Json, &[]);
    own.target = Some(forbidden);

    let outcome = sink.deliver(&own, 1, NOW_MS).await;

    let Outcome::Reject { reason } = outcome else {
        panic!("a forbidden target is rejected, got {outcome:?}")
    };
    assert!(
        reason.starts_with("the task's target is refused"),
        "{reason}"
    );
    assert!(receiver.seen().is_empty());
    assert_eq!(sink.health(), SinkHealth::Unknown);
}

/// Rotating a secret: while the queue names the one being rotated out as `previous_secret`,
/// a receiver that still holds only that one keeps verifying (each header carries an entry
/// under each secret); without it, the new secret alone does not verify there.
#[tokio::test]
async fn a_receiver_holding_the_previous_secret_verifies_during_a_rotation() {
    let (receiver, addr) = start_receiver().await;
    let policy = TargetPolicy::ALLOW_PRIVATE;
    let sink = |previous: Option<&str>| {
        WebhookSink::new(
            WebhookConfig {
                url: format!("http://{addr}/hook/signed"),
                secret: Some("whsec_new".into()),
                previous_secret: previous.map(str::to_owned),
                headers: Default::default(),
                timeout: Duration::from_secs(10),
            },
            policy,
            client_for(&policy),
        )
        .expect("valid sink config")
    };
    let task = task(br#"{"order":1}"#, PayloadKind::Json, &[]);

    assert_eq!(
        sink(Some(SECRET)).deliver(&task, 1, NOW_MS).await,
        Outcome::Delivered
    );
    let seen = receiver.seen();
    let v2 = header(&seen[0], "belfry-signature-v2")[0].to_owned();
    assert_eq!(v2.matches("v2=").count(), 2, "{v2}");
    let (id, ts) = (
        header(&seen[0], "belfry-task-id")[0].to_owned(),
        header(&seen[0], "belfry-timestamp")[0].to_owned(),
    );
    for (secret, valid) in [("whsec_new", true), (SECRET, true), ("other", false)] {
        assert_eq!(
            verify_signature_v2(secret.as_bytes(), &id, &ts, &seen[0].body, &v2),
            valid,
            "{secret}"
        );
    }
    // `Belfry-Signature` has an entry under each secret too.
    let v1 = header(&seen[0], "belfry-signature")[0];
    assert_eq!(v1.matches("v1=").count(), 2, "{v1}");
    assert!(verify_signature(b"whsec_new", &ts, &seen[0].body, v1));
    assert!(verify_signature(SECRET.as_bytes(), &ts, &seen[0].body, v1));

    let after = sink(None).deliver(&task, 1, NOW_MS).await;
    assert!(matches!(after, Outcome::Reject { .. }), "{after:?}");
    let alone = WebhookSink::new(
        WebhookConfig {
            secret: None,
            previous_secret: Some("old".into()),
            ..WebhookConfig::new("https://example.com/h")
        },
        TargetPolicy::default(),
        default_client(),
    )
    .expect_err("a previous secret needs a secret");
    assert!(matches!(alone, SinkError::PreviousSecretAlone), "{alone}");
}

/// A queue's fixed headers (`delivery.headers`) arrive on every attempt, retries included,
/// replace a task header of the same name in any case, and go to a task's own target of the
/// queue URL's origin; a target of another origin (chosen by a producer, not the operator)
/// gets the task's headers and the signature, never the queue's credential.
#[tokio::test]
async fn fixed_headers_arrive_on_every_attempt_and_only_at_the_queues_origin() {
    let (receiver, addr) = start_receiver().await;
    let (elsewhere, other_addr) = start_receiver().await;
    let policy = TargetPolicy::ALLOW_PRIVATE;
    let sink = WebhookSink::new(
        WebhookConfig {
            url: format!("http://{addr}/hook/fail"),
            secret: Some(SECRET.into()),
            headers: [
                ("Authorization".to_owned(), "Bearer queue-token".to_owned()),
                ("X-Env".to_owned(), "prod".to_owned()),
            ]
            .into(),
            ..WebhookConfig::new("http://unused.invalid/")
        },
        policy,
        client_for(&policy),
    )
    .expect("valid sink config");
    let given = [
        ("authorization", "Bearer task-token"),
        ("X-ENV", "dev"),
        ("X-Trace", "t1"),
    ];
    let plain = task(br#"{"n":1}"#, PayloadKind::Json, &given);
    for attempt in 1..=2 {
        let outcome = sink.deliver(&plain, attempt, NOW_MS).await;
        assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    }
    let mut same_origin = plain.clone();
    same_origin.target = Some(format!("http://{addr}/hook/signed?k=1"));
    assert_eq!(
        sink.deliver(&same_origin, 3, NOW_MS).await,
        Outcome::Delivered
    );

    let seen = receiver.seen();
    let modes: Vec<&str> = seen.iter().map(|s| s.mode.as_str()).collect();
    assert_eq!(modes, ["fail", "fail", "signed"]);
    for request in &seen {
        assert_eq!(header(request, "authorization"), ["Bearer queue-token"]);
        assert_eq!(header(request, "x-env"), ["prod"]);
        assert_eq!(header(request, "x-trace"), ["t1"]);
    }

    let mut other_origin = plain.clone();
    other_origin.target = Some(format!("http://{other_addr}/hook/signed"));
    assert_eq!(
        sink.deliver(&other_origin, 1, NOW_MS).await,
        Outcome::Delivered
    );
    let there = &elsewhere.seen()[0];
    assert_eq!(header(there, "authorization"), ["Bearer task-token"]);
    assert_eq!(header(there, "x-env"), ["dev"]);
    assert_eq!(header(there, "x-trace"), ["t1"]);
    assert!(!format!("{sink:?}").contains("queue-token"));
}
