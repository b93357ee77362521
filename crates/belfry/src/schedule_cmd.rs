//! `belfry schedule ...`: manage schedules on a running server through `belfry-client`.

use belfry_client::{
    Forecast, NextFireTimes, Request, Schedule, ScheduleList, ScheduleRun, ScheduleSpec,
};
use clap::{Args, Subcommand};

use crate::commands::Remote;
use crate::commands::{self, parse_headers, parse_payload};
use crate::show::{duration, late_policy, now_ms, rfc3339, table, time};

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule: --cron EXPR [--timezone ZONE] or --every DURATION.
    Create(Box<ScheduleCreate>),
    /// Replace a schedule's whole definition (the same flags as create, what is left out takes
    /// its default); it fires afresh from now, no past firing replayed.
    Replace(Box<ScheduleReplace>),
    /// List schedules.
    List,
    /// Show a schedule.
    Get {
        /// The schedule's id.
        id: String,
    },
    /// Show the next fire times, in UTC and in the schedule's zone.
    Next {
        /// The schedule's id.
        id: String,
        /// How many (1 to 1000).
        #[arg(short, long = "count", visible_alias = "n", default_value_t = 10)]
        n: usize,
    },
    /// Stop firing (nothing is replayed on resume).
    Pause {
        /// The schedule's id.
        id: String,
    },
    /// Fire again from now on.
    Resume {
        /// The schedule's id.
        id: String,
    },
    /// Fire once now, outside the timetable (paused or not): one task per shard.
    Run {
        /// The schedule's id.
        id: String,
    },
    /// Delete a schedule (tasks of past firings stay in their queue).
    Delete {
        /// The schedule's id.
        id: String,
    },
    /// How many tasks fall due in a queue per step, scheduled firings included.
    Forecast {
        /// The queue.
        queue: String,
        /// How far ahead: "1h", "1d" [default: 1h].
        #[arg(long)]
        horizon: Option<String>,
        /// Step length: "1m", "15m" [default: 1m].
        #[arg(long)]
        step: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ScheduleCreate {
    /// The schedule's id [default: generated].
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub def: ScheduleDefArgs,
}

#[derive(Debug, Args)]
pub struct ScheduleReplace {
    /// The schedule's id.
    pub id: String,
    #[command(flatten)]
    pub def: ScheduleDefArgs,
}

/// What a schedule does: the flags create and replace share.
#[derive(Debug, Args)]
pub struct ScheduleDefArgs {
    /// The queue the firings go to.
    pub queue: String,
    /// Cron expression: 5 fields, 6 with seconds first, or @hourly, @daily, ...; the day fields
    /// also take L (last day), 15W (nearest weekday), FRIL (last Friday), TUE#2 (second
    /// Tuesday): docs/schedules.md
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    pub cron: Option<String>,
    /// IANA time zone of the cron expression [default: UTC].
    #[arg(long, requires = "cron")]
    pub timezone: Option<String>,
    /// Fixed interval instead of cron: "30s", "5m" (at least 1s).
    #[arg(long)]
    pub every: Option<String>,
    /// JSON payload of each task (default null).
    #[arg(long)]
    pub payload: Option<String>,
    /// A header, "Name: value" or NAME=VALUE (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Deliver before normal-priority tasks.
    #[arg(long)]
    pub high: bool,
    /// Tasks per firing, each with Belfry-Shard and Belfry-Shard-Count headers.
    #[arg(long)]
    pub shards: Option<u32>,
    /// After downtime: skip, fire_once (default) or catch_up.
    #[arg(long)]
    pub misfire: Option<String>,
    /// First instant a firing may have (RFC 3339).
    #[arg(long)]
    pub start: Option<String>,
    /// Last instant a firing may have (RFC 3339).
    #[arg(long)]
    pub end: Option<String>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// The late policy of each firing's tasks.
    #[command(flatten)]
    pub late: commands::LateArgs,
    /// Webhook queues only: POST the firings to URL instead of the queue's webhook URL.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
}

fn spec(id: Option<String>, args: ScheduleDefArgs) -> anyhow::Result<ScheduleSpec> {
    let payload = parse_payload(args.payload.as_deref())?;
    let every_ms = commands::parse_ms("every", args.every.as_deref())?;
    let headers = parse_headers(&args.headers)?;
    let late = args
        .late
        .policy()?
        .map(|(policy, after_ms)| match after_ms {
            Some(after_ms) => serde_json::json!({"policy": policy, "after_ms": after_ms}),
            None => serde_json::json!({ "policy": policy }),
        });
    Ok(ScheduleSpec {
        id,
        queue: args.queue,
        cron: args.cron,
        timezone: args.timezone,
        every_ms,
        start_at: args.start,
        end_at: args.end,
        payload,
        headers,
        priority: args.high.then(|| "high".to_owned()),
        shard_count: args.shards,
        misfire: args.misfire,
        paused: args.paused.then_some(true),
        late,
        target: args.target,
        ..ScheduleSpec::default()
    })
}

fn describe(s: &Schedule) -> String {
    let rule = match (&s.cron, s.every_ms) {
        (Some(cron), _) => format!(
            "cron {cron:?} in {}",
            s.timezone.as_deref().unwrap_or("UTC")
        ),
        (None, Some(every)) => format!("every {}", duration(every)),
        (None, None) => "no rule".to_owned(),
    };
    let shards = if s.shard_count == 1 {
        String::new()
    } else {
        format!(", {} shards", s.shard_count)
    };
    let next = match (&s.next_fire_at, &s.next_fire_local) {
        _ if s.paused => "paused".to_owned(),
        (Some(_), Some(local)) if s.cron.is_some() => match s.next_fire_at_ms {
            Some(ms) => format!("next {} = {local}", time(ms, now_ms())),
            None => format!("next {local}"),
        },
        (Some(utc), _) => match s.next_fire_at_ms {
            Some(ms) => format!("next {}", time(ms, now_ms())),
            None => format!("next {utc}"),
        },
        (None, _) => "finished: no more firings".to_owned(),
    };
    // Only a policy other than the default is worth a word.
    let late = match s.late.get("policy").and_then(|p| p.as_str()) {
        Some(policy @ ("skip" | "dead")) => {
            let after_ms = s.late.get("after_ms").and_then(|ms| ms.as_u64());
            format!(", {}", late_policy(Some(policy), after_ms))
        }
        _ => String::new(),
    };
    let target = s
        .target
        .as_deref()
        .map_or_else(String::new, |target| format!(" (to {target})"));
    format!(
        "{id} -> {queue}{target}: {rule}{shards}, misfire {misfire}{late}\n  {next}",
        id = s.id,
        queue = s.queue,
        misfire = s.misfire,
    )
}

pub async fn run(remote: &Remote, command: ScheduleCommand) -> anyhow::Result<()> {
    let show = |s: Schedule| describe(&s);
    match command {
        ScheduleCommand::Create(args) => {
            let ScheduleCreate { id, def } = *args;
            commands::run(remote, Request::create_schedule(&spec(id, def)?), show).await
        }
        ScheduleCommand::Replace(args) => {
            let ScheduleReplace { id, def } = *args;
            let request = Request::replace_schedule(&id, &spec(None, def)?);
            commands::run(remote, request, show).await
        }
        ScheduleCommand::Get { id } => {
            commands::run(remote, Request::get_schedule(&id), show).await
        }
        ScheduleCommand::Pause { id } => {
            commands::run(remote, Request::pause_schedule(&id), show).await
        }
        ScheduleCommand::Resume { id } => {
            commands::run(remote, Request::resume_schedule(&id), show).await
        }
        ScheduleCommand::Run { id } => {
            commands::run(remote, Request::run_schedule(&id), |run: ScheduleRun| {
                let ids: Vec<&str> = run.tasks.iter().map(|t| t.id.as_str()).collect();
                let again = if run.tasks.iter().all(|t| t.duplicate) {
                    " (the same millisecond's run: no new task)"
                } else {
                    ""
                };
                format!(
                    "ran {} into {}: {}{again}",
                    run.schedule,
                    run.queue,
                    ids.join(" ")
                )
            })
            .await
        }
        ScheduleCommand::List => {
            commands::run(remote, Request::list_schedules(), describe_list).await
        }
        ScheduleCommand::Next { id, n } => {
            let request = Request::next_fire_times(&id, Some(n));
            commands::run(remote, request, |next: NextFireTimes| {
                describe_next(&id, next)
            })
            .await
        }
        ScheduleCommand::Delete { id } => {
            let done = format!("deleted schedule {id}");
            commands::run_empty(remote, Request::delete_schedule(&id), done).await
        }
        ScheduleCommand::Forecast {
            queue,
            horizon,
            step,
        } => {
            let horizon_ms = commands::parse_ms("horizon", horizon.as_deref())?;
            let step_ms = commands::parse_ms("step", step.as_deref())?;
            let request = Request::forecast(&queue, horizon_ms, step_ms);
            commands::run(remote, request, describe_forecast).await
        }
    }
}

fn describe_list(list: ScheduleList) -> String {
    if list.schedules.is_empty() {
        return "no schedules; create one with: belfry schedule create QUEUE --cron '0 * * * *'"
            .to_owned();
    }
    let lines: Vec<String> = list.schedules.iter().map(describe).collect();
    lines.join("\n")
}

fn describe_next(id: &str, next: NextFireTimes) -> String {
    if next.fire_times.is_empty() {
        return format!("{id} will not fire again");
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = next
        .fire_times
        .iter()
        .map(|t| vec![time(t.at_ms, now), t.local.clone()])
        .collect();
    table(&["FIRES AT", "IN THE SCHEDULE'S ZONE"], &rows)
}

fn describe_forecast(forecast: Forecast) -> String {
    let rows: Vec<Vec<String>> = forecast
        .steps
        .iter()
        .map(|s| {
            vec![
                rfc3339(s.start_ms),
                s.tasks.to_string(),
                s.firings.to_string(),
                s.total.to_string(),
            ]
        })
        .collect();
    table(&["STEP START", "TASKS", "FIRINGS", "TOTAL"], &rows)
}
