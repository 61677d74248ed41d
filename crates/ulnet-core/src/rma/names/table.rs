//! The name table: an open-addressed hash table in a clerk's well-known segment, laid out
//! so that other clerks can read single slots (or the whole table) with one-sided gets.
//!
//! ```text
//!  offset
//!  0x00  header: magic "ULNETNAM" | version | slots | slot length | node      (64 bytes)
//!  0x40  slot 0                                                              (128 bytes)
//!        slot 1 ...
//!
//!  slot (128 bytes)
//!   0  version u64: odd while the owner rewrites the slot, 0 before its first write
//!   8  state u8 (0 empty, 1 live, 2 deleted) | name length u8 | 0 u16 | crc32c u32
//!  16  node u32 | segment u32
//!  24  generation u32 | 0 u32
//!  32  segment length u64
//!  40  0 u64
//!  48  name (64 bytes, zero-padded)
//!  112 0 (16 bytes)
//! ```
//!
//! One writer (the owning clerk) and any number of remote readers, with no lock: the
//! writer makes the version odd, rewrites the slot, stores a CRC-32C over the slot (with the
//! CRC field zeroed) and makes the version even again. A reader accepts a slot only when
//! its version is even and its CRC matches; a copy torn by a concurrent rewrite fails the
//! check and is read again. Deleted slots stay as tombstones so probe chains are not cut.
//! Every clerk uses the same hash (FNV-1a, 64 bits) and the same number of slots, so a
//! name usually sits in the same slot on every node: one remote read finds it.

use crate::rma::rights::{Generation, NodeId, SegmentId};
use crate::rma::segment::SegmentDescriptor;
use crate::rma::wire::NAME_MAX;

const MAGIC: u64 = u64::from_le_bytes(*b"ULNETNAM");
/// Layout version. History: 1 — first layout.
const VERSION: u64 = 1;
/// Bytes of the table header.
pub(crate) const HEADER_LEN: usize = 64;
/// Bytes of a slot.
pub(crate) const SLOT_LEN: usize = 128;

const STATE_EMPTY: u8 = 0;
const STATE_LIVE: u8 = 1;
const STATE_DELETED: u8 = 2;

const _: () = assert!(48 + NAME_MAX <= SLOT_LEN, "a name fits its slot");

/// The hash every clerk uses: 64-bit FNV-1a of the name's bytes.
pub(crate) fn hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Bytes of a table of `slots` slots.
pub(crate) fn table_len(slots: usize) -> usize {
    HEADER_LEN + slots * SLOT_LEN
}

/// Offset of slot `i`.
pub(crate) fn slot_off(i: usize) -> usize {
    HEADER_LEN + i * SLOT_LEN
}

/// The table header.
pub(crate) fn encode_header(slots: usize, node: NodeId) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&(slots as u64).to_le_bytes());
    h[24..32].copy_from_slice(&(SLOT_LEN as u64).to_le_bytes());
    h[32..40].copy_from_slice(&u64::from(node.0).to_le_bytes());
    h
}

/// The slot count of a table header read from another node, if it is one.
pub(crate) fn decode_header(h: &[u8]) -> Option<usize> {
    let w = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(h.get(at..at + 8)?.try_into().ok()?)) };
    if w(0)? != MAGIC || w(8)? != VERSION || w(24)? != SLOT_LEN as u64 {
        return None;
    }
    let slots = usize::try_from(w(16)?).ok()?;
    (slots.is_power_of_two() && slots <= 1 << 24).then_some(slots)
}

/// What a slot holds, as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SlotView {
    /// Never written: ends a probe chain.
    Empty,
    /// A deleted entry: the chain goes on.
    Deleted,
    /// A name and its segment.
    Live { name: Vec<u8>, descriptor: SegmentDescriptor },
    /// Being rewritten, or torn by a concurrent rewrite: read again.
    Unstable,
}

fn crc_of(slot: &[u8; SLOT_LEN]) -> u32 {
    let mut copy = *slot;
    copy[12..16].fill(0);
    crc32c::crc32c(&copy)
}

/// Encodes a slot at `version` (even) holding `name` → `descriptor`, or a tombstone.
pub(crate) fn encode_slot(version: u64, entry: Option<(&[u8], &SegmentDescriptor)>) -> [u8; SLOT_LEN] {
    debug_assert!(version.is_multiple_of(2) && version > 0);
    let mut s = [0u8; SLOT_LEN];
    s[..8].copy_from_slice(&version.to_le_bytes());
    match entry {
        Some((name, d)) => {
            assert!(!name.is_empty() && name.len() <= NAME_MAX, "names are checked before they are stored");
            s[8] = STATE_LIVE;
            s[9] = name.len() as u8;
            s[16..20].copy_from_slice(&d.node.0.to_le_bytes());
            s[20..24].copy_from_slice(&d.segment.0.to_le_bytes());
            s[24..28].copy_from_slice(&d.generation.0.to_le_bytes());
            s[32..40].copy_from_slice(&d.len.to_le_bytes());
            s[48..48 + name.len()].copy_from_slice(name);
        }
        None => s[8] = STATE_DELETED,
    }
    let crc = crc_of(&s);
    s[12..16].copy_from_slice(&crc.to_le_bytes());
    s
}

/// Decodes a slot copy. Never panics; anything inconsistent is `Unstable`.
pub(crate) fn decode_slot(b: &[u8]) -> SlotView {
    let Ok(s) = <&[u8; SLOT_LEN]>::try_from(b) else { return SlotView::Unstable };
    let version = u64::from_le_bytes(s[..8].try_into().expect("8 bytes"));
    if version == 0 {
        return SlotView::Empty;
    }
    let crc = u32::from_le_bytes(s[12..16].try_into().expect("4 bytes"));
    if !version.is_multiple_of(2) || crc != crc_of(s) {
        return SlotView::Unstable;
    }
    let u32_at = |at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    match s[8] {
        STATE_DELETED => SlotView::Deleted,
        STATE_LIVE => {
            let len = s[9] as usize;
            if len == 0 || len > NAME_MAX {
                return SlotView::Unstable;
            }
            SlotView::Live {
                name: s[48..48 + len].to_vec(),
                descriptor: SegmentDescriptor {
                    node: NodeId(u32_at(16)),
                    segment: SegmentId(u32_at(20)),
                    generation: Generation(u32_at(24)),
                    len: u64::from_le_bytes(s[32..40].try_into().expect("8 bytes")),
                },
            }
        }
        STATE_EMPTY => SlotView::Empty,
        _ => SlotView::Unstable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn slots_round_trip(name in proptest::collection::vec(any::<u8>(), 1..=NAME_MAX), node: u32, seg: u32, gen: u32, len: u64, v in 1u64..1000) {
            let d = SegmentDescriptor { node: NodeId(node), segment: SegmentId(seg), generation: Generation(gen), len };
            let s = encode_slot(v * 2, Some((&name, &d)));
            prop_assert_eq!(decode_slot(&s), SlotView::Live { name: name.clone(), descriptor: d });
            prop_assert_eq!(decode_slot(&encode_slot(v * 2, None)), SlotView::Deleted);
        }

        /// A slot torn between two versions (any mix of their bytes at word granularity)
        /// reads as one of them or as unstable, never as a third entry.
        #[test]
        fn torn_slots_are_detected(a in proptest::collection::vec(any::<u8>(), 1..=NAME_MAX), b in proptest::collection::vec(any::<u8>(), 1..=NAME_MAX), mask: u16) {
            let d = SegmentDescriptor { node: NodeId(1), segment: SegmentId(2), generation: Generation(3), len: 4 };
            let e = SegmentDescriptor { node: NodeId(5), segment: SegmentId(6), generation: Generation(7), len: 8 };
            let old = encode_slot(2, Some((&a, &d)));
            let new = encode_slot(4, Some((&b, &e)));
            let mut torn = old;
            for w in 0..16 {
                if mask & (1 << w) != 0 {
                    torn[w * 8..w * 8 + 8].copy_from_slice(&new[w * 8..w * 8 + 8]);
                }
            }
            let view = decode_slot(&torn);
            let ok = view == decode_slot(&old) || view == decode_slot(&new) || view == SlotView::Unstable;
            prop_assert!(ok, "{:?}", view);
        }

        #[test]
        fn random_slots_never_crash(bytes in proptest::collection::vec(any::<u8>(), SLOT_LEN..=SLOT_LEN)) {
            let _ = decode_slot(&bytes);
            let _ = decode_header(&bytes[..HEADER_LEN]);
        }
    }

    #[test]
    fn header_round_trips_and_hash_is_fnv1a() {
        assert_eq!(decode_header(&encode_header(8192, NodeId(3))), Some(8192));
        assert_eq!(decode_header(&[0u8; HEADER_LEN]), None);
        // Reference values of 64-bit FNV-1a.
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
