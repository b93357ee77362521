//! belfry nodes sharing the cluster, and the HTTP load spread over them: batched submits,
//! and a burst drain through pull leases and batch acks.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde::Deserialize;

use super::Rate;
use crate::error::BenchError;
use crate::fire::{AckBatch, Echo};
use crate::http::{HttpConn, Target};
use crate::spawn::SpawnedServer;
use crate::workload::Bodies;

/// How long a fresh set of nodes gets to share the partitions out (shard leases live 3 s by
/// default, so a node that started first holds all of them until it hands some over).
pub const SETTLE: Duration = Duration::from_secs(4);

/// Starts `count` nodes on one store, each with its own node id, all in `namespace`.
pub async fn start(
    bin: &Path,
    spawn_dir: Option<&Path>,
    store_url: &str,
    namespace: &str,
    count: usize,
) -> Result<Vec<SpawnedServer>, BenchError> {
    let mut nodes = Vec::with_capacity(count);
    for i in 0..count {
        let env = vec![
            ("BELFRY_STORE".to_string(), store_url.to_string()),
            ("BELFRY_NODE_ID".to_string(), format!("bench-node-{i}")),
            ("BELFRY_REDIS_NAMESPACE".to_string(), namespace.to_string()),
            (
                "BELFRY_ALLOW_PRIVATE_TARGETS".to_string(),
                "true".to_string(),
            ),
        ];
        nodes.push(SpawnedServer::start(bin, spawn_dir, env).await?);
    }
    tokio::time::sleep(SETTLE).await;
    Ok(nodes)
}

/// Creates (or updates) `queue` through every node, so each knows it at once whatever the
/// server's own propagation does.
pub async fn create_queue(nodes: &[Target], queue: &str, config: &str) -> Result<(), BenchError> {
    for node in nodes {
        crate::spawn::create_queue(node, queue, config).await?;
    }
    Ok(())
}

/// Sends every body of `bodies` to `/v1/queues/{queue}/tasks:batch` over `clients`
/// connections, client `c` on node `c % nodes`. A 503 (store briefly unavailable) is
/// retried; other failures are counted.
pub async fn ingest(
    nodes: &[Target],
    queue: &str,
    bodies: Arc<Bodies>,
    clients: usize,
    bar: &indicatif::ProgressBar,
) -> Rate {
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let path = format!("/v1/queues/{queue}/tasks:batch");
    let started = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for c in 0..clients {
        let target = nodes[c % nodes.len()].clone();
        let (next, errors, accepted, bodies, path, bar) = (
            next.clone(),
            errors.clone(),
            accepted.clone(),
            bodies.clone(),
            path.clone(),
            bar.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut conn = None;
            let mut b = next.fetch_add(1, Ordering::Relaxed);
            let mut tries = 0;
            while let Some(body) = bodies.bodies.get(b) {
                if conn.is_none() {
                    conn = HttpConn::connect(&target).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                match c.request(Method::POST, &path, body.clone()).await {
                    Ok((status, _)) if status.is_success() => {
                        accepted.fetch_add(bodies.tasks_in(b), Ordering::Relaxed);
                        bar.inc(bodies.tasks_in(b));
                    }
                    Ok((status, _)) if status.as_u16() == 503 && tries < 20 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Ok(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        conn = None;
                    }
                }
                tries = 0;
                b = next.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    Rate::new(
        accepted.load(Ordering::Relaxed),
        started.elapsed(),
        errors.load(Ordering::Relaxed),
    )
}

#[derive(Deserialize)]
struct LeaseAnswer<'a> {
    #[serde(borrow)]
    tasks: Vec<Leased<'a>>,
}

#[derive(Deserialize)]
struct Leased<'a> {
    #[serde(borrow)]
    id: Echo<'a>,
    #[serde(borrow)]
    lease_id: Echo<'a>,
}

/// Leases (up to `batch` at a time) and batch-acks `expected` due tasks of pull queue
/// `queue` with `clients` consumers spread over the nodes; returns the drain rate.
pub async fn drain(
    nodes: &[Target],
    queue: &str,
    expected: u64,
    batch: usize,
    clients: usize,
    bar: &indicatif::ProgressBar,
) -> Rate {
    let drained = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let requests = DrainRequests {
        lease_path: format!("/v1/queues/{queue}/lease"),
        ack_path: format!("/v1/queues/{queue}/ack"),
        lease_body: Bytes::from(format!(
            "{{\"max\":{batch},\"wait_ms\":0,\"visibility_ms\":300000}}"
        )),
    };
    let started = Instant::now();
    let give_up = started + Duration::from_secs(600);
    let mut handles = Vec::with_capacity(clients);
    for c in 0..clients {
        let target = nodes[c % nodes.len()].clone();
        let (drained, errors, requests, bar) = (
            drained.clone(),
            errors.clone(),
            requests.clone(),
            bar.clone(),
        );
        handles.push(tokio::spawn(drain_client(
            target, requests, drained, errors, expected, give_up, bar,
        )));
    }
    for h in handles {
        let _ = h.await;
    }
    Rate::new(
        drained.load(Ordering::Relaxed),
        started.elapsed(),
        errors.load(Ordering::Relaxed),
    )
}

/// The requests every drain client sends.
#[derive(Clone)]
struct DrainRequests {
    lease_path: String,
    ack_path: String,
    lease_body: Bytes,
}

/// One drain client on `target`: leases and acks until `drained` reaches `expected` or
/// `give_up` passes.
async fn drain_client(
    target: Target,
    requests: DrainRequests,
    drained: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    expected: u64,
    give_up: Instant,
    bar: indicatif::ProgressBar,
) {
    let mut conn: Option<HttpConn> = None;
    while drained.load(Ordering::Relaxed) < expected && Instant::now() < give_up {
        if conn.is_none() {
            conn = HttpConn::connect(&target).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let body = match c
            .request(
                Method::POST,
                &requests.lease_path,
                requests.lease_body.clone(),
            )
            .await
        {
            Ok((status, body)) if status.is_success() => body,
            Ok(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                conn = None;
                continue;
            }
        };
        let Ok(answer) = serde_json::from_slice::<LeaseAnswer>(&body) else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if answer.tasks.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let n = answer.tasks.len() as u64;
        let Some(ack) = AckBatch::json(answer.tasks.iter().map(|t| (&t.id, &t.lease_id))) else {
            continue;
        };
        if c.expect_success(Method::POST, &requests.ack_path, ack)
            .await
            .is_err()
        {
            // Not drained: the tasks come back when their leases end.
            errors.fetch_add(1, Ordering::Relaxed);
            conn = None;
            continue;
        }
        drained.fetch_add(n, Ordering::Relaxed);
        bar.inc(n);
    }
}
