//! `belfry bench idle`: what waiting costs. Most schedules fire daily or weekly and most
//! reminders are hours away, so a server spends most of its life with many records and
//! nothing due. The run measures the server's CPU over an idle window with nothing stored
//! (the baseline, same run, same server), then creates S daily cron schedules and R reminders
//! (one-shot, due tomorrow; or daily, `--reminder-times`) through the API and measures the
//! same window again.
//!
//! A runner that read every record every second would show here as CPU growing with S + R.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{within, BenchError};
use crate::http::Target;
use crate::load::{run_ingest, Answers, IngestJob, IngestOutcome};
use crate::report::{part_of, thousands, Report, Table};
use crate::spawn::{create_queue, ServerUnderTest};
use crate::stats::format_us;
use crate::sys::{cpu_time, unix_ms, Machine};
use crate::workload::{due_times, Bodies};
use crate::{progress, OutputArgs, ServerArgs, CONNECTIONS_MAX};

/// Most schedules, and most reminders, one run creates.
pub const RECORDS_MAX: u64 = 10_000_000;

/// Longest idle window.
pub const IDLE_S_MAX: u64 = 3_600;

const DAY_MS: u64 = 24 * 3_600 * 1_000;

#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Daily cron schedules to create (`M H * * *`, spread over the day's minutes).
    #[arg(long, default_value_t = 100_000)]
    pub schedules: u64,
    /// Reminders to create (no subscribers), at `--reminder-times`.
    #[arg(long, default_value_t = 100_000)]
    pub reminders: u64,
    /// When the reminders fire: once, tomorrow; or daily, at times spread over the day's
    /// minutes (some fire every minute of the window) or its seconds (some every second).
    #[arg(long, value_enum, default_value_t = ReminderTimes::Tomorrow)]
    pub reminder_times: ReminderTimes,
    /// Seconds of each idle window (the server's CPU is read at its start and end).
    #[arg(long, default_value_t = 30)]
    pub idle_s: u64,
    /// Seconds to wait before each window, so that work left from start-up or from the
    /// creates (checkpoints) is done.
    #[arg(long, default_value_t = 10)]
    pub settle_s: u64,
    /// Connections for the creates.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Prefix of the queue, schedule and reminder names (default: `bench-idle-<ms>`).
    #[arg(long)]
    pub prefix: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// When `bench idle`'s reminders fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum ReminderTimes {
    /// Once, due tomorrow (spread over an hour): none fires during the run.
    Tomorrow,
    /// `M H * * *`: daily, spread over the day's minutes.
    Daily,
    /// `S M H * * *`: daily, spread over the day's seconds.
    DailySeconds,
}

impl ReminderTimes {
    /// The create request's fields that say when reminder `i` fires.
    fn fields(self, i: u64, tomorrow_ms: u64) -> serde_json::Value {
        // Offset from the schedules' pattern, so the two do not fire in the same minutes.
        let k = i + 30;
        match self {
            ReminderTimes::Tomorrow => json!({"run_at_ms": tomorrow_ms}),
            ReminderTimes::Daily => json!({
                "cron": format!("{} {} * * *", k % 60, (k / 60) % 24),
                "timezone": "UTC",
            }),
            ReminderTimes::DailySeconds => json!({
                "cron": format!("{} {} {} * * *", k % 60, (k / 60) % 60, (k / 3_600) % 24),
                "timezone": "UTC",
            }),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ReminderTimes::Tomorrow => "due tomorrow",
            ReminderTimes::Daily => "firing daily over the day's minutes",
            ReminderTimes::DailySeconds => "firing daily over the day's seconds",
        }
    }
}

impl IdleArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        within("--schedules", self.schedules, 0, RECORDS_MAX)?;
        within("--reminders", self.reminders, 0, RECORDS_MAX)?;
        if self.schedules + self.reminders == 0 {
            return Err(BenchError::invalid(
                "--schedules/--reminders",
                "at least one of them must be above 0",
            ));
        }
        within("--idle-s", self.idle_s, 1, IDLE_S_MAX)?;
        within("--settle-s", self.settle_s, 0, IDLE_S_MAX)?;
        within("--connections", self.connections, 1, CONNECTIONS_MAX)?;
        if self.server.baselines_only {
            return Err(BenchError::invalid(
                "--baselines-only",
                "the baseline of idle is the same server with nothing stored",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct IdleOutcome {
    pub idle_s: u64,
    /// Server CPU seconds per wall second with nothing stored, and with the records.
    pub empty_cores: Option<f64>,
    pub stored_cores: Option<f64>,
    pub schedules: Option<IngestOutcome>,
    pub reminders: Option<IngestOutcome>,
    /// Records removed at the end (a server at --url keeps them otherwise).
    pub deleted: Option<u64>,
}

impl IdleOutcome {
    /// Records the server held in the second window.
    fn stored(&self) -> u64 {
        [&self.schedules, &self.reminders]
            .into_iter()
            .flatten()
            .map(|o| o.accepted)
            .sum()
    }
}

pub async fn run(args: IdleArgs) -> anyhow::Result<Report> {
    args.validate()?;
    let machine = Machine::describe();
    let server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
    let result = run_on(&args, &server).await;
    server.stop();
    Ok(build_report(&args, machine, result?))
}

async fn run_on(args: &IdleArgs, server: &ServerUnderTest) -> anyhow::Result<IdleOutcome> {
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("bench-idle-{}", unix_ms()));
    let queue = format!("{prefix}-q");
    create_queue(&server.target, &queue, "{}").await?;
    let empty_cores = idle_window(args, server, "idle, nothing stored (s)").await;

    let schedules = if args.schedules > 0 {
        let bodies = Bodies::from_tasks(&vec![0; args.schedules as usize], 1, |i, _| {
            json!({
                "id": format!("{prefix}-s{i}"),
                "queue": queue,
                "cron": format!("{} {} * * *", i % 60, (i / 60) % 24),
                "timezone": "UTC",
            })
            .to_string()
        });
        Some(create(args, server, "/v1/schedules", "schedule create", bodies).await)
    } else {
        None
    };
    let reminders = if args.reminders > 0 {
        let due = due_times(args.reminders, unix_ms() + DAY_MS, 3_600 * 1_000);
        let bodies = Bodies::from_tasks(&due, 1, |i, due| {
            let mut body = json!({
                "id": format!("{prefix}-r{i}"),
                "queue": queue,
                "content": {"i": i},
            });
            if let (Some(body), serde_json::Value::Object(when)) =
                (body.as_object_mut(), args.reminder_times.fields(i, due))
            {
                body.extend(when);
            }
            body.to_string()
        });
        Some(create(args, server, "/v1/reminders", "reminder create", bodies).await)
    } else {
        None
    };
    let stored_cores = idle_window(args, server, "idle, records stored (s)").await;

    let schedule_paths = (0..args.schedules).map(|i| format!("/v1/schedules/{prefix}-s{i}"));
    let reminder_paths = (0..args.reminders).map(|i| format!("/v1/reminders/{prefix}-r{i}"));
    let deleted = server
        .clean_up(
            schedule_paths.chain(reminder_paths),
            args.connections,
            progress(
                &args.output,
                args.schedules + args.reminders,
                "delete schedules and reminders",
            ),
        )
        .await;
    Ok(IdleOutcome {
        idle_s: args.idle_s,
        empty_cores,
        stored_cores,
        schedules,
        reminders,
        deleted,
    })
}

async fn create(
    args: &IdleArgs,
    server: &ServerUnderTest,
    path: &str,
    label: &str,
    bodies: Bodies,
) -> IngestOutcome {
    let count = bodies.tasks;
    run_ingest(
        IngestJob {
            label: label.into(),
            target: Target::clone(&server.target),
            path: path.into(),
            body_paths: None,
            bodies: Arc::new(bodies),
            connections: args.connections,
            answers: Answers::Belfry,
            due_at_ms: None,
            server_pid: server.pid,
            keep_ids: None,
        },
        progress(&args.output, count, label),
    )
    .await
}

/// Waits `settle_s`, then returns the server's CPU seconds per wall second over `idle_s`
/// (`None` when its process cannot be read: a server at --url).
async fn idle_window(args: &IdleArgs, server: &ServerUnderTest, label: &str) -> Option<f64> {
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    let pid = server.pid?.to_string();
    let bar = progress(&args.output, args.idle_s, label);
    let start_cpu = cpu_time(&pid)?;
    let started = Instant::now();
    for second in 1..=args.idle_s {
        tokio::time::sleep_until((started + Duration::from_secs(second)).into()).await;
        bar.set_position(second);
    }
    let end_cpu = cpu_time(&pid)?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    Some(end_cpu.saturating_sub(start_cpu).as_secs_f64() / wall)
}

fn build_report(args: &IdleArgs, machine: Machine, o: IdleOutcome) -> Report {
    let tables = vec![windows_table(args, &o), creates_table(args, &o)];
    let notes = report_notes(&o);
    Report {
        scenario: "idle".into(),
        command: crate::command_line(),
        machine,
        tables,
        notes,
        picture: None,
        data: serde_json::to_value(&o).unwrap_or(serde_json::Value::Null),
    }
}

/// The server's CPU over the idle window, empty and holding the records.
fn windows_table(args: &IdleArgs, o: &IdleOutcome) -> Table {
    let cores = |c: Option<f64>| c.map_or("-".into(), |c| format!("{c:.4}"));
    let stored = o.stored();
    let mut windows = Table::new(
        format!(
            "server CPU over {} s of idle, after {} s to settle",
            o.idle_s, args.settle_s
        ),
        &[
            "server holds",
            "server cores",
            "extra over empty",
            "extra per 1,000 records",
        ],
    );
    windows.row(vec![
        "nothing (baseline, same run)".into(),
        cores(o.empty_cores),
        "-".into(),
        "-".into(),
    ]);
    let extra = o.empty_cores.zip(o.stored_cores).map(|(e, s)| s - e);
    windows.row(vec![
        format!(
            "{} daily schedules and {} reminders {}",
            thousands(o.schedules.as_ref().map_or(0, |s| s.accepted) as f64),
            thousands(o.reminders.as_ref().map_or(0, |r| r.accepted) as f64),
            args.reminder_times.describe(),
        ),
        cores(o.stored_cores),
        extra.map_or("-".into(), |x| format!("{x:+.4}")),
        extra.filter(|_| stored > 0).map_or("-".into(), |x| {
            format!("{:+.5} cores", x * 1_000.0 / stored as f64)
        }),
    ]);
    windows
}

/// Creating the schedules and reminders, request by request.
fn creates_table(args: &IdleArgs, o: &IdleOutcome) -> Table {
    let mut creates = Table::new(
        format!("creating them, {} connections", args.connections),
        &[
            "request",
            "accepted",
            "per second",
            "p50",
            "p99",
            "server cores",
        ],
    );
    let reminders_request = format!("POST /v1/reminders ({})", args.reminder_times.describe());
    for (name, r) in [
        ("POST /v1/schedules (daily cron)", &o.schedules),
        (reminders_request.as_str(), &o.reminders),
    ] {
        let Some(r) = r else { continue };
        creates.row(vec![
            name.into(),
            part_of(r.accepted, r.requests),
            thousands(r.tasks_per_s),
            format_us(r.latency.p50_us),
            format_us(r.latency.p99_us),
            r.cpu.server_cores.map_or("-".into(), |c| format!("{c:.2}")),
        ]);
    }
    creates
}

/// How server cores are measured, refused creates, and the clean-up.
fn report_notes(o: &IdleOutcome) -> Vec<String> {
    let mut notes = vec![
        "server cores = the server process's user + system CPU (/proc/PID/stat, 10 ms ticks) \
         over the window ÷ its wall time. An idle record should cost nothing a second: the \
         runners answer from their last look until something changes or is due, and read \
         every record again every 5 minutes."
            .to_string(),
    ];
    for (name, r) in [
        ("schedule create", &o.schedules),
        ("reminder create", &o.reminders),
    ] {
        if let Some(e) = r.as_ref().and_then(|r| r.first_error.as_ref()) {
            let refused = r.as_ref().map_or(0, |r| r.rejected);
            notes.push(format!("{name}: {refused} refused: {e}"));
        }
    }
    if let Some(n) = o.deleted {
        notes.push(format!("{n} schedules and reminders deleted at the end."));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: IdleArgs,
    }

    fn parse(extra: &[&str]) -> IdleArgs {
        let mut argv = vec!["idle"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    #[test]
    fn the_defaults_are_valid_and_nothing_to_create_is_refused() {
        assert!(parse(&[]).validate().is_ok());
        let error = parse(&["--schedules", "0", "--reminders", "0"])
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("at least one"), "{error}");
        assert!(parse(&["--idle-s", "0"]).validate().is_err());
    }

    #[test]
    fn daily_reminders_spread_over_the_day_in_fields_the_api_takes() {
        let at = |times: ReminderTimes, i| times.fields(i, 7);
        assert_eq!(at(ReminderTimes::Tomorrow, 3), json!({"run_at_ms": 7}));
        assert_eq!(at(ReminderTimes::Daily, 0)["cron"], "30 0 * * *");
        assert_eq!(at(ReminderTimes::Daily, 1_409)["cron"], "59 23 * * *");
        assert_eq!(at(ReminderTimes::DailySeconds, 0)["cron"], "30 0 0 * * *");
        assert_eq!(
            at(ReminderTimes::DailySeconds, 86_369)["cron"],
            "59 59 23 * * *"
        );
        assert_eq!(at(ReminderTimes::DailySeconds, 1)["timezone"], "UTC");
    }
}
