//! The distributed sort: a one-pass disk-to-disk sort of Sort Benchmark records over a
//! river (Millennium Sort), with sampled range partitioning, a radix sort core, writing
//! behind the sort, and a two-pass external mode past a memory bound (a distribution pass
//! into key-range groups, then each group sorted in memory).
//!
//! * [`job`]: what to sort and the report.
//! * [`node`]: one node's program ([`node::run_node`]).
//! * [`claims`]: the input shared out a chunk at a time as nodes ask.
//! * [`radix`]: the sort core.
//! * `scatter` and `stream`: moving records to their buckets' places, and sorted records
//!   into direct output buffers, with stores that bypass the cache.
//! * [`bucket`]: records kept in key-range buckets as they arrive, sorted one bucket at a time.
//! * [`store`]: the node's records, in memory or spilled to key-range groups; merging runs.
//! * [`distribute`]: external mode's group files and the group-by-group second pass.
//! * [`spare`]: group bytes past the page cache's share kept in the output's own blocks;
//!   `writeback` pushes them to the disk as they are written.
//! * [`launch`]: rank and size from Slurm's and MPI launchers' environments.
//! * [`usage`]: CPU time, faults and context switches of a node, for its report.

pub mod bucket;
pub mod claims;
pub mod distribute;
pub mod job;
pub mod launch;
pub mod node;
pub mod radix;
mod scatter;
pub mod spare;
pub mod store;
mod stream;
pub mod usage;
mod writeback;

pub use job::{FormatChoice, NodeReport, OutputIo, SortJob, SortReport};
pub use node::{run_node, NodePlace, Phase};
