//! The streamed task import (`POST /v1/queues/{queue}/tasks:import`): NDJSON, one task a
//! line in the single submit's shape, cut into lines as the body streams in (`api::lines`),
//! each line turned into a task by the queue's [`Intake`] as a batch submit's are, and
//! submitted `BATCH_TASKS_MAX` at a time, each batch durable before more of the body is read.
//!
//! It follows the bulk subscribe (`api/reminders/bulk_apply.rs`) in design and in its
//! answer's promise: when it says `complete: false`, everything before `stopped_at_line` was
//! applied and nothing from it on was, so a client resends the body from that line. A cut or
//! oversized body stops at the line it cuts; a batch the store refused stops at that batch's
//! first line, and the lines read after it are not applied (nor their refusals counted: the
//! resent body reports them).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use belfry_core::limits::{
    BATCH_TASKS_MAX, HEADERS_MAX, HEADER_NAME_LEN_MAX, HEADER_VALUE_LEN_MAX,
    IDEMPOTENCY_KEY_LEN_MAX, TARGET_LEN_MAX,
};
use belfry_core::NewTask;
use belfry_store::PutOutcome;
use serde::Serialize;

use super::{AppState, Intake};
use crate::api::bulk_read::{declared_over, read_and_apply, BulkApply};
use crate::api::dto::TaskBody;
use crate::api::error::{ApiError, ErrorBody, ErrorCode};
use crate::api::extract::{parse_json, QueuePath};
use crate::api::lines::{Line, LineSplitter};

/// Refused lines an import answer lists (all are counted).
const IMPORT_ERRORS_LISTED: usize = 100;

/// Most bytes a line holds besides its payload: every header, the idempotency key and the
/// target at their longest with each byte written as a six-byte `\uXXXX` escape (the longest
/// JSON can spell a byte), and 64 KiB for the due time, the policies, field names and spaces.
const TASK_FIELDS_BYTES_MAX: usize = (HEADERS_MAX * (HEADER_NAME_LEN_MAX + HEADER_VALUE_LEN_MAX)
    + IDEMPOTENCY_KEY_LEN_MAX
    + TARGET_LEN_MAX)
    * 6
    + 64 * 1024;

/// Most bytes one line may hold: a task whose payload is at the limit written in its longer
/// form (`payload_base64`, 4 bytes for 3: a JSON `payload`'s limit counts its text), with
/// every other field at its longest, and never more than a single submit's whole body
/// (`limits.request_max`). No valid task needs a longer line (about 3 MiB with the default
/// 1 MiB payload limit), and one line is the most an import holds in memory at once.
pub fn line_bytes_max(payload_bytes_max: usize, request_bytes_max: usize) -> usize {
    let payload = payload_bytes_max.div_ceil(3).saturating_mul(4);
    payload
        .saturating_add(TASK_FIELDS_BYTES_MAX)
        .min(request_bytes_max)
}

#[derive(Debug, Serialize)]
struct LineError {
    line: u64,
    error: ErrorBody,
}

/// The answer of an import.
#[derive(Debug, Default, Serialize)]
struct ImportAnswer {
    /// Tasks stored.
    created: u64,
    /// Lines whose idempotency key named a live task (that task stands; nothing was stored).
    duplicates: u64,
    /// Lines that are not valid tasks (each in `errors`, the first hundred).
    refused: u64,
    errors: Vec<LineError>,
    /// Whether the whole body was read and applied. If not, everything before
    /// `stopped_at_line` was applied, and nothing from it on.
    complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped_at_line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody>,
}

/// One line, converted.
enum Item {
    Task(NewTask, u64),
    Bad(ApiError, u64),
}

pub async fn import(
    State(service): State<AppState>,
    QueuePath(queue): QueuePath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let max = service.config.import_body_bytes_max;
    if declared_over(&headers, max) {
        return too_large(max).into_response();
    }
    // The queue must exist before anything is read.
    let intake = match Intake::of(&service, &queue).await {
        Ok(intake) => intake,
        Err(e) => return e.into_response(),
    };
    let config = &service.config;
    let mut import = Import {
        service: &service,
        intake,
        lines: LineSplitter::new(line_bytes_max(
            config.payload_bytes_max,
            config.request_bytes_max,
        )),
        items: Vec::new(),
        answer: ImportAnswer::default(),
        pending: Pending::default(),
    };
    let stop = read_and_apply(&mut import, body, max, too_large).await;
    let mut answer = import.answer;
    answer.complete = stop.is_none();
    let (status, retry_after) = match &stop {
        None => (StatusCode::OK, None),
        Some((e, line)) => {
            answer.stopped_at_line = Some(*line);
            (e.code.status(), e.retry_after_s)
        }
    };
    if let Some((error, line)) = &stop {
        // The client may never see the answer (it went away): the log says what was kept.
        tracing::info!(%queue, created = answer.created, duplicates = answer.duplicates, refused = answer.refused, stopped_at_line = line, code = error.code.as_str(), "a task import stopped before the end of its body; the lines before stopped_at_line were applied");
    }
    answer.error = stop.map(|(e, _)| e.body());
    let mut response = (status, Json(answer)).into_response();
    // A refused batch (an overloaded server, a full disk) says when to resume, as the error
    // alone would.
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The lines read since the last batch was applied.
#[derive(Default)]
struct Pending {
    tasks: Vec<NewTask>,
    /// Payload bytes among them: a batch is also submitted once it holds a single submit's
    /// largest body (`limits.request_max`), so an import of large payloads holds no more than
    /// a batch submit may.
    payload_bytes: usize,
    /// The number of the first of them (a task or a refused line), once one came.
    first_line: Option<u64>,
    /// The refused lines among them, and how many of the answer's listed errors they are.
    refused: u64,
    listed: usize,
}

/// One import being applied.
struct Import<'a> {
    service: &'a AppState,
    intake: Intake,
    lines: LineSplitter,
    /// Lines converted and not yet counted into `pending`.
    items: Vec<Item>,
    answer: ImportAnswer,
    pending: Pending,
}

impl BulkApply for Import<'_> {
    fn feed(&mut self, bytes: &[u8]) {
        self.split(Some(bytes));
    }

    fn finish(&mut self) -> Result<(), ApiError> {
        self.split(None);
        Ok(())
    }

    fn line(&self) -> u64 {
        self.lines.line()
    }

    async fn take(&mut self) -> Result<(), (ApiError, u64)> {
        self.take_items().await
    }

    async fn flush(&mut self) -> Result<(), (ApiError, u64)> {
        if self.pending.first_line.is_none() {
            return Ok(());
        }
        self.apply().await
    }
}

impl Import<'_> {
    /// Converts the lines `bytes` ends (or, at the body's end, `None`, the last one) into
    /// items. Due times given as a delay count from when their line arrived.
    fn split(&mut self, bytes: Option<&[u8]>) {
        let now_ms = self.service.now_ms();
        let Import {
            lines,
            items,
            intake,
            service,
            ..
        } = self;
        let each = |line: Line<'_>| items.extend(convert(intake, service, line, now_ms));
        match bytes {
            Some(bytes) => lines.feed(bytes, each),
            None => lines.finish(each),
        }
    }

    /// Counts `items` into the pending batch, submitting it whenever it holds
    /// `BATCH_TASKS_MAX` tasks or `limits.request_max` bytes of payload. A batch refused stops it all, at the batch's first line,
    /// unapplied from there.
    async fn take_items(&mut self) -> Result<(), (ApiError, u64)> {
        let items = std::mem::take(&mut self.items);
        for item in items {
            match item {
                Item::Task(task, line) => {
                    self.pending.first_line.get_or_insert(line);
                    self.pending.payload_bytes += task.payload.len();
                    self.pending.tasks.push(task);
                }
                Item::Bad(error, line) => {
                    self.pending.first_line.get_or_insert(line);
                    self.pending.refused += 1;
                    self.answer.refused += 1;
                    if self.answer.errors.len() < IMPORT_ERRORS_LISTED {
                        self.answer.errors.push(LineError {
                            line,
                            error: error.body(),
                        });
                        self.pending.listed += 1;
                    }
                }
            }
            if self.pending.tasks.len() >= BATCH_TASKS_MAX
                || self.pending.payload_bytes >= self.service.config.request_bytes_max
            {
                self.apply().await?;
            }
        }
        Ok(())
    }

    /// Submits the pending tasks; when the store refuses them, takes back what the answer
    /// counted of the pending lines.
    async fn apply(&mut self) -> Result<(), (ApiError, u64)> {
        let pending = std::mem::take(&mut self.pending);
        let queue = self.intake.queue();
        match self.service.submit(queue, pending.tasks).await {
            Ok(outcomes) => {
                for outcome in outcomes {
                    match outcome {
                        PutOutcome::Created { .. } => self.answer.created += 1,
                        PutOutcome::Duplicate(_) => self.answer.duplicates += 1,
                    }
                }
                Ok(())
            }
            Err(e) => {
                self.answer.refused -= pending.refused;
                let listed = self.answer.errors.len() - pending.listed;
                self.answer.errors.truncate(listed);
                Err((ApiError::from(e), pending.first_line.unwrap_or(1)))
            }
        }
    }
}

/// A line as a task, through the same conversion as every submit; a blank line is none.
fn convert(
    intake: &Intake,
    service: &AppState,
    line: Line<'_>,
    now_ms: belfry_core::UnixMs,
) -> Option<Item> {
    let (number, bytes) = match line {
        Line::Text { number, bytes } => (number, bytes),
        Line::Overlong { number } => {
            let max = line_bytes_max(
                service.config.payload_bytes_max,
                service.config.request_bytes_max,
            );
            let why = format!(
                "the line is longer than {max} bytes, more than any task needs (a payload \
                 at limits.payload_max as base64, every other field at its longest); it \
                 was skipped unread"
            );
            return Some(Item::Bad(
                ApiError::new(ErrorCode::PayloadTooLarge, why),
                number,
            ));
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let task = parse_json::<TaskBody>(bytes).and_then(|body| intake.task(body, now_ms));
    Some(match task {
        Ok(task) => Item::Task(task, number),
        Err(e) => Item::Bad(line_error(e), number),
    })
}

/// A line's own error: a JSON error names the line's column (every line is "line 1" to the
/// JSON parser).
fn line_error(error: ApiError) -> ApiError {
    if error.code != ErrorCode::MalformedJson {
        return error;
    }
    let message = error
        .message
        .replacen(
            "the body is not valid JSON",
            "the line is not valid JSON",
            1,
        )
        .replacen(" at line 1 column ", " at column ", 1);
    ApiError::new(ErrorCode::MalformedJson, message)
}

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the body is larger than limits.import_body_max ({max} bytes); split it into \
             several imports"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_fits_a_task_at_the_limits_and_never_more_than_a_request() {
        let mib = 1024 * 1024;
        let max = line_bytes_max(mib, 16 * mib);
        assert!(max > mib / 3 * 4 + TASK_FIELDS_BYTES_MAX - 4, "{max}");
        assert!(max < 4 * mib, "{max}");
        assert_eq!(line_bytes_max(mib, 2 * mib), 2 * mib);
        assert_eq!(line_bytes_max(usize::MAX, usize::MAX), usize::MAX);
    }
}
