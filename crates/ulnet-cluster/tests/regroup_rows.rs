//! Regroup stage 2 against reordering: a member that suspected another on a few lost
//! heartbeats probes it when the regroup asks for its row, and sends a corrected row once
//! it hears it. The corrected row may reach the proposer before the row it corrects; the
//! proposer must keep the newest, or it prunes a live, connected member for a suspicion
//! that was already withdrawn. Four machines driven by hand, every datagram passed through
//! a policy that can drop it or hold it back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use ulnet_cluster::wire::{Authenticator, Message};
use ulnet_cluster::{Config, Member, MemberId, Membership};

const SECRET: &[u8] = b"regroup-rows";

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9100 + i as u16))
}

/// What happens to one datagram.
enum Fate {
    Deliver,
    Drop,
    Hold,
    /// Deliver it, then every datagram held so far, in the order they were held.
    DeliverThenHeld,
}

struct Net {
    nodes: Vec<Membership>,
    now: Instant,
    auth: Authenticator,
    held: Vec<(usize, usize, Vec<u8>)>,
}

impl Net {
    /// `n` members: node 0 founds the cluster, the others join through it.
    fn new(n: usize) -> Self {
        let now = Instant::now();
        let nodes = (0..n)
            .map(|i| {
                let me = Member { id: MemberId(i as u64 + 1), name: format!("n{i}"), addr: addr(i) };
                let seeds = if i == 0 { vec![] } else { vec![addr(0)] };
                let mut m = Membership::new(Config::local(), me, 1, SECRET, seeds, i as u64);
                m.start(now);
                m
            })
            .collect();
        Self { nodes, now, auth: Authenticator::new(SECRET), held: Vec::new() }
    }

    fn deliver(&mut self, from: usize, to: usize, payload: &[u8]) {
        self.nodes[to].handle_datagram(self.now, addr(from), payload);
    }

    /// Runs for `duration` in 1 ms steps; every datagram meets `fate(from, to, message)`.
    fn run(&mut self, duration: Duration, fate: &mut impl FnMut(usize, usize, &Message) -> Fate) {
        let end = self.now + duration;
        while self.now < end {
            self.now += Duration::from_millis(1);
            loop {
                let mut moved = false;
                for from in 0..self.nodes.len() {
                    if self.nodes[from].poll_timeout().is_some_and(|t| t <= self.now) {
                        self.nodes[from].handle_timeout(self.now);
                    }
                    while let Some(t) = self.nodes[from].poll_transmit() {
                        moved = true;
                        let to = usize::from(t.dst.port() - 9100);
                        let message = self.auth.decode(&t.payload).expect("our own datagram").message;
                        match fate(from, to, &message) {
                            Fate::Deliver => self.deliver(from, to, &t.payload),
                            Fate::Drop => {}
                            Fate::Hold => self.held.push((from, to, t.payload)),
                            Fate::DeliverThenHeld => {
                                self.deliver(from, to, &t.payload);
                                for (f, h, payload) in std::mem::take(&mut self.held) {
                                    self.deliver(f, h, &payload);
                                }
                            }
                        }
                    }
                    while self.nodes[from].poll_event().is_some() {}
                }
                if !moved {
                    break;
                }
            }
        }
    }

    /// (view id, members) at node `i`.
    fn view(&self, i: usize) -> (u64, usize) {
        self.nodes[i].view().map_or((0, 0), |v| (v.id, v.members.len()))
    }
}

#[test]
fn a_corrected_row_that_overtakes_the_row_it_corrects_is_kept() {
    let mut net = Net::new(4);
    net.run(Duration::from_secs(3), &mut |_, _, _| Fate::Deliver);
    let formed = net.view(0);
    assert_eq!(formed.1, 4, "four members formed one view");
    assert!((0..4).all(|i| net.view(i) == formed), "every member installed it");

    // Node 1 stops hearing node 3 (one of the two members it watches) until it has
    // promised with a row that suspects node 3; that row is held back, and so is node 2's
    // first promise, so that the proposer (node 0) is still collecting when they come.
    // Node 3 then answers node 1's probe, node 1's corrected row reaches the proposer
    // first, the held row right after it, then node 2's promise; every later row of node
    // 1 is lost: only the row versions can tell the proposer which of its rows is newer.
    let (suspecter, suspect, proposer, slow) = (1, 3, 0, 2);
    let mut stale_held = false;
    let mut slow_held = false;
    let mut corrected_sent = false;
    net.run(Duration::from_secs(3), &mut |from, to, message| match message {
        _ if from == suspect && to == suspecter && !stale_held => Fate::Drop,
        Message::Promise { .. } if from == slow && to == proposer && stale_held && !slow_held => {
            slow_held = true;
            Fate::Hold
        }
        Message::Promise { suspects, .. } if from == suspecter && to == proposer => {
            let suspects_it = suspects.contains(&MemberId(suspect as u64 + 1));
            if suspects_it && !stale_held {
                stale_held = true;
                Fate::Hold
            } else if !suspects_it && stale_held && !corrected_sent {
                corrected_sent = true;
                Fate::DeliverThenHeld
            } else {
                Fate::Drop
            }
        }
        _ => Fate::Deliver,
    });
    assert!(stale_held && slow_held && corrected_sent, "the scenario ran: a suspecting row, then its correction");
    for i in 0..4 {
        assert_eq!(net.view(i), formed, "node {i} kept the view: nobody was pruned");
    }
}
