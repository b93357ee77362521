//! Requests a web browser makes for another site: refused before authentication.
//!
//! A server without tokens (the loopback default) trusts whoever can connect, and a browser
//! on the same machine can connect on behalf of any page it shows. Two holes follow, both
//! closed here:
//!
//! - **Cross-site writes.** A page on another origin may send a "simple" `POST` (a
//!   `text/plain` body, no preflight) to `http://127.0.0.1:7070/v1/...`: it cannot read the
//!   answer, but the write is made (a task stored, a queue paused, the first admin token
//!   made, which locks the operator out). Browsers say where a request comes from: in
//!   `Sec-Fetch-Site` (all current ones) and in `Origin`. A write whose `Sec-Fetch-Site` is
//!   not `same-origin` or `none` (typed by the user), or, without it, whose `Origin` is not
//!   the `Host` it was sent to, is refused. Other clients (curl, the CLI, SDKs) send neither
//!   header and pass, as do reads, which a page cannot see the answers of.
//! - **DNS rebinding.** A page on `evil.example` can make its name resolve to 127.0.0.1 (or
//!   to a private address a tokenless server listens on, with `allow_unauthenticated`) and
//!   then read the API as its own origin, and write as it too. Such a request names the
//!   page's host in `Host`, so an open server answers only requests addressed to it by an IP
//!   address, `localhost` or another name without a dot.
//!
//! With tokens configured, neither attack carries the bearer token (browsers do not add it
//! by themselves), but the checks cost two header lookups and stay on.

use axum::http::{header, HeaderMap, Method};

/// Why a request was refused (the `cross_origin_refused` message), if it was.
/// `open`: the server has no token (the Host check applies then).
pub(super) fn refusal(method: &Method, headers: &HeaderMap, open: bool) -> Option<String> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if open {
        if let Some(host) = host.filter(|h| !names_this_machine(h)) {
            return Some(format!(
                "this server has no bearer token, so it answers only requests addressed to it \
                 by an IP address or a name without a dot (127.0.0.1, [::1], localhost); got \
                 Host {host:?}, as a web page reaching it through DNS rebinding would send: \
                 call it by address, or configure [auth] tokens"
            ));
        }
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let from_elsewhere = |site: &str| {
        format!(
            "a web browser sent this {method} for a page of another site ({site}): belfry \
             refuses cross-site writes; call the API from a program (curl, the CLI, a client \
             library) or from the server's own web console"
        )
    };
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        return (!matches!(site, "same-origin" | "none"))
            .then(|| from_elsewhere(&format!("Sec-Fetch-Site: {site}")));
    }
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("?");
    let same = host.is_some_and(|host| origin_authority(origin) == Some(host));
    (!same).then(|| from_elsewhere(&format!("Origin: {origin}")))
}

/// What is wrong with the request's `Host` header (RFC 9112 §3.2: an HTTP/1.1 request must
/// carry exactly one), if anything: the checks above read it, and a proxy in front may read
/// a missing or second one differently.
pub(super) fn host_problem(version: axum::http::Version, headers: &HeaderMap) -> Option<String> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Some("the request carries two Host headers: send one".into()),
        (None, _) if version == axum::http::Version::HTTP_11 => {
            Some("an HTTP/1.1 request must carry a Host header: send one".into())
        }
        _ => None,
    }
}

/// `scheme://authority` of an `Origin` header: its authority (`host[:port]`).
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    (!rest.is_empty() && !rest.contains('/')).then_some(rest)
}

/// Whether a `Host` header names this machine, not a DNS name that could point anywhere:
/// an IP address, a name of one label (`localhost`, a name from `/etc/hosts`: a rebinding
/// page needs a domain of its own, which has a dot) or a name under `.localhost` (which
/// browsers resolve to loopback themselves), with or without a port.
fn names_this_machine(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // An IPv6 literal: "[::1]" or "[::1]:7070".
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    // Checked on every request of an open server: no lower-cased copy of the name.
    const LOCALHOST_SUFFIX: &str = ".localhost";
    let suffix = name
        .len()
        .checked_sub(LOCALHOST_SUFFIX.len())
        .and_then(|at| name.get(at..));
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || !name.contains('.')
        || suffix.is_some_and(|s| s.eq_ignore_ascii_case(LOCALHOST_SUFFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(method: Method, pairs: &[(&'static str, &str)], open: bool) -> Option<String> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        refusal(&method, &headers, open)
    }

    #[test]
    fn cross_site_writes_are_refused_and_the_rest_pass() {
        let host = ("host", "127.0.0.1:7070");
        // Programs send neither header.
        assert_eq!(ask(Method::POST, &[host], true), None);
        // The console, on the server's own origin.
        let same = [
            host,
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://127.0.0.1:7070"),
        ];
        assert_eq!(ask(Method::POST, &same, true), None);
        assert_eq!(
            ask(
                Method::DELETE,
                &[host, ("origin", "http://127.0.0.1:7070")],
                true
            ),
            None
        );
        // Another site's page.
        let other = ask(
            Method::POST,
            &[host, ("sec-fetch-site", "cross-site")],
            true,
        )
        .unwrap();
        assert!(other.contains("Sec-Fetch-Site: cross-site"), "{other}");
        assert!(ask(Method::POST, &[host, ("sec-fetch-site", "same-site")], true).is_some());
        let other = ask(
            Method::PUT,
            &[host, ("origin", "https://evil.example")],
            false,
        )
        .unwrap();
        assert!(other.contains("Origin: https://evil.example"), "{other}");
        assert!(ask(Method::POST, &[host, ("origin", "null")], false).is_some());
        assert!(ask(Method::POST, &[("origin", "http://127.0.0.1:7070")], false).is_some());
        // Reads pass: a page cannot see their answers.
        assert_eq!(
            ask(Method::GET, &[host, ("sec-fetch-site", "cross-site")], true),
            None
        );
    }

    #[test]
    fn a_request_carries_one_host_header() {
        use axum::http::Version;
        let mut headers = HeaderMap::new();
        assert!(host_problem(Version::HTTP_11, &headers).is_some_and(|p| p.contains("must")));
        assert_eq!(host_problem(Version::HTTP_10, &headers), None);
        headers.insert("host", "127.0.0.1:7070".parse().unwrap());
        assert_eq!(host_problem(Version::HTTP_11, &headers), None);
        headers.append("host", "evil.example".parse().unwrap());
        assert!(host_problem(Version::HTTP_11, &headers).is_some_and(|p| p.contains("two")));
    }

    #[test]
    fn an_open_server_answers_only_its_own_host_names() {
        for host in [
            "127.0.0.1:7070",
            "[::1]:7070",
            "[::1]",
            "localhost",
            "LocalHost:80",
            "app.localhost:7070",
            "10.1.2.3",
            "x",
            "belfry:7070",
        ] {
            assert_eq!(ask(Method::GET, &[("host", host)], true), None, "{host}");
        }
        for host in [
            "evil.example:7070",
            "evil.example",
            "evil.example.",
            "127.0.0.1.nip.io:7070",
            "[evil]:1",
        ] {
            let refused = ask(Method::GET, &[("host", host)], true);
            assert!(
                refused.is_some_and(|r| r.contains("DNS rebinding")),
                "{host}"
            );
            // With tokens (a page cannot send them), any name is served.
            assert_eq!(ask(Method::GET, &[("host", host)], false), None, "{host}");
        }
    }
}
