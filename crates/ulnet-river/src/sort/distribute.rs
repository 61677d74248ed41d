//! The distribution pass of external mode: instead of sorted runs that a second pass must
//! merge, the first pass appends every record to the file of its key-range *group*, and
//! the second pass sorts one group at a time in memory and appends it to the output.
//!
//! ```text
//!  pass 1   record ──► its group's staging buffer ──(full: one write)──► group file
//!           (but records of the first groups, which stay in the arena)
//!  pass 2   node thread:    first groups from the arena (their spilled part read back in)
//!           loader thread:  read group i+1 into a free half,     ─┐
//!                           each bucket's records together        │
//!           node thread:    sort group i bucket by bucket      ◄───┘ ─► output writer
//!                                                                       (group i-1)
//! ```
//!
//! A group is a run of consecutive key-range buckets; the buckets hold about equal numbers
//! of sampled keys, so groups stay about equal on skewed keys too. Records are staged per
//! group and written as they came; the first pass only counts the records of each bucket.
//! The second pass reads a group file piece by piece, moving every record to its bucket's
//! place in a half (the counts say where each bucket starts; the `scatter` module writes the
//! places in whole lines that bypass the cache), and sorts the buckets one by
//! one (each a few megabytes of records at most, which the caches hold), gathering their
//! records into the output. Putting records in bucket order is left to the second pass,
//! which moves each record out of its read buffer anyway, not the first, which would need
//! one more copy of every record on cores it already keeps busy.
//! A group that does not fit in a half (a key repeated past it, or sampling that missed a
//! heavy key range) is not lost or truncated: the loader sorts it half by half into runs
//! (`FlatSorter`) and the node merges them ([`GroupReport::merged_groups`]). The halves
//! are the arena's memory, faulted in before or during the first pass: on a virtual
//! machine that returns freed memory to its host, new memory costs a host fault per page,
//! reused memory does not.
//!
//! Group bytes past what the page cache holds without writing back go into the output's
//! own blocks instead of the files, where the second pass reads them before the output
//! overwrites them (the `spare` module says why and where).

use super::bucket::{copy_record, fewest_records_filling, write_gathered, BucketArena, KeyBuckets};
use super::radix::{entry, key, sort_entries};
use super::scatter::Scatter;
use super::spare::{Chunk, SpareCells, SpareRoom};
use super::store::{emit_sorted, merge_runs, Run};
use crate::error::RiverError;
use crate::flow::{Sink, SpaceSink};
use crate::pool::MemPool;
use crate::DiskSink;
use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// Room left in a half for what sampling misjudged when choosing the number of groups: a
/// group is planned at 4/5 of a half, so a partition up to 25% larger than the mean still
/// has groups that fit.
const GROUP_FILL: f64 = 0.8;
/// Most bytes staged per group before they are written (in one `write`): 100 KiB, which
/// holds 1,024 Sort Benchmark records in exactly 25 pages ([`stage_bytes`]).
///
/// So that the stages of all groups (15 of them per node in the 4x10^7 benchmark) stay in
/// the second-level cache, where the first pass appends records and the `write` reads
/// them again: with 1 MiB stages (written in 256 KiB pieces) that sort took 6.90 s against
/// 6.07 s (medians of 4 alternating rounds, slower in all 4; pass 1 3.88 against 3.32 s).
///
/// And small writes: the page cache gives a write folios up to the write's size (2 MiB at
/// most), and on the development VM, which hands free 2 MiB blocks back to its host, large
/// folios come from memory the host must fault in again: 1.7 GB of new file data in
/// aligned 1 MiB writes took 2.3–2.9 s of system time, in 64–512 KiB writes 0.44–0.73 s;
/// the sort with 1 MiB stages each written whole: 8.52 s against 6.94 s in 256 KiB
/// pieces. See BENCHMARKS.md (issue 8).
const STAGE_BYTES_MAX: usize = 100 << 10;
/// Page size: a stage of whole pages makes every write to a group file start and end on
/// page boundaries.
const PAGE: usize = 4096;

/// Bytes of a group's stage, from its share of the staging memory: whole records and, when
/// the share allows, whole pages (the fewest records that fill whole pages, times as many as
/// fit), at most [`STAGE_BYTES_MAX`]. A write that starts or ends inside a page makes the
/// file system take that page twice: two writers of 900 MB each into 15 files took 0.33–0.40
/// s of system time in writes of 65,500 bytes, 0.25 s in 102,400 (whole pages) and 0.21 s
/// in 65,536 (BENCHMARKS.md, issue 8).
fn stage_bytes(share: usize, record_size: usize) -> usize {
    let share = share.clamp(record_size, STAGE_BYTES_MAX.max(record_size));
    let paged = fewest_records_filling(PAGE, record_size) * record_size;
    let unit = if share >= paged { paged } else { record_size };
    share / unit * unit
}
/// Bytes of a group's file before the group goes on in a new one: 16 MiB.
///
/// Once dirty file data passes the kernel's background threshold (about 2.2 GB here, a
/// tenth of the memory it may use for files), the flusher writes group files back while
/// pass 1 still appends to them, and an append that adds a delayed block waits for the
/// file's `i_data_sem` while the flusher allocates its blocks: in traces of the 4x10^7
/// sort the node threads waited there 0.37–0.49 s per run, and the other node for them.
/// The flusher takes the files dirtied first; in pieces of 16 MiB those are ones pass 1
/// has finished with.
const SEGMENT_BYTES: u64 = 16 << 20;
/// Bytes of a group file read at a time in the second pass before its records move to
/// their buckets' places: 256 KiB, which stays in the second-level cache between the
/// read that fills it and the moves that empty it.
const SCATTER_PIECE_BYTES: usize = 256 << 10;

/// Most memory, as a share of the arena, the second pass may take beside it for the first
/// group read back while the resident groups are written ([`sort_groups`]): 0.2. The
/// memory plan keeps 0.32 of the arena for the sort beside it (`SORT_OVERHEAD` in
/// `node.rs`); of that, while the preloaded group is sorted, the loader may be sorting an
/// over-size group flat into runs (an entry of 16 bytes per record of a half, 0.08) and
/// the node thread sorts a bucket (a few hundred kilobytes).
const PRELOAD_SHARE: f64 = 0.2;

/// The first two groups read back from the files, in thirds of the others: a third, so
/// that it fits the memory it is read into while the resident groups still hold the arena
/// ([`sort_groups`]) with room to spare for a partition larger than sampled; then two
/// thirds, which the loader reads (once the arena is free) in less time than the node
/// takes to sort the first. After a third, a whole group kept the node waiting 54–78 ms.
const FIRST_READ_THIRDS: [usize; 2] = [1, 2];

/// Splits `buckets` into key-range groups so that a partition of `partition_bytes` puts
/// at most `GROUP_FILL` of `half_bytes` in each: consecutive ranges of the same number
/// of buckets (each bucket holds about as many sampled keys as the next), those below
/// bucket `split` (the resident ones) and those from it apart, so that a group ends there
/// (the last range of each part may be shorter), the first two from `split` on smaller
/// (`FIRST_READ_THIRDS`). At least two groups (one would be the whole partition, which
/// does not fit), at most one per bucket.
pub fn plan_groups(buckets: &KeyBuckets, partition_bytes: u64, half_bytes: usize, split: usize) -> Vec<Range<usize>> {
    let n = buckets.len();
    let wanted = ((partition_bytes as f64 / (half_bytes as f64 * GROUP_FILL)).ceil() as usize).max(2);
    // Whole buckets per group, rounded down: no group holds more than its share.
    let per_group = (n / wanted).max(1);
    let split = split.min(n);
    let part = move |r: Range<usize>| r.clone().step_by(per_group).map(move |s| s..(s + per_group).min(r.end));
    let mut ramp = Vec::with_capacity(FIRST_READ_THIRDS.len());
    let mut at = split;
    for thirds in FIRST_READ_THIRDS {
        let end = (at + (per_group * thirds / 3).max(1)).min(n);
        if end > at {
            ramp.push(at..end);
        }
        at = end;
    }
    part(0..split).chain(ramp).chain(part(at..n)).collect()
}

/// The group files of a node: each group's records of its bucket range, in arrival order,
/// in files of `SEGMENT_BYTES` one after another. The files are removed when this is
/// dropped.
#[derive(Debug)]
pub struct GroupFiles {
    prefix: PathBuf,
    /// Each group's files, in order.
    segments: Vec<Vec<PathBuf>>,
    /// The file each group appends to (its last) …
    files: Vec<File>,
    /// … and the bytes written to it …
    segment_bytes: Vec<u64>,
    /// … which goes on in a new file once it holds this many.
    segment_max: u64,
    ranges: Vec<Range<usize>>,
    buckets: Arc<KeyBuckets>,
    /// The group of each bucket.
    group_of: Vec<u32>,
    /// Records staged for each group (`stage_bytes` once in use), written as they came
    /// when full …
    stages: Vec<Vec<u8>>,
    /// … and the bytes staged in each.
    staged: Vec<usize>,
    stage_bytes: usize,
    /// Records of each bucket in the files (the second pass places each bucket's entries
    /// from these without counting).
    bucket_counts: Vec<u64>,
    records: Vec<u64>,
    record_size: usize,
    /// Where group bytes past the page cache's share go: the output's blocks.
    spare: Option<SpareCells>,
}

impl GroupFiles {
    /// Creates the first file of each group (`prefix.gN.0`, the next ones `prefix.gN.1` …)
    /// and its staging buffer: at most 100 KiB, and all of them together at most
    /// `stage_budget` bytes.
    pub fn create(
        prefix: &Path,
        buckets: Arc<KeyBuckets>,
        ranges: Vec<Range<usize>>,
        record_size: usize,
        stage_budget: usize,
    ) -> Result<Self, RiverError> {
        let mut group_of = vec![0u32; buckets.len()];
        for (g, r) in ranges.iter().enumerate() {
            group_of[r.clone()].iter_mut().for_each(|x| *x = g as u32);
        }
        let stage_bytes = stage_bytes(stage_budget / ranges.len().max(1), record_size);
        let mut g = GroupFiles {
            prefix: prefix.to_path_buf(),
            segments: vec![Vec::new(); ranges.len()],
            files: Vec::with_capacity(ranges.len()),
            segment_bytes: vec![0; ranges.len()],
            segment_max: SEGMENT_BYTES,
            stages: vec![Vec::new(); ranges.len()],
            staged: vec![0; ranges.len()],
            bucket_counts: vec![0; buckets.len()],
            records: vec![0; ranges.len()],
            ranges,
            buckets,
            group_of,
            stage_bytes,
            record_size,
            spare: None,
        };
        for i in 0..g.ranges.len() {
            let file = g.new_segment(i)?;
            g.files.push(file);
        }
        Ok(g)
    }

    /// Creates the next file of group `g`.
    fn new_segment(&mut self, g: usize) -> Result<File, RiverError> {
        let path = PathBuf::from(format!("{}.g{g}.{}", self.prefix.display(), self.segments[g].len()));
        let file = File::create(&path).map_err(|e| RiverError::io(format!("creating group {}", path.display()), e))?;
        // Registered before anything is written, so that a failure still removes it.
        self.segments[g].push(path);
        Ok(file)
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are no groups.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Records taken by each group.
    pub fn records(&self) -> &[u64] {
        &self.records
    }

    /// The group of bucket `b`.
    #[inline]
    pub fn group_of(&self, b: usize) -> usize {
        self.group_of[b] as usize
    }

    /// The bucket range of each group.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Bytes taken by all groups (staged or written).
    pub fn bytes(&self) -> u64 {
        self.records.iter().sum::<u64>() * self.record_size as u64
    }

    /// Stages one record (whole) for its group, writing the group's buffer when full.
    #[inline]
    pub fn push(&mut self, record: &[u8]) -> Result<(), RiverError> {
        let b = self.buckets.bucket_of(key(record));
        self.push_in(b, record)
    }

    /// Stages one record whose bucket the caller knows (`b`, as [`KeyBuckets::bucket_of`]
    /// gives it).
    #[inline(always)]
    pub fn push_in(&mut self, b: usize, record: &[u8]) -> Result<(), RiverError> {
        let g = self.group_of[b] as usize;
        let rs = self.record_size;
        let stage = &mut self.stages[g];
        if stage.is_empty() {
            *stage = vec![0; self.stage_bytes];
        }
        // Into the stage's place, a fixed-size move for a Sort Benchmark record: appended
        // to a vector instead, the record was copied by a call to `memmove` on some paths
        // (4 % of pass 1's samples).
        let at = self.staged[g];
        copy_record(&mut stage[at..at + rs], record);
        self.staged[g] = at + rs;
        self.bucket_counts[b] += 1;
        self.records[g] += 1;
        if at + rs == self.stage_bytes {
            self.write_stage(g)?;
        }
        Ok(())
    }

    /// Writes group `g`'s staged records (to a new file if its last is full).
    fn write_stage(&mut self, g: usize) -> Result<(), RiverError> {
        let staged = &self.stages[g][..self.staged[g]];
        if let Some(spare) = &mut self.spare {
            let placed = spare
                .try_write(g, staged)
                .map_err(|e| RiverError::io(format!("writing group {g}'s bytes into the output"), e))?;
            if placed {
                self.staged[g] = 0;
                return Ok(());
            }
        }
        let stage = std::mem::take(&mut self.stages[g]);
        let appended = self.append(g, &stage[..self.staged[g]]);
        self.stages[g] = stage;
        self.staged[g] = 0;
        appended
    }

    /// Appends `bytes` to group `g`'s file (to a new one if its last is full).
    fn append(&mut self, g: usize, bytes: &[u8]) -> Result<(), RiverError> {
        if self.segment_bytes[g] >= self.segment_max {
            self.files[g] = self.new_segment(g)?;
            self.segment_bytes[g] = 0;
        }
        let path = self.segments[g].last().expect("a group has a file");
        self.files[g]
            .write_all(bytes)
            .map_err(|e| RiverError::io(format!("appending to group {}", path.display()), e))?;
        self.segment_bytes[g] += bytes.len() as u64;
        if let Some(spare) = &mut self.spare {
            spare.file_written(bytes.len());
        }
        Ok(())
    }

    /// Puts group bytes past `room.files_budget` into the output's blocks from now on
    /// (the groups from `first` on: the resident ones are read back before any), until
    /// [`GroupFiles::settle_spare`].
    pub fn use_spare(&mut self, room: SpareRoom, first: usize) {
        assert!(self.spare.is_none(), "spare room is given once");
        let cells = SpareCells::new(room, &self.ranges, self.buckets.len(), self.stage_bytes, first);
        self.spare = Some(cells);
    }

    /// Once every partition's size is known, before the output is written: takes no more
    /// bytes into the output, and moves those the output would overwrite before their
    /// group is read (sampling misjudged where it starts) into the group's file. This
    /// node's part of the output is `part`, in which `before` bytes (the records kept in
    /// memory) come before the groups' records. Returns the bytes moved.
    pub fn settle_spare(&mut self, part: Range<u64>, before: u64) -> Result<u64, RiverError> {
        let Some(spare) = &mut self.spare else { return Ok(0) };
        let rs = self.record_size as u64;
        let mut starts = Vec::with_capacity(self.records.len());
        let mut at = part.start + before;
        for &r in &self.records {
            starts.push(at);
            at += r * rs;
        }
        let moved = spare.settle(&starts, part.end);
        let output = spare.file().clone();
        let mut bytes = 0u64;
        let mut buffer = Vec::new();
        for (g, chunk) in moved {
            buffer.resize(chunk.len, 0);
            output
                .read_exact_at(&mut buffer, chunk.at)
                .map_err(|e| RiverError::io(format!("reading group {g}'s bytes back from the output"), e))?;
            self.append(g, &buffer)?;
            bytes += chunk.len as u64;
        }
        if bytes > 0 {
            tracing::info!(bytes, "group bytes moved out of the output: their group starts earlier than sampled");
        }
        Ok(bytes)
    }

    /// Bytes of the groups in the output's blocks.
    pub fn spare_bytes(&self) -> u64 {
        self.spare.as_ref().map_or(0, SpareCells::bytes)
    }

    fn reader(&self, g: usize) -> GroupReader<'_> {
        let (chunks, file) = match &self.spare {
            Some(s) => (s.chunks(g), Some(&**s.file())),
            None => (&[][..], None),
        };
        GroupReader { paths: &self.segments[g], next: 0, file: None, chunks, spare: file, chunk_read: 0 }
    }

    /// Writes what is staged and frees the staging buffers.
    pub fn flush(&mut self) -> Result<(), RiverError> {
        for g in 0..self.len() {
            if self.staged[g] > 0 {
                self.write_stage(g)?;
            }
            self.stages[g] = Vec::new();
        }
        Ok(())
    }
}

impl GroupFiles {
    /// Records of each bucket of group `g` in its file (staged ones included).
    pub fn bucket_records(&self, g: usize) -> &[u64] {
        &self.bucket_counts[self.ranges[g].clone()]
    }

    /// Reads group `g`'s files (once flushed) through `buffer` (whole records), handing
    /// each piece to `take`, and removes them; its records stay counted in
    /// [`GroupFiles::bytes`].
    pub fn drain(
        &self,
        g: usize,
        buffer: &mut [u8],
        mut take: impl FnMut(&[u8]) -> Result<(), RiverError>,
    ) -> Result<(), RiverError> {
        let rs = self.record_size;
        let read_err = |e| self.read_error(g, e);
        let mut file = self.reader(g);
        let bytes = self.records[g] as usize * rs;
        let room = (buffer.len() / rs).max(1) * rs;
        assert!(buffer.len() >= rs, "a buffer holds a record");
        let mut read = 0usize;
        while read < bytes {
            let want = (bytes - read).min(room);
            let n = read_full(&mut file, &mut buffer[..want]).map_err(read_err)?;
            if n != want {
                return Err(read_err(std::io::Error::other(format!("{} bytes read, {bytes} written", read + n))));
            }
            take(&buffer[..n])?;
            read += n;
        }
        if read_full(&mut file, &mut [0u8; 1]).map_err(read_err)? != 0 {
            return Err(read_err(std::io::Error::other(format!("more than the {bytes} bytes written"))));
        }
        Ok(())
    }

    fn read_error(&self, g: usize, e: std::io::Error) -> RiverError {
        RiverError::io(format!("reading group {}.g{g}", self.prefix.display()), e)
    }
}

impl Drop for GroupFiles {
    fn drop(&mut self) {
        for p in self.segments.iter().flatten() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Reads a group's files one after another as one stream, removing each once read to its
/// end (so that its page cache is freed then), then its chunks in the output.
struct GroupReader<'a> {
    paths: &'a [PathBuf],
    next: usize,
    file: Option<File>,
    chunks: &'a [Chunk],
    spare: Option<&'a File>,
    /// Bytes of the first of `chunks` read.
    chunk_read: usize,
}

impl Read for GroupReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let file = match &mut self.file {
                Some(f) => f,
                None => match self.paths.get(self.next) {
                    Some(p) => self.file.insert(File::open(p)?),
                    None => return self.read_chunk(buf),
                },
            };
            let n = file.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            self.file = None;
            let _ = std::fs::remove_file(&self.paths[self.next]);
            self.next += 1;
        }
    }
}

impl GroupReader<'_> {
    fn read_chunk(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let (Some(c), Some(spare)) = (self.chunks.first(), self.spare) else { return Ok(0) };
        let n = (c.len - self.chunk_read).min(buf.len());
        let n = spare.read_at(&mut buf[..n], c.at + self.chunk_read as u64)?;
        if n == 0 && !buf.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the output is shorter than a chunk"));
        }
        self.chunk_read += n;
        if self.chunk_read == c.len {
            self.chunks = &self.chunks[1..];
            self.chunk_read = 0;
        }
        Ok(n)
    }
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
    /// Groups (the first ones) whose records that came after the first spill stayed in
    /// memory, never written to their files.
    pub resident_groups: usize,
    /// Whether the first group read back was read into memory of its own while the
    /// resident groups were written ([`sort_groups`]).
    pub preloaded: bool,
    /// Bytes written to the group files (and to the output's blocks, [`GroupFiles::use_spare`]).
    pub temp_bytes: u64,
}

/// A group read back, ready for the node thread.
enum Loaded<'m> {
    /// The whole group, read into a half with each bucket's records together, in bucket
    /// order: the half, and where each bucket starts in it (in records; one more entry
    /// than buckets, the last the group's records).
    Bucketed(&'m mut [u8], Vec<usize>),
    /// A group larger than a half: its sorted runs on disk (the half comes back free).
    Runs(Vec<Run>, &'m mut [u8]),
    /// The first group, read as [`Loaded::Bucketed`] but into memory of its own, freed once
    /// it is sorted.
    Preloaded(Vec<u8>, Vec<usize>),
}

/// How the second pass reads and merges.
#[derive(Clone, Debug)]
pub struct PassTwo {
    /// Size of each run write buffer of an over-size group.
    pub io_buffer_bytes: usize,
    /// Read-ahead memory for merging the runs of an over-size group.
    pub merge_read_bytes: usize,
    /// Prefix of the run files of over-size groups.
    pub run_prefix: PathBuf,
}

/// The second pass: writes the records `arena` holds (the resident groups) sorted into
/// `out`, then sorts the groups from `first` on in key order into `out`, each read into one
/// of the two halves of the arena's memory, the next group read on a loader thread while
/// this thread sorts the current one and `out` writes the one before. Each group file is
/// removed once read.
///
/// While the resident groups are written, none of the arena is free, and the node thread
/// would then wait for the first group read with the disk idle (50–120 ms in the 4x10^7
/// benchmark): so the loader reads that group meanwhile into memory of its own when it
/// holds at most `PRELOAD_SHARE` of the arena (the groups are planned with a small first
/// one, `FIRST_READ_THIRDS`).
pub fn sort_groups<S: SpaceSink + ?Sized>(
    mut groups: GroupFiles,
    first: usize,
    mut arena: BucketArena,
    pass: &PassTwo,
    out: &mut S,
) -> Result<GroupReport, RiverError> {
    assert!(groups.spare.as_ref().is_none_or(|s| !s.is_open()), "the output's cells are settled before it is written");
    groups.flush()?;
    // Nothing more is written: closed now, each file is freed (its page cache dropped, its
    // blocks released) when the loader removes it after reading it, not all at the end.
    groups.files.clear();
    let n = groups.len();
    let rs = groups.record_size;
    assert!(first > 0 || arena.records() == 0, "the arena holds only the records of groups before the first");
    let preload = if arena.records() > 0 { (arena.capacity() as f64 * PRELOAD_SHARE) as usize } else { 0 };
    // The arena's memory, once its records are written: borrowed by the halves for as long
    // as the loader runs.
    let mut memory_slot = None;
    let memory_slot = &mut memory_slot;
    std::thread::scope(|scope| {
        let (loaded_tx, loaded_rx) = mpsc::sync_channel::<Loaded>(1);
        let (free_tx, free_rx) = mpsc::channel::<&mut [u8]>();
        let loader = std::thread::Builder::new()
            .name("river-group-load".into())
            .spawn_scoped(scope, move || load_groups(groups, first, free_rx, loaded_tx, preload, pass))
            .map_err(|e| RiverError::io("starting the group loader", e))?;
        let mut report = GroupReport::default();
        let mut sorter = FlatSorter::default();
        let sorted = (|| {
            if arena.records() > 0 {
                emit_sorted(&mut arena, out)?;
                arena.clear();
            }
            let memory: &mut [u8] = memory_slot.insert(arena.into_memory());
            let (low, high) = memory.split_at_mut(memory.len() / 2);
            for h in [low, high] {
                // A loader that stopped early reports why when joined.
                let _ = free_tx.send(h);
            }
            for loaded in loaded_rx.iter() {
                let half = match loaded {
                    Loaded::Bucketed(half, starts) => {
                        sorter.emit_bucketed(half, rs, &starts, out)?;
                        half
                    }
                    Loaded::Runs(runs, half) => {
                        report.merged_groups += 1;
                        report.runs += runs.len();
                        merge_runs(&runs, rs, pass.merge_read_bytes, out)?;
                        half
                    }
                    Loaded::Preloaded(own, starts) => {
                        sorter.emit_bucketed(&own, rs, &starts, out)?;
                        report.groups += 1;
                        report.preloaded = true;
                        continue;
                    }
                };
                report.groups += 1;
                // The loader stops taking halves once every group is read.
                let _ = free_tx.send(half);
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
        if report.groups != n - first {
            return Err(RiverError::io(
                "loading groups",
                std::io::Error::other(format!("{} of {} groups were sorted", report.groups, n - first)),
            ));
        }
        Ok(report)
    })
}

/// The loader: reads each group into a free half and hands it over, in group order, each
/// bucket's records together; the first into memory of its own instead when it holds at
/// most `preload_bytes`. A group larger than a half is sorted into runs, half by half.
fn load_groups<'m>(
    mut groups: GroupFiles,
    first: usize,
    free: mpsc::Receiver<&'m mut [u8]>,
    loaded: mpsc::SyncSender<Loaded<'m>>,
    preload_bytes: usize,
    pass: &PassTwo,
) -> Result<(), RiverError> {
    let rs = groups.record_size;
    let mut sorter = FlatSorter::default();
    let mut piece = vec![0u8; (SCATTER_PIECE_BYTES / rs).max(1) * rs];
    let mut scatter = Scatter::default();
    for g in first..groups.len() {
        let read_err = |e| groups.read_error(g, e);
        let mut file = groups.reader(g);
        let bytes = groups.records[g] as usize * rs;
        let msg = if g == first && bytes <= preload_bytes {
            let mut own = vec![0u8; bytes];
            let starts = read_bucketed(&mut file, &groups, g, &mut own, &mut piece, &mut scatter, read_err)?;
            Loaded::Preloaded(own, starts)
        } else {
            // The node thread stopped (it failed, and reports why): nothing more to do.
            let Ok(half) = free.recv() else { return Ok(()) };
            if bytes <= half.len() {
                let starts = read_bucketed(&mut file, &groups, g, half, &mut piece, &mut scatter, read_err)?;
                Loaded::Bucketed(half, starts)
            } else {
                let runs = sort_into_runs(&mut file, &groups, g, half, &mut sorter, pass, read_err)?;
                tracing::info!(group = g, runs = runs.len(), "a group larger than half the memory bound is merged");
                Loaded::Runs(runs, half)
            }
        };
        if read_full(&mut file, &mut [0u8; 1]).map_err(read_err)? != 0 {
            return Err(read_err(std::io::Error::other(format!("more than the {bytes} bytes written"))));
        }
        if loaded.send(msg).is_err() {
            return Ok(());
        }
    }
    // Every file is read and removed; dropping `groups` removes nothing more.
    groups.segments.clear();
    Ok(())
}

/// Reads group `g` from `file` through `piece`, moving each record to its bucket's place
/// in `half` (the first pass counted each bucket's records, so every bucket's place is
/// known before reading), and returns where each bucket starts, in records, with the
/// group's records last. Sorting a bucket then reads only that bucket's few megabytes,
/// which the caches hold, where gathering records from the whole group in arrival order
/// missed the caches on almost every record. Records that disagree with the counts (a
/// group file changed behind our back) are an error.
fn read_bucketed(
    file: &mut impl Read,
    groups: &GroupFiles,
    g: usize,
    half: &mut [u8],
    piece: &mut [u8],
    scatter: &mut Scatter,
    read_err: impl Fn(std::io::Error) -> RiverError,
) -> Result<Vec<usize>, RiverError> {
    let rs = groups.record_size;
    let range = groups.ranges[g].clone();
    let mut starts = Vec::with_capacity(range.len() + 1);
    starts.push(0);
    for &c in groups.bucket_records(g) {
        let last = *starts.last().expect("starts at 0");
        starts.push(last + c as usize);
    }
    scatter.begin(half, &starts, rs);
    let bytes = groups.records[g] as usize * rs;
    let mut read = 0usize;
    while read < bytes {
        let want = (bytes - read).min(piece.len());
        let n = read_full(file, &mut piece[..want]).map_err(&read_err)?;
        if n != want {
            return Err(read_err(std::io::Error::other(format!("{} bytes read, {bytes} written", read + n))));
        }
        for r in piece[..n].chunks_exact(rs) {
            let b = bucket_in(&groups.buckets, &range, key(r));
            scatter.push(half, b, r).map_err(|_| counts_mismatch())?;
        }
        read += n;
    }
    scatter.finish(half);
    Ok(starts)
}

/// Reads group `g` (larger than `half`) from `file` half by half, each part sorted into a
/// run file.
fn sort_into_runs(
    file: &mut impl Read,
    groups: &GroupFiles,
    g: usize,
    half: &mut [u8],
    sorter: &mut FlatSorter,
    pass: &PassTwo,
    read_err: impl Fn(std::io::Error) -> RiverError,
) -> Result<Vec<Run>, RiverError> {
    let rs = groups.record_size;
    let bytes = groups.records[g] as usize * rs;
    let room = half.len() / rs * rs;
    let mut runs = Vec::new();
    let mut read = 0usize;
    while read < bytes {
        let want = (bytes - read).min(room);
        let n = read_full(file, &mut half[..want]).map_err(&read_err)?;
        if n != want {
            return Err(read_err(std::io::Error::other(format!("{} bytes read, {bytes} written", read + n))));
        }
        read += n;
        runs.push(write_run(sorter, &half[..n], groups, g, runs.len(), pass)?);
    }
    Ok(runs)
}

fn counts_mismatch() -> RiverError {
    RiverError::io("sorting a group", std::io::Error::other("its records disagree with their bucket counts"))
}

fn read_full(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
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

fn write_run(
    sorter: &mut FlatSorter,
    data: &[u8],
    groups: &GroupFiles,
    group: usize,
    index: usize,
    pass: &PassTwo,
) -> Result<Run, RiverError> {
    let rs = groups.record_size;
    let path = PathBuf::from(format!("{}.g{group}.r{index}", pass.run_prefix.display()));
    let file = File::create(&path).map_err(|e| RiverError::io(format!("creating run {}", path.display()), e))?;
    let run = Run { path, records: (data.len() / rs) as u64 };
    let pool = MemPool::heap(2, pass.io_buffer_bytes.max(rs) / rs * rs);
    let mut sink = DiskSink::new(Arc::new(file), 0, pool, rs);
    sorter.emit(data, rs, &groups.buckets, groups.ranges[group].clone(), &mut sink)?;
    sink.close()?;
    Ok(run)
}

/// Sorts records held flat: each bucket's records together ([`FlatSorter::emit_bucketed`],
/// a group read back), or in no order (part of an over-size group): each record's entry
/// placed in its bucket's place (from the buckets' counts), then each bucket's entries
/// sorted and its records gathered. Keeps its vectors from one group to the next: after
/// the first, sorting allocates nothing.
#[derive(Default)]
struct FlatSorter {
    /// Entries in bucket order: 16 bytes per record of the largest part of an over-size
    /// group, or of the largest bucket (the memory plan's sort overhead).
    by_bucket: Vec<u128>,
    scratch: Vec<u128>,
    starts: Vec<usize>,
    fill: Vec<usize>,
    counts: Vec<u64>,
    /// Where records are gathered before they are copied out ([`gather_records`]).
    stage: Vec<u8>,
}

impl FlatSorter {
    /// Writes the records of `data`, whose buckets are held together (bucket `b`'s records
    /// from `starts[b]` to `starts[b + 1]`, in records), sorted into `out`, one bucket at
    /// a time.
    fn emit_bucketed<S: SpaceSink + ?Sized>(
        &mut self,
        data: &[u8],
        rs: usize,
        starts: &[usize],
        out: &mut S,
    ) -> Result<(), RiverError> {
        for bucket in starts.windows(2) {
            let records = &data[bucket[0] * rs..bucket[1] * rs];
            if records.is_empty() {
                continue;
            }
            self.by_bucket.clear();
            self.by_bucket.extend(records.chunks_exact(rs).enumerate().map(|(i, r)| entry(r, i as u64)));
            write_gathered(sort_entries(&mut self.by_bucket, &mut self.scratch), records, rs, &mut self.stage, out)?;
        }
        Ok(())
    }

    /// Writes the records of `data` (all in the buckets `range` of `buckets`) sorted into
    /// `out`, counting the records of each bucket first.
    fn emit<S: SpaceSink + ?Sized>(
        &mut self,
        data: &[u8],
        rs: usize,
        buckets: &KeyBuckets,
        range: Range<usize>,
        out: &mut S,
    ) -> Result<(), RiverError> {
        let mut counts = std::mem::take(&mut self.counts);
        counts.clear();
        counts.resize(range.len(), 0);
        for r in data.chunks_exact(rs) {
            counts[bucket_in(buckets, &range, key(r))] += 1;
        }
        let sorted = self.emit_counted(data, rs, buckets, range, &counts, out);
        self.counts = counts;
        sorted
    }

    /// Writes the records of `data` (all in the buckets `range` of `buckets`, `counts[b]`
    /// of them in the range's bucket `b`) sorted into `out`. Records that disagree with
    /// the counts (a group file changed behind our back) are an error.
    fn emit_counted<S: SpaceSink + ?Sized>(
        &mut self,
        data: &[u8],
        rs: usize,
        buckets: &KeyBuckets,
        range: Range<usize>,
        counts: &[u64],
        out: &mut S,
    ) -> Result<(), RiverError> {
        let n = data.len() / rs;
        let nb = range.len();
        self.starts.clear();
        self.starts.push(0);
        for &c in counts {
            let last = *self.starts.last().expect("starts at 0");
            self.starts.push(last + c as usize);
        }
        if self.starts[nb] != n {
            return Err(counts_mismatch());
        }
        self.by_bucket.clear();
        self.by_bucket.resize(n, 0);
        self.fill.clear();
        self.fill.extend_from_slice(&self.starts[..nb]);
        for (i, r) in data.chunks_exact(rs).enumerate() {
            let e = entry(r, i as u64);
            let b = bucket_in(buckets, &range, e);
            let at = self.fill[b];
            if at == self.starts[b + 1] {
                return Err(counts_mismatch());
            }
            self.by_bucket[at] = e;
            self.fill[b] = at + 1;
        }
        for b in 0..nb {
            let bucket_entries = &mut self.by_bucket[self.starts[b]..self.starts[b + 1]];
            if bucket_entries.is_empty() {
                continue;
            }
            write_gathered(sort_entries(bucket_entries, &mut self.scratch), data, rs, &mut self.stage, out)?;
        }
        Ok(())
    }
}

/// The bucket of a key or entry, counted from the first of `range` (bounds have no index
/// bits, so an entry falls in its key's bucket).
#[inline(always)]
fn bucket_in(buckets: &KeyBuckets, range: &Range<usize>, key_or_entry: u128) -> usize {
    buckets.bucket_of(key_or_entry).clamp(range.start, range.end - 1) - range.start
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sort::bucket::tests::records;
    use crate::VecSink;

    #[test]
    fn a_group_read_back_holds_each_bucket_together_in_arrival_order() {
        let data = records(20_000, 3);
        let samples: Vec<u128> = data.chunks(100).step_by(29).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let buckets = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 64));
        let n = buckets.len();
        let ranges = vec![0..n / 3, n / 3..n];
        let dir = tempfile::tempdir().unwrap();
        // Stages of 7 records, files of at least 5,000 bytes: each group is written in
        // many appends to many files.
        let write = || {
            let mut groups =
                GroupFiles::create(&dir.path().join("spill"), buckets.clone(), ranges.clone(), 100, 1400).unwrap();
            groups.segment_max = 5000;
            for r in data.chunks(100) {
                groups.push(r).unwrap();
            }
            groups.flush().unwrap();
            groups
        };
        let files_left = || std::fs::read_dir(dir.path()).unwrap().count();
        let groups = write();
        assert!(groups.segments.iter().all(|s| s.len() > 10), "{:?}", groups.segments);
        // A piece smaller than the group, not a whole number of pieces per group.
        let mut piece = vec![0u8; 3 * 100];
        for (g, range) in ranges.iter().enumerate() {
            let mut half = vec![0u8; groups.records()[g] as usize * 100];
            let mut file = groups.reader(g);
            let starts = read_bucketed(&mut file, &groups, g, &mut half, &mut piece, &mut Scatter::default(), |e| {
                RiverError::io("test", e)
            })
            .unwrap();
            assert_eq!(starts.len(), range.len() + 1);
            for (i, b) in range.clone().enumerate() {
                let want: Vec<u8> =
                    data.chunks(100).filter(|r| buckets.bucket_of(key(r)) == b).flatten().copied().collect();
                assert_eq!(&half[starts[i] * 100..starts[i + 1] * 100], &want[..], "bucket {b}");
            }
            // Each file is removed once read to its end.
            assert_eq!(read_full(&mut file, &mut [0u8; 1]).unwrap(), 0);
            let later: usize = groups.segments[g + 1..].iter().map(Vec::len).sum();
            assert_eq!(files_left(), later, "group {g}'s files are removed");
        }
        drop(groups);

        // Counts that disagree with the file (same total, one record moved to the
        // neighbouring bucket) are an error, not a misplaced record.
        let mut groups = write();
        let full = (0..n / 3).find(|&b| groups.bucket_counts[b] > 0).unwrap();
        groups.bucket_counts[full] -= 1;
        groups.bucket_counts[(full + 1) % (n / 3)] += 1;
        let mut half = vec![0u8; groups.records()[0] as usize * 100];
        let mut file = groups.reader(0);
        let r = read_bucketed(&mut file, &groups, 0, &mut half, &mut piece, &mut Scatter::default(), |e| {
            RiverError::io("test", e)
        });
        assert!(matches!(r, Err(RiverError::Io { .. })), "{r:?}");
        drop(groups);
        assert_eq!(files_left(), 0, "dropping the groups removes their files");
    }

    #[test]
    fn group_bytes_in_the_output_are_read_back_and_those_it_would_overwrite_first_move_to_the_files() {
        let data = records(20_000, 7);
        let samples: Vec<u128> = data.chunks(100).step_by(29).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let buckets = Arc::new(KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 64));
        let n = buckets.len();
        let ranges = vec![0..n / 3, n / 3..2 * n / 3, 2 * n / 3..n];
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let file = File::options().create(true).truncate(true).read(true).write(true).open(&out).unwrap();
        file.set_len(3_000_000).unwrap();
        let mut groups =
            GroupFiles::create(&dir.path().join("spill"), buckets.clone(), ranges.clone(), 100, 1400).unwrap();
        // Expected at 0..2 MB; every byte past the files' budget (none) goes to the cells.
        groups.use_spare(SpareRoom { file: Arc::new(file), part: 0..2_000_000, files_budget: 0 }, 0);
        for r in data.chunks(100) {
            groups.push(r).unwrap();
        }
        let in_cells = groups.spare_bytes();
        assert!(in_cells > 50_000, "{in_cells}");
        // The node's part turns out to start 0.5 MB in (as if that much stayed in memory):
        // every group starts later than expected, so its lowest cells would be overwritten
        // before it is read, and move to its file.
        let moved = groups.settle_spare(0..2_500_000, 500_000).unwrap();
        assert!(moved > 0 && moved < in_cells, "{moved} of {in_cells}");
        assert_eq!(groups.spare_bytes() + moved, in_cells);
        let mut start = 500_000;
        for g in 0..ranges.len() {
            let spare = groups.spare.as_ref().unwrap();
            assert!(spare.chunks(g).iter().all(|c| c.at >= start), "group {g}");
            start += groups.records()[g] * 100;
        }
        groups.flush().unwrap();
        for (g, range) in ranges.iter().enumerate() {
            let mut back = Vec::new();
            groups
                .drain(g, &mut [0u8; 300], |piece| {
                    back.extend_from_slice(piece);
                    Ok(())
                })
                .unwrap();
            let mut got: Vec<&[u8]> = back.chunks(100).collect();
            let mut want: Vec<&[u8]> =
                data.chunks(100).filter(|r| range.contains(&buckets.bucket_of(key(r)))).collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "group {g}");
        }
    }

    #[test]
    fn a_group_in_arrival_order_is_sorted_from_its_bucket_counts() {
        let data = records(20_000, 5);
        let samples: Vec<u128> = data.chunks(100).step_by(31).enumerate().map(|(i, r)| entry(r, i as u64)).collect();
        let buckets = KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 64);
        // A group of the middle buckets, as the first pass appends it: arrival order.
        let range = buckets.len() / 4..buckets.len() * 3 / 4;
        let group: Vec<u8> =
            data.chunks(100).filter(|r| range.contains(&buckets.bucket_of(key(r)))).flatten().copied().collect();
        let mut counts = vec![0u64; buckets.len()];
        for r in group.chunks(100) {
            counts[buckets.bucket_of(key(r))] += 1;
        }
        let mut sorter = FlatSorter::default();
        let mut out = Vec::new();
        let mut sink = VecSink::new(&mut out, 100);
        let mut staged = crate::StagedSink::new(&mut sink, 100, 700);
        sorter.emit_counted(&group, 100, &buckets, range.clone(), &counts[range.clone()], &mut staged).unwrap();
        staged.flush().unwrap();
        let s = ulnet_sortbench::Summary::of_records(&out).unwrap();
        assert!(s.is_sorted());
        assert_eq!(s.records, (group.len() / 100) as u128);
        assert_eq!(s.checksum, ulnet_sortbench::Checksum::of_records(&group));

        // Counts that disagree with the records (same total, one record moved to the
        // neighbouring bucket) are an error, not a misplaced record.
        let mut wrong = counts[range.clone()].to_vec();
        let full = wrong.iter().position(|&c| c > 0).unwrap();
        wrong[full] -= 1;
        let neighbour = (full + 1) % wrong.len();
        wrong[neighbour] += 1;
        let mut out = Vec::new();
        let mut sink = VecSink::new(&mut out, 100);
        let mut staged = crate::StagedSink::new(&mut sink, 100, 700);
        let r = sorter.emit_counted(&group, 100, &buckets, range, &wrong, &mut staged);
        assert!(matches!(r, Err(RiverError::Io { .. })), "{r:?}");
    }

    #[test]
    fn stages_are_whole_pages_of_whole_records_when_their_share_allows() {
        // 1,024 records of 100 bytes are 25 pages: the 4x10^7 benchmark's 15 groups share
        // 2 MiB, 139,810 bytes each.
        assert_eq!(stage_bytes(139_810, 100), 102_400);
        assert_eq!(stage_bytes(1 << 30, 100), 102_400);
        // Less than that: whole records only.
        assert_eq!(stage_bytes(65_536, 100), 65_500);
        assert_eq!(stage_bytes(10, 100), 100);
        assert_eq!(stage_bytes(1 << 20, 4096), 102_400);
        assert_eq!(stage_bytes(5000, 4096), 4096);
    }

    #[test]
    fn groups_split_the_buckets_in_equal_consecutive_ranges() {
        let samples: Vec<u128> = (0..4000u128).map(|i| (i * 7919 % 4000) << 90).collect();
        let buckets = KeyBuckets::from_samples(0, u128::MAX, &samples, 4, 1 << 16);
        let n = buckets.len();
        let g = plan_groups(&buckets, 1000, 100, 0);
        // 1000 bytes in halves of 100 filled to 80 %: 13 groups wanted, so at most
        // n / 13 buckets each.
        assert!(g.len() >= 13, "{}", g.len());
        assert_eq!(g.first().unwrap().start, 0);
        assert_eq!(g.last().unwrap().end, n);
        assert!(g.windows(2).all(|w| w[0].end == w[1].start));
        assert!(g.iter().all(|r| !r.is_empty() && r.len() <= n / 13), "{g:?}");
        // Never fewer than two (ramped up to in a third and two thirds of one), never more
        // than the buckets.
        assert!((2..=4).contains(&plan_groups(&buckets, 1, 1 << 30, 0).len()));
        assert_eq!(plan_groups(&buckets, 1 << 40, 1, 0).len(), n);
        assert_eq!(plan_groups(&KeyBuckets::single(), 1 << 40, 1, 0).len(), 1);
        // Split at a bucket (the resident groups' end): a group ends there, none is larger.
        let split = n / 13 * 2 + 5;
        let g = plan_groups(&buckets, 1000, 100, split);
        assert!(g.iter().any(|r| r.end == split), "{g:?}");
        assert_eq!(g.first().unwrap().start, 0);
        assert_eq!(g.last().unwrap().end, n);
        assert!(g.windows(2).all(|w| w[0].end == w[1].start));
        assert!(g.iter().all(|r| !r.is_empty() && r.len() <= n / 13), "{g:?}");
        // The first two groups read back (from the split on) are a third and two thirds of
        // a group, the rest whole groups but the last.
        let whole = g[g.len() - 2].len();
        let after = g.iter().position(|r| r.start == split).unwrap();
        assert_eq!((g[after].len(), g[after + 1].len()), (whole / 3, whole * 2 / 3), "{g:?}");
        assert!(g[after + 2..g.len() - 1].iter().all(|r| r.len() == whole), "{g:?}");
    }
}
