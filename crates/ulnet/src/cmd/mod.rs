//! One module per command.

pub mod bench;
pub mod clock;
pub mod dc;
pub mod demo;
pub mod demo_cluster;
pub mod node;
pub mod registry;
pub mod stats;
