//! Word-level access to a region shared between two processes.
//!
//! Every load and store the shared-memory rings make goes through [`RingMem`], so the
//! same ring code runs on a real `mmap`ed region ([`MappedMem`]) and, under `cfg(loom)`,
//! on a model ([`loom_mem::LoomMem`]) that lets loom explore every interleaving of the
//! producer and the consumer. Control words are 64-bit and 8-byte aligned; payload bytes
//! are copied in and read out in place.

use std::sync::atomic::Ordering;

/// Loads, stores and copies on a shared region, by byte offset.
///
/// Offsets of 64-bit words must be 8-byte aligned and inside the region; implementations
/// assert it, because a wrong offset here is a bug in the ring code, never peer input
/// (the ring validates everything it reads from the peer before using it as an offset).
pub(crate) trait RingMem {
    /// Size of the region in bytes.
    fn len(&self) -> usize;
    /// Atomic load of the 64-bit word at `off`.
    fn load_u64(&self, off: usize, order: Ordering) -> u64;
    /// Atomic store of the 64-bit word at `off`.
    fn store_u64(&self, off: usize, value: u64, order: Ordering);
    /// Copies `src` into the region at `off` (plain stores; published by a later release).
    fn write_bytes(&self, off: usize, src: &[u8]);
    /// Copies bytes out of the region at `off` into `dst` (tests and models read this way;
    /// the transport hands out slices in place instead).
    #[cfg(test)]
    fn read_bytes(&self, off: usize, dst: &mut [u8]);
    /// Zeroes `len` bytes at `off` (8-aligned, a multiple of 8).
    fn zero(&self, off: usize, len: usize);
}

/// A region mapped into this process: the real thing. Owns the mapping.
pub(crate) struct MappedMem {
    map: memmap2::MmapRaw,
}

// SAFETY: the mapping is owned by this value and lives as long as it does. All concurrent
// access (from the peer process, or from another thread holding an `Arc` of it) goes
// through atomics or through byte ranges that the ring protocol hands to exactly one
// side at a time.
unsafe impl Sync for MappedMem {}

impl MappedMem {
    /// Maps the whole of `file` shared and writable.
    pub(crate) fn map(file: &std::fs::File) -> std::io::Result<Self> {
        let map = memmap2::MmapOptions::new().map_raw(file)?;
        assert_eq!(map.as_mut_ptr() as usize % 4096, 0, "mappings are page aligned");
        Ok(Self { map })
    }

    #[inline(always)]
    pub(crate) fn word(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.map.len(), "word offset {off} out of bounds");
        // SAFETY: the offset is aligned and inside the mapping (asserted above in debug, and
        // guaranteed by the ring's layout computation); AtomicU64 has the layout of u64.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const std::sync::atomic::AtomicU64) }
    }

    /// A view of `len` bytes at `off`, valid while the caller owns that range under the
    /// ring protocol (the producer has published it and the consumer has not released it).
    #[inline(always)]
    pub(crate) fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off <= self.map.len() && len <= self.map.len() - off, "slice {off}+{len} out of bounds");
        // SAFETY: in bounds (asserted); the ring protocol guarantees no writer touches the
        // range until the consumer releases it, which cannot happen while this borrow lives.
        unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().add(off), len) }
    }

    /// Lends `len` bytes at `off` to `fill`, to be written in place by a producer that owns
    /// the range under the ring protocol (a buffer it took from the free ring, or a record
    /// it reserved, and has not published yet).
    #[inline(always)]
    pub(crate) fn fill_bytes<R>(&self, off: usize, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        assert!(off <= self.map.len() && len <= self.map.len() - off, "fill {off}+{len} out of bounds");
        // SAFETY: in bounds (asserted); the producer owns this range until it publishes it,
        // and the borrow ends with `fill`, before the producer can publish it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) };
        fill(bytes)
    }
}

impl RingMem for MappedMem {
    #[inline(always)]
    fn len(&self) -> usize {
        self.map.len()
    }
    #[inline(always)]
    fn load_u64(&self, off: usize, order: Ordering) -> u64 {
        self.word(off).load(order)
    }
    #[inline(always)]
    fn store_u64(&self, off: usize, value: u64, order: Ordering) {
        self.word(off).store(value, order)
    }
    #[inline(always)]
    fn write_bytes(&self, off: usize, src: &[u8]) {
        assert!(off <= self.map.len() && src.len() <= self.map.len() - off, "write {off}+{} out of bounds", src.len());
        // SAFETY: in bounds (asserted); the producer owns this range until it publishes it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.as_mut_ptr().add(off), src.len()) }
    }
    #[cfg(test)]
    fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        dst.copy_from_slice(self.slice(off, dst.len()));
    }
    #[inline(always)]
    fn zero(&self, off: usize, len: usize) {
        assert!(off <= self.map.len() && len <= self.map.len() - off, "zero {off}+{len} out of bounds");
        // SAFETY: in bounds (asserted); the consumer owns this range until it releases it.
        unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(off), 0, len) }
    }
}

/// The loom model of a shared region: every byte lives in 64-bit loom atomics, so loom
/// sees (and checks the ordering of) payload writes as well as control words.
#[cfg(all(loom, test))]
pub(crate) mod loom_mem {
    use super::RingMem;
    use loom::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering;

    /// A region of loom atomics.
    pub(crate) struct LoomMem {
        words: Vec<AtomicU64>,
    }

    impl LoomMem {
        /// A zeroed region of `len` bytes (a multiple of 8).
        pub(crate) fn new(len: usize) -> Self {
            assert_eq!(len % 8, 0);
            Self { words: (0..len / 8).map(|_| AtomicU64::new(0)).collect() }
        }
    }

    impl RingMem for LoomMem {
        fn len(&self) -> usize {
            self.words.len() * 8
        }
        fn load_u64(&self, off: usize, order: Ordering) -> u64 {
            assert_eq!(off % 8, 0);
            self.words[off / 8].load(order)
        }
        fn store_u64(&self, off: usize, value: u64, order: Ordering) {
            assert_eq!(off % 8, 0);
            self.words[off / 8].store(value, order)
        }
        fn write_bytes(&self, off: usize, src: &[u8]) {
            // Payloads start 8-aligned in every ring record; model them word by word with
            // relaxed stores, which is weaker than what the hardware gives plain stores.
            assert_eq!(off % 8, 0);
            for (i, chunk) in src.chunks(8).enumerate() {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                self.words[off / 8 + i].store(u64::from_le_bytes(word), Ordering::Relaxed);
            }
        }
        fn read_bytes(&self, off: usize, dst: &mut [u8]) {
            assert_eq!(off % 8, 0);
            for (i, chunk) in dst.chunks_mut(8).enumerate() {
                let word = self.words[off / 8 + i].load(Ordering::Relaxed).to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
        }
        fn zero(&self, off: usize, len: usize) {
            assert!(off % 8 == 0 && len % 8 == 0);
            for i in 0..len / 8 {
                self.words[off / 8 + i].store(0, Ordering::Relaxed);
            }
        }
    }
}
