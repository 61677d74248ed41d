//! The distributed sort.

pub mod radix;
pub mod store;
