//! The Global Update Protocol as a sans-IO state machine.
//!
//! # The protocol
//!
//! As in MSCS, one member of the view, the *locker*, grants a transmission lock: a sender
//! asks for it with the update itself ([`Msg::LockRequest`]); the locker gives the update
//! the next position of the totally ordered log, writes it to its own log first and keeps it
//! for replay, and answers with the position ([`Msg::Grant`]). The sender then delivers the
//! update to every other member in circular NodeId order, starting after the locker
//! ([`Msg::Batch`]), and ends the update with an [`Msg::Unlock`] to the locker. Unlike MSCS:
//!
//! - **Pipelined and batched.** A sender keeps up to `window` lock requests outstanding and
//!   puts every update its clients submitted meanwhile under one lock grant; lock requests
//!   of several senders that reach the locker together are granted as one combined entry,
//!   which the locker delivers itself ([`Msg::GrantCombined`], [`Msg::Committed`]); the
//!   locker briefly holds a grant for the next updates of senders whose clients it just
//!   answered (`grant_hold_max`), so that many senders of one update each share a position.
//!   A combined entry goes at once only to its senders and to enough voters for a quorum
//!   and a few spares (`eager_spare`); the other members get the positions they are owed
//!   several at a time, at most `lazy_delivery_max` later (or with a heartbeat), so that a
//!   position wakes and fsyncs about a quorum of the members rather than all of them.
//!   The lock is a sequencer: receivers take positions in any order and apply them in log
//!   order.
//! - **No blocking RPC.** Every step is a one-way message answered by a one-way message;
//!   losses are repaired by retransmission after `retransmit_after`, and every client wait
//!   is bounded (`update_timeout`).
//! - **Durable and acknowledged by a quorum.** Every member writes an update to its log and
//!   acknowledges ([`Msg::Ack`]) once it is fsynced together with every earlier position.
//!   An update is *committed* when a quorum of the voting configuration (below) has
//!   acknowledged it; only committed updates are applied, and a client is told
//!   [`Event::Committed`] when the update is applied at its sender. So every acknowledged
//!   update is fsynced on a majority of the voters.
//!
//! # Failures (the five cases of the thesis)
//!
//! 1. *The sender fails*: the locker holds the update and, when the sender has not finished
//!    within `takeover_after`, transmits it itself.
//! 2. *A receiver fails*: nobody waits for it; the quorum commits, and the receiver, if it
//!    comes back, repairs its log from the locker ([`Msg::RepairRequest`]).
//! 3. *The locker fails*: the membership installs a view without it, whose lowest member
//!    becomes locker in a new *epoch*. It collects the members' logs ([`Msg::SyncRequest`],
//!    [`Msg::SyncState`]), keeps for each position what the most recent epoch decided, and
//!    replays the result to everyone ([`Msg::Catchup`]), so a committed update is never
//!    lost.
//! 4. *The sender and the locker fail*: the same replay finds the update at whichever
//!    receiver got it and finishes it.
//! 5. *The sender and every receiver of an update fail*: no survivor has it, so the new
//!    locker's log does not contain it ([`Entry::Skip`] holds its place if later positions
//!    exist). It was never committed, so no client was told it happened; when the failed
//!    nodes return, the new epoch's log replaces theirs and the update leaves no trace.
//!
//! Epochs are ordered by (view, round, locker). A member *promises* an epoch before it helps
//! its locker and ignores lockers of older epochs afterwards; promises, log entries and the
//! epoch a log belongs to are written to the write-ahead log before they are acted on.
//!
//! # Who votes: configurations that follow the views
//!
//! The voters are not fixed: the *voting configuration* is itself in the log, as
//! [`Entry::Config`] entries, and the locker moves it to follow the membership views — a
//! member the view dropped stops voting, a member the view added votes once it holds the
//! log. Views only *propose* (they pick the locker and the configuration it moves to);
//! the decisions are made by quorums of configurations in the log, so no view — late,
//! wrong, or different at different nodes — can make two nodes disagree. The rules:
//!
//! - **Configuration of a position.** Position `s` is governed by `K(s)`, the latest
//!   configuration entry at or before `s` (or the one a snapshot carries). A configuration
//!   is a set of voters, or during a change the *joint* configuration of the old and the
//!   new set; a *quorum* is a majority of each of its sets.
//! - **Commit.** `s` is committed when a quorum of `K(s)` has acknowledged, in the current
//!   epoch, a durable log prefix through `s`. A node counts only positions up to where its
//!   own log is gap-free, so it knows `K(s)`.
//! - **Changes (Raft's joint consensus).** The locker writes the joint entry `old → new`
//!   only when the latest configuration entry is committed and not joint, and the entry of
//!   `new` alone only when the joint entry is committed. `new` is the view's members that
//!   hold the log (a joining node is first brought up to date by state transfer, then
//!   voted in), plus the locker — and, while that makes fewer than three and the
//!   configuration has more, voters the view dropped, so that no set of voters ever
//!   depends on every one of two nodes (the view may still list one that has just lost
//!   its log for good).
//! - **Sync.** A new locker's decided log `D` is the union of the logs reporting the newest
//!   epoch among the states it collected; it finishes only when those states include a
//!   quorum of `K(D)`, the configuration at the end of `D` (and every position some state
//!   knows committed is present). Each state comes with a durable promise.
//!
//! *Why no committed update is lost.* Suppose `s` was committed in epoch `e` by the
//! acknowledgements of a quorum `A` of `K(s)`, and let `e'` be the first later epoch whose
//! sync finished with a decided log `D` lacking `s`; take `s` the smallest such position,
//! so `D` holds every committed position before `s`, configuration entries included. The
//! configurations of the committed prefix form a chain `K₀, K₀→K₁, K₁, K₁→K₂, …` in which
//! each element is committed before the next is written, and `D` extends that prefix, so
//! `K(D)` is `K(s)`, a later element of the chain, or an uncommitted entry one step after
//! the last committed one. Every quorum of a joint configuration contains a quorum of both
//! its sets, and an element of the chain is committed only by a quorum of itself, which has
//! also acknowledged `s` (acknowledgements are of prefixes). Following the chain from
//! `K(s)` to `K(D)`, each committed element's quorum of acknowledgements therefore holds
//! `s`, and the next element's quorums intersect it; so the sync quorum `Q` of `K(D)`
//! contains a node `v` that acknowledged `s` in `e` or in a later epoch whose decided log
//! held `s`. `v` promised `e'` after that acknowledgement (it ignores older epochs once it
//! has promised), so it reported a newest epoch `e_n ≥ e`. Every log of `e_n` contains
//! `s`: a node joins an epoch only by adopting its complete decided log, which for
//! `e_n > e` holds `s` by the choice of `e'`, and a log is never shortened within its
//! epoch. So `D`, the union of the logs of `e_n`, holds `s` — a contradiction. The same
//! quorum argument confirms a linearizable read: the locker's heartbeat round is
//! acknowledged by a quorum of its latest configuration.
//!
//! *Why the views make it live.* The membership installs view `V + 1` only with the
//! agreement of a quorum of `V`, and the locker of every view moves the configuration to
//! the view's members, so a new locker normally finds a quorum of the configuration among
//! the members of its own view. If a view ever leaves fewer than a quorum of the
//! configuration alive (several voters failed before the configuration could follow), the
//! sync waits — for a failed voter to return — rather than decide without the updates
//! only they may hold.
//!
//! # Restarts, torn tails and lost logs
//!
//! A node that restarts with its log resumes its promises and its epoch. What it had
//! persisted but not yet fsynced may be gone, wholly or in part — a crash, a power loss, a
//! disk that filled in the middle of a write: the write-ahead log then ends inside a record
//! (a *torn tail*), which the host cuts to the last whole record, and the node comes back
//! under the same identity. That is safe because the machine acts on a record only once
//! [`Gup::handle_durable`] says it is fsynced; what leaves before that depends on nothing
//! the record holds being kept. A host may (and `ulnet node` does) send the messages of a
//! batch of input before it fsyncs the batch's records; these are the messages that may
//! leave ahead of their records, and why losing the records costs nothing:
//!
//! - [`Msg::Grant`], [`Msg::GrantCombined`], and the locker's [`Msg::Batch`] and
//!   [`Msg::Catchup`] of entries it has not fsynced: a grant commits nothing. A position is
//!   committed only by acknowledgements of durable prefixes, and the locker counts its own
//!   log only up to its durable prefix. A locker that restarts never resumes granting in
//!   its epoch (grants it forgot are not made again under the same epoch): its next view
//!   starts a new epoch, whose sync decides from the logs of a quorum.
//! - A sender's [`Msg::Batch`] and [`Msg::LockRequest`]: the update is the client's, not a
//!   promise; receivers persist it and acknowledge their own durable copies.
//! - [`Msg::SyncRequest`] after a [`Record::Promise`] of the new locker's epoch, and an
//!   establishing [`Msg::Catchup`] of a decided log not yet fsynced (the answer to a late
//!   member's state): the members answer with [`Msg::SyncState`] only once *their* promises
//!   are durable, and the locker grants, counts commits and confirms reads in its epoch only
//!   once its decided log and its [`Record::Normal`] are durable. A locker that loses them
//!   syncs again (in the same epoch or a newer one) before it does anything else; members
//!   that adopted the lost decided log report it as a log of that epoch, the newest there
//!   is, so the next sync decides the same entries again.
//! - [`Msg::Heartbeat`] and [`Msg::Committed`] carry commits worked out from durable
//!   acknowledgements, and `granted` only as a hint for repairs.
//! - [`Msg::Unlock`], [`Msg::ReadIndexRequest`], [`Msg::ReadIndexReply`] and
//!   [`Msg::RepairRequest`] depend on no record of their sender.
//!
//! Every message that does depend on a record — an [`Msg::Ack`] (of the durable prefix
//! only), a [`Msg::SyncState`] (after the promise and everything before it are durable),
//! the acknowledgement of a heartbeat round (it reports the durable prefix, and a node that
//! promised a newer epoch refuses the round), the locker's first grant in an epoch (after
//! its decided log and [`Record::Normal`] are durable), a node becoming normal (after the
//! adopted log is durable) — waits for [`Gup::handle_durable`]. So a record whose fsync did
//! not return was never acknowledged, never answered a promise, and never granted anything
//! that a quorum counted; a node that loses it is exactly a node that crashed before
//! writing it, which the protocol survives (the simulator keeps a random part of the
//! unfsynced records at every restart). Every acknowledged update is fsynced on a quorum of
//! its configuration and stays there.
//!
//! The same holds when every log tears at once (a power loss, a disk that filled on every
//! node): each node comes back as itself with its durable log, the view's locker syncs, and
//! the sync decides the union of the logs of the newest epoch among a quorum of the
//! configuration — which holds every acknowledged update, as above — and goes on from
//! there. A host whose disk fails while it runs (no space, a quota, an I/O error) stops
//! feeding the machine, drops it, cuts the log back to what its last successful fsync
//! covered (what a failed fsync wrote may show in the page cache and not be on disk), and,
//! once the disk takes writes again, recovers a new machine from the log under the same
//! identity, as a restart would.
//!
//! A log whose durable prefix was damaged (corruption: a bad record followed by good ones,
//! a whole record that fails its checksum — bit rot there cannot be told from an unfinished
//! write, so it is not taken for one) may have forgotten promises and acknowledged updates,
//! so its node must not come back as the same voter: the host gives it a new identity (a
//! new membership id), under which it is an empty-handed joiner that keeps only the
//! committed prefix it still holds and is brought up to date by state transfer. The old
//! identity is a failed node: the next view drops it and the configuration follows.
//! [`Gup::recover`] applies this rule itself when the log it is given belongs to another
//! identity or lost its tail ([`Recovered::lost_tail`]).
//!
//! # Using the machine
//!
//! No sockets, no clock, no threads. Feed it [`Gup::handle_view`], [`Gup::handle_message`],
//! [`Gup::handle_timeout`] (at [`Gup::poll_timeout`]) and [`Gup::handle_durable`] (after an
//! fsync), and give it work with [`Gup::submit`] and [`Gup::read`]. After each call drain
//! [`Gup::poll_event`] (write [`Event::Persist`] records to the log in order, apply
//! [`Event::Apply`]) and [`Gup::poll_transmit`].

mod config;
mod locker;
mod receiver;
mod sender;
mod timing;
pub mod types;
pub mod wire;

pub use config::GupConfig;
pub use timing::{Histogram, Timing};
pub use types::{BatchId, Entry, Epoch, NodeId, Part, Record, Snapshot, View, VotingConfig};
pub use wire::Msg;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// How long an idle non-locker sleeps when nothing is under way (its next input is a
/// message or a client's update, which come with their own wake-up).
const IDLE_WAKE: std::time::Duration = std::time::Duration::from_secs(1);

/// A client update, as numbered by [`Gup::submit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpdateId(pub u64);

/// A linearizable read, as numbered by [`Gup::read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReadId(pub u64);

/// Why an update was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The update is larger than [`crate::codec::UPDATE_BYTES_MAX`].
    #[error("update of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// `queue_max` updates are waiting already; retry after some complete.
    #[error("the update queue is full; retry later")]
    QueueFull,
    /// This node is not a member of its current view (or has none yet).
    #[error("this node is not a member of the cluster's current view")]
    NotMember,
}

/// What the machine asks of its host, or tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Append this record to the write-ahead log (in LSN order), then call
    /// [`Gup::handle_durable`] once it is fsynced.
    Persist {
        /// Log sequence number of the record.
        lsn: u64,
        /// The record.
        record: Record,
    },
    /// Apply the committed entry at `seq` (entries come in log order, each once per
    /// incarnation after the snapshot the host started from).
    Apply {
        /// Position.
        seq: u64,
        /// The entry.
        entry: Entry,
    },
    /// Replace the application state with this snapshot, taken after position `seq`.
    InstallSnapshot {
        /// Last position included.
        seq: u64,
        /// The snapshot.
        data: Arc<[u8]>,
    },
    /// The update is committed (fsynced on a quorum) and applied here at `seq`.
    Committed {
        /// The update.
        id: UpdateId,
        /// Its position.
        seq: u64,
    },
    /// The update was not committed within `update_timeout`, or this node left the view:
    /// it may or may not be applied later.
    Indeterminate {
        /// The update.
        id: UpdateId,
    },
    /// The read may be served from the local state now: it reflects every update
    /// committed before the read was asked for.
    ReadReady {
        /// The read.
        id: ReadId,
        /// The position the local state has reached at least.
        index: u64,
    },
    /// The read could not be confirmed within `read_timeout`.
    ReadFailed {
        /// The read.
        id: ReadId,
    },
}

/// What a node found in its write-ahead log at start-up.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The records, in log order (a snapshot record first, if any).
    pub records: Vec<Record>,
    /// The log had a corrupted tail that was refused (not a torn one: a write whose fsync
    /// never returned held nothing acted on, and is cut without this): the node may have
    /// lost promises and acknowledged entries, so it comes back as a new node (the host must
    /// give it a new identity) that keeps only its committed prefix.
    pub lost_tail: bool,
}

/// Counters of what the machine did and refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages that failed to decode (dropped).
    pub malformed: u64,
    /// Messages of an older epoch, or from a node that is not the locker they claim.
    pub stale: u64,
    /// Lock grants given (as locker).
    pub grants: u64,
    /// Of those, grants that combined several senders' batches into one entry.
    pub combined: u64,
    /// Entries transmitted by the locker on behalf of a sender (case 1).
    pub takeovers: u64,
    /// Syncs completed as new locker.
    pub syncs: u64,
    /// Positions filled with [`Entry::Skip`] by a sync (case 5).
    pub skips: u64,
    /// Repair requests sent.
    pub repairs: u64,
    /// Updates reported indeterminate.
    pub indeterminate: u64,
    /// Configuration entries written (as locker).
    pub config_changes: u64,
    /// Catch-ups that delivered owed positions to members outside the eager sets (as
    /// locker; see [`GupConfig::eager_spare`]).
    pub owed_deliveries: u64,
    /// Owed positions sent to a member right before a position it gets at once (as
    /// locker): it joined an eager set, and a hole would keep it from acknowledging and
    /// applying.
    pub owed_with_delivery: u64,
    /// Sync states of late members not answered with another establishing catch-up because
    /// one went to them less than `heartbeat_interval` before (as locker; repeats that a
    /// partition held back and delivered together).
    pub repeated_sync_states: u64,
}

/// One position of the in-memory log, with the LSN of the record that persisted it.
#[derive(Clone, Debug)]
struct Slot {
    entry: Entry,
    lsn: u64,
}

/// What to do once the record with a given LSN is durable.
#[derive(Clone, Debug)]
enum AfterDurable {
    /// Answer a sync request with my state (after the promise is durable).
    SendSyncState { to: NodeId, epoch: Epoch, from: u64 },
    /// Become normal in `epoch` (after the adopted log and the Normal record are durable);
    /// the epoch's log was decided up to `end`.
    BecomeNormal { epoch: Epoch, end: u64 },
    /// The new locker's log is durable: start granting.
    LockerReady { epoch: Epoch },
}

/// A participant of the Global Update Protocol. See the module documentation.
pub struct Gup {
    me: NodeId,
    config: GupConfig,
    incarnation: u32,

    // Durable protocol state (mirrors what the log says).
    promised: Epoch,
    last_normal: Option<Epoch>,

    // The log.
    base: u64,
    /// The voting configuration at `base` (None: a node that has never held a log).
    base_config: Option<VotingConfig>,
    snapshot: Option<Snapshot>,
    log: BTreeMap<u64, Slot>,
    /// The configuration entries of the log, by position.
    configs: BTreeMap<u64, VotingConfig>,
    /// Every position up to here is in the log (or the snapshot).
    contiguous: u64,
    durable_prefix: u64,
    applied: u64,
    commit: u64,
    commit_recorded: u64,
    /// Highest commit this node worked out from acknowledgements itself (as the transmitter
    /// of a position): the one the locker may not know yet, which an Unlock tells it.
    commit_by_acks: u64,
    /// Highest position known to be granted (from heartbeats and batches).
    granted_known: u64,
    /// Snapshots from peers installed so far (they hide which batches they contain).
    snapshot_installs: u64,

    // Persistence.
    next_lsn: u64,
    durable_lsn: u64,
    after_durable: VecDeque<(u64, AfterDurable)>,

    // Roles.
    view: Option<View>,
    normal: bool,
    /// Adopting a new locker's log, which ends at the given position: normal once the log
    /// is complete up to it.
    establishing: Option<(Epoch, u64)>,
    locker: Option<locker::LockerState>,
    /// Nodes whose sync states the new locker used, with their applied positions: they get
    /// the decided log once it is durable.
    locker_pending_establish: Vec<(NodeId, u64)>,
    sync: Option<locker::SyncCollect>,
    sender: sender::SenderState,
    /// Durable prefixes other nodes reported for the current epoch.
    peer_prefix: HashMap<NodeId, u64>,
    /// (position, transmitter) pairs to acknowledge once the position is durable here.
    ack_wanted: BTreeMap<u64, Vec<NodeId>>,
    /// Since when the log has had a hole below the known granted position.
    hole_since: Option<Instant>,
    last_repair: Option<Instant>,

    // Reads.
    reads: receiver::Reads,

    next_tick: Instant,
    /// The time of the latest input (for work done while the host polls).
    last_now: Instant,
    transmits: VecDeque<(NodeId, Msg)>,
    events: VecDeque<Event>,
    counters: Counters,
    timing: timing::TimingState,
    /// When `timing` was last reported (a `gup_timing` log line every `TIMING_REPORT`).
    timing_reported: Instant,
    /// The commit last seen by `timing`, and the member whose acknowledgement came last.
    timing_commit: u64,
    last_ack_from: Option<NodeId>,
    /// The members that got the last combined position at once.
    last_eager: Vec<NodeId>,
}

/// How often the `gup_timing` histograms are logged (at info level, target `gup_timing`).
const TIMING_REPORT: std::time::Duration = std::time::Duration::from_secs(2);

impl Gup {
    /// A participant that starts a new cluster whose first voting configuration is
    /// `voters` (every one of them is created the same way; a daemon creates a cluster of
    /// one, `vec![me]`, and lets the others join). Writes the configuration to the log as
    /// its first, committed, position.
    pub fn bootstrap(me: NodeId, voters: Vec<NodeId>, config: GupConfig, now: Instant) -> Self {
        let voters = VotingConfig::new(voters);
        let mut g = Self::empty(me, config, now);
        g.incarnation = 1;
        g.persist(Record::Boot { incarnation: 1, node: me });
        // The genesis epoch: view 0, locked by the lowest voter; everyone's log is its
        // authoritative log.
        let genesis = Epoch { view: 0, round: 0, locker: voters.voters[0] };
        g.promised = genesis;
        g.last_normal = Some(genesis);
        g.persist(Record::Promise { epoch: genesis });
        g.persist(Record::Normal { epoch: genesis });
        g.persist_entry(1, Entry::Config(voters));
        g.commit = 1;
        g.normal = genesis.locker != me;
        g.apply_committed();
        g
    }

    /// A participant rebuilt from its write-ahead log (empty for a node joining the cluster
    /// for the first time), after a restart of the process or of the machine alone (a host
    /// whose disk failed and took writes again). A log cut at a torn tail resumes as
    /// itself; one that lost a corrupted tail ([`Recovered::lost_tail`]), or that belongs to
    /// another identity (see [`Record::Boot`]), makes a fresh node that keeps only its
    /// committed prefix. See *Restarts, torn tails and lost logs* in the module documentation.
    pub fn recover(me: NodeId, config: GupConfig, recovered: Recovered, now: Instant) -> Self {
        let mut g = Self::empty(me, config, now);
        let mut identity: Option<NodeId> = None;
        for record in recovered.records {
            match record {
                Record::Boot { incarnation, node } => {
                    g.incarnation = g.incarnation.max(incarnation);
                    if identity != Some(node) {
                        // The records before belong to another identity: its promises are
                        // not this one's.
                        g.promised = Epoch::default();
                        g.last_normal = None;
                        identity = Some(node);
                    }
                }
                Record::Entry { seq, entry } => {
                    if seq > g.base {
                        g.log.insert(seq, Slot { entry, lsn: 0 });
                    }
                }
                Record::TruncateAfter { seq } => {
                    g.log.split_off(&(seq + 1));
                }
                Record::Promise { epoch } => g.promised = g.promised.max(epoch),
                Record::Normal { epoch } => g.last_normal = Some(epoch),
                Record::Commit { seq } => g.commit = g.commit.max(seq),
                Record::Snapshot { snapshot, node, incarnation, promised, last_normal, tail } => {
                    identity = Some(node);
                    g.incarnation = g.incarnation.max(incarnation);
                    g.promised = promised;
                    g.last_normal = last_normal;
                    g.base = snapshot.seq;
                    g.base_config = Some(snapshot.config.clone());
                    g.applied = snapshot.seq;
                    g.commit = g.commit.max(snapshot.seq);
                    g.log = tail.into_iter().map(|(seq, entry)| (seq, Slot { entry, lsn: 0 })).collect();
                    g.snapshot = Some(snapshot);
                }
            }
        }
        let fresh = recovered.lost_tail || identity != Some(me);
        if fresh {
            if identity == Some(me) {
                tracing::error!(node = %me, "a log that lost its tail recovered under the same identity: the host must give the node a new one");
            }
            g.promised = Epoch::default();
            g.last_normal = None;
        }
        g.configs = g
            .log
            .iter()
            .filter_map(|(s, slot)| match &slot.entry {
                Entry::Config(c) => Some((*s, c.clone())),
                _ => None,
            })
            .collect();
        g.durable_prefix = g.base;
        g.contiguous = g.base;
        g.advance_contiguous();
        g.advance_durable_prefix();
        g.granted_known = g.log.keys().next_back().copied().unwrap_or(g.base);
        // A restarted node may resume following the epoch it followed, but never resumes
        // *granting* in an epoch: grants it made but had not fsynced are forgotten.
        g.normal = g.last_normal == Some(g.promised) && g.promised.locker != me && g.promised != Epoch::default();
        g.incarnation += 1;
        g.persist(Record::Boot { incarnation: g.incarnation, node: me });
        if fresh {
            // Only committed positions are known to be right; the rest is the locker's to say.
            let keep = g.commit.max(g.base);
            g.truncate_after(keep);
        }
        g.apply_committed();
        g
    }

    fn empty(me: NodeId, config: GupConfig, now: Instant) -> Self {
        assert!(
            config.window as u64 <= locker::GRANT_MEMORY,
            "window {} above the locker's grant memory {}",
            config.window,
            locker::GRANT_MEMORY
        );
        Self {
            me,
            config,
            incarnation: 0,
            promised: Epoch::default(),
            last_normal: None,
            base: 0,
            base_config: None,
            snapshot: None,
            log: BTreeMap::new(),
            configs: BTreeMap::new(),
            contiguous: 0,
            durable_prefix: 0,
            applied: 0,
            commit: 0,
            commit_recorded: 0,
            commit_by_acks: 0,
            granted_known: 0,
            snapshot_installs: 0,
            next_lsn: 1,
            durable_lsn: 0,
            after_durable: VecDeque::new(),
            view: None,
            normal: false,
            establishing: None,
            locker: None,
            locker_pending_establish: Vec::new(),
            sync: None,
            sender: sender::SenderState::default(),
            peer_prefix: HashMap::new(),
            ack_wanted: BTreeMap::new(),
            hole_since: None,
            last_repair: None,
            reads: receiver::Reads::default(),
            next_tick: now,
            last_now: now,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            timing: timing::TimingState::default(),
            timing_reported: now,
            timing_commit: 0,
            last_ack_from: None,
            last_eager: Vec::new(),
        }
    }

    /// This node.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// The epoch this node has promised to follow.
    pub fn epoch(&self) -> Epoch {
        self.promised
    }

    /// Whether this node holds the authoritative log of its epoch and takes part in it.
    pub fn is_normal(&self) -> bool {
        self.normal
    }

    /// Whether this node is the locker of its epoch and granting.
    pub fn is_locker(&self) -> bool {
        self.locker.is_some() && self.normal
    }

    /// Position up to which entries were applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Position up to which this node's log is complete and fsynced.
    pub fn durable_prefix(&self) -> u64 {
        self.durable_prefix
    }

    /// Committed position known here.
    pub fn committed(&self) -> u64 {
        self.commit
    }

    /// The log entries held (position and entry), from the snapshot on.
    pub fn log_entries(&self) -> impl Iterator<Item = (u64, &Entry)> {
        self.log.iter().map(|(s, slot)| (*s, &slot.entry))
    }

    /// Position covered by the snapshot (0 without one).
    pub fn snapshot_seq(&self) -> u64 {
        self.base
    }

    /// The voting configuration at the end of this node's log (None: it never held one).
    pub fn voting_config(&self) -> Option<&VotingConfig> {
        self.configs.values().next_back().or(self.base_config.as_ref())
    }

    /// The voting configuration in force at the applied position.
    pub fn applied_config(&self) -> Option<&VotingConfig> {
        self.config_at(self.applied)
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Where positions spent their time, since the last `gup_timing` report.
    pub fn timing(&self) -> Timing {
        self.timing.timing
    }

    fn observe_timing(&mut self, now: Instant) {
        let from = self.last_ack_from.take();
        if self.commit > self.timing_commit {
            self.timing_commit = self.commit;
            if self.is_locker() {
                let by_owed = from.is_some_and(|f| !self.last_eager.contains(&f));
                self.timing.committed(now, self.commit, from.is_some(), by_owed);
            }
        }
        if now >= self.timing_reported + TIMING_REPORT {
            self.timing_reported = now;
            let t = std::mem::take(&mut self.timing.timing);
            if t != Timing::default() {
                tracing::info!(
                    target: "gup_timing",
                    me = %self.me,
                    locker = self.is_locker(),
                    commit = self.commit,
                    "commit {} | first_ack {} | quorum_ack {} | gap {} | sender_return {} | hold {} | ack_delay {} | own_apply {} | quorum_by_owed {} | own_over_hole {}",
                    t.commit, t.first_ack, t.quorum_ack, t.gap, t.sender_return, t.hold, t.ack_delay, t.own_apply, t.quorum_by_owed, t.own_over_hole
                );
            }
        }
    }

    /// The current view, if one was installed.
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// A message arrived from `from`. Malformed messages are counted and dropped.
    pub fn handle_message(&mut self, now: Instant, from: NodeId, bytes: &[u8]) {
        match Msg::decode(bytes) {
            Ok(msg) => self.handle_msg(now, from, msg),
            Err(error) => {
                self.counters.malformed += 1;
                tracing::debug!(%from, %error, "dropped a malformed GUP message");
            }
        }
    }

    /// A decoded message arrived from `from` (for hosts that decode themselves).
    pub fn handle_msg(&mut self, now: Instant, from: NodeId, msg: Msg) {
        self.last_now = self.last_now.max(now);
        if from == self.me {
            self.counters.malformed += 1;
            return;
        }
        if let Msg::SyncState { snapshot: Some(s), .. } | Msg::Catchup { snapshot: Some(s), .. } = &msg {
            if !(self.config.snapshot_valid)(&s.data) {
                self.counters.malformed += 1;
                tracing::warn!(%from, "dropped a message carrying an invalid snapshot");
                return;
            }
        }
        match msg {
            Msg::LockRequest { epoch, batch, updates } => self.on_lock_request(now, from, epoch, batch, updates),
            Msg::Grant { epoch, batch, seq } => self.on_grant(now, from, epoch, batch, seq),
            Msg::Batch { epoch, seq, commit, entry } => self.on_batch(now, from, epoch, seq, commit, entry),
            Msg::Ack { epoch, upto, round } => self.on_ack(now, from, epoch, upto, round),
            Msg::Unlock { epoch, upto } => self.on_unlock(from, epoch, upto),
            Msg::Heartbeat { epoch, commit, granted, round } => {
                self.on_heartbeat(now, from, epoch, commit, granted, round)
            }
            Msg::SyncRequest { epoch, from: first } => self.on_sync_request(from, epoch, first),
            Msg::SyncState { epoch, last_normal, applied, commit, snapshot, entries } => self.on_sync_state(
                now,
                from,
                locker::PeerState { epoch, last_normal, applied, commit, snapshot, entries },
            ),
            Msg::Catchup { epoch, establish, from: first, end, commit, snapshot, entries } => {
                self.on_catchup(now, from, epoch, establish, first, end, commit, snapshot, entries)
            }
            Msg::RepairRequest { epoch, from: first, to } => self.on_repair_request(from, epoch, first, to),
            Msg::ReadIndexRequest { epoch, id } => self.on_read_index_request(now, from, epoch, id),
            Msg::ReadIndexReply { epoch, id, index } => self.on_read_index_reply(from, epoch, id, index),
            Msg::GrantCombined { epoch, batch, seq } => self.on_grant_combined(now, from, epoch, batch, seq),
            Msg::Committed { epoch, upto } => {
                if epoch == self.promised && self.normal && from == epoch.locker {
                    self.learn_commit(upto);
                } else {
                    self.counters.stale += 1;
                }
            }
        }
        self.after_input(now);
    }

    /// A new membership view was installed. Views with a number not above the current one
    /// are ignored. The view's lowest member locks; a member that finds itself the locker
    /// of a newer view than its epoch's starts a new epoch.
    pub fn handle_view(&mut self, now: Instant, view: View) {
        self.last_now = self.last_now.max(now);
        if self.view.as_ref().is_some_and(|v| v.id >= view.id) {
            return;
        }
        let member = view.contains(self.me);
        let locks = view.locker() == Some(self.me);
        self.view = Some(view);
        if !member {
            // Out of the view: stop acting as locker or sender; keep answering as a voter
            // (that is always safe) so that a wrong view cannot lose data.
            self.locker = None;
            self.sync = None;
            self.fail_all_updates();
        } else if locks {
            self.on_view_as_locker(now);
        }
        self.after_input(now);
    }

    /// Records up to `lsn` are fsynced.
    pub fn handle_durable(&mut self, now: Instant, lsn: u64) {
        self.last_now = self.last_now.max(now);
        if lsn <= self.durable_lsn {
            return;
        }
        assert!(lsn < self.next_lsn, "durable LSN {lsn} beyond the last record persisted");
        self.durable_lsn = lsn;
        self.advance_durable_prefix();
        while self.after_durable.front().is_some_and(|(l, _)| *l <= lsn) {
            let (_, action) = self.after_durable.pop_front().expect("checked");
            self.run_after_durable(now, action);
        }
        self.send_due_acks();
        self.after_input(now);
    }

    /// Housekeeping at `now`: retransmissions, takeovers, repairs, heartbeats, deadlines.
    /// A harmless no-op before [`Gup::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        if now < self.next_tick {
            self.flush_grants();
            return;
        }
        self.next_tick = now + self.config.tick;
        self.sender_tick(now);
        self.flush_grants();
        self.locker_tick(now);
        self.receiver_tick(now);
        self.after_input(now);
    }

    /// When [`Gup::handle_timeout`] should next be called: every `tick` while something is
    /// under way (reads, a sync, a gap in the log, the locker's work), when a sender's
    /// retransmission or deadline is due, otherwise only for the locker's next heartbeat —
    /// an idle node sleeps.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Requests held back by `grants_in_flight_max` wait for a commit (input), not a timer.
        let grant_at = self.locker.as_ref().and_then(|l| l.grant_at(self.last_now, self.commit, &self.config));
        let tick = if self.busy() {
            self.next_tick
        } else {
            let idle = match self.locker.as_ref().filter(|_| self.normal) {
                Some(l) => l.next_heartbeat(self.config.heartbeat_interval),
                None => self.last_now + IDLE_WAKE,
            };
            let due = self.sender.next_due(self.commit, self.config.retransmit_after).map_or(idle, |d| d.min(idle));
            self.next_tick.max(due)
        };
        Some(grant_at.map_or(tick, |g| g.min(tick)))
    }

    /// Whether anything waits for the housekeeping tick.
    fn busy(&self) -> bool {
        self.sender.resolving()
            || !self.reads.is_empty()
            || self.sync.is_some()
            || self.establishing.is_some()
            || self.contiguous < self.granted_known.max(self.commit)
            || self.locker.as_ref().is_some_and(|l| l.busy(self.commit))
    }

    /// The next message to send, encoded.
    pub fn poll_transmit(&mut self) -> Option<(NodeId, Vec<u8>)> {
        self.poll_msg().map(|(to, msg)| (to, msg.encode()))
    }

    /// The next message to send, not encoded (for hosts that encode themselves).
    pub fn poll_msg(&mut self) -> Option<(NodeId, Msg)> {
        self.flush_grants();
        self.transmits.pop_front()
    }

    /// The next event for the host. As locker, the lock requests that arrived since the
    /// last poll are granted here, together: the host's polling after a burst of input is
    /// what lets concurrent updates share one grant.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.flush_grants();
        self.events.pop_front()
    }

    /// The host took a snapshot of the application state after applying position `seq`
    /// (at most [`Gup::applied`]): entries up to it leave memory and, once the host has
    /// written the snapshot record, the log.
    pub fn compact(&mut self, seq: u64, data: Arc<[u8]>) {
        assert!(seq <= self.applied, "snapshot at {seq} beyond the applied position {}", self.applied);
        if seq <= self.base {
            return;
        }
        let config = self.config_at(seq).cloned().expect("an applied position has a configuration");
        self.set_base(Snapshot { seq, config, data });
    }

    // ----- shared helpers -----

    /// The configuration governing position `seq` (None for a node without any).
    fn config_at(&self, seq: u64) -> Option<&VotingConfig> {
        if seq <= self.base {
            return self.base_config.as_ref();
        }
        self.configs.range(..=seq).next_back().map(|(_, c)| c).or(self.base_config.as_ref())
    }

    fn in_view(&self) -> bool {
        self.view.as_ref().is_some_and(|v| v.contains(self.me))
    }

    /// Everyone an update must reach: the view's members and the voters, without me,
    /// in circular order starting after `after`.
    fn targets_after(&self, after: NodeId) -> Vec<NodeId> {
        let mut all: Vec<NodeId> = self.voting_config().map(|c| c.all()).unwrap_or_default();
        if let Some(v) = &self.view {
            all.extend(v.members.iter().copied());
        }
        all.sort_unstable();
        all.dedup();
        all.retain(|&n| n != self.me && n != after);
        let split = all.partition_point(|&n| n < after);
        all.rotate_left(split);
        all
    }

    fn send(&mut self, to: NodeId, msg: Msg) {
        debug_assert_ne!(to, self.me, "no message to self");
        self.transmits.push_back((to, msg));
    }

    fn persist(&mut self, record: Record) -> u64 {
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        self.events.push_back(Event::Persist { lsn, record });
        lsn
    }

    fn persist_entry(&mut self, seq: u64, entry: Entry) {
        debug_assert!(seq > self.base);
        let lsn = self.persist(Record::Entry { seq, entry: entry.clone() });
        match &entry {
            Entry::Config(c) => {
                self.configs.insert(seq, c.clone());
            }
            _ => {
                self.configs.remove(&seq);
            }
        }
        self.log.insert(seq, Slot { entry, lsn });
        self.granted_known = self.granted_known.max(seq);
        self.advance_contiguous();
    }

    fn truncate_after(&mut self, seq: u64) {
        if self.log.range(seq + 1..).next().is_some() {
            self.log.split_off(&(seq + 1));
            self.configs.split_off(&(seq + 1));
            self.persist(Record::TruncateAfter { seq });
        }
        self.durable_prefix = self.durable_prefix.min(seq.max(self.base));
        self.contiguous = self.contiguous.min(seq.max(self.base));
    }

    /// The state up to `snapshot.seq` is the snapshot's from now on (taken here, or
    /// installed from a peer): entries up to it leave the log, and one record — which lets
    /// the write-ahead log delete everything before it — carries what is still needed.
    fn set_base(&mut self, snapshot: Snapshot) {
        let seq = snapshot.seq;
        self.log = self.log.split_off(&(seq + 1));
        self.configs = self.configs.split_off(&(seq + 1));
        self.base = seq;
        self.base_config = Some(snapshot.config.clone());
        self.contiguous = self.contiguous.max(seq);
        self.advance_contiguous();
        // Positions up to a snapshot are committed: holding them durably or not no longer
        // matters to anyone's quorum.
        self.durable_prefix = self.durable_prefix.max(seq);
        self.advance_durable_prefix();
        self.snapshot = Some(snapshot.clone());
        let tail = self.log.iter().map(|(s, slot)| (*s, slot.entry.clone())).collect();
        self.persist(Record::Snapshot {
            snapshot,
            node: self.me,
            incarnation: self.incarnation,
            promised: self.promised,
            last_normal: self.last_normal,
            tail,
        });
    }

    fn advance_contiguous(&mut self) {
        while self.log.contains_key(&(self.contiguous + 1)) {
            self.contiguous += 1;
        }
    }

    fn advance_durable_prefix(&mut self) {
        while let Some(slot) = self.log.get(&(self.durable_prefix + 1)) {
            if slot.lsn > self.durable_lsn {
                break;
            }
            self.durable_prefix += 1;
        }
    }

    fn run_after_durable(&mut self, now: Instant, action: AfterDurable) {
        match action {
            AfterDurable::SendSyncState { to, epoch, from } if to == self.me => {
                if self.promised == epoch {
                    self.self_sync_state(now, epoch, from);
                }
            }
            AfterDurable::SendSyncState { to, epoch, from } => {
                if self.promised == epoch {
                    if let Some(state) = self.sync_state(epoch, from) {
                        self.send(to, state);
                    }
                }
            }
            AfterDurable::BecomeNormal { epoch, end } => {
                if self.promised == epoch && !self.normal && self.last_normal == Some(epoch) {
                    self.normal = true;
                    self.peer_prefix.clear();
                    self.advance_durable_prefix();
                    let upto = self.durable_prefix;
                    self.send(epoch.locker, Msg::Ack { epoch, upto, round: 0 });
                    self.sender_epoch_changed(now, end);
                }
            }
            AfterDurable::LockerReady { epoch } => self.locker_ready(now, epoch),
        }
    }

    /// A new epoch was promised: whatever role this node had in the old one ends.
    fn promise(&mut self, epoch: Epoch) -> u64 {
        debug_assert!(epoch > self.promised);
        self.promised = epoch;
        self.normal = false;
        self.establishing = None;
        self.timing.reset();
        self.peer_prefix.clear();
        self.ack_wanted.clear();
        if epoch.locker != self.me {
            self.locker = None;
            self.sync = None;
        }
        self.persist(Record::Promise { epoch })
    }

    /// Commits learned from anyone in the current epoch; applies what is present.
    fn learn_commit(&mut self, commit: u64) {
        if commit > self.commit {
            self.commit = commit;
        }
    }

    /// Recomputes the commit from the durable prefixes reported in this epoch: the largest
    /// position `s` that a quorum of `K(s)` holds, looking only where my log is gap-free
    /// (so that I know every configuration entry up to `s`).
    fn commit_from_acks(&mut self) {
        if !self.normal || self.contiguous <= self.commit {
            return;
        }
        let me = self.me;
        let own = self.durable_prefix;
        let peers = &self.peer_prefix;
        let prefix = |n: NodeId| if n == me { own } else { peers.get(&n).copied().unwrap_or(0) };
        // Regions of one configuration each, from the newest down: [start, end].
        let mut end = self.contiguous;
        let regions = self
            .configs
            .range(..=self.contiguous)
            .rev()
            .map(|(s, c)| (*s, c))
            .chain(self.base_config.as_ref().map(|c| (self.base + 1, c)));
        for (start, config) in regions {
            let reached = config.quorum_value(prefix).min(end);
            if reached >= start {
                if reached > self.commit {
                    self.commit = reached;
                    self.commit_by_acks = reached;
                }
                return;
            }
            if start <= self.commit + 1 {
                return;
            }
            end = start - 1;
        }
    }

    fn apply_committed(&mut self) {
        while self.applied < self.commit {
            let Some(slot) = self.log.get(&(self.applied + 1)) else { break };
            let entry = slot.entry.clone();
            self.applied += 1;
            let seq = self.applied;
            for part in entry.parts() {
                if part.origin == self.me {
                    self.sender_applied(part.batch, seq);
                }
            }
            self.events.push_back(Event::Apply { seq, entry });
        }
        // The committed position is a restart hint; record it now and then, riding on other
        // records' fsyncs.
        if self.applied >= self.commit_recorded + 64
            || (self.applied > self.commit_recorded && self.after_durable.is_empty() && self.ack_wanted.is_empty())
        {
            self.commit_recorded = self.applied;
            self.persist(Record::Commit { seq: self.applied });
        }
    }

    fn after_input(&mut self, now: Instant) {
        self.commit_from_acks();
        self.observe_timing(now);
        self.notify_commits();
        self.apply_committed();
        self.drive_config(now);
        self.sender_pump(now);
        self.reads_pump(now);
    }
}
