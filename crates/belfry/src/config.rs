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
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("listen = \"127.0.0.1:1\"\nbogus = 1\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err = parse("[limits]\npayload_maxx = \"1 MiB\"\n").unwrap_err();
        assert!(err.to_string().contains("payload_maxx"), "{err}");
    }

    #[test]
    fn shipped_example_parses() {
        let text = include_str!("../../../config/belfry.example.toml");
        let settings = parse(text).unwrap().resolve(None, None, None).unwrap();
        assert_eq!(settings.server.payload_bytes_max, 1024 * 1024);
        assert_eq!(settings.store, StoreKind::Engine);
    }

    /// The example documents every key an environment variable can set, with the variable.
    #[test]
    fn the_example_names_every_overridable_key() {
        let text = include_str!("../../../config/belfry.example.toml");
        for (var, key) in ENV_OVERRIDES.iter().chain(REDIS_ENV_OVERRIDES) {
            let name = key.rsplit('.').next().unwrap_or(key);
            assert!(
                text.contains(&format!("{name} =")) && text.contains(var),
                "config/belfry.example.toml does not document {key} ({var})"
            );
        }
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let mut file = parse("store = \"engine\"\n[limits]\nhorizon = \"1d\"\n").unwrap();
        file.apply_env(|var| match var {
            "BELFRY_HORIZON" => Some("2d".into()),
            "BELFRY_STORE" => Some("memory".into()),
            _ => None,
        })
        .unwrap();
        let settings = file
            .resolve(Some("127.0.0.1:9".into()), None, Some("engine".into()))
            .unwrap();
        assert_eq!(settings.server.horizon_ms, 2 * 86_400_000);
        assert_eq!(settings.store, StoreKind::Engine);
        assert_eq!(settings.server.listen.port(), 9);
    }

    #[test]
    fn connections_parse_validate_and_take_env_overrides() {
        let text = r#"
[connections.main]
type = "redis"
url = "redis://127.0.0.1:6379/0"
password = "swordfish"

[connections.events]
type = "nats"
url = "nats://127.0.0.1:4222"

[connections.log]
type = "kafka"
brokers = ["127.0.0.1:9092"]
"#;
        let mut file = parse(text).unwrap();
        assert!(!format!("{file:?}").contains("swordfish"));
        file.apply_connection_env([
            (
                "BELFRY_CONNECTIONS__MAIN__URL".to_owned(),
                "redis://10.0.0.5:6379/1".to_owned(),
            ),
            (
                "BELFRY_CONNECTIONS__LOG__BROKERS".to_owned(),
                "a:9092, b:9092".to_owned(),
            ),
        ])
        .unwrap();
        let settings = file.resolve(None, None, None).unwrap();
        let main = settings.connections.get("main").unwrap();
        assert_eq!(main.url.as_deref(), Some("redis://10.0.0.5:6379/1"));
        assert_eq!(main.password.as_deref(), Some("swordfish"));
        assert_eq!(
            settings.connections.get("log").unwrap().brokers,
            vec!["a:9092".to_owned(), "b:9092".to_owned()]
        );
        assert_eq!(settings.connections.len(), 3);
        assert!(!format!("{settings:?}").contains("swordfish"));

        let check = |text: &str, needle: &str| {
            let err = match parse(text) {
                Err(err) => err,
                Ok(file) => file.resolve(None, None, None).unwrap_err(),
            };
            assert!(err.to_string().contains(needle), "{text}: {err}");
        };
        check("[connections.a]\ntype = \"redis\"\nurll = \"x\"\n", "urll");
        check(
            "[connections.a]\nurl = \"redis://x\"\n",
            "connections.a.type",
        );
        check("[connections.a]\ntype = \"mqtt\"\n", "connections.a.type");
        check("[connections.a]\ntype = \"nats\"\n", "connections.a.url");
        check(
            "[connections.a]\ntype = \"kafka\"\nbrokers = []\n",
            "connections.a.brokers",
        );
        check(
            "[connections.a]\ntype = \"redis\"\nurl = \"http://x\"\n",
            "connections.a.url",
        );
        let mut file = parse("").unwrap();
        let err = file
            .apply_connection_env([("BELFRY_CONNECTIONS__X__COLOUR".to_owned(), "1".to_owned())])
            .unwrap_err();
        assert!(err.to_string().contains("COLOUR"), "{err}");
    }

    /// A self-signed CA certificate, as PEM, at `path`.
    fn write_ca(path: &Path) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(path, params.self_signed(&key).unwrap().pem()).unwrap();
    }

    #[test]
    fn connection_tls_maps_and_a_bad_ca_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        write_ca(&ca);
        let text = format!(
            "[connections.main]\ntype = \"redis\"\nurl = \"rediss://redis.internal:6380/0\"\n\
             [connections.main.tls]\nca_file = \"{}\"\n\
             [connections.flag]\ntype = \"redis\"\nurl = \"redis://redis.internal:6379/0\"\n\
             [connections.flag.tls]\nenabled = true\n",
            ca.display()
        );
        let settings = parse(&text).unwrap().resolve(None, None, None).unwrap();
        let main = settings.connections.get("main").unwrap();
        assert_eq!(main.tls.ca_file.as_deref(), Some(ca.as_path()));
        assert!(main.uses_tls() && !main.tls.enabled);
        assert!(settings.connections.get("flag").unwrap().tls.enabled);

        std::fs::write(&ca, "not a certificate\n").unwrap();
        let err = parse(&text)
            .unwrap()
            .resolve(None, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("connections.main.tls.ca_file") && err.contains("holds no certificate"),
            "{err}"
        );
    }

    #[test]
    fn webhooks_ca_file_maps_and_a_bad_one_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        write_ca(&ca);
        let text = format!("[webhooks]\nca_file = \"{}\"\n", ca.display());
        let settings = parse(&text).unwrap().resolve(None, None, None).unwrap();
        assert_eq!(
            settings.server.webhook_ca_file.as_deref(),
            Some(ca.as_path())
        );

        // The environment names it too.
        let mut file = parse("").unwrap();
        let shown = ca.display().to_string();
        file.apply_env(|var| (var == "BELFRY_WEBHOOKS_CA_FILE").then(|| shown.clone()))
            .unwrap();
        let settings = file.resolve(None, None, None).unwrap();
        assert_eq!(
            settings.server.webhook_ca_file.as_deref(),
            Some(ca.as_path())
        );

        let check = |text: &str, needle: &str| {
            let err = parse(text).unwrap().resolve(None, None, None).unwrap_err();
            let err = err.to_string();
            assert!(
                err.starts_with("webhooks.ca_file: ") && err.contains(needle),
                "{text}: {err}"
            );
        };
        check(
            "[webhooks]\nca_file = \"/no/such/ca.pem\"\n",
            "cannot read /no/such/ca.pem",
        );
        std::fs::write(&ca, "not a certificate\n").unwrap();
        check(&text, "holds no certificate");
    }

    #[test]
    fn kafka_connections_take_sasl_and_tls_keys() {
        let text = r#"
[connections.log]
type = "kafka"
brokers = ["127.0.0.1:9093"]
username = "belfry"
password = "swordfish"
sasl_mechanism = "SCRAM-SHA-256"
"#;
        let mut file = parse(text).unwrap();
        file.apply_connection_env([(
            "BELFRY_CONNECTIONS__LOG__SASL_MECHANISM".to_owned(),
            "SCRAM-SHA-512".to_owned(),
        )])
        .unwrap();
        let settings = file.resolve(None, None, None).unwrap();
        let log = settings.connections.get("log").unwrap();
        assert_eq!(log.sasl_mechanism.as_deref(), Some("SCRAM-SHA-512"));
        assert!(!format!("{settings:?}").contains("swordfish"));

        let check = |text: &str, needle: &str| {
            let err = parse(text).unwrap().resolve(None, None, None).unwrap_err();
            assert!(err.to_string().contains(needle), "{text}: {err}");
        };
        let kafka = "[connections.log]\ntype = \"kafka\"\nbrokers = [\"h:1\"]\n";
        check(
            &format!("{kafka}username = \"u\"\npassword = \"p\"\nsasl_mechanism = \"MD5\"\n"),
            "connections.log.sasl_mechanism",
        );
        check(
            &format!(
                "{kafka}[connections.log.tls]\nenabled = true\nca_file = \"/no/such/ca.pem\"\n"
            ),
            "connections.log.tls.ca_file: cannot read",
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = parse("[limits]\npayload_max = \"1 parsec\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap_err();
        assert!(err.to_string().contains("limits.payload_max"), "{err}");
        let err = parse("[storage]\nfsync = \"sometimes\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap_err();
        assert!(err.to_string().contains("storage.fsync"), "{err}");
    }

    /// A duration or size of the wrong type says what it should be, not a Rust type's name.
    #[test]
    fn a_mistyped_duration_or_size_says_what_is_expected() {
        let err = parse("[limits]\nhorizon = -5\n").unwrap_err();
        assert!(format!("{err:#}").contains("a duration such as"), "{err:#}");
        let err = parse("[limits]\npayload_max = true\n").unwrap_err();
        assert!(format!("{err:#}").contains("a size such as"), "{err:#}");
    }

    /// The engine's checkpoint threshold and free-space reserve (issue #12: the docs and the
    /// advice after a full disk name them), from the file or the environment, in human sizes.
    #[test]
    fn the_checkpoint_threshold_and_the_free_space_reserve_are_settable() {
        let settings = parse("").unwrap().resolve(None, None, None).unwrap();
        assert_eq!(
            settings.checkpoint_wal_bytes,
            belfry_store::CHECKPOINT_WAL_BYTES_DEFAULT
        );
        assert_eq!(
            settings.free_space_reserve_bytes,
            belfry_store::FREE_SPACE_RESERVE_BYTES_DEFAULT
        );
        let text = "[storage]\ncheckpoint_wal_bytes = \"4 MiB\"\nfree_space_reserve = \"16 MiB\"\n";
        let settings = parse(text).unwrap().resolve(None, None, None).unwrap();
        assert_eq!(settings.checkpoint_wal_bytes, 4 << 20);
        assert_eq!(settings.free_space_reserve_bytes, 16 << 20);
        let mut file = parse(text).unwrap();
        file.apply_env(|var| match var {
            "BELFRY_STORAGE_CHECKPOINT_WAL_BYTES" => Some("1 MiB".into()),
            "BELFRY_STORAGE_FREE_SPACE_RESERVE" => Some("0".into()),
            _ => None,
        })
        .unwrap();
        let settings = file.resolve(None, None, None).unwrap();
        assert_eq!(settings.checkpoint_wal_bytes, 1 << 20);
        assert_eq!(settings.free_space_reserve_bytes, 0);
        let err = parse("[storage]\ncheckpoint_wal_bytes = \"1 KiB\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("storage.checkpoint_wal_bytes: must be at least 64 KiB"),
            "{err}"
        );
        let err = parse("[storage]\nfree_space_reserve = \"lots\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap_err();
        assert!(
            err.to_string().contains("storage.free_space_reserve"),
            "{err}"
        );
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_STORAGE_FREE_SPACE_RESERVE").then(|| "big".into()))
            .unwrap_err();
        assert!(
            format!("{err:#}").contains(
                "BELFRY_STORAGE_FREE_SPACE_RESERVE (overrides storage.free_space_reserve)"
            ),
            "{err:#}"
        );
    }

    /// An interval of 0 would spin the flusher on a core; an interval without its mode would
    /// be ignored without a word.
    #[test]
    fn an_fsync_interval_is_above_zero_and_only_with_its_mode() {
        let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
        let zero = resolve("[storage]\nfsync = \"interval\"\nfsync_interval = \"0ms\"\n");
        assert!(
            format!("{:#}", zero.unwrap_err()).contains("must be longer than 0"),
            "zero"
        );
        let alone = resolve("[storage]\nfsync_interval = \"10ms\"\n").unwrap_err();
        assert!(
            format!("{alone:#}").contains("applies only with storage.fsync = \"interval\""),
            "{alone:#}"
        );
        assert!(resolve("[storage]\nfsync = \"interval\"\nfsync_interval = \"10ms\"\n").is_ok());
    }

    #[test]
    fn log_levels_are_levels_or_target_directives() {
        let level = |text: &str| {
            parse(&format!("[log]\nlevel = \"{text}\"\n"))
                .unwrap()
                .resolve(None, None, None)
                .map(|c| c.log_level)
        };
        for good in [
            "info",
            "DEBUG",
            "belfry_server=debug,info",
            "warn,hyper=off",
        ] {
            assert_eq!(level(good).unwrap(), good);
        }
        // A bare word is a target to tracing: a typo would have turned logging off.
        for bad in ["loud", "inf", "info,,", "belfry=verbose"] {
            let err = level(bad).unwrap_err().to_string();
            assert!(
                err.contains("log.level") && err.contains("not a level"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn store_call_timeout_defaults_parses_takes_env_and_refuses_zero_or_junk() {
        let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
        assert_eq!(resolve("").unwrap().server.store_call_timeout_ms, 5_000);
        let set = resolve("[limits]\nstore_call_timeout = \"750ms\"\n").unwrap();
        assert_eq!(set.server.store_call_timeout_ms, 750);
        let mut file = parse("").unwrap();
        file.apply_env(|var| (var == "BELFRY_STORE_CALL_TIMEOUT").then(|| "2s".into()))
            .unwrap();
        let from_env = file.resolve(None, None, None).unwrap();
        assert_eq!(from_env.server.store_call_timeout_ms, 2_000);
        for bad in ["0s", "soon"] {
            let err = resolve(&format!("[limits]\nstore_call_timeout = \"{bad}\"\n")).unwrap_err();
            assert!(
                err.to_string().contains("limits.store_call_timeout"),
                "{bad}: {err}"
            );
        }
    }

    /// A number with no unit means milliseconds only as a TOML integer; as a string (every
    /// environment variable is one) it is refused, naming the variable, rather than guessed.
    #[test]
    fn a_duration_string_without_a_unit_is_refused() {
        let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
        let integer = resolve("[http]\nidle_timeout = 1000\n").unwrap();
        assert_eq!(integer.server.http_idle_timeout_ms, 1_000);
        let err = resolve("[http]\nidle_timeout = \"1000\"\n").unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("http.idle_timeout"), "{text}");
        assert!(text.contains("\"1000ms\" or \"1000s\""), "{text}");
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_SHUTDOWN_GRACE").then(|| "30000".into()))
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("BELFRY_SHUTDOWN_GRACE (overrides shutdown.grace)"),
            "{text}"
        );
        assert_eq!(
            text.matches("\"30000\"").count(),
            1,
            "the value once: {text}"
        );
        // Sizes too name the variable, not only the key.
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_PAYLOAD_MAX").then(|| "huge".into()))
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("BELFRY_PAYLOAD_MAX (overrides limits.payload_max)"),
            "{err:#}"
        );
        let mut file = parse("").unwrap();
        file.apply_env(|var| (var == "BELFRY_HTTP_IDLE_TIMEOUT").then(|| "0".into()))
            .unwrap_or_else(|e| panic!("0 needs no unit: {e:#}"));
    }

    #[test]
    fn schedules_lead_defaults_parses_takes_env_and_refuses_over_a_minute() {
        let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
        assert_eq!(resolve("").unwrap().server.schedule_lead_ms, 500);
        let set = resolve("[schedules]\nlead = \"2s\"\n").unwrap();
        assert_eq!(set.server.schedule_lead_ms, 2_000);
        let off = resolve("[schedules]\nlead = \"0ms\"\n").unwrap();
        assert_eq!(off.server.schedule_lead_ms, 0);
        let mut file = parse("").unwrap();
        file.apply_env(|var| (var == "BELFRY_SCHEDULES_LEAD").then(|| "250ms".into()))
            .unwrap();
        assert_eq!(
            file.resolve(None, None, None)
                .unwrap()
                .server
                .schedule_lead_ms,
            250
        );
        for bad in ["2m", "soon"] {
            let err = resolve(&format!("[schedules]\nlead = \"{bad}\"\n")).unwrap_err();
            assert!(err.to_string().contains("schedules.lead"), "{bad}: {err}");
        }
    }

    #[test]
    fn connection_guards_default_parse_take_env_and_validate() {
        let defaults = parse("").unwrap().resolve(None, None, None).unwrap().server;
        assert_eq!(defaults.http_listen_backlog, 1_024);
        assert_eq!(defaults.http_connections_per_client_max, None);
        assert_eq!(
            defaults.http_connections_per_client_cap(),
            2_500,
            "by default a quarter of http.connections_max"
        );
        let lowered = parse("[http]\nconnections_max = 100\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap()
            .server;
        assert_eq!(lowered.http_connections_per_client_cap(), 25);

        let text = "[http]\nlisten_backlog = 4096\nconnections_per_client_max = 300\n";
        let from_file = parse(text).unwrap().resolve(None, None, None).unwrap();
        assert_eq!(from_file.server.http_listen_backlog, 4_096);
        assert_eq!(from_file.server.http_connections_per_client_cap(), 300);

        let mut file = parse(text).unwrap();
        file.apply_env(|var| match var {
            "BELFRY_HTTP_LISTEN_BACKLOG" => Some("512".into()),
            "BELFRY_HTTP_CONNECTIONS_PER_CLIENT_MAX" => Some("10000".into()),
            _ => None,
        })
        .unwrap();
        let from_env = file.resolve(None, None, None).unwrap().server;
        assert_eq!(from_env.http_listen_backlog, 512);
        assert_eq!(from_env.http_connections_per_client_cap(), 10_000);

        for (bad, key) in [
            ("[http]\nlisten_backlog = 0\n", "http.listen_backlog"),
            ("[http]\nlisten_backlog = 70000\n", "http.listen_backlog"),
            (
                "[http]\nconnections_per_client_max = 0\n",
                "http.connections_per_client_max",
            ),
            (
                "[http]\nconnections_max = 10\nconnections_per_client_max = 11\n",
                "http.connections_per_client_max",
            ),
        ] {
            let err = parse(bad).unwrap().resolve(None, None, None).unwrap_err();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_HTTP_LISTEN_BACKLOG").then(|| "lots".into()))
            .unwrap_err();
        assert!(err.to_string().contains("http.listen_backlog"), "{err}");
    }

    #[test]
    fn node_id_defaults_unique_and_takes_file_env_and_flag() {
        let first = parse("").unwrap().resolve(None, None, None).unwrap();
        let second = parse("").unwrap().resolve(None, None, None).unwrap();
        let (a, b) = (&first.server.node_id, &second.server.node_id);
        assert_ne!(a, b, "two defaults in one process differ");
        assert!(
            a.contains(&format!("-{}-", std::process::id())),
            "the default names the process: {a}"
        );
        assert!(belfry_server::config::check_node_id(a).is_ok(), "{a}");

        let mut file = parse("node_id = \"from-file\"\n").unwrap();
        assert_eq!(
            parse("node_id = \"from-file\"\n")
                .unwrap()
                .resolve(None, None, None)
                .unwrap()
                .server
                .node_id,
            "from-file"
        );
        file.apply_env(|var| (var == "BELFRY_NODE_ID").then(|| "from-env".into()))
            .unwrap();
        assert_eq!(file.node_id.as_deref(), Some("from-env"));
        // The flag is applied by the command line over the environment, as `cli` does.
        file.node_id = Some("node-7".into());
        assert_eq!(
            file.resolve(None, None, None).unwrap().server.node_id,
            "node-7"
        );

        for bad in ["", "has space", "tab\there", &"x".repeat(129)] {
            let text = format!("node_id = {bad:?}\n");
            let err = parse(&text).unwrap().resolve(None, None, None).unwrap_err();
            assert!(err.to_string().contains("node_id"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn settings_the_chosen_store_ignores_are_warned_about() {
        let warnings = |text: &str| {
            parse(text)
                .unwrap()
                .resolve(None, None, None)
                .unwrap()
                .warnings
        };
        let on_memory = warnings(
            "store = \"memory\"\n[storage]\nfsync = \"never\"\n[redis]\nnamespace = \"x\"\n",
        );
        assert_eq!(
            on_memory,
            [
                "storage.fsync is set but does nothing on the memory store",
                "redis.namespace is set but does nothing on the memory store"
            ]
        );
        let on_redis =
            warnings("store = \"redis://127.0.0.1:6379\"\n[storage]\nfsync = \"always\"\n");
        assert_eq!(
            on_redis,
            ["storage.fsync is set but does nothing on a Redis store"]
        );
        let on_engine = warnings("[storage]\nfsync = \"never\"\n[redis]\npartitions = 8\n");
        assert_eq!(
            on_engine,
            ["redis.partitions is set but does nothing on the embedded store"]
        );
        assert!(warnings("[storage]\nfsync = \"never\"\n").is_empty());
    }
}
