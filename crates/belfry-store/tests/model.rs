//! Model-based test: random operation sequences with clock moves and reopens, run against the
//! engine and against `MemoryStore`; every observable result must match.
//!
//! Allowed difference (documented by the `Store` trait): the engine may forget finished (done
//! or cancelled) tasks, so `get` may return `None` where the model has a finished task, and
//! such a task's idempotency key may be reused. The generator never reuses the key of a
//! finished task, so both stores keep the same tasks.

use std::collections::HashMap;

use belfry_core::{LatePolicy, LeaseId, NewTask, Priority, QueueName, Task, TaskId, TaskState};
use belfry_store::{
    ClaimBatch, Engine, EngineOptions, FsyncPolicy, MemoryStore, MetaChange, PutOutcome, Store,
};
use bytes::Bytes;
use proptest::prelude::*;

const QUEUES: [&str; 2] = ["q0", "q1"];
const DAY_MS: u64 = 24 * 3_600_000;

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<(usize, i64, bool, Option<u8>, u8)>),
    Claim {
        queue: usize,
        max: usize,
        visibility: u64,
    },
    Ack(usize),
    /// One batch ack of the picked leases (those of the first pick's queue).
    AckMany(Vec<usize>),
    Nack(usize, u64),
    Extend(usize, u64),
    Dead(usize),
    Cancel(usize),
    Reschedule(usize, i64),
    Redrive(usize),
    /// A dead letter discarded, alone or twice in one `settle_dead`.
    Discard(usize, bool),
    Get(usize),
    GetByKey(usize, u8),
    Observe(usize),
    Advance(i64),
    /// Metadata changes in one `write_meta` (key, value or delete), on a few keys of two
    /// namespaces, then a comparison of both namespaces.
    WriteMeta(Vec<(u8, Option<u8>)>),
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let due = prop_oneof![
        8 => -2_000i64..6_000,
        1 => (40 * DAY_MS as i64)..(400 * DAY_MS as i64),
    ];
    let task = (
        0..2usize,
        due,
        any::<bool>(),
        proptest::option::weighted(0.3, 0..4u8),
        0..6u8,
    );
    prop_oneof![
        6 => proptest::collection::vec(task, 1..5).prop_map(Op::Put),
        5 => (0..2usize, 1..5usize, 100..3_000u64)
            .prop_map(|(queue, max, visibility)| Op::Claim { queue, max, visibility }),
        3 => any::<usize>().prop_map(Op::Ack),
        2 => proptest::collection::vec(any::<usize>(), 0..6).prop_map(Op::AckMany),
        2 => (any::<usize>(), 0..5_000u64).prop_map(|(i, d)| Op::Nack(i, d)),
        1 => (any::<usize>(), 0..5_000u64).prop_map(|(i, d)| Op::Extend(i, d)),
        1 => any::<usize>().prop_map(Op::Dead),
        2 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), -1_000i64..8_000).prop_map(|(i, d)| Op::Reschedule(i, d)),
        1 => any::<usize>().prop_map(Op::Redrive),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, twice)| Op::Discard(i, twice)),
        2 => any::<usize>().prop_map(Op::Get),
        1 => (0..2usize, 0..4u8).prop_map(|(q, k)| Op::GetByKey(q, k)),
        3 => (0..2usize).prop_map(Op::Observe),
        5 => prop_oneof![9 => 0..2_500i64, 1 => -1_000..0i64, 1 => Just(60 * DAY_MS as i64)]
            .prop_map(Op::Advance),
        2 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        2 => proptest::collection::vec((0..8u8, proptest::option::of(any::<u8>())), 0..6)
            .prop_map(Op::WriteMeta),
    ]
}

fn options() -> EngineOptions {
    // Small thresholds so checkpoints, buffer flushes and unloads happen inside short runs.
    EngineOptions {
        fsync: FsyncPolicy::Never,
        checkpoint_wal_bytes: 4 * 1024,
        lookahead_ms: 1_000,
        unload_distance_ms: 5_000,
        far_loaded_tasks_max: 3,
        bucket_buffer_bytes: 128,
        buffers_total_bytes: 1024,
        ..EngineOptions::default()
    }
}

struct World {
    dir: tempfile::TempDir,
    engine: Option<Engine>,
    model: MemoryStore,
    now: u64,
    max_now: u64,
    /// (model id, engine id, queue) of every created task.
    ids: Vec<(TaskId, TaskId, usize)>,
    to_model: HashMap<TaskId, TaskId>,
    /// (model lease, engine lease, task index) of every lease handed out.
    leases: Vec<(LeaseId, LeaseId, usize)>,
    /// Whether the engine was reopened: expiry writes nothing, so a reopened engine ends
    /// (and counts in `ClaimBatch::leases_expired`) again a lease that ran out before, was
    /// reported, and was not leased again; from then on only the leases are compared.
    reopened: bool,
}

fn qn(i: usize) -> QueueName {
    QueueName::new(QUEUES[i]).unwrap()
}

fn shift(now: u64, delta: i64) -> u64 {
    now.saturating_add_signed(delta)
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), options()).unwrap();
        let model = MemoryStore::new();
        for i in 0..QUEUES.len() {
            engine.put_queue(&qn(i), Bytes::new()).unwrap();
            model.put_queue(&qn(i), Bytes::new()).unwrap();
        }
        World {
            dir,
            engine: Some(engine),
            model,
            now: 1_000_000,
            max_now: 1_000_000,
            ids: Vec::new(),
            to_model: HashMap::new(),
            leases: Vec::new(),
            reopened: false,
        }
    }

    fn compare_meta(&self) -> Result<(), TestCaseError> {
        for namespace in ["even", "odd"] {
            prop_assert_eq!(
                self.model.list_meta(namespace).unwrap(),
                self.engine().list_meta(namespace).unwrap()
            );
        }
        Ok(())
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    /// The engine's task as the model would show it (model ids).
    fn translate(&self, mut task: Task) -> Task {
        task.id = self.to_model[&task.id];
        task
    }

    fn translate_batch(&self, batch: ClaimBatch) -> ClaimBatch {
        ClaimBatch {
            leased: batch
                .leased
                .into_iter()
                .map(|mut l| {
                    l.task = self.translate(l.task);
                    l
                })
                .collect(),
            late_skipped: batch
                .late_skipped
                .iter()
                .map(|id| self.to_model[id])
                .collect(),
            late_dead: batch.late_dead.iter().map(|id| self.to_model[id]).collect(),
            leases_expired: batch.leases_expired,
        }
    }

    fn check_get(&self, model: Option<Task>, engine: Option<Task>) -> Result<(), TestCaseError> {
        match (model, engine) {
            (Some(m), None) => prop_assert!(
                matches!(
                    m.state,
                    TaskState::Done | TaskState::Cancelled | TaskState::Skipped
                ),
                "engine lost a {:?} task",
                m.state
            ),
            (m, e) => prop_assert_eq!(m, e.map(|t| self.translate(t))),
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        match op {
            Op::Put(tasks) => {
                let mut batch = Vec::new();
                for (queue, due, high, key, late) in tasks {
                    let mut t = NewTask::new(
                        qn(*queue),
                        shift(now, *due),
                        Bytes::from(format!("p{}", self.ids.len() + batch.len())),
                    );
                    if *high {
                        t.priority = Priority::High;
                    }
                    t.late_policy = match late {
                        0 => LatePolicy::Skip { after_ms: 1_000 },
                        1 => LatePolicy::Dead { after_ms: 1_000 },
                        _ => LatePolicy::Fire,
                    };
                    if let Some(k) = key {
                        let key = format!("k{k}");
                        // Never reuse the key of a finished task (allowed to differ). Both
                        // stores are asked, as a lookup with `now` also ends expired leases.
                        let m = self.model.get_by_key(&qn(*queue), &key, now).unwrap();
                        let e = self.engine().get_by_key(&qn(*queue), &key, now).unwrap();
                        let finished = m.as_ref().is_some_and(|t| {
                            matches!(
                                t.state,
                                TaskState::Done | TaskState::Cancelled | TaskState::Skipped
                            )
                        });
                        self.check_get(m, e)?;
                        if !finished {
                            t.idempotency_key = Some(key);
                        }
                    }
                    batch.push(t);
                }
                let m = self.model.put(batch.clone()).unwrap();
                let e = self.engine().put(batch.clone()).unwrap();
                prop_assert_eq!(m.len(), e.len());
                for ((mo, eo), task) in m.into_iter().zip(e).zip(&batch) {
                    match (mo, eo) {
                        (
                            PutOutcome::Created {
                                id: mid,
                                due_at_ms: md,
                            },
                            PutOutcome::Created {
                                id: eid,
                                due_at_ms: ed,
                            },
                        ) => {
                            prop_assert_eq!(md, ed);
                            let queue = QUEUES
                                .iter()
                                .position(|q| *q == task.queue.as_str())
                                .unwrap();
                            self.ids.push((mid, eid, queue));
                            self.to_model.insert(eid, mid);
                        }
                        (PutOutcome::Duplicate(mt), PutOutcome::Duplicate(et)) => {
                            prop_assert_eq!(*mt, self.translate(*et));
                        }
                        (mo, eo) => {
                            prop_assert!(false, "put outcomes differ: {:?} vs {:?}", mo, eo)
                        }
                    }
                }
            }
            Op::Claim {
                queue,
                max,
                visibility,
            } => {
                let m = self
                    .model
                    .claim(&qn(*queue), now, *max, *visibility)
                    .unwrap();
                let e = self
                    .engine()
                    .claim(&qn(*queue), now, *max, *visibility)
                    .unwrap();
                let e = self.translate_batch(e);
                let model_leases: Vec<LeaseId> = m.leased.iter().map(|l| l.lease_id).collect();
                let engine_leases: Vec<LeaseId> = e.leased.iter().map(|l| l.lease_id).collect();
                let reopened = self.reopened;
                let strip = |mut b: ClaimBatch| {
                    for l in &mut b.leased {
                        l.lease_id = LeaseId(0);
                    }
                    if reopened {
                        b.leases_expired = 0;
                    }
                    b
                };
                for (i, l) in m.leased.iter().enumerate() {
                    prop_assert!(l.task.due_at_ms <= now, "claimed early");
                    let index = self
                        .ids
                        .iter()
                        .position(|(mid, _, _)| *mid == l.task.id)
                        .unwrap();
                    self.leases.push((
                        model_leases[i],
                        engine_leases.get(i).copied().unwrap_or(LeaseId(0)),
                        index,
                    ));
                }
                prop_assert_eq!(strip(m), strip(e));
            }
            Op::AckMany(picks) => {
                let Some(first) = picks.first() else {
                    return Ok(());
                };
                if self.leases.is_empty() {
                    return Ok(());
                }
                let pick = |i: usize| self.leases[i % self.leases.len()];
                let queue = self.ids[pick(*first).2].2;
                let (mut macks, mut eacks, mut mids) = (Vec::new(), Vec::new(), Vec::new());
                for &i in picks {
                    let (ml, el, index) = pick(i);
                    let (mid, eid, q) = self.ids[index];
                    if q == queue {
                        macks.push((mid, ml));
                        eacks.push((eid, el));
                        mids.push(mid);
                    }
                }
                let q = qn(queue);
                let m = self.model.ack_many(&q, &macks, now).unwrap();
                let e = self.engine().ack_many(&q, &eacks, now).unwrap();
                prop_assert_eq!(m.len(), e.len());
                for ((m, e), mid) in m.into_iter().zip(e).zip(mids) {
                    let model_state = self.model.get(&q, mid, now).unwrap().map(|t| t.state);
                    if e == belfry_store::LeaseOutcome::NotFound
                        && matches!(
                            model_state,
                            Some(TaskState::Done | TaskState::Cancelled | TaskState::Skipped)
                        )
                    {
                        continue;
                    }
                    prop_assert_eq!(m, e);
                }
            }
            Op::Ack(i) | Op::Dead(i) | Op::Nack(i, _) | Op::Extend(i, _) => {
                if self.leases.is_empty() {
                    return Ok(());
                }
                let (ml, el, index) = self.leases[i % self.leases.len()];
                let (mid, eid, queue) = self.ids[index];
                let q = qn(queue);
                let (m, e) = match op {
                    Op::Ack(_) => (
                        self.model.ack(&q, mid, ml, now).unwrap(),
                        self.engine().ack(&q, eid, el, now).unwrap(),
                    ),
                    Op::Dead(_) => (
                        self.model.dead_letter(&q, mid, ml, "why", now).unwrap(),
                        self.engine().dead_letter(&q, eid, el, "why", now).unwrap(),
                    ),
                    Op::Nack(_, d) => (
                        self.model.nack(&q, mid, ml, now + d, now).unwrap(),
                        self.engine().nack(&q, eid, el, now + d, now).unwrap(),
                    ),
                    Op::Extend(_, d) => (
                        self.model.extend(&q, mid, ml, now + d, now).unwrap(),
                        self.engine().extend(&q, eid, el, now + d, now).unwrap(),
                    ),
                    _ => unreachable!(),
                };
                let model_state = self.model.get(&q, mid, now).unwrap().map(|t| t.state);
                if e == belfry_store::LeaseOutcome::NotFound
                    && matches!(
                        model_state,
                        Some(TaskState::Done | TaskState::Cancelled | TaskState::Skipped)
                    )
                {
                    return Ok(());
                }
                prop_assert_eq!(m, e);
            }
            Op::Cancel(i) | Op::Reschedule(i, _) | Op::Redrive(i) | Op::Discard(i, _) => {
                if self.ids.is_empty() {
                    return Ok(());
                }
                let (mid, eid, queue) = self.ids[i % self.ids.len()];
                let q = qn(queue);
                let (m, e) = match op {
                    Op::Cancel(_) => (
                        self.model.cancel(&q, mid, now).unwrap(),
                        self.engine().cancel(&q, eid, now).unwrap(),
                    ),
                    Op::Reschedule(_, d) => (
                        self.model.reschedule(&q, mid, shift(now, *d), now).unwrap(),
                        self.engine()
                            .reschedule(&q, eid, shift(now, *d), now)
                            .unwrap(),
                    ),
                    Op::Redrive(_) => (
                        self.model.redrive(&q, mid, now).unwrap(),
                        self.engine().redrive(&q, eid, now).unwrap(),
                    ),
                    Op::Discard(_, false) => (
                        self.model.discard_dead(&q, mid, now).unwrap(),
                        self.engine().discard_dead(&q, eid, now).unwrap(),
                    ),
                    Op::Discard(_, true) => {
                        let (action, twice) = (belfry_store::DeadAction::Discard, [eid, eid]);
                        let m = self.model.discard_dead(&q, mid, now).unwrap();
                        let e = self.engine().settle_dead(&q, &twice, action, now).unwrap();
                        let again = self.model.discard_dead(&q, mid, now).unwrap();
                        // (A forgotten finished task is NotFound in the engine, twice.)
                        if e[0] != belfry_store::ChangeOutcome::NotFound {
                            prop_assert_eq!(again, e[1]);
                        }
                        (m, e[0])
                    }
                    _ => unreachable!(),
                };
                // A forgotten finished task is NotFound in the engine.
                let model_state = self.model.get(&q, mid, now).unwrap().map(|t| t.state);
                if e == belfry_store::ChangeOutcome::NotFound
                    && matches!(
                        model_state,
                        Some(TaskState::Done | TaskState::Cancelled | TaskState::Skipped)
                    )
                {
                    return Ok(());
                }
                prop_assert_eq!(m, e);
            }
            Op::Get(i) => {
                if self.ids.is_empty() {
                    return Ok(());
                }
                let (mid, eid, queue) = self.ids[i % self.ids.len()];
                let m = self.model.get(&qn(queue), mid, now).unwrap();
                let e = self.engine().get(&qn(queue), eid, now).unwrap();
                self.check_get(m, e)?;
            }
            Op::GetByKey(queue, k) => {
                let key = format!("k{k}");
                let m = self.model.get_by_key(&qn(*queue), &key, now).unwrap();
                let e = self.engine().get_by_key(&qn(*queue), &key, now).unwrap();
                self.check_get(m, e)?;
            }
            Op::Observe(queue) => {
                let q = qn(*queue);
                prop_assert_eq!(
                    self.model.counts(&q, now).unwrap(),
                    self.engine().counts(&q, now).unwrap()
                );
                prop_assert_eq!(
                    self.model.next_due_ms(&q).unwrap(),
                    self.engine().next_due_ms(&q).unwrap()
                );
                prop_assert_eq!(
                    self.model.forecast(&q, now, 700, 12).unwrap(),
                    self.engine().forecast(&q, now, 700, 12).unwrap()
                );
                prop_assert_eq!(
                    self.model.forecast(&q, now, 30 * DAY_MS, 15).unwrap(),
                    self.engine().forecast(&q, now, 30 * DAY_MS, 15).unwrap()
                );
                let m = self.model.list_dead(&q, None, 1_000).unwrap();
                let e: Vec<Task> = self
                    .engine()
                    .list_dead(&q, None, 1_000)
                    .unwrap()
                    .into_iter()
                    .map(|t| self.translate(t))
                    .collect();
                prop_assert_eq!(m, e);
            }
            Op::WriteMeta(changes) => {
                let changes: Vec<MetaChange> = changes
                    .iter()
                    .map(|&(key, value)| {
                        let namespace = if key % 2 == 0 { "even" } else { "odd" };
                        let key = format!("k{}", key / 2);
                        match value {
                            Some(v) => MetaChange::put(namespace, &key, Bytes::from(vec![v])),
                            None => MetaChange::delete(namespace, &key),
                        }
                    })
                    .collect();
                self.model.write_meta(changes.clone()).unwrap();
                self.engine().write_meta(changes).unwrap();
                self.compare_meta()?;
            }
            Op::Advance(delta) => {
                self.now = shift(self.now, *delta);
                self.max_now = self.max_now.max(self.now);
            }
            Op::Reopen { clean } => {
                // Known limitation: a lease ended only by the clock (nothing written) is in
                // force again after a restart if the clock is then before its deadline. So
                // the restarted clock starts at the latest time seen, as real clocks do
                // unless they jump back across a restart.
                self.now = self.now.max(self.max_now);
                let engine = self.engine.take().unwrap();
                if *clean {
                    engine.flush().unwrap();
                    drop(engine);
                } else {
                    // As after `kill -9`: no checkpoint, no final fsync.
                    engine.abandon();
                }
                self.engine = Some(Engine::open(self.dir.path(), options()).unwrap());
                self.reopened = true;
                self.compare_meta()?;
                // ...and the first thing a restarted server does is look at its queues with
                // the current time, which ends those leases again in both stores.
                for queue in 0..QUEUES.len() {
                    prop_assert_eq!(
                        self.model.counts(&qn(queue), self.now).unwrap(),
                        self.engine().counts(&qn(queue), self.now).unwrap()
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Modest by default so CI stays fast; MODEL_CASES=2000 for a deeper search.
        cases: std::env::var("MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let mut world = World::new();
        for op in &ops {
            world.step(op)?;
        }
        // Final full comparison after a crash-style reopen.
        world.step(&Op::Reopen { clean: false })?;
        for queue in 0..QUEUES.len() {
            world.step(&Op::Observe(queue))?;
        }
        for i in 0..world.ids.len() {
            world.step(&Op::Get(i))?;
        }
    }
}
