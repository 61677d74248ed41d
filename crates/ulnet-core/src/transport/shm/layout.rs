//! The layout of one receive mapping: everything a peer needs to send to its owner.
//!
//! Each side of a shared-memory channel creates one of these in a sealed `memfd`, maps it,
//! and passes the descriptor only to the peer of that channel over a Unix socket
//! (`SCM_RIGHTS`): no name in any file system, so no third process can map it.
//!
//! ```text
//!  offset
//!  0x000  +--------------------------------------------------------------+
//!         | control block (owner writes once, before sharing)            |
//!         |  magic "ULNETSHM" | version | tag | ring/free/buffer geometry |
//!  0x080  +--------------------------------------------------------------+
//!         | owner line: ring head (u64)                                  |  owner writes
//!  0x100  +--------------------------------------------------------------+
//!         | peer line: closed flag (u64), tail hint (u64)                |  peer writes
//!  0x180  +--------------------------------------------------------------+
//!         | sleep line: owner sleeping flag (u64)                        |  read per send
//!  0x200  +--------------------------------------------------------------+
//!         | free ring: free_slots x u64  (owner -> peer buffer indices)  |
//!         +--------------------------------------------------------------+  4 KiB aligned
//!         | descriptor ring: ring_bytes (records, see ring.rs)           |  peer writes,
//!         +--------------------------------------------------------------+  owner reads+zeroes
//!         | buffers: buffer_count x buffer_size                          |  peer writes,
//!         +--------------------------------------------------------------+  owner reads
//! ```
//!
//! Lines that the two sides write are 128 bytes apart so that the adjacent-line prefetcher
//! does not make them share. The peer validates the control block against the real size of
//! the memfd before it uses any offset in it.

use super::free_ring::FreeRingPlace;
use super::mem::RingMem;
use super::ring::RingPlace;
use std::sync::atomic::Ordering;

/// "ULNETSHM" as a little-endian word.
const MAGIC: u64 = u64::from_le_bytes(*b"ULNETSHM");
/// Layout version. History: 1 — first layout.
pub(crate) const LAYOUT_VERSION: u64 = 1;

const OFF_MAGIC: usize = 0x00;
const OFF_VERSION: usize = 0x08;
const OFF_TAG: usize = 0x10;
const OFF_RING_BYTES: usize = 0x18;
const OFF_BUFFER_SIZE: usize = 0x20;
const OFF_BUFFER_COUNT: usize = 0x28;
const OFF_FREE_SLOTS: usize = 0x30;
const OFF_OWNER_USES_MEMBARRIER: usize = 0x38;
/// The owner's consumer head.
pub(crate) const OFF_RING_HEAD: usize = 0x80;

/// Set by the peer when it closes the channel cleanly (after its last record).
pub(crate) const OFF_PEER_CLOSED: usize = 0x100;
/// The peer's ring tail, updated every eighth of a ring (for the "almost full" condition).
pub(crate) const OFF_PEER_TAIL_HINT: usize = 0x108;
/// Non-zero while the owner sleeps in the kernel and wants its doorbell rung. Read by the
/// peer after every send, so it lives on a line of its own that changes only around sleeps.
pub(crate) const OFF_OWNER_SLEEPING: usize = 0x180;
const OFF_FREE_RING: usize = 0x200;

const PAGE: usize = 4096;

/// Sizes a receive mapping is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmGeometry {
    /// Bytes of the descriptor ring (a power of two, at least 4 KiB). Inline messages up to
    /// half of it are possible; the transport caps them at `inline_max`.
    pub ring_bytes: usize,
    /// Bytes of each receive buffer (a multiple of 4 KiB): the largest fragment.
    pub buffer_size: usize,
    /// Number of receive buffers (at most 65,536).
    pub buffer_count: usize,
}

impl Default for ShmGeometry {
    /// 256 KiB of ring: about 2,700 in-flight 64-byte messages, enough to keep a sender
    /// streaming while the receiver is descheduled for a time slice on a busy host.
    /// 64 x 64 KiB buffers (4 MiB): a 1 MiB message is 16 fragments and four such
    /// messages can be in flight; pages are only touched when used.
    fn default() -> Self {
        Self { ring_bytes: 256 << 10, buffer_size: 64 << 10, buffer_count: 64 }
    }
}

/// A validated layout: offsets of every part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) geometry: ShmGeometry,
    pub(crate) tag: u32,
    pub(crate) ring: RingPlace,
    pub(crate) free: FreeRingPlace,
    pub(crate) buffers_off: usize,
    pub(crate) total_len: usize,
    /// The owner puts senders in a barrier with `membarrier` before it sleeps, so senders
    /// need no fence of their own (see `sys::barrier`).
    pub(crate) owner_uses_membarrier: bool,
}

/// Why a peer's mapping was refused.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Not a ulnet mapping, or another version.
    #[error("peer mapping has bad magic or version {0}")]
    BadVersion(u64),
    /// The geometry is not one we accept.
    #[error("peer mapping geometry refused: {0}")]
    BadGeometry(&'static str),
    /// The memfd is smaller than the layout it claims.
    #[error("peer mapping is {actual} bytes, layout needs {needed}")]
    TooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes the mapping has.
        actual: usize,
    },
}

impl Layout {
    /// Computes a layout, refusing geometries outside the supported bounds.
    pub(crate) fn new(geometry: ShmGeometry, tag: u32) -> Result<Self, LayoutError> {
        let g = geometry;
        if !g.ring_bytes.is_power_of_two() || !(4096..=(1 << 30)).contains(&g.ring_bytes) {
            return Err(LayoutError::BadGeometry("ring bytes must be a power of two in 4 KiB..=1 GiB"));
        }
        if g.buffer_size == 0 || !g.buffer_size.is_multiple_of(PAGE) || g.buffer_size > (1 << 30) {
            return Err(LayoutError::BadGeometry("buffer size must be a multiple of 4 KiB up to 1 GiB"));
        }
        if g.buffer_count == 0 || g.buffer_count > 65_536 {
            return Err(LayoutError::BadGeometry("buffer count must be in 1..=65536"));
        }
        let slots = g.buffer_count.next_power_of_two();
        let ring_off = (OFF_FREE_RING + slots * 8).next_multiple_of(PAGE);
        let buffers_off = ring_off + g.ring_bytes;
        let total_len = g
            .buffer_count
            .checked_mul(g.buffer_size)
            .and_then(|b| b.checked_add(buffers_off))
            .filter(|&t| t <= (1 << 40))
            .ok_or(LayoutError::BadGeometry("mapping too large"))?;
        Ok(Self {
            geometry,
            tag,
            ring: RingPlace { ring_off, capacity: g.ring_bytes, head_off: OFF_RING_HEAD },
            free: FreeRingPlace { off: OFF_FREE_RING, slots: slots as u32 },
            buffers_off,
            total_len,
            owner_uses_membarrier: false,
        })
    }

    /// Writes the control block (before the mapping is shared).
    pub(crate) fn write_control<M: RingMem>(&self, mem: &M) {
        mem.store_u64(OFF_VERSION, LAYOUT_VERSION, Ordering::Relaxed);
        mem.store_u64(OFF_TAG, u64::from(self.tag), Ordering::Relaxed);
        mem.store_u64(OFF_RING_BYTES, self.geometry.ring_bytes as u64, Ordering::Relaxed);
        mem.store_u64(OFF_BUFFER_SIZE, self.geometry.buffer_size as u64, Ordering::Relaxed);
        mem.store_u64(OFF_BUFFER_COUNT, self.geometry.buffer_count as u64, Ordering::Relaxed);
        mem.store_u64(OFF_FREE_SLOTS, u64::from(self.free.slots), Ordering::Relaxed);
        mem.store_u64(OFF_MAGIC, MAGIC, Ordering::Release);
    }

    /// Reads and validates a peer's control block against the mapping's real size.
    pub(crate) fn read_control<M: RingMem>(mem: &M) -> Result<Self, LayoutError> {
        if mem.len() < OFF_FREE_RING {
            return Err(LayoutError::TooSmall { needed: OFF_FREE_RING, actual: mem.len() });
        }
        let magic = mem.load_u64(OFF_MAGIC, Ordering::Acquire);
        let version = mem.load_u64(OFF_VERSION, Ordering::Relaxed);
        if magic != MAGIC || version != LAYOUT_VERSION {
            return Err(LayoutError::BadVersion(version));
        }
        let field = |off| usize::try_from(mem.load_u64(off, Ordering::Relaxed)).unwrap_or(usize::MAX);
        let geometry = ShmGeometry {
            ring_bytes: field(OFF_RING_BYTES),
            buffer_size: field(OFF_BUFFER_SIZE),
            buffer_count: field(OFF_BUFFER_COUNT),
        };
        let tag = mem.load_u64(OFF_TAG, Ordering::Relaxed);
        let tag = u32::try_from(tag).map_err(|_| LayoutError::BadGeometry("tag out of range"))?;
        let mut layout = Self::new(geometry, tag)?;
        layout.owner_uses_membarrier = mem.load_u64(OFF_OWNER_USES_MEMBARRIER, Ordering::Relaxed) == 1;
        if u64::from(layout.free.slots) != mem.load_u64(OFF_FREE_SLOTS, Ordering::Relaxed) {
            return Err(LayoutError::BadGeometry("free ring slots disagree with buffer count"));
        }
        if mem.len() < layout.total_len {
            return Err(LayoutError::TooSmall { needed: layout.total_len, actual: mem.len() });
        }
        Ok(layout)
    }

    /// Offset of buffer `index` (which the caller has checked is `< buffer_count`).
    #[inline(always)]
    pub(crate) fn buffer_off(&self, index: u32) -> usize {
        debug_assert!((index as usize) < self.geometry.buffer_count);
        self.buffers_off + index as usize * self.geometry.buffer_size
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn default_geometry_is_valid_and_aligned() {
        let l = Layout::new(ShmGeometry::default(), 9).unwrap();
        assert_eq!(l.ring.ring_off % PAGE, 0);
        assert_eq!(l.buffers_off % PAGE, 0);
        assert!(l.free.off + l.free.slots as usize * 8 <= l.ring.ring_off);
        assert_eq!(l.total_len, l.buffers_off + 64 * (64 << 10));
    }

    #[test]
    fn refuses_bad_geometry() {
        for g in [
            ShmGeometry { ring_bytes: 5000, ..Default::default() },
            ShmGeometry { buffer_size: 100, ..Default::default() },
            ShmGeometry { buffer_count: 0, ..Default::default() },
            ShmGeometry { buffer_count: 1 << 20, ..Default::default() },
        ] {
            assert!(Layout::new(g, 0).is_err(), "{g:?}");
        }
    }
}
