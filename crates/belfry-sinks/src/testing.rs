//! A sink for tests and simulations: it records every delivery and answers from a script,
//! or from seeded random faults, so a dispatcher test can check invariants (never early,
//! at-least-once, attempts counted) without a network.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};

use belfry_core::{QueueName, Task, TaskId, UnixMs};

use crate::{Outcome, Sink};

/// One call of [`Sink::deliver`] as the scripted sink saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub task_id: TaskId,
    pub queue: QueueName,
    pub attempt: u32,
    pub due_at_ms: UnixMs,
    /// The dispatcher's clock at delivery: never below `due_at_ms` if nothing fires early.
    pub now_ms: UnixMs,
    /// What the sink answered.
    pub outcome: Outcome,
}

/// Seeded random failures: each delivery not covered by the script is a retry with
/// probability `retry_per_mille`/1000, else a rejection with `reject_per_mille`/1000, else
/// delivered. The same seed and the same call order give the same answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    pub seed: u64,
    pub retry_per_mille: u16,
    pub reject_per_mille: u16,
}

#[derive(Debug)]
struct State {
    script: VecDeque<Outcome>,
    faults: Option<Faults>,
    rng: u64,
    deliveries: Vec<Delivery>,
}

/// Records deliveries; answers with scripted outcomes first, then seeded faults if set, then
/// `Delivered`.
#[derive(Debug)]
pub struct ScriptedSink {
    state: Mutex<State>,
}

impl Default for ScriptedSink {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedSink {
    /// A sink that delivers everything (until told otherwise).
    pub fn new() -> Self {
        ScriptedSink {
            state: Mutex::new(State {
                script: VecDeque::new(),
                faults: None,
                rng: 0,
                deliveries: Vec::new(),
            }),
        }
    }

    /// A sink whose unscripted answers come from `faults`.
    pub fn with_faults(faults: Faults) -> Self {
        let sink = Self::new();
        {
            let mut state = sink.state();
            state.faults = Some(faults);
            state.rng = initial_state(faults.seed);
        }
        sink
    }

    /// Queues `outcome` as the answer to the next unanswered delivery.
    pub fn push(&self, outcome: Outcome) {
        self.state().script.push_back(outcome);
    }

    /// Every delivery so far, in call order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state().deliveries.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is only ever updated whole under the lock, so a panic elsewhere while it
        // was held leaves nothing half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answer(&self, task: &Task, attempt: u32, now_ms: UnixMs) -> Outcome {
        let mut state = self.state();
        let outcome = match state.script.pop_front() {
            Some(outcome) => outcome,
            None => match state.faults {
                None => Outcome::Delivered,
                Some(faults) => {
                    let roll = next_random(&mut state.rng) % 1000;
                    let retry = u64::from(faults.retry_per_mille);
                    let reject = u64::from(faults.reject_per_mille);
                    if roll < retry {
                        Outcome::Retry {
                            after: None,
                            reason: "injected fault".to_owned(),
                        }
                    } else if roll < retry + reject {
                        Outcome::Reject {
                            reason: "injected rejection".to_owned(),
                        }
                    } else {
                        Outcome::Delivered
                    }
                }
            },
        };
        state.deliveries.push(Delivery {
            task_id: task.id,
            queue: task.queue.clone(),
            attempt,
            due_at_ms: task.due_at_ms,
            now_ms,
            outcome: outcome.clone(),
        });
        outcome
    }
}

/// Spreads the seed (splitmix64's finaliser), so nearby seeds give unrelated sequences, and
/// avoids the zero state, which xorshift would never leave.
fn initial_state(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    if z == 0 {
        0x9e37_79b9_7f4a_7c15
    } else {
        z
    }
}

/// xorshift64: small, fast and deterministic; statistical quality is not needed here.
fn next_random(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

impl Sink for ScriptedSink {
    fn deliver<'a>(
        &'a self,
        task: &'a Task,
        attempt: u32,
        now_ms: UnixMs,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        let outcome = self.answer(task, attempt, now_ms);
        Box::pin(std::future::ready(outcome))
    }

    fn target(&self) -> &str {
        "scripted"
    }
}

/// A free loopback port (bound, read, released; the server a test starts binds it right
/// after). For the tests that start real brokers on loopback.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    listener.local_addr().expect("probe address").port()
}

/// Panics with an install hint unless `program --version` runs: a missing server binary
/// fails a test loudly, never skips it.
pub fn require_program(program: &str, hint: &str) {
    assert!(
        version_runs(program.as_ref()),
        "{program} is not installed or does not run: {hint} (scripts/test.sh installs it)"
    );
}

/// A leased JSON task with no headers, as a dispatcher hands a sink its first attempt: what
/// the broker tests deliver.
pub fn leased_task(id: TaskId, queue: &str, due_at_ms: UnixMs, payload: bytes::Bytes) -> Task {
    Task {
        id,
        queue: QueueName::new(queue).expect("a valid test queue name"),
        due_at_ms,
        payload,
        payload_kind: belfry_core::PayloadKind::Json,
        payload_dropped: false,
        headers: Vec::new(),
        priority: Default::default(),
        idempotency_key: None,
        late_policy: Default::default(),
        target: None,
        state: belfry_core::TaskState::Leased,
        attempts: 1,
        lease_until_ms: None,
        dead_reason: None,
    }
}

/// How long a broker a test started may take to answer.
pub const SERVER_STARTUP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Polls `ready` every 25 ms until it says yes; panics naming `what` after
/// [`SERVER_STARTUP_DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + SERVER_STARTUP_DEADLINE;
    while !ready().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not answer within {SERVER_STARTUP_DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// The Kafka-protocol broker binary: `$TANSU_BIN`, else `tansu` on the PATH. Panics with the
/// install hint when it does not run.
pub fn tansu_bin() -> std::path::PathBuf {
    let bin = std::env::var_os("TANSU_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("tansu"));
    assert!(
        version_runs(bin.as_os_str()),
        "the Kafka-protocol broker (tansu) is not installed: run `scripts/kafka.sh install` and set \
         TANSU_BIN to the path it prints (scripts/test.sh does both); looked for {bin:?}"
    );
    bin
}

/// Whether `program --version` runs and succeeds.
fn version_runs(program: &std::ffi::OsStr) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::{PayloadKind, TaskState};
    use bytes::Bytes;

    fn task(id: u128) -> Task {
        Task {
            id: TaskId(id),
            queue: QueueName::new("q").expect("valid queue name"),
            due_at_ms: 100,
            payload: Bytes::new(),
            payload_kind: PayloadKind::Json,
            payload_dropped: false,
            headers: Vec::new(),
            priority: Default::default(),
            idempotency_key: None,
            late_policy: Default::default(),
            target: None,
            state: TaskState::Leased,
            attempts: 1,
            lease_until_ms: None,
            dead_reason: None,
        }
    }

    #[tokio::test]
    async fn script_first_then_delivered_and_everything_recorded() {
        let sink = ScriptedSink::new();
        let retry = Outcome::Retry {
            after: None,
            reason: "r".into(),
        };
        sink.push(retry.clone());
        assert_eq!(sink.deliver(&task(1), 1, 150).await, retry);
        assert_eq!(sink.deliver(&task(1), 2, 250).await, Outcome::Delivered);
        let deliveries = sink.deliveries();
        assert_eq!(deliveries.len(), 2);
        assert_eq!((deliveries[0].attempt, deliveries[0].now_ms), (1, 150));
        assert_eq!(deliveries[1].outcome, Outcome::Delivered);
        assert!(deliveries.iter().all(|d| d.now_ms >= d.due_at_ms));
    }

    #[tokio::test]
    async fn faults_are_deterministic_per_seed_and_near_their_rates() {
        let faults = Faults {
            seed: 42,
            retry_per_mille: 200,
            reject_per_mille: 50,
        };
        let run = |faults: Faults| async move {
            let sink = ScriptedSink::with_faults(faults);
            let mut labels = Vec::new();
            for i in 0..10_000 {
                labels.push(sink.deliver(&task(i), 1, 100).await.label());
            }
            labels
        };
        let first = run(faults).await;
        assert!(first == run(faults).await, "same seed, different answers");
        for seed in [0, 41, 43, u64::MAX] {
            assert!(
                first != run(Faults { seed, ..faults }).await,
                "seed {seed} repeats seed 42"
            );
        }
        let count = |label| first.iter().filter(|&&l| l == label).count();
        // 10,000 draws: the counts sit well within these bounds unless the generator is broken.
        assert!(
            (1_700..2_300).contains(&count("retry")),
            "{}",
            count("retry")
        );
        assert!((350..650).contains(&count("reject")), "{}", count("reject"));
    }
}
