//! One TCP channel: length-prefixed frames on one connection, gather sends with `writev`.
//!
//! ```text
//!  frame: | tag u32 | flags u32 | message_len u64 | message_len bytes |
//! ```
//!
//! The tag is the receiver's (agreed in the handshake); a frame with another tag, a length
//! beyond the limit, or unknown flags fails the channel. Messages that fit the receive
//! buffer are delivered whole and in place; larger ones as fragments in order.

use crate::error::{ChannelError, SendError};
use crate::transport::{Capabilities, ReadyProbe, Responder, RmaCapabilities, SendOutcome, Transport, TransportKind};
use crate::{Delivery, GATHER_MAX};
use std::io::{self, IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

/// Largest message a TCP channel carries.
pub const MESSAGE_MAX: u64 = 1 << 30;
const FRAME_HEADER_LEN: usize = 16;
/// Flag: the sender closes the channel; nothing follows.
const FLAG_GOODBYE: u32 = 1;

/// Receive buffer: messages up to this size arrive whole. 256 KiB holds a burst of small
/// messages from one `read` and keeps a large message's fragments big.
const RX_BUFFER: usize = 256 << 10;
/// Bytes of a partly written send kept for later: the rest of one large message at most.
const TX_BACKLOG_MAX: usize = 4 << 20;
/// Messages up to this size are coalesced with their neighbours into one write (at the
/// next poll, wait, flush or close): a burst of small messages costs one system call.
const COALESCE_MESSAGE_MAX: usize = 4 << 10;
/// A coalesced batch is written as soon as it reaches this size.
const COALESCE_FLUSH_BYTES: usize = 32 << 10;

enum RxState {
    Header,
    Body { message_len: u64, delivered: u64 },
}

/// Readiness of a TCP channel: the socket is readable.
struct TcpProbe {
    socket: std::os::fd::OwnedFd,
}

impl ReadyProbe for TcpProbe {
    fn is_ready(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::IN)];
        matches!(rustix::event::poll(&mut fds, 0), Ok(n) if n > 0)
    }
    fn arm(&self) -> bool {
        true
    }
    fn disarm(&self) {}
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.socket.as_fd()]
    }
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }
}

/// The receiving state: a buffer and where we are in the frame stream.
struct TcpRx {
    tag: u32,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    state: RxState,
    peer_said_goodbye: bool,
}

/// The sending state: our peer's tag and what the socket has not taken yet.
struct TcpTx {
    tag: u32,
    backlog: Vec<u8>,
    backlog_pos: usize,
    /// Length and bytes sent of the message being streamed by `send_fragments`.
    streaming: Option<(u64, u64)>,
}

/// [`TcpTx`] with the socket, for sending from inside a delivery.
struct TcpSender<'a> {
    stream: &'a TcpStream,
    tx: &'a mut TcpTx,
}

/// One side of a TCP channel.
pub struct TcpChannel {
    stream: TcpStream,
    probe: Arc<TcpProbe>,
    rx: TcpRx,
    tx: TcpTx,
    failure: Option<ChannelError>,
    /// The peer's node id, from the handshake.
    pub(crate) peer_node: crate::node::NodeId,
}

fn io_failure(e: &io::Error) -> ChannelError {
    tracing::debug!("tcp channel I/O error: {e}");
    ChannelError::PeerFailed("connection reset or broken")
}

impl TcpTx {
    fn header(&self, message_len: u64, flags: u32) -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[..4].copy_from_slice(&self.tag.to_le_bytes());
        h[4..8].copy_from_slice(&flags.to_le_bytes());
        h[8..].copy_from_slice(&message_len.to_le_bytes());
        h
    }

    /// Writes as much of the backlog as the socket takes. `true` when it is empty.
    fn flush_backlog(&mut self, stream: &TcpStream) -> Result<bool, ChannelError> {
        while self.backlog_pos < self.backlog.len() {
            match rustix::io::write(stream, &self.backlog[self.backlog_pos..]) {
                Ok(n) => self.backlog_pos += n,
                Err(rustix::io::Errno::AGAIN) => {
                    // Keep the buffer from growing behind a slow reader.
                    if self.backlog_pos > self.backlog.len() / 2 {
                        self.backlog.drain(..self.backlog_pos);
                        self.backlog_pos = 0;
                    }
                    return Ok(false);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io_failure(&e.into())),
            }
        }
        self.backlog.clear();
        self.backlog_pos = 0;
        Ok(true)
    }

    /// Sends one whole message: what the socket does not take now waits in the backlog.
    fn send_message(&mut self, stream: &TcpStream, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        if gather.len() > GATHER_MAX {
            return Err(SendError::TooManyBuffers(gather.len(), GATHER_MAX));
        }
        let total: usize = gather.iter().map(|b| b.len()).sum();
        if total > TX_BACKLOG_MAX {
            return Err(SendError::TooLarge { len: total as u64, max: TX_BACKLOG_MAX as u64 });
        }
        if self.streaming.is_some() {
            return Ok(SendOutcome::NoResource);
        }
        let header = self.header(total as u64, 0);
        if total <= COALESCE_MESSAGE_MAX {
            let pending = self.backlog.len() - self.backlog_pos;
            if pending + FRAME_HEADER_LEN + total > TX_BACKLOG_MAX && !self.flush_backlog(stream)? {
                return Ok(SendOutcome::NoResource);
            }
            self.backlog.extend_from_slice(&header);
            for piece in gather {
                self.backlog.extend_from_slice(piece);
            }
            if self.backlog.len() - self.backlog_pos >= COALESCE_FLUSH_BYTES {
                self.flush_backlog(stream)?;
            }
            return Ok(SendOutcome::Done);
        }
        if !self.flush_backlog(stream)? {
            return Ok(SendOutcome::NoResource);
        }
        let mut pieces: [&[u8]; GATHER_MAX + 1] = [&[]; GATHER_MAX + 1];
        pieces[0] = &header;
        pieces[1..=gather.len()].copy_from_slice(gather);
        let written = write_gather(stream, &pieces[..=gather.len()])?;
        if written == 0 {
            return Ok(SendOutcome::NoResource);
        }
        let mut skip = written;
        for piece in &pieces[..=gather.len()] {
            if skip >= piece.len() {
                skip -= piece.len();
            } else {
                self.backlog.extend_from_slice(&piece[skip..]);
                skip = 0;
            }
        }
        Ok(SendOutcome::Done)
    }
}

/// `writev` of `pieces`; returns bytes written (0 when the socket is full).
fn write_gather(stream: &TcpStream, pieces: &[&[u8]]) -> Result<usize, ChannelError> {
    let mut iov = [IoSlice::new(&[]); GATHER_MAX + 1];
    let mut n = 0;
    for p in pieces.iter().filter(|p| !p.is_empty()) {
        iov[n] = IoSlice::new(p);
        n += 1;
    }
    loop {
        match rustix::io::writev(stream, &iov[..n]) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::AGAIN) => return Ok(0),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io_failure(&e.into())),
        }
    }
}

impl Responder for TcpSender<'_> {
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.tx.send_message(self.stream, gather)
    }
}

impl TcpRx {
    /// Reads what the socket has into the free end of the buffer.
    fn fill(&mut self, stream: &TcpStream) -> Result<(), ChannelError> {
        if self.start > 0 && (self.end == self.buf.len() || self.start == self.end) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Ok(());
        }
        match (&mut &*stream).read(&mut self.buf[self.end..]) {
            Ok(0) => Err(if self.peer_said_goodbye {
                ChannelError::Closed
            } else {
                ChannelError::PeerFailed("connection closed without goodbye")
            }),
            Ok(n) => {
                self.end += n;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(io_failure(&e)),
        }
    }

    /// Parses and delivers up to `max` frames or fragments, reading once when short.
    fn deliver(
        &mut self,
        stream: &TcpStream,
        tx: &mut TcpTx,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError> {
        let mut delivered = 0;
        let mut filled = false;
        while delivered < max {
            let available = self.end - self.start;
            match self.state {
                RxState::Header => {
                    if available < FRAME_HEADER_LEN {
                        if filled {
                            break;
                        }
                        self.fill(stream)?;
                        filled = true;
                        continue;
                    }
                    let h = &self.buf[self.start..self.start + FRAME_HEADER_LEN];
                    let tag = u32::from_le_bytes(h[..4].try_into().expect("4 bytes"));
                    let flags = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
                    let message_len = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
                    if tag != self.tag || flags & !FLAG_GOODBYE != 0 || message_len > MESSAGE_MAX {
                        let why = format!("bad frame header (tag {tag:#x}, flags {flags:#x}, length {message_len})");
                        return Err(ChannelError::Protocol(why));
                    }
                    self.start += FRAME_HEADER_LEN;
                    if flags & FLAG_GOODBYE != 0 {
                        self.peer_said_goodbye = true;
                        continue;
                    }
                    if message_len == 0 {
                        deliver(Delivery { data: &[], message_len: 0, offset: 0 }, &mut TcpSender { stream, tx });
                        delivered += 1;
                        continue;
                    }
                    self.state = RxState::Body { message_len, delivered: 0 };
                }
                RxState::Body { message_len, delivered: done } => {
                    let left = message_len - done;
                    let fits_whole = done == 0 && message_len <= (RX_BUFFER - FRAME_HEADER_LEN) as u64;
                    let ready = if fits_whole { available as u64 >= message_len } else { available > 0 };
                    if !ready {
                        if filled {
                            break;
                        }
                        if fits_whole && self.buf.len() - self.start < message_len as usize {
                            self.buf.copy_within(self.start..self.end, 0);
                            self.end -= self.start;
                            self.start = 0;
                        }
                        self.fill(stream)?;
                        filled = true;
                        continue;
                    }
                    let take = (available as u64).min(left) as usize;
                    let data = &self.buf[self.start..self.start + take];
                    deliver(Delivery { data, message_len, offset: done }, &mut TcpSender { stream, tx });
                    delivered += 1;
                    self.start += take;
                    let done = done + take as u64;
                    self.state = if done == message_len {
                        RxState::Header
                    } else {
                        RxState::Body { message_len, delivered: done }
                    };
                }
            }
        }
        Ok(delivered)
    }
}

impl TcpChannel {
    pub(crate) fn new(stream: TcpStream, rx_tag: u32, tx_tag: u32) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let probe = Arc::new(TcpProbe { socket: stream.as_fd().try_clone_to_owned()? });
        Ok(Self {
            stream,
            probe,
            rx: TcpRx {
                tag: rx_tag,
                buf: vec![0; RX_BUFFER],
                start: 0,
                end: 0,
                state: RxState::Header,
                peer_said_goodbye: false,
            },
            tx: TcpTx { tag: tx_tag, backlog: Vec::new(), backlog_pos: 0, streaming: None },
            failure: None,
            peer_node: crate::node::NodeId::UNKNOWN,
        })
    }

    fn fail(&mut self, e: ChannelError) -> ChannelError {
        match e {
            ChannelError::Closed => tracing::debug!("tcp channel closed by peer"),
            _ => tracing::warn!("tcp channel failed: {e}"),
        }
        self.failure = Some(e.clone());
        e
    }

    fn check_open(&self) -> Result<(), SendError> {
        match &self.failure {
            Some(e) => Err(SendError::ChannelDown(e.clone())),
            None => Ok(()),
        }
    }
}

impl Transport for TcpChannel {
    fn caps(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::Tcp,
            inline_max: 0,
            fragment_max: RX_BUFFER - FRAME_HEADER_LEN,
            send_max: TX_BACKLOG_MAX,
            message_max: MESSAGE_MAX,
            gather_max: GATHER_MAX,
            reliable_ordered: true,
            zero_copy_receive: true,
            pack_in_place: false,
            rma: RmaCapabilities::over_messages(false, RX_BUFFER - FRAME_HEADER_LEN, TX_BACKLOG_MAX),
        }
    }

    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.check_open()?;
        match self.tx.send_message(&self.stream, gather) {
            Err(SendError::ChannelDown(e)) => Err(SendError::ChannelDown(self.fail(e))),
            other => other,
        }
    }

    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        self.check_open()?;
        if message_len > MESSAGE_MAX {
            return Err(SendError::TooLarge { len: message_len, max: MESSAGE_MAX });
        }
        if !self.tx.flush_backlog(&self.stream).map_err(|e| self.fail(e))? {
            return Ok(0);
        }
        if self.tx.streaming.is_none() {
            assert_eq!(offset, 0, "a streamed message starts at offset 0");
            let header = self.tx.header(message_len, 0);
            self.tx.backlog.extend_from_slice(&header);
            self.tx.streaming = Some((message_len, 0));
            if !self.tx.flush_backlog(&self.stream).map_err(|e| self.fail(e))? {
                return Ok(0);
            }
        }
        let (len, sent) = self.tx.streaming.expect("set above");
        assert_eq!((len, sent), (message_len, offset), "fragments of one message, in order");
        let n = write_gather(&self.stream, &[data]).map_err(|e| self.fail(e))?;
        let sent = sent + n as u64;
        self.tx.streaming = if sent == message_len { None } else { Some((message_len, sent)) };
        Ok(n)
    }

    fn poll_recv(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        if !self.tx.backlog.is_empty() {
            self.tx.flush_backlog(&self.stream).map_err(|e| self.fail(e))?;
        }
        let delivered = match self.rx.deliver(&self.stream, &mut self.tx, max, deliver) {
            Ok(n) => n,
            Err(e) => return Err(self.fail(e)),
        };
        // Replies sent from the handlers of this batch go out together.
        if !self.tx.backlog.is_empty() {
            self.tx.flush_backlog(&self.stream).map_err(|e| self.fail(e))?;
        }
        Ok(delivered)
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        if self.failure.is_some() || self.tx.backlog.is_empty() {
            return Ok(true);
        }
        self.tx.flush_backlog(&self.stream).map_err(|e| self.fail(e))
    }

    fn peer_node(&self) -> Option<crate::node::NodeId> {
        Some(self.peer_node)
    }

    fn probe(&self) -> Arc<dyn ReadyProbe> {
        self.probe.clone()
    }

    fn receive_backlog(&self) -> (u64, u64) {
        ((self.rx.end - self.rx.start) as u64, RX_BUFFER as u64)
    }

    fn abort(&mut self) {
        // A zero linger makes closing the socket reset the connection: the kernel drops the
        // unsent and unacknowledged bytes instead of retransmitting them, with its backed-off
        // timer, once the peer is reachable again.
        if let Err(e) = rustix::net::sockopt::set_socket_linger(&self.stream, Some(std::time::Duration::ZERO)) {
            tracing::debug!("tcp channel abort: cannot set a zero linger: {e}");
        }
        self.failure = Some(ChannelError::PeerFailed("aborted"));
    }

    fn close(&mut self) {
        if self.failure.is_none() {
            let goodbye = self.tx.header(0, FLAG_GOODBYE);
            let _ = self.stream.set_nonblocking(false);
            let _ = self.stream.set_write_timeout(Some(std::time::Duration::from_secs(1)));
            let _ = io::Write::write_all(&mut self.stream, &self.tx.backlog[self.tx.backlog_pos..]);
            let _ = io::Write::write_all(&mut self.stream, &goodbye);
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
            linger(&self.stream);
            self.failure = Some(ChannelError::Closed);
        }
    }
}

/// How long a closed channel's socket keeps reading (and dropping) what the peer still
/// sends, waiting for the peer to close its side after our goodbye.
const CLOSE_LINGER_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps the socket open on a thread of its own, reading and dropping input until the peer
/// closes its side (it has seen our goodbye) or [`CLOSE_LINGER_MAX`] passes. Closing a
/// socket with unread input makes the kernel send a reset, which can overtake the goodbye:
/// a peer still streaming to us would see a failure instead of a clean close. On a thread,
/// so that closing never waits for a slow or unreachable peer.
fn linger(stream: &TcpStream) {
    let Ok(stream) = stream.try_clone() else { return };
    let _ = std::thread::Builder::new().name("tcp-linger".into()).spawn(move || {
        let mut stream = stream;
        let deadline = std::time::Instant::now() + CLOSE_LINGER_MAX;
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match io::Read::read(&mut stream, &mut scratch) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
}

impl Drop for TcpChannel {
    fn drop(&mut self) {
        self.close();
    }
}
