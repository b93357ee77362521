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
//! At the connection cap, a newcomer from a light address (holding at most half as many
//! connections as the heaviest address) takes the place of one of the heaviest address's
//! connections that has no request in progress (`make_room_for`): silent, half-sent, or
//! between two requests, waiting for (or slowly receiving) its next head. A few addresses
//! holding every place with such connections do not lock other clients out, whether or not
//! those connections served a request before. A connection with a request in progress is
//! not picked: its request is not cut (a slow body is bounded by the body read deadline).
//! The evicted client's own reconnection is not light, so it waits for a place like any
//! other: evictions do not chain into a reconnection storm.
//!
//! Clients are told apart by their source address only: behind a proxy or load balancer every
//! client has the proxy's address, and the operator raises the cap to `http.connections_max`.
//! IPv4 clients reaching an IPv6 socket (`::ffff:a.b.c.d`) count as their IPv4 address. An
//! IPv6 client is counted per address, not per prefix: one host with a /64 has many
//! addresses, so against IPv6 attackers this cap is weaker than against IPv4 ones.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Activity;

use crate::api::{ApiError, ErrorCode};

/// `Retry-After` of the refusal, in seconds: a client's own connections ending (idle ones
/// close after `http.idle_timeout`) is what frees its places, within seconds.
const REFUSAL_RETRY_AFTER_S: u32 = 1;

/// The open connections of each client address. An address is in the map only while it has
/// a connection open, so the map holds at most `http.connections_max` entries (plus those
/// waiting for a place).
pub(super) struct Clients {
    max: usize,
    open: Mutex<Open>,
    next_place: AtomicU64,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("max", &self.max)
            .field("addresses", &self.addresses())
            .finish()
    }
}

#[derive(Default)]
struct Open {
    addresses: HashMap<IpAddr, Address>,
    /// The address with the most connections, kept as counts change by one (None: look it
    /// up again).
    heaviest: Option<IpAddr>,
}

#[derive(Default)]
struct Address {
    count: usize,
    /// The served connections that could be evicted, by place number: their activity says
    /// whether a request is in progress.
    served: HashMap<u64, Arc<Activity>>,
}

/// A connection's place in its address's count; given back on drop.
pub(super) struct ClientPlace {
    clients: Arc<Clients>,
    ip: IpAddr,
    id: u64,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        self.clients.release(self.ip, self.id);
    }
}

impl ClientPlace {
    /// The connection is served now: it may be evicted to make room while it has no request
    /// in progress.
    pub(super) fn serving(&self, activity: Arc<Activity>) {
        let mut open = self.clients.lock();
        if let Some(address) = open.addresses.get_mut(&self.ip) {
            address.served.insert(self.id, activity);
        }
    }
}

/// How much lighter than the heaviest address a newcomer's address must be to take one of
/// its places at the cap: holding at most 1/LIGHTER of its connections.
const LIGHTER: usize = 2;

impl Clients {
    pub(super) fn new(max: usize) -> Arc<Clients> {
        assert!(max >= 1, "a per-client cap of 0 would refuse everyone");
        Arc::new(Clients {
            max,
            open: Mutex::new(Open::default()),
            next_place: AtomicU64::new(0),
        })
    }

    /// A place for one more connection from `ip`, or None when it already holds the cap.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientPlace> {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        let count = {
            let address = open.addresses.entry(ip).or_default();
            if address.count >= self.max {
                return None;
            }
            address.count += 1;
            address.count
        };
        let heaviest = open.heaviest.map(|h| open.count(h));
        if heaviest.is_none_or(|h| count > h) {
            open.heaviest = Some(ip);
        }
        Some(ClientPlace {
            clients: self.clone(),
            ip,
            id: self.next_place.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// At the connection cap: if `ip` is light next to the heaviest address, asks one of
    /// that address's connections that has no request in progress to close, and answers true;
    /// its place then frees within moments.
    pub(super) fn make_room_for(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        let Some(heaviest) = open.heaviest_address() else {
            return false;
        };
        if heaviest == ip || open.count(ip) * LIGHTER > open.count(heaviest) {
            return false;
        }
        let Some(address) = open.addresses.get_mut(&heaviest) else {
            return false;
        };
        let evictable = address
            .served
            .iter()
            .find(|(_, activity)| !activity.in_request())
            .map(|(id, _)| *id);
        let Some(activity) = evictable.and_then(|id| address.served.remove(&id)) else {
            return false;
        };
        activity.evict();
        true
    }

    /// Connections open from `ip` now (served or waiting for a place).
    pub(super) fn open(&self, ip: IpAddr) -> usize {
        self.lock().count(ip.to_canonical())
    }

    /// Client addresses with a connection open now.
    pub(super) fn addresses(&self) -> usize {
        self.lock().addresses.len()
    }

    fn release(&self, ip: IpAddr, id: u64) {
        let mut open = self.lock();
        let Some(address) = open.addresses.get_mut(&ip) else {
            // Runs in `Drop`: a bug here is reported in tests, never a panic in production.
            debug_assert!(false, "a place was given back that was never taken");
            return;
        };
        address.count -= 1;
        address.served.remove(&id);
        if address.count == 0 {
            open.addresses.remove(&ip);
            if open.heaviest == Some(ip) {
                open.heaviest = None;
            }
        }
    }

    /// The lock is held for a map update, never across an await; a panic while holding it
    /// (a bug) leaves counts that are still usable, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Open {
    fn count(&self, ip: IpAddr) -> usize {
        self.addresses.get(&ip).map_or(0, |a| a.count)
    }

    /// The address holding the most connections. Kept as places are taken; when the one it
    /// named has gone, looked up again over every address (rare: only at the cap).
    fn heaviest_address(&mut self) -> Option<IpAddr> {
        if self.heaviest.is_none() {
            self.heaviest = self
                .addresses
                .iter()
                .max_by_key(|(_, a)| a.count)
                .map(|(ip, _)| *ip);
        }
        self.heaviest
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

    /// A served connection from `ip`, and its activity (a request in progress or not).
    fn served(clients: &Arc<Clients>, ip: &str, busy: bool) -> (ClientPlace, Arc<Activity>) {
        let place = clients.admit(super::tests::ip(ip)).expect("under the cap");
        let activity = Arc::new(Activity::default());
        activity
            .requests
            .store(usize::from(busy), Ordering::Relaxed);
        place.serving(activity.clone());
        (place, activity)
    }

    /// Whether `activity` was asked to close (a stored notification completes at once).
    fn asked_to_close(activity: &Activity) -> bool {
        use std::future::Future;
        let notified = activity.evict.notified();
        let mut notified = std::pin::pin!(notified);
        let waker = std::task::Waker::noop();
        notified
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    }

    #[test]
    fn a_light_client_evicts_one_idle_connection_of_the_heaviest_address() {
        let clients = Clients::new(100);
        let heavy: Vec<_> = (0..4)
            .map(|_| served(&clients, "10.0.0.1", false))
            .collect();
        let medium: Vec<_> = (0..2)
            .map(|_| served(&clients, "10.0.0.2", false))
            .collect();
        // The heaviest itself, and an address holding more than half of its count, are not
        // light: their newcomers wait.
        assert!(!clients.make_room_for(ip("10.0.0.1")));
        let _third = served(&clients, "10.0.0.2", false);
        assert!(
            !clients.make_room_for(ip("10.0.0.2")),
            "3 of 4 is not light"
        );
        // A new address is: one of the heaviest address's connections is asked to close.
        assert!(clients.make_room_for(ip("10.0.0.9")));
        let asked: Vec<bool> = heavy.iter().map(|(_, a)| asked_to_close(a)).collect();
        assert_eq!(asked.iter().filter(|a| **a).count(), 1, "{asked:?}");
        assert!(medium.iter().all(|(_, a)| !asked_to_close(a)));
        // Each eviction picks another connection: three more, then none is left to pick.
        for _ in 0..3 {
            assert!(clients.make_room_for(ip("10.0.0.9")));
        }
        assert!(
            !clients.make_room_for(ip("10.0.0.9")),
            "all four were asked already"
        );
    }

    #[test]
    fn a_connection_with_a_request_in_progress_is_never_evicted() {
        let clients = Clients::new(100);
        let busy: Vec<_> = (0..4).map(|_| served(&clients, "10.0.0.1", true)).collect();
        assert!(!clients.make_room_for(ip("10.0.0.9")));
        assert!(busy.iter().all(|(_, a)| !asked_to_close(a)));
        // The heaviest address is found again once the one it was has gone.
        drop(busy);
        let idle: Vec<_> = (0..2)
            .map(|_| served(&clients, "10.0.0.3", false))
            .collect();
        assert!(clients.make_room_for(ip("10.0.0.9")));
        assert_eq!(idle.iter().filter(|(_, a)| asked_to_close(a)).count(), 1);
    }

    /// Found by the HTTP audit: a connection that had served one request was never picked
    /// again, so keep-alive connections trickling their next head held every place.
    #[test]
    fn a_connection_between_two_requests_may_be_evicted() {
        let clients = Clients::new(100);
        let (_place, keep_alive) = served(&clients, "10.0.0.1", true);
        keep_alive.served.store(true, Ordering::Relaxed);
        let _busy = served(&clients, "10.0.0.1", true);
        assert!(!clients.make_room_for(ip("10.0.0.9")), "both are busy");
        // Its response is done: it waits for (or receives) its next head, and may be picked.
        keep_alive.requests.store(0, Ordering::Relaxed);
        assert!(clients.make_room_for(ip("10.0.0.9")));
        assert!(asked_to_close(&keep_alive));
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
