//! Shard ownership: which belfry node may claim from which partition, decided without a
//! coordinator.
//!
//! **Membership.** Every node writes a heartbeat into one sorted set, `{ns/q}:nodes`
//! (node id -> expiry in Redis server milliseconds, from `TIME` inside the script, never the
//! local wall clock). A node whose heartbeat has expired is dead; the script that writes a
//! heartbeat also drops the expired ones and answers with the live list.
//!
//! **Assignment.** Each node computes from the live list, by rendezvous (highest random
//! weight) hashing of (partition, node id), which partitions it *should* own. Every node that
//! sees the same list agrees, and a node joining or leaving moves only the partitions it gains
//! or loses.
//!
//! **Leases.** A partition is taken by one script that sets `{ns/p}:own` only if absent, to
//! `"<node>/<token>"` where the token is `INCR {ns/p}:fence` (so tokens only grow), with a
//! `PX` expiry of `ttl`. It is renewed by compare-and-expire and handed over by
//! compare-and-delete, so a node only ever touches a lease that is still its own. A dead
//! node's leases simply expire.
//!
//! **Fencing.** Each lease has a local monotonic deadline: the instant its last take or renew
//! was *sent*, plus `ttl`, minus a safety margin. Redis counts the `PX` from when it received
//! the command, which is later, so the local deadline always comes first. [`Ownership::fence_of`]
//! answers `None` once it has passed, even if the renew thread has not run (a process stopped
//! by SIGSTOP, or starved). A claim also passes the fence string to `claim.lua`, which refuses
//! it unless `GET own` still equals it: a node that wakes from a long pause holding a fence it
//! read before cannot claim with it once another node has taken the partition.
//!
//! **Metrics** (through the process-wide `metrics` recorder, so `/metrics` shows them):
//! [`LEASES_OWNED`] and [`NODES_LIVE`] after every tick, [`TAKEOVERS`], [`LEASES_LOST`] by
//! `reason` (`lapsed`: past the local deadline before a renew landed, as after a pause;
//! `taken`: Redis refused the renew), and [`FENCE_REFUSED`] by `at` (`node`: a claim found its
//! lease past the local deadline; `redis`: the claim script found another owner).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use belfry_store::StoreError;
use parking_lot::{Condvar, Mutex, RwLock};
use redis::Value;

use crate::conn::{pipeline, unexpected, Pool, Timeouts};
use crate::keys::Keys;
use crate::target::RedisTarget;

/// KEYS: the nodes set. ARGV: node id, ttl ms, `1` to leave instead of beating.
/// Replies {ms until the next other node's heartbeat expires (-1: none), live node ids}.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
local next = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 1, 'WITHSCORES')
for i = 1, #first, 2 do
  if first[i] ~= ARGV[1] then
    next = tonumber(first[i + 1]) - now
    break
  end
end
return {next, redis.call('ZRANGE', KEYS[1], 0, -1)}
";

/// KEYS: own, fence. ARGV: node id, ttl ms. Replies {1, value} when taken, {0, holder}
/// when someone (perhaps this node's lapsed lease) still holds it.
const TAKE: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder then return {0, holder} end
local value = ARGV[1] .. '/' .. string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, value}
";

/// KEYS: own. ARGV: our value, ttl ms. Replies 1 when renewed, 0 when no longer ours.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// KEYS: own. ARGV: our value. Replies 1 when released, 0 when it was no longer ours.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// Gauge: partitions this node holds a valid lease on.
pub const LEASES_OWNED: &str = "belfry_shard_leases_owned";
/// Gauge: live nodes in the last heartbeat reply, this one included.
pub const NODES_LIVE: &str = "belfry_shard_nodes_live";
/// Counter: leases this node took.
pub const TAKEOVERS: &str = "belfry_shard_takeovers_total";
/// Counter: leases lost without a release, by `reason` (`lapsed` or `taken`).
pub const LEASES_LOST: &str = "belfry_shard_leases_lost_total";
/// Counter: claims in a partition refused for a stale fence, by `at` (`node` or `redis`).
pub const FENCE_REFUSED: &str = "belfry_fence_refused_total";

/// Gives the ownership metrics their `# HELP` text. Call once the process's recorder is
/// installed (the server installs it when it starts; descriptions sent before are lost).
pub fn describe_metrics() {
    metrics::describe_gauge!(LEASES_OWNED, "Partitions this node holds a valid lease on.");
    metrics::describe_gauge!(
        NODES_LIVE,
        "Live nodes in the last heartbeat reply, this one included."
    );
    metrics::describe_counter!(TAKEOVERS, "Partition leases this node took.");
    metrics::describe_counter!(LEASES_LOST, "Leases lost without a release, by reason (lapsed: past the local deadline, as after a pause; taken: another node holds it).");
    metrics::describe_counter!(FENCE_REFUSED, "Claims refused for a stale fencing token, by where (node: its own deadline; redis: the claim script).");
}

/// Counts a claim the claim script refused because the partition has another owner now.
pub(crate) fn fence_refused_by_redis() {
    metrics::counter!(FENCE_REFUSED, "at" => "redis").increment(1);
}

/// How often a Redis failure is logged at most; the ones in between are counted.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long after another node's heartbeat expiry the next tick looks again: its leases
/// were renewed a moment after its heartbeat, so they expire a moment later.
const HEARTBEAT_EXPIRY_SLACK: Duration = Duration::from_millis(20);
/// The longest node id accepted: it is written into every lease value.
const NODE_ID_LEN_MAX: usize = 200;

/// Lease timing. The defaults hand a killed node's partitions over within `ttl` plus one
/// heartbeat period (about 4 s), and ride out one failed renew.
#[derive(Debug, Clone, Copy)]
pub struct OwnershipOptions {
    /// How long a lease and a heartbeat live in Redis after their last renew.
    pub ttl: Duration,
    /// How often leases and the heartbeat are renewed (`ttl / 3` by default).
    pub renew_every: Duration,
    /// How soon a tick is repeated after a failure, or while partitions this node should own
    /// are still held by others (they are released, or expire, at any moment).
    pub retry_every: Duration,
    /// Taken off the local deadline of each lease, for clock-rate differences between this
    /// host and Redis.
    pub safety_margin: Duration,
    /// Timeouts of the ownership connection: short, since a renew that takes longer than
    /// the time left on the lease is worthless.
    pub timeouts: Timeouts,
}

impl Default for OwnershipOptions {
    fn default() -> Self {
        OwnershipOptions {
            ttl: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
            retry_every: Duration::from_millis(200),
            safety_margin: Duration::from_millis(250),
            timeouts: Timeouts {
                connect: Duration::from_millis(500),
                command: Duration::from_millis(500),
            },
        }
    }
}

impl OwnershipOptions {
    fn validate(&self) -> Result<(), StoreError> {
        let invalid = |what: &str| Err(StoreError::Invalid(format!("shard ownership: {what}")));
        if self.ttl.as_millis() < 10 || self.renew_every.is_zero() || self.retry_every.is_zero() {
            return invalid("ttl must be at least 10 ms, renew_every and retry_every above 0");
        }
        // A renew sent on time must be able to land (within the command timeout) before the
        // lease's local deadline, or the lease lapses between every two renews.
        if self.renew_every + self.timeouts.command + self.safety_margin >= self.ttl {
            return invalid(&format!(
                "renew_every ({:?}) + command timeout ({:?}) + safety_margin ({:?}) must be below ttl ({:?})",
                self.renew_every, self.timeouts.command, self.safety_margin, self.ttl
            ));
        }
        Ok(())
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnershipStats {
    /// Partitions with a valid lease now.
    pub owned: usize,
    /// Live nodes in the last heartbeat reply (this one included).
    pub live_nodes: usize,
    /// Leases taken.
    pub takeovers: u64,
    /// Leases handed over to the node that should own them.
    pub releases: u64,
    /// Leases lost without a release: refused on renew, or past their local deadline.
    pub losses: u64,
    /// Of `losses`, those past their local deadline before a renew landed (a paused or
    /// starved process, or Redis out of reach): the fence was dropped on this side.
    pub lapsed: u64,
    /// Claims that found their partition's lease in the table but past its local deadline,
    /// and so did not claim there.
    pub refused_at_node: u64,
    /// Bumped on every change of the owned set.
    pub generation: u64,
}

#[derive(Debug, Clone)]
struct Lease {
    fence: String,
    deadline: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Halt {
    /// Release every lease and leave the membership (a graceful shutdown).
    Release,
    /// Stop touching Redis, as a killed process would.
    Abandon,
}

#[derive(Debug, Default)]
struct Control {
    halt: Option<Halt>,
    frozen: bool,
}

struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
    failing: bool,
}

struct Shared {
    node: String,
    keys: Keys,
    nodes_key: String,
    options: OwnershipOptions,
    leases: RwLock<Vec<Option<Lease>>>,
    generation: Mutex<u64>,
    changed: Condvar,
    control: Mutex<Control>,
    wake: Condvar,
    live_nodes: AtomicUsize,
    takeovers: AtomicU64,
    releases: AtomicU64,
    losses: AtomicU64,
    lapsed: AtomicU64,
    refused_at_node: AtomicU64,
    errors: Mutex<ErrorLog>,
}

/// This node's share of the partitions, kept by a background thread. See the module docs.
pub struct Ownership {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("node", &self.shared.node)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Ownership {
    /// Starts keeping this node's leases on `target`, for a store of `partitions` partitions
    /// in `namespace` (as [`RedisOptions`](crate::RedisOptions) names them). Nothing is owned
    /// until the first tick has run; [`Ownership::wait_changed`] says when the set changes.
    pub fn start(
        target: &RedisTarget,
        namespace: &str,
        partitions: u16,
        node_id: &str,
        options: OwnershipOptions,
    ) -> Result<Arc<Ownership>, StoreError> {
        options.validate()?;
        if node_id.is_empty() || node_id.len() > NODE_ID_LEN_MAX {
            return Err(StoreError::Invalid(format!(
                "node id {node_id:?}: from 1 to {NODE_ID_LEN_MAX} bytes"
            )));
        }
        if partitions == 0 {
            return Err(StoreError::Invalid("partitions must be at least 1".into()));
        }
        let pool = Pool::open(target, options.timeouts, 1)?;
        let shared = Arc::new(Shared {
            node: node_id.to_owned(),
            keys: Keys::new(namespace, partitions),
            nodes_key: format!("{{{namespace}/q}}:nodes"),
            options,
            leases: RwLock::new(vec![None; usize::from(partitions)]),
            generation: Mutex::new(0),
            changed: Condvar::new(),
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
            live_nodes: AtomicUsize::new(0),
            takeovers: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            losses: AtomicU64::new(0),
            lapsed: AtomicU64::new(0),
            refused_at_node: AtomicU64::new(0),
            errors: Mutex::new(ErrorLog {
                last: None,
                suppressed: 0,
                failing: false,
            }),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("belfry-own-{node_id}"))
            .spawn(move || for_thread.run(&pool))
            .map_err(|e| StoreError::Invalid(format!("start the shard ownership thread: {e}")))?;
        Ok(Arc::new(Ownership {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    pub fn node_id(&self) -> &str {
        &self.shared.node
    }

    /// The fence to pass to a claim in partition `p`, while this node's lease on it is valid.
    /// A lease still in the table but past its local deadline (the thread has not run since:
    /// a paused or starved process) answers `None`, counted as a refused fence.
    pub fn fence_of(&self, p: u16) -> Option<String> {
        match self.lease_of(p) {
            Ok(fence) => Some(fence),
            Err(lapsed) => {
                if lapsed {
                    self.shared.refused_at_node.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(FENCE_REFUSED, "at" => "node").increment(1);
                }
                None
            }
        }
    }

    pub fn is_owned(&self, p: u16) -> bool {
        self.lease_of(p).is_ok()
    }

    /// The fence of partition `p`'s lease while it holds (it changes at every take, even one
    /// by this node again), without counting a refusal as [`Ownership::fence_of`] does.
    pub fn lease(&self, p: u16) -> Option<String> {
        self.lease_of(p).ok()
    }

    /// The valid lease's fence, or whether a lease past its local deadline is in the table.
    fn lease_of(&self, p: u16) -> Result<String, bool> {
        let now = Instant::now();
        let leases = self.shared.leases.read();
        match leases.get(usize::from(p)) {
            Some(Some(lease)) if now < lease.deadline => Ok(lease.fence.clone()),
            Some(Some(_)) => Err(true),
            _ => Err(false),
        }
    }

    /// The partitions with a valid lease, and their fences, in partition order.
    pub fn owned(&self) -> Vec<(u16, String)> {
        let now = Instant::now();
        let leases = self.shared.leases.read();
        (0u16..)
            .zip(leases.iter())
            .filter_map(|(p, lease)| match lease {
                Some(lease) if now < lease.deadline => Some((p, lease.fence.clone())),
                _ => None,
            })
            .collect()
    }

    /// Bumped whenever a lease is taken, released or dropped by the thread. A lease whose
    /// local deadline passes before the thread notices leaves [`Ownership::owned`] without a
    /// bump: callers check [`Ownership::fence_of`] at claim time regardless.
    pub fn generation(&self) -> u64 {
        *self.shared.generation.lock()
    }

    /// Waits until the generation differs from `seen`, or `timeout`; returns the generation.
    pub fn wait_changed(&self, seen: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut generation = self.shared.generation.lock();
        while *generation == seen {
            if self
                .shared
                .changed
                .wait_until(&mut generation, deadline)
                .timed_out()
            {
                break;
            }
        }
        *generation
    }

    pub fn stats(&self) -> OwnershipStats {
        let s = &self.shared;
        OwnershipStats {
            owned: self.owned().len(),
            live_nodes: s.live_nodes.load(Ordering::Relaxed),
            takeovers: s.takeovers.load(Ordering::Relaxed),
            releases: s.releases.load(Ordering::Relaxed),
            losses: s.losses.load(Ordering::Relaxed),
            lapsed: s.lapsed.load(Ordering::Relaxed),
            refused_at_node: s.refused_at_node.load(Ordering::Relaxed),
            generation: self.generation(),
        }
    }

    /// Graceful shutdown: stops using every lease at once, then releases them and leaves the
    /// membership, so the other nodes take the partitions over on their next tick rather than
    /// after `ttl`. Waits for the thread (at most about two command timeouts).
    pub fn stop(&self) {
        self.halt(Halt::Release);
    }

    /// Stops the thread without releasing anything, as `kill -9` would: the leases and the
    /// heartbeat expire in Redis after `ttl`. For failover tests and for a process that
    /// knows its Redis state is not to be trusted.
    pub fn abandon(&self) {
        self.halt(Halt::Abandon);
    }

    /// For fault tests: while frozen the thread does nothing, as if the process were stopped
    /// (SIGSTOP), and the local lease table is left as it was. Local deadlines still pass.
    #[doc(hidden)]
    pub fn freeze(&self, frozen: bool) {
        self.shared.control.lock().frozen = frozen;
        self.shared.wake.notify_all();
    }

    fn halt(&self, how: Halt) {
        {
            let mut control = self.shared.control.lock();
            control.halt.get_or_insert(how);
        }
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.lock().take() {
            // The thread catches nothing that could panic on Redis input; a panic there would
            // be a bug, reported by the join error.
            if thread.join().is_err() {
                tracing::error!(node = %self.shared.node, "the shard ownership thread panicked");
            }
        }
    }
}

impl Drop for Ownership {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node that should own partition `p` among `nodes`: the one with the highest weight for
/// (p, node), ties (never in practice) broken by the larger id. Stable across processes.
pub fn owner_of(p: u16, nodes: &[String]) -> Option<&str> {
    nodes
        .iter()
        .map(|node| (weight(p, node), node.as_str()))
        .max()
        .map(|(_, node)| node)
}

fn weight(p: u16, node: &str) -> u64 {
    use std::hash::Hasher;
    let mut h =
        siphasher::sip::SipHasher13::new_with_keys(0x626c_6672_792d_6f77, 0x6e65_7273_6869_7021);
    h.write(node.as_bytes());
    h.write_u8(0xff);
    h.write(&p.to_be_bytes());
    h.finish()
}

/// What one tick asks of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Take,
    Renew,
    Release,
}

impl Shared {
    fn run(&self, pool: &Pool) {
        let mut wait = Duration::ZERO;
        loop {
            match self.wait(wait) {
                Some(Halt::Release) => return self.release_all(pool),
                Some(Halt::Abandon) => return self.drop_leases(|_| true, false),
                None => {}
            }
            wait = match self.tick(pool) {
                Ok(wait) => wait,
                Err(e) => {
                    self.log_failure(&e);
                    self.drop_leases(|lease| lease.deadline <= Instant::now(), true);
                    self.options.retry_every
                }
            };
            self.record_gauges();
        }
    }

    /// Sleeps `wait` (longer while frozen), or until told to halt.
    fn wait(&self, wait: Duration) -> Option<Halt> {
        let until = Instant::now() + wait;
        let mut control = self.control.lock();
        loop {
            if control.halt.is_some() {
                return control.halt;
            }
            if control.frozen {
                self.wake.wait(&mut control);
            } else if Instant::now() >= until {
                return None;
            } else {
                self.wake.wait_until(&mut control, until);
            }
        }
    }

    /// One round: heartbeat, then take, renew and release in one pipeline. Returns when to
    /// run the next: soon while a partition this node should own is not yet its own, and
    /// right after the next other node's heartbeat would expire (its leases expire with it),
    /// so a dead node's partitions move about `ttl` after its last renew.
    fn tick(&self, pool: &Pool) -> Result<Duration, StoreError> {
        let (next_expiry, live) = self.heartbeat(pool, false)?;
        let mut wait = self.options.renew_every;
        if let Some(expiry) = next_expiry {
            wait = wait.min(expiry + HEARTBEAT_EXPIRY_SLACK);
        }
        self.live_nodes.store(live.len(), Ordering::Relaxed);
        self.log_recovered();
        // A lease past its local deadline is unusable: drop it now rather than renew it (the
        // renew might land after Redis let it go); it is taken again once Redis has expired it.
        self.drop_leases(|lease| lease.deadline <= Instant::now(), true);
        let plan = self.plan(&live);
        // A lease to hand over is unusable from now on, before the release can let another
        // node take it.
        self.drop_leases_in(&plan, Step::Release);
        if plan.is_empty() {
            return Ok(wait);
        }
        let ttl_ms = self.options.ttl.as_millis().to_string();
        let cmds = plan
            .iter()
            .map(|(p, step, value)| self.command(*p, *step, value, &ttl_ms))
            .collect();
        let sent = Instant::now();
        let replies = pool.with("renew shard leases", |conn| pipeline(conn, cmds))?;
        if replies.len() != plan.len() {
            return Err(unexpected(
                "renew shard leases",
                &Value::Int(replies.len() as i64),
            ));
        }
        if self.apply(&plan, &replies, sent)? {
            wait = wait.min(self.options.retry_every);
        }
        Ok(wait)
    }

    /// What to do with each partition given the live nodes: release what belongs to others,
    /// renew what is ours and should be, take what should be ours and is not.
    fn plan(&self, live: &[String]) -> Vec<(u16, Step, String)> {
        let leases = self.leases.read();
        let mut plan = Vec::new();
        for (p, lease) in (0u16..).zip(leases.iter()) {
            let mine = owner_of(p, live) == Some(self.node.as_str());
            match (lease, mine) {
                (Some(lease), true) => plan.push((p, Step::Renew, lease.fence.clone())),
                (Some(lease), false) => plan.push((p, Step::Release, lease.fence.clone())),
                (None, true) => plan.push((p, Step::Take, self.node.clone())),
                (None, false) => {}
            }
        }
        plan
    }

    fn command(&self, p: u16, step: Step, value: &str, ttl_ms: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        match step {
            Step::Take => cmd
                .arg(TAKE)
                .arg(2)
                .arg(self.keys.owner(p))
                .arg(self.keys.fence(p))
                .arg(value)
                .arg(ttl_ms),
            Step::Renew => cmd
                .arg(RENEW)
                .arg(1)
                .arg(self.keys.owner(p))
                .arg(value)
                .arg(ttl_ms),
            Step::Release => cmd.arg(RELEASE).arg(1).arg(self.keys.owner(p)).arg(value),
        };
        cmd
    }

    /// Applies the replies of one pipeline: renewals and takes set the deadline from when
    /// they were sent; releases (already out of the table) are counted.
    fn apply(
        &self,
        plan: &[(u16, Step, String)],
        replies: &[Value],
        sent: Instant,
    ) -> Result<bool, StoreError> {
        let deadline = sent + self.options.ttl - self.options.safety_margin;
        let mut pending = false;
        let mut changed = false;
        let mut leases = self.leases.write();
        for ((p, step, _), reply) in plan.iter().zip(replies) {
            let slot = &mut leases[usize::from(*p)];
            match step {
                Step::Renew => {
                    if redis::from_redis_value::<i64>(reply).ok() == Some(1) {
                        if let Some(lease) = slot.as_mut() {
                            lease.deadline = deadline;
                        }
                    } else {
                        *slot = None;
                        changed = true;
                        self.losses.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(LEASES_LOST, "reason" => "taken").increment(1);
                        pending = true;
                    }
                }
                Step::Release => {
                    if redis::from_redis_value::<i64>(reply).ok() == Some(1) {
                        self.releases.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.losses.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(LEASES_LOST, "reason" => "taken").increment(1);
                    }
                }
                Step::Take => match redis::from_redis_value::<(i64, String)>(reply) {
                    Ok((1, fence)) => {
                        *slot = Some(Lease { fence, deadline });
                        changed = true;
                        self.takeovers.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(TAKEOVERS).increment(1);
                    }
                    Ok(_) => pending = true,
                    Err(_) => return Err(unexpected("take a shard lease", reply)),
                },
            }
        }
        drop(leases);
        if changed {
            self.bump();
        }
        Ok(pending)
    }

    /// Beats (or leaves); returns how long until another node's heartbeat expires, if one
    /// is live, and the live node ids, sorted.
    fn heartbeat(
        &self,
        pool: &Pool,
        leave: bool,
    ) -> Result<(Option<Duration>, Vec<String>), StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(HEARTBEAT)
            .arg(1)
            .arg(&self.nodes_key)
            .arg(&self.node)
            .arg(self.options.ttl.as_millis().to_string())
            .arg(if leave { "1" } else { "0" });
        let reply: Value = pool.with("heartbeat", |conn| cmd.query(conn.as_dyn()))?;
        let (next_ms, mut live): (i64, Vec<String>) =
            redis::from_redis_value(&reply).map_err(|_| unexpected("heartbeat", &reply))?;
        live.sort();
        let next = u64::try_from(next_ms).ok().map(Duration::from_millis);
        Ok((next, live))
    }

    /// Graceful end: unusable at once locally, then handed over in Redis.
    fn release_all(&self, pool: &Pool) {
        let held: Vec<(u16, Step, String)> = {
            let leases = self.leases.read();
            (0u16..)
                .zip(leases.iter())
                .filter_map(|(p, l)| l.as_ref().map(|l| (p, Step::Release, l.fence.clone())))
                .collect()
        };
        self.drop_leases(|_| true, false);
        let cmds = held
            .iter()
            .map(|(p, step, value)| self.command(*p, *step, value, ""))
            .collect();
        match pool.with("release shard leases", |conn| pipeline(conn, cmds)) {
            Ok(replies) => {
                let released = replies
                    .iter()
                    .filter(|r| redis::from_redis_value::<i64>(r).ok() == Some(1))
                    .count();
                self.releases.fetch_add(released as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(node = %self.node, error = %e,
                "release shard leases on shutdown; they expire on their own"),
        }
        if let Err(e) = self.heartbeat(pool, true) {
            tracing::warn!(node = %self.node, error = %e, "leave the node membership");
        }
    }

    /// Removes from the table the partitions `plan` gives `step`.
    fn drop_leases_in(&self, plan: &[(u16, Step, String)], step: Step) {
        let mut leases = self.leases.write();
        let mut dropped = false;
        for (p, _, _) in plan.iter().filter(|(_, s, _)| *s == step) {
            dropped |= leases[usize::from(*p)].take().is_some();
        }
        drop(leases);
        if dropped {
            self.bump();
        }
    }

    /// Removes the leases `which` selects from the table; `lost` counts them as losses.
    fn drop_leases(&self, which: impl Fn(&Lease) -> bool, lost: bool) {
        let mut dropped = 0u64;
        {
            let mut leases = self.leases.write();
            for slot in leases.iter_mut() {
                if slot.as_ref().is_some_and(&which) {
                    *slot = None;
                    dropped += 1;
                }
            }
        }
        if dropped > 0 {
            if lost {
                self.losses.fetch_add(dropped, Ordering::Relaxed);
                self.lapsed.fetch_add(dropped, Ordering::Relaxed);
                metrics::counter!(LEASES_LOST, "reason" => "lapsed").increment(dropped);
                tracing::warn!(node = %self.node, leases = dropped,
                    "shard leases passed their deadline without a renew; no longer claiming there");
            }
            self.bump();
        }
    }

    fn record_gauges(&self) {
        let now = Instant::now();
        let owned = self
            .leases
            .read()
            .iter()
            .filter(|l| l.as_ref().is_some_and(|l| now < l.deadline))
            .count();
        metrics::gauge!(LEASES_OWNED).set(owned as f64);
        metrics::gauge!(NODES_LIVE).set(self.live_nodes.load(Ordering::Relaxed) as f64);
    }

    fn bump(&self) {
        *self.generation.lock() += 1;
        self.changed.notify_all();
    }

    fn log_failure(&self, e: &StoreError) {
        let mut log = self.errors.lock();
        log.failing = true;
        let now = Instant::now();
        if log.last.is_some_and(|last| now < last + ERROR_LOG_EVERY) {
            log.suppressed += 1;
            return;
        }
        tracing::warn!(node = %self.node, error = %e, repeated = log.suppressed,
            "keep shard leases (transient, retrying)");
        log.last = Some(now);
        log.suppressed = 0;
    }

    fn log_recovered(&self) {
        let mut log = self.errors.lock();
        if log.failing {
            log.failing = false;
            log.last = None;
            tracing::info!(node = %self.node, "shard leases: redis answers again");
        }
    }
}

#[cfg(test)]
#[path = "ownership_tests.rs"]
mod tests;
