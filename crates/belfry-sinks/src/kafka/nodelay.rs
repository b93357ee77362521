//! TCP_NODELAY on the Kafka client's broker connections.
//!
//! rskafka (0.6) connects without `TCP_NODELAY` and writes each request as two writes: its
//! 4-byte length, then its body. Under Nagle's algorithm the body waits until the broker
//! acknowledges the length, and a broker delays that acknowledgement (delayed ACK) until it
//! answers, reads the bytes or a timer fires. Measured on loopback against Tansu at 10k due/s:
//! a produce took 9.0 ms at the median and 18.8 ms at p99 without it, 0.38 and 1.9 ms with it.
//!
//! The client gives no hook into its sockets, so after it connects, [`set_on_connections_to`]
//! looks through this process's open sockets for those connected to a broker and sets the
//! option there. It is a workaround, to be removed once the client sets the option itself.
//! Linux only (it reads `/proc/self/fd`); elsewhere it does nothing.

use std::net::SocketAddr;

/// Resolves the brokers (`host:port`) to their addresses, for [`set_on_connections_to`].
pub async fn broker_addrs(brokers: &[String]) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for broker in brokers {
        if let Ok(found) = tokio::net::lookup_host(broker.as_str()).await {
            addrs.extend(found);
        }
    }
    addrs
}

/// Sets `TCP_NODELAY` on every open TCP socket of this process whose peer is one of `peers`.
/// Returns how many it set. Errors (a socket closed meanwhile) are skipped: the option is a
/// latency fix, never needed for correctness.
#[cfg(target_os = "linux")]
pub fn set_on_connections_to(peers: &[SocketAddr]) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if is_socket && peer_of(fd).is_some_and(|peer| peers.contains(&peer)) && nodelay(fd) {
            set += 1;
        }
    }
    set
}

#[cfg(not(target_os = "linux"))]
pub fn set_on_connections_to(_peers: &[SocketAddr]) -> usize {
    0
}

/// The peer address of socket `fd`, if it is a connected IPv4 or IPv6 socket.
///
/// The descriptor is not ours and may be closed (or reused) by another thread meanwhile:
/// `getpeername` on it then fails with `EBADF`, or answers for the new socket, which the
/// caller checks against the brokers' addresses. Nothing here touches memory but our own.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn peer_of(fd: i32) -> Option<SocketAddr> {
    // SAFETY: `storage` is a zeroed sockaddr_storage and `len` its size, as getpeername
    // requires; the kernel writes at most `len` bytes into it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // enough and aligned for.
            let v4 = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let v6 = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(v6.sin6_port))))
        }
        _ => None,
    }
}

/// Sets `TCP_NODELAY` on socket `fd`; false if the kernel refused (not TCP, closed).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn nodelay(fd: i32) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: the option value is a c_int that lives across the call, and its size is given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nodelay_of(stream: &std::net::TcpStream) -> bool {
        stream.nodelay().expect("read TCP_NODELAY")
    }

    /// The option lands on the connections to the named peer, and on no other socket.
    #[test]
    fn sets_the_option_on_connections_to_the_peers_only() {
        let broker = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let to_broker = std::net::TcpStream::connect(broker.local_addr().unwrap()).unwrap();
        let to_other = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        assert!(!nodelay_of(&to_broker) && !nodelay_of(&to_other));
        let set = set_on_connections_to(&[broker.local_addr().unwrap()]);
        assert_eq!(set, 1);
        assert!(nodelay_of(&to_broker), "the broker connection");
        assert!(
            !nodelay_of(&to_other),
            "a connection elsewhere is left alone"
        );
    }
}
