//! Members and views: the agreed answer to "who is in the cluster now".

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Identifies one incarnation of a node: a restarted node gets a new id, so a stale
/// incarnation can never be mistaken for the new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MemberId(pub u64);

impl std::fmt::Display for MemberId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A node: its incarnation, its name, and the address of its membership socket (UDP) and
/// control plane (TCP, same address).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    /// This incarnation's id.
    pub id: MemberId,
    /// The operator's name for the node (`--name`); at most [`NAME_MAX`] bytes.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// Longest member name, in bytes (it travels in every view).
pub const NAME_MAX: usize = 64;

/// An installed view: a numbered, ordered member list that every member of it installed
/// identically. View `n + 1` was chosen by a quorum of view `n`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The view number; each regroup or join that changes the members makes the next one.
    pub id: u64,
    /// The members, ordered by id.
    pub members: Vec<Member>,
    /// The member whose side survives a split into two equal halves (the lowest id).
    pub tiebreaker: MemberId,
}

impl View {
    /// A view of the given members (sorted here); the tie-breaker is the lowest id.
    pub fn new(id: u64, mut members: Vec<Member>) -> Self {
        assert!(!members.is_empty(), "a view has at least one member");
        members.sort_by_key(|m| m.id);
        members.dedup_by_key(|m| m.id);
        let tiebreaker = members[0].id;
        Self { id, members, tiebreaker }
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: MemberId) -> bool {
        self.members.binary_search_by_key(&id, |m| m.id).is_ok()
    }

    /// The member with this id.
    pub fn member(&self, id: MemberId) -> Option<&Member> {
        self.members.binary_search_by_key(&id, |m| m.id).ok().map(|i| &self.members[i])
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true for a valid view (kept for the `len` convention).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members.iter().map(|m| m.id)
    }

    /// Whether `survivors` may continue from this view (the quorum rules of MSCS regroup):
    /// more than half of its members; or exactly half, at least two, including the
    /// tie-breaker; or, for a two-member view, the one survivor that holds the quorum
    /// resource (`witness`).
    pub fn is_quorum(&self, survivors: &[MemberId], witness: bool) -> bool {
        let n = self.len();
        let s = survivors.iter().filter(|id| self.contains(**id)).count();
        if 2 * s > n {
            return true;
        }
        if 2 * s == n && s >= 2 && survivors.contains(&self.tiebreaker) {
            return true;
        }
        n == 2 && s == 1 && witness
    }

    /// Whether `survivors` would need the quorum resource: a two-member view with one left.
    pub fn needs_witness(&self, survivors: &[MemberId]) -> bool {
        self.len() == 2 && survivors.iter().filter(|id| self.contains(**id)).count() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(n: u64) -> View {
        View::new(
            1,
            (0..n)
                .map(|i| Member { id: MemberId(10 + i), name: format!("n{i}"), addr: ([127, 0, 0, 1], 1).into() })
                .collect(),
        )
    }

    #[test]
    fn majority_is_quorum() {
        let v = view(5);
        assert!(v.is_quorum(&[MemberId(10), MemberId(11), MemberId(12)], false));
        assert!(!v.is_quorum(&[MemberId(13), MemberId(14)], false));
    }

    #[test]
    fn exact_half_needs_the_tiebreaker_and_two_members() {
        let v = view(4);
        assert!(v.is_quorum(&[MemberId(10), MemberId(13)], false));
        assert!(!v.is_quorum(&[MemberId(11), MemberId(12)], false));
        let v2 = view(2);
        assert!(!v2.is_quorum(&[MemberId(10)], false), "one of two is half but fewer than two members");
    }

    #[test]
    fn two_node_survivor_needs_the_witness() {
        let v = view(2);
        assert!(v.needs_witness(&[MemberId(11)]));
        assert!(v.is_quorum(&[MemberId(11)], true));
        assert!(!v.is_quorum(&[MemberId(11)], false));
    }

    #[test]
    fn strangers_do_not_count() {
        let v = view(3);
        assert!(!v.is_quorum(&[MemberId(10), MemberId(99), MemberId(98)], false));
    }
}
