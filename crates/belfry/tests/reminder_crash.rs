//! A fan-out under `kill -9`: the real binary is killed at random points of a paced fan-out
//! and restarted on the same data while a pull consumer leases and acks the chunks. Every
//! subscriber must end up in an acknowledged chunk, and no acknowledged chunk may be delivered
//! again (a chunk leased but not acked before a kill may come back: at-least-once).

mod common;

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{serve, Served};
use serde_json::{json, Value};

const USERS: u64 = 12_000;
const CHUNK: u64 = 100;
/// 12,000 users at 4,000 a second: the fan-out lasts about three seconds.
const USERS_PER_SECOND: u64 = 4_000;
const KILLS: usize = 3;

struct Node {
    server: Served,
    http: reqwest::Client,
}

impl Node {
    fn start(data: &str) -> Node {
        Node {
            server: serve(&["--data-dir", data]),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> reqwest::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("{}{}", self.server.url, path));
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.timeout(Duration::from_secs(10)).send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

/// A small deterministic generator, seeded from the clock (and printed, to replay a failure).
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_survives_kill_9_at_random_points() {
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let mut node = Node::start(&data);
    use reqwest::Method;
    let (status, _) = node
        .call(Method::PUT, "/v1/queues/push", Some("{}".into()))
        .await
        .unwrap();
    assert!(status < 300);
    let reminder = json!({"id": "crash", "queue": "push", "delay_ms": 1_000, "chunk_size": CHUNK,
                          "users_per_second": USERS_PER_SECOND, "content": {"t": 1}});
    let (status, answer) = node
        .call(Method::POST, "/v1/reminders", Some(reminder.to_string()))
        .await
        .unwrap();
    assert_eq!(status, 201, "{answer}");
    let ids: String = (0..USERS).map(|i| format!("{i}\n")).collect();
    let (status, answer) = node
        .call(Method::POST, "/v1/reminders/crash/subscribers", Some(ids))
        .await
        .unwrap();
    assert_eq!(
        (status, answer["changed"].as_u64()),
        (200, Some(USERS)),
        "{answer}"
    );

    // Kill times: random points from when the fan-out is due to two seconds into its three.
    let started = Instant::now();
    let mut kills: Vec<Duration> = (0..KILLS)
        .map(|_| Duration::from_millis(1_000 + next(&mut seed) % 2_000))
        .collect();
    kills.sort();
    let mut acked_chunks: HashSet<u64> = HashSet::new();
    let mut users: BTreeSet<u64> = BTreeSet::new();
    let mut resent_after_ack = Vec::new();
    let mut killed = 0;
    let deadline = started + Duration::from_secs(90);
    while (users.len() as u64) < USERS {
        assert!(
            Instant::now() < deadline,
            "gave up with {} of {USERS} users (seed {seed})",
            users.len()
        );
        if kills.first().is_some_and(|at| started.elapsed() >= *at) {
            kills.remove(0);
            killed += 1;
            drop(node); // SIGKILL, then a restart on the same data.
            node = Node::start(&data);
            continue;
        }
        let lease = json!({"max": 20, "wait_ms": 100, "visibility_ms": 1_000}).to_string();
        let Ok((200, answer)) = node
            .call(Method::POST, "/v1/queues/push/lease", Some(lease))
            .await
        else {
            continue;
        };
        for task in answer["tasks"].as_array().cloned().unwrap_or_default() {
            let chunk = task["payload"]["chunk"].as_u64().unwrap();
            if acked_chunks.contains(&chunk) {
                resent_after_ack.push(chunk);
            }
            let ack = json!({"lease_id": task["lease_id"]}).to_string();
            let path = format!("/v1/queues/push/tasks/{}/ack", task["id"].as_str().unwrap());
            if let Ok((200, _)) = node.call(Method::POST, &path, Some(ack)).await {
                acked_chunks.insert(chunk);
                for user in task["payload"]["users"].as_array().unwrap() {
                    users.insert(user.as_str().unwrap().parse().unwrap());
                }
            }
        }
    }
    assert_eq!(
        killed, KILLS,
        "every kill fell inside the fan-out (seed {seed})"
    );
    assert!(
        resent_after_ack.is_empty(),
        "acknowledged chunks delivered again: {resent_after_ack:?} (seed {seed})"
    );
    assert_eq!(users.len() as u64, USERS);
    assert_eq!(*users.last().unwrap(), USERS - 1);
    // The chunks made cover the users once each: at most the planned number were acked.
    assert!(
        acked_chunks.len() as u64 <= USERS.div_ceil(CHUNK),
        "{} chunks",
        acked_chunks.len()
    );
}
