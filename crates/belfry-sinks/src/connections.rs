//! Broker connections the operator declares in the server config (`[connections.NAME]`).
//!
//! A queue's delivery names one of them (`"connection": "main"`); the API never carries a
//! broker address or a credential. [`Connections`] is the registry the server builds at start
//! and hands to [`crate::StandardSinks`]; [`ConnectionSpec::validate`] checks one entry, and
//! every message names the key to change. Credentials never leave this module in text: the
//! `Debug` impls print `<redacted>` and [`ConnectionSpec::endpoint`] shows hosts only.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Longest connection name. Names appear in every delivery's spec and in metrics labels.
pub const CONNECTION_NAME_LEN_MAX: usize = 64;
/// Longest broker URL (as for webhook URLs).
pub const CONNECTION_URL_LEN_MAX: usize = 2048;
/// Most bootstrap brokers for one Kafka connection; a client needs only a few to find the rest.
pub const KAFKA_BROKERS_MAX: usize = 64;

/// Which system a connection reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionKind {
    Redis,
    Nats,
    Kafka,
}

impl ConnectionKind {
    /// The config's `type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionKind::Redis => "redis",
            ConnectionKind::Nats => "nats",
            ConnectionKind::Kafka => "kafka",
        }
    }

    /// Parses the config's `type` value.
    pub fn parse(text: &str) -> Option<ConnectionKind> {
        match text {
            "redis" => Some(ConnectionKind::Redis),
            "nats" => Some(ConnectionKind::Nats),
            "kafka" => Some(ConnectionKind::Kafka),
            _ => None,
        }
    }
}

impl fmt::Display for ConnectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// TLS settings of one connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// Require TLS (also implied by `rediss://` and `tls://` URLs).
    pub enabled: bool,
    /// A PEM file of CA certificates to trust in addition to the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// One `[connections.NAME]` entry.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionSpec {
    pub kind: ConnectionKind,
    /// `redis://host:port/db` (`rediss://` for TLS) or `nats://host:port` (`tls://` for TLS;
    /// several NATS servers separated by commas).
    /// Unused for Kafka.
    pub url: Option<String>,
    /// Kafka bootstrap brokers, `host:port` each. Unused for Redis and NATS.
    pub brokers: Vec<String>,
    /// Username and password (Redis ACL user, NATS user, Kafka SASL by `sasl_mechanism`).
    pub username: Option<String>,
    pub password: Option<String>,
    /// A NATS token (instead of a username and password).
    pub token: Option<String>,
    /// Kafka SASL mechanism for the username and password: `PLAIN` (the default),
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512` (see [`KafkaSaslMechanism`]).
    pub sasl_mechanism: Option<String>,
    pub tls: TlsOptions,
}

/// How a Kafka connection proves its username and password (SASL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KafkaSaslMechanism {
    /// The password travels as is (use with TLS).
    #[default]
    Plain,
    ScramSha256,
    ScramSha512,
}

impl KafkaSaslMechanism {
    /// The names the config's `sasl_mechanism` takes.
    pub const NAMES: [&'static str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

    /// Parses the config's `sasl_mechanism` (Kafka's names for the mechanisms).
    pub fn parse(text: &str) -> Option<KafkaSaslMechanism> {
        match text {
            "PLAIN" => Some(KafkaSaslMechanism::Plain),
            "SCRAM-SHA-256" => Some(KafkaSaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Some(KafkaSaslMechanism::ScramSha512),
            _ => None,
        }
    }
}

impl ConnectionSpec {
    /// A connection of `kind` at `url` (Redis, NATS) without credentials or TLS.
    pub fn url(kind: ConnectionKind, url: impl Into<String>) -> Self {
        ConnectionSpec {
            kind,
            url: Some(url.into()),
            brokers: Vec::new(),
            username: None,
            password: None,
            token: None,
            sasl_mechanism: None,
            tls: TlsOptions::default(),
        }
    }

    /// A Kafka connection through these bootstrap brokers.
    pub fn kafka(brokers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        ConnectionSpec {
            kind: ConnectionKind::Kafka,
            url: None,
            brokers: brokers.into_iter().map(Into::into).collect(),
            username: None,
            password: None,
            token: None,
            sasl_mechanism: None,
            tls: TlsOptions::default(),
        }
    }

    /// Checks the entry; `name` is its name, so messages can say `connections.NAME.url`.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        validate_name(name)?;
        let key = |field: &str| format!("connections.{name}.{field}");
        self.validate_credentials(&key)?;
        match self.kind {
            ConnectionKind::Redis | ConnectionKind::Nats => self.validate_url(&key)?,
            ConnectionKind::Kafka => {
                self.validate_brokers(&key)?;
                self.validate_kafka_security(&key)?;
            }
        }
        self.validate_ca_file(&key)?;
        if self.sasl_mechanism.is_some() && self.kind != ConnectionKind::Kafka {
            return Err(format!(
                "{}: only kafka connections take a SASL mechanism",
                key("sasl_mechanism")
            ));
        }
        Ok(())
    }

    /// A password needs a username (except on Redis), and on NATS a username needs a password
    /// (a username alone was accepted, then the connection made with no credentials at all;
    /// Kafka's SASL check says the same, `validate_kafka_security`); a token is for NATS, and
    /// alone.
    fn validate_credentials(&self, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        if self.password.is_some() && self.username.is_none() && self.kind != ConnectionKind::Redis
        {
            return Err(format!("{}: a password needs a username", key("password")));
        }
        if self.username.is_some() && self.password.is_none() && self.kind == ConnectionKind::Nats {
            return Err(format!(
                "{}: a username needs a password (a nats connection sends both or neither)",
                key("username")
            ));
        }
        if self.token.is_some() && self.kind != ConnectionKind::Nats {
            return Err(format!(
                "{}: only nats connections take a token",
                key("token")
            ));
        }
        if self.token.is_some() && self.username.is_some() {
            return Err(format!(
                "{}: give either a token or a username and password, not both",
                key("token")
            ));
        }
        Ok(())
    }

    /// Redis and NATS: one `url` (NATS: a comma-separated list) with the kind's schemes, and
    /// no `brokers`.
    fn validate_url(&self, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        if !self.brokers.is_empty() {
            return Err(format!(
                "{}: only kafka connections take brokers; use url",
                key("brokers")
            ));
        }
        let Some(url) = &self.url else {
            return Err(format!(
                "{}: required for a {} connection",
                key("url"),
                self.kind
            ));
        };
        if url.is_empty() || url.len() > CONNECTION_URL_LEN_MAX {
            return Err(format!(
                "{}: must be 1 to {CONNECTION_URL_LEN_MAX} bytes long",
                key("url")
            ));
        }
        let schemes: &[&str] = match self.kind {
            ConnectionKind::Redis => &["redis://", "rediss://"],
            _ => &["nats://", "tls://"],
        };
        for part in url.split(',') {
            if !schemes.iter().any(|s| part.trim().starts_with(s)) {
                return Err(format!(
                    "{}: expected a URL starting with {}, got {:?}",
                    key("url"),
                    schemes.join(" or "),
                    self.endpoint()
                ));
            }
        }
        Ok(())
    }

    /// Kafka: 1 to `KAFKA_BROKERS_MAX` `host:port` brokers, and no `url`.
    fn validate_brokers(&self, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        if self.url.is_some() {
            return Err(format!(
                "{}: kafka connections take brokers = [\"host:port\", ...] instead",
                key("url")
            ));
        }
        if self.brokers.is_empty() || self.brokers.len() > KAFKA_BROKERS_MAX {
            return Err(format!(
                "{}: list 1 to {KAFKA_BROKERS_MAX} brokers as \"host:port\"",
                key("brokers")
            ));
        }
        for broker in &self.brokers {
            let port_ok = broker
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok || broker.contains('/') || broker.contains('@') {
                return Err(format!(
                    "{}: expected \"host:port\", got {broker:?}",
                    key("brokers")
                ));
            }
        }
        Ok(())
    }

    /// A CA file only with TLS, and one that reads as PEM certificates.
    fn validate_ca_file(&self, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        let Some(ca_file) = &self.tls.ca_file else {
            return Ok(());
        };
        if !self.uses_tls() {
            let or_url = match self.kind {
                ConnectionKind::Redis => " (or use a rediss:// URL)",
                ConnectionKind::Nats => " (or use tls:// URLs)",
                ConnectionKind::Kafka => "",
            };
            return Err(format!(
                "{}: set tls.enabled = true{or_url} to use a CA file",
                key("tls.ca_file"),
            ));
        }
        crate::trust::read_ca_file(ca_file)
            .map_err(|error| format!("{}: {error}", key("tls.ca_file")))?;
        Ok(())
    }

    /// Whether the connection is made over TLS: `tls.enabled`, or a `rediss://` (Redis) or
    /// `tls://` (NATS) URL.
    pub fn uses_tls(&self) -> bool {
        let scheme = match self.kind {
            ConnectionKind::Redis => "rediss://",
            ConnectionKind::Nats => "tls://",
            ConnectionKind::Kafka => return self.tls.enabled,
        };
        self.tls.enabled
            || self
                .url
                .as_deref()
                .is_some_and(|url| url.split(',').any(|part| part.trim().starts_with(scheme)))
    }

    /// The Kafka entry's SASL and TLS keys. The CA file is read here, so a missing or broken
    /// file stops the server at start instead of failing every delivery.
    fn validate_kafka_security(&self, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        if self.username.is_some() && self.password.is_none() {
            return Err(format!(
                "{}: required with a username (Kafka SASL)",
                key("password")
            ));
        }
        if let Some(mechanism) = &self.sasl_mechanism {
            if KafkaSaslMechanism::parse(mechanism).is_none() {
                return Err(format!(
                    "{}: expected one of {}, got {mechanism:?}",
                    key("sasl_mechanism"),
                    KafkaSaslMechanism::NAMES.join(", ")
                ));
            }
            if self.username.is_none() {
                return Err(format!(
                    "{}: needs a username and password",
                    key("sasl_mechanism")
                ));
            }
        }
        // A CA file without tls.enabled is refused for every kind in `validate`.
        if self.tls.enabled {
            #[cfg(feature = "kafka")]
            crate::kafka::tls::client_config(self.tls.ca_file.as_deref())
                .map_err(|error| format!("{}: {error}", key("tls.ca_file")))?;
            #[cfg(not(feature = "kafka"))]
            return Err(format!(
                "{}: this build has no Kafka sink (feature \"kafka\")",
                key("tls")
            ));
        }
        Ok(())
    }

    /// The Kafka SASL mechanism (PLAIN when the entry names none or an unknown one; the
    /// latter never passes [`ConnectionSpec::validate`]).
    pub fn kafka_sasl_mechanism(&self) -> KafkaSaslMechanism {
        self.sasl_mechanism
            .as_deref()
            .and_then(KafkaSaslMechanism::parse)
            .unwrap_or_default()
    }

    /// Where the connection goes, as it may be logged: hosts and ports, never credentials.
    pub fn endpoint(&self) -> String {
        match self.kind {
            ConnectionKind::Kafka => self.brokers.join(","),
            _ => self
                .url
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(|part| strip_userinfo(part.trim()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Whether the entry carries a credential.
    pub fn has_secret(&self) -> bool {
        self.password.is_some()
            || self.token.is_some()
            || self.url.as_deref().is_some_and(|u| u.contains('@'))
    }
}

/// `scheme://user:pw@host:port/x` → `scheme://host:port/x`; query strings dropped.
pub(crate) fn strip_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("", url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if scheme.is_empty() {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

/// Never prints the password, the token, nor credentials inside the URL.
impl fmt::Debug for ConnectionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |set: bool| if set { Some("<redacted>") } else { None };
        f.debug_struct("ConnectionSpec")
            .field("kind", &self.kind)
            .field("endpoint", &self.endpoint())
            .field("username", &self.username)
            .field("password", &redacted(self.password.is_some()))
            .field("token", &redacted(self.token.is_some()))
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The declared connections, by name. Empty by default (a server with webhooks only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connections {
    by_name: BTreeMap<String, ConnectionSpec>,
}

impl Connections {
    /// No connections: only webhook (and pull) queues can be made.
    pub fn empty() -> Self {
        Connections::default()
    }

    /// Adds (or replaces) `name` after checking it.
    pub fn insert(&mut self, name: impl Into<String>, spec: ConnectionSpec) -> Result<(), String> {
        let name = name.into();
        spec.validate(&name)?;
        self.by_name.insert(name, spec);
        Ok(())
    }

    /// Adds `name`, for tests and builders; panics on an invalid entry (a bug in the caller).
    pub fn with(mut self, name: &str, spec: ConnectionSpec) -> Self {
        if let Err(error) = self.insert(name, spec) {
            panic!("invalid connection {name}: {error}");
        }
        self
    }

    pub fn get(&self, name: &str) -> Option<&ConnectionSpec> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }
}

/// A connection's name: 1 to `CONNECTION_NAME_LEN_MAX` letters, digits, '_' or '-'.
fn validate_name(name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= CONNECTION_NAME_LEN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if fits {
        return Ok(());
    }
    Err(format!(
        "connections.{name}: a connection name is 1 to {CONNECTION_NAME_LEN_MAX} letters, digits, '_' or '-'"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        let check = |name: &str, spec: ConnectionSpec, needle: Option<&str>| match (
            spec.validate(name),
            needle,
        ) {
            (Ok(()), None) => {}
            (Err(error), Some(needle)) => assert!(error.contains(needle), "{error}"),
            (got, _) => panic!("{name}: got {got:?}, expected {needle:?}"),
        };
        use ConnectionKind::*;
        check(
            "main",
            ConnectionSpec::url(Redis, "redis://127.0.0.1:6379/0"),
            None,
        );
        check(
            "ev",
            ConnectionSpec::url(Nats, "nats://a:4222,nats://b:4222"),
            None,
        );
        check("k", ConnectionSpec::kafka(["127.0.0.1:9092"]), None);
        check(
            "bad name",
            ConnectionSpec::url(Redis, "redis://x"),
            Some("connections.bad name"),
        );
        check(
            "m",
            ConnectionSpec::url(Redis, "http://x"),
            Some("connections.m.url"),
        );
        check(
            "m",
            ConnectionSpec::url(Nats, "redis://x"),
            Some("connections.m.url"),
        );
        check(
            "k",
            ConnectionSpec::kafka(Vec::<String>::new()),
            Some("connections.k.brokers"),
        );
        check(
            "k",
            ConnectionSpec::kafka(["nohost"]),
            Some("connections.k.brokers"),
        );
        check(
            "k",
            ConnectionSpec::kafka(["h:99999"]),
            Some("connections.k.brokers"),
        );
        let mut token_on_redis = ConnectionSpec::url(Redis, "redis://x");
        token_on_redis.token = Some("t".into());
        check("r", token_on_redis, Some("connections.r.token"));
        check(
            "r",
            ConnectionSpec::url(Redis, "rediss://redis.example.com:6380/0"),
            None,
        );
        let mut ca_without_tls = ConnectionSpec::url(Redis, "redis://x");
        ca_without_tls.tls.ca_file = Some("/nonexistent/ca.pem".into());
        check("r", ca_without_tls.clone(), Some("set tls.enabled = true"));
        ca_without_tls.tls.enabled = true;
        check(
            "r",
            ca_without_tls.clone(),
            Some("connections.r.tls.ca_file: cannot read"),
        );
        ca_without_tls.kind = Nats;
        ca_without_tls.url = Some("tls://x:4222".into());
        ca_without_tls.tls.enabled = false;
        check(
            "n",
            ca_without_tls,
            Some("connections.n.tls.ca_file: cannot read"),
        );
        let mut kafka_password_only = ConnectionSpec::kafka(["h:1"]);
        kafka_password_only.password = Some("p".into());
        check("k", kafka_password_only, Some("connections.k.password"));
        // A NATS username alone was taken, and the connection made with no credentials.
        let mut nats_user_only = ConnectionSpec::url(Nats, "nats://x:4222");
        nats_user_only.username = Some("u".into());
        check("n", nats_user_only.clone(), Some("connections.n.username"));
        nats_user_only.password = Some("p".into());
        check("n", nats_user_only, None);
        let mut kafka_user_only = ConnectionSpec::kafka(["h:1"]);
        kafka_user_only.username = Some("u".into());
        check(
            "k",
            kafka_user_only,
            Some("connections.k.password: required with a username"),
        );
    }

    #[test]
    fn debug_and_endpoint_hide_credentials() {
        let mut spec = ConnectionSpec::url(ConnectionKind::Redis, "redis://u:hunter2@h:1/0?x=y");
        spec.password = Some("swordfish".into());
        let mut nats = ConnectionSpec::url(ConnectionKind::Nats, "nats://tok@h:4222");
        nats.token = Some("sekrit".into());
        for text in [format!("{spec:?}"), spec.endpoint(), format!("{nats:?}")] {
            for secret in ["hunter2", "swordfish", "sekrit", "tok@"] {
                assert!(!text.contains(secret), "{text}");
            }
        }
        assert_eq!(spec.endpoint(), "redis://h:1/0");
        assert!(spec.has_secret() && nats.has_secret());
    }
}
