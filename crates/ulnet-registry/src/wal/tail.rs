//! What the bytes after a log's last readable record are: the remains of a write that never
//! completed (a *torn* tail), or damage to what was written (*corruption*).
//!
//! The writer appends a batch of frames with one write and fsyncs it before it writes
//! anything else, and it opens a new segment only after the one before is fsynced. So a
//! write the crash (or a full disk) interrupted can only be the last bytes of the last
//! segment, and its fsync never returned: nothing in it was acknowledged, promised or
//! granted (see the `gup` module documentation, *Restarts, torn tails and lost logs*). It
//! looks like one of:
//!
//! ```text
//!  ... whole frames | len crc payl            the file ends inside a frame (a short
//!                                             write, or the file size of a prefix of it)
//!  ... whole frames | len crc pay 00 00 ..00  the file was extended, but the rest of the
//!                     ^ sector boundary       write never reached the disk: zeros from a
//!                                             sector boundary to the end
//!  ... whole frames | 00 00 00 ...... 00      nothing of the write reached the disk
//! ```
//!
//! and no valid frame follows it. Anything else is corruption: a bad frame followed by a
//! valid one or by another segment (the later write completed, so the bad frame had been
//! fsynced), a whole frame that fails its checksum (it may have been fsynced and acted on;
//! bit rot there cannot be told from an unfinished write, so it is not taken for one),
//! an impossible length, or a frame whose length field alone was damaged.

use super::record::{frame_checks, frame_crc, FRAME_HEADER_BYTES, FRAME_PAYLOAD_MAX};

/// The unit in which a disk persists a write (or fails to): a write cut short by a crash
/// ends on a sector boundary. 512 bytes, the smallest sector of any disk.
const SECTOR_BYTES: u64 = 512;

/// What ends a log's readable records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailKind {
    /// A write that never completed: cut off, and the node goes on as itself.
    Torn,
    /// Damage to what may have been fsynced and acted on: the node comes back under a new
    /// identity and recovers what it lost from its peers.
    Corrupt,
}

impl std::fmt::Display for TailKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TailKind::Torn => "torn",
            TailKind::Corrupt => "corrupt",
        })
    }
}

/// Classifies the bytes from the first frame that does not read to the end of its segment
/// file: `rest` starts `offset` bytes into the file, and `last_segment` says that no
/// segment file follows it. See the module documentation.
pub fn classify(rest: &[u8], offset: u64, last_segment: bool) -> TailKind {
    if !last_segment || valid_frame_after(rest) {
        return TailKind::Corrupt;
    }
    if unfinished_at_end(rest) || zero_filled(rest, offset) {
        TailKind::Torn
    } else {
        TailKind::Corrupt
    }
}

/// Whether a frame with a valid checksum starts anywhere after the first byte: a write
/// after the bad frame completed, so the bad frame was durable.
fn valid_frame_after(rest: &[u8]) -> bool {
    (1..rest.len()).any(|at| frame_checks(&rest[at..]))
}

/// Whether the frame at the start of `rest` reaches past the end of the file (its header,
/// or the payload its length announces), and is not a whole frame whose length field
/// alone was damaged (its checksum matches the length the file leaves it).
fn unfinished_at_end(rest: &[u8]) -> bool {
    if rest.len() < FRAME_HEADER_BYTES {
        return true;
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
    if len > FRAME_PAYLOAD_MAX || FRAME_HEADER_BYTES + len <= rest.len() {
        return false;
    }
    let left = rest.len() - FRAME_HEADER_BYTES;
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let whole_with_damaged_length =
        u32::try_from(left).is_ok_and(|l| frame_crc(l.to_le_bytes(), &rest[FRAME_HEADER_BYTES..]) == crc);
    !whole_with_damaged_length
}

/// Whether the file was extended for a write that reached the disk only in part: every
/// byte is zero, or the bytes are zero from a sector boundary to the end (at least one
/// whole sector of them) and that boundary falls inside the frame at the start, which is
/// therefore incomplete.
fn zero_filled(rest: &[u8], offset: u64) -> bool {
    let Some(last_data) = rest.iter().rposition(|&b| b != 0) else { return true };
    let data_end = offset + last_data as u64 + 1;
    let zeros_from = (data_end.div_ceil(SECTOR_BYTES) * SECTOR_BYTES - offset) as usize;
    if rest.len() < FRAME_HEADER_BYTES || zeros_from + SECTOR_BYTES as usize > rest.len() {
        return false;
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
    len <= FRAME_PAYLOAD_MAX && FRAME_HEADER_BYTES + len > zeros_from
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gup::Record;
    use crate::wal::record::frame_record;

    fn frames(n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for seq in 1..=n {
            frame_record(&Record::Commit { seq }, &mut out);
        }
        out
    }

    /// An entry frame whose payload holds one update of `size` bytes.
    fn big_frame(size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let entry = crate::gup::Entry::single(
            crate::gup::NodeId(7),
            crate::gup::BatchId { incarnation: 1, counter: 1 },
            vec![std::sync::Arc::from(vec![0xabu8; size])].into(),
        );
        frame_record(&Record::Entry { seq: 9, entry }, &mut out);
        out
    }

    #[test]
    fn a_log_ending_inside_a_frame_is_torn() {
        let whole = frames(3);
        let last = whole.len() - frames(1).len();
        for cut in last + 1..whole.len() {
            assert_eq!(classify(&whole[last..cut], last as u64, true), TailKind::Torn, "cut at {cut}");
        }
    }

    #[test]
    fn a_torn_frame_in_a_segment_that_another_follows_is_corrupt() {
        let whole = frames(3);
        let last = whole.len() - frames(1).len();
        assert_eq!(classify(&whole[last..whole.len() - 2], last as u64, false), TailKind::Corrupt);
    }

    #[test]
    fn a_whole_frame_with_a_flipped_bit_is_corrupt() {
        let mut whole = frames(3);
        let last = whole.len() - frames(1).len();
        for at in last..whole.len() {
            whole[at] ^= 0x04;
            assert_eq!(classify(&whole[last..], last as u64, true), TailKind::Corrupt, "flip at {at}");
            whole[at] ^= 0x04;
        }
    }

    #[test]
    fn a_bad_frame_followed_by_a_valid_one_is_corrupt() {
        let mut whole = frames(3);
        let second = frames(1).len();
        whole[second] ^= 0x40; // the second frame's length: it now reaches past the end
        assert_eq!(classify(&whole[second..], second as u64, true), TailKind::Corrupt);
    }

    #[test]
    fn zeros_after_the_last_whole_frame_are_torn() {
        let mut log = frames(2);
        let end = log.len();
        log.extend_from_slice(&[0; 4096]);
        assert_eq!(classify(&log[end..], end as u64, true), TailKind::Torn);
        assert_eq!(classify(&log[end..end + 3], end as u64, true), TailKind::Torn);
    }

    #[test]
    fn a_frame_cut_at_a_sector_boundary_and_zero_filled_is_torn() {
        let mut log = frames(2);
        let start = log.len();
        log.extend_from_slice(&big_frame(3000));
        // The first sector boundary after the frame's start reached the disk; the rest
        // reads as zeros, to the end of what the file size covers.
        let boundary = (start as u64).div_ceil(SECTOR_BYTES) as usize * SECTOR_BYTES as usize + 512;
        log[boundary..].iter_mut().for_each(|b| *b = 0);
        log.extend_from_slice(&[0; 512]);
        assert_eq!(classify(&log[start..], start as u64, true), TailKind::Torn);
        // A single sector of zeros at the very end of a whole frame is not enough.
        let mut whole = frames(2);
        let start = whole.len();
        whole.extend_from_slice(&big_frame(3000));
        let len = whole.len();
        whole[len - 3] ^= 1;
        assert_eq!(classify(&whole[start..], start as u64, true), TailKind::Corrupt);
    }

    #[test]
    fn a_whole_last_frame_whose_length_field_alone_was_damaged_is_corrupt() {
        let mut whole = frames(3);
        let last = whole.len() - frames(1).len();
        whole[last] += 1; // announces one byte more than the file holds
        assert_eq!(classify(&whole[last..], last as u64, true), TailKind::Corrupt);
    }

    #[test]
    fn an_impossible_length_is_corrupt() {
        let mut whole = frames(3);
        let last = whole.len() - frames(1).len();
        whole[last + 3] = 0xff;
        assert_eq!(classify(&whole[last..], last as u64, true), TailKind::Corrupt);
    }
}
