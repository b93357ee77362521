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

use anyhow::{bail, Context};
use belfry_client::{Queue, Request};
use indicatif::ProgressBar;
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
    /// `null` is a payload like any other (a task submitted without one has it): read as
    /// the raw text, so that only an absent field is `None`.
    #[serde(borrow, default, deserialize_with = "present")]
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

/// A field that is present, whatever its JSON (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
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
    /// Schedule firings and reminder chunks left out: their schedules and reminders make
    /// them (moved on their own), and an import refuses belfry's own keys and headers.
    owned: u64,
}

/// Whether the task is one belfry made for a schedule or a reminder (its key is one of the
/// prefixes the submit refuses).
fn made_by_belfry(task: &Listed<'_>) -> bool {
    task.idempotency_key
        .as_deref()
        .is_some_and(|key| key.starts_with("schedule:") || key.starts_with("reminder:"))
}

/// Writes the queue's live tasks to `file` (stdout when absent or `-`), with a progress bar
/// on stderr, and a summary there at the end.
pub(crate) async fn export(
    remote: &Remote,
    queue: &str,
    file: Option<&Path>,
) -> anyhow::Result<()> {
    // The count only sizes the progress bar: a token that may list the queue's tasks
    // (`produce:<queue>`) but not read its settings exports without it.
    let total = match super::client(remote)?
        .send(&Request::get_queue(queue))
        .await
    {
        Ok(answer) => answer.json::<Queue>().ok(),
        Err(belfry_client::Error::Api { status: 403, .. }) => None,
        Err(error) => {
            super::print_api_error(remote, &error)?;
            return Err(error.into());
        }
    };
    // Out of the queue's count when the export began (tasks added since make it run past).
    let total = total.map(|q| q.pending.unwrap_or(0) + q.in_flight.unwrap_or(0));
    let bar = super::streamed::count_bar(total, "tasks")?;
    let exported = match file {
        Some(path) if path != Path::new("-") => to_file(remote, queue, path, &bar).await?,
        _ => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let exported = write_pages(remote, queue, &mut out, &bar).await;
            bar.finish_and_clear();
            let exported = exported?;
            out.flush().context("write the export")?;
            exported
        }
    };
    eprintln!("{}", summary(queue, &exported));
    Ok(())
}

/// Writes the export to `PATH.partial` beside `path`, renamed to `path` once complete: a
/// failed export leaves an earlier file of that name as it was, and no partial one.
async fn to_file(
    remote: &Remote,
    queue: &str,
    path: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Exported> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let file =
        std::fs::File::create(&partial).with_context(|| format!("FILE {}", partial.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let written = write_pages(remote, queue, &mut out, bar).await;
    bar.finish_and_clear();
    let finished = written.and_then(|exported| {
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&partial, path)?;
        Ok(exported)
    });
    finished.map_err(|error| {
        let _ = std::fs::remove_file(&partial);
        error.context(format!(
            "the export stopped; {} was not written (an earlier file of that name is as it was)",
            path.display()
        ))
    })
}

fn summary(queue: &str, exported: &Exported) -> String {
    let mut summary = format!("exported {} tasks from {queue}", exported.tasks);
    if exported.leased > 0 {
        summary.push_str(&format!(
            " ({} of them leased when listed: an import schedules them at their due time, \
             so they may be delivered again)",
            exported.leased
        ));
    }
    if exported.owned > 0 {
        summary.push_str(&format!(
            "; left out {} schedule firings and reminder chunks (their schedules and \
             reminders make them again where they are re-created)",
            exported.owned
        ));
    }
    summary
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
            if made_by_belfry(task) {
                exported.owned += 1;
                continue;
            }
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
