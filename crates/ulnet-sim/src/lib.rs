//! # ulnet-sim: a deterministic simulator for sans-IO protocols
//!
//! ulnet's protocols (reliable delivery, membership, regroup, the global update protocol)
//! are state machines with no sockets and no clock: they take `now` and inputs, and hand
//! back datagrams to send and the next time they want to be woken. This crate runs many of
//! them against each other on a simulated network, where one seed decides every fault:
//! loss, duplication, reordering, delay, symmetric and asymmetric partitions, crashes and
//! restarts (the approach of TigerBeetle's VOPR). A failing run prints its seed, and the
//! same seed replays it exactly.
//!
//! A protocol joins the simulator by implementing [`Node`]. A test builds a [`Sim`], runs
//! it with [`Sim::run_until`] (checking invariants after every step), and changes the
//! world with [`Sim::crash`], [`Sim::restart`], [`Sim::partition`] and [`Sim::heal`], or
//! lets a seeded [`FaultPlan`] do it. [`for_each_seed`] runs a check over many seeds and
//! names the one that failed.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use ulnet_sim::{Faults, Node, NodeId, Sim};
//!
//! /// Sends "ping" to node 1 every 10 ms and counts the pongs.
//! struct Pinger { next: Option<Instant>, out: Vec<(NodeId, u32)>, pongs: u32 }
//! impl Node for Pinger {
//!     type Msg = u32;
//!     fn handle_message(&mut self, _now: Instant, from: NodeId, msg: u32) {
//!         if msg == 0 { self.out.push((from, 1)) } else { self.pongs += 1 }
//!     }
//!     fn handle_timeout(&mut self, now: Instant) {
//!         if self.next.is_some_and(|t| t <= now) {
//!             self.out.push((NodeId(1), 0));
//!             self.next = Some(now + Duration::from_millis(10));
//!         }
//!     }
//!     fn poll_transmit(&mut self) -> Option<(NodeId, u32)> { self.out.pop() }
//!     fn poll_timeout(&self) -> Option<Instant> { self.next }
//! }
//!
//! let mut sim = Sim::new(7, Faults::default());
//! let start = sim.now();
//! sim.add_node(Pinger { next: Some(start), out: vec![], pongs: 0 });
//! sim.add_node(Pinger { next: None, out: vec![], pongs: 0 });
//! sim.run_for(Duration::from_millis(95), |_| Ok(())).unwrap();
//! assert_eq!(sim.node(NodeId(0)).unwrap().pongs, 10);
//! ```
#![deny(missing_docs)]

mod faults;
mod network;

pub use faults::{FaultPlan, FaultPlanConfig, Faults, WorldChange};
pub use network::NetworkCounters;

use network::Network;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// A node of the simulation, by index in the order nodes were added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A sans-IO protocol participant. The simulator calls the `handle_*` methods, then drains
/// [`Node::poll_transmit`] and asks [`Node::poll_timeout`] for the next wake-up.
pub trait Node {
    /// What travels between nodes (usually the encoded datagram, so decoders run too).
    type Msg: Clone + Debug;
    /// A message from `from` arrived at `now`.
    fn handle_message(&mut self, now: Instant, from: NodeId, msg: Self::Msg);
    /// The time asked for by [`Node::poll_timeout`] has come (or passed). Must be a
    /// harmless no-op when nothing is due.
    fn handle_timeout(&mut self, now: Instant);
    /// The next message to send, if any.
    fn poll_transmit(&mut self) -> Option<(NodeId, Self::Msg)>;
    /// When the node next wants [`Node::handle_timeout`], if ever.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// A failed invariant or check, with the simulated time it was found at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Simulated time since the start.
    pub at: Duration,
    /// What was violated.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at t={:?}: {}", self.at, self.what)
    }
}

/// Safety valve: most events processed at one instant before the run is declared stuck
/// (a node that keeps asking for a timeout in the past, or a message storm).
const EVENTS_PER_INSTANT_MAX: u32 = 1_000_000;

/// The simulated world: nodes, a network between them, a clock, and one seeded RNG from
/// which every random decision is drawn.
pub struct Sim<N: Node> {
    seed: u64,
    rng: ChaCha8Rng,
    start: Instant,
    now: Instant,
    nodes: Vec<Option<N>>,
    /// The state each node had when a [`FaultPlan`] crashed it, for its restart.
    crashed_state: Vec<Option<N>>,
    network: Network<N::Msg>,
    events_at_now: u32,
}

impl<N: Node> Sim<N> {
    /// An empty world whose every random choice follows from `seed`.
    pub fn new(seed: u64, faults: Faults) -> Self {
        let start = Instant::now();
        Self {
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            start,
            now: start,
            nodes: Vec::new(),
            crashed_state: Vec::new(),
            network: Network::new(faults),
            events_at_now: 0,
        }
    }

    /// The seed this world was made from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The simulated clock.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The instant the simulation started at (the zero of simulated time).
    pub fn start(&self) -> Instant {
        self.start
    }

    /// A random number generator derived from the seed, for the test's own choices (which
    /// node to crash, what to send), so they replay too.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// Adds a node; its id is its index.
    pub fn add_node(&mut self, node: N) -> NodeId {
        self.nodes.push(Some(node));
        self.crashed_state.push(None);
        self.network.resize(self.nodes.len());
        let id = NodeId(self.nodes.len() as u32 - 1);
        self.drain(id);
        id
    }

    /// Number of nodes ever added (crashed ones included).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// A node, unless it is crashed.
    pub fn node(&self, id: NodeId) -> Option<&N> {
        self.nodes.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// A node, mutably (to give it input, such as a client request), unless crashed. Call
    /// [`Sim::flush`] afterwards so that what it wants to send goes out now.
    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut N> {
        self.nodes.get_mut(id.0 as usize).and_then(Option::as_mut)
    }

    /// Nodes that are up, with their ids.
    pub fn live_nodes(&self) -> impl Iterator<Item = (NodeId, &N)> {
        self.nodes.iter().enumerate().filter_map(|(i, n)| n.as_ref().map(|n| (NodeId(i as u32), n)))
    }

    /// Collects what `id` wants to send after the test handed it input directly.
    pub fn flush(&mut self, id: NodeId) {
        self.drain(id);
    }

    /// Whether a node is crashed.
    pub fn is_crashed(&self, id: NodeId) -> bool {
        self.node(id).is_none()
    }

    /// Crashes a node: it loses all state and everything in flight to it is dropped.
    /// Returns the node as it was, so a test can carry its durable state into a restart.
    pub fn crash(&mut self, id: NodeId) -> Option<N> {
        let old = self.nodes.get_mut(id.0 as usize)?.take();
        self.network.drop_to(id);
        old
    }

    /// Brings a crashed node back as `node` (a fresh state machine, perhaps rebuilt from
    /// durable state the test kept).
    pub fn restart(&mut self, id: NodeId, node: N) {
        assert!(self.is_crashed(id), "restart of {id}, which is up");
        self.nodes[id.0 as usize] = Some(node);
        self.drain(id);
    }

    /// Cuts the links between the two sides, in both directions.
    pub fn partition(&mut self, side_a: &[NodeId], side_b: &[NodeId]) {
        self.network.block(side_a, side_b, true);
    }

    /// Cuts only the links from `from` to `to` (an asymmetric partition).
    pub fn partition_one_way(&mut self, from: &[NodeId], to: &[NodeId]) {
        self.network.block(from, to, false);
    }

    /// Restores every link.
    pub fn heal(&mut self) {
        self.network.heal();
    }

    /// Changes the network's fault rates from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.network.set_faults(faults);
    }

    /// What the network did so far.
    pub fn network_counters(&self) -> NetworkCounters {
        self.network.counters()
    }

    /// Applies one change of the world (used by [`FaultPlan`]; `restart_with` builds the
    /// node that comes back from its state at the crash, at the simulated time it is given).
    pub fn apply(&mut self, change: &WorldChange, restart_with: &mut dyn FnMut(NodeId, Option<N>, Instant) -> N) {
        match change {
            WorldChange::Crash(id) => {
                if let Some(old) = self.crash(*id) {
                    self.crashed_state[id.0 as usize] = Some(old);
                }
            }
            WorldChange::Restart(id) => {
                if self.is_crashed(*id) {
                    let old = self.crashed_state[id.0 as usize].take();
                    let node = restart_with(*id, old, self.now);
                    self.restart(*id, node);
                }
            }
            WorldChange::Partition { side_a, side_b } => self.partition(side_a, side_b),
            WorldChange::PartitionOneWay { from, to } => self.partition_one_way(from, to),
            WorldChange::Heal => self.heal(),
            WorldChange::Faults(f) => self.set_faults(*f),
        }
    }

    /// Runs one step: delivers the next message or fires the next timeout, whichever is
    /// due first, but not beyond `limit`. Returns `false` when nothing was due before it
    /// (the clock then stands at `limit`).
    pub fn step(&mut self, limit: Instant) -> Result<bool, Violation> {
        let next_timer = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().and_then(|n| n.poll_timeout()).map(|t| (t.max(self.now), i)))
            .min();
        let next_message = self.network.next_due();
        let timer_first = match (next_timer, next_message) {
            (Some((t, _)), Some(m)) => t <= m,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                self.advance(limit);
                return Ok(false);
            }
        };
        let due = if timer_first { next_timer.map(|(t, _)| t) } else { next_message }.expect("one of them is set");
        if due > limit {
            self.advance(limit);
            return Ok(false);
        }
        self.advance(due);
        self.events_at_now += 1;
        if self.events_at_now > EVENTS_PER_INSTANT_MAX {
            return Err(self.violation(format!("more than {EVENTS_PER_INSTANT_MAX} events at one instant: livelock")));
        }
        if timer_first {
            let (_, i) = next_timer.expect("timer is set");
            let now = self.now;
            self.nodes[i].as_mut().expect("timers come from live nodes").handle_timeout(now);
            self.drain(NodeId(i as u32));
        } else if let Some((from, to, msg)) = self.network.pop_due(self.now) {
            let now = self.now;
            if let Some(node) = self.nodes[to.0 as usize].as_mut() {
                node.handle_message(now, from, msg);
                self.drain(to);
            }
        }
        Ok(true)
    }

    /// Runs until `deadline`, calling `check` after every step; stops at the first
    /// violation it reports.
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut check: impl FnMut(&Self) -> Result<(), String>,
    ) -> Result<(), Violation> {
        while self.step(deadline)? {
            check(self).map_err(|what| self.violation(what))?;
        }
        check(self).map_err(|what| self.violation(what))
    }

    /// Runs for `span` of simulated time (see [`Sim::run_until`]).
    pub fn run_for(&mut self, span: Duration, check: impl FnMut(&Self) -> Result<(), String>) -> Result<(), Violation> {
        self.run_until(self.now + span, check)
    }

    /// Runs `plan`, applying each change at its time and checking after every step, until
    /// the plan's end. Crashed nodes' last state is handed to `restart_with` on restart.
    pub fn run_plan(
        &mut self,
        plan: &FaultPlan,
        mut restart_with: impl FnMut(NodeId, Option<N>, Instant) -> N,
        mut check: impl FnMut(&Self) -> Result<(), String>,
    ) -> Result<(), Violation> {
        for (at, change) in &plan.changes {
            self.run_until(self.start + *at, &mut check)?;
            self.apply(change, &mut restart_with);
            check(self).map_err(|what| self.violation(what))?;
        }
        self.run_until(self.start + plan.end, &mut check)
    }

    /// A violation at the current time.
    pub fn violation(&self, what: impl Into<String>) -> Violation {
        Violation { at: self.elapsed(), what: what.into() }
    }

    /// A uniformly random choice from the seed's RNG.
    pub fn random_below(&mut self, n: u64) -> u64 {
        self.rng.gen_range(0..n.max(1))
    }

    fn advance(&mut self, to: Instant) {
        if to > self.now {
            self.now = to;
            self.events_at_now = 0;
        }
    }

    fn drain(&mut self, id: NodeId) {
        let Some(node) = self.nodes[id.0 as usize].as_mut() else { return };
        while let Some((to, msg)) = node.poll_transmit() {
            self.network.send(&mut self.rng, self.now, id, to, msg);
        }
    }
}

/// Runs `check` for every seed in `seeds`, or only for the seed in the environment
/// variable `ULNET_SIM_SEED` when it is set. Panics at the first failure with the seed and
/// the command that replays it. The number of seeds can be raised with
/// `ULNET_SIM_SEEDS=N` (for long runs outside CI).
pub fn for_each_seed(name: &str, seeds: std::ops::Range<u64>, mut check: impl FnMut(u64) -> Result<(), Violation>) {
    let seeds = match std::env::var("ULNET_SIM_SEED").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(one) => one..one + 1,
        None => match std::env::var("ULNET_SIM_SEEDS").ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) => seeds.start..seeds.start + n,
            None => seeds,
        },
    };
    for seed in seeds {
        if let Err(v) = check(seed) {
            panic!("{name}: {v}\nreproduce with ULNET_SIM_SEED={seed} cargo test {name}");
        }
    }
}
