//! The shared state the helper modules work on, behind a narrow interface.
//!
//! Every node keeps its own load record and an inbox word in its own memory; one role word
//! (the [`RoleTable`]) holds every node's role. The operations are the ones the thesis'
//! helpers needed from InfiniBand, and no more:
//!
//! | operation | thesis | here |
//! |---|---|---|
//! | [`SharedState::publish_load`] | write own record in local memory | seqlock write of the node's own record ([`record`]) |
//! | [`SharedState::read_load`] | RDMA READ of another node's record | one-sided READ, a torn copy read again |
//! | [`SharedState::read_roles`] | RDMA READ of the configuration | one-sided READ of the role word |
//! | [`SharedState::cas_roles`] | remote compare-and-swap on a node's status | remote compare-and-swap on the role word, returning the value found |
//! | [`SharedState::announce`] | the winner tells the other modules | compare-and-swap of the new table into a node's inbox word (only forward in epoch) |
//! | [`SharedState::announced`] | a module learns the configuration | read own inbox word, locally |
//!
//! [`rma::RmaState`] implements it over ulnet remote memory, on one host (segments mapped,
//! or every operation through the owner's engine) or across hosts (over TCP).

pub mod record;
pub mod rma;

use crate::load::{LoadRecord, SLOT_WORDS};
use crate::role::{NodeIndex, RoleTable};
use serde::{Deserialize, Serialize};

/// Why a shared-state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The node index is outside the data center.
    #[error("node {0} is not a slot of this data center")]
    NoSuchNode(NodeIndex),
    /// This handle belongs to no node, so it has no record or inbox of its own.
    #[error("an observer handle has no record of its own")]
    NotANode,
    /// The memory that holds the state could not be reached (peer gone, mapping lost).
    #[error("shared state unreachable: {0}")]
    Unreachable(String),
}

/// The outcome of [`SharedState::cas_roles`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// The word held the expected table and now holds the new one.
    Swapped,
    /// The word held another table, returned here: the caller's new view.
    Failed(RoleTable),
}

/// What a handle did, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounters {
    /// Copies of other nodes' load records taken (one-sided READs).
    pub record_reads: u64,
    /// Of those, copies found torn and taken again.
    pub torn_copies: u64,
    /// Reads of the role word.
    pub role_reads: u64,
    /// Compare-and-swaps of the role word.
    pub cas: u64,
    /// Of those, the ones that found another table.
    pub cas_failed: u64,
    /// Announcements made.
    pub announces: u64,
    /// Operations that failed because a peer could not be reached.
    pub unreachable: u64,
    /// Remote operations done on mappings (same host, owner not involved).
    pub mapped_ops: u64,
    /// Remote operations sent to the owner's engine over a channel.
    pub channel_ops: u64,
    /// Operations of other processes this process's engine served (reads and atomics).
    pub served_by_engine: u64,
}

/// The operations helper modules use on the data center's shared state.
///
/// A handle belongs to one node (or to an observer such as the front load balancer, which
/// has no record of its own). All methods take `&self`: the node's publisher, helper and
/// request threads share one handle.
pub trait SharedState: Send + Sync {
    /// Number of node slots.
    fn slots(&self) -> usize;

    /// Publishes this node's load record in its own memory (version and MAC added here).
    fn publish_load(&self, record: &LoadRecord) -> Result<(), StateError>;

    /// One copy of `node`'s load record, read without involving that node; judged by a
    /// [`crate::load::RecordValidator`].
    fn read_load(&self, node: NodeIndex) -> Result<[u64; SLOT_WORDS], StateError>;

    /// The role word.
    fn read_roles(&self) -> Result<RoleTable, StateError>;

    /// Replaces the role word with `new` if it holds `expected`.
    fn cas_roles(&self, expected: RoleTable, new: RoleTable) -> Result<CasOutcome, StateError>;

    /// Tells `to` about `table`, unless it already knows a newer one.
    fn announce(&self, to: NodeIndex, table: RoleTable) -> Result<(), StateError>;

    /// The newest table announced to this node (read locally).
    fn announced(&self) -> Result<RoleTable, StateError>;

    /// What this handle did so far.
    fn counters(&self) -> StateCounters;
}

/// `a` is a later epoch than `b`, in wrapping order.
pub fn epoch_after(a: u16, b: u16) -> bool {
    let d = a.wrapping_sub(b);
    d != 0 && d < 0x8000
}
