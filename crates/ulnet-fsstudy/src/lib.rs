//! # ulnet-fsstudy: how a file system is used
//!
//! The file-system usage study of the thesis's Chapter 9, for Linux: what a directory tree
//! holds ([`snapshot`]), every request made to it ([`passthrough`], a FUSE pass-through
//! that records each operation into a compact trace file without making the operation
//! wait), and the study of the traces ([`analysis`]) — user activity, per-open access
//! patterns, lifetimes of new files, open durations, read and write sizes, the mix of
//! directory and control operations, errors, sequential runs, heavy tails and the
//! comparison of arrivals with a Poisson process — reported as JSON and as Markdown with
//! SVG figures beside the thesis's own values ([`report`]).
//!
//! The parts, in the order data flows:
//! - [`format`](mod@format), [`writer`], [`reader`]: the file format (versioned header, checksummed
//!   blocks), written one block at a time, read as far as it is whole.
//! - [`recorder`]: the bounded ring between the traced operations and the writer thread.
//! - [`snapshot`]: a walk of a tree into a snapshot file.
//! - [`passthrough`]: the tracing FUSE file system and its mount (`--mount DIR`, and
//!   `-- COMMAND` runs a command inside it).
//! - [`generator`]: a planned mix of operations whose figures are known, to check the
//!   whole chain against.
//! - [`analysis`]: traces and snapshots to a [`analysis::Study`].
//! - [`report`]: the study as JSON, Markdown and SVG.
#![deny(missing_docs)]

pub mod analysis;
pub mod clock;
pub mod format;
pub mod generator;
pub mod passthrough;
pub mod reader;
pub mod recorder;
pub mod report;
pub mod snapshot;
pub mod writer;
