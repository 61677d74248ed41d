//! Thin wrappers over the operating system: sealed memory files, doorbells, fd passing,
//! peer credentials, batched datagram I/O.

pub(crate) mod barrier;
pub(crate) mod credentials;
pub(crate) mod doorbell;
pub(crate) mod fdpass;
pub(crate) mod memfd;
pub(crate) mod udp;
