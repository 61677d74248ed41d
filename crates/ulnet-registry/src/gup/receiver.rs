//! The receiver's side: take entries in any order, acknowledge durable prefixes, follow the
//! locker's heartbeats, answer sync requests, adopt a new locker's log, repair holes — and
//! linearizable reads (read index confirmed by a heartbeat round of the locker).

use super::locker::PeerState;
use super::{AfterDurable, BatchId, Entry, Epoch, Event, Gup, Msg, NodeId, ReadId, Record};
use crate::codec::SnapshotPart;
use crate::codec::ENTRIES_PER_MESSAGE_MAX;
use std::time::Instant;

#[derive(Default)]
pub(super) struct Reads {
    next_id: u64,
    waiting: Vec<ReadWait>,
}

struct ReadWait {
    id: ReadId,
    deadline: Instant,
    index: Option<u64>,
    last_sent: Instant,
}

impl Reads {
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

impl Gup {
    /// Starts a linearizable read: [`Event::ReadReady`] says when the local state reflects
    /// every update committed before this call (serve the read from it then), or
    /// [`Event::ReadFailed`] after `read_timeout`.
    pub fn read(&mut self, now: Instant) -> ReadId {
        self.last_now = self.last_now.max(now);
        let id = ReadId(self.reads.next_id);
        self.reads.next_id += 1;
        self.reads.waiting.push(ReadWait { id, deadline: now + self.config.read_timeout, index: None, last_sent: now });
        self.request_read_index(id);
        self.reads_pump(now);
        id
    }

    fn request_read_index(&mut self, id: ReadId) {
        if !self.normal {
            return;
        }
        let epoch = self.promised;
        if self.is_locker() {
            self.queue_read_at_locker(self.me, id.0);
        } else {
            self.send(epoch.locker, Msg::ReadIndexRequest { epoch, id: id.0 });
        }
    }

    fn queue_read_at_locker(&mut self, asker: NodeId, id: u64) {
        let locker = self.locker.as_mut().expect("locker");
        let (index, round) = (locker.granted, locker.round + 1);
        locker.reads.push((asker, id, index, round));
    }

    pub(super) fn on_read_index_request(&mut self, _now: Instant, from: NodeId, epoch: Epoch, id: u64) {
        if epoch != self.promised || !self.is_locker() {
            self.counters.stale += 1;
            return;
        }
        self.queue_read_at_locker(from, id);
    }

    pub(super) fn on_read_index_reply(&mut self, from: NodeId, epoch: Epoch, id: u64, index: u64) {
        if epoch != self.promised || from != epoch.locker || !self.normal {
            self.counters.stale += 1;
            return;
        }
        if let Some(w) = self.reads.waiting.iter_mut().find(|w| w.id.0 == id) {
            w.index = Some(index);
        }
    }

    /// Answers confirmed read indexes (as locker) and releases reads whose index is applied.
    pub(super) fn reads_pump(&mut self, now: Instant) {
        let start_round = self
            .locker
            .as_ref()
            .filter(|_| self.normal)
            .is_some_and(|l| l.reads.iter().any(|r| r.3 > l.round) && l.confirmed_round == l.round);
        if start_round {
            // A round that starts after the reads were queued confirms them (a single voter
            // confirms it at once).
            self.heartbeat(now);
        }
        if let Some(locker) = self.locker.as_mut().filter(|_| self.normal) {
            let confirmed = locker.confirmed_round;
            let (ready, waiting): (Vec<_>, Vec<_>) = locker.reads.drain(..).partition(|r| r.3 <= confirmed);
            locker.reads = waiting;
            let epoch = self.promised;
            for (asker, id, index, _) in ready {
                if asker != self.me {
                    // The asker applies up to `index` sooner if it is owed positions.
                    self.deliver_owed(now, false, Some(asker));
                }
                if asker == self.me {
                    if let Some(w) = self.reads.waiting.iter_mut().find(|w| w.id.0 == id) {
                        w.index = Some(index);
                    }
                } else {
                    self.send(asker, Msg::ReadIndexReply { epoch, id, index });
                }
            }
        }
        let applied = self.applied;
        let mut i = 0;
        while i < self.reads.waiting.len() {
            let w = &self.reads.waiting[i];
            if w.index.is_some_and(|idx| idx <= applied) {
                let w = self.reads.waiting.swap_remove(i);
                self.events.push_back(Event::ReadReady { id: w.id, index: w.index.expect("checked") });
            } else {
                i += 1;
            }
        }
    }

    pub(super) fn on_batch(&mut self, now: Instant, from: NodeId, epoch: Epoch, seq: u64, commit: u64, entry: Entry) {
        if epoch != self.promised || !self.normal {
            self.counters.stale += 1;
            return;
        }
        // A combined entry from the locker is also the grant of each of its parts: their
        // senders get no separate `GrantCombined` (one message fewer per sender and
        // position); a sender whose delivery was lost asks again and is answered with one.
        if let Entry::Updates { parts } = &entry {
            if from == epoch.locker && parts.len() > 1 {
                let mine: Vec<BatchId> = parts.iter().filter(|p| p.origin == self.me).map(|p| p.batch).collect();
                if !mine.is_empty() && self.contiguous + 1 < seq {
                    self.timing.timing.own_over_hole += 1;
                }
                for batch in mine {
                    self.on_grant_combined(now, from, epoch, batch, seq);
                }
            }
        }
        if seq > self.base && !self.log.contains_key(&seq) {
            self.persist_entry(seq, entry);
        }
        self.granted_known = self.granted_known.max(seq);
        self.learn_commit(commit);
        self.timing.arrived(now, seq);
        self.ack_wanted.entry(seq).or_default().push(from);
        self.send_due_acks();
    }

    /// Acknowledges every position that became durable to whoever transmitted it.
    pub(super) fn send_due_acks(&mut self) {
        if !self.normal {
            return;
        }
        let epoch = self.promised;
        let upto = self.durable_prefix;
        let rest = self.ack_wanted.split_off(&(upto + 1));
        let due = std::mem::replace(&mut self.ack_wanted, rest);
        if !due.is_empty() {
            self.timing.acknowledged(self.last_now, upto);
        }
        let mut told: Vec<NodeId> = Vec::new();
        for to in due.into_values().flatten() {
            if !told.contains(&to) {
                told.push(to);
                if to != self.me {
                    self.send(to, Msg::Ack { epoch, upto, round: 0 });
                }
            }
        }
    }

    pub(super) fn on_ack(&mut self, now: Instant, from: NodeId, epoch: Epoch, upto: u64, round: u64) {
        if epoch != self.promised || !self.normal {
            self.counters.stale += 1;
            return;
        }
        let p = self.peer_prefix.entry(from).or_insert(0);
        let old = *p;
        *p = (*p).max(upto);
        if upto > old && self.locker.is_some() {
            self.timing.acked(now, old, upto);
            self.last_ack_from = Some(from);
        }
        if let Some(locker) = &mut self.locker {
            locker.mark_synced(from);
        }
        if round > 0 {
            self.round_confirmed_by(from, round);
        }
    }

    pub(super) fn on_heartbeat(
        &mut self,
        _now: Instant,
        from: NodeId,
        epoch: Epoch,
        commit: u64,
        granted: u64,
        round: u64,
    ) {
        if epoch < self.promised || from != epoch.locker {
            self.counters.stale += 1;
            return;
        }
        if self.establishing.is_some_and(|(e, _)| e == epoch) {
            // Adopting this locker's log already; repairs complete it.
            self.learn_commit(commit);
            return;
        }
        if epoch > self.promised || !self.normal {
            // A locker I do not follow yet (or whose log I never got): ask to be synced.
            let first = self.applied + 1;
            self.on_sync_request(from, epoch, first);
            return;
        }
        self.learn_commit(commit);
        self.granted_known = self.granted_known.max(granted);
        let upto = self.durable_prefix;
        self.send(from, Msg::Ack { epoch, upto, round });
    }

    pub(super) fn on_sync_request(&mut self, from: NodeId, epoch: Epoch, first: u64) {
        if epoch < self.promised || from != epoch.locker || from == self.me {
            self.counters.stale += 1;
            return;
        }
        if epoch > self.promised {
            self.promise(epoch);
        }
        self.when_durable(AfterDurable::SendSyncState { to: from, epoch, from: first });
    }

    /// My state for the sync of `epoch`, with my log from `first` on (None when it does
    /// not fit a message; the locker waits for others then).
    pub(super) fn sync_state(&self, epoch: Epoch, first: u64) -> Option<Msg> {
        let snapshot = if first <= self.base && self.base > 0 { self.snapshot.clone() } else { None };
        let entries: Vec<(u64, Entry)> =
            self.log.range(first.max(self.base + 1)..).map(|(s, slot)| (*s, slot.entry.clone())).collect();
        if entries.len() > ENTRIES_PER_MESSAGE_MAX {
            tracing::error!(me = %self.me, entries = entries.len(), "log tail beyond the sync limit; not answering the sync");
            return None;
        }
        Some(Msg::SyncState {
            epoch,
            last_normal: self.last_normal,
            applied: self.applied,
            commit: self.commit,
            snapshot,
            entries,
        })
    }

    /// Runs `action` once everything persisted so far is durable.
    pub(super) fn when_durable(&mut self, action: AfterDurable) {
        let lsn = self.next_lsn - 1;
        self.after_durable.push_back((lsn, action));
        if lsn <= self.durable_lsn {
            let now_unknown = self.next_tick;
            while self.after_durable.front().is_some_and(|(l, _)| *l <= self.durable_lsn) {
                let (_, a) = self.after_durable.pop_front().expect("checked");
                self.run_after_durable(now_unknown, a);
            }
        }
    }

    /// My own sync state, handed to my own sync.
    pub(super) fn self_sync_state(&mut self, now: Instant, epoch: Epoch, first: u64) {
        if let Some(Msg::SyncState { epoch, last_normal, applied, commit, snapshot, entries }) =
            self.sync_state(epoch, first)
        {
            let me = self.me;
            self.on_sync_state(now, me, PeerState { epoch, last_normal, applied, commit, snapshot, entries });
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_catchup(
        &mut self,
        _now: Instant,
        from: NodeId,
        epoch: Epoch,
        establish: bool,
        first: u64,
        end: u64,
        commit: u64,
        snapshot: SnapshotPart,
        entries: Vec<(u64, Entry)>,
    ) {
        if epoch != self.promised || from != epoch.locker || from == self.me {
            self.counters.stale += 1;
            return;
        }
        let adopting = self.establishing.is_some_and(|(e, _)| e == epoch);
        // An establishing catch-up for an epoch whose log I adopted already (a duplicate
        // while my Normal record is on its way to disk) changes nothing.
        if establish && !self.normal && !adopting && self.last_normal != Some(epoch) {
            if let Some(s) = snapshot {
                self.install_snapshot(s, false);
            }
            // Everything after my applied position is replaced by the locker's log
            // (positions up to it are committed and identical there; the catch-up starts at
            // or before the next one, and repairs fill what a restart made me forget).
            let _ = first;
            let keep = self.applied.max(self.base);
            self.truncate_after(keep);
            for (seq, entry) in entries {
                if seq > keep && seq <= end {
                    self.persist_entry(seq, entry);
                }
            }
            self.establishing = Some((epoch, end));
            self.granted_known = self.granted_known.max(end);
            self.learn_commit(commit.min(end));
            self.check_established();
            return;
        }
        if !self.normal && !adopting {
            return;
        }
        if let Some(s) = snapshot {
            self.install_snapshot(s, self.normal);
        }
        let mut newest = 0;
        for (seq, entry) in entries {
            if seq > self.base && !self.log.contains_key(&seq) {
                self.persist_entry(seq, entry);
            }
            newest = newest.max(seq);
        }
        self.learn_commit(commit);
        if adopting {
            self.check_established();
            return;
        }
        if newest > 0 {
            self.ack_wanted.entry(newest).or_default().push(from);
        }
        self.send_due_acks();
    }

    /// While adopting a new locker's log: once it is complete up to the end the locker
    /// decided, it is this node's log of the epoch (normal once that is durable).
    fn check_established(&mut self) {
        let Some((epoch, end)) = self.establishing else { return };
        if self.contiguous < end {
            return;
        }
        self.establishing = None;
        self.last_normal = Some(epoch);
        self.persist(Record::Normal { epoch });
        self.when_durable(AfterDurable::BecomeNormal { epoch, end });
    }

    /// Holes, read retries and read deadlines.
    pub(super) fn receiver_tick(&mut self, now: Instant) {
        let adopting = self.establishing.is_some_and(|(e, _)| e == self.promised);
        if (self.normal || adopting) && !self.is_locker() && self.promised.locker != self.me {
            debug_assert!(self.applied <= self.contiguous, "applied positions stay in the log");
            let first_missing = self.contiguous + 1;
            if first_missing <= self.granted_known.max(self.commit) {
                let since = *self.hole_since.get_or_insert(now);
                let quiet = self.last_repair.is_none_or(|t| t + self.config.repair_after <= now);
                if since + self.config.repair_after <= now && quiet {
                    self.last_repair = Some(now);
                    self.counters.repairs += 1;
                    let epoch = self.promised;
                    let to = self.granted_known.max(self.commit);
                    self.send(epoch.locker, Msg::RepairRequest { epoch, from: first_missing, to });
                }
            } else {
                self.hole_since = None;
            }
        }
        let mut failed = Vec::new();
        self.reads.waiting.retain(|w| {
            if w.deadline <= now {
                failed.push(w.id);
                false
            } else {
                true
            }
        });
        for id in failed {
            self.events.push_back(Event::ReadFailed { id });
        }
        let resend: Vec<ReadId> = self
            .reads
            .waiting
            .iter_mut()
            .filter(|w| w.index.is_none() && w.last_sent + self.config.retransmit_after <= now)
            .map(|w| {
                w.last_sent = now;
                w.id
            })
            .collect();
        for id in resend {
            self.request_read_index(id);
        }
    }
}
