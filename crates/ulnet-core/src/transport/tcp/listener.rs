//! Accepting TCP channels without ever blocking the caller.
//!
//! A connection taken from the kernel's queue runs its handshake ([`Handshake`], the
//! server's side) over its non-blocking socket, alongside every other connection still in
//! its handshake; one epoll set holds the listening socket and theirs, so a caller sleeps
//! on one descriptor ([`TcpChannelListener::as_fd`]) and each [`TcpChannelListener::try_accept_as`]
//! does work only for the sockets that have some. A stranger costs the endpoint one slot
//! among [`TcpConfig::handshakes_pending_max`] for at most [`TcpConfig::handshake_timeout`]:
//!
//! - *the deadline*: a connection that has not finished its handshake in time is closed;
//! - *the bound*: when every slot is taken, the oldest handshake is closed for the new one
//!   (the newest connection is the one most likely to be a live client: a flood of idle
//!   connections pushes out its own, and a client that finishes within the time the
//!   flood takes to fill the slots gets through);
//! - *refusals* (garbage, another version, a wrong secret, a peer that closed) end the
//!   connection at once.
//!
//! Each ending is counted ([`TcpListenerCounters`]) and logged at a limited rate.
//!
//! When the process is out of file descriptors (or the kernel out of memory) `accept`
//! fails with the connection still queued, and the listening socket stays readable. A
//! spare descriptor (of `/dev/null`) held for the purpose is closed, the connection taken
//! and closed at once, and the spare opened again: the client learns that the node could
//! not take it instead of waiting in the queue, and the caller does not spin on a socket
//! that stays readable. Without a spare (another thread took the descriptor first) the
//! listening socket leaves the epoll set for [`ACCEPT_PAUSE`].

use super::channel::TcpChannel;
use super::handshake::{self, Handshake, HandshakeError, OurHello};
use super::{random_tag, TcpConfig};
use crate::error::ConnectError;
use crate::log_limit::LogLimit;
use crate::node::NodeId;
use crate::watch::Watch;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long the listening socket rests after an `accept` that failed for lack of
/// descriptors, when no spare could be sacrificed. 100 ms: the descriptors freed by
/// handshakes ending and channels closing meanwhile are taken at the next look, and a
/// caller that waits on the listener wakes ten times a second instead of spinning.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Connections the kernel queues for the listener before it takes them. 1,024 (the kernel
/// caps it at `net.core.somaxconn`, 4,096 by default since Linux 5.4): a burst of clients
/// and members connecting between two looks of a busy caller waits in the queue. Past the
/// queue the kernel drops the last ACK of a connection's TCP handshake, and the client,
/// which believes it connected, waits a second for the retransmitted SYN-ACK (std's
/// default of 128 showed this with 200 idle connections on loopback).
const LISTEN_BACKLOG: i32 = 1024;
/// The listening socket's index in the epoll set; handshake slot `i` is `i + 1`.
const LISTENING: usize = 0;

/// What a listener did with the connections it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpListenerCounters {
    /// Connections taken from the kernel's queue.
    pub connections_accepted: u64,
    /// Handshakes that made a channel.
    pub handshakes_completed: u64,
    /// Handshakes refused: the peer sent something that is not a ulnet handshake.
    pub refused_not_ulnet: u64,
    /// Handshakes refused: the peer speaks another handshake version.
    pub refused_version: u64,
    /// Handshakes refused: the peer failed to prove the cluster secret.
    pub refused_bad_secret: u64,
    /// Handshakes ended by the peer closing or resetting its connection. A client with
    /// another secret is one of them: it finds out first, from our proof, and hangs up.
    pub refused_closed: u64,
    /// Handshakes closed because they did not finish within the handshake timeout.
    pub timed_out: u64,
    /// Handshakes closed to make room for a newer one: every slot was taken (the bound on
    /// handshakes at once), or no descriptor was left for the new connection.
    pub dropped_for_bound: u64,
    /// `accept` calls that failed for lack of descriptors or memory (the waiting connection
    /// was closed when a spare descriptor allowed it).
    pub accept_failed: u64,
}

/// A connection in its handshake.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    handshake: Handshake,
    /// The tag the peer's frames will carry (ours, told in the CHALLENGE).
    rx_tag: u32,
    /// Order of arrival: the smallest is the oldest.
    arrival: u64,
}

/// The log limits of a listener, one per kind of line.
#[derive(Default)]
struct Logs {
    refused: LogLimit,
    slow: LogLimit,
    accept_failed: LogLimit,
}

/// A listening TCP socket for channels; see the module documentation.
pub struct TcpChannelListener {
    listener: TcpListener,
    local: SocketAddr,
    /// The listening socket and the sockets in their handshake.
    watch: Watch,
    /// Handshake slots (`None`: free).
    pending: Vec<Option<Pending>>,
    pending_count: usize,
    arrivals: u64,
    /// Channels whose handshake finished, not yet taken by the caller.
    finished: VecDeque<TcpChannel>,
    /// Sacrificed to take and close a connection when descriptors run out.
    spare: Option<OwnedFd>,
    /// While set, the listening socket is out of the epoll set until then.
    paused_until: Option<Instant>,
    counters: TcpListenerCounters,
    logs: Logs,
    ready: Vec<usize>,
}

impl std::fmt::Debug for TcpChannelListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpChannelListener")
            .field("local", &self.local)
            .field("pending", &self.pending_count)
            .field("counters", &self.counters)
            .finish()
    }
}

fn open_spare() -> Option<OwnedFd> {
    let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
    match rustix::fs::open("/dev/null", flags, rustix::fs::Mode::empty()) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::debug!("tcp listener: no spare descriptor: {e}");
            None
        }
    }
}

/// `accept` failed for lack of descriptors or memory: the connection is still queued.
fn is_out_of_resources(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// `accept` failed for this connection only (it was aborted, or a network error pending on
/// it): take the next one.
fn is_connection_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::ConnectionAborted
        || e.kind() == std::io::ErrorKind::Interrupted
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EPROTO
                    | libc::EPERM
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

impl TcpChannelListener {
    /// Listens on `addr` (port 0 picks a free port).
    pub fn bind(addr: &str) -> Result<Self, ConnectError> {
        let listener = TcpListener::bind(addr)?;
        rustix::net::listen(&listener, LISTEN_BACKLOG).map_err(std::io::Error::from)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let mut watch = Watch::new()?;
        watch.add(LISTENING, listener.as_fd())?;
        Ok(Self {
            listener,
            local,
            watch,
            pending: Vec::new(),
            pending_count: 0,
            arrivals: 0,
            finished: VecDeque::new(),
            spare: open_spare(),
            paused_until: None,
            counters: TcpListenerCounters::default(),
            logs: Logs::default(),
            ready: Vec::new(),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// What the listener did so far.
    pub fn counters(&self) -> TcpListenerCounters {
        self.counters
    }

    /// Connections in their handshake now.
    pub fn handshakes_pending(&self) -> usize {
        self.pending_count
    }

    /// When [`TcpChannelListener::try_accept_as`] must run next even if no socket becomes
    /// readable: the first handshake deadline, or the end of an accept pause.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadlines = self.pending.iter().flatten().filter_map(|p| p.handshake.poll_timeout());
        deadlines.chain(self.paused_until).min()
    }

    /// Moves every handshake along and returns a channel whose handshake finished, if any.
    /// Never blocks. Strangers are refused, slow handshakes closed, both counted.
    pub fn try_accept(&mut self, config: &TcpConfig) -> Result<Option<TcpChannel>, ConnectError> {
        self.try_accept_as(config, NodeId::UNKNOWN)
    }

    /// [`TcpChannelListener::try_accept`] telling the peer that we are node `node`.
    pub fn try_accept_as(&mut self, config: &TcpConfig, node: NodeId) -> Result<Option<TcpChannel>, ConnectError> {
        let now = Instant::now();
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
            self.watch.add(LISTENING, self.listener.as_fd())?;
        }
        let mut ready = std::mem::take(&mut self.ready);
        self.watch.ready(&mut ready);
        for &i in &ready {
            if i == LISTENING {
                self.accept_waiting(now, config, node)?;
            } else {
                self.drive(i - 1, now);
            }
        }
        self.ready = ready;
        for i in 0..self.pending.len() {
            if self.pending[i].as_ref().is_some_and(|p| p.handshake.poll_timeout().is_some_and(|t| t <= now)) {
                self.drive(i, now);
            }
        }
        Ok(self.finished.pop_front())
    }

    /// Takes the connections waiting in the kernel's queue, at most a bound's worth per call
    /// (a flood cannot keep the caller here), and starts their handshakes.
    fn accept_waiting(&mut self, now: Instant, config: &TcpConfig, node: NodeId) -> Result<(), ConnectError> {
        for _ in 0..config.handshakes_pending_max.max(1) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    self.counters.connections_accepted += 1;
                    self.start(stream, peer, now, config, node);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if is_out_of_resources(&e) => return self.accept_without_descriptors(now, &e, config, node),
                Err(e) if is_connection_error(&e) => tracing::debug!("tcp listener {}: accept: {e}", self.local),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Starts the handshake of a new connection, making room by closing the oldest one in
    /// its handshake when every slot is taken.
    fn start(&mut self, stream: TcpStream, peer: SocketAddr, now: Instant, config: &TcpConfig, node: NodeId) {
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!("tcp listener {}: connection from {peer} dropped: {e}", self.local);
            return;
        }
        if self.pending_count >= config.handshakes_pending_max.max(1) {
            self.drop_oldest(now, config, false);
        }
        let rx_tag = random_tag();
        let ours = OurHello { tag: rx_tag, node, nonce: handshake::nonce() };
        let handshake = Handshake::server(&config.secret, ours, Some(now + config.handshake_timeout));
        self.arrivals += 1;
        let p = Pending { stream, peer, handshake, rx_tag, arrival: self.arrivals };
        let i = match self.pending.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pending.push(None);
                self.pending.len() - 1
            }
        };
        if let Err(e) = self.watch.add(i + 1, p.stream.as_fd()) {
            tracing::warn!("tcp listener {}: connection from {peer} dropped: cannot watch it: {e}", self.local);
            return;
        }
        self.pending[i] = Some(p);
        self.pending_count += 1;
        // Its HELLO has most likely arrived with it.
        self.drive(i, now);
    }

    /// Closes the oldest connection in its handshake for a new one: every slot is taken, or
    /// (`out_of_descriptors`) the process has no descriptor for the new one.
    fn drop_oldest(&mut self, now: Instant, config: &TcpConfig, out_of_descriptors: bool) {
        let oldest = (0..self.pending.len())
            .filter(|&i| self.pending[i].is_some())
            .min_by_key(|&i| self.pending[i].as_ref().map_or(u64::MAX, |p| p.arrival));
        let Some(i) = oldest else { return };
        let p = self.remove(i);
        self.counters.dropped_for_bound += 1;
        if let Some(unsaid) = self.logs.slow.allow(now) {
            let why = if out_of_descriptors {
                "no file descriptor left for a new connection".to_string()
            } else {
                format!("{} connections in their handshake at once", config.handshakes_pending_max)
            };
            tracing::warn!(
                "tcp listener {}: {why}; closed the oldest handshake, from {} ({unsaid} more slow handshakes \
                 closed since the last line; see the listener's counters)",
                self.local,
                p.peer
            );
        }
    }

    fn remove(&mut self, i: usize) -> Pending {
        let p = self.pending[i].take().expect("a pending handshake in this slot");
        self.watch.remove(i + 1, Some(p.stream.as_fd()));
        self.pending_count -= 1;
        p
    }

    /// Reads and writes what handshake `i` can without blocking, fires its deadline, and
    /// ends it if it finished.
    fn drive(&mut self, i: usize, now: Instant) {
        let Some(p) = self.pending[i].as_mut() else { return };
        exchange(&p.stream, &mut p.handshake);
        p.handshake.handle_timeout(now);
        let Some(outcome) = p.handshake.poll_outcome() else { return };
        let p = self.remove(i);
        match outcome {
            Ok(peer) => match TcpChannel::new(p.stream, p.rx_tag, peer.tag) {
                Ok(mut channel) => {
                    channel.peer_node = peer.node;
                    self.counters.handshakes_completed += 1;
                    self.finished.push_back(channel);
                }
                Err(e) => {
                    // Its readiness probe needs a descriptor of its own.
                    self.counters.accept_failed += 1;
                    self.say_out_of_resources(now, &format_args!("channel from {} not set up: {e}", p.peer), 0);
                }
            },
            Err(e) => self.count_failure(now, p.peer, &e),
        }
    }

    fn count_failure(&mut self, now: Instant, peer: SocketAddr, e: &HandshakeError) {
        let c = &mut self.counters;
        let (counter, limit) = match e {
            HandshakeError::NotUlnet => (&mut c.refused_not_ulnet, &mut self.logs.refused),
            HandshakeError::Version(_) => (&mut c.refused_version, &mut self.logs.refused),
            HandshakeError::BadSecret => (&mut c.refused_bad_secret, &mut self.logs.refused),
            HandshakeError::Closed | HandshakeError::Io(_) => (&mut c.refused_closed, &mut self.logs.refused),
            HandshakeError::TimedOut => (&mut c.timed_out, &mut self.logs.slow),
        };
        *counter += 1;
        if let Some(unsaid) = limit.allow(now) {
            let what = if matches!(e, HandshakeError::TimedOut) { "closed a slow handshake" } else { "refused" };
            tracing::warn!(
                "tcp listener {}: {what}: connection from {peer}: {e} ({unsaid} more refused or closed since the \
                 last line; see the listener's counters)",
                self.local
            );
        }
    }

    /// `accept` failed for lack of descriptors or memory, the connection still queued:
    /// frees a descriptor by closing the oldest handshake (the bound's policy) and takes
    /// the connection; with no handshake to close, takes it in the spare descriptor's slot
    /// and closes it; with no spare either, rests the listening socket for [`ACCEPT_PAUSE`].
    fn accept_without_descriptors(
        &mut self,
        now: Instant,
        e: &std::io::Error,
        config: &TcpConfig,
        node: NodeId,
    ) -> Result<(), ConnectError> {
        self.counters.accept_failed += 1;
        let mut closed = 0;
        for _ in 0..config.handshakes_pending_max.max(1) {
            let shedding = self.pending_count == 0;
            if !shedding {
                self.drop_oldest(now, config, true);
            } else if let Some(spare) = self.spare.take() {
                drop(spare);
            } else {
                break;
            }
            let taken = self.listener.accept();
            if shedding {
                self.spare = open_spare();
            }
            match taken {
                Ok((stream, peer)) if !shedding => {
                    self.counters.connections_accepted += 1;
                    self.start(stream, peer, now, config, node);
                }
                // Taken in the spare's slot: closed as it goes out of scope.
                Ok(_) => closed += 1,
                Err(again) if again.kind() == std::io::ErrorKind::WouldBlock => {
                    self.say_out_of_resources(now, e, closed);
                    return Ok(());
                }
                Err(err) if is_out_of_resources(&err) => self.counters.accept_failed += 1,
                Err(err) if is_connection_error(&err) => {}
                Err(err) => return Err(err.into()),
            }
        }
        // Still out of descriptors with connections waiting: rest rather than spin on a
        // listening socket that stays readable.
        self.watch.remove(LISTENING, Some(self.listener.as_fd()));
        self.paused_until = Some(now + ACCEPT_PAUSE);
        self.say_out_of_resources(now, e, closed);
        Ok(())
    }

    fn say_out_of_resources(&mut self, now: Instant, e: &dyn std::fmt::Display, closed: usize) {
        if let Some(unsaid) = self.logs.accept_failed.allow(now) {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
            let limit = limit.map_or("none".to_string(), |l| l.to_string());
            tracing::error!(
                "tcp listener {}: cannot accept a connection: {e} (open-file limit {limit}); closed {closed} waiting \
                 unserved. Raise the limit (ulimit -n, systemd LimitNOFILE=) or find what holds the descriptors ({unsaid} \
                 more failures since the last line)",
                self.local
            );
        }
    }
}

/// Writes and reads what `handshake` has and wants, until the socket would block or the
/// handshake ends.
fn exchange(stream: &TcpStream, handshake: &mut Handshake) {
    let mut buf = [0u8; 128];
    while !handshake.is_finished() {
        let mut moved = false;
        if !handshake.poll_transmit().is_empty() {
            // A handshake message (at most 68 bytes) always fits a new socket's send
            // buffer; a peer that never reads meets the deadline.
            match rustix::io::write(stream, handshake.poll_transmit()) {
                Ok(n) => {
                    handshake.handle_transmitted(n);
                    moved = n > 0;
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(_) => handshake.handle_closed(),
            }
        }
        let wanted = handshake.input_wanted().min(buf.len());
        if wanted > 0 {
            match rustix::io::read(stream, &mut buf[..wanted]) {
                Ok(0) => handshake.handle_closed(),
                Ok(n) => {
                    handshake.handle_input(&buf[..n]);
                    moved = true;
                }
                Err(rustix::io::Errno::AGAIN) => {}
                Err(rustix::io::Errno::INTR) => moved = true,
                Err(_) => handshake.handle_closed(),
            }
        }
        if !moved {
            return;
        }
    }
}

impl AsFd for TcpChannelListener {
    /// The epoll set of the listening socket and the handshakes in progress: readable when
    /// any of them has something.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.watch.as_fd()
    }
}
