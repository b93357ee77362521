//! Real servers for the conformance suite, each on a free loopback port, started by the test
//! and stopped by the PID of the child it spawned (on drop too). A missing server binary is a
//! test failure that says how to install it, never a silent skip.

pub use belfry_sinks::testing::free_port;
use belfry_sinks::testing::{require_program, tansu_bin, wait_until};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a freshly started server may take to answer.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

/// A child process this test started. Killed by its PID on drop.
pub struct Process {
    child: Child,
    paused: bool,
}

impl Process {
    fn spawn(command: &mut Command) -> Process {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("start {command:?}: {error}"));
        Process {
            child,
            paused: false,
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// SIGSTOP: the server keeps its sockets but answers nothing (a hung broker).
    pub fn pause(&mut self) {
        self.signal("STOP");
        self.paused = true;
        // `kill` returns once the signal is sent; the process stops when the kernel gets to
        // it. Wait until /proc says it is stopped, so no request slips through meanwhile.
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            // The state follows the parenthesised command name.
            let stopped = state
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'));
            if stopped {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("process {} did not stop", self.child.id());
    }

    pub fn resume(&mut self) {
        self.signal("CONT");
        self.paused = false;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.paused {
            self.signal("CONT");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- redis-server ----

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    pub process: Option<Process>,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        require_program("redis-server", "apt-get install redis-server");
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            process: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Starts (again) on the same port.
    pub async fn restart(&mut self) {
        self.process = Some(Process::spawn(
            Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(self.dir.path()),
        ));
        let url = self.url();
        wait_until("redis-server", || {
            let url = url.clone();
            async move {
                let Ok(client) = redis::Client::open(url) else {
                    return false;
                };
                let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
                    return false;
                };
                redis::cmd("PING")
                    .query_async::<String>(&mut connection)
                    .await
                    .is_ok()
            }
        })
        .await;
    }

    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }
}

// ---- nats-server ----

pub struct NatsServer {
    pub port: u16,
    store: tempfile::TempDir,
    pub process: Option<Process>,
}

impl NatsServer {
    pub async fn start() -> NatsServer {
        require_program("nats-server", "apt-get install nats-server");
        let mut server = NatsServer {
            port: free_port(),
            store: tempfile::tempdir().expect("temp dir"),
            process: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Starts (again) on the same port with the same JetStream store (streams survive).
    pub async fn restart(&mut self) {
        self.process = Some(Process::spawn(
            Command::new("nats-server")
                .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
                .arg("-sd")
                .arg(self.store.path()),
        ));
        let url = self.url();
        wait_until("nats-server", || {
            let url = url.clone();
            async move {
                let Ok(client) = async_nats::connect(url).await else {
                    return false;
                };
                // Ready once JetStream answers, not only the client port.
                match client.request("$JS.API.INFO", "".into()).await {
                    Ok(reply) => {
                        if std::env::var_os("BELFRY_DEBUG_NATS").is_some() {
                            eprintln!("{:?}", String::from_utf8_lossy(&reply.payload));
                        }
                        reply.payload.starts_with(b"{")
                    }
                    Err(error) => {
                        if std::env::var_os("BELFRY_DEBUG_NATS").is_some() {
                            eprintln!("{error}");
                        }
                        false
                    }
                }
            }
        })
        .await;
    }

    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = async_nats::connect(self.url())
            .await
            .expect("connect to nats");
        async_nats::jetstream::new(client)
    }
}

// ---- Tansu (Kafka protocol) ----

pub struct KafkaServer {
    pub port: u16,
    bin: PathBuf,
    pub process: Option<Process>,
}

impl KafkaServer {
    pub async fn start() -> KafkaServer {
        let mut server = KafkaServer {
            port: free_port(),
            bin: tansu_bin(),
            process: None,
        };
        server.restart().await;
        server
    }

    pub fn broker(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Starts (again) on the same port. Memory storage: topics are gone after a restart.
    pub async fn restart(&mut self) {
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        self.process = Some(Process::spawn(
            Command::new(&self.bin)
                .arg("broker")
                .args(["--listener-url", &listener])
                .args(["--advertised-listener-url", &listener])
                .args(["--storage-engine", "memory://tansu/"])
                .args(["--cluster-id", &format!("belfry-test-{}", self.port)]),
        ));
        let broker = self.broker();
        wait_until("tansu", || {
            let broker = broker.clone();
            async move {
                match rskafka::client::ClientBuilder::new(vec![broker])
                    .build()
                    .await
                {
                    Ok(client) => client.list_topics().await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    pub async fn client(&self) -> rskafka::client::Client {
        rskafka::client::ClientBuilder::new(vec![self.broker()])
            .build()
            .await
            .expect("connect to the kafka broker")
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let client = self.client().await;
        client
            .controller_client()
            .expect("controller client")
            .create_topic(topic, partitions, 1, 5_000)
            .await
            .expect("create topic");
        // Wait until the topic shows in the metadata.
        wait_until("topic metadata", || {
            let client = &client;
            async move {
                client
                    .list_topics()
                    .await
                    .is_ok_and(|topics| topics.iter().any(|t| t.name == topic))
            }
        })
        .await;
    }
}

// ---- an HTTP receiver for webhooks ----

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Request {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// How the receiver answers: a status, after a delay.
#[derive(Debug, Default)]
pub struct Behaviour {
    pub status: AtomicU16,
    pub delay_ms: AtomicU64,
}

/// An axum receiver on loopback that records requests; it can be stopped and started again on
/// the same port.
pub struct Receiver {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Request>>>,
    pub behaviour: Arc<Behaviour>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let mut receiver = Receiver {
            port: free_port(),
            requests: Arc::default(),
            behaviour: Arc::new(Behaviour {
                status: AtomicU16::new(200),
                delay_ms: AtomicU64::new(0),
            }),
            task: None,
        };
        receiver.restart().await;
        receiver
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Stops listening and closes every connection, kept-alive ones included, before it returns:
    /// a request sent after `stop` can only fail.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // The connections live inside this task's future, so once it has ended (cancelled)
            // every socket is closed.
            let _ = task.await;
        }
    }

    pub async fn restart(&mut self) {
        let requests = Arc::clone(&self.requests);
        let behaviour = Arc::clone(&self.behaviour);
        let handler = move |headers: http::HeaderMap, body: bytes::Bytes| {
            let requests = Arc::clone(&requests);
            let behaviour = Arc::clone(&behaviour);
            async move {
                let delay = behaviour.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let status = behaviour.status.load(Ordering::SeqCst);
                if (200..300).contains(&status) {
                    requests.lock().expect("requests").push(Request {
                        headers: headers
                            .iter()
                            .map(|(n, v)| {
                                (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())
                            })
                            .collect(),
                        body: body.to_vec(),
                    });
                }
                http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK)
            }
        };
        let app = axum::Router::new().route("/hook", axum::routing::post(handler));
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let listener = loop {
            match tokio::net::TcpListener::bind(address).await {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(Instant::now() < deadline, "bind {address}: {error}");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        };
        self.task = Some(tokio::spawn(serve_until_aborted(listener, app)));
    }
}

/// Serves `app` on `listener`, each connection polled inside this one future: cancelling it
/// closes the listener and every connection together, and awaiting the cancelled task proves
/// they are gone. (`axum::serve` spawns each connection as a task of its own, so a kept-alive
/// connection outlived `stop`; a set of spawned tasks is aborted only asynchronously, so one
/// could still answer a request sent just after `stop`.)
async fn serve_until_aborted(listener: tokio::net::TcpListener, app: axum::Router) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut connections = FuturesUnordered::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors, say: try again shortly rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                connections.push(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(()) = connections.next(), if !connections.is_empty() => {}
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A TCP server that answers every connection with junk bytes and closes it: a broker that
/// sends garbage or dies mid-response.
pub struct GarbageServer {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl GarbageServer {
    pub async fn start() -> GarbageServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind garbage server");
        let port = listener.local_addr().expect("address").port();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    // Something that parses as none of HTTP, RESP, NATS INFO or a Kafka frame
                    // (a 4-byte length far beyond the payload), then a close.
                    let _ = socket
                        .write_all(b"\x7f\xff\xff\xf0\x00garbage\r\n-\x00\xff{{{\r\n")
                        .await;
                    let mut buffer = [0u8; 1024];
                    let _ =
                        tokio::time::timeout(Duration::from_millis(50), socket.read(&mut buffer))
                            .await;
                });
            }
        });
        GarbageServer { port, task }
    }
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
