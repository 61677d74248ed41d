//! The gossip failure detector (Galaxy's accurate, slow level): heartbeat versions spread
//! epidemically, and a member whose version stopped rising is suspected.
//!
//! Each node increments its own version every time it sends heartbeats or gossip, and
//! every such datagram carries the sender's whole vector of versions. A receiver keeps the
//! highest version it has seen per member and the time it last rose; a member whose
//! version has not risen for [`crate::Config::gossip_fail_after`] is suspected. No
//! datagram is sent for detection alone, and every node decides on its own.

use crate::view::{MemberId, View};
use rand::seq::SliceRandom;
use rand::Rng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
struct Entry {
    version: u64,
    rose_at: Instant,
}

/// Versions and their freshness for the members of the current view.
#[derive(Debug)]
pub struct GossipDetector {
    me: MemberId,
    own_version: u64,
    entries: BTreeMap<MemberId, Entry>,
    fail_after: Duration,
    interval: Duration,
    fanout: usize,
    next_gossip: Option<Instant>,
}

impl GossipDetector {
    /// A detector for `me`, not yet in a view.
    pub fn new(me: MemberId, interval: Duration, fanout: usize) -> Self {
        Self {
            me,
            own_version: 0,
            entries: BTreeMap::new(),
            fail_after: Duration::MAX,
            interval,
            fanout,
            next_gossip: None,
        }
    }

    /// A view was installed: track its members (keeping versions of those that stay;
    /// new members get a full threshold of grace).
    pub fn reset(&mut self, now: Instant, view: &View, fail_after: Duration) {
        self.entries.retain(|id, _| view.contains(*id));
        for id in view.ids().filter(|&id| id != self.me) {
            self.entries.entry(id).or_insert(Entry { version: 0, rose_at: now });
        }
        self.fail_after = fail_after;
        self.next_gossip.get_or_insert(now + self.interval);
    }

    /// Stops tracking (the node left its view).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.next_gossip = None;
    }

    /// The vector to send: our own version first, then every tracked member's.
    pub fn digest(&self) -> Vec<(MemberId, u64)> {
        std::iter::once((self.me, self.own_version))
            .chain(self.entries.iter().map(|(id, e)| (*id, e.version)))
            .collect()
    }

    /// Our version goes up once per round of sending.
    pub fn bump(&mut self) {
        self.own_version += 1;
    }

    /// Merges a received vector: versions that rose mark their members alive now.
    pub fn merge(&mut self, now: Instant, digest: &[(MemberId, u64)]) {
        for (id, version) in digest {
            if let Some(e) = self.entries.get_mut(id) {
                if *version > e.version {
                    e.version = *version;
                    e.rose_at = now;
                }
            }
        }
    }

    /// A datagram came straight from `from`: as good as a risen version.
    pub fn heard(&mut self, now: Instant, from: MemberId) {
        if let Some(e) = self.entries.get_mut(&from) {
            e.rose_at = now;
        }
    }

    /// Members whose version has not risen for the threshold.
    pub fn suspects(&self, now: Instant, out: &mut Vec<MemberId>) {
        out.extend(
            self.entries
                .iter()
                .filter(|(_, e)| now.saturating_duration_since(e.rose_at) > self.fail_after)
                .map(|(id, _)| *id),
        );
    }

    /// When gossip is due, pushes `fanout` random members of `view` to `targets`.
    pub fn due_targets(&mut self, now: Instant, rng: &mut impl Rng, view: &View, targets: &mut Vec<MemberId>) {
        let Some(at) = self.next_gossip else { return };
        if now < at {
            return;
        }
        // Jitter of ±10% keeps nodes started together from gossiping in lockstep.
        let jitter = rng.gen_range(0.9..1.1);
        self.next_gossip = Some(now + self.interval.mul_f64(jitter));
        let others: Vec<MemberId> = view.ids().filter(|&id| id != self.me).collect();
        targets.extend(others.choose_multiple(rng, self.fanout.min(others.len())));
    }

    /// The next time gossip is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_gossip
    }

    /// When `id`'s version last rose (for status reports).
    pub fn last_rise(&self, id: MemberId) -> Option<Instant> {
        self.entries.get(&id).map(|e| e.rose_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Member;
    use rand::SeedableRng;

    fn view(n: u64) -> View {
        View::new(
            1,
            (1..=n)
                .map(|i| Member { id: MemberId(i), name: format!("{i}"), addr: ([127, 0, 0, 1], 1).into() })
                .collect(),
        )
    }

    #[test]
    fn a_member_whose_version_stops_rising_is_suspected() {
        let t0 = Instant::now();
        let mut d = GossipDetector::new(MemberId(1), Duration::from_millis(100), 1);
        d.reset(t0, &view(3), Duration::from_secs(1));
        d.merge(t0 + Duration::from_millis(900), &[(MemberId(2), 5), (MemberId(3), 0)]);
        let mut s = Vec::new();
        d.suspects(t0 + Duration::from_millis(1500), &mut s);
        assert_eq!(s, vec![MemberId(3)]);
    }

    #[test]
    fn gossip_goes_to_random_other_members() {
        let t0 = Instant::now();
        let mut d = GossipDetector::new(MemberId(1), Duration::from_millis(100), 2);
        d.reset(t0, &view(5), Duration::from_secs(1));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut targets = Vec::new();
        d.due_targets(t0, &mut rng, &view(5), &mut targets);
        assert!(targets.is_empty(), "not due yet");
        d.due_targets(t0 + Duration::from_millis(100), &mut rng, &view(5), &mut targets);
        assert_eq!(targets.len(), 2);
        assert!(!targets.contains(&MemberId(1)));
    }
}
