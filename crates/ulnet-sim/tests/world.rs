//! The simulator's own guarantees: one seed, one history; faults happen at their rates;
//! cut links and crashed nodes drop messages.

use std::time::{Duration, Instant};
use ulnet_sim::{FaultPlan, FaultPlanConfig, Faults, Node, NodeId, Sim, WorldChange};

/// Every node sends a numbered message to every other node each millisecond and records
/// what it receives, in order.
struct Chatter {
    me: NodeId,
    peers: u32,
    next: Instant,
    sent: u64,
    out: Vec<(NodeId, u64)>,
    received: Vec<(NodeId, u64)>,
}

impl Chatter {
    fn new(me: u32, peers: u32, now: Instant) -> Self {
        Self { me: NodeId(me), peers, next: now, sent: 0, out: Vec::new(), received: Vec::new() }
    }
}

impl Node for Chatter {
    type Msg = u64;
    fn handle_message(&mut self, _now: Instant, from: NodeId, msg: u64) {
        self.received.push((from, msg));
    }
    fn handle_timeout(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        for p in (0..self.peers).map(NodeId).filter(|&p| p != self.me) {
            self.out.push((p, self.sent));
            self.sent += 1;
        }
        self.next = now + Duration::from_millis(1);
    }
    fn poll_transmit(&mut self) -> Option<(NodeId, u64)> {
        self.out.pop()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next)
    }
}

fn world(seed: u64, faults: Faults, n: u32) -> Sim<Chatter> {
    let mut sim = Sim::new(seed, faults);
    let now = sim.now();
    for i in 0..n {
        sim.add_node(Chatter::new(i, n, now));
    }
    sim
}

fn history(sim: &Sim<Chatter>) -> Vec<Vec<(NodeId, u64)>> {
    sim.live_nodes().map(|(_, n)| n.received.clone()).collect()
}

#[test]
fn same_seed_same_history() {
    let faults = Faults::lossy(0.1);
    let run = |seed| {
        let mut sim = world(seed, faults, 4);
        sim.run_for(Duration::from_millis(200), |_| Ok(())).unwrap();
        (history(&sim), sim.network_counters())
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11).0, run(12).0, "different seeds should give different histories");
}

#[test]
fn faults_happen_at_their_rates() {
    let faults = Faults { loss: 0.2, duplicate: 0.1, ..Faults::default() };
    let mut sim = world(3, faults, 3);
    sim.run_for(Duration::from_secs(2), |_| Ok(())).unwrap();
    let c = sim.network_counters();
    let lost = c.lost as f64 / c.sent as f64;
    let dup = c.duplicated as f64 / (c.sent - c.lost) as f64;
    assert!((0.18..0.22).contains(&lost), "loss rate {lost}");
    assert!((0.08..0.12).contains(&dup), "duplication rate {dup}");
}

#[test]
fn reordering_lets_later_messages_overtake() {
    let faults = Faults { reorder: 0.2, reorder_delay_max: Duration::from_millis(3), ..Faults::default() };
    let mut sim = world(5, faults, 2);
    sim.run_for(Duration::from_millis(500), |_| Ok(())).unwrap();
    let got: Vec<u64> = sim.node(NodeId(1)).unwrap().received.iter().map(|&(_, m)| m).collect();
    assert!(got.windows(2).any(|w| w[0] > w[1]), "no message was overtaken");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "reordering must not lose or copy messages");
}

#[test]
fn partitions_cut_links_and_heal_restores_them() {
    let mut sim = world(1, Faults::default(), 3);
    sim.partition(&[NodeId(0)], &[NodeId(1), NodeId(2)]);
    sim.partition_one_way(&[NodeId(1)], &[NodeId(2)]);
    sim.run_for(Duration::from_millis(50), |_| Ok(())).unwrap();
    let from = |to: u32, from: u32| sim.node(NodeId(to)).unwrap().received.iter().filter(|m| m.0 .0 == from).count();
    assert_eq!(from(0, 1) + from(0, 2) + from(1, 0) + from(2, 0), 0);
    assert_eq!(from(2, 1), 0, "one-way cut from 1 to 2");
    assert!(from(1, 2) > 40, "2 still reaches 1");
    sim.heal();
    sim.run_for(Duration::from_millis(10), |_| Ok(())).unwrap();
    let from = |to: u32, from: u32| sim.node(NodeId(to)).unwrap().received.iter().filter(|m| m.0 .0 == from).count();
    assert!(from(0, 1) > 5 && from(2, 1) > 5);
}

#[test]
fn crashed_nodes_lose_state_and_in_flight_messages() {
    let mut sim = world(
        2,
        Faults { delay_min: Duration::from_millis(5), delay_max: Duration::from_millis(5), ..Faults::default() },
        2,
    );
    sim.run_for(Duration::from_millis(20), |_| Ok(())).unwrap();
    let sent_before_crash = sim.node(NodeId(0)).unwrap().sent;
    let old = sim.crash(NodeId(1)).expect("was up");
    assert!(!old.received.is_empty());
    sim.run_for(Duration::from_millis(20), |_| Ok(())).unwrap();
    let now = sim.now();
    sim.restart(NodeId(1), Chatter::new(1, 2, now));
    sim.run_for(Duration::from_millis(3), |_| Ok(())).unwrap();
    let after = &sim.node(NodeId(1)).unwrap().received;
    assert!(!after.is_empty(), "messages sent after the restart arrive");
    assert!(
        after.iter().all(|&(_, m)| m >= sent_before_crash),
        "a message in flight when the node crashed arrived after its restart"
    );
}

#[test]
fn plans_replay_and_end_healed() {
    let config = FaultPlanConfig::standard(5, Duration::from_secs(10));
    let a = FaultPlan::random(9, &config, Faults::default());
    let b = FaultPlan::random(9, &config, Faults::default());
    assert_eq!(a.changes, b.changes);
    assert!(a.down_at_end().is_empty());
    assert!(a.changes.iter().any(|(_, c)| matches!(c, WorldChange::Crash(_))));
    let mut sim = world(9, Faults::default(), 5);
    let mut restarted = 0;
    sim.run_plan(
        &a,
        |id, _old, now| {
            restarted += 1;
            Chatter::new(id.0, 5, now)
        },
        |s| {
            let down = (0..5).filter(|&i| s.is_crashed(NodeId(i))).count();
            if down > 2 {
                Err(format!("{down} nodes down, more than crashed_max"))
            } else {
                Ok(())
            }
        },
    )
    .unwrap();
    assert!(restarted > 0);
    assert_eq!(sim.live_nodes().count(), 5);
}
