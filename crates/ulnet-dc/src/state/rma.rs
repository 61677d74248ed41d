//! [`SharedState`] over ulnet remote memory: the shared state of `ulnet dc run`, across
//! processes on one host or across hosts.
//!
//! ```text
//!  front process (balancer; home of the role word)   node process i
//!  exports dc/roles  8 B  nodes: read+atomic          exports dc/load  64 B  everyone: read
//!                         others: read                        dc/inbox  8 B  nodes: read+atomic
//!                                                                            others: read
//! ```
//!
//! | operation | how |
//! |---|---|
//! | `publish_load` | seqlock write of the node's own `dc/load` with local stores ([`super::record`]) |
//! | `read_load` | one-sided READ of node j's `dc/load`; a torn copy (odd version, or a MAC that fails) is read again |
//! | `read_roles` | READ of `dc/roles` at its home (a local load at the front) |
//! | `cas_roles` | remote compare-and-swap on `dc/roles` at its home; the value it returns is the caller's new view when it fails |
//! | `announce` | remote compare-and-swap on node j's `dc/inbox`, repeated only while the table is newer than what it holds |
//! | `announced` | local load of the node's own `dc/inbox` |
//!
//! **Why the role word lives at the front.** It needs one home that every helper's CAS
//! reaches. The front (load balancer and clients) is the one process whose loss ends the
//! service anyway, so homing the word there adds no failure the center did not have; homed
//! at a node, the word would die with that node and membership would have to elect a new
//! home and rebuild the word from the survivors' views.
//!
//! **Paths** ([`RmaPath`]): on one host a peer's segments are mapped (`map`: every
//! operation is a load, store or atomic instruction on the owner's pages; the owner's CPU
//! takes no part), or every operation goes through the owner's RMA engine over a
//! shared-memory channel (`shm`) or over TCP (`tcp`) — the path a center across hosts
//! takes, selectable on one host so that it is exercised.
//!
//! **Links.** Each peer gets its own initiator (`Rma` in manual progress: it has no exports)
//! behind its own lock, opened on first use. A peer that cannot be reached costs at most
//! [`RmaStateConfig::connect_timeout`] per [`RmaStateConfig::retry_after`], and only to
//! the callers that need that peer. Membership tells a node which peers died
//! ([`RmaState::forget`]); it stops trying them.

use super::record::{self, RecordCells};
use super::{epoch_after, CasOutcome, SharedState, StateCounters, StateError};
use crate::load::{ClusterKey, LoadRecord, SLOT_WORDS};
use crate::role::{NodeIndex, RoleTable, NODES_MAX};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};
use ulnet_core::rma::{
    Access, AccessError, ExportError, ExportedSegment, ImportMode, NodeId, NotifyMode, RemoteSegment, Rights, Rma,
    RmaConfig, RmaError,
};
use ulnet_core::transport::shm::{ShmConfig, ShmGeometry};
use ulnet_core::ConnectError;

/// Name of a node's load-record segment.
pub const LOAD_SEGMENT: &str = "dc/load";
/// Name of a node's inbox (the newest table announced to it).
pub const INBOX_SEGMENT: &str = "dc/inbox";
/// Name of the role word's segment at the front.
pub const ROLES_SEGMENT: &str = "dc/roles";
/// Bytes of a load record.
const RECORD_BYTES: usize = SLOT_WORDS * 8;

/// The remote-memory node id of the front.
pub const FRONT_RMA_NODE: NodeId = NodeId(1);

/// The remote-memory node id of data-center node `i` (rights are granted to it).
pub fn rma_node(i: NodeIndex) -> NodeId {
    NodeId(2 + u32::from(i.0))
}

/// How a process reaches the other processes' segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RmaPath {
    /// Same host, segments mapped: loads, stores and atomic instructions on the owner's
    /// pages. The default on one host.
    #[default]
    Map,
    /// Same host, every operation through the owner's engine over a shared-memory channel.
    Shm,
    /// Every operation through the owner's engine over TCP: the path across hosts.
    Tcp,
}

impl std::fmt::Display for RmaPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RmaPath::Map => "map",
            RmaPath::Shm => "shm",
            RmaPath::Tcp => "tcp",
        })
    }
}

/// Where a process of the center takes remote-memory requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RmaEndpoint {
    /// A shared-memory name on this host (mapping rendezvous and shm channels).
    Shm(String),
    /// A TCP address.
    Tcp(SocketAddr),
}

/// Settings of an [`RmaState`].
#[derive(Clone, Debug)]
pub struct RmaStateConfig {
    /// How peers' segments are reached.
    pub path: RmaPath,
    /// Node slots of the center.
    pub slots: usize,
    /// Names this center's shared-memory endpoints (`{center}-front`, `{center}-n{i}`):
    /// unique per center on a host.
    pub center: String,
    /// Where to listen for TCP (path `tcp`). `127.0.0.1:0`: one host, any port.
    pub tcp_listen: SocketAddr,
    /// How long one operation on a peer may take before the peer counts as unreachable for
    /// this call. 250 ms: an operation takes microseconds (mapped) to a millisecond
    /// (a channel on a busy host); a quarter second is a peer that is gone or stopped.
    pub op_timeout: Duration,
    /// How long opening a link to a peer may take. 300 ms, for the same reason.
    pub connect_timeout: Duration,
    /// After a failure, how long a link waits before it tries the peer again. 1 s: the
    /// staleness limit of load records, so a peer that returns is read again about when its
    /// record would be believed again.
    pub retry_after: Duration,
}

impl RmaStateConfig {
    /// Defaults for a center of `slots` nodes named `center`, reached over `path`.
    pub fn new(center: &str, slots: usize, path: RmaPath) -> Self {
        RmaStateConfig {
            path,
            slots,
            center: center.to_string(),
            tcp_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            op_timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(300),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// Why an [`RmaState`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The remote-memory node could not start (eventfds, engine thread).
    #[error("remote memory: {0}")]
    Io(#[from] std::io::Error),
    /// A segment could not be exported.
    #[error("export: {0}")]
    Export(#[from] ExportError),
    /// Could not listen for importers.
    #[error("listen: {0}")]
    Listen(#[from] ConnectError),
    /// More nodes than the role word can name, or none.
    #[error("{0} nodes: between 1 and {NODES_MAX}")]
    Slots(usize),
}

/// Small channels: the state's messages are under 100 bytes, so a 16 KiB ring carries them
/// inline and four 4 KiB buffers are never needed; the default geometry (4 MiB of buffers)
/// per channel would be 17 × 2 channels per process for nothing.
fn small_shm() -> ShmConfig {
    ShmConfig {
        geometry: ShmGeometry { ring_bytes: 16 << 10, buffer_size: 4 << 10, buffer_count: 4 },
        inline_max: 1024,
        ..ShmConfig::default()
    }
}

struct Link<I> {
    open: Option<(Rma, I)>,
    retry_at: Option<Instant>,
}

impl<I> Default for Link<I> {
    fn default() -> Self {
        Link { open: None, retry_at: None }
    }
}

struct NodeImports {
    load: RemoteSegment,
    inbox: RemoteSegment,
}

struct RoleImport {
    roles: RemoteSegment,
}

/// The segments this process exports.
enum Own {
    /// The front: the role word.
    Front { roles: ExportedSegment },
    /// A node: its load record and inbox; the lock keeps publishers one at a time.
    Node { me: NodeIndex, load: ExportedSegment, inbox: ExportedSegment, writer: Mutex<()> },
}

struct Cells<'a>(&'a ExportedSegment);

impl RecordCells for Cells<'_> {
    fn load(&self, i: usize) -> u64 {
        self.0.load_u64(i * 8)
    }
    fn store(&self, i: usize, value: u64, _order: Ordering) {
        // The segment's stores are Release, at least what the seqlock asks.
        self.0.store_u64(i * 8, value)
    }
}

#[derive(Default)]
struct Counters {
    record_reads: AtomicU64,
    torn_copies: AtomicU64,
    role_reads: AtomicU64,
    cas: AtomicU64,
    cas_failed: AtomicU64,
    announces: AtomicU64,
    unreachable: AtomicU64,
    mapped_ops: AtomicU64,
    channel_ops: AtomicU64,
}

/// A process's handle on the center's shared state in remote memory: the front's (home of
/// the role word, an observer with no record) or a node's.
pub struct RmaState {
    config: RmaStateConfig,
    key: ClusterKey,
    rma_id: NodeId,
    /// Serves this process's exports (its engine thread); locked only to read counters.
    target: Mutex<Rma>,
    endpoint: RmaEndpoint,
    own: Own,
    home: Option<(RmaEndpoint, Mutex<Link<RoleImport>>)>,
    links: Vec<Mutex<Link<NodeImports>>>,
    endpoints: RwLock<Vec<Option<RmaEndpoint>>>,
    counters: Counters,
}

fn unreachable(e: impl std::fmt::Display) -> StateError {
    StateError::Unreachable(e.to_string())
}

impl RmaState {
    /// The front's handle: exports the role word holding `table` and listens.
    pub fn front(config: RmaStateConfig, table: RoleTable, key: ClusterKey) -> Result<RmaState, OpenError> {
        let (mut target, endpoint) = Self::listen(&config, FRONT_RMA_NODE, "front", &key)?;
        let roles = target.export(ROLES_SEGMENT, 8, Self::member_access(&config), NotifyMode::Never)?;
        roles.store_u64(0, table.0);
        Ok(Self::assemble(config, key, FRONT_RMA_NODE, target, endpoint, Own::Front { roles }, None))
    }

    /// Node `me`'s handle: exports its load record and inbox and listens; the role word is
    /// at `front`.
    pub fn node(
        config: RmaStateConfig,
        me: NodeIndex,
        front: RmaEndpoint,
        key: ClusterKey,
    ) -> Result<RmaState, OpenError> {
        if me.get() >= config.slots {
            return Err(OpenError::Slots(me.get() + 1));
        }
        let id = rma_node(me);
        let (mut target, endpoint) = Self::listen(&config, id, &format!("n{}", me.0), &key)?;
        let load = target.export(LOAD_SEGMENT, RECORD_BYTES, Access::everyone(Rights::READ), NotifyMode::Never)?;
        let inbox = target.export(INBOX_SEGMENT, 8, Self::member_access(&config), NotifyMode::Never)?;
        let own = Own::Node { me, load, inbox, writer: Mutex::new(()) };
        Ok(Self::assemble(config, key, id, target, endpoint, own, Some(front)))
    }

    /// Read for everyone; compare-and-swap for the center's nodes only.
    fn member_access(config: &RmaStateConfig) -> Access {
        (0..config.slots as u8)
            .fold(Access::everyone(Rights::READ), |a, i| a.grant(rma_node(NodeIndex(i)), Rights::READ | Rights::ATOMIC))
    }

    fn listen(
        config: &RmaStateConfig,
        id: NodeId,
        who: &str,
        key: &ClusterKey,
    ) -> Result<(Rma, RmaEndpoint), OpenError> {
        if config.slots == 0 || config.slots > NODES_MAX {
            return Err(OpenError::Slots(config.slots));
        }
        let mut rma = Rma::new(Self::rma_config(id, key, ulnet_core::rma::Progress::Thread))?;
        let endpoint = match config.path {
            RmaPath::Map | RmaPath::Shm => {
                let name = format!("{}-{who}", config.center);
                rma.listen_shm(&name)?;
                RmaEndpoint::Shm(name)
            }
            RmaPath::Tcp => RmaEndpoint::Tcp(rma.listen_tcp(&config.tcp_listen.to_string())?),
        };
        Ok((rma, endpoint))
    }

    fn rma_config(id: NodeId, key: &ClusterKey, progress: ulnet_core::rma::Progress) -> RmaConfig {
        let mut c = RmaConfig::new(id);
        c.progress = progress;
        // The state's requests come a few hundred a second: the engine sleeps between them
        // rather than spin, which on a loaded host would take the nodes' CPU.
        c.engine_spin = Duration::ZERO;
        c.max_segments = 8;
        c.max_outstanding = 64;
        c.shm = ShmConfig { secret: key.derive("ulnet-dc rma"), ..small_shm() };
        c.tcp.secret = key.derive("ulnet-dc rma");
        c
    }

    fn assemble(
        config: RmaStateConfig,
        key: ClusterKey,
        rma_id: NodeId,
        target: Rma,
        endpoint: RmaEndpoint,
        own: Own,
        front: Option<RmaEndpoint>,
    ) -> RmaState {
        RmaState {
            links: (0..config.slots).map(|_| Mutex::new(Link::default())).collect(),
            endpoints: RwLock::new(vec![None; config.slots]),
            home: front.map(|f| (f, Mutex::new(Link::default()))),
            config,
            key,
            rma_id,
            target: Mutex::new(target),
            endpoint,
            own,
            counters: Counters::default(),
        }
    }

    /// Where this process takes remote-memory requests.
    pub fn endpoint(&self) -> &RmaEndpoint {
        &self.endpoint
    }

    /// The path to peers.
    pub fn path(&self) -> RmaPath {
        self.config.path
    }

    /// Where every node takes requests (by node index; `None`: unknown).
    pub fn set_endpoints(&self, nodes: &[Option<RmaEndpoint>]) {
        let mut e = self.endpoints.write().expect("endpoints lock");
        for (slot, n) in e.iter_mut().zip(nodes) {
            *slot = n.clone();
        }
    }

    /// Closes the link to `node` and stops trying it (membership said it died).
    pub fn forget(&self, node: NodeIndex) {
        if let Some(e) = self.endpoints.write().expect("endpoints lock").get_mut(node.get()) {
            *e = None;
        }
        if let Some(l) = self.links.get(node.get()) {
            l.lock().expect("link lock").open = None;
        }
    }

    /// Opens an initiator to `to` and imports `names` there.
    fn open(&self, to: &RmaEndpoint, names: &[&str]) -> Result<(Rma, Vec<RemoteSegment>), String> {
        let mut c = Self::rma_config(self.rma_id, &self.key, ulnet_core::rma::Progress::Manual);
        c.control_timeout = self.config.connect_timeout;
        c.max_segments = 1;
        let mut rma = Rma::new(c).map_err(|e| e.to_string())?;
        let (peer, mode) = match (to, self.config.path) {
            (RmaEndpoint::Shm(name), RmaPath::Map) => (rma.connect_shm(name), ImportMode::Map),
            (RmaEndpoint::Shm(name), _) => (rma.connect_shm(name), ImportMode::Channel),
            (RmaEndpoint::Tcp(addr), _) => {
                let peer =
                    rma.connect_tcp(&addr.to_string(), self.config.connect_timeout).map_err(|e| e.to_string())?;
                (peer, ImportMode::Channel)
            }
        };
        let mut segments = Vec::with_capacity(names.len());
        for name in names {
            segments.push(rma.import_with(peer, name, mode).map_err(|e| format!("import {name}: {e}"))?);
        }
        Ok((rma, segments))
    }

    /// Runs `op` on the link `link`, opening it first (to `endpoint`, importing `names`).
    /// A failure that says the peer is gone closes the link until `retry_after`.
    fn on_link<I, T>(
        &self,
        link: &Mutex<Link<I>>,
        endpoint: impl FnOnce() -> Option<RmaEndpoint>,
        names: &[&str],
        imports: impl FnOnce(Vec<RemoteSegment>) -> I,
        op: impl FnOnce(&mut Rma, &I, &Counters) -> Result<T, RmaError>,
    ) -> Result<T, StateError> {
        let mut link = link.lock().expect("link lock");
        let now = Instant::now();
        if link.open.is_none() {
            if link.retry_at.is_some_and(|t| now < t) {
                self.counters.unreachable.fetch_add(1, Ordering::Relaxed);
                return Err(StateError::Unreachable("peer failed recently; not retried yet".into()));
            }
            let Some(to) = endpoint() else {
                return Err(StateError::Unreachable("peer endpoint unknown".into()));
            };
            match self.open(&to, names) {
                Ok((rma, segments)) => link.open = Some((rma, imports(segments))),
                Err(e) => {
                    link.retry_at = Some(now + self.config.retry_after);
                    self.counters.unreachable.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(?to, "remote memory link: {e}");
                    return Err(StateError::Unreachable(e));
                }
            }
        }
        let (rma, imported) = link.open.as_mut().expect("opened above");
        match op(rma, imported, &self.counters) {
            Ok(v) => Ok(v),
            Err(e) => {
                let refused_here = matches!(
                    e,
                    RmaError::Access(AccessError::Denied | AccessError::OutOfBounds | AccessError::Misaligned)
                );
                if !refused_here {
                    link.open = None;
                    link.retry_at = Some(now + self.config.retry_after);
                }
                self.counters.unreachable.fetch_add(1, Ordering::Relaxed);
                Err(unreachable(e))
            }
        }
    }

    fn on_node<T>(
        &self,
        node: NodeIndex,
        op: impl FnOnce(&mut Rma, &NodeImports, &Counters) -> Result<T, RmaError>,
    ) -> Result<T, StateError> {
        let link = self.links.get(node.get()).ok_or(StateError::NoSuchNode(node))?;
        self.on_link(
            link,
            || self.endpoints.read().expect("endpoints lock").get(node.get()).cloned().flatten(),
            &[LOAD_SEGMENT, INBOX_SEGMENT],
            |s| NodeImports { load: s[0], inbox: s[1] },
            op,
        )
    }

    fn on_home<T>(
        &self,
        op: impl FnOnce(&mut Rma, &RoleImport, &Counters) -> Result<T, RmaError>,
    ) -> Result<T, StateError> {
        let (front, link) = self.home.as_ref().expect("a node's handle has a home");
        self.on_link(link, || Some(front.clone()), &[ROLES_SEGMENT], |s| RoleImport { roles: s[0] }, op)
    }

    fn me(&self) -> Option<NodeIndex> {
        match &self.own {
            Own::Front { .. } => None,
            Own::Node { me, .. } => Some(*me),
        }
    }

    fn check(&self, node: NodeIndex) -> Result<(), StateError> {
        if node.get() >= self.config.slots {
            return Err(StateError::NoSuchNode(node));
        }
        Ok(())
    }
}

impl Counters {
    fn op(&self, seg: &RemoteSegment) {
        if seg.is_mapped() {
            self.mapped_ops.fetch_add(1, Ordering::Relaxed);
        } else {
            self.channel_ops.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn words_of(bytes: &[u8; RECORD_BYTES]) -> [u64; SLOT_WORDS] {
    std::array::from_fn(|i| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes")))
}

impl SharedState for RmaState {
    fn slots(&self) -> usize {
        self.config.slots
    }

    fn publish_load(&self, r: &LoadRecord) -> Result<(), StateError> {
        let Own::Node { me, load, writer, .. } = &self.own else {
            return Err(StateError::NotANode);
        };
        debug_assert_eq!(r.node, me.0, "a node publishes its own record");
        let _one_writer = writer.lock().expect("writer lock");
        let cells = Cells(load);
        record::write(&cells, &r.encode(&self.key, record::next_version(&cells)));
        Ok(())
    }

    fn read_load(&self, node: NodeIndex) -> Result<[u64; SLOT_WORDS], StateError> {
        self.check(node)?;
        if let Own::Node { me, load, .. } = &self.own {
            if *me == node {
                return Ok(std::array::from_fn(|i| load.load_u64(i * 8)));
            }
        }
        let timeout = self.config.op_timeout;
        let copied = self.on_node(node, |rma, seg, counters| {
            record::read(&self.key, node, || {
                let mut bytes = [0u8; RECORD_BYTES];
                counters.op(&seg.load);
                counters.record_reads.fetch_add(1, Ordering::Relaxed);
                rma.get_blocking(&seg.load, 0, &mut bytes, timeout)?;
                Ok(words_of(&bytes))
            })
        })?;
        self.counters.torn_copies.fetch_add(u64::from(copied.retries), Ordering::Relaxed);
        Ok(copied.words)
    }

    fn read_roles(&self) -> Result<RoleTable, StateError> {
        self.counters.role_reads.fetch_add(1, Ordering::Relaxed);
        if let Own::Front { roles } = &self.own {
            return Ok(RoleTable(roles.load_u64(0)));
        }
        let timeout = self.config.op_timeout;
        self.on_home(|rma, seg, counters| {
            let mut bytes = [0u8; 8];
            counters.op(&seg.roles);
            rma.get_blocking(&seg.roles, 0, &mut bytes, timeout)?;
            Ok(RoleTable(u64::from_ne_bytes(bytes)))
        })
    }

    fn cas_roles(&self, expected: RoleTable, new: RoleTable) -> Result<CasOutcome, StateError> {
        self.counters.cas.fetch_add(1, Ordering::Relaxed);
        let found = match &self.own {
            Own::Front { roles } => roles.compare_swap_u64(0, expected.0, new.0),
            Own::Node { .. } => {
                let timeout = self.config.op_timeout;
                self.on_home(|rma, seg, counters| {
                    counters.op(&seg.roles);
                    rma.compare_and_swap_blocking(&seg.roles, 0, expected.0, new.0, timeout)
                })?
            }
        };
        if found == expected.0 {
            Ok(CasOutcome::Swapped)
        } else {
            self.counters.cas_failed.fetch_add(1, Ordering::Relaxed);
            Ok(CasOutcome::Failed(RoleTable(found)))
        }
    }

    fn announce(&self, to: NodeIndex, table: RoleTable) -> Result<(), StateError> {
        self.check(to)?;
        let Own::Node { me, inbox, .. } = &self.own else {
            return Err(StateError::NotANode);
        };
        self.counters.announces.fetch_add(1, Ordering::Relaxed);
        if *me == to {
            let mut current = inbox.load_u64(0);
            while epoch_after(table.epoch(), RoleTable(current).epoch()) {
                match inbox.compare_swap_u64(0, current, table.0) {
                    found if found == current => break,
                    found => current = found,
                }
            }
            return Ok(());
        }
        let timeout = self.config.op_timeout;
        self.on_node(to, |rma, seg, counters| {
            let mut bytes = [0u8; 8];
            counters.op(&seg.inbox);
            rma.get_blocking(&seg.inbox, 0, &mut bytes, timeout)?;
            let mut current = u64::from_ne_bytes(bytes);
            while epoch_after(table.epoch(), RoleTable(current).epoch()) {
                counters.op(&seg.inbox);
                match rma.compare_and_swap_blocking(&seg.inbox, 0, current, table.0, timeout)? {
                    found if found == current => break,
                    found => current = found,
                }
            }
            Ok(())
        })
    }

    fn announced(&self) -> Result<RoleTable, StateError> {
        match &self.own {
            Own::Node { inbox, .. } => Ok(RoleTable(inbox.load_u64(0))),
            Own::Front { .. } => Err(StateError::NotANode),
        }
    }

    fn counters(&self) -> StateCounters {
        let c = &self.counters;
        let target = self.target.lock().expect("target lock").target_counters();
        StateCounters {
            record_reads: c.record_reads.load(Ordering::Relaxed),
            torn_copies: c.torn_copies.load(Ordering::Relaxed),
            role_reads: c.role_reads.load(Ordering::Relaxed),
            cas: c.cas.load(Ordering::Relaxed),
            cas_failed: c.cas_failed.load(Ordering::Relaxed),
            announces: c.announces.load(Ordering::Relaxed),
            unreachable: c.unreachable.load(Ordering::Relaxed),
            mapped_ops: c.mapped_ops.load(Ordering::Relaxed),
            channel_ops: c.channel_ops.load(Ordering::Relaxed),
            served_by_engine: target.gets + target.atomics,
        }
    }
}

impl std::fmt::Debug for RmaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmaState").field("me", &self.me()).field("endpoint", &self.endpoint).finish()
    }
}
