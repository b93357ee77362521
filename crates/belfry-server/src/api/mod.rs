//! HTTP API v1. The only module that knows HTTP and JSON: handlers turn requests into DTOs,
//! DTOs into domain calls on `Service`, and results back into JSON.

pub mod auth;
mod body_timeout;
mod bulk;
mod bulk_read;
mod dead;
mod dto;
mod error;
mod extract;
mod leases;
mod lines;
mod ops;
mod origin;
mod payload;
mod queues;
pub(crate) mod reminders;
pub(crate) mod schedules;
mod tasks;
pub mod tokens;
mod wire;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::Method;
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use axum::Router;

pub use error::{ApiError, ErrorCode};

use crate::metrics;
use crate::service::Service;

type AppState = Arc<Service>;

/// The v1 API and the operational endpoints. Merge more routes onto it with `Router::merge`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/queues", get(queues::list))
        .route(
            "/v1/queues/{queue}",
            put(queues::put).get(queues::get).delete(queues::delete),
        )
        .route("/v1/queues/{queue}/purge", post(queues::purge))
        .route("/v1/queues/{queue}/pause", post(queues::pause))
        .route("/v1/queues/{queue}/resume", post(queues::resume))
        .route(
            "/v1/queues/{queue}/tasks",
            post(tasks::submit).get(tasks::list),
        )
        .route("/v1/queues/{queue}/tasks:batch", post(tasks::submit_batch))
        .route("/v1/queues/{queue}/tasks:cancel", post(tasks::cancel_many))
        .route(
            "/v1/queues/{queue}/tasks:import",
            // Streamed and bounded by `import_body_bytes_max`, not the request limit.
            post(tasks::import).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/queues/{queue}/tasks/{id}",
            get(tasks::get)
                .delete(tasks::cancel)
                .patch(tasks::reschedule),
        )
        .route(
            "/v1/queues/{queue}/keys/{key}",
            get(tasks::get_by_key)
                .delete(tasks::cancel_by_key)
                .patch(tasks::reschedule_by_key),
        )
        .route("/v1/queues/{queue}/lease", post(leases::lease))
        .route("/v1/queues/{queue}/ack", post(leases::ack_batch))
        .route("/v1/queues/{queue}/tasks/{id}/ack", post(leases::ack))
        .route("/v1/queues/{queue}/tasks/{id}/nack", post(leases::nack))
        .route("/v1/queues/{queue}/tasks/{id}/extend", post(leases::extend))
        .route("/v1/queues/{queue}/dead", get(dead::list_dead))
        .route("/v1/queues/{queue}/dead:redrive", post(dead::redrive_many))
        .route("/v1/queues/{queue}/dead:delete", post(dead::delete_many))
        .route("/v1/queues/{queue}/dead/{id}", delete(dead::delete))
        .route("/v1/queues/{queue}/dead/{id}/redrive", post(dead::redrive))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/v1/openapi.json", get(ops::openapi))
        .with_state(service)
}

/// What every router of the server gets, after merging: our error format for unknown routes
/// and methods, request latency metrics, the bearer-token check (`auth`; it passes everything
/// when no token is configured), a request body that sends nothing for `body_read_timeout`,
/// or arrives too slowly in all, failing its request (`body_timeout`: a slow or stalled
/// client cannot hold a handler or its connection), and `body_limit`
/// for bodies read whole (a route that streams its body lifts it with its own
/// `DefaultBodyLimit::disable()`, which runs after this one).
///
/// All of it is one layer stack applied once. Each `Router::layer` call boxes every route
/// again, and each request then clones every boxed level's service and boxes its future:
/// four such calls cost a single-task submit 15 of its 54 allocations and 11% of its
/// instructions (callgrind, 10,000 submits).
pub fn finish(
    router: Router,
    body_limit: usize,
    body_read_timeout: std::time::Duration,
    auth: Arc<crate::auth::Auth>,
) -> Router {
    let edge = tower::ServiceBuilder::new()
        .layer(TrackLatencyLayer)
        .layer(auth::AuthLayer::new(auth))
        .layer(body_timeout::BodyTimeoutLayer::new(
            body_read_timeout,
            body_limit,
        ))
        .layer(DefaultBodyLimit::max(body_limit));
    router
        .fallback(ops::route_not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(edge)
}

/// Records every request's latency. Written as a plain tower layer rather than with
/// `middleware::from_fn`, which per request cloned the boxed inner service and built a `Next`
/// and a second boxed future: that machinery was about an eighth of a single-task submit's
/// instructions (callgrind).
#[derive(Clone, Copy)]
struct TrackLatencyLayer;

impl<S> tower::Layer<S> for TrackLatencyLayer {
    type Service = TrackLatency<S>;

    fn layer(&self, inner: S) -> TrackLatency<S> {
        TrackLatency { inner }
    }
}

#[derive(Clone)]
struct TrackLatency<S> {
    inner: S,
}

impl<S> tower::Service<Request> for TrackLatency<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = TrackLatencyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let started = Instant::now();
        // Clones, not copies: standard methods and the matched route (an `Arc<str>`) clone
        // without allocating.
        let method = request.method().clone();
        let route = request.extensions().get::<MatchedPath>().cloned();
        TrackLatencyFuture {
            inner: self.inner.call(request),
            started,
            method,
            route,
        }
    }
}

/// The inner response future, then the latency record. A named future rather than a boxed
/// `async` block: one allocation less per request. The router's futures are `Unpin` (they
/// box what they run), so no pin projection is needed.
struct TrackLatencyFuture<F> {
    inner: F,
    started: Instant,
    method: Method,
    route: Option<MatchedPath>,
}

impl<F> Future for TrackLatencyFuture<F>
where
    F: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match Pin::new(&mut self.inner).poll(cx) {
            Poll::Ready(Ok(response)) => response,
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => return Poll::Pending,
        };
        metrics::http_request(
            &self.method,
            self.route.as_ref().map_or("unmatched", MatchedPath::as_str),
            response.status().as_u16(),
            self.started.elapsed().as_secs_f64(),
        );
        Poll::Ready(Ok(response))
    }
}
