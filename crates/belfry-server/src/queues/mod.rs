//! Queues at run time: each queue's configuration, rate limiter, in-flight leases and the
//! wake-ups: long-polls wait on the queue's `Notify`; a push queue's wake-up also tells the
//! shared dispatcher (through the hook `Queues` was made with, so this module does not know
//! the dispatcher).

mod config;
mod inflight;
pub(crate) mod rate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{LeaseId, QueueName, UnixMs};
use belfry_sinks::SinkSpec;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

pub use config::{
    Delivery, InvalidQueueConfig, QueueConfig, BURST_MAX, MAX_IN_FLIGHT_MAX, RATE_PER_S_MAX,
    RATE_PER_S_MIN, WEBHOOK_TIMEOUT_MS_DEFAULT,
};
use inflight::{InFlight, HELD};
use rate::TokenBucket;

/// How many tasks a queue may hand out now, and if none, when to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub granted: usize,
    /// When `granted` is 0: how long until a token or an in-flight slot should free up.
    pub retry_in: Option<Duration>,
}

pub struct QueueRuntime {
    pub name: QueueName,
    config: RwLock<Arc<QueueConfig>>,
    /// Woken when the queue may have something new to deliver: tasks put, nacked or
    /// redriven, the queue resumed, a lease released, or the clock moved (tests).
    wake: Notify,
    limits: Mutex<Limits>,
    /// Whether the dispatcher delivers this queue (it is a push queue whose sink is built).
    pushed: AtomicBool,
    on_wake: WakeHook,
}

/// Called with the queue's name when a push queue is woken.
pub type WakeHook = Arc<dyn Fn(&QueueName) + Send + Sync>;

struct Limits {
    bucket: TokenBucket,
    in_flight: InFlight,
    /// An admission found no room under the in-flight cap since the last release: the next
    /// release must wake the queue. Otherwise a release wakes nobody (a finished delivery of
    /// a queue with room to spare changes nothing a claim would see).
    held_by_cap: bool,
}

impl QueueRuntime {
    pub fn new(name: QueueName, config: QueueConfig, now: Duration) -> Self {
        Self::with_hook(name, config, now, Arc::new(|_: &QueueName| {}))
    }

    fn with_hook(name: QueueName, config: QueueConfig, now: Duration, on_wake: WakeHook) -> Self {
        let bucket = TokenBucket::new(config.effective_burst(), now);
        QueueRuntime {
            name,
            config: RwLock::new(Arc::new(config)),
            wake: Notify::new(),
            limits: Mutex::new(Limits {
                bucket,
                in_flight: InFlight::default(),
                held_by_cap: false,
            }),
            pushed: AtomicBool::new(false),
            on_wake,
        }
    }

    /// Marks the queue as delivered by the dispatcher (or no longer).
    pub(crate) fn set_pushed(&self, pushed: bool) {
        self.pushed.store(pushed, Ordering::Release);
    }

    pub fn is_pushed(&self) -> bool {
        self.pushed.load(Ordering::Acquire)
    }

    pub fn config(&self) -> Arc<QueueConfig> {
        self.config.read().clone()
    }

    pub fn set_config(&self, config: QueueConfig) {
        *self.config.write() = Arc::new(config);
        self.wake();
    }

    /// Wakes every long-poll of this queue, and the dispatcher if it delivers the queue, so
    /// they look again.
    pub fn wake(&self) {
        self.wake.notify_waiters();
        if self.is_pushed() {
            (self.on_wake)(&self.name);
        }
    }

    /// A future that completes at the next `wake`. Call `enable` on it (pinned) before checking
    /// for work, so a wake between the check and the wait is not lost.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// The in-flight cap: `max_in_flight`, or for webhook queues the server default.
    ///
    /// The default bounds the connections a slow receiver ties up, one per delivery. A stream
    /// sink's deliveries share one connection and carry a batch each; held to 256 tasks, a
    /// queue had two batches of 128 in flight and waited on their round trips (a Kafka burst
    /// ran at 0.32× of the broker's raw publish rate). Stream queues are bounded by the
    /// dispatcher's budgets instead (`dispatch.in_flight_max`, `dispatch.per_target_max`).
    pub(crate) fn in_flight_cap(config: &QueueConfig, webhook_default: u32) -> Option<usize> {
        let webhook = matches!(config.sink(), Some(SinkSpec::Webhook(_)));
        match (config.max_in_flight, webhook) {
            (0, false) => None,
            (0, true) => Some(webhook_default as usize),
            (cap, _) => Some(cap as usize),
        }
    }

    /// Takes up to `want` rate tokens, bounded by the room under the in-flight cap. Paused
    /// queues get nothing. Whatever is not used must be given back with `settle`.
    pub fn admit(
        &self,
        want: usize,
        monotonic: Duration,
        now_ms: UnixMs,
        webhook_default: u32,
    ) -> Admission {
        let config = self.config();
        if config.paused || want == 0 {
            return Admission {
                granted: 0,
                retry_in: None,
            };
        }
        let mut limits = self.limits.lock();
        let mut want = want;
        let mut retry_in = None;
        if let Some(cap) = Self::in_flight_cap(&config, webhook_default) {
            let room = cap.saturating_sub(limits.in_flight.count(now_ms));
            if room == 0 {
                limits.held_by_cap = true;
                // Slots held by deliveries free up on their release, which wakes the queue.
                let until = limits.in_flight.earliest_until().unwrap_or(HELD);
                return Admission {
                    granted: 0,
                    retry_in: Some(Duration::from_millis(until.saturating_sub(now_ms).max(1))),
                };
            }
            want = want.min(room);
        }
        let (rate, burst) = (config.rate_per_s, config.effective_burst());
        let granted = limits.bucket.take(rate, burst, monotonic, want);
        if granted == 0 {
            retry_in = Some(
                limits
                    .bucket
                    .time_to_token(rate)
                    .max(Duration::from_millis(1)),
            );
        }
        Admission { granted, retry_in }
    }

    /// Records what a claim granted by `admit` actually leased: unused tokens go back, leases
    /// count against the in-flight cap (a push queue's until their delivery releases them).
    pub fn settle(&self, granted: usize, leased: &[(LeaseId, UnixMs)], webhook_default: u32) {
        let config = self.config();
        let mut limits = self.limits.lock();
        let unused = granted.saturating_sub(leased.len());
        limits
            .bucket
            .refund(config.rate_per_s, config.effective_burst(), unused);
        if Self::in_flight_cap(&config, webhook_default).is_some() {
            let push = config.is_push();
            for (lease, until) in leased {
                limits
                    .in_flight
                    .insert(*lease, if push { HELD } else { *until });
            }
        }
    }

    /// A lease ended (ack, nack, dead letter): its in-flight slot is free. Wakes the queue if
    /// the cap held a claim back.
    pub fn release(&self, lease: LeaseId) {
        let wake = {
            let mut limits = self.limits.lock();
            let freed = limits.in_flight.remove(lease);
            freed && std::mem::take(&mut limits.held_by_cap)
        };
        if wake {
            self.wake();
        }
    }

    /// The queue was purged: its leases are gone, so a pull queue's no longer count against
    /// its cap (a push queue's deliveries under way release theirs as they end, so the cap
    /// still bounds what its receiver gets at once). Wakes the queue.
    pub fn purged(&self) {
        if matches!(self.config().delivery, Delivery::Pull) {
            let mut limits = self.limits.lock();
            limits.in_flight = InFlight::default();
            limits.held_by_cap = false;
        }
        self.wake();
    }

    /// A lease was extended: keep counting it until the new deadline.
    pub fn extended(&self, lease: LeaseId, until_ms: UnixMs) {
        let mut limits = self.limits.lock();
        if limits.in_flight.remove(lease) {
            limits.in_flight.insert(lease, until_ms);
        }
    }

    /// Leases this process counts as in flight (may include expired ones not yet pruned).
    pub fn tracked_in_flight(&self) -> usize {
        self.limits.lock().in_flight.len()
    }
}

/// Every queue this server knows, by name.
pub struct Queues {
    map: RwLock<HashMap<QueueName, Arc<QueueRuntime>>>,
    on_wake: WakeHook,
}

impl Default for Queues {
    fn default() -> Self {
        Queues::new(Arc::new(|_: &QueueName| {}))
    }
}

impl Queues {
    /// `on_wake` is called when a push queue is woken.
    pub fn new(on_wake: WakeHook) -> Self {
        Queues {
            map: RwLock::new(HashMap::new()),
            on_wake,
        }
    }

    /// A runtime for a new queue, wired to this set's wake hook (not yet inserted).
    pub fn runtime(&self, name: QueueName, config: QueueConfig, now: Duration) -> QueueRuntime {
        QueueRuntime::with_hook(name, config, now, self.on_wake.clone())
    }

    pub fn get(&self, name: &QueueName) -> Option<Arc<QueueRuntime>> {
        self.map.read().get(name).cloned()
    }

    pub fn insert(&self, runtime: Arc<QueueRuntime>) {
        self.map.write().insert(runtime.name.clone(), runtime);
    }

    pub fn remove(&self, name: &QueueName) -> Option<Arc<QueueRuntime>> {
        self.map.write().remove(name)
    }

    pub fn all(&self) -> Vec<Arc<QueueRuntime>> {
        let mut all: Vec<_> = self.map.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub fn wake_all(&self) {
        for runtime in self.map.read().values() {
            runtime.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(config: QueueConfig) -> QueueRuntime {
        QueueRuntime::new(QueueName::new("q").unwrap(), config, Duration::ZERO)
    }

    #[test]
    fn in_flight_cap_limits_admission() {
        let q = runtime(QueueConfig {
            max_in_flight: 2,
            ..QueueConfig::default()
        });
        let a = q.admit(10, Duration::ZERO, 0, 8);
        assert_eq!(a.granted, 2);
        q.settle(2, &[(LeaseId(1), 100), (LeaseId(2), 100)], 8);
        let full = q.admit(10, Duration::ZERO, 50, 8);
        assert_eq!(full.granted, 0);
        assert_eq!(full.retry_in, Some(Duration::from_millis(50)));
        q.release(LeaseId(1));
        assert_eq!(q.admit(10, Duration::ZERO, 50, 8).granted, 1);
    }

    /// A push delivery keeps its slot past its lease's deadline (a clock step, a sink that
    /// overran its timeout) until it releases it, and the release of an old lease of a task
    /// does not free the slot of its new one.
    #[test]
    fn push_slots_are_held_until_released() {
        let q = runtime(QueueConfig {
            max_in_flight: 2,
            delivery: Delivery::Push(belfry_sinks::SinkSpec::Webhook(belfry_sinks::WebhookSpec {
                url: "http://receiver.invalid/hook".into(),
                secret: None,
                previous_secret: None,
                headers: Default::default(),
                timeout_ms: 1_000,
            })),
            ..QueueConfig::default()
        });
        q.settle(2, &[(LeaseId(1), 100), (LeaseId(2), 100)], 8);
        let full = q.admit(10, Duration::ZERO, 1_000_000, 8);
        assert_eq!(
            full.granted, 0,
            "lease deadlines passed, deliveries still running"
        );
        // The task of lease 1 was leased again (lease 3) while lease 1's delivery ran.
        q.release(LeaseId(2));
        q.settle(1, &[(LeaseId(3), 2_000_000)], 8);
        q.release(LeaseId(1));
        assert_eq!(q.admit(10, Duration::ZERO, 1_000_000, 8).granted, 1);
    }

    /// The server's default cap holds webhook queues (one connection per delivery), not
    /// stream queues (batches over one connection); a cap a queue sets holds either.
    #[test]
    fn the_default_cap_is_for_webhooks_only() {
        let webhook = Delivery::Push(belfry_sinks::SinkSpec::Webhook(
            belfry_sinks::WebhookSpec::new("http://receiver.invalid/hook"),
        ));
        let stream = Delivery::Push(belfry_sinks::SinkSpec::RedisStream(
            belfry_sinks::RedisStreamSpec::new("main", "due"),
        ));
        let granted = |delivery: &Delivery, max_in_flight: u32| {
            let q = runtime(QueueConfig {
                max_in_flight,
                delivery: delivery.clone(),
                ..QueueConfig::default()
            });
            q.admit(1_000, Duration::ZERO, 0, 8).granted
        };
        assert_eq!(granted(&webhook, 0), 8, "the webhook default");
        assert_eq!(granted(&stream, 0), 1_000, "no default for a stream");
        assert_eq!(granted(&Delivery::Pull, 0), 1_000, "none for pull");
        assert_eq!(granted(&webhook, 300), 300, "the queue's own cap");
        assert_eq!(granted(&stream, 300), 300, "the queue's own cap");
    }

    #[test]
    fn paused_queue_admits_nothing() {
        let q = runtime(QueueConfig {
            paused: true,
            ..QueueConfig::default()
        });
        assert_eq!(q.admit(10, Duration::ZERO, 0, 8).granted, 0);
    }

    #[test]
    fn unused_tokens_are_refunded() {
        let q = runtime(QueueConfig {
            rate_per_s: 5.0,
            ..QueueConfig::default()
        });
        assert_eq!(q.admit(10, Duration::ZERO, 0, 8).granted, 5);
        q.settle(5, &[(LeaseId(1), 10)], 8);
        assert_eq!(q.admit(10, Duration::ZERO, 0, 8).granted, 4);
    }
}
