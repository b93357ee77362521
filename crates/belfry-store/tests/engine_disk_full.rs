//! A full disk, for real: the engine runs on a small tmpfs this test mounts (root only; the
//! test fails, never skips, when it cannot mount) and fills with a stream of puts from several
//! threads, next to another program's file. Puts are refused with `DiskFull` once free space
//! falls below the reserve, before anything changes; reads, claims and acks go on; removing
//! the other file makes puts succeed again without a restart; and after a crash-like reopen
//! every acknowledged task is there.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::{LeaseId, NewTask, QueueName, TaskId, TaskState};
use belfry_store::{Engine, EngineOptions, Store, StoreError, StoreHealth};

const NOW: u64 = 1_767_225_600_000;

#[path = "support/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

/// Writes `bytes` of another program's data to `path`.
fn fill(path: &Path, bytes: usize) {
    std::fs::write(path, vec![0x5a; bytes]).expect("write the filler file");
}

fn options() -> EngineOptions {
    EngineOptions {
        // Small checkpoints for a small disk: the WAL stays well inside the reserve (an
        // eighth of 8 MiB: 1 MiB).
        checkpoint_wal_bytes: 256 * 1024,
        ..EngineOptions::default()
    }
}

#[test]
fn a_full_disk_refuses_puts_keeps_every_acknowledged_task_and_takes_puts_again_once_freed() {
    let disk = Tmpfs::mount("8m");
    let data = disk.path().join("data");
    let filler = disk.path().join("other-program.log");
    fill(&filler, 2 * 1024 * 1024);
    let queue = QueueName::new("q").unwrap();
    let engine = Arc::new(Engine::open(&data, options()).expect("the engine opens"));
    engine.put_queue(&queue, bytes::Bytes::new()).unwrap();
    engine.counts(&queue, NOW).unwrap();

    // Four writers put 1 KiB tasks (some due now, most later) until each was refused 20 times.
    let acknowledged = Arc::new(Mutex::new(Vec::<TaskId>::new()));
    let failed = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let engine = Arc::clone(&engine);
            let queue = queue.clone();
            let acknowledged = Arc::clone(&acknowledged);
            let failed = Arc::clone(&failed);
            std::thread::spawn(move || {
                let mut refused = 0;
                let mut n = 0u64;
                while refused < 20 {
                    n += 1;
                    let due = if n.is_multiple_of(10) {
                        NOW
                    } else {
                        NOW + 3_600_000 + n
                    };
                    let task = NewTask::new(queue.clone(), due, vec![b'x'; 1024]);
                    match engine.put(vec![task]) {
                        Ok(outcomes) => acknowledged.lock().unwrap().push(outcomes[0].id()),
                        Err(StoreError::DiskFull {
                            free_bytes,
                            reserve_bytes,
                        }) => {
                            assert!(free_bytes < reserve_bytes + 4096, "writer {w}");
                            refused += 1;
                        }
                        Err(other) => {
                            failed.store(true, Ordering::Relaxed);
                            panic!("writer {w}: a put failed with {other} instead of DiskFull");
                        }
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a writer panicked");
    }
    assert!(!failed.load(Ordering::Relaxed));
    let mut acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 1_000,
        "only {} puts before the disk was full",
        acknowledged.len()
    );
    // Health says what the last refusal said. A checkpoint that was due may still finish after
    // the writers stopped and free old WAL files: then there is room again, a put succeeds,
    // and the disk is filled once more until refused. Checkpoints free a bounded amount, so
    // this ends; what must hold every round is that health and puts agree.
    for round in 0.. {
        assert!(round < 50, "health never agreed with the refusals");
        match engine.health() {
            StoreHealth::LowDiskSpace { .. } => break,
            StoreHealth::Healthy => loop {
                let task = NewTask::new(queue.clone(), NOW + 7_200_000, vec![b'y'; 1024]);
                match engine.put(vec![task]) {
                    Ok(outcomes) => acknowledged.push(outcomes[0].id()),
                    Err(StoreError::DiskFull { .. }) => break,
                    Err(other) => panic!("a put failed with {other} instead of DiskFull"),
                }
            },
            other => panic!("health {other:?} on a full disk"),
        }
    }

    // Reads and delivery state go on inside the reserve.
    let first = engine.get(&queue, acknowledged[0], NOW).unwrap();
    assert!(first.is_some_and(|t| t.state == TaskState::Scheduled));
    let batch = engine.claim(&queue, NOW, 50, 30_000).unwrap();
    assert!(!batch.leased.is_empty(), "nothing due to claim");
    let acks: Vec<(TaskId, LeaseId)> = batch
        .leased
        .iter()
        .map(|l| (l.task.id, l.lease_id))
        .collect();
    engine.ack_many(&queue, &acks, NOW).unwrap();
    let delivered: HashSet<TaskId> = acks.iter().map(|(id, _)| *id).collect();

    // Another program frees space: puts are taken again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let after = engine
        .put(vec![NewTask::new(queue.clone(), NOW + 7_200_000, "after")])
        .expect("a put once space is freed");
    assert_eq!(engine.health(), StoreHealth::Healthy);

    // A crash (no final fsync, no checkpoint), then a reopen: every acknowledged put is there.
    let engine = Arc::into_inner(engine).expect("the writers are gone");
    engine.abandon();
    let engine = Engine::open(&data, options()).expect("the engine reopens");
    let mut missing = Vec::new();
    for id in acknowledged.iter().copied().chain([after[0].id()]) {
        match engine.get(&queue, id, NOW).unwrap() {
            Some(task) if delivered.contains(&id) => assert_eq!(task.state, TaskState::Done),
            Some(task) => assert_eq!(task.state, TaskState::Scheduled, "task {id}"),
            // Finished tasks may be forgotten; nothing else may.
            None if delivered.contains(&id) => {}
            None => missing.push(id),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged tasks lost",
        missing.len(),
        acknowledged.len()
    );
    drop(engine);
    // Let the kernel close the files before the unmount.
    std::thread::sleep(Duration::from_millis(10));
}
