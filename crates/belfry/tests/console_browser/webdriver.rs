//! A small WebDriver (W3C) client over reqwest, for the console's browser test: Debian's
//! `chromedriver` driving headless `chromium`. Only what the test needs: navigate, find and wait
//! for elements, click, type, run a script, screenshot, read the browser's log.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a wait for an element or a condition may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

const INSTALL_HINT: &str = "the console's browser test needs Debian's chromium and chromedriver: \
     `apt-get install chromium chromium-driver` (scripts/test.sh installs them), or set \
     CHROMEDRIVER and CHROMIUM to their paths";

/// Where a program is: `$env`, else the first of `names` on the PATH or in /usr/bin.
fn program(env: &str, names: &[&str]) -> String {
    if let Ok(path) = std::env::var(env) {
        return path;
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for name in names {
        for dir in path.split(':').chain(["/usr/bin", "/usr/lib/chromium"]) {
            let candidate = Path::new(dir).join(name);
            if candidate.is_file() {
                return candidate.to_string_lossy().into_owned();
            }
        }
    }
    panic!("{} not found: {INSTALL_HINT}", names[0]);
}

/// A `chromedriver` process on a free loopback port; killed when dropped.
pub struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    pub async fn start() -> Driver {
        let binary = program("CHROMEDRIVER", &["chromedriver"]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {binary}: {e}; {INSTALL_HINT}"));
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = driver
                .http
                .get(format!("{}/status", driver.url))
                .send()
                .await;
            if let Ok(answer) = ready {
                let status: Value = answer.json().await.unwrap_or_default();
                if status["value"]["ready"] == true {
                    return driver;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not get ready");
            tokio::time::sleep(POLL).await;
        }
    }

    /// A headless Chromium at laptop size, its console log kept.
    pub async fn session(&self, profile: &Path) -> Session {
        let chromium = program("CHROMIUM", &["chromium", "chromium-browser"]);
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1366,768",
                         "--no-first-run", format!("--user-data-dir={}", profile.display())],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
            "timeouts": {"script": 30000, "pageLoad": 30000, "implicit": 0},
        }}});
        let answer = self
            .http
            .post(format!("{}/session", self.url))
            .json(&capabilities)
            .send()
            .await
            .expect("ask chromedriver for a session");
        let body: Value = answer.json().await.expect("a JSON answer");
        let id = body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {body}; {INSTALL_HINT}"))
            .to_owned();
        Session {
            http: self.http.clone(),
            url: format!("{}/session/{id}", self.url),
        }
    }
}

/// One browser.
#[derive(Clone)]
pub struct Session {
    http: reqwest::Client,
    url: String,
}

impl Session {
    /// One WebDriver command; panics with the driver's error.
    pub async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        Self::call(&self.http, &self.url, method, path, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    async fn call(
        http: &reqwest::Client,
        base: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut request = http.request(method, format!("{base}{path}"));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.map_err(|e| e.to_string())?;
        let body: Value = answer.json().await.map_err(|e| e.to_string())?;
        match body["value"].get("error") {
            Some(error) => Err(format!("{error}: {}", body["value"]["message"])),
            None => Ok(body["value"].clone()),
        }
    }

    pub async fn quit(&self) {
        let _ = Self::call(&self.http, &self.url, "DELETE", "", None).await;
    }

    /// Chrome DevTools command (chromedriver's extension).
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
    }

    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    pub async fn current_url(&self) -> String {
        self.cmd("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Waits until `script` returns something truthy, and returns it.
    pub async fn wait_js(&self, what: &str, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let value = self.js(script, args.clone()).await;
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value != json!("")
                && value != json!(0);
            if truthy {
                return value;
            }
            if Instant::now() > deadline {
                let body = self.js("return document.body.innerText", vec![]).await;
                panic!("waited {WAIT:?} for {what}; the page shows:\n{body}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for an element matching `css`, and returns its WebDriver id.
    pub async fn wait(&self, css: &str) -> String {
        let deadline = Instant::now() + WAIT;
        let query = json!({"using": "css selector", "value": css});
        loop {
            let found = self.cmd("POST", "/elements", Some(query.clone())).await;
            if let Some(id) = found[0][ELEMENT].as_str() {
                return id.to_owned();
            }
            if Instant::now() > deadline {
                let body = self.js("return document.body.innerText", vec![]).await;
                panic!("waited {WAIT:?} for an element matching {css}; the page shows:\n{body}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for the element and clicks it. A page that refreshes itself may replace the
    /// element between finding and clicking it: then the new one is found and clicked.
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let id = self.wait(css).await;
            let path = format!("/element/{id}/click");
            match Self::call(&self.http, &self.url, "POST", &path, Some(json!({}))).await {
                Ok(_) => return,
                Err(e) if e.contains("stale element") && Instant::now() < deadline => continue,
                Err(e) => panic!("click {css}: {e}"),
            }
        }
    }

    /// Waits for the input, empties it and types `text`.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.wait(css).await;
        self.cmd("POST", &format!("/element/{id}/clear"), Some(json!({})))
            .await;
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Waits until the element's text contains `needle`, and returns the text.
    pub async fn wait_text(&self, css: &str, needle: &str) -> String {
        let script = "const e = document.querySelector(arguments[0]); \
                      return e && e.innerText.includes(arguments[1]) ? e.innerText : null";
        let what = format!("{css} to show {needle:?}");
        let value = self
            .wait_js(&what, script, vec![json!(css), json!(needle)])
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }

    pub async fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let png = self.cmd("GET", "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 PNG"))
            .expect("a PNG");
        std::fs::write(path, bytes).expect("write the screenshot");
    }

    /// The browser's log entries since the last call (`{level, message}`).
    pub async fn browser_log(&self) -> Vec<Value> {
        let log = self
            .cmd("POST", "/se/log", Some(json!({"type": "browser"})))
            .await;
        log.as_array().cloned().unwrap_or_default()
    }
}
