//! The check a webhook gets when its queue is created or changed, and when the server starts
//! ([`crate::Sink::open`]): resolve the host under the target policy, then open a TCP
//! connection to it, within [`PROBE_TIMEOUT`].
//!
//! Only TCP: no TLS handshake and no HTTP request, since any request could make the receiver
//! act. So a certificate the client would refuse shows at the first delivery, not here. The
//! answer is reported (a warning on the queue's `PUT`, a log line at start-up), never a reason
//! to refuse the queue: a receiver may come up after its queue is made.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Url;
use tokio::sync::Semaphore;

use super::target::{host_ip, resolve_allowed};
use crate::retry::{classify_transport, TransportFailure};
use crate::{Outcome, SinkError, TargetPolicy};

/// Longest probe, resolving and connecting together: what the queue API waits for a target
/// to answer before it warns (its `OPEN_CHECK_MS`), so a probe ends with its own reason.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1_900);

/// Probes in flight at once, all webhook sinks together. At start-up every webhook queue is
/// probed: thousands of connections at once would take file descriptors the API listener
/// needs, and flood receivers shared by many queues.
const PROBES_IN_FLIGHT_MAX: usize = 32;

static PROBES: Semaphore = Semaphore::const_new(PROBES_IN_FLIGHT_MAX);

/// What a probe of `url` saw: `Delivered` when a TCP connection opened, `Retry` with why not
/// (a name that does not resolve, a refused or silent port), `Reject` when the host resolves
/// to an address `policy` forbids (every delivery would be dead-lettered alike).
pub(crate) async fn probe(url: &Url, policy: &TargetPolicy) -> Outcome {
    match tokio::time::timeout(PROBE_TIMEOUT, probe_unbounded(url, policy)).await {
        Ok(outcome) => outcome,
        Err(_) => classify_transport(
            TransportFailure::Timeout,
            &format!("no connection within {} ms", PROBE_TIMEOUT.as_millis()),
        ),
    }
}

async fn probe_unbounded(url: &Url, policy: &TargetPolicy) -> Outcome {
    // The semaphore is never closed, so this only waits.
    let Ok(_permit) = PROBES.acquire().await else {
        return classify_transport(TransportFailure::Connection, "probes are shut down");
    };
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default().unwrap_or(0);
    let addrs = match host_ip(host) {
        // Literals were checked against the policy when the sink was built.
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => match resolve_allowed(host, policy).await {
            Ok(addrs) => addrs
                .into_iter()
                .map(|addr| SocketAddr::new(addr.ip(), port))
                .collect(),
            Err(error @ SinkError::ForbiddenAddress { .. }) => {
                return classify_transport(TransportFailure::ForbiddenTarget, &error.to_string())
            }
            Err(error) => {
                return classify_transport(TransportFailure::Connection, &error.to_string())
            }
        },
    };
    connect_any(&addrs).await
}

/// Connects to the first of `addrs` that accepts, in order (as the HTTP client would), and
/// closes the connection at once.
async fn connect_any(addrs: &[SocketAddr]) -> Outcome {
    let mut last = String::from("no addresses");
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_stream) => return Outcome::Delivered,
            Err(error) => last = format!("could not connect to {addr}: {error}"),
        }
    }
    classify_transport(TransportFailure::Connection, &last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("test URLs parse")
    }

    #[tokio::test]
    async fn a_listening_port_answers_and_a_closed_one_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = listener.local_addr().expect("address");
        let allowed = TargetPolicy::ALLOW_PRIVATE;
        assert_eq!(
            probe(&url(&format!("http://{open}/hook")), &allowed).await,
            Outcome::Delivered
        );
        drop(listener);
        match probe(&url(&format!("http://{open}/hook")), &allowed).await {
            Outcome::Retry { reason, .. } => {
                assert!(
                    reason.contains(&format!("could not connect to {open}")),
                    "{reason}"
                )
            }
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_forbidden_address_is_refused() {
        match probe(&url("http://localhost:9/hook"), &TargetPolicy::default()).await {
            Outcome::Reject { reason } => assert!(
                reason.starts_with("forbidden target") && reason.contains("loopback"),
                "{reason}"
            ),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
}
