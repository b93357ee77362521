//! Every client method against a real server started in-process on an ephemeral loopback
//! port, on a manual clock so due times are exact. Errors are checked by their typed code.

use belfry_client::{
    BatchItem, BulkBody, CancelSelection, Client, DeadSelection, DeliverySpec, DueTime, Error,
    ErrorCode, LeaseRequest, Nack, NewTask, NotDead, QueueSpec, Request, RetrySpec, ScheduleSpec,
};
use serde_json::json;

mod common;

use common::{code, Harness, T0};

#[tokio::test]
async fn queues_create_read_pause_and_delete() {
    let h = Harness::start().await;
    let c = &h.client;
    let spec = QueueSpec {
        rate_per_s: Some(5.0),
        retry: Some(RetrySpec {
            max_attempts: Some(3),
            ..RetrySpec::default()
        }),
        ..QueueSpec::default()
    };
    let created = c.put_queue("mail", &spec).await.unwrap();
    assert_eq!((created.rate_per_s, created.retry.max_attempts), (5.0, 3));
    assert_eq!(c.get_queue("mail").await.unwrap(), created);
    h.pull_queue("audit").await;
    let names: Vec<String> = c
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["audit", "mail"]);
    assert!(c.pause("mail").await.unwrap().paused);
    assert!(!c.resume("mail").await.unwrap().paused);
    c.delete_queue("mail").await.unwrap();

    assert_eq!(code(c.get_queue("mail").await), ErrorCode::QueueNotFound);
    assert_eq!(code(c.pause("mail").await), ErrorCode::QueueNotFound);
    assert_eq!(code(c.delete_queue("mail").await), ErrorCode::QueueNotFound);
    assert_eq!(code(c.get_queue("a b").await), ErrorCode::InvalidQueueName);
    let bad = QueueSpec {
        retry: Some(RetrySpec {
            max_attempts: Some(0),
            ..RetrySpec::default()
        }),
        ..QueueSpec::default()
    };
    assert_eq!(
        code(c.put_queue("x", &bad).await),
        ErrorCode::InvalidQueueConfig
    );
    h.stop().await;
}

#[tokio::test]
async fn tasks_submit_get_cancel_and_reschedule_by_id() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("jobs").await;
    let task = NewTask::json(json!({"n": 1})).delay_ms(10_000);
    let submitted = c.submit("jobs", &task).await.unwrap();
    assert_eq!(
        (submitted.due_at_ms, submitted.state.as_str()),
        (T0 + 10_000, "scheduled")
    );
    let got = c.get_task("jobs", &submitted.id).await.unwrap();
    assert_eq!(got.payload, Some(json!({"n": 1})));

    let moved = c
        .reschedule("jobs", &submitted.id, &DueTime::DelayMs(60_000))
        .await
        .unwrap();
    assert_eq!(moved.due_at_ms, T0 + 60_000);
    let moved = c
        .reschedule("jobs", &submitted.id, &DueTime::AtMs(T0 + 5_000))
        .await
        .unwrap();
    assert_eq!(moved.due_at_ms, T0 + 5_000);
    let at = DueTime::At("2026-01-01T01:00:00Z".into());
    let moved = c.reschedule("jobs", &submitted.id, &at).await.unwrap();
    assert_eq!(moved.due_at_ms, T0 + 3_600_000);
    let bad_time = DueTime::At("next tuesday".into());
    assert_eq!(
        code(c.reschedule("jobs", &submitted.id, &bad_time).await),
        ErrorCode::InvalidDueTime
    );

    c.cancel("jobs", &submitted.id).await.unwrap();
    assert_eq!(
        c.get_task("jobs", &submitted.id).await.unwrap().state,
        "cancelled"
    );
    assert_eq!(
        code(c.cancel("jobs", &submitted.id).await),
        ErrorCode::TaskNotScheduled
    );
    let unknown = "0000000000000000000000000000abcd";
    assert_eq!(
        code(c.get_task("jobs", unknown).await),
        ErrorCode::TaskNotFound
    );
    assert_eq!(
        code(c.get_task("jobs", "xyz").await),
        ErrorCode::InvalidTaskId
    );
    assert_eq!(
        code(c.submit("nosuch", &task).await),
        ErrorCode::QueueNotFound
    );
    h.stop().await;
}

#[tokio::test]
async fn batches_and_duplicates() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("jobs").await;
    let keyed = NewTask::json(json!(1)).idempotency_key("k-1");
    let first = c.submit("jobs", &keyed).await.unwrap();
    let again = c.submit("jobs", &keyed).await.unwrap();
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(first.id, again.id);

    let conflicting = NewTask {
        delay_ms: Some(1),
        run_at_ms: Some(T0),
        ..NewTask::default()
    };
    let results = c
        .submit_batch("jobs", &[NewTask::json(json!(2)), conflicting])
        .await
        .unwrap();
    assert!(matches!(&results[0], BatchItem::Submitted(s) if s.state == "scheduled"));
    assert!(
        matches!(&results[1], BatchItem::Error { error } if error.code == "conflicting_due_time"),
        "{results:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn tasks_by_idempotency_key_with_reserved_characters() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("orders").await;
    // A slash, a space, a question mark and a percent sign: each must stay in one segment.
    let key = "order/42 close?now%";
    let task = NewTask::json(json!({"order": 42}))
        .delay_ms(1_000)
        .idempotency_key(key);
    let submitted = c.submit("orders", &task).await.unwrap();
    let got = c.get_task_by_key("orders", key).await.unwrap();
    assert_eq!(
        (got.id.as_str(), got.idempotency_key.as_deref()),
        (submitted.id.as_str(), Some(key))
    );

    let moved = c
        .reschedule_by_key("orders", key, &DueTime::DelayMs(600_000))
        .await
        .unwrap();
    assert_eq!(
        (moved.id.as_str(), moved.due_at_ms),
        (submitted.id.as_str(), T0 + 600_000)
    );
    c.cancel_by_key("orders", key).await.unwrap();
    assert_eq!(
        c.get_task("orders", &submitted.id).await.unwrap().state,
        "cancelled"
    );
    assert_eq!(
        code(c.cancel_by_key("orders", key).await),
        ErrorCode::TaskNotScheduled
    );

    assert_eq!(
        code(c.get_task_by_key("orders", "order/43").await),
        ErrorCode::TaskNotFound
    );
    let delay = DueTime::DelayMs(1);
    assert_eq!(
        code(c.reschedule_by_key("orders", "nope", &delay).await),
        ErrorCode::TaskNotFound
    );
    assert_eq!(
        code(c.cancel_by_key("orders", "nope").await),
        ErrorCode::TaskNotFound
    );
    h.stop().await;
}

#[tokio::test]
async fn lease_ack_nack_and_extend() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("work").await;
    let nothing = LeaseRequest::default();
    c.submit("work", &NewTask::json(json!("a")).delay_ms(1_000))
        .await
        .unwrap();
    assert!(
        c.lease("work", &nothing).await.unwrap().is_empty(),
        "never early"
    );
    h.advance(1_000);

    let leased = h.lease_one("work", 30_000).await;
    assert_eq!(
        (leased.attempt, leased.lease_until_ms),
        (1, T0 + 1_000 + 30_000)
    );
    let extended = c
        .extend("work", &leased.id, &leased.lease_id, 60_000)
        .await
        .unwrap();
    assert_eq!(
        (extended.state.as_str(), extended.lease_until_ms),
        ("leased", Some(T0 + 61_000))
    );

    let nack = Nack {
        delay_ms: Some(5_000),
        reason: Some("smtp down".into()),
    };
    let state = c
        .nack("work", &leased.id, &leased.lease_id, &nack)
        .await
        .unwrap();
    assert_eq!(
        (state.state.as_str(), state.due_at_ms),
        ("scheduled", Some(T0 + 6_000))
    );
    assert_eq!(
        code(c.ack("work", &leased.id, &leased.lease_id).await),
        ErrorCode::LeaseExpired
    );
    assert_eq!(
        code(c.extend("work", &leased.id, &leased.lease_id, 1_000).await),
        ErrorCode::LeaseExpired
    );

    h.advance(5_000);
    let again = h.lease_one("work", 30_000).await;
    assert_eq!((again.id.as_str(), again.attempt), (leased.id.as_str(), 2));
    let done = c.ack("work", &again.id, &again.lease_id).await.unwrap();
    assert_eq!(done.state, "done");
    assert_eq!(
        code(c.ack("work", &again.id, "x").await),
        ErrorCode::InvalidLeaseId
    );
    h.stop().await;
}

#[tokio::test]
async fn ack_batch_reports_each_task() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("work").await;
    let tasks = vec![NewTask::json(json!(1)), NewTask::json(json!(2))];
    c.submit_batch("work", &tasks).await.unwrap();
    let request = LeaseRequest {
        max: Some(2),
        ..LeaseRequest::default()
    };
    let leased = c.lease("work", &request).await.unwrap();
    assert_eq!(leased.len(), 2);
    let acks = vec![
        (leased[0].id.clone(), leased[0].lease_id.clone()),
        (leased[1].id.clone(), "999999".to_owned()),
    ];
    let results = c.ack_batch("work", &acks).await.unwrap();
    assert_eq!(results[0].ok, Some(true));
    assert_eq!(
        results[1].error.as_ref().map(|e| e.code.as_str()),
        Some("lease_expired")
    );
    h.stop().await;
}

#[tokio::test]
async fn dead_letters_list_and_redrive() {
    let h = Harness::start().await;
    let c = &h.client;
    let once = QueueSpec {
        retry: Some(RetrySpec {
            max_attempts: Some(1),
            ..RetrySpec::default()
        }),
        ..QueueSpec::default()
    };
    c.put_queue("fragile", &once).await.unwrap();
    let submitted = c
        .submit("fragile", &NewTask::json(json!("x")))
        .await
        .unwrap();
    assert_eq!(
        code(c.redrive("fragile", &submitted.id).await),
        ErrorCode::TaskNotDead
    );
    let leased = h.lease_one("fragile", 30_000).await;
    let nack = Nack {
        reason: Some("bad input".into()),
        ..Nack::default()
    };
    let state = c
        .nack("fragile", &leased.id, &leased.lease_id, &nack)
        .await
        .unwrap();
    assert_eq!(state.state, "dead");

    let page = c.list_dead("fragile", None, Some(10)).await.unwrap();
    assert_eq!(page.tasks.len(), 1);
    assert_eq!(page.tasks[0].id, submitted.id);
    assert!(page.next_after.is_none());
    let after = c
        .list_dead("fragile", Some(&submitted.id), None)
        .await
        .unwrap();
    assert!(after.tasks.is_empty());
    let dead = c.get_task("fragile", &submitted.id).await.unwrap();
    assert_eq!(dead.state, "dead");
    assert!(dead.dead_reason.is_some());

    let redriven = c.redrive("fragile", &submitted.id).await.unwrap();
    assert_eq!(
        (redriven.state.as_str(), redriven.attempts),
        ("scheduled", 0)
    );
    // Deleted one by one, or many at once: the redriven task dies again, with two others.
    let more = [json!(1), json!(2)].map(NewTask::json);
    let more: Vec<String> = c
        .submit_batch("fragile", &more)
        .await
        .unwrap()
        .into_iter()
        .map(|item| match item {
            BatchItem::Submitted(s) => s.id,
            other => panic!("{other:?}"),
        })
        .collect();
    for leased in c
        .lease(
            "fragile",
            &LeaseRequest {
                max: Some(3),
                ..LeaseRequest::default()
            },
        )
        .await
        .unwrap()
    {
        c.nack("fragile", &leased.id, &leased.lease_id, &Nack::default())
            .await
            .unwrap();
    }
    c.delete_dead("fragile", &submitted.id).await.unwrap();
    assert_eq!(
        c.get_task("fragile", &submitted.id).await.unwrap().state,
        "cancelled"
    );
    assert_eq!(
        code(c.delete_dead("fragile", &submitted.id).await),
        ErrorCode::TaskNotDead
    );
    let named = DeadSelection::Ids(vec![more[0].clone(), submitted.id.clone()]);
    let answer = c.redrive_dead_many("fragile", &named).await.unwrap();
    assert_eq!(
        (answer.done(), answer.redriven, answer.dead_left),
        (1, Some(1), 1)
    );
    assert_eq!(
        answer.not_dead,
        [NotDead {
            id: submitted.id.clone(),
            state: "cancelled".into()
        }]
    );
    let answer = c
        .delete_dead_many("fragile", &DeadSelection::First(10))
        .await
        .unwrap();
    assert_eq!((answer.deleted, answer.dead_left), (Some(1), 0));
    assert_eq!(
        c.get_task("fragile", &more[1]).await.unwrap().state,
        "cancelled"
    );
    assert_eq!(
        code(c.list_dead("nosuch", None, None).await),
        ErrorCode::QueueNotFound
    );
    assert_eq!(
        code(c.list_dead("fragile", None, Some(0)).await),
        ErrorCode::InvalidRequest
    );
    h.stop().await;
}

#[tokio::test]
async fn lease_on_a_push_queue_is_refused() {
    let h = Harness::start().await;
    let push = QueueSpec {
        delivery: Some(DeliverySpec::Webhook {
            url: "http://127.0.0.1:9/hook".into(),
            secret: None,
            previous_secret: None,
            headers: Default::default(),
            timeout_ms: None,
        }),
        ..QueueSpec::default()
    };
    h.client.put_queue("hooks", &push).await.unwrap();
    let refused = h.client.lease("hooks", &LeaseRequest::default()).await;
    assert_eq!(code(refused), ErrorCode::NotPullQueue);
    h.stop().await;
}

/// A webhook queue's fixed headers reach the server; it answers with their names only.
#[tokio::test]
async fn a_webhook_queues_headers_are_shown_by_name() {
    let h = Harness::start().await;
    let spec = QueueSpec {
        delivery: Some(DeliverySpec::Webhook {
            url: "http://127.0.0.1:9/hook".into(),
            secret: None,
            previous_secret: None,
            headers: [
                ("Authorization".to_owned(), "Bearer value-1".to_owned()),
                ("X-Env".to_owned(), "value-2".to_owned()),
            ]
            .into(),
            timeout_ms: None,
        }),
        ..QueueSpec::default()
    };
    let created = h.client.put_queue("hooks", &spec).await.unwrap();
    assert_eq!(
        created.delivery["headers_set"],
        json!(["Authorization", "X-Env"])
    );
    let text = h
        .client
        .get_queue("hooks")
        .await
        .unwrap()
        .delivery
        .to_string();
    assert!(
        !text.contains("value-1") && !text.contains("value-2"),
        "{text}"
    );
    h.stop().await;
}

#[tokio::test]
async fn schedules_and_forecast() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("reports").await;
    let spec = ScheduleSpec::cron("reports", "30 2 * * *")
        .timezone("Europe/Paris")
        .id("nightly")
        .payload(json!({"report": "sales"}));
    let created = c.create_schedule(&spec).await.unwrap();
    assert_eq!(
        created.next_fire_at.as_deref(),
        Some("2026-01-01T01:30:00Z")
    );
    assert_eq!(
        code(c.create_schedule(&spec).await),
        ErrorCode::ScheduleExists
    );
    assert_eq!(c.get_schedule("nightly").await.unwrap(), created);
    assert_eq!(c.list_schedules().await.unwrap(), vec![created.clone()]);
    let next = c.next_fire_times("nightly", Some(2)).await.unwrap();
    assert_eq!(next.fire_times.len(), 2);
    assert!(c.pause_schedule("nightly").await.unwrap().paused);
    assert!(!c.resume_schedule("nightly").await.unwrap().paused);
    let every = ScheduleSpec::every_ms("reports", 60_000);
    let replaced = c.replace_schedule("nightly", &every).await.unwrap();
    assert_eq!(replaced.every_ms, Some(60_000));
    let forecast = c
        .forecast("reports", Some(600_000), Some(300_000))
        .await
        .unwrap();
    let firings: u64 = forecast.steps.iter().map(|s| s.firings).sum();
    // Every minute from the creation at T0 (which does not fire itself): T0 + 1m ..= T0 + 9m.
    assert_eq!((forecast.steps.len(), firings), (2, 9));
    c.delete_schedule("nightly").await.unwrap();
    assert_eq!(
        code(c.get_schedule("nightly").await),
        ErrorCode::ScheduleNotFound
    );
    let bad = ScheduleSpec::cron("reports", "0 25 * * *");
    assert_eq!(
        code(c.create_schedule(&bad).await),
        ErrorCode::InvalidSchedule
    );
    h.stop().await;
}

#[tokio::test]
async fn send_returns_the_body_as_the_server_wrote_it() {
    let h = Harness::start().await;
    h.pull_queue("raw").await;
    let submitted = h
        .client
        .submit("raw", &NewTask::json(json!({"b": 1, "a": [1.50, "x"]})))
        .await
        .unwrap();
    let answer = h
        .client
        .send(&Request::get_task("raw", &submitted.id))
        .await
        .unwrap();
    let url = format!(
        "{}/v1/queues/raw/tasks/{}",
        h.client.base_url(),
        submitted.id
    );
    let direct = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, direct.to_vec());
    let empty = h.client.send(&Request::delete_queue("raw")).await.unwrap();
    assert_eq!((empty.status, empty.body.len()), (204, 0));
    h.stop().await;
}

#[tokio::test]
async fn operations_and_transport_errors() {
    let h = Harness::start().await;
    assert!(h.client.ready().await.unwrap());
    assert!(h.client.metrics().await.unwrap().contains("belfry_"));

    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
    match nobody.get_queue("x").await {
        Err(Error::Unreachable { url, .. }) => assert_eq!(url, format!("http://127.0.0.1:{port}")),
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert!(matches!(
        Client::new("127.0.0.1:7070"),
        Err(Error::BadUrl(_))
    ));
    // Routes add /v1 themselves: a base with it would ask for /v1/v1/… of every call.
    match Client::new("http://127.0.0.1:7070/v1/") {
        Err(e @ Error::BadUrl(_)) => assert!(e.to_string().contains("without /v1"), "{e}"),
        other => panic!("expected BadUrl, got {other:?}"),
    }
    // "." and ".." are no names: sent, they would be resolved into another route's path.
    for dots in ["", ".", ".."] {
        match nobody.get_queue(dots).await {
            Err(e @ Error::DotName(_)) => assert!(e.to_string().contains("not a name"), "{e}"),
            other => panic!("{dots}: expected DotName, got {other:?}"),
        }
    }
    // A query or a fragment would swallow every route's path; the message quotes what was given.
    for given in [
        "http://127.0.0.1:7070?x=1",
        "http://127.0.0.1:7070/#",
        "http://",
    ] {
        match Client::new(given) {
            Err(e @ Error::BadUrl(_)) => {
                assert!(e.to_string().contains(&format!("{given:?}")), "{e}")
            }
            other => panic!("{given}: expected BadUrl, got {other:?}"),
        }
    }
    // https URLs are accepted (TLS itself is tested with the TLS work), and a proxy's prefix.
    assert!(Client::new("https://belfry.example:7443/").is_ok());
    assert!(Client::new("https://example.com/belfry").is_ok());
    h.stop().await;
}

/// Every code of the docs' error table is known to the client by name.
#[test]
fn every_documented_code_is_a_typed_variant() {
    let docs = include_str!("../../../docs/api.md");
    let codes: Vec<&str> = docs
        .lines()
        .skip_while(|line| !line.starts_with("| code | status |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            line.split('|')
                .nth(1)?
                .trim()
                .strip_prefix('`')?
                .strip_suffix('`')
        })
        .collect();
    assert!(codes.len() >= 30, "the table was found: {codes:?}");
    for text in codes {
        let code = ErrorCode::parse(text);
        assert!(!matches!(code, ErrorCode::Other(_)), "{text} is not typed");
        assert_eq!(code.as_str(), text);
    }
    assert_eq!(
        ErrorCode::parse("new_code"),
        ErrorCode::Other("new_code".into())
    );
}

/// `list_queues` follows the server's pages: 1,001 queues come back whole, in order, though
/// one answer holds at most 1,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_queues_follows_the_pages() {
    let h = Harness::start().await;
    let names: Vec<String> = (0..1_001).map(|i| format!("q{i:04}")).collect();
    let mut creates = tokio::task::JoinSet::new();
    for chunk in names.chunks(100) {
        let (client, chunk) = (h.client.clone(), chunk.to_vec());
        creates.spawn(async move {
            for name in chunk {
                client
                    .put_queue(&name, &QueueSpec::default())
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = creates.join_next().await {
        done.unwrap();
    }
    let first = h.client.send(&Request::list_queues()).await.unwrap();
    let first: serde_json::Value = first.json().unwrap();
    assert_eq!(first["queues"].as_array().unwrap().len(), 1_000);
    assert_eq!(first["next_after"], "q0999");
    let listed: Vec<String> = h
        .client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(listed, names);
}

/// A task import from memory and from a stream of chunks that split lines; a stream that
/// breaks off is `ImportIncomplete`, with the counts of what was applied.
#[tokio::test]
async fn import_tasks_streams_and_reports_where_it_stopped() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("imports").await;
    let tasks = [
        NewTask::json(json!({"n": 1})).delay_ms(5),
        NewTask {
            idempotency_key: Some("once".into()),
            ..NewTask::json(json!({"n": 2}))
        },
        NewTask {
            idempotency_key: Some("once".into()),
            ..NewTask::json(json!({"n": 3}))
        },
        NewTask {
            priority: Some("urgent-ish".into()),
            ..NewTask::default()
        },
    ];
    let answer = c
        .import_tasks("imports", BulkBody::tasks(&tasks))
        .await
        .unwrap();
    assert_eq!(
        (answer.created, answer.duplicates, answer.refused),
        (2, 1, 1),
        "{answer:?}"
    );
    assert_eq!(answer.errors[0].line, 4);
    assert_eq!(answer.errors[0].error.code, "invalid_request");
    assert!(answer.complete);

    // Chunks that split a line; then an error that breaks the body off in line 2. Whether the
    // bytes of line 1 reach the server before the client drops the connection is up to its
    // HTTP stack; the answer, when it comes, counts exactly what was stored.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(b"{\"payload\": ".to_vec()),
        Ok(b"7}\n{\"payl".to_vec()),
        Err(std::io::Error::other("the source failed")),
    ];
    let stored = match c
        .import_tasks(
            "imports",
            BulkBody::stream(futures_util::stream::iter(chunks)),
        )
        .await
    {
        Err(Error::ImportIncomplete { code, answer, .. }) => {
            assert_eq!(code, ErrorCode::BodyIncomplete);
            assert!(!answer.complete);
            assert!(answer.stopped_at_line.is_some(), "{answer:?}");
            Some(answer.created)
        }
        // The client may see its own body's failure instead of the server's answer.
        Err(Error::Http(_)) => None,
        other => panic!("expected ImportIncomplete, got {other:?}"),
    };
    let queue = c.get_queue("imports").await.unwrap();
    if let Some(created) = stored {
        assert_eq!(queue.pending, Some(2 + created), "{queue:?}");
    }
    match c.import_tasks("nope", BulkBody::tasks(&tasks)).await {
        Err(Error::Api { code, .. }) => assert_eq!(code, ErrorCode::QueueNotFound),
        other => panic!("expected queue_not_found, got {other:?}"),
    }
}

#[tokio::test]
async fn live_tasks_listed_in_pages_and_for_export() {
    let h = Harness::start().await;
    let c = &h.client;
    h.pull_queue("jobs").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let task = NewTask {
            delay_ms: Some(60_000 + n),
            ..NewTask::json(json!({ "n": n }))
        };
        ids.push(c.submit("jobs", &task).await.unwrap().id);
    }
    let first = c.list_tasks("jobs", None, Some(3)).await.unwrap();
    assert_eq!(first.tasks.len(), 3);
    let next = first.next_after.clone().expect("a full page has a next");
    let rest = c.list_tasks("jobs", Some(&next), Some(3)).await.unwrap();
    assert_eq!(rest.tasks.len(), 2);
    assert!(rest.next_after.is_none());
    let mut listed: Vec<String> = first
        .tasks
        .iter()
        .chain(&rest.tasks)
        .map(|t| t.id.clone())
        .collect();
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids);
    assert!(first
        .tasks
        .iter()
        .all(|t| t.state == "scheduled" && t.payload.is_some()));
    let whole = c.list_tasks_for_export("jobs", None, None).await.unwrap();
    assert_eq!(whole.tasks.len(), 5);
    let which = CancelSelection::Ids(vec![ids[0].clone(), ids[1].clone(), ids[0].clone()]);
    let cancelled = c.cancel_many("jobs", &which).await.unwrap();
    assert_eq!(cancelled.cancelled, 2);
    assert_eq!(cancelled.not_scheduled.len(), 1);
    assert_eq!(
        (
            cancelled.not_scheduled[0].id.as_str(),
            cancelled.not_scheduled[0].state.as_str()
        ),
        (ids[0].as_str(), "cancelled")
    );
    let which = CancelSelection::Keys(vec!["no-such-key".into()]);
    let none = c.cancel_many("jobs", &which).await.unwrap();
    assert_eq!(
        (none.cancelled, none.not_found.clone()),
        (0, vec!["no-such-key".to_owned()])
    );
    let left = c.list_tasks("jobs", None, None).await.unwrap();
    assert_eq!(left.tasks.len(), 3);
    assert_eq!(
        code(c.list_tasks("nosuch", None, None).await),
        ErrorCode::QueueNotFound
    );
    assert_eq!(
        code(c.list_tasks("jobs", Some("not-an-id"), None).await),
        ErrorCode::InvalidTaskId
    );
    h.stop().await;
}
