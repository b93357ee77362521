//! Data directories written by earlier versions of the engine still open, with every queue,
//! task and metadata entry they held.
//!
//! `fixtures/format-1/` was written by the engine before metadata moved into the WAL: its
//! `meta` file (format 1) holds queues *and* metadata entries, its `checkpoint` is format 2
//! (no metadata section), and its WAL holds records written after that checkpoint (the
//! writer was abandoned, as a crash would leave it). `write_format_1_fixture` is the program
//! that wrote it; it is kept to document the fixture and is not run by default (running it
//! with today's engine would write today's format).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use belfry_core::{NewTask, QueueName, TaskState};
use belfry_store::{Engine, EngineOptions, Store};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
const DAY_MS: u64 = 24 * 3_600_000;

fn queue(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-1")
}

fn task(due: u64, payload: &str) -> NewTask {
    NewTask::new(queue("orders"), due, Bytes::from(payload.to_owned()))
}

/// Writes `fixtures/format-1` (see the module docs). Run by hand only, with the engine whose
/// format the fixture is meant to hold: `BELFRY_WRITE_FIXTURE=1 cargo test -p belfry-store
/// --test engine_format_compat -- --ignored`.
#[test]
#[ignore = "writes the fixture; run by hand with the engine of the format to capture"]
fn write_format_1_fixture() {
    if std::env::var("BELFRY_WRITE_FIXTURE").is_err() {
        return;
    }
    let dir = fixture_dir();
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let engine = Engine::open(&dir, EngineOptions::default()).unwrap();
    engine
        .put_queue(&queue("orders"), Bytes::from_static(b"cfg-orders"))
        .unwrap();
    engine.put_queue(&queue("gone"), Bytes::new()).unwrap();
    engine.delete_queue(&queue("gone")).unwrap();
    engine.counts(&queue("orders"), NOW).unwrap();
    engine
        .put_meta("sched", "a", Bytes::from_static(b"1"))
        .unwrap();
    engine
        .put_meta("sched", "b", Bytes::from_static(b"2"))
        .unwrap();
    engine
        .put_meta("other", "x", Bytes::from_static(b"y"))
        .unwrap();
    engine.delete_meta("sched", "b").unwrap();
    let mut keyed = task(NOW + 3_000, "near-2");
    keyed.idempotency_key = Some("k1".into());
    engine
        .put(vec![
            task(NOW + 1_000, "near-0"),
            task(NOW + 2_000, "near-1"),
            keyed,
            task(NOW + 30 * DAY_MS, "far-0"),
            task(NOW + 31 * DAY_MS, "far-1"),
        ])
        .unwrap();
    engine.flush().unwrap();
    // After the checkpoint: a meta change (the old engine rewrote `meta` whole), two puts and
    // a lease that only the WAL holds.
    engine
        .put_meta("sched", "c", Bytes::from_static(b"3"))
        .unwrap();
    engine
        .put(vec![task(NOW + 500, "wal-0"), task(NOW + 4_000, "wal-1")])
        .unwrap();
    let leased = engine
        .claim(&queue("orders"), NOW + 600, 1, 60_000)
        .unwrap();
    assert_eq!(leased.leased.len(), 1);
    engine.abandon();
    let _ = fs::remove_file(dir.join("LOCK"));
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

fn expected_meta(engine: &Engine) {
    assert_eq!(
        engine.list_meta("sched").unwrap(),
        vec![
            ("a".to_owned(), Bytes::from_static(b"1")),
            ("c".to_owned(), Bytes::from_static(b"3")),
        ]
    );
    assert_eq!(
        engine.get_meta("other", "x").unwrap(),
        Some(Bytes::from_static(b"y"))
    );
    assert_eq!(engine.get_meta("sched", "b").unwrap(), None);
}

#[test]
fn a_format_1_directory_opens_with_its_queues_tasks_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_dir(), dir.path());
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let names: Vec<String> = engine
        .list_queues()
        .unwrap()
        .into_iter()
        .map(|(name, _)| name.to_string())
        .collect();
    assert_eq!(names, ["orders"]);
    assert_eq!(
        engine.get_queue(&queue("orders")).unwrap(),
        Some(Bytes::from_static(b"cfg-orders"))
    );
    expected_meta(&engine);
    let keyed = engine
        .get_by_key(&queue("orders"), "k1", NOW)
        .unwrap()
        .unwrap();
    assert_eq!(keyed.payload, Bytes::from_static(b"near-2"));

    // New changes on top of the old format, then a clean and an unclean reopen.
    engine
        .write_meta(vec![
            belfry_store::MetaChange::put("sched", "d", Bytes::from_static(b"4")),
            belfry_store::MetaChange::delete("sched", "d"),
        ])
        .unwrap();
    engine.flush().unwrap();
    drop(engine);
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    expected_meta(&engine);
    engine.abandon();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    expected_meta(&engine);

    // Every task: the lease taken before the crash holds until it runs out.
    let later = NOW + 40 * DAY_MS;
    let mut payloads = BTreeSet::new();
    loop {
        let batch = engine.claim(&queue("orders"), later, 100, 1_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        for leased in batch.leased {
            assert_eq!(leased.task.state, TaskState::Leased);
            payloads.insert(String::from_utf8(leased.task.payload.to_vec()).unwrap());
            engine
                .ack(&queue("orders"), leased.task.id, leased.lease_id, later)
                .unwrap();
        }
    }
    let expected: BTreeSet<String> = [
        "near-0", "near-1", "near-2", "far-0", "far-1", "wal-0", "wal-1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(payloads, expected);
}
