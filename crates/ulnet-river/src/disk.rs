//! Asynchronous disk I/O: a [`DiskSource`] reads a byte range of a file ahead of its
//! consumer, a [`DiskSink`] writes behind its producer, each on a thread of its own with
//! buffers from a bounded [`MemPool`] (so read-ahead and write-behind are bounded by the
//! pool, and an empty pool is the back-pressure).
//!
//! ```
//! use std::sync::Arc;
//! use ulnet_river::{pump, DiskSink, DiskSource, MemPool};
//!
//! let dir = tempfile::tempdir()?;
//! let input = dir.path().join("in");
//! std::fs::write(&input, vec![7u8; 1000])?;
//! let pool = MemPool::sector_aligned(4, 300, 4)?; // 4 buffers of 300 bytes
//! let mut source = DiskSource::open(&input, 0..1000, 100, pool.clone(), None)?;
//! let out = Arc::new(std::fs::File::create(dir.path().join("out"))?);
//! let mut sink = DiskSink::new(out, 0, pool.clone(), 100);
//! assert_eq!(pump(&mut source, &mut sink)?, 1000);
//! assert_eq!(sink.bytes_written(), 1000);
//! assert_eq!(std::fs::read(dir.path().join("out"))?, vec![7u8; 1000]);
//! assert!(pool.all_returned());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::RiverError;
use crate::flow::{Sink, Source, SpaceSink};
use crate::pool::{Buffer, MemPool};
use crate::Doorbell;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a non-blocking look at a source found.
#[derive(Debug)]
pub enum Poll {
    /// A buffer.
    Ready(Buffer),
    /// Nothing yet; more will come.
    Pending,
    /// The source has run dry.
    Dry,
}

/// Reads `range` of a file (or ranges handed over one by one, [`DiskSource::fed`]) into
/// pool buffers in file order, each buffer holding whole records of `record_size` bytes:
/// ahead of its consumer on a thread of its own ([`DiskSource::open`]), or in the
/// consumer's thread when it asks ([`DiskSource::inline`]).
pub struct DiskSource {
    reader: Reader,
    dry: bool,
}

enum Reader {
    Ahead { rx: Receiver<Result<Buffer, RiverError>>, thread: Option<JoinHandle<()>>, abandoned: Arc<AtomicBool> },
    Inline(ReadRange),
}

/// What is left to read of a range, and into what.
struct ReadRange {
    file: File,
    name: String,
    at: u64,
    end: u64,
    /// The ranges to read after this one, as they are handed over ([`DiskSource::fed`]);
    /// none for a source of one range.
    next: Option<Receiver<Range<u64>>>,
    /// Read in the consumer's thread: the kernel is asked to read each range ahead.
    inline: bool,
    /// Set when the consumer is gone: a reader thread waiting for a range stops.
    abandoned: Arc<AtomicBool>,
    record_size: usize,
    pool: MemPool,
}

/// Whether a source fed its ranges has one to read now.
enum NextRange {
    /// It has (maybe the one it was reading).
    Ready,
    /// Not yet: more may be handed over.
    Waiting,
    /// No more: the sender is gone and every range read.
    Done,
}

impl ReadRange {
    /// Moves on to the next range handed over once this one is read, waiting for it if
    /// `wait`.
    fn next_range(&mut self, wait: bool) -> Result<NextRange, RiverError> {
        while self.at >= self.end {
            let Some(rx) = &self.next else { return Ok(NextRange::Done) };
            let range = if wait {
                loop {
                    match rx.recv_timeout(RANGE_WAIT_CHECK) {
                        Ok(r) => break r,
                        Err(RecvTimeoutError::Timeout) if !self.abandoned.load(Ordering::Acquire) => {}
                        Err(_) => return Ok(NextRange::Done),
                    }
                }
            } else {
                match rx.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Empty) => return Ok(NextRange::Waiting),
                    Err(TryRecvError::Disconnected) => return Ok(NextRange::Done),
                }
            };
            check_whole(range.clone(), self.record_size)?;
            advise(&self.file, range.clone(), self.inline);
            (self.at, self.end) = (range.start, range.end);
        }
        Ok(NextRange::Ready)
    }

    /// The next buffer of the ranges: waiting for a range and a free buffer if `wait`,
    /// else [`Poll::Pending`] while either is missing.
    fn next(&mut self, wait: bool) -> Result<Poll, RiverError> {
        match self.next_range(wait)? {
            NextRange::Ready => {}
            NextRange::Waiting => return Ok(Poll::Pending),
            NextRange::Done => return Ok(Poll::Dry),
        }
        let buf = match wait {
            true => self.pool.get(),
            false => {
                let Some(b) = self.pool.try_get() else { return Ok(Poll::Pending) };
                b
            }
        };
        self.read(buf).map_or(Ok(Poll::Dry), |read| read.map(Poll::Ready))
    }

    /// Reads the next buffer (`None` once the range is read).
    fn read(&mut self, mut buf: Buffer) -> Option<Result<Buffer, RiverError>> {
        if self.at >= self.end {
            return None;
        }
        let whole = buf.capacity() / self.record_size * self.record_size;
        let want = (whole as u64).min(self.end - self.at) as usize;
        Some(match self.file.read_exact_at(&mut buf.spare_mut()[..want], self.at) {
            Ok(()) => {
                buf.set_len(want);
                self.at += want as u64;
                Ok(buf)
            }
            Err(e) => Err(RiverError::io(format!("reading {} at byte {}", self.name, self.at), e)),
        })
    }
}

impl std::fmt::Debug for DiskSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inline = matches!(self.reader, Reader::Inline(_));
        f.debug_struct("DiskSource").field("inline", &inline).field("dry", &self.dry).finish()
    }
}

/// How often a reader thread waiting for its next range checks that its consumer is still
/// there: 50 ms, the longest a dropped source waits for its thread to end.
const RANGE_WAIT_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// A range must hold whole records.
fn check_whole(range: Range<u64>, record_size: usize) -> Result<(), RiverError> {
    let len = range.end.saturating_sub(range.start);
    if !len.is_multiple_of(record_size as u64) {
        return Err(RiverError::PartialRecord { len: len as usize, record_size });
    }
    Ok(())
}

/// Tells the kernel `range` is read sequentially, and, for a reader in its consumer's
/// thread (which reads a buffer only when asked), to read all of it ahead.
fn advise(file: &File, range: Range<u64>, inline: bool) {
    let len = range.end.saturating_sub(range.start);
    let _ = rustix::fs::fadvise(file, range.start, len, rustix::fs::Advice::Sequential);
    if inline {
        let _ = rustix::fs::fadvise(file, range.start, len, rustix::fs::Advice::WillNeed);
    }
}

impl DiskSource {
    fn range(
        path: &Path,
        range: Range<u64>,
        record_size: usize,
        pool: MemPool,
        inline: bool,
    ) -> Result<ReadRange, RiverError> {
        let file = File::open(path).map_err(|e| RiverError::io(format!("opening {}", path.display()), e))?;
        check_whole(range.clone(), record_size)?;
        assert!(pool.buffer_size() >= record_size, "pool buffers must hold at least one record");
        advise(&file, range.clone(), inline);
        let name = path.display().to_string();
        let abandoned = Arc::new(AtomicBool::new(false));
        Ok(ReadRange { file, name, at: range.start, end: range.end, next: None, inline, abandoned, record_size, pool })
    }

    /// Starts reading `range` of `path` ahead, on a thread. The range must hold whole
    /// records, and the pool's buffers must hold at least one. `doorbell`, when given, is
    /// rung after each buffer so a consumer can sleep on it together with its network
    /// endpoint.
    pub fn open(
        path: &Path,
        range: Range<u64>,
        record_size: usize,
        pool: MemPool,
        doorbell: Option<Doorbell>,
    ) -> Result<Self, RiverError> {
        let r = Self::range(path, range, record_size, pool, false)?;
        Self::ahead(r, doorbell)
    }

    fn ahead(r: ReadRange, doorbell: Option<Doorbell>) -> Result<Self, RiverError> {
        let (tx, rx) = mpsc::sync_channel(r.pool.count());
        let abandoned = r.abandoned.clone();
        let thread = std::thread::Builder::new()
            .name("river-disk-read".into())
            .spawn(move || read_loop(r, tx, doorbell))
            .map_err(|e| RiverError::io("starting the disk reader thread", e))?;
        Ok(DiskSource { reader: Reader::Ahead { rx, thread: Some(thread), abandoned }, dry: false })
    }

    /// Reads the ranges of `path` sent on the returned sender, one after another in the
    /// order sent (each buffer within one range), ahead on a thread (`ahead`) or in the
    /// caller's thread; it runs dry once the sender is dropped and every range sent is
    /// read. For input shared out a piece at a time as readers ask for more.
    pub fn fed(
        path: &Path,
        record_size: usize,
        pool: MemPool,
        ahead: bool,
        doorbell: Option<Doorbell>,
    ) -> Result<(Self, mpsc::Sender<Range<u64>>), RiverError> {
        let mut r = Self::range(path, 0..0, record_size, pool, !ahead)?;
        let (feed, ranges) = mpsc::channel();
        r.next = Some(ranges);
        let source =
            if ahead { Self::ahead(r, doorbell)? } else { DiskSource { reader: Reader::Inline(r), dry: false } };
        Ok((source, feed))
    }

    /// Reads `range` of `path` in the caller's thread, a buffer each time one is asked for
    /// (never [`Poll::Pending`] while the caller hands buffers back). The kernel is asked to
    /// read the whole range ahead, so a cold file still streams. For a node with no core
    /// to spare for a reader thread.
    pub fn inline(path: &Path, range: Range<u64>, record_size: usize, pool: MemPool) -> Result<Self, RiverError> {
        let r = Self::range(path, range, record_size, pool, true)?;
        Ok(DiskSource { reader: Reader::Inline(r), dry: false })
    }

    /// A buffer if one is ready, without waiting.
    pub fn try_next(&mut self) -> Result<Poll, RiverError> {
        if self.dry {
            return Ok(Poll::Dry);
        }
        match &mut self.reader {
            Reader::Ahead { rx, .. } => match rx.try_recv() {
                Ok(Ok(b)) => Ok(Poll::Ready(b)),
                Ok(Err(e)) => {
                    self.finish();
                    Err(e)
                }
                Err(TryRecvError::Empty) => Ok(Poll::Pending),
                Err(TryRecvError::Disconnected) => {
                    self.finish();
                    Ok(Poll::Dry)
                }
            },
            Reader::Inline(r) => {
                let polled = r.next(false);
                if !matches!(polled, Ok(Poll::Ready(_) | Poll::Pending)) {
                    self.finish();
                }
                polled
            }
        }
    }

    /// Whether everything has been delivered.
    pub fn is_dry(&self) -> bool {
        self.dry
    }

    fn finish(&mut self) {
        self.dry = true;
        if let Reader::Ahead { thread, .. } = &mut self.reader {
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn read_loop(mut r: ReadRange, tx: SyncSender<Result<Buffer, RiverError>>, doorbell: Option<Doorbell>) {
    loop {
        let item = match r.next(true) {
            Ok(Poll::Ready(b)) => Ok(b),
            Ok(Poll::Pending | Poll::Dry) => break,
            Err(e) => Err(e),
        };
        let failed = item.is_err();
        if tx.send(item).is_err() || failed {
            break;
        }
        if let Some(d) = &doorbell {
            d.ring();
        }
    }
    drop(tx);
    if let Some(d) = &doorbell {
        d.ring();
    }
}

impl Source for DiskSource {
    fn next_buffer(&mut self) -> Result<Option<Buffer>, RiverError> {
        if self.dry {
            return Ok(None);
        }
        let item = match &mut self.reader {
            Reader::Ahead { rx, .. } => rx.recv().ok(),
            Reader::Inline(r) => match r.next(true) {
                Ok(Poll::Ready(b)) => Some(Ok(b)),
                Ok(Poll::Pending | Poll::Dry) => None,
                Err(e) => Some(Err(e)),
            },
        };
        match item {
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(e)) => {
                self.finish();
                Err(e)
            }
            None => {
                self.finish();
                Ok(None)
            }
        }
    }
}

impl Drop for DiskSource {
    fn drop(&mut self) {
        // Unblock a reader thread (its sends fail once the receiver is gone; waiting for a
        // range, it sees the flag), then join it.
        if let Reader::Ahead { rx, abandoned, .. } = &mut self.reader {
            abandoned.store(true, Ordering::Release);
            drop(std::mem::replace(rx, mpsc::sync_channel(0).1));
        }
        self.finish();
    }
}

/// Writes buffers to a file sequentially from a byte offset on: behind its producer on a
/// thread of its own ([`DiskSink::new`]), or in the producer's thread as each buffer is
/// handed over ([`DiskSink::inline`]). Records given one by one are staged in pool
/// buffers first.
pub struct DiskSink {
    writer: Writer,
    pool: MemPool,
    staged: Option<Buffer>,
    record_size: usize,
    queued: u64,
    written: u64,
}

enum Writer {
    Behind { tx: Option<SyncSender<Buffer>>, thread: Option<JoinHandle<Result<u64, RiverError>>> },
    Inline { file: Arc<File>, offset: u64, at: u64 },
}

impl std::fmt::Debug for DiskSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskSink").field("queued", &self.queued).field("written", &self.written).finish()
    }
}

impl DiskSink {
    /// Writes to `file` from byte `offset` on, on a thread; `pool` bounds the buffers in
    /// flight and stages records given one by one.
    pub fn new(file: Arc<File>, offset: u64, pool: MemPool, record_size: usize) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Buffer>(pool.count());
        let thread = std::thread::Builder::new()
            .name("river-disk-write".into())
            .spawn(move || {
                let mut at = offset;
                let mut failure = None;
                for buf in rx {
                    if failure.is_none() {
                        if let Err(e) = file.write_all_at(buf.as_slice(), at) {
                            failure = Some(RiverError::io(format!("writing at byte {at}"), e));
                        }
                    }
                    at += buf.len() as u64;
                }
                match failure {
                    Some(e) => Err(e),
                    None => Ok(at - offset),
                }
            })
            .expect("spawn the disk writer thread");
        let writer = Writer::Behind { tx: Some(tx), thread: Some(thread) };
        DiskSink { writer, pool, staged: None, record_size, queued: 0, written: 0 }
    }

    /// Writes to `file` from byte `offset` on, in the caller's thread, each buffer as it
    /// is handed over: for a writer with no core to spare for a thread (writing into the
    /// page cache is a copy, which a thread would only move elsewhere).
    pub fn inline(file: Arc<File>, offset: u64, pool: MemPool, record_size: usize) -> Self {
        let writer = Writer::Inline { file, offset, at: offset };
        DiskSink { writer, pool, staged: None, record_size, queued: 0, written: 0 }
    }

    /// A buffer from this sink's pool to fill and hand back with [`Sink::sink_buffer`]
    /// (waits when all are being written: write-behind is bounded by the pool).
    pub fn buffer(&self) -> Buffer {
        self.pool.get()
    }

    /// Bytes handed to the writer so far.
    pub fn bytes_queued(&self) -> u64 {
        self.queued
    }

    /// Bytes written (known once closed).
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    fn send(&mut self, buffer: Buffer) -> Result<(), RiverError> {
        self.queued += buffer.len() as u64;
        match &mut self.writer {
            Writer::Behind { tx, .. } => {
                let tx = tx.as_ref().ok_or(RiverError::Closed)?;
                if tx.send(buffer).is_err() {
                    // The writer only stops early by panicking; its join reports it.
                    return self.join().map(|_| ());
                }
                Ok(())
            }
            Writer::Inline { file, at, .. } => {
                file.write_all_at(buffer.as_slice(), *at)
                    .map_err(|e| RiverError::io(format!("writing at byte {at}"), e))?;
                *at += buffer.len() as u64;
                Ok(())
            }
        }
    }

    fn join(&mut self) -> Result<u64, RiverError> {
        match &mut self.writer {
            Writer::Behind { tx, thread } => {
                *tx = None;
                if let Some(t) = thread.take() {
                    self.written =
                        t.join().map_err(|_| RiverError::io("disk writer", std::io::Error::other("panicked")))??;
                }
            }
            Writer::Inline { offset, at, .. } => self.written = *at - *offset,
        }
        Ok(self.written)
    }
}

impl Sink for DiskSink {
    fn sink_records(&mut self, mut records: &[u8]) -> Result<(), RiverError> {
        if !records.len().is_multiple_of(self.record_size) {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: self.record_size });
        }
        while !records.is_empty() {
            let staged = match &mut self.staged {
                Some(b) => b,
                None => self.staged.insert(self.pool.get()),
            };
            let room = staged.remaining() / self.record_size * self.record_size;
            let take = room.min(records.len());
            staged.extend_from_slice(&records[..take]);
            records = &records[take..];
            if staged.remaining() < self.record_size {
                let full = self.staged.take().expect("staged above");
                self.send(full)?;
            }
        }
        Ok(())
    }

    fn sink_buffer(&mut self, buffer: Buffer) -> Result<(), RiverError> {
        if let Some(staged) = self.staged.take() {
            if !staged.is_empty() {
                self.send(staged)?;
            }
        }
        if buffer.is_empty() {
            return Ok(());
        }
        self.send(buffer)
    }

    fn close(&mut self) -> Result<(), RiverError> {
        if let Some(staged) = self.staged.take() {
            if !staged.is_empty() {
                self.send(staged)?;
            }
        }
        self.join().map(|_| ())
    }
}

impl SpaceSink for DiskSink {
    fn space(&mut self) -> Result<&mut [u8], RiverError> {
        let rs = self.record_size;
        if self.staged.is_none() {
            self.staged = Some(self.pool.get());
        }
        let staged = self.staged.as_mut().expect("made above");
        let room = staged.remaining() / rs * rs;
        Ok(&mut staged.spare_mut()[..room])
    }

    fn commit(&mut self, bytes: usize) -> Result<(), RiverError> {
        let staged = self.staged.as_mut().expect("space was lent");
        staged.set_len(staged.len() + bytes);
        if staged.remaining() < self.record_size {
            let full = self.staged.take().expect("checked above");
            self.send(full)?;
        }
        Ok(())
    }
}

impl Drop for DiskSink {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_reads_whole_records_of_a_range() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let pool = MemPool::heap(2, 250);
        let bell = Doorbell::new().unwrap();
        let mut s = DiskSource::open(&p, 100..900, 100, pool.clone(), Some(bell.clone())).unwrap();
        let mut got = Vec::new();
        loop {
            match s.try_next().unwrap() {
                Poll::Ready(b) => {
                    assert_eq!(b.len() % 100, 0);
                    got.extend_from_slice(b.as_slice())
                }
                Poll::Pending => bell.wait(Some(std::time::Duration::from_millis(100))),
                Poll::Dry => break,
            }
        }
        assert_eq!(got, &data[100..900]);
        assert!(pool.all_returned());
        assert!(DiskSource::open(&p, 0..150, 100, pool, None).is_err());
    }

    #[test]
    fn a_fed_source_reads_its_ranges_in_the_order_sent_and_ends_when_the_feed_does() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..2000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for ahead in [true, false] {
            let pool = MemPool::heap(2, 300);
            let bell = Doorbell::new().unwrap();
            let (mut s, feed) = DiskSource::fed(&p, 100, pool.clone(), ahead, Some(bell.clone())).unwrap();
            let ranges = [1200..1700, 0..100, 500..1200];
            let mut want = Vec::new();
            let mut got = Vec::new();
            let mut feed = Some(feed);
            let mut to_send = ranges.iter();
            loop {
                // One range at a time, the next once the last is delivered: the source
                // waits (Pending) in between, and ends only when the feed is dropped.
                if got.len() == want.len() {
                    match to_send.next() {
                        Some(r) => {
                            want.extend_from_slice(&data[r.start as usize..r.end as usize]);
                            feed.as_ref().unwrap().send(r.clone()).unwrap();
                        }
                        None => feed = None,
                    }
                }
                match s.try_next().unwrap() {
                    Poll::Ready(b) => {
                        assert!(b.len() <= 300 && b.len() % 100 == 0);
                        got.extend_from_slice(b.as_slice());
                    }
                    Poll::Pending => bell.wait(Some(std::time::Duration::from_millis(10))),
                    Poll::Dry => break,
                }
            }
            assert!(feed.is_none(), "dry only after the feed is dropped");
            assert_eq!(got, want, "ahead: {ahead}");
            assert!(pool.all_returned());
        }
    }

    #[test]
    fn a_fed_source_dropped_while_its_reader_waits_for_a_range_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [1u8; 300]).unwrap();
        let (s, feed) = DiskSource::fed(&p, 100, MemPool::heap(2, 100), true, None).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // The feed is still there: dropping the source must not wait for it.
        drop(s);
        drop(feed);
    }

    #[test]
    fn source_reports_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [0u8; 100]).unwrap();
        let mut s = DiskSource::open(&p, 0..300, 100, MemPool::heap(1, 400), None).unwrap();
        assert!(matches!(s.next_buffer(), Err(RiverError::Io { .. })));
    }

    #[test]
    fn sink_stages_records_and_writes_at_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = Arc::new(File::create(&p).unwrap());
        f.set_len(50).unwrap();
        let pool = MemPool::heap(2, 30);
        let mut sink = DiskSink::new(f, 50, pool.clone(), 10);
        for i in 0..7u8 {
            sink.sink_records(&[i; 10]).unwrap();
        }
        let mut b = sink.buffer();
        b.extend_from_slice(&[9; 20]);
        sink.sink_buffer(b).unwrap();
        assert!(sink.sink_records(&[1; 5]).is_err());
        sink.close().unwrap();
        assert_eq!(sink.bytes_written(), 90);
        let out = std::fs::read(&p).unwrap();
        assert_eq!(out.len(), 140);
        assert_eq!(&out[50..60], &[0; 10]);
        assert_eq!(&out[110..120], &[6; 10]);
        assert_eq!(&out[120..], &[9; 20]);
        assert!(pool.all_returned());
    }
}
