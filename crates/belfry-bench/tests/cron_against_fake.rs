//! `belfry bench cron` against a fake of belfry's queue, task, schedule, lease and ack
//! endpoints whose "schedules" fire every second, with one known fault: schedule 0's firings
//! are all delivered twice. The bench must count every firing of the window once, the
//! duplicates, both rates and both probes. No timing assertions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use belfry_bench::BenchCommand;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Default)]
struct Fake {
    /// schedule index → next second (unix s) to fire
    schedules: HashMap<u64, u64>,
    /// probe tasks not yet leased
    probe_tasks: Vec<u64>,
    next_id: u64,
    single_submits: u64,
    acked: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn handle(fake: Arc<Mutex<Fake>>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = |status: StatusCode, v: Value| {
        let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
        *r.status_mut() = status;
        r
    };
    let mut f = fake.lock().unwrap();
    if path == "/v1/schedules" {
        assert_eq!(body["cron"], "* * * * * *");
        let i = body["payload"]["i"].as_u64().unwrap();
        f.schedules.insert(i, now_ms() / 1_000 + 1);
        return reply(StatusCode::CREATED, json!({"id": body["id"]}));
    }
    if method == http::Method::PUT {
        return reply(StatusCode::CREATED, json!({}));
    }
    if path.ends_with("-submit/tasks") {
        f.single_submits += 1;
        return reply(StatusCode::CREATED, json!({"id": "x"}));
    }
    if path.ends_with("-probe/tasks") {
        let id = f.next_id;
        f.next_id += 1;
        f.probe_tasks.push(id);
        return reply(StatusCode::CREATED, json!({"id": format!("{id:032x}")}));
    }
    if path.ends_with("-probe/lease") {
        let tasks: Vec<Value> = f
            .probe_tasks
            .pop()
            .map(|id| json!({"id": format!("{id:032x}"), "lease_id": "1", "due_at_ms": 0, "payload": {"i": 0}}))
            .into_iter()
            .collect();
        return reply(StatusCode::OK, json!({ "tasks": tasks }));
    }
    if path.ends_with("-fire/lease") {
        let now_s = now_ms() / 1_000;
        let mut tasks = Vec::new();
        for (&i, next) in f.schedules.iter_mut() {
            while *next <= now_s && tasks.len() < 990 {
                let task = json!({"id": format!("{i}-{next}"), "lease_id": "7", "due_at_ms": *next * 1_000, "payload": {"i": i}});
                if i == 0 {
                    tasks.push(task.clone());
                }
                tasks.push(task);
                *next += 1;
            }
        }
        return reply(StatusCode::OK, json!({ "tasks": tasks }));
    }
    if path.ends_with("/ack") {
        f.acked += body["acks"].as_array().map_or(1, |a| a.len() as u64);
        return reply(StatusCode::OK, json!({}));
    }
    reply(
        StatusCode::NOT_FOUND,
        json!({"error": {"code": "route_not_found"}}),
    )
}

async fn start_fake() -> (std::net::SocketAddr, Arc<Mutex<Fake>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(Mutex::new(Fake::default()));
    let shared = fake.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let fake = shared.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| {
                    let fake = fake.clone();
                    async move {
                        // The fake's lease answers at once; a short pause stands in for the
                        // long-poll so the consumers do not spin.
                        let answer = handle(fake, r).await;
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        Ok::<_, Infallible>(answer)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, fake)
}

#[test]
fn cron_counts_firings_of_the_window_once_and_the_duplicates() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (addr, fake) = rt.block_on(start_fake());
    let url = format!("http://{addr}");
    let args = [
        "bench",
        "cron",
        "--url",
        &url,
        "--schedules",
        "40",
        "--connections",
        "4",
        "--fire-s",
        "2",
        "--probes",
        "20",
        "--no-progress",
    ];
    let BenchCommand::Cron(args) = Cli::try_parse_from(args).unwrap().command else {
        panic!("not cron")
    };
    let report = rt.block_on(belfry_bench::cron::run(*args)).unwrap();
    let d = &report.data;
    assert_eq!(d["create"]["accepted"], 40, "{d}");
    assert_eq!(d["submit"]["accepted"], 40);
    let f = &d["firing"];
    assert_eq!(f["expected"], 80, "{f}");
    assert_eq!(f["received"], 80);
    assert_eq!(f["duplicates"], 2);
    assert_eq!(
        (f["per_second_min"].clone(), f["per_second_max"].clone()),
        (json!(40), json!(40))
    );
    assert_eq!(f["lease_errors"], 0);
    for probe in ["probe_idle", "probe_loaded"] {
        assert_eq!(d[probe]["leased"], 20, "{probe}: {}", d[probe]);
        assert_eq!(d[probe]["lease"]["count"], 20);
    }
    // Not spawned: the schedules are deleted at the end (the fake answers 404 to DELETE).
    assert_eq!(d["deleted"], 0);
    let f = fake.lock().unwrap();
    assert_eq!(f.single_submits, 40);
    assert!(f.acked >= 80 + 40);
    drop(f);
    assert!(report
        .render_text()
        .contains("lease p99 under the cron load"));
}
