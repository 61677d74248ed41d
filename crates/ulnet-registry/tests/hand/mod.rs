//! GUP machines driven by hand at one instant: every message delivered and every record
//! made durable in rounds until nothing moves, no timer ever firing (for tests of what
//! happens without waiting for one).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Instant;
use ulnet_registry::gup::{Event, Gup, GupConfig, NodeId, UpdateId, View};

pub struct Net {
    pub nodes: Vec<Gup>,
    pub committed: Vec<(usize, UpdateId)>,
}

impl Net {
    pub fn new(n: u64, config: GupConfig, now: Instant) -> Self {
        let ids: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let nodes = ids.iter().map(|&id| Gup::bootstrap(id, ids.clone(), config.clone(), now)).collect();
        let mut net = Self { nodes, committed: Vec::new() };
        for g in &mut net.nodes {
            g.handle_view(now, View::new(1, ids.clone()));
        }
        net.settle(now);
        net
    }

    pub fn index(&self, id: NodeId) -> usize {
        self.nodes.iter().position(|g| g.id() == id).expect("known node")
    }

    /// Delivers every message and makes every record durable, in rounds, at `now`, until
    /// nothing moves. Lock requests that reach the locker in one round are granted together.
    pub fn settle(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                let mut durable = None;
                while let Some(e) = self.nodes[i].poll_event() {
                    moved = true;
                    match e {
                        Event::Persist { lsn, .. } => durable = Some(lsn),
                        Event::Committed { id, .. } => self.committed.push((i, id)),
                        _ => {}
                    }
                }
                if let Some(lsn) = durable {
                    self.nodes[i].handle_durable(now, lsn);
                }
            }
            let mut messages = Vec::new();
            for g in &mut self.nodes {
                while let Some((to, msg)) = g.poll_msg() {
                    messages.push((g.id(), to, msg));
                }
            }
            if messages.is_empty() && !moved {
                return;
            }
            for (from, to, msg) in messages {
                let j = self.index(to);
                self.nodes[j].handle_msg(now, from, msg);
            }
        }
    }

    pub fn submit(&mut self, i: usize, now: Instant) -> UpdateId {
        self.nodes[i].submit(now, Arc::from(&b"v"[..])).expect("a member submits")
    }
}
