//! The target's progress engine: it owns the channels importers opened to this node and
//! applies their requests without the application taking part, as a NIC would. It runs on
//! a thread of its own ([`crate::rma::Progress::Thread`]) or inside the application's calls
//! to `Rma::progress` ([`crate::rma::Progress::Manual`], for single-threaded programs and
//! benchmarks that poll anyway).
//!
//! Channels come from [`Acceptor`]s (listeners of any transport, see `accept`) or are
//! handed over whole (`Rma::serve_channel`). Nothing here blocks: acceptors never do, and
//! UDP channels and handshakes, whose protocol moves only when polled, get their timers
//! run because the engine sleeps on each channel's timerfd (through its probe) and wakes
//! for the acceptors' [`Acceptor::poll_timeout`].
//!
//! The loop: take new acceptors and channels from the inbox; poll every channel and answer
//! each request in place (a refusal or response that does not fit the channel is kept and
//! the channel is not read again until it has gone out); every [`LISTEN_EVERY`] passes,
//! and after every sleep that a listener or an acceptor's timer ended, accept new channels
//! and serve the same-host rendezvous. After `RmaConfig::engine_spin` without work it
//! sleeps in the kernel on every channel's wait descriptors, the listeners and the inbox,
//! until the first acceptor timer.

use super::accept::Acceptor;
use super::rendezvous::RendezvousServer;
use super::segment::ExportTable;
use super::target::{bump, Importer, Reply, Target, TargetCells};
use super::wire::HEADER_LEN;
use crate::error::ChannelError;
use crate::rma::rights::NodeId;
use crate::sys::doorbell::Doorbell;
use crate::transport::{ReadyProbe, Responder, SendOutcome, Transport};
use rustix::event::{PollFd, PollFlags};
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Passes of the loop between two looks at the listeners while busy: an `accept` system
/// call costs about a microsecond, a pass a fraction of that.
const LISTEN_EVERY: u32 = 256;
/// Messages taken from one channel per pass, so one busy importer cannot starve the rest.
const BATCH: usize = 64;

/// What the application hands a running engine.
pub(crate) enum InboxItem {
    Acceptor(Box<dyn Acceptor>),
    Channel(Box<dyn Transport>),
    Rendezvous(RendezvousServer),
}

/// The application's way in to an engine thread.
pub(crate) struct Inbox {
    items: Mutex<Vec<InboxItem>>,
    /// Something is in `items`: the engine looks (and locks) only then.
    pending: AtomicBool,
    stop: AtomicBool,
    doorbell: Doorbell,
    /// The engine thread's kernel thread id, once it runs (for its CPU time).
    pub(crate) tid: AtomicI32,
}

impl Inbox {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            items: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            doorbell: Doorbell::new()?,
            tid: AtomicI32::new(0),
        })
    }

    pub(crate) fn push(&self, item: InboxItem) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        self.pending.store(true, Ordering::Release);
        self.doorbell.ring();
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.doorbell.ring();
    }
}

struct ChannelState {
    importer: Importer,
    /// Responses that found the channel full, in order.
    deferred: VecDeque<Vec<u8>>,
    /// Most data one response carries on this channel.
    data_max: usize,
}

struct EngineChannel {
    transport: Box<dyn Transport>,
    probe: Arc<dyn ReadyProbe>,
    state: ChannelState,
}

/// A node's progress engine. See the module documentation.
pub(crate) struct Engine {
    target: Target,
    table: Arc<ExportTable>,
    cells: Arc<TargetCells>,
    channels: Vec<EngineChannel>,
    acceptors: Vec<Box<dyn Acceptor>>,
    rendezvous: Vec<RendezvousServer>,
    inbox: Arc<Inbox>,
    passes: u32,
}

impl Engine {
    pub(crate) fn new(table: Arc<ExportTable>, cells: Arc<TargetCells>, inbox: Arc<Inbox>) -> Self {
        Self {
            target: Target::new(table.clone(), cells.clone()),
            table,
            cells,
            channels: Vec::new(),
            acceptors: Vec::new(),
            rendezvous: Vec::new(),
            inbox,
            passes: 0,
        }
    }

    /// Takes a new item (from the inbox, or directly in manual mode).
    pub(crate) fn add(&mut self, item: InboxItem) {
        match item {
            InboxItem::Acceptor(a) => self.acceptors.push(a),
            InboxItem::Rendezvous(r) => self.rendezvous.push(r),
            InboxItem::Channel(t) => self.add_channel(t),
        }
    }

    fn add_channel(&mut self, transport: Box<dyn Transport>) {
        let data_max = transport.caps().rma.request_max.saturating_sub(HEADER_LEN);
        let probe = transport.probe();
        let proven = transport.peer_node().filter(|n| *n != NodeId::UNKNOWN);
        bump(&self.cells.channels_accepted, 1);
        self.channels.push(EngineChannel {
            transport,
            probe,
            state: ChannelState { importer: Importer { proven, node: None }, deferred: VecDeque::new(), data_max },
        });
    }

    fn take_inbox(&mut self) -> usize {
        if !self.inbox.pending.swap(false, Ordering::Acquire) {
            return 0;
        }
        let items = std::mem::take(&mut *self.inbox.items.lock().unwrap_or_else(|e| e.into_inner()));
        let n = items.len();
        for item in items {
            self.add(item);
        }
        n
    }

    /// Accepts waiting channels and serves the rendezvous. Returns the work done.
    fn listen(&mut self) -> usize {
        let mut work = 0;
        let mut accepted = Vec::new();
        for a in &mut self.acceptors {
            loop {
                match a.try_accept() {
                    Ok(Some(t)) => accepted.push(t),
                    Ok(None) => break,
                    Err(e) => {
                        // A peer that fails the handshake is dropped; the listener stays.
                        tracing::debug!("RMA channel refused at accept: {e}");
                        break;
                    }
                }
            }
        }
        for t in accepted {
            self.add_channel(t);
            work += 1;
        }
        for r in &mut self.rendezvous {
            work += r.progress(&self.table, &self.cells);
        }
        work
    }

    /// One pass: inbox, channels, and now and then the listeners. Returns the work done.
    pub(crate) fn progress(&mut self) -> usize {
        let mut work = self.take_inbox();
        self.passes = self.passes.wrapping_add(1);
        if self.passes.is_multiple_of(LISTEN_EVERY) {
            work += self.listen();
        }
        let mut i = 0;
        while i < self.channels.len() {
            match poll_channel(&mut self.target, &mut self.channels[i]) {
                Ok(n) => {
                    work += n;
                    i += 1;
                }
                Err(e) => {
                    let mut ch = self.channels.swap_remove(i);
                    match e {
                        ChannelError::Closed => {
                            tracing::debug!(importer = ch.state.importer.node.map(|n| n.0), "RMA channel closed")
                        }
                        e => {
                            bump(&self.cells.channels_failed, 1);
                            tracing::debug!(importer = ch.state.importer.node.map(|n| n.0), "RMA channel failed: {e}");
                        }
                    }
                    ch.transport.close();
                    work += 1;
                }
            }
        }
        work
    }

    /// Sleeps until a channel, listener or the inbox has something, an acceptor's timer is
    /// due, or `timeout` passes, then serves what woke it: new channels and rendezvous
    /// clients only when a listener fired or a timer came due, so an ordinary wake-up for
    /// a request costs no extra system call. (The arm → sleep → disarm order is
    /// `wait::sleep_on`'s.)
    pub(crate) fn sleep(&mut self, timeout: Option<Duration>) {
        for ch in &mut self.channels {
            let _ = ch.transport.flush();
        }
        // A channel holding back responses is retried soon rather than waited on.
        let deferred = self.channels.iter().any(|c| !c.state.deferred.is_empty());
        let mut timeout = if deferred { Some(Duration::from_millis(1)) } else { timeout };
        let acceptor_due = self.acceptors.iter().filter_map(|a| a.poll_timeout()).min();
        if let Some(due) = acceptor_due {
            let left = due.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        let probes: Vec<&Arc<dyn ReadyProbe>> =
            self.channels.iter().filter(|c| c.state.deferred.is_empty()).map(|c| &c.probe).collect();
        let armed = probes.iter().take_while(|p| p.arm()).count();
        let (mut listener_fired, mut inbox_fired) = (false, false);
        if armed == probes.len() && timeout != Some(Duration::ZERO) {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(probes.len() * 2 + 4);
            for p in &probes {
                fds.extend(p.wait_fds().into_iter().map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)));
            }
            let listeners_at = fds.len();
            fds.extend(
                self.acceptors.iter().flat_map(|a| a.wait_fds()).map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)),
            );
            fds.extend(
                self.rendezvous.iter().flat_map(|r| r.wait_fds()).map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)),
            );
            fds.push(PollFd::from_borrowed_fd(self.inbox.doorbell.as_fd(), PollFlags::IN));
            // Rounded up: waking a little after a timer is due is harmless, before it a spin.
            let ms = timeout.map_or(-1, |t| t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32);
            match rustix::event::poll(&mut fds, ms) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => tracing::warn!("RMA engine sleep failed: {e}"),
            }
            let (inbox, rest) = fds.split_last().expect("the inbox is always there");
            inbox_fired = !inbox.revents().is_empty();
            listener_fired = rest[listeners_at..].iter().any(|f| !f.revents().is_empty());
        }
        for p in &probes[..armed] {
            p.disarm();
        }
        if inbox_fired {
            self.inbox.doorbell.clear();
        }
        if listener_fired || acceptor_due.is_some_and(|t| t <= Instant::now()) {
            self.listen();
        }
    }

    /// The engine thread's loop, until the inbox says stop.
    pub(crate) fn run(mut self, spin: Duration) {
        self.inbox.tid.store(rustix::thread::gettid().as_raw_nonzero().get(), Ordering::Release);
        self.listen();
        let mut last_work = Instant::now();
        while !self.inbox.stop.load(Ordering::Acquire) {
            if self.progress() > 0 {
                last_work = Instant::now();
            } else if last_work.elapsed() >= spin {
                self.sleep(None);
                last_work = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
        for ch in &mut self.channels {
            ch.transport.close();
        }
    }
}

/// Serves one channel: first what it could not take before, then up to [`BATCH`] requests.
fn poll_channel(target: &mut Target, ch: &mut EngineChannel) -> Result<usize, ChannelError> {
    while let Some(front) = ch.state.deferred.front() {
        match ch.transport.send(&[front]) {
            Ok(SendOutcome::Done) => {
                ch.state.deferred.pop_front();
            }
            Ok(_) => return Ok(0),
            Err(crate::error::SendError::ChannelDown(e)) => return Err(e),
            Err(e) => {
                tracing::warn!("RMA response dropped: {e}");
                ch.state.deferred.pop_front();
            }
        }
    }
    let state = &mut ch.state;
    ch.transport.poll_recv(BATCH, &mut |d, responder| {
        if d.is_whole() {
            let (importer, data_max) = (&mut state.importer, state.data_max);
            let deferred = &mut state.deferred;
            target.handle_message(d.data, importer, data_max, &mut |reply| respond(reply, deferred, responder));
        } else if d.offset == 0 {
            // Requests larger than one fragment are never sent by an honest initiator.
            let reply = target.refuse_fragmented(d.data, state.importer.node);
            respond(reply, &mut state.deferred, responder);
        }
    })
}

/// Sends one reply, or keeps it (in order behind any already kept) when the channel is full.
fn respond(reply: Reply<'_>, deferred: &mut VecDeque<Vec<u8>>, responder: &mut dyn Responder) {
    let (header, data): (_, &[u8]) = match reply {
        Reply::Nothing => return,
        Reply::Header(h) => (h, &[]),
        Reply::WithData(h, data) => (h, data),
    };
    let gather: [&[u8]; 2] = [&header, data];
    let gather = if data.is_empty() { &gather[..1] } else { &gather[..] };
    if !deferred.is_empty() {
        deferred.push_back(gather.concat());
        return;
    }
    match responder.send(gather) {
        Ok(SendOutcome::Done) => {}
        Ok(_) => deferred.push_back(gather.concat()),
        Err(e) => tracing::debug!("RMA response not sent: {e}"),
    }
}
