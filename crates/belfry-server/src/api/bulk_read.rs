//! Reading a bulk body as it streams in, for every bulk route (a task import, a bulk
//! subscribe or unsubscribe): the size limit, what a body that stalls or breaks off is
//! answered, and the order of parsing and applying. What a route parses and how it applies a
//! batch are its own ([`BulkApply`]).
//!
//! The promise every bulk answer makes rests on this order: when a body stops early,
//! everything before the line it stops at was applied and nothing from it on was, so a client
//! resends the body from that line.

use std::future::Future;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

use super::error::{ApiError, ErrorCode};

/// What a bulk route does with its body.
pub(super) trait BulkApply {
    /// Parses more of the body, keeping what it finds until [`BulkApply::take`].
    fn feed(&mut self, bytes: &[u8]);
    /// The body ended: parses what is left; an error when it ended inside an item (an array
    /// without its `]`).
    fn finish(&mut self) -> Result<(), ApiError>;
    /// The number of the line (or array element) being read.
    fn line(&self) -> u64;
    /// Applies the items parsed so far a whole batch at a time, keeping the rest. A batch
    /// refused stops the body at its first line, with the error.
    fn take(&mut self) -> impl Future<Output = Result<(), (ApiError, u64)>> + Send;
    /// Applies every item still kept, however few.
    fn flush(&mut self) -> impl Future<Output = Result<(), (ApiError, u64)>> + Send;
}

/// Whether the request declares a body longer than `max` (refused before any of it is read).
pub(super) fn declared_over(headers: &HeaderMap, max: u64) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|len| len > max)
}

/// Reads `body` to its end, at most `max` bytes of it, applying it through `apply`. Answers
/// why it stopped early, if it did, and the line it stopped at. `too_large` is the route's
/// answer to a body over `max`; the lines wholly within `max` are still applied.
pub(super) async fn read_and_apply<A: BulkApply + Send>(
    apply: &mut A,
    body: Body,
    max: u64,
    too_large: impl Fn(u64) -> ApiError,
) -> Option<(ApiError, u64)> {
    let mut stream = body.into_data_stream();
    let mut read: u64 = 0;
    let stop = loop {
        let chunk = match stream.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => break Some(broke_off(&e, apply.line())),
            None => break apply.finish().err(),
        };
        read += chunk.len() as u64;
        if read > max {
            let within = chunk.len() - usize::try_from(read - max).unwrap_or(chunk.len());
            apply.feed(&chunk[..within]);
            break Some(too_large(max));
        }
        apply.feed(&chunk);
        if let Err(refused) = apply.take().await {
            return Some(refused);
        }
    };
    // What was read before the end (or the cut) is applied, whatever its count.
    let applied = match apply.take().await {
        Ok(()) => apply.flush().await,
        Err(refused) => Err(refused),
    };
    match applied {
        Ok(()) => stop.map(|e| (e, apply.line())),
        Err(refused) => Some(refused),
    }
}

/// Why the body stopped at `line`: too slow (`408 request_timeout`, as any request body would
/// be), or cut off.
fn broke_off(error: &axum::Error, line: u64) -> ApiError {
    match super::extract::timed_out(error) {
        Some(timed_out) => ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "{timed_out} (at line {line}): a bulk body must keep coming; send it from a \
                 file, or raise http.body_read_timeout"
            ),
        ),
        None => ApiError::new(
            ErrorCode::BodyIncomplete,
            format!("the body broke off at line {line}: {error}"),
        ),
    }
}
