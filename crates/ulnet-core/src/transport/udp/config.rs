//! Settings of UDP channels, each with its reason, and named profiles.

use std::time::Duration;

/// Settings of a UDP channel (both its sending and its receiving side).
///
/// Memory per channel is fixed up front: `window_packets × datagram_max` for the send
/// slots plus at most as much for the receive slots (receive buffers are taken from a pool
/// only while packets wait in them). Flow control keeps the bytes buffered at the receiver
/// at or below `credit_bytes`.
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// The cluster secret both sides prove in the handshake (HMAC-SHA256); it also seeds
    /// the session's packet checksums. Empty is a valid (weak) secret for one host.
    pub secret: Vec<u8>,
    /// Packets in flight per direction: the send slots of one side and the receive slots of
    /// the other. 256: at 64 KiB datagrams that is 16 MiB, far above loopback's
    /// bandwidth-delay product; at 1,472-byte datagrams it is 368 KiB, 3 ms at 1 Gb/s.
    /// Cost: `window_packets × datagram_max` of send memory.
    pub window_packets: u32,
    /// Bytes the receiver buffers for the application (delivered but not yet consumed,
    /// or waiting for a gap to fill): the credit it grants, renewed every eighth of it
    /// consumed. 16 MiB: on a busy host either process may be descheduled for
    /// milliseconds, and the pipe must stay full meanwhile (4 MiB measured 40% less
    /// bulk throughput on loopback); a slow receiver holds at most this much per sender.
    /// It matches the socket receive buffer the driver asks for. It is a budget per
    /// endpoint, shared by its open channels (each grants `credit_bytes / channels`, at
    /// least four datagrams): eight senders into one receiver then queue 16 MiB there, not
    /// 128 MiB that the receiver would copy out of memory long evicted from its caches.
    pub credit_bytes: u32,
    /// Most bytes a sender seals ahead of what it can transmit (packets waiting for the
    /// peer's credit or for the driver's next `sendmmsg`); beyond that `send` answers
    /// `NoResource` and the application waits for credit. The bound in force is an eighth
    /// of the credit the peer grants (credit returns in steps of about an eighth), capped
    /// here. 1 MiB: without a bound a sender blocked on credit filled all its send slots
    /// (16 MiB) ahead, and when credit came the kernel copied datagrams written
    /// milliseconds and megabytes earlier, long out of the caches — eight such senders on
    /// one CPU paid twice a lone stream's CPU per byte (BENCHMARKS.md, issue 3). A sender
    /// that writes a packet just before it goes out copies it into the socket from the
    /// cache. A lone stream (16 MiB grant) uses the whole 1 MiB: a fixed 256 KiB made it
    /// 5 % slower; eight streams sharing a receiver (2 MiB grants) seal 256 KiB each.
    pub unsent_max: u32,
    /// Whether this side obeys its peer's credit when sending. `true` keeps a slow
    /// receiver's problem with its own senders; `false` exists to measure what that is worth
    /// (`ulnet bench incast`): senders then overrun and the receiver drops and counts.
    pub flow_control: bool,
    /// Largest datagram to send or receive; the driver lowers it to the path MTU (minus IP
    /// and UDP headers) of each channel. 65,507: UDP's limit, which loopback carries whole.
    pub datagram_max: usize,
    /// Retransmission timeout before the first RTT sample. 20 ms: RFC 6298 says 1 s for
    /// the Internet; a cluster LAN answers in well under a millisecond.
    pub rto_initial: Duration,
    /// Floor of the retransmission timeout. 2 ms: stays above the scheduling noise of a
    /// busy host, where one-way delays of a millisecond are common.
    pub rto_min: Duration,
    /// Ceiling of the backed-off retransmission timeout, and so the longest stall after a
    /// partition heals. 200 ms.
    pub rto_max: Duration,
    /// Longest an acknowledgement waits to ride on a data packet. 200 µs: a request–reply
    /// exchange carries its acks for free, and a stream still gets acks well within an RTO.
    pub ack_delay: Duration,
    /// Received packets after which an acknowledgement goes out at once. 16: keeps the
    /// sender's window moving during a stream.
    pub ack_every_packets: u32,
    /// An idle channel sends a keep-alive probe this long after it last heard its peer.
    /// 250 ms.
    pub keepalive: Duration,
    /// A peer silent for this long is failed (`PeerFailed`). 20 s: longer than the
    /// partitions and switch reboots a cluster should ride out (the tests hold a 10 s
    /// partition), short enough that a dead peer is reported in bounded time.
    pub peer_timeout: Duration,
    /// Longest a connection handshake may take. 5 s: room for the HELLO and the CHALLENGE to
    /// be repeated over a lossy path.
    pub handshake_timeout: Duration,
    /// Longest `close` waits for the peer to acknowledge everything sent. 1 s.
    pub close_linger: Duration,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self::lan()
    }
}

impl UdpConfig {
    /// A cluster LAN (the defaults, reasons beside each field).
    pub fn lan() -> Self {
        Self {
            secret: Vec::new(),
            window_packets: 256,
            credit_bytes: 16 << 20,
            unsent_max: 1 << 20,
            flow_control: true,
            datagram_max: super::wire::DATAGRAM_LIMIT,
            rto_initial: Duration::from_millis(20),
            rto_min: Duration::from_millis(2),
            rto_max: Duration::from_millis(200),
            ack_delay: Duration::from_micros(200),
            ack_every_packets: 16,
            keepalive: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(20),
            handshake_timeout: Duration::from_secs(5),
            close_linger: Duration::from_secs(1),
        }
    }

    /// The simulator: small windows and credit (64 slots, 64 KiB, 1,400-byte datagrams)
    /// and a small unsent bound (8 KiB, a few datagrams) so that flow control,
    /// fragmentation and window stalls happen often, and a peer timeout of 5 s so that
    /// failure is found within short simulated runs.
    pub fn sim() -> Self {
        Self {
            window_packets: 64,
            credit_bytes: 64 << 10,
            unsent_max: 8 << 10,
            datagram_max: 1400,
            peer_timeout: Duration::from_secs(5),
            ..Self::lan()
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.window_packets == 0 || self.window_packets > 1 << 16 {
            return Err("window_packets must be 1 to 65,536");
        }
        if !(super::wire::DATAGRAM_MIN..=super::wire::DATAGRAM_LIMIT).contains(&self.datagram_max) {
            return Err("datagram_max must be 548 to 65,507");
        }
        if (self.unsent_max as usize) < self.datagram_max {
            return Err("unsent_max must hold at least one datagram");
        }
        if (self.credit_bytes as usize) < 2 * self.datagram_max {
            return Err("credit_bytes must hold at least two datagrams");
        }
        if self.rto_min.is_zero() || self.rto_min > self.rto_max {
            return Err("rto_min must be positive and at most rto_max");
        }
        Ok(())
    }
}
