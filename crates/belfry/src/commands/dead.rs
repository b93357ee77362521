//! `belfry dead ...`: inspect and redrive dead letters.

use belfry_client::{DeadPage, Request, Task};
use clap::Subcommand;

use super::run;
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
    /// Schedule a dead letter again, due now, with its attempts reset.
    Redrive {
        /// The queue.
        queue: String,
        /// The dead letter's task id.
        id: String,
    },
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
        DeadCommand::Redrive { queue, id } => {
            let request = Request::redrive(&queue, &id);
            run(remote, request, |t: Task| {
                format!("redriven:\n{}", super::task::describe(&t))
            })
            .await
        }
    }
}
