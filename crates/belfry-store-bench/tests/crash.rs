//! Crash tests of the belfry engine: a child process (`belfry-store-bench crash-writer`)
//! writes batches from several threads (and, in some rounds, claims and acks), and is killed
//! with SIGKILL at seeded pseudo-random points. After each kill the engine is reopened in this
//! process and checked:
//!
//! - every put the writer saw acknowledged is present exactly once, with its full payload;
//! - every ack the writer saw acknowledged stays done (never delivered again);
//! - in rounds with a metadata writer, the cursors it moves together with `write_meta` all
//!   hold one value (no torn batch), and it is the last acknowledged one or the one after;
//! - nothing is half-visible: every task found has a self-verifying payload (tag, filler,
//!   checksum) and the id the writer logged for it;
//! - after the tail of the most recently modified file is truncated or corrupted, reopen gives
//!   a clear error or skips the damage, never panics, never returns wrong data.
//!
//! The seed is printed; set `BELFRY_CRASH_SEED` to replay a run.

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use belfry_core::{QueueName, TaskId, TaskState};
use belfry_store::engine::{Engine, EngineOptions, FsyncPolicy};
use belfry_store::{LeaseOutcome, Store};
use belfry_store_bench::crash::{self, AckLine};
use belfry_store_bench::workload::{verify_payload, Rng};

const WRITER: &str = env!("CARGO_BIN_EXE_belfry-store-bench");

/// Kill rounds per test; with small kill points each round takes well under a second in a
/// debug build.
const ROUNDS: u64 = 20;

/// A round kills the writer after it logged between 1 and this many acknowledged puts and
/// acks.
const KILL_AFTER_PUTS_MAX: u64 = 6_000;

/// WAL bytes between checkpoints in the rounds that checkpoint often: a few batches.
const FREQUENT_CHECKPOINT_WAL_BYTES: u64 = 64 * 1024;

/// Tasks per claim in the checker's drain.
const DRAIN_CLAIM_MAX: usize = 1_000;

/// Bytes at the end of a file that corruption may touch: the unsynced or torn region a crash
/// can leave behind.
const CORRUPT_TAIL_BYTES: u64 = 4_096;

fn seed() -> u64 {
    let seed = match std::env::var("BELFRY_CRASH_SEED") {
        Ok(text) => text.parse().expect("BELFRY_CRASH_SEED is a u64"),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    };
    eprintln!("crash test seed: {seed} (replay with BELFRY_CRASH_SEED={seed})");
    seed
}

fn queue() -> QueueName {
    QueueName::new(crash::QUEUE).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    None,
    /// Cut a random number of bytes off the end of the newest file.
    Truncate,
    /// Flip random bytes near the end of the newest file.
    Flip,
}

/// What the writer logged before it died.
#[derive(Debug, Default)]
struct AckLog {
    puts: HashMap<u64, TaskId>,
    /// Leased by the writer's claimer, which was about to ack them.
    leased: HashMap<u64, TaskId>,
    acks: HashMap<u64, TaskId>,
    /// The last `write_meta` value acknowledged.
    meta: Option<u64>,
}

/// Kills `child` on drop, so a failing assertion never leaves a writer running.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs one writer in `dir` and kills it after `kill_after` acknowledged puts and acks.
fn run_writer(
    dir: &Path,
    round: u64,
    claim: bool,
    checkpoint_wal_bytes: Option<u64>,
    meta: bool,
    kill_after: u64,
) -> AckLog {
    let mut command = Command::new(WRITER);
    command
        .arg("crash-writer")
        .arg("--dir")
        .arg(dir)
        .args(["--round", &round.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(bytes) = checkpoint_wal_bytes {
        command.args(["--checkpoint-wal-bytes", &bytes.to_string()]);
    }
    if meta {
        command.arg("--meta");
    }
    if claim {
        // One writer thread, so the claimer's acks are a good share of what is in flight
        // when the kill lands.
        command.args(["--claim", "--writers", "1"]);
    }
    let mut child = KillOnDrop(command.spawn().expect("start the crash writer"));
    let stdout = child.0.stdout.take().unwrap();
    let mut log = AckLog::default();
    let mut killed = false;
    let mut ready = false;
    for line in BufReader::new(stdout).lines() {
        // After the kill the pipe still holds whatever the writer wrote; read it to the end.
        let Ok(line) = line else { break };
        match AckLine::parse(&line) {
            Some(AckLine::Ready) => ready = true,
            Some(AckLine::Put { tag, id }) => {
                assert!(log.puts.insert(tag, id).is_none(), "tag {tag} put twice");
            }
            Some(AckLine::Leased { tag, id }) => {
                assert!(
                    log.leased.insert(tag, id).is_none(),
                    "tag {tag} leased twice"
                );
            }
            Some(AckLine::Acked { tag, id }) => {
                assert!(log.acks.insert(tag, id).is_none(), "tag {tag} acked twice");
            }
            Some(AckLine::Meta { value }) => {
                assert!(log.meta < Some(value), "meta value {value} went backwards");
                log.meta = Some(value);
            }
            Some(AckLine::Bad(text)) => panic!("round {round}: the writer saw wrong data: {text}"),
            // A torn last line: the writer died while printing it. Not counted as acked.
            None => {}
        }
        if !killed && (log.puts.len() + log.acks.len()) as u64 >= kill_after {
            child.0.kill().expect("kill the writer");
            killed = true;
        }
    }
    let status = child.0.wait().expect("wait for the writer");
    if !killed {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.0.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        panic!("round {round}: the writer exited by itself ({status}) before the kill: {stderr}");
    }
    assert!(ready, "round {round}: the writer never opened the engine");
    log
}

/// The most recently modified regular file under `dir` (the engine's file names are its own
/// business, so the test does not guess them).
fn newest_file(dir: &Path) -> Option<PathBuf> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path).ok()?.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.len() > 0 {
                let modified = meta.modified().ok()?;
                if newest.as_ref().is_none_or(|(time, _)| modified >= *time) {
                    newest = Some((modified, entry.path()));
                }
            }
        }
    }
    newest.map(|(_, path)| path)
}

fn damage(dir: &Path, damage: Damage, rng: &mut Rng) -> String {
    let Some(path) = newest_file(dir) else {
        return "no file to damage".into();
    };
    let len = fs::metadata(&path).unwrap().len();
    let tail = len.min(CORRUPT_TAIL_BYTES);
    match damage {
        Damage::None => String::new(),
        Damage::Truncate => {
            let cut = rng.range(1, tail + 1);
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(len - cut).unwrap();
            format!("truncated {} by {cut} of {len} bytes", path.display())
        }
        Damage::Flip => {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let flips = rng.range(1, 9);
            for _ in 0..flips {
                let at = len - tail + rng.range(0, tail);
                let mut byte = [0u8; 1];
                file.seek(SeekFrom::Start(at)).unwrap();
                file.read_exact(&mut byte).unwrap();
                byte[0] ^= 1 << rng.range(0, 8);
                file.seek(SeekFrom::Start(at)).unwrap();
                file.write_all(&byte).unwrap();
            }
            format!(
                "flipped {flips} bits in the last {tail} of {len} bytes of {}",
                path.display()
            )
        }
    }
}

/// Everything the checker knows across rounds.
#[derive(Debug, Default)]
struct History {
    /// Tags whose ack was acknowledged in some round (they must never come back).
    acked: HashSet<u64>,
    /// The value the metadata cursors held after the last check.
    meta: Option<u64>,
}

/// Checks the metadata cursors against what the writer acknowledged: all hold one value (a
/// `write_meta` is one frame), and it is the last acknowledged value or the next one (written
/// but not acknowledged), or, if none was acknowledged this round, the previous round's value
/// or this round's first.
fn check_meta(
    engine: &Engine,
    round: u64,
    log: &AckLog,
    history: &mut History,
    damaged: bool,
) -> Result<(), String> {
    let entries = engine
        .list_meta(crash::META_NAMESPACE)
        .map_err(|e| format!("list_meta: {e}"))?;
    if entries.is_empty() {
        assert!(
            damaged || (log.meta.is_none() && history.meta.is_none()),
            "round {round}: acknowledged metadata is missing"
        );
        return Ok(());
    }
    assert_eq!(
        entries.len() as u64,
        crash::META_KEYS,
        "round {round}: part of a write_meta survived: {entries:?}"
    );
    let values: HashSet<&[u8]> = entries.iter().map(|(_, v)| v.as_ref()).collect();
    assert_eq!(
        values.len(),
        1,
        "round {round}: torn write_meta: {entries:?}"
    );
    let value = u64::from_le_bytes(
        entries[0]
            .1
            .as_ref()
            .try_into()
            .unwrap_or_else(|_| panic!("round {round}: cursor value {:?}", entries[0].1)),
    );
    if !damaged {
        let allowed = match log.meta {
            Some(last) => vec![last, last + 1],
            None => history
                .meta
                .into_iter()
                .chain([crash::tag(round, 255, 0)])
                .collect(),
        };
        assert!(
            allowed.contains(&value),
            "round {round}: cursors hold {value}, expected one of {allowed:?}"
        );
    }
    history.meta = Some(value);
    Ok(())
}

/// Reopens the engine after a kill and checks it against the log. With `damaged`, lost tasks
/// are allowed (the test destroyed them) but wrong data is not.
fn check(
    dir: &Path,
    round: u64,
    log: &AckLog,
    history: &mut History,
    damaged: bool,
) -> Result<(), String> {
    // The checker's own acks need not be fsync'd one by one (that would make each round take
    // seconds): fsync policy `never`, and one flush at the end makes them durable before the
    // next writer starts. What is under test is what the killed writer left behind.
    let options = EngineOptions {
        fsync: FsyncPolicy::Never,
        ..EngineOptions::default()
    };
    let engine = match Engine::open(dir, options) {
        Ok(engine) => engine,
        Err(error) if damaged => return Err(format!("reopen refused the damaged data: {error}")),
        Err(error) => panic!("round {round}: reopen after kill -9 failed: {error}"),
    };
    let queue = queue();
    let now = crash::CHECK_NOW_MS;
    let mut lost = 0;
    // In damaged rounds an operating error is an accepted answer (a clear error, not wrong
    // data); in clean rounds it fails the test.
    let fail = |what: &str, error: belfry_store::StoreError| -> String {
        assert!(damaged, "round {round}: {what}: {error}");
        format!("{what}: {error}")
    };

    // By id: every acknowledged put is there, whole and under the logged id, and every
    // acknowledged ack stays finished.
    for (&tag, &id) in &log.puts {
        let task = engine.get(&queue, id, now).map_err(|e| fail("get", e))?;
        if log.acks.contains_key(&tag) {
            if let Some(task) = task {
                if !damaged {
                    assert_eq!(
                        task.state,
                        TaskState::Done,
                        "round {round}: acked task {id} came back"
                    );
                }
            }
            continue;
        }
        // Leased by the writer's claimer: its ack may have gone through without being logged.
        let maybe_done = log.leased.contains_key(&tag);
        match task {
            Some(task) => {
                assert_eq!(
                    verify_payload(&task.payload),
                    Ok(tag),
                    "round {round}: task {id} has the wrong payload"
                );
                let finished_ok = damaged || (maybe_done && task.state == TaskState::Done);
                assert!(
                    !task.state.is_finished() || finished_ok,
                    "round {round}: task {id} is {:?}",
                    task.state
                );
            }
            None if damaged || maybe_done => lost += 1,
            None => panic!("round {round}: acknowledged task {id} (tag {tag}) is missing"),
        }
    }
    history.acked.extend(log.acks.keys().copied());
    check_meta(&engine, round, log, history, damaged)?;

    // By drain: every task still scheduled is delivered exactly once and is one the writer
    // wrote; acknowledged puts that were not acked are all among them.
    let mut seen = HashSet::new();
    loop {
        let batch = engine
            .claim(&queue, now, DRAIN_CLAIM_MAX, crash::VISIBILITY_MS)
            .map_err(|e| fail("claim", e))?;
        if batch.leased.is_empty() {
            break;
        }
        for leased in batch.leased {
            let task = leased.task;
            let tag = verify_payload(&task.payload).unwrap_or_else(|e| {
                panic!("round {round}: drained {} with a bad payload: {e}", task.id)
            });
            assert!(seen.insert(tag), "round {round}: tag {tag} delivered twice");
            assert_eq!(
                task.due_at_ms,
                crash::due_ms(tag),
                "round {round}: tag {tag} has the wrong due time"
            );
            if let Some(&id) = log.puts.get(&tag) {
                assert_eq!(
                    task.id, id,
                    "round {round}: tag {tag} came back under another id"
                );
            } else {
                // Written but never acknowledged: allowed, but only from this round (earlier
                // rounds were drained by their own check).
                // Damage may have destroyed the records that finished an earlier round's
                // tasks; they may then come back, whole.
                assert!(
                    crash::round_of(tag) == round || damaged,
                    "round {round}: tag {tag} of round {} resurrected",
                    crash::round_of(tag)
                );
            }
            if !damaged {
                assert!(
                    !history.acked.contains(&tag),
                    "round {round}: acked tag {tag} delivered again"
                );
            }
            let outcome = engine
                .ack(&queue, task.id, leased.lease_id, now)
                .map_err(|e| fail("ack", e))?;
            assert_eq!(
                outcome,
                LeaseOutcome::Ok,
                "round {round}: checker ack of {}",
                task.id
            );
            history.acked.insert(tag);
        }
    }
    for (&tag, &id) in &log.puts {
        if !log.acks.contains_key(&tag) && !log.leased.contains_key(&tag) && !seen.contains(&tag) {
            assert!(
                damaged,
                "round {round}: acknowledged task {id} (tag {tag}) was not drained"
            );
        }
    }
    engine.flush().map_err(|e| fail("flush", e))?;
    eprintln!(
        "round {round}: {} puts, {} leases and {} acks acknowledged, {} drained, {lost} lost to damage or done, last meta {:?}",
        log.puts.len(),
        log.leased.len(),
        log.acks.len(),
        seen.len(),
        log.meta,
    );
    Ok(())
}

fn kill_rounds(seed: u64, claim_rounds: bool, damage_rounds: bool) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut history = History::default();
    for round in 1..=ROUNDS {
        let claim = claim_rounds && rng.range(0, 2) == 1;
        let kind = if damage_rounds {
            if rng.range(0, 2) == 0 {
                Damage::Truncate
            } else {
                Damage::Flip
            }
        } else {
            Damage::None
        };
        let kill_after = rng.range(1, KILL_AFTER_PUTS_MAX + 1);
        let started = std::time::Instant::now();
        // Half the rounds checkpoint often, so kills also land inside checkpoints.
        let checkpoint = (rng.range(0, 2) == 1).then_some(FREQUENT_CHECKPOINT_WAL_BYTES);
        // Half the rounds also move metadata cursors (their own stream, so the other choices
        // and the kill points stay what the seed always gave).
        let meta = Rng::new(seed ^ round).range(0, 2) == 1;
        let log = run_writer(&data, round, claim, checkpoint, meta, kill_after);
        eprintln!("round {round}: writer ran {:?}", started.elapsed());
        let what = damage(&data, kind, &mut rng);
        let checked = std::time::Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            check(&data, round, &log, &mut history, kind != Damage::None)
        }));
        eprintln!("round {round}: check took {:?}", checked.elapsed());
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(refused)) => {
                // A clear error is an accepted answer to damage; start the next round afresh.
                eprintln!("round {round}: {what}: {refused}");
                fs::remove_dir_all(&data).unwrap();
                history = History::default();
            }
            Err(panic) => {
                eprintln!("round {round} (seed {seed}, claim {claim}, checkpoint {checkpoint:?}, meta {meta}, kill after {kill_after}, {what}) failed");
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[test]
fn acknowledged_puts_survive_kill_9() {
    kill_rounds(seed(), false, false);
}

#[test]
fn acknowledged_puts_and_acks_survive_kill_9_while_draining() {
    kill_rounds(seed() ^ 0x0D4A_1700, true, false);
}

#[test]
fn damaged_tails_give_an_error_or_are_skipped_never_wrong_data() {
    kill_rounds(seed() ^ 0xDA3A_6E00, true, true);
}
