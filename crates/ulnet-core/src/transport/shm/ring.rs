//! The descriptor ring: a lock-free single-producer / single-consumer ring of
//! variable-length records in shared memory.
//!
//! ```text
//!            consumer releases here (head, Release)     producer writes here (tail)
//!                      v                                        v
//!  +------+----------+--------------+---------+-------------+----+------------------+
//!  | 0000 | consumed | hdr|payload  | hdr|ref | hdr|payload | 00 |  zeroed space    |
//!  +------+----------+--------------+---------+-------------+----+------------------+
//!  0                                                                           capacity
//! ```
//!
//! * Records (see [`crate::descriptor`]) are 16-byte aligned and never wrap: when one does
//!   not fit before the end, the producer writes a `Padding` record to the end.
//! * Publication: the producer writes the payload and header word 1, then header word 0
//!   with a Release store. Word 0 is never zero once published, so the consumer needs no
//!   shared tail index: it Acquire-loads word 0 at its head and sees either zero or a
//!   complete record. A half-written record is never visible, which is why a producer
//!   that dies mid-message cannot corrupt its peer.
//! * Release: the consumer zeroes each record it consumed (so an old payload can never be
//!   read as a new header) and then Release-stores its head. The producer reads the head
//!   only when its cached copy says the ring is full.
//! * The consumer trusts nothing: a header whose stamp or length does not fit its position
//!   is reported as [`RingError::Corrupt`] and no memory outside the ring is touched.

use super::mem::RingMem;
use crate::descriptor::{record_len, stamp_for, RecordHeader, RecordKind, HEADER_LEN, RECORD_ALIGN};
use std::sync::atomic::Ordering;

/// Where a ring lives in a shared region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingPlace {
    /// Offset of the first record byte.
    pub(crate) ring_off: usize,
    /// Capacity in bytes, a power of two.
    pub(crate) capacity: usize,
    /// Offset of the consumer's head word (on its own cache line).
    pub(crate) head_off: usize,
}

/// A header the consumer refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The record at the head does not belong there: wrong stamp, kind or length.
    #[error("corrupt ring record at stream position {position}: {why}")]
    Corrupt {
        /// Stream position of the record.
        position: u64,
        /// What was wrong.
        why: &'static str,
    },
}

/// The producing side. Owns the tail.
pub(crate) struct RingProducer {
    place: RingPlace,
    tail: u64,
    cached_head: u64,
}

/// Where the producer may write one record.
#[derive(Debug)]
pub(crate) struct Reservation {
    /// Offset of the record in the region.
    pub(crate) record_off: usize,
    /// Stream position of the record.
    pub(crate) position: u64,
    /// Bytes the record occupies.
    pub(crate) len: usize,
}

impl RingProducer {
    pub(crate) fn new(place: RingPlace) -> Self {
        assert!(place.capacity.is_power_of_two() && place.capacity >= 4 * RECORD_ALIGN);
        Self { place, tail: 0, cached_head: 0 }
    }

    /// Largest payload a single record may carry.
    pub(crate) fn max_payload(&self) -> usize {
        self.place.capacity / 2 - HEADER_LEN
    }

    /// Reserves room for a record with `payload_len` bytes after the header, writing a
    /// padding record first when the record would not fit before the end of the ring.
    /// `None` when the ring is full (back-pressure, not an error).
    #[inline]
    pub(crate) fn reserve<M: RingMem>(&mut self, mem: &M, payload_len: usize) -> Option<Reservation> {
        debug_assert!(payload_len <= self.max_payload(), "record larger than half the ring");
        let len = record_len(payload_len);
        let cap = self.place.capacity as u64;
        let off = (self.tail & (cap - 1)) as usize;
        let to_end = self.place.capacity - off;
        let needed = if len <= to_end { len } else { to_end + len } as u64;
        if self.tail + needed - self.cached_head > cap {
            self.refresh_head(mem);
            if self.tail + needed - self.cached_head > cap {
                return None;
            }
        }
        if len > to_end {
            let pad = RecordHeader {
                stamp: stamp_for(self.tail),
                payload_len: (to_end - HEADER_LEN) as u32,
                tag: 0,
                kind: RecordKind::Padding,
                flags: 0,
            };
            self.publish_header(mem, self.place.ring_off + off, pad);
            self.tail += to_end as u64;
            return Some(Reservation { record_off: self.place.ring_off, position: self.tail, len });
        }
        Some(Reservation { record_off: self.place.ring_off + off, position: self.tail, len })
    }

    /// Publishes a record whose payload has been written: word 1, then word 0 (Release).
    #[inline(always)]
    pub(crate) fn commit<M: RingMem>(&mut self, mem: &M, r: Reservation, header: RecordHeader) {
        debug_assert_eq!(r.position, self.tail, "commit out of order");
        debug_assert_eq!(header.stamp, stamp_for(r.position));
        self.publish_header(mem, r.record_off, header);
        self.tail += r.len as u64;
    }

    /// Re-reads the consumer's head. A head outside `[cached_head, tail]` can only come from
    /// a peer writing where it must not; it is ignored (the peer only hurts its own sends).
    pub(crate) fn refresh_head<M: RingMem>(&mut self, mem: &M) {
        let head = mem.load_u64(self.place.head_off, Ordering::Acquire);
        if head >= self.cached_head && head <= self.tail {
            self.cached_head = head;
        }
    }

    #[inline(always)]
    fn publish_header<M: RingMem>(&self, mem: &M, off: usize, header: RecordHeader) {
        let [w0, w1] = header.encode();
        mem.store_u64(off + 8, w1, Ordering::Relaxed);
        mem.store_u64(off, w0, Ordering::Release);
    }

    /// Bytes published and not yet released by the consumer, as last seen.
    pub(crate) fn in_flight(&self) -> u64 {
        self.tail - self.cached_head
    }

    /// Stream position of the next record.
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }
}

/// A record the consumer found at its head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    pub(crate) header: RecordHeader,
    /// Offset of the record (its header) in the region.
    pub(crate) record_off: usize,
    /// Bytes the record occupies.
    pub(crate) len: usize,
}

/// The consuming side. Owns the head.
///
/// Consumed records are zeroed and handed back to the producer in [`RingConsumer::release`],
/// not as they are consumed: zeroing turns lines the producer just wrote into our own
/// modified lines, and those stores, drained in order, would delay whatever we send next
/// (the reply of a ping-pong) by a cache-line round trip. The owner releases when it is idle
/// or when an eighth of the ring waits to be released.
pub(crate) struct RingConsumer {
    place: RingPlace,
    /// Next record to consume.
    head: u64,
    /// Everything before this is zeroed and published to the producer.
    released: u64,
}

impl RingConsumer {
    pub(crate) fn new(place: RingPlace) -> Self {
        assert!(place.capacity.is_power_of_two() && place.capacity >= 4 * RECORD_ALIGN);
        Self { place, head: 0, released: 0 }
    }

    /// Stream position of the next record to consume.
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// Bytes consumed but not yet released to the producer.
    pub(crate) fn unreleased(&self) -> u64 {
        self.head - self.released
    }

    /// Looks at the record at the head without consuming it. Padding is consumed silently.
    #[inline]
    pub(crate) fn peek<M: RingMem>(&mut self, mem: &M) -> Result<Option<Record>, RingError> {
        loop {
            if self.head >= self.released + self.place.capacity as u64 {
                // A whole ring consumed since the last release: the producer cannot have
                // written here (it stops at our published head plus one ring), and what is
                // here is a consumed record of the previous lap, not yet zeroed.
                return Ok(None);
            }
            let off = (self.head & (self.place.capacity as u64 - 1)) as usize;
            let record_off = self.place.ring_off + off;
            let w0 = mem.load_u64(record_off, Ordering::Acquire);
            if w0 == 0 {
                return Ok(None);
            }
            let w1 = mem.load_u64(record_off + 8, Ordering::Relaxed);
            let corrupt = |why| RingError::Corrupt { position: self.head, why };
            let header = RecordHeader::decode([w0, w1]).map_err(|_| corrupt("undecodable header"))?;
            if header.stamp != stamp_for(self.head) {
                return Err(corrupt("stamp does not match position"));
            }
            let to_end = self.place.capacity - off;
            let payload_len = header.payload_len as usize;
            if header.kind == RecordKind::Padding {
                if payload_len != to_end - HEADER_LEN {
                    return Err(corrupt("padding does not reach the end of the ring"));
                }
                self.consume(Record { header, record_off, len: to_end });
                continue;
            }
            let len = record_len(payload_len);
            if payload_len > self.place.capacity / 2 || len > to_end {
                return Err(corrupt("record length out of bounds"));
            }
            return Ok(Some(Record { header, record_off, len }));
        }
    }

    /// Consumes the record at the head (the caller is done with its bytes).
    #[inline]
    pub(crate) fn consume(&mut self, record: Record) {
        debug_assert_eq!(
            record.record_off,
            self.place.ring_off + (self.head & (self.place.capacity as u64 - 1)) as usize
        );
        self.head += record.len as u64;
    }

    /// Zeroes every consumed record and makes the space available to the producer
    /// (Release store of the head).
    pub(crate) fn release<M: RingMem>(&mut self, mem: &M) {
        if self.released == self.head {
            return;
        }
        let cap = self.place.capacity as u64;
        while self.released < self.head {
            let off = (self.released & (cap - 1)) as usize;
            let len = ((self.head - self.released) as usize).min(self.place.capacity - off);
            mem.zero(self.place.ring_off + off, len);
            self.released += len as u64;
        }
        mem.store_u64(self.place.head_off, self.head, Ordering::Release);
    }

    /// Whether a record is waiting at the head (one Acquire load; no validation).
    #[inline(always)]
    pub(crate) fn is_ready<M: RingMem>(&self, mem: &M) -> bool {
        if self.head >= self.released + self.place.capacity as u64 {
            return false;
        }
        let off = (self.head & (self.place.capacity as u64 - 1)) as usize;
        mem.load_u64(self.place.ring_off + off, Ordering::Acquire) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A heap region standing in for a mapping (single-threaded tests).
    struct HeapMem(Vec<std::sync::atomic::AtomicU64>);
    impl RingMem for HeapMem {
        fn len(&self) -> usize {
            self.0.len() * 8
        }
        fn load_u64(&self, off: usize, o: Ordering) -> u64 {
            self.0[off / 8].load(o)
        }
        fn store_u64(&self, off: usize, v: u64, o: Ordering) {
            self.0[off / 8].store(v, o)
        }
        fn write_bytes(&self, off: usize, src: &[u8]) {
            for (i, b) in src.iter().enumerate() {
                let w = &self.0[(off + i) / 8];
                let shift = ((off + i) % 8) * 8;
                let old = w.load(Ordering::Relaxed);
                w.store((old & !(0xff << shift)) | (u64::from(*b) << shift), Ordering::Relaxed);
            }
        }
        fn read_bytes(&self, off: usize, dst: &mut [u8]) {
            for (i, b) in dst.iter_mut().enumerate() {
                *b = (self.0[(off + i) / 8].load(Ordering::Relaxed) >> (((off + i) % 8) * 8)) as u8;
            }
        }
        fn zero(&self, off: usize, len: usize) {
            self.write_bytes(off, &vec![0; len]);
        }
    }

    const PLACE: RingPlace = RingPlace { ring_off: 64, capacity: 256, head_off: 0 };

    fn mem() -> HeapMem {
        HeapMem((0..(64 + 256) / 8).map(|_| std::sync::atomic::AtomicU64::new(0)).collect())
    }

    fn push(p: &mut RingProducer, m: &HeapMem, payload: &[u8]) -> bool {
        match p.reserve(m, payload.len()) {
            None => false,
            Some(r) => {
                m.write_bytes(r.record_off + HEADER_LEN, payload);
                let h = RecordHeader {
                    stamp: stamp_for(r.position),
                    payload_len: payload.len() as u32,
                    tag: 7,
                    kind: RecordKind::Inline,
                    flags: 0,
                };
                p.commit(m, r, h);
                true
            }
        }
    }

    fn pop(c: &mut RingConsumer, m: &HeapMem) -> Option<Vec<u8>> {
        let rec = c.peek(m).expect("valid ring")?;
        let mut out = vec![0; rec.header.payload_len as usize];
        m.read_bytes(rec.record_off + HEADER_LEN, &mut out);
        c.consume(rec);
        c.release(m);
        Some(out)
    }

    #[test]
    fn wraps_around_with_padding_and_keeps_order() {
        let m = mem();
        let (mut p, mut c) = (RingProducer::new(PLACE), RingConsumer::new(PLACE));
        for i in 0..1000u32 {
            let payload: Vec<u8> = (0..(i % 48) as u8).map(|b| b ^ i as u8).collect();
            assert!(push(&mut p, &m, &payload));
            assert_eq!(pop(&mut c, &m), Some(payload));
        }
        assert_eq!(pop(&mut c, &m), None);
    }

    #[test]
    fn full_ring_refuses_until_released() {
        let m = mem();
        let (mut p, mut c) = (RingProducer::new(PLACE), RingConsumer::new(PLACE));
        let mut pushed = 0;
        while push(&mut p, &m, &[pushed as u8; 40]) {
            pushed += 1;
        }
        assert_eq!(pushed, 256 / 64, "four 64-byte records fill a 256-byte ring");
        assert!(pop(&mut c, &m).is_some());
        assert!(push(&mut p, &m, &[9; 40]), "space returns after release");
    }

    #[test]
    fn consuming_a_whole_lap_before_releasing_reads_no_stale_record() {
        let m = mem();
        let (mut p, mut c) = (RingProducer::new(PLACE), RingConsumer::new(PLACE));
        while push(&mut p, &m, &[5; 48]) {}
        let mut n = 0;
        while let Some(rec) = c.peek(&m).expect("never corrupt") {
            c.consume(rec);
            n += 1;
        }
        assert_eq!(n, 256 / 64);
        assert!(!c.is_ready(&m));
        c.release(&m);
        assert!(push(&mut p, &m, &[6; 48]));
        assert_eq!(pop(&mut c, &m), Some(vec![6; 48]));
    }

    #[test]
    fn rejects_forged_headers() {
        let m = mem();
        let mut c = RingConsumer::new(PLACE);
        let forged = RecordHeader { stamp: stamp_for(16), payload_len: 8, tag: 0, kind: RecordKind::Inline, flags: 0 };
        let [w0, w1] = forged.encode();
        m.store_u64(PLACE.ring_off + 8, w1, Ordering::Relaxed);
        m.store_u64(PLACE.ring_off, w0, Ordering::Release);
        assert!(matches!(c.peek(&m), Err(RingError::Corrupt { why: "stamp does not match position", .. })));
        let huge =
            RecordHeader { stamp: stamp_for(0), payload_len: u32::MAX, tag: 0, kind: RecordKind::Inline, flags: 0 };
        let [w0, _] = huge.encode();
        m.store_u64(PLACE.ring_off, w0, Ordering::Release);
        assert!(matches!(c.peek(&m), Err(RingError::Corrupt { why: "record length out of bounds", .. })));
    }
}

#[cfg(all(loom, test))]
mod loom_tests {
    use super::super::mem::loom_mem::LoomMem;
    use super::*;
    use loom::sync::Arc;

    const PLACE: RingPlace = RingPlace { ring_off: 64, capacity: 128, head_off: 0 };

    /// Publish order: whatever the interleaving, the consumer sees each message complete,
    /// in order, exactly once, across a wrap-around (the third 48-byte record needs a
    /// padding record and the space of the first), and the producer is refused (never
    /// overwrites) while the ring is full.
    #[test]
    fn publish_order_wrap_and_full() {
        loom::model(|| {
            let mem = Arc::new(LoomMem::new(64 + 128));
            let producer_mem = mem.clone();
            let producer = loom::thread::spawn(move || {
                let mut p = RingProducer::new(PLACE);
                let mut sent = 0u8;
                while sent < 3 {
                    let payload = [sent + 1; 24];
                    match p.reserve(&*producer_mem, payload.len()) {
                        Some(r) => {
                            producer_mem.write_bytes(r.record_off + HEADER_LEN, &payload);
                            let h = RecordHeader {
                                stamp: stamp_for(r.position),
                                payload_len: 24,
                                tag: 1,
                                kind: RecordKind::Inline,
                                flags: 0,
                            };
                            p.commit(&*producer_mem, r, h);
                            sent += 1;
                        }
                        None => loom::thread::yield_now(),
                    }
                }
            });
            let mut c = RingConsumer::new(PLACE);
            let mut expected = 1u8;
            while expected <= 3 {
                match c.peek(&*mem).expect("never corrupt") {
                    Some(rec) => {
                        let mut buf = [0u8; 24];
                        mem.read_bytes(rec.record_off + HEADER_LEN, &mut buf);
                        assert_eq!(buf, [expected; 24], "payload complete and in order");
                        c.consume(rec);
                        c.release(&*mem);
                        expected += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert!(c.peek(&*mem).unwrap().is_none(), "nothing duplicated");
        });
    }
}
