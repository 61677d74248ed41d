//! Thin wrappers over the operating system: sealed memory files, doorbells, fd passing,
//! batched datagram I/O.

pub(crate) mod barrier;
pub(crate) mod doorbell;
pub(crate) mod fdpass;
pub(crate) mod memfd;
pub(crate) mod udp;
