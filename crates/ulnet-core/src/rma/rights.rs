//! Who may do what to a segment: node and segment identities, generations, rights per
//! importer and the notify mode.

use std::sync::atomic::{AtomicU64, Ordering};

/// Importers introduce themselves with their node id, and rights are granted per node.
pub use crate::node::NodeId;

/// Identifies a segment within its node: the index of its slot in the export table.
/// A slot is reused after its segment is dropped; the generation tells the two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(pub u32);

impl SegmentId {
    /// The well-known segment of the name service's clerk on every node.
    pub const NAME_TABLE: SegmentId = SegmentId(0);
}

/// The generation of an export. Every export and re-export on a node takes the next
/// generation from one counter, so a generation names one export for the life of the node;
/// requests carry it and the target refuses a mismatch. Never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u32);

/// Operations an importer may perform on a segment.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rights(u8);

impl Rights {
    /// No access at all.
    pub const NONE: Rights = Rights(0);
    /// `get`.
    pub const READ: Rights = Rights(1);
    /// `put`.
    pub const WRITE: Rights = Rights(2);
    /// `compare_and_swap` and `fetch_and_add`.
    pub const ATOMIC: Rights = Rights(4);
    /// Everything.
    pub const ALL: Rights = Rights(7);

    /// Whether every right in `other` is granted.
    #[inline]
    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits, as carried on the wire.
    #[inline]
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Rights from wire bits; unknown bits are dropped.
    #[inline]
    pub fn from_bits_truncate(bits: u8) -> Rights {
        Rights(bits & Rights::ALL.0)
    }

    /// Whether an importer with these rights may map the segment writable (writes and
    /// atomics both store into it).
    pub fn needs_writable_mapping(self) -> bool {
        self.contains(Rights::WRITE) || self.contains(Rights::ATOMIC)
    }
}

impl std::ops::BitOr for Rights {
    type Output = Rights;
    fn bitor(self, rhs: Rights) -> Rights {
        Rights(self.0 | rhs.0)
    }
}

impl std::fmt::Debug for Rights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = if self.contains(Rights::READ) { "r" } else { "-" };
        let w = if self.contains(Rights::WRITE) { "w" } else { "-" };
        let a = if self.contains(Rights::ATOMIC) { "a" } else { "-" };
        write!(f, "Rights({r}{w}{a})")
    }
}

/// When the owner of a segment hears about remote accesses (the paper's per-descriptor
/// notification flag). Data lands silently unless this says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NotifyMode {
    /// Never: remote accesses are pure data transfer.
    Never = 0,
    /// Every access that changes or reads the segment raises a notification.
    Always = 1,
    /// Only accesses whose request has the notify bit set.
    Conditional = 2,
}

impl NotifyMode {
    /// Whether an access with the request's notify bit `requested` raises a notification.
    #[inline]
    pub fn notifies(self, requested: bool) -> bool {
        match self {
            NotifyMode::Never => false,
            NotifyMode::Always => true,
            NotifyMode::Conditional => requested,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<NotifyMode> {
        match v {
            0 => Some(NotifyMode::Never),
            1 => Some(NotifyMode::Always),
            2 => Some(NotifyMode::Conditional),
            _ => None,
        }
    }
}

/// What an export gives its importers: rights for named nodes, and rights for every other
/// node. Built by the owner and handed to `Rma::export`.
///
/// ```
/// use ulnet_core::rma::{Access, NodeId, Rights};
/// let access = Access::none().grant(NodeId(2), Rights::READ | Rights::ATOMIC).others(Rights::READ);
/// assert!(access.rights_of(NodeId(2)).contains(Rights::ATOMIC));
/// assert_eq!(access.rights_of(NodeId(9)), Rights::READ);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    grants: Vec<(NodeId, Rights)>,
    others: Rights,
}

impl Access {
    /// Nobody may do anything until granted.
    pub fn none() -> Access {
        Access { grants: Vec::new(), others: Rights::NONE }
    }

    /// Every node gets `rights`.
    pub fn everyone(rights: Rights) -> Access {
        Access { grants: Vec::new(), others: rights }
    }

    /// `node` gets `rights` (replacing what it had).
    pub fn grant(mut self, node: NodeId, rights: Rights) -> Access {
        self.grants.retain(|(n, _)| *n != node);
        self.grants.push((node, rights));
        self
    }

    /// Nodes not granted by name get `rights`.
    pub fn others(mut self, rights: Rights) -> Access {
        self.others = rights;
        self
    }

    /// The rights of `node`.
    pub fn rights_of(&self, node: NodeId) -> Rights {
        self.grants.iter().find(|(n, _)| *n == node).map_or(self.others, |(_, r)| *r)
    }

    pub(crate) fn named(&self) -> &[(NodeId, Rights)] {
        &self.grants
    }

    pub(crate) fn other_rights(&self) -> Rights {
        self.others
    }
}

/// Most nodes granted by name in one segment. 16: a segment is shared with a handful of
/// named peers (a clerk, a load balancer's front ends); wider sharing uses `others`.
pub const GRANTS_MAX: usize = 16;

/// The rights table of one export-table slot, read by the engine on every request without
/// a lock: one word per named grant (`node << 8 | rights`, with bit 7 set for "in use"),
/// and one word for everyone else. The owner rewrites it only while the slot is not live,
/// or grant by grant (a request racing a change sees the old or the new rights of that
/// node, never a mixture).
pub(crate) struct GrantTable {
    named: [AtomicU64; GRANTS_MAX],
    others: AtomicU64,
}

const GRANT_IN_USE: u64 = 0x80;

impl GrantTable {
    pub(crate) fn new() -> Self {
        Self { named: std::array::from_fn(|_| AtomicU64::new(0)), others: AtomicU64::new(0) }
    }

    /// Replaces the whole table. Fails when more than [`GRANTS_MAX`] nodes are named.
    pub(crate) fn set(&self, access: &Access) -> Result<(), usize> {
        if access.named().len() > GRANTS_MAX {
            return Err(access.named().len());
        }
        for (i, slot) in self.named.iter().enumerate() {
            let word = access
                .named()
                .get(i)
                .map_or(0, |(node, r)| (u64::from(node.0) << 8) | GRANT_IN_USE | u64::from(r.bits()));
            slot.store(word, Ordering::Release);
        }
        self.others.store(u64::from(access.other_rights().bits()), Ordering::Release);
        Ok(())
    }

    /// The rights of `node`.
    #[inline]
    pub(crate) fn rights_of(&self, node: NodeId) -> Rights {
        for slot in &self.named {
            let w = slot.load(Ordering::Acquire);
            if w == 0 {
                break;
            }
            if (w >> 8) as u32 == node.0 {
                return Rights::from_bits_truncate(w as u8);
            }
        }
        Rights::from_bits_truncate(self.others.load(Ordering::Acquire) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_table_answers_like_access() {
        let access = Access::none()
            .grant(NodeId(0), Rights::ALL)
            .grant(NodeId(7), Rights::READ)
            .grant(NodeId(7), Rights::WRITE)
            .others(Rights::READ | Rights::ATOMIC);
        let t = GrantTable::new();
        t.set(&access).unwrap();
        for n in [0, 1, 7, u32::MAX] {
            assert_eq!(t.rights_of(NodeId(n)), access.rights_of(NodeId(n)), "node {n}");
        }
        assert_eq!(t.rights_of(NodeId(7)), Rights::WRITE, "a second grant replaces the first");
    }

    #[test]
    fn too_many_named_grants_are_refused() {
        let mut access = Access::none();
        for n in 0..=GRANTS_MAX as u32 {
            access = access.grant(NodeId(n), Rights::READ);
        }
        assert_eq!(GrantTable::new().set(&access), Err(GRANTS_MAX + 1));
    }

    #[test]
    fn notify_modes() {
        assert!(!NotifyMode::Never.notifies(true));
        assert!(NotifyMode::Always.notifies(false));
        assert!(NotifyMode::Conditional.notifies(true) && !NotifyMode::Conditional.notifies(false));
    }
}
