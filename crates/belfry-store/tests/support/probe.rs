//! What the ignored engine probes share: an engine on a real disk, the length of a timed
//! phase, timed one-task claims, and acking a claimed batch.
#![allow(dead_code)] // each probe file uses its own part

use std::time::Duration;

use belfry_core::{QueueName, UnixMs};
use belfry_store::{ClaimBatch, Engine, EngineOptions, LeaseOutcome, Store};

/// The probes' "now": every task they put is due by it, or far after it.
pub const NOW: u64 = 1_700_000_000_000;

/// An engine in a fresh directory under `PROBE_DIR` (default `.`: a real disk, not a tmpfs,
/// so fsyncs cost what they cost).
pub fn engine() -> (tempfile::TempDir, Engine) {
    let dir =
        tempfile::tempdir_in(std::env::var("PROBE_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    (dir, engine)
}

/// How long a timed phase lasts: `PROBE_SECONDS` (default 2).
pub fn phase() -> Duration {
    let seconds: f64 = std::env::var("PROBE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(seconds)
}

/// Claims one task of `queue` at a time, and nacks it due at once so the queue never runs
/// dry, while `go()` says so; returns the sorted claim latencies.
pub fn claim_latencies(engine: &Engine, queue: &QueueName, go: impl Fn() -> bool) -> Vec<Duration> {
    let mut latencies = Vec::new();
    while go() {
        let start = std::time::Instant::now();
        let batch = engine.claim(queue, NOW, 1, 60_000).unwrap();
        latencies.push(start.elapsed());
        let leased = batch.leased.first().expect("the queue holds enough tasks");
        engine
            .nack(queue, leased.task.id, leased.lease_id, NOW, NOW)
            .unwrap();
    }
    latencies.sort_unstable();
    latencies
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Acks every task `batch` leased in one `ack_many`, as the server's batch-ack endpoint does;
/// returns how many, and panics unless every ack is `Ok`.
pub fn ack_all(engine: &Engine, queue: &QueueName, batch: &ClaimBatch, now: UnixMs) -> usize {
    let acks: Vec<_> = batch
        .leased
        .iter()
        .map(|l| (l.task.id, l.lease_id))
        .collect();
    let outcomes = engine.ack_many(queue, &acks, now).unwrap();
    assert!(outcomes.iter().all(|o| *o == LeaseOutcome::Ok));
    outcomes.len()
}
