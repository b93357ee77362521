//! The server under more requests than its store keeps up with: a flood of requests is
//! refused as overloaded rather than queued, and a store call that does not answer in time
//! is a 503 at its deadline. Both on a store whose puts wait until the test releases them.

mod common;

use belfry_store::Store;
use common::{code, TestServer, T0};
use serde_json::{json, Value};

/// A store whose `put` waits until released, to fill the server's store-call slots.
struct StallingStore {
    inner: belfry_store::MemoryStore,
    entered: std::sync::atomic::AtomicUsize,
    release: std::sync::Mutex<bool>,
    released: std::sync::Condvar,
}

impl StallingStore {
    fn release(&self) {
        *self.release.lock().unwrap() = true;
        self.released.notify_all();
    }
}

impl belfry_store::ForwardingStore for StallingStore {
    fn wrapped(&self) -> &dyn belfry_store::Store {
        &self.inner
    }

    fn put(
        &self,
        tasks: Vec<belfry_core::NewTask>,
    ) -> belfry_store::Result<Vec<belfry_store::PutOutcome>> {
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut released = self.release.lock().unwrap();
        while !*released {
            released = self.released.wait(released).unwrap();
        }
        drop(released);
        self.inner.put(tasks)
    }
}

/// A server with `config` on a [`StallingStore`] (puts wait until released), and queue `q`.
async fn stalling_server(
    config: belfry_server::ServerConfig,
) -> (TestServer, std::sync::Arc<StallingStore>) {
    use std::sync::Arc;
    let store = Arc::new(StallingStore {
        inner: belfry_store::MemoryStore::new(),
        entered: Default::default(),
        release: std::sync::Mutex::new(false),
        released: std::sync::Condvar::new(),
    });
    let clock = belfry_core::ManualClock::new(T0);
    let handle = belfry_server::Server::builder(config, store.clone())
        .clock(Arc::new(clock.clone()))
        .start()
        .await
        .unwrap();
    let s = TestServer::from_handle(handle, clock, store.clone());
    s.queue("q", json!({})).await;
    (s, store)
}

#[tokio::test]
async fn a_flood_of_requests_is_refused_as_overloaded_not_queued() {
    let (s, store) = stalling_server(belfry_server::ServerConfig {
        store_calls_in_flight_max: 1,
        store_admission_wait_ms: 0,
        ..common::test_config()
    })
    .await;
    // The first submit takes the only slot and stalls in the store.
    let first = {
        let http = s.http.clone();
        let url = format!("{}/v1/queues/q/tasks", s.base);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"payload": 1}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    common::eventually("the first submit is inside the store", || async {
        (store.entered.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let response = s
        .http
        .post(format!("{}/v1/queues/q/tasks", s.base))
        .json(&json!({"payload": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), "overloaded");
    store.release();
    assert_eq!(first.await.unwrap(), 201);
    // With the slot free again, requests are served.
    s.submit("q", json!({"payload": 3})).await;
}

/// A store call that does not answer within `store_call_timeout_ms` gets its request a `503
/// store_unavailable` with `Retry-After`, on both paths (a batch on the blocking pool, a single
/// submit through the coalescing writer). A single submit queued behind the stalled write is
/// answered at its own deadline and never written: once the store answers again, the next
/// submit is stored right after the stalled ones, with nothing in between.
#[tokio::test]
async fn a_stalled_store_call_is_a_503_at_its_deadline_and_a_queued_submit_is_not_written() {
    use belfry_store::Store as _;
    use std::sync::atomic::Ordering::SeqCst;
    let q = belfry_core::QueueName::new("q").unwrap();
    let (s, store) = stalling_server(belfry_server::ServerConfig {
        store_call_timeout_ms: 300,
        ..common::test_config()
    })
    .await;
    let post = |path: &'static str, body: Value| {
        let http = s.http.clone();
        let url = format!("{}{path}", s.base);
        async move { http.post(url).json(&body).send().await.unwrap() }
    };
    let expect_deadline = |response: reqwest::Response| async move {
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let body: Value = response.json().await.unwrap();
        assert_eq!(code(&body), "store_unavailable", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("store_call_timeout")),
            "the message names the setting: {body}"
        );
    };
    let batch = json!({"tasks": [{"payload": 1}, {"payload": 2}]});
    expect_deadline(post("/v1/queues/q/tasks:batch", batch).await).await;
    // The writer thread stalls on the first single submit; the second waits behind it.
    let first = tokio::spawn(post("/v1/queues/q/tasks", json!({"payload": 3})));
    common::eventually("the single submit is inside the store", || async {
        (store.entered.load(SeqCst) == 2).then_some(())
    })
    .await;
    expect_deadline(post("/v1/queues/q/tasks", json!({"payload": 4})).await).await;
    expect_deadline(first.await.unwrap()).await;
    store.release();
    // The stalled calls complete (a 503 past the deadline does not take a call back).
    common::eventually("the stalled puts finish", || async {
        let pending = store.inner.counts(&q, T0).unwrap().pending;
        (pending == 3).then_some(())
    })
    .await;
    s.submit("q", json!({"payload": 5})).await;
    let pending = store.inner.counts(&q, T0).unwrap().pending;
    assert_eq!(
        pending, 4,
        "the submit queued behind the stall was never written"
    );
    assert_eq!(
        store.entered.load(SeqCst),
        3,
        "three puts reached the store"
    );
}
