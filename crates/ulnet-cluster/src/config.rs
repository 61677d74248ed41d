//! Settings of the membership protocol, with named profiles (STYLE §10, after memberlist's
//! `config.go`). Every setting says what it does, what it costs, and why its default is
//! what it is.
//!
//! Two failure detectors run as levels (Galaxy, thesis §8.5.1):
//!
//! * the **gossip detector** (accurate, slow): every heartbeat carries the sender's vector
//!   of heartbeat versions, and each node also sends it to `gossip_fanout` random members
//!   every `gossip_interval`; a member whose version has not risen for
//!   [`Config::gossip_fail_after`] is suspected. Its threshold grows with `log2(n)`, the
//!   number of rounds an epidemic needs to reach `n` members.
//! * the **buddy detector** (fast): each node sends a heartbeat to its `buddies`
//!   successors on the ring of member ids every `heartbeat_interval`; a successor that
//!   misses `buddy_missed_max` in a row suspects it ([`Config::buddy_fail_after`]).
//!
//! Membership traffic per node in steady state is therefore
//! `buddies / heartbeat_interval + gossip_fanout / gossip_interval` datagrams per second,
//! whatever the size of the cluster ([`Config::packets_per_second`]): no all-to-all
//! heartbeats (the MSCS cost the thesis measured: 800 datagrams/s at 32 nodes).

use std::time::Duration;

/// Settings of a [`crate::Membership`].
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Period of buddy heartbeats. Shorter detects faster and costs `buddies` datagrams
    /// per period per node.
    pub heartbeat_interval: Duration,
    /// Successors on the ring each node heartbeats (so each node is watched by this many).
    /// Two: a single watcher that dies with its buddy would leave the failure to the slow
    /// gossip level.
    pub buddies: usize,
    /// Consecutive heartbeats a watcher may miss before it suspects. With loss `p` a live
    /// buddy is falsely suspected with probability `p^buddy_missed_max` per period; a
    /// false suspicion costs one regroup that finds everybody and changes nothing.
    pub buddy_missed_max: u32,
    /// Distinct reporters (the local detectors count as one) needed before a suspicion
    /// starts a regroup.
    pub suspicions_needed: usize,
    /// Period of gossip to random members.
    pub gossip_interval: Duration,
    /// Random members gossiped to per period.
    pub gossip_fanout: usize,
    /// Multiplier of `log2(n + 1)` gossip rounds in the gossip detector's threshold.
    pub gossip_rounds_factor: u32,
    /// Rounds added to it, for loss and scheduling noise.
    pub gossip_slack_rounds: u32,
    /// Regroup: how often unanswered regroup messages are sent again (only to the members
    /// that have not answered). The stage-1 shortcut for a single failure waits
    /// `regroup_min_wait`, i.e. `regroup_min_wait / regroup_retransmit` tries: ten keep a
    /// live member's chance of missing all of them at 5% loss below 10^-10.
    pub regroup_retransmit: Duration,
    /// Regroup stage 1: with all but one member answering, how long to wait for the last
    /// (MSCS: 2.4 s). Any suspected member was already silent for the detector's time.
    pub regroup_min_wait: Duration,
    /// Regroup stage 1: the longest wait for members that do not answer, and the wait of
    /// every stage in cautious mode (MSCS: 9.6 s).
    pub regroup_max_wait: Duration,
    /// Regroup stage 2: how long the deciding node waits for contradicting connectivity
    /// reports (a member suspects another that answered) to clear before it prunes.
    pub connectivity_wait: Duration,
    /// How long a node with a reason to regroup (a suspicion, a joiner) waits for the
    /// coordinator to act before it runs the regroup itself.
    pub regroup_takeover: Duration,
    /// How often a joining node asks its seeds again.
    pub join_retry: Duration,
    /// Most members in a view (views travel whole in one datagram).
    pub members_max: usize,
}

impl Config {
    /// One host or one rack, idle machines: sub-second failure handling. A crashed node
    /// is suspected after 3 missed 150 ms heartbeats (450–600 ms) and excluded after a
    /// 100 ms stage-1 wait; ≈ 14.3 datagrams per node per second at any size.
    pub fn local() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(150),
            buddies: 2,
            buddy_missed_max: 3,
            suspicions_needed: 1,
            gossip_interval: Duration::from_millis(1000),
            gossip_fanout: 1,
            gossip_rounds_factor: 2,
            gossip_slack_rounds: 3,
            regroup_retransmit: Duration::from_millis(10),
            regroup_min_wait: Duration::from_millis(100),
            regroup_max_wait: Duration::from_millis(500),
            connectivity_wait: Duration::from_millis(150),
            regroup_takeover: Duration::from_millis(900),
            join_retry: Duration::from_millis(100),
            members_max: 256,
        }
    }

    /// A data-center LAN with loaded machines, comparable to memberlist's
    /// `DefaultLANConfig` (1 s probes, 500 ms probe timeout): heartbeats every 500 ms,
    /// suspicion after 4 missed (2–2.5 s), a 500 ms stage-1 wait. 4.5 datagrams/s/node.
    pub fn lan() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(500),
            buddies: 2,
            buddy_missed_max: 4,
            suspicions_needed: 1,
            gossip_interval: Duration::from_millis(2000),
            gossip_fanout: 1,
            gossip_rounds_factor: 2,
            gossip_slack_rounds: 3,
            regroup_retransmit: Duration::from_millis(50),
            regroup_min_wait: Duration::from_millis(500),
            regroup_max_wait: Duration::from_millis(2500),
            connectivity_wait: Duration::from_millis(500),
            regroup_takeover: Duration::from_millis(4000),
            join_retry: Duration::from_millis(300),
            members_max: 256,
        }
    }

    /// Across sites: long, lossy paths and pauses of seconds. Heartbeats every second,
    /// suspicion after 6 missed, the MSCS-like 2.5 s / 10 s regroup waits.
    pub fn wan() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(1000),
            buddies: 2,
            buddy_missed_max: 6,
            suspicions_needed: 1,
            gossip_interval: Duration::from_millis(4000),
            gossip_fanout: 1,
            gossip_rounds_factor: 2,
            gossip_slack_rounds: 4,
            regroup_retransmit: Duration::from_millis(250),
            regroup_min_wait: Duration::from_millis(2500),
            regroup_max_wait: Duration::from_millis(10_000),
            connectivity_wait: Duration::from_millis(2000),
            regroup_takeover: Duration::from_millis(15_000),
            join_retry: Duration::from_millis(1000),
            members_max: 256,
        }
    }

    /// The simulator's profile: `local()`'s timings, so what the seeded schedules test is
    /// what ships, with a smaller member limit (simulated clusters are small).
    pub fn sim() -> Self {
        Self { members_max: 64, ..Self::local() }
    }

    /// Looks a profile up by name (`local`, `lan`, `wan`, `sim`).
    pub fn profile(name: &str) -> Option<Self> {
        match name {
            "local" => Some(Self::local()),
            "lan" => Some(Self::lan()),
            "wan" => Some(Self::wan()),
            "sim" => Some(Self::sim()),
            _ => None,
        }
    }

    /// Times a member sends a changed connectivity row to the proposer, one per
    /// `regroup_retransmit`: enough to cover `connectivity_wait`, the time the proposer
    /// waits for corrections before it prunes (16 in `local`; at 5% loss all of them are
    /// lost once in 10^20 regroups, where three were lost once in 8,000).
    pub fn row_resends(&self) -> u32 {
        let periods = self.connectivity_wait.as_nanos() / self.regroup_retransmit.as_nanos().max(1);
        u32::try_from(periods).unwrap_or(u32::MAX).saturating_add(1)
    }

    /// The buddy detector's threshold: `heartbeat_interval × buddy_missed_max`.
    pub fn buddy_fail_after(&self) -> Duration {
        self.heartbeat_interval * self.buddy_missed_max
    }

    /// The gossip detector's threshold for a view of `n` members:
    /// `gossip_interval × (gossip_rounds_factor × ⌈log2(n + 1)⌉ + gossip_slack_rounds)`.
    /// A push epidemic reaches all `n` members in about `log2(n) + ln(n)` rounds; twice
    /// `log2` covers that with margin, and heartbeats to buddies carry the same vector, so
    /// versions usually arrive much sooner.
    pub fn gossip_fail_after(&self, n: usize) -> Duration {
        let log2 = usize::BITS - n.max(1).leading_zeros();
        self.gossip_interval * (self.gossip_rounds_factor * log2 + self.gossip_slack_rounds)
    }

    /// Steady-state membership datagrams each node sends per second.
    pub fn packets_per_second(&self) -> f64 {
        self.buddies as f64 / self.heartbeat_interval.as_secs_f64()
            + self.gossip_fanout as f64 / self.gossip_interval.as_secs_f64()
    }

    /// Bound on the time from a crash to a view without the node, while its watchers live
    /// and the network loses at most a few percent: detection by the buddy level (plus one
    /// period of phase), then a regroup that may run in cautious mode (the longest
    /// stage-1 wait plus the accept round, each retried) and may need a takeover.
    pub fn exclusion_bound(&self) -> Duration {
        self.buddy_fail_after() + self.heartbeat_interval + self.regroup_takeover + 3 * self.regroup_max_wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_profile_stays_within_the_packet_budget() {
        // The goal of issue 6: at most 15 membership datagrams per node per second.
        assert!(Config::local().packets_per_second() <= 15.0);
    }

    #[test]
    fn gossip_threshold_grows_with_log_n() {
        let c = Config::local();
        assert!(c.gossip_fail_after(32) > c.gossip_fail_after(4));
        assert!(c.gossip_fail_after(1024) < c.gossip_fail_after(32) * 2);
    }

    #[test]
    fn profiles_are_found_by_name() {
        for name in ["local", "lan", "wan", "sim"] {
            assert!(Config::profile(name).is_some());
        }
        assert!(Config::profile("fast").is_none());
    }
}
