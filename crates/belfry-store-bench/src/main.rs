//! `belfry-store-bench`: the storage-engine benchmark.
//!
//! One invocation measures, on the same workload and in the same run, (a) raw sequential
//! append + fsync of the same record bytes (the disk's limit), (b) the belfry timeline engine
//! through the `Store` trait and (c) fjall, a general-purpose LSM, as a baseline. Each engine
//! runs in its own child process so that peak RSS and I/O counters are its own.
//!
//! ```text
//! belfry-store-bench                         # compare raw, belfry and fjall (1M tasks)
//! belfry-store-bench --tasks 200000 --engines raw,belfry
//! belfry-store-bench pending --pending 10000000   # memory, disk and reopen with far-future tasks
//! belfry-store-bench --write-markdown BENCHMARKS.md
//! ```

mod compare;
mod crash_writer;
mod engines;
mod pending;
mod report;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use belfry_store_bench::workload::{Workload, DAY_MS, DUE_BASE_MS, PAYLOAD_BYTES_MIN};

/// Largest batch a run may commit at once: the Store API's batch limit.
const BATCH_MAX: usize = belfry_core::limits::BATCH_TASKS_MAX;

#[derive(Debug, Parser)]
#[command(
    name = "belfry-store-bench",
    about = "Storage benchmark: raw fsync'd append vs the belfry engine vs fjall",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    compare: CompareArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fill far-future tasks and report memory, disk per task and reopen time.
    Pending(PendingArgs),
    /// Runs one engine's part of a comparison and prints its result as JSON (internal).
    #[command(hide = true)]
    Child(ChildArgs),
    /// Writes (and optionally claims) tasks forever, logging acknowledged ones (crash tests).
    #[command(hide = true)]
    CrashWriter(crash_writer::CrashWriterArgs),
}

/// Workload options shared by every mode.
#[derive(Debug, Clone, Args)]
struct WorkloadArgs {
    /// Payload size in bytes (at least 12: the payload carries its tag and a checksum).
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Tasks per durable commit (one `put` call).
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
    /// Due times are spread uniformly over this many days.
    #[arg(long, default_value_t = 30)]
    spread_days: u64,
    /// Concurrent writer threads for the belfry and fjall ingest (raw append is one stream).
    #[arg(long, default_value_t = 1)]
    writers: usize,
}

#[derive(Debug, Clone, Args)]
struct CompareArgs {
    /// Tasks to ingest and then drain.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u64,
    /// Engines to run, in order: raw, belfry, fjall, memory (the in-memory reference store);
    /// `NAME@N` runs NAME with N concurrent writer threads instead of `--writers`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,belfry,belfry@4,fjall"
    )]
    engines: Vec<String>,
    /// Parent directory for the engines' data (a fresh subdirectory per engine, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Rewrite the engine section of this markdown file with the results.
    #[arg(long)]
    write_markdown: Option<PathBuf>,
    /// Run every engine this many times (round-robin) and report each one's median run by
    /// ingest rate, with the range seen: shared machines are noisy.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Debug, Clone, Args)]
struct PendingArgs {
    /// Far-future tasks to fill. The run also fills a tenth of this first, so the report shows
    /// how memory and reopen time change with the pending count.
    #[arg(long, default_value_t = 10_000_000)]
    pending: u64,
    /// Engines to run: belfry, fjall.
    #[arg(long, value_delimiter = ',', default_value = "belfry")]
    engines: Vec<String>,
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    write_markdown: Option<PathBuf>,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Debug, Clone, Args)]
struct ChildArgs {
    #[arg(long)]
    engine: String,
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    phase: compare::Phase,
    #[arg(long)]
    tasks: u64,
    /// Earliest due time (Unix ms).
    #[arg(long)]
    due_from_ms: u64,
    #[command(flatten)]
    workload: WorkloadArgs,
}

impl WorkloadArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.payload_bytes < PAYLOAD_BYTES_MIN {
            bail!("--payload-bytes must be at least {PAYLOAD_BYTES_MIN}");
        }
        if self.batch == 0 || self.batch > BATCH_MAX {
            bail!("--batch must be 1..={BATCH_MAX}");
        }
        if self.writers == 0 {
            bail!("--writers must be at least 1");
        }
        if self.spread_days == 0 {
            bail!("--spread-days must be at least 1");
        }
        Ok(())
    }

    fn workload(&self, tasks: u64, due_from_ms: u64) -> Workload {
        Workload {
            tasks,
            payload_bytes: self.payload_bytes,
            batch: self.batch,
            due_from_ms,
            due_spread_ms: self.spread_days * DAY_MS,
        }
    }

    /// The flags a child process needs to rebuild the same workload.
    fn to_args(&self) -> Vec<String> {
        vec![
            "--payload-bytes".into(),
            self.payload_bytes.to_string(),
            "--batch".into(),
            self.batch.to_string(),
            "--spread-days".into(),
            self.spread_days.to_string(),
            "--writers".into(),
            self.writers.to_string(),
        ]
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => {
            let args = cli.compare;
            args.workload.validate()?;
            for engine in &args.engines {
                engines::EngineSpec::parse(engine)?;
            }
            let workload = args.workload.workload(args.tasks, DUE_BASE_MS);
            let results = compare::run(&args, &workload)?;
            let text = report::compare_table(&workload, &results);
            println!("{text}");
            if let Some(path) = &args.write_markdown {
                let markdown = report::compare_markdown(&args, &workload, &results);
                report::rewrite_engine_section(path, report::Block::Compare, &markdown)
                    .with_context(|| format!("rewrite {}", path.display()))?;
                println!("wrote the engine section of {}", path.display());
            }
            Ok(())
        }
        Some(Command::Pending(args)) => {
            args.workload.validate()?;
            pending::run(&args)
        }
        Some(Command::Child(args)) => {
            args.workload.validate()?;
            let workload = args.workload.workload(args.tasks, args.due_from_ms);
            let kind = engines::EngineKind::parse(&args.engine)?;
            let result = compare::child(
                kind,
                &args.dir,
                args.phase,
                &workload,
                args.workload.writers,
            )?;
            println!(
                "{}{}",
                compare::RESULT_PREFIX,
                serde_json::to_string(&result)?
            );
            // Leave without running destructors: a pending-fill child stands for a process
            // that is killed, and nothing else is left to clean up.
            std::process::exit(0);
        }
        Some(Command::CrashWriter(args)) => crash_writer::run(&args),
    }
}
