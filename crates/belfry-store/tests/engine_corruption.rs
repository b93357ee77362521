//! Damaged files: a torn WAL tail is cut (only the unacknowledged call is lost), damaged
//! bucket or WAL bytes give a clear `Corrupt` error, never a panic or wrong data.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_store::{Engine, EngineOptions, Store, StoreError};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
const DAY_MS: u64 = 24 * 3_600_000;

fn queue() -> QueueName {
    QueueName::new("q").unwrap()
}

/// Writes 200 tasks in 4 calls, near and far; returns id → payload.
fn populate(dir: &Path, flush: bool) -> HashMap<TaskId, Bytes> {
    let engine = Engine::open(dir, EngineOptions::default()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    engine.counts(&queue(), NOW).unwrap();
    let mut expected = HashMap::new();
    for call in 0..4u64 {
        let tasks: Vec<NewTask> = (0..50u64)
            .map(|i| {
                let due = NOW + (call * 50 + i) * DAY_MS / 10;
                NewTask::new(queue(), due, Bytes::from(format!("payload-{call}-{i}")))
            })
            .collect();
        let outcomes = engine.put(tasks.clone()).unwrap();
        for (outcome, task) in outcomes.iter().zip(tasks) {
            expected.insert(outcome.id(), task.payload);
        }
    }
    if flush {
        engine.flush().unwrap();
    }
    expected
}

/// Where the log ends in a WAL file: the file may go on with zeros prepared ahead.
fn log_len(wal: &Path) -> u64 {
    belfry_store::engine::record::wal_log_len(&fs::read(wal).unwrap()) as u64
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Opens and drains everything; every task returned must carry its own payload. Returns the
/// number drained, or the first error.
fn drain(dir: &Path, expected: &HashMap<TaskId, Bytes>) -> Result<usize, StoreError> {
    let engine = Engine::open(dir, EngineOptions::default())?;
    let mut count = 0;
    loop {
        let batch = engine.claim(&queue(), NOW + 100 * DAY_MS, 1_000, 1_000)?;
        if batch.leased.is_empty() {
            return Ok(count);
        }
        for leased in batch.leased {
            assert_eq!(
                Some(&leased.task.payload),
                expected.get(&leased.task.id),
                "wrong data for {}",
                leased.task.id
            );
            count += 1;
        }
    }
}

#[test]
fn torn_wal_tail_loses_only_the_last_call() {
    let dir = tempfile::tempdir().unwrap();
    let expected = populate(dir.path(), false);
    let wal = files(dir.path(), ".wal");
    let last = wal.last().unwrap();
    let len = log_len(last);
    // Cut into the middle of the last call's frame.
    let file = fs::OpenOptions::new().write(true).open(last).unwrap();
    file.set_len(len - 100).unwrap();
    drop(file);
    assert_eq!(drain(dir.path(), &expected).unwrap(), 150);
    // A second reopen sees the same (the tail was cut, not re-read).
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(engine.counts(&queue(), NOW).unwrap().in_flight, 150);
}

#[test]
fn torn_batch_ack_is_lost_whole() {
    const TASKS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    let tasks = (0..TASKS)
        .map(|i| NewTask::new(queue(), NOW, Bytes::from(format!("t{i}"))))
        .collect();
    engine.put(tasks).unwrap();
    let leased = engine.claim(&queue(), NOW, TASKS, DAY_MS).unwrap().leased;
    assert_eq!(leased.len(), TASKS);
    let acks: Vec<_> = leased.iter().map(|l| (l.task.id, l.lease_id)).collect();
    let outcomes = engine.ack_many(&queue(), &acks, NOW).unwrap();
    assert!(outcomes
        .iter()
        .all(|o| *o == belfry_store::LeaseOutcome::Ok));
    // A process crash after the call: its frame is written, so every ack survives.
    engine.abandon();
    let template = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), template.path());
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(engine.counts(&queue(), NOW).unwrap().in_flight, 0);
    drop(engine);
    // The batch's frame torn (its last bytes missing): none of its acks survives, where
    // one frame per ack would have lost only the last.
    let wal = files(template.path(), ".wal");
    let last = wal.last().unwrap();
    let len = log_len(last);
    let file = fs::OpenOptions::new().write(true).open(last).unwrap();
    file.set_len(len - 4).unwrap();
    drop(file);
    let engine = Engine::open(template.path(), EngineOptions::default()).unwrap();
    assert_eq!(
        engine.counts(&queue(), NOW).unwrap().in_flight,
        TASKS as u64
    );
}

#[test]
fn damaged_wal_bytes_are_refused_or_cut_never_misread() {
    let template = tempfile::tempdir().unwrap();
    let expected = populate(template.path(), false);
    let wal = files(template.path(), ".wal");
    let last = wal
        .last()
        .unwrap()
        .strip_prefix(template.path())
        .unwrap()
        .to_path_buf();
    let len = log_len(&template.path().join(&last)) as usize;
    for position in (0..len).step_by(len / 23 + 1) {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(template.path(), dir.path());
        let path = dir.path().join(&last);
        let mut bytes = fs::read(&path).unwrap();
        bytes[position] ^= 0x5a;
        fs::write(&path, bytes).unwrap();
        match drain(dir.path(), &expected) {
            // Damage in the last frame looks like a torn write: that call is dropped.
            Ok(count) => assert!(count == 150 || count == 200, "{count} at {position}"),
            Err(StoreError::Corrupt { .. }) => {}
            Err(other) => panic!("unexpected error {other} at {position}"),
        }
    }
}

#[test]
fn damaged_bucket_bytes_give_a_clear_error() {
    let template = tempfile::tempdir().unwrap();
    let expected = populate(template.path(), true);
    let buckets = files(template.path(), ".seg");
    assert!(!buckets.is_empty());
    let mut errors = 0;
    for (n, bucket) in buckets.iter().enumerate() {
        let relative = bucket.strip_prefix(template.path()).unwrap().to_path_buf();
        let len = fs::metadata(bucket).unwrap().len() as usize;
        let dir = tempfile::tempdir().unwrap();
        copy_dir(template.path(), dir.path());
        let path = dir.path().join(&relative);
        let mut bytes = fs::read(&path).unwrap();
        bytes[(n * 7_919) % len] ^= 0x01;
        fs::write(&path, bytes).unwrap();
        match drain(dir.path(), &expected) {
            Ok(count) => panic!("damage in {relative:?} went unnoticed ({count} drained)"),
            Err(StoreError::Corrupt { location, .. }) => {
                assert!(location.contains(".seg"), "{location}");
                errors += 1;
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert_eq!(errors, buckets.len());
}

#[test]
fn truncated_bucket_file_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), true);
    let bucket = files(dir.path(), ".seg").pop().unwrap();
    let len = fs::metadata(&bucket).unwrap().len();
    let file = fs::OpenOptions::new().write(true).open(&bucket).unwrap();
    file.set_len(len / 2).unwrap();
    drop(file);
    match Engine::open(dir.path(), EngineOptions::default()) {
        Err(StoreError::Corrupt { location, .. }) => assert!(location.contains(".seg")),
        other => panic!("expected a corrupt error, got {other:?}"),
    }
}

#[test]
fn damaged_checkpoint_and_meta_are_refused() {
    for name in ["checkpoint", "meta"] {
        let dir = tempfile::tempdir().unwrap();
        populate(dir.path(), true);
        let path = dir.path().join(name);
        let mut bytes = fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        fs::write(&path, bytes).unwrap();
        assert!(matches!(
            Engine::open(dir.path(), EngineOptions::default()),
            Err(StoreError::Corrupt { .. })
        ));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn inputs_the_format_cannot_hold_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    let mut many_headers = NewTask::new(queue(), NOW, "x");
    many_headers.headers = (0..1_000).map(|i| (format!("h{i}"), "v".into())).collect();
    let mut long_key = NewTask::new(queue(), NOW, "x");
    long_key.idempotency_key = Some("k".repeat(100_000));
    for bad in [many_headers, long_key] {
        let ok = NewTask::new(queue(), NOW, "fine");
        assert!(matches!(
            engine.put(vec![ok, bad]),
            Err(StoreError::Invalid(_))
        ));
    }
    // Nothing of the refused batches was stored, and a long dead reason is cut, not refused.
    engine.put(vec![NewTask::new(queue(), NOW, "y")]).unwrap();
    let leased = engine.claim(&queue(), NOW, 10, 1_000).unwrap().leased;
    assert_eq!(leased.len(), 1);
    let reason = "é".repeat(10_000);
    engine
        .dead_letter(
            &queue(),
            leased[0].task.id,
            leased[0].lease_id,
            &reason,
            NOW,
        )
        .unwrap();
    drop(engine);
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let dead = engine.list_dead(&queue(), None, 10).unwrap();
    assert_eq!(dead.len(), 1);
    let stored = dead[0].dead_reason.clone().unwrap();
    assert!(stored.len() <= 4096 && reason.starts_with(&stored));
}

/// A directory that lost its `meta` or its `checkpoint` (deleted by hand, a partial restore)
/// is refused, naming the missing file, and left as it was: opened as new it would have
/// started empty and removed every queue's files as not listed.
#[test]
fn a_missing_meta_or_checkpoint_is_refused_and_nothing_is_removed() {
    for missing in ["meta", "checkpoint"] {
        let dir = tempfile::tempdir().unwrap();
        populate(dir.path(), true);
        let before = files(dir.path(), "").len();
        fs::remove_file(dir.path().join(missing)).unwrap();
        match Engine::open(dir.path(), EngineOptions::default()) {
            Err(StoreError::Corrupt { location, detail }) => {
                assert!(location.ends_with(missing), "{location}");
                assert!(detail.contains("missing"), "{detail}");
            }
            Err(other) => panic!("{missing}: expected Corrupt, got {other}"),
            Ok(_) => panic!("{missing}: a partial directory opened"),
        }
        assert_eq!(
            files(dir.path(), "").len(),
            before - 1,
            "{missing}: nothing else removed"
        );
    }
    // A new directory opens, and reopens (with no queue made, it has no meta file yet); so
    // does one that never held anything but lost its checkpoint (a first open cut before it
    // was written).
    let fresh = tempfile::tempdir().unwrap();
    drop(Engine::open(fresh.path(), EngineOptions::default()).unwrap());
    drop(Engine::open(fresh.path(), EngineOptions::default()).unwrap());
    fs::remove_file(fresh.path().join("checkpoint")).unwrap();
    drop(Engine::open(fresh.path(), EngineOptions::default()).unwrap());
}

/// A WAL file the checkpoint's log needs, deleted (or a gap in the numbering), is refused,
/// naming it: replaying what is left would skip its acknowledged records without a word.
#[test]
fn a_missing_wal_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), false);
    let wal = files(&dir.path().join("wal"), ".wal");
    let first = wal.first().expect("a WAL file").clone();
    fs::remove_file(&first).unwrap();
    match Engine::open(dir.path(), EngineOptions::default()) {
        Err(StoreError::Corrupt { location, detail }) => {
            assert_eq!(Path::new(&location), first, "{detail}");
            assert!(detail.contains("missing"), "{detail}");
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("opened without a WAL file of its log"),
    }
}
