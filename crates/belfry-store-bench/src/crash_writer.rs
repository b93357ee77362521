//! The crash tests' victim (`crash-writer`, hidden): opens the engine, writes batches from
//! several threads (and, with `--claim`, claims and acks from another), and logs every
//! acknowledged operation, until it is killed. See `belfry_store_bench::crash` for the log.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context};
use belfry_core::{NewTask, PayloadKind, QueueName};
use belfry_store::engine::{Engine, EngineOptions};
use belfry_store::{LeaseOutcome, MetaChange, Store};
use bytes::Bytes;
use parking_lot::Mutex;

use belfry_store_bench::crash::{self, AckLine};
use belfry_store_bench::workload::{payload, verify_payload};

/// Tasks a writer thread puts before it stops by itself: a bound so that a writer whose test
/// died without killing it does not fill the disk.
const TASKS_PER_WRITER_MAX: u64 = 1 << 24;

/// Tasks one claim asks for in the writer's claimer.
const CLAIM_MAX: usize = 100;

#[derive(Debug, Clone, clap::Args)]
pub struct CrashWriterArgs {
    /// The engine's data directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// Append acknowledgements to this file, fsync'd per batch; by default they go to stdout,
    /// which the parent reads line by line.
    #[arg(long)]
    pub ack_log: Option<PathBuf>,
    /// The round number, the top bits of every tag (so tags are unique across rounds).
    #[arg(long, default_value_t = 1)]
    pub round: u64,
    /// Writer threads.
    #[arg(long, default_value_t = 3)]
    pub writers: u64,
    /// Tasks per `put`.
    #[arg(long, default_value_t = 50)]
    pub batch: u64,
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Also run a thread that claims due tasks and acks them.
    #[arg(long)]
    pub claim: bool,
    /// Checkpoint after this many WAL bytes instead of the engine's default, so that kills
    /// also land during checkpoints (bucket fsyncs, checkpoint rewrite, WAL deletion).
    #[arg(long)]
    pub checkpoint_wal_bytes: Option<u64>,
    /// Also run a thread that moves `crash::META_KEYS` cursors together with `write_meta`,
    /// as the schedule service does after a tick.
    #[arg(long)]
    pub meta: bool,
}

/// Where acknowledgements go. Each call writes whole lines and returns only once they are
/// handed to the OS (stdout) or fsync'd (file), so a line in the log always means "done".
enum AckLog {
    Stdout,
    File(Mutex<File>),
}

impl AckLog {
    fn write(&self, lines: &[AckLine]) -> anyhow::Result<()> {
        let text: String = lines.iter().map(AckLine::render).collect();
        match self {
            AckLog::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            AckLog::File(file) => {
                let mut file = file.lock();
                file.write_all(text.as_bytes())?;
                file.sync_data()?;
            }
        }
        Ok(())
    }
}

pub fn run(args: &CrashWriterArgs) -> anyhow::Result<()> {
    let log = match &args.ack_log {
        None => AckLog::Stdout,
        Some(path) => AckLog::File(Mutex::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {}", path.display()))?,
        )),
    };
    let mut options = EngineOptions::default();
    if let Some(bytes) = args.checkpoint_wal_bytes {
        options.checkpoint_wal_bytes = bytes;
    }
    let engine = Engine::open(&args.dir, options)
        .with_context(|| format!("open the engine in {}", args.dir.display()))?;
    let queue = QueueName::new(crash::QUEUE)?;
    engine.put_queue(&queue, Bytes::new())?;
    log.write(&[AckLine::Ready])?;

    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for writer in 0..args.writers {
            let (engine, queue, log, stop) = (&engine, &queue, &log, &stop);
            handles.push(scope.spawn(move || {
                let outcome = write_loop(engine, queue, log, args, writer);
                stop.store(true, Ordering::Relaxed);
                outcome
            }));
        }
        if args.claim {
            let (engine, queue, log, stop) = (&engine, &queue, &log, &stop);
            handles.push(scope.spawn(move || claim_loop(engine, queue, log, stop)));
        }
        if args.meta {
            let (engine, log, stop) = (&engine, &log, &stop);
            handles.push(scope.spawn(move || meta_loop(engine, log, args.round, stop)));
        }
        for handle in handles {
            match handle.join() {
                Ok(outcome) => outcome?,
                Err(_) => bail!("a crash-writer thread panicked"),
            }
        }
        Ok(())
    })
}

fn write_loop(
    engine: &Engine,
    queue: &QueueName,
    log: &AckLog,
    args: &CrashWriterArgs,
    writer: u64,
) -> anyhow::Result<()> {
    let mut seq = 0;
    while seq < TASKS_PER_WRITER_MAX {
        let tags: Vec<u64> = (seq..seq + args.batch)
            .map(|s| crash::tag(args.round, writer, s))
            .collect();
        let batch = tags
            .iter()
            .map(|&tag| {
                let mut task = NewTask::new(
                    queue.clone(),
                    crash::due_ms(tag),
                    Bytes::from(payload(tag, args.payload_bytes)),
                );
                task.payload_kind = PayloadKind::Binary;
                task
            })
            .collect();
        let outcomes = engine.put(batch).context("put a batch")?;
        let lines: Vec<AckLine> = tags
            .iter()
            .zip(&outcomes)
            .map(|(&tag, outcome)| AckLine::Put {
                tag,
                id: outcome.id(),
            })
            .collect();
        log.write(&lines)?;
        seq += args.batch;
    }
    Ok(())
}

fn claim_loop(
    engine: &Engine,
    queue: &QueueName,
    log: &AckLog,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let batch = engine
            .claim(queue, crash::CLAIM_NOW_MS, CLAIM_MAX, crash::VISIBILITY_MS)
            .context("claim")?;
        if batch.leased.is_empty() {
            std::thread::yield_now();
            continue;
        }
        // Log what is about to be acked before acking, and each ack as soon as it is
        // acknowledged: the checker then knows which tasks may legitimately be done.
        let mut claimed = Vec::with_capacity(batch.leased.len());
        for leased in &batch.leased {
            let task = &leased.task;
            match verify_payload(&task.payload) {
                Ok(tag) => claimed.push((tag, leased)),
                Err(error) => log.write(&[AckLine::Bad(format!(
                    "claimed {} with a bad payload: {error}",
                    task.id
                ))])?,
            }
            if task.due_at_ms > crash::CLAIM_NOW_MS {
                log.write(&[AckLine::Bad(format!(
                    "claimed {} before its due time",
                    task.id
                ))])?;
            }
        }
        let leased_lines: Vec<AckLine> = claimed
            .iter()
            .map(|(tag, leased)| AckLine::Leased {
                tag: *tag,
                id: leased.task.id,
            })
            .collect();
        log.write(&leased_lines)?;
        for (tag, leased) in claimed {
            let id = leased.task.id;
            let line = match engine.ack(queue, id, leased.lease_id, crash::CLAIM_NOW_MS)? {
                LeaseOutcome::Ok => AckLine::Acked { tag, id },
                other => AckLine::Bad(format!("ack of a fresh lease of {id} said {other:?}")),
            };
            log.write(&[line])?;
        }
    }
    Ok(())
}

/// Writer thread number that tags the meta loop's values (tags of puts use 0..writers).
const META_WRITER: u64 = 255;

fn meta_loop(engine: &Engine, log: &AckLog, round: u64, stop: &AtomicBool) -> anyhow::Result<()> {
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) && seq < TASKS_PER_WRITER_MAX {
        let value = crash::tag(round, META_WRITER, seq);
        let changes = (0..crash::META_KEYS)
            .map(|i| {
                MetaChange::put(
                    crash::META_NAMESPACE,
                    &crash::meta_key(i),
                    Bytes::copy_from_slice(&value.to_le_bytes()),
                )
            })
            .collect();
        engine.write_meta(changes).context("write_meta")?;
        log.write(&[AckLine::Meta { value }])?;
        seq += 1;
    }
    Ok(())
}
