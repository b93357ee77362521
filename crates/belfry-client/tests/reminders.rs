//! The client's reminder calls (reminders, subscribers, the feed) against a real server started
//! in-process, on a manual clock.

use belfry_client::{BulkBody, Error, ErrorCode, FeedQuery, Priority, ReminderPatch, ReminderSpec};
use serde_json::json;

mod common;

use common::{code, Harness, T0};

/// Reminders through every client method: create, get, patch, list, subscribers one by one
/// and in streamed bulk (a reader and a stream), count, pages, the feed with its ETag, delete.
#[tokio::test]
async fn reminders_subscribers_and_the_feed() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("push").await;
    let spec = ReminderSpec::delay_ms("push", 60_000)
        .id("kickoff")
        .content(json!({"title": "Kick-off"}))
        .chunk_size(2)
        .users_per_second(1_000);
    let created = c.create_reminder(&spec).await.unwrap();
    assert_eq!(created.next_fire_ms, Some(T0 + 60_000));
    assert_eq!(created.run_at_ms, Some(T0 + 60_000));
    assert_eq!(
        (created.chunk_size, created.users_per_second),
        (2, Some(1_000))
    );
    assert_eq!(created.priority, Priority::Normal);
    assert_eq!(created.subscribers, Some(0));
    assert_eq!(
        code(c.create_reminder(&spec).await),
        ErrorCode::ReminderExists
    );

    // One by one: twice is once.
    assert!(c.subscribe("kickoff", "u1").await.unwrap());
    assert!(!c.subscribe("kickoff", "u1").await.unwrap());
    assert!(c.is_subscribed("kickoff", "u1").await.unwrap());
    assert!(!c.is_subscribed("kickoff", "nobody").await.unwrap());

    // Bulk from a reader: a bad line (an empty string) and duplicates.
    let body: &[u8] = b"u2\n\"u3\"\n\"\"\n42\nu1\nu2\n";
    let answer = c
        .bulk_subscribe("kickoff", BulkBody::reader(body))
        .await
        .unwrap();
    assert_eq!(
        (answer.changed, answer.unchanged, answer.refused),
        (3, 2, 1),
        "{answer:?}"
    );
    assert_eq!(answer.errors[0].line, 3);
    assert!(answer.complete);
    // From a stream of chunks that split ids, and from memory.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(b"u".to_vec()), Ok(b"5\nu6".to_vec()), Ok(b"\n".to_vec())];
    let answer = c
        .bulk_subscribe(
            "kickoff",
            BulkBody::stream(futures_util::stream::iter(chunks)),
        )
        .await
        .unwrap();
    assert_eq!((answer.changed, answer.unchanged), (2, 0));
    let answer = c
        .bulk_subscribe("kickoff", BulkBody::users(["u7", "a \"quoted\" id"]))
        .await
        .unwrap();
    assert_eq!(answer.changed, 2);
    assert_eq!(c.count_subscribers("kickoff").await.unwrap(), 8);

    // A cut-off array: what came before is applied, and the error carries the counts.
    match c
        .bulk_subscribe(
            "kickoff",
            BulkBody::from("[\"u8\", \"u9\", \"u1".to_owned()),
        )
        .await
    {
        Err(Error::BulkIncomplete { code, answer, .. }) => {
            assert_eq!(code, ErrorCode::BodyIncomplete);
            assert!(!answer.complete);
            assert_eq!(answer.changed, 2, "{answer:?}");
            assert!(answer.stopped_at_line.is_some());
        }
        other => panic!("expected BulkIncomplete, got {other:?}"),
    }
    assert_eq!(c.count_subscribers("kickoff").await.unwrap(), 10);

    // Pages of subscribers: numbers first, then other ids bytewise.
    let page = c.subscribers("kickoff", None, Some(3)).await.unwrap();
    assert_eq!(page.users, ["42", "a \"quoted\" id", "u1"]);
    let rest = c
        .subscribers("kickoff", page.next_after.as_deref(), None)
        .await
        .unwrap();
    assert_eq!(rest.users.len(), 7);
    assert_eq!(rest.next_after, None);

    // The feed, its ETag and a revalidation.
    let feed = c.feed("u1", &FeedQuery::default()).await.unwrap();
    assert_eq!(feed.user, "u1");
    assert!(!feed.degraded);
    assert_eq!(feed.reminders.len(), 1);
    assert_eq!(feed.reminders[0].id, "kickoff");
    assert_eq!(feed.reminders[0].due_at_ms, T0 + 60_000);
    assert_eq!(feed.reminders[0].content, json!({"title": "Kick-off"}));
    let etag = feed.etag.clone().expect("an ETag");
    let query = FeedQuery::default();
    assert_eq!(
        c.feed_if_none_match("u1", &query, Some(&etag))
            .await
            .unwrap(),
        None
    );
    let soon = FeedQuery {
        within_ms: Some(1_000),
        limit: Some(10),
    };
    assert!(c.feed("u1", &soon).await.unwrap().reminders.is_empty());
    assert!(c
        .feed("stranger", &query)
        .await
        .unwrap()
        .reminders
        .is_empty());

    // Patch: priority and content; the feed shows the change.
    let patch = ReminderPatch {
        priority: Some(Priority::Urgent),
        content: Some(json!({"title": "Now!"})),
        ..ReminderPatch::default()
    };
    let patched = c.patch_reminder("kickoff", &patch).await.unwrap();
    assert_eq!(patched.priority, Priority::Urgent);
    let feed = c
        .feed_if_none_match("u1", &query, Some(&etag))
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(feed.reminders[0].priority, Priority::Urgent);
    assert_eq!(
        c.get_reminder("kickoff").await.unwrap().subscribers,
        Some(10)
    );

    // Unsubscribe one and in bulk.
    c.unsubscribe("kickoff", "u1").await.unwrap();
    assert_eq!(
        code(c.unsubscribe("kickoff", "u1").await),
        ErrorCode::UserNotFound
    );
    let answer = c
        .bulk_unsubscribe("kickoff", BulkBody::users(["u2", "u3", "gone"]))
        .await
        .unwrap();
    assert_eq!((answer.changed, answer.unchanged), (2, 1));
    assert_eq!(c.count_subscribers("kickoff").await.unwrap(), 7);

    // Errors, typed.
    let bad = ReminderSpec::delay_ms("push", 1).chunk_size(0);
    assert_eq!(
        code(c.create_reminder(&bad).await),
        ErrorCode::InvalidReminder
    );
    let nowhere = ReminderSpec::delay_ms("nowhere", 1);
    assert_eq!(
        code(c.create_reminder(&nowhere).await),
        ErrorCode::QueueNotFound
    );
    assert_eq!(
        code(c.bulk_subscribe("ghost", BulkBody::users(["u1"])).await),
        ErrorCode::ReminderNotFound
    );
    assert_eq!(
        code(c.get_reminder("bad id").await),
        ErrorCode::InvalidReminderId
    );

    c.delete_reminder("kickoff").await.unwrap();
    assert_eq!(
        code(c.get_reminder("kickoff").await),
        ErrorCode::ReminderNotFound
    );
    assert_eq!(
        code(c.count_subscribers("kickoff").await),
        ErrorCode::ReminderNotFound
    );
    h.stop().await;
}

/// `list_reminders` follows the pages (1,001 reminders, 1,000 a page) and filters by queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reminders_follows_the_pages() {
    let h = Harness::start().await;
    h.pull_queue("a").await;
    h.pull_queue("b").await;
    let ids: Vec<String> = (0..1_001).map(|i| format!("r{i:04}")).collect();
    let mut creates = tokio::task::JoinSet::new();
    for chunk in ids.chunks(100) {
        let (client, chunk) = (h.client.clone(), chunk.to_vec());
        creates.spawn(async move {
            for id in chunk {
                let spec = ReminderSpec::delay_ms("a", 60_000).id(id);
                client.create_reminder(&spec).await.unwrap();
            }
        });
    }
    while let Some(done) = creates.join_next().await {
        done.unwrap();
    }
    let other = ReminderSpec::cron("b", "0 9 * * *")
        .timezone("Europe/Paris")
        .id("daily");
    let daily = h.client.create_reminder(&other).await.unwrap();
    assert_eq!(daily.cron.as_deref(), Some("0 9 * * *"));
    let listed: Vec<String> = h
        .client
        .list_reminders(Some("a"))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, ids);
    assert_eq!(h.client.list_reminders(None).await.unwrap().len(), 1_002);
    let in_b = h.client.list_reminders(Some("b")).await.unwrap();
    assert_eq!(in_b.len(), 1);
    assert_eq!(in_b[0].timezone.as_deref(), Some("Europe/Paris"));
    h.stop().await;
}
