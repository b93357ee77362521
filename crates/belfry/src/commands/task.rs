//! `belfry task ...`: submit (one, or an NDJSON file streamed through the import), inspect,
//! cancel and reschedule tasks (by id or by idempotency key), and consume a pull queue by
//! hand: lease, ack, nack, extend.

use anyhow::{anyhow, bail, Context};
use belfry_client::{
    AckItemResult, DueTime, ImportAnswer, LeaseRequest, LeasedList, Nack, NewTask, Request,
    Results, Submitted, Task, TaskPage, TaskState,
};
use clap::{Args, Subcommand};

use super::streamed::{file_body, report};
use super::{client, parse_headers, parse_ms, parse_payload, print_raw, run, say, send, LateArgs};
use crate::commands::Remote;
use crate::show::{clip, fields, late_policy, more_refused, now_ms, table, time};

/// How much of a payload a table row shows.
const PAYLOAD_COLUMN_CHARS_MAX: usize = 60;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Schedule a task: due now, after --delay, or --at a time.
    Add(TaskAdd),
    /// Import tasks from an NDJSON file, one task a line as the API's submit takes it
    /// ({"payload": ..., "delay_ms": ...}), streamed: FILE, or - for stdin (which must keep
    /// up: the server ends a body that sends nothing for http.body_read_timeout). Exits 0 once
    /// the whole file was read, refused lines listed; 1 when the import stopped early.
    Import {
        /// The queue to add them to; it must exist.
        queue: String,
        /// The NDJSON file, or - for stdin.
        file: std::path::PathBuf,
    },
    /// List a queue's scheduled and leased tasks, a page at a time (in the store's order:
    /// by id, or on the embedded store by the file that holds each task, then by id).
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
    /// Write a queue's scheduled and leased tasks as NDJSON, one submit a line (due time,
    /// payload, key, headers, priority, late policy, target), which `belfry task import`
    /// takes back: to move tasks to another server or store. Ids, attempts and leases are not
    /// kept; leased tasks are written due when they were.
    Export {
        /// The queue.
        queue: String,
        /// Where to write: a file, or - (the default) for stdout. A progress bar and the
        /// summary go to stderr.
        file: Option<std::path::PathBuf>,
    },
    /// Show a task: its state, due time, attempts and payload.
    Get(Target),
    /// Cancel scheduled tasks (not leased or finished): by id, several ids, --key (repeatable)
    /// or --ids-file. Several go through the bulk route, 1,000 a request; the command fails if
    /// any was not cancelled, after listing each.
    Cancel(super::cancel::CancelArgs),
    /// Move a scheduled task to a new due time.
    Reschedule {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        due: When,
    },
    /// Lease due tasks from a pull queue, for as long as --visibility; ack each when done.
    Lease {
        /// The pull queue.
        queue: String,
        /// Most tasks to lease (1 to 1000).
        #[arg(long, default_value_t = 1)]
        max: u32,
        /// How long the lease holds before the task is due again: "30s", "5m" [server: 30s].
        #[arg(long)]
        visibility: Option<String>,
        /// Wait this long for a task when none is due: "10s" (at most 30s) [default: 0].
        #[arg(long)]
        wait: Option<String>,
    },
    /// Mark leased tasks done: QUEUE ID LEASE_ID, or several ID LEASE_ID pairs at once.
    Ack {
        /// The queue the tasks were leased from.
        queue: String,
        /// ID LEASE_ID, repeated for a batch.
        #[arg(value_names = ["ID", "LEASE_ID"], num_args = 2.., required = true)]
        pairs: Vec<String>,
    },
    /// Give a leased task back: due again after --delay (or the queue's backoff), or a dead
    /// letter once out of attempts.
    Nack {
        /// The queue the task was leased from.
        queue: String,
        /// The task's id.
        id: String,
        /// The lease id the lease answered.
        lease_id: String,
        /// Retry after this long: "5s" [default: the queue's backoff].
        #[arg(long)]
        delay: Option<String>,
        /// Why it failed: kept as the dead reason if this was the last attempt (a nack that
        /// retries keeps no reason).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Hold a lease longer: --visibility from now.
    Extend {
        /// The queue the task was leased from.
        queue: String,
        /// The task's id.
        id: String,
        /// The lease id the lease answered.
        lease_id: String,
        /// The lease's new length from now: "30s", "5m".
        #[arg(long)]
        visibility: String,
    },
}

/// A task named by its id, or by the idempotency key it was submitted with.
#[derive(Debug, Args)]
pub struct Target {
    /// The task's queue.
    pub queue: String,
    /// The task's id (or use --key).
    #[arg(required_unless_present = "key", conflicts_with = "key")]
    pub id: Option<String>,
    /// The idempotency key the task was submitted with, instead of its id.
    #[arg(long)]
    pub key: Option<String>,
}

/// A due time: exactly one of the three forms.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct When {
    /// Due after this long from now: "10s", "10m", "250ms".
    #[arg(long)]
    pub delay: Option<String>,
    /// Due at this RFC 3339 time ("2026-11-23T12:10:00Z").
    #[arg(long)]
    pub at: Option<String>,
    /// Due at this unix time in milliseconds.
    #[arg(long)]
    pub at_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct TaskAdd {
    /// The queue to add it to; it must exist (`belfry queue create`).
    pub queue: String,
    /// JSON payload (default null).
    #[arg(long, conflicts_with_all = ["payload_file", "binary_file"])]
    pub payload: Option<String>,
    /// The JSON payload read from a file ("-": stdin), for one too big for the command line.
    #[arg(long, value_name = "PATH", conflicts_with = "binary_file")]
    pub payload_file: Option<std::path::PathBuf>,
    /// Any bytes read from a file ("-": stdin), delivered as they are (sent as
    /// payload_base64; a webhook gets them as application/octet-stream).
    #[arg(long, value_name = "PATH")]
    pub binary_file: Option<std::path::PathBuf>,
    /// Due after this long: "10s", "5m", "250ms".
    #[arg(long, conflicts_with_all = ["at", "at_ms"])]
    pub delay: Option<String>,
    /// Due at this RFC 3339 time.
    #[arg(long, conflicts_with = "at_ms")]
    pub at: Option<String>,
    /// Due at this unix time in milliseconds.
    #[arg(long)]
    pub at_ms: Option<u64>,
    /// A repeat with the same key returns the existing task instead of adding one (`--key`,
    /// as `task get`, `cancel` and `reschedule` name it).
    #[arg(long, visible_alias = "key")]
    pub idempotency_key: Option<String>,
    /// Deliver before normal-priority tasks.
    #[arg(long)]
    pub high: bool,
    /// A header, "Name: value" or NAME=VALUE (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    #[command(flatten)]
    pub late: LateArgs,
    /// Webhook queues only: POST this task to URL instead of the queue's webhook URL (signed
    /// and retried the same way).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
}

/// The bytes of the file at `path`, or of stdin for "-".
fn read_input(flag: &str, path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .with_context(|| format!("{flag} -: read stdin"))?;
    } else {
        bytes = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    }
    Ok(bytes)
}

/// The task's payload: `--payload`'s JSON, `--payload-file`'s, or `--binary-file`'s bytes
/// (base64 for the API).
fn payload_of(args: &TaskAdd) -> anyhow::Result<(Option<serde_json::Value>, Option<String>)> {
    use base64::Engine as _;
    if let Some(path) = &args.binary_file {
        let bytes = read_input("--binary-file", path)?;
        return Ok((
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ));
    }
    if let Some(path) = &args.payload_file {
        let bytes = read_input("--payload-file", path)?;
        let value = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "--payload-file {}: not JSON (send other bytes with --binary-file)",
                path.display()
            )
        })?;
        return Ok((Some(value), None));
    }
    Ok((parse_payload(args.payload.as_deref())?, None))
}

fn new_task(args: &TaskAdd) -> anyhow::Result<NewTask> {
    let (late_policy, late_after_ms) = args.late.policy()?.unzip();
    let (payload, payload_base64) = payload_of(args)?;
    Ok(NewTask {
        payload,
        payload_base64,
        delay_ms: parse_ms("delay", args.delay.as_deref())?,
        run_at: args.at.clone(),
        run_at_ms: args.at_ms,
        idempotency_key: args.idempotency_key.clone(),
        headers: parse_headers(&args.headers)?,
        priority: args.high.then(|| "high".to_owned()),
        late_policy,
        late_after_ms: late_after_ms.flatten(),
        target: args.target.clone(),
    })
}

fn due_time(when: When) -> anyhow::Result<DueTime> {
    match (
        parse_ms("delay", when.delay.as_deref())?,
        when.at,
        when.at_ms,
    ) {
        (Some(ms), None, None) => Ok(DueTime::DelayMs(ms)),
        (None, Some(at), None) => Ok(DueTime::At(at)),
        (None, None, Some(ms)) => Ok(DueTime::AtMs(ms)),
        _ => bail!("give exactly one of --delay, --at and --at-ms"),
    }
}

/// Streams the file through the import endpoint and prints the answer. An import the server
/// stopped part way fails the command after the counts are printed (what came before
/// `stopped_at_line` was applied).
async fn import(remote: &Remote, queue: &str, file: &std::path::Path) -> anyhow::Result<()> {
    let client = client(remote)?;
    let (body, bar) = file_body("FILE", file).await?;
    let result = client.import_tasks(queue, body).await;
    bar.finish_and_clear();
    report(remote, result, import_stopped, describe_import)
}

/// The counts of an import that stopped part way.
fn import_stopped(error: &belfry_client::Error) -> Option<&ImportAnswer> {
    match error {
        belfry_client::Error::ImportIncomplete { answer, .. } => Some(answer.as_ref()),
        _ => None,
    }
}

fn describe_import(answer: &ImportAnswer) -> String {
    let mut text = fields(&[
        ("created", answer.created.to_string()),
        (
            "duplicates",
            format!("{} (idempotency key of a live task)", answer.duplicates),
        ),
        ("refused", format!("{} (not valid tasks)", answer.refused)),
    ]);
    for line in &answer.errors {
        text.push_str(&format!(
            "\nline {}: {}: {}",
            line.line, line.error.code, line.error.message
        ));
    }
    text.push_str(&more_refused(answer.refused, answer.errors.len()));
    if !answer.complete {
        let line = answer.stopped_at_line.unwrap_or(1);
        text.push_str(&format!(
            "\nincomplete: the server stopped at line {line}; every line before it was \
             applied, none from it on: resend from line {line} (with idempotency keys, the \
             whole file again is safe)"
        ));
    }
    text
}

/// A page of live tasks as a table, and the command for the next page.
fn describe_page(queue: &str, limit: Option<usize>, page: TaskPage) -> String {
    if page.tasks.is_empty() {
        return format!("no scheduled or leased tasks in {queue}");
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = page
        .tasks
        .iter()
        .map(|t| {
            let due = match t.lease_until_ms {
                Some(until) => format!("leased until {}", time(until, now)),
                None => time(t.due_at_ms, now),
            };
            let payload = match (&t.payload, &t.payload_base64) {
                (_, Some(bytes)) => format!("{bytes} (base64)"),
                (Some(json), None) => json.to_string(),
                (None, None) => String::new(),
            };
            vec![
                t.id.clone(),
                t.state.clone(),
                due,
                t.attempts.to_string(),
                clip(&payload, PAYLOAD_COLUMN_CHARS_MAX),
            ]
        })
        .collect();
    let mut text = table(&["TASK", "STATE", "DUE", "ATTEMPTS", "PAYLOAD"], &rows);
    if let Some(next) = page.next_after {
        let limit = limit.map(|n| format!(" --limit {n}")).unwrap_or_default();
        text.push_str(&format!(
            "\nmore: belfry task list {queue} --after {next}{limit}"
        ));
    }
    text
}

/// The task's fields, one aligned line each.
pub(crate) fn describe(t: &Task) -> String {
    let now = now_ms();
    let payload = match (&t.payload, &t.payload_base64) {
        (_, Some(bytes)) => format!("{bytes} (base64)"),
        (Some(json), None) => json.to_string(),
        (None, None) => String::new(),
    };
    let headers: Vec<String> = t.headers.iter().map(|(k, v)| format!("{k}={v}")).collect();
    fields(&[
        ("task", t.id.clone()),
        ("queue", t.queue.clone()),
        ("state", t.state.clone()),
        ("due", time(t.due_at_ms, now)),
        (
            "leased until",
            t.lease_until_ms.map(|ms| time(ms, now)).unwrap_or_default(),
        ),
        ("attempts", t.attempts.to_string()),
        ("priority", t.priority.clone()),
        (
            "if late",
            late_policy(t.late_policy.as_deref(), t.late_after_ms),
        ),
        ("key", t.idempotency_key.clone().unwrap_or_default()),
        ("target", t.target.clone().unwrap_or_default()),
        ("dead because", t.dead_reason.clone().unwrap_or_default()),
        ("headers", headers.join(", ")),
        ("payload", payload),
    ])
}

/// A new task ("scheduled"), or the one its idempotency key already names, in its own state
/// (on Redis a key names a finished task for a minute: "cancelled" is then the truth).
fn describe_submitted(s: Submitted) -> String {
    let note = if s.duplicate {
        " (already known: same idempotency key)"
    } else {
        ""
    };
    format!(
        "{} {} in {}, due {}{note}",
        s.id,
        s.state,
        s.queue,
        time(s.due_at_ms, now_ms())
    )
}

fn describe_leased(queue: &str, list: LeasedList) -> String {
    if list.tasks.is_empty() {
        return format!("no task due in {queue}");
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .tasks
        .iter()
        .map(|t| {
            let payload = match (&t.payload, &t.payload_base64) {
                (_, Some(bytes)) => format!("{bytes} (base64)"),
                (Some(json), None) => json.to_string(),
                (None, None) => "null".to_owned(),
            };
            vec![
                t.id.clone(),
                t.lease_id.clone(),
                t.attempt.to_string(),
                time(t.lease_until_ms, now),
                clip(&payload, PAYLOAD_COLUMN_CHARS_MAX),
            ]
        })
        .collect();
    let header = ["TASK", "LEASE", "ATTEMPT", "LEASED UNTIL", "PAYLOAD"];
    format!(
        "{}\nack each with: belfry task ack {queue} TASK LEASE",
        table(&header, &rows)
    )
}

/// After ack, nack or extend: where the task stands now.
fn describe_state(s: TaskState) -> String {
    let now = now_ms();
    match (s.state.as_str(), s.due_at_ms, s.lease_until_ms) {
        ("done", _, _) => format!("{} done", s.id),
        ("scheduled", Some(due), _) => format!("{} scheduled again, due {}", s.id, time(due, now)),
        ("leased", _, Some(until)) => format!("{} leased until {}", s.id, time(until, now)),
        ("dead", _, _) => format!("{} is a dead letter now (out of attempts)", s.id),
        (state, _, _) => format!("{} {state}", s.id),
    }
}

pub async fn task(remote: &Remote, command: TaskCommand) -> anyhow::Result<()> {
    let show = |t: Task| describe(&t);
    match command {
        TaskCommand::Add(args) => {
            let request = Request::submit(&args.queue, &new_task(&args)?);
            run(remote, request, describe_submitted).await
        }
        TaskCommand::Import { queue, file } => import(remote, &queue, &file).await,
        TaskCommand::List {
            queue,
            after,
            limit,
        } => {
            let request = Request::list_tasks(&queue, after.as_deref(), limit);
            run(remote, request, |page| describe_page(&queue, limit, page)).await
        }
        TaskCommand::Export { queue, file } => {
            super::export::export(remote, &queue, file.as_deref()).await
        }
        TaskCommand::Get(target) => run(remote, get_request(&target), show).await,
        TaskCommand::Cancel(args) => super::cancel::cancel(remote, args).await,
        TaskCommand::Reschedule { target, due } => {
            let due = due_time(due)?;
            let request = match (&target.id, &target.key) {
                (_, Some(key)) => Request::reschedule_by_key(&target.queue, key, &due),
                (Some(id), None) => Request::reschedule(&target.queue, id, &due),
                (None, None) => bail!("name the task by ID or --key"),
            };
            run(remote, request, show).await
        }
        TaskCommand::Lease {
            queue,
            max,
            visibility,
            wait,
        } => {
            let lease = LeaseRequest {
                max: Some(max),
                visibility_ms: parse_ms("visibility", visibility.as_deref())?,
                wait_ms: parse_ms("wait", wait.as_deref())?,
            };
            let request = Request::lease(&queue, &lease);
            run(remote, request, |list| describe_leased(&queue, list)).await
        }
        TaskCommand::Ack { queue, pairs } => ack(remote, &queue, &pairs).await,
        TaskCommand::Nack {
            queue,
            id,
            lease_id,
            delay,
            reason,
        } => {
            let nack = Nack {
                delay_ms: parse_ms("delay", delay.as_deref())?,
                reason,
            };
            let request = Request::nack(&queue, &id, &lease_id, &nack);
            run(remote, request, describe_state).await
        }
        TaskCommand::Extend {
            queue,
            id,
            lease_id,
            visibility,
        } => {
            let visibility_ms = parse_ms("visibility", Some(&visibility))?.unwrap_or_default();
            let request = Request::extend(&queue, &id, &lease_id, visibility_ms);
            run(remote, request, describe_state).await
        }
    }
}

fn get_request(target: &Target) -> Request {
    match (&target.id, &target.key) {
        (_, Some(key)) => Request::get_task_by_key(&target.queue, key),
        (id, None) => Request::get_task(&target.queue, id.as_deref().unwrap_or_default()),
    }
}

/// One pair acks through the single-task route; several go in one batch, and any failed ack
/// makes the command fail after printing every result.
async fn ack(remote: &Remote, queue: &str, pairs: &[String]) -> anyhow::Result<()> {
    if pairs.len() % 2 != 0 {
        bail!("give each task as ID LEASE_ID: got {} words", pairs.len());
    }
    if let [id, lease_id] = pairs {
        return run(remote, Request::ack(queue, id, lease_id), describe_state).await;
    }
    let acks: Vec<(String, String)> = pairs
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    let answer = send(remote, &Request::ack_batch(queue, &acks)).await?;
    let results: Results<AckItemResult> = answer.json()?;
    if remote.json {
        print_raw(&answer)?;
    } else {
        for result in &results.results {
            match &result.error {
                None => say(format_args!("{} done", result.id))?,
                Some(e) => say(format_args!(
                    "{} not acked: {}: {}",
                    result.id, e.code, e.message
                ))?,
            }
        }
    }
    let failed = results.results.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        return Err(anyhow!("{failed} of {} acks failed", results.results.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitted(state: &str, duplicate: bool) -> Submitted {
        Submitted {
            id: "0000000000000000000000000000abcd".into(),
            queue: "orders".into(),
            due_at_ms: 0,
            state: state.into(),
            duplicate,
        }
    }

    /// A duplicate is shown in its task's state: a cancelled task is not "scheduled".
    #[test]
    fn a_submit_is_described_in_its_tasks_state() {
        let new = describe_submitted(submitted("scheduled", false));
        assert!(new.contains(" scheduled in orders, due "), "{new}");
        let known = describe_submitted(submitted("cancelled", true));
        assert!(known.contains(" cancelled in orders, due "), "{known}");
        assert!(
            known.ends_with("(already known: same idempotency key)"),
            "{known}"
        );
    }
}
