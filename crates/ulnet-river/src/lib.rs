//! # ulnet-river: River dataflow and the distributed sort
//!
//! River (after Millennium Sort's River System primitives) treats data as a fluid that
//! flows from [`Source`]s to [`Sink`]s through a distributed queue. The primitives:
//!
//! * [`Buffer`] and bounded [`MemPool`]s of them: heap, sector-aligned for disk I/O,
//!   registered (faulted in and locked) for the network ([`pool`]).
//! * [`Source`] and [`Sink`] (record and buffer granularity), composed with [`pump`]
//!   ([`flow`]).
//! * [`direct::DirectSink`]: one writer's range of a shared file written with `O_DIRECT`
//!   (whole blocks; the partial edge blocks through the page cache) ([`direct`]).
//! * [`DiskSource`] and [`DiskSink`]: asynchronous reads ahead and writes behind on
//!   threads of their own ([`disk`]).
//! * [`NetSink`] and [`NetSource`]: records to and from other nodes over ulnet channels,
//!   with credit flow control ([`river`]), whose accounting is a sans-IO state machine
//!   ([`credit::FlowControl`]) also run under the simulator.
//! * [`PartitionSink`]: routes each record by an application rule ([`partition`]).
//! * [`River`]: the node's part of the distributed queue, with [`RiverSink`] for its own
//!   records, explicit end of stream from every source and a precise meaning of "run dry"
//!   ([`river`]), set up over a full mesh of channels ([`mesh`]).
//!
//! [`sort`] composes them into a one-pass (or, past a memory bound, two-pass)
//! disk-to-disk distributed sort of Sort Benchmark records.
#![deny(missing_docs)]

pub mod credit;
pub mod direct;
pub mod disk;
mod doorbell;
pub mod error;
pub mod flow;
pub mod mesh;
pub mod partition;
pub mod pool;
pub mod river;
pub mod sort;
pub mod wire;

pub use disk::{DiskSink, DiskSource, Poll};
pub use doorbell::Doorbell;
pub use error::RiverError;
pub use flow::{pump, Sink, Source, SpaceSink, StagedSink, VecSink};
pub use partition::{PartitionSink, Partitioner};
pub use pool::{Buffer, MemPool, PoolKind};
pub use river::{NetSink, NetSource, River, RiverConfig, RiverCounters, RiverSink};
