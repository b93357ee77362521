//! From the configuration file's sections (after the environment's overrides) to the
//! server's validated settings: defaults filled in, every value checked, and each error
//! naming its key. One function per section, so a new key lands beside its neighbours.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use belfry_server::ServerConfig;
use belfry_store::FsyncPolicy;

use crate::config::{
    DispatchSection, FileConfig, HttpSection, LimitsSection, LogFormat, LogSection, MetricsSection,
    SchedulesSection, Settings, ShutdownSection, StorageSection, StoreKind, TlsSection,
    WebhooksSection,
};
use crate::units::{HumanDuration, HumanSize};

impl FileConfig {
    /// Resolves defaults and validates. `listen`, `data_dir` and `store` come from flags or
    /// the environment when given, and win over the file.
    pub fn resolve(
        self,
        listen: Option<String>,
        data_dir: Option<PathBuf>,
        store: Option<String>,
    ) -> anyhow::Result<Settings> {
        let store = StoreKind::parse(store.or(self.store.clone()).as_deref().unwrap_or("engine"))?;
        let warnings = self.settings_the_store_ignores(&store);
        let connections = self.resolve_connections()?;
        let mut server = ServerConfig {
            listen: listen_address(listen.or(self.listen))?,
            ..ServerConfig::default()
        };
        self.limits.apply(&mut server)?;
        self.webhooks.apply(&mut server)?;
        self.http.apply(&mut server)?;
        self.dispatch.apply(&mut server);
        self.schedules.apply(&mut server)?;
        self.shutdown.apply(&mut server)?;
        self.metrics.apply(&mut server)?;
        if let Some(id) = self.node_id {
            server.node_id = id;
        }
        server.validate()?;
        Ok(Settings {
            warnings,
            auth: std::sync::Arc::new(self.auth.resolve()?),
            allow_unauthenticated: self.auth.allow_unauthenticated.unwrap_or(false),
            tls: self.tls.pair()?,
            server,
            data_dir: data_dir
                .or(self.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            store,
            redis: self.redis.resolve()?,
            fsync: self.storage.fsync_policy()?,
            checkpoint_wal_bytes: self.storage.checkpoint_wal_bytes()?,
            free_space_reserve_bytes: self.storage.free_space_reserve_bytes()?,
            log_level: self.log.level()?,
            log_format: self.log.format()?,
            connections,
        })
    }
}

impl FileConfig {
    /// Settings given for another kind of store than the one chosen: they would do nothing,
    /// and one believing `fsync = "always"` protects a Redis store would be wrong.
    fn settings_the_store_ignores(&self, store: &StoreKind) -> Vec<String> {
        let storage = [
            ("storage.fsync", self.storage.fsync.is_some()),
            (
                "storage.fsync_interval",
                self.storage.fsync_interval.is_some(),
            ),
            (
                "storage.checkpoint_wal_bytes",
                self.storage.checkpoint_wal_bytes.is_some(),
            ),
            (
                "storage.free_space_reserve",
                self.storage.free_space_reserve.is_some(),
            ),
        ];
        let r = &self.redis;
        let redis = [
            ("redis.namespace", r.namespace.is_some()),
            ("redis.partitions", r.partitions.is_some()),
            ("redis.subscriber_shards", r.subscriber_shards.is_some()),
            ("redis.command_timeout", r.command_timeout.is_some()),
            ("redis.connect_timeout", r.connect_timeout.is_some()),
            ("redis.replica_acks", r.replica_acks.is_some()),
            ("redis.far_after", r.far_after.is_some()),
        ];
        let (ignored, kind): (&[(&str, bool)], &str) = match store {
            StoreKind::Engine => (&redis, "the embedded store"),
            StoreKind::Memory => (&storage, "the memory store"),
            StoreKind::Redis(_) => (&storage, "a Redis store"),
        };
        let mut warnings: Vec<String> = ignored
            .iter()
            .filter(|(_, given)| *given)
            .map(|(key, _)| format!("{key} is set but does nothing on {kind}"))
            .collect();
        if matches!(store, StoreKind::Memory) {
            warnings.extend(
                redis
                    .iter()
                    .filter(|(_, given)| *given)
                    .map(|(key, _)| format!("{key} is set but does nothing on the memory store")),
            );
        }
        warnings
    }
}

fn listen_address(listen: Option<String>) -> anyhow::Result<SocketAddr> {
    let listen = listen.unwrap_or_else(|| "127.0.0.1:7070".into());
    listen
        .parse::<SocketAddr>()
        .map_err(|_| anyhow!("listen: expected an address such as 127.0.0.1:7070, got {listen:?}"))
}

/// A size key in bytes that must fit in memory (`usize`).
fn bytes_of(key: &str, size: &HumanSize) -> anyhow::Result<usize> {
    let bytes = size.to_bytes().map_err(|e| anyhow!("{key}: {e}"))?;
    usize::try_from(bytes).map_err(|_| anyhow!("{key}: too large"))
}

/// A duration key in milliseconds.
fn ms_of(key: &str, d: &HumanDuration) -> anyhow::Result<u64> {
    d.to_ms().map_err(|e| anyhow!("{key}: {e}"))
}

/// A duration key given, in milliseconds; `None` when the key is absent.
fn ms_if(key: &str, d: &Option<HumanDuration>) -> anyhow::Result<Option<u64>> {
    d.as_ref().map(|d| ms_of(key, d)).transpose()
}

impl LimitsSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        if let Some(size) = &self.payload_max {
            server.payload_bytes_max = bytes_of("limits.payload_max", size)?;
        }
        if let Some(size) = &self.request_max {
            server.request_bytes_max = bytes_of("limits.request_max", size)?;
        }
        if let Some(size) = &self.subscribers_body_max {
            server.subscribers_body_bytes_max = size
                .to_bytes()
                .map_err(|e| anyhow!("limits.subscribers_body_max: {e}"))?;
        }
        if let Some(size) = &self.import_body_max {
            server.import_body_bytes_max = size
                .to_bytes()
                .map_err(|e| anyhow!("limits.import_body_max: {e}"))?;
        }
        if let Some(ms) = ms_if("limits.horizon", &self.horizon)? {
            server.horizon_ms = ms;
        }
        if let Some(n) = self.store_calls_in_flight {
            server.store_calls_in_flight_max = n;
        }
        if let Some(ms) = ms_if("limits.store_admission_wait", &self.store_admission_wait)? {
            server.store_admission_wait_ms = ms;
        }
        if let Some(ms) = ms_if("limits.store_call_timeout", &self.store_call_timeout)? {
            if ms == 0 {
                bail!(
                    "limits.store_call_timeout: must be more than 0 (a request waits this long \
                     for the store's answer before 503 store_unavailable)"
                );
            }
            server.store_call_timeout_ms = ms;
        }
        Ok(())
    }
}

impl WebhooksSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        if let Some(allow) = self.allow_private_targets {
            server.allow_private_targets = allow;
        }
        if let Some(n) = self.in_flight_default {
            server.webhook_in_flight_default = n;
        }
        if let Some(path) = &self.ca_file {
            // Read here so a missing or malformed file stops the start naming the key; the
            // server reads it again when it builds the webhook client.
            belfry_sinks::trust::read_ca_file(path)
                .map_err(|reason| anyhow!("webhooks.ca_file: {reason}"))?;
            server.webhook_ca_file = Some(path.clone());
        }
        Ok(())
    }
}

impl HttpSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        if let Some(ms) = ms_if("http.header_read_timeout", &self.header_read_timeout)? {
            server.http_header_read_timeout_ms = ms;
        }
        if let Some(ms) = ms_if("http.body_read_timeout", &self.body_read_timeout)? {
            server.http_body_read_timeout_ms = ms;
        }
        if let Some(ms) = ms_if("http.idle_timeout", &self.idle_timeout)? {
            server.http_idle_timeout_ms = ms;
        }
        if let Some(n) = self.connections_max {
            server.http_connections_max = n;
        }
        if let Some(n) = self.connections_per_client_max {
            server.http_connections_per_client_max = Some(n);
        }
        if let Some(n) = self.listen_backlog {
            server.http_listen_backlog = n;
        }
        Ok(())
    }
}

impl DispatchSection {
    fn apply(&self, server: &mut ServerConfig) {
        if let Some(n) = self.in_flight_max {
            server.dispatch_in_flight_max = n;
        }
        if let Some(n) = self.per_target_max {
            server.dispatch_per_target_max = n;
        }
    }
}

impl SchedulesSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        if let Some(ms) = ms_if("schedules.lead", &self.lead)? {
            server.schedule_lead_ms = ms;
        }
        Ok(())
    }
}

/// Longest `shutdown.grace` and `shutdown.drain_delay`: a stop that waits longer is a typo'd
/// unit ("1y"), and would hold a rollout until someone kills the process.
const SHUTDOWN_WAIT_MS_MAX: u64 = 10 * 60 * 1000;

impl ShutdownSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        let bounded = |key: &str, ms: u64| {
            if ms > SHUTDOWN_WAIT_MS_MAX {
                bail!("{key}: at most 10m (a stop that waits longer holds a rollout), got {ms} ms");
            }
            Ok(ms)
        };
        if let Some(ms) = ms_if("shutdown.grace", &self.grace)? {
            server.shutdown_grace_ms = bounded("shutdown.grace", ms)?;
        }
        if let Some(ms) = ms_if("shutdown.drain_delay", &self.drain_delay)? {
            server.shutdown_drain_delay_ms = bounded("shutdown.drain_delay", ms)?;
        }
        Ok(())
    }
}

impl MetricsSection {
    fn apply(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        if let Some(ms) = ms_if("metrics.refresh", &self.refresh)? {
            server.metrics_refresh_ms = ms;
        }
        Ok(())
    }
}

/// Smallest `storage.checkpoint_wal_bytes`: below it the engine would checkpoint (fsync every
/// bucket file, rewrite the checkpoint) after every few calls.
const CHECKPOINT_WAL_BYTES_MIN: u64 = 64 * 1024;

impl StorageSection {
    fn checkpoint_wal_bytes(&self) -> anyhow::Result<u64> {
        let Some(size) = &self.checkpoint_wal_bytes else {
            return Ok(belfry_store::CHECKPOINT_WAL_BYTES_DEFAULT);
        };
        let key = "storage.checkpoint_wal_bytes";
        let bytes = size.to_bytes().map_err(|e| anyhow!("{key}: {e}"))?;
        if bytes < CHECKPOINT_WAL_BYTES_MIN {
            bail!("{key}: must be at least 64 KiB (such as \"4 MiB\"), got {bytes} bytes");
        }
        Ok(bytes)
    }

    /// `0` turns the reserve off. A reserve below twice the checkpoint threshold is allowed:
    /// the engine then checkpoints every half reserve instead (`Core::checkpoint_wal_threshold`).
    fn free_space_reserve_bytes(&self) -> anyhow::Result<u64> {
        match &self.free_space_reserve {
            None => Ok(belfry_store::FREE_SPACE_RESERVE_BYTES_DEFAULT),
            Some(size) => size
                .to_bytes()
                .map_err(|e| anyhow!("storage.free_space_reserve: {e}")),
        }
    }

    fn fsync_policy(&self) -> anyhow::Result<FsyncPolicy> {
        let mode = self.fsync.as_deref().unwrap_or("always");
        let interval = ms_if("storage.fsync_interval", &self.fsync_interval)?;
        if interval.is_some() && mode != "interval" {
            bail!(
                "storage.fsync_interval: applies only with storage.fsync = \"interval\" (it is \
                 {mode:?}); remove it or set both"
            );
        }
        Ok(match mode {
            "always" => FsyncPolicy::Always,
            "never" => FsyncPolicy::Never,
            "interval" => {
                let ms = interval.ok_or_else(|| {
                    anyhow!("storage.fsync_interval: required when storage.fsync is \"interval\"")
                })?;
                // The flusher waits this long between fsyncs: 0 would spin a core.
                if ms == 0 {
                    bail!("storage.fsync_interval: must be longer than 0 (such as \"100ms\")");
                }
                FsyncPolicy::Interval(std::time::Duration::from_millis(ms))
            }
            other => bail!(
                "storage.fsync: expected \"always\", \"interval\" or \"never\", got {other:?}"
            ),
        })
    }
}

/// A log filter (`log.level`, or `RUST_LOG`, which wins when set), checked: every directive
/// is a level, or `target=level`. A bare word is a target to tracing, so a typo such as "inf"
/// would log nothing at all.
pub(crate) fn check_log_filter(name: &str, text: &str) -> anyhow::Result<()> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    for directive in text.trim().split(',') {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.trim().to_ascii_lowercase().as_str()) {
            let within = if directive.trim() == text.trim() {
                String::new()
            } else {
                format!(" in {text:?}")
            };
            bail!(
                "{name}: {directive:?}{within} is not a level; give one of trace, debug, \
                 info, warn, error, off, or target=level directives separated by commas \
                 (\"belfry_server=debug,info\")"
            );
        }
    }
    Ok(())
}

impl LogSection {
    /// The tracing filter, checked ([`check_log_filter`]).
    fn level(&self) -> anyhow::Result<String> {
        let text = self.level.as_deref().unwrap_or("info").trim();
        check_log_filter("log.level", text)?;
        Ok(text.to_owned())
    }

    fn format(&self) -> anyhow::Result<LogFormat> {
        match self.format.as_deref().unwrap_or("text") {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => bail!("log.format: expected \"text\" or \"json\", got {other:?}"),
        }
    }
}

impl TlsSection {
    /// The certificate chain and its key, both or neither.
    fn pair(&self) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some((cert.clone(), key.clone()))),
            (None, None) => Ok(None),
            (Some(_), None) => {
                bail!("tls.key: required with tls.cert (the certificate's private key, PEM)")
            }
            (None, Some(_)) => {
                bail!("tls.cert: required with tls.key (the certificate chain, PEM)")
            }
        }
    }
}
