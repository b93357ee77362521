//! The request body's time limits, so that a slow or stalled client cannot hold a handler
//! and its connection:
//! - inactivity: a body that has sent nothing for `http.body_read_timeout` fails;
//! - a total limit: reads may wait for the body `http.body_read_timeout` in all, plus one
//!   second per `BODY_MIN_RATE` bytes received. Only time spent waiting for the client
//!   counts (not the handler's own work between reads). A body arriving at `BODY_MIN_RATE`
//!   bytes a second or faster is never cut by it; one drip-fed a byte at a time, each just
//!   inside the inactivity timeout (found by the HTTP audit to hold its connection for ever),
//!   fails after about one `http.body_read_timeout` of waiting.
//!
//! Both fail the body with [`BodyTimedOut`], answered `408 request_timeout` with
//! `connection: close` (`extract.rs`).
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
use tokio::time::{Instant, Sleep};

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
pub(super) struct DeclaredOverLimit {
    /// The length the request declared, and the limit it is over, for the error message.
    pub declared: u64,
    pub limit: usize,
}

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
        if let Some(declared) = declared.filter(|len| *len > self.limit as u64) {
            request.extensions_mut().insert(DeclaredOverLimit {
                declared,
                limit: self.limit,
            });
        }
        self.inner
            .call(request.map(|body| TimedBody::new(body, timeout)))
    }
}

/// The slowest average a request body may arrive at, in bytes a second, once its first
/// `http.body_read_timeout` is spent: each byte received gives the body 1/BODY_MIN_RATE s
/// more. Apache's `mod_reqtimeout` defaults to 500; legitimate clients send thousands of
/// times faster, and a client holding a connection with a slow body must pay for it in bytes.
pub(crate) const BODY_MIN_RATE: u64 = 1024;

/// A request body that fails with [`BodyTimedOut`] once it has had nothing to read for its
/// timeout, or has used up its total time (the module's doc).
pub(super) struct TimedBody {
    body: Body,
    timeout: Duration,
    /// Data bytes received so far; each gives the body more time in all.
    received: u64,
    /// Time reads have spent waiting for the body, before the current wait.
    waited: Duration,
    /// When the current wait began; None while frames come without waiting (a small body
    /// never reads the clock).
    wait_began: Option<Instant>,
    /// The timer of a read waiting for the body, set to the nearer of the two deadlines;
    /// kept between waits and reset, so a slow body allocates it once.
    waiting: Option<Pin<Box<Sleep>>>,
    /// Whether the armed deadline is the total one rather than the inactivity one.
    overall: bool,
}

impl TimedBody {
    fn new(body: Body, timeout: Duration) -> Self {
        TimedBody {
            body,
            timeout,
            received: 0,
            waited: Duration::ZERO,
            wait_began: None,
            waiting: None,
            overall: false,
        }
    }

    /// Sets the timer for a read that found nothing: at the inactivity timeout, or at the
    /// body's total deadline if that comes first.
    fn arm(&mut self) {
        let now = Instant::now();
        self.wait_began = Some(now);
        let left = self
            .timeout
            .saturating_add(allowance(self.received))
            .saturating_sub(self.waited);
        self.overall = left < self.timeout;
        let deadline = now + left.min(self.timeout);
        match self.waiting.as_mut() {
            Some(waiting) => waiting.as_mut().reset(deadline),
            None => self.waiting = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }
}

/// The time `bytes` received earn a body, beyond its first `http.body_read_timeout`.
fn allowance(bytes: u64) -> Duration {
    Duration::from_millis(bytes.saturating_mul(1000) / BODY_MIN_RATE)
}

/// What a body that sent nothing for the timeout, or arrived too slowly in all, fails with.
#[derive(Debug, thiserror::Error)]
pub(super) struct BodyTimedOut {
    /// Too slow in all (the total deadline), rather than silent for the timeout.
    pub overall: bool,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.overall {
            true => write!(
                f,
                "the request body arrived too slowly: it may take http.body_read_timeout plus \
                 one second per {BODY_MIN_RATE} bytes received"
            ),
            false => f.write_str("the request body sent nothing for http.body_read_timeout"),
        }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            if let Some(began) = this.wait_began.take() {
                this.waited = this.waited.saturating_add(began.elapsed());
            }
            if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
                this.received = this.received.saturating_add(data.len() as u64);
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if this.wait_began.is_none() {
            this.arm();
        }
        let overall = this.overall;
        // `arm` always sets the timer; were it missing, failing the body beats a read that
        // would never be woken.
        match this
            .waiting
            .as_mut()
            .map(|waiting| waiting.as_mut().poll(cx))
        {
            Some(Poll::Pending) => Poll::Pending,
            _ => Poll::Ready(Some(Err(BodyTimedOut { overall }.into()))),
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
        // Each part is large enough to pay for its wait (the total limit).
        let part = vec![b'a'; 10 * BODY_MIN_RATE as usize];
        for _ in 0..3 {
            tokio::time::sleep(TIMEOUT * 9 / 10).await;
            send.send(Bytes::from(part.clone())).await.unwrap();
        }
        drop(send);
        assert_eq!(reader.await.unwrap().unwrap().len(), 3 * part.len());
    }

    /// Found by the HTTP audit: a body drip-fed a byte at a time, each just inside the
    /// inactivity timeout, held its request (and its connection) for ever.
    #[tokio::test(start_paused = true)]
    async fn a_drip_fed_body_fails_once_its_total_time_is_spent() {
        let (send, mut body) = channel_body();
        let started = Instant::now();
        let reader = tokio::spawn(async move {
            while let Some(frame) = body.frame().await {
                if let Err(error) = frame {
                    return Some(error);
                }
            }
            None
        });
        // Sends until the body is dropped (the reader gave up).
        while send.send(Bytes::from_static(b" ")).await.is_ok() {
            tokio::time::sleep(TIMEOUT * 9 / 10).await;
        }
        let error = reader.await.unwrap().expect("the body failed");
        let timed_out = error.downcast_ref::<BodyTimedOut>().expect("timed out");
        assert!(timed_out.overall, "{error}");
        // About one timeout of waiting, plus the few milliseconds its bytes earned.
        let elapsed = started.elapsed();
        assert!(elapsed >= TIMEOUT && elapsed < TIMEOUT * 2, "{elapsed:?}");
    }

    /// The handler's own work between reads is not the client's: only the time reads wait
    /// for the body counts against its total limit.
    #[tokio::test(start_paused = true)]
    async fn time_the_handler_spends_between_reads_does_not_count() {
        let (send, mut body) = channel_body();
        let go = std::sync::Arc::new(tokio::sync::Notify::new());
        let asked = go.clone();
        // Sends a byte a fifth of the timeout after each read asks for one.
        let sender = tokio::spawn(async move {
            for _ in 0..4 {
                asked.notified().await;
                tokio::time::sleep(TIMEOUT / 5).await;
                send.send(Bytes::from_static(b"x")).await.unwrap();
            }
        });
        let started = Instant::now();
        for _ in 0..4 {
            go.notify_one();
            body.frame().await.unwrap().unwrap();
            // Busy elsewhere for three timeouts before reading on.
            tokio::time::sleep(TIMEOUT * 3).await;
        }
        sender.await.unwrap();
        assert!(body.frame().await.is_none());
        assert!(started.elapsed() > TIMEOUT * 12);
        assert_eq!(body.waited, TIMEOUT * 4 / 5);
    }

    #[tokio::test]
    async fn a_body_read_without_waiting_arms_no_timer() {
        let mut body = TimedBody::new(Body::from("{\"payload\":1}"), TIMEOUT);
        assert_eq!(body.size_hint().exact(), Some(13));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "{\"payload\":1}");
        assert!(body.waiting.is_none() && body.wait_began.is_none());
        assert!(body.frame().await.is_none());
        assert!(body.waiting.is_none() && body.wait_began.is_none());
    }
}
