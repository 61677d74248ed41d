//! The nouns of the protocol: nodes, views, epochs, voting configurations, log entries,
//! snapshots and durable records.

use std::fmt;
use std::sync::Arc;

/// A cluster node: the membership service's id of one incarnation of a node (a node that
/// lost its durable state comes back under a new id). The circular order of GUP is the order
/// of these numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// An installed membership view: its number and its members in ascending (circular) NodeId
/// order. The daemon maps the membership service's views onto this type; tests feed it from
/// an oracle. GUP's safety never depends on views being right or agreed, only its progress
/// does: views choose the locker and the voting configuration the locker moves to.
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

    /// The member that locks in this view: the lowest.
    pub fn locker(&self) -> Option<NodeId> {
        self.members.first().copied()
    }
}

/// The reign of one locker. A locker starts an epoch when it becomes the locker of a view
/// (and a new round of it when it restarts in the same view); epochs are totally ordered by
/// (view, round, locker), so two nodes that both believe they lock still have distinct,
/// ordered epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Epoch {
    /// The view in which the locker took over.
    pub view: u64,
    /// Takeovers by the same locker in the same view before this one (a restart).
    pub round: u32,
    /// The locker.
    pub locker: NodeId,
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}.{}/{}", self.view, self.round, self.locker)
    }
}

/// Who votes: a decision (a commit, the end of a sync, a confirmed read) needs a majority of
/// `voters` and, during a change (joint consensus), also a majority of `previous`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VotingConfig {
    /// The voters, sorted, without duplicates, never empty.
    pub voters: Arc<[NodeId]>,
    /// During a change: the voters before it, whose majority must agree too.
    pub previous: Option<Arc<[NodeId]>>,
}

fn sorted(mut v: Vec<NodeId>) -> Arc<[NodeId]> {
    v.sort_unstable();
    v.dedup();
    assert!(!v.is_empty(), "a voting configuration has at least one voter");
    v.into()
}

impl VotingConfig {
    /// A configuration of `voters` alone.
    pub fn new(voters: Vec<NodeId>) -> Self {
        Self { voters: sorted(voters), previous: None }
    }

    /// The joint configuration of a change from `previous` to `voters`.
    pub fn joint(previous: &[NodeId], voters: Vec<NodeId>) -> Self {
        Self { voters: sorted(voters), previous: Some(sorted(previous.to_vec())) }
    }

    /// Whether this is the joint configuration of a change.
    pub fn is_joint(&self) -> bool {
        self.previous.is_some()
    }

    /// Whether `n` votes (in either set).
    pub fn contains(&self, n: NodeId) -> bool {
        self.voters.binary_search(&n).is_ok() || self.previous.as_ref().is_some_and(|p| p.binary_search(&n).is_ok())
    }

    /// Every voter of either set, sorted.
    pub fn all(&self) -> Vec<NodeId> {
        let mut all = self.voters.to_vec();
        if let Some(p) = &self.previous {
            all.extend(p.iter().copied());
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether the nodes for which `yes` holds are a quorum (a majority of each set).
    pub fn is_quorum(&self, mut yes: impl FnMut(NodeId) -> bool) -> bool {
        let mut majority = |set: &[NodeId]| set.iter().filter(|&&n| yes(n)).count() * 2 > set.len();
        majority(&self.voters) && self.previous.as_ref().is_none_or(|p| majority(p))
    }

    /// The largest value that a quorum has reached: with `value(n)` a node's durable prefix,
    /// the position up to which a quorum holds the log.
    pub fn quorum_value(&self, mut value: impl FnMut(NodeId) -> u64) -> u64 {
        let mut of = |set: &[NodeId]| {
            let mut v: Vec<u64> = set.iter().map(|&n| value(n)).collect();
            v.sort_unstable_by(|a, b| b.cmp(a));
            v[set.len() / 2]
        };
        let now = of(&self.voters);
        match &self.previous {
            Some(p) => now.min(of(p)),
            None => now,
        }
    }
}

impl fmt::Display for VotingConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |s: &[NodeId]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
        match &self.previous {
            Some(p) => write!(f, "[{}]→[{}]", list(p), list(&self.voters)),
            None => write!(f, "[{}]", list(&self.voters)),
        }
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
    /// The voting configuration from this position on (written by the locker when the
    /// views change; applied as nothing by the application).
    Config(VotingConfig),
}

impl Entry {
    /// One sender's batch.
    pub fn single(origin: NodeId, batch: BatchId, updates: Arc<[Arc<[u8]>]>) -> Entry {
        Entry::Updates { parts: Arc::from([Part { origin, batch, updates }]) }
    }

    /// The batches of the entry (none for a skip or a configuration).
    pub fn parts(&self) -> &[Part] {
        match self {
            Entry::Updates { parts } => parts,
            Entry::Skip | Entry::Config(_) => &[],
        }
    }

    /// Every update of the entry, in order.
    pub fn updates(&self) -> impl Iterator<Item = &Arc<[u8]>> + '_ {
        self.parts().iter().flat_map(|p| p.updates.iter())
    }
}

/// The application state after a log position, with the voting configuration in force there
/// (so a log that starts from it knows who votes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Last position included.
    pub seq: u64,
    /// The voting configuration at `seq`.
    pub config: VotingConfig,
    /// The application's snapshot bytes.
    pub data: Arc<[u8]>,
}

/// What a node writes to its write-ahead log, in order. Each record is identified by its log
/// sequence number (LSN, the count of records persisted before it in this incarnation); the
/// host reports durability by LSN (`Gup::handle_durable`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The node started; its incarnation number and the identity the records after it
    /// belong to.
    Boot {
        /// Incarnation (one more than the largest found at start-up).
        incarnation: u32,
        /// The node.
        node: NodeId,
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
    /// A snapshot, which replaces every earlier record: the write-ahead log deletes the
    /// segments before it. It therefore carries everything of them still needed — the
    /// node's identity, incarnation, promise and epoch, and the log entries after the
    /// snapshot's position.
    Snapshot {
        /// The snapshot.
        snapshot: Snapshot,
        /// The node the records belong to.
        node: NodeId,
        /// Its incarnation.
        incarnation: u32,
        /// Its promise.
        promised: Epoch,
        /// The epoch whose authoritative log it holds.
        last_normal: Option<Epoch>,
        /// Log entries after the snapshot's position.
        tail: Vec<(u64, Entry)>,
    },
}
