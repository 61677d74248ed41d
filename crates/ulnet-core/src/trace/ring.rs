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
//!
//! A run of identical messages is counted while it lasts, then pushed as one record. So
//! that a session stopped meanwhile still finds it, the producer mirrors the open run in
//! `open_run` (eight words under a sequence lock: odd while being rewritten); `stop` reads
//! it there after the last drain. The producer marks the run closed before it pushes its
//! record, so the writer never counts a run twice.

#[cfg(loom)]
use loom::cell::UnsafeCell;
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::slot::Slot;

/// `std::cell::UnsafeCell` with loom's access methods (same layout as `T`).
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    #[inline(always)]
    fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// `capacity` empty slots, from zeroed memory whose pages are touched now: a page fault
/// costs microseconds (10 us on the virtual machines this was measured on), which the
/// first lap of a lazily mapped ring would add to the traced thread's messages.
#[cfg(not(loom))]
fn zeroed_slots(capacity: usize) -> Box<[UnsafeCell<Slot>]> {
    let layout = std::alloc::Layout::array::<UnsafeCell<Slot>>(capacity).expect("ring size fits in memory");
    assert!(layout.size() > 0, "a ring has slots");
    // SAFETY: the layout has a non-zero size (checked). All-zero bytes are a valid `Slot`
    // (integers only; `Slot::EMPTY` is all zeros) and `UnsafeCell<Slot>` has the layout of
    // `Slot`, so the zeroed allocation holds `capacity` valid slots; the box takes
    // ownership of it with the same layout it was allocated with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<UnsafeCell<Slot>>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let mut slots: Box<[UnsafeCell<Slot>]> = Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, capacity));
        // Volatile: a compiler may drop a store of zero to memory it knows is zeroed.
        for slot in slots.iter_mut().step_by(4096 / std::mem::size_of::<Slot>()) {
            std::ptr::write_volatile(&mut slot.0.get_mut().ticks, 0);
        }
        slots
    }
}

#[cfg(loom)]
fn zeroed_slots(capacity: usize) -> Box<[UnsafeCell<Slot>]> {
    (0..capacity).map(|_| UnsafeCell::new(Slot::EMPTY)).collect()
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
    /// The producer's open run, for a `stop` that comes while it lasts.
    open_run: Padded<OpenRun>,
}

/// A copy of the open run: [`Slot::to_words`] under a sequence lock.
#[derive(Debug)]
struct OpenRun {
    /// Odd while the producer rewrites `words`.
    sequence: AtomicU32,
    open: AtomicBool,
    words: [AtomicU64; 8],
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
            slots: zeroed_slots(capacity),
            mask: capacity - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            dropped: AtomicU64::new(0),
            open_run: Padded(OpenRun {
                sequence: AtomicU32::new(0),
                open: AtomicBool::new(false),
                words: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }

    /// The producer's open run, if it has one (consumer side, after the last drain).
    /// `None` too when the producer is rewriting it at this instant.
    pub(crate) fn open_run(&self) -> Option<Slot> {
        let run = &self.open_run.0;
        for _ in 0..64 {
            let before = run.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let open = run.open.load(Ordering::Relaxed);
            let words = std::array::from_fn(|i| run.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if run.sequence.load(Ordering::Relaxed) == before {
                return open.then(|| Slot::from_words(words));
            }
        }
        None
    }

    /// Records published and not yet drained (a snapshot).
    pub(crate) fn used(&self) -> usize {
        self.tail.0.load(Ordering::Relaxed).wrapping_sub(self.head.0.load(Ordering::Relaxed))
    }

    /// Records the ring holds.
    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Records dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Copies every published record into `out` (consumer side; one consumer at a time)
    /// and returns how many.
    #[cfg(any(test, loom))]
    pub(crate) fn drain_into(&self, out: &mut Vec<Slot>) -> usize {
        self.drain_with(|s| out.push(*s))
    }

    /// Hands every published record, in order and where it lies, to `each` (consumer side;
    /// one consumer at a time), then gives the slots back; returns how many. The writer
    /// encodes straight from the ring: no copy of the records on the way to the file.
    pub(crate) fn drain_with(&self, each: impl FnMut(&Slot)) -> usize {
        self.drain_at_most(usize::MAX, each)
    }

    /// Like [`RecordRing::drain_with`], for the oldest `max` records at most: a thread that
    /// drains its own ring between messages bounds the time it takes from them.
    pub(crate) fn drain_at_most(&self, max: usize, mut each: impl FnMut(&Slot)) -> usize {
        let head = self.head.0.load(Ordering::Relaxed);
        let published = self.tail.0.load(Ordering::Acquire);
        debug_assert!(published.wrapping_sub(head) <= self.mask + 1, "the producer never overruns the consumer");
        let tail = head.wrapping_add(published.wrapping_sub(head).min(max));
        if tail == head {
            return 0;
        }
        for pos in head..tail {
            // SAFETY: slots in head..tail lie in head..published, which the producer's
            // Release store of `tail` published (read above with Acquire), and are not reused
            // until `head` passes them (after this loop), so nothing writes the slot while
            // `each` reads it.
            self.slots[pos & self.mask].with(|p| each(unsafe { &*p }));
        }
        self.head.0.store(tail, Ordering::Release);
        tail.wrapping_sub(head)
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

    /// Whether the ring holds records the consumer has not taken yet (one load of a line
    /// the consumer writes: cheap when this thread is the consumer too).
    #[inline(always)]
    pub(crate) fn has_unread(&self) -> bool {
        self.ring.head.0.load(Ordering::Relaxed) != self.tail
    }

    /// Appends a record, or drops and counts it when the ring is full. Never waits.
    #[inline(always)]
    pub(crate) fn push(&mut self, record: Slot) -> bool {
        self.push_with(|slot| *slot = record)
    }

    /// Appends the record `fill` writes into the next slot (all of its fields), or drops
    /// and counts it when the ring is full. Built in place: a record built aside and
    /// copied in stalls on the stores still in flight.
    #[inline(always)]
    pub(crate) fn push_with(&mut self, fill: impl FnOnce(&mut Slot)) -> bool {
        let ring = &*self.ring;
        if self.tail.wrapping_sub(self.head_seen) > ring.mask {
            self.head_seen = ring.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_seen) > ring.mask {
                self.dropped += 1;
                ring.dropped.store(self.dropped, Ordering::Relaxed);
                return false;
            }
        }
        // SAFETY: the slot at `tail` is outside head..tail, so the consumer does not read it
        // until our Release store below publishes it; every slot holds an initialized `Slot`.
        ring.slots[self.tail & ring.mask].with_mut(|p| fill(unsafe { &mut *p }));
        self.tail = self.tail.wrapping_add(1);
        ring.tail.0.store(self.tail, Ordering::Release);
        true
    }

    /// Appends a copy of `record`, field by field at each field's own width (or drops and
    /// counts it when the ring is full). For a record whose fields were written moments ago
    /// one by one (the recorder's staged record): a plain copy reads it in 16- or 32-byte
    /// pieces, each of which must wait until the narrower stores it overlaps have reached
    /// the cache (a failed store-to-load forwarding, a dozen cycles each); loads of each
    /// field's own width are forwarded from its store.
    #[inline(always)]
    pub(crate) fn push_fields(&mut self, record: &Slot) -> bool {
        /// A volatile read: its width is the field's (the compiler may not merge it with its
        /// neighbours into one wide load).
        macro_rules! field {
            ($f:ident) => {
                // SAFETY: a read through a pointer made from a shared reference to a live,
                // aligned, initialized field.
                unsafe { std::ptr::read_volatile(&record.$f) }
            };
        }
        self.push_with(|s| {
            s.ticks = field!(ticks);
            s.src_node = field!(src_node);
            s.dst_node = field!(dst_node);
            s.channel = field!(channel);
            s.kind = field!(kind);
            s.flags = field!(flags);
            s.buffers = field!(buffers);
            s.reserved = field!(reserved);
            s.size = field!(size);
            // SAFETY: as in `field!`, for each element of the array.
            s.buffer_len = std::array::from_fn(|i| unsafe { std::ptr::read_volatile(&record.buffer_len[i]) });
            s.request_id = field!(request_id);
            s.stage_a = field!(stage_a);
            s.stage_b = field!(stage_b);
        })
    }

    /// Mirrors a newly opened run (or its absence) where `stop` can find it.
    pub(crate) fn set_open_run(&mut self, run: Option<&Slot>) {
        let r = &self.ring.open_run.0;
        let sequence = r.sequence.load(Ordering::Relaxed);
        r.sequence.store(sequence.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        r.open.store(run.is_some(), Ordering::Relaxed);
        if let Some(run) = run {
            for (w, v) in r.words.iter().zip(run.to_words()) {
                w.store(v, Ordering::Relaxed);
            }
        }
        r.sequence.store(sequence.wrapping_add(2), Ordering::Release);
    }

    /// Sets the mirrored run's count (the word of `stage_a`, with a zero span above it).
    #[inline]
    pub(crate) fn set_open_run_count(&mut self, count: u32) {
        self.ring.open_run.0.words[7].store(u64::from(count), Ordering::Relaxed);
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
            p.push(rec(n));
        }
        assert_eq!(ring.dropped(), 2);
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out), 4);
        assert_eq!(out.iter().map(|r| r.ticks).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(p.push(rec(9)), "drained slots are reused");
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
            p.push(rec(n));
        }
        let dropped = ring.dropped();
        while !p.push(rec(u64::MAX)) {
            std::thread::yield_now();
        }
        let out = consumer.join().unwrap();
        assert!(out.windows(2).all(|w| w[0].ticks < w[1].ticks), "in order, no duplicates");
        assert!(out.iter().all(|r| r.size == r.ticks), "no torn records");
        assert_eq!(out.len() as u64 - 1 + dropped, 100_000, "kept + dropped = pushed");
    }
}

#[cfg(all(loom, test))]
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
                p.push(Slot { ticks: n, size: n, ..Slot::EMPTY });
            }
            let mut out = consumer.join().unwrap();
            ring.drain_into(&mut out);
            assert!(out.windows(2).all(|w| w[0].ticks < w[1].ticks));
            assert!(out.iter().all(|r| r.size == r.ticks));
            assert_eq!(out.len() as u64 + ring.dropped(), 3);
        });
    }
}
