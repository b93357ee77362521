//! `belfry queue ...`: create, inspect, pause and delete queues.

use belfry_client::{DeliverySpec, Purged, Queue, QueueList, QueueSpec, Request, RetrySpec};
use clap::{Args, Subcommand};

use super::{parse_ms, run, run_empty, LateArgs};
use crate::commands::Remote;
use crate::show::{duration, fields, late_policy, now_ms, table};

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue, or change the settings given (others keep their values).
    Create(Box<QueueCreate>),
    /// Show a queue's settings and its task counts.
    Get {
        /// The queue's name.
        queue: String,
    },
    /// List queues with their task counts, sorted by name, a page (1,000) at a time.
    List {
        /// Start after this queue name (the next page of a long list).
        #[arg(long)]
        after: Option<String>,
    },
    /// Stop delivering the queue's tasks (new tasks are still accepted).
    Pause {
        /// The queue's name.
        queue: String,
    },
    /// Deliver a paused queue's tasks again.
    Resume {
        /// The queue's name.
        queue: String,
    },
    /// Delete a queue and every task in it.
    Delete {
        /// The queue's name.
        queue: String,
    },
    /// Drop every task of a queue (scheduled, leased and dead); the queue and its settings
    /// stay.
    Purge {
        /// The queue's name.
        queue: String,
        /// Yes, drop them all (required: there is no undo).
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct QueueCreate {
    /// The queue's name: 1 to 128 of A-Z a-z 0-9 _ . -
    pub queue: String,
    /// Tasks per second (0 = unlimited).
    #[arg(long, value_parser = crate::units::parse_rate)]
    pub rate: Option<f64>,
    /// Token bucket size.
    #[arg(long)]
    pub burst: Option<u32>,
    /// Most tasks leased or in delivery at once. 0: no limit for a pull queue, the server
    /// default (webhooks.in_flight_default) for a webhook, no per-queue limit (only the
    /// server's dispatch budgets) for a stream delivery.
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Delivery attempts before a task becomes a dead letter.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// First retry delay: "1s", "500ms"; it doubles each attempt.
    #[arg(long, value_name = "DURATION")]
    pub backoff_initial: Option<String>,
    /// Longest retry delay: "10m".
    #[arg(long, value_name = "DURATION")]
    pub backoff_max: Option<String>,
    /// --backoff-initial in ms (the earlier form).
    #[arg(long, hide = true, conflicts_with = "backoff_initial")]
    pub backoff_initial_ms: Option<u64>,
    /// --backoff-max in ms (the earlier form).
    #[arg(long, hide = true, conflicts_with = "backoff_max")]
    pub backoff_max_ms: Option<u64>,
    /// Deliver by POSTing to this URL instead of waiting for pull consumers.
    #[arg(long)]
    pub webhook: Option<String>,
    /// HMAC-SHA256 signing secret for the webhook.
    #[arg(long, requires = "webhook")]
    pub secret: Option<String>,
    /// While rotating the secret: the old one, which requests are signed under too, so
    /// receivers still holding it keep verifying; update the queue without it to finish.
    #[arg(long, requires = "secret")]
    pub previous_secret: Option<String>,
    /// A fixed header on every webhook request, "Name: value" or NAME=VALUE (repeat for more), e.g.
    /// --header 'Authorization: Bearer …' for an API gateway. It replaces a task header of the
    /// same name; the queue shows only its name. Updating the webhook without --header
    /// removes them, as it does the secret.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "webhook")]
    pub headers: Vec<String>,
    /// How long one delivery call may take: "5s" (a webhook request, or a stream append,
    /// publish or produce; each sink's bounds are in docs/sinks/).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// --timeout in ms (the earlier form).
    #[arg(long, hide = true, requires = "webhook", conflicts_with = "timeout")]
    pub timeout_ms: Option<u64>,
    /// Deliver to a Redis stream: CONNECTION:STREAM, where CONNECTION is a
    /// `[connections.NAME]` of type "redis" in the server's config.
    #[arg(long, value_name = "CONNECTION:STREAM", group = "push")]
    pub redis_stream: Option<String>,
    /// Trim the Redis stream to about this many entries on every append.
    #[arg(long, requires = "redis_stream")]
    pub maxlen: Option<u64>,
    /// Deliver to a NATS JetStream subject: CONNECTION:SUBJECT.
    #[arg(long, value_name = "CONNECTION:SUBJECT", group = "push")]
    pub nats: Option<String>,
    /// Deliver to a Kafka topic: CONNECTION:TOPIC.
    #[arg(long, value_name = "CONNECTION:TOPIC", group = "push")]
    pub kafka: Option<String>,
    /// The Kafka record key: "task_id" or "header:NAME" (none when not given).
    #[arg(long, requires = "kafka")]
    pub key: Option<String>,
    /// Make it a pull queue (undoes --webhook and the stream deliveries).
    #[arg(long, conflicts_with_all = ["webhook", "push"])]
    pub pull: bool,
    /// The late policy of tasks that name none.
    #[command(flatten)]
    pub late: LateArgs,
}

/// `CONNECTION:TARGET` split at its first colon.
fn connection_and(flag: &str, value: &str) -> anyhow::Result<(String, String)> {
    match value.split_once(':') {
        Some((connection, target)) if !connection.is_empty() && !target.is_empty() => {
            Ok((connection.to_owned(), target.to_owned()))
        }
        _ => anyhow::bail!(
            "--{flag} takes CONNECTION:TARGET (a connection declared in the server's config, a colon, then the stream, subject or topic), got {value:?}"
        ),
    }
}

fn spec(args: QueueCreate) -> anyhow::Result<QueueSpec> {
    let backoff_initial_ms =
        parse_ms("backoff-initial", args.backoff_initial.as_deref())?.or(args.backoff_initial_ms);
    let backoff_max_ms =
        parse_ms("backoff-max", args.backoff_max.as_deref())?.or(args.backoff_max_ms);
    let retry =
        (args.max_attempts.is_some() || backoff_initial_ms.is_some() || backoff_max_ms.is_some())
            .then_some(RetrySpec {
                max_attempts: args.max_attempts,
                backoff_initial_ms,
                backoff_max_ms,
            });
    let (late_policy, late_after_ms) = args.late.policy()?.unzip();
    let timeout_ms = parse_ms("timeout", args.timeout.as_deref())?.or(args.timeout_ms);
    let pushes = args.webhook.is_some()
        || args.redis_stream.is_some()
        || args.nats.is_some()
        || args.kafka.is_some();
    if timeout_ms.is_some() && !pushes {
        anyhow::bail!(
            "--timeout is a push delivery's: give it with --webhook, --redis-stream, --nats or --kafka"
        );
    }
    let delivery = if let Some(url) = args.webhook {
        Some(DeliverySpec::Webhook {
            url,
            secret: args.secret,
            previous_secret: args.previous_secret,
            headers: super::parse_headers(&args.headers)?,
            timeout_ms,
        })
    } else if let Some(value) = &args.redis_stream {
        let (connection, stream) = connection_and("redis-stream", value)?;
        Some(DeliverySpec::RedisStream {
            connection,
            stream,
            maxlen: args.maxlen,
            timeout_ms,
        })
    } else if let Some(value) = &args.nats {
        let (connection, subject) = connection_and("nats", value)?;
        Some(DeliverySpec::Nats {
            connection,
            subject,
            timeout_ms,
        })
    } else if let Some(value) = &args.kafka {
        let (connection, topic) = connection_and("kafka", value)?;
        Some(DeliverySpec::Kafka {
            connection,
            topic,
            key: args.key.clone(),
            timeout_ms,
        })
    } else if args.pull {
        Some(DeliverySpec::Pull)
    } else {
        None
    };
    Ok(QueueSpec {
        rate_per_s: args.rate,
        burst: args.burst,
        max_in_flight: args.max_in_flight,
        retry,
        delivery,
        paused: None,
        late_policy,
        late_after_ms: late_after_ms.flatten(),
    })
}

fn delivery(q: &Queue) -> String {
    match q.delivery.get("type").and_then(|t| t.as_str()) {
        Some("webhook") => format!(
            "webhook {}{}",
            q.delivery
                .get("url")
                .and_then(|u| u.as_str())
                .unwrap_or("?"),
            match (
                q.delivery.get("secret_set").and_then(|s| s.as_bool()),
                q.delivery
                    .get("previous_secret_set")
                    .and_then(|s| s.as_bool()),
            ) {
                (Some(true), Some(true)) => " (signed, rotating its secret)",
                (Some(true), _) => " (signed)",
                _ => " (unsigned)",
            }
        ),
        Some(kind @ ("redis_stream" | "nats" | "kafka")) => {
            let field = |name: &str| {
                q.delivery
                    .get(name)
                    .and_then(|v| v.as_str())
                    .unwrap_or("?")
                    .to_owned()
            };
            let target = match kind {
                "redis_stream" => field("stream"),
                "nats" => field("subject"),
                _ => field("topic"),
            };
            format!("{kind} {}:{target}", field("connection"))
        }
        Some(other) => other.to_owned(),
        None => "pull".to_owned(),
    }
}

/// A webhook's fixed headers, by name (the server never returns their values).
fn header_names(q: &Queue) -> String {
    let Some(names) = q.delivery.get("headers_set").and_then(|h| h.as_array()) else {
        return String::new();
    };
    let names: Vec<&str> = names.iter().filter_map(|n| n.as_str()).collect();
    format!("{} (values hidden)", names.join(", "))
}

fn rate(q: &Queue) -> String {
    if q.rate_per_s > 0.0 {
        format!("{}/s (burst {})", q.rate_per_s, q.burst)
    } else {
        "unlimited".to_owned()
    }
}

/// The in-flight cap: `max_in_flight`, or when that is 0 what applies to the queue's kind of
/// delivery (docs/api.md), named since the server's settings are not in its answer. The
/// console's queue page words it the same.
fn in_flight_max(q: &Queue) -> String {
    if q.max_in_flight > 0 {
        return q.max_in_flight.to_string();
    }
    match q.delivery.get("type").and_then(|t| t.as_str()) {
        None | Some("pull") => "no limit",
        Some("webhook") => "server default (webhooks.in_flight_default)",
        Some(_) => "no per-queue limit, only the server's dispatch budgets",
    }
    .to_owned()
}

pub(crate) fn describe(q: &Queue) -> String {
    fields(&[
        (
            "queue",
            format!("{}{}", q.name, if q.paused { " [paused]" } else { "" }),
        ),
        ("delivery", delivery(q)),
        ("headers", header_names(q)),
        // Push queues only (empty rows are left out).
        ("health", q.delivery_health.clone().unwrap_or_default()),
        ("rate", rate(q)),
        ("max in flight", in_flight_max(q)),
        (
            "retry",
            format!(
                "{} attempts, backoff {} doubling to {}",
                q.retry.max_attempts,
                duration(q.retry.backoff_initial_ms),
                duration(q.retry.backoff_max_ms)
            ),
        ),
        (
            "if late",
            late_policy(q.late_policy.as_deref(), q.late_after_ms),
        ),
        (
            "tasks",
            format!(
                "pending {} (due {}{}), in flight {}, dead {}",
                q.pending.unwrap_or(0),
                q.due.unwrap_or(0),
                q.oldest_due_ms
                    .map(|at| format!(", the oldest for {}", duration(now_ms().saturating_sub(at))))
                    .unwrap_or_default(),
                q.in_flight.unwrap_or(0),
                q.dead.unwrap_or(0)
            ),
        ),
    ])
}

fn describe_list(list: QueueList) -> String {
    if list.queues.is_empty() {
        return "no queues; create one with: belfry queue create NAME".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                if q.paused { "paused" } else { "active" }.to_owned(),
                q.pending.unwrap_or(0).to_string(),
                q.due.unwrap_or(0).to_string(),
                q.in_flight.unwrap_or(0).to_string(),
                q.dead.unwrap_or(0).to_string(),
                rate(q),
                delivery(q),
            ]
        })
        .collect();
    let table = table(
        &[
            "QUEUE",
            "STATE",
            "PENDING",
            "DUE",
            "IN FLIGHT",
            "DEAD",
            "RATE",
            "DELIVERY",
        ],
        &rows,
    );
    match list.next_after {
        Some(after) => format!("{table}\nmore queues follow: belfry queue list --after {after}"),
        None => table,
    }
}

pub async fn queue(remote: &Remote, command: QueueCommand) -> anyhow::Result<()> {
    let show = |q: Queue| describe(&q);
    match command {
        QueueCommand::Create(args) => {
            let name = args.queue.clone();
            // The warnings go to stderr, so stdout stays the queue (`--json` prints the
            // server's answer, warnings included).
            let show_warned = |q: Queue| {
                for warning in &q.warnings {
                    eprintln!("warning: {warning}");
                }
                describe(&q)
            };
            run(
                remote,
                Request::put_queue(&name, &spec(*args)?),
                show_warned,
            )
            .await
        }
        QueueCommand::Get { queue } => run(remote, Request::get_queue(&queue), show).await,
        QueueCommand::List { after } => {
            let request = match after {
                Some(after) => Request::list_queues_after(&after),
                None => Request::list_queues(),
            };
            run(remote, request, describe_list).await
        }
        QueueCommand::Pause { queue } => run(remote, Request::pause_queue(&queue), show).await,
        QueueCommand::Resume { queue } => run(remote, Request::resume_queue(&queue), show).await,
        QueueCommand::Delete { queue } => {
            let done = format!("deleted queue {queue} and its tasks");
            run_empty(remote, Request::delete_queue(&queue), done).await
        }
        QueueCommand::Purge { queue, yes } => {
            if !yes {
                anyhow::bail!(
                    "purging drops every task of {queue}, scheduled, leased and dead, with no \
                     undo: run it again with --yes"
                );
            }
            run(
                remote,
                Request::purge_queue(&queue),
                |answer: PurgeAnswer| {
                    let Purged {
                        pending,
                        in_flight,
                        dead,
                    } = answer.purged;
                    format!(
                    "purged {queue}: {pending} scheduled, {in_flight} in flight and {dead} dead \
                     tasks dropped; the queue and its settings stay"
                )
                },
            )
            .await
        }
    }
}

/// The answer of `POST /v1/queues/{queue}/purge`.
#[derive(serde::Deserialize)]
struct PurgeAnswer {
    purged: Purged,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(max_in_flight: u32, delivery: serde_json::Value) -> Queue {
        serde_json::from_value(serde_json::json!({
            "name": "q", "rate_per_s": 0.0, "burst": 1, "max_in_flight": max_in_flight,
            "retry": {"max_attempts": 10, "backoff_initial_ms": 1000, "backoff_max_ms": 600000},
            "delivery": delivery, "paused": false,
        }))
        .expect("a queue")
    }

    #[test]
    fn an_unset_in_flight_cap_says_what_applies_to_the_delivery() {
        let check = |max, delivery, expected: &str| {
            let shown = describe(&queue(max, delivery));
            assert!(
                shown.contains(&format!("max in flight: {expected}\n")),
                "{shown}"
            );
        };
        let webhook = serde_json::json!({"type": "webhook", "url": "https://example.com/h"});
        let nats = serde_json::json!({"type": "nats", "connection": "bus", "subject": "s"});
        check(0, serde_json::json!({"type": "pull"}), "no limit");
        check(
            0,
            webhook.clone(),
            "server default (webhooks.in_flight_default)",
        );
        check(
            0,
            nats,
            "no per-queue limit, only the server's dispatch budgets",
        );
        check(8, webhook, "8");
    }

    #[test]
    fn a_push_queue_shows_its_signing_and_delivery_health() {
        let mut q = queue(
            0,
            serde_json::json!({"type": "webhook", "url": "https://example.com/h", "secret_set": true}),
        );
        q.delivery_health = Some("unreachable: HTTP 503".into());
        let shown = describe(&q);
        assert!(
            shown.contains("delivery:      webhook https://example.com/h (signed)\n"),
            "{shown}"
        );
        assert!(
            shown.contains("health:        unreachable: HTTP 503\n"),
            "{shown}"
        );
        let pull = describe(&queue(0, serde_json::json!({"type": "pull"})));
        assert!(!pull.contains("health:"), "{pull}");
        assert!(!pull.contains("headers:"), "{pull}");
    }

    #[test]
    fn header_flags_are_name_and_value() {
        let given = |flags: &[&str]| {
            let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
            crate::commands::parse_headers(&flags)
        };
        let headers = given(&["Authorization: Bearer a=b:c", "X-Env:prod", "X-Key=k:v="]).unwrap();
        assert_eq!(headers["Authorization"], "Bearer a=b:c");
        assert_eq!(headers["X-Env"], "prod");
        assert_eq!(headers["X-Key"], "k:v=");
        assert!(given(&["no colon"])
            .unwrap_err()
            .to_string()
            .contains("Name: value"));
        let twice = given(&["X-Env: a", "x-env: b"]).unwrap_err().to_string();
        assert!(twice.contains("twice"), "{twice}");
    }
}
