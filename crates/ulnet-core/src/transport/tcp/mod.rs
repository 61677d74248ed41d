//! The TCP transport: one connection per channel, for networks where UDP is blocked or for
//! peers on other hosts when a stream is wanted.

mod channel;
pub mod handshake;

pub use channel::TcpChannel;

use crate::error::ConnectError;
use crate::node::NodeId;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Settings of TCP channels.
#[derive(Clone, Debug, Default)]
pub struct TcpConfig {
    /// The cluster secret both sides must prove in the handshake. Empty is a valid (weak)
    /// secret, for development on one host.
    pub secret: Vec<u8>,
}

/// What a failed connect says when the peer did not prove our cluster secret (the two
/// sides hold different secrets, or one holds none); commands look for it to name the
/// likely cause.
pub const SECRET_REFUSED: &str = "peer failed to prove the cluster secret";

/// Longest a connection handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

fn handshake_error(e: handshake::HandshakeError) -> ConnectError {
    match e {
        handshake::HandshakeError::Io(io) => ConnectError::Io(io),
        handshake::HandshakeError::NotUlnet => ConnectError::Handshake("peer is not a ulnet endpoint"),
        handshake::HandshakeError::Version(_) => ConnectError::Handshake("peer speaks another protocol version"),
        handshake::HandshakeError::BadSecret => ConnectError::Handshake(SECRET_REFUSED),
    }
}

fn random_tag() -> u32 {
    let mut b = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u32::from_le_bytes(b) | 1
}

/// Connects to `addr`, retrying refused connections until `timeout`, without telling the
/// peer our node id.
pub fn connect(addr: &str, config: &TcpConfig, timeout: Duration) -> Result<TcpChannel, ConnectError> {
    connect_as(addr, config, NodeId::UNKNOWN, timeout)
}

/// Connects to `addr` as node `node`, retrying refused connections until `timeout`.
pub fn connect_as(addr: &str, config: &TcpConfig, node: NodeId, timeout: Duration) -> Result<TcpChannel, ConnectError> {
    let deadline = Instant::now() + timeout;
    let target: SocketAddr = addr
        .to_socket_addrs()
        .map_err(ConnectError::Io)?
        .next()
        .ok_or(ConnectError::Config("address resolves to nothing"))?;
    let mut stream = loop {
        match TcpStream::connect_timeout(
            &target,
            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
        ) {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(ConnectError::NoListener(addr.into()))
            }
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let rx_tag = random_tag();
    let peer = handshake::client_node(&mut stream, &config.secret, rx_tag, node).map_err(handshake_error)?;
    stream.set_read_timeout(None)?;
    let mut channel = TcpChannel::new(stream, rx_tag, peer.tag)?;
    channel.peer_node = peer.node;
    Ok(channel)
}

/// A listening TCP socket for channels.
#[derive(Debug)]
pub struct TcpChannelListener {
    listener: TcpListener,
}

impl TcpChannelListener {
    /// Listens on `addr` (port 0 picks a free port).
    pub fn bind(addr: &str) -> Result<Self, ConnectError> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one pending connection, if any, and runs the handshake. A peer that fails it
    /// is dropped and reported.
    pub fn try_accept(&self, config: &TcpConfig) -> Result<Option<TcpChannel>, ConnectError> {
        self.try_accept_as(config, NodeId::UNKNOWN)
    }

    /// [`TcpChannelListener::try_accept`] telling the peer that we are node `node`.
    pub fn try_accept_as(&self, config: &TcpConfig, node: NodeId) -> Result<Option<TcpChannel>, ConnectError> {
        match self.accept_connection()? {
            Some(accepted) => accepted.handshake(config, node).map(Some),
            None => Ok(None),
        }
    }

    /// Takes one pending connection, if any, without running the handshake (which blocks
    /// for up to its timeout on a silent peer), so a caller that must not block runs it
    /// elsewhere.
    pub fn accept_connection(&self) -> Result<Option<AcceptedTcp>, ConnectError> {
        match self.listener.accept() {
            Ok((stream, _)) => Ok(Some(AcceptedTcp { stream })),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// A connection taken from a [`TcpChannelListener`] whose handshake has not run yet.
#[derive(Debug)]
pub struct AcceptedTcp {
    stream: TcpStream,
}

impl AcceptedTcp {
    /// Runs the server side of the handshake as node `node` (blocking, up to 5 s). A peer
    /// that fails it is dropped and reported.
    pub fn handshake(self, config: &TcpConfig, node: NodeId) -> Result<TcpChannel, ConnectError> {
        let mut stream = self.stream;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let rx_tag = random_tag();
        let peer = handshake::server_node(&mut stream, &config.secret, rx_tag, node).map_err(handshake_error)?;
        stream.set_read_timeout(None)?;
        let mut channel = TcpChannel::new(stream, rx_tag, peer.tag)?;
        channel.peer_node = peer.node;
        Ok(channel)
    }
}

impl std::os::fd::AsFd for TcpChannelListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }
}
