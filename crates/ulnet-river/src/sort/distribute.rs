//! The distribution pass of external mode: instead of sorted runs that a second pass must
//! merge, the first pass appends each full half of memory to key-range *group* files, and
//! the second pass sorts one group at a time in memory and appends it to the output.
//!
//! ```text
//!  pass 1   arena half full ──► its buckets, group by group, appended to group files
//!           (large vectored writes of the buckets' blocks, on a spill thread)
//!  pass 2   loader thread:  read group i+1 into a free half  ─┐
//!           node thread:    sort group i bucket by bucket ◄───┘ ─► output writer thread
//!                                                                  (writing group i-1)
//! ```
//!
//! Each append writes a group's buckets one after the other, and the records of each are
//! counted ([`GroupFiles::append`]), so the second pass reads a group file in one piece
//! into a half and finds every bucket's records in it without looking at a key: a bucket
//! is sorted from its pieces of each append.
//!
//! A group is a run of consecutive key-range buckets; the buckets hold about equal numbers
//! of sampled keys, so groups stay about equal on skewed keys too. A group that still
//! does not fit in a half (sampling missed a heavy key range, or one key repeats past a
//! half) is not lost or truncated: the loader sorts it half by half into runs and the node
//! merges them ([`Loaded::Runs`]), counted in [`GroupReport::merged_groups`].

use super::bucket::{copy_record, BucketArena, KeyBuckets};
use super::radix::{entry, index_of, sort_entries};
use super::store::{emit_sorted, merge_runs, Run};
use crate::error::RiverError;
use crate::flow::{Sink, SpaceSink};
use crate::pool::MemPool;
use crate::DiskSink;
use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// Most slices handed to one `writev(2)` (the kernel's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;
/// Room left in a half for what sampling misjudged when choosing the number of groups: a
/// group is planned at 4/5 of a half, so a partition up to 25% larger than the mean still
/// has groups that fit.
const GROUP_FILL: f64 = 0.8;

/// Splits `buckets` into key-range groups so that a partition of `partition_bytes` puts
/// at most [`GROUP_FILL`] of `half_bytes` in each: consecutive ranges of the same number
/// of buckets (each bucket holds about as many sampled keys as the next; the last range
/// may be shorter). At least two groups (one would be the whole partition, which does not
/// fit), at most one per bucket.
pub fn plan_groups(buckets: &KeyBuckets, partition_bytes: u64, half_bytes: usize) -> Vec<Range<usize>> {
    let n = buckets.len();
    let wanted = ((partition_bytes as f64 / (half_bytes as f64 * GROUP_FILL)).ceil() as usize).max(2);
    // Whole buckets per group, rounded down: no group holds more than its share.
    let per_group = (n / wanted).max(1);
    (0..n.div_ceil(per_group)).map(|i| i * per_group..((i + 1) * per_group).min(n)).collect()
}

/// The group files of a node: each holds the records of its bucket range, in no order.
/// The files are removed when this is dropped.
#[derive(Debug)]
pub struct GroupFiles {
    paths: Vec<PathBuf>,
    files: Vec<File>,
    ranges: Vec<Range<usize>>,
    records: Vec<u64>,
    /// Per group: records of each of its buckets in each append, append after append.
    counts: Vec<Vec<u32>>,
    record_size: usize,
    /// Halves appended.
    appends: usize,
}

impl GroupFiles {
    /// Creates one file per group (`prefix.gN`).
    pub fn create(prefix: &Path, ranges: Vec<Range<usize>>, record_size: usize) -> Result<Self, RiverError> {
        let mut g = GroupFiles {
            paths: Vec::with_capacity(ranges.len()),
            files: Vec::with_capacity(ranges.len()),
            records: vec![0; ranges.len()],
            counts: vec![Vec::new(); ranges.len()],
            ranges,
            record_size,
            appends: 0,
        };
        for i in 0..g.ranges.len() {
            let path = PathBuf::from(format!("{}.g{i}", prefix.display()));
            let file =
                File::create(&path).map_err(|e| RiverError::io(format!("creating group {}", path.display()), e))?;
            // Registered before anything is written, so that a failure still removes it.
            g.paths.push(path);
            g.files.push(file);
        }
        Ok(g)
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are no groups.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Records appended to each group.
    pub fn records(&self) -> &[u64] {
        &self.records
    }

    /// Halves of memory appended so far.
    pub fn appends(&self) -> usize {
        self.appends
    }

    /// Appends the records of `arena`, each bucket's blocks to its group's file, with
    /// vectored writes straight from the blocks (no copy).
    pub fn append(&mut self, arena: &BucketArena) -> Result<(), RiverError> {
        let mut slices: Vec<IoSlice<'_>> = Vec::new();
        for (g, range) in self.ranges.iter().enumerate() {
            slices.clear();
            for b in range.clone() {
                let before = slices.len();
                slices.extend(arena.bucket_blocks(b).map(IoSlice::new));
                let bytes: usize = slices[before..].iter().map(|s| s.len()).sum();
                self.counts[g].push((bytes / self.record_size) as u32);
            }
            let bytes: usize = slices.iter().map(|s| s.len()).sum();
            write_all_vectored(&mut self.files[g], &mut slices)
                .map_err(|e| RiverError::io(format!("appending to group {}", self.paths[g].display()), e))?;
            self.records[g] += (bytes / self.record_size) as u64;
        }
        self.appends += 1;
        Ok(())
    }
}

impl Drop for GroupFiles {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn write_all_vectored(file: &mut File, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        let end = slices.len().min(MAX_IOVECS);
        match file.write_vectored(&slices[..end]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What the second pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupReport {
    /// Groups sorted.
    pub groups: usize,
    /// Groups that did not fit in a half and were sorted as runs and merged.
    pub merged_groups: usize,
    /// Runs those groups were sorted into.
    pub runs: usize,
}

/// A group read back, ready for the node thread.
enum Loaded {
    /// The whole group, read flat into a half: group number and bytes.
    Whole(BucketArena, usize, usize),
    /// A group larger than a half: its sorted runs on disk and its last part in memory.
    Runs { runs: Vec<Run>, last: BucketArena },
}

/// How the second pass reads and merges.
#[derive(Clone, Debug)]
pub struct PassTwo {
    /// Size of the loader's read buffer (and of each run write buffer of an over-size
    /// group).
    pub io_buffer_bytes: usize,
    /// Read-ahead memory for merging the runs of an over-size group.
    pub merge_read_bytes: usize,
    /// Prefix of the run files of over-size groups.
    pub run_prefix: PathBuf,
}

/// The second pass: sorts the groups in key order into `out`, each in one of `halves`
/// (emptied arenas over the node's buckets), reading the next group on a loader thread
/// while this thread sorts the current one and `out` writes the one before. Each group
/// file is removed once read.
pub fn sort_groups<S: SpaceSink + ?Sized>(
    mut groups: GroupFiles,
    halves: [BucketArena; 2],
    pass: &PassTwo,
    out: &mut S,
) -> Result<GroupReport, RiverError> {
    let n = groups.len();
    let rs = groups.record_size;
    let layouts: Vec<(Range<usize>, Vec<u32>)> =
        groups.ranges.iter().cloned().zip(std::mem::take(&mut groups.counts)).collect();
    std::thread::scope(|scope| {
        let (loaded_tx, loaded_rx) = mpsc::sync_channel::<Loaded>(1);
        let (free_tx, free_rx) = mpsc::channel::<BucketArena>();
        for h in halves {
            free_tx.send(h).expect("the receiver is here");
        }
        let loader = std::thread::Builder::new()
            .name("river-group-load".into())
            .spawn_scoped(scope, move || load_groups(groups, free_rx, loaded_tx, pass))
            .map_err(|e| RiverError::io("starting the group loader", e))?;
        let mut report = GroupReport::default();
        let sorted = (|| {
            for loaded in loaded_rx.iter() {
                let mut arena = match loaded {
                    Loaded::Whole(arena, g, bytes) => {
                        let (range, counts) = &layouts[g];
                        emit_flat_group(&arena.flat()[..bytes], rs, range.len(), counts, out)?;
                        arena
                    }
                    Loaded::Runs { runs, last } => {
                        report.merged_groups += 1;
                        report.runs += runs.len();
                        merge_runs(&runs, rs, pass.merge_read_bytes, Some(&last), out)?;
                        last
                    }
                };
                report.groups += 1;
                arena.clear();
                // The loader stops taking halves once every group is read.
                let _ = free_tx.send(arena);
            }
            Ok::<(), RiverError>(())
        })();
        // Unblock a loader waiting on either channel before joining it.
        drop(loaded_rx);
        drop(free_tx);
        let loaded =
            loader.join().unwrap_or_else(|_| Err(RiverError::io("loading groups", std::io::Error::other("panicked"))));
        sorted?;
        loaded?;
        if report.groups != n {
            return Err(RiverError::io(
                "loading groups",
                std::io::Error::other(format!("{} of {n} groups were sorted", report.groups)),
            ));
        }
        Ok(report)
    })
}

/// The loader: reads each group into a free half and hands it over, in group order. A
/// group that overflows its half is sorted into runs, half by half.
fn load_groups(
    mut groups: GroupFiles,
    free: mpsc::Receiver<BucketArena>,
    loaded: mpsc::SyncSender<Loaded>,
    pass: &PassTwo,
) -> Result<(), RiverError> {
    let rs = groups.record_size;
    let mut buf = Vec::new();
    for g in 0..groups.len() {
        // The node thread stopped (it failed, and reports why): nothing more to do.
        let Ok(mut arena) = free.recv() else { return Ok(()) };
        debug_assert!(arena.is_empty());
        let path = groups.paths[g].clone();
        let read_err = |e| RiverError::io(format!("reading group {}", path.display()), e);
        let mut file = File::open(&path).map_err(read_err)?;
        let bytes = groups.records[g] as usize * rs;
        if bytes <= arena.flat().len() {
            let n = read_full(&mut file, &mut arena.flat_mut()[..bytes]).map_err(read_err)?;
            if n != bytes || read_full(&mut file, &mut [0u8; 1]).map_err(read_err)? != 0 {
                return Err(RiverError::io(
                    format!("reading group {}", path.display()),
                    std::io::Error::other(format!("{n} bytes read, {bytes} written")),
                ));
            }
            drop(file);
            let _ = std::fs::remove_file(&path);
            if loaded.send(Loaded::Whole(arena, g, bytes)).is_err() {
                return Ok(());
            }
            continue;
        }
        // Larger than a half: taken in through the buckets, half by half, as sorted runs.
        buf.resize(pass.io_buffer_bytes.max(rs) / rs * rs, 0);
        let mut runs: Vec<Run> = Vec::new();
        let mut read = 0u64;
        loop {
            let n = read_full(&mut file, &mut buf).map_err(read_err)?;
            if n == 0 {
                break;
            }
            if n % rs != 0 {
                return Err(RiverError::PartialRecord { len: n, record_size: rs });
            }
            read += (n / rs) as u64;
            let mut records = &buf[..n];
            loop {
                let taken = arena.push_records(records);
                records = &records[taken * rs..];
                if records.is_empty() {
                    break;
                }
                // The half is full before the group ends: sort what it holds as a run.
                runs.push(write_run(&arena, pass, g, runs.len(), rs)?);
                arena.clear();
            }
        }
        if read != groups.records[g] {
            return Err(RiverError::io(
                format!("reading group {}", path.display()),
                std::io::Error::other(format!("{read} records read, {} written", groups.records[g])),
            ));
        }
        drop(file);
        let _ = std::fs::remove_file(&path);
        tracing::info!(group = g, runs = runs.len(), "a group larger than half the memory bound is merged");
        if loaded.send(Loaded::Runs { runs, last: arena }).is_err() {
            return Ok(());
        }
    }
    // Every file is read and removed; dropping `groups` removes nothing more.
    groups.paths.clear();
    Ok(())
}

/// Sorts a group read flat (`data`, the appends one after the other, each holding the
/// group's `buckets` buckets in turn with `counts` records each) bucket by bucket into
/// `out`.
fn emit_flat_group<S: SpaceSink + ?Sized>(
    data: &[u8],
    rs: usize,
    buckets: usize,
    counts: &[u32],
    out: &mut S,
) -> Result<(), RiverError> {
    assert!(buckets > 0 && counts.len().is_multiple_of(buckets), "whole appends");
    let appends = counts.len() / buckets;
    // Where each piece starts (records), in the order the appends wrote them.
    let mut starts = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        starts.push(at);
        at += c as usize;
    }
    assert_eq!(at * rs, data.len(), "the counts cover the group");
    let mut entries: Vec<u128> = Vec::new();
    let mut scratch: Vec<u128> = Vec::new();
    for b in 0..buckets {
        entries.clear();
        for a in 0..appends {
            let piece = a * buckets + b;
            let first = starts[piece];
            let records = &data[first * rs..(first + counts[piece] as usize) * rs];
            entries.extend(records.chunks_exact(rs).enumerate().map(|(i, r)| entry(r, (first + i) as u64)));
        }
        if entries.is_empty() {
            continue;
        }
        let mut sorted = sort_entries(&mut entries, &mut scratch);
        while !sorted.is_empty() {
            let space = out.space()?;
            let n = (space.len() / rs).min(sorted.len());
            for (d, &e) in space[..n * rs].chunks_exact_mut(rs).zip(&sorted[..n]) {
                let i = index_of(e) * rs;
                copy_record(d, &data[i..i + rs]);
            }
            out.commit(n * rs)?;
            sorted = &sorted[n..];
        }
    }
    Ok(())
}

fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match file.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

fn write_run(arena: &BucketArena, pass: &PassTwo, group: usize, index: usize, rs: usize) -> Result<Run, RiverError> {
    let path = PathBuf::from(format!("{}.g{group}.r{index}", pass.run_prefix.display()));
    let file = File::create(&path).map_err(|e| RiverError::io(format!("creating run {}", path.display()), e))?;
    let run = Run { path, records: arena.records() };
    let pool = MemPool::heap(2, pass.io_buffer_bytes.max(rs) / rs * rs);
    let mut sink = DiskSink::new(Arc::new(file), 0, pool, rs);
    emit_sorted(arena, &mut sink)?;
    sink.close()?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_split_the_buckets_in_equal_consecutive_ranges() {
        let samples: Vec<u128> = (0..4000u128).map(|i| (i * 7919 % 4000) << 90).collect();
        let buckets = KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1 << 16);
        let n = buckets.len();
        let g = plan_groups(&buckets, 1000, 100);
        // 1000 bytes in halves of 100 filled to 80 %: 13 groups wanted, so at most
        // n / 13 buckets each.
        assert!(g.len() >= 13, "{}", g.len());
        assert_eq!(g.first().unwrap().start, 0);
        assert_eq!(g.last().unwrap().end, n);
        assert!(g.windows(2).all(|w| w[0].end == w[1].start));
        assert!(g.iter().all(|r| !r.is_empty() && r.len() <= n / 13), "{g:?}");
        // Never fewer than two, never more than the buckets.
        assert!((2..=3).contains(&plan_groups(&buckets, 1, 1 << 30).len()));
        assert_eq!(plan_groups(&buckets, 1 << 40, 1).len(), n);
        assert_eq!(plan_groups(&KeyBuckets::single(), 1 << 40, 1).len(), 1);
    }
}
