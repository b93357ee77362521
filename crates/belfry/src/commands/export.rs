//! `belfry task export QUEUE [FILE]`: a queue's live tasks as NDJSON in the import's line
//! shape, so that `belfry task import` (on this server or another, on any store) submits
//! them again: the move from the embedded store to Redis, a copy to a test server, a backup
//! of what is scheduled.
//!
//! Each line is one task as the submit takes it: its due time (`run_at_ms`), its payload
//! byte for byte (the listing's JSON text is copied, never parsed into a value and printed
//! again, so numbers and key order stay as the producer sent them), idempotency key,
//! headers, priority, late policy and its own target whole. Ids, attempts and leases are not
//! carried: an import makes new tasks, due when these were.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use belfry_client::{Queue, Request};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{send, Remote};

/// Tasks asked for per page: the API's largest.
const EXPORT_PAGE: usize = 1_000;

/// A page of the listing, borrowed from its body.
#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    tasks: Vec<Listed<'a>>,
    next_after: Option<String>,
}

/// What an export keeps of a listed task; other fields of the listing are ignored.
#[derive(Deserialize)]
struct Listed<'a> {
    id: &'a str,
    state: &'a str,
    due_at_ms: u64,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(default)]
    payload_base64: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    priority: &'a str,
    late_policy: &'a str,
    #[serde(default)]
    late_after_ms: Option<u64>,
    #[serde(default)]
    target: Option<String>,
}

/// One line of the export: the submit that makes the task again.
#[derive(Serialize)]
struct Line<'a> {
    run_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: &'a BTreeMap<String, String>,
    priority: &'a str,
    late_policy: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    late_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
}

impl<'a> Line<'a> {
    fn of(task: &'a Listed<'a>) -> anyhow::Result<Self> {
        if task.payload.is_none() && task.payload_base64.is_none() {
            bail!("task {} was listed without its payload", task.id);
        }
        Ok(Line {
            run_at_ms: task.due_at_ms,
            payload: task.payload,
            payload_base64: task.payload_base64.as_deref(),
            idempotency_key: task.idempotency_key.as_deref(),
            headers: &task.headers,
            priority: task.priority,
            late_policy: task.late_policy,
            late_after_ms: task.late_after_ms,
            target: task.target.as_deref(),
        })
    }
}

/// What an export wrote.
#[derive(Debug, Default)]
struct Exported {
    tasks: u64,
    leased: u64,
}

/// Writes the queue's live tasks to `file` (stdout when absent or `-`), with a progress bar
/// on stderr, and a summary there at the end.
pub(crate) async fn export(
    remote: &Remote,
    queue: &str,
    file: Option<&Path>,
) -> anyhow::Result<()> {
    let info: Queue = send(remote, &Request::get_queue(queue)).await?.json()?;
    let out: Box<dyn Write> = match file {
        Some(path) if path != Path::new("-") => Box::new(
            std::fs::File::create(path).with_context(|| format!("FILE {}", path.display()))?,
        ),
        _ => Box::new(std::io::stdout().lock()),
    };
    let mut out = std::io::BufWriter::new(out);
    let bar = progress(info.pending.unwrap_or(0) + info.in_flight.unwrap_or(0))?;
    let exported = write_pages(remote, queue, &mut out, &bar).await?;
    out.flush().context("write the export")?;
    bar.finish_and_clear();
    let mut summary = format!("exported {} tasks from {queue}", exported.tasks);
    if exported.leased > 0 {
        summary.push_str(&format!(
            " ({} of them leased when listed: an import schedules them at their due time, \
             so they may be delivered again)",
            exported.leased
        ));
    }
    eprintln!("{summary}");
    Ok(())
}

/// Reads the listing page by page and writes each task's line.
async fn write_pages(
    remote: &Remote,
    queue: &str,
    out: &mut impl Write,
    bar: &ProgressBar,
) -> anyhow::Result<Exported> {
    let mut exported = Exported::default();
    let mut after: Option<String> = None;
    loop {
        let request = Request::list_tasks_for_export(queue, after.as_deref(), Some(EXPORT_PAGE));
        let answer = send(remote, &request).await?;
        let page: Page<'_> =
            serde_json::from_slice(&answer.body).context("read a page of the listing")?;
        for task in &page.tasks {
            serde_json::to_writer(&mut *out, &Line::of(task)?).context("write the export")?;
            out.write_all(b"\n").context("write the export")?;
            exported.tasks += 1;
            exported.leased += u64::from(task.state == "leased");
        }
        bar.inc(page.tasks.len() as u64);
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(exported),
        }
    }
}

/// A bar of tasks written, out of `total` (the queue's count when the export began; tasks
/// added since make it run past).
fn progress(total: u64) -> anyhow::Result<ProgressBar> {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} tasks ({per_sec}, {eta} left)")
        .map_err(|e| anyhow!("progress bar template: {e}"))?;
    bar.set_style(style);
    Ok(bar)
}
