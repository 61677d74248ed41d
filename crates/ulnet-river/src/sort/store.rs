//! Where a node keeps the records of its partition: a [`BucketArena`], which in external
//! mode spills sorted runs to disk whenever it reaches its memory bound; and the ways out
//! of it: a one-pass sort of the arena, bucket by bucket, or a merge of the runs.

use super::bucket::{copy_record, BucketArena, KeyBuckets};
use super::radix::{entry, index_of};
use crate::disk::DiskSource;
use crate::error::RiverError;
use crate::flow::{Sink, Source, SpaceSink};
use crate::pool::{Buffer, MemPool};
use crate::DiskSink;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Room for the records (in memory) or for each half (external mode).
    sizing: Sizing,
    /// The records, once the buckets are known ([`RecordStore::set_buckets`]) …
    arena: Option<BucketArena>,
    /// … and those that arrived before (from a node that learned the splitters sooner).
    early: Vec<u8>,
    runs: Vec<Run>,
    run_prefix: PathBuf,
    write_pool: MemPool,
    spill_time: Duration,
    records: u64,
    /// External mode: the other half of the memory, free to fill next …
    spare: Option<BucketArena>,
    /// … or being sorted and written as a run on a thread of its own.
    spilling: Option<std::thread::JoinHandle<Result<BucketArena, RiverError>>>,
}

/// How a store is sized.
#[derive(Clone, Copy, Debug)]
enum Sizing {
    /// One arena for this many records; more is an error.
    Records(usize),
    /// Two halves of this many bytes each; a full one spills as a run.
    HalfBytes(usize),
}

impl RecordStore {
    /// An in-memory store with room for `records` records (address space only, until
    /// written). It takes records once its buckets are set.
    pub fn in_memory(record_size: usize, records: usize, write_pool: MemPool) -> Self {
        Self::new(record_size, Sizing::Records(records), PathBuf::new(), write_pool)
    }

    /// A store that holds at most `arena_bytes` of records, in two halves: when one is
    /// full it is sorted and written as a run (`run_prefix.N`) on a thread of its own
    /// while the other fills, so receiving goes on during a spill; it waits only when the
    /// second half fills before the first is written.
    pub fn spilling(record_size: usize, arena_bytes: usize, run_prefix: PathBuf, write_pool: MemPool) -> Self {
        Self::new(record_size, Sizing::HalfBytes(arena_bytes / 2), run_prefix, write_pool)
    }

    fn new(record_size: usize, sizing: Sizing, run_prefix: PathBuf, write_pool: MemPool) -> Self {
        RecordStore {
            record_size,
            sizing,
            arena: None,
            early: Vec::new(),
            runs: Vec::new(),
            run_prefix,
            write_pool,
            spill_time: Duration::ZERO,
            records: 0,
            spare: None,
            spilling: None,
        }
    }

    /// Sets the key-range buckets records are kept in (once), making the arena, and
    /// takes the records that arrived before.
    pub fn set_buckets(&mut self, buckets: Arc<KeyBuckets>) -> Result<(), RiverError> {
        assert!(self.arena.is_none(), "buckets are set once");
        let rs = self.record_size;
        let reserve = |e| RiverError::io("reserving the record arena", e);
        match self.sizing {
            Sizing::Records(n) => self.arena = Some(BucketArena::new(buckets, rs, n).map_err(reserve)?),
            Sizing::HalfBytes(half) => {
                self.arena = Some(BucketArena::bounded(buckets.clone(), rs, half).map_err(reserve)?);
                self.spare = Some(BucketArena::bounded(buckets, rs, half).map_err(reserve)?);
            }
        }
        let early = std::mem::take(&mut self.early);
        self.records -= (early.len() / rs) as u64;
        self.sink_records(&early)
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
    fn finish_spill(&mut self) -> Result<Option<BucketArena>, RiverError> {
        let Some(thread) = self.spilling.take() else { return Ok(None) };
        let started = Instant::now();
        let arena = thread
            .join()
            .unwrap_or_else(|_| Err(RiverError::io("spilling a run", std::io::Error::other("panicked"))))?;
        self.spill_time += started.elapsed();
        Ok(Some(arena))
    }

    /// The arena is full: hands it to a spill thread and goes on with the other half (an
    /// in-memory store has no other half: more records than it was sized for is an error).
    fn spill(&mut self) -> Result<(), RiverError> {
        if let Sizing::Records(n) = self.sizing {
            return Err(RiverError::Input(format!(
                "a partition of more than the {n} records it was sized for arrived"
            )));
        }
        let next = match self.spare.take() {
            Some(a) => a,
            None => self.finish_spill()?.expect("a half is spare or spilling"),
        };
        let mut full = self.arena.replace(next).expect("a full arena");
        assert!(!full.is_empty(), "a full arena holds records");
        let path = PathBuf::from(format!("{}.{}", self.run_prefix.display(), self.runs.len()));
        let file = File::create(&path).map_err(|e| RiverError::io(format!("creating run {}", path.display()), e))?;
        // Register the run before writing, so a failure still removes its file.
        self.runs.push(Run { path, records: full.records() });
        let (pool, rs) = (self.write_pool.clone(), self.record_size);
        let thread = std::thread::Builder::new()
            .name("river-spill".into())
            .spawn(move || {
                let mut sink = DiskSink::new(Arc::new(file), 0, pool, rs);
                emit_sorted(&full, &mut sink)?;
                sink.close()?;
                full.clear();
                Ok(full)
            })
            .map_err(|e| RiverError::io("starting a spill thread", e))?;
        self.spilling = Some(thread);
        Ok(())
    }

    /// Writes the partition, sorted, to `out`: the arena in one pass when nothing was
    /// spilled, else the arena as a last run in memory and every run merged, the runs read
    /// ahead with `read_pool_bytes` of buffers.
    pub fn write_sorted<S: SpaceSink + ?Sized>(
        mut self,
        out: &mut S,
        read_pool_bytes: usize,
    ) -> Result<(), RiverError> {
        if self.arena.is_none() {
            self.set_buckets(Arc::new(KeyBuckets::single()))?;
        }
        let arena = self.arena.take().expect("set above");
        if self.runs.is_empty() {
            return emit_sorted(&arena, out);
        }
        // The half being filled stays in memory as the last run; the other is released,
        // and the merge reads the spilled runs with what is left.
        self.finish_spill()?;
        self.spare = None;
        let kept = (arena.capacity() as f64 * SORT_MEMORY_PER_BYTE) as usize;
        merge_runs(&self.runs, self.record_size, read_pool_bytes.saturating_sub(kept), Some(&arena), out)
    }
}

impl Sink for RecordStore {
    fn sink_records(&mut self, mut records: &[u8]) -> Result<(), RiverError> {
        let rs = self.record_size;
        if !records.len().is_multiple_of(rs) {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: rs });
        }
        loop {
            let taken = match self.arena.as_mut() {
                Some(arena) => arena.push_records(records),
                None => {
                    self.early.extend_from_slice(records);
                    records.len() / rs
                }
            };
            self.records += taken as u64;
            records = &records[taken * rs..];
            if records.is_empty() {
                return Ok(());
            }
            self.spill()?;
        }
    }

    fn sink_gathered(&mut self, records: &[u8], record_size: usize, mut which: &[u32]) -> Result<(), RiverError> {
        let rs = self.record_size;
        if record_size != rs {
            return Err(RiverError::Config(format!(
                "records of {record_size} bytes given to a store of {rs}-byte records"
            )));
        }
        loop {
            let taken = match self.arena.as_mut() {
                Some(arena) => arena.push_gathered(records, which),
                None => {
                    for &i in which {
                        self.early.extend_from_slice(&records[i as usize * rs..(i as usize + 1) * rs]);
                    }
                    which.len()
                }
            };
            self.records += taken as u64;
            which = &which[taken..];
            if which.is_empty() {
                return Ok(());
            }
            self.spill()?;
        }
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
/// a 4-byte index per record, plus the sort's two 16-byte entries per record of the
/// largest bucket (all of them, at worst, when every key is equal).
const SORT_MEMORY_PER_BYTE: f64 = 1.36;

/// Sorts the arena bucket by bucket and writes the records in order straight into the
/// space `out` lends (one copy per record).
pub fn emit_sorted<S: SpaceSink + ?Sized>(arena: &BucketArena, out: &mut S) -> Result<(), RiverError> {
    let rs = arena.record_size();
    arena.for_each_sorted(|a, mut entries| {
        while !entries.is_empty() {
            let space = out.space()?;
            let n = (space.len() / rs).min(entries.len());
            a.gather(&entries[..n], &mut space[..n * rs]);
            out.commit(n * rs)?;
            entries = &entries[n..];
        }
        Ok(())
    })
}

/// A sorted run being merged: read ahead from its file, or in memory in sorted order.
enum RunReader<'a> {
    Disk { source: DiskSource, buffer: Option<Buffer>, at: usize },
    Memory { arena: &'a BucketArena, order: Vec<u32>, at: usize },
}

impl RunReader<'_> {
    #[inline]
    fn current(&self, record_size: usize) -> Option<&[u8]> {
        match self {
            RunReader::Disk { buffer, at, .. } => buffer.as_ref().map(|b| &b.as_slice()[*at..*at + record_size]),
            RunReader::Memory { arena, order, at } => order.get(*at).map(|&i| arena.record(i as usize)),
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

/// Merges sorted runs into `out` with a tree of losers over the runs' current keys: the
/// spilled ones, each read ahead by a [`DiskSource`] with two buffers of its share of
/// `read_pool_bytes` (at least 64 KiB each), and the records of `in_memory` as one more run.
pub fn merge_runs<S: SpaceSink + ?Sized>(
    runs: &[Run],
    record_size: usize,
    read_pool_bytes: usize,
    in_memory: Option<&BucketArena>,
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
    if let Some(arena) = in_memory.filter(|a| !a.is_empty()) {
        let mut order = Vec::with_capacity(arena.records() as usize);
        arena.for_each_sorted(|_, entries| {
            order.extend(entries.iter().map(|&e| index_of(e) as u32));
            Ok::<(), RiverError>(())
        })?;
        readers.push(RunReader::Memory { arena, order, at: 0 });
    }
    let keys = readers
        .iter()
        .enumerate()
        .map(|(i, r)| r.current(record_size).map_or(EXHAUSTED, |rec| entry(rec, i as u64)))
        .collect();
    let mut tree = LoserTree::new(keys);
    while tree.winner().is_some() {
        let space = out.space()?;
        let mut filled = 0;
        while filled < space.len() {
            let Some(i) = tree.winner() else { break };
            let reader = &mut readers[i];
            copy_record(
                &mut space[filled..filled + record_size],
                reader.current(record_size).expect("a run in the tree has a record"),
            );
            filled += record_size;
            reader.advance(record_size)?;
            tree.replace_winner(reader.current(record_size).map_or(EXHAUSTED, |rec| entry(rec, i as u64)));
        }
        out.commit(filled)?;
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

    fn buckets_of(data: &[u8]) -> Arc<KeyBuckets> {
        let samples: Vec<u128> = data.chunks(100).step_by(50).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1 << 16))
    }

    fn sorted_out(store: RecordStore, read_pool_bytes: usize) -> Result<Vec<u8>, RiverError> {
        let mut out = Vec::new();
        let mut sink = VecSink::new(&mut out, 100);
        let mut staged = crate::StagedSink::new(&mut sink, 100, 640);
        store.write_sorted(&mut staged, read_pool_bytes)?;
        staged.flush()?;
        Ok(out)
    }

    #[test]
    fn spilling_store_merges_to_the_same_order_as_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let data = records(40_000, 7);
        let pool = MemPool::heap(2, 64 << 10);
        let arena_bytes = 2 * 40 * 32_700;
        let mut store = RecordStore::spilling(100, arena_bytes, dir.path().join("run"), pool.clone());
        // Records that come before the buckets are set wait for them.
        store.sink_records(&data[..100 * 100]).unwrap();
        store.set_buckets(buckets_of(&data)).unwrap();
        for piece in data[100 * 100..].chunks(300 * 100) {
            store.sink_records(piece).unwrap();
        }
        assert_eq!(store.records(), 40_000);
        assert!(store.runs().len() >= 3, "runs: {}", store.runs().len());
        let out = sorted_out(store, 1 << 20).unwrap();
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
    fn in_memory_store_sorts_in_one_pass_and_refuses_more_than_it_was_sized_for() {
        let data = records(3000, 11);
        let pool = MemPool::heap(1, 4096);
        let mut store = RecordStore::in_memory(100, 3000, pool.clone());
        store.set_buckets(buckets_of(&data)).unwrap();
        let odd: Vec<u32> = (0..1500).map(|i| 2 * i + 1).collect();
        let even: Vec<u8> = data.chunks(100).step_by(2).flatten().copied().collect();
        store.sink_gathered(&data, 100, &odd).unwrap();
        store.sink_records(&even).unwrap();
        let out = sorted_out(store, 0).unwrap();
        let s = ulnet_sortbench::Summary::of_records(&out).unwrap();
        assert!(s.is_sorted());
        assert_eq!(s.records, 3000);
        assert_eq!(s.checksum, ulnet_sortbench::Checksum::of_records(&data));

        let mut small = RecordStore::in_memory(100, 1000, pool);
        small.set_buckets(Arc::new(KeyBuckets::single())).unwrap();
        assert!(matches!(small.sink_records(&data), Err(RiverError::Input(_))));
    }
}
