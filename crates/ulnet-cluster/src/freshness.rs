//! Freshness of membership datagrams: a datagram recorded on the wire is worthless later.
//!
//! The tag ([`crate::wire`]) proves that a datagram was made by a node that knows the
//! cluster secret, not *when*. Without more, a sniffer (who needs no secret) that
//! recorded a node joining could send its join request again after the node died, from
//! its address, and have the dead node admitted (issue #31). So every datagram carries a
//! [`Stamp`], and a node acts on a datagram only when all three of these hold:
//!
//! 1. **It was made for this process.** The stamp names the receiver and the receiver's
//!    *incarnation*: a number chosen when the receiver's process started, larger at every
//!    restart ([`next_incarnation`]: wall-clock nanoseconds at start, as Cassandra's gossip
//!    generation, and above the last one kept in the data directory). A sender learns it
//!    from the receiver's datagrams; until then it sends 0. Whatever was recorded before
//!    the receiver's process started fails here.
//! 2. **Its sender's incarnation is the newest this process heard from that sender.**
//!    Datagrams of a sender's earlier process fail here.
//! 3. **Its counter is new.** Each process numbers the datagrams it sends 1, 2, 3, …; the
//!    receiver keeps per sender the highest counter accepted and which of the
//!    [`REPLAY_WINDOW`] counters below it were ([`ReplayWindow`]: RFC 6479, the window of
//!    IPsec and WireGuard). A datagram received before, or older than the window, fails
//!    here: replays between two processes that both still run.
//!
//! A datagram that fails (1) is answered with a *challenge* (rate-limited per source
//! address by the caller): an empty datagram stamped for the sender's incarnation as the
//! failed datagram states it, from which the sender learns the receiver's. A challenge is
//! never answered with a challenge. The sender keeps, for each address whose incarnation
//! it does not know, the newest datagram of each kind it sent there (heartbeats aside:
//! they are periodic); when it learns the incarnation it sends them again at once. A
//! first contact (a join, a restarted member) so costs one more round trip, not a timer
//! period. What was sent with an incarnation that turned out stale (the receiver
//! restarted since) is not kept: the protocol retransmits what matters.
//!
//! Every table is bounded:
//!
//! * senders' windows: at most [`SENDERS_MAX`]. No window is ever evicted on its own —
//!   its sender's recorded datagrams would pass again. When a new sender finds the table
//!   full, this process renews its incarnation instead (one more, kept in the data
//!   directory like the first) and forgets every window: all datagrams made for the old
//!   incarnation are stale from then on, so nothing forgotten can be replayed. The peers
//!   learn the new incarnation from their next challenge. Filling the table takes that
//!   many distinct identities, each holding the secret, talking to one process.
//! * incarnations of peers' addresses (for our stamps): at most [`PEERS_MAX`]; when full,
//!   the one learned longest ago goes (the next datagram to it costs a challenge).
//! * datagrams kept for unknown addresses: at most [`UNCONFIRMED_MAX`]; the oldest goes
//!   (the protocol's retransmission covers it).

use crate::view::MemberId;
use crate::wire::{Message, Packet, Stamp, LIST_MAX};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

/// Words of a replay window's ring (64 counters each).
const WINDOW_WORDS: usize = 32;

/// How far below the highest counter accepted from a sender a datagram may be and still be
/// told apart from a replay: `(WINDOW_WORDS - 1) × 64` (the ring's newest word is the one
/// being filled). A sender numbers every datagram it sends, whoever it goes to, so this is
/// how many later datagrams of its sender may overtake one on the way. The largest burst a
/// member sends at once is a regroup round — `Prepare` or `Accept` to every member,
/// `Commit` to the old and new ones, at most 3 × 256 in every profile — so a datagram
/// reordered within or behind such a burst is not taken for a replay. 256 bytes a sender.
pub const REPLAY_WINDOW: u64 = (WINDOW_WORDS as u64 - 1) * 64;

/// Most senders whose windows one incarnation keeps: twice the largest view (a view and
/// as many joiners, or a view and the members replaced since). See the module doc for what
/// happens when it is full. At most 2,048 × 280 bytes.
pub const SENDERS_MAX: usize = 2 * LIST_MAX;

/// Most peer addresses whose incarnations are remembered for stamps.
pub const PEERS_MAX: usize = 2 * LIST_MAX;

/// Most datagrams kept for addresses whose incarnation is not known yet: the first round
/// of a restarted member of a 256-member view (one `Prepare` to each) fits twice.
pub const UNCONFIRMED_MAX: usize = 512;

/// The incarnation of a process starting at `clock_ns` (wall-clock nanoseconds since the
/// Unix epoch, or the simulator's clock) whose node last ran as `previous` (kept in its
/// data directory, if any): the clock, but always above `previous` (a clock set back
/// between two runs does not make a node's incarnation go back), and never 0 (0 stands for
/// "unknown" on the wire).
pub fn next_incarnation(previous: Option<u64>, clock_ns: u64) -> u64 {
    clock_ns.max(previous.map_or(0, |p| p.saturating_add(1))).max(1)
}

/// Which counters of one sender's incarnation were accepted: the highest, and a ring of
/// bits for the [`REPLAY_WINDOW`] counters below it (RFC 6479). Counters start at 1.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    highest: u64,
    ring: [u64; WINDOW_WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self { highest: 0, ring: [0; WINDOW_WORDS] }
    }
}

impl ReplayWindow {
    /// Whether `counter` is accepted: not seen before, and not older than the window. An
    /// accepted counter is remembered.
    pub fn accept(&mut self, counter: u64) -> bool {
        if counter == 0 {
            return false;
        }
        if counter > self.highest {
            // Words between the old highest and the new one start empty.
            let (old_word, new_word) = (self.highest / 64, counter / 64);
            for w in old_word + 1..=new_word.min(old_word + WINDOW_WORDS as u64) {
                self.ring[Self::slot(w)] = 0;
            }
            self.highest = counter;
        } else if self.highest - counter > REPLAY_WINDOW {
            return false;
        }
        let word = &mut self.ring[Self::slot(counter / 64)];
        let bit = 1u64 << (counter % 64);
        let fresh = *word & bit == 0;
        *word |= bit;
        fresh
    }

    fn slot(word: u64) -> usize {
        (word % WINDOW_WORDS as u64) as usize
    }
}

/// What to do with an authenticated datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Act on it. `learned`: the first datagram of its sender's incarnation from this
    /// address — what was kept for the address can be sent again now.
    Fresh { learned: bool },
    /// Not made for this process (receiver or incarnation differ): challenge it.
    Unconfirmed,
    /// From an earlier incarnation of its sender.
    OldIncarnation,
    /// Its counter was accepted before, or is older than the window.
    Replayed,
    /// Its sender is new and the senders' table is full: this process renewed its
    /// incarnation, and the datagram (made for the former one) is unconfirmed.
    Renewed,
}

#[derive(Debug)]
struct Sender {
    incarnation: u64,
    window: ReplayWindow,
}

#[derive(Clone, Copy, Debug)]
struct Peer {
    id: MemberId,
    incarnation: u64,
    /// Order of learning, for eviction.
    learned: u64,
}

/// The freshness state of one process: its stamps, and its checks of received stamps.
#[derive(Debug)]
pub(crate) struct Freshness {
    me: MemberId,
    incarnation: u64,
    /// The last counter used.
    counter: u64,
    senders: HashMap<MemberId, Sender>,
    peers: HashMap<SocketAddr, Peer>,
    learned: u64,
    unconfirmed: VecDeque<(SocketAddr, Message)>,
}

impl Freshness {
    pub fn new(me: MemberId, incarnation: u64) -> Self {
        assert!(incarnation != 0, "incarnation 0 stands for unknown on the wire");
        Self {
            me,
            incarnation,
            counter: 0,
            senders: HashMap::new(),
            peers: HashMap::new(),
            learned: 0,
            unconfirmed: VecDeque::new(),
        }
    }

    /// This process's incarnation (renewed when the senders' table fills).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn next_stamp(&mut self, receiver: MemberId, receiver_incarnation: u64) -> Stamp {
        self.counter += 1;
        Stamp { sender_incarnation: self.incarnation, receiver, receiver_incarnation, counter: self.counter }
    }

    /// The stamp of `message` to `dst`. Keeps the message to send again if `dst`'s
    /// incarnation is not known (see the module doc).
    pub fn stamp(&mut self, dst: SocketAddr, message: &Message) -> Stamp {
        let (receiver, incarnation) = self.peers.get(&dst).map_or((MemberId(0), 0), |p| (p.id, p.incarnation));
        if incarnation == 0 && !matches!(message, Message::Heartbeat { .. } | Message::Challenge) {
            self.keep_unconfirmed(dst, message);
        }
        self.next_stamp(receiver, incarnation)
    }

    /// The stamp of a challenge of `packet`: for its sender's incarnation as it states it.
    pub fn challenge_stamp(&mut self, packet: &Packet) -> Stamp {
        self.next_stamp(packet.sender, packet.stamp.sender_incarnation)
    }

    fn keep_unconfirmed(&mut self, dst: SocketAddr, message: &Message) {
        let kind = message.kind();
        self.unconfirmed.retain(|(a, m)| *a != dst || m.kind() != kind);
        if self.unconfirmed.len() >= UNCONFIRMED_MAX {
            self.unconfirmed.pop_front();
        }
        self.unconfirmed.push_back((dst, message.clone()));
    }

    /// The datagrams kept for `addr`, oldest first; they are not kept any more.
    pub fn take_unconfirmed(&mut self, addr: SocketAddr) -> Vec<Message> {
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = self.unconfirmed.drain(..).partition(|(a, _)| *a == addr);
        self.unconfirmed = rest;
        mine.into_iter().map(|(_, m)| m).collect()
    }

    /// Checks the stamp of `packet` (authenticated, not from this node) from `from`; a
    /// fresh one is remembered (its counter, and its sender's incarnation at `from`).
    pub fn check(&mut self, from: SocketAddr, packet: &Packet) -> Verdict {
        let stamp = &packet.stamp;
        if stamp.receiver != self.me || stamp.receiver_incarnation != self.incarnation {
            return Verdict::Unconfirmed;
        }
        let full = self.senders.len() >= SENDERS_MAX;
        match self.senders.get_mut(&packet.sender) {
            Some(s) if s.incarnation > stamp.sender_incarnation => return Verdict::OldIncarnation,
            Some(s) if s.incarnation == stamp.sender_incarnation => {
                if !s.window.accept(stamp.counter) {
                    return Verdict::Replayed;
                }
            }
            Some(s) => {
                *s = Sender { incarnation: stamp.sender_incarnation, window: ReplayWindow::default() };
                s.window.accept(stamp.counter);
            }
            None if full => {
                self.renew();
                return Verdict::Renewed;
            }
            None => {
                let mut window = ReplayWindow::default();
                window.accept(stamp.counter);
                self.senders.insert(packet.sender, Sender { incarnation: stamp.sender_incarnation, window });
            }
        }
        Verdict::Fresh { learned: self.learn(from, packet.sender, stamp.sender_incarnation) }
    }

    /// A new incarnation, and no windows: see the module doc.
    fn renew(&mut self) {
        self.incarnation += 1;
        self.senders.clear();
    }

    /// Remembers that `id` in incarnation `incarnation` answers at `addr`; whether that is
    /// news.
    fn learn(&mut self, addr: SocketAddr, id: MemberId, incarnation: u64) -> bool {
        self.learned += 1;
        let learned = self.learned;
        if let Some(p) = self.peers.get_mut(&addr) {
            let news = (p.id, p.incarnation) != (id, incarnation);
            *p = Peer { id, incarnation, learned };
            return news;
        }
        if self.peers.len() >= PEERS_MAX {
            let oldest = self.peers.iter().min_by_key(|(_, p)| p.learned).map(|(a, _)| *a).expect("full");
            self.peers.remove(&oldest);
        }
        self.peers.insert(addr, Peer { id, incarnation, learned });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_window_accepts_each_counter_once() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(0), "counters start at 1");
        assert!(w.accept(1));
        assert!(!w.accept(1));
        assert!(w.accept(5));
        assert!(w.accept(3), "reordered within the window");
        assert!(!w.accept(3));
        assert!(!w.accept(5));
    }

    #[test]
    fn a_window_refuses_what_is_older_than_it() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(10_000));
        assert!(w.accept(10_000 - REPLAY_WINDOW), "the window's oldest counter");
        assert!(!w.accept(10_000 - REPLAY_WINDOW - 1), "older than the window");
        assert!(w.accept(10_000 + 100 * REPLAY_WINDOW), "a jump forward clears the ring");
        assert!(w.accept(10_000 + 100 * REPLAY_WINDOW - 1));
    }

    proptest! {
        /// Against a model that remembers every counter: within the window, a counter is
        /// accepted exactly when it is new; older than the window, never.
        #[test]
        fn a_window_matches_a_model_that_forgets_nothing(counters in proptest::collection::vec(1u64..6000, 1..400)) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::BTreeSet::new();
            let mut highest = 0;
            for c in counters {
                let expected = !seen.contains(&c) && (c > highest || highest - c <= REPLAY_WINDOW);
                prop_assert_eq!(w.accept(c), expected, "counter {} after highest {}", c, highest);
                if expected {
                    seen.insert(c);
                    highest = highest.max(c);
                }
            }
        }
    }

    #[test]
    fn incarnations_grow_across_restarts_even_when_the_clock_goes_back() {
        assert_eq!(next_incarnation(None, 500), 500);
        assert_eq!(next_incarnation(Some(400), 500), 500);
        assert_eq!(next_incarnation(Some(900), 500), 901, "clock set back");
        assert_eq!(next_incarnation(None, 0), 1, "0 means unknown");
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A datagram from `from` (`id` in `incarnation`) to `to`, stamped as `from` would.
    fn packet(from: &mut Freshness, to: SocketAddr) -> Packet {
        let message = Message::ViewRequest;
        Packet { sender: from.me, sender_view: 0, stamp: from.stamp(to, &message), message }
    }

    #[test]
    fn a_first_contact_is_challenged_then_fresh() {
        let (a_addr, b_addr) = (addr(1), addr(2));
        let mut a = Freshness::new(MemberId(1), 100);
        let mut b = Freshness::new(MemberId(2), 200);
        let first = packet(&mut a, b_addr);
        assert_eq!(b.check(a_addr, &first), Verdict::Unconfirmed, "a does not know b yet");
        let challenge = Packet {
            sender: MemberId(2),
            sender_view: 0,
            stamp: b.challenge_stamp(&first),
            message: Message::Challenge,
        };
        assert_eq!(a.check(b_addr, &challenge), Verdict::Fresh { learned: true });
        assert_eq!(a.take_unconfirmed(b_addr), vec![Message::ViewRequest], "kept for b, once");
        assert!(a.take_unconfirmed(b_addr).is_empty());
        let second = packet(&mut a, b_addr);
        assert_eq!(b.check(a_addr, &second), Verdict::Fresh { learned: true });
        assert_eq!(b.check(a_addr, &second), Verdict::Replayed);
        assert_eq!(b.check(a_addr, &first), Verdict::Unconfirmed, "still not made for b");
    }

    #[test]
    fn a_restart_on_either_side_makes_recorded_datagrams_worthless() {
        let (a_addr, b_addr) = (addr(1), addr(2));
        let mut a = Freshness::new(MemberId(1), 100);
        let mut b = Freshness::new(MemberId(2), 200);
        // a knows b's incarnation (as after a challenge).
        a.learn(b_addr, MemberId(2), 200);
        let recorded = packet(&mut a, b_addr);
        assert_eq!(b.check(a_addr, &recorded), Verdict::Fresh { learned: true });
        // a restarts: its new process is heard by b, and a's old datagrams are then stale.
        let mut a2 = Freshness::new(MemberId(1), 150);
        a2.learn(b_addr, MemberId(2), 200);
        let from_new = packet(&mut a2, b_addr);
        assert_eq!(b.check(a_addr, &from_new), Verdict::Fresh { learned: true });
        let mut replay = recorded.clone();
        replay.stamp.counter += 1_000; // even with a counter never seen
        assert_eq!(b.check(a_addr, &replay), Verdict::OldIncarnation);
        // b restarts: nothing made for its former process is acted on.
        let mut b2 = Freshness::new(MemberId(2), 300);
        assert_eq!(b2.check(a_addr, &recorded), Verdict::Unconfirmed);
        assert_eq!(b2.check(a_addr, &from_new), Verdict::Unconfirmed);
    }

    #[test]
    fn a_full_senders_table_renews_the_incarnation_instead_of_forgetting_a_window() {
        let me = addr(1);
        let mut b = Freshness::new(MemberId(u64::MAX), 7);
        let mut recorded = Vec::new();
        for i in 0..SENDERS_MAX as u64 {
            let mut s = Freshness::new(MemberId(i + 1), 1);
            s.learn(me, MemberId(u64::MAX), 7);
            let p = packet(&mut s, me);
            assert!(matches!(b.check(addr(2), &p), Verdict::Fresh { .. }));
            recorded.push(p);
        }
        let mut newcomer = Freshness::new(MemberId(SENDERS_MAX as u64 + 1), 1);
        newcomer.learn(me, MemberId(u64::MAX), 7);
        let p = packet(&mut newcomer, me);
        assert_eq!(b.check(addr(2), &p), Verdict::Renewed);
        assert_eq!(b.incarnation(), 8);
        assert!(b.senders.is_empty());
        for p in &recorded {
            assert_eq!(b.check(addr(2), p), Verdict::Unconfirmed, "forgotten windows protect nothing any more");
        }
    }

    #[test]
    fn only_the_newest_datagram_of_a_kind_is_kept_per_address() {
        let mut a = Freshness::new(MemberId(1), 100);
        let b = addr(2);
        for round in 1..=3 {
            a.stamp(b, &Message::Prepare { base: 4, ballot: crate::wire::Ballot { round, proposer: MemberId(1) } });
        }
        a.stamp(b, &Message::Probe);
        a.stamp(b, &Message::Heartbeat { digest: vec![], suspects: vec![] });
        a.stamp(addr(3), &Message::Probe);
        let kept = a.take_unconfirmed(b);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(matches!(kept[0], Message::Prepare { ballot: crate::wire::Ballot { round: 3, .. }, .. }));
        assert_eq!(a.unconfirmed.len(), 1, "other addresses' datagrams stay");
    }
}
