//! The membership state machine: join, failure detection levels, regroup, views.
//!
//! Sans-IO (STYLE §1): no sockets, no clock, no threads. Method groups, in call order:
//!
//! * start: [`Membership::new`] (or [`Membership::resume`]) with the process's
//!   incarnation ([`crate::freshness::next_incarnation`]), then [`Membership::start`]
//!   (forms a cluster when there are no seeds, asks the seeds to sponsor a join otherwise);
//! * input: [`Membership::handle_datagram`] for every datagram received on the membership
//!   socket, [`Membership::handle_timeout`] when [`Membership::poll_timeout`] has come
//!   (harmless when nothing is due);
//! * output: drain [`Membership::poll_transmit`] (datagrams to send) and
//!   [`Membership::poll_event`] (events for applications) after every input;
//! * queries: [`Membership::view`], [`Membership::status`], [`Membership::member_states`],
//!   [`Membership::counters`].

use crate::buddy::{BuddyDetector, FastDetector};
use crate::config::Config;
use crate::events::{MemberState, MembershipEvent};
use crate::freshness::{Freshness, Verdict};
use crate::gossip::GossipDetector;
use crate::rate_limit::{DropClass, DropLog, PerPeer};
use crate::regroup::{self, Phase, PromiseRow, Regroup};
use crate::rejoin::RejoinCheck;
use crate::view::{Member, MemberId, View};
use crate::wire::{Authenticator, Ballot, DecodeError, Message, Packet, Stamp};
use crate::witness::{NoWitness, Witness};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Datagrams queued for sending, at most; beyond it new ones are dropped and counted (the
/// protocol retransmits what matters). A regroup of 256 members queues 2 × 256.
const TRANSMIT_QUEUE_MAX: usize = 4096;
/// Events queued for the application, at most; beyond it the oldest are dropped and
/// counted (an application that does not poll loses history, never the current view).
const EVENT_QUEUE_MAX: usize = 1024;
/// Recently removed members remembered for status reports.
const REMOVED_MAX: usize = 64;
/// Peers remembered for rate-limiting catch-up answers and challenges (cleared when full).
const ANSWERED_PEERS_MAX: usize = 4096;
/// Longest silence of the log about one class of dropped datagrams while they keep coming:
/// a flood costs a line this often.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Join requests without a sponsor's answer before the log says why a node may stay
/// joining (2 s in `local`, 6 s in `lan`, 20 s in `wan`: long enough that a sponsor busy
/// with a regroup is not reported); it says it again after twice as many, and so on.
const JOIN_ATTEMPTS_BEFORE_WARNING: u32 = 20;

/// Where this node stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not in a view: asking seeds to sponsor a join.
    Joining,
    /// In a view that holds quorum: acting as a member.
    Member,
    /// In a view, but the last regroup could not reach a quorum: not acting as a member.
    NoQuorum,
}

/// A datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub dst: SocketAddr,
    /// The signed datagram.
    pub payload: Vec<u8>,
}

/// What the membership did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Heartbeat and gossip datagrams sent (the steady-state traffic).
    pub heartbeats_sent: u64,
    /// Datagrams received and authenticated.
    pub packets_received: u64,
    /// Datagrams dropped because they did not authenticate (strangers, corruption).
    pub dropped_auth: u64,
    /// Datagrams dropped as malformed (bad length, magic, version, kind or body).
    pub dropped_malformed: u64,
    /// Authenticated datagrams ignored (from non-members, about other views).
    pub ignored: u64,
    /// Authenticated datagrams dropped as replays: their counter was received already, or
    /// is older than the replay window (network duplicates count here too).
    pub dropped_replayed: u64,
    /// Authenticated datagrams dropped because an earlier process of their sender made
    /// them (it restarted since, or they are replayed).
    pub dropped_old_incarnation: u64,
    /// Authenticated datagrams not made for this process (sent before it started, to a
    /// former process, by a sender that does not know it yet, or replayed): not acted on.
    pub dropped_unconfirmed: u64,
    /// Challenges sent in answer to unconfirmed datagrams (rate-limited per address).
    pub challenges_sent: u64,
    /// Times this process renewed its incarnation because its table of senders was full.
    pub incarnations_renewed: u64,
    /// Datagrams dropped because the transmit queue was full.
    pub transmit_overflow: u64,
    /// Events dropped because the application did not poll.
    pub event_overflow: u64,
    /// Regroups this node proposed.
    pub regroups_started: u64,
    /// Regroups that found every member alive (false suspicions).
    pub regroups_false_alarm: u64,
    /// Regroups that failed (no quorum, or overtaken).
    pub regroups_failed: u64,
    /// Views installed.
    pub views_installed: u64,
    /// Members this node started to suspect.
    pub suspicions: u64,
    /// Join requests this node sponsored.
    pub joins_sponsored: u64,
}

/// What a node must keep across a restart to come back as the same member: its identity,
/// its view, and its promises in the regroup agreement (a member that forgot a promise
/// could help choose two different views). The runtime writes it (with fsync) whenever
/// [`Membership::durable_version`] changes, before it sends what the change produced.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Durable {
    /// This node.
    pub me: Member,
    /// The incarnation of the process that wrote it (the next process takes a larger
    /// one); 0 in files written before incarnations existed.
    #[serde(default)]
    pub incarnation: u64,
    /// Its last installed view.
    pub view: Option<View>,
    /// The highest ballot promised for the next view, as (round, proposer).
    pub promised: (u32, MemberId),
    /// The next view accepted, with its ballot.
    pub accepted: Option<((u32, MemberId), View)>,
}

/// The membership of one node. See the module documentation for the call order.
pub struct Membership {
    config: Config,
    me: Member,
    auth: Authenticator,
    freshness: Freshness,
    rng: ChaCha8Rng,
    status: Status,
    view: Option<View>,
    seeds: Vec<SocketAddr>,
    gossip: GossipDetector,
    fast: Vec<Box<dyn FastDetector>>,
    witness: Box<dyn Witness>,
    // Acceptor state for the choice of view `view.id + 1`.
    promised: Ballot,
    accepted: Option<(Ballot, View, Instant)>,
    /// An accepted view read from durable state, until [`Membership::start`] gives it a time.
    resumed_accepted: Option<(Ballot, View)>,
    promised_to: Option<MemberId>,
    /// Times our current connectivity row is still to be sent to the proposer (rows can
    /// be lost like any datagram; the proposer must not prune on a stale one).
    row_resends: u32,
    /// Version of our connectivity row, raised whenever the row changes, so that the
    /// proposer keeps the newest when an older row arrives after it.
    row_version: u32,
    round_seen: u32,
    // Proposer state.
    regroup: Option<Regroup>,
    cautious: bool,
    next_regroup_at: Option<Instant>,
    // Reasons for a regroup.
    local_suspects: BTreeSet<MemberId>,
    /// target -> reporter -> when reported.
    suspicions: BTreeMap<MemberId, BTreeMap<MemberId, Instant>>,
    announced_suspects: BTreeSet<MemberId>,
    joiners: BTreeMap<MemberId, (Member, Instant)>,
    reason_since: Option<Instant>,
    /// Since when this member has had a reason to regroup that no view or completed
    /// regroup resolved (not reset when a regroup is overtaken).
    unresolved_since: Option<Instant>,
    suspect_resent_at: Option<Instant>,
    removed: VecDeque<Member>,
    /// After removal from a view: the probes that must be answered before joining again.
    rejoin: Option<RejoinCheck>,
    /// Unsolicited catch-up answers (a view, a view request), one per peer per period.
    catchup: PerPeer,
    /// Challenges, one per peer per `regroup_retransmit`: one answers a burst of
    /// unconfirmed datagrams (the sender then knows), and a sender whose challenge was
    /// lost gets another at its next retransmission.
    challenges: PerPeer,
    drop_log: DropLog,
    /// Join requests sent since the last view.
    join_attempts: u32,
    /// Seeds that sent a fresh datagram since the last view (they run, and share the
    /// secret).
    seeds_answered: BTreeSet<SocketAddr>,
    /// Whether a regroup asked this node, joining, whether it is alive since the last view.
    asked_by_regroup: bool,
    next_join: Option<Instant>,
    next_tick: Option<Instant>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<MembershipEvent>,
    counters: Counters,
    durable_version: u64,
    /// (view, promised, accepted ballot, incarnation) when `durable_version` last changed.
    durable_seen: (u64, Ballot, Option<Ballot>, u64),
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("me", &self.me.name)
            .field("status", &self.status)
            .field("view", &self.view.as_ref().map(|v| v.id))
            .finish()
    }
}

impl Membership {
    /// A node `me` of the cluster whose secret is `secret`, joining through `seeds` (or
    /// forming a cluster if there are none), in a process whose incarnation is
    /// `incarnation` (not 0; larger than any earlier process of the same member, see
    /// [`crate::freshness::next_incarnation`]). `seed` drives its random choices (gossip
    /// targets, jitter), so simulated runs replay.
    pub fn new(config: Config, me: Member, incarnation: u64, secret: &[u8], seeds: Vec<SocketAddr>, seed: u64) -> Self {
        assert!(config.buddies >= 1 && config.gossip_fanout >= 1, "config: at least one buddy and one gossip target");
        assert!(me.name.len() <= crate::view::NAME_MAX, "member names are at most NAME_MAX bytes");
        assert!(config.members_max <= crate::wire::LIST_MAX, "views must fit the wire's list bound");
        let gossip = GossipDetector::new(me.id, config.gossip_interval, config.gossip_fanout);
        let buddy = BuddyDetector::new(me.id, config.buddies, config.heartbeat_interval, config.buddy_missed_max);
        let seeds = seeds.into_iter().filter(|a| *a != me.addr).collect();
        Self {
            auth: Authenticator::new(secret),
            freshness: Freshness::new(me.id, incarnation),
            rng: ChaCha8Rng::seed_from_u64(seed ^ me.id.0),
            status: Status::Joining,
            view: None,
            seeds,
            gossip,
            fast: vec![Box::new(buddy)],
            witness: Box::new(NoWitness),
            promised: Ballot::default(),
            accepted: None,
            resumed_accepted: None,
            promised_to: None,
            row_resends: 0,
            row_version: 0,
            round_seen: 0,
            regroup: None,
            cautious: false,
            next_regroup_at: None,
            local_suspects: BTreeSet::new(),
            suspicions: BTreeMap::new(),
            announced_suspects: BTreeSet::new(),
            joiners: BTreeMap::new(),
            reason_since: None,
            unresolved_since: None,
            suspect_resent_at: None,
            removed: VecDeque::new(),
            rejoin: None,
            catchup: PerPeer::new(config.regroup_retransmit, ANSWERED_PEERS_MAX),
            challenges: PerPeer::new(config.regroup_retransmit, ANSWERED_PEERS_MAX),
            drop_log: DropLog::new(DROP_LOG_INTERVAL),
            join_attempts: 0,
            seeds_answered: BTreeSet::new(),
            asked_by_regroup: false,
            next_join: None,
            next_tick: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            durable_version: 0,
            durable_seen: (0, Ballot::default(), None, 0),
            config,
            me,
        }
    }

    /// A node coming back from `durable` state: the same member, in its last view but not
    /// acting as a member until a regroup confirms the view still holds quorum (or a
    /// newer view tells it otherwise). Without a view it joins through `seeds`. The new
    /// process's `incarnation` must be larger than the one `durable` was written by.
    pub fn resume(
        config: Config,
        durable: Durable,
        incarnation: u64,
        secret: &[u8],
        seeds: Vec<SocketAddr>,
        seed: u64,
    ) -> Self {
        assert!(
            incarnation > durable.incarnation,
            "incarnations grow across restarts: {incarnation} follows {}",
            durable.incarnation
        );
        let mut m = Self::new(config, durable.me, incarnation, secret, seeds, seed);
        m.promised = Ballot { round: durable.promised.0, proposer: durable.promised.1 };
        m.round_seen = m.promised.round;
        if let (Some(((round, proposer), v)), Some(view)) = (durable.accepted, durable.view.as_ref()) {
            if v.id == view.id + 1 {
                m.resumed_accepted = Some((Ballot { round, proposer }, v));
            }
        }
        m.view = durable.view.filter(|v| v.contains(m.me.id));
        m
    }

    /// The state to keep across restarts.
    pub fn durable(&self) -> Durable {
        Durable {
            me: self.me.clone(),
            incarnation: self.freshness.incarnation(),
            view: self.view.clone(),
            promised: (self.promised.round, self.promised.proposer),
            accepted: self
                .accepted
                .as_ref()
                .map(|(b, v, _)| (*b, v))
                .or(self.resumed_accepted.as_ref().map(|(b, v)| (*b, v)))
                .map(|(b, v)| ((b.round, b.proposer), v.clone())),
        }
    }

    /// Changes whenever [`Membership::durable`] does.
    pub fn durable_version(&self) -> u64 {
        self.durable_version
    }

    fn note_durable(&mut self) {
        let now = (
            self.view.as_ref().map_or(0, |v| v.id),
            self.promised,
            self.accepted.as_ref().map(|(b, _, _)| *b),
            self.freshness.incarnation(),
        );
        if now != self.durable_seen {
            self.durable_seen = now;
            self.durable_version += 1;
        }
    }

    /// Uses `witness` as the quorum resource of a two-node cluster.
    pub fn set_witness(&mut self, witness: Box<dyn Witness>) {
        self.witness = witness;
    }

    /// Adds a fast failure detector level (an environmental detector, say).
    pub fn add_detector(&mut self, detector: Box<dyn FastDetector>) {
        self.fast.push(detector);
    }

    /// Starts: forms a one-member cluster (view 1) when there are no seeds, otherwise asks
    /// the seeds to sponsor a join.
    pub fn start(&mut self, now: Instant) {
        if let Some(view) = self.view.clone() {
            tracing::info!(node = %self.me.name, view = view.id, "resuming in the last view; confirming it by a regroup");
            self.accepted = self.resumed_accepted.take().map(|(b, v)| (b, v, now));
            self.status = Status::NoQuorum;
            self.gossip.reset(now, &view, self.config.gossip_fail_after(view.len()));
            for d in &mut self.fast {
                d.reset(now, &view);
            }
            self.next_regroup_at = Some(now);
            self.handle_timeout(now);
            return;
        }
        if self.seeds.is_empty() {
            tracing::info!(node = %self.me.name, "forming a new cluster");
            self.install(now, View::new(1, vec![self.me.clone()]));
        } else {
            self.next_join = Some(now);
            self.handle_timeout(now);
        }
    }

    /// This node.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// This process's incarnation ([`crate::freshness`]).
    pub fn incarnation(&self) -> u64 {
        self.freshness.incarnation()
    }

    /// The installed view, if any.
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// Where this node stands.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Whether this node acts as a member of a view with quorum.
    pub fn has_quorum(&self) -> bool {
        self.status == Status::Member
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Members of the view with their state, then recently removed members as dead (one
    /// entry per node: an identity replaced by a newer one of the same name or address is
    /// not listed).
    pub fn member_states(&self) -> Vec<(Member, MemberState)> {
        let mut out = Vec::new();
        if let Some(v) = &self.view {
            for m in &v.members {
                let state =
                    if self.announced_suspects.contains(&m.id) { MemberState::Suspect } else { MemberState::Alive };
                out.push((m.clone(), state));
            }
        }
        for m in &self.removed {
            if !out.iter().any(|(o, _)| o.id == m.id) {
                out.push((m.clone(), MemberState::Dead));
            }
        }
        out
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<MembershipEvent> {
        self.events.pop_front()
    }

    /// When [`Membership::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_tick;
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        consider(self.next_join);
        if self.view.is_some() {
            consider(self.gossip.poll_timeout());
            for d in &self.fast {
                consider(d.poll_timeout());
            }
        }
        t
    }

    // ---- output helpers ----

    fn push_event(&mut self, e: MembershipEvent) {
        if self.events.len() >= EVENT_QUEUE_MAX {
            self.events.pop_front();
            self.counters.event_overflow += 1;
        }
        self.events.push_back(e);
    }

    fn send(&mut self, dst: SocketAddr, message: Message) {
        let stamp = self.freshness.stamp(dst, &message);
        self.transmit(dst, stamp, message);
    }

    fn transmit(&mut self, dst: SocketAddr, stamp: Stamp, message: Message) {
        if self.transmits.len() >= TRANSMIT_QUEUE_MAX {
            self.counters.transmit_overflow += 1;
            return;
        }
        let packet = Packet { sender: self.me.id, sender_view: self.view.as_ref().map_or(0, |v| v.id), stamp, message };
        let payload = self.auth.encode(&packet);
        self.counters.packets_sent += 1;
        self.transmits.push_back(Transmit { dst, payload });
    }

    /// Answers `packet`, which was not made for this process, with a challenge (never a
    /// challenge with a challenge; one per peer per period).
    fn challenge(&mut self, now: Instant, from: SocketAddr, packet: &Packet) {
        if matches!(packet.message, Message::Challenge) || !self.challenges.allow(now, from) {
            return;
        }
        let stamp = self.freshness.challenge_stamp(packet);
        self.counters.challenges_sent += 1;
        self.transmit(from, stamp, Message::Challenge);
    }

    fn addr_of(&self, id: MemberId) -> Option<SocketAddr> {
        if let Some(m) = self.view.as_ref().and_then(|v| v.member(id)) {
            return Some(m.addr);
        }
        if let Some((m, _)) = self.joiners.get(&id) {
            return Some(m.addr);
        }
        if let Some(Phase::Accept { proposal, .. }) = self.regroup.as_ref().map(|r| &r.phase) {
            return proposal.member(id).map(|m| m.addr);
        }
        None
    }

    fn send_to(&mut self, id: MemberId, message: Message) {
        if let Some(addr) = self.addr_of(id) {
            self.send(addr, message);
        }
    }

    // ---- input ----

    /// A datagram arrived from `from`. Strangers, corrupt and malformed datagrams are
    /// counted and dropped; nothing in them is trusted. Authenticated datagrams that are
    /// not fresh (replays, and any not made for this process) are counted and dropped too.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, data: &[u8]) {
        let packet = match self.auth.decode(data) {
            Ok(p) => p,
            Err(DecodeError::Auth) => {
                self.counters.dropped_auth += 1;
                self.drop_log.dropped(now, DropClass::Auth, from, &DecodeError::Auth);
                return;
            }
            Err(e) => {
                self.counters.dropped_malformed += 1;
                self.drop_log.dropped(now, DropClass::Malformed, from, &e);
                return;
            }
        };
        if packet.sender == self.me.id {
            self.counters.ignored += 1;
            return;
        }
        self.counters.packets_received += 1;
        if !self.fresh(now, from, &packet) {
            self.schedule(now);
            return;
        }
        let sender = packet.sender;
        if let Some(view) = &self.view {
            let view_id = view.id;
            let member = view.contains(sender);
            if member {
                self.gossip.heard(now, sender);
                for d in &mut self.fast {
                    d.heard(now, sender);
                }
            }
            // Every datagram names its sender's view: whoever is behind catches up.
            if packet.sender_view > view_id && member && self.catchup.allow(now, from) {
                self.send(from, Message::ViewRequest);
            } else if packet.sender_view != 0
                && packet.sender_view < view_id
                && !matches!(packet.message, Message::Commit { .. } | Message::JoinRequest { .. })
                && self.catchup.allow(now, from)
            {
                let v = self.view.clone().expect("checked above");
                self.send(from, Message::Commit { view: v });
            }
        } else if self.rejoin.as_ref().is_some_and(|c| packet.sender_view > c.view().id)
            && self.catchup.allow(now, from)
        {
            // Waiting to rejoin: learn views newer than the one that excluded us, so that
            // members that left since are not waited for.
            self.send(from, Message::ViewRequest);
        }
        self.dispatch(now, from, packet);
        if self.view.is_some() {
            self.update_suspects(now);
            self.regroup_tick(now);
        }
        self.schedule(now);
    }

    /// Whether `packet` from `from` may be acted on ([`crate::freshness`]). What may not
    /// is counted and logged, and challenged if it was not made for this process; a fresh
    /// datagram from an address whose incarnation was not known releases what was kept for
    /// it.
    fn fresh(&mut self, now: Instant, from: SocketAddr, packet: &Packet) -> bool {
        let class = match self.freshness.check(from, packet) {
            Verdict::Fresh { learned } => {
                if learned {
                    for message in self.freshness.take_unconfirmed(from) {
                        self.send(from, message);
                    }
                }
                if self.status == Status::Joining && self.seeds.contains(&from) {
                    self.seeds_answered.insert(from);
                }
                return true;
            }
            Verdict::Replayed => {
                self.counters.dropped_replayed += 1;
                DropClass::Replayed
            }
            Verdict::OldIncarnation => {
                self.counters.dropped_old_incarnation += 1;
                DropClass::OldIncarnation
            }
            Verdict::Renewed => {
                self.counters.incarnations_renewed += 1;
                tracing::warn!(
                    node = %self.me.name,
                    incarnation = self.freshness.incarnation(),
                    "the table of senders is full: renewed this process's incarnation (peers learn it from a challenge)"
                );
                self.counters.dropped_unconfirmed += 1;
                self.challenge(now, from, packet);
                DropClass::Unconfirmed
            }
            Verdict::Unconfirmed => {
                self.counters.dropped_unconfirmed += 1;
                self.challenge(now, from, packet);
                DropClass::Unconfirmed
            }
        };
        self.drop_log.dropped(now, class, from, &packet.message.name());
        false
    }

    fn dispatch(&mut self, now: Instant, from: SocketAddr, packet: Packet) {
        let sender = packet.sender;
        match packet.message {
            Message::Heartbeat { digest, suspects } => self.on_heartbeat(now, sender, &digest, &suspects),
            Message::JoinRequest { member, forwarded } => self.on_join_request(now, member, forwarded),
            Message::Suspect { target } => {
                if self.view.as_ref().is_some_and(|v| v.contains(target) && v.contains(sender)) && target != self.me.id
                {
                    self.report(now, target, sender);
                } else {
                    self.counters.ignored += 1;
                }
            }
            Message::Prepare { base, ballot } => self.on_prepare(now, from, sender, base, ballot),
            Message::Promise { base, ballot, accepted, suspects, row } => {
                let row = PromiseRow { accepted, suspects: suspects.into_iter().collect(), row };
                self.on_promise(now, sender, base, ballot, row)
            }
            Message::Nack { base, promised } => self.on_nack(now, base, promised),
            Message::Accept { base, ballot, proposal } => self.on_accept(now, from, sender, base, ballot, proposal),
            Message::Accepted { base, ballot } => self.on_accepted(now, sender, base, ballot),
            Message::Commit { view } => self.learn_view(now, view),
            Message::ViewRequest => match self.view.clone() {
                Some(view) => self.send(from, Message::Commit { view }),
                None => self.counters.ignored += 1,
            },
            Message::Probe => self.send(from, Message::ProbeAck),
            Message::ProbeAck => self.on_probe_ack(now, sender),
            // Its work is done: the freshness check learned the challenger's incarnation.
            Message::Challenge => {}
            Message::JoinerAlive { base, ballot } => self.on_joiner_alive(now, sender, base, ballot),
        }
    }

    /// The time asked for by [`Membership::poll_timeout`] has come (or passed).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.status == Status::Joining {
            if self.next_join.is_some_and(|t| t <= now) {
                if self.rejoin_ready(now) {
                    let me = self.me.clone();
                    for seed in self.seeds.clone() {
                        self.send(seed, Message::JoinRequest { member: me.clone(), forwarded: false });
                    }
                    self.join_attempts += 1;
                    self.warn_if_no_sponsor();
                }
                self.next_join = Some(now + self.config.join_retry);
            }
        } else {
            self.heartbeat_tick(now);
            self.update_suspects(now);
            self.probe_suspects(now);
            self.regroup_tick(now);
        }
        self.schedule(now);
    }

    /// Sends our current connectivity row to the proposer we promised to, while resends
    /// are left.
    fn send_row(&mut self) {
        let Some(p) = self.promised_to.filter(|&p| p != self.me.id) else { return };
        if self.row_resends == 0 {
            return;
        }
        self.row_resends -= 1;
        let promise = Message::Promise {
            base: self.view.as_ref().map_or(0, |v| v.id),
            ballot: self.promised,
            accepted: self.accepted.as_ref().map(|(b, v, _)| (*b, v.clone())),
            suspects: self.local_suspects.iter().copied().collect(),
            row: self.row_version,
        };
        self.send_to(p, promise);
    }

    /// While a regroup we promised to is open, keeps probing the members we suspect, so
    /// that a suspicion caused by lost heartbeats is withdrawn before the proposer prunes.
    fn probe_suspects(&mut self, now: Instant) {
        if self.promised_to.filter(|&p| p != self.me.id).is_none() {
            return;
        }
        self.send_row();
        for s in self.local_suspects.clone() {
            if let Some(addr) = self.addr_of(s) {
                if self.catchup.allow(now, addr) {
                    self.send(addr, Message::Probe);
                }
            }
        }
    }

    fn schedule(&mut self, now: Instant) {
        self.note_durable();
        let busy = self.regroup.is_some()
            || self.reason_since.is_some()
            || !self.suspicions.is_empty()
            || self.row_resends > 0;
        self.next_tick = match self.status {
            Status::Joining => None,
            _ if busy => Some(now + self.config.regroup_retransmit),
            _ => Some(now + self.config.heartbeat_interval),
        };
    }

    // ---- detection ----

    fn heartbeat_tick(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else { return };
        let mut targets = Vec::new();
        self.gossip.due_targets(now, &mut self.rng, &view, &mut targets);
        for d in &mut self.fast {
            d.due_targets(now, &mut targets);
        }
        targets.sort_unstable();
        targets.dedup();
        targets.retain(|&t| t != self.me.id);
        if targets.is_empty() {
            return;
        }
        self.gossip.bump();
        let digest = self.gossip.digest();
        let suspects: Vec<MemberId> = self.local_suspects.iter().copied().collect();
        for t in targets {
            self.counters.heartbeats_sent += 1;
            self.send_to(t, Message::Heartbeat { digest: digest.clone(), suspects: suspects.clone() });
        }
    }

    fn on_heartbeat(&mut self, now: Instant, sender: MemberId, digest: &[(MemberId, u64)], suspects: &[MemberId]) {
        let Some(view) = &self.view else {
            self.counters.ignored += 1;
            return;
        };
        if !view.contains(sender) {
            self.counters.ignored += 1;
            return;
        }
        self.gossip.merge(now, digest);
        let view = view.clone();
        for &s in suspects {
            if s != self.me.id && view.contains(s) {
                self.report(now, s, sender);
            }
        }
    }

    /// Records that `reporter` suspects `target`; announces the suspicion once.
    fn report(&mut self, now: Instant, target: MemberId, reporter: MemberId) {
        self.suspicions.entry(target).or_default().insert(reporter, now);
        if self.announced_suspects.insert(target) {
            let view = self.view.as_ref().map_or(0, |v| v.id);
            self.push_event(MembershipEvent::Suspected { member: target, view });
        }
    }

    fn update_suspects(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else { return };
        let mut found = Vec::new();
        self.gossip.suspects(now, &mut found);
        for d in &self.fast {
            d.suspects(now, &mut found);
        }
        let current: BTreeSet<MemberId> =
            found.into_iter().filter(|&id| id != self.me.id && view.contains(id)).collect();
        let coordinator = self.coordinator_with(&current);
        for &s in current.difference(&self.local_suspects.clone()) {
            self.counters.suspicions += 1;
            tracing::info!(node = %self.me.name, suspect = %s, view = view.id, "suspecting a member");
            self.report(now, s, self.me.id);
            if let Some(c) = coordinator.filter(|&c| c != self.me.id) {
                self.send_to(c, Message::Suspect { target: s });
            }
        }
        // The coordinator may have missed a suspicion: say it again now and then.
        if !current.is_empty()
            && self
                .suspect_resent_at
                .is_none_or(|t| now.saturating_duration_since(t) >= self.config.regroup_takeover / 2)
        {
            self.suspect_resent_at = Some(now);
            if let Some(c) = coordinator.filter(|&c| c != self.me.id) {
                for &s in &current {
                    self.send_to(c, Message::Suspect { target: s });
                }
            }
        }
        let changed = current != self.local_suspects;
        for gone in self.local_suspects.difference(&current) {
            if let Some(r) = self.suspicions.get_mut(gone) {
                r.remove(&self.me.id);
            }
        }
        self.local_suspects = current;
        // Reports expire unless refreshed; a suspicion nobody holds is withdrawn.
        let ttl = self.config.regroup_takeover;
        for reports in self.suspicions.values_mut() {
            reports.retain(|_, t| now.saturating_duration_since(*t) < ttl);
        }
        let me = self.me.id;
        let local = &self.local_suspects;
        self.suspicions.retain(|target, reports| {
            if local.contains(target) {
                reports.insert(me, now);
            }
            !reports.is_empty()
        });
        let suspicions = &self.suspicions;
        self.announced_suspects.retain(|t| suspicions.contains_key(t));
        // A member that promised sends its corrected row when its suspicions change.
        if changed {
            self.row_version = self.row_version.wrapping_add(1);
            self.row_resends = self.config.row_resends();
            self.send_row();
            if let Some(r) = &mut self.regroup {
                if let Some(row) = r.promises.get_mut(&self.me.id) {
                    row.suspects = self.local_suspects.clone();
                    row.row = self.row_version;
                }
            }
        }
    }

    /// The coordinator: the lowest-id member nobody is known to suspect.
    fn coordinator_with(&self, local: &BTreeSet<MemberId>) -> Option<MemberId> {
        let view = self.view.as_ref()?;
        view.ids().find(|id| *id == self.me.id || (!local.contains(id) && !self.suspicions.contains_key(id)))
    }

    fn coordinator(&self) -> Option<MemberId> {
        self.coordinator_with(&self.local_suspects)
    }

    // ---- join ----

    /// Whether this node may ask to join: always, unless it was removed from a view and
    /// not every member of the newest view it knows has answered a probe recently
    /// ([`crate::rejoin`]). Probes those that have not.
    fn rejoin_ready(&mut self, now: Instant) -> bool {
        let me = self.me.id;
        let Some(check) = &self.rejoin else { return true };
        for m in check.due_probes(now, me) {
            self.send(m.addr, Message::Probe);
        }
        self.rejoin.as_ref().is_some_and(|c| c.connected(now, me))
    }

    fn on_probe_ack(&mut self, now: Instant, sender: MemberId) {
        let me = self.me.id;
        let Some(check) = self.rejoin.as_mut().filter(|_| self.status == Status::Joining) else { return };
        let before = check.connected(now, me);
        check.answered(now, sender);
        if !before && check.connected(now, me) {
            tracing::info!(node = %self.me.name, view = check.view().id, "every member answered: asking to join again");
            self.next_join = Some(now);
        }
    }

    /// After [`JOIN_ATTEMPTS_BEFORE_WARNING`] join requests without a view (and after
    /// twice, four times as many…), says in the log why this node may stay joining.
    fn warn_if_no_sponsor(&self) {
        let rounds = self.join_attempts / JOIN_ATTEMPTS_BEFORE_WARNING;
        if !self.join_attempts.is_multiple_of(JOIN_ATTEMPTS_BEFORE_WARNING) || !rounds.is_power_of_two() {
            return;
        }
        let (node, attempts) = (&self.me.name, self.join_attempts);
        let waited_ms = (self.config.join_retry * attempts).as_millis();
        let seeds = addr_list(self.seeds.iter());
        if self.seeds_answered.is_empty() {
            tracing::warn!(
                %node, attempts, waited_ms, %seeds,
                "still joining: no seed answered; check that the seeds run, are reachable, and have this node's cluster secret"
            );
        } else if !self.asked_by_regroup {
            let answering = addr_list(self.seeds_answered.iter());
            tracing::warn!(
                %node, attempts, waited_ms, %seeds, %answering,
                "still joining: seeds answer, but none is a member of a cluster to sponsor the join (are they all joining, \
                 each started with --seeds?). The first node of a new cluster is started without --seeds; the others \
                 name it, or any member, as a seed"
            );
        } else {
            tracing::warn!(
                %node, attempts, waited_ms, %seeds,
                "still joining: a cluster asked whether this node is alive but has not admitted it yet (its members admit \
                 joiners as they season; is it at its member limit?)"
            );
        }
    }

    fn on_join_request(&mut self, now: Instant, member: Member, forwarded: bool) {
        if self.status != Status::Member {
            self.counters.ignored += 1;
            return;
        }
        let view = self.view.clone().expect("members have a view");
        if view.contains(member.id) {
            self.send(member.addr, Message::Commit { view });
            return;
        }
        if member.id == self.me.id || self.joiners.len() >= self.config.members_max {
            self.counters.ignored += 1;
            return;
        }
        if !forwarded && !self.joiners.contains_key(&member.id) {
            self.counters.joins_sponsored += 1;
            tracing::info!(node = %self.me.name, joiner = %member.name, "sponsoring a join");
        }
        let id = member.id;
        self.joiners.insert(id, (member.clone(), now));
        if !forwarded {
            if let Some(c) = self.coordinator().filter(|&c| c != self.me.id) {
                self.send_to(c, Message::JoinRequest { member, forwarded: true });
            }
        }
        self.regroup_tick(now);
    }

    /// Members of the view that a joiner replaces (same address or name, another
    /// identity), among the joiners that answered the ballot (`present`): they are not
    /// waited for.
    fn replaced(&self, present: &BTreeSet<MemberId>) -> BTreeSet<MemberId> {
        let Some(view) = &self.view else { return BTreeSet::new() };
        let replaces = |j: &Member, m: &Member| j.id != m.id && (j.addr == m.addr || j.name == m.name);
        view.members
            .iter()
            .filter(|m| self.joiners.values().any(|(j, _)| present.contains(&j.id) && replaces(j, m)))
            .map(|m| m.id)
            .collect()
    }

    /// A joiner answered the `Prepare` of our regroup: it may enter the proposal.
    fn on_joiner_alive(&mut self, now: Instant, sender: MemberId, base: u64, ballot: Ballot) {
        let Some(r) = self.regroup.as_mut() else {
            self.counters.ignored += 1;
            return;
        };
        if r.base.id != base || r.ballot != ballot || !self.joiners.contains_key(&sender) {
            self.counters.ignored += 1;
            return;
        }
        r.joiners_present.insert(sender);
        if matches!(r.phase, Phase::Collect) {
            self.try_decide(now);
        }
    }

    /// Whether this node asks to join now (it sent join requests since its last view, and
    /// is not waiting for its probes after a removal).
    fn asking_to_join(&self, now: Instant) -> bool {
        self.status == Status::Joining
            && self.view.is_none()
            && self.join_attempts > 0
            && self.rejoin.as_ref().is_none_or(|c| c.connected(now, self.me.id))
    }

    // ---- regroup: reasons and the proposer ----

    fn has_reason(&self, now: Instant) -> bool {
        let needed = self.config.suspicions_needed;
        self.status == Status::NoQuorum
            || !self.joiners.is_empty()
            || self.suspicions.values().any(|r| r.len() >= needed)
            || self
                .accepted
                .as_ref()
                .is_some_and(|(_, _, t)| now.saturating_duration_since(*t) >= self.config.regroup_takeover)
    }

    fn regroup_tick(&mut self, now: Instant) {
        if self.view.is_none() {
            return;
        }
        // Joiners that stopped asking are forgotten (a joiner asks every `join_retry`).
        let join_ttl = self.config.join_retry * 20;
        self.joiners.retain(|_, (_, t)| now.saturating_duration_since(*t) < join_ttl);
        if self.regroup.is_some() {
            self.regroup_progress(now);
            return;
        }
        if !self.has_reason(now) {
            self.reason_since = None;
            self.unresolved_since = None;
            return;
        }
        let unresolved = *self.unresolved_since.get_or_insert(now);
        // Bounded failure handling: a member whose suspicion no regroup resolved within
        // the time a regroup takes (a takeover and two stage-1 waits) cannot know that it
        // is still in a view with quorum, so it stops acting as a member.
        if self.status == Status::Member
            && now.saturating_duration_since(unresolved)
                >= self.config.regroup_takeover + 2 * self.config.regroup_max_wait
        {
            self.lose_quorum("no regroup resolved the suspicion in time");
        }
        let since = *self.reason_since.get_or_insert(now);
        if self.next_regroup_at.is_some_and(|t| now < t) {
            return;
        }
        if self.coordinator() == Some(self.me.id)
            || now.saturating_duration_since(since) >= self.config.regroup_takeover
        {
            self.start_regroup(now);
        }
    }

    fn start_regroup(&mut self, now: Instant) {
        let base = self.view.clone().expect("regroups run in a view");
        let round = self.round_seen.max(self.promised.round) + 1;
        self.round_seen = round;
        let ballot = Ballot { round, proposer: self.me.id };
        self.promised = ballot;
        self.promised_to = Some(self.me.id);
        let mut promises = BTreeMap::new();
        promises.insert(
            self.me.id,
            PromiseRow {
                accepted: self.accepted.as_ref().map(|(b, v, _)| (*b, v.clone())),
                suspects: self.local_suspects.clone(),
                row: self.row_version,
            },
        );
        self.counters.regroups_started += 1;
        tracing::info!(node = %self.me.name, view = base.id, round, cautious = self.cautious, "starting a regroup");
        self.regroup = Some(Regroup {
            base,
            ballot,
            started: now,
            cautious: self.cautious,
            phase: Phase::Collect,
            promises,
            joiners_present: BTreeSet::new(),
            conflict_since: None,
            next_send: now,
        });
        self.regroup_progress(now);
    }

    fn regroup_progress(&mut self, now: Instant) {
        let Some(r) = self.regroup.as_mut() else { return };
        if now >= r.next_send {
            r.next_send = now + self.config.regroup_retransmit;
            let (base, ballot) = (r.base.id, r.ballot);
            let mut out = Vec::new();
            match &r.phase {
                Phase::Collect => {
                    for m in r.base.members.iter().filter(|m| !r.promises.contains_key(&m.id)) {
                        out.push((m.addr, Message::Prepare { base, ballot }));
                    }
                    // Joiners answer too: only those alive in this regroup enter its view.
                    for (j, _) in self.joiners.values().filter(|(j, _)| !r.joiners_present.contains(&j.id)) {
                        out.push((j.addr, Message::Prepare { base, ballot }));
                    }
                }
                Phase::Accept { proposal, accepted, .. } => {
                    for m in r.base.members.iter().filter(|m| !accepted.contains(&m.id) && m.id != self.me.id) {
                        out.push((m.addr, Message::Accept { base, ballot, proposal: proposal.clone() }));
                    }
                }
            }
            for (addr, msg) in out {
                self.send(addr, msg);
            }
        }
        let collecting = matches!(self.regroup.as_ref().map(|r| &r.phase), Some(Phase::Collect));
        if collecting {
            self.try_decide(now);
        } else {
            self.try_choose(now);
        }
    }

    fn witness_if_needed(&mut self, base: &View, survivors: &[MemberId]) -> bool {
        base.needs_witness(survivors) && self.witness.acquire(base.id, self.me.id)
    }

    fn try_decide(&mut self, now: Instant) {
        let r = self.regroup.as_ref().expect("collecting");
        let present = r.joiners_present.clone();
        let replaced = self.replaced(&present);
        let base = r.base.clone();
        let elapsed = now.saturating_duration_since(r.started);
        let cautious = r.cautious;
        let promises = r.promises.clone();
        let responded: BTreeSet<MemberId> = promises.keys().copied().collect();
        let missing: Vec<MemberId> =
            base.ids().filter(|id| !responded.contains(id) && !replaced.contains(id)).collect();
        // The single-failure shortcut applies only to a member that is suspected: one that
        // is merely slow to answer gets the full wait.
        let single_suspect = missing.len() == 1
            && (self.suspicions.contains_key(&missing[0]) || self.local_suspects.contains(&missing[0]));
        // Joiners that have not answered are waited for as long as the single-failure
        // shortcut waits: a joiner is no member, and one that died must not hold a regroup.
        let joiners_waiting = self.joiners.keys().any(|id| !present.contains(id));
        let ready = (missing.is_empty() && (!joiners_waiting || elapsed >= self.config.regroup_min_wait))
            || (!cautious && single_suspect && elapsed >= self.config.regroup_min_wait)
            || elapsed >= self.config.regroup_max_wait;
        if !ready {
            return;
        }
        let responders: Vec<MemberId> = responded.iter().copied().collect();
        let witness = self.witness_if_needed(&base, &responders);
        if !base.is_quorum(&responders, witness) {
            if elapsed >= self.config.regroup_max_wait {
                self.fail_regroup(now, "the members that answered are not a quorum");
            }
            return;
        }
        if let Some(v) = regroup::highest_accepted(&promises, base.id) {
            self.propose(now, v);
            return;
        }
        let mut candidates: BTreeSet<MemberId> = responded.difference(&replaced).copied().collect();
        candidates.insert(self.me.id);
        if !regroup::broken_links(&candidates, &promises).is_empty() {
            let since = *self.regroup.as_mut().expect("collecting").conflict_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.config.connectivity_wait
                && elapsed < self.config.regroup_max_wait
            {
                return;
            }
            let pruned = regroup::prune_to_full_connectivity(&mut candidates, &promises, self.me.id);
            tracing::info!(node = %self.me.name, ?pruned, "pruned members without full connectivity");
        }
        let survivors: Vec<MemberId> = candidates.iter().copied().collect();
        let witness = self.witness_if_needed(&base, &survivors);
        if !base.is_quorum(&survivors, witness) {
            if elapsed >= self.config.regroup_max_wait {
                self.fail_regroup(now, "the fully connected members are not a quorum");
            }
            return;
        }
        let mut members: Vec<Member> = base.members.iter().filter(|m| candidates.contains(&m.id)).cloned().collect();
        let joining = self.joiners.values().map(|(j, _)| j).filter(|j| present.contains(&j.id));
        for j in joining.filter(|j| !base.contains(j.id)) {
            if members.len() >= self.config.members_max {
                break;
            }
            members.push(j.clone());
        }
        // Joiners asked in this regroup that did not answer are forgotten until they ask
        // again (a live one asks every `join_retry`).
        self.joiners.retain(|id, _| present.contains(id));
        if members.len() == base.len() && base.ids().all(|id| candidates.contains(&id)) {
            // Every member answered and all hear each other: a false suspicion.
            self.counters.regroups_false_alarm += 1;
            tracing::info!(node = %self.me.name, view = base.id, "regroup found every member: no change");
            self.regroup = None;
            self.reason_since = None;
            self.unresolved_since = None;
            if self.status == Status::NoQuorum {
                tracing::info!(node = %self.me.name, view = base.id, "quorum confirmed: acting as a member again");
                self.status = Status::Member;
                self.cautious = false;
            }
            self.suspicions.clear();
            self.announced_suspects.clear();
            self.next_regroup_at = Some(now + self.config.regroup_min_wait);
            return;
        }
        assert!(
            members.iter().all(|m| candidates.contains(&m.id) || present.contains(&m.id)),
            "a proposal holds only members that answered this ballot"
        );
        self.propose(now, View::new(base.id + 1, members));
    }

    fn propose(&mut self, now: Instant, proposal: View) {
        let r = self.regroup.as_mut().expect("proposing in a regroup");
        let ballot = r.ballot;
        self.accepted = Some((ballot, proposal.clone(), now));
        let mut accepted = BTreeSet::new();
        accepted.insert(self.me.id);
        r.phase = Phase::Accept { proposal, accepted, since: now };
        r.next_send = now;
        self.regroup_progress(now);
    }

    fn try_choose(&mut self, now: Instant) {
        let r = self.regroup.as_ref().expect("accepting");
        let Phase::Accept { proposal, accepted, since } = &r.phase else { return };
        let base = r.base.clone();
        let proposal = proposal.clone();
        let voters: Vec<MemberId> = accepted.iter().copied().collect();
        let since = *since;
        let witness = self.witness_if_needed(&base, &voters);
        if base.is_quorum(&voters, witness) {
            self.regroup = None;
            let old: Vec<SocketAddr> =
                base.members.iter().filter(|m| !proposal.contains(m.id)).map(|m| m.addr).collect();
            if proposal.contains(self.me.id) {
                self.install(now, proposal.clone());
            } else {
                self.removed_from(now, proposal.clone());
            }
            let me = self.me.id;
            let new: Vec<SocketAddr> = proposal.members.iter().filter(|m| m.id != me).map(|m| m.addr).collect();
            for addr in new {
                self.send(addr, Message::Commit { view: proposal.clone() });
            }
            for addr in old {
                self.send(addr, Message::Commit { view: proposal.clone() });
            }
        } else if now.saturating_duration_since(since) >= self.config.regroup_max_wait {
            self.fail_regroup(now, "a quorum did not accept");
        }
    }

    fn fail_regroup(&mut self, now: Instant, why: &str) {
        self.counters.regroups_failed += 1;
        self.regroup = None;
        self.cautious = true;
        self.next_regroup_at = Some(now + self.config.regroup_retransmit);
        self.lose_quorum(why);
    }

    fn lose_quorum(&mut self, why: &str) {
        if self.status == Status::Member {
            let view = self.view.as_ref().map_or(0, |v| v.id);
            tracing::warn!(node = %self.me.name, view, "lost quorum ({why}): no longer acting as a member");
            self.status = Status::NoQuorum;
            self.push_event(MembershipEvent::QuorumLost { view });
        }
    }

    /// Gives up our own regroup for a higher ballot (a cascaded regroup).
    fn overtaken(&mut self, now: Instant, ballot: Ballot) {
        self.round_seen = self.round_seen.max(ballot.round);
        if self.regroup.as_ref().is_some_and(|r| r.ballot < ballot) {
            self.counters.regroups_failed += 1;
            self.regroup = None;
            self.cautious = true;
            self.reason_since = Some(now);
        }
    }

    // ---- regroup: the acceptor ----

    /// Checks that a regroup message is about our view from one of its members; answers
    /// stale senders with our view and asks newer ones for theirs.
    fn regroup_message_ok(&mut self, now: Instant, from: SocketAddr, sender: MemberId, base: u64) -> bool {
        let Some(view) = self.view.clone() else {
            self.counters.ignored += 1;
            return false;
        };
        if base < view.id {
            if self.catchup.allow(now, from) {
                self.send(from, Message::Commit { view });
            }
            return false;
        }
        if base > view.id {
            if self.catchup.allow(now, from) {
                self.send(from, Message::ViewRequest);
            }
            return false;
        }
        if !view.contains(sender) {
            self.counters.ignored += 1;
            return false;
        }
        true
    }

    fn on_prepare(&mut self, now: Instant, from: SocketAddr, sender: MemberId, base: u64, ballot: Ballot) {
        if self.view.is_none() {
            // A regroup that may admit us asks whether we are still here.
            if self.asking_to_join(now) {
                self.asked_by_regroup = true;
                self.send(from, Message::JoinerAlive { base, ballot });
            } else {
                self.counters.ignored += 1;
            }
            return;
        }
        if !self.regroup_message_ok(now, from, sender, base) {
            return;
        }
        self.round_seen = self.round_seen.max(ballot.round);
        if ballot < self.promised {
            self.send(from, Message::Nack { base, promised: self.promised });
            return;
        }
        self.overtaken(now, ballot);
        self.promised = ballot;
        self.promised_to = Some(sender);
        self.row_resends = if self.local_suspects.is_empty() { 0 } else { self.config.row_resends() };
        let promise = Message::Promise {
            base,
            ballot,
            accepted: self.accepted.as_ref().map(|(b, v, _)| (*b, v.clone())),
            suspects: self.local_suspects.iter().copied().collect(),
            row: self.row_version,
        };
        self.send(from, promise);
        // Check the members we cannot hear: if they answer, our row is corrected.
        for s in self.local_suspects.clone() {
            self.send_to(s, Message::Probe);
        }
    }

    fn on_promise(&mut self, now: Instant, sender: MemberId, base: u64, ballot: Ballot, row: PromiseRow) {
        let Some(r) = self.regroup.as_mut() else { return };
        if r.base.id != base || r.ballot != ballot || !r.base.contains(sender) {
            self.counters.ignored += 1;
            return;
        }
        if let Some((b, v)) = &row.accepted {
            // A value accepted at a higher ballot than ours would mean a broken acceptor.
            if *b > ballot || v.id != base + 1 {
                self.counters.ignored += 1;
                return;
            }
        }
        if r.promises.get(&sender).is_some_and(|held| held.row > row.row) {
            // An older row overtaken by its correction: keep the correction.
            self.counters.ignored += 1;
            return;
        }
        let collecting = matches!(r.phase, Phase::Collect);
        r.promises.insert(sender, row);
        if collecting {
            self.try_decide(now);
        }
    }

    fn on_nack(&mut self, now: Instant, base: u64, promised: Ballot) {
        if self.regroup.as_ref().is_some_and(|r| r.base.id == base) {
            self.overtaken(now, promised);
        }
    }

    fn on_accept(
        &mut self,
        now: Instant,
        from: SocketAddr,
        sender: MemberId,
        base: u64,
        ballot: Ballot,
        proposal: View,
    ) {
        if !self.regroup_message_ok(now, from, sender, base) {
            return;
        }
        self.round_seen = self.round_seen.max(ballot.round);
        // The proposal may exclude its proposer: it can be a view accepted in an earlier
        // ballot that the proposer must carry on (the rule that keeps a choice unique).
        if ballot < self.promised || proposal.id != base + 1 {
            self.send(from, Message::Nack { base, promised: self.promised });
            return;
        }
        self.overtaken(now, ballot);
        self.promised = ballot;
        self.promised_to = Some(sender);
        let already = self.accepted.as_ref().is_some_and(|(b, _, _)| *b == ballot);
        if !already {
            self.accepted = Some((ballot, proposal, now));
        }
        self.send(from, Message::Accepted { base, ballot });
    }

    fn on_accepted(&mut self, now: Instant, sender: MemberId, base: u64, ballot: Ballot) {
        let Some(r) = self.regroup.as_mut() else { return };
        if r.base.id != base || r.ballot != ballot || !r.base.contains(sender) {
            self.counters.ignored += 1;
            return;
        }
        if let Phase::Accept { accepted, .. } = &mut r.phase {
            accepted.insert(sender);
            self.try_choose(now);
        }
    }

    // ---- views ----

    /// A chosen view arrived (a `Commit`): install it if it is newer and includes us; if
    /// it is newer and excludes us, we were removed.
    fn learn_view(&mut self, now: Instant, view: View) {
        let current = self.view.as_ref().map_or(0, |v| v.id);
        if view.id <= current {
            return;
        }
        if view.contains(self.me.id) {
            self.install(now, view);
        } else if self.view.is_some() {
            self.removed_from(now, view);
        } else if let Some(check) = &mut self.rejoin {
            for m in &view.members {
                if !self.seeds.contains(&m.addr) {
                    self.seeds.push(m.addr);
                }
            }
            check.newer_view(view);
        } else {
            self.counters.ignored += 1;
        }
    }

    fn install(&mut self, now: Instant, view: View) {
        debug_assert!(view.contains(self.me.id), "a node installs only views it is in");
        let old = self.view.take();
        for m in &view.members {
            if old.as_ref().is_none_or(|o| !o.contains(m.id)) {
                self.push_event(MembershipEvent::Joined { member: m.clone(), view: view.id });
            }
        }
        if let Some(o) = &old {
            for m in o.members.iter().filter(|m| !view.contains(m.id)) {
                self.remember_removed(m.clone());
                self.push_event(MembershipEvent::Dead { member: m.clone(), view: view.id });
            }
        }
        // A removed identity whose node is back under a new one (same name or address) is
        // no longer reported as dead beside it.
        self.removed.retain(|m| !view.members.iter().any(|v| v.id == m.id || v.name == m.name || v.addr == m.addr));
        tracing::info!(node = %self.me.name, view = view.id, members = view.len(), "installed a view");
        self.status = Status::Member;
        self.promised = Ballot::default();
        self.accepted = None;
        self.promised_to = None;
        self.regroup = None;
        self.cautious = false;
        self.reason_since = None;
        self.unresolved_since = None;
        self.next_regroup_at = None;
        self.next_join = None;
        self.rejoin = None;
        self.join_attempts = 0;
        self.seeds_answered.clear();
        self.asked_by_regroup = false;
        self.suspicions.retain(|t, _| view.contains(*t));
        self.announced_suspects.retain(|t| view.contains(*t));
        self.local_suspects.retain(|t| view.contains(*t));
        self.joiners.retain(|id, _| !view.contains(*id));
        self.gossip.reset(now, &view, self.config.gossip_fail_after(view.len()));
        for d in &mut self.fast {
            d.reset(now, &view);
        }
        self.counters.views_installed += 1;
        self.view = Some(view.clone());
        self.push_event(MembershipEvent::ViewInstalled { view });
    }

    /// Remembers a removed member for status reports, in place of any earlier identity of
    /// the same node (same name and address).
    fn remember_removed(&mut self, m: Member) {
        self.removed.retain(|r| r.name != m.name || r.addr != m.addr);
        if self.removed.len() >= REMOVED_MAX {
            self.removed.pop_front();
        }
        self.removed.push_back(m);
    }

    fn removed_from(&mut self, now: Instant, newer: View) {
        tracing::warn!(
            node = %self.me.name,
            view = newer.id,
            "removed from the cluster: no longer a member; rejoining once every member answers a probe"
        );
        for m in newer.members.iter().filter(|m| m.id != self.me.id) {
            if !self.seeds.contains(&m.addr) {
                self.seeds.push(m.addr);
            }
        }
        self.view = None;
        self.status = Status::Joining;
        self.regroup = None;
        self.promised = Ballot::default();
        self.accepted = None;
        self.promised_to = None;
        self.local_suspects.clear();
        self.suspicions.clear();
        self.announced_suspects.clear();
        self.joiners.clear();
        self.reason_since = None;
        self.unresolved_since = None;
        self.gossip.clear();
        for d in &mut self.fast {
            d.clear();
        }
        self.next_join = Some(now);
        self.join_attempts = 0;
        self.seeds_answered.clear();
        self.asked_by_regroup = false;
        self.rejoin = Some(RejoinCheck::new(newer.clone(), self.config.buddy_fail_after()));
        self.push_event(MembershipEvent::Removed { view: newer.id });
    }
}

/// Addresses for a log line: `a,b,c`.
fn addr_list<'a>(addrs: impl Iterator<Item = &'a SocketAddr>) -> String {
    addrs.map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

/// A rough bound used by tests and tools: how long a join takes on a quiet network (a
/// few round trips plus one retry).
pub fn join_bound(config: &Config) -> Duration {
    config.join_retry * 2 + config.regroup_retransmit * 4
}
