//! Direct (`O_DIRECT`) writing of one writer's byte range of a file that other writers
//! share: a [`DirectSink`].
//!
//! Why: buffered `write`s to one file take the file system's inode lock exclusively
//! (ext4), so two nodes writing their partitions of one output file take turns, and each
//! byte is copied into freshly allocated page cache. Direct writes of whole file-system
//! blocks into blocks that are already allocated (the file is preallocated with
//! `fallocate`, [`preallocate`]) take the lock shared, so writers run side by side, and
//! the device reads the records from the buffer itself: no page-cache copy.
//!
//! A writer's range starts and ends anywhere (records are 100 bytes), so the blocks at its
//! two edges are shared with its neighbours. Only those partial edge blocks are written
//! through the page cache, each writer writing only its own bytes of them; every whole
//! block of the range is written directly. The block boundary a buffer ends on mid-block
//! is carried over: the next buffer is handed over with room in front of its records
//! ([`DirectSink::headroom`]), the carried bytes are copied there (less than a block), and
//! the buffer is written from the block boundary on.
//!
//! The writer thread keeps that order (carries, edge blocks); the direct writes of whole
//! blocks it hands to [`WRITES_IN_FLIGHT`] threads of their own, so that the device has the
//! next write while the thread of the one before waits for a core to see it complete.
//!
//! ```
//! use ulnet_river::direct::{preallocate, DirectSink, BLOCK};
//! use ulnet_river::MemPool;
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("out");
//! preallocate(&path, 10_000)?;
//! // 4 buffers with room for a block of headroom before up to 3000 bytes.
//! let pool = MemPool::sector_aligned(4, 3000 + BLOCK, BLOCK)?;
//! let mut sink = DirectSink::open(&path, 1000, pool.clone())?;
//! let mut b = sink.buffer();
//! let start = b.len(); // the headroom: records go after it
//! b.extend_from_slice(&[7u8; 3000]);
//! sink.sink(b, start)?;
//! assert_eq!(sink.close()?, 3000);
//! let out = std::fs::read(&path)?;
//! assert!(out[1000..4000].iter().all(|&x| x == 7) && out[..1000].iter().all(|&x| x == 0));
//! assert!(pool.all_returned());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::RiverError;
use crate::pool::{Buffer, MemPool, PoolKind};
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Block size direct writes are aligned to: 4 KiB, ext4's block size (an unaligned direct
/// write takes the inode lock exclusively) and a multiple of every disk's logical block.
pub const BLOCK: usize = 4096;

/// Direct writes a sink keeps in flight: 2. With one, each node of the external sort's
/// second pass had its writer thread in `pwrite` for 93–97 % of the pass and the disk took
/// 1.8 GB/s from the two nodes, where two streams of the same writes and nothing else give
/// it 2.1 GB/s: the other stages keep both cores busy, so a completed write waited for its
/// thread to be run again before the next was issued. See BENCHMARKS.md (issue 8).
pub const WRITES_IN_FLIGHT: usize = 2;

/// Creates (or truncates) `path` and allocates `len` bytes for it, unwritten (reads give
/// zeros), so that direct writes into it overwrite allocated blocks. Falls back to a
/// sparse file of that length where the file system cannot preallocate.
pub fn preallocate(path: &Path, len: u64) -> Result<File, RiverError> {
    let f = File::create(path).map_err(|e| RiverError::io(format!("creating {}", path.display()), e))?;
    if len > 0 {
        if let Err(e) = rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len) {
            tracing::debug!(error = %e, path = %path.display(), "cannot preallocate; sizing the file instead");
            f.set_len(len).map_err(|e| RiverError::io(format!("sizing {}", path.display()), e))?;
        }
    }
    Ok(f)
}

/// Writes consecutive buffers to a file from a byte offset on, behind its producer on a
/// thread of its own: whole blocks directly, the partial blocks at the range's edges
/// through the page cache (see the module's documentation). The buffers come from a
/// sector-aligned pool with a block of room beyond the records they carry.
pub struct DirectSink {
    tx: Option<SyncSender<(Buffer, usize)>>,
    thread: Option<JoinHandle<Result<u64, RiverError>>>,
    pool: MemPool,
    /// File position of the next byte handed over.
    position: u64,
    queued: u64,
    buffered: Arc<File>,
}

impl std::fmt::Debug for DirectSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSink").field("position", &self.position).field("queued", &self.queued).finish()
    }
}

impl DirectSink {
    /// Opens `path` for direct writing from byte `offset` on. Fails (an I/O error) when the
    /// file system refuses direct I/O, so that the caller can write through the page cache
    /// instead.
    ///
    /// # Panics
    /// When the pool is not sector-aligned or its buffers cannot hold a block of headroom
    /// and a block of data.
    pub fn open(path: &Path, offset: u64, pool: MemPool) -> Result<Self, RiverError> {
        assert_eq!(pool.kind(), PoolKind::SectorAligned, "direct I/O needs sector-aligned buffers");
        assert!(pool.buffer_size() >= 2 * BLOCK, "buffers must hold a block of headroom and a block");
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true);
            if direct {
                o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
            }
            o.open(path).map_err(|e| RiverError::io(format!("opening {} (direct: {direct})", path.display()), e))
        };
        let direct = open(true)?;
        let buffered = Arc::new(open(false)?);
        let name = path.display().to_string();
        let to = buffered.clone();
        let (tx, rx) = mpsc::sync_channel::<(Buffer, usize)>(pool.count());
        let thread = std::thread::Builder::new()
            .name("river-direct-write".into())
            .spawn(move || {
                let (issue, issued) = mpsc::sync_channel::<DirectWrite>(WRITES_IN_FLIGHT);
                let shared = Blocks {
                    file: direct,
                    name: name.clone(),
                    queue: Mutex::new(issued),
                    failed: AtomicBool::new(false),
                };
                std::thread::scope(|scope| {
                    let writers = (0..WRITES_IN_FLIGHT)
                        .map(|_| {
                            std::thread::Builder::new()
                                .name("river-direct-io".into())
                                .spawn_scoped(scope, || shared.write_until_closed())
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| RiverError::io("starting the direct write threads", e))?;
                    let mut w =
                        BlockWriter { issue, buffered: to, name, position: offset, carry: [0; BLOCK], carried: 0 };
                    let mut failure = None;
                    // Every buffer is taken (and so returned to its pool) even after a
                    // failure, so that a producer waiting for one is not stranded.
                    for (buf, start) in rx {
                        if failure.is_none() {
                            failure = w.write(buf, start).err();
                        }
                    }
                    let written = w.position - offset;
                    let finished = match failure {
                        Some(e) => Err(e),
                        None => w.finish(),
                    };
                    // Closes the queue: the write threads end once it is empty.
                    drop(w);
                    let mut first = finished.err();
                    for t in writers {
                        let r = t.join().unwrap_or_else(|_| {
                            Err(RiverError::io("direct write thread", std::io::Error::other("panicked")))
                        });
                        first = first.or(r.err());
                    }
                    first.map_or(Ok(written), Err)
                })
            })
            .map_err(|e| RiverError::io("starting the direct writer thread", e))?;
        Ok(DirectSink { tx: Some(tx), thread: Some(thread), pool, position: offset, queued: 0, buffered })
    }

    /// Bytes the next buffer should keep free in front of its data: where its first byte
    /// falls in its block, so that the carried bytes of that block fit before it and the
    /// buffer can be written from the block's start without moving anything.
    pub fn headroom(&self) -> usize {
        (self.position % BLOCK as u64) as usize
    }

    /// Most bytes of data a buffer of this sink's pool carries (a block of each is kept
    /// for the headroom).
    pub fn data_capacity(&self) -> usize {
        self.pool.buffer_size() - BLOCK
    }

    /// A buffer from the pool (waiting for one when all are being written), its length
    /// set to the headroom: data goes after it.
    pub fn buffer(&self) -> Buffer {
        let mut b = self.pool.get();
        b.set_len(self.headroom());
        b
    }

    /// Hands over `buffer`, whose data are its bytes from `start` on (at most
    /// [`DirectSink::data_capacity`] of them), to be written at the next position. A
    /// `start` other than the headroom is allowed (a buffer filled before the offset was
    /// known): the writer moves the data into place.
    pub fn sink(&mut self, buffer: Buffer, start: usize) -> Result<(), RiverError> {
        assert!(start <= buffer.len(), "data start {start} beyond the buffer's {} bytes", buffer.len());
        let len = buffer.len() - start;
        assert!(len <= self.data_capacity(), "{len} bytes of data do not leave a block of headroom");
        if len == 0 {
            return Ok(());
        }
        let tx = self.tx.as_ref().ok_or(RiverError::Closed)?;
        if tx.send((buffer, start)).is_err() {
            // The writer only stops taking buffers by panicking; its join reports it.
            return self.close().map(|_| ());
        }
        self.position += len as u64;
        self.queued += len as u64;
        Ok(())
    }

    /// Bytes handed over so far.
    pub fn bytes_queued(&self) -> u64 {
        self.queued
    }

    /// The file, opened for buffered I/O (to `fsync` it, say).
    pub fn file(&self) -> Arc<File> {
        self.buffered.clone()
    }

    /// Writes what is left (the carried partial block) and waits for the writer; returns
    /// the bytes written, or the first error (naming the file and position).
    pub fn close(&mut self) -> Result<u64, RiverError> {
        self.tx = None;
        let t = self.thread.take().ok_or(RiverError::Closed)?;
        t.join().map_err(|_| RiverError::io("direct writer", std::io::Error::other("panicked")))?
    }
}

impl Drop for DirectSink {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A whole-block direct write handed to the write threads: `range` of `buf`, at `at`.
struct DirectWrite {
    buf: Buffer,
    range: Range<usize>,
    at: u64,
}

/// What the write threads share: the file (opened with `O_DIRECT`), the queue of writes,
/// and whether one failed (then the others write no more, but still take every buffer).
struct Blocks {
    file: File,
    name: String,
    queue: Mutex<Receiver<DirectWrite>>,
    failed: AtomicBool,
}

impl Blocks {
    /// A write thread: writes what the queue gives until it closes; returns the first
    /// failure of its own.
    fn write_until_closed(&self) -> Result<(), RiverError> {
        let mut failure = None;
        loop {
            // The lock is held while waiting: the other threads wait for it instead.
            let next = self.queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
            let Ok(w) = next else { break };
            if failure.is_none() && !self.failed.load(Ordering::Relaxed) {
                if let Err(e) = self.file.write_all_at(&w.buf.as_slice()[w.range], w.at) {
                    failure = Some(RiverError::io(format!("writing {} at byte {} (direct)", self.name, w.at), e));
                    self.failed.store(true, Ordering::Relaxed);
                }
            }
            // Dropping `w` returns its buffer to the pool.
        }
        failure.map_or(Ok(()), Err)
    }
}

/// The writer thread's state: where the next byte goes, and the bytes of its block
/// before it that are ours and not yet written (the carry).
struct BlockWriter {
    /// Where the whole blocks go to be written directly.
    issue: SyncSender<DirectWrite>,
    buffered: Arc<File>,
    name: String,
    position: u64,
    carry: [u8; BLOCK],
    /// Bytes in `carry`: either `position % BLOCK` (the block's start is ours) or 0.
    carried: usize,
}

impl BlockWriter {
    fn error(&self, at: u64, how: &str, e: std::io::Error) -> RiverError {
        RiverError::io(format!("writing {} at byte {at} ({how})", self.name), e)
    }

    fn write(&mut self, mut buf: Buffer, start: usize) -> Result<(), RiverError> {
        let len = buf.len() - start;
        let head = (self.position % BLOCK as u64) as usize;
        if start != head {
            // Filled before the position was known: move the data to where the block
            // boundary falls (the buffer has a block of room beyond the data).
            buf.set_len(start.max(head) + len);
            buf.as_mut_slice().copy_within(start..start + len, head);
            buf.set_len(head + len);
        }
        let block_start = self.position - head as u64;
        let end = head + len;
        let data = buf.as_mut_slice();
        let mut from = 0;
        if head > 0 {
            if self.carried == head {
                data[..head].copy_from_slice(&self.carry[..head]);
            } else {
                // The block's start belongs to the writer before us (or was written
                // already): write only our bytes of it, through the page cache.
                from = BLOCK.min(end);
                self.buffered
                    .write_all_at(&data[head..from], self.position)
                    .map_err(|e| self.error(self.position, "buffered, first block", e))?;
            }
        }
        let whole_end = end / BLOCK * BLOCK;
        self.carried = 0;
        if end > whole_end.max(from) {
            self.carried = end - whole_end;
            self.carry[..self.carried].copy_from_slice(&data[whole_end..end]);
        }
        self.position += len as u64;
        if whole_end > from {
            let at = block_start + from as u64;
            if self.issue.send(DirectWrite { buf, range: from..whole_end, at }).is_err() {
                return Err(self.error(at, "direct", std::io::Error::other("the write threads stopped")));
            }
        }
        Ok(())
    }

    /// Writes the carried partial last block (shared with the writer after us) through
    /// the page cache.
    fn finish(&mut self) -> Result<(), RiverError> {
        if self.carried > 0 {
            let at = self.position - self.carried as u64;
            self.buffered
                .write_all_at(&self.carry[..self.carried], at)
                .map_err(|e| self.error(at, "buffered, last block", e))?;
            self.carried = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Writes `ranges` (consecutive, covering the file) each on a DirectSink of its own,
    /// all at once, in buffers of the given data sizes (cycled); checks the file.
    fn write_neighbours(ranges: &[(u64, u64)], sizes: &[usize], unknown_first: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let total = ranges.last().map_or(0, |r| r.1);
        preallocate(&path, total).unwrap();
        let byte = |i: u64| (i % 251) as u8 + 1;
        std::thread::scope(|s| {
            for &(a, b) in ranges {
                let path = &path;
                s.spawn(move || {
                    let most = sizes.iter().max().copied().unwrap_or(1);
                    let pool = MemPool::sector_aligned(3, most.max(BLOCK) + BLOCK, 512).unwrap();
                    let mut sink = DirectSink::open(path, a, pool.clone()).unwrap();
                    let mut at = a;
                    let mut k = 0;
                    while at < b {
                        let n = (sizes[k % sizes.len()] as u64).min(b - at) as usize;
                        let (mut buf, start) = if unknown_first && k == 0 {
                            (pool.get(), 0)
                        } else {
                            let buf = sink.buffer();
                            let start = buf.len();
                            (buf, start)
                        };
                        for i in at..at + n as u64 {
                            buf.extend_from_slice(&[byte(i)]);
                        }
                        sink.sink(buf, start).unwrap();
                        at += n as u64;
                        k += 1;
                    }
                    assert_eq!(sink.close().unwrap(), b - a);
                    assert!(pool.all_returned());
                });
            }
        });
        let out = std::fs::read(&path).unwrap();
        assert_eq!(out.len() as u64, total);
        for (i, &x) in out.iter().enumerate() {
            assert_eq!(x, byte(i as u64), "byte {i} of ranges {ranges:?}, buffers {sizes:?}");
        }
    }

    #[test]
    fn neighbours_with_unaligned_edges_write_every_byte() {
        // Two partitions of 100-byte records meeting mid-block, as two sort nodes do.
        write_neighbours(&[(0, 1_000_000), (1_000_000, 2_000_000)], &[300_000], false);
        // Aligned meeting point; buffers smaller than a block; a range inside one block.
        write_neighbours(&[(0, 8192), (8192, 8292), (8292, 20_000)], &[100, 4000, 9000], false);
        // A first buffer filled before the position was known.
        write_neighbours(&[(0, 5000), (5000, 50_000), (50_000, 50_100)], &[7000, 100], true);
    }

    #[test]
    fn a_failed_write_is_reported_with_the_file_and_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        preallocate(&path, 100_000).unwrap();
        let pool = MemPool::sector_aligned(2, 3 * BLOCK, BLOCK).unwrap();
        // Past the largest file the file system allows: the direct write fails (EFBIG).
        let far = 1u64 << 50;
        let mut sink = DirectSink::open(&path, far, pool.clone()).unwrap();
        for _ in 0..4 {
            let mut b = sink.buffer();
            let start = b.len();
            b.extend_from_slice(&[1; 2 * BLOCK]);
            // Buffers keep being taken (and returned) after the failure.
            sink.sink(b, start).unwrap();
        }
        let e = sink.close().unwrap_err().to_string();
        assert!(e.contains(&format!("at byte {far} (direct)")) && e.contains("out"), "{e}");
        assert!(pool.all_returned());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn any_split_and_buffering_writes_every_byte(
            cuts in proptest::collection::vec(1u64..30_000, 1..4),
            sizes in proptest::collection::vec(1usize..12_000, 1..4),
            unknown_first in any::<bool>(),
        ) {
            let mut ranges = Vec::new();
            let mut at = 0;
            for c in cuts {
                ranges.push((at, at + c));
                at += c;
            }
            write_neighbours(&ranges, &sizes, unknown_first);
        }
    }
}
