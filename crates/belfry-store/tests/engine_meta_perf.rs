//! Metadata probe, ignored by default: `cargo test --release -p belfry-store --test
//! engine_meta_perf -- --ignored --nocapture --test-threads 1`. Prints numbers; asserts only
//! correctness. `PROBE_DIR` is the parent of the data directories (default `.`: a real disk,
//! not a tmpfs, so fsyncs cost what they cost), `PROBE_SECONDS` the length of each timed
//! phase (default 2).
//!
//! What it measures is what the schedule service does: one cursor write per schedule firing
//! (`put_meta` from 1 and from 8 threads), the cursors of a whole tick in one `write_meta`,
//! and what a storm of cursor writes does to an unrelated queue's claim latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, MetaChange, Store};
use bytes::Bytes;

#[path = "support/probe.rs"]
mod probe;

use probe::{claim_latencies, engine, percentile, phase, NOW};

/// A schedule cursor: a key of about 20 bytes, an 8-byte value.
fn cursor(i: u64) -> (String, Bytes) {
    (
        format!("schedule-{i:011}"),
        Bytes::copy_from_slice(&(NOW + i).to_le_bytes()),
    )
}

/// Calls `put_meta` from `threads` threads for one phase; returns calls per second.
fn put_meta_rate(engine: &Engine, threads: u64) -> f64 {
    let calls = AtomicU64::new(0);
    let deadline = Instant::now() + phase();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (engine, calls) = (engine, &calls);
            scope.spawn(move || {
                let mut i = t;
                while Instant::now() < deadline {
                    let (key, value) = cursor(i % 2_000);
                    engine.put_meta("schedules", &key, value).unwrap();
                    calls.fetch_add(1, Ordering::Relaxed);
                    i += threads;
                }
            });
        }
    });
    calls.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore]
fn put_meta_rate_probe() {
    for threads in [1, 8] {
        let (_dir, engine) = engine();
        let rate = put_meta_rate(&engine, threads);
        let stats = engine.stats();
        println!(
            "put_meta from {threads} thread(s): {rate:.0} calls/s ({} WAL fsyncs)",
            stats.wal_syncs
        );
    }
}

#[test]
#[ignore]
fn write_meta_of_a_tick_probe() {
    let (_dir, engine) = engine();
    let changes: Vec<MetaChange> = (0..10_000)
        .map(|i| {
            let (key, value) = cursor(i);
            MetaChange::put("schedules", &key, value)
        })
        .collect();
    // Twice: the first creates the keys, the second overwrites them as a tick does.
    for round in ["create", "overwrite"] {
        let start = Instant::now();
        engine.write_meta(changes.clone()).unwrap();
        println!(
            "write_meta of 10,000 cursors ({round}): {:?}",
            start.elapsed()
        );
    }
    assert_eq!(engine.list_meta("schedules").unwrap().len(), 10_000);
}

#[test]
#[ignore]
fn claim_latency_under_a_meta_storm_probe() {
    let (_dir, engine) = engine();
    let queue = QueueName::new("work").unwrap();
    engine.put_queue(&queue, Bytes::new()).unwrap();
    for _ in 0..10 {
        let tasks = (0..1_000)
            .map(|_| NewTask::new(queue.clone(), NOW, Bytes::from_static(b"x")))
            .collect();
        engine.put(tasks).unwrap();
    }
    let deadline = Instant::now() + phase();
    let quiet = claim_latencies(&engine, &queue, || Instant::now() < deadline);
    let stop = AtomicBool::new(false);
    let meta_calls = AtomicU64::new(0);
    let (storm, meta_seconds) = std::thread::scope(|scope| {
        let (engine, stop, meta_calls) = (&engine, &stop, &meta_calls);
        let writer = scope.spawn(move || {
            let start = Instant::now();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = cursor(i % 2_000);
                engine.put_meta("schedules", &key, value).unwrap();
                meta_calls.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            start.elapsed().as_secs_f64()
        });
        let deadline = Instant::now() + phase();
        let storm = claim_latencies(engine, &queue, || Instant::now() < deadline);
        stop.store(true, Ordering::Relaxed);
        (storm, writer.join().unwrap())
    });
    for (name, sorted) in [("quiet", &quiet), ("meta storm", &storm)] {
        println!(
            "claim latency ({name}): {} claims, p50 {:?}, p99 {:?}, p99.9 {:?}, p99.99 {:?}, max {:?}",
            sorted.len(),
            percentile(sorted, 0.50),
            percentile(sorted, 0.99),
            percentile(sorted, 0.999),
            percentile(sorted, 0.9999),
            percentile(sorted, 1.0)
        );
    }
    println!(
        "meta storm: {:.0} put_meta calls/s alongside",
        meta_calls.load(Ordering::Relaxed) as f64 / meta_seconds
    );
}
