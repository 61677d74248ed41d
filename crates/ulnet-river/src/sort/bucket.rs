//! Records kept in key-range buckets as they arrive, so that sorting is a pass over small
//! buckets that each fit in the second-level cache, instead of a gather of records from
//! all over memory.
//!
//! * [`KeyBuckets`]: which bucket a key belongs to. The bucket bounds are keys sampled
//!   from the input (a few samples per bucket), so buckets stay about equal on skewed keys
//!   too. A lookup table indexed by the top bits of the key narrows the search to the
//!   bounds that share those bits.
//! * [`BucketArena`]: the records, in blocks of a mapping reserved up front; each bucket
//!   owns a list of blocks and fills them in turn. [`BucketArena::for_each_sorted`] sorts
//!   the buckets one at a time and hands each, in key order, to the caller.

use super::radix::{entry, index_of, key, sort_entries};
use super::stream::{self, Line};
use crate::error::RiverError;
use crate::flow::SpaceSink;
use memmap2::{Advice, MmapMut, MmapOptions};
use std::sync::Arc;

/// Bits of the key (below the range's common base) that index the lookup table: 4,096
/// entries of 4 bytes, 16 KiB, in the first-level cache.
const TABLE_BITS: u32 = 12;

/// Which of `bounds.len() + 1` buckets a key belongs to: bucket `b` holds the keys in
/// `[bounds[b - 1], bounds[b])`. Records with equal keys share a bucket.
#[derive(Clone, Debug)]
pub struct KeyBuckets {
    /// Top 64 bits of the lowest key of the range.
    base: u64,
    /// Shift that brings the range's span of top 64 bits into the table.
    shift: u32,
    /// `start[d]..start[d + 1]`: the bounds whose table index is `d`.
    start: Vec<u32>,
    /// Bucket bounds: keys (index bits zero), strictly increasing.
    bounds: Vec<u128>,
}

impl KeyBuckets {
    /// One bucket holding everything.
    pub fn single() -> Self {
        Self::new(0, u128::MAX, Vec::new())
    }

    /// Buckets for keys in `[low, high]` (entries or keys), bounded by `bounds` (keys in
    /// the range; sorted and deduplicated here).
    pub fn new(low: u128, high: u128, mut bounds: Vec<u128>) -> Self {
        let base = (low >> 64) as u64;
        let span = ((high >> 64) as u64).saturating_sub(base);
        let shift = (u64::BITS - span.leading_zeros()).saturating_sub(TABLE_BITS);
        for b in &mut bounds {
            *b = key_part(*b);
        }
        bounds.sort_unstable();
        bounds.dedup();
        let mut buckets = KeyBuckets { base, shift, start: Vec::new(), bounds };
        let slots = 1usize << TABLE_BITS;
        let mut start = Vec::with_capacity(slots + 1);
        let mut i = 0usize;
        for d in 0..=slots {
            while i < buckets.bounds.len() && buckets.slot(buckets.bounds[i]) < d {
                i += 1;
            }
            start.push(i as u32);
        }
        buckets.start = start;
        buckets
    }

    /// Buckets for a node's key range `[low, high]` from `samples` (entries, any order)
    /// that fall in it: a bound every `per_bucket` samples, at most `max_buckets` buckets.
    pub fn from_samples(low: u128, high: u128, samples: &[u128], per_bucket: usize, max_buckets: usize) -> Self {
        let mut inside: Vec<u128> = samples.iter().copied().filter(|s| (low..=high).contains(s)).collect();
        inside.sort_unstable();
        let per = per_bucket.max(inside.len().div_ceil(max_buckets.max(1))).max(1);
        let bounds = inside.iter().skip(per - 1).step_by(per).copied().collect();
        Self::new(low, high, bounds)
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.bounds.len() + 1
    }

    /// Whether there is only the one bucket (never empty).
    pub fn is_empty(&self) -> bool {
        false
    }

    #[inline(always)]
    fn slot(&self, key: u128) -> usize {
        ((((key >> 64) as u64).saturating_sub(self.base) >> self.shift) as usize).min((1 << TABLE_BITS) - 1)
    }

    /// The bucket of a record's key (any key: those outside the range go to the first or
    /// the last bucket).
    #[inline(always)]
    pub fn bucket_of(&self, key: u128) -> usize {
        let d = self.slot(key);
        let (lo, hi) = (self.start[d] as usize, self.start[d + 1] as usize);
        lo + self.bounds[lo..hi].partition_point(|b| *b <= key)
    }
}

#[inline(always)]
fn key_part(e: u128) -> u128 {
    e & !((1u128 << super::radix::INDEX_BITS) - 1)
}

/// Bytes of a block: 32 KiB at most, so a bucket's unfilled tail wastes little, and a bucket
/// of a few hundred kilobytes is a handful of blocks. A block holds a whole number of
/// windows (the fewest records that fill whole cache lines), so that every window starts a
/// line.
pub const BLOCK_BYTES: usize = 32 << 10;

/// Most bytes of the buckets' windows together: 8 MiB. More buckets than that allows (a
/// few thousand with Sort Benchmark records; a memory bound keeps far fewer) store records
/// straight into their blocks.
const WINDOWS_BYTES_MAX: usize = 8 << 20;

/// Records of a window: the fewest whole records that fill whole cache lines (16 of 100
/// bytes: 25 lines).
fn window_records(record_size: usize) -> usize {
    fewest_records_filling(stream::LINE, record_size)
}

/// The fewest records of `record_size` bytes that fill a whole number of `unit`s (a cache
/// line, a page).
pub(super) fn fewest_records_filling(unit: usize, record_size: usize) -> usize {
    let mut gcd = (record_size, unit);
    while gcd.1 != 0 {
        gcd = (gcd.1, gcd.0 % gcd.1);
    }
    unit / gcd.0
}

/// Records of a block: as many whole windows as [`BLOCK_BYTES`] holds (320 of 100 bytes),
/// at least one.
fn block_records(record_size: usize) -> usize {
    let w = window_records(record_size);
    (BLOCK_BYTES / record_size / w).max(1) * w
}

/// Records in key-range buckets, in blocks of one mapping reserved up front (address
/// space only until written, in pages of 4 KiB).
///
/// In a bounded arena a record goes first to its bucket's window, which the cache holds,
/// and a full window to its place in the bucket's block in whole lines, with stores that
/// bypass the cache. A record stored straight into its block made the store fetch the
/// block's line from memory first (the blocks are read again only when the bucket is
/// sorted, long after): in the 4x10^7-record external sort that cost as much for the
/// resident records (a sixth) as the group files' staging cost for all others. With
/// windows the first pass's store took about 250 fewer samples of about 1,040 (0.25 CPU-s)
/// in two profiles (BENCHMARKS.md, issue 8). [`BucketArena::settle`] puts the records of
/// partly filled windows in place before the blocks are read.
pub struct BucketArena {
    map: MmapMut,
    record_size: usize,
    block_records: usize,
    blocks_total: usize,
    blocks_used: usize,
    buckets: Arc<KeyBuckets>,
    /// Blocks of each bucket, in filling order.
    lists: Vec<Vec<u32>>,
    /// Records in the last block of each bucket.
    fill: Vec<u32>,
    records: u64,
    /// Each bucket's window of `window_records` records (whole lines), holding the
    /// records of its last block's last, partly filled window; no windows (0) when they
    /// would take more than [`WINDOWS_BYTES_MAX`].
    windows: Vec<Line>,
    window_records: usize,
    /// Whether every record is in its block (none only in a window).
    settled: bool,
}

impl std::fmt::Debug for BucketArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketArena")
            .field("records", &self.records)
            .field("buckets", &self.lists.len())
            .field("blocks_used", &self.blocks_used)
            .field("blocks_total", &self.blocks_total)
            .finish()
    }
}

impl BucketArena {
    /// Room for at least `records` records in `buckets` (each bucket's partly filled last
    /// block is provided for on top).
    ///
    /// In pages of 4 KiB, not huge pages (as [`BucketArena::bounded`]). On the development
    /// VM huge pages made the in-memory sort of 10^7 records depend on the state of the
    /// host's memory: 2 nodes took 2.13–2.71 s with huge pages and 1.03–1.44 s without,
    /// alternating in one run of `bench/sort.sh`. 4 nodes took 0.86–1.16 s with them and
    /// 1.21–1.58 s without. Starting every run from memory the VM had handed back (`sync`
    /// and 4 s), 4 KiB pages were faster in 5 of 6 pairs (BENCHMARKS.md, issue 8).
    ///
    /// Without windows: records go to all of the thousands of buckets of an in-memory
    /// sort, whose windows the caches do not hold. With them, reading and distributing
    /// 10^7 records on 2 nodes took 0.738 s instead of 0.612 s (medians of 10 alternating
    /// rounds), Datamation's 0.070 s instead of 0.061 s.
    pub fn new(buckets: Arc<KeyBuckets>, record_size: usize, records: usize) -> std::io::Result<Self> {
        let block_records = block_records(record_size);
        let blocks_total = records.div_ceil(block_records) + buckets.len();
        Self::with_blocks(buckets, record_size, blocks_total, false)
    }

    /// At most `bytes` of blocks (a memory bound): how many records fit depends on how
    /// evenly they spread over the buckets.
    ///
    /// In pages of 4 KiB, not huge pages: a bounded arena is faulted in whole before the
    /// first pass of external mode ([`BucketArena::populate`]), and on the development VM,
    /// which hands idle memory back to its host, 2 MiB pages taken from idle memory cost
    /// several times as much to fault in as 4 KiB ones. The 4x10^7-record sort, 2 nodes x
    /// 512 MiB, 4 alternating rounds: startup 0.14–0.17 s against 0.28–0.91 s, pass 1
    /// 1.92–2.00 s against 2.08–2.86 s, system CPU 3.2–3.6 s against 4.1–5.1 s.
    ///
    /// With windows: a bound keeps the buckets few (at most `bytes / 512 KiB`), and in
    /// external mode only the resident groups' buckets fill the arena.
    pub fn bounded(buckets: Arc<KeyBuckets>, record_size: usize, bytes: usize) -> std::io::Result<Self> {
        let block_bytes = block_records(record_size) * record_size;
        Self::with_blocks(buckets, record_size, (bytes / block_bytes).max(1), true)
    }

    fn with_blocks(
        buckets: Arc<KeyBuckets>,
        record_size: usize,
        blocks_total: usize,
        windows: bool,
    ) -> std::io::Result<Self> {
        assert!(record_size > 0, "records have a size");
        let block_records = block_records(record_size);
        assert!(blocks_total <= u32::MAX as usize, "block numbers are 32 bits");
        let map =
            MmapOptions::new().len((blocks_total * block_records * record_size).max(1)).no_reserve_swap().map_anon()?;
        let n = buckets.len();
        let mut window_records = window_records(record_size);
        if !windows || n * window_records * record_size > WINDOWS_BYTES_MAX {
            window_records = 0;
        }
        Ok(BucketArena {
            map,
            record_size,
            block_records,
            blocks_total,
            blocks_used: 0,
            buckets,
            lists: vec![Vec::new(); n],
            fill: vec![0; n],
            records: 0,
            windows: vec![Line::ZERO; n * window_records * record_size / stream::LINE],
            window_records,
            settled: true,
        })
    }

    /// Faults in all of its memory now, instead of block by block as records arrive.
    pub fn populate(&self) -> std::io::Result<()> {
        self.map.advise(Advice::PopulateWrite)
    }

    /// Records held.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Bytes of blocks in use (what a memory bound counts).
    pub fn bytes_used(&self) -> usize {
        self.blocks_used * self.block_records * self.record_size
    }

    /// Bytes of blocks it may use.
    pub fn capacity(&self) -> usize {
        self.blocks_total * self.block_records * self.record_size
    }

    /// Bytes per record.
    pub fn record_size(&self) -> usize {
        self.record_size
    }

    /// The buckets.
    pub fn buckets(&self) -> &Arc<KeyBuckets> {
        &self.buckets
    }

    /// Where the next record of bucket `b` goes (byte offset), taking a new block when its
    /// last is full; `None` when no block is left.
    #[inline(always)]
    fn slot_for(&mut self, b: usize) -> Option<usize> {
        let list = &mut self.lists[b];
        let fill = &mut self.fill[b];
        if list.is_empty() || *fill as usize == self.block_records {
            if self.blocks_used == self.blocks_total {
                return None;
            }
            list.push(self.blocks_used as u32);
            self.blocks_used += 1;
            *fill = 0;
        }
        let block = *list.last().expect("a block") as usize;
        let at = (block * self.block_records + *fill as usize) * self.record_size;
        *fill += 1;
        Some(at)
    }

    /// Records held in bucket `b`.
    pub fn bucket_records(&self, b: usize) -> usize {
        match self.lists[b].len() {
            0 => 0,
            n => (n - 1) * self.block_records + self.fill[b] as usize,
        }
    }

    /// Blocks it may use …
    pub fn blocks_total(&self) -> usize {
        self.blocks_total
    }

    /// … and records per block.
    pub fn block_records(&self) -> usize {
        self.block_records
    }

    /// Takes one record whose bucket the caller knows (`b`, as [`KeyBuckets::bucket_of`]
    /// gives it); `false` when no block is left for it.
    #[inline]
    pub fn push_in(&mut self, b: usize, record: &[u8]) -> bool {
        if !self.put(b, record) {
            return false;
        }
        self.records += 1;
        true
    }

    /// Puts one record of bucket `b` in its window (or its block, with no windows), the
    /// window in its block once full; `false` when no block is left for it.
    #[inline(always)]
    fn put(&mut self, b: usize, record: &[u8]) -> bool {
        let rs = self.record_size;
        let Some(at) = self.slot_for(b) else { return false };
        let w = self.window_records;
        if w == 0 {
            copy_record(&mut self.map[at..at + rs], record);
            return true;
        }
        // Windows line up with the block's records: this record is the window's `k`th.
        let k = (self.fill[b] as usize - 1) % w;
        let window = stream::window(&mut self.windows, w * rs, b);
        copy_record(&mut window[k * rs..(k + 1) * rs], record);
        if k + 1 == w {
            let start = at - k * rs;
            stream::copy(&mut self.map[start..start + w * rs], window);
        }
        self.settled = false;
        true
    }

    /// Puts the records of every partly filled window in their blocks (ordinary stores),
    /// and orders the stores that bypassed the cache before any later one: then the blocks
    /// hold every record, for this thread or any other.
    pub fn settle(&mut self) {
        // Without windows every record went straight to its block.
        if self.settled || self.window_records == 0 {
            return;
        }
        let (rs, w) = (self.record_size, self.window_records);
        for b in 0..self.lists.len() {
            let Some(&block) = self.lists[b].last() else { continue };
            let fill = self.fill[b] as usize;
            let k = fill % w;
            if k > 0 {
                let start = (block as usize * self.block_records + fill - k) * rs;
                let window = stream::window(&mut self.windows, w * rs, b);
                self.map[start..start + k * rs].copy_from_slice(&window[..k * rs]);
            }
        }
        stream::fence();
        self.settled = true;
    }

    /// Gives up the records and hands back the memory, its pages still faulted in (on a
    /// virtual machine whose freed memory goes back to the host, touching new memory costs
    /// a host fault per page; reusing these pages does not).
    pub fn into_memory(self) -> MmapMut {
        // The stores that bypassed the cache land before another thread writes here.
        stream::fence();
        self.map
    }

    /// Takes as many of `records` (whole records) as there is room for; returns how many.
    pub fn push_records(&mut self, records: &[u8]) -> usize {
        let rs = self.record_size;
        self.push_each(records.chunks_exact(rs))
    }

    /// Takes as many of the records of `src` at the positions `which` as there is room
    /// for, in that order; returns how many.
    pub fn push_gathered(&mut self, src: &[u8], which: &[u32]) -> usize {
        let rs = self.record_size;
        self.push_each(which.iter().map(|&i| &src[i as usize * rs..(i as usize + 1) * rs]))
    }

    /// Copies each record into its bucket until one has no room; returns how many.
    #[inline(always)]
    fn push_each<'r>(&mut self, records: impl Iterator<Item = &'r [u8]>) -> usize {
        let rs = self.record_size;
        let mut taken = 0;
        for r in records {
            debug_assert_eq!(r.len(), rs);
            let b = self.buckets.bucket_of(key(r));
            if !self.put(b, r) {
                break;
            }
            taken += 1;
        }
        self.records += taken as u64;
        taken
    }

    /// The filled bytes of each block of bucket `b`, in filling order (whole records).
    pub fn bucket_blocks(&self, b: usize) -> impl Iterator<Item = &[u8]> + '_ {
        assert!(self.settled, "records read before the windows are settled");
        let list = &self.lists[b];
        let last = list.len().saturating_sub(1);
        let fill = self.fill[b] as usize;
        list.iter().enumerate().map(move |(k, &block)| {
            let n = if k == last { fill } else { self.block_records };
            let first = block as usize * self.block_records * self.record_size;
            &self.map[first..first + n * self.record_size]
        })
    }

    /// Record number `index` (as in the entries [`BucketArena::for_each_sorted`] gives).
    #[inline(always)]
    pub fn record(&self, index: usize) -> &[u8] {
        debug_assert!(self.settled, "records read before the windows are settled");
        &self.map[index * self.record_size..(index + 1) * self.record_size]
    }

    /// Sorts the buckets one at a time and calls `f` with each one's entries in key order
    /// (an entry's [`index_of`] is its record's index for [`BucketArena::record`]); stops at
    /// the first error `f` returns.
    pub fn for_each_sorted<E>(&self, mut f: impl FnMut(&Self, &[u128]) -> Result<(), E>) -> Result<(), E> {
        assert!(self.settled, "records read before the windows are settled");
        let mut entries: Vec<u128> = Vec::new();
        let mut scratch: Vec<u128> = Vec::new();
        for (b, list) in self.lists.iter().enumerate() {
            entries.clear();
            for (k, &block) in list.iter().enumerate() {
                let n = if k + 1 == list.len() { self.fill[b] as usize } else { self.block_records };
                let first = block as usize * self.block_records;
                let bytes = &self.map[first * self.record_size..(first + n) * self.record_size];
                entries.extend(
                    bytes.chunks_exact(self.record_size).enumerate().map(|(i, r)| entry(r, (first + i) as u64)),
                );
            }
            if entries.is_empty() {
                continue;
            }
            let sorted = sort_entries(&mut entries, &mut scratch);
            f(self, sorted)?;
        }
        Ok(())
    }

    /// The records' memory, which the indexes of [`BucketArena::for_each_sorted`]'s entries
    /// point into (for `write_gathered`).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        debug_assert!(self.settled, "records read before the windows are settled");
        &self.map
    }

    /// Empties it; the blocks' pages stay for the next fill.
    pub fn clear(&mut self) {
        for l in &mut self.lists {
            l.clear();
        }
        self.fill.iter_mut().for_each(|f| *f = 0);
        self.blocks_used = 0;
        self.records = 0;
        self.settled = true;
    }
}

/// Bytes of records gathered into the stage at a time before being copied on: 32 KiB.
///
/// Gathered straight into an output buffer, the record stores waited for the buffer's
/// cache lines, last read by the device or the kernel, to be fetched for writing: in a
/// profile of the 4x10^7-record external sort, most of the gather's samples sat on those
/// stores. The stage's lines stay in the cache, written, and the copy on moves a whole
/// piece at once (string moves, which need not fetch the lines they overwrite): the
/// second pass's gather took about 2,400 samples instead of 3,200.
const GATHER_STAGE_BYTES: usize = 32 << 10;

/// Copies the records of `src` that `entries` (sort entries) point to into `dst`, one after
/// another (`dst` holds exactly `entries.len()` records of `rs` bytes), a piece at a time
/// through `stage` (sized here on first use, kept by the caller for the next call); each
/// piece on to `dst` with stores that bypass the cache when `bypass` says so (`dst` is
/// read next by a device, not by a CPU).
#[inline]
pub(crate) fn gather_records(
    dst: &mut [u8],
    entries: &[u128],
    src: &[u8],
    rs: usize,
    stage: &mut Vec<u8>,
    bypass: bool,
) {
    let per_piece = (GATHER_STAGE_BYTES / rs).max(1);
    if stage.len() < per_piece * rs {
        stage.resize(per_piece * rs, 0);
    }
    for (d, piece_entries) in dst.chunks_mut(per_piece * rs).zip(entries.chunks(per_piece)) {
        let piece = &mut stage[..d.len()];
        for (p, &e) in piece.chunks_exact_mut(rs).zip(piece_entries) {
            let at = index_of(e) * rs;
            copy_record(p, &src[at..at + rs]);
        }
        if bypass {
            stream::copy(d, piece);
        } else {
            d.copy_from_slice(piece);
        }
    }
    if bypass {
        stream::fence();
    }
}

/// Writes the records of `data` that the sorted `entries` point to into `out`, in order,
/// as much as each lent space holds, gathered through `stage` ([`gather_records`]).
pub(crate) fn write_gathered<S: SpaceSink + ?Sized>(
    mut entries: &[u128],
    data: &[u8],
    rs: usize,
    stage: &mut Vec<u8>,
    out: &mut S,
) -> Result<(), RiverError> {
    let bypass = out.bypass_cache();
    while !entries.is_empty() {
        let space = out.space()?;
        let n = (space.len() / rs).min(entries.len());
        gather_records(&mut space[..n * rs], &entries[..n], data, rs, stage, bypass);
        out.commit(n * rs)?;
        entries = &entries[n..];
    }
    Ok(())
}

/// Copies one record; the Sort Benchmark's 100 bytes with a fixed-size move the compiler
/// inlines, instead of a call per record.
///
/// Other sizes take a call of their own: with the variable-length copy in the same body,
/// the compiler merged the two into one `memcpy` call of a variable length, and the second
/// pass's scatter of records to their buckets called `memcpy` for every record. (Inlined,
/// the scatter measured no faster: its time goes to its stores' cache misses, not to the
/// call; see BENCHMARKS.md, issue 8.)
#[inline(always)]
pub(crate) fn copy_record(dst: &mut [u8], src: &[u8]) {
    const RS: usize = ulnet_sortbench::RECORD_SIZE;
    match (<&mut [u8; RS]>::try_from(&mut *dst), <&[u8; RS]>::try_from(src)) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => copy_other_size(dst, src),
    }
}

#[inline(never)]
fn copy_other_size(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` 100-byte records of pseudo-random bytes (xorshift from `seed`).
    pub(crate) fn records(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n * 100)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn buckets_follow_key_order() {
        let data = records(5000, 3);
        let keys: Vec<u128> = data.chunks(100).map(key).collect();
        let samples: Vec<u128> = data.chunks(100).step_by(50).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let b = KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1000);
        assert_eq!(b.len(), samples.len() / 4 + 1);
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        let buckets: Vec<usize> = sorted.iter().map(|&k| b.bucket_of(k)).collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "bucket numbers grow with the key");
        assert!(*buckets.last().unwrap() > b.len() / 2);
        // A narrow range whose keys share their top bytes still spreads over the buckets.
        let low = 0x4142_4344_0000_0000u128 << 64;
        let high = (0x4142_4344_ffff_ffffu128 << 64) | u128::from(u64::MAX);
        let inside: Vec<u128> = (0..400u128).map(|i| low + (i << 80)).collect();
        let b = KeyBuckets::from_samples(low, high, &inside, 4, 1000);
        assert_eq!(b.len(), 101);
        assert_eq!(b.bucket_of(low), 0);
        assert_eq!(b.bucket_of(high), 100);
        assert_eq!(b.bucket_of(0), 0, "keys below the range go to the first bucket");
        assert_eq!(b.bucket_of(u128::MAX), 100);
    }

    #[test]
    fn arena_sorts_bucket_by_bucket_and_reports_full() {
        let data = records(20_000, 9);
        let samples: Vec<u128> = data.chunks(100).step_by(37).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let buckets = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1000));
        let mut arena = BucketArena::new(buckets.clone(), 100, 20_000).unwrap();
        let which: Vec<u32> = (0..10_000).map(|i| i * 2).collect();
        assert_eq!(arena.push_gathered(&data, &which), 10_000);
        let odd: Vec<u8> = data.chunks(100).skip(1).step_by(2).flatten().copied().collect();
        assert_eq!(arena.push_records(&odd), 10_000);
        assert_eq!(arena.records(), 20_000);
        arena.settle();
        // Gathered with ordinary stores and with stores that bypass the cache.
        for bypass in [false, true] {
            let mut out = Vec::new();
            let mut stage = Vec::new();
            arena
                .for_each_sorted(|a, entries| {
                    let mut dst = vec![0u8; entries.len() * 100];
                    gather_records(&mut dst, entries, a.bytes(), 100, &mut stage, bypass);
                    out.extend_from_slice(&dst);
                    Ok::<(), ()>(())
                })
                .unwrap();
            let s = ulnet_sortbench::Summary::of_records(&out).unwrap();
            assert!(s.is_sorted(), "bypass {bypass}");
            assert_eq!(s.checksum, ulnet_sortbench::Checksum::of_records(&data));
        }
        // A bound of 8 blocks takes at most 8 blocks' worth.
        let mut small = BucketArena::bounded(buckets, 100, 8 * 32_000).unwrap();
        assert_eq!(small.block_records(), 320, "whole windows of 16 records");
        let taken = small.push_records(&data);
        assert!(taken <= 8 * 320 && taken > 0, "took {taken}");
        assert!(small.bytes_used() <= small.capacity());
        small.clear();
        assert!(small.is_empty());
        assert_eq!(small.push_records(&data[..100 * 7]), 7);
    }

    /// `n` records of `rs` bytes, each one's first 16 bytes a key from xorshift (`seed`),
    /// the rest its number.
    fn sized_records(n: usize, rs: usize, seed: u64) -> Vec<u8> {
        let keys = records(n, seed);
        let mut out = Vec::with_capacity(n * rs);
        for i in 0..n {
            let mut r = vec![0u8; rs];
            let k = rs.min(16);
            r[..k].copy_from_slice(&keys[i * 100..i * 100 + k]);
            for (j, b) in r[k..].iter_mut().enumerate() {
                *b = (i >> (8 * (j % 4))) as u8;
            }
            out.extend_from_slice(&r);
        }
        out
    }

    /// Pushes `data` into an arena over `buckets` in three parts, settling after the
    /// first (records then go on into the same windows), and checks that each bucket's
    /// blocks hold its records in arrival order and that no record is lost.
    fn check_windows(data: &[u8], rs: usize, buckets: Arc<KeyBuckets>, expect_windows: bool) {
        let n = data.len() / rs;
        let blocks = n.div_ceil(block_records(rs)) + buckets.len();
        let mut arena = BucketArena::bounded(buckets.clone(), rs, blocks * block_records(rs) * rs).unwrap();
        assert_eq!(arena.window_records > 0, expect_windows);
        let third = n / 3 * rs;
        assert_eq!(arena.push_records(&data[..third]), third / rs);
        arena.settle();
        let which: Vec<u32> = (third / rs..n).step_by(2).map(|i| i as u32).collect();
        assert_eq!(arena.push_gathered(data, &which), which.len());
        for i in (third / rs + 1..n).step_by(2) {
            assert!(arena.push_in(buckets.bucket_of(key(&data[i * rs..(i + 1) * rs])), &data[i * rs..(i + 1) * rs]));
        }
        assert_eq!(arena.records(), n as u64);
        arena.settle();
        let mut arrival: Vec<Vec<u8>> = vec![Vec::new(); buckets.len()];
        let order = (0..third / rs).chain((third / rs..n).step_by(2)).chain((third / rs + 1..n).step_by(2));
        for i in order {
            let r = &data[i * rs..(i + 1) * rs];
            arrival[buckets.bucket_of(key(r))].extend_from_slice(r);
        }
        for (b, want) in arrival.iter().enumerate() {
            let got: Vec<u8> = arena.bucket_blocks(b).flatten().copied().collect();
            assert_eq!(got.len(), want.len(), "bucket {b}, {rs}-byte records");
            assert!(got == *want, "bucket {b}, {rs}-byte records: not in arrival order");
        }
    }

    #[test]
    fn windows_put_every_record_in_its_block_in_arrival_order() {
        // 100-byte records (windows of 16), 37-byte ones (windows of 64), 64-byte ones
        // (windows of 1): each with a few and with many buckets.
        for (rs, per_bucket) in [(100, 4), (100, 400), (37, 8), (64, 50)] {
            let data = sized_records(9_000, rs, rs as u64);
            let samples: Vec<u128> = data.chunks(rs).step_by(3).map(key).collect();
            let buckets = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, per_bucket, 1 << 16));
            check_windows(&data, rs, buckets, true);
        }
        // So many buckets that windows would pass WINDOWS_BYTES_MAX: straight to the blocks.
        let data = sized_records(30_000, 100, 7);
        let samples: Vec<u128> = data.chunks(100).map(key).collect();
        let buckets = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1 << 16));
        assert!(buckets.len() * 1600 > WINDOWS_BYTES_MAX, "{} buckets", buckets.len());
        check_windows(&data, 100, buckets, false);
        // An arena without a bound (an in-memory sort) has none.
        let few = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 400, 1 << 16));
        assert_eq!(BucketArena::new(few, 100, 30_000).unwrap().window_records, 0);
    }

    #[test]
    #[should_panic(expected = "settled")]
    fn blocks_are_not_read_before_the_windows_are_settled() {
        let data = records(100, 1);
        let mut arena = BucketArena::bounded(Arc::new(KeyBuckets::single()), 100, 1 << 20).unwrap();
        arena.push_records(&data);
        let _ = arena.bucket_blocks(0).count();
    }
}
