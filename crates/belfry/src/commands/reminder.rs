//! `belfry reminder ...` and `belfry feed USER`: reminders, their subscribers (named on the
//! command line, or streamed from a file through the bulk endpoint) and a user's feed.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use belfry_client::{
    BulkAnswer, BulkBody, Feed, FeedQuery, Priority, Reminder, ReminderList, ReminderPatch,
    ReminderSpec, Request, SubscriberCount, SubscriberPage, UserSubscriptions,
};
use clap::{Args, Subcommand};

use super::streamed::{file_body, report};
use super::{client, parse_ms, print_api_error, print_body, run, run_empty, say};
use crate::commands::Remote;
use crate::show::{clip, duration, fields, more_refused, now_ms, table, time};

/// How much of a reminder's content a table row shows.
const CONTENT_COLUMN_CHARS_MAX: usize = 60;

#[derive(Debug, Subcommand)]
pub enum ReminderCommand {
    /// Create a reminder: --queue Q and one of --at TIME, --in DURATION, --cron EXPR.
    Create(ReminderCreate),
    /// Show a reminder: its time, next firing, priority, pace and subscriber count.
    Get {
        /// The reminder's id.
        id: String,
    },
    /// List reminders in id order (every page).
    List {
        /// Only the reminders of this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Change a reminder's time, content or priority (what is not given stays).
    Update(ReminderUpdate),
    /// Delete a reminder and its subscribers (chunks already made stay in their queue).
    Delete {
        /// The reminder's id.
        id: String,
    },
    /// Subscribe users: USER... on the command line, or --file F (streamed; `-` is stdin).
    Subscribe(Subscribers),
    /// Unsubscribe users: USER... on the command line, or --file F (streamed; `-` is stdin).
    Unsubscribe(Subscribers),
    /// How many users are subscribed (exact).
    Count {
        /// The reminder's id.
        id: String,
    },
    /// List subscribers in id order, a page at a time; with USER, whether that one is (exit
    /// status 1 when not).
    Subscribers {
        /// The reminder's id.
        id: String,
        /// Only say whether this user is subscribed.
        #[arg(conflicts_with_all = ["after", "limit"])]
        user: Option<String>,
        /// Start after this user (the last one of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// Most users in the page (1 to 10000) [server: 1000].
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Debug, Args)]
pub struct ReminderUpdate {
    /// The reminder's id.
    pub id: String,
    /// Fire once, at this RFC 3339 time instead.
    #[arg(long, conflicts_with_all = ["in", "cron"])]
    pub at: Option<String>,
    /// Fire once, this long from now instead: "30m", "2h", "1d".
    #[arg(
        long = "in",
        id = "in",
        value_name = "DURATION",
        conflicts_with = "cron"
    )]
    pub after: Option<String>,
    /// Fire at every fire time of this cron expression instead.
    #[arg(long)]
    pub cron: Option<String>,
    /// IANA time zone of --cron [default: the reminder's zone is kept].
    #[arg(long, requires = "cron")]
    pub timezone: Option<String>,
    /// The new content, a JSON document up to 64 KiB.
    #[arg(long)]
    pub content: Option<String>,
    /// Lead every feed from now on.
    #[arg(long, conflicts_with = "normal")]
    pub urgent: bool,
    /// No longer urgent.
    #[arg(long)]
    pub normal: bool,
}

/// When a new reminder fires: exactly one of the three forms.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ReminderWhen {
    /// Once, at this RFC 3339 time ("2030-06-01T20:00:00Z"); a past time fires at once.
    #[arg(long)]
    pub at: Option<String>,
    /// Once, this long from now: "30m", "2h", "1d" (`--delay`, as `task add` names it).
    #[arg(
        long = "in",
        id = "in",
        value_name = "DURATION",
        visible_alias = "delay"
    )]
    pub after: Option<String>,
    /// At every fire time of a cron expression: 5 fields, 6 with seconds first, or @daily...
    #[arg(long)]
    pub cron: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReminderCreate {
    /// The reminder's id (1 to 128 of A-Z a-z 0-9 _ . -) [default: generated].
    pub id: Option<String>,
    /// The queue the chunks go to; it must exist.
    #[arg(long)]
    pub queue: String,
    #[command(flatten)]
    pub when: ReminderWhen,
    /// IANA time zone of --cron [default: UTC].
    #[arg(long, requires = "cron")]
    pub timezone: Option<String>,
    /// The content, a JSON document up to 64 KiB [default: null].
    #[arg(long)]
    pub content: Option<String>,
    /// Lead every feed; chunks are claimed first.
    #[arg(long)]
    pub urgent: bool,
    /// Users per chunk (task), 1 to 50000 [server default: 5000].
    #[arg(long)]
    pub chunk_size: Option<u32>,
    /// Fan-out pace in users per second, 1 to 1000000 [default: as fast as the queue takes].
    #[arg(long)]
    pub users_per_second: Option<u32>,
}

#[derive(Debug, Args)]
pub struct Subscribers {
    /// The reminder.
    pub id: String,
    /// User ids (sent in one bulk call).
    #[arg(conflicts_with = "file")]
    pub users: Vec<String>,
    /// NDJSON, one id a line ("alice", 42 or bare alice), or one JSON array; `-` reads stdin.
    /// Streamed to the server, never held whole.
    #[arg(long, short, value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// `--content` parsed as JSON, if given.
fn content(text: Option<&str>) -> anyhow::Result<Option<serde_json::Value>> {
    text.map(|text| {
        serde_json::from_str(text).context("--content must be JSON (quote strings: '\"hi\"')")
    })
    .transpose()
}

fn spec(args: ReminderCreate) -> anyhow::Result<ReminderSpec> {
    let content = content(args.content.as_deref())?;
    Ok(ReminderSpec {
        id: args.id,
        queue: args.queue,
        run_at: args.when.at,
        delay_ms: parse_ms("in", args.when.after.as_deref())?,
        cron: args.when.cron,
        timezone: args.timezone,
        content,
        priority: args.urgent.then_some(Priority::Urgent),
        chunk_size: args.chunk_size,
        users_per_second: args.users_per_second,
        ..ReminderSpec::default()
    })
}

fn patch(args: &ReminderUpdate) -> anyhow::Result<ReminderPatch> {
    let patch = ReminderPatch {
        run_at: args.at.clone(),
        delay_ms: parse_ms("in", args.after.as_deref())?,
        cron: args.cron.clone(),
        timezone: args.timezone.clone(),
        content: content(args.content.as_deref())?,
        priority: match (args.urgent, args.normal) {
            (true, _) => Some(Priority::Urgent),
            (_, true) => Some(Priority::Normal),
            _ => None,
        },
        ..ReminderPatch::default()
    };
    if patch == ReminderPatch::default() {
        bail!("nothing to change: give --at, --in or --cron, --content, --urgent or --normal");
    }
    Ok(patch)
}

/// The reminder's fields, one aligned line each.
fn describe(r: &Reminder) -> String {
    let now = now_ms();
    let when = match (&r.cron, r.run_at_ms) {
        (Some(cron), _) => format!(
            "cron {cron:?} in {}",
            r.timezone.as_deref().unwrap_or("UTC")
        ),
        (None, Some(at)) => format!("once at {}", crate::show::rfc3339(at)),
        (None, None) => String::new(),
    };
    let next = match r.next_fire_ms {
        Some(ms) => time(ms, now),
        None => "none: fired".to_owned(),
    };
    let pace = match r.users_per_second {
        Some(n) => format!("{n} users/s"),
        None => "as fast as the queue takes".to_owned(),
    };
    fields(&[
        ("reminder", r.id.clone()),
        ("queue", r.queue.clone()),
        ("when", when),
        ("next", next),
        ("priority", r.priority.as_str().to_owned()),
        ("chunk size", r.chunk_size.to_string()),
        ("pace", pace),
        (
            "subscribers",
            r.subscribers.map(|n| n.to_string()).unwrap_or_default(),
        ),
        ("firings", r.firings.to_string()),
        ("content", r.content.to_string()),
    ])
}

fn describe_list(reminders: &[Reminder]) -> String {
    if reminders.is_empty() {
        return "no reminders; create one with: belfry reminder create --queue QUEUE --in 1h"
            .to_owned();
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = reminders
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.queue.clone(),
                r.next_fire_ms
                    .map(|ms| time(ms, now))
                    .unwrap_or_else(|| "fired".to_owned()),
                r.priority.as_str().to_owned(),
                clip(&r.content.to_string(), CONTENT_COLUMN_CHARS_MAX),
            ]
        })
        .collect();
    table(&["ID", "QUEUE", "NEXT", "PRIORITY", "CONTENT"], &rows)
}

/// The counts of a bulk answer and its first bad lines.
fn describe_bulk(answer: &BulkAnswer, subscribe: bool) -> String {
    let (changed, unchanged) = if subscribe {
        ("new subscriptions", "already subscribed or listed twice")
    } else {
        ("removed", "not subscribed or listed twice")
    };
    let mut text = fields(&[
        ("changed", format!("{} ({changed})", answer.changed)),
        ("unchanged", format!("{} ({unchanged})", answer.unchanged)),
        ("refused", format!("{} (not user ids)", answer.refused)),
    ]);
    for error in &answer.errors {
        text.push_str(&format!("\nline {}: {}", error.line, error.message));
    }
    text.push_str(&more_refused(answer.refused, answer.errors.len()));
    if !answer.complete {
        let line = answer
            .stopped_at_line
            .map(|l| format!(" at line {l}"))
            .unwrap_or_default();
        text.push_str(&format!(
            "\nincomplete: the server stopped reading{line}; everything before it was applied"
        ));
    }
    text
}

pub async fn reminder(remote: &Remote, command: ReminderCommand) -> anyhow::Result<()> {
    let show = |r: Reminder| describe(&r);
    match command {
        ReminderCommand::Create(args) => {
            run(remote, Request::create_reminder(&spec(args)?), show).await
        }
        ReminderCommand::Get { id } => run(remote, Request::get_reminder(&id), show).await,
        ReminderCommand::List { queue } => {
            let listed = client(remote)?.list_reminders(queue.as_deref()).await;
            if let Err(error) = &listed {
                print_api_error(remote, error)?;
            }
            let reminders = listed?;
            if remote.json {
                // Every page as one answer, in the server's page shape.
                let all = ReminderList {
                    reminders,
                    next_after: None,
                };
                print_body(&serde_json::to_vec(&all)?)
            } else {
                say(describe_list(&reminders))
            }
        }
        ReminderCommand::Update(args) => {
            let request = Request::patch_reminder(&args.id, &patch(&args)?);
            run(remote, request, show).await
        }
        ReminderCommand::Subscribers {
            id,
            user: Some(user),
            ..
        } => {
            let answer = client(remote)?.is_subscribed(&id, &user).await;
            if let Err(error) = &answer {
                print_api_error(remote, error)?;
            }
            let subscribed = answer?;
            if remote.json {
                print_body(
                    serde_json::json!({ "subscribed": subscribed })
                        .to_string()
                        .as_bytes(),
                )?;
            } else {
                let not = if subscribed { "" } else { "not " };
                say(format!("{user} is {not}subscribed to {id}"))?;
            }
            // Exit 1 for "no", as `grep` does, so that a script can test it.
            match subscribed {
                true => Ok(()),
                false => Err(super::AnswerIsNo.into()),
            }
        }
        ReminderCommand::Subscribers {
            id, after, limit, ..
        } => {
            let request = Request::subscribers(&id, after.as_deref(), limit);
            run(remote, request, |page: SubscriberPage| {
                describe_subscribers(&id, limit, page)
            })
            .await
        }
        ReminderCommand::Delete { id } => {
            let done = format!("deleted reminder {id}");
            run_empty(remote, Request::delete_reminder(&id), done).await
        }
        ReminderCommand::Count { id } => {
            let request = Request::count_subscribers(&id);
            run(remote, request, |c: SubscriberCount| {
                format!("{id}: {} subscribers", c.subscribers)
            })
            .await
        }
        ReminderCommand::Subscribe(args) => bulk(remote, args, true).await,
        ReminderCommand::Unsubscribe(args) => bulk(remote, args, false).await,
    }
}

/// Sends the users of the command line, or streams the file, through the bulk endpoint, and
/// prints the answer. A body the server did not read to its end fails the command after the
/// counts are printed (what came before it was applied).
async fn bulk(remote: &Remote, args: Subscribers, subscribe: bool) -> anyhow::Result<()> {
    if args.users.is_empty() && args.file.is_none() {
        bail!("name the users: USER... on the command line, or --file FILE (NDJSON; - for stdin)");
    }
    // `subscribe ID users.ndjson` (forgetting --file) would otherwise subscribe one user
    // named after the file.
    if let Some(path) = args.users.iter().find(|u| Path::new(u.as_str()).is_file()) {
        bail!(
            "{path:?} names a file, not a user: to send the ids in it, use --file {path} (a user \
             whose id is that very text can be listed in such a file)"
        );
    }
    let client = client(remote)?;
    let (body, bar) = match &args.file {
        Some(path) => {
            let (body, bar) = file_body("--file", path).await?;
            (body, Some(bar))
        }
        None => (BulkBody::users(&args.users), None),
    };
    let result = if subscribe {
        client.bulk_subscribe(&args.id, body).await
    } else {
        client.bulk_unsubscribe(&args.id, body).await
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    report(remote, result, bulk_stopped, |answer| {
        describe_bulk(answer, subscribe)
    })
}

/// The counts of a bulk subscribe or unsubscribe that stopped part way.
fn bulk_stopped(error: &belfry_client::Error) -> Option<&BulkAnswer> {
    match error {
        belfry_client::Error::BulkIncomplete { answer, .. } => Some(answer.as_ref()),
        _ => None,
    }
}

/// `belfry feed USER`: the user's upcoming reminders.
/// `belfry feed USER`: the feed, or with a flag one of the user's calls across reminders.
#[derive(Debug, Args)]
pub struct FeedArgs {
    /// The user id.
    pub user: String,
    /// How far ahead: "1h", "1d" (at most 31d) [default: 1d].
    #[arg(long)]
    pub within: Option<String>,
    /// At most this many reminders, 1 to 1000 [default: 50].
    #[arg(long)]
    pub limit: Option<usize>,
    /// Instead: every reminder the user is subscribed to, fired or not (at most 10,000).
    #[arg(long, conflicts_with_all = ["within", "limit", "unsubscribe_all"])]
    pub subscriptions: bool,
    /// Instead: end every subscription of the user (an account closed); needs --yes.
    #[arg(long, conflicts_with_all = ["within", "limit"])]
    pub unsubscribe_all: bool,
    /// Yes, end them all (there is no undo).
    #[arg(long, requires = "unsubscribe_all")]
    pub yes: bool,
}

pub async fn feed(remote: &Remote, args: FeedArgs) -> anyhow::Result<()> {
    let user = args.user.as_str();
    if args.subscriptions {
        let request = Request::user_subscriptions(user);
        return run(remote, request, |s: UserSubscriptions| {
            describe_subscriptions(&s)
        })
        .await;
    }
    if args.unsubscribe_all {
        if !args.yes {
            bail!("--unsubscribe-all ends every subscription of {user}, with no undo: run it again with --yes");
        }
        let request = Request::unsubscribe_everywhere(user);
        return run(remote, request, |ended: serde_json::Value| {
            let n = ended["unsubscribed"].as_u64().unwrap_or(0);
            format!("{user} unsubscribed from {n} reminders")
        })
        .await;
    }
    let query = FeedQuery {
        within_ms: parse_ms("within", args.within.as_deref())?,
        limit: args.limit,
    };
    // The server's default window, for the message about an empty feed.
    let window = query.within_ms.unwrap_or(86_400_000);
    run(remote, Request::feed(user, &query), |feed: Feed| {
        describe_feed(&feed, window)
    })
    .await
}

fn describe_feed(feed: &Feed, window_ms: u64) -> String {
    let mut lines = Vec::new();
    if feed.degraded {
        lines.push(
            "degraded: the server is overloaded and answered from memory (cached urgent \
             reminders only); ask again shortly"
                .to_owned(),
        );
    }
    if feed.reminders.is_empty() {
        lines.push(format!(
            "no reminders for {} in the next {}",
            feed.user,
            duration(window_ms)
        ));
        return lines.join("\n");
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = feed
        .reminders
        .iter()
        .map(|r| {
            vec![
                time(r.due_at_ms, now),
                r.priority.as_str().to_owned(),
                r.id.clone(),
                r.queue.clone(),
                clip(&r.content.to_string(), CONTENT_COLUMN_CHARS_MAX),
            ]
        })
        .collect();
    lines.push(table(
        &["DUE", "PRIORITY", "REMINDER", "QUEUE", "CONTENT"],
        &rows,
    ));
    lines.join("\n")
}

/// The user's reminders, one row each.
fn describe_subscriptions(s: &UserSubscriptions) -> String {
    if s.reminders.is_empty() {
        return format!("{} is subscribed to no reminder", s.user);
    }
    let mut text = describe_list(&s.reminders);
    if s.truncated {
        text.push_str(&format!(
            "\n(the first {}: there are more)",
            s.reminders.len()
        ));
    }
    text
}

/// One user a line, then how to ask for the next page.
fn describe_subscribers(id: &str, limit: Option<usize>, page: SubscriberPage) -> String {
    if page.users.is_empty() {
        return format!("no subscribers of {id} here");
    }
    let mut text = page.users.join("\n");
    if let Some(next) = page.next_after {
        let limit = limit.map(|n| format!(" --limit {n}")).unwrap_or_default();
        text.push_str(&format!(
            "\nmore: belfry reminder subscribers {id} --after {next}{limit}"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_client::BulkLineError;

    #[test]
    fn bulk_answers_show_counts_bad_lines_and_where_reading_stopped() {
        let answer = BulkAnswer {
            changed: 3,
            unchanged: 2,
            refused: 2,
            errors: vec![BulkLineError {
                line: 4,
                message: "not a user id".into(),
            }],
            complete: false,
            stopped_at_line: Some(9),
            error: None,
        };
        let text = describe_bulk(&answer, true);
        assert!(text.contains("changed:   3 (new subscriptions)"), "{text}");
        assert!(text.contains("unchanged: 2"), "{text}");
        assert!(text.contains("refused:   2"), "{text}");
        assert!(text.contains("line 4: not a user id"), "{text}");
        assert!(text.contains("1 more refused"), "{text}");
        assert!(text.contains("stopped reading at line 9"), "{text}");
    }
}
