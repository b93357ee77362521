//! A real server on an ephemeral loopback port, a manual clock, an HTTP helper and a scripted
//! webhook receiver.
#![allow(dead_code)]

pub mod faults;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use belfry_core::{Clock, ManualClock};
use belfry_server::{Server, ServerConfig, ServerHandle};
use belfry_store::{MemoryStore, Store};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Notify;

/// Runs a test body, `async fn NAME(s: TestServer)`, once on the in-memory store and once
/// on the embedded engine: the tests `NAME::memory` and `NAME::engine`.
#[allow(unused_macros)]
macro_rules! both_stores {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn memory() {
                super::$name(crate::common::TestServer::start().await).await
            }
            #[tokio::test]
            async fn engine() {
                super::$name(crate::common::TestServer::start_engine().await).await
            }
        }
    };
}

/// The stable error code of an API error answer.
pub fn code(value: &Value) -> &str {
    value["error"]["code"].as_str().unwrap_or("<no code>")
}

/// Wall time the tests start at (2026-01-01T00:00:00Z).
pub const T0: u64 = 1_767_225_600_000;

/// How long a test polls a real server for an effect before failing.
pub const POLL_DEADLINE: Duration = Duration::from_secs(20);

pub struct TestServer {
    pub handle: ServerHandle,
    pub clock: ManualClock,
    pub store: Arc<dyn Store>,
    pub http: reqwest::Client,
    pub base: String,
    /// The engine's directory, when the server runs on the engine.
    _dir: Option<tempfile::TempDir>,
}

pub fn test_config() -> ServerConfig {
    ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        allow_private_targets: true,
        payload_bytes_max: 1024,
        request_bytes_max: 64 * 1024,
        horizon_ms: 365 * 24 * 3600 * 1000,
        shutdown_grace_ms: 10_000,
        ..ServerConfig::default()
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(test_config()).await
    }

    pub async fn start_with(config: ServerConfig) -> Self {
        Self::start_on(config, Arc::new(MemoryStore::new()), None).await
    }

    /// A server on the embedded engine in a fresh temporary directory.
    pub async fn start_engine() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let engine = belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default())
            .expect("engine opens");
        Self::start_on(test_config(), Arc::new(engine), Some(dir)).await
    }

    /// Wraps a server started elsewhere (say, with more routes merged). The store is the one
    /// the server runs on.
    pub fn from_handle(handle: ServerHandle, clock: ManualClock, store: Arc<dyn Store>) -> Self {
        let base = format!("http://{}", handle.local_addr());
        TestServer {
            handle,
            clock,
            store,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base,
            _dir: None,
        }
    }

    async fn start_on(
        config: ServerConfig,
        store: Arc<dyn Store>,
        dir: Option<tempfile::TempDir>,
    ) -> Self {
        Self::start_with_sinks(config, store, None, dir).await
    }

    /// A server on `store` whose push queues deliver through `sinks` (the standard sinks when
    /// `None`).
    pub async fn start_with_sinks(
        config: ServerConfig,
        store: Arc<dyn Store>,
        sinks: Option<Arc<dyn belfry_sinks::SinkFactory>>,
        dir: Option<tempfile::TempDir>,
    ) -> Self {
        let clock = ManualClock::new(T0);
        let mut builder =
            Server::builder(config, store.clone()).clock(Arc::new(clock.clone()) as Arc<dyn Clock>);
        if let Some(sinks) = sinks {
            builder = builder.sinks(sinks);
        }
        let handle = builder.start().await.expect("server starts");
        TestServer {
            _dir: dir,
            ..Self::from_handle(handle, clock, store)
        }
    }

    /// Sends a request with a raw body; returns the status and the JSON answer (Null if none).
    pub async fn raw(&self, method: &str, path: &str, body: Option<String>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("request reaches the server");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    pub async fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let body = if body.is_null() {
            None
        } else {
            Some(body.to_string())
        };
        self.raw(method, path, body).await
    }

    /// Like `call`, and asserts the status.
    pub async fn ok(&self, method: &str, path: &str, body: Value, status: u16) -> Value {
        let (got, value) = self.call(method, path, body).await;
        assert_eq!(got, status, "{method} {path}: {value}");
        value
    }

    pub async fn queue(&self, name: &str, config: Value) -> Value {
        let (status, value) = self
            .call("PUT", &format!("/v1/queues/{name}"), config)
            .await;
        assert!(
            status == 200 || status == 201,
            "create {name}: {status} {value}"
        );
        value
    }

    /// Submits a task; returns its id.
    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn submit(&self, queue: &str, task: Value) -> String {
        let value = self
            .ok("POST", &format!("/v1/queues/{queue}/tasks"), task, 201)
            .await;
        value["id"].as_str().unwrap().to_owned()
    }

    pub async fn lease(&self, queue: &str, body: Value) -> Vec<Value> {
        let value = self
            .ok("POST", &format!("/v1/queues/{queue}/lease"), body, 200)
            .await;
        value["tasks"].as_array().unwrap().clone()
    }

    pub async fn task(&self, queue: &str, id: &str) -> Value {
        self.ok(
            "GET",
            &format!("/v1/queues/{queue}/tasks/{id}"),
            Value::Null,
            200,
        )
        .await
    }

    /// Moves the clock and wakes the server's loops.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.handle.wake_all();
    }
}

/// Polls `check` until it returns `Some`, or fails the test after `POLL_DEADLINE`. Between
/// polls it calls `between` (e.g. to move the clock).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The server's (manual) wall clock when the request arrived.
    pub at_ms: u64,
}

/// A scripted webhook receiver: answers each request with the next scripted response (the
/// last one repeats), optionally holding requests until released.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<ReceiverInner>,
}

/// A status and response headers.
type Scripted = (u16, Vec<(String, String)>);

struct ReceiverInner {
    script: Mutex<VecDeque<Scripted>>,
    last: Mutex<Scripted>,
    received: Mutex<Vec<Received>>,
    hold: Mutex<bool>,
    release: Notify,
    clock: ManualClock,
}

impl Receiver {
    pub async fn start(clock: &ManualClock, script: Vec<(u16, Vec<(&str, &str)>)>) -> Self {
        let script: VecDeque<_> = script
            .into_iter()
            .map(|(status, headers)| {
                (
                    status,
                    headers
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let last = script.back().cloned().unwrap_or((200, Vec::new()));
        let inner = Arc::new(ReceiverInner {
            script: Mutex::new(script),
            last: Mutex::new(last),
            received: Mutex::new(Vec::new()),
            hold: Mutex::new(false),
            release: Notify::new(),
            clock: clock.clone(),
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().clone()
    }

    pub fn count(&self) -> usize {
        self.inner.received.lock().len()
    }

    /// Requests from now on wait until `release`.
    pub fn hold(&self) {
        *self.inner.hold.lock() = true;
    }

    pub fn release(&self) {
        *self.inner.hold.lock() = false;
        self.inner.release.notify_waiters();
    }
}

async fn receive(
    State(inner): State<Arc<ReceiverInner>>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    inner.received.lock().push(Received {
        headers,
        body: body.to_vec(),
        at_ms: inner.clock.wall_ms(),
    });
    loop {
        let released = inner.release.notified();
        if !*inner.hold.lock() {
            break;
        }
        released.await;
    }
    let (status, headers) = {
        let next = inner.script.lock().pop_front();
        next.unwrap_or_else(|| inner.last.lock().clone())
    };
    let mut response = StatusCode::from_u16(status).unwrap().into_response();
    for (k, v) in headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    response
}

/// (method, path) of every operation in `docs/openapi.json`.
pub fn documented_routes() -> Vec<(String, String)> {
    let document: Value =
        serde_json::from_str(include_str!("../../../../docs/openapi.json")).expect("valid JSON");
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("a paths object") {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                operations.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}
