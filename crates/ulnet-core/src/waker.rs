//! Waking a sleeping endpoint from another thread: an eventfd that [`crate::Endpoint::wait`]
//! sleeps on beside its channels. A thread that finishes work the endpoint's owner waits
//! for (an fsync, say) calls [`Waker::wake`]; a wake that comes before the owner sleeps is
//! not lost (the eventfd stays readable until the owner's next sleep drains it).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Wakes the endpoint it came from ([`crate::Endpoint::waker`]). Cheap to clone; `Send` and
/// `Sync`.
#[derive(Clone, Debug)]
pub struct Waker {
    fd: Arc<OwnedFd>,
}

impl Waker {
    pub(crate) fn new() -> std::io::Result<Self> {
        let fd =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        Ok(Self { fd: Arc::new(fd) })
    }

    /// Wakes the endpoint's sleeper (or makes its next sleep return at once).
    pub fn wake(&self) {
        // The counter saturates only after 2^64 - 2 wakes without a sleep in between.
        let _ = rustix::io::write(&*self.fd, &1u64.to_ne_bytes());
    }

    /// Clears pending wakes (after a sleep).
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&*self.fd, &mut b);
    }
}

impl AsFd for Waker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Endpoint, EndpointConfig};
    use std::time::{Duration, Instant};

    #[test]
    fn a_wake_from_another_thread_ends_a_wait_and_is_not_lost_before_it() {
        let mut ep = Endpoint::new(EndpointConfig::default());
        let waker = ep.waker().unwrap();
        // Woken before the wait: the wait returns at once.
        waker.wake();
        let t = Instant::now();
        ep.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(4));
        // Woken during the wait.
        let w = waker.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.wake();
        });
        let t = Instant::now();
        ep.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(4));
        thread.join().unwrap();
        // Drained: with nothing new, the wait runs to its timeout.
        let t = Instant::now();
        ep.wait(Some(Duration::from_millis(100))).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(90));
    }
}
