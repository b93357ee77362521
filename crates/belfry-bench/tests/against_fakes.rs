//! The bench against servers started by the test itself on 127.0.0.1: the in-process trivial
//! handler (ingest), and a tiny fake of belfry's submit/lease/ack endpoints (fire), so the
//! client's counting is checked end to end without the real server. No timing assertions.

use std::collections::BTreeMap;
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

fn parse(args: &[&str]) -> BenchCommand {
    match Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())) {
        Ok(cli) => cli.command,
        Err(e) => panic!("{e}"),
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
fn ingest_counts_every_request_against_the_trivial_handler() {
    for batch in ["1", "7"] {
        let BenchCommand::Ingest(args) = parse(&[
            "ingest",
            "--tasks",
            "60",
            "--batch",
            batch,
            "--connections",
            "3",
            "--baselines-only",
            "--baseline",
            "http,fsync",
            "--no-progress",
        ]) else {
            panic!("not ingest")
        };
        let report = runtime()
            .block_on(belfry_bench::ingest::run(*args))
            .unwrap();
        let trivial = &report.data["trivial_http"];
        assert_eq!(trivial["accepted"], 60, "batch {batch}: {trivial}");
        assert_eq!(trivial["rejected"], 0);
        let requests = if batch == "1" { 60 } else { 9 };
        assert_eq!(trivial["requests"], requests);
        assert_eq!(report.data["raw_fsync_append"]["tasks"], 60);
        assert_eq!(report.data["belfry"], Value::Null);
        let text = report.render_text();
        assert!(text.contains("trivial HTTP handler") && text.contains("raw fsync'd append"));
        let markdown = report.render_markdown("ingest", None);
        assert!(markdown.contains("| trivial HTTP handler |"));
    }
}

/// Just enough of belfry's API for `fire`: queues, batch submit, lease (due tasks only,
/// with a short long-poll), batch ack. Delivers task 3 twice, to check duplicate counting.
#[derive(Default)]
struct Fake {
    /// id → (due ms, payload, leased)
    tasks: BTreeMap<u64, (u64, Value, bool)>,
    next_id: u64,
    acked: u64,
    redelivered: bool,
}

async fn fake_handle(fake: Arc<Mutex<Fake>>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let reply = |status: StatusCode, v: Value| {
        let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
        *r.status_mut() = status;
        r
    };
    if path.ends_with(":batch") {
        let mut f = fake.lock().unwrap();
        let mut results = Vec::new();
        for t in body["tasks"].as_array().cloned().unwrap_or_default() {
            let id = f.next_id;
            f.next_id += 1;
            let due = t["run_at_ms"].as_u64().unwrap_or(0);
            f.tasks.insert(id, (due, t["payload"].clone(), false));
            results
                .push(json!({"id": format!("{id:032x}"), "due_at_ms": due, "state": "scheduled"}));
        }
        return reply(StatusCode::OK, json!({ "results": results }));
    }
    if path.ends_with("/lease") {
        let max = body["max"].as_u64().unwrap_or(1) as usize;
        for _ in 0..20 {
            let mut tasks = Vec::new();
            {
                let mut f = fake.lock().unwrap();
                let mut redeliver = None;
                for (id, (due, payload, leased)) in f.tasks.iter_mut() {
                    if tasks.len() == max {
                        break;
                    }
                    if !*leased && *due <= now_ms {
                        *leased = true;
                        tasks.push(json!({"id": format!("{id:032x}"), "payload": payload, "lease_id": id, "attempt": 1, "due_at_ms": due}));
                        if payload["i"] == 3 {
                            redeliver = Some(payload.clone());
                        }
                    }
                }
                if let (Some(p), false) = (redeliver, f.redelivered) {
                    f.redelivered = true;
                    tasks.push(json!({"id": "dup", "payload": p, "lease_id": 0, "attempt": 2, "due_at_ms": 0}));
                }
            }
            if !tasks.is_empty() {
                return reply(StatusCode::OK, json!({ "tasks": tasks }));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        return reply(StatusCode::OK, json!({"tasks": []}));
    }
    if path.ends_with("/ack") {
        let n = body["acks"].as_array().map_or(0, |a| a.len()) as u64;
        fake.lock().unwrap().acked += n;
        return reply(StatusCode::OK, json!({}));
    }
    if path.starts_with("/v1/queues/") {
        return reply(StatusCode::OK, json!({"name": "q"}));
    }
    reply(
        StatusCode::NOT_FOUND,
        json!({"error": {"code": "not_found", "message": path}}),
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
                    async move { Ok::<_, Infallible>(fake_handle(fake, r).await) }
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
fn fire_against_a_fake_counts_deliveries_duplicates_and_lateness() {
    let rt = runtime();
    let (addr, fake) = rt.block_on(start_fake());
    let url = format!("http://{addr}");
    let BenchCommand::Fire(args) = parse(&[
        "fire",
        "--url",
        &url,
        "--tasks",
        "300",
        "--window-s",
        "1",
        "--lead-s",
        "1",
        "--batch",
        "50",
        "--connections",
        "2",
        "--consumers",
        "2",
        "--lease-max",
        "64",
        "--wait-ms",
        "100",
        "--grace-s",
        "20",
        "--baseline",
        "none",
        "--no-progress",
    ]) else {
        panic!("not fire")
    };
    let report = rt.block_on(belfry_bench::fire::run(*args)).unwrap();
    let o = &report.data["outcomes"][0];
    let d = &o["delivery"];
    assert_eq!(d["expected"], 300, "{o}");
    assert_eq!(d["delivered"], 300);
    assert_eq!(d["lost"], 0);
    assert_eq!(d["early"], 0);
    assert_eq!(d["duplicates"], 1);
    assert_eq!(d["lateness"]["count"], 300);
    assert_eq!(o["submit"]["accepted"], 300);
    assert_eq!(o["consumers"]["ack_failures"], 0);
    assert_eq!(o["consumers"]["lease_errors"], 0);
    // Every leased task was acked, the redelivery included.
    assert_eq!(fake.lock().unwrap().acked, 301);
    assert!(report
        .render_text()
        .contains("belfry (pull lease + batch ack)"));
}
