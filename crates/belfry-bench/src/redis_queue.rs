//! The seeds' design as a baseline: a Redis sorted-set delay queue. Submit = `ZADD` (score =
//! due unix ms, member = task id) + `HSET` (id → payload), pipelined per batch; claim = one
//! Lua script that takes up to N due members, removes them and returns their payloads
//! atomically. Consumers poll it (Redis has no long-poll for a sorted set's scores).
//!
//! The throwaway redis-server comes from `scripts/redis.sh` (appendonly, fsync every
//! second: *less* durable than belfry's fsync-per-acknowledgement, which favours Redis).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use redis::aio::MultiplexedConnection;

use crate::error::BenchError;
use crate::load::IngestOutcome;
use crate::stats::{new_histogram, record_clamped, DeliveryTracker, Percentiles};
use crate::sys::CpuMeter;
use crate::workload::payload;

/// Claims up to ARGV[2] members of KEYS[1] with score <= ARGV[1] (unix ms), removes them
/// and their payloads from KEYS[2], and returns the payloads.
const CLAIM_SCRIPT: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids == 0 then return {} end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
return payloads
";

/// A redis-server for the baseline: started by the script (and stopped again), or given.
pub struct RedisServer {
    pub url: String,
    pub pid: Option<u32>,
    script: Option<(PathBuf, u16)>,
}

impl RedisServer {
    pub fn start(args: &crate::BaselineArgs) -> Result<Self, BenchError> {
        if let Some(url) = &args.redis_url {
            return Ok(RedisServer {
                url: url.clone(),
                pid: None,
                script: None,
            });
        }
        let out = Command::new("sh")
            .arg(&args.redis_script)
            .arg("start")
            .env("REDIS_PORT", args.redis_port.to_string())
            .output()
            .map_err(|e| BenchError::io("run", &args.redis_script, e))?;
        if !out.status.success() {
            return Err(BenchError::Server(format!(
                "{} start failed: {}",
                args.redis_script.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        let url = value("REDIS_URL=").ok_or_else(|| {
            BenchError::Server(format!(
                "{} printed no REDIS_URL",
                args.redis_script.display()
            ))
        })?;
        Ok(RedisServer {
            url,
            pid: value("REDIS_PID=").and_then(|p| p.parse().ok()),
            script: Some((args.redis_script.clone(), args.redis_port)),
        })
    }

    pub fn stop(self) {
        if let Some((script, port)) = &self.script {
            stop_with(script, *port);
        }
    }
}

fn stop_with(script: &Path, port: u16) {
    let _ = Command::new("sh")
        .arg(script)
        .arg("stop")
        .env("REDIS_PORT", port.to_string())
        .output();
}

/// The two keys of one queue; a hash tag keeps them in one slot on a cluster too.
#[derive(Debug, Clone)]
pub struct QueueKeys {
    pub due: String,
    pub payloads: String,
}

impl QueueKeys {
    pub fn new(name: &str) -> Self {
        QueueKeys {
            due: format!("{{{name}}}:due"),
            payloads: format!("{{{name}}}:payloads"),
        }
    }
}

pub async fn connect(url: &str) -> Result<MultiplexedConnection, BenchError> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Deletes the queue's keys (the instance may be reused across runs).
pub async fn delete_queue(url: &str, keys: &QueueKeys) -> Result<(), BenchError> {
    let mut conn = connect(url).await?;
    redis::cmd("DEL")
        .arg(&keys.due)
        .arg(&keys.payloads)
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// `used_memory` from INFO memory, in bytes.
pub async fn used_memory(url: &str) -> Result<u64, BenchError> {
    let mut conn = connect(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

/// How to submit to the Redis queue.
#[derive(Debug, Clone, Copy)]
pub struct Submit<'a> {
    pub url: &'a str,
    /// redis-server's pid, to report its CPU.
    pub pid: Option<u32>,
    pub keys: &'a QueueKeys,
    pub batch: usize,
    pub connections: usize,
    pub payload_bytes: usize,
}

/// Submits the tasks (due times by index) in batches of `batch`, one pipeline (ZADD + HSET)
/// per batch, over `connections` connections. Pipelines are built before the clock starts,
/// like the HTTP bodies.
pub async fn ingest(
    submit: Submit<'_>,
    due_at_ms: &[u64],
    progress: ProgressBar,
    label: &str,
) -> Result<IngestOutcome, BenchError> {
    let Submit {
        url,
        pid,
        keys,
        batch,
        connections,
        payload_bytes,
    } = submit;
    let batch = batch.max(1);
    let pipelines = Arc::new(pipelines(keys, due_at_ms, batch, payload_bytes));
    let next = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(connect(url).await?);
    }
    let meter = CpuMeter::start(pid);
    let started = Instant::now();
    let mut workers = Vec::new();
    for conn in conns {
        let (pipelines, next, progress) = (pipelines.clone(), next.clone(), progress.clone());
        workers.push(tokio::spawn(send_pipelines(
            conn, pipelines, next, progress,
        )));
    }
    let mut total = Sent::new();
    for w in workers {
        if let Ok(sent) = w.await {
            total.add(sent);
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let cpu = meter.stop();
    progress.finish_and_clear();
    Ok(IngestOutcome {
        label: label.to_string(),
        requests: total.requests,
        accepted: total.accepted,
        rejected: total.rejected,
        failed_requests: 0,
        first_error: total.first_error,
        elapsed_s: elapsed,
        tasks_per_s: total.accepted as f64 / elapsed,
        requests_per_s: total.requests as f64 / elapsed,
        latency: Percentiles::of(&total.latency),
        cpu,
        answered_after_due: 0,
    })
}

/// One pipeline (ZADD + HSET) per batch of `batch` tasks, with the number of tasks in it.
fn pipelines(
    keys: &QueueKeys,
    due_at_ms: &[u64],
    batch: usize,
    payload_bytes: usize,
) -> Vec<(redis::Pipeline, u64)> {
    due_at_ms
        .chunks(batch)
        .enumerate()
        .map(|(n, chunk)| {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&keys.due);
            let mut hset = redis::cmd("HSET");
            hset.arg(&keys.payloads);
            for (offset, &due) in chunk.iter().enumerate() {
                let index = (n * batch + offset) as u64;
                zadd.arg(due).arg(index);
                hset.arg(index).arg(payload(index, payload_bytes));
            }
            let mut pipe = redis::pipe();
            pipe.add_command(zadd).ignore().add_command(hset).ignore();
            (pipe, chunk.len() as u64)
        })
        .collect()
}

/// What one connection (or all of them) sent, and how it was answered.
struct Sent {
    requests: u64,
    accepted: u64,
    rejected: u64,
    first_error: Option<String>,
    latency: Histogram<u64>,
}

impl Sent {
    fn new() -> Self {
        Sent {
            requests: 0,
            accepted: 0,
            rejected: 0,
            first_error: None,
            latency: new_histogram(),
        }
    }

    /// Adds another connection's counts; the first error kept is the earliest worker's.
    fn add(&mut self, other: Sent) {
        self.requests += other.requests;
        self.accepted += other.accepted;
        self.rejected += other.rejected;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        let _ = self.latency.add(&other.latency);
    }
}

/// Sends the next unsent pipeline on `conn`, one at a time, until none is left.
async fn send_pipelines(
    mut conn: MultiplexedConnection,
    pipelines: Arc<Vec<(redis::Pipeline, u64)>>,
    next: Arc<AtomicUsize>,
    progress: ProgressBar,
) -> Sent {
    let mut sent = Sent::new();
    loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        let Some((pipe, tasks)) = pipelines.get(b) else {
            break;
        };
        let started = Instant::now();
        let result = pipe.query_async::<()>(&mut conn).await;
        record_clamped(&mut sent.latency, started.elapsed().as_micros() as u64);
        sent.requests += 1;
        match result {
            Ok(()) => sent.accepted += tasks,
            Err(e) => {
                sent.rejected += tasks;
                sent.first_error.get_or_insert_with(|| e.to_string());
            }
        }
        progress.inc(*tasks);
    }
    sent
}

/// The claim script, loaded once per consumer and run by [`claim`].
pub fn claim_script() -> redis::Script {
    redis::Script::new(CLAIM_SCRIPT)
}

/// One claim: takes up to `max` members due at `now_ms` or earlier (lowest scores first),
/// removes them and their payloads, and returns the payloads. Removal is the whole
/// acknowledgement: a claimed task is gone from Redis whether or not its consumer handles it
/// (at most once, unlike belfry's leases).
pub async fn claim(
    conn: &mut MultiplexedConnection,
    script: &redis::Script,
    keys: &QueueKeys,
    now_ms: u64,
    max: usize,
) -> Result<Vec<Option<Vec<u8>>>, BenchError> {
    Ok(script
        .key(&keys.due)
        .key(&keys.payloads)
        .arg(now_ms)
        .arg(max)
        .invoke_async(conn)
        .await?)
}

/// Consumes the queue with `consumers` pollers until every task arrived or `deadline`,
/// recording each receipt in `tracker`.
/// How to consume from the Redis queue.
#[derive(Debug, Clone)]
pub struct Consume {
    pub url: String,
    pub keys: QueueKeys,
    pub consumers: usize,
    /// Tasks per claim.
    pub max: usize,
    /// Pause after an empty claim.
    pub poll_interval: Duration,
    pub deadline: Instant,
}

pub async fn consume(
    consume: Consume,
    tracker: Arc<Mutex<DeliveryTracker>>,
    progress: ProgressBar,
) -> Result<(), BenchError> {
    let Consume {
        url,
        keys,
        consumers,
        max,
        poll_interval,
        deadline,
    } = consume;
    let script = Arc::new(claim_script());
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..consumers {
        let mut conn = connect(&url).await?;
        let (script, keys, tracker, done, progress) = (
            script.clone(),
            keys.clone(),
            tracker.clone(),
            done.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                let now_ms = crate::sys::unix_ms();
                let claimed = claim(&mut conn, &script, &keys, now_ms, max).await;
                let receipt_us = crate::sys::unix_us();
                let payloads = match claimed {
                    Ok(p) => p,
                    Err(_) => {
                        tokio::time::sleep(poll_interval).await;
                        continue;
                    }
                };
                if payloads.is_empty() {
                    tokio::time::sleep(poll_interval).await;
                    continue;
                }
                let count = payloads.len() as u64;
                let Ok(mut t) = tracker.lock() else { break };
                for p in payloads.iter().flatten() {
                    if let Some(index) = crate::workload::parse_index(p) {
                        t.record(index, receipt_us);
                    }
                }
                if t.all_delivered() {
                    done.store(true, Ordering::Relaxed);
                }
                drop(t);
                progress.inc(count);
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    progress.finish_and_clear();
    Ok(())
}
