//! Connections: a small pool of blocking connections to one Redis or to a cluster, the
//! mapping of Redis errors onto the store's errors, and script calls that survive a node
//! that has not seen a script yet.
//!
//! Blocking, because the `Store` contract is synchronous: the server already runs store calls
//! on its blocking pool, and a pool of plain connections keeps one call one round trip with
//! no runtime inside the store. Each pooled connection is used by one call at a time.

use std::time::Duration;

use belfry_store::StoreError;
use parking_lot::Mutex;
use redis::cluster::ClusterClient;
use redis::{ConnectionLike, ErrorKind, RedisError, Value};

use crate::each::ClusterConn;
use crate::reply::{as_array, as_i64};
use crate::scripts::Lua;
use crate::target::RedisTarget;

pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How long a connection attempt and a command may take before the call fails as
/// unavailable (a paused or partitioned Redis must not hang API calls).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            command: Duration::from_secs(5),
        }
    }
}

enum Client {
    Single(redis::Client),
    Cluster(ClusterClient),
}

pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(Box<ClusterConn>),
}

impl Conn {
    pub(crate) fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Single(c) => c,
            Conn::Cluster(c) => &mut c.con,
        }
    }
}

pub(crate) struct Pool {
    client: Client,
    timeouts: Timeouts,
    idle: Mutex<Vec<Conn>>,
    idle_max: usize,
    /// A cluster's `user:password`, for the connections to the masters it discovers.
    credentials: Option<String>,
}

impl Pool {
    pub(crate) fn open(target: &RedisTarget, timeouts: Timeouts, idle_max: usize) -> Result<Pool> {
        let client = match target {
            RedisTarget::Single(url) => Client::Single(
                redis::Client::open(url.as_str())
                    .map_err(|e| StoreError::Invalid(format!("redis URL {target}: {e}")))?,
            ),
            RedisTarget::Cluster(nodes) => Client::Cluster(
                ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.command)
                    .retries(2)
                    .build()
                    .map_err(|e| StoreError::Invalid(format!("redis cluster {target}: {e}")))?,
            ),
        };
        Ok(Pool {
            client,
            credentials: target.credentials().map(str::to_owned),
            timeouts,
            idle: Mutex::new(Vec::new()),
            idle_max,
        })
    }

    fn connect(&self) -> Result<Conn> {
        match &self.client {
            Client::Single(client) => {
                let con = client
                    .get_connection_with_timeout(self.timeouts.connect)
                    .map_err(|e| map_error(e, "connect to redis"))?;
                con.set_read_timeout(Some(self.timeouts.command))
                    .and_then(|()| con.set_write_timeout(Some(self.timeouts.command)))
                    .map_err(|e| map_error(e, "connect to redis"))?;
                Ok(Conn::Single(con))
            }
            Client::Cluster(client) => {
                let con = client
                    .get_connection()
                    .map_err(|e| map_error(e, "connect to the redis cluster"))?;
                Ok(Conn::Cluster(Box::new(ClusterConn::new(
                    con,
                    self.timeouts,
                    self.credentials.as_deref(),
                ))))
            }
        }
    }

    /// Runs `f` on a pooled connection. A connection whose call failed with a connection-level
    /// error is dropped rather than returned, so the next call reconnects.
    pub(crate) fn with<T>(
        &self,
        context: &'static str,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = match self.idle.lock().pop() {
            Some(conn) => conn,
            None => self.connect()?,
        };
        match f(&mut conn) {
            Ok(value) => {
                let mut idle = self.idle.lock();
                if idle.len() < self.idle_max {
                    idle.push(conn);
                }
                Ok(value)
            }
            Err(e) => {
                let keep = !(e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal());
                if keep && conn.as_dyn().is_open() {
                    let mut idle = self.idle.lock();
                    if idle.len() < self.idle_max {
                        idle.push(conn);
                    }
                }
                Err(map_error(e, context))
            }
        }
    }
}

/// What a Redis error means for the call that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The network, a timeout, a failover, a loading or busy server: may pass by itself.
    Transient,
    /// `MISCONF`: Redis cannot persist (a failed snapshot) and refuses writes until it can.
    CannotPersist,
    /// `OOM`: Redis is at its `maxmemory` and refuses what would grow the data.
    Full,
    /// A wrong or missing password, or a user without a needed command or key.
    Denied,
    /// Anything else: a reply belfry did not expect.
    Unexpected,
}

fn classify(e: &RedisError) -> Class {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ReadOnly
                | ErrorKind::Moved
                | ErrorKind::Ask
        )
        || e.code() == Some("BUSY");
    if transient {
        return Class::Transient;
    }
    if e.kind() == ErrorKind::AuthenticationFailed {
        return Class::Denied;
    }
    match e.code() {
        Some("MISCONF") => Class::CannotPersist,
        Some("OOM") => Class::Full,
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => Class::Denied,
        _ => Class::Unexpected,
    }
}

/// A Redis error as the store's error: transient failures and a Redis that cannot persist
/// are [`StoreError::Unavailable`]; `OOM` is [`StoreError::Full`] (an ordinary refusal, as a
/// full disk is for the embedded engine); refused credentials are
/// [`StoreError::AccessDenied`]; only what belfry cannot make sense of is `Corrupt`.
pub(crate) fn map_error(e: RedisError, context: &'static str) -> StoreError {
    match classify(&e) {
        // A read that timed out reaches us as the socket's EAGAIN ("Resource temporarily
        // unavailable (os error 11)"): say what it means.
        Class::Transient if is_no_answer(&e) => StoreError::Unavailable {
            detail: format!(
                "{context}: redis did not answer within redis.command_timeout (it is stopped, \
                 overloaded, or the network drops its packets): {e}"
            ),
        },
        Class::Transient => StoreError::Unavailable {
            detail: format!("{context}: {e}"),
        },
        Class::CannotPersist => StoreError::Unavailable {
            detail: format!(
                "redis cannot persist its data and refuses writes ({context}: {e}); its log \
                 says why (a failed snapshot or append-only file write)"
            ),
        },
        Class::Full => StoreError::Full {
            detail: format!(
                "redis is at its maxmemory limit and refused the change ({context}: {e}); \
                 raise maxmemory or free memory in redis (or let the queues drain), then retry"
            ),
        },
        Class::Denied => StoreError::AccessDenied {
            detail: format!(
                "redis refused the credentials ({context}: {e}); check the user and password \
                 in the store URL, and that the user's ACL allows belfry's commands and keys"
            ),
        },
        Class::Unexpected => StoreError::Corrupt {
            location: format!("redis reply ({context})"),
            detail: e.to_string(),
        },
    }
}

/// Whether `e` is a socket read or write that timed out (the OS says `WouldBlock` for a
/// socket timeout on Linux, `TimedOut` elsewhere).
fn is_no_answer(e: &RedisError) -> bool {
    e.is_timeout()
        || std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            })
}

/// A reply of an unexpected shape: a typed error naming what was expected.
pub(crate) fn unexpected(context: &str, value: &Value) -> StoreError {
    let mut shown = format!("{value:?}");
    shown.truncate(200);
    StoreError::Corrupt {
        location: format!("redis reply ({context})"),
        detail: format!("unexpected reply {shown}"),
    }
}

/// Runs a script by its SHA, sending the source once when the node answering does not have
/// it yet (a new node, a restarted one, or a promoted replica). `EVAL` caches the script on
/// the node it reaches, which in a cluster is the node of the script's first key.
pub(crate) fn run_script(
    con: &mut dyn ConnectionLike,
    script: &Lua,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
    match cmd.query::<Value>(con) {
        Err(e) if e.kind() == ErrorKind::NoScriptError => {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script.source).arg(keys.len()).arg(keys).arg(args);
            cmd.query(con)
        }
        other => other,
    }
}

/// Waits until `replicas` replicas hold every write this connection made on the node that
/// serves `key` (Redis `WAIT`), and says how many did within `timeout`.
pub(crate) fn wait_replicas(
    conn: &mut Conn,
    key: &[u8],
    replicas: u32,
    timeout: Duration,
) -> redis::RedisResult<i64> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(timeout.as_millis() as u64);
    match conn {
        Conn::Single(c) => cmd.query(c),
        Conn::Cluster(c) => {
            let route = Route::new(key_slot(key), SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            redis::from_redis_value(&c.con.route_command(&cmd, routing)?)
        }
    }
}

/// The cluster slot of `key`: CRC16 of its hash tag (the part between the first `{` and the
/// next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

/// One Redis's pipeline of `cmds`, in order.
pub(crate) fn pipe_of(cmds: impl IntoIterator<Item = redis::Cmd>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    pipe
}

/// Runs `cmds` as one pipeline: in a cluster, grouped by node (each command may name its own
/// slot; the pipeline is not atomic).
pub(crate) fn pipeline(conn: &mut Conn, cmds: Vec<redis::Cmd>) -> redis::RedisResult<Vec<Value>> {
    if cmds.is_empty() {
        return Ok(Vec::new());
    }
    match conn {
        Conn::Single(c) => pipe_of(cmds).query(c),
        Conn::Cluster(c) => {
            let mut pipe = redis::cluster::cluster_pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            pipe.query(&mut c.con)
        }
    }
}

/// Checks, on a seed node, that the cluster serves every slot, so a misconfigured cluster
/// fails at start-up with the slots it lacks instead of failing calls later. Answers the
/// masters' `host:port`s.
pub(crate) fn check_cluster_slots(nodes: &[String], timeouts: Timeouts) -> Result<Vec<String>> {
    let mut last_error = None;
    for node in nodes {
        // What messages may show: the address, never the password.
        let shown = crate::target::redact(node);
        let shown = shown
            .trim_start_matches("redis://")
            .trim_start_matches("***@");
        let attempt = (|| -> redis::RedisResult<Value> {
            let client = redis::Client::open(node.as_str())?;
            let mut con = client.get_connection_with_timeout(timeouts.connect)?;
            con.set_read_timeout(Some(timeouts.command))?;
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)
        })();
        match attempt {
            Ok(reply) => return masters_of_every_slot(&reply, shown),
            // A permanent mistake, not a passing one: the URL names the wrong kind of store.
            Err(e)
                if e.detail()
                    .is_some_and(|d| d.contains("cluster support disabled")) =>
            {
                return Err(StoreError::Invalid(format!(
                    "the redis at {shown} is not a cluster (cluster support disabled); use \
                     redis://{shown} for one Redis"
                )))
            }
            // Every seed takes the same credentials: no other seed would let us in.
            Err(e) if classify(&e) == Class::Denied => {
                return Err(map_error(e, "read the cluster's slots"))
            }
            Err(e) => last_error = Some(format!("{shown}: {e}")),
        }
    }
    Err(StoreError::Unavailable {
        detail: format!(
            "no seed node of the redis cluster answered CLUSTER SLOTS ({})",
            last_error.unwrap_or_default()
        ),
    })
}

/// The masters (`host:port`) a seed's `CLUSTER SLOTS` reply names, once it shows every slot
/// served; else which slots are not, as an error naming the seed (`shown`).
fn masters_of_every_slot(reply: &Value, shown: &str) -> Result<Vec<String>> {
    let mut covered = vec![false; 16384];
    for range in as_array(reply).unwrap_or_default() {
        let Some(items) = as_array(range) else {
            continue;
        };
        let (Some(lo), Some(hi)) = (
            items.first().and_then(as_i64),
            items.get(1).and_then(as_i64),
        ) else {
            continue;
        };
        for slot in lo.max(0)..=hi.min(16383) {
            covered[slot as usize] = true;
        }
    }
    let missing = missing_ranges(&covered);
    if !missing.is_empty() {
        return Err(StoreError::Invalid(format!(
            "the redis cluster at {shown} does not serve slots {missing}: every one of the 16384 \
             slots needs a master (see `redis-cli --cluster check {shown}`)"
        )));
    }
    let mut masters: Vec<String> = crate::each::parse_slots(reply)
        .map_err(|e| map_error(e, "read the cluster's slots"))?
        .into_iter()
        .map(|(_, _, master)| master)
        .collect();
    masters.sort();
    masters.dedup();
    Ok(masters)
}

fn missing_ranges(covered: &[bool]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < covered.len() {
        if covered[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < covered.len() && !covered[i] {
            i += 1;
        }
        out.push(if i - 1 == start {
            start.to_string()
        } else {
            format!("{start}-{}", i - 1)
        });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::{classify, key_slot, Class};
    use redis::{ErrorKind, RedisError};

    /// A server's error reply with its code, as Redis sends it.
    fn reply(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.into(), Some(detail.into()))
    }

    #[test]
    fn redis_errors_are_classified_by_what_they_mean() {
        let cases: Vec<(RedisError, Class)> = vec![
            (
                reply("OOM", "command not allowed when used memory"),
                Class::Full,
            ),
            (
                reply("MISCONF", "unable to persist to disk"),
                Class::CannotPersist,
            ),
            (reply("NOAUTH", "Authentication required."), Class::Denied),
            (
                reply("WRONGPASS", "invalid username-password pair"),
                Class::Denied,
            ),
            (
                reply("NOPERM", "no permissions to run 'evalsha'"),
                Class::Denied,
            ),
            (
                (ErrorKind::AuthenticationFailed, "failed").into(),
                Class::Denied,
            ),
            (
                reply("BUSY", "Redis is busy running a script."),
                Class::Transient,
            ),
            (
                (ErrorKind::BusyLoadingError, "loading").into(),
                Class::Transient,
            ),
            (
                std::io::Error::from(std::io::ErrorKind::TimedOut).into(),
                Class::Transient,
            ),
            (
                (ErrorKind::ResponseError, "unknown op").into(),
                Class::Unexpected,
            ),
            (
                (ErrorKind::TypeError, "not an integer").into(),
                Class::Unexpected,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(classify(&error), expected, "{error}");
        }
    }

    #[test]
    fn key_slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` on a Redis 7 cluster.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"123456789"), 0x31c3);
    }
}
