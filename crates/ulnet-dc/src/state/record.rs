//! Writing a load record so that a one-sided copy of it is either whole or detectably
//! torn, and reading it that way.
//!
//! The owner writes (a seqlock): it makes the version odd, fences, stores the body, then
//! publishes the next even version with a Release store. A reader copies the record's
//! words with one remote READ — word by word, in no particular order with respect to the
//! owner's stores, as `Rma::get` does — and judges the copy: an odd version means the owner
//! was writing; a MAC that fails on an even version means the copy mixes two records (or
//! was not written by a key holder). Either way the reader copies again, up to
//! [`READ_TRIES`] times, and hands back the last copy for the validator to reject. The MAC
//! is the checksum that makes a single READ enough: no second read of the version is
//! needed, which over a channel would cost a second round trip.
//!
//! The loom model below checks the combination: whatever the interleaving, a copy the
//! reader accepts is exactly one record the owner wrote.

use crate::load::{ClusterKey, DecodeError, LoadRecord, SLOT_WORDS};
use crate::role::NodeIndex;

#[cfg(loom)]
use loom::sync::atomic::{fence, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, Ordering};

/// Copies a reader takes before it gives up on a record that keeps changing under it (or
/// keeps failing its MAC). 8: the owner rewrites its record every 50 ms and a write takes
/// well under a microsecond, so a second copy is almost always whole; a forged record fails
/// all eight and costs eight reads, once per look. (Two under loom, to keep the model small.)
#[cfg(not(loom))]
pub const READ_TRIES: usize = 8;
/// Copies a reader takes (loom: two, to keep the model small).
#[cfg(loom)]
pub const READ_TRIES: usize = 2;

/// The words a record lives in, as its owner sees them.
pub trait RecordCells {
    /// Loads word `i` (Acquire).
    fn load(&self, i: usize) -> u64;
    /// Stores word `i` with `order` (Relaxed or Release).
    fn store(&self, i: usize, value: u64, order: Ordering);
}

/// The version the next write of the record in `cells` must carry.
pub fn next_version(cells: &impl RecordCells) -> u64 {
    (cells.load(0) & !1) + 2
}

/// Writes `words` (word 0: [`next_version`]) into `cells`. One writer at a time: the
/// record's owner.
pub fn write(cells: &impl RecordCells, words: &[u64; SLOT_WORDS]) {
    let current = cells.load(0);
    debug_assert!(current.is_multiple_of(2), "one writer: the version is even between writes");
    assert_eq!(words[0], current + 2, "records are written in version order");
    cells.store(0, current + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    for (i, w) in words.iter().enumerate().skip(1) {
        cells.store(i, *w, Ordering::Relaxed);
    }
    cells.store(0, words[0], Ordering::Release);
}

/// What [`read`] got: the last copy, and how many copies it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    /// The copy to judge ([`crate::load::RecordValidator`] decides).
    pub words: [u64; SLOT_WORDS],
    /// Copies taken beyond the first (torn copies retried).
    pub retries: u32,
}

/// Copies `slot`'s record with `copy` until a copy is whole (even version, MAC good) or
/// [`READ_TRIES`] copies were taken.
pub fn read<E>(
    key: &ClusterKey,
    slot: NodeIndex,
    mut copy: impl FnMut() -> Result<[u64; SLOT_WORDS], E>,
) -> Result<Copied, E> {
    let mut retries = 0;
    loop {
        let words = copy()?;
        let torn = matches!(LoadRecord::decode(&words, key, slot), Err(DecodeError::Torn | DecodeError::BadMac));
        if !torn || retries + 1 >= READ_TRIES as u32 {
            return Ok(Copied { words, retries });
        }
        retries += 1;
        std::hint::spin_loop();
        #[cfg(loom)]
        loom::thread::yield_now();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::role::{Role, Tier};
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;

    struct Cells([AtomicU64; SLOT_WORDS]);

    impl RecordCells for Cells {
        fn load(&self, i: usize) -> u64 {
            self.0[i].load(Ordering::Acquire)
        }
        fn store(&self, i: usize, value: u64, order: Ordering) {
            self.0[i].store(value, order)
        }
    }

    fn record(busy_milli: u32, version: u64, key: &ClusterKey) -> [u64; SLOT_WORDS] {
        let r = LoadRecord {
            node: 1,
            incarnation: 9,
            serving: Some(Role::new(0, Tier::Proxy)),
            workers: 2,
            busy_milli,
            ..LoadRecord::default()
        };
        r.encode(key, version)
    }

    /// A copy taken word by word with relaxed loads (what a remote READ does) that the
    /// reader accepts is exactly one record the owner wrote, never a mix of two.
    #[test]
    fn loom_accepted_copies_are_never_mixed() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let key = ClusterKey::new(b"loom");
            let first = record(100, 2, &key);
            let second = record(1900, 4, &key);
            let cells = Arc::new(Cells(std::array::from_fn(|_| AtomicU64::new(0))));
            let writer = {
                let cells = cells.clone();
                loom::thread::spawn(move || {
                    write(&*cells, &first);
                    write(&*cells, &second);
                })
            };
            let got =
                read(&key, NodeIndex(1), || Ok::<_, ()>(std::array::from_fn(|i| cells.0[i].load(Ordering::Relaxed))))
                    .unwrap();
            if LoadRecord::decode(&got.words, &key, NodeIndex(1)).is_ok() {
                assert!(got.words == first || got.words == second, "accepted a mixed copy {:?}", got.words);
            }
            writer.join().unwrap();
        });
    }
}
