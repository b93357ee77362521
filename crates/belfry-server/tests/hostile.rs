//! Hostile and careless clients on loopback: thousands of half-sent connections must not take
//! the server offline, and the server closes them once their timeouts pass; at the connection
//! cap the listener waits instead of failing; a body over the request limit is refused by
//! every route that reads its body whole. Bounded in count and time.

mod common;

use std::time::{Duration, Instant};

use common::{test_config, TestServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Short timeouts, so the test sees them pass. The idle timeout is the shorter, so a silent
/// connection is closed by it rather than by the header timer.
fn config() -> belfry_server::ServerConfig {
    belfry_server::ServerConfig {
        http_header_read_timeout_ms: 1_000,
        http_body_read_timeout_ms: 300,
        http_idle_timeout_ms: 300,
        ..test_config()
    }
}

/// What a hostile client sends before it stops.
fn partial(kind: usize) -> &'static [u8] {
    match kind % 4 {
        // Connects and says nothing.
        0 => b"",
        // A request line only.
        1 => b"POST /v1/queues/q/tasks HTTP/1.1\r\n",
        // Headers without the blank line that ends them.
        2 => b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n",
        // Half a body.
        _ => b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"payload\": ",
    }
}

/// Reads until the server closes the connection; false if it stays open past `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_partial_connections_do_not_stop_the_server_and_are_closed() {
    const HOSTILE: usize = 2_000;
    let s = TestServer::start_with(config()).await;
    s.queue("q", json!({})).await;
    let addr = s.handle.local_addr();
    let mut hostile = Vec::with_capacity(HOSTILE);
    for kind in 0..HOSTILE {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(partial(kind)).await.expect("send");
        hostile.push(stream);
    }
    // While they are held, ordinary requests are answered promptly.
    let started = Instant::now();
    let health = s.http.get(format!("{}/healthz", s.base)).send().await;
    assert_eq!(health.expect("healthz answers").status(), 200);
    s.submit("q", json!({"payload": 1})).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "ordinary requests took {:?} with {HOSTILE} partial connections held",
        started.elapsed()
    );
    // Past the timeouts, the server has closed every one of them.
    let mut open = 0;
    for stream in &mut hostile {
        if !closed_within(stream, Duration::from_secs(5)).await {
            open += 1;
        }
    }
    assert_eq!(open, 0, "{open} partial connections still open");
    let stats = &s.handle.service().connections;
    assert!(
        stats.closed_idle.load(std::sync::atomic::Ordering::Relaxed) >= (HOSTILE / 4) as u64,
        "the silent connections were not closed as idle: {}",
        stats.closed_idle.load(std::sync::atomic::Ordering::Relaxed)
    );
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_the_listener_waits_then_serves() {
    const CAP: usize = 20;
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_connections_max: CAP,
        // All of them come from one address: this test is about the total cap (and a client
        // allowed the whole cap waits at it rather than being refused).
        http_connections_per_client_max: Some(CAP),
        ..config()
    })
    .await;
    let addr = s.handle.local_addr();
    let mut idle = Vec::new();
    for _ in 0..CAP {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Give the listener time to take all of them, so the cap is reached.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let open = s
        .handle
        .service()
        .connections
        .open
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(open, CAP, "the listener should serve exactly the cap");
    // A new client from the same address (not lighter than the heaviest: it makes no room)
    // waits until the idle ones time out, then is served.
    let started = Instant::now();
    let health = s
        .http
        .get(format!("{}/healthz", s.base))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("answered once slots free up");
    assert_eq!(health.status(), 200);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200),
        "served after {waited:?}: the cap was not enforced"
    );
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_shutting_down_while_the_server_still_serves_its_drain_delay() {
    let s = TestServer::start_with(belfry_server::ServerConfig {
        shutdown_drain_delay_ms: 1_500,
        ..test_config()
    })
    .await;
    s.queue("q", json!({})).await;
    let (status, _) = s.call("GET", "/readyz", serde_json::Value::Null).await;
    assert_eq!(status, 200);
    s.handle.shutdown();
    // Not ready at once; everything else still served during the delay.
    common::eventually("readyz turns 503", || async {
        let (status, body) = s.call("GET", "/readyz", serde_json::Value::Null).await;
        (status == 503 && body["error"]["code"] == "shutting_down").then_some(())
    })
    .await;
    let (status, _) = s.call("GET", "/healthz", serde_json::Value::Null).await;
    assert_eq!(status, 200);
    s.submit("q", json!({"payload": 1})).await;
    let started = Instant::now();
    s.handle.wait().await.expect("clean stop");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A shutdown closes connections that never sent a byte at once: they hold no request to
/// finish, so the stop does not wait for their idle timeout, nor for the grace period (10 s
/// here), while a connection serving a request still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_silent_connections_at_once() {
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_idle_timeout_ms: 60_000,
        http_header_read_timeout_ms: 60_000,
        ..test_config()
    })
    .await;
    let addr = s.handle.local_addr();
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Accepted (the open-connections gauge counts them, and the probe's own), then stopped.
    common::eventually("the silent connections are accepted", || async {
        let text = s.metrics_text().await;
        text.lines()
            .any(|l| l.starts_with("belfry_http_connections_open ") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    let started = Instant::now();
    s.handle.stop().await.expect("clean stop");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stop waited {:?} for connections that never sent a byte",
        started.elapsed()
    );
    for stream in &mut silent {
        assert!(closed_within(stream, Duration::from_secs(2)).await);
    }
}

/// Sends `request` on a fresh connection and reads the whole answer (the server closes).
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> (String, serde_json::Value) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send");
    answer_until_closed(&mut stream).await
}

/// Requests hyper cannot parse never reach the router; they still get the standard error
/// JSON with a stable code, like every other 4xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_request_gets_the_standard_error_json() {
    let s = TestServer::start_with(config()).await;
    s.queue("q", json!({})).await;
    let addr = s.handle.local_addr();
    let many_headers: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), "400", "malformed_http"),
        (
            b"GET /healthz HTTP/1.1\r\nbad header line\r\n\r\n".to_vec(),
            "400",
            "malformed_http",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{many_headers}\r\n").into_bytes(),
            "431",
            "headers_too_large",
        ),
    ];
    for (request, status, code) in cases {
        let (head, json) = raw_exchange(addr, &request).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{head} for {:?}",
            String::from_utf8_lossy(&request)
        );
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(json["error"]["code"], code, "{json}");
    }
    // The mechanism is specific: an ordinary 400 from the router keeps its own body.
    let (head, json) = raw_exchange(
        addr,
        b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1\r\nconnection: close\r\n\r\n{",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    assert_eq!(json["error"]["code"], "malformed_json", "{json}");
    s.handle.stop().await.expect("clean stop");
}

/// A connection from `source` (any address in 127/8 is loopback on Linux), so one test can
/// play several clients.
async fn connect_from(source: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .expect("bind the client's source address");
    socket.connect(addr).await.expect("connect")
}

/// Everything the server sends on `stream` until it closes it.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .expect("read");
    String::from_utf8(answer).expect("utf-8 answer")
}

/// Reads until the server closes, and splits the answer into its head and JSON body.
async fn answer_until_closed(stream: &mut TcpStream) -> (String, serde_json::Value) {
    let text = read_until_closed(stream).await;
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {head}\n\n{body:?}"));
    (head.to_owned(), json)
}

/// Sends `GET /healthz` on `stream`, keeping it open, and returns the status line.
async fn healthz_on(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send");
    read_answer(stream).await
}

/// Reads one answer with a content-length (as `/healthz` gives) on `stream`, head and body;
/// returns its status line.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer")
            .expect("read");
        assert!(
            n > 0,
            "closed before answering: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("a content-length");
            if body.len() >= length {
                return head.lines().next().unwrap_or_default().to_owned();
            }
        }
    }
}

/// Long timeouts, so that nothing but the test closes the connections it holds.
fn per_client_config(per_client: usize) -> belfry_server::ServerConfig {
    belfry_server::ServerConfig {
        http_connections_max: 100,
        http_connections_per_client_max: Some(per_client),
        http_header_read_timeout_ms: 60_000,
        http_idle_timeout_ms: 60_000,
        ..test_config()
    }
}

const CLIENT_A: [u8; 4] = [127, 0, 0, 1];
const CLIENT_B: [u8; 4] = [127, 0, 0, 2];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_cap_gets_503_while_another_client_is_served() {
    const PER_CLIENT: usize = 4;
    let s = TestServer::start_with(per_client_config(PER_CLIENT)).await;
    let addr = s.handle.local_addr();
    let stats = &s.handle.service().connections;
    // Client A holds its cap with connections that send nothing. The listener accepts in
    // order, so these are counted before the next one is.
    let mut held = Vec::new();
    for _ in 0..PER_CLIENT {
        held.push(connect_from(CLIENT_A, addr).await);
    }
    // One more from A is answered at once, without sending anything, and closed.
    for _ in 0..2 {
        let mut extra = connect_from(CLIENT_A, addr).await;
        let (head, json) = answer_until_closed(&mut extra).await;
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("retry-after: 1"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(json["error"]["code"], "too_many_connections", "{json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("http.connections_per_client_max"),
            "{message}"
        );
    }
    assert_eq!(stats.open_from(CLIENT_A.into()), PER_CLIENT);
    assert_eq!(
        stats
            .refused_per_client
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    // Operators see it: the refusals and the open connections are in /metrics (asked from a
    // third address: A has no place left).
    let mut asking = connect_from([127, 0, 0, 3], addr).await;
    asking
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("send");
    let metrics = read_until_closed(&mut asking).await;
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
            .to_owned()
    };
    assert_eq!(
        line("belfry_http_connections_refused_total"),
        "belfry_http_connections_refused_total{reason=\"per_client_cap\"} 2"
    );
    // A's four held ones, at least, and the one /metrics itself came on.
    let open: f64 = line("belfry_http_connections_open ")
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(open >= (PER_CLIENT + 1) as f64, "{open}");
    assert!(
        line("belfry_http_connections_accepted_total ").ends_with(&format!(" {}", PER_CLIENT + 3))
    );
    // Client B is served meanwhile, up to its own cap, on connections it keeps.
    let mut others = Vec::new();
    for _ in 0..PER_CLIENT {
        let mut other = connect_from(CLIENT_B, addr).await;
        assert_eq!(healthz_on(&mut other).await, "HTTP/1.1 200 OK");
        others.push(other);
    }
    assert_eq!(stats.open_from(CLIENT_B.into()), PER_CLIENT);
    // A's held connections were not disturbed: each still gets an answer.
    for stream in &mut held {
        assert_eq!(healthz_on(stream).await, "HTTP/1.1 200 OK");
    }
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_count_goes_down_as_its_connections_close() {
    const PER_CLIENT: usize = 2;
    let s = TestServer::start_with(per_client_config(PER_CLIENT)).await;
    let addr = s.handle.local_addr();
    let stats = &s.handle.service().connections;
    let mut held = Vec::new();
    for _ in 0..PER_CLIENT {
        let mut stream = connect_from(CLIENT_A, addr).await;
        assert_eq!(healthz_on(&mut stream).await, "HTTP/1.1 200 OK");
        held.push(stream);
    }
    let (head, _) = answer_until_closed(&mut connect_from(CLIENT_A, addr).await).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "at the cap: {head}");
    // The client closes one: the server sees the end of the stream and gives the place back.
    drop(held.pop());
    common::eventually(
        "the closed connection leaves the client's count",
        || async { (stats.open_from(CLIENT_A.into()) == PER_CLIENT - 1).then_some(()) },
    )
    .await;
    let mut again = connect_from(CLIENT_A, addr).await;
    assert_eq!(healthz_on(&mut again).await, "HTTP/1.1 200 OK");
    held.push(again);
    let (head, _) = answer_until_closed(&mut connect_from(CLIENT_A, addr).await).await;
    assert!(
        head.starts_with("HTTP/1.1 503 "),
        "at the cap again: {head}"
    );
    // All closed: the address is forgotten.
    held.clear();
    common::eventually("every connection leaves the count", || async {
        (stats.open_from(CLIENT_A.into()) == 0 && stats.client_addresses() == 0).then_some(())
    })
    .await;
    s.handle.stop().await.expect("clean stop");
}

/// `limits.request_max` bounds the body of every route that reads it whole, whichever router
/// the route came from (the API's, the schedules', the reminders', the tokens'): each answers
/// `413 payload_too_large`. The bulk subscriber routes stream their bodies under their own
/// limit, so the same size goes through there.
#[tokio::test]
async fn a_body_over_the_request_limit_is_refused_by_every_router() {
    let config = test_config();
    let limit = config.request_bytes_max;
    let s = TestServer::start_with(config).await;
    s.queue("q", json!({})).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "r", "queue": "q", "delay_ms": 60_000}),
        201,
    )
    .await;
    // Valid JSON of the route's shape (a string field padded past the limit), so only its
    // size is at fault.
    let pad = "x".repeat(limit + 1);
    let too_large = [
        (
            "/v1/queues/q/tasks:batch",
            format!(r#"{{"tasks":[{{"payload":"{pad}"}}]}}"#),
        ),
        (
            "/v1/schedules",
            format!(r#"{{"id":"s","queue":"q","cron":"{pad}"}}"#),
        ),
        (
            "/v1/reminders",
            format!(r#"{{"id":"{pad}","queue":"q","delay_ms":1}}"#),
        ),
        (
            "/v1/tokens",
            format!(r#"{{"name":"{pad}","scopes":["read"]}}"#),
        ),
    ];
    for (path, body) in too_large {
        let (status, answer) = s.raw("POST", path, Some(body)).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (413, Some("payload_too_large")),
            "POST {path}: {answer}"
        );
    }
    let mut ids = String::new();
    for i in 0.. {
        if ids.len() > limit {
            break;
        }
        ids.push_str(&format!("user-{i}\n"));
    }
    let (status, answer) = s
        .raw("POST", "/v1/reminders/r/subscribers", Some(ids))
        .await;
    assert_eq!(status, 200, "bulk subscribe over request_max: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_their_timeout_never_before_and_busy_ones_stay() {
    const IDLE_MS: u64 = 400;
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_idle_timeout_ms: IDLE_MS,
        http_header_read_timeout_ms: 10_000,
        ..test_config()
    })
    .await;
    let addr = s.handle.local_addr();
    // Silent connections, opened together: each closes at its timeout, or up to a quarter
    // later (spread by connection), and none before.
    let mut silent = Vec::new();
    for _ in 0..16 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // One that asks for `/healthz` every 150 ms: bytes move, so it outlives the timeout.
    let mut busy = TcpStream::connect(addr).await.expect("connect");
    let busy_from = Instant::now();
    while busy_from.elapsed() < Duration::from_millis(3 * IDLE_MS) {
        assert_eq!(healthz_on(&mut busy).await, "HTTP/1.1 200 OK");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for stream in &mut silent {
        // The busy loop above outlasted every silent connection's timeout and spread (the
        // bound leaves a loaded machine time to get to it).
        assert!(closed_within(stream, Duration::from_secs(5)).await);
    }
    let closed = s
        .handle
        .service()
        .connections
        .closed_idle
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(closed, 16, "the silent connections closed as idle");

    // And not early: a fresh silent connection is still open just before its timeout.
    let mut late = TcpStream::connect(addr).await.expect("connect");
    let opened = Instant::now();
    let closed_at = loop {
        if closed_within(&mut late, Duration::from_millis(10)).await {
            break opened.elapsed();
        }
        assert!(opened.elapsed() < Duration::from_secs(10), "never closed");
    };
    assert!(
        closed_at >= Duration::from_millis(IDLE_MS),
        "closed after {closed_at:?}, before its {IDLE_MS} ms idle timeout"
    );
}

/// How many of `held` the server has closed (each given 20 ms to show it).
async fn count_closed(held: &mut [TcpStream]) -> usize {
    let mut closed = 0;
    for stream in held {
        if closed_within(stream, Duration::from_millis(20)).await {
            closed += 1;
        }
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_light_client_takes_the_place_of_a_heavy_clients_silent_connection() {
    const CAP: usize = 8;
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_connections_max: CAP,
        ..per_client_config(CAP)
    })
    .await;
    let addr = s.handle.local_addr();
    let stats = &s.handle.service().connections;
    // A holds every place with connections that never send (their timeouts are a minute).
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(connect_from(CLIENT_A, addr).await);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.open.load(std::sync::atomic::Ordering::Relaxed) < CAP {
        assert!(Instant::now() < deadline, "the cap was never reached");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // B, light, is served at once: one of A's silent connections is closed for it.
    let started = Instant::now();
    let mut b = connect_from(CLIENT_B, addr).await;
    assert_eq!(healthz_on(&mut b).await, "HTTP/1.1 200 OK");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(stats.evicted.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        count_closed(&mut held).await,
        1,
        "exactly one of A's connections made room"
    );
    // A's next connection is not light: it waits for a place, and gets the one B gives back.
    let mut again = connect_from(CLIENT_A, addr).await;
    again
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send");
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), again.read(&mut buf)).await;
    assert!(early.is_err(), "A's connection was served over the cap");
    assert_eq!(stats.waiting.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(b);
    assert_eq!(read_answer(&mut again).await, "HTTP/1.1 200 OK");
    assert_eq!(stats.evicted.load(std::sync::atomic::Ordering::Relaxed), 1);
    s.handle.stop().await.expect("clean stop");
}

/// Found by the HTTP audit: keep-alive connections that served a request and now trickle
/// their next head held every place at the cap, and no newcomer was ever served. They are
/// evictable like silent ones; the one picked is closed, the others keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_light_client_takes_the_place_of_a_half_sent_keep_alive_connection() {
    const CAP: usize = 6;
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_connections_max: CAP,
        ..per_client_config(CAP)
    })
    .await;
    let addr = s.handle.local_addr();
    let stats = &s.handle.service().connections;
    // A holds every place: each connection served a request, then sent half of the next
    // head (the header and idle timeouts are a minute: only eviction frees a place).
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut stream = connect_from(CLIENT_A, addr).await;
        assert_eq!(healthz_on(&mut stream).await, "HTTP/1.1 200 OK");
        stream.write_all(b"GET /healthz HT").await.expect("send");
        held.push(stream);
    }
    // B, light, is served well before any timeout could free a place.
    let mut b = connect_from(CLIENT_B, addr).await;
    assert_eq!(healthz_on(&mut b).await, "HTTP/1.1 200 OK");
    assert_eq!(stats.evicted.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        count_closed(&mut held).await,
        1,
        "exactly one of A's connections made room"
    );
    s.handle.stop().await.expect("clean stop");
}

/// A client that trickles its headers (never idle, never done) is closed by the header
/// timeout, and counted with the connections closed for being too slow. Found by the HTTP
/// audit: it was closed without an answer; it gets `408 request_timeout` first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_headers_are_cut_at_the_header_timeout_and_counted() {
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_header_read_timeout_ms: 400,
        http_idle_timeout_ms: 10_000,
        ..test_config()
    })
    .await;
    let stats = &s.handle.service().connections;
    let before = stats.closed_idle.load(std::sync::atomic::Ordering::Relaxed);
    let mut stream = TcpStream::connect(s.handle.local_addr())
        .await
        .expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("send");
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let mut answer = Vec::new();
    // One header byte every 50 ms: always moving, never finished.
    let closed = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if stream.write_all(b"x").await.is_err() {
            break true;
        }
        match tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            _ if started.elapsed() > Duration::from_secs(5) => break false,
            _ => {}
        }
    };
    assert!(closed, "still open after {:?}", started.elapsed());
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an answer");
    assert!(
        head.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{head}"
    );
    assert!(head.contains("connection: close"), "{head}");
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["error"]["code"], "request_timeout", "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("http.header_read_timeout"), "{message}");
    let after = stats.closed_idle.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(after - before, 1, "the header timeout's close is counted");

    // A keep-alive connection that sends nothing after its response is closed by the same
    // timer without an answer: it asked for none.
    let mut quiet = TcpStream::connect(s.handle.local_addr())
        .await
        .expect("connect");
    assert_eq!(healthz_on(&mut quiet).await, "HTTP/1.1 200 OK");
    assert_eq!(read_until_closed(&mut quiet).await, "");
    s.handle.stop().await.expect("clean stop");
}

/// A body that stops part way is answered, once the body timeout passes, with what to fix,
/// and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_with_the_setting_that_cut_it() {
    let s = TestServer::start_with(config()).await;
    s.queue("q", json!({})).await;
    let mut stream = TcpStream::connect(s.handle.local_addr())
        .await
        .expect("connect");
    stream.write_all(partial(3)).await.expect("send");
    let (head, json) = answer_until_closed(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 408 "), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(json["error"]["code"], "request_timeout", "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("sent nothing for http.body_read_timeout"),
        "{message}"
    );
    s.handle.stop().await.expect("clean stop");
}

/// Found by the HTTP audit: a body drip-fed a byte at a time, each inside the body read
/// timeout, held its connection for ever (and, not evictable, a few addresses could hold
/// every place). It is cut once its total time is spent, answered 408, and closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drip_fed_body_is_cut_at_its_total_deadline() {
    const TIMEOUT_MS: u64 = 1_000;
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_body_read_timeout_ms: TIMEOUT_MS,
        ..config()
    })
    .await;
    s.queue("q", json!({})).await;
    let stream = TcpStream::connect(s.handle.local_addr())
        .await
        .expect("connect");
    let (mut reading, mut writing) = stream.into_split();
    writing
        .write_all(
            b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 1000\r\n\r\n{",
        )
        .await
        .expect("send");
    let started = Instant::now();
    // A byte every 50 ms: never silent for the timeout, and far below a KiB a second.
    let dripping = tokio::spawn(async move {
        while started.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if writing.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), reading.read_to_end(&mut answer))
        .await
        .expect("answered and closed while the body still drips")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(text.contains("arrived too slowly"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(TIMEOUT_MS),
        "{:?}",
        started.elapsed()
    );
    dripping.abort();
    s.handle.stop().await.expect("clean stop");
}

/// A JSON request that declares a body over the limit is refused at once, without waiting
/// for a body that may never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_is_refused_at_once() {
    let s = TestServer::start_with(belfry_server::ServerConfig {
        http_body_read_timeout_ms: 30_000,
        request_bytes_max: 1024 * 1024,
        payload_bytes_max: 1024 * 1024,
        ..test_config()
    })
    .await;
    s.queue("q", json!({})).await;
    let mut stream = TcpStream::connect(s.handle.local_addr())
        .await
        .expect("connect");
    let head = "POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                content-length: 20971520\r\n\r\n";
    stream.write_all(head.as_bytes()).await.expect("send");
    let started = Instant::now();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await;
    let n = read.expect("answered within 5 s").expect("read");
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("payload_too_large"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    s.handle.stop().await.expect("clean stop");
}
