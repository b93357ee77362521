//! The request body's inactivity timeout: a body that has sent nothing for the configured
//! time fails its request, so a slow or stalled client cannot hold a handler.
//!
//! Like tower-http's `RequestBodyTimeoutLayer`, which it replaces, the wait is measured from
//! when a read found nothing, and every frame that arrives starts it again. Unlike it, the
//! timer is armed only when the body has nothing ready: that layer armed a timer for every
//! frame and dropped it at once when the frame was already buffered, which is every frame
//! of a small request, and the two timer registrations per submit were about a tenth of its
//! instructions (callgrind, `scripts/callgrind-submits.sh`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::time::Sleep;

/// Wraps each request's body in a [`TimedBody`].
#[derive(Clone, Copy)]
pub(super) struct BodyTimeoutLayer {
    timeout: Duration,
    limit: usize,
}

impl BodyTimeoutLayer {
    /// A request that declares a body over `limit` (`limits.request_max`) is marked with
    /// [`DeclaredOverLimit`], so that a JSON body is refused before any of it is awaited.
    pub(super) fn new(timeout: Duration, limit: usize) -> Self {
        BodyTimeoutLayer { timeout, limit }
    }
}

/// In a request's extensions: its `Content-Length` is over `limits.request_max`. Only such
/// requests carry it, so the common request pays a header lookup and no insert. The bulk
/// subscriber routes have their own limit and do not look at it.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeclaredOverLimit;

impl<S> tower::Layer<S> for BodyTimeoutLayer {
    type Service = BodyTimeout<S>;

    fn layer(&self, inner: S) -> BodyTimeout<S> {
        BodyTimeout {
            inner,
            timeout: self.timeout,
            limit: self.limit,
        }
    }
}

#[derive(Clone)]
pub(super) struct BodyTimeout<S> {
    inner: S,
    timeout: Duration,
    limit: usize,
}

impl<S> tower::Service<Request> for BodyTimeout<S>
where
    S: tower::Service<Request<TimedBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> S::Future {
        let timeout = self.timeout;
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.limit as u64) {
            request.extensions_mut().insert(DeclaredOverLimit);
        }
        self.inner
            .call(request.map(|body| TimedBody::new(body, timeout)))
    }
}

/// A request body that fails with [`BodyTimedOut`] once it has had nothing to read for its
/// timeout.
pub(super) struct TimedBody {
    body: Body,
    timeout: Duration,
    /// Armed while a read waits for the body; `None` while frames come without waiting.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl TimedBody {
    fn new(body: Body, timeout: Duration) -> Self {
        TimedBody {
            body,
            timeout,
            waiting: None,
        }
    }
}

/// What a body that sent nothing for the timeout fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for the body read timeout")]
pub(super) struct BodyTimedOut;

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.waiting = None;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let waiting = this
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper::body::Body as _;

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// A body whose frames arrive through a channel, as a slow client's would.
    fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, TimedBody) {
        let (send, receive) = tokio::sync::mpsc::channel::<Bytes>(4);
        let frames = futures_util::stream::unfold(receive, |mut receive| async move {
            let bytes = receive.recv().await?;
            Some((Ok::<_, std::io::Error>(Frame::data(bytes)), receive))
        });
        let body = Body::new(http_body_util::StreamBody::new(frames));
        (send, TimedBody::new(body, TIMEOUT))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_sends_nothing_for_the_timeout_fails() {
        let (send, mut body) = channel_body();
        send.send(Bytes::from_static(b"{\"pay")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "{\"pay");
        // Paused time advances only while everything waits: to the timer's deadline.
        let started = tokio::time::Instant::now();
        let stalled = body.frame().await.unwrap();
        let error = stalled.unwrap_err();
        assert!(error.is::<BodyTimedOut>(), "{error}");
        assert_eq!(started.elapsed(), TIMEOUT);
        drop(send);
    }

    #[tokio::test(start_paused = true)]
    async fn each_frame_starts_the_wait_again() {
        let (send, mut body) = channel_body();
        let reader = tokio::spawn(async move {
            let mut read = Vec::new();
            while let Some(frame) = body.frame().await {
                read.extend_from_slice(&frame?.into_data().unwrap());
            }
            Ok::<_, axum::BoxError>(read)
        });
        // Three waits of most of the timeout each: 2.7 timeouts in all, never one whole.
        for part in [&b"{\"a\""[..], b":1", b"}"] {
            tokio::time::sleep(TIMEOUT * 9 / 10).await;
            send.send(Bytes::from_static(part)).await.unwrap();
        }
        drop(send);
        assert_eq!(reader.await.unwrap().unwrap(), b"{\"a\":1}");
    }

    #[tokio::test]
    async fn a_body_read_without_waiting_arms_no_timer() {
        let mut body = TimedBody::new(Body::from("{\"payload\":1}"), TIMEOUT);
        assert_eq!(body.size_hint().exact(), Some(13));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "{\"payload\":1}");
        assert!(body.waiting.is_none());
        assert!(body.frame().await.is_none());
        assert!(body.waiting.is_none());
    }
}
