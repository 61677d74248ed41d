//! [`Buffer`]s and the bounded [`MemPool`]s they come from.
//!
//! A pool makes all its buffers up front (TigerBeetle's rule: size resources before the
//! work starts) and hands them out one at a time; a buffer goes back to its pool when it is
//! dropped, so memory use is bounded by `count × size` whatever the data does. A caller
//! that finds the pool empty waits ([`MemPool::get`]) or backs off ([`MemPool::try_get`]):
//! that wait is the back-pressure between the stages of a river.
//!
//! Three kinds, as River's `MemPool`, `DiskMemPool` and `ViaMemPool`:
//!
//! * [`MemPool::heap`]: plain heap memory.
//! * [`MemPool::sector_aligned`]: each buffer starts on a page boundary and its size is a
//!   multiple of the sector size, so it can be handed to direct (unbuffered) disk I/O.
//! * [`MemPool::registered`]: page-aligned memory that is faulted in up front and locked
//!   (`mlock`) when the limit allows, sized in whole transport fragments: the analogue of
//!   VIA's registered memory, so the network path never takes a page fault.

use memmap2::{MmapMut, MmapOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Sector size assumed when none is given: 4 KiB, the logical block size of today's disks
/// (and the page size, so page-aligned memory satisfies it).
pub const SECTOR_SIZE: usize = 4096;

enum Storage {
    Heap(Box<[u8]>),
    Mapped(MmapMut),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Heap(b) => b,
            Storage::Mapped(m) => m,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Heap(b) => b,
            Storage::Mapped(m) => m,
        }
    }
}

/// Which kind of memory a pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Heap memory.
    Heap,
    /// Page-aligned, sizes a multiple of the sector: usable for direct disk I/O.
    SectorAligned,
    /// Page-aligned, faulted in and (when allowed) locked: for the network path.
    Registered,
}

struct Shared {
    free: Mutex<Vec<Storage>>,
    returned: Condvar,
    buffer_size: usize,
    count: usize,
    kind: PoolKind,
    waits: AtomicU64,
}

/// A bounded pool of equal buffers. Cloning shares the pool.
///
/// ```
/// use ulnet_river::MemPool;
///
/// let pool = MemPool::heap(2, 1000);
/// let mut a = pool.get();
/// a.extend_from_slice(b"hello");
/// let _b = pool.get();
/// assert!(pool.try_get().is_none()); // bounded: both buffers are out
/// drop(a); // back to the pool, emptied
/// assert_eq!(pool.try_get().unwrap().len(), 0);
/// ```
#[derive(Clone)]
pub struct MemPool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("kind", &self.shared.kind)
            .field("count", &self.shared.count)
            .field("buffer_size", &self.shared.buffer_size)
            .field("available", &self.available())
            .finish()
    }
}

impl MemPool {
    fn from_storage(kind: PoolKind, buffer_size: usize, storage: Vec<Storage>) -> Self {
        let count = storage.len();
        MemPool {
            shared: Arc::new(Shared {
                free: Mutex::new(storage),
                returned: Condvar::new(),
                buffer_size,
                count,
                kind,
                waits: AtomicU64::new(0),
            }),
        }
    }

    /// `count` heap buffers of `buffer_size` bytes each.
    pub fn heap(count: usize, buffer_size: usize) -> Self {
        assert!(count > 0 && buffer_size > 0, "a pool needs at least one non-empty buffer");
        let storage = (0..count).map(|_| Storage::Heap(vec![0u8; buffer_size].into_boxed_slice())).collect();
        Self::from_storage(PoolKind::Heap, buffer_size, storage)
    }

    /// `count` page-aligned buffers of `buffer_size` bytes rounded up to a multiple of
    /// `sector` (a power of two of at most the page size), for direct disk I/O.
    pub fn sector_aligned(count: usize, buffer_size: usize, sector: usize) -> std::io::Result<Self> {
        assert!(count > 0 && buffer_size > 0, "a pool needs at least one non-empty buffer");
        assert!(sector.is_power_of_two() && sector <= SECTOR_SIZE, "sector must be a power of two <= 4096");
        let size = buffer_size.div_ceil(sector) * sector;
        let storage = (0..count)
            .map(|_| MmapOptions::new().len(size).map_anon().map(Storage::Mapped))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self::from_storage(PoolKind::SectorAligned, size, storage))
    }

    /// `count` buffers of `fragments` whole transport fragments of `fragment_size` bytes,
    /// faulted in up front and locked in memory when `RLIMIT_MEMLOCK` allows (when it does
    /// not, the pages stay faulted in but unlocked, and a warning is logged once).
    pub fn registered(count: usize, fragment_size: usize, fragments: usize) -> std::io::Result<Self> {
        assert!(count > 0 && fragment_size > 0 && fragments > 0, "a pool needs at least one non-empty buffer");
        let size = fragment_size * fragments;
        let mut warned = false;
        let storage = (0..count)
            .map(|_| {
                let m = MmapOptions::new().len(size).populate().map_anon()?;
                if let Err(e) = m.lock() {
                    if !warned {
                        tracing::warn!(error = %e, "could not lock registered pool memory; using it unlocked");
                        warned = true;
                    }
                }
                Ok(Storage::Mapped(m))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self::from_storage(PoolKind::Registered, size, storage))
    }

    /// Size of each buffer in bytes.
    pub fn buffer_size(&self) -> usize {
        self.shared.buffer_size
    }

    /// Number of buffers the pool owns.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// The kind of memory.
    pub fn kind(&self) -> PoolKind {
        self.shared.kind
    }

    /// Buffers in the pool now (not handed out).
    pub fn available(&self) -> usize {
        self.lock().len()
    }

    /// Every buffer is back: what a stage asserts at shutdown.
    pub fn all_returned(&self) -> bool {
        self.available() == self.shared.count
    }

    /// Times a caller of [`MemPool::get`] had to wait for a buffer.
    pub fn waits(&self) -> u64 {
        self.shared.waits.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Storage>> {
        self.shared.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wrap(&self, storage: Storage) -> Buffer {
        Buffer { storage: Some(storage), len: 0, home: Some(self.shared.clone()) }
    }

    /// An empty buffer if one is free now.
    pub fn try_get(&self) -> Option<Buffer> {
        let storage = self.lock().pop()?;
        Some(self.wrap(storage))
    }

    /// An empty buffer, waiting for one to come back if none is free.
    pub fn get(&self) -> Buffer {
        let mut free = self.lock();
        if free.is_empty() {
            self.shared.waits.fetch_add(1, Ordering::Relaxed);
        }
        loop {
            if let Some(storage) = free.pop() {
                drop(free);
                return self.wrap(storage);
            }
            free = self.shared.returned.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// An empty buffer, waiting at most `timeout` for one.
    pub fn get_timeout(&self, timeout: Duration) -> Option<Buffer> {
        let deadline = Instant::now() + timeout;
        let mut free = self.lock();
        loop {
            if let Some(storage) = free.pop() {
                drop(free);
                return Some(self.wrap(storage));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            free = self.shared.returned.wait_timeout(free, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A buffer: a fixed capacity of bytes, of which the first [`Buffer::len`] are filled.
/// Dropping it returns its memory to its pool (if it came from one).
pub struct Buffer {
    storage: Option<Storage>,
    len: usize,
    home: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("len", &self.len).field("capacity", &self.capacity()).finish()
    }
}

impl Buffer {
    /// A heap buffer that belongs to no pool.
    pub fn unpooled(capacity: usize) -> Self {
        Buffer { storage: Some(Storage::Heap(vec![0u8; capacity].into_boxed_slice())), len: 0, home: None }
    }

    /// A buffer holding a copy of `data`, belonging to no pool.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::unpooled(data.len());
        b.extend_from_slice(data);
        b
    }

    fn storage(&self) -> &Storage {
        self.storage.as_ref().expect("a live buffer has storage")
    }

    fn storage_mut(&mut self) -> &mut Storage {
        self.storage.as_mut().expect("a live buffer has storage")
    }

    /// Total bytes it can hold.
    pub fn capacity(&self) -> usize {
        self.storage().bytes().len()
    }

    /// Filled bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes still free.
    pub fn remaining(&self) -> usize {
        self.capacity() - self.len
    }

    /// The filled bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage().bytes()[..self.len]
    }

    /// The filled bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.storage_mut().bytes_mut()[..len]
    }

    /// The unfilled bytes, to be written and then claimed with [`Buffer::set_len`].
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.storage_mut().bytes_mut()[len..]
    }

    /// Declares the first `len` bytes filled.
    ///
    /// # Panics
    /// When `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "buffer length {len} beyond capacity {}", self.capacity());
        self.len = len;
    }

    /// Empties the buffer (the memory stays).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends as much of `data` as fits; returns how many bytes were taken.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> usize {
        let take = data.len().min(self.remaining());
        let len = self.len;
        self.storage_mut().bytes_mut()[len..len + take].copy_from_slice(&data[..take]);
        self.len += take;
        take
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let (Some(home), Some(storage)) = (self.home.take(), self.storage.take()) {
            let mut free = home.free.lock().unwrap_or_else(|e| e.into_inner());
            assert!(free.len() < home.count, "pool invariant: more buffers returned than it owns");
            free.push(storage);
            drop(free);
            home.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_their_alignment_and_size() {
        let p = MemPool::sector_aligned(2, 1000, 512).unwrap();
        assert_eq!(p.buffer_size(), 1024);
        let b = p.get();
        assert_eq!(b.capacity(), 1024);
        assert_eq!(b.as_slice().as_ptr() as usize % 4096, 0);
        let r = MemPool::registered(1, 4096, 3).unwrap();
        assert_eq!(r.buffer_size(), 3 * 4096);
        assert_eq!(r.kind(), PoolKind::Registered);
    }

    #[test]
    fn buffers_come_back_emptied_and_waiters_wake() {
        let p = MemPool::heap(1, 8);
        let mut b = p.get();
        assert_eq!(b.extend_from_slice(b"0123456789"), 8);
        assert_eq!(b.remaining(), 0);
        let p2 = p.clone();
        let t = std::thread::spawn(move || p2.get().len());
        std::thread::sleep(Duration::from_millis(20));
        drop(b);
        assert_eq!(t.join().unwrap(), 0);
        assert!(p.all_returned());
        assert!(p.get_timeout(Duration::from_millis(1)).is_some());
    }

    #[test]
    fn get_timeout_gives_up() {
        let p = MemPool::heap(1, 8);
        let _held = p.get();
        assert!(p.get_timeout(Duration::from_millis(5)).is_none());
    }
}
