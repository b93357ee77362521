//! The contract between the server and a storage backend.
//!
//! All methods are synchronous and may block on disk or network I/O: async callers run them on
//! a blocking thread. Time is always passed in (`now_ms`, wall clock): a store never reads a
//! clock, which keeps it deterministic under test and lets the caller guarantee that no task is
//! handed out before it is due.
//!
//! Durability: when a mutating call returns `Ok`, its effect survives a crash of the process.
//! *Durable changes* (`put`, `cancel`, `reschedule`, `redrive`, queue and meta changes) also
//! survive a crash of the machine under the engine's default fsync policy. *Delivery state*
//! (`claim`, `ack`, `nack`, `extend`, `dead_letter`) need not: a store may return before it is
//! on stable storage, as long as losing it in a machine crash leaves the task as an earlier
//! whole state had it (scheduled and due, or leased and due again when that lease ends). The
//! task is then delivered again, which at-least-once delivery allows; it is never lost, and a
//! durable change made after a delivery call is never kept while that delivery call is lost.
//! The embedded engine makes such records durable within a short bounded delay
//! (`EngineOptions::delivery_sync_delay`) or, with `EngineOptions::sync_delivery`, before
//! returning. See `docs/storage-format.md`, "Durability of delivery state".

use std::io;
use std::path::{Path, PathBuf};

use belfry_core::{
    LeaseId, LeasedTask, NewTask, QueueName, Task, TaskId, TaskState, UnixMs, UserId, UserPage,
};
use bytes::Bytes;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Operating errors of a store. Expected outcomes (nothing due, stale lease) are not errors:
/// they are the `*Outcome` enums below.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("I/O error while trying to {context}{}: {source}", on_path(.path.as_deref()))]
    Io {
        context: &'static str,
        /// The file or directory the operation was on, when there is one: an operator needs
        /// it to fix a permission or a disk, and the context alone cannot tell `meta` from
        /// `checkpoint` or one bucket file from another.
        path: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    #[error("corrupt data in {location}: {detail}")]
    Corrupt { location: String, detail: String },
    #[error("the store stopped after a fatal error and must be reopened: {0}")]
    Poisoned(String),
    #[error("the store is closed")]
    Closed,
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A networked store could not be reached in time, or answered that it cannot serve
    /// now (a failover, a paused or loading server). Transient: the same call may succeed
    /// later. A change that failed this way may or may not have taken effect, so retrying
    /// is safe for calls that are idempotent (puts with an idempotency key, acks, reads).
    #[error("the store is unavailable for now ({detail}); retry shortly")]
    Unavailable { detail: String },
    /// Another live store (in this process or another) has the data directory open.
    #[error("data directory {dir} is in use by another belfry process (lock file {lock})")]
    InUse { dir: String, lock: String },
    /// The data directory holds files that are not belfry's. The engine owns its directory
    /// outright (it removes files it does not know), so it refuses one that is not empty and
    /// not already its own, rather than take it over.
    #[error(
        "data directory {dir} is not empty and is not a belfry data directory (it holds \
         {found}): point the data directory at an empty or new directory, or at one belfry \
         created"
    )]
    ForeignDataDir { dir: String, found: String },
    /// The data directory's filesystem has too little free space for this change: a change
    /// that would grow the data leaves the whole reserve free (`floor_bytes ==
    /// reserve_bytes`); a claim, nack or extension goes into the reserve down to the delivery
    /// floor, an ack or cancel a little further (`floor_bytes < reserve_bytes`). The call was
    /// refused before it touched anything. Reads go on; the same call succeeds once space is
    /// freed (or the queues drain and a checkpoint deletes finished files), without a restart.
    #[error("{}", disk_full_message(*free_bytes, *needed_bytes, *floor_bytes, *reserve_bytes))]
    DiskFull {
        free_bytes: u64,
        /// About how many bytes the change would write.
        needed_bytes: u64,
        /// The free space the change had to leave.
        floor_bytes: u64,
        reserve_bytes: u64,
    },
    /// Opening the data directory ran out of disk space: recovery copies the WAL written
    /// since the last checkpoint into bucket files and writes a new checkpoint before it can
    /// delete that WAL. Nothing is lost; the open succeeds once that much space is free.
    #[error(
        "not enough free disk space to open the data directory {dir}: recovery copies the \
         {wal_bytes} bytes of write-ahead log written since the last checkpoint into bucket \
         files and writes a new checkpoint (the last one took {checkpoint_bytes} bytes) before \
         it deletes that log, so it needs up to about {needed_bytes} bytes free, and the \
         filesystem had {free_bytes}. Nothing acknowledged was lost: free that much disk \
         space (or grow the filesystem), then start belfry again ({source})"
    )]
    NoSpaceToOpen {
        dir: String,
        free_bytes: u64,
        needed_bytes: u64,
        wal_bytes: u64,
        checkpoint_bytes: u64,
        source: std::io::Error,
    },
    /// A networked store is out of memory (Redis at its `maxmemory`) and refused a change
    /// that would grow the data: the same refusal as [`StoreError::DiskFull`], answered the
    /// same way. Reads and delivery state go on; the call succeeds once memory is freed.
    #[error("the store is full: {detail}")]
    Full { detail: String },
    /// A networked store refused this node's credentials or permissions (a wrong or rotated
    /// password, a user without a needed command). Not transient: it lasts until the
    /// credentials or the store's users are changed.
    #[error("{detail}")]
    AccessDenied { detail: String },
}

/// How an I/O error names its path: ` (<path>)` after the operation, or nothing.
fn on_path(path: Option<&Path>) -> String {
    path.map(|p| format!(" ({})", p.display()))
        .unwrap_or_default()
}

/// What [`StoreError::DiskFull`] says: how much is free, and which limit the change would
/// cross (the free figure is above the limit when the change's own bytes would cross it).
fn disk_full_message(free: u64, needed: u64, floor: u64, reserve: u64) -> String {
    let state = if free < floor {
        format!("the data directory's filesystem has {free} bytes free")
    } else {
        format!(
            "the data directory's filesystem has {free} bytes free, and this change would \
             write about {needed}"
        )
    };
    if floor >= reserve {
        let position = if free < reserve {
            "below"
        } else {
            "which would leave less than"
        };
        format!(
            "{state}, {position} the reserve of {reserve} bytes kept for deliveries and \
             checkpoints: nothing was stored; free disk space (or let the queues drain) and \
             retry"
        )
    } else {
        let position = if free < floor {
            "below"
        } else {
            "which would leave less than"
        };
        format!(
            "{state}, {position} {floor} bytes, the last part of the {reserve}-byte free-space \
             reserve, kept for acks and for the checkpoint that frees space: nothing was \
             stored; free disk space and retry shortly"
        )
    }
}

impl StoreError {
    /// An I/O error while trying to `context` on the file or directory at `path`.
    pub fn io_at(context: &'static str, path: &Path, source: io::Error) -> StoreError {
        StoreError::Io {
            context,
            path: Some(path.to_path_buf()),
            source,
        }
    }

    /// Whether the same call may succeed if retried later, unchanged.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

/// Whether a store can take writes, as `/readyz` reports it. Cheap: no I/O beyond, at most,
/// one `statvfs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreHealth {
    Healthy,
    /// Changes that grow the data are refused with [`StoreError::DiskFull`]; reads and
    /// delivery state are served.
    LowDiskSpace {
        free_bytes: u64,
        reserve_bytes: u64,
        /// The size of the change refused last, when free space is above the reserve but too
        /// close to it for that change; `0` otherwise.
        refused_bytes: u64,
    },
    /// The store stopped after a fatal error and answers every call with
    /// [`StoreError::Poisoned`]: the reason, and what to do, as the log has them.
    Poisoned(String),
    /// A networked store cannot be reached just now (calls fail with
    /// [`StoreError::Unavailable`]); it recovers by itself once the network or the server does.
    Unavailable(String),
}

/// The result of putting one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new task was stored.
    Created { id: TaskId, due_at_ms: UnixMs },
    /// A task with the same idempotency key is already known; nothing was stored.
    Duplicate(Box<Task>),
}

impl PutOutcome {
    pub fn id(&self) -> TaskId {
        match self {
            PutOutcome::Created { id, .. } => *id,
            PutOutcome::Duplicate(task) => task.id,
        }
    }
}

/// The result of a claim: tasks now leased, and tasks that the claim finished because their
/// late policy said so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimBatch {
    pub leased: Vec<LeasedTask>,
    /// Found later than their `LatePolicy::Skip` allowed: now `Skipped`, never delivered.
    pub late_skipped: Vec<TaskId>,
    /// Found later than their `LatePolicy::Dead` allowed: now `Dead`.
    pub late_dead: Vec<TaskId>,
    /// Leases of the queue that ran out (reached their deadline without an ack, nack,
    /// extension or dead-lettering) and that no earlier claim reported: each lease the store
    /// ends by expiry is counted by one claim only, whichever call of any node ended it. A
    /// store that keeps the count in memory may count again, after a restart, a lease that
    /// ran out before it and was not leased again since (expiry writes nothing).
    pub leases_expired: u64,
}

/// The result of ack, nack, extend or dead-lettering a leased task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    Ok,
    /// No such task in this queue.
    NotFound,
    /// The task is not leased under this lease id (it expired, was re-leased, or finished).
    LeaseExpired,
}

/// The result of cancel or reschedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOutcome {
    Ok,
    NotFound,
    /// Only scheduled tasks can be cancelled or rescheduled; this one is in another state.
    WrongState(TaskState),
}

/// What [`Store::settle_dead`] does with each dead letter it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadAction {
    /// Schedule it again, due now, attempts reset ([`Store::redrive`]).
    Redrive,
    /// Finish it as cancelled ([`Store::discard_dead`]).
    Discard,
}

/// One change of small metadata (see [`Store::write_meta`]): `Some` puts the value, `None`
/// deletes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaChange {
    pub namespace: String,
    pub key: String,
    pub value: Option<Bytes>,
}

impl MetaChange {
    pub fn put(namespace: &str, key: &str, value: Bytes) -> Self {
        MetaChange {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value: Some(value),
        }
    }

    pub fn delete(namespace: &str, key: &str) -> Self {
        MetaChange {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value: None,
        }
    }
}

/// Per-queue counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Scheduled tasks, due or not (includes `due`).
    pub pending: u64,
    /// Scheduled tasks whose due time has passed.
    pub due: u64,
    /// Leased tasks whose lease has not expired.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// The due time of the earliest scheduled task whose due time has passed (a task whose
    /// lease ran out counts at its original due time): `None` exactly when `due` is 0. How
    /// long the queue's oldest waiting task has waited is `now_ms` minus this.
    pub oldest_due_ms: Option<UnixMs>,
}

/// Room granted under a queue's in-flight cap that every node on a store shares (see
/// [`Store::reserve_in_flight`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightRoom {
    /// How many leases the claim may take: at most what it asked for.
    pub granted: u64,
    /// Names the reservation for [`Store::settle_in_flight`].
    pub token: u64,
    /// The earliest deadline among the leases that hold the cap (`None` when none does): when
    /// nothing was granted, room frees up then at the latest.
    pub earliest_until_ms: Option<UnixMs>,
}

/// A change that another node (or this one) made to a store that several belfry nodes share.
/// Single-process stores send none. Events are hints, delivered at most once: a node reacts
/// by looking again, and after [`StoreEvent::Resync`] it looks at everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// Tasks of the queue may be due earlier than this node knows (a put, nack, redrive or
    /// reschedule somewhere): its dispatcher and long-polls should look again.
    Wake(QueueName),
    /// The queue was created, changed or deleted: re-read its configuration.
    QueueChanged(QueueName),
    /// Metadata changed (schedules, reminders): re-read what depends on it.
    MetaChanged(MetaEvent),
    /// Events may have been missed (the store's event stream was connected again): re-read
    /// everything, look at every queue, and forget what was cached on the strength of events.
    Resync,
    /// The periodic look at everything, with no event known to be missed: re-read every
    /// queue and look at each (this catches a wake-up whose announcement failed), but what is
    /// cached stays, bounded by its own time to live.
    Recheck,
    /// The part of the store this node owns changed (shards taken over or handed off): look
    /// at every queue and every singleton job again.
    OwnershipChanged,
    /// These users' subscriptions changed (a subscribe or an unsubscribe): forget what is
    /// cached of their subscription lists. `None`: too many users to name (a bulk change, a
    /// dropped set): forget every cached list.
    SubscriptionsChanged(Option<Vec<belfry_core::UserId>>),
}

/// One write of metadata, as announced: its namespace, the keys it wrote when the store names
/// them, and the namespace's write count after it when the store counts writes
/// ([`Store::meta_versions`]). The keys let a node re-read only what changed; the count lets
/// it tell, on its periodic recheck, an announcement it heard from one it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaEvent {
    pub namespace: String,
    /// The keys the write put or deleted. `None`: any key of the namespace (too many to
    /// name, or a store that does not name them).
    pub keys: Option<Vec<String>>,
    /// The namespace's write count once this write was counted; `None`: not counted.
    pub version: Option<u64>,
}

impl MetaEvent {
    /// Any key of `namespace` may have changed, uncounted.
    pub fn namespace(namespace: impl Into<String>) -> MetaEvent {
        MetaEvent {
            namespace: namespace.into(),
            keys: None,
            version: None,
        }
    }
}

/// Where a store sends its [`StoreEvent`]s: called on the store's own thread, so it must
/// return quickly (hand the event to a channel or a `Notify`).
pub type EventSink = std::sync::Arc<dyn Fn(StoreEvent) + Send + Sync>;

/// A storage backend.
///
/// Semantics every implementation must share (checked by the conformance tests):
/// - `claim` never returns a task whose due time is after `now_ms`.
/// - Due tasks are claimed high priority first, then by due time, then in submit order.
/// - A lease that reaches `lease_until_ms` without ack ends: the task is due again (with its
///   original due time, so it goes to the front) and the old lease id is refused.
///   Whichever call ends it, one later claim of the queue counts it in
///   [`ClaimBatch::leases_expired`].
/// - Finished tasks (done, cancelled) may be forgotten at any time after they finish: `get`
///   may then return `None` and their idempotency key may be reused. Dead tasks are kept until
///   redriven or their queue is deleted.
pub trait Store: Send + Sync + 'static {
    // ---- queues ----

    /// Creates the queue or replaces its configuration. `config` is opaque to the store.
    /// Returns whether the queue was created.
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool>;
    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>>;
    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>>;
    /// Deletes the queue and every task in it. Returns whether it existed.
    fn delete_queue(&self, queue: &QueueName) -> Result<bool>;
    /// Drops every task of the queue — scheduled, leased and dead — and keeps the queue and
    /// its configuration, in one step: a task put before it is gone, one put after it is kept.
    /// The tasks' idempotency keys are free, and their leases answer `NotFound`. Returns
    /// whether the queue exists.
    fn purge_queue(&self, queue: &QueueName) -> Result<bool>;

    // ---- tasks ----

    /// Stores tasks, durably (before returning, under the default fsync policy), all or none. Every task's queue must exist. Outcomes are in input
    /// order. A task whose idempotency key is already known in its queue (or earlier in the
    /// same batch) is a `Duplicate` of the first.
    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>>;
    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>>;
    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>>;
    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome>;
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome>;
    /// [`Store::cancel`] of each of `ids`, in order: the outcomes are those of the single
    /// calls made one after another (a task named twice is `Ok` the first time and
    /// `WrongState(Cancelled)` after). Durable when it returns, as `cancel` is.
    ///
    /// The default loops. The embedded engine takes its lock once per 128 tasks and waits
    /// once for them all to be durable. A call that fails with an error may have cancelled
    /// tasks before the failing one.
    fn cancel_many(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        ids.iter()
            .map(|&id| self.cancel(queue, id, now_ms))
            .collect()
    }

    /// Up to `limit` of the queue's live tasks (scheduled or leased; not finished, not dead),
    /// with their payloads, starting after the task `after` (the last of the previous page; it
    /// need not exist any more). What an operator's listing and an export walk.
    ///
    /// The order is the store's own and is fixed by the tasks' ids: the memory store and
    /// Redis list in id order (on Redis, ids sort by partition, then by submit order), the
    /// embedded engine by home bucket, then submit order. So a walk from `None` lists every
    /// task that stays live throughout it exactly once; a task put, finished or dead-lettered
    /// during the walk may or may not be listed. A leased task whose lease ran out by `now_ms`
    /// is listed as scheduled. Memory used is bounded by `limit`, not by the queue's size.
    /// A page shorter than `limit` is the last: a store fills each page while tasks are left.
    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>>;

    // ---- delivery ----

    /// Leases up to `max` due tasks until `now_ms + visibility_ms`, counting an attempt on each.
    ///
    /// Delivery state: the leases (and late-policy outcomes) survive a crash of the process,
    /// but may be lost in a crash of the machine, leaving those tasks due again (see the
    /// module docs).
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch>;
    /// The task was handled: it becomes `Done`.
    ///
    /// Delivery state: if a machine crash loses the ack, the task is leased again under the
    /// old lease after restart and due once it expires, so it is delivered again (never lost).
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    /// Acks many tasks of one queue in one call: the outcomes, in input order, are those of
    /// calling [`Store::ack`] for each pair in order (so a task named twice is `Ok` the first
    /// time and `LeaseExpired` after, since it is then done).
    ///
    /// The default loops over `ack`. The embedded engine takes its lock once per 128 acks
    /// and writes each such chunk as one WAL frame, so after a crash a chunk's acks survive
    /// together or not at all (delivery state, like `ack`: it returns once written, without
    /// waiting for an fsync; a crash of the process after it returned keeps them all). If it
    /// fails with an error, the acks before the failing one (the default) or before its chunk
    /// (the engine) may have taken effect: acking them again answers `LeaseExpired`.
    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>> {
        acks.iter()
            .map(|&(id, lease)| self.ack(queue, id, lease, now_ms))
            .collect()
    }
    /// The attempt failed: the task is scheduled again, due at `retry_at_ms`.
    ///
    /// Delivery state: if a machine crash loses the nack, the task is due again once the
    /// old lease expires (possibly before `retry_at_ms`).
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    /// Moves the lease deadline to `lease_until_ms`.
    ///
    /// Delivery state: if a machine crash loses the extension, the old deadline applies after
    /// restart, so the task may be delivered again while still being handled.
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    /// The task cannot be delivered: it becomes `Dead` with `reason`.
    ///
    /// Delivery state: if a machine crash loses it, the task is due again once the old lease
    /// expires.
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    /// As [`Store::dead_letter`], for a task whose claim found it out of attempts (its previous
    /// lease expired on the last one): that claim's attempt was never made, so the task keeps
    /// the attempt count it had before the claim.
    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;

    // ---- dead letters ----

    /// Dead tasks in id order, starting after `after`.
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>>;
    /// A dead task is scheduled again, due at `now_ms`, with its attempt count reset.
    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome>;
    /// A dead task is discarded: it becomes `Cancelled` (without its dead reason), a finished
    /// task like any other, which the store may forget (freeing its idempotency key).
    /// `WrongState` for a task that is not dead.
    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome>;
    /// [`Store::redrive`] or [`Store::discard_dead`] of each of `ids`, in order: the outcomes
    /// are those of the single calls made one after another (a task named twice is `Ok` the
    /// first time and `WrongState` after).
    ///
    /// The default loops. The embedded engine takes its lock once per chunk of 128 and
    /// writes each chunk as one WAL frame; a call that fails with an error may have applied
    /// the chunks before the failing one.
    fn settle_dead(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        action: DeadAction,
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        ids.iter()
            .map(|&id| match action {
                DeadAction::Redrive => self.redrive(queue, id, now_ms),
                DeadAction::Discard => self.discard_dead(queue, id, now_ms),
            })
            .collect()
    }

    // ---- observation ----

    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts>;
    /// How many scheduled tasks fall due in each of `steps` intervals of `step_ms`, the first
    /// starting at `from_ms`.
    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>>;
    /// The earliest instant at which `claim` could return something (a due time or a lease
    /// expiry), or `None` when the queue holds nothing to deliver. A dispatcher sleeps until
    /// then (or until new tasks arrive).
    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>>;

    // ---- small metadata (schedules and the like) ----

    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()>;
    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>>;
    /// [`Store::get_meta`] of each of `keys` in `namespace`, in order: what a schedule tick
    /// reads for the schedules due. A networked store should make it one round trip per
    /// batch, not one per key (the default asks one key at a time); a store reached through
    /// a lock should take it once.
    fn get_meta_many(&self, namespace: &str, keys: &[&str]) -> Result<Vec<Option<Bytes>>> {
        keys.iter()
            .map(|key| self.get_meta(namespace, key))
            .collect()
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool>;
    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>>;
    /// Applies `changes` in order, durably, as one write: a schedule's cursors after a tick,
    /// or a schedule and its cursor together. Stores should make it atomic (after a crash all
    /// of the changes or none took effect) and cost about one small record per change; the
    /// default applies them one call at a time, which is neither.
    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()> {
        for change in changes {
            match change.value {
                Some(value) => self.put_meta(&change.namespace, &change.key, value)?,
                None => {
                    self.delete_meta(&change.namespace, &change.key)?;
                }
            }
        }
        Ok(())
    }

    /// How many times each of `namespaces` has been written, if the store keeps count: a
    /// store shared by several nodes does, so that a node can tell whether anything changed
    /// since it last looked without reading it all again (its periodic recheck, the guard
    /// against a lost announcement). The counts only grow. `None`: this store does not
    /// count (a single-process store, whose every write goes through this process).
    fn meta_versions(&self, namespaces: &[&str]) -> Result<Option<Vec<u64>>> {
        let _ = namespaces;
        Ok(None)
    }

    // ---- subscriber sets (reminders) ----
    //
    // A set is named by a number its owner chooses (a reminder's uid) and holds user ids.
    // Stores keep two indexes of the same pairs, by set and by user, and must hold them with
    // memory bounded whatever their size: sets of millions are read in pages, never whole.
    // Changes are durable when the call returns, like a put.

    /// Adds `users` to `set`. Returns how many were not members before (a user listed twice
    /// in one call counts once).
    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64>;
    /// Removes `users` from `set`. Returns how many were members.
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64>;
    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool>;
    /// How many members `set` has: exact, and cheap (no scan).
    fn subscriber_count(&self, set: u64) -> Result<u64>;
    /// [`Store::subscriber_count`] of each of `sets`, in order. A networked store answers many
    /// sets in a few round trips, not one each (the reminder runner's full look counts every
    /// reminder's subscribers).
    fn subscriber_counts(&self, sets: &[u64]) -> Result<Vec<u64>> {
        sets.iter().map(|set| self.subscriber_count(*set)).collect()
    }
    /// Up to `limit` members of `set` in ascending [`UserId`] order, starting after `after`.
    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>>;
    /// The same page as [`Store::subscribers`], into `page` (cleared first): its ids in one
    /// buffer instead of an allocation each, for the fan-out, which reads millions. Stores
    /// that can decode their keys straight into it override this.
    fn subscriber_page(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
        page: &mut UserPage,
    ) -> Result<()> {
        page.clear();
        for user in self.subscribers(set, after, limit)? {
            page.push(&user);
        }
        Ok(())
    }
    /// Up to `limit` sets `user` is a member of, ascending.
    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>>;
    /// Empties `set` (both indexes). Returns how many members it had. A store may do the
    /// work later, but from the return on the set reads as empty.
    fn drop_set(&self, set: u64) -> Result<u64>;

    // ---- several nodes on one shared store ----
    //
    // A networked store may be shared by several belfry nodes. These calls let a node hear
    // what the others changed and split the work among them. Single-process stores keep the
    // defaults: no events, and this node owns everything.

    /// Whether other nodes may share this store, so that what this node has cached of it (its
    /// queues) can lag a change made elsewhere: a miss is then worth a read of the store
    /// before it is answered as "not found". The default: no, this process is the only one.
    fn shared_by_nodes(&self) -> bool {
        false
    }

    /// Starts sending [`StoreEvent`]s to `sink`. Called once, when the server starts.
    fn subscribe_events(&self, sink: EventSink) -> Result<()> {
        let _ = sink;
        Ok(())
    }

    /// Like [`Store::claim`], but only from the part of the queue this node owns: what the
    /// push dispatcher calls, so that each due task is dispatched by one node, and a node
    /// that lost its shards (fencing) claims nothing there. Pull leases call `claim`, which
    /// may take any due task: their exclusivity is the lease itself.
    fn claim_owned(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        self.claim(queue, now_ms, max, visibility_ms)
    }

    /// Repairs what a crash of some node may have left behind in a shared store's indexes
    /// (a wake-up index not updated after a write): the fallback sweep, called on each
    /// [`StoreEvent::Resync`] and [`StoreEvent::Recheck`]. A store decides how often it really sweeps; the default has
    /// nothing to repair.
    fn sweep(&self) -> Result<()> {
        Ok(())
    }

    /// Like [`Store::next_due_ms`], over the part of the queue this node owns.
    fn next_due_owned_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        self.next_due_ms(queue)
    }

    /// Takes up to `want` tokens from `queue`'s rate limit (`rate_per_s` tokens a second, at
    /// most `burst` saved), shared by every node on this store; `None` when the store keeps no
    /// shared limit, and each node's own bucket applies. Tokens taken but not used go back
    /// with [`Store::return_rate_tokens`].
    fn take_rate_tokens(
        &self,
        queue: &QueueName,
        want: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<Option<u64>> {
        let _ = (queue, want, rate_per_s, burst);
        Ok(None)
    }

    /// Gives back tokens [`Store::take_rate_tokens`] granted that a claim did not use.
    fn return_rate_tokens(
        &self,
        queue: &QueueName,
        count: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<()> {
        let _ = (queue, count, rate_per_s, burst);
        Ok(())
    }

    /// Reserves room for up to `want` leases of `queue` under its in-flight cap `cap`, shared
    /// by every node on this store: the room granted is `min(want, cap - held)`, where `held`
    /// counts the queue's leases (and other claims' reservations) whose deadline is after
    /// `now_ms`. The reservation holds its room until `until_ms` (the deadline the claim's
    /// leases get), or until [`Store::settle_in_flight`] replaces it with the leases taken.
    /// A store that keeps this count ends a lease's room itself when `ack`, `ack_many`,
    /// `nack` or `dead_letter` end the lease, moves it with `extend`, and lets it go when the
    /// deadline passes (the task is then due again).
    ///
    /// `None` when the store keeps no shared count: a single process's own count is exact.
    fn reserve_in_flight(
        &self,
        queue: &QueueName,
        want: u64,
        cap: u64,
        now_ms: UnixMs,
        until_ms: UnixMs,
    ) -> Result<Option<InFlightRoom>> {
        let _ = (queue, want, cap, now_ms, until_ms);
        Ok(None)
    }

    /// Replaces the reservation `room` with the leases the claim took (each held until its
    /// deadline); room it did not use is free again. Called once per reservation, also with
    /// no leases when the claim failed.
    fn settle_in_flight(
        &self,
        queue: &QueueName,
        room: &InFlightRoom,
        leases: &[(LeaseId, UnixMs)],
        now_ms: UnixMs,
    ) -> Result<()> {
        let _ = (queue, room, leases, now_ms);
        Ok(())
    }

    /// Whether this node should do the one-at-a-time work named `key` now (a schedule's
    /// firings, a reminder's fan-out). With several nodes, one live node owns each key, give
    /// or take a takeover, whose overlap the work's idempotency keys absorb.
    fn owns(&self, key: &str) -> bool {
        self.ownership(key).is_some()
    }

    /// The lease under which this node owns the work named `key` now: `None` if it does not,
    /// else a token that changes whenever ownership moves (a takeover, even one back to this
    /// node). A runner keeps the token it saw when it took up the work and checks it again
    /// right before each write: a node paused past its lease (`SIGSTOP`, a VM pause) must not
    /// write over what the new owner wrote meanwhile, once the idempotency keys that absorb a
    /// takeover's overlap are forgotten. Stores used by one node answer `Some("")`.
    fn ownership(&self, key: &str) -> Option<String> {
        let _ = key;
        Some(String::new())
    }

    /// Makes everything written so far durable (whatever the fsync policy) and waits for
    /// background work to reach a consistent point. Called on shutdown.
    fn flush(&self) -> Result<()>;

    /// Whether `claim`, `ack`, `ack_many` and `extend` return without waiting for a disk
    /// fsync or the network, so that a server may call them on its async workers instead of
    /// handing each call to a thread pool (two thread wake-ups a call). The default: no.
    fn delivery_is_quick(&self) -> bool {
        false
    }

    /// Whether a `claim` of `queue` at `now_ms` would be quick in the same sense: it would
    /// also read no file (the embedded engine reads a bucket whose tasks come near before it
    /// claims from it). The default: no.
    fn claim_is_quick(&self, queue: &QueueName, now_ms: UnixMs) -> bool {
        let _ = (queue, now_ms);
        false
    }

    /// Whether `user_sets` and `get_meta` return without a network round trip or an fsync:
    /// they read memory, and files the OS most likely holds in its page cache. A server may
    /// then call them on its async workers (the feed does, while such reads stay fast). The
    /// default: no.
    fn reads_are_quick(&self) -> bool {
        false
    }

    /// Whether the store takes writes (for readiness checks). The default, for stores that
    /// cannot fail that way, is healthy. A networked store may make one round trip (bounded by
    /// its command timeout).
    fn health(&self) -> StoreHealth {
        StoreHealth::Healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The free figure can be above the limit: the change's own bytes are what would cross it
    /// (the audit saw "2699264 bytes free, below the reserve of 2621440").
    #[test]
    fn a_disk_full_refusal_says_which_side_of_the_limit_free_space_is() {
        let full = |free, needed, floor| {
            StoreError::DiskFull {
                free_bytes: free,
                needed_bytes: needed,
                floor_bytes: floor,
                reserve_bytes: 1000,
            }
            .to_string()
        };
        let above = full(1200, 400, 1000);
        assert!(above.contains("1200 bytes free, and this change would write about 400, which would leave less than the reserve of 1000"), "{above}");
        let below = full(900, 10, 1000);
        assert!(
            below.contains("900 bytes free, below the reserve of 1000"),
            "{below}"
        );
        let delivery = full(200, 10, 250);
        assert!(delivery.contains("200 bytes free, below 250 bytes, the last part of the 1000-byte free-space reserve"), "{delivery}");
    }
}
