//! The real `belfry` binary on a Redis store: bad `--store` URLs and unreachable or
//! incomplete Redis fail fast with a clear error, and a Redis that stops answering turns
//! into `503 store_unavailable` with `Retry-After` (not a 500, not a hang), then recovers.
//!
//! Each test starts its own `redis-server` on a free loopback port and stops it by PID.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{serve_with_env, BIN};

/// How long a failing start may take: a cold debug binary, plus the 2 s connect timeout.
const FAIL_FAST: Duration = Duration::from_secs(10);

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    listener.local_addr().expect("probe address").port()
}

/// A `redis-server` this test started; stopped (and continued first, if paused) on drop.
struct Redis {
    child: Child,
    port: u16,
    paused: bool,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start(extra: &[&str]) -> Redis {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start redis-server ({e}): install it (apt-get install redis-server; scripts/test.sh does)")
            });
        let redis = Redis {
            child,
            port,
            paused: false,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !redis.pings() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pings(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = [0u8; 5];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut answer).is_ok()
            && &answer == b"+PONG"
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// SIGSTOP: Redis keeps its sockets and answers nothing. Returns once /proc says stopped.
    fn pause(&mut self) {
        self.signal("STOP");
        self.paused = true;
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            if state
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("redis-server {} did not stop", self.child.id());
    }

    fn resume(&mut self) {
        self.signal("CONT");
        self.paused = false;
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if self.paused {
            self.signal("CONT");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `belfry serve --listen 127.0.0.1:0 ARGS` expecting it to exit by itself within
/// [`FAIL_FAST`]: returns (exited successfully, stderr, how long it took). Killed (and the
/// test failed) if it is still running then.
fn serve_expecting_exit(args: &[&str], env: &[(&str, &str)]) -> (bool, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("BELFRY_CONFIG")
        .env_remove("BELFRY_STORE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn belfry serve");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for belfry") {
            break status;
        }
        if started.elapsed() > FAIL_FAST {
            let _ = child.kill();
            let _ = child.wait();
            panic!("belfry serve {args:?} still ran after {FAIL_FAST:?}: it must fail fast");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (status.success(), stderr, took)
}

#[test]
fn a_malformed_store_url_is_refused_with_what_is_wrong() {
    for (url, says) in [
        ("redis://bad", "no port"),
        (
            "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001",
            "empty node",
        ),
        ("redis://127.0.0.1:6379,127.0.0.1:6380", "redis-cluster://"),
    ] {
        let (ok, stderr, _) = serve_expecting_exit(&["--store", url], &[]);
        assert!(!ok, "{url}: exit status must say failure");
        assert!(
            stderr.contains(url) && stderr.contains(says),
            "{url}: the error names the URL and says {says:?}: {stderr}"
        );
    }
    // The same check applies to the environment's value.
    let (ok, stderr, _) = serve_expecting_exit(&[], &[("BELFRY_STORE", "redis://bad")]);
    assert!(!ok && stderr.contains("no port"), "{stderr}");
}

#[test]
fn an_unreachable_redis_fails_the_start_naming_the_url_without_its_password() {
    let port = free_port();
    let url = format!("redis://user:swordfish@127.0.0.1:{port}/0");
    let (ok, stderr, took) = serve_expecting_exit(&["--store", &url], &[]);
    assert!(!ok, "exit status must say failure: {stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("Redis"),
        "the error names the store: {stderr}"
    );
    assert!(
        !stderr.contains("swordfish"),
        "the password is redacted: {stderr}"
    );
    eprintln!("refused connection: exited after {took:?}");
}

#[test]
fn a_redis_that_accepts_but_never_answers_fails_the_start_within_its_timeouts() {
    // The kernel completes the handshake (backlog) but nothing ever reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("address").port();
    let url = format!("redis://127.0.0.1:{port}");
    let (ok, stderr, took) = serve_expecting_exit(
        &["--store", &url],
        &[
            ("BELFRY_REDIS_CONNECT_TIMEOUT", "500ms"),
            ("BELFRY_REDIS_COMMAND_TIMEOUT", "500ms"),
        ],
    );
    assert!(!ok, "exit status must say failure: {stderr}");
    assert!(stderr.contains(&url), "the error names the URL: {stderr}");
    eprintln!("silent Redis: exited after {took:?}");
    drop(silent);
}

#[test]
fn a_cluster_missing_slots_fails_the_start_and_says_which() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nodes_file = dir.path().join("nodes.conf");
    let nodes_file = nodes_file.to_string_lossy().into_owned();
    // A cluster-mode node with no slots assigned: the cluster serves none of the 16384.
    let redis = Redis::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &nodes_file,
    ]);
    let url = format!("redis-cluster://127.0.0.1:{}", redis.port);
    let (ok, stderr, _) = serve_expecting_exit(&["--store", &url], &[]);
    assert!(!ok, "exit status must say failure: {stderr}");
    assert!(
        stderr.contains(&url) && stderr.contains("does not serve slots 0-16383"),
        "the error names the cluster and the missing slots: {stderr}"
    );
}

#[test]
fn tls_to_the_store_is_refused_before_anything_is_tried() {
    let url = "rediss://:swordfish@127.0.0.1:6380";
    let (ok, stderr, took) = serve_expecting_exit(&["--store", url], &[]);
    assert!(!ok, "exit status must say failure: {stderr}");
    assert!(
        stderr.contains("TLS to the store's Redis is not supported yet"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("swordfish"),
        "the password is redacted: {stderr}"
    );
    assert!(!stderr.contains("retry shortly"), "{stderr}");
    eprintln!("rediss:// refused after {took:?}");
}

#[test]
fn a_cluster_url_naming_one_redis_fails_the_start_for_good() {
    let redis = Redis::start(&[]);
    let url = format!("redis-cluster://127.0.0.1:{}", redis.port);
    let (ok, stderr, _) = serve_expecting_exit(&["--store", &url], &[]);
    assert!(!ok, "exit status must say failure: {stderr}");
    let single = format!("redis://127.0.0.1:{}", redis.port);
    assert!(
        stderr.contains("is not a cluster (cluster support disabled)") && stderr.contains(&single),
        "the error says to use redis://: {stderr}"
    );
    assert!(
        !stderr.contains("retry shortly"),
        "not a passing failure: {stderr}"
    );
}

#[test]
fn a_wrong_redis_password_fails_the_start_saying_so() {
    let redis = Redis::start(&[]);
    // Set once it answers (its start-up check pings without a password).
    redis_cli(
        redis.port,
        &["CONFIG", "SET", "requirepass", "the-right-one"],
    );
    let url = format!("redis://:not-it@127.0.0.1:{}", redis.port);
    let (ok, stderr, _) = serve_expecting_exit(&["--store", &url], &[]);
    assert!(!ok, "exit status must say failure: {stderr}");
    assert!(
        stderr.contains("redis refused the credentials") && !stderr.contains("corrupt"),
        "the error says the credentials were refused: {stderr}"
    );
    assert!(
        !stderr.contains("not-it"),
        "the password is redacted: {stderr}"
    );
}

/// `redis-cli -p PORT ARGS`, which must succeed.
fn redis_cli(port: u16, args: &[&str]) {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?} on {port}");
}

/// Makes the queue `jobs` (with the defaults) on the server at `base`.
async fn make_jobs(http: &reqwest::Client, base: &str) {
    let created = http
        .put(format!("{base}/v1/queues/jobs"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
}

/// `belfry serve` on `redis` under `namespace` (8 partitions), with the queue `jobs` made;
/// answers the server, a client and the server's URL.
async fn serve_with_jobs(
    redis: &Redis,
    namespace: &str,
) -> (common::Served, reqwest::Client, String) {
    let server = serve_with_env(
        &["--store", &redis.url()],
        &[
            ("BELFRY_REDIS_NAMESPACE", namespace),
            ("BELFRY_REDIS_PARTITIONS", "8"),
        ],
    );
    let http = reqwest::Client::new();
    let base = server.url.clone();
    make_jobs(&http, &base).await;
    (server, http, base)
}

/// Redis at its `maxmemory` is a full store: `507 insufficient_storage` saying so, as the
/// embedded store answers on a full disk, not a 500 that calls the data corrupt.
#[tokio::test]
async fn a_redis_at_maxmemory_answers_507_then_takes_submits_again() {
    let redis = Redis::start(&[]);
    let (server, http, base) = serve_with_jobs(&redis, "wire507").await;

    redis_cli(redis.port, &["CONFIG", "SET", "maxmemory", "1"]);
    let refused = submit(&http, &base).await;
    assert_eq!(refused.status(), 507);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("maxmemory") && !message.contains("corrupt"),
        "{message}"
    );

    redis_cli(redis.port, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(submit(&http, &base).await.status(), 201);
    still_running_without_panic(server);
}

/// A cancelled task on Redis, within its minute: readable by id and by key, as a duplicate
/// of a resubmit, and never with an empty payload (the store dropped it: no payload field).
#[tokio::test]
async fn a_finished_task_on_redis_shows_no_payload() {
    let redis = Redis::start(&[]);
    let (server, http, base) = serve_with_jobs(&redis, "wiredone").await;
    let queue = format!("{base}/v1/queues/jobs");
    let body =
        serde_json::json!({"payload_base64": "AAE=", "delay_ms": 600_000, "idempotency_key": "k1"});
    let submitted = http
        .post(format!("{queue}/tasks"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), 201);
    let id = submitted.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = http
        .delete(format!("{queue}/keys/k1"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 204);

    let by_id: serde_json::Value = http
        .get(format!("{queue}/tasks/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let by_key = http.get(format!("{queue}/keys/k1")).send().await.unwrap();
    assert_eq!(
        by_key.status(),
        200,
        "the key names the finished task for a minute"
    );
    let again = http
        .post(format!("{queue}/tasks"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["duplicate"], true, "{again}");
    for shown in [by_id, by_key.json().await.unwrap(), again] {
        assert_eq!(shown["state"], "cancelled", "{shown}");
        assert!(shown.get("payload").is_none(), "{shown}");
        assert!(shown.get("payload_base64").is_none(), "{shown}");
    }
    still_running_without_panic(server);
}

async fn submit(http: &reqwest::Client, base: &str) -> reqwest::Response {
    http.post(format!("{base}/v1/queues/jobs/tasks"))
        .json(&serde_json::json!({"payload": {"n": 1}, "delay_ms": 60_000}))
        .send()
        .await
        .expect("the server answers")
}

#[tokio::test]
async fn a_paused_redis_gives_503_with_retry_after_then_the_server_recovers() {
    let mut redis = Redis::start(&[]);
    let server = serve_with_env(
        &["--store", &redis.url(), "--node-id", "node-503"],
        &[
            ("BELFRY_REDIS_COMMAND_TIMEOUT", "300ms"),
            // A call that finds no idle connection opens one, and a paused Redis accepts
            // the TCP connection but answers nothing: the connect timeout bounds that.
            ("BELFRY_REDIS_CONNECT_TIMEOUT", "300ms"),
            ("BELFRY_REDIS_NAMESPACE", "wire503"),
            ("BELFRY_REDIS_PARTITIONS", "8"),
        ],
    );
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("node-503"), "the node id is logged: {log}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = server.url.clone();
    make_jobs(&http, &base).await;
    let before = submit(&http, &base).await;
    assert_eq!(before.status(), 201);
    let before: serde_json::Value = before.json().await.unwrap();
    let kept_id = before["id"].as_str().expect("task id").to_owned();

    redis.pause();
    let started = Instant::now();
    let refused = submit(&http, &base).await;
    let took = started.elapsed();
    assert_eq!(refused.status(), 503, "a paused Redis is a 503");
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    eprintln!("503 after {took:?} with 300 ms command and connect timeouts");
    // A submit makes two store calls (the queue's registry entry, then the put), each of
    // which may time out on its command or on a fresh connection.
    assert!(
        took < Duration::from_millis(2_000),
        "the refusal comes within the timeouts' order, took {took:?}"
    );
    // The server itself still answers meanwhile, but is not ready: a load balancer takes it
    // out of rotation until Redis answers again.
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "not ready while Redis is paused");
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");

    redis.resume();
    let resumed = Instant::now();
    loop {
        let answer = submit(&http, &base).await;
        if answer.status() == 201 {
            break;
        }
        assert_eq!(answer.status(), 503, "only 503 while recovering");
        assert!(
            resumed.elapsed() < Duration::from_secs(5),
            "submits succeed again within 5 s of Redis answering"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("recovered {:?} after resume", resumed.elapsed());
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "ready again once Redis answers");
    let kept = http
        .get(format!("{base}/v1/queues/jobs/tasks/{kept_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 200, "the task put before the pause is kept");

    still_running_without_panic(server);
}

/// Submits one task due in a minute, answering (status, Retry-After, error code, task id,
/// how long it took).
async fn submit_timed(
    http: &reqwest::Client,
    base: &str,
) -> (u16, Option<String>, String, Option<String>, Duration) {
    submit_timed_with(
        http,
        base,
        serde_json::json!({"payload": {"n": 1}, "delay_ms": 60_000}),
    )
    .await
}

/// A submit with an idempotency key: the key decides the task's partition, so the test knows
/// which master stores it.
async fn submit_keyed(
    http: &reqwest::Client,
    base: &str,
    key: &str,
) -> (u16, Option<String>, String, Option<String>, Duration) {
    let body = serde_json::json!({"payload": {"n": 1}, "delay_ms": 60_000, "idempotency_key": key});
    submit_timed_with(http, base, body).await
}

async fn submit_timed_with(
    http: &reqwest::Client,
    base: &str,
    body: serde_json::Value,
) -> (u16, Option<String>, String, Option<String>, Duration) {
    let started = Instant::now();
    let answer = http
        .post(format!("{base}/v1/queues/jobs/tasks"))
        .json(&body)
        .send()
        .await
        .expect("the server answers");
    let took = started.elapsed();
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    let code = body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let id = body["id"].as_str().map(str::to_owned);
    (status, retry_after, code, id, took)
}

/// The keys matching `pattern` on one Redis node (`redis-cli --scan`).
fn keys_on(port: u16, pattern: &str) -> Vec<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--scan", "--pattern", pattern])
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli --scan on {port}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One master of a three-master cluster (no replicas) paused with SIGSTOP: submits whose
/// partition lives there get `503 store_unavailable` with `Retry-After` within the command
/// timeout, the others still succeed (until the cluster itself declares the slots down,
/// `cluster-node-timeout` later, when every submit is a 503), `/readyz` answers 503 (its PING
/// goes to every master), nothing is a 500 and nothing panics. Resumed, the cluster and the
/// server recover, and every acknowledged task is there.
///
/// Long on purpose: one scenario in the order it happens (pause, the two phases of the
/// cluster's view, resume), whose steps share the cluster, the server and the task list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_master_gives_503_for_its_partitions_then_the_server_recovers() {
    let cluster = belfry_store_redis::testing::RedisCluster::start(3, 0);
    let server = serve_with_env(
        &["--store", &cluster.url(), "--node-id", "node-503c"],
        &[
            ("BELFRY_REDIS_COMMAND_TIMEOUT", "300ms"),
            ("BELFRY_REDIS_NAMESPACE", "wire503c"),
            // Enough partitions that every master holds some.
            ("BELFRY_REDIS_PARTITIONS", "32"),
            ("BELFRY_STORE_CALL_TIMEOUT", "2s"),
        ],
    );
    // Past the cluster's node timeout a store call can take many command timeouts (see
    // below); the request is answered at its deadline, 2 s, all the same.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let base = server.url.clone();
    make_jobs(&http, &base).await;
    let mut acknowledged = Vec::new();
    for _ in 0..20 {
        let (status, _, code, id, _) = submit_timed(&http, &base).await;
        assert_eq!(status, 201, "{code}");
        acknowledged.push(id.expect("task id"));
    }

    // The master to pause holds some of the queue's partitions but none of its queue-wide
    // keys (registry, hint, metadata), which every submit may touch: then only the submits
    // whose partition lives there fail. (The layout follows from the namespace, so this is
    // the same master position on every run.)
    let master = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.is_master)
        .find(|n| {
            let keys = keys_on(n.port, "{wire503c/*");
            let queue_wide = keys.iter().any(|k| {
                k.strip_prefix("{wire503c/")
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
            });
            !queue_wide && !keys.is_empty()
        })
        .expect("a master with partitions and no queue-wide key");
    // Keys whose tasks land on the paused master, and on the others: a key decides its
    // task's partition, and the partitions' keys show where each lives.
    let parts_on = |port: u16| -> std::collections::HashSet<u16> {
        keys_on(port, "{wire503c/*")
            .iter()
            .filter_map(|k| {
                k.strip_prefix("{wire503c/")?
                    .split('}')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let paused_parts = parts_on(master.port);
    let other_parts: std::collections::HashSet<u16> = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.is_master && n.port != master.port)
        .flat_map(|n| parts_on(n.port))
        .collect();
    let key_in = |parts: &std::collections::HashSet<u16>, prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|k| parts.contains(&belfry_store_redis::testing::partition_of_key(k, 32)))
            .expect("some key lands in each partition")
    };
    cluster.pause(master.port);
    let paused = Instant::now();
    // One at a time (coalesced submits share one answer), well before the other masters
    // give up on the paused one (the cluster's node timeout, 2 s): first a task another
    // master stores, then one the paused master would.
    let (status, _, code, id, _) = submit_keyed(&http, &base, &key_in(&other_parts, "there")).await;
    assert_eq!(
        status, 201,
        "the other masters' partitions still take submits ({code})"
    );
    acknowledged.push(id.expect("task id"));
    let (status, retry_after, code, _, took) =
        submit_keyed(&http, &base, &key_in(&paused_parts, "paused")).await;
    assert_eq!(
        status, 503,
        "the paused master's partitions answer 503 ({code})"
    );
    assert_eq!(retry_after.as_deref(), Some("1"), "503 with Retry-After");
    assert_eq!(code, "store_unavailable");
    // The cluster client tries a command three times: about 3 × 300 ms. Under load a submit
    // can take longer (one CI run saw 2.0 s: a fresh cluster connection, say, whose slot-map
    // read met the paused master first); the store call's 2 s deadline answers it then.
    // Never later than that.
    assert!(
        took < Duration::from_millis(2_500),
        "the refusal comes by the store call's 2 s deadline, took {took:?}"
    );
    eprintln!(
        "cluster with a paused master: a submit elsewhere stored, one to it refused with 503 \
         after {took:?} (300 ms command timeout), within {:?} of the pause",
        paused.elapsed()
    );
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let asked = Instant::now();
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    let took = asked.elapsed();
    assert_eq!(
        ready.status(),
        503,
        "not ready while a master is out of reach"
    );
    // One PING per master within the 300 ms command timeout, no retries.
    assert!(
        took < Duration::from_millis(1_500),
        "readyz answers within the command timeout, took {took:?}"
    );
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    // Past the cluster's node timeout (2 s) the others mark the master failed and, with no
    // replica to promote, the cluster refuses every slot: still 503s, never a 500. The store
    // call is no longer bounded by the command timeout then (the cluster client reconnects
    // to the paused node, waiting out its connection timeout, on its retries and slot
    // refreshes: 9 to 34 s seen), so the request's deadline (`limits.store_call_timeout`,
    // 2 s here) bounds the answer, also for the submits queued behind a stalled one.
    let mut slowest_down = Duration::ZERO;
    while paused.elapsed() < Duration::from_secs(6) {
        let (status, _, code, id, took) = submit_timed(&http, &base).await;
        assert!(matches!(status, 201 | 503), "{status} {code}");
        assert!(
            took < Duration::from_millis(3_000),
            "answered by the 2 s store-call deadline, took {took:?} ({status} {code})"
        );
        slowest_down = slowest_down.max(took);
        acknowledged.extend(id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("past cluster-node-timeout: the slowest answer took {slowest_down:?}");

    cluster.resume(master.port);
    let resumed = Instant::now();
    // Recovered: a run of submits (spread over every partition) all succeed.
    let mut in_a_row = 0;
    while in_a_row < 20 {
        let (status, _, code, id, _) = submit_timed(&http, &base).await;
        match status {
            201 => {
                in_a_row += 1;
                acknowledged.push(id.expect("task id"));
            }
            503 => in_a_row = 0,
            other => panic!("while recovering: {other} ({code})"),
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(20),
            "submits succeed again within 20 s of the master answering"
        );
    }
    eprintln!("recovered {:?} after the master resumed", resumed.elapsed());
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "ready again once every master answers");
    for id in &acknowledged {
        let kept = http
            .get(format!("{base}/v1/queues/jobs/tasks/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(kept.status(), 200, "acknowledged task {id} is kept");
    }
    still_running_without_panic(server);
}

/// The server outlived what the test did to its store, and never panicked.
fn still_running_without_panic(mut server: common::Served) {
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server is still running"
    );
    let errors = server.errors.lock().unwrap().clone();
    assert!(!errors.contains("panicked"), "no panic: {errors}");
}
