//! Throughput probe, ignored by default: `cargo test --release -p belfry-store --test
//! engine_perf -- --ignored --nocapture`. Prints numbers; asserts only correctness. The real
//! benchmark, with baselines, is `belfry-store-bench`.

use std::time::Instant;

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, EngineOptions, Store};
use bytes::Bytes;

#[test]
#[ignore]
fn ingest_and_drain_probe() {
    let tasks: usize = std::env::var("PROBE_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let dir =
        tempfile::tempdir_in(std::env::var("PROBE_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let queue = QueueName::new("q").unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine.put_queue(&queue, Bytes::new()).unwrap();
    let now = 1_700_000_000_000u64;
    engine.claim(&queue, now, 1, 1_000).unwrap();
    let payload = Bytes::from(vec![b'x'; 200]);
    let span_ms = 30 * 24 * 3_600_000u64;
    let start = Instant::now();
    for chunk in 0..tasks / 1_000 {
        let batch = (0..1_000)
            .map(|i| {
                let n = (chunk * 1_000 + i) as u64;
                let due = now + (n.wrapping_mul(2_654_435_761) % span_ms);
                NewTask::new(queue.clone(), due, payload.clone())
            })
            .collect();
        engine.put(batch).unwrap();
    }
    let ingest = start.elapsed();
    println!(
        "ingest: {tasks} tasks in {ingest:?}: {:.0} tasks/s",
        tasks as f64 / ingest.as_secs_f64()
    );
    let start = Instant::now();
    drop(engine);
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    println!("reopen: {:?}, {:?}", start.elapsed(), engine.stats());
    if std::env::var("PROBE_NO_DRAIN").is_ok() {
        return;
    }
    let start = Instant::now();
    let mut drained = 0;
    loop {
        let batch = engine.claim(&queue, now + span_ms, 1_000, 60_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        drained += batch.leased.len();
    }
    let drain = start.elapsed();
    assert_eq!(drained, tasks / 1_000 * 1_000);
    println!(
        "drain: {drained} in {drain:?}: {:.0} tasks/s",
        drained as f64 / drain.as_secs_f64()
    );
}
