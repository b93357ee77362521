//! The configuration file (TOML), its environment overrides and conversion to the server's
//! validated settings. Every key is documented in config/belfry.example.toml.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use belfry_server::ServerConfig;
use belfry_store::FsyncPolicy;
use serde::Deserialize;

use crate::units::{HumanDuration, HumanSize};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub store: Option<String>,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub webhooks: WebhooksSection,
    #[serde(default)]
    pub http: HttpSection,
    #[serde(default)]
    pub dispatch: DispatchSection,
    #[serde(default)]
    pub storage: StorageSection,
    #[serde(default)]
    pub shutdown: ShutdownSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub log: LogSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub payload_max: Option<HumanSize>,
    pub request_max: Option<HumanSize>,
    pub horizon: Option<HumanDuration>,
    pub store_calls_in_flight: Option<usize>,
    pub store_admission_wait: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksSection {
    pub allow_private_targets: Option<bool>,
    pub in_flight_default: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    pub header_read_timeout: Option<HumanDuration>,
    pub body_read_timeout: Option<HumanDuration>,
    pub idle_timeout: Option<HumanDuration>,
    pub connections_max: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchSection {
    pub in_flight_max: Option<usize>,
    pub per_target_max: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    pub fsync: Option<String>,
    pub fsync_interval: Option<HumanDuration>,
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

/// Which store `serve` runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// The embedded, durable engine under the data directory.
    Engine,
    /// Nothing durable: for quick experiments.
    Memory,
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
    pub fsync: FsyncPolicy,
    pub log_level: String,
    pub log_format: LogFormat,
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
    ("BELFRY_PAYLOAD_MAX", "limits.payload_max"),
    ("BELFRY_REQUEST_MAX", "limits.request_max"),
    ("BELFRY_HORIZON", "limits.horizon"),
    (
        "BELFRY_STORE_CALLS_IN_FLIGHT",
        "limits.store_calls_in_flight",
    ),
    ("BELFRY_STORE_ADMISSION_WAIT", "limits.store_admission_wait"),
    (
        "BELFRY_ALLOW_PRIVATE_TARGETS",
        "webhooks.allow_private_targets",
    ),
    (
        "BELFRY_WEBHOOK_IN_FLIGHT_DEFAULT",
        "webhooks.in_flight_default",
    ),
    (
        "BELFRY_HTTP_HEADER_READ_TIMEOUT",
        "http.header_read_timeout",
    ),
    ("BELFRY_HTTP_BODY_READ_TIMEOUT", "http.body_read_timeout"),
    ("BELFRY_HTTP_IDLE_TIMEOUT", "http.idle_timeout"),
    ("BELFRY_HTTP_CONNECTIONS_MAX", "http.connections_max"),
    ("BELFRY_DISPATCH_IN_FLIGHT_MAX", "dispatch.in_flight_max"),
    ("BELFRY_DISPATCH_PER_TARGET_MAX", "dispatch.per_target_max"),
    ("BELFRY_FSYNC", "storage.fsync"),
    ("BELFRY_FSYNC_INTERVAL", "storage.fsync_interval"),
    ("BELFRY_SHUTDOWN_GRACE", "shutdown.grace"),
    ("BELFRY_SHUTDOWN_DRAIN_DELAY", "shutdown.drain_delay"),
    ("BELFRY_METRICS_REFRESH", "metrics.refresh"),
    ("BELFRY_LOG_LEVEL", "log.level"),
    ("BELFRY_LOG_FORMAT", "log.format"),
];

impl FileConfig {
    /// Applies `BELFRY_*` overrides found by `lookup`.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        for (var, key) in ENV_OVERRIDES {
            let Some(value) = lookup(var) else { continue };
            let value = value.trim().to_owned();
            let bad = |what: &str| anyhow!("{var} (overrides {key}): {what}, got {value:?}");
            match *key {
                "store" => self.store = Some(value.clone()),
                "limits.payload_max" => {
                    self.limits.payload_max = Some(HumanSize::Text(value.clone()))
                }
                "limits.request_max" => {
                    self.limits.request_max = Some(HumanSize::Text(value.clone()))
                }
                "limits.horizon" => self.limits.horizon = Some(HumanDuration::Text(value.clone())),
                "limits.store_calls_in_flight" => {
                    self.limits.store_calls_in_flight =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "limits.store_admission_wait" => {
                    self.limits.store_admission_wait = Some(HumanDuration::Text(value.clone()))
                }
                "webhooks.allow_private_targets" => {
                    self.webhooks.allow_private_targets = Some(match value.as_str() {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(bad("expected true or false")),
                    })
                }
                "webhooks.in_flight_default" => {
                    self.webhooks.in_flight_default =
                        Some(value.parse().map_err(|_| bad("expected a whole number"))?)
                }
                "http.header_read_timeout" => {
                    self.http.header_read_timeout = Some(HumanDuration::Text(value.clone()))
                }
                "http.body_read_timeout" => {
                    self.http.body_read_timeout = Some(HumanDuration::Text(value.clone()))
                }
                "http.idle_timeout" => {
                    self.http.idle_timeout = Some(HumanDuration::Text(value.clone()))
                }
                "http.connections_max" => {
                    self.http.connections_max =
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
                    self.storage.fsync_interval = Some(HumanDuration::Text(value.clone()))
                }
                "shutdown.grace" => self.shutdown.grace = Some(HumanDuration::Text(value.clone())),
                "shutdown.drain_delay" => {
                    self.shutdown.drain_delay = Some(HumanDuration::Text(value.clone()))
                }
                "metrics.refresh" => {
                    self.metrics.refresh = Some(HumanDuration::Text(value.clone()))
                }
                "log.level" => self.log.level = Some(value.clone()),
                "log.format" => self.log.format = Some(value.clone()),
                other => bail!("internal: no override for {other}"),
            }
        }
        Ok(())
    }

    /// Resolves defaults and validates. `listen` and `data_dir` come from flags/env when given.
    pub fn resolve(
        self,
        listen: Option<String>,
        data_dir: Option<PathBuf>,
        store: Option<String>,
    ) -> anyhow::Result<Settings> {
        let mut server = ServerConfig::default();
        let listen = listen
            .or(self.listen)
            .unwrap_or_else(|| "127.0.0.1:7070".into());
        server.listen = listen.parse::<SocketAddr>().map_err(|_| {
            anyhow!("listen: expected an address such as 127.0.0.1:7070, got {listen:?}")
        })?;
        let usize_of = |key: &str, size: &HumanSize| -> anyhow::Result<usize> {
            let bytes = size.to_bytes().map_err(|e| anyhow!("{key}: {e}"))?;
            usize::try_from(bytes).map_err(|_| anyhow!("{key}: too large"))
        };
        let ms_of = |key: &str, d: &HumanDuration| d.to_ms().map_err(|e| anyhow!("{key}: {e}"));
        if let Some(size) = &self.limits.payload_max {
            server.payload_bytes_max = usize_of("limits.payload_max", size)?;
        }
        if let Some(size) = &self.limits.request_max {
            server.request_bytes_max = usize_of("limits.request_max", size)?;
        }
        if let Some(d) = &self.limits.horizon {
            server.horizon_ms = ms_of("limits.horizon", d)?;
        }
        if let Some(n) = self.limits.store_calls_in_flight {
            server.store_calls_in_flight_max = n;
        }
        if let Some(d) = &self.limits.store_admission_wait {
            server.store_admission_wait_ms = ms_of("limits.store_admission_wait", d)?;
        }
        if let Some(allow) = self.webhooks.allow_private_targets {
            server.allow_private_targets = allow;
        }
        if let Some(n) = self.webhooks.in_flight_default {
            server.webhook_in_flight_default = n;
        }
        if let Some(d) = &self.http.header_read_timeout {
            server.http_header_read_timeout_ms = ms_of("http.header_read_timeout", d)?;
        }
        if let Some(d) = &self.http.body_read_timeout {
            server.http_body_read_timeout_ms = ms_of("http.body_read_timeout", d)?;
        }
        if let Some(d) = &self.http.idle_timeout {
            server.http_idle_timeout_ms = ms_of("http.idle_timeout", d)?;
        }
        if let Some(n) = self.http.connections_max {
            server.http_connections_max = n;
        }
        if let Some(n) = self.dispatch.in_flight_max {
            server.dispatch_in_flight_max = n;
        }
        if let Some(n) = self.dispatch.per_target_max {
            server.dispatch_per_target_max = n;
        }
        if let Some(d) = &self.shutdown.grace {
            server.shutdown_grace_ms = ms_of("shutdown.grace", d)?;
        }
        if let Some(d) = &self.shutdown.drain_delay {
            server.shutdown_drain_delay_ms = ms_of("shutdown.drain_delay", d)?;
        }
        if let Some(d) = &self.metrics.refresh {
            server.metrics_refresh_ms = ms_of("metrics.refresh", d)?;
        }
        server.validate()?;
        let store = match store.or(self.store).as_deref().unwrap_or("engine") {
            "engine" => StoreKind::Engine,
            "memory" => StoreKind::Memory,
            other => bail!("store: expected \"engine\" or \"memory\", got {other:?}"),
        };
        let fsync = match self.storage.fsync.as_deref().unwrap_or("always") {
            "always" => FsyncPolicy::Always,
            "never" => FsyncPolicy::Never,
            "interval" => {
                let ms = self
                    .storage
                    .fsync_interval
                    .as_ref()
                    .map(|d| ms_of("storage.fsync_interval", d))
                    .transpose()?
                    .ok_or_else(|| {
                        anyhow!(
                            "storage.fsync_interval: required when storage.fsync is \"interval\""
                        )
                    })?;
                FsyncPolicy::Interval(std::time::Duration::from_millis(ms))
            }
            other => bail!(
                "storage.fsync: expected \"always\", \"interval\" or \"never\", got {other:?}"
            ),
        };
        let log_format = match self.log.format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => bail!("log.format: expected \"text\" or \"json\", got {other:?}"),
        };
        Ok(Settings {
            server,
            data_dir: data_dir
                .or(self.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            store,
            fsync,
            log_level: self.log.level.unwrap_or_else(|| "info".into()),
            log_format,
        })
    }
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
}
