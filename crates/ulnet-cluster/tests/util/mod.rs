//! Shared harness: membership state machines in the deterministic simulator, and the
//! invariant checkers every simulated run applies after every step.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::freshness::next_incarnation;
use ulnet_cluster::{Config, Member, MemberId, Membership, MembershipEvent, Status, View};
use ulnet_sim::{Node, NodeId, Sim};

pub const SECRET: &[u8] = b"sim-cluster-secret";

pub fn addr_of(n: NodeId) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 20_000 + n.0 as u16))
}

pub fn node_of(a: SocketAddr) -> NodeId {
    NodeId(u32::from(a.port() - 20_000))
}

/// One simulated node: the state machine plus what it reported.
pub struct SimMember {
    pub index: u32,
    pub machine: Membership,
    /// Views installed, with the simulated time.
    pub installed: Vec<(Instant, View)>,
    pub events: Vec<(Instant, MembershipEvent)>,
    /// A restarted node starts at its first timeout (restarts are built without the
    /// simulated clock at hand): the instant it was built at, in the past.
    pub start_pending: Option<Instant>,
    /// When set, every datagram this node sends is copied here as (destination, bytes):
    /// what a sniffer on the wire records, for replay tests.
    pub tap: Option<Vec<(NodeId, Vec<u8>)>>,
    /// Set with `tap`: every datagram this node received, as (source, bytes).
    pub heard: Option<Vec<(NodeId, Vec<u8>)>>,
}

impl SimMember {
    pub fn new(index: u32, incarnation: u32, config: Config, seeds: Vec<SocketAddr>, secret: &[u8], seed: u64) -> Self {
        let me = Member {
            id: MemberId(u64::from(index + 1) << 16 | u64::from(incarnation)),
            name: format!("n{index}"),
            addr: addr_of(NodeId(index)),
        };
        // Deterministic incarnations (the runtime takes the wall clock): a new identity's
        // first process is 1 + its restart count.
        let process = u64::from(incarnation) + 1;
        Self {
            index,
            machine: Membership::new(config, me, process, secret, seeds, seed),
            installed: Vec::new(),
            events: Vec::new(),
            start_pending: None,
            tap: None,
            heard: None,
        }
    }

    fn drain_events(&mut self, now: Instant) {
        while let Some(e) = self.machine.poll_event() {
            if let MembershipEvent::ViewInstalled { view } = &e {
                self.installed.push((now, view.clone()));
            }
            self.events.push((now, e));
        }
    }

    pub fn view_id(&self) -> u64 {
        self.machine.view().map_or(0, |v| v.id)
    }
}

impl Node for SimMember {
    type Msg = Vec<u8>;
    fn handle_message(&mut self, now: Instant, from: NodeId, msg: Vec<u8>) {
        if let Some(heard) = &mut self.heard {
            heard.push((from, msg.clone()));
        }
        self.machine.handle_datagram(now, addr_of(from), &msg);
        self.drain_events(now);
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.start_pending.take().is_some() {
            self.machine.start(now);
        } else if self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle_timeout(now);
        }
        self.drain_events(now);
    }
    fn poll_transmit(&mut self) -> Option<(NodeId, Vec<u8>)> {
        let (to, payload) = self.machine.poll_transmit().map(|t| (node_of(t.dst), t.payload))?;
        if let Some(tap) = &mut self.tap {
            tap.push((to, payload.clone()));
        }
        Some((to, payload))
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.start_pending.or_else(|| self.machine.poll_timeout())
    }
}

/// A world of `n` nodes: node 0 forms the cluster, the others join through every other
/// node as seeds (the first members answer as sponsors).
pub fn world(seed: u64, n: u32, faults: ulnet_sim::Faults, config: &Config) -> Sim<SimMember> {
    world_tapped(seed, n, faults, config, false)
}

/// [`world`], with every node's datagrams recorded from its start when `tapped`.
pub fn world_tapped(seed: u64, n: u32, faults: ulnet_sim::Faults, config: &Config, tapped: bool) -> Sim<SimMember> {
    let mut sim = Sim::new(seed, faults);
    for i in 0..n {
        let seeds = if i == 0 { vec![] } else { (0..n).filter(|&j| j != i).map(|j| addr_of(NodeId(j))).collect() };
        let mut node = SimMember::new(i, 0, config.clone(), seeds, SECRET, seed);
        node.tap = tapped.then(Vec::new);
        node.heard = tapped.then(Vec::new);
        sim.add_node(node);
        let now = sim.now();
        let id = NodeId(i);
        sim.node_mut(id).unwrap().machine.start(now);
        sim.node_mut(id).unwrap().drain_events(now);
        sim.flush(id);
    }
    sim
}

/// A restarted node: a new incarnation that joins through every other node.
pub fn restarted(id: NodeId, n: u32, incarnation: u32, config: &Config, seed: u64, now: Instant) -> SimMember {
    let seeds = (0..n).filter(|&j| j != id.0).map(|j| addr_of(NodeId(j))).collect();
    let mut m = SimMember::new(id.0, incarnation, config.clone(), seeds, SECRET, seed ^ u64::from(incarnation));
    m.start_pending = Some(now);
    m
}

/// A restarted node that kept its durable state (identity, view, promises).
pub fn resumed(old: &SimMember, n: u32, config: &Config, seed: u64, now: Instant) -> SimMember {
    let seeds = (0..n).filter(|&j| j != old.index).map(|j| addr_of(NodeId(j))).collect();
    let durable = old.machine.durable();
    let incarnation = next_incarnation(Some(durable.incarnation), 0);
    let machine = Membership::resume(config.clone(), durable, incarnation, SECRET, seeds, seed ^ 0xdead);
    SimMember {
        index: old.index,
        machine,
        installed: Vec::new(),
        events: Vec::new(),
        start_pending: Some(now),
        tap: old.tap.as_ref().map(|_| Vec::new()),
        heard: old.heard.as_ref().map(|_| Vec::new()),
    }
}

/// The invariants, checked after every step of every run.
#[derive(Default)]
pub struct Checker {
    /// Every view id ever installed, with its members (agreement).
    chosen: BTreeMap<u64, Vec<MemberId>>,
    seen: BTreeMap<(u32, MemberId), usize>,
}

impl Checker {
    pub fn check(&mut self, sim: &Sim<SimMember>) -> Result<(), String> {
        for (_, node) in sim.live_nodes() {
            let key = (node.index, node.machine.me().id);
            let from = self.seen.get(&key).copied().unwrap_or(0).min(node.installed.len());
            for (_, v) in &node.installed[from..] {
                let ids: Vec<MemberId> = v.ids().collect();
                match self.chosen.get(&v.id) {
                    Some(prev) if *prev != ids => {
                        return Err(format!(
                            "agreement: view {} installed as {:?} by n{} but as {:?} before",
                            v.id, ids, node.index, prev
                        ))
                    }
                    _ => {
                        self.chosen.insert(v.id, ids);
                    }
                }
            }
            self.seen.insert(key, node.installed.len());
        }
        // Quorum-active views: a quorum of a view's members act as members in it.
        let mut acting: BTreeMap<u64, (View, Vec<MemberId>)> = BTreeMap::new();
        for (_, node) in sim.live_nodes() {
            if node.machine.status() == Status::Member {
                let v = node.machine.view().expect("members have views");
                acting.entry(v.id).or_insert_with(|| (v.clone(), Vec::new())).1.push(node.machine.me().id);
            }
        }
        let active: Vec<&View> =
            acting.values().filter(|(v, who)| v.is_quorum(who, false) || v.len() == 1).map(|(v, _)| v).collect();
        for (i, a) in active.iter().enumerate() {
            for b in &active[i + 1..] {
                let sa: BTreeSet<MemberId> = a.ids().collect();
                if !b.ids().any(|id| sa.contains(&id)) {
                    return Err(format!(
                        "split brain: disjoint views {} {:?} and {} {:?} both hold quorum",
                        a.id,
                        sa,
                        b.id,
                        b.ids().collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether every live node is a member of one and the same view of exactly the live nodes.
pub fn converged(sim: &Sim<SimMember>) -> Result<u64, String> {
    let live: Vec<&SimMember> = sim.live_nodes().map(|(_, n)| n).collect();
    let ids: BTreeSet<MemberId> = live.iter().map(|n| n.machine.me().id).collect();
    let first = live[0].machine.view().ok_or("n0 has no view")?;
    for n in &live {
        let v = n.machine.view().ok_or_else(|| format!("n{} has no view ({:?})", n.index, n.machine.status()))?;
        if n.machine.status() != Status::Member {
            return Err(format!("n{} is {:?}", n.index, n.machine.status()));
        }
        if v.id != first.id {
            return Err(format!("n{} in view {} but n{} in view {}", n.index, v.id, live[0].index, first.id));
        }
    }
    let members: BTreeSet<MemberId> = first.ids().collect();
    if members != ids {
        return Err(format!("view {} has {:?}, live nodes are {:?}", first.id, members, ids));
    }
    Ok(first.id)
}

/// Runs until every node converged or `limit` passes, checking invariants.
pub fn run_to_convergence(
    sim: &mut Sim<SimMember>,
    checker: &mut Checker,
    limit: Duration,
) -> Result<Duration, ulnet_sim::Violation> {
    let start = sim.now();
    let step = Duration::from_millis(10);
    while sim.now() < start + limit {
        sim.run_for(step, |s| checker.check(s))?;
        if converged(sim).is_ok() {
            return Ok(sim.now() - start);
        }
    }
    Err(sim.violation(format!("no convergence within {limit:?}: {}{}", converged(sim).unwrap_err(), dump(sim))))
}

/// Everything the nodes reported, for a failing seed's message.
pub fn dump(sim: &Sim<SimMember>) -> String {
    let mut s = String::new();
    for (_, n) in sim.live_nodes() {
        s += &format!(
            "\n n{} {:?} view {:?} status {:?} counters {:?}",
            n.index,
            n.machine.me().id,
            n.machine.view().map(|v| (v.id, v.ids().collect::<Vec<_>>())),
            n.machine.status(),
            n.machine.counters()
        );
        for (t, e) in n.events.iter().rev().take(12).rev() {
            s += &format!("\n   {:?} {:?}", t.duration_since(sim.start()), e);
        }
    }
    s
}
