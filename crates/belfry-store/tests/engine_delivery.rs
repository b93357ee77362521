//! Durability of delivery state (`docs/storage-format.md`, "Durability of delivery state"):
//! leases and acks do not wait for fsync by default, yet a crash that loses them only makes
//! the task due again, never loses it or leaves it half-applied. Also: the data directory
//! lock.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belfry_core::{NewTask, QueueName, TaskId, TaskState};
use belfry_store::{Engine, EngineOptions, FsyncPolicy, LeaseOutcome, Store, StoreError};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
const VISIBILITY_MS: u64 = 30_000;

fn queue() -> QueueName {
    QueueName::new("q").unwrap()
}

/// Fsync on every durable call; the background flusher is kept out of the way (an hour) so
/// the tests see exactly which calls fsync.
fn options(sync_delivery: bool) -> EngineOptions {
    EngineOptions {
        fsync: FsyncPolicy::Always,
        sync_delivery,
        delivery_sync_delay: Duration::from_secs(3_600),
        ..EngineOptions::default()
    }
}

fn newest_wal(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.pop().expect("a WAL file")
}

/// Where the log ends in a WAL file: the file may go on with zeros prepared ahead.
fn log_len(wal: &Path) -> u64 {
    belfry_store::engine::record::wal_log_len(&fs::read(wal).unwrap()) as u64
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn delivery_calls_do_not_fsync_but_the_next_durable_call_covers_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), options(false)).unwrap();
    let q = queue();
    engine.put_queue(&q, Bytes::new()).unwrap();
    engine
        .put(vec![
            NewTask::new(q.clone(), NOW, "a"),
            NewTask::new(q.clone(), NOW, "b"),
        ])
        .unwrap();
    let syncs = engine.stats().wal_syncs;
    let batch = engine.claim(&q, NOW, 10, VISIBILITY_MS).unwrap();
    assert_eq!(batch.leased.len(), 2);
    let first = &batch.leased[0];
    assert_eq!(
        engine.ack(&q, first.task.id, first.lease_id, NOW).unwrap(),
        LeaseOutcome::Ok
    );
    assert_eq!(
        engine.stats().wal_syncs,
        syncs,
        "claim and ack must not fsync"
    );
    engine
        .put(vec![NewTask::new(q.clone(), NOW + 1_000, "c")])
        .unwrap();
    assert_eq!(engine.stats().wal_syncs, syncs + 1, "a put fsyncs once");

    // With sync_delivery, each delivery call fsyncs as before.
    drop(engine);
    let engine = Engine::open(dir.path(), options(true)).unwrap();
    let syncs = engine.stats().wal_syncs;
    let second = &batch.leased[1];
    // The lease survived the clean close.
    assert_eq!(
        engine
            .ack(&q, second.task.id, second.lease_id, NOW)
            .unwrap(),
        LeaseOutcome::Ok
    );
    assert_eq!(engine.stats().wal_syncs, syncs + 1);
    // And the ack of the first task survived too.
    assert_eq!(
        engine.get(&q, first.task.id, NOW).unwrap().map(|t| t.state),
        Some(TaskState::Done)
    );
}

#[test]
fn the_background_flusher_syncs_delivery_state_when_nothing_else_does() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        dir.path(),
        EngineOptions {
            delivery_sync_delay: Duration::from_millis(5),
            ..options(false)
        },
    )
    .unwrap();
    let q = queue();
    engine.put_queue(&q, Bytes::new()).unwrap();
    engine.put(vec![NewTask::new(q.clone(), NOW, "a")]).unwrap();
    let syncs = engine.stats().wal_syncs;
    let batch = engine.claim(&q, NOW, 10, VISIBILITY_MS).unwrap();
    assert_eq!(batch.leased.len(), 1);
    // Poll with a generous deadline: the flusher runs on its own thread.
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.stats().wal_syncs == syncs {
        assert!(
            Instant::now() < deadline,
            "the lease was never fsync'd in the background"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Where a task can be after a crash that lost some of the records written after its put.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Done,
    /// Due now (its lease was lost, or never written).
    Due,
    /// Leased (the ack was lost): due again once the lease runs out.
    DueAfterLease,
}

fn inspect(dir: &Path, id: TaskId) -> Found {
    let engine = Engine::open(dir, options(false)).unwrap();
    let q = queue();
    // A finished task may be forgotten (its bucket deleted at the checkpoint of the open):
    // then it must not be claimable either. The caller checks that this happens only once the
    // whole ack record survived.
    let Some(task) = engine.get(&q, id, NOW).unwrap() else {
        let batch = engine
            .claim(&q, NOW + VISIBILITY_MS, 10, VISIBILITY_MS)
            .unwrap();
        assert!(batch.leased.is_empty(), "a forgotten task was delivered");
        return Found::Done;
    };
    assert_eq!(&task.payload[..], b"payload", "the task comes back whole");
    match task.state {
        TaskState::Done => return Found::Done,
        TaskState::Scheduled | TaskState::Leased => {}
        other => panic!("unexpected state {other:?}"),
    }
    let leased = task.state == TaskState::Leased;
    let at = if leased { NOW + VISIBILITY_MS } else { NOW };
    let batch = engine.claim(&q, at, 10, VISIBILITY_MS).unwrap();
    assert_eq!(batch.leased.len(), 1, "the task is delivered again");
    assert_eq!(batch.leased[0].task.id, id);
    let again = &batch.leased[0];
    assert_eq!(
        engine.ack(&q, id, again.lease_id, at).unwrap(),
        LeaseOutcome::Ok
    );
    if leased {
        Found::DueAfterLease
    } else {
        Found::Due
    }
}

#[test]
fn an_ack_lost_in_a_crash_leaves_the_task_due_again_never_lost_or_half() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let q = queue();
    let (id, durable_len, full_len) = {
        let engine = Engine::open(&data, options(false)).unwrap();
        engine.put_queue(&q, Bytes::new()).unwrap();
        let id = engine
            .put(vec![NewTask::new(q.clone(), NOW, "payload")])
            .unwrap()[0]
            .id();
        // The put returned: everything up to here is fsync'd.
        let durable_len = log_len(&newest_wal(&data));
        let batch = engine.claim(&q, NOW, 10, VISIBILITY_MS).unwrap();
        let leased = &batch.leased[0];
        assert_eq!(
            engine.ack(&q, id, leased.lease_id, NOW).unwrap(),
            LeaseOutcome::Ok
        );
        let full_len = log_len(&newest_wal(&data));
        // As after `kill -9`: no checkpoint, the lease and ack are only in the WAL.
        engine.abandon();
        (id, durable_len, full_len)
    };
    assert!(
        full_len > durable_len,
        "lease and ack were written to the WAL"
    );
    // A machine crash keeps the fsync'd prefix and any part of what follows: try every cut,
    // both as a file that ends there and as one that goes on with zeros (a write cut short
    // inside space prepared ahead).
    let whole = fs::read(newest_wal(&data)).unwrap();
    for zeros_after in [false, true] {
        let mut seen = Vec::new();
        for cut in durable_len..=full_len {
            let copy = dir.path().join(format!("cut-{cut}"));
            copy_dir(&data, &copy);
            let file = fs::OpenOptions::new()
                .write(true)
                .open(newest_wal(&copy))
                .unwrap();
            file.set_len(cut).unwrap();
            if zeros_after {
                file.set_len(full_len + 64 * 1024).unwrap();
            }
            drop(file);
            let found = inspect(&copy, id);
            if found == Found::Done {
                // Zeros in place of the ack record's last bytes are those bytes when they
                // were zeros: the record is then whole.
                let lost = &whole[cut as usize..full_len as usize];
                assert!(
                    cut == full_len || (zeros_after && lost.iter().all(|b| *b == 0)),
                    "done without the whole ack record (cut at {cut} of {full_len})"
                );
            }
            if seen.last() != Some(&found) {
                seen.push(found);
            }
            fs::remove_dir_all(&copy).unwrap();
        }
        // As the cut moves forward the task goes through every stage, in order, and only those.
        assert_eq!(
            seen,
            vec![Found::Due, Found::DueAfterLease, Found::Done],
            "stages seen as the cut moves forward (zeros after it: {zeros_after})"
        );
    }
}

#[test]
fn a_put_after_an_ack_makes_the_ack_durable_and_replays_in_order() {
    // The ack releases an idempotency key that the put then reuses: the put is fsync'd, so
    // the earlier ack frame is too, and replay must apply them in WAL order.
    let dir = tempfile::tempdir().unwrap();
    let q = queue();
    let keyed = |payload: &'static str| {
        let mut task = NewTask::new(q.clone(), NOW, payload);
        task.idempotency_key = Some("k".into());
        task
    };
    let (old, new) = {
        let engine = Engine::open(dir.path(), options(false)).unwrap();
        engine.put_queue(&q, Bytes::new()).unwrap();
        let old = engine.put(vec![keyed("old")]).unwrap()[0].id();
        let batch = engine.claim(&q, NOW, 10, VISIBILITY_MS).unwrap();
        engine.ack(&q, old, batch.leased[0].lease_id, NOW).unwrap();
        let new = engine.put(vec![keyed("new")]).unwrap()[0].id();
        assert_ne!(old, new, "the key was released by the ack");
        let wal = newest_wal(dir.path());
        let len = log_len(&wal);
        drop(engine);
        // Lose anything after the put's fsync (nothing should be there).
        fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .unwrap()
            .set_len(len)
            .unwrap();
        (old, new)
    };
    let engine = Engine::open(dir.path(), options(false)).unwrap();
    let by_key = engine.get_by_key(&q, "k", NOW).unwrap().map(|t| t.id);
    assert_eq!(by_key, Some(new));
    let old_state = engine.get(&q, old, NOW).unwrap().map(|t| t.state);
    assert!(matches!(old_state, None | Some(TaskState::Done)));
    let batch = engine.claim(&q, NOW, 10, VISIBILITY_MS).unwrap();
    let ids: Vec<TaskId> = batch.leased.iter().map(|l| l.task.id).collect();
    assert_eq!(ids, vec![new]);
}

#[test]
fn a_data_directory_is_opened_by_one_engine_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    match Engine::open(dir.path(), EngineOptions::default()) {
        Err(error @ StoreError::InUse { .. }) => {
            let message = error.to_string();
            assert!(message.contains("in use"), "{message}");
            assert!(message.contains("LOCK"), "{message}");
        }
        Err(other) => panic!("expected InUse, got {other}"),
        Ok(_) => panic!("a second engine opened a directory in use"),
    }
    drop(first);
    let again = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    drop(again);
}

/// Pointed at someone else's files, the engine refuses before writing anything: it would
/// otherwise create its files there and remove directories it does not know.
#[test]
fn a_foreign_non_empty_directory_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    std::fs::create_dir(dir.path().join("q-0000000000000001")).unwrap();
    let before = listing(dir.path());
    match Engine::open(dir.path(), EngineOptions::default()) {
        Err(error @ StoreError::ForeignDataDir { .. }) => {
            let message = error.to_string();
            assert!(message.contains("notes.txt"), "{message}");
            assert!(message.contains("not a belfry data directory"), "{message}");
        }
        Err(other) => panic!("expected ForeignDataDir, got {other}"),
        Ok(_) => panic!("the engine took over a foreign directory"),
    }
    assert_eq!(
        listing(dir.path()),
        before,
        "the refused directory was changed"
    );
}

/// Missing, empty (even with a fresh filesystem's `lost+found`) and belfry's own directories
/// open; a directory belfry created is recognised again after a restart.
#[test]
fn empty_new_and_own_directories_open() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("not-yet");
    drop(Engine::open(&missing, EngineOptions::default()).unwrap());
    drop(Engine::open(&missing, EngineOptions::default()).unwrap());
    let mount_root = parent.path().join("volume");
    std::fs::create_dir_all(mount_root.join("lost+found")).unwrap();
    drop(Engine::open(&mount_root, EngineOptions::default()).unwrap());
    assert!(
        mount_root.join("BELFRY").exists(),
        "the directory was not marked"
    );
    // A directory from before the marker existed (lock file and WAL directory) is adopted.
    let older = parent.path().join("older");
    drop(Engine::open(&older, EngineOptions::default()).unwrap());
    std::fs::remove_file(older.join("BELFRY")).unwrap();
    drop(Engine::open(&older, EngineOptions::default()).unwrap());
    assert!(
        older.join("BELFRY").exists(),
        "an older directory was not marked"
    );
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Acks from several threads while puts and checkpoints run, then an abandon (as after
/// `kill -9`): an ack that returned was written to the OS before returning, so it survives a
/// crash of the process even though it was never fsync'd on its own.
#[test]
fn acks_that_returned_survive_a_process_crash_amid_checkpoints() {
    use std::collections::HashSet;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let q = queue();
    let options = EngineOptions {
        checkpoint_wal_bytes: 16 * 1024,
        ..options(false)
    };
    let engine = Arc::new(Engine::open(dir.path(), options.clone()).unwrap());
    engine.put_queue(&q, Bytes::new()).unwrap();
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let (engine, q) = (Arc::clone(&engine), q.clone());
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for b in 0..40u64 {
                    let tasks = (0..10u64)
                        .map(|i| NewTask::new(q.clone(), NOW - (t * 400 + b * 10 + i), "w"))
                        .collect();
                    ids.extend(engine.put(tasks).unwrap().iter().map(|o| o.id()));
                }
                ids
            })
        })
        .collect();
    let ackers: Vec<_> = (0..3)
        .map(|_| {
            let (engine, q) = (Arc::clone(&engine), q.clone());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for _ in 0..100 {
                    for leased in engine.claim(&q, NOW, 5, VISIBILITY_MS).unwrap().leased {
                        let outcome = engine.ack(&q, leased.task.id, leased.lease_id, NOW);
                        assert_eq!(outcome.unwrap(), LeaseOutcome::Ok);
                        acked.push(leased.task.id);
                    }
                }
                acked
            })
        })
        .collect();
    let mut put = HashSet::new();
    for writer in writers {
        put.extend(writer.join().unwrap());
    }
    let mut acked = HashSet::new();
    for acker in ackers {
        acked.extend(acker.join().unwrap());
    }
    assert!(engine.stats().checkpoints > 1, "checkpoints ran meanwhile");
    let engine = Arc::into_inner(engine).expect("the threads are done");
    engine.abandon();

    let engine = Engine::open(dir.path(), options).unwrap();
    for id in &acked {
        let state = engine.get(&q, *id, NOW).unwrap().map(|t| t.state);
        assert!(
            matches!(state, None | Some(TaskState::Done)),
            "{id}: {state:?}"
        );
    }
    // Leases that were never acked came back with the reopen; they end at their deadline.
    let rest = engine
        .claim(&q, NOW + VISIBILITY_MS, 100_000, VISIBILITY_MS)
        .unwrap();
    let rest: HashSet<TaskId> = rest.leased.iter().map(|l| l.task.id).collect();
    assert!(rest.is_disjoint(&acked), "an acked task came back");
    assert_eq!(
        rest.len() + acked.len(),
        put.len(),
        "every put is done or due"
    );
    assert!(rest.iter().all(|id| put.contains(id)));
}

/// `claim_is_quick` (the server then claims on its async worker) holds only while the claim
/// would read no bucket file: false while an unloaded bucket has tasks within the lookahead,
/// true once a claim has loaded it, and never with `sync_delivery`.
#[test]
fn a_claim_is_quick_only_when_no_bucket_must_be_read_first() {
    const DAY_MS: u64 = 24 * 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), options(false)).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    engine.counts(&queue(), NOW).unwrap();
    assert!(engine.delivery_is_quick());
    assert!(engine.claim_is_quick(&queue(), NOW), "an empty queue");
    // Due in a week: a far bucket, unloaded at the checkpoint.
    let due = NOW + 7 * DAY_MS;
    let tasks = (0..100)
        .map(|i| NewTask::new(queue(), due + i, "{}"))
        .collect();
    engine.put(tasks).unwrap();
    engine.flush().unwrap();
    assert!(engine.claim_is_quick(&queue(), NOW), "nothing near");
    let near = due - 60_000;
    assert!(
        !engine.claim_is_quick(&queue(), near),
        "the bucket must load first"
    );
    let loads = engine.stats().buckets_loaded;
    let batch = engine
        .claim(&queue(), due + 100, 1_000, VISIBILITY_MS)
        .unwrap();
    assert_eq!(batch.leased.len(), 100);
    assert_eq!(engine.stats().buckets_loaded, loads + 1);
    assert!(engine.claim_is_quick(&queue(), due + 100), "loaded now");
    assert!(!engine.claim_is_quick(&QueueName::new("nope").unwrap(), NOW));
    drop(engine);
    let engine = Engine::open(dir.path(), options(true)).unwrap();
    assert!(!engine.delivery_is_quick() && !engine.claim_is_quick(&queue(), NOW));
}
