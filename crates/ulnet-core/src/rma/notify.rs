//! Notifications: the owner's completion queue of remote accesses that asked for control
//! transfer (or hit a segment whose notify mode is `Always`), with an eventfd that becomes
//! readable when one is pending — the paper's "file descriptor ready for reading with a
//! small amount of control information".
//!
//! Two kinds of producer feed it: the engine (accesses that came over a channel) pushes
//! into a bounded queue, and every mapped importer publishes into the notification ring of
//! its control block. Both ring the same eventfd. The owner drains both when it polls.

use super::control::{self, NotifyConsumer};
use super::rights::{NodeId, SegmentId};
use crate::sys::doorbell::Doorbell;
use crate::transport::shm::mem::MappedMem;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The kind of access a notification reports. Discriminants are wire format (they travel
/// in control-block records): never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AccessKind {
    /// A get read the range.
    Get = 1,
    /// A put wrote the range.
    Put = 2,
    /// A compare-and-swap on the word.
    CompareSwap = 3,
    /// A fetch-and-add on the word.
    FetchAdd = 4,
}

impl AccessKind {
    pub(crate) fn from_u8(v: u8) -> Option<AccessKind> {
        Some(match v {
            1 => AccessKind::Get,
            2 => AccessKind::Put,
            3 => AccessKind::CompareSwap,
            4 => AccessKind::FetchAdd,
            _ => return None,
        })
    }
}

/// One remote access the owner asked to hear about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The segment accessed.
    pub segment: SegmentId,
    /// The importer that accessed it.
    pub importer: NodeId,
    /// What it did.
    pub kind: AccessKind,
    /// Where in the segment.
    pub offset: u64,
    /// How many bytes.
    pub len: u32,
}

struct MappedSource {
    segment: SegmentId,
    importer: NodeId,
    block: Arc<MappedMem>,
    consumer: NotifyConsumer,
    /// Lost count already reported in `dropped`.
    lost_seen: u64,
}

struct Inner {
    queue: VecDeque<Notification>,
    capacity: usize,
    dropped: u64,
    sources: Vec<MappedSource>,
}

/// The owner's notifications. Cloning shares the queue; any thread may poll it.
#[derive(Clone)]
pub struct Notifications {
    inner: Arc<Mutex<Inner>>,
    doorbell: Arc<Doorbell>,
}

impl Notifications {
    pub(crate) fn new(capacity: usize) -> std::io::Result<Self> {
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                queue: VecDeque::with_capacity(capacity),
                capacity,
                dropped: 0,
                sources: Vec::new(),
            })),
            doorbell: Arc::new(Doorbell::new()?),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Engine: queues a notification (or counts it dropped when the queue is full) and
    /// wakes the owner.
    pub(crate) fn push(&self, n: Notification) {
        {
            let mut inner = self.lock();
            if inner.queue.len() >= inner.capacity {
                inner.dropped += 1;
            } else {
                inner.queue.push_back(n);
            }
        }
        self.doorbell.ring();
    }

    /// Owner: starts draining the ring of a new mapped import.
    pub(crate) fn add_source(&self, segment: SegmentId, importer: NodeId, block: Arc<MappedMem>) {
        self.lock().sources.push(MappedSource {
            segment,
            importer,
            block,
            consumer: NotifyConsumer::new(control::RING),
            lost_seen: 0,
        });
    }

    /// Owner: stops draining the rings of `blocks` (after collecting what they hold).
    pub(crate) fn remove_sources(&self, blocks: &[Arc<MappedMem>]) {
        let mut inner = self.lock();
        Self::drain_sources(&mut inner);
        inner.sources.retain(|s| !blocks.iter().any(|b| Arc::ptr_eq(b, &s.block)));
    }

    /// A duplicate of the eventfd for a mapped importer to ring.
    pub(crate) fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.doorbell.as_fd()
    }

    fn drain_sources(inner: &mut Inner) {
        let Inner { queue, capacity, dropped, sources } = inner;
        for s in sources.iter_mut() {
            while let Some(r) = s.consumer.pop(&*s.block) {
                let Some(kind) = AccessKind::from_u8(r.op) else {
                    tracing::debug!(segment = s.segment.0, "mapped importer published an unknown access kind; dropped");
                    *dropped += 1;
                    continue;
                };
                if queue.len() >= *capacity {
                    *dropped += 1;
                    continue;
                }
                queue.push_back(Notification {
                    segment: s.segment,
                    importer: s.importer,
                    kind,
                    offset: r.offset,
                    len: r.len,
                });
            }
            let lost = control::lost(&*s.block);
            if lost > s.lost_seen {
                *dropped += lost - s.lost_seen;
                s.lost_seen = lost;
            }
        }
    }

    /// Hands up to `max` notifications to `handle`, oldest first. Returns how many. Never
    /// blocks.
    pub fn poll(&self, max: usize, mut handle: impl FnMut(Notification)) -> usize {
        self.doorbell.clear();
        let mut inner = self.lock();
        Self::drain_sources(&mut inner);
        let mut n = 0;
        while n < max {
            let Some(note) = inner.queue.pop_front() else { break };
            handle(note);
            n += 1;
        }
        n
    }

    /// Sleeps until a notification may be pending or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        {
            let mut inner = self.lock();
            Self::drain_sources(&mut inner);
            if !inner.queue.is_empty() {
                return Ok(());
            }
        }
        let mut fds = [rustix::event::PollFd::new(&*self.doorbell, rustix::event::PollFlags::IN)];
        let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        match rustix::event::poll(&mut fds, ms) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Notifications lost because a queue or ring was full.
    pub fn dropped(&self) -> u64 {
        let mut inner = self.lock();
        Self::drain_sources(&mut inner);
        inner.dropped
    }
}

impl AsFd for Notifications {
    /// Readable while notifications may be pending: put it in your own `poll`/`epoll` set.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.doorbell.as_fd()
    }
}
