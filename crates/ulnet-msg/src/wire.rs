//! The message-layer header that precedes every RPC message on a channel.
//!
//! ```text
//!  0        1        2                4                6                8
//! +--------+--------+----------------+----------------+----------------+
//! | kind   | flags  | method u16     | status u16     | reserved (0)   |
//! +--------+--------+----------------+----------------+----------------+
//! | request id u64                                                     |
//! +--------------------------------------------------------------------+
//! | deadline budget, microseconds u32 (0: none) | reserved (0) u32     |
//! +--------------------------------------------------------------------+
//! ```
//!
//! 24 bytes, sent as the first buffer of a gather list so the payload is never copied to
//! sit behind it. Discriminants are wire format: never renumber, only append. History:
//! version 1 — this layout; kinds 6 and 7 (active messages) appended.

/// Bytes of the header.
pub const HEADER_LEN: usize = 24;

/// What a message is. Discriminants are part of the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A call that expects a reply.
    Request = 1,
    /// The successful answer to a request.
    Reply = 2,
    /// A call that expects no reply.
    OneWay = 3,
    /// The caller no longer wants the answer.
    Cancel = 4,
    /// The request failed at the server; `status` says why.
    ErrorReply = 5,
    /// An active-message request: `method` names the handler, 32 bytes of arguments follow.
    AmRequest = 6,
    /// An active-message reply: runs a reply handler, which cannot reply.
    AmReply = 7,
}

impl Kind {
    /// What a trace calls a message of this kind.
    pub fn trace_kind(self) -> ulnet_core::trace::MessageKind {
        use ulnet_core::trace::MessageKind as M;
        match self {
            Kind::Request | Kind::AmRequest => M::Request,
            Kind::Reply | Kind::ErrorReply | Kind::AmReply => M::Response,
            Kind::OneWay => M::OneWay,
            Kind::Cancel => M::Control,
        }
    }
}

/// Why a server refused a request (the `status` of an `ErrorReply`). Wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// No handler for the method.
    UnknownMethod = 1,
    /// The request's deadline passed before it was handled.
    DeadlineExceeded = 2,
    /// The request was larger than the server accepts.
    PayloadTooLarge = 3,
    /// The request could not be decoded.
    Malformed = 4,
    /// The handler failed.
    HandlerFailed = 5,
}

impl Status {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Status::UnknownMethod,
            2 => Status::DeadlineExceeded,
            3 => Status::PayloadTooLarge,
            4 => Status::Malformed,
            5 => Status::HandlerFailed,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// Method (requests, one-way calls) or the method being answered.
    pub method: u16,
    /// For `ErrorReply`: why.
    pub status: Option<Status>,
    /// Pairs replies with requests; unique per caller and channel.
    pub request_id: u64,
    /// Microseconds the caller will wait, counted from sending (0: no deadline).
    pub deadline_us: u32,
}

/// Why bytes are not a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("message of {0} bytes is shorter than the header")]
    Truncated(usize),
    /// Unknown kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// Unknown status in an error reply.
    #[error("unknown status {0}")]
    UnknownStatus(u16),
    /// Reserved bytes not zero.
    #[error("reserved header bytes set")]
    Reserved,
}

impl Header {
    /// Encodes the header.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[2..4].copy_from_slice(&self.method.to_le_bytes());
        b[4..6].copy_from_slice(&self.status.map_or(0, |s| s as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.deadline_us.to_le_bytes());
        b
    }

    /// Decodes the header at the start of `msg`; the payload follows it.
    #[inline]
    pub fn decode(msg: &[u8]) -> Result<Self, DecodeError> {
        if msg.len() < HEADER_LEN {
            return Err(DecodeError::Truncated(msg.len()));
        }
        let kind = match msg[0] {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::OneWay,
            4 => Kind::Cancel,
            5 => Kind::ErrorReply,
            6 => Kind::AmRequest,
            7 => Kind::AmReply,
            k => return Err(DecodeError::UnknownKind(k)),
        };
        if msg[1] != 0 || msg[6..8] != [0, 0] || msg[20..24] != [0, 0, 0, 0] {
            return Err(DecodeError::Reserved);
        }
        let status_raw = u16::from_le_bytes([msg[4], msg[5]]);
        let status = match (kind, status_raw) {
            (Kind::ErrorReply, s) => Some(Status::from_u16(s).ok_or(DecodeError::UnknownStatus(s))?),
            (_, 0) => None,
            (_, s) => return Err(DecodeError::UnknownStatus(s)),
        };
        Ok(Header {
            kind,
            method: u16::from_le_bytes([msg[2], msg[3]]),
            status,
            request_id: u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")),
            deadline_us: u32::from_le_bytes(msg[16..20].try_into().expect("4 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        let kind = prop_oneof![
            Just(Kind::Request),
            Just(Kind::Reply),
            Just(Kind::OneWay),
            Just(Kind::Cancel),
            Just(Kind::ErrorReply)
        ];
        (kind, any::<u16>(), 1u16..=5, any::<u64>(), any::<u32>()).prop_map(
            |(kind, method, s, request_id, deadline_us)| Header {
                kind,
                method,
                status: (kind == Kind::ErrorReply).then(|| Status::from_u16(s).unwrap()),
                request_id,
                deadline_us,
            },
        )
    }

    proptest! {
        #[test]
        fn round_trips(h in header(), tail in proptest::collection::vec(any::<u8>(), 0..16)) {
            let mut msg = h.encode().to_vec();
            msg.extend_from_slice(&tail);
            prop_assert_eq!(Header::decode(&msg), Ok(h));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(h) = Header::decode(&bytes) {
                prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
            }
        }
    }
}
