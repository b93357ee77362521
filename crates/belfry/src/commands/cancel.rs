//! `belfry task cancel`: one task through the single route, or many — ids, `--key`s, or a
//! file of ids — through the bulk route, 1,000 a request, with a progress bar.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use belfry_client::{CancelManyAnswer, CancelSelection, Request};
use clap::Args;

use super::{print_api_error, print_body, run_empty, say, Remote};

/// Tasks per bulk request: the API's most.
const CANCEL_BATCH_MAX: usize = 1_000;

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The tasks' queue.
    pub queue: String,
    /// Task ids (several go 1,000 a request).
    #[arg(required_unless_present_any = ["keys", "ids_file"])]
    pub ids: Vec<String>,
    /// An idempotency key instead of an id (repeatable).
    #[arg(long = "key", value_name = "KEY", conflicts_with_all = ["ids", "ids_file"])]
    pub keys: Vec<String>,
    /// Read the ids from FILE, one a line (- for stdin): e.g. `belfry task list QUEUE --json |
    /// jq -r '.tasks[].id'`.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    pub ids_file: Option<PathBuf>,
}

/// Cancels what `args` names. One id or key: the single route, failing if the task is not
/// scheduled. More: the bulk route, every outcome counted, failing if any was not cancelled.
pub async fn cancel(remote: &Remote, args: CancelArgs) -> anyhow::Result<()> {
    let queue = &args.queue;
    let (named, by_key) = match (&args.ids_file, args.keys.is_empty()) {
        (Some(file), _) => (read_ids(file)?, false),
        (None, false) => (args.keys.clone(), true),
        (None, true) => (args.ids.clone(), false),
    };
    if args.ids_file.is_none() {
        if let [one] = &named[..] {
            let (request, name) = match by_key {
                true => (
                    Request::cancel_by_key(queue, one),
                    format!("the task with key {one:?}"),
                ),
                false => (Request::cancel(queue, one), one.clone()),
            };
            return run_empty(remote, request, format!("cancelled {name}")).await;
        }
    }
    if named.is_empty() {
        bail!("no task ids to cancel");
    }
    let total = cancel_in_batches(remote, queue, &named, by_key).await?;
    if remote.json {
        print_body(&serde_json::to_vec(&total)?)?;
    } else {
        say(describe(&total))?;
    }
    let missed = total.not_scheduled.len() + total.not_found.len();
    if missed > 0 {
        return Err(anyhow!("{missed} of {} tasks not cancelled", named.len()));
    }
    Ok(())
}

/// Sends `named` 1,000 a request, adding up the answers.
async fn cancel_in_batches(
    remote: &Remote,
    queue: &str,
    named: &[String],
    by_key: bool,
) -> anyhow::Result<CancelManyAnswer> {
    let client = super::client(remote)?;
    let bar = super::streamed::count_bar(Some(named.len() as u64), "tasks")?;
    let mut total = CancelManyAnswer {
        cancelled: 0,
        not_scheduled: Vec::new(),
        not_found: Vec::new(),
    };
    for chunk in named.chunks(CANCEL_BATCH_MAX) {
        let which = match by_key {
            true => CancelSelection::Keys(chunk.to_vec()),
            false => CancelSelection::Ids(chunk.to_vec()),
        };
        let answer = client.send(&Request::cancel_many(queue, &which)).await;
        let answer: CancelManyAnswer = match answer.and_then(|a| a.json()) {
            Ok(answer) => answer,
            Err(error) => {
                let done = bar.position();
                bar.finish_and_clear();
                print_api_error(remote, &error)?;
                return Err(anyhow!(error)).with_context(|| {
                    format!(
                        "stopped at the request of tasks {} to {} of {} ({} cancelled before it)",
                        done + 1,
                        done + chunk.len() as u64,
                        named.len(),
                        total.cancelled
                    )
                });
            }
        };
        total.cancelled += answer.cancelled;
        total.not_scheduled.extend(answer.not_scheduled);
        total.not_found.extend(answer.not_found);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(total)
}

/// The ids in `file` (or stdin for `-`), one a line; blank lines are skipped.
fn read_ids(file: &Path) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let opened =
            std::fs::File::open(file).with_context(|| format!("--ids-file {}", file.display()))?;
        Box::new(std::io::BufReader::new(opened))
    };
    let mut ids = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("--ids-file {}: read", file.display()))?;
        // A byte-order mark some editors put first is no part of the id.
        let id = line.trim().trim_start_matches('\u{feff}');
        if id.is_empty() {
            continue;
        }
        // Checked before anything is sent, so a bad line cancels nothing.
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!(
                "--ids-file {} line {}: {id:?} is not a task id (32 hex digits)",
                file.display(),
                n + 1
            );
        }
        ids.push(id.to_owned());
    }
    Ok(ids)
}

fn describe(total: &CancelManyAnswer) -> String {
    let mut text = format!("cancelled {}", total.cancelled);
    for entry in &total.not_scheduled {
        let key = entry
            .key
            .as_ref()
            .map(|k| format!(" (key {k:?})"))
            .unwrap_or_default();
        text.push_str(&format!(
            "\n{}{key} not cancelled: it is {}",
            entry.id, entry.state
        ));
    }
    for missing in &total.not_found {
        text.push_str(&format!("\n{missing}: not found in the queue"));
    }
    text
}
