//! Moving records to their buckets' places in a large buffer, through a small window per
//! bucket that the caches hold and whole windows written with stores that bypass the
//! cache (software write-combining).
//!
//! Stored one by one, records to some seventy buckets of a 200 MB half are seventy streams
//! of stores the hardware cannot follow: each first store to a line fetches the line, from
//! memory, only to overwrite it. Gathered in a window of the bucket's next few kilobytes
//! and written out whole with non-temporal stores, no line is fetched and each write is
//! one sequential run. On the development VM (AMD EPYC), moving 230 MB of 100-byte records
//! to 70 buckets took 13.1 ns a record this way against 18.0 ns stored one by one, and
//! 20.3 ns through the same windows written out by ordinary copies (`bench/scatter-nt.c`;
//! see BENCHMARKS.md, issue 8).
//!
//! Only the bytes of a bucket's own place are ever written: a window that starts before
//! its bucket's place (its first) or is left partly filled (its last) is copied out with
//! ordinary stores, byte range by byte range, since the neighbouring bucket owns the rest
//! of those lines.

use super::bucket::copy_record;
use super::stream::{self, Line};

/// Bytes of a bucket's window at most: 4 KiB, one page of its place written at a time.
const WINDOW_MAX: usize = 4096;
/// All windows together at most: 512 KiB, half of a core's second-level cache here.
const WINDOWS_BYTES: usize = 512 << 10;

/// Scatters records into the places of buckets in one destination buffer. Keeps its
/// windows from one use to the next.
#[derive(Default)]
pub struct Scatter {
    /// Each bucket's window of `window` bytes (`window / LINE` lines each).
    lines: Vec<Line>,
    window: usize,
    /// Address (in the destination) of each bucket's window …
    window_at: Vec<usize>,
    /// … the first of its bytes that is the bucket's (a window before the bucket's place
    /// starts before it) …
    owned_from: Vec<usize>,
    /// … and where the bucket's next record goes …
    next: Vec<usize>,
    /// … and where its place ends (all addresses).
    end: Vec<usize>,
}

/// Records that do not fit their bucket's place.
#[derive(Debug, PartialEq, Eq)]
pub struct PlaceFull;

impl Scatter {
    /// Starts a scatter into `dst`, bucket `b`'s place being records `starts[b]` to
    /// `starts[b + 1]` of `rs` bytes.
    pub fn begin(&mut self, dst: &mut [u8], starts: &[usize], rs: usize) {
        assert!(starts.last().is_some_and(|&n| n * rs <= dst.len()), "the places lie in the buffer");
        let buckets = starts.len() - 1;
        let base = dst.as_ptr() as usize;
        // A record never spans more than two windows.
        let least = rs.next_multiple_of(stream::LINE).max(stream::LINE);
        self.window =
            (WINDOWS_BYTES / buckets.max(1) / stream::LINE * stream::LINE).clamp(least, WINDOW_MAX.max(least));
        self.lines.clear();
        self.lines.resize(buckets * self.window / stream::LINE, Line::ZERO);
        self.window_at.clear();
        self.owned_from.clear();
        self.next.clear();
        self.end.clear();
        for place in starts.windows(2) {
            let (from, to) = (base + place[0] * rs, base + place[1] * rs);
            self.window_at.push(from / stream::LINE * stream::LINE);
            self.owned_from.push(from);
            self.next.push(from);
            self.end.push(to);
        }
    }

    /// Appends `record` to bucket `b`'s place in `dst` (the buffer given to
    /// [`Scatter::begin`]).
    #[inline(always)]
    pub fn push(&mut self, dst: &mut [u8], b: usize, record: &[u8]) -> Result<(), PlaceFull> {
        let at = self.next[b];
        if self.end[b] - at < record.len() {
            return Err(PlaceFull);
        }
        let offset = at - self.window_at[b];
        if offset + record.len() < self.window {
            // Most records: inside the window, which stays open.
            copy_record(&mut self.window_bytes(b)[offset..offset + record.len()], record);
            self.next[b] = at + record.len();
        } else {
            self.push_closing(dst, b, record);
        }
        Ok(())
    }

    /// Appends a record that fills bucket `b`'s window: the window goes out, and the rest
    /// of the record starts the next one.
    #[inline(never)]
    fn push_closing(&mut self, dst: &mut [u8], b: usize, record: &[u8]) {
        let at = self.next[b];
        let offset = at - self.window_at[b];
        let n = self.window - offset;
        self.window_bytes(b)[offset..].copy_from_slice(&record[..n]);
        self.write_window(dst, b);
        self.window_bytes(b)[..record.len() - n].copy_from_slice(&record[n..]);
        self.next[b] = at + record.len();
    }

    /// Writes out what every window still holds; then the places hold all records pushed.
    pub fn finish(&mut self, dst: &mut [u8]) {
        for b in 0..self.next.len() {
            self.copy_owned(dst, b, self.next[b]);
        }
        stream::fence();
    }

    /// Bucket `b`'s window.
    fn window_bytes(&mut self, b: usize) -> &mut [u8] {
        stream::window(&mut self.lines, self.window, b)
    }

    /// Copies the bytes of bucket `b`'s window that are its own, up to address `to`, to
    /// their place, with ordinary stores.
    fn copy_owned(&mut self, dst: &mut [u8], b: usize, to: usize) {
        let (start, from) = (self.window_at[b], self.owned_from[b]);
        if to > from {
            let at = from - dst.as_ptr() as usize;
            dst[at..at + (to - from)].copy_from_slice(&self.window_bytes(b)[from - start..to - start]);
        }
    }

    /// Bucket `b`'s window is full: out to its place, whole (non-temporal) when all of it
    /// is the bucket's, else its own bytes alone.
    fn write_window(&mut self, dst: &mut [u8], b: usize) {
        let window = self.window;
        let (start, from) = (self.window_at[b], self.owned_from[b]);
        if from == start {
            let at = start - dst.as_ptr() as usize;
            stream::copy(&mut dst[at..at + window], self.window_bytes(b));
        } else {
            self.copy_owned(dst, b, start + window);
        }
        self.window_at[b] = start + window;
        self.owned_from[b] = start + window;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Scatters records of `rs` bytes, bucket `b` getting `counts[b]`, in the order
    /// `order` (bucket numbers, each as often as its count), into a buffer starting `skew`
    /// bytes past a line and with a sentinel byte on either side of the places; checks
    /// every bucket's records in push order and the sentinels untouched.
    fn check(rs: usize, counts: &[usize], order: &[usize], skew: usize) {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(counts.iter().scan(0, |s, &c| {
                *s += c;
                Some(*s)
            }))
            .collect();
        let total = *starts.last().unwrap();
        let mut storage = vec![Line::ZERO; (total * rs + skew + 2).div_ceil(LINE_BYTES) + 1];
        let bytes = stream::bytes_of(&mut storage);
        bytes.fill(0xEE);
        let dst = &mut bytes[skew + 1..skew + 1 + total * rs];
        let mut scatter = Scatter::default();
        scatter.begin(dst, &starts, rs);
        let mut pushed = vec![0usize; counts.len()];
        let mut want = vec![0u8; total * rs];
        for (i, &b) in order.iter().enumerate() {
            let record: Vec<u8> = (0..rs).map(|k| (i * 31 + k * 7) as u8).collect();
            let at = (starts[b] + pushed[b]) * rs;
            want[at..at + rs].copy_from_slice(&record);
            pushed[b] += 1;
            scatter.push(dst, b, &record).unwrap();
        }
        scatter.finish(dst);
        assert!(dst == &want[..], "every record in its bucket's place, in push order");
        assert_eq!(bytes[skew], 0xEE, "nothing written before the places");
        assert_eq!(bytes[skew + 1 + total * rs], 0xEE, "nothing written after them");
    }

    const LINE_BYTES: usize = stream::LINE;

    #[test]
    fn records_land_in_their_places_across_many_windows() {
        // 300 records of 100 bytes to each of 3 buckets, round robin: every window of
        // every bucket fills and goes out, at each alignment of the buffer.
        let order: Vec<usize> = (0..900).map(|i| i % 3).collect();
        for skew in [0, 1, 36, 63] {
            check(100, &[300, 300, 300], &order, skew);
        }
    }

    #[test]
    fn a_record_past_its_place_is_refused() {
        let mut dst = vec![0u8; 300];
        let mut scatter = Scatter::default();
        scatter.begin(&mut dst, &[0, 1, 3], 100);
        scatter.push(&mut dst, 0, &[1; 100]).unwrap();
        assert_eq!(scatter.push(&mut dst, 0, &[2; 100]), Err(PlaceFull));
        scatter.push(&mut dst, 1, &[3; 100]).unwrap();
        scatter.push(&mut dst, 1, &[4; 100]).unwrap();
        assert_eq!(scatter.push(&mut dst, 1, &[5; 100]), Err(PlaceFull));
        scatter.finish(&mut dst);
        assert!(dst[..100].iter().all(|&x| x == 1) && dst[100..200].iter().all(|&x| x == 3));
        assert!(dst[200..].iter().all(|&x| x == 4));
    }

    proptest! {
        #[test]
        fn any_counts_sizes_and_orders(
            rs in prop_oneof![Just(100usize), 1usize..300],
            counts in proptest::collection::vec(0usize..120, 1..12),
            skew in 0usize..64,
            seed in any::<u64>(),
        ) {
            let mut order: Vec<usize> = counts.iter().enumerate().flat_map(|(b, &c)| std::iter::repeat_n(b, c)).collect();
            // Fisher-Yates from an xorshift seed.
            let mut x = seed | 1;
            for i in (1..order.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            check(rs, &counts, &order, skew);
        }
    }
}
