//! Request extractors whose failures are `ApiError`s, never axum's plain-text rejections.

use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use belfry_core::{QueueName, TaskId};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::{ApiError, ErrorCode};

/// A JSON body. An empty body reads as `{}`, so endpoints whose fields are all optional work
/// with a bare `curl -X POST`. No content type is required.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBytes(bytes) = JsonBytes::from_request(req, state).await?;
        Ok(JsonBody(parse_json(&bytes)?))
    }
}

/// A JSON body's bytes, read but not yet parsed, for bodies parsed into types that borrow
/// from them (`parse_json`): the hot batch endpoints then copy no strings.
pub struct JsonBytes(pub Bytes);

impl<S> FromRequest<S> for JsonBytes
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A declared length over the limit is refused at once, not after waiting for a body
        // that may never come.
        if let Some(over) = req
            .extensions()
            .get::<super::body_timeout::DeclaredOverLimit>()
        {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the request body is {} bytes, more than the {} this server takes \
                     (limits.request_max in its configuration); send less per request, or use \
                     the batch or import routes for many tasks",
                    over.declared, over.limit
                ),
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                too_large_body()
            } else if let Some(timed_out) = timed_out(&rejection) {
                ApiError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "{timed_out}: send the whole body without pausing, or raise the \
                         timeout in the server's configuration"
                    ),
                )
            } else {
                // The length is within bounds and the body did not stall: what is left is its
                // framing (hyper's "error reading a body from connection" says no more).
                ApiError::new(
                    ErrorCode::MalformedHttp,
                    "the request body could not be read: it ended before its Content-Length, or \
                     its chunked encoding is malformed; send the body exactly as the headers \
                     describe it",
                )
            }
        })?;
        Ok(JsonBytes(bytes))
    }
}

fn too_large_body() -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        "the request body is larger than the server allows (limits.request_max in its configuration)",
    )
}

/// Why reading the body timed out, if `error` (a rejection, a body stream's error) says it
/// did: it stalled, or it was too slow in all.
pub(super) fn timed_out<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a super::body_timeout::BodyTimedOut> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(timed_out) = error.downcast_ref::<super::body_timeout::BodyTimedOut>() {
            return Some(timed_out);
        }
        cause = error.source();
    }
    None
}

/// Parses a body read by `JsonBytes`, with `JsonBody`'s rules (an empty body is `{}`).
///
/// A body of the wrong shape is answered with the field at fault (`retry.max_attempts:
/// invalid type: ...`), found by parsing it a second time with path tracking: errors are
/// rare, so the common case pays nothing for it.
pub fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    let Some(&first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
        return parse_json(b"{}");
    };
    // Every body is an object: serde would also take an array, filling the fields by position
    // (`[{"a": 1}, null, 5000]` was a task with a delay).
    if first != b'{' && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
        let kind = match first {
            b'[' => "an array",
            b'"' => "a string",
            b't' | b'f' => "a boolean",
            b'n' => "null",
            _ => "a number",
        };
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the body must be a JSON object ({{\"field\": value, ...}}), not {kind}"),
        ));
    }
    let text = bytes;
    match serde_json::from_slice(text) {
        Ok(value) => Ok(value),
        // JSON text is UTF-8 (RFC 8259): bytes that are not are a syntax error, not a field
        // of the wrong shape ("payload: invalid unicode code point").
        Err(_) if let Err(bad) = std::str::from_utf8(text) => Err(ApiError::new(
            ErrorCode::MalformedJson,
            format!(
                "the body is not valid UTF-8 (at byte {}): JSON text is UTF-8",
                bad.valid_up_to()
            ),
        )),
        // Some shape errors are reported as syntax ("expected value") by the borrowed
        // types; valid JSON means the shape is at fault.
        Err(error) if serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok() => {
            Err(shape_error::<T>(text).unwrap_or_else(|| error.into()))
        }
        Err(error) => Err(error.into()),
    }
}

/// The shape error of `text` as `T`, naming the field, or `None` if the path is the root.
fn shape_error<'a, T: Deserialize<'a>>(text: &'a [u8]) -> Option<ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let error = serde_path_to_error::deserialize::<_, T>(&mut deserializer).err()?;
    let path = error.path().to_string();
    if path.is_empty() || path == "." {
        return None;
    }
    let inner = error.into_inner();
    Some(ApiError::new(
        ErrorCode::InvalidRequest,
        format!("the body does not match the expected shape: {path}: {inner}"),
    ))
}

/// Path parameters by name, decoded. `RawPathParams` shares the router's decoded strings
/// (reference counts, one `Vec`) where `Path<Vec<(String, String)>>` copied each name and
/// value into new `String`s on every request.
async fn params(parts: &mut Parts) -> Result<RawPathParams, ApiError> {
    RawPathParams::from_request_parts(parts, &())
        .await
        .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("bad path: {e}")))
}

fn param<'a>(params: &'a RawPathParams, name: &str) -> Result<&'a str, ApiError> {
    params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .ok_or_else(|| ApiError::new(ErrorCode::InternalError, format!("route lacks {{{name}}}")))
}

pub fn queue_name(text: &str) -> Result<QueueName, ApiError> {
    QueueName::new(text).map_err(|e| ApiError::new(ErrorCode::InvalidQueueName, e.to_string()))
}

pub fn task_id(text: &str) -> Result<TaskId, ApiError> {
    text.parse().map_err(|e: belfry_core::ParseTaskIdError| {
        ApiError::new(ErrorCode::InvalidTaskId, e.to_string())
    })
}

/// The task ids of a bulk body's `ids` field: 1 to `max` of them, each parsed, an error
/// naming the one at fault by its index (`ids[3]: ...`).
pub fn task_ids(ids: &[String], max: usize) -> Result<Vec<TaskId>, ApiError> {
    if ids.is_empty() || ids.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("ids must name between 1 and {max} tasks, got {}", ids.len()),
        ));
    }
    ids.iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse().map_err(|e: belfry_core::ParseTaskIdError| {
                ApiError::new(ErrorCode::InvalidTaskId, format!("ids[{i}]: {e}"))
            })
        })
        .collect()
}

/// `{queue}` from the path, validated.
pub struct QueuePath(pub QueueName);

impl<S: Send + Sync> FromRequestParts<S> for QueuePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let params = params(parts).await?;
        Ok(QueuePath(queue_name(param(&params, "queue")?)?))
    }
}

/// `{queue}` and `{key}` (an idempotency key, percent-decoded) from the path, validated.
pub struct KeyPath(pub QueueName, pub String);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let params = params(parts).await?;
        let queue = queue_name(param(&params, "queue")?)?;
        let key = param(&params, "key")?;
        let max = belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX;
        if key.is_empty() || key.len() > max {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "the idempotency key in the path must be 1 to {max} bytes (percent-encode \"/\" and other reserved characters), got {} bytes",
                    key.len()
                ),
            ));
        }
        Ok(KeyPath(queue, key.to_owned()))
    }
}

/// `{queue}` and `{id}` from the path, validated.
pub struct TaskPath(pub QueueName, pub TaskId);

impl<S: Send + Sync> FromRequestParts<S> for TaskPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let params = params(parts).await?;
        let queue = queue_name(param(&params, "queue")?)?;
        let text = param(&params, "id")?;
        let id = match super::wire::parse_hex_id(text) {
            Some(id) => id,
            None => task_id(text)?,
        };
        Ok(TaskPath(queue, id))
    }
}

/// The form of a listing of tasks' query, for its errors.
pub const PAGE_QUERY_FORM: &str =
    "after=<task id>&limit=<n>&payload=<true|false>&full_target=<true|false>";

/// The query of a paged list, or a 400 that shows its expected `form`
/// (`after=<task id>&limit=<n>`).
pub fn page_query<T>(
    query: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
    form: &str,
) -> Result<T, ApiError> {
    query.map(|q| q.0).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "bad query string ({form}): {}",
                query_problem(&e.body_text())
            ),
        )
    })
}

/// What is wrong with a query string, from axum's rejection text: without its "Failed to
/// deserialize query string: " preamble, and in words for a number that is not one.
fn query_problem(text: &str) -> String {
    let problem = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    match problem.strip_suffix("invalid digit found in string") {
        Some(field) => format!("{field}expected a whole number"),
        None => problem.to_owned(),
    }
}

/// A page size: `limit`, or `default` when absent; 1 to `max`.
pub fn page_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("limit must be between 1 and {max}, got {limit}"),
        ));
    }
    Ok(limit)
}

/// Whether `text`, a time jiff parsed, has an offset of a day or more. A time in UTC (`Z`,
/// what most clients send) has none, and is not parsed again.
fn rfc3339_offset_out_of_range(text: &str) -> bool {
    if text.ends_with(['Z', 'z']) {
        return false;
    }
    jiff::fmt::temporal::Pieces::parse(text)
        .ok()
        .and_then(|p| p.to_numeric_offset())
        .is_some_and(|offset| offset.seconds().abs() >= 24 * 3600)
}

/// Whether a task's idempotency key may be submitted: 1 to 256 bytes, not `.` or `..` (a URL
/// path cannot name them, so the task could not be read or cancelled by its key), and not
/// under the prefixes of belfry's own keys (a schedule's firings, a reminder's chunks), whose
/// place such a task would take.
pub fn check_idempotency_key(key: &str) -> Result<(), String> {
    let max = belfry_core::limits::IDEMPOTENCY_KEY_LEN_MAX;
    if key.is_empty() || key.len() > max {
        return Err(format!("idempotency_key must be 1 to {max} bytes"));
    }
    if ["schedule:", "reminder:"]
        .iter()
        .any(|p| key.starts_with(p))
    {
        return Err(
            "idempotency keys starting with schedule: or reminder: are belfry's own (a \
                    schedule's firings, a reminder's chunks): a task with one would take a \
                    firing's or a chunk's place; choose another prefix"
                .into(),
        );
    }
    if belfry_core::limits::is_dot_segment(key) {
        return Err(format!(
            "idempotency_key may not be {key:?}: a URL path cannot name it, so the task could \
             not be read or cancelled by its key"
        ));
    }
    Ok(())
}

/// The latest instant belfry takes (the time library's last, `jiff::Timestamp::MAX`, to the
/// second), as messages name it: a little before the end of the year 9999.
pub const LATEST_TIME: &str = "9999-12-30T22:00:00Z";

/// An RFC 3339 instant (`2030-01-01T12:00:00Z`, any offset) in unix ms, negative before 1970.
/// `Ok(None)`: a valid RFC 3339 time past the last instant belfry represents (late in the
/// year 9999), which callers refuse as beyond their horizon rather than as bad text.
/// `Err`: why the text is not an RFC 3339 time, for the caller to prefix with its field.
pub fn rfc3339_ms(text: &str) -> Result<Option<i64>, String> {
    match text.parse::<jiff::Timestamp>() {
        // jiff takes Temporal's offsets up to ±25:59; RFC 3339's hours stop at 23.
        Ok(_) if rfc3339_offset_out_of_range(text) => Err(format!(
            "must be an RFC 3339 time such as 2030-01-01T12:00:00Z, got {:?}: its offset is past \
             ±23:59",
            text.chars().take(64).collect::<String>()
        )),
        Ok(at) => Ok(Some(at.as_millisecond())),
        Err(error) => {
            let pieces = jiff::fmt::temporal::Pieces::parse(text);
            match pieces {
                Ok(p) if p.time().is_some() && p.offset().is_some() && p.date().year() >= 9999 => {
                    Ok(None)
                }
                _ => Err(format!(
                    "must be an RFC 3339 time such as 2030-01-01T12:00:00Z, got {:?}: {error}",
                    text.chars().take(64).collect::<String>()
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_latest_time_is_the_time_librarys() {
        let max = jiff::Timestamp::MAX.as_second();
        let named = jiff::Timestamp::from_second(max).unwrap().to_string();
        assert_eq!(named, super::LATEST_TIME);
    }
}
