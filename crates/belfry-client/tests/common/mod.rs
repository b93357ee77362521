//! What the client's tests share: a real server started in-process on an ephemeral loopback
//! port, on a manual clock, and a client for it.
#![allow(dead_code)] // each test file uses a different part

pub mod stall;

use std::sync::Arc;
use std::time::Duration;

use belfry_client::{Client, Error, ErrorCode, LeaseRequest, QueueSpec};
use belfry_core::{Clock, ManualClock};
use belfry_server::{Server, ServerConfig, ServerHandle};
use belfry_store::{MemoryStore, Store};

/// The manual clock's start: 2026-01-01T00:00:00Z.
pub const T0: u64 = 1_767_225_600_000;

pub struct Harness {
    pub handle: ServerHandle,
    pub clock: ManualClock,
    pub client: Client,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(test_config(), Arc::new(MemoryStore::new())).await
    }

    /// A server with `config` (see [`test_config`]) on `store`.
    pub async fn start_with(config: ServerConfig, store: Arc<dyn Store>) -> Self {
        let clock = ManualClock::new(T0);
        let handle = Server::builder(config, store)
            .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
            .start()
            .await
            .expect("server starts");
        let client = Client::new(&format!("http://{}", handle.local_addr())).unwrap();
        Harness {
            handle,
            clock,
            client,
        }
    }

    /// Moves the clock and lets the server notice.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.handle.wake_all();
    }

    pub async fn pull_queue(&self, name: &str) {
        self.client
            .put_queue(name, &QueueSpec::default())
            .await
            .unwrap();
    }

    /// Leases exactly one task that is due now.
    pub async fn lease_one(&self, queue: &str, visibility_ms: u64) -> belfry_client::Leased {
        let request = LeaseRequest {
            max: Some(10),
            visibility_ms: Some(visibility_ms),
            wait_ms: None,
        };
        let mut leased = self.client.lease(queue, &request).await.unwrap();
        assert_eq!(leased.len(), 1, "{leased:?}");
        leased.remove(0)
    }

    pub async fn stop(self) {
        self.handle.stop().await.unwrap();
    }
}

/// The tests' server settings: an ephemeral loopback port, webhooks to loopback allowed.
pub fn test_config() -> ServerConfig {
    ServerConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        allow_private_targets: true,
        ..ServerConfig::default()
    }
}

/// Waits (up to 10 s, real time) until `check` holds, or panics naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The error's code, or a panic that shows what came instead.
pub fn code<T: std::fmt::Debug>(result: Result<T, Error>) -> ErrorCode {
    match result {
        Err(Error::Api { code, .. }) => code,
        other => panic!("expected an API error, got {other:?}"),
    }
}
