//! Two belfry nodes on one shared store behave as one service: a queue made or removed on
//! one is served or forgotten by the other, a task put on one is delivered once, by the node
//! that owns it, promptly, a schedule fires once per firing across both, through an
//! ownership change, a reminder fans out once, a change on one node empties the other's feed
//! caches (a periodic recheck keeps them, a resync empties them), and a token made on one node
//! works on the other until revoked there.
//!
//! The shared store is one `MemoryStore` behind a wrapper per node ([`NodeStore`]) that does
//! what a networked store does for its nodes: it announces every change to every node's
//! event sink (an in-test bus), and splits ownership between the nodes (by a stable hash of
//! the queue name or the work's key, or all to one node after the other "dies"). Both servers
//! run in this process on loopback, on one manual clock.

mod common;
mod two_nodes;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{Clock, QueueName, UserId};
use belfry_store::{MetaEvent, Store, StoreEvent};
use bytes::Bytes;
use common::{eventually, TestServer, T0};
use serde_json::{json, Value};
use two_nodes::{owned_by, owner_by_hash, NodeStore, Nodes, Split};

fn push_queue() -> Value {
    // The recording factory ignores the spec; a webhook spec makes it a push queue.
    json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/unused"}})
}

async fn queue_status(s: &TestServer, queue: &str) -> u16 {
    s.call("GET", &format!("/v1/queues/{queue}"), Value::Null)
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_made_on_one_node_is_served_by_the_other_and_each_task_delivered_once() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    // Owned by B, made on A: B must hear of it to deliver it at all.
    let queue = owned_by(1, "made-on-a");
    a.queue(&queue, push_queue()).await;
    eventually("B serves the queue made on A", || async {
        (queue_status(b, &queue).await == 200).then_some(())
    })
    .await;
    let id = b.submit(&queue, json!({"payload": {"n": 1}})).await;
    eventually("the task is delivered", || async {
        (nodes.delivered()[1] == 1).then_some(())
    })
    .await;
    let seen = nodes.sinks[1].seen();
    assert_eq!(seen[0].task.to_string(), id);
    assert_eq!(seen[0].queue, queue);
    // Acked through B's outcome writer: done in the shared store.
    eventually("the delivery is acked", || async {
        let task = a.task(&queue, &id).await;
        (task["state"] == "done").then_some(())
    })
    .await;
    assert_eq!(
        nodes.delivered(),
        [0, 1],
        "delivered by its owner only, once"
    );

    // A change on B (a pause) reaches A's copy of the configuration.
    b.ok(
        "POST",
        &format!("/v1/queues/{queue}/pause"),
        Value::Null,
        200,
    )
    .await;
    eventually("A sees the pause made on B", || async {
        let (_, got) = a
            .call("GET", &format!("/v1/queues/{queue}"), Value::Null)
            .await;
        (got["paused"] == true).then_some(())
    })
    .await;
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_on_one_node_disappears_from_the_other() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    a.queue("gone", json!({})).await;
    eventually("B serves the queue", || async {
        (queue_status(b, "gone").await == 200).then_some(())
    })
    .await;
    // A long-poll on A waits on the queue B is about to delete.
    let poll = {
        let http = a.http.clone();
        let url = format!("{}/v1/queues/gone/lease", a.base);
        tokio::spawn(async move {
            let answer = http
                .post(url)
                .json(&json!({"max": 1, "wait_ms": 15_000}))
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            (status, body)
        })
    };
    b.ok("DELETE", "/v1/queues/gone", Value::Null, 204).await;
    eventually("A forgets the queue deleted on B", || async {
        (queue_status(a, "gone").await == 404).then_some(())
    })
    .await;
    let (status, body) = poll.await.unwrap();
    assert_eq!(
        status, 404,
        "the long-poll ends with queue_not_found: {body}"
    );
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_from_the_other_node_makes_the_owner_deliver_at_once() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    let queue = owned_by(0, "woken");
    a.queue(&queue, push_queue()).await;
    eventually("B serves the queue", || async {
        (queue_status(b, &queue).await == 200).then_some(())
    })
    .await;
    // A's dispatcher has looked at the empty queue and set its next look at the 10 s
    // recheck: only the event can make it look sooner.
    eventually("A's dispatcher looked at the queue", || async {
        (a.handle.service().dispatch_stats().turns > 0).then_some(())
    })
    .await;
    let started = tokio::time::Instant::now();
    b.submit(&queue, json!({"payload": {"n": 1}})).await;
    eventually("A delivers the task put on B", || async {
        (nodes.delivered()[0] == 1).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(belfry_server::dispatch::EMPTY_RECHECK_MS / 2),
        "delivered after {took:?}: the recheck, not the wake"
    );
    assert_eq!(nodes.delivered(), [1, 0], "B does not own the queue");
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_once_per_firing_across_nodes_and_follows_its_owner() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    a.queue("ticks", json!({})).await;
    // Made on A; fired by whichever node owns it.
    let id = "every-second";
    let owner = owner_by_hash(&format!("schedule:{id}"));
    a.ok(
        "POST",
        "/v1/schedules",
        json!({"id": id, "queue": "ticks", "every_ms": 1000}),
        201,
    )
    .await;
    let pending = |n: u64| {
        let store = &nodes.shared.inner;
        let clock = nodes.clock.clone();
        async move {
            let counts = store
                .counts(&QueueName::new("ticks").unwrap(), clock.wall_ms())
                .unwrap();
            (counts.pending >= n).then_some(counts.pending)
        }
    };
    for firing in 1..=3u64 {
        nodes.advance(1_000);
        let got = eventually("the firing's task", || pending(firing)).await;
        assert_eq!(got, firing, "one task per firing, across both nodes");
    }
    let created = |node: usize| nodes.shared.firings_created[node].load(Ordering::SeqCst);
    assert_eq!(created(owner), 3, "the owner fired every firing");
    assert_eq!(created(1 - owner), 0, "the other node fired none");

    // The owner "dies": the other node takes the schedule over and fires what follows.
    nodes.shared.set_split(Split::Only(1 - owner));
    for firing in 4..=5u64 {
        nodes.advance(1_000);
        let got = eventually("the firing's task after the takeover", || pending(firing)).await;
        assert_eq!(got, firing, "one task per firing, across the takeover");
    }
    assert_eq!(
        created(1 - owner),
        2,
        "the new owner fired after the takeover"
    );
    assert_eq!(created(owner), 3);
    let _ = (a, b);
    nodes.stop().await;
}

/// A schedule made on A that B owns is read alone by B's runner, which fires it on time: the
/// create names the schedule, so B does not read every schedule again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_made_elsewhere_is_read_alone_by_its_owner() {
    let nodes = Nodes::start().await;
    let a = &nodes.servers[0];
    a.queue("ticks", json!({})).await;
    let id = (0..)
        .map(|i| format!("made-on-a-{i}"))
        .find(|id| owner_by_hash(&format!("schedule:{id}")) == 1)
        .unwrap();
    // The first recheck meets the write counts, and B reads every schedule once.
    nodes.handled(1, StoreEvent::Recheck).await;
    let lists = || nodes.shared.schedule_lists[1].load(Ordering::SeqCst);
    let before = lists();
    let body = json!({"id": id, "queue": "ticks", "every_ms": 1000});
    a.ok("POST", "/v1/schedules", body, 201).await;
    nodes.advance(1_000);
    let fired = |node: usize| nodes.shared.firings_created[node].load(Ordering::SeqCst);
    eventually("B fires it", || async { (fired(1) == 1).then_some(()) }).await;
    nodes.handled(1, StoreEvent::Recheck).await;
    assert_eq!(lists(), before, "B never read every schedule");
    assert_eq!(fired(0), 0, "A does not own it");
    nodes.stop().await;
}

/// The status of `GET /v1/queues` on `s` with `token`.
async fn list_with(s: &TestServer, token: &str) -> u16 {
    s.http
        .get(format!("{}/v1/queues", s.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_made_on_one_node_works_on_the_other_until_revoked_there() {
    let admin = "admin-token-for-both-nodes";
    let nodes = Nodes::start_with(Some(admin)).await;
    let [a, b] = &nodes.servers;
    let made: Value = a
        .http
        .post(format!("{}/v1/tokens", a.base))
        .bearer_auth(admin)
        .json(&json!({"name": "reader", "scopes": ["read"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reader = made["token"].as_str().expect("the token, once").to_owned();
    assert_eq!(list_with(a, &reader).await, 200);
    eventually("B accepts the token made on A", || async {
        (list_with(b, &reader).await == 200).then_some(())
    })
    .await;
    let revoked = b
        .http
        .delete(format!("{}/v1/tokens/reader", b.base))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(revoked, 204);
    assert_eq!(list_with(b, &reader).await, 401);
    eventually("A refuses the token revoked on B", || async {
        (list_with(a, &reader).await == 401).then_some(())
    })
    .await;
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_fans_out_once_on_its_owner_and_a_delete_elsewhere_leaves_every_feed() {
    const MINUTE: u64 = 60_000;
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    a.queue("chunks", json!({})).await;
    eventually("B serves the queue", || async {
        (queue_status(b, "chunks").await == 200).then_some(())
    })
    .await;
    let owner = owner_by_hash("reminder:kickoff");
    a.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "kickoff", "queue": "chunks", "delay_ms": MINUTE,
               "content": {"title": "Kick-off"}, "chunk_size": 2}),
        201,
    )
    .await;
    for user in ["u1", "u2", "u3", "u4"] {
        let (status, _) = b
            .call(
                "PUT",
                &format!("/v1/reminders/kickoff/subscribers/{user}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, 201);
    }
    nodes.advance(MINUTE);
    let chunks = |node: usize| nodes.shared.chunks_created[node].load(Ordering::SeqCst);
    eventually("the fan-out's two chunks", || async {
        (chunks(0) + chunks(1) >= 2).then_some(())
    })
    .await;
    assert_eq!(
        (chunks(owner), chunks(1 - owner)),
        (2, 0),
        "the owner made both chunks, the other node none"
    );
    let fired = b.ok("GET", "/v1/reminders/kickoff", Value::Null, 200).await;
    assert_eq!(fired["firings"], 1);

    // A second reminder, in both feeds' caches, deleted on B: gone from A's feed at once,
    // not after the cache's time to live.
    a.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "later", "queue": "chunks", "delay_ms": MINUTE, "content": {}}),
        201,
    )
    .await;
    b.call("PUT", "/v1/reminders/later/subscribers/u1", Value::Null)
        .await;
    let feed_len = |s: &'static str| {
        let server = if s == "a" { a } else { b };
        async move {
            let feed = server
                .ok("GET", "/v1/users/u1/reminders", Value::Null, 200)
                .await;
            feed["reminders"].as_array().map_or(0, Vec::len)
        }
    };
    eventually("A's feed lists the reminder", || async {
        (feed_len("a").await == 1).then_some(())
    })
    .await;
    // Read twice: the second answer comes from A's caches.
    assert_eq!(feed_len("a").await, 1);
    let started = tokio::time::Instant::now();
    b.ok("DELETE", "/v1/reminders/later", Value::Null, 204)
        .await;
    eventually("A's feed drops the reminder deleted on B", || async {
        (feed_len("a").await == 0).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < belfry_server::reminders::REMINDER_CACHE_TTL / 2,
        "dropped after {took:?}: the cache's time to live, not the event"
    );
    nodes.stop().await;
}

/// A user's feed read on B (its subscription list now cached there), then a subscribe and an
/// unsubscribe through A: B's feed follows each at once, told by the store's subscriptions
/// event, not after the user cache's time to live (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_on_one_node_shows_in_the_other_nodes_feed_at_once() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    standup_and_retro(a, "u9").await;
    let b_feed = || feed_ids(b, "u9");
    eventually("B's feed lists the first subscription", || async {
        (b_feed().await == ["standup"]).then_some(())
    })
    .await;
    // Read again: now from B's caches.
    assert_eq!(b_feed().await, ["standup"]);

    let started = tokio::time::Instant::now();
    a.ok(
        "PUT",
        "/v1/reminders/retro/subscribers/u9",
        Value::Null,
        201,
    )
    .await;
    eventually("B's feed lists the subscription made on A", || async {
        (b_feed().await == ["retro", "standup"]).then_some(())
    })
    .await;
    let subscribed = started.elapsed();
    let started = tokio::time::Instant::now();
    a.ok(
        "DELETE",
        "/v1/reminders/standup/subscribers/u9",
        Value::Null,
        204,
    )
    .await;
    eventually("B's feed drops the subscription ended on A", || async {
        (b_feed().await == ["retro"]).then_some(())
    })
    .await;
    let unsubscribed = started.elapsed();
    eprintln!("B's feed followed a subscribe on A after {subscribed:?}, an unsubscribe after {unsubscribed:?}");
    for took in [subscribed, unsubscribed] {
        assert!(
            took < belfry_server::reminders::USER_CACHE_TTL / 10,
            "followed after {took:?}: the cache's time to live, not the event"
        );
    }
    nodes.stop().await;
}

/// The periodic recheck (nothing known lost) keeps B's feed caches: a feed read twice across
/// it is served from them the second time, without a store read, and a subscribe through A
/// still reaches B's feed at once. A resync (events were missed) empties them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recheck_keeps_the_feed_caches_and_a_resync_empties_them() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    standup_seen_on_b(&nodes, "u7").await;
    let b_feed = || feed_ids(b, "u7");

    nodes.handled(1, StoreEvent::Recheck).await;
    assert_eq!(
        b_feed_and_reads(&nodes, "u7").await,
        (vec!["standup".to_string()], 0),
        "read from B's caches across a recheck"
    );

    a.ok(
        "PUT",
        "/v1/reminders/retro/subscribers/u7",
        Value::Null,
        201,
    )
    .await;
    eventually("B's feed lists the subscription made on A", || async {
        (b_feed().await == ["retro", "standup"]).then_some(())
    })
    .await;

    nodes.handled(1, StoreEvent::Resync).await;
    assert_eq!(
        b_feed_and_reads(&nodes, "u7").await,
        (vec!["retro".to_string(), "standup".to_string()], 1),
        "a resync empties B's caches"
    );
    nodes.stop().await;
}

/// A fan-out's progress or a schedule's cursor, announced by the node that wrote it, is
/// that node's runner's bookkeeping: B keeps its feed caches (a paced fan-out writes its
/// progress at every chunk). An announcement of any reminder (no key named) empties them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runners_bookkeeping_elsewhere_keeps_the_feed_caches() {
    let nodes = Nodes::start().await;
    standup_seen_on_b(&nodes, "u8").await;
    let standup = vec!["standup".to_string()];
    assert_eq!(b_feed_and_reads(&nodes, "u8").await.0, standup);

    for namespace in [
        belfry_reminders::FANOUTS_NAMESPACE,
        belfry_schedule::CURSORS_NAMESPACE,
    ] {
        nodes
            .shared
            .emit(StoreEvent::MetaChanged(MetaEvent::namespace(namespace)));
        // Events are taken in order: once a recheck after it is handled, so is this.
        nodes.handled(1, StoreEvent::Recheck).await;
        assert_eq!(
            b_feed_and_reads(&nodes, "u8").await,
            (standup.clone(), 0),
            "B's caches kept across {namespace}"
        );
    }
    nodes
        .shared
        .emit(StoreEvent::MetaChanged(MetaEvent::namespace(
            belfry_reminders::REMINDERS_NAMESPACE,
        )));
    nodes.handled(1, StoreEvent::Recheck).await;
    assert_eq!(
        b_feed_and_reads(&nodes, "u8").await,
        (standup, 1),
        "a reminder changed: B's caches go"
    );
    nodes.stop().await;
}

/// A reminder whose announcement was lost, but whose write the store counted, is found by its
/// owner at the second recheck after it (the first leaves an announcement one period to
/// arrive), and fanned out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_announcement_was_lost_is_found_at_the_next_recheck() {
    let nodes = Nodes::start().await;
    let [a, _b] = &nodes.servers;
    a.queue("notes", json!({})).await;
    // The first recheck meets the counts for the first time, and reads everything.
    nodes.handled(1, StoreEvent::Recheck).await;
    nodes.handled(0, StoreEvent::Recheck).await;

    // A reminder B owns, due now, written while every announcement is lost.
    let writer = belfry_reminders::ReminderService::new(Arc::new(NodeStore {
        node: 0,
        shared: nodes.shared.clone(),
    }));
    let id = (0..)
        .map(|i| format!("lost-{i}"))
        .find(|id| owner_by_hash(&belfry_reminders::owner_key(id)) == 1)
        .unwrap();
    let now = nodes.clock.wall_ms();
    let mut def = belfry_reminders::ReminderDef::at(
        QueueName::new("notes").unwrap(),
        now,
        Bytes::from(r#"{"title":"lost"}"#),
    );
    def.chunk_size = 10;
    let rid = belfry_reminders::ReminderId::new(id).unwrap();
    nodes.shared.muted.store(true, Ordering::SeqCst);
    writer.create(Some(rid.clone()), def, now).unwrap();
    writer
        .subscribe(&rid, &[UserId::new("u1").unwrap()])
        .unwrap();
    nodes.shared.muted.store(false, Ordering::SeqCst);

    // `handled` ends with a recheck of its own: two in all.
    nodes.handled(1, StoreEvent::Recheck).await;
    eventually("B fans the lost reminder out", || async {
        (nodes.shared.chunks_created[1].load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert_eq!(nodes.shared.chunks_created[0].load(Ordering::SeqCst), 0);
    nodes.stop().await;
}

/// A queue made on A a moment ago, whose announcement B has not heard (lost here, on the way
/// in production), is served by B at the first call: a miss on a shared store reads the store
/// before answering "not found". A name that is nowhere is still 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_made_on_one_node_is_served_by_the_other_before_it_hears_of_it() {
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    nodes.shared.muted.store(true, Ordering::SeqCst);
    a.queue("fresh", json!({})).await;
    let (status, body) = b
        .call(
            "POST",
            "/v1/queues/fresh/tasks",
            json!({"payload": {"n": 1}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(queue_status(b, "fresh").await, 200);
    assert_eq!(queue_status(b, "nowhere").await, 404);
    let (status, body) = b.call("POST", "/v1/queues/nowhere/tasks", json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "queue_not_found", "{body}");
    nodes.shared.muted.store(false, Ordering::SeqCst);
    nodes.stop().await;
}

/// A reminder firing on its owner moves its next fire time, which every node hears with the
/// reminder's key: the other node's feed shows the new time at once, its runner reads that
/// one reminder again, not every reminder, and the recheck after it reads nothing again
/// (every write was heard). Before, each firing made every node read every reminder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_makes_the_other_node_read_that_reminder_alone() {
    const MINUTE: u64 = 60_000;
    let nodes = Nodes::start().await;
    let [a, b] = &nodes.servers;
    a.queue("notes", json!({})).await;
    let id = (0..)
        .map(|i| format!("hourly-{i}"))
        .find(|id| owner_by_hash(&belfry_reminders::owner_key(id)) == 0)
        .unwrap();
    for (id, cron) in [(id.as_str(), "* * * * *"), ("other", "0 9 * * *")] {
        a.ok(
            "POST",
            "/v1/reminders",
            json!({"id": id, "queue": "notes", "cron": cron, "content": {}}),
            201,
        )
        .await;
    }
    a.ok(
        "PUT",
        &format!("/v1/reminders/{id}/subscribers/u1"),
        Value::Null,
        201,
    )
    .await;
    let due_on_b = || async {
        let feed = b
            .ok("GET", "/v1/users/u1/reminders", Value::Null, 200)
            .await;
        feed["reminders"][0]["due_at_ms"].as_u64()
    };
    eventually("B's feed lists the reminder", || async {
        (due_on_b().await == Some(T0 + MINUTE)).then_some(())
    })
    .await;
    // Two rechecks: the first meets the write counts, the second finds nothing unheard.
    nodes.handled(1, StoreEvent::Recheck).await;
    let lists = || nodes.shared.reminder_lists[1].load(Ordering::SeqCst);
    let reads = || nodes.shared.reminder_reads[1].load(Ordering::SeqCst);
    let (lists_before, reads_before) = (lists(), reads());

    nodes.advance(MINUTE);
    eventually("A fires it", || async {
        (nodes.shared.chunks_created[0].load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    eventually("B's runner reads the fired reminder again", || async {
        (reads() > reads_before).then_some(())
    })
    .await;
    nodes.handled(1, StoreEvent::Recheck).await;
    assert_eq!(lists(), lists_before, "B never read every reminder");
    assert_eq!(
        due_on_b().await,
        Some(T0 + 2 * MINUTE),
        "B's feed forgot the fire time it had cached"
    );
    nodes.stop().await;
}

/// On `a`: queue "notes", reminders "standup" and "retro" due in a minute, and `user`
/// subscribed to "standup".
async fn standup_and_retro(a: &TestServer, user: &str) {
    a.queue("notes", json!({})).await;
    for id in ["standup", "retro"] {
        a.ok(
            "POST",
            "/v1/reminders",
            json!({"id": id, "queue": "notes", "delay_ms": 60_000, "content": {"title": id}}),
            201,
        )
        .await;
    }
    a.ok(
        "PUT",
        &format!("/v1/reminders/standup/subscribers/{user}"),
        Value::Null,
        201,
    )
    .await;
}

/// B's feed of `user` (its ids, sorted), and how many subscription lists B read from the
/// store to answer it (0: answered from its caches).
async fn b_feed_and_reads(nodes: &Nodes, user: &str) -> (Vec<String>, usize) {
    let reads = || nodes.shared.user_set_reads[1].load(Ordering::SeqCst);
    let before = reads();
    let ids = feed_ids(&nodes.servers[1], user).await;
    (ids, reads() - before)
}

/// `standup_and_retro` on A, then waits until B's feed of `user` lists the subscription.
async fn standup_seen_on_b(nodes: &Nodes, user: &str) {
    standup_and_retro(&nodes.servers[0], user).await;
    eventually("B's feed lists the subscription", || async {
        (feed_ids(&nodes.servers[1], user).await == ["standup"]).then_some(())
    })
    .await;
}

/// The ids of `user`'s feed on `node`, sorted.
async fn feed_ids(node: &TestServer, user: &str) -> Vec<String> {
    let feed = node
        .ok(
            "GET",
            &format!("/v1/users/{user}/reminders"),
            Value::Null,
            200,
        )
        .await;
    let mut ids: Vec<String> = feed["reminders"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}
