//! The server's operations, between the API (which knows HTTP and JSON) and the `Store`
//! (which knows bytes on disk), split by job: `queues` (configuration and push attachment),
//! `tasks` (submit, read, cancel, reschedule), `dead` (dead letters), `leases` (pull
//! consumers).
//!
//! `Service` is the API's handle: the shared parts (`Deref` to [`Shared`]), the dispatcher it
//! attaches push queues to, and the submit coalescer. It depends on the dispatcher, never the
//! other way round: the dispatcher hears about queues through their wake-up hook.

mod cancel_many;
mod dead;
mod leases;
mod pages;
mod queues;
mod tasks;

use std::collections::HashSet;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use belfry_core::{Clock, QueueName, UnixMs};
use belfry_sinks::SinkFactory;
use belfry_store::Store;

use crate::config::ServerConfig;
use crate::dispatch::Dispatcher;
use crate::queues::{QueueRuntime, Queues};
use crate::shared::{Caller, Shared, StoreCalls};

pub use crate::shared::{Result, ServiceError};
pub use cancel_many::{CancelPick, CancelledMany, CANCEL_MANY_MAX};
pub use dead::{DeadPick, Settled};
pub use leases::NackResult;
pub use pages::PAGE_PAYLOAD_BYTES_MAX;
pub use queues::QueuePatch;

/// Dead letters listed per page at most.
pub const DEAD_PAGE_MAX: usize = 1_000;

/// Live tasks listed per page at most.
pub const TASK_PAGE_MAX: usize = 1_000;

pub struct Service {
    shared: Arc<Shared>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    /// Serialises queue creation, update and deletion.
    admin: tokio::sync::Mutex<()>,
    ready: AtomicBool,
    /// Set when shutdown begins (before the drain delay): `/readyz` says `shutting_down`.
    draining: AtomicBool,
    /// Single submits, coalesced into shared store calls.
    submits: crate::coalesce::Submits,
    /// The HTTP listener's connection counts.
    pub connections: Arc<crate::listener::ConnectionStats>,
}

impl Deref for Service {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Service {
    pub fn new(
        config: ServerConfig,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        sinks: Arc<dyn SinkFactory>,
    ) -> Result<Self> {
        let submits = crate::coalesce::Submits::start(&store)
            .map_err(|e| ServiceError::Internal(format!("start the submit writer thread: {e}")))?;
        let calls = StoreCalls::new(
            config.store_calls_in_flight_max,
            std::time::Duration::from_millis(config.store_admission_wait_ms),
            std::time::Duration::from_millis(config.store_call_timeout_ms),
        );
        let dispatcher = Dispatcher::new(sinks, move |on_wake| Shared {
            store,
            clock,
            config,
            queues: Queues::new(on_wake),
            calls,
            stopping: tokio_util::sync::CancellationToken::new(),
        });
        Ok(Service {
            shared: dispatcher.shared().clone(),
            dispatcher,
            admin: tokio::sync::Mutex::new(()),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            submits,
            connections: Arc::default(),
        })
    }

    /// The parts the dispatcher and the schedule runner share with the API.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.is_draining()
    }

    /// Shutdown has begun (the server may still serve during its drain delay).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst) || self.stopping.is_cancelled()
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Runs a store call of an API request on the blocking pool (`503 overloaded` when the
    /// store-call admission stays full).
    pub async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T> + Send + 'static,
    {
        self.shared.blocking(Caller::Api, f).await
    }

    /// Runs an ack or extend of an API request ([`Shared::delivery`]).
    pub async fn delivery<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T> + Send + 'static,
    {
        let quick = self.shared.store.delivery_is_quick();
        self.shared.delivery(Caller::Api, quick, f).await
    }

    /// The queue as this node serves it. On a store other nodes share, a queue this node
    /// has not heard of yet (made elsewhere a moment ago, its event still on the way or lost)
    /// is read from the store before the answer is "not found".
    pub async fn runtime(&self, queue: &QueueName) -> Result<Arc<QueueRuntime>> {
        match self.shared.runtime(queue) {
            Err(ServiceError::QueueNotFound(_)) if self.shared.store.shared_by_nodes() => {
                self.learn_queue(queue).await
            }
            known => known,
        }
    }

    /// What the push dispatcher has done so far.
    pub fn dispatch_stats(&self) -> crate::dispatch::DispatchStats {
        self.dispatcher.stats()
    }

    /// Tasks in flight in push deliveries, all queues together.
    pub fn push_in_flight(&self) -> usize {
        self.dispatcher.in_flight()
    }

    /// Refreshes per-queue gauges until shutdown: every queue's counts in one store call per
    /// refresh (one call per queue cost ten thousand blocking hand-offs every few seconds
    /// with ten thousand queues). A queue deleted since the last refresh has its gauges set to
    /// 0 (the exporter cannot drop a series), not left at their last values.
    pub async fn refresh_gauges(self: Arc<Self>) {
        let period = std::time::Duration::from_millis(self.config.metrics_refresh_ms);
        let mut shown: HashSet<QueueName> = HashSet::new();
        loop {
            let names: Vec<QueueName> = self.queues.all().iter().map(|r| r.name.clone()).collect();
            let now_ms = self.now_ms();
            let counted = self
                .shared
                .blocking(Caller::Internal, move |s| {
                    Ok(names
                        .into_iter()
                        .map(|name| {
                            let counts = s.counts(&name, now_ms);
                            (name, counts)
                        })
                        .collect::<Vec<_>>())
                })
                .await;
            match counted {
                Ok(all) => shown = show_queue_counts(all, shown, now_ms),
                Err(e) => tracing::warn!(error = %e, "refresh queue gauges"),
            }
            if let Some(handle) = crate::metrics::handle() {
                handle.run_upkeep();
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }
}

/// Sets the gauges of each queue counted at `now_ms`, and zeroes those of the queues `shown`
/// before that are gone now. Answers the queues shown now.
fn show_queue_counts(
    all: Vec<(QueueName, belfry_store::Result<belfry_store::QueueCounts>)>,
    mut before: HashSet<QueueName>,
    now_ms: UnixMs,
) -> HashSet<QueueName> {
    let mut shown = HashSet::with_capacity(all.len());
    for (name, counts) in all {
        match counts {
            Ok(counts) => {
                crate::metrics::queue_counts(name.as_str(), &counts, now_ms);
                before.remove(&name);
                shown.insert(name);
            }
            // Deleted while we counted: zeroed below if it was shown.
            Err(belfry_store::StoreError::QueueNotFound(_)) => {}
            Err(e) => {
                tracing::warn!(queue = %name, error = %e, "refresh queue gauges");
                // Its gauges keep their last values until it can be counted again.
                before.remove(&name);
                shown.insert(name);
            }
        }
    }
    for gone in before {
        let none = belfry_store::QueueCounts::default();
        crate::metrics::queue_counts(gone.as_str(), &none, now_ms);
    }
    shown
}
