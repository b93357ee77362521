//! What the simulation expects of every task, kept from the store calls the server makes and
//! the sink calls the dispatcher makes, and checked against each of them as it happens.
//!
//! The store wrapper calls the `on_*` hooks with the store's answer while it still holds its
//! lock, so the model sees the calls in the order they took effect.
//!
//! Lease expiry follows the store's contract: a lease ends when a call on its queue passes a
//! `now_ms` at or past its deadline (the task is then scheduled again, due as before), and
//! stays ended if the wall clock later steps back — but that end is not written anywhere, so
//! after a crash the lease holds again until its deadline. A broken expectation is
//! written down as a violation (a panic on the store's thread would only turn into a server
//! error); the driver fails the run on the first one, with the seed.

use std::collections::{BTreeMap, HashMap};

use belfry_core::{LeaseId, LeasedTask, NewTask, QueueName, Task, TaskId, TaskState, UnixMs};
use belfry_sinks::Outcome;
use belfry_store::{ChangeOutcome, ClaimBatch, LeaseOutcome, PutOutcome};

/// A queue as the simulation configured it.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    pub name: QueueName,
    /// A push queue delivers through the simulated sink (its timeout), else it is pulled.
    pub push_timeout_ms: Option<u64>,
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Tasks per second the queue's rate limit lets out (0: no limit).
    pub rate_per_s: u64,
    /// Tasks leased at once at most (0: no limit).
    pub max_in_flight: u32,
}

/// A task's state as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Scheduled,
    Leased {
        lease: LeaseId,
        until: UnixMs,
        attempt: u32,
    },
    /// Scheduled again because a call saw the lease's deadline pass; only in the store's
    /// memory, so a restart makes it `Leased` again.
    Expired {
        lease: LeaseId,
        until: UnixMs,
        attempt: u32,
    },
    Done,
    Dead(String),
    Cancelled,
}

impl State {
    pub fn is_final(&self) -> bool {
        matches!(self, State::Done | State::Dead(_) | State::Cancelled)
    }

    /// The state the store reports for this one.
    pub fn task_state(&self) -> TaskState {
        match self {
            State::Scheduled | State::Expired { .. } => TaskState::Scheduled,
            State::Leased { .. } => TaskState::Leased,
            State::Done => TaskState::Done,
            State::Dead(_) => TaskState::Dead,
            State::Cancelled => TaskState::Cancelled,
        }
    }
}

/// One time a claim handed the task out.
#[derive(Debug, Clone)]
pub(super) struct Handout {
    pub(super) lease: LeaseId,
    pub(super) attempt: u32,
    /// The backward clock steps so far: a delivery after another step may see a clock that
    /// reads before the due time the claim saw passed.
    pub(super) epoch: u64,
    pub(super) delivered: bool,
}

/// What the sink answered for one lease.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub(super) outcome: Outcome,
    pub(super) at_ms: UnixMs,
    pub(super) epoch: u64,
}

#[derive(Debug, Clone)]
pub struct TaskModel {
    pub queue: QueueName,
    /// The due time the client asked for: nothing may hand the task out before it.
    pub original_due: UnixMs,
    /// The due time now (a retry or a redrive moves it).
    pub due: UnixMs,
    pub state: State,
    pub attempts: u32,
    pub(super) handouts: Vec<Handout>,
    pub(super) answers: HashMap<LeaseId, Answer>,
}

impl TaskModel {
    /// Claimable at `now_ms`, once the claim's queue has seen that time (`Model::observe`).
    fn claimable(&self, now_ms: UnixMs) -> bool {
        matches!(self.state, State::Scheduled | State::Expired { .. }) && self.due <= now_ms
    }
}

/// Counts for the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub submitted: u64,
    pub handouts: u64,
    /// Leases that ran out before their task was acked, nacked or dead-lettered.
    pub lease_expiries: u64,
    /// Hand-outs of a task whose previous lease had run out (at-least-once at work).
    pub expired_reclaims: u64,
    pub deliveries: u64,
    pub acks: u64,
    pub retries: u64,
    pub dead: u64,
    pub crashes: u64,
    pub clock_steps: u64,
    /// Submits answered as duplicates of a task with the same idempotency key.
    pub duplicates: u64,
    /// Cancels, reschedules and redrives the store carried out.
    pub changes: u64,
}

/// A change of a task that holds no lease.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Cancel,
    Reschedule {
        due_at_ms: UnixMs,
    },
    Redrive,
    /// A dead letter discarded: it finishes as cancelled.
    Discard,
}

/// The change a lease call asks for.
#[derive(Debug, Clone, Copy)]
pub enum LeaseCall<'a> {
    Ack,
    Nack {
        at_ms: UnixMs,
    },
    Extend {
        until_ms: UnixMs,
    },
    Dead {
        reason: &'a str,
    },
    /// A dead letter by the claim that found the task out of attempts: its attempt is taken
    /// back.
    DeadUntried {
        reason: &'a str,
    },
}

#[derive(Default)]
pub struct Model {
    pub queues: HashMap<QueueName, QueueSpec>,
    /// In id order, so iterating is deterministic.
    pub tasks: BTreeMap<TaskId, TaskModel>,
    /// Idempotency keys, by queue name and key: the task first submitted with each.
    pub keys: BTreeMap<(String, String), TaskId>,
    pub violations: Vec<String>,
    /// Backward clock steps so far.
    pub back_steps: u64,
    /// No more faults: the drain at the end.
    pub calm: bool,
    pub stats: Stats,
}

impl Model {
    pub(super) fn violation(&mut self, message: String) {
        self.violations.push(message);
    }

    /// A call on `queue` passed `now_ms`: leases whose deadline it reached end (and stay
    /// ended if the clock steps back).
    pub fn observe(&mut self, queue: &QueueName, now_ms: UnixMs) {
        for task in self.tasks.values_mut().filter(|t| &t.queue == queue) {
            if let State::Leased {
                lease,
                until,
                attempt,
            } = task.state
            {
                if until <= now_ms {
                    task.state = State::Expired {
                        lease,
                        until,
                        attempt,
                    };
                    self.stats.lease_expiries += 1;
                }
            }
        }
    }

    /// The store was reopened: expiries it only held in memory are undone.
    pub fn on_reopen(&mut self) {
        for task in self.tasks.values_mut() {
            if let State::Expired {
                lease,
                until,
                attempt,
            } = task.state
            {
                task.state = State::Leased {
                    lease,
                    until,
                    attempt,
                };
            }
        }
    }

    pub fn on_put(&mut self, tasks: &[NewTask], outcomes: &[PutOutcome]) {
        if tasks.len() != outcomes.len() {
            self.violation(format!(
                "put of {} tasks answered {} outcomes",
                tasks.len(),
                outcomes.len()
            ));
        }
        for (task, outcome) in tasks.iter().zip(outcomes) {
            let key = task
                .idempotency_key
                .as_ref()
                .map(|k| (task.queue.as_str().to_owned(), k.clone()));
            let first = key.as_ref().and_then(|k| self.keys.get(k)).copied();
            let (id, due_at_ms) = match (outcome, first) {
                (PutOutcome::Duplicate(got), Some(first)) if got.id == first => {
                    self.stats.duplicates += 1;
                    continue;
                }
                (PutOutcome::Duplicate(got), _) => {
                    self.violation(format!(
                        "put with key {key:?}: a duplicate of {}, the model knows {first:?}",
                        got.id
                    ));
                    continue;
                }
                (PutOutcome::Created { id, due_at_ms }, _) => (*id, *due_at_ms),
            };
            // A key is known for its task's lifetime; a finished task may be forgotten.
            if let Some(first) = first {
                let state = &self.tasks[&first].state;
                if !matches!(state, State::Done | State::Cancelled) {
                    self.violation(format!(
                        "put {id} with the key {key:?} of {first}, which is {state:?}"
                    ));
                }
            }
            if let Some(key) = key {
                self.keys.insert(key, id);
            }
            self.create(task, id, due_at_ms);
        }
    }

    /// A task the store created.
    fn create(&mut self, task: &NewTask, id: TaskId, due_at_ms: UnixMs) {
        if due_at_ms != task.due_at_ms || self.tasks.contains_key(&id) {
            self.violation(format!(
                "put {id}: due {due_at_ms} (asked {}), or the id was used before",
                task.due_at_ms
            ));
        }
        self.stats.submitted += 1;
        self.tasks.insert(
            id,
            TaskModel {
                queue: task.queue.clone(),
                original_due: task.due_at_ms,
                due: task.due_at_ms,
                state: State::Scheduled,
                attempts: 0,
                handouts: Vec::new(),
                answers: HashMap::new(),
            },
        );
    }

    /// A claim: it must hand out exactly the claimable tasks it had room for — none early,
    /// none under a live lease, none finished — and miss none. `clock_ms` is the clock as the
    /// call ends: below `now_ms`, the clock stepped back after the server read it.
    pub fn on_claim(
        &mut self,
        queue: &QueueName,
        (now_ms, clock_ms): (UnixMs, UnixMs),
        max: usize,
        visibility_ms: u64,
        batch: &ClaimBatch,
    ) {
        self.observe(queue, now_ms);
        let claimable: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| &t.queue == queue && t.claimable(now_ms))
            .map(|(id, _)| *id)
            .collect();
        if !batch.late_skipped.is_empty() || !batch.late_dead.is_empty() {
            self.violation(format!(
                "claim of {queue} applied a late policy no task has"
            ));
        }
        let expected = max.min(claimable.len());
        if batch.leased.len() != expected {
            let missed: Vec<_> = claimable
                .iter()
                .filter(|id| !batch.leased.iter().any(|l| l.task.id == **id))
                .take(5)
                .collect();
            self.violation(format!(
                "claim of {queue} at {now_ms} (max {max}) handed out {} tasks, {} were claimable (not handed out: {missed:?})",
                batch.leased.len(),
                claimable.len()
            ));
        }
        // A step back between the server's reading and now is one the deliveries of this
        // claim may see: count it as after the claim.
        let epoch = self.back_steps.saturating_sub(u64::from(clock_ms < now_ms));
        for leased in &batch.leased {
            let id = leased.task.id;
            let problems = self.hand_out(leased, now_ms, visibility_ms, epoch, &claimable);
            for problem in problems {
                self.violation(format!("claim of {queue} handed out {id}: {problem}"));
            }
        }
    }

    /// One task a claim handed out: checked, then leased in the model. Returns what is wrong
    /// with it.
    fn hand_out(
        &mut self,
        leased: &LeasedTask,
        now_ms: UnixMs,
        visibility_ms: u64,
        epoch: u64,
        claimable: &[TaskId],
    ) -> Vec<String> {
        let id = leased.task.id;
        let Some(task) = self.tasks.get_mut(&id) else {
            return vec!["an unknown task".into()];
        };
        let mut problems = Vec::new();
        if !claimable.contains(&id) {
            problems.push(format!(
                "not claimable at {now_ms}: {:?}, due {}",
                task.state, task.due
            ));
        }
        // The asked due time binds the first hand-out; later ones follow the due time a
        // retry or redrive set (after a backward clock step, it may be before the first).
        if task.handouts.is_empty() && task.original_due > now_ms {
            problems.push(format!("early: asked due {}", task.original_due));
        }
        if leased.task.attempts != task.attempts + 1 || leased.task.due_at_ms != task.due {
            problems.push(format!(
                "attempt {} due {} (model: attempt {} due {})",
                leased.task.attempts,
                leased.task.due_at_ms,
                task.attempts + 1,
                task.due
            ));
        }
        if leased.lease_until_ms != now_ms.saturating_add(visibility_ms) {
            problems.push(format!("lease until {}", leased.lease_until_ms));
        }
        if matches!(task.state, State::Expired { .. }) {
            self.stats.expired_reclaims += 1;
        }
        task.attempts += 1;
        task.state = State::Leased {
            lease: leased.lease_id,
            until: leased.lease_until_ms,
            attempt: task.attempts,
        };
        task.handouts.push(Handout {
            lease: leased.lease_id,
            attempt: task.attempts,
            epoch,
            delivered: false,
        });
        self.stats.handouts += 1;
        problems
    }

    /// Ack, nack, extend or dead letter: the store's answer must be the model's, and a change
    /// the server makes must follow from what the sink (or the consumer) said.
    pub fn on_lease_call(
        &mut self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
        call: LeaseCall<'_>,
        outcome: LeaseOutcome,
    ) {
        self.observe(queue, now_ms);
        let Some(task) = self.tasks.get(&id) else {
            if outcome != LeaseOutcome::NotFound {
                self.violation(format!(
                    "{call:?} of unknown task {id} answered {outcome:?}"
                ));
            }
            return;
        };
        let predicted = match task.state {
            State::Leased { lease: current, .. } if current == lease => LeaseOutcome::Ok,
            _ => LeaseOutcome::LeaseExpired,
        };
        // A finished task may be forgotten (its bucket's file deleted).
        let forgotten = outcome == LeaseOutcome::NotFound
            && matches!(task.state, State::Done | State::Cancelled);
        if predicted != outcome && !forgotten {
            self.violation(format!(
                "{call:?} of {id} in {queue} under lease {lease:?} at {now_ms}: the store answered {outcome:?}, the model expects {predicted:?} (state {:?})",
                task.state
            ));
            return;
        }
        if outcome != LeaseOutcome::Ok {
            return;
        }
        let State::Leased { attempt, .. } = task.state else {
            return;
        };
        if let Err(problem) = self.justify(id, lease, attempt, call) {
            self.violation(format!(
                "{call:?} of {id} in {queue} (attempt {attempt}): {problem}"
            ));
        }
        let task = self.tasks.get_mut(&id).expect("checked above");
        match call {
            LeaseCall::Ack => {
                task.state = State::Done;
                self.stats.acks += 1;
            }
            LeaseCall::Nack { at_ms } => {
                task.state = State::Scheduled;
                task.due = at_ms;
                self.stats.retries += 1;
            }
            LeaseCall::Extend { until_ms } => {
                task.state = State::Leased {
                    lease,
                    until: until_ms,
                    attempt,
                };
            }
            LeaseCall::Dead { reason } => {
                task.state = State::Dead(reason.to_owned());
                self.stats.dead += 1;
            }
            LeaseCall::DeadUntried { reason } => {
                task.state = State::Dead(reason.to_owned());
                task.attempts -= 1;
                self.stats.dead += 1;
            }
        }
    }

    /// A read: what the store reports must be what the model holds.
    pub fn on_get(&mut self, queue: &QueueName, id: TaskId, now_ms: UnixMs, got: Option<&Task>) {
        self.observe(queue, now_ms);
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let Some(got) = got else {
            // A finished task may be forgotten (a drained bucket's file is deleted); a task
            // that may still be delivered, or a dead letter, may not.
            if !matches!(task.state, State::Done | State::Cancelled) {
                self.violation(format!("get {id}: the store lost it ({:?})", task.state));
            }
            return;
        };
        let state = task.state.task_state();
        let reason = match &task.state {
            State::Dead(reason) => Some(reason.as_str()),
            _ => None,
        };
        if got.state != state
            || got.dead_reason.as_deref() != reason
            || got.attempts != task.attempts
            || got.due_at_ms != task.due
        {
            self.violation(format!(
                "get {id} at {now_ms}: the store has {:?} attempt {} due {} ({:?}), the model {:?} attempt {} due {}",
                got.state, got.attempts, got.due_at_ms, got.dead_reason, task.state, task.attempts, task.due
            ));
        }
    }

    /// Cancel, reschedule or redrive.
    pub fn on_change(
        &mut self,
        queue: &QueueName,
        id: TaskId,
        now_ms: UnixMs,
        change: Change,
        outcome: ChangeOutcome,
    ) {
        self.observe(queue, now_ms);
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        let seen = task.state.clone();
        let allowed = match change {
            Change::Redrive | Change::Discard => matches!(seen, State::Dead(_)),
            _ => matches!(seen, State::Scheduled | State::Expired { .. }),
        };
        let fits = match outcome {
            ChangeOutcome::Ok => allowed,
            // A finished task may be forgotten (its bucket's file deleted), nothing else.
            ChangeOutcome::NotFound => matches!(seen, State::Done | State::Cancelled),
            ChangeOutcome::WrongState(state) => !allowed && state == seen.task_state(),
        };
        if !fits {
            let message = format!(
                "{change:?} {id} at {now_ms}: the store answered {outcome:?}, the model holds {seen:?}"
            );
            self.violation(message);
            return;
        }
        if outcome != ChangeOutcome::Ok {
            return;
        }
        self.stats.changes += 1;
        match change {
            Change::Redrive => {
                task.state = State::Scheduled;
                task.due = now_ms;
                task.attempts = 0;
            }
            Change::Reschedule { due_at_ms } => {
                task.state = State::Scheduled;
                task.due = due_at_ms;
                // Never early now means never before the new due time.
                if task.handouts.is_empty() {
                    task.original_due = due_at_ms;
                }
            }
            Change::Cancel | Change::Discard => task.state = State::Cancelled,
        }
    }

    /// `Store::next_due_ms`: the dispatcher sleeps until it (at most a second), so it must
    /// not be later than the earliest due time or lease end of the queue.
    pub fn on_next_due(&mut self, queue: &QueueName, got: Option<UnixMs>) {
        let earliest = self
            .tasks
            .values()
            .filter(|t| &t.queue == queue)
            .filter_map(|t| match t.state {
                State::Scheduled | State::Expired { .. } => Some(t.due),
                State::Leased { until, .. } => Some(until),
                _ => None,
            })
            .min();
        let fine = match (earliest, got) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(earliest), Some(got)) => got <= earliest,
        };
        if !fine {
            self.violation(format!(
                "next due of {queue}: the store says {got:?}, a task or lease is due at {earliest:?}"
            ));
        }
    }

    /// Tasks not yet in a final state.
    pub fn unfinished(&self) -> Vec<(TaskId, &TaskModel)> {
        self.tasks
            .iter()
            .filter(|(_, t)| !t.state.is_final())
            .map(|(id, t)| (*id, t))
            .collect()
    }

    /// The latest instant any task or lease waits for.
    pub fn latest_instant(&self) -> UnixMs {
        self.tasks
            .values()
            .map(|t| match t.state {
                State::Leased { until, .. } => until.max(t.due),
                _ => t.due,
            })
            .max()
            .unwrap_or(0)
    }
}
