//! Errors, one enum per operation family.

use crate::transport::shm::layout::LayoutError;
use crate::transport::shm::ring::RingError;

/// Why a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nobody listens at that address (the connection was refused).
    #[error("nothing listens at {0}: start the node or server there, or check the address")]
    NoListener(String),
    /// The peer answered with something that is not a ulnet handshake of our version, or
    /// did not prove the cluster secret, or closed the connection during the handshake.
    #[error("handshake refused: {0}")]
    Handshake(&'static str),
    /// The peer accepted the connection but did not finish the handshake in time.
    #[error(
        "{0} accepted the connection but did not finish the handshake in time: it is overloaded, stopped \
         (SIGSTOP, a debugger), or not a ulnet endpoint"
    )]
    HandshakeTimeout(String),
    /// The connection itself could not be made in time (no answer to its SYN).
    #[error("no answer from {0} within {1:?}: the host is down or unreachable, or a firewall drops the connection")]
    Unreachable(String, std::time::Duration),
    /// The address did not resolve.
    #[error("cannot resolve the address {0}: {1}")]
    Resolve(String, #[source] std::io::Error),
    /// The peer's shared mapping does not validate.
    #[error("peer mapping refused: {0}")]
    Layout(#[from] LayoutError),
    /// The configuration asks for an impossible geometry.
    #[error("bad configuration: {0}")]
    Config(&'static str),
    /// Timed out waiting for a peer.
    #[error("timed out waiting for a peer")]
    Timeout,
    /// The operating system refused (socket, memfd, mmap).
    #[error("system error: {0}")]
    Io(#[from] std::io::Error),
    /// One side of a shared-memory rendezvous refused the other (its user, or its proof of
    /// the cluster secret).
    #[error("{0}")]
    Refused(#[from] Refusal),
}

/// Why one side of a shared-memory rendezvous refused the other. The listener tells the
/// connector why (the variant's wire code); a connector refuses a listener on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The connecting process's user (and groups) are not among those the listener admits.
    #[error(
        "refused: peer uid {uid} is not allowed (a listener admits its own user and the uids and \
         gids it is configured to allow: --allow-uid, --allow-gid)"
    )]
    PeerNotAllowed {
        /// The peer's effective user id.
        uid: u32,
        /// The peer's effective group id.
        gid: u32,
    },
    /// The listening process runs as a user we do not trust: another user's process may
    /// have taken the name.
    #[error(
        "refused: the listener runs as uid {uid}, which is neither ours, nor root, nor allowed \
         (another user's process may hold the name; allow it with --allow-uid if expected)"
    )]
    ListenerNotAllowed {
        /// The listener's effective user id.
        uid: u32,
        /// The listener's effective group id.
        gid: u32,
    },
    /// One side failed to prove the cluster secret to the other: their secrets differ.
    #[error("refused: the cluster secret was not proved (one side has a wrong or missing secret)")]
    Secret,
    /// The kernel could not say who the peer is.
    #[error("refused: the peer's credentials could not be read")]
    Unidentified,
}

/// Why a send failed (back-pressure is [`crate::SendOutcome::NoResource`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No such channel on this endpoint.
    #[error("unknown channel")]
    UnknownChannel,
    /// More buffers in the gather list than the transport takes.
    #[error("gather list of {0} buffers exceeds the limit of {1}")]
    TooManyBuffers(usize, usize),
    /// The message is larger than one send can carry; use `post_send`.
    #[error("message of {len} bytes exceeds the single-send limit of {max}; use post_send")]
    TooLarge {
        /// Bytes asked for.
        len: u64,
        /// Largest allowed.
        max: u64,
    },
    /// The channel has failed or closed.
    #[error("channel is down: {0}")]
    ChannelDown(#[from] ChannelError),
    /// The send queue is full.
    #[error("send queue full")]
    QueueFull,
}

/// Why a channel stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The peer closed the channel cleanly; everything it sent was delivered.
    #[error("peer closed the channel")]
    Closed,
    /// The peer vanished (process died, socket reset) without closing.
    #[error("peer failed: {0}")]
    PeerFailed(&'static str),
    /// The peer wrote something that violates the protocol; the channel was shut.
    #[error("protocol violation by peer: {0}")]
    Protocol(String),
}

impl From<RingError> for ChannelError {
    fn from(e: RingError) -> Self {
        ChannelError::Protocol(e.to_string())
    }
}
