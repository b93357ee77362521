//! Pipelines answered command by command.
//!
//! The `redis` crate turns a pipeline's replies into the first error among them, although
//! Redis ran every other command of it. When a node lacks a script (`NOSCRIPT`: it restarted,
//! its scripts were flushed, or it is a promoted replica), a caller that runs the whole
//! pipeline again runs twice what already ran once: a lease change run again finds its lease
//! gone and reports a success as a failure. So the pipelines that change tasks read each reply
//! on its own ([`pipeline_each`]), and their callers run again only the commands that answered
//! `NOSCRIPT`, which ran nowhere.
//!
//! One Redis: the connection's own reply reader keeps each reply. A cluster: the crate's
//! cluster pipeline keeps per-command replies to itself, so here the commands go to the
//! masters serving their slots (as `CLUSTER SLOTS` said) over connections of this module's
//! own, one per master, kept with the pooled cluster connection: every master's pipeline is
//! sent, then each is read. A command answered by a redirect (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`) ran nowhere: it goes again through the cluster connection, which follows
//! redirects, and the slot map is read again at the next call.

use std::collections::HashMap;

use redis::cluster::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionLike, ErrorKind, RedisResult, Value};

use crate::conn::{key_slot, map_error, pipe_of, Conn, Result, Timeouts};
use crate::reply::{as_array, as_bytes, as_i64};
use crate::scripts::Lua;

/// A script call's keys and arguments.
pub(crate) type ScriptCall<'a> = (&'a [Vec<u8>], &'a [Vec<u8>]);

/// The cluster connection of the pool, and the direct connections to its masters.
pub(crate) struct ClusterConn {
    pub(crate) con: ClusterConnection,
    masters: Masters,
}

impl ClusterConn {
    /// `credentials`: the cluster's `user:password`, for the connections to its masters.
    pub(crate) fn new(
        con: ClusterConnection,
        timeouts: Timeouts,
        credentials: Option<&str>,
    ) -> ClusterConn {
        ClusterConn {
            con,
            masters: Masters {
                slots: Vec::new(),
                conns: HashMap::new(),
                timeouts,
                auth: credentials.map(|c| format!("{c}@")).unwrap_or_default(),
            },
        }
    }
}

/// Where each slot is served, and a connection to each master met so far.
struct Masters {
    /// Slot ranges (first, last) and the `host:port` of their master; empty when not read yet
    /// or found stale.
    slots: Vec<(u16, u16, String)>,
    conns: HashMap<String, redis::Connection>,
    timeouts: Timeouts,
    /// `user:password@`, or empty: what the seeds carried, so the masters let us in too.
    auth: String,
}

/// Runs `cmds` as one pipeline and answers each command's reply on its own: a command Redis
/// refused is its own `Err` (in a cluster, one redirected is sent again first). The outer
/// `Err` is a failure of the connection, after which any of the commands may have run.
pub(crate) fn pipeline_each(
    conn: &mut Conn,
    cmds: &[redis::Cmd],
) -> RedisResult<Vec<RedisResult<Value>>> {
    if cmds.is_empty() {
        return Ok(Vec::new());
    }
    match conn {
        Conn::Single(c) => {
            let pipe = pipe_of(cmds.iter().cloned());
            let replies = c.req_packed_commands(&pipe.get_packed_pipeline(), 0, cmds.len())?;
            Ok(replies.into_iter().map(one).collect())
        }
        Conn::Cluster(c) => c.pipeline_each(cmds),
    }
}

/// A reply as a result: a server's error reply becomes the `Err` it stands for.
fn one(value: Value) -> RedisResult<Value> {
    match value {
        Value::ServerError(error) => Err(error.into()),
        value => Ok(value),
    }
}

impl ClusterConn {
    fn pipeline_each(&mut self, cmds: &[redis::Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        if self.masters.slots.is_empty() {
            self.masters.slots = read_slots(&mut self.con)?;
        }
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, cmd) in cmds.iter().enumerate() {
            let Some(master) = first_key(cmd).and_then(|key| self.masters.master_of(key)) else {
                continue; // no master known: sent through the cluster connection below
            };
            match groups.iter_mut().find(|(addr, _)| *addr == master) {
                Some((_, members)) => members.push(i),
                None => groups.push((master.to_owned(), vec![i])),
            }
        }
        let mut replies: Vec<Option<RedisResult<Value>>> = cmds.iter().map(|_| None).collect();
        if let Err(error) = self.masters.run(&groups, cmds, &mut replies) {
            // A master failed mid-way: forget what was known of the cluster's shape.
            self.masters.slots.clear();
            self.masters.conns.clear();
            return Err(error);
        }
        for (reply, cmd) in replies.iter_mut().zip(cmds) {
            let again = match reply {
                None => true,
                Some(Err(error)) => error.is_cluster_error(),
                Some(Ok(_)) => false,
            };
            if again {
                self.masters.slots.clear();
                *reply = Some(self.con.req_command(cmd));
            }
        }
        Ok(replies
            .into_iter()
            .map(|reply| reply.unwrap_or_else(|| Err((ErrorKind::ClientError, "no reply").into())))
            .collect())
    }
}

impl Masters {
    /// The master serving `key`, if known.
    fn master_of(&self, key: &[u8]) -> Option<&str> {
        let slot = key_slot(key);
        self.slots
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.as_str())
    }

    /// Sends every master its commands, then reads each reply into `replies`.
    fn run(
        &mut self,
        groups: &[(String, Vec<usize>)],
        cmds: &[redis::Cmd],
        replies: &mut [Option<RedisResult<Value>>],
    ) -> RedisResult<()> {
        for (addr, members) in groups {
            let pipe = pipe_of(members.iter().map(|&i| cmds[i].clone()));
            self.connection(addr)?
                .send_packed_command(&pipe.get_packed_pipeline())?;
        }
        for (addr, members) in groups {
            let con = self.connection(addr)?;
            for &i in members {
                replies[i] = Some(one(con.recv_response()?));
            }
        }
        Ok(())
    }

    fn connection(&mut self, addr: &str) -> RedisResult<&mut redis::Connection> {
        if !self.conns.contains_key(addr) {
            let client = redis::Client::open(format!("redis://{}{addr}", self.auth))?;
            let con = client.get_connection_with_timeout(self.timeouts.connect)?;
            con.set_read_timeout(Some(self.timeouts.command))?;
            con.set_write_timeout(Some(self.timeouts.command))?;
            self.conns.insert(addr.to_owned(), con);
        }
        self.conns
            .get_mut(addr)
            .ok_or_else(|| (ErrorKind::ClientError, "no connection to a master").into())
    }
}

/// The slot ranges and their masters, from `CLUSTER SLOTS` on any node. A range whose master
/// has no usable address is left out (its commands go through the cluster connection).
fn read_slots(con: &mut ClusterConnection) -> RedisResult<Vec<(u16, u16, String)>> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
    parse_slots(&con.route_command(redis::cmd("CLUSTER").arg("SLOTS"), routing)?)
}

/// A `CLUSTER SLOTS` reply as slot ranges and the `host:port` of their masters; a range whose
/// master has no usable address is left out.
pub(crate) fn parse_slots(reply: &Value) -> RedisResult<Vec<(u16, u16, String)>> {
    let bad = || redis::RedisError::from((ErrorKind::ResponseError, "unexpected CLUSTER SLOTS"));
    let mut slots = Vec::new();
    for range in as_array(reply).ok_or_else(bad)? {
        let items = as_array(range).ok_or_else(bad)?;
        let (Some(first), Some(last), Some(master)) = (
            items.first().and_then(as_i64),
            items.get(1).and_then(as_i64),
            items.get(2).and_then(as_array),
        ) else {
            return Err(bad());
        };
        let host = master.first().and_then(as_bytes).unwrap_or_default();
        let port = master.get(1).and_then(as_i64).unwrap_or(0);
        let (Ok(first), Ok(last), Ok(host)) = (
            u16::try_from(first),
            u16::try_from(last),
            std::str::from_utf8(host),
        ) else {
            return Err(bad());
        };
        if host.is_empty() || host == "?" || port <= 0 {
            continue;
        }
        slots.push((first, last, format!("{host}:{port}")));
    }
    Ok(slots)
}

/// The first key of a command: after the script and the key count for scripts, else the
/// first argument.
fn first_key(cmd: &redis::Cmd) -> Option<&[u8]> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .take(4)
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            redis::Arg::Cursor => &b""[..],
        })
        .collect();
    let name = args.first()?;
    let scripted = [
        &b"EVALSHA"[..],
        b"EVAL",
        b"EVALSHA_RO",
        b"EVAL_RO",
        b"FCALL",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n));
    match (scripted, args.as_slice()) {
        (true, [_, _, count, key]) if *count != b"0" => Some(key),
        (true, _) => None,
        (false, [_, key, ..]) => Some(key),
        (false, _) => None,
    }
}

impl crate::store::RedisStore {
    /// Runs `lua` once per `(keys, args)` of `calls` in one pipeline ([`pipeline_each`]),
    /// answering the replies in order; a call answered `NOSCRIPT` runs again, alone
    /// ([`Self::rerun_missing`]).
    pub(crate) fn scripts_pipelined(
        &self,
        c: &mut Conn,
        lua: &Lua,
        calls: &[ScriptCall<'_>],
        what: &'static str,
    ) -> Result<Vec<Value>> {
        let cmds: Vec<redis::Cmd> = calls
            .iter()
            .map(|(keys, args)| crate::claim_many::evalsha(lua, keys, args))
            .collect();
        let replies = pipeline_each(c, &cmds).map_err(|e| map_error(e, what))?;
        self.rerun_missing(c, lua, replies, calls, what)
    }

    /// The replies of script calls made with [`pipeline_each`], each call's `(keys, args)` in
    /// `calls`: a call that answered `NOSCRIPT` ran nowhere, so it runs again (after every
    /// script is loaded on every master) and only it; any other error fails the whole.
    pub(crate) fn rerun_missing(
        &self,
        c: &mut Conn,
        lua: &Lua,
        replies: Vec<RedisResult<Value>>,
        calls: &[ScriptCall<'_>],
        what: &'static str,
    ) -> Result<Vec<Value>> {
        debug_assert_eq!(replies.len(), calls.len(), "one reply per call");
        let mut out = Vec::with_capacity(replies.len());
        let mut missing = Vec::new();
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(value) => out.push(value),
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    missing.push(i);
                    out.push(Value::Nil);
                }
                Err(e) => return Err(map_error(e, what)),
            }
        }
        if !missing.is_empty() {
            self.load_scripts(c)?;
            for i in missing {
                let (keys, args) = calls[i];
                out[i] = self.script(c, lua, keys, args, what)?;
            }
        }
        Ok(out)
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::RedisServer;

    /// One Redis: a script flushed half-way through a pipeline fails the commands after the
    /// flush only, and each reply says so on its own.
    #[test]
    fn one_redis_answers_each_command_of_a_pipeline() {
        let server = RedisServer::start();
        let mut con = server.connection();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg("return redis.call('INCR', KEYS[1])")
            .query(&mut con)
            .unwrap();
        let incr = || {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha).arg(1).arg("n");
            cmd
        };
        let mut flush = redis::cmd("SCRIPT");
        flush.arg("FLUSH");
        let mut conn = Conn::Single(con);
        let replies = pipeline_each(&mut conn, &[incr(), flush, incr()]).unwrap();
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0].as_ref().ok(), Some(&Value::Int(1)));
        assert!(replies[1].is_ok(), "{:?}", replies[1]);
        let error = replies[2].as_ref().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NoScriptError, "{error}");
        let Conn::Single(con) = &mut conn else {
            unreachable!()
        };
        let n: i64 = redis::cmd("GET").arg("n").query(con).unwrap();
        assert_eq!(n, 1, "the first call ran, once");
    }
}
