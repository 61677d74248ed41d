//! The trace writer: owns the file and the registered rings, and a flusher thread that
//! drains the rings into checksummed blocks every `flush_interval`.

use super::clock;
use super::format::{encode_block, BlockHeader, FileHeader, Record, BLOCK_FLAG_END, BLOCK_RECORDS_MAX};
use super::ring::RecordRing;
use super::slot::Slot;
use super::{TraceConfig, TraceError, TraceSummary};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The file being written and the state of its blocks.
struct Sink {
    file: std::io::BufWriter<File>,
    sequence: u32,
    written: u64,
    bytes: u64,
    /// Slots drained from the rings, reused across flushes.
    scratch: Vec<Slot>,
    /// Their file records, reused across flushes.
    records: Vec<Record>,
    /// An encoded block, reused across flushes.
    block: Vec<u8>,
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
    /// Creates the file, writes its header and starts the flusher.
    pub(crate) fn start(id: u64, config: &TraceConfig) -> Result<Arc<Session>, TraceError> {
        let io = |e| TraceError::Io(config.path.clone(), e);
        let file = File::create(&config.path).map_err(io)?;
        let (ref_ticks, ref_mono_ns) = clock::reference();
        let header = FileHeader {
            node_id: config.node_id.0,
            pid: std::process::id(),
            boot_id: clock::boot_id(),
            ref_ticks,
            ref_mono_ns,
            ref_real_ns: clock::real_ns(),
            ticks_per_sec: clock::ticks_per_sec(Duration::from_millis(2)),
        };
        let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
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
                scratch: Vec::with_capacity(BLOCK_RECORDS_MAX),
                records: Vec::with_capacity(BLOCK_RECORDS_MAX),
                block: Vec::with_capacity(64 + BLOCK_RECORDS_MAX * 96),
                error: None,
            }),
            stopping: (Mutex::new(false), Condvar::new()),
            flusher: Mutex::new(None),
            dropped_seen: AtomicU64::new(0),
        });
        let s = session.clone();
        let interval = config.flush_interval;
        let handle =
            std::thread::Builder::new().name("ulnet-trace".into()).spawn(move || s.flush_loop(interval)).map_err(io)?;
        *session.flusher.lock().expect("not poisoned") = Some(handle);
        Ok(session)
    }

    /// The file.
    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Registers a new ring for a thread and returns it.
    pub(crate) fn new_ring(&self) -> Arc<RecordRing> {
        let ring = Arc::new(RecordRing::new(self.ring_records));
        self.rings.lock().expect("not poisoned").push(ring.clone());
        ring
    }

    fn flush_loop(&self, interval: Duration) {
        let (lock, cvar) = &self.stopping;
        let mut stop = lock.lock().expect("not poisoned");
        while !*stop {
            stop = cvar.wait_timeout(stop, interval).expect("not poisoned").0;
            if !*stop {
                drop(stop);
                self.drain(false);
                stop = lock.lock().expect("not poisoned");
            }
        }
    }

    /// Writes everything the rings hold as blocks; with `end`, an end block after them.
    pub(crate) fn drain(&self, end: bool) {
        let rings: Vec<Arc<RecordRing>> = self.rings.lock().expect("not poisoned").clone();
        let mut sink = self.sink.lock().expect("not poisoned");
        let sink = &mut *sink;
        for ring in &rings {
            loop {
                sink.scratch.clear();
                ring.drain_into(&mut sink.scratch);
                if sink.scratch.is_empty() {
                    break;
                }
                let dropped = rings.iter().map(|r| r.dropped()).sum();
                self.dropped_seen.store(dropped, Ordering::Relaxed);
                let mut records = std::mem::take(&mut sink.records);
                records.clear();
                records.extend(sink.scratch.iter().map(|s| s.to_record()));
                for chunk in records.chunks(BLOCK_RECORDS_MAX) {
                    write_block(sink, chunk, 0, dropped);
                }
                sink.records = records;
            }
        }
        if end {
            let dropped = rings.iter().map(|r| r.dropped()).sum();
            self.dropped_seen.store(dropped, Ordering::Relaxed);
            write_block(sink, &[], BLOCK_FLAG_END, dropped);
        }
        if sink.error.is_none() {
            if let Err(e) = sink.file.flush() {
                sink.error = Some(e);
            }
        }
    }

    /// Stops the flusher, writes what is left and the end block, and closes the file.
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
        if let Err(e) = sink.file.get_ref().sync_data() {
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

fn write_block(sink: &mut Sink, records: &[Record], flags: u16, dropped_total: u64) {
    let (ref_ticks, ref_mono_ns) = clock::reference();
    let header = BlockHeader {
        flags,
        record_count: records.len() as u32,
        sequence: sink.sequence,
        dropped_total,
        ref_ticks,
        ref_mono_ns,
    };
    sink.block.clear();
    encode_block(&header, records, &mut sink.block);
    sink.sequence += 1;
    if sink.error.is_some() {
        return;
    }
    match sink.file.write_all(&sink.block) {
        Ok(()) => {
            sink.written += records.len() as u64;
            sink.bytes += sink.block.len() as u64;
        }
        Err(e) => {
            tracing::warn!("trace file write failed; tracing continues without writing: {e}");
            sink.error = Some(e);
        }
    }
}
