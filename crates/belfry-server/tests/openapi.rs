//! `docs/openapi.json` and the server's routes cannot drift apart, either way:
//! - every documented path and method is sent to a real server, which must route it (any
//!   answer but `route_not_found` and `method_not_allowed`);
//! - every route the API's source declares (`.route("/path", get(..).post(..))` in `src/api/`)
//!   is documented;
//! - `GET /v1/openapi.json` serves the document itself.

mod common;

use common::{documented_routes as documented, TestServer};
use serde_json::{json, Value};

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

/// Checks `value` against a schema of `doc` in the subset of OpenAPI 3.0 the document uses
/// (`$ref`, `type`, `nullable`, `enum`, `required`, `properties`, `items`, `anyOf`, `oneOf`,
/// `allOf`), pushing what does not fit onto `problems`.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    if let Some(reference) = schema["$ref"].as_str() {
        let target = doc
            .pointer(&reference[1..])
            .expect("a $ref into the document");
        return check(doc, target, value, at, problems);
    }
    if value.is_null() && schema["nullable"] == true {
        return;
    }
    let fits = |s: &Value| {
        let mut found = Vec::new();
        check(doc, s, value, at, &mut found);
        found.is_empty()
    };
    if let Some(any) = schema["anyOf"].as_array() {
        if !any.iter().any(fits) {
            problems.push(format!("{at}: {value} fits none of anyOf"));
        }
    }
    if let Some(one) = schema["oneOf"].as_array() {
        let n = one.iter().filter(|s| fits(s)).count();
        if n != 1 {
            problems.push(format!("{at}: {value} fits {n} of oneOf"));
        }
    }
    for part in schema["allOf"].as_array().into_iter().flatten() {
        check(doc, part, value, at, problems);
    }
    let type_fits = match schema["type"].as_str() {
        None => true,
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some(other) => panic!("{at}: unknown type {other} in the document"),
    };
    if !type_fits {
        problems.push(format!("{at}: {value} is not of type {}", schema["type"]));
        return;
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            problems.push(format!("{at}: {value} is not one of {}", schema["enum"]));
        }
    }
    for field in schema["required"].as_array().into_iter().flatten() {
        let field = field.as_str().expect("required names");
        if value.get(field).is_none() {
            problems.push(format!("{at}: required {field} missing from {value}"));
        }
    }
    if let (Some(properties), Some(object)) = (schema["properties"].as_object(), value.as_object())
    {
        for (name, property) in properties {
            if let Some(inner) = object.get(name) {
                check(doc, property, inner, &format!("{at}.{name}"), problems);
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            check(doc, items, item, &format!("{at}[{i}]"), problems);
        }
    }
}

/// Sends a request and checks that the document lists its status for the operation `template`
/// and that the answer fits that response's schema. Returns the answer.
async fn conform(
    s: &TestServer,
    doc: &Value,
    problems: &mut Vec<String>,
    (method, template, path): (&str, &str, &str),
    body: Option<Value>,
) -> (u16, Value) {
    let (status, answer) = s.raw(method, path, body.map(|b| b.to_string())).await;
    let what = format!("{method} {path} → {status}");
    let operation = &doc["paths"][template][method.to_lowercase()];
    assert!(
        operation.is_object(),
        "{method} {template} is not documented"
    );
    let mut response = &operation["responses"][status.to_string()];
    if response.is_null() {
        problems.push(format!("{what}: the status is not documented ({answer})"));
        return (status, answer);
    }
    if let Some(reference) = response["$ref"].as_str() {
        response = doc.pointer(&reference[1..]).expect("a response $ref");
    }
    match response.pointer("/content/application~1json/schema") {
        Some(schema) => check(doc, schema, &answer, &what, problems),
        None if !answer.is_null() => {
            problems.push(format!("{what}: a body where none is documented: {answer}"))
        }
        None => {}
    }
    (status, answer)
}

/// The server's answers, successes and errors, fit what the document says of them: the status
/// is listed for the operation, and the body has the documented fields and types (generated
/// clients are strict about both).
#[tokio::test]
async fn answers_fit_the_document() {
    let doc: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let s = TestServer::start().await;
    let p = &mut Vec::new();
    let queue = ("PUT", "/v1/queues/{queue}", "/v1/queues/q");
    conform(&s, &doc, p, queue, Some(json!({}))).await;
    conform(
        &s,
        &doc,
        p,
        ("GET", "/v1/queues/{queue}", "/v1/queues/q"),
        None,
    )
    .await;
    conform(&s, &doc, p, ("GET", "/v1/queues", "/v1/queues"), None).await;
    let submit = ("POST", "/v1/queues/{queue}/tasks", "/v1/queues/q/tasks");
    let task = json!({"payload": {"n": 1}, "idempotency_key": "k"});
    let (_, created) = conform(&s, &doc, p, submit, Some(task.clone())).await;
    conform(&s, &doc, p, submit, Some(task)).await;
    let batch = (
        "POST",
        "/v1/queues/{queue}/tasks:batch",
        "/v1/queues/q/tasks:batch",
    );
    let tasks = json!({"tasks": [{"payload": 2}, {"idempotency_key": "k"}, {"delay_ms": -1}]});
    conform(&s, &doc, p, batch, Some(tasks)).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let one = format!("/v1/queues/q/tasks/{id}");
    conform(
        &s,
        &doc,
        p,
        ("GET", "/v1/queues/{queue}/tasks/{id}", &one),
        None,
    )
    .await;
    let lease = ("POST", "/v1/queues/{queue}/lease", "/v1/queues/q/lease");
    let (_, leased) = conform(&s, &doc, p, lease, Some(json!({"max": 1}))).await;
    let lease_id = leased["tasks"][0]["lease_id"].clone();
    let ack = ("POST", "/v1/queues/{queue}/ack", "/v1/queues/q/ack");
    let acks = json!({"acks": [{"id": id, "lease_id": lease_id}, {"id": id, "lease_id": "9"}]});
    conform(&s, &doc, p, ack, Some(acks)).await;
    let dead = ("GET", "/v1/queues/{queue}/dead", "/v1/queues/q/dead");
    conform(&s, &doc, p, dead, None).await;
    let forecast = (
        "GET",
        "/v1/queues/{queue}/forecast",
        "/v1/queues/q/forecast",
    );
    conform(&s, &doc, p, forecast, None).await;

    let schedule =
        json!({"id": "s", "queue": "q", "cron": "0 9 * * 1-5", "timezone": "Asia/Tokyo"});
    conform(
        &s,
        &doc,
        p,
        ("POST", "/v1/schedules", "/v1/schedules"),
        Some(schedule),
    )
    .await;
    let get = ("GET", "/v1/schedules/{schedule}", "/v1/schedules/s");
    conform(&s, &doc, p, get, None).await;
    let next = (
        "GET",
        "/v1/schedules/{schedule}/next",
        "/v1/schedules/s/next?n=3",
    );
    conform(&s, &doc, p, next, None).await;
    conform(&s, &doc, p, ("GET", "/v1/schedules", "/v1/schedules"), None).await;

    let reminder = json!({"id": "r", "queue": "q", "delay_ms": 60_000, "content": {"t": 1}});
    conform(
        &s,
        &doc,
        p,
        ("POST", "/v1/reminders", "/v1/reminders"),
        Some(reminder),
    )
    .await;
    conform(
        &s,
        &doc,
        p,
        ("GET", "/v1/reminders/{id}", "/v1/reminders/r"),
        None,
    )
    .await;
    conform(
        &s,
        &doc,
        p,
        ("GET", "/v1/reminders", "/v1/reminders?queue=q"),
        None,
    )
    .await;
    let user = "/v1/reminders/{id}/subscribers/{user}";
    conform(
        &s,
        &doc,
        p,
        ("PUT", user, "/v1/reminders/r/subscribers/u1"),
        None,
    )
    .await;
    conform(
        &s,
        &doc,
        p,
        ("GET", user, "/v1/reminders/r/subscribers/u1"),
        None,
    )
    .await;
    let bulk = (
        "POST",
        "/v1/reminders/{id}/subscribers",
        "/v1/reminders/r/subscribers",
    );
    conform(&s, &doc, p, bulk, Some(json!(["u2", 3, ""]))).await;
    let count = "/v1/reminders/{id}/subscribers/count";
    conform(
        &s,
        &doc,
        p,
        ("GET", count, "/v1/reminders/r/subscribers/count"),
        None,
    )
    .await;
    let list = (
        "GET",
        "/v1/reminders/{id}/subscribers",
        "/v1/reminders/r/subscribers",
    );
    conform(&s, &doc, p, list, None).await;
    let feed = (
        "GET",
        "/v1/users/{user}/reminders",
        "/v1/users/u1/reminders",
    );
    conform(&s, &doc, p, feed, None).await;

    // Errors, one of each family.
    let errors: [(&str, &str, &str, Option<Value>); 9] = [
        ("GET", "/v1/queues/{queue}", "/v1/queues/nope", None),
        (
            "GET",
            "/v1/queues/{queue}/dead",
            "/v1/queues/nope/dead",
            None,
        ),
        (
            "GET",
            "/v1/queues/{queue}/dead",
            "/v1/queues/q/dead?limit=0",
            None,
        ),
        (
            "GET",
            "/v1/queues/{queue}/tasks/{id}",
            "/v1/queues/q/tasks/xyz",
            None,
        ),
        (
            "POST",
            "/v1/queues/{queue}/tasks",
            "/v1/queues/q/tasks",
            Some(json!({"delay_ms": "soon"})),
        ),
        (
            "GET",
            "/v1/schedules/{schedule}",
            "/v1/schedules/nope",
            None,
        ),
        ("GET", "/v1/reminders/{id}", "/v1/reminders/nope", None),
        ("PUT", user, "/v1/reminders/nope/subscribers/u1", None),
        (
            "GET",
            "/v1/users/{user}/reminders",
            "/v1/users/u1/reminders?limit=0",
            None,
        ),
    ];
    for (method, template, path, body) in errors {
        let (status, _) = conform(&s, &doc, p, (method, template, path), body).await;
        assert!(
            (400..500).contains(&status),
            "{method} {path} answered {status}"
        );
    }
    conform(&s, &doc, p, ("GET", "/healthz", "/healthz"), None).await;
    conform(&s, &doc, p, ("GET", "/readyz", "/readyz"), None).await;
    assert!(
        p.is_empty(),
        "answers that do not fit docs/openapi.json:\n{}",
        p.join("\n")
    );
}
