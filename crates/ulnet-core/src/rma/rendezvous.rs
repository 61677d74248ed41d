//! Same-host imports: an importer asks the owner's engine over a Unix socket in the
//! abstract namespace for a segment, and gets its memory file, a control block and the
//! notification eventfd back as `SCM_RIGHTS`, or a refusal.
//!
//! ```text
//!  importer                                                  owner's engine
//!   judges the owner's credentials                             |  judges the importer's
//!    | <-- CHALLENGE magic, version, owner nonce (32 bytes) --- |  credentials at accept;
//!    | <-- or REFUSE magic, version, refusal (32 bytes) ------- |  refused: says why, closes
//!    | -- IMPORT magic, version, node, segment, generation,     |
//!    |      by-name flag, name (128 bytes), importer nonce,     |  checks the proof, then
//!    |      HMAC(secret, "rma import" | request | nonces) ----> |  segment, generation, rights
//!    | <-- REPLY magic, status, rights, notify, segment,        |
//!    |      generation, owner node, length (48 bytes),          |
//!    |      HMAC(secret, "rma grant" | reply | nonces)          |
//!    |      + [segment memfd, control memfd, eventfd] --------- |
//!    |  checks the owner's proof before it maps anything
//! ```
//!
//! Credentials are judged as for shared-memory channels (`transport::shm::admission`):
//! the owner admits its own user and the users and groups of `ShmConfig::allowed`; the
//! importer trusts an owner of its own user, root or its own allowed list. The proofs are
//! the TCP handshake's MACs (`ShmConfig::secret`, empty by default) over the whole request
//! and reply, so the node id an importer is granted rights by is one it proved with the
//! secret. A reply's status is 0 for a grant, an [`AccessError`] code, or
//! [`STATUS_SECRET`] when the importer's proof failed (the importer cannot check the
//! owner's MAC then, and a refusal grants nothing anyway).
//!
//! An importer without write or atomic rights gets a read-only open of the memory file, so
//! it can map it only read-only. The socket stays open for the life of the import: the
//! owner sees the importer die as a hang-up (and stops waiting for it when it revokes).
//! The engine reads requests without blocking, so a client that connects and says nothing
//! holds up nobody; it is dropped after [`REQUEST_TIMEOUT`]. Version history: 1 — first;
//! 2 — the owner speaks first (CHALLENGE or REFUSE), credentials judged both ways, the
//! importer's nonce and MAC appended to IMPORT and the owner's MAC to REPLY.

use super::error::{AccessError, ImportError};
use super::memory::{reopen_read_only, Region};
use super::rights::{Generation, NodeId, NotifyMode, Rights, SegmentId};
use super::segment::{self, ExportTable};
use super::target::{bump, TargetCells};
use super::wire::NAME_MAX;
use crate::error::{ConnectError, Refusal};
use crate::sys::credentials::PeerCredentials;
use crate::sys::fdpass;
use crate::transport::shm::admission::{decode_refusal, encode_refusal, AdmissionCells, REFUSAL_LEN};
use crate::transport::shm::mem::MappedMem;
use crate::transport::shm::ShmConfig;
use crate::transport::tcp::handshake::{mac, nonce, verify, Ids};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHALLENGE_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMC");
const REFUSE_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMN");
const REQUEST_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMI");
const REPLY_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMR");
const VERSION: u32 = 2;
/// CHALLENGE: magic, version, reserved u32, nonce. REFUSE: magic, version, refusal, padding.
const GREETING_LEN: usize = 32;
/// The request's fields (all of version 1).
const FIELDS_LEN: usize = 32 + NAME_MAX;
/// The request: its fields, the importer's nonce and MAC.
const REQUEST_LEN: usize = FIELDS_LEN + 16 + 32;
/// The reply's fields (all of version 1).
const REPLY_FIELDS_LEN: usize = 48;
/// The reply: its fields and the owner's MAC.
const REPLY_LEN: usize = REPLY_FIELDS_LEN + 32;
/// A reply's status when the importer failed to prove the cluster secret: outside the
/// range of [`AccessError`] codes, which may grow.
pub(crate) const STATUS_SECRET: u8 = 0x80;
const IMPORT_ROLE: &[u8] = b"rma import";
const GRANT_ROLE: &[u8] = b"rma grant";
/// A connected client that has not sent its whole request by then is dropped.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn socket_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("ulnet-rma/{name}").as_bytes())
}

/// The MAC of one side over `message` and both nonces.
fn proof(secret: &[u8], role: &[u8], message: &[u8], cn: &[u8; 16], sn: &[u8; 16]) -> [u8; 32] {
    mac(secret, &[role, message].concat(), cn, sn, Ids { tags: (0, 0), nodes: (0, 0) })
}

fn proof_holds(secret: &[u8], role: &[u8], message: &[u8], cn: &[u8; 16], sn: &[u8; 16], claimed: &[u8]) -> bool {
    verify(secret, &[role, message].concat(), cn, sn, Ids { tags: (0, 0), nodes: (0, 0) }, claimed).is_ok()
}

/// Which segment an importer asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// The live export under this name.
    Name(String),
    /// This export.
    Exact(SegmentId, Generation),
}

/// What an importer receives for a granted import.
pub(crate) struct Granted {
    pub(crate) segment: SegmentId,
    pub(crate) generation: Generation,
    pub(crate) owner: NodeId,
    pub(crate) rights: Rights,
    pub(crate) region: Region,
    pub(crate) block: MappedMem,
    pub(crate) doorbell: OwnedFd,
    pub(crate) socket: UnixStream,
}

fn encode_request(importer: NodeId, wanted: &Wanted) -> [u8; FIELDS_LEN] {
    let mut b = [0u8; FIELDS_LEN];
    b[..8].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&importer.0.to_le_bytes());
    match wanted {
        Wanted::Name(name) => {
            b[24] = 1;
            b[25] = name.len() as u8;
            b[32..32 + name.len()].copy_from_slice(name.as_bytes());
        }
        Wanted::Exact(segment, generation) => {
            b[16..20].copy_from_slice(&segment.0.to_le_bytes());
            b[20..24].copy_from_slice(&generation.0.to_le_bytes());
        }
    }
    b
}

fn decode_request(b: &[u8; FIELDS_LEN]) -> Option<(NodeId, Wanted)> {
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) != REQUEST_MAGIC
        || u32_at(8) != VERSION
        || b[26..32].iter().any(|&x| x != 0)
    {
        return None;
    }
    let importer = NodeId(u32_at(12));
    let wanted = match b[24] {
        0 => Wanted::Exact(SegmentId(u32_at(16)), Generation(u32_at(20))),
        1 => {
            let len = b[25] as usize;
            if len == 0 || len > NAME_MAX || u32_at(16) != 0 || u32_at(20) != 0 {
                return None;
            }
            Wanted::Name(String::from_utf8(b[32..32 + len].to_vec()).ok()?)
        }
        _ => return None,
    };
    Some((importer, wanted))
}

struct ReplyFields {
    status: u8,
    rights: Rights,
    notify: NotifyMode,
    segment: SegmentId,
    generation: Generation,
    owner: NodeId,
    len: u64,
}

fn encode_reply(r: &ReplyFields) -> [u8; REPLY_FIELDS_LEN] {
    let mut b = [0u8; REPLY_FIELDS_LEN];
    b[..8].copy_from_slice(&REPLY_MAGIC.to_le_bytes());
    b[8] = r.status;
    b[9] = r.rights.bits();
    b[10] = r.notify as u8;
    b[12..16].copy_from_slice(&r.segment.0.to_le_bytes());
    b[16..20].copy_from_slice(&r.generation.0.to_le_bytes());
    b[20..24].copy_from_slice(&r.owner.0.to_le_bytes());
    b[24..32].copy_from_slice(&r.len.to_le_bytes());
    b
}

fn greeting(magic: u64, rest: &[u8]) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[..8].copy_from_slice(&magic.to_le_bytes());
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[16..16 + rest.len()].copy_from_slice(rest);
    b
}

fn io_error(e: io::Error) -> ImportError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ImportError::Timeout,
        io::ErrorKind::UnexpectedEof => ImportError::Protocol("the owner closed the rendezvous"),
        _ => ImportError::Io(e),
    }
}

/// Reads the owner's greeting: its nonce, or why it refuses us.
fn read_challenge(sock: &UnixStream) -> Result<[u8; 16], ImportError> {
    let mut b = [0u8; GREETING_LEN];
    (&*sock).read_exact(&mut b).map_err(io_error)?;
    let magic = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    if ![CHALLENGE_MAGIC, REFUSE_MAGIC].contains(&magic) {
        return Err(ImportError::Protocol("not a ulnet RMA rendezvous"));
    }
    if u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) != VERSION {
        return Err(ImportError::Protocol("the owner speaks another rendezvous version"));
    }
    if magic == REFUSE_MAGIC {
        let refusal = decode_refusal(b[16..16 + REFUSAL_LEN].try_into().expect("REFUSAL_LEN bytes"))
            .ok_or(ImportError::Protocol("the owner refused for a reason this version does not know"))?;
        return Err(ConnectError::Refused(refusal).into());
    }
    Ok(b[16..32].try_into().expect("16 bytes"))
}

fn connect(name: &str, timeout: Duration) -> Result<UnixStream, ImportError> {
    let sock = UnixStream::connect_addr(&socket_addr(name)?).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
            ImportError::Connect(ConnectError::NoListener(name.to_string()))
        }
        _ => ImportError::Io(e),
    })?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    Ok(sock)
}

/// Imports over the rendezvous of the node listening under `name` on this host, judging
/// the owner and proving the secret as `config` says.
pub(crate) fn import(
    name: &str,
    importer: NodeId,
    wanted: &Wanted,
    timeout: Duration,
    config: &ShmConfig,
) -> Result<Granted, ImportError> {
    let sock = connect(name, timeout)?;
    let owner = PeerCredentials::of(&sock).map_err(|_| ConnectError::Refused(Refusal::Unidentified))?;
    config.allowed.admit_listener(&owner, &sock).map_err(ConnectError::Refused)?;
    let sn = read_challenge(&sock)?;
    let cn = nonce();
    let fields = encode_request(importer, wanted);
    let request = [&fields[..], &cn, &proof(&config.secret, IMPORT_ROLE, &fields, &cn, &sn)].concat();
    fdpass::send_with_fds(&sock, &request, &[])?;
    let mut b = [0u8; REPLY_LEN];
    let fds = fdpass::recv_with_fds(&sock, &mut b).map_err(io_error)?;
    if u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) != REPLY_MAGIC {
        return Err(ImportError::Protocol("not a ulnet RMA rendezvous"));
    }
    match b[8] {
        0 => {}
        STATUS_SECRET => return Err(ConnectError::Refused(Refusal::Secret).into()),
        code => {
            return Err(ImportError::Access(
                AccessError::from_code(code).ok_or(ImportError::Protocol("unknown status"))?,
            ))
        }
    }
    let (fields, owner_proof) = b.split_at(REPLY_FIELDS_LEN);
    if !proof_holds(&config.secret, GRANT_ROLE, fields, &cn, &sn, owner_proof) {
        return Err(ConnectError::Refused(Refusal::Secret).into());
    }
    map_granted(&b, fds, importer, sock)
}

/// Maps what a checked grant sent, checking it is what the reply says.
fn map_granted(
    b: &[u8; REPLY_LEN],
    fds: Vec<OwnedFd>,
    importer: NodeId,
    sock: UnixStream,
) -> Result<Granted, ImportError> {
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let [data, block, doorbell]: [OwnedFd; 3] =
        fds.try_into().map_err(|_| ImportError::Protocol("expected a segment, a control block and an eventfd"))?;
    let rights = Rights::from_bits_truncate(b[9]);
    let segment = SegmentId(u32_at(12));
    let generation = Generation(u32_at(16));
    let owner = NodeId(u32_at(20));
    let len = usize::try_from(u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")))
        .map_err(|_| ImportError::Protocol("segment too large"))?;
    let data = File::from(data);
    crate::sys::memfd::check_sealed(&data)?;
    let region = Region::map(&data, len, rights.needs_writable_mapping())?;
    let block_file = File::from(block);
    crate::sys::memfd::check_sealed(&block_file)?;
    let block = MappedMem::map(&block_file)?;
    let info = super::control::read_info(&block).ok_or(ImportError::Protocol("bad control block"))?;
    if info.segment != segment.0 || info.generation != generation.0 || info.importer != importer.0 {
        return Err(ImportError::Protocol("control block is for another import"));
    }
    sock.set_read_timeout(None)?;
    sock.set_nonblocking(true)?;
    Ok(Granted { segment, generation, owner, rights, region, block, doorbell, socket: sock })
}

/// A client admitted by its credentials and challenged, that has not finished asking.
struct Pending {
    sock: UnixStream,
    /// Our nonce in its challenge.
    nonce: [u8; 16],
    buf: [u8; REQUEST_LEN],
    got: usize,
    deadline: Instant,
}

/// The engine's side: a listening socket and the clients that have not finished asking.
pub(crate) struct RendezvousServer {
    listener: UnixListener,
    pending: Vec<Pending>,
    config: ShmConfig,
    admission: Arc<AdmissionCells>,
    /// This rendezvous, for log lines.
    what: String,
}

/// Most clients waiting to finish their request at once; more are refused at accept. 64:
/// imports are rare; this only bounds what a flood of idle connections can hold.
const PENDING_MAX: usize = 64;

impl RendezvousServer {
    /// Listens under `name`, admitting and proving as `config` says, counting into
    /// `admission`.
    pub(crate) fn bind(name: &str, config: ShmConfig, admission: Arc<AdmissionCells>) -> io::Result<Self> {
        let listener = UnixListener::bind_addr(&socket_addr(name)?)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener, pending: Vec::new(), config, admission, what: format!("RMA rendezvous {name}") })
    }

    /// Descriptors to sleep on: the listener and the clients still asking.
    pub(crate) fn wait_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        std::iter::once(self.listener.as_fd()).chain(self.pending.iter().map(|p| p.sock.as_fd()))
    }

    /// Judges a new client: a refused one is told why and dropped, an admitted one is
    /// challenged and waits in `pending`.
    fn greet(&mut self, sock: UnixStream) {
        if let Err(e) = sock.set_nonblocking(true) {
            return self.admission.failed(&self.what, &e);
        }
        // A fresh socket's buffer is empty: the short writes below fail only if the client
        // has left already.
        let peer = PeerCredentials::of(&sock).map_err(|_| Refusal::Unidentified);
        let admitted = peer.and_then(|p| self.config.allowed.admit_connector(&p, &sock));
        if let Err(refusal) = admitted {
            // Counted before it is told: a client that heard its refusal finds it counted.
            self.admission.refused(&self.what, &refusal, peer.ok().map(|p| p.pid));
            let _ = fdpass::send_with_fds(&sock, &greeting(REFUSE_MAGIC, &encode_refusal(&refusal)), &[]);
            return;
        }
        let nonce = nonce();
        match fdpass::send_with_fds(&sock, &greeting(CHALLENGE_MAGIC, &nonce), &[]) {
            Ok(()) => self.pending.push(Pending {
                sock,
                nonce,
                buf: [0; REQUEST_LEN],
                got: 0,
                deadline: Instant::now() + REQUEST_TIMEOUT,
            }),
            Err(e) => self.admission.failed(&self.what, &e),
        }
    }

    /// Accepts clients and answers whole requests. Returns the number answered or dropped.
    pub(crate) fn progress(&mut self, table: &ExportTable, cells: &TargetCells) -> usize {
        let mut work = 0;
        while self.pending.len() < PENDING_MAX {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    self.greet(sock);
                    work += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("rendezvous accept failed: {e}");
                    break;
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let done = match (&p.sock).read(&mut p.buf[p.got..]) {
                Ok(0) => true,
                Ok(n) => {
                    p.got += n;
                    p.got == REQUEST_LEN
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                    now >= p.deadline
                }
                Err(_) => true,
            };
            if done {
                let p = self.pending.swap_remove(i);
                if p.got == REQUEST_LEN {
                    let ask = Asked { request: &p.buf, nonce: &p.nonce, sock: &p.sock };
                    answer(table, cells, self, &ask);
                } else {
                    self.admission.failed(&self.what, &"the client left or went silent before its whole request");
                }
                work += 1;
            } else {
                i += 1;
            }
        }
        work
    }
}

/// One whole request, the nonce it answers, and the socket it came on.
struct Asked<'a> {
    request: &'a [u8; REQUEST_LEN],
    nonce: &'a [u8; 16],
    sock: &'a UnixStream,
}

/// Sends a reply, with the owner's MAC over it (a refusal's is sent but not checked).
fn reply(server: &RendezvousServer, ask: &Asked<'_>, r: &ReplyFields, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let fields = encode_reply(r);
    let cn: &[u8; 16] = ask.request[FIELDS_LEN..FIELDS_LEN + 16].try_into().expect("16 bytes");
    let owner_proof = proof(&server.config.secret, GRANT_ROLE, &fields, cn, ask.nonce);
    fdpass::send_with_fds(ask.sock, &[&fields[..], &owner_proof].concat(), fds)
}

/// Answers one whole request (the socket is dropped by the caller afterwards; a granted
/// import keeps a duplicate of it).
fn answer(table: &ExportTable, cells: &TargetCells, server: &RendezvousServer, ask: &Asked<'_>) {
    let refuse = |status: u8| {
        bump(&cells.mapped_refused, 1);
        tracing::debug!(status, "same-host import refused");
        let r = ReplyFields {
            status,
            rights: Rights::NONE,
            notify: NotifyMode::Never,
            segment: SegmentId(0),
            generation: Generation(0),
            owner: table.node,
            len: 0,
        };
        let _ = reply(server, ask, &r, &[]);
    };
    let fields: &[u8; FIELDS_LEN] = ask.request[..FIELDS_LEN].try_into().expect("FIELDS_LEN bytes");
    let Some((importer, wanted)) = decode_request(fields) else {
        return refuse(AccessError::Malformed.code());
    };
    let cn: &[u8; 16] = ask.request[FIELDS_LEN..FIELDS_LEN + 16].try_into().expect("16 bytes");
    if !proof_holds(&server.config.secret, IMPORT_ROLE, fields, cn, ask.nonce, &ask.request[FIELDS_LEN + 16..]) {
        server.admission.refused(&server.what, &Refusal::Secret, PeerCredentials::of(ask.sock).ok().map(|p| p.pid));
        return refuse(STATUS_SECRET);
    }
    server.admission.admitted();
    let found = match &wanted {
        Wanted::Name(name) => table.find(name.as_bytes()).ok_or(AccessError::UnknownName),
        Wanted::Exact(segment, generation) => match table.live(*segment) {
            Some((shared, current)) if current == *generation => Ok((shared, current)),
            Some(_) => Err(AccessError::StaleGeneration),
            None => Err(table.classify(*segment, *generation).err().unwrap_or(AccessError::UnknownSegment)),
        },
    };
    let (shared, generation) = match found {
        Ok(f) => f,
        Err(e) => return refuse(e.code()),
    };
    let rights = shared.grants.rights_of(importer);
    if rights == Rights::NONE {
        return refuse(AccessError::Denied.code());
    }
    let (data, block) = match segment::add_mapped_importer(table, &shared, generation, importer, ask.sock) {
        Ok(files) => files,
        Err(e) => return refuse(e.code()),
    };
    let data = if rights.needs_writable_mapping() {
        data
    } else {
        match reopen_read_only(&data) {
            Ok(ro) => ro,
            Err(e) => {
                tracing::warn!("read-only reopen of a segment failed: {e}");
                return refuse(AccessError::Unavailable.code());
            }
        }
    };
    let r = ReplyFields {
        status: 0,
        rights,
        notify: shared.notify_mode(),
        segment: shared.id,
        generation,
        owner: table.node,
        len: shared.region.len() as u64,
    };
    let fds = [data.as_fd(), block.as_fd(), table.notifications.doorbell_fd()];
    match reply(server, ask, &r, &fds) {
        Ok(()) => {
            bump(&cells.mapped_imports, 1);
            tracing::debug!(segment = shared.id.0, importer = importer.0, ?rights, "same-host import mapped");
        }
        Err(e) => tracing::debug!("same-host import reply failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn requests_round_trip(node: u32, seg: u32, gen: u32, name in "[a-z0-9./-]{1,64}", by_name: bool) {
            let wanted = if by_name { Wanted::Name(name) } else { Wanted::Exact(SegmentId(seg), Generation(gen)) };
            prop_assert_eq!(decode_request(&encode_request(NodeId(node), &wanted)), Some((NodeId(node), wanted)));
        }

        #[test]
        fn random_requests_never_crash(bytes in proptest::collection::vec(any::<u8>(), FIELDS_LEN..=FIELDS_LEN)) {
            let b: [u8; FIELDS_LEN] = bytes.try_into().unwrap();
            let _ = decode_request(&b);
        }
    }
}
