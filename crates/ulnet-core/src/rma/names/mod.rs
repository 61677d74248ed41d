//! The segment name service: one clerk per node, no central server (section 4 of the
//! paper).
//!
//! Each clerk exports a well-known segment ([`SegmentId::NAME_TABLE`], named
//! [`TABLE_NAME`]) holding an open-addressed hash table of the names of segments exported
//! on its node ([`table`] has the layout), readable by every node. Clerks talk to each
//! other only through one-sided reads of those tables:
//!
//! - **ADDNAME** ([`NameClerk::add_name`]) hashes the name into the local table with local
//!   stores;
//! - **LOOKUPNAME** ([`NameClerk::lookup`]) reads the local table, then the cache of names
//!   imported earlier, then — given a hint naming the node that exports it — remote-reads
//!   the slot the name hashes to on that node (the same slot as here, since every clerk uses
//!   the same hash and size), probing onwards on a collision until the name or an empty
//!   slot turns up;
//! - **DELETENAME** ([`NameClerk::delete_name`]) marks the entry deleted in the local
//!   table, nothing more;
//! - **refresh** ([`NameClerk::refresh`], or [`NameClerk::poll_refresh`] with the time)
//!   reads each remote table the cache draws from and drops cached names whose slot no
//!   longer holds them: a deleted name stops resolving after the next refresh (and not
//!   necessarily before, as in the paper); a stale descriptor used meanwhile fails at the
//!   target with `StaleGeneration` or `Revoked`.

pub mod table;

use super::error::{ExportError, ImportError, RmaError};
use super::rights::{Access, NodeId, Rights, SegmentId};
use super::segment::{ExportedSegment, SegmentDescriptor};
use super::wire::NAME_MAX;
use super::{PeerId, RemoteSegment, Rma};
use std::collections::HashMap;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use table::SlotView;

/// The name every clerk exports its table under.
pub const TABLE_NAME: &str = "ulnet.names";

/// Settings of a clerk. Every clerk of a cluster must use the same `slots`.
#[derive(Clone, Debug)]
pub struct ClerkConfig {
    /// Slots of the table (a power of two). 8,192 slots of 128 bytes (1 MiB): holds the
    /// names of a node's few thousand segments at under half load, where linear probing
    /// needs about 1.5 reads per lookup.
    pub slots: usize,
    /// How often [`NameClerk::poll_refresh`] refreshes the cache. 1 s: a deleted name keeps
    /// resolving elsewhere for at most this long, at a cost of one table read per peer.
    pub refresh_interval: Duration,
    /// How long one remote read may take. 1 s.
    pub read_timeout: Duration,
    /// Reads of one slot before a lookup gives up on a slot that keeps being rewritten. 16.
    pub unstable_retries: usize,
}

impl Default for ClerkConfig {
    fn default() -> Self {
        Self {
            slots: 8192,
            refresh_interval: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            unstable_retries: 16,
        }
    }
}

/// Why a name operation failed. One enum for the name service.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    /// No such name (locally, in the cache, or on the hinted node).
    #[error("name not found")]
    NotFound,
    /// ADDNAME of a name already in the local table.
    #[error("name already registered here")]
    Taken,
    /// The local table has no free slot.
    #[error("name table full")]
    TableFull,
    /// Empty, or longer than [`NAME_MAX`] bytes.
    #[error("invalid name")]
    InvalidName,
    /// The hinted node is not a peer of this clerk.
    #[error("no clerk known for node {0:?}")]
    UnknownNode(NodeId),
    /// A remote table does not look like one, or disagrees on the slot count.
    #[error("peer's name table is unusable: {0}")]
    BadTable(&'static str),
    /// A slot kept changing under every read.
    #[error("slot kept changing while read")]
    Unstable,
    /// Exporting the table failed.
    #[error("cannot export the name table: {0}")]
    Export(#[from] ExportError),
    /// Importing a peer's table failed.
    #[error("cannot import a peer's name table: {0}")]
    Import(#[from] ImportError),
    /// A remote read failed.
    #[error("remote read failed: {0}")]
    Read(#[from] RmaError),
}

/// Counters of a clerk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClerkCounters {
    /// Lookups answered from the local table.
    pub local_hits: u64,
    /// Lookups answered from the cache of imported names.
    pub cache_hits: u64,
    /// Lookups answered by remote reads.
    pub remote_hits: u64,
    /// Remote reads of single slots.
    pub remote_slot_reads: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Refreshes run.
    pub refreshes: u64,
    /// Cached names dropped by refreshes.
    pub purged: u64,
}

/// What one refresh did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefreshReport {
    /// Remote tables read.
    pub tables_read: usize,
    /// Cached names still valid.
    pub kept: usize,
    /// Cached names dropped.
    pub purged: usize,
}

struct PeerTable {
    segment: RemoteSegment,
}

struct Cached {
    descriptor: SegmentDescriptor,
    slot: usize,
}

/// A node's name clerk. See the module documentation.
///
/// ```no_run
/// use ulnet_core::rma::{names::{ClerkConfig, NameClerk}, Access, NodeId, NotifyMode, Rights, Rma, RmaConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Node 1 exports a segment and registers its name.
/// let mut rma = Rma::new(RmaConfig::new(NodeId(1)))?;
/// rma.listen_shm("node1")?;
/// let mut clerk = NameClerk::new(&mut rma, ClerkConfig::default())?;
/// let seg = rma.export("jobs/queue", 4096, Access::everyone(Rights::READ), NotifyMode::Never)?;
/// clerk.add_name("jobs/queue", seg.descriptor())?;
///
/// // Node 2 finds it with a hint that node 1 exports it, then imports it.
/// let mut rma2 = Rma::new(RmaConfig::new(NodeId(2)))?;
/// let mut clerk2 = NameClerk::new(&mut rma2, ClerkConfig::default())?;
/// let peer = rma2.connect_shm("node1");
/// clerk2.add_peer(&mut rma2, NodeId(1), peer)?;
/// let found = clerk2.lookup(&mut rma2, "jobs/queue", Some(NodeId(1)))?;
/// let queue = rma2.import_descriptor(peer, found, ulnet_core::rma::ImportMode::Auto)?;
/// # Ok(()) }
/// ```
pub struct NameClerk {
    node: NodeId,
    config: ClerkConfig,
    table: ExportedSegment,
    /// Versions of our own slots (we are their only writer).
    versions: Vec<u64>,
    peers: HashMap<NodeId, PeerTable>,
    cache: HashMap<Vec<u8>, Cached>,
    next_refresh: Instant,
    scratch: Vec<u8>,
    counters: ClerkCounters,
}

fn check_name(name: &str) -> Result<&[u8], NameError> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(NameError::InvalidName);
    }
    Ok(name.as_bytes())
}

impl NameClerk {
    /// Starts the clerk of `rma`'s node: exports the well-known table segment, readable by
    /// every node.
    pub fn new(rma: &mut Rma, config: ClerkConfig) -> Result<Self, NameError> {
        assert!(config.slots.is_power_of_two() && config.slots <= 1 << 24, "slots must be a power of two");
        let len = table::table_len(config.slots);
        let table = rma.export_at(SegmentId::NAME_TABLE, TABLE_NAME, len, Access::everyone(Rights::READ))?;
        table.write(0, &table::encode_header(config.slots, rma.node()));
        Ok(Self {
            node: rma.node(),
            versions: vec![0; config.slots],
            config,
            table,
            peers: HashMap::new(),
            cache: HashMap::new(),
            next_refresh: Instant::now(),
            scratch: Vec::new(),
            counters: ClerkCounters::default(),
        })
    }

    /// Counters so far.
    pub fn counters(&self) -> ClerkCounters {
        self.counters
    }

    /// Names cached from other nodes.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Imports the table of the clerk of `node`, reached through `peer`, for lookups that
    /// name it as their hint.
    pub fn add_peer(&mut self, rma: &mut Rma, node: NodeId, peer: PeerId) -> Result<(), NameError> {
        let segment = rma.import(peer, TABLE_NAME)?;
        let mut header = [0u8; table::HEADER_LEN];
        rma.get_blocking(&segment, 0, &mut header, self.config.read_timeout)?;
        match table::decode_header(&header) {
            Some(slots) if slots == self.config.slots => {}
            Some(_) => return Err(NameError::BadTable("another slot count (clerks must agree)")),
            None => return Err(NameError::BadTable("not a name table")),
        }
        if segment.len() < table::table_len(self.config.slots) as u64 {
            return Err(NameError::BadTable("segment shorter than its table"));
        }
        self.peers.insert(node, PeerTable { segment });
        Ok(())
    }

    fn mask(&self) -> usize {
        self.config.slots - 1
    }

    fn read_local(&self, i: usize) -> SlotView {
        let mut s = [0u8; table::SLOT_LEN];
        self.table.read(table::slot_off(i), &mut s);
        table::decode_slot(&s)
    }

    /// Writes slot `i` (we are its only writer): odd version, contents, even version.
    fn write_local(&mut self, i: usize, entry: Option<(&[u8], &SegmentDescriptor)>) {
        let off = table::slot_off(i);
        let v = self.versions[i];
        self.table.store_u64(off, v + 1);
        fence(Ordering::Release);
        let s = table::encode_slot(v + 2, entry);
        self.table.write(off + 8, &s[8..]);
        self.table.store_u64(off, v + 2);
        self.versions[i] = v + 2;
    }

    /// Finds `name` in the local table: `Ok(slot)` where it is, or `Err(slot)` where it
    /// would go (the first tombstone on its chain, or the empty slot ending it).
    fn find_local(&self, name: &[u8]) -> Result<usize, Option<usize>> {
        let start = table::hash(name) as usize & self.mask();
        let mut tombstone = None;
        for probe in 0..self.config.slots {
            let i = (start + probe) & self.mask();
            match self.read_local(i) {
                SlotView::Live { name: n, .. } if n == name => return Ok(i),
                SlotView::Live { .. } => {}
                SlotView::Deleted | SlotView::Unstable => {
                    tombstone.get_or_insert(i);
                }
                SlotView::Empty => return Err(Some(tombstone.unwrap_or(i))),
            }
        }
        Err(tombstone)
    }

    /// ADDNAME: registers `name` for a segment of this node.
    pub fn add_name(&mut self, name: &str, descriptor: SegmentDescriptor) -> Result<(), NameError> {
        let name = check_name(name)?;
        match self.find_local(name) {
            Ok(_) => Err(NameError::Taken),
            Err(None) => Err(NameError::TableFull),
            Err(Some(i)) => {
                self.write_local(i, Some((name, &descriptor)));
                Ok(())
            }
        }
    }

    /// DELETENAME: removes `name` from the local table (a tombstone). Other clerks stop
    /// resolving it after their next refresh.
    pub fn delete_name(&mut self, name: &str) -> Result<(), NameError> {
        let name = check_name(name)?;
        match self.find_local(name) {
            Ok(i) => {
                self.write_local(i, None);
                Ok(())
            }
            Err(_) => Err(NameError::NotFound),
        }
    }

    /// LOOKUPNAME: the descriptor registered for `name`, from the local table, the cache,
    /// or by remote reads of the table of `hint`'s clerk.
    pub fn lookup(&mut self, rma: &mut Rma, name: &str, hint: Option<NodeId>) -> Result<SegmentDescriptor, NameError> {
        let name = check_name(name)?;
        if let Ok(i) = self.find_local(name) {
            if let SlotView::Live { descriptor, .. } = self.read_local(i) {
                self.counters.local_hits += 1;
                return Ok(descriptor);
            }
        }
        if let Some(c) = self.cache.get(name) {
            self.counters.cache_hits += 1;
            return Ok(c.descriptor);
        }
        let Some(node) = hint.filter(|&n| n != self.node) else {
            self.counters.misses += 1;
            return Err(NameError::NotFound);
        };
        let segment = self.peers.get(&node).ok_or(NameError::UnknownNode(node))?.segment;
        let start = table::hash(name) as usize & self.mask();
        for probe in 0..self.config.slots {
            let i = (start + probe) & self.mask();
            match self.read_remote_slot(rma, &segment, i)? {
                SlotView::Live { name: n, descriptor } if n == name => {
                    self.counters.remote_hits += 1;
                    self.cache.insert(name.to_vec(), Cached { descriptor, slot: i });
                    return Ok(descriptor);
                }
                SlotView::Empty => break,
                _ => {}
            }
        }
        self.counters.misses += 1;
        Err(NameError::NotFound)
    }

    /// Reads one remote slot, again while it reads as being rewritten.
    fn read_remote_slot(&mut self, rma: &mut Rma, segment: &RemoteSegment, i: usize) -> Result<SlotView, NameError> {
        let mut s = [0u8; table::SLOT_LEN];
        for _ in 0..self.config.unstable_retries.max(1) {
            self.counters.remote_slot_reads += 1;
            rma.get_blocking(segment, table::slot_off(i) as u64, &mut s, self.config.read_timeout)?;
            match table::decode_slot(&s) {
                SlotView::Unstable => std::thread::yield_now(),
                view => return Ok(view),
            }
        }
        Err(NameError::Unstable)
    }

    /// Refreshes the cache: reads every remote table it draws from (one block read each) and
    /// drops the names whose slot no longer holds them with the same export.
    pub fn refresh(&mut self, rma: &mut Rma) -> Result<RefreshReport, NameError> {
        let mut report = RefreshReport::default();
        let nodes: Vec<NodeId> = {
            let mut n: Vec<NodeId> = self.cache.values().map(|c| c.descriptor.node).collect();
            n.sort_unstable();
            n.dedup();
            n
        };
        let slots_len = self.config.slots * table::SLOT_LEN;
        self.scratch.resize(slots_len, 0);
        for node in nodes {
            let Some(peer) = self.peers.get(&node) else { continue };
            let segment = peer.segment;
            let timeout = self.config.read_timeout.max(Duration::from_secs(5));
            rma.get_blocking(&segment, table::HEADER_LEN as u64, &mut self.scratch, timeout)?;
            report.tables_read += 1;
            let scratch = &self.scratch;
            let before = self.cache.len();
            self.cache.retain(|name, c| {
                if c.descriptor.node != node {
                    return true;
                }
                let at = c.slot * table::SLOT_LEN;
                match table::decode_slot(&scratch[at..at + table::SLOT_LEN]) {
                    SlotView::Live { name: n, descriptor } => n == *name && descriptor == c.descriptor,
                    // Torn by a rewrite: the entry is changing; drop it and look it up again.
                    _ => false,
                }
            });
            report.purged += before - self.cache.len();
        }
        report.kept = self.cache.len();
        self.counters.refreshes += 1;
        self.counters.purged += report.purged as u64;
        self.next_refresh = Instant::now() + self.config.refresh_interval;
        Ok(report)
    }

    /// Refreshes if `now` is past the refresh time; the periodic driver of the clerk.
    pub fn poll_refresh(&mut self, rma: &mut Rma, now: Instant) -> Result<Option<RefreshReport>, NameError> {
        if now < self.next_refresh {
            return Ok(None);
        }
        let report = self.refresh(rma)?;
        self.next_refresh = now + self.config.refresh_interval;
        Ok(Some(report))
    }

    /// When [`NameClerk::poll_refresh`] next refreshes.
    pub fn next_refresh(&self) -> Instant {
        self.next_refresh
    }
}
