//! The shared state the helper modules work on, behind a narrow interface.
//!
//! Every node keeps its own load record and an inbox word in its own memory; one role word
//! (the [`RoleTable`]) holds every node's role. The operations are the ones the thesis'
//! helpers needed from InfiniBand, and no more:
//!
//! | operation | thesis | here |
//! |---|---|---|
//! | [`SharedState::publish_load`] | write own record in local memory | seqlock write of the node's own slot |
//! | [`SharedState::read_load`] | RDMA READ of another node's record | one-sided copy of the slot |
//! | [`SharedState::read_roles`] | RDMA READ of the configuration | one-sided copy of the role word |
//! | [`SharedState::cas_roles`] | remote compare-and-swap on a node's status | compare-and-swap on the role word, returning the value found |
//! | [`SharedState::announce`] | the winner tells the other modules | write the new table into a node's inbox word (only forward in epoch) |
//! | [`SharedState::announced`] | a module learns the configuration | read own inbox word, locally |
//!
//! [`shm::ShmState`] implements it for the processes of one host, on a shared mapping with
//! real atomics. The implementation over ulnet remote memory (one-sided READ, remote CAS,
//! across hosts) plugs in behind the same trait.

pub mod shm;
mod slot;

pub use slot::Slot;

use crate::load::{LoadRecord, SLOT_WORDS};
use crate::role::{NodeIndex, RoleTable};

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
}

/// `a` is a later epoch than `b`, in wrapping order.
pub fn epoch_after(a: u16, b: u16) -> bool {
    let d = a.wrapping_sub(b);
    d != 0 && d < 0x8000
}
