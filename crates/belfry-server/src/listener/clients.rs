//! Connections per client address, so that one client cannot hold the whole connection cap.
//!
//! `http.connections_max` bounds the server's connections; without a bound per client, one
//! address that opens connections and holds them (an attacker, or a client leaking its pool)
//! fills the cap, and every other client waits in the kernel's backlog. Here each accepted
//! connection takes a place in its address's count, given back when the connection ends; a
//! connection past `http.connections_per_client_max` is answered `503 too_many_connections`
//! at once and closed, without reading its request — reading it is the work the attacker
//! wants the server to do.
//!
//! Clients are told apart by their source address only: behind a proxy or load balancer every
//! client has the proxy's address, and the operator raises the cap to `http.connections_max`.
//! IPv4 clients reaching an IPv6 socket (`::ffff:a.b.c.d`) count as their IPv4 address. An
//! IPv6 client is counted per address, not per prefix: one host with a /64 has many
//! addresses, so against IPv6 attackers this cap is weaker than against IPv4 ones.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::api::{ApiError, ErrorCode};

/// `Retry-After` of the refusal, in seconds: a client's own connections ending (idle ones
/// close after `http.idle_timeout`) is what frees its places, within seconds.
const REFUSAL_RETRY_AFTER_S: u32 = 1;

/// The open connections of each client address. An address is in the map only while it has
/// a connection open, so the map holds at most `http.connections_max` entries.
#[derive(Debug)]
pub(super) struct Clients {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place in its address's count; given back on drop.
pub(super) struct ClientPlace {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        self.clients.release(self.ip);
    }
}

impl Clients {
    pub(super) fn new(max: usize) -> Arc<Clients> {
        assert!(max >= 1, "a per-client cap of 0 would refuse everyone");
        Arc::new(Clients {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `ip`, or None when it already holds the cap.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientPlace> {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientPlace {
            clients: self.clone(),
            ip,
        })
    }

    /// Connections open from `ip` now.
    pub(super) fn open(&self, ip: IpAddr) -> usize {
        self.lock().get(&ip.to_canonical()).copied().unwrap_or(0)
    }

    /// Client addresses with a connection open now.
    pub(super) fn addresses(&self) -> usize {
        self.lock().len()
    }

    fn release(&self, ip: IpAddr) {
        let mut open = self.lock();
        let Some(count) = open.get_mut(&ip) else {
            // Runs in `Drop`: a bug here is reported in tests, never a panic in production.
            debug_assert!(false, "a place was given back that was never taken");
            return;
        };
        *count -= 1;
        if *count == 0 {
            open.remove(&ip);
        }
    }

    /// The lock is held for a map update, never across an await; a panic while holding it
    /// (a bug) leaves counts that are still usable, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The whole answer to a connection over its client's cap: `503`, the standard error body,
/// `Retry-After` and `connection: close`. Built once per listener.
pub(super) fn refusal(max: usize) -> Vec<u8> {
    let message = format!(
        "this client address already has {max} connections open, the most one client may \
         have (http.connections_per_client_max): reuse connections (keep-alive) or close \
         idle ones, and retry after the Retry-After seconds"
    );
    let body = ApiError::new(ErrorCode::TooManyConnections, message).to_json_bytes();
    let status = ErrorCode::TooManyConnections.status();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nretry-after: \
         {REFUSAL_RETRY_AFTER_S}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Service Unavailable"),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_address_is_capped_on_its_own() {
        let clients = Clients::new(2);
        let a1 = clients.admit(ip("10.0.0.1")).expect("first");
        let a2 = clients.admit(ip("10.0.0.1")).expect("second");
        assert!(
            clients.admit(ip("10.0.0.1")).is_none(),
            "third is over the cap"
        );
        let b1 = clients
            .admit(ip("10.0.0.2"))
            .expect("another address has its own count");
        assert_eq!(clients.open(ip("10.0.0.1")), 2);
        assert_eq!(clients.open(ip("10.0.0.2")), 1);
        assert_eq!(clients.addresses(), 2);
        drop((a1, a2, b1));
    }

    #[test]
    fn a_closed_connection_gives_its_place_back_and_empty_addresses_are_forgotten() {
        let clients = Clients::new(1);
        let first = clients.admit(ip("10.0.0.1")).expect("first");
        assert!(clients.admit(ip("10.0.0.1")).is_none());
        drop(first);
        assert_eq!(clients.open(ip("10.0.0.1")), 0);
        assert_eq!(
            clients.addresses(),
            0,
            "no entry is kept for an address with none open"
        );
        let again = clients
            .admit(ip("10.0.0.1"))
            .expect("admitted after the close");
        assert_eq!(clients.open(ip("10.0.0.1")), 1);
        drop(again);
    }

    #[test]
    fn an_ipv4_client_on_an_ipv6_socket_counts_as_its_ipv4_address() {
        let clients = Clients::new(1);
        let mapped = clients.admit(ip("::ffff:10.0.0.1")).expect("first");
        assert!(clients.admit(ip("10.0.0.1")).is_none());
        assert_eq!(clients.open(ip("10.0.0.1")), 1);
        drop(mapped);
        assert_eq!(clients.addresses(), 0);
    }

    #[test]
    fn the_refusal_is_a_whole_503_with_the_standard_body() {
        let answer = String::from_utf8(refusal(7)).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nretry-after: 1"), "{head}");
        assert!(head.contains("\r\nconnection: close"), "{head}");
        assert!(
            head.contains(&format!("\r\ncontent-length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("7 connections"), "{message}");
        assert!(
            message.contains("http.connections_per_client_max"),
            "{message}"
        );
    }
}
