//! Which store `serve` runs on (`store`, `--store`, `BELFRY_STORE`) and the `[redis]` table
//! that configures the Redis kinds. Every key is documented in config/belfry.example.toml.

use std::time::Duration;

use anyhow::{anyhow, bail};
use belfry_store_redis::{RedisOptions, RedisTarget, Timeouts};
use serde::Deserialize;

use crate::config::env_duration;
use crate::units::HumanDuration;

/// `[redis]`: how a `redis://` or `redis-cluster://` store is laid out and waited for.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// Prefix of every key, so several deployments can share one Redis.
    pub namespace: Option<String>,
    /// Partitions per queue; fixed when the namespace is first used.
    pub partitions: Option<u16>,
    /// Shards per reminder subscriber set; by default 16 on a cluster, 1 on one Redis.
    /// Fixed when the namespace is first used.
    pub subscriber_shards: Option<u16>,
    pub command_timeout: Option<HumanDuration>,
    pub connect_timeout: Option<HumanDuration>,
    /// Replicas that must hold a durable change before it is acknowledged (Redis `WAIT`).
    pub replica_acks: Option<u32>,
    /// Tasks due this far ahead or more wait in far-future buckets; 0 keeps none there.
    pub far_after: Option<HumanDuration>,
}

/// `[redis]` environment overrides, as `config::ENV_OVERRIDES` lists them.
pub const REDIS_ENV_OVERRIDES: &[(&str, &str)] = &[
    ("BELFRY_REDIS_NAMESPACE", "redis.namespace"),
    ("BELFRY_REDIS_PARTITIONS", "redis.partitions"),
    ("BELFRY_REDIS_SUBSCRIBER_SHARDS", "redis.subscriber_shards"),
    ("BELFRY_REDIS_COMMAND_TIMEOUT", "redis.command_timeout"),
    ("BELFRY_REDIS_CONNECT_TIMEOUT", "redis.connect_timeout"),
    ("BELFRY_REDIS_REPLICA_ACKS", "redis.replica_acks"),
    ("BELFRY_REDIS_FAR_AFTER", "redis.far_after"),
];

impl RedisSection {
    /// Applies the `[redis]` override `key` (one of [`REDIS_ENV_OVERRIDES`]'s) to `value`.
    pub fn apply_env(&mut self, var: &str, key: &str, value: &str) -> anyhow::Result<()> {
        match key {
            "redis.namespace" => self.namespace = Some(value.to_owned()),
            "redis.partitions" => {
                self.partitions = Some(value.parse().map_err(|_| {
                    anyhow!("{var} (overrides {key}): expected a whole number from 1 to 65535, got {value:?}")
                })?)
            }
            "redis.subscriber_shards" => {
                let max = belfry_store_redis::SUBSCRIBER_SHARDS_MAX;
                self.subscriber_shards = Some(value.parse().map_err(|_| {
                    anyhow!("{var} (overrides {key}): expected a whole number from 1 to {max}, got {value:?}")
                })?)
            }
            "redis.command_timeout" => self.command_timeout = Some(env_duration(var, key, value)?),
            "redis.connect_timeout" => self.connect_timeout = Some(env_duration(var, key, value)?),
            "redis.replica_acks" => {
                self.replica_acks = Some(value.parse().map_err(|_| {
                    anyhow!("{var} (overrides {key}): expected a whole number of replicas, got {value:?}")
                })?)
            }
            "redis.far_after" => self.far_after = Some(env_duration(var, key, value)?),
            other => bail!("internal: no override for {other}"),
        }
        Ok(())
    }

    /// The validated options; namespace and partition count are checked again (with Redis's
    /// own state) when the store connects.
    pub fn resolve(&self) -> anyhow::Result<RedisOptions> {
        let defaults = RedisOptions::default();
        let duration = |key: &str, value: &Option<HumanDuration>, default: Duration| {
            let Some(value) = value else {
                return Ok(default);
            };
            match value.to_ms() {
                Ok(0) => Err(anyhow!("{key}: must be longer than 0")),
                Ok(ms) => Ok(Duration::from_millis(ms)),
                Err(e) => Err(anyhow!("{key}: {e}")),
            }
        };
        let timeouts = Timeouts {
            command: duration(
                "redis.command_timeout",
                &self.command_timeout,
                defaults.timeouts.command,
            )?,
            connect: duration(
                "redis.connect_timeout",
                &self.connect_timeout,
                defaults.timeouts.connect,
            )?,
        };
        let namespace = self.namespace.clone().unwrap_or(defaults.namespace.clone());
        let namespace_ok = !namespace.is_empty()
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !namespace_ok {
            bail!("redis.namespace: use letters, digits, '_' and '-' (at least one), got {namespace:?}");
        }
        let partitions = self.partitions.unwrap_or(defaults.partitions);
        if partitions == 0 {
            bail!("redis.partitions: must be at least 1");
        }
        if let Some(k) = self.subscriber_shards {
            let max = belfry_store_redis::SUBSCRIBER_SHARDS_MAX;
            if !(1..=max).contains(&k) {
                bail!("redis.subscriber_shards: use 1 to {max}, got {k}");
            }
        }
        let far_after_ms = match &self.far_after {
            None => defaults.far_after_ms,
            Some(value) => match value.to_ms() {
                Ok(ms) if ms == 0 || ms >= belfry_store_redis::FAR_AFTER_MS_MIN => ms,
                Ok(_) => bail!(
                    "redis.far_after: use \"0\" (no far-future buckets) or at least {} s",
                    belfry_store_redis::FAR_AFTER_MS_MIN / 1_000
                ),
                Err(e) => bail!("redis.far_after: {e}"),
            },
        };
        Ok(RedisOptions {
            namespace,
            partitions,
            subscriber_shards: self.subscriber_shards,
            timeouts,
            far_after_ms,
            replica_acks: self.replica_acks.unwrap_or(defaults.replica_acks),
            ..defaults
        })
    }
}

/// Which store `serve` runs on.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// The embedded, durable engine under the data directory.
    Engine,
    /// Nothing durable: for quick experiments.
    Memory,
    /// One Redis or a Redis Cluster, shared by every node that names it.
    Redis(RedisTarget),
}

impl StoreKind {
    /// Parses `engine`, `memory`, `redis://host:port` or `redis-cluster://host:port,…`;
    /// a malformed Redis URL's message says what to write instead, and `rediss://` that TLS
    /// to the store is not supported yet.
    pub fn parse(text: &str) -> anyhow::Result<StoreKind> {
        match text {
            "engine" => Ok(StoreKind::Engine),
            "memory" => Ok(StoreKind::Memory),
            url if url.contains("://") => RedisTarget::parse(url)
                .map(StoreKind::Redis)
                .map_err(|e| anyhow!("store (--store, BELFRY_STORE or the file's store key): {e}")),
            other => bail!(
                "store (--store, BELFRY_STORE or the file's store key): expected \"engine\", \"memory\", \"redis://host:port\" or \
                 \"redis-cluster://host:port,host:port\", got {other:?}"
            ),
        }
    }
}

/// Never shows a Redis password: the target's `Display` redacts it.
impl std::fmt::Debug for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreKind::Engine => f.write_str("Engine"),
            StoreKind::Memory => f.write_str("Memory"),
            StoreKind::Redis(target) => write!(f, "Redis({target})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    #[test]
    fn store_urls_parse_into_kinds() {
        assert_eq!(StoreKind::parse("engine").unwrap(), StoreKind::Engine);
        assert_eq!(StoreKind::parse("memory").unwrap(), StoreKind::Memory);
        assert_eq!(
            StoreKind::parse("redis://127.0.0.1:6379").unwrap(),
            StoreKind::Redis(RedisTarget::Single("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            StoreKind::parse("redis-cluster://10.0.0.1:7000,10.0.0.2:7000").unwrap(),
            StoreKind::Redis(RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7000".into()
            ]))
        );
    }

    #[test]
    fn malformed_store_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redis://bad", "no port"),
            ("redis://h:99999", "1 to 65535"),
            ("redis://a:1,b:2", "redis-cluster://"),
            ("redis-cluster://a:1,,b:2", "empty node"),
            ("http://h:1", "expected redis://"),
            (
                "rediss://h:1",
                "TLS to the store's Redis is not supported yet",
            ),
        ] {
            let err = format!("{:#}", StoreKind::parse(url).unwrap_err());
            assert!(err.contains(says), "{url}: {err}");
            assert!(err.contains(url), "{url}: the message names the URL: {err}");
        }
        let err = StoreKind::parse("sqlite").unwrap_err().to_string();
        assert!(
            err.contains("redis-cluster://") && err.contains("sqlite"),
            "{err}"
        );
    }

    #[test]
    fn debug_never_shows_a_redis_password() {
        let kind = StoreKind::parse("redis://user:swordfish@127.0.0.1:6379/0").unwrap();
        let shown = format!("{kind:?}");
        assert!(!shown.contains("swordfish"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
    }

    #[test]
    fn far_after_is_off_or_at_least_the_minimum() {
        let far_after = |table: &str| {
            parse(&format!("store = \"redis://127.0.0.1:6379\"\n{table}"))
                .and_then(|f| f.resolve(None, None, None))
                .map(|s| s.redis.far_after_ms)
        };
        assert_eq!(far_after("").unwrap(), 120_000);
        assert_eq!(far_after("[redis]\nfar_after = \"0\"\n").unwrap(), 0);
        assert_eq!(
            far_after("[redis]\nfar_after = \"10m\"\n").unwrap(),
            600_000
        );
        let err = far_after("[redis]\nfar_after = \"30s\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("at least 70 s"), "{err:#}");
    }

    #[test]
    fn redis_table_defaults_keys_and_env_overrides() {
        let settings = parse("store = \"redis://127.0.0.1:6379\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap();
        assert!(matches!(settings.store, StoreKind::Redis(_)));
        assert_eq!(settings.redis.namespace, "belfry");
        assert_eq!(settings.redis.partitions, 256);
        // Unset: the store picks by target (16 on a cluster, 1 on one Redis).
        assert_eq!(settings.redis.subscriber_shards, None);
        assert_eq!(settings.redis.timeouts.command, Duration::from_secs(5));
        assert_eq!(settings.redis.timeouts.connect, Duration::from_secs(2));

        let text = "[redis]\nnamespace = \"prod\"\npartitions = 64\nsubscriber_shards = 32\n\
                    command_timeout = \"750ms\"\nconnect_timeout = 3000\n";
        let from_file = parse(text).unwrap().resolve(None, None, None).unwrap();
        assert_eq!(from_file.redis.namespace, "prod");
        assert_eq!(from_file.redis.partitions, 64);
        assert_eq!(from_file.redis.subscriber_shards, Some(32));
        assert_eq!(from_file.redis.timeouts.command, Duration::from_millis(750));
        assert_eq!(from_file.redis.timeouts.connect, Duration::from_secs(3));

        let mut file = parse(text).unwrap();
        file.apply_env(|var| match var {
            "BELFRY_STORE" => Some("redis-cluster://127.0.0.1:7000".into()),
            "BELFRY_REDIS_NAMESPACE" => Some("staging".into()),
            "BELFRY_REDIS_PARTITIONS" => Some("16".into()),
            "BELFRY_REDIS_SUBSCRIBER_SHARDS" => Some("4".into()),
            "BELFRY_REDIS_COMMAND_TIMEOUT" => Some("300ms".into()),
            "BELFRY_REDIS_CONNECT_TIMEOUT" => Some("1s".into()),
            _ => None,
        })
        .unwrap();
        let from_env = file.resolve(None, None, None).unwrap();
        assert!(matches!(&from_env.store, StoreKind::Redis(t) if t.is_cluster()));
        assert_eq!(from_env.redis.namespace, "staging");
        assert_eq!(from_env.redis.partitions, 16);
        assert_eq!(from_env.redis.subscriber_shards, Some(4));
        assert_eq!(from_env.redis.timeouts.command, Duration::from_millis(300));
        assert_eq!(from_env.redis.timeouts.connect, Duration::from_secs(1));
    }

    #[test]
    fn bad_redis_values_name_the_key() {
        for (text, key) in [
            ("[redis]\nnamespace = \"a b\"\n", "redis.namespace"),
            ("[redis]\nnamespace = \"\"\n", "redis.namespace"),
            ("[redis]\npartitions = 0\n", "redis.partitions"),
            (
                "[redis]\nsubscriber_shards = 0\n",
                "redis.subscriber_shards",
            ),
            (
                "[redis]\nsubscriber_shards = 65\n",
                "redis.subscriber_shards",
            ),
            (
                "[redis]\ncommand_timeout = \"0s\"\n",
                "redis.command_timeout",
            ),
            (
                "[redis]\nconnect_timeout = \"soon\"\n",
                "redis.connect_timeout",
            ),
            ("store = \"redis://nohost\"\n", "store"),
        ] {
            let err = parse(text).unwrap().resolve(None, None, None).unwrap_err();
            assert!(format!("{err:#}").contains(key), "{text}: {err:#}");
        }
        let err = parse("[redis]\npartitions = 70000\n").unwrap_err();
        assert!(err.to_string().contains("partitions"), "{err}");
        let err = parse("[redis]\nnamespac = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("namespac"), "{err}");
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_REDIS_PARTITIONS").then(|| "many".into()))
            .unwrap_err();
        assert!(err.to_string().contains("redis.partitions"), "{err}");
        let mut file = parse("").unwrap();
        let err = file
            .apply_env(|var| (var == "BELFRY_REDIS_SUBSCRIBER_SHARDS").then(|| "-1".into()))
            .unwrap_err();
        assert!(err.to_string().contains("redis.subscriber_shards"), "{err}");
    }
}
