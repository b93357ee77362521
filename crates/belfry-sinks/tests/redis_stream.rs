//! The Redis Streams sink against a real redis-server on 127.0.0.1, started by each test.
//! When `redis-server` is not installed the tests fail and say how to install it
//! (`scripts/test.sh` does).
#![cfg(feature = "redis-streams")]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{PayloadKind, QueueName, Task, TaskId, TaskState};
use belfry_sinks::{Outcome, RedisStreamConfig, RedisStreamSink, Sink, TargetPolicy};
use bytes::Bytes;

/// How long a freshly started redis-server may take to answer PING.
const STARTUP_DEADLINE: Duration = Duration::from_secs(20);

/// A redis-server this test started; killed (by its PID, through `Child`) on drop.
struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on a free loopback port; panics when redis-server is not installed.
    async fn start() -> RedisServer {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            installed,
            "redis-server is not installed: run scripts/test.sh (it installs it), or apt-get install redis-server"
        );
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
            listener.local_addr().expect("probe address").port()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        Self::spawn(port, dir).await
    }

    async fn spawn(port: u16, dir: tempfile::TempDir) -> RedisServer {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = RedisServer { child, port, dir };
        server.wait_ready().await;
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Ok(mut connection) = self.connection().await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut connection).await;
                if pong.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Stops it (and waits until the process is gone), keeping the port and dir for a restart.
    fn stop(mut self) -> (u16, tempfile::TempDir) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let port = self.port;
        let dir = tempfile::tempdir().expect("temp dir");
        let old_dir = std::mem::replace(&mut self.dir, dir);
        (port, old_dir)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn task(n: u128, payload: &'static [u8], headers: &[(&str, &str)]) -> Task {
    Task {
        id: TaskId(0xabc0_0000_0000_0000_0000_0000_0000_0000 + n),
        queue: QueueName::new("orders.eu-1").expect("valid queue name"),
        due_at_ms: 1_700_000_000_000,
        payload: Bytes::from_static(payload),
        payload_kind: PayloadKind::Json,
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
        attempts: 1,
        lease_until_ms: None,
        dead_reason: None,
    }
}

fn sink(server: &RedisServer, stream: &str, max_len: Option<u64>) -> RedisStreamSink {
    RedisStreamSink::new(
        RedisStreamConfig {
            url: server.url(),
            stream: stream.to_owned(),
            max_len,
            timeout: Duration::from_secs(5),
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            target: None,
        },
        TargetPolicy::ALLOW_PRIVATE,
    )
    .expect("valid sink config")
}

type Entry = (String, Vec<Vec<u8>>);

async fn entries(server: &RedisServer, key: &str) -> Vec<Vec<(String, Vec<u8>)>> {
    let mut connection = server.connection().await.expect("connect");
    let raw: Vec<Entry> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .expect("XRANGE");
    raw.into_iter()
        .map(|(_id, fields)| {
            fields
                .chunks(2)
                .map(|pair| {
                    (
                        String::from_utf8(pair[0].clone()).expect("utf-8 field name"),
                        pair[1].clone(),
                    )
                })
                .collect()
        })
        .collect()
}

async fn xlen(server: &RedisServer, key: &str) -> u64 {
    let mut connection = server.connection().await.expect("connect");
    redis::cmd("XLEN")
        .arg(key)
        .query_async(&mut connection)
        .await
        .expect("XLEN")
}

#[tokio::test]
async fn appends_an_entry_with_every_field() {
    let server = RedisServer::start().await;
    let sink = sink(&server, "belfry:{queue}", None);
    let task = task(7, br#"{"order":42}"#, &[("X-Trace", "t-1"), ("lang", "fr")]);

    assert_eq!(sink.deliver(&task, 3, 0).await, Outcome::Delivered);

    let entries = entries(&server, "belfry:orders.eu-1").await;
    assert_eq!(entries.len(), 1);
    let expected: Vec<(String, Vec<u8>)> = [
        ("id", format!("{}", task.id).into_bytes()),
        ("queue", b"orders.eu-1".to_vec()),
        ("attempt", b"3".to_vec()),
        ("due_at_ms", b"1700000000000".to_vec()),
        ("kind", b"json".to_vec()),
        ("payload", br#"{"order":42}"#.to_vec()),
        ("header:X-Trace", b"t-1".to_vec()),
        ("header:lang", b"fr".to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(entries[0], expected);
}

#[tokio::test]
async fn concurrent_appends_all_land_and_trimming_bounds_the_stream() {
    let server = RedisServer::start().await;
    let sink = Arc::new(sink(&server, "many", None));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..200 {
        let sink = Arc::clone(&sink);
        tasks.spawn(async move { sink.deliver(&task(n, b"{}", &[]), 1, 0).await });
    }
    while let Some(outcome) = tasks.join_next().await {
        assert_eq!(outcome.expect("delivery task"), Outcome::Delivered);
    }
    assert_eq!(xlen(&server, "many").await, 200);

    // With MAXLEN ~ 100, Redis trims whole nodes (100 entries each by default): the stream
    // stays between the limit and the limit plus one node, far below what was appended.
    let trimmed = sink_with_max_len(&server, "trimmed", 100);
    for n in 0..1_000 {
        assert_eq!(
            trimmed.deliver(&task(n, b"{}", &[]), 1, 0).await,
            Outcome::Delivered
        );
    }
    let len = xlen(&server, "trimmed").await;
    assert!((100..=200).contains(&len), "stream length {len}");
}

fn sink_with_max_len(server: &RedisServer, stream: &str, max_len: u64) -> RedisStreamSink {
    sink(server, stream, Some(max_len))
}

#[tokio::test]
async fn a_key_of_another_type_is_rejected() {
    let server = RedisServer::start().await;
    let mut connection = server.connection().await.expect("connect");
    let _: () = redis::cmd("SET")
        .arg("taken")
        .arg("a string")
        .query_async(&mut connection)
        .await
        .expect("SET");
    let outcome = sink(&server, "taken", None)
        .deliver(&task(1, b"{}", &[]), 1, 0)
        .await;
    match outcome {
        Outcome::Reject { reason } => assert!(reason.contains("WRONGTYPE"), "{reason}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stopped_server_is_retried_and_the_sink_reconnects() {
    let server = RedisServer::start().await;
    let sink = sink(&server, "s", None);
    assert_eq!(
        sink.deliver(&task(1, b"{}", &[]), 1, 0).await,
        Outcome::Delivered
    );

    let (port, dir) = server.stop();
    match sink.deliver(&task(2, b"{}", &[]), 1, 0).await {
        Outcome::Retry { after: None, .. } => {}
        other => panic!("expected a retry, got {other:?}"),
    }

    // Same port again: the sink drops its broken connection and makes a new one.
    let server = RedisServer::spawn(port, dir).await;
    let mut outcome = sink.deliver(&task(3, b"{}", &[]), 1, 0).await;
    if matches!(outcome, Outcome::Retry { .. }) {
        // The first attempt may still find the old connection broken; the next one reconnects.
        outcome = sink.deliver(&task(3, b"{}", &[]), 1, 0).await;
    }
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(xlen(&server, "s").await, 1);
}

/// A Redis restart while the sink is idle leaves it a dead connection, found only when the
/// next batch is written to it: that batch is sent again on a new connection within the same
/// attempt, not failed (which cost every queue a retry and a backoff after each restart).
#[tokio::test]
async fn a_restart_while_idle_costs_no_attempt() {
    let server = RedisServer::start().await;
    let sink = sink(&server, "s", None);
    assert_eq!(
        sink.deliver(&task(1, b"{}", &[]), 1, 0).await,
        Outcome::Delivered
    );
    let (port, dir) = server.stop();
    let server = RedisServer::spawn(port, dir).await;
    let batch = [task(2, b"{}", &[]), task(3, b"{}", &[])];
    let attempts: Vec<_> = batch
        .iter()
        .map(|task| belfry_sinks::Attempt { task, attempt: 1 })
        .collect();
    assert_eq!(
        sink.deliver_batch(&attempts, 0).await,
        vec![Outcome::Delivered, Outcome::Delivered]
    );
    // The restarted server kept nothing (no persistence): it holds exactly the batch.
    assert_eq!(xlen(&server, "s").await, 2);
}

/// `maxlen: 0` would make `XADD ... MAXLEN ~ 0` drop each entry as it is appended, every
/// task counted delivered and none ever read: refused, naming the field.
#[tokio::test]
async fn a_maxlen_of_zero_is_refused() {
    // Checked when the sink is built: nothing connects.
    let mut config = RedisStreamConfig::new("redis://127.0.0.1:9/0", "s");
    config.max_len = Some(0);
    let error = RedisStreamSink::new(config, TargetPolicy::ALLOW_PRIVATE)
        .expect_err("maxlen 0 must be refused");
    assert_eq!(
        error.to_string(),
        "delivery.maxlen: at least 1; leave it out for no trimming"
    );
}

#[tokio::test]
async fn default_policy_refuses_loopback() {
    let server = RedisServer::start().await;
    for url in [server.url(), format!("redis://localhost:{}/0", server.port)] {
        let error = RedisStreamSink::new(RedisStreamConfig::new(url, "s"), TargetPolicy::default())
            .expect_err("loopback must be refused");
        assert!(error.to_string().contains("loopback"), "{error}");
    }
}
