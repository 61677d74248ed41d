//! The locker's side: grant the lock (assign positions), keep every granted entry for
//! replay, take over transmissions whose sender went quiet, heartbeat, confirm reads, move
//! the voting configuration after the views — and, when a node becomes locker, sync:
//! collect the members' logs, decide the log, replay it.

use super::{AfterDurable, BatchId, Entry, Epoch, Gup, Msg, NodeId, Part, Record, VotingConfig};
use crate::codec::SnapshotPart;
use crate::codec::PARTS_PER_ENTRY_MAX;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// Most lock requests waiting at the locker for the next grant (one per sender and window
/// slot in practice: senders × `window`); beyond it requests are dropped and sent again.
pub(super) const LOCK_QUEUE_MAX: usize = 1 << 16;

/// How many of a sender's most recent batches the locker remembers. A sender has at most
/// `window` batches outstanding, all among its `window` most recent, so a request for an
/// older batch is a delayed duplicate and is refused (granting it would apply it twice).
pub(super) const GRANT_MEMORY: u64 = 64;

/// Most positions a member outside the eager sets is owed before the locker delivers them
/// (with `catchup_entries_max`, whichever is smaller): one catch-up message carries them.
const LAZY_POSITIONS_MAX: u64 = 32;

/// A member whose acknowledged log is at most this many positions behind the committed
/// position counts as holding the log, and is voted in.
const VOTE_IN_LAG_MAX: u64 = 64;

/// The smallest voter set the locker moves to while the configuration has at least this
/// many voters: three is the smallest set that keeps a quorum when one voter is lost for
/// good. A view can be late — it may still list a member that has just failed and lost its
/// log (it comes back under a new identity) — so a set of two picked from it may already
/// depend on a voter that is gone, and then no quorum of it, hence no sync and no commit
/// under it, is ever possible again. Voters the view dropped therefore leave only as
/// members that hold the log take their place.
const VOTERS_MIN: usize = 3;

/// Most bytes of entries in one catch-up message (a catch-up that needs more is sent in
/// several). Keeps every message far below the transport's request limit.
const CATCHUP_BYTES_MAX: usize = 4 << 20;

pub(super) struct LockerState {
    /// Last granted position.
    pub(super) granted: u64,
    /// Recent grants by sender (and its incarnation): batch counter to position and whether
    /// it is combined, for answering repeated requests alike. See [`GRANT_MEMORY`].
    grants: HashMap<(NodeId, u32), BTreeMap<u64, (u64, bool)>>,
    /// Lock requests waiting for the next grant, and since when the first waits.
    queued: Vec<Part>,
    pub(super) queued_since: Option<Instant>,
    /// Since when the queued requests could be granted (`grants_in_flight_max` allowed it);
    /// the grant hold ([`crate::gup::GupConfig::grant_hold_max`]) counts from here.
    pub(super) grantable_since: Option<Instant>,
    /// Senders seen recently: when each last asked for the lock and the last position it was
    /// granted. Bounded by the members (entries idle for `sender_idle_after` are dropped).
    senders: HashMap<NodeId, SenderSeen>,
    /// Combined positions whose senders are told when they are committed.
    notify: BTreeMap<u64, Vec<NodeId>>,
    /// Members outside the eager set of some combined positions (see
    /// [`crate::gup::GupConfig::eager_spare`]): the first position each is owed, and since
    /// when. Bounded by the members.
    owed: BTreeMap<NodeId, (u64, Instant)>,
    /// When each uncommitted position was granted or last transmitted by me.
    pending: BTreeMap<u64, Instant>,
    /// Nodes known to hold this epoch's log (answered a catch-up).
    synced: Vec<NodeId>,
    /// When each late member was last sent an establishing catch-up (its whole missing log
    /// tail). Its sync states within `heartbeat_interval` after that are repeats — over TCP,
    /// the requests and heartbeats queued behind a partition arrive at once when it heals,
    /// and each would cost another copy of the tail — so they get none. Bounded by the
    /// members.
    established: HashMap<NodeId, Instant>,
    /// Heartbeat rounds.
    pub(super) round: u64,
    round_acks: Vec<NodeId>,
    pub(super) confirmed_round: u64,
    last_heartbeat: Instant,
    /// Read-index requests: (asker, id, index, round that must be confirmed).
    pub(super) reads: Vec<(NodeId, u64, u64, u64)>,
}

/// What the locker remembers of a sender, to hold a grant for it (see
/// [`LockerState::awaits_sender`]).
#[derive(Clone, Copy, Debug)]
struct SenderSeen {
    last_request: Instant,
    last_granted: u64,
}

/// A peer's answer to a sync request.
#[derive(Clone, Debug)]
pub(super) struct PeerState {
    pub(super) epoch: Epoch,
    pub(super) last_normal: Option<Epoch>,
    pub(super) applied: u64,
    pub(super) commit: u64,
    pub(super) snapshot: SnapshotPart,
    pub(super) entries: Vec<(u64, Entry)>,
}

pub(super) struct SyncCollect {
    epoch: Epoch,
    from: u64,
    last_sent: Instant,
    states: BTreeMap<NodeId, PeerState>,
    /// Voters of the configuration found so far that are not among the usual targets.
    extra_targets: Vec<NodeId>,
}

impl LockerState {
    /// Whether a recently active sender has neither a request queued nor a position in
    /// flight: its clients were answered and are likely sending their next updates, which
    /// are worth waiting for (briefly) so that they share the next position.
    pub(super) fn awaits_sender(&self, now: Instant, commit: u64, idle_after: std::time::Duration) -> bool {
        self.senders.iter().any(|(origin, seen)| {
            now < seen.last_request + idle_after
                && seen.last_granted <= commit
                && !self.queued.iter().any(|q| q.origin == *origin)
        })
    }

    /// When the queued requests are granted, if nothing else stops them first.
    pub(super) fn grant_at(&self, now: Instant, commit: u64, config: &super::GupConfig) -> Option<Instant> {
        let queued_since = self.queued_since?;
        if self.granted >= commit + config.grants_in_flight_max.max(1) {
            return None;
        }
        let mut at = queued_since + config.grant_delay;
        if let Some(since) = self.grantable_since {
            if self.awaits_sender(now, commit, config.sender_idle_after) {
                at = at.max(since + config.grant_hold_max);
            }
        }
        Some(at)
    }

    /// Whether anything waits for the tick: requests, uncommitted positions, reads.
    pub(super) fn busy(&self, commit: u64) -> bool {
        !self.queued.is_empty()
            || self.granted > commit
            || !self.notify.is_empty()
            || !self.reads.is_empty()
            || !self.owed.is_empty()
    }

    pub(super) fn next_heartbeat(&self, interval: std::time::Duration) -> Instant {
        self.last_heartbeat + interval
    }

    pub(super) fn mark_synced(&mut self, n: NodeId) {
        if !self.synced.contains(&n) {
            self.synced.push(n);
        }
    }
}

impl Gup {
    /// A view in which I am the locker was installed: every view gets its own epoch (a
    /// reign begun in an older view may have been overtaken without my knowing), whose sync
    /// brings the new members in.
    pub(super) fn on_view_as_locker(&mut self, now: Instant) {
        let view = self.view.as_ref().expect("called with a view").id;
        if self.promised.locker == self.me
            && self.promised.view == view
            && (self.locker.is_some() || self.sync.is_some())
        {
            self.sync_requests(now);
            return;
        }
        let epoch = if (Epoch { view, round: 0, locker: self.me }) > self.promised {
            Epoch { view, round: 0, locker: self.me }
        } else if self.promised.view == view {
            // A new reign in the same view (I restarted, or another node locked in a view
            // numbered like mine): a new round.
            Epoch { view, round: self.promised.round + 1, locker: self.me }
        } else {
            // I promised a locker of a newer view than mine: mine is out of date.
            return;
        };
        self.start_sync(now, epoch);
    }

    fn start_sync(&mut self, now: Instant, epoch: Epoch) {
        tracing::debug!(me = %self.me, %epoch, "becoming locker: sync");
        let lsn = self.promise(epoch);
        let from = self.applied + 1;
        self.locker = None;
        self.sync =
            Some(SyncCollect { epoch, from, last_sent: now, states: BTreeMap::new(), extra_targets: Vec::new() });
        self.after_durable.push_back((lsn, AfterDurable::SendSyncState { to: self.me, epoch, from }));
        self.sync_requests(now);
    }

    /// Asks the members that have not answered (or are not synced) for their state.
    fn sync_requests(&mut self, now: Instant) {
        let epoch = self.promised;
        let (from, answered, extra): (u64, Vec<NodeId>, Vec<NodeId>) = match (&self.sync, &self.locker) {
            (Some(s), _) => (s.from, s.states.keys().copied().collect(), s.extra_targets.clone()),
            (None, Some(l)) => (self.applied + 1, l.synced.clone(), Vec::new()),
            (None, None) => return,
        };
        if let Some(s) = &mut self.sync {
            s.last_sent = now;
        }
        let mut targets = self.targets_after(self.me);
        targets.extend(extra.into_iter().filter(|n| *n != self.me));
        targets.sort_unstable();
        targets.dedup();
        for to in targets {
            if !answered.contains(&to) {
                self.send(to, Msg::SyncRequest { epoch, from });
            }
        }
    }

    /// My own state or a peer's, answering the sync of `epoch`.
    pub(super) fn on_sync_state(&mut self, now: Instant, from: NodeId, state: PeerState) {
        if state.epoch != self.promised || self.promised.locker != self.me {
            self.counters.stale += 1;
            return;
        }
        if let Some(locker) = &mut self.locker {
            // Already reigning: a late or new member. Bring it into the epoch, once per
            // heartbeat period at most (a lost catch-up is asked for again at the next
            // heartbeat the member receives, so the limit delays nobody).
            locker.mark_synced(from);
            if locker.established.get(&from).is_some_and(|&t| t + self.config.heartbeat_interval > now) {
                self.counters.repeated_sync_states += 1;
                return;
            }
            locker.established.insert(from, now);
            let end = locker.granted;
            self.send_catchup(from, true, state.applied + 1, end);
            return;
        }
        let Some(sync) = &mut self.sync else { return };
        sync.states.insert(from, state);
        self.try_finish_sync(now);
    }

    fn try_finish_sync(&mut self, now: Instant) {
        let sync = self.sync.as_ref().expect("collecting");
        // Nodes that never held an epoch's log have nothing to say about the log.
        let holders: Vec<(NodeId, &PeerState)> =
            sync.states.iter().filter(|(_, s)| s.last_normal.is_some()).map(|(n, s)| (*n, s)).collect();
        let Some(newest) = holders.iter().filter_map(|(_, s)| s.last_normal).max() else { return };
        let from = sync.from;
        let epoch = sync.epoch;
        let commit_seen = sync.states.values().map(|s| s.commit).max().unwrap_or(0);
        // A newer snapshot than my applied position: it is committed state, take it.
        let snapshot =
            sync.states.values().filter_map(|s| s.snapshot.clone()).filter(|s| s.seq >= from).max_by_key(|s| s.seq);
        let start = snapshot.as_ref().map_or(from, |s| s.seq + 1);
        let mut merged: BTreeMap<u64, Entry> = BTreeMap::new();
        for (_, s) in holders.iter().filter(|(_, s)| s.last_normal == Some(newest)) {
            for (seq, e) in s.entries.iter().filter(|(seq, _)| *seq >= start) {
                merged.entry(*seq).or_insert_with(|| e.clone());
            }
        }
        let end = merged.keys().next_back().copied().unwrap_or(0).max(commit_seen).max(start - 1);
        // Who votes on this log: the configuration at its end.
        let config = merged
            .values()
            .rev()
            .find_map(|e| match e {
                Entry::Config(c) => Some(c.clone()),
                _ => None,
            })
            .or_else(|| snapshot.as_ref().map(|s| s.config.clone()))
            .or_else(|| self.config_at(start - 1).cloned());
        let Some(config) = config else {
            tracing::debug!(me = %self.me, "sync: no configuration known yet; waiting for more answers");
            return;
        };
        if !config.is_quorum(|n| holders.iter().any(|(h, _)| *h == n)) {
            // Ask the voters of this configuration too, whatever my view says.
            let extra = config.all();
            self.sync.as_mut().expect("collecting").extra_targets = extra;
            return;
        }
        for seq in start..=commit_seen {
            if !merged.contains_key(&seq) {
                // Someone knows this position committed, yet no log of the newest epoch
                // in this quorum has it: wait for more answers rather than guess.
                tracing::warn!(me = %self.me, seq, "sync: a committed position is missing; waiting for more answers");
                return;
            }
        }
        let sync = self.sync.take().expect("collecting");
        self.counters.syncs += 1;
        if let Some(s) = snapshot {
            self.install_snapshot(s, false);
        }
        self.truncate_after(start - 1);
        for seq in start..=end {
            let entry = merged.remove(&seq).unwrap_or_else(|| {
                self.counters.skips += 1;
                Entry::Skip
            });
            self.persist_entry(seq, entry);
        }
        self.commit = self.commit.max(commit_seen.min(end));
        self.last_normal = Some(epoch);
        let lsn = self.persist(Record::Normal { epoch });
        let answered: Vec<(NodeId, u64)> =
            sync.states.iter().filter(|(n, _)| **n != self.me).map(|(n, s)| (*n, s.applied)).collect();
        self.locker = Some(LockerState {
            granted: end,
            grants: HashMap::new(),
            queued: Vec::new(),
            queued_since: None,
            grantable_since: None,
            senders: HashMap::new(),
            notify: BTreeMap::new(),
            owed: BTreeMap::new(),
            pending: BTreeMap::new(),
            synced: vec![self.me],
            established: HashMap::new(),
            round: 0,
            round_acks: Vec::new(),
            confirmed_round: 0,
            last_heartbeat: now,
            reads: Vec::new(),
        });
        self.after_durable.push_back((lsn, AfterDurable::LockerReady { epoch }));
        tracing::debug!(me = %self.me, %epoch, start, end, %config, "sync decided the log");
        // Those who answered get the decided log once it is durable here (LockerReady).
        self.locker_pending_establish = answered;
    }

    /// The decided log is durable here: start granting, and replay the log to everyone who
    /// answered (the others get it when they answer).
    pub(super) fn locker_ready(&mut self, now: Instant, epoch: Epoch) {
        if self.promised != epoch || self.locker.is_none() {
            return;
        }
        self.normal = true;
        self.peer_prefix.clear();
        let (granted, grants) = {
            let mut grants: HashMap<(NodeId, u32), BTreeMap<u64, (u64, bool)>> = HashMap::new();
            for (seq, slot) in self.log.range(self.applied + 1..) {
                for p in slot.entry.parts() {
                    // Whoever delivered it before, the locker finishes it now.
                    grants.entry((p.origin, p.batch.incarnation)).or_default().insert(p.batch.counter, (*seq, true));
                }
            }
            (self.log.keys().next_back().copied().unwrap_or(self.base).max(self.base), grants)
        };
        let pending: BTreeMap<u64, Instant> = (self.commit + 1..=granted).map(|s| (s, now)).collect();
        let locker = self.locker.as_mut().expect("checked");
        locker.granted = granted;
        locker.grants = grants;
        locker.pending = pending;
        self.granted_known = self.granted_known.max(granted);
        self.sender_epoch_changed(now, granted);
        for (n, applied) in std::mem::take(&mut self.locker_pending_establish) {
            let locker = self.locker.as_mut().expect("checked");
            locker.mark_synced(n);
            locker.established.insert(n, now);
            self.send_catchup(n, true, applied + 1, granted);
        }
        // Everyone else is asked (again) for its state.
        self.sync_requests(now);
        self.heartbeat(now);
    }

    /// Queues a lock request for the next grant (see [`Gup::poll_event`]); a request the
    /// locker granted already is answered with the same position.
    pub(super) fn queue_lock_request(
        &mut self,
        now: Instant,
        origin: NodeId,
        batch: BatchId,
        updates: Arc<[Arc<[u8]>]>,
    ) {
        let Some(locker) = self.locker.as_mut().filter(|_| self.normal) else { return };
        let known = locker.grants.get(&(origin, batch.incarnation)).and_then(|r| r.get(&batch.counter)).copied();
        if let Some((seq, combined)) = known {
            self.answer_grant(now, origin, batch, seq, combined);
            return;
        }
        if locker.queued.iter().any(|q| q.origin == origin && q.batch == batch) {
            return;
        }
        if locker.queued.len() >= LOCK_QUEUE_MAX {
            // Overflow: the sender asks again after `retransmit_after`.
            self.counters.stale += 1;
            return;
        }
        locker.queued.push(Part { origin, batch, updates });
        locker.queued_since.get_or_insert(now);
        self.timing.requested(now, origin);
        let locker = self.locker.as_mut().expect("checked");
        let seen = locker.senders.entry(origin).or_insert(SenderSeen { last_request: now, last_granted: 0 });
        seen.last_request = now;
    }

    fn answer_grant(&mut self, now: Instant, origin: NodeId, batch: BatchId, seq: u64, combined: bool) {
        let epoch = self.promised;
        match (origin == self.me, combined) {
            (true, false) => self.on_grant(now, origin, epoch, batch, seq),
            (true, true) => self.on_grant_combined(now, origin, epoch, batch, seq),
            (false, false) => self.send(origin, Msg::Grant { epoch, batch, seq }),
            (false, true) => self.send(origin, Msg::GrantCombined { epoch, batch, seq }),
        }
    }

    /// Delivers a combined entry at once to its senders and to enough voters (in circular
    /// order after me) for a quorum and `eager_spare` more; the other members are owed it
    /// and get it with later positions ([`Gup::deliver_owed`]).
    ///
    /// A member of this eager set that is owed earlier positions gets them first, in the
    /// same turn: with a hole below `seq` it could neither acknowledge `seq` (it
    /// acknowledges durable prefixes) nor, as one of its senders, apply it and answer its
    /// clients until the owed positions came, up to `lazy_delivery_max` later. A sender that
    /// missed one position would then miss the next ones too, each time owed again, and
    /// with a few such senders every commit would wait for the lazy delivery.
    fn deliver_combined(&mut self, now: Instant, epoch: Epoch, seq: u64, entry: Entry, origins: &[NodeId]) {
        let targets = self.targets_after(self.me);
        let eager = self.eager_targets(&targets, origins);
        self.last_eager.clone_from(&eager);
        let commit = self.commit;
        for to in targets {
            if eager.contains(&to) {
                self.deliver_owed_before(to, seq);
                self.send(to, Msg::Batch { epoch, seq, commit, entry: entry.clone() });
            } else {
                let locker = self.locker.as_mut().expect("locker");
                locker.owed.entry(to).or_insert((seq, now));
            }
        }
    }

    /// The members that get a combined entry at once: its senders, and voters up to a
    /// quorum of the configuration with me plus `eager_spare`. Everyone during a joint
    /// configuration (two majorities to gather) or without a configuration.
    fn eager_targets(&self, targets: &[NodeId], origins: &[NodeId]) -> Vec<NodeId> {
        let Some(config) = self.voting_config().filter(|c| !c.is_joint()) else { return targets.to_vec() };
        let voters = &config.voters;
        let others_needed = voters.len() / 2 + 1 - usize::from(voters.contains(&self.me));
        let wanted = others_needed.saturating_add(self.config.eager_spare);
        let mut eager: Vec<NodeId> = targets.iter().copied().filter(|t| origins.contains(t)).collect();
        let mut counted = eager.iter().filter(|t| voters.contains(t)).count();
        for &t in targets {
            if counted >= wanted {
                break;
            }
            if voters.contains(&t) && !eager.contains(&t) {
                eager.push(t);
                counted += 1;
            }
        }
        eager
    }

    /// Sends `to` the positions it is owed below `seq`, if any, ahead of `seq` itself.
    fn deliver_owed_before(&mut self, to: NodeId, seq: u64) {
        let Some(locker) = self.locker.as_mut() else { return };
        let Some(&(first, _)) = locker.owed.get(&to) else { return };
        locker.owed.remove(&to);
        if first < seq {
            self.counters.owed_with_delivery += 1;
            self.send_catchup(to, false, first, seq - 1);
        }
    }

    /// Sends the members outside the eager sets the positions they are owed: those whose
    /// oldest has waited `lazy_delivery_max`, or that are owed many — or all of them
    /// (`all`: a heartbeat), or one (`only`: before its read is confirmed).
    pub(super) fn deliver_owed(&mut self, now: Instant, all: bool, only: Option<NodeId>) {
        let Some(locker) = self.locker.as_mut().filter(|_| self.normal) else { return };
        if locker.owed.is_empty() {
            return;
        }
        let granted = locker.granted;
        let wait = self.config.lazy_delivery_max;
        let many = (self.config.catchup_entries_max as u64).clamp(1, LAZY_POSITIONS_MAX);
        let due: Vec<(NodeId, u64)> = locker
            .owed
            .iter()
            .filter(|(n, (first, since))| match only {
                Some(o) => **n == o,
                None => all || *since + wait <= now || granted + 1 - *first >= many,
            })
            .map(|(n, (first, _))| (*n, *first))
            .collect();
        for (to, first) in due {
            self.locker.as_mut().expect("locker").owed.remove(&to);
            self.counters.owed_deliveries += 1;
            self.send_catchup(to, false, first, granted);
        }
    }

    /// Grants every queued request: one alone gets its own position, delivered by its
    /// sender as in MSCS; several share one position (one entry, one fsync per member, one
    /// acknowledgement each), which the locker delivers itself. Holds them while
    /// `grants_in_flight_max` positions are uncommitted (they batch meanwhile; and the log
    /// stays bounded when a quorum is missing).
    pub(super) fn flush_grants(&mut self) {
        if !self.is_locker() {
            return;
        }
        let now = self.last_now;
        let commit = self.commit;
        let in_flight_max = self.config.grants_in_flight_max.max(1);
        let idle_after = self.config.sender_idle_after;
        let locker = self.locker.as_mut().expect("locker");
        if locker.queued.is_empty() {
            return;
        }
        if locker.granted >= commit + in_flight_max {
            locker.grantable_since = None;
            return;
        }
        locker.grantable_since.get_or_insert(now);
        locker.senders.retain(|_, seen| now < seen.last_request + idle_after);
        if locker.grant_at(now, commit, &self.config).is_some_and(|at| now < at) {
            return;
        }
        locker.queued_since = None;
        let grantable_since = locker.grantable_since.take();
        let queued = std::mem::take(&mut locker.queued);
        let mut fresh = Vec::with_capacity(queued.len());
        for part in queued {
            let recent = locker.grants.entry((part.origin, part.batch.incarnation)).or_default();
            let newest = recent.keys().next_back().copied().unwrap_or(0);
            if part.batch.counter + GRANT_MEMORY <= newest {
                self.counters.stale += 1;
                continue;
            }
            fresh.push(part);
        }
        let epoch = self.promised;
        for chunk in fresh.chunks(PARTS_PER_ENTRY_MAX) {
            let combined = chunk.len() > 1;
            let locker = self.locker.as_mut().expect("locker");
            locker.granted += 1;
            let seq = locker.granted;
            for p in chunk {
                if let Some(seen) = locker.senders.get_mut(&p.origin) {
                    seen.last_granted = seq;
                }
                let recent = locker.grants.entry((p.origin, p.batch.incarnation)).or_default();
                recent.insert(p.batch.counter, (seq, combined));
                while recent.len() as u64 > GRANT_MEMORY {
                    recent.pop_first();
                }
            }
            locker.pending.insert(seq, now);
            self.timing.granted(now, seq, grantable_since);
            if combined {
                self.counters.combined += 1;
                let origins: Vec<NodeId> = chunk.iter().map(|p| p.origin).filter(|&o| o != self.me).collect();
                locker.notify.insert(seq, origins);
            }
            self.counters.grants += 1;
            let entry = Entry::Updates { parts: Arc::from(chunk) };
            self.persist_entry(seq, entry.clone());
            if combined {
                let origins: Vec<NodeId> = chunk.iter().map(|p| p.origin).collect();
                self.deliver_combined(now, epoch, seq, entry, &origins);
            }
            if !combined {
                // Its sender transmits it to every member: those owed earlier positions get
                // them first, or they would hold it over a hole (see `deliver_combined`).
                while let Some(to) = self.locker.as_ref().and_then(|l| l.owed.keys().next().copied()) {
                    self.deliver_owed_before(to, seq);
                }
            }
            // The delivery of a combined entry is its senders' grant (see `on_batch`).
            let me = self.me;
            for p in chunk.iter().filter(|p| !combined || p.origin == me) {
                self.answer_grant(now, p.origin, p.batch, seq, combined);
            }
        }
    }

    /// Writes an entry of the locker's own (a configuration) at the next position and
    /// delivers it.
    fn locker_append(&mut self, now: Instant, entry: Entry) {
        let epoch = self.promised;
        let locker = self.locker.as_mut().expect("locker");
        locker.granted += 1;
        let seq = locker.granted;
        locker.pending.insert(seq, now);
        self.persist_entry(seq, entry.clone());
        self.transmit(epoch, seq, entry, None);
    }

    /// Moves the voting configuration one step towards the view's members that hold the
    /// log (joint consensus: `old → new`, then `new`, each only once the previous
    /// configuration entry is committed).
    pub(super) fn drive_config(&mut self, now: Instant) {
        if !self.is_locker() {
            return;
        }
        let (at, current) = match self.configs.last_key_value() {
            Some((s, c)) => (*s, c.clone()),
            None => match &self.base_config {
                Some(c) => (self.base, c.clone()),
                None => return,
            },
        };
        if at > self.commit {
            return;
        }
        let next = if current.is_joint() {
            Some(VotingConfig::new(current.voters.to_vec()))
        } else {
            let wanted = self.wanted_voters(&current);
            (wanted[..] != current.voters[..]).then(|| VotingConfig::joint(&current.voters, wanted))
        };
        if let Some(next) = next {
            tracing::debug!(me = %self.me, from = %current, to = %next, "configuration change");
            self.counters.config_changes += 1;
            self.locker_append(now, Entry::Config(next));
        }
    }

    /// The voters the view asks for: its members that vote already or hold the log (have
    /// acknowledged it in this epoch up to near the committed position), and me — kept at
    /// [`VOTERS_MIN`] at least (as far as the configuration and the view have voters) by
    /// keeping voters the view dropped, those that acknowledged most in this epoch first.
    fn wanted_voters(&self, current: &VotingConfig) -> Vec<NodeId> {
        let Some(view) = &self.view else { return current.voters.to_vec() };
        let mut wanted: Vec<NodeId> = view
            .members
            .iter()
            .copied()
            .filter(|&n| {
                n == self.me
                    || current.voters.contains(&n)
                    || self.peer_prefix.get(&n).is_some_and(|&p| p + VOTE_IN_LAG_MAX >= self.commit)
            })
            .collect();
        if !wanted.contains(&self.me) {
            wanted.push(self.me);
        }
        let mut dropped: Vec<NodeId> = current.voters.iter().copied().filter(|n| !wanted.contains(n)).collect();
        let floor = VOTERS_MIN.min(wanted.len() + dropped.len());
        if wanted.len() < floor {
            dropped.sort_by_key(|n| (std::cmp::Reverse(self.peer_prefix.get(n).copied().unwrap_or(0)), *n));
            wanted.extend(dropped.into_iter().take(floor - wanted.len()));
        }
        wanted.sort_unstable();
        wanted
    }

    /// Tells the senders of combined entries that became committed.
    pub(super) fn notify_commits(&mut self) {
        let commit = self.commit;
        let epoch = self.promised;
        let Some(locker) = self.locker.as_mut().filter(|_| self.normal) else { return };
        if locker.notify.first_key_value().is_none_or(|(s, _)| *s > commit) {
            return;
        }
        let rest = locker.notify.split_off(&(commit + 1));
        let done = std::mem::replace(&mut locker.notify, rest);
        let mut told: Vec<NodeId> = Vec::new();
        for to in done.into_values().flatten() {
            if !told.contains(&to) {
                told.push(to);
                self.timing.notified(self.last_now, to);
                self.send(to, Msg::Committed { epoch, upto: commit });
            }
        }
    }

    pub(super) fn on_lock_request(
        &mut self,
        now: Instant,
        from: NodeId,
        epoch: Epoch,
        batch: BatchId,
        updates: Vec<Arc<[u8]>>,
    ) {
        if epoch != self.promised || !self.is_locker() {
            self.counters.stale += 1;
            return;
        }
        self.queue_lock_request(now, from, batch, updates.into());
    }

    pub(super) fn on_unlock(&mut self, from: NodeId, epoch: Epoch, upto: u64) {
        if epoch != self.promised || !self.is_locker() {
            self.counters.stale += 1;
            return;
        }
        let granted = self.locker.as_ref().expect("locker").granted;
        if upto > granted {
            tracing::warn!(%from, upto, granted, "unlock beyond the granted position; ignored");
            return;
        }
        self.learn_commit(upto);
    }

    pub(super) fn on_repair_request(&mut self, from: NodeId, epoch: Epoch, first: u64, to: u64) {
        if epoch != self.promised || !self.is_locker() {
            self.counters.stale += 1;
            return;
        }
        let granted = self.locker.as_ref().expect("locker").granted;
        self.send_catchup(from, false, first, to.min(granted));
    }

    /// Sends positions `from..=end` (a snapshot first when they are no longer in the log).
    /// A repair gets one message of at most `catchup_entries_max` entries (the receiver asks
    /// again for the rest); an establishing catch-up carries the whole log up to `end`, in
    /// as many messages as it takes, the first one marked `establish`. Entries are cloned
    /// one message at a time, so a repair of a long range copies only what it sends.
    pub(super) fn send_catchup(&mut self, to: NodeId, establish: bool, from: u64, end: u64) {
        let epoch = self.promised;
        let mut snapshot = if from <= self.base { self.snapshot.clone() } else { None };
        let mut next = if snapshot.is_some() { self.base + 1 } else { from.max(self.base + 1) };
        let mut from_field = if snapshot.is_some() { self.base } else { next };
        let mut establish_flag = establish;
        loop {
            let (entries, rest) = self.catchup_chunk(next, end);
            self.send(
                to,
                Msg::Catchup {
                    epoch,
                    establish: establish_flag,
                    from: from_field,
                    end,
                    commit: self.commit,
                    snapshot: snapshot.take(),
                    entries,
                },
            );
            match rest {
                Some(seq) if establish => {
                    establish_flag = false;
                    from_field = seq;
                    next = seq;
                }
                _ => break,
            }
        }
    }

    /// The log's entries from `first` up to `end`, as many as one catch-up message holds
    /// (`catchup_entries_max` entries, `CATCHUP_BYTES_MAX` bytes, at least one entry), and
    /// the position of the first entry left for another message.
    fn catchup_chunk(&self, first: u64, end: u64) -> (Vec<(u64, Entry)>, Option<u64>) {
        let mut chunk: Vec<(u64, Entry)> = Vec::new();
        let mut bytes = 0;
        if end < first {
            return (chunk, None);
        }
        for (&seq, slot) in self.log.range(first..=end) {
            let size = slot.entry.updates().map(|u| u.len() + 4).sum::<usize>() + 32;
            if !chunk.is_empty() && (chunk.len() >= self.config.catchup_entries_max || bytes + size > CATCHUP_BYTES_MAX)
            {
                return (chunk, Some(seq));
            }
            bytes += size;
            chunk.push((seq, slot.entry.clone()));
        }
        (chunk, None)
    }

    pub(super) fn locker_tick(&mut self, now: Instant) {
        if let Some(sync) = &self.sync {
            if sync.last_sent + self.config.sync_retry <= now {
                self.sync_requests(now);
            }
            return;
        }
        if !self.is_locker() {
            return;
        }
        let epoch = self.promised;
        // Case 1: the sender has gone quiet; transmit for it.
        let commit = self.commit;
        let takeover_after = self.config.takeover_after;
        let locker = self.locker.as_mut().expect("locker");
        locker.pending = locker.pending.split_off(&(commit + 1));
        let due: Vec<u64> =
            locker.pending.iter().filter(|(_, t)| **t + takeover_after <= now).map(|(s, _)| *s).collect();
        for seq in due {
            self.locker.as_mut().expect("locker").pending.insert(seq, now);
            if let Some(slot) = self.log.get(&seq) {
                let entry = slot.entry.clone();
                self.counters.takeovers += 1;
                self.transmit(epoch, seq, entry, Some(()));
            }
        }
        let locker = self.locker.as_ref().expect("locker");
        if locker.last_heartbeat + self.config.heartbeat_interval <= now {
            self.heartbeat(now);
        } else {
            self.deliver_owed(now, false, None);
        }
        let unsynced =
            self.targets_after(self.me).iter().any(|n| !self.locker.as_ref().expect("locker").synced.contains(n));
        if unsynced && self.locker.as_ref().expect("locker").last_heartbeat == now {
            self.sync_requests(now);
        }
    }

    /// A heartbeat round: the committed position to everyone, and a confirmation of my
    /// reign for the reads waiting on it.
    pub(super) fn heartbeat(&mut self, now: Instant) {
        // Owed positions first, so that a heartbeat's `granted` shows nobody a hole.
        self.deliver_owed(now, true, None);
        let epoch = self.promised;
        let commit = self.commit;
        let Some(locker) = self.locker.as_mut() else { return };
        locker.round += 1;
        locker.round_acks.clear();
        locker.last_heartbeat = now;
        let (granted, round) = (locker.granted, locker.round);
        for to in self.targets_after(self.me) {
            self.send(to, Msg::Heartbeat { epoch, commit, granted, round });
        }
        self.round_confirmed_by(self.me, round);
    }

    /// `from` acknowledged heartbeat round `round` of my epoch: a round acknowledged by a
    /// quorum of my latest configuration confirms that no newer epoch has started.
    pub(super) fn round_confirmed_by(&mut self, from: NodeId, round: u64) {
        let Some(config) = self.voting_config().cloned() else { return };
        let Some(locker) = self.locker.as_mut() else { return };
        if round != locker.round || locker.round_acks.contains(&from) {
            return;
        }
        locker.round_acks.push(from);
        if config.is_quorum(|n| locker.round_acks.contains(&n)) {
            locker.confirmed_round = round;
        }
    }

    /// Replaces the state up to the snapshot's position by the snapshot. `same_epoch`: the
    /// snapshot comes from the epoch whose grants my batches hold (so a batch granted at or
    /// below its position is in it).
    pub(super) fn install_snapshot(&mut self, snapshot: super::Snapshot, same_epoch: bool) {
        let seq = snapshot.seq;
        if seq <= self.applied {
            return;
        }
        let data = snapshot.data.clone();
        self.applied = seq;
        self.commit = self.commit.max(seq);
        self.snapshot_installs += 1;
        self.set_base(snapshot);
        self.events.push_back(super::Event::InstallSnapshot { seq, data });
        self.sender_snapshot_installed(seq, same_epoch);
    }
}
