//! GUP nodes inside the simulator, with a membership service in front of them.
//!
//! Each simulated node slot runs the state machine over a simulated disk (group-commit
//! fsync; of the bytes written but not yet fsynced a crash leaves any prefix — a write torn
//! anywhere, sometimes followed by the zeros of a file extended for it — read back by the
//! write-ahead log's own reader, which must cut it as a torn tail; a durable snapshot record
//! deletes the records before it, as the real write-ahead log deletes older segments), a
//! client that submits updates (plain ones, or registry sets and gets), and takes the views
//! a membership oracle hands it. A disk can be made full: the next fsync fails, and the
//! node does what `ulnet node`'s registry does — stops, drops what it had not fsynced, tries
//! the disk again every [`DISK_RETRY`] and, once it takes writes, starts a new machine from
//! its log in place, under the same identity and in the latest view. Every node reports what it applies to a shared [`World`],
//! which checks total order at every step.
//!
//! The oracle behaves like the membership service: after a change of the world (crash,
//! restart, join, partition, heal) it chooses the next view — the live nodes of the largest
//! connected component — only when that keeps a quorum of the previous view (more than
//! half, or exactly half with the lowest member), and every node it can reach installs it
//! after its own small delay; a node cut off keeps its old view until it is reached again.
//! A node that restarts with its log gets back the view it had (as `ulnet node` resumes
//! its membership); a node whose log lost its tail comes back under a new identity, and the
//! next view replaces the old one. Slots that start late are joiners. In `chaos` mode the
//! oracle also hands random, disagreeing views to random nodes: safety must not depend on
//! views.
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
use ulnet_registry::wal::record::frame_record;
use ulnet_registry::wal::{read_segment, TailKind};
use ulnet_sim::{Faults, Node, Sim, Violation, WorldChange};

use ulnet_sim::NodeId as SlotId;

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
    /// Torn tails the write-ahead log's reader cut at restarts.
    pub torn_tails_cut: u64,
    /// Which slot an identity lives in (identities of restarted nodes stay mapped to their
    /// slot: messages to an old identity reach whoever lives there now, as they would reach
    /// the same address).
    pub slot_of: HashMap<NodeId, u32>,
}

impl World {
    fn t(&self, now: Instant) -> u64 {
        (now - self.t0.expect("set at start")).as_nanos() as u64
    }

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
    if let Entry::Config(c) = entry {
        for n in c.all() {
            x = (x ^ n.0).wrapping_mul(0x100_0000_01b3);
        }
    }
    for u in entry.updates() {
        for &b in u.iter() {
            x = (x ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        x = x.rotate_left(17).wrapping_mul(0xff51_afd7_ed55_8ccd);
    }
    x.wrapping_add(1)
}

/// How often a node stopped by its full disk tries it again (the service's
/// `DISK_RETRY_INTERVAL`, on the simulator's time scale).
pub const DISK_RETRY: Duration = Duration::from_millis(20);

/// The simulated disk: fsynced records and records written but not yet fsynced.
#[derive(Clone, Default)]
pub struct Disk {
    pub durable: Vec<Record>,
    pub written: Vec<(u64, Record)>,
}

impl Disk {
    /// Everything written up to `lsn` is now durable.
    fn fsync(&mut self, lsn: u64) {
        let rest = self.written.split_off(self.written.partition_point(|(l, _)| *l <= lsn));
        let done = std::mem::replace(&mut self.written, rest);
        self.durable.extend(done.into_iter().map(|(_, r)| r));
        self.drop_before_snapshot();
    }

    /// A durable snapshot record deletes every record before it (the write-ahead log removes
    /// the older segments).
    fn drop_before_snapshot(&mut self) {
        if let Some(at) = self.durable.iter().rposition(|r| matches!(r, Record::Snapshot { .. })) {
            self.durable.drain(..at);
        }
    }

    /// What a crash leaves on this disk, read back as the write-ahead log reads it: the
    /// fsynced records, then any prefix of the bytes written after them — now and then the
    /// file was extended for the write and the part that never reached the disk reads as
    /// zeros from a sector boundary. The reader must cut that as a torn tail.
    fn after_crash(&self, rng: &mut StdRng) -> Result<(Vec<Record>, bool), String> {
        let mut bytes = Vec::new();
        for r in &self.durable {
            frame_record(r, &mut bytes);
        }
        let durable_len = bytes.len();
        for (_, r) in &self.written {
            frame_record(r, &mut bytes);
        }
        let end = bytes.len();
        let keep = rng.gen_range(durable_len..=end);
        if keep < end && rng.gen_ratio(1, 3) {
            // Extended to whole 4 KiB blocks; zeros from the sector where the write stopped.
            let zeros_from = (keep / 512 * 512).max(durable_len);
            bytes.resize(end.div_ceil(4096) * 4096, 0);
            bytes[zeros_from..].iter_mut().for_each(|b| *b = 0);
        } else {
            bytes.truncate(keep);
        }
        let segment = read_segment(&bytes, true);
        match segment.end {
            Some(e) if e.kind == TailKind::Corrupt => Err(format!(
                "a write torn at byte {keep} of {end} (fsynced up to {durable_len}) read as corruption at {}: {}",
                e.offset, e.error
            )),
            end => Ok((segment.records, end.is_some())),
        }
    }
}

/// The registry state a host rebuilds from its log: the last snapshot in it (position,
/// hash of the history, store).
fn state_from(records: &[Record]) -> (u64, u64, Store) {
    let (mut seq, mut hash, mut store) = (0, 0, Store::default());
    for r in records {
        if let Record::Snapshot { snapshot, .. } = r {
            seq = snapshot.seq;
            (hash, store) = parse_snapshot(&snapshot.data);
        }
    }
    (seq, hash, store)
}

pub struct SimNode {
    pub gup: Gup,
    pub me: NodeId,
    disk: Disk,
    fsync: Option<(Instant, u64)>,
    fsync_delay: Duration,
    state_hash: u64,
    state_seq: u64,
    out: VecDeque<(SlotId, (u64, Vec<u8>))>,
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
    /// The last view installed (a node that restarts with its log gets it back).
    pub last_view: Option<View>,
    /// A name for values this node submits that stays the same across identities.
    slot: u32,
    config: GupConfig,
    /// The disk refuses writes: the next fsync fails.
    pub disk_full: bool,
    /// Stopped by a failed fsync: when the disk is tried again.
    stopped: Option<Instant>,
    /// Times a failed fsync stopped the node, and times it started again in place.
    pub disk_failures: u64,
    pub restarts: u64,
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
    pub fn new(gup: Gup, config: GupConfig, slot: u32, world: Rc<RefCell<World>>, rng: StdRng, now: Instant) -> Self {
        world.borrow_mut().t0.get_or_insert(now);
        world.borrow_mut().slot_of.insert(gup.id(), slot);
        let mut n = Self::new_inner(gup, config, slot, world, rng);
        n.pump(now);
        n
    }

    /// A restarted node: durable records, plus what the write-ahead log's reader keeps of
    /// a torn prefix of what was written but not fsynced (see [`Disk::after_crash`]); with
    /// `lose_tail`, the last durable records are lost to corruption instead and the node
    /// comes back as `new_identity`.
    pub fn restart(old: SimNode, config: GupConfig, now: Instant, lose_tail: Option<NodeId>) -> Self {
        {
            // The crashed node's clients never learn how their sets ended.
            let mut w = old.world.borrow_mut();
            for (_, (key, value, call)) in old.sets {
                w.history.push(Operation { key, action: Action::Set(value), call, ret: None });
            }
        }
        let mut rng = old.rng;
        let mut disk = old.disk;
        let mut lost_tail = false;
        if lose_tail.is_some() && !disk.durable.is_empty() {
            let cut = rng.gen_range(1..=disk.durable.len().min(8));
            disk.durable.truncate(disk.durable.len() - cut);
            lost_tail = true;
        } else {
            match disk.after_crash(&mut rng) {
                Ok((records, torn)) => {
                    disk.durable = records;
                    old.world.borrow_mut().torn_tails_cut += u64::from(torn);
                }
                Err(what) => old.world.borrow_mut().violations.push(format!("{}: {what}", old.me)),
            }
            disk.written.clear();
            disk.drop_before_snapshot();
        }
        let records = disk.durable.clone();
        let (seq, hash, store) = state_from(&records);
        let me = lose_tail.unwrap_or(old.me);
        let gup = Gup::recover(me, config.clone(), Recovered { records: records.clone(), lost_tail }, now);
        let mut n = SimNode::new_inner(gup, config, old.slot, old.world, rng);
        n.world.borrow_mut().slot_of.insert(me, old.slot);
        n.disk.durable = records;
        n.disk_full = old.disk_full;
        n.disk_failures = old.disk_failures;
        n.restarts = old.restarts;
        n.state_seq = seq;
        n.state_hash = hash;
        n.store = store;
        n.registry_keys = old.registry_keys;
        n.submit_every = old.submit_every;
        n.next_submit = old.submit_every.map(|d| now + d);
        n.submitted = old.submitted;
        n.pump(now);
        if lose_tail.is_none() {
            // `ulnet node` resumes its membership: the view it had comes back with it.
            if let Some(v) = old.last_view {
                n.view(now, v);
            }
        }
        n
    }

    fn new_inner(gup: Gup, config: GupConfig, slot: u32, world: Rc<RefCell<World>>, rng: StdRng) -> Self {
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
            last_view: None,
            slot,
            config,
            disk_full: false,
            stopped: None,
            disk_failures: 0,
            restarts: 0,
        }
    }

    /// Whether a failed fsync stopped the node (until its disk takes writes again).
    pub fn stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// An fsync failed: as `ulnet node`'s registry, stop — drop what was written but not
    /// fsynced (the cut back to the durable mark), refuse the clients waiting — and try the
    /// disk again later.
    fn stop_for_disk(&mut self, now: Instant) {
        self.disk.written.clear();
        self.fsync = None;
        self.stopped = Some(now + DISK_RETRY);
        self.disk_failures += 1;
        let mut w = self.world.borrow_mut();
        for (_, (key, value, call)) in self.sets.drain() {
            // Refused after it was submitted: it may still take effect.
            w.history.push(Operation { key, action: Action::Set(value), call, ret: None });
        }
        self.gets.clear();
        self.pending.clear();
    }

    /// The disk takes writes again: a new machine from the durable log, under the same
    /// identity, in the latest view.
    fn restart_in_place(&mut self, now: Instant) {
        let records = self.disk.durable.clone();
        (self.state_seq, self.state_hash, self.store) = state_from(&records);
        self.gup = Gup::recover(self.me, self.config.clone(), Recovered { records, lost_tail: false }, now);
        self.stopped = None;
        self.restarts += 1;
        self.pump(now);
        if let Some(v) = self.last_view.clone() {
            self.view(now, v);
        }
        self.next_submit = self.submit_every.map(|d| now + d);
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
        if self.last_view.as_ref().is_none_or(|v| v.id < view.id) {
            self.last_view = Some(view.clone());
        }
        if self.stopped.is_none() {
            self.gup.handle_view(now, view);
            self.pump(now);
        }
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
                            eprintln!("{at:?} {} APPLIES at {seq}", self.me);
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
                    self.store.apply(seq, ops, |_, _| {});
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
                    let unlike = w.canon_hash.get(seq as usize).is_some_and(|&h| h != hash);
                    drop(w);
                    if unlike {
                        self.world
                            .borrow_mut()
                            .violations
                            .push(format!("{} installed a snapshot at {seq} unlike the applied history", self.me));
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
        let me = self.me.0;
        while let Some((to, bytes)) = self.gup.poll_transmit() {
            if let Some(&slot) = self.world.borrow().slot_of.get(&to) {
                self.out.push_back((SlotId(slot), (me, bytes)));
            }
        }
    }
}

impl Node for SimNode {
    type Msg = (u64, Vec<u8>);
    fn handle_message(&mut self, now: Instant, _from: SlotId, (from, msg): (u64, Vec<u8>)) {
        if self.stopped.is_some() {
            return;
        }
        self.gup.handle_message(now, NodeId(from), &msg);
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(retry) = self.stopped {
            if retry <= now {
                if self.disk_full {
                    self.stopped = Some(now + DISK_RETRY);
                } else {
                    self.restart_in_place(now);
                }
            }
            return;
        }
        if let Some((at, upto)) = self.fsync {
            if at <= now && self.disk_full {
                self.stop_for_disk(now);
                return;
            }
            if at <= now {
                self.disk.fsync(upto);
                self.fsync = self.disk.written.last().map(|(l, _)| (now + self.fsync_delay, *l));
                self.gup.handle_durable(now, upto);
            }
        }
        if let (Some(at), Some(every)) = (self.next_submit, self.submit_every) {
            if at <= now {
                let burst = self.rng.gen_range(1..=3);
                for _ in 0..burst {
                    self.submitted += 1;
                    let v = format!("{}:{}", self.slot, self.submitted).into_bytes();
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

    fn poll_transmit(&mut self) -> Option<(SlotId, (u64, Vec<u8>))> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped.is_some() {
            return self.stopped;
        }
        [self.gup.poll_timeout(), self.fsync.map(|f| f.0), self.next_submit].into_iter().flatten().min()
    }
}

/// A cluster in the simulator with a membership oracle (see the module documentation).
pub struct Cluster {
    pub sim: Sim<SimNode>,
    pub world: Rc<RefCell<World>>,
    pub config: GupConfig,
    /// Each slot's current identity.
    pub identities: Vec<NodeId>,
    /// Slots started at least once (the others are joiners still to come).
    started: Vec<bool>,
    /// The views chosen so far, in order.
    pub views: Vec<View>,
    /// cut[a][b]: a cannot reach b.
    cut: Vec<Vec<bool>>,
    /// The oracle chooses a new view this long after the world changes.
    pub detect: Duration,
    change_at: Option<Instant>,
    /// Views on their way to nodes: (when, slot, view).
    deliveries: Vec<(Instant, u32, View)>,
    /// Probability that a restart finds the log tail corrupted...
    pub corrupt_on_restart: f64,
    /// ... for at most this many restarts of the run (with more, a quorum of the voters may
    /// have lost their logs — data loss beyond what any protocol survives).
    pub corrupt_restarts_left: u32,
    /// The voting configuration each crashed node held when it crashed.
    crashed_configs: Vec<Option<ulnet_registry::gup::VotingConfig>>,
    /// Random, disagreeing views handed to random nodes, this many per simulated second.
    pub chaos_views_per_s: f64,
    chaos_id: u64,
    rng: StdRng,
    /// Registry keys the clients work on (0: plain updates), for nodes started later too.
    registry_keys: u32,
    /// The clients' submission period while they run.
    client_every: Option<Duration>,
    /// Slots whose disk refuses writes (kept across crashes: the disk stays full).
    full: Vec<bool>,
    /// Print every event about this update (debugging a failing seed; also taken from
    /// `ULNET_TRACE_VALUE`).
    pub trace: Option<Vec<u8>>,
}

impl Cluster {
    /// `n` nodes that start together as the first voters.
    pub fn new(seed: u64, n: u32, faults: Faults) -> Self {
        Self::with_joiners(seed, n, 0, faults)
    }

    /// `n` nodes that start together as the first voters, and `joiners` more slots that
    /// start later (when a plan restarts them), with empty logs. Identities are random, so
    /// that the lowest member (the locker) is sometimes a joiner or a node that came back
    /// under a new identity.
    pub fn with_joiners(seed: u64, n: u32, joiners: u32, faults: Faults) -> Self {
        Self::build(seed, n, joiners, faults, false)
    }

    /// Like [`Cluster::with_joiners`], with identities in slot order (slot 0 locks first).
    pub fn ordered(seed: u64, n: u32, joiners: u32, faults: Faults) -> Self {
        Self::build(seed, n, joiners, faults, true)
    }

    fn build(seed: u64, n: u32, joiners: u32, faults: Faults, ordered: bool) -> Self {
        let mut sim = Sim::new(seed, faults);
        let world = Rc::new(RefCell::new(World::default()));
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0bad_5eed);
        let total = n + joiners;
        let mut identities: Vec<NodeId> = Vec::new();
        while identities.len() < total as usize {
            let id = if ordered { NodeId(identities.len() as u64 + 1) } else { NodeId(rng.gen_range(1..1_000_000)) };
            if !identities.contains(&id) {
                identities.push(id);
            }
        }
        let voters: Vec<NodeId> = identities[..n as usize].to_vec();
        let config = GupConfig::sim();
        let now = sim.now();
        for slot in 0..total {
            let id = identities[slot as usize];
            let gup = if slot < n {
                Gup::bootstrap(id, voters.clone(), config.clone(), now)
            } else {
                Gup::recover(id, config.clone(), Recovered::default(), now)
            };
            let node_rng = StdRng::seed_from_u64(seed.wrapping_mul(1000) + slot as u64);
            sim.add_node(SimNode::new(gup, config.clone(), slot, world.clone(), node_rng, now));
        }
        for slot in n..total {
            // Joiners wait, crashed, for the plan to start them.
            sim.apply(&WorldChange::Crash(SlotId(slot)), &mut |_, _, _| unreachable!());
        }
        let mut c = Self {
            sim,
            world,
            config,
            identities,
            started: (0..total).map(|s| s < n).collect(),
            views: Vec::new(),
            cut: vec![vec![false; total as usize]; total as usize],
            detect: Duration::from_millis(15),
            change_at: None,
            deliveries: Vec::new(),
            corrupt_on_restart: 0.0,
            corrupt_restarts_left: 1,
            crashed_configs: vec![None; total as usize],
            full: vec![false; total as usize],
            chaos_views_per_s: 0.0,
            chaos_id: 1_000_000,
            rng,
            registry_keys: 0,
            client_every: None,
            trace: std::env::var("ULNET_TRACE_VALUE").ok().map(String::into_bytes),
        };
        c.install_view_now(voters);
        c
    }

    pub fn n(&self) -> u32 {
        self.sim.node_count() as u32
    }

    pub fn node(&self, slot: u32) -> Option<&SimNode> {
        self.sim.node(SlotId(slot))
    }

    pub fn node_mut(&mut self, slot: u32) -> Option<&mut SimNode> {
        self.sim.node_mut(SlotId(slot))
    }

    pub fn flush(&mut self, slot: u32) {
        self.sim.flush(SlotId(slot));
    }

    /// The slot of the locker of the latest view.
    pub fn locker_slot(&self) -> u32 {
        let id = self.views.last().and_then(|v| v.locker()).expect("a view");
        self.world.borrow().slot_of[&id]
    }

    /// Makes the disk of `slot` refuse writes, or take them again (a crashed node finds its
    /// disk so when it restarts).
    pub fn set_disk_full(&mut self, slot: u32, full: bool) {
        self.full[slot as usize] = full;
        if let Some(n) = self.node_mut(slot) {
            n.disk_full = full;
        }
    }

    /// Installs a view of `members` (identities) at every live node at once.
    pub fn install_view_now(&mut self, members: Vec<NodeId>) {
        let id = self.views.last().map_or(1, |v| v.id + 1);
        let view = View::new(id, members);
        self.views.push(view.clone());
        let now = self.sim.now();
        for slot in 0..self.n() {
            if let Some(node) = self.node_mut(slot) {
                node.view(now, view.clone());
                self.flush(slot);
            }
        }
    }

    fn live(&self, slot: usize) -> bool {
        self.started[slot] && !self.sim.is_crashed(SlotId(slot as u32))
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        !self.cut[a][b] && !self.cut[b][a]
    }

    /// The largest connected component of live slots.
    fn component(&self) -> Vec<usize> {
        let n = self.n() as usize;
        let mut best: Vec<usize> = Vec::new();
        let mut seen = vec![false; n];
        for start in 0..n {
            if !self.live(start) || seen[start] {
                continue;
            }
            let mut comp = vec![start];
            seen[start] = true;
            let mut i = 0;
            while i < comp.len() {
                let a = comp[i];
                let reached: Vec<usize> =
                    (0..n).filter(|&b| self.live(b) && !seen[b] && self.connected(a, b)).collect();
                for b in reached {
                    seen[b] = true;
                    comp.push(b);
                }
                i += 1;
            }
            if comp.len() > best.len() {
                best = comp;
            }
        }
        best.sort_unstable();
        best
    }

    /// Chooses the next view as membership would, and sends it on its way.
    fn choose_view(&mut self) {
        let comp = self.component();
        let members: Vec<NodeId> = comp.iter().map(|&s| self.identities[s]).collect();
        let prev = self.views.last().expect("a first view").clone();
        let kept = prev.members.iter().filter(|m| members.contains(m)).count();
        let lowest_kept = prev.locker().is_some_and(|l| members.contains(&l));
        let quorum = 2 * kept > prev.members.len() || (2 * kept == prev.members.len() && kept >= 2 && lowest_kept);
        let view = View::new(prev.id + 1, members.clone());
        if !quorum || view.members == prev.members || members.is_empty() {
            return;
        }
        self.views.push(view.clone());
        self.deliver(&comp, &view);
    }

    /// `view` reaches the nodes of `comp` and those of the previous views it can reach.
    fn deliver(&mut self, comp: &[usize], view: &View) {
        let now = self.sim.now();
        for slot in 0..self.n() as usize {
            if !self.live(slot) {
                continue;
            }
            let reachable = comp.contains(&slot) || comp.iter().any(|&c| self.connected(c, slot));
            if reachable {
                let delay = Duration::from_micros(self.rng.gen_range(0..3000));
                self.deliveries.push((now + delay, slot as u32, view.clone()));
            }
        }
    }

    pub fn apply(&mut self, change: &WorldChange) {
        let now = self.sim.now();
        let config = self.config.clone();
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
            _ => {}
        }
        let corrupt = self.corrupt_on_restart;
        let mut corrupt_left = self.corrupt_restarts_left;
        let mut new_identities: Vec<(usize, NodeId)> = Vec::new();
        let mut fresh_id = self.rng.gen_range(1..1_000_000u64);
        while self.identities.contains(&NodeId(fresh_id)) {
            fresh_id += 1;
        }
        let mut first_starts: Vec<usize> = Vec::new();
        let started = self.started.clone();
        let full = self.full.clone();
        let mut rng_draw = StdRng::seed_from_u64(self.sim.random_below(u64::MAX));
        let mut restarted: Vec<usize> = Vec::new();
        // The smallest voter set of any configuration a node holds (crashed ones too).
        if let WorldChange::Crash(slot) = change {
            let config = self.node(slot.0).and_then(|n| n.gup.voting_config().cloned());
            self.crashed_configs[slot.0 as usize] = config;
        }
        let view_len = self.views.last().map_or(0, |v| v.members.len());
        let sets_min = {
            let mut min = usize::MAX;
            for slot in 0..self.n() {
                let config = match self.node(slot) {
                    Some(n) => n.gup.voting_config().cloned(),
                    None => self.crashed_configs[slot as usize].clone(),
                };
                if let Some(c) = config {
                    min = min.min(c.voters.len());
                    if let Some(p) = &c.previous {
                        min = min.min(p.len());
                    }
                }
            }
            min
        };
        self.sim.apply(change, &mut |slot, old, now| {
            let old = old.expect("a restarted node was crashed");
            restarted.push(slot.0 as usize);
            if !started[slot.0 as usize] {
                first_starts.push(slot.0 as usize);
                return old;
            }
            // A configuration of two cannot lose one voter's log and go on (no protocol can:
            // the lost log may have held what the other lacks); lose a log only where every
            // configuration in sight keeps a quorum without it.
            // (Membership needs the same of its view: one of two members is no quorum.)
            let lose =
                corrupt_left > 0 && corrupt > 0.0 && sets_min >= 3 && view_len >= 3 && rng_draw.gen_bool(corrupt);
            corrupt_left -= lose as u32;
            let identity = lose.then_some(NodeId(fresh_id));
            if let Some(id) = identity {
                new_identities.push((slot.0 as usize, id));
            }
            let mut n = SimNode::restart(old, config.clone(), now, identity);
            n.disk_full = full[slot.0 as usize];
            n
        });
        for s in first_starts {
            self.started[s] = true;
        }
        for s in restarted {
            // Clients run on the restarted node as on every other one: while the run has them.
            let (keys, every) = (self.registry_keys, self.client_every);
            if let Some(n) = self.node_mut(s as u32) {
                n.registry_keys = keys;
                match every {
                    Some(every) => n.start_client(every, now),
                    None => n.stop_client(),
                }
            }
        }
        for (slot, id) in new_identities {
            self.identities[slot] = id;
        }
        self.corrupt_restarts_left = corrupt_left;
        self.change_at = Some(now);
        if matches!(change, WorldChange::Heal) {
            // Nodes cut off catch up with the newest view from any datagram.
            let comp = self.component();
            if let Some(v) = self.views.last().cloned() {
                self.deliver(&comp, &v);
            }
        }
    }

    fn chaos(&mut self) {
        if self.chaos_views_per_s <= 0.0 || !self.rng.gen_bool((self.chaos_views_per_s / 1000.0).min(1.0)) {
            return;
        }
        let slot = self.rng.gen_range(0..self.n());
        if !self.live(slot as usize) {
            return;
        }
        let members: Vec<NodeId> = (0..self.n() as usize)
            .filter(|&s| self.started[s] && self.rng.gen_bool(0.6))
            .map(|s| self.identities[s])
            .collect();
        if members.is_empty() {
            return;
        }
        self.chaos_id += self.rng.gen_range(1..3);
        let view = View::new(self.chaos_id, members);
        let now = self.sim.now();
        self.deliveries.push((now, slot, view));
    }

    /// Ends chaos: a view of the live, connected nodes, numbered above every chaotic one,
    /// reaches everyone.
    pub fn end_chaos(&mut self) {
        self.chaos_views_per_s = 0.0;
        let comp = self.component();
        let members: Vec<NodeId> = comp.iter().map(|&s| self.identities[s]).collect();
        let id = self.chaos_id.max(self.views.last().map_or(0, |v| v.id)) + 1;
        let view = View::new(id, members);
        self.views.push(view.clone());
        self.deliver(&comp, &view);
    }

    /// Runs until `until`, delivering views as the oracle sees fit, checking the world
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
            let now = self.sim.now();
            let (due, later): (Vec<_>, Vec<_>) = self.deliveries.drain(..).partition(|(t, _, _)| *t <= now);
            self.deliveries = later;
            for (_, slot, view) in due {
                if let Some(node) = self.node_mut(slot) {
                    node.view(now, view);
                    self.flush(slot);
                }
            }
            self.chaos();
            if let Some(at) = self.change_at {
                if at + self.detect <= now {
                    self.change_at = None;
                    self.choose_view();
                }
            }
        }
        Ok(())
    }

    pub fn run_for(&mut self, d: Duration) -> Result<(), Violation> {
        let until = self.sim.now() + d;
        self.run_until(until)
    }

    /// Runs a plan: its changes at their times, then its settle time; clients stop at
    /// `quiet`.
    pub fn run_plan(&mut self, plan: &Plan, quiet: Duration) -> Result<(), Violation> {
        let start = self.sim.start();
        for (at, change) in &plan.changes {
            self.run_until(start + *at)?;
            if *at >= quiet {
                self.stop_clients();
                if self.chaos_views_per_s > 0.0 {
                    self.apply(change);
                    self.end_chaos();
                    continue;
                }
            }
            self.apply(change);
        }
        self.run_until(start + plan.end)
    }

    /// Clients work on `keys` registry keys (sets and linearizable gets) instead of plain
    /// updates.
    pub fn set_registry_keys(&mut self, keys: u32) {
        self.registry_keys = keys;
        for i in 0..self.n() {
            if let Some(n) = self.node_mut(i) {
                n.registry_keys = keys;
            }
        }
    }

    pub fn start_clients(&mut self, every: Duration) {
        self.client_every = Some(every);
        let now = self.sim.now();
        for i in 0..self.n() {
            if let Some(n) = self.node_mut(i) {
                n.start_client(every, now);
            }
        }
    }

    pub fn stop_clients(&mut self) {
        self.client_every = None;
        for i in 0..self.n() {
            if let Some(n) = self.node_mut(i) {
                n.stop_client();
            }
        }
    }

    /// After everything healed and settled: every member of the last view applied the
    /// same, every acknowledged update is applied exactly once, no log holds an update that
    /// was not applied, and the voting configuration is the last view.
    pub fn check_settled(&self) -> Result<(), String> {
        let w = self.world.borrow();
        if let Some(v) = w.violations.first() {
            return Err(v.clone());
        }
        let last = self.views.last().expect("a view");
        let members: Vec<(u32, &SimNode)> =
            (0..self.n()).filter_map(|i| self.node(i).map(|n| (i, n))).filter(|(_, n)| last.contains(n.me)).collect();
        if members.len() != last.members.len() {
            return Err(format!("the last view {:?} has members that are not running", last.members));
        }
        let top = members.iter().map(|(_, n)| n.gup.applied()).max().unwrap_or(0);
        if let Some((i, n)) = members.iter().find(|(_, n)| n.gup.applied() != top) {
            return Err(format!(
                "slot {i} ({}) applied up to {}, others up to {top}: not converged\n{}",
                n.me,
                n.gup.applied(),
                self.describe()
            ));
        }
        for (i, n) in &members {
            let config = n.gup.applied_config().map(|c| c.to_string()).unwrap_or_default();
            let want = ulnet_registry::gup::VotingConfig::new(last.members.clone()).to_string();
            if config != want {
                return Err(format!(
                    "slot {i} votes with {config}, the view is {want}: configuration did not follow\n{}",
                    self.describe()
                ));
            }
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
                            "slot {i} holds {:?} at {seq}, which was never applied (a trace of a failed update)",
                            String::from_utf8_lossy(u)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every node's protocol state, one line each (for failure messages).
    pub fn describe(&self) -> String {
        let mut out = format!("views: {:?}\n", self.views.iter().rev().take(3).collect::<Vec<_>>());
        for i in 0..self.n() {
            if let Some(n) = self.node(i) {
                out += &format!(
                    "slot {i} wakes in {:?}\n",
                    n.poll_timeout().map(|t| t.saturating_duration_since(self.sim.now()))
                );
            }
        }
        for i in 0..self.n() {
            let Some(n) = self.node(i) else {
                out += &format!("slot {i}: down\n");
                continue;
            };
            let g = &n.gup;
            out += &format!(
                "slot {i} {}: epoch {} normal {} locker {} applied {} commit {} durable {} last {:?} view {:?} config {}\n",
                n.me,
                g.epoch(),
                g.is_normal(),
                g.is_locker(),
                g.applied(),
                g.committed(),
                g.durable_prefix(),
                g.log_entries().last().map(|(s, _)| s),
                g.view().map(|v| v.id),
                g.voting_config().map(|c| c.to_string()).unwrap_or_default(),
            );
        }
        out
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

/// A seeded schedule of world changes, with joins.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Changes, in time order.
    pub changes: Vec<(Duration, WorldChange)>,
    /// When the run ends.
    pub end: Duration,
}

/// Crashes (keeping a majority of the started slots up), restarts, joins of the slots from
/// `initial` on, partitions (a third one-way), heals and loss up to 20% over `duration`;
/// then everything heals and restarts, and `settle` follows.
pub fn plan(seed: u64, slots: u32, initial: u32, duration: Duration, settle: Duration) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let mut changes = Vec::new();
    let mut started: Vec<bool> = (0..slots).map(|s| s < initial).collect();
    let mut down: Vec<u32> = Vec::new();
    let mut t = Duration::ZERO;
    let gap = duration / 10;
    loop {
        t += Duration::from_nanos(rng.gen_range(gap.as_nanos() as u64 / 2..=gap.as_nanos() as u64 * 3 / 2));
        if t >= duration {
            break;
        }
        let up = started.iter().filter(|s| **s).count() as u32 - down.len() as u32;
        let started_n = started.iter().filter(|s| **s).count() as u32;
        match rng.gen_range(0..12) {
            0..=2 if 2 * (up - 1) > started_n => {
                let candidates: Vec<u32> = (0..slots).filter(|s| started[*s as usize] && !down.contains(s)).collect();
                let s = candidates[rng.gen_range(0..candidates.len())];
                down.push(s);
                changes.push((t, WorldChange::Crash(SlotId(s))));
            }
            3 | 4 if !down.is_empty() => {
                let s = down.swap_remove(rng.gen_range(0..down.len()));
                changes.push((t, WorldChange::Restart(SlotId(s))));
            }
            5 | 6 => {
                if let Some(s) = (0..slots).find(|s| !started[*s as usize]) {
                    started[s as usize] = true;
                    changes.push((t, WorldChange::Restart(SlotId(s))));
                }
            }
            7 | 8 => {
                let mut all: Vec<SlotId> = (0..slots).map(SlotId).collect();
                for i in (1..all.len()).rev() {
                    all.swap(i, rng.gen_range(0..=i));
                }
                let cut = rng.gen_range(1..slots as usize);
                let (a, b) = all.split_at(cut);
                changes.push((
                    t,
                    if rng.gen_ratio(1, 3) {
                        WorldChange::PartitionOneWay { from: a.to_vec(), to: b.to_vec() }
                    } else {
                        WorldChange::Partition { side_a: a.to_vec(), side_b: b.to_vec() }
                    },
                ));
            }
            9 | 10 => changes.push((t, WorldChange::Heal)),
            11 => {
                let loss = rng.gen_range(0.0..=0.2);
                changes.push((t, WorldChange::Faults(Faults { loss, ..Faults::lossy(0.0) })));
            }
            _ => {}
        }
    }
    changes.push((duration, WorldChange::Heal));
    changes.push((duration, WorldChange::Faults(Faults::lossy(0.01))));
    for s in down {
        changes.push((duration, WorldChange::Restart(SlotId(s))));
    }
    for s in (0..slots).filter(|s| !started[*s as usize]) {
        changes.push((duration, WorldChange::Restart(SlotId(s))));
    }
    Plan { changes, end: duration + settle }
}
