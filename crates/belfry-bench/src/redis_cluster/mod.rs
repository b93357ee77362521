//! `belfry bench redis` (issue #14): belfry nodes sharing a 3-master Redis Cluster, against
//! belfry's own Redis store driven in-process with the same batches (the baseline), all in
//! one run: batched ingest and burst drain through 1, 2 and 3 nodes, firing lateness across
//! 3 nodes, the takeover after `kill -9` of one node, and Redis memory per pending task.

mod cluster;
mod direct;
mod firing;
mod nodes;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::error::BenchError;
use crate::sys::unix_ms;
use crate::workload::Bodies;
use crate::{progress, OutputArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// Tasks per ingest (and drain) measurement.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: u64,
    /// Tasks per submit batch, per lease and per batch ack (the baseline uses the same).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Concurrent clients (HTTP connections, or baseline threads), spread over the nodes.
    #[arg(long, default_value_t = 12)]
    pub clients: usize,
    /// Payload size of every task.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Node counts to measure ingest and drain through.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3])]
    pub node_counts: Vec<usize>,
    /// Tasks due per second in the firing-lateness run (3 nodes, webhook).
    #[arg(long, default_value_t = 10_000)]
    pub fire_rate: u64,
    /// Seconds of due tasks in the firing-lateness run.
    #[arg(long, default_value_t = 10)]
    pub fire_seconds: u64,
    /// Tasks due per second in the takeover run.
    #[arg(long, default_value_t = 1_000)]
    pub takeover_rate: u64,
    /// Seconds of due tasks in the takeover run; one node is killed a third of the way in.
    #[arg(long, default_value_t = 15)]
    pub takeover_seconds: u64,
    /// Far-future tasks put for the memory measurement.
    #[arg(long, default_value_t = 200_000)]
    pub memory_tasks: u64,
    /// Use this running cluster (host:port,host:port,...) instead of starting one. Its
    /// masters are FLUSHALLed between stages.
    #[arg(long)]
    pub redis_cluster: Option<String>,
    /// Script that starts/stops the throwaway cluster (installing redis-server if missing).
    #[arg(long, default_value = "scripts/redis-cluster.sh")]
    pub redis_cluster_script: PathBuf,
    /// First port of the throwaway cluster.
    #[arg(long, default_value_t = 7101)]
    pub redis_cluster_port: u16,
    /// The belfry binary to spawn (default: this binary if it is belfry, else `belfry`
    /// next to it, else on PATH).
    #[arg(long)]
    pub belfry_bin: Option<PathBuf>,
    /// Where the nodes' temporary dirs go (default: the system temp dir).
    #[arg(long)]
    pub spawn_dir: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl RedisArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        if self.batch < 2 {
            return Err(BenchError::invalid(
                "--batch",
                "must be at least 2 (a batch request)",
            ));
        }
        if self.clients == 0 || self.clients > crate::CONNECTIONS_MAX {
            return Err(BenchError::invalid("--clients", "must be 1..=512"));
        }
        crate::workload::validate(self.tasks, self.batch, self.clients, self.payload_bytes)?;
        if self.node_counts.is_empty() || self.node_counts.iter().any(|&n| n == 0 || n > 8) {
            return Err(BenchError::invalid("--node-counts", "each must be 1..=8"));
        }
        for (name, v) in [
            ("--fire-rate", self.fire_rate),
            ("--fire-seconds", self.fire_seconds),
            ("--takeover-rate", self.takeover_rate),
            ("--memory-tasks", self.memory_tasks),
        ] {
            if v == 0 {
                return Err(BenchError::invalid(name, "must be at least 1"));
            }
        }
        if self.takeover_seconds < 6 {
            return Err(BenchError::invalid(
                "--takeover-seconds",
                "must be at least 6",
            ));
        }
        Ok(())
    }
}

/// Tasks per second of one measurement.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Rate {
    pub tasks: u64,
    pub seconds: f64,
    pub per_s: f64,
    pub errors: u64,
}

impl Rate {
    pub fn new(tasks: u64, elapsed: Duration, errors: u64) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Rate {
            tasks,
            seconds,
            per_s: tasks as f64 / seconds,
            errors,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub label: String,
    pub nodes: usize,
    pub ingest: Rate,
    pub drain: Rate,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub tasks: u64,
    pub payload_bytes: usize,
    pub used_before: u64,
    pub used_after: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub masters: usize,
    pub baseline: Throughput,
    pub baseline_big: Throughput,
    pub belfry: Vec<Throughput>,
    pub firing: firing::Firing,
    pub fire_rate: u64,
    pub fire_seconds: u64,
    pub takeover: firing::Firing,
    pub takeover_rate: u64,
    pub memory: Memory,
}

pub async fn run(args: RedisArgs) -> anyhow::Result<crate::report::Report> {
    args.validate()?;
    let cluster = cluster::Cluster::start(
        args.redis_cluster.as_deref(),
        &args.redis_cluster_script,
        args.redis_cluster_port,
    )?;
    let outcome = run_on(&args, &cluster).await;
    cluster.stop();
    Ok(report::build(&args, outcome?))
}

async fn run_on(args: &RedisArgs, cluster: &cluster::Cluster) -> anyhow::Result<Outcome> {
    let run = Phases {
        args,
        cluster,
        bin: crate::spawn::belfry_bin(args.belfry_bin.as_deref()),
        store_url: cluster.store_url(),
        run_id: unix_ms() % 1_000_000_000,
    };
    // Memory first, on the empty cluster.
    cluster.flush()?;
    let memory = memory(args, cluster, &run.bin, &run.namespace("m")).await?;

    let baseline = run
        .in_process(
            "d",
            args.batch,
            "baseline (store in-process)",
            "RedisStore in-process (same scripts, no HTTP)".into(),
        )
        .await?;
    // The servers coalesce concurrent submits into one store call, so the store's own
    // ceiling with bigger batches is shown beside the same-batch baseline.
    let big = (args.batch * 10).min(crate::BATCH_TASKS_MAX);
    let baseline_big = run
        .in_process(
            "e",
            big,
            "store in-process, big batches",
            format!("RedisStore in-process, batches of {big} (not a ratio base)"),
        )
        .await?;

    let mut belfry = Vec::new();
    for &count in &args.node_counts {
        cluster.flush()?;
        let namespace = run.namespace(&format!("n{count}x"));
        belfry.push(throughput(args, &run.bin, &run.store_url, &namespace, count).await?);
    }
    let submit_hint = belfry.iter().map(|t| t.ingest.per_s).fold(0.0, f64::max);

    let plan = firing_plan(args, submit_hint);
    let fired = run
        .fire_on_three("f", "firing across 3 nodes", &plan)
        .await?;
    let plan = takeover_plan(args, plan);
    let takeover = run
        .fire_on_three("t", "takeover (kill -9 one of 3)", &plan)
        .await?;

    Ok(Outcome {
        masters: cluster.nodes.len(),
        baseline,
        baseline_big,
        belfry,
        firing: fired,
        fire_rate: args.fire_rate,
        fire_seconds: args.fire_seconds,
        takeover,
        takeover_rate: args.takeover_rate,
        memory,
    })
}

/// The steady firing run: `--fire-rate` tasks a second for `--fire-seconds`, submitted at
/// about the best rate the nodes ingested (`submit_hint`).
fn firing_plan(args: &RedisArgs, submit_hint: f64) -> firing::Plan {
    firing::Plan {
        rate_per_s: args.fire_rate,
        seconds: args.fire_seconds,
        batch: args.batch,
        clients: args.clients,
        payload_bytes: 100,
        submit_rate_hint: submit_hint,
        kill: None,
    }
}

/// The takeover run: `plan` at the takeover's rate and length, with node 2 killed -9 a
/// third of the way in.
fn takeover_plan(args: &RedisArgs, plan: firing::Plan) -> firing::Plan {
    firing::Plan {
        rate_per_s: args.takeover_rate,
        seconds: args.takeover_seconds,
        kill: Some((2, Duration::from_secs(args.takeover_seconds / 3))),
        ..plan
    }
}

/// What every phase of the run shares: the cluster, flushed before each phase, the belfry
/// binary, and the run's id, which keeps each phase's keys under a namespace of its own.
struct Phases<'a> {
    args: &'a RedisArgs,
    cluster: &'a cluster::Cluster,
    bin: PathBuf,
    store_url: String,
    run_id: u64,
}

impl Phases<'_> {
    /// The namespace of the phase named `prefix`.
    fn namespace(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.run_id)
    }

    /// The store driven in-process (the same scripts, no HTTP) in batches of `batch`:
    /// ingest then drain of the run's tasks on the flushed cluster, shown as `label`.
    async fn in_process(
        &self,
        prefix: &str,
        batch: usize,
        bar_label: &str,
        label: String,
    ) -> anyhow::Result<Throughput> {
        self.cluster.flush()?;
        let args = self.args;
        let bar = progress(&args.output, 0, bar_label);
        let (url, ns, a) = (self.store_url.clone(), self.namespace(prefix), args.clone());
        let bar2 = bar.clone();
        let (ingest, drain) = tokio::task::spawn_blocking(move || {
            direct::run(&url, &ns, a.tasks, batch, a.clients, a.payload_bytes, &bar2)
        })
        .await??;
        bar.finish_and_clear();
        Ok(Throughput {
            label,
            nodes: 0,
            ingest,
            drain,
        })
    }

    /// Runs `plan` against three fresh nodes sharing the flushed cluster.
    async fn fire_on_three(
        &self,
        prefix: &str,
        bar_label: &str,
        plan: &firing::Plan,
    ) -> anyhow::Result<firing::Firing> {
        self.cluster.flush()?;
        let args = self.args;
        let namespace = self.namespace(prefix);
        let mut three = nodes::start(
            &self.bin,
            args.spawn_dir.as_deref(),
            &self.store_url,
            &namespace,
            3,
        )
        .await?;
        let bar = progress(&args.output, 0, bar_label);
        let fired = firing::run(&mut three, plan, &bar).await?;
        bar.finish_and_clear();
        drop(three);
        Ok(fired)
    }
}

/// Batched ingest then burst drain of the same tasks (all due at once) through `count` nodes.
async fn throughput(
    args: &RedisArgs,
    bin: &std::path::Path,
    store_url: &str,
    namespace: &str,
    count: usize,
) -> anyhow::Result<Throughput> {
    let servers = nodes::start(bin, args.spawn_dir.as_deref(), store_url, namespace, count).await?;
    let targets: Vec<_> = servers.iter().map(|s| s.target.clone()).collect();
    let queue = "bench-pull";
    nodes::create_queue(&targets, queue, "{}").await?;
    let due = vec![unix_ms(); args.tasks as usize];
    let bodies = Arc::new(Bodies::build(&due, args.batch, args.payload_bytes));
    let bar = progress(&args.output, args.tasks, &format!("belfry x{count} ingest"));
    let ingest = nodes::ingest(&targets, queue, bodies, args.clients, &bar).await;
    bar.finish_and_clear();
    let bar = progress(
        &args.output,
        ingest.tasks,
        &format!("belfry x{count} drain"),
    );
    let drain = nodes::drain(
        &targets,
        queue,
        ingest.tasks,
        args.batch,
        args.clients,
        &bar,
    )
    .await;
    bar.finish_and_clear();
    drop(servers);
    Ok(Throughput {
        label: format!("belfry, {count} node{}", if count == 1 { "" } else { "s" }),
        nodes: count,
        ingest,
        drain,
    })
}

/// Redis memory before and after `memory_tasks` far-future tasks put through one node.
async fn memory(
    args: &RedisArgs,
    cluster: &cluster::Cluster,
    bin: &std::path::Path,
    namespace: &str,
) -> anyhow::Result<Memory> {
    let payload_bytes = 200;
    let servers = nodes::start(
        bin,
        args.spawn_dir.as_deref(),
        &cluster.store_url(),
        namespace,
        1,
    )
    .await?;
    let targets: Vec<_> = servers.iter().map(|s| s.target.clone()).collect();
    let queue = "bench-memory";
    nodes::create_queue(&targets, queue, "{}").await?;
    let used_before = cluster.used_memory()?;
    let due = vec![unix_ms() + 86_400_000; args.memory_tasks as usize];
    let bodies = Arc::new(Bodies::build(&due, args.batch, payload_bytes));
    let bar = progress(&args.output, args.memory_tasks, "memory: far-future tasks");
    let put = nodes::ingest(&targets, queue, bodies, args.clients, &bar).await;
    bar.finish_and_clear();
    let used_after = cluster.used_memory()?;
    drop(servers);
    if put.errors > 0 || put.tasks != args.memory_tasks {
        anyhow::bail!(
            "memory stage: {} of {} tasks accepted, {} errors",
            put.tasks,
            args.memory_tasks,
            put.errors
        );
    }
    Ok(Memory {
        tasks: put.tasks,
        payload_bytes,
        used_before,
        used_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RedisArgs,
    }

    fn parse(extra: &[&str]) -> RedisArgs {
        Cli::try_parse_from(std::iter::once("redis").chain(extra.iter().copied()))
            .map(|c| c.args)
            .unwrap_or_else(|e| panic!("{extra:?}: {e}"))
    }

    #[test]
    fn defaults_validate_and_bad_values_name_their_flag() {
        let a = parse(&[]);
        assert!(a.validate().is_ok());
        assert_eq!((a.batch, a.node_counts.clone()), (100, vec![1, 2, 3]));
        for (args, flag) in [
            (&["--node-counts", "0"][..], "--node-counts"),
            (&["--fire-rate", "0"][..], "--fire-rate"),
            (&["--takeover-seconds", "3"][..], "--takeover-seconds"),
            (&["--batch", "1001"][..], "--batch"),
        ] {
            let err = parse(args).validate().unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn rates_divide_tasks_by_elapsed_time() {
        let r = Rate::new(1_000, Duration::from_millis(500), 2);
        assert_eq!((r.per_s as u64, r.errors), (2_000, 2));
    }
}
