//! Where a position's time goes, measured by the machine itself from the `now` of its
//! inputs: at the locker, grant → commit (and the arrival of the acknowledgements in
//! between), commit → next grant (the senders' round trip and the grant hold), and at
//! every member, an entry's arrival → its acknowledgement (the fsync and the wait for the
//! host's next turn). Bounded: one record per uncommitted position, fixed histograms.

use super::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

/// Upper bounds of the histogram buckets, in microseconds (the last bucket is open).
const BUCKETS_US: [u64; 13] =
    [250, 500, 1_000, 1_500, 2_000, 3_000, 4_000, 6_000, 8_000, 10_000, 12_000, 16_000, 25_000];

/// Most entries awaiting their acknowledgement that are timed at once.
const ARRIVED_MAX: usize = 4096;

/// Counts of durations per bucket of `BUCKETS_US`, and their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; BUCKETS_US.len() + 1],
    sum_us: u64,
}

impl Histogram {
    fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let i = BUCKETS_US.iter().position(|&b| us < b).unwrap_or(BUCKETS_US.len());
        self.counts[i] += 1;
        self.sum_us += us;
    }

    /// Durations recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their mean (zero without any).
    pub fn mean(&self) -> Duration {
        Duration::from_micros(self.sum_us.checked_div(self.count()).unwrap_or(0))
    }
}

impl fmt::Display for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n={} mean={:.2}ms [", self.count(), self.mean().as_secs_f64() * 1e3)?;
        for (i, c) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            match BUCKETS_US.get(i) {
                Some(b) => write!(f, " <{}:{c}", *b as f64 / 1e3)?,
                None => write!(f, " >={}:{c}", BUCKETS_US[BUCKETS_US.len() - 1] as f64 / 1e3)?,
            }
        }
        write!(f, " ]")
    }
}

/// The histograms, as [`crate::gup::Gup::timing`] reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// Locker: grant of a position → its commit.
    pub commit: Histogram,
    /// Locker: grant → the first acknowledgement of another member.
    pub first_ack: Histogram,
    /// Locker: grant → the acknowledgement that completed the quorum.
    pub quorum_ack: Histogram,
    /// Locker: commit of a position → grant of the next (with one position in flight,
    /// the time the log stands still).
    pub gap: Histogram,
    /// Locker: a combined position's commit → the next lock request of each of its senders
    /// (the sender's and its client's round trip).
    pub sender_return: Histogram,
    /// Locker: when queued requests could be granted → when they were (the grant hold).
    pub hold: Histogram,
    /// Any member: an entry's arrival → its acknowledgement leaving.
    pub ack_delay: Histogram,
    /// Sender: a combined entry's arrival (its grant) → the entry applied here.
    pub own_apply: Histogram,
    /// Sender: combined entries of mine that arrived while my log had a hole below them
    /// (positions I was owed): I can apply them only once the hole is filled.
    pub own_over_hole: u64,
    /// Locker: positions whose quorum was completed by a member that got the entry only
    /// with a later delivery of owed positions.
    pub quorum_by_owed: u64,
}

/// What the machine keeps to fill [`Timing`].
#[derive(Default)]
pub(super) struct TimingState {
    pub(super) timing: Timing,
    /// Uncommitted positions granted here: when, and acknowledgements from others so far.
    granted: BTreeMap<u64, (Instant, u32)>,
    last_commit: Option<Instant>,
    /// Senders of committed combined positions not yet back with a request.
    notified: HashMap<NodeId, Instant>,
    /// Entries received and not yet acknowledged here.
    arrived: BTreeMap<u64, Instant>,
}

impl TimingState {
    pub(super) fn granted(&mut self, now: Instant, seq: u64, grantable_since: Option<Instant>) {
        if let Some(g) = self.last_commit.filter(|_| self.granted.is_empty()) {
            self.timing.gap.record(now.saturating_duration_since(g));
        }
        if let Some(since) = grantable_since {
            self.timing.hold.record(now.saturating_duration_since(since));
        }
        self.granted.insert(seq, (now, 0));
    }

    /// A member acknowledged positions `(old, upto]`.
    pub(super) fn acked(&mut self, now: Instant, old: u64, upto: u64) {
        for (_, (at, acks)) in self.granted.range_mut(old + 1..=upto) {
            if *acks == 0 {
                self.timing.first_ack.record(now.saturating_duration_since(*at));
            }
            *acks += 1;
        }
    }

    /// The commit reached `commit` at `now`; `from_ack`: an acknowledgement moved it, and
    /// `by_owed`: that acknowledgement came from a member outside the eager set.
    pub(super) fn committed(&mut self, now: Instant, commit: u64, from_ack: bool, by_owed: bool) {
        let rest = self.granted.split_off(&(commit + 1));
        let done = std::mem::replace(&mut self.granted, rest);
        if done.is_empty() {
            return;
        }
        for (at, _) in done.into_values() {
            self.timing.commit.record(now.saturating_duration_since(at));
            if from_ack {
                self.timing.quorum_ack.record(now.saturating_duration_since(at));
            }
        }
        if by_owed {
            self.timing.quorum_by_owed += 1;
        }
        self.last_commit = Some(now);
    }

    pub(super) fn notified(&mut self, now: Instant, to: NodeId) {
        self.notified.insert(to, now);
    }

    pub(super) fn requested(&mut self, now: Instant, from: NodeId) {
        if let Some(at) = self.notified.remove(&from) {
            self.timing.sender_return.record(now.saturating_duration_since(at));
        }
    }

    pub(super) fn own_applied(&mut self, now: Instant, granted_at: Instant) {
        self.timing.own_apply.record(now.saturating_duration_since(granted_at));
    }

    pub(super) fn arrived(&mut self, now: Instant, seq: u64) {
        // A member with a long hole acknowledges nothing until it is repaired: keep the
        // record bounded meanwhile (what is left out is only not measured).
        if self.arrived.len() < ARRIVED_MAX {
            self.arrived.entry(seq).or_insert(now);
        }
    }

    pub(super) fn acknowledged(&mut self, now: Instant, upto: u64) {
        let rest = self.arrived.split_off(&(upto + 1));
        for at in std::mem::replace(&mut self.arrived, rest).into_values() {
            self.timing.ack_delay.record(now.saturating_duration_since(at));
        }
    }

    /// Forgets what a new epoch makes meaningless.
    pub(super) fn reset(&mut self) {
        self.granted.clear();
        self.notified.clear();
        self.arrived.clear();
        self.last_commit = None;
    }
}
