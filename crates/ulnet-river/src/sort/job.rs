//! What a sort is asked to do ([`SortJob`]) and what it reports ([`SortReport`]).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How records are to be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatChoice {
    /// Look at sampled records: ASCII when every one is a gensort `-a` line.
    Auto,
    /// ASCII records (gensort `-a`): checked on the sampled records.
    Ascii,
    /// Binary records.
    Binary,
}

/// How the sorted output reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputIo {
    /// Direct in external mode (where the output is larger than memory and nodes write
    /// it beside a second pass reading group files), buffered otherwise (in-memory sorts,
    /// whose output is small enough to leave in the page cache as GNU sort and `cp` do).
    Auto,
    /// Through the page cache.
    Buffered,
    /// Whole blocks with `O_DIRECT` into a preallocated file (the partial blocks at the
    /// partitions' edges through the page cache); buffered where the file system refuses
    /// direct I/O.
    Direct,
}

/// One sort, as every node sees it (every node is started with the same job).
#[derive(Clone, Debug)]
pub struct SortJob {
    /// A name unique to this run (rendezvous names, temporary files).
    pub job: String,
    /// The input file (the same path must be readable on every node).
    pub input: PathBuf,
    /// The output file (or, with `partitioned`, the prefix of the partition files).
    pub output: PathBuf,
    /// Number of nodes.
    pub nodes: usize,
    /// Memory bound per node in bytes: past it a node spills its records to key-range
    /// group files and sorts them group by group (two passes). `None`: one pass, in memory.
    pub memory: Option<u64>,
    /// Where runs go (default: beside the output).
    pub temp_dir: Option<PathBuf>,
    /// One output file per node (`OUTPUT.NNNNN`) instead of one file.
    pub partitioned: bool,
    /// Checksum the input and validate the output (valsort's checks, on the fly).
    pub verify: bool,
    /// Record format.
    pub format: FormatChoice,
    /// When the command started (Unix time, ns): the zero of every phase time.
    pub start_unix_ns: u128,
    /// `fsync` the output before reporting.
    pub fsync: bool,
    /// Pause after each buffer read, in ms (for failure tests: keeps a sort running long
    /// enough to kill a node in the middle of it).
    pub read_delay_ms: u64,
    /// The one node that pauses so, if set (a slow node, for tests of how the input is
    /// shared out); else every node does.
    pub slow_node: Option<usize>,
    /// Pause after each output buffer handed to the writer, in ms (for failure tests:
    /// kills a node while it writes).
    pub write_delay_ms: u64,
    /// External mode: bytes of group files a node leaves in the page cache before the rest
    /// goes into the output's blocks (`None`: its share of the kernel's background
    /// writeback threshold, [`super::spare::files_budget`]).
    pub files_budget: Option<u64>,
    /// External mode: records by which every boundary between two nodes' expected parts of
    /// the output is moved later, as if sampling misjudged the partitions' sizes (for tests
    /// of the group bytes the output would overwrite; 0 otherwise).
    pub expected_shift: u64,
    /// How the output is written.
    pub output_io: OutputIo,
}

impl SortJob {
    /// The file the single output is written to until every node has finished.
    pub fn partial_output(&self) -> PathBuf {
        PathBuf::from(format!("{}.ulnet-partial-{}", self.output.display(), self.job))
    }

    /// Node `rank`'s partition file (partitioned output).
    pub fn partition_file(&self, rank: usize) -> PathBuf {
        PathBuf::from(format!("{}.{rank:05}", self.output.display()))
    }

    /// Node `rank`'s partition file until the sort commits.
    pub fn partial_partition_file(&self, rank: usize) -> PathBuf {
        PathBuf::from(format!("{}.{rank:05}.ulnet-partial-{}", self.output.display(), self.job))
    }

    /// The valsort summaries of the partitions, in order (partitioned output with verify).
    pub fn summary_file(&self) -> PathBuf {
        PathBuf::from(format!("{}.sum", self.output.display()))
    }

    /// Where the temporary group and run files go: `temp_dir`, or the output's directory.
    pub fn temp_directory(&self) -> PathBuf {
        self.temp_dir.clone().unwrap_or_else(|| {
            self.output
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| ".".into(), std::path::Path::to_path_buf)
        })
    }

    /// Start of the names of node `rank`'s temporary files.
    pub fn temp_prefix(&self, rank: usize) -> PathBuf {
        self.temp_directory().join(format!(".ulnet-sort-{}-{rank}", self.job))
    }

    /// Files a failed run may leave behind, for a launcher to remove: the partial outputs,
    /// and the temporary files of this run that a killed node could not remove.
    pub fn partial_files(&self) -> Vec<PathBuf> {
        let mut v = vec![self.partial_output()];
        v.extend((0..self.nodes).map(|r| self.partial_partition_file(r)));
        let ours = format!(".ulnet-sort-{}-", self.job);
        if let Ok(dir) = std::fs::read_dir(self.temp_directory()) {
            v.extend(dir.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&ours)).map(|e| e.path()));
        }
        v
    }
}

/// Phase times and counts of one node. Times are seconds; phases follow the seed's
/// figures 8–9: startup (launch, connect, sample), read and distribute, sort, write.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node's rank.
    pub rank: usize,
    /// Host it ran on.
    pub host: String,
    /// Command start to the node being connected and holding the splitters.
    pub startup_s: f64,
    /// Part of startup: command start to the node's program running (process launch).
    #[serde(default)]
    pub launched_s: f64,
    /// Part of startup: command start to the mesh of channels being connected.
    #[serde(default)]
    pub connected_s: f64,
    /// Part of read and distribute: seconds until its own slice was read and sent (the
    /// rest is waiting for the other nodes' records).
    #[serde(default)]
    pub read_own_s: f64,
    /// Reading its input slice, partitioning, sending, and receiving until its queue ran
    /// dry (in external mode this includes spilling runs).
    pub read_distribute_s: f64,
    /// Sorting (or merging runs) until the last record was handed to the writer.
    pub sort_s: f64,
    /// Writing what was still unwritten when sorting ended.
    pub write_s: f64,
    /// Seconds from the command start to its output being written.
    pub done_s: f64,
    /// Records read from its input slice.
    pub records_read: u64,
    /// Records in its partition.
    pub records: u64,
    /// Times the node's arena reached its memory bound and its records went to key-range
    /// group files: 0 when everything fitted, and in external mode planned from the start
    /// when the resident groups fitted.
    #[serde(default)]
    pub spills: usize,
    /// Key-range groups sorted one by one in the second pass (external mode).
    #[serde(default)]
    pub groups: usize,
    /// Groups that did not fit in half the memory and were merged from sorted runs.
    #[serde(default)]
    pub merged_groups: usize,
    /// Sorted runs those groups were written as.
    pub runs: usize,
    /// Groups whose records that came after the first spill stayed in memory (external
    /// mode).
    #[serde(default)]
    pub resident_groups: usize,
    /// Bytes the first pass set aside for the second (external mode): the group files', and
    /// the output's own blocks' (`spare_bytes` of them).
    #[serde(default)]
    pub temp_bytes: u64,
    /// External mode: bytes of those kept in the output's own blocks instead of group
    /// files (`spare`) and read back from there.
    #[serde(default)]
    pub spare_bytes: u64,
    /// Of the bytes that first went to the output's blocks, those moved to the group files
    /// before the output was written: the output would have reached them before their group
    /// was read (sampling misjudged where it starts).
    #[serde(default)]
    pub spare_moved_bytes: u64,
    /// How its partition was written: "direct" or "buffered".
    #[serde(default)]
    pub output_io: String,
    /// Seconds receiving stopped to move the full arena to the group files (external mode).
    pub spill_s: f64,
    /// Records sent to other nodes.
    pub records_sent: u64,
    /// Times a sender waited for credit.
    pub credit_waits: u64,
    /// Times the node slept in the kernel waiting for its channels or its disk reader.
    #[serde(default)]
    pub sleeps: u64,
    /// CPU time, faults and context switches of the node's process (all its threads).
    #[serde(default)]
    pub usage: super::usage::Usage,
    /// Checksum of its input slice (hex), with verify.
    pub input_checksum: Option<String>,
    /// valsort summary of its partition (hex of the 280-byte record), with verify.
    pub summary: Option<String>,
}

/// What a sort reports (the JSON of `ulnet sort --json`, fields of the CLI contract
/// first).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SortReport {
    /// Records sorted.
    pub records: u64,
    /// Bytes sorted.
    pub bytes: u64,
    /// Nodes.
    pub nodes: usize,
    /// Command start to output committed.
    pub total_s: f64,
    /// Startup of the slowest node (the one that finished writing last).
    pub startup_s: f64,
    /// Its read and distribute phase.
    pub read_distribute_s: f64,
    /// Its sort phase.
    pub sort_s: f64,
    /// Its write phase.
    pub write_s: f64,
    /// `ascii` or `binary`.
    pub format: String,
    /// `memory` (one pass) or `external` (some node spilled to group files).
    pub mode: String,
    /// Records in the largest partition over the mean (1.0 is perfect balance).
    pub imbalance: f64,
    /// Whether the output was validated (and passed) with verify.
    pub verified: bool,
    /// The output file(s).
    pub output: Vec<String>,
    /// Every node's figures.
    pub per_node: Vec<NodeReport>,
}
