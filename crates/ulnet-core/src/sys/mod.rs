//! Thin wrappers over the operating system: sealed memory files, doorbells, fd passing.

pub(crate) mod barrier;
pub(crate) mod doorbell;
pub(crate) mod fdpass;
pub(crate) mod memfd;
