//! The engine's metadata: one small WAL record per call (not a rewrite of a file), one frame
//! per `write_meta` (a torn one is lost whole), and replay at open bounded by the records
//! written since the last checkpoint.

use std::fs;
use std::path::Path;

use belfry_store::{Engine, EngineOptions, MetaChange, Store, StoreError};
use bytes::Bytes;

/// Where the log ends in a WAL file: the file may go on with zeros prepared ahead.
fn log_len(wal: &Path) -> u64 {
    belfry_store::engine::record::wal_log_len(&fs::read(wal).unwrap()) as u64
}

fn newest_wal(dir: &Path) -> std::path::PathBuf {
    let mut files: Vec<_> = fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.pop().unwrap()
}

fn cursor(i: u32) -> MetaChange {
    MetaChange::put(
        "schedules",
        &format!("schedule-{i:011}"),
        Bytes::copy_from_slice(&u64::from(i).to_le_bytes()),
    )
}

#[test]
fn a_meta_change_costs_one_small_fsynced_wal_record() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine.write_meta((0..5_000).map(cursor).collect()).unwrap();
    let meta_file = fs::read(dir.path().join("meta")).ok();
    let before = engine.stats();
    engine
        .put_meta(
            "schedules",
            "schedule-00000000001",
            Bytes::from_static(b"12345678"),
        )
        .unwrap();
    let after = engine.stats();
    let grew = after.wal_bytes - before.wal_bytes;
    // Frame header, target, record header, two strings and an 8-byte value: about 80 bytes,
    // whatever the size of the map (5,000 entries here).
    assert!(grew < 100, "one put_meta appended {grew} bytes");
    assert_eq!(after.wal_syncs, before.wal_syncs + 1, "not fsync'd once");
    assert_eq!(
        fs::read(dir.path().join("meta")).ok(),
        meta_file,
        "meta file rewritten"
    );
    // 5,000 changes in one call: one frame, one fsync.
    let syncs_before = engine.stats().wal_syncs;
    engine.write_meta((0..5_000).map(cursor).collect()).unwrap();
    assert_eq!(engine.stats().wal_syncs, syncs_before + 1);
}

#[test]
fn a_torn_write_meta_is_lost_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine
        .put_meta("schedules", "before", Bytes::from_static(b"kept"))
        .unwrap();
    let wal = newest_wal(dir.path());
    let before = log_len(&wal);
    engine.write_meta((0..1_000).map(cursor).collect()).unwrap();
    let after = log_len(&wal);
    engine.abandon();
    for cut in [1, (after - before) / 2, after - before - 1] {
        let copy = tempfile::tempdir().unwrap();
        for sub in ["", "wal"] {
            fs::create_dir_all(copy.path().join(sub)).unwrap();
            for entry in fs::read_dir(dir.path().join(sub)).unwrap() {
                let entry = entry.unwrap();
                if entry.path().is_file() {
                    fs::copy(entry.path(), copy.path().join(sub).join(entry.file_name())).unwrap();
                }
            }
        }
        let torn = copy.path().join("wal").join(wal.file_name().unwrap());
        let file = fs::OpenOptions::new().write(true).open(&torn).unwrap();
        file.set_len(after - cut).unwrap();
        drop(file);
        let engine = Engine::open(copy.path(), EngineOptions::default()).unwrap();
        let entries = engine.list_meta("schedules").unwrap();
        assert_eq!(
            entries,
            vec![("before".to_owned(), Bytes::from_static(b"kept"))],
            "cut {cut} bytes off the write_meta frame"
        );
    }
}

#[test]
fn reopen_replays_only_the_meta_records_since_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    for i in 0..1_000 {
        engine.write_meta(vec![cursor(i)]).unwrap();
    }
    engine.flush().unwrap();
    engine
        .write_meta(vec![
            cursor(1),
            cursor(2),
            MetaChange::delete("schedules", "gone"),
        ])
        .unwrap();
    engine.abandon();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(engine.stats().wal_records_replayed, 3);
    assert_eq!(engine.list_meta("schedules").unwrap().len(), 1_000);
}

#[test]
fn meta_the_format_cannot_hold_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let long = "k".repeat(64 * 1024 + 1);
    let refused = engine.write_meta(vec![
        MetaChange::put("schedules", "fine", Bytes::from_static(b"1")),
        MetaChange::put("schedules", &long, Bytes::from_static(b"2")),
    ]);
    assert!(
        matches!(refused, Err(StoreError::Invalid(_))),
        "{refused:?}"
    );
    assert!(engine.list_meta("schedules").unwrap().is_empty());
    engine.abandon();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert!(engine.list_meta("schedules").unwrap().is_empty());
}
