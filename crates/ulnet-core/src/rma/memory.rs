//! Segment memory: the owner's mapping of a segment, importers' mappings of it, and every
//! load, store, copy and atomic made on them.
//!
//! A segment lives in a size-sealed `memfd`, so an importer on the same host can map the
//! very pages the owner uses. All accesses go through this module and are made with atomic
//! instructions: 64-bit compare-and-swap and fetch-and-add are `lock cmpxchg` / `lock xadd`
//! on the shared page, and copies move every 8-byte-aligned word with one 64-bit access.
//! That is what makes an aligned word atomic with respect to the owner's own loads, stores
//! and atomics on it, whichever path (mapped or through the engine) the remote access took.
//!
//! Revocation on the same host cannot unmap an importer's mapping, so the owner *migrates*:
//! it copies the segment into a fresh `memfd` and maps that over its own address range
//! (`MAP_FIXED`), so its pointers stay valid while stale mappings keep only the old, now
//! orphaned pages.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const PAGE: usize = 4096;

/// A mapped range of a segment file. Owns the mapping (unmapped on drop).
pub(crate) struct Region {
    ptr: NonNull<u8>,
    /// Bytes the segment has; accesses are checked against this.
    len: usize,
    /// Bytes mapped (a whole number of pages).
    map_len: usize,
    writable: bool,
}

// SAFETY: the region is plain shared memory; every access from any thread goes through
// the atomic accessors below (or through `migrate`, whose caller guarantees exclusivity),
// so sharing the pointer between threads introduces no data race in this process.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` only offers atomic accesses.
unsafe impl Sync for Region {}

/// Bytes mapped for a segment of `len` bytes.
pub(crate) fn mapped_len(len: usize) -> usize {
    len.next_multiple_of(PAGE)
}

impl Region {
    /// Maps `len` bytes of `file` shared, writable or read-only.
    pub(crate) fn map(file: &File, len: usize, writable: bool) -> io::Result<Region> {
        let map_len = mapped_len(len);
        if len == 0 || (file.metadata()?.len() as usize) < map_len {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment file smaller than the segment"));
        }
        let prot = if writable {
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE
        } else {
            rustix::mm::ProtFlags::READ
        };
        // SAFETY: a fresh mapping at an address the kernel picks; it aliases no Rust object.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), map_len, prot, rustix::mm::MapFlags::SHARED, file.as_fd(), 0)?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Region { ptr, len, map_len, writable })
    }

    /// Creates a segment of `len` bytes in a new sealed memory file and maps it writable.
    pub(crate) fn create(len: usize) -> io::Result<(Region, File)> {
        let file = crate::sys::memfd::create_sealed("ulnet-rma-segment", mapped_len(len))?;
        let region = Region::map(&file, len, true)?;
        Ok((region, file))
    }

    /// Bytes in the segment.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn check(&self, off: usize, len: usize) {
        assert!(off <= self.len && len <= self.len - off, "access {off}+{len} beyond a segment of {}", self.len);
    }

    #[inline(always)]
    fn word(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        assert!(off.is_multiple_of(8), "word offset {off} misaligned");
        // SAFETY: in bounds and 8-aligned (asserted; the mapping is page aligned);
        // AtomicU64 has the size and alignment of u64, and every access to shared memory is
        // atomic, so this reference never aliases a non-atomic access in this process.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) }
    }

    #[inline(always)]
    fn check_writable(&self) {
        assert!(self.writable, "store into a read-only mapping");
    }

    /// Atomic load of the word at `off` (8-aligned, in bounds).
    #[inline]
    pub(crate) fn load_u64(&self, off: usize, order: Ordering) -> u64 {
        self.word(off).load(order)
    }

    /// Atomic store of the word at `off`.
    #[inline]
    pub(crate) fn store_u64(&self, off: usize, value: u64, order: Ordering) {
        self.check_writable();
        self.word(off).store(value, order)
    }

    /// Compare-and-swap on the word at `off`; returns the value it held before.
    #[inline]
    pub(crate) fn compare_swap_u64(&self, off: usize, expected: u64, desired: u64) -> u64 {
        self.check_writable();
        match self.word(off).compare_exchange(expected, desired, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) | Err(v) => v,
        }
    }

    /// Fetch-and-add (wrapping) on the word at `off`; returns the value it held before.
    #[inline]
    pub(crate) fn fetch_add_u64(&self, off: usize, addend: u64) -> u64 {
        self.check_writable();
        self.word(off).fetch_add(addend, Ordering::AcqRel)
    }

    /// The word at `off` without a second check, for a caller that has checked it
    /// already (the mapped import's one check per operation).
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 <= len()`.
    #[inline(always)]
    unsafe fn word_prechecked(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off <= self.len && 8 <= self.len - off);
        // SAFETY: in bounds and aligned (the caller's contract; the mapping is page
        // aligned); every access to shared memory is atomic, as in `word`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) }
    }

    /// [`Region::load_u64`] for a caller that checked the word.
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 <= len()`.
    #[inline(always)]
    pub(crate) unsafe fn load_u64_prechecked(&self, off: usize, order: Ordering) -> u64 {
        // SAFETY: the caller's contract is `word_prechecked`'s.
        unsafe { self.word_prechecked(off) }.load(order)
    }

    /// [`Region::store_u64`] for a caller that checked the word and that the mapping is
    /// writable (a store into a read-only mapping faults).
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 <= len()`.
    #[inline(always)]
    pub(crate) unsafe fn store_u64_prechecked(&self, off: usize, value: u64, order: Ordering) {
        debug_assert!(self.writable);
        // SAFETY: the caller's contract is `word_prechecked`'s.
        unsafe { self.word_prechecked(off) }.store(value, order)
    }

    /// [`Region::compare_swap_u64`] for a caller that checked the word and writability.
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 <= len()`.
    #[inline(always)]
    pub(crate) unsafe fn compare_swap_u64_prechecked(&self, off: usize, expected: u64, desired: u64) -> u64 {
        debug_assert!(self.writable);
        // SAFETY: the caller's contract is `word_prechecked`'s.
        match unsafe { self.word_prechecked(off) }.compare_exchange(
            expected,
            desired,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(v) | Err(v) => v,
        }
    }

    /// [`Region::fetch_add_u64`] for a caller that checked the word and writability.
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 <= len()`.
    #[inline(always)]
    pub(crate) unsafe fn fetch_add_u64_prechecked(&self, off: usize, addend: u64) -> u64 {
        debug_assert!(self.writable);
        // SAFETY: the caller's contract is `word_prechecked`'s.
        unsafe { self.word_prechecked(off) }.fetch_add(addend, Ordering::AcqRel)
    }

    /// Copies `dst.len()` bytes from `off`, each aligned word with one 64-bit load.
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        let len = dst.len();
        // SAFETY: `off..off + len` is inside the mapping (checked once above).
        let base = unsafe { self.ptr.as_ptr().add(off) };
        let head = base.align_offset(8).min(len);
        let words = (len - head) / 8;
        for (i, b) in dst[..head].iter_mut().enumerate() {
            // SAFETY: inside the checked range; every access to the region is atomic.
            *b = unsafe { AtomicU8::from_ptr(base.add(i)) }.load(Ordering::Relaxed);
        }
        let out = dst[head..head + words * 8].as_mut_ptr();
        for w in 0..words {
            // SAFETY: the source word is inside the checked range and 8-aligned (`head`
            // aligns it); the destination is inside `dst` (sliced above), written unaligned.
            unsafe {
                let v = AtomicU64::from_ptr(base.add(head + w * 8).cast::<u64>()).load(Ordering::Relaxed);
                out.add(w * 8).cast::<u64>().write_unaligned(v);
            }
        }
        for (i, b) in dst.iter_mut().enumerate().skip(head + words * 8) {
            // SAFETY: inside the checked range.
            *b = unsafe { AtomicU8::from_ptr(base.add(i)) }.load(Ordering::Relaxed);
        }
    }

    /// Copies `src` to `off`, each aligned word with one 64-bit store.
    pub(crate) fn copy_in(&self, off: usize, src: &[u8]) {
        self.check_writable();
        self.check(off, src.len());
        let len = src.len();
        // SAFETY: `off..off + len` is inside the mapping (checked once above).
        let base = unsafe { self.ptr.as_ptr().add(off) };
        let head = base.align_offset(8).min(len);
        let words = (len - head) / 8;
        for (i, &b) in src[..head].iter().enumerate() {
            // SAFETY: inside the checked range; every access to the region is atomic.
            unsafe { AtomicU8::from_ptr(base.add(i)) }.store(b, Ordering::Relaxed);
        }
        let from = src[head..head + words * 8].as_ptr();
        for w in 0..words {
            // SAFETY: the source is inside `src` (sliced above), read unaligned; the
            // destination word is inside the checked range and 8-aligned.
            unsafe {
                let v = from.add(w * 8).cast::<u64>().read_unaligned();
                AtomicU64::from_ptr(base.add(head + w * 8).cast::<u64>()).store(v, Ordering::Relaxed);
            }
        }
        for (i, &b) in src.iter().enumerate().skip(head + words * 8) {
            // SAFETY: inside the checked range.
            unsafe { AtomicU8::from_ptr(base.add(i)) }.store(b, Ordering::Relaxed);
        }
    }

    /// Moves the segment to a fresh sealed memory file mapped over the same addresses, and
    /// returns that file. Other mappings of the old file keep the old pages, which nothing
    /// of ours touches any more.
    ///
    /// # Safety
    ///
    /// No thread of this process may access the region during the call (the owner holds its
    /// handle exclusively, and the engine and every importer were quiesced): a store made
    /// between the copy and the remap would be lost.
    pub(crate) unsafe fn migrate(&self) -> io::Result<File> {
        self.check_writable();
        let file = crate::sys::memfd::create_sealed("ulnet-rma-segment", self.map_len)?;
        // SAFETY: in bounds of the mapping; the caller guarantees no concurrent access here.
        let contents = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.map_len) };
        std::os::unix::fs::FileExt::write_all_at(&file, contents, 0)?;
        // SAFETY: replaces our own mapping, of the same length at the same address, with the
        // new file; no reference into the range is live (caller's guarantee), and every
        // later access goes to the new pages holding the same bytes.
        let at = unsafe {
            rustix::mm::mmap(
                self.ptr.as_ptr().cast(),
                self.map_len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                file.as_fd(),
                0,
            )?
        };
        assert_eq!(at.cast::<u8>(), self.ptr.as_ptr(), "MAP_FIXED maps at the address asked");
        Ok(file)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; nothing borrows from it past the owner's lifetime.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.map_len) } {
            tracing::warn!("munmap of a segment failed: {e}");
        }
    }
}

/// A second, read-only open of a memory file: an importer without write rights can map it
/// only `PROT_READ`, so a stray store through its mapping faults instead of landing.
pub(crate) fn reopen_read_only(file: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let fd = rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn atomics_and_word_access() {
        let (r, _file) = Region::create(100).unwrap();
        assert_eq!(r.len(), 100);
        r.store_u64(8, 5, Ordering::Relaxed);
        assert_eq!(r.fetch_add_u64(8, 3), 5);
        assert_eq!(r.compare_swap_u64(8, 7, 1), 8, "no swap on a mismatch");
        assert_eq!(r.compare_swap_u64(8, 8, 1), 8);
        assert_eq!(r.load_u64(8, Ordering::Relaxed), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn copies_round_trip_at_any_alignment(off in 0usize..64, data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (r, _file) = Region::create(300).unwrap();
            r.copy_in(off, &data);
            let mut back = vec![0u8; data.len()];
            r.copy_out(off, &mut back);
            prop_assert_eq!(&back, &data);
            let mut before = vec![0u8; off];
            r.copy_out(0, &mut before);
            prop_assert!(before.iter().all(|&b| b == 0), "bytes before the copy untouched");
        }
    }

    #[test]
    fn a_second_mapping_sees_the_same_pages_until_migration() {
        let (owner, file) = Region::create(4096).unwrap();
        let other = Region::map(&file, 4096, true).unwrap();
        owner.store_u64(0, 11, Ordering::Relaxed);
        assert_eq!(other.load_u64(0, Ordering::Relaxed), 11);
        // SAFETY: nothing else touches `owner` during the call.
        let _new_file = unsafe { owner.migrate() }.unwrap();
        assert_eq!(owner.load_u64(0, Ordering::Relaxed), 11, "contents survive migration");
        other.store_u64(0, 99, Ordering::Relaxed);
        owner.store_u64(8, 7, Ordering::Relaxed);
        assert_eq!(owner.load_u64(0, Ordering::Relaxed), 11, "stale mapping no longer aliases the owner");
        assert_eq!(other.load_u64(8, Ordering::Relaxed), 0, "owner's new stores are not visible to it");
    }

    #[test]
    fn read_only_reopen_cannot_be_mapped_writable() {
        let (_owner, file) = Region::create(4096).unwrap();
        let ro = reopen_read_only(&file).unwrap();
        assert!(Region::map(&ro, 4096, false).is_ok());
        assert!(Region::map(&ro, 4096, true).is_err(), "a read-only descriptor refuses a writable shared mapping");
    }
}
