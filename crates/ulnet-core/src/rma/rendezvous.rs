//! Same-host imports: an importer asks the owner's engine over a Unix socket in the
//! abstract namespace for a segment, and gets its memory file, a control block and the
//! notification eventfd back as `SCM_RIGHTS`, or a refusal.
//!
//! ```text
//!  importer                                              owner's engine
//!    | -- IMPORT magic, version, node, segment, generation,     |  checks peer uid, segment,
//!    |           by-name flag, name (96 bytes) --------------->  |  generation, rights
//!    | <-- REPLY magic, status, rights, notify, segment,         |
//!    |           generation, owner node, length (48 bytes)       |
//!    |           + [segment memfd, control memfd, eventfd] ----  |
//! ```
//!
//! An importer without write or atomic rights gets a read-only open of the memory file, so
//! it can map it only read-only. The socket stays open for the life of the import: the
//! owner sees the importer die as a hang-up (and stops waiting for it when it revokes).
//! The engine reads requests without blocking, so a client that connects and says nothing
//! holds up nobody; it is dropped after [`REQUEST_TIMEOUT`]. Version history: 1 — first.

use super::error::{AccessError, ImportError};
use super::memory::{reopen_read_only, Region};
use super::rights::{Generation, NodeId, NotifyMode, Rights, SegmentId};
use super::segment::{self, ExportTable};
use super::target::{bump, TargetCells};
use super::wire::NAME_MAX;
use crate::sys::fdpass;
use crate::transport::shm::mem::MappedMem;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

const REQUEST_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMI");
const REPLY_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMR");
const VERSION: u32 = 1;
const REQUEST_LEN: usize = 32 + NAME_MAX;
const REPLY_LEN: usize = 48;
/// A connected client that has not sent its whole request by then is dropped.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn socket_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("ulnet-rma/{name}").as_bytes())
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

fn encode_request(importer: NodeId, wanted: &Wanted) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
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

fn decode_request(b: &[u8; REQUEST_LEN]) -> Option<(NodeId, Wanted)> {
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

fn encode_reply(r: &ReplyFields) -> [u8; REPLY_LEN] {
    let mut b = [0u8; REPLY_LEN];
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

/// Imports over the rendezvous of the node listening under `name` on this host.
pub(crate) fn import(name: &str, importer: NodeId, wanted: &Wanted, timeout: Duration) -> Result<Granted, ImportError> {
    let sock = UnixStream::connect_addr(&socket_addr(name)?).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
            ImportError::Connect(crate::error::ConnectError::NoListener(name.to_string()))
        }
        _ => ImportError::Io(e),
    })?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    fdpass::send_with_fds(&sock, &encode_request(importer, wanted), &[])?;
    let mut b = [0u8; REPLY_LEN];
    let fds = fdpass::recv_with_fds(&sock, &mut b).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ImportError::Timeout,
        _ => ImportError::Io(e),
    })?;
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) != REPLY_MAGIC {
        return Err(ImportError::Protocol("not a ulnet RMA rendezvous"));
    }
    if b[8] != 0 {
        return Err(ImportError::Access(AccessError::from_code(b[8]).ok_or(ImportError::Protocol("unknown status"))?));
    }
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

struct Pending {
    sock: UnixStream,
    buf: [u8; REQUEST_LEN],
    got: usize,
    deadline: Instant,
}

/// The engine's side: a listening socket and the clients that have not finished asking.
pub(crate) struct RendezvousServer {
    listener: UnixListener,
    pending: Vec<Pending>,
}

/// Most clients waiting to finish their request at once; more are refused at accept. 64:
/// imports are rare; this only bounds what a flood of idle connections can hold.
const PENDING_MAX: usize = 64;

impl RendezvousServer {
    pub(crate) fn bind(name: &str) -> io::Result<Self> {
        let listener = UnixListener::bind_addr(&socket_addr(name)?)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener, pending: Vec::new() })
    }

    /// Descriptors to sleep on: the listener and the clients still asking.
    pub(crate) fn wait_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        std::iter::once(self.listener.as_fd()).chain(self.pending.iter().map(|p| p.sock.as_fd()))
    }

    /// Accepts clients and answers whole requests. Returns the number answered or dropped.
    pub(crate) fn progress(&mut self, table: &ExportTable, cells: &TargetCells) -> usize {
        let mut work = 0;
        while self.pending.len() < PENDING_MAX {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    if sock.set_nonblocking(true).is_ok() {
                        self.pending.push(Pending {
                            sock,
                            buf: [0; REQUEST_LEN],
                            got: 0,
                            deadline: Instant::now() + REQUEST_TIMEOUT,
                        });
                    }
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
                    answer(table, cells, &p.sock, &p.buf);
                }
                work += 1;
            } else {
                i += 1;
            }
        }
        work
    }
}

/// Answers one whole request (the socket is dropped by the caller afterwards; a granted
/// import keeps a duplicate of it).
fn answer(table: &ExportTable, cells: &TargetCells, sock: &UnixStream, request: &[u8; REQUEST_LEN]) {
    let refuse = |status: AccessError| {
        bump(&cells.mapped_refused, 1);
        tracing::debug!(?status, "same-host import refused");
        let r = ReplyFields {
            status: status.code(),
            rights: Rights::NONE,
            notify: NotifyMode::Never,
            segment: SegmentId(0),
            generation: Generation(0),
            owner: table.node,
            len: 0,
        };
        let _ = fdpass::send_with_fds(sock, &encode_reply(&r), &[]);
    };
    match rustix::net::sockopt::get_socket_peercred(sock) {
        Ok(cred) if cred.uid == rustix::process::geteuid() => {}
        _ => return refuse(AccessError::Denied),
    }
    let Some((importer, wanted)) = decode_request(request) else {
        return refuse(AccessError::Malformed);
    };
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
        Err(e) => return refuse(e),
    };
    let rights = shared.grants.rights_of(importer);
    if rights == Rights::NONE {
        return refuse(AccessError::Denied);
    }
    let (data, block) = match segment::add_mapped_importer(table, &shared, generation, importer, sock) {
        Ok(files) => files,
        Err(e) => return refuse(e),
    };
    let data = if rights.needs_writable_mapping() {
        data
    } else {
        match reopen_read_only(&data) {
            Ok(ro) => ro,
            Err(e) => {
                tracing::warn!("read-only reopen of a segment failed: {e}");
                return refuse(AccessError::Unavailable);
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
    match fdpass::send_with_fds(sock, &encode_reply(&r), &fds) {
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
        fn random_requests_never_crash(bytes in proptest::collection::vec(any::<u8>(), REQUEST_LEN..=REQUEST_LEN)) {
            let b: [u8; REQUEST_LEN] = bytes.try_into().unwrap();
            let _ = decode_request(&b);
        }
    }
}
