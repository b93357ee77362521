//! Sink throughput on loopback, each next to a baseline measured in the same run.
//!
//! Webhook: `WebhookSink::deliver` (signed, with belfry's headers and classification) against
//! the same POSTs sent with a bare `reqwest::Client`, both to one axum receiver in this process.
//! Redis Streams (default feature `redis-streams`, with `redis-server` installed): the sink's
//! `XADD` against bare `XADD`s on one multiplexed redis-rs connection.
//!
//! ```text
//! cargo run -p belfry-sinks --example sink_throughput -- [deliveries] [concurrency]
//! ```
//! Dependencies are built with opt-level 2 even in the dev profile (workspace setting), so the
//! HTTP and Redis stacks run optimised without a release build of the workspace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use belfry_core::{PayloadKind, QueueName, Task, TaskId, TaskState};
use belfry_sinks::{client_for, Outcome, Sink, TargetPolicy, WebhookConfig, WebhookSink};
use bytes::Bytes;
use tokio::sync::Semaphore;

const DELIVERIES_DEFAULT: usize = 20_000;
const CONCURRENCY_DEFAULT: usize = 32;
/// Baseline and sink runs alternate this many times and the best of each is reported, so a
/// burst of load from other processes on the machine does not decide the comparison.
const ROUNDS: usize = 3;
/// A typical small notification payload.
const PAYLOAD: &[u8] = br#"{"user":12345678,"event":"reminder","title":"Your appointment starts in 15 minutes","url":"https://example.com/a/1"}"#;

fn task(n: usize) -> Task {
    Task {
        id: TaskId(n as u128),
        queue: QueueName::new("bench").expect("valid queue name"),
        due_at_ms: 1_700_000_000_000,
        payload: Bytes::from_static(PAYLOAD),
        payload_kind: PayloadKind::Json,
        payload_dropped: false,
        headers: vec![("x-trace".to_owned(), format!("t-{n}"))],
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

/// This process's CPU time (user + system) from /proc/self/stat, or `None` where that file
/// does not exist. Clock ticks are taken as 1/100 s, the Linux default (USER_HZ).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may contain spaces; fields after it are space-separated.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Throughput and CPU cost of one run.
#[derive(Clone, Copy, Default)]
struct Run {
    per_s: f64,
    /// CPU time of this whole process (client side and, for the webhook, the in-process
    /// receiver) per task, in microseconds. Less sensitive than wall time to other load on
    /// the machine.
    cpu_us: Option<f64>,
}

impl Run {
    fn best(self, other: Run) -> Run {
        Run {
            per_s: self.per_s.max(other.per_s),
            cpu_us: match (self.cpu_us, other.cpu_us) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Runs `one(i)` for i in 0..count with at most `concurrency` in flight.
async fn drive<F, Fut>(count: usize, concurrency: usize, one: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let one = Arc::new(one);
    let limit = Arc::new(Semaphore::new(concurrency));
    let mut running = tokio::task::JoinSet::new();
    let started = Instant::now();
    let cpu_started = cpu_time();
    for i in 0..count {
        let permit = Arc::clone(&limit)
            .acquire_owned()
            .await
            .expect("semaphore is never closed");
        let one = Arc::clone(&one);
        running.spawn(async move {
            let ok = one(i).await;
            drop(permit);
            ok
        });
    }
    let mut failures = 0;
    while let Some(result) = running.join_next().await {
        if !result.unwrap_or(false) {
            failures += 1;
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu_started
        .zip(cpu_time())
        .map(|(a, b)| b.saturating_sub(a));
    assert_eq!(failures, 0, "{failures} deliveries failed");
    Run {
        per_s: count as f64 / elapsed.as_secs_f64(),
        cpu_us: cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / count as f64),
    }
}

fn report(name: &str, sink: Run, baseline: Run) {
    let cpu = |run: Run| {
        run.cpu_us
            .map_or("n/a".to_owned(), |us| format!("{us:.1} µs"))
    };
    println!(
        "{name:<14} sink {:>8.0}/s {:>9} CPU/task   baseline {:>8.0}/s {:>9} CPU/task   throughput sink/baseline {:.0}%   (best of {ROUNDS})",
        sink.per_s,
        cpu(sink),
        baseline.per_s,
        cpu(baseline),
        100.0 * sink.per_s / baseline.per_s
    );
}

async fn webhook(count: usize, concurrency: usize) {
    let app = Router::new().route("/hook", post(|| async { StatusCode::NO_CONTENT }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("receiver address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let url = format!("http://{addr}/hook");
    let policy = TargetPolicy::ALLOW_PRIVATE;

    // Warm the pools so both runs start with open connections.
    let client = client_for(&policy);
    let sink = Arc::new(
        WebhookSink::new(
            WebhookConfig {
                url: url.clone(),
                secret: Some("bench-secret".to_owned()),
                previous_secret: None,
                headers: Default::default(),
                timeout: Duration::from_secs(10),
            },
            policy,
            client.clone(),
        )
        .expect("valid sink config"),
    );
    let warm = Arc::clone(&sink);
    drive(concurrency * 4, concurrency, move |i| {
        let sink = Arc::clone(&warm);
        async move { sink.deliver(&task(i), 1, 0).await == Outcome::Delivered }
    })
    .await;

    let bare = reqwest::Client::new();
    let mut best = (Run::default(), Run::default());
    for _ in 0..ROUNDS {
        let bare = bare.clone();
        let bare_url = url.clone();
        let baseline = drive(count, concurrency, move |_| {
            let request = bare
                .post(bare_url.clone())
                .header("content-type", "application/json")
                .body(Bytes::from_static(PAYLOAD));
            async move {
                request
                    .send()
                    .await
                    .is_ok_and(|response| response.status().is_success())
            }
        })
        .await;

        let measured = Arc::clone(&sink);
        let rate = drive(count, concurrency, move |i| {
            let sink = Arc::clone(&measured);
            async move { sink.deliver(&task(i), 1, 1_700_000_000_000).await == Outcome::Delivered }
        })
        .await;
        best = (best.0.best(rate), best.1.best(baseline));
    }
    report("webhook", best.0, best.1);
}

#[cfg(feature = "redis-streams")]
async fn redis_streams(count: usize, concurrency: usize) {
    use belfry_sinks::{RedisStreamConfig, RedisStreamSink};
    use std::process::{Command, Stdio};

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
        listener.local_addr().expect("probe address").port()
    };
    let dir = std::env::temp_dir().join(format!("belfry-sink-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        println!("redis-streams  skipped: redis-server is not installed");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/0");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut connection = loop {
        let attempt = async {
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await
        };
        match attempt.await {
            Ok(connection) => break connection,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(error) => panic!("redis-server did not start: {error}"),
        }
    };
    let _: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut connection).await;

    let sink = Arc::new(
        RedisStreamSink::new(
            RedisStreamConfig::new(url, "belfry:{queue}"),
            TargetPolicy::ALLOW_PRIVATE,
        )
        .expect("valid sink config"),
    );
    let mut best = (Run::default(), Run::default());
    for _ in 0..ROUNDS {
        let connection = connection.clone();
        let baseline = drive(count, concurrency, move |i| {
            let mut connection = connection.clone();
            async move {
                // The same entry the sink writes, so only the sink's own work differs.
                redis::cmd("XADD")
                    .arg("baseline")
                    .arg("*")
                    .arg("id")
                    .arg(format!("{:032x}", i))
                    .arg("queue")
                    .arg("bench")
                    .arg("attempt")
                    .arg(1)
                    .arg("due_at_ms")
                    .arg(1_700_000_000_000u64)
                    .arg("kind")
                    .arg("json")
                    .arg("payload")
                    .arg(PAYLOAD)
                    .arg("header:x-trace")
                    .arg(format!("t-{i}"))
                    .query_async::<String>(&mut connection)
                    .await
                    .is_ok()
            }
        })
        .await;

        let measured = Arc::clone(&sink);
        let rate = drive(count, concurrency, move |i| {
            let sink = Arc::clone(&measured);
            async move { sink.deliver(&task(i), 1, 0).await == Outcome::Delivered }
        })
        .await;
        best = (best.0.best(rate), best.1.best(baseline));
    }
    report("redis-streams", best.0, best.1);

    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let count = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(DELIVERIES_DEFAULT);
    let concurrency = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(CONCURRENCY_DEFAULT)
        .max(1);
    println!(
        "{count} deliveries, {concurrency} in flight, {} B payload",
        PAYLOAD.len()
    );
    webhook(count, concurrency).await;
    #[cfg(feature = "redis-streams")]
    redis_streams(count, concurrency).await;
}
