//! One module per command.

pub mod bench;
pub mod clock;
pub mod demo;
pub mod demo_cluster;
pub mod node;
pub mod stats;
