//! What the binary's integration tests share: spawning `belfry serve` on a free port and
//! finding where it listens.
#![allow(dead_code)] // each test file uses a different part

pub mod cli;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_belfry");
/// How long a spawned server may take to log where it listens (a cold debug binary under load).
pub const START_DEADLINE: Duration = Duration::from_secs(30);

/// A `belfry serve` process; killed (by its PID) when dropped.
pub struct Served {
    pub child: Child,
    pub url: String,
    /// Everything the server has logged so far (stdout).
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// Everything it wrote to stderr so far (a panic's message lands here); also echoed to
    /// the test's own stderr.
    pub errors: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `belfry serve --listen 127.0.0.1:0 ARGS` with a clean environment and waits for its
/// "listening on" log line.
pub fn serve(args: &[&str]) -> Served {
    serve_with_env(args, &[])
}

/// `serve`, with these environment variables set.
pub fn serve_with_env(args: &[&str], env: &[(&str, &str)]) -> Served {
    spawn_served(serve_command(Command::new(BIN), args, env))
}

/// `serve`, from a shell that first runs `setup` (such as `ulimit -S -n 256`).
pub fn serve_after(setup: &str, args: &[&str]) -> Served {
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(format!("{setup} && exec \"$0\" \"$@\""))
        .arg(BIN);
    spawn_served(serve_command(shell, args, &[]))
}

/// `command` (the binary, or a shell that runs it) given `serve` and its arguments.
fn serve_command(mut command: Command, args: &[&str], env: &[(&str, &str)]) -> Command {
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("BELFRY_LISTEN")
        .env_remove("BELFRY_DATA_DIR")
        .env_remove("BELFRY_CONFIG")
        .env_remove("BELFRY_ADMIN_TOKEN")
        .env_remove("BELFRY_TLS_CERT")
        .env_remove("BELFRY_TLS_KEY")
        .env_remove("BELFRY_STORE")
        .env_remove("BELFRY_NODE_ID")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn spawn_served(mut command: Command) -> Served {
    let mut child = command.spawn().expect("spawn belfry serve");
    let errors = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("piped stderr");
    let kept_errors = errors.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Ok(mut kept) = kept_errors.lock() {
                kept.push_str(&line);
                kept.push('\n');
            }
        }
    });
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = log.clone();
    // Read the log until the "listening" line, then keep draining so the pipe never fills.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(mut kept) = kept.lock() {
                kept.push_str(&line);
                kept.push('\n');
            }
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split(',').next().unwrap_or("").trim().to_owned();
                let _ = tx.send(url);
            }
        }
    });
    let url = rx
        .recv_timeout(START_DEADLINE)
        .expect("belfry serve logs where it listens");
    Served {
        child,
        url,
        log,
        errors,
    }
}
