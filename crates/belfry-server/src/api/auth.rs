//! Authentication at the HTTP edge: which [`Need`] each route has, and a tower layer that
//! refuses a request before its handler runs (`401 unauthorized`, `403 forbidden`), and
//! before that a browser's request for another site (`403 cross_origin_refused`,
//! [`super::origin`]).
//!
//! The policy is decided from the matched route alone (its template, the method, and the
//! `{queue}` segment of the path), never from the body. It is deny-by-default: a route this
//! table does not name needs `admin` (or `read`, if it is a `GET`), so a route added without
//! thought is not left open. `tests/auth.rs` tries every documented route with no token, a
//! wrong one, one of the wrong scope and one of the right scope.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{MatchedPath, Request};
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};
use crate::auth::{Auth, Denied, Need};

/// Task routes: `produce:<queue>` (a `GET` of them is also allowed by `read`).
const PRODUCE_ROUTES: &[&str] = &[
    "/v1/queues/{queue}/tasks",
    "/v1/queues/{queue}/tasks:batch",
    "/v1/queues/{queue}/tasks:import",
    "/v1/queues/{queue}/tasks:cancel",
    "/v1/queues/{queue}/tasks/{id}",
    "/v1/queues/{queue}/keys/{key}",
];

/// Delivery routes: `consume:<queue>`.
const CONSUME_ROUTES: &[&str] = &[
    "/v1/queues/{queue}/lease",
    "/v1/queues/{queue}/ack",
    "/v1/queues/{queue}/tasks/{id}/ack",
    "/v1/queues/{queue}/tasks/{id}/nack",
    "/v1/queues/{queue}/tasks/{id}/extend",
];

/// Routes anyone may call: a load balancer's health checks carry no token, and the web
/// console's page and assets (the `belfry-console` crate, merged by the binary) hold no data:
/// the console's own API calls carry the operator's token and are checked like any other.
const PUBLIC_ROUTES: &[&str] = &[
    "/healthz",
    "/readyz",
    "/",
    "/console",
    "/console/",
    "/console/{*path}",
];

/// Routes that need `admin` even to read: who holds which token is not for every reader.
const ADMIN_ROUTES: &[&str] = &["/v1/tokens", "/v1/tokens/{name}"];

/// What a request to `route` (the matched template, `None` if no route matched) with
/// `method` needs; `path` is the request's path, for the queue name.
pub fn need(method: &Method, route: Option<&str>, path: &str) -> Need {
    let Some(route) = route else {
        return Need::AnyToken;
    };
    let reads = *method == Method::GET || *method == Method::HEAD;
    if PUBLIC_ROUTES.contains(&route) {
        return Need::Public;
    }
    if ADMIN_ROUTES.contains(&route) {
        return Need::Admin;
    }
    let queue = || queue_segment(route, path);
    if PRODUCE_ROUTES.contains(&route) {
        return Need::Produce {
            queue: queue(),
            read: reads,
        };
    }
    if CONSUME_ROUTES.contains(&route) && !reads {
        return Need::Consume { queue: queue() };
    }
    if reads {
        Need::Read
    } else {
        Need::Admin
    }
}

/// [`need`], for a request with `query`: a listing that asks for tasks' own targets whole
/// (`full_target=true`, credentials and query strings included) needs what a submit to its
/// queue needs (`produce:<queue>`) rather than `read`, and a dead-letter listing `admin`.
pub fn need_with_query(
    method: &Method,
    route: Option<&str>,
    path: &str,
    query: Option<&str>,
) -> Need {
    let need = need(method, route, path);
    if !asks_full_targets(query) {
        return need;
    }
    match need {
        Need::Produce { queue, .. } => Need::Produce { queue, read: false },
        Need::Read => Need::Admin,
        other => other,
    }
}

/// Whether the query says `full_target=true`, decoded as the handlers' extractor decodes it
/// (`full%5Ftarget=true` is the same).
fn asks_full_targets(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "full_target" && v != "false")
    })
}

/// The path segment where `route` has `{queue}`. A segment with a `%` escape is returned as
/// `%`, which no pattern matches: an escaped name is never matched against a scope (the
/// handler would decode it; refusing is the safe side).
fn queue_segment(route: &str, path: &str) -> String {
    let Some(at) = route.split('/').position(|s| s == "{queue}") else {
        return String::new();
    };
    match path.split('/').nth(at) {
        Some(segment) if !segment.contains('%') => segment.to_owned(),
        _ => "%".to_owned(),
    }
}

/// The bearer token of `request`, if it sent one (`Authorization: Bearer <token>`).
fn bearer(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn refusal(denied: Denied) -> Response {
    match denied {
        Denied::Unauthorized(message) => {
            ApiError::new(ErrorCode::Unauthorized, message).into_response()
        }
        Denied::Forbidden { token, needed } => ApiError::new(
            ErrorCode::Forbidden,
            format!("token {token:?} lacks the scope this request needs: {needed}"),
        )
        .into_response(),
        Denied::RateLimited { token, retry_after } => {
            // Whole seconds, rounded up: a client that waits this long finds a request free.
            let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            let mut response = ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "token {token:?} is over its request rate (its rate_per_s, set in \
                     [[auth.tokens]] or when it was made through the API); retry after {seconds} s"
                ),
            )
            .into_response();
            if let Ok(value) = header::HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
    }
}

/// Checks every request against `auth` before the route runs. A plain tower layer, like the
/// latency one (no per-request boxing); with authentication off it only forwards.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Arc<Auth>,
}

impl AuthLayer {
    pub fn new(auth: Arc<Auth>) -> Self {
        AuthLayer { auth }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            auth: self.auth.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Arc<Auth>,
}

impl<S> tower::Service<Request> for AuthService<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = AuthFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if let Some(why) = super::origin::host_problem(request.version(), request.headers()) {
            let refused = ApiError::new(ErrorCode::MalformedHttp, why).into_response();
            return AuthFuture::Refused(Some(refused));
        }
        let open = !self.auth.enabled();
        if let Some(why) = super::origin::refusal(request.method(), request.headers(), open) {
            let refused = ApiError::new(ErrorCode::CrossOriginRefused, why).into_response();
            return AuthFuture::Refused(Some(refused));
        }
        if !open {
            let route = request.extensions().get::<MatchedPath>();
            let need = need_with_query(
                request.method(),
                route.map(MatchedPath::as_str),
                request.uri().path(),
                request.uri().query(),
            );
            if let Err(denied) = self.auth.check(bearer(&request), &need) {
                return AuthFuture::Refused(Some(refusal(denied)));
            }
        }
        AuthFuture::Inner(self.inner.call(request))
    }
}

/// The route's own future, or the refusal, ready at once.
pub enum AuthFuture<F> {
    Inner(F),
    Refused(Option<Response>),
}

impl<F> Future for AuthFuture<F>
where
    F: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            AuthFuture::Inner(inner) => Pin::new(inner).poll(cx),
            AuthFuture::Refused(response) => Poll::Ready(Ok(response
                .take()
                .unwrap_or_else(|| ApiError::new(ErrorCode::Unauthorized, "").into_response()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_their_needs() {
        let produce = |q: &str, read| Need::Produce {
            queue: q.into(),
            read,
        };
        let cases = [
            (Method::GET, Some("/healthz"), "/healthz", Need::Public),
            (
                Method::GET,
                Some("/console/{*path}"),
                "/console/js/app.js",
                Need::Public,
            ),
            (
                Method::POST,
                Some("/v1/queues/{queue}/tasks"),
                "/v1/queues/orders/tasks",
                produce("orders", false),
            ),
            (
                Method::GET,
                Some("/v1/queues/{queue}/tasks/{id}"),
                "/v1/queues/orders/tasks/abc",
                produce("orders", true),
            ),
            (
                Method::POST,
                Some("/v1/queues/{queue}/tasks/{id}/nack"),
                "/v1/queues/mail/tasks/abc/nack",
                Need::Consume {
                    queue: "mail".into(),
                },
            ),
            (Method::GET, Some("/v1/queues"), "/v1/queues", Need::Read),
            (Method::GET, Some("/metrics"), "/metrics", Need::Read),
            (
                Method::PUT,
                Some("/v1/queues/{queue}"),
                "/v1/queues/x",
                Need::Admin,
            ),
            (
                Method::POST,
                Some("/v1/schedules"),
                "/v1/schedules",
                Need::Admin,
            ),
            (Method::GET, None, "/nowhere", Need::AnyToken),
            (Method::GET, Some("/v1/tokens"), "/v1/tokens", Need::Admin),
            (
                Method::POST,
                Some("/v1/queues/{queue}/tasks"),
                "/v1/queues/%6Frders/tasks",
                produce("%", false),
            ),
        ];
        for (method, route, path, expected) in cases {
            assert_eq!(need(&method, route, path), expected, "{method} {path}");
        }
    }

    #[test]
    fn listings_of_whole_targets_need_more_than_read() {
        let tasks = Some("/v1/queues/{queue}/tasks");
        let dead = Some("/v1/queues/{queue}/dead");
        let with = |route, path, query| need_with_query(&Method::GET, route, path, query);
        let listed = Need::Produce {
            queue: "orders".into(),
            read: true,
        };
        let whole = Need::Produce {
            queue: "orders".into(),
            read: false,
        };
        let path = "/v1/queues/orders/tasks";
        assert_eq!(with(tasks, path, None), listed);
        assert_eq!(with(tasks, path, Some("limit=5&full_target=false")), listed);
        assert_eq!(with(tasks, path, Some("limit=5&full_target=true")), whole);
        assert_eq!(with(tasks, path, Some("full%5Ftarget=true")), whole);
        let path = "/v1/queues/orders/dead";
        assert_eq!(with(dead, path, Some("payload=false")), Need::Read);
        assert_eq!(with(dead, path, Some("full_target=true")), Need::Admin);
    }
}
