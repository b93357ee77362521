//! The worker loop against a real server on a manual clock: leases on the server's clock
//! (moved by the tests), the worker's own timers (extensions, grace) in real time, short.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_client::{
    Error, ErrorCode, LeaseRequest, Leased, NewTask, QueueSpec, RetrySpec, TaskError, Worker,
    WorkerReport,
};
use common::{eventually, Harness, T0};
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A worker running in the background, and what stops it.
struct Running {
    stop: CancellationToken,
    run: JoinHandle<Result<WorkerReport, Error>>,
}

impl Running {
    fn start<H, F>(worker: Worker, handler: H) -> Self
    where
        H: Fn(Leased) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let run = tokio::spawn(worker.run(handler, stop.clone().cancelled_owned()));
        Running { stop, run }
    }

    /// Asks the worker to stop, and waits (at most 10 s) for its report.
    async fn stop(self) -> WorkerReport {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.run)
            .await
            .expect("the worker stops")
            .unwrap()
            .unwrap()
    }
}

async fn submit(h: &Harness, queue: &str, payload: serde_json::Value) -> String {
    h.client
        .submit(queue, &NewTask::json(payload))
        .await
        .unwrap()
        .id
}

async fn state(h: &Harness, queue: &str, id: &str) -> String {
    h.client.get_task(queue, id).await.unwrap().state
}

#[tokio::test]
async fn tasks_are_handled_and_acked() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(submit(&h, "q", json!(n)).await);
    }
    let (seen, mut seen_rx) = mpsc::unbounded_channel();
    let worker = Worker::new(h.client.clone(), "q").concurrency(2);
    let running = Running::start(worker, move |task: Leased| {
        let seen = seen.clone();
        async move {
            seen.send(task.payload.unwrap()).unwrap();
            Ok(())
        }
    });
    let mut payloads = Vec::new();
    for _ in 0..5 {
        payloads.push(seen_rx.recv().await.unwrap());
    }
    payloads.sort_by_key(|p| p.as_u64());
    assert_eq!(payloads, [json!(0), json!(1), json!(2), json!(3), json!(4)]);
    for id in &ids {
        eventually("the task is acked", || async {
            state(&h, "q", id).await == "done"
        })
        .await;
    }
    let report = running.stop().await;
    assert_eq!(
        report,
        WorkerReport {
            acked: 5,
            ..WorkerReport::default()
        }
    );
    h.stop().await;
}

/// A handler's error is the nack's reason: the task comes back when the handler asks (at
/// once, or in a minute), and after its last attempt is a dead letter that keeps the reason.
#[tokio::test]
async fn a_failing_handler_nacks_and_its_last_attempt_is_a_dead_letter() {
    let h = Harness::start().await;
    let retry = RetrySpec {
        max_attempts: Some(2),
        ..RetrySpec::default()
    };
    let spec = QueueSpec {
        retry: Some(retry),
        ..QueueSpec::default()
    };
    h.client.put_queue("q", &spec).await.unwrap();
    let failing = submit(&h, "q", json!("fail")).await;
    let later = submit(&h, "q", json!("later")).await;
    let worker = Worker::new(h.client.clone(), "q").concurrency(2);
    let running = Running::start(worker, |task: Leased| async move {
        match task.payload.unwrap().as_str() {
            Some("fail") => {
                Err(TaskError::new(format!("boom {}", task.attempt)).retry_in(Duration::ZERO))
            }
            _ => Err(TaskError::new("not yet").retry_in(Duration::from_secs(60))),
        }
    });
    eventually("the failing task is dead", || async {
        state(&h, "q", &failing).await == "dead"
    })
    .await;
    let dead = h.client.list_dead("q", None, None).await.unwrap();
    assert_eq!(dead.tasks.len(), 1);
    let reason = dead.tasks[0].dead_reason.clone().unwrap();
    assert!(
        reason.ends_with(": boom 2"),
        "the last attempt's reason: {reason}"
    );
    assert_eq!(dead.tasks[0].attempts, 2);
    let task = h.client.get_task("q", &later).await.unwrap();
    assert_eq!((task.state.as_str(), task.attempts), ("scheduled", 1));
    assert_eq!(task.due_at_ms, T0 + 60_000, "due when the handler asked");
    let report = running.stop().await;
    assert_eq!(
        (report.acked, report.nacked, report.dead_lettered),
        (0, 3, 1),
        "{report:?}"
    );
    h.stop().await;
}

/// A handler that panics fails its task, with what it said as the reason.
#[tokio::test]
async fn a_panicking_handler_nacks_its_task() {
    let h = Harness::start().await;
    let spec = QueueSpec {
        retry: Some(RetrySpec {
            max_attempts: Some(1),
            ..RetrySpec::default()
        }),
        ..QueueSpec::default()
    };
    h.client.put_queue("q", &spec).await.unwrap();
    let id = submit(&h, "q", json!(1)).await;
    let running = Running::start(Worker::new(h.client.clone(), "q"), |_task: Leased| async {
        panic!("kaboom")
    });
    eventually("the task is dead", || async {
        state(&h, "q", &id).await == "dead"
    })
    .await;
    let task = h.client.get_task("q", &id).await.unwrap();
    let reason = task.dead_reason.unwrap();
    assert!(reason.contains("panicked: kaboom"), "{reason}");
    assert_eq!(running.stop().await.dead_lettered, 1);
    h.stop().await;
}

/// A handler that runs past its lease's end (on the server's clock) keeps the task: the
/// worker extended the lease at half its visibility, so another consumer does not get it.
#[tokio::test]
async fn a_slow_handler_keeps_its_lease() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    let id = submit(&h, "q", json!("slow")).await;
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let finish = Arc::new(Semaphore::new(0));
    let worker = Worker::new(h.client.clone(), "q").visibility(Duration::from_secs(1));
    let running = Running::start(worker, {
        let finish = finish.clone();
        move |_task: Leased| {
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                started.send(()).unwrap();
                let _done = finish.acquire().await.unwrap();
                Ok(())
            }
        }
    });
    started_rx.recv().await.unwrap();
    let leased_until = |h: &Harness| {
        let client = h.client.clone();
        let id = id.clone();
        async move {
            let task = client.get_task("q", &id).await.unwrap();
            task.lease_until_ms.unwrap()
        }
    };
    assert_eq!(leased_until(&h).await, T0 + 1_000);
    h.advance(600);
    eventually("the lease is extended", || async {
        leased_until(&h).await == T0 + 1_600
    })
    .await;
    h.advance(600);
    let other = LeaseRequest {
        max: Some(10),
        ..LeaseRequest::default()
    };
    let taken = h.client.lease("q", &other).await.unwrap();
    assert!(taken.is_empty(), "delivered twice: {taken:?}");
    finish.add_permits(1);
    eventually("the task is acked", || async {
        state(&h, "q", &id).await == "done"
    })
    .await;
    let task = h.client.get_task("q", &id).await.unwrap();
    assert_eq!(task.attempts, 1);
    assert_eq!(running.stop().await.acked, 1);
    h.stop().await;
}

/// Handlers counting themselves in and out, each waiting for a permit the test gives.
struct Gate {
    running: AtomicUsize,
    most: AtomicUsize,
    open: Semaphore,
}

impl Gate {
    async fn pass(&self) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.open.acquire().await.unwrap().forget();
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn no_more_handlers_run_than_the_concurrency_allows() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    for n in 0..8 {
        submit(&h, "q", json!(n)).await;
    }
    let gate = Arc::new(Gate {
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        open: Semaphore::new(0),
    });
    let worker = Worker::new(h.client.clone(), "q").concurrency(3);
    let running = Running::start(worker, {
        let gate = gate.clone();
        move |_task: Leased| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok(())
            }
        }
    });
    eventually("three handlers run", || async {
        gate.running.load(Ordering::SeqCst) == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 3);
    let queue = h.client.get_queue("q").await.unwrap();
    assert_eq!(queue.in_flight, Some(3), "no task waits leased: {queue:?}");
    gate.open.add_permits(8);
    eventually("every task is acked", || async {
        let queue = h.client.get_queue("q").await.unwrap();
        (queue.pending, queue.in_flight) == (Some(0), Some(0))
    })
    .await;
    assert_eq!(running.stop().await.acked, 8);
    assert_eq!(gate.most.load(Ordering::SeqCst), 3);
    h.stop().await;
}

/// At shutdown the worker leases nothing more and lets a running handler finish.
#[tokio::test]
async fn shutdown_lets_running_handlers_finish() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    let first = submit(&h, "q", json!(1)).await;
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let finish = Arc::new(Semaphore::new(0));
    let worker = Worker::new(h.client.clone(), "q").shutdown_grace(Duration::MAX);
    let running = Running::start(worker, {
        let finish = finish.clone();
        move |_task: Leased| {
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                started.send(()).unwrap();
                finish.acquire().await.unwrap().forget();
                Ok(())
            }
        }
    });
    started_rx.recv().await.unwrap();
    running.stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.run.is_finished(), "waits for its handler");
    let second = submit(&h, "q", json!(2)).await;
    finish.add_permits(2);
    let report = running.stop().await;
    assert_eq!(report.acked, 1, "{report:?}");
    assert_eq!(state(&h, "q", &first).await, "done");
    let second = h.client.get_task("q", &second).await.unwrap();
    assert_eq!((second.state.as_str(), second.attempts), ("scheduled", 0));
    h.stop().await;
}

/// Sets its flag when dropped: whether a handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A handler still running at the end of the shutdown grace is dropped, and its task given
/// back, due at once.
#[tokio::test]
async fn past_the_grace_a_running_task_is_given_back() {
    let h = Harness::start().await;
    h.pull_queue("q").await;
    let id = submit(&h, "q", json!(1)).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let worker = Worker::new(h.client.clone(), "q").shutdown_grace(Duration::from_millis(200));
    let running = Running::start(worker, {
        let dropped = dropped.clone();
        move |_task: Leased| {
            let flag = DropFlag(dropped.clone());
            let started = started.clone();
            async move {
                let _flag = flag;
                started.send(()).unwrap();
                std::future::pending::<()>().await;
                Ok(())
            }
        }
    });
    started_rx.recv().await.unwrap();
    let report = running.stop().await;
    assert_eq!(
        report,
        WorkerReport {
            given_back: 1,
            ..WorkerReport::default()
        }
    );
    assert!(dropped.load(Ordering::SeqCst), "the handler was dropped");
    let task = h.client.get_task("q", &id).await.unwrap();
    assert_eq!((task.state.as_str(), task.due_at_ms), ("scheduled", T0));
    h.stop().await;
}

/// A lease that cannot succeed ends the run with its error.
#[tokio::test]
async fn a_missing_queue_ends_the_run() {
    let h = Harness::start().await;
    let worker = Worker::new(h.client.clone(), "nowhere");
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        worker.run(|_task: Leased| async { Ok(()) }, std::future::pending()),
    )
    .await
    .expect("the run ends");
    assert!(
        matches!(&ended, Err(e) if e.code() == Some(&ErrorCode::QueueNotFound)),
        "{ended:?}"
    );
    h.stop().await;
}
