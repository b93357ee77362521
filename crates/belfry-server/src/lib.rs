//! Belfry's server: the HTTP API, pull leases, webhook dispatch, queue policies (pause, rate,
//! in-flight caps, retries), metrics and an orderly shutdown.
//!
//! Layers: `api` (HTTP and JSON, nothing else knows them) → `service` (operations and
//! dispatch policy) → `belfry_store::Store` (run on the blocking pool). `dispatcher` pushes
//! webhook queues; `queues` holds each queue's run-time state.
//!
//! Shutdown happens in a fixed order: stop accepting connections and stop claiming (long-polls
//! return empty, dispatchers exit) → wait for in-flight HTTP requests and webhook deliveries up
//! to the grace period → `Store::flush` → return.

pub mod api;
mod coalesce;
pub mod config;
mod dispatcher;
pub mod metrics;
pub mod queues;
pub mod schedules;
pub mod service;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use belfry_core::{Clock, SystemClock};
use belfry_store::Store;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{InvalidConfig, ServerConfig};
pub use service::Service;

/// Failures that stop the server from starting or stopping cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] InvalidConfig),
    #[error("listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("start: {0}")]
    Load(service::ServiceError),
    #[error("serve HTTP: {0}")]
    Serve(std::io::Error),
    #[error("flush the store on shutdown: {0}")]
    Flush(service::ServiceError),
    #[error("server task failed: {0}")]
    Join(String),
}

/// Builds and starts a server.
pub struct ServerBuilder {
    config: ServerConfig,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    extra_routes: Vec<Router>,
}

/// Entry point for tests and embedders: `Server::builder(config, store).start().await`.
pub struct Server;

impl Server {
    pub fn builder(config: ServerConfig, store: Arc<dyn Store>) -> ServerBuilder {
        ServerBuilder {
            config,
            store,
            clock: Arc::new(SystemClock::new()),
            extra_routes: Vec::new(),
        }
    }
}

impl ServerBuilder {
    /// Time source (a `ManualClock` in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// More routes served beside API v1 (schedules, console, ...). They must not overlap.
    pub fn merge(mut self, routes: Router) -> Self {
        self.extra_routes.push(routes);
        self
    }

    /// Loads the queues, binds the listener and starts serving. Returns once the server
    /// accepts connections.
    pub async fn start(self) -> Result<ServerHandle, ServerError> {
        self.config.validate()?;
        metrics::handle();
        let service = Arc::new(
            Service::new(self.config.clone(), self.store, self.clock).map_err(ServerError::Load)?,
        );
        service.load_queues().await.map_err(ServerError::Load)?;
        let listener = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: self.config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: self.config.listen,
            source,
        })?;
        let mut router = api::router(service.clone());
        for extra in self.extra_routes {
            router = router.merge(extra);
        }
        let router = api::finish(router);
        let shutdown = CancellationToken::new();
        service.set_ready();
        let task = tokio::spawn(serve(service.clone(), listener, router, shutdown.clone()));
        Ok(ServerHandle {
            local_addr,
            service,
            shutdown,
            task,
        })
    }
}

/// A running server.
pub struct ServerHandle {
    local_addr: SocketAddr,
    service: Arc<Service>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

impl ServerHandle {
    /// The address the API listens on (with the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Wakes every long-poll and dispatcher so they look at the clock again: tests call this
    /// after moving a `ManualClock`.
    pub fn wake_all(&self) {
        self.service.queues.wake_all();
    }

    /// Starts the shutdown sequence without waiting for it.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Waits until the server has stopped (after `shutdown`, or a fatal error).
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task
            .await
            .map_err(|e| ServerError::Join(e.to_string()))?
    }

    /// Shuts down and waits for the sequence to finish.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.shutdown();
        self.wait().await
    }
}

/// Serves with the system clock until `shutdown` is cancelled, then stops in order.
pub async fn run(
    config: ServerConfig,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let handle = Server::builder(config, store).start().await?;
    tracing::info!("belfry listening on http://{}", handle.local_addr());
    let stopper = handle.shutdown.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stopper.cancel();
    });
    handle.wait().await
}

async fn serve(
    service: Arc<Service>,
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let gauges = tokio::spawn(service.clone().refresh_gauges());
    let grace = Duration::from_millis(service.config.shutdown_grace_ms);

    // 1. Stop accepting and stop claiming, together: the HTTP server stops taking connections,
    //    long-polls return empty, dispatchers leave their loops.
    let stopping = service.stopping.clone();
    let signal = shutdown.clone();
    // Small answers go out at once rather than waiting on Nagle's algorithm.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set TCP_NODELAY");
        }
    });
    let http = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                signal.cancelled().await;
                stopping.cancel();
            })
            .await
    });
    shutdown.cancelled().await;
    tracing::info!("shutting down: no new connections or claims; draining");
    let deadline = tokio::time::Instant::now() + grace;

    // 2. Let requests in progress finish (each is short once claiming stopped), up to the grace.
    let mut http = http;
    let served = tokio::select! {
        result = &mut http => match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ServerError::Serve(e)),
            Err(e) => Err(ServerError::Join(e.to_string())),
        },
        _ = tokio::time::sleep_until(deadline) => {
            tracing::warn!("HTTP requests still open at the end of the grace period; closing them");
            http.abort();
            Ok(())
        }
    };

    // 3. Dispatchers have stopped claiming; wait for deliveries already started.
    service.dispatchers.close();
    service.deliveries.close();
    let _ = tokio::time::timeout_at(deadline, service.dispatchers.wait()).await;
    if tokio::time::timeout_at(deadline, service.deliveries.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = service.deliveries.len(),
            "webhook deliveries still running at the end of the grace period; their leases will expire and the tasks will be delivered again"
        );
    }
    gauges.abort();

    // 4. Make everything durable.
    service
        .blocking(|s| Ok(s.flush()?))
        .await
        .map_err(ServerError::Flush)?;
    tracing::info!("shutdown complete");
    served
}
