//! Setting up a shared-memory channel: a rendezvous over a Unix socket in the abstract
//! namespace, where each side judges the other's credentials, both prove the cluster
//! secret, and only then do they hand each other their sealed receive mappings and
//! doorbells.
//!
//! ```text
//!  connector                                                      listener
//!   judges the listener's credentials (admission)                    |
//!     | -- HELLO     magic, version, node, connector nonce --------> |  judges the connector's
//!     | <-- REFUSE   magic, version, reason, uid, gid -------------- |  credentials first; if
//!     |                                                              |  refused: why, and closes
//!     | <-- CHALLENGE magic, version, node, listener nonce,          |
//!     |       HMAC(secret, "shm listener" | nonces | nodes) -------- |
//!     |  checks it                                                   |
//!     | -- PROOF     magic, version,                                 |
//!     |       HMAC(secret, "shm connector" | nonces | nodes)         |
//!     |       + [memfd, eventfd] ----------------------------------> |  checks it, validates the
//!     |    (or REFUSE, when the listener's proof failed)             |  mapping (or REFUSE)
//!     | <-- ACCEPT   magic, version + [memfd, eventfd] ------------- |
//!     |  validates the mapping; both sides map each other's receive mapping
//! ```
//!
//! Neither side hands over a mapping or a doorbell before it has judged the other's
//! credentials and checked its proof of the secret. The proofs are the TCP handshake's
//! (`transport::tcp::handshake`), with roles of their own and no tags; the node ids they
//! cover are the ones the channel reports. Every message starts with the magic and
//! version, as in every version, so a peer of another version is told apart at its first
//! message. Version history: 1 — first version; 2 — the sender's node id (u32) and a
//! reserved u32 (0) appended to HELLO and ACCEPT; 3 — credentials judged both ways,
//! refusals told (REFUSE), the cluster secret proved (CHALLENGE, PROOF), mappings sent
//! only after (with PROOF and ACCEPT, no longer with HELLO).
//!
//! The socket stays open for the life of the channel: when a process dies the kernel
//! closes it, and the survivor sees a hang-up instead of waiting forever.

use super::admission::{decode_refusal, encode_refusal, AdmissionCells, AdmissionCounters, AllowedPeers, REFUSAL_LEN};
use super::channel::ShmChannel;
use super::free_ring::FreeRingProducer;
use super::layout::{Layout, ShmGeometry};
use super::mem::{MappedMem, RingMem};
use crate::error::{ConnectError, Refusal};
use crate::node::NodeId;
use crate::sys::credentials::PeerCredentials;
use crate::sys::doorbell::Doorbell;
use crate::sys::{fdpass, memfd};
use crate::transport::tcp::handshake::{mac, nonce, verify, Ids};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"ULNETHI1");
const CHALLENGE_MAGIC: u64 = u64::from_le_bytes(*b"ULNETCH1");
const PROOF_MAGIC: u64 = u64::from_le_bytes(*b"ULNETPR1");
const ACCEPT_MAGIC: u64 = u64::from_le_bytes(*b"ULNETOK1");
const REFUSE_MAGIC: u64 = u64::from_le_bytes(*b"ULNETNO1");
/// Handshake protocol version (history in the module documentation).
const HANDSHAKE_VERSION: u64 = 3;
/// Magic and version, at the start of every message.
const HEADER_LEN: usize = 16;
/// HELLO: header, node id, reserved u32, nonce.
const HELLO_LEN: usize = HEADER_LEN + 8 + 16;
/// CHALLENGE: header, node id, reserved u32, nonce, MAC.
const CHALLENGE_LEN: usize = HEADER_LEN + 8 + 16 + 32;
/// PROOF: header, MAC.
const PROOF_LEN: usize = HEADER_LEN + 32;
/// REFUSE: header, the refusal (reason, uid, gid), reserved u32.
const REFUSE_LEN: usize = HEADER_LEN + REFUSAL_LEN + 4;
/// What the MACs of each side start with (the TCP handshake's are "server" and "client").
const LISTENER_ROLE: &[u8] = b"shm listener";
const CONNECTOR_ROLE: &[u8] = b"shm connector";
/// Longest a handshake may take once a peer has connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of shared-memory channels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Sizes of the receive mapping this side creates.
    pub geometry: ShmGeometry,
    /// Largest message sent inline in the descriptor ring (capped at half the peer's ring).
    /// 1 KiB: covers the 68–256-byte messages that dominate cluster traffic with room to
    /// spare, while keeping a burst of inline messages from filling the ring.
    pub inline_max: usize,
    /// Users and groups besides our own whose processes a listener admits and a connector
    /// trusts as listeners (see [`AllowedPeers`]). Default: our own user only, so another
    /// user's process neither reaches our listeners nor receives our mappings.
    pub allowed: AllowedPeers,
    /// The cluster secret both sides prove in the handshake (HMAC-SHA256, as over TCP).
    /// Empty is a valid (weak) secret: it leaves the credentials as the only check, which
    /// is enough between processes of one user on one host. Costs two MACs per channel set
    /// up, nothing per message.
    pub secret: Vec<u8>,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            geometry: ShmGeometry::default(),
            inline_max: 1024,
            allowed: AllowedPeers::own_user(),
            secret: Vec::new(),
        }
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

/// A message's header: magic and version.
fn header(magic: u64) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(&magic.to_le_bytes());
    b[8..].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The magic of a header, once its version is checked.
fn check_header(b: &[u8]) -> Result<u64, ConnectError> {
    let magic = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    if ![HELLO_MAGIC, CHALLENGE_MAGIC, PROOF_MAGIC, ACCEPT_MAGIC, REFUSE_MAGIC].contains(&magic) {
        return Err(ConnectError::Handshake("not a ulnet shared-memory peer"));
    }
    if u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) != HANDSHAKE_VERSION {
        return Err(ConnectError::Handshake("peer speaks another shared-memory handshake version"));
    }
    Ok(magic)
}

/// A read's failure during the handshake: the peer closing first, or staying silent.
fn handshake_io(e: io::Error) -> ConnectError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => ConnectError::Handshake("peer closed the connection during the handshake"),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ConnectError::Timeout,
        _ => ConnectError::Io(e),
    }
}

/// Reads exactly `buf.len()` bytes.
fn read_all(sock: &UnixStream, buf: &mut [u8]) -> Result<(), ConnectError> {
    (&*sock).read_exact(buf).map_err(handshake_io)
}

/// Tells the peer why it is refused (best effort: it may be gone already).
fn send_refusal(sock: &UnixStream, r: &Refusal) {
    let mut b = [0u8; REFUSE_LEN];
    b[..HEADER_LEN].copy_from_slice(&header(REFUSE_MAGIC));
    b[HEADER_LEN..HEADER_LEN + REFUSAL_LEN].copy_from_slice(&encode_refusal(r));
    let _ = fdpass::send_with_fds(sock, &b, &[]);
}

/// Reads the rest of a REFUSE whose header was read: the refusal, as an error.
fn read_refusal(sock: &UnixStream) -> ConnectError {
    let mut rest = [0u8; REFUSE_LEN - HEADER_LEN];
    if let Err(e) = read_all(sock, &mut rest) {
        return e;
    }
    match decode_refusal(rest[..REFUSAL_LEN].try_into().expect("REFUSAL_LEN bytes")) {
        Some(r) => ConnectError::Refused(r),
        None => ConnectError::Handshake("peer refused for a reason this version does not know"),
    }
}

/// The peer's mapping, doorbell and node id.
type PeerParts = (Arc<MappedMem>, Layout, Doorbell, NodeId);

/// Validates and maps the receive mapping and doorbell the peer sent.
fn map_peer(mut fds: Vec<OwnedFd>, node: NodeId) -> Result<PeerParts, ConnectError> {
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

fn send_own(sock: &UnixStream, message: &[u8], own: &OwnMapping) -> Result<(), ConnectError> {
    Ok(fdpass::send_with_fds(sock, message, &[own.file.as_fd(), own.doorbell.as_fd()])?)
}

fn finish(own: OwnMapping, peer: PeerParts, sock: UnixStream, config: &ShmConfig) -> Result<ShmChannel, ConnectError> {
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
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

fn send_hello(sock: &UnixStream, node: NodeId, nonce: &[u8; 16]) -> Result<(), ConnectError> {
    let mut b = [0u8; HELLO_LEN];
    b[..HEADER_LEN].copy_from_slice(&header(HELLO_MAGIC));
    b[16..20].copy_from_slice(&node.0.to_le_bytes());
    b[24..40].copy_from_slice(nonce);
    Ok((&*sock).write_all(&b)?)
}

/// Reads the connector's HELLO: its node id and nonce.
fn read_hello(sock: &UnixStream) -> Result<(NodeId, [u8; 16]), ConnectError> {
    let mut b = [0u8; HELLO_LEN];
    read_all(sock, &mut b[..HEADER_LEN])?;
    if check_header(&b)? != HELLO_MAGIC {
        return Err(ConnectError::Handshake("connector did not start with HELLO"));
    }
    read_all(sock, &mut b[HEADER_LEN..])?;
    Ok((NodeId(u32_at(&b, 16)), b[24..40].try_into().expect("16 bytes")))
}

fn send_challenge(sock: &UnixStream, node: NodeId, nonce: &[u8; 16], proof: &[u8; 32]) -> Result<(), ConnectError> {
    let mut b = [0u8; CHALLENGE_LEN];
    b[..HEADER_LEN].copy_from_slice(&header(CHALLENGE_MAGIC));
    b[16..20].copy_from_slice(&node.0.to_le_bytes());
    b[24..40].copy_from_slice(nonce);
    b[40..72].copy_from_slice(proof);
    Ok((&*sock).write_all(&b)?)
}

/// What the listener's CHALLENGE says.
struct Challenge {
    node: NodeId,
    nonce: [u8; 16],
    mac: [u8; 32],
}

/// Reads the listener's answer to our HELLO: its challenge, or why it refuses us.
fn read_challenge(sock: &UnixStream) -> Result<Challenge, ConnectError> {
    let mut b = [0u8; CHALLENGE_LEN];
    read_all(sock, &mut b[..HEADER_LEN])?;
    match check_header(&b)? {
        CHALLENGE_MAGIC => {}
        REFUSE_MAGIC => return Err(read_refusal(sock)),
        _ => return Err(ConnectError::Handshake("listener answered HELLO outside the protocol")),
    }
    read_all(sock, &mut b[HEADER_LEN..])?;
    Ok(Challenge {
        node: NodeId(u32_at(&b, 16)),
        nonce: b[24..40].try_into().expect("16 bytes"),
        mac: b[40..72].try_into().expect("32 bytes"),
    })
}

/// Reads the connector's PROOF and its mapping, or its refusal of our proof of the secret.
fn read_proof(sock: &UnixStream) -> Result<([u8; PROOF_LEN], Vec<OwnedFd>), ConnectError> {
    let mut b = [0u8; PROOF_LEN];
    let fds = fdpass::recv_with_fds(sock, &mut b[..HEADER_LEN]).map_err(handshake_io)?;
    match check_header(&b)? {
        PROOF_MAGIC => {}
        REFUSE_MAGIC => {
            return Err(match read_refusal(sock) {
                // A connector refuses only our proof; it has no say on credentials.
                ConnectError::Refused(Refusal::Secret) => ConnectError::Refused(Refusal::Secret),
                _ => ConnectError::Handshake("connector refused outside the protocol"),
            });
        }
        _ => return Err(ConnectError::Handshake("connector answered CHALLENGE outside the protocol")),
    }
    read_all(sock, &mut b[HEADER_LEN..])?;
    Ok((b, fds))
}

/// Reads the listener's ACCEPT and its mapping, or why it refuses our proof.
fn read_accept(sock: &UnixStream) -> Result<Vec<OwnedFd>, ConnectError> {
    let mut b = [0u8; HEADER_LEN];
    let fds = fdpass::recv_with_fds(sock, &mut b).map_err(handshake_io)?;
    match check_header(&b)? {
        ACCEPT_MAGIC => Ok(fds),
        REFUSE_MAGIC => Err(read_refusal(sock)),
        _ => Err(ConnectError::Handshake("listener answered PROOF outside the protocol")),
    }
}

fn connect_socket(name: &str) -> Result<UnixStream, ConnectError> {
    let sock = UnixStream::connect_addr(&socket_addr(name)?).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => ConnectError::NoListener(name.to_string()),
        _ => ConnectError::Io(e),
    })?;
    sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    sock.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    Ok(sock)
}

/// Connects to the endpoint listening under `name` on this host, without telling it our
/// node id.
pub fn connect(name: &str, config: &ShmConfig) -> Result<ShmChannel, ConnectError> {
    connect_as(name, config, NodeId::UNKNOWN)
}

/// Connects as node `node` to the endpoint listening under `name` on this host: judges the
/// listener, checks its proof of the secret, proves ours, then exchanges mappings.
pub fn connect_as(name: &str, config: &ShmConfig, node: NodeId) -> Result<ShmChannel, ConnectError> {
    let sock = connect_socket(name)?;
    let listener = PeerCredentials::of(&sock).map_err(|_| Refusal::Unidentified)?;
    config.allowed.admit_listener(&listener, &sock)?;
    let cn = nonce();
    // A listener that refuses us may close before our HELLO is written: its reason is
    // waiting to be read all the same.
    let sent = send_hello(&sock, node, &cn);
    let challenge = match (read_challenge(&sock), sent) {
        (Err(ConnectError::Refused(r)), _) => return Err(r.into()),
        (_, Err(e)) => return Err(e),
        (answer, Ok(())) => answer?,
    };
    let ids = Ids { tags: (0, 0), nodes: (node.0, challenge.node.0) };
    if verify(&config.secret, LISTENER_ROLE, &cn, &challenge.nonce, ids, &challenge.mac).is_err() {
        // Told, so that the listener counts the refusal as the secret's.
        send_refusal(&sock, &Refusal::Secret);
        return Err(Refusal::Secret.into());
    }
    let own = create_own(config)?;
    let mut proof = [0u8; PROOF_LEN];
    proof[..HEADER_LEN].copy_from_slice(&header(PROOF_MAGIC));
    proof[HEADER_LEN..].copy_from_slice(&mac(&config.secret, CONNECTOR_ROLE, &cn, &challenge.nonce, ids));
    send_own(&sock, &proof, &own)?;
    let peer = map_peer(read_accept(&sock)?, challenge.node)?;
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
    admission: Arc<AdmissionCells>,
}

impl ShmListener {
    /// Listens under `name` (in the abstract Unix socket namespace of this network namespace).
    pub fn bind(name: &str) -> Result<Self, ConnectError> {
        Self::bind_counted(name, Arc::default())
    }

    /// [`ShmListener::bind`], counting its peers into `admission` (shared with other
    /// listeners of the same node).
    pub(crate) fn bind_counted(name: &str, admission: Arc<AdmissionCells>) -> Result<Self, ConnectError> {
        let listener = UnixListener::bind_addr(&socket_addr(name)?)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener, name: name.to_string(), admission })
    }

    /// The name peers connect to.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What became of the peers that connected so far: admitted, refused, failed.
    pub fn admission_counters(&self) -> AdmissionCounters {
        self.admission.snapshot()
    }

    /// Accepts one pending peer, if any, without blocking on the rendezvous.
    pub fn try_accept(&self, config: &ShmConfig) -> Result<Option<ShmChannel>, ConnectError> {
        self.try_accept_as(config, NodeId::UNKNOWN)
    }

    /// [`ShmListener::try_accept`], telling the peer that we are node `node`. A peer that
    /// is refused or fails the rendezvous is dropped (told why, counted and logged) and
    /// this returns `None`: only a failure of the listener itself is an error.
    pub fn try_accept_as(&self, config: &ShmConfig, node: NodeId) -> Result<Option<ShmChannel>, ConnectError> {
        match self.accept_connection()? {
            Some(accepted) => Ok(accepted.handshake(config, node).ok()),
            None => Ok(None),
        }
    }

    /// Takes one pending peer, if any, without running the handshake (which blocks for up
    /// to its timeout on a silent peer), so a caller that must not block runs it elsewhere.
    pub fn accept_connection(&self) -> Result<Option<AcceptedShm>, ConnectError> {
        match self.listener.accept() {
            Ok((sock, _)) => Ok(Some(AcceptedShm { sock, what: self.what(), admission: self.admission.clone() })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn what(&self) -> Arc<str> {
        format!("shared-memory listener {}", self.name).into()
    }

    /// Accepts one peer, waiting up to `timeout` (peers refused meanwhile are dropped).
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
    /// The listener, for log lines.
    what: Arc<str>,
    admission: Arc<AdmissionCells>,
}

impl AcceptedShm {
    /// Runs the listener's side of the handshake as node `node` (blocking, up to 5 s):
    /// judges the peer's credentials, checks its proof of the secret, validates its
    /// mapping and hands it ours. Counts and logs (rate-limited) what became of the peer.
    pub fn handshake(self, config: &ShmConfig, node: NodeId) -> Result<ShmChannel, ConnectError> {
        let peer = PeerCredentials::of(&self.sock).map_err(|_| Refusal::Unidentified);
        let pid = peer.as_ref().ok().map(|p| p.pid);
        let (what, admission) = (self.what.clone(), self.admission.clone());
        let result = self.rendezvous(peer, config, node);
        match &result {
            Ok(_) => admission.admitted(),
            Err(ConnectError::Refused(r)) => admission.refused(&what, r, pid),
            Err(e) => admission.failed(&what, e),
        }
        result
    }

    fn rendezvous(
        self,
        peer: Result<PeerCredentials, Refusal>,
        config: &ShmConfig,
        node: NodeId,
    ) -> Result<ShmChannel, ConnectError> {
        let sock = self.sock;
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        sock.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        if let Err(r) = peer.and_then(|p| config.allowed.admit_connector(&p, &sock)) {
            send_refusal(&sock, &r);
            return Err(r.into());
        }
        let (peer_node, cn) = read_hello(&sock)?;
        let sn = nonce();
        let ids = Ids { tags: (0, 0), nodes: (peer_node.0, node.0) };
        send_challenge(&sock, node, &sn, &mac(&config.secret, LISTENER_ROLE, &cn, &sn, ids))?;
        let (proof, fds) = read_proof(&sock)?;
        if verify(&config.secret, CONNECTOR_ROLE, &cn, &sn, ids, &proof[HEADER_LEN..]).is_err() {
            send_refusal(&sock, &Refusal::Secret);
            return Err(Refusal::Secret.into());
        }
        let peer = map_peer(fds, peer_node)?;
        let own = create_own(config)?;
        send_own(&sock, &header(ACCEPT_MAGIC), &own)?;
        finish(own, peer, sock, config)
    }
}

/// Checks that the mapping type satisfies the trait the rings need (compile-time).
const _: fn(&MappedMem) -> usize = <MappedMem as RingMem>::len;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A version 2 connector sent its mapping with its HELLO; a version 3 listener reads
    /// the header, tells the version apart, hands nothing back and counts a failure.
    #[test]
    fn a_connector_of_another_version_gets_nothing() {
        let name = format!("v2-{}-{:x}", std::process::id(), nonce()[0]);
        let listener = ShmListener::bind(&name).unwrap();
        let old = UnixStream::connect_addr(&socket_addr(&name).unwrap()).unwrap();
        let mut hello = [0u8; 24];
        hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello[8..16].copy_from_slice(&2u64.to_le_bytes());
        (&old).write_all(&hello).unwrap();
        assert!(listener.try_accept(&ShmConfig::default()).unwrap().is_none());
        let counted = listener.admission_counters();
        assert_eq!((counted.failed, counted.admitted), (1, 0), "{counted:?}");
        let mut answer = Vec::new();
        old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Closed (reset, as our HELLO's tail was left unread) without a byte.
        match (&old).read_to_end(&mut answer) {
            Ok(_) => assert!(answer.is_empty(), "answered with {answer:?}"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
}
