//! The RMA wire format: requests from an initiator to a target's engine and the target's
//! responses, as whole messages on any channel.
//!
//! ```text
//!  request header (32 bytes, little-endian)
//!  0        1        2                4                                8
//! +--------+--------+----------------+--------------------------------+
//! | kind   | flags  | reserved (0)   | segment u32                    |
//! +--------+--------+----------------+--------------------------------+
//! | generation u32                   | length u32                     |
//! +----------------------------------+--------------------------------+
//! | offset u64                                                        |
//! +-------------------------------------------------------------------+
//! | token u64 (echoed in the response)                                |
//! +-------------------------------------------------------------------+
//!  body: Hello       magic u64 "ULNETRMA" | version u32 | node u32
//!        Get         (none; length = bytes to read)
//!        Put         length bytes of data
//!        CompareSwap expected u64 | desired u64   (length = 8)
//!        FetchAdd    addend u64                   (length = 8)
//!        Lookup      length bytes of segment name
//!
//!  response header (32 bytes)
//! +--------+--------+--------+--------+--------------------------------+
//! | kind   | status | rights | notify | segment u32                    |
//! +--------+--------+--------+--------+--------------------------------+
//! | generation u32                   | length u32                     |
//! +----------------------------------+--------------------------------+
//! | value u64 (old word; segment size; target node)                   |
//! +-------------------------------------------------------------------+
//! | token u64                                                         |
//! +-------------------------------------------------------------------+
//!  body: GetData: length bytes
//! ```
//!
//! A request is exactly a header and its body: any other length, an unknown kind, a set
//! flag or reserved bit is malformed. Kinds and flags are wire format: never renumber,
//! only append.
//!
//! A request message carries one or more requests back to back (each finds its end from
//! its own header, [`request_len`]), so an initiator gathers the requests it posts to one
//! target into one datagram or write (doorbell batching). The target checks and answers
//! each on its own, in order; when the bytes stop framing requests, the rest of the
//! message is one malformed request. Responses go one per message.
//!
//! History: version 1 — one request per message. Version 2 — several requests per
//! message; HelloAck's value carries the version spoken on the channel (the lower of the
//! two ends') in its high 32 bits (0 there, from a version 1 target or to a version 1
//! initiator, means 1), and an initiator batches only when that is 2 or more.

use super::error::AccessError;
use super::rights::{Generation, NodeId, NotifyMode, Rights, SegmentId};

/// Bytes of a request or response header.
pub const HEADER_LEN: usize = 32;
/// "ULNETRMA": opens the Hello body.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMA");
/// The protocol version this code speaks (and the newest it accepts in a Hello).
pub const VERSION: u32 = 2;
/// Longest segment name.
pub const NAME_MAX: usize = 64;

/// Request flag: the importer asks for a notification (honoured by `Conditional` segments).
pub const FLAG_NOTIFY: u8 = 1;

const KIND_HELLO: u8 = 1;
const KIND_GET: u8 = 2;
const KIND_PUT: u8 = 3;
const KIND_COMPARE_SWAP: u8 = 4;
const KIND_FETCH_ADD: u8 = 5;
const KIND_LOOKUP: u8 = 6;

const KIND_HELLO_ACK: u8 = 0x81;
const KIND_GET_DATA: u8 = 0x82;
const KIND_PUT_DONE: u8 = 0x83;
const KIND_ATOMIC_RESULT: u8 = 0x84;
const KIND_LOOKUP_RESULT: u8 = 0x86;
const KIND_REFUSED: u8 = 0xff;

/// Where an access goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The segment.
    pub segment: SegmentId,
    /// The generation the importer holds.
    pub generation: Generation,
    /// Byte offset in the segment.
    pub offset: u64,
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// The importer introduces itself (first message on a channel).
    Hello {
        /// The importer's node.
        node: NodeId,
        /// Its protocol version.
        version: u32,
    },
    /// Read `len` bytes.
    Get {
        /// Where.
        place: Place,
        /// Bytes to read.
        len: u32,
    },
    /// Write `data`.
    Put {
        /// Where.
        place: Place,
        /// The bytes.
        data: &'a [u8],
    },
    /// Replace the word at `place` with `desired` if it equals `expected`.
    CompareSwap {
        /// Where.
        place: Place,
        /// The value compared.
        expected: u64,
        /// The value stored on a match.
        desired: u64,
    },
    /// Add `addend` to the word at `place` (wrapping).
    FetchAdd {
        /// Where.
        place: Place,
        /// The value added.
        addend: u64,
    },
    /// Ask for the segment exported under `name`.
    Lookup {
        /// The name.
        name: &'a [u8],
    },
}

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Echoed in the response so the initiator can match it.
    pub token: u64,
    /// The importer asked for a notification.
    pub notify: bool,
    /// The operation.
    pub op: Op<'a>,
}

/// Why a request or response was refused by the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than a header.
    #[error("message shorter than a header")]
    Short,
    /// The kind byte names nothing.
    #[error("unknown kind {0:#x}")]
    UnknownKind(u8),
    /// Reserved bits or fields are not zero.
    #[error("reserved bits set")]
    Reserved,
    /// The message length does not match what the header says.
    #[error("length does not match the header")]
    Length,
    /// A Hello without the magic.
    #[error("bad hello magic")]
    Magic,
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline(always)]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn header(
    kind: u8,
    flags: u8,
    aux: [u8; 2],
    segment: u32,
    generation: u32,
    length: u32,
    word: u64,
    token: u64,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = kind;
    h[1] = flags;
    h[2..4].copy_from_slice(&aux);
    h[4..8].copy_from_slice(&segment.to_le_bytes());
    h[8..12].copy_from_slice(&generation.to_le_bytes());
    h[12..16].copy_from_slice(&length.to_le_bytes());
    h[16..24].copy_from_slice(&word.to_le_bytes());
    h[24..32].copy_from_slice(&token.to_le_bytes());
    h
}

/// The token of a message whose header can be read, even if the rest is malformed, so the
/// target can refuse it to its sender by token.
pub fn peek_token(msg: &[u8]) -> Option<u64> {
    (msg.len() >= HEADER_LEN).then(|| u64_at(msg, 24))
}

/// Bytes of the request that opens `msg` (header and body), found from its header alone,
/// or `None` when no whole request can be framed there (too short, unknown kind, body
/// longer than what is left). Says nothing about the request's validity: that is
/// [`decode_request`]'s, on exactly these bytes.
pub fn request_len(msg: &[u8]) -> Option<usize> {
    if msg.len() < HEADER_LEN {
        return None;
    }
    let length = u32_at(msg, 12) as usize;
    let body = match msg[0] {
        KIND_HELLO | KIND_COMPARE_SWAP => 16,
        KIND_FETCH_ADD => 8,
        KIND_GET => 0,
        KIND_PUT | KIND_LOOKUP => length,
        _ => return None,
    };
    let total = HEADER_LEN.checked_add(body)?;
    (total <= msg.len()).then_some(total)
}

/// The requests of one message, in order: each item is the bytes of one request, for
/// [`decode_request`]. When the bytes stop framing requests, the last item is the whole
/// rest of the message (which then fails to decode). An empty message is one empty item.
pub fn split_requests(msg: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(msg);
    std::iter::from_fn(move || {
        let now = rest?;
        match request_len(now) {
            Some(n) if n < now.len() => {
                rest = Some(&now[n..]);
                Some(&now[..n])
            }
            _ => {
                rest = None;
                Some(now)
            }
        }
    })
}

impl Request<'_> {
    /// Encodes the header and the fixed part of the body into `out`; returns the slice to
    /// send before any variable part (a put's data or a lookup's name), which follows as a
    /// second gather buffer.
    pub fn encode_head<'b>(&self, out: &'b mut [u8; HEADER_LEN + 16]) -> &'b [u8] {
        let flags = if self.notify { FLAG_NOTIFY } else { 0 };
        let t = self.token;
        let (h, tail): ([u8; HEADER_LEN], Option<[u64; 2]>) = match self.op {
            Op::Hello { node, version } => {
                let h = header(KIND_HELLO, flags, [0; 2], 0, 0, 16, 0, t);
                let word1 = u64::from(version) | (u64::from(node.0) << 32);
                (h, Some([HELLO_MAGIC, word1]))
            }
            Op::Get { place, len } => {
                (header(KIND_GET, flags, [0; 2], place.segment.0, place.generation.0, len, place.offset, t), None)
            }
            Op::Put { place, data } => {
                let len = u32::try_from(data.len()).expect("puts are chunked below 4 GiB");
                (header(KIND_PUT, flags, [0; 2], place.segment.0, place.generation.0, len, place.offset, t), None)
            }
            Op::CompareSwap { place, expected, desired } => (
                header(KIND_COMPARE_SWAP, flags, [0; 2], place.segment.0, place.generation.0, 8, place.offset, t),
                Some([expected, desired]),
            ),
            Op::FetchAdd { place, addend } => (
                header(KIND_FETCH_ADD, flags, [0; 2], place.segment.0, place.generation.0, 8, place.offset, t),
                Some([addend, 0]),
            ),
            Op::Lookup { name } => {
                let len = u32::try_from(name.len()).expect("names are short");
                (header(KIND_LOOKUP, flags, [0; 2], 0, 0, len, 0, t), None)
            }
        };
        out[..HEADER_LEN].copy_from_slice(&h);
        let fixed = match (self.op, tail) {
            (Op::FetchAdd { .. }, Some([a, _])) => {
                out[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&a.to_le_bytes());
                8
            }
            (_, Some([a, b])) => {
                out[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&a.to_le_bytes());
                out[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&b.to_le_bytes());
                16
            }
            (_, None) => 0,
        };
        &out[..HEADER_LEN + fixed]
    }

    /// The variable part of the body (sent after [`Request::encode_head`]'s slice).
    pub fn body_tail(&self) -> &[u8] {
        match self.op {
            Op::Put { data, .. } => data,
            Op::Lookup { name } => name,
            _ => &[],
        }
    }
}

/// Decodes one whole request message. Never panics, whatever the bytes.
pub fn decode_request(msg: &[u8]) -> Result<Request<'_>, DecodeError> {
    if msg.len() < HEADER_LEN {
        return Err(DecodeError::Short);
    }
    let (kind, flags) = (msg[0], msg[1]);
    if flags & !FLAG_NOTIFY != 0 || msg[2] != 0 || msg[3] != 0 {
        return Err(DecodeError::Reserved);
    }
    let segment = SegmentId(u32_at(msg, 4));
    let generation = Generation(u32_at(msg, 8));
    let length = u32_at(msg, 12);
    let offset = u64_at(msg, 16);
    let token = u64_at(msg, 24);
    let body = &msg[HEADER_LEN..];
    let place = Place { segment, generation, offset };
    let body_len = |want: usize| if body.len() == want { Ok(()) } else { Err(DecodeError::Length) };
    let no_place =
        || if segment.0 == 0 && generation.0 == 0 && offset == 0 { Ok(()) } else { Err(DecodeError::Reserved) };
    let op = match kind {
        KIND_HELLO => {
            no_place()?;
            if length != 16 {
                return Err(DecodeError::Length);
            }
            body_len(16)?;
            if u64_at(body, 0) != HELLO_MAGIC {
                return Err(DecodeError::Magic);
            }
            Op::Hello { version: u32_at(body, 8), node: NodeId(u32_at(body, 12)) }
        }
        KIND_GET => {
            body_len(0)?;
            Op::Get { place, len: length }
        }
        KIND_PUT => {
            body_len(length as usize)?;
            Op::Put { place, data: body }
        }
        KIND_COMPARE_SWAP => {
            if length != 8 {
                return Err(DecodeError::Length);
            }
            body_len(16)?;
            Op::CompareSwap { place, expected: u64_at(body, 0), desired: u64_at(body, 8) }
        }
        KIND_FETCH_ADD => {
            if length != 8 {
                return Err(DecodeError::Length);
            }
            body_len(8)?;
            Op::FetchAdd { place, addend: u64_at(body, 0) }
        }
        KIND_LOOKUP => {
            no_place()?;
            if length == 0 || length as usize > NAME_MAX {
                return Err(DecodeError::Length);
            }
            body_len(length as usize)?;
            Op::Lookup { name: body }
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok(Request { token, notify: flags & FLAG_NOTIFY != 0, op })
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupAnswer {
    /// The segment.
    pub segment: SegmentId,
    /// Its current generation.
    pub generation: Generation,
    /// Its size in bytes.
    pub len: u64,
    /// The rights the asking importer holds.
    pub rights: Rights,
    /// The segment's notify mode.
    pub notify: NotifyMode,
}

/// A decoded response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// The target accepted the Hello.
    HelloAck {
        /// The target's node.
        node: NodeId,
        /// The protocol version spoken on this channel: the lower of the two (1 or more).
        version: u32,
    },
    /// Data of a get.
    GetData {
        /// The request's token.
        token: u64,
        /// The bytes read.
        data: &'a [u8],
    },
    /// A put was applied.
    PutDone {
        /// The request's token.
        token: u64,
    },
    /// An atomic was applied; the word held `old` before.
    AtomicResult {
        /// The request's token.
        token: u64,
        /// The previous value of the word.
        old: u64,
    },
    /// A lookup succeeded.
    LookupResult {
        /// The request's token.
        token: u64,
        /// What it found.
        answer: LookupAnswer,
    },
    /// The target refused the request; nothing changed.
    Refused {
        /// The request's token.
        token: u64,
        /// Why.
        error: AccessError,
    },
}

/// Encodes a response header. `GetData` is the header alone; its data follows as a second
/// gather buffer of `data_len` bytes.
pub fn encode_response(r: &Response<'_>) -> [u8; HEADER_LEN] {
    match *r {
        Response::HelloAck { node, version } => {
            let version = if version <= 1 { 0 } else { u64::from(version) << 32 };
            header(KIND_HELLO_ACK, 0, [0; 2], 0, 0, 0, version | u64::from(node.0), 0)
        }
        Response::GetData { token, data } => header(KIND_GET_DATA, 0, [0; 2], 0, 0, data.len() as u32, 0, token),
        Response::PutDone { token } => header(KIND_PUT_DONE, 0, [0; 2], 0, 0, 0, 0, token),
        Response::AtomicResult { token, old } => header(KIND_ATOMIC_RESULT, 0, [0; 2], 0, 0, 0, old, token),
        Response::LookupResult { token, answer } => header(
            KIND_LOOKUP_RESULT,
            0,
            [answer.rights.bits(), answer.notify as u8],
            answer.segment.0,
            answer.generation.0,
            0,
            answer.len,
            token,
        ),
        Response::Refused { token, error } => header(KIND_REFUSED, error.code(), [0; 2], 0, 0, 0, 0, token),
    }
}

/// Decodes one whole response message. Never panics, whatever the bytes.
pub fn decode_response(msg: &[u8]) -> Result<Response<'_>, DecodeError> {
    if msg.len() < HEADER_LEN {
        return Err(DecodeError::Short);
    }
    let kind = msg[0];
    let length = u32_at(msg, 12) as usize;
    let word = u64_at(msg, 16);
    let token = u64_at(msg, 24);
    let body = &msg[HEADER_LEN..];
    let plain = msg[1] == 0 && msg[2] == 0 && msg[3] == 0 && u32_at(msg, 4) == 0 && u32_at(msg, 8) == 0;
    let empty = body.is_empty() && length == 0;
    let r = match kind {
        // Version 1 is written as 0 (what version 1 targets send), so 1 there is not canonical.
        KIND_HELLO_ACK if plain && empty && token == 0 && word >> 32 != 1 => {
            Response::HelloAck { node: NodeId(word as u32), version: ((word >> 32) as u32).max(1) }
        }
        KIND_GET_DATA if plain && word == 0 => {
            if body.len() != length {
                return Err(DecodeError::Length);
            }
            Response::GetData { token, data: body }
        }
        KIND_PUT_DONE if plain && empty && word == 0 => Response::PutDone { token },
        KIND_ATOMIC_RESULT if plain && empty => Response::AtomicResult { token, old: word },
        KIND_LOOKUP_RESULT if msg[1] == 0 && empty => {
            let notify = NotifyMode::from_u8(msg[3]).ok_or(DecodeError::Reserved)?;
            if msg[2] & !Rights::ALL.bits() != 0 {
                return Err(DecodeError::Reserved);
            }
            let answer = LookupAnswer {
                segment: SegmentId(u32_at(msg, 4)),
                generation: Generation(u32_at(msg, 8)),
                len: word,
                rights: Rights::from_bits_truncate(msg[2]),
                notify,
            };
            Response::LookupResult { token, answer }
        }
        KIND_REFUSED
            if msg[2] == 0 && msg[3] == 0 && u32_at(msg, 4) == 0 && u32_at(msg, 8) == 0 && word == 0 && empty =>
        {
            Response::Refused { token, error: AccessError::from_code(msg[1]).ok_or(DecodeError::Reserved)? }
        }
        KIND_HELLO_ACK | KIND_GET_DATA | KIND_PUT_DONE | KIND_ATOMIC_RESULT | KIND_LOOKUP_RESULT | KIND_REFUSED => {
            return Err(if body.len() != length { DecodeError::Length } else { DecodeError::Reserved })
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn place() -> impl Strategy<Value = Place> {
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(s, g, o)| Place {
            segment: SegmentId(s),
            generation: Generation(g),
            offset: o,
        })
    }

    fn encode(r: &Request<'_>) -> Vec<u8> {
        let mut head = [0u8; HEADER_LEN + 16];
        let mut v = r.encode_head(&mut head).to_vec();
        v.extend_from_slice(r.body_tail());
        v
    }

    proptest! {
        #[test]
        fn requests_round_trip(
            token: u64, notify: bool, place in place(), len: u32, a: u64, b: u64, node: u32, version: u32,
            data in proptest::collection::vec(any::<u8>(), 0..300),
            name in proptest::collection::vec(any::<u8>(), 1..=NAME_MAX),
            which in 0..6u8,
        ) {
            let op = match which {
                0 => Op::Hello { node: NodeId(node), version },
                1 => Op::Get { place, len },
                2 => Op::Put { place, data: &data },
                3 => Op::CompareSwap { place, expected: a, desired: b },
                4 => Op::FetchAdd { place, addend: a },
                _ => Op::Lookup { name: &name },
            };
            let r = Request { token, notify, op };
            let bytes = encode(&r);
            prop_assert_eq!(decode_request(&bytes), Ok(r));
        }

        #[test]
        fn responses_round_trip(token: u64, old: u64, node: u32, version: u32, seg: u32, gen: u32, len: u64, rights in 0u8..8,
                                data in proptest::collection::vec(any::<u8>(), 0..300), which in 0..6u8, code in 1u8..=11) {
            let answer = LookupAnswer { segment: SegmentId(seg), generation: Generation(gen), len,
                rights: Rights::from_bits_truncate(rights), notify: NotifyMode::Conditional };
            let r = match which {
                0 => Response::HelloAck { node: NodeId(node), version: version.max(1) },
                1 => Response::GetData { token, data: &data },
                2 => Response::PutDone { token },
                3 => Response::AtomicResult { token, old },
                4 => Response::LookupResult { token, answer },
                _ => Response::Refused { token, error: AccessError::from_code(code).unwrap() },
            };
            let mut bytes = encode_response(&r).to_vec();
            if let Response::GetData { data, .. } = r {
                bytes.extend_from_slice(data);
            }
            prop_assert_eq!(decode_response(&bytes), Ok(r));
        }

        /// Random bytes never crash either decoder, and whatever decodes re-encodes to the
        /// same bytes (nothing is accepted that the encoder would not produce).
        #[test]
        fn random_bytes_never_crash_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok(r) = decode_request(&bytes) {
                prop_assert_eq!(encode(&r), bytes.clone());
            }
            if let Ok(r) = decode_response(&bytes) {
                let mut again = encode_response(&r).to_vec();
                if let Response::GetData { data, .. } = r {
                    again.extend_from_slice(data);
                }
                prop_assert_eq!(again, bytes);
            }
        }

        /// A valid request with one byte flipped either decodes to something the encoder
        /// produces or is refused: corruption never yields an unrepresentable request.
        #[test]
        fn corrupted_requests_are_refused_or_canonical(place in place(), data in proptest::collection::vec(any::<u8>(), 0..64),
                                                       at in 0usize..96, bit in 0u8..8) {
            let mut bytes = encode(&Request { token: 7, notify: false, op: Op::Put { place, data: &data } });
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
            if let Ok(r) = decode_request(&bytes) {
                prop_assert_eq!(encode(&r), bytes);
            }
        }
    }

    /// A request of each kind, drawn from `which`.
    fn any_request(which: u8, token: u64, notify: bool, place: Place, a: u64, b: u64, bytes: &[u8]) -> Request<'_> {
        let op = match which % 6 {
            0 => Op::Hello { node: NodeId(a as u32), version: b as u32 },
            1 => Op::Get { place, len: a as u32 },
            2 => Op::Put { place, data: bytes },
            3 => Op::CompareSwap { place, expected: a, desired: b },
            4 => Op::FetchAdd { place, addend: a },
            _ => Op::Lookup { name: &bytes[..bytes.len().clamp(1, NAME_MAX)] },
        };
        Request { token, notify, op }
    }

    proptest! {
        /// Requests sent back to back in one message come apart into exactly those
        /// requests, in order.
        #[test]
        fn multi_request_messages_round_trip(
            reqs in proptest::collection::vec((0u8..6, any::<u64>(), any::<bool>(), place(), any::<u64>(), any::<u64>(),
                                               proptest::collection::vec(any::<u8>(), 1..80)), 1..20),
        ) {
            let reqs: Vec<Request<'_>> = reqs.iter().map(|(w, t, n, p, a, b, d)| any_request(*w, *t, *n, *p, *a, *b, d)).collect();
            let msg: Vec<u8> = reqs.iter().flat_map(encode).collect();
            let parts: Vec<&[u8]> = split_requests(&msg).collect();
            prop_assert_eq!(parts.len(), reqs.len());
            for (part, r) in parts.iter().zip(&reqs) {
                prop_assert_eq!(decode_request(part), Ok(*r));
            }
        }

        /// Random bytes, alone or after valid requests, never crash the splitter: its
        /// pieces tile the message exactly, every piece but the last is one whole framed
        /// request, and whatever decodes re-encodes to its bytes.
        #[test]
        fn random_multi_request_bytes_split_safely(
            prefix in proptest::collection::vec((0u8..6, place(), any::<u64>(), proptest::collection::vec(any::<u8>(), 1..40)), 0..6),
            noise in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut msg: Vec<u8> =
                prefix.iter().flat_map(|(w, p, a, d)| encode(&any_request(*w, 1, false, *p, *a, *a, d))).collect();
            msg.extend_from_slice(&noise);
            let parts: Vec<&[u8]> = split_requests(&msg).collect();
            prop_assert!(!parts.is_empty());
            prop_assert_eq!(parts.concat(), msg.clone());
            prop_assert!(parts.len() >= prefix.len() + usize::from(!noise.is_empty()));
            for (i, part) in parts.iter().enumerate() {
                if i + 1 < parts.len() {
                    prop_assert_eq!(request_len(part), Some(part.len()));
                }
                if let Ok(r) = decode_request(part) {
                    prop_assert_eq!(encode(&r), part.to_vec());
                }
            }
            // The valid prefix always comes out whole, request by request.
            for (i, (w, p, a, d)) in prefix.iter().enumerate() {
                prop_assert_eq!(decode_request(parts[i]), Ok(any_request(*w, 1, false, *p, *a, *a, d)));
            }
        }
    }

    #[test]
    fn malformed_requests_are_refused() {
        let place = Place { segment: SegmentId(1), generation: Generation(1), offset: 8 };
        let good = encode(&Request { token: 1, notify: true, op: Op::FetchAdd { place, addend: 1 } });
        assert!(decode_request(&good).is_ok());
        assert_eq!(decode_request(&good[..31]), Err(DecodeError::Short));
        assert_eq!(decode_request(&good[..39]), Err(DecodeError::Length));
        let mut flags = good.clone();
        flags[1] = 2;
        assert_eq!(decode_request(&flags), Err(DecodeError::Reserved));
        let mut kind = good.clone();
        kind[0] = 99;
        assert_eq!(decode_request(&kind), Err(DecodeError::UnknownKind(99)));
        let mut len = good.clone();
        len[12] = 16;
        assert_eq!(decode_request(&len), Err(DecodeError::Length));
        let mut hello = encode(&Request { token: 0, notify: false, op: Op::Hello { node: NodeId(3), version: 1 } });
        hello[32] ^= 1;
        assert_eq!(decode_request(&hello), Err(DecodeError::Magic));
        let long_name = [b'x'; NAME_MAX + 1];
        let lookup = encode(&Request { token: 0, notify: false, op: Op::Lookup { name: &long_name } });
        assert_eq!(decode_request(&lookup), Err(DecodeError::Length));
        assert_eq!(peek_token(&good), Some(1));
        assert_eq!(peek_token(&good[..8]), None);
    }
}
