//! One epoll set for the channels whose readiness is a level-triggered descriptor (a TCP
//! socket): [`crate::Endpoint::poll`] visits only the channels the set reports, and
//! [`crate::Endpoint::wait`] sleeps on the set instead of on each descriptor. An endpoint
//! with dozens of TCP channels (a cluster node talks to every other member) then pays a
//! system call or two per poll, not one per channel. Channels whose probe needs its arm and
//! disarm protocol (shared memory) are polled and slept on as before.

use rustix::event::epoll;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

pub(crate) struct Watch {
    epoll: OwnedFd,
    /// Which channel slots are in the set.
    watched: Vec<bool>,
    /// Watched channels that stopped at their delivery budget with input perhaps still
    /// buffered in user space (the socket then no longer says so): polled again next time.
    again: Vec<usize>,
    events: epoll::EventVec,
}

// SAFETY: `EventVec` is not `Send` only because epoll event data may hold a pointer; this
// set stores channel indices (`EventData::new_u64`) and never a pointer, and the vector is
// scratch space owned by the set and used only through `&mut self`. Moving the set to
// another thread moves nothing another thread can reach.
unsafe impl Send for Watch {}

impl Watch {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            watched: Vec::new(),
            again: Vec::new(),
            events: epoll::EventVec::with_capacity(256),
        })
    }

    /// Watches channel slot `index` through `fd`; it is polled once at the next poll (it
    /// may hold input already).
    pub(crate) fn add(&mut self, index: usize, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        epoll::add(&self.epoll, fd, epoll::EventData::new_u64(index as u64), epoll::EventFlags::IN)?;
        if self.watched.len() <= index {
            self.watched.resize(index + 1, false);
        }
        self.watched[index] = true;
        self.again.push(index);
        Ok(())
    }

    /// Stops watching slot `index` (its channel closes).
    pub(crate) fn remove(&mut self, index: usize, fd: Option<BorrowedFd<'_>>) {
        if let Some(fd) = fd {
            let _ = epoll::delete(&self.epoll, fd);
        }
        if let Some(w) = self.watched.get_mut(index) {
            *w = false;
        }
        self.again.retain(|&i| i != index);
    }

    pub(crate) fn is_watched(&self, index: usize) -> bool {
        self.watched.get(index).copied().unwrap_or(false)
    }

    /// The watched slots with something to receive now (without blocking).
    pub(crate) fn ready(&mut self, out: &mut Vec<usize>) {
        out.clear();
        out.append(&mut self.again);
        if epoll::wait(&self.epoll, &mut self.events, 0).is_ok() {
            for e in self.events.iter() {
                let i = e.data.u64() as usize;
                if self.is_watched(i) && !out.contains(&i) {
                    out.push(i);
                }
            }
        }
    }

    /// A slot stopped at its budget: poll it again next time.
    pub(crate) fn poll_again(&mut self, index: usize) {
        if !self.again.contains(&index) {
            self.again.push(index);
        }
    }

    /// Whether a watched slot has something to receive now.
    pub(crate) fn any_ready(&self) -> bool {
        if !self.again.is_empty() {
            return true;
        }
        let mut fds = [rustix::event::PollFd::new(&self.epoll, rustix::event::PollFlags::IN)];
        matches!(rustix::event::poll(&mut fds, 0), Ok(n) if n > 0)
    }
}

impl AsFd for Watch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}
