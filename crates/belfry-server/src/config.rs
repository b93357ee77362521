//! The server's validated configuration. The binary turns its TOML file, environment and flags
//! into this; the server never reads files or the environment itself.

use std::net::SocketAddr;

use belfry_core::limits::{HORIZON_MS_DEFAULT, PAYLOAD_BYTES_MAX_DEFAULT};

/// Largest request body by default (16 MiB): a batch of 1,000 tasks of 16 KiB each, or one task
/// with a 1 MiB payload in base64 with room to spare.
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// How long shutdown waits for in-flight deliveries by default (30 s): longer than the default
/// webhook timeout, shorter than common orchestrators' kill timeouts.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 25_000;

/// How often the per-queue gauges (pending, due, in flight, dead) are refreshed by default.
pub const METRICS_REFRESH_MS_DEFAULT: u64 = 5_000;

/// Concurrent webhook deliveries per queue when the queue sets no `max_in_flight`: a slow
/// receiver ties up at most this many connections.
pub const WEBHOOK_IN_FLIGHT_DEFAULT: u32 = 256;

/// Tasks in push deliveries at once, all queues together, by default: bounds the memory and
/// the work in flight however many queues are due together.
pub const DISPATCH_IN_FLIGHT_MAX_DEFAULT: usize = 4_096;

/// Delivery calls in flight to one target (a webhook host, a broker connection) by default,
/// all queues on it together. The webhook HTTP client keeps as many idle connections per
/// host, so each call finds a pooled connection instead of opening one.
pub const DISPATCH_PER_TARGET_MAX_DEFAULT: usize = 64;

/// How long a request's headers may take to arrive, by default, counted from when the
/// connection starts waiting for a request (it connected, or its previous response went
/// out). A client on a slow mobile link sends a few hundred bytes of headers in well under a
/// second.
pub const HTTP_HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// How long a request body may send nothing before the request fails, by default.
pub const HTTP_BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// How long a connection with no request in progress may move no bytes before it is closed,
/// by default: keep-alive connections between bursts, and connections that never send. Short
/// (as Node's 5 s keep-alive default), since reconnecting costs a client little on a LAN.
pub const HTTP_IDLE_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// Connections served at once by default; past it the listener stops accepting until one
/// closes. Below a typical descriptor limit with room for data files and outgoing sinks.
pub const HTTP_CONNECTIONS_MAX_DEFAULT: usize = 10_000;

/// When `http.connections_per_client_max` is not set, one client address may hold this
/// fraction of `http.connections_max` (a quarter: 2,500 of the default 10,000). Far more than
/// any one application's connection pool needs, yet one address that opens connections and
/// holds them (a bug or an attack) leaves three quarters of the cap to everyone else, instead
/// of filling it and leaving newcomers to wait in the kernel's backlog.
pub const HTTP_CONNECTIONS_PER_CLIENT_SHARE: usize = 4;

/// The listen backlog asked of the kernel by default: connections whose handshake completed
/// and that the server has not accepted yet. When it is full, the kernel drops new handshakes
/// and their clients retry a second or more later. Large enough for bursts of thousands of
/// re-opened connections; the kernel caps it at `net.core.somaxconn` (4,096 on Linux since
/// 5.4).
pub const HTTP_LISTEN_BACKLOG_DEFAULT: u32 = 1_024;

/// Largest listen backlog accepted in the configuration: the kernel's own cap
/// (`net.core.somaxconn`) is far below it on common systems.
pub const HTTP_LISTEN_BACKLOG_MAX: u32 = 65_535;

const _: () = assert!(HTTP_CONNECTIONS_MAX_DEFAULT / HTTP_CONNECTIONS_PER_CLIENT_SHARE >= 1);
const _: () = assert!(HTTP_LISTEN_BACKLOG_DEFAULT <= HTTP_LISTEN_BACKLOG_MAX);

/// Store calls running or queued on the blocking pool at once, by default. Tokio's blocking
/// queue is unbounded; this bound turns a flood of requests into `503 overloaded` instead of
/// unbounded memory and latency. Twice the blocking pool's default thread count.
pub const STORE_CALLS_IN_FLIGHT_MAX_DEFAULT: usize = 1_024;

/// How long a request waits for a store-call slot, by default, before it is refused.
pub const STORE_ADMISSION_WAIT_MS_DEFAULT: u64 = 2_000;

/// How long a request waits for its store call's answer, by default, before `503
/// store_unavailable`: far beyond a healthy call (milliseconds), short of a client's patience.
pub const STORE_CALL_TIMEOUT_MS_DEFAULT: u64 = 5_000;

const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT < REQUEST_BYTES_MAX_DEFAULT);

/// Largest bulk subscribers body by default: 1 GiB, about 100 million numeric ids as NDJSON.
pub const SUBSCRIBERS_BODY_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;

/// Largest task import body by default: 1 GiB, about five million tasks of 200 bytes as NDJSON.
pub const IMPORT_BODY_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the HTTP API listens. Port 0 picks a free port (tests).
    pub listen: SocketAddr,
    /// Largest task payload, in bytes after base64 decoding.
    pub payload_bytes_max: usize,
    /// Largest HTTP request body.
    pub request_bytes_max: usize,
    /// Largest bulk subscribe or unsubscribe body (`limits.subscribers_body_max`): it is
    /// streamed, never held whole, so this bounds the time one request takes, not memory.
    pub subscribers_body_bytes_max: u64,
    /// Largest task import body (`limits.import_body_max`, `POST …/tasks:import`): streamed
    /// like the bulk subscribers body, so this too bounds a request's length, not memory.
    pub import_body_bytes_max: u64,
    /// How far in the future a task may be due.
    pub horizon_ms: u64,
    /// How long shutdown waits for in-flight deliveries before flushing and exiting anyway.
    pub shutdown_grace_ms: u64,
    /// How long the server keeps serving after shutdown begins, with `/readyz` already
    /// answering `503 shutting_down`, so load balancers stop sending first. 0 by default.
    pub shutdown_drain_delay_ms: u64,
    /// Whether webhook URLs may point at loopback and private addresses (SSRF guard off).
    pub allow_private_targets: bool,
    /// A PEM file of CA certificates webhooks trust besides the built-in Mozilla roots and the
    /// system's roots (`webhooks.ca_file`): receivers with a private CA.
    pub webhook_ca_file: Option<std::path::PathBuf>,
    /// How often per-queue gauges are refreshed.
    pub metrics_refresh_ms: u64,
    /// Concurrent webhook deliveries per queue when the queue sets no `max_in_flight`.
    pub webhook_in_flight_default: u32,
    /// Store calls in flight at once (admission control).
    pub store_calls_in_flight_max: usize,
    /// How long a request waits for a store-call slot before `503 overloaded`.
    pub store_admission_wait_ms: u64,
    /// How long a request waits for its store call's answer before `503 store_unavailable`.
    pub store_call_timeout_ms: u64,
    /// Tasks in push deliveries at once, all queues together.
    pub dispatch_in_flight_max: usize,
    /// Delivery calls in flight to one target (webhook host or broker connection).
    pub dispatch_per_target_max: usize,
    /// How long a request's headers may take, from their first byte.
    pub http_header_read_timeout_ms: u64,
    /// How long a request body may send nothing; also its total waiting time, plus a second
    /// per KiB received (`api::body_timeout`).
    pub http_body_read_timeout_ms: u64,
    /// How long a connection with no request in progress may move no bytes (each connection
    /// up to a quarter more: `listener::idle_spread`).
    pub http_idle_timeout_ms: u64,
    /// Connections served at once.
    pub http_connections_max: usize,
    /// Connections served at once from one client address; `None`: a quarter of
    /// `http_connections_max` (see [`ServerConfig::http_connections_per_client_cap`]).
    pub http_connections_per_client_max: Option<usize>,
    /// The listen backlog asked of the kernel (which caps it at `net.core.somaxconn`).
    pub http_listen_backlog: u32,
    /// How long before its fire time a schedule firing's tasks are stored (`schedules.lead`,
    /// see [`crate::schedules::SCHEDULE_LEAD_MS_DEFAULT`]); 0 stores them at the fire time.
    pub schedule_lead_ms: u64,
    /// This process's name among the nodes sharing one store (`--node-id`): unique by
    /// default ([`default_node_id`]). Shard leases on a shared store are taken in its name.
    pub node_id: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            request_bytes_max: REQUEST_BYTES_MAX_DEFAULT,
            subscribers_body_bytes_max: SUBSCRIBERS_BODY_BYTES_MAX_DEFAULT,
            import_body_bytes_max: IMPORT_BODY_BYTES_MAX_DEFAULT,
            horizon_ms: HORIZON_MS_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            shutdown_drain_delay_ms: 0,
            allow_private_targets: false,
            webhook_ca_file: None,
            metrics_refresh_ms: METRICS_REFRESH_MS_DEFAULT,
            webhook_in_flight_default: WEBHOOK_IN_FLIGHT_DEFAULT,
            store_calls_in_flight_max: STORE_CALLS_IN_FLIGHT_MAX_DEFAULT,
            store_admission_wait_ms: STORE_ADMISSION_WAIT_MS_DEFAULT,
            store_call_timeout_ms: STORE_CALL_TIMEOUT_MS_DEFAULT,
            dispatch_in_flight_max: DISPATCH_IN_FLIGHT_MAX_DEFAULT,
            dispatch_per_target_max: DISPATCH_PER_TARGET_MAX_DEFAULT,
            http_header_read_timeout_ms: HTTP_HEADER_READ_TIMEOUT_MS_DEFAULT,
            http_body_read_timeout_ms: HTTP_BODY_READ_TIMEOUT_MS_DEFAULT,
            http_idle_timeout_ms: HTTP_IDLE_TIMEOUT_MS_DEFAULT,
            http_connections_max: HTTP_CONNECTIONS_MAX_DEFAULT,
            http_connections_per_client_max: None,
            http_listen_backlog: HTTP_LISTEN_BACKLOG_DEFAULT,
            schedule_lead_ms: crate::schedules::SCHEDULE_LEAD_MS_DEFAULT,
            node_id: default_node_id(),
        }
    }
}

/// Longest `schedules.lead`: a minute, the misfire threshold.
pub const SCHEDULE_LEAD_MS_MAX: u64 = 60_000;

/// Longest node id: it is stored with every shard lease, and logged.
pub const NODE_ID_BYTES_MAX: usize = 128;

/// A node id no other live process has: the host name, the process id and 4 random bytes
/// (so a restarted process with a recycled pid, or a container whose pid is always 1, still
/// differs from its predecessor, whose leases may not have expired yet).
pub fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| sanitize_host(h.trim()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "belfry".to_owned());
    let salt: u32 = rand::random();
    format!("{host}-{}-{salt:08x}", std::process::id())
}

/// The host name with anything a node id may not hold replaced by `_`, cut to leave room for
/// the pid and salt.
fn sanitize_host(host: &str) -> String {
    host.chars()
        .take(NODE_ID_BYTES_MAX - 32)
        .map(|c| if node_id_char(c) { c } else { '_' })
        .collect()
}

fn node_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

/// Why `id` cannot name a node, if it cannot: 1 to [`NODE_ID_BYTES_MAX`] of
/// `A-Z a-z 0-9 - _ . :`.
pub fn check_node_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > NODE_ID_BYTES_MAX {
        return Err(format!(
            "must be 1 to {NODE_ID_BYTES_MAX} characters, got {}",
            id.len()
        ));
    }
    match id.chars().find(|&c| !node_id_char(c)) {
        Some(bad) => Err(format!(
            "{bad:?} is not allowed; use letters, digits, '-', '_', '.' and ':'"
        )),
        None => Ok(()),
    }
}

/// A setting that does not fit; `key` is the setting's name in the configuration file
/// (`section.key`), which is what an operator can change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {key}: {problem}")]
pub struct InvalidConfig {
    pub key: &'static str,
    pub problem: String,
}

impl ServerConfig {
    /// Connections one client address may hold at once: the configured value, or by default
    /// a quarter of `http_connections_max` (at least 1).
    pub fn http_connections_per_client_cap(&self) -> usize {
        self.http_connections_per_client_max.unwrap_or_else(|| {
            (self.http_connections_max / HTTP_CONNECTIONS_PER_CLIENT_SHARE).max(1)
        })
    }

    /// Checks relations between settings; each message names the key to fix.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.validate_limits()?;
        self.validate_dispatch()?;
        self.validate_http()?;
        if self.metrics_refresh_ms == 0 {
            return fail("metrics.refresh", "must be longer than 0".into());
        }
        if self.schedule_lead_ms > SCHEDULE_LEAD_MS_MAX {
            return fail(
                "schedules.lead",
                format!(
                    "must be at most {SCHEDULE_LEAD_MS_MAX} ms (a schedule change that close to a \
                     firing would not stop it), got {} ms",
                    self.schedule_lead_ms
                ),
            );
        }
        if let Err(problem) = check_node_id(&self.node_id) {
            return fail("node_id", problem);
        }
        Ok(())
    }

    /// `[limits]`: sizes, the horizon and the store-call admission.
    fn validate_limits(&self) -> Result<(), InvalidConfig> {
        if self.payload_bytes_max == 0 {
            return fail("limits.payload_max", "must be at least 1 byte".into());
        }
        if self.request_bytes_max < self.payload_bytes_max {
            return fail(
                "limits.request_max",
                format!(
                    "must be at least limits.payload_max ({} bytes), got {}",
                    self.payload_bytes_max, self.request_bytes_max
                ),
            );
        }
        if self.horizon_ms == 0 {
            return fail("limits.horizon", "must be longer than 0".into());
        }
        if self.store_calls_in_flight_max == 0 {
            return fail("limits.store_calls_in_flight", "must be at least 1".into());
        }
        Ok(())
    }

    /// `[dispatch]` and `[webhooks]`: the push budgets.
    fn validate_dispatch(&self) -> Result<(), InvalidConfig> {
        for (key, n) in [
            ("dispatch.in_flight_max", self.dispatch_in_flight_max),
            ("dispatch.per_target_max", self.dispatch_per_target_max),
        ] {
            if n == 0 || n > u32::MAX as usize {
                return fail(key, format!("must be between 1 and {}", u32::MAX));
            }
        }
        if self.webhook_in_flight_default == 0 {
            return fail("webhooks.in_flight_default", "must be at least 1".into());
        }
        Ok(())
    }

    /// `[http]`: timeouts, the connection caps and the listen backlog.
    fn validate_http(&self) -> Result<(), InvalidConfig> {
        for (key, ms) in [
            ("http.header_read_timeout", self.http_header_read_timeout_ms),
            ("http.body_read_timeout", self.http_body_read_timeout_ms),
            ("http.idle_timeout", self.http_idle_timeout_ms),
        ] {
            if ms == 0 {
                return fail(key, "must be longer than 0".into());
            }
        }
        if self.http_connections_max == 0 {
            return fail("http.connections_max", "must be at least 1".into());
        }
        if let Some(per_client) = self.http_connections_per_client_max {
            if per_client == 0 || per_client > self.http_connections_max {
                return fail(
                    "http.connections_per_client_max",
                    format!(
                        "must be between 1 and http.connections_max ({}), got {per_client}",
                        self.http_connections_max
                    ),
                );
            }
        }
        if self.http_listen_backlog == 0 || self.http_listen_backlog > HTTP_LISTEN_BACKLOG_MAX {
            return fail(
                "http.listen_backlog",
                format!(
                    "must be between 1 and {HTTP_LISTEN_BACKLOG_MAX}, got {}",
                    self.http_listen_backlog
                ),
            );
        }
        Ok(())
    }
}

/// An invalid setting: `key` is the configuration key to fix.
fn fail(key: &'static str, problem: String) -> Result<(), InvalidConfig> {
    Err(InvalidConfig { key, problem })
}
