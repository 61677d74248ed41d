//! A load-record slot: a seqlock over [`SLOT_WORDS`] atomic words.
//!
//! The owner writes; any number of readers copy. Store order (the loom model below checks
//! it): the owner makes the version odd, fences, stores the body, then publishes the even
//! version with a Release store. A reader loads the version (Acquire), copies the body,
//! fences (Acquire) and loads the version again: equal and even means the copy is whole.
//! The body is atomics too, so a racing copy is a stale value, never undefined behaviour.

use crate::load::SLOT_WORDS;

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Copies a reader tries before it hands back a torn copy. (Two under loom, to keep the
/// model's state space small; a retry is the same code either way.)
#[cfg(not(loom))]
pub const READ_TRIES: usize = 8;
#[cfg(loom)]
pub const READ_TRIES: usize = 2;

/// One record's words, one cache line.
#[repr(C, align(64))]
pub struct Slot {
    words: [AtomicU64; SLOT_WORDS],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Slot>() == 64, "a slot is one cache line");

impl Default for Slot {
    fn default() -> Self {
        Slot { words: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl Slot {
    /// The version the slot holds now (for the owner, the only writer).
    pub fn version(&self) -> u64 {
        self.words[0].load(Ordering::Relaxed)
    }

    /// Writes a whole record whose word 0 is the next even version. Owner only.
    pub fn write(&self, record: &[u64; SLOT_WORDS]) {
        let current = self.words[0].load(Ordering::Relaxed);
        debug_assert!(current.is_multiple_of(2), "only the owner writes, so the version is even between writes");
        assert_eq!(record[0], current + 2, "records are written in version order");
        self.words[0].store(current + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words[1..].iter().zip(&record[1..]) {
            w.store(*v, Ordering::Relaxed);
        }
        self.words[0].store(record[0], Ordering::Release);
    }

    /// A copy of the record: whole if its version is even (the validator checks the MAC
    /// too); after [`READ_TRIES`] racing copies, the last one, version odd.
    pub fn read(&self) -> [u64; SLOT_WORDS] {
        let mut copy = [0u64; SLOT_WORDS];
        for _ in 0..READ_TRIES {
            let before = self.words[0].load(Ordering::Acquire);
            for (c, w) in copy[1..].iter_mut().zip(&self.words[1..]) {
                *c = w.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            let after = self.words[0].load(Ordering::Relaxed);
            copy[0] = before;
            if before == after && before.is_multiple_of(2) {
                return copy;
            }
            copy[0] = before | 1;
            std::hint::spin_loop();
            #[cfg(loom)]
            loom::thread::yield_now();
        }
        copy
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    fn record(version: u64, fill: u64) -> [u64; SLOT_WORDS] {
        let mut r = [fill; SLOT_WORDS];
        r[0] = version;
        r
    }

    /// A whole copy is always exactly one record the owner wrote, never a mix.
    #[test]
    fn loom_slot_copies_are_never_mixed() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let slot = Arc::new(Slot::default());
            let writer = {
                let slot = slot.clone();
                loom::thread::spawn(move || {
                    slot.write(&record(2, 11));
                    slot.write(&record(4, 22));
                })
            };
            let copy = slot.read();
            if copy[0].is_multiple_of(2) {
                let expect = match copy[0] {
                    0 => 0,
                    2 => 11,
                    4 => 22,
                    v => panic!("version {v} was never written"),
                };
                assert!(copy[1..].iter().all(|w| *w == expect), "mixed copy {copy:?}");
            }
            writer.join().unwrap();
        });
    }
}
