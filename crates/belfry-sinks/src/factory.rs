//! Sinks from queue configuration: the [`SinkSpec`] a queue's `delivery` names, and the
//! [`SinkFactory`] the server is built with, which turns a spec into a running [`Sink`].
//!
//! The spec is the delivery configuration's own shape (serde, tagged by `type`), so the API,
//! the stored queue record and the sink agree on one definition. Tests inject their own
//! factory (a scripted sink for every spec); the binary uses [`StandardSinks`].
//!
//! Adding a sink: a folder with its spec struct and its `Sink`, one variant here, one arm in
//! [`StandardSinks::build`].

use std::sync::Arc;
use std::time::Duration;

use belfry_core::QueueName;
use serde::{Deserialize, Serialize};

use crate::webhook::{self, WebhookConfig, WebhookSink};
use crate::{Sink, SinkError, TargetPolicy};

/// Where a push queue's due tasks go: the queue's `delivery` object minus `"type": "pull"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkSpec {
    /// POST each task to a URL.
    Webhook(WebhookSpec),
}

impl SinkSpec {
    /// The spec's `type`, as in the API and in metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkSpec::Webhook(_) => "webhook",
        }
    }

    /// The spec as it may be shown (API answers, console, logs): secrets removed and URLs
    /// without credentials or query strings.
    pub fn redacted(&self) -> SinkSpec {
        match self {
            SinkSpec::Webhook(spec) => SinkSpec::Webhook(WebhookSpec {
                url: webhook::redact_url_text(&spec.url),
                secret: None,
                timeout_ms: spec.timeout_ms,
            }),
        }
    }

    /// Whether the spec holds a secret that [`SinkSpec::redacted`] leaves out.
    pub fn has_secret(&self) -> bool {
        match self {
            SinkSpec::Webhook(spec) => spec.secret.is_some(),
        }
    }

    /// How long one delivery may take at most (the dispatcher's lease covers it).
    pub fn timeout(&self) -> Duration {
        match self {
            SinkSpec::Webhook(spec) => Duration::from_millis(spec.timeout_ms),
        }
    }
}

/// `{"type": "webhook", "url": "...", "secret": "...", "timeout_ms": 10000}`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default = "webhook_timeout_ms_default")]
    pub timeout_ms: u64,
}

fn webhook_timeout_ms_default() -> u64 {
    webhook::TIMEOUT_DEFAULT.as_millis() as u64
}

impl WebhookSpec {
    pub fn new(url: impl Into<String>) -> Self {
        WebhookSpec {
            url: url.into(),
            secret: None,
            timeout_ms: webhook_timeout_ms_default(),
        }
    }
}

/// Never prints the secret or the URL's credentials.
impl std::fmt::Debug for WebhookSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSpec")
            .field("url", &webhook::redact_url_text(&self.url))
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// Builds sinks from specs. `build` validates without connecting, so the server calls it when
/// a queue is created (a bad spec is a 400) and again whenever the queue's dispatch starts.
pub trait SinkFactory: Send + Sync + 'static {
    fn build(&self, queue: &QueueName, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError>;
}

/// The production factory: webhooks through one shared HTTP client (one connection pool per
/// target host), guarded by the server's target policy.
pub struct StandardSinks {
    policy: TargetPolicy,
    webhook_client: reqwest::Client,
}

impl StandardSinks {
    /// `idle_per_target` is how many idle connections the HTTP client keeps per host: the
    /// dispatcher's per-target in-flight cap, so connections are reused rather than churned.
    pub fn new(policy: TargetPolicy, idle_per_target: usize) -> Result<Self, SinkError> {
        let webhook_client = webhook::target::try_client_with_pool(&policy, idle_per_target)?;
        Ok(StandardSinks {
            policy,
            webhook_client,
        })
    }
}

impl SinkFactory for StandardSinks {
    fn build(&self, _queue: &QueueName, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        match spec {
            SinkSpec::Webhook(spec) => {
                let config = WebhookConfig {
                    url: spec.url.clone(),
                    secret: spec.secret.clone(),
                    timeout: Duration::from_millis(spec.timeout_ms),
                };
                let sink = WebhookSink::new(config, self.policy, self.webhook_client.clone())?;
                Ok(Arc::new(sink))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_spec_reads_the_delivery_object_and_defaults_the_timeout() {
        let spec: SinkSpec =
            serde_json_lite(r#"{"type":"webhook","url":"https://example.com/h"}"#).unwrap();
        assert_eq!(
            spec,
            SinkSpec::Webhook(WebhookSpec::new("https://example.com/h"))
        );
        assert_eq!(spec.timeout(), webhook::TIMEOUT_DEFAULT);
        assert!(
            serde_json_lite(r#"{"type":"webhook","url":"https://x","colour":1}"#).is_err(),
            "unknown fields are refused"
        );
        assert!(serde_json_lite(r#"{"type":"carrier_pigeon"}"#).is_err());
    }

    #[test]
    fn redacted_drops_secrets_and_url_credentials() {
        let spec = SinkSpec::Webhook(WebhookSpec {
            url: "https://user:pw@example.com/h?token=t".into(),
            secret: Some("s3cret".into()),
            timeout_ms: 500,
        });
        assert!(spec.has_secret());
        let shown = spec.redacted();
        let SinkSpec::Webhook(shown) = shown;
        assert_eq!(shown.secret, None);
        assert!(!shown.url.contains("pw") && !shown.url.contains("token=t"));
        assert!(!format!("{spec:?}").contains("s3cret"));
    }

    fn serde_json_lite(text: &str) -> Result<SinkSpec, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}
