//! Per-message tracing: who sent what to whom, how big, in how many buffers, and when each
//! stage of its life happened — the instrument of the Solaris MC communication study, for
//! ulnet's own clusters.
//!
//! Off by default. A process turns it on at start with `ULNET_TRACE=FILE` (read when its
//! first [`crate::Endpoint`] is made; `%p` in FILE becomes the process id and `%n` the node
//! id, so processes that share an environment write separate files), or at any time with
//! [`start`]; [`pause`] and [`resume`] switch it without closing the file, and [`stop`]
//! writes the end block and closes it. While off, every hook costs one relaxed load of a
//! flag and a branch that is always predicted.
//!
//! # What is recorded
//!
//! While on, every message sent or received through an endpoint is recorded: a sender's
//! record when the transport took it, a receiver's when it arrived whole (a large message
//! once, not per fragment), each with source and destination node, channel, kind, size,
//! buffers and each buffer's size, and request id. The message layer describes what it
//! receives and times its handlers through [`crate::ReplyTo`]; one-sided operations are
//! recorded with [`record_rma`]. Identical consecutive messages without a request id (a
//! stream) are recorded as one *run* record that counts them (at most
//! 1,024 per record, `RUN_MAX`, no run spans two ticks).
//!
//! # Time, and what it costs
//!
//! A clock read costs 15–40 ns on the virtual machines this was built on, more than a
//! shared-memory message (25 ns) and a tenth of a shared-memory round trip; the record
//! itself costs a few nanoseconds. So the clock is read only where it pays:
//!
//! - **Exact** records (flag in the file) read the clock for their own time and stages:
//!   the messages of one request id in [`TraceConfig::sample`] (by a hash of the id, so
//!   both sides pick the same calls: the request, its arrival, the server's handler, the
//!   response and its arrival), posted sends (their queueing is a stage), the end of runs
//!   of at least 16 messages (`RUN_EXACT_MIN`), and every record when `sample` is 1.
//! - Every other record carries the recorder's newest reading: its own latest exact
//!   reading or the session **ticker**, whichever is later. The recording threads advance
//!   the ticker when they drain their rings (below) and it is a quarter of a
//!   [`TraceConfig::tick_interval`] (1 ms) old; while none does, the writer thread advances
//!   it every tick. Such a time is at most one tick early (up to a flush interval, 10 ms,
//!   when the recording threads stop advancing it, until the writer thread notices; more
//!   when the writer thread waits for a CPU), which is what counts per node over time,
//!   rates and burstiness at scales of 10 ms and up need. Latency breakdowns come from the
//!   exact records; inter-arrival times below a tick need `ULNET_TRACE_SAMPLE=1`.
//!
//! # Where records go
//!
//! Each endpoint writes into a ring of its own (the free functions into one per thread),
//! allocated at its first record ([`TraceConfig::ring_records`]). The endpoint's own
//! thread moves the records on, when its poll finds nothing to do or before it sleeps:
//! encoded into the ring's block, which goes to the file when full or a
//! [`TraceConfig::flush_interval`] old, with other done blocks in one write of 64 KiB or
//! less (`writer`). A thread named `ulnet-trace` does it for
//! rings whose threads have not for a flush interval or that are half full (the free
//! functions' rings, threads that never idle), and keeps the ticker when no recording
//! thread does. A full ring drops the record and counts it: the data path never waits for
//! the file. The format is documented in [`format`](mod@format).
//!
//! Records still being written at the instant of [`stop`] may be lost (a run open then,
//! on a thread busy then, may lack up to 63 of its latest messages), and so may a call's
//! response that was the last thing its endpoint delivered before [`stop`]: it is recorded
//! (with its request) by the endpoint's next send, poll or close, after that send is
//! published, to keep the record off the round trip's critical path (see `recorder`). A
//! process that exits without [`stop`] leaves a file without its end block, whose intact
//! blocks [`format::decode_prefix`] still reads, and without the runs still open.

pub mod alternate;
mod clock;
mod compact;
pub mod format;
pub(crate) mod recorder;
mod ring;
mod slot;
mod writer;

pub use format::{decode_file, decode_prefix, DecodeError, Direction, MessageKind, Record, TraceFile};
pub use recorder::PendingReceive;

use crate::node::NodeId;
pub(crate) use recorder::Recorder;
use slot::Slot;
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use writer::Session;

/// The environment variable that starts tracing into the file it names.
pub const TRACE_ENV: &str = "ULNET_TRACE";
/// The environment variable that sets [`TraceConfig::ring_records`] for `ULNET_TRACE`.
pub const TRACE_RING_ENV: &str = "ULNET_TRACE_RING";
/// The environment variable that sets [`TraceConfig::sample`] (`1`: every record exact).
pub const TRACE_SAMPLE_ENV: &str = "ULNET_TRACE_SAMPLE";

/// The session being recorded, 0 while off or paused: the one load every hook makes.
static ACTIVE: AtomicU64 = AtomicU64::new(0);
static SESSION: Mutex<Option<Arc<Session>>> = Mutex::new(None);
/// The session ticker: a clock reading the recording threads refresh when they drain their
/// rings, and the writer thread every tick while they do not.
pub(crate) static TICKER: AtomicU64 = AtomicU64::new(0);
/// [`TraceConfig::tick_interval`] in ticks of the trace clock.
static TICK_TICKS: AtomicU64 = AtomicU64::new(0);
/// Request ids whose hash has these bits clear are sampled (0: all; `u64::MAX`: none).
static SAMPLE_MASK: AtomicU64 = AtomicU64::new(0);

/// Settings of a tracing session.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// The file to write (created or truncated).
    pub path: PathBuf,
    /// The node id written in the file header (records carry their own source and
    /// destination nodes).
    pub node_id: NodeId,
    /// Records per ring (one ring per recording endpoint or thread), a power of two
    /// (rounded up). 16,384 records (1 MiB): a thread that idles empties its ring as it
    /// goes, and the writer empties a neglected ring within a tick of it being half full,
    /// so a ring absorbs 8 M records/s, several times what a thread sends outside runs; a
    /// faster recorder drops records (counted in the file) rather than slow down.
    pub ring_records: usize,
    /// How long a record may wait in memory, and how often the writer thread wakes while
    /// the recording threads keep the ticker. 10 ms: a hundred wake-ups a second take
    /// little CPU from the traced threads, on whose CPU they may have to run, and a
    /// process that dies loses little.
    pub flush_interval: Duration,
    /// The precision of the times of the records not read from the clock (the ticker's
    /// step). 1 ms; the writer thread wakes this often only while no recording thread
    /// advances the ticker: each wake-up takes a CPU from a busy poller (measured: +10% on
    /// a shared-memory round trip's mean at 1,000 a second on two cores).
    pub tick_interval: Duration,
    /// One request id in `sample` (a power of two, rounded up) gets exact times at every
    /// stage on both sides. 64: the clock reads of a sampled shared-memory round trip
    /// (8 reads, about 130 ns) then add 2 ns per round trip on average, under 0.5% of it
    /// (16 cost 8 ns, a third of the tracer's whole budget of 5%), and a benchmark of
    /// 100,000 calls still yields 1,500 full breakdowns. 1: every record exact (for latency
    /// studies; costs 25–30% of a shared-memory round trip).
    pub sample: u32,
}

impl TraceConfig {
    /// Settings with the documented defaults.
    pub fn new(path: impl Into<PathBuf>, node_id: NodeId) -> Self {
        Self {
            path: path.into(),
            node_id,
            ring_records: 1 << 14,
            flush_interval: Duration::from_millis(10),
            tick_interval: Duration::from_millis(1),
            sample: 64,
        }
    }

    /// Applies `ULNET_TRACE_RING` (records per ring) and `ULNET_TRACE_SAMPLE` (one request
    /// id in N exact; 1: all) when they are set; values that do not parse are reported and
    /// ignored.
    pub fn with_env(mut self) -> Self {
        if let Ok(n) = std::env::var(TRACE_SAMPLE_ENV) {
            match n.trim().parse::<u32>() {
                Ok(n) if n >= 1 => self.sample = n,
                _ => tracing::warn!(value = %n, "{TRACE_SAMPLE_ENV} is not a count; using the default"),
            }
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

fn set_tick_ticks(ticks: u64) {
    TICK_TICKS.store(ticks, Ordering::Relaxed);
}

fn tick_ticks() -> u64 {
    TICK_TICKS.load(Ordering::Relaxed)
}

/// Advances the ticker to `now` (a clock reading a recording thread just made) when it is a
/// quarter of a tick behind: often enough that the writer thread need not wake every tick,
/// rarely enough that threads do not pass its cache line back and forth.
#[inline]
pub(crate) fn refresh_ticker(now: u64) {
    if now.saturating_sub(TICKER.load(Ordering::Relaxed)) > tick_ticks() / 4 {
        TICKER.fetch_max(now, Ordering::Relaxed);
    }
}

/// Whether tracing is on.
#[inline(always)]
pub fn enabled() -> bool {
    active() != 0
}

/// The session being recorded, 0 while tracing is off: the one check every hook makes.
///
/// Built with `RUSTFLAGS="--cfg ulnet_untraced"`, it is the constant 0 and the compiler
/// drops every hook behind it: not a product (tracing cannot be turned on), the baseline
/// that shows what the checks cost while tracing is off (`bench/trace-overhead.sh`).
#[inline(always)]
pub(crate) fn active() -> u64 {
    if cfg!(ulnet_untraced) {
        return 0;
    }
    ACTIVE.load(Ordering::Relaxed)
}

/// Whether every record reads the clock ([`TraceConfig::sample`] 1).
#[inline(always)]
pub(crate) fn exact_mode() -> bool {
    SAMPLE_MASK.load(Ordering::Relaxed) == 0
}

/// Whether the messages of `request_id` get exact times: every message in [`exact_mode`],
/// else the messages of one request id in [`TraceConfig::sample`]. One load of the mask.
#[inline(always)]
pub(crate) fn exact_or_sampled(request_id: u64) -> bool {
    let mask = SAMPLE_MASK.load(Ordering::Relaxed);
    // A multiplicative hash: the bits above 32 depend on every bit of the id's low half.
    mask == 0 || (request_id != 0 && (request_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) & mask == 0)
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
    let sample = u64::from(config.sample.max(1)).next_power_of_two();
    SAMPLE_MASK.store(sample - 1, Ordering::Relaxed);
    ACTIVE.store(id, Ordering::Release);
    tracing::info!(path = %config.path.display(), node = %config.node_id, sample, "tracing started");
    Ok(())
}

/// Turns tracing off, writes what the rings hold and the end block, and closes the file.
pub fn stop() -> Result<TraceSummary, TraceError> {
    let session = SESSION.lock().expect("not poisoned").take().ok_or(TraceError::NotRunning)?;
    ACTIVE.store(0, Ordering::Release);
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

/// Turns recording off without ending the session (the file stays open); the writer
/// thread then wakes only every flush interval.
pub fn pause() {
    ACTIVE.store(0, Ordering::Release);
}

/// Turns recording back on after [`pause`]; does nothing without a session.
pub fn resume() {
    let session = SESSION.lock().expect("not poisoned");
    if let Some(s) = session.as_ref() {
        // The writer thread does not keep the ticker while paused.
        TICKER.fetch_max(clock::ticks(), Ordering::Relaxed);
        ACTIVE.store(s.id, Ordering::Release);
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

/// The trace clock now (a clock read), for stage times recorded by layers above.
#[inline]
pub fn now() -> u64 {
    clock::ticks()
}

thread_local! {
    /// The recorder of the free functions, one per thread.
    static LOCAL: RefCell<Recorder> = const { RefCell::new(Recorder::new()) };
}

/// Records a datagram sent or received outside an endpoint (for layers with a socket of
/// their own, such as the membership's UDP socket): one message of `size` bytes from
/// `nodes.0` to `nodes.1`, as a record of kind [`MessageKind::Message`] on `channel`. It
/// takes the recorder's newest time, not a clock read of its own. Does nothing while
/// tracing is off.
pub fn record_datagram(direction: Direction, nodes: (NodeId, NodeId), channel: u32, size: u64) {
    let session = active();
    if session == 0 {
        return;
    }
    let listed = u32::try_from(size).ok();
    let slot = Slot {
        src_node: nodes.0 .0,
        dst_node: nodes.1 .0,
        channel,
        kind: MessageKind::Message as u8,
        flags: if direction == Direction::Receive { slot::FLAG_RECEIVE } else { 0 },
        buffers: u8::from(listed.is_some()),
        size,
        buffer_len: [listed.unwrap_or(0), 0, 0, 0],
        ..Slot::EMPTY
    };
    // A thread being torn down records nothing.
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.record_datagram(session, slot);
        }
    });
}

/// Records a one-sided operation (for the RMA layer): `size` bytes moved between `src`
/// (the initiator) and `dst`, issued at `enqueued` ticks ([`now`]; 0: not measured) and
/// complete now. Does nothing while tracing is off.
pub fn record_rma(kind: MessageKind, nodes: (NodeId, NodeId), channel: u32, size: u64, request_id: u64, enqueued: u64) {
    let session = active();
    if session == 0 {
        return;
    }
    debug_assert!(matches!(
        kind,
        MessageKind::RmaRead | MessageKind::RmaWrite | MessageKind::RmaCas | MessageKind::RmaFaa
    ));
    let listed = u32::try_from(size).ok();
    let slot = Slot {
        src_node: nodes.0 .0,
        dst_node: nodes.1 .0,
        channel,
        kind: kind as u8,
        buffers: u8::from(listed.is_some()),
        size,
        buffer_len: [listed.unwrap_or(0), 0, 0, 0],
        request_id,
        ..Slot::EMPTY
    };
    // A thread being torn down records nothing.
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.record_rma(session, slot, enqueued);
        }
    });
}
