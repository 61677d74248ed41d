//! The trace writer: owns the file and the registered rings, and one thread that keeps the
//! session ticker current (every `tick_interval`) and drains the rings into checksummed
//! blocks (every `flush_interval`, or sooner when a ring is half full). Records are encoded
//! compact (format version 4) straight from the rings into the flush's buffer, which one
//! `write` hands to the file: a few bytes per record to copy and to write back, not 64.

use super::clock;
use super::compact;
use super::format::{
    encode_compact_block, BlockHeader, FileHeader, BLOCK_FLAG_END, BLOCK_HEADER_LEN, BLOCK_RECORDS_MAX,
    COMPACT_RECORD_LEN_MAX,
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

/// The file being written and the state of its blocks.
struct Sink {
    file: File,
    sequence: u32,
    written: u64,
    bytes: u64,
    /// The compact records of the block being built, reused across blocks.
    records: Vec<u8>,
    /// How many.
    count: u32,
    /// The record before the next one in the block (compact records say what changed).
    previous: Slot,
    /// Encoded blocks of one flush, written with one call; reused across flushes.
    blocks: Vec<u8>,
    /// The first write error; the writer stops writing after it and `stop` reports it.
    error: Option<std::io::Error>,
}

/// One tracing session: from `start` to `stop`, one file.
pub(crate) struct Session {
    pub(crate) id: u64,
    pub(crate) ring_records: usize,
    path: PathBuf,
    rings: Mutex<Vec<Arc<RecordRing>>>,
    sink: Mutex<Sink>,
    stopping: (Mutex<bool>, Condvar),
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Records dropped by rings of this session (read at each block).
    pub(crate) dropped_seen: AtomicU64,
}

impl Session {
    /// Creates the file, writes its header and starts the writer thread.
    pub(crate) fn start(id: u64, config: &TraceConfig) -> Result<Arc<Session>, TraceError> {
        let io = |e| TraceError::Io(config.path.clone(), e);
        let mut file = File::create(&config.path).map_err(io)?;
        let (ref_ticks, ref_mono_ns) = clock::reference();
        let header = FileHeader {
            version: super::format::VERSION,
            node_id: config.node_id.0,
            pid: std::process::id(),
            boot_id: clock::boot_id(),
            ref_ticks,
            ref_mono_ns,
            ref_real_ns: clock::real_ns(),
            ticks_per_sec: clock::ticks_per_sec(Duration::from_millis(2)),
        };
        file.write_all(&header.encode()).map_err(io)?;
        let session = Arc::new(Session {
            id,
            ring_records: config.ring_records.next_power_of_two().max(2),
            path: config.path.clone(),
            rings: Mutex::new(Vec::new()),
            sink: Mutex::new(Sink {
                file,
                sequence: 0,
                written: 0,
                bytes: super::format::FILE_HEADER_LEN as u64,
                records: Vec::with_capacity(BLOCK_RECORDS_MAX * COMPACT_RECORD_LEN_MAX),
                count: 0,
                previous: Slot::EMPTY,
                blocks: Vec::with_capacity(BLOCK_HEADER_LEN + BLOCK_RECORDS_MAX * COMPACT_RECORD_LEN_MAX),
                error: None,
            }),
            stopping: (Mutex::new(false), Condvar::new()),
            flusher: Mutex::new(None),
            dropped_seen: AtomicU64::new(0),
        });
        TICKER.store(clock::ticks(), Ordering::Relaxed);
        let s = session.clone();
        let (tick, flush) = (config.tick_interval, config.flush_interval);
        let handle =
            std::thread::Builder::new().name("ulnet-trace".into()).spawn(move || s.run(tick, flush)).map_err(io)?;
        *session.flusher.lock().expect("not poisoned") = Some(handle);
        Ok(session)
    }

    /// The file.
    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Registers a new ring for a recorder and returns it.
    pub(crate) fn new_ring(&self) -> Arc<RecordRing> {
        let ring = Arc::new(RecordRing::new(self.ring_records));
        self.rings.lock().expect("not poisoned").push(ring.clone());
        ring
    }

    /// The writer thread: ticks, and drains every `flush` or when a ring is half full.
    fn run(&self, tick: Duration, flush: Duration) {
        let ticks_per_flush = (flush.as_nanos() / tick.as_nanos().max(1)).max(1) as u32;
        let (lock, cvar) = &self.stopping;
        let mut since_flush = 0u32;
        let mut stop = lock.lock().expect("not poisoned");
        while !*stop {
            stop = cvar.wait_timeout(stop, tick).expect("not poisoned").0;
            if *stop {
                break;
            }
            TICKER.store(clock::ticks(), Ordering::Relaxed);
            since_flush += 1;
            let half_full = || self.rings.lock().expect("not poisoned").iter().any(|r| 2 * r.used() >= r.capacity());
            if since_flush >= ticks_per_flush || half_full() {
                since_flush = 0;
                drop(stop);
                self.drain(false);
                stop = lock.lock().expect("not poisoned");
            }
        }
    }

    /// Writes everything the rings hold as blocks; with `end`, what their open runs hold
    /// and an end block after them.
    pub(crate) fn drain(&self, end: bool) {
        let rings: Vec<Arc<RecordRing>> = self.rings.lock().expect("not poisoned").clone();
        let mut sink = self.sink.lock().expect("not poisoned");
        let sink = &mut *sink;
        sink.blocks.clear();
        let dropped: u64 = rings.iter().map(|r| r.dropped()).sum();
        self.dropped_seen.store(dropped, Ordering::Relaxed);
        for ring in &rings {
            while ring.drain_with(|s| add_record(sink, s, dropped)) > 0 {}
        }
        if end {
            for run in rings.iter().filter_map(|r| r.open_run()) {
                add_record(sink, &run.closed_run(), dropped);
            }
            if sink.count > 0 {
                add_block(sink, 0, dropped);
            }
            add_block(sink, BLOCK_FLAG_END, dropped);
        } else if sink.count > 0 {
            add_block(sink, 0, dropped);
        }
        if sink.error.is_none() && !sink.blocks.is_empty() {
            match sink.file.write_all(&sink.blocks) {
                Ok(()) => sink.bytes += sink.blocks.len() as u64,
                Err(e) => {
                    tracing::warn!("trace file write failed; tracing continues without writing: {e}");
                    sink.error = Some(e);
                }
            }
        }
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
        self.drain(true);
        let mut sink = self.sink.lock().expect("not poisoned");
        if let Some(e) = sink.error.take() {
            return Err(TraceError::Io(self.path.clone(), e));
        }
        if let Err(e) = sink.file.sync_data() {
            return Err(TraceError::Io(self.path.clone(), e));
        }
        Ok(TraceSummary {
            path: self.path.clone(),
            records: sink.written,
            dropped: self.dropped_seen.load(Ordering::Relaxed),
            bytes: sink.bytes,
        })
    }
}

/// Adds a record to the block being built, and the block to the blocks of this flush when
/// it is full.
#[inline]
fn add_record(sink: &mut Sink, slot: &Slot, dropped_total: u64) {
    compact::encode(&mut sink.previous, slot, &mut sink.records);
    sink.count += 1;
    if sink.count as usize == BLOCK_RECORDS_MAX {
        add_block(sink, 0, dropped_total);
    }
}

/// Appends a block of the records in `sink.records` to the blocks of this flush, and starts
/// the next block.
fn add_block(sink: &mut Sink, flags: u16, dropped_total: u64) {
    let (ref_ticks, ref_mono_ns) = clock::reference();
    let count = sink.count;
    let header =
        BlockHeader { flags, record_count: count, sequence: sink.sequence, dropped_total, ref_ticks, ref_mono_ns };
    encode_compact_block(&header, &sink.records, &mut sink.blocks);
    sink.sequence += 1;
    sink.written += u64::from(count);
    sink.records.clear();
    sink.count = 0;
    sink.previous = Slot::EMPTY;
}
