//! `docs/openapi.json` and the server's routes cannot drift apart, either way:
//! - every documented path and method is sent to a real server, which must route it (any
//!   answer but `route_not_found` and `method_not_allowed`);
//! - every route the API's source declares (`.route("/path", get(..).post(..))` in `src/api/`)
//!   is documented;
//! - `GET /v1/openapi.json` serves the document itself.

mod common;

use common::{documented_routes as documented, TestServer};
use serde_json::Value;

#[tokio::test]
async fn every_documented_route_is_served() {
    let operations = documented();
    assert!(
        operations.len() >= 30,
        "read only {} operations from docs/openapi.json",
        operations.len()
    );
    for required in ["/v1/schedules", "/v1/queues/{queue}/keys/{key}", "/healthz"] {
        assert!(
            operations.iter().any(|(_, p)| p == required),
            "{required} missing from docs/openapi.json"
        );
    }
    let s = TestServer::start().await;
    for (method, path) in &operations {
        let concrete = path
            .replace("{queue}", "q")
            .replace("{id}", "00000000000000000000000000000000")
            .replace("{key}", "k")
            .replace("{schedule}", "s")
            .replace("{user}", "u");
        let body = (method != "GET" && method != "DELETE").then(|| "{}".to_owned());
        let (status, answer) = s.raw(method, &concrete, body).await;
        let code = match &answer {
            Value::Object(_) => answer["error"]["code"].as_str().unwrap_or("").to_owned(),
            _ => String::new(),
        };
        assert!(
            code != "route_not_found" && code != "method_not_allowed",
            "{method} {path} is documented but not served: {status} {answer}"
        );
    }
}

/// The route declarations of the API's source files: (method, path) for every
/// `.route("PATH", METHOD(handler).METHOD(handler)...)`.
fn declared_routes() -> Vec<(String, String)> {
    let sources = [
        include_str!("../src/api/mod.rs"),
        include_str!("../src/api/schedules.rs"),
        include_str!("../src/api/reminders.rs"),
        include_str!("../src/api/tokens.rs"),
    ];
    let mut routes = Vec::new();
    for source in sources {
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            // The call's text, up to its closing parenthesis.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find_map(|(i, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    (depth == 0).then_some(i)
                })
                .expect("a closed .route( call");
            let call = &rest[..end];
            let path = call.split('"').nth(1).expect("a path literal").to_owned();
            let tail = &call[call.find(',').expect("a method router")..];
            for method in ["get", "post", "put", "patch", "delete"] {
                let found = tail.match_indices(&format!("{method}(")).any(|(i, _)| {
                    i == 0
                        || !tail.as_bytes()[i - 1].is_ascii_alphanumeric()
                            && tail.as_bytes()[i - 1] != b'_'
                });
                if found {
                    routes.push((method.to_uppercase(), path.clone()));
                }
            }
            rest = &rest[end..];
        }
    }
    routes
}

#[test]
fn every_declared_route_is_documented() {
    let declared = declared_routes();
    assert!(
        declared.len() >= 30,
        "read only {} routes from the source: is the reader still right? {declared:?}",
        declared.len()
    );
    // Parameter names may differ (`{id}` in the router, `{schedule}` in the document).
    let shape = |(method, path): &(String, String)| {
        let erased: Vec<&str> = path
            .split('/')
            .map(|s| if s.starts_with('{') { "{}" } else { s })
            .collect();
        (method.clone(), erased.join("/"))
    };
    let documented: Vec<_> = documented().iter().map(shape).collect();
    let missing: Vec<_> = declared
        .iter()
        .filter(|route| !documented.contains(&shape(route)))
        .collect();
    assert!(
        missing.is_empty(),
        "routes the server declares but docs/openapi.json lacks: {missing:?}"
    );
}

#[tokio::test]
async fn the_server_serves_its_description() {
    let s = TestServer::start().await;
    let (status, served) = s.raw("GET", "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    let file: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    assert_eq!(served, file);
    assert_eq!(served["openapi"], "3.0.3");
}
