//! Belfry's server: the HTTP API, pull leases, push dispatch, schedules, queue policies
//! (pause, rate, in-flight caps, retries), metrics and an orderly shutdown.
//!
//! Layers: `api` (HTTP and JSON, nothing else knows them) → `service` (operations, split by
//! job) → `shared` (store, clock, queues, store-call admission) → `belfry_store::Store` (run on
//! the blocking pool). `claim` is the one path tasks leave the store by; `outcome` the one
//! decision of what becomes of an attempt; `dispatch` delivers every push queue through its
//! sink; `schedules` turns firings into tasks; `follow` keeps a node in step with the others
//! on a shared store. `ServerBuilder` composes all of them.
//!
//! Shutdown happens in a fixed order: stop accepting connections and stop claiming (long-polls
//! return empty, the dispatcher and the schedule runner stop) → wait for in-flight HTTP
//! requests and push deliveries up to the grace period → `Store::flush` → return.

pub mod api;
pub mod auth;
mod claim;
mod coalesce;
pub mod config;
pub mod dispatch;
mod follow;
pub mod listener;
// Shared with the sinks, which throttle their failure lines the same way.
use belfry_core::log_every;
mod low_priority;
mod metric_help;
pub mod metrics;
mod missing_queue;
pub mod outcome;
pub mod queues;
pub mod reminders;
mod runner_plan;
pub mod schedules;
pub mod service;
pub mod shared;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use belfry_core::{Clock, SystemClock};
use belfry_sinks::{SinkFactory, StandardSinks, TargetPolicy};
use belfry_store::Store;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{InvalidConfig, ServerConfig};
pub use schedules::Schedules;
pub use service::Service;
pub use shared::ServiceError;

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
    #[error("fire the schedules due at start-up: {0}")]
    Schedules(belfry_schedule::ScheduleServiceError),
    #[error("build the sinks: {0}")]
    Sinks(belfry_sinks::SinkError),
    #[error("flush the store on shutdown: {0}")]
    Flush(service::ServiceError),
    #[error("server task failed: {0}")]
    Join(String),
    #[error(
        "listen: {0} is reachable from other machines, and no token is configured or was \
         made through the API, so anyone who can reach it could create, read and cancel tasks. \
         Add a token (`belfry token create --offline --scope admin` prints one and the \
         [[auth.tokens]] lines to add, or set BELFRY_ADMIN_TOKEN), or opt out with \
         `allow_unauthenticated = true` under [auth]"
    )]
    Unprotected(SocketAddr),
}

/// Builds and starts a server: the API, the dispatcher and its sinks, and the schedules.
pub struct ServerBuilder {
    config: ServerConfig,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    sinks: Option<Arc<dyn SinkFactory>>,
    connections: belfry_sinks::Connections,
    extra_routes: Vec<Router>,
    auth: Arc<auth::Auth>,
    /// Whether an API without any token may be served on a non-loopback address.
    open_beyond_loopback: bool,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// Entry point for tests and embedders: `Server::builder(config, store).start().await`.
pub struct Server;

impl Server {
    pub fn builder(config: ServerConfig, store: Arc<dyn Store>) -> ServerBuilder {
        ServerBuilder {
            config,
            store,
            clock: Arc::new(SystemClock::new()),
            sinks: None,
            connections: belfry_sinks::Connections::empty(),
            extra_routes: Vec::new(),
            auth: Arc::new(auth::Auth::none()),
            open_beyond_loopback: false,
            tls: None,
        }
    }
}

impl ServerBuilder {
    /// Time source (a `ManualClock` in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where push queues deliver: by default [`StandardSinks`] (webhooks under the server's
    /// target policy); tests pass a factory of scripted sinks, the binary one with the
    /// configured broker connections.
    pub fn sinks(mut self, sinks: Arc<dyn SinkFactory>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// The broker connections the operator declared (`[connections.NAME]`), which stream
    /// deliveries name. Used by the standard sinks; ignored when `sinks` replaces them.
    pub fn connections(mut self, connections: belfry_sinks::Connections) -> Self {
        self.connections = connections;
        self
    }

    /// The bearer tokens every API call must carry (see [`auth`]), besides those made
    /// through the API (kept in the store, loaded at start). With none of either the API is
    /// open, which [`start`](Self::start) refuses on a non-loopback address unless
    /// [`open_beyond_loopback`](Self::open_beyond_loopback) allows it.
    pub fn auth(mut self, auth: impl Into<Arc<auth::Auth>>) -> Self {
        self.auth = auth.into();
        self
    }

    /// Serve an API without any token on a non-loopback address (`[auth]
    /// allow_unauthenticated`).
    pub fn open_beyond_loopback(mut self, allowed: bool) -> Self {
        self.open_beyond_loopback = allowed;
        self
    }

    /// Serve HTTPS with this configuration (see [`listener::tls::load`]) instead of HTTP.
    pub fn tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// More routes served beside API v1 (console, ...). They must not overlap.
    pub fn merge(mut self, routes: Router) -> Self {
        self.extra_routes.push(routes);
        self
    }

    /// Fires the schedules due at start-up, loads the queues, binds the listener and starts
    /// serving, dispatching and firing schedules. Returns once the server accepts connections.
    pub async fn start(self) -> Result<ServerHandle, ServerError> {
        self.config.validate()?;
        metrics::handle();
        metric_help::describe();
        metrics::register_at_zero();
        let sinks = match self.sinks {
            Some(sinks) => sinks,
            None => standard_sinks(&self.config, self.connections)?,
        };
        let service = Arc::new(
            Service::new(self.config.clone(), self.store, self.clock, sinks)
                .map_err(ServerError::Load)?,
        );
        let Recovered {
            inbox,
            schedules,
            reminders,
        } = recover(&service).await?;
        service.load_queues().await.map_err(ServerError::Load)?;
        // After `recover` made the inbox (a token made on another node meanwhile is heard),
        // before binding: an open API beyond loopback is refused, counting the tokens made
        // through the API.
        let tokens = load_tokens(&service, &self.auth)?;
        check_exposure(&self.auth, self.config.listen, self.open_beyond_loopback)?;
        let (listener, local_addr) = bind_listener(&self.config)?;
        let mut router = api::router(service.clone())
            .merge(api::schedules::router(schedules.state()))
            .merge(api::reminders::router(reminders.state()))
            .merge(api::tokens::router(tokens.clone()));
        for extra in self.extra_routes {
            router = router.merge(extra);
        }
        let router = api::finish(
            router,
            self.config.request_bytes_max,
            Duration::from_millis(self.config.http_body_read_timeout_ms),
            self.auth,
        );
        let shutdown = CancellationToken::new();
        let background = TaskTracker::new();
        service.dispatcher.start();
        background.spawn(schedules.runner());
        background.spawn(reminders.runner());
        background.spawn(follower(inbox, &service, &schedules, &reminders, tokens).run());
        background.spawn(service.clone().refresh_gauges());
        service.set_ready();
        let task = tokio::spawn(serve(
            service.clone(),
            listener,
            router,
            self.tls,
            shutdown.clone(),
            background,
        ));
        Ok(ServerHandle {
            local_addr,
            service,
            schedules,
            reminders,
            shutdown,
            task,
        })
    }
}

/// Webhooks under the configured target policy, and the operator's broker connections.
fn standard_sinks(
    config: &ServerConfig,
    connections: belfry_sinks::Connections,
) -> Result<Arc<dyn SinkFactory>, ServerError> {
    let policy = TargetPolicy {
        allow_private: config.allow_private_targets,
    };
    let standard = StandardSinks::with_webhook_ca(
        policy,
        config.dispatch_per_target_max,
        connections,
        config.webhook_ca_file.as_deref(),
    )
    .map_err(ServerError::Sinks)?;
    Ok(Arc::new(standard))
}

/// What start-up recovered before anything is dispatched or served.
struct Recovered {
    inbox: Arc<follow::Inbox>,
    schedules: Schedules,
    reminders: reminders::Reminders,
}

/// Subscribes to other nodes' changes, then fires the schedules due and replays the fan-out
/// step a crash interrupted: both must happen before anything is dispatched or served.
async fn recover(service: &Arc<Service>) -> Result<Recovered, ServerError> {
    // Before anything is read from the store: a change another node makes while this one
    // starts waits in the inbox, and is followed once the runners and queues are up.
    let inbox = Arc::new(follow::Inbox::default());
    service
        .shared()
        .store
        .subscribe_events(inbox.sink())
        .map_err(|e| ServerError::Load(service::ServiceError::Store(e)))?;
    let thread_failed = |what: &str, e: std::io::Error| {
        ServerError::Load(service::ServiceError::Internal(format!(
            "start the {what} thread: {e}"
        )))
    };
    // Exactly-once firings need this tick before anything is dispatched or served.
    let schedules = Schedules::new(service.shared().clone())
        .map_err(|e| thread_failed("schedule-create writer", e))?;
    schedules
        .tick_at_startup()
        .await
        .map_err(ServerError::Schedules)?;
    // Likewise: a fan-out step a crash interrupted is replayed before dispatching.
    let reminders = reminders::Reminders::new(service.shared().clone())
        .map_err(|e| thread_failed("fan-out", e))?;
    reminders
        .step_at_startup()
        .await
        .map_err(ServerError::Load)?;
    Ok(Recovered {
        inbox,
        schedules,
        reminders,
    })
}

fn bind_listener(
    config: &ServerConfig,
) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let failed = |source| ServerError::Bind {
        addr: config.listen,
        source,
    };
    let listener = bind(config.listen, config.http_listen_backlog).map_err(failed)?;
    let local_addr = listener.local_addr().map_err(failed)?;
    Ok((listener, local_addr))
}

/// The tokens made through the API, loaded beside the configured ones.
/// Refuses an open API (no token configured or made through the API) on an address other
/// machines can reach, unless allowed; says in the log who may call it otherwise.
fn check_exposure(auth: &auth::Auth, listen: SocketAddr, allowed: bool) -> Result<(), ServerError> {
    if auth.enabled() {
        return Ok(());
    }
    if listen.ip().is_loopback() {
        tracing::info!("no bearer token is configured: any process on this machine may call the API at {listen}, but web pages in its browsers may not write to it (see [auth] in config/belfry.example.toml)");
    } else if allowed {
        tracing::warn!("no bearer token is configured (allow_unauthenticated): anyone who can reach {listen} may call the API");
    } else {
        return Err(ServerError::Unprotected(listen));
    }
    Ok(())
}

fn load_tokens(
    service: &Arc<Service>,
    auth: &Arc<auth::Auth>,
) -> Result<Arc<api::tokens::TokensState>, ServerError> {
    let loaded = api::tokens::load(&*service.shared().store, auth)
        .map_err(|e| ServerError::Load(service::ServiceError::Store(e)))?;
    if loaded > 0 {
        tracing::info!(tokens = loaded, "loaded the tokens made through the API");
    }
    Ok(Arc::new(api::tokens::TokensState {
        auth: auth.clone(),
        shared: service.shared().clone(),
        writes: Default::default(),
    }))
}

/// A running server.
pub struct ServerHandle {
    local_addr: SocketAddr,
    service: Arc<Service>,
    schedules: Schedules,
    reminders: reminders::Reminders,
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

    pub fn schedules(&self) -> &Schedules {
        &self.schedules
    }

    pub fn reminders(&self) -> &reminders::Reminders {
        &self.reminders
    }

    /// Wakes every long-poll, the dispatcher, the schedule runner and the reminder runner so
    /// they look at the clock again: tests call this after moving a `ManualClock`.
    pub fn wake_all(&self) {
        self.service.queues.wake_all();
        self.schedules.wake();
        self.reminders.wake();
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

/// The task that keeps this node in step with the others on a shared store (see `follow`),
/// over the parts it acts on.
fn follower(
    inbox: Arc<follow::Inbox>,
    service: &Arc<Service>,
    schedules: &Schedules,
    reminders: &reminders::Reminders,
    tokens: Arc<api::tokens::TokensState>,
) -> follow::Follower {
    let follow_tokens: follow::FollowTokens = Arc::new(move || {
        let tokens = tokens.clone();
        Box::pin(async move { api::tokens::follow(&tokens).await })
    });
    follow::Follower {
        inbox,
        service: service.clone(),
        schedules: schedules.clone(),
        reminders: reminders.clone(),
        tokens: (api::tokens::TOKENS_NAMESPACE, follow_tokens),
        heard: Default::default(),
    }
}

async fn serve(
    service: Arc<Service>,
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: CancellationToken,
    background: TaskTracker,
) -> Result<(), ServerError> {
    let http_shutdown = CancellationToken::new();
    let http = tokio::spawn(listener::serve(
        listener,
        router,
        listener_limits(&service.config),
        service.connections.clone(),
        http_shutdown.clone(),
        tls,
    ));
    shutdown.cancelled().await;

    // 0. Not ready any more, and 1. stop accepting and claiming.
    stop_taking_work(&service, &http_shutdown).await;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(service.config.shutdown_grace_ms);
    // 2. Let requests in progress finish (each is short once claiming stopped), up to the grace.
    let served = finish_requests(http, deadline).await;
    // 3. The dispatcher and the schedule runner have stopped claiming and firing; wait for
    //    deliveries already started and the runner's last tick.
    finish_background(&service, background, deadline).await;
    // 4. Make everything durable.
    service
        .blocking(|s| Ok(s.flush()?))
        .await
        .map_err(ServerError::Flush)?;
    tracing::info!("shutdown complete");
    served
}

/// The listener's limits, from the `[http]` settings.
fn listener_limits(config: &ServerConfig) -> listener::Limits {
    listener::Limits {
        connections_max: config.http_connections_max,
        connections_per_client_max: config.http_connections_per_client_cap(),
        header_read_timeout: Duration::from_millis(config.http_header_read_timeout_ms),
        idle_timeout: Duration::from_millis(config.http_idle_timeout_ms),
        // As many as the kernel's backlog holds: the listener takes them from it at the cap.
        waiting_max: config.http_listen_backlog as usize,
    }
}

/// The first two steps of a shutdown:
/// 0. Not ready any more: /readyz answers 503 shutting_down, and for `drain_delay` the server
///    goes on serving everything, so a load balancer that polls readiness stops sending before
///    connections are refused.
/// 1. Then stop accepting and stop claiming, together: the HTTP server stops taking
///    connections, long-polls return empty, the dispatcher and the schedule runner stop.
async fn stop_taking_work(service: &Service, http_shutdown: &CancellationToken) {
    service.set_draining();
    service
        .connections
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let drain_delay = Duration::from_millis(service.config.shutdown_drain_delay_ms);
    if !drain_delay.is_zero() {
        tracing::info!(
            delay_ms = drain_delay.as_millis() as u64,
            "shutting down: /readyz now answers shutting_down; still serving until the drain delay ends"
        );
        tokio::time::sleep(drain_delay).await;
    }
    service.stopping.cancel();
    http_shutdown.cancel();
    tracing::info!("shutting down: no new connections or claims; draining");
}

/// Waits for the HTTP server's requests in progress until `deadline`, then closes the rest.
async fn finish_requests(
    mut http: JoinHandle<()>,
    deadline: tokio::time::Instant,
) -> Result<(), ServerError> {
    tokio::select! {
        result = &mut http => match result {
            Ok(()) => Ok(()),
            Err(e) => Err(ServerError::Join(e.to_string())),
        },
        _ = tokio::time::sleep_until(deadline) => {
            tracing::warn!("HTTP requests still open at the end of the grace period; closing them");
            http.abort();
            Ok(())
        }
    }
}

/// Waits until `deadline` for push deliveries already started and for the background tasks
/// (the schedule runner's last tick), and says who was still holding the drain.
async fn finish_background(
    service: &Service,
    background: TaskTracker,
    deadline: tokio::time::Instant,
) {
    if !service.dispatcher.drain(deadline).await {
        tracing::warn!(
            in_flight = service.push_in_flight(),
            "push deliveries still running at the end of the grace period; their leases will expire and the tasks will be delivered again"
        );
    }
    background.close();
    if tokio::time::timeout_at(deadline, background.wait())
        .await
        .is_err()
    {
        tracing::warn!("the schedule runner's last tick outlived the grace period");
    }
}

/// Listens on `addr` with a backlog of `backlog` handshaken connections not yet accepted (the
/// kernel caps it at `net.core.somaxconn`). `TcpListener::bind` asks for 128, as the standard
/// library does, which a burst of re-opened connections overflows.
fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can bind while old connections of the
    // previous one are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An open API is refused beyond loopback unless allowed, and a token made through the
    /// API (loaded from the store before this check) protects it like a configured one.
    #[test]
    fn an_open_api_is_refused_beyond_loopback() {
        let public: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let open = auth::Auth::none();
        assert!(matches!(
            check_exposure(&open, public, false),
            Err(ServerError::Unprotected(_))
        ));
        assert!(check_exposure(&open, public, true).is_ok());
        assert!(check_exposure(&open, local, false).is_ok());
        let made = auth::Auth::none();
        made.add_made(auth::TokenEntry {
            name: "ops".into(),
            hash: auth::TokenHash::of("a-token-made-through-the-api"),
            scopes: vec![auth::Scope::Admin],
            rate: None,
        })
        .unwrap();
        assert!(check_exposure(&made, public, false).is_ok());
    }
}
