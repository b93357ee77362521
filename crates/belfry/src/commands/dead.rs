//! `belfry dead ...`: inspect, redrive and delete dead letters.

use belfry_client::{DeadBulkAnswer, DeadPage, DeadSelection, NotDead, Request, Task};
use clap::Subcommand;

use super::{run, run_empty, say};
use crate::commands::Remote;
use crate::show::{clip, now_ms, table, time};

/// How much of a dead reason a table row shows.
const REASON_COLUMN_CHARS_MAX: usize = 80;

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List a queue's dead letters, oldest id first, a page at a time.
    List {
        /// The queue.
        queue: String,
        /// Start after this task id (the last one of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// Most tasks in the page (1 to 1000) [server: 100].
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show one dead letter: why it died, its attempts and payload.
    Get {
        /// The queue.
        queue: String,
        /// The dead letter's task id.
        id: String,
    },
    /// Schedule dead letters again, due now, with their attempts reset: those named, or
    /// every one with --all.
    #[command(
        override_usage = "belfry dead redrive [OPTIONS] <QUEUE> <IDS>...\n       belfry dead redrive [OPTIONS] <QUEUE> --all"
    )]
    Redrive {
        /// The queue.
        queue: String,
        #[command(flatten)]
        which: Which,
    },
    /// Delete dead letters (each is finished as cancelled): those named, or every one with
    /// --all.
    #[command(
        override_usage = "belfry dead delete [OPTIONS] <QUEUE> <IDS>...\n       belfry dead delete [OPTIONS] <QUEUE> --all"
    )]
    Delete {
        /// The queue.
        queue: String,
        #[command(flatten)]
        which: Which,
    },
}

/// The dead letters a redrive or delete names: ids, or `--all` (one of the two).
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// The dead letters' task ids.
    ids: Vec<String>,
    /// Every dead letter the queue has when the command starts, 1,000 per request, with a
    /// progress bar.
    #[arg(long)]
    all: bool,
}

fn describe_page(queue: &str, limit: Option<usize>, page: DeadPage) -> String {
    if page.tasks.is_empty() {
        return format!("no dead letters in {queue}");
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = page
        .tasks
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.attempts.to_string(),
                time(t.due_at_ms, now),
                clip(
                    t.dead_reason.as_deref().unwrap_or("-"),
                    REASON_COLUMN_CHARS_MAX,
                ),
            ]
        })
        .collect();
    let mut text = table(&["TASK", "ATTEMPTS", "LAST DUE", "REASON"], &rows);
    if let Some(next) = page.next_after {
        let limit = limit.map(|n| format!(" --limit {n}")).unwrap_or_default();
        text.push_str(&format!(
            "\nmore: belfry dead list {queue} --after {next}{limit}"
        ));
    }
    text
}

pub async fn dead(remote: &Remote, command: DeadCommand) -> anyhow::Result<()> {
    match command {
        DeadCommand::List {
            queue,
            after,
            limit,
        } => {
            let request = Request::list_dead(&queue, after.as_deref(), limit);
            run(remote, request, |page| describe_page(&queue, limit, page)).await
        }
        // The API has no dead-letter route for one task: a dead letter is a task in state
        // `dead`, shown by the task route.
        DeadCommand::Get { queue, id } => {
            run(remote, Request::get_task(&queue, &id), |t: Task| {
                let mut text = super::task::describe(&t);
                if t.state != "dead" {
                    text.push_str(&format!(
                        "\nnote: not a dead letter: the task is {} (see `belfry task get`)",
                        t.state
                    ));
                }
                text
            })
            .await
        }
        DeadCommand::Redrive { queue, which } => match which.ids.as_slice() {
            [id] => {
                let request = Request::redrive(&queue, id);
                run(remote, request, |t: Task| {
                    format!("redriven:\n{}", super::task::describe(&t))
                })
                .await
            }
            _ => settle(remote, &queue, which, Action::Redrive).await,
        },
        DeadCommand::Delete { queue, which } => match which.ids.as_slice() {
            [id] => {
                let done = format!("deleted dead letter {id} of {queue}");
                run_empty(remote, Request::delete_dead(&queue, id), done).await
            }
            _ => settle(remote, &queue, which, Action::Delete).await,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Redrive,
    Delete,
}

impl Action {
    fn request(self, queue: &str, which: &DeadSelection) -> Request {
        match self {
            Action::Redrive => Request::redrive_dead_many(queue, which),
            Action::Delete => Request::delete_dead_many(queue, which),
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Redrive => "redriven",
            Action::Delete => "deleted",
        }
    }
}

/// Redrives or deletes many dead letters: the ids named, 1,000 per request, or with `--all`
/// every dead letter the queue had, walking its pages in id order and acting on each page's
/// ids. Walking forward matters for a redrive: a task redriven to a receiver that still
/// refuses it is a dead letter again at once, under the same id, and starting over from the
/// first page would take it again and again. Prints the sum of the answers (with `--json`,
/// as one answer of the same shape).
async fn settle(remote: &Remote, queue: &str, which: Which, action: Action) -> anyhow::Result<()> {
    let client = super::client(remote)?;
    let mut total = DeadBulkAnswer {
        redriven: (action == Action::Redrive).then_some(0),
        deleted: (action == Action::Delete).then_some(0),
        not_dead: Vec::new(),
        not_found: Vec::new(),
        dead_left: 0,
    };
    let known = match which.all {
        true => client.get_queue(queue).await.map(|q| q.dead.unwrap_or(0)),
        false => Ok(which.ids.len() as u64),
    };
    let known = known.or_else(|error| stopped(remote, action, &total, error))?;
    let bar = super::streamed::count_bar(Some(known), "dead letters")?;
    let mut named = which.ids.chunks(DEAD_BATCH_MAX);
    let mut after: Option<String> = None;
    loop {
        let ids = if which.all {
            let page =
                Request::list_dead_without_payloads(queue, after.as_deref(), Some(DEAD_BATCH_MAX));
            let page: DeadPage = match client.send(&page).await.and_then(|a| a.json()) {
                Ok(page) => page,
                Err(error) => {
                    bar.finish_and_clear();
                    return stopped(remote, action, &total, error);
                }
            };
            after = page.next_after;
            page.tasks.into_iter().map(|t| t.id).collect()
        } else {
            named.next().map(<[String]>::to_vec).unwrap_or_default()
        };
        if ids.is_empty() {
            break;
        }
        let request = action.request(queue, &DeadSelection::Ids(ids));
        match client.send(&request).await.and_then(|a| a.json()) {
            Ok(answer) => add(&mut total, answer),
            Err(error) => {
                bar.finish_and_clear();
                return stopped(remote, action, &total, error);
            }
        }
        bar.set_position(total.done() + (total.not_dead.len() + total.not_found.len()) as u64);
        if which.all && after.is_none() {
            break;
        }
    }
    bar.finish_and_clear();
    if remote.json {
        return super::print_body(&serde_json::to_vec(&total)?);
    }
    say(describe_settled(queue, action, &total))
}

/// A bulk command's request failed: says so as every command does, and how much was done
/// before it.
fn stopped<T>(
    remote: &Remote,
    action: Action,
    total: &DeadBulkAnswer,
    error: belfry_client::Error,
) -> anyhow::Result<T> {
    super::print_api_error(remote, &error)?;
    if total.done() > 0 {
        eprintln!("{} {} before the error", total.done(), action.done());
    }
    Err(error.into())
}

/// Most dead letters one bulk request names.
const DEAD_BATCH_MAX: usize = 1_000;

/// Adds one answer to the running sum (`dead_left` is the latest).
fn add(total: &mut DeadBulkAnswer, answer: DeadBulkAnswer) {
    let sum = |a: Option<u64>, b: Option<u64>| a.map(|a| a + b.unwrap_or(0));
    total.redriven = sum(total.redriven, answer.redriven);
    total.deleted = sum(total.deleted, answer.deleted);
    total.not_dead.extend(answer.not_dead);
    total.not_found.extend(answer.not_found);
    total.dead_left = answer.dead_left;
}

fn describe_settled(queue: &str, action: Action, total: &DeadBulkAnswer) -> String {
    let mut text = format!(
        "{} {} dead letters of {queue}; {} left",
        action.done(),
        total.done(),
        total.dead_left
    );
    for NotDead { id, state } in total.not_dead.iter().take(LISTED_MAX) {
        text.push_str(&format!("\nnot a dead letter: {id} is {state}"));
    }
    for id in total.not_found.iter().take(LISTED_MAX) {
        text.push_str(&format!("\nnot found in {queue}: {id}"));
    }
    let unlisted = total.not_dead.len().saturating_sub(LISTED_MAX)
        + total.not_found.len().saturating_sub(LISTED_MAX);
    if unlisted > 0 {
        text.push_str(&format!(
            "\n... and {unlisted} more not settled (--json lists them all)"
        ));
    }
    text
}

/// Tasks not settled that the human summary lists by id, per kind.
const LISTED_MAX: usize = 20;
