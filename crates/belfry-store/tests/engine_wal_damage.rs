//! Damage at the end of a WAL file that looks like the engine's own leftovers, and must not
//! be dropped as if it were: a long run of zeros where frames were (zeroed sectors), and a
//! frame whose length field was damaged (read as a torn write, it would take the frames after
//! it along). Both refuse the open with `Corrupt` naming the file, the offset and the way out;
//! the way out works; a genuine torn tail still opens.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, EngineOptions, Store, StoreError};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
const CALLS: u64 = 40;
const TASKS_PER_CALL: u64 = 50;

fn queue() -> QueueName {
    QueueName::new("q").unwrap()
}

/// `CALLS` acknowledged puts of 50 tasks of 1 KiB (about 2 MiB of WAL, more than the engine
/// ever prepares ahead), then a crash. Returns the WAL file.
fn crashed_with_wal(dir: &Path) -> PathBuf {
    let engine = Engine::open(dir, EngineOptions::default()).unwrap();
    engine.put_queue(&queue(), Bytes::new()).unwrap();
    for call in 0..CALLS {
        let tasks = (0..TASKS_PER_CALL)
            .map(|i| NewTask::new(queue(), NOW + call * 100 + i, Bytes::from(vec![b'x'; 1024])))
            .collect();
        engine.put(tasks).unwrap();
    }
    engine.abandon();
    let mut wal: Vec<PathBuf> = fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| fs::metadata(p).unwrap().len() > 0)
        .collect();
    wal.sort();
    wal.pop().unwrap()
}

/// Where each frame of a WAL file starts (`[len u32][crc u32][body]`, back to back from 0,
/// until a header of zeros or the end of the file).
fn frames(path: &Path) -> Vec<usize> {
    let bytes = fs::read(path).unwrap();
    let mut starts = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() && bytes[at..at + 8] != [0; 8] {
        starts.push(at);
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    starts
}

fn pending(dir: &Path) -> Result<u64, StoreError> {
    let engine = Engine::open(dir, EngineOptions::default())?;
    Ok(engine.counts(&queue(), NOW + 1_000_000).unwrap().pending)
}

/// Asserts a refusal naming `wal` at `offset` and telling to cut it at `cut_at`; then cuts it
/// there, as the message says, and checks the open goes on with the `calls` before.
fn assert_refused_then_cut(dir: &Path, wal: &Path, offset: usize, cut_at: usize, calls: u64) {
    match pending(dir) {
        Err(StoreError::Corrupt { location, detail }) => {
            let name = wal.file_name().unwrap().to_str().unwrap();
            assert!(
                location.ends_with(&format!("{name} at offset {offset}")),
                "{location}"
            );
            assert!(
                detail.contains(&format!("truncate -s {cut_at} {}", wal.display())),
                "{detail}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let file = OpenOptions::new().write(true).open(wal).unwrap();
    file.set_len(cut_at as u64).unwrap();
    drop(file);
    assert_eq!(pending(dir).unwrap(), calls * TASKS_PER_CALL);
}

fn zero_from(path: &Path, offset: usize) {
    let len = fs::metadata(path).unwrap().len() as usize;
    let file = OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &vec![0u8; len - offset], offset as u64)
        .unwrap();
}

#[test]
fn a_wal_zeroed_from_a_frame_to_its_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = crashed_with_wal(dir.path());
    // Frame n is put call n (the queue was made in the file before). 30 calls zeroed: 1.5 MiB.
    let at = frames(&wal)[10];
    zero_from(&wal, at);
    assert_refused_then_cut(dir.path(), &wal, at, at, 10);
}

#[test]
fn a_wal_zeroed_from_inside_a_frame_to_its_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = crashed_with_wal(dir.path());
    let starts = frames(&wal);
    let (at, declared_end) = (starts[10], starts[11]);
    zero_from(&wal, at + 3_000);
    assert_refused_then_cut(dir.path(), &wal, declared_end, at, 10);
}

#[test]
fn a_damaged_length_field_is_refused_not_cut_as_a_torn_tail() {
    // Longer than the file (read as a frame cut short), mid-file and in the last frame; a
    // little longer in the last frame (its end then lies in zeros prepared ahead, or past
    // the end of the file).
    let last = CALLS as usize - 1;
    for (frame, added) in [(20, 0x0100_0000), (last, 0x0100_0000), (last, 7)] {
        let dir = tempfile::tempdir().unwrap();
        let wal = crashed_with_wal(dir.path());
        let at = frames(&wal)[frame];
        let mut bytes = fs::read(&wal).unwrap();
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) + added;
        bytes[at..at + 4].copy_from_slice(&len.to_le_bytes());
        fs::write(&wal, &bytes).unwrap();
        match pending(dir.path()) {
            Err(StoreError::Corrupt { location, detail }) => {
                assert!(
                    location.ends_with(&format!(".wal at offset {at}")),
                    "{location}"
                );
                assert!(
                    detail.contains("length field is damaged"),
                    "{frame} {added}: {detail}"
                );
            }
            other => panic!("frame {frame} length + {added}: expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn a_torn_last_frame_is_still_cut() {
    // Cut at many points of the last frame, header included: each is a write the crash cut
    // short, and the open drops only that call.
    let template = tempfile::tempdir().unwrap();
    let wal = crashed_with_wal(template.path());
    let relative = wal.strip_prefix(template.path()).unwrap().to_path_buf();
    let last = *frames(&wal).last().unwrap();
    let log_end = belfry_store::engine::record::wal_log_len(&fs::read(&wal).unwrap());
    for cut in [last + 2, last + 8, last + 30, last + 1_000, log_end - 1] {
        let dir = tempfile::tempdir().unwrap();
        for entry in walk(template.path()) {
            let target = dir
                .path()
                .join(entry.strip_prefix(template.path()).unwrap());
            fs::create_dir_all(target.parent().unwrap()).unwrap();
            fs::copy(&entry, target).unwrap();
        }
        let wal = dir.path().join(&relative);
        let file = OpenOptions::new().write(true).open(&wal).unwrap();
        file.set_len(cut as u64).unwrap();
        drop(file);
        assert_eq!(
            pending(dir.path()).unwrap(),
            (CALLS - 1) * TASKS_PER_CALL,
            "cut at {cut}"
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
