//! The shared-memory transport: channels between processes on one host.
//!
//! Each side of a channel owns a receive mapping ([`layout`]) holding a descriptor ring
//! ([`ring`]), a free queue (`free_ring`) and receive buffers, and maps its peer's to
//! send. Small messages are written inline into the peer's ring (no copy besides the
//! descriptor itself); larger ones are copied once into buffers the peer has freed and
//! read by the peer in place. Setup and liveness go over a Unix socket ([`connect`]), whose
//! peers judge each other's credentials first (`admission`).

pub(crate) mod admission;
mod channel;
pub mod connect;
mod free_ring;
pub mod layout;
pub(crate) mod mem;
pub mod ring;

pub use admission::{AdmissionCounters, AllowedPeers};
pub use channel::ShmChannel;
pub use connect::{ShmConfig, ShmListener};
pub use layout::ShmGeometry;
