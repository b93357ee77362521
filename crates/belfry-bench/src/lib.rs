//! `belfry bench`: a load generator for a whole belfry server, measured side by side with
//! its baselines in the same run — raw fsync'd append (the disk), a trivial HTTP handler
//! (the HTTP stack) and a Redis sorted-set delay queue (the seeds' design).
//!
//! Scenarios: `ingest` (submit throughput and latency), `fire` (delivery throughput and
//! firing lateness, never early, nothing lost), `pending` (disk and memory per pending task,
//! restart time after `kill -9`), `queues` (many webhook queues due together against one
//! queue of the same tasks), `cron` (per-second schedules: creation rate, firing lateness and
//! their cost to an unrelated queue), `stream` (delivery through a Redis Streams, NATS
//! JetStream or Kafka sink against the broker's raw publish rate), `hostile` (latency with
//! thousands of partial connections held against none), `redis` (belfry nodes on a Redis
//! Cluster against the Redis store driven in-process), `idle` (the server's CPU with many
//! schedules and reminders waiting, against the same server empty). Each prints a table, optionally JSON, and can rewrite its
//! own part of BENCHMARKS.md. `stages` runs nothing: it reads a CPU profile of a run
//! (`scripts/profile.sh`) and says where the time went, by stage.
//!
//! The binary wires it with `Bench { #[command(subcommand)] command: BenchCommand }` and
//! `belfry_bench::run(command)`.

use std::path::PathBuf;

pub mod cron;
pub mod error;
pub mod fire;
pub mod hostile;
pub mod http;
pub mod idle;
pub mod ingest;
pub mod load;
pub mod markdown;
pub mod pending;
pub mod plot;
pub mod queues;
pub mod redis_cluster;
pub mod redis_queue;
pub mod reminders;
pub mod report;
pub mod reservoir;
pub mod servers;
pub mod spawn;
pub mod stages;
pub mod stats;
pub mod stream;
pub mod sys;
pub mod workload;

pub use error::BenchError;

/// Tasks in one batch request: the HTTP API v1 limit (`belfry_core::limits::BATCH_TASKS_MAX`).
/// Repeated here because the bench speaks only the HTTP contract, not the server's crates.
pub const BATCH_TASKS_MAX: usize = 1_000;

/// Tasks one lease call may ask for: the HTTP API v1 limit (`LEASE_TASKS_MAX` in core).
pub const LEASE_TASKS_MAX: usize = 1_000;

/// Longest long-poll of one lease call: the HTTP API v1 limit (`LEASE_WAIT_MS_MAX` in core).
pub const LEASE_WAIT_MS_MAX: u64 = 30_000;

/// Concurrent connections a run may open: enough to saturate any server on loopback,
/// few enough to stay far below the default file descriptor limit.
pub const CONNECTIONS_MAX: usize = 512;

/// Worker threads of the load generator's runtime at most.
pub const CLIENT_THREADS_MAX: usize = 64;

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Submit N tasks (one per request, or --batch K, or --via import through the streamed
    /// NDJSON import, or --via both) over C connections; report accepted tasks/s and request
    /// latency against the fsync, HTTP and Redis baselines.
    Ingest(Box<ingest::IngestArgs>),
    /// Schedule N tasks due over a short window and consume them (pull leasing, or
    /// --webhook); report delivered/s and firing lateness, early, lost and duplicates.
    Fire(Box<fire::FireArgs>),
    /// Fill N far-future tasks; report disk bytes and RSS per task, then kill -9 and restart
    /// the server and time until /readyz answers.
    Pending(Box<pending::PendingArgs>),
    /// N webhook queues of M tasks all due together against 1 queue of N×M tasks (same
    /// run, same receiver); report delivery time, lateness, server CPU and RSS, duplicates,
    /// lost tasks and refused claims.
    Queues(Box<queues::QueuesArgs>),
    /// S schedules firing every second into a pull queue: creation rate beside single-task
    /// submits, firing lateness, server CPU, and an unrelated queue's lease p99 with and
    /// without the cron load.
    Cron(Box<cron::CronArgs>),
    /// N tasks through a stream sink (Redis Streams, NATS JetStream, Kafka) to a broker the
    /// run starts, read back by a real consumer; delivered/s against the broker's raw publish
    /// rate on the same broker, firing lateness, early, lost and duplicates.
    Stream(Box<stream::StreamArgs>),
    /// Reminders (issue #13): bulk subscribe against the trivial handler, RSS and disk per
    /// subscription, restart after kill -9, fan-out to a pull consumer against draining the
    /// same chunks stored in advance, a paced fan-out's rate against its limit, and feed
    /// reads against the trivial handler.
    Reminders(Box<reminders::RemindersArgs>),
    /// N partial connections (connect only, request line, unfinished headers, half a body)
    /// held open against a server with its default limits: `/healthz` and single-task submit
    /// latency with and without them, on kept-alive and fresh connections.
    Hostile(Box<hostile::HostileArgs>),
    /// Redis Cluster (issue #14): batched ingest and burst drain through 1, 2 and 3 belfry
    /// nodes on a 3-master cluster against belfry's Redis store driven in-process, firing
    /// lateness across 3 nodes, takeover after kill -9 of one node, and Redis memory per
    /// pending task.
    Redis(Box<redis_cluster::RedisArgs>),
    /// What waiting costs: the server's CPU over an idle window with nothing stored, then
    /// with S daily cron schedules and R reminders due tomorrow created through the API.
    Idle(Box<idle::IdleArgs>),
    /// Where a profiled process's CPU went: folded stacks (from `perf record -e cpu-clock`,
    /// folded by `inferno-collapse-perf`; `scripts/profile.sh` makes them) by stage, as
    /// shares and, with --units, microseconds per request or task; --against prints a
    /// baseline's profile beside it.
    Stages(Box<stages::StagesArgs>),
}

/// Which server to drive.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Base URL of a running belfry server.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    pub url: String,
    /// Start `belfry serve` on a free loopback port and a temporary data dir instead.
    #[arg(long)]
    pub spawn: bool,
    /// The belfry binary for --spawn (default: this binary if it is belfry, else `belfry`
    /// next to it, else on PATH).
    #[arg(long)]
    pub belfry_bin: Option<PathBuf>,
    /// Where --spawn puts its temporary data dir (default: the system temp dir; made if it does
    /// not exist). The fsync baseline writes there too, so both measure the same disk.
    #[arg(long)]
    pub spawn_dir: Option<PathBuf>,
    /// Extra KEY=VALUE environment for the --spawn'ed server (repeatable), e.g.
    /// BELFRY_FSYNC=... to try a configuration.
    #[arg(long)]
    pub server_env: Vec<String>,
    /// PID of the server at --url, to report its CPU and RSS (known for --spawn).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Bearer token for a server at --url that requires one.
    #[arg(long, env = "BELFRY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Data dir of the server at --url, to report its disk use (known for --spawn).
    #[arg(long)]
    pub server_data_dir: Option<PathBuf>,
    /// Measure only the baselines (no belfry server needed).
    #[arg(long)]
    pub baselines_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// Raw fsync'd sequential append of the same bytes in the same batch sizes.
    Fsync,
    /// A trivial HTTP handler answering 200 to the same requests.
    Http,
    /// A Redis sorted-set delay queue (ZADD + HSET, Lua claim) on a local redis-server.
    Redis,
    /// No baseline.
    None,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BaselineArgs {
    /// Baselines to measure in the same run (comma-separated).
    #[arg(long = "baseline", value_enum, value_delimiter = ',', default_values = ["fsync", "http", "redis"])]
    pub baselines: Vec<Baseline>,
    /// Use this running Redis for the Redis baseline instead of starting one.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Script that starts/stops a throwaway redis-server (installing it if missing).
    #[arg(long, default_value = "scripts/redis.sh")]
    pub redis_script: PathBuf,
    /// Port for the throwaway redis-server.
    #[arg(long, default_value_t = 6390)]
    pub redis_port: u16,
    /// Worker threads of the trivial HTTP handler's own runtime.
    #[arg(long, default_value_t = 2)]
    pub trivial_threads: usize,
}

impl BaselineArgs {
    pub fn wants(&self, baseline: Baseline) -> bool {
        !self.baselines.contains(&Baseline::None) && self.baselines.contains(&baseline)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Print the report as JSON on stdout (tables and progress go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Rewrite this scenario's part of the server section of this Markdown file
    /// (between `<!-- server:begin -->` and `<!-- server:end -->`), e.g. BENCHMARKS.md.
    #[arg(long)]
    pub write_markdown: Option<PathBuf>,
    /// Name of this run's sub-section in the Markdown file (default: the scenario, e.g.
    /// `fire`, `fire-burst`, `ingest-batch`), to keep several runs of one scenario.
    #[arg(long)]
    pub section: Option<String>,
    /// Worker threads of the load generator.
    #[arg(long, default_value_t = 2)]
    pub client_threads: usize,
    /// No live progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Runs one scenario on its own tokio runtime and prints its report.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    let command = match command {
        // Reads a file and prints a table: no runtime, no server.
        BenchCommand::Stages(args) => return stages::run(*args),
        scenario => scenario,
    };
    let output = match &command {
        BenchCommand::Stages(_) => return Ok(()),
        BenchCommand::Ingest(a) => a.output.clone(),
        BenchCommand::Fire(a) => a.output.clone(),
        BenchCommand::Pending(a) => a.output.clone(),
        BenchCommand::Queues(a) => a.output.clone(),
        BenchCommand::Cron(a) => a.output.clone(),
        BenchCommand::Stream(a) => a.output.clone(),
        BenchCommand::Reminders(a) => a.output.clone(),
        BenchCommand::Hostile(a) => a.output.clone(),
        BenchCommand::Redis(a) => a.output.clone(),
        BenchCommand::Idle(a) => a.output.clone(),
    };
    error::within(
        "--client-threads",
        output.client_threads,
        1,
        CLIENT_THREADS_MAX,
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(output.client_threads)
        .thread_name("bench")
        .enable_all()
        .build()?;
    let report = runtime.block_on(async move {
        match command {
            BenchCommand::Ingest(args) => ingest::run(*args).await,
            BenchCommand::Fire(args) => fire::run(*args).await,
            BenchCommand::Pending(args) => pending::run(*args).await,
            BenchCommand::Queues(args) => queues::run(*args).await,
            BenchCommand::Cron(args) => cron::run(*args).await,
            BenchCommand::Stream(args) => stream::run(*args).await,
            BenchCommand::Reminders(args) => reminders::run(*args).await,
            BenchCommand::Hostile(args) => hostile::run(*args).await,
            BenchCommand::Redis(args) => redis_cluster::run(*args).await,
            BenchCommand::Idle(args) => idle::run(*args).await,
            BenchCommand::Stages(_) => Err(anyhow::anyhow!("stages runs without a runtime")),
        }
    })?;
    emit(&report, &output)
}

/// Prints the report and writes the Markdown section when asked.
pub fn emit(report: &report::Report, output: &OutputArgs) -> anyhow::Result<()> {
    if output.json {
        eprint!("{}", report.render_text());
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render_text());
    }
    if let Some(path) = &output.write_markdown {
        let doc = std::fs::read_to_string(path).map_err(|e| BenchError::io("read", path, e))?;
        let link = report.picture.as_deref().map(|p| relative_link(path, p));
        let section = output.section.as_deref().unwrap_or(&report.scenario);
        if section.is_empty()
            || !section
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(BenchError::invalid("--section", "use letters, digits and '-'").into());
        }
        let body = report.render_markdown(section, link.as_deref());
        let new = markdown::upsert_subsection(&doc, markdown::SERVER_SECTION, section, &body)?;
        std::fs::write(path, new).map_err(|e| BenchError::io("write", path, e))?;
        eprintln!("updated server:{section} in {}", path.display());
    }
    Ok(())
}

/// `picture` as a link from the directory of `markdown_file` when it lies below it.
fn relative_link(markdown_file: &std::path::Path, picture: &str) -> String {
    let base = markdown_file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .and_then(|p| std::fs::canonicalize(p).ok());
    let pic = std::fs::canonicalize(picture).ok();
    match (base, pic) {
        (Some(base), Some(pic)) => pic
            .strip_prefix(&base)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| picture.to_string()),
        (None, Some(pic)) => std::env::current_dir()
            .ok()
            .and_then(|cwd| pic.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
            .unwrap_or_else(|| picture.to_string()),
        _ => picture.to_string(),
    }
}

/// The command line that produced a report, as a user would type it.
pub fn command_line() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(p)
        })
        .unwrap_or_else(|| "belfry".into());
    let program = if program == "belfry-bench" {
        "belfry bench".to_string()
    } else {
        program
    };
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A progress bar on stderr for `len` items (hidden when asked, or when stderr is not a
/// terminal).
pub fn progress(output: &OutputArgs, len: u64, label: &str) -> indicatif::ProgressBar {
    if output.no_progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:24}] {human_pos}/{human_len} {per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: BenchCommand,
    }

    fn parse(args: &[&str]) -> Result<BenchCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.command)
    }

    fn fire(args: &[&str]) -> fire::FireArgs {
        let mut all = vec!["fire"];
        all.extend_from_slice(args);
        match parse(&all) {
            Ok(BenchCommand::Fire(a)) => *a,
            _ => panic!("fire arguments did not parse"),
        }
    }

    #[test]
    fn defaults_parse_and_validate() {
        assert!(fire(&[]).validate().is_ok());
        let Ok(BenchCommand::Ingest(a)) = parse(&["ingest"]) else {
            panic!("ingest did not parse")
        };
        assert_eq!((a.tasks, a.batch), (200_000, 1));
        assert!(a.baselines.wants(Baseline::Fsync) && a.baselines.wants(Baseline::Redis));
        assert!(parse(&["pending", "--spawn", "--belfry-bin", "/x/belfry"]).is_ok());
    }

    #[test]
    fn bad_arguments_are_refused_with_the_flag_named() {
        for (args, flag) in [
            (&["--lease-max", "0"][..], "--lease-max"),
            (&["--lease-max", "1001"][..], "--lease-max"),
            (&["--wait-ms", "30001"][..], "--wait-ms"),
            (&["--consumers", "0"][..], "--consumers"),
            (&["--batch", "1001"][..], "--batch"),
            (&["--tasks", "0"][..], "--tasks"),
            (&["--payload-bytes", "4"][..], "--payload-bytes"),
        ] {
            let err = fire(args).validate().unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        assert!(parse(&["fire", "--tasks", "-5"]).is_err());
        assert!(parse(&["ingest", "--baseline", "postgres"]).is_err());
    }

    #[test]
    fn hostile_source_addresses_are_checked_with_the_flag_named() {
        let hostile = |args: &[&str]| {
            let mut all = vec!["hostile"];
            all.extend_from_slice(args);
            match parse(&all) {
                Ok(BenchCommand::Hostile(a)) => *a,
                _ => panic!("hostile arguments did not parse"),
            }
        };
        let defaults = hostile(&[]);
        assert!(defaults.validate().is_ok());
        assert_eq!(defaults.hostile_sources, 4);
        for (args, says) in [
            (&["--hostile-sources", "0"][..], "--hostile-sources"),
            (&["--hostile-sources", "251"][..], "--hostile-sources"),
            (
                &[
                    "--hostile-source",
                    "255.255.255.254",
                    "--hostile-sources",
                    "3",
                ][..],
                "past the end of its address space",
            ),
        ] {
            let err = hostile(args).validate().unwrap_err().to_string();
            assert!(err.contains(says), "{args:?}: {err}");
        }
        assert!(parse(&["hostile", "--hostile-sources", "-1"]).is_err());
    }

    #[test]
    fn baseline_none_turns_all_off() {
        let Ok(BenchCommand::Ingest(a)) = parse(&["ingest", "--baseline", "none"]) else {
            panic!("did not parse")
        };
        assert!(!a.baselines.wants(Baseline::Http));
        let Ok(BenchCommand::Ingest(a)) = parse(&["ingest", "--baseline", "http,fsync"]) else {
            panic!("did not parse")
        };
        assert!(a.baselines.wants(Baseline::Http) && !a.baselines.wants(Baseline::Redis));
    }

    #[test]
    fn client_threads_are_bounded() {
        let Ok(cmd) = parse(&[
            "ingest",
            "--client-threads",
            "0",
            "--baselines-only",
            "--baseline",
            "none",
        ]) else {
            panic!("did not parse")
        };
        assert!(run(cmd)
            .unwrap_err()
            .to_string()
            .contains("--client-threads"));
    }
}

#[cfg(test)]
mod emit_tests {
    use super::*;

    fn report() -> report::Report {
        let mut table = report::Table::new("t", &["system", "tasks/s"]);
        table.row(vec!["belfry".into(), "1".into()]);
        report::Report {
            scenario: "ingest-batch".into(),
            command: "belfry bench ingest --batch 1000".into(),
            machine: sys::Machine::describe(),
            tables: vec![table],
            notes: vec!["a note".into()],
            picture: None,
            data: serde_json::Value::Null,
        }
    }

    fn output(path: &std::path::Path, section: Option<&str>) -> OutputArgs {
        OutputArgs {
            json: false,
            write_markdown: Some(path.to_path_buf()),
            section: section.map(str::to_string),
            client_threads: 1,
            no_progress: true,
        }
    }

    #[test]
    fn emit_rewrites_only_its_subsection_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.md");
        let original = "# B\n<!-- engine:begin -->\nE\n<!-- engine:end -->\n<!-- server:begin -->\n(not measured yet)\n<!-- server:end -->\n";
        std::fs::write(&path, original).unwrap();
        emit(&report(), &output(&path, None)).unwrap();
        let once = std::fs::read_to_string(&path).unwrap();
        assert!(once.contains("<!-- server:ingest-batch:begin -->\n### `ingest-batch`"));
        assert!(once.contains("| belfry | 1 |") && once.contains("- a note"));
        assert!(once.starts_with("# B\n<!-- engine:begin -->\nE\n<!-- engine:end -->\n"));
        emit(&report(), &output(&path, None)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), once);
        emit(&report(), &output(&path, Some("ingest-2"))).unwrap();
        let twice = std::fs::read_to_string(&path).unwrap();
        assert!(
            twice.contains("server:ingest-batch:begin") && twice.contains("server:ingest-2:begin")
        );
    }

    #[test]
    fn emit_refuses_odd_section_names_and_files_without_markers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("B.md");
        std::fs::write(&path, "<!-- server:begin -->\n<!-- server:end -->\n").unwrap();
        assert!(emit(&report(), &output(&path, Some("a b"))).is_err());
        assert!(emit(&report(), &output(&path, Some(""))).is_err());
        std::fs::write(&path, "no markers\n").unwrap();
        assert!(emit(&report(), &output(&path, None)).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "no markers\n");
    }
}
