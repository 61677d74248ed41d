//! The socket driver of one UDP channel: a connected, non-blocking socket, batched
//! `sendmmsg`/`recvmmsg`, the wall clock, and a timerfd so that sleepers wake for the
//! protocol's timers.
//!
//! Who drives retransmission when the application does not poll? Nobody but the
//! application, as in UCX (`ucp_worker_progress`) and U-Net Active Messages: the protocol
//! makes progress inside [`Endpoint::poll`](crate::Endpoint::poll), sends, flushes and
//! [`Endpoint::wait`](crate::Endpoint::wait). There is no hidden thread, so there are no
//! locks on the data path. A waiting application is woken for the protocol's deadlines
//! (retransmission, delayed acks, keep-alives) by the channel's timerfd among the wait
//! descriptors, and `wait` returns so that its next poll runs them. An application that
//! neither polls nor waits for longer than the peer's `peer_timeout` will be declared
//! failed by its peer; one that stops for less only stalls its channels.

use super::conn::{Connection, Datagram, UdpCounters};
use crate::error::{ChannelError, SendError};
use crate::sys::udp::{recv_batch, send_batch, BATCH_MAX};
use crate::transport::{Capabilities, ReadyProbe, Responder, RmaCapabilities, SendOutcome, Transport, TransportKind};
use crate::{Delivery, GATHER_MAX};
use std::net::UdpSocket;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest control packet (handshake, ack, probe) written outside the send slots.
const CONTROL_MAX: usize = 256;
const _: () = assert!(
    super::wire::HEADER_LEN + super::wire::CHALLENGE_BODY_LEN <= CONTROL_MAX
        && super::wire::ACK_PACKET_LEN <= CONTROL_MAX,
    "control packets fit their buffers"
);

/// Bytes one `recvmmsg` takes at most (with 64 KiB datagrams, 4 of them; with
/// 1,472-byte ones the whole batch). The checksum pass reads each datagram right after the
/// kernel copied it in: a batch of 32 × 64 KiB is all of a 2 MiB second-level cache, so the
/// first datagrams were evicted before they were checked; 256 KiB stays there with the
/// rest of the working set. The system calls saved by larger batches are nothing at this
/// size (one per 256 KiB).
const RECEIVE_BATCH_BYTES: usize = 256 << 10;

/// Datagrams the receive loop takes per poll of a channel, over several batches (so one
/// busy channel cannot starve the others of an endpoint).
const RECEIVE_PER_POLL: usize = 4 * BATCH_MAX;

/// A datagram waiting for `sendmmsg`.
#[derive(Clone, Copy)]
enum Queued {
    /// In control buffer `.0`, `.1` bytes.
    Buffer(usize, usize),
    /// The data packet in the send slot of this sequence number.
    Slot(u64),
}

/// Drop and activity counters shared by an endpoint's UDP listener and channels, and the
/// number of its open channels, which share its receive budget.
#[derive(Debug, Default)]
pub struct UdpStats {
    fields: [AtomicU64; 15],
    open_channels: AtomicU64,
}

impl UdpStats {
    /// UDP channels of the endpoint that are neither failed nor closed: each grants its
    /// peer `credit_bytes / open_channels`.
    pub fn open_channels(&self) -> u64 {
        self.open_channels.load(Ordering::Relaxed)
    }

    fn as_array(c: &UdpCounters) -> [u64; 15] {
        [
            c.truncated,
            c.malformed,
            c.wrong_version,
            c.bad_checksum,
            c.stranger,
            c.wrong_secret,
            c.replayed,
            c.overrun,
            c.packets_sent,
            c.retransmits,
            c.timeouts,
            c.packets_received,
            c.acks_sent,
            c.credit_stalls,
            c.credit_blocked_us,
        ]
    }

    /// Adds what changed between `before` and `now`.
    pub(crate) fn add_delta(&self, before: &UdpCounters, now: &UdpCounters) {
        let (b, n) = (Self::as_array(before), Self::as_array(now));
        for i in 0..15 {
            if n[i] != b[i] {
                self.fields[i].fetch_add(n[i] - b[i], Ordering::Relaxed);
            }
        }
    }

    /// The totals so far.
    pub fn snapshot(&self) -> UdpCounters {
        let f: Vec<u64> = self.fields.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        UdpCounters {
            truncated: f[0],
            malformed: f[1],
            wrong_version: f[2],
            bad_checksum: f[3],
            stranger: f[4],
            wrong_secret: f[5],
            replayed: f[6],
            overrun: f[7],
            packets_sent: f[8],
            retransmits: f[9],
            timeouts: f[10],
            packets_received: f[11],
            acks_sent: f[12],
            credit_stalls: f[13],
            credit_blocked_us: f[14],
        }
    }
}

/// Readiness of a UDP channel: datagrams waiting on the socket, or a protocol deadline
/// passed (the timerfd fires for sleepers).
struct UdpProbe {
    socket: OwnedFd,
    timer: OwnedFd,
    base: Instant,
    /// Next protocol deadline in nanoseconds after `base`; 0 when none.
    deadline_ns: AtomicU64,
}

impl UdpProbe {
    fn deadline(&self) -> Option<Instant> {
        match self.deadline_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }

    fn set_deadline(&self, t: Option<Instant>) {
        let ns = t.map_or(0, |t| (t.saturating_duration_since(self.base).as_nanos() as u64).max(1));
        self.deadline_ns.store(ns, Ordering::Relaxed);
    }

    fn socket_readable(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::IN)];
        matches!(rustix::event::poll(&mut fds, 0), Ok(n) if n > 0)
    }

    fn set_timer(&self, after: Option<Duration>) {
        let value = match after {
            Some(d) => {
                let d = d.max(Duration::from_nanos(1));
                rustix::time::Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ }
            }
            None => rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 },
        };
        let spec =
            rustix::time::Itimerspec { it_interval: rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 }, it_value: value };
        if let Err(e) = rustix::time::timerfd_settime(&self.timer, rustix::time::TimerfdTimerFlags::empty(), &spec) {
            tracing::warn!("udp: timerfd_settime failed: {e}");
        }
    }
}

impl ReadyProbe for UdpProbe {
    fn is_ready(&self) -> bool {
        self.deadline().is_some_and(|t| t <= Instant::now()) || self.socket_readable()
    }

    fn arm(&self) -> bool {
        match self.deadline() {
            Some(t) => {
                let now = Instant::now();
                if t <= now {
                    return false;
                }
                self.set_timer(Some(t - now));
            }
            None => self.set_timer(None),
        }
        true
    }

    fn disarm(&self) {
        self.set_timer(None);
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.timer, &mut buf);
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.socket.as_fd(), self.timer.as_fd()]
    }
}

/// One side of a UDP channel: the protocol machine bound to a connected socket.
pub struct UdpChannel {
    socket: UdpSocket,
    conn: Connection,
    probe: Arc<UdpProbe>,
    rx_batch: Vec<Vec<u8>>,
    truncated: [bool; BATCH_MAX],
    /// Buffers for control packets (acks, probes, handshake); data packets stay in their
    /// send slots.
    tx_batch: Vec<Vec<u8>>,
    /// Datagrams to send, `tx_start..tx_end` not yet taken by the kernel.
    tx_queue: [Queued; BATCH_MAX],
    tx_start: usize,
    tx_end: usize,
    stats: Arc<UdpStats>,
    reported: UdpCounters,
    /// Whether this channel counts in `stats.open_channels` (until it fails or closes).
    counted_open: bool,
    linger: Duration,
    receive_datagram_max: usize,
}

impl UdpChannel {
    pub(crate) fn new(
        socket: UdpSocket,
        conn: Connection,
        stats: Arc<UdpStats>,
        linger: Duration,
        receive_datagram_max: usize,
    ) -> std::io::Result<Self> {
        socket.set_nonblocking(true)?;
        let timer = rustix::time::timerfd_create(
            rustix::time::TimerfdClockId::Monotonic,
            rustix::time::TimerfdFlags::CLOEXEC | rustix::time::TimerfdFlags::NONBLOCK,
        )?;
        let probe = Arc::new(UdpProbe {
            socket: socket.as_fd().try_clone_to_owned()?,
            timer,
            base: Instant::now(),
            deadline_ns: AtomicU64::new(0),
        });
        let mut channel = Self {
            socket,
            probe,
            rx_batch: (0..BATCH_MAX).map(|_| Vec::with_capacity(receive_datagram_max)).collect(),
            truncated: [false; BATCH_MAX],
            tx_batch: (0..BATCH_MAX).map(|_| vec![0u8; CONTROL_MAX]).collect(),
            tx_queue: [Queued::Buffer(0, 0); BATCH_MAX],
            tx_start: 0,
            tx_end: 0,
            stats,
            reported: *conn.counters(),
            counted_open: true,
            conn,
            linger,
            receive_datagram_max,
        };
        channel.stats.open_channels.fetch_add(1, Ordering::Relaxed);
        channel.transmit(Instant::now());
        channel.update_probe();
        Ok(channel)
    }

    /// Leaves the endpoint's receive budget to its other channels, once.
    fn stop_counting_open(&mut self) {
        if std::mem::take(&mut self.counted_open) {
            self.stats.open_channels.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// What this channel's protocol machine dropped and did.
    pub fn counters(&self) -> UdpCounters {
        *self.conn.counters()
    }

    /// Sends what the machine has to send, in batches, keeping what the kernel refuses
    /// for the next call. Data packets go straight from their send slots (no copy).
    fn transmit(&mut self, now: Instant) {
        loop {
            if self.tx_start == self.tx_end {
                self.tx_start = 0;
                self.tx_end = 0;
                let mut buffers = 0;
                while self.tx_end < BATCH_MAX {
                    let queued = match self.conn.poll_transmit_in_place(now, &mut self.tx_batch[buffers]) {
                        Some(Datagram::Written(n)) => {
                            buffers += 1;
                            Queued::Buffer(buffers - 1, n)
                        }
                        Some(Datagram::InSlot(seq)) => Queued::Slot(seq),
                        None => break,
                    };
                    self.tx_queue[self.tx_end] = queued;
                    self.tx_end += 1;
                }
                if self.tx_end == 0 {
                    return;
                }
            }
            let mut slices: [&[u8]; BATCH_MAX] = [&[]; BATCH_MAX];
            let mut from_queue = [0usize; BATCH_MAX];
            let mut count = 0;
            for i in self.tx_start..self.tx_end {
                let datagram = match self.tx_queue[i] {
                    Queued::Buffer(b, n) => &self.tx_batch[b][..n],
                    // A refused retransmission whose packet was acked meanwhile: skip it.
                    Queued::Slot(seq) if !self.conn.slot_holds(seq) => continue,
                    Queued::Slot(seq) => self.conn.slot_datagram(seq),
                };
                slices[count] = datagram;
                from_queue[count] = i;
                count += 1;
            }
            let queued = self.tx_end - self.tx_start;
            let sent = match send_batch(&self.socket, &slices[..count]) {
                Ok(k) => k,
                Err(e) => {
                    // ICMP errors (port unreachable) and the like: the datagrams are lost,
                    // as on the wire; retransmission or the peer timeout deals with it.
                    tracing::debug!("udp: sendmmsg failed: {e}");
                    count
                }
            };
            self.tx_start = if sent == count { self.tx_end } else { from_queue[sent] };
            if self.tx_start < self.tx_end {
                return; // the socket buffer is full: the rest goes at the next call
            }
            if queued < BATCH_MAX {
                // The machine had no more than this; ask again only if it might now.
                if self.conn.poll_timeout().is_none_or(|t| t > now) && self.conn.send_backlog().0 == 0 {
                    return;
                }
            }
        }
    }

    /// Takes what the socket has (a few batches at most, so one channel cannot starve the
    /// others of an endpoint).
    fn receive(&mut self, now: Instant) {
        let batch = (RECEIVE_BATCH_BYTES / self.receive_datagram_max).clamp(1, BATCH_MAX);
        for _ in 0..RECEIVE_PER_POLL.div_ceil(batch) {
            for b in &mut self.rx_batch[..batch] {
                if b.capacity() < self.receive_datagram_max {
                    b.reserve_exact(self.receive_datagram_max);
                }
            }
            let n = match recv_batch(&self.socket, &mut self.rx_batch[..batch], &mut self.truncated) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!("udp: recvmmsg failed: {e}");
                    return;
                }
            };
            for i in 0..n {
                if self.truncated[i] {
                    self.conn.note_truncated();
                    continue;
                }
                self.conn.handle_datagram_owned(now, &mut self.rx_batch[i]);
            }
            if n < batch {
                return;
            }
        }
    }

    fn progress(&mut self, now: Instant) {
        self.transmit(now);
        self.receive(now);
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        self.transmit(now);
    }

    fn update_probe(&self) {
        self.probe.set_deadline(self.conn.poll_timeout());
    }

    fn sync_stats(&mut self) {
        let now = *self.conn.counters();
        if now != self.reported {
            self.stats.add_delta(&self.reported, &now);
            self.reported = now;
        }
    }

    fn after_send(&mut self) {
        // Full packets go out in batches without waiting for the next poll.
        if self.conn.send_backlog().0 >= (BATCH_MAX / 2) as u64 || self.conn.unsent_full() {
            self.transmit(Instant::now());
            self.update_probe();
        }
    }
}

impl Transport for UdpChannel {
    fn caps(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::Udp,
            inline_max: 0,
            fragment_max: self.conn.fragment_max(),
            send_max: self.conn.send_max(),
            message_max: super::wire::MESSAGE_MAX,
            gather_max: GATHER_MAX,
            reliable_ordered: true,
            zero_copy_receive: true,
            pack_in_place: false,
            rma: RmaCapabilities::over_messages(false, self.conn.fragment_max(), self.conn.send_max()),
        }
    }

    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        let mut outcome = self.conn.send(gather)?;
        if outcome == SendOutcome::NoResource {
            self.conn.flush();
            self.progress(Instant::now());
            outcome = self.conn.send(gather)?;
            self.update_probe();
        }
        self.after_send();
        Ok(outcome)
    }

    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        let mut n = self.conn.send_fragments(message_len, offset, data)?;
        if n == 0 && !data.is_empty() {
            self.progress(Instant::now());
            n = self.conn.send_fragments(message_len, offset, data)?;
            self.update_probe();
        }
        self.after_send();
        Ok(n)
    }

    fn poll_recv(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError> {
        let now = Instant::now();
        self.conn.flush();
        self.progress(now);
        self.conn.share_receive_budget(self.stats.open_channels() as usize);
        let result = self.conn.poll_recv(max, deliver);
        if result.is_err() {
            self.stop_counting_open();
        }
        // Replies sent from the handlers, and acks or window updates, go out together.
        self.conn.flush();
        self.transmit(now);
        self.update_probe();
        self.sync_stats();
        result
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        if let Some(e) = self.conn.failure() {
            return Err(e.clone());
        }
        self.conn.flush();
        self.transmit(Instant::now());
        self.update_probe();
        Ok(self.conn.send_backlog().0 == 0 && self.tx_start == self.tx_end)
    }

    fn peer_node(&self) -> Option<crate::node::NodeId> {
        Some(self.conn.peer_node())
    }

    fn probe(&self) -> Arc<dyn ReadyProbe> {
        self.probe.clone()
    }

    fn receive_backlog(&self) -> (u64, u64) {
        (self.conn.receive_buffered(), self.conn.receive_capacity())
    }

    fn close(&mut self) {
        self.stop_counting_open();
        if self.conn.failure().is_some() {
            return;
        }
        self.conn.close();
        if self.conn.peer_closed() {
            // The peer closed first and may be gone: say goodbye once, do not linger.
            self.transmit(Instant::now());
            self.sync_stats();
            return;
        }
        let deadline = Instant::now() + self.linger;
        loop {
            let now = Instant::now();
            self.progress(now);
            if self.conn.is_closed() || self.conn.failure().is_some() || now >= deadline {
                break;
            }
            let wait = self.conn.poll_timeout().map_or(deadline, |t| t.min(deadline));
            let ms = wait.saturating_duration_since(now).as_millis().clamp(1, 100) as i32;
            let mut fds = [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, ms);
        }
        self.sync_stats();
    }
}

impl Drop for UdpChannel {
    fn drop(&mut self) {
        self.close();
        self.stop_counting_open();
    }
}
