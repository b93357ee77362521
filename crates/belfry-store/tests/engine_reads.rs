//! Claims read the put records of many tasks together (neighbours in a bucket file share one
//! read and one buffer). Whatever the layout — records in the file or still in the write
//! buffer, near or far apart, larger than one read, spread over buckets, interleaved with
//! cancelled tasks — every leased task must come back with exactly its own payload and
//! headers, before and after a reopen.

use std::collections::HashMap;

use belfry_core::{NewTask, QueueName, TaskId};
use belfry_store::{Engine, EngineOptions, PutOutcome, Store};
use bytes::Bytes;

const NOW: u64 = 1_700_000_000_000;
/// Near-now buckets are one minute wide: this spreads due times over several of them.
const BUCKET_STEP_MS: u64 = 61_000;
const VISIBILITY_MS: u64 = 30_000;

/// A payload of `len` bytes that no other task has.
fn payload(i: usize, len: usize) -> Bytes {
    let stamp = format!("task-{i}|");
    Bytes::from(
        stamp
            .bytes()
            .cycle()
            .take(len.max(stamp.len()))
            .collect::<Vec<u8>>(),
    )
}

/// Sizes chosen around the read-merging limits: tiny, a few KiB, more than the 16 KiB gap
/// that still merges, and more than the 1 MiB a single read covers.
fn size_of(i: usize) -> usize {
    match i % 11 {
        0 => 40 * 1024,
        5 => 5 * 1024,
        9 if i.is_multiple_of(3) => 1_100_000,
        _ => 10 + i % 90,
    }
}

fn options() -> EngineOptions {
    EngineOptions {
        // Small bucket buffers: some records are in the file, the newest still in memory.
        bucket_buffer_bytes: 4 * 1024,
        ..EngineOptions::default()
    }
}

/// Claims everything due in calls of `max` tasks and checks each task's bytes.
fn claim_all(
    engine: &Engine,
    q: &QueueName,
    now: u64,
    expected: &HashMap<TaskId, (Bytes, String)>,
) {
    let mut seen = 0;
    loop {
        let batch = engine.claim(q, now, 7, VISIBILITY_MS).unwrap();
        if batch.leased.is_empty() {
            break;
        }
        for leased in &batch.leased {
            let (bytes, header) = expected
                .get(&leased.task.id)
                .unwrap_or_else(|| panic!("leased a task never put: {}", leased.task.id));
            assert_eq!(&leased.task.payload, bytes, "payload of {}", leased.task.id);
            assert_eq!(
                leased.task.headers,
                vec![("x-task".to_string(), header.clone())]
            );
            seen += 1;
        }
    }
    assert_eq!(seen, expected.len(), "every live task leased once");
}

#[test]
fn leased_tasks_carry_their_own_bytes_whatever_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let q = QueueName::new("reads").unwrap();
    let other = QueueName::new("other").unwrap();
    let mut expected: HashMap<TaskId, (Bytes, String)> = HashMap::new();
    {
        let engine = Engine::open(dir.path(), options()).unwrap();
        engine.put_queue(&q, Bytes::new()).unwrap();
        engine.put_queue(&other, Bytes::new()).unwrap();
        let mut cancel = Vec::new();
        for round in 0..6 {
            let tasks: Vec<NewTask> = (0..40)
                .map(|k| {
                    let i = round * 40 + k;
                    let mut task = NewTask::new(
                        q.clone(),
                        NOW - (i as u64 % 4) * BUCKET_STEP_MS,
                        payload(i, size_of(i)),
                    );
                    task.headers = vec![("x-task".to_string(), i.to_string())];
                    task
                })
                .collect();
            let sent: Vec<(Bytes, String)> = tasks
                .iter()
                .map(|t| (t.payload.clone(), t.headers[0].1.clone()))
                .collect();
            let outcomes = engine.put(tasks).unwrap();
            for (k, (outcome, sent)) in outcomes.into_iter().zip(sent).enumerate() {
                let PutOutcome::Created { id, .. } = outcome else {
                    panic!("put refused: {outcome:?}");
                };
                // Every fifth task is cancelled: holes between the records a claim reads.
                if k % 5 == 2 {
                    cancel.push(id);
                } else {
                    expected.insert(id, sent);
                }
            }
            // Another queue's records between rounds.
            engine
                .put(vec![NewTask::new(
                    other.clone(),
                    NOW,
                    payload(9_999, 3_000),
                )])
                .unwrap();
        }
        for id in cancel {
            engine.cancel(&q, id, NOW).unwrap();
        }
        claim_all(&engine, &q, NOW, &expected);
    }
    // After a reopen everything is read from the files; the leases have run out.
    let engine = Engine::open(dir.path(), options()).unwrap();
    claim_all(&engine, &q, NOW + VISIBILITY_MS + 1, &expected);
}
