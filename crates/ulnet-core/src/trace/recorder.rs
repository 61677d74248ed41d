//! A recorder: what one endpoint (or one thread, for the free functions) records, into a
//! ring of its own. It keeps the receive being delivered while its handler runs, the open
//! run of identical messages, and its newest clock reading.
//!
//! A call is one record per side, not two: the caller stages its request and writes it
//! with the response that answers it (when that response is the next message it records
//! on that channel), the server writes the request it is delivering with the response its
//! handler sends to it. Anything else recorded meanwhile writes the staged request alone
//! first, so nothing is lost but the pairing. A request still staged when the session
//! stops is lost (its call is then still in flight).
//!
//! Nothing but a few stores happens between a message's arrival and the publication of the
//! message its handler or its caller sends next: that interval is the round trip's critical
//! path, and on shared memory a few nanoseconds there are a percent of it. So a receive the
//! handler describes is kept as it was described (kind, request id, the recorder's newest
//! reading, each in a field of its own) and recorded by the next hook ([`Recorder::settle`]):
//! on a server the send of its response, which comes after that response is published; on
//! a caller the send of its next request, likewise after its publication (a response that
//! answers the staged request stays described past the end of its delivery for that). Only
//! exact records (one request id in [`super::TraceConfig::sample`]) are recorded at once,
//! since they read the clock at each stage. Every hook that records, the start of each poll
//! and the closing of a channel or endpoint settle a description left over, so it is lost
//! only if the session stops after the delivery and before the endpoint does anything more.

use super::clock;
use super::format::MessageKind;
use super::ring::Producer;
use super::slot::{offset, Slot, FLAG_EXACT, FLAG_PAIR, FLAG_RECEIVE, PAIR_BUFFERS_MAX};
use super::writer::{Session, TracedRing, IDLE_DRAIN_MAX};
use super::{exact_mode, exact_or_sampled, SESSION, TICKER};
use crate::node::NodeId;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most messages in one run record: bounds what a record stands for, so rates over time
/// stay resolved even for a stream that never changes. 1,024 8-byte messages take about
/// 25 us on shared memory.
pub(crate) const RUN_MAX: u32 = 1024;
/// Runs at least this long read the clock when they close: the reading costs under 1% of
/// the messages' own cost, and gives streams exact end times.
pub(crate) const RUN_EXACT_MIN: u32 = 16;

/// A receive taken out of its delivery (a pooled handler runs it later on a worker), to be
/// written with its handler times by [`crate::Endpoint::trace_put`].
#[derive(Clone, Copy, Debug)]
pub struct PendingReceive {
    slot: Slot,
    session: u64,
}

impl PendingReceive {
    /// Sets the handler's start and end (ticks of [`super::now`]).
    pub fn set_handler_times(&mut self, start: u64, end: u64) {
        self.slot.stage_a = offset(self.slot.ticks, start);
        self.slot.stage_b = offset(self.slot.ticks, end);
    }
}

/// What the recorder's staged record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staged {
    /// Nothing staged.
    Empty,
    /// The receive being delivered, described by its handler (and maybe paired with the
    /// response it sent); written when the delivery ends.
    Receive,
    /// A request sent, waiting for its response to be written with it.
    Call,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Recorder {
    producer: Option<Producer>,
    /// The session `producer` belongs to.
    session: u64,
    /// That session and the ring, for draining it when the thread is idle.
    owner: Option<(Arc<Session>, Arc<TracedRing>)>,
    /// The newest clock reading this recorder made.
    last_exact: u64,
    /// The open run as it opened; its count is kept in the ring's mirror of it, where
    /// `stop` finds it.
    run: Slot,
    /// The session of the open run (0: no run open).
    run_session: u64,
    /// The open run's channel, kind, flags and buffers packed as in the file (word 2 of
    /// [`Slot::to_words`]): one compare tells whether a message extends the run.
    run_key: u64,
    /// The ticker when the run opened: a run ends within 64 messages of a tick.
    run_tick: u64,
    /// Changes whenever a run opens or closes or a delivery is described: a poll that
    /// counts a stream's receives straight into the open run ([`Recorder::receive_run`])
    /// checks it after each handler.
    epoch: u32,
    /// Where the delivery of a received message stands.
    delivery: Delivery,
    /// The clock reading of the delivery under way, in exact mode.
    receiving_ticks: u64,
    /// The staged record ([`Staged`]), built in place here and copied to the ring once.
    staged: Slot,
    staged_state: Staged,
    staged_session: u64,
    /// The message of the latest delivery described: (sender, receiver), channel, length.
    delivery_nodes: (NodeId, NodeId),
    delivery_channel: u32,
    delivery_len: u64,
    /// The description not recorded yet ([`Delivery::Described`], [`Delivery::Deferred`]).
    /// Plain fields, each stored from a register: a description built aside and copied in
    /// would be read back in wider pieces than it was written, and each such load waits for
    /// the stores it overlaps to reach the cache (a failed store-to-load forwarding), on
    /// the round trip's critical path.
    described_kind: MessageKind,
    described_request_id: u64,
    /// The recorder's newest reading when it was described: the record's time.
    described_ticks: u64,
    described_session: u64,
}

/// Where the delivery of a received message stands: one byte that the hooks of every
/// message read, and only a described message's hooks write (a stream's receive reads it
/// twice and stores nothing: a store per message, read back by the next hook, chained the
/// stream's messages one after the other through it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Delivery {
    /// No description waiting: no delivery under way, or one its handler has not
    /// described. (A handler that describes a message whose delivery began while tracing
    /// was off gets it recorded at the next hook, and the next message it receives is then
    /// lost: one message at the instant tracing starts.)
    Idle,
    /// Under way, and its description is recorded (staged, or joined to the staged
    /// request): the staged receive is written when the delivery ends.
    Recorded,
    /// Under way, described, the description not recorded yet.
    Described,
    /// Over, described, the description not recorded yet: a response to the staged
    /// request, waiting for the caller's next hook.
    Deferred,
}

/// Buffers, buffer lengths and size of a gather list (buffers 0: not listable).
#[inline]
fn describe(gather: &[&[u8]]) -> (u8, [u32; 4], u64) {
    describe_lens(gather.len(), gather.iter().map(|b| b.len()))
}

/// [`describe`] of `count` buffers of the lengths `lens`.
#[inline]
fn describe_lens(count: usize, lens: impl Iterator<Item = usize>) -> (u8, [u32; 4], u64) {
    let mut buffer_len = [0u32; 4];
    let mut size = 0u64;
    let mut listed = count <= 4;
    for (i, len) in lens.enumerate() {
        size += len as u64;
        if i < 4 {
            match u32::try_from(len) {
                Ok(l) => buffer_len[i] = l,
                Err(_) => listed = false,
            }
        }
    }
    if listed {
        (count as u8, buffer_len, size)
    } else {
        (0, [0; 4], size)
    }
}

/// Buffers, buffer lengths and size of a gather list a pair record can list (at most
/// [`PAIR_BUFFERS_MAX`] buffers, each under 4 GiB).
#[inline(always)]
fn describe_pair(gather: &[&[u8]]) -> Option<(u8, [u32; 2], u64)> {
    let len = |i: usize| gather.get(i).map_or(Some(0), |b| u32::try_from(b.len()).ok());
    if gather.len() > PAIR_BUFFERS_MAX {
        return None;
    }
    let lens = [len(0)?, len(1)?];
    Some((gather.len() as u8, lens, u64::from(lens[0]) + u64::from(lens[1])))
}

impl Recorder {
    pub(crate) const fn new() -> Self {
        Recorder {
            producer: None,
            session: 0,
            owner: None,
            last_exact: 0,
            run: Slot::EMPTY,
            run_session: 0,
            run_key: 0,
            run_tick: 0,
            epoch: 0,
            delivery: Delivery::Idle,
            receiving_ticks: 0,
            staged: Slot::EMPTY,
            staged_state: Staged::Empty,
            staged_session: 0,
            delivery_nodes: (NodeId(0), NodeId(0)),
            delivery_channel: 0,
            delivery_len: 0,
            described_kind: MessageKind::Message,
            described_request_id: 0,
            described_ticks: 0,
            described_session: 0,
        }
    }

    /// Records the description left by [`Recorder::describe_receive`], if any; written at
    /// once when its delivery is over. Every hook that records calls this first, so records
    /// keep their order (a stream's send that only counts in the open run need not: see
    /// [`Recorder::send`]).
    #[inline(always)]
    pub(crate) fn settle(&mut self) {
        if self.delivery >= Delivery::Described {
            self.settle_described();
        }
    }

    #[inline(never)]
    fn settle_described(&mut self) {
        let over = self.delivery == Delivery::Deferred;
        self.delivery = if over { Delivery::Idle } else { Delivery::Recorded };
        let (session, kind, request_id, ticks) =
            (self.described_session, self.described_kind, self.described_request_id, self.described_ticks);
        self.record_description(session, kind, request_id, ticks);
        if over && self.staged_state == Staged::Receive {
            self.staged_state = Staged::Empty;
            self.push_staged();
        }
    }

    /// Writes what waits for a later hook, a description left over and the open run, and
    /// drains the ring (a channel or the endpoint is closing).
    pub(crate) fn write_pending(&mut self) {
        self.settle();
        self.close_run();
        self.before_sleep();
    }

    /// The thread has nothing to do this instant (its endpoint's poll found nothing, while
    /// tracing is on): drains a few of its records toward the file, with time it would spin
    /// away. Out of line: the spin loop that calls it stays small.
    #[inline(never)]
    pub(crate) fn idle(&mut self) {
        self.catch_up(IDLE_DRAIN_MAX);
    }

    /// The thread is about to sleep: drains every record it left, so that none waits for
    /// the writer thread's next pass.
    pub(crate) fn before_sleep(&mut self) {
        self.catch_up(usize::MAX);
    }

    /// Brings the open run's mirror up to its count and drains at most `max` records.
    fn catch_up(&mut self, max: usize) {
        if self.run_session != 0 {
            self.mirror_run_count();
        }
        if self.producer.as_ref().is_some_and(Producer::has_unread) {
            self.drain_own(max);
        }
    }

    /// Brings the open run's mirror up to its count.
    fn mirror_run_count(&mut self) {
        if let Some(p) = self.producer.as_mut() {
            p.set_open_run_count(self.run.stage_a);
        }
    }

    /// The thread woke from a sleep, during which the ticker may have aged (when no other
    /// thread refreshed it): one clock reading, against the microseconds of a wake-up.
    pub(crate) fn woke(&mut self) {
        if self.producer.is_some() && super::active() != 0 {
            super::refresh_ticker(clock::ticks());
        }
    }

    /// The reading is not the recorder's newest for its records (`last_exact`): records
    /// that differ in time by a tick compress to the same time, and the file is a third
    /// smaller than with every record a few hundred ticks after the one before.
    #[inline(never)]
    fn drain_own(&mut self, max: usize) {
        let now = clock::ticks();
        super::refresh_ticker(now);
        if let Some((session, traced)) = &self.owner {
            session.drain_owned(traced, now, max);
        }
    }

    /// The newest reading available without reading the clock.
    #[inline(always)]
    fn coarse(&self) -> u64 {
        self.last_exact.max(TICKER.load(Ordering::Relaxed))
    }

    /// Reads the clock, and advances the ticker with the reading when it is behind: a
    /// stream that never idles still keeps it (a run of 16 messages or more reads the clock
    /// when it closes), so the writer thread need not wake every tick.
    #[inline(always)]
    fn exact_now(&mut self) -> u64 {
        let t = clock::ticks();
        self.last_exact = t;
        super::refresh_ticker(t);
        t
    }

    /// Makes sure records go to a ring of `session`; false when that session is over.
    #[inline(always)]
    fn ensure(&mut self, session: u64) -> bool {
        (self.session == session && self.producer.is_some()) || self.register(session)
    }

    #[inline(never)]
    fn register(&mut self, session: u64) -> bool {
        // A new session: what was open belonged to the old one (its `stop` took the run).
        self.epoch = self.epoch.wrapping_add(1);
        self.producer = None;
        self.owner = None;
        self.run_session = 0;
        self.session = session;
        let current = SESSION.lock().expect("not poisoned").clone();
        match current {
            Some(s) if s.id == session => {
                let traced = s.new_ring();
                self.producer = Some(Producer::new(traced.ring.clone()));
                self.owner = Some((s, traced));
                true
            }
            _ => false,
        }
    }

    /// Writes a record (after the open run, which it closes).
    #[inline(always)]
    fn push(&mut self, session: u64, slot: Slot) {
        self.push_with(session, |s| *s = slot);
    }

    /// Writes the record `fill` writes in place (after the open run, which it closes).
    #[inline(always)]
    fn push_with(&mut self, session: u64, fill: impl FnOnce(&mut Slot)) {
        if self.run_session != 0 || self.staged_state == Staged::Call {
            self.close_open();
        }
        if self.ensure(session) {
            if let Some(p) = self.producer.as_mut() {
                p.push_with(fill);
            }
        }
    }

    /// Writes the open run and the staged request, if any (a record that is neither is
    /// about to be written).
    #[inline(never)]
    fn close_open(&mut self) {
        self.close_run();
        if self.staged_state == Staged::Call {
            self.staged_state = Staged::Empty;
            self.push_staged();
        }
    }

    /// Writes the staged record (its state already cleared), copied from where it was built
    /// ([`Producer::push_fields`]).
    #[inline(always)]
    fn push_staged(&mut self) {
        let session = self.staged_session;
        if self.run_session != 0 {
            self.close_run();
        }
        if self.ensure(session) {
            if let Some(p) = self.producer.as_mut() {
                p.push_fields(&self.staged);
            }
        }
    }

    /// Starts a run with `slot`, closing the open one.
    fn open_run(&mut self, session: u64, slot: Slot) {
        self.close_open();
        if !self.ensure(session) {
            return;
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.run = Slot { stage_a: 1, stage_b: 0, ..slot };
        self.run_session = session;
        self.run_key = slot.to_words()[2];
        self.run_tick = TICKER.load(Ordering::Relaxed);
        self.producer.as_mut().expect("ensured").set_open_run(Some(&self.run));
    }

    /// Counts one more message in the open run (its `stage_a`, here: one add to a field of
    /// the recorder); every 64 messages, a checkpoint that ends a run due to end.
    #[inline(always)]
    fn count_in_run(&mut self) {
        let count = self.run.stage_a + 1;
        self.run.stage_a = count;
        if count.is_multiple_of(64) && self.checkpoint_run() {
            self.close_run();
        }
    }

    /// Mirrors the open run's count where `stop` finds it; whether the run is due to end
    /// (full, or older than a tick). The mirror lags the count by at most 63 messages while
    /// the thread is busy, and not once it idles ([`Recorder::idle`]).
    #[inline(never)]
    fn checkpoint_run(&mut self) -> bool {
        self.mirror_run_count();
        self.run.stage_a >= RUN_MAX || TICKER.load(Ordering::Relaxed) != self.run_tick
    }

    /// Writes the open run, if any: a plain record when it holds one message.
    #[inline(never)]
    fn close_run(&mut self) {
        if self.run_session == 0 {
            return;
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.run_session = 0;
        let mut slot = self.run;
        if slot.stage_a == 0 {
            // Rolled over and never extended: no message to record.
            if let Some(p) = self.producer.as_mut() {
                p.set_open_run(None);
            }
            return;
        }
        if slot.stage_a >= 2 {
            let end = if slot.stage_a >= RUN_EXACT_MIN { self.exact_now() } else { self.coarse() };
            slot.stage_b = end.saturating_sub(slot.ticks).min(u64::from(u32::MAX)) as u32;
        }
        let slot = slot.closed_run();
        if let Some(p) = self.producer.as_mut() {
            p.set_open_run(None);
            p.push(slot);
        }
    }

    /// Records a message sent whole.
    #[inline(always)]
    pub(crate) fn send(
        &mut self,
        session: u64,
        nodes: (NodeId, NodeId),
        channel: u32,
        gather: &[&[u8]],
        kind: MessageKind,
        request_id: u64,
    ) {
        if request_id != 0 {
            self.settle();
            if self.send_call(session, nodes, channel, gather, kind, request_id) {
                return;
            }
        } else if let [only] = gather {
            // The common case of a stream, in four compares: one buffer, the channel, kind
            // and size of the open run of sends (a channel's peer does not change while a
            // run is open: opening or closing a channel ends it). No description can be
            // deferred while a run is open (staging a request closes the run, and opening
            // one settles first), so this path need not settle.
            let key = u64::from(channel) | (u64::from(kind as u8) << 32) | (1 << 48);
            if self.run_session == session && self.run_key == key && self.run.size == only.len() as u64 {
                self.count_in_run();
                return;
            }
        }
        self.send_slow(session, nodes, channel, gather, kind, request_id, 0);
    }

    /// Records a request or response by pairing it, when it pairs: a request is staged to
    /// wait for its response; a response to the request being delivered joins its record.
    /// False when it does not pair (it is then recorded alone).
    #[inline(always)]
    fn send_call(
        &mut self,
        session: u64,
        nodes: (NodeId, NodeId),
        channel: u32,
        gather: &[&[u8]],
        kind: MessageKind,
        request_id: u64,
    ) -> bool {
        let Some((buffers, lens, size)) = describe_pair(gather) else { return false };
        match kind {
            MessageKind::Response => {
                let s = &self.staged;
                if self.staged_state != Staged::Receive
                    || s.request_id != request_id
                    || s.channel != channel
                    || s.flags & FLAG_PAIR != 0
                    || s.kind != MessageKind::Request as u8
                    || self.staged_session != session
                {
                    return false;
                }
                let Ok(size) = u32::try_from(size) else { return false };
                let exact = s.flags & FLAG_EXACT != 0;
                let t = if exact { self.exact_now() } else { self.coarse() };
                let s = &mut self.staged;
                s.flags |= FLAG_PAIR;
                s.buffers = buffers;
                s.buffer_len = [lens[0], lens[1], size, offset(s.ticks, t)];
                true
            }
            MessageKind::Request => {
                match self.staged_state {
                    Staged::Empty => {}
                    Staged::Call => self.close_open(),
                    Staged::Receive => return false,
                }
                if self.run_session != 0 {
                    self.close_run();
                }
                let exact = exact_or_sampled(request_id);
                let ticks = if exact { self.exact_now() } else { self.coarse() };
                self.staged = Slot {
                    ticks,
                    src_node: nodes.0 .0,
                    dst_node: nodes.1 .0,
                    channel,
                    kind: MessageKind::Request as u8,
                    flags: if exact { FLAG_EXACT } else { 0 },
                    buffers,
                    reserved: 0,
                    size,
                    buffer_len: [lens[0], lens[1], 0, 0],
                    request_id,
                    stage_a: 0,
                    stage_b: 0,
                };
                self.staged_state = Staged::Call;
                self.staged_session = session;
                true
            }
            _ => false,
        }
    }

    /// Whether a send without request id is one more message of the open run.
    fn extends_send(
        &self,
        session: u64,
        channel: u32,
        buffers: usize,
        buffer_len: [u32; 4],
        kind: MessageKind,
    ) -> bool {
        let r = &self.run;
        self.run_session == session
            && r.flags == 0
            && r.channel == channel
            && r.kind == kind as u8
            && usize::from(r.buffers) == buffers
            && r.buffer_len == buffer_len
    }

    /// Records a send that the fast path of [`Recorder::send`] did not; `enqueued`: ticks
    /// when it was queued (0: not queued).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_slow(
        &mut self,
        session: u64,
        nodes: (NodeId, NodeId),
        channel: u32,
        gather: &[&[u8]],
        kind: MessageKind,
        request_id: u64,
        enqueued: u64,
    ) {
        self.record_send(session, nodes, channel, gather.len(), describe(gather), kind, request_id, enqueued);
    }

    /// Records a message of `len` bytes sent in one buffer that the transport packed in
    /// place (its bytes are the peer's now: only their number is known).
    pub(crate) fn send_packed(
        &mut self,
        session: u64,
        nodes: (NodeId, NodeId),
        channel: u32,
        len: usize,
        kind: MessageKind,
    ) {
        self.record_send(session, nodes, channel, 1, describe_lens(1, std::iter::once(len)), kind, 0, 0);
    }

    /// Records a send of `listed` buffers, described by [`describe`]: counted in the open
    /// run it extends, or a record of its own.
    #[allow(clippy::too_many_arguments)]
    fn record_send(
        &mut self,
        session: u64,
        nodes: (NodeId, NodeId),
        channel: u32,
        listed: usize,
        (buffers, buffer_len, size): (u8, [u32; 4], u64),
        kind: MessageKind,
        request_id: u64,
        enqueued: u64,
    ) {
        self.settle();
        if request_id == 0 && enqueued == 0 && self.extends_send(session, channel, listed, buffer_len, kind) {
            self.count_in_run();
            return;
        }
        let exact = enqueued != 0 || exact_or_sampled(request_id);
        let ticks = if exact { self.exact_now() } else { self.coarse() };
        let slot = Slot {
            ticks,
            src_node: nodes.0 .0,
            dst_node: nodes.1 .0,
            channel,
            kind: kind as u8,
            flags: if exact { FLAG_EXACT } else { 0 },
            buffers,
            reserved: 0,
            size,
            buffer_len,
            request_id,
            stage_a: if enqueued == 0 { 0 } else { offset(enqueued, ticks) },
            stage_b: 0,
        };
        if request_id == 0 && !exact && buffers > 0 {
            self.open_run(session, slot);
        } else {
            self.push_with(session, |s| *s = slot);
        }
    }

    /// A message arrived whole and its delivery begins. Nothing is written yet: the
    /// handler may describe it ([`Recorder::describe_receive`]) before
    /// [`Recorder::close_receive`] records it.
    /// `exact`: [`exact_mode`], read once per poll by the caller.
    #[inline(always)]
    pub(crate) fn open_receive(&mut self, exact: bool) {
        self.settle();
        if exact {
            self.receiving_ticks = self.exact_now();
        }
    }

    /// Says what the message being delivered is (`nodes`: sender, receiver; `len`: its
    /// length); a sampled request id makes its times exact. Only an exact record is made
    /// now; any other description waits for [`Recorder::settle`], with no call made here.
    #[inline(always)]
    pub(crate) fn describe_receive(
        &mut self,
        session: u64,
        (nodes, channel, len): ((NodeId, NodeId), u32, u64),
        kind: MessageKind,
        request_id: u64,
    ) {
        if self.delivery != Delivery::Idle {
            return;
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.delivery_nodes = nodes;
        self.delivery_channel = channel;
        self.delivery_len = len;
        let ticks = self.coarse();
        if exact_or_sampled(request_id) {
            self.delivery = Delivery::Recorded;
            self.record_description(session, kind, request_id, ticks);
        } else {
            self.delivery = Delivery::Described;
            self.described_kind = kind;
            self.described_request_id = request_id;
            self.described_ticks = ticks;
            self.described_session = session;
        }
    }

    /// Records the description of the latest delivery: stages the receive, or joins it to
    /// the request it answers. `coarse`: the recorder's newest reading when it was described
    /// (the time of a record that is not exact).
    #[inline(never)]
    fn record_description(&mut self, session: u64, kind: MessageKind, request_id: u64, coarse: u64) {
        let (nodes, channel, size) = (self.delivery_nodes, self.delivery_channel, self.delivery_len);
        if self.staged_state == Staged::Call {
            if kind == MessageKind::Response && self.answers_call(session, channel, size, request_id, coarse) {
                return;
            }
            self.close_open();
        }
        let exact = exact_or_sampled(request_id);
        let ticks = match (exact_mode(), exact) {
            (true, _) => self.receiving_ticks,
            (false, true) => self.exact_now(),
            (false, false) => coarse,
        };
        self.staged = Slot {
            ticks,
            src_node: nodes.0 .0,
            dst_node: nodes.1 .0,
            channel,
            kind: kind as u8,
            flags: FLAG_RECEIVE | if exact { FLAG_EXACT } else { 0 },
            size,
            request_id,
            ..Slot::EMPTY
        };
        self.staged_state = Staged::Receive;
        self.staged_session = session;
    }

    /// Joins the response being delivered to the staged request it answers, if it does
    /// (same session, channel and request id; its size and time fit the pair record).
    #[inline(always)]
    fn answers_call(&mut self, session: u64, channel: u32, size: u64, request_id: u64, coarse: u64) -> bool {
        let s = &self.staged;
        if s.request_id != request_id || s.channel != channel || self.staged_session != session {
            return false;
        }
        let Ok(size) = u32::try_from(size) else { return false };
        let t = match (exact_mode(), s.flags & FLAG_EXACT != 0) {
            (true, _) => self.receiving_ticks,
            (false, true) => self.exact_now(),
            (false, false) => coarse,
        };
        let at = offset(self.staged.ticks, t);
        if at == u32::MAX {
            return false;
        }
        self.staged.buffer_len[2] = size;
        self.staged.buffer_len[3] = at;
        self.staged.flags |= FLAG_PAIR;
        self.staged_state = Staged::Receive;
        true
    }

    /// Whether the handler of the message being delivered is timed: its record is exact
    /// (a description not recorded yet never is).
    #[inline(always)]
    fn handler_timed(&self) -> bool {
        self.staged_state == Staged::Receive && self.staged.flags & FLAG_EXACT != 0
    }

    /// Marks the start of the handler of the message being delivered (exact records only).
    #[inline(always)]
    pub(crate) fn handler_start(&mut self) {
        if self.handler_timed() {
            self.stamp_handler(false);
        }
    }

    /// Marks the end of the handler of the message being delivered (exact records only).
    #[inline(always)]
    pub(crate) fn handler_end(&mut self) {
        if self.handler_timed() {
            self.stamp_handler(true);
        }
    }

    /// Writes the handler's start or `end` time into the staged record.
    #[inline(never)]
    fn stamp_handler(&mut self, end: bool) {
        let t = offset(self.staged.ticks, self.exact_now());
        if end {
            self.staged.stage_b = t;
        } else {
            self.staged.stage_a = t;
        }
    }

    /// A poll of `channel` about to deliver up to `batch` messages: when a run of plain
    /// receives on it is open, that run's message size and the epoch. Each delivery of
    /// that size then skips [`Recorder::open_receive`], and after its handler, if the
    /// epoch has not moved, counts itself with [`Recorder::count_in_receive_run`] instead
    /// of [`Recorder::close_receive`]: two compares and an add per message of a stream,
    /// where the full hooks' twenty instructions cost a 22 ns message 7 % (BENCHMARKS.md).
    /// A run without room for the batch ends here and the same run opens again, empty
    /// ([`Recorder::roll_run`]).
    #[inline]
    pub(crate) fn receive_run(&mut self, session: u64, channel: u32, batch: usize) -> Option<(u64, u32)> {
        let key = u64::from(channel) | (u64::from(FLAG_RECEIVE) << 40);
        if self.run_session != session || self.run_key != key || self.delivery != Delivery::Idle {
            return None;
        }
        if (self.run.stage_a as usize).saturating_add(batch) > RUN_MAX as usize {
            self.roll_run();
        }
        Some((self.run.size, self.epoch))
    }

    /// See [`Recorder::receive_run`].
    #[inline(always)]
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// One more message in the run [`Recorder::receive_run`] allowed (at most `batch` in
    /// one poll, which is never more than [`RUN_MAX`]: see `Endpoint::poll_one`).
    #[inline(always)]
    pub(crate) fn count_in_receive_run(&mut self) {
        self.run.stage_a += 1;
    }

    /// The poll that [`Recorder::receive_run`] allowed is over: if the run is still the one
    /// it counted into, its mirror for `stop` is brought up to date, and it rolls over
    /// when full or a tick old.
    pub(crate) fn end_receive_run(&mut self, epoch: u32) {
        if self.epoch == epoch && self.run_session != 0 && self.checkpoint_run() {
            self.roll_run();
        }
    }

    /// Ends the open run and opens the same one again, empty (its first message's time
    /// the recorder's newest reading): a stream counted by [`Recorder::receive_run`] stays
    /// on that path across a full run or a tick.
    fn roll_run(&mut self) {
        let (session, key, template) = (self.run_session, self.run_key, self.run);
        self.close_run();
        self.run = Slot { ticks: self.coarse(), stage_a: 0, stage_b: 0, ..template };
        self.run_session = session;
        self.run_key = key;
        self.run_tick = TICKER.load(Ordering::Relaxed);
        if let Some(p) = self.producer.as_mut() {
            p.set_open_run(Some(&self.run));
        }
    }

    /// The delivery opened by [`Recorder::open_receive`] is over: records the message.
    #[inline(always)]
    pub(crate) fn close_receive(&mut self, session: u64, nodes: (NodeId, NodeId), channel: u32, size: u64) {
        match self.delivery {
            Delivery::Idle => self.close_plain_receive(session, nodes, channel, size),
            Delivery::Described => {
                // A response to the staged request waits for the caller's next hook (its
                // next request, after that is published); anything else is recorded now.
                self.delivery = Delivery::Deferred;
                if !(self.described_kind == MessageKind::Response && self.staged_state == Staged::Call) {
                    self.settle_described();
                }
            }
            Delivery::Recorded => {
                self.delivery = Delivery::Idle;
                if self.staged_state == Staged::Receive {
                    self.staged_state = Staged::Empty;
                    self.push_staged();
                }
            }
            Delivery::Deferred => {}
        }
    }

    /// Records a delivery its handler did not describe: a plain message, most often one
    /// more of a stream.
    #[inline(always)]
    fn close_plain_receive(&mut self, session: u64, nodes: (NodeId, NodeId), channel: u32, size: u64) {
        let key = u64::from(channel) | (u64::from(FLAG_RECEIVE) << 40);
        if self.run_session == session && self.run_key == key && self.run.size == size {
            self.count_in_run();
        } else {
            self.receive_plain_slow(session, nodes, channel, size);
        }
    }

    #[inline(never)]
    fn receive_plain_slow(&mut self, session: u64, nodes: (NodeId, NodeId), channel: u32, size: u64) {
        let exact = exact_mode();
        let slot = Slot {
            ticks: if exact { self.receiving_ticks } else { self.coarse() },
            src_node: nodes.0 .0,
            dst_node: nodes.1 .0,
            channel,
            kind: MessageKind::Message as u8,
            flags: FLAG_RECEIVE | if exact { FLAG_EXACT } else { 0 },
            size,
            ..Slot::EMPTY
        };
        if exact {
            self.push(session, slot);
        } else {
            self.open_run(session, slot);
        }
    }

    /// Takes the receive being delivered out of its delivery (its times made exact), to be
    /// written later with [`Recorder::put`]. The handler must have described it.
    pub(crate) fn take_receive(&mut self) -> Option<PendingReceive> {
        self.settle();
        if self.staged_state != Staged::Receive {
            return None;
        }
        self.staged_state = Staged::Empty;
        let mut slot = self.staged;
        if slot.flags & FLAG_EXACT == 0 {
            slot.ticks = self.exact_now();
            slot.flags |= FLAG_EXACT;
        }
        Some(PendingReceive { slot, session: self.staged_session })
    }

    /// Writes a receive taken with [`Recorder::take_receive`], if its session still runs.
    pub(crate) fn put(&mut self, session: u64, pending: PendingReceive) {
        self.settle();
        if pending.session == session {
            self.push(session, pending.slot);
        }
    }

    /// Records a datagram of a layer with its own socket ([`super::record_datagram`]).
    pub(crate) fn record_datagram(&mut self, session: u64, mut slot: Slot) {
        self.settle();
        if exact_mode() {
            slot.ticks = self.exact_now();
            slot.flags |= FLAG_EXACT;
        } else {
            slot.ticks = self.coarse();
        }
        self.push(session, slot);
    }

    /// Records a one-sided operation issued at `enqueued` (0: not measured).
    pub(crate) fn record_rma(&mut self, session: u64, mut slot: Slot, enqueued: u64) {
        self.settle();
        let exact = exact_mode() || enqueued != 0;
        slot.ticks = if exact { self.exact_now() } else { self.coarse() };
        if exact {
            slot.flags |= FLAG_EXACT;
        }
        if enqueued != 0 {
            slot.stage_a = offset(enqueued, slot.ticks);
        }
        self.push(session, slot);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::format::{decode_file, Direction};
    use super::super::{active, start, stop, TraceConfig};
    use super::*;

    /// A decoded message: kind, direction, size, buffers, request id.
    type Seen = (MessageKind, Direction, u64, u8, u64);

    /// What the recorder wrote in a session: its file records and decoded messages (other
    /// tests of this process may record meanwhile: only records between `ME` and `PEER`
    /// count).
    fn recorded(play: impl FnOnce(&mut Recorder, u64)) -> (u64, Vec<Seen>) {
        let path = std::env::temp_dir().join(format!("ulnet-recorder-{}-{:x}.ultrace", std::process::id(), rand_id()));
        let mut config = TraceConfig::new(&path, ME);
        config.sample = 1 << 20;
        start(config).unwrap();
        let mut r = Recorder::new();
        play(&mut r, active());
        // What an endpoint does when it closes.
        r.write_pending();
        stop().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let ours = |src: u32, dst: u32| (src, dst) == (ME.0, PEER.0) || (src, dst) == (PEER.0, ME.0);
        let stored = super::super::format::decode_slots(&bytes).unwrap();
        let records = stored.iter().filter(|s| ours(s.src_node, s.dst_node)).count() as u64;
        let file = decode_file(&bytes).unwrap();
        let messages = file
            .records
            .iter()
            .filter(|m| ours(m.src_node, m.dst_node))
            .map(|m| (m.message_kind(), m.direction(), m.size, m.buffers, m.request_id))
            .collect();
        (records, messages)
    }

    fn rand_id() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    }

    /// Node ids no other test of this process uses.
    const ME: NodeId = NodeId(0x7ace_0001);
    const PEER: NodeId = NodeId(0x7ace_0002);

    /// Tracing is one session per process: the cases run in one test, one after another.
    #[test]
    fn calls_pair_when_their_response_is_next_and_stay_whole_otherwise() {
        use Direction::{Receive as R, Send as S};
        use MessageKind::{Message as M, Request as Q, Response as A};
        let head = [0u8; 24];
        let body = [0u8; 100];
        // The server: a request delivered, answered by its handler, is one record.
        let (records, got) = recorded(|r, s| {
            r.open_receive(false);
            r.describe_receive(s, ((PEER, ME), 3, 124), Q, 7);
            r.handler_start();
            r.send(s, (ME, PEER), 3, &[&head, &body[..40]], A, 7);
            r.handler_end();
            r.close_receive(s, (PEER, ME), 3, 124);
        });
        assert_eq!(records, 1);
        assert_eq!(got, [(Q, R, 124, 0, 7), (A, S, 64, 2, 7)]);
        // The caller: a request, then its response, is one record.
        let (records, got) = recorded(|r, s| {
            r.send(s, (ME, PEER), 3, &[&head, &body], Q, 9);
            r.open_receive(false);
            r.describe_receive(s, ((PEER, ME), 3, 30), A, 9);
            r.close_receive(s, (PEER, ME), 3, 30);
        });
        assert_eq!(records, 1);
        assert_eq!(got, [(Q, S, 124, 2, 9), (A, R, 30, 0, 9)]);
        // Back-to-back calls: each response is recorded with its request after the next
        // request is sent (off the round trip's critical path), in order; the last one when
        // the endpoint closes.
        let (records, got) = recorded(|r, s| {
            for id in [12, 13] {
                r.send(s, (ME, PEER), 3, &[&head], Q, id);
                r.open_receive(false);
                r.describe_receive(s, ((PEER, ME), 3, 30), A, id);
                r.handler_start();
                r.handler_end();
                r.close_receive(s, (PEER, ME), 3, 30);
            }
        });
        assert_eq!(records, 2);
        assert_eq!(got, [(Q, S, 24, 1, 12), (A, R, 30, 0, 12), (Q, S, 24, 1, 13), (A, R, 30, 0, 13)]);
        // Something else between a request and its response: the request is written
        // alone first; a response to another request, or on another channel, does not pair;
        // a request of three buffers does not either.
        let (records, got) = recorded(|r, s| {
            r.send(s, (ME, PEER), 3, &[&head, &body], Q, 9);
            r.send(s, (ME, PEER), 3, &[&body[..5]], M, 0);
            r.send(s, (ME, PEER), 3, &[&head], Q, 10);
            r.open_receive(false);
            r.describe_receive(s, ((PEER, ME), 4, 30), A, 10);
            r.close_receive(s, (PEER, ME), 4, 30);
            r.send(s, (ME, PEER), 3, &[&head, &body, &body], Q, 11);
            r.open_receive(false);
            r.describe_receive(s, ((PEER, ME), 3, 30), A, 11);
            r.close_receive(s, (PEER, ME), 3, 30);
        });
        assert_eq!(records, 6);
        let want = [
            (Q, S, 124, 2, 9),
            (M, S, 5, 1, 0),
            (Q, S, 24, 1, 10),
            (A, R, 30, 0, 10),
            (Q, S, 224, 3, 11),
            (A, R, 30, 0, 11),
        ];
        assert_eq!(got, want);
        // A thread that idles drains its own ring, a few records per idle poll, in order;
        // the open run's mirror (where `stop` finds a run still open) catches up with its
        // count when the thread idles, not at every message.
        let (records, got) = recorded(|r, s| {
            for id in 1..=20 {
                r.send(s, (ME, PEER), 3, &[&head], Q, id);
                r.open_receive(false);
                r.describe_receive(s, ((PEER, ME), 3, 30), A, id);
                r.close_receive(s, (PEER, ME), 3, 30);
            }
            r.send(s, (ME, PEER), 3, &[&body[..5]], M, 0);
            let unread = |r: &Recorder| r.producer.as_ref().is_some_and(Producer::has_unread);
            assert!(unread(r), "20 calls recorded, not yet drained");
            for _ in 0..20usize.div_ceil(IDLE_DRAIN_MAX) {
                r.idle();
            }
            assert!(!unread(r), "idle polls drained the ring");
            for _ in 1..100 {
                r.send(s, (ME, PEER), 3, &[&body[..5]], M, 0);
            }
            // (A tick passing meanwhile splits the run: the open one is the newest.)
            let mirrored = |r: &Recorder| r.owner.as_ref().and_then(|(_, t)| t.ring.open_run()).map(|run| run.stage_a);
            let (count, before) = (r.run.stage_a, mirrored(r).expect("a run is open"));
            assert!(before <= count && count - before < 64, "mirrored at checkpoints: {before} of {count}");
            r.idle();
            assert_eq!(mirrored(r), Some(count), "mirrored when idle");
        });
        assert!(records >= 21, "20 call records and the run");
        assert_eq!(got[..2], [(Q, S, 24, 1, 1), (A, R, 30, 0, 1)]);
        assert_eq!(got[38..40], [(Q, S, 24, 1, 20), (A, R, 30, 0, 20)]);
        assert!(got[40..].iter().all(|m| *m == (M, S, 5, 1, 0)));
    }

    #[test]
    fn gather_lists_beyond_a_record_keep_their_size_only() {
        let b = [0u8; 10];
        assert_eq!(describe(&[&b[..3], &b[..7]]), (2, [3, 7, 0, 0], 10));
        assert_eq!(describe(&[&b[..1]; 5]), (0, [0; 4], 5));
        assert_eq!(describe(&[]), (0, [0; 4], 0));
    }
}
