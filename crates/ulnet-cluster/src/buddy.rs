//! The buddy failure detector (Galaxy's fast level), and the trait through which fast
//! detectors plug into the membership.
//!
//! Members sit on a ring ordered by id. Each node sends a heartbeat to its `k`
//! successors every period, so each node is watched by its `k` predecessors; a watcher
//! that hears nothing (no datagram of any kind) from a buddy for `missed_max` periods
//! suspects it. Which nodes to track comes from the membership's view, as in Galaxy.

use crate::view::{MemberId, View};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A failure detector level that runs beside the gossip detector. It is told about the
/// view and about every authenticated datagram, names the members it wants heartbeats
/// sent to, and reports the members it suspects. Environmental detectors (link state,
/// ICMP errors, interconnect status) plug in the same way.
pub trait FastDetector: Send + std::fmt::Debug {
    /// The level's name, for logs and counters.
    fn name(&self) -> &'static str;
    /// A view was installed.
    fn reset(&mut self, now: Instant, view: &View);
    /// The node left its view.
    fn clear(&mut self);
    /// An authenticated datagram came from `from`.
    fn heard(&mut self, now: Instant, from: MemberId);
    /// When heartbeats are due, pushes the members to send them to.
    fn due_targets(&mut self, now: Instant, targets: &mut Vec<MemberId>);
    /// Pushes the members suspected now.
    fn suspects(&self, now: Instant, out: &mut Vec<MemberId>);
    /// When the detector next needs [`FastDetector::due_targets`] or may change its
    /// suspicions.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// Heartbeats to `k` ring successors; suspicion of a ring predecessor that fell silent.
#[derive(Debug)]
pub struct BuddyDetector {
    me: MemberId,
    k: usize,
    interval: Duration,
    fail_after: Duration,
    /// Members we heartbeat.
    successors: Vec<MemberId>,
    /// Members that heartbeat us, with when we last heard them.
    watched: BTreeMap<MemberId, Instant>,
    next_heartbeat: Option<Instant>,
    /// The last time the membership asked for targets: silences that expired before it
    /// were already reported, so they are not timeouts any more.
    last_tick: Option<Instant>,
}

impl BuddyDetector {
    /// `k` buddies per node, heartbeats every `interval`, suspicion after `missed_max`
    /// silent periods.
    pub fn new(me: MemberId, k: usize, interval: Duration, missed_max: u32) -> Self {
        Self {
            me,
            k,
            interval,
            fail_after: interval * missed_max,
            successors: Vec::new(),
            watched: BTreeMap::new(),
            next_heartbeat: None,
            last_tick: None,
        }
    }

    /// The members that watch `me` in `view` (its successors), for tests and status.
    pub fn successors(&self) -> &[MemberId] {
        &self.successors
    }
}

impl FastDetector for BuddyDetector {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn reset(&mut self, now: Instant, view: &View) {
        let ids: Vec<MemberId> = view.ids().collect();
        let n = ids.len();
        let Some(pos) = ids.iter().position(|&id| id == self.me) else {
            self.clear();
            return;
        };
        let k = self.k.min(n - 1);
        self.successors = (1..=k).map(|i| ids[(pos + i) % n]).collect();
        let predecessors: Vec<MemberId> = (1..=k).map(|i| ids[(pos + n - i) % n]).collect();
        // Buddies we already watched keep their time; new ones get a full period of grace.
        let old = std::mem::take(&mut self.watched);
        for p in predecessors {
            self.watched.insert(p, old.get(&p).copied().unwrap_or(now));
        }
        self.next_heartbeat.get_or_insert(now);
    }

    fn clear(&mut self) {
        self.successors.clear();
        self.watched.clear();
        self.next_heartbeat = None;
    }

    fn heard(&mut self, now: Instant, from: MemberId) {
        if let Some(t) = self.watched.get_mut(&from) {
            *t = now;
        }
    }

    fn due_targets(&mut self, now: Instant, targets: &mut Vec<MemberId>) {
        self.last_tick = Some(now);
        let Some(at) = self.next_heartbeat else { return };
        if now < at {
            return;
        }
        // Keep the period even when a tick came late, without bursts to catch up.
        let mut next = at + self.interval;
        if next <= now {
            next = now + self.interval;
        }
        self.next_heartbeat = Some(next);
        targets.extend_from_slice(&self.successors);
    }

    fn suspects(&self, now: Instant, out: &mut Vec<MemberId>) {
        out.extend(
            self.watched
                .iter()
                .filter(|(_, t)| now.saturating_duration_since(**t) > self.fail_after)
                .map(|(id, _)| *id),
        );
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let silence = self
            .watched
            .values()
            .map(|t| *t + self.fail_after + Duration::from_millis(1))
            .filter(|expiry| self.last_tick.is_none_or(|tick| *expiry > tick))
            .min();
        match (self.next_heartbeat, silence) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Member;

    fn view(ids: &[u64]) -> View {
        View::new(
            1,
            ids.iter()
                .map(|&i| Member { id: MemberId(i), name: format!("{i}"), addr: ([127, 0, 0, 1], 1).into() })
                .collect(),
        )
    }

    #[test]
    fn heartbeats_go_to_ring_successors_and_wrap() {
        let t0 = Instant::now();
        let mut d = BuddyDetector::new(MemberId(40), 2, Duration::from_millis(100), 3);
        d.reset(t0, &view(&[10, 20, 30, 40]));
        let mut t = Vec::new();
        d.due_targets(t0, &mut t);
        assert_eq!(t, vec![MemberId(10), MemberId(20)]);
    }

    #[test]
    fn a_silent_predecessor_is_suspected_after_missed_max_periods() {
        let t0 = Instant::now();
        let mut d = BuddyDetector::new(MemberId(30), 2, Duration::from_millis(100), 3);
        d.reset(t0, &view(&[10, 20, 30, 40]));
        d.heard(t0 + Duration::from_millis(250), MemberId(20));
        let mut s = Vec::new();
        d.suspects(t0 + Duration::from_millis(350), &mut s);
        assert_eq!(s, vec![MemberId(10)]);
    }

    #[test]
    fn two_members_watch_each_other_once() {
        let t0 = Instant::now();
        let mut d = BuddyDetector::new(MemberId(1), 2, Duration::from_millis(100), 3);
        d.reset(t0, &view(&[1, 2]));
        assert_eq!(d.successors(), &[MemberId(2)]);
    }
}
