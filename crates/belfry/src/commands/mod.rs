//! Subcommands that talk to a running server through `belfry-client`.

use std::collections::BTreeMap;

use anyhow::{anyhow, Context};
use belfry_client::{Client, DeliverySpec, NewTask, Queue, QueueSpec, RetrySpec, Task};
use serde::Serialize;

use crate::cli::{DeadCommand, QueueCommand, Remote, TaskAdd, TaskCommand};

pub(crate) fn client(remote: &Remote) -> anyhow::Result<Client> {
    Client::new(&remote.server).with_context(|| format!("server URL {:?}", remote.server))
}

pub(crate) fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `--payload TEXT`: JSON, parsed here so a typo is reported before anything is sent.
pub(crate) fn parse_payload(text: Option<&str>) -> anyhow::Result<Option<serde_json::Value>> {
    text.map(|text| {
        serde_json::from_str(text).context("--payload must be JSON (quote strings: '\"hi\"')")
    })
    .transpose()
}

/// Repeated `--header NAME=VALUE` flags.
pub(crate) fn parse_headers(flags: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    flags
        .iter()
        .map(|h| {
            h.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| anyhow!("--header must be NAME=VALUE, got {h:?}"))
        })
        .collect()
}

fn describe_queue(q: &Queue) -> String {
    let delivery = match q.delivery.get("type").and_then(|t| t.as_str()) {
        Some("webhook") => format!(
            "webhook {}",
            q.delivery
                .get("url")
                .and_then(|u| u.as_str())
                .unwrap_or("?")
        ),
        _ => "pull".to_owned(),
    };
    let rate = if q.rate_per_s > 0.0 {
        format!("{}/s (burst {})", q.rate_per_s, q.burst)
    } else {
        "unlimited".to_owned()
    };
    let in_flight_max = if q.max_in_flight > 0 {
        q.max_in_flight.to_string()
    } else {
        "unlimited".to_owned()
    };
    format!(
        "{name}{paused}\n  delivery: {delivery}\n  rate: {rate}, max in flight: {in_flight_max}, attempts: {attempts}\n  pending {pending} (due {due}), in flight {in_flight}, dead {dead}",
        name = q.name,
        paused = if q.paused { " [paused]" } else { "" },
        attempts = q.retry.max_attempts,
        pending = q.pending.unwrap_or(0),
        due = q.due.unwrap_or(0),
        in_flight = q.in_flight.unwrap_or(0),
        dead = q.dead.unwrap_or(0),
    )
}

fn describe_task(t: &Task) -> String {
    let mut text = format!(
        "{id} in {queue}: {state}, due at {due} ms, attempts {attempts}, priority {priority}",
        id = t.id,
        queue = t.queue,
        state = t.state,
        due = t.due_at_ms,
        attempts = t.attempts,
        priority = t.priority,
    );
    if let Some(reason) = &t.dead_reason {
        text.push_str(&format!("\n  dead: {reason}"));
    }
    if let Some(payload) = &t.payload {
        text.push_str(&format!("\n  payload: {payload}"));
    }
    if let Some(payload) = &t.payload_base64 {
        text.push_str(&format!("\n  payload (base64): {payload}"));
    }
    text
}

pub async fn queue(remote: &Remote, command: QueueCommand) -> anyhow::Result<()> {
    let client = client(remote)?;
    let queue = match command {
        QueueCommand::Create(args) => {
            let retry = (args.max_attempts.is_some()
                || args.backoff_initial_ms.is_some()
                || args.backoff_max_ms.is_some())
            .then_some(RetrySpec {
                max_attempts: args.max_attempts,
                backoff_initial_ms: args.backoff_initial_ms,
                backoff_max_ms: args.backoff_max_ms,
            });
            let delivery = match (args.webhook, args.pull) {
                (Some(url), _) => Some(DeliverySpec::Webhook {
                    url,
                    secret: args.secret,
                    timeout_ms: args.timeout_ms,
                }),
                (None, true) => Some(DeliverySpec::Pull),
                (None, false) => None,
            };
            let spec = QueueSpec {
                rate_per_s: args.rate,
                burst: args.burst,
                max_in_flight: args.max_in_flight,
                retry,
                delivery,
                paused: None,
            };
            client.put_queue(&args.queue, &spec).await?
        }
        QueueCommand::Get { queue } => client.get_queue(&queue).await?,
        QueueCommand::List => {
            let queues = client.list_queues().await?;
            if remote.json {
                return print_json(&queues);
            }
            if queues.is_empty() {
                println!("no queues; create one with: belfry queue create NAME");
            }
            for q in &queues {
                println!("{}", describe_queue(q));
            }
            return Ok(());
        }
        QueueCommand::Pause { queue } => client.pause(&queue).await?,
        QueueCommand::Resume { queue } => client.resume(&queue).await?,
        QueueCommand::Delete { queue } => {
            client.delete_queue(&queue).await?;
            if remote.json {
                return print_json(&serde_json::json!({"deleted": queue}));
            }
            println!("deleted queue {queue}");
            return Ok(());
        }
    };
    if remote.json {
        print_json(&queue)
    } else {
        println!("{}", describe_queue(&queue));
        Ok(())
    }
}

fn new_task(args: &TaskAdd) -> anyhow::Result<NewTask> {
    let payload = parse_payload(args.payload.as_deref())?;
    let delay_ms = args
        .delay
        .as_deref()
        .map(crate::units::parse_duration_ms)
        .transpose()
        .map_err(|e| anyhow!("--delay: {e}"))?;
    let headers = parse_headers(&args.headers)?;
    Ok(NewTask {
        payload,
        payload_base64: None,
        delay_ms,
        run_at: args.at.clone(),
        run_at_ms: args.at_ms,
        idempotency_key: args.idempotency_key.clone(),
        headers,
        priority: args.high.then(|| "high".to_owned()),
    })
}

pub async fn task(remote: &Remote, command: TaskCommand) -> anyhow::Result<()> {
    let client = client(remote)?;
    match command {
        TaskCommand::Add(args) => {
            let submitted = client.submit(&args.queue, &new_task(&args)?).await?;
            if remote.json {
                return print_json(&submitted);
            }
            let note = if submitted.duplicate {
                " (already known: same idempotency key)"
            } else {
                ""
            };
            println!(
                "{} scheduled in {} for {} ms{note}",
                submitted.id, submitted.queue, submitted.due_at_ms
            );
        }
        TaskCommand::Get { queue, id } => {
            let task = client.get_task(&queue, &id).await?;
            if remote.json {
                return print_json(&task);
            }
            println!("{}", describe_task(&task));
        }
        TaskCommand::Cancel { queue, id } => {
            client.cancel(&queue, &id).await?;
            if remote.json {
                return print_json(&serde_json::json!({"id": id, "state": "cancelled"}));
            }
            println!("cancelled {id}");
        }
    }
    Ok(())
}

pub async fn dead(remote: &Remote, command: DeadCommand) -> anyhow::Result<()> {
    let client = client(remote)?;
    match command {
        DeadCommand::List {
            queue,
            after,
            limit,
        } => {
            let page = client.list_dead(&queue, after.as_deref(), limit).await?;
            if remote.json {
                return print_json(&page);
            }
            if page.tasks.is_empty() {
                println!("no dead letters in {queue}");
            }
            for task in &page.tasks {
                println!("{}", describe_task(task));
            }
            if let Some(next) = page.next_after {
                println!("more: belfry dead list {queue} --after {next}");
            }
        }
        DeadCommand::Redrive { queue, id } => {
            let task = client.redrive(&queue, &id).await?;
            if remote.json {
                return print_json(&task);
            }
            println!("redriven: {}", describe_task(&task));
        }
    }
    Ok(())
}
