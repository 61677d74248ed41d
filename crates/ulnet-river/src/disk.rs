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
use crate::flow::{Sink, Source};
use crate::pool::{Buffer, MemPool};
use crate::Doorbell;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
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

/// Reads `range` of a file into pool buffers on its own thread, in file order, each
/// buffer holding whole records of `record_size` bytes.
pub struct DiskSource {
    rx: Receiver<Result<Buffer, RiverError>>,
    thread: Option<JoinHandle<()>>,
    dry: bool,
}

impl std::fmt::Debug for DiskSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskSource").field("dry", &self.dry).finish()
    }
}

impl DiskSource {
    /// Starts reading `range` of `path`. The range must hold whole records, and the pool's
    /// buffers must hold at least one. `doorbell`, when given, is rung after each buffer so
    /// a consumer can sleep on it together with its network endpoint.
    pub fn open(
        path: &Path,
        range: Range<u64>,
        record_size: usize,
        pool: MemPool,
        doorbell: Option<Doorbell>,
    ) -> Result<Self, RiverError> {
        let file = File::open(path).map_err(|e| RiverError::io(format!("opening {}", path.display()), e))?;
        let len = range.end.saturating_sub(range.start);
        if len % record_size as u64 != 0 {
            return Err(RiverError::PartialRecord { len: len as usize, record_size });
        }
        assert!(pool.buffer_size() >= record_size, "pool buffers must hold at least one record");
        let _ = rustix::fs::fadvise(&file, range.start, len, rustix::fs::Advice::Sequential);
        let (tx, rx) = mpsc::sync_channel(pool.count());
        let name = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("river-disk-read".into())
            .spawn(move || read_loop(file, name, range, record_size, pool, tx, doorbell))
            .map_err(|e| RiverError::io("starting the disk reader thread", e))?;
        Ok(DiskSource { rx, thread: Some(thread), dry: false })
    }

    /// A buffer if one is ready, without waiting.
    pub fn try_next(&mut self) -> Result<Poll, RiverError> {
        if self.dry {
            return Ok(Poll::Dry);
        }
        match self.rx.try_recv() {
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
        }
    }

    /// Whether everything has been delivered.
    pub fn is_dry(&self) -> bool {
        self.dry
    }

    fn finish(&mut self) {
        self.dry = true;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_loop(
    file: File,
    name: String,
    range: Range<u64>,
    record_size: usize,
    pool: MemPool,
    tx: SyncSender<Result<Buffer, RiverError>>,
    doorbell: Option<Doorbell>,
) {
    let mut at = range.start;
    while at < range.end {
        let mut buf = pool.get();
        let whole = buf.capacity() / record_size * record_size;
        let want = (whole as u64).min(range.end - at) as usize;
        let result = file.read_exact_at(&mut buf.spare_mut()[..want], at);
        let item = match result {
            Ok(()) => {
                buf.set_len(want);
                at += want as u64;
                Ok(buf)
            }
            Err(e) => Err(RiverError::io(format!("reading {name} at byte {at}"), e)),
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
        match self.rx.recv() {
            Ok(Ok(b)) => Ok(Some(b)),
            Ok(Err(e)) => {
                self.finish();
                Err(e)
            }
            Err(_) => {
                self.finish();
                Ok(None)
            }
        }
    }
}

impl Drop for DiskSource {
    fn drop(&mut self) {
        // Unblock the reader (its sends fail once the receiver is gone), then join it.
        let rx = std::mem::replace(&mut self.rx, mpsc::sync_channel(0).1);
        drop(rx);
        self.finish();
    }
}

/// Writes buffers to a file from a byte offset on, sequentially, on its own thread.
/// Records given one by one are staged in pool buffers first.
pub struct DiskSink {
    tx: Option<SyncSender<Buffer>>,
    thread: Option<JoinHandle<Result<u64, RiverError>>>,
    pool: MemPool,
    staged: Option<Buffer>,
    record_size: usize,
    queued: u64,
    written: u64,
}

impl std::fmt::Debug for DiskSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskSink").field("queued", &self.queued).field("written", &self.written).finish()
    }
}

impl DiskSink {
    /// Writes to `file` from byte `offset` on; `pool` stages records given one by one.
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
        DiskSink { tx: Some(tx), thread: Some(thread), pool, staged: None, record_size, queued: 0, written: 0 }
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
        let tx = self.tx.as_ref().ok_or(RiverError::Closed)?;
        self.queued += buffer.len() as u64;
        if tx.send(buffer).is_err() {
            // The writer only stops early by panicking; its join reports it.
            return self.join().map(|_| ());
        }
        Ok(())
    }

    fn join(&mut self) -> Result<u64, RiverError> {
        self.tx = None;
        match self.thread.take() {
            Some(t) => {
                let written =
                    t.join().map_err(|_| RiverError::io("disk writer", std::io::Error::other("panicked")))??;
                self.written = written;
                Ok(written)
            }
            None => Ok(self.written),
        }
    }
}

impl Sink for DiskSink {
    fn sink_records(&mut self, mut records: &[u8]) -> Result<(), RiverError> {
        if records.len() % self.record_size != 0 {
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
