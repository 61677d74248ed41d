//! The write-ahead log on disk: checksummed records in segment files, fsynced by a
//! group-commit thread, compacted at snapshots, and checked at start-up.
//!
//! ```text
//!  DIR/wal-00000000000000000001.log   records ...
//!  DIR/wal-00000000000000000002.log   Snapshot record, records ...   (a snapshot starts a
//!                                     new segment; older segments are deleted once it is
//!                                     fsynced)
//! ```
//! At start-up ([`recover`]) every segment is read in order. The first frame that is torn or
//! fails its crc32c ends what is trusted: the bytes from there on (and any later segment)
//! are refused, moved aside as `*.refused-OFFSET` for inspection, and the log is cut there.
//! [`Recovered::lost_tail`] tells the protocol, which then recovers what is missing from its
//! peers and counts itself out of quorums until it has (see `gup::Recovered`).

pub mod record;

use crate::gup::{Record, Recovered};
use record::{frame_record, read_frame};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

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

/// Reads the log in `dir` (creating the directory if needed), refusing a bad tail as
/// described in the module documentation.
pub fn recover(dir: &Path) -> io::Result<Recovery> {
    fs::create_dir_all(dir)?;
    let segs = segments(dir)?;
    let mut rec = Recovery { segments: segs.len(), ..Default::default() };
    let mut bad_from: Option<usize> = None;
    for (i, (_, path)) in segs.iter().enumerate() {
        let bytes = fs::read(path)?;
        let mut at = 0;
        while at < bytes.len() {
            match read_frame(&bytes[at..]) {
                Ok((record, used)) => {
                    rec.recovered.records.push(record);
                    at += used;
                }
                Err(error) => {
                    let refused = (bytes.len() - at) as u64;
                    let aside = path.with_extension(format!("log.refused-{at}"));
                    fs::write(&aside, &bytes[at..])?;
                    let f = OpenOptions::new().write(true).open(path)?;
                    f.set_len(at as u64)?;
                    f.sync_all()?;
                    rec.refused = Some(RefusedTail {
                        file: path.clone(),
                        offset: at as u64,
                        bytes: refused,
                        reason: error.to_string(),
                    });
                    bad_from = Some(i + 1);
                    break;
                }
            }
        }
        if bad_from.is_some() {
            break;
        }
    }
    if let Some(first_later) = bad_from {
        for (_, path) in &segs[first_later..] {
            let len = fs::metadata(path)?.len();
            fs::rename(path, path.with_extension("log.refused"))?;
            if let Some(r) = &mut rec.refused {
                r.bytes += len;
            }
        }
        let r = rec.refused.as_ref().expect("set with bad_from");
        tracing::warn!(
            file = %r.file.display(), offset = r.offset, bytes = r.bytes, reason = %r.reason,
            "write-ahead log: refused a bad tail; this node will recover the rest from its peers"
        );
        rec.recovered.lost_tail = true;
    }
    sync_dir(dir)?;
    Ok(rec)
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
    error: Option<String>,
}

impl Queue {
    /// Frames `record` after the records waiting (LSNs must come in order); the error of an
    /// earlier write instead, once the log failed.
    fn push(&mut self, lsn: u64, record: &Record) -> Result<(), WalError> {
        if let Some(e) = &self.error {
            return Err(WalError::Io(e.clone()));
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

/// Why the log writer failed (the node must stop: it can no longer make promises durable).
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An I/O error of the writer thread.
    #[error("write-ahead log failed: {0}")]
    Io(String),
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
}

impl Segments {
    fn open(dir: &Path) -> io::Result<Self> {
        let segs = segments(dir)?;
        let next = segs.last().map_or(1, |(n, _)| n + 1);
        // Always start a fresh segment: a refused tail never sits before new records.
        let path = dir.join(segment_name(next));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(dir)?;
        Ok(Self { dir: dir.to_path_buf(), segment: next, file })
    }

    /// Writes `bytes` and fsyncs them; a snapshot record at `rotate_at` starts a new segment.
    fn write(&mut self, bytes: &[u8], rotate_at: Option<usize>) -> io::Result<()> {
        match rotate_at {
            None => {
                self.file.write_all(bytes)?;
                self.file.sync_data()?;
            }
            Some(at) => {
                self.file.write_all(&bytes[..at])?;
                self.file.sync_data()?;
                self.segment += 1;
                let path = self.dir.join(segment_name(self.segment));
                self.file = OpenOptions::new().create(true).append(true).open(&path)?;
                self.file.write_all(&bytes[at..])?;
                self.file.sync_data()?;
                sync_dir(&self.dir)?;
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
                shared.state.lock().expect("wal lock").error = Some(e.to_string());
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
            return Err(WalError::Io(e.clone()));
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
                q.error = Some(e.to_string());
                Err(WalError::Io(e.to_string()))
            }
        }
    }
}
