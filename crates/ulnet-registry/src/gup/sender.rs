//! The sender's side: queue client updates, batch them under one lock grant, keep `window`
//! lock requests outstanding, deliver granted batches around the circular order, resend
//! what is not acknowledged, and tell the clients when their update is applied.

use super::{BatchId, Entry, Epoch, Event, Gup, Msg, NodeId, SubmitError, UpdateId};
use crate::codec::UPDATE_BYTES_MAX;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

#[derive(Default)]
pub(super) struct SenderState {
    next_update: u64,
    next_batch: u64,
    queue: VecDeque<Queued>,
    flights: BTreeMap<BatchId, Flight>,
    /// Committed position last reported to the locker with an Unlock.
    unlocked: u64,
    /// After an epoch change: the end of the new epoch's decided log. Until my log is
    /// complete up to it, I cannot tell which of my batches it holds.
    resolve_at: Option<u64>,
}

struct Queued {
    id: UpdateId,
    update: Arc<[u8]>,
    deadline: Instant,
}

/// A batch under (or waiting for) a lock grant.
struct Flight {
    ids: Vec<(UpdateId, Instant)>,
    updates: Arc<[Arc<[u8]>]>,
    /// The position granted in the current epoch, once granted.
    seq: Option<u64>,
    /// The position holds a combined entry, which the locker delivers.
    by_locker: bool,
    last_sent: Instant,
    /// Snapshots from peers installed before the batch was formed (see `resolve_flights`).
    installs_seen: u64,
}

impl SenderState {
    /// Whether an epoch change is being resolved (which the housekeeping tick drives).
    pub(super) fn resolving(&self) -> bool {
        self.resolve_at.is_some()
    }

    /// When the sender's timers next matter: a lock request or a delivery to send again,
    /// or a client's deadline. Updates in flight otherwise wait for messages, so a sender
    /// sleeps until then instead of waking every tick (at 32 nodes, half of every sender's
    /// wake-ups were ticks that found nothing due).
    pub(super) fn next_due(&self, commit: u64, retransmit_after: std::time::Duration) -> Option<Instant> {
        let mut due = self.queue.front().map(|q| q.deadline);
        for f in self.flights.values() {
            let expiry = f.ids.iter().map(|&(_, d)| d).max();
            let resend = (!f.by_locker && f.seq.is_none_or(|s| s > commit)).then_some(f.last_sent + retransmit_after);
            for t in [expiry, resend].into_iter().flatten() {
                due = Some(due.map_or(t, |d| d.min(t)));
            }
        }
        due
    }
}

impl Gup {
    /// Queues a client update. It is committed, applied everywhere in the same order, and
    /// reported with [`Event::Committed`] — or reported [`Event::Indeterminate`] after
    /// `update_timeout`.
    pub fn submit(&mut self, now: Instant, update: Arc<[u8]>) -> Result<UpdateId, SubmitError> {
        self.last_now = self.last_now.max(now);
        if update.len() > UPDATE_BYTES_MAX {
            return Err(SubmitError::TooLarge(update.len()));
        }
        if !self.in_view() {
            return Err(SubmitError::NotMember);
        }
        if self.sender.queue.len() >= self.config.queue_max {
            return Err(SubmitError::QueueFull);
        }
        let id = UpdateId(self.sender.next_update);
        self.sender.next_update += 1;
        let deadline = now + self.config.update_timeout;
        self.sender.queue.push_back(Queued { id, update, deadline });
        self.sender_pump(now);
        Ok(id)
    }

    /// Updates queued or in flight at this sender.
    pub fn updates_outstanding(&self) -> usize {
        self.sender.queue.len() + self.sender.flights.values().map(|f| f.ids.len()).sum::<usize>()
    }

    /// Forms batches while the window has room and sends their lock requests.
    pub(super) fn sender_pump(&mut self, now: Instant) {
        // Only a commit worked out here from acknowledgements (of a position this node
        // transmitted) is news to the locker; one learned from the locker is not.
        if self.normal
            && !self.is_locker()
            && self.sender.unlocked < self.commit_by_acks
            && self.commit <= self.granted_known
        {
            self.sender.unlocked = self.commit;
            let epoch = self.promised;
            let upto = self.commit;
            self.send(epoch.locker, Msg::Unlock { epoch, upto });
        }
        if !self.normal || !self.in_view() {
            return;
        }
        if let Some(end) = self.sender.resolve_at {
            let mut first_missing = self.applied + 1;
            while first_missing <= end && self.log.contains_key(&first_missing) {
                first_missing += 1;
            }
            if first_missing <= end {
                return;
            }
            self.sender.resolve_at = None;
            self.resolve_flights(now);
        }
        while self.sender.flights.len() < self.config.window && !self.sender.queue.is_empty() {
            let mut ids = Vec::new();
            let mut updates = Vec::new();
            let mut bytes = 0;
            while let Some(q) = self.sender.queue.front() {
                if !updates.is_empty()
                    && (updates.len() >= self.config.batch_updates_max
                        || bytes + q.update.len() > self.config.batch_bytes_max)
                {
                    break;
                }
                let q = self.sender.queue.pop_front().expect("peeked");
                bytes += q.update.len();
                ids.push((q.id, q.deadline));
                updates.push(q.update);
            }
            let batch = BatchId { incarnation: self.incarnation, counter: self.sender.next_batch };
            self.sender.next_batch += 1;
            let updates: Arc<[Arc<[u8]>]> = updates.into();
            let installs_seen = self.snapshot_installs;
            let flight =
                Flight { ids, updates: updates.clone(), seq: None, by_locker: false, last_sent: now, installs_seen };
            self.sender.flights.insert(batch, flight);
            self.request_lock(now, batch);
        }
    }

    fn request_lock(&mut self, now: Instant, batch: BatchId) {
        let epoch = self.promised;
        let Some(flight) = self.sender.flights.get_mut(&batch) else { return };
        flight.last_sent = now;
        let updates = flight.updates.clone();
        if epoch.locker == self.me {
            self.queue_lock_request(now, self.me, batch, updates);
        } else {
            self.send(epoch.locker, Msg::LockRequest { epoch, batch, updates: updates.to_vec() });
        }
    }

    /// Whether a grant of position `seq` to `batch` places a flight that waits for one: it
    /// comes from the locker of our epoch, and the flight has no position yet. A position
    /// applied already, as part of a snapshot (an applied entry of mine would have answered
    /// the flight), means the flight committed, and it is answered here.
    fn accept_grant(&mut self, from: NodeId, epoch: Epoch, batch: BatchId, seq: u64) -> bool {
        if epoch != self.promised || !self.normal || from != epoch.locker {
            self.counters.stale += 1;
            return false;
        }
        if self.sender.flights.get(&batch).is_none_or(|f| f.seq.is_some()) {
            return false;
        }
        if seq <= self.applied {
            self.sender_applied(batch, seq);
            return false;
        }
        true
    }

    pub(super) fn on_grant(&mut self, now: Instant, from: NodeId, epoch: Epoch, batch: BatchId, seq: u64) {
        if !self.accept_grant(from, epoch, batch, seq) {
            return;
        }
        let flight = self.sender.flights.get_mut(&batch).expect("accepted");
        flight.seq = Some(seq);
        flight.last_sent = now;
        let entry = Entry::single(self.me, batch, flight.updates.clone());
        if seq > self.base && !self.log.contains_key(&seq) {
            self.persist_entry(seq, entry.clone());
        }
        self.transmit(epoch, seq, entry, None);
    }

    pub(super) fn on_grant_combined(&mut self, now: Instant, from: NodeId, epoch: Epoch, batch: BatchId, seq: u64) {
        if !self.accept_grant(from, epoch, batch, seq) {
            return;
        }
        let flight = self.sender.flights.get_mut(&batch).expect("accepted");
        flight.seq = Some(seq);
        flight.by_locker = true;
        flight.last_sent = now;
    }

    /// Sends the entry at `seq` around the circular order, starting after the locker; with
    /// `only_missing`, only to nodes that have not acknowledged it.
    pub(super) fn transmit(&mut self, epoch: Epoch, seq: u64, entry: Entry, only_missing: Option<()>) {
        let commit = self.commit;
        for to in self.targets_after(epoch.locker) {
            if only_missing.is_some() && self.peer_prefix.get(&to).is_some_and(|&p| p >= seq) {
                continue;
            }
            self.send(to, Msg::Batch { epoch, seq, commit, entry: entry.clone() });
        }
    }

    /// Deadlines and retransmissions.
    pub(super) fn sender_tick(&mut self, now: Instant) {
        while self.sender.queue.front().is_some_and(|q| q.deadline <= now) {
            let q = self.sender.queue.pop_front().expect("peeked");
            self.indeterminate(q.id);
        }
        let expired: Vec<BatchId> =
            self.sender.flights.iter().filter(|(_, f)| f.ids.iter().all(|&(_, d)| d <= now)).map(|(b, _)| *b).collect();
        for batch in expired {
            let flight = self.sender.flights.remove(&batch).expect("listed");
            for (id, _) in flight.ids {
                self.indeterminate(id);
            }
        }
        if !self.normal || self.sender.resolve_at.is_some() {
            return;
        }
        let epoch = self.promised;
        let due: Vec<(BatchId, Option<u64>)> = self
            .sender
            .flights
            .iter()
            .filter(|(_, f)| {
                !f.by_locker
                    && f.last_sent + self.config.retransmit_after <= now
                    && f.seq.is_none_or(|s| s > self.commit)
            })
            .map(|(b, f)| (*b, f.seq))
            .collect();
        for (batch, seq) in due {
            match seq {
                None => self.request_lock(now, batch),
                Some(seq) => {
                    let flight = self.sender.flights.get_mut(&batch).expect("listed");
                    flight.last_sent = now;
                    let entry = Entry::single(self.me, batch, flight.updates.clone());
                    self.transmit(epoch, seq, entry, Some(()));
                }
            }
        }
    }

    /// The entry of one of my batches was applied at `seq`: its clients are answered.
    pub(super) fn sender_applied(&mut self, batch: BatchId, seq: u64) {
        if let Some(flight) = self.sender.flights.remove(&batch) {
            if flight.by_locker {
                self.timing.own_applied(self.last_now, flight.last_sent);
            }
            for (id, _) in flight.ids {
                self.events.push_back(Event::Committed { id, seq });
            }
        }
    }

    /// A snapshot up to `seq` replaced my state. In the same epoch, batches granted at or
    /// below `seq` are in it; from another epoch nothing about my batches can be known, so
    /// they are all indeterminate (asking again could apply them twice).
    pub(super) fn sender_snapshot_installed(&mut self, seq: u64, same_epoch: bool) {
        // While an epoch change is unresolved, my batches' positions are unknown too.
        let same_epoch = same_epoch && self.sender.resolve_at.is_none();
        let covered: Vec<(BatchId, u64)> = self
            .sender
            .flights
            .iter()
            .filter_map(|(b, f)| match f.seq {
                Some(s) if same_epoch && s <= seq => Some((*b, s)),
                _ => None,
            })
            .collect();
        for (batch, s) in covered {
            self.sender_applied(batch, s);
        }
        if !same_epoch {
            let ids: Vec<UpdateId> = std::mem::take(&mut self.sender.flights)
                .into_values()
                .flat_map(|f| f.ids.into_iter().map(|(id, _)| id))
                .collect();
            for id in ids {
                self.indeterminate(id);
            }
        }
    }

    /// This node became normal in a new epoch whose decided log ends at `end`.
    pub(super) fn sender_epoch_changed(&mut self, now: Instant, end: u64) {
        self.sender.unlocked = self.commit;
        for flight in self.sender.flights.values_mut() {
            flight.seq = None;
            flight.by_locker = false;
        }
        self.sender.resolve_at = Some(end);
        self.sender_pump(now);
    }

    /// My log is complete up to the end of the new epoch's decided log: batches it holds
    /// keep their new position; the others ask the new locker for the lock again.
    fn resolve_flights(&mut self, now: Instant) {
        let mine: HashMap<BatchId, (u64, bool)> = self
            .log
            .range(self.applied + 1..)
            .flat_map(|(seq, slot)| {
                let combined = slot.entry.parts().len() > 1;
                slot.entry.parts().iter().filter(|p| p.origin == self.me).map(move |p| (p.batch, (*seq, combined)))
            })
            .collect();
        let batches: Vec<BatchId> = self.sender.flights.keys().copied().collect();
        for batch in batches {
            let installs = self.snapshot_installs;
            let flight = self.sender.flights.get_mut(&batch).expect("listed");
            flight.seq = mine.get(&batch).map(|m| m.0);
            // Whoever delivers it, the new epoch's log has it: the locker finishes it.
            flight.by_locker = mine.contains_key(&batch);
            if flight.seq.is_some() {
                continue;
            }
            if flight.installs_seen < installs {
                // A snapshot from a peer replaced part of my log while this batch was out:
                // it may have been granted (the grant lost) and be inside the snapshot, out
                // of sight. Asking again could apply it twice.
                let flight = self.sender.flights.remove(&batch).expect("listed");
                for (id, _) in flight.ids {
                    self.indeterminate(id);
                }
            } else {
                self.request_lock(now, batch);
            }
        }
    }

    pub(super) fn fail_all_updates(&mut self) {
        let queued: Vec<UpdateId> = self.sender.queue.drain(..).map(|q| q.id).collect();
        let flying: Vec<UpdateId> = std::mem::take(&mut self.sender.flights)
            .into_values()
            .flat_map(|f| f.ids.into_iter().map(|(id, _)| id))
            .collect();
        for id in queued.into_iter().chain(flying) {
            self.indeterminate(id);
        }
    }

    fn indeterminate(&mut self, id: UpdateId) {
        self.counters.indeterminate += 1;
        self.events.push_back(Event::Indeterminate { id });
    }
}
