//! The per-thread record ring: one producer (the traced thread), one consumer (the trace
//! writer), fixed capacity allocated up front, and a full ring drops the record and counts
//! it instead of ever waiting.
//!
//! ```text
//!   slots: [ r | r | r | . | . | . | r | r ]      capacity a power of two
//!                        ^tail (producer)  ^head (consumer)
//!   tail and head count records ever pushed / popped; slot = count & (capacity - 1)
//! ```
//!
//! The producer writes a slot, then publishes it with a Release store of `tail`; the
//! consumer reads `tail` with Acquire, copies the slots out, then gives them back with a
//! Release store of `head`, which the producer reads with Acquire before reusing a slot.
//! The producer keeps its last view of `head` and rereads it only when the ring looks full.

#[cfg(loom)]
use loom::cell::UnsafeCell;
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::slot::Slot;

#[cfg(not(loom))]
#[derive(Debug)]
struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    fn new(v: T) -> Self {
        Self(std::cell::UnsafeCell::new(v))
    }
    #[inline(always)]
    fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    #[inline(always)]
    fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Keeps the producer's and consumer's counters on separate cache lines.
#[repr(align(128))]
#[derive(Debug)]
struct Padded<T>(T);

/// A single-producer / single-consumer ring of records. See the module documentation.
#[derive(Debug)]
pub(crate) struct RecordRing {
    slots: Box<[UnsafeCell<Slot>]>,
    mask: usize,
    /// Records ever popped (written by the consumer).
    head: Padded<AtomicUsize>,
    /// Records ever pushed (written by the producer).
    tail: Padded<AtomicUsize>,
    /// Records dropped because the ring was full (written by the producer).
    dropped: AtomicU64,
}

// SAFETY: slots are shared between one producer and one consumer; the head/tail protocol
// (module documentation) gives each slot to exactly one of them at a time, with
// Release/Acquire pairs ordering the slot's contents before its hand-over.
unsafe impl Sync for RecordRing {}
// SAFETY: as above; the ring owns its records, which are plain data.
unsafe impl Send for RecordRing {}

impl RecordRing {
    /// A ring of `capacity` records (a power of two), allocated now.
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity.is_power_of_two() && capacity >= 2, "ring capacity must be a power of two >= 2");
        Self {
            slots: (0..capacity).map(|_| UnsafeCell::new(Slot::EMPTY)).collect(),
            mask: capacity - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Records dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Copies every published record into `out` (consumer side; one consumer at a time)
    /// and returns how many.
    pub(crate) fn drain_into(&self, out: &mut Vec<Slot>) -> usize {
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Acquire);
        debug_assert!(tail.wrapping_sub(head) <= self.mask + 1, "the producer never overruns the consumer");
        for pos in head..tail {
            // SAFETY: slots in head..tail were published by the producer's Release store of
            // `tail` (read above with Acquire) and are not reused until `head` passes them.
            out.push(self.slots[pos & self.mask].with(|p| unsafe { *p }));
        }
        self.head.0.store(tail, Ordering::Release);
        tail - head
    }
}

/// The producer's handle: the only one that pushes into its ring.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: std::sync::Arc<RecordRing>,
    /// Our last view of the consumer's `head`.
    head_seen: usize,
    /// Our `tail` (we are its only writer).
    tail: usize,
    /// Drops not yet added to the shared counter.
    dropped: u64,
}

impl Producer {
    /// The producer side of `ring`; there must be no other.
    pub(crate) fn new(ring: std::sync::Arc<RecordRing>) -> Self {
        let tail = ring.tail.0.load(Ordering::Relaxed);
        let head_seen = ring.head.0.load(Ordering::Acquire);
        Self { ring, head_seen, tail, dropped: 0 }
    }

    /// Appends a record, or drops and counts it when the ring is full. Never waits.
    #[inline]
    pub(crate) fn push(&mut self, record: &Slot) -> bool {
        let ring = &*self.ring;
        if self.tail.wrapping_sub(self.head_seen) > ring.mask {
            self.head_seen = ring.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_seen) > ring.mask {
                self.dropped += 1;
                ring.dropped.store(ring.dropped.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return false;
            }
        }
        // SAFETY: the slot at `tail` is outside head..tail, so the consumer does not read it
        // until our Release store below publishes it.
        ring.slots[self.tail & ring.mask].with_mut(|p| unsafe { *p = *record });
        self.tail = self.tail.wrapping_add(1);
        ring.tail.0.store(self.tail, Ordering::Release);
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(n: u64) -> Slot {
        Slot { ticks: n, size: n, ..Slot::EMPTY }
    }

    #[test]
    fn full_ring_drops_and_counts_then_recovers() {
        let ring = Arc::new(RecordRing::new(4));
        let mut p = Producer::new(ring.clone());
        for n in 0..6 {
            p.push(&rec(n));
        }
        assert_eq!(ring.dropped(), 2);
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out), 4);
        assert_eq!(out.iter().map(|r| r.ticks).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(p.push(&rec(9)), "drained slots are reused");
        out.clear();
        ring.drain_into(&mut out);
        assert_eq!(out, [rec(9)]);
    }

    #[test]
    fn concurrent_consumer_sees_every_kept_record_once_in_order() {
        let ring = Arc::new(RecordRing::new(64));
        let mut p = Producer::new(ring.clone());
        let consumer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while out.last().is_none_or(|r: &Slot| r.ticks != u64::MAX) {
                    ring.drain_into(&mut out);
                    std::hint::spin_loop();
                }
                out
            })
        };
        for n in 0..100_000u64 {
            p.push(&rec(n));
        }
        let dropped = ring.dropped();
        while !p.push(&rec(u64::MAX)) {
            std::thread::yield_now();
        }
        let out = consumer.join().unwrap();
        assert!(out.windows(2).all(|w| w[0].ticks < w[1].ticks), "in order, no duplicates");
        assert!(out.iter().all(|r| r.size == r.ticks), "no torn records");
        assert_eq!(out.len() as u64 - 1 + dropped, 100_000, "kept + dropped = pushed");
    }
}

#[cfg(loom)]
mod loom_tests {
    use super::*;
    use loom::sync::Arc as LoomArc;

    /// Under loom the ring is shared through loom's Arc only for the consumer thread; the
    /// producer uses the std Arc the handle wants.
    #[test]
    fn trace_ring_hands_over_whole_records_in_order() {
        loom::model(|| {
            let ring = std::sync::Arc::new(RecordRing::new(2));
            let shared = LoomArc::new(ring.clone());
            let consumer = loom::thread::spawn(move || {
                let mut out = Vec::new();
                for _ in 0..3 {
                    shared.drain_into(&mut out);
                    loom::thread::yield_now();
                }
                out
            });
            let mut p = Producer::new(ring.clone());
            for n in 1..=3u64 {
                p.push(&Slot { ticks: n, size: n, ..Slot::EMPTY });
            }
            let mut out = consumer.join().unwrap();
            ring.drain_into(&mut out);
            assert!(out.windows(2).all(|w| w[0].ticks < w[1].ticks));
            assert!(out.iter().all(|r| r.size == r.ticks));
            assert_eq!(out.len() as u64 + ring.dropped(), 3);
        });
    }
}
