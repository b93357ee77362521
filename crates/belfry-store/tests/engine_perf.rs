//! Throughput probe, ignored by default: `cargo test --release -p belfry-store --test
//! engine_perf -- --ignored --nocapture`. Prints numbers; asserts only correctness. The real
//! benchmark, with baselines, is `belfry-store-bench`.

use std::time::Instant;

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, EngineOptions, Store};
use bytes::Bytes;

#[path = "support/probe.rs"]
mod probe;

use probe::ack_all;

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

/// Claim-and-ack probe, ignored by default: `cargo test --release -p belfry-store --test
/// engine_perf claim_ack -- --ignored --nocapture`. `PROBE_TASKS` due tasks (default 200,000)
/// are claimed 1,000 at a time and each is acked by its own call from 8 threads, as a server
/// acking one message at a time does. `PROBE_SYNC_DELIVERY=1` makes every ack wait for its
/// fsync (`EngineOptions::sync_delivery`). Prints numbers; asserts only correctness.
#[test]
#[ignore]
fn claim_ack_probe() {
    const CLAIM_MAX: usize = 1_000;
    const ACK_THREADS: usize = 8;
    let DueTasks {
        _dir,
        engine,
        queue,
        now,
        tasks,
        sync_delivery,
    } = DueTasks::fill(CLAIM_MAX);
    let before = engine.stats();
    let start = Instant::now();
    let mut acked = 0;
    loop {
        let batch = engine.claim(&queue, now, CLAIM_MAX, 600_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        let per_thread = batch.leased.len().div_ceil(ACK_THREADS);
        std::thread::scope(|scope| {
            for part in batch.leased.chunks(per_thread) {
                let (engine, queue) = (&engine, &queue);
                scope.spawn(move || {
                    for leased in part {
                        let outcome = engine
                            .ack(queue, leased.task.id, leased.lease_id, now)
                            .unwrap();
                        assert_eq!(outcome, belfry_store::LeaseOutcome::Ok);
                    }
                });
            }
        });
        acked += batch.leased.len();
    }
    let elapsed = start.elapsed();
    assert_eq!(acked, tasks);
    let after = engine.stats();
    println!(
        "claim+ack (sync_delivery={sync_delivery}): {acked} tasks in {elapsed:?}: {:.0} tasks/s; \
         {} WAL writes, {} fsyncs",
        acked as f64 / elapsed.as_secs_f64(),
        after.wal_writes - before.wal_writes,
        after.wal_syncs - before.wal_syncs,
    );
}

/// The claim-and-ack probe with batch acks: `cargo test --release -p belfry-store --test
/// engine_perf claim_ack_many -- --ignored --nocapture`. Each claimed batch of 1,000 is acked
/// by one `ack_many` call (one lock and one WAL frame per 128 acks), as the server's batch-ack
/// endpoint does.
/// Same environment variables as `claim_ack_probe`.
#[test]
#[ignore]
fn claim_ack_many_probe() {
    const CLAIM_MAX: usize = 1_000;
    let DueTasks {
        _dir,
        engine,
        queue,
        now,
        tasks,
        sync_delivery,
    } = DueTasks::fill(CLAIM_MAX);
    let before = engine.stats();
    let start = Instant::now();
    let mut acked = 0;
    loop {
        let batch = engine.claim(&queue, now, CLAIM_MAX, 600_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        acked += ack_all(&engine, &queue, &batch, now);
    }
    let elapsed = start.elapsed();
    assert_eq!(acked, tasks);
    let after = engine.stats();
    println!(
        "claim+ack_many (sync_delivery={sync_delivery}): {acked} tasks in {elapsed:?}: {:.0} \
         tasks/s; {} WAL writes, {} fsyncs",
        acked as f64 / elapsed.as_secs_f64(),
        after.wal_writes - before.wal_writes,
        after.wal_syncs - before.wal_syncs,
    );
}

/// An engine holding `PROBE_TASKS` (default 200,000) tasks of 200 B, all due at `now`, put in
/// batches of `batch`; `PROBE_SYNC_DELIVERY=1` sets `sync_delivery`, `PROBE_DIR` the parent of
/// its directory. The set-up shared by the claim-and-ack probes.
struct DueTasks {
    _dir: tempfile::TempDir,
    engine: Engine,
    queue: QueueName,
    now: u64,
    tasks: usize,
    sync_delivery: bool,
}

impl DueTasks {
    fn fill(batch: usize) -> DueTasks {
        let tasks: usize = std::env::var("PROBE_TASKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000);
        let sync_delivery = std::env::var("PROBE_SYNC_DELIVERY").is_ok_and(|v| v == "1");
        let dir = tempfile::tempdir_in(std::env::var("PROBE_DIR").unwrap_or_else(|_| ".".into()))
            .unwrap();
        let queue = QueueName::new("q").unwrap();
        let options = EngineOptions {
            sync_delivery,
            ..EngineOptions::default()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        engine.put_queue(&queue, Bytes::new()).unwrap();
        let now = 1_700_000_000_000u64;
        let payload = Bytes::from(vec![b'x'; 200]);
        for chunk in 0..tasks.div_ceil(batch) {
            let count = batch.min(tasks - chunk * batch);
            let tasks = (0..count)
                .map(|_| NewTask::new(queue.clone(), now, payload.clone()))
                .collect();
            engine.put(tasks).unwrap();
        }
        DueTasks {
            _dir: dir,
            engine,
            queue,
            now,
            tasks,
            sync_delivery,
        }
    }
}
