//! `belfry bench hostile`: `/healthz` and single-task submit latency while N partial
//! connections are held open, against the same server with none, in one run.
//!
//! In one run on one server with its default limits: (1) the baseline — R rounds of
//! `GET /healthz` and a single-task submit, each on a kept-alive connection and on a fresh
//! connection per request; (2) N hostile connections (four kinds: connect only, request line
//! only, headers without their end, half a body) opened and re-opened as the server's
//! timeouts close them, so N are held throughout; (3) the same R rounds again while they are
//! held. Reports the p99 ratios held ÷ baseline against the target, and how many hostile
//! connections were open — by the client's count and by the server process's sockets.

mod holders;
mod probe;
mod report;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::error::{within, BenchError};
use crate::http::HttpConn;
use crate::spawn::{create_queue, ServerUnderTest};
use crate::sys::{open_files_limit, raise_open_files_limit, socket_count, unix_ms, CpuMeter};
use crate::sys::{CpuUse, Machine, TcpCounters};
use crate::{OutputArgs, ServerArgs};

pub use holders::{HolderTotals, Holders, KINDS};
pub use probe::{Connection, Request, SeriesOutcome, PROBE_TIMEOUT};

/// Target of the issue: each probe's p99 with the hostile connections held at most this many
/// times its p99 without them.
pub const P99_RATIO_TARGET: f64 = 2.0;

/// Most hostile connections one run holds.
pub const HOSTILE_MAX: usize = 100_000;

/// Most client addresses the hostile connections are spread over.
pub const HOSTILE_SOURCES_MAX: usize = 250;

/// Most probe rounds per phase.
pub const ROUNDS_MAX: usize = 100_000;

/// Descriptors the bench needs besides the hostile connections: the probes' connections
/// (fresh ones may pile up while the server makes them wait), the runtime, files.
const DESCRIPTORS_SPARE: u64 = 2_048;

/// How long the hostile connections may take to reach their count before the run measures
/// with however many are open (and says so).
const OPENING_DEADLINE: Duration = Duration::from_secs(120);

/// How often the open connections are counted during the measured phase.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The server's sockets are counted this many times, this far apart, once the probe rounds
/// are done and while the connections are still held: reading ten thousand descriptor links
/// costs tens of milliseconds of CPU, which during the rounds delayed the probes themselves.
const SERVER_SAMPLES: u32 = 5;
const SERVER_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, clap::Args)]
pub struct HostileArgs {
    /// Partial connections to hold (a quarter of each kind).
    #[arg(long, default_value_t = 10_000)]
    pub hostile: usize,
    /// Probe rounds per phase (each round: `/healthz` and one submit, kept-alive and fresh).
    #[arg(long, default_value_t = 1_000)]
    pub rounds: usize,
    /// Milliseconds between probe rounds.
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// Seconds to wait once the hostile connections are open, before measuring.
    #[arg(long, default_value_t = 1)]
    pub settle_s: u64,
    /// Source address of the hostile connections: another client than the probes, which
    /// connect from 127.0.0.1 (the server caps connections per client address). Any
    /// address in 127/8 is loopback on Linux.
    #[arg(long, default_value = "127.0.0.2")]
    pub hostile_source: std::net::IpAddr,
    /// Client addresses the hostile connections are spread over, from `--hostile-source`
    /// on (127.0.0.2, 127.0.0.3, …). The default, 4, lets 10,000 be held under the server's
    /// default per-client cap (2,500); with 1, the connections over the cap are refused
    /// and re-opened at once, which measures a connection flood instead.
    #[arg(long, default_value_t = 4)]
    pub hostile_sources: usize,
    /// Queue the probe submits to (default: `bench-hostile-<ms>`).
    #[arg(long)]
    pub queue: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl HostileArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        within("--hostile", self.hostile, 1, HOSTILE_MAX)?;
        within("--rounds", self.rounds, 1, ROUNDS_MAX)?;
        if self.interval_ms == 0 || self.interval_ms > 60_000 {
            return Err(BenchError::invalid("--interval-ms", "must be 1..=60000"));
        }
        if self.settle_s > 3_600 {
            return Err(BenchError::invalid("--settle-s", "must be 0..=3600"));
        }
        within(
            "--hostile-sources",
            self.hostile_sources,
            1,
            HOSTILE_SOURCES_MAX,
        )?;
        if holders::sources(self.hostile_source, self.hostile_sources).is_none() {
            return Err(BenchError::invalid(
                "--hostile-sources",
                format!(
                    "{} addresses from {} run past the end of its address space",
                    self.hostile_sources, self.hostile_source
                ),
            ));
        }
        if self.server.baselines_only {
            return Err(BenchError::invalid(
                "--baselines-only",
                "the baseline of hostile is the same server without the hostile connections",
            ));
        }
        Ok(())
    }
}

/// Open hostile connections over the measured phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OpenCount {
    pub samples: u64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
}

impl OpenCount {
    fn of(values: &[u64]) -> Self {
        if values.is_empty() {
            return OpenCount::default();
        }
        OpenCount {
            samples: values.len() as u64,
            min: values.iter().copied().min().unwrap_or(0),
            max: values.iter().copied().max().unwrap_or(0),
            mean: values.iter().sum::<u64>() as f64 / values.len() as f64,
        }
    }
}

/// One measured phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub series: Vec<SeriesOutcome>,
    pub seconds: f64,
    pub cpu: CpuUse,
    /// The client's count of connected partial connections (0 in the baseline).
    pub hostile_open: OpenCount,
    /// The server process's sockets minus those it held before the hostile connections
    /// (spawned server only): the hostile connections it has accepted, counted right after
    /// the phase's probe rounds.
    pub server_sockets_extra: Option<OpenCount>,
    /// The kernel's listen-queue overflows and SYN retransmits during the phase
    /// (machine-wide; None when /proc/net/netstat cannot be read).
    pub tcp: Option<TcpCounters>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostileOutcome {
    pub hostile: usize,
    pub rounds: usize,
    pub interval_ms: u64,
    /// This process's open-files limit after raising it, and the server's.
    pub open_files_limit: u64,
    pub server_open_files_limit: Option<u64>,
    /// The server's sockets before the hostile connections.
    pub server_sockets_before: Option<u64>,
    pub baseline: Phase,
    pub held: Phase,
    /// How long the hostile connections took to reach their count (None: they did not).
    pub opening_s: Option<f64>,
    /// The holders' counters at the end of the run.
    pub holders: HolderTotals,
    /// The holders' counters over the measured phase only.
    pub held_phase_holders: HolderTotals,
    /// `--server-env` as given (to say which connection cap the server had).
    pub server_env: Vec<String>,
    /// Where the hostile connections came from: the first address, and how many.
    pub hostile_source: std::net::IpAddr,
    pub hostile_sources: usize,
}

pub async fn run(args: HostileArgs) -> anyhow::Result<crate::report::Report> {
    args.validate()?;
    let (soft, _hard) =
        raise_open_files_limit().map_err(|e| BenchError::io("raise RLIMIT_NOFILE", "self", e))?;
    let needed = args.hostile as u64 + DESCRIPTORS_SPARE;
    if soft < needed {
        return Err(BenchError::invalid(
            "--hostile",
            format!(
                "needs about {needed} open files, but this process may open {soft} (its hard \
                 limit); raise it with `ulimit -n`"
            ),
        )
        .into());
    }
    let machine = Machine::describe();
    let server = ServerUnderTest::connect_or_spawn(&args.server, &[]).await?;
    let result = run_on(&args, &server, soft).await;
    server.stop();
    Ok(report::build(machine, result?))
}

async fn run_on(
    args: &HostileArgs,
    server: &ServerUnderTest,
    own_open_files_limit: u64,
) -> anyhow::Result<HostileOutcome> {
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-hostile-{}", unix_ms()));
    create_queue(&server.target, &queue, "{}").await?;
    let plan = probe_plan(args, server, &queue);
    let pid = server.pid;
    let server_sockets_before = pid.and_then(socket_count);
    let bar = crate::progress(&args.output, 3, "baseline, hostile ramp, held");

    let kept = HttpConn::connect(&server.target).await?;
    let baseline = measure(&plan, kept, pid, None, None).await;
    bar.inc(1);

    let holders = start_holders(args, server)?;
    let opening_s = wait_until_open(&holders, args.hostile as u64).await;
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    bar.inc(1);

    // The kept-alive probe opens its connection now: at a full connection cap it would wait
    // like any newcomer, and then its first requests show it.
    let kept = HttpConn::connect(&server.target).await?;
    let before = holders.counters.totals();
    let held = measure(
        &plan,
        kept,
        pid,
        Some(&holders),
        server_sockets_before.filter(|_| pid.is_some()),
    )
    .await;
    let after = holders.counters.totals();
    let totals = holders.stop().await;
    bar.finish_and_clear();
    Ok(HostileOutcome {
        hostile: args.hostile,
        rounds: args.rounds,
        interval_ms: args.interval_ms,
        open_files_limit: own_open_files_limit,
        server_open_files_limit: pid.and_then(|p| open_files_limit(&p.to_string())),
        server_sockets_before,
        baseline,
        held,
        opening_s,
        holders: totals,
        held_phase_holders: after.since(&before),
        server_env: args.server.server_env.clone(),
        hostile_source: args.hostile_source,
        hostile_sources: args.hostile_sources,
    })
}

/// The probe's rounds: single-task submits to `queue`, due a day from now so that they stay
/// pending and never fire during the run.
fn probe_plan(args: &HostileArgs, server: &ServerUnderTest, queue: &str) -> probe::ProbePlan {
    let far = unix_ms() + 24 * 3_600 * 1_000;
    probe::ProbePlan {
        target: server.target.clone(),
        submit_path: format!("/v1/queues/{queue}/tasks"),
        submit_body: Bytes::from(format!(
            "{{\"payload\":{{\"probe\":1}},\"run_at_ms\":{far}}}"
        )),
        rounds: args.rounds,
        interval: Duration::from_millis(args.interval_ms),
    }
}

/// Starts the `--hostile` connections from `--hostile-sources` addresses of the server's
/// address family.
fn start_holders(args: &HostileArgs, server: &ServerUnderTest) -> anyhow::Result<Holders> {
    if args.hostile_source.is_ipv4() != server.target.addr.is_ipv4() {
        return Err(BenchError::invalid(
            "--hostile-source",
            format!(
                "must be of the server's address family ({})",
                server.target.addr
            ),
        )
        .into());
    }
    let sources = holders::sources(args.hostile_source, args.hostile_sources)
        .ok_or_else(|| BenchError::invalid("--hostile-sources", "past the address space"))?;
    let holders = Holders::start(
        server.target.addr,
        sources,
        &server.target.host,
        args.hostile,
    )
    .map_err(|e| BenchError::io("start the hostile clients' thread", "-", e))?;
    Ok(holders)
}

/// Seconds until the `count` hostile connections are open at once — or, when the server
/// refuses some (its per-client cap), until every holder has connected at least once — or
/// None if that does not happen within [`OPENING_DEADLINE`].
async fn wait_until_open(holders: &Holders, count: u64) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < OPENING_DEADLINE {
        let now = holders.counters.totals();
        if now.open >= count || (now.reached >= count && now.refused > 0) {
            return Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// One phase of probe rounds, counting the open hostile connections meanwhile.
async fn measure(
    plan: &probe::ProbePlan,
    kept: HttpConn,
    pid: Option<u32>,
    holders: Option<&Holders>,
    server_sockets_before: Option<u64>,
) -> Phase {
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let counters = holders.map(|h| h.counters.clone());
        tokio::spawn(async move {
            let mut client = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if let Some(c) = &counters {
                    client.push(c.totals().open);
                }
                tokio::time::sleep(SAMPLE_INTERVAL).await;
            }
            client
        })
    };
    let meter = CpuMeter::start(pid);
    let tcp_before = TcpCounters::read();
    let started = Instant::now();
    let series = probe::run(plan, kept).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = meter.stop();
    let tcp = TcpCounters::read()
        .zip(tcp_before)
        .map(|(after, before)| after.since(before));
    done.store(true, Ordering::Relaxed);
    let client = sampler.await.unwrap_or_default();
    let mut server = Vec::new();
    if let (Some(pid), Some(before)) = (pid, server_sockets_before) {
        for _ in 0..SERVER_SAMPLES {
            let counted = tokio::task::spawn_blocking(move || socket_count(pid));
            if let Ok(Some(now)) = counted.await {
                server.push(now.saturating_sub(before));
            }
            tokio::time::sleep(SERVER_SAMPLE_INTERVAL).await;
        }
    }
    Phase {
        series,
        seconds,
        cpu,
        hostile_open: OpenCount::of(&client),
        server_sockets_extra: (!server.is_empty()).then(|| OpenCount::of(&server)),
        tcp,
    }
}
