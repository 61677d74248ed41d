//! Where a node keeps the records of its partition: an in-memory arena, which in external
//! mode spills sorted runs to disk whenever it reaches its memory bound; and the ways out
//! of it: a one-pass sort of the arena, or a merge of the runs.

use super::radix::{entries_of, entry, index_of, sort_emitting};
use crate::disk::DiskSource;
use crate::error::RiverError;
use crate::flow::{Sink, Source};
use crate::pool::{Buffer, MemPool};
use crate::DiskSink;
use memmap2::{Advice, MmapMut, MmapOptions};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records in memory: an anonymous mapping reserved at its largest size up front (pages
/// are only backed when written) and backed by huge pages where the kernel allows, so
/// filling it costs a fault per 2 MiB instead of per 4 KiB.
pub struct Arena {
    map: MmapMut,
    len: usize,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("len", &self.len).field("capacity", &self.map.len()).finish()
    }
}

impl Arena {
    /// Reserves `capacity` bytes (address space only, until written).
    pub fn with_capacity(capacity: usize) -> std::io::Result<Self> {
        let map = MmapOptions::new().len(capacity.max(1)).no_reserve_swap().map_anon()?;
        let _ = map.advise(Advice::HugePage);
        Ok(Arena { map, len: 0 })
    }

    /// The records held.
    pub fn as_slice(&self) -> &[u8] {
        &self.map[..self.len]
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes it can hold.
    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    /// Appends `data`, moving to a mapping twice as large if it does not fit.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.len + data.len() > self.map.len() {
            let mut bigger = Arena::with_capacity((self.len + data.len()).max(2 * self.map.len()))?;
            bigger.map[..self.len].copy_from_slice(self.as_slice());
            bigger.len = self.len;
            *self = bigger;
        }
        self.map[self.len..self.len + data.len()].copy_from_slice(data);
        self.len += data.len();
        Ok(())
    }

    /// Empties it (its pages stay, for the next fill).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// A spilled, sorted run.
#[derive(Debug)]
pub struct Run {
    /// Its file (removed when the store is dropped).
    pub path: PathBuf,
    /// Records in it.
    pub records: u64,
}

/// The records of a node's partition.
#[derive(Debug)]
pub struct RecordStore {
    record_size: usize,
    arena: Arena,
    /// Most bytes the arena holds before it spills (external mode), or `None`.
    spill_at: Option<usize>,
    runs: Vec<Run>,
    run_prefix: PathBuf,
    write_pool: MemPool,
    spill_time: Duration,
    records: u64,
    /// External mode: the other half of the memory, free to fill next …
    spare: Option<Arena>,
    /// … or being sorted and written as a run on a thread of its own.
    spilling: Option<std::thread::JoinHandle<Result<Arena, RiverError>>>,
}

impl RecordStore {
    /// An in-memory store with room reserved for `reserve` bytes (address space only; it
    /// grows past that if need be).
    pub fn in_memory(record_size: usize, reserve: usize, write_pool: MemPool) -> std::io::Result<Self> {
        Ok(RecordStore {
            record_size,
            arena: Arena::with_capacity(reserve)?,
            spill_at: None,
            runs: Vec::new(),
            run_prefix: PathBuf::new(),
            write_pool,
            spill_time: Duration::ZERO,
            records: 0,
            spare: None,
            spilling: None,
        })
    }

    /// A store that holds at most `arena_bytes` of records, in two halves: when one is
    /// full it is sorted and written as a run (`run_prefix.N`) on a thread of its own
    /// while the other fills, so receiving goes on during a spill; it waits only when the
    /// second half fills before the first is written.
    pub fn spilling(
        record_size: usize,
        arena_bytes: usize,
        run_prefix: PathBuf,
        write_pool: MemPool,
    ) -> std::io::Result<Self> {
        let half = (arena_bytes / 2 / record_size).max(1) * record_size;
        Ok(RecordStore {
            record_size,
            arena: Arena::with_capacity(half)?,
            spill_at: Some(half),
            runs: Vec::new(),
            run_prefix,
            write_pool,
            spill_time: Duration::ZERO,
            records: 0,
            spare: Some(Arena::with_capacity(half)?),
            spilling: None,
        })
    }

    /// Records taken in.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Runs spilled so far.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Time receiving waited for a spill to finish (the second half filled first).
    pub fn spill_time(&self) -> Duration {
        self.spill_time
    }

    /// Waits for the spill in progress, if any; returns its half, emptied.
    fn finish_spill(&mut self) -> Result<Option<Arena>, RiverError> {
        let Some(thread) = self.spilling.take() else { return Ok(None) };
        let started = Instant::now();
        let arena = thread
            .join()
            .unwrap_or_else(|_| Err(RiverError::io("spilling a run", std::io::Error::other("panicked"))))?;
        self.spill_time += started.elapsed();
        Ok(Some(arena))
    }

    /// Hands the full half to a spill thread and goes on with the other.
    fn spill(&mut self) -> Result<(), RiverError> {
        if self.arena.is_empty() {
            return Ok(());
        }
        let next = match self.spare.take() {
            Some(a) => a,
            None => self.finish_spill()?.expect("a half is spare or spilling"),
        };
        let mut full = std::mem::replace(&mut self.arena, next);
        let path = PathBuf::from(format!("{}.{}", self.run_prefix.display(), self.runs.len()));
        let file = File::create(&path).map_err(|e| RiverError::io(format!("creating run {}", path.display()), e))?;
        let records = (full.len() / self.record_size) as u64;
        // Register the run before writing, so a failure still removes its file.
        self.runs.push(Run { path, records });
        let (pool, rs) = (self.write_pool.clone(), self.record_size);
        let thread = std::thread::Builder::new()
            .name("river-spill".into())
            .spawn(move || {
                let mut sink = DiskSink::new(Arc::new(file), 0, pool, rs);
                emit_sorted(full.as_slice(), rs, &mut sink)?;
                sink.close()?;
                full.clear();
                Ok(full)
            })
            .map_err(|e| RiverError::io("starting a spill thread", e))?;
        self.spilling = Some(thread);
        Ok(())
    }

    /// Writes the partition, sorted, to `out`: the arena in one pass when nothing was
    /// spilled, else the arena spilled as a last run and every run merged. `read_pool`
    /// feeds the merge's run readers.
    pub fn write_sorted<S: Sink + ?Sized>(mut self, out: &mut S, read_pool_bytes: usize) -> Result<(), RiverError> {
        if self.runs.is_empty() {
            return emit_sorted(self.arena.as_slice(), self.record_size, out);
        }
        // The half being filled stays in memory as the last run; the other is released,
        // and the merge reads the spilled runs with what is left.
        self.finish_spill()?;
        self.spare = None;
        let kept = (self.arena.capacity() as f64 * SORT_MEMORY_PER_BYTE) as usize;
        merge_runs(&self.runs, self.record_size, read_pool_bytes.saturating_sub(kept), Some(self.arena.as_slice()), out)
    }
}

impl Sink for RecordStore {
    fn sink_records(&mut self, records: &[u8]) -> Result<(), RiverError> {
        if let Some(limit) = self.spill_at {
            if self.arena.len() + records.len() > limit {
                self.spill()?;
            }
        }
        self.arena.extend_from_slice(records).map_err(|e| RiverError::io("growing the record arena", e))?;
        self.records += (records.len() / self.record_size) as u64;
        Ok(())
    }

    fn close(&mut self) -> Result<(), RiverError> {
        Ok(())
    }
}

impl Drop for RecordStore {
    fn drop(&mut self) {
        let _ = self.finish_spill();
        for run in &self.runs {
            let _ = std::fs::remove_file(&run.path);
        }
    }
}

/// The key of a run that has no records left: above every real entry (whose low bits
/// hold a run index far below 2^48 - 1).
const EXHAUSTED: u128 = u128::MAX;

/// A tournament tree of losers over the runs' current keys: the smallest is found with
/// one comparison per level (log2 of the runs) when the winner's run moves on, half of
/// what a binary heap's sift takes.
struct LoserTree {
    /// `nodes[0]` is the winner; `nodes[1..k]` hold the loser of each match.
    nodes: Vec<usize>,
    keys: Vec<u128>,
}

impl LoserTree {
    fn new(keys: Vec<u128>) -> Self {
        let k = keys.len();
        let empty = usize::MAX;
        let mut nodes = vec![empty; k.max(1)];
        for leaf in 0..k {
            let mut w = leaf;
            let mut node = (leaf + k) / 2;
            while node > 0 {
                if nodes[node] == empty {
                    nodes[node] = w;
                    w = empty;
                    break;
                }
                if keys[nodes[node]] < keys[w] {
                    std::mem::swap(&mut nodes[node], &mut w);
                }
                node /= 2;
            }
            if w != empty {
                nodes[0] = w;
            }
        }
        LoserTree { nodes, keys }
    }

    /// The run with the smallest current key, unless every run is exhausted.
    #[inline]
    fn winner(&self) -> Option<usize> {
        let w = *self.nodes.first()?;
        (w != usize::MAX && self.keys[w] != EXHAUSTED).then_some(w)
    }

    /// The winner's run moved on to `key`: replays its matches up to the root.
    #[inline]
    fn replace_winner(&mut self, key: u128) {
        let k = self.keys.len();
        let mut w = self.nodes[0];
        self.keys[w] = key;
        let mut node = (w + k) / 2;
        while node > 0 {
            let other = self.nodes[node];
            if self.keys[other] < self.keys[w] {
                self.nodes[node] = w;
                w = other;
            }
            node /= 2;
        }
        self.nodes[0] = w;
    }
}

/// Memory an in-memory run takes per byte of records while it is merged: the records and
/// a 4-byte index per record, plus the sort's two 16-byte entries per record while it is
/// ordered.
const SORT_MEMORY_PER_BYTE: f64 = 1.32;

/// Records gathered before they are handed to the sink: 640 (64 KB) stays in the
/// second-level cache, and the sink copies them in one go.
const GATHER_RECORDS: usize = 640;

/// How far ahead of the copy the gather touches records.
const GATHER_LOOKAHEAD: usize = 8;

/// Appends one record; the Sort Benchmark's 100 bytes are copied with a fixed-size move
/// the compiler inlines, instead of a call per record.
#[inline(always)]
fn push_record(staged: &mut Vec<u8>, record: &[u8]) {
    match <&[u8; ulnet_sortbench::RECORD_SIZE]>::try_from(record) {
        Ok(fixed) => staged.extend_from_slice(fixed),
        Err(_) => staged.extend_from_slice(record),
    }
}

/// Sorts `records` and sinks them in order, bucket by bucket (the sink writes the first
/// buckets while later ones are sorted), gathered 640 records (64 KB) at a time.
pub fn emit_sorted<S: Sink + ?Sized>(records: &[u8], record_size: usize, out: &mut S) -> Result<(), RiverError> {
    let mut failure = None;
    let mut staged: Vec<u8> = Vec::with_capacity(GATHER_RECORDS * record_size);
    sort_emitting(entries_of(records, record_size), |bucket| {
        if failure.is_some() {
            return;
        }
        for (k, &e) in bucket.iter().enumerate() {
            // Touch the record a few places ahead: the gather is bound by cache misses, and
            // a load issued early overlaps with the copies in between.
            if let Some(&ahead) = bucket.get(k + GATHER_LOOKAHEAD) {
                std::hint::black_box(records[index_of(ahead) * record_size]);
            }
            let i = index_of(e) * record_size;
            push_record(&mut staged, &records[i..i + record_size]);
            if staged.len() == GATHER_RECORDS * record_size {
                if let Err(err) = out.sink_records(&staged) {
                    failure = Some(err);
                    return;
                }
                staged.clear();
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    if !staged.is_empty() {
        out.sink_records(&staged)?;
    }
    Ok(())
}

/// A sorted run being merged: read ahead from its file, or in memory in sorted order.
enum RunReader<'a> {
    Disk { source: DiskSource, buffer: Option<Buffer>, at: usize },
    Memory { records: &'a [u8], order: Vec<u32>, at: usize },
}

impl RunReader<'_> {
    #[inline]
    fn current(&self, record_size: usize) -> Option<&[u8]> {
        match self {
            RunReader::Disk { buffer, at, .. } => buffer.as_ref().map(|b| &b.as_slice()[*at..*at + record_size]),
            RunReader::Memory { records, order, at } => {
                order.get(*at).map(|&i| &records[i as usize * record_size..(i as usize + 1) * record_size])
            }
        }
    }

    #[inline]
    fn advance(&mut self, record_size: usize) -> Result<(), RiverError> {
        match self {
            RunReader::Disk { source, buffer, at } => {
                *at += record_size;
                if buffer.as_ref().is_some_and(|b| *at >= b.len()) {
                    *buffer = None;
                    *at = 0;
                    *buffer = source.next_buffer()?;
                }
            }
            RunReader::Memory { at, .. } => *at += 1,
        }
        Ok(())
    }
}

/// Merges sorted runs into `out` with a heap of the runs' current keys: the spilled ones,
/// each read ahead by a [`DiskSource`] with two buffers of its share of `read_pool_bytes`
/// (at least 64 KiB each), and `in_memory` records (unsorted) as one more run.
pub fn merge_runs<S: Sink + ?Sized>(
    runs: &[Run],
    record_size: usize,
    read_pool_bytes: usize,
    in_memory: Option<&[u8]>,
    out: &mut S,
) -> Result<(), RiverError> {
    let per_buffer = (read_pool_bytes / (2 * runs.len().max(1))).clamp(64 << 10, 8 << 20) / record_size * record_size;
    let mut readers = Vec::with_capacity(runs.len() + 1);
    for run in runs {
        let pool = MemPool::heap(2, per_buffer);
        let len = run.records * record_size as u64;
        let mut source = DiskSource::open(&run.path, 0..len, record_size, pool, None)?;
        let buffer = source.next_buffer()?;
        readers.push(RunReader::Disk { source, buffer, at: 0 });
    }
    if let Some(records) = in_memory.filter(|r| !r.is_empty()) {
        assert!(records.len() / record_size < u32::MAX as usize, "in-memory run indexes are 32 bits");
        let mut order = Vec::with_capacity(records.len() / record_size);
        sort_emitting(entries_of(records, record_size), |bucket| {
            order.extend(bucket.iter().map(|&e| index_of(e) as u32))
        });
        readers.push(RunReader::Memory { records, order, at: 0 });
    }
    let keys = readers
        .iter()
        .enumerate()
        .map(|(i, r)| r.current(record_size).map_or(EXHAUSTED, |rec| entry(rec, i as u64)))
        .collect();
    let mut tree = LoserTree::new(keys);
    let mut staged: Vec<u8> = Vec::with_capacity(GATHER_RECORDS * record_size);
    while let Some(i) = tree.winner() {
        let reader = &mut readers[i];
        push_record(&mut staged, reader.current(record_size).expect("a run in the tree has a record"));
        if staged.len() == GATHER_RECORDS * record_size {
            out.sink_records(&staged)?;
            staged.clear();
        }
        reader.advance(record_size)?;
        tree.replace_winner(reader.current(record_size).map_or(EXHAUSTED, |rec| entry(rec, i as u64)));
    }
    if !staged.is_empty() {
        out.sink_records(&staged)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecSink;

    fn records(n: usize, seed: u64) -> Vec<u8> {
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

    fn sorted_keys(data: &[u8]) -> Vec<Vec<u8>> {
        let mut k: Vec<Vec<u8>> = data.chunks(100).map(|r| r.to_vec()).collect();
        k.sort_by(|a, b| a[..10].cmp(&b[..10]));
        k
    }

    #[test]
    fn spilling_store_merges_to_the_same_order_as_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let data = records(5000, 7);
        let pool = MemPool::heap(2, 64 << 10);
        let mut store = RecordStore::spilling(100, 700 * 100, dir.path().join("run"), pool.clone()).unwrap();
        for piece in data.chunks(300 * 100) {
            store.sink_records(piece).unwrap();
        }
        assert_eq!(store.records(), 5000);
        assert!(store.runs().len() >= 7, "runs: {}", store.runs().len());
        let mut out = Vec::new();
        store.write_sorted(&mut VecSink::new(&mut out, 100), 1 << 20).unwrap();
        let got: Vec<Vec<u8>> = out.chunks(100).map(|r| r.to_vec()).collect();
        let want = sorted_keys(&data);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g[..10], w[..10]);
        }
        assert_eq!(ulnet_sortbench::Checksum::of_records(&out), ulnet_sortbench::Checksum::of_records(&data));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "runs are removed");
        assert!(pool.all_returned());
    }

    #[test]
    fn loser_tree_yields_runs_in_key_order() {
        for k in 1..12usize {
            let runs: Vec<Vec<u128>> = (0..k)
                .map(|r| {
                    let mut v: Vec<u128> =
                        (0..(r * 7 % 5)).map(|i| ((i * 31 + r * 17) % 23) as u128 * 64 + r as u128).collect();
                    v.sort_unstable();
                    v
                })
                .collect();
            let mut at = vec![0usize; k];
            let mut tree = LoserTree::new(runs.iter().map(|r| r.first().copied().unwrap_or(EXHAUSTED)).collect());
            let mut got = Vec::new();
            while let Some(w) = tree.winner() {
                got.push(runs[w][at[w]]);
                at[w] += 1;
                tree.replace_winner(runs[w].get(at[w]).copied().unwrap_or(EXHAUSTED));
            }
            let mut want: Vec<u128> = runs.concat();
            want.sort_unstable();
            assert_eq!(got, want, "{k} runs");
        }
    }

    #[test]
    fn in_memory_store_sorts_in_one_pass() {
        let data = records(3000, 11);
        let mut store = RecordStore::in_memory(100, 1000, MemPool::heap(1, 4096)).unwrap();
        store.sink_records(&data).unwrap();
        let mut out = Vec::new();
        store.write_sorted(&mut VecSink::new(&mut out, 100), 0).unwrap();
        let s = ulnet_sortbench::Summary::of_records(&out).unwrap();
        assert!(s.is_sorted());
        assert_eq!(s.checksum, ulnet_sortbench::Checksum::of_records(&data));
    }
}
