//! Three `belfry serve` processes on one three-master Redis Cluster, one of them killed with
//! `kill -9` in the middle of a steady load: its shards move to the others, every
//! acknowledged task is delivered, none before it is due, and duplicates (which at-least-once
//! allows for tasks in flight at the kill) are counted. The takeover is reported.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use belfry_store_redis::testing::RedisCluster;
use common::{serve_with_env, Served};
use serde_json::{json, Value};

/// Tasks a second the producer submits (spread over the live nodes), each due shortly after.
const RATE: u64 = 1_000;
const RUN: Duration = Duration::from_secs(8);
const KILL_AT: Duration = Duration::from_secs(3);
const DUE_AFTER_MS: u64 = 300;

/// The two tests start three nodes and a cluster each; run together on two cores they would
/// measure each other (the rate test asks for 2%), so they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What the webhook receiver saw: task id → (due at, received at) of each delivery.
type Seen = Arc<Mutex<HashMap<String, Vec<(u64, u64)>>>>;

async fn hook(State(seen): State<Seen>, headers: HeaderMap) -> StatusCode {
    let at = now_ms();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let due: u64 = text("belfry-due-at").parse().unwrap_or(0);
    seen.lock()
        .unwrap()
        .entry(text("belfry-task-id"))
        .or_default()
        .push((due, at));
    StatusCode::OK
}

async fn receiver() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

fn node(cluster: &RedisCluster, id: &str) -> Served {
    serve_with_env(
        &["--store", &cluster.url(), "--node-id", id],
        &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")],
    )
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> Result<(u16, Value), String> {
    let response = http
        .post(url)
        .json(&body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let value = response.json().await.unwrap_or(Value::Null);
    Ok((status, value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_shards_move_and_nothing_is_lost_or_early() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 0);
    let (hook_url, seen) = receiver().await;
    let mut nodes: Vec<Option<Served>> = ["n0", "n1", "n2"]
        .iter()
        .map(|id| Some(node(&cluster, id)))
        .collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| n.as_ref().unwrap().url.clone())
        .collect();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let queue = json!({"delivery": {"type": "webhook", "url": hook_url, "timeout_ms": 2_000}});
    let created = http
        .put(format!("{}/v1/queues/steady", urls[0]))
        .json(&queue)
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");

    // The producer: batches every 20 ms, round robin over the live nodes; every task it got
    // an answer for is acknowledged and must be delivered.
    let mut acknowledged: HashMap<String, u64> = HashMap::new();
    let mut refused = 0u64;
    let started = Instant::now();
    let mut killed_at_ms = None;
    let per_batch = (RATE / 50) as usize;
    let mut turn = 0usize;
    while started.elapsed() < RUN {
        if killed_at_ms.is_none() && started.elapsed() >= KILL_AT {
            let mut victim = nodes[2].take().unwrap();
            victim.child.kill().unwrap(); // SIGKILL: no shard is handed over
            victim.child.wait().unwrap();
            killed_at_ms = Some(now_ms());
        }
        let live: Vec<&String> = urls
            .iter()
            .zip(&nodes)
            .filter(|(_, n)| n.is_some())
            .map(|(u, _)| u)
            .collect();
        let url = live[turn % live.len()];
        turn += 1;
        let tasks: Vec<Value> = (0..per_batch)
            .map(|i| json!({"payload": {"i": i}, "delay_ms": DUE_AFTER_MS}))
            .collect();
        match post(
            &http,
            &format!("{url}/v1/queues/steady/tasks:batch"),
            json!({"tasks": tasks}),
        )
        .await
        {
            Ok((200, answer)) => {
                for result in answer["results"].as_array().unwrap() {
                    if let (Some(id), Some(due)) =
                        (result["id"].as_str(), result["due_at_ms"].as_u64())
                    {
                        acknowledged.insert(id.to_owned(), due);
                    }
                }
            }
            _ => refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed_at_ms = killed_at_ms.unwrap();

    // Everything acknowledged arrives (the killed node's leases expire, its shards move).
    all_delivered_within(&seen, &acknowledged, Duration::from_secs(60)).await;
    let seen = seen.lock().unwrap();
    let mut early = 0;
    let mut duplicates = 0;
    let mut worst_after_kill = 0u64;
    for (id, due) in &acknowledged {
        let deliveries = &seen[id];
        duplicates += deliveries.len() - 1;
        for &(_, at) in deliveries {
            if at < *due {
                early += 1;
            }
        }
        let first = deliveries.iter().map(|&(_, at)| at).min().unwrap();
        if *due >= killed_at_ms {
            worst_after_kill = worst_after_kill.max(first.saturating_sub(*due));
        }
    }
    eprintln!(
        "redis nodes: {} tasks acknowledged ({refused} batches refused), all delivered; \
         {duplicates} duplicate deliveries; takeover: tasks due after the kill were at most \
         {worst_after_kill} ms late",
        acknowledged.len()
    );
    assert_eq!(early, 0, "deliveries before the due time");
    assert!(
        worst_after_kill <= 5_000 + 1_000,
        "the killed node's shards took {worst_after_kill} ms to move (target 5 s)"
    );
}

/// One queue limited to 1,000 tasks a second, delivered by three nodes: together they deliver
/// 1,000 a second (within 2%), not 3,000 — the limit is one token bucket in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_rate_limit() {
    let _turn = ONE_AT_A_TIME.lock().await;
    const LIMIT: u64 = 1_000;
    const BACKLOG: usize = 7_000;
    let cluster = RedisCluster::start(3, 0);
    let (hook_url, seen) = receiver().await;
    let nodes: Vec<Served> = ["r0", "r1", "r2"]
        .iter()
        .map(|id| node(&cluster, id))
        .collect();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Paused while the backlog is put, so every node starts from a full queue.
    let queue = json!({"delivery": {"type": "webhook", "url": hook_url, "timeout_ms": 2_000},
                       "rate_per_s": LIMIT, "burst": 100, "paused": true});
    let created = http
        .put(format!("{}/v1/queues/limited", nodes[0].url))
        .json(&queue)
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");
    for (i, chunk) in (0..BACKLOG).collect::<Vec<_>>().chunks(100).enumerate() {
        let tasks: Vec<Value> = chunk.iter().map(|i| json!({"payload": {"i": i}})).collect();
        let url = format!("{}/v1/queues/limited/tasks:batch", nodes[i % 3].url);
        let (status, _) = post(&http, &url, json!({"tasks": tasks})).await.unwrap();
        assert_eq!(status, 200);
    }
    let resumed = http
        .post(format!("{}/v1/queues/limited/resume", nodes[1].url))
        .send()
        .await
        .unwrap();
    assert!(resumed.status().is_success(), "{resumed:?}");
    // Wait for a few seconds of deliveries, then count those in a window that skips the start
    // (the burst, and nodes hearing of the resume) and ends before the backlog runs out.
    let deadline = Instant::now() + Duration::from_secs(30);
    let times = loop {
        let times: Vec<u64> = {
            let seen = seen.lock().unwrap();
            let mut t: Vec<u64> = seen
                .values()
                .flat_map(|d| d.iter().map(|&(_, at)| at))
                .collect();
            t.sort_unstable();
            t
        };
        if times.len() >= 5_500 || Instant::now() > deadline {
            break times;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        times.len() >= 5_500,
        "only {} deliveries in 30 s",
        times.len()
    );
    let (from, to) = (times[0] + 1_000, times[0] + 5_000);
    let in_window = times.iter().filter(|&&t| t >= from && t < to).count() as f64;
    let rate = in_window / 4.0;
    eprintln!("shared rate limit: {rate:.0} deliveries/s across 3 nodes (limit {LIMIT}/s)");
    let limit = LIMIT as f64;
    assert!(
        (rate - limit).abs() <= 0.02 * limit,
        "delivered {rate:.0}/s with a limit of {LIMIT}/s"
    );
}

/// How long the paused node sleeps: well past its leases' 3 s, so the other node takes its
/// shards and delivers what falls due meanwhile.
const PAUSE: Duration = Duration::from_secs(6);

/// Sends `signal` to `pid` and waits until `/proc` shows it stopped (`T`) or running again.
fn signal_and_wait(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
    let want_stopped = signal == "STOP";
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state.is_some_and(|s| (s == 'T') == want_stopped) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} after SIGSTOP/SIGCONT: state {state:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The sum of the samples of `name` on `base`'s `/metrics` whose labels contain `labels`.
async fn metric(http: &reqwest::Client, base: &str, name: &str, labels: &str) -> f64 {
    let text = http
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("read /metrics");
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']) && rest.contains(labels))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Submits batches of 20 tasks due `delay_ms` after each submit, every 50 ms for `run`, round
/// robin over `urls`; records every acknowledged task's due time.
async fn produce(
    http: &reqwest::Client,
    urls: &[&str],
    run: Duration,
    delay_ms: u64,
    acknowledged: &mut HashMap<String, u64>,
) {
    let started = Instant::now();
    let mut turn = 0;
    while started.elapsed() < run {
        let tasks: Vec<Value> = (0..20)
            .map(|i| json!({"payload": {"i": i}, "delay_ms": delay_ms}))
            .collect();
        let url = format!("{}/v1/queues/napping/tasks:batch", urls[turn % urls.len()]);
        turn += 1;
        let (status, answer) = post(http, &url, json!({"tasks": tasks}))
            .await
            .expect("a live node answers");
        assert_eq!(status, 200, "{answer}");
        for result in answer["results"].as_array().expect("results") {
            let id = result["id"].as_str().expect("id").to_owned();
            acknowledged.insert(id, result["due_at_ms"].as_u64().expect("due_at_ms"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pauses node `a` (SIGSTOP) for [`PAUSE`] while submitting through `b`: tasks due in the
/// pause, and some due right at the wake-up and just after it. Returns when it was stopped
/// (wall clock) and when it woke.
async fn sleep_past_leases(
    http: &reqwest::Client,
    a: &Served,
    b: &str,
    acknowledged: &mut HashMap<String, u64>,
) -> (u64, Instant) {
    signal_and_wait(a.child.id(), "STOP");
    let stopped_at = now_ms();
    // Through the awake node only: tasks in the sleeper's shards fall due while it sleeps.
    produce(
        http,
        &[b],
        PAUSE - Duration::from_secs(1),
        300,
        acknowledged,
    )
    .await;
    let cont_at_planned = stopped_at + PAUSE.as_millis() as u64;
    for after_wake_ms in [0, 100, 300, 600] {
        let delay_ms = (cont_at_planned + after_wake_ms).saturating_sub(now_ms());
        produce(http, &[b], Duration::from_millis(1), delay_ms, acknowledged).await;
    }
    let left = cont_at_planned.saturating_sub(now_ms());
    tokio::time::sleep(Duration::from_millis(left)).await;
    signal_and_wait(a.child.id(), "CONT");
    (stopped_at, Instant::now())
}

/// Waits (up to 30 s) until every acknowledged task was delivered, then a moment more, so
/// that a late second delivery would show.
async fn wait_delivered(seen: &Seen, acknowledged: &HashMap<String, u64>) {
    all_delivered_within(seen, acknowledged, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Polls until every acknowledged task was delivered; fails the test after `within`.
async fn all_delivered_within(seen: &Seen, acknowledged: &HashMap<String, u64>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let missing = {
            let seen = seen.lock().unwrap();
            acknowledged
                .keys()
                .filter(|id| !seen.contains_key(*id))
                .count()
        };
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} acknowledged tasks never delivered",
            acknowledged.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deliveries before their due time, second deliveries, and how late the first delivery of
/// a task due in (`from`, `to`) came at worst.
fn tally(
    seen: &Seen,
    acknowledged: &HashMap<String, u64>,
    from: u64,
    to: u64,
) -> (usize, usize, u64) {
    let (mut early, mut duplicates, mut worst) = (0, 0, 0u64);
    let seen = seen.lock().unwrap();
    for (id, due) in acknowledged {
        let deliveries = &seen[id];
        duplicates += deliveries.len() - 1;
        early += deliveries.iter().filter(|&&(_, at)| at < *due).count();
        if *due > from && *due < to {
            let first = deliveries.iter().map(|&(_, at)| at).min().unwrap();
            worst = worst.max(first.saturating_sub(*due));
        }
    }
    (early, duplicates, worst)
}

/// The GC-like pause: a whole `belfry serve` process stopped (SIGSTOP) for longer
/// than its shard leases live. The other node takes its shards and delivers what falls due
/// meanwhile; woken (SIGCONT), the paused node finds its fences past their local deadline and
/// drops them before it can claim with them (its `lapsed` lease count shows it; a claim that
/// raced the drop is refused, counted by `belfry_fence_refused_total`), then gets its share
/// back under new fencing tokens. Every task is delivered, none early, none twice.
///
/// Were the local deadline gone, the woken node would keep its old leases until a renew was
/// refused: `lapsed` would stay 0 and this test fails. (That Redis refuses a claim with a
/// stale fence is shown in-process, where the pause can be placed between reading the fence
/// and claiming: `ownership_tests::a_paused_node_cannot_claim_with_its_old_fence`.)
///
/// Long (about 115 lines) on purpose: one scenario in the order it happens (start, pause,
/// submit, wake, check), whose steps share the nodes, the receiver and the task list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_leases_does_not_claim_with_its_old_fences() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 0);
    let (hook_url, seen) = receiver().await;
    let a = node(&cluster, "napper");
    let b = node(&cluster, "waker");
    // No kept-alive connections: the woken node's server closes those that idled through
    // the pause as it wakes, racing a request sent on one (connection reset).
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    // A 10 s webhook timeout (a 20 s task lease): a delivery the pause catches in flight is
    // still leased when its node wakes, so it is acked, not delivered again.
    let queue = json!({"delivery": {"type": "webhook", "url": hook_url, "timeout_ms": 10_000}});
    let created = http
        .put(format!("{}/v1/queues/napping", b.url))
        .json(&queue)
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");
    let owned = "belfry_shard_leases_owned";
    let deadline = Instant::now() + Duration::from_secs(15);
    while metric(&http, &a.url, owned, "").await == 0.0
        || metric(&http, &b.url, owned, "").await == 0.0
        || metric(&http, &a.url, "belfry_shard_nodes_live", "").await != 2.0
    {
        assert!(
            Instant::now() < deadline,
            "the two nodes never split the shards"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lapsed = |base: String| {
        let http = http.clone();
        async move {
            metric(
                &http,
                &base,
                "belfry_shard_leases_lost_total",
                "reason=\"lapsed\"",
            )
            .await
        }
    };
    // Under load a renew may land late now and then; only what the pause does counts.
    let a_lapsed_before = lapsed(a.url.clone()).await;
    let a_held = metric(&http, &a.url, owned, "").await;
    let a_took_before = metric(&http, &a.url, "belfry_shard_takeovers_total", "").await;
    let b_took_before = metric(&http, &b.url, "belfry_shard_takeovers_total", "").await;

    let mut acknowledged = HashMap::new();
    let both = [a.url.as_str(), b.url.as_str()];
    produce(&http, &both, Duration::from_secs(1), 300, &mut acknowledged).await;

    let (stopped_at, woke) = sleep_past_leases(&http, &a, &b.url, &mut acknowledged).await;
    let woke_at = now_ms();

    // The woken node dropped its old fences on its own; then it gets its share back.
    let mut dropped_after = None;
    let mut back_after = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped_after.is_none() || back_after.is_none() {
        assert!(
            Instant::now() < deadline,
            "the woken node: dropped its old leases after {dropped_after:?}, \
             owns a share again after {back_after:?}"
        );
        if dropped_after.is_none() && lapsed(a.url.clone()).await >= a_lapsed_before + a_held {
            dropped_after = Some(woke.elapsed());
        }
        if back_after.is_none()
            && metric(&http, &a.url, "belfry_shard_takeovers_total", "").await > a_took_before
        {
            back_after = Some(woke.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    produce(&http, &both, Duration::from_secs(2), 300, &mut acknowledged).await;

    wait_delivered(&seen, &acknowledged).await;
    let (early, duplicates, worst_in_pause) = tally(&seen, &acknowledged, stopped_at, woke_at);
    let refused_node = metric(&http, &a.url, "belfry_fence_refused_total", "at=\"node\"").await;
    let refused_redis = metric(&http, &a.url, "belfry_fence_refused_total", "at=\"redis\"").await;
    let b_took = metric(&http, &b.url, "belfry_shard_takeovers_total", "").await - b_took_before;
    let (a_held, b_took) = (a_held as u64, b_took as u64);
    let a_lapsed = (lapsed(a.url.clone()).await - a_lapsed_before) as u64;
    eprintln!(
        "paused node: {} tasks, all delivered, {early} early, {duplicates} duplicates; \
         asleep {} ms holding {a_held} leases, the other node took {b_took}; tasks due in the \
         pause at most {worst_in_pause} ms late; woken, it dropped {a_lapsed} lapsed leases \
         within {dropped_after:?} and owned a share again after {back_after:?}; claims refused \
         for a stale fence: {} on the node, {} by Redis",
        acknowledged.len(),
        woke_at - stopped_at,
        refused_node as u64,
        refused_redis as u64,
    );
    assert_eq!(early, 0, "deliveries before the due time");
    assert_eq!(duplicates, 0, "a task delivered twice");
    assert!(b_took >= a_held, "the awake node took the sleeper's shards");
    assert!(
        a_lapsed >= a_held,
        "the sleeper dropped every lease it held as lapsed"
    );
    assert!(
        worst_in_pause <= 5_000,
        "tasks due in the pause waited {worst_in_pause} ms for the takeover (target 5 s)"
    );
    let log = a.log.lock().unwrap().clone();
    assert!(
        log.contains("shard leases passed their deadline"),
        "the sleeper logs that it stopped claiming: {log}"
    );
    for served in [&a, &b] {
        let errors = served.errors.lock().unwrap().clone();
        assert!(!errors.contains("panicked"), "no panic: {errors}");
    }
}

/// A receiver that holds each request `SLOW` and records how many it held at once at most.
#[derive(Default)]
struct Slow {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    seen: Mutex<HashMap<String, usize>>,
}

const SLOW: Duration = Duration::from_millis(200);

async fn slow_hook(State(slow): State<Arc<Slow>>, headers: HeaderMap) -> StatusCode {
    use std::sync::atomic::Ordering::SeqCst;
    let at_once = slow.now.fetch_add(1, SeqCst) + 1;
    slow.most.fetch_max(at_once, SeqCst);
    tokio::time::sleep(SLOW).await;
    slow.now.fetch_sub(1, SeqCst);
    let id = headers
        .get("belfry-task-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    *slow.seen.lock().unwrap().entry(id).or_default() += 1;
    StatusCode::OK
}

/// `belfry_tasks_delivered_total` of `queue` on one node (0 before its first delivery).
async fn delivered_by(http: &reqwest::Client, node: &str, queue: &str) -> u64 {
    let text = http
        .get(format!("{node}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("belfry_tasks_delivered_total{{queue=\"{queue}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// One push queue with `max_in_flight` 4 and a receiver that holds each call 200 ms, delivered
/// by three nodes: the receiver never has more than 4 calls at once (with the cap counted per
/// node it could have had 12: each node delivers a share of the tasks), and every task arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_in_flight_cap() {
    let _turn = ONE_AT_A_TIME.lock().await;
    const CAP: usize = 4;
    const TASKS: usize = 90;
    let cluster = RedisCluster::start(3, 0);
    let slow = Arc::new(Slow::default());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(slow_hook))
        .with_state(slow.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let nodes: Vec<Served> = ["c0", "c1", "c2"]
        .iter()
        .map(|id| node(&cluster, id))
        .collect();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Paused while the backlog is put, so every node starts from a full queue.
    let queue = json!({"delivery": {"type": "webhook", "url": hook_url, "timeout_ms": 2_000},
                       "max_in_flight": CAP, "paused": true});
    let created = http
        .put(format!("{}/v1/queues/capped", nodes[0].url))
        .json(&queue)
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");
    // Idempotency keys spread the tasks over the partitions, so every node owns some (a
    // batch without keys lands in one partition).
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| json!({"payload": {"i": i}, "idempotency_key": format!("cap-{i}")}))
        .collect();
    // Through the node that made the queue: another may not have heard of it yet.
    let url = format!("{}/v1/queues/capped/tasks:batch", nodes[0].url);
    let (status, _) = post(&http, &url, json!({"tasks": tasks})).await.unwrap();
    assert_eq!(status, 200);
    let started = Instant::now();
    let resumed = http
        .post(format!("{}/v1/queues/capped/resume", nodes[0].url))
        .send()
        .await
        .unwrap();
    assert!(resumed.status().is_success(), "{resumed:?}");
    let deadline = started + Duration::from_secs(20);
    while slow.seen.lock().unwrap().len() < TASKS {
        assert!(
            Instant::now() < deadline,
            "{} of {TASKS} tasks delivered in 20 s",
            slow.seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    let most = slow.most.load(std::sync::atomic::Ordering::SeqCst);
    let mut per_node = Vec::new();
    for node in &nodes {
        per_node.push(delivered_by(&http, &node.url, "capped").await);
    }
    eprintln!(
        "shared in-flight cap: at most {most} calls at once across 3 nodes (cap {CAP}); \
         {TASKS} tasks in {took:?}; delivered per node {per_node:?}"
    );
    assert!(most <= CAP, "{most} calls at once with a cap of {CAP}");
    assert_eq!(most, CAP, "the test never filled the cap");
    assert!(
        per_node.iter().all(|&n| n > 0),
        "a node delivered nothing ({per_node:?}): per-node caps would have held fewer calls"
    );
}
