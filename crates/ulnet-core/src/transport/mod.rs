//! Transports: what moves descriptors and data between two endpoints.
//!
//! Each transport declares what it can do ([`Capabilities`]) so that upper layers choose
//! (inline or buffered sends, fragment sizes, one-sided operations) instead of guessing.
//! A [`Transport`] value is one side of one channel.

pub mod shm;
pub mod tcp;
pub mod udp;

use crate::error::{ChannelError, SendError};
use crate::Delivery;
use std::os::fd::BorrowedFd;

/// Which transport a channel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Shared memory between processes on one host.
    Shm,
    /// One TCP connection per channel.
    Tcp,
    /// Reliable, flow-controlled datagrams over UDP, one connected socket per channel.
    Udp,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Udp => "udp",
        })
    }
}

/// What a transport can do, and its size limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The transport.
    pub kind: TransportKind,
    /// Largest message carried inline in a descriptor (no buffer, no second copy).
    pub inline_max: usize,
    /// Largest fragment: messages up to this size arrive in one piece.
    pub fragment_max: usize,
    /// Largest message [`Transport::send`] takes in one call; larger ones are streamed.
    pub send_max: usize,
    /// Largest message at all.
    pub message_max: u64,
    /// Most buffers in one gather list.
    pub gather_max: usize,
    /// Delivery is reliable and in order per channel.
    pub reliable_ordered: bool,
    /// Received data is handed over in place, without a copy.
    pub zero_copy_receive: bool,
    /// [`Transport::send_packed`] writes the message straight into the transport's send
    /// buffer (else it packs into a temporary and sends that: a copy more than `send`).
    pub pack_in_place: bool,
    /// What one-sided remote memory access (`rma`) gets from this transport.
    pub rma: RmaCapabilities,
}

/// What a transport offers one-sided remote memory access, declared as UCX transports
/// declare their put/get/atomic support, so that the RMA layer sizes its requests from it
/// and applications can see which path their operations take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmaCapabilities {
    /// Both ends share this host's memory: a segment the peer exports can be mapped into
    /// this process and accessed with plain loads, stores and atomics, the owner's process
    /// taking no part. Otherwise every operation is a message that the target's engine
    /// checks and applies (atomics included, so they stay atomic with respect to the
    /// owner's own accesses).
    pub map_segments: bool,
    /// Largest RMA request or reply carried in one message, header included, so that it
    /// arrives in one piece: longer puts and gets are split into requests of this size.
    pub request_max: usize,
}

impl RmaCapabilities {
    /// RMA over a channel whose messages arrive whole up to `fragment_max` and are taken
    /// by one send up to `send_max`.
    pub(crate) fn over_messages(map_segments: bool, fragment_max: usize, send_max: usize) -> Self {
        Self { map_segments, request_max: fragment_max.min(send_max) }
    }
}

/// The outcome of a send that did not fail. Back-pressure is an outcome, not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "NoResource means nothing was sent"]
pub enum SendOutcome {
    /// The message is on its way; the caller's buffers may be reused.
    Done,
    /// Queued; a completion with this token follows when the caller's data is no longer needed.
    InProgress(u64),
    /// No room right now (ring full or no free buffers); nothing was sent. Retry after progress.
    NoResource,
}

/// Tells, without consuming anything, whether a channel has something for its owner, and
/// lets a waiter sleep until it does.
///
/// Sleeping follows a fixed order: [`ReadyProbe::arm`] every probe (which fails if data
/// arrived meanwhile), sleep on their [`ReadyProbe::wait_fds`], then
/// [`ReadyProbe::disarm`] every probe.
pub trait ReadyProbe: Send + Sync {
    /// Whether something is waiting (cheap; no system call).
    fn is_ready(&self) -> bool;
    /// Asks the peer to ring the doorbell on its next send. Returns `false` (and cancels)
    /// when something arrived meanwhile, so the caller must not sleep.
    fn arm(&self) -> bool;
    /// Cancels [`ReadyProbe::arm`] after waking, clears the doorbell, and makes the
    /// channel check its peer's liveness at its next empty poll.
    fn disarm(&self);
    /// Descriptors to sleep on (readable when the peer rang or hung up).
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>>;
    /// A descriptor that is readable exactly while the channel has something to receive or
    /// its peer hung up (level-triggered, no arming needed), if the transport has one: the
    /// endpoint then watches the channel with one epoll set for all such channels instead
    /// of probing it on every poll.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Sends on the channel a delivery came from, while that delivery is still borrowed: a
/// server answers a request it reads in place, with no copy of the request and no queue.
pub trait Responder {
    /// Sends one message whole, or not at all (`NoResource`), like [`Transport::send`].
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError>;
}

/// One side of one channel.
pub trait Transport: Send {
    /// What this transport can do.
    fn caps(&self) -> Capabilities;

    /// Sends one message given as a gather list of up to `gather_max` buffers, whole or not
    /// at all. Messages larger than `send_max` must go through [`Transport::send_fragments`].
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError>;

    /// Sends one message of `len` bytes (at most `fragment_max`) that `pack` writes, whole
    /// or not at all: UCX's send with a pack callback, for data that is scattered in the
    /// caller's memory (records picked out of a buffer), which `pack` gathers straight into
    /// the transport's buffer where it has one ([`Capabilities::pack_in_place`]) instead of
    /// into a staging buffer of the caller's that `send` would copy again. Transports
    /// without one pack into a temporary and send it; then `pack` may have run for a
    /// message that was refused (`NoResource`).
    fn send_packed(&mut self, len: usize, pack: &mut dyn FnMut(&mut [u8])) -> Result<SendOutcome, SendError> {
        let mut message = vec![0u8; len];
        pack(&mut message);
        self.send(&[&message])
    }

    /// Streams part of a large message: sends as many whole fragments of `data` (which
    /// starts at `offset` of a message of `message_len` bytes) as resources allow and
    /// returns the number of bytes sent. Fragments of one message must not be interleaved
    /// with other sends on the channel.
    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError>;

    /// Delivers up to `max` received messages or fragments to `deliver`, in order, with a
    /// [`Responder`] that sends on this channel while the delivery is still held in place.
    /// Returns how many were delivered; `Err` once the channel has failed or closed and
    /// everything published before that has been delivered.
    fn poll_recv(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError>;

    /// Writes what earlier sends left queued in user space (TCP coalesces small messages
    /// and writes them at the next poll). `Ok(true)` when nothing is left.
    fn flush(&mut self) -> Result<bool, ChannelError> {
        Ok(true)
    }

    /// The channel's readiness probe, shared with completion queues and waiters.
    fn probe(&self) -> std::sync::Arc<dyn ReadyProbe>;

    /// The node at the other end, when the transport learned it (in its handshake).
    fn peer_node(&self) -> Option<crate::node::NodeId> {
        None
    }

    /// Bytes waiting in the receive queue (a lower bound) and its capacity, for the
    /// "almost full" condition.
    fn receive_backlog(&self) -> (u64, u64);

    /// Closes the channel cleanly: the peer receives everything sent so far, then `Closed`.
    fn close(&mut self);

    /// Drops the channel at once, discarding what it has not delivered: for a channel whose
    /// peer was unreachable, which holds messages that are stale by now and may be stuck in
    /// the transport's own retransmission backoff. The peer sees a failure, not `Closed`.
    /// Transports without such a queue close cleanly.
    fn abort(&mut self) {
        self.close();
    }
}
