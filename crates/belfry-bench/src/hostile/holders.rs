//! The hostile clients: N TCP connections to the server, each of which sends part of a request
//! and then nothing, re-opened as soon as the server closes it, so that N are held for as long
//! as the run wants them — the server's idle, header and body timeouts keep closing them, as
//! they should, and an attacker keeps opening new ones.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

/// Connects (with their first bytes) in progress at once: opening ten thousand at once would
/// overflow the listen backlog and turn the ramp into SYN retries a second apart.
pub const OPENING_CONCURRENCY: usize = 256;

/// Pause after a failed connect before the next try, so a refusing server is not spun on.
const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// How long one connect may take before it counts as failed and is retried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the server's answer to a connection over its per-client cap starts.
const REFUSAL: &[u8] = b"HTTP/1.1 503 ";

/// The kinds of partial connection, in the order holders take them (holder `i` is kind
/// `i % 4`).
pub const KINDS: [&str; 4] = [
    "connect, send nothing",
    "request line only",
    "headers without the blank line",
    "headers and half the body",
];

/// What a hostile client of kind `kind` sends before it stops.
pub fn partial_request(kind: usize, host: &str) -> Vec<u8> {
    let head = "POST /v1/queues/bench-hostile/tasks HTTP/1.1\r\n";
    match kind % KINDS.len() {
        0 => Vec::new(),
        1 => head.as_bytes().to_vec(),
        2 => format!("{head}host: {host}\r\ncontent-type: application/json\r\n").into_bytes(),
        _ => format!(
            "{head}host: {host}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"payload\": "
        )
        .into_bytes(),
    }
}

/// Counters the holders keep; the sampler reads `open`.
#[derive(Debug, Default)]
pub struct HolderCounters {
    /// Connections connected, with their partial request sent, and not yet closed.
    pub open: AtomicU64,
    /// Connections opened in total (first opens and re-opens).
    pub opened: AtomicU64,
    /// Connections the server closed (end of stream or reset) while held.
    pub closed_by_server: AtomicU64,
    /// Connects or first writes that failed or timed out.
    pub connect_errors: AtomicU64,
    /// Connections the server answered `503` (over its per-client cap) before closing.
    pub refused: AtomicU64,
    /// Holders that have connected at least once.
    pub reached: AtomicU64,
}

/// A snapshot of `HolderCounters`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct HolderTotals {
    pub open: u64,
    pub opened: u64,
    pub closed_by_server: u64,
    pub connect_errors: u64,
    pub refused: u64,
    pub reached: u64,
}

impl HolderTotals {
    /// What happened between snapshot `before` and this one: the counts of events since
    /// then, with `open` and `reached` as they are now.
    pub fn since(&self, before: &HolderTotals) -> HolderTotals {
        HolderTotals {
            open: self.open,
            opened: self.opened - before.opened,
            closed_by_server: self.closed_by_server - before.closed_by_server,
            connect_errors: self.connect_errors - before.connect_errors,
            refused: self.refused - before.refused,
            reached: self.reached,
        }
    }
}

impl HolderCounters {
    pub fn totals(&self) -> HolderTotals {
        HolderTotals {
            open: self.open.load(Ordering::Relaxed),
            opened: self.opened.load(Ordering::Relaxed),
            closed_by_server: self.closed_by_server.load(Ordering::Relaxed),
            connect_errors: self.connect_errors.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            reached: self.reached.load(Ordering::Relaxed),
        }
    }
}

/// N hostile connections, held until [`Holders::stop`].
///
/// They run on their own thread and single-threaded runtime, not on the bench's: when the
/// server closes thousands of them at one timeout, their re-opening would otherwise delay the
/// probes' own tasks, and that delay would be counted as the server's.
pub struct Holders {
    pub counters: Arc<HolderCounters>,
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Holders {
    /// Starts `count` holders against `addr`, holder `i` connecting from `sources[i % len]`
    /// (addresses of this machine: the attacker is another client than the probes), on a
    /// thread of their own; they open their connections `OPENING_CONCURRENCY` at a time
    /// and keep them open.
    pub fn start(
        addr: SocketAddr,
        sources: Vec<IpAddr>,
        host: &str,
        count: usize,
    ) -> std::io::Result<Holders> {
        let counters = Arc::new(HolderCounters::default());
        let (stop, stopped) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let requests: Vec<Arc<[u8]>> = (0..KINDS.len())
            .map(|k| Arc::from(partial_request(k, host)))
            .collect();
        let shared = counters.clone();
        let thread = std::thread::Builder::new()
            .name("hostile".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let opening = Arc::new(Semaphore::new(OPENING_CONCURRENCY));
                    let tasks: Vec<JoinHandle<()>> = (0..count)
                        .map(|i| {
                            tokio::spawn(hold(
                                (addr, sources[i % sources.len()]),
                                requests[i % KINDS.len()].clone(),
                                opening.clone(),
                                shared.clone(),
                                stopped.clone(),
                            ))
                        })
                        .collect();
                    for task in tasks {
                        let _ = task.await;
                    }
                });
            })?;
        Ok(Holders {
            counters,
            stop,
            thread,
        })
    }

    /// Closes every connection and waits for the holders' thread to end.
    pub async fn stop(self) -> HolderTotals {
        let _ = self.stop.send(true);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        self.counters.totals()
    }
}

/// `count` consecutive addresses from `first` (127.0.0.2, 127.0.0.3, …), or None when they
/// would run past the end of its address space (or `count` is 0).
pub fn sources(first: IpAddr, count: usize) -> Option<Vec<IpAddr>> {
    (0..count)
        .map(|i| match first {
            IpAddr::V4(v4) => u32::from(v4)
                .checked_add(u32::try_from(i).ok()?)
                .map(|n| IpAddr::from(std::net::Ipv4Addr::from(n))),
            IpAddr::V6(v6) => u128::from(v6)
                .checked_add(i as u128)
                .map(|n| IpAddr::from(std::net::Ipv6Addr::from(n))),
        })
        .collect::<Option<Vec<_>>>()
        .filter(|s| !s.is_empty())
}

/// One holder: connect, send the partial request, wait until the server closes, again.
async fn hold(
    (addr, source): (SocketAddr, IpAddr),
    request: Arc<[u8]>,
    opening: Arc<Semaphore>,
    counters: Arc<HolderCounters>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut buffer = [0u8; 512];
    let mut reached = false;
    while !*stopped.borrow() {
        let stream = {
            let Ok(_permit) = opening.acquire().await else {
                return;
            };
            tokio::select! {
                opened = open(addr, source, &request) => opened,
                _ = stopped.changed() => return,
            }
        };
        let Some(mut stream) = stream else {
            counters.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = tokio::time::sleep(CONNECT_RETRY_PAUSE) => continue,
                _ = stopped.changed() => return,
            }
        };
        counters.opened.fetch_add(1, Ordering::Relaxed);
        if !reached {
            reached = true;
            counters.reached.fetch_add(1, Ordering::Relaxed);
        }
        counters.open.fetch_add(1, Ordering::Relaxed);
        // Held until the server closes it (a timeout answer, if any, is read and ignored; a
        // refusal is counted).
        let mut first = true;
        let closed_by_server = loop {
            tokio::select! {
                read = stream.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => break true,
                    Ok(n) => {
                        if first && buffer[..n].starts_with(REFUSAL) {
                            counters.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        first = false;
                    }
                },
                _ = stopped.changed() => break false,
            }
        };
        counters.open.fetch_sub(1, Ordering::Relaxed);
        if closed_by_server {
            counters.closed_by_server.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Connects from `source` and sends the partial request; None when either fails or times out.
async fn open(addr: SocketAddr, source: IpAddr, request: &[u8]) -> Option<TcpStream> {
    let attempt = async {
        let socket = match source {
            IpAddr::V4(_) => TcpSocket::new_v4().ok()?,
            IpAddr::V6(_) => TcpSocket::new_v6().ok()?,
        };
        socket.bind(SocketAddr::new(source, 0)).ok()?;
        let mut stream = socket.connect(addr).await.ok()?;
        if !request.is_empty() {
            stream.write_all(request).await.ok()?;
        }
        Some(stream)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_requests_stop_short_of_a_whole_request() {
        assert!(partial_request(0, "h").is_empty());
        let line = String::from_utf8(partial_request(1, "h")).unwrap();
        assert!(line.ends_with("HTTP/1.1\r\n") && !line.contains("host:"));
        let headers = String::from_utf8(partial_request(2, "h")).unwrap();
        assert!(headers.contains("host: h\r\n") && !headers.contains("\r\n\r\n"));
        let body = String::from_utf8(partial_request(3, "h")).unwrap();
        let (_, sent) = body.split_once("\r\n\r\n").unwrap();
        assert!(body.contains("content-length: 100") && sent.len() < 100);
        assert_eq!(partial_request(7, "h"), partial_request(3, "h"));
    }

    #[test]
    fn sources_are_consecutive_addresses_within_their_space() {
        let from = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            sources(from("127.0.0.254"), 3).unwrap(),
            vec![from("127.0.0.254"), from("127.0.0.255"), from("127.0.1.0")]
        );
        assert_eq!(
            sources(from("::1"), 2).unwrap(),
            vec![from("::1"), from("::2")]
        );
        assert_eq!(sources(from("255.255.255.255"), 2), None);
        assert_eq!(sources(from("127.0.0.2"), 0), None);
    }

    #[tokio::test]
    async fn holders_reopen_what_the_server_closes() {
        // A listener that refuses at once: every holder is closed and re-opens, and counts the
        // refusal.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            while let Ok((socket, peer)) = listener.accept().await {
                assert_eq!(
                    peer.ip(),
                    IpAddr::from([127, 0, 0, 2]),
                    "the holders' source"
                );
                let _ = socket.try_write(b"HTTP/1.1 503 Service Unavailable\r\n\r\n");
                drop(socket);
            }
        });
        let source = IpAddr::from([127, 0, 0, 2]);
        let holders = Holders::start(addr, vec![source], "h", 4).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while holders.counters.totals().closed_by_server < 20
            || holders.counters.totals().refused < 5
        {
            assert!(tokio::time::Instant::now() < deadline, "no re-opens");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let totals = holders.stop().await;
        assert!(totals.opened >= totals.closed_by_server);
        assert_eq!(totals.open, 0);
        assert_eq!(totals.reached, 4);
        assert!(
            !server.is_finished(),
            "the listener saw another source address"
        );
        server.abort();
    }
}
