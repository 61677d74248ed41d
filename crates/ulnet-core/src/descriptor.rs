//! Descriptors: what a sender pushes and a receiver pops.
//!
//! A descriptor either carries a small message inline or names a buffer of the receiver's
//! communication segment that holds (a fragment of) a larger one. On the shared-memory
//! transport a descriptor is the 16-byte record header below, followed by the inline
//! payload or by a 24-byte buffer reference; records are padded to [`RECORD_ALIGN`].
//!
//! ```text
//!  word 0 (published last, Release)      word 1
//! +----------------+----------------+   +----------------+--------+--------+--------+
//! | stamp: u32     | payload_len u32|   | tag: u32       | kind u8| flags u8| 0 u16 |
//! +----------------+----------------+   +----------------+--------+--------+--------+
//!  Inline:  payload bytes follow (payload_len of them)
//!  Buffer:  word 2 = buffer index u32 | fragment len u32, word 3 = message length u64,
//!           word 4 = fragment offset u64
//!  Padding: payload_len bytes to the end of the ring are skipped
//! ```
//!
//! The stamp is derived from the record's position in the stream, so a header left from an
//! earlier lap is never taken for a new one; a zero word 0 means "nothing published here".

/// Records start on multiples of this many bytes.
pub const RECORD_ALIGN: usize = 16;
/// Bytes of every record header.
pub const HEADER_LEN: usize = 16;
/// Bytes of a buffer reference that follows a `Buffer` header.
pub const BUFFER_REF_LEN: usize = 24;

const _: () = assert!(HEADER_LEN.is_multiple_of(RECORD_ALIGN), "payloads start aligned");
const _: () = assert!((HEADER_LEN + BUFFER_REF_LEN).is_multiple_of(8), "buffer references are whole words");

/// What a record holds. Discriminants are part of the wire format: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A whole message carried in the record.
    Inline = 1,
    /// A message, or one fragment of it, in a buffer of the receiver's segment.
    Buffer = 2,
    /// Filler up to the end of the ring; the next record starts at offset 0.
    Padding = 3,
}

/// Flags of a `Buffer` record.
pub mod flags {
    /// The fragment is the first of its message.
    pub const FIRST: u8 = 1;
    /// The fragment is the last of its message.
    pub const LAST: u8 = 2;
}

/// The fixed 16-byte header of every ring record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Position stamp; see [`stamp_for`].
    pub stamp: u32,
    /// Inline: payload bytes. Padding: bytes skipped. Buffer: 24 (the reference).
    pub payload_len: u32,
    /// The channel tag the sender addressed.
    pub tag: u32,
    /// What follows the header.
    pub kind: RecordKind,
    /// `flags::FIRST` / `flags::LAST` for buffer records.
    pub flags: u8,
}

/// Why a record header or buffer reference was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The kind byte names no known record kind.
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    /// Reserved bits were not zero.
    #[error("reserved header bits set")]
    ReservedBits,
}

/// The stamp a record at stream position `pos` carries: the record's index in the stream
/// with the top bit set, so it is never zero. Stamps repeat only every 2^31 records
/// (32 GiB of stream), far beyond any ring.
#[inline(always)]
pub fn stamp_for(pos: u64) -> u32 {
    ((pos / RECORD_ALIGN as u64) as u32) | (1 << 31)
}

/// Bytes a record with this payload occupies in the ring, padding included.
#[inline(always)]
pub fn record_len(payload_len: usize) -> usize {
    (HEADER_LEN + payload_len).next_multiple_of(RECORD_ALIGN)
}

impl RecordHeader {
    /// Encodes the header into its two words.
    #[inline(always)]
    pub fn encode(&self) -> [u64; 2] {
        let w0 = u64::from(self.stamp) | (u64::from(self.payload_len) << 32);
        let w1 = u64::from(self.tag) | (u64::from(self.kind as u8) << 32) | (u64::from(self.flags) << 40);
        [w0, w1]
    }

    /// Decodes a header from its two words, refusing unknown kinds and reserved bits.
    #[inline(always)]
    pub fn decode(words: [u64; 2]) -> Result<Self, DecodeError> {
        let [w0, w1] = words;
        let kind = match (w1 >> 32) as u8 {
            1 => RecordKind::Inline,
            2 => RecordKind::Buffer,
            3 => RecordKind::Padding,
            other => return Err(DecodeError::UnknownKind(other)),
        };
        if w1 >> 48 != 0 {
            return Err(DecodeError::ReservedBits);
        }
        Ok(Self { stamp: w0 as u32, payload_len: (w0 >> 32) as u32, tag: w1 as u32, kind, flags: (w1 >> 40) as u8 })
    }
}

/// A reference to (a fragment of) a message in a buffer of the receiver's segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef {
    /// Index of the buffer in the receiver's segment.
    pub buffer_index: u32,
    /// Bytes of this fragment in the buffer.
    pub fragment_len: u32,
    /// Bytes of the whole message.
    pub message_len: u64,
    /// Offset of this fragment in the message.
    pub fragment_offset: u64,
}

impl BufferRef {
    /// Encodes the reference into its three words.
    #[inline(always)]
    pub fn encode(&self) -> [u64; 3] {
        [u64::from(self.buffer_index) | (u64::from(self.fragment_len) << 32), self.message_len, self.fragment_offset]
    }

    /// Decodes a reference (any bit pattern is a reference; bounds are checked by the
    /// receiver against its segment).
    #[inline(always)]
    pub fn decode(words: [u64; 3]) -> Self {
        Self {
            buffer_index: words[0] as u32,
            fragment_len: (words[0] >> 32) as u32,
            message_len: words[1],
            fragment_offset: words[2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = RecordKind> {
        prop_oneof![Just(RecordKind::Inline), Just(RecordKind::Buffer), Just(RecordKind::Padding)]
    }

    proptest! {
        #[test]
        fn header_round_trips(stamp: u32, payload_len: u32, tag: u32, kind in kind(), flags: u8) {
            let header = RecordHeader { stamp, payload_len, tag, kind, flags };
            prop_assert_eq!(RecordHeader::decode(header.encode()), Ok(header));
        }

        #[test]
        fn buffer_ref_round_trips(buffer_index: u32, fragment_len: u32, message_len: u64, fragment_offset: u64) {
            let r = BufferRef { buffer_index, fragment_len, message_len, fragment_offset };
            prop_assert_eq!(BufferRef::decode(r.encode()), r);
        }

        #[test]
        fn decode_never_panics_and_refuses_unknown_kinds(w0: u64, w1: u64) {
            match RecordHeader::decode([w0, w1]) {
                Ok(h) => prop_assert_eq!(h.encode(), [w0, w1]),
                Err(DecodeError::UnknownKind(k)) => prop_assert!(!(1..=3).contains(&k)),
                Err(DecodeError::ReservedBits) => prop_assert!(w1 >> 48 != 0),
            }
        }

        #[test]
        fn stamps_differ_between_laps(pos in 0u64..(1 << 40), cap_log2 in 6u32..30) {
            let cap = 1u64 << cap_log2;
            prop_assert_ne!(stamp_for(pos), stamp_for(pos + cap));
            prop_assert_ne!(stamp_for(pos), 0);
        }
    }

    #[test]
    fn record_len_is_aligned_and_holds_the_payload() {
        for len in 0..300 {
            let r = record_len(len);
            assert_eq!(r % RECORD_ALIGN, 0);
            assert!(r >= HEADER_LEN + len && r < HEADER_LEN + len + RECORD_ALIGN);
        }
    }
}
