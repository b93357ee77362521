//! The two nodes of `tests/nodes.rs` and the store they share: one `MemoryStore` behind a
//! wrapper per node ([`NodeStore`]) that announces every change to every node's event sink
//! and splits ownership between them, and the two servers on one manual clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{Clock, LeaseId, ManualClock, NewTask, QueueName, TaskId, UnixMs, UserId};
use belfry_server::auth::{Auth, Scope, TokenEntry, TokenHash};
use belfry_server::Server;
use belfry_store::{
    ChangeOutcome, ClaimBatch, EventSink, LeaseOutcome, MemoryStore, MetaChange, MetaEvent,
    PutOutcome, Store, StoreEvent,
};
use bytes::Bytes;
use parking_lot::Mutex;

use crate::common::faults::{RecordingSink, RecordingSinks};
use crate::common::{eventually, test_config, TestServer, T0};

/// Which node owns what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Node `hash(name) % 2` owns the queue or key.
    Parity,
    /// This node owns everything (the other one died).
    Only(usize),
}

/// What the nodes share: the store's contents, the event bus, the split.
pub struct Shared {
    pub inner: MemoryStore,
    pub sinks: Mutex<Vec<EventSink>>,
    pub split: Mutex<Split>,
    /// Schedule firing tasks each node created (not duplicates).
    pub firings_created: [AtomicUsize; 2],
    /// Reminder chunks each node created (not duplicates).
    pub chunks_created: [AtomicUsize; 2],
    /// Fallback sweeps each node ran: one per resync or recheck its follower handled.
    pub sweeps: [AtomicUsize; 2],
    /// Reads of a user's subscription list by each node: what a feed cache miss costs.
    pub user_set_reads: [AtomicUsize; 2],
    /// Listings of every reminder by each node: a reminder runner's full look.
    pub reminder_lists: [AtomicUsize; 2],
    /// Listings of every schedule by each node: a schedule runner's full tick.
    pub schedule_lists: [AtomicUsize; 2],
    /// Reads of one reminder by its key by each node.
    pub reminder_reads: [AtomicUsize; 2],
    /// Writes of each metadata namespace, counted as a networked store counts them.
    pub meta_writes: Mutex<std::collections::HashMap<String, u64>>,
    /// Events are lost (a failed `PUBLISH`); writes are still counted.
    pub muted: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Shared {
            inner: MemoryStore::new(),
            sinks: Mutex::new(Vec::new()),
            split: Mutex::new(Split::Parity),
            firings_created: Default::default(),
            chunks_created: Default::default(),
            sweeps: Default::default(),
            user_set_reads: Default::default(),
            reminder_lists: Default::default(),
            schedule_lists: Default::default(),
            reminder_reads: Default::default(),
            meta_writes: Default::default(),
            muted: Default::default(),
        })
    }

    /// Every node hears every change, its own included, as from a networked store.
    pub fn emit(&self, event: StoreEvent) {
        if self.muted.load(Ordering::SeqCst) {
            return;
        }
        let sinks = self.sinks.lock().clone();
        for sink in sinks {
            sink(event.clone());
        }
    }

    pub fn owner(&self, name: &str) -> usize {
        match *self.split.lock() {
            Split::Parity => owner_by_hash(name),
            Split::Only(node) => node,
        }
    }

    /// One more write of `namespace`; answers its count.
    pub fn counted(&self, namespace: &str) -> u64 {
        let mut writes = self.meta_writes.lock();
        let count = writes.entry(namespace.to_owned()).or_default();
        *count += 1;
        *count
    }

    /// Moves ownership and tells every node, as a store does after a takeover.
    pub fn set_split(&self, split: Split) {
        *self.split.lock() = split;
        self.emit(StoreEvent::OwnershipChanged);
    }
}

/// A stable hash (FNV-1a), so the test knows in advance which node owns a name.
pub fn owner_by_hash(name: &str) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % 2) as usize
}

/// A queue name (with `prefix`) that `node` owns under the parity split.
pub fn owned_by(node: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| owner_by_hash(name) == node)
        .expect("some name hashes to each node")
}

/// One node's view of the shared store.
pub struct NodeStore {
    pub node: usize,
    pub shared: Arc<Shared>,
}

impl NodeStore {
    pub fn inner(&self) -> &MemoryStore {
        &self.shared.inner
    }

    pub fn woke(&self, queue: &QueueName) {
        self.shared.emit(StoreEvent::Wake(queue.clone()));
    }

    pub fn subscriptions_changed(&self, changed: u64, users: &[UserId]) {
        if changed > 0 {
            self.shared
                .emit(StoreEvent::SubscriptionsChanged(Some(users.to_vec())));
        }
    }

    /// Announces a write of `keys` in `namespace` with its count, as the Redis store does.
    pub fn meta_changed(&self, namespace: &str, keys: Vec<String>) {
        let version = self.shared.counted(namespace);
        self.shared.emit(StoreEvent::MetaChanged(MetaEvent {
            namespace: namespace.to_owned(),
            keys: Some(keys),
            version: Some(version),
        }));
    }
}

pub type R<T> = belfry_store::Result<T>;

impl belfry_store::ForwardingStore for NodeStore {
    fn wrapped(&self) -> &dyn Store {
        self.inner()
    }

    fn put_queue(&self, queue: &QueueName, config: Bytes) -> R<bool> {
        let created = self.inner().put_queue(queue, config)?;
        self.shared.emit(StoreEvent::QueueChanged(queue.clone()));
        Ok(created)
    }
    fn delete_queue(&self, queue: &QueueName) -> R<bool> {
        let existed = self.inner().delete_queue(queue)?;
        self.shared.emit(StoreEvent::QueueChanged(queue.clone()));
        Ok(existed)
    }
    fn put(&self, tasks: Vec<NewTask>) -> R<Vec<PutOutcome>> {
        let queues: Vec<QueueName> = tasks.iter().map(|t| t.queue.clone()).collect();
        let keys: Vec<String> = tasks
            .iter()
            .map(|t| t.idempotency_key.clone().unwrap_or_default())
            .collect();
        let outcomes = self.inner().put(tasks)?;
        for (outcome, key) in outcomes.iter().zip(&keys) {
            if matches!(outcome, PutOutcome::Created { .. }) {
                if key.starts_with("schedule:") {
                    self.shared.firings_created[self.node].fetch_add(1, Ordering::SeqCst);
                } else if key.starts_with("reminder:") {
                    self.shared.chunks_created[self.node].fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let mut woken: Vec<&QueueName> = queues.iter().collect();
        woken.dedup();
        for queue in woken {
            self.woke(queue);
        }
        Ok(outcomes)
    }
    fn reschedule(&self, q: &QueueName, id: TaskId, due: UnixMs, now: UnixMs) -> R<ChangeOutcome> {
        let outcome = self.inner().reschedule(q, id, due, now)?;
        self.woke(q);
        Ok(outcome)
    }
    fn nack(
        &self,
        q: &QueueName,
        id: TaskId,
        lease: LeaseId,
        at: UnixMs,
        now: UnixMs,
    ) -> R<LeaseOutcome> {
        let outcome = self.inner().nack(q, id, lease, at, now)?;
        self.woke(q);
        Ok(outcome)
    }
    fn redrive(&self, q: &QueueName, id: TaskId, now: UnixMs) -> R<ChangeOutcome> {
        let outcome = self.inner().redrive(q, id, now)?;
        self.woke(q);
        Ok(outcome)
    }
    fn put_meta(&self, namespace: &str, key: &str, value: Bytes) -> R<()> {
        self.inner().put_meta(namespace, key, value)?;
        self.meta_changed(namespace, vec![key.to_owned()]);
        Ok(())
    }
    fn delete_meta(&self, namespace: &str, key: &str) -> R<bool> {
        let existed = self.inner().delete_meta(namespace, key)?;
        self.meta_changed(namespace, vec![key.to_owned()]);
        Ok(existed)
    }
    fn meta_versions(&self, namespaces: &[&str]) -> R<Option<Vec<u64>>> {
        let writes = self.shared.meta_writes.lock();
        Ok(Some(
            namespaces
                .iter()
                .map(|ns| writes.get(*ns).copied().unwrap_or(0))
                .collect(),
        ))
    }
    fn write_meta(&self, changes: Vec<MetaChange>) -> R<()> {
        let mut written: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for change in &changes {
            let keys = written.entry(change.namespace.clone()).or_default();
            keys.push(change.key.clone());
        }
        self.inner().write_meta(changes)?;
        for (namespace, keys) in written {
            self.meta_changed(&namespace, keys);
        }
        Ok(())
    }
    // Subscriber changes are announced as the Redis store announces them.
    fn subscribe(&self, set: u64, users: &[UserId]) -> R<u64> {
        let changed = self.inner().subscribe(set, users)?;
        self.subscriptions_changed(changed, users);
        Ok(changed)
    }
    fn unsubscribe(&self, set: u64, users: &[UserId]) -> R<u64> {
        let changed = self.inner().unsubscribe(set, users)?;
        self.subscriptions_changed(changed, users);
        Ok(changed)
    }
    fn drop_set(&self, set: u64) -> R<u64> {
        let dropped = self.inner().drop_set(set)?;
        if dropped > 0 {
            self.shared.emit(StoreEvent::SubscriptionsChanged(None));
        }
        Ok(dropped)
    }
    fn user_sets(&self, user: &UserId, limit: usize) -> R<Vec<u64>> {
        self.shared.user_set_reads[self.node].fetch_add(1, Ordering::SeqCst);
        self.inner().user_sets(user, limit)
    }
    fn list_meta(&self, namespace: &str) -> R<Vec<(String, Bytes)>> {
        let lists = match namespace {
            belfry_reminders::REMINDERS_NAMESPACE => Some(&self.shared.reminder_lists),
            belfry_schedule::SCHEDULES_NAMESPACE => Some(&self.shared.schedule_lists),
            _ => None,
        };
        if let Some(lists) = lists {
            lists[self.node].fetch_add(1, Ordering::SeqCst);
        }
        self.inner().list_meta(namespace)
    }
    fn get_meta(&self, namespace: &str, key: &str) -> R<Option<Bytes>> {
        if namespace == belfry_reminders::REMINDERS_NAMESPACE {
            self.shared.reminder_reads[self.node].fetch_add(1, Ordering::SeqCst);
        }
        self.inner().get_meta(namespace, key)
    }
    /// One key at a time through [`get_meta`](Self::get_meta), so each reminder read counts.
    fn get_meta_many(&self, namespace: &str, keys: &[&str]) -> R<Vec<Option<Bytes>>> {
        keys.iter()
            .map(|key| Store::get_meta(self, namespace, key))
            .collect()
    }
    fn sweep(&self) -> R<()> {
        self.shared.sweeps[self.node].fetch_add(1, Ordering::SeqCst);
        self.inner().sweep()
    }
    fn shared_by_nodes(&self) -> bool {
        true
    }
    fn subscribe_events(&self, sink: EventSink) -> R<()> {
        self.shared.sinks.lock().push(sink);
        Ok(())
    }
    fn claim_owned(&self, q: &QueueName, now: UnixMs, max: usize, vis: u64) -> R<ClaimBatch> {
        if self.shared.owner(q.as_str()) != self.node {
            return Ok(ClaimBatch::default());
        }
        self.inner().claim(q, now, max, vis)
    }
    fn next_due_owned_ms(&self, q: &QueueName) -> R<Option<UnixMs>> {
        if self.shared.owner(q.as_str()) != self.node {
            return Ok(None);
        }
        self.inner().next_due_ms(q)
    }
    fn ownership(&self, key: &str) -> Option<String> {
        (self.shared.owner(key) == self.node).then(String::new)
    }
}

/// Two servers on one shared store and one manual clock, each delivering push queues into
/// its own recording sink.
pub struct Nodes {
    pub shared: Arc<Shared>,
    pub clock: ManualClock,
    pub servers: [TestServer; 2],
    pub sinks: [Arc<RecordingSink>; 2],
}

impl Nodes {
    pub async fn start() -> Nodes {
        Self::start_with(None).await
    }

    /// With auth on: each node holds the configured `admin` token (`None`: auth off).
    pub async fn start_with(admin: Option<&str>) -> Nodes {
        let shared = Shared::new();
        let clock = ManualClock::new(T0);
        let a = Self::node(&shared, &clock, 0, admin).await;
        let b = Self::node(&shared, &clock, 1, admin).await;
        Nodes {
            shared,
            clock,
            servers: [a.0, b.0],
            sinks: [a.1, b.1],
        }
    }

    pub async fn node(
        shared: &Arc<Shared>,
        clock: &ManualClock,
        node: usize,
        admin: Option<&str>,
    ) -> (TestServer, Arc<RecordingSink>) {
        let store: Arc<dyn Store> = Arc::new(NodeStore {
            node,
            shared: shared.clone(),
        });
        let sink = Arc::new(RecordingSink::default());
        let mut builder = Server::builder(test_config(), store.clone())
            .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
            .sinks(Arc::new(RecordingSinks(sink.clone())));
        if let Some(admin) = admin {
            let entry = TokenEntry {
                name: "admin".into(),
                hash: TokenHash::of(admin),
                scopes: vec![Scope::parse("admin").unwrap()],
                rate: None,
            };
            builder = builder.auth(Auth::new(vec![entry]).unwrap());
        }
        let handle = builder.start().await.expect("node starts");
        (TestServer::from_handle(handle, clock.clone(), store), sink)
    }

    /// Moves the shared clock and wakes both nodes' loops.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        for s in &self.servers {
            s.handle.wake_all();
        }
    }

    /// Announces `event` as the store would, and returns once `node` has handled it whole:
    /// its follower handles one batch at a time, so a second recheck, seen to start (its
    /// sweep), means the batch with `event` ended.
    pub async fn handled(&self, node: usize, event: StoreEvent) {
        for event in [event, StoreEvent::Recheck] {
            let before = self.shared.sweeps[node].load(Ordering::SeqCst);
            self.shared.emit(event);
            eventually("the follower takes the event", || async {
                (self.shared.sweeps[node].load(Ordering::SeqCst) > before).then_some(())
            })
            .await;
        }
    }

    pub fn delivered(&self) -> [usize; 2] {
        [self.sinks[0].count(), self.sinks[1].count()]
    }

    pub async fn stop(self) {
        for s in self.servers {
            s.handle.stop().await.expect("clean stop");
        }
    }
}
