//! The baseline: belfry's own Redis store (`belfry_store_redis::RedisStore`) called
//! in-process from plain threads, with the same batches the HTTP clients send. It runs the
//! same Lua scripts on the same keys as the servers do, so the gap to it is what the HTTP
//! API, JSON and the server's own work cost — not Redis.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{NewTask, QueueName};
use belfry_store::Store;
use belfry_store_redis::{RedisOptions, RedisStore, RedisTarget};

use super::Rate;
use crate::error::BenchError;

/// Visibility of the drain's leases: far longer than the run, so nothing is leased twice.
const VISIBILITY_MS: u64 = 300_000;

fn connect(store_url: &str, namespace: &str) -> Result<Arc<RedisStore>, BenchError> {
    let target =
        RedisTarget::parse(store_url).map_err(|e| BenchError::Server(format!("store url: {e}")))?;
    let options = RedisOptions {
        namespace: namespace.to_string(),
        ..RedisOptions::default()
    };
    RedisStore::connect(&target, options)
        .map(Arc::new)
        .map_err(|e| BenchError::Server(format!("connect the Redis store: {e}")))
}

/// Opens the pool's connections and loads the scripts (a put, a claim and an ack on
/// another queue from every thread) before the clock starts, as the servers have by the time
/// their clients start.
fn warm_up(store: &Arc<RedisStore>, threads: usize) -> Result<(), BenchError> {
    let queue = put_queue(store, "bench-warm-up")?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), belfry_store::StoreError> {
                    let now = crate::sys::unix_ms();
                    store.put(vec![NewTask::new(queue.clone(), now, &b"{}"[..])])?;
                    let claimed = store.claim(&queue, now, 1, VISIBILITY_MS)?;
                    let acks: Vec<_> = claimed
                        .leased
                        .iter()
                        .map(|l| (l.task.id, l.lease_id))
                        .collect();
                    store.ack_many(&queue, &acks, now)?;
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(BenchError::Server(format!("warm-up: {e}"))),
                Err(_) => return Err(BenchError::Server("warm-up thread panicked".into())),
            }
        }
        Ok(())
    })
}

/// Puts `tasks` tasks (all due at `due_ms`) in batches of `batch` from `threads` threads,
/// then claims and acks them all in batches of `batch`; returns (ingest, drain) rates.
pub fn run(
    store_url: &str,
    namespace: &str,
    tasks: u64,
    batch: usize,
    threads: usize,
    payload_bytes: usize,
    bar: &indicatif::ProgressBar,
) -> Result<(Rate, Rate), BenchError> {
    let store = connect(store_url, namespace)?;
    let queue = put_queue(&store, "bench-direct")?;
    let due_ms = crate::sys::unix_ms();
    // Payloads built before the clock starts, like the HTTP bodies.
    let payloads = payload_batches(tasks, batch, payload_bytes);
    warm_up(&store, threads)?;
    bar.set_length(tasks * 2);
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let threads = Threads {
        store: &store,
        queue: &queue,
        count: threads,
        errors: &errors,
        bar,
    };
    let started = Instant::now();
    let stored = threads.put_all(&payloads, due_ms, &next);
    let ingest = Rate::new(stored, started.elapsed(), errors.swap(0, Ordering::Relaxed));
    let drained = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let give_up = started + Duration::from_secs(600);
    threads.drain_all(stored, batch, &drained, give_up);
    let drain = Rate::new(
        drained.load(Ordering::Relaxed),
        started.elapsed(),
        errors.load(Ordering::Relaxed),
    );
    Ok((ingest, drain))
}

/// Creates queue `name` in the store.
fn put_queue(store: &RedisStore, name: &str) -> Result<QueueName, BenchError> {
    let queue = QueueName::new(name).map_err(|e| BenchError::Server(format!("queue name: {e}")))?;
    store
        .put_queue(&queue, bytes::Bytes::from_static(b"{}"))
        .map_err(|e| BenchError::Server(format!("put_queue: {e}")))?;
    Ok(queue)
}

/// The payloads of `tasks` tasks, by batch of `batch`.
fn payload_batches(tasks: u64, batch: usize, payload_bytes: usize) -> Arc<Vec<Vec<bytes::Bytes>>> {
    let batches = tasks.div_ceil(batch as u64) as usize;
    Arc::new(
        (0..batches)
            .map(|b| {
                let first = (b * batch) as u64;
                (first..(first + batch as u64).min(tasks))
                    .map(|i| bytes::Bytes::from(crate::workload::payload(i, payload_bytes)))
                    .collect()
            })
            .collect(),
    )
}

/// The threads that call the store, and what they share.
struct Threads<'a> {
    store: &'a Arc<RedisStore>,
    queue: &'a QueueName,
    count: usize,
    /// Failed store calls.
    errors: &'a AtomicU64,
    bar: &'a indicatif::ProgressBar,
}

impl Threads<'_> {
    /// Puts every batch of `payloads` (due at `due_ms`), each thread taking the `next` one;
    /// answers how many tasks were stored (a failed batch counts as an error, not as tasks).
    fn put_all(
        &self,
        payloads: &Arc<Vec<Vec<bytes::Bytes>>>,
        due_ms: u64,
        next: &AtomicUsize,
    ) -> u64 {
        let stored = AtomicU64::new(0);
        let stored_ref = &stored;
        let bar = self.bar;
        std::thread::scope(|s| {
            for _ in 0..self.count {
                let (store, queue, payloads, next, errors) =
                    (self.store, self.queue, payloads, next, self.errors);
                s.spawn(move || loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    let Some(batch) = payloads.get(b) else { break };
                    let new: Vec<NewTask> = batch
                        .iter()
                        .map(|p| NewTask::new(queue.clone(), due_ms, p.clone()))
                        .collect();
                    match store.put(new) {
                        Ok(_) => {
                            stored_ref.fetch_add(batch.len() as u64, Ordering::Relaxed);
                            bar.inc(batch.len() as u64)
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        stored.into_inner()
    }

    /// Claims and acks in batches of `batch` until `tasks` are drained (counted in
    /// `drained`) or `give_up` passes.
    fn drain_all(&self, tasks: u64, batch: usize, drained: &AtomicU64, give_up: Instant) {
        let bar = self.bar;
        std::thread::scope(|s| {
            for _ in 0..self.count {
                let (store, queue, drained, errors) =
                    (self.store, self.queue, drained, self.errors);
                s.spawn(move || {
                    while drained.load(Ordering::Relaxed) < tasks && Instant::now() < give_up {
                        let now = crate::sys::unix_ms();
                        let claimed = match store.claim(queue, now, batch, VISIBILITY_MS) {
                            Ok(c) => c,
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        };
                        if claimed.leased.is_empty() {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        let acks: Vec<_> = claimed
                            .leased
                            .iter()
                            .map(|l| (l.task.id, l.lease_id))
                            .collect();
                        if store.ack_many(queue, &acks, now).is_err() {
                            // Not drained: the tasks come back when their leases end.
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        drained.fetch_add(acks.len() as u64, Ordering::Relaxed);
                        bar.inc(acks.len() as u64);
                    }
                });
            }
        });
    }
}
