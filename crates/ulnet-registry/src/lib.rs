//! # ulnet-registry: the Global Update Protocol and the cluster registry
//!
//! [`gup`] is MSCS's Global Update Protocol rebuilt as a pipelined, batched, durable
//! sans-IO state machine (no sockets, no clock, no threads): totally ordered, atomic
//! updates across the members of a membership view, surviving the failure of any minority
//! of the voting members — sender, locker, receivers, in any combination.
//!
//! [`Registry`] is the cluster database on top of it: keys and values applied in GUP order on
//! every node, durable through the write-ahead log of [`wal`] (crc32c per record, fsync with
//! group commit, snapshots and truncation, a torn tail cut at start-up, a corrupted one
//! refused and recovered from the peers), with linearizable gets and watches.
//!
//! [`service`] runs the registry inside `ulnet node` (the voting configuration follows the
//! membership's views); [`client`] is its client protocol and library.
//!
//! [`linearizability`] checks recorded client histories per key (used by the tests).
#![deny(missing_docs)]

pub mod client;
pub mod codec;
pub mod gup;
pub mod linearizability;
mod registry;
pub mod service;
pub mod store;
pub mod wal;

pub use registry::{GetId, Registry, RegistryEvent, SetError, WatchId};
