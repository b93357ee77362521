//! Reopening does not read far-future tasks: restart work depends on the WAL written since the
//! last checkpoint and on the near window, not on how many tasks are pending far out.

use belfry_core::{NewTask, QueueName};
use std::time::Duration;

use belfry_store::{Engine, EngineOptions, FsyncPolicy, Store};
use bytes::Bytes;

const DAY_MS: u64 = 24 * 3_600_000;
const NOW: u64 = 1_700_000_000_000;

fn far_tasks(queue: &QueueName, count: usize, offset: usize) -> Vec<NewTask> {
    (0..count)
        .map(|i| {
            let n = (i + offset) as u64;
            // Spread over a year, starting 30 days out.
            let due = NOW + 30 * DAY_MS + (n * 7_919 % 335) * DAY_MS + n % 86_400_000;
            NewTask::new(queue.clone(), due, Bytes::from(format!("far-{n}")))
        })
        .collect()
}

#[test]
fn reopen_reads_no_far_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("q").unwrap();
    let far = 20_000;
    {
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        engine.put_queue(&queue, Bytes::new()).unwrap();
        // Tell the engine what time it is, so far tasks go to wide buckets.
        engine.counts(&queue, NOW).unwrap();
        for chunk in 0..far / 1_000 {
            engine.put(far_tasks(&queue, 1_000, chunk * 1_000)).unwrap();
        }
        engine
            .put(vec![NewTask::new(queue.clone(), NOW + 1_000, "near")])
            .unwrap();
        engine.flush().unwrap();
        // After the checkpoint, a few more tasks only in the WAL.
        engine.put(far_tasks(&queue, 10, far)).unwrap();
    }
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let stats = engine.stats();
    assert_eq!(stats.wal_records_replayed, 10, "{stats:?}");
    assert_eq!(stats.records_loaded, 0, "{stats:?}");
    assert!(stats.buckets_total < 400, "{stats:?}");
    // Counting and claiming near tasks read only the near bucket.
    let counts = engine.counts(&queue, NOW + 1_000).unwrap();
    assert_eq!(counts.pending, far as u64 + 11);
    assert_eq!(counts.due, 1);
    let batch = engine.claim(&queue, NOW + 1_000, 10, 1_000).unwrap();
    assert_eq!(batch.leased.len(), 1);
    assert_eq!(&batch.leased[0].task.payload[..], b"near");
    let leased = &batch.leased[0];
    engine
        .ack(&queue, leased.task.id, leased.lease_id, NOW + 1_000)
        .unwrap();
    let stats = engine.stats();
    assert!(stats.records_loaded <= 1, "{stats:?}");
    assert_eq!(stats.buckets_in_memory, 1, "{stats:?}");
    // next_due_ms knows the earliest far task without reading it.
    let next = engine.next_due_ms(&queue).unwrap().unwrap();
    assert!(next >= NOW + 30 * DAY_MS);
    assert_eq!(engine.stats().records_loaded, stats.records_loaded);
    // Time passes: far buckets load as they come due, and every task is there.
    let end = NOW + 400 * DAY_MS;
    let mut drained = 1; // the near one
    loop {
        let batch = engine.claim(&queue, end, 1_000, 1_000).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        for leased in &batch.leased {
            assert!(leased.task.due_at_ms <= end);
            assert!(leased.task.payload.starts_with(b"far-"));
        }
        drained += batch.leased.len();
    }
    assert_eq!(drained, far + 11);
}

#[test]
fn finished_buckets_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("q").unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    engine.put_queue(&queue, Bytes::new()).unwrap();
    engine.counts(&queue, NOW).unwrap();
    let tasks = (0..100)
        .map(|i| NewTask::new(queue.clone(), NOW + i * 60_000, "x"))
        .collect();
    engine.put(tasks).unwrap();
    engine.flush().unwrap();
    assert!(engine.stats().buckets_total > 1);
    let end = NOW + 200 * 60_000;
    let batch = engine.claim(&queue, end, 1_000, 1_000).unwrap();
    assert_eq!(batch.leased.len(), 100);
    for leased in batch.leased {
        engine
            .ack(&queue, leased.task.id, leased.lease_id, end)
            .unwrap();
    }
    engine.flush().unwrap();
    assert_eq!(engine.stats().buckets_total, 0);
    let files = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("q-"))
        .flat_map(|e| std::fs::read_dir(e.path()).unwrap())
        .count();
    assert_eq!(files, 0, "bucket files left behind");
}

#[test]
fn every_fsync_policy_keeps_data_across_reopen() {
    for fsync in [
        FsyncPolicy::Always,
        FsyncPolicy::Interval(Duration::from_millis(5)),
        FsyncPolicy::Never,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let queue = QueueName::new("q").unwrap();
        let options = EngineOptions {
            fsync,
            ..EngineOptions::default()
        };
        let ids: Vec<_> = {
            let engine = Engine::open(dir.path(), options.clone()).unwrap();
            engine.put_queue(&queue, Bytes::new()).unwrap();
            (0..20)
                .map(|i| {
                    engine
                        .put(vec![NewTask::new(queue.clone(), NOW + i, "x")])
                        .unwrap()[0]
                        .id()
                })
                .collect()
        };
        let engine = Engine::open(dir.path(), options).unwrap();
        for id in ids {
            assert!(engine.get(&queue, id, NOW).unwrap().is_some(), "{fsync:?}");
        }
    }
}

#[test]
fn lookups_of_far_tasks_do_not_keep_far_buckets_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let queue = QueueName::new("q").unwrap();
    let options = EngineOptions {
        far_loaded_tasks_max: 100,
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir.path(), options).unwrap();
    engine.put_queue(&queue, Bytes::new()).unwrap();
    engine.counts(&queue, NOW).unwrap();
    // 30 day buckets, 50 tasks each, 100 to 130 days out.
    let tasks: Vec<NewTask> = (0..1_500u64)
        .map(|i| NewTask::new(queue.clone(), NOW + (100 + i % 30) * DAY_MS + i, "far"))
        .collect();
    let ids: Vec<_> = engine.put(tasks).unwrap().iter().map(|o| o.id()).collect();
    engine.flush().unwrap();
    assert_eq!(engine.stats().buckets_in_memory, 0);
    for id in ids.iter().take(30) {
        assert_eq!(
            engine.cancel(&queue, *id, NOW).unwrap(),
            belfry_store::ChangeOutcome::Ok
        );
        assert!(engine.get(&queue, ids[1_000], NOW).unwrap().is_some());
        // Never more than the cap's worth of far tasks, plus the bucket in use.
        assert!(
            engine.stats().buckets_in_memory <= 3,
            "{:?}",
            engine.stats()
        );
    }
    let counts = engine.counts(&queue, NOW).unwrap();
    assert_eq!(counts.pending, 1_470);
}
