//! Opening UDP channels: the client's connect, and the listener that answers HELLOs.
//!
//! Every channel has a socket of its own, connected to its peer. The listener's socket and
//! the channels it accepts are bound to the same address with `SO_REUSEPORT`; the kernel
//! hands a datagram to the socket connected to its sender, so the listener only sees
//! HELLOs (and strays, which it counts and drops), and a relay or NAT between the peers
//! still sees one address per side. Half-open handshakes are bounded
//! ([`PENDING_MAX`]; a HELLO beyond closes the oldest, so HELLOs from forged addresses,
//! which never finish, cannot keep every slot from real clients); the listener's descriptor is an epoll set of its socket and theirs,
//! so one `poll` on it wakes for any handshake progress.

use super::channel::{UdpChannel, UdpStats};
use super::config::UdpConfig;
use super::conn::{count_wire_error, Connection, UdpCounters};
use super::wire::{self, Hello, Kind};
use crate::error::{ChannelError, ConnectError};
use crate::log_limit::LogLimit;
use crate::node::NodeId;
use crate::sys::udp::path_mtu;
use crate::transport::tcp::handshake::nonce;
use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes in progress at once; a further HELLO closes the oldest. 64: a whole cluster
/// rack connecting at the same moment.
pub const PENDING_MAX: usize = 64;
/// Recently accepted (address, nonce) pairs, to recognise a HELLO repeated after the
/// handshake finished.
const RECENT_MAX: usize = 64;
/// Socket buffers asked for (the kernel caps the send buffer at `wmem_max`; root can
/// exceed `rmem_max` for the receive buffer). 16 MiB: a full credit window of one peer
/// (`UdpConfig::credit_bytes`), so a receiver that obeys nothing but its credit does not
/// overflow the kernel's queue with large datagrams.
const SOCKET_BUFFER: usize = 16 << 20;
/// IPv4 + UDP headers, taken from the path MTU to get the largest datagram.
const IPV4_UDP_HEADERS: usize = 28;
const IPV6_UDP_HEADERS: usize = 48;

fn random_id() -> u32 {
    let mut b = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u32::from_le_bytes(b) | 1
}

fn tune(socket: &UdpSocket) {
    let fd = socket.as_fd();
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(fd, SOCKET_BUFFER).is_err() {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(fd, SOCKET_BUFFER);
    }
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(fd, SOCKET_BUFFER);
}

/// The largest datagram the path to a connected socket's peer carries whole.
fn datagram_limit(socket: &UdpSocket, config: &UdpConfig) -> usize {
    let ipv6 = socket.peer_addr().map(|a| a.is_ipv6()).unwrap_or(false);
    let headers = if ipv6 { IPV6_UDP_HEADERS } else { IPV4_UDP_HEADERS };
    match path_mtu(socket, ipv6) {
        Ok(mtu) if mtu > headers => config.datagram_max.min(mtu - headers),
        _ => config.datagram_max.min(1500 - headers),
    }
}

fn reuseport_socket(local: SocketAddr) -> std::io::Result<UdpSocket> {
    let family = if local.is_ipv4() { rustix::net::AddressFamily::INET } else { rustix::net::AddressFamily::INET6 };
    let fd = rustix::net::socket_with(
        family,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    rustix::net::sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &local)?;
    let socket = UdpSocket::from(fd);
    tune(&socket);
    Ok(socket)
}

/// Attempts at [`reuseport_socket_on_a_free_port`] before giving up.
const FREE_PORT_ATTEMPTS: usize = 64;

/// A listening socket on a port no other socket holds. Asked for port 0, Linux gives a
/// `SO_REUSEPORT` socket any port whose holders all have `SO_REUSEPORT` and the same user —
/// another process's listener among them (measured here: 19,900 such binds landed on
/// 14,236 ports) — and that process's listener would then take some of our HELLOs. A
/// plain socket's port 0 is a port nobody holds: take it, release it, and bind there with
/// `SO_REUSEPORT` (again when it is taken in between by a plain socket; a port-0
/// `SO_REUSEPORT` bind elsewhere in the microseconds between could still share it).
fn reuseport_socket_on_a_free_port(wanted: SocketAddr) -> std::io::Result<UdpSocket> {
    let mut last = None;
    for _ in 0..FREE_PORT_ATTEMPTS {
        let port = UdpSocket::bind(wanted)?.local_addr()?.port();
        match reuseport_socket(SocketAddr::new(wanted.ip(), port)) {
            Ok(socket) => return Ok(socket),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

fn failure_to_connect_error(e: &ChannelError, heard: bool, addr: &str) -> ConnectError {
    match e {
        ChannelError::Protocol(_) => ConnectError::Handshake("peer failed to prove the cluster secret"),
        _ if !heard => ConnectError::NoListener(addr.to_string()),
        _ => ConnectError::Timeout,
    }
}

/// Sends what a connection in its handshake has to send (one datagram at a time: this is
/// not the data path).
fn transmit_handshake(socket: &UdpSocket, conn: &mut Connection, now: Instant, buf: &mut [u8]) {
    while let Some(n) = conn.poll_transmit(now, buf) {
        if let Err(e) = socket.send(&buf[..n]) {
            tracing::debug!("udp handshake: send failed: {e}");
        }
    }
}

/// Feeds what a connection's socket has to it; returns whether anything arrived.
fn receive_handshake(socket: &UdpSocket, conn: &mut Connection, now: Instant, buf: &mut [u8]) -> bool {
    let mut any = false;
    while let Ok(n) = socket.recv(buf) {
        conn.handle_datagram(now, &buf[..n]);
        any = true;
    }
    any
}

/// Connects to the UDP endpoint listening at `addr`, retrying the HELLO until `timeout`;
/// tells the peer our `node` id and learns its own.
pub fn connect(
    addr: &str,
    config: &UdpConfig,
    node: NodeId,
    timeout: Duration,
    stats: Arc<UdpStats>,
) -> Result<UdpChannel, ConnectError> {
    config.validate().map_err(ConnectError::Config)?;
    let target: SocketAddr = addr
        .to_socket_addrs()
        .map_err(ConnectError::Io)?
        .next()
        .ok_or(ConnectError::Config("address resolves to nothing"))?;
    let socket = UdpSocket::bind(if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
    socket.connect(target)?;
    socket.set_nonblocking(true)?;
    tune(&socket);
    let start = Instant::now();
    let mut handshake_config = config.clone();
    handshake_config.handshake_timeout = timeout;
    let mut conn = Connection::client(handshake_config, start, random_id(), nonce(), node);
    conn.limit_datagram(datagram_limit(&socket, config));
    let mut buf = vec![0u8; wire::DATAGRAM_LIMIT];
    let mut heard = false;
    loop {
        let now = Instant::now();
        transmit_handshake(&socket, &mut conn, now, &mut buf);
        if conn.is_established() {
            break;
        }
        if let Some(e) = conn.failure() {
            stats.add_delta(&UdpCounters::default(), conn.counters());
            return Err(failure_to_connect_error(e, heard, addr));
        }
        let wake = conn.poll_timeout().unwrap_or(now + Duration::from_millis(10));
        let ms = wake.saturating_duration_since(now).as_millis().clamp(1, 100) as i32;
        let mut fds = [rustix::event::PollFd::new(&socket, rustix::event::PollFlags::IN)];
        let _ = rustix::event::poll(&mut fds, ms);
        let now = Instant::now();
        heard |= receive_handshake(&socket, &mut conn, now, &mut buf);
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
    }
    stats.add_delta(&UdpCounters::default(), conn.counters());
    Ok(UdpChannel::new(socket, conn, stats, config.close_linger, config.datagram_max)?)
}

struct Pending {
    socket: UdpSocket,
    conn: Connection,
    peer: SocketAddr,
    /// When its HELLO arrived: the smallest is the oldest.
    started: Instant,
    /// The connection's counters as last added to the endpoint's.
    reported: UdpCounters,
}

/// A listening UDP socket for channels.
pub struct UdpChannelListener {
    socket: UdpSocket,
    local: SocketAddr,
    epoll: OwnedFd,
    pending: Vec<Pending>,
    recent: VecDeque<(SocketAddr, [u8; 16])>,
    stats: Arc<UdpStats>,
    counters: UdpCounters,
    buf: Vec<u8>,
    /// Lines about handshakes closed for the bound, and about failed handshakes.
    full_log: LogLimit,
    failed_log: LogLimit,
}

impl std::fmt::Debug for UdpChannelListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpChannelListener").field("local", &self.local).field("pending", &self.pending.len()).finish()
    }
}

impl UdpChannelListener {
    /// Listens on `addr` (port 0 picks a free port).
    pub fn bind(addr: &str, stats: Arc<UdpStats>) -> Result<Self, ConnectError> {
        let wanted: SocketAddr = addr
            .to_socket_addrs()
            .map_err(ConnectError::Io)?
            .next()
            .ok_or(ConnectError::Config("address resolves to nothing"))?;
        let socket =
            if wanted.port() == 0 { reuseport_socket_on_a_free_port(wanted)? } else { reuseport_socket(wanted)? };
        let local = socket.local_addr()?;
        let epoll =
            rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC).map_err(std::io::Error::from)?;
        rustix::event::epoll::add(
            &epoll,
            &socket,
            rustix::event::epoll::EventData::new_u64(0),
            rustix::event::epoll::EventFlags::IN,
        )
        .map_err(std::io::Error::from)?;
        Ok(Self {
            socket,
            local,
            epoll,
            pending: Vec::new(),
            recent: VecDeque::with_capacity(RECENT_MAX),
            stats,
            counters: UdpCounters::default(),
            buf: vec![0u8; wire::DATAGRAM_LIMIT],
            full_log: LogLimit::default(),
            failed_log: LogLimit::default(),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Runs the handshakes in progress and returns a channel whose handshake finished, if
    /// any, telling each client our `node` id. Strangers, malformed datagrams and wrong
    /// secrets are dropped and counted.
    pub fn try_accept(&mut self, config: &UdpConfig, node: NodeId) -> Result<Option<UdpChannel>, ConnectError> {
        let now = Instant::now();
        let before = self.counters;
        for _ in 0..PENDING_MAX {
            match self.socket.recv_from(&mut self.buf) {
                Ok((n, from)) => {
                    let datagram = self.buf[..n].to_vec();
                    self.on_datagram(now, &datagram, from, config, node);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let mut accepted = None;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            receive_handshake(&p.socket, &mut p.conn, now, &mut self.buf);
            if p.conn.poll_timeout().is_some_and(|t| t <= now) {
                p.conn.handle_timeout(now);
            }
            self.stats.add_delta(&p.reported, p.conn.counters());
            p.reported = *p.conn.counters();
            if accepted.is_none() && p.conn.is_established() {
                let p = self.pending.swap_remove(i);
                let _ = rustix::event::epoll::delete(&self.epoll, &p.socket);
                if self.recent.len() == RECENT_MAX {
                    self.recent.pop_front();
                }
                self.recent.push_back((p.peer, p.conn.peer_nonce().unwrap_or_default()));
                tracing::debug!("udp: accepted a channel from {}", p.peer);
                accepted = Some(UdpChannel::new(
                    p.socket,
                    p.conn,
                    self.stats.clone(),
                    config.close_linger,
                    config.datagram_max,
                )?);
                continue;
            }
            if p.conn.failure().is_some() {
                let p = self.pending.swap_remove(i);
                let _ = rustix::event::epoll::delete(&self.epoll, &p.socket);
                if let Some(unsaid) = self.failed_log.allow(now) {
                    tracing::info!("udp: handshake with {} failed ({unsaid} more since the last line)", p.peer);
                }
                continue;
            }
            transmit_handshake(&p.socket, &mut p.conn, now, &mut self.buf);
            i += 1;
        }
        self.stats.add_delta(&before, &self.counters);
        Ok(accepted)
    }

    fn on_datagram(&mut self, now: Instant, datagram: &[u8], from: SocketAddr, config: &UdpConfig, node: NodeId) {
        let header = match wire::parse_header(datagram) {
            Ok(h) => h,
            Err(e) => return count_wire_error(&mut self.counters, e),
        };
        if header.kind != Kind::Hello || header.conn_id != 0 {
            self.counters.stranger += 1;
            tracing::debug!("udp listener: dropped a {:?} packet from {from} outside any channel", header.kind);
            return;
        }
        if !wire::verify_checksum(datagram, 0) {
            return count_wire_error(&mut self.counters, wire::WireError::Checksum);
        }
        let hello = match Hello::read_body(Kind::Hello, datagram, wire::HEADER_LEN) {
            Ok(h) => h,
            Err(e) => return count_wire_error(&mut self.counters, e),
        };
        if let Some(p) = self.pending.iter_mut().find(|p| p.peer == from) {
            p.conn.handle_datagram(now, datagram);
            transmit_handshake(&p.socket, &mut p.conn, now, &mut self.buf);
            return;
        }
        if self.recent.contains(&(from, hello.nonce)) {
            self.counters.replayed += 1;
            return;
        }
        if self.pending.len() >= PENDING_MAX {
            self.drop_oldest(now, from);
        }
        match self.open_pending(now, datagram, from, config, node) {
            Ok(()) => {}
            Err(e) => tracing::warn!("udp listener: cannot answer {from}: {e}"),
        }
    }

    fn open_pending(
        &mut self,
        now: Instant,
        datagram: &[u8],
        from: SocketAddr,
        config: &UdpConfig,
        node: NodeId,
    ) -> Result<(), ConnectError> {
        let socket = reuseport_socket(self.local)?;
        socket.connect(from)?;
        let mut conn = match Connection::server(config.clone(), now, random_id(), nonce(), node, datagram) {
            Ok(c) => c,
            Err(e) => {
                count_wire_error(&mut self.counters, e);
                return Ok(());
            }
        };
        conn.limit_datagram(datagram_limit(&socket, config));
        rustix::event::epoll::add(
            &self.epoll,
            &socket,
            rustix::event::epoll::EventData::new_u64(1),
            rustix::event::epoll::EventFlags::IN,
        )
        .map_err(std::io::Error::from)?;
        transmit_handshake(&socket, &mut conn, now, &mut self.buf);
        self.pending.push(Pending { socket, conn, peer: from, started: now, reported: UdpCounters::default() });
        Ok(())
    }

    /// Closes the oldest handshake in progress, for a HELLO from `from`.
    fn drop_oldest(&mut self, now: Instant, from: SocketAddr) {
        let Some(i) = (0..self.pending.len()).min_by_key(|&i| self.pending[i].started) else { return };
        let p = self.pending.swap_remove(i);
        let _ = rustix::event::epoll::delete(&self.epoll, &p.socket);
        if let Some(unsaid) = self.full_log.allow(now) {
            tracing::warn!(
                "udp listener: {PENDING_MAX} handshakes in progress; closed the oldest, with {}, for a HELLO from \
                 {from} ({unsaid} more since the last line)",
                p.peer
            );
        }
    }

    /// The next instant a handshake in progress has a timer due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.iter().filter_map(|p| p.conn.poll_timeout()).min()
    }
}

impl AsFd for UdpChannelListener {
    /// The epoll set of the listening socket and the handshakes in progress: readable
    /// when any of them has a datagram.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_on_port_zero_get_ports_of_their_own() {
        // 500 port-0 `SO_REUSEPORT` binds share a port somewhere with probability ~0.99 on
        // Linux's 28,232 default ephemeral ports; these must not.
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let sockets: Vec<UdpSocket> = (0..500).map(|_| reuseport_socket_on_a_free_port(any).unwrap()).collect();
        let mut ports: Vec<u16> = sockets.iter().map(|s| s.local_addr().unwrap().port()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), sockets.len(), "two listeners share a port");
    }
}
