//! Room for group bytes in the output's own blocks (external mode): [`SpareCells`].
//!
//! Why: the page cache holds dirty file data up to the kernel's background threshold
//! (`vm.dirty_background_ratio` of the memory it may use for files: about 2.2 GB on the
//! development VM) before its flusher writes any back. The 4x10^7 benchmark's first pass
//! writes 3.3 GB of group files, so the flusher gives about 1.1 GB of them blocks, which
//! are freed when the second pass removes the files; on a file system mounted with
//! `discard` every freed block is then discarded, between the output's writes: 0.3 s of
//! device time in a pass bound by the disk (BENCHMARKS.md, issue 8). The output's blocks
//! are allocated before the first pass (`preallocate`) and never freed; so a node's group
//! bytes past its share of the page cache go there instead, through the page cache, into
//! the part of the output that its own records will overwrite in the second pass. A
//! `Pusher` starts their writeback at once (they never count as dirty for long, so the
//! flusher leaves the group files alone), and the second pass reads them back from the
//! page cache before the output overwrites them.
//!
//! Where: each group's bytes go to the upper half of the part of the output its records
//! are expected (from the sample) to take, from its end down, in cells of whole pages. The
//! output reaches a group's part only once the group is read back, so a cell is safe when
//! it lies at or past its group's start and inside the node's part. Once every partition's
//! size is known, before any node writes, [`SpareCells::settle`] names the cells that
//! break that (sampling misjudged a size) for their bytes to move to the group's file.

use super::writeback::Pusher;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Page size: cells start and end on pages, so that no page holds two cells' bytes.
const PAGE: u64 = 4096;

/// Share of the kernel's background threshold for dirty data that the nodes of a host
/// leave to their group files: 0.8. The threshold is estimated from `/proc/meminfo`
/// before the nodes take their memory bound (which lowers it), and other writers on the
/// host dirty pages too.
const DIRTY_SHARE: f64 = 0.8;

/// What a node's store is given to put group bytes in the output.
#[derive(Clone, Debug)]
pub struct SpareRoom {
    /// The output file, open for reading and writing through the page cache.
    pub file: Arc<File>,
    /// The node's expected part of the output, in bytes.
    pub part: Range<u64>,
    /// Bytes the group files may take before the rest goes to the output.
    pub files_budget: u64,
}

/// A group's bytes in a cell of the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Where they start in the output.
    pub at: u64,
    /// How many.
    pub len: usize,
}

/// The cells of a node's groups in the output, and what is in them.
#[derive(Debug)]
pub struct SpareCells {
    file: Arc<File>,
    files_budget: u64,
    /// Bytes written to the group files so far.
    file_bytes: u64,
    /// Bytes of a cell: a stage, rounded up to pages.
    cell: u64,
    /// Where each group's next cell ends (falling from the end of its expected part) …
    next_end: Vec<u64>,
    /// … and how low its cells may go (the middle of that part; 0 room for a group
    /// kept out).
    floor: Vec<u64>,
    chunks: Vec<Vec<Chunk>>,
    /// Running from the first cell written until [`SpareCells::settle`].
    pusher: Option<Pusher>,
    open: bool,
}

impl SpareCells {
    /// Cells for groups of the bucket ranges `ranges` (of `buckets` buckets holding about
    /// equal shares of the partition), staged in pieces of at most `stage_bytes`; the
    /// groups before `first` (resident ones, read back first) get none.
    pub fn new(room: SpareRoom, ranges: &[Range<usize>], buckets: usize, stage_bytes: usize, first: usize) -> Self {
        let part_len = room.part.end - room.part.start;
        let at = |b: usize| room.part.start + (part_len as u128 * b as u128 / buckets.max(1) as u128) as u64;
        let (mut next_end, mut floor) = (vec![0; ranges.len()], vec![0; ranges.len()]);
        for (g, r) in ranges.iter().enumerate().skip(first) {
            let (start, end) = (at(r.start), at(r.end));
            next_end[g] = end / PAGE * PAGE;
            floor[g] = (start + (end - start) / 2).div_ceil(PAGE) * PAGE;
        }
        SpareCells {
            file: room.file,
            files_budget: room.files_budget,
            file_bytes: 0,
            cell: (stage_bytes as u64).div_ceil(PAGE) * PAGE,
            next_end,
            floor,
            chunks: vec![Vec::new(); ranges.len()],
            pusher: None,
            open: true,
        }
    }

    /// Counts `len` bytes written to a group file.
    pub fn file_written(&mut self, len: usize) {
        self.file_bytes += len as u64;
    }

    /// Writes `bytes` of group `g` into one of its cells if the group files have taken
    /// their budget and the group has a cell left: whether it did.
    pub fn try_write(&mut self, g: usize, bytes: &[u8]) -> std::io::Result<bool> {
        assert!(bytes.len() as u64 <= self.cell, "a stage fits a cell");
        if !self.open
            || self.file_bytes + bytes.len() as u64 <= self.files_budget
            || self.next_end[g] < self.floor[g] + self.cell
        {
            return Ok(false);
        }
        let at = self.next_end[g] - self.cell;
        self.file.write_all_at(bytes, at)?;
        self.next_end[g] = at;
        self.chunks[g].push(Chunk { at, len: bytes.len() });
        if self.pusher.is_none() {
            self.pusher = Some(Pusher::start(self.file.clone())?);
        }
        Ok(true)
    }

    /// Whether bytes may still go into cells ([`SpareCells::settle`] not yet called).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Group `g`'s chunks.
    pub fn chunks(&self, g: usize) -> &[Chunk] {
        &self.chunks[g]
    }

    /// The output file the chunks are in.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Bytes in the cells.
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().flatten().map(|c| c.len as u64).sum()
    }

    /// Takes no more bytes, stops the pusher, and takes out (returns, by group) every
    /// chunk that the output would overwrite before its group is read: one that starts
    /// before its group does (`group_starts[g]`, in the output, now that the partitions'
    /// sizes are known) or ends past the node's part (`part_end`).
    pub fn settle(&mut self, group_starts: &[u64], part_end: u64) -> Vec<(usize, Chunk)> {
        assert_eq!(group_starts.len(), self.chunks.len(), "a start for every group");
        self.open = false;
        self.pusher = None;
        let mut out = Vec::new();
        for (g, chunks) in self.chunks.iter_mut().enumerate() {
            chunks.retain(|&c| {
                let safe = c.at >= group_starts[g] && c.at + c.len as u64 <= part_end;
                if !safe {
                    out.push((g, c));
                }
                safe
            });
        }
        out
    }
}

/// Bytes of group files each of `nodes` nodes on this host may leave in the page cache
/// before the kernel's flusher would start writing them back: a share (`DIRTY_SHARE`) of
/// the background threshold, less what is dirty already. `None` where `/proc` does not
/// tell.
pub fn files_budget(nodes: usize) -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |name: &str| {
        meminfo.lines().find_map(|l| {
            l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    let threshold = match read("/proc/sys/vm/dirty_background_bytes")? {
        0 => {
            let dirtyable = kib("MemFree")? + kib("Active(file)")? + kib("Inactive(file)")?;
            dirtyable * 1024 / 100 * read("/proc/sys/vm/dirty_background_ratio")?
        }
        bytes => bytes,
    };
    let room = threshold.saturating_sub(kib("Dirty")? * 1024);
    Some((room as f64 * DIRTY_SHARE) as u64 / nodes.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(dir: &tempfile::TempDir, part: Range<u64>, files_budget: u64) -> SpareRoom {
        let file =
            File::options().create(true).truncate(true).read(true).write(true).open(dir.path().join("out")).unwrap();
        file.set_len(part.end + (1 << 20)).unwrap();
        SpareRoom { file: Arc::new(file), part, files_budget }
    }

    #[test]
    fn cells_fill_the_upper_half_of_each_group_downwards_once_the_budget_is_spent() {
        let dir = tempfile::tempdir().unwrap();
        // Two groups of 4 buckets over a part of 8 MiB from 1 MiB on: 4 MiB each.
        let ranges = [0..4, 4..8];
        let mut cells = SpareCells::new(room(&dir, 1 << 20..9 << 20, 65_500), &ranges, 8, 65_500, 0);
        assert!(!cells.try_write(1, &[1; 65_500]).unwrap(), "the budget is not spent");
        cells.file_written(65_500);
        assert!(cells.try_write(1, &[2; 65_500]).unwrap());
        assert!(cells.try_write(1, &[3; 100]).unwrap());
        assert_eq!(
            cells.chunks(1),
            &[Chunk { at: (9 << 20) - 65_536, len: 65_500 }, Chunk { at: (9 << 20) - 131_072, len: 100 }]
        );
        // The upper half of group 0's 4 MiB holds 32 cells of 64 KiB, then no more.
        let placed = (0..40).take_while(|_| cells.try_write(0, &[4; 65_500]).unwrap()).count();
        assert_eq!(placed, 32);
        assert_eq!(cells.chunks(0).last().unwrap().at, 3 << 20);
        let mut back = vec![0; 100];
        cells.file().read_exact_at(&mut back, (9 << 20) - 131_072).unwrap();
        assert!(back.iter().all(|&b| b == 3));
        assert_eq!(cells.bytes(), 65_600 + 32 * 65_500);
    }

    #[test]
    fn settle_takes_out_the_chunks_the_output_would_overwrite_first() {
        let dir = tempfile::tempdir().unwrap();
        let ranges = [0..1, 1..2, 2..3];
        let mut cells = SpareCells::new(room(&dir, 0..3 << 20, 0), &ranges, 3, 4096, 1);
        assert!(!cells.try_write(0, &[0; 4096]).unwrap(), "group 0 is resident: no cells");
        for g in 1..3 {
            for _ in 0..4 {
                assert!(cells.try_write(g, &[g as u8; 4096]).unwrap());
            }
        }
        // Group 1 starts 8 KiB later than expected; the part ends 4 KiB early.
        let starts = [0, (1 << 20) + 8192, 2 << 20];
        let moved = cells.settle(&starts, (3 << 20) - 4096);
        let mut moved_at: Vec<_> = moved.iter().map(|&(g, c)| (g, c.at)).collect();
        moved_at.sort();
        assert_eq!(moved_at, vec![(2, (3 << 20) - 4096)]);
        assert_eq!(cells.chunks(1).len(), 4);
        assert_eq!(cells.chunks(2).len(), 3);
        assert!(!cells.try_write(1, &[9; 4096]).unwrap(), "settled: no more");
        let late = [0, (2 << 20) - 8192, 2 << 20];
        let moved = cells.settle(&late, 3 << 20);
        assert_eq!(moved.iter().filter(|(g, _)| *g == 1).count(), 2, "the two lowest cells of group 1");
    }
}
