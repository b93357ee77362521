//! The command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::commands::Remote;
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
        command: crate::commands::queue::QueueCommand,
    },
    /// Add, inspect, cancel and reschedule tasks; lease, ack, nack and extend by hand.
    Task {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: crate::commands::task::TaskCommand,
    },
    /// Inspect and redrive dead letters on a running server.
    Dead {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: crate::commands::dead::DeadCommand,
    },
    /// Manage cron and interval schedules on a running server.
    Schedule {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: crate::schedule_cmd::ScheduleCommand,
    },
    /// Reminders: content due at a time for a set of subscribers, fanned out in chunks.
    Reminder {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: crate::commands::reminder::ReminderCommand,
    },
    /// A user's upcoming reminders: urgent first, then in due order (or all their
    /// subscriptions, or end them all).
    Feed {
        #[command(flatten)]
        args: crate::commands::reminder::FeedArgs,
        // Last: its options have a heading of their own, which the ones after it would take.
        #[command(flatten)]
        remote: Remote,
    },
    /// Make, list and revoke bearer tokens.
    Token {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Load-generate against a server (or one it spawns) and compare with same-run baselines.
    /// See BENCHMARKS.md for the commands behind every published number.
    Bench {
        #[command(subcommand)]
        command: belfry_bench::BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token on the server (shown once); with --offline, print a new token and the
    /// `[[auth.tokens]]` lines (with its hash) for the server's config.
    Create(crate::auth_config::TokenCreateArgs),
    /// List the server's tokens: names, scopes and where they come from (never a token).
    List,
    /// Revoke a token made through the API: calls with it get 401 at once.
    Revoke {
        /// The token's name (as `token list` shows it).
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (see config/belfry.example.toml).
    #[arg(long, env = "BELFRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, an IP address and port ("0.0.0.0:7070", "[::1]:7070"; not a
    /// host name) [default: 127.0.0.1:7070].
    #[arg(long, env = "BELFRY_LISTEN")]
    pub listen: Option<String>,
    /// Directory of the embedded store [default: ./data].
    #[arg(long, env = "BELFRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// "engine" (durable, default), "memory" (for experiments), "redis://host:port" (one
    /// Redis) or "redis-cluster://host:port,host:port,..." (a cluster; "user:password@" before
    /// the first host when it needs them). Env BELFRY_STORE.
    #[arg(long)]
    pub store: Option<String>,
    /// This node's name among the nodes sharing a store [default: host-pid-random].
    /// Env BELFRY_NODE_ID.
    #[arg(long)]
    pub node_id: Option<String>,
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let mut file = match &args.config {
                Some(path) => config::read_file(path)?,
                None => FileConfig::default(),
            };
            file.apply_env(|var| std::env::var(var).ok())?;
            // Flags win over the environment and the file.
            if let Some(id) = args.node_id {
                file.node_id = Some(id);
            }
            let settings = file
                .resolve(args.listen, args.data_dir, args.store)
                .context("configuration")?;
            // RUST_LOG wins over log.level when set: the same check, or a typo logs nothing.
            if let Ok(rust_log) = std::env::var("RUST_LOG") {
                crate::resolve::check_log_filter("RUST_LOG", &rust_log).context("configuration")?;
            }
            init_tracing(&settings.log_level, settings.log_format);
            let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
            for warning in crate::env_check::unknown_vars(names)
                .iter()
                .chain(&settings.warnings)
            {
                tracing::warn!("{warning}");
            }
            let json = matches!(settings.log_format, LogFormat::Json);
            let served = crate::serve::serve(settings).await;
            // A log collector reading JSON lines sees why the server stopped too (`main` also
            // prints it on stderr, as for every command).
            if let (true, Err(error)) = (json, &served) {
                tracing::error!(error = %crate::commands::causes(error), "belfry stopped");
            }
            served
        }
        Command::Queue { remote, command } => crate::commands::queue::queue(&remote, command).await,
        Command::Task { remote, command } => crate::commands::task::task(&remote, command).await,
        Command::Dead { remote, command } => crate::commands::dead::dead(&remote, command).await,
        Command::Schedule { remote, command } => crate::schedule_cmd::run(&remote, command).await,
        Command::Reminder { remote, command } => {
            crate::commands::reminder::reminder(&remote, command).await
        }
        Command::Feed { remote, args } => crate::commands::reminder::feed(&remote, args).await,
        Command::Token { remote, command } => crate::auth_config::token(&remote, command).await,
        // `main` runs the bench before any runtime exists: it builds its own.
        Command::Bench { .. } => anyhow::bail!("belfry bench must be dispatched by main"),
    }
}

fn init_tracing(level: &str, format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for people at a terminal, not in files and pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let secrets = tracing_subscriber::filter::filter_fn(|meta| !may_hold_secrets(meta));
    let text = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let layer = match format {
        LogFormat::Text => text.with_filter(secrets).boxed(),
        LogFormat::Json => text.json().with_filter(secrets).boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .init();
}

/// Events no filter may show, since they can carry credentials: the NATS client traces the
/// CONNECT message it sends, user, password and token included. Connections' passwords and
/// tokens are never logged (config/belfry.example.toml), whatever the level.
fn may_hold_secrets(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() == tracing::Level::TRACE && meta.target().starts_with("async_nats")
}
