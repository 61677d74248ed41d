//! What can go wrong: the network's fault rates, and seeded plans of crashes, restarts,
//! partitions and changes of loss over a run.

use crate::NodeId;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Fault rates of the network, applied to every message between two different nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faults {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Shortest one-way delay.
    pub delay_min: Duration,
    /// Longest one-way delay (uniform between the two).
    pub delay_max: Duration,
    /// Probability that a message is held back by up to `reorder_delay_max` more, so later
    /// ones overtake it.
    pub reorder: f64,
    /// Longest extra delay of a held-back message.
    pub reorder_delay_max: Duration,
}

impl Default for Faults {
    /// A clean LAN: 50–150 µs one way, nothing lost, duplicated or reordered.
    fn default() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            delay_min: Duration::from_micros(50),
            delay_max: Duration::from_micros(150),
            reorder: 0.0,
            reorder_delay_max: Duration::ZERO,
        }
    }
}

impl Faults {
    /// A lossy LAN: `loss` of messages lost, 1% duplicated, 5% delayed by up to 5 ms.
    pub fn lossy(loss: f64) -> Self {
        Self { loss, duplicate: 0.01, reorder: 0.05, reorder_delay_max: Duration::from_millis(5), ..Self::default() }
    }
}

/// One change of the simulated world.
#[derive(Clone, Debug, PartialEq)]
pub enum WorldChange {
    /// The node stops; its volatile state is gone.
    Crash(NodeId),
    /// A crashed node starts again.
    Restart(NodeId),
    /// The two sides cannot reach each other.
    Partition {
        /// One side.
        side_a: Vec<NodeId>,
        /// The other side.
        side_b: Vec<NodeId>,
    },
    /// `from` cannot reach `to`, but `to` still reaches `from`.
    PartitionOneWay {
        /// Senders whose messages are dropped.
        from: Vec<NodeId>,
        /// Receivers that do not get them.
        to: Vec<NodeId>,
    },
    /// Every link works again.
    Heal,
    /// New fault rates.
    Faults(Faults),
}

/// How [`FaultPlan::random`] draws a plan.
#[derive(Clone, Debug)]
pub struct FaultPlanConfig {
    /// Number of nodes in the world.
    pub nodes: u32,
    /// Length of the faulty part of the run.
    pub duration: Duration,
    /// Quiet time after it (everything healed and restarted) for the protocol to settle.
    pub settle: Duration,
    /// Mean time between changes.
    pub mean_gap: Duration,
    /// Relative weight of crashing a node.
    pub crash_weight: u32,
    /// Relative weight of restarting a crashed node (0: crashed nodes stay down).
    pub restart_weight: u32,
    /// Relative weight of a partition (one way in a third of cases).
    pub partition_weight: u32,
    /// Relative weight of healing all links.
    pub heal_weight: u32,
    /// Relative weight of changing the loss rate (to a value up to `loss_max`).
    pub loss_weight: u32,
    /// Highest loss rate a change may set.
    pub loss_max: f64,
    /// Most nodes down at once.
    pub crashed_max: u32,
    /// Nodes never crashed (for example, a client driver).
    pub never_crash: Vec<NodeId>,
}

impl FaultPlanConfig {
    /// Crashes, restarts, partitions and loss up to 20% over `duration`, for `nodes` nodes,
    /// keeping a majority up.
    pub fn standard(nodes: u32, duration: Duration) -> Self {
        Self {
            nodes,
            duration,
            settle: duration,
            mean_gap: duration / 8,
            crash_weight: 3,
            restart_weight: 2,
            partition_weight: 2,
            heal_weight: 2,
            loss_weight: 1,
            loss_max: 0.2,
            crashed_max: nodes.saturating_sub(1) / 2,
            never_crash: Vec::new(),
        }
    }
}

/// A seeded schedule of world changes, ending with everything healed and restarted (when
/// restarts are allowed) so that the run can check that the protocol recovers.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Changes, in time order (times since the start of the run).
    pub changes: Vec<(Duration, WorldChange)>,
    /// When the run ends.
    pub end: Duration,
}

impl FaultPlan {
    /// Draws a plan from `seed`.
    pub fn random(seed: u64, config: &FaultPlanConfig, base: Faults) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_fa17_0000_0000);
        let mut changes = Vec::new();
        let mut down: Vec<NodeId> = Vec::new();
        let mut t = Duration::ZERO;
        let weights = [
            config.crash_weight,
            config.restart_weight,
            config.partition_weight,
            config.heal_weight,
            config.loss_weight,
        ];
        let total: u32 = weights.iter().sum();
        let all: Vec<NodeId> = (0..config.nodes).map(NodeId).collect();
        loop {
            let gap_ns = config.mean_gap.as_nanos() as u64;
            t += Duration::from_nanos(rng.gen_range(gap_ns / 2..=gap_ns * 3 / 2));
            if t >= config.duration || total == 0 {
                break;
            }
            let mut pick = rng.gen_range(0..total);
            let kind = weights.iter().position(|&w| {
                if pick < w {
                    true
                } else {
                    pick -= w;
                    false
                }
            });
            match kind {
                Some(0) if (down.len() as u32) < config.crashed_max => {
                    let candidates: Vec<NodeId> =
                        all.iter().copied().filter(|n| !down.contains(n) && !config.never_crash.contains(n)).collect();
                    if let Some(&n) = candidates.choose(&mut rng) {
                        down.push(n);
                        changes.push((t, WorldChange::Crash(n)));
                    }
                }
                Some(1) if !down.is_empty() => {
                    let n = down.swap_remove(rng.gen_range(0..down.len()));
                    changes.push((t, WorldChange::Restart(n)));
                }
                Some(2) if config.nodes >= 2 => {
                    let mut shuffled = all.clone();
                    shuffled.shuffle(&mut rng);
                    let cut = rng.gen_range(1..config.nodes as usize);
                    let (a, b) = shuffled.split_at(cut);
                    changes.push((
                        t,
                        if rng.gen_ratio(1, 3) {
                            WorldChange::PartitionOneWay { from: a.to_vec(), to: b.to_vec() }
                        } else {
                            WorldChange::Partition { side_a: a.to_vec(), side_b: b.to_vec() }
                        },
                    ));
                }
                Some(3) => changes.push((t, WorldChange::Heal)),
                Some(4) => {
                    let loss = rng.gen_range(0.0..=config.loss_max);
                    changes.push((t, WorldChange::Faults(Faults { loss, ..base })));
                }
                _ => {}
            }
        }
        let quiet = config.duration;
        changes.push((quiet, WorldChange::Heal));
        changes.push((quiet, WorldChange::Faults(base)));
        if config.restart_weight > 0 {
            for n in down {
                changes.push((quiet, WorldChange::Restart(n)));
            }
        }
        Self { changes, end: config.duration + config.settle }
    }

    /// Nodes that are down when the plan ends.
    pub fn down_at_end(&self) -> Vec<NodeId> {
        let mut down = Vec::new();
        for (_, c) in &self.changes {
            match c {
                WorldChange::Crash(n) => down.push(*n),
                WorldChange::Restart(n) => down.retain(|d| d != n),
                _ => {}
            }
        }
        down
    }
}
