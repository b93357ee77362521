//! The broker a stream run starts on a free loopback port, and how to reach it.

use super::*;

/// A broker process this run started on a free loopback port; killed by its own child
/// handle (exactly this process) on drop.
pub struct Broker {
    pub kind: SinkKind,
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

/// The binary for `kind`: the flag, else (Kafka) `$TANSU_BIN`, else the usual name on PATH.
/// Fails with an install hint when it does not run.
pub fn broker_bin(kind: SinkKind, flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match (flag, kind) {
        (Some(path), _) => path.to_path_buf(),
        (None, SinkKind::Redis) => PathBuf::from("redis-server"),
        (None, SinkKind::Nats) => PathBuf::from("nats-server"),
        (None, SinkKind::Kafka) => std::env::var_os("TANSU_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("tansu")),
    };
    let runs = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        let hint = match kind {
            SinkKind::Redis => "apt-get install redis-server (scripts/redis.sh start installs it)",
            SinkKind::Nats => "apt-get install nats-server (scripts/nats.sh install)",
            SinkKind::Kafka => {
                "run `scripts/kafka.sh install` and set TANSU_BIN to the path it prints"
            }
        };
        bail!(
            "the {} broker {} is missing or does not run: {hint}",
            kind.name(),
            bin.display()
        );
    }
    Ok(bin)
}

impl Broker {
    pub async fn start(kind: SinkKind, flag: Option<&Path>) -> anyhow::Result<Broker> {
        let bin = broker_bin(kind, flag)?;
        let dir = tempfile::Builder::new()
            .prefix("belfry-bench-broker-")
            .tempdir()
            .context("create the broker's temp dir")?;
        let port = free_port().context("find a free port")?;
        let port_text = port.to_string();
        let mut command = Command::new(&bin);
        match kind {
            // Append-only with fsync every second: the usual production setting, as in
            // scripts/redis.sh.
            SinkKind::Redis => command
                .args(["--bind", "127.0.0.1", "--port", &port_text])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                ])
                .args(["--daemonize", "no", "--dir"])
                .arg(dir.path()),
            SinkKind::Nats => command
                .args(["-a", "127.0.0.1", "-p", &port_text, "-js", "-sd"])
                .arg(dir.path()),
            // Memory storage: the only engine the packaged Tansu has (scripts/kafka.sh).
            SinkKind::Kafka => {
                let listener = format!("tcp://127.0.0.1:{port}");
                command
                    .arg("broker")
                    .args(["--listener-url", &listener])
                    .args(["--advertised-listener-url", &listener])
                    .args(["--storage-engine", "memory://tansu/"])
                    .args(["--cluster-id", &format!("belfry-bench-{port}")])
            }
        };
        let log = std::fs::File::create(dir.path().join("broker.log"))
            .context("create the broker log")?;
        let log_err = log.try_clone().context("open the broker log")?;
        let child = command
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut broker = Broker {
            kind,
            port,
            child: Some(child),
            _dir: dir,
        };
        broker.wait_ready().await?;
        Ok(broker)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    bail!("the {} broker exited with {status}", self.kind.name());
                }
            }
            if self.answers().await {
                return Ok(());
            }
            if started.elapsed() > BROKER_READY_TIMEOUT {
                bail!(
                    "the {} broker did not answer within {BROKER_READY_TIMEOUT:?}",
                    self.kind.name()
                );
            }
            tokio::time::sleep(BROKER_READY_POLL).await;
        }
    }

    async fn answers(&self) -> bool {
        match self.kind {
            SinkKind::Redis => async {
                let client = redis::Client::open(self.url()).ok()?;
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .ok()
            }
            .await
            .is_some(),
            // Ready once JetStream answers, not only the client port.
            SinkKind::Nats => async {
                let client = async_nats::connect(self.url()).await.ok()?;
                let reply = client.request("$JS.API.INFO", "".into()).await.ok()?;
                reply.payload.starts_with(b"{").then_some(())
            }
            .await
            .is_some(),
            SinkKind::Kafka => async {
                let client = kafka_client(&self.url()).await.ok()?;
                client.list_topics().await.ok()
            }
            .await
            .is_some(),
        }
    }

    /// The address as the server's connection config and the clients want it.
    pub fn url(&self) -> String {
        match self.kind {
            SinkKind::Redis => format!("redis://127.0.0.1:{}/0", self.port),
            SinkKind::Nats => format!("nats://127.0.0.1:{}", self.port),
            SinkKind::Kafka => format!("127.0.0.1:{}", self.port),
        }
    }

    /// `BELFRY_CONNECTIONS__BENCH__*` for the spawned server.
    pub(super) fn server_env(&self) -> Vec<(String, String)> {
        let prefix = format!("BELFRY_CONNECTIONS__{}", CONNECTION.to_ascii_uppercase());
        let address_key = match self.kind {
            SinkKind::Kafka => "BROKERS",
            _ => "URL",
        };
        vec![
            (format!("{prefix}__TYPE"), self.kind.name().to_string()),
            (format!("{prefix}__{address_key}"), self.url()),
        ]
    }

    /// Creates what the stream sinks need to exist: a JetStream stream capturing the subject,
    /// a Kafka topic of one partition. Redis creates the stream on the first XADD.
    pub async fn prepare(&self, channel: &Channel) -> anyhow::Result<()> {
        match self.kind {
            SinkKind::Redis => Ok(()),
            SinkKind::Nats => {
                let client = async_nats::connect(self.url()).await?;
                async_nats::jetstream::new(client)
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: channel.nats_stream.clone(),
                        subjects: vec![channel.name.clone()],
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("create JetStream stream: {e}"))?;
                Ok(())
            }
            SinkKind::Kafka => {
                let client = kafka_client(&self.url()).await?;
                client
                    .controller_client()?
                    .create_topic(&channel.name, 1, 1, 5_000)
                    .await
                    .context("create the topic")?;
                let started = Instant::now();
                while !client
                    .list_topics()
                    .await
                    .is_ok_and(|t| t.iter().any(|t| t.name == channel.name))
                {
                    if started.elapsed() > BROKER_READY_TIMEOUT {
                        bail!("topic {} not in the metadata", channel.name);
                    }
                    tokio::time::sleep(BROKER_READY_POLL).await;
                }
                Ok(())
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL to exactly the child this run spawned; its data is a temp dir.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// TCP_NODELAY on this process's connections to the broker, as the Kafka sink sets it on its
/// own (see `belfry_sinks::kafka::nodelay`): the consumer's and the raw publisher's requests
/// are not held back by Nagle's algorithm either. Call once the partition client exists.
pub(super) async fn kafka_nodelay(broker: &str) {
    let peers = belfry_sinks::kafka::nodelay::broker_addrs(&[broker.to_string()]).await;
    belfry_sinks::kafka::nodelay::set_on_connections_to(&peers);
}

pub(super) async fn kafka_client(broker: &str) -> anyhow::Result<rskafka::client::Client> {
    Ok(
        rskafka::client::ClientBuilder::new(vec![broker.to_string()])
            .build()
            .await?,
    )
}
