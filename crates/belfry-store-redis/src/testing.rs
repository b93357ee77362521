//! Throwaway `redis-server` processes on loopback for tests: one server ([`RedisServer`]) or a
//! cluster ([`RedisCluster`]), each node in its own temporary directory on a free port.
//!
//! Every process is stopped by the PID of the child this module spawned: on drop, and, should
//! the test binary never drop it (a `static`, a panic in a destructor, `kill -9` of the test),
//! by a small watchdog that kills it once the test process is gone. A missing `redis-server`
//! is a panic that says how to install it, never a silent skip.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::target::RedisTarget;

/// How long a freshly started server (or a new cluster) may take to answer.
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);
/// The interval between two polls of a server that is not ready yet.
const POLL: Duration = Duration::from_millis(20);
/// Cluster nodes consider a silent peer failed after this long (milliseconds), so failover
/// tests take seconds, not the default 15.
const CLUSTER_NODE_TIMEOUT_MS: u32 = 2000;
const INSTALL_HINT: &str = "install it with `apt-get install redis-server` (Debian/Ubuntu; \
                            brings redis-cli too) or `brew install redis`; scripts/test.sh \
                            installs it";

/// The partition an idempotency key places its task in, among `partitions`: a test that
/// needs a task on a given master picks its key with this.
pub fn partition_of_key(key: &str, partitions: u16) -> u16 {
    crate::partition_of(key.as_bytes(), partitions)
}

/// One `redis-server` (not a cluster) with append-only persistence and no RDB snapshots.
pub struct RedisServer {
    node: Node,
    appendfsync: String,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server with `appendfsync everysec` and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with("everysec")
    }

    /// Starts a server with the given `appendfsync` policy (`"always"` or `"everysec"`).
    pub fn start_with(appendfsync: &str) -> RedisServer {
        require_binaries(false);
        let dir = temp_dir("belfry-redis-");
        let port = free_ports(1, false)[0];
        let node = Node::spawn(dir.path(), None, port, appendfsync, (false, None));
        node.wait_ping(STARTUP_DEADLINE);
        RedisServer {
            node,
            appendfsync: appendfsync.to_owned(),
            dir,
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.node.port)
    }

    /// A plain connection to this server, for tests that read or seed its keys directly.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection())
            .expect("a connection to the test redis-server")
    }

    pub fn target(&self) -> RedisTarget {
        RedisTarget::Single(self.url())
    }

    pub fn port(&self) -> u16 {
        self.node.port
    }

    pub fn pid(&self) -> u32 {
        self.node.pid
    }

    /// SIGSTOP: the server keeps its socket open but answers nothing (a hung Redis). Returns
    /// once the kernel reports the process stopped.
    pub fn pause(&self) {
        self.node.pause();
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.node.resume();
    }

    /// Stops the server (SIGTERM, so it finishes its AOF; SIGKILL if it does not exit within
    /// a few seconds). Idempotent.
    pub fn stop(&mut self) {
        self.node.stop();
    }

    /// SIGKILL, as a crash: the AOF keeps what its fsync policy wrote. Idempotent.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Starts the server again on the same port and directory (it reloads its AOF), after
    /// stopping it if it still runs, and waits until it answers PING.
    pub fn restart(&mut self) {
        self.node.stop();
        let port = self.node.port;
        self.node = Node::spawn(
            self.dir.path(),
            None,
            port,
            &self.appendfsync,
            (false, None),
        );
        self.node.wait_ping(STARTUP_DEADLINE);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.node.kill();
    }
}

/// One node of a [`RedisCluster`] as [`RedisCluster::nodes`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterNode {
    pub port: u16,
    pub pid: u32,
    /// Whether the node serves slots now (after a failover a former replica is a master).
    pub is_master: bool,
}

/// A Redis Cluster on loopback: `masters` masters with `replicas_per_master` replicas each,
/// formed with `redis-cli --cluster create`.
pub struct RedisCluster {
    nodes: Mutex<Vec<Node>>,
    masters: Vec<u16>,
    /// Every node's `requirepass` (and `masterauth`), when started with one.
    password: Option<String>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts a cluster with `appendfsync everysec` and waits until it serves every slot.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        RedisCluster::start_with_fsync(masters, replicas_per_master, "everysec")
    }

    pub fn start_with_fsync(
        masters: usize,
        replicas_per_master: usize,
        appendfsync: &str,
    ) -> RedisCluster {
        RedisCluster::start_inner(masters, replicas_per_master, appendfsync, None)
    }

    /// A cluster whose nodes require `password` (`requirepass`, and `masterauth` so replicas
    /// can follow their masters); [`RedisCluster::target`] and [`RedisCluster::url`] carry it.
    pub fn start_with_password(
        masters: usize,
        replicas_per_master: usize,
        password: &str,
    ) -> RedisCluster {
        RedisCluster::start_inner(masters, replicas_per_master, "everysec", Some(password))
    }

    fn start_inner(
        masters: usize,
        replicas_per_master: usize,
        appendfsync: &str,
        password: Option<&str>,
    ) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        require_binaries(true);
        let dir = temp_dir("belfry-redis-cluster-");
        let ports = free_ports(masters * (1 + replicas_per_master), true);
        let nodes: Vec<Node> = ports
            .iter()
            .map(|&port| {
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir(&node_dir)
                    .unwrap_or_else(|e| panic!("create {}: {e}", node_dir.display()));
                Node::spawn(
                    &node_dir,
                    Some(dir.path()),
                    port,
                    appendfsync,
                    (true, password),
                )
            })
            .collect();
        for node in &nodes {
            node.wait_ping(STARTUP_DEADLINE);
        }
        create_cluster(&ports, replicas_per_master, password);
        let mut cluster = RedisCluster {
            nodes: Mutex::new(nodes),
            masters: Vec::new(),
            password: password.map(str::to_owned),
            _dir: dir,
        };
        if let Err(why) = cluster.wait_healthy(STARTUP_DEADLINE) {
            panic!("the new cluster on ports {ports:?} did not become healthy: {why}");
        }
        // redis-cli chooses the masters; ask the cluster which it chose.
        cluster.masters = cluster
            .nodes()
            .into_iter()
            .filter(|n| n.is_master)
            .map(|n| n.port)
            .collect();
        assert_eq!(cluster.masters.len(), masters, "masters of the new cluster");
        cluster
    }

    /// The masters as they were when the cluster was formed.
    pub fn target(&self) -> RedisTarget {
        RedisTarget::Cluster(
            self.masters
                .iter()
                .map(|p| format!("redis://{}127.0.0.1:{p}", self.auth()))
                .collect(),
        )
    }

    /// `:password@` when the nodes require one, else nothing.
    fn auth(&self) -> String {
        self.password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default()
    }

    /// `redis-cluster://127.0.0.1:P1,127.0.0.1:P2,…` (the masters as formed).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .masters
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://{}{}", self.auth(), nodes.join(","))
    }

    /// Every node still running (not killed), with its role as a live node reports it now.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let nodes = self.nodes.lock().unwrap();
        let masters = nodes
            .iter()
            .filter(|n| n.running())
            .find_map(|n| n.slot_owners().ok());
        nodes
            .iter()
            .filter(|n| n.running())
            .map(|n| ClusterNode {
                port: n.port,
                pid: n.pid,
                is_master: match &masters {
                    Some(masters) => masters.contains(&n.port),
                    None => self.masters.contains(&n.port),
                },
            })
            .collect()
    }

    /// SIGKILL of one node (a crash: no AOF flush beyond what its fsync policy did).
    pub fn kill(&self, port: u16) {
        self.with_node(port, Node::kill);
    }

    /// SIGSTOP of one node; it keeps its sockets but answers nothing.
    pub fn pause(&self, port: u16) {
        self.with_node(port, |n| n.pause());
    }

    pub fn resume(&self, port: u16) {
        self.with_node(port, |n| n.resume());
    }

    /// Waits until every live, unpaused node reports `cluster_state:ok` with all 16384 slots
    /// served by nodes that are up, and every replica is in sync with its master (so it could
    /// take over); the error says what the last poll saw.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.health();
            match seen {
                Ok(()) => return Ok(()),
                Err(why) if Instant::now() >= deadline => {
                    return Err(format!("not healthy after {timeout:?}: {why}"))
                }
                Err(_) => std::thread::sleep(POLL * 5),
            }
        }
    }

    fn health(&self) -> Result<(), String> {
        let nodes = self.nodes.lock().unwrap();
        let live: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.running() && !n.paused())
            .collect();
        if live.is_empty() {
            return Err("no live node".into());
        }
        let up: Vec<u16> = live.iter().map(|n| n.port).collect();
        for node in live {
            let info: String = node
                .query(redis::cmd("CLUSTER").arg("INFO"))
                .map_err(|e| format!("node {}: CLUSTER INFO: {e}", node.port))?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
                    .unwrap_or("?")
                    .to_owned()
            };
            let (state, slots) = (field("cluster_state"), field("cluster_slots_ok"));
            if state != "ok" || slots != "16384" {
                return Err(format!(
                    "node {}: cluster_state:{state}, cluster_slots_ok:{slots}",
                    node.port
                ));
            }
            // A replica that has not synced with its master could not take over from it.
            let replication: String = node
                .query(redis::cmd("INFO").arg("replication"))
                .map_err(|e| format!("node {}: INFO replication: {e}", node.port))?;
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
                return Err(format!(
                    "replica {} is not in sync with its master",
                    node.port
                ));
            }
            // Right after a kill the others still think the dead node serves its slots: only
            // slot owners this harness knows to be up count.
            let owners = node
                .slot_owners()
                .map_err(|e| format!("node {}: CLUSTER NODES: {e}", node.port))?;
            if let Some(down) = owners.iter().find(|p| !up.contains(p)) {
                return Err(format!(
                    "node {} sees slots on {down}, which is down or paused",
                    node.port
                ));
            }
        }
        Ok(())
    }

    fn with_node(&self, port: u16, act: impl FnOnce(&mut Node)) {
        let mut nodes = self.nodes.lock().unwrap();
        let node = nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node of this cluster on port {port}"));
        act(node);
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let nodes = self.nodes.get_mut().unwrap_or_else(|e| e.into_inner());
        for node in nodes {
            node.kill();
        }
    }
}

/// A redis-server child process and its watchdog.
struct Node {
    port: u16,
    pid: u32,
    /// `None` once the process is stopped (or killed) and reaped.
    child: Option<Child>,
    watchdog: Option<Child>,
    is_paused: AtomicBool,
    password: Option<String>,
}

impl Node {
    /// Starts a node with its files in `dir`; `parent`, when given, is removed with it by the
    /// watchdog once empty (a cluster's directory).
    fn spawn(
        dir: &Path,
        parent: Option<&Path>,
        port: u16,
        appendfsync: &str,
        (cluster, password): (bool, Option<&str>),
    ) -> Node {
        assert!(
            matches!(appendfsync, "always" | "everysec" | "no"),
            "appendfsync {appendfsync:?}: use \"always\" or \"everysec\""
        );
        let mut conf = format!(
            "bind 127.0.0.1\nport {port}\nprotected-mode yes\ndaemonize no\n\
             dir {dir}\nlogfile {dir}/redis.log\nappendonly yes\nappendfsync {appendfsync}\n\
             save \"\"\nenable-debug-command local\n",
            dir = dir.display()
        );
        if cluster {
            conf.push_str(&format!(
                "cluster-enabled yes\ncluster-config-file nodes.conf\n\
                 cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}\n"
            ));
        }
        if let Some(password) = password {
            conf.push_str(&format!("requirepass {password}\nmasterauth {password}\n"));
        }
        let conf_path = dir.join("redis.conf");
        std::fs::write(&conf_path, conf)
            .unwrap_or_else(|e| panic!("write {}: {e}", conf_path.display()));
        let child = Command::new("redis-server")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start redis-server on port {port}: {e}; {INSTALL_HINT}"));
        let pid = child.id();
        Node {
            port,
            pid,
            child: Some(child),
            watchdog: Some(spawn_watchdog(pid, dir, parent)),
            is_paused: AtomicBool::new(false),
            password: password.map(str::to_owned),
        }
    }

    fn running(&self) -> bool {
        self.child.is_some()
    }

    fn paused(&self) -> bool {
        self.is_paused.load(Ordering::Relaxed)
    }

    fn client(&self) -> redis::Client {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port))
            .expect("a loopback URL parses")
    }

    /// One command on a fresh connection, bounded by a short timeout.
    fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
        let limit = Duration::from_secs(2);
        let mut con = self.client().get_connection_with_timeout(limit)?;
        con.set_read_timeout(Some(limit))?;
        con.set_write_timeout(Some(limit))?;
        cmd.query(&mut con)
    }

    fn wait_ping(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            match self.query::<String>(&mut redis::cmd("PING")) {
                Ok(_) => return,
                Err(e) if Instant::now() >= deadline => panic!(
                    "redis-server on port {} did not answer PING within {timeout:?}: {e} \
                     (its log is redis.log in its directory)",
                    self.port
                ),
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// Ports of the masters that serve slots, as this node sees them.
    fn slot_owners(&self) -> redis::RedisResult<Vec<u16>> {
        // After the 8 fixed fields of a line come its slot ranges.
        self.masters_where(|fields| fields.len() > 8)
    }

    fn masters_where(&self, keep: impl Fn(&[&str]) -> bool) -> redis::RedisResult<Vec<u16>> {
        let text: String = self.query(redis::cmd("CLUSTER").arg("NODES"))?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').filter(|f| !f.is_empty()).collect();
                let flags = fields.get(2)?;
                if !flags.split(',').any(|f| f == "master") || !keep(&fields) {
                    return None;
                }
                // ip:port@busport[,hostname]
                let addr = fields.get(1)?.split('@').next()?;
                addr.rsplit_once(':')?.1.parse().ok()
            })
            .collect())
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    fn pause(&self) {
        assert!(self.running(), "pause: node {} is not running", self.port);
        self.signal("STOP");
        self.is_paused.store(true, Ordering::Relaxed);
        wait_state(self.pid, |s| s == 'T', "stopped");
    }

    fn resume(&self) {
        assert!(self.running(), "resume: node {} is not running", self.port);
        self.signal("CONT");
        self.is_paused.store(false, Ordering::Relaxed);
        wait_state(self.pid, |s| s != 'T', "running");
    }

    /// SIGTERM (after SIGCONT if paused), then SIGKILL if the server is still there after a
    /// few seconds.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.paused() {
            self.signal("CONT");
            self.is_paused.store(false, Ordering::Relaxed);
        }
        if matches!(child.try_wait(), Ok(None)) {
            self.signal("TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        self.stop_watchdog();
    }

    /// SIGKILL, as a crash. Idempotent.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.is_paused.store(false, Ordering::Relaxed);
        self.stop_watchdog();
    }

    fn stop_watchdog(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A shell that SIGKILLs `pid` and removes its directory (and `parent`, if then empty) once
/// this test process is gone, so a server held in a `static` (never dropped) does not outlive
/// the test binary.
fn spawn_watchdog(pid: u32, dir: &Path, parent: Option<&Path>) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(
            "while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; \
             kill -9 \"$1\" 2>/dev/null; sleep 1; rm -rf \"$2\"; \
             [ -z \"$3\" ] || rmdir \"$3\" 2>/dev/null",
        )
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .arg(dir)
        .arg(parent.unwrap_or(Path::new("")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start the watchdog of redis-server {pid}: {e}"))
}

/// Waits until `/proc/PID/stat` shows a state `want` accepts (`T` is stopped).
fn wait_state(pid: u32, want: impl Fn(char) -> bool, what: &str) {
    let stat = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&stat).unwrap_or_default();
        // The state follows the parenthesised command name.
        let state = text
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state.is_some_and(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} is not {what} after 5 s (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn require_binaries(cluster: bool) {
    let programs: &[&str] = if cluster {
        &["redis-server", "redis-cli"]
    } else {
        &["redis-server"]
    };
    for program in programs {
        let runs = Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            runs,
            "{program} is not installed or does not run: {INSTALL_HINT}"
        );
    }
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("create a temporary directory for redis-server: {e}"))
}

/// `count` distinct free loopback ports, never handed out before in this process (so servers
/// started in parallel do not race for one). With `bus`, PORT + 10000 (the cluster bus) is
/// free too.
fn free_ports(count: usize, bus: bool) -> Vec<u16> {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut given = GIVEN.get_or_init(Default::default).lock().unwrap();
    let mut ports = Vec::with_capacity(count);
    // Probes hold their listeners until all ports are chosen, so the kernel hands out
    // distinct ones.
    let mut probes = Vec::new();
    for _ in 0..count * 200 {
        if ports.len() == count {
            break;
        }
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
        let port = probe.local_addr().expect("probe address").port();
        let bus_free = !bus
            || port
                .checked_add(10_000)
                .is_some_and(|b| TcpListener::bind(("127.0.0.1", b)).is_ok());
        if bus_free && given.insert(port) {
            ports.push(port);
        }
        probes.push(probe);
    }
    assert_eq!(ports.len(), count, "found only {} free ports", ports.len());
    ports
}

/// Forms the cluster: the first `ports.len() / (1 + replicas)` nodes become masters.
fn create_cluster(ports: &[u16], replicas: usize, password: Option<&str>) {
    let mut cmd = Command::new("redis-cli");
    if let Some(password) = password {
        cmd.arg("-a").arg(password).arg("--no-auth-warning");
    }
    cmd.arg("--cluster").arg("create");
    for port in ports {
        cmd.arg(format!("127.0.0.1:{port}"));
    }
    let output = cmd
        .arg("--cluster-replicas")
        .arg(replicas.to_string())
        .arg("--cluster-yes")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run redis-cli --cluster create: {e}; {INSTALL_HINT}"));
    assert!(
        output.status.success(),
        "redis-cli --cluster create {ports:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
