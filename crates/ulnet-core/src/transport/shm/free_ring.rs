//! The free queue: buffer indices handed back from the receiver to the sender.
//!
//! A single-producer / single-consumer ring of 64-bit entries `lap << 32 | index`, where
//! `lap` is one more than the number of times the ring has wrapped at that slot, so a
//! zero entry or an entry from an earlier lap reads as empty. The ring never overflows:
//! it has at least as many slots as there are buffers, and the receiver only ever frees a
//! buffer the sender had taken, so it needs no head index shared back.

use super::mem::RingMem;
use std::sync::atomic::Ordering;

/// Where a free ring lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreeRingPlace {
    pub(crate) off: usize,
    /// Slots, a power of two.
    pub(crate) slots: u32,
}

fn entry(position: u64, slots: u32, index: u32) -> u64 {
    let lap = (position / u64::from(slots)) as u32 + 1;
    (u64::from(lap) << 32) | u64::from(index)
}

/// The receiver's side: pushes buffers it has finished with.
pub(crate) struct FreeRingProducer {
    place: FreeRingPlace,
    tail: u64,
}

impl FreeRingProducer {
    pub(crate) fn new(place: FreeRingPlace) -> Self {
        assert!(place.slots.is_power_of_two());
        Self { place, tail: 0 }
    }

    #[inline]
    pub(crate) fn push<M: RingMem>(&mut self, mem: &M, index: u32) {
        let slot = (self.tail & u64::from(self.place.slots - 1)) as usize;
        mem.store_u64(self.place.off + slot * 8, entry(self.tail, self.place.slots, index), Ordering::Release);
        self.tail += 1;
    }
}

/// The sender's side: takes buffers to fill.
pub(crate) struct FreeRingConsumer {
    place: FreeRingPlace,
    head: u64,
}

impl FreeRingConsumer {
    pub(crate) fn new(place: FreeRingPlace) -> Self {
        assert!(place.slots.is_power_of_two());
        Self { place, head: 0 }
    }

    /// The next free buffer index, if the receiver has returned one.
    #[inline]
    pub(crate) fn pop<M: RingMem>(&mut self, mem: &M) -> Option<u32> {
        let slot = (self.head & u64::from(self.place.slots - 1)) as usize;
        let e = mem.load_u64(self.place.off + slot * 8, Ordering::Acquire);
        let want_lap = (self.head / u64::from(self.place.slots)) as u32 + 1;
        if (e >> 32) as u32 != want_lap {
            return None;
        }
        self.head += 1;
        Some(e as u32)
    }
}

#[cfg(all(loom, test))]
mod loom_tests {
    use super::super::mem::loom_mem::LoomMem;
    use super::*;
    use loom::sync::Arc;

    /// Buffers handed back across two laps of a two-slot ring arrive exactly once, in
    /// order, and never before they were pushed.
    #[test]
    fn indices_arrive_once_in_order_across_laps() {
        loom::model(|| {
            let place = FreeRingPlace { off: 0, slots: 2 };
            let mem = Arc::new(LoomMem::new(16));
            let producer_mem = mem.clone();
            let (tx, rx) = loom::sync::mpsc::channel::<()>();
            let producer = loom::thread::spawn(move || {
                let mut p = FreeRingProducer::new(place);
                p.push(&*producer_mem, 10);
                p.push(&*producer_mem, 11);
                // The receiver frees a buffer only after the sender took one.
                rx.recv().unwrap();
                p.push(&*producer_mem, 12);
            });
            let mut c = FreeRingConsumer::new(place);
            let mut got = Vec::new();
            while got.len() < 3 {
                match c.pop(&*mem) {
                    Some(i) => {
                        got.push(i);
                        if got.len() == 1 {
                            tx.send(()).unwrap();
                        }
                    }
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert_eq!(got, vec![10, 11, 12]);
            assert_eq!(c.pop(&*mem), None, "nothing twice");
        });
    }
}
