//! Bulk subscribe measurement: stores N numeric-id subscriptions in one set (batches of
//! 10,000, fsync'd like every subscribe), then reports ids/s, RSS growth, the data size on
//! disk and how long a reopen takes.
//!
//! `cargo run -p belfry-store --release --example subs_bulk -- [total] [dir or -] [random]`
//! (default 10,000,000 ids, a temporary directory under the current one, ascending ids;
//! `random` subscribes ids in a shuffled order instead).

use std::path::Path;
use std::time::Instant;

use belfry_core::UserId;
use belfry_store::{Engine, EngineOptions, Store};

const BATCH: u64 = 10_000;

/// `VmRSS` and `VmHWM` of this process, in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// A permutation of `0..n` batches (multiplying by an odd constant modulo a power of two).
fn id(i: u64, random: bool, n: u64) -> u64 {
    if !random {
        return i;
    }
    let m = n.next_power_of_two();
    let mut x = i;
    loop {
        x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15 | 1) % m;
        if x < n {
            return x;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let temp = tempfile::tempdir_in(".").unwrap();
    let dir = match args.get(2).map(String::as_str) {
        None | Some("" | "-") => temp.path().to_path_buf(),
        Some(dir) => dir.into(),
    };
    let random = args.get(3).is_some_and(|a| a == "random");
    let engine = Engine::open(&dir, EngineOptions::default()).unwrap();
    let (rss0, _) = rss_kib();
    let started = Instant::now();
    let mut batch: Vec<UserId> = Vec::with_capacity(BATCH as usize);
    let mut added = 0;
    for start in (0..total).step_by(BATCH as usize) {
        batch.clear();
        batch.extend(
            (start..(start + BATCH).min(total))
                .map(|i| UserId::new(id(i, random, total).to_string()).unwrap()),
        );
        added += engine.subscribe(42, &batch).unwrap();
    }
    let elapsed = started.elapsed();
    assert_eq!(added, total);
    let (rss1, hwm1) = rss_kib();
    println!(
        "subscribed {total} ids in {:.2} s: {:.0} ids/s ({} order)",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        if random { "random" } else { "ascending" }
    );
    println!(
        "RSS after open {} MiB, after subscribing {} MiB (growth {} MiB), peak {} MiB",
        rss0 / 1024,
        rss1 / 1024,
        rss1.saturating_sub(rss0) / 1024,
        hwm1 / 1024
    );
    let flush = Instant::now();
    engine.flush().unwrap();
    println!("flush {:.2} s", flush.elapsed().as_secs_f64());
    drop(engine);
    let bytes = dir_bytes(&dir);
    println!(
        "on disk {:.1} MiB: {:.1} bytes per subscription",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / total as f64
    );
    let (rss2, _) = rss_kib();
    let reopen = Instant::now();
    let engine = Engine::open(&dir, EngineOptions::default()).unwrap();
    let reopen = reopen.elapsed();
    let (rss3, _) = rss_kib();
    assert_eq!(engine.subscriber_count(42).unwrap(), total);
    println!(
        "reopen {:.3} s, RSS growth across reopen {} MiB",
        reopen.as_secs_f64(),
        rss3.saturating_sub(rss2) / 1024
    );
    let page = Instant::now();
    let mut after = None;
    let mut seen = 0;
    for _ in 0..100 {
        let got = engine.subscribers(42, after.as_ref(), 1_000).unwrap();
        seen += got.len();
        after = got.last().cloned();
    }
    println!(
        "100 pages of 1,000 members: {:.1} ms",
        page.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(seen as u64, total.min(100_000));
    let probe = Instant::now();
    let fresh: Vec<UserId> = (total..total + BATCH)
        .map(|i| UserId::new(i.to_string()).unwrap())
        .collect();
    let mut hits = 0;
    for u in &fresh {
        hits += usize::from(engine.is_subscribed(42, u).unwrap());
    }
    println!(
        "{BATCH} is_subscribed of absent ids: {:.1} ms ({hits} hits)",
        probe.elapsed().as_secs_f64() * 1e3
    );
}
