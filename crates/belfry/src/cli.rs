//! The command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::config::{self, FileConfig, LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "belfry",
    version,
    about = "Delayed tasks, delivered on time: never early."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Manage queues on a running server.
    Queue {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Manage tasks on a running server.
    Task {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Inspect and redrive dead letters on a running server.
    Dead {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// Manage cron and interval schedules on a running server.
    Schedule {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: crate::schedule_cmd::ScheduleCommand,
    },
    /// Load-generate against a server (or one it spawns) and compare with same-run baselines.
    /// See BENCHMARKS.md for the commands behind every published number.
    Bench {
        #[command(subcommand)]
        command: belfry_bench::BenchCommand,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (see config/belfry.example.toml).
    #[arg(long, env = "BELFRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "BELFRY_LISTEN")]
    pub listen: Option<String>,
    /// Directory of the embedded store [default: ./data].
    #[arg(long, env = "BELFRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// "engine" (durable, default) or "memory" (for experiments).
    #[arg(long)]
    pub store: Option<String>,
}

#[derive(Debug, Args)]
pub struct Remote {
    /// The server's URL.
    #[arg(
        long,
        env = "BELFRY_SERVER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub server: String,
    /// Print the server's JSON instead of a summary.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue, or change its settings.
    Create(QueueCreate),
    /// Show a queue's settings and counts.
    Get { queue: String },
    /// List queues.
    List,
    /// Stop delivering (tasks are still accepted).
    Pause { queue: String },
    /// Deliver again.
    Resume { queue: String },
    /// Delete a queue and every task in it.
    Delete { queue: String },
}

#[derive(Debug, Args)]
pub struct QueueCreate {
    pub queue: String,
    /// Tasks per second (0 = unlimited).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Token bucket size.
    #[arg(long)]
    pub burst: Option<u32>,
    /// Most tasks leased at once (0 = unlimited).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Delivery attempts before a task becomes a dead letter.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    #[arg(long)]
    pub backoff_initial_ms: Option<u64>,
    #[arg(long)]
    pub backoff_max_ms: Option<u64>,
    /// Deliver by POSTing to this URL instead of waiting for pull consumers.
    #[arg(long)]
    pub webhook: Option<String>,
    /// HMAC-SHA256 signing secret for the webhook.
    #[arg(long, requires = "webhook")]
    pub secret: Option<String>,
    #[arg(long, requires = "webhook")]
    pub timeout_ms: Option<u64>,
    /// Make it a pull queue (undoes --webhook).
    #[arg(long, conflicts_with = "webhook")]
    pub pull: bool,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Schedule a task.
    Add(TaskAdd),
    /// Show a task.
    Get { queue: String, id: String },
    /// Cancel a scheduled task.
    Cancel { queue: String, id: String },
}

#[derive(Debug, Args)]
pub struct TaskAdd {
    pub queue: String,
    /// JSON payload (default null).
    #[arg(long)]
    pub payload: Option<String>,
    /// Due after this long: "10s", "5m", "250ms".
    #[arg(long, conflicts_with_all = ["at", "at_ms"])]
    pub delay: Option<String>,
    /// Due at this RFC 3339 time.
    #[arg(long, conflicts_with = "at_ms")]
    pub at: Option<String>,
    /// Due at this unix time in milliseconds.
    #[arg(long)]
    pub at_ms: Option<u64>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Deliver before normal-priority tasks.
    #[arg(long)]
    pub high: bool,
    /// A header NAME=VALUE (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead letters.
    List {
        queue: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Schedule a dead letter again, due now.
    Redrive { queue: String, id: String },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let mut file = match &args.config {
                Some(path) => config::read_file(path)?,
                None => FileConfig::default(),
            };
            file.apply_env(|var| std::env::var(var).ok())?;
            let settings = file
                .resolve(args.listen, args.data_dir, args.store)
                .context("configuration")?;
            init_tracing(&settings.log_level, settings.log_format);
            crate::serve::serve(settings).await
        }
        Command::Queue { remote, command } => crate::commands::queue(&remote, command).await,
        Command::Task { remote, command } => crate::commands::task(&remote, command).await,
        Command::Dead { remote, command } => crate::commands::dead(&remote, command).await,
        Command::Schedule { remote, command } => crate::schedule_cmd::run(&remote, command).await,
        // `main` runs the bench before any runtime exists: it builds its own.
        Command::Bench { .. } => anyhow::bail!("belfry bench must be dispatched by main"),
    }
}

fn init_tracing(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for people at a terminal, not in files and pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
