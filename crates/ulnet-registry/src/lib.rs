//! # ulnet-registry: the Global Update Protocol and the cluster registry
//!
//! [`gup`] is MSCS's Global Update Protocol rebuilt as a pipelined, batched, durable
//! sans-IO state machine (no sockets, no clock, no threads): totally ordered, atomic
//! updates across the members of a membership view, surviving the failure of any minority
//! of the voting members — sender, locker, receivers, in any combination.
#![deny(missing_docs)]

pub mod codec;
pub mod gup;
