//! The encoding of one log record, and the frame around it on disk.
//!
//! ```text
//!  frame:   | length u32 | crc32c u32 | payload (length bytes) |
//!  crc32c covers the length field and the payload, so a torn length is caught too.
//!  payload: | kind u8 | fields (little-endian, as the wire format) |
//! ```
//! Kinds are append-only; never reuse a number. History: format 1 (phase 1, never deployed);
//! format 2 (this one): 64-bit node ids and epochs with a round (as wire version 2), `Boot`
//! names the node, configuration entries, and kind 7 (a bare snapshot) retired for kind 8,
//! a snapshot that carries the configuration, the node's durable protocol state and the log
//! tail (the segments before it are deleted, so it must hold everything still needed).

use crate::codec::{DecodeError, Reader, Writer, SNAPSHOT_BYTES_MAX};
use crate::gup::Record;

/// Bytes of the frame header.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Largest payload a frame may announce: a snapshot record (the snapshot, its fields and the
/// log tail it carries, which the locker's limit on uncommitted positions keeps far below a
/// snapshot's size).
pub const FRAME_PAYLOAD_MAX: usize = 2 * SNAPSHOT_BYTES_MAX;

const BOOT: u8 = 1;
const ENTRY: u8 = 2;
const TRUNCATE_AFTER: u8 = 3;
const PROMISE: u8 = 4;
const NORMAL: u8 = 5;
const COMMIT: u8 = 6;
// 7: retired (format 1's snapshot without configuration and state).
const SNAPSHOT: u8 = 8;

/// Encodes a record's payload.
pub fn encode_record(record: &Record) -> Vec<u8> {
    let mut w = Writer::new();
    match record {
        Record::Boot { incarnation, node } => {
            w.u8(BOOT);
            w.u32(*incarnation);
            w.node(*node);
        }
        Record::Entry { seq, entry } => {
            w.u8(ENTRY);
            w.u64(*seq);
            w.entry(entry);
        }
        Record::TruncateAfter { seq } => {
            w.u8(TRUNCATE_AFTER);
            w.u64(*seq);
        }
        Record::Promise { epoch } => {
            w.u8(PROMISE);
            w.epoch(*epoch);
        }
        Record::Normal { epoch } => {
            w.u8(NORMAL);
            w.epoch(*epoch);
        }
        Record::Commit { seq } => {
            w.u8(COMMIT);
            w.u64(*seq);
        }
        Record::Snapshot { snapshot, node, incarnation, promised, last_normal, tail } => {
            w.u8(SNAPSHOT);
            w.snapshot(snapshot);
            w.node(*node);
            w.u32(*incarnation);
            w.epoch(*promised);
            w.opt_epoch(*last_normal);
            w.entries(tail);
        }
    }
    w.buf
}

/// Decodes a record's payload; rejects anything malformed or with trailing bytes.
pub fn decode_record(payload: &[u8]) -> Result<Record, DecodeError> {
    let mut r = Reader::new(payload);
    let record = match r.u8()? {
        BOOT => Record::Boot { incarnation: r.u32()?, node: r.node()? },
        ENTRY => Record::Entry { seq: r.u64()?, entry: r.entry()? },
        TRUNCATE_AFTER => Record::TruncateAfter { seq: r.u64()? },
        PROMISE => Record::Promise { epoch: r.epoch()? },
        NORMAL => Record::Normal { epoch: r.epoch()? },
        COMMIT => Record::Commit { seq: r.u64()? },
        SNAPSHOT => {
            let snapshot = r.snapshot()?;
            let node = r.node()?;
            let incarnation = r.u32()?;
            let promised = r.epoch()?;
            let last_normal = r.opt_epoch()?;
            let tail = r.entries()?;
            if tail.first().is_some_and(|(seq, _)| *seq <= snapshot.seq) {
                return Err(DecodeError::Invalid("a snapshot's tail starts inside the snapshot"));
            }
            Record::Snapshot { snapshot, node, incarnation, promised, last_normal, tail }
        }
        tag => return Err(DecodeError::UnknownTag { what: "record", tag }),
    };
    r.finish()?;
    Ok(record)
}

/// The checksum of a frame with length field `len` and `payload`.
pub(super) fn frame_crc(len: [u8; 4], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len), payload)
}

/// Appends a framed record to `out`.
pub fn frame_record(record: &Record, out: &mut Vec<u8>) {
    let payload = encode_record(record);
    let len = (payload.len() as u32).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&frame_crc(len, &payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// Why the frames of a file stop being readable at some offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The file ends inside a frame (a write torn by a crash).
    #[error("torn record: {needed} bytes missing")]
    Torn {
        /// Bytes the frame announced beyond the end of the file.
        needed: usize,
    },
    /// The checksum does not match (bit rot, a bad sector, a stray write).
    #[error("checksum mismatch")]
    Checksum,
    /// The length field is impossible.
    #[error("record length {0} beyond the limit")]
    Length(u64),
    /// The checksum matches but the payload does not decode (a bug or a foreign file).
    #[error("undecodable record: {0}")]
    Decode(DecodeError),
}

/// Reads the frame at the start of `buf`: the record and the bytes it took.
pub fn read_frame(buf: &[u8]) -> Result<(Record, usize), FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Torn { needed: FRAME_HEADER_BYTES - buf.len() });
    }
    let len_bytes: [u8; 4] = buf[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len > FRAME_PAYLOAD_MAX {
        return Err(FrameError::Length(len as u64));
    }
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    let Some(payload) = buf.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
        return Err(FrameError::Torn { needed: FRAME_HEADER_BYTES + len - buf.len() });
    };
    if frame_crc(len_bytes, payload) != crc {
        return Err(FrameError::Checksum);
    }
    let record = decode_record(payload).map_err(FrameError::Decode)?;
    Ok((record, FRAME_HEADER_BYTES + len))
}

/// Whether a whole frame whose checksum matches starts at the start of `buf` (its payload
/// is not decoded): a cheap test to run at every offset of a damaged tail.
pub fn frame_checks(buf: &[u8]) -> bool {
    let Some(header) = buf.get(..FRAME_HEADER_BYTES) else { return false };
    let len_bytes: [u8; 4] = header[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    len <= FRAME_PAYLOAD_MAX
        && buf
            .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len)
            .is_some_and(|payload| frame_crc(len_bytes, payload) == crc)
}
