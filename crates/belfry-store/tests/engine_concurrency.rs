//! Many threads writing and claiming at once: every acknowledged task is stored exactly once,
//! survives a reopen, and is delivered exactly once while leases are held.

use std::collections::HashSet;
use std::sync::Arc;
use std::thread;

use belfry_core::{NewTask, QueueName};
use belfry_store::{Engine, EngineOptions, PutOutcome, Store};
use bytes::Bytes;

const THREADS: usize = 8;
const BATCHES: usize = 20;
const BATCH: usize = 50;

#[test]
fn concurrent_writers_share_commits_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("q").unwrap();
    let options = EngineOptions {
        // Small, so checkpoints run while writers are busy.
        checkpoint_wal_bytes: 64 * 1024,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::open(dir.path(), options.clone()).unwrap());
    engine.put_queue(&queue, Bytes::new()).unwrap();
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = Arc::clone(&engine);
            let queue = queue.clone();
            thread::spawn(move || {
                let mut ids = Vec::new();
                for b in 0..BATCHES {
                    let tasks = (0..BATCH)
                        .map(|i| {
                            let due = ((t * 7 + b * 13 + i) % 100) as u64 * 1_000;
                            NewTask::new(queue.clone(), due, Bytes::from(format!("{t}-{b}-{i}")))
                        })
                        .collect();
                    for outcome in engine.put(tasks).unwrap() {
                        match outcome {
                            PutOutcome::Created { id, .. } => ids.push(id),
                            other => panic!("{other:?}"),
                        }
                    }
                }
                ids
            })
        })
        .collect();
    let claimers: Vec<_> = (0..2)
        .map(|_| {
            let engine = Arc::clone(&engine);
            let queue = queue.clone();
            thread::spawn(move || {
                let mut seen = Vec::new();
                for _ in 0..200 {
                    let batch = engine.claim(&queue, 50_000, 20, 10_000_000).unwrap();
                    seen.extend(batch.leased.into_iter().map(|l| l.task.id));
                }
                seen
            })
        })
        .collect();
    let mut all = HashSet::new();
    for writer in writers {
        for id in writer.join().unwrap() {
            assert!(all.insert(id), "id {id} handed out twice");
        }
    }
    let mut claimed = HashSet::new();
    for claimer in claimers {
        for id in claimer.join().unwrap() {
            assert!(claimed.insert(id), "task {id} delivered twice under lease");
        }
    }
    assert_eq!(all.len(), THREADS * BATCHES * BATCH);
    // Every call's frame was written by some leader; never more writes than calls. (How many
    // calls share a write depends on scheduling, so it is printed, not asserted.)
    let stats = engine.stats();
    let calls = (THREADS * BATCHES + 2 * 200) as u64;
    assert!(
        stats.wal_writes >= 1 && stats.wal_writes <= calls,
        "{stats:?}"
    );
    assert!(
        stats.wal_syncs <= stats.wal_writes + stats.checkpoints,
        "{stats:?}"
    );
    println!(
        "{calls} calls, {} WAL writes, {} fsyncs",
        stats.wal_writes, stats.wal_syncs
    );
    drop(engine);
    let engine = Engine::open(dir.path(), options).unwrap();
    let counts = engine.counts(&queue, 50_000).unwrap();
    assert_eq!(counts.in_flight as usize, claimed.len());
    assert_eq!(counts.pending as usize + claimed.len(), all.len());
    for id in &all {
        assert!(engine.get(&queue, *id, 50_000).unwrap().is_some());
    }
    // The rest are all claimable once; the claimed ones stay leased.
    let rest = engine.claim(&queue, 200_000, 100_000, 10_000_000).unwrap();
    assert_eq!(rest.leased.len() + claimed.len(), all.len());
    for leased in rest.leased {
        assert!(!claimed.contains(&leased.task.id));
    }
}

/// Buckets emptied by acks are deleted by checkpoints while other threads keep putting into
/// the same buckets: nothing acknowledged is lost, nothing finished comes back.
#[test]
fn bucket_deletion_races_with_writers() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("q").unwrap();
    let options = EngineOptions {
        checkpoint_wal_bytes: 16 * 1024,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::open(dir.path(), options.clone()).unwrap());
    engine.put_queue(&queue, Bytes::new()).unwrap();
    let now = 1_700_000_000_000u64;
    engine.counts(&queue, now).unwrap();
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let engine = Arc::clone(&engine);
            let queue = queue.clone();
            thread::spawn(move || {
                let mut ids = Vec::new();
                for b in 0..60u64 {
                    // Due over a few minutes around now: a handful of 1-minute buckets.
                    let tasks = (0..10u64)
                        .map(|i| {
                            let due = now - 120_000 + ((t * 1_000 + b * 10 + i) % 6) * 60_000;
                            NewTask::new(queue.clone(), due.min(now), Bytes::from_static(b"w"))
                        })
                        .collect();
                    ids.extend(engine.put(tasks).unwrap().iter().map(|o| o.id()));
                }
                ids
            })
        })
        .collect();
    let ackers: Vec<_> = (0..2)
        .map(|_| {
            let engine = Arc::clone(&engine);
            let queue = queue.clone();
            thread::spawn(move || {
                let mut acked = Vec::new();
                for _ in 0..150 {
                    let batch = engine.claim(&queue, now, 10, 10_000_000).unwrap();
                    for leased in batch.leased {
                        let outcome = engine
                            .ack(&queue, leased.task.id, leased.lease_id, now)
                            .unwrap();
                        assert_eq!(outcome, belfry_store::LeaseOutcome::Ok);
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
        for id in acker.join().unwrap() {
            assert!(acked.insert(id), "{id} acked twice");
        }
    }
    engine.flush().unwrap();
    let counts = engine.counts(&queue, now).unwrap();
    assert_eq!(counts.pending as usize, put.len() - acked.len());
    drop(engine);
    let engine = Engine::open(dir.path(), options).unwrap();
    let rest = engine.claim(&queue, now, 100_000, 10_000_000).unwrap();
    let rest: HashSet<_> = rest.leased.iter().map(|l| l.task.id).collect();
    assert_eq!(rest.len(), put.len() - acked.len());
    assert!(rest.is_disjoint(&acked), "a finished task came back");
    assert!(rest.iter().all(|id| put.contains(id)));
}
