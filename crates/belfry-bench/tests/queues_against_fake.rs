//! `belfry bench queues` against a fake of belfry's queue, batch-submit and `/metrics`
//! endpoints that delivers due tasks to each queue's webhook itself, with known faults: one
//! task delivered twice, one never, and a claim-error counter of 2. The bench must count
//! exactly those, for the single queue and for the many queues. No timing assertions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_bench::http::{HttpConn, Target};
use belfry_bench::BenchCommand;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

/// Payload index the fake delivers twice, and the one it never delivers.
const TWICE: u64 = 3;
const NEVER: u64 = 7;

struct Task {
    id: String,
    queue: String,
    due_ms: u64,
    payload: Value,
    delivered: bool,
}

#[derive(Default)]
struct Fake {
    /// queue → webhook url
    queues: HashMap<String, String>,
    tasks: Vec<Task>,
    metrics: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn handle(fake: Arc<Mutex<Fake>>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = |status: StatusCode, v: String| {
        let mut r = Response::new(Full::new(Bytes::from(v)));
        *r.status_mut() = status;
        r
    };
    let mut f = fake.lock().unwrap();
    if method == Method::GET && path == "/metrics" {
        return reply(StatusCode::OK, f.metrics.clone());
    }
    let Some(rest) = path.strip_prefix("/v1/queues/") else {
        return reply(StatusCode::NOT_FOUND, "{}".into());
    };
    if let Some(queue) = rest.strip_suffix("/tasks:batch") {
        if !f.queues.contains_key(queue) {
            return reply(StatusCode::NOT_FOUND, "{}".into());
        }
        let mut results = Vec::new();
        for t in body["tasks"].as_array().cloned().unwrap_or_default() {
            let id = format!("{:032x}", f.tasks.len());
            results.push(json!({"id": id, "state": "scheduled"}));
            f.tasks.push(Task {
                id,
                queue: queue.to_string(),
                due_ms: t["run_at_ms"].as_u64().unwrap(),
                payload: t["payload"].clone(),
                delivered: false,
            });
        }
        return reply(StatusCode::OK, json!({ "results": results }).to_string());
    }
    if method == Method::PUT {
        let url = body["delivery"]["url"].as_str().unwrap_or("").to_string();
        assert_eq!(body["delivery"]["type"], "webhook");
        f.queues.insert(rest.to_string(), url);
        return reply(StatusCode::CREATED, json!({"name": rest}).to_string());
    }
    reply(StatusCode::NOT_FOUND, "{}".into())
}

/// Every 5 ms: POSTs each due task to its queue's webhook (TWICE twice, NEVER not at all).
async fn deliver(fake: Arc<Mutex<Fake>>) {
    let mut conns: HashMap<String, HttpConn> = HashMap::new();
    loop {
        let due: Vec<(String, String, Value)> = {
            let mut f = fake.lock().unwrap();
            let now = now_ms();
            let mut due = Vec::new();
            let urls = f.queues.clone();
            for t in f
                .tasks
                .iter_mut()
                .filter(|t| !t.delivered && t.due_ms <= now)
            {
                t.delivered = true;
                if t.payload["i"] == NEVER {
                    continue;
                }
                let url = urls[&t.queue].clone();
                let copies = if t.payload["i"] == TWICE { 2 } else { 1 };
                for _ in 0..copies {
                    due.push((url.clone(), t.id.clone(), t.payload.clone()));
                }
            }
            due
        };
        for (url, id, payload) in due {
            let rest = url.strip_prefix("http://").unwrap();
            let (addr, path) = rest.split_at(rest.find('/').unwrap());
            let target = Target::from_addr(addr.parse().unwrap());
            if !conns.contains_key(addr) {
                conns.insert(addr.to_string(), HttpConn::connect(&target).await.unwrap());
            }
            let conn = conns.get_mut(addr).unwrap();
            // The bench counts duplicates by this header, as the server sends it.
            let body = Bytes::from(payload.to_string());
            conn.request_with_headers(Method::POST, path, body, &[("belfry-task-id", id.as_str())])
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn start_fake(metrics: &str) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(Mutex::new(Fake {
        metrics: metrics.to_string(),
        ..Fake::default()
    }));
    tokio::spawn(deliver(fake.clone()));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let fake = fake.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| {
                    let fake = fake.clone();
                    async move { Ok::<_, Infallible>(handle(fake, r).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn queues_args(url: &str) -> belfry_bench::queues::QueuesArgs {
    let args = [
        "bench",
        "queues",
        "--url",
        url,
        "--queues",
        "12",
        "--tasks-per-queue",
        "5",
        "--lead-s",
        "1",
        "--grace-s",
        "2",
        "--connections",
        "3",
        "--no-progress",
    ];
    match Cli::try_parse_from(args).unwrap().command {
        BenchCommand::Queues(a) => *a,
        _ => panic!("not queues"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn queues_counts_duplicates_losses_and_claim_errors_of_both_shapes() {
    let rt = runtime();
    let addr = rt.block_on(start_fake(
        "# TYPE belfry_dispatch_claim_errors_total counter\nbelfry_dispatch_claim_errors_total 2\n",
    ));
    let report = rt
        .block_on(belfry_bench::queues::run(queues_args(&format!(
            "http://{addr}"
        ))))
        .unwrap();
    let outcomes = report.data["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2, "{}", report.data);
    for (o, queues) in outcomes.iter().zip([1, 12]) {
        assert_eq!(o["queues"], queues, "{o}");
        assert_eq!(o["delivery"]["expected"], 60);
        assert_eq!(o["delivery"]["delivered"], 59);
        assert_eq!(o["delivery"]["lost"], 1);
        assert_eq!(o["delivery"]["early"], 0);
        assert_eq!(o["duplicates_by_id"], 1);
        assert_eq!(o["receipts_without_id"], 0);
        assert_eq!(o["claim_errors"], 2);
        assert_eq!(o["submit"]["accepted"], 60);
        assert_eq!(o["create_failures"], 0);
        assert!(o["delivery_time_ms"].as_f64().unwrap() > 0.0);
        // Not a spawned server: RSS and CPU are unknown, not zero.
        assert_eq!(o["rss_peak_bytes"], Value::Null);
    }
    let text = report.render_text();
    assert!(
        text.contains("12 queues") && text.contains("MISSED"),
        "{text}"
    );
}

#[test]
fn a_server_without_the_claim_error_counter_is_reported_as_such() {
    let rt = runtime();
    let addr = rt.block_on(start_fake("up 1\n"));
    let mut args = queues_args(&format!("http://{addr}"));
    args.baseline = belfry_bench::queues::QueuesBaseline::None;
    let report = rt.block_on(belfry_bench::queues::run(args)).unwrap();
    let outcomes = report.data["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0]["claim_errors"], Value::Null);
    assert!(report
        .render_text()
        .contains("does not expose belfry_dispatch_claim_errors_total"));
}
