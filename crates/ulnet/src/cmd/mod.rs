//! One module per command.

pub mod bench;
pub mod bench_trace;
pub mod clock;
pub mod dc;
pub mod demo;
pub mod demo_cluster;
pub mod demo_registry;
pub mod demo_rma;
pub mod demo_trace;
pub mod fsstudy;
pub mod node;
pub mod registry;
pub mod secret;
pub mod sort;
pub mod sort_demo;
pub mod stats;
pub mod trace;
