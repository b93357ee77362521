//! Odd entries in a data directory: an open removes only files whose names the engine makes
//! and no longer lists, and leaves everything else where it is; an I/O error on a file names
//! that file.

use std::fs;
use std::path::{Path, PathBuf};

use belfry_core::{NewTask, QueueName, UserId};
use belfry_store::{Engine, EngineOptions, Store, StoreError};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
const DAY_MS: u64 = 24 * 3_600_000;

fn queue() -> QueueName {
    QueueName::new("q").unwrap()
}

/// A data directory with a queue, near and far tasks (some keyed) and subscribers, all
/// checkpointed: bucket files, a key run and a subscription run. Returns the queue's
/// directory.
fn populated(dir: &Path) -> PathBuf {
    let engine = Engine::open(dir, EngineOptions::default()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    let tasks = (0..100u64)
        .map(|i| {
            let mut task = NewTask::new(queue(), NOW + i * DAY_MS / 4, Bytes::from("x"));
            task.idempotency_key = Some(format!("key-{i}"));
            task
        })
        .collect();
    engine.put(tasks).unwrap();
    let users: Vec<UserId> = (0..100u64)
        .map(|i| UserId::new(i.to_string()).unwrap())
        .collect();
    engine.subscribe(1, &users).unwrap();
    engine.flush().unwrap();
    drop(engine);
    let qdir = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("q-"))
        .unwrap();
    assert!(fs::read_dir(&qdir).unwrap().count() > 0, "no bucket file");
    qdir
}

fn pending(dir: &Path) -> u64 {
    let engine = Engine::open(dir, EngineOptions::default()).unwrap();
    engine.counts(&queue(), NOW + 100 * DAY_MS).unwrap().pending
}

#[test]
fn an_open_removes_only_engine_files_it_no_longer_lists() {
    let dir = tempfile::tempdir().unwrap();
    let qdir = populated(dir.path());
    let root = dir.path();
    // Names belfry never writes: left alone, wherever they are.
    let foreign = [
        qdir.join("notes.txt"),
        root.join("subs/notes.txt"),
        root.join("keys/notes.txt"),
        root.join("q-00000000000000ab/notes.txt"),
        qdir.join("backup/b-0000000000000001.seg"),
    ];
    // Names it writes, not listed by the checkpoint: removed.
    let leftovers = [
        qdir.join("b-00000000deadbeef.seg"),
        root.join("keys/0000000000000fff.run"),
        root.join("subs/0000000000000fff.run"),
        root.join("q-00000000000000aa/b-0000000000000001.seg"),
        root.join("q-00000000000000ab/b-0000000000000002.seg"),
    ];
    for path in foreign.iter().chain(&leftovers) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"not written by this engine").unwrap();
    }
    assert_eq!(pending(root), 100);
    for path in &foreign {
        assert!(path.exists(), "{} was removed", path.display());
    }
    for path in &leftovers {
        assert!(!path.exists(), "{} was left", path.display());
    }
    // A deleted queue's directory goes once it holds nothing else; one holding a file of
    // the operator's stays (with that file only).
    assert!(!root.join("q-00000000000000aa").exists());
    assert_eq!(
        fs::read_dir(root.join("q-00000000000000ab"))
            .unwrap()
            .count(),
        1
    );
    // And again: nothing changes.
    assert_eq!(pending(root), 100);
    for path in &foreign {
        assert!(path.exists(), "{} was removed", path.display());
    }
}

/// The error message names the file: replaced by a directory, reading it fails (`EISDIR`),
/// as any I/O error would (a permission, a disk), and the message must say which file.
fn assert_io_error_names<T: std::fmt::Debug>(result: Result<T, StoreError>, path: &Path) {
    match result {
        Err(error @ StoreError::Io { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains(&format!("({})", path.display())),
                "{message}"
            );
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

fn replace_with_dir(path: &Path) {
    fs::remove_file(path).unwrap();
    fs::create_dir(path).unwrap();
}

#[test]
fn io_errors_name_their_file() {
    for name in ["checkpoint", "meta"] {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let path = dir.path().join(name);
        replace_with_dir(&path);
        assert_io_error_names(Engine::open(dir.path(), EngineOptions::default()), &path);
    }
    for sub in ["keys", "subs"] {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let run = fs::read_dir(dir.path().join(sub))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        replace_with_dir(&run);
        assert_io_error_names(Engine::open(dir.path(), EngineOptions::default()), &run);
    }
    // A bucket file (the open cuts it back to the checkpoint's length).
    let dir = tempfile::tempdir().unwrap();
    let qdir = populated(dir.path());
    let bucket = fs::read_dir(&qdir).unwrap().next().unwrap().unwrap().path();
    replace_with_dir(&bucket);
    assert_io_error_names(Engine::open(dir.path(), EngineOptions::default()), &bucket);
    // At run time: a far bucket file, read only when a call needs it.
    let dir = tempfile::tempdir().unwrap();
    let qdir = populated(dir.path());
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let mut buckets: Vec<PathBuf> = fs::read_dir(&qdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    buckets.sort();
    let far = buckets.pop().unwrap();
    replace_with_dir(&far);
    let claimed = engine.claim(&queue(), NOW + 100 * DAY_MS, 1_000, 1_000);
    assert_io_error_names(claimed, &far);
}
