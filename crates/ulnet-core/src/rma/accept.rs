//! How the engine gets new channels from importers: [`Acceptor`]s, one per listener, none
//! of which ever blocks the engine thread.
//!
//! - UDP and TCP ([`UdpAcceptor`], [`TcpAcceptor`]): the listeners' handshakes are sans-IO
//!   state machines over non-blocking sockets; the engine runs them in `try_accept` and
//!   wakes for their timers ([`Acceptor::poll_timeout`]: retransmitted challenges,
//!   handshake deadlines) as it wakes for its channels' timerfds. A TCP listener keeps at
//!   most [`TcpConfig::handshakes_pending_max`] connections in their handshake, closing
//!   the oldest for a new one, each for at most [`TcpConfig::handshake_timeout`]: silent
//!   clients delay neither connected importers nor the next importer, however many they are.
//! - Shared memory ([`ShmAcceptor`]): its handshake blocks (for up to 5 s when a client
//!   connects and says nothing). The engine only takes connections (non-blocking
//!   `accept`) and runs each handshake on a short-lived thread of its own, at most
//!   [`HANDSHAKES_MAX`] at once; finished channels come back through a queue and an
//!   eventfd. A silent client holds up its own thread, never the engine.
//!
//! ```text
//!  engine thread                         handshake threads (one per shm connection)
//!    accept (non-blocking) --spawn-->      handshake (blocking, <= 5 s)
//!    try_accept: pop <-- ready queue + eventfd <--+
//! ```

use crate::error::ConnectError;
use crate::node::NodeId;
use crate::sys::doorbell::Doorbell;
use crate::transport::shm::admission::AdmissionCells;
use crate::transport::shm::connect::AcceptedShm;
use crate::transport::shm::{ShmConfig, ShmListener};
use crate::transport::tcp::{TcpChannelListener, TcpConfig};
use crate::transport::udp::{UdpChannelListener, UdpConfig, UdpStats};
use crate::transport::Transport;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A listener that hands the engine new channels from importers, of any transport.
pub trait Acceptor: Send {
    /// A channel if an importer has finished connecting. Never blocks (the engine thread
    /// calls it between requests).
    fn try_accept(&mut self) -> Result<Option<Box<dyn Transport>>, ConnectError>;
    /// Descriptors that become readable when [`Acceptor::try_accept`] has work.
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>>;
    /// When `try_accept` must run next even if nothing arrives (a handshake's timer),
    /// for listeners whose handshakes the engine drives itself.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

/// Handshakes of one shared-memory listener running at once; connections beyond wait in
/// the kernel's accept queue until one finishes. 64: a rack of importers connecting at the
/// same moment, each thread a 256 KiB stack for up to 5 s.
pub const HANDSHAKES_MAX: usize = 64;
/// Stack of a handshake thread: an HMAC, a few system calls and a log line.
const HANDSHAKE_STACK: usize = 256 << 10;

/// What the handshake threads hand back, and how many are running.
struct Handoff {
    ready: Mutex<VecDeque<Box<dyn Transport>>>,
    /// Rung when a handshake thread finishes, with or without a channel.
    doorbell: Doorbell,
    running: AtomicUsize,
}

/// Runs the blocking handshakes of a shared-memory listener's connections on threads of
/// their own.
struct Handshakes {
    handoff: Arc<Handoff>,
    what: &'static str,
}

impl Handshakes {
    fn new(what: &'static str) -> Result<Self, ConnectError> {
        let handoff = Arc::new(Handoff {
            ready: Mutex::new(VecDeque::new()),
            doorbell: Doorbell::new()?,
            running: AtomicUsize::new(0),
        });
        Ok(Self { handoff, what })
    }

    fn at_capacity(&self) -> bool {
        self.handoff.running.load(Ordering::Acquire) >= HANDSHAKES_MAX
    }

    /// Runs `handshake` on a new thread; its channel goes to the ready queue.
    fn spawn(&self, handshake: impl FnOnce() -> Result<Box<dyn Transport>, ConnectError> + Send + 'static) {
        let handoff = self.handoff.clone();
        handoff.running.fetch_add(1, Ordering::AcqRel);
        let theirs = handoff.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ulnet-rma-{}-handshake", self.what))
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                match handshake() {
                    Ok(channel) => theirs.ready.lock().unwrap_or_else(|e| e.into_inner()).push_back(channel),
                    // A peer that fails the handshake (or stays silent) is dropped.
                    Err(e) => tracing::debug!("RMA channel refused at accept: {e}"),
                }
                theirs.running.fetch_sub(1, Ordering::AcqRel);
                theirs.doorbell.ring();
            });
        if let Err(e) = spawned {
            // The connection (moved into the closure) is dropped: the peer sees it closed.
            handoff.running.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("RMA accept: no thread for a handshake: {e}");
        }
    }

    fn pop(&self) -> Option<Box<dyn Transport>> {
        self.handoff.ready.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    /// The doorbell, and the listener while there is room for another handshake (at
    /// capacity, a finishing handshake rings the doorbell).
    fn wait_fds<'a>(&'a self, listener: BorrowedFd<'a>) -> Vec<BorrowedFd<'a>> {
        if self.at_capacity() {
            vec![self.handoff.doorbell.as_fd()]
        } else {
            vec![self.handoff.doorbell.as_fd(), listener]
        }
    }

    /// Starts handshakes for waiting connections (as many as there is room for), then
    /// returns a finished channel if there is one.
    fn try_accept<C: Send + 'static>(
        &mut self,
        mut accept: impl FnMut() -> Result<Option<C>, ConnectError>,
        handshake: impl Fn(C) -> Result<Box<dyn Transport>, ConnectError> + Clone + Send + 'static,
    ) -> Result<Option<Box<dyn Transport>>, ConnectError> {
        self.handoff.doorbell.clear();
        while !self.at_capacity() {
            let Some(connection) = accept()? else { break };
            let handshake = handshake.clone();
            self.spawn(move || handshake(connection));
        }
        Ok(self.pop())
    }
}

/// Accepts shared-memory channels (each handshake on a thread of its own), from the
/// processes `ShmConfig::allowed` admits, proving `ShmConfig::secret`.
pub struct ShmAcceptor {
    listener: ShmListener,
    config: Arc<ShmConfig>,
    handshakes: Handshakes,
}

impl ShmAcceptor {
    /// Listens under `name` (the shared-memory channel namespace of this host).
    pub fn bind(name: &str, config: ShmConfig) -> Result<Self, ConnectError> {
        Self::bind_counted(name, config, Arc::default())
    }

    /// [`ShmAcceptor::bind`], counting its peers into `admission`.
    pub(crate) fn bind_counted(
        name: &str,
        config: ShmConfig,
        admission: Arc<AdmissionCells>,
    ) -> Result<Self, ConnectError> {
        let listener = ShmListener::bind_counted(name, admission)?;
        Ok(Self { listener, config: Arc::new(config), handshakes: Handshakes::new("shm")? })
    }
}

impl Acceptor for ShmAcceptor {
    fn try_accept(&mut self) -> Result<Option<Box<dyn Transport>>, ConnectError> {
        let config = self.config.clone();
        let listener = &self.listener;
        self.handshakes.try_accept(
            || listener.accept_connection(),
            move |c: AcceptedShm| Ok(Box::new(c.handshake(&config, NodeId::UNKNOWN)?) as Box<dyn Transport>),
        )
    }
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.handshakes.wait_fds(self.listener.as_fd())
    }
}

/// Accepts TCP channels; the engine runs the handshakes (state machines) itself.
pub struct TcpAcceptor {
    listener: TcpChannelListener,
    config: TcpConfig,
}

impl TcpAcceptor {
    /// Listens on `addr` (port 0 picks one).
    pub fn bind(addr: &str, config: TcpConfig) -> Result<Self, ConnectError> {
        Ok(Self { listener: TcpChannelListener::bind(addr)?, config })
    }

    /// The address importers connect to.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

impl Acceptor for TcpAcceptor {
    fn try_accept(&mut self) -> Result<Option<Box<dyn Transport>>, ConnectError> {
        Ok(self.listener.try_accept(&self.config)?.map(|c| Box::new(c) as Box<dyn Transport>))
    }
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.listener.as_fd()]
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.listener.poll_timeout()
    }
}

/// Accepts UDP channels; the engine runs the handshakes (state machines) itself.
pub struct UdpAcceptor {
    listener: UdpChannelListener,
    config: UdpConfig,
}

impl UdpAcceptor {
    /// Listens on `addr` (port 0 picks one); counters go to `stats`.
    pub fn bind(addr: &str, config: UdpConfig, stats: Arc<UdpStats>) -> Result<Self, ConnectError> {
        config.validate().map_err(ConnectError::Config)?;
        Ok(Self { listener: UdpChannelListener::bind(addr, stats)?, config })
    }

    /// The address importers connect to.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr()
    }
}

impl Acceptor for UdpAcceptor {
    fn try_accept(&mut self) -> Result<Option<Box<dyn Transport>>, ConnectError> {
        Ok(self.listener.try_accept(&self.config, NodeId::UNKNOWN)?.map(|c| Box::new(c) as Box<dyn Transport>))
    }
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.listener.as_fd()]
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.listener.poll_timeout()
    }
}
