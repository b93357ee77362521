//! Lock-sharing probe, ignored by default: `cargo test --release -p belfry-store --test
//! engine_lock_perf -- --ignored --nocapture --test-threads 1`. Prints numbers; asserts only
//! correctness. `PROBE_DIR` is the parent of the data directories (default `.`: a real disk),
//! `PROBE_SECONDS` the length of each timed phase (default 2).
//!
//! Every queue's calls share the engine's state lock. This measures what large calls on one
//! queue do to one-task claims on another: a drain (claims of 1,000 and ack batches of
//! 1,000, which the engine does in chunks of 128 records), and a schedule tick's puts of
//! firings with idempotency keys, in batches of 1,000 and of 128 (`FIRING_PUT_TASKS`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, Store};
use bytes::Bytes;

#[path = "support/probe.rs"]
mod probe;

use probe::{ack_all, claim_latencies, engine, percentile, phase, NOW};

fn queue(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn due_now(queue: &QueueName, n: usize) -> Vec<NewTask> {
    (0..n)
        .map(|_| NewTask::new(queue.clone(), NOW, Bytes::from_static(b"{\"i\":1}")))
        .collect()
}

/// Runs `load` on its own thread for one phase while the probe claims from `work`; prints the
/// probe's latencies and what the load did per second.
fn beside(engine: &Engine, work: &QueueName, name: &str, load: impl Fn(&Engine) -> u64 + Sync) {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let sorted = std::thread::scope(|scope| {
        let (stop, done, load) = (&stop, &done, &load);
        let loader = scope.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                done.fetch_add(load(engine), Ordering::Relaxed);
            }
        });
        let prober =
            scope.spawn(move || claim_latencies(engine, work, || !stop.load(Ordering::Relaxed)));
        std::thread::sleep(phase());
        stop.store(true, Ordering::Relaxed);
        loader.join().unwrap();
        prober.join().unwrap()
    });
    println!(
        "one-task claims beside {name}: {} claims, p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?}; \
         the load: {:.0} tasks/s",
        sorted.len(),
        percentile(&sorted, 0.50),
        percentile(&sorted, 0.99),
        percentile(&sorted, 0.999),
        percentile(&sorted, 1.0),
        done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore]
fn one_task_claims_beside_large_calls_probe() {
    let (_dir, engine) = engine();
    let (work, bulk, cron) = (queue("work"), queue("bulk"), queue("cron"));
    for q in [&work, &bulk, &cron] {
        engine.put_queue(q, Bytes::new()).unwrap();
    }
    engine.put(due_now(&work, 1_000)).unwrap();
    beside(&engine, &work, "nothing", |_| {
        std::thread::sleep(Duration::from_millis(1));
        0
    });
    // A drain: claims of 1,000 and ack batches of 1,000, refilled in puts of 100 tasks (short
    // holds of the lock, so that the drain's own calls are what the probe meets).
    beside(&engine, &work, "a drain (claim 1,000 + ack 1,000)", |e| {
        let batch = e.claim(&bulk, NOW, 1_000, 60_000).unwrap();
        if batch.leased.is_empty() {
            for _ in 0..100 {
                e.put(due_now(&bulk, 100)).unwrap();
            }
            return 0;
        }
        ack_all(e, &bulk, &batch, NOW) as u64
    });
    // A tick's firings: tasks with idempotency keys, far ahead, in batches of each size.
    let next = AtomicU64::new(0);
    for size in [1_000usize, 128] {
        beside(&engine, &work, &format!("firing puts of {size}"), |e| {
            let first = next.fetch_add(size as u64, Ordering::Relaxed);
            let tasks = (first..first + size as u64)
                .map(|i| {
                    let mut t =
                        NewTask::new(cron.clone(), NOW + 3_600_000, Bytes::from_static(b"{}"));
                    t.idempotency_key = Some(format!("schedule:s{}:{}:0", i % 10_000, i / 10_000));
                    t
                })
                .collect();
            e.put(tasks).unwrap().len() as u64
        });
    }
}
