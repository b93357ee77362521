//! Restart with many far-future tasks pending: reopening reads neither the far buckets nor
//! the whole history, whether the engine was closed cleanly or abandoned without a close (as
//! after `kill -9`). Checked through the engine's work counters, not through timing; memory
//! and reopen time are measured by the benchmark's `pending` mode.

use belfry_core::{NewTask, PayloadKind, QueueName};
use belfry_store::engine::{Engine, EngineOptions, EngineStats};
use belfry_store::Store;
use belfry_store_bench::workload::{payload, verify_payload, DAY_MS, DUE_BASE_MS};
use bytes::Bytes;

const PENDING: u64 = 50_000;
const BATCH: u64 = 1_000;
/// "Now" for every call: far-future tasks are due a week to a year after it.
const NOW_MS: u64 = DUE_BASE_MS;

/// A small checkpoint threshold so the abandoned engine has checkpointed several times and
/// only the WAL tail since the last one is replayed.
const CHECKPOINT_WAL_BYTES: u64 = 1024 * 1024;

fn options() -> EngineOptions {
    EngineOptions {
        checkpoint_wal_bytes: CHECKPOINT_WAL_BYTES,
        ..EngineOptions::default()
    }
}

fn due_ms(seq: u64) -> u64 {
    NOW_MS + 7 * DAY_MS + belfry_store_bench::workload::splitmix64(seq) % (358 * DAY_MS)
}

fn fill(engine: &Engine, queue: &QueueName) -> Vec<belfry_core::TaskId> {
    engine.put_queue(queue, Bytes::new()).unwrap();
    let mut ids = Vec::new();
    for first in (0..PENDING).step_by(BATCH as usize) {
        let batch = (first..first + BATCH)
            .map(|seq| {
                let mut task =
                    NewTask::new(queue.clone(), due_ms(seq), Bytes::from(payload(seq, 100)));
                task.payload_kind = PayloadKind::Binary;
                task
            })
            .collect();
        ids.extend(engine.put(batch).unwrap().iter().map(|o| o.id()));
    }
    // A claim at "now" finds nothing due; it tells the engine the time, as a server would.
    assert!(engine
        .claim(queue, NOW_MS, 100, 30_000)
        .unwrap()
        .leased
        .is_empty());
    ids
}

fn reopened_stats(
    dir: &std::path::Path,
    queue: &QueueName,
    ids: &[belfry_core::TaskId],
) -> EngineStats {
    let engine = Engine::open(dir, options()).unwrap();
    let at_open = engine.stats();
    assert!(
        engine
            .claim(queue, NOW_MS, 100, 30_000)
            .unwrap()
            .leased
            .is_empty(),
        "a far-future task was claimed early"
    );
    assert!(
        engine.next_due_ms(queue).unwrap().is_some(),
        "the pending tasks are gone"
    );
    let after_claim = engine.stats();
    assert_eq!(
        after_claim.records_loaded, at_open.records_loaded,
        "a claim with nothing near due loaded far buckets: {after_claim:?}"
    );
    // Reading one task by id loads at most its own bucket, and gives back the whole task.
    let task = engine
        .get(queue, ids[ids.len() / 2], NOW_MS)
        .unwrap()
        .expect("task by id");
    assert_eq!(verify_payload(&task.payload), Ok(ids.len() as u64 / 2));
    let after_get = engine.stats();
    assert!(
        after_get.buckets_loaded <= at_open.buckets_loaded + 1,
        "{after_get:?}"
    );
    eprintln!("at open: {at_open:?}\nafter a get: {after_get:?}");
    at_open
}

fn check_small(stats: &EngineStats) {
    // Nothing pending is near: reopening loads no bucket's records and replays at most the
    // WAL written since the last checkpoint (a small fraction of the pending tasks).
    assert_eq!(
        stats.records_loaded, 0,
        "reopen loaded far buckets: {stats:?}"
    );
    assert_eq!(
        stats.buckets_loaded, 0,
        "reopen loaded far buckets: {stats:?}"
    );
    assert!(
        stats.wal_records_replayed < PENDING / 4,
        "reopen replayed most of the history: {stats:?}"
    );
    assert!(
        stats.buckets_in_memory < stats.buckets_total.max(1),
        "every bucket is in memory: {stats:?}"
    );
}

#[test]
fn clean_reopen_loads_no_far_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("far").unwrap();
    let engine = Engine::open(dir.path(), options()).unwrap();
    let ids = fill(&engine, &queue);
    engine.flush().unwrap();
    drop(engine);
    check_small(&reopened_stats(dir.path(), &queue, &ids));
}

#[test]
fn reopen_after_abandoning_the_engine_loads_no_far_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("far").unwrap();
    let engine = Engine::open(dir.path(), options()).unwrap();
    let ids = fill(&engine, &queue);
    // No flush, no close: the files are left as a killed process would leave them (every put
    // was fsync'd before it returned).
    engine.abandon();
    check_small(&reopened_stats(dir.path(), &queue, &ids));
}
