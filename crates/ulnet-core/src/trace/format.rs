//! The trace file format: a header, then checksummed blocks of records.
//!
//! All integers are little-endian. A file is written by one process.
//!
//! ```text
//!  file header (72 bytes)
//!  0  magic "ULTRACE\0"                8  version u16 (5)     10 header_len u16 (72)
//!  12 record_len u16 (0: compact records of varying length; 64 in versions 2 and 3)
//!  14 block_header_len u16 (48)
//!  16 node_id u32                      20 pid u32
//!  24 boot_id u64      (hash of the kernel boot id: equal boot ids share one monotonic clock)
//!  32 ref_ticks u64    (clock reference: a tick reading ...
//!  40 ref_mono_ns u64   ... taken with CLOCK_MONOTONIC ...
//!  48 ref_real_ns u64   ... and CLOCK_REALTIME at the same instant)
//!  56 ticks_per_sec u64 (estimate at start; blocks refine it)
//!  64 crc32c u32 of bytes 0..64        68 reserved u32 (0)
//!
//!  block (48-byte header, then record_count records in body_len bytes)
//!  0  magic "ULTB"    4 flags u16 (1: end block)    6 reserved u16 (0)
//!  8  record_count u32                12 sequence u32 (0, 1, 2, ... per file)
//!  16 dropped_total u64 (records lost to full rings so far, all threads)
//!  24 ref_ticks u64   32 ref_mono_ns u64   (another clock reference, taken at write time)
//!  40 crc32c u32 of header bytes 0..40 and the body
//!  44 body_len u32 (bytes of the records; versions 2 and 3: reserved, 0, the body being
//!     record_count × 64 bytes)
//!
//!  record, as the recorder keeps it in memory (64 bytes; in the file of versions 2 and 3
//!  as it is, from version 4 on compact: see below)
//!  0  ticks u64 (event time)   8 src_node u32   12 dst_node u32   16 channel u32
//!  20 kind u8   21 flags u8   22 buffers u8 (0: not known; 1-4)   23 reserved u8 (0)
//!  24 size u64  32 buffer_len [u32; 4] (the first `buffers`; the rest 0)
//!  48 request_id u64 (0: none)
//!  56 stage_a u32   60 stage_b u32
//!     flags: 1 receive (else send), 2 exact (ticks read from the clock for this record,
//!            else the recorder's newest reading), 4 run, 8 pair; other bits 0
//!     send:    stage_a = ticks from enqueued to sent, + 1 (0: not measured)
//!     receive: stage_a, stage_b = ticks from received to handler start, end, + 1
//!     run:     `stage_a` identical messages (at least 2, no request id, no stages), the
//!              first at `ticks`, the last `stage_b` ticks later
//!     pair:    a request (kind 1, request id not 0) and its response, as one side saw
//!              them: flag 1 clear at the caller (request sent, response received), set
//!              at the server (request received, response sent). `ticks`, nodes and
//!              `size` are the request's; `buffers` (at most 2) and buffer_len[0..2] list
//!              the message this side sent; buffer_len[2] = the response's size,
//!              buffer_len[3] = ticks from `ticks` to the response, + 1; stage_a, stage_b
//!              = ticks from `ticks` to the start and end of the handler this side ran on
//!              the message it received, + 1 (0: not measured). Decoded as the two
//!              records the two messages would have had.
//!
//!  compact record (versions 4 and 5): the fields above that differ from the block's
//!  previous record (all zeros before its first)
//!    mask u8, then ticks, then each group whose mask bit is set, in bit order
//!    ticks            varint of zigzag(ticks - previous ticks)        (always)
//!    bit 0 nodes      varint src_node, varint dst_node
//!    bit 1 channel    varint channel
//!    bit 2 shape      kind u8, flags u8, buffers u8, reserved u8
//!    bit 3 size       varint size
//!    bit 4 buffers    varint buffer_len[0], [1], [2]
//!    bit 5 last       varint buffer_len[3]
//!    bit 6 request    varint of zigzag(d), d = request_id - previous request_id; clear:
//!                     d is the previous record's d (0 before the block's first record)
//!                     in version 5, d = 0 in version 4
//!    bit 7 stages     varint stage_a, varint stage_b
//!    varints are LEB128 (7 bits a byte, low bits first, at most 10 bytes); zigzag(d) =
//!    (d << 1) ^ (d >> 63) of the 64-bit wrapping difference as a signed number.
//!    A call on one channel (pair records) takes 2–3 bytes instead of 64 (7 in version 4,
//!    where the message layer's request ids, stepping by 2^32, took five).
//! ```
//!
//! Ticks become nanoseconds of CLOCK_MONOTONIC by interpolating between the clock
//! references (the header's and every block's), so a file needs no separate calibration.
//! The last block of a complete file is an end block; a file without one was cut short.
//!
//! Versions (append-only; discriminants are format): 1 — 96-byte records with absolute
//! stage times (no longer read); 2 — 64-byte records without pair records (still read);
//! 3 — 64-byte records (still read); 4 — compact records whose clear request bit means the
//! same request id (still read); 5 — compact records (this layout).

use super::compact;
use super::slot::{Slot, FLAGS_KNOWN, FLAGS_KNOWN_V2, FLAG_PAIR, FLAG_RECEIVE, FLAG_RUN, PAIR_BUFFERS_MAX};
use std::fmt;

/// The first bytes of every trace file.
pub const FILE_MAGIC: [u8; 8] = *b"ULTRACE\0";
/// The first bytes of every block.
pub const BLOCK_MAGIC: [u8; 4] = *b"ULTB";
/// Format version written.
pub const VERSION: u16 = 5;
/// The last version with fixed-size records ([`RECORD_LEN`] bytes each, no body length).
pub const VERSION_FIXED_MAX: u16 = 3;
/// The oldest format version read (version 2 lacks pair records only).
pub const VERSION_MIN: u16 = 2;
/// Bytes of the file header.
pub const FILE_HEADER_LEN: usize = 72;
/// Bytes of a block header.
pub const BLOCK_HEADER_LEN: usize = 48;
/// Bytes of a record in memory, and in the file of versions 2 and 3.
pub const RECORD_LEN: usize = 64;
/// Most bytes of a compact (version 4 or 5) record.
pub const COMPACT_RECORD_LEN_MAX: usize = compact::RECORD_LEN_MAX;
/// Most records in one block: 4,096 records are at most 256 KiB in memory (a few tens of
/// KiB compact), written in one go.
pub const BLOCK_RECORDS_MAX: usize = 4096;
/// Block flag: the last block of a complete file.
pub const BLOCK_FLAG_END: u16 = 1;
/// Most buffers a record describes (the gather limit of the core).
pub const RECORD_BUFFERS_MAX: usize = crate::GATHER_MAX;

const _: () = assert!(RECORD_BUFFERS_MAX == 4, "the record layout has four buffer lengths");

/// What a traced message was. Discriminants are part of the file format: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MessageKind {
    /// A message the message layer did not describe (sent with [`crate::Endpoint::send`]).
    Message = 0,
    /// A request that expects a response.
    Request = 1,
    /// A response to a request (success or error).
    Response = 2,
    /// A call that expects no response.
    OneWay = 3,
    /// Message-layer control (a cancellation).
    Control = 4,
    /// A one-sided read of remote memory.
    RmaRead = 5,
    /// A one-sided write of remote memory.
    RmaWrite = 6,
    /// A remote compare-and-swap.
    RmaCas = 7,
    /// A remote fetch-and-add.
    RmaFaa = 8,
}

impl MessageKind {
    /// Every kind, in discriminant order.
    pub const ALL: [MessageKind; 9] = [
        MessageKind::Message,
        MessageKind::Request,
        MessageKind::Response,
        MessageKind::OneWay,
        MessageKind::Control,
        MessageKind::RmaRead,
        MessageKind::RmaWrite,
        MessageKind::RmaCas,
        MessageKind::RmaFaa,
    ];

    /// The kind with this discriminant.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// A short lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Message => "message",
            MessageKind::Request => "request",
            MessageKind::Response => "response",
            MessageKind::OneWay => "one-way",
            MessageKind::Control => "control",
            MessageKind::RmaRead => "rma-read",
            MessageKind::RmaWrite => "rma-write",
            MessageKind::RmaCas => "rma-cas",
            MessageKind::RmaFaa => "rma-faa",
        }
    }
}

/// Which side recorded a message. Discriminants are part of the file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    /// The sender recorded it when it went out.
    Send = 0,
    /// The receiver recorded it when it arrived (whole).
    Receive = 1,
}

/// One traced message (or run of identical messages), as one side saw it. Times are in
/// ticks of the file's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// When it happened (sent, or received); for a run, when its first message did.
    pub ticks: u64,
    /// The sending node.
    pub src_node: u32,
    /// The receiving node.
    pub dst_node: u32,
    /// The channel at the recording side.
    pub channel: u32,
    /// [`MessageKind`] discriminant.
    pub kind: u8,
    /// [`Direction`] discriminant.
    pub direction: u8,
    /// `ticks` was read from the clock for this record; otherwise it is the recorder's
    /// newest clock reading, at most a ticker period old (see [`crate::trace`]).
    pub exact: bool,
    /// Buffers in the gather list (0: not known, as at a receiver).
    pub buffers: u8,
    /// Bytes of each message.
    pub size: u64,
    /// Bytes of each of the first four buffers.
    pub buffer_len: [u32; RECORD_BUFFERS_MAX],
    /// Pairs a response with its request (0: none).
    pub request_id: u64,
    /// Messages the record stands for: 1, or the length of a run of identical messages.
    pub count: u32,
    /// When the last message of a run happened (`ticks` for a single message).
    pub last_ticks: u64,
    /// When the send was asked for.
    pub enqueued: u64,
    /// When the transport took it.
    pub sent: u64,
    /// When the receiver found it.
    pub received: u64,
    /// When the handler that consumed it started.
    pub handler_start: u64,
    /// When that handler returned.
    pub handler_end: u64,
}

/// Why a trace file or part of it cannot be read. Every variant names the byte offset.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The file ends inside a header or block.
    #[error("trace file truncated at byte offset {offset}: {what}")]
    Truncated {
        /// Where the incomplete part starts.
        offset: u64,
        /// What was being read.
        what: &'static str,
    },
    /// Bytes that are not what the format says belongs there.
    #[error("trace file corrupt at byte offset {offset}: {what}")]
    Corrupt {
        /// Where the bad part starts.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A file of a format version this build does not read.
    #[error("trace file version {0} is not supported (this build reads versions {VERSION_MIN} to {VERSION})")]
    Version(u16),
}

/// The file header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// The format version ([`VERSION`] when written by this build).
    pub version: u16,
    /// The node that wrote the file.
    pub node_id: u32,
    /// Its process id.
    pub pid: u32,
    /// Hash of the kernel boot id: files with equal values share one monotonic clock.
    pub boot_id: u64,
    /// The clock reference: ticks ...
    pub ref_ticks: u64,
    /// ... CLOCK_MONOTONIC ...
    pub ref_mono_ns: u64,
    /// ... and CLOCK_REALTIME at one instant.
    pub ref_real_ns: u64,
    /// Tick rate estimated at start.
    pub ticks_per_sec: u64,
}

/// A block header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// `BLOCK_FLAG_*`.
    pub flags: u16,
    /// Records that follow.
    pub record_count: u32,
    /// Position of the block in the file.
    pub sequence: u32,
    /// Records dropped so far because a ring was full.
    pub dropped_total: u64,
    /// A clock reference taken when the block was written: ticks ...
    pub ref_ticks: u64,
    /// ... and CLOCK_MONOTONIC.
    pub ref_mono_ns: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The header's `record_len` of a file of `version`: 0 for compact records.
fn record_len(version: u16) -> u16 {
    if version > VERSION_FIXED_MAX {
        0
    } else {
        RECORD_LEN as u16
    }
}

impl FileHeader {
    /// Encodes the header with its checksum.
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut b = [0u8; FILE_HEADER_LEN];
        b[0..8].copy_from_slice(&FILE_MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&(FILE_HEADER_LEN as u16).to_le_bytes());
        b[12..14].copy_from_slice(&record_len(self.version).to_le_bytes());
        b[14..16].copy_from_slice(&(BLOCK_HEADER_LEN as u16).to_le_bytes());
        b[16..20].copy_from_slice(&self.node_id.to_le_bytes());
        b[20..24].copy_from_slice(&self.pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.boot_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.ref_ticks.to_le_bytes());
        b[40..48].copy_from_slice(&self.ref_mono_ns.to_le_bytes());
        b[48..56].copy_from_slice(&self.ref_real_ns.to_le_bytes());
        b[56..64].copy_from_slice(&self.ticks_per_sec.to_le_bytes());
        let crc = crc32c::crc32c(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < 8 || bytes[..8] != FILE_MAGIC {
            if bytes.len() < 8 && FILE_MAGIC.starts_with(bytes) {
                return Err(DecodeError::Truncated { offset: 0, what: "file header" });
            }
            return Err(DecodeError::Corrupt { offset: 0, what: "not a ulnet trace file (bad magic)".into() });
        }
        if bytes.len() < 10 {
            return Err(DecodeError::Truncated { offset: 0, what: "file header" });
        }
        let version = u16_at(bytes, 8);
        if !(VERSION_MIN..=VERSION).contains(&version) {
            return Err(DecodeError::Version(version));
        }
        if bytes.len() < FILE_HEADER_LEN {
            return Err(DecodeError::Truncated { offset: 0, what: "file header" });
        }
        let b = &bytes[..FILE_HEADER_LEN];
        if crc32c::crc32c(&b[..64]) != u32_at(b, 64) {
            return Err(DecodeError::Corrupt { offset: 0, what: "file header checksum mismatch".into() });
        }
        let lens = (u16_at(b, 10) as usize, u16_at(b, 12), u16_at(b, 14) as usize);
        if lens != (FILE_HEADER_LEN, record_len(version), BLOCK_HEADER_LEN) || u32_at(b, 68) != 0 {
            return Err(DecodeError::Corrupt { offset: 0, what: format!("unexpected header layout {lens:?}") });
        }
        Ok(FileHeader {
            version,
            node_id: u32_at(b, 16),
            pid: u32_at(b, 20),
            boot_id: u64_at(b, 24),
            ref_ticks: u64_at(b, 32),
            ref_mono_ns: u64_at(b, 40),
            ref_real_ns: u64_at(b, 48),
            ticks_per_sec: u64_at(b, 56),
        })
    }
}

impl Record {
    /// Decodes a record found at byte `offset` of a file of format `version`, refusing
    /// unknown kinds and flags, set reserved bits, inconsistent buffer lists and malformed
    /// runs and pairs. A pair record decodes to two records: the request and its response.
    pub fn decode(b: &[u8], offset: u64, version: u16) -> Result<(Self, Option<Self>), DecodeError> {
        assert_eq!(b.len(), RECORD_LEN, "a record is {RECORD_LEN} bytes");
        let slot = Slot::from_bytes(b);
        check_slot(&slot, offset, version)?;
        Ok(slot.to_records())
    }

    /// The message kind.
    pub fn message_kind(&self) -> MessageKind {
        MessageKind::from_u8(self.kind).unwrap_or(MessageKind::Message)
    }

    /// Which side recorded it.
    pub fn direction(&self) -> Direction {
        if self.direction == Direction::Receive as u8 {
            Direction::Receive
        } else {
            Direction::Send
        }
    }
}

/// Refuses a record (found at byte `offset` of a file of format `version`) with an unknown
/// kind or flags, set reserved bits, an inconsistent buffer list, or a malformed run or pair.
fn check_slot(slot: &Slot, offset: u64, version: u16) -> Result<(), DecodeError> {
    let corrupt = |what: String| DecodeError::Corrupt { offset, what };
    if MessageKind::from_u8(slot.kind).is_none() {
        return Err(corrupt(format!("record has unknown kind {}", slot.kind)));
    }
    let known = if version >= 3 { FLAGS_KNOWN } else { FLAGS_KNOWN_V2 };
    if slot.flags & !known != 0 || slot.reserved != 0 {
        return Err(corrupt("record has reserved bits set".into()));
    }
    let buffers = slot.buffers as usize;
    let pair = slot.flags & FLAG_PAIR != 0;
    // A pair lists at most two buffers; the other two words are its response.
    let listable = if pair { PAIR_BUFFERS_MAX } else { RECORD_BUFFERS_MAX };
    if buffers > listable {
        return Err(corrupt(format!("record lists {buffers} buffers")));
    }
    if slot.buffer_len[buffers..listable].iter().any(|&l| l != 0) {
        return Err(corrupt(format!("record of {buffers} buffers has lengths beyond them")));
    }
    let listed: u64 = slot.buffer_len[..listable].iter().map(|&l| u64::from(l)).sum();
    // The message the buffers describe: the one this side sent.
    let sent_size = if pair && slot.flags & FLAG_RECEIVE != 0 { u64::from(slot.buffer_len[2]) } else { slot.size };
    if buffers > 0 && listed != sent_size {
        return Err(corrupt(format!("record of {sent_size} bytes lists buffers of {listed} bytes")));
    }
    if slot.flags & FLAG_RUN != 0 && (slot.stage_a < 2 || slot.request_id != 0 || pair) {
        return Err(corrupt("run record without a count of 2 or more, or with a request id".into()));
    }
    if pair && (slot.kind != MessageKind::Request as u8 || slot.request_id == 0 || slot.buffer_len[3] == 0) {
        return Err(corrupt("pair record that is not a request with an id and a response time".into()));
    }
    Ok(())
}

impl BlockHeader {
    /// Encodes the header; `crc` is computed by [`encode_block`].
    fn encode_without_crc(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[0..4].copy_from_slice(&BLOCK_MAGIC);
        b[4..6].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.record_count.to_le_bytes());
        b[12..16].copy_from_slice(&self.sequence.to_le_bytes());
        b[16..24].copy_from_slice(&self.dropped_total.to_le_bytes());
        b[24..32].copy_from_slice(&self.ref_ticks.to_le_bytes());
        b[32..40].copy_from_slice(&self.ref_mono_ns.to_le_bytes());
        b
    }
}

/// Appends a block of `header.record_count` compact records (format version 4 or 5,
/// encoded one after the other, the first against an all-zero record) to `out`.
pub fn encode_compact_block(header: &BlockHeader, body: &[u8], out: &mut Vec<u8>) {
    assert!(header.record_count as usize <= BLOCK_RECORDS_MAX, "a block holds at most {BLOCK_RECORDS_MAX} records");
    assert!(body.len() <= BLOCK_RECORDS_MAX * COMPACT_RECORD_LEN_MAX, "the body is compact records");
    let start = out.len();
    out.extend_from_slice(&header.encode_without_crc());
    out[start + 44..start + 48].copy_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 40]), body);
    out[start + 40..start + 44].copy_from_slice(&crc.to_le_bytes());
}

/// Appends `slots`, compact (format `version`, 4 or 5), to `body`: the body of one block.
#[cfg(test)]
pub(crate) fn encode_compact_records<'a>(version: u16, slots: impl IntoIterator<Item = &'a Slot>, body: &mut Vec<u8>) {
    let mut ctx = compact::Context::new(version);
    for s in slots {
        compact::encode(&mut ctx, s, body);
    }
}

/// Appends a block of `records` (format versions 2 and 3: at most [`BLOCK_RECORDS_MAX`],
/// each [`RECORD_LEN`] bytes, concatenated) to `out`.
pub fn encode_block(header: &BlockHeader, records: &[u8], out: &mut Vec<u8>) {
    let count = records.len() / RECORD_LEN;
    assert_eq!(records.len() % RECORD_LEN, 0, "whole records");
    assert!(count <= BLOCK_RECORDS_MAX, "a block holds at most {BLOCK_RECORDS_MAX} records");
    assert_eq!(header.record_count as usize, count, "the header counts the records");
    let start = out.len();
    out.extend_from_slice(&header.encode_without_crc());
    out.extend_from_slice(records);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 40]), &out[start + BLOCK_HEADER_LEN..]);
    out[start + 40..start + 44].copy_from_slice(&crc.to_le_bytes());
}

/// A whole trace file, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    /// Its header.
    pub header: FileHeader,
    /// Its blocks' headers, in file order.
    pub blocks: Vec<BlockHeader>,
    /// Every record, in file order.
    pub records: Vec<Record>,
}

impl TraceFile {
    /// Records dropped because a ring was full (from the last block).
    pub fn dropped(&self) -> u64 {
        self.blocks.last().map_or(0, |b| b.dropped_total)
    }

    /// Messages the records stand for (a run counts each of its messages).
    pub fn messages(&self) -> u64 {
        self.records.iter().map(|r| u64::from(r.count)).sum()
    }

    /// Converts ticks to CLOCK_MONOTONIC nanoseconds by interpolating between the clock
    /// references of the header and the blocks.
    pub fn clock(&self) -> TickClock {
        let mut points: Vec<(u64, u64)> = std::iter::once((self.header.ref_ticks, self.header.ref_mono_ns))
            .chain(self.blocks.iter().map(|b| (b.ref_ticks, b.ref_mono_ns)))
            .collect();
        points.sort_unstable();
        points.dedup_by_key(|p| p.0);
        // References must rise together; one that does not (a clock step) is dropped.
        let mut monotone: Vec<(u64, u64)> = Vec::with_capacity(points.len());
        for p in points {
            if monotone.last().is_none_or(|l| p.1 > l.1) {
                monotone.push(p);
            }
        }
        let (first, last) = (monotone[0], monotone[monotone.len() - 1]);
        let span_ns = last.1.saturating_sub(first.1);
        let rate = if span_ns >= 50_000_000 {
            (last.0 - first.0) as f64 / span_ns as f64
        } else {
            self.header.ticks_per_sec.max(1) as f64 / 1e9
        };
        TickClock { points: monotone, ticks_per_ns: rate }
    }
}

/// Tick-to-nanosecond conversion of one file; see [`TraceFile::clock`].
#[derive(Clone, Debug)]
pub struct TickClock {
    points: Vec<(u64, u64)>,
    ticks_per_ns: f64,
}

impl TickClock {
    /// CLOCK_MONOTONIC nanoseconds at `ticks` (0 stays 0: "not measured").
    pub fn mono_ns(&self, ticks: u64) -> u64 {
        if ticks == 0 {
            return 0;
        }
        let i = self.points.partition_point(|p| p.0 <= ticks);
        let (base, next) = match i {
            0 => (self.points[0], None),
            i if i == self.points.len() => (self.points[i - 1], None),
            i => (self.points[i - 1], Some(self.points[i])),
        };
        let ns = match next {
            Some(n) if n.0 > base.0 => {
                let f = (ticks - base.0) as f64 / (n.0 - base.0) as f64;
                base.1 as f64 + f * (n.1 - base.1) as f64
            }
            _ => base.1 as f64 + (ticks as f64 - base.0 as f64) / self.ticks_per_ns,
        };
        ns.max(1.0) as u64
    }
}

/// Decodes a whole file. Strict: any truncation or corruption is an error naming its
/// offset, including a file that stops at a block boundary without its end block.
pub fn decode_file(bytes: &[u8]) -> Result<TraceFile, DecodeError> {
    let (file, rest) = decode_prefix(bytes);
    match rest {
        Some(e) => Err(e),
        None => Ok(file.expect("a file without an error has a header")),
    }
}

/// Decodes as much of a file as is intact: the header and the blocks before the first bad
/// one, and the error that stopped it (`None` when the whole file is intact). `None` for
/// the file when even its header is unreadable.
pub fn decode_prefix(bytes: &[u8]) -> (Option<TraceFile>, Option<DecodeError>) {
    let header = match FileHeader::decode(bytes) {
        Ok(h) => h,
        Err(e) => return (None, Some(e)),
    };
    let mut file = TraceFile { header, blocks: Vec::new(), records: Vec::new() };
    let mut at = FILE_HEADER_LEN;
    loop {
        if at == bytes.len() {
            return (
                Some(file),
                Some(DecodeError::Truncated {
                    offset: at as u64,
                    what: "end block missing (the writer did not finish)",
                }),
            );
        }
        match decode_block(bytes, at, file.blocks.len() as u32, header.version) {
            Ok((block, slots, next)) => {
                let end = block.flags & BLOCK_FLAG_END != 0;
                file.blocks.push(block);
                for slot in slots {
                    let (record, second) = slot.to_records();
                    file.records.push(record);
                    file.records.extend(second);
                }
                at = next;
                if end {
                    if at != bytes.len() {
                        return (
                            Some(file),
                            Some(DecodeError::Corrupt { offset: at as u64, what: "bytes after the end block".into() }),
                        );
                    }
                    return (Some(file), None);
                }
            }
            Err(e) => return (Some(file), Some(e)),
        }
    }
}

/// The records of a whole file as they were stored (a pair is one), for tests that count
/// what the writer stored.
#[cfg(test)]
pub(crate) fn decode_slots(bytes: &[u8]) -> Result<Vec<Slot>, DecodeError> {
    let header = FileHeader::decode(bytes)?;
    let (mut slots, mut at, mut sequence) = (Vec::new(), FILE_HEADER_LEN, 0);
    while at < bytes.len() {
        let (_, block, next) = decode_block(bytes, at, sequence, header.version)?;
        slots.extend(block);
        (at, sequence) = (next, sequence + 1);
    }
    Ok(slots)
}

/// Decodes the block at `at`, which must be block number `sequence`: its header, its
/// records as stored (checked), and where the next block starts.
fn decode_block(
    bytes: &[u8],
    at: usize,
    sequence: u32,
    version: u16,
) -> Result<(BlockHeader, Vec<Slot>, usize), DecodeError> {
    let offset = at as u64;
    if bytes.len() - at < BLOCK_HEADER_LEN {
        return Err(DecodeError::Truncated { offset, what: "block header" });
    }
    let h = &bytes[at..at + BLOCK_HEADER_LEN];
    if h[..4] != BLOCK_MAGIC {
        return Err(DecodeError::Corrupt { offset, what: "bad block magic".into() });
    }
    let block = BlockHeader {
        flags: u16_at(h, 4),
        record_count: u32_at(h, 8),
        sequence: u32_at(h, 12),
        dropped_total: u64_at(h, 16),
        ref_ticks: u64_at(h, 24),
        ref_mono_ns: u64_at(h, 32),
    };
    let compact = version > VERSION_FIXED_MAX;
    if block.flags & !BLOCK_FLAG_END != 0 || u16_at(h, 6) != 0 || (!compact && u32_at(h, 44) != 0) {
        return Err(DecodeError::Corrupt { offset, what: "block header has reserved bits set".into() });
    }
    if block.record_count as usize > BLOCK_RECORDS_MAX {
        return Err(DecodeError::Corrupt { offset, what: format!("block claims {} records", block.record_count) });
    }
    let body = if compact { u32_at(h, 44) as usize } else { block.record_count as usize * RECORD_LEN };
    if body > block.record_count as usize * COMPACT_RECORD_LEN_MAX.max(RECORD_LEN) {
        return Err(DecodeError::Corrupt {
            offset,
            what: format!("block claims {body} bytes for {} records", block.record_count),
        });
    }
    let start = at + BLOCK_HEADER_LEN;
    let end = start + body;
    if end > bytes.len() {
        return Err(DecodeError::Truncated { offset, what: "block records" });
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..40]), &bytes[start..end]);
    if crc != u32_at(h, 40) {
        return Err(DecodeError::Corrupt { offset, what: "block checksum mismatch".into() });
    }
    if block.sequence != sequence {
        return Err(DecodeError::Corrupt {
            offset,
            what: format!("block {} where block {sequence} belongs (blocks lost or reordered)", block.sequence),
        });
    }
    let mut slots = Vec::with_capacity(block.record_count as usize);
    if compact {
        let (body, mut pos, mut ctx) = (&bytes[start..end], 0, compact::Context::new(version));
        for _ in 0..block.record_count {
            let r_at = (start + pos) as u64;
            let slot = compact::decode(body, &mut pos, &mut ctx)
                .map_err(|what| DecodeError::Corrupt { offset: r_at, what: what.into() })?;
            check_slot(&slot, r_at, version)?;
            slots.push(slot);
        }
        if pos != body.len() {
            return Err(DecodeError::Corrupt {
                offset: (start + pos) as u64,
                what: format!("{} bytes after the block's last record", body.len() - pos),
            });
        }
    } else {
        for i in 0..block.record_count as usize {
            let r_at = start + i * RECORD_LEN;
            let slot = Slot::from_bytes(&bytes[r_at..r_at + RECORD_LEN]);
            check_slot(&slot, r_at as u64, version)?;
            slots.push(slot);
        }
    }
    Ok((block, slots, end))
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::slot::FLAG_EXACT;
    use super::*;
    use proptest::prelude::*;

    /// Well-formed records, as slots: single messages, runs and pairs.
    fn slot() -> impl Strategy<Value = Slot> {
        prop_oneof![3 => single_slot(), 1 => pair_slot()]
    }

    /// Well-formed pair records: a request and its response at the caller or the server.
    fn pair_slot() -> impl Strategy<Value = Slot> {
        (any::<[u64; 3]>(), any::<[u32; 6]>(), any::<bool>(), any::<bool>(), 0usize..=2, any::<[u16; 2]>()).prop_map(
            |(t, n, server, exact, buffers, lens)| {
                let mut buffer_len = [0u32; 4];
                for i in 0..buffers {
                    buffer_len[i] = u32::from(lens[i]);
                }
                let listed: u32 = buffer_len.iter().sum();
                let sent = if buffers == 0 { n[3] } else { listed };
                buffer_len[2] = if server { sent } else { n[3] };
                buffer_len[3] = n[4].max(1);
                Slot {
                    ticks: t[0],
                    src_node: n[0],
                    dst_node: n[1],
                    channel: n[2],
                    kind: MessageKind::Request as u8,
                    flags: FLAG_PAIR | if server { FLAG_RECEIVE } else { 0 } | if exact { FLAG_EXACT } else { 0 },
                    buffers: buffers as u8,
                    reserved: 0,
                    size: if server || buffers == 0 { t[1] } else { u64::from(listed) },
                    buffer_len,
                    request_id: t[2].max(1),
                    stage_a: n[5],
                    stage_b: n[5] / 2,
                }
            },
        )
    }

    /// Well-formed records of one message or a run.
    fn single_slot() -> impl Strategy<Value = Slot> {
        (any::<[u64; 3]>(), any::<[u32; 5]>(), 0u8..9, 0u8..8, 0usize..=4, any::<[u16; 4]>()).prop_map(
            |(t, n, kind, flags, buffers, lens)| {
                let mut buffer_len = [0u32; 4];
                for i in 0..buffers {
                    buffer_len[i] = u32::from(lens[i]);
                }
                let run = flags & FLAG_RUN != 0;
                Slot {
                    ticks: t[0],
                    src_node: n[0],
                    dst_node: n[1],
                    channel: n[2],
                    kind,
                    flags,
                    buffers: buffers as u8,
                    reserved: 0,
                    size: if buffers == 0 { t[1] } else { buffer_len.iter().map(|&l| u64::from(l)).sum() },
                    buffer_len,
                    request_id: if run { 0 } else { t[2] },
                    stage_a: if run { n[3].max(2) } else { n[3] },
                    stage_b: n[4],
                }
            },
        )
    }

    fn bytes_of(slots: &[Slot]) -> Vec<u8> {
        let mut b = Vec::new();
        for s in slots {
            s.encode_into(&mut b);
        }
        b
    }

    fn header() -> FileHeader {
        FileHeader {
            version: VERSION,
            node_id: 3,
            pid: 1234,
            boot_id: 77,
            ref_ticks: 1_000,
            ref_mono_ns: 5_000,
            ref_real_ns: 9_000,
            ticks_per_sec: 2_000_000_000,
        }
    }

    /// A file of the given blocks of records, the last one an end block.
    fn file(blocks: &[Vec<Slot>]) -> Vec<u8> {
        file_of(VERSION, blocks)
    }

    /// A file of format `version` (compact records from version 4 on).
    fn file_of(version: u16, blocks: &[Vec<Slot>]) -> Vec<u8> {
        let mut out = FileHeader { version, ..header() }.encode().to_vec();
        for (i, records) in blocks.iter().enumerate() {
            let last = i + 1 == blocks.len();
            let h = BlockHeader {
                flags: if last { BLOCK_FLAG_END } else { 0 },
                record_count: records.len() as u32,
                sequence: i as u32,
                dropped_total: i as u64,
                ref_ticks: 2_000 + i as u64 * 1_000,
                ref_mono_ns: 5_500 + i as u64 * 500,
            };
            if version > VERSION_FIXED_MAX {
                let mut body = Vec::new();
                encode_compact_records(version, records, &mut body);
                encode_compact_block(&h, &body, &mut out);
            } else {
                encode_block(&h, &bytes_of(records), &mut out);
            }
        }
        out
    }

    /// Where the block after the one at `at` starts.
    fn next_block(bytes: &[u8], at: usize) -> usize {
        at + BLOCK_HEADER_LEN + u32_at(bytes, at + 44) as usize
    }

    proptest! {
        #[test]
        fn records_round_trip(s in slot()) {
            prop_assert_eq!(Record::decode(&bytes_of(&[s]), 0, VERSION), Ok(s.to_records()));
        }

        #[test]
        fn files_round_trip(blocks in proptest::collection::vec(proptest::collection::vec(slot(), 0..5), 1..4)) {
            let bytes = file(&blocks);
            let f = decode_file(&bytes).unwrap();
            prop_assert_eq!(f.header, header());
            prop_assert_eq!(f.dropped(), blocks.len() as u64 - 1);
            let want: Vec<Record> = blocks
                .concat()
                .into_iter()
                .flat_map(|s| {
                    let (a, b) = s.to_records();
                    std::iter::once(a).chain(b)
                })
                .collect();
            prop_assert_eq!(f.messages(), want.iter().map(|r| u64::from(r.count)).sum::<u64>());
            prop_assert_eq!(f.records, want);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_file(&bytes);
        }

        #[test]
        fn random_records_never_panic(bytes in proptest::collection::vec(any::<u8>(), RECORD_LEN)) {
            if let Ok((r, second)) = Record::decode(&bytes, 0, VERSION) {
                prop_assert!(r.count >= 1);
                prop_assert!(second.is_none_or(|s| s.count == 1 && s.request_id == r.request_id));
            }
        }

        #[test]
        fn mutated_files_never_panic_and_errors_name_an_offset_inside(
            blocks in proptest::collection::vec(proptest::collection::vec(slot(), 0..3), 1..3),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
            do_cut: bool,
        ) {
            let mut bytes = file(&blocks);
            for (i, x) in &flips {
                let i = i.index(bytes.len());
                bytes[i] ^= x | 1;
            }
            if do_cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            match decode_file(&bytes) {
                Ok(_) => {}
                Err(DecodeError::Truncated { offset, .. }) | Err(DecodeError::Corrupt { offset, .. }) => {
                    prop_assert!(offset as usize <= bytes.len());
                }
                Err(DecodeError::Version(_)) => {}
            }
        }

        #[test]
        fn every_truncation_is_reported_at_or_before_the_cut(
            blocks in proptest::collection::vec(proptest::collection::vec(slot(), 1..3), 1..3),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = file(&blocks);
            let cut = cut.index(bytes.len());
            match decode_file(&bytes[..cut]) {
                Err(DecodeError::Truncated { offset, .. }) => prop_assert!(offset as usize <= cut),
                other => prop_assert!(false, "a cut file decoded as {:?}", other),
            }
        }
    }

    #[test]
    fn a_flipped_record_byte_names_its_block() {
        let r = Slot { size: 10, kind: 1, ..Slot::EMPTY };
        let mut bytes = file(&[vec![r; 3], vec![r; 2]]);
        let second_block = next_block(&bytes, FILE_HEADER_LEN);
        bytes[second_block + BLOCK_HEADER_LEN + 3] ^= 0x40;
        assert_eq!(
            decode_file(&bytes),
            Err(DecodeError::Corrupt { offset: second_block as u64, what: "block checksum mismatch".into() })
        );
        let msg = decode_file(&bytes).unwrap_err().to_string();
        assert!(msg.contains(&format!("offset {second_block}")), "{msg}");
    }

    #[test]
    fn a_bad_record_names_its_own_offset() {
        let good = Slot { size: 10, kind: 1, flags: FLAG_RECEIVE | FLAG_EXACT, ..Slot::EMPTY };
        let run_with_id = Slot { flags: FLAG_RUN, stage_a: 5, request_id: 9, ..Slot::EMPTY };
        let bytes = file(&[vec![good, run_with_id]]);
        let mut first = Vec::new();
        encode_compact_records(VERSION, &[good], &mut first);
        let at = (FILE_HEADER_LEN + BLOCK_HEADER_LEN + first.len()) as u64;
        match decode_file(&bytes) {
            Err(DecodeError::Corrupt { offset, what }) => {
                assert_eq!(offset, at);
                assert!(what.contains("run"), "{what}");
            }
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn a_pair_decodes_to_the_two_records_its_messages_would_have_had() {
        let t = 1_000;
        // The caller: a 2-buffer request sent at t, its 40-byte response found at t + 30,
        // whose handler ran from t + 32 to t + 35.
        let caller = Slot {
            ticks: t,
            src_node: 1,
            dst_node: 2,
            channel: 3,
            kind: MessageKind::Request as u8,
            flags: FLAG_PAIR | FLAG_EXACT,
            buffers: 2,
            size: 144,
            buffer_len: [16, 128, 40, 31],
            request_id: 77,
            stage_a: 33,
            stage_b: 36,
            ..Slot::EMPTY
        };
        let (request, response) = Record::decode(&bytes_of(&[caller]), 0, VERSION).unwrap();
        let single = |s: Slot| Record::decode(&bytes_of(&[s]), 0, VERSION).unwrap();
        let sent = Slot { flags: FLAG_EXACT, buffer_len: [16, 128, 0, 0], stage_a: 0, stage_b: 0, ..caller };
        assert_eq!((request, None), single(sent));
        let found = Slot {
            ticks: t + 30,
            src_node: 2,
            dst_node: 1,
            kind: MessageKind::Response as u8,
            flags: FLAG_RECEIVE | FLAG_EXACT,
            buffers: 0,
            size: 40,
            buffer_len: [0; 4],
            stage_a: 3,
            stage_b: 6,
            ..caller
        };
        assert_eq!(single(found), (response.expect("a pair has a response"), None));
        // The server: the request found at t (handler t + 2 .. t + 9), the response of one
        // 40-byte buffer sent at t + 8.
        let server = Slot {
            flags: FLAG_PAIR | FLAG_RECEIVE,
            buffers: 1,
            buffer_len: [40, 0, 40, 9],
            stage_a: 3,
            stage_b: 10,
            ..caller
        };
        let (request, response) = Record::decode(&bytes_of(&[server]), 0, VERSION).unwrap();
        let found = Slot { flags: FLAG_RECEIVE, buffers: 0, buffer_len: [0; 4], ..server };
        assert_eq!((request, None), single(found));
        let sent = Slot {
            ticks: t + 8,
            src_node: 2,
            dst_node: 1,
            kind: MessageKind::Response as u8,
            flags: 0,
            buffers: 1,
            size: 40,
            buffer_len: [40, 0, 0, 0],
            stage_a: 0,
            stage_b: 0,
            ..server
        };
        assert_eq!(single(sent), (response.expect("a pair has a response"), None));
    }

    #[test]
    fn pair_records_are_refused_in_version_2_files_and_when_malformed() {
        let pair = Slot {
            kind: MessageKind::Request as u8,
            flags: FLAG_PAIR,
            size: 5,
            buffer_len: [0, 0, 7, 1],
            request_id: 9,
            ..Slot::EMPTY
        };
        assert!(Record::decode(&bytes_of(&[pair]), 0, VERSION).is_ok());
        let refused = |s: Slot, version: u16| {
            matches!(Record::decode(&bytes_of(&[s]), 64, version), Err(DecodeError::Corrupt { offset: 64, .. }))
        };
        assert!(refused(pair, 2), "version 2 has no pairs");
        assert!(refused(Slot { request_id: 0, ..pair }, VERSION), "a pair has a request id");
        assert!(refused(Slot { kind: MessageKind::Response as u8, ..pair }, VERSION), "a pair starts with its request");
        assert!(refused(Slot { buffer_len: [0, 0, 7, 0], ..pair }, VERSION), "a pair has its response's time");
        assert!(refused(Slot { buffers: 3, buffer_len: [1, 2, 2, 1], ..pair }, VERSION), "a pair lists two buffers");
        assert!(
            refused(Slot { buffers: 1, buffer_len: [4, 0, 7, 1], ..pair }, VERSION),
            "listed bytes are the request's"
        );
        let mut v2 = FileHeader { version: 2, ..header() }.encode().to_vec();
        let end = BlockHeader {
            flags: BLOCK_FLAG_END,
            record_count: 1,
            sequence: 0,
            dropped_total: 0,
            ref_ticks: 2_000,
            ref_mono_ns: 5_500,
        };
        encode_block(&end, &bytes_of(&[Slot { size: 10, kind: 1, ..Slot::EMPTY }]), &mut v2);
        assert_eq!(decode_file(&v2).map(|f| f.records.len()), Ok(1), "version 2 files are still read");
    }

    #[test]
    fn version_3_files_of_fixed_records_are_still_read() {
        let records = vec![
            Slot { size: 10, kind: 1, ..Slot::EMPTY },
            Slot {
                ticks: 5,
                kind: 1,
                flags: FLAG_PAIR,
                size: 5,
                buffer_len: [0, 0, 7, 1],
                request_id: 9,
                ..Slot::EMPTY
            },
        ];
        let v3 = file_of(3, &[records.clone(), vec![]]);
        assert_eq!(u16_at(&v3, 12), 64, "version 3 declares 64-byte records");
        let v5 = file(&[records.clone(), vec![]]);
        assert_eq!(u16_at(&v5, 12), 0, "version 5 declares compact records");
        assert!(v5.len() < v3.len());
        let (a, b) = (decode_file(&v3).unwrap(), decode_file(&v5).unwrap());
        assert_eq!(a.records, b.records, "the same records in either version");
        assert_eq!(a.records.len(), 3, "a pair is two records");
        // Version 4 (a clear request bit: the same id) is still read, and reads the same.
        let calls: Vec<Slot> = (1..=5u64)
            .map(|g| Slot {
                ticks: g,
                kind: 1,
                flags: FLAG_PAIR,
                size: 5,
                buffer_len: [0, 0, 7, 1],
                request_id: g << 32 | 2,
                ..Slot::EMPTY
            })
            .chain([Slot { size: 10, kind: 1, ..Slot::EMPTY }; 2])
            .collect();
        let (v4, v5) = (file_of(4, &[calls.clone(), vec![]]), file(&[calls, vec![]]));
        assert_eq!(u16_at(&v4, 8), 4);
        assert!(v5.len() < v4.len(), "version 5 repeats the ids' step: {} against {} bytes", v5.len(), v4.len());
        assert_eq!(decode_file(&v4).unwrap().records, decode_file(&v5).unwrap().records);
    }

    #[test]
    fn compact_blocks_with_bytes_left_over_or_cut_records_name_the_offset() {
        let r = Slot { size: 10, kind: 1, ..Slot::EMPTY };
        let mut body = Vec::new();
        encode_compact_records(VERSION, &[r, r], &mut body);
        let block = |count: u32, body: &[u8]| {
            let mut out = header().encode().to_vec();
            let h = BlockHeader {
                flags: BLOCK_FLAG_END,
                record_count: count,
                sequence: 0,
                dropped_total: 0,
                ref_ticks: 2_000,
                ref_mono_ns: 5_500,
            };
            encode_compact_block(&h, body, &mut out);
            out
        };
        assert_eq!(decode_file(&block(2, &body)).map(|f| f.records.len()), Ok(2));
        let body_at = FILE_HEADER_LEN + BLOCK_HEADER_LEN;
        match decode_file(&block(1, &body)) {
            Err(DecodeError::Corrupt { offset, what }) => {
                let mut first = Vec::new();
                encode_compact_records(VERSION, &[r], &mut first);
                assert_eq!(offset as usize, body_at + first.len(), "{what}");
                assert!(what.contains("after the block's last record"), "{what}");
            }
            other => panic!("decoded as {other:?}"),
        }
        match decode_file(&block(3, &body)) {
            Err(DecodeError::Corrupt { offset, what }) => {
                assert_eq!(offset as usize, body_at + body.len(), "{what}");
                assert!(what.contains("past the end of its block"), "{what}");
            }
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn version_1_files_are_refused_by_name() {
        let mut bytes = file(&[vec![]]);
        bytes[8..10].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(decode_file(&bytes), Err(DecodeError::Version(1)));
    }

    #[test]
    fn a_file_cut_at_a_block_boundary_lacks_its_end_block() {
        let r = Slot::EMPTY;
        let bytes = file(&[vec![r; 2], vec![r; 2]]);
        let boundary = next_block(&bytes, FILE_HEADER_LEN);
        let (f, e) = decode_prefix(&bytes[..boundary]);
        assert_eq!(f.unwrap().records.len(), 2, "the intact prefix is kept");
        assert!(matches!(e, Some(DecodeError::Truncated { offset, .. }) if offset == boundary as u64));
    }

    #[test]
    fn ticks_interpolate_between_references() {
        let f = decode_file(&file(&[vec![], vec![]])).unwrap();
        let c = f.clock();
        assert_eq!(c.mono_ns(1_000), 5_000);
        assert_eq!(c.mono_ns(1_500), 5_250);
        assert_eq!(c.mono_ns(2_500), 5_750);
        assert_eq!(c.mono_ns(0), 0, "zero means not measured");
    }
}
