//! Rejoining after removal: connectivity first.
//!
//! A node that learns it was left out of a newer view while it was alive was pruned for a
//! broken link, or excluded during a pause. If it asked to join again at once, a node
//! pruned for a link that is still broken would be admitted by the next regroup (a join
//! checks nothing but the sponsor's path) and pruned again a detection period later: a
//! view change every ~0.6 s with `local()` for as long as the link stays broken.
//!
//! So it first probes every member of the newest view it knows, and asks to join only
//! once each has answered within the buddy detector's threshold — the time in which a
//! watcher that cannot hear it would suspect it. A probe answered proves the link both
//! ways. Views newer than the one it knows replace it (members that left since need not
//! answer). A node that never had a view (a first join) knows no members and is not held.

use crate::view::{Member, MemberId, View};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The probes of a node waiting to rejoin.
#[derive(Debug)]
pub(crate) struct RejoinCheck {
    /// The newest view known to exclude this node.
    view: View,
    /// When each of its members last answered a probe.
    answered: BTreeMap<MemberId, Instant>,
    /// How recent every answer must be.
    fresh_for: Duration,
}

impl RejoinCheck {
    pub fn new(view: View, fresh_for: Duration) -> Self {
        Self { view, answered: BTreeMap::new(), fresh_for }
    }

    /// The newest view known to exclude this node.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// A newer view that also excludes this node replaces the one known.
    pub fn newer_view(&mut self, view: View) {
        if view.id > self.view.id {
            self.answered.retain(|id, _| view.contains(*id));
            self.view = view;
        }
    }

    /// `from` answered a probe.
    pub fn answered(&mut self, now: Instant, from: MemberId) {
        if self.view.contains(from) {
            self.answered.insert(from, now);
        }
    }

    fn fresh(&self, now: Instant, id: MemberId, within: Duration) -> bool {
        self.answered.get(&id).is_some_and(|t| now.saturating_duration_since(*t) < within)
    }

    /// Members to probe now: those without an answer in the last half of the window, so
    /// that answers are renewed before they expire.
    pub fn due_probes(&self, now: Instant, me: MemberId) -> Vec<Member> {
        let within = self.fresh_for / 2;
        self.view.members.iter().filter(|m| m.id != me && !self.fresh(now, m.id, within)).cloned().collect()
    }

    /// Whether every member answered recently: joining again will not be undone by the
    /// next detection period.
    pub fn connected(&self, now: Instant, me: MemberId) -> bool {
        self.view.ids().filter(|id| *id != me).all(|id| self.fresh(now, id, self.fresh_for))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, members: &[u64]) -> View {
        View::new(
            id,
            members
                .iter()
                .map(|&i| Member { id: MemberId(i), name: format!("n{i}"), addr: ([127, 0, 0, 1], 7000).into() })
                .collect(),
        )
    }

    #[test]
    fn connected_only_when_every_member_answered_recently() {
        let t0 = Instant::now();
        let fresh = Duration::from_millis(450);
        let mut c = RejoinCheck::new(view(4, &[1, 2, 3]), fresh);
        assert!(!c.connected(t0, MemberId(9)));
        assert_eq!(c.due_probes(t0, MemberId(9)).len(), 3);
        c.answered(t0, MemberId(1));
        c.answered(t0, MemberId(2));
        c.answered(t0, MemberId(7)); // not a member: ignored
        assert!(!c.connected(t0, MemberId(9)));
        assert_eq!(c.due_probes(t0, MemberId(9)).iter().map(|m| m.id).collect::<Vec<_>>(), vec![MemberId(3)]);
        c.answered(t0 + Duration::from_millis(100), MemberId(3));
        assert!(c.connected(t0 + Duration::from_millis(200), MemberId(9)));
        // Answers expire: old ones are probed again, and too old ones no longer count.
        assert_eq!(c.due_probes(t0 + Duration::from_millis(250), MemberId(9)).len(), 2);
        assert!(!c.connected(t0 + fresh, MemberId(9)));
    }

    #[test]
    fn a_newer_view_drops_members_that_left() {
        let t0 = Instant::now();
        let mut c = RejoinCheck::new(view(4, &[1, 2, 3]), Duration::from_secs(1));
        c.answered(t0, MemberId(1));
        c.answered(t0, MemberId(2));
        assert!(!c.connected(t0, MemberId(9)), "3 never answered (crashed)");
        c.newer_view(view(5, &[1, 2]));
        assert!(c.connected(t0, MemberId(9)));
        c.newer_view(view(3, &[1, 2, 3]));
        assert_eq!(c.view().id, 5, "older views are ignored");
    }
}
