//! Queue configuration: create, change, pause, delete, and attaching push queues to the
//! dispatcher.

use std::sync::Arc;

use belfry_core::{LatePolicy, QueueName, RetryPolicy};
use belfry_store::QueueCounts;

use super::{Result, Service, ServiceError};
use crate::queues::{Delivery, QueueConfig, QueueRuntime};
use crate::shared::Caller;

/// A change to a queue's configuration: `None` keeps the current value (or the default, for a
/// new queue).
#[derive(Debug, Clone, Default)]
pub struct QueuePatch {
    pub rate_per_s: Option<f64>,
    pub burst: Option<u32>,
    pub max_in_flight: Option<u32>,
    pub max_attempts: Option<u32>,
    pub backoff_initial_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
    pub delivery: Option<Delivery>,
    pub paused: Option<bool>,
    pub late_policy: Option<LatePolicy>,
}

impl QueuePatch {
    fn apply(self, base: &QueueConfig) -> QueueConfig {
        QueueConfig {
            rate_per_s: self.rate_per_s.unwrap_or(base.rate_per_s),
            burst: self.burst.unwrap_or(base.burst),
            max_in_flight: self.max_in_flight.unwrap_or(base.max_in_flight),
            retry: RetryPolicy {
                max_attempts: self.max_attempts.unwrap_or(base.retry.max_attempts),
                backoff_initial_ms: self
                    .backoff_initial_ms
                    .unwrap_or(base.retry.backoff_initial_ms),
                backoff_max_ms: self.backoff_max_ms.unwrap_or(base.retry.backoff_max_ms),
            },
            delivery: self.delivery.unwrap_or_else(|| base.delivery.clone()),
            paused: self.paused.unwrap_or(base.paused),
            late_policy: self.late_policy.unwrap_or(base.late_policy),
        }
    }
}

impl Service {
    /// Loads every stored queue. Called once at start-up, before the API serves.
    pub async fn load_queues(&self) -> Result<()> {
        let stored = self.blocking(|s| Ok(s.list_queues()?)).await?;
        for (name, bytes) in stored {
            let config = decode(&name, &bytes)?;
            self.follow_config(name, config);
        }
        Ok(())
    }

    /// Creates a queue or changes its configuration. Returns the new configuration, whether
    /// the queue was created, and for a push queue whose target could not be reached within
    /// `OPEN_CHECK_MS` or refused the connection, why (reported, not refused: a broker may
    /// come up, or its config be fixed, after the queue).
    pub async fn put_queue(
        &self,
        queue: QueueName,
        patch: QueuePatch,
    ) -> Result<(QueueConfig, bool, Option<belfry_sinks::OpenError>)> {
        let admin = self.admin.lock().await;
        let existing = self.queues.get(&queue);
        let base = existing
            .as_ref()
            .map(|r| (*r.config()).clone())
            .unwrap_or_default();
        let config = patch.apply(&base);
        config.validate()?;
        // Building the sink checks its spec (for a webhook: the URL against the SSRF policy,
        // the timeout and the secret) without connecting.
        if let Some(spec) = config.sink() {
            self.dispatcher
                .check(&queue, spec)
                .map_err(|e| refused(spec, e))?;
        }
        let encoded = config.encode();
        let name = queue.clone();
        self.blocking(move |s| Ok(s.put_queue(&name, encoded)?))
            .await?;
        let (_, created, attached) = self.apply_config(queue, config.clone());
        drop(admin);
        let sink = match attached {
            Ok(sink) => sink,
            Err(e) => {
                return Err(match config.sink() {
                    Some(spec) => refused(spec, e),
                    None => ServiceError::Internal(e.to_string()),
                })
            }
        };
        let unreachable = match sink {
            Some(sink) => check_reachable(sink).await,
            None => None,
        };
        Ok((config, created, unreachable))
    }

    /// Makes this node's runtime of `queue` follow `config`: creates it (and says so) or
    /// updates it, then attaches it to the dispatcher. The sink is rebuilt on every change so
    /// it never delivers with an old URL or secret; deliveries already started finish with
    /// the sink they began with. The one path by which a configuration takes effect: a local
    /// `PUT`, the start-up load, and a change another node made (see `crate::follow`).
    fn apply_config(&self, queue: QueueName, config: QueueConfig) -> Applied {
        let existing = self.queues.get(&queue);
        let created = existing.is_none();
        let runtime = match existing {
            Some(runtime) => {
                runtime.set_config(config);
                runtime
            }
            None => {
                let runtime = Arc::new(self.queues.runtime(queue, config, self.clock.monotonic()));
                self.queues.insert(runtime.clone());
                runtime
            }
        };
        let attached = self.dispatcher.attach(&runtime);
        (runtime, created, attached)
    }

    /// `apply_config` for a configuration this node did not write (the start-up load, another
    /// node's change). A stored sink the current configuration refuses (say, private targets
    /// are no longer allowed) must not stop the server: the queue keeps its tasks,
    /// undelivered, until it is reconfigured. An unchanged configuration changes nothing (its
    /// sink is not rebuilt).
    fn follow_config(&self, queue: QueueName, config: QueueConfig) {
        if let Some(runtime) = self.queues.get(&queue) {
            if *runtime.config() == config {
                return;
            }
        }
        let (runtime, _, attached) = self.apply_config(queue, config);
        if let Err(e) = attached {
            tracing::error!(queue = %runtime.name, error = %e, "start push delivery; the queue will not deliver until it is reconfigured");
        }
    }

    /// Stops this node serving `queue` (deleted here or on another node): no more push
    /// deliveries, and its long-polls wake to find it gone.
    fn forget_queue(&self, queue: &QueueName) -> Option<Arc<QueueRuntime>> {
        self.dispatcher.detach(queue);
        let runtime = self.queues.remove(queue);
        if let Some(runtime) = &runtime {
            runtime.wake();
        }
        runtime
    }

    /// Re-reads one queue's configuration from the store and follows it: created, changed or
    /// deleted on another node that shares the store.
    pub(crate) async fn sync_queue(&self, queue: QueueName) -> Result<()> {
        let _admin = self.admin.lock().await;
        let name = queue.clone();
        let stored = self
            .shared
            .blocking(Caller::Internal, move |s| Ok(s.get_queue(&name)?))
            .await?;
        match stored {
            Some(bytes) => self.follow_config(queue.clone(), decode(&queue, &bytes)?),
            None => drop(self.forget_queue(&queue)),
        }
        Ok(())
    }

    /// A queue missing here, read from the store (through the API's admission: an unknown
    /// name costs a caller one store read) and followed if another node made it. Found, it is
    /// read again under the admin lock (`sync_queue`), so a delete racing the first read is
    /// not undone; names that exist nowhere never wait for that lock.
    pub(crate) async fn learn_queue(&self, queue: &QueueName) -> Result<Arc<QueueRuntime>> {
        let name = queue.clone();
        let stored = self
            .shared
            .blocking(Caller::Api, move |s| Ok(s.get_queue(&name)?))
            .await?;
        if stored.is_none() {
            return Err(ServiceError::QueueNotFound(queue.clone()));
        }
        self.sync_queue(queue.clone()).await?;
        self.shared.runtime(queue)
    }

    /// Re-reads every queue's configuration from the store and follows it: queues created
    /// and changed elsewhere are served here, queues deleted elsewhere are forgotten. A
    /// configuration that cannot be decoded is reported and skipped, not fatal.
    pub(crate) async fn sync_all_queues(&self) -> Result<()> {
        let _admin = self.admin.lock().await;
        let stored = self
            .shared
            .blocking(Caller::Internal, |s| Ok(s.list_queues()?))
            .await?;
        let mut listed = std::collections::HashSet::with_capacity(stored.len());
        for (name, bytes) in stored {
            listed.insert(name.clone());
            match decode(&name, &bytes) {
                Ok(config) => self.follow_config(name, config),
                Err(e) => {
                    tracing::error!(queue = %name, error = %e, "follow a queue's stored configuration")
                }
            }
        }
        for runtime in self.queues.all() {
            if !listed.contains(&runtime.name) {
                self.forget_queue(&runtime.name);
            }
        }
        Ok(())
    }

    pub async fn set_paused(&self, queue: QueueName, paused: bool) -> Result<QueueConfig> {
        self.runtime(&queue).await?;
        let patch = QueuePatch {
            paused: Some(paused),
            ..QueuePatch::default()
        };
        let (config, created, _) = self.put_queue(queue.clone(), patch).await?;
        if created {
            // Deleted and recreated in between: undo, as pausing never creates a queue.
            self.delete_queue(queue.clone()).await?;
            return Err(ServiceError::QueueNotFound(queue));
        }
        Ok(config)
    }

    pub async fn queue_counts(&self, queue: &QueueName) -> Result<QueueCounts> {
        let name = queue.clone();
        let now_ms = self.now_ms();
        self.blocking(move |s| Ok(s.counts(&name, now_ms)?)).await
    }

    /// Drops every task of the queue and keeps the queue (`Store::purge_queue`). Answers what
    /// it held, counted just before (a task submitted meanwhile may be counted or not).
    pub async fn purge_queue(&self, queue: &QueueName) -> Result<QueueCounts> {
        let runtime = self.runtime(queue).await?;
        let name = queue.clone();
        let now_ms = self.now_ms();
        let (counts, existed) = self
            .blocking(move |s| {
                let counts = s.counts(&name, now_ms)?;
                Ok((counts, s.purge_queue(&name)?))
            })
            .await?;
        if !existed {
            return Err(ServiceError::QueueNotFound(queue.clone()));
        }
        // Its leases no longer hold its cap; its dispatch looks again, and finds nothing.
        runtime.purged();
        tracing::info!(
            queue = %queue,
            pending = counts.pending,
            in_flight = counts.in_flight,
            dead = counts.dead,
            "queue purged"
        );
        Ok(counts)
    }

    pub async fn delete_queue(&self, queue: QueueName) -> Result<bool> {
        let _admin = self.admin.lock().await;
        let runtime = self.forget_queue(&queue);
        let existed = self.blocking(move |s| Ok(s.delete_queue(&queue)?)).await?;
        Ok(existed || runtime.is_some())
    }
}

/// What `apply_config` did: the runtime, whether it was created, and the new sink (`None`
/// for a pull queue) or why it could not be built.
type Applied = (
    Arc<QueueRuntime>,
    bool,
    std::result::Result<Option<Arc<dyn belfry_sinks::Sink>>, belfry_sinks::SinkError>,
);

fn decode(name: &QueueName, bytes: &[u8]) -> Result<QueueConfig> {
    QueueConfig::decode(bytes).map_err(|e| {
        ServiceError::Internal(format!(
            "decode the stored configuration of queue {name}: {e}"
        ))
    })
}

/// How long creating or changing a push queue waits to learn whether its target answers.
pub const OPEN_CHECK_MS: u64 = 2_000;

/// Why the sink's target did not answer within `OPEN_CHECK_MS`, or refused, if it did.
async fn check_reachable(
    sink: std::sync::Arc<dyn belfry_sinks::Sink>,
) -> Option<belfry_sinks::OpenError> {
    let wait = std::time::Duration::from_millis(OPEN_CHECK_MS);
    match tokio::time::timeout(wait, sink.open()).await {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(belfry_sinks::OpenError::Unreachable(format!(
            "no answer within {OPEN_CHECK_MS} ms"
        ))),
    }
}

fn refused(spec: &belfry_sinks::SinkSpec, error: belfry_sinks::SinkError) -> ServiceError {
    let message = match error {
        // Already names its field: `delivery.subject: ...`.
        belfry_sinks::SinkError::InvalidDelivery { .. } => error.to_string(),
        other => format!("delivery: {other}"),
    };
    ServiceError::DeliveryRefused {
        sink: spec.kind(),
        message,
    }
}
