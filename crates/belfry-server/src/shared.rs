//! What every part of the server shares: the store, the clock, the configuration, the queues'
//! run-time state, and admission for store calls.
//!
//! Store calls may block on fsync, so every one runs on tokio's blocking pool, never on an
//! async worker. Two admissions bound them:
//! - API calls take a slot from `store_calls_in_flight_max`, waiting at most
//!   `store_admission_wait_ms` before `503 overloaded`: a flood of requests is refused, not
//!   queued without bound.
//! - The server's own work (dispatch claims, delivery outcomes, schedule ticks, gauges) takes
//!   a slot from a separate, smaller pool and waits for it: it is never refused, and API
//!   clients can never crowd it out.
//!
//! An API call also has a deadline, `store_call_timeout_ms`: a store that does not answer
//! within it (a Redis master that stopped answering, a disk that stalls) gets the request a
//! `503 store_unavailable`, not a hang. The call itself cannot be taken back: it runs on,
//! keeping its slot until it ends, so the slots still bound what is outstanding, and the
//! answer says that a retry (with an idempotency key) is the safe way on.

use std::sync::Arc;
use std::time::Duration;

use belfry_core::{Clock, QueueName, UnixMs};
use belfry_store::{Store, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::queues::{QueueRuntime, Queues};

/// Store calls of the server's own work running or queued at once. Dispatch claims are
/// bounded separately (`dispatch::CLAIMS_IN_FLIGHT_MAX`), delivery outcomes go through one
/// writer, and schedule ticks are one at a time, so this only needs room for those plus the
/// gauges; it keeps their share of the blocking pool bounded.
pub const INTERNAL_STORE_CALLS_MAX: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("task {0} does not exist in this queue")]
    TaskNotFound(belfry_core::TaskId),
    #[error("no task with idempotency key {0:?} in this queue")]
    KeyNotFound(String),
    #[error("the lease on task {0} no longer holds: it expired, the task was leased again, or the task has finished (GET it to see its state)")]
    LeaseExpired(belfry_core::TaskId),
    #[error("task {id} is {}, only scheduled tasks can be changed or cancelled", state.as_str())]
    NotScheduled {
        id: belfry_core::TaskId,
        state: belfry_core::TaskState,
    },
    #[error("task {id} is {}, only dead letters can be {}", state.as_str(), match action {
        belfry_store::DeadAction::Redrive => "redriven",
        belfry_store::DeadAction::Discard => "deleted",
    })]
    NotDead {
        id: belfry_core::TaskId,
        state: belfry_core::TaskState,
        action: belfry_store::DeadAction,
    },
    #[error("queue {0} delivers by push ({1}); leases are only for pull queues")]
    NotPullQueue(QueueName, &'static str),
    #[error("invalid queue configuration: {0}")]
    InvalidQueueConfig(#[from] crate::queues::InvalidQueueConfig),
    /// A push queue's delivery spec its sink refuses; `sink` is the spec's type, `message`
    /// names the field (`delivery.connection: ...`, `delivery: webhook url ...`).
    #[error("{message}")]
    DeliveryRefused { sink: &'static str, message: String },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the server is overloaded (too many storage calls in flight); retry shortly")]
    Overloaded,
    #[error("{0}")]
    Invalid(String),
    #[error("storage failed: {0}")]
    Store(StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::QueueNotFound(q) => ServiceError::QueueNotFound(q),
            StoreError::Invalid(m) => ServiceError::Invalid(m),
            other => ServiceError::Store(other),
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// Who is asking for a store call, which decides the admission it goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// An API request: refused with `Overloaded` when no slot frees up in time.
    Api,
    /// The server's own work: waits for its own pool, never refused.
    Internal,
}

/// The two admissions for store calls, and the API calls' deadline.
pub struct StoreCalls {
    api: Arc<Semaphore>,
    api_wait: Duration,
    api_deadline: Duration,
    internal: Arc<Semaphore>,
}

impl StoreCalls {
    pub fn new(api_max: usize, api_wait: Duration, api_deadline: Duration) -> Self {
        StoreCalls {
            api: Arc::new(Semaphore::new(api_max)),
            api_wait,
            api_deadline,
            internal: Arc::new(Semaphore::new(INTERNAL_STORE_CALLS_MAX)),
        }
    }

    /// A slot for one store call of `caller`, held until the permit is dropped (owned, so it
    /// can go with a call that outlives the request that made it).
    pub async fn admit(&self, caller: Caller) -> Result<OwnedSemaphorePermit> {
        match caller {
            Caller::Internal => self
                .internal
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ServiceError::ShuttingDown),
            Caller::Api => {
                // A free slot is taken at once, without arming a timer.
                if let Ok(permit) = self.api.clone().try_acquire_owned() {
                    return Ok(permit);
                }
                match tokio::time::timeout(self.api_wait, self.api.clone().acquire_owned()).await {
                    Ok(Ok(permit)) => Ok(permit),
                    Ok(Err(_closed)) => Err(ServiceError::ShuttingDown),
                    Err(_elapsed) => Err(ServiceError::Overloaded),
                }
            }
        }
    }

    /// How long an API request waits for its store call (`store_call_timeout_ms`).
    pub fn api_deadline(&self) -> Duration {
        self.api_deadline
    }
}

/// The error of an API store call past its deadline: transient (`503 store_unavailable`).
pub fn deadline_passed(deadline: Duration) -> StoreError {
    StoreError::Unavailable {
        detail: format!(
            "the store did not answer within {} ms (limits.store_call_timeout); the call may \
             still complete, so retry with an idempotency key",
            deadline.as_millis()
        ),
    }
}

/// The parts of the server that the API, the dispatcher and the schedule runner all use.
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: ServerConfig,
    pub queues: Queues,
    pub calls: StoreCalls,
    /// Cancelled when shutdown begins: long-polls return, the dispatcher stops claiming.
    pub stopping: CancellationToken,
}

impl Shared {
    pub fn now_ms(&self) -> UnixMs {
        self.clock.wall_ms()
    }

    /// Runs a store call on the blocking pool, after `caller`'s admission.
    /// An API call waits at most `store_call_timeout_ms` for it (then `Unavailable`); the
    /// server's own calls wait for their answer.
    pub async fn blocking<T, F>(&self, caller: Caller, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T> + Send + 'static,
    {
        let permit = self.calls.admit(caller).await?;
        let store = self.store.clone();
        let call = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&*store)
        });
        let joined = match caller {
            Caller::Internal => call.await,
            Caller::Api => {
                let deadline = self.calls.api_deadline();
                match tokio::time::timeout(deadline, call).await {
                    Ok(joined) => joined,
                    Err(_elapsed) => return Err(deadline_passed(deadline).into()),
                }
            }
        };
        joined.map_err(|e| ServiceError::Internal(format!("store call did not finish: {e}")))?
    }

    /// Runs a delivery call (claim, ack, extend), or the feed's read, after `caller`'s
    /// admission: on this task's worker when `quick` (the store said the call waits for no
    /// fsync, network or file read: `Store::delivery_is_quick`, `Store::claim_is_quick`; or
    /// for the feed, `Store::reads_are_quick` and fast reads lately), else on the blocking
    /// pool like [`Shared::blocking`]. A hand-off to the pool and back wakes two threads,
    /// which at 20k due/s cost the server more CPU than the calls themselves.
    pub async fn delivery<T, F>(&self, caller: Caller, quick: bool, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T> + Send + 'static,
    {
        if !quick {
            return self.blocking(caller, f).await;
        }
        let _permit = self.calls.admit(caller).await?;
        f(&*self.store)
    }

    pub fn runtime(&self, queue: &QueueName) -> Result<Arc<QueueRuntime>> {
        self.queues
            .get(queue)
            .ok_or_else(|| ServiceError::QueueNotFound(queue.clone()))
    }
}
