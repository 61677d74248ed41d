//! The control block of one mapped import: how an owner keeps authority over a segment an
//! importer on the same host has mapped and accesses with plain loads, stores and atomics.
//!
//! The owner creates one block per mapped import in a sealed `memfd` and passes it with the
//! segment over the rendezvous socket; both map it.
//!
//! ```text
//!  offset
//!  0x000 +------------------------------------------------------------+
//!        | magic "ULNETRMC" | version | segment | generation |          |  owner writes once,
//!        | owner_uses_membarrier | ring slots | importer node         |  before sharing
//!  0x080 +------------------------------------------------------------+
//!        | state: live generation (low 32) | notify mode (bits 32..40),  |  owner writes
//!        |        or 0 once revoked: one load tells both                 |
//!  0x100 +------------------------------------------------------------+
//!        | busy: 1 while the importer stores into the segment          |  importer writes
//!  0x180 +------------------------------------------------------------+
//!        | notification ring head                                      |  owner writes
//!  0x200 +------------------------------------------------------------+
//!        | notifications lost (ring full)                              |  importer writes
//!  0x400 +------------------------------------------------------------+
//!        | notification ring: slots x 32-byte records                  |  importer writes,
//!        |   stamp (position + 1, published last) | op | len | offset  |  owner reads
//!  0x1000+------------------------------------------------------------+
//! ```
//!
//! Lines written by different sides are 128 bytes apart. The busy/state pair is a Dekker
//! handshake: the importer stores `busy = 1`, then loads `state`; the owner stores
//! `state = 0`, then loads `busy`. With a full barrier between the store and the load on
//! both sides, at least one sees the other: either the importer sees the revocation and
//! stops, or the owner sees it busy and waits for it. The importer's barrier is only a
//! compiler fence when both processes use `membarrier` (the owner's expedited membarrier
//! then runs the barrier on the importer's CPU for it, see `sys::barrier`).

use crate::transport::shm::mem::{MappedMem, RingMem};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"ULNETRMC");
/// Layout version. History: 1 — first layout; 2 — the notify mode moved into the state
/// word (one load per operation tells an importer both), its own word retired.
const VERSION: u64 = 2;

const OFF_MAGIC: usize = 0x00;
const OFF_VERSION: usize = 0x08;
const OFF_SEGMENT: usize = 0x10;
const OFF_GENERATION: usize = 0x18;
const OFF_OWNER_USES_MEMBARRIER: usize = 0x20;
const OFF_RING_SLOTS: usize = 0x28;
const OFF_IMPORTER: usize = 0x30;
const OFF_STATE: usize = 0x80;
const OFF_BUSY: usize = 0x100;
const OFF_RING_HEAD: usize = 0x180;
const OFF_LOST: usize = 0x200;
const OFF_RING: usize = 0x400;
const RECORD_LEN: usize = 32;

/// Notification records per import. 64: the owner drains them whenever it polls; a burst
/// of more notifying accesses than this between two polls loses the excess, counted.
pub(crate) const RING_SLOTS: usize = 64;
/// Bytes of a control block.
pub(crate) const BLOCK_LEN: usize = 4096;

const _: () = assert!(OFF_RING + RING_SLOTS * RECORD_LEN <= BLOCK_LEN, "the ring fits the block");
const _: () = assert!(RING_SLOTS.is_power_of_two());

/// What the owner writes once into a new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockInfo {
    pub(crate) segment: u32,
    pub(crate) generation: u32,
    pub(crate) importer: u32,
    pub(crate) owner_uses_membarrier: bool,
}

/// Writes the header and the live state of a new block (before it is shared).
pub(crate) fn init<M: RingMem>(mem: &M, info: BlockInfo, notify_mode: u8) {
    mem.store_u64(OFF_VERSION, VERSION, Ordering::Relaxed);
    mem.store_u64(OFF_SEGMENT, u64::from(info.segment), Ordering::Relaxed);
    mem.store_u64(OFF_GENERATION, u64::from(info.generation), Ordering::Relaxed);
    mem.store_u64(OFF_OWNER_USES_MEMBARRIER, u64::from(info.owner_uses_membarrier), Ordering::Relaxed);
    mem.store_u64(OFF_RING_SLOTS, RING_SLOTS as u64, Ordering::Relaxed);
    mem.store_u64(OFF_IMPORTER, u64::from(info.importer), Ordering::Relaxed);
    mem.store_u64(OFF_STATE, live_state(info.generation, notify_mode), Ordering::Relaxed);
    mem.store_u64(OFF_MAGIC, MAGIC, Ordering::Release);
}

/// Reads and validates a block received from an owner.
pub(crate) fn read_info<M: RingMem>(mem: &M) -> Option<BlockInfo> {
    if mem.len() < BLOCK_LEN
        || mem.load_u64(OFF_MAGIC, Ordering::Acquire) != MAGIC
        || mem.load_u64(OFF_VERSION, Ordering::Relaxed) != VERSION
        || mem.load_u64(OFF_RING_SLOTS, Ordering::Relaxed) != RING_SLOTS as u64
    {
        return None;
    }
    let field = |off| u32::try_from(mem.load_u64(off, Ordering::Relaxed)).ok();
    Some(BlockInfo {
        segment: field(OFF_SEGMENT)?,
        generation: field(OFF_GENERATION)?,
        importer: field(OFF_IMPORTER)?,
        owner_uses_membarrier: mem.load_u64(OFF_OWNER_USES_MEMBARRIER, Ordering::Relaxed) == 1,
    })
}

/// The state word of a live import: its generation and the owner's notify mode.
#[inline(always)]
pub(crate) fn live_state(generation: u32, notify_mode: u8) -> u64 {
    debug_assert_ne!(generation, 0, "generation 0 means revoked");
    u64::from(generation) | (u64::from(notify_mode) << 32)
}

/// The generation a state word holds (0 once revoked).
#[inline(always)]
pub(crate) fn state_generation(state: u64) -> u32 {
    state as u32
}

/// The notify mode a state word holds, as its wire byte.
#[inline(always)]
pub(crate) fn state_notify_mode(state: u64) -> u8 {
    (state >> 32) as u8
}

/// The state word: live generation and notify mode, or 0 once revoked (the importer
/// reads it through [`ImporterWords`]).
#[cfg(all(test, not(loom)))]
pub(crate) fn state<M: RingMem>(mem: &M) -> u64 {
    mem.load_u64(OFF_STATE, Ordering::Acquire)
}

/// Owner: changes the notify mode the importer honours (a revoked block stays revoked).
pub(crate) fn set_notify_mode(mem: &MappedMem, mode: u8) {
    let word = mem.word(OFF_STATE);
    let mut current = word.load(Ordering::Acquire);
    while state_generation(current) != 0 {
        let next = live_state(state_generation(current), mode);
        match word.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(seen) => current = seen,
        }
    }
}

/// Owner: revokes the import. The caller runs a full (or membarrier) barrier before it
/// reads [`busy`].
pub(crate) fn revoke<M: RingMem>(mem: &M) {
    mem.store_u64(OFF_STATE, 0, Ordering::SeqCst);
}

/// Owner: whether the importer is inside a store right now.
#[inline]
pub(crate) fn busy<M: RingMem>(mem: &M) -> bool {
    mem.load_u64(OFF_BUSY, Ordering::SeqCst) != 0
}

/// The importer's direct handles on the two words of its block that every operation
/// touches (state, and busy for stores), taken once at import, so that the per-operation
/// path has no offset arithmetic and no bounds check left.
pub(crate) struct ImporterWords {
    state: NonNull<AtomicU64>,
    busy: NonNull<AtomicU64>,
}

// SAFETY: the pointers lead into a shared mapping that is only ever accessed atomically;
// moving the handle to another thread moves no data.
unsafe impl Send for ImporterWords {}

impl ImporterWords {
    /// Handles on `block`'s words. The caller keeps `block` mapped as long as these live
    /// (the mapped import owns both).
    pub(crate) fn new(block: &MappedMem) -> Self {
        assert!(block.len() >= BLOCK_LEN, "a control block is {BLOCK_LEN} bytes");
        Self { state: NonNull::from(block.word(OFF_STATE)), busy: NonNull::from(block.word(OFF_BUSY)) }
    }

    #[inline(always)]
    fn state_word(&self) -> &AtomicU64 {
        // SAFETY: points into the block, mapped for as long as `self` lives (see `new`),
        // aligned (checked by `MappedMem::word`), and accessed only atomically.
        unsafe { self.state.as_ref() }
    }

    #[inline(always)]
    fn busy_word(&self) -> &AtomicU64 {
        // SAFETY: as for `state_word`.
        unsafe { self.busy.as_ref() }
    }

    /// The state word (Acquire): live generation and notify mode, or 0 once revoked.
    #[inline(always)]
    pub(crate) fn state(&self) -> u64 {
        self.state_word().load(Ordering::Acquire)
    }

    /// Enters a store: returns the state word if the import is still live at
    /// `generation`; if not, it has already left again. (The Dekker half of the importer:
    /// busy = 1, barrier, load state.)
    #[inline(always)]
    pub(crate) fn enter(&self, generation: u32, fence_only_compiler: bool) -> Option<u64> {
        self.busy_word().store(1, Ordering::Relaxed);
        crate::sys::barrier::sender_barrier(fence_only_compiler);
        let state = self.state();
        if state_generation(state) != generation {
            self.busy_word().store(0, Ordering::Release);
            return None;
        }
        Some(state)
    }

    /// Leaves a store; everything it stored is ordered before.
    #[inline(always)]
    pub(crate) fn leave(&self) {
        self.busy_word().store(0, Ordering::Release);
    }
}

/// Notifications lost to a full ring, as counted by the importer.
pub(crate) fn lost<M: RingMem>(mem: &M) -> u64 {
    mem.load_u64(OFF_LOST, Ordering::Relaxed)
}

/// One notification record: what kind of access, where, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) op: u8,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

/// Where a notification ring lives in its block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingPlace {
    head_off: usize,
    lost_off: usize,
    ring_off: usize,
    slots: usize,
}

impl RingPlace {
    #[inline(always)]
    fn record_off(&self, position: u64) -> usize {
        self.ring_off + (position as usize & (self.slots - 1)) * RECORD_LEN
    }
}

/// The ring of a control block.
pub(crate) const RING: RingPlace =
    RingPlace { head_off: OFF_RING_HEAD, lost_off: OFF_LOST, ring_off: OFF_RING, slots: RING_SLOTS };

/// The importer's end of the notification ring.
pub(crate) struct NotifyProducer {
    place: RingPlace,
    tail: u64,
    head_seen: u64,
    lost: u64,
}

impl NotifyProducer {
    pub(crate) fn new(place: RingPlace) -> Self {
        assert!(place.slots.is_power_of_two());
        Self { place, tail: 0, head_seen: 0, lost: 0 }
    }

    /// Publishes a record; returns `false` (and counts it) if the ring is full.
    pub(crate) fn push<M: RingMem>(&mut self, mem: &M, r: Record) -> bool {
        let slots = self.place.slots as u64;
        if self.tail - self.head_seen >= slots {
            self.head_seen = mem.load_u64(self.place.head_off, Ordering::Acquire);
            if self.tail - self.head_seen >= slots {
                self.lost += 1;
                mem.store_u64(self.place.lost_off, self.lost, Ordering::Relaxed);
                return false;
            }
        }
        let at = self.place.record_off(self.tail);
        mem.store_u64(at + 8, u64::from(r.op) | (u64::from(r.len) << 32), Ordering::Relaxed);
        mem.store_u64(at + 16, r.offset, Ordering::Relaxed);
        self.tail += 1;
        mem.store_u64(at, self.tail, Ordering::Release);
        true
    }
}

/// The owner's end of the notification ring.
pub(crate) struct NotifyConsumer {
    place: RingPlace,
    head: u64,
}

impl NotifyConsumer {
    pub(crate) fn new(place: RingPlace) -> Self {
        assert!(place.slots.is_power_of_two());
        Self { place, head: 0 }
    }

    /// The next record, if the importer has published one. Fields the importer wrote are
    /// only data to report, never used as offsets into anything.
    pub(crate) fn pop<M: RingMem>(&mut self, mem: &M) -> Option<Record> {
        let at = self.place.record_off(self.head);
        if mem.load_u64(at, Ordering::Acquire) != self.head + 1 {
            return None;
        }
        let w1 = mem.load_u64(at + 8, Ordering::Relaxed);
        let offset = mem.load_u64(at + 16, Ordering::Relaxed);
        self.head += 1;
        mem.store_u64(self.place.head_off, self.head, Ordering::Release);
        Some(Record { op: w1 as u8, len: (w1 >> 32) as u32, offset })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::transport::shm::mem::MappedMem;

    fn block() -> MappedMem {
        let file = crate::sys::memfd::create_sealed("test-control", BLOCK_LEN).unwrap();
        MappedMem::map(&file).unwrap()
    }

    #[test]
    fn header_round_trips_and_state_follows_revocation() {
        let mem = block();
        let info = BlockInfo { segment: 3, generation: 9, importer: 4, owner_uses_membarrier: true };
        init(&mem, info, 2);
        assert_eq!(read_info(&mem), Some(info));
        assert_eq!((state_generation(state(&mem)), state_notify_mode(state(&mem))), (9, 2));
        set_notify_mode(&mem, 1);
        assert_eq!((state_generation(state(&mem)), state_notify_mode(state(&mem))), (9, 1));
        let words = ImporterWords::new(&mem);
        assert_eq!(words.enter(9, false), Some(live_state(9, 1)));
        assert!(busy(&mem));
        words.leave();
        assert!(!busy(&mem));
        assert_eq!(words.enter(8, false), None, "another generation cannot be entered");
        revoke(&mem);
        assert_eq!(words.enter(9, false), None, "a revoked import cannot be entered");
        assert!(!busy(&mem), "a refused entry leaves again");
        set_notify_mode(&mem, 2);
        assert_eq!(state(&mem), 0, "a revoked block stays revoked when the mode changes");
    }

    #[test]
    fn ring_delivers_in_order_and_counts_what_does_not_fit() {
        let mem = block();
        let (mut p, mut c) = (NotifyProducer::new(RING), NotifyConsumer::new(RING));
        for i in 0..RING_SLOTS as u64 + 5 {
            p.push(&mem, Record { op: 2, len: i as u32, offset: i * 8 });
        }
        assert_eq!(lost(&mem), 5);
        for i in 0..RING_SLOTS as u64 {
            assert_eq!(c.pop(&mem), Some(Record { op: 2, len: i as u32, offset: i * 8 }));
        }
        assert_eq!(c.pop(&mem), None);
        assert!(p.push(&mem, Record { op: 1, len: 1, offset: 1 }), "space comes back once consumed");
        assert_eq!(c.pop(&mem), Some(Record { op: 1, len: 1, offset: 1 }));
    }
}

#[cfg(all(loom, test))]
mod loom_tests {
    use super::*;
    use crate::transport::shm::mem::loom_mem::LoomMem;
    use loom::sync::Arc;

    /// Three records into a two-slot ring while the owner drains: whatever the
    /// interleaving, the ones published reach the owner exactly once, in order, with the
    /// fields the importer wrote, and a full ring refuses (counted) rather than overwrites.
    #[test]
    fn notification_ring_loom() {
        const PLACE: RingPlace = RingPlace { head_off: 0, lost_off: 8, ring_off: 16, slots: 2 };
        loom::model(|| {
            let mem = Arc::new(LoomMem::new(16 + 2 * RECORD_LEN));
            let producer_mem = mem.clone();
            let producer = loom::thread::spawn(move || {
                let mut p = NotifyProducer::new(PLACE);
                let mut pushed = 0;
                for i in 0..3u64 {
                    if p.push(&*producer_mem, Record { op: 1, len: i as u32, offset: 100 + i }) {
                        pushed += 1;
                    }
                }
                pushed
            });
            let mut c = NotifyConsumer::new(PLACE);
            let mut got = Vec::new();
            for _ in 0..2 {
                if let Some(r) = c.pop(&*mem) {
                    got.push(r);
                }
            }
            let pushed = producer.join().unwrap();
            while let Some(r) = c.pop(&*mem) {
                got.push(r);
            }
            assert_eq!(got.len(), pushed);
            for (i, r) in got.iter().enumerate() {
                assert_eq!((r.len, r.offset), (i as u32, 100 + i as u64), "in order, whole");
            }
        });
    }
}
