//! The schedule: each step draws one operation from the seed — submits, pull leases and their
//! acks, nacks and extensions, cancels, redrives and deletes of dead letters (one or many),
//! time passing, wall-clock steps and crashes —
//! applies it, and checks the model. At the end everything is drained with the faults off and
//! every task's final state is compared with the model's, before and after a reopen.

use std::time::Duration;

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_server::service::{DeadPick, NackResult};
use belfry_server::ServiceError;
use belfry_store::DeadAction;

use super::model::{State, Stats};
use super::world::{Held, World};

const HOUR_MS: u64 = 3_600_000;

/// Virtual seconds the drain may take before a task still unfinished counts as lost: longer
/// than any backoff (30 s), lease (60 s) or stalled delivery (20 s) the seeds choose.
const DRAIN_ROUNDS: usize = 600;

/// Runs one seed for `steps` operations; returns its counts.
pub async fn run(seed: u64, steps: usize) -> Stats {
    let mut world = World::new(seed).await;
    while world.step < steps {
        one_step(&mut world).await;
        world.check();
        world.step += 1;
    }
    drain(&mut world).await;
    world.check();
    verify(&mut world).await;
    world.check();
    let stats = world.shared.model.lock().stats;
    stats
}

async fn one_step(world: &mut World) {
    let dice = world.rng.below(1_000);
    match dice {
        0..=249 => submit(world).await,
        250..=499 => {
            let ms = world.rng.range(1, 500);
            advance(world, ms).await;
        }
        500..=599 => {
            let ms = world.rng.range(500, 5_000);
            advance(world, ms).await;
        }
        600..=629 => {
            let ms = world.rng.range(10_000, 90_000);
            advance(world, ms).await;
        }
        630..=759 => lease(world).await,
        760..=839 => ack(world).await,
        840..=879 => nack(world).await,
        880..=909 => extend(world).await,
        910..=919 => {
            if let Some(held) = take_held(world) {
                world.note(format!(
                    "consumer forgets {} (lease {:?})",
                    held.id, held.lease
                ));
            }
        }
        920..=929 => cancel(world).await,
        930..=939 => reschedule(world).await,
        940..=949 => redrive(world).await,
        950..=954 => delete_dead(world).await,
        955..=959 => settle_dead(world).await,
        960..=989 => step_clock(world),
        _ => {
            world.note("crash and restart".into());
            world.crash().await;
        }
    }
}

async fn advance(world: &mut World, ms: u64) {
    world.note(format!("time passes: {ms} ms"));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

async fn submit(world: &mut World) {
    let spec = world.rng.pick(&world.queues).expect("queues").clone();
    let now = world.now_ms();
    let count = world.rng.range(1, 4);
    let mut tasks = Vec::new();
    for _ in 0..count {
        let due = match world.rng.below(100) {
            0..=14 => now.saturating_sub(world.rng.range(1, 600_000)),
            15..=29 => now,
            30..=69 => now + world.rng.range(1, 2_000),
            70..=94 => now + world.rng.range(2_000, 120_000),
            _ => now + world.rng.range(HOUR_MS, 4 * HOUR_MS),
        };
        let mut task = NewTask::new(spec.name.clone(), due, &b"{}"[..]);
        task.idempotency_key = idempotency_key(world, &spec.name);
        tasks.push(task);
    }
    world.note(format!(
        "submit {count} to {} due {:?}",
        spec.name,
        tasks.iter().map(|t| t.due_at_ms).collect::<Vec<_>>()
    ));
    let service = world.service().clone();
    let result = if tasks.len() == 1 {
        // A single submit goes to the coalescer's own thread, which paused time cannot see.
        hold_time(service.submit(&spec.name, tasks)).await
    } else {
        service.submit(&spec.name, tasks).await
    };
    if let Err(e) = result {
        fail(world, format!("submit to {} refused: {e}", spec.name));
    }
}

/// A quarter of the tasks carry an idempotency key: a new one, or half the time one the
/// queue has seen before.
fn idempotency_key(world: &mut World, queue: &QueueName) -> Option<String> {
    if !world.rng.chance(250) {
        return None;
    }
    let known: Vec<String> = world
        .shared
        .model
        .lock()
        .keys
        .keys()
        .filter(|(q, _)| q == queue.as_str())
        .map(|(_, key)| key.clone())
        .collect();
    if world.rng.chance(500) {
        if let Some(key) = world.rng.pick(&known) {
            return Some(key.clone());
        }
    }
    Some(format!("key-{}-{}", world.step, world.rng.below(1_000_000)))
}

async fn lease(world: &mut World) {
    let pull: Vec<_> = world
        .queues
        .iter()
        .filter(|q| q.push_timeout_ms.is_none())
        .cloned()
        .collect();
    let spec = world.rng.pick(&pull).expect("pull queues").clone();
    let max = world.rng.range(1, 4) as usize;
    let visibility_ms = if world.rng.chance(300) {
        world.rng.range(100, 2_000)
    } else {
        world.rng.range(5_000, 30_000)
    };
    let wait_ms = if world.rng.chance(700) {
        0
    } else {
        world.rng.range(1, 3_000)
    };
    world.note(format!(
        "lease {max} of {} for {visibility_ms} ms, waiting {wait_ms} ms",
        spec.name
    ));
    let leased = world
        .service()
        .lease(
            &spec.name,
            max,
            visibility_ms,
            Duration::from_millis(wait_ms),
        )
        .await;
    match leased {
        Ok(tasks) => {
            for task in tasks {
                world.held.push(Held {
                    queue: spec.name.clone(),
                    id: task.task.id,
                    lease: task.lease_id,
                });
            }
        }
        Err(e) => fail(world, format!("lease of {} failed: {e}", spec.name)),
    }
}

fn take_held(world: &mut World) -> Option<Held> {
    if world.held.is_empty() {
        return None;
    }
    let index = world.rng.below(world.held.len() as u64) as usize;
    Some(world.held.swap_remove(index))
}

/// Ack, nack and extend answer `lease_expired` when the lease ran out or was replaced, and
/// `task_not_found` when the task finished and was forgotten; the store hook has already
/// checked either against the model. Anything else is a failure.
fn expected_lease_error(world: &World, what: &str, result: Result<(), ServiceError>) {
    match result {
        Ok(()) | Err(ServiceError::LeaseExpired(_) | ServiceError::TaskNotFound(_)) => {}
        Err(e) => fail(world, format!("{what}: {e}")),
    }
}

async fn ack(world: &mut World) {
    let Some(held) = take_held(world) else { return };
    world.note(format!("ack {} (lease {:?})", held.id, held.lease));
    let result = world.service().ack(&held.queue, held.id, held.lease).await;
    expected_lease_error(world, "ack", result);
}

async fn nack(world: &mut World) {
    let Some(held) = take_held(world) else { return };
    let delay_ms = world.rng.range(0, 3_000);
    world.note(format!(
        "nack {} (lease {:?}) for {delay_ms} ms",
        held.id, held.lease
    ));
    let before = world.now_ms();
    let result = world
        .service()
        .nack(&held.queue, held.id, held.lease, Some(delay_ms), None)
        .await;
    let after = world.now_ms();
    match result {
        // The consumer's delay is taken as given, from the server's clock at the call.
        Ok(NackResult::Retry { due_at_ms })
            if !(before + delay_ms..=after + delay_ms).contains(&due_at_ms) =>
        {
            fail(
                world,
                format!(
                    "nack for {delay_ms} ms between {before} and {after} is due at {due_at_ms}"
                ),
            );
        }
        other => expected_lease_error(world, "nack", other.map(|_| ())),
    }
}

async fn extend(world: &mut World) {
    let Some(held) = take_held(world) else { return };
    let visibility_ms = world.rng.range(1_000, 30_000);
    world.note(format!(
        "extend {} (lease {:?}) by {visibility_ms} ms",
        held.id, held.lease
    ));
    let result = world
        .service()
        .extend(&held.queue, held.id, held.lease, visibility_ms)
        .await;
    if result.is_ok() {
        world.held.push(held);
    }
    expected_lease_error(world, "extend", result.map(|_| ()));
}

/// Picks a task of the model, in any state (`dead_only`: a dead letter).
fn pick_task(world: &mut World, dead_only: bool) -> Option<(TaskId, belfry_core::QueueName)> {
    let candidates: Vec<_> = {
        let model = world.shared.model.lock();
        model
            .tasks
            .iter()
            .filter(|(_, t)| !dead_only || matches!(t.state, State::Dead(_)))
            .map(|(id, t)| (*id, t.queue.clone()))
            .collect()
    };
    world.rng.pick(&candidates).cloned()
}

async fn cancel(world: &mut World) {
    let Some((id, queue)) = pick_task(world, false) else {
        return;
    };
    world.note(format!("cancel {id}"));
    match world.service().cancel(&queue, id).await {
        // The store hook has checked the answer against the model's state.
        Ok(()) | Err(ServiceError::NotScheduled { .. } | ServiceError::TaskNotFound(_)) => {}
        Err(e) => fail(world, format!("cancel {id}: {e}")),
    }
}

async fn reschedule(world: &mut World) {
    let Some((id, queue)) = pick_task(world, false) else {
        return;
    };
    let now = world.now_ms();
    let due = match world.rng.below(3) {
        0 => now.saturating_sub(world.rng.range(1, 60_000)),
        1 => now + world.rng.range(1, 3_000),
        _ => now + world.rng.range(3_000, 300_000),
    };
    world.note(format!("reschedule {id} to {due}"));
    match world.service().reschedule(&queue, id, due).await {
        // The store hook has checked the answer against the model's state.
        Ok(_) | Err(ServiceError::NotScheduled { .. } | ServiceError::TaskNotFound(_)) => {}
        Err(e) => fail(world, format!("reschedule {id}: {e}")),
    }
}

async fn redrive(world: &mut World) {
    let Some((id, queue)) = pick_task(world, true) else {
        return;
    };
    world.note(format!("redrive {id}"));
    if let Err(e) = world.service().redrive(&queue, id).await {
        fail(world, format!("redrive of dead letter {id}: {e}"));
    }
}

async fn delete_dead(world: &mut World) {
    let Some((id, queue)) = pick_task(world, true) else {
        return;
    };
    world.note(format!("delete dead letter {id}"));
    if let Err(e) = world.service().delete_dead(&queue, id).await {
        fail(world, format!("delete of dead letter {id}: {e}"));
    }
}

/// Redrives or deletes a dead letter named twice (the repeat is reported, not done), or the
/// first few of its queue.
async fn settle_dead(world: &mut World) {
    let Some((id, queue)) = pick_task(world, true) else {
        return;
    };
    let action = if world.rng.chance(500) {
        DeadAction::Redrive
    } else {
        DeadAction::Discard
    };
    let by_id = world.rng.chance(500);
    let pick = if by_id {
        DeadPick::Ids(vec![id, id])
    } else {
        DeadPick::First(world.rng.range(1, 4) as usize)
    };
    world.note(format!("{action:?} dead letters {pick:?}"));
    match world.service().settle_dead(&queue, pick, action).await {
        Ok(settled) if by_id && (settled.done, settled.not_dead.len()) != (1, 1) => {
            fail(world, format!("{action:?} of {id} twice: {settled:?}"));
        }
        Ok(settled) if settled.done == 0 => {
            fail(
                world,
                format!("{action:?} of the first dead letters of {queue}: {settled:?}"),
            );
        }
        Ok(_) => {}
        Err(e) => fail(world, format!("{action:?} of dead letters: {e}")),
    }
}

fn step_clock(world: &mut World) {
    let size = if world.rng.chance(300) {
        world.rng.range(HOUR_MS, 3 * HOUR_MS)
    } else {
        world.rng.range(1_000, 120_000)
    } as i64;
    let back = world.rng.chance(500);
    world.note(format!(
        "the wall clock steps {} {size} ms",
        if back { "back" } else { "forward" }
    ));
    let mut model = world.shared.model.lock();
    // Stepped first, counted second: a claim between the two is only checked less.
    world.shared.clock.step(if back { -size } else { size });
    if back {
        model.back_steps += 1;
    }
    model.stats.clock_steps += 1;
}

/// No more faults; the clock moves past every due time and lease; consumers lease and ack
/// everything. Every task must reach a final state within the rounds: one that does not was
/// lost.
async fn drain(world: &mut World) {
    let latest = {
        let mut model = world.shared.model.lock();
        model.calm = true;
        model.latest_instant()
    };
    let now = world.now_ms();
    world.note("drain: faults off".into());
    if latest >= now {
        world.shared.clock.step((latest - now + 1) as i64);
    }
    world.held.clear();
    let pull: Vec<_> = world
        .queues
        .iter()
        .filter(|q| q.push_timeout_ms.is_none())
        .map(|q| q.name.clone())
        .collect();
    for _ in 0..DRAIN_ROUNDS {
        for queue in &pull {
            loop {
                let leased = world
                    .service()
                    .lease(queue, 50, 60_000, Duration::ZERO)
                    .await
                    .unwrap_or_else(|e| panic!("seed {}: drain lease: {e}", world.seed));
                if leased.is_empty() {
                    break;
                }
                for task in leased {
                    let result = world
                        .service()
                        .ack(queue, task.task.id, task.lease_id)
                        .await;
                    expected_lease_error(world, "drain ack", result);
                }
            }
        }
        if world.shared.model.lock().unfinished().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        world.check();
    }
    let unfinished: Vec<String> = world
        .shared
        .model
        .lock()
        .unfinished()
        .iter()
        .take(10)
        .map(|(id, t)| format!("{id} in {} ({:?}, due {})", t.queue, t.state, t.due))
        .collect();
    fail(
        world,
        format!("tasks never finished (lost): {unfinished:?}"),
    );
}

/// Every task's final state, read through the server and again from the reopened directory,
/// must be the model's (the store hook compares each read).
async fn verify(world: &mut World) {
    let tasks: Vec<_> = world
        .shared
        .model
        .lock()
        .tasks
        .iter()
        .map(|(id, t)| (*id, t.queue.clone()))
        .collect();
    for (id, queue) in &tasks {
        match world.service().get_task(queue, *id).await {
            Ok(_) => {}
            // A finished task may be forgotten; the hook has checked that this one was.
            Err(ServiceError::TaskNotFound(_)) => {
                world
                    .shared
                    .model
                    .lock()
                    .on_get(queue, *id, world.now_ms(), None)
            }
            Err(e) => fail(world, format!("read {id} after the drain: {e}")),
        }
    }
    world.check();
    let engine = world.stop_and_reopen().await;
    world.shared.model.lock().on_reopen();
    let now = world.now_ms();
    for (id, queue) in &tasks {
        let got = belfry_store::Store::get(&engine, queue, *id, now)
            .unwrap_or_else(|e| panic!("seed {}: read {id} after reopening: {e}", world.seed));
        world
            .shared
            .model
            .lock()
            .on_get(queue, *id, now, got.as_ref());
    }
}

/// Awaits `work` without letting paused time jump ahead meanwhile. Tokio holds its paused
/// clock while a blocking-pool task runs, but not while a thread of the server's own (the
/// submit coalescer's) works: a blocking task that lasts as long as `work` stands in for it,
/// so the wall clock does not move by whatever timer happens to be next.
async fn hold_time<T>(work: impl std::future::Future<Output = T>) -> T {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    });
    let result = work.await;
    drop(done);
    holder.await.expect("the time holder ends");
    result
}

fn fail(world: &World, what: String) {
    world.shared.model.lock().violations.push(what);
    world.check();
}
