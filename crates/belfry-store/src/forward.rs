//! Forwarding for stores that wrap another one: a fault-injecting store in a test, a store
//! that announces its writes, a metrics wrapper. The wrapper implements [`Wraps`], writes
//! the `Store` methods it changes, and forwards the others by name:
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use belfry_store::{forward_store_calls, MemoryStore, Store, Wraps};
//!
//! /// Counts puts, and forwards everything else to the store inside.
//! struct CountingStore {
//!     inner: MemoryStore,
//!     puts: AtomicUsize,
//! }
//!
//! impl Wraps for CountingStore {
//!     fn wrapped(&self) -> &dyn Store {
//!         &self.inner
//!     }
//! }
//!
//! impl Store for CountingStore {
//!     fn put(&self, tasks: Vec<belfry_core::NewTask>) -> belfry_store::Result<Vec<belfry_store::PutOutcome>> {
//!         self.puts.fetch_add(1, Ordering::Relaxed);
//!         self.inner.put(tasks)
//!     }
//!     forward_store_calls!(
//!         put_queue, get_queue, list_queues, delete_queue, get, get_by_key, cancel, reschedule,
//!         claim, ack, nack, extend, dead_letter, list_dead, redrive, counts, forecast,
//!         next_due_ms, put_meta, get_meta, delete_meta, list_meta, subscribe, unsubscribe,
//!         is_subscribed, subscriber_count, subscribers, user_sets, drop_set, flush,
//!     );
//! }
//! ```
//!
//! A method with a default in `Store` that is not named keeps that default, which calls the
//! wrapper's own methods (the default `write_meta` calls the wrapper's `put_meta`); named, it
//! goes to the wrapped store's own version. The signatures live here once, beside the trait:
//! a new `Store` method gets its arm in [`__forward_store_call`].

use crate::Store;

/// A store that wraps another, for [`forward_store_calls`].
pub trait Wraps {
    /// The store the forwarded calls go to.
    fn wrapped(&self) -> &dyn Store;
}

/// The types the forwarding arms name, reachable from any crate that calls the macro.
#[doc(hidden)]
pub mod __forward {
    pub use crate::{
        ChangeOutcome, ClaimBatch, EventSink, InFlightRoom, LeaseOutcome, MetaChange, PutOutcome,
        QueueCounts, Result, StoreHealth,
    };
    pub use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId, UserPage};
    pub use bytes::Bytes;
}

/// Writes the named `Store` methods as calls to [`Wraps::wrapped`]; use it inside
/// `impl Store for …`. See the module's documentation.
#[macro_export]
macro_rules! forward_store_calls {
    ($($method:ident),* $(,)?) => {
        $($crate::__forward_store_call!($method);)*
    };
}

/// One `Store` method forwarded; an arm per method of the trait.
#[doc(hidden)]
#[macro_export]
macro_rules! __forward_store_call {
    (put_queue) => {
        fn put_queue(
            &self,
            queue: &$crate::__forward::QueueName,
            config: $crate::__forward::Bytes,
        ) -> $crate::__forward::Result<bool> {
            $crate::Wraps::wrapped(self).put_queue(queue, config)
        }
    };
    (get_queue) => {
        fn get_queue(
            &self,
            queue: &$crate::__forward::QueueName,
        ) -> $crate::__forward::Result<Option<$crate::__forward::Bytes>> {
            $crate::Wraps::wrapped(self).get_queue(queue)
        }
    };
    (list_queues) => {
        fn list_queues(
            &self,
        ) -> $crate::__forward::Result<Vec<($crate::__forward::QueueName, $crate::__forward::Bytes)>>
        {
            $crate::Wraps::wrapped(self).list_queues()
        }
    };
    (delete_queue) => {
        fn delete_queue(
            &self,
            queue: &$crate::__forward::QueueName,
        ) -> $crate::__forward::Result<bool> {
            $crate::Wraps::wrapped(self).delete_queue(queue)
        }
    };
    (put) => {
        fn put(
            &self,
            tasks: Vec<$crate::__forward::NewTask>,
        ) -> $crate::__forward::Result<Vec<$crate::__forward::PutOutcome>> {
            $crate::Wraps::wrapped(self).put(tasks)
        }
    };
    (get) => {
        fn get(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<Option<$crate::__forward::Task>> {
            $crate::Wraps::wrapped(self).get(queue, id, now_ms)
        }
    };
    (get_by_key) => {
        fn get_by_key(
            &self,
            queue: &$crate::__forward::QueueName,
            key: &str,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<Option<$crate::__forward::Task>> {
            $crate::Wraps::wrapped(self).get_by_key(queue, key, now_ms)
        }
    };
    (cancel) => {
        fn cancel(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::ChangeOutcome> {
            $crate::Wraps::wrapped(self).cancel(queue, id, now_ms)
        }
    };
    (reschedule) => {
        fn reschedule(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            due_at_ms: $crate::__forward::UnixMs,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::ChangeOutcome> {
            $crate::Wraps::wrapped(self).reschedule(queue, id, due_at_ms, now_ms)
        }
    };
    (claim) => {
        fn claim(
            &self,
            queue: &$crate::__forward::QueueName,
            now_ms: $crate::__forward::UnixMs,
            max: usize,
            visibility_ms: u64,
        ) -> $crate::__forward::Result<$crate::__forward::ClaimBatch> {
            $crate::Wraps::wrapped(self).claim(queue, now_ms, max, visibility_ms)
        }
    };
    (ack) => {
        fn ack(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            lease: $crate::__forward::LeaseId,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::LeaseOutcome> {
            $crate::Wraps::wrapped(self).ack(queue, id, lease, now_ms)
        }
    };
    (ack_many) => {
        fn ack_many(
            &self,
            queue: &$crate::__forward::QueueName,
            acks: &[($crate::__forward::TaskId, $crate::__forward::LeaseId)],
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<Vec<$crate::__forward::LeaseOutcome>> {
            $crate::Wraps::wrapped(self).ack_many(queue, acks, now_ms)
        }
    };
    (nack) => {
        fn nack(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            lease: $crate::__forward::LeaseId,
            retry_at_ms: $crate::__forward::UnixMs,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::LeaseOutcome> {
            $crate::Wraps::wrapped(self).nack(queue, id, lease, retry_at_ms, now_ms)
        }
    };
    (extend) => {
        fn extend(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            lease: $crate::__forward::LeaseId,
            lease_until_ms: $crate::__forward::UnixMs,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::LeaseOutcome> {
            $crate::Wraps::wrapped(self).extend(queue, id, lease, lease_until_ms, now_ms)
        }
    };
    (dead_letter) => {
        fn dead_letter(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            lease: $crate::__forward::LeaseId,
            reason: &str,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::LeaseOutcome> {
            $crate::Wraps::wrapped(self).dead_letter(queue, id, lease, reason, now_ms)
        }
    };
    (list_dead) => {
        fn list_dead(
            &self,
            queue: &$crate::__forward::QueueName,
            after: Option<$crate::__forward::TaskId>,
            limit: usize,
        ) -> $crate::__forward::Result<Vec<$crate::__forward::Task>> {
            $crate::Wraps::wrapped(self).list_dead(queue, after, limit)
        }
    };
    (redrive) => {
        fn redrive(
            &self,
            queue: &$crate::__forward::QueueName,
            id: $crate::__forward::TaskId,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::ChangeOutcome> {
            $crate::Wraps::wrapped(self).redrive(queue, id, now_ms)
        }
    };
    (counts) => {
        fn counts(
            &self,
            queue: &$crate::__forward::QueueName,
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<$crate::__forward::QueueCounts> {
            $crate::Wraps::wrapped(self).counts(queue, now_ms)
        }
    };
    (forecast) => {
        fn forecast(
            &self,
            queue: &$crate::__forward::QueueName,
            from_ms: $crate::__forward::UnixMs,
            step_ms: u64,
            steps: usize,
        ) -> $crate::__forward::Result<Vec<u64>> {
            $crate::Wraps::wrapped(self).forecast(queue, from_ms, step_ms, steps)
        }
    };
    (next_due_ms) => {
        fn next_due_ms(
            &self,
            queue: &$crate::__forward::QueueName,
        ) -> $crate::__forward::Result<Option<$crate::__forward::UnixMs>> {
            $crate::Wraps::wrapped(self).next_due_ms(queue)
        }
    };
    (put_meta) => {
        fn put_meta(
            &self,
            namespace: &str,
            key: &str,
            value: $crate::__forward::Bytes,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).put_meta(namespace, key, value)
        }
    };
    (get_meta) => {
        fn get_meta(
            &self,
            namespace: &str,
            key: &str,
        ) -> $crate::__forward::Result<Option<$crate::__forward::Bytes>> {
            $crate::Wraps::wrapped(self).get_meta(namespace, key)
        }
    };
    (get_meta_many) => {
        fn get_meta_many(
            &self,
            namespace: &str,
            keys: &[&str],
        ) -> $crate::__forward::Result<Vec<Option<$crate::__forward::Bytes>>> {
            $crate::Wraps::wrapped(self).get_meta_many(namespace, keys)
        }
    };
    (delete_meta) => {
        fn delete_meta(&self, namespace: &str, key: &str) -> $crate::__forward::Result<bool> {
            $crate::Wraps::wrapped(self).delete_meta(namespace, key)
        }
    };
    (list_meta) => {
        fn list_meta(
            &self,
            namespace: &str,
        ) -> $crate::__forward::Result<Vec<(String, $crate::__forward::Bytes)>> {
            $crate::Wraps::wrapped(self).list_meta(namespace)
        }
    };
    (write_meta) => {
        fn write_meta(
            &self,
            changes: Vec<$crate::__forward::MetaChange>,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).write_meta(changes)
        }
    };
    (meta_versions) => {
        fn meta_versions(
            &self,
            namespaces: &[&str],
        ) -> $crate::__forward::Result<Option<Vec<u64>>> {
            $crate::Wraps::wrapped(self).meta_versions(namespaces)
        }
    };
    (subscribe) => {
        fn subscribe(
            &self,
            set: u64,
            users: &[$crate::__forward::UserId],
        ) -> $crate::__forward::Result<u64> {
            $crate::Wraps::wrapped(self).subscribe(set, users)
        }
    };
    (unsubscribe) => {
        fn unsubscribe(
            &self,
            set: u64,
            users: &[$crate::__forward::UserId],
        ) -> $crate::__forward::Result<u64> {
            $crate::Wraps::wrapped(self).unsubscribe(set, users)
        }
    };
    (is_subscribed) => {
        fn is_subscribed(
            &self,
            set: u64,
            user: &$crate::__forward::UserId,
        ) -> $crate::__forward::Result<bool> {
            $crate::Wraps::wrapped(self).is_subscribed(set, user)
        }
    };
    (subscriber_count) => {
        fn subscriber_count(&self, set: u64) -> $crate::__forward::Result<u64> {
            $crate::Wraps::wrapped(self).subscriber_count(set)
        }
    };
    (subscriber_counts) => {
        fn subscriber_counts(&self, sets: &[u64]) -> $crate::__forward::Result<Vec<u64>> {
            $crate::Wraps::wrapped(self).subscriber_counts(sets)
        }
    };
    (subscribers) => {
        fn subscribers(
            &self,
            set: u64,
            after: Option<&$crate::__forward::UserId>,
            limit: usize,
        ) -> $crate::__forward::Result<Vec<$crate::__forward::UserId>> {
            $crate::Wraps::wrapped(self).subscribers(set, after, limit)
        }
    };
    (subscriber_page) => {
        fn subscriber_page(
            &self,
            set: u64,
            after: Option<&$crate::__forward::UserId>,
            limit: usize,
            page: &mut $crate::__forward::UserPage,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).subscriber_page(set, after, limit, page)
        }
    };
    (user_sets) => {
        fn user_sets(
            &self,
            user: &$crate::__forward::UserId,
            limit: usize,
        ) -> $crate::__forward::Result<Vec<u64>> {
            $crate::Wraps::wrapped(self).user_sets(user, limit)
        }
    };
    (drop_set) => {
        fn drop_set(&self, set: u64) -> $crate::__forward::Result<u64> {
            $crate::Wraps::wrapped(self).drop_set(set)
        }
    };
    (subscribe_events) => {
        fn subscribe_events(
            &self,
            sink: $crate::__forward::EventSink,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).subscribe_events(sink)
        }
    };
    (claim_owned) => {
        fn claim_owned(
            &self,
            queue: &$crate::__forward::QueueName,
            now_ms: $crate::__forward::UnixMs,
            max: usize,
            visibility_ms: u64,
        ) -> $crate::__forward::Result<$crate::__forward::ClaimBatch> {
            $crate::Wraps::wrapped(self).claim_owned(queue, now_ms, max, visibility_ms)
        }
    };
    (sweep) => {
        fn sweep(&self) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).sweep()
        }
    };
    (next_due_owned_ms) => {
        fn next_due_owned_ms(
            &self,
            queue: &$crate::__forward::QueueName,
        ) -> $crate::__forward::Result<Option<$crate::__forward::UnixMs>> {
            $crate::Wraps::wrapped(self).next_due_owned_ms(queue)
        }
    };
    (take_rate_tokens) => {
        fn take_rate_tokens(
            &self,
            queue: &$crate::__forward::QueueName,
            want: u64,
            rate_per_s: f64,
            burst: f64,
        ) -> $crate::__forward::Result<Option<u64>> {
            $crate::Wraps::wrapped(self).take_rate_tokens(queue, want, rate_per_s, burst)
        }
    };
    (return_rate_tokens) => {
        fn return_rate_tokens(
            &self,
            queue: &$crate::__forward::QueueName,
            count: u64,
            rate_per_s: f64,
            burst: f64,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).return_rate_tokens(queue, count, rate_per_s, burst)
        }
    };
    (reserve_in_flight) => {
        fn reserve_in_flight(
            &self,
            queue: &$crate::__forward::QueueName,
            want: u64,
            cap: u64,
            now_ms: $crate::__forward::UnixMs,
            until_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<Option<$crate::__forward::InFlightRoom>> {
            $crate::Wraps::wrapped(self).reserve_in_flight(queue, want, cap, now_ms, until_ms)
        }
    };
    (settle_in_flight) => {
        fn settle_in_flight(
            &self,
            queue: &$crate::__forward::QueueName,
            room: &$crate::__forward::InFlightRoom,
            leases: &[($crate::__forward::LeaseId, $crate::__forward::UnixMs)],
            now_ms: $crate::__forward::UnixMs,
        ) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).settle_in_flight(queue, room, leases, now_ms)
        }
    };
    (owns) => {
        fn owns(&self, key: &str) -> bool {
            $crate::Wraps::wrapped(self).owns(key)
        }
    };
    (flush) => {
        fn flush(&self) -> $crate::__forward::Result<()> {
            $crate::Wraps::wrapped(self).flush()
        }
    };
    (delivery_is_quick) => {
        fn delivery_is_quick(&self) -> bool {
            $crate::Wraps::wrapped(self).delivery_is_quick()
        }
    };
    (claim_is_quick) => {
        fn claim_is_quick(
            &self,
            queue: &$crate::__forward::QueueName,
            now_ms: $crate::__forward::UnixMs,
        ) -> bool {
            $crate::Wraps::wrapped(self).claim_is_quick(queue, now_ms)
        }
    };
    (reads_are_quick) => {
        fn reads_are_quick(&self) -> bool {
            $crate::Wraps::wrapped(self).reads_are_quick()
        }
    };
    (health) => {
        fn health(&self) -> $crate::__forward::StoreHealth {
            $crate::Wraps::wrapped(self).health()
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Wraps;
    use crate::{MemoryStore, Store};
    use belfry_core::{NewTask, QueueName};
    use bytes::Bytes;

    /// Forwards every method, so each arm of the macro is compiled against the trait.
    struct Everything(MemoryStore);

    impl Wraps for Everything {
        fn wrapped(&self) -> &dyn Store {
            &self.0
        }
    }

    impl Store for Everything {
        forward_store_calls!(
            put_queue,
            get_queue,
            list_queues,
            delete_queue,
            put,
            get,
            get_by_key,
            cancel,
            reschedule,
            claim,
            ack,
            ack_many,
            nack,
            extend,
            dead_letter,
            list_dead,
            redrive,
            counts,
            forecast,
            next_due_ms,
            put_meta,
            get_meta,
            get_meta_many,
            delete_meta,
            list_meta,
            write_meta,
            meta_versions,
            subscribe,
            unsubscribe,
            is_subscribed,
            subscriber_count,
            subscriber_counts,
            subscribers,
            subscriber_page,
            user_sets,
            drop_set,
            subscribe_events,
            claim_owned,
            sweep,
            next_due_owned_ms,
            take_rate_tokens,
            return_rate_tokens,
            reserve_in_flight,
            settle_in_flight,
            owns,
            flush,
            delivery_is_quick,
            claim_is_quick,
            reads_are_quick,
            health,
        );
    }

    #[test]
    fn forwarded_calls_reach_the_wrapped_store() {
        let store = Everything(MemoryStore::new());
        let queue = QueueName::new("q").unwrap();
        assert!(store.put_queue(&queue, Bytes::from_static(b"{}")).unwrap());
        let task = NewTask::new(queue.clone(), 1_000, Bytes::from_static(b"x"));
        store.put(vec![task]).unwrap();
        assert_eq!(store.0.counts(&queue, 0).unwrap().pending, 1);
        assert_eq!(store.next_due_ms(&queue).unwrap(), Some(1_000));
        let batch = store.claim(&queue, 1_000, 10, 60_000).unwrap();
        assert_eq!(batch.leased.len(), 1);
        assert_eq!(store.0.counts(&queue, 1_000).unwrap().in_flight, 1);
    }
}
