//! What the schedule service tests share: the instants, the queue, a service over the
//! reference store, and a store that fails cursor writes on demand.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use belfry_core::{QueueName, Task, UnixMs};
use belfry_schedule::{ScheduleId, ScheduleService, CURSORS_NAMESPACE};
use belfry_store::{MemoryStore, MetaChange, Store, StoreError};
use bytes::Bytes;

/// 2026-11-22T00:00:00Z, a Sunday.
pub const T0: UnixMs = 1_795_305_600_000;
pub const SECOND: u64 = 1_000;
pub const MINUTE: u64 = 60 * SECOND;
pub const HOUR: u64 = 60 * MINUTE;
pub const DAY: u64 = 24 * HOUR;

pub fn queue() -> QueueName {
    QueueName::new("jobs").unwrap()
}

pub fn id(text: &str) -> ScheduleId {
    ScheduleId::new(text).unwrap()
}

pub fn setup() -> (Arc<MemoryStore>, ScheduleService) {
    let store = Arc::new(MemoryStore::new());
    store.put_queue(&queue(), Bytes::new()).unwrap();
    let service = ScheduleService::new(store.clone());
    (store, service)
}

/// Due times of the scheduled tasks in the queue, via claiming everything due by `until`.
pub fn claim_all(store: &MemoryStore, until: UnixMs) -> Vec<Task> {
    let batch = store.claim(&queue(), until, 100_000, 60_000).unwrap();
    batch.leased.into_iter().map(|leased| leased.task).collect()
}

pub fn due_times(store: &MemoryStore, until: UnixMs) -> Vec<UnixMs> {
    claim_all(store, until)
        .into_iter()
        .map(|t| t.due_at_ms)
        .collect()
}

/// Delegates to a `MemoryStore`, but fails the next `failures` cursor writes, as if the
/// process died right after the tasks were put.
pub struct CrashingStore {
    pub inner: MemoryStore,
    pub failures: AtomicU32,
}

/// Cursor writes go through `put_meta`, one change at a time, as `Store`'s own `write_meta`
/// does, so that each can fail.
impl belfry_store::ForwardingStore for CrashingStore {
    fn wrapped(&self) -> &dyn Store {
        &self.inner
    }

    fn write_meta(&self, changes: Vec<MetaChange>) -> belfry_store::Result<()> {
        for change in changes {
            match change.value {
                Some(value) => Store::put_meta(self, &change.namespace, &change.key, value)?,
                None => {
                    self.inner.delete_meta(&change.namespace, &change.key)?;
                }
            }
        }
        Ok(())
    }

    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> belfry_store::Result<()> {
        if namespace == CURSORS_NAMESPACE
            && self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(StoreError::Io {
                context: "persist the schedule cursor",
                path: None,
                source: std::io::Error::other("simulated crash"),
            });
        }
        self.inner.put_meta(namespace, key, value)
    }
}

/// Delegates to a `MemoryStore`, as a store shared by several nodes would answer one of them:
/// every key is owned, under a lease that moves (another node took it over, and perhaps gave
/// it back) once `checks_before_move` ownership checks have been answered.
pub struct MovingLeaseStore {
    pub inner: MemoryStore,
    pub checks_before_move: AtomicU32,
    pub moves: AtomicU32,
}

impl MovingLeaseStore {
    pub fn new(checks_before_move: u32) -> Self {
        MovingLeaseStore {
            inner: MemoryStore::new(),
            checks_before_move: AtomicU32::new(checks_before_move),
            moves: AtomicU32::new(0),
        }
    }
}

impl belfry_store::ForwardingStore for MovingLeaseStore {
    fn wrapped(&self) -> &dyn Store {
        &self.inner
    }

    fn ownership(&self, _key: &str) -> Option<String> {
        let lease = format!("lease-{}", self.moves.load(Ordering::SeqCst));
        let left = self
            .checks_before_move
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if left == Ok(1) {
            self.moves.fetch_add(1, Ordering::SeqCst);
        }
        Some(lease)
    }
}
