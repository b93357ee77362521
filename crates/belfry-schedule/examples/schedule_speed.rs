//! Rough speed of the schedule math and of a tick, for BENCHMARKS-style numbers:
//! `cargo run --release -p belfry-schedule --example schedule_speed`.

use std::sync::Arc;
use std::time::Instant;

use belfry_core::schedule::{MisfirePolicy, ScheduleSpec, Trigger};
use belfry_core::QueueName;
use belfry_schedule::{ScheduleDef, ScheduleService};
use belfry_store::{MemoryStore, Store};
use bytes::Bytes;

/// 2026-11-22T00:00:00Z.
const T0: u64 = 1_795_305_600_000;

fn rate(label: &str, count: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{label}: {count} in {seconds:.3} s = {:.0}/s",
        count as f64 / seconds
    );
}

fn main() {
    for (expression, zone) in [
        ("* * * * *", "UTC"),
        ("* * * * *", "America/New_York"),
        ("0 30 2 * * *", "Europe/Berlin"),
        ("*/15 * * * *", "Australia/Lord_Howe"),
    ] {
        let spec = ScheduleSpec::new(
            Trigger::cron(expression, zone).unwrap(),
            None,
            None,
            1,
            MisfirePolicy::FireOnce,
        )
        .unwrap();
        let started = Instant::now();
        let mut cursor = T0;
        let n = 200_000;
        for _ in 0..n {
            cursor = spec.next_after(cursor).unwrap();
        }
        rate(&format!("next_after {expression:?} in {zone}"), n, started);
    }

    let every_second = ScheduleSpec::new(
        Trigger::cron("* * * * * *", "Europe/Berlin").unwrap(),
        None,
        None,
        1,
        MisfirePolicy::CatchUp,
    )
    .unwrap();
    let started = Instant::now();
    let due = every_second.due(T0, T0 + 365 * 86_400_000);
    println!(
        "due() after a year-long outage of a per-second schedule: {} fired, {:.3} ms",
        due.fire_times.len(),
        started.elapsed().as_secs_f64() * 1e3
    );

    let store = Arc::new(MemoryStore::new());
    let queue = QueueName::new("jobs").unwrap();
    store.put_queue(&queue, Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    let schedules = 10_000u64;
    for i in 0..schedules {
        let def = if i % 2 == 0 {
            ScheduleDef::cron(queue.clone(), "* * * * *", "Europe/Berlin")
        } else {
            ScheduleDef::every(queue.clone(), 60_000)
        };
        service.create(None, def, T0).unwrap();
    }
    let started = Instant::now();
    let next = service.next_tick_ms().unwrap();
    println!(
        "next_tick_ms over {schedules} schedules: {:.1} ms (next {next:?})",
        started.elapsed().as_secs_f64() * 1e3
    );
    let started = Instant::now();
    let report = service.tick(T0 + 60_000).unwrap();
    rate(
        &format!(
            "tick creating {} firings of {schedules} schedules",
            report.tasks_created
        ),
        report.tasks_created,
        started,
    );
    let started = Instant::now();
    let idle = service.tick(T0 + 60_001).unwrap();
    println!(
        "idle tick over {schedules} schedules: {:.1} ms ({} created)",
        started.elapsed().as_secs_f64() * 1e3,
        idle.tasks_created
    );
}
