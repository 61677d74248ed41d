//! The river's flow control ([`FlowControl`]) under the deterministic simulator: nodes
//! exchange records over ordered channels (constant delay: a channel never reorders) with
//! slow consumers, and a seeded schedule may crash a node at any moment. Checked on every
//! step and at the end:
//!
//! * never more data messages outstanding from a sender to a receiver than its credits;
//! * a node that reports "dry" has received exactly the records every peer sent it
//!   (a crash can make a node fail, never end short);
//! * without a crash every node runs dry; with one, every survivor ends, dry (when the
//!   crashed node's streams to and from it had ended) or with an error naming that node.
//!
//! `ULNET_SIM_SEEDS=N` runs more seeds; a failure prints the seed that replays it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};
use ulnet_river::credit::{FlowControl, FlowError};
use ulnet_sim::{for_each_seed, Faults, Node, NodeId, Sim};

#[derive(Clone, Debug)]
enum Msg {
    Data(u64),
    Credit(u32),
    End(u64),
    /// A node failed because of the node named here (what `River::abort` sends).
    Abort(usize),
}

const CREDITS: u32 = 4;
const DELAY: Duration = Duration::from_micros(100);

struct SimNode {
    flow: FlowControl,
    chunk: u64,
    to_send: Vec<u64>,
    /// Ground truth: records put on the wire to each peer.
    sent: Vec<u64>,
    /// Data messages sent to each peer and credits granted back by it.
    data_msgs: Vec<u64>,
    credits_back: Vec<u64>,
    /// Arrived, not yet processed (a store takes time: one message per tick).
    inbox: VecDeque<(usize, Msg)>,
    outbox: VecDeque<(NodeId, Msg)>,
    tick: Duration,
    next: Option<Instant>,
    failed: Option<FlowError>,
}

impl SimNode {
    fn new(rank: usize, size: usize, records: u64, chunk: u64, tick: Duration, start: Instant) -> Self {
        let mut to_send = vec![records; size];
        to_send[rank] = 0;
        SimNode {
            flow: FlowControl::new(rank, size, CREDITS),
            chunk,
            to_send,
            sent: vec![0; size],
            data_msgs: vec![0; size],
            credits_back: vec![0; size],
            inbox: VecDeque::new(),
            outbox: VecDeque::new(),
            tick,
            next: Some(start),
            failed: None,
        }
    }

    fn done(&self) -> bool {
        self.failed.is_some() || self.flow.is_dry()
    }

    /// Fails, and tells every peer the cause, as a failing river node does before it exits.
    fn fail(&mut self, e: FlowError) {
        if self.failed.is_some() {
            return;
        }
        let cause = match &e {
            FlowError::Lost { node, .. } | FlowError::Protocol { node, .. } => *node,
        };
        for j in (0..self.to_send.len()).filter(|&j| j != self.flow.rank() && !self.flow.is_down(j)) {
            self.outbox.push_back((NodeId(j as u32), Msg::Abort(cause)));
        }
        self.failed = Some(e);
        self.next = None;
    }

    fn channel_down(&mut self, peer: usize) {
        if let Err(e) = self.flow.on_channel_down(peer, "crashed") {
            self.fail(e);
        } else if !self.flow.end_sent(peer) {
            // Our stream to it cannot end: its partition is lost.
            self.fail(FlowError::Lost { node: peer, reason: "lost while we were sending to it".into() });
        }
    }

    fn work(&mut self) {
        if let Some((from, msg)) = self.inbox.pop_front() {
            let r = match msg {
                Msg::Data(n) => self.flow.on_data(from, n),
                Msg::Credit(n) => {
                    self.credits_back[from] += u64::from(n);
                    self.flow.on_credit(from, n)
                }
                Msg::End(n) => self.flow.on_end_of_stream(from, n),
                Msg::Abort(cause) => Err(FlowError::Lost { node: cause, reason: format!("reported by node {from}") }),
            };
            if let Err(e) = r {
                return self.fail(e);
            }
        }
        for j in 0..self.to_send.len() {
            while self.to_send[j] > 0 && self.flow.may_send(j) {
                let n = self.to_send[j].min(self.chunk);
                self.flow.on_data_sent(j, n);
                self.to_send[j] -= n;
                self.sent[j] += n;
                self.data_msgs[j] += 1;
                self.outbox.push_back((NodeId(j as u32), Msg::Data(n)));
            }
            if self.to_send[j] == 0 && !self.flow.end_sent(j) && !self.flow.is_down(j) {
                let declared = self.flow.end_of_stream(j);
                self.outbox.push_back((NodeId(j as u32), Msg::End(declared)));
            }
        }
        let everything_sent = (0..self.to_send.len()).all(|j| self.flow.end_sent(j));
        while let Some((j, n)) = self.flow.poll_credit(everything_sent) {
            self.outbox.push_back((NodeId(j as u32), Msg::Credit(n)));
        }
    }
}

impl Node for SimNode {
    type Msg = Msg;

    fn handle_message(&mut self, now: Instant, from: NodeId, msg: Msg) {
        if let (Msg::Abort(cause), None) = (&msg, &self.failed) {
            // Aborts are read at once, ahead of queued data (the river checks for them on
            // every poll).
            let e = FlowError::Lost { node: *cause, reason: format!("reported by node {from}") };
            return self.fail(e);
        }
        if self.failed.is_none() {
            self.inbox.push_back((from.0 as usize, msg));
            if self.next.is_none() {
                self.next = Some(now);
            }
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.next.is_some_and(|t| t <= now) {
            self.work();
            self.next = if self.done() && self.inbox.is_empty() { None } else { Some(now + self.tick) };
        }
    }

    fn poll_transmit(&mut self) -> Option<(NodeId, Msg)> {
        self.outbox.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next
    }
}

fn check(sim: &Sim<SimNode>, crashed: &[Option<(Vec<u64>, usize)>]) -> Result<(), String> {
    for (i, node) in sim.live_nodes() {
        let i = i.0 as usize;
        for j in 0..node.sent.len() {
            let outstanding = node.data_msgs[j] - node.credits_back[j];
            if outstanding > u64::from(CREDITS) {
                return Err(format!("node {i} has {outstanding} data messages outstanding to node {j}"));
            }
        }
        if node.flow.is_dry() {
            for j in (0..node.sent.len()).filter(|&j| j != i) {
                let sent_by_j = match sim.node(NodeId(j as u32)) {
                    Some(peer) => peer.sent[i],
                    None => crashed[j].as_ref().map_or(0, |(sent, _)| sent[i]),
                };
                if node.flow.received_records(j) != sent_by_j {
                    return Err(format!(
                        "node {i} ran dry with {} records from node {j}, which sent {sent_by_j}",
                        node.flow.received_records(j)
                    ));
                }
            }
        }
    }
    Ok(())
}

fn run(seed: u64) -> Result<(), ulnet_sim::Violation> {
    let faults = Faults { delay_min: DELAY, delay_max: DELAY, ..Faults::default() };
    let mut sim = Sim::new(seed, faults);
    let size = 2 + sim.random_below(3) as usize;
    let records = 1 + sim.random_below(200);
    let chunk = 1 + sim.random_below(20);
    let start = sim.now();
    for rank in 0..size {
        let tick = Duration::from_micros(1 + sim.random_below(300));
        sim.add_node(SimNode::new(rank, size, records, chunk, tick, start));
    }
    let mut crashed: Vec<Option<(Vec<u64>, usize)>> = vec![None; size];
    let crash = sim.random_below(2) == 1;
    if crash {
        let victim = sim.random_below(size as u64) as usize;
        let at = Duration::from_micros(sim.random_below(20_000));
        sim.run_for(at, |s| check(s, &crashed))?;
        if let Some(state) = sim.crash(NodeId(victim as u32)) {
            crashed[victim] = Some((state.sent.clone(), victim));
        }
        // The channels report the loss after delivering what the victim had sent.
        sim.run_for(DELAY + Duration::from_micros(1), |s| check(s, &crashed))?;
        for i in (0..size).filter(|&i| i != victim) {
            if let Some(n) = sim.node_mut(NodeId(i as u32)) {
                n.channel_down(victim);
            }
            sim.flush(NodeId(i as u32));
        }
    }
    sim.run_for(Duration::from_secs(5), |s| check(s, &crashed))?;
    for (i, node) in sim.live_nodes() {
        match (&node.failed, crashed.iter().flatten().next()) {
            (None, _) if node.flow.is_dry() => {}
            (Some(FlowError::Lost { node: who, .. }), Some((_, victim))) if who == victim => {}
            (failed, _) => {
                return Err(sim.violation(format!(
                    "node {i} ended neither dry nor failing on the crashed node: failed {failed:?}, crashed {:?}, \
                     left to send {:?}, flow {:?}",
                    crashed.iter().flatten().map(|c| c.1).collect::<Vec<_>>(),
                    node.to_send,
                    node.flow
                )))
            }
        }
    }
    Ok(())
}

#[test]
fn flow_control_never_ends_short_and_always_ends() {
    for_each_seed("flow_control_never_ends_short_and_always_ends", 0..1500, run);
}
