//! A store whose task writes and acks wait, while the test holds them, until it lets them
//! go: a store call that does not answer in time, as a slow disk or a Redis failover makes
//! one, to see what the server answers meanwhile and what happens once it does answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use belfry_core::{LeaseId, NewTask, QueueName, TaskId, UnixMs};
use belfry_store::{ForwardingStore, LeaseOutcome, MemoryStore, PutOutcome, Store};

#[derive(Default)]
pub struct StallingStore {
    inner: MemoryStore,
    /// Whether puts and acks wait.
    held: Mutex<bool>,
    let_go: Condvar,
    /// Calls that found the store held.
    stalled: AtomicUsize,
}

impl StallingStore {
    /// From now on, puts and acks wait until [`StallingStore::release`].
    pub fn hold(&self) {
        *self.held.lock().unwrap() = true;
    }

    pub fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.let_go.notify_all();
    }

    /// How many calls found the store held so far.
    pub fn stalled(&self) -> usize {
        self.stalled.load(Ordering::SeqCst)
    }

    fn wait_while_held(&self) {
        let mut held = self.held.lock().unwrap();
        if *held {
            self.stalled.fetch_add(1, Ordering::SeqCst);
        }
        while *held {
            held = self.let_go.wait(held).unwrap();
        }
    }
}

impl ForwardingStore for StallingStore {
    fn wrapped(&self) -> &dyn Store {
        &self.inner
    }

    fn put(&self, tasks: Vec<NewTask>) -> belfry_store::Result<Vec<PutOutcome>> {
        self.wait_while_held();
        self.inner.put(tasks)
    }

    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> belfry_store::Result<LeaseOutcome> {
        self.wait_while_held();
        self.inner.ack(queue, id, lease, now_ms)
    }

    /// Acks go to the blocking pool, under the API's store-call deadline, as on a store whose
    /// acks wait for a disk or the network.
    fn delivery_is_quick(&self) -> bool {
        false
    }
}
