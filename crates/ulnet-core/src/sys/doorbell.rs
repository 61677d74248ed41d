//! A doorbell: an eventfd a peer rings to wake a sleeping owner.

use rustix::event::{eventfd, EventfdFlags};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// One eventfd. The owner waits on it; the peer (holding a duplicate) rings it.
#[derive(Debug)]
pub(crate) struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self { fd: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)? })
    }

    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Wakes the owner. A full counter (impossible in practice) still leaves it readable,
    /// so `EAGAIN` is as good as success.
    pub(crate) fn ring(&self) {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => tracing::warn!("doorbell write failed: {e}"),
        }
    }

    /// Clears pending rings.
    pub(crate) fn clear(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut buf);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
