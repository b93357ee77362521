//! `belfry schedule ...`: manage schedules on a running server through `belfry-client`.

use anyhow::anyhow;
use belfry_client::{Schedule, ScheduleSpec};
use clap::{Args, Subcommand};

use crate::cli::Remote;
use crate::commands::{client, parse_headers, parse_payload, print_json};

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule: --cron EXPR [--timezone ZONE] or --every DURATION.
    Create(ScheduleCreate),
    /// List schedules.
    List,
    /// Show a schedule.
    Get { id: String },
    /// Show the next fire times, in UTC and in the schedule's zone.
    Next {
        id: String,
        /// How many (1 to 1000).
        #[arg(short, long, default_value_t = 10)]
        n: usize,
    },
    /// Stop firing (nothing is replayed on resume).
    Pause { id: String },
    /// Fire again from now on.
    Resume { id: String },
    /// Delete a schedule (tasks of past firings stay in their queue).
    Delete { id: String },
    /// How many tasks fall due in a queue per step, scheduled firings included.
    Forecast {
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
    /// The queue the firings go to.
    pub queue: String,
    /// Cron expression: 5 fields, 6 with seconds first, or @hourly, @daily, ...
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    pub cron: Option<String>,
    /// IANA time zone of the cron expression [default: UTC].
    #[arg(long, requires = "cron")]
    pub timezone: Option<String>,
    /// Fixed interval instead of cron: "30s", "5m" (at least 1s).
    #[arg(long)]
    pub every: Option<String>,
    /// The schedule's id [default: generated].
    #[arg(long)]
    pub id: Option<String>,
    /// JSON payload of each task (default null).
    #[arg(long)]
    pub payload: Option<String>,
    /// A header NAME=VALUE (repeatable).
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
}

fn spec(args: ScheduleCreate) -> anyhow::Result<ScheduleSpec> {
    let payload = parse_payload(args.payload.as_deref())?;
    let every_ms = args
        .every
        .as_deref()
        .map(crate::units::parse_duration_ms)
        .transpose()
        .map_err(|e| anyhow!("--every: {e}"))?;
    let headers = parse_headers(&args.headers)?;
    Ok(ScheduleSpec {
        id: args.id,
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
        ..ScheduleSpec::default()
    })
}

fn describe(s: &Schedule) -> String {
    let rule = match (&s.cron, s.every_ms) {
        (Some(cron), _) => format!(
            "cron {cron:?} in {}",
            s.timezone.as_deref().unwrap_or("UTC")
        ),
        (None, Some(every)) => format!("every {every} ms"),
        (None, None) => "no rule".to_owned(),
    };
    let shards = if s.shard_count == 1 {
        String::new()
    } else {
        format!(", {} shards", s.shard_count)
    };
    let next = match (&s.next_fire_at, &s.next_fire_local) {
        _ if s.paused => "paused".to_owned(),
        (Some(utc), Some(local)) if s.cron.is_some() => format!("next {utc} ({local})"),
        (Some(utc), _) => format!("next {utc}"),
        (None, _) => "finished: no more firings".to_owned(),
    };
    format!(
        "{id} -> {queue}: {rule}{shards}, misfire {misfire}\n  {next}",
        id = s.id,
        queue = s.queue,
        misfire = s.misfire,
    )
}

pub async fn run(remote: &Remote, command: ScheduleCommand) -> anyhow::Result<()> {
    let client = client(remote)?;
    let schedule = match command {
        ScheduleCommand::Create(args) => client.create_schedule(&spec(args)?).await?,
        ScheduleCommand::Get { id } => client.get_schedule(&id).await?,
        ScheduleCommand::Pause { id } => client.pause_schedule(&id).await?,
        ScheduleCommand::Resume { id } => client.resume_schedule(&id).await?,
        ScheduleCommand::List => {
            let schedules = client.list_schedules().await?;
            if remote.json {
                return print_json(&schedules);
            }
            if schedules.is_empty() {
                println!(
                    "no schedules; create one with: belfry schedule create QUEUE --cron '0 * * * *'"
                );
            }
            for s in &schedules {
                println!("{}", describe(s));
            }
            return Ok(());
        }
        ScheduleCommand::Next { id, n } => {
            let next = client.next_fire_times(&id, Some(n)).await?;
            if remote.json {
                return print_json(&next);
            }
            if next.fire_times.is_empty() {
                println!("{id} will not fire again");
            }
            for t in &next.fire_times {
                println!("{}  {}", t.at, t.local);
            }
            return Ok(());
        }
        ScheduleCommand::Delete { id } => {
            client.delete_schedule(&id).await?;
            if remote.json {
                return print_json(&serde_json::json!({"deleted": id}));
            }
            println!("deleted schedule {id}");
            return Ok(());
        }
        ScheduleCommand::Forecast {
            queue,
            horizon,
            step,
        } => {
            let ms = |flag: &str, text: Option<String>| {
                text.as_deref()
                    .map(crate::units::parse_duration_ms)
                    .transpose()
                    .map_err(|e| anyhow!("--{flag}: {e}"))
            };
            let forecast = client
                .forecast(&queue, ms("horizon", horizon)?, ms("step", step)?)
                .await?;
            if remote.json {
                return print_json(&forecast);
            }
            println!("start_ms\ttasks\tfirings\ttotal");
            for s in &forecast.steps {
                println!("{}\t{}\t{}\t{}", s.start_ms, s.tasks, s.firings, s.total);
            }
            return Ok(());
        }
    };
    if remote.json {
        print_json(&schedule)
    } else {
        println!("{}", describe(&schedule));
        Ok(())
    }
}
