//! The in-memory form of a record while it waits in a ring: one cache line, so recording a
//! message writes one line. The writer expands it to the file's [`Record`].
//!
//! A send never has more than one stage besides its own time (enqueued), a receive never
//! more than two (handler start and end), so stages are kept as tick offsets from `ticks`:
//! `offset + 1`, 0 for "not measured", saturating at `u32::MAX` (about a second and a half
//! of ticks: longer stages are recorded as that long).

use super::format::{Direction, Record};

/// A record in a ring. See the module documentation.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) ticks: u64,
    pub(crate) src_node: u32,
    pub(crate) dst_node: u32,
    pub(crate) channel: u32,
    pub(crate) kind: u8,
    pub(crate) direction: u8,
    pub(crate) buffers: u8,
    pub(crate) size: u64,
    pub(crate) buffer_len: [u32; 4],
    pub(crate) request_id: u64,
    /// Send: ticks from enqueued to sent. Receive: ticks from received to handler start.
    pub(crate) stage_a: u32,
    /// Receive: ticks from received to handler end.
    pub(crate) stage_b: u32,
}

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
        direction: 0,
        buffers: 0,
        size: 0,
        buffer_len: [0; 4],
        request_id: 0,
        stage_a: 0,
        stage_b: 0,
    };

    /// The file record.
    pub(crate) fn to_record(self) -> Record {
        let after = |o: u32| if o == 0 { 0 } else { self.ticks + u64::from(o - 1) };
        let before = |o: u32| if o == 0 { 0 } else { self.ticks.saturating_sub(u64::from(o - 1)).max(1) };
        let send = self.direction == Direction::Send as u8;
        Record {
            ticks: self.ticks,
            src_node: self.src_node,
            dst_node: self.dst_node,
            channel: self.channel,
            kind: self.kind,
            direction: self.direction,
            buffers: self.buffers,
            size: self.size,
            buffer_len: self.buffer_len,
            request_id: self.request_id,
            enqueued: if send { before(self.stage_a) } else { 0 },
            sent: if send { self.ticks } else { 0 },
            received: if send { 0 } else { self.ticks },
            handler_start: if send { 0 } else { after(self.stage_a) },
            handler_end: if send { 0 } else { after(self.stage_b) },
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stages_expand_to_absolute_ticks() {
        let s =
            Slot { ticks: 1000, direction: 1, stage_a: offset(1000, 1005), stage_b: offset(1000, 1000), ..Slot::EMPTY };
        let r = s.to_record();
        assert_eq!((r.received, r.handler_start, r.handler_end, r.sent), (1000, 1005, 1000, 0));
        let s = Slot { ticks: 1000, direction: 0, stage_a: offset(990, 1000), ..Slot::EMPTY };
        let r = s.to_record();
        assert_eq!((r.sent, r.enqueued, r.received), (1000, 990, 0));
        assert_eq!(Slot { ticks: 7, ..Slot::EMPTY }.to_record().enqueued, 0, "0: not measured");
        assert_eq!(offset(0, u64::MAX), u32::MAX, "long stages saturate");
    }
}
