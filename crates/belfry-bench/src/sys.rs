//! What the bench reads from the operating system: clocks, CPU time and RSS from /proc, the
//! size of a directory, a free port, and a description of the machine and commit.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Clock ticks per second of the CPU times in /proc/PID/stat. Linux exports them in USER_HZ,
/// which is 100 on every mainstream architecture (it is part of the user ABI, independent of
/// the kernel's internal HZ); reading it with sysconf would need `unsafe` for no gain.
const USER_HZ: u64 = 100;

/// Share of one core above which the load generator counts as saturated: a client busy 90%
/// of the wall time on a core is probably limiting what it measures.
pub const CLIENT_SATURATION_CORES: f64 = 0.9;

/// Runs `work` on a thread of its own, named `name`, with a single-threaded runtime.
///
/// For a part of a scenario whose CPU bursts must not hold the workers of the main runtime:
/// a consumer parsing megabyte lease answers, or a latency probe that must not queue behind
/// such a parse. The operating system then shares the cores between them, as it would
/// between separate clients.
pub async fn on_own_thread<T, F, Fut>(name: &str, work: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (reply, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| runtime.block_on(work()));
            let _ = reply.send(outcome);
        })?;
    match answer.await {
        Ok(outcome) => Ok(outcome?),
        Err(_) => anyhow::bail!("the {name} thread ended without an answer (it panicked)"),
    }
}

/// Wall clock now, in microseconds since the Unix epoch.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub fn unix_ms() -> u64 {
    unix_us() / 1_000
}

/// User + system CPU time consumed so far by process `pid` ("self" for this process), or
/// None when /proc cannot tell (process gone, not Linux).
pub fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after the
    // last ')'. Then utime and stime are fields 14 and 15, i.e. 12th and 13th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1_000 / USER_HZ))
}

/// CPU time of this process's threads whose name starts with `prefix` (e.g. the in-process
/// trivial server's threads, which must not count as load generator CPU).
pub fn threads_cpu_time(prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut total = Duration::ZERO;
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().into_owned();
        let comm =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
        if comm.trim_end().starts_with(prefix) {
            total += cpu_time(&format!("self/task/{tid}")).unwrap_or_default();
        }
    }
    total
}

/// Name prefix of threads that serve baselines in-process; [`CpuMeter`] leaves them out of
/// the load generator's CPU.
pub const BASELINE_THREAD_PREFIX: &str = "baseline-";

/// Resident set size of process `pid` in bytes (VmRSS), and its peak (VmHWM).
pub fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Measures CPU use of this process (and optionally one server process) over a phase.
#[derive(Debug)]
pub struct CpuMeter {
    started: std::time::Instant,
    self_start: Option<Duration>,
    baseline_start: Duration,
    server: Option<(u32, Option<Duration>)>,
}

/// CPU use over one phase, in cores (CPU seconds per wall second).
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct CpuUse {
    pub client_cores: f64,
    pub server_cores: Option<f64>,
}

impl CpuUse {
    pub fn client_saturated(&self) -> bool {
        self.client_cores >= CLIENT_SATURATION_CORES
    }
}

impl CpuMeter {
    pub fn start(server_pid: Option<u32>) -> Self {
        CpuMeter {
            started: std::time::Instant::now(),
            self_start: cpu_time("self"),
            baseline_start: threads_cpu_time(BASELINE_THREAD_PREFIX),
            server: server_pid.map(|pid| (pid, cpu_time(&pid.to_string()))),
        }
    }

    pub fn stop(&self) -> CpuUse {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let cores = |start: Option<Duration>, end: Option<Duration>| match (start, end) {
            (Some(s), Some(e)) => Some(e.saturating_sub(s).as_secs_f64() / wall),
            _ => None,
        };
        let baseline = threads_cpu_time(BASELINE_THREAD_PREFIX).saturating_sub(self.baseline_start);
        CpuUse {
            client_cores: cores(
                self.self_start,
                cpu_time("self").map(|t| t.saturating_sub(baseline)),
            )
            .unwrap_or(0.0),
            // Without a server process, the in-process baseline threads are the server.
            server_cores: self
                .server
                .and_then(|(pid, start)| cores(start, cpu_time(&pid.to_string())))
                .or_else(|| (!baseline.is_zero()).then(|| baseline.as_secs_f64() / wall)),
        }
    }
}

/// Bytes process `pid` has caused to be written to storage so far: `write_bytes` of
/// /proc/PID/io, counted when its writes dirty the page cache (whenever the disk then gets
/// them), so a phase's difference is what the phase wrote. None when /proc cannot tell.
pub fn storage_write_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// Bytes on disk under `dir`: (sum of file lengths, sum of allocated blocks). Allocated
/// space is what the disk really holds (preallocated or sparse files differ from length).
pub fn dir_bytes(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut length = 0;
    let mut allocated = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                length += meta.len();
                allocated += meta.blocks() * 512;
            }
        }
    }
    Ok((length, allocated))
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Sockets process `pid` holds open (its descriptors that link to `socket:[...]`), or None
/// when /proc cannot tell. For a server, this is its accepted connections plus a few
/// listening and outgoing sockets.
pub fn socket_count(pid: u32) -> Option<u64> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut sockets = 0;
    for entry in entries.flatten() {
        if std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        {
            sockets += 1;
        }
    }
    Some(sockets)
}

/// The soft limit on open files of process `pid`, from /proc/PID/limits.
pub fn open_files_limit(pid: &str) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Raises this process's soft limit on open files to its hard limit (children started
/// afterwards inherit it, a spawned server too); returns the new (soft, hard) limits.
pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    if soft < hard {
        rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard)?;
    }
    Ok((soft.max(hard), hard))
}

/// The kernel's TCP counters that say a listener could not keep up, machine-wide (every
/// listener on this machine adds to them), from /proc/net/netstat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TcpCounters {
    /// Handshakes dropped because a listener's accept queue was full (`ListenOverflows`).
    pub listen_overflows: u64,
    /// SYNs sent again because no answer came in time (`TCPSynRetrans`): a client's
    /// connect that took a second or more.
    pub syn_retransmits: u64,
}

impl TcpCounters {
    /// Now, or None when /proc/net/netstat cannot be read or lacks the counters.
    pub fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/net/netstat").ok()?)
    }

    /// From the text of /proc/net/netstat: pairs of lines, a header of names and a line
    /// of values, each starting with the same `Prefix:`.
    pub fn parse(text: &str) -> Option<Self> {
        let lines: Vec<&str> = text.lines().collect();
        let (mut overflows, mut retransmits) = (None, None);
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
                match name {
                    "ListenOverflows" => overflows = value.parse().ok(),
                    "TCPSynRetrans" => retransmits = value.parse().ok(),
                    _ => {}
                }
            }
        }
        Some(TcpCounters {
            listen_overflows: overflows?,
            syn_retransmits: retransmits?,
        })
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: TcpCounters) -> TcpCounters {
        TcpCounters {
            listen_overflows: self
                .listen_overflows
                .saturating_sub(earlier.listen_overflows),
            syn_retransmits: self.syn_retransmits.saturating_sub(earlier.syn_retransmits),
        }
    }
}

/// Where the numbers came from.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub commit: String,
    pub date_utc: String,
    /// 1/5/15-minute load averages when the run started: on a shared machine, other work
    /// competes for the same cores and this says how much.
    pub load_average: String,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_gib: memory_kib as f64 / (1024.0 * 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "unknown".into()),
            commit: git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into()),
            date_utc: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
                .unwrap_or_else(|| "unknown".into()),
        }
    }

    pub fn one_line(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB RAM, Linux {}, load average {} at start",
            self.cpus, self.cpu_model, self.memory_gib, self.kernel, self.load_average
        )
    }
}

fn git(args: &[&str]) -> Option<String> {
    command_output("git", args)
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// Processes that keep the CPU busy until dropped: other work on the same machine, so a
/// benchmark can measure what users see on a box that is not idle. Processes of their own
/// (a shell loop each), not threads, so the bench's CPU accounting does not count them.
pub struct BusyLoad {
    children: Vec<std::process::Child>,
}

impl BusyLoad {
    /// Starts `processes` spinning processes (none for 0).
    pub fn start(processes: usize) -> BusyLoad {
        let children = (0..processes)
            .filter_map(|_| {
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(std::process::Stdio::null())
                    .spawn()
                    .ok()
            })
            .collect();
        BusyLoad { children }
    }
}

impl Drop for BusyLoad {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_and_rss_are_readable() {
        assert!(cpu_time("self").is_some());
        let (rss, peak) = rss_bytes(std::process::id()).unwrap();
        assert!(rss > 0 && peak >= rss);
        assert!(storage_write_bytes(std::process::id()).is_some());
    }

    #[test]
    fn open_files_limit_can_be_raised_and_sockets_counted() {
        let (soft, hard) = raise_open_files_limit().unwrap();
        assert_eq!(soft, hard);
        if soft != libc::RLIM_INFINITY {
            assert_eq!(open_files_limit("self"), Some(soft));
        }
        // Other tests of this binary open sockets concurrently: only a lower bound is sure.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(socket_count(std::process::id()).unwrap() >= 1);
        drop(listener);
    }

    #[test]
    fn tcp_counters_are_read_from_netstat_pairs() {
        let text = "TcpExt: SyncookiesSent ListenOverflows TCPSynRetrans\n\
                    TcpExt: 3 45 7\n\
                    IpExt: InNoRoutes\n\
                    IpExt: 0\n";
        let now = TcpCounters::parse(text).unwrap();
        assert_eq!(
            now,
            TcpCounters {
                listen_overflows: 45,
                syn_retransmits: 7
            }
        );
        let earlier = TcpCounters {
            listen_overflows: 40,
            syn_retransmits: 9,
        };
        assert_eq!(
            now.since(earlier),
            TcpCounters {
                listen_overflows: 5,
                syn_retransmits: 0
            }
        );
        assert_eq!(TcpCounters::parse("IpExt: InNoRoutes\nIpExt: 0\n"), None);
        assert!(
            TcpCounters::read().is_some(),
            "this kernel has /proc/net/netstat"
        );
    }

    #[test]
    fn dir_bytes_sums_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join("sub/b"), [0u8; 23]).unwrap();
        assert_eq!(dir_bytes(dir.path()).unwrap().0, 123);
    }
}
