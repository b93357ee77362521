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
                            ..
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

/// Puts 1 KiB tasks due at `due` until the reserve refuses one; returns their ids.
fn fill_with_puts(engine: &Engine, queue: &QueueName, due: u64) -> Vec<TaskId> {
    let mut ids = Vec::new();
    loop {
        let task = NewTask::new(queue.clone(), due, vec![b'x'; 1024]);
        match engine.put(vec![task]) {
            Ok(outcomes) => ids.push(outcomes[0].id()),
            Err(StoreError::DiskFull { .. }) => return ids,
            Err(other) => panic!("a put failed with {other} instead of DiskFull"),
        }
    }
}

/// Issue #12: a consumer that leases and never acks (it times out, or crashes) used to write
/// lease records into the reserve until the disk was full; the engine stopped and could not
/// even reopen. Claims now stop at the delivery floor with `DiskFull`, acks still go on
/// below it, checkpoints still run, and the directory reopens with every task.
#[test]
fn leases_without_acks_stop_at_the_delivery_floor_instead_of_filling_the_disk() {
    let disk = Tmpfs::mount("8m");
    let data = disk.path().join("data");
    let queue = QueueName::new("q").unwrap();
    let engine = Engine::open(&data, options()).expect("the engine opens");
    engine.put_queue(&queue, bytes::Bytes::new()).unwrap();
    let ids = fill_with_puts(&engine, &queue, NOW);
    assert!(ids.len() > 1_000, "only {} puts", ids.len());
    // A lease held the whole time, acked once claims are refused.
    let held = engine.claim(&queue, NOW, 20, 3_600_000).unwrap();
    assert_eq!(held.leased.len(), 20);
    // Leases of 1 ms, never acked, each claim a little later: they expire and are taken again.
    let mut refusal = None;
    for round in 1..200_000u64 {
        match engine.claim(&queue, NOW + 2 * round, 500, 1) {
            Ok(batch) => assert!(!batch.leased.is_empty(), "round {round}: nothing to lease"),
            Err(error @ StoreError::DiskFull { .. }) => {
                refusal = Some(error);
                break;
            }
            Err(other) => panic!("round {round}: a claim failed with {other}"),
        }
    }
    let refusal = refusal.expect("claims were never refused");
    let StoreError::DiskFull {
        free_bytes,
        floor_bytes,
        reserve_bytes,
        ..
    } = refusal
    else {
        unreachable!()
    };
    assert_eq!(floor_bytes, reserve_bytes / 4, "{refusal}");
    assert!(free_bytes < reserve_bytes, "{refusal}");
    assert!(refusal.to_string().contains("kept for acks"), "{refusal}");
    // Extensions (as repeatable) stop there too, and then nacks; acks go on below it.
    let (first, rest) = held.leased.split_first().unwrap();
    let mut extended = 0;
    loop {
        let until = NOW + 3_600_000 + extended;
        match engine.extend(&queue, first.task.id, first.lease_id, until, NOW) {
            Ok(outcome) => assert_eq!(outcome, belfry_store::LeaseOutcome::Ok),
            Err(StoreError::DiskFull { .. }) => break,
            Err(other) => panic!("an extension failed with {other}"),
        }
        extended += 1;
        assert!(extended < 100_000, "extensions were never refused");
    }
    assert!(matches!(
        engine.nack(&queue, first.task.id, first.lease_id, NOW + 1_000_000, NOW),
        Err(StoreError::DiskFull { .. })
    ));
    let acks: Vec<(TaskId, LeaseId)> = rest.iter().map(|l| (l.task.id, l.lease_id)).collect();
    let outcomes = engine
        .ack_many(&queue, &acks, NOW)
        .expect("acks below the floor");
    assert!(outcomes
        .iter()
        .all(|o| *o == belfry_store::LeaseOutcome::Ok));
    assert!(
        !matches!(engine.health(), StoreHealth::Poisoned(_)),
        "{:?}",
        engine.health()
    );
    engine.flush().expect("a checkpoint still has room");

    // A crash, then a reopen: it finds the room it needs, and every task is there.
    engine.abandon();
    let engine = Engine::open(&data, options()).expect("the engine reopens");
    let acked: HashSet<TaskId> = acks.iter().map(|(id, _)| *id).collect();
    for id in &ids {
        let task = engine.get(&queue, *id, NOW).unwrap();
        match task {
            Some(_) => {}
            None if acked.contains(id) => {}
            None => panic!("task {id} lost"),
        }
    }
    drop(engine);
    std::thread::sleep(Duration::from_millis(10));
}

fn user_batch(batch: u64) -> Vec<belfry_core::UserId> {
    (0..500)
        .map(|i| belfry_core::UserId::new(format!("subscriber-{batch:06}-{i:04}")).unwrap())
        .collect()
}

/// Issue #12: merges of subscription runs write a copy of their inputs before deleting
/// them. On a disk filled by a bulk subscribe, the merge that settles the tree used to fail
/// with `ENOSPC` and stop the engine, and again after every restart. It is now postponed
/// while it would not leave the reserve, and runs once space is freed.
#[test]
fn a_merge_without_room_is_postponed_and_runs_once_space_is_freed() {
    let disk = Tmpfs::mount("16m");
    let data = disk.path().join("data");
    let filler = disk.path().join("other-program.log");
    fill(&filler, 7 * 1024 * 1024);
    let options = EngineOptions {
        subs_memtable_bytes: 256 * 1024,
        subs_settle_after: Some(Duration::from_millis(20)),
        ..options()
    };
    let engine = Engine::open(&data, options.clone()).expect("the engine opens");
    let mut batches = 0;
    loop {
        match engine.subscribe(1, &user_batch(batches)) {
            Ok(_) => batches += 1,
            Err(StoreError::DiskFull { .. }) => break,
            Err(other) => panic!("a subscribe failed with {other} instead of DiskFull"),
        }
        assert!(batches < 100_000, "the disk never filled");
    }
    assert!(batches > 20, "only {batches} batches");
    // Settle merges (every 20 ms of quiet) and size-tiered ones (after checkpoints) find no
    // room; the engine goes on.
    for _ in 0..10 {
        engine.flush().expect("a flush with a merge postponed");
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(
        !matches!(engine.health(), StoreHealth::Poisoned(_)),
        "{:?}",
        engine.health()
    );
    let count = engine.subscriber_count(1).unwrap();
    assert_eq!(count, batches * 500);
    let runs = std::fs::read_dir(data.join("subs")).unwrap().count();
    assert!(runs > 1, "{runs} runs: nothing left to merge");

    // A restart does not run into the same merge and stop.
    drop(engine);
    let engine = Engine::open(&data, options.clone()).expect("the engine reopens");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!matches!(engine.health(), StoreHealth::Poisoned(_)));

    // Space freed: the tree settles into one run, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        engine.flush().unwrap();
        if std::fs::read_dir(data.join("subs")).unwrap().count() == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runs never merged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(engine.subscriber_count(1).unwrap(), batches * 500);
    assert!(engine
        .is_subscribed(1, &user_batch(batches / 2)[7])
        .unwrap());
    drop(engine);
    std::thread::sleep(Duration::from_millis(10));
}

/// A directory whose disk another program filled after a crash: recovery needs room to copy
/// the WAL into bucket files and write a checkpoint. The open fails saying how much it needs
/// and how much there is, and succeeds, with every task, once that much is freed.
#[test]
fn an_open_without_room_to_recover_says_how_much_it_needs() {
    let disk = Tmpfs::mount("8m");
    let data = disk.path().join("data");
    let queue = QueueName::new("q").unwrap();
    let options = EngineOptions {
        // No checkpoint before the crash: the whole history is WAL to replay, its bucket
        // bytes only buffered. (The reserve would cap the checkpoint threshold at half of it.)
        free_space_reserve_bytes: 0,
        checkpoint_wal_bytes: 64 * 1024 * 1024,
        bucket_buffer_bytes: 64 * 1024 * 1024,
        buffers_total_bytes: 64 * 1024 * 1024,
        background_checkpoints: false,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&data, options.clone()).expect("the engine opens");
    engine.put_queue(&queue, bytes::Bytes::new()).unwrap();
    let tasks: Vec<NewTask> = (0..2_000)
        .map(|i| NewTask::new(queue.clone(), NOW + 3_600_000 + i, vec![b'x'; 1024]))
        .collect();
    let ids: Vec<TaskId> = engine.put(tasks).unwrap().iter().map(|o| o.id()).collect();
    engine.abandon();
    // Another program takes all but 256 KiB.
    let filler = disk.path().join("other-program.log");
    let free = free_bytes(disk.path());
    fill(&filler, (free - 256 * 1024) as usize);
    match Engine::open(&data, options.clone()) {
        Err(error @ StoreError::NoSpaceToOpen { .. }) => {
            let StoreError::NoSpaceToOpen {
                needed_bytes,
                wal_bytes,
                free_bytes,
                ..
            } = &error
            else {
                unreachable!()
            };
            assert!(*wal_bytes > 2_000 * 1024, "{error}");
            assert!(*needed_bytes >= *wal_bytes, "{error}");
            assert!(*free_bytes < *needed_bytes, "{error}");
            let text = error.to_string();
            assert!(text.contains("Nothing acknowledged was lost"), "{text}");
        }
        Err(other) => panic!("the open failed with {other} instead of NoSpaceToOpen"),
        Ok(_) => panic!("the open found room it should not have"),
    }
    std::fs::remove_file(&filler).unwrap();
    let engine = Engine::open(&data, options).expect("the engine reopens once space is freed");
    for id in ids {
        assert!(engine.get(&queue, id, NOW).unwrap().is_some(), "task {id}");
    }
    drop(engine);
    std::thread::sleep(Duration::from_millis(10));
}

/// Free bytes of the filesystem holding `path`, from `df`.
fn free_bytes(path: &Path) -> u64 {
    let output = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df's answer")
}
