//! Per-message tracing: who sent what to whom, how big, in how many buffers, and when each
//! stage of its life happened — the instrument of the Solaris MC communication study, for
//! ulnet's own clusters.
//!
//! Off by default. A process turns it on at start with `ULNET_TRACE=FILE` (read when its
//! first [`crate::Endpoint`] is made; `%p` in FILE becomes the process id and `%n` the node
//! id, so processes that share an environment write separate files), or at any time with
//! [`start`]; [`pause`] and [`resume`] switch it without closing the file, and [`stop`]
//! writes the end block and closes it. While off, every hook costs one relaxed atomic load
//! and a branch that is always predicted.
//!
//! While on, each message sent or received through an endpoint becomes one [`Record`]: a
//! sender's record when the transport took it, a receiver's when it arrived whole (a large
//! message once, not per fragment). The message layer adds the kind and request id and
//! the handler's start and end ([`note_receive`], [`handler_start`], [`handler_end`],
//! [`crate::Endpoint::send_as`]); one-sided operations are recorded with [`record_rma`].
//! Records go to a ring per thread, allocated at the thread's first record
//! ([`TraceConfig::ring_records`]); a thread named `ulnet-trace` drains the rings into the
//! file every [`TraceConfig::flush_interval`]. A full ring drops the record and counts it:
//! the data path never waits for the file. The format is documented in [`format`].
//!
//! Records still being written at the instant of [`stop`] may be lost; a process that exits
//! without [`stop`] leaves a file without its end block, whose intact blocks
//! [`format::decode_prefix`] still reads.

mod clock;
pub mod format;
mod ring;
mod slot;
mod writer;

pub use format::{decode_file, decode_prefix, DecodeError, Direction, MessageKind, Record, TraceFile};

use crate::node::NodeId;
use ring::Producer;
use slot::{offset, Slot};
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use writer::Session;

/// The environment variable that starts tracing into the file it names.
pub const TRACE_ENV: &str = "ULNET_TRACE";
/// The environment variable that sets [`TraceConfig::ring_records`] for `ULNET_TRACE`.
pub const TRACE_RING_ENV: &str = "ULNET_TRACE_RING";
/// The environment variable that turns [`TraceConfig::handler_times`] off (`0`).
pub const TRACE_HANDLERS_ENV: &str = "ULNET_TRACE_HANDLERS";

static ENABLED: AtomicBool = AtomicBool::new(false);
static HANDLER_TIMES: AtomicBool = AtomicBool::new(true);
/// The running session's id (0: none); a thread whose ring belongs to another session
/// registers a new one.
static SESSION_ID: AtomicU64 = AtomicU64::new(0);
static SESSION: Mutex<Option<Arc<Session>>> = Mutex::new(None);

/// Settings of a tracing session.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// The file to write (created or truncated).
    pub path: PathBuf,
    /// The node id written in the file header (records carry their own source and
    /// destination nodes).
    pub node_id: NodeId,
    /// Records per thread ring, a power of two (rounded up). 65,536 records (4 MiB per
    /// tracing thread, a 64-byte line per record): at a flush every 10 ms a thread can record 6.5 M messages/s
    /// without loss, more than RPC workloads send; raw streams of tiny messages faster than
    /// that drop records (counted in the file) rather than slow down.
    pub ring_records: usize,
    /// How often the writer drains the rings. 10 ms: short enough that rings rarely fill,
    /// long enough that the writer thread takes little CPU from the traced threads.
    pub flush_interval: Duration,
    /// Time the handlers of received messages (two more clock reads per message). On by
    /// default: the request–response breakdown needs them; off (`ULNET_TRACE_HANDLERS=0`)
    /// for the cheapest tracing that still pairs requests and responses.
    pub handler_times: bool,
}

impl TraceConfig {
    /// Settings with the documented defaults.
    pub fn new(path: impl Into<PathBuf>, node_id: NodeId) -> Self {
        Self {
            path: path.into(),
            node_id,
            ring_records: 1 << 16,
            flush_interval: Duration::from_millis(10),
            handler_times: true,
        }
    }
}

impl TraceConfig {
    /// Applies `ULNET_TRACE_RING` (records per ring) and `ULNET_TRACE_HANDLERS=0` (no
    /// handler times) when they are set; values that do not parse are reported and ignored.
    pub fn with_env(mut self) -> Self {
        if let Ok(v) = std::env::var(TRACE_HANDLERS_ENV) {
            self.handler_times = v.trim() != "0";
        }
        if let Ok(n) = std::env::var(TRACE_RING_ENV) {
            match n.trim().parse::<usize>() {
                Ok(n) if n >= 2 => self.ring_records = n,
                _ => tracing::warn!(value = %n, "{TRACE_RING_ENV} is not a record count; using the default"),
            }
        }
        self
    }
}

/// Why tracing could not be started or finished.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// [`start`] while a session runs.
    #[error("tracing is already running (into {0})")]
    AlreadyRunning(PathBuf),
    /// [`stop`] with no session running.
    #[error("tracing is not running")]
    NotRunning,
    /// The trace file could not be created or written.
    #[error("trace file {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
}

/// What a finished session wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// The file.
    pub path: PathBuf,
    /// Records written.
    pub records: u64,
    /// Records dropped because a ring was full.
    pub dropped: u64,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Whether tracing is on: the one check every hook makes first.
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Starts a session writing to `config.path`, and turns tracing on.
pub fn start(config: TraceConfig) -> Result<(), TraceError> {
    let mut current = SESSION.lock().expect("not poisoned");
    if let Some(s) = current.as_ref() {
        return Err(TraceError::AlreadyRunning(s.path().clone()));
    }
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let session = Session::start(id, &config)?;
    *current = Some(session);
    HANDLER_TIMES.store(config.handler_times, Ordering::Relaxed);
    SESSION_ID.store(id, Ordering::Release);
    ENABLED.store(true, Ordering::Release);
    tracing::info!(path = %config.path.display(), node = %config.node_id, "tracing started");
    Ok(())
}

/// Turns tracing off, writes what the rings hold and the end block, and closes the file.
pub fn stop() -> Result<TraceSummary, TraceError> {
    let session = SESSION.lock().expect("not poisoned").take().ok_or(TraceError::NotRunning)?;
    ENABLED.store(false, Ordering::Release);
    SESSION_ID.store(0, Ordering::Release);
    let summary = session.finish()?;
    if summary.dropped > 0 {
        tracing::warn!(dropped = summary.dropped, "trace rings were full: records were dropped");
    }
    Ok(summary)
}

/// Stops the session if one runs (for a process about to exit).
pub fn stop_if_running() -> Option<Result<TraceSummary, TraceError>> {
    let running = SESSION.lock().expect("not poisoned").is_some();
    running.then(stop)
}

/// Turns recording off without ending the session (the file stays open).
pub fn pause() {
    ENABLED.store(false, Ordering::Release);
}

/// Turns recording back on after [`pause`]; does nothing without a session.
pub fn resume() {
    if SESSION.lock().expect("not poisoned").is_some() {
        ENABLED.store(true, Ordering::Release);
    }
}

/// Starts tracing if `ULNET_TRACE` names a file (once per process; later calls do
/// nothing). Called when the first endpoint is made.
pub fn start_from_env(node_id: NodeId) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(path) = std::env::var(TRACE_ENV) else { return };
        if path.is_empty() {
            return;
        }
        let path = path.replace("%p", &std::process::id().to_string()).replace("%n", &node_id.0.to_string());
        let config = TraceConfig::new(path, node_id).with_env();
        match start(config) {
            Ok(()) | Err(TraceError::AlreadyRunning(_)) => {}
            Err(e) => tracing::warn!("{TRACE_ENV}: tracing not started: {e}"),
        }
    });
}

/// The trace clock now, for stage times recorded by layers above.
#[inline]
pub fn now() -> u64 {
    clock::ticks()
}

/// What the current thread is recording.
struct Local {
    producer: Option<Producer>,
    session: u64,
    /// The record of the message being delivered, while its handler runs.
    staged: Slot,
    staged_open: bool,
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local { producer: None, session: 0, staged: Slot::EMPTY, staged_open: false })
    };
}

impl Local {
    /// Appends to this thread's ring, registering one with the running session first if
    /// needed. Does nothing when no session runs.
    fn push(&mut self, record: &Slot) {
        let current = SESSION_ID.load(Ordering::Acquire);
        if self.session != current || self.producer.is_none() {
            self.producer = None;
            self.session = current;
            let session = SESSION.lock().expect("not poisoned").clone();
            match session {
                Some(s) if s.id == current => self.producer = Some(Producer::new(s.new_ring())),
                _ => return,
            }
        }
        if let Some(p) = self.producer.as_mut() {
            p.push(record);
        }
    }
}

fn with_local(f: impl FnOnce(&mut Local)) {
    // A thread being torn down, or a hook re-entered from within a hook, records nothing.
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            f(&mut l)
        }
    });
}

/// Records a message sent whole (`enqueued`: ticks when it was queued, 0 if it was not).
#[inline(never)]
pub(crate) fn record_send(
    nodes: (NodeId, NodeId),
    channel: u32,
    gather: &[&[u8]],
    kind: MessageKind,
    request_id: u64,
    enqueued: u64,
) {
    let sent = clock::ticks();
    let mut buffer_len = [0u32; 4];
    let mut size = 0u64;
    for (i, b) in gather.iter().enumerate() {
        if i < 4 {
            buffer_len[i] = b.len().min(u32::MAX as usize) as u32;
        }
        size += b.len() as u64;
    }
    if gather.len() > 4 || buffer_len.iter().map(|&l| u64::from(l)).sum::<u64>() != size {
        // Beyond what a record lists: keep the total, say the list is not known.
        buffer_len = [0; 4];
    }
    let listed = buffer_len.iter().any(|&l| l != 0) || size == 0;
    let record = Slot {
        ticks: sent,
        src_node: nodes.0 .0,
        dst_node: nodes.1 .0,
        channel,
        kind: kind as u8,
        direction: Direction::Send as u8,
        buffers: if listed { gather.len() as u8 } else { 0 },
        size,
        buffer_len,
        request_id,
        stage_a: if enqueued == 0 { 0 } else { offset(enqueued, sent) },
        ..Slot::EMPTY
    };
    with_local(|l| l.push(&record));
}

/// Opens the record of a message arriving whole, kept while its handler runs so the layer
/// above can describe it; [`close_receive`] writes it.
#[inline(never)]
pub(crate) fn open_receive(nodes: (NodeId, NodeId), channel: u32, size: u64) {
    let received = clock::ticks();
    with_local(|l| {
        if l.staged_open {
            // A handler that polls another endpoint: the outer record is written as it is.
            let outer = l.staged;
            l.push(&outer);
        }
        l.staged = Slot {
            ticks: received,
            src_node: nodes.0 .0,
            dst_node: nodes.1 .0,
            channel,
            direction: Direction::Receive as u8,
            size,
            ..Slot::EMPTY
        };
        l.staged_open = true;
    });
}

/// Writes the record opened by [`open_receive`].
#[inline(never)]
pub(crate) fn close_receive() {
    with_local(|l| {
        if l.staged_open {
            l.staged_open = false;
            let r = l.staged;
            l.push(&r);
        }
    });
}

/// Describes the message being delivered (call from a delivery handler while tracing is
/// on): its kind and the request id that pairs it.
#[inline(never)]
pub fn note_receive(kind: MessageKind, request_id: u64) {
    with_local(|l| {
        if l.staged_open {
            l.staged.kind = kind as u8;
            l.staged.request_id = request_id;
        }
    });
}

/// Marks the start of the handler of the message being delivered.
#[inline(never)]
pub fn handler_start() {
    if !HANDLER_TIMES.load(Ordering::Relaxed) {
        return;
    }
    let t = clock::ticks();
    with_local(|l| {
        if l.staged_open {
            l.staged.stage_a = offset(l.staged.ticks, t);
        }
    });
}

/// Marks the end of the handler of the message being delivered.
#[inline(never)]
pub fn handler_end() {
    if !HANDLER_TIMES.load(Ordering::Relaxed) {
        return;
    }
    let t = clock::ticks();
    with_local(|l| {
        if l.staged_open {
            l.staged.stage_b = offset(l.staged.ticks, t);
        }
    });
}

/// Records a one-sided operation (for the RMA layer): `size` bytes moved between `src`
/// (the initiator) and `dst`, issued at `enqueued` ticks ([`now`]) and complete now.
/// Does nothing while tracing is off.
pub fn record_rma(kind: MessageKind, nodes: (NodeId, NodeId), channel: u32, size: u64, request_id: u64, enqueued: u64) {
    if !enabled() {
        return;
    }
    debug_assert!(matches!(
        kind,
        MessageKind::RmaRead | MessageKind::RmaWrite | MessageKind::RmaCas | MessageKind::RmaFaa
    ));
    let t = clock::ticks();
    let record = Slot {
        ticks: t,
        src_node: nodes.0 .0,
        dst_node: nodes.1 .0,
        channel,
        kind: kind as u8,
        direction: Direction::Send as u8,
        buffers: 1,
        size,
        buffer_len: [size.min(u64::from(u32::MAX)) as u32, 0, 0, 0],
        request_id,
        stage_a: if enqueued == 0 { 0 } else { offset(enqueued, t) },
        ..Slot::EMPTY
    };
    let record = if size > u64::from(u32::MAX) { Slot { buffers: 0, buffer_len: [0; 4], ..record } } else { record };
    with_local(|l| l.push(&record));
}
