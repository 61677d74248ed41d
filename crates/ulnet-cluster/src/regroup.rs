//! Regroup: agreeing on the next view after a suspicion or a join.
//!
//! The stages of MSCS regroup (thesis §7.7.2), made safe as one agreement round per view
//! number (each view is chosen once, by a quorum of its predecessor, so every member
//! installs it identically):
//!
//! 1. **Activate / collect.** The proposer (the coordinator: the lowest-id member nobody
//!    suspects, or any member after `regroup_takeover`) sends `Prepare(base, ballot)` to
//!    the members of the base view. A member promises unless it promised a higher ballot,
//!    and sends with its promise its row of the connectivity matrix (the members it cannot
//!    hear) and any next view it already accepted. The joiners the proposer knows get the
//!    `Prepare` too and answer `JoinerAlive`: only joiners that answered this ballot can
//!    enter its view, so a node that asked to join and died (or a join request replayed
//!    by someone who recorded it) is never counted in a view it cannot answer for; a
//!    joiner that did not answer is forgotten until it asks again. Stage 1 ends when every
//!    member and joiner answered; or when every member answered and `regroup_min_wait`
//!    passed (joiners are not members: a dead one must not hold the regroup); or, outside
//!    cautious mode, when all members but one answered and `regroup_min_wait` passed (one
//!    failure); or after `regroup_max_wait`.
//! 2. **Closing.** The responders must hold a quorum of the base view (more than half;
//!    exactly half with at least two members and the tie-breaker; one of two with the
//!    witness). If a responder had accepted a next view earlier, that view is proposed
//!    again (it may already be chosen). Otherwise the members that cannot hear each other
//!    are pruned until the rest is fully connected, waiting `connectivity_wait` first for
//!    contradicting rows to clear (members probe those they suspect on `Prepare` and send
//!    a corrected row: hearsay fills in what the proposer cannot see itself).
//! 3. **Pruning.** `Accept(proposal)` goes to every base member; those pruned learn from
//!    the `Commit` that they are out and stop.
//! 4. **Install.** Once a quorum of the base view accepted, the view is chosen: the
//!    proposer installs it and sends `Commit` to every member old and new. Members that
//!    miss it learn it from the view number every datagram carries.
//!
//! A regroup that is overtaken by a higher ballot, or that fails, leaves the node in
//! **cautious mode**: the next regroup waits the full `regroup_max_wait` in stage 1.
//!
//! Quorum is lost, and the node stops acting as a member, when its own regroup cannot
//! gather a quorum, or when a reason to regroup (a suspicion, a joiner) stays unresolved
//! for `regroup_takeover + 2 × regroup_max_wait` (other nodes' regroups may be failing
//! without telling it: a member must not keep acting on a view it cannot confirm).

use crate::view::{MemberId, View};
use crate::wire::Ballot;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// One member's answer to `Prepare`.
#[derive(Clone, Debug)]
pub(crate) struct PromiseRow {
    pub accepted: Option<(Ballot, View)>,
    pub suspects: BTreeSet<MemberId>,
    /// The row's version (`Message::Promise::row`): a row never replaces a newer one.
    pub row: u32,
}

/// Where a regroup run by this node stands.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Collect,
    Accept { proposal: View, accepted: BTreeSet<MemberId>, since: Instant },
}

/// A regroup this node proposes.
#[derive(Clone, Debug)]
pub(crate) struct Regroup {
    pub base: View,
    pub ballot: Ballot,
    pub started: Instant,
    pub cautious: bool,
    pub phase: Phase,
    pub promises: BTreeMap<MemberId, PromiseRow>,
    /// Joiners that answered this ballot's `Prepare` (`JoinerAlive`): only they may enter
    /// its proposal.
    pub joiners_present: BTreeSet<MemberId>,
    /// When contradicting connectivity rows were first seen.
    pub conflict_since: Option<Instant>,
    pub next_send: Instant,
}

/// The highest-ballot next view any responder accepted (it must be proposed again).
pub(crate) fn highest_accepted(promises: &BTreeMap<MemberId, PromiseRow>, base: u64) -> Option<View> {
    promises
        .values()
        .filter_map(|p| p.accepted.as_ref())
        .filter(|(_, v)| v.id == base + 1)
        .max_by_key(|(b, _)| *b)
        .map(|(_, v)| v.clone())
}

/// Pairs of candidates where one cannot hear the other.
pub(crate) fn broken_links(
    candidates: &BTreeSet<MemberId>,
    promises: &BTreeMap<MemberId, PromiseRow>,
) -> Vec<(MemberId, MemberId)> {
    let mut links = Vec::new();
    for &i in candidates {
        let Some(row) = promises.get(&i) else { continue };
        for &k in row.suspects.iter().filter(|k| candidates.contains(k) && **k != i) {
            let pair = (i.min(k), i.max(k));
            if !links.contains(&pair) {
                links.push(pair);
            }
        }
    }
    links
}

/// Removes candidates until every remaining pair can hear each other: repeatedly the one
/// with the most broken links (ties: the higher id), never `keep` (the proposer, which
/// heard from every candidate).
pub(crate) fn prune_to_full_connectivity(
    candidates: &mut BTreeSet<MemberId>,
    promises: &BTreeMap<MemberId, PromiseRow>,
    keep: MemberId,
) -> Vec<MemberId> {
    let mut pruned = Vec::new();
    loop {
        let links = broken_links(candidates, promises);
        if links.is_empty() {
            return pruned;
        }
        let mut count: BTreeMap<MemberId, usize> = BTreeMap::new();
        for (a, b) in links {
            *count.entry(a).or_default() += 1;
            *count.entry(b).or_default() += 1;
        }
        let victim = count
            .iter()
            .filter(|(id, _)| **id != keep)
            .max_by_key(|(id, n)| (**n, **id))
            .map(|(id, _)| *id)
            .expect("a broken link has an end other than the proposer");
        candidates.remove(&victim);
        pruned.push(victim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(suspects: &[u64]) -> PromiseRow {
        PromiseRow { accepted: None, suspects: suspects.iter().map(|&i| MemberId(i)).collect(), row: 0 }
    }

    #[test]
    fn pruning_removes_the_node_that_cannot_hear_others() {
        // 4 cannot hear 2 and 3; 2 and 3 cannot hear 4.
        let promises: BTreeMap<_, _> = [(1, row(&[])), (2, row(&[4])), (3, row(&[4])), (4, row(&[2, 3]))]
            .into_iter()
            .map(|(i, r)| (MemberId(i), r))
            .collect();
        let mut c: BTreeSet<_> = (1..=4).map(MemberId).collect();
        let pruned = prune_to_full_connectivity(&mut c, &promises, MemberId(1));
        assert_eq!(pruned, vec![MemberId(4)]);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn the_proposer_is_never_pruned() {
        let promises: BTreeMap<_, _> =
            [(1, row(&[2])), (2, row(&[]))].into_iter().map(|(i, r)| (MemberId(i), r)).collect();
        let mut c: BTreeSet<_> = [MemberId(1), MemberId(2)].into_iter().collect();
        assert_eq!(prune_to_full_connectivity(&mut c, &promises, MemberId(1)), vec![MemberId(2)]);
    }
}
