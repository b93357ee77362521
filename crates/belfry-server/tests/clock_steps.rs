//! The wall clock stepping back or forward by hours (an NTP step, a VM migration) never
//! delivers a task early and never loses one, through the server's dispatch loop and pull
//! leases alike. The clock is a manual one, stepped by the test without moving monotonic time.

mod common;

use std::sync::Arc;

use belfry_store::MemoryStore;
use common::faults::{RecordingSink, RecordingSinks};
use common::{eventually, test_config, TestServer, T0};
use serde_json::json;

const HOUR: u64 = 3_600_000;

/// Steps the wall clock to `at` (monotonic time does not move) and waits for a dispatch turn
/// that started after the step, so what the test sees next is the dispatcher's answer to it.
async fn step_to(s: &TestServer, at: u64) {
    let turns = s.handle.service().dispatch_stats().turns;
    s.clock.set_wall_ms(at);
    s.handle.wake_all();
    eventually("a dispatch turn after the step", || async {
        (s.handle.service().dispatch_stats().turns > turns).then_some(())
    })
    .await;
}

/// A server on a manual clock whose push sink records what it is handed, with one push queue
/// `push`.
async fn start_with_push_queue() -> (TestServer, Arc<RecordingSink>) {
    let sink = Arc::new(RecordingSink::default());
    let s = TestServer::start_with_sinks(
        test_config(),
        Arc::new(MemoryStore::new()),
        Some(Arc::new(RecordingSinks(sink.clone()))),
        None,
    )
    .await;
    s.queue(
        "push",
        json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/unused"}}),
    )
    .await;
    (s, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_never_deliver_early_nor_lose_a_task() {
    let (s, sink) = start_with_push_queue().await;
    s.queue("pull", json!({})).await;
    // Due in ten seconds and in two hours, on both kinds of queue.
    for queue in ["push", "pull"] {
        s.submit(queue, json!({"payload": 1, "run_at_ms": T0 + 10_000}))
            .await;
        s.submit(queue, json!({"payload": 2, "run_at_ms": T0 + 2 * HOUR}))
            .await;
    }

    // The clock steps back an hour: nothing is due, and nothing may go out.
    step_to(&s, T0 - HOUR).await;
    assert_eq!(sink.count(), 0, "delivered before due after a step back");
    assert!(s.lease("pull", json!({"max": 10})).await.is_empty());

    // Forward to just before the first due time: still nothing.
    step_to(&s, T0 + 9_999).await;
    assert_eq!(sink.count(), 0);
    assert!(s.lease("pull", json!({"max": 10})).await.is_empty());

    // A step forward of three hours: both tasks of each queue are due and delivered, once.
    s.clock.set_wall_ms(T0 + 3 * HOUR);
    s.handle.wake_all();
    eventually("both push tasks delivered", || async {
        (sink.count() == 2).then_some(())
    })
    .await;
    let leased = s
        .lease("pull", json!({"max": 10, "visibility_ms": 60_000}))
        .await;
    assert_eq!(leased.len(), 2, "a pull task was lost");
    for seen in sink.seen() {
        assert!(seen.now_ms >= seen.due_at_ms, "{seen:?} delivered early");
    }

    // Steps back again while the pull tasks are leased: the leases hold (they end on the wall
    // clock, which is now behind them), and nothing is handed out twice meanwhile.
    s.clock.set_wall_ms(T0 + 2 * HOUR + 1);
    assert!(s.lease("pull", json!({"max": 10})).await.is_empty());
    // Past the lease deadline (wall time), the tasks are due again: at-least-once, not lost.
    s.clock.set_wall_ms(T0 + 3 * HOUR + 60_001);
    s.handle.wake_all();
    let again = s.lease("pull", json!({"max": 10})).await;
    assert_eq!(
        again.len(),
        2,
        "expired leases must make the tasks due again"
    );
    assert_eq!(sink.count(), 2, "a push task was delivered twice");
    s.handle.stop().await.expect("clean stop");
}

/// A step forward is noticed by the dispatcher itself, without anyone waking the queues: a
/// task that the step made due goes out within a couple of the dispatcher's clock checks,
/// well before its queue's own rare recheck would have found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_step_is_noticed_without_a_wake_up() {
    use belfry_server::dispatch::EMPTY_RECHECK_MS;
    use std::time::{Duration, Instant};

    let (s, sink) = start_with_push_queue().await;
    let turns = s.handle.service().dispatch_stats().turns;
    s.submit("push", json!({"payload": 1, "run_at_ms": T0 + HOUR}))
        .await;
    // The dispatcher has looked at the queue since the submit: its timer is now set from the
    // task's due time, an hour of monotonic time away (at most the recheck).
    eventually("a dispatch turn after the submit", || async {
        (s.handle.service().dispatch_stats().turns > turns).then_some(())
    })
    .await;
    assert_eq!(sink.count(), 0);

    let stepped = Instant::now();
    s.clock.set_wall_ms(T0 + HOUR + 1);
    eventually("the task delivered after the step", || async {
        (sink.count() == 1).then_some(())
    })
    .await;
    let took = stepped.elapsed();
    assert!(
        took < Duration::from_millis(EMPTY_RECHECK_MS / 2),
        "the step was found by the queue's recheck ({took:?}), not noticed by the dispatcher"
    );
    let seen = &sink.seen()[0];
    assert!(seen.now_ms >= seen.due_at_ms, "{seen:?} delivered early");
    s.handle.stop().await.expect("clean stop");
}
