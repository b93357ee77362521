//! Retries against a real server made to refuse for a while: a token over its request rate
//! (`429 rate_limited`), a server whose only store-call slot is taken (`503 overloaded`), a
//! store that does not answer in time (`503 store_unavailable`), no server at all (connection
//! refused). The waits are the client's, in real time: each test takes a few seconds at most.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_client::{Client, Error, ErrorCode, NewTask, QueueSpec, Request, RetryPolicy};
use belfry_server::ServerConfig;
use common::stall::StallingStore;
use common::{code, test_config, Harness};
use serde_json::json;

/// Retries that would be over within milliseconds if `Retry-After` were not heeded.
fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(5),
        max_elapsed: Duration::from_secs(10),
    }
}

/// A new token with `scopes` and `rate_per_s`, made through the API (the first one made turns
/// authentication on).
async fn make_token(client: &Client, name: &str, rate_per_s: Option<f64>) -> String {
    let request = Request::create_token(name, &["admin".to_owned()], rate_per_s);
    let made: serde_json::Value = client.send(&request).await.unwrap().json().unwrap();
    made["token"].as_str().unwrap().to_owned()
}

fn keyed(key: &str) -> NewTask {
    NewTask::json(json!({ "key": key })).idempotency_key(key)
}

/// A token of one request every two seconds: the second call in a row is refused with
/// `Retry-After: 2`. Without retries it fails; with them it waits those 2 s and succeeds, where
/// its own backoff (10 ms, 20 ms) would have spent its 3 attempts long before; a keyless submit
/// is not repeated; a `Retry-After` longer than `max_backoff` is not waited for whole, and one
/// longer than what is left of `max_elapsed` not at all.
#[tokio::test]
async fn a_rate_limited_call_waits_what_retry_after_asks() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    let admin = h
        .client
        .clone()
        .with_token(make_token(&h.client, "ops", None).await);
    let slow_token = make_token(&admin, "slow", Some(0.5)).await;
    let slow = h.client.clone().with_token(slow_token);
    let retrying = slow.clone().with_retries(quick_retries());

    slow.get_queue("q").await.unwrap();
    let refused = slow.get_queue("q").await;
    assert!(
        matches!(&refused, Err(e) if e.retry_after() == Some(Duration::from_secs(2)) && e.is_transient()),
        "{refused:?}"
    );
    assert_eq!(code(refused), ErrorCode::RateLimited);

    let started = Instant::now();
    retrying.get_queue("q").await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "Retry-After: 2 heeded: {waited:?}"
    );

    // The token's only request is spent again: a keyless submit is refused at once.
    let started = Instant::now();
    let keyless = retrying.submit("q", &NewTask::json(json!(1))).await;
    assert_eq!(code(keyless), ErrorCode::RateLimited);
    assert!(started.elapsed() < Duration::from_secs(1), "not repeated");

    // Waits capped at 200 ms: three attempts within about 400 ms, all refused.
    let capped = slow.clone().with_retries(RetryPolicy {
        max_backoff: Duration::from_millis(200),
        ..quick_retries()
    });
    let started = Instant::now();
    assert_eq!(
        code(capped.submit("q", &keyed("a")).await),
        ErrorCode::RateLimited
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1_500),
        "{took:?}"
    );

    // A 2 s wait does not fit in 500 ms: the refusal comes back at once.
    let brief = slow.clone().with_retries(RetryPolicy {
        max_elapsed: Duration::from_millis(500),
        ..quick_retries()
    });
    let started = Instant::now();
    assert_eq!(
        code(brief.submit("q", &keyed("b")).await),
        ErrorCode::RateLimited
    );
    assert!(started.elapsed() < Duration::from_millis(400));
    h.stop().await;
}

/// One store-call slot, held by a submit stalled in the store: other submits are refused with
/// `503 overloaded` and `Retry-After: 1`. A keyed submit with retries waits that second and is
/// stored once the slot is free; the same without retries, or without a key, fails at once.
#[tokio::test]
async fn an_overloaded_server_is_asked_again_by_safe_calls_only() {
    let store = Arc::new(StallingStore::default());
    let h = Harness::start_with(
        ServerConfig {
            store_calls_in_flight_max: 1,
            store_admission_wait_ms: 0,
            ..test_config()
        },
        store.clone(),
    )
    .await;
    h.pull_queue("q").await;
    let retrying = h.client.clone().with_retries(quick_retries());
    store.hold();
    let stalled = tokio::spawn({
        let client = h.client.clone();
        async move { client.submit("q", &NewTask::json(json!("first"))).await }
    });
    common::eventually("the first submit waits in the store", || async {
        store.stalled() == 1
    })
    .await;

    let refused = h.client.submit("q", &keyed("plain")).await;
    assert!(matches!(&refused, Err(e) if e.retry_after() == Some(Duration::from_secs(1))));
    assert_eq!(code(refused), ErrorCode::Overloaded);
    let started = Instant::now();
    let keyless = retrying.submit("q", &NewTask::json(json!("keyless"))).await;
    assert_eq!(code(keyless), ErrorCode::Overloaded);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "not repeated"
    );

    let started = Instant::now();
    let retried = tokio::spawn({
        let retrying = retrying.clone();
        async move { retrying.submit("q", &keyed("retried")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.release();
    stalled.await.unwrap().unwrap();
    let stored = retried.await.unwrap().unwrap();
    let waited = started.elapsed();
    assert!(!stored.duplicate, "{stored:?}");
    assert!(
        waited >= Duration::from_secs(1),
        "Retry-After: 1 heeded: {waited:?}"
    );
    let page = h.client.list_tasks("q", None, None).await.unwrap();
    let keys: Vec<_> = page
        .tasks
        .iter()
        .map(|t| t.idempotency_key.as_deref())
        .collect();
    assert_eq!(
        keys,
        [None, Some("retried")],
        "the first and the retried one"
    );
    h.stop().await;
}

/// A server whose store does not answer within 300 ms, with the store held longer.
async fn slow_store_server() -> (Harness, Arc<StallingStore>) {
    let store = Arc::new(StallingStore::default());
    let config = ServerConfig {
        store_call_timeout_ms: 300,
        ..test_config()
    };
    let h = Harness::start_with(config, store.clone()).await;
    h.pull_queue("q").await;
    (h, store)
}

/// Holds `store` until a call has waited in it past the server's 300 ms deadline (so that
/// call was answered `503 store_unavailable`), then lets it complete.
fn release_after_the_deadline(store: Arc<StallingStore>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        common::eventually("a call waits in the store", || async {
            store.stalled() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        store.release();
    })
}

/// A keyed submit answered `503 store_unavailable` ("may or may not have been applied") was
/// in fact stored once the store answered: the retry finds it, as a duplicate of itself, and
/// the queue holds it once.
#[tokio::test]
async fn a_keyed_submit_whose_answer_was_lost_is_stored_once() {
    let (h, store) = slow_store_server().await;
    let retrying = h.client.clone().with_retries(quick_retries());
    store.hold();
    let released = release_after_the_deadline(store.clone());
    let started = Instant::now();
    let submitted = retrying.submit("q", &keyed("once")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 heeded"
    );
    released.await.unwrap();
    assert!(
        submitted.duplicate,
        "the first attempt's task: {submitted:?}"
    );
    let page = h.client.list_tasks("q", None, None).await.unwrap();
    assert_eq!(page.tasks.len(), 1, "{page:?}");
    assert_eq!(page.tasks[0].id, submitted.id);
    h.stop().await;
}

/// The server answers a repeated ack `409 lease_expired`: the lease ended when the first ack
/// finished the task. So a retried ack whose first attempt was answered `503
/// store_unavailable`, and took effect once the store answered, is told apart from both a
/// success and a lost lease: `OutcomeUnknown`, with both answers.
#[tokio::test]
async fn a_retried_ack_that_meets_its_own_effect_is_an_unknown_outcome() {
    let (h, store) = slow_store_server().await;
    let retrying = h.client.clone().with_retries(quick_retries());
    h.client.submit("q", &keyed("plain")).await.unwrap();
    let first = h.lease_one("q", 30_000).await;
    h.client.ack("q", &first.id, &first.lease_id).await.unwrap();
    let again = h.client.ack("q", &first.id, &first.lease_id).await;
    assert_eq!(code(again), ErrorCode::LeaseExpired, "a repeated ack");

    h.client.submit("q", &keyed("retried")).await.unwrap();
    let second = h.lease_one("q", 30_000).await;
    store.hold();
    let released = release_after_the_deadline(store.clone());
    let acked = retrying.ack("q", &second.id, &second.lease_id).await;
    released.await.unwrap();
    match acked {
        Err(Error::OutcomeUnknown {
            attempts,
            earlier,
            answer,
        }) => {
            assert_eq!(attempts, 2);
            assert_eq!(earlier.code(), Some(&ErrorCode::StoreUnavailable));
            assert_eq!(answer.code(), Some(&ErrorCode::LeaseExpired));
        }
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    let task = h.client.get_task("q", &second.id).await.unwrap();
    assert_eq!(task.state, "done", "the first attempt took effect");
    h.stop().await;
}

/// Nothing listens at first: the call is refused a connection, and tried again until a
/// server starts there.
#[tokio::test]
async fn a_refused_connection_is_tried_again_until_a_server_listens() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = free.local_addr().unwrap();
    drop(free);
    let client = Client::new(&format!("http://{address}"))
        .unwrap()
        .with_retries(RetryPolicy {
            max_attempts: 50,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
            max_elapsed: Duration::from_secs(10),
        });
    let refused = client.clone().with_retries(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    });
    let once = refused.get_queue("q").await;
    assert!(
        matches!(&once, Err(e @ Error::Unreachable { .. }) if e.is_transient()),
        "{once:?}"
    );
    let put = tokio::spawn(async move { client.put_queue("q", &QueueSpec::default()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h = Harness::start_with(
        ServerConfig {
            listen: address,
            ..test_config()
        },
        Arc::new(belfry_store::MemoryStore::new()),
    )
    .await;
    let queue = put.await.unwrap().unwrap();
    assert_eq!(queue.name, "q");
    h.stop().await;
}

/// Which calls a client with retries repeats.
#[test]
fn only_calls_a_repeat_cannot_double_are_repeated() {
    let keyless = NewTask::json(json!(1));
    let repeated = [
        Request::get_queue("q"),
        Request::put_queue("q", &QueueSpec::default()),
        Request::delete_queue("q"),
        Request::cancel("q", "t"),
        Request::ack("q", "t", "1"),
        Request::nack("q", "t", "1", &Default::default()),
        Request::extend("q", "t", "1", 1_000),
        Request::lease("q", &Default::default()),
        Request::pause_queue("q"),
        Request::submit("q", &keyed("k")),
        Request::submit_batch("q", &[keyed("k"), keyed("l")]),
    ];
    for request in repeated {
        assert!(request.is_safe_to_repeat(), "{request:?}");
    }
    let once = [
        Request::submit("q", &keyless),
        Request::submit_batch("q", &[keyed("k"), keyless.clone()]),
        Request::submit_batch("q", &[]),
        Request::purge_queue("q"),
        Request::create_token("t", &[], None),
        Request::redrive("q", "t"),
    ];
    for request in once {
        assert!(!request.is_safe_to_repeat(), "{request:?}");
    }
}
