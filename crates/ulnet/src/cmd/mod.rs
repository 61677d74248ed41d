//! One module per command.

pub mod bench;
pub mod clock;
pub mod demo;
pub mod sort;
pub mod sort_demo;
pub mod stats;
