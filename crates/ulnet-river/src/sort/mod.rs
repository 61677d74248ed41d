//! The distributed sort: a one-pass disk-to-disk sort of Sort Benchmark records over a
//! river (Millennium Sort), with sampled range partitioning, a radix sort core, writing
//! behind the sort, and a two-pass external mode past a memory bound.
//!
//! * [`job`]: what to sort and the report.
//! * [`node`]: one node's program ([`node::run_node`]).
//! * [`radix`]: the sort core.
//! * [`bucket`]: records kept in key-range buckets as they arrive, sorted one bucket at a time.
//! * [`store`]: the node's records, in memory or spilled as sorted runs, and the merge.
//! * [`launch`]: rank and size from Slurm's and MPI launchers' environments.
//! * [`usage`]: CPU time, faults and context switches of a node, for its report.

pub mod bucket;
pub mod job;
pub mod launch;
pub mod node;
pub mod radix;
pub mod store;
pub mod usage;

pub use job::{FormatChoice, NodeReport, SortJob, SortReport};
pub use node::{run_node, NodePlace, Phase};
