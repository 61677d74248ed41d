//! Where a node keeps the records of its partition: a [`BucketArena`] and, in external
//! mode, key-range group files (the distribution pass, [`super::distribute`]). A partition
//! expected to outgrow the memory bound goes to the group files from its first record but
//! for the records of the first groups (*resident* groups: a memory's worth of records that
//! never touches the disk), which stay in the arena; one misjudged to fit fills the arena,
//! which then appends itself to the group files and keeps only the resident groups' later
//! records. And the ways out of it: a one-pass sort of the arena, bucket by bucket, or
//! group by group (the resident ones from the arena, the others from the group files),
//! with a merge of sorted runs for a group too large for memory.

use super::bucket::{copy_record, write_gathered, BucketArena, KeyBuckets, BLOCK_BYTES};
use super::distribute::{plan_groups, sort_groups, GroupFiles, GroupReport, PassTwo};
use super::radix::{entry, key};
use super::spare::SpareRoom;
use crate::disk::DiskSource;
use crate::error::RiverError;
use crate::flow::{Sink, Source, SpaceSink};
use crate::pool::{Buffer, MemPool};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A spilled, sorted run; its file is removed when it is dropped.
#[derive(Debug)]
pub struct Run {
    /// Its file.
    pub path: PathBuf,
    /// Records in it.
    pub records: u64,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The records of a node's partition.
#[derive(Debug)]
pub struct RecordStore {
    record_size: usize,
    /// Room for the records (in memory) or the memory bound (external mode).
    sizing: Sizing,
    /// The records, once the buckets are known ([`RecordStore::set_buckets`]) …
    arena: Option<BucketArena>,
    /// … and those that arrived before (from a node that learned the splitters sooner).
    early: Vec<u8>,
    /// External mode: the buckets …
    buckets: Option<Arc<KeyBuckets>>,
    /// … and the groups' bucket ranges …
    group_ranges: Vec<Range<usize>>,
    /// … the first of which stay in the arena once the partition is known not to fit …
    resident_planned: usize,
    /// … and, once the arena filled, the group files every record goes to …
    groups: Option<GroupFiles>,
    /// … named after this; the first groups' records that arrive after the spill stay in
    /// the arena instead (this many groups; 0 once they outgrew it).
    resident: usize,
    spill_prefix: PathBuf,
    /// Room in the output for group bytes past the page cache's share, once given.
    spare: Option<SpareRoom>,
    spill_time: Duration,
    spills: usize,
    records: u64,
}

/// How a store is sized.
#[derive(Clone, Copy, Debug)]
enum Sizing {
    /// One arena for this many records; more is an error.
    Records(usize),
    /// At most `arena_bytes` of records in memory; past them every record goes to the
    /// group files. The partition is expected to hold about `partition_bytes`.
    Bounded { arena_bytes: usize, partition_bytes: u64 },
}

/// Memory kept from the arena for the groups' staging buffers: a sixteenth of it, at most
/// 2 MiB (20 stages of 100 KiB; more groups share it in smaller stages).
fn stage_budget(arena_bytes: usize) -> usize {
    (arena_bytes / 16).min(2 << 20)
}

/// Share of the arena the resident groups are planned to fill: the rest is kept for a
/// partition larger than sampled and each bucket's partly filled last block.
const RESIDENT_FILL: f64 = 0.9;

/// Plans the groups of a partition of about `partition_bytes` in `buckets` for `arena`:
/// the bucket ranges (each at most [`super::distribute::plan_groups`]'s share of a half of
/// the arena), and how many of the first ones stay in the arena (resident) once the
/// partition is known not to fit. The resident groups end at the bucket where the arena is
/// expected to be [`RESIDENT_FILL`] full, so that they fill it whatever the groups' size;
/// never all of them (that partition would have fitted).
fn plan_resident(buckets: &KeyBuckets, partition_bytes: u64, arena: &BucketArena) -> (Vec<Range<usize>>, usize) {
    let n = buckets.len();
    let per_bucket = partition_bytes as f64 / n as f64 + BLOCK_BYTES as f64;
    let resident_buckets = ((arena.capacity() as f64 * RESIDENT_FILL / per_bucket) as usize).min(n - 1);
    let ranges = plan_groups(buckets, partition_bytes, arena.capacity() / 2, resident_buckets);
    let resident = ranges.iter().take_while(|r| r.end <= resident_buckets).count();
    (ranges, resident)
}

impl RecordStore {
    /// An in-memory store with room for `records` records (address space only, until
    /// written). It takes records once its buckets are set.
    pub fn in_memory(record_size: usize, records: usize) -> Self {
        Self::new(record_size, Sizing::Records(records), PathBuf::new())
    }

    /// A store that holds at most `arena_bytes` of records, for a partition of about
    /// `partition_bytes`: when the arena is full, its records and every later one are
    /// appended to key-range group files (`spill_prefix.gN`), to be sorted group by group
    /// in halves of the arena ([`RecordStore::write_sorted`]).
    pub fn spilling(record_size: usize, arena_bytes: usize, partition_bytes: u64, spill_prefix: PathBuf) -> Self {
        Self::new(record_size, Sizing::Bounded { arena_bytes, partition_bytes }, spill_prefix)
    }

    fn new(record_size: usize, sizing: Sizing, spill_prefix: PathBuf) -> Self {
        RecordStore {
            record_size,
            sizing,
            arena: None,
            early: Vec::new(),
            buckets: None,
            group_ranges: Vec::new(),
            resident_planned: 0,
            groups: None,
            resident: 0,
            spill_prefix,
            spare: None,
            spill_time: Duration::ZERO,
            spills: 0,
            records: 0,
        }
    }

    /// Sets the key-range buckets records are kept in (once), making the arena (and, in
    /// external mode, planning the groups), and takes the records that arrived before.
    pub fn set_buckets(&mut self, buckets: Arc<KeyBuckets>) -> Result<(), RiverError> {
        assert!(self.arena.is_none() && self.groups.is_none(), "buckets are set once");
        let rs = self.record_size;
        let reserve = |e| RiverError::io("reserving the record arena", e);
        match self.sizing {
            Sizing::Records(n) => self.arena = Some(BucketArena::new(buckets, rs, n).map_err(reserve)?),
            Sizing::Bounded { arena_bytes, partition_bytes } => {
                let stages = stage_budget(arena_bytes);
                let arena = BucketArena::bounded(buckets.clone(), rs, arena_bytes - stages).map_err(reserve)?;
                (self.group_ranges, self.resident_planned) = plan_resident(&buckets, partition_bytes, &arena);
                if partition_bytes > arena.capacity() as u64 {
                    // Expected not to fit: records go to the groups from the first one on,
                    // the resident groups' to the arena. Filling the arena with records of
                    // every group first would copy them all once more when it spills, and
                    // write the resident groups' share of them to files, to read back.
                    self.groups = Some(self.create_groups(&buckets, stages)?);
                    self.resident = self.resident_planned;
                    // All of the arena is used (by the resident groups, then as the second
                    // pass's halves): fault it in at once, while the memory the kernel
                    // hands out is likely still what was freed just before (on a virtual
                    // machine that returns freed memory to its host a few seconds later,
                    // memory faulted in later in the pass costs a host fault per page).
                    arena.populate().map_err(reserve)?;
                }
                self.arena = Some(arena);
                self.buckets = Some(buckets);
            }
        }
        let early = std::mem::take(&mut self.early);
        self.records -= (early.len() / rs) as u64;
        self.sink_records(&early)
    }

    /// The group files of the planned groups, staged in `stages` bytes in all, with the
    /// room in the output if given.
    fn create_groups(&mut self, buckets: &Arc<KeyBuckets>, stages: usize) -> Result<GroupFiles, RiverError> {
        let mut groups = GroupFiles::create(
            &self.spill_prefix,
            buckets.clone(),
            self.group_ranges.clone(),
            self.record_size,
            stages,
        )?;
        if let Some(room) = self.spare.take() {
            groups.use_spare(room, self.resident_planned);
        }
        Ok(groups)
    }

    /// Gives the store room in the output ([`super::spare`]) for the group bytes past
    /// `room.files_budget`, should it spill; before its buckets are set.
    pub fn set_spare(&mut self, room: SpareRoom) {
        assert!(self.groups.is_none(), "room is given before the groups exist");
        self.spare = Some(room);
    }

    /// Once every partition's size is known and before any node writes the output (this
    /// node's part of it is `part`): moves the group bytes in the output that it would
    /// overwrite before their group is read into the group files, and takes no more
    /// there. Returns the bytes moved.
    pub fn settle_spare(&mut self, part: Range<u64>) -> Result<u64, RiverError> {
        self.spare = None;
        let before = self.arena.as_ref().map_or(0, |a| a.records() * self.record_size as u64);
        match self.groups.as_mut() {
            Some(groups) => groups.settle_spare(part, before),
            None => Ok(0),
        }
    }

    /// Bytes of group records in the output's blocks ([`RecordStore::set_spare`]).
    pub fn spare_bytes(&self) -> u64 {
        self.groups.as_ref().map_or(0, GroupFiles::spare_bytes)
    }

    /// Records taken in.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Times the arena was full and its records went to the group files: 0 while
    /// everything fits (or the resident groups, planned from the start, fit), 1 once the
    /// memory bound was reached, 2 if the resident groups filled it again.
    pub fn spills(&self) -> usize {
        self.spills
    }

    /// Time taken to move the full arena to the group files.
    pub fn spill_time(&self) -> Duration {
        self.spill_time
    }

    /// The arena is full: its records go to the group files. After the first spill (or
    /// from the start, when planned so), so does every later record but those of the
    /// resident groups, which keep filling the arena; should they fill it, they go to the
    /// files too, and so do all later records (an in-memory store has nowhere to go: more
    /// records than it was sized for is an error).
    fn spill(&mut self) -> Result<(), RiverError> {
        let arena_bytes = match self.sizing {
            Sizing::Records(n) => {
                return Err(RiverError::Input(format!(
                    "a partition of more than the {n} records it was sized for arrived"
                )))
            }
            Sizing::Bounded { arena_bytes, .. } => arena_bytes,
        };
        let started = Instant::now();
        let mut arena = self.arena.take().expect("a full arena");
        let buckets = self.buckets.clone().expect("set with the arena");
        let first_spill = self.groups.is_none();
        let mut groups = match self.groups.take() {
            Some(g) => g,
            None => self.create_groups(&buckets, stage_budget(arena_bytes))?,
        };
        let moved = move_to_files(&mut arena, &mut groups);
        self.groups = Some(groups);
        moved?;
        arena.clear();
        self.resident = if first_spill { self.resident_planned } else { 0 };
        self.arena = Some(arena);
        self.spills += 1;
        self.spill_time += started.elapsed();
        Ok(())
    }

    /// Takes one record once the group files exist: into the arena for a resident group,
    /// else into its group's file. Always inlined (with [`GroupFiles::push_in`]) into the
    /// store's loops over a buffer's records: called once per record, a third of its
    /// profile samples sat in its prologue.
    #[inline(always)]
    fn push_spilled(&mut self, record: &[u8]) -> Result<(), RiverError> {
        let b = self.buckets.as_ref().expect("set before spilling").bucket_of(key(record));
        let groups = self.groups.as_mut().expect("spilled");
        if groups.group_of(b) < self.resident {
            if self.arena.as_mut().expect("kept after spilling").push_in(b, record) {
                return Ok(());
            }
            // The resident groups outgrew the arena.
            self.spill()?;
        }
        self.groups.as_mut().expect("spilled").push_in(b, record)
    }

    /// Writes the partition, sorted, to `out`: the arena in one pass when it held
    /// everything; else the resident groups from the arena (their records from the first
    /// spill read back into it through a buffer of `io_buffer_bytes`), then the other
    /// groups one by one ([`sort_groups`]) in two halves of the arena's memory, writing
    /// over-size groups' runs with buffers of `io_buffer_bytes` and merging them with
    /// `merge_read_bytes` of read-ahead.
    pub fn write_sorted<S: SpaceSink + ?Sized>(
        mut self,
        out: &mut S,
        io_buffer_bytes: usize,
        merge_read_bytes: usize,
    ) -> Result<GroupReport, RiverError> {
        if self.arena.is_none() && self.groups.is_none() {
            self.set_buckets(Arc::new(KeyBuckets::single()))?;
        }
        match (self.groups.take(), self.arena.take()) {
            (None, Some(mut arena)) => {
                emit_sorted(&mut arena, out)?;
                Ok(GroupReport::default())
            }
            (Some(mut groups), Some(mut arena)) => {
                groups.flush()?;
                let rs = self.record_size;
                let mut resident = self.resident;
                if resident > 0 && !resident_fit(&arena, &groups, resident) {
                    // The resident groups and what the first spill put in their files do
                    // not fit together: they go to the files as well.
                    move_to_files(&mut arena, &mut groups)?;
                    groups.flush()?;
                    arena.clear();
                    resident = 0;
                }
                let temp_bytes = groups.bytes();
                if resident > 0 {
                    let buckets = arena.buckets().clone();
                    let mut buffer = vec![0u8; (io_buffer_bytes / rs).max(1) * rs];
                    for g in 0..resident {
                        groups.drain(g, &mut buffer, |piece| {
                            for r in piece.chunks_exact(rs) {
                                let taken = arena.push_in(buckets.bucket_of(key(r)), r);
                                assert!(taken, "room for the resident groups was checked");
                            }
                            Ok(())
                        })?;
                    }
                }
                let pass = PassTwo { io_buffer_bytes, merge_read_bytes, run_prefix: self.spill_prefix.clone() };
                let mut report = sort_groups(groups, resident, arena, &pass, out)?;
                report.groups += resident;
                report.resident_groups = resident;
                report.temp_bytes = temp_bytes;
                Ok(report)
            }
            (Some(_), None) => unreachable!("the arena is kept after spilling"),
            (None, None) => unreachable!("set above"),
        }
    }
}

impl Sink for RecordStore {
    fn sink_records(&mut self, mut records: &[u8]) -> Result<(), RiverError> {
        let rs = self.record_size;
        if !records.len().is_multiple_of(rs) {
            return Err(RiverError::PartialRecord { len: records.len(), record_size: rs });
        }
        if self.groups.is_some() {
            for r in records.chunks_exact(rs) {
                self.push_spilled(r)?;
            }
            self.records += (records.len() / rs) as u64;
            return Ok(());
        }
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
        // The arena is full: from now on records go to the groups.
        self.spill()?;
        self.sink_records(records)
    }

    fn sink_gathered(&mut self, records: &[u8], record_size: usize, mut which: &[u32]) -> Result<(), RiverError> {
        let rs = self.record_size;
        if record_size != rs {
            return Err(RiverError::Config(format!(
                "records of {record_size} bytes given to a store of {rs}-byte records"
            )));
        }
        if self.groups.is_some() {
            for &i in which {
                self.push_spilled(&records[i as usize * rs..(i as usize + 1) * rs])?;
            }
            self.records += which.len() as u64;
            return Ok(());
        }
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
        // The arena is full: from now on records go to the groups.
        self.spill()?;
        self.sink_gathered(records, record_size, which)
    }

    fn close(&mut self) -> Result<(), RiverError> {
        Ok(())
    }
}

/// Appends every record of `arena` to its group's file.
fn move_to_files(arena: &mut BucketArena, groups: &mut GroupFiles) -> Result<(), RiverError> {
    arena.settle();
    let rs = arena.record_size();
    for b in 0..arena.buckets().len() {
        for block in arena.bucket_blocks(b) {
            for r in block.chunks_exact(rs) {
                groups.push_in(b, r)?;
            }
        }
    }
    Ok(())
}

/// Whether the first `resident` groups fit in `arena` (which holds their records that
/// came after the first spill) together with their records in the (flushed) group files:
/// the blocks every bucket needs then, counted exactly.
fn resident_fit(arena: &BucketArena, groups: &GroupFiles, resident: usize) -> bool {
    let per_block = arena.block_records() as u64;
    let mut blocks = 0u64;
    for g in 0..resident {
        let range = groups.ranges()[g].clone();
        for (b, in_file) in range.clone().zip(groups.bucket_records(g)) {
            blocks += (arena.bucket_records(b) as u64 + in_file).div_ceil(per_block);
        }
    }
    blocks <= arena.blocks_total() as u64
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

/// Sorts the arena bucket by bucket and writes the records in order into the space `out`
/// lends (gathered through a stage in the cache).
pub fn emit_sorted<S: SpaceSink + ?Sized>(arena: &mut BucketArena, out: &mut S) -> Result<(), RiverError> {
    arena.settle();
    let rs = arena.record_size();
    let mut stage = Vec::new();
    arena.for_each_sorted(|a, entries| write_gathered(entries, a.bytes(), rs, &mut stage, out))
}

/// A sorted run being merged, read ahead from its file.
struct RunReader {
    source: DiskSource,
    buffer: Option<Buffer>,
    at: usize,
}

impl RunReader {
    #[inline]
    fn current(&self, record_size: usize) -> Option<&[u8]> {
        self.buffer.as_ref().map(|b| &b.as_slice()[self.at..self.at + record_size])
    }

    #[inline]
    fn advance(&mut self, record_size: usize) -> Result<(), RiverError> {
        self.at += record_size;
        if self.buffer.as_ref().is_some_and(|b| self.at >= b.len()) {
            self.buffer = None;
            self.at = 0;
            self.buffer = self.source.next_buffer()?;
        }
        Ok(())
    }
}

/// Merges sorted runs into `out` with a tree of losers over the runs' current keys, each
/// run read ahead by a [`DiskSource`] with two buffers of its share of `read_pool_bytes`
/// (at least 64 KiB each).
pub fn merge_runs<S: SpaceSink + ?Sized>(
    runs: &[Run],
    record_size: usize,
    read_pool_bytes: usize,
    out: &mut S,
) -> Result<(), RiverError> {
    let per_buffer = (read_pool_bytes / (2 * runs.len().max(1))).clamp(64 << 10, 8 << 20) / record_size * record_size;
    let mut readers = Vec::with_capacity(runs.len());
    for run in runs {
        let pool = MemPool::heap(2, per_buffer);
        let len = run.records * record_size as u64;
        let mut source = DiskSource::open(&run.path, 0..len, record_size, pool, None)?;
        let buffer = source.next_buffer()?;
        readers.push(RunReader { source, buffer, at: 0 });
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
    use crate::sort::bucket::tests::records;
    use crate::VecSink;

    fn sorted_keys(data: &[u8]) -> Vec<Vec<u8>> {
        let mut k: Vec<Vec<u8>> = data.chunks(100).map(|r| r.to_vec()).collect();
        k.sort_by(|a, b| a[..10].cmp(&b[..10]));
        k
    }

    fn buckets_of(data: &[u8]) -> Arc<KeyBuckets> {
        bounded_buckets_of(data, 1 << 16)
    }

    fn bounded_buckets_of(data: &[u8], max_buckets: usize) -> Arc<KeyBuckets> {
        let samples: Vec<u128> = data.chunks(100).step_by(47).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, max_buckets))
    }

    fn sorted_out(store: RecordStore, merge_read_bytes: usize) -> Result<(Vec<u8>, GroupReport), RiverError> {
        let mut out = Vec::new();
        let mut sink = VecSink::new(&mut out, 100);
        let mut staged = crate::StagedSink::new(&mut sink, 100, 640);
        let report = store.write_sorted(&mut staged, 64 << 10, merge_read_bytes)?;
        staged.flush()?;
        Ok((out, report))
    }

    fn check_sorted(out: &[u8], data: &[u8]) {
        let got: Vec<Vec<u8>> = out.chunks(100).map(|r| r.to_vec()).collect();
        let want = sorted_keys(data);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g[..10], w[..10]);
        }
        assert_eq!(ulnet_sortbench::Checksum::of_records(out), ulnet_sortbench::Checksum::of_records(data));
    }

    /// Distributes `data` through a store of `arena_bytes` whose buckets come from
    /// `bucket_data`'s keys, then sorts it; checks the order and that every file is gone.
    /// The store expects the partition's true size: it plans the resident groups from the
    /// start.
    fn distribute(data: &[u8], bucket_data: &[u8], arena_bytes: usize) -> (GroupReport, usize) {
        distribute_expecting(data, bucket_data, arena_bytes, data.len() as u64)
    }

    /// As [`distribute`], the store expecting a partition of `partition_bytes`.
    fn distribute_expecting(
        data: &[u8],
        bucket_data: &[u8],
        arena_bytes: usize,
        partition_bytes: u64,
    ) -> (GroupReport, usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RecordStore::spilling(100, arena_bytes, partition_bytes, dir.path().join("spill"));
        // Records that come before the buckets are set wait for them.
        store.sink_records(&data[..100 * 100]).unwrap();
        // As the node plans them: eight blocks of a half per bucket.
        store.set_buckets(bounded_buckets_of(bucket_data, arena_bytes / 2 / BLOCK_BYTES / 8)).unwrap();
        for piece in data[100 * 100..].chunks(300 * 100) {
            store.sink_records(piece).unwrap();
        }
        assert_eq!(store.records(), (data.len() / 100) as u64);
        let spills = store.spills();
        let (out, report) = sorted_out(store, 1 << 20).unwrap();
        assert!(report.groups >= 2, "sorted group by group: {report:?}");
        check_sorted(&out, data);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "group and run files are removed");
        (report, spills)
    }

    /// Two halves of 64 blocks (2 MiB each): a tenth of 100,000 records' 10 MB each.
    const HALVES_OF_64_BLOCKS: usize = 2 * 64 * BLOCK_BYTES;

    /// Bytes of records the arena of a store of `arena_bytes` holds: a partition expected
    /// to be this large is expected to fit, and the groups are not made until it fills.
    fn arena_capacity(arena_bytes: usize) -> u64 {
        let arena = BucketArena::bounded(Arc::new(KeyBuckets::single()), 100, arena_bytes - stage_budget(arena_bytes));
        arena.unwrap().capacity() as u64
    }

    /// Bytes of `data` in the first `groups` groups of the store [`distribute`] makes.
    fn bytes_of_first_groups(data: &[u8], arena_bytes: usize, groups: usize) -> u64 {
        let buckets = bounded_buckets_of(data, arena_bytes / 2 / BLOCK_BYTES / 8);
        let arena = BucketArena::bounded(buckets.clone(), 100, arena_bytes - stage_budget(arena_bytes)).unwrap();
        let (ranges, _) = plan_resident(&buckets, data.len() as u64, &arena);
        let resident_buckets = ranges[..groups].iter().map(|r| r.end).max().unwrap_or(0);
        100 * data.chunks(100).filter(|r| buckets.bucket_of(key(r)) < resident_buckets).count() as u64
    }

    #[test]
    fn distribution_pass_sorts_group_by_group() {
        let data = records(100_000, 7);
        let (report, spills) = distribute(&data, &data, HALVES_OF_64_BLOCKS);
        // Expected not to fit, the partition went to the groups from its first record on:
        // the arena never filled, and the resident groups never went to disk at all.
        assert_eq!(spills, 0);
        assert!(report.groups >= 3, "{report:?}");
        assert_eq!(report.merged_groups, 0, "sampled groups fit: {report:?}");
        assert!(report.resident_groups >= 1, "{report:?}");
        let resident_bytes = bytes_of_first_groups(&data, HALVES_OF_64_BLOCKS, report.resident_groups);
        assert_eq!(report.temp_bytes, data.len() as u64 - resident_bytes, "{report:?}");
        // With 8 buckets, the first group read back (one bucket) is larger than the memory
        // it could be read into while the resident groups are written.
        assert!(!report.preloaded, "{report:?}");
    }

    #[test]
    fn the_first_group_read_back_is_read_while_the_resident_groups_are_written() {
        // 30 MB in halves of 8 MiB (32 buckets): groups of 6 buckets, the first read back
        // of 2 (about 1.9 MB), which fits the fifth of the arena it may take meanwhile.
        let data = records(300_000, 11);
        let (report, spills) = distribute(&data, &data, 2 * 256 * BLOCK_BYTES);
        assert_eq!(spills, 0);
        assert!(report.resident_groups >= 1, "{report:?}");
        assert!(report.preloaded, "{report:?}");
    }

    #[test]
    fn a_partition_misjudged_to_fit_spills_the_full_arena_and_keeps_the_first_groups() {
        // Expected to fit, 15 % more than the arena holds arrives: it fills the arena,
        // which goes to the files; the first groups' records that come after stay in
        // memory (the groups are planned for the expected size: 4 of 2 buckets, 3 of them
        // resident).
        let capacity = arena_capacity(HALVES_OF_64_BLOCKS);
        let data = records((capacity * 115 / 100 / 100) as usize, 7);
        let (report, spills) = distribute_expecting(&data, &data, HALVES_OF_64_BLOCKS, capacity);
        assert_eq!(spills, 1);
        assert!(report.groups >= 2, "{report:?}");
        assert!(report.resident_groups >= 1, "{report:?}");
        assert!(report.temp_bytes < data.len() as u64, "{report:?}");
        assert!(report.temp_bytes >= capacity, "{report:?}");
    }

    /// `n` records whose first key byte is drawn from `first_bytes` (the rest random).
    fn records_starting(n: usize, seed: u64, first_bytes: std::ops::Range<u8>) -> Vec<u8> {
        let mut data = records(n, seed);
        let span = u32::from(first_bytes.end - first_bytes.start);
        for r in data.chunks_mut(100) {
            r[0] = first_bytes.start + (u32::from(r[0]) % span) as u8;
        }
        data
    }

    #[test]
    fn resident_groups_that_outgrow_the_arena_go_to_their_files() {
        // The buckets come from uniform keys (eight of them, a group each); from the 40,000th
        // record on, two records in three fall in the first group, which stays in memory
        // until it fills the arena: then it and every later record go to the files. Planned
        // from the start, that is the arena's one spill; misjudged to fit, its second.
        let buckets_from = records(100_000, 7);
        let mut data = records(100_000, 9);
        for (i, r) in data.chunks_mut(100).enumerate().skip(40_000) {
            if i % 3 != 0 {
                r[0] = 0;
            }
        }
        for (expected, spills_wanted) in [(data.len() as u64, 1), (arena_capacity(HALVES_OF_64_BLOCKS), 2)] {
            let (report, spills) = distribute_expecting(&data, &buckets_from, HALVES_OF_64_BLOCKS, expected);
            assert_eq!(spills, spills_wanted, "the resident groups filled the arena");
            assert_eq!(report.resident_groups, 0, "{report:?}");
            // No resident groups to write: the halves are free for the first group at once.
            assert!(!report.preloaded, "{report:?}");
            assert!(report.merged_groups >= 1, "{report:?}");
            assert_eq!(report.temp_bytes, data.len() as u64, "{report:?}");
        }
    }

    #[test]
    fn resident_groups_too_large_with_their_spilled_part_go_to_their_files() {
        // Misjudged to fit (groups planned for the arena's size: the buckets are about key
        // eighths, and the first 3 groups, the keys below 0xe0, are resident), the arena
        // (about 39,000 records) first fills with records of the first group and spills
        // them; then 25,000 more of that group stay in memory (they fit) with 35,000 of the
        // last group (keys from 0xe0) going to files; at the end the first group's two parts
        // do not fit together, so it is sorted from its file (as runs, being larger than a
        // half).
        let buckets_from = records(100_000, 7);
        let mut data = records_starting(40_000, 9, 0..0x20);
        let tail_first = records_starting(25_000, 11, 0..0x20);
        let tail_later = records_starting(35_000, 13, 0xe0..0xff);
        for (i, (a, b)) in tail_first.chunks(100).zip(tail_later.chunks(100)).enumerate() {
            data.extend_from_slice(a);
            data.extend_from_slice(b);
            if i == 24_999 {
                data.extend_from_slice(&tail_later[25_000 * 100..]);
            }
        }
        assert_eq!(data.len(), 100_000 * 100);
        let (report, spills) =
            distribute_expecting(&data, &buckets_from, HALVES_OF_64_BLOCKS, arena_capacity(HALVES_OF_64_BLOCKS));
        assert_eq!(spills, 1, "the resident part alone fitted");
        assert_eq!(report.resident_groups, 0, "{report:?}");
        assert!(report.merged_groups >= 1, "{report:?}");
    }

    #[test]
    fn distribution_pass_keeps_groups_balanced_on_skewed_keys() {
        // Nine records in ten share their first 8 key bytes; the buckets (from the same
        // keys) follow the skew, so no group outgrows a half.
        let mut data = records(100_000, 5);
        for (i, r) in data.chunks_mut(100).enumerate() {
            if i % 10 != 0 {
                r[..8].copy_from_slice(b"SKEWSKEW");
            }
        }
        let (report, spills) = distribute(&data, &data, HALVES_OF_64_BLOCKS);
        assert_eq!(spills, 0);
        assert!(report.groups >= 3, "{report:?}");
        assert_eq!(report.merged_groups, 0, "{report:?}");
    }

    #[test]
    fn a_group_larger_than_memory_is_merged_from_runs() {
        // The buckets come from uniform keys, but a third of the records carry one key:
        // its group cannot fit in a half and is sorted as runs and merged.
        let buckets_from = records(100_000, 7);
        let mut data = records(100_000, 9);
        for r in data.chunks_mut(100).step_by(3) {
            r[..10].copy_from_slice(b"0123456789");
        }
        let (report, _) = distribute(&data, &buckets_from, HALVES_OF_64_BLOCKS);
        assert!(report.merged_groups >= 1, "{report:?}");
        assert!(report.runs >= 2, "{report:?}");
    }

    #[test]
    fn failed_spill_directory_is_an_error_not_a_short_output() {
        let data = records(20_000, 3);
        // Expected not to fit (the group files are made with the buckets), and misjudged to
        // fit (they are made when the arena fills).
        for expected in [data.len() as u64, 100] {
            let mut store = RecordStore::spilling(100, 2 * 10 * 32_700, expected, "/nonexistent/dir/spill".into());
            let r = store.set_buckets(buckets_of(&data));
            let r = r.and_then(|_| data.chunks(300 * 100).try_for_each(|piece| store.sink_records(piece)));
            let r = r.and_then(|_| sorted_out(store, 1 << 20).map(|_| ()));
            assert!(matches!(r, Err(RiverError::Io { .. })), "expecting {expected} bytes: {r:?}");
        }
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
        let mut store = RecordStore::in_memory(100, 3000);
        store.set_buckets(buckets_of(&data)).unwrap();
        let odd: Vec<u32> = (0..1500).map(|i| 2 * i + 1).collect();
        let even: Vec<u8> = data.chunks(100).step_by(2).flatten().copied().collect();
        store.sink_gathered(&data, 100, &odd).unwrap();
        store.sink_records(&even).unwrap();
        let (out, _) = sorted_out(store, 0).unwrap();
        let s = ulnet_sortbench::Summary::of_records(&out).unwrap();
        assert!(s.is_sorted());
        assert_eq!(s.records, 3000);
        assert_eq!(s.checksum, ulnet_sortbench::Checksum::of_records(&data));

        let mut small = RecordStore::in_memory(100, 1000);
        small.set_buckets(Arc::new(KeyBuckets::single())).unwrap();
        assert!(matches!(small.sink_records(&data), Err(RiverError::Input(_))));
    }
}
