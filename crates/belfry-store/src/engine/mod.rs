//! The embedded timeline storage engine (work in progress: API stub).

pub mod record;

use std::path::Path;
use std::time::Duration;

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs};
use bytes::Bytes;

use crate::store::{
    ChangeOutcome, ClaimBatch, LeaseOutcome, PutOutcome, QueueCounts, Result, Store, StoreError,
};

/// When appended records are forced to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Every mutating call returns only once its records are fsync'd (shared by group commit).
    #[default]
    Always,
    /// Records are written at once and fsync'd at most this long after.
    Interval(Duration),
    /// Records are handed to the OS; fsync only on checkpoint and `flush`.
    Never,
}

/// Tuning knobs of the engine.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    pub fsync: FsyncPolicy,
}

/// The embedded engine.
#[derive(Debug)]
pub struct Engine {
    _private: (),
}

fn todo_err<T>() -> Result<T> {
    Err(StoreError::Invalid("not implemented".into()))
}

impl Engine {
    pub fn open(dir: impl AsRef<Path>, options: EngineOptions) -> Result<Engine> {
        let _ = (dir.as_ref(), options);
        todo_err()
    }
}

#[allow(unused_variables)]
impl Store for Engine {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool> {
        todo_err()
    }
    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>> {
        todo_err()
    }
    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>> {
        todo_err()
    }
    fn delete_queue(&self, queue: &QueueName) -> Result<bool> {
        todo_err()
    }
    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
        todo_err()
    }
    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>> {
        todo_err()
    }
    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>> {
        todo_err()
    }
    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        todo_err()
    }
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome> {
        todo_err()
    }
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch> {
        todo_err()
    }
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        todo_err()
    }
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        todo_err()
    }
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        todo_err()
    }
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome> {
        todo_err()
    }
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>> {
        todo_err()
    }
    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome> {
        todo_err()
    }
    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts> {
        todo_err()
    }
    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>> {
        todo_err()
    }
    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>> {
        todo_err()
    }
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()> {
        todo_err()
    }
    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>> {
        todo_err()
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool> {
        todo_err()
    }
    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>> {
        todo_err()
    }
    fn flush(&self) -> Result<()> {
        todo_err()
    }
}
