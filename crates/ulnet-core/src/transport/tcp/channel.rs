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
use crate::transport::{Capabilities, ReadyProbe, SendOutcome, Transport, TransportKind};
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
}

/// One side of a TCP channel.
pub struct TcpChannel {
    stream: TcpStream,
    probe: Arc<TcpProbe>,
    rx_tag: u32,
    tx_tag: u32,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    rx_state: RxState,
    peer_said_goodbye: bool,
    tx_backlog: Vec<u8>,
    tx_backlog_pos: usize,
    /// Length and bytes sent of the message being streamed by `send_fragments`.
    streaming: Option<(u64, u64)>,
    failure: Option<ChannelError>,
}

impl TcpChannel {
    pub(crate) fn new(stream: TcpStream, rx_tag: u32, tx_tag: u32) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let probe = Arc::new(TcpProbe { socket: stream.as_fd().try_clone_to_owned()? });
        Ok(Self {
            stream,
            probe,
            rx_tag,
            tx_tag,
            rx: vec![0; RX_BUFFER],
            rx_start: 0,
            rx_end: 0,
            rx_state: RxState::Header,
            peer_said_goodbye: false,
            tx_backlog: Vec::new(),
            tx_backlog_pos: 0,
            streaming: None,
            failure: None,
        })
    }

    fn header(&self, message_len: u64, flags: u32) -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[..4].copy_from_slice(&self.tx_tag.to_le_bytes());
        h[4..8].copy_from_slice(&flags.to_le_bytes());
        h[8..].copy_from_slice(&message_len.to_le_bytes());
        h
    }

    fn fail(&mut self, e: ChannelError) -> ChannelError {
        match e {
            ChannelError::Closed => tracing::debug!("tcp channel closed by peer"),
            _ => tracing::warn!("tcp channel failed: {e}"),
        }
        self.failure = Some(e.clone());
        e
    }

    fn io_failure(e: &io::Error) -> ChannelError {
        tracing::debug!("tcp channel I/O error: {e}");
        ChannelError::PeerFailed("connection reset or broken")
    }

    /// Writes as much of the backlog as the socket takes. `true` when it is empty.
    fn flush_backlog(&mut self) -> Result<bool, ChannelError> {
        while self.tx_backlog_pos < self.tx_backlog.len() {
            match rustix::io::write(&self.stream, &self.tx_backlog[self.tx_backlog_pos..]) {
                Ok(n) => self.tx_backlog_pos += n,
                Err(rustix::io::Errno::AGAIN) => return Ok(false),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Self::io_failure(&e.into())),
            }
        }
        self.tx_backlog.clear();
        self.tx_backlog_pos = 0;
        Ok(true)
    }

    /// `writev` of `pieces`; returns bytes written (0 when the socket is full).
    fn write_gather(&self, pieces: &[&[u8]]) -> Result<usize, ChannelError> {
        let iov: Vec<IoSlice<'_>> = pieces.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
        loop {
            match rustix::io::writev(&self.stream, &iov) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::AGAIN) => return Ok(0),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Self::io_failure(&e.into())),
            }
        }
    }

    fn check_open(&mut self) -> Result<(), SendError> {
        match &self.failure {
            Some(e) => Err(SendError::ChannelDown(e.clone())),
            None => Ok(()),
        }
    }

    /// Reads what the socket has into the free end of the receive buffer.
    fn fill(&mut self) -> Result<(), ChannelError> {
        if self.rx_start > 0 && (self.rx_end == self.rx.len() || self.rx_start == self.rx_end) {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        if self.rx_end == self.rx.len() {
            return Ok(());
        }
        match self.stream.read(&mut self.rx[self.rx_end..]) {
            Ok(0) => Err(if self.peer_said_goodbye {
                ChannelError::Closed
            } else {
                ChannelError::PeerFailed("connection closed without goodbye")
            }),
            Ok(n) => {
                self.rx_end += n;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(Self::io_failure(&e)),
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
        }
    }

    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        if gather.len() > GATHER_MAX {
            return Err(SendError::TooManyBuffers(gather.len(), GATHER_MAX));
        }
        self.check_open()?;
        let total: usize = gather.iter().map(|b| b.len()).sum();
        if total > TX_BACKLOG_MAX {
            return Err(SendError::TooLarge { len: total as u64, max: TX_BACKLOG_MAX as u64 });
        }
        if self.streaming.is_some() || !self.flush_backlog().map_err(|e| self.fail(e))? {
            return Ok(SendOutcome::NoResource);
        }
        let header = self.header(total as u64, 0);
        let mut pieces: [&[u8]; GATHER_MAX + 1] = [&[]; GATHER_MAX + 1];
        pieces[0] = &header;
        pieces[1..=gather.len()].copy_from_slice(gather);
        let written = self.write_gather(&pieces[..=gather.len()]).map_err(|e| self.fail(e))?;
        if written == 0 {
            return Ok(SendOutcome::NoResource);
        }
        // Keep what the socket did not take: the message is sent whole or not at all.
        let mut skip = written;
        for piece in &pieces[..=gather.len()] {
            if skip >= piece.len() {
                skip -= piece.len();
            } else {
                self.tx_backlog.extend_from_slice(&piece[skip..]);
                skip = 0;
            }
        }
        Ok(SendOutcome::Done)
    }

    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        self.check_open()?;
        if message_len > MESSAGE_MAX {
            return Err(SendError::TooLarge { len: message_len, max: MESSAGE_MAX });
        }
        if !self.flush_backlog().map_err(|e| self.fail(e))? {
            return Ok(0);
        }
        if self.streaming.is_none() {
            assert_eq!(offset, 0, "a streamed message starts at offset 0");
            let header = self.header(message_len, 0);
            self.tx_backlog.extend_from_slice(&header);
            self.streaming = Some((message_len, 0));
            if !self.flush_backlog().map_err(|e| self.fail(e))? {
                return Ok(0);
            }
        }
        let (len, sent) = self.streaming.expect("set above");
        assert_eq!((len, sent), (message_len, offset), "fragments of one message, in order");
        let n = self.write_gather(&[data]).map_err(|e| self.fail(e))?;
        let sent = sent + n as u64;
        self.streaming = if sent == message_len { None } else { Some((message_len, sent)) };
        Ok(n)
    }

    fn poll_recv(&mut self, max: usize, deliver: &mut dyn FnMut(Delivery<'_>)) -> Result<usize, ChannelError> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        if !self.tx_backlog.is_empty() {
            self.flush_backlog().map_err(|e| self.fail(e))?;
        }
        let mut delivered = 0;
        let mut filled = false;
        while delivered < max {
            let available = self.rx_end - self.rx_start;
            match self.rx_state {
                RxState::Header => {
                    if available < FRAME_HEADER_LEN {
                        if filled {
                            break;
                        }
                        if let Err(e) = self.fill() {
                            return Err(self.fail(e));
                        }
                        filled = true;
                        continue;
                    }
                    let h = &self.rx[self.rx_start..self.rx_start + FRAME_HEADER_LEN];
                    let tag = u32::from_le_bytes(h[..4].try_into().expect("4 bytes"));
                    let flags = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
                    let message_len = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
                    if tag != self.rx_tag || flags & !FLAG_GOODBYE != 0 || message_len > MESSAGE_MAX {
                        let why = format!("bad frame header (tag {tag:#x}, flags {flags:#x}, length {message_len})");
                        return Err(self.fail(ChannelError::Protocol(why)));
                    }
                    self.rx_start += FRAME_HEADER_LEN;
                    if flags & FLAG_GOODBYE != 0 {
                        self.peer_said_goodbye = true;
                        continue;
                    }
                    if message_len == 0 {
                        deliver(Delivery { data: &[], message_len: 0, offset: 0 });
                        delivered += 1;
                        continue;
                    }
                    self.rx_state = RxState::Body { message_len, delivered: 0 };
                }
                RxState::Body { message_len, delivered: done } => {
                    let left = message_len - done;
                    let fits_whole = done == 0 && message_len <= (RX_BUFFER - FRAME_HEADER_LEN) as u64;
                    let ready = if fits_whole { available as u64 >= message_len } else { available > 0 };
                    if !ready {
                        if filled {
                            break;
                        }
                        if fits_whole && self.rx.len() - self.rx_start < message_len as usize {
                            self.rx.copy_within(self.rx_start..self.rx_end, 0);
                            self.rx_end -= self.rx_start;
                            self.rx_start = 0;
                        }
                        if let Err(e) = self.fill() {
                            return Err(self.fail(e));
                        }
                        filled = true;
                        continue;
                    }
                    let take = (available as u64).min(left) as usize;
                    deliver(Delivery {
                        data: &self.rx[self.rx_start..self.rx_start + take],
                        message_len,
                        offset: done,
                    });
                    delivered += 1;
                    self.rx_start += take;
                    let done = done + take as u64;
                    self.rx_state = if done == message_len {
                        RxState::Header
                    } else {
                        RxState::Body { message_len, delivered: done }
                    };
                }
            }
        }
        Ok(delivered)
    }

    fn probe(&self) -> Arc<dyn ReadyProbe> {
        self.probe.clone()
    }

    fn receive_backlog(&self) -> (u64, u64) {
        ((self.rx_end - self.rx_start) as u64, RX_BUFFER as u64)
    }

    fn close(&mut self) {
        if self.failure.is_none() {
            let goodbye = self.header(0, FLAG_GOODBYE);
            let _ = self.stream.set_nonblocking(false);
            let _ = self.stream.set_write_timeout(Some(std::time::Duration::from_secs(1)));
            let _ = io::Write::write_all(&mut self.stream, &self.tx_backlog[self.tx_backlog_pos..]);
            let _ = io::Write::write_all(&mut self.stream, &goodbye);
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
            self.failure = Some(ChannelError::Closed);
        }
    }
}

impl Drop for TcpChannel {
    fn drop(&mut self) {
        self.close();
    }
}
