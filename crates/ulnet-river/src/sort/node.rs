//! One node of the distributed sort.
//!
//! ```text
//!  startup      connect the mesh; sample the input slice; node 0 picks N-1 splitters
//!               (and creates the output), every node gets them
//!  read+dist.   DiskSource(chunks claimed from node 0) → PartitionSink(splitters)
//!               → RiverSink | NetSink(peer)…
//!               while NetSources fill this node's store; until the queue runs dry
//!  sort         radix sort (or merge of spilled runs), bucket by bucket into …
//!  write        … a DiskSink at the partition's offset, writing behind the sort
//!  commit       every node reports to node 0, which validates and renames the output
//!               into place (partition files: tells every node to rename its own)
//! ```
//!
//! A failure anywhere aborts the river (the peers learn why), removes the partial output
//! and returns an error naming the node that failed; the output file only appears once
//! every node has written its part.

use super::bucket::{KeyBuckets, BLOCK_BYTES};
use super::claims::{Chunks, Dispenser, NO_CHUNK};
use super::job::{FormatChoice, NodeReport, OutputIo, SortJob, SortReport};
use super::radix::entry;
use super::spare::{self, SpareRoom};
use super::store::RecordStore;
use super::usage::Usage;
use crate::direct::{preallocate, DirectSink, BLOCK};
use crate::disk::{DiskSink, DiskSource, Poll};
use crate::error::RiverError;
use crate::flow::{Sink, SpaceSink};
use crate::mesh::{self, MeshConfig, MeshTransport};
use crate::partition::PartitionSink;
use crate::pool::MemPool;
use crate::river::{River, RiverConfig};
use crate::Doorbell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use ulnet_sortbench::{Checksum, Summary, Validator, RECORD_SIZE, SUMMARY_SIZE};

const TAG_SAMPLES: u32 = 1;
const TAG_SPLITTERS: u32 = 2;
const TAG_COUNT: u32 = 3;
const TAG_DONE: u32 = 4;
const TAG_COMMIT: u32 = 5;
const TAG_CLAIM: u32 = 6;
const TAG_CHUNK: u32 = 7;
const TAG_SETTLED: u32 = 8;

/// Places each node samples its slice at. 1,024: with 4 nodes the splitters land within
/// about 1.5% of the ideal quantiles, for a millisecond of page reads.
const SAMPLE_PLACES: u64 = 1024;
/// A sample for every so many records of a slice (more records read at each place), up
/// to [`MAX_SAMPLES_PER_PLACE`]: 256, so that with [`SAMPLES_PER_BUCKET`] samples per
/// bucket a bucket holds about a thousand records (100 KB, well inside the second-level
/// cache, where its sort and gather run).
const SLICE_RECORDS_PER_SAMPLE: u64 = 256;
/// Most records read at one place: 16 (1,600 bytes, one read).
const MAX_SAMPLES_PER_PLACE: u64 = 16;
/// Most samples node 0 sends a node for its buckets: 16,384 (256 KiB, a quarter of a
/// shared-memory channel's buffers), enough for 4,096 buckets.
const MAX_SAMPLES_SENT: usize = 16_384;
/// Samples per bucket: 4, so that bucket sizes vary little around their mean.
const SAMPLES_PER_BUCKET: usize = 4;
/// Read-ahead and write-behind buffers per node: 4 each keeps the disk streaming while
/// the node partitions (reading) or sorts (writing).
const IO_BUFFERS: usize = 4;
/// Read and write buffers of a node that does its disk I/O in its own thread: 2, one being
/// filled and one staged (nothing reads ahead or writes behind; every buffer more is a
/// megabyte more to fault in and zero).
const INLINE_IO_BUFFERS: usize = 2;
/// Size of each without a memory bound: 1 MB, large enough that per-call costs vanish,
/// small enough that the pools cost little to fault in.
const IO_BUFFER_BYTES: usize = 10_000 * RECORD_SIZE;
/// Bytes the sort needs per arena byte: the record plus two 16-byte entries per 100 bytes.
/// (In memory, buckets are sorted one at a time; in external mode so is every group read
/// back, its buckets' records placed together, but a group larger than a half is sorted
/// flat into runs, with an entry per record of a half in bucket order: 0.08 of the arena,
/// plus one bucket's scratch; and while the resident groups are written, the first group
/// read back is read into at most 0.2 of the arena beside it, `PRELOAD_SHARE` in
/// `distribute.rs`. 1.2 was tried: peak RSS 423 instead of 389 MiB for no measurable gain, see
/// BENCHMARKS.md.)
const SORT_OVERHEAD: f64 = 1.32;
/// Memory kept aside for everything not counted (stacks, control messages, the heap).
const SLACK_BYTES: u64 = 2 << 20;

/// How a node divides its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Size of each read and write buffer.
    pub io_buffer_bytes: usize,
    /// Most bytes of records held before spilling a run (`None`: no bound).
    pub arena_bytes: Option<usize>,
    /// Read-ahead memory for merging the runs of a key-range group too large for half the
    /// arena (external mode's fallback): the read buffers of the first pass, free by then.
    pub merge_read_bytes: usize,
    /// Most key-range buckets the store may use: with a bound, each half of the arena
    /// keeps eight blocks per bucket, so that the partly filled last blocks of the buckets
    /// waste at most an eighth of it.
    pub max_buckets: usize,
}

impl MemoryPlan {
    /// The plan for a bound of `memory` bytes per node (`None`: unbounded) among `nodes`.
    /// With a bound, the terms are: 8 I/O buffers of `memory / 64` (at most 4 MB), the
    /// river's network buffers (send staging and channel receive buffers), slack, and the
    /// arena with its sort overhead in the rest (external mode: records go to key-range
    /// group files through staging buffers taken from the arena, but those of the first
    /// groups, which stay in the arena — from the first record on when the partition is
    /// expected not to fit, else once the arena has filled and gone to the files; the
    /// second pass sorts those groups from it, then the others in two halves of its
    /// memory, one sorted while the other is read, with the sort's entries in the
    /// overhead).
    pub fn new(memory: Option<u64>, nodes: usize, river: &RiverConfig) -> Result<Self, RiverError> {
        let Some(m) = memory else {
            return Ok(MemoryPlan {
                io_buffer_bytes: IO_BUFFER_BYTES,
                arena_bytes: None,
                merge_read_bytes: 64 << 20,
                max_buckets: 1 << 16,
            });
        };
        let io = ((m / 64) as usize).clamp(1000 * RECORD_SIZE, IO_BUFFER_BYTES) / RECORD_SIZE * RECORD_SIZE;
        // Per peer: the chunks staged and being filled for it, and the receive buffers of
        // its channel (a credit window's worth).
        let per_peer = river.staged_chunks + 2 + river.credits as usize;
        let network = ((nodes - 1) * per_peer * river.chunk_bytes()) as u64;
        let fixed = (2 * IO_BUFFERS * io) as u64 + network + SLACK_BYTES;
        if m < fixed + (1 << 20) {
            return Err(RiverError::Config(format!(
                "--memory {m} is too small for a node's buffers; at least {} bytes are needed",
                fixed + (1 << 20)
            )));
        }
        let arena = ((m - fixed) as f64 / SORT_OVERHEAD) as usize / RECORD_SIZE * RECORD_SIZE;
        let merge_read_bytes = IO_BUFFERS * io;
        let max_buckets = (arena / 2 / BLOCK_BYTES / 8).max(1);
        Ok(MemoryPlan { io_buffer_bytes: io, arena_bytes: Some(arena), merge_read_bytes, max_buckets })
    }
}
/// Longest a node waits for a step of another node (a dead node is seen at once through
/// its channel; this only bounds a hung one).
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the node stands, for progress bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Records of its share of the input read and distributed so far.
    Read,
    /// Records of its partition written so far.
    Write,
}

/// Where a node runs and how it reaches the others.
#[derive(Clone, Debug)]
pub struct NodePlace {
    /// Its rank.
    pub rank: usize,
    /// How to connect the mesh.
    pub mesh: MeshConfig,
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Whether a record looks like a gensort `-a` record: printable bytes, ending in CR LF.
fn is_ascii_record(r: &[u8]) -> bool {
    r.len() == RECORD_SIZE && r[98] == b'\r' && r[99] == b'\n' && r[..98].iter().all(|b| (0x20..0x7f).contains(b))
}

/// Rule of the partitioning: a record goes to the node whose splitter range holds its
/// key, ties between equal keys broken by the record's position in the input, so even
/// input made of one repeated key spreads evenly.
struct KeyRange {
    splitters: Vec<u128>,
    next_index: u64,
}

impl crate::Partitioner for KeyRange {
    #[inline]
    fn partition(&mut self, record: &[u8]) -> usize {
        let e = entry(record, self.next_index);
        self.next_index += 1;
        self.splitters.partition_point(|s| *s <= e)
    }
}

/// A node's part in sharing out the input ([`super::claims`]): it feeds its reader the
/// chunks it is given, claims the next one while it reads, and (node 0) answers the
/// others' claims.
struct InputClaims<'a> {
    river: &'a River<RecordStore>,
    chunks: Chunks,
    /// Node 0's dispenser.
    dispenser: Option<Dispenser>,
    /// The reader's feed, dropped once every chunk is out.
    feed: Option<mpsc::Sender<Range<u64>>>,
    /// Records of the chunks fed and not yet delivered, in feeding order.
    fed: VecDeque<Range<u64>>,
    /// A claim sent to node 0 and not yet answered.
    claim_out: bool,
}

/// Chunks fed ahead of the one being read before claiming more: 1. Reading a chunk
/// takes tens of milliseconds, which hides a claim's round trip; more would leave a node
/// that falls behind holding chunks a faster one could read.
const CHUNKS_AHEAD: usize = 1;

impl<'a> InputClaims<'a> {
    fn new(river: &'a River<RecordStore>, total: u64, feed: mpsc::Sender<Range<u64>>) -> Self {
        let (rank, size) = (river.rank(), river.size());
        let chunks = Chunks::new(total, size);
        let mut claims = InputClaims {
            river,
            chunks,
            dispenser: (rank == 0).then(|| Dispenser::new(&chunks)),
            feed: Some(feed),
            fed: VecDeque::new(),
            claim_out: false,
        };
        match chunks.first_of(rank) {
            Some(c) => claims.feed_chunk(c),
            None => claims.feed = None,
        }
        claims
    }

    fn feed_chunk(&mut self, c: u64) {
        if c == NO_CHUNK {
            self.feed = None;
            return;
        }
        let records = self.chunks.records(c);
        let bytes = records.start * RECORD_SIZE as u64..records.end * RECORD_SIZE as u64;
        // A reader that stopped on a read error takes no more: the source reports the
        // error next.
        if self.feed.as_ref().is_some_and(|f| f.send(bytes).is_ok()) {
            self.fed.push_back(records);
        }
    }

    /// Answers claims that have come (node 0), takes an answer that has come, and claims
    /// the next chunk once fewer than [`CHUNKS_AHEAD`] wait behind the one being read.
    fn progress(&mut self) -> Result<(), RiverError> {
        if let Some(d) = self.dispenser.as_mut() {
            while let Some((j, _)) = self.river.try_recv_control(None, TAG_CLAIM) {
                answer_claim(self.river, d, j)?;
            }
        } else if self.claim_out {
            if let Some((_, m)) = self.river.try_recv_control(Some(0), TAG_CHUNK) {
                self.claim_out = false;
                let c = m
                    .as_slice()
                    .try_into()
                    .map(u64::from_le_bytes)
                    .ok()
                    .filter(|&c| c == NO_CHUNK || c < self.chunks.count())
                    .ok_or_else(|| RiverError::Protocol { node: 0, reason: "malformed input chunk".into() })?;
                self.feed_chunk(c);
            }
        }
        if self.feed.is_some() && self.fed.len() <= CHUNKS_AHEAD {
            match self.dispenser.as_mut() {
                Some(d) => {
                    let c = d.claim(0);
                    self.feed_chunk(c);
                }
                None if !self.claim_out => {
                    self.river.send_control(0, TAG_CLAIM, b"")?;
                    self.claim_out = true;
                }
                None => {}
            }
        }
        Ok(())
    }

    /// The input index of the first of the next `records` records delivered (they lie in
    /// one chunk: a reader's buffer never spans two).
    fn take(&mut self, records: u64) -> u64 {
        let chunk = self.fed.front_mut().expect("records come from chunks fed");
        assert!(chunk.end - chunk.start >= records, "a buffer lies in one chunk");
        let first = chunk.start;
        chunk.start += records;
        if chunk.is_empty() {
            self.fed.pop_front();
        }
        first
    }

    /// After the reading: node 0 answers every node still claiming, so that all of them
    /// learn no chunk is left.
    fn finish(mut self) -> Result<(), RiverError> {
        assert!(self.feed.is_none() && self.fed.is_empty(), "the reader ran dry after the last chunk");
        if let Some(d) = self.dispenser.as_mut() {
            for j in d.still_claiming(0) {
                self.river.recv_control(Some(j), TAG_CLAIM, STEP_TIMEOUT)?;
                answer_claim(self.river, d, j)?;
            }
        }
        Ok(())
    }
}

/// Node 0 answers node `j`'s claim: its next chunk, or [`NO_CHUNK`].
fn answer_claim(river: &River<RecordStore>, dispenser: &mut Dispenser, j: usize) -> Result<(), RiverError> {
    river.send_control(j, TAG_CHUNK, &dispenser.claim(j).to_le_bytes())
}

/// Picks `nodes - 1` splitters from sorted samples: the sample at each `k/nodes` quantile.
pub fn splitters_from(sorted: &[u128], nodes: usize) -> Vec<u128> {
    if sorted.is_empty() {
        return vec![u128::MAX; nodes - 1];
    }
    (1..nodes).map(|k| sorted[k * sorted.len() / nodes]).collect()
}

/// The entries node `rank` holds: from the splitter below it (inclusive) to the one above
/// it (exclusive), as [`KeyRange`] routes them; returned as an inclusive range.
fn range_of(splitters: &[u128], rank: usize) -> (u128, u128) {
    let low = if rank == 0 { 0 } else { splitters[rank - 1] };
    let high = splitters.get(rank).map_or(u128::MAX, |s| s.saturating_sub(1));
    (low, high.max(low))
}

/// The part of sorted samples that falls in node `rank`'s range.
fn in_range<'a>(sorted: &'a [u128], splitters: &[u128], rank: usize) -> &'a [u128] {
    let (low, high) = range_of(splitters, rank);
    let from = sorted.partition_point(|s| *s < low);
    let to = sorted.partition_point(|s| *s <= high);
    &sorted[from..to.max(from)]
}

/// At most `most` of `samples`, evenly spaced (all of them when there are fewer).
fn thinned(samples: &[u128], most: usize) -> impl Iterator<Item = u128> + '_ {
    let step = samples.len().div_ceil(most.max(1)).max(1);
    samples.iter().step_by(step).copied()
}

fn encode_entries(flag: bool, entries: &[u128]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + 16 * entries.len());
    m.push(u8::from(flag));
    for e in entries {
        m.extend_from_slice(&e.to_le_bytes());
    }
    m
}

fn decode_entries(from: usize, m: &[u8]) -> Result<(bool, Vec<u128>), RiverError> {
    if m.is_empty() || !(m.len() - 1).is_multiple_of(16) {
        return Err(RiverError::Protocol { node: from, reason: "malformed sample or splitter list".into() });
    }
    Ok((m[0] != 0, m[1..].chunks_exact(16).map(|c| u128::from_le_bytes(c.try_into().expect("16 bytes"))).collect()))
}

/// Reads samples of a slice of records (given by record index): [`SAMPLE_PLACES`] places
/// spread evenly over it, a few records at each (one read per place; more records per
/// place on larger slices, so that buckets hold a few thousand records at most). Returns
/// the samples as entries (key and input position) and whether every sampled record is a
/// gensort `-a` line.
fn sample_slice(input: &Path, slice: std::ops::Range<u64>) -> std::io::Result<(Vec<u128>, bool)> {
    use std::os::unix::fs::FileExt;
    let file = File::open(input)?;
    let n = slice.end - slice.start;
    let places = SAMPLE_PLACES.min(n);
    if places == 0 {
        return Ok((Vec::new(), true));
    }
    let per_place = (n / (places * SLICE_RECORDS_PER_SAMPLE)).clamp(1, MAX_SAMPLES_PER_PLACE);
    let mut buf = vec![0u8; per_place as usize * RECORD_SIZE];
    let mut samples = Vec::with_capacity((places * per_place) as usize);
    let mut ascii = true;
    for i in 0..places {
        let first = slice.start + (i * n + n / 2) / places;
        let take = per_place.min(slice.end - first) as usize;
        let bytes = &mut buf[..take * RECORD_SIZE];
        file.read_exact_at(bytes, first * RECORD_SIZE as u64)?;
        for (k, rec) in bytes.chunks_exact(RECORD_SIZE).enumerate() {
            ascii &= is_ascii_record(rec);
            samples.push(entry(rec, first + k as u64));
        }
    }
    Ok((samples, ascii))
}

/// Where the sorted records go: a [`DiskSink`] (through the page cache) or a
/// [`DirectSink`] (whole blocks with `O_DIRECT`).
enum OutputDisk {
    Buffered(DiskSink),
    Direct(DirectSink),
}

/// The sorted output's way to disk: records are copied once, straight into the disk
/// sink's buffers it lends; each full buffer is validated (valsort's checks, with verify)
/// and handed to the writer thread.
struct OutputWriter<'a> {
    /// Finds the output file and this partition's offset in it (once).
    locate: &'a mut dyn FnMut() -> Result<(Arc<File>, PathBuf, u64), RiverError>,
    disk: Option<OutputDisk>,
    file: Option<Arc<File>>,
    pool: MemPool,
    inline_io: bool,
    /// Write whole blocks directly (the pool's buffers have a block of headroom).
    direct: bool,
    /// The buffer being filled, and where its records start in it (after the headroom a
    /// direct sink asks for).
    current: Option<(crate::Buffer, usize)>,
    validator: Option<Validator>,
    records: u64,
    progress: &'a mut dyn FnMut(Phase, u64),
    last_progress: Instant,
    /// Pause after each buffer handed over (failure tests).
    delay: Duration,
}

impl OutputWriter<'_> {
    fn disk(&mut self) -> Result<&mut OutputDisk, RiverError> {
        if self.disk.is_none() {
            let (file, path, offset) = (self.locate)()?;
            let pool = self.pool.clone();
            let direct = if self.direct {
                match DirectSink::open(&path, offset, pool.clone()) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        tracing::warn!(error = %e, "direct output refused; writing through the page cache");
                        None
                    }
                }
            } else {
                None
            };
            self.disk = Some(match direct {
                Some(d) => OutputDisk::Direct(d),
                None if self.inline_io => {
                    OutputDisk::Buffered(DiskSink::inline(file.clone(), offset, pool, RECORD_SIZE))
                }
                None => OutputDisk::Buffered(DiskSink::new(file.clone(), offset, pool, RECORD_SIZE)),
            });
            self.file = Some(file);
        }
        Ok(self.disk.as_mut().expect("made above"))
    }

    fn hand_over(&mut self) -> Result<(), RiverError> {
        if let Some((full, start)) = self.current.take() {
            if let Some(v) = &mut self.validator {
                v.push(&full.as_slice()[start..]);
            }
            self.records += ((full.len() - start) / RECORD_SIZE) as u64;
            if self.last_progress.elapsed() > Duration::from_millis(50) {
                (self.progress)(Phase::Write, self.records);
                self.last_progress = Instant::now();
            }
            match self.disk()? {
                OutputDisk::Buffered(d) => {
                    debug_assert_eq!(start, 0);
                    d.sink_buffer(full)?
                }
                OutputDisk::Direct(d) => d.sink(full, start)?,
            }
            if !self.delay.is_zero() {
                std::thread::sleep(self.delay);
            }
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), RiverError> {
        self.hand_over()?;
        (self.progress)(Phase::Write, self.records);
        match self.disk()? {
            OutputDisk::Buffered(d) => d.close(),
            OutputDisk::Direct(d) => d.close().map(|_| ()),
        }
    }

    /// How the partition was written (once placed).
    fn io_name(&self) -> &'static str {
        match self.disk {
            Some(OutputDisk::Direct(_)) => "direct",
            _ => "buffered",
        }
    }
}

impl SpaceSink for OutputWriter<'_> {
    #[inline]
    fn space(&mut self) -> Result<&mut [u8], RiverError> {
        if self.current.is_none() {
            let mut b = self.pool.get();
            // A direct sink wants the records where the block boundary falls; before the
            // partition is placed that is not known, and the writer moves them.
            let start = match &self.disk {
                Some(OutputDisk::Direct(d)) => d.headroom(),
                _ => 0,
            };
            b.set_len(start);
            self.current = Some((b, start));
        }
        let (current, start) = self.current.as_mut().expect("made above");
        let usable = if self.direct { current.capacity() - BLOCK } else { current.capacity() };
        let room = (*start + usable - current.len()) / RECORD_SIZE * RECORD_SIZE;
        Ok(&mut current.spare_mut()[..room])
    }

    #[inline]
    fn commit(&mut self, bytes: usize) -> Result<(), RiverError> {
        let (current, start) = self.current.as_mut().expect("space was lent");
        current.set_len(current.len() + bytes);
        let usable = if self.direct { current.capacity() - BLOCK } else { current.capacity() };
        if *start + usable - current.len() < RECORD_SIZE {
            self.hand_over()?;
        }
        Ok(())
    }

    /// Direct output: the device reads the buffers. With the copy into them bypassing
    /// the cache, the 4x10^7-record external sort spent 3.5 s of user CPU instead of
    /// 3.9–4.2 s (medians of 6 and 8 alternating rounds); buffered output, which the
    /// kernel copies on, does not (10^7 records in memory: sort phase 0.330 against
    /// 0.309 s). See BENCHMARKS.md (issue 8).
    fn bypass_cache(&self) -> bool {
        self.direct
    }
}

/// Runs node `place.rank` of `job`. Node 0 returns the report of the whole sort; the
/// others return `None` once node 0 has committed the output. `progress` is called with
/// counts of records as they move (for progress bars).
pub fn run_node(
    job: &SortJob,
    place: &NodePlace,
    progress: &mut dyn FnMut(Phase, u64),
) -> Result<Option<SortReport>, RiverError> {
    let rank = place.rank;
    let size = place.mesh.size;
    assert_eq!(size, job.nodes, "the mesh has as many nodes as the job");
    let since_start = || (now_ns().saturating_sub(job.start_unix_ns)) as f64 / 1e9;
    let launched = since_start();
    let input_len = std::fs::metadata(&job.input)
        .map_err(|e| RiverError::io(format!("reading the size of {}", job.input.display()), e))?
        .len();
    if !input_len.is_multiple_of(RECORD_SIZE as u64) {
        return Err(RiverError::PartialRecord { len: input_len as usize, record_size: RECORD_SIZE });
    }
    let total = input_len / RECORD_SIZE as u64;
    let first = total * rank as u64 / size as u64;
    let last = total * (rank as u64 + 1) / size as u64;
    let expected = (total / size as u64) as usize * RECORD_SIZE;
    // Sample while a thread connects the mesh (the other nodes may still be starting).
    // A sampling failure is reported once connected, so that the others hear of it.
    let mesh_config = place.mesh.clone();
    let connecting = std::thread::Builder::new()
        .name("river-mesh".into())
        .spawn(move || mesh::connect(&mesh_config))
        .map_err(|e| RiverError::io("starting the mesh thread", e))?;
    let sampled = sample_slice(&job.input, first..last);
    let (ep, peers) =
        connecting.join().map_err(|_| RiverError::io("connecting the mesh", std::io::Error::other("panicked")))??;
    let connected = since_start();
    let bell = Doorbell::new().map_err(|e| RiverError::io("making a doorbell", e))?;
    let river_config = RiverConfig::default();

    let plan = MemoryPlan::new(job.memory, size, &river_config)?;
    // Nodes sharing this host's cores with no core to spare do their disk I/O in their own
    // thread: a reader or writer thread would only take turns with it on the same cores.
    let nodes_here = if place.mesh.transport == MeshTransport::Shm { size } else { 1 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let inline_io = plan.arena_bytes.is_none() && nodes_here >= cores;
    let io_buffers = if inline_io { INLINE_IO_BUFFERS } else { IO_BUFFERS };
    let direct_output = match job.output_io {
        OutputIo::Auto => plan.arena_bytes.is_some(),
        OutputIo::Direct => true,
        OutputIo::Buffered => false,
    };
    // A direct writer's buffers keep a block in front of the records for the bytes of
    // the block the previous buffer ended in.
    let write_bytes = plan.io_buffer_bytes + if direct_output { BLOCK } else { 0 };
    let write_pool = MemPool::sector_aligned(io_buffers, write_bytes, 4096)
        .map_err(|e| RiverError::io("allocating write buffers", e))?;

    let store = match plan.arena_bytes {
        // Address space for the whole input: a partition can never be larger.
        None => RecordStore::in_memory(RECORD_SIZE, total as usize),
        Some(arena) => {
            let prefix = job.temp_prefix(rank);
            RecordStore::spilling(
                RECORD_SIZE,
                arena.min(expected + expected / 8).max(RECORD_SIZE),
                expected as u64,
                prefix,
            )
        }
    };
    let river = River::new(ep, rank, peers, store, river_config, Some(bell.clone()));
    // Group bytes past the page cache's share go into the output's blocks when every node
    // writes its part of one preallocated output directly.
    let files_budget = if plan.arena_bytes.is_some() && direct_output && !job.partitioned {
        job.files_budget.or_else(|| spare::files_budget(nodes_here))
    } else {
        None
    };
    let ctx = NodeContext { job, river: &river, rank, size, total, inline_io, direct_output, files_budget };
    let times = (launched, connected);
    let result = node_body(&ctx, sampled, &bell, &write_pool, &plan, times, progress);
    match result {
        Ok(report) => {
            river.shutdown();
            Ok(report)
        }
        Err(e) => {
            // Tell the others the root cause (a cause reported by another node is theirs
            // to spread).
            if !matches!(e, RiverError::Aborted { .. }) {
                river.abort(&e.to_string());
            }
            let _ = std::fs::remove_file(job.partial_partition_file(rank));
            if rank == 0 {
                let _ = std::fs::remove_file(job.partial_output());
            }
            Err(e)
        }
    }
}

/// What every step of a node needs to know.
struct NodeContext<'a> {
    job: &'a SortJob,
    river: &'a River<RecordStore>,
    rank: usize,
    size: usize,
    /// Records in the input.
    total: u64,
    /// Disk I/O in the node's own thread (no reader or writer thread).
    inline_io: bool,
    /// The output is written with direct I/O ([`DirectSink`]).
    direct_output: bool,
    /// External mode with one preallocated output: bytes of group files before the rest
    /// goes into the output ([`spare`]).
    files_budget: Option<u64>,
}

fn node_body(
    ctx: &NodeContext<'_>,
    sampled: std::io::Result<(Vec<u128>, bool)>,
    bell: &Doorbell,
    write_pool: &MemPool,
    plan: &MemoryPlan,
    (launched_s, connected_s): (f64, f64),
    progress: &mut dyn FnMut(Phase, u64),
) -> Result<Option<SortReport>, RiverError> {
    let NodeContext { job, river, rank, size, total, inline_io, direct_output, files_budget } = *ctx;
    let since_start = || (now_ns().saturating_sub(job.start_unix_ns)) as f64 / 1e9;
    let input_err = |e: std::io::Error| RiverError::io(format!("reading {}", job.input.display()), e);

    // Startup: sample our slice; node 0 picks the splitters and hands every node the
    // samples in its range, from which it makes its buckets.
    let (samples, ascii) = sampled.map_err(input_err)?;
    if job.format == FormatChoice::Ascii && !ascii {
        return Err(RiverError::Input(format!(
            "--ascii given but node {rank}'s slice holds records that are not gensort -a lines"
        )));
    }
    let (ascii, splitters, mine) = if rank == 0 {
        let mut all = samples;
        let mut ascii_all = ascii;
        for j in 1..size {
            let (_, m) = river.recv_control(Some(j), TAG_SAMPLES, STEP_TIMEOUT)?;
            let (a, s) = decode_entries(j, &m)?;
            ascii_all &= a;
            all.extend(s);
        }
        all.sort_unstable();
        let splitters = splitters_from(&all, size);
        // The output exists, at its full length, before anyone writes to it.
        // Direct writers overwrite its blocks allocated up front (ext4 lets such writes
        // run side by side).
        if !job.partitioned && direct_output {
            preallocate(&job.partial_output(), total * RECORD_SIZE as u64)?;
        } else if !job.partitioned {
            let f = File::create(job.partial_output())
                .map_err(|e| RiverError::io(format!("creating {}", job.partial_output().display()), e))?;
            f.set_len(total * RECORD_SIZE as u64).map_err(|e| RiverError::io("sizing the output", e))?;
        }
        for j in 1..size {
            let mut entries = splitters.clone();
            entries.extend(thinned(in_range(&all, &splitters, j), MAX_SAMPLES_SENT));
            river.send_control(j, TAG_SPLITTERS, &encode_entries(ascii_all, &entries))?;
        }
        let mine = thinned(in_range(&all, &splitters, 0), MAX_SAMPLES_SENT).collect();
        (ascii_all, splitters, mine)
    } else {
        river.send_control(0, TAG_SAMPLES, &encode_entries(ascii, &samples))?;
        let (_, m) = river.recv_control(Some(0), TAG_SPLITTERS, STEP_TIMEOUT)?;
        let (a, mut s) = decode_entries(0, &m)?;
        if s.len() < size - 1 {
            return Err(RiverError::Protocol { node: 0, reason: "too few splitters".into() });
        }
        let mine = s.split_off(size - 1);
        (a, s, mine)
    };
    let (low, high) = range_of(&splitters, rank);
    let buckets = KeyBuckets::from_samples(low, high, &mine, SAMPLES_PER_BUCKET, plan.max_buckets);
    let spare_room = match files_budget {
        // Node 0 made the output before sending the splitters.
        Some(files_budget) => {
            let path = job.partial_output();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| RiverError::io(format!("opening {}", path.display()), e))?;
            // Sampled splitters give each node about an equal share (each boundary between
            // nodes moved by `expected_shift` records, for tests of a misjudged share).
            let boundary = |r: usize| match r {
                0 => 0,
                r if r == size => total,
                r => (total * r as u64 / size as u64 + job.expected_shift).min(total),
            };
            let part = boundary(rank) * RECORD_SIZE as u64..boundary(rank + 1) * RECORD_SIZE as u64;
            Some(SpareRoom { file: Arc::new(file), part, files_budget })
        }
        None => None,
    };
    river
        .with_store(|s| {
            if let Some(room) = spare_room {
                s.set_spare(room);
            }
            s.set_buckets(Arc::new(buckets))
        })
        .expect("the store is in the river")?;
    let t_ready = since_start();

    // Read and distribute.
    let read_pool = MemPool::sector_aligned(write_pool.count(), plan.io_buffer_bytes, 4096)
        .map_err(|e| RiverError::io("allocating read buffers", e))?;
    let (mut source, feed) = DiskSource::fed(&job.input, RECORD_SIZE, read_pool, !inline_io, Some(bell.clone()))?;
    let mut input_checksum = Checksum::default();
    let mut records_read = 0u64;
    {
        let mut claims = InputClaims::new(river, total, feed);
        let mut part = PartitionSink::new(KeyRange { splitters, next_index: 0 }, river.sinks(), RECORD_SIZE);
        let mut last_progress = Instant::now();
        loop {
            bell.clear();
            claims.progress()?;
            match source.try_next()? {
                Poll::Ready(buf) => {
                    if job.verify {
                        input_checksum += Checksum::of_records(buf.as_slice());
                    }
                    let records = (buf.len() / RECORD_SIZE) as u64;
                    records_read += records;
                    part.partitioner_mut().next_index = claims.take(records);
                    part.sink_buffer(buf)?;
                    river.progress()?;
                    if last_progress.elapsed() > Duration::from_millis(50) {
                        progress(Phase::Read, records_read);
                        last_progress = Instant::now();
                    }
                    if job.read_delay_ms > 0 && job.slow_node.is_none_or(|r| r == rank) {
                        std::thread::sleep(Duration::from_millis(job.read_delay_ms));
                    }
                }
                Poll::Pending => {
                    if river.progress()? == 0 {
                        river.wait(Some(Duration::from_millis(100)))?;
                    }
                }
                Poll::Dry => break,
            }
        }
        part.close()?;
        claims.finish()?;
    }
    progress(Phase::Read, records_read);
    // Its read buffers are free for the second pass (the merge's read-ahead).
    drop(source);
    river.close_local()?;
    let t_read_own = since_start();
    river.run_dry()?;
    let t_dry = since_start();
    let mut store = river.take_store().expect("the store is taken once");
    let my_records = store.records();
    let spills = store.spills();
    let spill_s = store.spill_time().as_secs_f64();

    // Where our partition goes: after every lower node's. Our count goes out now; the
    // others' are read once the first output buffer is full, by when they have come.
    for j in (0..size).filter(|&j| j != rank) {
        river.send_control(j, TAG_COUNT, &my_records.to_le_bytes())?;
    }
    let receive_counts = || -> Result<Vec<u64>, RiverError> {
        let mut counts = vec![0u64; size];
        counts[rank] = my_records;
        for (j, count) in counts.iter_mut().enumerate().filter(|&(j, _)| j != rank) {
            let (_, m) = river.recv_control(Some(j), TAG_COUNT, STEP_TIMEOUT)?;
            *count = u64::from_le_bytes(
                m.as_slice()
                    .try_into()
                    .map_err(|_| RiverError::Protocol { node: j, reason: "malformed count".into() })?,
            );
        }
        if counts.iter().sum::<u64>() != total {
            return Err(RiverError::Protocol {
                node: rank,
                reason: format!("partitions hold {} records, the input {total}", counts.iter().sum::<u64>()),
            });
        }
        Ok(counts)
    };
    // Group bytes in the output: those it would overwrite before their group is read
    // move to the group files, in every node before any node writes (each node's part is
    // known only now, and another node's bytes may lie in it).
    // Where our partition starts in the output: after every lower node's.
    let offset_of = |counts: &[u64]| counts[..rank].iter().sum::<u64>() * RECORD_SIZE as u64;
    let mut known_counts = None;
    let mut spare_moved_bytes = 0;
    if files_budget.is_some() {
        let counts = receive_counts()?;
        let start = offset_of(&counts);
        spare_moved_bytes = store.settle_spare(start..start + my_records * RECORD_SIZE as u64)?;
        for j in (0..size).filter(|&j| j != rank) {
            river.send_control(j, TAG_SETTLED, b"")?;
        }
        for j in (0..size).filter(|&j| j != rank) {
            river.recv_control(Some(j), TAG_SETTLED, STEP_TIMEOUT)?;
        }
        known_counts = Some(counts);
    }
    let mut locate = || -> Result<(Arc<File>, PathBuf, u64), RiverError> {
        let counts = match known_counts.take() {
            Some(c) => c,
            None => receive_counts()?,
        };
        let (file, path, offset) = if job.partitioned {
            let path = job.partial_partition_file(rank);
            let f = if direct_output {
                preallocate(&path, my_records * RECORD_SIZE as u64)?
            } else {
                File::create(&path).map_err(|e| RiverError::io(format!("creating {}", path.display()), e))?
            };
            (f, path, 0)
        } else {
            let path = job.partial_output();
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| RiverError::io(format!("opening {}", path.display()), e))?;
            (f, path, offset_of(&counts))
        };
        Ok((Arc::new(file), path, offset))
    };

    // Sort, writing as each buffer fills (behind the sort on a writer thread, or in turn
    // with it).
    let mut out = OutputWriter {
        locate: &mut locate,
        disk: None,
        file: None,
        pool: write_pool.clone(),
        inline_io,
        direct: direct_output,
        current: None,
        validator: job.verify.then(Validator::default),
        records: 0,
        progress,
        last_progress: Instant::now(),
        delay: Duration::from_millis(job.write_delay_ms),
    };
    // Read back from the output in the second pass (those moved out are not).
    let spare_bytes = store.spare_bytes();
    let groups = store.write_sorted(&mut out, plan.io_buffer_bytes, plan.merge_read_bytes)?;
    out.hand_over()?;
    let t_sorted = since_start();
    out.close()?;
    let summary = out.validator.take().map(Validator::finish);
    let file = out.file.take().expect("closing placed the partition");
    let output_io = out.io_name().to_string();
    drop(out);
    if job.fsync {
        file.sync_all().map_err(|e| RiverError::io("syncing the output", e))?;
    }
    let t_written = since_start();
    let summary = match summary {
        Some(Ok(s)) => Some(hex(&s.to_bytes())),
        Some(Err(_)) if my_records == 0 => None,
        Some(Err(e)) => return Err(RiverError::Verification(e.to_string())),
        None => None,
    };
    let counters = river.counters();
    let report = NodeReport {
        rank,
        host: hostname(),
        startup_s: t_ready,
        launched_s,
        connected_s,
        read_own_s: t_read_own - t_ready,
        read_distribute_s: t_dry - t_ready,
        sort_s: t_sorted - t_dry,
        write_s: t_written - t_sorted,
        done_s: t_written,
        records_read,
        records: my_records,
        spills,
        groups: groups.groups,
        merged_groups: groups.merged_groups,
        runs: groups.runs,
        resident_groups: groups.resident_groups,
        temp_bytes: groups.temp_bytes,
        spare_bytes,
        spare_moved_bytes,
        output_io,
        spill_s,
        records_sent: counters.records_sent,
        credit_waits: counters.credit_waits,
        sleeps: counters.sleeps,
        usage: Usage::now(),
        input_checksum: job.verify.then(|| format!("{:x}", input_checksum.value())),
        summary,
    };

    // Commit. With one output file node 0 commits it alone (a rename) once every node has
    // reported, so the others are done once they have: they leave at once (their end of
    // stream was declared, so closing is no failure) instead of waiting to be released,
    // a round trip through the scheduler less at the end of a short sort. Partition files
    // are renamed by their own nodes, after node 0 says everyone succeeded.
    if rank != 0 {
        let json = serde_json::to_vec(&report).expect("a report serializes");
        river.send_control(0, TAG_DONE, &json)?;
        if job.partitioned {
            river.recv_control(Some(0), TAG_COMMIT, STEP_TIMEOUT)?;
            river.finish();
            rename(&job.partial_partition_file(rank), &job.partition_file(rank))?;
        } else {
            river.finish();
        }
        return Ok(None);
    }
    let mut reports = vec![report];
    for j in 1..size {
        let (_, m) = river.recv_control(Some(j), TAG_DONE, STEP_TIMEOUT)?;
        let r: NodeReport = serde_json::from_slice(&m)
            .map_err(|e| RiverError::Protocol { node: j, reason: format!("malformed report: {e}") })?;
        reports.push(r);
    }
    river.finish();
    let verified = if job.verify { verify(&reports, total)? } else { false };
    if job.partitioned {
        if job.verify {
            let mut sums = Vec::with_capacity(size * SUMMARY_SIZE);
            for r in &reports {
                if let Some(s) = r.summary.as_deref().and_then(unhex) {
                    sums.extend_from_slice(&s);
                }
            }
            std::fs::write(job.summary_file(), sums).map_err(|e| RiverError::io("writing the summaries", e))?;
        }
        rename(&job.partial_partition_file(0), &job.partition_file(0))?;
    } else {
        rename(&job.partial_output(), &job.output)?;
    }
    if job.partitioned {
        for j in 1..size {
            river.send_control(j, TAG_COMMIT, b"")?;
        }
    }
    let critical = reports.iter().max_by(|a, b| a.done_s.total_cmp(&b.done_s)).expect("at least one node").clone();
    let mean = total as f64 / size as f64;
    let output = if job.partitioned {
        (0..size).map(|r| job.partition_file(r).display().to_string()).collect()
    } else {
        vec![job.output.display().to_string()]
    };
    Ok(Some(SortReport {
        records: total,
        bytes: total * RECORD_SIZE as u64,
        nodes: size,
        total_s: since_start(),
        startup_s: critical.startup_s,
        read_distribute_s: critical.read_distribute_s,
        sort_s: critical.sort_s,
        write_s: critical.write_s,
        format: if ascii { "ascii" } else { "binary" }.into(),
        mode: if reports.iter().any(|r| r.groups > 0) { "external" } else { "memory" }.into(),
        // Of an empty input, every partition is as large as the mean.
        imbalance: if total == 0 { 1.0 } else { reports.iter().map(|r| r.records).max().unwrap_or(0) as f64 / mean },
        verified,
        output,
        per_node: reports,
    }))
}

fn rename(from: &Path, to: &Path) -> Result<(), RiverError> {
    std::fs::rename(from, to).map_err(|e| RiverError::io(format!("renaming {} to {}", from.display(), to.display()), e))
}

/// Checks the partitions' summaries in order: sorted within and across partitions, every
/// record there, and the checksum of the output equal to that of the input.
fn verify(reports: &[NodeReport], total: u64) -> Result<bool, RiverError> {
    let fail = RiverError::Verification;
    let mut summaries = Vec::new();
    let mut input = Checksum::default();
    for r in reports {
        let cks = r.input_checksum.as_deref().and_then(|s| u128::from_str_radix(s, 16).ok());
        input += Checksum(cks.ok_or_else(|| fail(format!("node {} sent no input checksum", r.rank)))?);
        if let Some(s) = &r.summary {
            let bytes = unhex(s)
                .filter(|b| b.len() == SUMMARY_SIZE)
                .ok_or_else(|| fail(format!("node {}: bad summary", r.rank)))?;
            summaries.push(Summary::from_bytes(&bytes.try_into().expect("checked length")));
        }
    }
    let Some(all) = ulnet_sortbench::combine(&summaries) else {
        // An empty input sorts to an empty output, which has nothing to be out of order.
        return match (total, input) {
            (0, Checksum(0)) => Ok(true),
            _ => Err(fail(format!("no records written, {total} read"))),
        };
    };
    if all.records != u128::from(total) {
        return Err(fail(format!("{} records written, {total} read", all.records)));
    }
    if let Some(i) = all.first_unordered() {
        return Err(fail(format!("record {i} is out of order")));
    }
    if all.checksum != input {
        return Err(fail(format!("output checksum {} differs from input checksum {input}", all.checksum)));
    }
    Ok(true)
}
