//! `belfry serve`: open the store, start the server, stop in order on SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use belfry_server::Server;
use belfry_store::{Engine, EngineOptions, MemoryStore, Store};
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, StoreKind};

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = match settings.store {
        StoreKind::Engine => {
            let dir = settings.data_dir.clone();
            let options = EngineOptions {
                fsync: settings.fsync,
                ..EngineOptions::default()
            };
            // Opening replays the log: blocking work, off the async workers.
            let engine = tokio::task::spawn_blocking(move || Engine::open(&dir, options))
                .await
                .context("open the storage engine")?
                .with_context(|| {
                    format!("open the storage engine in {}", settings.data_dir.display())
                })?;
            Arc::new(engine)
        }
        StoreKind::Memory => Arc::new(MemoryStore::new()),
    };
    let handle = Server::builder(settings.server.clone(), store)
        .start()
        .await
        .context("start the server")?;
    let data = match settings.store {
        StoreKind::Engine => format!("data in {}", settings.data_dir.display()),
        StoreKind::Memory => {
            "data in memory only (--store memory): nothing survives a restart".into()
        }
    };
    tracing::info!("belfry listening on http://{}, {data}", handle.local_addr());

    let shutdown = CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    shutdown.cancelled().await;
    handle.stop().await.context("shut down")?;
    Ok(())
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn signals(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => tracing::info!("SIGINT received"),
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "listen for SIGTERM; only SIGINT will stop the server");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    shutdown.cancel();
}
