//! Errors of remote memory access, one enum per operation family.

use crate::error::{ChannelError, ConnectError};

/// Why a target (or, on the mapped path, the importer's own check against the owner's
/// control block) refused an access. Every refusal leaves the segment untouched and is
/// counted. The discriminants travel on the wire: never renumber, only append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum AccessError {
    /// No segment with that id is exported on the target. Look the name up again.
    #[error("no such segment on the target")]
    UnknownSegment = 1,
    /// The segment was re-exported (or its slot reused) since this handle was imported.
    /// Import it again to get the current generation.
    #[error("stale generation: the segment was re-exported since it was imported")]
    StaleGeneration = 2,
    /// The owner revoked the segment; it is unavailable until re-exported.
    #[error("segment revoked by its owner")]
    Revoked = 3,
    /// This importer lacks the right the operation needs (read, write or atomic).
    #[error("operation not permitted for this importer")]
    Denied = 4,
    /// `offset + length` is beyond the segment, or overflows.
    #[error("access out of the segment's bounds")]
    OutOfBounds = 5,
    /// An atomic operation on an offset that is not a multiple of 8.
    #[error("atomic operation on a misaligned word")]
    Misaligned = 6,
    /// The request could not be decoded.
    #[error("malformed request")]
    Malformed = 7,
    /// A request arrived on a channel before the importer introduced itself.
    #[error("request before the importer introduced itself")]
    NotIntroduced = 8,
    /// The request (or its response) is larger than one message on this channel carries.
    #[error("request larger than the channel carries")]
    TooLarge = 9,
    /// No segment is exported under that name.
    #[error("no segment exported under that name")]
    UnknownName = 10,
    /// The target lacks the resources to grant the access now (descriptors, memory for a
    /// mapping). Retry later.
    #[error("target lacks resources for the access")]
    Unavailable = 11,
}

impl AccessError {
    /// Every variant, in wire order (for counter tables).
    pub const ALL: [AccessError; 11] = [
        AccessError::UnknownSegment,
        AccessError::StaleGeneration,
        AccessError::Revoked,
        AccessError::Denied,
        AccessError::OutOfBounds,
        AccessError::Misaligned,
        AccessError::Malformed,
        AccessError::NotIntroduced,
        AccessError::TooLarge,
        AccessError::UnknownName,
        AccessError::Unavailable,
    ];

    /// The wire code.
    #[inline]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The error for a wire code, if it names one.
    pub fn from_code(code: u8) -> Option<AccessError> {
        AccessError::ALL.get(usize::from(code).wrapping_sub(1)).copied()
    }

    /// Index into a counter table of `ALL.len()` entries.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize - 1
    }
}

/// Why a one-sided operation (put, get, compare-and-swap, fetch-and-add, flush) failed.
/// Back-pressure is [`crate::rma::RmaOutcome::NoResource`], not an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RmaError {
    /// The target refused the access; nothing was changed.
    #[error("access refused: {0}")]
    Access(#[from] AccessError),
    /// The handle does not belong to this `Rma`, or its peer was closed.
    #[error("segment handle is not valid here")]
    InvalidHandle,
    /// The channel to the target failed before the operation completed.
    #[error("target unreachable: {0}")]
    PeerFailed(ChannelError),
    /// The operation is larger than allowed (`len` bytes, at most `max`).
    #[error("operation of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Bytes asked for.
        len: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A blocking helper gave up waiting.
    #[error("timed out waiting for completion")]
    Timeout,
}

/// Why a segment could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Every slot of the export table is taken (`RmaConfig::max_segments`).
    #[error("export table full ({0} segments)")]
    TableFull(usize),
    /// The name is already exported on this node.
    #[error("a segment named {0:?} is already exported")]
    NameTaken(String),
    /// Size zero, or larger than the platform maps.
    #[error("invalid segment size {0}")]
    InvalidSize(u64),
    /// More nodes named in the grants than a segment holds.
    #[error("{0} named grants exceed the limit of {max}", max = crate::rma::rights::GRANTS_MAX)]
    TooManyGrants(usize),
    /// A name longer than [`crate::rma::NAME_MAX`] bytes.
    #[error("segment name longer than {max} bytes", max = crate::rma::NAME_MAX)]
    NameTooLong,
    /// The operating system refused (memfd, mmap).
    #[error("system error: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a segment could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The target refused (unknown name or segment, stale generation, revoked, no rights).
    #[error("import refused: {0}")]
    Access(#[from] AccessError),
    /// The target could not be reached.
    #[error("cannot reach the target: {0}")]
    Connect(#[from] ConnectError),
    /// The channel failed during the import.
    #[error("target failed during import: {0}")]
    PeerFailed(ChannelError),
    /// The target's answer does not follow the protocol.
    #[error("target answered outside the protocol: {0}")]
    Protocol(&'static str),
    /// The peer handle does not belong to this `Rma`.
    #[error("unknown peer")]
    UnknownPeer,
    /// The name is longer than [`crate::rma::NAME_MAX`] bytes.
    #[error("segment name too long")]
    NameTooLong,
    /// No answer in time.
    #[error("timed out")]
    Timeout,
    /// The operating system refused (mapping the segment).
    #[error("system error: {0}")]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_name_nothing() {
        for e in AccessError::ALL {
            assert_eq!(AccessError::from_code(e.code()), Some(e));
            assert_eq!(AccessError::ALL[e.index()], e);
        }
        for code in [0u8, 12, 200, 255] {
            assert_eq!(AccessError::from_code(code), None);
        }
    }
}
