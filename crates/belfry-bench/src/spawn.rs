//! The server under test: either one at `--url`, or a `belfry serve` this process starts on
//! a free loopback port and a temporary data dir (`--spawn`), which it can also `kill -9`
//! and restart on the same data.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;

use crate::error::BenchError;
use crate::http::{HttpConn, Target};

/// How long a spawned server may take to answer `/readyz` before the run gives up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Pause between `/readyz` polls: short, because restart time is what `pending` measures.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A `belfry serve` child process.
pub struct SpawnedServer {
    bin: PathBuf,
    child: Option<Child>,
    pub target: Target,
    pub data_dir: PathBuf,
    log_path: PathBuf,
    /// Extra environment of the child (e.g. allowing loopback webhook targets).
    env: Vec<(String, String)>,
    /// Keeps the data dir (and the log beside it) alive for the run.
    _work_dir: tempfile::TempDir,
}

impl SpawnedServer {
    /// Starts `bin serve` with a fresh data dir under `parent` (the system temp dir when
    /// None), and waits until it is ready.
    pub async fn start(
        bin: &Path,
        parent: Option<&Path>,
        env: Vec<(String, String)>,
    ) -> Result<Self, BenchError> {
        let work_dir = match parent {
            // A --spawn-dir that does not exist yet is made, as `mkdir -p` would.
            Some(p) => std::fs::create_dir_all(p).and_then(|()| {
                tempfile::Builder::new()
                    .prefix("belfry-bench-")
                    .tempdir_in(p)
            }),
            None => tempfile::Builder::new().prefix("belfry-bench-").tempdir(),
        }
        .map_err(|e| {
            BenchError::io(
                "create temp dir in",
                parent.unwrap_or(Path::new("$TMPDIR")),
                e,
            )
        })?;
        let data_dir = work_dir.path().join("data");
        let log_path = work_dir.path().join("server.log");
        let port = crate::sys::free_port()
            .map_err(|e| BenchError::io("find a free port", "127.0.0.1:0", e))?;
        let target = Target::from_addr(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let mut server = SpawnedServer {
            bin: bin.to_path_buf(),
            child: None,
            target,
            data_dir,
            log_path,
            env,
            _work_dir: work_dir,
        };
        server.launch()?;
        server.wait_ready().await?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), BenchError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| BenchError::io("open server log", &self.log_path, e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| BenchError::io("open server log", &self.log_path, e))?;
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--listen")
            .arg(self.target.addr.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| BenchError::io("start", &self.bin, e))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Polls `/readyz` until it answers 200; returns how long that took. Fails early when
    /// the child exits.
    pub async fn wait_ready(&mut self) -> Result<Duration, BenchError> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(BenchError::Server(format!(
                        "{} exited with {status} before it was ready; log: {}\n{}",
                        self.bin.display(),
                        self.log_path.display(),
                        self.log_tail()
                    )));
                }
            }
            if let Ok(mut conn) = HttpConn::connect(&self.target).await {
                if let Ok((status, _)) = conn
                    .request(Method::GET, "/readyz", bytes::Bytes::new())
                    .await
                {
                    if status.is_success() {
                        return Ok(started.elapsed());
                    }
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(BenchError::Server(format!(
                    "not ready after {READY_TIMEOUT:?}; log: {}",
                    self.log_path.display()
                )));
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }

    /// SIGKILL (our own child, by its handle), then start again on the same data dir and
    /// port; returns the time from the new spawn to the first 200 from `/readyz`.
    pub async fn kill9_and_restart(&mut self) -> Result<Duration, BenchError> {
        self.kill9();
        let started = Instant::now();
        self.launch()?;
        self.wait_ready().await?;
        Ok(started.elapsed())
    }

    /// SIGKILL our own child (by its handle), leaving it down.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Child::kill sends SIGKILL on Unix: exactly `kill -9`, to exactly our child.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Graceful stop: SIGTERM through `kill`, then SIGKILL if it lingers.
    pub fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The `belfry` binary to spawn: the flag, else this executable when it is `belfry` (the
/// bench wired into the main binary), else a `belfry` next to this executable (cargo puts
/// both in the same target dir), else `belfry` on PATH.
pub fn belfry_bin(flag: Option<&Path>) -> PathBuf {
    if let Some(path) = flag {
        return path.to_path_buf();
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "belfry") {
            return exe;
        }
        if let Some(sibling) = exe.parent().map(|d| d.join("belfry")) {
            if sibling.is_file() {
                return sibling;
            }
        }
    }
    PathBuf::from("belfry")
}

/// The server a scenario drives.
pub struct ServerUnderTest {
    pub target: Target,
    pub pid: Option<u32>,
    pub spawned: Option<SpawnedServer>,
}

impl ServerUnderTest {
    /// `extra_env` is added to a spawned server's environment (after `--server-env`).
    pub async fn connect_or_spawn(
        args: &crate::ServerArgs,
        extra_env: &[(&str, &str)],
    ) -> Result<Self, BenchError> {
        if args.spawn {
            let bin = belfry_bin(args.belfry_bin.as_deref());
            let mut env = Vec::new();
            for pair in &args.server_env {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    BenchError::invalid("--server-env", format!("{pair:?} is not KEY=VALUE"))
                })?;
                env.push((k.to_string(), v.to_string()));
            }
            env.extend(
                extra_env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            let server = SpawnedServer::start(&bin, args.spawn_dir.as_deref(), env).await?;
            Ok(ServerUnderTest {
                target: server.target.clone(),
                pid: server.pid(),
                spawned: Some(server),
            })
        } else {
            Ok(ServerUnderTest {
                target: Target {
                    token: args.token.clone(),
                    ..Target::parse(&args.url)?
                },
                pid: args.server_pid,
                spawned: None,
            })
        }
    }

    pub fn data_dir(&self, flag: Option<&Path>) -> Option<PathBuf> {
        self.spawned
            .as_ref()
            .map(|s| s.data_dir.clone())
            .or_else(|| flag.map(Path::to_path_buf))
    }

    pub fn stop(self) {
        if let Some(s) = self.spawned {
            s.stop();
        }
    }

    /// Deletes what a run created on a server it did not start (a spawned server goes away
    /// with its data dir): `DELETE` of each of `paths` over `connections`. Answers how many
    /// were deleted, or `None` for a spawned server.
    pub async fn clean_up(
        &self,
        paths: impl Iterator<Item = String>,
        connections: usize,
        bar: indicatif::ProgressBar,
    ) -> Option<u64> {
        if self.spawned.is_some() {
            return None;
        }
        let requests: Vec<(String, bytes::Bytes)> =
            paths.map(|path| (path, bytes::Bytes::new())).collect();
        let done = crate::queues::send_all(
            &self.target,
            Method::DELETE,
            std::sync::Arc::new(requests),
            connections,
            bar,
        )
        .await;
        Some(done.ok)
    }
}

/// Creates (or updates) queue `name` with `body` as its config.
pub async fn create_queue(target: &Target, name: &str, body: &str) -> Result<(), BenchError> {
    let mut conn = HttpConn::connect(target).await?;
    conn.expect_success(
        Method::PUT,
        &format!("/v1/queues/{name}"),
        bytes::Bytes::from(body.to_string()),
    )
    .await?;
    Ok(())
}
