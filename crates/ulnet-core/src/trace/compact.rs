//! The compact record encoding of format versions 4 and 5 (see [`super::format`]): each
//! record is stored as what changed since the record before it in its block, so a stream of
//! calls on one channel costs a few bytes per record instead of 64.
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
//!    bit 6 request    varint of zigzag(d), d = request_id - previous request_id
//!                     (clear: d is the previous record's d, 0 before the block's first;
//!                     in version 4, clear: d = 0)
//!    bit 7 stages     varint stage_a, varint stage_b
//!  a group whose bit is clear has the previous record's values; the "previous record" of
//!  a block's first record is all zeros. Varints are LEB128 (7 bits a byte, low first).
//! ```
//!
//! Why version 5 repeats the request id's step: the message layer's ids are a slot's
//! generation above its index (`generation << 32 | slot`), so one call at a time steps by
//! 2^32, five bytes of every pair record in version 4, and nothing in version 5.
//!
//! The writer encodes off the traced threads' path; every block is decodable alone.

use super::slot::Slot;

/// What a record is encoded against: the block's previous record, and the step of its
/// request id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context {
    prev: Slot,
    request_step: u64,
    /// Version 5 and later: a clear request bit repeats the step (else it means step 0).
    repeats_steps: bool,
}

impl Context {
    /// The context of a block's first record, in a file of format `version`.
    pub(crate) fn new(version: u16) -> Self {
        Self { prev: Slot::EMPTY, request_step: 0, repeats_steps: version >= 5 }
    }
}

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

/// Appends `s` encoded against `ctx` to `out`, and makes it the context of the next record.
#[inline]
pub(crate) fn encode(ctx: &mut Context, s: &Slot, out: &mut Vec<u8>) {
    let prev = &ctx.prev;
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
    let step = s.request_id.wrapping_sub(prev.request_id);
    if step != ctx.request_step {
        mask |= REQUEST;
        put(&mut b, &mut at, zigzag(step));
    }
    if (s.stage_a, s.stage_b) != (prev.stage_a, prev.stage_b) {
        mask |= STAGES;
        put(&mut b, &mut at, u64::from(s.stage_a));
        put(&mut b, &mut at, u64::from(s.stage_b));
    }
    b[0] = mask;
    out.extend_from_slice(&b[..at]);
    ctx.prev = *s;
    if ctx.repeats_steps {
        ctx.request_step = step;
    }
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

/// Reads the record at `body[*at..]` encoded against `ctx`, and makes it the context of
/// the next record. The record is not checked beyond its encoding (see `Record::decode`).
pub(crate) fn decode(body: &[u8], at: &mut usize, ctx: &mut Context) -> Result<Slot, &'static str> {
    let Some(&mask) = body.get(*at) else { return Err("record runs past the end of its block") };
    *at += 1;
    let prev = &ctx.prev;
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
    let step = if mask & REQUEST != 0 { unzigzag(get(body, at)?) } else { ctx.request_step };
    s.request_id = prev.request_id.wrapping_add(step);
    if mask & STAGES != 0 {
        s.stage_a = get_u32(body, at)?;
        s.stage_b = get_u32(body, at)?;
    }
    ctx.prev = s;
    if ctx.repeats_steps {
        ctx.request_step = step;
    }
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
        fn any_slots_round_trip_within_the_bound(
            slots in proptest::collection::vec(any_slot(), 0..20),
            version in 4u16..=5,
            steps in proptest::collection::vec(0u8..4, 20),
        ) {
            // Some ids step as the message layer's do (by 2^32, by 1, or not at all).
            let mut slots = slots;
            for i in 1..slots.len() {
                let prev = slots[i - 1].request_id;
                match steps[i] {
                    0 => slots[i].request_id = prev.wrapping_add(1 << 32),
                    1 => slots[i].request_id = prev.wrapping_add(1),
                    2 => slots[i].request_id = prev,
                    _ => {}
                }
            }
            let mut ctx = Context::new(version);
            let mut body = Vec::new();
            for s in &slots {
                let before = body.len();
                encode(&mut ctx, s, &mut body);
                prop_assert!(body.len() - before <= RECORD_LEN_MAX);
            }
            let (mut ctx, mut at) = (Context::new(version), 0);
            for s in &slots {
                prop_assert_eq!(decode(&body, &mut at, &mut ctx), Ok(*s));
            }
            prop_assert_eq!(at, body.len());
        }

        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200), version in 4u16..=5) {
            let (mut ctx, mut at) = (Context::new(version), 0);
            while at < body.len() && decode(&body, &mut at, &mut ctx).is_ok() {}
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
        let (mut ctx, mut body) = (Context { prev: first, ..Context::new(5) }, Vec::new());
        encode(&mut ctx, &next, &mut body);
        assert_eq!(body.len(), 1 + 2 + 2 + 1, "mask, ticks, response time, request id");
    }

    #[test]
    fn calls_of_the_message_layer_repeat_their_step_for_nothing() {
        // One call at a time: the same slot, its generation one higher each call.
        let call = |generation: u64| Slot {
            ticks: 5_000,
            src_node: 1,
            dst_node: 2,
            kind: 1,
            flags: 8,
            size: 128,
            request_id: generation << 32 | 3,
            ..Slot::EMPTY
        };
        let sizes = |version: u16| {
            let mut ctx = Context::new(version);
            (0..4)
                .map(|g| {
                    let mut body = Vec::new();
                    encode(&mut ctx, &call(g + 1), &mut body);
                    body.len()
                })
                .collect::<Vec<_>>()
        };
        let (v4, v5) = (sizes(4), sizes(5));
        assert_eq!(v4[2..], [7, 7], "version 4: mask, ticks and a five-byte step every call");
        assert_eq!(v5[2..], [2, 2], "version 5: mask and ticks; the step repeats");
        assert_eq!(v5[1], 7, "the step is written once, when it changes");
    }

    #[test]
    fn overlong_and_cut_varints_are_refused() {
        let (mut ctx, mut at) = (Context::new(5), 0);
        assert!(decode(&[0, 0x80, 0x80], &mut at, &mut ctx).is_err(), "cut");
        let mut long = vec![0u8];
        long.extend([0xff; 10]);
        long.push(0);
        at = 0;
        assert!(decode(&long, &mut at, &mut ctx).is_err(), "more than 64 bits");
        at = 0;
        assert!(decode(&[2, 0, 0x80, 0x80, 0x80, 0x80, 0x10], &mut at, &mut ctx).is_err(), "channel over u32");
    }
}
