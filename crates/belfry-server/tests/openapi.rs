//! `docs/openapi.yaml` names no route the server lacks: every documented path and method is
//! sent to a real server, which must route it (any answer but `route_not_found` and
//! `method_not_allowed`). Until the document is generated from the code, this keeps it from
//! drifting the one way a test can see.

mod common;

use common::{documented_routes as documented, TestServer};
use serde_json::Value;

#[tokio::test]
async fn every_documented_route_is_served() {
    let operations = documented();
    assert!(
        operations.len() >= 30,
        "read only {} operations from docs/openapi.yaml: is the parser still right?",
        operations.len()
    );
    for required in ["/v1/schedules", "/v1/queues/{queue}/keys/{key}", "/healthz"] {
        assert!(
            operations.iter().any(|(_, p)| p == required),
            "{required} missing from docs/openapi.yaml"
        );
    }
    let s = TestServer::start().await;
    for (method, path) in &operations {
        let concrete = path
            .replace("{queue}", "q")
            .replace("{id}", "00000000000000000000000000000000")
            .replace("{key}", "k")
            .replace("{schedule}", "s");
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
