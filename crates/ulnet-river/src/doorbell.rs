//! A doorbell between threads of one process: an eventfd that a producer rings after
//! handing over work, so the consumer can sleep on it together with its network channels
//! ([`ulnet_core::Endpoint::wait_also`]) instead of polling either.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// A cloneable doorbell; every clone rings and watches the same eventfd.
///
/// ```
/// let bell = ulnet_river::Doorbell::new()?;
/// let other = bell.clone();
/// std::thread::spawn(move || other.ring());
/// bell.wait(None); // returns once rung
/// bell.clear();
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Doorbell {
    fd: Arc<OwnedFd>,
}

impl Doorbell {
    /// A new doorbell, not rung.
    pub fn new() -> std::io::Result<Self> {
        let fd =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        Ok(Doorbell { fd: Arc::new(fd) })
    }

    /// Rings: the fd becomes readable until [`Doorbell::clear`]. A system call, so ring
    /// once per handed-over buffer, not per record.
    pub fn ring(&self) {
        let _ = rustix::io::write(&*self.fd, &1u64.to_ne_bytes());
    }

    /// Clears a ring, before the consumer looks for the work that caused it (so a ring
    /// after the look is never lost).
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&*self.fd, &mut b);
    }

    /// Sleeps until rung or `timeout` passes (for consumers with no endpoint to watch).
    pub fn wait(&self, timeout: Option<Duration>) {
        let mut fds = [rustix::event::PollFd::new(&*self.fd, rustix::event::PollFlags::IN)];
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let _ = rustix::event::poll(&mut fds, ms);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
