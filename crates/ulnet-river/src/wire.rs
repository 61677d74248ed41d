//! The river's wire format: a 16-byte header, then the payload.
//!
//! ```text
//!  0      1        2          4                8                      16
//!  | kind | version | reserved | aux (u32 LE)  | value (u64 LE)       | payload ...
//! ```
//!
//! | kind | aux | value | payload |
//! |---|---|---|---|
//! | `Hello` (6) | sender's rank | number of nodes | the sender's listening address (UTF-8) |
//! | `Data` (1) | 0 | records in the message | `value × record_size` bytes of records |
//! | `Credit` (2) | chunks granted | 0 | none |
//! | `EndOfStream` (3) | 0 | records sent in all `Data` messages | none |
//! | `Control` (4) | application tag | payload length | application bytes |
//! | `Abort` (5) | 0 | payload length | reason (UTF-8, at most 1 KiB) |
//!
//! Discriminants are append-only: never renumber a kind. Version history: 1 — first.
//! Everything a peer sends is checked before use ([`Header::decode`]); a violation stops
//! the river with [`crate::RiverError::Protocol`] naming the peer.

/// Size of the header.
pub const HEADER_LEN: usize = 16;
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Longest abort reason carried.
pub const ABORT_REASON_MAX: usize = 1024;
/// Longest control payload: 16 MiB (samples and summaries are far smaller).
pub const CONTROL_MAX: u64 = 16 << 20;

/// Message kinds. Append-only: the numbers are on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Records for the receiver's queue.
    Data = 1,
    /// The receiver consumed chunks: the sender may send that many more.
    Credit = 2,
    /// The sender will send no more records; it states how many it sent.
    EndOfStream = 3,
    /// An application message (sampling, splitters, reports).
    Control = 4,
    /// The sender failed and says why.
    Abort = 5,
    /// First message on a new channel: who the sender is.
    Hello = 6,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Credit,
            3 => Kind::EndOfStream,
            4 => Kind::Control,
            5 => Kind::Abort,
            6 => Kind::Hello,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The kind.
    pub kind: Kind,
    /// Kind-specific 32-bit field.
    pub aux: u32,
    /// Kind-specific 64-bit field.
    pub value: u64,
}

/// Why a message was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than a header.
    #[error("message of {0} bytes is shorter than the 16-byte header")]
    Short(u64),
    /// Unknown kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// Another protocol version.
    #[error("protocol version {0}, expected {VERSION}")]
    Version(u8),
    /// Reserved bytes not zero.
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// The length does not match what the header says.
    #[error("{kind:?} message of {len} bytes does not match its header (value {value})")]
    Length {
        /// The kind.
        kind: Kind,
        /// Whole message length.
        len: u64,
        /// The header's value field.
        value: u64,
    },
}

impl Header {
    /// The 16 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = VERSION;
        b[4..8].copy_from_slice(&self.aux.to_le_bytes());
        b[8..16].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// Decodes the header at the start of `first` (the first bytes of a message) and
    /// checks it against the whole message's length `message_len` and the record size.
    pub fn decode(first: &[u8], message_len: u64, record_size: usize) -> Result<Header, WireError> {
        if first.len() < HEADER_LEN || message_len < HEADER_LEN as u64 {
            return Err(WireError::Short(message_len.min(first.len() as u64)));
        }
        let kind = Kind::from_u8(first[0]).ok_or(WireError::Kind(first[0]))?;
        if first[1] != VERSION {
            return Err(WireError::Version(first[1]));
        }
        if first[2] != 0 || first[3] != 0 {
            return Err(WireError::Reserved);
        }
        let aux = u32::from_le_bytes(first[4..8].try_into().expect("4 bytes"));
        let value = u64::from_le_bytes(first[8..16].try_into().expect("8 bytes"));
        let payload = message_len - HEADER_LEN as u64;
        let ok = match kind {
            Kind::Data => value.checked_mul(record_size as u64) == Some(payload) && value > 0,
            Kind::Credit => payload == 0 && aux > 0 && value == 0,
            Kind::EndOfStream => payload == 0,
            Kind::Control => payload == value && value <= CONTROL_MAX,
            Kind::Abort => payload == value && value <= ABORT_REASON_MAX as u64,
            Kind::Hello => payload <= 4096 && value > 0,
        };
        if !ok {
            return Err(WireError::Length { kind, len: message_len, value });
        }
        Ok(Header { kind, aux, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_checks_lengths() {
        let h = Header { kind: Kind::Data, aux: 0, value: 3 };
        assert_eq!(Header::decode(&h.encode(), 16 + 300, 100), Ok(h));
        assert!(Header::decode(&h.encode(), 16 + 299, 100).is_err());
        let c = Header { kind: Kind::Credit, aux: 2, value: 0 };
        assert_eq!(Header::decode(&c.encode(), 16, 100), Ok(c));
        let bad_credit = Header { kind: Kind::Credit, aux: 0, value: 0 };
        assert!(Header::decode(&bad_credit.encode(), 16, 100).is_err());
        let mut b = h.encode();
        b[1] = 9;
        assert_eq!(Header::decode(&b, 316, 100), Err(WireError::Version(9)));
        b[1] = VERSION;
        b[0] = 77;
        assert_eq!(Header::decode(&b, 316, 100), Err(WireError::Kind(77)));
        assert_eq!(Header::decode(&b[..8], 316, 100), Err(WireError::Short(8)));
        let huge = Header { kind: Kind::Data, aux: 0, value: u64::MAX };
        assert!(Header::decode(&huge.encode(), u64::MAX, 100).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), len in any::<u64>()) {
            let _ = Header::decode(&bytes, len, 100);
        }

        #[test]
        fn valid_headers_round_trip(kind in 1u8..=6, aux in any::<u32>(), value in 0u64..1000) {
            let kind = Kind::from_u8(kind).unwrap();
            let h = Header { kind, aux, value };
            if let Ok(d) = Header::decode(&h.encode(), 16 + value * 100, 100) {
                prop_assert_eq!(d, h);
            }
        }
    }
}
