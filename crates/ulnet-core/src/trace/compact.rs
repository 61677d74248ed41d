//! The compact record encoding of format version 4 (see [`super::format`]): each record is
//! stored as what changed since the record before it in its block, so a stream of calls on
//! one channel costs a few bytes per record instead of 64.
//!
//! ```text
//!  record: mask u8, then ticks, then each field group whose mask bit is set, in bit order
//!    ticks            varint of zigzag(ticks - previous ticks)        (always)
//!    bit 0 nodes      varint src_node, varint dst_node
//!    bit 1 channel    varint channel
//!    bit 2 shape      kind u8, flags u8, buffers u8, reserved u8
//!    bit 3 size       varint size
//!    bit 4 buffers    varint buffer_len[0], [1], [2]
//!    bit 5 last       varint buffer_len[3]
//!    bit 6 request    varint of zigzag(request_id - previous request_id)
//!    bit 7 stages     varint stage_a, varint stage_b
//!  a group whose bit is clear has the previous record's values; the "previous record" of
//!  a block's first record is all zeros. Varints are LEB128 (7 bits a byte, low first).
//! ```
//!
//! The writer encodes off the traced threads' path; every block is decodable alone.

use super::slot::Slot;

/// Most bytes one record takes: mask, ticks (10), nodes (5 + 5), channel (5), shape (4),
/// size (10), buffers (3 × 5), last (5), request (10), stages (5 + 5).
pub(crate) const RECORD_LEN_MAX: usize = 1 + 10 + 10 + 5 + 4 + 10 + 15 + 5 + 10 + 10;

const NODES: u8 = 1;
const CHANNEL: u8 = 2;
const SHAPE: u8 = 4;
const SIZE: u8 = 8;
const BUFFERS: u8 = 16;
const LAST: u8 = 32;
const REQUEST: u8 = 64;
const STAGES: u8 = 128;

#[inline(always)]
fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

#[inline(always)]
fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

/// Writes `v` as a varint at `out[*at..]` (room checked by the caller's buffer size).
#[inline(always)]
fn put(out: &mut [u8; RECORD_LEN_MAX], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*at] = v as u8 | 0x80;
        *at += 1;
        v >>= 7;
    }
    out[*at] = v as u8;
    *at += 1;
}

/// Appends `s` encoded against `prev` to `out`, and makes `s` the new `prev`.
#[inline]
pub(crate) fn encode(prev: &mut Slot, s: &Slot, out: &mut Vec<u8>) {
    let mut b = [0u8; RECORD_LEN_MAX];
    let mut at = 1;
    let mut mask = 0;
    put(&mut b, &mut at, zigzag(s.ticks.wrapping_sub(prev.ticks)));
    if (s.src_node, s.dst_node) != (prev.src_node, prev.dst_node) {
        mask |= NODES;
        put(&mut b, &mut at, u64::from(s.src_node));
        put(&mut b, &mut at, u64::from(s.dst_node));
    }
    if s.channel != prev.channel {
        mask |= CHANNEL;
        put(&mut b, &mut at, u64::from(s.channel));
    }
    let shape = [s.kind, s.flags, s.buffers, s.reserved];
    if shape != [prev.kind, prev.flags, prev.buffers, prev.reserved] {
        mask |= SHAPE;
        b[at..at + 4].copy_from_slice(&shape);
        at += 4;
    }
    if s.size != prev.size {
        mask |= SIZE;
        put(&mut b, &mut at, s.size);
    }
    if s.buffer_len[..3] != prev.buffer_len[..3] {
        mask |= BUFFERS;
        for &l in &s.buffer_len[..3] {
            put(&mut b, &mut at, u64::from(l));
        }
    }
    if s.buffer_len[3] != prev.buffer_len[3] {
        mask |= LAST;
        put(&mut b, &mut at, u64::from(s.buffer_len[3]));
    }
    if s.request_id != prev.request_id {
        mask |= REQUEST;
        put(&mut b, &mut at, zigzag(s.request_id.wrapping_sub(prev.request_id)));
    }
    if (s.stage_a, s.stage_b) != (prev.stage_a, prev.stage_b) {
        mask |= STAGES;
        put(&mut b, &mut at, u64::from(s.stage_a));
        put(&mut b, &mut at, u64::from(s.stage_b));
    }
    b[0] = mask;
    out.extend_from_slice(&b[..at]);
    *prev = *s;
}

/// Reads a varint at `body[*at..]`.
fn get(body: &[u8], at: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = body.get(*at) else { return Err("record runs past the end of its block") };
        *at += 1;
        if shift == 63 && byte > 1 {
            return Err("varint overflows 64 bits");
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes")
}

fn get_u32(body: &[u8], at: &mut usize) -> Result<u32, &'static str> {
    u32::try_from(get(body, at)?).map_err(|_| "32-bit field holds a larger value")
}

/// Reads the record at `body[*at..]` encoded against `prev`, and makes it the new `prev`.
/// The record is not checked beyond its encoding (see `Record::decode`).
pub(crate) fn decode(body: &[u8], at: &mut usize, prev: &mut Slot) -> Result<Slot, &'static str> {
    let Some(&mask) = body.get(*at) else { return Err("record runs past the end of its block") };
    *at += 1;
    let mut s = *prev;
    s.ticks = prev.ticks.wrapping_add(unzigzag(get(body, at)?));
    if mask & NODES != 0 {
        s.src_node = get_u32(body, at)?;
        s.dst_node = get_u32(body, at)?;
    }
    if mask & CHANNEL != 0 {
        s.channel = get_u32(body, at)?;
    }
    if mask & SHAPE != 0 {
        let Some(shape) = body.get(*at..*at + 4) else { return Err("record runs past the end of its block") };
        (s.kind, s.flags, s.buffers, s.reserved) = (shape[0], shape[1], shape[2], shape[3]);
        *at += 4;
    }
    if mask & SIZE != 0 {
        s.size = get(body, at)?;
    }
    if mask & BUFFERS != 0 {
        for i in 0..3 {
            s.buffer_len[i] = get_u32(body, at)?;
        }
    }
    if mask & LAST != 0 {
        s.buffer_len[3] = get_u32(body, at)?;
    }
    if mask & REQUEST != 0 {
        s.request_id = prev.request_id.wrapping_add(unzigzag(get(body, at)?));
    }
    if mask & STAGES != 0 {
        s.stage_a = get_u32(body, at)?;
        s.stage_b = get_u32(body, at)?;
    }
    *prev = s;
    Ok(s)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_slot() -> impl Strategy<Value = Slot> {
        (any::<[u64; 3]>(), any::<[u32; 9]>(), any::<[u8; 4]>()).prop_map(|(w, n, b)| Slot {
            ticks: w[0],
            src_node: n[0],
            dst_node: n[1],
            channel: n[2],
            kind: b[0],
            flags: b[1],
            buffers: b[2],
            reserved: b[3],
            size: w[1],
            buffer_len: [n[3], n[4], n[5], n[6]],
            request_id: w[2],
            stage_a: n[7],
            stage_b: n[8],
        })
    }

    proptest! {
        #[test]
        fn any_slots_round_trip_within_the_bound(slots in proptest::collection::vec(any_slot(), 0..20)) {
            let mut prev = Slot::EMPTY;
            let mut body = Vec::new();
            for s in &slots {
                let before = body.len();
                encode(&mut prev, s, &mut body);
                prop_assert!(body.len() - before <= RECORD_LEN_MAX);
            }
            let (mut prev, mut at) = (Slot::EMPTY, 0);
            for s in &slots {
                prop_assert_eq!(decode(&body, &mut at, &mut prev), Ok(*s));
            }
            prop_assert_eq!(at, body.len());
        }

        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (mut prev, mut at) = (Slot::EMPTY, 0);
            while at < body.len() && decode(&body, &mut at, &mut prev).is_ok() {}
            prop_assert!(at <= body.len() + 1);
        }
    }

    #[test]
    fn a_call_on_one_channel_takes_a_few_bytes() {
        let first = Slot {
            ticks: 1_000_000_000,
            src_node: 1,
            dst_node: 2,
            channel: 3,
            kind: 1,
            flags: 8,
            buffers: 2,
            size: 144,
            buffer_len: [16, 128, 40, 900],
            request_id: 77,
            ..Slot::EMPTY
        };
        let next = Slot { ticks: first.ticks + 1_100, buffer_len: [16, 128, 40, 950], request_id: 78, ..first };
        let (mut prev, mut body) = (first, Vec::new());
        encode(&mut prev, &next, &mut body);
        assert_eq!(body.len(), 1 + 2 + 2 + 1, "mask, ticks, response time, request id");
    }

    #[test]
    fn overlong_and_cut_varints_are_refused() {
        let (mut prev, mut at) = (Slot::EMPTY, 0);
        assert!(decode(&[0, 0x80, 0x80], &mut at, &mut prev).is_err(), "cut");
        let mut long = vec![0u8];
        long.extend([0xff; 10]);
        long.push(0);
        at = 0;
        assert!(decode(&long, &mut at, &mut prev).is_err(), "more than 64 bits");
        at = 0;
        assert!(decode(&[2, 0, 0x80, 0x80, 0x80, 0x80, 0x10], &mut at, &mut prev).is_err(), "channel over u32");
    }
}
