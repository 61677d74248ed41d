//! The simulated network: messages in flight ordered by delivery time, with loss,
//! duplication, delay and reordering drawn from the world's RNG, and a matrix of cut links.

use crate::{Faults, NodeId};
use rand::Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// What the network did to the messages given to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkCounters {
    /// Messages nodes sent.
    pub sent: u64,
    /// Messages handed to their receiver (duplicates count again).
    pub delivered: u64,
    /// Lost at random.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Dropped by a cut link, or because the receiver was down.
    pub blocked: u64,
}

struct InFlight<M> {
    from: NodeId,
    to: NodeId,
    msg: M,
}

pub(crate) struct Network<M> {
    faults: Faults,
    /// Keyed by (delivery time, send order): equal times deliver in send order.
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    slots: std::collections::HashMap<u64, InFlight<M>>,
    next_seq: u64,
    /// `cut[from][to]`: the link from `from` to `to` drops everything.
    cut: Vec<Vec<bool>>,
    counters: NetworkCounters,
}

impl<M: Clone> Network<M> {
    pub(crate) fn new(faults: Faults) -> Self {
        Self {
            faults,
            queue: BinaryHeap::new(),
            slots: Default::default(),
            next_seq: 0,
            cut: Vec::new(),
            counters: NetworkCounters::default(),
        }
    }

    pub(crate) fn resize(&mut self, nodes: usize) {
        for row in &mut self.cut {
            row.resize(nodes, false);
        }
        self.cut.resize_with(nodes, || vec![false; nodes]);
    }

    pub(crate) fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    pub(crate) fn counters(&self) -> NetworkCounters {
        self.counters
    }

    pub(crate) fn block(&mut self, a: &[NodeId], b: &[NodeId], both_ways: bool) {
        for &x in a {
            for &y in b {
                if x != y {
                    self.cut[x.0 as usize][y.0 as usize] = true;
                    if both_ways {
                        self.cut[y.0 as usize][x.0 as usize] = true;
                    }
                }
            }
        }
    }

    pub(crate) fn heal(&mut self) {
        for row in &mut self.cut {
            row.iter_mut().for_each(|c| *c = false);
        }
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut.get(from.0 as usize).and_then(|r| r.get(to.0 as usize)).copied().unwrap_or(true)
    }

    pub(crate) fn send(&mut self, rng: &mut impl Rng, now: Instant, from: NodeId, to: NodeId, msg: M) {
        self.counters.sent += 1;
        if self.is_cut(from, to) {
            self.counters.blocked += 1;
            return;
        }
        let f = self.faults;
        if from != to && f.loss > 0.0 && rng.gen_bool(f.loss) {
            self.counters.lost += 1;
            return;
        }
        let copies = if from != to && f.duplicate > 0.0 && rng.gen_bool(f.duplicate) { 2 } else { 1 };
        self.counters.duplicated += copies - 1;
        for _ in 0..copies {
            let mut delay = uniform(rng, f.delay_min, f.delay_max);
            if from != to && f.reorder > 0.0 && rng.gen_bool(f.reorder) {
                delay += uniform(rng, Duration::ZERO, f.reorder_delay_max);
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.queue.push(Reverse((now + delay, seq)));
            self.slots.insert(seq, InFlight { from, to, msg: msg.clone() });
        }
    }

    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, _))| *t)
    }

    /// The next message due at or before `now`, unless its link was cut meanwhile (then it
    /// is dropped and `None` returned; the caller steps again).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(NodeId, NodeId, M)> {
        let Reverse((t, seq)) = *self.queue.peek()?;
        if t > now {
            return None;
        }
        self.queue.pop();
        let m = self.slots.remove(&seq).expect("every queued seq has a slot");
        if self.is_cut(m.from, m.to) {
            self.counters.blocked += 1;
            return None;
        }
        self.counters.delivered += 1;
        Some((m.from, m.to, m.msg))
    }

    /// Drops everything in flight to a node that crashed.
    pub(crate) fn drop_to(&mut self, id: NodeId) {
        let before = self.slots.len();
        self.slots.retain(|_, m| m.to != id);
        self.counters.blocked += (before - self.slots.len()) as u64;
        let slots = &self.slots;
        self.queue.retain(|Reverse((_, seq))| slots.contains_key(seq));
    }
}

fn uniform(rng: &mut impl Rng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    lo + Duration::from_nanos(rng.gen_range(0..=(hi - lo).as_nanos() as u64))
}
