//! [`Rma`]: a node's handle on remote memory — its exports, its engine, and the initiator
//! side: peers, imports, one-sided operations and their completions.

mod blocking;
mod completion;
#[cfg(test)]
mod tests;

use super::accept::{Acceptor, ShmAcceptor, TcpAcceptor, UdpAcceptor};
use super::engine::{Engine, Inbox, InboxItem};
use super::error::{AccessError, ExportError, ImportError, RmaError};
use super::mapped::MappedImport;
use super::notify::Notifications;
use super::rendezvous::{self, RendezvousServer, Wanted};
use super::rights::{Access, NodeId, NotifyMode, Rights, SegmentId};
use super::segment::{ExportTable, ExportedSegment, SegmentDescriptor};
use super::target::{TargetCells, TargetCounters};
use super::wire::{self, LookupAnswer, Op, Place, Request, Response, HEADER_LEN, NAME_MAX};
use crate::error::{ChannelError, ConnectError, SendError};
use crate::trace::{self, MessageKind};
use crate::transport::shm::ShmConfig;
use crate::transport::tcp::TcpConfig;
use crate::transport::udp::{UdpConfig, UdpCounters, UdpStats};
use crate::transport::{ReadyProbe, SendOutcome, Transport};
use completion::{fail_peer, finish, Kind, Owned, Sink, Slot, TracedOp, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a node's engine makes progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A thread of its own applies remote requests (and sleeps when there are none): the
    /// application is never involved. The default.
    Thread,
    /// The application's calls to [`Rma::progress`] (and [`Rma::poll`]) run the engine:
    /// for single-threaded programs that poll anyway, as `ucx_perftest` does.
    Manual,
}

/// Settings of an [`Rma`].
#[derive(Clone, Debug)]
pub struct RmaConfig {
    /// This node's id: importers are known to targets by it, rights are granted to it.
    pub node: NodeId,
    /// Who runs the engine.
    pub progress: Progress,
    /// How long the engine thread keeps polling after its last request before it sleeps in
    /// the kernel. 50 µs: covers the gaps inside a burst of requests (a round trip over
    /// loopback TCP is 20–40 µs) without holding a core when the node is idle.
    pub engine_spin: Duration,
    /// Slots of the export table, sized up front. 4,096: a node exports a segment per
    /// service it offers and per client it caches for; far fewer in practice.
    pub max_segments: usize,
    /// Operations in flight at once (the slab of operation slots). 1,024: keeps a 64 KiB
    /// block stream 64 MiB deep, beyond what one channel can have in flight.
    pub max_outstanding: usize,
    /// Notifications held for the owner before more are dropped (counted). 4,096.
    pub notifications_max: usize,
    /// How long a revocation waits for a same-host importer caught inside a store before it
    /// gives up on it. 100 ms: a store takes nanoseconds; only a descheduled or stopped
    /// importer takes longer, and its in-flight store is then reported as uncertain.
    pub revoke_grace: Duration,
    /// How long imports, lookups and handshakes wait for the target. 10 s.
    pub control_timeout: Duration,
    /// Bytes of requests to one peer gathered into one message before it goes out
    /// (doorbell batching; UCX's transmit buffering, TCP's autocork), capped by what the
    /// channel carries whole. 1,400: what one Ethernet datagram carries after the headers,
    /// 35 fetch-and-adds; a longer batch saves little more and holds the first request of a
    /// burst longer. 0 sends every request as a message of its own (as version 1 peers
    /// and shared-memory channels, where a post costs no system call, always do). A batch
    /// never delays a lone operation: see [`Rma::poll`].
    pub batch_max: usize,
    /// Settings of shared-memory channels (the channel path over shared memory).
    pub shm: ShmConfig,
    /// Settings of TCP channels (the cluster secret).
    pub tcp: TcpConfig,
    /// Settings of UDP channels (the cluster secret, windows, timers).
    pub udp: UdpConfig,
}

impl RmaConfig {
    /// Defaults for node `node`.
    pub fn new(node: NodeId) -> Self {
        Self {
            node,
            progress: Progress::Thread,
            engine_spin: Duration::from_micros(50),
            max_segments: 4096,
            max_outstanding: 1024,
            notifications_max: 4096,
            revoke_grace: Duration::from_millis(100),
            control_timeout: Duration::from_secs(10),
            batch_max: 1400,
            shm: ShmConfig::default(),
            tcp: TcpConfig::default(),
            udp: UdpConfig::default(),
        }
    }

    /// Defaults with [`Progress::Manual`].
    pub fn manual(node: NodeId) -> Self {
        Self { progress: Progress::Manual, ..Self::new(node) }
    }
}

/// How [`Rma::import_with`] reaches a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportMode {
    /// Map it when the peer is on this host (shared memory), else use the channel.
    Auto,
    /// Map it; fails for peers not on this host.
    Map,
    /// Send every operation to the target's engine over the channel, even on this host.
    Channel,
}

/// A peer node this `Rma` imports from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerId {
    rma: u32,
    index: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Channel,
    Mapped(u32),
}

/// An imported segment: the handle every one-sided operation takes. Cheap to copy.
/// Only valid with the [`Rma`] that imported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSegment {
    rma: u32,
    peer: u32,
    path: Path,
    descriptor: SegmentDescriptor,
    rights: Option<Rights>,
    notify: bool,
}

impl RemoteSegment {
    /// Where it lives and which export it is.
    pub fn descriptor(&self) -> SegmentDescriptor {
        self.descriptor
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.descriptor.len
    }

    /// Segments are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The rights the target said this node holds, when the import asked it (imports by
    /// descriptor over a channel do not; the target checks every request regardless).
    pub fn rights(&self) -> Option<Rights> {
        self.rights
    }

    /// Whether operations are loads and stores on a mapping (same host).
    pub fn is_mapped(&self) -> bool {
        matches!(self.path, Path::Mapped(_))
    }

    /// The same segment, with the notify bit set on every operation through this handle
    /// (segments in `Conditional` mode then notify their owner).
    pub fn with_notify(mut self) -> Self {
        self.notify = true;
        self
    }
}

/// The outcome of an operation that did not fail (UCX style): back-pressure is an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "NoResource means nothing was done"]
pub enum RmaOutcome<T = ()> {
    /// Completed now; for atomics, the word's previous value, for gets, the data is in the
    /// caller's buffer.
    Done(T),
    /// On its way; a completion carrying this token follows from [`Rma::poll`].
    InProgress(u64),
    /// No room now (channel full, operation slots exhausted, or a fence not yet reached);
    /// nothing was done. Poll and retry.
    NoResource,
}

/// What a completed operation produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Completed<'a> {
    /// A put was applied at the target.
    Put,
    /// The data of a get, valid during the callback.
    Get(&'a [u8]),
    /// The previous value of the word of a compare-and-swap or fetch-and-add.
    Atomic(u64),
    /// Every operation posted before the flush has completed.
    Flush,
}

/// A completion reported by [`Rma::poll`].
#[derive(Debug, PartialEq, Eq)]
pub struct RmaCompletion<'a> {
    /// The token given when the operation was posted.
    pub token: u64,
    /// Its result.
    pub result: Result<Completed<'a>, RmaError>,
}

/// Counters of the initiator side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitiatorCounters {
    /// Operations posted to channels.
    pub posted: u64,
    /// Operations performed on mappings.
    pub mapped: u64,
    /// Operations completed with success (both paths).
    pub completed: u64,
    /// Operations refused, by the target or by the mapped path's checks.
    pub refused: u64,
    /// Operations that failed because their channel did.
    pub failed: u64,
    /// Posts answered with `NoResource`.
    pub no_resource: u64,
}

/// Chunks of one operation at most (the chunk index travels in 16 bits of the token).
const CHUNKS_MAX: u64 = 1 << 16;

struct PeerChannel {
    transport: Box<dyn Transport>,
    probe: Arc<dyn ReadyProbe>,
    put_chunk: usize,
    get_chunk: usize,
    /// Requests queued (sent or in `backlog`), and responses received: in order per channel.
    queued: u64,
    answered: u64,
    /// Encoded requests that found the channel full, sent before anything new (and after
    /// `batch`).
    backlog: VecDeque<Vec<u8>>,
    down: Option<ChannelError>,
    /// Requests posted and not yet handed to the transport, back to back in one message
    /// (wire version 2). Its `batch_cap` bytes are allocated when the channel opens.
    batch: Vec<u8>,
    /// Most bytes `batch` holds: 0 when the channel does not batch.
    batch_cap: usize,
    /// Requests in `batch`.
    batched: u64,
    /// Something was posted since the last progress call.
    posted_since_progress: bool,
    /// A batch went to the transport outside a progress call: the next one sends it.
    send_due: bool,
}

impl PeerChannel {
    /// Hands the batch to the transport as one message. Returns whether the batch is empty.
    fn ship_batch(&mut self) -> Result<bool, SendError> {
        if self.batch.is_empty() {
            return Ok(true);
        }
        match self.transport.send(&[&self.batch])? {
            SendOutcome::Done => {
                self.batch.clear();
                self.batched = 0;
                self.send_due = true;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Queues one encoded request behind everything posted before it: appended to the
    /// batch when it fits (the batch goes first when it does not), else sent alone.
    /// Never allocates.
    fn queue(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        let len: usize = gather.iter().map(|g| g.len()).sum();
        if self.batch.len() + len > self.batch_cap && !self.ship_batch()? {
            return Ok(SendOutcome::NoResource);
        }
        let outcome = if self.batch.len() + len <= self.batch_cap {
            for g in gather {
                self.batch.extend_from_slice(g);
            }
            self.batched += 1;
            SendOutcome::Done
        } else {
            // Too long to share a message: alone, and out at the next progress call.
            self.send_due = true;
            self.transport.send(gather)?
        };
        assert!(self.batch.len() <= self.batch_cap && self.batch.capacity() >= self.batch_cap);
        if outcome == SendOutcome::Done {
            self.posted_since_progress = true;
        }
        Ok(outcome)
    }

    /// Whether a progress call leaves the batch where it is: the application posted since
    /// the last one (it is in a burst) and something else is in flight to this peer (its
    /// responses will bring us back), so more requests may join it. A lone operation, or
    /// one whose poster came back without posting more, goes at once.
    fn holds_batch(&self) -> bool {
        self.batch_cap > 0
            && self.posted_since_progress
            && self.backlog.is_empty()
            && self.answered + self.batched < self.queued
    }

    /// Sends the batch, then the backlog, in order; stops at the first that does not fit.
    /// Returns requests handed to the transport.
    fn ship_all(&mut self) -> usize {
        let mut sent = self.batched as usize;
        if !matches!(self.ship_batch(), Ok(true)) {
            return 0;
        }
        while let Some(front) = self.backlog.front() {
            match self.transport.send(&[front]) {
                Ok(SendOutcome::Done) => {
                    self.backlog.pop_front();
                    sent += 1;
                }
                // Full, or down (the next poll reports it).
                Ok(_) | Err(_) => break,
            }
        }
        sent
    }

    /// A progress call's start: sends what the batching rule lets go. Returns whether the
    /// channel has anything for the wire now (else its I/O waits for a later call).
    fn progress(&mut self) -> (usize, bool) {
        let hold = self.holds_batch();
        self.posted_since_progress = false;
        let sent = if hold { 0 } else { self.ship_all() };
        let io = !hold || self.send_due;
        (sent, io)
    }
}

enum PeerAddr {
    Shm(String),
    Remote,
}

struct Peer {
    addr: PeerAddr,
    node: Option<NodeId>,
    channel: Option<PeerChannel>,
}

struct Flush {
    token: u64,
    /// Per peer, the `queued` count that must be answered.
    marks: Vec<(u32, u64)>,
}

enum EngineRunner {
    Thread { inbox: Arc<Inbox>, handle: Option<std::thread::JoinHandle<()>> },
    Inline(Box<Engine>),
}

/// A node's remote memory: the segments it exports (served by its engine) and the
/// one-sided operations it performs on segments of other nodes.
///
/// Target side: [`Rma::export`] a segment, [`Rma::listen_shm`] / [`Rma::listen_tcp`] /
/// [`Rma::listen_udp`] for importers, read [`Rma::notifications`]. Initiator side:
/// [`Rma::connect_shm`] / [`Rma::connect_tcp`] / [`Rma::connect_udp`] a peer, [`Rma::import`] a segment by name, then
/// [`Rma::get`], [`Rma::put`], [`Rma::compare_and_swap`], [`Rma::fetch_and_add`] (each
/// non-blocking: `Done`, `InProgress(token)` or `NoResource`), [`Rma::poll`] for
/// completions, [`Rma::flush`] and [`Rma::fence`] for completion and ordering. Blocking
/// helpers (`*_blocking`) wrap them for code that just wants the answer.
///
/// Reading a peer's load record and claiming a role word with compare-and-swap:
///
/// ```no_run
/// use ulnet_core::rma::{Access, NodeId, NotifyMode, Rights, Rma, RmaConfig};
/// use std::time::Duration;
///
/// // On node 1: export a 64-byte record that node 2 may read and swap.
/// let mut node1 = Rma::new(RmaConfig::new(NodeId(1)))?;
/// node1.listen_tcp("0.0.0.0:7100")?;
/// let record = node1.export("load", 64, Access::none().grant(NodeId(2), Rights::READ | Rights::ATOMIC), NotifyMode::Never)?;
/// record.store_u64(0, 42); // the owner updates its record with plain stores
///
/// // On node 2:
/// let mut node2 = Rma::new(RmaConfig::new(NodeId(2)))?;
/// let peer = node2.connect_tcp("10.0.0.1:7100", Duration::from_secs(5))?;
/// let load = node2.import(peer, "load")?;
/// let mut bytes = [0u8; 64];
/// node2.get_blocking(&load, 0, &mut bytes, Duration::from_secs(1))?;
/// // Claim the role word at offset 8 if nobody holds it (0): returns what it held.
/// let before = node2.compare_and_swap_blocking(&load, 8, 0, 2, Duration::from_secs(1))?;
/// let claimed = before == 0;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The same, non-blocking, over many peers at once:
///
/// ```no_run
/// # use ulnet_core::rma::*;
/// # fn f(rma: &mut Rma, records: &[RemoteSegment]) -> Result<(), RmaError> {
/// let mut loads = vec![[0u8; 64]; records.len()];
/// let mut pending = 0;
/// for (i, seg) in records.iter().enumerate() {
///     loop {
///         match rma.get(seg, 0, &mut loads[i], i as u64)? {
///             RmaOutcome::Done(()) => break,              // mapped: the data is in loads[i]
///             RmaOutcome::InProgress(_) => { pending += 1; break }
///             RmaOutcome::NoResource => { rma.poll(64, |_| {}); } // (a real loop keeps these)
///         }
///     }
/// }
/// while pending > 0 {
///     rma.poll(64, |c| {
///         if let Ok(Completed::Get(data)) = c.result { loads[c.token as usize].copy_from_slice(data) }
///         pending -= 1;
///     });
/// }
/// # Ok(()) }
/// ```
pub struct Rma {
    id: u32,
    config: RmaConfig,
    table: Arc<ExportTable>,
    cells: Arc<TargetCells>,
    notifications: Notifications,
    engine: EngineRunner,
    peers: Vec<Peer>,
    mapped: Vec<Option<MappedImport>>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    flushes: Vec<Flush>,
    /// After a fence: per peer, the `queued` count that must be answered before operations
    /// to other peers or mappings may go.
    fence: Vec<(u32, u64)>,
    stash: VecDeque<(u64, Result<Owned, RmaError>)>,
    counters: InitiatorCounters,
    polls: u32,
    internal_tokens: u64,
    /// What this node's UDP listener and channels (both sides) dropped and did.
    udp_stats: Arc<UdpStats>,
}

fn next_rma_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn wire_token(index: u32, generation: u16, chunk: u32) -> u64 {
    (u64::from(generation) << 48) | (u64::from(chunk & 0xffff) << 32) | u64::from(index)
}

impl Rma {
    /// A node with no exports and no peers; starts the engine thread in
    /// [`Progress::Thread`] mode.
    pub fn new(config: RmaConfig) -> std::io::Result<Rma> {
        assert!(config.max_outstanding >= 1 && config.max_outstanding <= u32::MAX as usize);
        let notifications = Notifications::new(config.notifications_max)?;
        let table =
            Arc::new(ExportTable::new(config.node, config.max_segments, notifications.clone(), config.revoke_grace));
        let cells = Arc::new(TargetCells::default());
        let inbox = Arc::new(Inbox::new()?);
        let engine = Engine::new(table.clone(), cells.clone(), inbox.clone());
        let engine = match config.progress {
            Progress::Manual => EngineRunner::Inline(Box::new(engine)),
            Progress::Thread => {
                let spin = config.engine_spin;
                let handle = std::thread::Builder::new()
                    .name(format!("ulnet-rma-{}", config.node.0))
                    .spawn(move || engine.run(spin))?;
                EngineRunner::Thread { inbox, handle: Some(handle) }
            }
        };
        let slots = (0..config.max_outstanding).map(|_| Slot::empty()).collect();
        let free_slots = (0..config.max_outstanding as u32).rev().collect();
        Ok(Rma {
            id: next_rma_id(),
            config,
            table,
            cells,
            notifications,
            engine,
            peers: Vec::new(),
            mapped: Vec::new(),
            slots,
            free_slots,
            flushes: Vec::new(),
            fence: Vec::new(),
            stash: VecDeque::new(),
            counters: InitiatorCounters::default(),
            polls: 0,
            internal_tokens: 0,
            udp_stats: Arc::default(),
        })
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.config.node
    }

    fn hand_to_engine(&mut self, item: InboxItem) {
        match &mut self.engine {
            EngineRunner::Thread { inbox, .. } => inbox.push(item),
            EngineRunner::Inline(engine) => engine.add(item),
        }
    }

    // ----- target side -------------------------------------------------------------

    /// Exports a new zeroed segment of `len` bytes under `name`, with `access` rights for
    /// importers and a notify mode. Its generation is fresh.
    pub fn export(
        &mut self,
        name: &str,
        len: usize,
        access: Access,
        notify: NotifyMode,
    ) -> Result<ExportedSegment, ExportError> {
        self.table.export(name, len, &access, notify, None)
    }

    /// Exports into a reserved slot (the name table of the clerk).
    pub(crate) fn export_at(
        &mut self,
        id: SegmentId,
        name: &str,
        len: usize,
        access: Access,
    ) -> Result<ExportedSegment, ExportError> {
        self.table.export(name, len, &access, NotifyMode::Never, Some(id))
    }

    /// Lets importers on this host reach this node under `name`: over shared-memory
    /// channels, and by mapping segments through the rendezvous.
    pub fn listen_shm(&mut self, name: &str) -> Result<(), ConnectError> {
        let admission = self.cells.admission.clone();
        let acceptor = ShmAcceptor::bind_counted(&format!("rma/{name}"), self.config.shm.clone(), admission.clone())?;
        let rendezvous = RendezvousServer::bind(name, self.config.shm.clone(), admission)?;
        self.hand_to_engine(InboxItem::Acceptor(Box::new(acceptor)));
        self.hand_to_engine(InboxItem::Rendezvous(rendezvous));
        Ok(())
    }

    /// Lets importers reach this node over TCP at `addr` (port 0 picks one); returns the
    /// bound address.
    pub fn listen_tcp(&mut self, addr: &str) -> Result<std::net::SocketAddr, ConnectError> {
        let acceptor = TcpAcceptor::bind(addr, self.config.tcp.clone())?;
        let bound = acceptor.local_addr()?;
        self.hand_to_engine(InboxItem::Acceptor(Box::new(acceptor)));
        Ok(bound)
    }

    /// Lets importers reach this node over UDP at `addr` (port 0 picks one); returns the
    /// bound address. The engine runs the UDP protocol of every channel (acks,
    /// retransmissions, keep-alives) and of the handshakes, waking for their timers.
    pub fn listen_udp(&mut self, addr: &str) -> Result<std::net::SocketAddr, ConnectError> {
        let acceptor = UdpAcceptor::bind(addr, self.config.udp.clone(), self.udp_stats.clone())?;
        let bound = acceptor.local_addr();
        self.hand_to_engine(InboxItem::Acceptor(Box::new(acceptor)));
        Ok(bound)
    }

    /// What this node's UDP listener and channels dropped (malformed, stranger,
    /// wrong-secret, replayed datagrams) and did (packets, retransmissions), as initiator
    /// and as target.
    pub fn udp_counters(&self) -> UdpCounters {
        self.udp_stats.snapshot()
    }

    /// Lets importers reach this node through any transport's listener.
    pub fn listen_with(&mut self, acceptor: Box<dyn Acceptor>) {
        self.hand_to_engine(InboxItem::Acceptor(acceptor));
    }

    /// Hands a channel an importer opened (of any transport) to the engine.
    pub fn serve_channel(&mut self, transport: Box<dyn Transport>) {
        self.hand_to_engine(InboxItem::Channel(transport));
    }

    /// The owner's notifications (a handle any thread may poll).
    pub fn notifications(&self) -> Notifications {
        self.notifications.clone()
    }

    /// Counters of the target side.
    pub fn target_counters(&self) -> TargetCounters {
        self.cells.snapshot(&self.table)
    }

    /// The kernel thread id of the engine thread, once it runs (for CPU accounting).
    pub fn engine_thread_id(&self) -> Option<i32> {
        match &self.engine {
            EngineRunner::Thread { inbox, .. } => Some(inbox.tid.load(Ordering::Acquire)).filter(|&t| t != 0),
            EngineRunner::Inline(_) => None,
        }
    }

    /// In [`Progress::Manual`] mode, runs one pass of the engine; in both modes, sends
    /// batched and backlogged requests as [`Rma::poll`] does. Returns the work done.
    pub fn progress(&mut self) -> usize {
        let mut work = 0;
        for peer in &mut self.peers {
            if let Some(ch) = peer.channel.as_mut() {
                work += ch.progress().0;
            }
        }
        if let EngineRunner::Inline(engine) = &mut self.engine {
            work += engine.progress();
        }
        work
    }

    // ----- peers and imports -------------------------------------------------------

    fn add_peer(&mut self, addr: PeerAddr, node: Option<NodeId>, channel: Option<PeerChannel>) -> PeerId {
        self.peers.push(Peer { addr, node, channel });
        PeerId { rma: self.id, index: self.peers.len() as u32 - 1 }
    }

    /// A peer on this host, listening under `name`. No I/O happens until the first import.
    pub fn connect_shm(&mut self, name: &str) -> PeerId {
        self.add_peer(PeerAddr::Shm(name.to_string()), None, None)
    }

    /// A peer reached over TCP at `addr`: connects (failing at once with
    /// [`ConnectError::NoListener`] when nobody listens there) and introduces this node.
    pub fn connect_tcp(&mut self, addr: &str, timeout: Duration) -> Result<PeerId, ConnectError> {
        let transport = crate::transport::tcp::connect_as(addr, &self.config.tcp, self.config.node, timeout)?;
        self.connect_with(Box::new(transport), timeout)
    }

    /// A peer reached over UDP at `addr`: connects (repeating the handshake until
    /// `timeout`) and introduces this node.
    ///
    /// The UDP protocol of the initiator's side of the channel runs inside this node's
    /// calls ([`Rma::poll`], [`Rma::wait`], posts, the blocking helpers), as UDP channels
    /// do everywhere: an importer that makes none of them for longer than the target's
    /// `UdpConfig::peer_timeout` (20 s) is declared failed by the target.
    pub fn connect_udp(&mut self, addr: &str, timeout: Duration) -> Result<PeerId, ConnectError> {
        let transport =
            crate::transport::udp::connect(addr, &self.config.udp, self.config.node, timeout, self.udp_stats.clone())?;
        self.connect_with(Box::new(transport), timeout)
    }

    /// A peer reached over a channel of any transport: introduces this node on it.
    pub fn connect_with(&mut self, transport: Box<dyn Transport>, timeout: Duration) -> Result<PeerId, ConnectError> {
        let (channel, node) = self.introduce(transport, timeout)?;
        Ok(self.add_peer(PeerAddr::Remote, Some(node), Some(channel)))
    }

    /// The node a peer turned out to be, once introduced.
    pub fn peer_node(&self, peer: PeerId) -> Option<NodeId> {
        self.peers.get(peer.index as usize).and_then(|p| p.node)
    }

    /// Sends Hello and waits for the target's answer (the first message on the channel).
    fn introduce(
        &mut self,
        mut transport: Box<dyn Transport>,
        timeout: Duration,
    ) -> Result<(PeerChannel, NodeId), ConnectError> {
        let hello =
            Request { token: 0, notify: false, op: Op::Hello { node: self.config.node, version: wire::VERSION } };
        let mut head = [0u8; HEADER_LEN + 16];
        let head = hello.encode_head(&mut head);
        let deadline = Instant::now() + timeout;
        loop {
            match transport.send(&[head]).map_err(|e| ConnectError::Handshake(send_error_text(&e)))? {
                SendOutcome::Done => break,
                _ if Instant::now() > deadline => return Err(ConnectError::Timeout),
                _ => std::thread::yield_now(),
            }
        }
        let mut answer: Option<Result<(NodeId, u32), ConnectError>> = None;
        while answer.is_none() {
            let _ = transport.flush();
            let got = transport
                .poll_recv(1, &mut |d, _| {
                    answer = Some(match wire::decode_response(d.data) {
                        Ok(Response::HelloAck { node, version }) => Ok((node, version)),
                        Ok(Response::Refused { error: AccessError::Denied, .. }) => Err(ConnectError::Handshake(
                            "target refused our hello: it names another node than our channel's handshake did",
                        )),
                        Ok(Response::Refused { .. }) => Err(ConnectError::Handshake("target refused our hello")),
                        _ => Err(ConnectError::Handshake("target answered hello outside the protocol")),
                    })
                })
                .map_err(|_| ConnectError::Handshake("channel failed during hello"))?;
            if got == 0 {
                if Instant::now() > deadline {
                    return Err(ConnectError::Timeout);
                }
                std::thread::yield_now();
            }
        }
        let (node, version) = answer.expect("loop ends with an answer")?;
        let caps = transport.caps();
        let request_max = caps.rma.request_max;
        let batch_cap = match caps.kind {
            _ if version < 2 => 0,
            crate::transport::TransportKind::Shm => 0,
            _ => self.config.batch_max.min(request_max),
        };
        let probe = transport.probe();
        let channel = PeerChannel {
            transport,
            probe,
            put_chunk: request_max.saturating_sub(HEADER_LEN).max(8),
            get_chunk: request_max.saturating_sub(HEADER_LEN).max(8),
            queued: 0,
            answered: 0,
            backlog: VecDeque::new(),
            down: None,
            batch: Vec::with_capacity(batch_cap),
            batch_cap,
            batched: 0,
            posted_since_progress: false,
            send_due: false,
        };
        Ok((channel, node))
    }

    fn peer_index(&self, peer: PeerId) -> Result<usize, ImportError> {
        if peer.rma != self.id || peer.index as usize >= self.peers.len() {
            return Err(ImportError::UnknownPeer);
        }
        Ok(peer.index as usize)
    }

    /// Opens the channel of a shared-memory peer if it has none yet.
    fn ensure_channel(&mut self, index: usize) -> Result<(), ImportError> {
        if self.peers[index].channel.is_some() {
            return Ok(());
        }
        let PeerAddr::Shm(name) = &self.peers[index].addr else {
            return Err(ImportError::PeerFailed(ChannelError::Closed));
        };
        let timeout = self.config.control_timeout;
        let transport = crate::transport::shm::connect::connect_retry_as(
            &format!("rma/{name}"),
            &self.config.shm,
            self.config.node,
            timeout,
        )?;
        let (channel, node) = self.introduce(Box::new(transport), timeout)?;
        let peer = &mut self.peers[index];
        peer.node = Some(node);
        peer.channel = Some(channel);
        Ok(())
    }

    /// Imports the segment `peer` exports under `name` ([`ImportMode::Auto`]).
    pub fn import(&mut self, peer: PeerId, name: &str) -> Result<RemoteSegment, ImportError> {
        self.import_with(peer, name, ImportMode::Auto)
    }

    /// Imports the segment `peer` exports under `name`, mapped or through the channel.
    pub fn import_with(&mut self, peer: PeerId, name: &str, mode: ImportMode) -> Result<RemoteSegment, ImportError> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(ImportError::NameTooLong);
        }
        let index = self.peer_index(peer)?;
        match (&self.peers[index].addr, mode) {
            (PeerAddr::Shm(shm), ImportMode::Auto | ImportMode::Map) => {
                let shm = shm.clone();
                self.import_mapped(index, &shm, Wanted::Name(name.to_string()))
            }
            (_, ImportMode::Map) => Err(ImportError::Protocol("only peers on this host can be mapped")),
            _ => {
                self.ensure_channel(index)?;
                let answer = self.lookup_blocking(index, name)?;
                let node = self.peers[index].node.expect("introduced");
                Ok(RemoteSegment {
                    rma: self.id,
                    peer: index as u32,
                    path: Path::Channel,
                    descriptor: SegmentDescriptor {
                        node,
                        segment: answer.segment,
                        generation: answer.generation,
                        len: answer.len,
                    },
                    rights: Some(answer.rights),
                    notify: false,
                })
            }
        }
    }

    /// Imports a segment known by its descriptor (from the name service). Through a
    /// channel this costs no round trip: a stale descriptor shows as the first operation's
    /// error. Mapping asks the owner, which refuses a stale one at once.
    pub fn import_descriptor(
        &mut self,
        peer: PeerId,
        descriptor: SegmentDescriptor,
        mode: ImportMode,
    ) -> Result<RemoteSegment, ImportError> {
        let index = self.peer_index(peer)?;
        match (&self.peers[index].addr, mode) {
            (PeerAddr::Shm(shm), ImportMode::Auto | ImportMode::Map) => {
                let shm = shm.clone();
                self.import_mapped(index, &shm, Wanted::Exact(descriptor.segment, descriptor.generation))
            }
            (_, ImportMode::Map) => Err(ImportError::Protocol("only peers on this host can be mapped")),
            _ => {
                self.ensure_channel(index)?;
                Ok(RemoteSegment {
                    rma: self.id,
                    peer: index as u32,
                    path: Path::Channel,
                    descriptor,
                    rights: None,
                    notify: false,
                })
            }
        }
    }

    fn import_mapped(&mut self, index: usize, shm: &str, wanted: Wanted) -> Result<RemoteSegment, ImportError> {
        let granted =
            rendezvous::import(shm, self.config.node, &wanted, self.config.control_timeout, &self.config.shm)?;
        let import = MappedImport::new(granted);
        self.peers[index].node = Some(import.owner);
        let descriptor = SegmentDescriptor {
            node: import.owner,
            segment: import.segment,
            generation: import.generation,
            len: import.len() as u64,
        };
        let rights = Some(import.rights);
        let slot = match self.mapped.iter().position(Option::is_none) {
            Some(i) => {
                self.mapped[i] = Some(import);
                i
            }
            None => {
                self.mapped.push(Some(import));
                self.mapped.len() - 1
            }
        };
        Ok(RemoteSegment {
            rma: self.id,
            peer: index as u32,
            path: Path::Mapped(slot as u32),
            descriptor,
            rights,
            notify: false,
        })
    }

    /// Drops an import: unmaps a mapped segment (the handle and its copies become invalid).
    pub fn release(&mut self, segment: &RemoteSegment) {
        if segment.rma == self.id {
            if let Path::Mapped(i) = segment.path {
                if let Some(m) = self.mapped.get_mut(i as usize) {
                    if m.as_ref().is_some_and(|m| {
                        m.segment == segment.descriptor.segment && m.generation == segment.descriptor.generation
                    }) {
                        *m = None;
                    }
                }
            }
        }
    }

    // ----- operations --------------------------------------------------------------

    fn check_handle(&self, seg: &RemoteSegment) -> Result<(), RmaError> {
        if seg.rma != self.id || seg.peer as usize >= self.peers.len() {
            return Err(RmaError::InvalidHandle);
        }
        Ok(())
    }

    /// The mapping of a mapped handle (`None` for channel handles).
    fn mapped_index(&self, seg: &RemoteSegment) -> Result<Option<usize>, RmaError> {
        self.check_handle(seg)?;
        match seg.path {
            Path::Channel => Ok(None),
            Path::Mapped(i) => match self.mapped.get(i as usize).and_then(Option::as_ref) {
                Some(m) if m.segment == seg.descriptor.segment && m.generation == seg.descriptor.generation => {
                    Ok(Some(i as usize))
                }
                _ => Err(RmaError::InvalidHandle),
            },
        }
    }

    /// Runs a mapped operation, unless a fence holds it back.
    /// `traced`: what a trace records of it (kind, target, bytes), without a clock read of
    /// its own: a mapped operation costs less than reading the clock.
    fn on_mapping<T>(
        &mut self,
        index: usize,
        traced: (MessageKind, &RemoteSegment, u64),
        f: impl FnOnce(&mut MappedImport) -> Result<T, AccessError>,
    ) -> Result<RmaOutcome<T>, RmaError> {
        if !self.fence_allows(None) {
            self.counters.no_resource += 1;
            return Ok(RmaOutcome::NoResource);
        }
        let m = self.mapped[index].as_mut().expect("checked by mapped_index");
        match f(m) {
            Ok(v) => {
                self.counters.mapped += 1;
                self.counters.completed += 1;
                if trace::enabled() {
                    let (kind, seg, len) = traced;
                    trace::record_rma(kind, (self.config.node, seg.descriptor.node), seg.peer, len, 0, 0);
                }
                Ok(RmaOutcome::Done(v))
            }
            Err(e) => {
                self.counters.refused += 1;
                Err(RmaError::Access(e))
            }
        }
    }

    /// Whether a fence lets an operation to `peer` (None: a mapping) go now.
    fn fence_allows(&mut self, peer: Option<u32>) -> bool {
        if self.fence.is_empty() {
            return true;
        }
        let peers = &self.peers;
        self.fence.retain(|&(p, mark)| {
            peers[p as usize].channel.as_ref().is_some_and(|c| c.answered < mark && c.down.is_none())
        });
        self.fence.iter().all(|&(p, _)| Some(p) == peer)
    }

    fn get_with(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        dst: &mut [u8],
        token: u64,
        internal: bool,
    ) -> Result<RmaOutcome, RmaError> {
        let notify = seg.notify;
        if let Some(i) = self.mapped_index(seg)? {
            return self.on_mapping(i, (MessageKind::RmaRead, seg, dst.len() as u64), |m| m.get(offset, dst, notify));
        }
        let (segment, generation) = (seg.descriptor.segment, seg.descriptor.generation);
        let op = |_: &[u8], chunk_off: u64, chunk_len: usize| Op::Get {
            place: Place { segment, generation, offset: offset.wrapping_add(chunk_off) },
            len: chunk_len as u32,
        };
        let traced = Some((MessageKind::RmaRead, seg.descriptor.node));
        self.post(seg.peer, notify, token, Kind::Get, dst.len() as u64, op, &[], internal, traced)
    }

    fn put_with<'d>(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        data: &'d [u8],
        token: u64,
        internal: bool,
    ) -> Result<RmaOutcome, RmaError> {
        let notify = seg.notify;
        if let Some(i) = self.mapped_index(seg)? {
            return self
                .on_mapping(i, (MessageKind::RmaWrite, seg, data.len() as u64), |m| m.put(offset, data, notify));
        }
        let (segment, generation) = (seg.descriptor.segment, seg.descriptor.generation);
        let op = |data: &'d [u8], chunk_off: u64, chunk_len: usize| Op::Put {
            place: Place { segment, generation, offset: offset.wrapping_add(chunk_off) },
            data: &data[chunk_off as usize..chunk_off as usize + chunk_len],
        };
        let traced = Some((MessageKind::RmaWrite, seg.descriptor.node));
        self.post(seg.peer, notify, token, Kind::Put, data.len() as u64, op, data, internal, traced)
    }

    fn atomic_with(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        cas: Option<(u64, u64)>,
        addend: u64,
        token: u64,
        internal: bool,
    ) -> Result<RmaOutcome<u64>, RmaError> {
        let notify = seg.notify;
        let kind = if cas.is_some() { MessageKind::RmaCas } else { MessageKind::RmaFaa };
        if let Some(i) = self.mapped_index(seg)? {
            return self.on_mapping(i, (kind, seg, 8), |m| match cas {
                Some((expected, desired)) => m.compare_swap(offset, expected, desired, notify),
                None => m.fetch_add(offset, addend, notify),
            });
        }
        let place = Place { segment: seg.descriptor.segment, generation: seg.descriptor.generation, offset };
        let op = |_: &[u8], _: u64, _: usize| match cas {
            Some((expected, desired)) => Op::CompareSwap { place, expected, desired },
            None => Op::FetchAdd { place, addend },
        };
        let traced = Some((kind, seg.descriptor.node));
        Ok(match self.post(seg.peer, notify, token, Kind::Atomic, 8, op, &[], internal, traced)? {
            RmaOutcome::Done(()) => unreachable!("channel operations complete later"),
            RmaOutcome::InProgress(t) => RmaOutcome::InProgress(t),
            RmaOutcome::NoResource => RmaOutcome::NoResource,
        })
    }

    /// Reads `dst.len()` bytes at `offset` of the segment.
    ///
    /// Mapped: the data is in `dst` when this returns `Done`. Through a channel: returns
    /// `InProgress(token)`, `dst` is not written, and the data arrives in a
    /// [`Completed::Get`] from [`Rma::poll`]; gets larger than one message are split and
    /// delivered whole once every part is in. Every aligned 8-byte word is read with one
    /// 64-bit load at the target.
    pub fn get(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        dst: &mut [u8],
        token: u64,
    ) -> Result<RmaOutcome, RmaError> {
        self.get_with(seg, offset, dst, token, false)
    }

    /// Writes `data` at `offset` of the segment: a block write of any length, split into
    /// messages the channel carries (the data is copied, so `data` may be reused at once).
    /// Every aligned 8-byte word is written with one 64-bit store at the target.
    ///
    /// Mapped: done when this returns `Done`. Through a channel: `InProgress(token)`, and a
    /// [`Completed::Put`] follows once the target has applied every part.
    pub fn put(&mut self, seg: &RemoteSegment, offset: u64, data: &[u8], token: u64) -> Result<RmaOutcome, RmaError> {
        self.put_with(seg, offset, data, token, false)
    }

    /// Writes a small `data` (at most [`PUT_INLINE_MAX`] bytes) in one message, carried
    /// inline in the channel's descriptor ring where the transport does that (UCX's
    /// `put_short`); larger data is refused with `TooLarge`.
    pub fn put_inline(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        data: &[u8],
        token: u64,
    ) -> Result<RmaOutcome, RmaError> {
        if data.len() > PUT_INLINE_MAX {
            return Err(RmaError::TooLarge { len: data.len() as u64, max: PUT_INLINE_MAX as u64 });
        }
        self.put_with(seg, offset, data, token, false)
    }

    /// Atomically replaces the aligned 64-bit word at `offset` with `desired` if it holds
    /// `expected`. The outcome (`Done` now, or a [`Completed::Atomic`] later) carries the
    /// value the word held before: equal to `expected` exactly when the swap happened.
    pub fn compare_and_swap(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        expected: u64,
        desired: u64,
        token: u64,
    ) -> Result<RmaOutcome<u64>, RmaError> {
        self.atomic_with(seg, offset, Some((expected, desired)), 0, token, false)
    }

    /// Atomically adds `addend` (wrapping) to the aligned 64-bit word at `offset`. The
    /// outcome carries the value the word held before.
    pub fn fetch_and_add(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        addend: u64,
        token: u64,
    ) -> Result<RmaOutcome<u64>, RmaError> {
        self.atomic_with(seg, offset, None, addend, token, false)
    }

    fn no_resource(&mut self) -> RmaOutcome {
        self.counters.no_resource += 1;
        RmaOutcome::NoResource
    }

    /// Posts an operation of `len` bytes to `peer`'s channel, split into chunks that
    /// `op(data, chunk_offset, chunk_len)` describes. All chunks share one slot; the ones
    /// the channel cannot take now wait, encoded, in its backlog. `traced` (kind, target):
    /// while tracing is on, the operation is recorded when it completes.
    #[allow(clippy::too_many_arguments)]
    fn post<'d>(
        &mut self,
        peer: u32,
        notify: bool,
        token: u64,
        kind: Kind,
        len: u64,
        op: impl Fn(&'d [u8], u64, usize) -> Op<'d>,
        data: &'d [u8],
        internal: bool,
        traced: Option<(MessageKind, NodeId)>,
    ) -> Result<RmaOutcome, RmaError> {
        let channel = self.peers[peer as usize].channel.as_ref().ok_or(RmaError::InvalidHandle)?;
        if let Some(e) = &channel.down {
            return Err(RmaError::PeerFailed(e.clone()));
        }
        let chunk = match kind {
            Kind::Put => channel.put_chunk as u64,
            Kind::Get => channel.get_chunk as u64,
            Kind::Atomic | Kind::Lookup => u64::MAX,
        };
        let chunks = len.div_ceil(chunk).max(1);
        if chunks > CHUNKS_MAX {
            return Err(RmaError::TooLarge { len, max: CHUNKS_MAX * chunk });
        }
        if !channel.backlog.is_empty() || !self.fence_allows(Some(peer)) {
            return Ok(self.no_resource());
        }
        let Some(&index) = self.free_slots.last() else {
            return Ok(self.no_resource());
        };
        let channel = self.peers[peer as usize].channel.as_mut().expect("checked above");
        let generation = self.slots[index as usize].generation;
        let mut head = [0u8; HEADER_LEN + 16];
        for c in 0..chunks {
            let chunk_off = c.saturating_mul(chunk);
            let chunk_len = (len - chunk_off.min(len)).min(chunk) as usize;
            let request =
                Request { token: wire_token(index, generation, c as u32), notify, op: op(data, chunk_off, chunk_len) };
            let h = request.encode_head(&mut head);
            let tail = request.body_tail();
            let gather: [&[u8]; 2] = [h, tail];
            let gather = if tail.is_empty() { &gather[..1] } else { &gather[..] };
            if channel.backlog.is_empty() {
                match channel.queue(gather) {
                    Ok(SendOutcome::Done) => {
                        channel.queued += 1;
                        continue;
                    }
                    Ok(_) if c == 0 => return Ok(self.no_resource()),
                    Err(SendError::ChannelDown(e)) if c == 0 => return Err(RmaError::PeerFailed(e)),
                    Err(e) if c == 0 => return Err(RmaError::PeerFailed(ChannelError::Protocol(e.to_string()))),
                    // Later chunks wait in the backlog; a failed channel shows at the next poll.
                    Ok(_) | Err(_) => {}
                }
            }
            channel.backlog.push_back(gather.concat());
            channel.queued += 1;
        }
        self.free_slots.pop();
        let slot = &mut self.slots[index as usize];
        slot.live = true;
        slot.token = token;
        slot.peer = peer;
        slot.kind = kind;
        slot.chunks = chunks as u32;
        slot.chunks_left = chunks as u32;
        slot.chunk_len = usize::try_from(chunk).unwrap_or(usize::MAX);
        slot.error = None;
        slot.internal = internal;
        slot.abandoned = false;
        slot.trace = match traced {
            Some((kind, target)) if trace::enabled() => {
                Some(TracedOp { kind, nodes: (self.config.node, target), len, posted: trace::now() })
            }
            _ => None,
        };
        if kind == Kind::Get && chunks > 1 {
            slot.assembled.clear();
            slot.assembled.resize(len as usize, 0);
        }
        self.counters.posted += 1;
        Ok(RmaOutcome::InProgress(token))
    }

    /// Sends every channel's batch and backlog now, and writes them out: the application
    /// flushes, fences or waits for a completion.
    fn ship_all(&mut self) {
        for peer in &mut self.peers {
            let Some(ch) = peer.channel.as_mut().filter(|c| c.down.is_none()) else { continue };
            ch.ship_all();
            ch.posted_since_progress = false;
            let _ = ch.transport.flush();
        }
    }

    /// Per channel with requests in flight, the count that must be answered.
    fn in_flight_marks(&self) -> Vec<(u32, u64)> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.channel.as_ref().filter(|c| c.answered < c.queued && c.down.is_none()).map(|c| (i as u32, c.queued))
            })
            .collect()
    }

    /// Completes when every operation posted before it has completed at its target: `Done`
    /// at once when nothing is in flight (mapped operations are complete when they
    /// return), else `InProgress(token)` and a [`Completed::Flush`] follows from
    /// [`Rma::poll`], after the completions of those operations.
    pub fn flush(&mut self, token: u64) -> RmaOutcome {
        self.ship_all();
        let marks = self.in_flight_marks();
        if marks.is_empty() {
            return RmaOutcome::Done(());
        }
        self.flushes.push(Flush { token, marks });
        RmaOutcome::InProgress(token)
    }

    /// Orders: every operation posted after the fence is performed at its target after
    /// every operation posted before it. Operations to one peer are applied in the order
    /// posted anyway; an operation to another peer, or on a mapping, gets `NoResource`
    /// until the operations before the fence have completed.
    pub fn fence(&mut self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.ship_all();
        self.fence = self.in_flight_marks();
    }

    /// Operations in flight.
    pub fn outstanding(&self) -> usize {
        self.config.max_outstanding - self.free_slots.len()
    }

    /// Counters so far.
    pub fn counters(&self) -> InitiatorCounters {
        self.counters
    }

    /// Delivers up to `max` completions to `handle` (in order per peer; a flush after the
    /// operations it covers), sends batched and backlogged requests and, in
    /// [`Progress::Manual`] mode, runs the engine. Returns how many completions were
    /// delivered. Never blocks.
    ///
    /// Batching (over UDP and TCP to version 2 targets, `RmaConfig::batch_max`): requests
    /// posted to one peer are appended to one message, which goes out when the next does
    /// not fit, when the application calls [`Rma::flush`], [`Rma::fence`], [`Rma::wait`]
    /// or a blocking helper, or at a call of this (or [`Rma::progress`]) unless both
    /// something was posted since the previous call and something else is in flight to
    /// that peer. So a lone operation goes at the first poll after its post, and a stream
    /// of posts, each followed by a poll, shares datagrams, with no system call in the
    /// polls between (their responses are read when the batch goes).
    pub fn poll(&mut self, max: usize, mut handle: impl FnMut(RmaCompletion<'_>)) -> usize {
        if let EngineRunner::Inline(engine) = &mut self.engine {
            engine.progress();
        }
        let mut n = 0;
        while n < max {
            let Some((token, result)) = self.stash.pop_front() else { break };
            let result = match &result {
                Ok(Owned::Put) => Ok(Completed::Put),
                Ok(Owned::Get(d)) => Ok(Completed::Get(d)),
                Ok(Owned::Atomic(v)) => Ok(Completed::Atomic(*v)),
                Ok(Owned::Flush) => Ok(Completed::Flush),
                Err(e) => Err(e.clone()),
            };
            handle(RmaCompletion { token, result });
            n += 1;
        }
        if n < max {
            n += self.poll_channels(max - n, &mut |internal, token, result| {
                if internal {
                    // An abandoned blocking helper's operation: nobody waits for it.
                    return;
                }
                let result = match result {
                    Ok(Value::Put) => Ok(Completed::Put),
                    Ok(Value::Get(d)) => Ok(Completed::Get(d)),
                    Ok(Value::Atomic(v)) => Ok(Completed::Atomic(v)),
                    Ok(Value::Lookup(_)) => return,
                    Err(e) => Err(e),
                };
                handle(RmaCompletion { token, result });
            });
        }
        n += self.complete_flushes(&mut |token| handle(RmaCompletion { token, result: Ok(Completed::Flush) }));
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(4096) {
            self.check_mapped_owners();
        }
        n
    }

    /// Mapped imports whose owner died are dropped (their next use is `InvalidHandle`).
    fn check_mapped_owners(&mut self) {
        for m in &mut self.mapped {
            if m.as_ref().is_some_and(|m| m.owner_gone()) {
                tracing::debug!("owner of a mapped segment is gone; import dropped");
                *m = None;
            }
        }
    }

    fn complete_flushes(&mut self, handle: &mut dyn FnMut(u64)) -> usize {
        if self.flushes.is_empty() {
            return 0;
        }
        let peers = &self.peers;
        let mut done = Vec::new();
        self.flushes.retain(|f| {
            let complete = f.marks.iter().all(|&(p, mark)| {
                peers[p as usize].channel.as_ref().is_none_or(|c| c.answered >= mark || c.down.is_some())
            });
            if complete {
                done.push(f.token);
            }
            !complete
        });
        for &t in &done {
            handle(t);
        }
        done.len()
    }

    /// Receives responses on every channel and finishes their slots; `sink` gets each
    /// finished operation as `(internal, token, result)`. Returns operations finished.
    fn poll_channels(&mut self, max: usize, sink: &mut Sink<'_>) -> usize {
        let mut n = 0;
        let Rma { peers, slots, free_slots, counters, .. } = self;
        for (p, peer) in peers.iter_mut().enumerate() {
            let Some(ch) = peer.channel.as_mut() else { continue };
            if ch.down.is_some() {
                continue;
            }
            let (_, io) = ch.progress();
            if !io || n >= max {
                continue;
            }
            ch.send_due = false;
            let _ = ch.transport.flush();
            let answered = &mut ch.answered;
            let result = ch.transport.poll_recv(max - n, &mut |d, _| {
                if !d.is_whole() {
                    if d.offset == 0 {
                        tracing::warn!("RMA response larger than one message; dropped");
                    }
                    return;
                }
                *answered += 1;
                if finish(slots, free_slots, counters, d.data, sink) {
                    n += 1;
                }
            });
            if let Err(e) = result {
                tracing::debug!(peer = p, "RMA channel down: {e}");
                ch.answered = ch.queued;
                ch.backlog.clear();
                ch.batch.clear();
                ch.batched = 0;
                ch.down = Some(e.clone());
                n += fail_peer(slots, free_slots, counters, p as u32, &e, sink);
            }
        }
        n
    }

    /// Sleeps until a channel has a response or `timeout` passes (mapped operations never
    /// need it; in manual mode the wait is capped at a millisecond so the engine runs).
    pub fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.ship_all();
        let probes: Vec<Arc<dyn ReadyProbe>> = self
            .peers
            .iter_mut()
            .filter_map(|p| p.channel.as_mut())
            .filter(|c| c.down.is_none())
            .map(|c| {
                let _ = c.transport.flush();
                c.probe.clone()
            })
            .collect();
        let cap = Duration::from_millis(1);
        let timeout = match self.engine {
            EngineRunner::Inline(_) => Some(timeout.map_or(cap, |t| t.min(cap))),
            EngineRunner::Thread { .. } => timeout,
        };
        if probes.is_empty() {
            std::thread::sleep(timeout.map_or(cap, |t| t.min(cap)));
            return Ok(());
        }
        crate::wait::sleep_on(&probes, &[], timeout).map(|_| ())
    }
}

/// Largest put sent with [`Rma::put_inline`]: 256 bytes, the upper end of the small
/// messages that dominate cluster traffic; it stays inline in a shared-memory descriptor.
pub const PUT_INLINE_MAX: usize = 256;

fn send_error_text(e: &SendError) -> &'static str {
    match e {
        SendError::ChannelDown(_) => "channel down during hello",
        _ => "hello could not be sent",
    }
}

impl Drop for Rma {
    fn drop(&mut self) {
        self.ship_all();
        for peer in &mut self.peers {
            if let Some(ch) = peer.channel.as_mut() {
                ch.transport.close();
            }
        }
        if let EngineRunner::Thread { inbox, handle } = &mut self.engine {
            inbox.stop();
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}
