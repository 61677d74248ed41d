//! Helpers shared by the tests that start node processes on loopback.

use std::net::{SocketAddr, TcpListener, UdpSocket};

/// `n` addresses free for both UDP and TCP, below the kernel's ephemeral range (32768 and
/// up here), so that no outgoing connection can take a node's port before it binds it.
/// `salt` keeps the tests of one binary apart.
pub fn free_addrs(n: usize, salt: u16) -> Vec<SocketAddr> {
    let mut port = 20_000 + (std::process::id() as u16 % 100) * 100 + salt;
    let mut out = Vec::new();
    while out.len() < n {
        port += 1;
        assert!(port < 32_768, "no free ports below the ephemeral range");
        let a = SocketAddr::from(([127, 0, 0, 1], port));
        if UdpSocket::bind(a).is_ok() && TcpListener::bind(a).is_ok() {
            out.push(a);
        }
    }
    out
}
