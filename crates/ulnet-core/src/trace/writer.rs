//! The trace writer: owns the file and the session's rings.
//!
//! Each ring's records are encoded compact (format version 5) into a block of the ring's
//! own, which is done when it holds [`BLOCK_RECORDS_MAX`] records or is a flush interval
//! old: a few bytes per record to copy and write back, not 64. Done blocks go to the file
//! together, one `write` per [`WRITE_BATCH_BYTES`] or flush interval. Blocks of one ring
//! reach the file in order; blocks of different rings interleave.
//!
//! **Who drains a ring.** The thread that records into it, when it has nothing else to do:
//! an endpoint's poll that found nothing, or an endpoint about to sleep
//! ([`Session::drain_owned`]). A busy poller's idle polls are time it would have spun away,
//! so the encoding costs its messages nothing; done by a second thread, the same work
//! (and that thread's wake-ups) was taken from the busy pollers whenever they had every
//! CPU, as in a two-process benchmark on two cores. The thread `ulnet-trace` drains the
//! rings whose recording threads have not for a flush interval (blocked elsewhere, busy
//! without a pause, or gone) or that are half full, writes blocks that have grown old, and
//! advances the session ticker while no recording thread does (see [`Session::run`]).

use super::clock;
use super::compact;
use super::format::{
    encode_compact_block, BlockHeader, FileHeader, BLOCK_FLAG_END, BLOCK_HEADER_LEN, BLOCK_RECORDS_MAX,
    COMPACT_RECORD_LEN_MAX, VERSION,
};
use super::ring::RecordRing;
use super::slot::Slot;
use super::{TraceConfig, TraceError, TraceSummary, TICKER};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Records a recording thread drains at one idle poll at most: about 0.2 us of encoding,
/// less than the shortest round trip it could be waiting for, so a reply that arrives
/// meanwhile waits little; a ping-pong leaves one or two records per round trip.
pub(crate) const IDLE_DRAIN_MAX: usize = 8;

/// Encoded blocks are written to the file this many bytes at a time (or a flush interval
/// after the oldest's first record). A `write` costs about 4 us plus 0.45 ns a byte on the
/// virtual machines this was measured on, and a busy poller's round trip waits for the
/// ones its own thread makes; a block of RPC pair records is about 10 KB (format version
/// 5), so one write per block made the fixed cost twice the copying's. 64 KiB: the fixed
/// cost under a tenth, a write a few tens of microseconds.
const WRITE_BATCH_BYTES: usize = 64 << 10;

/// A ring and what its consumer keeps: the block being built from it.
pub(crate) struct TracedRing {
    pub(crate) ring: Arc<RecordRing>,
    /// Held by whoever drains the ring (the ring has one consumer at a time).
    block: Mutex<Block>,
    /// When the recording thread last drained the ring, in ticks (0: never).
    owner_drained_at: AtomicU64,
}

impl TracedRing {
    /// Half full: the writer thread drains it whoever its owner is.
    fn half_full(&self) -> bool {
        2 * self.ring.used() >= self.ring.capacity()
    }
}

impl std::fmt::Debug for TracedRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracedRing").field("ring", &self.ring).finish_non_exhaustive()
    }
}

/// The compact records of the block being built from one ring.
struct Block {
    records: Vec<u8>,
    count: u32,
    /// What the next record is encoded against (compact records say what changed since
    /// the block's previous record).
    context: compact::Context,
    /// When its first record was added, in ticks.
    opened_at: u64,
}

impl Block {
    fn new() -> Self {
        Block { records: Vec::new(), count: 0, context: compact::Context::new(VERSION), opened_at: 0 }
    }

    fn clear(&mut self) {
        self.records.clear();
        self.count = 0;
        self.context = compact::Context::new(VERSION);
    }
}

/// The file being written.
struct Sink {
    /// `None` once `finish` has closed it.
    file: Option<File>,
    /// The end block is written: blocks drained after it (records of the instant of
    /// `stop`) are not.
    ended: bool,
    sequence: u32,
    written: u64,
    bytes: u64,
    /// Encoded blocks not yet written: they go to the file together once they reach
    /// [`WRITE_BATCH_BYTES`] or a flush interval old, or with the end block.
    pending: Vec<u8>,
    /// When the oldest record of `pending` was added to its block, in ticks.
    pending_since: u64,
    /// The first write error; the session stops writing after it and `stop` reports it.
    error: Option<std::io::Error>,
}

/// Writes the blocks `sink` holds to its file.
fn flush_pending(sink: &mut Sink) {
    let Some(file) = sink.file.as_mut() else { return };
    match file.write_all(&sink.pending) {
        Ok(()) => sink.bytes += sink.pending.len() as u64,
        Err(e) => {
            tracing::warn!("trace file write failed; tracing continues without writing: {e}");
            sink.error = Some(e);
        }
    }
    sink.pending.clear();
}

/// One tracing session: from `start` to `stop`, one file.
pub(crate) struct Session {
    pub(crate) id: u64,
    pub(crate) ring_records: usize,
    path: PathBuf,
    rings: Mutex<Vec<Arc<TracedRing>>>,
    sink: Mutex<Sink>,
    stopping: (Mutex<bool>, Condvar),
    flusher: Mutex<Option<JoinHandle<()>>>,
    tick: Duration,
    flush: Duration,
    /// `flush` in ticks of the trace clock.
    flush_ticks: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).field("path", &self.path).finish_non_exhaustive()
    }
}

impl Session {
    /// Creates the file, writes its header and starts the writer thread.
    pub(crate) fn start(id: u64, config: &TraceConfig) -> Result<Arc<Session>, TraceError> {
        let io = |e| TraceError::Io(config.path.clone(), e);
        let mut file = File::create(&config.path).map_err(io)?;
        let (ref_ticks, ref_mono_ns) = clock::reference();
        let ticks_per_sec = clock::ticks_per_sec(Duration::from_millis(2));
        let header = FileHeader {
            version: VERSION,
            node_id: config.node_id.0,
            pid: std::process::id(),
            boot_id: clock::boot_id(),
            ref_ticks,
            ref_mono_ns,
            ref_real_ns: clock::real_ns(),
            ticks_per_sec,
        };
        file.write_all(&header.encode()).map_err(io)?;
        let in_ticks = |d: Duration| (d.as_nanos() * u128::from(ticks_per_sec) / 1_000_000_000) as u64;
        super::set_tick_ticks(in_ticks(config.tick_interval));
        let session = Arc::new(Session {
            id,
            ring_records: config.ring_records.next_power_of_two().max(2),
            path: config.path.clone(),
            rings: Mutex::new(Vec::new()),
            sink: Mutex::new(Sink {
                file: Some(file),
                ended: false,
                sequence: 0,
                written: 0,
                bytes: super::format::FILE_HEADER_LEN as u64,
                pending: Vec::with_capacity(
                    WRITE_BATCH_BYTES + BLOCK_HEADER_LEN + BLOCK_RECORDS_MAX * COMPACT_RECORD_LEN_MAX,
                ),
                pending_since: 0,
                error: None,
            }),
            stopping: (Mutex::new(false), Condvar::new()),
            flusher: Mutex::new(None),
            tick: config.tick_interval,
            flush: config.flush_interval.max(config.tick_interval),
            flush_ticks: in_ticks(config.flush_interval).max(1),
        });
        TICKER.store(clock::ticks(), Ordering::Relaxed);
        let s = session.clone();
        let handle = std::thread::Builder::new().name("ulnet-trace".into()).spawn(move || s.run()).map_err(io)?;
        *session.flusher.lock().expect("not poisoned") = Some(handle);
        Ok(session)
    }

    /// The file.
    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Registers a new ring for a recorder and returns it.
    pub(crate) fn new_ring(&self) -> Arc<TracedRing> {
        let ring = Arc::new(TracedRing {
            ring: Arc::new(RecordRing::new(self.ring_records)),
            block: Mutex::new(Block::new()),
            owner_drained_at: AtomicU64::new(0),
        });
        self.rings.lock().expect("not poisoned").push(ring.clone());
        ring
    }

    /// The recording thread's drain of its own ring, `now` ticks: at most `max` records
    /// into the ring's block (written when full). Does nothing when the writer thread holds
    /// the ring at this instant.
    pub(crate) fn drain_owned(&self, traced: &TracedRing, now: u64, max: usize) {
        let Ok(mut block) = traced.block.try_lock() else { return };
        traced.owner_drained_at.store(now, Ordering::Relaxed);
        traced.ring.drain_at_most(max, |s| self.add(&mut block, s, now));
    }

    /// The writer thread: advances the ticker every tick while no recording thread does,
    /// else sleeps a flush interval at a time; every flush interval (or tick, when a ring
    /// is half full) serves the rings their threads do not.
    fn run(&self) {
        let tick_ticks = super::tick_ticks();
        let (lock, cvar) = &self.stopping;
        let mut stored = 0u64;
        let mut sleep = self.tick;
        let mut served_at = clock::ticks();
        let mut stop = lock.lock().expect("not poisoned");
        while !*stop {
            stop = cvar.wait_timeout(stop, sleep).expect("not poisoned").0;
            if *stop {
                break;
            }
            let now = clock::ticks();
            let ticker = TICKER.load(Ordering::Relaxed);
            // A ticker that moved since our last store, and within a tick, is kept by the
            // recording threads (their idle polls and clock readings, see
            // `super::refresh_ticker`): a wake-up per tick would only take CPU from them.
            // Paused, nothing is recorded to need it (`resume` advances it).
            if super::active() == 0 || (ticker != stored && now.saturating_sub(ticker) < tick_ticks) {
                sleep = self.flush;
            } else {
                TICKER.fetch_max(now, Ordering::Relaxed);
                stored = now;
                sleep = self.tick;
            }
            let crowded = || self.rings.lock().expect("not poisoned").iter().any(|r| r.half_full());
            if now.saturating_sub(served_at) >= self.flush_ticks || crowded() {
                served_at = now;
                drop(stop);
                self.serve(now, false);
                stop = lock.lock().expect("not poisoned");
            }
        }
    }

    /// The writer thread's pass, `now` ticks: drains the rings their threads have not
    /// drained for a flush interval or that are half full, and writes the blocks that are a
    /// flush interval old. With `end`: every ring, what the open runs hold, and the end
    /// block; the file is closed after it.
    fn serve(&self, now: u64, end: bool) {
        let rings: Vec<Arc<TracedRing>> = self.rings.lock().expect("not poisoned").clone();
        for traced in &rings {
            let neglected = now.saturating_sub(traced.owner_drained_at.load(Ordering::Relaxed)) >= self.flush_ticks;
            let drain = end || neglected || traced.half_full();
            let mut block = if drain {
                traced.block.lock().expect("not poisoned")
            } else {
                // Its thread drains it: only a block grown old is the writer's to write.
                match traced.block.try_lock() {
                    Ok(block) => block,
                    Err(_) => continue,
                }
            };
            if drain {
                while traced.ring.drain_with(|s| self.add(&mut block, s, now)) > 0 {}
            }
            if end {
                // (A run rolled over and not extended since holds no message.)
                if let Some(run) = traced.ring.open_run().filter(|run| run.stage_a > 0) {
                    self.add(&mut block, &run.closed_run(), now);
                }
            }
            if block.count > 0 && (end || now.saturating_sub(block.opened_at) >= self.flush_ticks) {
                self.write(&mut block, 0);
            }
        }
        if end {
            self.write(&mut Block::new(), BLOCK_FLAG_END);
        } else {
            let mut sink = self.sink.lock().expect("not poisoned");
            if !sink.pending.is_empty() && now.saturating_sub(sink.pending_since) >= self.flush_ticks {
                flush_pending(&mut sink);
            }
        }
    }

    /// Adds a record to `block`, and writes the block when it is full.
    #[inline]
    fn add(&self, block: &mut Block, slot: &Slot, now: u64) {
        if block.count == 0 {
            block.opened_at = now;
        }
        compact::encode(&mut block.context, slot, &mut block.records);
        block.count += 1;
        if block.count as usize == BLOCK_RECORDS_MAX {
            self.write(block, 0);
        }
    }

    /// Makes `block` the file's next block (nothing once the end block is written), written
    /// with the blocks before it once they are [`WRITE_BATCH_BYTES`] or it is the end block,
    /// and empties it.
    fn write(&self, block: &mut Block, flags: u16) {
        let mut sink = self.sink.lock().expect("not poisoned");
        let sink = &mut *sink;
        if sink.error.is_none() && !sink.ended && sink.file.is_some() {
            let (ref_ticks, ref_mono_ns) = clock::reference();
            let header = BlockHeader {
                flags,
                record_count: block.count,
                sequence: sink.sequence,
                dropped_total: self.dropped(),
                ref_ticks,
                ref_mono_ns,
            };
            if sink.pending.is_empty() {
                sink.pending_since = block.opened_at;
            }
            encode_compact_block(&header, &block.records, &mut sink.pending);
            sink.ended = flags & BLOCK_FLAG_END != 0;
            sink.sequence += 1;
            sink.written += u64::from(block.count);
            if sink.ended || sink.pending.len() >= WRITE_BATCH_BYTES {
                flush_pending(sink);
            }
        }
        block.clear();
    }

    /// Records the session's rings have dropped so far.
    fn dropped(&self) -> u64 {
        self.rings.lock().expect("not poisoned").iter().map(|r| r.ring.dropped()).sum()
    }

    /// Stops the writer thread, writes what is left and the end block, and closes the file.
    pub(crate) fn finish(&self) -> Result<TraceSummary, TraceError> {
        {
            let (lock, cvar) = &self.stopping;
            *lock.lock().expect("not poisoned") = true;
            cvar.notify_all();
        }
        if let Some(h) = self.flusher.lock().expect("not poisoned").take() {
            let _ = h.join();
        }
        self.serve(clock::ticks(), true);
        let dropped = self.dropped();
        let mut sink = self.sink.lock().expect("not poisoned");
        let file = sink.file.take();
        if let Some(e) = sink.error.take() {
            return Err(TraceError::Io(self.path.clone(), e));
        }
        match file.map(|f| f.sync_data()) {
            // A file that cannot be synced (a pipe, `/dev/null`) has nothing to sync.
            Some(Err(e)) if e.kind() != std::io::ErrorKind::InvalidInput => {
                return Err(TraceError::Io(self.path.clone(), e))
            }
            _ => {}
        }
        Ok(TraceSummary { path: self.path.clone(), records: sink.written, dropped, bytes: sink.bytes })
    }
}
