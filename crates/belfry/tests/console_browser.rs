//! The web console in a real browser: Debian's headless Chromium driven over WebDriver
//! (`chromedriver`) against a real `belfry serve` holding data. Each page is loaded and
//! photographed, a queue is paused and a dead letter redriven by clicks (and the API shows
//! it), "Redrive all" redrives each dead letter of a still-refusing webhook once (a receiver in
//! the test counts), one is deleted from its row and "Delete all" deletes the rest, a queue is
//! purged, a queue's live tasks are listed a page at a time and one is cancelled from its row,
//! the forecast chart is drawn, schedules page and refresh and one runs now, a malformed
//! address says "No such page.", the banner says when the server cannot be reached and goes
//! once it can, and no JavaScript error is logged. A second test checks the token flow: the
//! page loads without a token, its API calls fail until one is entered, a read-only token's
//! refused pause (403) opens the login form again (and another page closes it), and a token
//! with a low request rate still sees its reminders while a refused refresh slows down.
//!
//! Needs `chromium` and `chromium-driver` (scripts/test.sh installs them); without them the
//! tests fail, saying how to install them. Screenshots go to `<target>/tmp/console-screenshots/`.

mod common;
#[path = "console_browser/webdriver.rs"]
mod webdriver;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures_util::FutureExt as _;
use serde_json::{json, Value};

use common::{serve_with_env, Served};
use webdriver::{Driver, Session};

/// The whole of one test, browser start included.
const TEST_DEADLINE: Duration = Duration::from_secs(240);
const SECRET: &str = "webhook-secret-never-shown";
const URL_TOKEN: &str = "query-token-never-shown";

/// Records uncaught errors, unhandled rejections and `console.error` calls of every page, and
/// keeps every request's resource timing (the default buffer holds 250).
const RECORDER: &str = "window.__errors = [];
  performance.setResourceTimingBufferSize(100000);
  window.addEventListener('error', (e) => window.__errors.push('error: ' + e.message));
  window.addEventListener('unhandledrejection', (e) =>
    window.__errors.push('rejection: ' + (e.reason && e.reason.message || e.reason)));
  const original = console.error;
  console.error = (...args) => { window.__errors.push('console.error: ' + args.join(' ')); \
    original.apply(console, args); };";

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("make the screenshot directory");
    dir
}

/// Starts a browser, runs `body` with it under the deadline, and always closes the browser.
async fn with_browser<F, Fut>(body: F)
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = ()>,
{
    let driver = Driver::start().await;
    let profile = tempfile::tempdir().unwrap();
    let session = driver.session(profile.path()).await;
    let closer = session.clone();
    session
        .cdp(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": RECORDER }),
        )
        .await;
    let outcome = tokio::time::timeout(
        TEST_DEADLINE,
        std::panic::AssertUnwindSafe(body(session)).catch_unwind(),
    )
    .await;
    closer.quit().await;
    match outcome {
        Err(_) => panic!("the browser test took longer than {TEST_DEADLINE:?}"),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Ok(Ok(())) => {}
    }
}

/// Deliveries a webhook receiver saw, by task id.
type Seen = Arc<Mutex<HashMap<String, u32>>>;

/// A webhook receiver that refuses every delivery with a 400 (a permanent failure: each task
/// is a dead letter at once) and counts them by `Belfry-Task-Id`. Returns its URL.
async fn refusing_receiver() -> (String, Seen) {
    async fn refuse(State(seen): State<Seen>, headers: HeaderMap) -> StatusCode {
        let id = headers
            .get("belfry-task-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        *seen.lock().unwrap().entry(id).or_default() += 1;
        StatusCode::BAD_REQUEST
    }
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/refuse", axum::routing::post(refuse))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/refuse", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// Polls the API until `queue` holds `dead` dead letters and nothing pending or in flight.
async fn settled(server: &Served, queue: &str, dead: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, q) = api(server, None, "GET", &format!("/v1/queues/{queue}"), None).await;
        if q["dead"] == dead && q["pending"] == 0 && q["in_flight"] == 0 {
            return q;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} never settled at {dead} dead letters: {q}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls the API of `server` (with `token`), returning status and JSON.
async fn api(
    server: &Served,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let http = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = http.request(method, format!("{}{path}", server.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let answer = request.send().await.expect("call the API");
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn ok(server: &Served, method: &str, path: &str, body: Value) -> Value {
    let (status, answer) = api(server, None, method, path, Some(body)).await;
    assert!(status < 300, "{method} {path}: {status} {answer}");
    answer
}

/// What the pages show: queues (one with a delivery measured, one with a dead letter, one
/// webhook queue with a secret), tasks in the future, a schedule, a reminder with subscribers.
/// Returns the dead letter's id.
async fn seed(server: &Served) -> String {
    ok(
        server,
        "PUT",
        "/v1/queues/mail",
        json!({"retry": {"max_attempts": 1}}),
    )
    .await;
    let orders = json!({"rate_per_s": 50, "max_in_flight": 8,
                        "late": {"policy": "skip", "after_ms": 60000}});
    ok(server, "PUT", "/v1/queues/orders", orders).await;
    ok(server, "PUT", "/v1/queues/push", json!({})).await;
    let hook = format!("http://127.0.0.1:9/hook?token={URL_TOKEN}");
    let webhook =
        json!({"paused": true, "delivery": {"type": "webhook", "url": hook, "secret": SECRET}});
    ok(server, "PUT", "/v1/queues/hooks", webhook).await;
    let stream =
        json!({"delivery": {"type": "redis_stream", "connection": "cache", "stream": "s"}});
    ok(server, "PUT", "/v1/queues/events", stream).await;
    let kafka = json!({"delivery": {"type": "kafka", "connection": "log", "topic": "tasks",
                                    "key": "header:X-Order"}});
    ok(server, "PUT", "/v1/queues/kq", kafka).await;

    // A dead letter: leased once, nacked on its only attempt.
    let dead = ok(
        server,
        "POST",
        "/v1/queues/mail/tasks",
        json!({"payload": {"to": "<b>ann</b>@example.com"}}),
    )
    .await;
    let lease = ok(server, "POST", "/v1/queues/mail/lease", json!({"max": 1})).await;
    let lease_id = lease["tasks"][0]["lease_id"]
        .as_str()
        .expect("a lease")
        .to_owned();
    let id = dead["id"].as_str().unwrap().to_owned();
    let nack = json!({"lease_id": lease_id, "reason": "mailbox <full>"});
    let nacked = ok(
        server,
        "POST",
        &format!("/v1/queues/mail/tasks/{id}/nack"),
        nack,
    )
    .await;
    assert_eq!(nacked["state"], "dead", "{nacked}");

    deliveries_and_schedules(server).await;
    id
}

/// A delivery measured (lateness), tasks due later and a schedule (the forecast), a reminder
/// with subscribers.
async fn deliveries_and_schedules(server: &Served) {
    ok(
        server,
        "POST",
        "/v1/queues/orders/tasks",
        json!({"payload": 1}),
    )
    .await;
    let lease = ok(server, "POST", "/v1/queues/orders/lease", json!({"max": 1})).await;
    let task = &lease["tasks"][0];
    let ack = json!({"lease_id": task["lease_id"]});
    ok(
        server,
        "POST",
        &format!(
            "/v1/queues/orders/tasks/{}/ack",
            task["id"].as_str().unwrap()
        ),
        ack,
    )
    .await;
    for minutes in [10, 40, 90, 200] {
        let body = json!({"payload": {"n": minutes}, "delay_ms": minutes * 60_000, "idempotency_key": format!("order-{minutes}")});
        ok(server, "POST", "/v1/queues/orders/tasks", body).await;
    }

    let schedule = json!({"id": "nightly", "queue": "orders", "cron": "*/30 * * * *", "timezone": "Europe/Paris", "payload": {"report": "sales"}});
    ok(server, "POST", "/v1/schedules", schedule).await;
    // A page and one more of schedules (the console shows 100 a page): `tick-099` is on the
    // second, after `nightly` and `tick-000`..`tick-098`.
    for n in 0..100 {
        let tick = json!({"id": format!("tick-{n:03}"), "queue": "push", "every_ms": 3_600_000});
        ok(server, "POST", "/v1/schedules", tick).await;
    }
    let reminder = json!({"id": "match-42", "queue": "push", "run_at": "2099-06-01T20:00:00Z", "content": {"title": "Kick-off!"}, "chunk_size": 2});
    ok(server, "POST", "/v1/reminders", reminder).await;
    let http = reqwest::Client::new();
    let added = http
        .post(format!("{}/v1/reminders/match-42/subscribers", server.url))
        .body("1\n2\n3\n")
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{:?}", added.text().await);
}

/// Fails on any error the pages recorded, and on any error in the browser's log (a failed
/// load, a script error, a refused CSP).
async fn assert_no_errors(browser: &Session) {
    let recorded = browser.js("return window.__errors", vec![]).await;
    assert_eq!(recorded, json!([]), "the console logged JavaScript errors");
    let severe: Vec<Value> = browser
        .browser_log()
        .await
        .into_iter()
        .filter(|e| e["level"] == "SEVERE")
        .collect();
    assert!(severe.is_empty(), "the browser logged errors: {severe:#?}");
}

async fn shoot(browser: &Session, name: &str) {
    let path = screenshots().join(format!("{name}.png"));
    browser.screenshot(&path).await;
    println!("screenshot: {}", path.display());
}

async fn show(browser: &Session, server: &Served, hash: &str) {
    browser
        .goto(&format!("{}/console/{hash}", server.url))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_works_against_a_real_server() {
    // Redis and Kafka connections for stream queues; nothing listens there, and nothing is
    // sent to them.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("belfry.toml");
    std::fs::write(
        &config,
        "[connections.cache]\ntype = \"redis\"\nurl = \"redis://127.0.0.1:9/0\"\n\
         [connections.log]\ntype = \"kafka\"\nbrokers = [\"127.0.0.1:9\"]\n",
    )
    .unwrap();
    let server = serve_with_env(
        &["--store", "memory", "--config", config.to_str().unwrap()],
        &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")],
    );
    let dead = seed(&server).await;
    with_browser(|browser| async move {
        overview(&browser, &server).await;
        queue_page(&browser, &server).await;
        dead_letters(&browser, &server, &dead).await;
        redrive_all(&browser, &server).await;
        task_lookup(&browser, &server).await;
        live_tasks(&browser, &server).await;
        schedules(&browser, &server).await;
        reminders(&browser, &server).await;
        malformed_address(&browser, &server).await;
        assert_no_errors(&browser).await;
        offline_and_back(&browser, &server).await;
    })
    .await;
}

async fn overview(browser: &Session, server: &Served) {
    // `/` redirects to the console, which lists every queue with its counts.
    browser.goto(&format!("{}/", server.url)).await;
    browser.wait("#queues tr[data-queue='mail']").await;
    assert!(browser.current_url().await.contains("/console/"));
    let mail = browser.wait_text("tr[data-queue='mail']", "mail").await;
    assert!(mail.contains("active"), "{mail}");
    let hooks = browser.wait_text("tr[data-queue='hooks']", "paused").await;
    assert!(hooks.contains("webhook"), "{hooks}");
    // The delivered task's lateness (from /metrics), and a rate once two scrapes are in.
    let lateness = "const cells = document.querySelectorAll(\"tr[data-queue='orders'] td\"); \
                    return cells.length && cells[8].innerText !== '—' && cells[7].innerText !== '—' \
                    ? [cells[7].innerText, cells[8].innerText] : null";
    let measured = browser
        .wait_js("orders' rate and lateness", lateness, vec![])
        .await;
    println!("orders: delivered/s and lateness p50 {measured}");
    shoot(browser, "1-overview").await;
}

async fn queue_page(browser: &Session, server: &Served) {
    show(browser, server, "#/queue/orders").await;
    browser.wait_text("#state-fields", "0 of 8").await;
    browser.wait_text("#state-fields", "50 per second").await;
    browser
        .wait_text("#config-fields", "skip past 1m late")
        .await;
    browser.wait_text("#lateness", "1 deliveries").await;
    // The forecast: a uPlot canvas with a size, over a summary of what it counts.
    browser
        .wait_text("#forecast", "tasks in the next 6 h")
        .await;
    browser.wait("#forecast .uplot canvas").await;
    let size = browser
        .js(
            "const c = document.querySelector('#forecast .uplot canvas'); \
             return [c.width, c.height, c.getBoundingClientRect().width]",
            vec![],
        )
        .await;
    let dims: Vec<f64> = size
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        dims.iter().all(|d| *d > 0.0),
        "the forecast canvas has no size: {size}"
    );
    shoot(browser, "2-queue").await;

    // A webhook queue: its delivery is shown without the secret or the URL's query, and with
    // no max_in_flight, it is held to the server's default.
    show(browser, server, "#/queue/hooks").await;
    browser
        .wait_text(
            "#state-fields",
            "0 of server default (webhooks.in_flight_default)",
        )
        .await;
    browser
        .wait_text("#config-fields", "secret: set (hidden)")
        .await;
    let html = browser
        .js("return document.documentElement.outerHTML", vec![])
        .await;
    let html = html.as_str().unwrap();
    assert!(
        !html.contains(SECRET) && !html.contains(URL_TOKEN),
        "a secret is shown"
    );

    // A stream queue has no per-queue cap unless it sets one.
    show(browser, server, "#/queue/events").await;
    browser
        .wait_text(
            "#state-fields",
            "0 (no per-queue limit, only the server's dispatch budgets)",
        )
        .await;
    // It takes no secret, so none is said to be missing.
    let delivery = browser
        .wait_text("#config-fields", "type: redis_stream")
        .await;
    assert!(!delivery.contains("secret"), "{delivery}");
    // Its broker (port 9) answers nothing: the page says so, with why.
    browser.wait_text("#config-fields", "Delivery health").await;
    browser
        .wait_text("#config-fields", "unreachable: connection failed")
        .await;
    // A Kafka queue's message key is no secret: it is shown.
    show(browser, server, "#/queue/kq").await;
    browser
        .wait_text("#config-fields", "key: header:X-Order")
        .await;

    // Pause by a click; the API agrees. A pull queue without max_in_flight has no cap.
    show(browser, server, "#/queue/mail").await;
    browser.wait_text("#state-fields", "0 (no limit)").await;
    browser
        .wait_text("#config-fields", "deliver however late")
        .await;
    browser.click("#pause:not([disabled])").await;
    browser.wait("#resume:not([disabled])").await;
    browser.wait_text("#state-fields", "paused").await;
    let (_, queue) = api(server, None, "GET", "/v1/queues/mail", None).await;
    assert_eq!(queue["paused"], true, "{queue}");
    shoot(browser, "3-queue-paused").await;
}

async fn dead_letters(browser: &Session, server: &Served, id: &str) {
    show(browser, server, "#/queue/mail/dead").await;
    let row = format!("tr[data-task='{id}']");
    // Server text is shown as text: the reason's and the payload's markup is not parsed.
    browser.wait_text(&row, "mailbox <full>").await;
    browser.click(&format!("{row} .inspect")).await;
    browser
        .wait_text("#inspect", "<b>ann</b>@example.com")
        .await;
    // The list came without payloads; Inspect fetched the one task.
    let asked = browser
        .js(
            "return performance.getEntriesByType('resource').map((e) => e.name)",
            vec![],
        )
        .await;
    let asked: Vec<&str> = asked
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let lists: Vec<&&str> = asked.iter().filter(|u| u.contains("/dead?")).collect();
    assert!(
        !lists.is_empty() && lists.iter().all(|u| u.contains("payload=false")),
        "dead letters listed with their payloads: {asked:?}"
    );
    assert!(
        asked
            .iter()
            .any(|u| u.ends_with(&format!("/v1/queues/mail/tasks/{id}"))),
        "{asked:?}"
    );
    let injected = browser
        .js("return document.querySelector('main b') !== null", vec![])
        .await;
    assert_eq!(injected, false, "server text was parsed as HTML");
    shoot(browser, "4-dead-letters").await;
    browser.click(&format!("{row} .redrive")).await;
    browser.wait_text("#dead", "No dead letters.").await;
    browser.wait_text("#banner", "redriven").await;
    let (_, task) = api(
        server,
        None,
        "GET",
        &format!("/v1/queues/mail/tasks/{id}"),
        None,
    )
    .await;
    assert_eq!(task["state"], "scheduled", "{task}");
}

/// "Redrive all" on a queue whose receiver still refuses every task: each dead letter there
/// was when it was pressed is redriven once (and is a dead letter again at once, under the
/// same id), and the message gives that count. Then one is deleted from its row, and "Delete
/// all" deletes the rest.
async fn redrive_all(browser: &Session, server: &Served) {
    const TASKS: u64 = 30;
    let (url, seen) = refusing_receiver().await;
    let queue = json!({"retry": {"max_attempts": 1}, "delivery": {"type": "webhook", "url": url}});
    ok(server, "PUT", "/v1/queues/broken", queue).await;
    for n in 0..TASKS {
        ok(
            server,
            "POST",
            "/v1/queues/broken/tasks",
            json!({ "payload": n }),
        )
        .await;
    }
    settled(server, "broken", TASKS).await;

    show(browser, server, "#/queue/broken/dead").await;
    browser.wait("#dead tr[data-task]").await;
    // The first click arms the button, the second redrives.
    browser.click("#redrive-all").await;
    browser.wait_text("#redrive-all", "Click again").await;
    browser.click("#redrive-all").await;
    let note = browser.wait_text("#banner", "Redrove").await;
    assert_eq!(note, format!("Redrove {TASKS} dead letters."));
    settled(server, "broken", TASKS).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len() as u64, TASKS, "{seen:?}");
    assert!(
        seen.values().all(|n| *n == 2),
        "each task is delivered once, then once more after its one redrive: {seen:?}"
    );
    shoot(browser, "4b-redrive-all").await;

    // One deleted from its row (the first click arms the button), then the rest at once.
    let first = "#dead tr[data-task] .delete";
    browser.click(first).await;
    browser.wait_text(first, "Click again").await;
    browser.click(first).await;
    browser.wait_text("#banner", "deleted").await;
    settled(server, "broken", TASKS - 1).await;
    browser.click("#delete-all").await;
    browser.wait_text("#delete-all", "Click again").await;
    browser.click("#delete-all").await;
    let note = browser.wait_text("#banner", "Deleted").await;
    assert_eq!(note, format!("Deleted {} dead letters.", TASKS - 1));
    browser.wait_text("#dead", "No dead letters.").await;
    let (_, queue) = api(server, None, "GET", "/v1/queues/broken", None).await;
    assert_eq!(queue["dead"], 0, "{queue}");

    // Purge from the queue's page (armed by the first click): tasks due later are dropped.
    for n in 0..3 {
        let task = json!({ "payload": n, "delay_ms": 3_600_000 });
        ok(server, "POST", "/v1/queues/broken/tasks", task).await;
    }
    show(browser, server, "#/queue/broken").await;
    browser.click("#purge").await;
    browser.wait_text("#purge", "Click again").await;
    browser.click("#purge").await;
    let note = browser.wait_text("#banner", "purged").await;
    assert!(note.contains("3 scheduled"), "{note}");
    let (_, queue) = api(server, None, "GET", "/v1/queues/broken", None).await;
    assert_eq!(queue["pending"], 0, "{queue}");
}

async fn task_lookup(browser: &Session, server: &Served) {
    show(browser, server, "#/task").await;
    browser.fill("#lookup-queue", "orders").await;
    browser.click("#lookup-by option[value='key']").await;
    browser.fill("#lookup-value", "order-90").await;
    browser.click("#lookup-form button[type='submit']").await;
    let fields = browser.wait_text("#task-fields", "order-90").await;
    assert!(fields.contains("scheduled"), "{fields}");
    // The queue's late policy, a length of time: not an instant in 1970.
    assert!(fields.contains("1m (60000 ms)"), "{fields}");
    shoot(browser, "5-task").await;
}

/// The ids of the task rows shown.
async fn task_rows(browser: &Session) -> Vec<String> {
    let ids = browser
        .js(
            "return Array.from(document.querySelectorAll('#tasks tr[data-task]'), \
             (r) => r.dataset.task)",
            vec![],
        )
        .await;
    serde_json::from_value(ids).unwrap()
}

/// A queue's live tasks: scheduled and leased ones with their states, due times and clipped
/// payloads (markup shown as text); a scheduled one cancelled from its row (the API says it is
/// cancelled); one leased after the page showed it is refused with a message and its row shown
/// as it is now; one opened whole in the task view; ten a page, the next page and back.
async fn live_tasks(browser: &Session, server: &Served) {
    let submit = |body: Value| async move {
        let task = ok(server, "POST", "/v1/queues/later/tasks", body).await;
        task["id"].as_str().unwrap().to_owned()
    };
    let lease = || async {
        let leased = ok(
            server,
            "POST",
            "/v1/queues/later/lease",
            json!({"max": 1, "visibility_ms": 600_000}),
        )
        .await;
        leased["tasks"][0]["id"]
            .as_str()
            .expect("a lease")
            .to_owned()
    };
    ok(server, "PUT", "/v1/queues/later", json!({})).await;
    // One leased for ten minutes; eleven due in an hour and more; one due now, still scheduled.
    let leased = submit(json!({"payload": "leased"})).await;
    assert_eq!(lease().await, leased);
    let mut later = Vec::new();
    for n in 0..11 {
        let payload = json!({"n": n, "note": "<i>in an hour</i>", "pad": "x".repeat(200)});
        later.push(submit(json!({"payload": payload, "delay_ms": 3_600_000 + n * 60_000})).await);
    }
    let racing = submit(json!({"payload": "racing"})).await;

    show(browser, server, "#/queue/later/tasks").await;
    browser.wait_text("#tasks-page", "page 1, 13 tasks").await;
    browser.wait("#tasks-next[disabled]").await;
    let row = |id: &str| format!("#tasks tr[data-task='{id}']");
    let shown = browser.wait_text(&row(&leased), "leased").await;
    assert!(
        shown.contains("until") && shown.contains("(in 9m"),
        "{shown}"
    );
    let shown = browser.wait_text(&row(&later[10]), "scheduled").await;
    assert!(shown.contains("(in 1h 9m"), "{shown}");
    assert!(
        shown.contains("<i>in an hour</i>") && shown.contains("…"),
        "{shown}"
    );
    let injected = browser
        .js("return document.querySelector('main i') !== null", vec![])
        .await;
    assert_eq!(injected, false, "a payload was parsed as HTML");
    let cancels = format!(
        "return document.querySelector(\"{} .cancel\")",
        row(&leased)
    );
    assert_eq!(
        browser.js(&cancels, vec![]).await,
        Value::Null,
        "a leased task has Cancel"
    );
    shoot(browser, "5b-tasks").await;

    // Cancel, armed by the first click: the row goes, and the task is cancelled.
    let cancel = format!("{} .cancel", row(&later[0]));
    browser.click(&cancel).await;
    browser.wait_text(&cancel, "Click again").await;
    browser.click(&cancel).await;
    browser.wait_text("#banner", "cancelled").await;
    browser.wait_text("#tasks-page", "page 1, 12 tasks").await;
    assert!(!task_rows(browser).await.contains(&later[0]));
    let path = format!("/v1/queues/later/tasks/{}", later[0]);
    let (_, task) = api(server, None, "GET", &path, None).await;
    assert_eq!(task["state"], "cancelled", "{task}");

    // Leased since the page was shown: the cancel is refused (409), and the row says leased.
    assert_eq!(lease().await, racing);
    let cancel = format!("{} .cancel", row(&racing));
    browser.click(&cancel).await;
    browser.wait_text(&cancel, "Click again").await;
    browser.click(&cancel).await;
    let banner = browser.wait_text("#banner", "not cancelled").await;
    assert!(banner.contains("it is leased now"), "{banner}");
    let refreshed = format!("#tasks tr[data-task='{racing}'][data-state='leased']");
    browser.wait_text(&refreshed, "until").await;
    let path = format!("/v1/queues/later/tasks/{racing}");
    let (_, task) = api(server, None, "GET", &path, None).await;
    assert_eq!(task["state"], "leased", "{task}");
    // The refused DELETE is in the browser's log as a failed load, and nothing else.
    for entry in browser.browser_log().await {
        if entry["level"] == "SEVERE" {
            let message = entry["message"].as_str().unwrap_or_default();
            assert!(message.contains("409"), "{entry}");
        }
    }

    // The whole task, in the task view.
    browser.click(&format!("{} a.view", row(&later[1]))).await;
    let fields = browser.wait_text("#task-fields", &later[1]).await;
    assert!(fields.contains(&"x".repeat(200)), "{fields}");

    // Ten a page: the next page has the other two, and every live task is on one of them.
    show(browser, server, "#/queue/later/tasks").await;
    browser.wait_text("#tasks-page", "page 1, 12 tasks").await;
    browser.click("#tasks-limit option[value='10']").await;
    browser.wait_text("#tasks-page", "page 1, 10 tasks").await;
    let first = task_rows(browser).await;
    browser.click("#tasks-next:not([disabled])").await;
    browser.wait_text("#tasks-page", "page 2, 2 tasks").await;
    browser.wait("#tasks-next[disabled]").await;
    let mut all = task_rows(browser).await;
    all.extend(first.iter().cloned());
    all.sort();
    let mut live: Vec<String> = later[1..].to_vec();
    live.extend([leased, racing]);
    live.sort();
    assert_eq!(all, live);
    browser.click("#tasks-first:not([disabled])").await;
    browser.wait_text("#tasks-page", "page 1, 10 tasks").await;
    assert_eq!(task_rows(browser).await, first);
}

async fn schedules(browser: &Session, server: &Served) {
    show(browser, server, "#/schedules").await;
    let row = "tr[data-schedule='nightly']";
    browser.wait_text(row, "Europe/Paris").await;
    // A page of 100, and the next one.
    browser.wait("tr[data-schedule='tick-098']").await;
    let shown = "return document.querySelectorAll('#schedules tr[data-schedule]').length";
    assert_eq!(browser.js(shown, vec![]).await, 100);
    browser.click("#schedules-next:not([disabled])").await;
    browser.wait("tr[data-schedule='tick-099']").await;
    browser.click("#schedules-prev:not([disabled])").await;
    // The page refreshes itself: a schedule made meanwhile shows up.
    let made = json!({"id": "added", "queue": "push", "every_ms": 60_000});
    ok(server, "POST", "/v1/schedules", made).await;
    browser.wait("tr[data-schedule='added']").await;
    browser.click(&format!("{row} button.next")).await;
    let count = "return document.querySelectorAll('.fire-times li').length === 10";
    browser.wait_js("ten next fire times", count, vec![]).await;
    browser.wait_text(".fire-times", "[Europe/Paris]").await;
    shoot(browser, "6-schedules").await;
    browser.click(&format!("{row} button.pause")).await;
    browser.wait(&format!("{row} button.resume")).await;
    let (_, schedule) = api(server, None, "GET", "/v1/schedules/nightly", None).await;
    assert_eq!(schedule["paused"], true, "{schedule}");
    // Run now, paused or not: one task in its queue, due now.
    let (_, before) = api(server, None, "GET", "/v1/queues/orders", None).await;
    browser.click(&format!("{row} button.run")).await;
    browser
        .wait_text("#banner", "ran now: 1 task in orders")
        .await;
    let (_, after) = api(server, None, "GET", "/v1/queues/orders", None).await;
    let pending = |q: &Value| q["pending"].as_u64().unwrap();
    assert_eq!(pending(&after), pending(&before) + 1, "{after}");
}

async fn reminders(browser: &Session, server: &Served) {
    // A reminder firing now, paced at one user a second in chunks of one: its fan-out runs for
    // about 20 s, and the page shows its progress.
    let flash = json!({"id": "flash", "queue": "push", "delay_ms": 1500, "content": {"sale": true},
                       "chunk_size": 1, "users_per_second": 1});
    ok(server, "POST", "/v1/reminders", flash).await;
    let users: String = (1..=20).map(|u| format!("{u}\n")).collect();
    let added = reqwest::Client::new()
        .post(format!("{}/v1/reminders/flash/subscribers", server.url))
        .body(users)
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{:?}", added.text().await);

    show(browser, server, "#/reminders").await;
    let subscribers =
        "const cells = document.querySelectorAll(\"tr[data-reminder='match-42'] td\"); \
                       return cells.length > 5 && cells[5].innerText === '3'";
    browser
        .wait_js("match-42's 3 subscribers", subscribers, vec![])
        .await;
    let progress = browser
        .wait_text("tr[data-reminder='flash'] .fanout", "of 20")
        .await;
    println!("flash fan-out: {progress}");
    shoot(browser, "7-reminders").await;
}

/// A malformed %-escape in the address: "No such page." and a banner, no uncaught error.
async fn malformed_address(browser: &Session, server: &Served) {
    for hash in ["#/queue/%E0%A4%A", "#/queue/%"] {
        show(browser, server, hash).await;
        browser.wait_text("#main", "No such page.").await;
        browser.wait_text("#banner", "malformed %-escape").await;
    }
}

/// The network goes away (the browser is put offline) and comes back: meanwhile the banner
/// says the server cannot be reached and from when the data shown is; once a refresh gets
/// through again it is gone.
async fn offline_and_back(browser: &Session, server: &Served) {
    show(browser, server, "#/").await;
    browser.wait("#queues tr[data-queue='mail']").await;
    let offline = |offline: bool| {
        json!({"offline": offline, "latency": 0, "downloadThroughput": -1,
               "uploadThroughput": -1})
    };
    browser.cdp("Network.enable", json!({})).await;
    browser
        .cdp("Network.emulateNetworkConditions", offline(true))
        .await;
    let banner = browser
        .wait_text("#banner", "cannot reach the server")
        .await;
    assert!(banner.contains("showing data from"), "{banner}");
    // The last data stays on screen.
    browser.wait("#queues tr[data-queue='mail']").await;
    shoot(browser, "8-offline").await;
    browser
        .cdp("Network.emulateNetworkConditions", offline(false))
        .await;
    browser.wait("#banner[hidden]").await;
    browser.cdp("Network.disable", json!({})).await;
    // The failed loads are in the browser's log, expected; the scripts logged no error.
    browser.browser_log().await;
    let recorded = browser.js("return window.__errors", vec![]).await;
    assert_eq!(recorded, json!([]), "the console logged JavaScript errors");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_loads_without_a_token_and_the_api_waits_for_one() {
    let token = "a-console-admin-token-for-the-browser-test";
    let server = serve_with_env(&["--store", "memory"], &[("BELFRY_ADMIN_TOKEN", token)]);
    let (status, _) = api(
        &server,
        Some(token),
        "PUT",
        "/v1/queues/jobs",
        Some(json!({})),
    )
    .await;
    assert!(status < 300);
    let viewer = json!({"name": "viewer", "scopes": ["read"]});
    let (status, made) = api(&server, Some(token), "POST", "/v1/tokens", Some(viewer)).await;
    assert!(status < 300, "{made}");
    let viewer = made["token"].as_str().expect("the new token").to_owned();
    with_browser(|browser| async move {
        browser.goto(&format!("{}/console/", server.url)).await;
        // The page and its scripts load; the first API call is refused and asks for a token.
        browser.wait("#login:not([hidden])").await;
        browser.wait_text("#banner", "401").await;
        let listed = browser
            .js("return document.querySelector('#queues') !== null", vec![])
            .await;
        assert_eq!(listed, false, "queues shown without a token");
        shoot(&browser, "0-login").await;

        browser.fill("#token", "not-the-token").await;
        browser.click("#login-submit").await;
        browser.wait("#login:not([hidden])").await;
        browser.wait_text("#banner", "401").await;

        // A read token lists the queues, but pausing one is refused (403) and asks again.
        browser.fill("#token", &viewer).await;
        browser.click("#login-submit").await;
        browser.wait("#queues tr[data-queue='jobs']").await;
        browser.wait("#login[hidden]").await;
        browser.wait("#banner[hidden]").await;
        show(&browser, &server, "#/queue/jobs").await;
        browser.click("#pause:not([disabled])").await;
        browser.wait_text("#banner", "403").await;
        browser.wait("#login:not([hidden])").await;
        // Another page closes the form again: the read token may look there.
        show(&browser, &server, "#/schedules").await;
        browser.wait("#schedules").await;
        browser.wait("#login[hidden]").await;
        browser.wait("#banner[hidden]").await;
        show(&browser, &server, "#/queue/jobs").await;
        browser.click("#login-open").await;

        // The admin token may.
        browser.fill("#token", token).await;
        browser.click("#login-submit").await;
        browser.wait("#login[hidden]").await;
        browser.click("#pause:not([disabled])").await;
        browser.wait("#resume:not([disabled])").await;
        let (_, jobs) = api(&server, Some(token), "GET", "/v1/queues/jobs", None).await;
        assert_eq!(jobs["paused"], true, "{jobs}");
        rate_limited(&browser, &server, token).await;
        // Refused API calls are in the browser's log as failed loads; scripts logged nothing.
        let recorded = browser.js("return window.__errors", vec![]).await;
        assert_eq!(recorded, json!([]), "the console logged JavaScript errors");
    })
    .await;
}

/// A read token with a low request rate: the Reminders page is one request a refresh, so it
/// shows a page of 25 reminders with their subscribers; and where a refresh is over the rate
/// (`429`), the next waits longer.
async fn rate_limited(browser: &Session, server: &Served, admin: &str) {
    let call = move |method: &'static str, path: String, body: Value| async move {
        let (status, answer) = api(server, Some(admin), method, &path, Some(body)).await;
        assert!(status < 300, "{method} {path}: {status} {answer}");
        answer
    };
    for n in 0..30 {
        let body =
            json!({"id": format!("r{n:02}"), "queue": "jobs", "run_at": "2099-06-01T20:00:00Z"});
        call("POST", "/v1/reminders".into(), body).await;
    }
    let added = reqwest::Client::new()
        .post(format!("{}/v1/reminders/r00/subscribers", server.url))
        .bearer_auth(admin)
        .body("1\n2\n3\n")
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{:?}", added.text().await);
    let slow = json!({"name": "slow", "scopes": ["read"], "rate_per_s": 2, "burst": 2});
    let slow = call("POST", "/v1/tokens".into(), slow).await;
    let trickle = json!({"name": "trickle", "scopes": ["read"], "rate_per_s": 1, "burst": 1});
    let trickle = call("POST", "/v1/tokens".into(), trickle).await;

    show(browser, server, "#/reminders").await;
    browser.click("#login-open").await;
    browser
        .fill("#token", slow["token"].as_str().unwrap())
        .await;
    browser.click("#login-submit").await;
    let full = "return document.querySelectorAll('#reminders tr[data-reminder]').length === 25";
    browser
        .wait_js("a page of 25 reminders", full, vec![])
        .await;
    let subscribers = "const cells = document.querySelectorAll(\"tr[data-reminder='r00'] td\"); \
                       return cells.length > 5 && cells[5].innerText === '3'";
    browser
        .wait_js("r00's 3 subscribers", subscribers, vec![])
        .await;
    browser.wait("#banner[hidden]").await;

    // The overview asks for two things a refresh; a token allowed one a second is refused
    // the second, and the page slows down.
    show(browser, server, "#/").await;
    browser.click("#login-open").await;
    browser
        .fill("#token", trickle["token"].as_str().unwrap())
        .await;
    browser.click("#login-submit").await;
    let banner = browser
        .wait_text("#banner", "refreshing again in 6 s")
        .await;
    assert!(banner.contains("over its request rate"), "{banner}");
}
