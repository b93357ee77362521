//! Stores that wrap another one: a fault-injecting store in a test, a store that announces
//! its writes to other nodes, a metrics wrapper. A wrapper implements [`ForwardingStore`]:
//! it names the store inside ([`ForwardingStore::wrapped`]) and writes only the methods it
//! changes; every other call goes to the wrapped store, defaults included (a wrapped
//! engine's own `subscriber_page` or `delivery_is_quick`, not the trait's generic ones).
//! Each such wrapper is a [`Store`] through the blanket impl below.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use belfry_core::NewTask;
//! use belfry_store::{MemoryStore, PutOutcome, Result, Store};
//!
//! /// Counts puts; everything else is the store inside.
//! struct CountingStore {
//!     inner: MemoryStore,
//!     puts: AtomicUsize,
//! }
//!
//! // Named by its path rather than imported: with both traits in scope, a call on the
//! // wrapper itself (`store.list_queues()`) would be ambiguous.
//! impl belfry_store::ForwardingStore for CountingStore {
//!     fn wrapped(&self) -> &dyn Store {
//!         &self.inner
//!     }
//!     fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>> {
//!         self.puts.fetch_add(1, Ordering::Relaxed);
//!         self.inner.put(tasks)
//!     }
//! }
//!
//! let store = CountingStore { inner: MemoryStore::new(), puts: AtomicUsize::new(0) };
//! assert!(store.list_queues().unwrap().is_empty());
//! ```
//!
//! A wrapper that wants one of `Store`'s composite defaults to go through its own methods
//! (`write_meta` as a `put_meta` per change, say) writes that method itself. The method
//! list lives here once, in the `forwarding!` call: a new `Store` method gets its line
//! there, and a required one that does not fails to compile.

use belfry_core::{LeaseId, NewTask, QueueName, Task, TaskId, UnixMs, UserId, UserPage};
use bytes::Bytes;

use crate::{
    ChangeOutcome, ClaimBatch, DeadAction, EventSink, InFlightRoom, LeaseOutcome, MetaChange,
    PutOutcome, QueueCounts, Result, Store, StoreHealth,
};

/// Writes [`ForwardingStore`], each method forwarding to the wrapped store by default, and
/// the blanket `Store` impl that calls them, from one list of `Store`'s methods.
macro_rules! forwarding {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        /// A store that wraps another: see the module's documentation. Every method
        /// forwards to [`ForwardingStore::wrapped`] unless the wrapper writes it.
        pub trait ForwardingStore: Send + Sync + 'static {
            /// The store the calls the wrapper does not change go to.
            fn wrapped(&self) -> &dyn Store;
            $(
                fn $name(&self $(, $arg: $ty)*) -> $ret {
                    self.wrapped().$name($($arg),*)
                }
            )*
        }

        impl<W: ForwardingStore> Store for W {
            $(
                fn $name(&self $(, $arg: $ty)*) -> $ret {
                    ForwardingStore::$name(self $(, $arg)*)
                }
            )*
        }
    };
}

forwarding! {
    fn put_queue(&self, queue: &QueueName, config: Bytes) -> Result<bool>;
    fn get_queue(&self, queue: &QueueName) -> Result<Option<Bytes>>;
    fn list_queues(&self) -> Result<Vec<(QueueName, Bytes)>>;
    fn delete_queue(&self, queue: &QueueName) -> Result<bool>;
    fn purge_queue(&self, queue: &QueueName) -> Result<bool>;
    fn put(&self, tasks: Vec<NewTask>) -> Result<Vec<PutOutcome>>;
    fn get(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<Option<Task>>;
    fn get_by_key(&self, queue: &QueueName, key: &str, now_ms: UnixMs) -> Result<Option<Task>>;
    fn cancel(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome>;
    fn cancel_many(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>>;
    fn list_tasks(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
        now_ms: UnixMs,
    ) -> Result<Vec<Task>>;
    fn reschedule(
        &self,
        queue: &QueueName,
        id: TaskId,
        due_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<ChangeOutcome>;
    fn claim(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch>;
    fn ack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    fn ack_many(
        &self,
        queue: &QueueName,
        acks: &[(TaskId, LeaseId)],
        now_ms: UnixMs,
    ) -> Result<Vec<LeaseOutcome>>;
    fn nack(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        retry_at_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    fn extend(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        lease_until_ms: UnixMs,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    fn dead_letter(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    fn dead_letter_untried(
        &self,
        queue: &QueueName,
        id: TaskId,
        lease: LeaseId,
        reason: &str,
        now_ms: UnixMs,
    ) -> Result<LeaseOutcome>;
    fn list_dead(
        &self,
        queue: &QueueName,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<Task>>;
    fn redrive(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs) -> Result<ChangeOutcome>;
    fn discard_dead(&self, queue: &QueueName, id: TaskId, now_ms: UnixMs)
        -> Result<ChangeOutcome>;
    fn settle_dead(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        action: DeadAction,
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>>;
    fn counts(&self, queue: &QueueName, now_ms: UnixMs) -> Result<QueueCounts>;
    fn forecast(
        &self,
        queue: &QueueName,
        from_ms: UnixMs,
        step_ms: u64,
        steps: usize,
    ) -> Result<Vec<u64>>;
    fn next_due_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>>;
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> Result<()>;
    fn get_meta(&self, namespace: &str, key: &str) -> Result<Option<Bytes>>;
    fn get_meta_many(&self, namespace: &str, keys: &[&str]) -> Result<Vec<Option<Bytes>>>;
    fn delete_meta(&self, namespace: &str, key: &str) -> Result<bool>;
    fn list_meta(&self, namespace: &str) -> Result<Vec<(String, Bytes)>>;
    fn write_meta(&self, changes: Vec<MetaChange>) -> Result<()>;
    fn meta_versions(&self, namespaces: &[&str]) -> Result<Option<Vec<u64>>>;
    fn subscribe(&self, set: u64, users: &[UserId]) -> Result<u64>;
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> Result<u64>;
    fn is_subscribed(&self, set: u64, user: &UserId) -> Result<bool>;
    fn subscriber_count(&self, set: u64) -> Result<u64>;
    fn subscriber_counts(&self, sets: &[u64]) -> Result<Vec<u64>>;
    fn subscribers(&self, set: u64, after: Option<&UserId>, limit: usize) -> Result<Vec<UserId>>;
    fn subscriber_page(
        &self,
        set: u64,
        after: Option<&UserId>,
        limit: usize,
        page: &mut UserPage,
    ) -> Result<()>;
    fn user_sets(&self, user: &UserId, limit: usize) -> Result<Vec<u64>>;
    fn drop_set(&self, set: u64) -> Result<u64>;
    fn subscribe_events(&self, sink: EventSink) -> Result<()>;
    fn claim_owned(
        &self,
        queue: &QueueName,
        now_ms: UnixMs,
        max: usize,
        visibility_ms: u64,
    ) -> Result<ClaimBatch>;
    fn sweep(&self) -> Result<()>;
    fn next_due_owned_ms(&self, queue: &QueueName) -> Result<Option<UnixMs>>;
    fn take_rate_tokens(
        &self,
        queue: &QueueName,
        want: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<Option<u64>>;
    fn return_rate_tokens(
        &self,
        queue: &QueueName,
        count: u64,
        rate_per_s: f64,
        burst: f64,
    ) -> Result<()>;
    fn reserve_in_flight(
        &self,
        queue: &QueueName,
        want: u64,
        cap: u64,
        now_ms: UnixMs,
        until_ms: UnixMs,
    ) -> Result<Option<InFlightRoom>>;
    fn settle_in_flight(
        &self,
        queue: &QueueName,
        room: &InFlightRoom,
        leases: &[(LeaseId, UnixMs)],
        now_ms: UnixMs,
    ) -> Result<()>;
    fn owns(&self, key: &str) -> bool;
    fn ownership(&self, key: &str) -> Option<String>;
    fn flush(&self) -> Result<()>;
    fn delivery_is_quick(&self) -> bool;
    fn claim_is_quick(&self, queue: &QueueName, now_ms: UnixMs) -> bool;
    fn reads_are_quick(&self) -> bool;
    fn shared_by_nodes(&self) -> bool;
    fn health(&self) -> StoreHealth;
}

#[cfg(test)]
mod tests {
    use crate::{MemoryStore, MetaChange, Store};
    use belfry_core::{NewTask, QueueName};
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Changes `put_meta` only: counts it.
    struct Counting {
        inner: MemoryStore,
        put_metas: AtomicUsize,
    }

    impl super::ForwardingStore for Counting {
        fn wrapped(&self) -> &dyn Store {
            &self.inner
        }
        fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> crate::Result<()> {
            self.put_metas.fetch_add(1, Ordering::SeqCst);
            self.inner.put_meta(namespace, key, value)
        }
    }

    #[test]
    fn calls_reach_the_wrapped_store_and_a_changed_method_is_the_wrappers() {
        let store = Counting {
            inner: MemoryStore::new(),
            put_metas: AtomicUsize::new(0),
        };
        let queue = QueueName::new("q").unwrap();
        assert!(store.put_queue(&queue, Bytes::from_static(b"{}")).unwrap());
        store
            .put(vec![NewTask::new(
                queue.clone(),
                1_000,
                Bytes::from_static(b"1"),
            )])
            .unwrap();
        assert_eq!(store.inner.counts(&queue, 0).unwrap().pending, 1);
        assert_eq!(store.next_due_ms(&queue).unwrap(), Some(1_000));
        assert_eq!(
            store.claim(&queue, 1_000, 10, 60_000).unwrap().leased.len(),
            1
        );
        assert_eq!(store.inner.counts(&queue, 1_000).unwrap().in_flight, 1);

        store.put_meta("ns", "a", Bytes::from_static(b"1")).unwrap();
        assert_eq!(store.put_metas.load(Ordering::SeqCst), 1);
        assert_eq!(
            store.inner.get_meta("ns", "a").unwrap().as_deref(),
            Some(&b"1"[..])
        );
        // Not written by the wrapper: `write_meta` goes to the wrapped store's own, past
        // the wrapper's `put_meta`.
        let change = MetaChange::put("ns", "b", Bytes::from_static(b"2"));
        store.write_meta(vec![change]).unwrap();
        assert_eq!(store.put_metas.load(Ordering::SeqCst), 1);
        assert_eq!(
            store.get_meta("ns", "b").unwrap().as_deref(),
            Some(&b"2"[..])
        );
    }
}
