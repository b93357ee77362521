//! Bearer tokens end to end: every documented route (docs/openapi.json, which
//! `tests/openapi.rs` keeps in step with the server) is tried with no token, an unknown token,
//! a token of the wrong scope and a token of the right scope, on a real server; the console's
//! routes are tried as public.

mod common;

use std::sync::Arc;

use belfry_core::{Clock, ManualClock};
use belfry_server::api::auth::need;
use belfry_server::auth::{generate_token, Auth, Need, Scope, TokenEntry, TokenHash, TokenRate};
use belfry_server::Server;
use belfry_store::MemoryStore;
use common::{code, documented_routes, test_config, T0};
use reqwest::Method;
use serde_json::Value;

struct Tokens {
    admin: String,
    read: String,
    /// `produce:q*`: the test's queue is `q`.
    produce: String,
    consume: String,
    /// `produce:other`: known, but for another queue.
    elsewhere: String,
}

fn entry(name: &str, token: &str, scopes: &[&str]) -> TokenEntry {
    TokenEntry {
        name: name.into(),
        hash: TokenHash::of(token),
        scopes: scopes.iter().map(|s| Scope::parse(s).unwrap()).collect(),
        rate: None,
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client of the server `handle` runs.
    fn of(handle: &belfry_server::ServerHandle) -> Client {
        Client {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base: format!("http://{}", handle.local_addr()),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value, Option<String>) {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.expect("reaches the server");
        let status = response.status().as_u16();
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = response.bytes().await.unwrap();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value, challenge)
    }
}

fn concrete(path: &str) -> String {
    path.replace("{queue}", "q")
        .replace("{id}", "00000000000000000000000000000000")
        .replace("{key}", "k")
        .replace("{schedule}", "s")
}

#[tokio::test]
async fn every_route_needs_its_scope() {
    let tokens = Tokens {
        admin: generate_token(),
        read: generate_token(),
        produce: generate_token(),
        consume: generate_token(),
        elsewhere: generate_token(),
    };
    let auth = Auth::new(vec![
        entry("ops", &tokens.admin, &["admin"]),
        entry("dashboard", &tokens.read, &["read"]),
        entry("shop", &tokens.produce, &["produce:q*"]),
        entry("worker", &tokens.consume, &["consume:q"]),
        entry(
            "other",
            &tokens.elsewhere,
            &["produce:other", "consume:other"],
        ),
    ])
    .unwrap();
    let clock = ManualClock::new(T0);
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .clock(Arc::new(clock) as Arc<dyn Clock>)
        .auth(auth)
        .merge(belfry_console::router())
        .start()
        .await
        .expect("server starts");
    let client = Client::of(&handle);
    let (status, _, _) = client
        .call("PUT", "/v1/queues/q", Some(&tokens.admin), Some("{}"))
        .await;
    assert_eq!(status, 201);

    let routes = documented_routes();
    assert!(routes.len() >= 30, "{} routes", routes.len());
    let mut checked_scopes = std::collections::BTreeSet::new();
    for (method, template) in &routes {
        let path = concrete(template);
        let body = (method != "GET" && method != "DELETE").then_some("{}");
        let needs = need(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            Some(template),
            &path,
        );
        let what = format!("{method} {template}");
        if needs == Need::Public {
            let (status, _, _) = client.call(method, &path, None, body).await;
            assert!(status < 400, "{what} is public, got {status}");
            continue;
        }
        for token in [None, Some("bfy_not_a_token_of_this_server")] {
            let (status, value, challenge) = client.call(method, &path, token, body).await;
            assert_eq!(status, 401, "{what} with {token:?}: {value}");
            assert_eq!(code(&value), "unauthorized", "{what}");
            assert!(
                challenge.is_some_and(|c| c.starts_with("Bearer")),
                "{what}: a 401 says how to authenticate"
            );
        }
        let (right, wrong) = match &needs {
            Need::Admin => (&tokens.admin, &tokens.read),
            Need::Read => (&tokens.read, &tokens.produce),
            Need::Produce { read: true, .. } => (&tokens.produce, &tokens.consume),
            Need::Produce { read: false, .. } => (&tokens.produce, &tokens.read),
            Need::Consume { .. } => (&tokens.consume, &tokens.produce),
            other => panic!("{what}: unexpected need {other:?}"),
        };
        checked_scopes.insert(needs.scope_text().split(':').next().unwrap().to_owned());
        let (status, value, _) = client.call(method, &path, Some(wrong), body).await;
        assert_eq!(status, 403, "{what} with the wrong scope: {value}");
        assert_eq!(code(&value), "forbidden", "{what}");
        let message = value["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&needs.scope_text()),
            "{what}: the 403 names the scope: {message}"
        );
        if !matches!(needs, Need::Admin | Need::Read) {
            // Known, with the right kind of scope, for another queue.
            let (status, value, _) = client
                .call(method, &path, Some(&tokens.elsewhere), body)
                .await;
            assert_eq!(
                status, 403,
                "{what} with a token for another queue: {value}"
            );
        }
        let (status, value, _) = client.call(method, &path, Some(right), body).await;
        assert!(
            status != 401 && status != 403,
            "{what} with the right scope: {status} {value}"
        );
        let (status, value, _) = client.call(method, &path, Some(&tokens.admin), body).await;
        assert!(
            status != 401 && status != 403,
            "{what} with admin: {status} {value}"
        );
    }
    for scope in ["admin", "read", "produce", "consume"] {
        assert!(
            checked_scopes.contains(scope),
            "no documented route needed {scope}: {checked_scopes:?}"
        );
    }
    // The console's page and assets (merged as `belfry serve` merges them) are public: they
    // load with no token and with a wrong one; the console's own API calls are the routes above.
    for path in [
        "/",
        "/console",
        "/console/",
        "/console/js/app.js",
        "/console/console.css",
    ] {
        for token in [None, Some("bfy_not_a_token_of_this_server")] {
            let (status, value, _) = client.call("GET", path, token, None).await;
            assert!(
                status < 400,
                "GET {path} with {token:?} is public: {status} {value}"
            );
        }
        let (status, _, _) = client.call("DELETE", path, Some(&tokens.read), None).await;
        assert!(status >= 400, "DELETE {path} is not served");
    }
    // A path no route serves needs a token, then answers 404.
    let (status, _, _) = client.call("GET", "/v2/nothing", None, None).await;
    assert_eq!(status, 401);
    let (status, value, _) = client
        .call("GET", "/v2/nothing", Some(&tokens.consume), None)
        .await;
    assert_eq!((status, code(&value)), (404, "route_not_found"));
    // A listing that shows the tasks' own targets whole (credentials included) needs what a
    // submit needs, not `read`; of dead letters, `admin`.
    for (path, right) in [
        ("/v1/queues/q/tasks?full_target=true", &tokens.produce),
        ("/v1/queues/q/tasks?full%5Ftarget=true", &tokens.produce),
        ("/v1/queues/q/dead?limit=5&full_target=true", &tokens.admin),
    ] {
        let (status, value, _) = client.call("GET", path, Some(&tokens.read), None).await;
        assert_eq!(
            (status, code(&value)),
            (403, "forbidden"),
            "{path}: {value}"
        );
        let (status, value, _) = client.call("GET", path, Some(right), None).await;
        assert!(status != 401 && status != 403, "{path}: {status} {value}");
    }
    handle.stop().await.unwrap();
}

/// The policy itself, for the routes whose scope the issue names: a table that a change to
/// `api::auth` cannot silently loosen.
#[test]
fn the_named_routes_need_the_named_scopes() {
    let cases = [
        ("POST", "/v1/queues/{queue}/tasks", "produce:q"),
        ("GET", "/v1/queues/{queue}/tasks/{id}", "produce:q or read"),
        ("DELETE", "/v1/queues/{queue}/tasks/{id}", "produce:q"),
        ("PATCH", "/v1/queues/{queue}/tasks/{id}", "produce:q"),
        ("POST", "/v1/queues/{queue}/lease", "consume:q"),
        ("POST", "/v1/queues/{queue}/tasks/{id}/ack", "consume:q"),
        ("POST", "/v1/queues/{queue}/tasks/{id}/nack", "consume:q"),
        ("POST", "/v1/queues/{queue}/tasks/{id}/extend", "consume:q"),
        ("PUT", "/v1/queues/{queue}", "admin"),
        ("DELETE", "/v1/queues/{queue}", "admin"),
        ("POST", "/v1/queues/{queue}/dead/{id}/redrive", "admin"),
        ("POST", "/v1/schedules", "admin"),
        ("GET", "/v1/schedules", "read"),
        ("GET", "/metrics", "read"),
    ];
    for (method, template, scope) in cases {
        let needs = need(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            Some(template),
            &concrete(template),
        );
        assert_eq!(needs.scope_text(), scope, "{method} {template}");
    }
}

/// A token over its `rate_per_s` gets `429 rate_limited` with `Retry-After`; another token is
/// not held back by it.
#[tokio::test]
async fn a_token_over_its_rate_is_told_when_to_retry() {
    let (slow, other) = (generate_token(), generate_token());
    let auth = Auth::new(vec![
        TokenEntry {
            // One request a minute, two at once: the third within the test is refused
            // however slow the machine.
            rate: Some(TokenRate {
                per_s: 1.0 / 60.0,
                burst: 2,
            }),
            ..entry("slow", &slow, &["read"])
        },
        entry("other", &other, &["read"]),
    ])
    .unwrap();
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .auth(auth)
        .start()
        .await
        .expect("server starts");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{}/v1/queues", handle.local_addr());
    for _ in 0..2 {
        let answer = http.get(&url).bearer_auth(&slow).send().await.unwrap();
        assert_eq!(answer.status(), 200);
    }
    let refused = http.get(&url).bearer_auth(&slow).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(code(&body), "rate_limited");
    let answer = http.get(&url).bearer_auth(&other).send().await.unwrap();
    assert_eq!(answer.status(), 200, "another token is not limited");
    handle.stop().await.unwrap();
}

/// Tokens made through the API: shown once, usable at once, listed without secrets, kept
/// across a restart on the same store, and refused as soon as they are revoked. A token
/// from the config cannot be revoked through the API, and names are unique.
#[tokio::test]
async fn tokens_made_through_the_api_work_until_revoked() {
    let admin = generate_token();
    let store: Arc<dyn belfry_store::Store> = Arc::new(MemoryStore::new());
    let start = |store: Arc<dyn belfry_store::Store>, admin: String| async move {
        Server::builder(test_config(), store)
            .auth(Auth::new(vec![entry("ops", &admin, &["admin"])]).unwrap())
            .start()
            .await
            .expect("server starts")
    };
    let handle = start(store.clone(), admin.clone()).await;
    let client = Client::of(&handle);
    let body = r#"{"name": "shop", "scopes": ["produce:orders*", "read"], "rate_per_s": 100}"#;
    let (status, made, _) = client
        .call("POST", "/v1/tokens", Some(&admin), Some(body))
        .await;
    assert_eq!(status, 201, "{made}");
    let shop = made["token"].as_str().unwrap().to_owned();
    assert_eq!(
        made["scopes"],
        serde_json::json!(["produce:orders*", "read"])
    );
    let (status, _, _) = client
        .call("PUT", "/v1/queues/orders", Some(&admin), Some("{}"))
        .await;
    assert_eq!(status, 201);
    let (status, value, _) = client
        .call("POST", "/v1/queues/orders/tasks", Some(&shop), Some("{}"))
        .await;
    assert_eq!(status, 201, "the made token works at once: {value}");
    let (status, _, _) = client.call("GET", "/v1/tokens", Some(&shop), None).await;
    assert_eq!(status, 403, "listing tokens needs admin, even to read");

    let (status, list, _) = client.call("GET", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(status, 200);
    let text = list.to_string();
    assert!(!text.contains(&shop) && !text.contains(&admin), "{text}");
    assert!(!text.contains("sha256:"), "no hash is listed: {text}");
    let names: Vec<(&str, &str)> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["source"].as_str().unwrap()))
        .collect();
    assert_eq!(names, vec![("ops", "config"), ("shop", "api")]);

    let (status, value, _) = client
        .call("POST", "/v1/tokens", Some(&admin), Some(body))
        .await;
    assert_eq!((status, code(&value)), (409, "token_exists"));
    let (status, value, _) = client
        .call(
            "POST",
            "/v1/tokens",
            Some(&admin),
            Some(r#"{"name": "x", "scopes": ["write"]}"#),
        )
        .await;
    assert_eq!((status, code(&value)), (400, "invalid_request"), "{value}");
    let (status, value, _) = client
        .call("DELETE", "/v1/tokens/ops", Some(&admin), None)
        .await;
    assert_eq!((status, code(&value)), (409, "token_exists"), "{value}");

    // A restart on the same store keeps the made token.
    handle.stop().await.unwrap();
    let handle = start(store.clone(), admin.clone()).await;
    let client = Client {
        base: format!("http://{}", handle.local_addr()),
        ..client
    };
    let (status, value, _) = client
        .call("POST", "/v1/queues/orders/tasks", Some(&shop), Some("{}"))
        .await;
    assert_eq!(status, 201, "kept across a restart: {value}");

    let (status, _, _) = client
        .call("DELETE", "/v1/tokens/shop", Some(&admin), None)
        .await;
    assert_eq!(status, 204);
    let (status, value, _) = client
        .call("POST", "/v1/queues/orders/tasks", Some(&shop), Some("{}"))
        .await;
    assert_eq!(
        (status, code(&value)),
        (401, "unauthorized"),
        "revoked at once"
    );
    let (status, value, _) = client
        .call("DELETE", "/v1/tokens/shop", Some(&admin), None)
        .await;
    assert_eq!((status, code(&value)), (404, "token_not_found"));
    handle.stop().await.unwrap();
    let handle = start(store, admin).await;
    let client = Client {
        base: format!("http://{}", handle.local_addr()),
        ..client
    };
    let (status, _, _) = client.call("GET", "/v1/queues", Some(&shop), None).await;
    assert_eq!(status, 401, "the revoke was stored");
    handle.stop().await.unwrap();
}

/// Bad token requests are 400s that say what to fix, and make no token.
#[tokio::test]
async fn bad_token_requests_are_refused_and_make_nothing() {
    let admin = generate_token();
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .auth(Auth::new(vec![entry("ops", &admin, &["admin"])]).unwrap())
        .start()
        .await
        .expect("server starts");
    let client = Client::of(&handle);
    for (body, code_expected, needle) in [
        (
            r#"{"name": "a b", "scopes": ["read"]}"#,
            "invalid_request",
            "name",
        ),
        (
            r#"{"name": "x", "scopes": []}"#,
            "invalid_request",
            "scopes",
        ),
        (
            r#"{"name": "x", "scopes": ["produce:a*b"]}"#,
            "invalid_request",
            "scopes",
        ),
        (
            r#"{"name": "x", "scopes": ["read"], "rate_per_s": 0}"#,
            "invalid_request",
            "rate_per_s",
        ),
        (
            r#"{"name": "x", "scopes": ["read"], "burst": 5}"#,
            "invalid_request",
            "rate_per_s",
        ),
        (
            r#"{"name": "x", "scopes": ["read"], "token": "mine"}"#,
            "invalid_request",
            "token",
        ),
        (r#"{"name": "x", "scopes": ["read"]"#, "malformed_json", ""),
    ] {
        let (status, value, _) = client
            .call("POST", "/v1/tokens", Some(&admin), Some(body))
            .await;
        assert_eq!(
            (status, code(&value)),
            (400, code_expected),
            "{body}: {value}"
        );
        let message = value["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let (_, list, _) = client.call("GET", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(list["tokens"].as_array().unwrap().len(), 1, "{list}");
    handle.stop().await.unwrap();
}

/// Authentication cannot be switched off or locked by the token API: the first token needs
/// the admin scope, and the last admin token cannot be revoked (with none left, the API
/// would be open again, or nobody could manage tokens).
#[tokio::test]
async fn the_token_api_keeps_an_admin_token() {
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .start()
        .await
        .expect("server starts");
    let client = Client::of(&handle);
    let make = |name: &str, scope: &str| format!(r#"{{"name": "{name}", "scopes": ["{scope}"]}}"#);
    let (status, value, _) = client
        .call("POST", "/v1/tokens", None, Some(&make("reader", "read")))
        .await;
    assert_eq!((status, code(&value)), (400, "invalid_request"), "{value}");
    assert!(value.to_string().contains("admin scope"), "{value}");
    let (status, _, _) = client.call("GET", "/v1/queues", None, None).await;
    assert_eq!(status, 200, "still open: the refused token was not made");

    let (status, made, _) = client
        .call("POST", "/v1/tokens", None, Some(&make("a1", "admin")))
        .await;
    assert_eq!(status, 201, "{made}");
    let a1 = made["token"].as_str().unwrap().to_owned();
    let (status, value, _) = client
        .call("DELETE", "/v1/tokens/a1", Some(&a1), None)
        .await;
    assert_eq!((status, code(&value)), (409, "last_admin_token"), "{value}");
    let (status, made, _) = client
        .call("POST", "/v1/tokens", Some(&a1), Some(&make("a2", "admin")))
        .await;
    assert_eq!(status, 201, "{made}");
    let a2 = made["token"].as_str().unwrap().to_owned();
    let (status, _, _) = client
        .call("DELETE", "/v1/tokens/a1", Some(&a2), None)
        .await;
    assert_eq!(status, 204, "another admin token remains");
    let (status, value, _) = client
        .call("DELETE", "/v1/tokens/a2", Some(&a2), None)
        .await;
    assert_eq!((status, code(&value)), (409, "last_admin_token"), "{value}");
    let (status, _, _) = client.call("GET", "/v1/queues", None, None).await;
    assert_eq!(status, 401, "authentication stays on");
    handle.stop().await.unwrap();
}

/// A web page another site serves cannot make a server without tokens write (a "simple"
/// cross-site POST needs no preflight), nor read it through DNS rebinding; programs and the
/// server's own console are served as before.
#[tokio::test]
async fn browsers_cannot_write_for_other_sites_nor_rebind() {
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .start()
        .await
        .expect("server starts");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://{}", handle.local_addr());
    let send = |method: Method, path: &str, headers: &[(&str, &str)], body: &str| {
        let mut request = http
            .request(method, format!("{base}{path}"))
            .header("content-type", "text/plain")
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.json::<Value>().await.unwrap_or_default())
        }
    };
    let evil = [
        ("origin", "https://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ];
    let (status, value) = send(Method::PUT, "/v1/queues/q", &[], "{}").await;
    assert_eq!(status, 201, "{value}");
    for (path, body) in [
        ("/v1/queues/q/tasks", r#"{"payload": "from another site"}"#),
        ("/v1/queues/q/pause", ""),
        ("/v1/tokens", r#"{"name": "evil", "scopes": ["admin"]}"#),
    ] {
        let (status, value) = send(Method::POST, path, &evil, body).await;
        assert_eq!(
            (status, code(&value)),
            (403, "cross_origin_refused"),
            "{path}: {value}"
        );
        // An older browser says only where the page is from.
        let (status, value) = send(Method::POST, path, &evil[..1], body).await;
        assert_eq!(
            (status, code(&value)),
            (403, "cross_origin_refused"),
            "{path}: {value}"
        );
    }
    // Nothing was made: no task, not paused, and no token (the API is still open).
    let (_, queue) = send(Method::GET, "/v1/queues/q", &[], "").await;
    assert_eq!(queue["pending"], 0, "{queue}");
    assert_eq!(queue["paused"], false, "{queue}");
    // DNS rebinding: a page on evil.example reads as its own origin, with its host name.
    let (status, value) = send(
        Method::GET,
        "/v1/queues/q",
        &[("host", "evil.example:7070")],
        "",
    )
    .await;
    assert_eq!(
        (status, code(&value)),
        (403, "cross_origin_refused"),
        "{value}"
    );
    // The console (same origin) and programs (no browser headers) write.
    let origin = base.clone();
    let console = [
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let (status, value) = send(Method::POST, "/v1/queues/q/tasks", &console, "{}").await;
    assert_eq!(status, 201, "{value}");
    let (status, value) = send(
        Method::POST,
        "/v1/queues/q/tasks",
        &[("host", "localhost")],
        "{}",
    )
    .await;
    assert_eq!(status, 201, "{value}");
    handle.stop().await.unwrap();
}
