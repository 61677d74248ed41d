//! The endpoint: a process's handle on the network.

use crate::cq::{CompletionKind, CompletionQueue};
use crate::error::{ChannelError, ConnectError, SendError};
use crate::log_limit::LogLimit;
use crate::node::NodeId;
use crate::trace::recorder::RUN_MAX;
use crate::trace::{self, MessageKind, PendingReceive, Recorder};
use crate::transport::shm::{self, AdmissionCounters, ShmConfig, ShmListener};
use crate::transport::tcp::{self, TcpChannelListener, TcpConfig, TcpListenerCounters};
use crate::transport::udp::{self, UdpChannelListener, UdpConfig, UdpCounters, UdpStats};
use crate::transport::{Capabilities, ReadyProbe, Responder, SendOutcome, Transport};
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Channels with a readiness descriptor (TCP sockets) from which an endpoint watches them
/// through one epoll set: a cluster node with dozens of members pays a system call or two
/// per poll; a point-to-point endpoint keeps the direct probe (one `recv` per look).
const WATCH_MIN_CHANNELS: usize = 4;

/// Identifies an endpoint within its process (reported in completions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub u32);

/// Identifies a channel of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// Settings of an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Settings of its shared-memory channels.
    pub shm: ShmConfig,
    /// Settings of its TCP channels.
    pub tcp: TcpConfig,
    /// Settings of its UDP channels.
    pub udp: UdpConfig,
    /// Most posted (queued) sends per channel. 64: a streaming sender keeps a few large
    /// messages queued while the receiver drains; beyond that the caller should wait.
    pub send_queue_max: usize,
    /// Fraction of a receive ring at which the "almost full" upcall fires. 3/4: leaves a
    /// quarter of the ring for what arrives while the handler runs.
    pub almost_full_fraction: f64,
    /// The node this endpoint belongs to, told to peers when channels are set up.
    /// Default: `ULNET_NODE_ID`, else the process id.
    pub node_id: NodeId,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            shm: ShmConfig::default(),
            tcp: TcpConfig::default(),
            udp: UdpConfig::default(),
            send_queue_max: 64,
            almost_full_fraction: 0.75,
            node_id: NodeId::default(),
        }
    }
}

/// What [`Endpoint::poll`] reports.
#[derive(Debug)]
pub enum Event<'a> {
    /// A message, or a fragment of a large one, handed over in place.
    Message {
        /// The channel it came on.
        channel: ChannelId,
        /// The bytes, valid during the call.
        data: &'a [u8],
        /// Length of the whole message.
        message_len: u64,
        /// Offset of `data` in the message.
        offset: u64,
        /// Sends on the same channel now, while `data` is still held in place.
        reply: ReplyTo<'a>,
    },
    /// A posted send finished; its buffer was handed back.
    SendComplete {
        /// The channel.
        channel: ChannelId,
        /// The token given to [`Endpoint::post_send`].
        token: u64,
    },
    /// The channel stopped; everything the peer sent before was delivered. Its socket and
    /// buffers are kept until [`Endpoint::close`] (so that its id is not reused while its
    /// owner still holds it): close it once done with it.
    ChannelDown {
        /// The channel.
        channel: ChannelId,
        /// Why.
        error: ChannelError,
    },
}

/// Sends on the channel a message came from, during its delivery: a server answers a
/// request it reads in place, with no copy of the request and no queueing.
pub struct ReplyTo<'a> {
    responder: &'a mut dyn Responder,
    counters: &'a mut EndpointCounters,
    channel: ChannelId,
    /// (this node, the peer), for traces.
    nodes: (NodeId, NodeId),
    /// For traces: the message being delivered, whole.
    message_len: u64,
    recorder: &'a mut Recorder,
    /// See [`Endpoint::channel_incarnation`].
    incarnation: u64,
}

impl ReplyTo<'_> {
    /// The incarnation of the channel the message came on ([`Endpoint::channel_incarnation`]):
    /// to send something to that channel later, and never to another that takes its id.
    #[inline]
    pub fn channel_incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Sends one message (a gather list of up to [`crate::GATHER_MAX`] buffers) whole, or
    /// not at all (`NoResource`).
    #[inline]
    pub fn send(&mut self, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.send_as(gather, MessageKind::Message, 0)
    }

    /// Like [`ReplyTo::send`], telling a trace what the message is (see
    /// [`Endpoint::send_as`]).
    #[inline]
    pub fn send_as(&mut self, gather: &[&[u8]], kind: MessageKind, request_id: u64) -> Result<SendOutcome, SendError> {
        let outcome = self.responder.send(gather)?;
        count_send(self.counters, outcome, gather);
        let session = trace::active();
        if session != 0 && outcome == SendOutcome::Done {
            self.recorder.send(session, self.nodes, self.channel.0, gather, kind, request_id);
        }
        Ok(outcome)
    }

    /// Tells a trace what the message being delivered is (see [`Endpoint::send_as`]); its
    /// request id decides whether its times are exact ([`trace::TraceConfig::sample`]).
    /// Does nothing while tracing is off.
    #[inline]
    pub fn trace_describe(&mut self, kind: MessageKind, request_id: u64) {
        let session = trace::active();
        if session != 0 {
            let (local, peer) = self.nodes;
            self.recorder.describe_receive(
                session,
                ((peer, local), self.channel.0, self.message_len),
                kind,
                request_id,
            );
        }
    }

    /// Marks, in a trace, the start of the handler of the message being delivered.
    #[inline]
    pub fn trace_handler_start(&mut self) {
        self.recorder.handler_start();
    }

    /// Marks, in a trace, the end of the handler of the message being delivered.
    #[inline]
    pub fn trace_handler_end(&mut self) {
        self.recorder.handler_end();
    }

    /// Takes the trace record of the message being delivered, for a handler that runs
    /// after the delivery (on a worker): set its handler times and give it to
    /// [`Endpoint::trace_put`]. `None` while tracing is off.
    pub fn trace_take(&mut self) -> Option<PendingReceive> {
        self.recorder.take_receive()
    }
}

/// Counts a send's outcome.
#[inline(always)]
fn count_send(counters: &mut EndpointCounters, outcome: SendOutcome, gather: &[&[u8]]) {
    count_send_of(counters, outcome, gather.iter().map(|b| b.len() as u64).sum())
}

fn count_send_of(counters: &mut EndpointCounters, outcome: SendOutcome, bytes: u64) {
    match outcome {
        SendOutcome::Done => {
            counters.messages_sent += 1;
            counters.bytes_sent += bytes;
        }
        SendOutcome::NoResource => counters.no_resource += 1,
        SendOutcome::InProgress(_) => {}
    }
}

impl std::fmt::Debug for ReplyTo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyTo")
    }
}

/// The conditions an endpoint can raise upcalls for (U-Net's two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upcall {
    /// A receive queue became non-empty: the handler gets each event as it is polled.
    NonEmpty = 0,
    /// A receive queue is almost full: the handler gets the channel, before it is drained.
    AlmostFull = 1,
}

type EventHandler = Box<dyn FnMut(Event<'_>) + Send>;
type ChannelHandler = Box<dyn FnMut(ChannelId) + Send>;

/// Counters of an endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointCounters {
    /// Messages sent (whole messages, not fragments), replies from delivery handlers
    /// included.
    pub messages_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Deliveries (messages or fragments) received.
    pub deliveries_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Sends refused for lack of resources.
    pub no_resource: u64,
    /// Channels that failed (not counting clean closes).
    pub channels_failed: u64,
    /// Channels the peer closed cleanly (with its goodbye).
    pub channels_closed_by_peer: u64,
    /// Accepted channels closed to make room for a new one
    /// ([`TcpConfig::accepted_channels_max`]); also counted in `channels_failed`.
    pub channels_evicted: u64,
    /// Times the endpoint slept in the kernel.
    pub sleeps: u64,
}

struct PostedSend {
    data: Vec<u8>,
    sent: usize,
    token: u64,
    /// Trace ticks when it was posted (0 while tracing is off).
    enqueued: u64,
}

struct ChannelSlot {
    transport: Box<dyn Transport>,
    probe: Arc<dyn ReadyProbe>,
    posted: VecDeque<PostedSend>,
    down: bool,
    /// The node at the other end ([`NodeId::UNKNOWN`] if the transport did not learn it).
    peer_node: NodeId,
    /// Accepted from the TCP listener (counted against
    /// [`TcpConfig::accepted_channels_max`]).
    accepted_tcp: bool,
    /// The endpoint's poll turn at which the channel last delivered something.
    active_turn: u64,
    /// See [`Endpoint::channel_incarnation`].
    incarnation: u64,
}

/// A process's handle on the network: channels to peers, each with its queues, and the
/// machinery to wait for them.
///
/// Receiving is [`Endpoint::poll`] (the fast path), [`Endpoint::wait`] (sleep until
/// something arrives), or upcalls run from [`Endpoint::wait`]. An endpoint belongs to one
/// thread at a time (it is `Send`, not `Sync`).
pub struct Endpoint {
    id: EndpointId,
    config: EndpointConfig,
    channels: Vec<Option<ChannelSlot>>,
    listener: Option<ShmListener>,
    tcp_listener: Option<TcpChannelListener>,
    udp_listener: Option<UdpChannelListener>,
    /// Drops and activity of every UDP channel and the UDP listener.
    udp_stats: Arc<UdpStats>,
    completed: VecDeque<(ChannelId, u64)>,
    cq: Option<CompletionQueue>,
    on_event: Option<EventHandler>,
    on_almost_full: Option<ChannelHandler>,
    upcall_enabled: [bool; 2],
    next_channel: usize,
    /// Posted sends not yet complete, over all channels.
    posted_total: usize,
    /// Wakes `wait` from other threads (made on first use).
    waker: Option<crate::waker::Waker>,
    /// The epoll set of the channels with a readiness descriptor (made on first use).
    watch: Option<crate::watch::Watch>,
    /// Scratch list of ready watched channels.
    ready: Vec<usize>,
    counters: EndpointCounters,
    /// Polls so far: the clock of [`ChannelSlot::active_turn`].
    turn: u64,
    /// Channels added so far: the next one's incarnation.
    incarnations: u64,
    /// Lines about channels closed for the bound on accepted ones.
    evict_log: LogLimit,
    /// What this endpoint records while tracing is on.
    recorder: Recorder,
}

impl Endpoint {
    /// A new endpoint with no channels. The first endpoint of a process starts tracing if
    /// `ULNET_TRACE` asks for it (see [`crate::trace`]).
    pub fn new(config: EndpointConfig) -> Self {
        static NEXT_ID: AtomicU32 = AtomicU32::new(0);
        trace::start_from_env(config.node_id);
        Self {
            id: EndpointId(NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            config,
            channels: Vec::new(),
            listener: None,
            tcp_listener: None,
            udp_listener: None,
            udp_stats: Arc::default(),
            completed: VecDeque::new(),
            cq: None,
            on_event: None,
            on_almost_full: None,
            upcall_enabled: [false; 2],
            next_channel: 0,
            posted_total: 0,
            waker: None,
            watch: None,
            ready: Vec::new(),
            counters: EndpointCounters::default(),
            turn: 0,
            incarnations: 0,
            evict_log: LogLimit::default(),
            recorder: Recorder::new(),
        }
    }

    /// A handle that wakes this endpoint's [`Endpoint::wait`] from any thread.
    pub fn waker(&mut self) -> std::io::Result<crate::waker::Waker> {
        if self.waker.is_none() {
            self.waker = Some(crate::waker::Waker::new()?);
        }
        Ok(self.waker.clone().expect("made above"))
    }

    /// This endpoint's id.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Counters so far.
    pub fn counters(&self) -> EndpointCounters {
        self.counters
    }

    /// The node this endpoint belongs to.
    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// The node at the other end of `channel`, if known.
    pub fn peer_node(&self, channel: ChannelId) -> Option<NodeId> {
        self.slot(channel).map(|s| s.peer_node).filter(|n| *n != NodeId::UNKNOWN)
    }

    /// Does this process's one-time set-up of shared-memory channels now: registering for
    /// `membarrier`. In a process of one thread that costs nothing; once the process has
    /// more, the kernel waits for an RCU grace period (about 15 ms here), which otherwise
    /// falls on the first channel made and on every peer waiting to connect to it. Call it
    /// first thing, before starting threads; later calls return at once.
    pub fn prepare_shm() {
        crate::sys::barrier::membarrier_registered();
    }

    /// Lets shared-memory peers on this host connect under `name`: processes of this
    /// user and of those `ShmConfig::allowed` lists, proving `ShmConfig::secret`.
    pub fn listen_shm(&mut self, name: &str) -> Result<(), ConnectError> {
        self.listener = Some(ShmListener::bind(name)?);
        Ok(())
    }

    /// What became of the peers that connected to our shared-memory listener (admitted,
    /// refused, failed), if we listen on one.
    pub fn shm_admission(&self) -> Option<AdmissionCounters> {
        self.listener.as_ref().map(ShmListener::admission_counters)
    }

    /// Lets peers connect over TCP at `addr` (port 0 picks one); returns the bound address.
    pub fn listen_tcp(&mut self, addr: &str) -> Result<std::net::SocketAddr, ConnectError> {
        let listener = TcpChannelListener::bind(addr)?;
        let bound = listener.local_addr()?;
        self.tcp_listener = Some(listener);
        Ok(bound)
    }

    /// Opens a TCP channel to the endpoint listening at `addr` (connection and handshake
    /// within about `timeout`). Fails at once with [`ConnectError::NoListener`] when nothing
    /// listens there.
    pub fn connect_tcp(&mut self, addr: &str, timeout: Duration) -> Result<ChannelId, ConnectError> {
        let channel = tcp::connect_as(addr, &self.config.tcp, self.config.node_id, timeout)?;
        Ok(self.add_channel(Box::new(channel)))
    }

    /// Like [`Endpoint::connect_tcp`], retrying until `timeout` while nothing listens at
    /// `addr` yet: for a caller that waits for a peer it knows to be starting.
    pub fn connect_tcp_retry(&mut self, addr: &str, timeout: Duration) -> Result<ChannelId, ConnectError> {
        let channel = tcp::connect_retry_as(addr, &self.config.tcp, self.config.node_id, timeout)?;
        Ok(self.add_channel(Box::new(channel)))
    }

    /// What the TCP listener did with the connections it took (all zero when not
    /// listening over TCP).
    pub fn tcp_listener_counters(&self) -> TcpListenerCounters {
        self.tcp_listener.as_ref().map(TcpChannelListener::counters).unwrap_or_default()
    }

    /// Connections to the TCP listener still in their handshake.
    pub fn tcp_handshakes_pending(&self) -> usize {
        self.tcp_listener.as_ref().map_or(0, TcpChannelListener::handshakes_pending)
    }

    /// When [`Endpoint::try_accept`] must run next even if nothing arrives: the first
    /// deadline of a handshake in progress (a silent peer is closed then) or the end of a
    /// pause of the TCP listener.
    pub fn accept_timeout(&self) -> Option<Instant> {
        let tcp = self.tcp_listener.as_ref().and_then(TcpChannelListener::poll_timeout);
        let udp = self.udp_listener.as_ref().and_then(UdpChannelListener::poll_timeout);
        tcp.into_iter().chain(udp).min()
    }

    /// Which of the channels that had the id `channel` has it now: a number never given
    /// to another channel of this endpoint. A channel id is reused once its channel is
    /// closed; a reply or message meant for the old channel, sent later, checks this first.
    /// `None` when no channel has that id.
    pub fn channel_incarnation(&self, channel: ChannelId) -> Option<u64> {
        self.slot(channel).map(|s| s.incarnation)
    }

    /// Channels open now (not down).
    pub fn channels_open(&self) -> usize {
        self.channels.iter().flatten().filter(|s| !s.down).count()
    }

    /// Lets peers connect over UDP at `addr` (port 0 picks one); returns the bound address.
    pub fn listen_udp(&mut self, addr: &str) -> Result<std::net::SocketAddr, ConnectError> {
        let listener = UdpChannelListener::bind(addr, self.udp_stats.clone())?;
        let bound = listener.local_addr();
        self.udp_listener = Some(listener);
        Ok(bound)
    }

    /// Opens a UDP channel to the endpoint listening at `addr`, repeating the handshake
    /// until `timeout`.
    pub fn connect_udp(&mut self, addr: &str, timeout: Duration) -> Result<ChannelId, ConnectError> {
        let channel = udp::connect(addr, &self.config.udp, self.config.node_id, timeout, self.udp_stats.clone())?;
        Ok(self.add_channel(Box::new(channel)))
    }

    /// What the UDP channels and listener of this endpoint dropped (malformed, truncated,
    /// replayed, wrong-secret, stranger datagrams) and did (packets, retransmissions).
    pub fn udp_counters(&self) -> UdpCounters {
        self.udp_stats.snapshot()
    }

    /// Accepts a peer that connected to one of our listeners, waiting up to `timeout`.
    pub fn accept(&mut self, timeout: Duration) -> Result<ChannelId, ConnectError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ch) = self.try_accept()? {
                return Ok(ch);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnectError::Timeout);
            }
            let mut fds = Vec::new();
            if let Some(l) = &self.listener {
                fds.push(rustix::event::PollFd::from_borrowed_fd(l.as_fd(), rustix::event::PollFlags::IN));
            }
            if let Some(l) = &self.tcp_listener {
                fds.push(rustix::event::PollFd::from_borrowed_fd(l.as_fd(), rustix::event::PollFlags::IN));
            }
            if let Some(l) = &self.udp_listener {
                fds.push(rustix::event::PollFd::from_borrowed_fd(l.as_fd(), rustix::event::PollFlags::IN));
            }
            // Handshakes in progress have deadlines to fire meanwhile.
            let timer = self.accept_timeout().map_or(left, |t| t.saturating_duration_since(Instant::now()).min(left));
            let ms = timer.as_millis().clamp(1, i32::MAX as u128) as i32;
            let _ = rustix::event::poll(&mut fds, ms);
        }
    }

    /// Accepts a peer if one is waiting on any of our listeners. Never blocks: the TCP and
    /// UDP listeners run their handshakes as state machines (call again by
    /// [`Endpoint::accept_timeout`] for their deadlines); peers that fail them are counted
    /// and dropped, not reported here. A TCP channel accepted beyond
    /// [`TcpConfig::accepted_channels_max`] closes the accepted channel idle longest (it
    /// then goes down with [`ChannelError::PeerFailed`]).
    pub fn try_accept(&mut self) -> Result<Option<ChannelId>, ConnectError> {
        if self.listener.is_none() && self.tcp_listener.is_none() && self.udp_listener.is_none() {
            return Err(ConnectError::Config("endpoint is not listening"));
        }
        if let Some(l) = &self.listener {
            if let Some(c) = l.try_accept_as(&self.config.shm, self.config.node_id)? {
                return Ok(Some(self.add_channel(Box::new(c))));
            }
        }
        if let Some(l) = &mut self.tcp_listener {
            if let Some(c) = l.try_accept_as(&self.config.tcp, self.config.node_id)? {
                self.make_room_for_accepted_tcp();
                let channel = self.add_channel(Box::new(c));
                if let Some(slot) = self.channels[channel.0 as usize].as_mut() {
                    slot.accepted_tcp = true;
                    slot.active_turn = self.turn;
                }
                return Ok(Some(channel));
            }
        }
        let udp = match &mut self.udp_listener {
            Some(l) => l.try_accept(&self.config.udp, self.config.node_id)?,
            None => None,
        };
        if let Some(c) = udp {
            return Ok(Some(self.add_channel(Box::new(c))));
        }
        Ok(None)
    }

    /// Enforces [`TcpConfig::accepted_channels_max`] before a TCP channel is accepted:
    /// aborts the open accepted channel that delivered nothing for the longest, which the
    /// next poll reports down (its owner closes it).
    fn make_room_for_accepted_tcp(&mut self) {
        let max = self.config.tcp.accepted_channels_max.max(1);
        let open = || self.channels.iter().enumerate().filter_map(|(i, s)| Some(i).zip(s.as_ref()));
        let accepted = open().filter(|(_, s)| s.accepted_tcp && !s.down);
        if accepted.clone().count() < max {
            return;
        }
        let Some((victim, _)) = accepted.min_by_key(|(_, s)| s.active_turn) else { return };
        let slot = self.channels[victim].as_mut().expect("found above");
        slot.transport.abort();
        // It no longer counts (nor is chosen again) while it waits to be reported down.
        slot.accepted_tcp = false;
        let peer = slot.peer_node;
        self.counters.channels_evicted += 1;
        if let Some(w) = &mut self.watch {
            // Reported at the next poll even if its socket has nothing to read.
            w.poll_again(victim);
        }
        if let Some(unsaid) = self.evict_log.allow(Instant::now()) {
            tracing::warn!(
                "endpoint: {max} accepted TCP channels open; closed channel {victim} (node {}), idle longest, to \
                 accept a new one ({unsaid} more closed since the last line). A client may be leaking connections; \
                 or raise TcpConfig::accepted_channels_max",
                peer.0
            );
        }
    }

    /// Opens a shared-memory channel to the endpoint listening under `name`, retrying until
    /// `timeout` while it is not there yet.
    pub fn connect_shm(&mut self, name: &str, timeout: Duration) -> Result<ChannelId, ConnectError> {
        let channel = shm::connect::connect_retry_as(name, &self.config.shm, self.config.node_id, timeout)?;
        Ok(self.add_channel(Box::new(channel)))
    }

    /// Adds a channel made by any transport.
    pub fn add_channel(&mut self, transport: Box<dyn Transport>) -> ChannelId {
        // A trace run names its channel, not its peer: a reused channel index ends it.
        self.recorder.write_pending();
        let probe = transport.probe();
        let peer_node = transport.peer_node().unwrap_or(NodeId::UNKNOWN);
        let slot = ChannelSlot {
            transport,
            probe: probe.clone(),
            posted: VecDeque::new(),
            down: false,
            peer_node,
            accepted_tcp: false,
            active_turn: 0,
            incarnation: self.incarnations,
        };
        self.incarnations += 1;
        let index = match self.channels.iter().position(Option::is_none) {
            Some(i) => {
                self.channels[i] = Some(slot);
                i
            }
            None => {
                self.channels.push(Some(slot));
                self.channels.len() - 1
            }
        };
        let channel = ChannelId(index as u32);
        if let Some(fd) = probe.readiness_fd() {
            if let Some(w) = &mut self.watch {
                if let Err(e) = w.add(index, fd) {
                    tracing::debug!("channel not watched, probed on every poll: {e}");
                }
            } else {
                self.watch_when_many();
            }
        }
        if let Some(cq) = &self.cq {
            cq.register(self.id, channel, probe);
        }
        channel
    }

    /// Moves the channels with a readiness descriptor into one epoll set once there are
    /// [`WATCH_MIN_CHANNELS`] of them: below that, probing each directly costs fewer system
    /// calls per poll than asking the set first (one `recv` instead of `epoll_wait` + `recv`
    /// on a point-to-point TCP channel).
    fn watch_when_many(&mut self) {
        let live = |s: &Option<ChannelSlot>| s.as_ref().is_some_and(|s| !s.down && s.probe.readiness_fd().is_some());
        if self.channels.iter().filter(|s| live(s)).count() < WATCH_MIN_CHANNELS {
            return;
        }
        let mut w = match crate::watch::Watch::new() {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!("no epoll set, channels probed one by one: {e}");
                return;
            }
        };
        for (i, slot) in self.channels.iter().enumerate() {
            if let Some(fd) = slot.as_ref().filter(|s| !s.down).and_then(|s| s.probe.readiness_fd()) {
                if let Err(e) = w.add(i, fd) {
                    tracing::debug!("channel not watched, probed on every poll: {e}");
                }
            }
        }
        self.watch = Some(w);
    }

    fn is_watched(&self, index: usize) -> bool {
        self.watch.as_ref().is_some_and(|w| w.is_watched(index))
    }

    /// Reports this endpoint's channels (present and future) into `cq`.
    pub fn attach_cq(&mut self, cq: &CompletionQueue) {
        for (i, slot) in self.channels.iter().enumerate() {
            if let Some(slot) = slot {
                cq.register(self.id, ChannelId(i as u32), slot.probe.clone());
            }
        }
        self.cq = Some(cq.clone());
    }

    /// What the channel's transport can do.
    pub fn caps(&self, channel: ChannelId) -> Option<Capabilities> {
        self.slot(channel).map(|s| s.transport.caps())
    }

    /// Channels currently open.
    pub fn channels(&self) -> impl Iterator<Item = ChannelId> + '_ {
        self.channels
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| !s.down))
            .map(|(i, _)| ChannelId(i as u32))
    }

    fn slot(&self, channel: ChannelId) -> Option<&ChannelSlot> {
        self.channels.get(channel.0 as usize).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, channel: ChannelId) -> Result<&mut ChannelSlot, SendError> {
        self.channels.get_mut(channel.0 as usize).and_then(Option::as_mut).ok_or(SendError::UnknownChannel)
    }

    /// Sends one message, given as a gather list of up to [`crate::GATHER_MAX`] buffers,
    /// copying it once (or not at all when it goes inline). `NoResource` when the channel
    /// has no room now, or when posted sends are still queued ahead of it. Over TCP, small
    /// messages are coalesced and written at the next poll, wait, [`Endpoint::flush_sends`]
    /// or close.
    #[inline]
    pub fn send(&mut self, channel: ChannelId, gather: &[&[u8]]) -> Result<SendOutcome, SendError> {
        self.send_as(channel, gather, MessageKind::Message, 0)
    }

    /// [`Endpoint::send`] for layers above that tell a trace what the message is: its kind
    /// and the request id that pairs a response with its request (0: none). Without
    /// tracing the two are ignored.
    #[inline]
    pub fn send_as(
        &mut self,
        channel: ChannelId,
        gather: &[&[u8]],
        kind: MessageKind,
        request_id: u64,
    ) -> Result<SendOutcome, SendError> {
        let slot = self.slot_mut(channel)?;
        if !slot.posted.is_empty() {
            self.counters.no_resource += 1;
            return Ok(SendOutcome::NoResource);
        }
        let outcome = slot.transport.send(gather)?;
        let peer = slot.peer_node;
        count_send(&mut self.counters, outcome, gather);
        let session = trace::active();
        if session != 0 && outcome == SendOutcome::Done {
            self.recorder.send(session, (self.config.node_id, peer), channel.0, gather, kind, request_id);
        }
        Ok(outcome)
    }

    /// Sends one message of `len` bytes (at most the transport's `fragment_max`) that `pack`
    /// writes in place, whole or not at all ([`Transport::send_packed`]): for data scattered
    /// in the caller's memory, gathered straight into the channel's buffer when the
    /// transport has one ([`Capabilities::pack_in_place`]). `NoResource` as for
    /// [`Endpoint::send`].
    pub fn send_packed(
        &mut self,
        channel: ChannelId,
        len: usize,
        pack: &mut dyn FnMut(&mut [u8]),
    ) -> Result<SendOutcome, SendError> {
        let slot = self.slot_mut(channel)?;
        if !slot.posted.is_empty() {
            self.counters.no_resource += 1;
            return Ok(SendOutcome::NoResource);
        }
        let outcome = slot.transport.send_packed(len, pack)?;
        let peer = slot.peer_node;
        count_send_of(&mut self.counters, outcome, len as u64);
        let session = trace::active();
        if session != 0 && outcome == SendOutcome::Done {
            self.recorder.send_packed(session, (self.config.node_id, peer), channel.0, len, MessageKind::Message);
        }
        Ok(outcome)
    }

    /// Writes a trace record taken with [`ReplyTo::trace_take`] (dropped if the tracing
    /// session it belongs to has ended).
    pub fn trace_put(&mut self, pending: PendingReceive) {
        let session = trace::active();
        if session != 0 {
            self.recorder.put(session, pending);
        }
    }

    /// Queues a message of any size (up to the transport's `message_max`) on the channel's
    /// send queue; it is streamed as the peer frees buffers, during [`Endpoint::poll`] or
    /// [`Endpoint::progress`], and a [`Event::SendComplete`] with `token` follows.
    pub fn post_send(&mut self, channel: ChannelId, data: Vec<u8>, token: u64) -> Result<SendOutcome, SendError> {
        let max_queue = self.config.send_queue_max;
        let slot = self.slot_mut(channel)?;
        let caps = slot.transport.caps();
        if data.len() as u64 > caps.message_max {
            return Err(SendError::TooLarge { len: data.len() as u64, max: caps.message_max });
        }
        if slot.down {
            return Err(SendError::ChannelDown(ChannelError::Closed));
        }
        if slot.posted.len() >= max_queue {
            self.counters.no_resource += 1;
            return Ok(SendOutcome::NoResource);
        }
        let enqueued = if trace::enabled() { trace::now() } else { 0 };
        slot.posted.push_back(PostedSend { data, sent: 0, token, enqueued });
        self.posted_total += 1;
        self.progress();
        Ok(SendOutcome::InProgress(token))
    }

    /// Moves posted sends along. Returns the number of bytes sent.
    pub fn progress(&mut self) -> usize {
        let mut work = 0;
        for (i, slot) in self.channels.iter_mut().enumerate() {
            let Some(slot) = slot else { continue };
            while let Some(p) = slot.posted.front_mut() {
                let len = p.data.len() as u64;
                let n = match slot.transport.send_fragments(len, p.sent as u64, &p.data[p.sent..]) {
                    Ok(n) => n,
                    Err(_) => break, // the channel is down; poll reports it
                };
                p.sent += n;
                work += n;
                self.counters.bytes_sent += n as u64;
                if p.sent < p.data.len() || (n == 0 && !p.data.is_empty()) {
                    break;
                }
                let done = slot.posted.pop_front().expect("front exists");
                self.posted_total -= 1;
                self.counters.messages_sent += 1;
                let session = trace::active();
                if session != 0 {
                    let nodes = (self.config.node_id, slot.peer_node);
                    let data: &[&[u8]] = &[&done.data];
                    self.recorder.send_slow(session, nodes, i as u32, data, MessageKind::Message, 0, done.enqueued);
                }
                self.completed.push_back((ChannelId(i as u32), done.token));
                if let Some(cq) = &self.cq {
                    cq.push(self.id, ChannelId(i as u32), CompletionKind::SendDone(done.token));
                }
            }
        }
        work
    }

    /// Delivers up to `max` events to `handle`: completed posted sends, received messages
    /// (in order per channel, channels served round-robin), and channels going down.
    /// Returns the number delivered. Never blocks.
    #[inline]
    pub fn poll(&mut self, max: usize, mut handle: impl FnMut(Event<'_>)) -> usize {
        self.poll_dyn(max, &mut handle)
    }

    /// Like [`Endpoint::poll`], for one channel only (its messages and its failure; posted
    /// sends complete through [`Endpoint::poll`]).
    pub fn poll_channel(&mut self, channel: ChannelId, max: usize, mut handle: impl FnMut(Event<'_>)) -> usize {
        // A receive still described only is recorded before anything else is.
        self.recorder.settle();
        let n = self.poll_one(channel.0 as usize, max, &mut handle);
        if n == 0 && trace::active() != 0 {
            self.recorder.idle();
        }
        n
    }

    /// Receives up to `max` deliveries from channel slot `i`; reports its failure once.
    /// While tracing, in batches of at most a run's worth: a stream's receives count into
    /// the open run a batch at a time (`Recorder::receive_run`), and no run may exceed
    /// `RUN_MAX` messages.
    fn poll_one(&mut self, i: usize, max: usize, handle: &mut dyn FnMut(Event<'_>)) -> usize {
        let batch_max = RUN_MAX as usize;
        if max <= batch_max || trace::active() == 0 {
            return self.poll_batch(i, max, handle);
        }
        let mut n = 0;
        while n < max {
            let want = (max - n).min(batch_max);
            let got = self.poll_batch(i, want, handle);
            n += got;
            if got < want {
                break;
            }
        }
        n
    }

    /// [`Endpoint::poll_one`]'s work, for one batch.
    fn poll_batch(&mut self, i: usize, max: usize, handle: &mut dyn FnMut(Event<'_>)) -> usize {
        let Some(slot) = self.channels.get_mut(i).and_then(Option::as_mut) else {
            return 0;
        };
        if slot.down {
            return 0;
        }
        let channel = ChannelId(i as u32);
        let counters = &mut self.counters;
        let recorder = &mut self.recorder;
        let nodes = (self.config.node_id, slot.peer_node);
        let incarnation = slot.incarnation;
        let session = trace::active();
        let exact = session != 0 && trace::exact_mode();
        // A stream's receives count straight into the open run (`Recorder::receive_run`)
        // while their size matches and no handler disturbs the recorder.
        let mut stream = if session != 0 && !exact { recorder.receive_run(session, channel.0, max) } else { None };
        let result = slot.transport.poll_recv(max, &mut |d, responder| {
            counters.deliveries_received += 1;
            counters.bytes_received += d.data.len() as u64;
            // One record per message, when it is whole (its last fragment).
            let traced = session != 0 && d.is_last();
            let message_len = d.message_len;
            let counted = match stream {
                Some((size, epoch)) if traced && size == message_len => Some(epoch),
                _ => None,
            };
            if traced && counted.is_none() {
                recorder.open_receive(exact);
            }
            let reply = ReplyTo {
                responder,
                counters: &mut *counters,
                channel,
                nodes,
                message_len,
                recorder: &mut *recorder,
                incarnation,
            };
            handle(Event::Message { channel, data: d.data, message_len, offset: d.offset, reply });
            if traced {
                match counted {
                    Some(epoch) if recorder.epoch() == epoch => recorder.count_in_receive_run(),
                    _ => {
                        if let Some((_, epoch)) = stream.take() {
                            recorder.end_receive_run(epoch);
                        }
                        recorder.close_receive(session, (nodes.1, nodes.0), channel.0, message_len);
                    }
                }
            }
        });
        if let (Some((_, epoch)), Ok(1..)) = (stream, &result) {
            recorder.end_receive_run(epoch);
        }
        match result {
            Ok(got) => {
                if got > 0 {
                    slot.active_turn = self.turn;
                }
                got
            }
            Err(error) => {
                slot.down = true;
                if let Some(w) = &mut self.watch {
                    // A dead socket stays readable: it would keep every wait from sleeping.
                    w.remove(i, slot.probe.readiness_fd());
                }
                if error == ChannelError::Closed {
                    self.counters.channels_closed_by_peer += 1;
                } else {
                    self.counters.channels_failed += 1;
                }
                if let Some(cq) = &self.cq {
                    cq.push(self.id, channel, CompletionKind::ChannelDown);
                    cq.unregister(self.id, channel);
                }
                handle(Event::ChannelDown { channel, error });
                1
            }
        }
    }

    fn poll_dyn(&mut self, max: usize, handle: &mut dyn FnMut(Event<'_>)) -> usize {
        // A receive still described only is recorded before anything else is.
        self.recorder.settle();
        self.turn = self.turn.wrapping_add(1);
        let mut n = 0;
        if self.posted_total > 0 {
            self.progress();
        }
        while n < max {
            let Some((channel, token)) = self.completed.pop_front() else {
                break;
            };
            handle(Event::SendComplete { channel, token });
            n += 1;
        }
        // Round-robin over the channels that are not watched, without a division in the
        // spin loop.
        let count = self.channels.len();
        let mut i = if self.next_channel < count { self.next_channel } else { 0 };
        for _ in 0..count {
            if n >= max {
                break;
            }
            if !self.is_watched(i) {
                n += self.poll_one(i, max - n, handle);
            }
            i += 1;
            if i == count {
                i = 0;
            }
        }
        self.next_channel = i;
        // The watched ones the epoll set reports.
        if n < max {
            if let Some(w) = &mut self.watch {
                w.ready(&mut self.ready);
            }
            let ready = std::mem::take(&mut self.ready);
            for &i in &ready {
                if n >= max {
                    // Level-triggered: those not visited are reported again; those that
                    // buffered input are remembered.
                    if let Some(w) = &mut self.watch {
                        w.poll_again(i);
                    }
                    continue;
                }
                let budget = max - n;
                let got = self.poll_one(i, budget, handle);
                if got >= budget {
                    if let Some(w) = &mut self.watch {
                        w.poll_again(i);
                    }
                }
                n += got;
            }
            self.ready = ready;
        }
        // Sends coalesce until the next poll: channels not visited above still write theirs.
        if self.watch.is_some() {
            for (i, slot) in self.channels.iter_mut().enumerate() {
                if let Some(slot) = slot.as_mut().filter(|s| !s.down) {
                    if self.watch.as_ref().is_some_and(|w| w.is_watched(i)) {
                        let _ = slot.transport.flush();
                    }
                }
            }
        }
        // An empty poll is the tracer's time to move records on; while tracing is off it
        // costs the spin loop one load and a branch.
        if n == 0 && trace::active() != 0 {
            self.recorder.idle();
        }
        n
    }

    /// Whether any channel has something to receive right now.
    pub fn is_readable(&self) -> bool {
        self.channels
            .iter()
            .enumerate()
            .any(|(i, s)| s.as_ref().is_some_and(|s| !s.down && !self.is_watched(i) && s.probe.is_ready()))
            || !self.completed.is_empty()
            || self.watch.as_ref().is_some_and(|w| w.any_ready())
    }

    /// Sleeps in the kernel until a channel has something, a peer connects or hangs up, or
    /// `timeout` passes. With upcalls enabled, runs them before returning: the "almost
    /// full" handler for every channel past the threshold, then the "non-empty" handler for
    /// every event that can be polled. Returns the number of upcall events run.
    pub fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<usize> {
        if !self.is_readable() {
            self.sleep(timeout)?;
        }
        Ok(self.run_upcalls())
    }

    /// Like [`Endpoint::wait`], also waking when one of `extra` becomes readable: a thread
    /// that serves its channels and a local producer (an eventfd another thread writes when
    /// it has handed over work) sleeps on both at once instead of polling either.
    pub fn wait_also(
        &mut self,
        extra: &[std::os::fd::BorrowedFd<'_>],
        timeout: Option<Duration>,
    ) -> std::io::Result<usize> {
        if !self.is_readable() {
            self.flush_sends();
            self.recorder.before_sleep();
            let probes: Vec<Arc<dyn ReadyProbe>> =
                self.channels.iter().flatten().filter(|s| !s.down).map(|s| s.probe.clone()).collect();
            if crate::wait::sleep_on(&probes, extra, timeout)? {
                self.counters.sleeps += 1;
            }
            self.recorder.woke();
        }
        Ok(self.run_upcalls())
    }

    /// Writes every channel's queued sends (TCP coalesces small messages until the next
    /// poll, wait, flush or close). Returns `true` when nothing is left queued.
    pub fn flush_sends(&mut self) -> bool {
        let mut all = true;
        for slot in self.channels.iter_mut().flatten().filter(|s| !s.down) {
            all &= slot.transport.flush().unwrap_or(true);
        }
        all
    }

    fn sleep(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.flush_sends();
        self.recorder.before_sleep();
        let probes: Vec<Arc<dyn ReadyProbe>> = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().filter(|s| !s.down && !self.is_watched(i)).map(|s| s.probe.clone()))
            .collect();
        let mut extra = Vec::new();
        if let Some(w) = &self.watch {
            extra.push(w.as_fd());
        }
        if let Some(l) = &self.listener {
            extra.push(l.as_fd());
        }
        if let Some(l) = &self.tcp_listener {
            extra.push(l.as_fd());
        }
        if let Some(w) = &self.waker {
            extra.push(w.as_fd());
        }
        if let Some(l) = &self.udp_listener {
            extra.push(l.as_fd());
        }
        if crate::wait::sleep_on(&probes, &extra, timeout)? {
            self.counters.sleeps += 1;
        }
        self.recorder.woke();
        if let Some(w) = &self.waker {
            w.drain();
        }
        Ok(())
    }

    /// Installs the handler for an upcall condition (disabled until enabled).
    pub fn set_upcall_nonempty(&mut self, handler: impl FnMut(Event<'_>) + Send + 'static) {
        self.on_event = Some(Box::new(handler));
    }

    /// Installs the "almost full" handler (disabled until enabled).
    pub fn set_upcall_almost_full(&mut self, handler: impl FnMut(ChannelId) + Send + 'static) {
        self.on_almost_full = Some(Box::new(handler));
    }

    /// Enables or disables an upcall; a flag, so it is cheap to toggle around critical work.
    #[inline]
    pub fn enable_upcall(&mut self, condition: Upcall, enabled: bool) {
        self.upcall_enabled[condition as usize] = enabled;
    }

    fn run_upcalls(&mut self) -> usize {
        let mut ran = 0;
        if self.upcall_enabled[Upcall::AlmostFull as usize] {
            if let Some(mut handler) = self.on_almost_full.take() {
                let fraction = self.config.almost_full_fraction;
                for (i, slot) in self.channels.iter().enumerate() {
                    let Some(slot) = slot else { continue };
                    let (used, capacity) = slot.transport.receive_backlog();
                    if !slot.down && used as f64 >= fraction * capacity as f64 {
                        handler(ChannelId(i as u32));
                        ran += 1;
                    }
                }
                self.on_almost_full = Some(handler);
            }
        }
        if self.upcall_enabled[Upcall::NonEmpty as usize] {
            if let Some(mut handler) = self.on_event.take() {
                ran += self.poll_dyn(usize::MAX, &mut |e| handler(e));
                self.on_event = Some(handler);
            }
        }
        ran
    }

    /// Closes a channel cleanly: the peer gets everything sent so far, then `Closed`.
    pub fn close(&mut self, channel: ChannelId) {
        self.remove_channel(channel, false);
    }

    /// Drops a channel at once, discarding what it has not delivered (see
    /// [`crate::transport::Transport::abort`]): a channel to a peer that was unreachable, replaced by a new one.
    pub fn abort(&mut self, channel: ChannelId) {
        self.remove_channel(channel, true);
    }

    fn remove_channel(&mut self, channel: ChannelId, abort: bool) {
        self.recorder.write_pending();
        if let Some(slot) = self.channels.get_mut(channel.0 as usize).and_then(Option::take) {
            let mut slot = slot;
            if let Some(w) = &mut self.watch {
                w.remove(channel.0 as usize, slot.probe.readiness_fd());
            }
            self.posted_total -= slot.posted.len();
            if abort {
                slot.transport.abort();
            } else {
                slot.transport.close();
            }
            if let Some(cq) = &self.cq {
                cq.unregister(self.id, channel);
            }
        }
    }

    /// Blocks until every posted send on `channel` has gone out, or `timeout` passes.
    pub fn flush(&mut self, channel: ChannelId, timeout: Duration) -> Result<(), SendError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.progress();
            let slot = self.slot_mut(channel)?;
            if slot.posted.is_empty() {
                return Ok(());
            }
            if slot.down || Instant::now() >= deadline {
                return Err(SendError::ChannelDown(ChannelError::PeerFailed("flush did not complete")));
            }
            std::hint::spin_loop();
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // A run still open, or a receive not recorded yet, goes to the file with the rest.
        self.recorder.write_pending();
        if let Some(cq) = &self.cq {
            for (i, slot) in self.channels.iter().enumerate() {
                if slot.is_some() {
                    cq.unregister(self.id, ChannelId(i as u32));
                }
            }
        }
    }
}
