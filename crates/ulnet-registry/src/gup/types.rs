//! The nouns of the protocol: nodes, views, epochs, log entries and durable records.

use std::fmt;
use std::sync::Arc;

/// A cluster node, as numbered by the membership service. The circular order of GUP is the
/// order of these numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// An installed membership view: its number and its members in ascending (circular) NodeId
/// order. The daemon maps the membership service's views onto this type; tests feed it from
/// an oracle. GUP's safety never depends on views being right, only its progress does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// View number; later views have larger numbers.
    pub id: u64,
    /// Members, sorted ascending, without duplicates.
    pub members: Vec<NodeId>,
}

impl View {
    /// A view with `members` put in circular order.
    pub fn new(id: u64, mut members: Vec<NodeId>) -> Self {
        members.sort_unstable();
        members.dedup();
        Self { id, members }
    }

    /// Whether `node` is a member.
    pub fn contains(&self, node: NodeId) -> bool {
        self.members.binary_search(&node).is_ok()
    }
}

/// The reign of one locker. A new locker starts a new epoch, numbered by the view in which it
/// took over; epochs are ordered by (view, locker), so two nodes that both believe they are
/// locker in one view still have distinct, ordered epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Epoch {
    /// The view in which the locker took over.
    pub view: u64,
    /// The locker.
    pub locker: NodeId,
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}/{}", self.view, self.locker)
    }
}

/// A sender's name for one batch of updates: the sender's incarnation (bumped at every start,
/// so numbers never repeat across restarts) and a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId {
    /// The sender's start count.
    pub incarnation: u32,
    /// Batches sent in this incarnation before this one.
    pub counter: u64,
}

/// One sender's batch within a log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The node whose clients submitted the updates.
    pub origin: NodeId,
    /// The sender's batch name (for deduplication and for acknowledging the clients).
    pub batch: BatchId,
    /// The updates, opaque to GUP, applied in this order.
    pub updates: Arc<[Arc<[u8]>]>,
}

/// One position of the totally ordered log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The batches granted under one lock grant: one sender's (which that sender delivers),
    /// or several senders' whose requests the locker found waiting together (which the
    /// locker delivers).
    Updates {
        /// The batches, applied in this order.
        parts: Arc<[Part]>,
    },
    /// A position a new locker found empty after a failure: an update whose sender and every
    /// receiver failed (case 5). It is applied as nothing.
    Skip,
}

impl Entry {
    /// One sender's batch.
    pub fn single(origin: NodeId, batch: BatchId, updates: Arc<[Arc<[u8]>]>) -> Entry {
        Entry::Updates { parts: Arc::from([Part { origin, batch, updates }]) }
    }

    /// The batches of the entry (none for a skip).
    pub fn parts(&self) -> &[Part] {
        match self {
            Entry::Updates { parts } => parts,
            Entry::Skip => &[],
        }
    }

    /// Every update of the entry, in order.
    pub fn updates(&self) -> impl Iterator<Item = &Arc<[u8]>> + '_ {
        self.parts().iter().flat_map(|p| p.updates.iter())
    }
}

/// What a node writes to its write-ahead log, in order. Each record is identified by its log
/// sequence number (LSN, the count of records persisted before it in this incarnation); the
/// host reports durability by LSN (`Gup::handle_durable`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The node started; its incarnation number.
    Boot {
        /// Incarnation (one more than the largest found at start-up).
        incarnation: u32,
    },
    /// The log entry at `seq` (replaces any earlier record for that position).
    Entry {
        /// Log position.
        seq: u64,
        /// The entry.
        entry: Entry,
    },
    /// Every entry after `seq` is dropped (a new locker decided the log from there on).
    TruncateAfter {
        /// Last kept position.
        seq: u64,
    },
    /// The node promised to follow no locker of an epoch below this one.
    Promise {
        /// The epoch.
        epoch: Epoch,
    },
    /// The node's log, up to where it was synchronised, is the authoritative log of `epoch`.
    Normal {
        /// The epoch.
        epoch: Epoch,
    },
    /// Every position up to `seq` is committed (may lag; a hint for restart).
    Commit {
        /// Committed position.
        seq: u64,
    },
    /// The application state after applying every position up to `seq`; earlier records
    /// are no longer needed.
    Snapshot {
        /// Last position included.
        seq: u64,
        /// The application's snapshot bytes.
        data: Arc<[u8]>,
    },
}
