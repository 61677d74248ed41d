//! The reliable, flow-controlled connection: a sans-IO state machine (no sockets, no
//! clock, no threads), run by the socket driver and by `ulnet-sim`.
//!
//! Method groups and the order to call them (quinn-proto's shape):
//!
//! 1. Make one with [`Connection::client`] or [`Connection::server`] (from a HELLO).
//! 2. Input: [`Connection::handle_datagram`] for every datagram from the peer, and
//!    [`Connection::handle_timeout`] once the instant of [`Connection::poll_timeout`] has
//!    come (a harmless no-op when nothing is due).
//! 3. Application: [`Connection::send`], [`Connection::send_fragments`] (whole messages or
//!    streamed fragments into the send slots), [`Connection::poll_recv`] (in-order
//!    deliveries, in place), [`Connection::flush`] (seal the packet being filled so that
//!    small messages go out), [`Connection::close`].
//! 4. Output: [`Connection::poll_transmit`] until it returns `None`, after any of the above.
//!
//! Reliability: per-direction packet sequence numbers from 1; the receiver returns the
//! cumulative ack and a 256-packet selective-ack bitmap, piggybacked on data or standalone
//! after `ack_delay` / `ack_every_packets`; the sender retransmits on a timeout estimated
//! from the RTT (RFC 6298: SRTT, RTTVAR, Karn's rule, exponential backoff) every packet that
//! is neither acked nor selectively acked, and earlier a packet that three later packets
//! overtook (fast retransmit). Duplicates are recognised by sequence number and dropped.
//!
//! Flow control: the receiver grants credit in stream bytes (`consumed + credit_bytes`)
//! and in sequence numbers (`next to deliver + window - 1`); a sender that obeys it never
//! makes the receiver buffer more than `credit_bytes` or overrun its slots. Credit is per
//! connection, so a slow receiver stalls only its own senders. A sender blocked on credit
//! probes (an ACK with `ACK_REQUESTED`) every RTO, so a lost window update cannot deadlock.
//!
//! Messages up to 64 MiB are cut into records of at most one datagram and delivered in
//! order as fragments (`Delivery::offset`), so reassembly memory is the receive slots.

use super::config::UdpConfig;
use super::wire::{self, AckBlock, Hello, Kind, WireError};
use crate::error::{ChannelError, SendError};
use crate::node::NodeId;
use crate::transport::tcp::handshake;
use crate::transport::{Responder, SendOutcome};
use crate::{Delivery, GATHER_MAX};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Packets that overtook an unacked one before it is retransmitted without waiting for
/// the timeout (TCP's duplicate-ack threshold).
const REORDER_THRESHOLD: u64 = 3;

/// Steps in which credit comes back: a receiver announces a window update once it has
/// consumed a step's worth (an eighth of its grant, or of its receive slots), and a sender
/// seals one step ahead ([`Tx::fill_ahead_max`]).
const CREDIT_STEPS: u64 = 8;

/// Bytes copied into a send slot before the checksum catches up with them: half of a
/// typical 48 KiB first-level data cache, so the checksum reads what the copy wrote
/// from there.
const COPY_CHUNK: usize = 24 << 10;

/// Where [`Connection::poll_transmit_in_place`] put the next datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datagram {
    /// Written into the caller's buffer, this many bytes.
    Written(usize),
    /// The data packet with this sequence number, finished in its send slot.
    InSlot(u64),
}

/// Why datagrams were dropped, and what the connection did. All drops are also logged at
/// debug level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpCounters {
    /// Datagrams shorter than their header or than the length they declare.
    pub truncated: u64,
    /// Datagrams with a bad magic, unknown kind or flags, or fields out of range.
    pub malformed: u64,
    /// Datagrams of another protocol version.
    pub wrong_version: u64,
    /// Datagrams whose checksum failed (corrupted, forged, or of another session).
    pub bad_checksum: u64,
    /// Datagrams addressed to another connection id (strangers, old sessions).
    pub stranger: u64,
    /// Handshake proofs that failed the cluster-secret HMAC.
    pub wrong_secret: u64,
    /// Data packets received again (duplicates and replays), dropped.
    pub replayed: u64,
    /// Data packets beyond the receive slots (a sender ignoring credit), dropped.
    pub overrun: u64,
    /// Data packets sent (first transmissions).
    pub packets_sent: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Data packets accepted.
    pub packets_received: u64,
    /// Standalone acks sent.
    pub acks_sent: u64,
    /// Times a sealed packet waited because the peer's credit (bytes or sequence window)
    /// was used up.
    pub credit_stalls: u64,
    /// Microseconds packets spent waiting for credit (from the stall to the grant that
    /// let the next packet go).
    pub credit_blocked_us: u64,
}

impl UdpCounters {
    /// Adds `other` into `self`.
    pub fn add(&mut self, o: &UdpCounters) {
        self.truncated += o.truncated;
        self.malformed += o.malformed;
        self.wrong_version += o.wrong_version;
        self.bad_checksum += o.bad_checksum;
        self.stranger += o.stranger;
        self.wrong_secret += o.wrong_secret;
        self.replayed += o.replayed;
        self.overrun += o.overrun;
        self.packets_sent += o.packets_sent;
        self.retransmits += o.retransmits;
        self.timeouts += o.timeouts;
        self.packets_received += o.packets_received;
        self.acks_sent += o.acks_sent;
        self.credit_stalls += o.credit_stalls;
        self.credit_blocked_us += o.credit_blocked_us;
    }

    /// Dropped datagrams of every kind.
    pub fn dropped(&self) -> u64 {
        self.truncated
            + self.malformed
            + self.wrong_version
            + self.bad_checksum
            + self.stranger
            + self.wrong_secret
            + self.replayed
            + self.overrun
    }
}

/// Counts a refused datagram by its reason.
pub(crate) fn count_wire_error(c: &mut UdpCounters, e: WireError) {
    match e {
        WireError::Truncated => c.truncated += 1,
        WireError::Malformed(_) => c.malformed += 1,
        WireError::Version(_) => c.wrong_version += 1,
        WireError::Checksum => c.bad_checksum += 1,
    }
    tracing::debug!("udp: dropped datagram: {e}");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Client: HELLO sent, waiting for CHALLENGE.
    HelloSent,
    /// Client: PROOF sent, waiting for READY or any session packet.
    ProofSent,
    /// Server: CHALLENGE sent, waiting for PROOF.
    ChallengeSent,
    /// Data flows.
    Established,
    /// Failed or closed; `failure` says why.
    Down,
}

/// The state between a retransmission timeout and the first ack after it.
#[derive(Clone, Copy, Debug)]
struct Recovery {
    probe: u64,
    end: u64,
}

/// RFC 6298 round-trip estimation.
#[derive(Clone, Copy, Debug)]
struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    backoff: u32,
}

impl Rtt {
    fn sample(&mut self, r: Duration, c: &UdpConfig) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
        self.backoff = 0;
        self.rto = (self.srtt.expect("set") + (self.rttvar * 4).max(c.rto_min)).clamp(c.rto_min, c.rto_max);
    }

    fn current(&self, c: &UdpConfig) -> Duration {
        (self.rto * (1u32 << self.backoff.min(16))).min(c.rto_max)
    }
}

struct TxSlot {
    /// The packet; empty (its buffer back in the pool) once acknowledged.
    buf: Vec<u8>,
    /// Stream bytes the packet counts against the peer's credit.
    body: u32,
    /// [`wire::records_checksum`] of the records written so far.
    records_crc: u32,
    last_sent: Option<Instant>,
    sends: u32,
    sacked: bool,
    retx_queued: bool,
}

/// The sending half: slots of packets being filled, waiting for credit, or in flight.
struct Tx {
    slots: Vec<TxSlot>,
    /// Buffers of acknowledged packets, reused last-in first-out: the next packet is
    /// written into the buffer that left the cache least long ago, so the memory a stream
    /// touches is what is in flight, not the whole ring of slots.
    pool: Vec<Vec<u8>>,
    /// The session's checksum salt (records are checksummed as they are written).
    salt: u32,
    /// Oldest packet not yet acknowledged.
    una: u64,
    /// Next packet to transmit for the first time.
    next_tx: u64,
    /// Next sequence number to seal; the slot of `next_seq` is being filled when `open`.
    next_seq: u64,
    open: bool,
    /// Largest datagram we send (path MTU, the peer's receive size, half its credit).
    datagram_max: usize,
    retx: VecDeque<u64>,
    /// Stream bytes of the packets sealed so far; `stream_sealed - stream_sent` are sealed
    /// and waiting for their first transmission.
    stream_sealed: u64,
    /// Ceiling of the unsent bytes at which new packets are refused (`UdpConfig::unsent_max`);
    /// the bound in force is [`Tx::fill_ahead_max`].
    unsent_max: u64,
    stream_sent: u64,
    /// The credit window the peer grants at a time ([`AckBlock::grant`], at first the
    /// credit of its HELLO).
    peer_grant: u64,
    peer_credit_bytes: u64,
    peer_credit_seq: u64,
    /// Since when the next packet has waited for credit (for `credit_blocked_us`).
    credit_blocked_since: Option<Instant>,
    flow_control: bool,
    /// Length and bytes queued so far of a message streamed by `send_fragments`.
    streaming: Option<(u64, u64)>,
    fin_seq: Option<u64>,
    /// `close` was called while every slot was in use: the FIN waits for one.
    fin_pending: bool,
    closing: bool,
    down: Option<ChannelError>,
}

impl Tx {
    fn slot(&mut self, seq: u64) -> &mut TxSlot {
        let n = self.slots.len() as u64;
        &mut self.slots[(seq % n) as usize]
    }

    /// Slots neither in flight nor waiting: free for new packets (the open one counts as used).
    fn free_slots(&self) -> u64 {
        self.slots.len() as u64 - (self.next_seq - self.una) - u64::from(self.open)
    }

    /// Stream bytes written and not yet transmitted (sealed packets waiting for credit or
    /// for the driver, and the packet being filled).
    fn unsent_bytes(&self) -> u64 {
        let filling = if self.open {
            let slot = &self.slots[(self.next_seq % self.slots.len() as u64) as usize];
            (slot.buf.len() - wire::DATA_PREFIX_LEN) as u64
        } else {
            0
        };
        self.stream_sealed + filling - self.stream_sent
    }

    /// Unsent bytes at which new packets are refused: one [`CREDIT_STEPS`] step of the
    /// peer's grant (an eighth), at most `unsent_max` and at least one datagram. Credit
    /// comes back in such steps, so that much sealed ahead fills each step the moment it
    /// arrives; more would wait for later steps
    /// and go cold in the caches meanwhile. A lone stream with a 16 MiB grant keeps the
    /// whole `unsent_max` (1 MiB); each of eight streams sharing that budget (2 MiB grants)
    /// seals 256 KiB ahead, so eight senders on one CPU stay within its caches
    /// (BENCHMARKS.md, issue 3).
    fn fill_ahead_max(&self) -> u64 {
        let datagram = self.datagram_max as u64;
        (self.peer_grant / CREDIT_STEPS).clamp(datagram, self.unsent_max.max(datagram))
    }

    /// Whether the unsent bytes reached [`Tx::fill_ahead_max`]: no new packet is opened
    /// until they go out (`NoResource`), so that a sender blocked on credit does not fill
    /// its send slots far ahead of what it may transmit (see `UdpConfig::unsent_max`).
    fn unsent_full(&self) -> bool {
        self.unsent_bytes() >= self.fill_ahead_max()
    }

    /// Data bytes a record can carry in an empty packet.
    fn record_capacity(&self) -> usize {
        self.datagram_max - wire::DATA_PREFIX_LEN - wire::RECORD_HEADER_LEN
    }

    /// Seals the packet being filled, so it can be transmitted.
    fn seal(&mut self) {
        if self.open {
            let seq = self.next_seq;
            let slot = self.slot(seq);
            slot.body = (slot.buf.len() - wire::DATA_PREFIX_LEN) as u32;
            self.stream_sealed += u64::from(slot.body);
            self.open = false;
            self.next_seq += 1;
        }
    }

    /// Starts a new packet in the next slot (the caller checked there is one).
    fn open_packet(&mut self, flags: u32) {
        debug_assert!(!self.open && self.free_slots() > 0, "open_packet needs a free slot");
        let seq = self.next_seq;
        let cap = self.datagram_max;
        let mut buf = self.pool.pop().unwrap_or_default();
        if buf.capacity() < cap {
            buf.reserve_exact(cap - buf.len());
        }
        buf.clear();
        buf.resize(wire::DATA_PREFIX_LEN, 0);
        wire::write_data_prefix(&mut buf, seq, flags);
        let salt = self.salt;
        let slot = self.slot(seq);
        debug_assert!(slot.buf.is_empty(), "a slot is reused only after its packet was acknowledged");
        *slot = TxSlot {
            buf,
            body: 0,
            records_crc: wire::records_checksum(&[], salt),
            last_sent: None,
            sends: 0,
            sacked: false,
            retx_queued: false,
        };
        self.open = true;
    }

    /// Gives the buffer of acknowledged packet `seq` back to the pool.
    fn release(&mut self, seq: u64) {
        let buf = std::mem::take(&mut self.slot(seq).buf);
        if buf.capacity() > 0 {
            self.pool.push(buf);
        }
    }

    /// Appends one record (header and data gathered from `gather` starting at byte `skip`)
    /// to the open packet.
    fn append_record(&mut self, gather: &[&[u8]], skip: usize, data_len: usize, message_len: u64, offset: u64) {
        let seq = self.next_seq;
        let datagram_max = self.datagram_max;
        let slot = self.slot(seq);
        let buf = &mut slot.buf;
        let at = buf.len();
        buf.resize(at + wire::RECORD_HEADER_LEN, 0);
        wire::write_record_header(buf, at, data_len as u32, message_len as u32, offset as u32);
        let mut crc = wire::crc32c_append(slot.records_crc, &buf[at..]);
        let mut skip = skip;
        let mut left = data_len;
        for piece in gather {
            if left == 0 {
                break;
            }
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let take = (piece.len() - skip).min(left);
            // Copy and checksum a cache-sized chunk at a time: the checksum reads what the
            // copy just wrote while it is still in the first-level cache.
            for chunk in piece[skip..skip + take].chunks(COPY_CHUNK) {
                let from = buf.len();
                buf.extend_from_slice(chunk);
                crc = wire::crc32c_append(crc, &buf[from..]);
            }
            left -= take;
            skip = 0;
        }
        slot.records_crc = crc;
        debug_assert_eq!(left, 0, "gather holds the record");
        debug_assert!(slot.buf.len() <= datagram_max, "a packet fits its datagram");
    }

    fn open_room(&mut self) -> usize {
        if !self.open {
            return 0;
        }
        let seq = self.next_seq;
        let len = self.slot(seq).buf.len();
        self.datagram_max - len
    }

    fn check_up(&self) -> Result<(), SendError> {
        match &self.down {
            Some(e) => Err(SendError::ChannelDown(e.clone())),
            None if self.closing => Err(SendError::ChannelDown(ChannelError::Closed)),
            None => Ok(()),
        }
    }

    /// Largest message one `send` takes: half the slots' worth of full records.
    fn send_max(&self) -> usize {
        (self.slots.len() / 2).max(1) * self.record_capacity()
    }

    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.check_up()?;
        if gather.len() > GATHER_MAX {
            return Err(SendError::TooManyBuffers(gather.len(), GATHER_MAX));
        }
        let total: usize = gather.iter().map(|b| b.len()).sum();
        if total > self.send_max() {
            return Err(SendError::TooLarge { len: total as u64, max: self.send_max() as u64 });
        }
        if self.streaming.is_some() {
            return Ok(SendOutcome::NoResource);
        }
        if self.open_room() >= wire::RECORD_HEADER_LEN + total {
            self.append_record(gather, 0, total, total as u64, 0);
            return Ok(SendOutcome::Done);
        }
        let cap = self.record_capacity();
        let packets = total.div_ceil(cap).max(1) as u64;
        if self.free_slots() < packets || self.unsent_full() {
            return Ok(SendOutcome::NoResource);
        }
        self.seal();
        let mut offset = 0;
        loop {
            self.open_packet(0);
            let take = (total - offset).min(cap);
            self.append_record(gather, offset, take, total as u64, offset as u64);
            offset += take;
            if offset == total {
                break;
            }
            self.seal();
        }
        if total > cap {
            self.seal(); // the last fragment of a large message has no room worth keeping open
        }
        Ok(SendOutcome::Done)
    }

    fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        self.check_up()?;
        if message_len > wire::MESSAGE_MAX {
            return Err(SendError::TooLarge { len: message_len, max: wire::MESSAGE_MAX });
        }
        let (len, queued) = match self.streaming {
            Some(s) => s,
            None => {
                assert_eq!(offset, 0, "a streamed message starts at offset 0");
                (message_len, 0)
            }
        };
        assert_eq!((len, queued), (message_len, offset), "fragments of one message, in order");
        if message_len == 0 {
            return match self.send(&[])? {
                SendOutcome::Done => Ok(0),
                _ => Ok(0),
            };
        }
        self.streaming = Some((len, queued));
        self.seal();
        let cap = self.record_capacity();
        let mut taken = 0;
        while taken < data.len() && self.free_slots() > 0 && !self.unsent_full() {
            let take = (data.len() - taken).min(cap);
            self.open_packet(0);
            self.append_record(&[&data[taken..]], 0, take, message_len, offset + taken as u64);
            self.seal();
            taken += take;
        }
        let queued = offset + taken as u64;
        self.streaming = if queued == message_len { None } else { Some((message_len, queued)) };
        Ok(taken)
    }
}

/// Sends from inside a delivery (a reply on the same connection).
struct TxResponder<'a> {
    tx: &'a mut Tx,
}

impl Responder for TxResponder<'_> {
    fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.tx.send(gather)
    }
}

struct RxSlot {
    /// Sequence number held, 0 when free.
    seq: u64,
    buf: Vec<u8>,
    body: u32,
}

/// The receiving half: slots of packets that arrived, delivered in order.
struct Rx {
    slots: Vec<RxSlot>,
    pool: Vec<Vec<u8>>,
    datagram_max: usize,
    credit_bytes: u64,
    /// Packet being delivered, and the offset of its next record (0: not started).
    next_deliver: u64,
    deliver_pos: usize,
    /// Every packet up to here arrived.
    cum_ack: u64,
    highest: u64,
    consumed: u64,
    buffered: u64,
    /// The message whose fragments are being delivered: its length and next offset.
    message: Option<(u64, u64)>,
    fin_seq: Option<u64>,
    fin_delivered: bool,
    ack_due: Option<Instant>,
    unacked: u32,
    advertised_bytes: u64,
    advertised_seq: u64,
}

impl Rx {
    fn index(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    fn has(&self, seq: u64) -> bool {
        self.slots[self.index(seq)].seq == seq
    }

    fn credit(&self) -> (u64, u64) {
        (self.consumed + self.credit_bytes, self.next_deliver + self.slots.len() as u64 - 1)
    }

    fn ack_block(&mut self) -> AckBlock {
        let mut sack = [0u64; wire::SACK_WORDS];
        for i in 0..wire::SACK_RANGE {
            let seq = self.cum_ack + 2 + i;
            if seq > self.highest {
                break;
            }
            if self.has(seq) {
                sack[(i / 64) as usize] |= 1 << (i % 64);
            }
        }
        let (credit_bytes, credit_seq) = self.credit();
        self.advertised_bytes = credit_bytes;
        self.advertised_seq = credit_seq;
        self.ack_due = None;
        self.unacked = 0;
        // `credit_bytes` is at most the configured `u32` budget.
        let grant = u32::try_from(self.credit_bytes).unwrap_or(u32::MAX);
        AckBlock { cum_ack: self.cum_ack, sack, credit_bytes, credit_seq, grant }
    }

    fn ack_at(&mut self, at: Instant) {
        self.ack_due = Some(self.ack_due.map_or(at, |d| d.min(at)));
    }

    /// A buffer for the next datagram (from the pool, or new while the pool grows to its
    /// bound of slots plus the driver's batch).
    fn take_buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(self.datagram_max))
    }
}

/// One side of a reliable, flow-controlled UDP connection.
pub struct Connection {
    config: UdpConfig,
    state: State,
    is_client: bool,
    local_id: u32,
    peer_id: u32,
    local_nonce: [u8; 16],
    peer_hello: Option<Hello>,
    local_hello: Hello,
    /// The proof we send (client) or expect (server), and the server's challenge MAC.
    proof: [u8; 32],
    challenge_mac: [u8; 32],
    salt: u32,
    tx: Tx,
    rx: Rx,
    rtt: Rtt,
    rto_at: Option<Instant>,
    /// After a retransmission timeout: the packet resent as a probe and the end of the
    /// window then in flight.
    recovery: Option<Recovery>,
    ping_due: bool,
    last_ping: Instant,
    last_heard: Instant,
    created: Instant,
    handshake_due: Option<Instant>,
    /// Handshake packet to (re)send at the next `poll_transmit`.
    handshake_out: Option<Kind>,
    failure: Option<ChannelError>,
    counters: UdpCounters,
}

fn session_salt(secret: &[u8], client_nonce: &[u8; 16], server_nonce: &[u8; 16], ids: handshake::Ids) -> u32 {
    let m = handshake::mac(secret, b"udp1-salt", client_nonce, server_nonce, ids);
    u32::from_le_bytes(m[..4].try_into().expect("4 bytes"))
}

/// What the MACs and the salt cover besides the nonces: (client, server) connection ids
/// and node ids.
fn ids(client: &Hello, server: &Hello) -> handshake::Ids {
    handshake::Ids { tags: (client.conn_id, server.conn_id), nodes: (client.node, server.node) }
}

/// The role string of a proof: binds the MAC to the role, the version and both sides'
/// parameters, so none can be changed on the way (the node ids are bound by [`ids`]).
fn role(name: &[u8], client: &Hello, server: &Hello) -> Vec<u8> {
    let mut r = Vec::with_capacity(name.len() + 1 + 2 * wire::HELLO_FIELDS_LEN);
    r.extend_from_slice(name);
    r.push(wire::VERSION);
    let mut b = [0u8; wire::HELLO_FIELDS_LEN];
    client.write(&mut b, 0);
    r.extend_from_slice(&b);
    server.write(&mut b, 0);
    r.extend_from_slice(&b);
    r
}

impl Connection {
    fn new(config: UdpConfig, now: Instant, local_id: u32, nonce: [u8; 16], node: NodeId, is_client: bool) -> Self {
        config.validate().expect("UdpConfig::validate before making connections");
        assert_ne!(local_id, 0, "connection id 0 means 'none' on the wire");
        let w = config.window_packets as usize;
        let local_hello = Hello {
            nonce,
            conn_id: local_id,
            window: config.window_packets,
            datagram_max: config.datagram_max as u32,
            flags: if config.flow_control { wire::HELLO_FLOW_CONTROL } else { 0 },
            credit: config.credit_bytes,
            node: node.0,
        };
        let tx = Tx {
            slots: (0..w)
                .map(|_| TxSlot {
                    buf: Vec::new(),
                    body: 0,
                    records_crc: 0,
                    last_sent: None,
                    sends: 0,
                    sacked: false,
                    retx_queued: false,
                })
                .collect(),
            pool: Vec::with_capacity(w),
            salt: 0,
            una: 1,
            next_tx: 1,
            next_seq: 1,
            open: false,
            datagram_max: config.datagram_max,
            retx: VecDeque::with_capacity(w),
            stream_sealed: 0,
            unsent_max: u64::from(config.unsent_max),
            stream_sent: 0,
            peer_grant: 0,
            peer_credit_bytes: 0,
            peer_credit_seq: 0,
            credit_blocked_since: None,
            flow_control: config.flow_control,
            streaming: None,
            fin_seq: None,
            fin_pending: false,
            closing: false,
            down: None,
        };
        let rx = Rx {
            slots: (0..w).map(|_| RxSlot { seq: 0, buf: Vec::new(), body: 0 }).collect(),
            pool: Vec::new(),
            datagram_max: config.datagram_max,
            credit_bytes: u64::from(config.credit_bytes),
            next_deliver: 1,
            deliver_pos: 0,
            cum_ack: 0,
            highest: 0,
            consumed: 0,
            buffered: 0,
            message: None,
            fin_seq: None,
            fin_delivered: false,
            ack_due: None,
            unacked: 0,
            advertised_bytes: 0,
            advertised_seq: 0,
        };
        let rtt = Rtt { srtt: None, rttvar: Duration::ZERO, rto: config.rto_initial, backoff: 0 };
        Self {
            state: if is_client { State::HelloSent } else { State::ChallengeSent },
            is_client,
            local_id,
            peer_id: 0,
            local_nonce: nonce,
            peer_hello: None,
            local_hello,
            proof: [0; 32],
            challenge_mac: [0; 32],
            salt: 0,
            tx,
            rx,
            rtt,
            rto_at: None,
            recovery: None,
            ping_due: false,
            last_ping: now,
            last_heard: now,
            created: now,
            handshake_due: None,
            handshake_out: None,
            failure: None,
            counters: UdpCounters::default(),
            config,
        }
    }

    /// A client connection: its HELLO is the first thing [`Connection::poll_transmit`]
    /// returns. `local_id` (non-zero) is the id the peer puts in our packets; `nonce` must
    /// be fresh (the driver draws it from the OS, the simulator from its seed); `node` is
    /// told to the peer (`NodeId::UNKNOWN` when there is none).
    pub fn client(config: UdpConfig, now: Instant, local_id: u32, nonce: [u8; 16], node: NodeId) -> Self {
        let mut c = Self::new(config, now, local_id, nonce, node, true);
        c.handshake_out = Some(Kind::Hello);
        c
    }

    /// A server connection answering the HELLO `datagram` (which must have passed
    /// [`wire::parse_header`] as a HELLO): its CHALLENGE is the first thing
    /// [`Connection::poll_transmit`] returns.
    pub fn server(
        config: UdpConfig,
        now: Instant,
        local_id: u32,
        nonce: [u8; 16],
        node: NodeId,
        datagram: &[u8],
    ) -> Result<Self, WireError> {
        let h = wire::parse_header(datagram)?;
        if h.kind != Kind::Hello || h.conn_id != 0 {
            return Err(WireError::Malformed("not a hello"));
        }
        if !wire::verify_checksum(datagram, 0) {
            return Err(WireError::Checksum);
        }
        let hello = Hello::read_body(Kind::Hello, datagram, wire::HEADER_LEN)?;
        let mut c = Self::new(config, now, local_id, nonce, node, false);
        c.accept_peer_hello(hello);
        let role_server = role(b"udp-server", &hello, &c.local_hello);
        let role_client = role(b"udp-client", &hello, &c.local_hello);
        let ids = ids(&hello, &c.local_hello);
        c.challenge_mac = handshake::mac(&c.config.secret, &role_server, &hello.nonce, &nonce, ids);
        c.proof = handshake::mac(&c.config.secret, &role_client, &hello.nonce, &nonce, ids);
        c.salt = session_salt(&c.config.secret, &hello.nonce, &nonce, ids);
        c.tx.salt = c.salt;
        c.handshake_out = Some(Kind::Challenge);
        Ok(c)
    }

    fn accept_peer_hello(&mut self, peer: Hello) {
        self.peer_id = peer.conn_id;
        self.peer_hello = Some(peer);
        let dg = self.tx.datagram_max.min(peer.datagram_max as usize).min(peer.credit as usize / 2);
        self.tx.datagram_max = dg.max(wire::DATAGRAM_MIN);
        self.tx.peer_credit_bytes = u64::from(peer.credit);
        self.tx.peer_grant = u64::from(peer.credit);
        self.tx.peer_credit_seq = u64::from(peer.window);
        let w = self.tx.slots.len().min(peer.window as usize);
        self.tx.slots.truncate(w);
    }

    /// Whether the handshake finished and data may flow.
    pub fn is_established(&self) -> bool {
        self.state == State::Established
    }

    /// Why the connection is down, if it is.
    pub fn failure(&self) -> Option<&ChannelError> {
        self.failure.as_ref()
    }

    /// Whether `close` finished: everything we sent, FIN included, was acknowledged.
    pub fn is_closed(&self) -> bool {
        self.tx.fin_seq.is_some_and(|f| self.tx.una > f) || (self.tx.closing && self.failure.is_some())
    }

    /// Whether the peer closed (its FIN was delivered): it acknowledges nothing more.
    pub fn peer_closed(&self) -> bool {
        self.rx.fin_delivered
    }

    /// Our connection id (the one in packets we receive).
    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// The session's checksum salt, for the fuzzer to forge packets of the session (it
    /// plays a peer that knows the secret: `fuzz/fuzz_targets/udp_connection.rs`).
    #[cfg(fuzzing)]
    pub fn session_salt(&self) -> u32 {
        self.salt
    }

    /// The node the peer told in the handshake (`NodeId::UNKNOWN` before, or when it has
    /// none).
    pub fn peer_node(&self) -> NodeId {
        self.peer_hello.map_or(NodeId::UNKNOWN, |h| NodeId(h.node))
    }

    /// The client's HELLO nonce (server side: to recognise a repeated HELLO).
    pub fn peer_nonce(&self) -> Option<[u8; 16]> {
        self.peer_hello.map(|h| h.nonce)
    }

    /// What was dropped and done so far.
    pub fn counters(&self) -> &UdpCounters {
        &self.counters
    }

    /// Counts a datagram the driver received cut short (larger than its buffer).
    pub fn note_truncated(&mut self) {
        count_wire_error(&mut self.counters, WireError::Truncated);
    }

    /// Largest datagram this connection sends (after the handshake).
    pub fn datagram_max(&self) -> usize {
        self.tx.datagram_max
    }

    /// Lowers the largest datagram we send (the driver's path MTU); only before data flows.
    pub fn limit_datagram(&mut self, max: usize) {
        if self.tx.next_seq == 1 && !self.tx.open {
            self.tx.datagram_max = self.tx.datagram_max.min(max.max(wire::DATAGRAM_MIN));
        }
    }

    /// Bytes the receiver holds for the application (the credit bound applies to this).
    pub fn receive_buffered(&self) -> u64 {
        self.rx.buffered
    }

    /// Shares this receiver's buffer budget (`credit_bytes`) with the other connections of
    /// the same receiver, `sharers` in all: from the next grant on, the peer may have at
    /// most `credit_bytes / sharers` (never under four datagrams) buffered here, so that a
    /// receiver with N senders buffers about what it does with one instead of N times it.
    /// Credit already granted is not taken back, so the bound applies once the peer used it.
    pub fn share_receive_budget(&mut self, sharers: usize) {
        let whole = u64::from(self.config.credit_bytes);
        let floor = 4 * self.rx.datagram_max as u64;
        self.rx.credit_bytes = (whole / sharers.max(1) as u64).max(floor).min(whole);
    }

    /// Capacity behind [`Connection::receive_buffered`] (the credit this receiver grants,
    /// shared by [`Connection::share_receive_budget`]; a peer may hold more until it has
    /// used what was granted before a share shrank it).
    pub fn receive_capacity(&self) -> u64 {
        self.rx.credit_bytes
    }

    /// Packets sealed but not yet transmitted for the first time, and packets in flight.
    pub fn send_backlog(&self) -> (u64, u64) {
        (self.tx.next_seq - self.tx.next_tx, self.tx.next_tx - self.tx.una)
    }

    /// Stream bytes written and not yet transmitted for the first time (waiting for
    /// credit or for the driver, or in the packet being filled).
    pub fn unsent_bytes(&self) -> u64 {
        self.tx.unsent_bytes()
    }

    /// Whether [`Connection::unsent_bytes`] reached the fill-ahead bound (an eighth of the
    /// peer's grant, at most `UdpConfig::unsent_max`): sends that need a new packet answer
    /// `NoResource` until some go out.
    pub fn unsent_full(&self) -> bool {
        self.tx.unsent_full()
    }

    /// Largest message one [`Connection::send`] takes.
    pub fn send_max(&self) -> usize {
        self.tx.send_max()
    }

    /// Largest data bytes of one record (the largest whole delivery).
    pub fn fragment_max(&self) -> usize {
        self.tx.record_capacity()
    }

    fn fail(&mut self, e: ChannelError) {
        if self.failure.is_none() {
            match &e {
                ChannelError::Closed => tracing::debug!("udp connection {:#x} closed", self.local_id),
                _ => tracing::warn!("udp connection {:#x} failed: {e}", self.local_id),
            }
            self.failure = Some(e.clone());
            self.tx.down = Some(e);
            self.state = State::Down;
            self.rto_at = None;
            self.handshake_out = None;
        }
    }

    // ---- input ----

    /// Takes one datagram from the peer. Anything malformed, truncated, of another session
    /// or a duplicate is dropped and counted; nothing a peer sends can panic.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        let mut buf = self.rx.take_buffer();
        buf.clear();
        buf.extend_from_slice(datagram);
        self.handle_datagram_owned(now, &mut buf);
        self.rx.pool.push(buf);
    }

    /// A buffer to receive the next datagram into, for [`Connection::handle_datagram_owned`]
    /// (so that stored packets move instead of being copied).
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.rx.take_buffer()
    }

    /// Gives a buffer back to the pool.
    pub fn give_buffer(&mut self, buf: Vec<u8>) {
        if self.rx.pool.len() < self.rx.slots.len() + 64 {
            self.rx.pool.push(buf);
        }
    }

    /// Like [`Connection::handle_datagram`], but a packet that is kept moves out of `buf`
    /// (which is replaced by an empty buffer from the pool).
    pub fn handle_datagram_owned(&mut self, now: Instant, buf: &mut Vec<u8>) {
        let header = match wire::parse_header(buf) {
            Ok(h) => h,
            Err(e) => return count_wire_error(&mut self.counters, e),
        };
        if header.conn_id != self.local_id && !(header.kind == Kind::Hello && header.conn_id == 0) {
            self.counters.stranger += 1;
            tracing::debug!("udp {:#x}: dropped packet for connection {:#x}", self.local_id, header.conn_id);
            return;
        }
        let salt = if header.kind.is_session() { self.salt } else { 0 };
        if !wire::verify_checksum(buf, salt) {
            return count_wire_error(&mut self.counters, WireError::Checksum);
        }
        match header.kind {
            Kind::Hello => self.on_hello(buf),
            Kind::Challenge => self.on_challenge(now, buf),
            Kind::Proof => self.on_proof(now, buf),
            Kind::Ready => {
                if self.state == State::ProofSent {
                    self.establish(now);
                }
            }
            Kind::Data | Kind::Ack => {
                if self.state == State::ProofSent {
                    self.establish(now);
                }
                if self.state != State::Established {
                    // Down: still acknowledge nothing; the peer's timers will notice.
                    return;
                }
                self.last_heard = now;
                if header.kind == Kind::Ack {
                    match wire::read_ack(buf) {
                        Ok((ack, flags)) => {
                            self.on_ack(now, &ack);
                            if flags & wire::ACK_REQUESTED != 0 {
                                self.rx.ack_at(now);
                            }
                        }
                        Err(e) => count_wire_error(&mut self.counters, e),
                    }
                } else {
                    self.on_data(now, buf);
                }
            }
        }
    }

    fn on_hello(&mut self, b: &[u8]) {
        // A repeated HELLO (our CHALLENGE was lost): send the CHALLENGE again.
        match Hello::read_body(Kind::Hello, b, wire::HEADER_LEN) {
            Ok(h) if !self.is_client && self.peer_hello.is_some_and(|p| p.nonce == h.nonce) => {
                if self.state == State::ChallengeSent {
                    self.handshake_out = Some(Kind::Challenge);
                }
            }
            Ok(_) => self.counters.replayed += 1,
            Err(e) => count_wire_error(&mut self.counters, e),
        }
    }

    fn on_challenge(&mut self, now: Instant, b: &[u8]) {
        if !self.is_client {
            self.counters.malformed += 1;
            return;
        }
        let server = match Hello::read_body(Kind::Challenge, b, wire::HEADER_LEN) {
            Ok(h) => h,
            Err(e) => return count_wire_error(&mut self.counters, e),
        };
        match self.state {
            State::HelloSent => {}
            State::ProofSent if self.peer_hello.is_some_and(|p| p.nonce == server.nonce) => {
                self.handshake_out = Some(Kind::Proof); // our PROOF was lost
                return;
            }
            _ => {
                self.counters.replayed += 1;
                return;
            }
        }
        let mac_at = wire::HEADER_LEN + wire::CHALLENGE_MAC_AT;
        let mac = &b[mac_at..mac_at + 32];
        let ids = ids(&self.local_hello, &server);
        let role_server = role(b"udp-server", &self.local_hello, &server);
        if handshake::verify(&self.config.secret, &role_server, &self.local_nonce, &server.nonce, ids, mac).is_err() {
            self.counters.wrong_secret += 1;
            tracing::warn!("udp: server failed to prove the cluster secret");
            self.fail(ChannelError::Protocol("peer failed to prove the cluster secret".into()));
            return;
        }
        self.accept_peer_hello(server);
        let role_client = role(b"udp-client", &self.local_hello, &server);
        self.proof = handshake::mac(&self.config.secret, &role_client, &self.local_nonce, &server.nonce, ids);
        self.salt = session_salt(&self.config.secret, &self.local_nonce, &server.nonce, ids);
        self.tx.salt = self.salt;
        self.state = State::ProofSent;
        self.handshake_out = Some(Kind::Proof);
        self.last_heard = now;
    }

    fn on_proof(&mut self, now: Instant, b: &[u8]) {
        if self.is_client {
            self.counters.malformed += 1;
            return;
        }
        let proof = &b[wire::HEADER_LEN..wire::HEADER_LEN + wire::PROOF_BODY_LEN];
        if !constant_time_eq(proof, &self.proof) {
            self.counters.wrong_secret += 1;
            tracing::warn!("udp: client failed to prove the cluster secret");
            return;
        }
        match self.state {
            State::ChallengeSent => {
                self.establish(now);
                self.handshake_out = Some(Kind::Ready);
            }
            State::Established => self.handshake_out = Some(Kind::Ready), // READY was lost
            _ => {}
        }
    }

    fn establish(&mut self, now: Instant) {
        self.state = State::Established;
        self.handshake_due = None;
        self.last_heard = now;
        self.last_ping = now;
        tracing::debug!("udp connection {:#x} <-> {:#x} established", self.local_id, self.peer_id);
    }

    fn on_ack(&mut self, now: Instant, ack: &AckBlock) {
        let tx = &mut self.tx;
        if ack.cum_ack >= tx.next_tx {
            self.counters.malformed += 1;
            tracing::debug!("udp: ack of a packet never sent ({} >= {})", ack.cum_ack, tx.next_tx);
            return;
        }
        if ack.credit_bytes >= tx.peer_credit_bytes {
            tx.peer_grant = u64::from(ack.grant); // not from an ack that a newer one overtook
        }
        tx.peer_credit_bytes = tx.peer_credit_bytes.max(ack.credit_bytes);
        tx.peer_credit_seq = tx.peer_credit_seq.max(ack.credit_seq);
        let mut newest_clean_sample = None;
        if ack.cum_ack >= tx.una {
            for seq in tx.una..=ack.cum_ack {
                let slot = tx.slot(seq);
                // Sampled only at its first acknowledgement: a packet selectively acked
                // earlier and covered by the cumulative ack only now (once a hole before it
                // filled, perhaps after a timeout) would count the whole stall as its RTT
                // and inflate the timeout, up to `rto_max`, for every later loss.
                if slot.sends == 1 && !slot.sacked {
                    newest_clean_sample = slot.last_sent;
                }
                slot.sends = 0;
                slot.last_sent = None;
                tx.release(seq);
            }
            tx.una = ack.cum_ack + 1;
            // New data acknowledged: the path works, so the backed-off timeout goes back to
            // the estimate (waiting for a clean sample would stall a whole backed-off RTO
            // per hole while every packet in flight is a retransmission).
            self.rtt.backoff = 0;
            if let Some(r) = self.recovery.take() {
                if ack.cum_ack == r.probe {
                    // Exactly the probe came through: the rest of that window was lost too.
                    for seq in tx.una..r.end.min(tx.next_tx) {
                        let slot = tx.slot(seq);
                        if !slot.sacked && !slot.retx_queued {
                            slot.retx_queued = true;
                            tx.retx.push_back(seq);
                        }
                    }
                }
                // Beyond the probe: original packets arrived, the timeout was spurious.
            }
            self.rto_at = if tx.una == tx.next_tx { None } else { Some(now + self.rtt.current(&self.config)) };
        }
        let mut highest_sacked = 0;
        for i in 0..wire::SACK_RANGE {
            if ack.sack[(i / 64) as usize] & (1 << (i % 64)) != 0 {
                let seq = ack.cum_ack + 2 + i;
                if seq >= tx.next_tx {
                    break;
                }
                if seq >= tx.una {
                    let slot = tx.slot(seq);
                    if slot.sends == 1 && !slot.sacked {
                        newest_clean_sample = newest_clean_sample.max(slot.last_sent);
                    }
                    slot.sacked = true;
                    highest_sacked = seq;
                }
            }
        }
        if let Some(sent) = newest_clean_sample {
            self.rtt.sample(now.saturating_duration_since(sent), &self.config);
        }
        // Fast retransmit: a packet overtaken by REORDER_THRESHOLD selectively acked ones,
        // not sent within the last smoothed RTT.
        if highest_sacked >= tx.una + REORDER_THRESHOLD {
            let srtt = self.rtt.srtt.unwrap_or(self.config.rto_initial);
            for seq in tx.una..=highest_sacked - REORDER_THRESHOLD {
                let slot = tx.slot(seq);
                let stale = slot.last_sent.is_some_and(|t| now.saturating_duration_since(t) >= srtt);
                if !slot.sacked && !slot.retx_queued && stale {
                    slot.retx_queued = true;
                    tx.retx.push_back(seq);
                }
            }
        }
    }

    fn on_data(&mut self, now: Instant, buf: &mut Vec<u8>) {
        let prefix = match wire::read_data_prefix(buf) {
            Ok(p) => p,
            Err(e) => return count_wire_error(&mut self.counters, e),
        };
        if let Err(e) = wire::validate_records(buf) {
            return count_wire_error(&mut self.counters, e);
        }
        if buf.len() > self.rx.datagram_max {
            return count_wire_error(&mut self.counters, WireError::Malformed("datagram larger than announced"));
        }
        self.on_ack(now, &prefix.ack);
        let rx = &mut self.rx;
        let seq = prefix.seq;
        if seq < rx.next_deliver || rx.has(seq) {
            self.counters.replayed += 1;
            rx.ack_at(now); // the peer may have missed our ack
            return;
        }
        if seq >= rx.next_deliver + rx.slots.len() as u64 {
            self.counters.overrun += 1;
            tracing::debug!("udp {:#x}: packet {seq} beyond the receive slots", self.local_id);
            return;
        }
        if rx.fin_seq.is_some_and(|f| seq > f) {
            self.counters.malformed += 1;
            return;
        }
        let body = (buf.len() - wire::DATA_PREFIX_LEN) as u32;
        let spare = rx.take_buffer();
        let index = rx.index(seq);
        let slot = &mut rx.slots[index];
        let old = std::mem::replace(&mut slot.buf, std::mem::replace(buf, spare));
        if old.capacity() > 0 {
            rx.pool.push(old);
        }
        slot.seq = seq;
        slot.body = body;
        rx.buffered += u64::from(body);
        if prefix.flags & wire::DATA_FIN != 0 {
            rx.fin_seq = Some(seq);
        }
        self.counters.packets_received += 1;
        rx.highest = rx.highest.max(seq);
        while rx.has(rx.cum_ack + 1) {
            rx.cum_ack += 1;
        }
        rx.unacked += 1;
        if seq != rx.cum_ack || rx.unacked >= self.config.ack_every_packets || prefix.flags & wire::DATA_FIN != 0 {
            rx.ack_at(now);
        } else {
            rx.ack_at(now + self.config.ack_delay);
        }
    }

    /// Runs the timers that are due: retransmission, acks, keep-alive and credit probes,
    /// peer and handshake timeouts.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Down {
            return;
        }
        if self.state != State::Established {
            if now.saturating_duration_since(self.created) >= self.config.handshake_timeout {
                self.fail(ChannelError::PeerFailed("handshake timed out"));
                return;
            }
            if self.handshake_due.is_some_and(|t| t <= now) {
                self.handshake_out = match self.state {
                    State::HelloSent => Some(Kind::Hello),
                    State::ProofSent => Some(Kind::Proof),
                    _ => None,
                };
                self.rtt.backoff += 1;
                self.handshake_due = None;
            }
            return;
        }
        if now.saturating_duration_since(self.last_heard) >= self.config.peer_timeout {
            self.fail(ChannelError::PeerFailed("peer silent for longer than the peer timeout"));
            return;
        }
        if self.rto_at.is_some_and(|t| t <= now) {
            let tx = &mut self.tx;
            if tx.una < tx.next_tx {
                self.counters.timeouts += 1;
                // Only the oldest packet now (RFC 6298 5.4); the first ack after it tells a
                // lost window (go back and resend the rest) from a late one (F-RTO, RFC
                // 5682: resend nothing more), so a stall of the peer does not double the load.
                let oldest = tx.una;
                let slot = tx.slot(oldest);
                if !slot.sacked && !slot.retx_queued {
                    slot.retx_queued = true;
                    tx.retx.push_back(oldest);
                }
                self.recovery = Some(Recovery { probe: oldest, end: tx.next_tx });
                self.rtt.backoff += 1;
                self.rto_at = Some(now + self.rtt.current(&self.config));
            } else {
                self.rto_at = None;
            }
        }
        if self.ping_deadline().is_some_and(|t| t <= now) {
            self.ping_due = true;
            self.last_ping = now;
        }
    }

    /// When the keep-alive or credit probe is due.
    fn ping_deadline(&self) -> Option<Instant> {
        if self.state != State::Established || self.tx.una < self.tx.next_tx {
            return None; // data in flight: its acks (or the RTO) tell us about the peer
        }
        if self.tx.next_tx < self.tx.next_seq {
            return Some(self.last_ping + self.rtt.current(&self.config)); // blocked on credit
        }
        Some(self.last_heard.max(self.last_ping) + self.config.keepalive)
    }

    /// The next instant [`Connection::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Down {
            return None;
        }
        if self.state != State::Established {
            let give_up = self.created + self.config.handshake_timeout;
            return Some(self.handshake_due.map_or(give_up, |t| t.min(give_up)));
        }
        let mut t = self.last_heard + self.config.peer_timeout;
        for candidate in [self.rto_at, self.ping_deadline(), self.rx.ack_due].into_iter().flatten() {
            t = t.min(candidate);
        }
        Some(t)
    }

    /// When an acknowledgement is due (the driver may send it at its next poll).
    pub fn ack_due(&self) -> Option<Instant> {
        self.rx.ack_due
    }

    // ---- application ----

    /// Queues one message (a gather list) whole, or not at all (`NoResource` when the send
    /// slots are full). Small messages share packets; call [`Connection::flush`] (or poll)
    /// to send a partly filled one.
    pub fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        if self.state != State::Established && self.failure.is_none() {
            return Ok(SendOutcome::NoResource);
        }
        self.tx.send(gather)
    }

    /// Queues as many whole fragments of a large message as there are free slots; returns
    /// the bytes taken.
    pub fn send_fragments(&mut self, message_len: u64, offset: u64, data: &[u8]) -> Result<usize, SendError> {
        if self.state != State::Established && self.failure.is_none() {
            return Ok(0);
        }
        self.tx.send_fragments(message_len, offset, data)
    }

    /// Seals the packet being filled so that [`Connection::poll_transmit`] sends it.
    pub fn flush(&mut self) {
        self.tx.seal();
    }

    /// Delivers up to `max` in-order records (whole messages or fragments) to `deliver`,
    /// in place, with a [`Responder`] that queues replies on this connection. Returns the
    /// number delivered; `Err` once everything the peer sent was delivered and the peer
    /// closed, or the connection failed.
    pub fn poll_recv(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(Delivery<'_>, &mut dyn Responder),
    ) -> Result<usize, ChannelError> {
        let mut n = 0;
        let rx = &mut self.rx;
        while n < max {
            let index = rx.index(rx.next_deliver);
            if rx.slots[index].seq != rx.next_deliver {
                break;
            }
            if rx.deliver_pos == 0 {
                rx.deliver_pos = wire::DATA_PREFIX_LEN;
            }
            let slot = &rx.slots[index];
            if rx.deliver_pos >= slot.buf.len() {
                // Packet done: free its slot and grow the credit.
                let slot = &mut rx.slots[index];
                let body = u64::from(slot.body);
                let buf = std::mem::take(&mut slot.buf);
                slot.seq = 0;
                rx.pool.push(buf);
                rx.consumed += body;
                rx.buffered -= body;
                if rx.fin_seq == Some(rx.next_deliver) {
                    rx.fin_delivered = true;
                }
                rx.next_deliver += 1;
                rx.deliver_pos = 0;
                let (bytes, seq) = rx.credit();
                if bytes - rx.advertised_bytes >= rx.credit_bytes / CREDIT_STEPS
                    || seq - rx.advertised_seq >= rx.slots.len() as u64 / CREDIT_STEPS
                {
                    // A window update, due at once (`created` is in the past).
                    rx.ack_due = Some(self.created);
                }
                continue;
            }
            let (record, next) = match wire::read_record(&slot.buf, rx.deliver_pos) {
                Ok(r) => r,
                Err(e) => {
                    let e = ChannelError::Protocol(format!("stored record unreadable: {e}"));
                    self.fail(e.clone());
                    return Err(e);
                }
            };
            let expected = rx.message.map_or(0, |(_, off)| off);
            let continues = rx.message.is_none_or(|(len, _)| len == record.message_len);
            if record.offset != expected || !continues {
                let e = ChannelError::Protocol(format!(
                    "fragment at offset {} of a {}-byte message, expected offset {expected}",
                    record.offset, record.message_len
                ));
                self.fail(e.clone());
                return Err(e);
            }
            let end = record.offset + record.data.len() as u64;
            rx.message = if end == record.message_len { None } else { Some((record.message_len, end)) };
            rx.deliver_pos = next;
            deliver(
                Delivery { data: record.data, message_len: record.message_len, offset: record.offset },
                &mut TxResponder { tx: &mut self.tx },
            );
            n += 1;
        }
        if n == 0 {
            if self.rx.fin_delivered {
                return Err(ChannelError::Closed);
            }
            if let Some(e) = &self.failure {
                return Err(e.clone());
            }
        }
        Ok(n)
    }

    /// Starts a clean close: what was queued is sent, then a FIN; the peer delivers
    /// everything, then reports `Closed`. Poll until [`Connection::is_closed`] (the driver
    /// lingers up to `close_linger`). No more sends are taken.
    pub fn close(&mut self) {
        if self.state != State::Established || self.tx.closing {
            self.tx.closing = true;
            return;
        }
        self.tx.seal();
        self.tx.streaming = None;
        self.tx.fin_pending = true;
        self.queue_fin();
        self.tx.closing = true;
    }

    /// Puts the FIN packet in the next free slot, once there is one.
    fn queue_fin(&mut self) {
        if self.tx.fin_pending && self.tx.free_slots() > 0 {
            self.tx.fin_pending = false;
            self.tx.open_packet(wire::DATA_FIN);
            self.tx.fin_seq = Some(self.tx.next_seq);
            self.tx.seal();
        }
    }

    // ---- output ----

    /// Writes the next datagram to send into `out` (at least `datagram_max` bytes) and
    /// returns its length: a handshake packet, a retransmission, a new data packet (when
    /// credit allows), or a standalone ack or probe. `None` when nothing is due.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        match self.poll_transmit_in_place(now, out)? {
            Datagram::Written(len) => Some(len),
            Datagram::InSlot(seq) => {
                let d = self.slot_datagram(seq);
                out[..d.len()].copy_from_slice(d);
                Some(d.len())
            }
        }
    }

    /// Like [`Connection::poll_transmit`], without copying data packets: those are finished
    /// in their send slot and read with [`Connection::slot_datagram`] (the driver points
    /// `sendmmsg` at them). Only control packets are written into `out`.
    pub fn poll_transmit_in_place(&mut self, now: Instant, out: &mut [u8]) -> Option<Datagram> {
        if let Some(kind) = self.handshake_out.take() {
            return Some(Datagram::Written(self.write_handshake(now, kind, out)));
        }
        if self.state != State::Established {
            return None;
        }
        self.queue_fin();
        while let Some(seq) = self.tx.retx.pop_front() {
            let una = self.tx.una;
            let slot = self.tx.slot(seq);
            slot.retx_queued = false;
            if seq < una || slot.sacked {
                continue;
            }
            self.counters.retransmits += 1;
            self.finish_data(now, seq);
            return Some(Datagram::InSlot(seq));
        }
        let tx = &self.tx;
        if tx.next_tx < tx.next_seq {
            let seq = tx.next_tx;
            let body = u64::from(tx.slots[(seq % tx.slots.len() as u64) as usize].body);
            let credit_ok =
                seq <= tx.peer_credit_seq && (!tx.flow_control || tx.stream_sent + body <= tx.peer_credit_bytes);
            if credit_ok || !tx.flow_control {
                if let Some(since) = self.tx.credit_blocked_since.take() {
                    let waited = now.saturating_duration_since(since).as_micros();
                    self.counters.credit_blocked_us += u64::try_from(waited).unwrap_or(u64::MAX);
                }
                self.tx.next_tx += 1;
                self.tx.stream_sent += body;
                self.counters.packets_sent += 1;
                self.finish_data(now, seq);
                return Some(Datagram::InSlot(seq));
            }
            if self.tx.credit_blocked_since.is_none() {
                self.tx.credit_blocked_since = Some(now);
                self.counters.credit_stalls += 1;
            }
        }
        if self.rx.ack_due.is_some_and(|t| t <= now) || self.ping_due {
            let flags = if self.ping_due { wire::ACK_REQUESTED } else { 0 };
            self.ping_due = false;
            let ack = self.rx.ack_block();
            self.counters.acks_sent += 1;
            return Some(Datagram::Written(wire::write_ack(out, self.peer_id, self.salt, &ack, flags)));
        }
        None
    }

    /// Whether the send slot of `seq` still holds that packet, in flight (so that a
    /// datagram the kernel refused may be sent later from the slot).
    pub fn slot_holds(&self, seq: u64) -> bool {
        seq >= self.tx.una && seq < self.tx.next_tx
    }

    /// The finished datagram of data packet `seq` (see [`Connection::poll_transmit_in_place`]).
    pub fn slot_datagram(&self, seq: u64) -> &[u8] {
        debug_assert!(self.slot_holds(seq), "slot_datagram of a packet not in flight");
        &self.tx.slots[(seq % self.tx.slots.len() as u64) as usize].buf
    }

    /// Writes the current ack block and the checksum into the slot of `seq` and notes the
    /// transmission.
    fn finish_data(&mut self, now: Instant, seq: u64) {
        let ack = self.rx.ack_block();
        let (peer_id, salt) = (self.peer_id, self.salt);
        let slot = self.tx.slot(seq);
        slot.sends += 1;
        slot.last_sent = Some(now);
        wire::write_data_ack(&mut slot.buf, &ack);
        debug_assert_eq!(slot.records_crc, wire::records_checksum(&slot.buf[wire::DATA_PREFIX_LEN..], salt));
        wire::finish_with_records_checksum(&mut slot.buf, Kind::Data, peer_id, slot.records_crc);
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.current(&self.config));
        }
    }

    fn write_handshake(&mut self, now: Instant, kind: Kind, out: &mut [u8]) -> usize {
        let (len, conn_id, salt) = match kind {
            Kind::Hello => {
                self.local_hello.write_body(Kind::Hello, out, wire::HEADER_LEN);
                (wire::HEADER_LEN + wire::HELLO_BODY_LEN, 0, 0)
            }
            Kind::Challenge => {
                self.local_hello.write_body(Kind::Challenge, out, wire::HEADER_LEN);
                let at = wire::HEADER_LEN + wire::CHALLENGE_MAC_AT;
                out[at..at + 32].copy_from_slice(&self.challenge_mac);
                (wire::HEADER_LEN + wire::CHALLENGE_BODY_LEN, self.peer_id, 0)
            }
            Kind::Proof => {
                out[wire::HEADER_LEN..wire::HEADER_LEN + 32].copy_from_slice(&self.proof);
                (wire::HEADER_LEN + wire::PROOF_BODY_LEN, self.peer_id, 0)
            }
            Kind::Ready => (wire::HEADER_LEN, self.peer_id, self.salt),
            Kind::Data | Kind::Ack => unreachable!("not handshake packets"),
        };
        wire::finish(&mut out[..len], kind, conn_id, salt);
        if self.is_client && self.state != State::Established {
            self.handshake_due = Some(now + self.rtt.current(&self.config));
        }
        len
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
