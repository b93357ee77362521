//! The store's health check, as `/readyz` asks it: one `PING` to every master (one Redis: to
//! it), each on a socket of its own and all at once, within the command timeout. One try and
//! no client retries: through the pooled cluster connection, the client's three tries and its
//! reconnects to a silent master took 12 to 15 s to give up (5 s command timeout), longer
//! than a load balancer waits for a probe.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use belfry_store::StoreError;
use parking_lot::Mutex;
use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisResult, Value};

use crate::each::parse_slots;
use crate::target::{redact, RedisTarget};

pub(crate) struct Health {
    /// What to ping: one Redis's URL, or each master's (`redis://[auth@]host:port`), as the
    /// last `CLUSTER SLOTS` seen named them.
    masters: Mutex<Vec<String>>,
    /// A cluster's `user:password@` (or empty), for the masters `CLUSTER SLOTS` names; none
    /// for one Redis.
    auth: Option<String>,
    timeout: Duration,
}

impl Health {
    /// `masters`: a cluster's masters (`host:port`) as read at connect; ignored for one Redis.
    pub(crate) fn new(target: &RedisTarget, masters: &[String], timeout: Duration) -> Health {
        let (urls, auth) = match target {
            RedisTarget::Single(url) => (vec![url.clone()], None),
            RedisTarget::Cluster(_) => {
                let auth = target
                    .credentials()
                    .map(|c| format!("{c}@"))
                    .unwrap_or_default();
                let urls = masters
                    .iter()
                    .map(|m| format!("redis://{auth}{m}"))
                    .collect();
                (urls, Some(auth))
            }
        };
        Health {
            masters: Mutex::new(urls),
            auth,
            timeout,
        }
    }

    /// Every master answered its `PING` within the timeout, or why not (each master that did
    /// not, by address, never with a password).
    pub(crate) fn check(&self) -> Result<(), String> {
        let deadline = Instant::now() + self.timeout;
        let urls = self.masters.lock().clone();
        let cluster = self.auth.is_some();
        let answers: Vec<RedisResult<Option<Value>>> = std::thread::scope(|s| {
            let pings: Vec<_> = urls
                .iter()
                .map(|url| s.spawn(move || ping(url, deadline, cluster)))
                .collect();
            pings
                .into_iter()
                .map(|p| p.join().unwrap_or_else(|_| Err(gone())))
                .collect()
        });
        let mut failed = Vec::new();
        let mut slots = None;
        for (url, answer) in urls.iter().zip(answers) {
            match answer {
                Ok(seen) => slots = slots.or(seen),
                Err(e) => failed.push(self.why(url, e)),
            }
        }
        // A failover or a resharding moves masters: the next check pings those named now.
        if let (Some(auth), Some(reply)) = (&self.auth, slots) {
            let masters = master_urls(&reply, auth);
            if !masters.is_empty() {
                *self.masters.lock() = masters;
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        Err(failed.join("; "))
    }

    fn why(&self, url: &str, e: redis::RedisError) -> String {
        let shown = redact(url);
        let shown = shown
            .trim_start_matches("redis://")
            .trim_start_matches("***@");
        if e.is_timeout() {
            format!(
                "redis at {shown} did not answer a PING within the command timeout ({:?})",
                self.timeout
            )
        } else {
            match crate::conn::map_error(e, "check that redis answers") {
                StoreError::Unavailable { detail } => format!("redis at {shown}: {detail}"),
                other => format!("redis at {shown}: {other}"),
            }
        }
    }
}

fn gone() -> redis::RedisError {
    (ErrorKind::ClientError, "the health check's thread panicked").into()
}

/// One round trip to the node at `url` on a socket of its own, every step by `deadline`:
/// `AUTH` when the URL has credentials, `PING`, and in a cluster `CLUSTER SLOTS` (answered).
/// Plain TCP and these few commands rather than the client's connection set-up, whose own
/// commands' replies each wait out a whole timeout on a silent server.
fn ping(url: &str, deadline: Instant, cluster: bool) -> RedisResult<Option<Value>> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let info = url.into_connection_info()?;
    let ConnectionAddr::Tcp(host, port) = &info.addr else {
        return Err((ErrorKind::InvalidClientConfig, "not a TCP address").into());
    };
    let address = (host.as_str(), *port).to_socket_addrs()?.next();
    let address = address.ok_or((ErrorKind::InvalidClientConfig, "no address"))?;
    let stream = TcpStream::connect_timeout(&address, left())?;
    let mut pipe = redis::pipe();
    if let Some(password) = &info.redis.password {
        let auth = pipe.cmd("AUTH");
        if let Some(user) = &info.redis.username {
            auth.arg(user);
        }
        auth.arg(password);
    }
    pipe.cmd("PING");
    if cluster {
        pipe.cmd("CLUSTER").arg("SLOTS");
    }
    stream.set_write_timeout(Some(left()))?;
    (&stream).write_all(&pipe.get_packed_pipeline())?;
    let mut reader = BufReader::new(&stream);
    let mut parser = redis::Parser::new();
    let mut last = Value::Nil;
    for _ in 0..pipe.len() {
        stream.set_read_timeout(Some(left()))?;
        last = match parser.parse_value(&mut reader)? {
            Value::ServerError(error) => return Err(error.into()),
            value => value,
        };
    }
    Ok(cluster.then_some(last))
}

/// The masters a `CLUSTER SLOTS` reply names, as URLs with `auth`.
fn master_urls(reply: &Value, auth: &str) -> Vec<String> {
    let mut urls: Vec<String> = parse_slots(reply)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, _, addr)| format!("redis://{auth}{addr}"))
        .collect();
    urls.sort();
    urls.dedup();
    urls
}
