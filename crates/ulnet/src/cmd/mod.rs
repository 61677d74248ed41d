//! One module per command.

pub mod bench;
pub mod clock;
pub mod demo;
pub mod demo_rma;
pub mod stats;
