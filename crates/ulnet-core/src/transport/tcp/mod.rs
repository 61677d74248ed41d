//! The TCP transport: one connection per channel, for networks where UDP is blocked or for
//! peers on other hosts when a stream is wanted.
//!
//! Connecting ([`connect_as`]) fails at once when nothing listens at the address; a caller
//! that waits for a peer it knows to be starting (a process it just launched, the other
//! members of a mesh being formed) uses [`connect_retry_as`], which retries refused
//! connections until its timeout. Accepting ([`TcpChannelListener`]) never blocks.

mod channel;
pub mod handshake;
mod listener;

pub use channel::TcpChannel;
pub use listener::{TcpChannelListener, TcpListenerCounters, ACCEPT_PAUSE};

use crate::error::ConnectError;
use crate::node::NodeId;
use handshake::{Handshake, HandshakeError, OurHello};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Settings of TCP channels and listeners.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// The cluster secret both sides must prove in the handshake. Empty is a valid (weak)
    /// secret, for development on one host.
    pub secret: Vec<u8>,
    /// Longest a listener lets a connection take over its handshake before closing it. The
    /// handshake is three messages of at most 68 bytes, a round trip and a half: well under
    /// a millisecond on a LAN. 1 s leaves room for a segment lost and retransmitted (Linux
    /// waits at least 200 ms) on a WAN path of a few hundred milliseconds, and for a loaded
    /// host's scheduling delays, while a connection that says nothing holds a handshake slot
    /// for a second at most. (A client bounds its own side by the timeout of its connect.)
    pub handshake_timeout: Duration,
    /// Connections a listener keeps in their handshake at once; a new one beyond closes the
    /// oldest. Each costs a descriptor and about 300 bytes. 64: a rack of peers connecting
    /// at the same moment; a flood of idle connections must then open 64 a second to hold
    /// every slot, and still pushes out only its own older ones, so a client that finishes
    /// its handshake within 64 of the flood's arrivals gets through.
    pub handshakes_pending_max: usize,
    /// Channels an endpoint keeps from its TCP listener at once. Past it, accepting one more
    /// closes the accepted channel that delivered nothing for the longest (a client that
    /// leaks connections loses its oldest idle ones; members and clients that talk keep
    /// theirs). Each channel costs two descriptors (its socket and its readiness probe)
    /// and a 256 KiB receive buffer. 1,024: a cluster's members (at most 256, membership's
    /// `members_max`) and several hundred clients, within about 2,100 descriptors and
    /// 256 MiB of buffers at worst.
    pub accepted_channels_max: usize,
}

/// What a failed connect says when the peer did not prove our cluster secret (the two
/// sides hold different secrets, or one holds none); commands look for it to name the
/// likely cause.
pub const SECRET_REFUSED: &str = "peer failed to prove the cluster secret";

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            secret: Vec::new(),
            handshake_timeout: Duration::from_secs(1),
            handshakes_pending_max: 64,
            accepted_channels_max: 1024,
        }
    }
}

fn handshake_error(e: HandshakeError, addr: &str) -> ConnectError {
    match e {
        HandshakeError::Io(io) => ConnectError::Io(io),
        HandshakeError::NotUlnet => ConnectError::Handshake(
            "the peer is not a ulnet endpoint: check the address (a node's --listen address, a server's port)",
        ),
        HandshakeError::Version(_) => ConnectError::Handshake(
            "the peer speaks another version of the connection handshake: run the same ulnet release on both sides",
        ),
        HandshakeError::BadSecret => ConnectError::Handshake(
            "the peer failed to prove the cluster secret: both sides must use the same secret file",
        ),
        HandshakeError::Closed => ConnectError::Handshake(
            "the peer closed the connection during the handshake: it refused our proof of the cluster \
             secret, or it has too many connections or no file descriptors left (see its log)",
        ),
        HandshakeError::TimedOut => ConnectError::HandshakeTimeout(addr.into()),
    }
}

fn random_tag() -> u32 {
    let mut b = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u32::from_le_bytes(b) | 1
}

fn resolve(addr: &str) -> Result<SocketAddr, ConnectError> {
    addr.to_socket_addrs()
        .map_err(|e| ConnectError::Resolve(addr.into(), e))?
        .next()
        .ok_or(ConnectError::Config("address resolves to nothing"))
}

/// Connects to `addr`, without telling the peer our node id; see [`connect_as`].
pub fn connect(addr: &str, config: &TcpConfig, timeout: Duration) -> Result<TcpChannel, ConnectError> {
    connect_as(addr, config, NodeId::UNKNOWN, timeout)
}

/// Connects to `addr` as node `node` and runs the handshake, all within about `timeout`.
/// Fails at once with [`ConnectError::NoListener`] when nothing listens there.
pub fn connect_as(addr: &str, config: &TcpConfig, node: NodeId, timeout: Duration) -> Result<TcpChannel, ConnectError> {
    let deadline = Instant::now() + timeout;
    let target = resolve(addr)?;
    match TcpStream::connect_timeout(&target, timeout.max(Duration::from_millis(1))) {
        Ok(stream) => handshake_as_client(stream, addr, config, node, deadline),
        Err(e) => Err(connect_error(e, addr, timeout)),
    }
}

/// Like [`connect_as`], retrying refused connections until `timeout`: for a caller that
/// waits for a peer it knows to be starting (a server process it launched, the members of
/// a mesh that start together).
pub fn connect_retry_as(
    addr: &str,
    config: &TcpConfig,
    node: NodeId,
    timeout: Duration,
) -> Result<TcpChannel, ConnectError> {
    let deadline = Instant::now() + timeout;
    let target = resolve(addr)?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&target, left) {
            Ok(stream) => return handshake_as_client(stream, addr, config, node, deadline),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(connect_error(e, addr, timeout)),
        }
    }
}

fn connect_error(e: std::io::Error, addr: &str, timeout: Duration) -> ConnectError {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => ConnectError::NoListener(addr.into()),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            ConnectError::Unreachable(addr.into(), timeout)
        }
        _ => ConnectError::Io(e),
    }
}

fn handshake_as_client(
    mut stream: TcpStream,
    addr: &str,
    config: &TcpConfig,
    node: NodeId,
    deadline: Instant,
) -> Result<TcpChannel, ConnectError> {
    // Each read waits at most for what is left of the connect's time; the handshake fails
    // at the first read after the deadline.
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    let rx_tag = random_tag();
    let ours = OurHello { tag: rx_tag, node, nonce: handshake::nonce() };
    let mut hs = Handshake::client(&config.secret, ours, Some(deadline));
    let peer = handshake::drive_blocking(&mut stream, &mut hs).map_err(|e| handshake_error(e, addr))?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let mut channel = TcpChannel::new(stream, rx_tag, peer.tag)?;
    channel.peer_node = peer.node;
    Ok(channel)
}
