//! The write-ahead log on disk: checksummed records in segment files, fsynced by a
//! group-commit thread, compacted at snapshots, and checked at start-up.
//!
//! ```text
//!  DIR/wal-00000000000000000001.log   records ...
//!  DIR/wal-00000000000000000002.log   Snapshot record, records ...   (a snapshot starts a
//!                                     new segment; older segments are deleted once it is
//!                                     fsynced)
//! ```
//! At start-up ([`scan`], then [`Scan::cut`]; [`recover`] does both) every segment is read
//! in order. The first frame that is torn or fails its crc32c ends what is trusted; the
//! bytes from there on are moved aside as `*.refused-OFFSET` for inspection (when the disk
//! has room for them), any later segment is renamed `*.log.refused`, and the log is cut
//! there. What ended it is classified ([`tail`]): a *torn* tail, the remains of a write
//! whose fsync never returned, held nothing anyone relied on and the node goes on as
//! itself; *corruption* may have hit what was fsynced and acted on, and
//! [`Recovered::lost_tail`] tells the protocol, whose node then comes back under a new
//! identity and recovers what is missing from its peers (see `gup::Recovered`). Every
//! trusted segment is fsynced before its records are handed out: a process killed between
//! a write and its fsync leaves records in the page cache that were never made durable.
//!
//! A writer that fails (no space, a quota, an I/O error) tells where its fsynced bytes end
//! ([`InlineWal::durable_mark`]); [`cut_to_durable`] removes what lies beyond, which was
//! never acted on, before the log is read again. Reading it back instead could hand out
//! records whose fsync failed: after a failed writeback the page cache may still show them
//! while the disk does not hold them.

pub mod record;
pub mod tail;

use crate::gup::{Record, Recovered};
use record::{frame_record, read_frame};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
pub use tail::TailKind;

/// What start-up found in the log directory.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// The trusted records, for `Gup::recover`.
    pub recovered: Recovered,
    /// Segments read.
    pub segments: usize,
    /// The bad tail, if one was refused: file, offset, bytes refused and why.
    pub refused: Option<RefusedTail>,
}

/// A refused log tail.
#[derive(Debug, Clone)]
pub struct RefusedTail {
    /// The segment where the bad frame was.
    pub file: PathBuf,
    /// Its offset.
    pub offset: u64,
    /// Bytes refused (including later segments).
    pub bytes: u64,
    /// What was wrong.
    pub reason: String,
    /// A torn write (cut, the node keeps its identity) or corruption.
    pub kind: TailKind,
}

fn segment_name(n: u64) -> String {
    format!("wal-{n:020}.log")
}

fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name.strip_prefix("wal-").and_then(|r| r.strip_suffix(".log")).and_then(|n| n.parse().ok()) {
            out.push((n, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The log as [`scan`] read it, before anything on disk changed.
#[derive(Debug)]
pub struct Scan {
    dir: PathBuf,
    segments: Vec<PathBuf>,
    records: Vec<Record>,
    bad: Option<BadTail>,
}

/// Where the trusted records end, and the bytes after it in that segment.
#[derive(Debug)]
struct BadTail {
    segment: usize,
    rest: Vec<u8>,
    refused: RefusedTail,
}

/// Reads the log in `dir` (creating the directory if needed) without changing it: the
/// records up to the first frame that does not read, and what ends them (see the module
/// documentation). [`Scan::cut`] makes the log what it found.
pub fn scan(dir: &Path) -> io::Result<Scan> {
    fs::create_dir_all(dir)?;
    let segs: Vec<PathBuf> = segments(dir)?.into_iter().map(|(_, p)| p).collect();
    let mut out = Scan { dir: dir.to_path_buf(), segments: segs.clone(), records: Vec::new(), bad: None };
    for (i, path) in segs.iter().enumerate() {
        let mut bytes = fs::read(path)?;
        let segment = read_segment(&bytes, i + 1 == segs.len());
        out.records.extend(segment.records);
        if let Some(end) = segment.end {
            let rest = bytes.split_off(end.offset);
            let mut bytes_refused = rest.len() as u64;
            for later in &segs[i + 1..] {
                bytes_refused += fs::metadata(later)?.len();
            }
            let refused = RefusedTail {
                file: path.clone(),
                offset: end.offset as u64,
                bytes: bytes_refused,
                reason: end.error.to_string(),
                kind: end.kind,
            };
            out.bad = Some(BadTail { segment: i, rest, refused });
            return Ok(out);
        }
    }
    Ok(out)
}

/// The records of one segment file's bytes, and what ends them early.
#[derive(Debug)]
pub struct Segment {
    /// The records up to the first frame that does not read.
    pub records: Vec<Record>,
    /// That frame, if there is one.
    pub end: Option<SegmentEnd>,
}

/// The first frame of a segment that does not read.
#[derive(Debug)]
pub struct SegmentEnd {
    /// Its offset in the segment.
    pub offset: usize,
    /// Why it does not read.
    pub error: record::FrameError,
    /// A torn write or corruption (see [`tail`]).
    pub kind: TailKind,
}

/// Reads the frames of one segment's `bytes` (`last_segment`: no segment file follows it)
/// as [`scan`] reads each file: for hosts that keep a log's bytes elsewhere (the simulator).
pub fn read_segment(bytes: &[u8], last_segment: bool) -> Segment {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match read_frame(&bytes[at..]) {
            Ok((record, used)) => {
                records.push(record);
                at += used;
            }
            Err(error) => {
                let kind = tail::classify(&bytes[at..], at as u64, last_segment);
                return Segment { records, end: Some(SegmentEnd { offset: at, error, kind }) };
            }
        }
    }
    Segment { records, end: None }
}

impl Scan {
    /// The bad tail found, if any.
    pub fn refused(&self) -> Option<&RefusedTail> {
        self.bad.as_ref().map(|b| &b.refused)
    }

    /// Cuts the log where its trusted records end (a copy of the refused bytes kept beside
    /// it when the disk has room), fsyncs every trusted segment and the directory, and
    /// hands out the records.
    pub fn cut(self) -> io::Result<Recovery> {
        let trusted = self.bad.as_ref().map_or(self.segments.len(), |b| b.segment);
        let mut refused = None;
        if let Some(bad) = self.bad {
            let path = &self.segments[bad.segment];
            let r = &bad.refused;
            let aside = path.with_extension(format!("log.refused-{}", r.offset));
            if let Err(e) = fs::write(&aside, &bad.rest) {
                let _ = fs::remove_file(&aside);
                tracing::warn!(file = %aside.display(), "write-ahead log: no copy of the refused bytes kept: {e}");
            }
            let f = OpenOptions::new().write(true).open(path)?;
            f.set_len(r.offset)?;
            f.sync_all()?;
            for later in &self.segments[bad.segment + 1..] {
                fs::rename(later, later.with_extension("log.refused"))?;
            }
            match r.kind {
                TailKind::Torn => tracing::warn!(
                    file = %r.file.display(), offset = r.offset, bytes = r.bytes, reason = %r.reason,
                    "write-ahead log: cut a torn tail (a write whose fsync never returned: nothing in it was acted on)"
                ),
                TailKind::Corrupt => tracing::warn!(
                    file = %r.file.display(), offset = r.offset, bytes = r.bytes, reason = %r.reason,
                    "write-ahead log: refused a corrupted tail; this node will recover the rest from its peers"
                ),
            }
            refused = Some(bad.refused);
        }
        for path in &self.segments[..trusted] {
            File::open(path)?.sync_all()?;
        }
        sync_dir(&self.dir)?;
        let lost_tail = refused.as_ref().is_some_and(|r: &RefusedTail| r.kind == TailKind::Corrupt);
        Ok(Recovery {
            recovered: Recovered { records: self.records, lost_tail },
            segments: self.segments.len(),
            refused,
        })
    }
}

/// Reads the log in `dir` and cuts it where its trusted records end ([`scan`], then
/// [`Scan::cut`]).
pub fn recover(dir: &Path) -> io::Result<Recovery> {
    scan(dir)?.cut()
}

/// Where a writer's fsynced bytes end: in segment `segment`, after `len` bytes. Everything
/// before was fsynced; nothing after it was acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurableMark {
    segment: u64,
    len: u64,
}

/// Removes from the log in `dir` what lies beyond `mark` (bytes a failed write or fsync
/// left, segments a failed rotation began), and fsyncs the cut.
pub fn cut_to_durable(dir: &Path, mark: DurableMark) -> io::Result<()> {
    for (n, path) in segments(dir)? {
        if n > mark.segment {
            fs::remove_file(path)?;
        }
    }
    let path = dir.join(segment_name(mark.segment));
    if fs::metadata(&path)?.len() > mark.len {
        let f = OpenOptions::new().write(true).open(&path)?;
        f.set_len(mark.len)?;
        f.sync_all()?;
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

struct Shared {
    state: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    /// Framed records waiting to be written, with the LSN of the last one.
    bytes: Vec<u8>,
    last_lsn: u64,
    /// A snapshot in the queue starts a new segment: offset in `bytes` where it begins.
    rotate_at: Option<usize>,
    closing: bool,
    error: Option<WalError>,
}

impl Queue {
    /// Frames `record` after the records waiting (LSNs must come in order); the error of an
    /// earlier write instead, once the log failed.
    fn push(&mut self, lsn: u64, record: &Record) -> Result<(), WalError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        debug_assert!(lsn > self.last_lsn || self.last_lsn == 0, "LSNs in order");
        if matches!(record, Record::Snapshot { .. }) {
            self.rotate_at = Some(self.bytes.len());
        }
        frame_record(record, &mut self.bytes);
        self.last_lsn = lsn;
        Ok(())
    }
}

/// The log writer: [`Wal::append`] queues records; a thread writes everything queued,
/// fsyncs once for all of it (group commit), and reports the durable LSN on the channel
/// given by [`Wal::open`]. A snapshot record starts a new segment and removes the old ones.
pub struct Wal {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Why the log writer failed: the node can no longer make what it promises durable, so it
/// must stop taking part until the disk takes writes again (then cut the log to its
/// [`DurableMark`] and read it again, as a restart would).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// The filesystem is full (ENOSPC): free space on it.
    #[error("no space left on {}", dir.display())]
    NoSpace {
        /// The log's directory.
        dir: PathBuf,
    },
    /// The user's disk quota is used up (EDQUOT): raise it or free space.
    #[error("disk quota exceeded on {}", dir.display())]
    Quota {
        /// The log's directory.
        dir: PathBuf,
    },
    /// Any other write, fsync or file error (EIO, a read-only filesystem...): check the disk.
    #[error("I/O error on {}: {message}", dir.display())]
    Io {
        /// The log's directory.
        dir: PathBuf,
        /// The system's description.
        message: String,
    },
}

impl WalError {
    /// The error `e` of an operation on the log in `dir`.
    pub fn from_io(dir: &Path, e: &io::Error) -> Self {
        let dir = dir.to_path_buf();
        match e.kind() {
            io::ErrorKind::StorageFull => WalError::NoSpace { dir },
            io::ErrorKind::QuotaExceeded => WalError::Quota { dir },
            _ => WalError::Io { dir, message: e.to_string() },
        }
    }
}

impl Wal {
    /// Opens the log in `dir` for appending (after [`recover`]); durable LSNs are sent on
    /// the returned receiver. LSNs are those of `Event::Persist` (counted from 1 in this
    /// incarnation).
    pub fn open(dir: &Path) -> io::Result<(Wal, Receiver<u64>)> {
        Self::open_notify(dir, Box::new(|| {}))
    }

    /// [`Wal::open`], calling `notify` (from the writer thread) after each durable LSN is
    /// sent, to wake the thread that drives the protocol.
    pub fn open_notify(dir: &Path, notify: Box<dyn Fn() + Send>) -> io::Result<(Wal, Receiver<u64>)> {
        let out = Segments::open(dir)?;
        let shared = Arc::new(Shared { state: Mutex::new(Queue::default()), wake: Condvar::new() });
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("ulnet-wal".into()).spawn(move || writer(s, out, tx, notify))?;
        Ok((Wal { shared, thread: Some(thread) }, rx))
    }

    /// Queues `record` with its LSN (LSNs must come in order).
    pub fn append(&self, lsn: u64, record: &Record) -> Result<(), WalError> {
        self.shared.state.lock().expect("wal lock").push(lsn, record)?;
        self.shared.wake.notify_one();
        Ok(())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.shared.state.lock().expect("wal lock").closing = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The segment files being written: appends, and the rotation at a snapshot record (which
/// starts a new segment and deletes the older ones once it is fsynced).
struct Segments {
    dir: PathBuf,
    segment: u64,
    file: File,
    /// Where the fsynced bytes end (moves only once an fsync returned).
    durable: DurableMark,
}

impl Segments {
    fn open(dir: &Path) -> io::Result<Self> {
        let segs = segments(dir)?;
        let next = segs.last().map_or(1, |(n, _)| n + 1);
        // Always start a fresh segment: a refused tail never sits before new records.
        let path = dir.join(segment_name(next));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(dir)?;
        Ok(Self { dir: dir.to_path_buf(), segment: next, file, durable: DurableMark { segment: next, len: 0 } })
    }

    /// Writes `bytes` and fsyncs them; a snapshot record at `rotate_at` starts a new segment.
    fn write(&mut self, bytes: &[u8], rotate_at: Option<usize>) -> io::Result<()> {
        match rotate_at {
            None => self.append_durably(bytes)?,
            Some(at) => {
                self.append_durably(&bytes[..at])?;
                self.segment += 1;
                let path = self.dir.join(segment_name(self.segment));
                self.file = OpenOptions::new().create(true).append(true).open(&path)?;
                self.file.write_all(&bytes[at..])?;
                self.file.sync_data()?;
                sync_dir(&self.dir)?;
                self.durable = DurableMark { segment: self.segment, len: (bytes.len() - at) as u64 };
                for (n, old) in segments(&self.dir)? {
                    if n < self.segment {
                        fs::remove_file(old)?;
                    }
                }
                sync_dir(&self.dir)?;
            }
        }
        Ok(())
    }

    /// Appends `bytes` to the current segment and fsyncs them.
    fn append_durably(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.file.sync_data()?;
        debug_assert_eq!(self.durable.segment, self.segment, "the durable mark is in the segment written");
        self.durable.len += bytes.len() as u64;
        Ok(())
    }
}

fn writer(shared: Arc<Shared>, mut out: Segments, durable: Sender<u64>, notify: Box<dyn Fn() + Send>) {
    loop {
        let (bytes, lsn, rotate_at) = {
            let mut q = shared.state.lock().expect("wal lock");
            while q.bytes.is_empty() && !q.closing {
                q = shared.wake.wait(q).expect("wal lock");
            }
            if q.bytes.is_empty() && q.closing {
                return;
            }
            (std::mem::take(&mut q.bytes), q.last_lsn, q.rotate_at.take())
        };
        match out.write(&bytes, rotate_at) {
            Ok(()) => {
                if durable.send(lsn).is_err() {
                    return;
                }
                notify();
            }
            Err(e) => {
                tracing::error!(error = %e, "write-ahead log: write or fsync failed");
                shared.state.lock().expect("wal lock").error = Some(WalError::from_io(&out.dir, &e));
                return;
            }
        }
    }
}

/// The log written by the thread that drives the protocol, with no writer thread:
/// [`InlineWal::append`] buffers records, [`InlineWal::sync`] writes and fsyncs everything
/// buffered (group commit) and returns the durable LSN. A host that fsyncs once per batch of
/// input, after sending what the batch produced, saves the two thread switches per batch that
/// [`Wal`] costs — which matters when many nodes share a few cores.
pub struct InlineWal {
    out: Segments,
    queue: Queue,
    /// A buffered record needs the next fsync: anything but a [`Record::Commit`] hint,
    /// which waits for the next record that does (see [`InlineWal::pending`]).
    must_sync: bool,
}

impl InlineWal {
    /// Opens the log in `dir` for appending (after [`recover`]).
    pub fn open(dir: &Path) -> io::Result<InlineWal> {
        Ok(InlineWal { out: Segments::open(dir)?, queue: Queue::default(), must_sync: false })
    }

    /// Buffers `record` with its LSN (LSNs must come in order).
    pub fn append(&mut self, lsn: u64, record: &Record) -> Result<(), WalError> {
        self.queue.push(lsn, record)?;
        self.must_sync |= !matches!(record, Record::Commit { .. });
        Ok(())
    }

    /// Whether records wait for [`InlineWal::sync`]. Commit records alone do not count:
    /// they are restart hints that may lag, so they ride on the next record's fsync
    /// instead of costing one of their own (a member applies a commit it learnt from a
    /// message, with nothing else to write, after almost every position: at 32 nodes
    /// that was a second fsync per position on every sender). A hint lost with the
    /// buffer only makes a restarted node learn the committed position from its peers.
    pub fn pending(&self) -> bool {
        self.must_sync
    }

    /// Writes and fsyncs every buffered record; returns the LSN durable now (None when
    /// nothing was buffered). After an error every call fails: the node must stop.
    pub fn sync(&mut self) -> Result<Option<u64>, WalError> {
        let q = &mut self.queue;
        if let Some(e) = &q.error {
            return Err(e.clone());
        }
        if q.bytes.is_empty() {
            return Ok(None);
        }
        let rotate_at = q.rotate_at.take();
        let result = self.out.write(&q.bytes, rotate_at);
        q.bytes.clear();
        self.must_sync = false;
        match result {
            Ok(()) => Ok(Some(q.last_lsn)),
            Err(e) => {
                tracing::error!(error = %e, "write-ahead log: write or fsync failed");
                let error = WalError::from_io(&self.out.dir, &e);
                q.error = Some(error.clone());
                Err(error)
            }
        }
    }

    /// Where the fsynced bytes end: after a failure, [`cut_to_durable`] removes what lies
    /// beyond (records whose write or fsync failed, which nothing was told about).
    pub fn durable_mark(&self) -> DurableMark {
        self.out.durable
    }
}
