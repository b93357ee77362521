//! One simulated deployment: a server on the embedded engine in a temporary directory, its
//! clock, its sinks, the queues, and the pull consumers' leases. Crashes kill the server's
//! store and start a new server generation on the same directory.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use belfry_core::{Clock, LeaseId, QueueName, TaskId, UnixMs};
use belfry_server::queues::Delivery;
use belfry_server::service::QueuePatch;
use belfry_server::{Server, ServerConfig, ServerHandle, Service};
use belfry_sinks::{SinkSpec, WebhookSpec};
use belfry_store::{Engine, EngineOptions, FsyncPolicy};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::clock::SimClock;
use super::model::{Model, QueueSpec};
use super::rng::Rng;
use super::sink::{Budgets, SimSinks, SinkFaults};
use super::store::{Shared, SimStore};

/// Wall time the simulation starts at (2026-01-01T00:00:00Z).
pub const T0: UnixMs = 1_767_225_600_000;

/// Operations kept for the failure message.
const TRACE_LEN: usize = 40;

/// A lease a pull consumer holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub queue: QueueName,
    pub id: TaskId,
    pub lease: LeaseId,
}

struct Generation {
    handle: ServerHandle,
    store: Arc<SimStore>,
    crashed: CancellationToken,
}

pub struct World {
    pub seed: u64,
    pub rng: Rng,
    pub shared: Arc<Shared>,
    pub queues: Vec<QueueSpec>,
    pub held: Vec<Held>,
    pub step: usize,
    trace: VecDeque<String>,
    config: ServerConfig,
    faults: SinkFaults,
    server: Option<Generation>,
    dir: tempfile::TempDir,
}

impl World {
    /// Chooses this seed's configuration and faults, and starts the first server.
    pub async fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let config = ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            horizon_ms: 365 * 24 * 3_600_000,
            shutdown_grace_ms: 2_000,
            dispatch_in_flight_max: rng.range(2, 48) as usize,
            dispatch_per_target_max: rng.range(1, 12) as usize,
            ..ServerConfig::default()
        };
        let faults = SinkFaults {
            retry: rng.range(0, 250),
            reject: rng.range(0, 40),
            slow: rng.range(0, 40),
            stall: rng.range(0, 25),
        };
        let shared = Arc::new(Shared {
            model: Mutex::new(Model::default()),
            clock: SimClock::new(T0),
            seed,
            store_latency_per_mille: rng.range(0, 300),
            store_latency_max_ms: rng.range(1, 200),
        });
        let queues = ["push-a", "push-b", "pull-a", "pull-b"]
            .iter()
            .map(|name| queue_spec(&mut rng, name))
            .collect::<Vec<_>>();
        shared.model.lock().queues = queues.iter().map(|q| (q.name.clone(), q.clone())).collect();
        let mut world = World {
            seed,
            rng,
            shared,
            queues,
            held: Vec::new(),
            step: 0,
            trace: VecDeque::new(),
            config,
            faults,
            server: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        world.start().await;
        for spec in world.queues.clone() {
            let patch = queue_patch(&spec);
            world
                .service()
                .put_queue(spec.name.clone(), patch)
                .await
                .expect("create a queue");
        }
        world
    }

    pub fn service(&self) -> &Arc<Service> {
        self.server
            .as_ref()
            .expect("a server is running")
            .handle
            .service()
    }

    pub fn now_ms(&self) -> UnixMs {
        self.shared.clock.wall_ms()
    }

    /// Starts a server generation on the directory (reopening what the last one left).
    async fn start(&mut self) {
        let engine = Engine::open(self.dir.path(), engine_options()).unwrap_or_else(|e| {
            panic!("seed {}: reopen the engine: {e}", self.seed);
        });
        let store = SimStore::new(engine, self.shared.clone());
        let crashed = CancellationToken::new();
        let budgets = Budgets {
            total: self.config.dispatch_in_flight_max,
            per_target: self.config.dispatch_per_target_max,
        };
        let sinks = Arc::new(SimSinks::new(
            self.shared.clone(),
            self.faults,
            budgets,
            crashed.clone(),
        ));
        let handle = Server::builder(self.config.clone(), store.clone())
            .clock(Arc::new(self.shared.clock.clone()) as Arc<dyn Clock>)
            .sinks(sinks)
            .start()
            .await
            .unwrap_or_else(|e| panic!("seed {}: start the server: {e}", self.seed));
        self.server = Some(Generation {
            handle,
            store,
            crashed,
        });
    }

    /// The process dies at once: its store answers nothing more (what it acknowledged stays,
    /// as after `kill -9`), its sink calls end unheard. A new server starts on the directory.
    pub async fn crash(&mut self) {
        let generation = self.server.take().expect("a server is running");
        let before = self.now_ms();
        if let Some(engine) = generation.store.kill() {
            engine.abandon();
        }
        generation.crashed.cancel();
        // The dead generation's tasks wind down on store errors; their results are moot.
        let _ = generation.handle.stop().await;
        {
            let mut model = self.shared.model.lock();
            model.stats.crashes += 1;
            model.on_reopen();
        }
        self.start().await;
        let took = self.now_ms() - before;
        self.note(format!("restarted after {took} ms"));
    }

    /// A clean stop, then the directory is opened again, outside any server, for a last look.
    pub async fn stop_and_reopen(&mut self) -> Engine {
        let generation = self.server.take().expect("a server is running");
        generation
            .handle
            .stop()
            .await
            .unwrap_or_else(|e| panic!("seed {}: clean stop: {e}", self.seed));
        drop(generation.store.kill());
        Engine::open(self.dir.path(), engine_options())
            .unwrap_or_else(|e| panic!("seed {}: reopen after the stop: {e}", self.seed))
    }

    pub fn note(&mut self, what: String) {
        if self.trace.len() == TRACE_LEN {
            self.trace.pop_front();
        }
        let line = format!("step {} at {}: {what}", self.step, self.now_ms());
        if std::env::var_os("BELFRY_SIM_TRACE").is_some() {
            eprintln!("seed {}: {line}", self.seed);
        }
        self.trace.push_back(line);
    }

    /// Fails the run on the first broken invariant, naming the seed and how to replay it.
    pub fn check(&self) {
        let model = self.shared.model.lock();
        if let Some(first) = model.violations.first() {
            let more = model.violations.len() - 1;
            let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
            panic!("{}", failure(self.seed, self.step, first, more, &trace));
        }
    }
}

/// The failure message: what broke, when, the last operations, and the replay command.
pub fn failure(seed: u64, step: usize, what: &str, more: usize, trace: &[&str]) -> String {
    format!(
        "simulation seed {seed} failed at step {step}: {what}\n({more} more violations)\nlast operations:\n  {}\nreplay: BELFRY_SIM_SEED={seed} cargo test -p belfry-server --test simulation",
        trace.join("\n  ")
    )
}

/// The engine as a crash leaves it: no fsync (a process crash keeps what was written; the
/// machine does not crash here), small checkpoints so that reopening crosses them, and
/// checkpoints on the calling thread so they happen at the same points in every run, and ids
/// from 1 (the store's latencies are drawn from them).
fn engine_options() -> EngineOptions {
    EngineOptions {
        fsync: FsyncPolicy::Never,
        checkpoint_wal_bytes: 64 * 1024,
        background_checkpoints: false,
        free_space_reserve_bytes: 0,
        first_seq: Some(1),
        ..EngineOptions::default()
    }
}

fn queue_spec(rng: &mut Rng, name: &str) -> QueueSpec {
    let backoff_initial_ms = rng.range(20, 1_000);
    let push_timeout_ms = name.starts_with("push").then(|| rng.range(100, 5_000));
    let max_attempts = rng.range(1, 5) as u32;
    let backoff_max_ms = backoff_initial_ms * rng.range(1, 30);
    // Some queues are limited (rate, in flight), so the dispatcher's waits are exercised.
    let limited = rng.chance(400);
    QueueSpec {
        name: QueueName::new(name).expect("a valid queue name"),
        push_timeout_ms,
        max_attempts,
        backoff_initial_ms,
        backoff_max_ms,
        rate_per_s: if limited { rng.range(2, 50) } else { 0 },
        max_in_flight: if limited { rng.range(1, 8) as u32 } else { 0 },
    }
}

fn queue_patch(spec: &QueueSpec) -> QueuePatch {
    let delivery = match spec.push_timeout_ms {
        Some(timeout_ms) => Delivery::Push(SinkSpec::Webhook(WebhookSpec {
            url: format!("http://{}.sim.invalid/hook", spec.name),
            secret: None,
            previous_secret: None,
            headers: Default::default(),
            timeout_ms,
        })),
        None => Delivery::Pull,
    };
    QueuePatch {
        rate_per_s: Some(spec.rate_per_s as f64),
        max_in_flight: Some(spec.max_in_flight),
        max_attempts: Some(spec.max_attempts),
        backoff_initial_ms: Some(spec.backoff_initial_ms),
        backoff_max_ms: Some(spec.backoff_max_ms),
        delivery: Some(delivery),
        ..QueuePatch::default()
    }
}
