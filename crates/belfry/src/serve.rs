//! `belfry serve`: open the store, start the server, stop in order on SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use belfry_server::Server;
use belfry_store::{Engine, EngineOptions, MemoryStore, Store};
use belfry_store_redis::RedisStore;

use crate::config::{Settings, StoreKind};

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let signal = shutdown_signal()?;
    tokio::pin!(signal);
    tracing::info!(node_id = %settings.server.node_id, "belfry starting");
    fit_open_files_limit(
        settings.server.http_connections_max,
        settings.server.http_listen_backlog as usize,
    );
    // Opening the store can take long (a big log to replay, a Redis that does not answer): a
    // signal meanwhile stops the start at once. The process exits rather than returns, since
    // the runtime would wait for the blocking open to finish; stopping it half-way is safe,
    // as a crash there is.
    let store = tokio::select! {
        store = open_store(&settings) => store?,
        () = &mut signal => {
            tracing::warn!("stopped while opening the store, before serving");
            std::process::exit(0);
        }
    };
    let mut builder = Server::builder(settings.server.clone(), store)
        .connections(settings.connections.clone())
        .auth(settings.auth.clone())
        .open_beyond_loopback(settings.allow_unauthenticated)
        // The web console at /console/: static files that call the API with the operator's token.
        .merge(belfry_console::router());
    if let Some((cert, key)) = &settings.tls {
        builder = builder.tls(belfry_server::listener::tls::load(cert, key)?);
    }
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let handle = tokio::select! {
        handle = builder.start() => handle.context("start the server")?,
        () = &mut signal => {
            tracing::warn!("stopped while starting the server (recovery), before serving");
            std::process::exit(0);
        }
    };
    if let Some((cert, _)) = &settings.tls {
        belfry_server::listener::tls::announce_dates(cert);
    }
    if matches!(settings.store, StoreKind::Redis(_)) {
        belfry_store_redis::ownership::describe_metrics();
    }
    let data = match &settings.store {
        StoreKind::Engine => format!("data in {}", settings.data_dir.display()),
        StoreKind::Memory => {
            "data in memory only (--store memory): nothing survives a restart".into()
        }
        StoreKind::Redis(target) => format!(
            "data in {target} (namespace {:?}), node id {}",
            settings.redis.namespace, settings.server.node_id
        ),
    };
    tracing::info!(
        "belfry listening on {scheme}://{}, {data}",
        handle.local_addr()
    );

    signal.await;
    handle.stop().await.context("shut down")?;
    Ok(())
}

/// Raises the open-files limit to its hard limit, so that the connection cap applies before
/// descriptors run out, and says so; warns when even that is too low for the cap.
fn fit_open_files_limit(connections_max: usize, waiting_max: usize) {
    match belfry_server::listener::open_files::raise_soft_limit() {
        Ok(files) => {
            if files.soft > files.before {
                tracing::info!(
                    "raised the open-files limit from {} to {} (its hard limit)",
                    files.before,
                    files.soft
                );
            }
            if let Some(shortfall) = files.shortfall(connections_max, waiting_max) {
                tracing::warn!("{shortfall}");
            }
        }
        Err(error) => tracing::warn!(%error, "read or raise the open-files limit"),
    }
}

/// Opens the configured store. Opening blocks (the engine replays its log; Redis connects and
/// checks the cluster's slots, bounded by `redis.connect_timeout`), so it runs off the async
/// workers.
async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match &settings.store {
        StoreKind::Engine => {
            let dir = settings.data_dir.clone();
            tracing::info!("opening the storage engine in {}", dir.display());
            let options = EngineOptions {
                fsync: settings.fsync,
                checkpoint_wal_bytes: settings.checkpoint_wal_bytes,
                free_space_reserve_bytes: settings.free_space_reserve_bytes,
                ..EngineOptions::default()
            };
            let engine = tokio::task::spawn_blocking(move || Engine::open(&dir, options))
                .await
                .context("open the storage engine")?
                .with_context(|| {
                    format!("open the storage engine in {}", settings.data_dir.display())
                })?;
            Arc::new(engine)
        }
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Redis(target) => {
            let (target, mut options) = (target.clone(), settings.redis.clone());
            // Every node on the store takes part in shard ownership under its node id.
            options.node_id = Some(settings.server.node_id.clone());
            // The target's Display hides any password.
            let named = target.to_string();
            tracing::info!("connecting to the Redis store at {named}");
            let store = tokio::task::spawn_blocking(move || RedisStore::connect(&target, options))
                .await
                .with_context(|| format!("connect to the Redis store at {named}"))?
                .with_context(|| format!("connect to the Redis store at {named}"))?;
            Arc::new(store)
        }
    };
    Ok(store)
}

/// Registers SIGTERM and SIGINT handlers now (before the store is opened, so an early signal
/// stops the start in order) and returns a future that completes on the first of them; SIGHUP
/// is ignored, with a warning. A second
/// one during the drain exits at once, with status 1: what was acknowledged is durable, and
/// deliveries cut short are sent again once their leases end, as after a crash.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
        // SIGHUP's default is to end the process on the spot (no drain, deliveries in flight
        // sent again), and tools send it expecting a reload (logrotate, config management).
        let mut hup = signal(SignalKind::hangup()).context("listen for SIGHUP")?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::warn!("SIGHUP received and ignored: belfry does not reload its configuration (restart it to apply a change; SIGTERM stops it with a drain)");
            }
        });
        Ok(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received; a second signal stops at once"),
                _ = int.recv() => tracing::info!("SIGINT received; a second signal stops at once"),
            }
            tokio::spawn(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tracing::warn!("a second signal: stopping now, without the rest of the drain (deliveries in flight are sent again once their leases end)");
                std::process::exit(1);
            });
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
