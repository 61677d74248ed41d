//! Rate limits of what a node does for datagrams it did not ask for: answers to peers
//! ([`PerPeer`]) and log lines about dropped datagrams ([`DropLog`]). Anything may arrive
//! at any rate from anywhere (a replay, a flood of garbage); neither the answers nor the
//! log may grow with it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One answer per peer address per period.
#[derive(Debug)]
pub(crate) struct PerPeer {
    period: Duration,
    /// When each address was last answered.
    last: HashMap<SocketAddr, Instant>,
    /// Most addresses remembered; when full the table is cleared (each address then gets
    /// at most one more answer early, and the table is bounded whatever the sources).
    peers_max: usize,
}

impl PerPeer {
    pub fn new(period: Duration, peers_max: usize) -> Self {
        Self { period, last: HashMap::new(), peers_max }
    }

    /// Whether `addr` may be answered now (and if so, it was).
    pub fn allow(&mut self, now: Instant, addr: SocketAddr) -> bool {
        if self.last.len() >= self.peers_max {
            self.last.clear();
        }
        match self.last.get(&addr) {
            Some(t) if now.saturating_duration_since(*t) < self.period => false,
            _ => {
                self.last.insert(addr, now);
                true
            }
        }
    }
}

/// Why a datagram was dropped, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DropClass {
    /// It does not authenticate with the cluster secret.
    Auth,
    /// Bad length, magic, version, kind or body.
    Malformed,
    /// Its counter was received already, or is older than the replay window.
    Replayed,
    /// Its sender's incarnation is older than one already heard from that sender.
    OldIncarnation,
    /// It was not made for this node's current incarnation (challenged).
    Unconfirmed,
}

const CLASSES: usize = 5;

impl DropClass {
    fn index(self) -> usize {
        self as usize
    }
}

/// At most one log line per drop class per interval, saying how many datagrams of the
/// class were dropped since the previous line and where the last came from: a flood of
/// replays or garbage costs a line every `interval`, not one per datagram.
#[derive(Debug)]
pub(crate) struct DropLog {
    interval: Duration,
    /// Per class: when its last line was written, and drops since.
    classes: [(Option<Instant>, u64); CLASSES],
}

impl DropLog {
    pub fn new(interval: Duration) -> Self {
        Self { interval, classes: [(None, 0); CLASSES] }
    }

    /// A datagram from `from` was dropped for `class` (`detail`: what it was, or what was
    /// wrong with it).
    pub fn dropped(&mut self, now: Instant, class: DropClass, from: SocketAddr, detail: &dyn std::fmt::Display) {
        let (last_line, since) = &mut self.classes[class.index()];
        *since += 1;
        if last_line.is_some_and(|t| now.saturating_duration_since(t) < self.interval) {
            return;
        }
        let n = std::mem::take(since);
        *last_line = Some(now);
        match class {
            DropClass::Auth => tracing::warn!(
                dropped = n, last_from = %from, last = %detail,
                "dropped membership datagrams that do not authenticate (another cluster secret, or altered on the way)"
            ),
            DropClass::Malformed => {
                tracing::warn!(dropped = n, last_from = %from, last = %detail, "dropped malformed membership datagrams")
            }
            DropClass::Replayed => tracing::warn!(
                dropped = n, last_from = %from, last = %detail,
                "dropped replayed membership datagrams (received already, or older than the replay window)"
            ),
            DropClass::OldIncarnation => tracing::warn!(
                dropped = n, last_from = %from, last = %detail,
                "dropped membership datagrams of an earlier process of their sender (restarted since, or replayed)"
            ),
            DropClass::Unconfirmed => tracing::info!(
                dropped = n, last_from = %from, last = %detail,
                "challenged membership datagrams not made for this process (sent before it started or to a former one, or replayed)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_answer_per_peer_per_period() {
        let t0 = Instant::now();
        let a = SocketAddr::from(([127, 0, 0, 1], 1));
        let b = SocketAddr::from(([127, 0, 0, 1], 2));
        let mut p = PerPeer::new(Duration::from_millis(10), 8);
        assert!(p.allow(t0, a));
        assert!(!p.allow(t0 + Duration::from_millis(9), a));
        assert!(p.allow(t0, b), "each peer has its own budget");
        assert!(p.allow(t0 + Duration::from_millis(10), a));
    }

    #[test]
    fn the_table_stays_bounded() {
        let t0 = Instant::now();
        let mut p = PerPeer::new(Duration::from_secs(1), 4);
        for port in 0..100 {
            assert!(p.allow(t0, SocketAddr::from(([127, 0, 0, 1], port))));
            assert!(p.last.len() <= 4);
        }
    }

    #[test]
    fn a_class_logs_once_per_interval_and_counts_what_it_skipped() {
        let t0 = Instant::now();
        let from = SocketAddr::from(([127, 0, 0, 1], 1));
        let mut log = DropLog::new(Duration::from_secs(10));
        log.dropped(t0, DropClass::Replayed, from, &"");
        assert_eq!(log.classes[DropClass::Replayed.index()], (Some(t0), 0), "the first drop is logged at once");
        for i in 1..=50 {
            log.dropped(t0 + Duration::from_millis(i), DropClass::Replayed, from, &"");
        }
        assert_eq!(log.classes[DropClass::Replayed.index()], (Some(t0), 50), "within the interval: counted only");
        log.dropped(t0, DropClass::Auth, from, &"");
        assert_eq!(log.classes[DropClass::Auth.index()].0, Some(t0), "classes are limited apart");
        let later = t0 + Duration::from_secs(10);
        log.dropped(later, DropClass::Replayed, from, &"");
        assert_eq!(log.classes[DropClass::Replayed.index()], (Some(later), 0), "the next line covers the 51 since");
    }
}
