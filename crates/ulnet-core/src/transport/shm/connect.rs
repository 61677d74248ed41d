//! Setting up a shared-memory channel: a rendezvous over a Unix socket in the abstract
//! namespace, where each side hands the other its sealed receive mapping and doorbell.
//!
//! ```text
//!  connector                                             listener
//!     | -- HELLO  (magic, version, node id) + [memfd, eventfd] -->  |  validates the mapping
//!     | <-- ACCEPT (magic, version, node id) + [memfd, eventfd] --  |
//!     |  validates the mapping; both sides map each other's receive mapping
//! ```
//!
//! The socket stays open for the life of the channel: when a process dies the kernel
//! closes it, and the survivor sees a hang-up instead of waiting forever.

use super::channel::ShmChannel;
use super::free_ring::FreeRingProducer;
use super::layout::{Layout, ShmGeometry};
use super::mem::{MappedMem, RingMem};
use crate::error::ConnectError;
use crate::node::NodeId;
use crate::sys::doorbell::Doorbell;
use crate::sys::{fdpass, memfd};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"ULNETHI1");
const ACCEPT_MAGIC: u64 = u64::from_le_bytes(*b"ULNETOK1");
/// Handshake protocol version. History: 1 — first version; 2 — the sender's node id
/// (u32) and a reserved u32 (0) appended.
const HANDSHAKE_VERSION: u64 = 2;
/// Bytes of a greeting: magic and version (version 1), node id and reserved (appended in 2).
const GREETING_LEN: usize = 24;
/// Longest a handshake may take once a peer has connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of shared-memory channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Sizes of the receive mapping this side creates.
    pub geometry: ShmGeometry,
    /// Largest message sent inline in the descriptor ring (capped at half the peer's ring).
    /// 1 KiB: covers the 68–256-byte messages that dominate cluster traffic with room to
    /// spare, while keeping a burst of inline messages from filling the ring.
    pub inline_max: usize,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self { geometry: ShmGeometry::default(), inline_max: 1024 }
    }
}

fn socket_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("ulnet-shm/{name}").as_bytes())
}

/// A distinct tag for each channel this process creates; the tag only guards against
/// misdirected records (the mapping itself is shared with no one but the peer).
fn next_tag() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    (std::process::id() << 12) ^ n.wrapping_mul(0x9E37_79B9) ^ 0x5a5a_0000 | 1
}

/// Our receive mapping, made and filled in before it is shared.
struct OwnMapping {
    file: File,
    mem: Arc<MappedMem>,
    layout: Layout,
    doorbell: Doorbell,
    free: FreeRingProducer,
}

fn create_own(config: &ShmConfig) -> Result<OwnMapping, ConnectError> {
    let mut layout = Layout::new(config.geometry, next_tag())?;
    layout.owner_uses_membarrier = crate::sys::barrier::membarrier_registered();
    let file = memfd::create_sealed("ulnet-shm", layout.total_len)?;
    let mem = Arc::new(MappedMem::map(&file)?);
    layout.write_control(&*mem);
    // Every buffer is free before the peer ever sees the mapping, so its first send finds them.
    let mut free = FreeRingProducer::new(layout.free);
    for index in 0..layout.geometry.buffer_count as u32 {
        free.push(&*mem, index);
    }
    Ok(OwnMapping { file, mem, layout, doorbell: Doorbell::new()?, free })
}

fn encode(magic: u64, node: NodeId) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[..8].copy_from_slice(&magic.to_le_bytes());
    b[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    b[16..20].copy_from_slice(&node.0.to_le_bytes());
    b
}

/// The peer's mapping, doorbell and node id.
type PeerParts = (Arc<MappedMem>, Layout, Doorbell, NodeId);

/// Receives the peer's greeting and mapping, validating both.
fn receive_peer(sock: &UnixStream, magic: u64) -> Result<PeerParts, ConnectError> {
    // The version-1 part first (it carries the descriptors), then what the version appends.
    let mut msg = [0u8; GREETING_LEN];
    let mut fds = fdpass::recv_with_fds(sock, &mut msg[..16])?;
    if u64::from_le_bytes(msg[..8].try_into().expect("8 bytes")) != magic {
        return Err(ConnectError::Handshake("not a ulnet shared-memory peer"));
    }
    if u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")) != HANDSHAKE_VERSION {
        return Err(ConnectError::Handshake("unsupported handshake version"));
    }
    std::io::Read::read_exact(&mut &*sock, &mut msg[16..])?;
    let node = NodeId(u32::from_le_bytes(msg[16..20].try_into().expect("4 bytes")));
    if fds.len() != 2 {
        return Err(ConnectError::Handshake("expected a mapping and a doorbell"));
    }
    let doorbell = Doorbell::from_fd(fds.pop().expect("two fds"));
    let file = File::from(fds.pop().expect("two fds"));
    memfd::check_sealed(&file)?;
    let mem = Arc::new(MappedMem::map(&file)?);
    let layout = Layout::read_control(&*mem)?;
    Ok((mem, layout, doorbell, node))
}

fn finish(own: OwnMapping, peer: PeerParts, sock: UnixStream, config: &ShmConfig) -> Result<ShmChannel, ConnectError> {
    sock.set_read_timeout(None)?;
    sock.set_nonblocking(true)?;
    let (tx_mem, tx_layout, tx_doorbell, peer_node) = peer;
    let mut channel = ShmChannel::new(
        own.mem,
        own.layout,
        own.doorbell,
        own.free,
        tx_mem,
        tx_layout,
        tx_doorbell,
        sock,
        config.inline_max,
    )?;
    channel.peer_node = peer_node;
    Ok(channel)
}

/// Connects to the endpoint listening under `name` on this host, without telling it our
/// node id.
pub fn connect(name: &str, config: &ShmConfig) -> Result<ShmChannel, ConnectError> {
    connect_as(name, config, NodeId::UNKNOWN)
}

/// Connects as node `node` to the endpoint listening under `name` on this host.
pub fn connect_as(name: &str, config: &ShmConfig, node: NodeId) -> Result<ShmChannel, ConnectError> {
    let sock = UnixStream::connect_addr(&socket_addr(name)?).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => ConnectError::NoListener(name.to_string()),
        _ => ConnectError::Io(e),
    })?;
    sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let own = create_own(config)?;
    fdpass::send_with_fds(&sock, &encode(HELLO_MAGIC, node), &[own.file.as_fd(), own.doorbell.as_fd()])?;
    let peer = receive_peer(&sock, ACCEPT_MAGIC)?;
    finish(own, peer, sock, config)
}

/// Connects, retrying while nobody listens yet, until `timeout`.
pub fn connect_retry(name: &str, config: &ShmConfig, timeout: Duration) -> Result<ShmChannel, ConnectError> {
    connect_retry_as(name, config, NodeId::UNKNOWN, timeout)
}

/// [`connect_retry`] as node `node`.
pub fn connect_retry_as(
    name: &str,
    config: &ShmConfig,
    node: NodeId,
    timeout: Duration,
) -> Result<ShmChannel, ConnectError> {
    let deadline = Instant::now() + timeout;
    loop {
        match connect_as(name, config, node) {
            Err(ConnectError::NoListener(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(ConnectError::NoListener(_)) => return Err(ConnectError::Timeout),
            other => return other,
        }
    }
}

/// A named rendezvous point for shared-memory peers on this host.
#[derive(Debug)]
pub struct ShmListener {
    listener: UnixListener,
    name: String,
}

impl ShmListener {
    /// Listens under `name` (in the abstract Unix socket namespace of this network namespace).
    pub fn bind(name: &str) -> Result<Self, ConnectError> {
        let listener = UnixListener::bind_addr(&socket_addr(name)?)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener, name: name.to_string() })
    }

    /// The name peers connect to.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Accepts one pending peer, if any, without blocking on the rendezvous.
    pub fn try_accept(&self, config: &ShmConfig) -> Result<Option<ShmChannel>, ConnectError> {
        self.try_accept_as(config, NodeId::UNKNOWN)
    }

    /// [`ShmListener::try_accept`], telling the peer that we are node `node`.
    pub fn try_accept_as(&self, config: &ShmConfig, node: NodeId) -> Result<Option<ShmChannel>, ConnectError> {
        match self.accept_connection()? {
            Some(accepted) => accepted.handshake(config, node).map(Some),
            None => Ok(None),
        }
    }

    /// Takes one pending peer, if any, without running the handshake (which blocks for up
    /// to its timeout on a silent peer), so a caller that must not block runs it elsewhere.
    pub fn accept_connection(&self) -> Result<Option<AcceptedShm>, ConnectError> {
        match self.listener.accept() {
            Ok((sock, _)) => Ok(Some(AcceptedShm { sock })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Accepts one peer, waiting up to `timeout`.
    pub fn accept(&self, config: &ShmConfig, timeout: Duration) -> Result<ShmChannel, ConnectError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ch) = self.try_accept(config)? {
                return Ok(ch);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnectError::Timeout);
            }
            let mut fds = [rustix::event::PollFd::new(&self.listener, rustix::event::PollFlags::IN)];
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let _ = rustix::event::poll(&mut fds, ms);
        }
    }
}

impl AsFd for ShmListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

/// A peer taken from a [`ShmListener`] whose handshake has not run yet.
#[derive(Debug)]
pub struct AcceptedShm {
    sock: UnixStream,
}

impl AcceptedShm {
    /// Runs the listener's side of the handshake as node `node` (blocking, up to 5 s):
    /// validates the peer's mapping and hands it ours.
    pub fn handshake(self, config: &ShmConfig, node: NodeId) -> Result<ShmChannel, ConnectError> {
        let sock = self.sock;
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let peer = receive_peer(&sock, HELLO_MAGIC)?;
        let own = create_own(config)?;
        fdpass::send_with_fds(&sock, &encode(ACCEPT_MAGIC, node), &[own.file.as_fd(), own.doorbell.as_fd()])?;
        finish(own, peer, sock, config)
    }
}

/// Checks that the mapping type satisfies the trait the rings need (compile-time).
const _: fn(&MappedMem) -> usize = <MappedMem as RingMem>::len;
