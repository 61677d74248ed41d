//! One shared-memory channel: sending into the peer's mapping, receiving from our own.

use super::free_ring::{FreeRingConsumer, FreeRingProducer};
use super::layout::{Layout, OFF_OWNER_SLEEPING, OFF_PEER_CLOSED, OFF_PEER_TAIL_HINT};
use super::mem::{MappedMem, RingMem};
use super::ring::{Reservation, RingPlace};
use super::ring::{RingConsumer, RingProducer};
use crate::descriptor::{
    flags, stamp_for, BufferRef, RecordHeader, RecordKind, BUFFER_REF_LEN, HEADER_LEN, RECORD_ALIGN,
};
use crate::error::{ChannelError, SendError};
use crate::sys::doorbell::Doorbell;
use crate::transport::{Capabilities, ReadyProbe, Responder, RmaCapabilities, SendOutcome, Transport, TransportKind};
use crate::{Delivery, GATHER_MAX};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// Largest message a channel carries (streamed in fragments beyond one buffer).
pub const MESSAGE_MAX: u64 = 1 << 30;

/// Consumed bytes that, while busy, are released to the sender in one go: large enough to
/// amortise the release, small enough that a streaming sender never waits for space.
const RELEASE_BATCH_BYTES: u64 = 16 << 10;

/// Consumed bytes released when idle. Not every record: zeroing the line the sender is about
/// to write next would make it fetch that line back from us. The sender never waits for
/// this space: with the ring otherwise empty it has all but this much of it.
const IDLE_RELEASE_BYTES: u64 = 4 << 10;

/// Empty polls between two liveness checks of the peer (one `poll(2)` each): about a
/// millisecond of spinning, so a dead peer is noticed quickly at a cost of well under 1%.
const EMPTY_POLLS_PER_LIVENESS_CHECK: u32 = 4096;

/// Readiness of our receive ring, shared with completion queues and waiters.
pub(crate) struct ShmProbe {
    mem: Arc<MappedMem>,
    ring: RingPlace,
    doorbell: Doorbell,
    socket: OwnedFd,
    check_peer: AtomicBool,
    /// The owner's local ring head (the next record to consume), stored after every poll.
    /// Not the head published in the mapping: that one lags by up to a release batch, and
    /// the consumed records behind it are not zeroed yet, so it would read as ready.
    consumer_head: AtomicU64,
}

impl ReadyProbe for ShmProbe {
    #[inline]
    fn is_ready(&self) -> bool {
        let head = self.consumer_head.load(Ordering::Relaxed);
        let off = self.ring.ring_off + (head & (self.ring.capacity as u64 - 1)) as usize;
        self.mem.load_u64(off, Ordering::Acquire) != 0
    }

    fn arm(&self) -> bool {
        self.mem.store_u64(OFF_OWNER_SLEEPING, 1, Ordering::Relaxed);
        crate::sys::barrier::sleeper_barrier();
        if self.is_ready() {
            self.disarm();
            return false;
        }
        true
    }

    fn disarm(&self) {
        self.mem.store_u64(OFF_OWNER_SLEEPING, 0, Ordering::Relaxed);
        self.doorbell.clear();
        self.check_peer.store(true, Ordering::Relaxed);
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.doorbell.as_fd(), self.socket.as_fd()]
    }
}

/// The receiving half: our own mapping.
///
/// Everything the peer writes here is checked before it is used as an offset. What a
/// misbehaving peer can still do is garble its own messages to us (reuse a buffer it has
/// not been given back, say): the mapping holds only what it sends us.
struct RxHalf {
    mem: Arc<MappedMem>,
    layout: Layout,
    ring: RingConsumer,
    free: FreeRingProducer,
    /// Offset the next fragment of the message being received must have.
    next_fragment_offset: u64,
}

/// The sending half: the peer's mapping.
struct TxHalf {
    mem: Arc<MappedMem>,
    layout: Layout,
    ring: RingProducer,
    free: FreeRingConsumer,
    /// Buffers taken from the peer's free ring, most recently freed on top (warm in cache).
    free_stack: Vec<u32>,
    doorbell: Doorbell,
    tail_hint: u64,
    inline_max: usize,
}

impl TxHalf {
    /// Tells the receiver roughly how far we have written, an eighth of a ring at a time,
    /// so it can see its backlog without a shared tail on every send.
    #[inline(always)]
    fn publish_tail_hint(&mut self) {
        let tail = self.ring.tail();
        if tail - self.tail_hint >= (self.layout.geometry.ring_bytes / 8) as u64 {
            self.tail_hint = tail;
            self.mem.store_u64(OFF_PEER_TAIL_HINT, tail, Ordering::Relaxed);
        }
    }

    /// Rings the peer's doorbell if it sleeps. The barrier orders our publication before
    /// the load of its flag, pairing with the sleeper's barrier in `arm` (see `sys::barrier`).
    #[inline(always)]
    fn wake_peer(&self) {
        crate::sys::barrier::sender_barrier(self.layout.owner_uses_membarrier);
        if self.mem.load_u64(OFF_OWNER_SLEEPING, Ordering::Relaxed) != 0 {
            self.mem.store_u64(OFF_OWNER_SLEEPING, 0, Ordering::Relaxed);
            self.doorbell.ring();
        }
    }

    /// Moves every buffer the peer has freed onto our stack.
    fn refill_free_stack(&mut self) {
        while let Some(index) = self.free.pop(&*self.mem) {
            if (index as usize) < self.layout.geometry.buffer_count
                && self.free_stack.len() < self.layout.geometry.buffer_count
            {
                self.free_stack.push(index);
            } else {
                tracing::warn!(index, "peer returned an invalid buffer index; ignored");
            }
        }
    }

    /// Whether `fragments` free buffers (taking back those the peer freed when short) and
    /// ring room for their records are there now.
    fn has_room_for_buffers(&mut self, fragments: usize) -> bool {
        if self.free_stack.len() < fragments {
            self.refill_free_stack();
        }
        self.free_stack.len() >= fragments && self.ring_has_room_for(fragments)
    }

    /// Room in the ring for `records` buffer records, padding included.
    fn ring_has_room_for(&mut self, records: usize) -> bool {
        let per = crate::descriptor::record_len(BUFFER_REF_LEN);
        let needed = (records * per + per) as u64;
        let cap = self.layout.geometry.ring_bytes as u64;
        if self.ring.in_flight() + needed <= cap {
            return true;
        }
        // Refresh our view of the consumer head through a zero-length probe.
        self.ring.in_flight_refresh(&*self.mem) + needed <= cap
    }

    /// Copies `len` bytes starting at `from` of the concatenated gather list into `dst_off`.
    fn copy_gather(mem: &MappedMem, mut dst_off: usize, gather: &[&[u8]], mut from: usize, mut len: usize) {
        for piece in gather {
            if len == 0 {
                break;
            }
            if from >= piece.len() {
                from -= piece.len();
                continue;
            }
            let take = (piece.len() - from).min(len);
            mem.write_bytes(dst_off, &piece[from..from + take]);
            dst_off += take;
            len -= take;
            from = 0;
        }
        debug_assert_eq!(len, 0, "gather list shorter than the message");
    }

    /// Sends fragments `[offset, offset + len)` of a message held in `gather`, each in one
    /// buffer, stopping when buffers or ring space run out. Returns bytes sent.
    fn send_buffered(&mut self, gather: &[&[u8]], message_len: u64, offset: u64, len: usize) -> usize {
        let buffer_size = self.layout.geometry.buffer_size;
        let mut sent = 0usize;
        while sent < len {
            if !self.has_room_for_buffers(1) {
                break;
            }
            let index = self.free_stack.pop().expect("checked non-empty");
            let fragment_offset = offset + sent as u64;
            let fragment_len = (len - sent).min(buffer_size);
            Self::copy_gather(&self.mem, self.layout.buffer_off(index), gather, sent, fragment_len);
            self.commit_buffer(BufferRef {
                buffer_index: index,
                fragment_len: fragment_len as u32,
                message_len,
                fragment_offset,
            });
            sent += fragment_len;
        }
        if sent > 0 {
            self.publish_tail_hint();
            self.wake_peer();
        }
        sent
    }

    /// Publishes the inline message of `len` bytes written into reservation `r`.
    #[inline(always)]
    fn commit_inline(&mut self, r: Reservation, len: usize) {
        let header = RecordHeader {
            stamp: stamp_for(r.position),
            payload_len: len as u32,
            tag: self.layout.tag,
            kind: RecordKind::Inline,
            flags: 0,
        };
        self.ring.commit(&*self.mem, r, header);
    }

    /// Publishes a filled buffer as the fragment `reference` describes (the ring has room
    /// for its record: checked by the caller).
    #[inline(always)]
    fn commit_buffer(&mut self, reference: BufferRef) {
        let reservation = self.ring.reserve(&*self.mem, BUFFER_REF_LEN).expect("room checked by the caller");
        for (i, w) in reference.encode().into_iter().enumerate() {
            self.mem.store_u64(reservation.record_off + HEADER_LEN + 8 * i, w, Ordering::Relaxed);
        }
        let mut f = 0;
        if reference.fragment_offset == 0 {
            f |= flags::FIRST;
        }
        if reference.fragment_offset + u64::from(reference.fragment_len) == reference.message_len {
            f |= flags::LAST;
        }
        let header = RecordHeader {
            stamp: stamp_for(reservation.position),
            payload_len: BUFFER_REF_LEN as u32,
            tag: self.layout.tag,
            kind: RecordKind::Buffer,
            flags: f,
        };
        self.ring.commit(&*self.mem, reservation, header);
    }

    /// Sends one message of `len` bytes that `pack` writes in place: into the ring record
    /// (inline) or into one buffer of the peer's mapping, so the caller's bytes are copied
    /// once, by `pack`. `NoResource`, without calling `pack`, when there is no room now.
    fn send_packed(&mut self, len: usize, pack: &mut dyn FnMut(&mut [u8])) -> Result<SendOutcome, SendError> {
        if len <= self.inline_max {
            let Some(r) = self.ring.reserve(&*self.mem, len) else {
                return Ok(SendOutcome::NoResource);
            };
            self.mem.fill_bytes(r.record_off + HEADER_LEN, len, |b| pack(b));
            self.commit_inline(r, len);
        } else {
            let buffer_size = self.layout.geometry.buffer_size;
            if len > buffer_size {
                return Err(SendError::TooLarge { len: len as u64, max: buffer_size as u64 });
            }
            if !self.has_room_for_buffers(1) {
                return Ok(SendOutcome::NoResource);
            }
            let index = self.free_stack.pop().expect("checked non-empty");
            self.mem.fill_bytes(self.layout.buffer_off(index), len, |b| pack(b));
            self.commit_buffer(BufferRef {
                buffer_index: index,
                fragment_len: len as u32,
                message_len: len as u64,
                fragment_offset: 0,
            });
        }
        self.publish_tail_hint();
        self.wake_peer();
        Ok(SendOutcome::Done)
    }

    /// Sends one whole message (inline, or in buffers when it fits them all now).
    #[inline]
    fn send_message(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        let total: usize = gather.iter().map(|b| b.len()).sum();
        if total <= self.inline_max {
            let Some(r) = self.ring.reserve(&*self.mem, total) else {
                return Ok(SendOutcome::NoResource);
            };
            let mut off = r.record_off + HEADER_LEN;
            for piece in gather {
                self.mem.write_bytes(off, piece);
                off += piece.len();
            }
            self.commit_inline(r, total);
            self.publish_tail_hint();
            self.wake_peer();
            return Ok(SendOutcome::Done);
        }
        let g = self.layout.geometry;
        let max = g.buffer_size * g.buffer_count;
        if total > max {
            return Err(SendError::TooLarge { len: total as u64, max: max as u64 });
        }
        let fragments = total.div_ceil(g.buffer_size);
        if !self.has_room_for_buffers(fragments) {
            return Ok(SendOutcome::NoResource);
        }
        let sent = self.send_buffered(gather, total as u64, 0, total);
        assert_eq!(sent, total, "resources were reserved for the whole message");
        Ok(SendOutcome::Done)
    }
}

impl Responder for TxHalf {
    #[inline]
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        if gather.len() > GATHER_MAX {
            return Err(SendError::TooManyBuffers(gather.len(), GATHER_MAX));
        }
        self.send_message(gather)
    }
}

/// One side of a shared-memory channel.
pub struct ShmChannel {
    rx: RxHalf,
    tx: TxHalf,
    socket: UnixStream,
    probe: Arc<ShmProbe>,
    failure: Option<ChannelError>,
    empty_polls: u32,
    peer_gone: bool,
    /// The peer's node id, from the handshake.
    pub(crate) peer_node: crate::node::NodeId,
}

impl ShmChannel {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rx_mem: Arc<MappedMem>,
        rx_layout: Layout,
        rx_doorbell: Doorbell,
        free: FreeRingProducer,
        tx_mem: Arc<MappedMem>,
        tx_layout: Layout,
        tx_doorbell: Doorbell,
        socket: UnixStream,
        inline_max: usize,
    ) -> std::io::Result<Self> {
        let tx_ring = RingProducer::new(tx_layout.ring);
        let inline_max = inline_max.min(tx_ring.max_payload());
        let probe = Arc::new(ShmProbe {
            mem: rx_mem.clone(),
            ring: rx_layout.ring,
            doorbell: rx_doorbell,
            socket: socket.as_fd().try_clone_to_owned()?,
            check_peer: AtomicBool::new(false),
            consumer_head: AtomicU64::new(0),
        });
        Ok(ShmChannel {
            rx: RxHalf {
                ring: RingConsumer::new(rx_layout.ring),
                free,
                next_fragment_offset: 0,
                mem: rx_mem,
                layout: rx_layout,
            },
            tx: TxHalf {
                free: FreeRingConsumer::new(tx_layout.free),
                free_stack: Vec::with_capacity(tx_layout.geometry.buffer_count),
                ring: tx_ring,
                mem: tx_mem,
                layout: tx_layout,
                doorbell: tx_doorbell,
                tail_hint: 0,
                inline_max,
            },
            socket,
            probe,
            failure: None,
            empty_polls: 0,
            peer_gone: false,
            peer_node: crate::node::NodeId::UNKNOWN,
        })
    }

    fn check_open(&self) -> Result<(), SendError> {
        match &self.failure {
            Some(e) => Err(SendError::ChannelDown(e.clone())),
            None if self.peer_gone => Err(SendError::ChannelDown(ChannelError::PeerFailed("peer hung up"))),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: ChannelError) -> ChannelError {
        match e {
            ChannelError::Closed => tracing::debug!("shm channel closed by peer"),
            _ => tracing::warn!("shm channel failed: {e}"),
        }
        self.failure = Some(e.clone());
        e
    }

    /// Checks the liveness socket without blocking. A hang-up means the peer process is gone
    /// (the kernel closes its descriptors when it dies) or closed the channel.
    fn peer_hung_up(&self) -> bool {
        let mut fds =
            [rustix::event::PollFd::new(&self.socket, rustix::event::PollFlags::RDHUP | rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, 0) {
            Ok(0) => false,
            Ok(_) => {
                let r = fds[0].revents();
                r.intersects(
                    rustix::event::PollFlags::HUP | rustix::event::PollFlags::RDHUP | rustix::event::PollFlags::ERR,
                ) || r.contains(rustix::event::PollFlags::IN)
            }
            Err(_) => true,
        }
    }

    /// Delivers one record found at the head, validating everything the peer wrote.
    fn deliver_record(
        rx: &mut RxHalf,
        tx: &mut TxHalf,
        record: super::ring::Record,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<(), ChannelError> {
        let header = record.header;
        if header.tag != rx.layout.tag {
            return Err(ChannelError::Protocol(format!("record tag {:#x} is not this channel's", header.tag)));
        }
        match header.kind {
            RecordKind::Inline => {
                let len = header.payload_len as usize;
                let data = rx.mem.slice(record.record_off + HEADER_LEN, len);
                deliver(Delivery { data, message_len: len as u64, offset: 0 }, tx);
                rx.ring.consume(record);
            }
            RecordKind::Buffer => {
                if header.payload_len as usize != BUFFER_REF_LEN {
                    return Err(ChannelError::Protocol("buffer record of the wrong length".into()));
                }
                let mut words = [0u64; 3];
                for (i, w) in words.iter_mut().enumerate() {
                    *w = rx.mem.load_u64(record.record_off + HEADER_LEN + 8 * i, Ordering::Relaxed);
                }
                let r = BufferRef::decode(words);
                let g = rx.layout.geometry;
                let index = r.buffer_index as usize;
                let valid = index < g.buffer_count
                    && r.fragment_len as usize <= g.buffer_size
                    && r.message_len <= MESSAGE_MAX
                    && r.fragment_offset == rx.next_fragment_offset
                    && r.fragment_offset.checked_add(u64::from(r.fragment_len)).is_some_and(|end| end <= r.message_len)
                    && (r.fragment_len > 0 || r.message_len == 0)
                    && ((header.flags & flags::FIRST != 0) == (r.fragment_offset == 0))
                    && ((header.flags & flags::LAST != 0)
                        == (r.fragment_offset + u64::from(r.fragment_len) == r.message_len));
                if !valid {
                    return Err(ChannelError::Protocol(format!("invalid buffer reference {r:?}")));
                }
                let data = rx.mem.slice(rx.layout.buffer_off(r.buffer_index), r.fragment_len as usize);
                deliver(Delivery { data, message_len: r.message_len, offset: r.fragment_offset }, tx);
                rx.next_fragment_offset =
                    if header.flags & flags::LAST != 0 { 0 } else { r.fragment_offset + u64::from(r.fragment_len) };
                rx.ring.consume(record);
                rx.free.push(&*rx.mem, r.buffer_index);
            }
            RecordKind::Padding => unreachable!("the ring consumes padding itself"),
        }
        Ok(())
    }
}

impl RingProducer {
    /// Re-reads the consumer head and returns the bytes in flight.
    pub(crate) fn in_flight_refresh<M: RingMem>(&mut self, mem: &M) -> u64 {
        self.refresh_head(mem);
        self.in_flight()
    }
}

impl Transport for ShmChannel {
    fn caps(&self) -> Capabilities {
        let g = self.tx.layout.geometry;
        Capabilities {
            kind: TransportKind::Shm,
            inline_max: self.tx.inline_max,
            fragment_max: g.buffer_size,
            send_max: g.buffer_size * g.buffer_count,
            message_max: MESSAGE_MAX,
            gather_max: GATHER_MAX,
            reliable_ordered: true,
            zero_copy_receive: true,
            pack_in_place: true,
            rma: RmaCapabilities::over_messages(true, g.buffer_size, g.buffer_size * g.buffer_count),
        }
    }

    #[inline]
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        if gather.len() > GATHER_MAX {
            return Err(SendError::TooManyBuffers(gather.len(), GATHER_MAX));
        }
        self.check_open()?;
        self.tx.send_message(gather)
    }

    fn send_packed(&mut self, len: usize, pack: &mut dyn FnMut(&mut [u8])) -> Result<SendOutcome, SendError> {
        self.check_open()?;
        self.tx.send_packed(len, pack)
    }

    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        self.check_open()?;
        if message_len > MESSAGE_MAX {
            return Err(SendError::TooLarge { len: message_len, max: MESSAGE_MAX });
        }
        assert!(offset + data.len() as u64 <= message_len, "fragment beyond the message");
        Ok(self.tx.send_buffered(&[data], message_len, offset, data.len()))
    }

    #[inline]
    fn poll_recv(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        let mut delivered = 0;
        while delivered < max {
            let record = match self.rx.ring.peek(&*self.rx.mem) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return Err(self.fail(e.into())),
            };
            if let Err(e) = Self::deliver_record(&mut self.rx, &mut self.tx, record, deliver) {
                return Err(self.fail(e));
            }
            delivered += 1;
        }
        self.probe.consumer_head.store(self.rx.ring.head(), Ordering::Relaxed);
        // Zero and release consumed records in batches, far behind the lines the sender is
        // writing now (see `RingConsumer`): a batch while busy, or a smaller one when idle.
        let unreleased = self.rx.ring.unreleased();
        let ring_bytes = self.rx.layout.geometry.ring_bytes as u64;
        if delivered > 0 {
            if unreleased >= RELEASE_BATCH_BYTES.min(ring_bytes / 8) {
                self.rx.ring.release(&*self.rx.mem);
            }
            self.empty_polls = 0;
            return Ok(delivered);
        }
        if unreleased >= IDLE_RELEASE_BYTES.min(ring_bytes / 8) {
            self.rx.ring.release(&*self.rx.mem);
        }
        self.empty_polls += 1;
        if self.probe.check_peer.load(Ordering::Relaxed) {
            self.probe.check_peer.store(false, Ordering::Relaxed);
            self.empty_polls = EMPTY_POLLS_PER_LIVENESS_CHECK;
        }
        if self.peer_gone || self.empty_polls >= EMPTY_POLLS_PER_LIVENESS_CHECK {
            self.empty_polls = 0;
            if self.peer_gone || self.peer_hung_up() {
                self.peer_gone = true;
                // Everything the peer published before it went is complete: deliver it first.
                if self.rx.ring.is_ready(&*self.rx.mem) {
                    return Ok(0);
                }
                let e = if self.rx.mem.load_u64(OFF_PEER_CLOSED, Ordering::Acquire) != 0 {
                    ChannelError::Closed
                } else {
                    ChannelError::PeerFailed("peer process exited or reset the channel")
                };
                return Err(self.fail(e));
            }
        }
        Ok(0)
    }

    fn peer_node(&self) -> Option<crate::node::NodeId> {
        Some(self.peer_node)
    }

    fn probe(&self) -> Arc<dyn ReadyProbe> {
        self.probe.clone()
    }

    fn receive_backlog(&self) -> (u64, u64) {
        let tail_hint = self.rx.mem.load_u64(OFF_PEER_TAIL_HINT, Ordering::Relaxed);
        let head = self.rx.ring.head();
        (tail_hint.saturating_sub(head), self.rx.layout.geometry.ring_bytes as u64)
    }

    fn close(&mut self) {
        if self.failure.is_none() {
            self.tx.mem.store_u64(OFF_PEER_CLOSED, 1, Ordering::Release);
            self.tx.wake_peer();
            let _ = self.socket.shutdown(std::net::Shutdown::Both);
            self.failure = Some(ChannelError::Closed);
        }
    }
}

impl Drop for ShmChannel {
    fn drop(&mut self) {
        self.close();
    }
}

const _: () = assert!(RECORD_ALIGN.is_multiple_of(8), "buffer references are stored as aligned words");

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::transport::shm::connect::{connect_retry, ShmConfig, ShmListener};
    use std::time::Duration;

    fn pair(name: &str) -> (ShmChannel, ShmChannel) {
        let listener = ShmListener::bind(name).unwrap();
        let name = name.to_string();
        let t =
            std::thread::spawn(move || connect_retry(&name, &ShmConfig::default(), Duration::from_secs(5)).unwrap());
        let a = listener.accept(&ShmConfig::default(), Duration::from_secs(5)).unwrap();
        (a, t.join().unwrap())
    }

    fn drain(ch: &mut ShmChannel) -> (usize, Result<usize, ChannelError>) {
        let mut got = 0;
        let r = ch.poll_recv(16, &mut |_, _| got += 1);
        (got, r)
    }

    /// Writes a record by hand into `from`'s send ring, as a misbehaving peer would.
    fn forge(from: &mut ShmChannel, header: RecordHeader, body: [u64; 3]) {
        let r = from.tx.ring.reserve(&*from.tx.mem, BUFFER_REF_LEN).unwrap();
        for (i, w) in body.into_iter().enumerate() {
            from.tx.mem.store_u64(r.record_off + HEADER_LEN + 8 * i, w, Ordering::Relaxed);
        }
        let header = RecordHeader { stamp: stamp_for(r.position), ..header };
        from.tx.ring.commit(&*from.tx.mem, r, header);
    }

    #[test]
    fn delivers_inline_and_buffered_messages_with_gather() {
        let (mut a, mut b) = pair(&format!("unit-gather-{}", std::process::id()));
        assert_eq!(b.send(&[b"head", b"er", b"", b"!"]).unwrap(), SendOutcome::Done);
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        assert_eq!(b.send(&[&big[..5], &big[5..]]).unwrap(), SendOutcome::Done);
        let mut got = Vec::new();
        while got.len() < 5 {
            a.poll_recv(16, &mut |d, _| got.push((d.offset, d.message_len, d.data.to_vec()))).unwrap();
        }
        assert_eq!(got[0], (0, 7, b"header!".to_vec()));
        let joined: Vec<u8> = got[1..].iter().flat_map(|(_, _, d)| d.clone()).collect();
        assert_eq!(joined, big, "four 64 KiB fragments in order");
    }

    #[test]
    fn packed_messages_arrive_as_packed_and_full_buffers_refuse_without_packing() {
        let (mut a, mut b) = pair(&format!("unit-packed-{}", std::process::id()));
        let fill = |seed: u8| move |dst: &mut [u8]| dst.iter_mut().enumerate().for_each(|(i, x)| *x = seed ^ i as u8);
        let want = |seed: u8, len: usize| (0..len).map(|i| seed ^ i as u8).collect::<Vec<u8>>();
        // Inline, one whole buffer, and one byte more than a buffer.
        assert_eq!(b.send_packed(40, &mut fill(1)).unwrap(), SendOutcome::Done);
        let buffer = b.caps().fragment_max;
        assert_eq!(b.send_packed(buffer, &mut fill(2)).unwrap(), SendOutcome::Done);
        assert!(matches!(b.send_packed(buffer + 1, &mut fill(3)), Err(SendError::TooLarge { .. })));
        let mut got = Vec::new();
        while got.len() < 2 {
            a.poll_recv(16, &mut |d, _| got.push((d.offset, d.message_len, d.data.to_vec()))).unwrap();
        }
        assert_eq!(got[0], (0, 40, want(1, 40)));
        assert_eq!(got[1], (0, buffer as u64, want(2, buffer)));
        // With every buffer in flight, a send is refused and `pack` never runs.
        let mut sent = 0;
        while b.send_packed(buffer, &mut fill(4)).unwrap() == SendOutcome::Done {
            sent += 1;
        }
        assert!(sent > 0);
        let mut packed = false;
        assert_eq!(b.send_packed(buffer, &mut |_| packed = true).unwrap(), SendOutcome::NoResource);
        assert!(!packed);
        let mut received = 0;
        while received < sent {
            received += a
                .poll_recv(16, &mut |d, _| assert_eq!(d.data, &want(4, buffer)[..], "packed in place, intact"))
                .unwrap();
        }
    }

    #[test]
    fn refuses_record_with_foreign_tag() {
        let (mut a, mut b) = pair(&format!("unit-tag-{}", std::process::id()));
        let tag = b.tx.layout.tag ^ 1;
        let header =
            RecordHeader { stamp: 0, payload_len: BUFFER_REF_LEN as u32, tag, kind: RecordKind::Buffer, flags: 3 };
        forge(
            &mut b,
            header,
            BufferRef { buffer_index: 0, fragment_len: 1, message_len: 1, fragment_offset: 0 }.encode(),
        );
        assert!(matches!(drain(&mut a), (0, Err(ChannelError::Protocol(_)))));
        assert!(matches!(drain(&mut a), (0, Err(ChannelError::Protocol(_)))), "the failure sticks");
    }

    #[test]
    fn refuses_out_of_bounds_buffer_references() {
        let cases = [
            BufferRef { buffer_index: 64, fragment_len: 1, message_len: 1, fragment_offset: 0 },
            BufferRef { buffer_index: u32::MAX, fragment_len: 1, message_len: 1, fragment_offset: 0 },
            BufferRef { buffer_index: 0, fragment_len: (64 << 10) + 1, message_len: 1 << 20, fragment_offset: 0 },
            BufferRef { buffer_index: 0, fragment_len: 10, message_len: 5, fragment_offset: 0 },
            BufferRef { buffer_index: 0, fragment_len: 10, message_len: 100, fragment_offset: 50 },
            BufferRef { buffer_index: 0, fragment_len: 10, message_len: u64::MAX, fragment_offset: 0 },
        ];
        for (i, r) in cases.into_iter().enumerate() {
            let (mut a, mut b) = pair(&format!("unit-oob-{}-{i}", std::process::id()));
            let last = r.fragment_offset + u64::from(r.fragment_len) == r.message_len;
            let flags = u8::from(r.fragment_offset == 0) | (u8::from(last) << 1);
            let header = RecordHeader {
                stamp: 0,
                payload_len: BUFFER_REF_LEN as u32,
                tag: b.tx.layout.tag,
                kind: RecordKind::Buffer,
                flags,
            };
            forge(&mut b, header, r.encode());
            assert!(matches!(drain(&mut a), (0, Err(ChannelError::Protocol(_)))), "case {i}: {r:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Whatever a peer writes into our ring, receiving never panics and never reads
        /// outside the mapping: it delivers well-formed records and refuses the rest.
        #[test]
        fn random_ring_contents_never_crash_the_receiver(words in proptest::collection::vec(proptest::prelude::any::<u64>(), 1..64), stamp_ok: bool) {
            let (mut a, b) = pair(&format!("unit-fuzz-{}-{}", std::process::id(), rand::random::<u64>()));
            let base = b.tx.layout.ring.ring_off;
            for (i, w) in words.iter().enumerate().skip(1) {
                b.tx.mem.store_u64(base + 8 * i, *w, Ordering::Relaxed);
            }
            let mut w0 = words[0];
            if stamp_ok {
                w0 = (w0 & !0xffff_ffff) | u64::from(stamp_for(0));
            }
            b.tx.mem.store_u64(base, w0, Ordering::Release);
            for _ in 0..4 {
                match a.poll_recv(16, &mut |d, _| assert!(d.data.len() as u64 <= d.message_len)) {
                    Ok(_) | Err(ChannelError::Protocol(_)) => {}
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        }
    }

    #[test]
    fn full_ring_is_back_pressure_not_an_error() {
        let (mut a, mut b) = pair(&format!("unit-full-{}", std::process::id()));
        let msg = [9u8; 1000];
        let mut sent = 0;
        while b.send(&[&msg]).unwrap() == SendOutcome::Done {
            sent += 1;
        }
        assert!(sent > 100);
        let mut got = 0;
        while got < sent {
            got += a.poll_recv(usize::MAX, &mut |_, _| {}).unwrap();
        }
        // The receiver releases consumed space when idle.
        assert_eq!(a.poll_recv(1, &mut |_, _| {}).unwrap(), 0);
        assert_eq!(b.send(&[&msg]).unwrap(), SendOutcome::Done);
    }
}
