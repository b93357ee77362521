//! Where the store lives: `--store redis://host:port` (one Redis) or
//! `--store redis-cluster://host:port,host:port,…` (a cluster, any of its nodes as seeds;
//! `redis-cluster://user:password@host:port,…` when its nodes require a password).

use std::fmt;

/// A parsed `--store` URL of the Redis kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server: the URL as the `redis` crate takes it (`redis://[user:pass@]host:port[/db]`).
    Single(String),
    /// A Redis Cluster: seed nodes as `redis://host:port` URLs.
    Cluster(Vec<String>),
}

/// Why a `--store` URL is not one belfry can use, in words that say what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url:?}: {reason}")]
pub struct TargetError {
    pub url: String,
    pub reason: String,
}

impl RedisTarget {
    /// Whether `url` names a Redis store at all (so the caller can try other kinds first).
    pub fn is_redis_url(url: &str) -> bool {
        url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("redis-cluster://")
    }

    pub fn parse(url: &str) -> Result<RedisTarget, TargetError> {
        let fail = |reason: &str| TargetError {
            url: redact(url),
            reason: reason.to_owned(),
        };
        if url.starts_with("rediss://") {
            return Err(fail(
                "TLS to the store's Redis is not supported yet; use redis:// (plain TCP, on a \
                 network you trust)",
            ));
        }
        if let Some(rest) = url.strip_prefix("redis-cluster://") {
            // Credentials, if any, come once, before the first node, and hold for every node
            // (the client requires the same on all of them).
            let (auth, rest) = match rest.split_once('@') {
                Some((auth, nodes)) if !auth.contains(',') => (format!("{auth}@"), nodes),
                _ => (String::new(), rest),
            };
            let mut nodes = Vec::new();
            for node in rest.split(',') {
                let node = node.trim();
                if node.is_empty() {
                    return Err(fail(
                        "an empty node in the list; write redis-cluster://host:port,host:port",
                    ));
                }
                if node.contains('@') {
                    return Err(fail(
                        "credentials go once, before the first node: redis-cluster://user:password@host:port,host:port",
                    ));
                }
                check_host_port(node).map_err(|reason| fail(&reason))?;
                let node_url = format!("redis://{auth}{node}");
                redis::parse_redis_url(&node_url)
                    .ok_or_else(|| fail("not a URL the Redis client can parse"))?;
                nodes.push(node_url);
            }
            return Ok(RedisTarget::Cluster(nodes));
        }
        let Some(rest) = url.strip_prefix("redis://") else {
            return Err(fail(
                "expected redis://host:port for one Redis or redis-cluster://host:port,host:port for a cluster",
            ));
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let host_port = authority.rsplit('@').next().unwrap_or_default();
        if host_port.contains(',') {
            return Err(fail(
                "several nodes after redis://; a cluster is written redis-cluster://host:port,host:port",
            ));
        }
        check_host_port(host_port).map_err(|reason| fail(&reason))?;
        redis::parse_redis_url(url).ok_or_else(|| fail("not a URL the Redis client can parse"))?;
        Ok(RedisTarget::Single(url.to_owned()))
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// A cluster's `user:password` (or `:password`), which every node takes: the store's own
    /// connections to the masters it discovers need them as much as the seeds do.
    pub(crate) fn credentials(&self) -> Option<&str> {
        let RedisTarget::Cluster(nodes) = self else {
            return None;
        };
        let rest = nodes.first()?.strip_prefix("redis://")?;
        rest.rsplit_once('@').map(|(auth, _)| auth)
    }
}

fn check_host_port(node: &str) -> Result<(), String> {
    let Some((host, port)) = node.rsplit_once(':') else {
        return Err(format!(
            "{node:?} has no port; write host:port, such as 127.0.0.1:6379"
        ));
    };
    if host.is_empty() {
        return Err(format!(
            "{node:?} has no host; write host:port, such as 127.0.0.1:6379"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!(
            "{node:?}: the port must be a number from 1 to 65535"
        )),
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.write_str(&redact(url)),
            RedisTarget::Cluster(nodes) => {
                let auth = if self.credentials().is_some() {
                    "***@"
                } else {
                    ""
                };
                let nodes: Vec<&str> = nodes
                    .iter()
                    .map(|n| n.strip_prefix("redis://").unwrap_or(n))
                    .map(|n| n.rsplit('@').next().unwrap_or(n))
                    .collect();
                write!(f, "redis-cluster://{auth}{}", nodes.join(","))
            }
        }
    }
}

/// The URL without its password, for logs.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}***{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_cluster() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379").unwrap(),
            RedisTarget::Single("redis://127.0.0.1:6379".into())
        );
        assert_eq!(
            RedisTarget::parse("redis-cluster://127.0.0.1:7001, 127.0.0.1:7002").unwrap(),
            RedisTarget::Cluster(vec![
                "redis://127.0.0.1:7001".into(),
                "redis://127.0.0.1:7002".into()
            ])
        );
    }

    #[test]
    fn malformed_urls_say_what_to_write() {
        for (url, says) in [
            ("redis://", "no port"),
            ("redis://localhost", "no port"),
            ("redis://:6379", "no host"),
            ("redis://h:0", "1 to 65535"),
            ("redis://h:99999", "1 to 65535"),
            ("redis://a:1,b:2", "redis-cluster://"),
            ("redis-cluster://", "empty node"),
            ("redis-cluster://a:1,,b:2", "empty node"),
            ("redis-cluster://a", "no port"),
            ("http://a:1", "expected redis://"),
            (
                "rediss://a:1",
                "TLS to the store's Redis is not supported yet",
            ),
        ] {
            let error = RedisTarget::parse(url).unwrap_err().to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
        let error = RedisTarget::parse("rediss://user:secret@a:1")
            .unwrap_err()
            .to_string();
        assert!(
            !error.contains("secret"),
            "the password is not shown: {error}"
        );
    }

    #[test]
    fn display_hides_the_password() {
        let target = RedisTarget::parse("redis://user:secret@127.0.0.1:6379").unwrap();
        assert_eq!(target.to_string(), "redis://***@127.0.0.1:6379");
        let cluster =
            RedisTarget::parse("redis-cluster://:secret@10.0.0.1:7001,10.0.0.2:7002").unwrap();
        assert_eq!(
            cluster.to_string(),
            "redis-cluster://***@10.0.0.1:7001,10.0.0.2:7002"
        );
    }

    /// Credentials written once before the first node hold for every node.
    #[test]
    fn cluster_credentials_hold_for_every_node() {
        let target =
            RedisTarget::parse("redis-cluster://app:s3cret@10.0.0.1:7001,10.0.0.2:7002").unwrap();
        assert_eq!(
            target,
            RedisTarget::Cluster(vec![
                "redis://app:s3cret@10.0.0.1:7001".into(),
                "redis://app:s3cret@10.0.0.2:7002".into()
            ])
        );
        assert_eq!(target.credentials(), Some("app:s3cret"));
        let plain = RedisTarget::parse("redis-cluster://10.0.0.1:7001").unwrap();
        assert_eq!(plain.credentials(), None);
        let error = RedisTarget::parse("redis-cluster://10.0.0.1:7001,app:pw@10.0.0.2:7002")
            .unwrap_err()
            .to_string();
        assert!(error.contains("before the first node"), "{error}");
    }
}
