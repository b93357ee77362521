//! The HTTP listener: accepting connections, serving them, and keeping hostile or careless
//! clients from taking the server offline.
//!
//! `axum::serve` timed nothing out and capped nothing: twenty thousand idle or half-sent
//! connections used up the file descriptors, and then nobody was answered, not even
//! `/healthz`. Here, every number is named and configurable:
//! - at most `http.connections_max` connections are served at once. At the cap the listener
//!   goes on accepting, up to `http.listen_backlog` connections that wait for a place (then
//!   it stops, and the kernel's backlog holds newcomers): it sees who connects, and a light
//!   client's connection takes the place of an idle one of the heaviest client address
//!   (`clients.rs`). An accept error such as running out of descriptors pauses accepting
//!   briefly instead of spinning;
//! - at most `http.connections_per_client_max` of them from one client address; a connection
//!   over it is answered `503 too_many_connections` at once and closed (`clients.rs`);
//! - the kernel holds up to `http.listen_backlog` handshaken connections not yet accepted
//!   (bound in `lib.rs`), so a burst of newcomers waits there instead of having its
//!   handshakes dropped and retried a second later;
//! - a connection gets HTTP's state (hyper's connection and buffers) only once its client
//!   sends a first byte: one held open in silence costs its socket and a small task, about
//!   2 KiB instead of 15;
//! - a request's headers must be complete within `http.header_read_timeout` of the moment
//!   the connection starts waiting for them (its first bytes arrived, or the previous
//!   response went out): hyper's header timer, which trickled bytes do not reset. A client
//!   that had sent part of a head is answered `408 request_timeout` (`answer.rs`); one that
//!   sent nothing since its last response is just closed;
//! - a request body that sends nothing for `http.body_read_timeout`, or arrives too slowly
//!   in all, fails the request with `408 request_timeout` and closes the connection
//!   (`api::body_timeout`, applied in `api::finish`);
//! - a connection with no request in progress and no bytes moving for `http.idle_timeout`
//!   is closed: an idle keep-alive connection, or one that connected and sent nothing (the
//!   header timer would close those too, later, when it is the longer of the two). Each
//!   connection gets up to a quarter more, spread by its accepting order, so that a burst of
//!   connections (ten thousand an attacker opened at once) is not closed, and re-opened, in
//!   one burst again and again.
//!
//! With a TLS configuration (`tls.cert`, `tls.key`) every connection is HTTPS (`tls.rs`); its
//! handshake must finish within `http.header_read_timeout`, and until it has, the connection
//! may be evicted at the cap like a silent one. A connection to the HTTPS port that does not
//! start with a TLS handshake (plain HTTP) is answered `400 malformed_http` in plain text,
//! saying to use https; one to the plain port that does start with one is answered the same
//! way, saying the port speaks plain HTTP (`answer.rs`).
//!
//! A request hyper cannot parse gets the standard error JSON, not hyper's empty answer
//! (`parse_error.rs`).
//!
//! Shutdown: when `shutdown` is cancelled the listener stops accepting and every connection
//! finishes the request it is serving (hyper's graceful shutdown), then closes.

mod answer;
mod clients;
pub mod open_files;
mod parse_error;
pub mod tls;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Failed accepts are logged at most once per period (see `log_every`).
static ACCEPT_ERRORS: crate::log_every::LogEvery =
    crate::log_every::LogEvery::new(Duration::from_secs(10));

/// After an accept error (say, no file descriptors left), wait this long before accepting
/// again, so the loop neither spins nor floods the log.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A connection is closed after its idle timeout plus up to this fraction of it, spread by
/// connection: connections opened together (a burst of clients, or an attacker's) then do
/// not all close, and get re-opened, in the same instant.
const IDLE_SPREAD_DIVISOR: u32 = 4;

/// The connection limits, from `ServerConfig`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections_max: usize,
    pub connections_per_client_max: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Connections accepted at the cap and waiting for a place, at most.
    pub waiting_max: usize,
}

/// Connections open now, for metrics and tests.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub open: AtomicUsize,
    pub accepted: AtomicU64,
    pub closed_idle: AtomicU64,
    /// Connections refused because their client address held its cap.
    pub refused_per_client: AtomicU64,
    /// Connections closed at the cap to make room for a lighter client's.
    pub evicted: AtomicU64,
    /// Connections accepted at the cap, waiting for a place now.
    pub waiting: AtomicUsize,
    /// Connections open from each client address.
    clients: std::sync::OnceLock<Arc<clients::Clients>>,
    /// Shutdown began (the drain delay): each answer says `Connection: close`, so that a
    /// client's pool reconnects, to another node, while this one still serves, rather than
    /// finding its kept-alive connection cut when the drain ends.
    pub draining: std::sync::atomic::AtomicBool,
}

impl ConnectionStats {
    /// Connections open now from `ip` (0 before the listener starts).
    pub fn open_from(&self, ip: std::net::IpAddr) -> usize {
        self.clients.get().map_or(0, |c| c.open(ip))
    }

    /// Client addresses with a connection open now.
    pub fn client_addresses(&self) -> usize {
        self.clients.get().map_or(0, |c| c.addresses())
    }
}

/// Accepts and serves until `shutdown`, then waits for the connections to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    shutdown: CancellationToken,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let clients = stats
        .clients
        .get_or_init(|| clients::Clients::new(limits.connections_per_client_max))
        .clone();
    let serving = Serving {
        router,
        limits,
        stats: stats.clone(),
        shutdown: shutdown.clone(),
        epoch: Instant::now(),
        tls,
        connections: TaskTracker::new(),
    };
    let mut gate = Gate {
        slots: Arc::new(Semaphore::new(limits.connections_max)),
        clients,
        refusal: clients::refusal(limits.connections_per_client_max),
        over_client_cap_waits: limits.connections_per_client_max >= limits.connections_max,
        waiting: VecDeque::new(),
    };
    loop {
        stats.waiting.store(gate.waiting.len(), Ordering::Relaxed);
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            slot = gate.slots.clone().acquire_owned(), if !gate.waiting.is_empty() => {
                let Ok(slot) = slot else { break };
                gate.serve_next(slot, &serving);
                continue;
            }
            accepted = listener.accept(), if gate.waiting.len() < limits.waiting_max => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => gate.place(tcp, peer, &serving),
            Err(error) => {
                // Out of descriptors, accepting fails every pause for as long as it lasts.
                if let Some(held_back) = ACCEPT_ERRORS.check(std::time::Instant::now()) {
                    tracing::warn!(%error, held_back, "accept a connection; pausing before the next accept (`held_back`: failed accepts not logged since the last line)");
                }
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    stats.waiting.store(0, Ordering::Relaxed);
    drop(gate);
    serving.connections.close();
    serving.connections.wait().await;
}

/// Who is served, who waits for a place, and who is refused.
struct Gate {
    /// A permit per connection served (`http.connections_max`).
    slots: Arc<Semaphore>,
    clients: Arc<clients::Clients>,
    /// The answer to a connection over its client's cap.
    refusal: Vec<u8>,
    /// With one client allowed the whole cap (a proxy in front), that client's connections
    /// over it wait at the cap instead of being refused: its own connections ending is what
    /// frees the places.
    over_client_cap_waits: bool,
    /// Accepted connections waiting for a place, oldest first: at the cap the listener goes
    /// on accepting up to `waiting_max` of them, so that it sees who connects (a light client
    /// makes room, `clients.rs`) instead of leaving everyone in the kernel's backlog.
    waiting: VecDeque<Waiting>,
}

impl Gate {
    /// Serves, queues or refuses a connection just accepted.
    fn place(&mut self, tcp: TcpStream, peer: std::net::SocketAddr, serving: &Serving) {
        // Small answers go out at once rather than waiting on Nagle's algorithm.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "set TCP_NODELAY");
        }
        let stats = &serving.stats;
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let free = match self.waiting.is_empty() {
            true => self.slots.clone().try_acquire_owned().ok(),
            false => None,
        };
        match (self.clients.admit(peer.ip()), free) {
            (Some(place), Some(slot)) => serving.spawn(tcp, place, slot),
            // At the cap. A light client's connection takes the next freed place: the one
            // it made by evicting a heavy client's idle connection.
            (Some(place), None) if self.clients.make_room_for(peer.ip()) => {
                stats.evicted.fetch_add(1, Ordering::Relaxed);
                self.waiting
                    .push_front(Waiting::new(tcp, peer, Some(place)));
            }
            (Some(place), None) => self.waiting.push_back(Waiting::new(tcp, peer, Some(place))),
            (None, None) if self.over_client_cap_waits => {
                self.waiting.push_back(Waiting::new(tcp, peer, None));
            }
            (None, _) => self.refuse(tcp, stats),
        }
    }

    /// Serves the connection that has waited longest, in the place `slot` freed.
    fn serve_next(&mut self, slot: OwnedSemaphorePermit, serving: &Serving) {
        let Some(next) = self.waiting.pop_front() else {
            return;
        };
        match next.place.or_else(|| self.clients.admit(next.peer)) {
            Some(place) => serving.spawn(next.tcp, place, slot),
            None => self.refuse(next.tcp, &serving.stats),
        }
    }

    fn refuse(&self, tcp: TcpStream, stats: &ConnectionStats) {
        stats.refused_per_client.fetch_add(1, Ordering::Relaxed);
        refuse(tcp, &self.refusal);
    }
}

/// A connection accepted at the cap, waiting for a place.
struct Waiting {
    tcp: TcpStream,
    peer: std::net::IpAddr,
    /// Its place in its client's count; None while its client holds its whole cap (it is
    /// admitted, or refused, when a place frees).
    place: Option<clients::ClientPlace>,
}

impl Waiting {
    fn new(
        tcp: TcpStream,
        peer: std::net::SocketAddr,
        place: Option<clients::ClientPlace>,
    ) -> Self {
        Waiting {
            tcp,
            peer: peer.ip(),
            place,
        }
    }
}

/// What every served connection shares.
struct Serving {
    router: Router,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    shutdown: CancellationToken,
    epoch: Instant,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: TaskTracker,
}

impl Serving {
    /// Serves `tcp` on a task of its own, holding its client place and its slot until it ends.
    fn spawn(&self, tcp: TcpStream, place: clients::ClientPlace, slot: OwnedSemaphorePermit) {
        let activity = Arc::new(Activity::default());
        // Idle from the moment it connects (one that never sends a byte is closed too), and
        // evictable from then on: a TLS handshake in progress has sent no request either.
        activity.touch(self.epoch);
        place.serving(activity.clone());
        let connection = Connection {
            router: self.router.clone(),
            limits: self.limits,
            stats: self.stats.clone(),
            shutdown: self.shutdown.clone(),
            epoch: self.epoch,
            seq: self.stats.accepted.load(Ordering::Relaxed),
            _place: place,
            activity,
        };
        // Two kinds of task, so that a plain connection's is only as big as serving it needs
        // (a task's future is sized for its largest state, and a TLS handshake's is large).
        let Some(acceptor) = self.tls.clone() else {
            self.connections.spawn(async move {
                connection.serve(tcp).await;
                drop(slot);
            });
            return;
        };
        self.connections.spawn(async move {
            if let Some(stream) = connection.handshake(acceptor, tcp).await {
                connection.serve(stream).await;
            }
            drop(slot);
        });
    }
}

/// Answers a connection over its client's cap and closes it, in the accept loop: no task, no
/// read. The answer fits the empty send buffer of a new socket, so the write does not wait;
/// if it cannot be written at once the connection is closed without it.
fn refuse(tcp: TcpStream, answer: &[u8]) {
    match tcp.try_write(answer) {
        Ok(n) if n == answer.len() => {}
        Ok(_) => tracing::debug!("refuse a connection: the answer was cut short"),
        Err(error) => tracing::debug!(%error, "refuse a connection: write the answer"),
    }
}

struct Connection {
    router: Router,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    shutdown: CancellationToken,
    epoch: Instant,
    /// The connection's number in accepting order, which spreads its idle timeout.
    seq: u64,
    /// Its client address's count, given back when the connection ends.
    _place: clients::ClientPlace,
    /// What it is doing, as its place in `clients` sees it (for eviction).
    activity: Arc<Activity>,
}

/// How much longer than `idle` connection number `seq` may stay idle: from zero to
/// `idle / IDLE_SPREAD_DIVISOR`, evenly spread over consecutive numbers (a multiplicative
/// hash of the number), so a thousand connections accepted together close over that span.
fn idle_spread(idle: Duration, seq: u64) -> Duration {
    let fraction = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f64 / (1u64 << 24) as f64;
    idle.mul_f64(fraction) / IDLE_SPREAD_DIVISOR
}

impl Connection {
    /// The TLS handshake, within `http.header_read_timeout`; None if it failed, timed out,
    /// or the connection was evicted or the server stops meanwhile. A connection whose first
    /// byte is not a TLS handshake gets a plain-text answer saying to use https.
    async fn handshake(
        &self,
        acceptor: tokio_rustls::TlsAcceptor,
        tcp: TcpStream,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        let handshake = async {
            let mut first = [0u8; 1];
            match tcp.peek(&mut first).await {
                Ok(1) if first[0] != answer::TLS_HANDSHAKE => {
                    let refusal = answer::plain_http_on_tls_port();
                    answer::answer_and_close(tcp, &refusal).await;
                    return None;
                }
                // Closed before a byte, or failed: nothing to answer.
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            match acceptor.accept(tcp).await {
                Ok(stream) => Some(stream),
                Err(error) => {
                    tracing::debug!(%error, "TLS handshake failed");
                    None
                }
            }
        };
        tokio::select! {
            stream = handshake => stream,
            _ = self.shutdown.cancelled() => None,
            // A light client took its place: it had sent no request.
            _ = self.activity.evict.notified() => None,
            _ = tokio::time::sleep(self.limits.header_read_timeout) => {
                self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("TLS handshake not finished within the header read timeout");
                None
            }
        }
    }

    async fn serve<S: FirstBytes + AsyncRead + AsyncWrite + Unpin + Send + 'static>(self, tcp: S) {
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        let activity = self.activity.clone();
        let idle = self.limits.idle_timeout + idle_spread(self.limits.idle_timeout, self.seq);
        let deadline = Instant::now() + idle;
        // HTTP's state only once the client sends something, in a future of its own: this
        // one stays small (about 14 KiB less: hyper's connection and its buffers), so a
        // connection held open in silence costs its socket and a small task.
        let first_bytes = {
            let shutdown = self.shutdown.cancelled();
            let evicted = activity.evict.notified();
            tokio::select! {
                first = tcp.first_bytes() => Some(first),
                _ = shutdown => None,
                // It had not started a request: nothing is lost by closing it.
                _ = evicted => None,
                _ = tokio::time::sleep_until(deadline) => {
                    self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        };
        match first_bytes {
            // TLS to the plain port: hyper would answer that it is not HTTP; say why.
            Some(Some(answer::TLS_HANDSHAKE)) => {
                let refusal = answer::tls_on_plain_port();
                Box::pin(answer::answer_and_close(tcp, &refusal)).await;
            }
            Some(_) => Box::pin(self.serve_http(tcp, &activity, idle, deadline)).await,
            None => {}
        }
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Serves HTTP on `tcp` until the client or the server ends it, or it stays idle for
    /// `idle` (first checked at `deadline`).
    async fn serve_http<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        tcp: S,
        activity: &Arc<Activity>,
        idle: Duration,
        deadline: Instant,
    ) {
        let io = Watched {
            inner: tcp,
            activity: activity.clone(),
            epoch: self.epoch,
            rewrite: None,
        };
        let service = TowerToHyperService::new(InFlight {
            inner: self.router.clone(),
            activity: activity.clone(),
            stats: self.stats.clone(),
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout)
            .keep_alive(true)
            // A client that ends its sending side after a whole request (`nc -N`, socat,
            // some proxies) still gets the answer; by default hyper dropped the request.
            .half_close(true);
        // Not pinned in place (it is `Unpin`): after hyper's header timeout, its parts tell
        // whether a head had started, and give the socket back for the answer.
        let mut connection = builder.serve_connection(TokioIo::new(io), service);
        if let Err(error) = self.drive(&mut connection, activity, idle, deadline).await {
            // A request's headers that took longer than header_read_timeout (hyper's own
            // timer): closed for being too slow, as an idle one is.
            if error.is_timeout() {
                self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                self.answer_slow_head(connection).await;
            }
            tracing::debug!(%error, "HTTP connection ended with an error");
        }
    }

    /// Answers `408` to a connection whose head did not arrive within the header read
    /// timeout, if part of one had (hyper's buffer holds it); one that waited for its next
    /// request in silence is closed without an answer, which it did not ask for.
    async fn answer_slow_head<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        connection: Http1<S>,
    ) {
        let parts = connection.into_parts();
        if parts.read_buf.is_empty() {
            return;
        }
        let answer = answer::head_too_slow(self.limits.header_read_timeout);
        answer::answer_and_close(parts.io.into_inner().inner, &answer).await;
    }

    /// Drives hyper's connection until it ends (its result), or until the listener closes
    /// it (idle, or evicted before any request: `Ok`).
    async fn drive<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        connection: &mut Http1<S>,
        activity: &Arc<Activity>,
        idle: Duration,
        deadline: Instant,
    ) -> hyper::Result<()> {
        let mut connection = Pin::new(connection);
        // One timer per connection, set for the moment it would have been idle for its
        // timeout, and pushed back when bytes moved meanwhile. (A periodic check woke every
        // held connection several times per timeout; ten thousand held ones woke in bursts.)
        let check = tokio::time::sleep_until(deadline);
        let mut check = std::pin::pin!(check);
        let shutdown = self.shutdown.cancelled();
        let mut shutdown = std::pin::pin!(shutdown);
        let evicted = activity.evict.notified();
        let mut evicted = std::pin::pin!(evicted);
        let mut evict_passed = false;
        let mut draining = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => return result,
                _ = shutdown.as_mut(), if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                // A light client took this connection's place: it had no request in progress
                // when it was picked. One that never had a request (a half-sent first head)
                // loses nothing by closing now. On one that served requests, hyper closes at
                // once if it waits for its next head (even half-sent), or else after the
                // request in progress (one arrived since, or its response is going out).
                _ = evicted.as_mut(), if !evict_passed => {
                    evict_passed = true;
                    if !activity.served() {
                        return Ok(());
                    }
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                _ = check.as_mut() => {
                    let idle_for = activity.idle_for(self.epoch);
                    if idle_for >= idle {
                        self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    check.as_mut().reset(Instant::now() + (idle - idle_for));
                }
            }
        }
    }
}

/// hyper's HTTP/1 connection over a watched socket, serving the router.
type Http1<S> =
    hyper::server::conn::http1::Connection<TokioIo<Watched<S>>, TowerToHyperService<InFlight>>;

/// A connection's first bytes: on plain TCP, waits until the client has sent something (or
/// closed); a TLS stream has already had its handshake, so it is ready at once.
trait FirstBytes {
    /// The first byte, if known (None: the stream ended or failed, or a TLS stream).
    fn first_bytes(&self) -> impl std::future::Future<Output = Option<u8>> + Send;
}

impl FirstBytes for TcpStream {
    async fn first_bytes(&self) -> Option<u8> {
        // `readable()` alone reports a new socket ready at once; a peek waits for a byte
        // (or the end of the stream). An error (the socket failed) is hyper's to find and
        // report when it reads.
        let mut first = [0u8; 1];
        match self.peek(&mut first).await {
            Ok(1) => Some(first[0]),
            _ => None,
        }
    }
}

impl FirstBytes for tokio_rustls::server::TlsStream<TcpStream> {
    async fn first_bytes(&self) -> Option<u8> {
        None
    }
}

/// What a connection is doing: requests in progress, and when bytes last moved.
#[derive(Default)]
struct Activity {
    /// Requests in progress: from a whole head's arrival until its response is ready.
    requests: AtomicUsize,
    /// A whole request head has arrived at least once (it stays set: it says whether
    /// closing the connection could cut a response going out, not what it does now).
    served: AtomicBool,
    /// Asks the connection to close, to make room at the cap.
    evict: tokio::sync::Notify,
    /// Milliseconds since the listener's epoch.
    last_io_ms: AtomicU64,
}

impl Activity {
    /// Whether a request is in progress: one that is not may be evicted (it is silent,
    /// half-sent, or between two requests, waiting for or receiving the next head).
    fn in_request(&self) -> bool {
        self.requests.load(Ordering::Relaxed) > 0
    }

    fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    fn evict(&self) {
        self.evict.notify_one();
    }

    fn touch(&self, epoch: Instant) {
        let now = epoch.elapsed().as_millis() as u64;
        self.last_io_ms.store(now, Ordering::Relaxed);
    }

    /// How long the connection has been idle: zero while a request is in progress (a
    /// long-poll may rightly move no bytes for its whole wait).
    fn idle_for(&self, epoch: Instant) -> Duration {
        if self.requests.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let now = epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_io_ms.load(Ordering::Relaxed)))
    }
}

/// A socket that notes when bytes move, and puts the standard error body into hyper's
/// automatic answer to an unparsable request.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    epoch: Instant,
    rewrite: Option<parse_error::Rewrite>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Watched<S> {
    /// Writes the rest of a replaced answer; ready with the count of hyper's bytes it stands
    /// for once all of it is out.
    fn poll_rewrite(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some(rewrite) = self.rewrite.as_mut() {
            if rewrite.written == rewrite.bytes.len() {
                let stands_for = rewrite.stands_for;
                self.rewrite = None;
                return Poll::Ready(Ok(stands_for));
            }
            match Pin::new(&mut self.inner).poll_write(cx, &rewrite.bytes[rewrite.written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                Poll::Ready(Ok(n)) => {
                    rewrite.written += n;
                    self.activity.touch(self.epoch);
                }
                other => return other,
            }
        }
        Poll::Ready(Ok(0))
    }

    /// Starts replacing `data` if it is hyper's automatic answer to an unparsable request.
    fn intercept(&mut self, data: &[u8]) -> bool {
        if self.rewrite.is_none() {
            if let Some(bytes) = parse_error::replacement(data) {
                self.rewrite = Some(parse_error::Rewrite {
                    bytes,
                    written: 0,
                    stands_for: data.len(),
                });
            }
        }
        self.rewrite.is_some()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch(self.epoch);
        }
        polled
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.intercept(data) {
            return self.poll_rewrite(cx);
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(self.epoch);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper's automatic answer is a head alone: the first non-empty slice.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if self.intercept(first) {
                return self.poll_rewrite(cx);
            }
        }
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(self.epoch);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Counts the requests in progress on a connection, from the request's arrival until its
/// response is ready (streaming bodies are not used by the API).
#[derive(Clone)]
struct InFlight {
    inner: Router,
    activity: Arc<Activity>,
    stats: Arc<ConnectionStats>,
}

impl tower::Service<axum::extract::Request<hyper::body::Incoming>> for InFlight {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = CountedFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::extract::Request<hyper::body::Incoming>) -> Self::Future {
        self.activity.requests.fetch_add(1, Ordering::Relaxed);
        self.activity.served.store(true, Ordering::Relaxed);
        let guard = RequestGuard(self.activity.clone());
        let inner = tower::Service::call(&mut self.inner, request.map(axum::body::Body::new));
        CountedFuture {
            inner,
            _guard: guard,
            close: self.stats.draining.load(Ordering::Relaxed),
        }
    }
}

/// The router's response future, holding the request's place in the count until it is
/// done or dropped. Named rather than boxed (one allocation less per request); the router's
/// futures are `Unpin`, so no pin projection is needed.
struct CountedFuture {
    inner: axum::routing::future::RouteFuture<Infallible>,
    _guard: RequestGuard,
    /// The answer closes the connection (the server is draining).
    close: bool,
}

impl std::future::Future for CountedFuture {
    type Output = Result<axum::response::Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let close = self.close;
        Pin::new(&mut self.inner).poll(cx).map_ok(|mut response| {
            if close {
                let headers = response.headers_mut();
                headers.insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            response
        })
    }
}

/// Ends a request's count even if its future is dropped (the client went away).
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_spread_stays_within_its_share_and_covers_it_evenly() {
        let idle = Duration::from_secs(8);
        let most = idle / IDLE_SPREAD_DIVISOR;
        let mut buckets = [0u32; 8];
        for seq in 0..8_000 {
            let spread = idle_spread(idle, seq);
            assert!(spread < most, "{spread:?} for {seq}");
            buckets[(spread.as_nanos() * 8 / most.as_nanos()) as usize] += 1;
        }
        // Consecutive connections (a burst) land all over the span, not in a clump.
        for (i, n) in buckets.iter().enumerate() {
            assert!((800..=1_200).contains(n), "bucket {i}: {n} of 8,000");
        }
        assert_eq!(idle_spread(Duration::ZERO, 7), Duration::ZERO);
    }
}
