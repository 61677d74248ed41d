//! A record as it waits in a ring and as it is stored in the file: 64 bytes, one cache
//! line, written by the traced thread and copied to the file by the writer without any
//! conversion (the layout is in [`super::format`]).
//!
//! Stage times are tick offsets from `ticks` (`offset + 1`, 0 for "not measured",
//! saturating at `u32::MAX`, about a second and a half of ticks): a send has at most one
//! stage besides its own time (enqueued), a receive at most two (handler start and end).
//! A run — several identical consecutive messages with no request id — keeps its count in
//! `stage_a` and the ticks from its first to its last message in `stage_b`.
//!
//! A *pair* — a request and its response, seen by one side — keeps the request's time in
//! `ticks`, its size in `size`, the message this side sent (the request at the caller, the
//! response at the server) in `buffers` and `buffer_len[0..2]`, the response's size in
//! `buffer_len[2]`, the response's time in `buffer_len[3]` (an offset from `ticks`), and
//! the handler this side ran on the message it received in `stage_a` and `stage_b`
//! (offsets from `ticks`).

use super::format::{Direction, MessageKind, Record, RECORD_LEN};

/// Flag: recorded by the receiver (else by the sender).
pub(crate) const FLAG_RECEIVE: u8 = 1;
/// Flag: `ticks` was read from the clock for this record (else it is the newest reading
/// the recorder had; see [`super`] on precision).
pub(crate) const FLAG_EXACT: u8 = 2;
/// Flag: the record stands for a run of identical messages.
pub(crate) const FLAG_RUN: u8 = 4;
/// Flag: the record stands for a request and its response (format version 3; see
/// [`super::format`]).
pub(crate) const FLAG_PAIR: u8 = 8;
/// Flags a record of format version 2 may carry.
pub(crate) const FLAGS_KNOWN_V2: u8 = FLAG_RECEIVE | FLAG_EXACT | FLAG_RUN;
/// Flags a record may carry.
pub(crate) const FLAGS_KNOWN: u8 = FLAGS_KNOWN_V2 | FLAG_PAIR;
/// Most buffers of the message a pair record lists (the other two buffer words hold the
/// response's size and time).
pub(crate) const PAIR_BUFFERS_MAX: usize = 2;

/// A record in a ring. See the module documentation.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) ticks: u64,
    pub(crate) src_node: u32,
    pub(crate) dst_node: u32,
    pub(crate) channel: u32,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) buffers: u8,
    pub(crate) reserved: u8,
    pub(crate) size: u64,
    pub(crate) buffer_len: [u32; 4],
    pub(crate) request_id: u64,
    /// Send: ticks from enqueued to sent. Receive: from received to handler start. Run:
    /// the count.
    pub(crate) stage_a: u32,
    /// Receive: ticks from received to handler end. Run: from the first to the last
    /// message.
    pub(crate) stage_b: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == RECORD_LEN, "a slot is one file record");
const _: () = assert!(std::mem::size_of::<Slot>() == 64, "a slot is one cache line");

/// Encodes the distance from `from` to `to` (ticks) as a stage offset.
#[inline(always)]
pub(crate) fn offset(from: u64, to: u64) -> u32 {
    to.saturating_sub(from).saturating_add(1).min(u64::from(u32::MAX)) as u32
}

impl Slot {
    pub(crate) const EMPTY: Slot = Slot {
        ticks: 0,
        src_node: 0,
        dst_node: 0,
        channel: 0,
        kind: 0,
        flags: 0,
        buffers: 0,
        reserved: 0,
        size: 0,
        buffer_len: [0; 4],
        request_id: 0,
        stage_a: 0,
        stage_b: 0,
    };

    /// The record of an open run (its count in `stage_a`, its span in `stage_b`) as it is
    /// written: a run record, or a plain one when it holds one message.
    pub(crate) fn closed_run(mut self) -> Slot {
        if self.stage_a >= 2 {
            self.flags |= FLAG_RUN;
        } else {
            self.stage_a = 0;
            self.stage_b = 0;
        }
        self
    }

    /// The record as eight little-endian words (the file layout).
    #[inline]
    pub(crate) fn to_words(self) -> [u64; 8] {
        let lo_hi = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        [
            self.ticks,
            lo_hi(self.src_node, self.dst_node),
            lo_hi(self.channel, u32::from_le_bytes([self.kind, self.flags, self.buffers, self.reserved])),
            self.size,
            lo_hi(self.buffer_len[0], self.buffer_len[1]),
            lo_hi(self.buffer_len[2], self.buffer_len[3]),
            self.request_id,
            lo_hi(self.stage_a, self.stage_b),
        ]
    }

    /// The record of eight words written by [`Slot::to_words`].
    #[inline]
    pub(crate) fn from_words(w: [u64; 8]) -> Slot {
        let (lo, hi) = (|x: u64| x as u32, |x: u64| (x >> 32) as u32);
        let packed = hi(w[2]).to_le_bytes();
        Slot {
            ticks: w[0],
            src_node: lo(w[1]),
            dst_node: hi(w[1]),
            channel: lo(w[2]),
            kind: packed[0],
            flags: packed[1],
            buffers: packed[2],
            reserved: packed[3],
            size: w[3],
            buffer_len: [lo(w[4]), hi(w[4]), lo(w[5]), hi(w[5])],
            request_id: w[6],
            stage_a: lo(w[7]),
            stage_b: hi(w[7]),
        }
    }

    /// Appends the file form of versions 2 and 3 (64 bytes) to `out`.
    #[cfg(test)]
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        for w in self.to_words() {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// The record of the file form `b` (exactly [`RECORD_LEN`] bytes), without checks.
    pub(crate) fn from_bytes(b: &[u8]) -> Slot {
        let mut w = [0u64; 8];
        for (i, w) in w.iter_mut().enumerate() {
            *w = u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        }
        Slot::from_words(w)
    }

    /// The decoded records: stage offsets become tick instants, a run its count and span,
    /// and a pair two records (the request, then its response).
    pub(crate) fn to_records(self) -> (Record, Option<Record>) {
        if self.flags & FLAG_PAIR != 0 {
            return self.pair_records();
        }
        let after = |o: u32| if o == 0 { 0 } else { self.ticks.saturating_add(u64::from(o - 1)) };
        let before = |o: u32| if o == 0 { 0 } else { self.ticks.saturating_sub(u64::from(o - 1)).max(1) };
        let receive = self.flags & FLAG_RECEIVE != 0;
        let run = self.flags & FLAG_RUN != 0;
        let (count, last_ticks) =
            if run { (self.stage_a, self.ticks.saturating_add(u64::from(self.stage_b))) } else { (1, self.ticks) };
        let (a, b) = if run { (0, 0) } else { (self.stage_a, self.stage_b) };
        let record = Record {
            ticks: self.ticks,
            src_node: self.src_node,
            dst_node: self.dst_node,
            channel: self.channel,
            kind: self.kind,
            direction: if receive { Direction::Receive as u8 } else { Direction::Send as u8 },
            exact: self.flags & FLAG_EXACT != 0,
            buffers: self.buffers,
            size: self.size,
            buffer_len: self.buffer_len,
            request_id: self.request_id,
            count,
            last_ticks,
            enqueued: if receive { 0 } else { before(a) },
            sent: if receive { 0 } else { self.ticks },
            received: if receive { self.ticks } else { 0 },
            handler_start: if receive { after(a) } else { 0 },
            handler_end: if receive { after(b) } else { 0 },
        };
        (record, None)
    }

    /// The request and the response of a pair record, each as its own record would have
    /// been: the side that received a message has its handler times, the side that sent
    /// one has its buffers.
    fn pair_records(self) -> (Record, Option<Record>) {
        let after = |o: u32| if o == 0 { 0 } else { self.ticks.saturating_add(u64::from(o - 1)) };
        let caller = self.flags & FLAG_RECEIVE == 0;
        let exact = self.flags & FLAG_EXACT != 0;
        let response_ticks = after(self.buffer_len[3]);
        let sent_buffers = (self.buffers, [self.buffer_len[0], self.buffer_len[1], 0, 0]);
        let (request_buffers, response_buffers) =
            if caller { (sent_buffers, (0, [0; 4])) } else { ((0, [0; 4]), sent_buffers) };
        let handlers = (after(self.stage_a), after(self.stage_b));
        let base = Record { channel: self.channel, exact, request_id: self.request_id, count: 1, ..Record::default() };
        let request = Record {
            ticks: self.ticks,
            src_node: self.src_node,
            dst_node: self.dst_node,
            kind: MessageKind::Request as u8,
            direction: if caller { Direction::Send as u8 } else { Direction::Receive as u8 },
            buffers: request_buffers.0,
            buffer_len: request_buffers.1,
            size: self.size,
            last_ticks: self.ticks,
            sent: if caller { self.ticks } else { 0 },
            received: if caller { 0 } else { self.ticks },
            handler_start: if caller { 0 } else { handlers.0 },
            handler_end: if caller { 0 } else { handlers.1 },
            ..base
        };
        let response = Record {
            ticks: response_ticks,
            src_node: self.dst_node,
            dst_node: self.src_node,
            kind: MessageKind::Response as u8,
            direction: if caller { Direction::Receive as u8 } else { Direction::Send as u8 },
            buffers: response_buffers.0,
            buffer_len: response_buffers.1,
            size: u64::from(self.buffer_len[2]),
            last_ticks: response_ticks,
            sent: if caller { 0 } else { response_ticks },
            received: if caller { response_ticks } else { 0 },
            handler_start: if caller { handlers.0 } else { 0 },
            handler_end: if caller { handlers.1 } else { 0 },
            ..base
        };
        (request, Some(response))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stages_expand_to_absolute_ticks() {
        let s = Slot {
            ticks: 1000,
            flags: FLAG_RECEIVE | FLAG_EXACT,
            stage_a: offset(1000, 1005),
            stage_b: offset(1000, 1000),
            ..Slot::EMPTY
        };
        let r = s.to_records().0;
        assert_eq!((r.received, r.handler_start, r.handler_end, r.sent, r.exact), (1000, 1005, 1000, 0, true));
        let s = Slot { ticks: 1000, stage_a: offset(990, 1000), ..Slot::EMPTY };
        let r = s.to_records().0;
        assert_eq!((r.sent, r.enqueued, r.received, r.count, r.exact), (1000, 990, 0, 1, false));
        assert_eq!(Slot { ticks: 7, ..Slot::EMPTY }.to_records().0.enqueued, 0, "0: not measured");
        assert_eq!(offset(0, u64::MAX), u32::MAX, "long stages saturate");
    }

    #[test]
    fn stages_of_a_forged_last_instant_saturate() {
        let s = Slot { ticks: u64::MAX - 2, flags: FLAG_RECEIVE, stage_a: 10, stage_b: 3, ..Slot::EMPTY };
        let r = s.to_records().0;
        assert_eq!((r.handler_start, r.handler_end), (u64::MAX, u64::MAX));
        let s = Slot { ticks: u64::MAX, flags: FLAG_PAIR, stage_a: 5, buffer_len: [0, 0, 0, 9], ..Slot::EMPTY };
        let (request, response) = s.to_records();
        assert_eq!((request.ticks, response.expect("a pair").ticks), (u64::MAX, u64::MAX));
    }

    #[test]
    fn runs_expand_to_count_and_span() {
        let s = Slot { ticks: 500, flags: FLAG_RUN, stage_a: 256, stage_b: 40, ..Slot::EMPTY };
        let r = s.to_records().0;
        assert_eq!((r.count, r.last_ticks, r.enqueued, r.handler_start), (256, 540, 0, 0));
    }

    #[test]
    fn words_and_bytes_round_trip() {
        let s = Slot {
            ticks: 0x0102_0304_0506_0708,
            src_node: 9,
            dst_node: 10,
            channel: 11,
            kind: 2,
            flags: FLAG_RECEIVE | FLAG_EXACT,
            buffers: 3,
            reserved: 0,
            size: 600,
            buffer_len: [100, 200, 300, 0],
            request_id: u64::MAX,
            stage_a: 7,
            stage_b: 8,
        };
        assert_eq!(Slot::from_words(s.to_words()), s);
        let mut b = Vec::new();
        s.encode_into(&mut b);
        assert_eq!(b.len(), RECORD_LEN);
        assert_eq!(b[0], 0x08, "little-endian");
        assert_eq!((b[20], b[21], b[22]), (2, FLAG_RECEIVE | FLAG_EXACT, 3), "kind, flags, buffers at 20..23");
        assert_eq!(Slot::from_bytes(&b), s);
    }
}
