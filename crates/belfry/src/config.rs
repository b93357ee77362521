//! The configuration file (TOML), its environment overrides and conversion to the server's
//! validated settings. Every key is documented in config/belfry.example.toml.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use belfry_server::ServerConfig;
use belfry_sinks::{ConnectionKind, ConnectionSpec, Connections, TlsOptions};
use belfry_store::FsyncPolicy;
use serde::Deserialize;

use crate::auth_config::{AuthSection, ADMIN_TOKEN_ENV};
pub use crate::store_config::StoreKind;
use crate::store_config::{RedisSection, REDIS_ENV_OVERRIDES};
use crate::units::{HumanDuration, HumanSize};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub store: Option<String>,
    /// This node's name among those sharing a store (`--node-id`); unique by default.
    pub node_id: Option<String>,
    /// `[redis]`: the `redis://` and `redis-cluster://` stores.
    #[serde(default)]
    pub redis: RedisSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub webhooks: WebhooksSection,
    #[serde(default)]
    pub http: HttpSection,
    #[serde(default)]
    pub dispatch: DispatchSection,
    /// `[schedules]`: the schedule runner.
    #[serde(default)]
    pub schedules: SchedulesSection,
    #[serde(default)]
    pub storage: StorageSection,
    #[serde(default)]
    pub shutdown: ShutdownSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub log: LogSection,
    /// `[connections.NAME]`: brokers that queues' stream deliveries name.
    #[serde(default)]
    pub connections: BTreeMap<String, ConnectionSection>,
    /// `[auth]`: bearer tokens.
    #[serde(default)]
    pub auth: AuthSection,
    /// `[tls]`: serve HTTPS.
    #[serde(default)]
    pub tls: TlsSection,
}

/// `[tls]`: a PEM certificate chain and its private key; both or neither.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// One `[connections.NAME]` table. Secrets in it are never logged: `Debug` redacts them.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionSection {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub url: Option<String>,
    pub brokers: Option<Vec<String>>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// Kafka only: `PLAIN` (default), `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub sasl_mechanism: Option<String>,
    #[serde(default)]
    pub tls: ConnectionTlsSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionTlsSection {
    pub enabled: Option<bool>,
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ConnectionSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { Some("<redacted>") } else { None };
        f.debug_struct("ConnectionSection")
            .field("kind", &self.kind)
            .field("url", &redacted(self.url.is_some()))
            .field("brokers", &self.brokers)
            .field("username", &self.username)
            .field("password", &redacted(self.password.is_some()))
            .field("token", &redacted(self.token.is_some()))
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Prefix of the environment overrides of a connection's keys:
/// `BELFRY_CONNECTIONS__<NAME>__<KEY>` with KEY one of URL, BROKERS (comma-separated),
/// USERNAME, PASSWORD, TOKEN, SASL_MECHANISM. NAME is matched case-insensitively against the file's names (a
/// name the file lacks declares a new connection, lower-cased; it then needs a TYPE too).
pub const CONNECTION_ENV_PREFIX: &str = "BELFRY_CONNECTIONS__";

impl FileConfig {
    /// Applies `BELFRY_CONNECTIONS__NAME__KEY` overrides from `vars` (name, value pairs).
    pub fn apply_connection_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<()> {
        for (var, value) in vars {
            let Some(rest) = var.strip_prefix(CONNECTION_ENV_PREFIX) else {
                continue;
            };
            let Some((name, key)) = rest.split_once("__") else {
                bail!("{var}: expected {CONNECTION_ENV_PREFIX}<NAME>__<KEY>");
            };
            let existing = self
                .connections
                .keys()
                .find(|known| known.eq_ignore_ascii_case(name))
                .cloned();
            let name = existing.unwrap_or_else(|| name.to_ascii_lowercase());
            let entry = self.connections.entry(name).or_default();
            let value = value.trim().to_owned();
            match key {
                "TYPE" => entry.kind = Some(value),
                "URL" => entry.url = Some(value),
                "BROKERS" => {
                    entry.brokers = Some(value.split(',').map(|b| b.trim().to_owned()).collect())
                }
                "USERNAME" => entry.username = Some(value),
                "PASSWORD" => entry.password = Some(value),
                "TOKEN" => entry.token = Some(value),
                "SASL_MECHANISM" => entry.sasl_mechanism = Some(value),
                other => bail!(
                    "{var}: unknown connection key {other:?}; expected TYPE, URL, BROKERS, USERNAME, PASSWORD, TOKEN or SASL_MECHANISM"
                ),
            }
        }
        Ok(())
    }

    /// The validated `[connections.*]` entries.
    pub(crate) fn resolve_connections(&self) -> anyhow::Result<Connections> {
        let mut connections = Connections::empty();
        for (name, section) in &self.connections {
            let kind_text = section.kind.as_deref().ok_or_else(|| {
                anyhow!("connections.{name}.type: required (\"redis\", \"nats\" or \"kafka\")")
            })?;
            let kind = ConnectionKind::parse(kind_text).ok_or_else(|| {
                anyhow!(
                    "connections.{name}.type: expected \"redis\", \"nats\" or \"kafka\", got {kind_text:?}"
                )
            })?;
            let spec = ConnectionSpec {
                kind,
                url: section.url.clone(),
                brokers: section.brokers.clone().unwrap_or_default(),
                username: section.username.clone(),
                password: section.password.clone(),
                token: section.token.clone(),
                sasl_mechanism: section.sasl_mechanism.clone(),
                tls: TlsOptions {
                    enabled: section.tls.enabled.unwrap_or(false),
                    ca_file: section.tls.ca_file.clone(),
                },
            };
            connections
                .insert(name.clone(), spec)
                .map_err(|error| anyhow!("{error}"))?;
        }
        Ok(connections)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub payload_max: Option<HumanSize>,
    pub request_max: Option<HumanSize>,
    pub subscribers_body_max: Option<HumanSize>,
    pub import_body_max: Option<HumanSize>,
    pub horizon: Option<HumanDuration>,
    pub store_calls_in_flight: Option<usize>,
    pub store_admission_wait: Option<HumanDuration>,
    pub store_call_timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksSection {
    pub allow_private_targets: Option<bool>,
    pub in_flight_default: Option<u32>,
    /// A PEM file of CAs webhooks trust besides the built-in and the system's roots.
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    pub header_read_timeout: Option<HumanDuration>,
    pub body_read_timeout: Option<HumanDuration>,
    pub idle_timeout: Option<HumanDuration>,
    pub connections_max: Option<usize>,
    pub connections_per_client_max: Option<usize>,
    pub listen_backlog: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchSection {
    pub in_flight_max: Option<usize>,
    pub per_target_max: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulesSection {
    /// How long before its fire time a firing's tasks are stored.
    pub lead: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    pub fsync: Option<String>,
    pub fsync_interval: Option<HumanDuration>,
    pub checkpoint_wal_bytes: Option<HumanSize>,
    pub free_space_reserve: Option<HumanSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSection {
    pub grace: Option<HumanDuration>,
    pub drain_delay: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    pub refresh: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    pub level: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Everything `serve` needs, resolved and validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub server: ServerConfig,
    pub data_dir: PathBuf,
    pub store: StoreKind,
    /// `[redis]`, for the Redis kinds of `store`.
    pub redis: belfry_store_redis::RedisOptions,
    pub fsync: FsyncPolicy,
    /// `[storage] checkpoint_wal_bytes`: WAL bytes between the engine's checkpoints.
    pub checkpoint_wal_bytes: u64,
    /// `[storage] free_space_reserve`: free space the engine keeps on its disk.
    pub free_space_reserve_bytes: u64,
    pub log_level: String,
    pub log_format: LogFormat,
    /// The `[connections.*]` brokers that stream deliveries name; `serve` hands them to the
    /// server builder.
    pub connections: Connections,
    /// The bearer tokens (`[auth]`, `BELFRY_ADMIN_TOKEN`); none leaves the API open.
    pub auth: std::sync::Arc<belfry_server::auth::Auth>,
    /// `[auth] allow_unauthenticated`: serve an open API beyond loopback.
    pub allow_unauthenticated: bool,
    /// `[tls]` certificate and key files: serve HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// What the start-up log should warn about: settings the chosen store ignores.
    pub warnings: Vec<String>,
}

/// Reads the TOML file. Unknown keys are refused with their name.
pub fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read config file {}", path.display()))?;
    parse(&text).with_context(|| format!("config file {}", path.display()))
}

pub fn parse(text: &str) -> anyhow::Result<FileConfig> {
    toml::from_str(text).map_err(|e| anyhow!("{e}"))
}

/// Environment variables that override file keys (flags override both).
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("BELFRY_STORE", "store"),
    ("BELFRY_NODE_ID", "node_id"),
    ("BELFRY_PAYLOAD_MAX", "limits.payload_max"),
    ("BELFRY_REQUEST_MAX", "limits.request_max"),
    ("BELFRY_SUBSCRIBERS_BODY_MAX", "limits.subscribers_body_max"),
    ("BELFRY_IMPORT_BODY_MAX", "limits.import_body_max"),
    ("BELFRY_HORIZON", "limits.horizon"),
    (
        "BELFRY_STORE_CALLS_IN_FLIGHT",
        "limits.store_calls_in_flight",
    ),
    ("BELFRY_STORE_ADMISSION_WAIT", "limits.store_admission_wait"),
    ("BELFRY_STORE_CALL_TIMEOUT", "limits.store_call_timeout"),
    (
        "BELFRY_ALLOW_PRIVATE_TARGETS",
        "webhooks.allow_private_targets",
    ),
    (
        "BELFRY_WEBHOOK_IN_FLIGHT_DEFAULT",
        "webhooks.in_flight_default",
    ),
    ("BELFRY_WEBHOOKS_CA_FILE", "webhooks.ca_file"),
    (
        "BELFRY_HTTP_HEADER_READ_TIMEOUT",
        "http.header_read_timeout",
    ),
    ("BELFRY_HTTP_BODY_READ_TIMEOUT", "http.body_read_timeout"),
    ("BELFRY_HTTP_IDLE_TIMEOUT", "http.idle_timeout"),
    ("BELFRY_HTTP_CONNECTIONS_MAX", "http.connections_max"),
    (
        "BELFRY_HTTP_CONNECTIONS_PER_CLIENT_MAX",
        "http.connections_per_client_max",
    ),
    ("BELFRY_HTTP_LISTEN_BACKLOG", "http.listen_backlog"),
    ("BELFRY_DISPATCH_IN_FLIGHT_MAX", "dispatch.in_flight_max"),
    ("BELFRY_DISPATCH_PER_TARGET_MAX", "dispatch.per_target_max"),
    ("BELFRY_SCHEDULES_LEAD", "schedules.lead"),
    ("BELFRY_FSYNC", "storage.fsync"),
    ("BELFRY_FSYNC_INTERVAL", "storage.fsync_interval"),
    (
        "BELFRY_STORAGE_CHECKPOINT_WAL_BYTES",
        "storage.checkpoint_wal_bytes",
    ),
    (
        "BELFRY_STORAGE_FREE_SPACE_RESERVE",
        "storage.free_space_reserve",
    ),
    ("BELFRY_SHUTDOWN_GRACE", "shutdown.grace"),
    ("BELFRY_SHUTDOWN_DRAIN_DELAY", "shutdown.drain_delay"),
    ("BELFRY_METRICS_REFRESH", "metrics.refresh"),
    ("BELFRY_LOG_LEVEL", "log.level"),
    ("BELFRY_LOG_FORMAT", "log.format"),
    ("BELFRY_TLS_CERT", "tls.cert"),
    ("BELFRY_TLS_KEY", "tls.key"),
];

impl FileConfig {
    /// Applies `BELFRY_*` overrides found by `lookup`, then the connection overrides
    /// (`BELFRY_CONNECTIONS__NAME__KEY`), which are read from the process environment because
    /// their names are open-ended.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        if let Some(token) = lookup(ADMIN_TOKEN_ENV) {
            self.auth.admin_token = Some(token);
        }
        for (var, key) in REDIS_ENV_OVERRIDES {
            if let Some(value) = lookup(var) {
                self.redis.apply_env(var, key, value.trim())?;
            }
        }
        self.apply_fixed_env(lookup)?;
        self.apply_connection_env(
            std::env::vars().filter(|(var, _)| var.starts_with(CONNECTION_ENV_PREFIX)),
        )
    }

    fn apply_fixed_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        for (var, key) in ENV_OVERRIDES {
            let Some(value) = lookup(var) else { continue };
            let value = value.trim().to_owned();
            let bad = |what: &str| anyhow!("{var} (overrides {key}): {what}, got {value:?}");
            match *key {
                "store" => self.store = Some(value.clone()),
                "node_id" => self.node_id = Some(value.clone()),
                "limits.payload_max" => self.limits.payload_max = Some(env_size(var, key, &value)?),
                "limits.request_max" => self.limits.request_max = Some(env_size(var, key, &value)?),
                "limits.subscribers_body_max" => {
                    self.limits.subscribers_body_max = Some(env_size(var, key, &value)?)
                }
                "limits.import_body_max" => {
                    self.limits.import_body_max = Some(env_size(var, key, &value)?)
                }
                "limits.horizon" => self.limits.horizon = Some(env_duration(var, key, &value)?),
                "limits.store_calls_in_flight" => {
                    self.limits.store_calls_in_flight =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "limits.store_admission_wait" => {
                    self.limits.store_admission_wait = Some(env_duration(var, key, &value)?)
                }
                "limits.store_call_timeout" => {
                    self.limits.store_call_timeout = Some(env_duration(var, key, &value)?)
                }
                "webhooks.allow_private_targets" => {
                    self.webhooks.allow_private_targets =
                        Some(match value.to_ascii_lowercase().as_str() {
                            "1" | "true" | "yes" => true,
                            "0" | "false" | "no" => false,
                            _ => return Err(bad("expected true or false (or 1/0, yes/no)")),
                        })
                }
                "webhooks.in_flight_default" => {
                    self.webhooks.in_flight_default =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "webhooks.ca_file" => self.webhooks.ca_file = Some(PathBuf::from(&value)),
                "http.header_read_timeout" => {
                    self.http.header_read_timeout = Some(env_duration(var, key, &value)?)
                }
                "http.body_read_timeout" => {
                    self.http.body_read_timeout = Some(env_duration(var, key, &value)?)
                }
                "http.idle_timeout" => {
                    self.http.idle_timeout = Some(env_duration(var, key, &value)?)
                }
                "schedules.lead" => self.schedules.lead = Some(env_duration(var, key, &value)?),
                "http.connections_max" => {
                    self.http.connections_max =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "http.connections_per_client_max" => {
                    self.http.connections_per_client_max =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "http.listen_backlog" => {
                    self.http.listen_backlog =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "dispatch.in_flight_max" => {
                    self.dispatch.in_flight_max =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "dispatch.per_target_max" => {
                    self.dispatch.per_target_max =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "storage.fsync" => self.storage.fsync = Some(value.clone()),
                "storage.fsync_interval" => {
                    self.storage.fsync_interval = Some(env_duration(var, key, &value)?)
                }
                "storage.checkpoint_wal_bytes" => {
                    self.storage.checkpoint_wal_bytes = Some(env_size(var, key, &value)?)
                }
                "storage.free_space_reserve" => {
                    self.storage.free_space_reserve = Some(env_size(var, key, &value)?)
                }
                "shutdown.grace" => self.shutdown.grace = Some(env_duration(var, key, &value)?),
                "shutdown.drain_delay" => {
                    self.shutdown.drain_delay = Some(env_duration(var, key, &value)?)
                }
                "metrics.refresh" => self.metrics.refresh = Some(env_duration(var, key, &value)?),
                "log.level" => self.log.level = Some(value.clone()),
                "log.format" => self.log.format = Some(value.clone()),
                "tls.cert" => self.tls.cert = Some(PathBuf::from(&value)),
                "tls.key" => self.tls.key = Some(PathBuf::from(&value)),
                other => bail!("internal: no override for {other}"),
            }
        }
        Ok(())
    }
}

/// An environment variable's size, checked where the variable can be named in the error.
fn env_size(var: &str, key: &str, value: &str) -> anyhow::Result<HumanSize> {
    crate::units::parse_size_bytes(value).map_err(|e| anyhow!("{var} (overrides {key}): {e}"))?;
    Ok(HumanSize::Text(value.to_owned()))
}

/// An environment variable's duration, checked where the variable `var` and the key `key` it
/// overrides can be named in the error.
pub(crate) fn env_duration(var: &str, key: &str, value: &str) -> anyhow::Result<HumanDuration> {
    crate::units::parse_duration_ms(value).map_err(|e| anyhow!("{var} (overrides {key}): {e}"))?;
    Ok(HumanDuration::Text(value.to_owned()))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
