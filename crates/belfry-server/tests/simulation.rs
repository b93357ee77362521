//! A deterministic simulation of the server's dispatch loop.
//!
//! Each seed chooses a configuration (budgets, queue policies, fault rates) and a schedule of
//! a few hundred operations: submits due in the past, now or later (some with new or repeated
//! idempotency keys), pull leases with acks, nacks, extensions and forgotten leases, cancels,
//! reschedules, redrives, time passing, wall-clock steps of seconds to hours either way, and
//! crashes (the store is abandoned as `kill -9` leaves it and a new server reopens its
//! directory). Push deliveries go to a simulated sink that answers after a virtual delay —
//! delivered, retry, reject, timeout, or a stall past the lease — and store calls get injected
//! latency. A model checks every store call and every delivery as it happens (`sim/model.rs`,
//! `sim/outcomes.rs`): never early against the clock the server was given, leases exclusive
//! (a task is handed out again only once its lease ran out or was finished), every ack, retry
//! and dead letter justified by what the sink or consumer said, no claimable task missed, sink
//! calls in flight within the dispatcher's budgets and the queue's limit; at the end a drain
//! must bring every accepted task to the final state the model expects, read through the
//! server and again after a clean reopen.
//!
//! Time is tokio's paused clock on a current-thread runtime, so timers, sink delays and the
//! wall clock are virtual and a run takes milliseconds of real time per simulated minute.
//! What a seed fixes: the configuration, the sequence of operations, every sink answer and
//! delay (keyed by task and attempt) and every store delay (keyed by call and arguments). What
//! it does not: store calls run on tokio's blocking pool (real threads, as in production), so
//! the order in which a store call and the runtime's other tasks interleave can differ
//! between runs, and once it does, clock readings (and the due times and store delays derived
//! from them) drift. The invariants hold under any interleaving; a failing seed replays the
//! same operations and usually the same failure.
//!
//! `BELFRY_SIM_SEED=<n>` runs only seed `n`; `BELFRY_SIM_SEEDS=<count>` runs that many seeds
//! (default [`SEEDS_DEFAULT`]); `BELFRY_SIM_STEPS=<n>` sets the operations per seed;
//! `BELFRY_SIM_TRACE=1` prints every operation.

mod sim;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Seeds run by default: enough to cover every operation and fault many times over while the
/// test stays a few seconds of a CI run.
const SEEDS_DEFAULT: u64 = 24;

/// Operations per seed by default.
const STEPS_DEFAULT: usize = 400;

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {value:?}")),
    )
}

/// Runs one seed on its own paused current-thread runtime; a panic names the seed.
fn run_seed(seed: u64, steps: usize) -> sim::model::Stats {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            // Store calls one at a time, in the order the runtime made them.
            .max_blocking_threads(1)
            .build()
            .expect("a runtime");
        runtime.block_on(sim::driver::run(seed, steps))
    }));
    match outcome {
        Ok(stats) => stats,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            if message.contains("replay: BELFRY_SIM_SEED") {
                panic!("{message}");
            }
            panic!(
                "simulation seed {seed} panicked: {message}\nreplay: BELFRY_SIM_SEED={seed} cargo test -p belfry-server --test simulation"
            );
        }
    }
}

#[test]
fn dispatch_loop_keeps_its_invariants_under_random_schedules() {
    let steps = env_number("BELFRY_SIM_STEPS").map_or(STEPS_DEFAULT, |n| n as usize);
    let seeds: Vec<u64> = match env_number("BELFRY_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_number("BELFRY_SIM_SEEDS").unwrap_or(SEEDS_DEFAULT)).collect(),
    };
    let mut total = sim::model::Stats::default();
    for &seed in &seeds {
        let stats = run_seed(seed, steps);
        total.submitted += stats.submitted;
        total.handouts += stats.handouts;
        total.lease_expiries += stats.lease_expiries;
        total.expired_reclaims += stats.expired_reclaims;
        total.deliveries += stats.deliveries;
        total.acks += stats.acks;
        total.retries += stats.retries;
        total.dead += stats.dead;
        total.crashes += stats.crashes;
        total.clock_steps += stats.clock_steps;
        total.changes += stats.changes;
        total.duplicates += stats.duplicates;
    }
    eprintln!("{} seeds of {steps} steps: {total:?}", seeds.len());
    // The schedule must have exercised what it claims to; a generator that stopped producing
    // some operation would make the run pass vacuously.
    if seeds.len() >= 8 {
        assert!(
            total.deliveries > 0 && total.acks > 0 && total.retries > 0,
            "{total:?}"
        );
        assert!(
            total.dead > 0 && total.crashes > 0 && total.clock_steps > 0,
            "{total:?}"
        );
        assert!(total.expired_reclaims > 0 && total.changes > 0, "{total:?}");
        assert!(total.duplicates > 0, "{total:?}");
    }
}
