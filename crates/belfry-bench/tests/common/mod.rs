//! What the tests that run a scenario against a real belfry server share: the server crate
//! in this process, with the in-memory store, on the test's own runtime.

// Each test binary compiles its own copy and uses only some of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use belfry_bench::http::{HttpConn, Target};
use belfry_server::{Server, ServerConfig, ServerHandle};
use belfry_store::MemoryStore;
use http::Method;
use serde_json::Value;

/// A two-worker runtime, like the bench's.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A server on a free loopback port with `config` (its `listen` is replaced).
pub fn start_server(runtime: &tokio::runtime::Runtime, config: ServerConfig) -> ServerHandle {
    let config = ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..config
    };
    runtime.block_on(async {
        Server::builder(config, Arc::new(MemoryStore::new()))
            .start()
            .await
            .expect("server starts")
    })
}

/// `GET /v1/queues/{queue}`: the server's own view of the queue.
pub async fn queue_on_server(addr: SocketAddr, queue: &str) -> Value {
    let mut conn = HttpConn::connect(&Target::from_addr(addr)).await.unwrap();
    let body = conn
        .expect_success(
            Method::GET,
            &format!("/v1/queues/{queue}"),
            bytes::Bytes::new(),
        )
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}
