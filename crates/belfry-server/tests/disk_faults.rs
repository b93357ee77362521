//! Disk faults through the API, on the embedded engine: a full disk (a small tmpfs this test
//! mounts, as root; it fails rather than skips when it cannot) answers `507
//! insufficient_storage` while reads and leases go on, and takes submits again once space is
//! freed; a failed fsync makes the store answer `503 store_unavailable`, `/readyz` says why,
//! and every acknowledged task is there after a restart.

mod common;

use std::path::Path;
use std::sync::Arc;

use belfry_core::{QueueName, TaskId, TaskState};
use belfry_store::{Engine, EngineOptions, Store};
use common::{test_config, TestServer, T0};
use serde_json::{json, Value};

#[path = "../../belfry-store/tests/support/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

fn small_disk_options() -> EngineOptions {
    EngineOptions {
        checkpoint_wal_bytes: 256 * 1024,
        ..EngineOptions::default()
    }
}

/// Every id in `ids` is a scheduled task of `queue` in the engine in `dir` (reopened).
fn assert_all_kept(dir: &Path, options: EngineOptions, queue: &str, ids: &[String]) {
    let engine = Engine::open(dir, options).expect("the engine reopens");
    let queue = QueueName::new(queue).unwrap();
    let mut missing = 0;
    for id in ids {
        let id: TaskId = id.parse().expect("a task id");
        match engine.get(&queue, id, T0).unwrap() {
            Some(task) => assert_eq!(task.state, TaskState::Scheduled, "{id}"),
            None => missing += 1,
        }
    }
    assert_eq!(
        missing,
        0,
        "{missing} of {} acknowledged tasks lost",
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_keeps_serving_and_takes_submits_again_once_space_is_freed() {
    let disk = Tmpfs::mount("8m");
    let data = disk.path().join("data");
    let filler = disk.path().join("other-program.log");
    std::fs::write(&filler, vec![0x5a; 2 * 1024 * 1024]).unwrap();
    let engine = Engine::open(&data, small_disk_options()).expect("the engine opens");
    let server = TestServer::start_with_sinks(test_config(), Arc::new(engine), None, None).await;
    server.queue("q", json!({})).await;

    // A stream of submits, eight at a time, until the disk is full.
    let payload = "x".repeat(900);
    let mut acknowledged = Vec::new();
    let mut refusal = None;
    'fill: for round in 0..10_000 {
        let mut submits = tokio::task::JoinSet::new();
        for i in 0..8 {
            let body = json!({"delay_ms": 3_600_000 + round * 8 + i, "payload": payload});
            let request = server
                .http
                .post(format!("{}/v1/queues/q/tasks", server.base))
                .json(&body);
            submits.spawn(async move {
                let response = request.send().await.expect("the server answers");
                let status = response.status().as_u16();
                (
                    status,
                    response.json::<Value>().await.expect("a JSON answer"),
                )
            });
        }
        while let Some(answer) = submits.join_next().await {
            let (status, body) = answer.expect("a submit task panicked");
            match status {
                201 => acknowledged.push(body["id"].as_str().unwrap().to_owned()),
                507 => refusal = Some(body),
                _ => panic!("a submit answered {status} {body}"),
            }
        }
        if refusal.is_some() {
            break 'fill;
        }
    }
    let refusal = refusal.expect("the disk never filled");
    assert_eq!(
        refusal["error"]["code"], "insufficient_storage",
        "{refusal}"
    );
    assert!(acknowledged.len() > 500, "{} submits", acknowledged.len());
    // The server is still ready and says why submits are refused. The engine's checkpoint
    // thread may delete old WAL files at any moment and so free some space: a submit is then
    // taken again, and `/readyz` rightly stops reporting low space. So submit one at a time
    // until a refusal is not followed by such a release, then ask `/readyz`.
    let mut reported = None;
    for n in 0..200 {
        let task = json!({"delay_ms": 3_600_000 + n, "payload": payload});
        let (status, body) = server.call("POST", "/v1/queues/q/tasks", task).await;
        match status {
            201 => acknowledged.push(body["id"].as_str().unwrap().to_owned()),
            507 => {
                let ready = server.ok("GET", "/readyz", Value::Null, 200).await;
                if ready["storage"] == "low_disk_space" {
                    reported = Some(ready);
                    break;
                }
            }
            _ => panic!("a submit answered {status} {body}"),
        }
    }
    let ready = reported.expect("/readyz never reported low disk space right after a 507");
    assert_eq!(ready["status"], "ready", "{ready}");
    // Reads and leases go on; a task due now is leased and acked inside the reserve.
    let task = server.task("q", &acknowledged[0]).await;
    assert_eq!(task["state"], "scheduled");
    server.advance(3_700_000);
    let leased = server.lease("q", json!({"max": 5})).await;
    assert_eq!(leased.len(), 5);
    for task in &leased {
        server
            .ok(
                "POST",
                &format!("/v1/queues/q/tasks/{}/ack", task["id"].as_str().unwrap()),
                json!({"lease_id": task["lease_id"]}),
                200,
            )
            .await;
    }
    let acked: Vec<String> = leased
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();

    // Space freed by another program: submits are taken again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let after = server
        .submit("q", json!({"delay_ms": 7_200_000, "payload": 2}))
        .await;
    let ready = server.ok("GET", "/readyz", Value::Null, 200).await;
    assert_eq!(ready, json!({"status": "ready"}));

    let TestServer { handle, store, .. } = server;
    handle.stop().await.expect("the server stops");
    drop(store);
    let kept: Vec<String> = acknowledged
        .into_iter()
        .filter(|id| !acked.contains(id))
        .chain([after])
        .collect();
    assert_all_kept(&data, small_disk_options(), "q", &kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_makes_readyz_report_store_unavailable_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), EngineOptions::default()).unwrap());
    let server = TestServer::start_with_sinks(
        test_config(),
        Arc::clone(&engine) as Arc<dyn Store>,
        None,
        None,
    )
    .await;
    server.queue("q", json!({})).await;
    let mut acknowledged = Vec::new();
    for n in 0..20 {
        acknowledged.push(
            server
                .submit("q", json!({"delay_ms": 60_000 + n, "payload": n}))
                .await,
        );
    }

    engine.fail_next_fsync();
    for _ in 0..2 {
        let (status, body) = server
            .call("POST", "/v1/queues/q/tasks", json!({"payload": "lost?"}))
            .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    }
    let (status, ready) = server.call("GET", "/readyz", Value::Null).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["error"]["code"], "store_unavailable");
    let message = ready["error"]["message"].as_str().unwrap();
    assert!(message.contains("fsync"), "{message}");
    assert!(message.contains("restart belfry"), "{message}");

    let TestServer { handle, store, .. } = server;
    // Shutdown flushes the store, which is poisoned: the stop may report it.
    let _ = handle.stop().await;
    drop((store, engine));
    assert_all_kept(dir.path(), EngineOptions::default(), "q", &acknowledged);
}

/// Bytes free on the filesystem holding `path`, as `df` reports them.
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("run df");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df's figure")
}

/// A bulk subscribe whose batch the store refuses mid-stream (the disk filled up) stops at
/// that batch's first line: everything before `stopped_at_line` was applied and nothing from
/// it on, so resending from there subscribes every id exactly once. (Before, the ids read
/// after the refused batch were applied and `stopped_at_line` pointed past all of them: a
/// client resuming from it lost the refused batch's 10,000 ids.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_subscribe_refused_mid_stream_stops_at_the_refused_batch() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let disk = Tmpfs::mount("16m");
    let engine = Engine::open(disk.path().join("data"), EngineOptions::default()).unwrap();
    let server = TestServer::start_with_sinks(test_config(), Arc::new(engine), None, None).await;
    server.queue("q", json!({})).await;
    let reminder = json!({"id": "r", "queue": "q", "delay_ms": 3_600_000});
    server.ok("POST", "/v1/reminders", reminder, 201).await;
    let lines = |from: u64, to: u64| (from..=to).map(|i| format!("{i}\n")).collect::<String>();
    let chunk = |text: String| format!("{:x}\r\n{text}\r\n", text.len());

    let mut conn = tokio::net::TcpStream::connect(server.handle.local_addr())
        .await
        .unwrap();
    let head = "POST /v1/reminders/r/subscribers HTTP/1.1\r\nhost: x\r\n\
                transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    conn.write_all(head.as_bytes()).await.unwrap();
    // Lines 1 to 10,500: the first batch of 10,000 is applied.
    conn.write_all(chunk(lines(1, 10_500)).as_bytes())
        .await
        .unwrap();
    let count = "/v1/reminders/r/subscribers/count";
    while server.ok("GET", count, Value::Null, 200).await["subscribers"] != 10_000 {
        tokio::task::yield_now().await;
    }
    // Another program fills the disk to half the engine's reserve (an eighth of 16 MiB);
    // a submit refused says the engine read it.
    let filler = disk.path().join("other-program.log");
    let fill = free_bytes(disk.path()).saturating_sub(1024 * 1024);
    std::fs::write(&filler, vec![0x5a; usize::try_from(fill).unwrap()]).unwrap();
    loop {
        let (status, _) = server.call("POST", "/v1/queues/q/tasks", json!({})).await;
        if status == 507 {
            break;
        }
    }
    // Lines 10,501 to 25,000: the batch of 10,001 to 20,000 is refused.
    conn.write_all(chunk(lines(10_501, 25_000)).as_bytes())
        .await
        .unwrap();
    let _ = conn.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let answer: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert!(text.starts_with("HTTP/1.1 507"), "{text}");
    assert_eq!(answer["stopped_at_line"], 10_001, "{answer}");
    assert_eq!(
        (&answer["changed"], &answer["complete"]),
        (&json!(10_000), &json!(false))
    );
    assert_eq!(
        server.ok("GET", count, Value::Null, 200).await["subscribers"],
        10_000
    );

    // Space freed, the client resends from the line it was given: every id, once.
    std::fs::remove_file(&filler).unwrap();
    let rest = server
        .http
        .post(format!("{}/v1/reminders/r/subscribers", server.base))
        .body(lines(10_001, 25_000))
        .send()
        .await
        .unwrap();
    let rest: Value = rest.json().await.unwrap();
    assert_eq!(
        (&rest["changed"], &rest["complete"]),
        (&json!(15_000), &json!(true)),
        "{rest}"
    );
    assert_eq!(
        server.ok("GET", count, Value::Null, 200).await["subscribers"],
        25_000
    );
}
