//! A GUP node inside the simulator: the state machine, a simulated disk with group-commit
//! fsync (records not yet fsynced may survive a crash, in part), a client that submits
//! updates, and a membership oracle driven by the test. Every node reports what it applies
//! to a shared [`World`], which checks total order at every step.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ulnet_registry::gup::{Entry, Event, Gup, GupConfig, NodeId, ReadId, Record, Recovered, UpdateId, View};
use ulnet_registry::linearizability::{Action, Operation};
use ulnet_registry::store::{Op, Store};
use ulnet_sim::{FaultPlan, FaultPlanConfig, Faults, Node, Sim, Violation, WorldChange};

/// What every node applied, checked as it happens.
#[derive(Default)]
pub struct World {
    /// Chain hash after each position (index = position).
    pub canon_hash: Vec<u64>,
    /// The updates at each position (index = position; position 0 unused).
    pub canon: Vec<Vec<Vec<u8>>>,
    /// Values acknowledged to a client (committed at their sender).
    pub acked: BTreeSet<Vec<u8>>,
    /// Values submitted.
    pub submitted: BTreeSet<Vec<u8>>,
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Registry operations of the clients, for the linearizability checker.
    pub history: Vec<Operation>,
    /// Simulated time zero.
    pub t0: Option<Instant>,
    /// An update to trace.
    pub trace: Option<Vec<u8>>,
}

impl World {
    fn t(&self, now: Instant) -> u64 {
        (now - self.t0.expect("set at start")).as_nanos() as u64
    }
}

impl World {
    fn applied(&mut self, node: NodeId, seq: u64, hash: u64, updates: Vec<Vec<u8>>) {
        let s = seq as usize;
        if self.canon_hash.is_empty() {
            self.canon_hash.push(0);
            self.canon.push(Vec::new());
        }
        if s < self.canon_hash.len() {
            if self.canon_hash[s] != hash {
                self.violations.push(format!(
                    "{node} applied {:?} at {seq}, others applied {:?}",
                    show(&updates),
                    show(&self.canon[s])
                ));
            }
        } else if s == self.canon_hash.len() {
            self.canon_hash.push(hash);
            self.canon.push(updates);
        } else {
            self.violations.push(format!("{node} applied {seq} before anyone applied {}", self.canon_hash.len()));
        }
    }
}

fn show(v: &[Vec<u8>]) -> Vec<String> {
    v.iter().map(|u| String::from_utf8_lossy(u).into_owned()).collect()
}

fn mix(h: u64, entry: &Entry) -> u64 {
    let mut x = h ^ 0x9e37_79b9_7f4a_7c15;
    for u in entry.updates() {
        for &b in u.iter() {
            x = (x ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        x = x.rotate_left(17).wrapping_mul(0xff51_afd7_ed55_8ccd);
    }
    x.wrapping_add(1)
}

/// The simulated disk: fsynced records and records written but not yet fsynced.
#[derive(Clone, Default)]
pub struct Disk {
    pub durable: Vec<Record>,
    pub written: Vec<(u64, Record)>,
}

pub struct SimNode {
    pub gup: Gup,
    pub me: NodeId,
    disk: Disk,
    fsync: Option<(Instant, u64)>,
    fsync_delay: Duration,
    state_hash: u64,
    state_seq: u64,
    out: VecDeque<(ulnet_sim::NodeId, Vec<u8>)>,
    pub world: Rc<RefCell<World>>,
    rng: StdRng,
    /// Submit an update every this often (None: no client).
    pub submit_every: Option<Duration>,
    next_submit: Option<Instant>,
    submitted: u64,
    pending: HashMap<UpdateId, Vec<u8>>,
    compact_every: u64,
    pub committed: u64,
    /// The registry state applied (updates that are registry operations).
    store: Store,
    /// Registry client: keys it works on (0: plain updates instead).
    pub registry_keys: u32,
    sets: HashMap<UpdateId, (Vec<u8>, Vec<u8>, u64)>,
    gets: HashMap<ReadId, (Vec<u8>, u64)>,
}

fn snapshot_bytes(hash: u64, store: &Store) -> Arc<[u8]> {
    let mut v = hash.to_le_bytes().to_vec();
    v.extend_from_slice(&store.snapshot());
    Arc::from(v)
}

fn parse_snapshot(data: &[u8]) -> (u64, Store) {
    (u64::from_le_bytes(data[..8].try_into().unwrap()), Store::from_snapshot(&data[8..]).expect("snapshot decodes"))
}

impl SimNode {
    pub fn new(gup: Gup, world: Rc<RefCell<World>>, seed: u64, now: Instant) -> Self {
        let me = gup.id();
        let mut n = Self {
            gup,
            me,
            disk: Disk::default(),
            fsync: None,
            fsync_delay: Duration::from_micros(800),
            state_hash: 0,
            state_seq: 0,
            out: VecDeque::new(),
            world,
            rng: StdRng::seed_from_u64(seed),
            submit_every: None,
            next_submit: None,
            submitted: 0,
            pending: HashMap::new(),
            compact_every: 40,
            committed: 0,
            store: Store::default(),
            registry_keys: 0,
            sets: HashMap::new(),
            gets: HashMap::new(),
        };
        n.world.borrow_mut().t0.get_or_insert(now);
        n.pump(now);
        n
    }

    /// A restarted node: durable records, plus a random prefix of what was written but not
    /// fsynced; with `lose_tail`, the last durable records are lost to corruption instead.
    pub fn restart(old: SimNode, voters: Vec<NodeId>, config: GupConfig, now: Instant, lose_tail: bool) -> Self {
        {
            // The crashed node's clients never learn how their sets ended.
            let mut w = old.world.borrow_mut();
            for (_, (key, value, call)) in old.sets {
                w.history.push(Operation { key, action: Action::Set(value), call, ret: None });
            }
        }
        let mut rng = old.rng;
        let mut records = old.disk.durable;
        let mut lost_tail = false;
        if lose_tail && !records.is_empty() {
            let cut = rng.gen_range(0..records.len());
            records.truncate(records.len() - cut.min(8));
            lost_tail = true;
        } else {
            let keep = rng.gen_range(0..=old.disk.written.len());
            records.extend(old.disk.written.into_iter().take(keep).map(|(_, r)| r));
        }
        // The state the host rebuilds: the last snapshot in the log.
        let (mut seq, mut hash, mut store) = (0, 0, Store::default());
        for r in &records {
            if let Record::Snapshot { seq: s, data } = r {
                seq = *s;
                (hash, store) = parse_snapshot(data);
            }
        }
        let gup = Gup::recover(old.me, voters, config, Recovered { records: records.clone(), lost_tail }, now);
        let mut n = SimNode::new_inner(gup, old.world, rng, now);
        n.disk.durable = records;
        n.state_seq = seq;
        n.state_hash = hash;
        n.store = store;
        n.registry_keys = old.registry_keys;
        n.submit_every = old.submit_every;
        n.next_submit = old.submit_every.map(|d| now + d);
        n.submitted = old.submitted;
        n.pump(now);
        n
    }

    fn new_inner(gup: Gup, world: Rc<RefCell<World>>, rng: StdRng, _now: Instant) -> Self {
        let me = gup.id();
        Self {
            gup,
            me,
            disk: Disk::default(),
            fsync: None,
            fsync_delay: Duration::from_micros(800),
            state_hash: 0,
            state_seq: 0,
            out: VecDeque::new(),
            world,
            rng,
            submit_every: None,
            next_submit: None,
            submitted: 0,
            pending: HashMap::new(),
            compact_every: 40,
            committed: 0,
            store: Store::default(),
            registry_keys: 0,
            sets: HashMap::new(),
            gets: HashMap::new(),
        }
    }

    pub fn start_client(&mut self, every: Duration, now: Instant) {
        self.submit_every = Some(every);
        self.next_submit = Some(now + every);
    }

    pub fn stop_client(&mut self) {
        self.submit_every = None;
        self.next_submit = None;
    }

    pub fn view(&mut self, now: Instant, view: View) {
        self.gup.handle_view(now, view);
        self.pump(now);
    }

    pub fn submit_value(&mut self, now: Instant, value: Vec<u8>) -> Option<UpdateId> {
        match self.gup.submit(now, Arc::from(value.clone())) {
            Ok(id) => {
                self.world.borrow_mut().submitted.insert(value.clone());
                self.pending.insert(id, value);
                self.pump(now);
                Some(id)
            }
            Err(_) => None,
        }
    }

    pub fn durable_records(&self) -> &[Record] {
        &self.disk.durable
    }

    fn pump(&mut self, now: Instant) {
        while let Some(ev) = self.gup.poll_event() {
            match ev {
                Event::Persist { lsn, record } => {
                    if let (Some(t), Record::Entry { seq, entry }) = (&self.world.borrow().trace, &record) {
                        if entry.updates().any(|u| u[..] == t[..]) {
                            let at = now - self.world.borrow().t0.unwrap();
                            eprintln!(
                                "{at:?} {} persists at {seq} in {} ({} parts) normal {}",
                                self.me,
                                self.gup.epoch(),
                                entry.parts().len(),
                                self.gup.is_normal()
                            );
                        }
                    }
                    self.disk.written.push((lsn, record));
                    if self.fsync.is_none() {
                        self.fsync = Some((now + self.fsync_delay, lsn));
                    }
                }
                Event::Apply { seq, entry } => {
                    if let Some(t) = &self.world.borrow().trace {
                        if entry.updates().any(|u| u[..] == t[..]) {
                            let at = now - self.world.borrow().t0.unwrap();
                            eprintln!(
                                "{at:?} {} APPLIES at {seq} parts {:?}",
                                self.me,
                                entry.parts().iter().map(|p| (p.origin.0, p.batch.counter)).collect::<Vec<_>>()
                            );
                        }
                    }
                    if seq != self.state_seq + 1 {
                        self.world
                            .borrow_mut()
                            .violations
                            .push(format!("{} applied {seq} after {}", self.me, self.state_seq));
                    }
                    self.state_seq = seq;
                    self.state_hash = mix(self.state_hash, &entry);
                    let ops: Vec<Op> = entry.updates().filter_map(|u| Op::decode(u).ok()).collect();
                    self.store.apply(seq, ops);
                    let updates = entry.updates().map(|u| u.to_vec()).collect();
                    self.world.borrow_mut().applied(self.me, seq, self.state_hash, updates);
                    if seq % self.compact_every == 0 {
                        self.gup.compact(seq, snapshot_bytes(self.state_hash, &self.store));
                    }
                }
                Event::InstallSnapshot { seq, data } => {
                    let (hash, store) = parse_snapshot(&data);
                    self.store = store;
                    let w = self.world.borrow();
                    if w.canon_hash.get(seq as usize).is_some_and(|&h| h != hash) {
                        drop(w);
                        self.world
                            .borrow_mut()
                            .violations
                            .push(format!("{} installed a snapshot at {seq} unlike the applied history", self.me));
                    } else {
                        drop(w);
                    }
                    self.state_seq = seq;
                    self.state_hash = hash;
                }
                Event::Committed { id, .. } => {
                    self.committed += 1;
                    if let Some((key, value, call)) = self.sets.remove(&id) {
                        let mut w = self.world.borrow_mut();
                        let ret = Some(w.t(now));
                        w.history.push(Operation { key, action: Action::Set(value), call, ret });
                    }
                    if let Some(v) = self.pending.remove(&id) {
                        self.world.borrow_mut().acked.insert(v);
                    }
                }
                Event::Indeterminate { id } => {
                    self.pending.remove(&id);
                    if let Some((key, value, call)) = self.sets.remove(&id) {
                        self.world.borrow_mut().history.push(Operation {
                            key,
                            action: Action::Set(value),
                            call,
                            ret: None,
                        });
                    }
                }
                Event::ReadReady { id, .. } => {
                    if let Some((key, call)) = self.gets.remove(&id) {
                        let value = self.store.get(&key).map(|v| v.value.clone());
                        let mut w = self.world.borrow_mut();
                        let ret = Some(w.t(now));
                        w.history.push(Operation { key, action: Action::Get(value), call, ret });
                    }
                }
                Event::ReadFailed { id } => {
                    self.gets.remove(&id);
                }
            }
        }
        while let Some((to, bytes)) = self.gup.poll_transmit() {
            self.out.push_back((ulnet_sim::NodeId(to.0), bytes));
        }
    }
}

impl Node for SimNode {
    type Msg = Vec<u8>;
    fn handle_message(&mut self, now: Instant, from: ulnet_sim::NodeId, msg: Vec<u8>) {
        self.gup.handle_message(now, NodeId(from.0), &msg);
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some((at, upto)) = self.fsync {
            if at <= now {
                let (done, rest): (Vec<_>, Vec<_>) = self.disk.written.drain(..).partition(|(l, _)| *l <= upto);
                self.disk.durable.extend(done.into_iter().map(|(_, r)| r));
                self.disk.written = rest;
                self.fsync = self.disk.written.last().map(|(l, _)| (now + self.fsync_delay, *l));
                self.gup.handle_durable(now, upto);
            }
        }
        if let (Some(at), Some(every)) = (self.next_submit, self.submit_every) {
            if at <= now {
                let burst = self.rng.gen_range(1..=3);
                for _ in 0..burst {
                    self.submitted += 1;
                    let v = format!("{}:{}", self.me.0, self.submitted).into_bytes();
                    if self.registry_keys == 0 {
                        self.submit_value(now, v);
                        continue;
                    }
                    let key = format!("k{}", self.rng.gen_range(0..self.registry_keys)).into_bytes();
                    let call = self.world.borrow().t(now);
                    if self.rng.gen_bool(0.5) {
                        let op = Op::Set { key: key.clone(), value: v.clone() };
                        if let Some(id) = self.submit_value(now, op.encode()) {
                            self.sets.insert(id, (key, v, call));
                        }
                    } else {
                        let id = self.gup.read(now);
                        self.gets.insert(id, (key, call));
                        self.pump(now);
                    }
                }
                let jitter = self.rng.gen_range(0..=every.as_micros() as u64);
                self.next_submit = Some(now + every / 2 + Duration::from_micros(jitter));
            }
        }
        self.gup.handle_timeout(now);
        self.pump(now);
    }

    fn poll_transmit(&mut self) -> Option<(ulnet_sim::NodeId, Vec<u8>)> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [self.gup.poll_timeout(), self.fsync.map(|f| f.0), self.next_submit].into_iter().flatten().min()
    }
}

/// A cluster of `n` voters in the simulator with a membership oracle.
pub struct Cluster {
    pub sim: Sim<SimNode>,
    pub world: Rc<RefCell<World>>,
    pub voters: Vec<NodeId>,
    pub config: GupConfig,
    view_id: u64,
    members: Vec<NodeId>,
    /// cut[a][b]: a cannot reach b (as far as the oracle knows).
    cut: Vec<Vec<bool>>,
    /// The oracle installs a new view this long after the world changes.
    pub detect: Duration,
    change_at: Option<Instant>,
    force_view: bool,
    /// Probability that a restart finds the log tail corrupted...
    pub corrupt_on_restart: f64,
    /// ... for at most this many restarts of the run. A node with a corrupted tail cannot
    /// stand for what it acknowledged, so with crashes of a minority on top, more than one
    /// in five leaves no healthy majority: the cluster then (rightly) waits.
    pub corrupt_restarts_left: u32,
    /// Print every event about this update (debugging a failing seed).
    pub trace: Option<Vec<u8>>,
}

impl Cluster {
    pub fn new(seed: u64, n: u32, faults: Faults) -> Self {
        Self::with_learners(seed, n, 0, faults)
    }

    /// `n` voters and `learners` more nodes that start with empty logs (joining nodes);
    /// the learners are not in the first view.
    pub fn with_learners(seed: u64, n: u32, learners: u32, faults: Faults) -> Self {
        let mut sim = Sim::new(seed, faults);
        let world = Rc::new(RefCell::new(World::default()));
        let voters: Vec<NodeId> = (0..n).map(NodeId).collect();
        let config = GupConfig::sim();
        let now = sim.now();
        for i in 0..n + learners {
            let gup = if i < n {
                Gup::bootstrap(NodeId(i), voters.clone(), config.clone(), now)
            } else {
                Gup::recover(NodeId(i), voters.clone(), config.clone(), Recovered::default(), now)
            };
            sim.add_node(SimNode::new(gup, world.clone(), seed.wrapping_mul(1000) + i as u64, now));
        }
        let mut c = Self {
            sim,
            world,
            voters: voters.clone(),
            config,
            view_id: 0,
            members: Vec::new(),
            cut: vec![vec![false; (n + learners) as usize]; (n + learners) as usize],
            detect: Duration::from_millis(15),
            change_at: None,
            force_view: false,
            corrupt_on_restart: 0.0,
            corrupt_restarts_left: 1,
            trace: None,
        };
        c.install_view(voters);
        c
    }

    pub fn n(&self) -> u32 {
        self.sim.node_count() as u32
    }

    pub fn node(&self, i: u32) -> Option<&SimNode> {
        self.sim.node(ulnet_sim::NodeId(i))
    }

    pub fn node_mut(&mut self, i: u32) -> Option<&mut SimNode> {
        self.sim.node_mut(ulnet_sim::NodeId(i))
    }

    pub fn flush(&mut self, i: u32) {
        self.sim.flush(ulnet_sim::NodeId(i));
    }

    pub fn install_view(&mut self, members: Vec<NodeId>) {
        self.view_id += 1;
        self.members = members.clone();
        let view = View::new(self.view_id, members);
        let now = self.sim.now();
        for i in 0..self.n() {
            if let Some(node) = self.node_mut(i) {
                node.view(now, view.clone());
                self.flush(i);
            }
        }
    }

    /// The live nodes of the largest symmetric-connected component, if it is a majority.
    fn desired_members(&self) -> Option<Vec<NodeId>> {
        let n = self.n() as usize;
        let live: Vec<bool> = (0..n).map(|i| !self.sim.is_crashed(ulnet_sim::NodeId(i as u32))).collect();
        let mut best: Vec<usize> = Vec::new();
        let mut seen = vec![false; n];
        for start in 0..n {
            if !live[start] || seen[start] {
                continue;
            }
            let mut comp = vec![start];
            seen[start] = true;
            let mut i = 0;
            while i < comp.len() {
                let a = comp[i];
                for b in 0..n {
                    if live[b] && !seen[b] && !self.cut[a][b] && !self.cut[b][a] {
                        seen[b] = true;
                        comp.push(b);
                    }
                }
                i += 1;
            }
            if comp.len() > best.len() {
                best = comp;
            }
        }
        let voters_in = best.iter().filter(|&&i| i < self.voters.len()).count();
        if voters_in * 2 > self.voters.len() {
            best.sort_unstable();
            Some(best.into_iter().map(|i| NodeId(i as u32)).collect())
        } else {
            None
        }
    }

    pub fn apply(&mut self, change: &WorldChange) {
        let now = self.sim.now();
        let config = self.config.clone();
        let voters = self.voters.clone();
        let corrupt = self.corrupt_on_restart;
        let mut corrupt_left = self.corrupt_restarts_left;
        match change {
            WorldChange::Partition { side_a, side_b } => {
                for a in side_a {
                    for b in side_b {
                        self.cut[a.0 as usize][b.0 as usize] = true;
                        self.cut[b.0 as usize][a.0 as usize] = true;
                    }
                }
            }
            WorldChange::PartitionOneWay { from, to } => {
                for a in from {
                    for b in to {
                        self.cut[a.0 as usize][b.0 as usize] = true;
                    }
                }
            }
            WorldChange::Heal => self.cut.iter_mut().for_each(|r| r.iter_mut().for_each(|c| *c = false)),
            WorldChange::Restart(_) => self.force_view = true,
            _ => {}
        }
        let mut rng_draw = StdRng::seed_from_u64(self.sim.random_below(u64::MAX));
        self.sim.apply(change, &mut |id, old| {
            let old = old.expect("a restarted node was crashed by the plan");
            let lose = corrupt_left > 0 && corrupt > 0.0 && rng_draw.gen_bool(corrupt);
            corrupt_left -= lose as u32;
            // The node gets its first view when the oracle re-admits it (a view installed
            // after the restart, as a membership join gives).
            let _ = id;
            SimNode::restart(old, voters.clone(), config.clone(), now, lose)
        });
        self.corrupt_restarts_left = corrupt_left;
        self.change_at = Some(now);
    }

    /// Runs until `until`, installing views as the oracle sees fit, checking the world
    /// after every step.
    pub fn run_until(&mut self, until: Instant) -> Result<(), Violation> {
        if let Some(t) = &self.trace {
            self.world.borrow_mut().trace = Some(t.clone());
        }
        let step = Duration::from_millis(1);
        while self.sim.now() < until {
            let next = (self.sim.now() + step).min(until);
            let world = self.world.clone();
            self.sim.run_until(next, |_| match world.borrow().violations.first() {
                Some(v) => Err(v.clone()),
                None => Ok(()),
            })?;
            if let Some(at) = self.change_at {
                if at + self.detect <= self.sim.now() {
                    self.change_at = None;
                    if let Some(members) = self.desired_members() {
                        if members != self.members || self.force_view {
                            self.force_view = false;
                            self.install_view(members);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    pub fn run_for(&mut self, d: Duration) -> Result<(), Violation> {
        let until = self.sim.now() + d;
        self.run_until(until)
    }

    /// Runs a plan: its changes at their times, then its settle time.
    pub fn run_plan(&mut self, plan: &FaultPlan, quiet: Duration) -> Result<(), Violation> {
        let start = self.sim.start();
        for (at, change) in &plan.changes {
            self.run_until(start + *at)?;
            if *at >= quiet {
                for i in 0..self.n() {
                    if let Some(n) = self.node_mut(i) {
                        n.stop_client();
                    }
                }
            }
            self.apply(change);
            if *at >= quiet {
                for i in 0..self.n() {
                    if let Some(n) = self.node_mut(i) {
                        n.stop_client();
                    }
                }
            }
        }
        self.run_until(start + plan.end)
    }

    pub fn start_clients(&mut self, every: Duration) {
        let now = self.sim.now();
        for i in 0..self.n() {
            if let Some(n) = self.node_mut(i) {
                n.start_client(every, now);
            }
        }
    }

    /// After everything healed and settled: every node applied the same, every acknowledged
    /// update is applied exactly once, and no log holds an update that was not applied.
    pub fn check_settled(&self) -> Result<(), String> {
        let w = self.world.borrow();
        if let Some(v) = w.violations.first() {
            return Err(v.clone());
        }
        let applied: Vec<(u32, u64)> =
            (0..self.n()).filter_map(|i| self.node(i).map(|n| (i, n.gup.applied()))).collect();
        let top = applied.iter().map(|a| a.1).max().unwrap_or(0);
        if let Some((i, a)) = applied.iter().find(|a| a.1 != top) {
            return Err(format!("n{i} applied up to {a}, others up to {top}: not converged"));
        }
        let mut count: HashMap<&[u8], u32> = HashMap::new();
        for updates in &w.canon {
            for u in updates {
                *count.entry(u.as_slice()).or_default() += 1;
            }
        }
        if let Some((u, c)) = count.iter().find(|(_, c)| **c > 1) {
            return Err(format!("{:?} applied {c} times", String::from_utf8_lossy(u)));
        }
        for a in &w.acked {
            if !count.contains_key(a.as_slice()) {
                return Err(format!(
                    "acknowledged update {:?} is not in the applied history",
                    String::from_utf8_lossy(a)
                ));
            }
        }
        for i in 0..self.n() {
            let Some(n) = self.node(i) else { continue };
            for (seq, entry) in n.gup.log_entries() {
                for u in entry.updates() {
                    if !count.contains_key(&u[..]) {
                        return Err(format!(
                            "n{i} holds {:?} at {seq}, which was never applied (a trace of a failed update)",
                            String::from_utf8_lossy(u)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn applied_values(&self) -> BTreeMap<Vec<u8>, u64> {
        let w = self.world.borrow();
        let mut m = BTreeMap::new();
        for (seq, updates) in w.canon.iter().enumerate() {
            for u in updates {
                m.insert(u.clone(), seq as u64);
            }
        }
        m
    }
}

/// A fault plan for `n` nodes: crashes (at most a minority), restarts, partitions, loss.
pub fn plan(seed: u64, n: u32, duration: Duration) -> FaultPlan {
    let mut config = FaultPlanConfig::standard(n, duration);
    config.settle = Duration::from_millis(600);
    FaultPlan::random(seed, &config, Faults::default())
}
