//! The Redis Cluster a run measures on: three masters the run starts through
//! `scripts/redis-cluster.sh` (and stops again), or nodes given on the command line.

use std::path::PathBuf;
use std::process::Command;

use crate::error::BenchError;

pub struct Cluster {
    /// `host:port` of every master.
    pub nodes: Vec<String>,
    /// The script and port that started it, to stop it at the end.
    script: Option<(PathBuf, u16)>,
}

impl Cluster {
    /// Uses `given` (comma-separated `host:port`) when set, else starts a cluster.
    pub fn start(
        given: Option<&str>,
        script: &std::path::Path,
        port: u16,
    ) -> Result<Self, BenchError> {
        if let Some(list) = given {
            let nodes: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
            if nodes.iter().any(String::is_empty) {
                return Err(BenchError::invalid(
                    "--redis-cluster",
                    "write host:port,host:port",
                ));
            }
            return Ok(Cluster {
                nodes,
                script: None,
            });
        }
        let out = Command::new("sh")
            .arg(script)
            .arg("start")
            .env("REDIS_CLUSTER_PORT", port.to_string())
            .output()
            .map_err(|e| BenchError::io("run", script, e))?;
        if !out.status.success() {
            return Err(BenchError::Server(format!(
                "{} start failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let nodes = stdout
            .lines()
            .find_map(|l| l.strip_prefix("REDIS_CLUSTER_NODES="))
            .map(|v| v.trim().split(',').map(str::to_string).collect::<Vec<_>>())
            .ok_or_else(|| {
                BenchError::Server(format!(
                    "{} printed no REDIS_CLUSTER_NODES",
                    script.display()
                ))
            })?;
        Ok(Cluster {
            nodes,
            script: Some((script.to_path_buf(), port)),
        })
    }

    /// The store URL for `belfry serve --store`.
    pub fn store_url(&self) -> String {
        format!("redis-cluster://{}", self.nodes.join(","))
    }

    fn each_master<T>(
        &self,
        what: &str,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<Vec<T>, BenchError> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let fail = |e: redis::RedisError| BenchError::Server(format!("{what} on {node}: {e}"));
            let client = redis::Client::open(format!("redis://{node}")).map_err(fail)?;
            let mut conn = client.get_connection().map_err(fail)?;
            out.push(f(&mut conn).map_err(fail)?);
        }
        Ok(out)
    }

    /// Empties every master, so each stage starts from the same empty cluster (and the
    /// finished tasks an earlier stage keeps for a minute do not expire during a memory
    /// measurement).
    pub fn flush(&self) -> Result<(), BenchError> {
        self.each_master("FLUSHALL", |c| redis::cmd("FLUSHALL").query::<()>(c))?;
        Ok(())
    }

    /// `used_memory` summed over the masters.
    pub fn used_memory(&self) -> Result<u64, BenchError> {
        let infos = self.each_master("INFO memory", |c| {
            redis::cmd("INFO").arg("memory").query::<String>(c)
        })?;
        let mut total = 0;
        for info in infos {
            let value = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| BenchError::Server("INFO memory without used_memory".into()))?;
            total += value;
        }
        Ok(total)
    }

    pub fn stop(self) {
        if let Some((script, port)) = &self.script {
            let _ = Command::new("sh")
                .arg(script)
                .arg("stop")
                .env("REDIS_CLUSTER_PORT", port.to_string())
                .output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_nodes_are_used_as_they_are() {
        let c = Cluster::start(Some("127.0.0.1:1,127.0.0.1:2"), "x".as_ref(), 0).unwrap();
        assert_eq!(c.store_url(), "redis-cluster://127.0.0.1:1,127.0.0.1:2");
        assert!(Cluster::start(Some("127.0.0.1:1,"), "x".as_ref(), 0).is_err());
    }
}
