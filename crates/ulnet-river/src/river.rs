//! The distributed queue: every node's part of the river, fed by its own sources and by
//! the other nodes over ulnet channels, with credit flow control and an explicit end of
//! stream from every source.
//!
//! A [`River`] owns the node's [`Endpoint`] and one channel to each peer. Records are
//! put into it through sinks: the [`RiverSink`] for this node's own part (Millennium
//! Sort's `RiverSink`, `Put`), and one [`NetSink`] per peer. A peer's records arrive
//! through its [`NetSource`] state, which hands them to the node's *store* (any [`Sink`]:
//! an in-memory arena, a spilling run writer).
//!
//! ## Credits
//!
//! A sender may have at most [`RiverConfig::credits`] data messages (chunks) outstanding
//! to a receiver. The receiver grants a credit back each time it has moved a chunk out of
//! its receive queue into its store, so a store that stalls (one that is spilling to disk)
//! stalls its senders instead of letting data pile up anywhere. The receive buffers of a
//! shared-memory channel hold `credits` chunks, so a sender with credit never finds the
//! channel full. A [`NetSink`] holds at most [`RiverConfig::staged_chunks`] sealed chunks
//! waiting for credit; beyond that, putting records blocks (while the node keeps
//! receiving, so two nodes sending to each other cannot deadlock).
//!
//! ## Running dry
//!
//! The seed leaves "the sources run dry" undefined. Here a node's queue has **run dry**
//! when all of these hold:
//!
//! 1. its own sinks are closed ([`River::close_local`], after closing every sink handed
//!    out): its local sources have delivered everything, every staged chunk was sent and
//!    an `EndOfStream` stating the number of records sent went to every peer;
//! 2. an `EndOfStream` has arrived from **every** peer, and the records received from
//!    each peer equal the number that peer states;
//! 3. everything received has been handed to the store.
//!
//! A channel that goes down, or a peer that aborts, before its `EndOfStream` is a
//! failure that names the peer ([`RiverError::NodeFailed`]), never an early dry: a dead
//! node can make the river fail but never makes it end short.
//!
//! ```no_run
//! use ulnet_river::{mesh, River, RiverConfig, Sink, VecSink};
//! # fn main() -> Result<(), ulnet_river::RiverError> {
//! let (ep, peers) = mesh::connect(&mesh::MeshConfig::shm("job", 1, 2))?;
//! let mut out = Vec::new();
//! let river = River::new(ep, 1, peers, VecSink::new(&mut out, 100), RiverConfig::default(), None);
//! let mut to_node0 = river.net_sink(0);
//! to_node0.sink_records(&[0u8; 100])?;
//! to_node0.close()?;
//! river.close_local()?;
//! river.run_dry()?; // everything node 0 sends us is in `out` now
//! # Ok(()) }
//! ```

use crate::credit::{FlowControl, FlowError};
use crate::doorbell::Doorbell;
use crate::error::RiverError;
use crate::flow::{copy_gathered, Sink};
use crate::pool::{Buffer, MemPool};
use crate::wire::{Header, Kind, ABORT_REASON_MAX, HEADER_LEN};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};
use ulnet_core::{ChannelError, ChannelId, Endpoint, Event, SendOutcome};

/// Settings of a river.
#[derive(Clone, Debug)]
pub struct RiverConfig {
    /// Bytes per record. 100: the Sort Benchmark's records.
    pub record_size: usize,
    /// Records per data message. 655: with the 16-byte header, one 64 KiB buffer of a
    /// shared-memory channel (65,516 bytes), large enough that per-message costs vanish.
    pub chunk_records: usize,
    /// Chunks a sender may have outstanding to one receiver. 32: 2 MB in flight per pair,
    /// which covers a receiver that is off the CPU for a few milliseconds, as it is when
    /// nodes share busy cores. With 8 (512 KB) a 10^7-record sort on 2 nodes of a busy
    /// 2-core host waited for credit ~370 times per node and slept ~450 times, each wake-up
    /// a trip through the scheduler; with 32, ~35 waits and ~50 sleeps, for the same CPU
    /// time. (Each shared-memory buffer costs a page fault and zeroing the first time it
    /// is used, so much more only spreads the traffic over more memory.)
    pub credits: u32,
    /// Sealed chunks a [`NetSink`] keeps waiting for credit before putting blocks. 8: a
    /// quarter of the credit window, so that reading goes on while a receiver catches up;
    /// each costs one chunk of memory per peer.
    pub staged_chunks: usize,
    /// Longest a blocking call waits with nothing happening before it gives up. 120 s:
    /// far above any stall of a live peer (a dead one is seen at once through its channel).
    pub idle_timeout: Duration,
}

impl Default for RiverConfig {
    fn default() -> Self {
        RiverConfig {
            record_size: 100,
            chunk_records: 655,
            credits: 32,
            staged_chunks: 8,
            idle_timeout: Duration::from_secs(120),
        }
    }
}

impl RiverConfig {
    /// Bytes of one data message.
    pub fn chunk_bytes(&self) -> usize {
        HEADER_LEN + self.chunk_records * self.record_size
    }
}

/// Counters of a river.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RiverCounters {
    /// Records put into this node's own part.
    pub records_local: u64,
    /// Records sent to peers.
    pub records_sent: u64,
    /// Records received from peers.
    pub records_received: u64,
    /// Data messages sent.
    pub chunks_sent: u64,
    /// Of those, the ones packed straight into the channel's buffers (not staged first).
    pub chunks_packed: u64,
    /// Times a sender waited for credit.
    pub credit_waits: u64,
    /// Sends refused by a full channel (retried).
    pub channel_full: u64,
    /// Times the node slept waiting.
    pub sleeps: u64,
}

/// Receive state of one peer: its messages, arriving in fragments, reassembled into whole
/// records flowing into our store (the accounting is the [`FlowControl`]'s).
#[derive(Debug, Default)]
pub struct NetSource {
    /// Bytes of a record split across two fragments.
    carry: Vec<u8>,
    /// Records of the data message being received.
    in_message: Option<u64>,
    /// A control message being assembled from fragments: its tag and bytes so far.
    control: Option<(u32, Vec<u8>)>,
}

impl NetSource {
    /// Whether no message is half received.
    pub fn is_idle(&self) -> bool {
        self.in_message.is_none() && self.control.is_none()
    }
}

#[derive(Debug)]
struct Peer {
    channel: Option<ChannelId>,
    down: Option<String>,
    // Sending.
    /// Whole chunks may be packed straight into the channel's buffers
    /// ([`Endpoint::send_packed`]) instead of staged and copied again.
    pack_in_place: bool,
    staging: Option<Buffer>,
    staged_records: u64,
    ready: VecDeque<Buffer>,
    sink_open: bool,
    // Receiving.
    source: NetSource,
}

struct Inner<S> {
    ep: Endpoint,
    rank: usize,
    config: RiverConfig,
    peers: Vec<Peer>,
    store: Option<S>,
    local_open: bool,
    local_closed: bool,
    controls: VecDeque<(usize, u32, Vec<u8>)>,
    pool: MemPool,
    doorbell: Option<Doorbell>,
    counters: RiverCounters,
    failure: Option<RiverError>,
    /// Credits and ends of stream (the sans-IO part).
    flow: FlowControl,
}

/// One node's part of the distributed queue. Cloning shares it (sinks hold clones); it
/// belongs to one thread.
pub struct River<S: Sink> {
    inner: Rc<RefCell<Inner<S>>>,
}

impl<S: Sink> Clone for River<S> {
    fn clone(&self) -> Self {
        River { inner: self.inner.clone() }
    }
}

impl<S: Sink> River<S> {
    /// A river over `ep`, whose channel to node `j` is `peers[j]` (`None` for this node,
    /// `rank`), handing received records to `store`. `doorbell`, when given, is watched
    /// with the channels whenever the river waits (local producers ring it).
    pub fn new(
        ep: Endpoint,
        rank: usize,
        peers: Vec<Option<ChannelId>>,
        store: S,
        config: RiverConfig,
        doorbell: Option<Doorbell>,
    ) -> Self {
        assert!(rank < peers.len() && peers[rank].is_none(), "peers[rank] must be None");
        assert!(config.chunk_records > 0 && config.credits > 0, "chunks and credits must be positive");
        let remote = peers.len() - 1;
        let peers_len = peers.len();
        // Staging plus sealed chunks for each peer: the network's whole buffer memory.
        let pool_count = (remote * (config.staged_chunks + 2)).max(1);
        let pool = MemPool::registered(pool_count, config.chunk_bytes(), 1)
            .unwrap_or_else(|_| MemPool::heap(pool_count, config.chunk_bytes()));
        let peers = peers
            .iter()
            .map(|&channel| Peer {
                channel,
                pack_in_place: channel
                    .and_then(|ch| ep.caps(ch))
                    .is_some_and(|c| c.pack_in_place && c.fragment_max >= config.chunk_bytes()),
                down: None,
                staging: None,
                staged_records: 0,
                ready: VecDeque::new(),
                sink_open: false,
                source: NetSource::default(),
            })
            .collect();
        let flow = FlowControl::new(rank, peers_len, config.credits);
        River {
            inner: Rc::new(RefCell::new(Inner {
                ep,
                rank,
                config,
                peers,
                store: Some(store),
                local_open: false,
                local_closed: false,
                controls: VecDeque::new(),
                pool,
                doorbell,
                counters: RiverCounters::default(),
                failure: None,
                flow,
            })),
        }
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.inner.borrow().rank
    }

    /// Number of nodes.
    pub fn size(&self) -> usize {
        self.inner.borrow().peers.len()
    }

    /// Counters so far.
    pub fn counters(&self) -> RiverCounters {
        let mut c = self.inner.borrow().counters;
        c.sleeps = self.inner.borrow().ep.counters().sleeps;
        c
    }

    /// The sink for this node's own part of the queue (`Put` into the local River).
    pub fn river_sink(&self) -> RiverSink<S> {
        let mut inner = self.inner.borrow_mut();
        assert!(!inner.local_open && !inner.local_closed, "one river sink per river");
        inner.local_open = true;
        RiverSink { river: self.clone(), closed: false }
    }

    /// The sink for node `peer`'s part of the queue.
    pub fn net_sink(&self, peer: usize) -> NetSink<S> {
        let mut inner = self.inner.borrow_mut();
        let rank = inner.rank;
        let ended = inner.flow.end_sent(peer);
        let p = &mut inner.peers[peer];
        assert!(peer != rank && !p.sink_open && !ended, "one net sink per peer");
        p.sink_open = true;
        NetSink { river: self.clone(), peer, closed: false }
    }

    /// One sink per node, indexed by rank: the river sink for this node, net sinks for
    /// the others (what a [`crate::PartitionSink`] routes to).
    pub fn sinks(&self) -> Vec<Box<dyn Sink>>
    where
        S: 'static,
    {
        let rank = self.rank();
        (0..self.size())
            .map(|j| if j == rank { Box::new(self.river_sink()) as Box<dyn Sink> } else { Box::new(self.net_sink(j)) })
            .collect()
    }

    /// Receives what has arrived and sends what credit allows, without waiting. Returns
    /// the amount of work done.
    pub fn progress(&self) -> Result<usize, RiverError> {
        self.inner.borrow_mut().progress()
    }

    /// Sleeps until something arrives on a channel, the doorbell rings or `timeout` passes.
    /// (Waits inside the river, for credit or for the end of stream, watch only the
    /// channels: a ring meant for the caller must not keep them awake.)
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(), RiverError> {
        self.inner.borrow_mut().wait_with_doorbell(timeout)
    }

    /// Sends an application message to `peer` (waiting for room if need be).
    pub fn send_control(&self, peer: usize, tag: u32, payload: &[u8]) -> Result<(), RiverError> {
        self.inner.borrow_mut().send_control(peer, tag, payload)
    }

    /// An application message with `tag` (from `from`, or anyone) among those received so
    /// far ([`River::progress`] receives), without waiting: the sender and the payload.
    pub fn try_recv_control(&self, from: Option<usize>, tag: u32) -> Option<(usize, Vec<u8>)> {
        let mut inner = self.inner.borrow_mut();
        let i = inner.controls.iter().position(|(p, t, _)| *t == tag && from.is_none_or(|f| f == *p))?;
        inner.controls.remove(i).map(|(p, _, data)| (p, data))
    }

    /// Waits for an application message with `tag` (from `from`, or anyone), up to
    /// `timeout`. Returns the sender and the payload.
    pub fn recv_control(
        &self,
        from: Option<usize>,
        tag: u32,
        timeout: Duration,
    ) -> Result<(usize, Vec<u8>), RiverError> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut inner = self.inner.borrow_mut();
                if let Some(i) = inner.controls.iter().position(|(p, t, _)| *t == tag && from.is_none_or(|f| f == *p)) {
                    let (p, _, data) = inner.controls.remove(i).expect("found above");
                    return Ok((p, data));
                }
                if inner.progress()? > 0 {
                    continue;
                }
                if let Some(f) = from {
                    if let (Some(why), false) = (&inner.peers[f].down, f == inner.rank) {
                        let reason = format!("lost before sending message {tag} ({why})");
                        return Err(RiverError::NodeFailed { node: f, reason });
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(RiverError::Timeout {
                        what: format!(
                            "control message {tag} from {}",
                            from.map_or("any node".into(), |f| format!("node {f}"))
                        ),
                        secs: timeout.as_secs_f64(),
                    });
                }
                inner.wait(Some(left.min(Duration::from_millis(100))))?;
            }
        }
    }

    /// Declares this node's own putting finished: every sink handed out must be closed.
    pub fn close_local(&self) -> Result<(), RiverError> {
        let mut inner = self.inner.borrow_mut();
        assert!(!inner.local_open, "close the river sink before close_local");
        for (j, p) in inner.peers.iter().enumerate() {
            assert!(!p.sink_open, "close the net sink of node {j} before close_local");
        }
        // Peers no sink was made for get an empty stream.
        for j in 0..inner.peers.len() {
            if !inner.flow.end_sent(j) {
                inner.finish_peer(j)?;
            }
        }
        inner.local_closed = true;
        Ok(())
    }

    /// Waits until the queue has run dry (see the module doc), then closes the store.
    pub fn run_dry(&self) -> Result<(), RiverError> {
        let mut inner = self.inner.borrow_mut();
        assert!(inner.local_closed, "close_local before run_dry");
        let mut idle_since = Instant::now();
        loop {
            if inner.progress()? > 0 {
                idle_since = Instant::now();
            }
            if inner.flow.is_dry() && inner.peers.iter().all(|p| p.source.is_idle()) {
                inner.send_owed_credits(true)?;
                if let Some(store) = inner.store.as_mut() {
                    store.close()?;
                }
                return Ok(());
            }
            if idle_since.elapsed() > inner.config.idle_timeout {
                let waiting: Vec<usize> = (0..inner.peers.len()).filter(|&j| !inner.flow.has_ended(j)).collect();
                return Err(RiverError::Timeout {
                    what: format!("the end of stream of nodes {waiting:?}"),
                    secs: inner.config.idle_timeout.as_secs_f64(),
                });
            }
            inner.wait(Some(Duration::from_millis(100)))?;
        }
    }

    /// Records received from each peer so far (index = rank).
    pub fn received_per_peer(&self) -> Vec<u64> {
        let inner = self.inner.borrow();
        (0..inner.peers.len()).map(|j| inner.flow.received_records(j)).collect()
    }

    /// Takes the store out (after [`River::run_dry`]); data arriving later is an error.
    pub fn take_store(&self) -> Option<S> {
        self.inner.borrow_mut().store.take()
    }

    /// Runs `f` on the store, if it is still in the river.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        self.inner.borrow_mut().store.as_mut().map(f)
    }

    /// Tells every reachable peer that this node failed and why (best effort).
    pub fn abort(&self, reason: &str) {
        let mut inner = self.inner.borrow_mut();
        let mut r = reason.as_bytes();
        if r.len() > ABORT_REASON_MAX {
            r = &r[..ABORT_REASON_MAX];
        }
        let h = Header { kind: Kind::Abort, aux: 0, value: r.len() as u64 }.encode();
        for j in 0..inner.peers.len() {
            if let (Some(ch), None) = (inner.peers[j].channel, &inner.peers[j].down) {
                let _ = inner.ep.send(ch, &[&h, r]);
            }
        }
        inner.ep.flush_sends();
    }

    /// Marks the run over: from now on a peer that goes away is not a failure (it may
    /// have finished and exited first).
    pub fn finish(&self) {
        self.inner.borrow_mut().flow.finish();
    }

    /// Whether the channel to `peer` is down.
    pub fn is_down(&self, peer: usize) -> bool {
        self.inner.borrow().peers[peer].down.is_some()
    }

    /// Sends everything queued and closes every channel cleanly.
    pub fn shutdown(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.flow.finish();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !inner.ep.flush_sends() && Instant::now() < deadline {
            inner.ep.poll(64, |_| {});
        }
        let channels: Vec<ChannelId> = inner.peers.iter().filter_map(|p| p.channel).collect();
        for ch in channels {
            inner.ep.close(ch);
        }
    }
}

impl<S: Sink> Inner<S> {
    fn fail(&mut self, e: RiverError) -> RiverError {
        tracing::debug!(error = %e, "river failed");
        if self.failure.is_none() {
            self.failure = Some(match &e {
                RiverError::NodeFailed { node, reason } => {
                    RiverError::NodeFailed { node: *node, reason: reason.clone() }
                }
                other => RiverError::Protocol { node: self.rank, reason: other.to_string() },
            });
        }
        e
    }

    fn check_failed(&self) -> Result<(), RiverError> {
        match &self.failure {
            None => Ok(()),
            Some(RiverError::NodeFailed { node, reason }) => {
                Err(RiverError::NodeFailed { node: *node, reason: reason.clone() })
            }
            Some(e) => Err(RiverError::Protocol { node: self.rank, reason: e.to_string() }),
        }
    }

    fn wait_with_doorbell(&mut self, timeout: Option<Duration>) -> Result<(), RiverError> {
        let result = match &self.doorbell {
            Some(d) => {
                let fd = d.as_fd();
                self.ep.wait_also(&[fd], timeout)
            }
            None => self.ep.wait(timeout),
        };
        result.map_err(|e| RiverError::io("waiting for the network", e))?;
        Ok(())
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), RiverError> {
        self.ep.wait(timeout).map_err(|e| RiverError::io("waiting for the network", e))?;
        Ok(())
    }

    /// Receives and delivers what has arrived, returns owed credits, sends what credit
    /// allows. Returns the work done.
    fn progress(&mut self) -> Result<usize, RiverError> {
        self.check_failed()?;
        let mut work = self.receive()?;
        work += self.send_owed_credits(false)?;
        for j in 0..self.peers.len() {
            work += self.flush_ready(j)?;
        }
        Ok(work)
    }

    fn receive(&mut self) -> Result<usize, RiverError> {
        let Inner { ep, peers, store, controls, config, counters, flow, .. } = self;
        let rs = config.record_size;
        let mut error: Option<RiverError> = None;
        let mut downs: Vec<(usize, ChannelError)> = Vec::new();
        let rank_of = |peers: &[Peer], ch: ChannelId| peers.iter().position(|p| p.channel == Some(ch));
        let n = ep.poll(256, |event| {
            if error.is_some() {
                return;
            }
            match event {
                Event::Message { channel, data, message_len, offset, .. } => {
                    let Some(j) = rank_of(peers, channel) else { return };
                    let p = &mut peers[j];
                    let result = deliver(p, j, flow, store, controls, counters, rs, data, message_len, offset);
                    if let Err(e) = result {
                        error = Some(e);
                    }
                }
                Event::ChannelDown { channel, error: why } => {
                    if let Some(j) = rank_of(peers, channel) {
                        downs.push((j, why));
                    }
                }
                Event::SendComplete { .. } => {}
            }
        });
        for (j, why) in downs {
            peers[j].down = Some(why.to_string());
            let why = match why {
                ChannelError::Closed => "it closed its channel".to_string(),
                other => other.to_string(),
            };
            if let Err(e) = flow.on_channel_down(j, &why) {
                error.get_or_insert(e.into());
            }
        }
        if let Some(e) = error {
            return Err(self.fail(e));
        }
        Ok(n)
    }

    fn send_owed_credits(&mut self, all: bool) -> Result<usize, RiverError> {
        let mut sent = 0;
        while let Some((j, n)) = self.flow.poll_credit(all) {
            let Some(ch) = self.peers[j].channel else { continue };
            let h = Header { kind: Kind::Credit, aux: n, value: 0 }.encode();
            match self.ep.send(ch, &[&h]) {
                Ok(SendOutcome::Done) | Ok(SendOutcome::InProgress(_)) => sent += 1,
                Ok(SendOutcome::NoResource) => {
                    self.counters.channel_full += 1;
                    self.flow.unsent_credit(j, n);
                    break;
                }
                Err(e) => return Err(self.fail(RiverError::Send { node: j, source: e })),
            }
        }
        Ok(sent)
    }

    /// Sends sealed chunks to peer `j` while credit allows.
    fn flush_ready(&mut self, j: usize) -> Result<usize, RiverError> {
        let mut work = 0;
        while self.flow.may_send(j) && !self.peers[j].ready.is_empty() {
            let ch = self.peers[j].channel.expect("only peers have chunks");
            let chunk = self.peers[j].ready.front().expect("non-empty");
            match self.ep.send(ch, &[chunk.as_slice()]) {
                Ok(SendOutcome::Done) | Ok(SendOutcome::InProgress(_)) => {
                    let chunk = self.peers[j].ready.pop_front().expect("non-empty");
                    let records = ((chunk.len() - HEADER_LEN) / self.config.record_size) as u64;
                    self.flow.on_data_sent(j, records);
                    self.counters.records_sent += records;
                    self.counters.chunks_sent += 1;
                    work += 1;
                }
                Ok(SendOutcome::NoResource) => {
                    self.counters.channel_full += 1;
                    break;
                }
                Err(e) => {
                    let reason = e.to_string();
                    return Err(self.fail(RiverError::NodeFailed { node: j, reason }));
                }
            }
        }
        Ok(work)
    }

    /// Seals the staging chunk of peer `j` (writes its header) and queues it.
    fn seal(&mut self, j: usize) {
        if let Some(mut chunk) = self.peers[j].staging.take() {
            let records = self.peers[j].staged_records;
            if records == 0 {
                return;
            }
            let h = Header { kind: Kind::Data, aux: 0, value: records }.encode();
            chunk.as_mut_slice()[..HEADER_LEN].copy_from_slice(&h);
            self.peers[j].staged_records = 0;
            self.peers[j].ready.push_back(chunk);
        }
    }

    /// Blocks (receiving meanwhile) until peer `j` has at most `limit` chunks waiting.
    fn drain_to(&mut self, j: usize, limit: usize) -> Result<(), RiverError> {
        let mut waited = false;
        let mut idle_since = Instant::now();
        loop {
            if self.progress()? > 0 {
                idle_since = Instant::now();
            }
            if self.peers[j].ready.len() <= limit {
                return Ok(());
            }
            if let Some(why) = &self.peers[j].down {
                let reason = format!("lost while we were sending to it ({why})");
                return Err(self.fail(RiverError::NodeFailed { node: j, reason }));
            }
            if !waited {
                self.counters.credit_waits += 1;
                waited = true;
            }
            if idle_since.elapsed() > self.config.idle_timeout {
                return Err(RiverError::Timeout {
                    what: format!("credit from node {j}"),
                    secs: self.config.idle_timeout.as_secs_f64(),
                });
            }
            // A full channel (not lack of credit) frees without a doorbell: look again soon.
            let timeout = if self.flow.credits(j) > 0 { Duration::from_millis(1) } else { Duration::from_millis(100) };
            self.wait(Some(timeout))?;
        }
    }

    /// Room, in records, of peer `j`'s staging chunk (taking a fresh one when needed;
    /// that may wait for credit while receiving).
    fn staging_room(&mut self, j: usize) -> Result<usize, RiverError> {
        if self.peers[j].staging.is_none() {
            let mut b = self.pool.try_get();
            if b.is_none() {
                self.drain_to(j, self.config.staged_chunks.saturating_sub(1))?;
                b = Some(self.pool.get());
            }
            let mut b = b.expect("got a buffer");
            b.set_len(HEADER_LEN);
            self.peers[j].staging = Some(b);
        }
        Ok(self.config.chunk_records - self.peers[j].staged_records as usize)
    }

    /// Counts `records` more staged for peer `j`; a full chunk is sealed and sent as
    /// credit allows.
    fn staged(&mut self, j: usize, records: usize) -> Result<(), RiverError> {
        self.peers[j].staged_records += records as u64;
        if self.peers[j].staged_records == self.config.chunk_records as u64 {
            self.seal(j);
            self.flush_ready(j)?;
            if self.peers[j].ready.len() > self.config.staged_chunks {
                self.drain_to(j, self.config.staged_chunks)?;
            }
        }
        Ok(())
    }

    /// Sends `records` records as one chunk to peer `j`, packed by `pack` straight into the
    /// channel's buffer, when nothing is staged or waiting for it (chunks stay in order)
    /// and it has credit. False when the chunk must be staged instead.
    fn send_packed(&mut self, j: usize, records: usize, pack: impl Fn(&mut [u8])) -> Result<bool, RiverError> {
        let p = &self.peers[j];
        if !p.pack_in_place || p.staged_records > 0 || !p.ready.is_empty() || !self.flow.may_send(j) {
            return Ok(false);
        }
        let ch = p.channel.expect("only peers have chunks");
        let header = Header { kind: Kind::Data, aux: 0, value: records as u64 }.encode();
        let len = HEADER_LEN + records * self.config.record_size;
        let outcome = self.ep.send_packed(ch, len, &mut |chunk| {
            chunk[..HEADER_LEN].copy_from_slice(&header);
            pack(&mut chunk[HEADER_LEN..]);
        });
        match outcome {
            Ok(SendOutcome::Done) | Ok(SendOutcome::InProgress(_)) => {
                self.flow.on_data_sent(j, records as u64);
                self.counters.records_sent += records as u64;
                self.counters.chunks_sent += 1;
                self.counters.chunks_packed += 1;
                Ok(true)
            }
            Ok(SendOutcome::NoResource) => {
                self.counters.channel_full += 1;
                Ok(false)
            }
            Err(e) => {
                let reason = e.to_string();
                Err(self.fail(RiverError::NodeFailed { node: j, reason }))
            }
        }
    }

    fn put(&mut self, j: usize, mut records: &[u8]) -> Result<(), RiverError> {
        let rs = self.config.record_size;
        if !records.len().is_multiple_of(rs) {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: rs });
        }
        let chunk = self.config.chunk_records;
        while !records.is_empty() {
            if records.len() >= chunk * rs {
                let (whole, rest) = records.split_at(chunk * rs);
                if self.send_packed(j, chunk, |dst| dst.copy_from_slice(whole))? {
                    records = rest;
                    continue;
                }
            }
            let take = self.staging_room(j)?.min(records.len() / rs) * rs;
            self.peers[j].staging.as_mut().expect("made above").extend_from_slice(&records[..take]);
            records = &records[take..];
            self.staged(j, take / rs)?;
        }
        Ok(())
    }

    fn put_gathered(&mut self, j: usize, records: &[u8], record_size: usize, which: &[u32]) -> Result<(), RiverError> {
        let rs = self.config.record_size;
        if record_size != rs {
            return Err(RiverError::Config(format!(
                "records of {record_size} bytes put on a river of {rs}-byte records"
            )));
        }
        let mut which = which;
        let chunk = self.config.chunk_records;
        while !which.is_empty() {
            if which.len() >= chunk {
                let (whole, rest) = which.split_at(chunk);
                if self.send_packed(j, chunk, |dst| copy_gathered(dst, records, rs, whole))? {
                    which = rest;
                    continue;
                }
            }
            let take = self.staging_room(j)?.min(which.len());
            let staging = self.peers[j].staging.as_mut().expect("made above");
            let len = staging.len();
            copy_gathered(&mut staging.spare_mut()[..take * rs], records, rs, &which[..take]);
            staging.set_len(len + take * rs);
            which = &which[take..];
            self.staged(j, take)?;
        }
        Ok(())
    }

    /// Sends everything staged for peer `j`, then its end of stream.
    fn finish_peer(&mut self, j: usize) -> Result<(), RiverError> {
        self.seal(j);
        self.drain_to(j, 0)?;
        let ch = self.peers[j].channel.expect("a peer");
        let h = Header { kind: Kind::EndOfStream, aux: 0, value: self.flow.sent_records(j) }.encode();
        self.send_small(j, ch, &[&h])?;
        self.flow.end_of_stream(j);
        self.peers[j].sink_open = false;
        Ok(())
    }

    fn send_small(&mut self, j: usize, ch: ChannelId, gather: &[&[u8]]) -> Result<(), RiverError> {
        let deadline = Instant::now() + self.config.idle_timeout;
        loop {
            match self.ep.send(ch, gather) {
                Ok(SendOutcome::Done) | Ok(SendOutcome::InProgress(_)) => return Ok(()),
                Ok(SendOutcome::NoResource) => {
                    self.counters.channel_full += 1;
                    self.progress()?;
                    if Instant::now() > deadline {
                        return Err(RiverError::Timeout {
                            what: format!("room on the channel to node {j}"),
                            secs: self.config.idle_timeout.as_secs_f64(),
                        });
                    }
                    self.wait(Some(Duration::from_millis(1)))?;
                }
                Err(e) => {
                    let reason = e.to_string();
                    return Err(self.fail(RiverError::NodeFailed { node: j, reason }));
                }
            }
        }
    }

    fn send_control(&mut self, j: usize, tag: u32, payload: &[u8]) -> Result<(), RiverError> {
        let ch = self.peers[j].channel.expect("control messages go to peers");
        let h = Header { kind: Kind::Control, aux: tag, value: payload.len() as u64 }.encode();
        self.send_small(j, ch, &[&h, payload])
    }
}

/// Hands one delivery (a message or a fragment of one) from peer `j` to where it goes.
#[allow(clippy::too_many_arguments)]
fn deliver<S: Sink>(
    p: &mut Peer,
    j: usize,
    flow: &mut FlowControl,
    store: &mut Option<S>,
    controls: &mut VecDeque<(usize, u32, Vec<u8>)>,
    counters: &mut RiverCounters,
    rs: usize,
    data: &[u8],
    message_len: u64,
    offset: u64,
) -> Result<(), RiverError> {
    let protocol = |reason: String| RiverError::Protocol { node: j, reason };
    let mut body = data;
    if offset == 0 {
        if !p.source.is_idle() {
            return Err(protocol("a message started inside another".into()));
        }
        let h = Header::decode(data, message_len, rs).map_err(|e| protocol(e.to_string()))?;
        match h.kind {
            Kind::Data => {
                if flow.has_ended(j) {
                    return Err(protocol("data after its end of stream".into()));
                }
                p.source.in_message = Some(h.value);
                body = &data[HEADER_LEN..];
            }
            Kind::Credit => return Ok(flow.on_credit(j, h.aux)?),
            Kind::EndOfStream => return Ok(flow.on_end_of_stream(j, h.value)?),
            Kind::Control | Kind::Abort | Kind::Hello => {
                let payload = &data[HEADER_LEN..];
                return match h.kind {
                    Kind::Abort => {
                        Err(RiverError::Aborted { node: j, reason: String::from_utf8_lossy(payload).into() })
                    }
                    Kind::Control if data.len() as u64 == message_len => {
                        controls.push_back((j, h.aux, payload.to_vec()));
                        Ok(())
                    }
                    Kind::Control => {
                        // A large control message comes in fragments: assemble it.
                        let mut buf = Vec::with_capacity(h.value as usize);
                        buf.extend_from_slice(payload);
                        p.source.control = Some((h.aux, buf));
                        Ok(())
                    }
                    _ => Err(protocol("hello after the mesh was set up".into())),
                };
            }
        }
    } else if p.source.in_message.is_none() {
        let Some((tag, mut buf)) = p.source.control.take() else {
            return Err(protocol("a fragment with no message".into()));
        };
        buf.extend_from_slice(data);
        if offset + data.len() as u64 == message_len {
            controls.push_back((j, tag, buf));
        } else {
            p.source.control = Some((tag, buf));
        }
        return Ok(());
    }
    let Some(store) = store.as_mut() else {
        return Err(protocol("data after the queue ran dry".into()));
    };
    if !p.source.carry.is_empty() {
        let take = (rs - p.source.carry.len()).min(body.len());
        p.source.carry.extend_from_slice(&body[..take]);
        body = &body[take..];
        if p.source.carry.len() == rs {
            store.sink_records(&p.source.carry)?;
            p.source.carry.clear();
        }
    }
    let whole = body.len() / rs * rs;
    if whole > 0 {
        store.sink_records(&body[..whole])?;
    }
    p.source.carry.extend_from_slice(&body[whole..]);
    if offset + data.len() as u64 == message_len {
        if !p.source.carry.is_empty() {
            return Err(protocol("a data message ended inside a record".into()));
        }
        let records = p.source.in_message.take().expect("in a data message");
        flow.on_data(j, records)?;
        counters.records_received += records;
    }
    Ok(())
}

/// The sink for this node's own part of the queue: records go straight to the store.
pub struct RiverSink<S: Sink> {
    river: River<S>,
    closed: bool,
}

impl<S: Sink> Sink for RiverSink<S> {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if self.closed {
            return Err(RiverError::Closed);
        }
        let mut inner = self.river.inner.borrow_mut();
        inner.counters.records_local += (records.len() / inner.config.record_size) as u64;
        match inner.store.as_mut() {
            Some(s) => s.sink_records(records),
            None => Err(RiverError::Closed),
        }
    }

    fn sink_gathered(&mut self, records: &[u8], record_size: usize, which: &[u32]) -> Result<(), RiverError> {
        if self.closed {
            return Err(RiverError::Closed);
        }
        let mut inner = self.river.inner.borrow_mut();
        inner.counters.records_local += which.len() as u64;
        match inner.store.as_mut() {
            Some(s) => s.sink_gathered(records, record_size, which),
            None => Err(RiverError::Closed),
        }
    }

    fn close(&mut self) -> Result<(), RiverError> {
        if !self.closed {
            self.closed = true;
            self.river.inner.borrow_mut().local_open = false;
        }
        Ok(())
    }
}

/// The sink for a peer's part of the queue: records are staged into chunks and sent as
/// credit allows; [`Sink::close`] sends the rest and the end of stream.
pub struct NetSink<S: Sink> {
    river: River<S>,
    peer: usize,
    closed: bool,
}

impl<S: Sink> Sink for NetSink<S> {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if self.closed {
            return Err(RiverError::Closed);
        }
        self.river.inner.borrow_mut().put(self.peer, records)
    }

    fn sink_gathered(&mut self, records: &[u8], record_size: usize, which: &[u32]) -> Result<(), RiverError> {
        if self.closed {
            return Err(RiverError::Closed);
        }
        self.river.inner.borrow_mut().put_gathered(self.peer, records, record_size, which)
    }

    fn close(&mut self) -> Result<(), RiverError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.river.inner.borrow_mut().finish_peer(self.peer)
    }
}

impl From<FlowError> for RiverError {
    fn from(e: FlowError) -> Self {
        match e {
            FlowError::Protocol { node, reason } => RiverError::Protocol { node, reason },
            FlowError::Lost { node, reason } => RiverError::NodeFailed { node, reason },
        }
    }
}
