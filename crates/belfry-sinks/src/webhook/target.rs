//! Which webhook targets are allowed: the guard against server-side request forgery (SSRF).
//!
//! A queue's webhook URL is chosen by whoever may configure queues, and belfry then makes
//! requests from inside the network it runs in. Without a guard, that person could make
//! belfry POST to a cloud metadata endpoint, an admin port on localhost or a database on the
//! private network. So, unless [`TargetPolicy::allow_private`] is set, only globally routable
//! unicast addresses are allowed, and the check happens twice:
//!
//! 1. when the URL is configured ([`validate_webhook_url`], no DNS; [`check_webhook_target`]
//!    also resolves the host), so a bad queue config is refused with a clear message;
//! 2. at every connection, in the HTTP client's DNS resolver ([`client_for`]), because a host
//!    name can resolve to a public address when checked and to 127.0.0.1 a second later (DNS
//!    rebinding). IP-literal URLs never reach a resolver, so they are checked in step 1 only,
//!    which is enough: a literal cannot change.
//!
//! Redirects are never followed (a 3xx is a rejection), since a redirect could lead to an
//! address the guard never saw, and proxies from the environment are ignored for the same
//! reason.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

use crate::SinkError;

/// Longest webhook URL accepted (2 KiB): ample for any real endpoint, and it bounds what a
/// queue config stores and what logs may print.
pub const WEBHOOK_URL_LEN_MAX: usize = 2048;

/// Where webhooks may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TargetPolicy {
    /// Allow private, loopback, link-local and other non-public targets. Off by default; turn
    /// it on for deployments whose receivers live on the same private network (and in tests).
    pub allow_private: bool,
}

impl TargetPolicy {
    /// The default: public targets only.
    pub const PUBLIC_ONLY: TargetPolicy = TargetPolicy {
        allow_private: false,
    };
    /// Everything allowed.
    pub const ALLOW_PRIVATE: TargetPolicy = TargetPolicy {
        allow_private: true,
    };

    /// Why `ip` is refused under this policy, or `None` when it is allowed.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        if self.allow_private {
            None
        } else {
            non_public_range(ip)
        }
    }
}

/// One special-purpose IPv4 block (IANA special-purpose registry, RFC 6890 and successors).
struct Block4 {
    network: u32,
    prefix: u32,
    name: &'static str,
}

const fn block4(a: u8, b: u8, c: u8, d: u8, prefix: u32, name: &'static str) -> Block4 {
    Block4 {
        network: u32::from_be_bytes([a, b, c, d]),
        prefix,
        name,
    }
}

/// IPv4 blocks that are not reachable public unicast. Globally routable special blocks that a
/// webhook could legitimately use (none in practice) are left out on purpose only when they
/// are truly public; everything else a receiver cannot sensibly live on is refused.
const IPV4_REFUSED: &[Block4] = &[
    block4(0, 0, 0, 0, 8, "a \"this network\" address (0.0.0.0/8)"),
    block4(10, 0, 0, 0, 8, "a private address (10.0.0.0/8)"),
    block4(
        100,
        64,
        0,
        0,
        10,
        "a carrier-grade NAT address (100.64.0.0/10)",
    ),
    block4(127, 0, 0, 0, 8, "a loopback address (127.0.0.0/8)"),
    block4(
        169,
        254,
        0,
        0,
        16,
        "a link-local address (169.254.0.0/16, includes cloud metadata endpoints)",
    ),
    block4(172, 16, 0, 0, 12, "a private address (172.16.0.0/12)"),
    block4(
        192,
        0,
        0,
        0,
        24,
        "an IETF protocol assignment (192.0.0.0/24)",
    ),
    block4(192, 0, 2, 0, 24, "a documentation address (192.0.2.0/24)"),
    block4(
        192,
        88,
        99,
        0,
        24,
        "a 6to4 relay anycast address (192.88.99.0/24)",
    ),
    block4(192, 168, 0, 0, 16, "a private address (192.168.0.0/16)"),
    block4(198, 18, 0, 0, 15, "a benchmarking address (198.18.0.0/15)"),
    block4(
        198,
        51,
        100,
        0,
        24,
        "a documentation address (198.51.100.0/24)",
    ),
    block4(
        203,
        0,
        113,
        0,
        24,
        "a documentation address (203.0.113.0/24)",
    ),
    block4(224, 0, 0, 0, 4, "a multicast address (224.0.0.0/4)"),
    block4(
        240,
        0,
        0,
        0,
        4,
        "a reserved or broadcast address (240.0.0.0/4)",
    ),
];

fn ipv4_refusal(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    IPV4_REFUSED
        .iter()
        .find(|block| {
            let mask = u32::MAX << (32 - block.prefix);
            bits & mask == block.network
        })
        .map(|block| block.name)
}

/// One special-purpose IPv6 block.
struct Block6 {
    network: u128,
    prefix: u32,
    name: &'static str,
}

const fn block6(network: u128, prefix: u32, name: &'static str) -> Block6 {
    Block6 {
        network,
        prefix,
        name,
    }
}

/// IPv6 blocks inside global unicast (2000::/3) that are still not public targets. Everything
/// outside 2000::/3 is refused anyway, after the forms that embed an IPv4 address are unwrapped.
const IPV6_REFUSED_IN_GLOBAL: &[Block6] = &[
    block6(0x2001_0000 << 96, 32, "a Teredo tunnel address (2001::/32)"),
    block6(
        0x2001_0db8 << 96,
        32,
        "a documentation address (2001:db8::/32)",
    ),
    block6(
        0x2001_0000 << 96,
        23,
        "an IETF protocol assignment (2001::/23)",
    ),
    block6(0x3fff << 112, 20, "a documentation address (3fff::/20)"),
    block6(0x5f00 << 112, 16, "a segment routing address (5f00::/16)"),
];

fn in_block6(bits: u128, network: u128, prefix: u32) -> bool {
    let mask = u128::MAX << (128 - prefix);
    bits & mask == network
}

fn ipv6_refusal(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some("the unspecified address (::)");
    }
    if ip.is_loopback() {
        return Some("a loopback address (::1)");
    }
    // IPv4-mapped (::ffff:a.b.c.d): a dual-stack socket connects to the IPv4 address itself.
    if in_block6(bits, 0xffff << 32, 96) {
        return ipv4_refusal(Ipv4Addr::from(bits as u32))
            .map(|_| "an IPv4-mapped IPv6 address of a non-public IPv4 address (::ffff:0:0/96)");
    }
    // NAT64 (64:ff9b::/96) reaches the embedded IPv4 address through a translator.
    if in_block6(bits, 0x0064_ff9b << 96, 96) {
        return ipv4_refusal(Ipv4Addr::from(bits as u32))
            .map(|_| "a NAT64 address of a non-public IPv4 address (64:ff9b::/96)");
    }
    // 6to4 (2002::/16) embeds the IPv4 address of the tunnel end in bits 16..48.
    if in_block6(bits, 0x2002 << 112, 16) {
        return ipv4_refusal(Ipv4Addr::from((bits >> 80) as u32))
            .map(|_| "a 6to4 address of a non-public IPv4 address (2002::/16)");
    }
    if in_block6(bits, 0, 96) {
        return Some("a deprecated IPv4-compatible address (::/96)");
    }
    if in_block6(bits, 0x0064_ff9b_0001 << 80, 48) {
        return Some("a local-use NAT64 address (64:ff9b:1::/48)");
    }
    if in_block6(bits, 0x0100 << 112, 64) {
        return Some("a discard-only address (100::/64)");
    }
    if in_block6(bits, 0xfc00 << 112, 7) {
        return Some("a unique local address (fc00::/7)");
    }
    if in_block6(bits, 0xfe80 << 112, 10) {
        return Some("a link-local address (fe80::/10)");
    }
    if in_block6(bits, 0xfec0 << 112, 10) {
        return Some("a deprecated site-local address (fec0::/10)");
    }
    if in_block6(bits, 0xff00 << 112, 8) {
        return Some("a multicast address (ff00::/8)");
    }
    if !in_block6(bits, 0x2000 << 112, 3) {
        return Some("not a global unicast address (outside 2000::/3)");
    }
    IPV6_REFUSED_IN_GLOBAL
        .iter()
        .find(|block| in_block6(bits, block.network, block.prefix))
        .map(|block| block.name)
}

/// Why `ip` is not a public unicast address (a short description naming its range), or `None`
/// when it is one. Covers private, loopback, link-local, unspecified, multicast, broadcast,
/// carrier-grade NAT, documentation, benchmarking and reserved ranges, IPv6 unique-local and
/// site-local, and the IPv6 forms that embed an IPv4 address (mapped, NAT64, 6to4), whose
/// embedded address is checked in turn.
pub fn non_public_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => ipv4_refusal(v4),
        IpAddr::V6(v6) => ipv6_refusal(v6),
    }
}

/// Host names that resolve to loopback by definition (RFC 6761), refused without asking DNS.
pub(crate) fn is_local_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost")
}

/// Parses and checks a webhook URL without touching the network: an absolute http or https
/// URL with a host, no longer than [`WEBHOOK_URL_LEN_MAX`], whose host is not a forbidden IP
/// literal (in any spelling the URL standard accepts, such as `http://0x7f.1/`) nor a name
/// that is loopback by definition (`localhost`). Use [`check_webhook_target`] to also resolve
/// the host.
pub fn validate_webhook_url(url: &str, policy: &TargetPolicy) -> Result<Url, SinkError> {
    if url.len() > WEBHOOK_URL_LEN_MAX {
        return Err(SinkError::UrlTooLong {
            len: url.len(),
            max: WEBHOOK_URL_LEN_MAX,
        });
    }
    let parsed = Url::parse(url).map_err(|error| SinkError::InvalidUrl {
        reason: error.to_string(),
    })?;
    // The URL as it is sent: percent-encoding can make it three times the text given.
    if parsed.as_str().len() > WEBHOOK_URL_LEN_MAX {
        return Err(SinkError::UrlTooLong {
            len: parsed.as_str().len(),
            max: WEBHOOK_URL_LEN_MAX,
        });
    }
    match parsed.scheme() {
        "http" | "https" => {}
        other => {
            return Err(SinkError::UnsupportedScheme {
                scheme: other.chars().take(32).collect(),
            })
        }
    }
    let host = parsed.host_str().ok_or(SinkError::MissingHost)?;
    if host.is_empty() {
        return Err(SinkError::MissingHost);
    }
    if policy.allow_private {
        return Ok(parsed);
    }
    let refusal = match host_ip(host) {
        Some(ip) => non_public_range(ip),
        None if is_local_name(host) => Some("a name that always resolves to loopback (localhost)"),
        None => None,
    };
    match refusal {
        Some(range) => Err(SinkError::ForbiddenTarget {
            host: host.to_owned(),
            range,
        }),
        None => Ok(parsed),
    }
}

/// The IP address of an IP-literal URL host (IPv6 in brackets, as `Url::host_str` gives it),
/// or `None` for a domain name. The URL parser has already normalised every IPv4 spelling
/// (`0x7f.1`, `2130706433`) to dotted decimal.
pub(crate) fn host_ip(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

/// [`validate_webhook_url`], then resolves the host and refuses it when any of its addresses
/// is forbidden (an attacker who controls DNS could otherwise list one public and one private
/// address and hope the connection falls back to the second).
pub async fn check_webhook_target(url: &str, policy: &TargetPolicy) -> Result<Url, SinkError> {
    let parsed = validate_webhook_url(url, policy)?;
    if policy.allow_private {
        return Ok(parsed);
    }
    let name = parsed.host_str().unwrap_or_default();
    if host_ip(name).is_none() {
        resolve_allowed(name, policy).await?;
    }
    Ok(parsed)
}

/// Longest wait for the system resolver. `getaddrinfo` can block for its own retries (tens of
/// seconds with a dead name server); an API call validating a queue must not hang that long.
/// Deliveries are bounded by their request timeout as well.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

async fn resolve_host(name: &str) -> Result<Vec<SocketAddr>, String> {
    // Port 0: only the addresses matter; the connector puts the URL's port in.
    let lookup = tokio::net::lookup_host((name, 0));
    let addrs: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
        .await
        .map_err(|_| format!("no answer within {} s", RESOLVE_TIMEOUT.as_secs()))?
        .map_err(|error| error.to_string())?
        .collect();
    if addrs.is_empty() {
        return Err("no addresses".to_owned());
    }
    Ok(addrs)
}

/// Resolves `host` (a name or an IP literal) and returns its addresses, or an error when it
/// cannot be resolved or when any address is forbidden by `policy`. This is the connect-time
/// check: connect only to the addresses it returns.
pub(crate) async fn resolve_allowed(
    host: &str,
    policy: &TargetPolicy,
) -> Result<Vec<SocketAddr>, SinkError> {
    let addrs = resolve_host(host)
        .await
        .map_err(|reason| SinkError::Unresolvable {
            host: host.to_owned(),
            reason,
        })?;
    match first_forbidden(host, &addrs, policy) {
        Some(forbidden) => Err(forbidden),
        None => Ok(addrs),
    }
}

fn first_forbidden(host: &str, addrs: &[SocketAddr], policy: &TargetPolicy) -> Option<SinkError> {
    addrs.iter().find_map(|addr| {
        policy
            .refusal(addr.ip())
            .map(|range| SinkError::ForbiddenAddress {
                host: host.to_owned(),
                addr: addr.ip(),
                range,
            })
    })
}

/// A DNS resolver that refuses names resolving to forbidden addresses, so the check holds at
/// connect time whatever DNS said when the queue was configured.
#[derive(Debug)]
struct GuardedResolver {
    policy: TargetPolicy,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy;
        Box::pin(async move {
            let host = name.as_str();
            // No by-name shortcut for `localhost` here (validation has one): at connect time
            // the addresses are what matters, whatever the name.
            let addrs = resolve_allowed(host, &policy)
                .await
                .map_err(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>)?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Connection establishment limit; the per-request timeout still bounds the whole request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle pooled connection is kept. Below the 60–120 s idle timeouts of common
/// load balancers, so we rarely reuse a connection the other side is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// Idle connections kept per host: enough for a queue's concurrency limit to reuse
/// connections, bounded so thousands of targets cannot hoard file descriptors.
const POOL_IDLE_PER_HOST_MAX: usize = 64;
/// TCP keepalive probes on pooled connections, to notice dead peers.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// An HTTP client for webhook sinks under `policy`: pooled, no redirects, no environment
/// proxies, and (unless the policy allows private targets) a DNS resolver that refuses
/// forbidden addresses at every connection. Build it once and share it between sinks with the
/// same policy (clones share the pool).
pub fn try_client_for(policy: &TargetPolicy) -> Result<reqwest::Client, SinkError> {
    try_client_with_pool(policy, POOL_IDLE_PER_HOST_MAX)
}

/// [`try_client_for`] keeping up to `idle_per_host` idle connections per host (at least 1):
/// set it to the dispatcher's per-target in-flight cap, so that every delivery the cap allows
/// can go back to the pool instead of being closed and reopened.
pub fn try_client_with_pool(
    policy: &TargetPolicy,
    idle_per_host: usize,
) -> Result<reqwest::Client, SinkError> {
    try_client_trusting(policy, idle_per_host, &[])
}

/// [`try_client_with_pool`] that also trusts `extra_roots` (`webhooks.ca_file`, read with
/// [`crate::trust::read_ca_file`]). Every client trusts the Mozilla roots built into the
/// binary and the system's roots (`/etc/ssl/certs` and the like, `SSL_CERT_FILE`): a receiver
/// behind a company CA that the machine already trusts needs no setting.
pub fn try_client_trusting(
    policy: &TargetPolicy,
    idle_per_host: usize,
    extra_roots: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<reqwest::Client, SinkError> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("belfry/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(idle_per_host.max(1))
        .tcp_keepalive(TCP_KEEPALIVE)
        .tcp_nodelay(true);
    if !policy.allow_private {
        builder = builder.dns_resolver(Arc::new(GuardedResolver { policy: *policy }));
    }
    for root in crate::trust::system_roots().iter().chain(extra_roots) {
        let root = reqwest::Certificate::from_der(root.as_ref()).map_err(|error| {
            SinkError::HttpClient {
                reason: format!("a trusted root certificate is not usable: {error}"),
            }
        })?;
        builder = builder.add_root_certificate(root);
    }
    builder.build().map_err(|error| SinkError::HttpClient {
        reason: error.to_string(),
    })
}

/// [`try_client_for`], for callers that treat a failure as fatal.
///
/// # Panics
/// Only when the TLS backend cannot initialise, exactly when `reqwest::Client::new` would
/// panic too; with the bundled rustls and root certificates that does not happen. A client
/// without the SSRF guard is never returned instead.
pub fn client_for(policy: &TargetPolicy) -> reqwest::Client {
    match try_client_for(policy) {
        Ok(client) => client,
        Err(error) => panic!("{error}"),
    }
}

/// [`client_for`] the default policy (public targets only).
pub fn default_client() -> reqwest::Client {
    client_for(&TargetPolicy::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(address: &str, expected_refused: bool) {
        let ip: IpAddr = address.parse().expect("test addresses parse");
        let refusal = non_public_range(ip);
        assert_eq!(
            refusal.is_some(),
            expected_refused,
            "{address}: {refusal:?}"
        );
        // The permissive policy allows everything; the default one follows the classification.
        assert_eq!(TargetPolicy::ALLOW_PRIVATE.refusal(ip), None);
        assert_eq!(TargetPolicy::default().refusal(ip), refusal);
    }

    #[test]
    fn ipv4_classification() {
        for refused in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.255",
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.55",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            check(refused, true);
        }
        for allowed in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "93.184.216.34",
        ] {
            check(allowed, false);
        }
    }

    #[test]
    fn ipv6_classification() {
        for refused in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::8.8.8.8",
            "64:ff9b::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
            "2001:2::1",
            "2001:10::1",
            "2002:7f00:0001::1",
            "2002:0a00:0001::1",
            "2002:c0a8:0101::1",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd00:ec2::254",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff05::1:3",
            "4000::1",
            "8000::1",
            "1fff:ffff::1",
            "e000::1",
        ] {
            check(refused, true);
        }
        for allowed in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001:82a::200e",
            "2001:200::1",
            "::ffff:8.8.8.8",
            "::ffff:1.1.1.1",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
            "2000::1",
            "3ffe::1",
            "3fef:ffff::1",
        ] {
            check(allowed, false);
        }
    }

    #[test]
    fn url_validation() {
        let check = |url: &str, policy: TargetPolicy, expected: Result<(), &str>| {
            let got = validate_webhook_url(url, &policy).map(|_| ());
            match (&got, expected) {
                (Ok(()), Ok(())) => {}
                (Err(error), Err(needle)) => assert!(
                    error.to_string().contains(needle),
                    "{url}: {error} lacks {needle:?}"
                ),
                _ => panic!("{url} under {policy:?}: got {got:?}, expected {expected:?}"),
            }
        };
        let public = TargetPolicy::default();
        let private = TargetPolicy::ALLOW_PRIVATE;
        check("https://example.com/hook", public, Ok(()));
        check("http://example.com:8080/a?b=c", public, Ok(()));
        check("https://93.184.216.34/hook", public, Ok(()));
        check("https://[2606:4700:4700::1111]/", public, Ok(()));
        check("ftp://example.com/", public, Err("use http:// or https://"));
        check(
            "file:///etc/passwd",
            public,
            Err("\"file\" is not supported"),
        );
        check("javascript:alert(1)", public, Err("not supported"));
        check("example.com/hook", public, Err("not a valid absolute URL"));
        check("", public, Err("not a valid absolute URL"));
        check("http://", public, Err("not a valid absolute URL"));
        check("http://127.0.0.1:8080/", public, Err("loopback"));
        check("http://127.0.0.1:8080/", private, Ok(()));
        check("http://0x7f.1/", public, Err("loopback"));
        check("http://2130706433/", public, Err("loopback"));
        check("http://017700000001/", public, Err("loopback"));
        check("http://[::1]/", public, Err("loopback"));
        check("http://[::ffff:127.0.0.1]/", public, Err("IPv4-mapped"));
        check(
            "http://169.254.169.254/latest/meta-data",
            public,
            Err("link-local"),
        );
        check("http://0.0.0.0:80/", public, Err("this network"));
        check("http://10.0.0.5/", public, Err("private"));
        check("http://[fd00::1]/", public, Err("unique local"));
        check("http://localhost:9000/", public, Err("localhost"));
        check("http://LOCALHOST./", public, Err("localhost"));
        check("http://api.localhost/", public, Err("localhost"));
        check("http://localhost:9000/", private, Ok(()));
        check(
            &format!("https://example.com/{}", "a".repeat(WEBHOOK_URL_LEN_MAX)),
            public,
            Err("limit is 2048 bytes"),
        );
        // Short as given, too long once percent-encoded (é is %C3%A9).
        check(
            &format!("https://example.com/{}", "é".repeat(500)),
            public,
            Err("limit is 2048 bytes"),
        );
    }

    #[test]
    fn errors_do_not_echo_credentials() {
        let error = validate_webhook_url(
            "http://user:hunter2@127.0.0.1/?token=abc",
            &TargetPolicy::default(),
        )
        .expect_err("loopback is refused");
        let text = error.to_string();
        assert!(!text.contains("hunter2") && !text.contains("abc"), "{text}");
    }

    proptest::proptest! {
        /// Every IPv6 form that carries an IPv4 address to a dual-stack socket or a
        /// translator is judged by that IPv4 address.
        #[test]
        fn embedded_ipv4_is_judged_like_the_ipv4_address(bits: u32) {
            let v4 = Ipv4Addr::from(bits);
            let refused = non_public_range(IpAddr::V4(v4)).is_some();
            let mapped = v4.to_ipv6_mapped();
            let nat64 = Ipv6Addr::from((0x0064_ff9b_u128 << 96) | u128::from(bits));
            let six_to_four = Ipv6Addr::from((0x2002_u128 << 112) | (u128::from(bits) << 80) | 1);
            for v6 in [mapped, nat64, six_to_four] {
                proptest::prop_assert_eq!(
                    non_public_range(IpAddr::V6(v6)).is_some(),
                    refused,
                    "{} embeds {}", v6, v4
                );
            }
        }

        /// Whatever the text, validation answers (never panics), and what it accepts under
        /// the default policy is an http(s) URL whose IP-literal host, if any, is public.
        #[test]
        fn validation_never_panics_and_accepts_only_public_literals(url in "(https?|ftp|file|[a-z]{1,5})://[a-zA-Z0-9.:\\[\\]@%_~-]{0,40}(/[ -~]{0,20})?|\\PC{0,40}") {
            if let Ok(parsed) = validate_webhook_url(&url, &TargetPolicy::default()) {
                proptest::prop_assert!(matches!(parsed.scheme(), "http" | "https"));
                let host = parsed.host_str().unwrap_or_default();
                if let Some(ip) = host_ip(host) {
                    proptest::prop_assert_eq!(non_public_range(ip), None);
                }
            }
        }

        #[test]
        fn literal_urls_follow_the_address_classification(bits: u32, v6: u128, port: u16) {
            let v4 = Ipv4Addr::from(bits);
            let v6 = Ipv6Addr::from(v6);
            for (url, ip) in [
                (format!("http://{v4}:{port}/h"), IpAddr::V4(v4)),
                (format!("https://[{v6}]:{port}/h"), IpAddr::V6(v6)),
            ] {
                let accepted = validate_webhook_url(&url, &TargetPolicy::default()).is_ok();
                proptest::prop_assert_eq!(accepted, non_public_range(ip).is_none(), "{}", url);
                proptest::prop_assert!(validate_webhook_url(&url, &TargetPolicy::ALLOW_PRIVATE).is_ok());
            }
        }
    }

    #[tokio::test]
    async fn resolver_refuses_names_resolving_to_loopback() {
        use reqwest::dns::Resolve;
        let guarded = GuardedResolver {
            policy: TargetPolicy::default(),
        };
        // "localhost" goes through the system resolver here (no by-name shortcut), so this
        // exercises the address filter that runs at every connection.
        for name in ["localhost", "127.0.0.1", "::1"] {
            let name: reqwest::dns::Name = name.parse().expect("valid name");
            let error = match guarded.resolve(name).await {
                Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
                Err(error) => error,
            };
            let error = error
                .downcast_ref::<SinkError>()
                .expect("the resolver fails with a SinkError");
            assert!(
                matches!(error, SinkError::ForbiddenAddress { addr, .. } if addr.is_loopback()),
                "{error}"
            );
        }
        let permissive = GuardedResolver {
            policy: TargetPolicy::ALLOW_PRIVATE,
        };
        let name: reqwest::dns::Name = "localhost".parse().expect("valid name");
        let addrs: Vec<_> = permissive.resolve(name).await.expect("allowed").collect();
        assert!(
            addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty(),
            "{addrs:?}"
        );
    }

    #[tokio::test]
    async fn resolving_check_refuses_localhost_and_allows_it_when_asked() {
        // "localhost" is refused by name before DNS; "localhost." with a trailing dot too.
        let error = check_webhook_target("http://localhost:1/", &TargetPolicy::default())
            .await
            .expect_err("localhost is refused");
        assert!(
            matches!(error, SinkError::ForbiddenTarget { .. }),
            "{error}"
        );
        check_webhook_target("http://localhost:1/", &TargetPolicy::ALLOW_PRIVATE)
            .await
            .expect("allowed when private targets are");
    }
}
